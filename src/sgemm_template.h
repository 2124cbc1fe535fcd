/* The fp32 GEMM micro-kernel, one template for every instruction set
 * (BLIS's contract: the driver in gemm.c packs, the micro-kernel only
 * multiplies packed panels). Included once by each sgemm_<isa>.c after its
 * vector vocabulary:
 *   VL, vf, v_load, v_store, v_set1, v_zero, v_fma, v_mul
 *   SG_MR   rows of the micro-tile (broadcasts of A)
 *   SG_NV   vectors per row of the micro-tile (SG_NR = SG_NV * VL columns)
 *   SG_KC, SG_MC, SG_NC  the cache blocking gemm.c uses with this kernel
 * and then defines its one export with SGEMM_KERNEL("<isa>"). */
#ifndef ATTN_SGEMM_TEMPLATE_H
#define ATTN_SGEMM_TEMPLATE_H

#include <stdint.h>

#if defined(__GNUC__) && !defined(__clang__)
#define SG_UNROLL _Pragma("GCC unroll 32")
#else
#define SG_UNROLL
#endif

#define SG_NR (SG_NV * VL)

/* C[SG_MR x SG_NR] (row r at C + r*ldc) from one K block of kc:
 *   acc = sum_k Ap[k][r] * Bp[k][c], one FMA chain per element from 0, k
 *   ascending (Ap: kc x SG_MR, Bp: kc x SG_NR, both packed, k-major);
 *   first && beta == 0: C = alpha acc (C not read: it may hold NaN)
 *   first:              C = alpha acc + beta C
 *   later blocks:       C = alpha acc + C
 * The order depends only on kc, which gemm.c fixes per K, so every element
 * gets the same arithmetic whichever thread computes its tile. */
static void sgemm_ukr(int64_t kc, const float *restrict Ap, const float *restrict Bp, float *C,
                      int64_t ldc, float alpha, float beta, int first) {
    vf c[SG_MR][SG_NV];
    SG_UNROLL for (int r = 0; r < SG_MR; r++) SG_UNROLL for (int v = 0; v < SG_NV; v++) c[r][v] =
        v_zero();
    for (int64_t k = 0; k < kc; k++) {
        vf b[SG_NV];
        SG_UNROLL for (int v = 0; v < SG_NV; v++) b[v] = v_load(Bp + v * VL);
        SG_UNROLL for (int r = 0; r < SG_MR; r++) {
            const vf a = v_set1(Ap[r]);
            SG_UNROLL for (int v = 0; v < SG_NV; v++) c[r][v] = v_fma(a, b[v], c[r][v]);
        }
        Ap += SG_MR;
        Bp += SG_NR;
    }
    const vf al = v_set1(alpha), be = v_set1(beta);
    SG_UNROLL for (int r = 0; r < SG_MR; r++) SG_UNROLL for (int v = 0; v < SG_NV; v++) {
        float *p = C + r * ldc + v * VL;
        vf out;
        if (!first)
            out = v_fma(al, c[r][v], v_load(p));
        else if (beta == 0.0f)
            out = v_mul(al, c[r][v]);
        else
            out = v_fma(al, c[r][v], v_mul(be, v_load(p)));
        v_store(p, out);
    }
}

#define SGEMM_KERNEL(NAME)                                                                         \
    {.name = NAME,                                                                                 \
     .mr = SG_MR,                                                                                  \
     .nr = SG_NR,                                                                                  \
     .kc = SG_KC,                                                                                  \
     .mc = SG_MC,                                                                                  \
     .nc = SG_NC,                                                                                  \
     .ukr = sgemm_ukr}

#endif
