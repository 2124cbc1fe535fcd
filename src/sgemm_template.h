/* The fp32 GEMM micro-kernel, one template for every instruction set
 * (BLIS's contract: the driver in gemm.c packs, the micro-kernel only
 * multiplies packed panels; the packing is here too, unrolled for the
 * tile). Included once by each sgemm_<isa>.c after its
 * vector vocabulary:
 *   VL, vf, v_load, v_store, v_set1, v_zero, v_fma, v_mul
 *   SG_MR   rows of the micro-tile (broadcasts of A)
 *   SG_NV   vectors per row of the micro-tile (SG_NR = SG_NV * VL columns)
 *   SG_KC, SG_MC, SG_NC  the cache blocking gemm.c uses with this kernel
 * optionally the packing of whole panels from a row-major source through
 * in-register transposes (the plain copies gather one float per load):
 *   SG_PACK_A_ROWS(src, lda, rows, ahead, kc, dst)  an A panel, op(A) not
 *     transposed (ahead: rows of the next panel, to fetch meanwhile)
 *   SG_PACK_B_COLS(src, ldb, cols, kc, dst)  a B panel, op(B) transposed
 *   SG_PACK_A_COLS(src, lda, rows, kc, dst)  an A panel, op(A) transposed
 *   SG_PACK_B_ROWS(src, ldb, cols, kc, dst)  a B panel, op(B) not transposed
 *   (rows <= SG_MR, cols <= SG_NR: the panel's rows / columns past them
 *   zeros)
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
 * gets the same arithmetic whichever thread computes its tile. The body
 * serves the whole tile (MRV = SG_MR) and the first MRV rows only (a
 * panel's last rows: the same arithmetic per element, less work). */
static inline __attribute__((always_inline)) void
sgemm_ukr_body(const int MRV, int64_t kc, const float *restrict Ap, const float *restrict Bp,
               float *C, int64_t ldc, float alpha, float beta, int first) {
    vf c[SG_MR][SG_NV];
    SG_UNROLL for (int r = 0; r < MRV; r++) SG_UNROLL for (int v = 0; v < SG_NV; v++) c[r][v] =
        v_zero();
    /* C's rows are ldc apart (other pages): fetch them while the k loop
     * runs, for the update at its end */
    SG_UNROLL for (int r = 0; r < MRV; r++) {
        __builtin_prefetch(C + r * ldc, 1);
        __builtin_prefetch(C + r * ldc + SG_NR - 1, 1);
    }
    for (int64_t k = 0; k < kc; k++) {
        vf b[SG_NV];
        SG_UNROLL for (int v = 0; v < SG_NV; v++) b[v] = v_load(Bp + v * VL);
        SG_UNROLL for (int r = 0; r < MRV; r++) {
            const vf a = v_set1(Ap[r]);
            SG_UNROLL for (int v = 0; v < SG_NV; v++) c[r][v] = v_fma(a, b[v], c[r][v]);
        }
        Ap += SG_MR;
        Bp += SG_NR;
    }
    const vf al = v_set1(alpha), be = v_set1(beta);
    SG_UNROLL for (int r = 0; r < MRV; r++) SG_UNROLL for (int v = 0; v < SG_NV; v++) {
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

#define SG_UKR_ROWS(NAME, MRV)                                                                     \
    static void NAME(int64_t kc, const float *restrict Ap, const float *restrict Bp, float *C,     \
                     int64_t ldc, float alpha, float beta, int first) {                            \
        sgemm_ukr_body((MRV) < SG_MR ? (MRV) : SG_MR, kc, Ap, Bp, C, ldc, alpha, beta, first);     \
    }
SG_UKR_ROWS(sgemm_ukr, SG_MR)
/* the first 1, 2, 4, 8 rows (capped at SG_MR: a cap is the whole tile) */
SG_UKR_ROWS(sgemm_ukr_1, 1)
SG_UKR_ROWS(sgemm_ukr_2, 2)
SG_UKR_ROWS(sgemm_ukr_4, 4)
SG_UKR_ROWS(sgemm_ukr_8, 8)

/* Panels p0 <= p < p1 of op(A)[i0 : i0+mc, k0 : k0+kc] (op(A)(i, k) at
 * A[i*lda + k], or A[k*lda + i] when ta) into Ap: panel p at
 * Ap + p*SG_MR*kc holds [kc][SG_MR], rows past mc zeros. Here, not in
 * gemm.c, so that the fixed SG_MR lets the compiler unroll the copies with
 * this file's instruction set. */
static void sgemm_pack_a(const float *A, int64_t lda, int ta, int64_t i0, int64_t mc, int64_t k0,
                         int64_t kc, int64_t p0, int64_t p1, float *restrict Ap) {
    for (int64_t p = p0; p < p1; p++) {
        float *dst = Ap + p * SG_MR * kc;
        const int64_t r0 = p * SG_MR, rows = mc - r0 < SG_MR ? mc - r0 : SG_MR;
#ifdef SG_PACK_A_ROWS
        if (!ta) {
            const int64_t left = mc - r0 - rows; /* rows after this panel's */
            SG_PACK_A_ROWS(A + (i0 + r0) * lda + k0, lda, rows, left < SG_MR ? left : SG_MR, kc,
                           dst);
        } else
#endif
#ifdef SG_PACK_A_COLS
        if (ta) {
            SG_PACK_A_COLS(A + k0 * lda + i0 + r0, lda, rows, kc, dst);
        } else
#endif
        if (!ta && rows == SG_MR) {
            /* k outer: the rows are read side by side, the panel written in
             * order */
            const float *src = A + (i0 + r0) * lda + k0;
            for (int64_t k = 0; k < kc; k++, dst += SG_MR)
                SG_UNROLL for (int r = 0; r < SG_MR; r++) dst[r] = src[r * lda + k];
        } else if (!ta) {
            const float *src = A + (i0 + r0) * lda + k0;
            for (int64_t k = 0; k < kc; k++, dst += SG_MR)
                for (int r = 0; r < SG_MR; r++) dst[r] = r < rows ? src[r * lda + k] : 0.0f;
        } else if (rows == SG_MR) {
            const float *src = A + k0 * lda + i0 + r0;
            for (int64_t k = 0; k < kc; k++, dst += SG_MR, src += lda)
                SG_UNROLL for (int r = 0; r < SG_MR; r++) dst[r] = src[r];
        } else {
            const float *src = A + k0 * lda + i0 + r0;
            for (int64_t k = 0; k < kc; k++, dst += SG_MR, src += lda)
                for (int r = 0; r < SG_MR; r++) dst[r] = r < rows ? src[r] : 0.0f;
        }
    }
}

/* Panels q0 <= q < q1 of op(B)[k0 : k0+kc, j0 : j0+nc] (op(B)(k, j) at
 * B[k*ldb + j], or B[j*ldb + k] when tb) into Bp: panel q at
 * Bp + q*SG_NR*kc holds [kc][SG_NR], columns past nc zeros. */
static void sgemm_pack_b(const float *B, int64_t ldb, int tb, int64_t k0, int64_t kc, int64_t j0,
                         int64_t nc, int64_t q0, int64_t q1, float *restrict Bp) {
    for (int64_t q = q0; q < q1; q++) {
        float *dst = Bp + q * SG_NR * kc;
        const int64_t c0 = q * SG_NR, cols = nc - c0 < SG_NR ? nc - c0 : SG_NR;
#ifdef SG_PACK_B_COLS
        if (tb) {
            SG_PACK_B_COLS(B + (j0 + c0) * ldb + k0, ldb, cols, kc, dst);
        } else
#endif
#ifdef SG_PACK_B_ROWS
        if (!tb) {
            SG_PACK_B_ROWS(B + k0 * ldb + j0 + c0, ldb, cols, kc, dst);
        } else
#endif
        if (!tb && cols == SG_NR) {
            const float *src = B + k0 * ldb + j0 + c0;
            for (int64_t k = 0; k < kc; k++, dst += SG_NR, src += ldb)
                SG_UNROLL for (int v = 0; v < SG_NV; v++) v_store(dst + v * VL, v_load(src + v * VL));
        } else if (!tb) {
            const float *src = B + k0 * ldb + j0 + c0;
            for (int64_t k = 0; k < kc; k++, dst += SG_NR, src += ldb)
                for (int c = 0; c < SG_NR; c++) dst[c] = c < cols ? src[c] : 0.0f;
        } else {
            /* k outer, as for A: the columns' rows of B are read side by
             * side */
            const float *src = B + (j0 + c0) * ldb + k0;
            for (int64_t k = 0; k < kc; k++, dst += SG_NR)
                for (int c = 0; c < SG_NR; c++) dst[c] = c < cols ? src[c * ldb + k] : 0.0f;
        }
    }
}

#define SGEMM_KERNEL(NAME)                                                                         \
    {.name = NAME,                                                                                 \
     .mr = SG_MR,                                                                                  \
     .nr = SG_NR,                                                                                  \
     .kc = SG_KC,                                                                                  \
     .mc = SG_MC,                                                                                  \
     .nc = SG_NC,                                                                                  \
     .ukr = sgemm_ukr,                                                                             \
     .ukr_rows = {sgemm_ukr_1, sgemm_ukr_2, sgemm_ukr_4, sgemm_ukr_8},                             \
     .pack_a = sgemm_pack_a,                                                                       \
     .pack_b = sgemm_pack_b}

#endif
