/* The fused kernels' shared helpers (part of sdpa_fused_template.h; the
 * first thing it includes): the tile sizes, integer and scratch helpers,
 * the kernel context (kctx) and the per-tile work every phase shares
 * (masks, dropout, packing, finiteness checks, row writes).
 * Uses only the vector vocabulary of the including sdpa_fused_<isa>.c
 * (vf, VL, v_*) and internal.h. */
#ifndef ATTN_SDPA_FUSED_HELPERS_H
#define ATTN_SDPA_FUSED_HELPERS_H

#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

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

typedef struct {
    const attn_problem *pr;
    const attn_tensor *q, *k, *v;
    int64_t dkp, dvp;   /* head sizes rounded up to VL */
    int k_rows, v_rows; /* K / V rows usable in place as a B operand */
    int mode;           /* tile products of finite tiles: TILE_OWN or TILE_BLAS */
} kctx;

static inline const float *row_of(const attn_tensor *t, int64_t b, int64_t h, int64_t l) {
    return t->data + b * t->stride[0] + h * t->stride[1] + l * t->stride[2];
}
static inline float *row_mut(const attn_tensor *t, int64_t b, int64_t h, int64_t l) {
    return t->data + b * t->stride[0] + h * t->stride[1] + l * t->stride[2];
}

/* The K/V head that query head h reads (grouped-query attention: query
 * heads h·G .. h·G + G - 1 share K/V head h, G = pr->group). Masks, dropout,
 * ALiBi slopes and sinks are indexed by the query head, K/V rows and dK/dV
 * by this one. */
#define KVH(pr, h) ((h) / (pr)->group)

/* Soft-capping and ALiBi (attn.h's order: after the scale, before the
 * masks) on a tile Sᵀ[nk][ld] of query rows [i0, i0 + nq) of query head h
 * (lanes [0, rup(nq, VL)); ld, a multiple of VL, may hold other heads'
 * lanes after them), keys [j0, j0 + nk). dcap (optional, [nk][ld]) gets
 * 1 - tanh² per element (1 in the padding lanes), the factor the backward
 * multiplies dS by. Vectors over the query rows: s·(1/c) through v_tanh
 * (the ISA's vector tanh, a few ulp from tanhf), times c; the ALiBi
 * distance |i′ - j| as a float per lane (exact below 2^24 positions),
 * times the slope, subtracted (no FMA: the reference's two roundings).
 * Forward and backward call this same function, so the backward's P
 * matches the forward's lse. */
static const float kLaneIdx[16] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
static void variants_tile(const attn_problem *pr, float *S, int64_t ld, int64_t h, int64_t i0,
                          int64_t nq, int64_t j0, int64_t nk, float *dcap) {
    const int cap = pr->softcap > 0.0f;
    const vf c = v_set1(pr->softcap), ic = v_set1(cap ? 1.0f / pr->softcap : 0.0f);
    const vf one = v_set1(1.0f), iota = v_load(kLaneIdx), zero = v_zero();
    const vf slope = v_set1(pr->alibi ? pr->alibi[h] : 0.0f);
    const int64_t nl = rup(nq, VL);
    for (int64_t j = 0; j < nk; j++) {
        float *s = S + j * ld, *dc = dcap ? dcap + j * ld : NULL;
        const float d0 = (float)(i0 + pr->Lk - pr->Lq - (j0 + j)); /* lane 0's i′ - j */
        for (int64_t i = 0; i < nl; i += VL) {
            vf x = v_load(s + i);
            if (cap) {
                const vf t = v_tanh(v_mul(x, ic));
                x = v_mul(c, t);
                if (dc) v_store(dc + i, v_sub(one, v_mul(t, t)));
            } else if (dc) {
                v_store(dc + i, one);
            }
            if (pr->alibi) {
                const vf dist = v_add(v_set1(d0 + (float)i), iota);
                x = v_sub(x, v_mul(slope, v_max(v_sub(zero, dist), dist)));
            }
            v_store(s + i, x);
        }
        if (dc)
            for (int64_t i = nq; i < nl; i++) dc[i] = 1.0f;
    }
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
 * interior, and -inf in the padding lanes [nq, rup(nq, VL)) (ld may hold
 * other heads' lanes after them). */
static void mask_tile(const attn_problem *pr, float *S, int64_t ld, int64_t b, int64_t h,
                      int64_t i0, int64_t nq, int64_t j0, int64_t nk) {
    const int64_t j1 = j0 + nk;
    if (pr->amask || pr->bmask) {
        for (int64_t i = 0; i < nq; i++) {
            const int64_t ig = i0 + i;
            const float *am =
                pr->amask ? pr->amask + b * pr->ams[0] + h * pr->ams[1] + ig * pr->ams[2] : NULL;
            const uint8_t *bm =
                pr->bmask ? pr->bmask + b * pr->bms[0] + h * pr->bms[1] + ig * pr->bms[2] : NULL;
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
    for (int64_t j = 0; j < nk; j++)
        for (int64_t i = nq; i < rup(nq, VL); i++) S[j * ld + i] = -INFINITY;
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
            attn_philox_block(pr->drop_key, b + pr->drop_b0, h, i0 + i, c, w);
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
 * lanes [n, rup(n, VL)) zero (ld may hold other heads' lanes after them).
 * When the rows are contiguous and evenly spaced (any row stride: B, H, L
 * strides are fixed), VL x VL blocks go through registers, the last rows'
 * (fewer than VL: a molecule's 54 rows end in 6) through a zero-padded
 * VL x VL copy, which also writes the padding lanes (element by element
 * they were most of the packing's time in a training step, perf). */
static void pack_transposed(float *dst, int64_t ld, const attn_tensor *t, int64_t b, int64_t h,
                            int64_t l0, int64_t n, int64_t D) {
    const int64_t sd = t->stride[3], sl = t->stride[2];
    int64_t nr = 0, db = 0; /* rows / columns done through blocks */
    if (sd == 1) {
        const int64_t nb = n / VL * VL;
        db = D / VL * VL;
        const float *base = row_of(t, b, h, l0);
        for (int64_t i = 0; i < nb; i += VL)
            for (int64_t d = 0; d < db; d += VL)
                v_transpose_block(base + i * sl + d, sl, dst + d * ld + i, ld);
        if (nb < n) {
            _Alignas(64) float stage[VL * VL];
            memset(stage, 0, sizeof stage);
            for (int64_t d = 0; d < db; d += VL) {
                for (int64_t i = nb; i < n; i++)
                    memcpy(stage + (i - nb) * VL, base + i * sl + d, VL * sizeof(float));
                v_transpose_block(stage, VL, dst + d * ld + nb, ld);
            }
        }
        nr = n;
    }
    for (int64_t i = 0; i < n; i++) {
        const float *r = row_of(t, b, h, l0 + i);
        for (int64_t d = i < nr ? db : 0; d < D; d++) dst[d * ld + i] = r[d * sd];
    }
    for (int64_t d = nr ? db : 0; d < D; d++)
        for (int64_t i = n; i < rup(n, VL); i++) dst[d * ld + i] = 0.0f;
}

/* B operand of key rows [j0, j0 + nk) of K or V: in place when the rows are
 * contiguous and D is a multiple of VL, else packed into buf. */
static const float *key_rows(const attn_tensor *t, int in_place, int64_t b, int64_t h, int64_t j0,
                             int64_t nk, int64_t D, int64_t Dp, float *buf, int64_t *ld) {
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
    vf acc[4] = {z, z, z, z}; /* four chains: a whole head's rows at once is long */
    float sacc = 0.0f;
    for (int64_t i = 0; i < n; i++) {
        const float *r = row_of(t, b, h, l0 + i);
        vf *a = acc + 2 * (i & 1);
        if (sd == 1) {
            int64_t d = 0;
            for (; d + 2 * VL <= D; d += 2 * VL) {
                a[0] = v_add(a[0], v_mul(v_load(r + d), z));
                a[1] = v_add(a[1], v_mul(v_load(r + d + VL), z));
            }
            for (; d + VL <= D; d += VL) a[0] = v_add(a[0], v_mul(v_load(r + d), z));
            if (d < D) a[1] = v_add(a[1], v_mul(v_load_n(r + d, (int)(D - d)), z));
        } else {
            for (int64_t d = 0; d < D; d++) sacc += r[d * sd] * 0.0f;
        }
    }
    return v_hsum(v_add(v_add(acc[0], acc[1]), v_add(acc[2], acc[3]))) + sacc == 0.0f;
}

static const float kNegInf = -INFINITY;

static void write_rows(const attn_tensor *t, int64_t b, int64_t h, int64_t l0, int64_t n, int64_t D,
                       const float *src, int64_t ld) {
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

#endif
