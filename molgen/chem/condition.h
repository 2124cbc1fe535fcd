/* molgen conditioning: molecules generated with requested property values
 * (MolGPT's property conditioning).
 *
 * A conditional model (mg_model_config.n_cond = K > 0) has two more
 * parameter tensors, cond.weight [K, d] and cond.missing [K, d]. For a row
 * with normalised condition values v [K] (NaN = not given) its condition
 * embedding is
 *   e = sum_k (v_k given ? v_k cond.weight[k] : cond.missing[k])     [d]
 * (a learned linear embedding of the condition vector, and a learned
 * "missing" embedding per condition), added to the token + position
 * embedding of every position (cond_bos 0), or of position 0 only
 * (cond_bos 1: the BOS position becomes MolGPT's condition prefix). Since
 * e is the same for all positions of a row, causality is untouched.
 *
 * Values are normalised per condition: (x - mean) / std over the training
 * split's rows that have the value. The names, the statistics and the
 * training range travel with the model (mg_cond_info, the model file's
 * "condition" metadata). Training drops each condition of each row with
 * probability condition_drop (a row without the value counts as dropped),
 * so that any subset can be given when sampling, the rest taking the
 * missing embedding.
 *
 * Errors: errors.h (an mg_status and a one-line message). */
#ifndef MG_CONDITION_H
#define MG_CONDITION_H

#include <stddef.h>
#include <stdint.h>

#include "chem/data.h"
#include "base/errors.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Most conditions a model may have. */
#define MG_COND_MAX 32

/* What a conditional model knows about its conditions, per condition k:
 * the CSV column name, the normalisation (mean, std > 0) and the training
 * values' range (min, max) and 1st / 99th percentiles. */
typedef struct {
    int K;
    char *names[MG_COND_MAX];
    double mean[MG_COND_MAX], std[MG_COND_MAX];
    double min[MG_COND_MAX], max[MG_COND_MAX], p01[MG_COND_MAX], p99[MG_COND_MAX];
} mg_cond_info;

void mg_cond_info_free(mg_cond_info *c); /* zeroes it; NULL fine */
/* {"names":[...],"mean":[...],"std":[...],"min":[...],"max":[...],
 *  "p01":[...],"p99":[...]} (malloc'ed, NULL when out of memory or a name
 * is not UTF-8). */
char *mg_cond_info_to_json(const mg_cond_info *c);
/* Parse and check the above: K in [1, MG_COND_MAX]; distinct names that a
 * request can give (non-empty, no ',' or '=', no tab or control character,
 * no space at either end); every number finite and within the float range
 * (NaN / Infinity, which Python's json writes, count as not finite); std > 0;
 * min <= p01 <= p99 <= max; (min - mean) / std and (max - mean) / std
 * within the float range. Errors name the condition and the field. */
mg_status mg_cond_info_from_json(const char *json, mg_cond_info *c, mg_error *err);

/* "logp,qed" -> names (1..MG_COND_MAX distinct non-empty names, no
 * "smiles"-style trimming: spaces around commas are removed; a name with
 * '=', a tab or a control character is refused: sampling could not give
 * it). c->names are set (owned), the statistics zeroed. */
mg_status mg_cond_parse_names(const char *list, mg_cond_info *c, mg_error *err);

/* The raw condition values of the rows of a dataset loaded from the CSV
 * file `path`: values [d->n, K] (malloc'ed), NaN where a row's field is
 * empty or not a finite number; *missing (may be NULL) counts those. The
 * rows are matched by their line numbers (mg_dataset.line), each column
 * read with mg_read_smiles. */
mg_status mg_cond_read(const char *path, const mg_cond_info *c, const mg_dataset *d, float **values,
                       size_t *missing, mg_error *err);

/* Statistics of c from values [n, K] (the training split): mean, std,
 * range, percentiles over the non-NaN values of each column. Fails when a
 * column has fewer than 2 values or is constant. */
mg_status mg_cond_stats(mg_cond_info *c, const float *values, size_t n, mg_error *err);
/* values [n, K] in place: (x - mean) / std (NaN stays NaN). */
void mg_cond_normalise(const mg_cond_info *c, float *values, size_t n);

/* A training batch's conditions: out [B, K] = values[rows[b]] with each
 * entry dropped (NaN) with probability drop, from a hash of (seed, b, k). */
void mg_cond_batch(const float *values, int K, const size_t *rows, int B, double drop,
                   uint64_t seed, float *out);

/* A sampling request "logp=2.5,qed=0.8" -> out [K] normalised (NaN for
 * the conditions not named). Unknown or repeated names, values that do not
 * parse, and values outside the training range [min, max] are errors that
 * say the names and the range; a value outside [p01, p99] (rare in the
 * training data) gets a warning in warn[warnlen] ("" when none). */
mg_status mg_cond_request(const mg_cond_info *c, const char *text, float *out, char *warn,
                          size_t warnlen, mg_error *err);

/* ------------------------------------------------------------ scaffolds
 *
 * Scaffold conditioning (MolGPT's): a row of a scaffold model that trains
 * with its molecule's scaffold is
 *     BOS s1 .. sm BOS t1 .. tk EOS PAD..       length m + k + 3
 * (the scaffold's tokens, a second BOS where the molecule starts), and the
 * m + 1 targets s1 .. sm BOS are a loss prefix (mg_batch.loss_prefix):
 * inputs only. The model config's "scaffold" S is the longest scaffold
 * trained on (ctx_len = the molecules' context + S + 1). */

/* The scaffolds of a dataset's rows from the CSV column `column` of
 * `path`, matched by line (as mg_cond_read), encoded with v: row i's tokens
 * are toks[first[i] .. first[i + 1]) (first [d->n + 1], toks, malloc'ed;
 * none for an empty field, an acyclic molecule's "", or a scaffold that does
 * not encode or has more than max_tokens tokens). *longest: the most tokens
 * of a row; *missing rows without one, of which *bad did not encode (with
 * the first such line's message in note[notelen], "" when none). */
mg_status mg_scaffold_read(const char *path, const char *column, const mg_vocab *v,
                           const mg_dataset *d, int max_tokens, size_t **first, int32_t **toks,
                           int *longest, size_t *missing, size_t *bad, char *note, size_t notelen,
                           mg_error *err);

/* Row b of a batch with its scaffold prefix, or kept as it is: ids [T]
 * (data.h layout, length len) into out [Tw] (Tw >= m + len + 1),
 * *out_len and *prefix (m + 1, or 0 when kept: no scaffold, m == 0, or
 * the hash of (seed, b) falls below drop). */
void mg_scaffold_row(const int32_t *ids, int64_t len, const int32_t *scaf, int m, int b,
                     double drop, uint64_t seed, int Tw, int32_t *out, int64_t *out_len,
                     int64_t *prefix);

#ifdef __cplusplus
}
#endif
#endif /* MG_CONDITION_H */
