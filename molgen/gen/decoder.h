/* molgen's decoder: the logits of the next token for up to B rows of
 * growing prefixes, behind one interface with two implementations that must
 * give the same logits:
 *   MG_DECODE_NAIVE  re-runs the whole prefix through mg_model_logits at
 *                    every step (what MolGPT's sampler does); O(L²) work per
 *                    molecule; the tests' oracle.
 *   MG_DECODE_KV     incremental decoding with a per-layer key/value cache:
 *                    each step runs only the new position (kv_decode.h).
 *
 * A decoder holds up to B rows; step(tok[n]) appends one token per row at
 * that row's position pos (0 = BOS) and returns the logits [n, V] that
 * predict the token at pos + 1. A row can restart at position 0 while the
 * others continue (what the sampler's continuous batching needs). */
#ifndef MG_DECODER_H
#define MG_DECODER_H

#include <stdint.h>

#include "base/errors.h"
#include "nn/model.h"
#include "nn/packed_gemm.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { MG_DECODE_NAIVE = 0, MG_DECODE_KV = 1 } mg_decode_kind;

/* "naive" / "kv" */
const char *mg_decode_kind_name(mg_decode_kind k);

typedef struct mg_decoder mg_decoder;

/* A decoder for up to B rows on m (which must outlive it and is used by it:
 * no other calls on m between steps of a naive decoder). */
mg_status mg_decoder_new(mg_model *m, mg_decode_kind kind, int B, mg_decoder **out, mg_error *err);
/* The same with the KV decoder's products and cache in dt (MG_DT_F32 or
 * MG_DT_BF16, kv_decode.h; the naive decoder is fp32 only) on `threads`
 * threads (0: the model's; the naive decoder always runs on the model's). */
mg_status mg_decoder_new_on(mg_model *m, mg_decode_kind kind, mg_dtype dt, int B, int threads,
                            mg_decoder **out, mg_error *err);
void mg_decoder_free(mg_decoder *d); /* NULL fine */
/* Start n new rows (1 <= n <= B) at position 0. */
mg_status mg_decoder_reset(mg_decoder *d, int n, mg_error *err);
/* Conditions of a conditional model's rows: cond [n, K], n 1 (every row)
 * or B, row r's values those of decoder row r; NULL or n = 0: none given,
 * as a new decoder. Copied into the decoder (not left on the model);
 * mg_model_keep_conditions' MG_ERR_ARG cases. */
mg_status mg_decoder_set_conditions(mg_decoder *d, const float *cond, int n, mg_error *err);
/* Row r (0 <= r < n) starts over at position 0; the others are untouched. */
mg_status mg_decoder_restart_row(mg_decoder *d, int r, mg_error *err);
/* Append tok[r] at row r's next position (< ctx_len) for every row and
 * write the logits [n, V] predicting each row's next token. */
mg_status mg_decoder_step(mg_decoder *d, const int32_t *tok, float *logits, mg_error *err);
/* Tokens appended to row r since its (re)start. */
int mg_decoder_pos(const mg_decoder *d, int r);

#ifdef __cplusplus
}
#endif
#endif
