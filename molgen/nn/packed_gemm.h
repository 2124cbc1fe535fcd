/* molgen's own products beside libattn's attn_matmul (layers.h):
 *
 *   - mg_gemm_bf16: C = op(A) op(B) + beta C with bf16 operands and fp32
 *     accumulation, the products of mixed-precision training
 *     (train --dtype bf16). The fp32 inputs are rounded to bf16 (nearest,
 *     ties to even) while they are packed; each element of C is the fp32
 *     sum of the exact bf16 products in k order, rounded after every add,
 *     added to beta C once per block of MG_GEMM_KC k's.
 *   - mg_packed: a weight matrix W [N, K] packed once (a model load) for
 *     out = X Wᵀ + bias over a few rows (KV decoding: one row per molecule),
 *     in fp32 or bf16; no per-call packing of W, which was a quarter of the
 *     decode time through OpenBLAS.
 *
 * Kernels: VDPBF16PS (bf16) and VFMADD (fp32) on AVX-512 (AVX512_BF16 for
 * the bf16 ones), picked at run time; elsewhere a portable C path with the
 * same arithmetic (fp32 fmaf; bf16 products are exact in fp32, so fmaf is
 * VDPBF16PS's add, odd element of each pair first). Denormals: the AVX-512
 * bf16 path flushes them (VDPBF16PS and VCVTNE2PS2BF16 do), the portable one
 * keeps them.
 *
 * fp32 packed products sum each element in k order with one FMA per k from
 * 0, then add the bias: OpenBLAS's sgemm micro-kernels do the same for K up
 * to their K block, so decoding gives the same bits as through attn_matmul
 * (tested on the model's shapes). Every result is bitwise the same for any
 * thread count: threads split rows or column panels, never a sum. */
#ifndef MG_GEMM_H
#define MG_GEMM_H

#include <stdint.h>

#include "base/errors.h"

typedef enum {
    MG_DT_F32 = 0, /* fp32 everywhere (the default) */
    MG_DT_BF16 = 1 /* bf16 operands, fp32 accumulation */
} mg_dtype;

/* "fp32" / "bf16"; mg_dtype_parse: 0 and *dt on a known name, -1 otherwise. */
const char *mg_dtype_name(mg_dtype dt);
int mg_dtype_parse(const char *s, mg_dtype *dt);

#define MG_GEMM_KC 384 /* k's per accumulation block of mg_gemm_bf16 */

/* 1 when the AVX-512 kernels run (bf16: AVX512_BF16), 0 for the portable
 * ones, by libattn's reading of the CPU (attn_cpu_features).
 * MOLGEN_GEMM_ISA=portable in the environment (read once) or
 * mg_gemm_force_portable(1) (tests) picks the portable kernels. */
int mg_gemm_isa_f32(void);
int mg_gemm_isa_bf16(void);
void mg_gemm_force_portable(int on);
/* mg_gemm_bf16 and bf16 mg_packed on AMX tiles (16-row blocks; the rest
 * as before) once the application allows it here: mg_gemm_allow_amx(1)
 * asks for the process's permission through attn_enable_amx (a
 * process-wide grant, libattn's bf16 kernels take the tiles too), 0 turns
 * the tiles off. mg_gemm_isa_amx: 1 when they run: allowed and permitted,
 * the CPU has ATTN_CPU_AMX and AVX512_BF16, and MOLGEN_GEMM_ISA is not
 * avx512bf16 (nor portable, nor mg_gemm_force_portable). */
void mg_gemm_allow_amx(int on);
int mg_gemm_isa_amx(void);
/* What to tell a user of dtype dt where bf16 is emulated (no AVX512_BF16,
 * or the portable kernels forced): one sentence; NULL when nothing. */
const char *mg_gemm_dtype_note(mg_dtype dt);

/* C [M, N] = op(A) op(B) + beta C in bf16 x bf16 -> fp32; op(A) [M, K]
 * (A stored [M, K], or [K, M] with ta), op(B) [K, N] (B [K, N], or [N, K]
 * with tb), row-major with leading dimensions. beta 0 does not read C.
 * Its packing buffer (B's panels in bf16, 2 K N bytes with N rounded up
 * to 32 and K to even, and A in bf16: all M rows, or per thread a block of
 * up to 64 rows when the threads split the rows) is kept for the next call
 * with the largest size any call asked of it, in one of 4 slots (more
 * callers at once get a buffer of their own, freed on return); the slots
 * stay allocated until the process ends.
 * Errors: sizes < 1, ld below a row (MG_ERR_ARG); out of memory. */
mg_status mg_gemm_bf16(int ta, int tb, int64_t M, int64_t N, int64_t K, const float *A,
                       int64_t lda, const float *B, int64_t ldb, float beta, float *C, int64_t ldc,
                       int nt, mg_error *err);

typedef struct mg_packed mg_packed;

/* Packs W [N, K] (row-major, out = X Wᵀ) in dt; W may be freed after. */
mg_status mg_packed_new(const float *W, int N, int K, mg_dtype dt, mg_packed **out,
                        mg_error *err);
void mg_packed_free(mg_packed *p); /* NULL fine */
/* out [M, N] = X [M, K] Wᵀ + bias (bias [N] or NULL); rows of X and out
 * contiguous. */
mg_status mg_packed_forward(float *out, const float *X, int64_t M, const mg_packed *p,
                            const float *bias, int nt, mg_error *err);

#endif
