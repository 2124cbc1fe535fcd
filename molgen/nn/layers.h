/* molgen's dense layers, shared by the training model (model.c) and the
 * KV-cache decoder (kv_decode.c), so both compute the same function the same
 * way. Row-major fp32; every call parallel over nt OpenMP threads. Results
 * do not depend on nt: the element loops split rows or channels, never a
 * sum, and the products are libattn's thread-invariant attn_matmul. */
#ifndef MG_LAYERS_H
#define MG_LAYERS_H

#include <stdint.h>

#include "attn.h"
#include "base/errors.h"
#include "nn/packed_gemm.h"

/* Element loops compiled for AVX-512, AVX2 and baseline x86-64, picked at
 * load time (GCC's target_clones): molgen is built for the baseline, where
 * they run 4 wide. Other compilers and CPUs: one version. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define MG_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define MG_CLONES
#endif

#define MG_LN_EPS 1e-5f /* LayerNorm epsilon, PyTorch's default */

/* Inside an OpenMP parallel region: this thread's share [lo, hi) of n items,
 * split evenly in thread order (the whole range outside a region). */
void mg_thread_range(int64_t n, int64_t *lo, int64_t *hi);

/* out [R, C] = (inp - mean) * rstd * w + b; mean, rstd [R] kept unless NULL. */
void mg_layernorm_forward(float *out, float *mean, float *rstd, const float *inp, const float *w,
                          const float *b, int64_t R, int C, int nt);
/* dinp [R, C] += LayerNorm backward of dout; dw, db [C] +=. */
void mg_layernorm_backward(float *dinp, float *dw, float *db, const float *dout, const float *inp,
                           const float *w, const float *mean, const float *rstd, int64_t R, int C,
                           int nt);
/* libattn's status as molgen's, by kind: ATTN_ERR_NOMEM -> MG_ERR_NOMEM,
 * ATTN_ERR_STATE -> MG_ERR_STATE, every other error (a bad call) MG_ERR_ARG. */
mg_status mg_from_attn(attn_status s);

/* The products: dt MG_DT_F32, libattn's attn_matmul (attn.h): libattn's
 * one BLAS policy; MG_DT_BF16, packed_gemm.h's mg_gemm_bf16 (bf16 operands, fp32
 * accumulation: mixed precision; the weights, inputs and gradients stay
 * fp32 in memory). Bitwise the same result for any nt. Errors only for
 * sizes attn_matmul refuses (above INT_MAX), by mg_from_attn, or out of
 * memory for bf16's packing. */
/* out [R, OC] = inp [R, IC] wᵀ + bias;  w [OC, IC], bias [OC] (may be NULL). */
mg_status mg_matmul_forward(float *out, const float *inp, const float *w, const float *bias,
                            int64_t R, int IC, int OC, mg_dtype dt, int nt, mg_error *err);
/* dinp [R, IC] = dout w (overwritten; skipped if NULL); dw [OC, IC] += doutᵀ inp;
 * dbias [OC] += column sums of dout (skipped if NULL). */
mg_status mg_matmul_backward(float *dinp, float *dw, float *dbias, const float *dout,
                             const float *inp, const float *w, int64_t R, int IC, int OC,
                             mg_dtype dt, int nt, mg_error *err);
/* out [R, C] += bias [C] (each row), over nt threads. */
void mg_bias_add(float *out, const float *bias, int64_t R, int C, int nt);
/* The attention block's input projection, the one code training (model.c)
 * and KV-cache decoding (kv_decode.c) run. w: the block's packed attention
 * parameters, PyTorch's nn.MultiheadAttention layout: in_proj W [3d, d]
 * (q, k, v stacked), in_proj b [3d], out_proj W [d, d], out_proj b [d].
 *   mg_attn_in_proj:  qkv [R, 3d] = x [R, d] in_projᵀ + b (q, k, v of each row) */
mg_status mg_attn_in_proj(float *qkv, const float *x, const float *w, int64_t R, int d, mg_dtype dt,
                          int nt, mg_error *err);
/* out [R, C] = GELU-tanh(inp) (GPT-2's approximation); out may alias inp.
 * bias [C] (or NULL): inp += bias first (the product's bias, added in this
 * pass instead of one of its own). */
void mg_gelu_forward(float *out, float *inp, const float *bias, int64_t R, int C, int nt);
/* dinp [N] = dout * GELU'(inp); dinp may alias dout. */
void mg_gelu_backward(float *dinp, const float *inp, const float *dout, int64_t N, int nt);

#endif
