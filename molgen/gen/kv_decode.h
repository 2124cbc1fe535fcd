/* molgen KV-cache decoding: one new position per step for a batch of rows.
 *
 * Each step takes one token per row at that row's position pos, runs it
 * through the network with the keys and values of positions 0..pos-1 kept
 * from earlier steps, and returns the logits [n, V] predicting position
 * pos + 1. Each block computes the training model's function: the
 * products (projections, MLP, head) run on weights packed once when the
 * decoder is made (packed_gemm.h's mg_packed: no per-step packing of W), the
 * position's key and value go into the block's KV cache (ctx_len positions
 * per row, one allocation made by mg_kv_new), and libattn's SDPA
 * (attn_sdpa_forward, its fused decode kernel) attends over the row's
 * cached positions. Rows may be at different positions, and a row can
 * restart at 0 while the others continue (continuous batching). The logits
 * equal mg_model_logits' at the same position up to fp32 rounding (the
 * products' summation orders differ).
 *
 * dtype MG_DT_BF16 (mg_kv_new_dtype): the packed weights, the product
 * inputs, the queries and the KV cache in bf16, fp32 accumulation; the
 * LayerNorms, GELU, residual stream, softmax and logits in fp32.
 *
 * The rest of the layer math (LayerNorm, GELU-tanh) is layers.h's, the same
 * functions the training model uses; every result is bitwise the same for
 * any thread count.
 *
 * Errors: an mg_status with its message in err (errors.h).
 */
#ifndef MG_DECODE_H
#define MG_DECODE_H

#include <stddef.h>
#include <stdint.h>

#include "base/errors.h"
#include "nn/packed_gemm.h"
#include "nn/model.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mg_kv_decoder mg_kv_decoder;

/* Decoder for up to B rows on `threads` OpenMP threads (0: the model's,
 * mg_model_threads), in fp32 (mg_kv_new) or dt. Packs m's weight matrices
 * when made (a later weight update needs a new decoder; the LayerNorm
 * parameters, biases and embeddings are read at every step), never writes
 * m, so several decoders may step on one model at once from different
 * threads. Refuses a model built with no_causal_mask (a cache cannot
 * reproduce attention to future tokens). */
mg_status mg_kv_new(mg_model *m, int B, int threads, mg_kv_decoder **out, mg_error *err);
mg_status mg_kv_new_dtype(mg_model *m, int B, int threads, mg_dtype dt, mg_kv_decoder **out,
                          mg_error *err);
void mg_kv_free(mg_kv_decoder *d); /* NULL fine */
/* Start n rows (1 <= n <= B) at position 0. */
mg_status mg_kv_reset(mg_kv_decoder *d, int n, mg_error *err);
/* Conditions of a conditional model's rows (mg_batch.cond): cond [n, K]
 * with n 1 (every row) or B, row r's values those of decoder row r (all
 * positions, or position 0 with cond_bos); NULL or n = 0: none given, as a
 * new decoder. Copied; mg_model_keep_conditions' MG_ERR_ARG cases. */
mg_status mg_kv_set_conditions(mg_kv_decoder *d, const float *cond, int n, mg_error *err);
/* Row r (0 <= r < n) starts over at position 0 (a new molecule in its slot:
 * continuous batching); the other rows keep their positions. */
mg_status mg_kv_restart_row(mg_kv_decoder *d, int r, mg_error *err);
/* tok [n]: row r's token at its position mg_kv_pos(d, r) (< ctx_len; rows
 * may be at different positions: attention uses per-row key lengths);
 * logits [n, V] out. */
mg_status mg_kv_step(mg_kv_decoder *d, const int32_t *tok, float *logits, mg_error *err);
int mg_kv_pos(const mg_kv_decoder *d, int r);

#ifdef __cplusplus
}
#endif
#endif /* MG_DECODE_H */
