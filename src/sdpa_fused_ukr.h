/* The fused kernels' tile product (part of sdpa_fused_template.h, included
 * by the phase headers): one micro-kernel for C (+)= A·B, and the products
 * built on it. A tile product's operands travel as one tile_prod. */
#ifndef ATTN_SDPA_FUSED_UKR_H
#define ATTN_SDPA_FUSED_UKR_H

#include "sdpa_fused_helpers.h"

/* C[M × nvec·VL] (+)= A[M × K] · B[K × nvec·VL].
 * A is read by broadcasts with any (row, k) strides, B by vector loads of
 * its rows; N is a multiple of VL (scratch is padded with zeros). */
typedef struct {
    int64_t M, nvec, K;
    const float *A;
    int64_t ars, aks; /* A(r, k) at A[r·ars + k·aks] */
    const float *B;
    int64_t ldb; /* row k of B at B + k·ldb */
    float *C;
    int64_t ldc; /* row r of C at C + r·ldc */
} tile_prod;

/* How a product is formed. */
enum {
    TILE_OWN = 0,  /* own micro-kernel */
    TILE_SAFE = 1, /* zero-skipping: terms whose A entry is 0 are left out */
    TILE_BLAS = 2  /* OpenBLAS sgemm on the tile (measurement hook) */
};

/* C[MR × NV·VL] = alpha·A·B (acc = 0) or C += A·B (acc = 1) for the sub-tile
 * t points at (t->M, t->nvec unused). The k loop runs in blocks of kb: the
 * first block is one FMA chain from the initial value (C or 0), each later
 * block a chain from 0 added to the running total (kept in C), which bounds
 * the rounding error of long (d = 256) dot products near that of the
 * reference's split sums. Each C element's arithmetic depends only on K,
 * never on how M and N are blocked, so results do not depend on tiling or
 * threads. */
#ifndef UKR_KB
#define UKR_KB 32 /* K block of the products over d (S, dP) */
#endif
static inline __attribute__((always_inline)) void
ukr_body(const int MR, const int NV, const tile_prod *t, int acc, float alpha, int64_t kb) {
    const int64_t K = t->K, ars = t->ars, aks = t->aks, ldb = t->ldb, ldc = t->ldc;
    const float *A = t->A, *B = t->B;
    float *C = t->C;
    const float *a0 = A, *a1 = A + ars, *a2 = A + 2 * ars, *a3 = A + 3 * ars, *a4 = A + 4 * ars,
                *a5 = A + 5 * ars;
    int64_t k0 = 0;
    do {
        const int64_t k1 = K - k0 > kb ? k0 + kb : K;
        vf c[6][4];
        UNROLL for (int r = 0; r < MR; r++) UNROLL for (int v = 0; v < NV; v++) c[r][v] = v_zero();
        if (acc && k0 == 0) {
            UNROLL for (int r = 0; r < MR; r++) UNROLL for (int v = 0; v < NV; v++) c[r][v] =
                v_load(C + r * ldc + v * VL);
        }
        for (int64_t k = k0; k < k1; k++) {
            vf b[4];
            UNROLL for (int v = 0; v < NV; v++) b[v] = v_load(B + v * VL);
            B += ldb;
            const int64_t o = k * aks;
#define UKR_ROW(r, ap)                                                                             \
    if (MR > r) {                                                                                  \
        const vf ar = v_set1(ap[o]);                                                               \
        UNROLL for (int v = 0; v < NV; v++) c[r][v] = v_fma(ar, b[v], c[r][v]);                    \
    }
            UKR_ROW(0, a0)
            UKR_ROW(1, a1) UKR_ROW(2, a2) UKR_ROW(3, a3) UKR_ROW(4, a4) UKR_ROW(5, a5)
#undef UKR_ROW
        }
        if (k0 > 0) {
            UNROLL for (int r = 0; r < MR; r++) UNROLL for (int v = 0; v < NV; v++) c[r][v] =
                v_add(v_load(C + r * ldc + v * VL), c[r][v]);
        }
        if (!acc && k1 == K) {
            const vf al = v_set1(alpha);
            UNROLL for (int r = 0; r < MR; r++) UNROLL for (int v = 0; v < NV; v++) c[r][v] =
                v_mul(c[r][v], al);
        }
        UNROLL for (int r = 0; r < MR; r++) UNROLL for (int v = 0; v < NV; v++)
            v_store(C + r * ldc + v * VL, c[r][v]);
        k0 = k1;
    } while (k0 < K);
}

typedef void (*ukr_fn)(const tile_prod *, int, float, int64_t);
#define UKR_DEF(MR, NV)                                                                            \
    static void ukr_##MR##_##NV(const tile_prod *t, int acc, float alpha, int64_t kb) {            \
        ukr_body(MR, NV, t, acc, alpha, kb);                                                       \
    }
#define UKR_DEF_ROW(MR) UKR_DEF(MR, 1) UKR_DEF(MR, 2) UKR_DEF(MR, 3) UKR_DEF(MR, 4)
UKR_DEF_ROW(1)
UKR_DEF_ROW(2)
UKR_DEF_ROW(3)
UKR_DEF_ROW(4)
UKR_DEF_ROW(5)
UKR_DEF_ROW(6)
#define UKR_ROWFN(MR)                                                                              \
    { ukr_##MR##_1, ukr_##MR##_2, ukr_##MR##_3, ukr_##MR##_4 }
static const ukr_fn ukr_tab[6][4] = {UKR_ROWFN(1), UKR_ROWFN(2), UKR_ROWFN(3),
                                     UKR_ROWFN(4), UKR_ROWFN(5), UKR_ROWFN(6)};

/* TILE_SAFE for tiles with non-finite operands: terms whose A entry is 0 are
 * left out, as the reference leaves out zero weights. Columns are
 * independent, so it runs in chunks of at most 16 vectors (tmp: 16·VL). */
static void gemm_safe(const tile_prod *t, int acc, float alpha, int64_t kb, float *tmp) {
    const int64_t nvec = t->nvec;
    for (int64_t m = 0; m < t->M; m++) {
        float *c = t->C + m * t->ldc;
        if (!acc)
            for (int64_t n = 0; n < nvec * VL; n++) c[n] = 0.0f;
        for (int64_t k0 = 0; k0 < t->K; k0 += kb) {
            float *s = k0 == 0 ? c : tmp; /* later blocks: from 0, then added */
            if (k0 > 0)
                for (int64_t n = 0; n < nvec * VL; n++) s[n] = 0.0f;
            for (int64_t k = k0; k < t->K && k < k0 + kb; k++) {
                const float a = t->A[m * t->ars + k * t->aks];
                if (a == 0.0f) continue;
                const vf av = v_set1(a);
                const float *b = t->B + k * t->ldb;
                for (int64_t v = 0; v < nvec; v++)
                    v_store(s + v * VL, v_fma(av, v_load(b + v * VL), v_load(s + v * VL)));
            }
            if (k0 > 0)
                for (int64_t n = 0; n < nvec * VL; n++) c[n] += s[n];
        }
        if (!acc)
            for (int64_t n = 0; n < nvec * VL; n++) c[n] *= alpha;
    }
}

/* TILE_BLAS: 1 when sgemm took the product (A row- or column-major). */
static int gemm_blas(const tile_prod *t, int acc, float alpha) {
    if (t->K <= 0) return 0;
    const blasint M = (blasint)t->M, N = (blasint)(t->nvec * VL), K = (blasint)t->K;
    const float a = acc ? 1.0f : alpha, b = acc ? 1.0f : 0.0f;
    omp_set_num_threads(1); /* this region's ICV: OpenBLAS single-threaded here */
    if (t->aks == 1 && t->ars >= t->K) {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, N, K, a, t->A, (blasint)t->ars,
                    t->B, (blasint)t->ldb, b, t->C, (blasint)t->ldc);
        return 1;
    }
    if (t->ars == 1 && t->aks >= t->M) {
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, M, N, K, a, t->A, (blasint)t->aks,
                    t->B, (blasint)t->ldb, b, t->C, (blasint)t->ldc);
        return 1;
    }
    return 0;
}

/* The tile product: C = alpha·A·B (acc = 0) or C += A·B (acc = 1), formed
 * by mode (TILE_*), the k loop in blocks of kb. */
static void gemm_kb(const tile_prod *t, int acc, float alpha, int mode, int64_t kb) {
    if (t->M <= 0 || t->nvec <= 0) return;
    if (mode == TILE_SAFE) {
        _Alignas(64) float tmp[16 * VL];
        for (int64_t v0 = 0; v0 < t->nvec; v0 += 16) {
            tile_prod part = *t;
            part.nvec = imin(16, t->nvec - v0);
            part.B = t->B + v0 * VL;
            part.C = t->C + v0 * VL;
            gemm_safe(&part, acc, alpha, kb, tmp);
        }
        return;
    }
    if (mode == TILE_BLAS && gemm_blas(t, acc, alpha)) return;
    tile_prod sub = *t; /* the micro-tile: only A, B, C move */
    for (int64_t n0 = 0; n0 < t->nvec; n0 += UKR_NV) {
        const int nv = (int)imin(UKR_NV, t->nvec - n0);
        for (int64_t m0 = 0; m0 < t->M; m0 += UKR_MR) {
            const int mr = (int)imin(UKR_MR, t->M - m0);
            sub.A = t->A + m0 * t->ars;
            sub.B = t->B + n0 * VL;
            sub.C = t->C + m0 * t->ldc + n0 * VL;
            ukr_tab[mr - 1][nv - 1](&sub, acc, alpha, kb);
        }
    }
}

/* Products over keys or queries: one chain per tile (they continue across
 * tiles anyway, like the reference's sums over keys). */
static inline void gemm(const tile_prod *t, int acc, float alpha, int mode) {
    gemm_kb(t, acc, alpha, mode, INT64_MAX);
}
/* Products over the head dimension d (S = K·Qᵀ, dP = V·dOᵀ): blocked,
 * never accumulating. */
static inline void gemm_d(const tile_prod *t, float alpha, int mode) {
    gemm_kb(t, 0, alpha, mode, UKR_KB);
}

#endif
