/* molgen attention maps: what each head of a trained model looks at in one
 * molecule. `molgen attention` runs BOS + the molecule's tokens through
 * mg_model_logits with attention weights, draws every layer x head as a
 * heatmap in one SVG file, and prints a per-head table.
 *
 * Per-head statistics, over the query rows of the molecule's tokens
 * (position 0 = BOS is a key but not a query row here; rows i = first..L-1):
 *   mean distance   Σ_j w_ij |i - j|, averaged over the rows
 *   prev            w_{i, i-1}, averaged over the rows (previous token)
 *   ring            for a query that is the closing digit of a ring bond,
 *                   w_{i, open(i)} (the opening digit); averaged over such
 *                   queries; undefined ("-") if the molecule has none
 *   bos             w_{i, 0}, averaged (weight parked on BOS)
 *   peak            max_j w_ij, averaged; uniform causal attention has
 *                   peak_uniform = mean of 1/(i+1) and
 *                   dist_uniform = mean of i/2
 * and a label from those numbers (first rule that applies):
 *   "ring-closure"    ring defined and >= 0.3
 *   "previous-token"  prev >= 0.4
 *   "BOS-sink"        bos >= 0.5
 *   "diffuse"         peak < 1.5 peak_uniform (close to averaging the prefix)
 *   "n-gram/local"    mean distance <= max(2, 0.4 dist_uniform): the
 *                     bound grows with the molecule, as distances do
 *   "long-range"      otherwise.
 *
 * Ring-closure pairing follows SMILES: ring-bond labels are the tokens
 * "0".."9" and "%10".."%99" (digits inside bracket atoms belong to the
 * bracket token); the first occurrence of a label opens a bond, the next
 * closes it, and the label is free again after that.
 */
#ifndef MG_ATTENTION_H
#define MG_ATTENTION_H

#include <stddef.h>
#include <stdio.h>

#include "base/errors.h"
#include "nn/model.h"
#include "chem/tokenizer.h"

#ifdef __cplusplus
extern "C" {
#endif

/* 1 if tok[0..len) (len < 0: strlen) is a ring-bond label token. */
int mg_is_ring_label(const char *tok, int len);

/* tokens[0..n): pair[i] = index of the opening label token if token i
 * closes a ring bond, else -1. Returns the number of closures. */
int mg_ring_pairs(const char *const *tokens, int n, int *pair);

typedef struct {
    double mean_dist;
    double prev;
    double ring; /* NAN when ring_n == 0 */
    int ring_n;  /* closing-digit queries averaged */
    double bos;
    double peak, peak_uniform;
    double dist_uniform; /* mean distance of uniform causal attention */
    int rows;            /* query rows averaged */
    const char *label;
} mg_head_stats;

/* Statistics of one head's weights w [L, L] (row = query, column = key)
 * over the rows first..L-1 (first >= 0; first = 1 skips BOS). ring_key [L]
 * (may be NULL: no ring closures): for a query position i, the position of
 * its opening ring digit, or -1. */
void mg_head_stats_compute(const float *w, int L, int first, const int *ring_key, mg_head_stats *s);
/* The label rule above (also stored by mg_head_stats_compute). */
const char *mg_head_label(const mg_head_stats *s);

/* Write an SVG: a grid of n_layer rows x n_head columns of heatmaps of
 * weights [n_layer, n_head, L, L], token labels labels[0..L) on both axes,
 * a colour scale 0..1 and a title. Returns 0, or -1 on a write error. */
int mg_attention_svg(FILE *f, const float *weights, int n_layer, int n_head, int L,
                     const char *const *labels, const char *title,
                     const mg_head_stats *stats /* [n_layer*n_head] or NULL */);

/* Per-head table, tab-separated, one header line then one line per head:
 * layer head mean_distance prev_token ring_closure bos peak label (ring
 * "-" when undefined). Returns 0, or -1 on a write error. */
int mg_attention_tsv(FILE *f, const mg_head_stats *stats, int n_layer, int n_head);

/* One molecule's attention maps: BOS + its tokens through the model. */
typedef struct {
    int n_layer, n_head;
    int L;                /* positions: BOS + k tokens */
    int k;                /* tokens after BOS */
    int closures;         /* ring closures in the molecule */
    float *weights;       /* [n_layer, n_head, L, L] */
    const char **labels;  /* [L] token strings (owned by the vocabulary) */
    mg_head_stats *stats; /* [n_layer * n_head] over the token rows (BOS skipped) */
} mg_attention_map;

/* Errors (errors.h): MG_ERR_TOKEN / MG_ERR_UNKNOWN_TOKEN for a SMILES the
 * vocabulary cannot encode, MG_ERR_TOO_LONG when it has more tokens than
 * ctx_len - 1 ("'S' has K tokens; the model takes at most ..."), MG_ERR_ARG
 * for an empty one. smiles is echoed cut to 72 characters. */
mg_status mg_attention_compute(mg_model *m, const mg_vocab *v, const char *smiles,
                               mg_attention_map *out, mg_error *err);
void mg_attention_map_free(mg_attention_map *a); /* zeroes it; NULL fine */

#ifdef __cplusplus
}
#endif
#endif /* MG_ATTENTION_H */
