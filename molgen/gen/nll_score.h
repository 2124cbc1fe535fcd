/* molgen score: the likelihood a trained model gives to given molecules.
 *
 * For each SMILES: the summed negative log-likelihood (nats) of its targets
 * under the model, the targets being every token after BOS up to and
 * including EOS (k tokens + EOS = k + 1 targets: what training averages
 * its loss over, mg_model_forward), so nll / tokens is the training loss of
 * a batch holding that molecule alone (evaluation mode: no dropout, no
 * label smoothing). A molecule that cannot be scored gets a status instead
 * (never an error): empty, does not tokenise, a token outside the model's
 * vocabulary, longer than the model's context (k + 1 > ctx_len), or a line
 * the reader could not use.
 *
 * Deterministic: each molecule is its own forward (batch of one) on a model
 * running one thread, so its result depends on the molecule and the model
 * only, not on the thread count, the work split or its neighbours. (A
 * batched forward's per-row results depend on the batch's composition in
 * the last bits: OpenBLAS's kernels round a row by where it lands in the
 * product. Measured on the shipped model: 484 of 512 molecules differed,
 * by at most 4.2e-7 relative, between batches of 1 and of 64.)
 *
 * Precision: the model's (mg_model_set_dtype): under MG_DT_BF16 the dense
 * products take bf16 operands with fp32 accumulation, as train --dtype bf16
 * computes its loss; everything else stays fp32.
 *
 * Threads: up to `threads` copies of the model (the caller's for the first)
 * each take `batch` consecutive molecules at a time; results are written in
 * input order, so any range [first, first + n) of a list can be scored on
 * its own (by another process) and the pieces concatenated.
 *
 * Conventions: errors.h; nothing aborts or prints. */
#ifndef MG_SCORE_H
#define MG_SCORE_H

#include <stddef.h>

#include "base/dist.h"
#include "base/errors.h"
#include "nn/model.h"
#include "chem/tokenizer.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    MG_SCORE_OK = 0,
    MG_SCORE_EMPTY,         /* "" (a blank line, an empty CSV field) */
    MG_SCORE_BAD_CHAR,      /* a character that starts no SMILES token */
    MG_SCORE_UNKNOWN_TOKEN, /* a token outside the model's vocabulary */
    MG_SCORE_TOO_LONG,      /* more targets than the model's context */
    MG_SCORE_BAD_LINE       /* the reader could not use the line (data.h MG_REC_*) */
} mg_score_status;

/* "ok", "empty", "bad_char", "unknown_token", "too_long", "bad_line". */
const char *mg_score_status_name(mg_score_status s);

typedef struct {
    double nll; /* summed NLL in nats (NAN unless ok) */
    int tokens; /* targets: k + 1 (also for too_long; 0 when unknown) */
    mg_score_status status;
} mg_score;

typedef struct {
    int threads; /* >= 1; 0: mg_model_threads(m) */
    int batch;   /* molecules a thread takes at a time, >= 1 (0: 16) */
    /* progress (may be NULL): called between blocks of molecules */
    void (*progress)(void *user, size_t done, size_t n);
    void *user;
    /* The ranks scoring together (NULL: alone): each rank scores its
     * consecutive part (mg_dist_range) and rank 0 gets all n results in out (the
     * other ranks only their own part); every rank passes the whole list.
     * The results are those of one process (each molecule its own forward).
     * progress: rank 0's, its part scaled to n. Collective. */
    mg_dist *dist;
    /* Nonzero *stop (e.g. &mg_stop_signal, errors.h) ends the scoring
     * after the molecules being scored: MG_ERR_INTERRUPTED. NULL: never. */
    const volatile sig_atomic_t *stop;
} mg_score_opts;

/* Why molecule s has the status it gets (mg_score_one's reason, e.g.
 * "unknown token '[Se]' at position 4"), into out[n]; "" for ok. */
void mg_score_reason(const mg_model *m, const mg_vocab *v, const char *s, unsigned char flaw,
                     char *out, size_t n);

/* Score smiles[0..n) into out[0..n). flaw (may be NULL): mg_read_records'
 * codes; a nonzero one is MG_SCORE_BAD_LINE. o may be NULL (defaults).
 * Fails only for a bad argument or out of memory (nothing aborts). */
mg_status mg_score_molecules(mg_model *m, const mg_vocab *v, const char *const *smiles,
                             const unsigned char *flaw, size_t n, const mg_score_opts *o,
                             mg_score *out, mg_error *err);

#ifdef __cplusplus
}
#endif
#endif /* MG_SCORE_H */
