/* The fused SDPA kernels, written once over a small vector vocabulary and
 * compiled three times: sdpa_fused_avx512.c, sdpa_fused_avx2.c and
 * sdpa_fused_portable.c define the vocabulary (vf, VL, v_*), FUSED_SUFFIX
 * and the micro-kernel shape (UKR_MR rows x UKR_NV vectors), then include
 * this file. Not a public header; only those three files include it.
 *
 * Layout ("transposed scores"): a tile of scores is stored as Sᵀ, keys as
 * rows and query rows as vector lanes. Then
 *   - Sᵀ = K·Qᵀ reads K in its own layout (broadcasts of K[j][d]) and the
 *     query block transposed once per block (Qᵀ, vector loads);
 *   - the softmax statistics (running max m, sum l, rescale factor) are
 *     vectors over query rows: no horizontal reductions in the hot loop;
 *   - O += P·V broadcasts P[i][j] from Sᵀ and loads V rows as vectors.
 * Every tile product is one generic micro-kernel: C[M×N] (+)= A[M×K]·B[K×N]
 * where A is read by broadcasts with any (row, k) strides and B by vector
 * loads of its rows; N is a multiple of VL (scratch is padded with zeros).
 *
 * Forward: tiles FQ query rows x FK keys, online softmax with O kept
 * unnormalised (rescaled by exp(m_old - m_new) only when the max moved) and
 * divided by l once at the end; only the log-sum-exp leaves the kernel.
 * Tiles outside the block's structural key range are skipped; boundary tiles
 * get per-row -inf; bool/additive masks are applied inside the tile.
 * Backward: FlashAttention-2 recomputation of P from the log-sum-exp, and
 * D = rowsum(dO∘O). One pass per (b, h) when heads spread evenly over the
 * threads, else two passes (dK/dV by key group, dQ by query block). Both
 * schemes compute every tile with the same code and accumulate every output
 * element in the same order, so results do not depend on the scheme or the
 * thread count.
 * Decode (Lq <= FUSED_DECODE_MAXLQ): keys split in fixed chunks (independent
 * of the thread count), partial (max, sum, accumulator) per chunk, merged in
 * chunk order; its backward writes each chunk's dK/dV rows and a partial dQ,
 * summed in chunk order. Scores there are row dot products (vectors along
 * d), the same function in forward and backward.
 *
 * Memory: per-thread scratch sized up front from the shapes (a few tiles;
 * the one-pass backward adds a [Lk x D] dK/dV accumulator per thread, the
 * decode paths a (max, sum, acc) or dQ partial per row and chunk). Nothing
 * is O(Lq·Lk) unless the caller asks for the weights.
 *
 * Accuracy: products over the head dimension (S = K·Qᵀ, dP = V·dOᵀ, and D)
 * sum in blocks of UKR_KB terms, which keeps their rounding within about the
 * reference's split dot products; sums over keys or queries run in one chain
 * across tiles, as the reference's do.
 *
 * Non-finite inputs: a product that multiplies a zero weight by a NaN/Inf
 * operand would poison rows the reference leaves clean (the reference skips
 * zero weights). The forward detects such rows after the fact (non-finite
 * output with a finite sum) and recomputes the block with zero-skipping
 * products; the backward checks each tile's operands and uses zero-skipping
 * products for tiles that hold a non-finite value. */

#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define FCAT_(a, b) a##b
#define FCAT(a, b) FCAT_(a, b)
#define FN(name) FCAT(name, FUSED_SUFFIX)

#define FQ ATTN_FUSED_QTILE /* query rows per block */
#define FK ATTN_FUSED_KTILE /* keys per tile */
#define KGROUP 4            /* key tiles per work item in the two-pass backward */

#if defined(__GNUC__) && !defined(__clang__)
#define UNROLL _Pragma("GCC unroll 16")
#else
#define UNROLL
#endif

static inline int64_t imin(int64_t a, int64_t b) { return a < b ? a : b; }
static inline int64_t imax(int64_t a, int64_t b) { return a > b ? a : b; }
static inline int64_t rup(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

/* n floats, 64-byte aligned (size rounded up as aligned_alloc wants). */
static float *falloc(int64_t n) {
    return aligned_alloc(64, (size_t)rup(n > 0 ? n : 1, 16) * sizeof(float));
}

/* Scratch carving: 64-byte aligned pieces of a per-thread block. */
static inline float *carve(float **p, int64_t n) {
    float *r = *p;
    *p += rup(n, 16);
    return r;
}

/* ------------------------------------------------------------ micro-kernel */

/* C[MR × NV·VL] = alpha·A·B (acc = 0) or C += A·B (acc = 1); A(r, k) at
 * A[r·ars + k·aks]. The k loop runs in blocks of UKR_KB: the first block is
 * one FMA chain from the initial value (C or 0), each later block a chain
 * from 0 added to the running total (kept in C), which bounds the rounding
 * error of long (d = 256) dot products near that of the reference's split
 * sums. Each C element's arithmetic depends only on K, never on how M and N
 * are blocked, so results do not depend on tiling or threads. */
#ifndef UKR_KB
#define UKR_KB 32 /* K block of the products over d (S, dP) */
#endif
static inline __attribute__((always_inline)) void ukr_body(const int MR, const int NV, int64_t K,
                                                           const float *A, int64_t ars,
                                                           int64_t aks, const float *B,
                                                           int64_t ldb, float *C, int64_t ldc,
                                                           int acc, float alpha, int64_t kb) {
    const float *a0 = A, *a1 = A + ars, *a2 = A + 2 * ars, *a3 = A + 3 * ars, *a4 = A + 4 * ars,
                *a5 = A + 5 * ars;
    int64_t k0 = 0;
    do {
        const int64_t k1 = K - k0 > kb ? k0 + kb : K;
        vf c[6][4];
        UNROLL for (int r = 0; r < MR; r++) UNROLL for (int v = 0; v < NV; v++) c[r][v] = v_zero();
        if (acc && k0 == 0) {
            UNROLL for (int r = 0; r < MR; r++) UNROLL for (int v = 0; v < NV; v++)
                c[r][v] = v_load(C + r * ldc + v * VL);
        }
        for (int64_t k = k0; k < k1; k++) {
            vf b[4];
            UNROLL for (int v = 0; v < NV; v++) b[v] = v_load(B + v * VL);
            B += ldb;
            const int64_t o = k * aks;
#define UKR_ROW(r, ap)                                                                       \
    if (MR > r) {                                                                            \
        const vf ar = v_set1(ap[o]);                                                         \
        UNROLL for (int v = 0; v < NV; v++) c[r][v] = v_fma(ar, b[v], c[r][v]);              \
    }
            UKR_ROW(0, a0) UKR_ROW(1, a1) UKR_ROW(2, a2) UKR_ROW(3, a3) UKR_ROW(4, a4) UKR_ROW(5, a5)
#undef UKR_ROW
        }
        if (k0 > 0) {
            UNROLL for (int r = 0; r < MR; r++) UNROLL for (int v = 0; v < NV; v++)
                c[r][v] = v_add(v_load(C + r * ldc + v * VL), c[r][v]);
        }
        if (!acc && k1 == K) {
            const vf al = v_set1(alpha);
            UNROLL for (int r = 0; r < MR; r++) UNROLL for (int v = 0; v < NV; v++)
                c[r][v] = v_mul(c[r][v], al);
        }
        UNROLL for (int r = 0; r < MR; r++) UNROLL for (int v = 0; v < NV; v++)
            v_store(C + r * ldc + v * VL, c[r][v]);
        k0 = k1;
    } while (k0 < K);
}

typedef void (*ukr_fn)(int64_t, const float *, int64_t, int64_t, const float *, int64_t, float *,
                       int64_t, int, float, int64_t);
#define UKR_DEF(MR, NV)                                                                      \
    static void ukr_##MR##_##NV(int64_t K, const float *A, int64_t ars, int64_t aks,         \
                                const float *B, int64_t ldb, float *C, int64_t ldc, int acc, \
                                float alpha, int64_t kb) {                                   \
        ukr_body(MR, NV, K, A, ars, aks, B, ldb, C, ldc, acc, alpha, kb);                    \
    }
#define UKR_DEF_ROW(MR) UKR_DEF(MR, 1) UKR_DEF(MR, 2) UKR_DEF(MR, 3) UKR_DEF(MR, 4)
UKR_DEF_ROW(1)
UKR_DEF_ROW(2)
UKR_DEF_ROW(3)
UKR_DEF_ROW(4)
UKR_DEF_ROW(5)
UKR_DEF_ROW(6)
#define UKR_ROWFN(MR) {ukr_##MR##_1, ukr_##MR##_2, ukr_##MR##_3, ukr_##MR##_4}
static const ukr_fn ukr_tab[6][4] = {UKR_ROWFN(1), UKR_ROWFN(2), UKR_ROWFN(3),
                                     UKR_ROWFN(4), UKR_ROWFN(5), UKR_ROWFN(6)};

/* Zero-skipping product for tiles with non-finite operands: terms whose A
 * entry is 0 are left out, as the reference leaves out zero weights. */
static void gemm_safe(int64_t M, int64_t nvec, int64_t K, const float *A, int64_t ars,
                      int64_t aks, const float *B, int64_t ldb, float *C, int64_t ldc, int acc,
                      float alpha, int64_t kb, float *tmp) {
    for (int64_t m = 0; m < M; m++) {
        float *c = C + m * ldc;
        if (!acc)
            for (int64_t n = 0; n < nvec * VL; n++) c[n] = 0.0f;
        for (int64_t k0 = 0; k0 < K; k0 += kb) {
            float *t = k0 == 0 ? c : tmp; /* later blocks: from 0, then added */
            if (k0 > 0)
                for (int64_t n = 0; n < nvec * VL; n++) t[n] = 0.0f;
            for (int64_t k = k0; k < K && k < k0 + kb; k++) {
                const float a = A[m * ars + k * aks];
                if (a == 0.0f) continue;
                const vf av = v_set1(a);
                const float *b = B + k * ldb;
                for (int64_t v = 0; v < nvec; v++)
                    v_store(t + v * VL, v_fma(av, v_load(b + v * VL), v_load(t + v * VL)));
            }
            if (k0 > 0)
                for (int64_t n = 0; n < nvec * VL; n++) c[n] += t[n];
        }
        if (!acc)
            for (int64_t n = 0; n < nvec * VL; n++) c[n] *= alpha;
    }
}

/* The tile product: C[M × nvec·VL] = alpha·A·B or C += A·B.
 * mode: 0 own micro-kernel, 1 zero-skipping (non-finite operands),
 * 2 OpenBLAS sgemm on the tile (measurement; single-threaded BLAS). */
static void gemm_kb(int64_t M, int64_t nvec, int64_t K, const float *A, int64_t ars, int64_t aks,
                    const float *B, int64_t ldb, float *C, int64_t ldc, int acc, float alpha,
                    int mode, int64_t kb) {
    if (M <= 0 || nvec <= 0) return;
    if (mode == 1) { /* columns are independent: chunks of 16 vectors, stack scratch */
        _Alignas(64) float tmp[16 * VL];
        for (int64_t v0 = 0; v0 < nvec; v0 += 16)
            gemm_safe(M, nvec - v0 < 16 ? nvec - v0 : 16, K, A, ars, aks, B + v0 * VL, ldb,
                      C + v0 * VL, ldc, acc, alpha, kb, tmp);
        return;
    }
    if (mode == 2 && K > 0) {
        const int64_t N = nvec * VL;
        omp_set_num_threads(1); /* this region's ICV: OpenBLAS single-threaded here */
        if (aks == 1 && ars >= K) {
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (blasint)M, (blasint)N,
                        (blasint)K, acc ? 1.0f : alpha, A, (blasint)ars, B, (blasint)ldb,
                        acc ? 1.0f : 0.0f, C, (blasint)ldc);
            return;
        }
        if (ars == 1 && aks >= M) {
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (blasint)M, (blasint)N,
                        (blasint)K, acc ? 1.0f : alpha, A, (blasint)aks, B, (blasint)ldb,
                        acc ? 1.0f : 0.0f, C, (blasint)ldc);
            return;
        }
    }
    for (int64_t n0 = 0; n0 < nvec; n0 += UKR_NV) {
        const int nv = (int)imin(UKR_NV, nvec - n0);
        for (int64_t m0 = 0; m0 < M; m0 += UKR_MR) {
            const int mr = (int)imin(UKR_MR, M - m0);
            ukr_tab[mr - 1][nv - 1](K, A + m0 * ars, ars, aks, B + n0 * VL, ldb,
                                    C + m0 * ldc + n0 * VL, ldc, acc, alpha, kb);
        }
    }
}

/* Products over keys or queries: one chain per tile (they continue across
 * tiles anyway, like the reference's sums over keys). */
static void gemm(int64_t M, int64_t nvec, int64_t K, const float *A, int64_t ars, int64_t aks,
                 const float *B, int64_t ldb, float *C, int64_t ldc, int acc, float alpha,
                 int mode) {
    gemm_kb(M, nvec, K, A, ars, aks, B, ldb, C, ldc, acc, alpha, mode, INT64_MAX);
}
/* Products over the head dimension d (S = K·Qᵀ, dP = V·dOᵀ): blocked. */
static void gemm_d(int64_t M, int64_t nvec, int64_t K, const float *A, int64_t ars, int64_t aks,
                   const float *B, int64_t ldb, float *C, int64_t ldc, float alpha, int mode) {
    gemm_kb(M, nvec, K, A, ars, aks, B, ldb, C, ldc, 0, alpha, mode, UKR_KB);
}

/* ------------------------------------------------------------ helpers */

typedef struct {
    const attn_problem *pr;
    const attn_tensor *q, *k, *v;
    int64_t dkp, dvp; /* head sizes rounded up to VL */
    int k_rows, v_rows; /* K / V rows usable in place as a B operand */
    int mode;           /* gemm mode for finite tiles: 0 own kernel, 2 BLAS */
} kctx;

static inline const float *row_of(const attn_tensor *t, int64_t b, int64_t h, int64_t l) {
    return t->data + b * t->stride[0] + h * t->stride[1] + l * t->stride[2];
}
static inline float *row_mut(const attn_tensor *t, int64_t b, int64_t h, int64_t l) {
    return t->data + b * t->stride[0] + h * t->stride[1] + l * t->stride[2];
}

/* Keys [lo, hi) that some row of [i0, i0 + nq) sees (lo and hi of a row
 * never decrease with the row). */
static void block_hull(const attn_problem *pr, int64_t b, int64_t i0, int64_t nq, int64_t *lo,
                       int64_t *hi) {
    int64_t l0, h0, l1, h1;
    attn_row_range(pr, b, i0, &l0, &h0);
    attn_row_range(pr, b, i0 + nq - 1, &l1, &h1);
    *lo = l0;
    *hi = h1 > l0 ? h1 : l0;
}

/* Does every row of the block see every key of [j0, j1)? */
static int tile_interior(const attn_problem *pr, int64_t b, int64_t i0, int64_t nq, int64_t j0,
                         int64_t j1) {
    int64_t l0, h0, l1, h1;
    attn_row_range(pr, b, i0, &l0, &h0);
    attn_row_range(pr, b, i0 + nq - 1, &l1, &h1);
    return l1 <= j0 && h0 >= j1;
}

/* Masks on a tile Sᵀ[nk][ld] of query rows [i0, i0 + nq), keys [j0, j0 + nk):
 * element masks (additive, then bool), structural masks unless the tile is
 * interior, and -inf in the padding lanes [nq, ld). */
static void mask_tile(const attn_problem *pr, float *S, int64_t ld, int64_t b, int64_t h,
                      int64_t i0, int64_t nq, int64_t j0, int64_t nk) {
    const int64_t j1 = j0 + nk;
    if (pr->amask || pr->bmask) {
        for (int64_t i = 0; i < nq; i++) {
            const int64_t ig = i0 + i;
            const float *am = pr->amask ? pr->amask + b * pr->ams[0] + h * pr->ams[1] +
                                              ig * pr->ams[2]
                                        : NULL;
            const uint8_t *bm = pr->bmask ? pr->bmask + b * pr->bms[0] + h * pr->bms[1] +
                                                ig * pr->bms[2]
                                          : NULL;
            for (int64_t j = 0; j < nk; j++) {
                float *s = S + j * ld + i;
                if (bm && !bm[(j0 + j) * pr->bms[3]])
                    *s = -INFINITY;
                else if (am)
                    *s += am[(j0 + j) * pr->ams[3]];
            }
        }
    }
    if (!tile_interior(pr, b, i0, nq, j0, j1)) {
        for (int64_t i = 0; i < nq; i++) {
            int64_t lo, hi;
            attn_row_range(pr, b, i0 + i, &lo, &hi);
            for (int64_t j = j0; j < imin(lo, j1); j++) S[(j - j0) * ld + i] = -INFINITY;
            for (int64_t j = imax(hi, j0); j < j1; j++) S[(j - j0) * ld + i] = -INFINITY;
        }
    }
    if (nq < ld)
        for (int64_t j = 0; j < nk; j++)
            for (int64_t i = nq; i < ld; i++) S[j * ld + i] = -INFINITY;
}

/* Dropout multipliers of a tile: z[j][i] (ld) for rows [i0, i0+nq), keys
 * [j0, j0+nk); the reference's counter (j/4, i, h, b) and threshold. */
static void dropout_tile(const attn_problem *pr, float *Z, int64_t ld, int64_t b, int64_t h,
                         int64_t i0, int64_t nq, int64_t j0, int64_t nk, int multiply) {
    const int64_t j1 = j0 + nk;
    for (int64_t i = 0; i < nq; i++) {
        int64_t j = j0;
        while (j < j1) {
            uint32_t w[4];
            const int64_t c = j >> 2, je = imin(j1, (c + 1) * 4);
            attn_philox_block(pr->drop_key, b, h, i0 + i, c, w);
            for (; j < je; j++) {
                const float mult = w[j & 3] < pr->drop_threshold ? 0.0f : pr->keep_scale;
                float *z = Z + (j - j0) * ld + i;
                *z = multiply ? *z * mult : mult;
            }
        }
    }
}

/* Rows [0, n) of a strided row, contiguous copy zero-padded to np. */
static inline void copy_row(float *dst, const float *src, int64_t stride, int64_t n, int64_t np) {
    if (stride == 1)
        memcpy(dst, src, (size_t)n * sizeof(float));
    else
        for (int64_t d = 0; d < n; d++) dst[d] = src[d * stride];
    for (int64_t d = n; d < np; d++) dst[d] = 0.0f;
}

/* Transposed copy of rows [l0, l0 + n) of a (b, h) slice: dst[d][i] (ld),
 * lanes [n, ld) zero. VL x VL blocks go through registers when the rows are
 * contiguous and evenly spaced (any row stride: B, H, L strides are fixed). */
static void pack_transposed(float *dst, int64_t ld, const attn_tensor *t, int64_t b, int64_t h,
                            int64_t l0, int64_t n, int64_t D) {
    const int64_t sd = t->stride[3], sl = t->stride[2];
    int64_t nb = 0, db = 0; /* rows / columns covered by whole blocks */
    if (sd == 1) {
        nb = n / VL * VL, db = D / VL * VL;
        const float *base = row_of(t, b, h, l0);
        for (int64_t i = 0; i < nb; i += VL)
            for (int64_t d = 0; d < db; d += VL)
                v_transpose_block(base + i * sl + d, sl, dst + d * ld + i, ld);
    }
    for (int64_t i = 0; i < n; i++) {
        const float *r = row_of(t, b, h, l0 + i);
        for (int64_t d = i < nb ? db : 0; d < D; d++) dst[d * ld + i] = r[d * sd];
    }
    if (n < ld)
        for (int64_t d = 0; d < D; d++)
            for (int64_t i = n; i < ld; i++) dst[d * ld + i] = 0.0f;
}

/* B operand of key rows [j0, j0 + nk) of K or V: in place when the rows are
 * contiguous and D is a multiple of VL, else packed into buf. */
static const float *key_rows(const attn_tensor *t, int in_place, int64_t b, int64_t h,
                             int64_t j0, int64_t nk, int64_t D, int64_t Dp, float *buf,
                             int64_t *ld) {
    if (in_place) {
        *ld = t->stride[2];
        return row_of(t, b, h, j0);
    }
    for (int64_t j = 0; j < nk; j++)
        copy_row(buf + j * Dp, row_of(t, b, h, j0 + j), t->stride[3], D, Dp);
    *ld = Dp;
    return buf;
}

/* 1 when rows [l0, l0 + n) hold only finite values: x·0 is ±0 for finite x
 * and NaN otherwise, so the lane sums are 0 exactly when every x is finite
 * (in any order, hence vectorised). */
static int rows_finite(const attn_tensor *t, int64_t b, int64_t h, int64_t l0, int64_t n,
                       int64_t D) {
    const int64_t sd = t->stride[3];
    const vf z = v_zero();
    vf acc = v_zero();
    float sacc = 0.0f;
    for (int64_t i = 0; i < n; i++) {
        const float *r = row_of(t, b, h, l0 + i);
        if (sd == 1) {
            int64_t d = 0;
            for (; d + VL <= D; d += VL) acc = v_add(acc, v_mul(v_load(r + d), z));
            if (d < D) acc = v_add(acc, v_mul(v_load_n(r + d, (int)(D - d)), z));
        } else {
            for (int64_t d = 0; d < D; d++) sacc += r[d * sd] * 0.0f;
        }
    }
    return v_hsum(acc) + sacc == 0.0f;
}

static const float kNegInf = -INFINITY;

/* ------------------------------------------------------------ forward */

/* Tiles [t0, t1) of the key grid that query block blk touches. */
static void block_tiles(const attn_problem *pr, int64_t b, int64_t i0, int64_t nq, int64_t *hlo,
                        int64_t *hhi, int64_t *t0, int64_t *t1) {
    block_hull(pr, b, i0, nq, hlo, hhi);
    *t0 = *hlo / FK;
    *t1 = *hhi > *hlo ? (*hhi + FK - 1) / FK : *t0;
}


/* Per-thread forward scratch, in floats. */
static int64_t fwd_scratch(const attn_problem *pr, int64_t dvp) {
    return rup(pr->Dk * FQ, 16) + rup(FK * FQ, 16) + rup(FQ * dvp, 16) + rup(FK * dvp, 16) +
           4 * rup(FQ, 16) + 64;
}

/* One block of query rows [i0, i0 + nq) of head (b, h). */
static void fwd_block(const kctx *c, float *ws, int64_t b, int64_t h, int64_t i0, int64_t nq,
                      const attn_tensor *out, float *lse_out, float *weights) {
    const attn_problem *pr = c->pr;
    const int64_t Dk = pr->Dk, Dv = pr->Dv, Lk = pr->Lk, dvp = c->dvp;
    const int64_t nqv = rup(nq, VL), nvq = nqv / VL;
    float *qt = carve(&ws, Dk * FQ), *S = carve(&ws, FK * FQ), *O = carve(&ws, FQ * dvp),
          *vt = carve(&ws, FK * dvp), *m = carve(&ws, FQ), *l = carve(&ws, FQ),
          *al = carve(&ws, FQ);
    const attn_tensor *K = c->k, *V = c->v;
    const int64_t ks2 = K->stride[2], ks3 = K->stride[3];

    pack_transposed(qt, nqv, c->q, b, h, i0, nq, Dk);
    int64_t hlo, hhi, t0, t1;
    block_tiles(pr, b, i0, nq, &hlo, &hhi, &t0, &t1);

    for (int safe = 0; safe < 2; safe++) {
        const int mode = safe ? 1 : c->mode;
        for (int64_t i = 0; i < nqv; i++) m[i] = -INFINITY, l[i] = 0.0f;
        memset(O, 0, (size_t)(nq * dvp) * sizeof(float));
        for (int64_t t = t0; t < t1; t++) {
            const int64_t j0 = imax(t * FK, hlo), j1 = imin((t + 1) * FK, hhi), nk = j1 - j0;
            gemm_d(nk, nvq, Dk, row_of(K, b, h, j0), ks2, ks3, qt, nqv, S, nqv, pr->scale, c->mode);
            mask_tile(pr, S, nqv, b, h, i0, nq, j0, nk);
            /* Online softmax, lanes = query rows. */
            int moved = 0;
            for (int64_t vq = 0; vq < nvq; vq++) {
                const vf mold = v_load(m + vq * VL);
                vf mx = mold;
                for (int64_t j = 0; j < nk; j++) mx = v_max(v_load(S + j * nqv + vq * VL), mx);
                const vf mu = v_zero_if_eq(mx, mx, kNegInf);
                const vf alpha = v_exp(v_sub(mold, mu));
                vf sum = v_zero();
                for (int64_t j = 0; j < nk; j++) {
                    float *s = S + j * nqv + vq * VL;
                    const vf p = v_exp(v_sub(v_load(s), mu));
                    v_store(s, p);
                    sum = v_add(sum, p);
                }
                v_store(l + vq * VL, v_add(v_mul(v_load(l + vq * VL), alpha), sum));
                v_store(m + vq * VL, mx);
                v_store(al + vq * VL, alpha);
            }
            for (int64_t i = 0; i < nq; i++) moved |= al[i] != 1.0f;
            if (pr->dropout) dropout_tile(pr, S, nqv, b, h, i0, nq, j0, nk, 1);
            if (moved)
                for (int64_t i = 0; i < nq; i++) {
                    if (al[i] == 1.0f) continue;
                    const vf a = v_set1(al[i]);
                    float *o = O + i * dvp;
                    for (int64_t d = 0; d < dvp; d += VL) v_store(o + d, v_mul(v_load(o + d), a));
                }
            int64_t ldv;
            const float *vb = key_rows(V, c->v_rows, b, h, j0, nk, Dv, dvp, vt, &ldv);
            gemm(nq, dvp / VL, nk, S, 1, nqv, vb, ldv, O, dvp, 1, 1.0f, mode);
        }
        if (safe) break;
        /* A non-finite output in a row with a finite sum means a zero weight
         * met a non-finite V entry: redo the block skipping zero weights. */
        vf bad = v_zero();
        for (int64_t i = 0; i < nq; i++)
            if (l[i] > 0.0f)
                for (int64_t d = 0; d < dvp; d += VL) bad = v_fma(v_load(O + i * dvp + d), v_zero(), bad);
        if (v_hsum(bad) == 0.0f) break; /* NaN iff some entry was NaN or Inf */
    }

    const int64_t so = out->stride[3];
    for (int64_t i = 0; i < nq; i++) {
        float *o = row_mut(out, b, h, i0 + i);
        const float L = l[i];
        const float inv = 1.0f / L; /* NaN for a poisoned row */
        const float *src = O + i * dvp;
        if (L == 0.0f) { /* no visible key: exactly 0, whatever O holds */
            for (int64_t d = 0; d < Dv; d++) o[d * so] = 0.0f;
        } else if (so == 1) {
            const vf iv = v_set1(inv);
            int64_t d = 0;
            for (; d + VL <= Dv; d += VL) v_store(o + d, v_mul(v_load(src + d), iv));
            for (; d < Dv; d++) o[d] = src[d] * inv;
        } else {
            for (int64_t d = 0; d < Dv; d++) o[d * so] = src[d] * inv;
        }
        if (lse_out) lse_out[i] = L == 0.0f ? -INFINITY : m[i] + logf(L);
        al[i] = 1.0f / L; /* reused below: 1/l per row */
    }
    if (!weights) return;

    /* Exact weights in a second pass over the same tiles: exp(s - m) / l,
     * which is exp(s - lse) without the rounding of lse (at |s| ~ 1e4 the
     * rounding of lse alone would cost 1e-4 relative). */
    for (int64_t i = 0; i < nqv; i++) {
        if (i >= nq) al[i] = 0.0f, m[i] = 0.0f;
        if (m[i] == -INFINITY) m[i] = 0.0f;
    }
    for (int64_t i = 0; i < nq; i++) {
        float *w = weights + i * Lk;
        for (int64_t j = 0; j < hlo; j++) w[j] = 0.0f;
        for (int64_t j = hhi; j < Lk; j++) w[j] = 0.0f;
    }
    for (int64_t t = t0; t < t1; t++) {
        const int64_t j0 = imax(t * FK, hlo), j1 = imin((t + 1) * FK, hhi), nk = j1 - j0;
        gemm_d(nk, nvq, Dk, row_of(K, b, h, j0), ks2, ks3, qt, nqv, S, nqv, pr->scale, c->mode);
        mask_tile(pr, S, nqv, b, h, i0, nq, j0, nk);
        for (int64_t vq = 0; vq < nvq; vq++) {
            const vf mv = v_load(m + vq * VL), iv = v_load(al + vq * VL);
            for (int64_t j = 0; j < nk; j++) {
                float *s = S + j * nqv + vq * VL;
                const vf x = v_load(s);
                v_store(s, v_zero_if_eq(v_mul(v_exp(v_sub(x, mv)), iv), x, kNegInf));
            }
        }
        for (int64_t i = 0; i < nq; i++) {
            float *w = weights + i * Lk + j0;
            for (int64_t j = 0; j < nk; j++) w[j] = S[j * nqv + i];
        }
    }
}

/* ------------------------------------------------------------ decode */

static int64_t dec_chunk(int64_t Lk) {
    int64_t C = FUSED_DECODE_CHUNK;
    while (Lk > 64 * C) C *= 2;
    return C;
}

static int64_t dec_scratch(const attn_problem *pr, int64_t dkp, int64_t dvp) {
    return rup(dkp, 16) + rup(dec_chunk(pr->Lk) + VL, 16) + rup(dvp, 16) + rup(dkp + dvp, 16) + 64;
}

/* scale · q·k for query row qr (contiguous, zero-padded to dkp) and key
 * row kr (stride K->stride[3]; copied to tmp when not contiguous). The
 * decode forward and the decode backward both score with this, so the
 * backward's recomputed scores match the forward's bit for bit (at |s| ~ 1e4
 * any difference would show in exp(s - lse)). */
static inline float dec_dot(const kctx *c, const float *qr, const float *kr, float *tmp) {
    const int64_t Dk = c->pr->Dk;
    if (c->k->stride[3] != 1) {
        copy_row(tmp, kr, c->k->stride[3], Dk, c->dkp);
        kr = tmp;
    }
    vf acc = v_zero();
    int64_t d = 0;
    for (; d + VL <= Dk; d += VL) acc = v_fma(v_load(qr + d), v_load(kr + d), acc);
    if (d < Dk) acc = v_fma(v_load(qr + d), v_load_n(kr + d, (int)(Dk - d)), acc);
    return c->pr->scale * v_hsum(acc);
}

/* Scores s[j - a] of query row qr against keys [a, e): scale·q·k, additive
 * mask added, bool-masked keys -inf. */
static void dec_scores(const kctx *c, const float *qr, float *tmp, int64_t b, int64_t h, int64_t i,
                       int64_t a, int64_t e, float *s) {
    const attn_problem *pr = c->pr;
    const uint8_t *bm = pr->bmask ? pr->bmask + b * pr->bms[0] + h * pr->bms[1] + i * pr->bms[2]
                                  : NULL;
    const float *am = pr->amask ? pr->amask + b * pr->ams[0] + h * pr->ams[1] + i * pr->ams[2]
                                : NULL;
    for (int64_t j = a; j < e; j++) {
        if (bm && !bm[j * pr->bms[3]]) {
            s[j - a] = -INFINITY;
            continue;
        }
        float x = dec_dot(c, qr, row_of(c->k, b, h, j), tmp);
        if (am) x += am[j * pr->ams[3]];
        s[j - a] = x;
    }
}

/* Partial softmax of query row i over keys [c0, c1): max, sum, acc[dvp].
 * s: the row's scores for keys [c0, c1) (s[0] is key c0) when the caller
 * scored them already (whole-head items: K streamed once, then V), else
 * NULL and the chunk is scored here. */
static void dec_partial(const kctx *c, float *ws, int64_t b, int64_t h, int64_t i, int64_t c0,
                        int64_t c1, const float *scored, float *pm, float *pl, float *pacc) {
    const attn_problem *pr = c->pr;
    const int64_t Dv = pr->Dv, dvp = c->dvp, dkp = c->dkp;
    float *qr = carve(&ws, dkp), *s = carve(&ws, dec_chunk(pr->Lk) + VL), *acc = carve(&ws, dvp),
          *tmp = carve(&ws, dkp + dvp);
    int64_t lo, hi;
    attn_row_range(pr, b, i, &lo, &hi);
    const int64_t a = imax(lo, c0), e = imin(hi, c1), n = e - a;
    memset(pacc, 0, (size_t)dvp * sizeof(float));
    *pm = -INFINITY;
    *pl = 0.0f;
    if (n <= 0) return;
    if (scored) {
        memcpy(s, scored + (a - c0), (size_t)n * sizeof(float));
    } else {
        copy_row(qr, row_of(c->q, b, h, i), c->q->stride[3], pr->Dk, dkp);
        dec_scores(c, qr, tmp, b, h, i, a, e, s);
    }
    const int64_t np = rup(n, VL);
    for (int64_t j = n; j < np; j++) s[j] = -INFINITY;
    vf mx = v_set1(-INFINITY);
    for (int64_t j = 0; j < np; j += VL) mx = v_max(v_load(s + j), mx);
    const float M = v_hmax(mx);
    const vf mu = v_set1(M == -INFINITY ? 0.0f : M);
    vf sum = v_zero();
    for (int64_t j = 0; j < np; j += VL) {
        const vf p = v_exp(v_sub(v_load(s + j), mu));
        v_store(s + j, p);
        sum = v_add(sum, p);
    }
    memset(acc, 0, (size_t)dvp * sizeof(float));
    const attn_tensor *V = c->v;
    const int vcontig = V->stride[3] == 1;
    if (pr->dropout) {
        for (int64_t j = 0; j < n; j++) {
            if (s[j] == 0.0f) continue;
            uint32_t w[4];
            attn_philox_block(pr->drop_key, b, h, i, (a + j) >> 2, w);
            s[j] = w[(a + j) & 3] < pr->drop_threshold ? 0.0f : s[j] * pr->keep_scale;
        }
    }
    if (c->v_rows) {
        /* acc = p·V through the micro-kernel (accumulators in registers). A
         * zero weight times a non-finite V entry would give NaN where the
         * reference skips the key: then redo below, skipping zeros. */
        gemm(1, dvp / VL, n, s, 0, 1, row_of(V, b, h, a), V->stride[2], acc, dvp, 0, 1.0f, c->mode);
        vf bad = v_zero();
        for (int64_t d = 0; d < dvp; d += VL) bad = v_fma(v_load(acc + d), v_zero(), bad);
        if (v_hsum(bad) == 0.0f) goto done;
        memset(acc, 0, (size_t)dvp * sizeof(float));
    }
    for (int64_t j = 0; j < n; j++) {
        const float p = s[j];
        if (p == 0.0f) continue; /* zero weight: V row not read (reference semantics) */
        const float *vr = row_of(V, b, h, a + j);
        if (!vcontig) {
            copy_row(tmp, vr, V->stride[3], Dv, dvp);
            vr = tmp;
        }
        const vf pv = v_set1(p);
        int64_t d = 0;
        for (; d + VL <= Dv; d += VL) v_store(acc + d, v_fma(pv, v_load(vr + d), v_load(acc + d)));
        if (d < Dv)
            v_store(acc + d, v_fma(pv, v_load_n(vr + d, (int)(Dv - d)), v_load(acc + d)));
    }
done:
    *pl = v_hsum(sum);
    *pm = *pl == *pl ? M : INFINITY; /* NaN sum (poisoned row): make the merge see it */
    memcpy(pacc, acc, (size_t)dvp * sizeof(float));
}

/* Merge the chunk partials of decode row r (chunk order) into out; keeps
 * the row's lse, max and 1/sum for the weights. ob: dvp floats of scratch. */
static void dec_merge_row(const kctx *c, const attn_fused_call *call, int64_t r, int64_t nch,
                          const float *pm, const float *pl, const float *pacc, float *ob,
                          float *lsv, float *mrow, float *ilrow) {
    const attn_problem *pr = c->pr;
    const int64_t Lq = pr->Lq, H = pr->H, Dv = pr->Dv, dvp = c->dvp;
    const int64_t bh = r / Lq, i = r % Lq, b = bh / H, h = bh % H;
    const float *m = pm + r * nch, *l = pl + r * nch, *acc = pacc + r * nch * dvp;
    float M = -INFINITY;
    for (int64_t ch = 0; ch < nch; ch++) M = m[ch] > M ? m[ch] : M;
    float *o = row_mut(call->out, b, h, i);
    const int64_t so = call->out->stride[3];
    mrow[r] = 0.0f;
    ilrow[r] = 0.0f;
    if (M == -INFINITY) {
        for (int64_t d = 0; d < Dv; d++) o[d * so] = 0.0f;
        lsv[r] = -INFINITY;
        return;
    }
    float L = 0.0f;
    memset(ob, 0, (size_t)dvp * sizeof(float));
    for (int64_t ch = 0; ch < nch; ch++) {
        if (m[ch] == -INFINITY) continue;
        const float f = expf(m[ch] - M); /* NaN when M = +inf: poisoned row */
        L += l[ch] * f;
        if (f == 0.0f) continue;
        const vf fv = v_set1(f);
        for (int64_t d = 0; d < dvp; d += VL)
            v_store(ob + d, v_fma(fv, v_load(acc + ch * dvp + d), v_load(ob + d)));
    }
    const float inv = 1.0f / L;
    for (int64_t d = 0; d < Dv; d++) o[d * so] = ob[d] * inv;
    lsv[r] = M + logf(L);
    mrow[r] = M;
    ilrow[r] = inv;
}

/* Floats of the whole decode forward scratch: per thread tile scratch and
 * (whole-head items) q, tmp and a row of nch·C scores; per row and chunk
 * (max, sum, acc); per row lse, max, 1/sum. */
static int64_t dec_total(const attn_problem *pr, int64_t dkp, int64_t dvp) {
    const int64_t C = dec_chunk(pr->Lk), nch = (pr->Lk + C - 1) / C, rows = pr->B * pr->H * pr->Lq;
    const int64_t rowper = rup(3 * dkp + dvp + nch * C, 16);
    return pr->threads * dec_scratch(pr, dkp, dvp) + rows * nch * (dvp + 2) + 3 * rows + 16 +
           pr->threads * rowper;
}

static attn_status dec_forward(const kctx *c, const attn_fused_call *call, attn_error *err) {
    const attn_problem *pr = c->pr;
    const int64_t B = pr->B, H = pr->H, Lq = pr->Lq, Lk = pr->Lk, dvp = c->dvp;
    const int64_t C = dec_chunk(Lk), nch = (Lk + C - 1) / C, rows = B * H * Lq;
    const int nt = pr->threads;
    const int64_t per = dec_scratch(pr, c->dkp, dvp);
    /* per thread: tile scratch, and for whole-head items q, tmp and a row
     * of nch·C scores */
    const int64_t rowper = rup(3 * c->dkp + dvp + nch * C, 16);
    float *ws = call->ws ? call->ws : falloc(dec_total(pr, c->dkp, dvp));
    if (!ws) return attn_fail(err, ATTN_ERR_NOMEM, "out of memory for the decode scratch");
    float *pm = ws + nt * per, *pl = pm + rows * nch, *pacc = pl + rows * nch,
          *lsv = pacc + rows * nch * dvp, *mrow = lsv + rows, *ilrow = mrow + rows;
    /* The key split is fixed (C keys per chunk, merged in chunk order); only
     * who computes which chunk depends on the shape: with enough heads a
     * work item is a whole head (its chunks in order, then the merge, no
     * barrier in between), else single chunks spread over the threads. */
    const int whole = B * H >= 4 * (int64_t)nt;
    const int64_t items = whole ? B * H : B * H * nch;
#pragma omp parallel num_threads(nt)
    {
        float *w = ws + (int64_t)omp_get_thread_num() * per;
        /* q, tmp, row scores: after ilrow and its 16 floats of slack */
        float *wrow = ilrow + rows + 16 + (int64_t)omp_get_thread_num() * rowper;
#pragma omp for schedule(dynamic, 1)
        for (int64_t it = 0; it < items; it++) {
            const int64_t bh = whole ? it : it / nch, b = bh / H, h = bh % H;
            const int64_t c0 = whole ? 0 : it % nch;
            if (whole) { /* the head's rows: K streamed once for the scores, then V */
                for (int64_t i = 0; i < Lq; i++) {
                    int64_t lo, hi;
                    attn_row_range(pr, b, i, &lo, &hi);
                    float *qr = wrow, *tmp = wrow + c->dkp;
                    if (lo < hi) {
                        copy_row(qr, row_of(c->q, b, h, i), c->q->stride[3], pr->Dk, c->dkp);
                        dec_scores(c, qr, tmp, b, h, i, lo, hi, wrow + 2 * c->dkp + dvp + lo);
                    }
                    for (int64_t ch = 0; ch < nch; ch++) {
                        const int64_t r = (bh * Lq + i) * nch + ch;
                        dec_partial(c, w, b, h, i, ch * C, imin(Lk, (ch + 1) * C),
                                    wrow + 2 * c->dkp + dvp + ch * C, pm + r, pl + r,
                                    pacc + r * dvp);
                    }
                }
            } else {
                for (int64_t i = 0; i < Lq; i++) {
                    const int64_t r = (bh * Lq + i) * nch + c0;
                    dec_partial(c, w, b, h, i, c0 * C, imin(Lk, (c0 + 1) * C), NULL, pm + r,
                                pl + r, pacc + r * dvp);
                }
            }
            if (whole)
                for (int64_t i = 0; i < Lq; i++)
                    dec_merge_row(c, call, bh * Lq + i, nch, pm, pl, pacc, w, lsv, mrow, ilrow);
        }
        if (!whole) {
#pragma omp for schedule(static)
            for (int64_t r = 0; r < rows; r++)
                dec_merge_row(c, call, r, nch, pm, pl, pacc, w, lsv, mrow, ilrow);
        }
    }
    if (call->lse) memcpy(call->lse, lsv, (size_t)rows * sizeof(float));
    if (call->weights) {
#pragma omp parallel for num_threads(nt) schedule(dynamic, 1)
        for (int64_t r = 0; r < rows; r++) {
            float *w = ws + (int64_t)omp_get_thread_num() * per;
            float *qr = carve(&w, c->dkp), *s = carve(&w, C + VL);
            carve(&w, dvp);
            float *tmp = carve(&w, c->dkp + dvp);
            const int64_t bh = r / Lq, i = r % Lq, b = bh / H, h = bh % H;
            float *wr = call->weights + r * Lk;
            int64_t lo, hi;
            attn_row_range(pr, b, i, &lo, &hi);
            for (int64_t j = 0; j < lo; j++) wr[j] = 0.0f;
            for (int64_t j = imax(lo, hi); j < Lk; j++) wr[j] = 0.0f;
            copy_row(qr, row_of(c->q, b, h, i), c->q->stride[3], pr->Dk, c->dkp);
            const vf mv = v_set1(mrow[r]), iv = v_set1(ilrow[r]);
            for (int64_t a = lo; a < hi; a += C) {
                const int64_t e = imin(hi, a + C), n = e - a, np = rup(n, VL);
                dec_scores(c, qr, tmp, b, h, i, a, e, s);
                for (int64_t j = n; j < np; j++) s[j] = -INFINITY;
                for (int64_t j = 0; j < np; j += VL) {
                    const vf x = v_load(s + j);
                    v_store(s + j, v_zero_if_eq(v_mul(v_exp(v_sub(x, mv)), iv), x, kNegInf));
                }
                memcpy(wr + a, s, (size_t)n * sizeof(float));
            }
        }
    }
    if (!call->ws) free(ws);
    return ATTN_OK;
}

/* ------------------------------------------------------------ forward entry */

static void make_ctx(kctx *c, const attn_fused_call *call) {
    const attn_problem *pr = call->pr;
    c->pr = pr;
    c->q = call->q;
    c->k = call->k;
    c->v = call->v;
    c->dkp = rup(pr->Dk, VL);
    c->dvp = rup(pr->Dv, VL);
    c->k_rows = call->k->stride[3] == 1 && pr->Dk % VL == 0;
    c->v_rows = call->v->stride[3] == 1 && pr->Dv % VL == 0;
    c->mode = call->blas ? 2 : 0;
}

attn_status FN(attn_fused_forward_)(const attn_fused_call *call, attn_error *err) {
    kctx c;
    make_ctx(&c, call);
    const attn_problem *pr = call->pr;
    if (pr->Lq <= FUSED_DECODE_MAXLQ) return dec_forward(&c, call, err);
    const int64_t B = pr->B, H = pr->H, Lq = pr->Lq, Lk = pr->Lk;
    const int64_t nqb = (Lq + FQ - 1) / FQ, items = B * H * nqb;
    const int nt = pr->threads;
    const int64_t per = fwd_scratch(pr, c.dvp);
    float *ws = call->ws ? call->ws : falloc(nt * per);
    if (!ws) return attn_fail(err, ATTN_ERR_NOMEM, "out of memory for %d x %lld scratch floats",
                              nt, (long long)per);
#pragma omp parallel for num_threads(nt) schedule(dynamic, 1)
    for (int64_t it = 0; it < items; it++) {
        /* Last blocks of a head first: under a causal mask they are the
         * longest, so the dynamic schedule ends on short ones. */
        const int64_t bh = it / nqb, blk = nqb - 1 - it % nqb, b = bh / H, h = bh % H;
        const int64_t i0 = blk * FQ, nq = imin(FQ, Lq - i0);
        fwd_block(&c, ws + (int64_t)omp_get_thread_num() * per, b, h, i0, nq, call->out,
                  call->lse ? call->lse + bh * Lq + i0 : NULL,
                  call->weights ? call->weights + (bh * Lq + i0) * Lk : NULL);
    }
    if (!call->ws) free(ws);
    return ATTN_OK;
}

int64_t FN(attn_fused_forward_scratch_)(const attn_problem *pr) {
    const int64_t dkp = rup(pr->Dk, VL), dvp = rup(pr->Dv, VL);
    if (pr->Lq <= FUSED_DECODE_MAXLQ) return dec_total(pr, dkp, dvp);
    return pr->threads * fwd_scratch(pr, dvp);
}

/* ------------------------------------------------------------ backward */

typedef struct {
    const attn_tensor *out, *dout;
    const float *lse;
} bctx;

/* A prepared query block: Qᵀ, Q rows, dOᵀ, dO rows, lse and D lanes. */
typedef struct {
    int64_t i0, nq, nqv;
    float *qt, *dot, *lsev, *dvec;
    const float *qr, *dor;
    int64_t ldqr, lddor;
    int finite; /* Q and dO rows hold only finite values */
} qblock;

static int64_t bwd_tile_scratch(const attn_problem *pr, int64_t dkp, int64_t dvp) {
    return rup(pr->Dk * FQ, 16) + rup(FQ * dkp, 16) + 2 * rup(pr->Dv * FQ, 16) + rup(FQ * dvp, 16) +
           2 * rup(FQ, 16) + 3 * rup(FK * FQ, 16) + rup(FK * dkp, 16) + rup(FK * dvp, 16) +
           rup(FQ * dkp, 16) + 64;
}

typedef struct {
    float *qt, *qr, *dot, *ot, *dor, *lsev, *dvec, *S, *dP, *Z, *kt, *vt, *dq;
} bws;

static bws bwd_carve(const attn_problem *pr, float *ws, int64_t dkp, int64_t dvp) {
    bws w;
    w.qt = carve(&ws, pr->Dk * FQ);
    w.qr = carve(&ws, FQ * dkp);
    w.dot = carve(&ws, pr->Dv * FQ);
    w.ot = carve(&ws, pr->Dv * FQ);
    w.dor = carve(&ws, FQ * dvp);
    w.lsev = carve(&ws, FQ);
    w.dvec = carve(&ws, FQ);
    w.S = carve(&ws, FK * FQ);
    w.dP = carve(&ws, FK * FQ);
    w.Z = carve(&ws, FK * FQ);
    w.kt = carve(&ws, FK * dkp);
    w.vt = carve(&ws, FK * dvp);
    w.dq = carve(&ws, FQ * dkp);
    return w;
}

static void prep_qblock(const kctx *c, const bctx *bc, const bws *w, int64_t b, int64_t h,
                        int64_t i0, int64_t nq, qblock *qb) {
    const attn_problem *pr = c->pr;
    const int64_t Dk = pr->Dk, Dv = pr->Dv, dkp = c->dkp, dvp = c->dvp;
    const int64_t nqv = rup(nq, VL);
    qb->i0 = i0;
    qb->nq = nq;
    qb->nqv = nqv;
    qb->qt = w->qt;
    qb->dot = w->dot;
    qb->lsev = w->lsev;
    qb->dvec = w->dvec;
    pack_transposed(w->qt, nqv, c->q, b, h, i0, nq, Dk);
    pack_transposed(w->dot, nqv, bc->dout, b, h, i0, nq, Dv);
    if (c->q->stride[3] == 1 && Dk % VL == 0) {
        qb->qr = row_of(c->q, b, h, i0);
        qb->ldqr = c->q->stride[2];
    } else {
        for (int64_t i = 0; i < nq; i++)
            copy_row(w->qr + i * dkp, row_of(c->q, b, h, i0 + i), c->q->stride[3], Dk, dkp);
        qb->qr = w->qr;
        qb->ldqr = dkp;
    }
    if (bc->dout->stride[3] == 1 && Dv % VL == 0) {
        qb->dor = row_of(bc->dout, b, h, i0);
        qb->lddor = bc->dout->stride[2];
    } else {
        for (int64_t i = 0; i < nq; i++)
            copy_row(w->dor + i * dvp, row_of(bc->dout, b, h, i0 + i), bc->dout->stride[3], Dv,
                     dvp);
        qb->dor = w->dor;
        qb->lddor = dvp;
    }
    const float *lse = bc->lse + (b * pr->H + h) * pr->Lq + i0;
    for (int64_t i = 0; i < nq; i++) qb->lsev[i] = lse[i];
    for (int64_t i = nq; i < nqv; i++) qb->lsev[i] = 0.0f;
    /* D_i = dO_i · O_i as one FMA chain over d, the arithmetic of the dP
     * tile: where O_i equals V_j (a row that sees one key) dP - D is exactly
     * 0, as in the reference. */
    pack_transposed(w->ot, nqv, bc->out, b, h, i0, nq, Dv);
    for (int64_t vq = 0; vq < nqv / VL; vq++) {
        vf tot = v_zero();
        for (int64_t d0 = 0; d0 < Dv; d0 += UKR_KB) {
            vf acc = v_zero();
            for (int64_t d = d0; d < Dv && d < d0 + UKR_KB; d++)
                acc = v_fma(v_load(w->ot + d * nqv + vq * VL), v_load(w->dot + d * nqv + vq * VL),
                            acc);
            tot = d0 == 0 ? acc : v_add(tot, acc);
        }
        v_store(qb->dvec + vq * VL, tot);
    }
    qb->finite = rows_finite(c->q, b, h, i0, nq, Dk) && rows_finite(bc->dout, b, h, i0, nq, Dv);
}

/* One (query block, key tile) of the backward: recompute P, dP, dS and add
 * the tile's share to dV, dK (rows j0.., when non-NULL) and dQ (block rows). */
static void bwd_tile(const kctx *c, const qblock *qb, const bws *w, int64_t b, int64_t h,
                     int64_t j0, int64_t nk, float *dk_acc, float *dv_acc, float *dq_acc) {
    const attn_problem *pr = c->pr;
    const int64_t Dk = pr->Dk, Dv = pr->Dv, dkp = c->dkp, dvp = c->dvp;
    const int64_t nq = qb->nq, nqv = qb->nqv, nvq = nqv / VL;
    const attn_tensor *K = c->k, *V = c->v;
    float *S = w->S, *dP = w->dP, *Z = w->Z;
    const int safe = !(qb->finite && rows_finite(K, b, h, j0, nk, Dk) &&
                       rows_finite(V, b, h, j0, nk, Dv));
    const int mode = safe ? 1 : c->mode;

    gemm_d(nk, nvq, Dk, row_of(K, b, h, j0), K->stride[2], K->stride[3], qb->qt, nqv, S, nqv,
           pr->scale, c->mode);
    mask_tile(pr, S, nqv, b, h, qb->i0, nq, j0, nk);
    gemm_d(nk, nvq, Dv, row_of(V, b, h, j0), V->stride[2], V->stride[3], qb->dot, nqv, dP, nqv, 1.0f,
           c->mode);
    if (pr->dropout) dropout_tile(pr, Z, nqv, b, h, qb->i0, nq, j0, nk, 0);
    const vf sc = v_set1(pr->scale);
    for (int64_t vq = 0; vq < nvq; vq++) {
        const vf lv = v_load(qb->lsev + vq * VL), dv = v_load(qb->dvec + vq * VL);
        for (int64_t j = 0; j < nk; j++) {
            const int64_t o = j * nqv + vq * VL;
            const vf x = v_load(S + o);
            const vf p = v_zero_if_eq(v_exp(v_sub(x, lv)), x, kNegInf);
            vf dp = v_load(dP + o);
            if (pr->dropout) dp = v_mul(dp, v_load(Z + o));
            /* dS = scale · P ∘ (dP - D), exactly 0 where P is 0. */
            v_store(dP + o, v_zero_if_eq(v_mul(v_mul(sc, p), v_sub(dp, dv)), p, 0.0f));
            v_store(S + o, pr->dropout ? v_mul(p, v_load(Z + o)) : p);
        }
    }
    if (dv_acc) gemm(nk, dvp / VL, nq, S, nqv, 1, qb->dor, qb->lddor, dv_acc, dvp, 1, 1.0f, mode);
    if (dk_acc) gemm(nk, dkp / VL, nq, dP, nqv, 1, qb->qr, qb->ldqr, dk_acc, dkp, 1, 1.0f, mode);
    if (dq_acc) {
        int64_t ldk;
        const float *kb = key_rows(K, c->k_rows, b, h, j0, nk, Dk, dkp, w->kt, &ldk);
        gemm(nq, dkp / VL, nk, dP, 1, nqv, kb, ldk, dq_acc, dkp, 1, 1.0f, mode);
    }
}

static void write_rows(const attn_tensor *t, int64_t b, int64_t h, int64_t l0, int64_t n,
                       int64_t D, const float *src, int64_t ld) {
    const int64_t sd = t->stride[3];
    for (int64_t i = 0; i < n; i++) {
        float *r = row_mut(t, b, h, l0 + i);
        const float *s = src + i * ld;
        if (sd == 1)
            memcpy(r, s, (size_t)D * sizeof(float));
        else
            for (int64_t d = 0; d < D; d++) r[d * sd] = s[d];
    }
}

/* ------------------------------------------------------------ decode backward */

/* a · b over n contiguous floats as VL lane sums then a fixed reduction: the
 * decode backward's dot for both D = dO·O and dP = dO·V, so that a row that
 * sees a single key (O = V) gets dP - D = 0 exactly. */
static inline float dec_vdot(const float *a, const float *b, int64_t n) {
    vf acc = v_zero();
    int64_t d = 0;
    for (; d + VL <= n; d += VL) acc = v_fma(v_load(a + d), v_load(b + d), acc);
    if (d < n) acc = v_fma(v_load_n(a + d, (int)(n - d)), v_load_n(b + d, (int)(n - d)), acc);
    return v_hsum(acc);
}

#define DEC_KB 64 /* keys scored at once in the decode backward */

static int64_t dec_bwd_scratch(const attn_problem *pr, int64_t dkp, int64_t dvp) {
    const int64_t Lq = pr->Lq;
    return Lq * rup(dkp, 16) + 2 * Lq * rup(dvp, 16) + Lq * rup(DEC_KB + VL, 16) + 2 * rup(Lq, 16) +
           rup(dkp, 16) + rup(dvp, 16) + rup(dkp, 16) + rup(dvp, 16) + 64;
}

/* Backward for Lq <= FUSED_DECODE_MAXLQ: one work item per (b, h, key
 * chunk) writes that chunk's dK, dV rows and a partial dQ; the partials are
 * summed in chunk order afterwards (deterministic for any thread count). */
static attn_status dec_backward(const kctx *c, const attn_fused_call *call, attn_error *err) {
    const attn_problem *pr = c->pr;
    const int64_t B = pr->B, H = pr->H, Lq = pr->Lq, Lk = pr->Lk, Dk = pr->Dk, Dv = pr->Dv;
    const int64_t dkp = c->dkp, dvp = c->dvp;
    const int64_t C = dec_chunk(Lk), nch = (Lk + C - 1) / C, rows = B * H * Lq;
    const int nt = pr->threads;
    const int64_t per = dec_bwd_scratch(pr, dkp, dvp);
    float *ws = falloc(nt * per + rows * nch * dkp);
    if (!ws) return attn_fail(err, ATTN_ERR_NOMEM, "out of memory for the decode backward scratch");
    float *pdq = ws + nt * per; /* [rows][nch][dkp] partial dQ */
    const attn_tensor *K = c->k, *V = c->v;
    const int64_t items = B * H * nch;
    int64_t grain = items / (8 * (int64_t)nt); /* scheduling only: results unaffected */
    grain = grain < 1 ? 1 : grain > nch ? nch : grain;
#pragma omp parallel num_threads(nt)
    {
#pragma omp for schedule(dynamic, grain)
        for (int64_t it = 0; it < items; it++) {
            float *w = ws + (int64_t)omp_get_thread_num() * per;
            float *qr = carve(&w, Lq * rup(dkp, 16)), *gr = carve(&w, Lq * rup(dvp, 16));
            float *orow = carve(&w, Lq * rup(dvp, 16)), *sc = carve(&w, Lq * rup(DEC_KB + VL, 16));
            float *dv_i = carve(&w, Lq), *ls = carve(&w, Lq);
            float *gk = carve(&w, dkp), *gv = carve(&w, dvp), *kt = carve(&w, dkp), *vt = carve(&w, dvp);
            const int64_t ldq = rup(dkp, 16), ldg = rup(dvp, 16), lds = rup(DEC_KB + VL, 16);
            const int64_t bh = it / nch, ch = it % nch, b = bh / H, h = bh % H;
            const int64_t c0 = ch * C, c1 = imin(Lk, c0 + C);
            for (int64_t i = 0; i < Lq; i++) {
                copy_row(qr + i * ldq, row_of(c->q, b, h, i), c->q->stride[3], Dk, dkp);
                copy_row(gr + i * ldg, row_of(call->dout, b, h, i), call->dout->stride[3], Dv, dvp);
                copy_row(orow + i * ldg, row_of(call->out, b, h, i), call->out->stride[3], Dv, dvp);
                dv_i[i] = dec_vdot(gr + i * ldg, orow + i * ldg, Dv);
                ls[i] = call->lse_in[bh * Lq + i];
                memset(pdq + ((bh * Lq + i) * nch + ch) * dkp, 0, (size_t)dkp * sizeof(float));
            }
            for (int64_t a = c0; a < c1; a += DEC_KB) {
                const int64_t e = imin(c1, a + DEC_KB), n = e - a, np = rup(n, VL);
                /* P for the block of keys, row by row (0 where not visible) */
                for (int64_t i = 0; i < Lq; i++) {
                    float *s = sc + i * lds;
                    int64_t lo, hi;
                    attn_row_range(pr, b, i, &lo, &hi);
                    for (int64_t j = 0; j < np; j++) s[j] = -INFINITY;
                    const int64_t a2 = imax(a, lo), e2 = imin(e, hi);
                    if (a2 < e2 && ls[i] != -INFINITY) dec_scores(c, qr + i * ldq, kt, b, h, i, a2, e2, s + (a2 - a));
                    const vf lv = v_set1(ls[i]);
                    for (int64_t j = 0; j < np; j += VL) {
                        const vf x = v_load(s + j);
                        v_store(s + j, v_zero_if_eq(v_exp(v_sub(x, lv)), x, kNegInf));
                    }
                }
                for (int64_t j = a; j < e; j++) {
                    const float *kr = row_of(K, b, h, j), *vr = row_of(V, b, h, j);
                    if (K->stride[3] != 1) {
                        copy_row(kt, kr, K->stride[3], Dk, dkp);
                        kr = kt;
                    }
                    if (V->stride[3] != 1) {
                        copy_row(vt, vr, V->stride[3], Dv, dvp);
                        vr = vt;
                    }
                    memset(gk, 0, (size_t)dkp * sizeof(float));
                    memset(gv, 0, (size_t)dvp * sizeof(float));
                    for (int64_t i = 0; i < Lq; i++) {
                        const float p = sc[i * lds + (j - a)];
                        if (p == 0.0f) continue; /* not visible (or underflow): no term */
                        float z = 1.0f;
                        if (pr->dropout) {
                            uint32_t wd[4];
                            attn_philox_block(pr->drop_key, b, h, i, j >> 2, wd);
                            z = wd[j & 3] < pr->drop_threshold ? 0.0f : pr->keep_scale;
                        }
                        const float dp = z * dec_vdot(gr + i * ldg, vr, Dv);
                        const float ds = pr->scale * p * (dp - dv_i[i]);
                        const float pz = p * z;
                        if (pz != 0.0f) {
                            const vf pv = v_set1(pz);
                            for (int64_t d = 0; d < dvp; d += VL)
                                v_store(gv + d, v_fma(pv, v_load(gr + i * ldg + d), v_load(gv + d)));
                        }
                        const vf dsv = v_set1(ds);
                        float *dq = pdq + ((bh * Lq + i) * nch + ch) * dkp;
                        int64_t d = 0;
                        for (; d + VL <= Dk; d += VL) {
                            v_store(gk + d, v_fma(dsv, v_load(qr + i * ldq + d), v_load(gk + d)));
                            v_store(dq + d, v_fma(dsv, v_load(kr + d), v_load(dq + d)));
                        }
                        if (d < Dk) {
                            v_store(gk + d, v_fma(dsv, v_load(qr + i * ldq + d), v_load(gk + d)));
                            v_store(dq + d, v_fma(dsv, v_load_n(kr + d, (int)(Dk - d)), v_load(dq + d)));
                        }
                    }
                    write_rows(call->dk, b, h, j, 1, Dk, gk, dkp);
                    write_rows(call->dv, b, h, j, 1, Dv, gv, dvp);
                }
            }
        }
        /* dQ: the chunks' partials in chunk order */
#pragma omp for schedule(static)
        for (int64_t r = 0; r < rows; r++) {
            const int64_t bh = r / Lq, i = r % Lq, b = bh / H, h = bh % H;
            float *acc = pdq + r * nch * dkp; /* chunk 0's partial accumulates the rest */
            for (int64_t ch = 1; ch < nch; ch++)
                for (int64_t d = 0; d < dkp; d += VL)
                    v_store(acc + d, v_add(v_load(acc + d), v_load(acc + ch * dkp + d)));
            write_rows(call->dq, b, h, i, 1, Dk, acc, dkp);
        }
    }
    free(ws);
    return ATTN_OK;
}

attn_status FN(attn_fused_backward_)(const attn_fused_call *call, attn_error *err) {
    kctx c;
    make_ctx(&c, call);
    const attn_problem *pr = call->pr;
    if (pr->Lq <= FUSED_DECODE_MAXLQ) return dec_backward(&c, call, err);
    bctx bc = {call->out, call->dout, call->lse_in};
    const int64_t B = pr->B, H = pr->H, Lq = pr->Lq, Lk = pr->Lk, Dk = pr->Dk, Dv = pr->Dv;
    const int64_t dkp = c.dkp, dvp = c.dvp, nqb = (Lq + FQ - 1) / FQ;
    const int nt = pr->threads;
    const int one = attn_fused_bwd_one_pass(pr);
    const int64_t tile = bwd_tile_scratch(pr, dkp, dvp);
    const int64_t accn = one ? Lk : KGROUP * FK; /* dK/dV accumulator rows */
    const int64_t per = tile + rup(accn * dkp, 16) + rup(accn * dvp, 16);
    float *ws = falloc(nt * per);
    if (!ws) return attn_fail(err, ATTN_ERR_NOMEM, "out of memory for %d x %lld scratch floats",
                              nt, (long long)per);
    if (one) {
#pragma omp parallel for num_threads(nt) schedule(dynamic, 1)
        for (int64_t bh = 0; bh < B * H; bh++) {
            float *base = ws + (int64_t)omp_get_thread_num() * per;
            const bws w = bwd_carve(pr, base, dkp, dvp);
            float *dka = base + tile, *dva = dka + rup(accn * dkp, 16);
            const int64_t b = bh / H, h = bh % H;
            memset(dka, 0, (size_t)(Lk * dkp) * sizeof(float));
            memset(dva, 0, (size_t)(Lk * dvp) * sizeof(float));
            for (int64_t blk = 0; blk < nqb; blk++) {
                const int64_t i0 = blk * FQ, nq = imin(FQ, Lq - i0);
                qblock qb;
                prep_qblock(&c, &bc, &w, b, h, i0, nq, &qb);
                memset(w.dq, 0, (size_t)(nq * dkp) * sizeof(float));
                int64_t hlo, hhi, t0, t1;
                block_tiles(pr, b, i0, nq, &hlo, &hhi, &t0, &t1);
                for (int64_t t = t0; t < t1; t++) {
                    const int64_t j0 = imax(t * FK, hlo), j1 = imin((t + 1) * FK, hhi);
                    bwd_tile(&c, &qb, &w, b, h, j0, j1 - j0, dka + j0 * dkp, dva + j0 * dvp,
                             w.dq);
                }
                write_rows(call->dq, b, h, i0, nq, Dk, w.dq, dkp);
            }
            write_rows(call->dk, b, h, 0, Lk, Dk, dka, dkp);
            write_rows(call->dv, b, h, 0, Lk, Dv, dva, dvp);
        }
    } else {
        const int64_t ntile = (Lk + FK - 1) / FK, ngrp = (ntile + KGROUP - 1) / KGROUP;
        /* Pass 1: dK, dV by (head, group of key tiles). */
#pragma omp parallel for num_threads(nt) schedule(dynamic, 1)
        for (int64_t it = 0; it < B * H * ngrp; it++) {
            float *base = ws + (int64_t)omp_get_thread_num() * per;
            const bws w = bwd_carve(pr, base, dkp, dvp);
            float *dka = base + tile, *dva = dka + rup(accn * dkp, 16);
            const int64_t bh = it / ngrp, g = it % ngrp, b = bh / H, h = bh % H;
            const int64_t g0 = g * KGROUP * FK, g1 = imin(Lk, g0 + KGROUP * FK);
            const int64_t gt0 = g * KGROUP, gt1 = imin(ntile, gt0 + KGROUP);
            memset(dka, 0, (size_t)((g1 - g0) * dkp) * sizeof(float));
            memset(dva, 0, (size_t)((g1 - g0) * dvp) * sizeof(float));
            for (int64_t blk = 0; blk < nqb; blk++) {
                const int64_t i0 = blk * FQ, nq = imin(FQ, Lq - i0);
                int64_t hlo, hhi, t0, t1;
                block_tiles(pr, b, i0, nq, &hlo, &hhi, &t0, &t1);
                const int64_t u0 = imax(t0, gt0), u1 = imin(t1, gt1);
                if (u0 >= u1) continue;
                qblock qb;
                prep_qblock(&c, &bc, &w, b, h, i0, nq, &qb);
                for (int64_t t = u0; t < u1; t++) {
                    const int64_t j0 = imax(t * FK, hlo), j1 = imin((t + 1) * FK, hhi);
                    bwd_tile(&c, &qb, &w, b, h, j0, j1 - j0, dka + (j0 - g0) * dkp,
                             dva + (j0 - g0) * dvp, NULL);
                }
            }
            write_rows(call->dk, b, h, g0, g1 - g0, Dk, dka, dkp);
            write_rows(call->dv, b, h, g0, g1 - g0, Dv, dva, dvp);
        }
        /* Pass 2: dQ by (head, query block). */
#pragma omp parallel for num_threads(nt) schedule(dynamic, 1)
        for (int64_t it = 0; it < B * H * nqb; it++) {
            float *base = ws + (int64_t)omp_get_thread_num() * per;
            const bws w = bwd_carve(pr, base, dkp, dvp);
            const int64_t bh = it / nqb, blk = nqb - 1 - it % nqb, b = bh / H, h = bh % H;
            const int64_t i0 = blk * FQ, nq = imin(FQ, Lq - i0);
            qblock qb;
            prep_qblock(&c, &bc, &w, b, h, i0, nq, &qb);
            memset(w.dq, 0, (size_t)(nq * dkp) * sizeof(float));
            int64_t hlo, hhi, t0, t1;
            block_tiles(pr, b, i0, nq, &hlo, &hhi, &t0, &t1);
            for (int64_t t = t0; t < t1; t++) {
                const int64_t j0 = imax(t * FK, hlo), j1 = imin((t + 1) * FK, hhi);
                bwd_tile(&c, &qb, &w, b, h, j0, j1 - j0, NULL, NULL, w.dq);
            }
            write_rows(call->dq, b, h, i0, nq, Dk, w.dq, dkp);
        }
    }
    free(ws);
    return ATTN_OK;
}

