/* The bf16 fused kernels' tile sizes, integer helpers and a score row's
 * scaling and masking, shared by the forward (sdpa_fused_bf16.h) and the
 * backward (sdpa_fused_bf16_bwd.h), so that neither header uses what the
 * other defines. */
#ifndef ATTN_SDPA_FUSED_BF16_TILES_H
#define ATTN_SDPA_FUSED_BF16_TILES_H

#include <math.h>
#include <stdint.h>

#include "internal.h"

#define BQ 64 /* query rows per block */
#define BK 96 /* keys per tile (6 vectors of 16) */

/* The forward folds the scale into exp (one pass over a row of S fewer:
 * max of the raw scores, then exp(s·scale - m) by one FMA) when that gives
 * the same softmax: a positive scale (the max commutes with it) and no
 * additive mask (added to the scaled scores). */
static inline int bf16_fold_scale(const attn_problem *pr) {
    return !pr->amask && pr->scale > 0.0f && !attn_has_score_variants(pr);
}

/* An instruction set with tile state (AMX) defines BF16_TILES and
 * bf16_tiles_enter / bf16_tiles_leave, called by each thread of a parallel
 * region that multiplies (forward and backward) with an amx_tile_config of
 * its own (common/amx_tiles.h: the thread's previous configuration); the
 * others have nothing to set up. */
#include "amx_tiles.h"
#if !defined(BF16_TILES)
static inline void bf16_tiles_enter(amx_tile_config *saved) { (void)saved; }
static inline void bf16_tiles_leave(const amx_tile_config *saved) { (void)saved; }
#endif

static inline int64_t bmin(int64_t a, int64_t b) { return a < b ? a : b; }
static inline int64_t bmax(int64_t a, int64_t b) { return a > b ? a : b; }

/* Keys [0, end) of batch b hold data; past a key length is padding, which
 * the packed tiles hold as zeros: a masked key's weight is exactly 0 in
 * P·V and dS·K, and 0 times padding garbage (NaN, inf) would not be. */
static inline int64_t bf16_key_end(const attn_problem *pr, int64_t b) {
    return pr->key_lengths ? bmax(0, bmin(pr->Lk, pr->key_lengths[b])) : pr->Lk;
}

/* Nonzero when no score of a block's tile needs -inf: every key of
 * [j0, j0 + nk) is visible to every row (the rows' ranges [lo, hi) do not
 * decrease: l1 is the last row's lo, h0 the first row's hi) and nk is a
 * whole number of 16-key vectors (no columns past nk computed). A tile of
 * fewer than BK keys (a sequence shorter than a tile) can be interior. */
static inline int bf16_interior(int64_t j0, int64_t nk, int64_t l1, int64_t h0) {
    return nk % 16 == 0 && l1 <= j0 && h0 >= j0 + nk;
}

/* Two bf16 rows as pairs along the row index: o[d] = r0[d] | r1[d] << 16
 * for d < n (r1 NULL: 0 in the high halves; r0 NULL: the whole row 0),
 * 0 for d in [n, ld). The forward's V pairs along keys and the backward's
 * Q and dO pairs along queries. */
static inline void pair_two_rows(const uint16_t *r0, const uint16_t *r1, int64_t n, int64_t ld,
                                 uint32_t *o) {
    int64_t d = 0;
    if (r0 && r1)
        for (; d < n; d++) o[d] = (uint32_t)r0[d] | (uint32_t)r1[d] << 16;
    else if (r0)
        for (; d < n; d++) o[d] = r0[d];
    for (; d < ld; d++) o[d] = 0;
}

/* Row i's scores s[0, W) for keys [j0, j0 + nk) (W: nk rounded up to 16)
 * of query head h: times scale (unless scaled is 0: the caller folds the
 * scale into exp; never with soft-capping or ALiBi), soft-capped and
 * ALiBi-biased (softcap_row, the ISA's; dcap, when non-NULL, gets 1 - tanh²,
 * 1 past nk and without a cap), -inf outside the row's structural range (unless interior),
 * then the masks. The forward's and the backward's rows of S. */
static inline void scale_mask_row(const attn_problem *pr, float *s, int64_t b, int64_t h,
                                  int64_t i, int64_t j0, int64_t nk, int64_t W, int interior,
                                  int scaled, float *dcap) {
    const float scale = pr->scale;
    if (scaled)
        for (int64_t j = 0; j < W; j++) s[j] *= scale;
    if (pr->softcap > 0.0f) {
        softcap_row(s, nk, pr->softcap, dcap);
        if (dcap)
            for (int64_t j = nk; j < W; j++) dcap[j] = 1.0f;
    } else if (dcap) {
        for (int64_t j = 0; j < W; j++) dcap[j] = 1.0f;
    }
    if (pr->alibi) { /* |i′ - j| as floats (exact below 2^24 positions): a vector loop */
        const float m = pr->alibi[h], d0 = (float)(i + pr->Lk - pr->Lq - j0);
        for (int32_t j = 0; j < (int32_t)nk; j++) s[j] -= m * fabsf(d0 - (float)j);
    }
    if (!interior) {
        int64_t lo, hi;
        attn_row_range(pr, b, i, &lo, &hi);
        const int64_t a = bmin(W, bmax(0, lo - j0)), e = bmax(a, bmin(nk, hi - j0));
        for (int64_t j = 0; j < a; j++) s[j] = -INFINITY;
        for (int64_t j = e; j < W; j++) s[j] = -INFINITY;
    }
    if (pr->amask || pr->bmask) {
        const float *am =
            pr->amask ? pr->amask + b * pr->ams[0] + h * pr->ams[1] + i * pr->ams[2] : NULL;
        const uint8_t *bm =
            pr->bmask ? pr->bmask + b * pr->bms[0] + h * pr->bms[1] + i * pr->bms[2] : NULL;
        for (int64_t j = 0; j < nk; j++) {
            if (bm && !bm[(j0 + j) * pr->bms[3]])
                s[j] = -INFINITY;
            else if (am)
                s[j] += am[(j0 + j) * pr->ams[3]];
        }
    }
}

#endif /* ATTN_SDPA_FUSED_BF16_TILES_H */
