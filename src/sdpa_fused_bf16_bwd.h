/* The bf16 fused backward (part of sdpa_fused_bf16.h): FlashAttention-2
 * recomputation as in sdpa_fused_bwd.h, with the products in bf16 pairs
 * (VDPBF16PS, or fp32 FMA on converted values) and fp32 accumulation, as
 * PyTorch 2.x's CPU flash backward computes bf16:
 *   S = Q·Kᵀ, dP = dO·Vᵀ (fp32), P = exp(scale·S - lse), dS = P ∘ (dP - D)
 *   with D_i = dO_i·O_i (fp32); P and dS rounded to bf16, then
 *   dV += Pᵀ·dO, dK += dSᵀ·Q, dQ += dS·K (fp32), dQ and dK times scale.
 * An fp32 grad_out (out_dtype ATTN_F32) is rounded to bf16 for the products
 * (and D), as PyTorch holds it in the output's bf16.
 *
 * Layouts (u32 = a pair of bf16, low half the first), per key tile of BK:
 *   kd [np][BK]   K pairs along d (the S product's B)
 *   kk [BK/2][dkp] K pairs along keys (dQ's B)
 *   vd [nvp][BK]  V pairs along d (dP's B)
 * per query block of BQ rows:
 *   qd [BQ][np], od [BQ][nvp]   Q and dO rows as pairs (S and dP's A)
 *   qq [BQ/2][dkp], oq [BQ/2][dvp] Q and dO pairs along queries (dK, dV's B)
 *   pt, dst [BQ/2][BK]  P and dS pairs along queries (dV, dK's A)
 *   dsd [BQ][BK/2]      dS pairs along keys (dQ's A)
 * One pass per (b, h) (K/V packed per head in the thread's scratch; with
 * one query block, one key tile at a time: bw_head_one_block) or two
 * (K/V packed for all heads first; dK/dV by (head, key group), then dQ by
 * (head, query block)), as attn_fused_bwd_one_pass picks; the sums run in
 * the same order either way, so results do not depend on the threads. */
#ifndef ATTN_SDPA_FUSED_BF16_BWD_H
#define ATTN_SDPA_FUSED_BF16_BWD_H

#include "sdpa_fused_bf16_tiles.h"

#define BKG 4 /* key tiles per work item of the two-pass dK/dV */

typedef struct {
    int64_t np, nvp, dkp, dvp, ntile, nqb;
    int64_t tkd, tkk, tvd, tile; /* u32 words of one tile's kd, kk, vd and all three */
    int direct; /* decoding (Lq <= BMR, d contiguous in K and V): nothing packed */
} bgeo;

typedef struct {
    uint32_t *qd, *od, *qq, *oq, *pt, *dst, *dsd, *kv;
    float *lse, *dvec, *S, *dP, *z, *dcap, *dqa, *dka, *dva; /* dcap [BK]: a row's 1 - tanh² */
    float *pdp, *psum; /* [BQ] per row: Σ P∘(dP - D) and Σ P over the tiles (sink_rows) */
    uint16_t *tmp; /* one row */
} bwscr;

/* Row l of (b, h) of t as n bf16 values (fp32 rounded), tmp[n] = 0. */
static void row_bf16(const attn_tensor *t, int bf16, int64_t b, int64_t h, int64_t l, int64_t n,
                     uint16_t *tmp) {
    const int64_t sd = t->stride[3];
    if (bf16) {
        const uint16_t *s = attn_bf16_row(t, b, h, l);
        if (sd == 1)
            memcpy(tmp, s, (size_t)n * sizeof *tmp);
        else
            for (int64_t d = 0; d < n; d++) tmp[d] = s[d * sd];
    } else {
        const float *s = t->data + b * t->stride[0] + h * t->stride[1] + l * t->stride[2];
        if (sd == 1)
            for (int64_t d = 0; d < n; d++) tmp[d] = attn_bf16_round(s[d]);
        else
            for (int64_t d = 0; d < n; d++) tmp[d] = attn_bf16_round(s[d * sd]);
    }
    tmp[n] = 0;
}

static inline uint32_t pair16(const uint16_t *x, int64_t e) {
    return (uint32_t)x[e] | (uint32_t)x[e + 1] << 16;
}

/* Row l of (b, h) of bf16 t with n values padded to whole pairs: the row
 * itself when d is contiguous and n even, else row_bf16's copy in tmp. */
static const uint16_t *row_pairs(const attn_tensor *t, int64_t b, int64_t h, int64_t l, int64_t n,
                                 uint16_t *tmp) {
    if (t->stride[3] == 1 && n % 2 == 0) return attn_bf16_row(t, b, h, l);
    row_bf16(t, 1, b, h, l, n, tmp);
    return tmp;
}

/* Key tile t of (b, h) into kd, kk, vd (zero-padded, zeros past the
 * batch's key length), keys two at a time: kk's row of a key pair is
 * pair_two_rows of their K rows. tmp holds two rows (2 (max(Dk, Dv) + 2)
 * values). */
static void bw_pack_tile(const attn_fused_call *c, const bgeo *g, int64_t b, int64_t h, int64_t t,
                         uint32_t *kd, uint16_t *tmp) {
    const attn_problem *pr = c->pr;
    uint32_t *kk = kd + g->tkd, *vd = kk + g->tkk;
    const int64_t j0 = t * BK, nk = bmax(0, bmin(BK, bf16_key_end(pr, b) - j0));
    if (c->k->stride[3] == 1 && c->v->stride[3] == 1 && pr->Dk % 2 == 0 && pr->Dv % 2 == 0) {
        const uint16_t *kr[BK], *vr[BK]; /* the rows are their pairs: transposes */
        for (int64_t j = 0; j < BK; j++) {
            kr[j] = j < nk ? attn_bf16_row(c->k, b, h, j0 + j) : NULL;
            vr[j] = j < nk ? attn_bf16_row(c->v, b, h, j0 + j) : NULL;
        }
        transpose_words(kr, BK, g->np, kd, BK);
        transpose_words(vr, BK, g->nvp, vd, BK);
        for (int64_t j = 0; j < BK; j += 2)
            pair_two_rows(kr[j], kr[j + 1], pr->Dk, g->dkp, kk + (j / 2) * g->dkp);
        return;
    }
    uint16_t *t0 = tmp, *t1 = tmp + bmax(pr->Dk, pr->Dv) + 2;
    for (int64_t j = 0; j < BK; j += 2) {
        const uint16_t *k0 = j < nk ? row_pairs(c->k, b, h, j0 + j, pr->Dk, t0) : NULL;
        const uint16_t *k1 = j + 1 < nk ? row_pairs(c->k, b, h, j0 + j + 1, pr->Dk, t1) : NULL;
        for (int64_t p = 0; p < g->np; p++) {
            kd[p * BK + j] = k0 ? pair16(k0, 2 * p) : 0;
            kd[p * BK + j + 1] = k1 ? pair16(k1, 2 * p) : 0;
        }
        pair_two_rows(k0, k1, pr->Dk, g->dkp, kk + (j / 2) * g->dkp);
        const uint16_t *v0 = j < nk ? row_pairs(c->v, b, h, j0 + j, pr->Dv, t0) : NULL;
        const uint16_t *v1 = j + 1 < nk ? row_pairs(c->v, b, h, j0 + j + 1, pr->Dv, t1) : NULL;
        for (int64_t p = 0; p < g->nvp; p++) {
            vd[p * BK + j] = v0 ? pair16(v0, 2 * p) : 0;
            vd[p * BK + j + 1] = v1 ? pair16(v1, 2 * p) : 0;
        }
    }
}

/* x [nq][np] rows of pairs along d (a row's n bf16 values, low half
 * first) into y [(nq + 1) / 2][ld], pairs along queries (pair_two_rows of
 * rows 2t and 2t + 1). */
static void pair_queries(const uint32_t *x, int64_t np, int64_t nq, int64_t n, int64_t ld,
                         uint32_t *y) {
    for (int64_t t = 0; t < (nq + 1) / 2; t++)
        pair_two_rows((const uint16_t *)(const void *)(x + 2 * t * np),
                      2 * t + 1 < nq ? (const uint16_t *)(const void *)(x + (2 * t + 1) * np)
                                     : NULL,
                      n, ld, y + t * ld);
}

/* Σ_d a[d]·x[d] over row l of (b, h) of out (x; bf16 when xbf), d < n,
 * in 16 running sums (lane d % 16) added pairwise at the end: a fixed
 * order that vectorises (one chain of n adds did not: 30 % of the
 * preparation of a block at head size 32). */
static float dot_lanes(const uint16_t *a, const attn_tensor *out, int xbf, int64_t b, int64_t h,
                       int64_t l, int64_t n) {
    const int64_t sd = out->stride[3];
    const uint16_t *xh = xbf ? attn_bf16_row(out, b, h, l) : NULL;
    const float *xf = xbf ? NULL : out->data + b * out->stride[0] + h * out->stride[1] + l * out->stride[2];
    float part[16] = {0};
    int64_t d0 = 0;
    if (sd == 1 && xbf)
        for (; d0 + 16 <= n; d0 += 16)
            for (int u = 0; u < 16; u++)
                part[u] += attn_bf16_to_f32(a[d0 + u]) * attn_bf16_to_f32(xh[d0 + u]);
    else if (sd == 1)
        for (; d0 + 16 <= n; d0 += 16)
            for (int u = 0; u < 16; u++) part[u] += attn_bf16_to_f32(a[d0 + u]) * xf[d0 + u];
    for (int64_t d = d0; d < n; d++)
        part[(d - d0) & 15] += attn_bf16_to_f32(a[d]) *
                               (xbf ? attn_bf16_to_f32(xh[d * sd]) : xf[d * sd]);
    for (int w = 8; w >= 1; w /= 2)
        for (int u = 0; u < w; u++) part[u] += part[u + w];
    return part[0];
}

/* Rows [i0, i0 + nq) of (b, h): Q and dO pairs, lse and D. */
static void bw_prep(const attn_fused_call *c, const bgeo *g, const bwscr *w, int64_t b, int64_t h,
                    int64_t i0, int64_t nq) {
    const attn_problem *pr = c->pr;
    const int obf = pr->out_dtype == ATTN_BF16;
    for (int64_t r = 0; r < nq; r++) {
        /* a row's pairs are its values in memory order (tmp[n] = 0 pads) */
        row_bf16(c->q, 1, b, h, i0 + r, pr->Dk, w->tmp);
        memcpy(w->qd + r * g->np, w->tmp, (size_t)g->np * 4);
        row_bf16(c->dout, obf, b, h, i0 + r, pr->Dv, w->tmp);
        memcpy(w->od + r * g->nvp, w->tmp, (size_t)g->nvp * 4);
        /* D = dO·O in fp32, dO as the products see it */
        w->dvec[r] = dot_lanes(w->tmp, c->out, obf, b, h, i0 + r, pr->Dv);
        w->lse[r] = c->lse_in[(b * pr->H + h) * pr->Lq + i0 + r];
        if (w->pdp) w->pdp[r] = w->psum[r] = 0.0f;
    }
    pair_queries(w->qd, g->np, nq, pr->Dk, g->dkp, w->qq);
    pair_queries(w->od, g->nvp, nq, pr->Dv, g->dvp, w->oq);
}

/* Row r (query i) of a tile of keys [j0, j0 + nk), W = 16 nvec columns:
 * S row to P (dropout applied, the P of P·V), dP row to dS. */
static void bw_softmax_row(const attn_problem *pr, const bwscr *w, int64_t r, int64_t b, int64_t h,
                           int64_t i, int64_t j0, int64_t nk, int64_t nvec, int interior) {
    float *s = w->S + r * BK, *dp = w->dP + r * BK;
    const int64_t W = 16 * nvec;
    const float lse = w->lse[r];
    if (lse == -INFINITY) { /* the row sees no key */
        memset(s, 0, (size_t)W * 4);
        memset(dp, 0, (size_t)W * 4);
        return;
    }
    const int fold = bf16_fold_scale(pr), cap = pr->softcap > 0.0f;
    scale_mask_row(pr, s, b, h, i, j0, nk, W, interior, !fold, cap ? w->dcap : NULL);
    if (pr->dropout) {
        for (int64_t j = 0; j < W; j++) w->z[j] = 0.0f;
        for (int64_t j = 0; j < nk; j += 4) {
            uint32_t word[4];
            attn_philox_block(pr->drop_key, b + pr->drop_b0, h, i, (j0 + j) >> 2, word);
            for (int64_t u = 0; u < 4 && j + u < nk; u++)
                w->z[j + u] = word[(j0 + j + u) & 3] < pr->drop_threshold ? 0.0f : pr->keep_scale;
        }
        for (int64_t j = 0; j < W; j++) dp[j] *= w->z[j];
    }
    bw_row(s, dp, nvec, fold ? pr->scale : 1.0f, lse, w->dvec[r]);
    if (w->pdp) { /* Σ_j P·dP = Σ_j P∘(dP - D) + D·Σ_j P, summed at the block's end */
        float a = 0.0f, e = 0.0f;
        for (int64_t j = 0; j < W; j++) a += dp[j], e += s[j];
        w->pdp[r] += a, w->psum[r] += e;
    }
    if (cap) /* dS through the cap: times 1 - tanh² */
        for (int64_t j = 0; j < W; j++) dp[j] *= w->dcap[j];
    if (pr->dropout)
        for (int64_t j = 0; j < W; j++) s[j] *= w->z[j];
}

/* Query block [i0, i0 + nq) against keys [j0, j0 + nk) of tile kd: the
 * shares of dK, dV (rows j0.. of dka, dva; NULL: not wanted) and dQ.
 * kd NULL (decoding, nq <= BMR, d contiguous in K and V): S, dP and dQ
 * from K's and V's rows themselves (qk_direct, pv_direct, as the forward's
 * decode computes S), nothing packed. */
static void bw_tile(const attn_fused_call *c, const bgeo *g, const bwscr *w, const uint32_t *kd,
                    int64_t b, int64_t h, int64_t i0, int64_t nq, int64_t j0, int64_t nk,
                    int interior, float *dka, float *dva, float *dqa) {
    const attn_problem *pr = c->pr;
    const int64_t nvec = (nk + 15) / 16, nqp = (nq + 1) / 2;
    const uint32_t *kk = kd ? kd + g->tkd : NULL, *vd = kd ? kk + g->tkk : NULL;
    if (kd) {
        gemm_pairs(nq, nvec, 1, w->qd, g->np, 1, g->np, kd, BK, w->S, BK);
        gemm_pairs(nq, nvec, 1, w->od, g->nvp, 1, g->nvp, vd, BK, w->dP, BK);
    } else {
        const uint16_t *qr[BMR], *orr[BMR]; /* the rows as bw_prep paired them */
        for (int64_t r = 0; r < nq; r++)
            qr[r] = (const uint16_t *)(const void *)(w->qd + r * g->np),
            orr[r] = (const uint16_t *)(const void *)(w->od + r * g->nvp);
        qk_direct((int)nq, qr, attn_bf16_row(c->k, b, attn_kv_head(pr, h), j0), c->k->stride[2],
                  nk, pr->Dk, w->S);
        qk_direct((int)nq, orr, attn_bf16_row(c->v, b, attn_kv_head(pr, h), j0), c->v->stride[2],
                  nk, pr->Dv, w->dP);
    }
    for (int64_t r = 0; r < nq; r++)
        bw_softmax_row(pr, w, r, b, h, i0 + r, j0, nk, nvec, interior);
    if (dka || dva)
        for (int64_t t = 0; t < nqp; t++) {
            const int two = 2 * t + 1 < nq;
            pair_rows(w->S + 2 * t * BK, two ? w->S + (2 * t + 1) * BK : NULL, nvec, w->pt + t * BK);
            pair_rows(w->dP + 2 * t * BK, two ? w->dP + (2 * t + 1) * BK : NULL, nvec,
                      w->dst + t * BK);
        }
    if (dva) gemm_pairs(nk, g->dvp / 16, 0, w->pt, 1, BK, nqp, w->oq, g->dvp, dva, g->dvp);
    if (dka) gemm_pairs(nk, g->dkp / 16, 0, w->dst, 1, BK, nqp, w->qq, g->dkp, dka, g->dkp);
    if (dqa) {
        for (int64_t r = 0; r < nq; r++) round_pairs(w->dP + r * BK, nvec, w->dsd + r * (BK / 2));
        if (kd)
            gemm_pairs(nq, g->dkp / 16, 0, w->dsd, BK / 2, 1, (nk + 1) / 2, kk, g->dkp, dqa,
                       g->dkp);
        else
            pv_direct((int)nq, w->dsd, attn_bf16_row(c->k, b, attn_kv_head(pr, h), j0),
                      c->k->stride[2], nk, pr->Dk, g->dkp, dqa);
    }
}

/* Rows [i0, i0 + nq) of (b, h) into c->sink_rows (when asked): Σ_j P·dP
 * after a pass that saw every tile of the rows (the dQ pass). */
static void bw_sink_rows(const attn_fused_call *c, const bwscr *w, int64_t b, int64_t h,
                         int64_t i0, int64_t nq) {
    if (!c->sink_rows) return;
    float *dst = c->sink_rows + (b * c->pr->H + h) * c->pr->Lq + i0;
    for (int64_t r = 0; r < nq; r++) dst[r] = w->pdp[r] + w->dvec[r] * w->psum[r];
}

/* acc rows [0, n) times mul into rows l0.. of the fp32 gradient t. */
static void bw_write(const attn_tensor *t, int64_t b, int64_t h, int64_t l0, int64_t n, int64_t D,
                     const float *acc, int64_t ld, float mul) {
    const int64_t sd = t->stride[3];
    for (int64_t r = 0; r < n; r++) {
        float *o = t->data + b * t->stride[0] + h * t->stride[1] + (l0 + r) * t->stride[2];
        const float *a = acc + r * ld;
        if (sd == 1)
            for (int64_t d = 0; d < D; d++) o[d] = a[d] * mul;
        else
            for (int64_t d = 0; d < D; d++) o[d * sd] = a[d] * mul;
    }
}

/* Query block qb of (b, h) against its tiles within [u0, u1) (packed at
 * KV + t·tile): dK/dV shares into dka/dva (rows from key g0; NULL: not
 * wanted), and with dq nonzero the block's dQ rows into c->dq. */
static void bw_block(const attn_fused_call *c, const bgeo *g, const bwscr *w, const uint32_t *KV,
                     int64_t b, int64_t h, int64_t qb, int64_t u0, int64_t u1, float *dka,
                     float *dva, int64_t g0, int dq) {
    const attn_problem *pr = c->pr;
    const int64_t i0 = qb * BQ, nq = bmin(BQ, pr->Lq - i0);
    int64_t l0, h0, l1, h1;
    attn_row_range(pr, b, i0, &l0, &h0);
    attn_row_range(pr, b, i0 + nq - 1, &l1, &h1);
    const int64_t lo = l0, hi = bmin(pr->Lk, h1 > l0 ? h1 : l0);
    const int64_t t0 = bmax(u0, lo / BK), t1 = hi > lo ? bmin(u1, (hi - 1) / BK + 1) : t0;
    if (t0 >= t1 && !dq) return;
    bw_prep(c, g, w, b, h, i0, nq);
    if (dq) memset(w->dqa, 0, (size_t)(nq * g->dkp) * 4);
    for (int64_t t = t0; t < t1; t++) {
        const int64_t j0 = t * BK, nk = bmin(BK, hi - j0); /* keys past hi: none visible */
        const int interior = bf16_interior(j0, nk, l1, h0);
        bw_tile(c, g, w, g->direct ? NULL : KV + t * g->tile, b, h, i0, nq, j0, nk, interior,
                dka ? dka + (j0 - g0) * g->dkp : NULL, dva ? dva + (j0 - g0) * g->dvp : NULL,
                dq ? w->dqa : NULL);
    }
    if (dq) bw_write(c->dq, b, h, i0, nq, pr->Dk, w->dqa, g->dkp, pr->scale);
    if (dq) bw_sink_rows(c, w, b, h, i0, nq);
}

/* All of (b, h) when its queries are one block (Lq <= BQ): each key
 * tile's dK/dV rows are final once the block has seen the tile, so tiles
 * are packed and their rows written one at a time (kv and dka/dva hold one
 * tile, in L1/L2) instead of packing the head and accumulating [Lk] rows
 * first: the sums of bw_block, in its order, so the same bits. Decoding
 * (nq <= BMR, d contiguous) packs nothing (bw_tile's direct products). */
static void bw_head_one_block(const attn_fused_call *c, const bgeo *g, const bwscr *w, int64_t b,
                              int64_t h) {
    const attn_problem *pr = c->pr;
    const int64_t nq = pr->Lq;
    int64_t l0, h0, l1, h1;
    attn_row_range(pr, b, 0, &l0, &h0);
    attn_row_range(pr, b, nq - 1, &l1, &h1);
    const int64_t lo = l0, hi = bmin(pr->Lk, h1 > l0 ? h1 : l0);
    const int64_t t0 = lo / BK, t1 = hi > lo ? (hi - 1) / BK + 1 : t0;
    bw_prep(c, g, w, b, h, 0, nq);
    memset(w->dqa, 0, (size_t)(nq * g->dkp) * 4);
    for (int64_t t = 0; t < g->ntile; t++) {
        const int64_t j0 = t * BK, n = bmin(BK, pr->Lk - j0);
        memset(w->dka, 0, (size_t)(n * g->dkp) * 4);
        memset(w->dva, 0, (size_t)(n * g->dvp) * 4);
        if (t >= t0 && t < t1) {
            const int64_t nk = bmin(BK, hi - j0);
            const int interior = bf16_interior(j0, nk, l1, h0);
            if (!g->direct) bw_pack_tile(c, g, b, h, t, w->kv, w->tmp); /* group 1: h is the K/V head */
            bw_tile(c, g, w, g->direct ? NULL : w->kv, b, h, 0, nq, j0, nk, interior, w->dka,
                    w->dva, w->dqa);
        }
        bw_write(c->dk, b, h, j0, n, pr->Dk, w->dka, g->dkp, pr->scale);
        bw_write(c->dv, b, h, j0, n, pr->Dv, w->dva, g->dvp, 1.0f);
    }
    bw_write(c->dq, b, h, 0, nq, pr->Dk, w->dqa, g->dkp, pr->scale);
    bw_sink_rows(c, w, b, h, 0, nq);
}

static attn_status bf16_backward(const attn_fused_call *c, attn_error *err) {
    const attn_problem *pr = c->pr;
    bgeo g;
    g.np = (pr->Dk + 1) / 2, g.nvp = (pr->Dv + 1) / 2;
    g.dkp = (pr->Dk + 15) / 16 * 16, g.dvp = (pr->Dv + 15) / 16 * 16;
    g.ntile = (pr->Lk + BK - 1) / BK, g.nqb = (pr->Lq + BQ - 1) / BQ;
    g.tkd = g.np * BK, g.tkk = BK / 2 * g.dkp, g.tvd = g.nvp * BK;
    g.tile = (g.tkd + g.tkk + g.tvd + 15) / 16 * 16;
    g.direct = pr->Lq <= BMR && c->k->stride[3] == 1 && c->v->stride[3] == 1;
    const int64_t BH = pr->B * pr->H, BHk = pr->B * pr->Hkv, G = pr->group, T = pr->threads;
    const int64_t Lk = pr->Lk;
    /* one_block writes a tile's dK/dV rows from one query head: not grouped */
    const int one = attn_fused_bwd_one_pass(pr), one_block = one && g.nqb == 1 && G == 1;
    const int64_t accn = one_block ? BK : one ? Lk : BKG * BK;
#define R16(x) (((x) + 15) / 16 * 16)
    const int64_t n_qd = R16(BQ * g.np), n_od = R16(BQ * g.nvp), n_qq = R16(BQ / 2 * g.dkp),
                  n_oq = R16(BQ / 2 * g.dvp), n_sq = BQ * BK, n_dq = BQ * g.dkp,
                  n_tmp = R16(bmax(pr->Dk, pr->Dv) + 2) /* two rows */, n_dka = R16(accn * g.dkp),
                  n_dva = R16(accn * g.dvp),
                  n_kv = g.direct ? 0 : one_block ? g.tile : one ? g.ntile * g.tile : 0;
    const int64_t per = n_qd + n_od + n_qq + n_oq + 4 * BQ + 2 * BK + 2 * n_sq + 3 * (BQ / 2 * BK) +
                        n_dq + n_tmp + n_dka + n_dva + n_kv;
#undef R16
    uint32_t *all = aligned_alloc(64, (size_t)(per * T * 4));
    const int packed = !one && !g.direct; /* all heads' tiles packed first */
    uint32_t *KV = packed ? aligned_alloc(64, (size_t)(BHk * g.ntile * g.tile * 4) + 64) : NULL;
    if (!all || (packed && !KV)) {
        free(all);
        free(KV);
        return attn_fail(err, ATTN_ERR_NOMEM, "bf16 fused backward: out of memory");
    }
#pragma omp parallel num_threads(T)
    {
        const unsigned fpm = attn_fp_enter();
        amx_tile_config ts;
        /* decoding: nq <= BMR rows, so its products have fewer than the 16
         * pairs a tile needs (BMR < 32) and run on vectors: no tiles */
        _Static_assert(BMR < 32, "direct decoding's products must stay off the tiles");
        if (!g.direct) bf16_tiles_enter(&ts);
        uint32_t *base = all + per * omp_get_thread_num();
        bwscr w;
        w.qd = base, base += n_qd;
        w.od = base, base += n_od;
        w.qq = base, base += n_qq;
        w.oq = base, base += n_oq;
        w.lse = (float *)base, base += BQ;
        w.dvec = (float *)base, base += BQ;
        w.pdp = c->sink_rows ? (float *)base : NULL, base += BQ;
        w.psum = (float *)base, base += BQ;
        w.z = (float *)base, base += BK;
        w.dcap = (float *)base, base += BK;
        w.S = (float *)base, base += n_sq;
        w.dP = (float *)base, base += n_sq;
        w.pt = base, base += BQ / 2 * BK;
        w.dst = base, base += BQ / 2 * BK;
        w.dsd = base, base += BQ / 2 * BK;
        w.dqa = (float *)base, base += n_dq;
        w.tmp = (uint16_t *)(void *)base, base += n_tmp;
        w.dka = (float *)base, base += n_dka;
        w.dva = (float *)base, base += n_dva;
        w.kv = base;
        if (one) {
#pragma omp for schedule(dynamic)
            for (int64_t x = 0; x < BHk; x++) { /* a K/V head and its group, in head order */
                const int64_t b = x / pr->Hkv, hk = x % pr->Hkv;
                if (one_block) {
                    bw_head_one_block(c, &g, &w, b, hk);
                    continue;
                }
                if (!g.direct)
                    for (int64_t t = 0; t < g.ntile; t++)
                        bw_pack_tile(c, &g, b, hk, t, w.kv + t * g.tile, w.tmp);
                memset(w.dka, 0, (size_t)(Lk * g.dkp) * 4);
                memset(w.dva, 0, (size_t)(Lk * g.dvp) * 4);
                for (int64_t h = hk * G; h < (hk + 1) * G; h++)
                    for (int64_t qb = 0; qb < g.nqb; qb++)
                        bw_block(c, &g, &w, w.kv, b, h, qb, 0, g.ntile, w.dka, w.dva, 0, 1);
                bw_write(c->dk, b, hk, 0, Lk, pr->Dk, w.dka, g.dkp, pr->scale);
                bw_write(c->dv, b, hk, 0, Lk, pr->Dv, w.dva, g.dvp, 1.0f);
            }
        } else {
            const int64_t ngrp = (g.ntile + BKG - 1) / BKG;
#pragma omp for schedule(static)
            for (int64_t x = 0; x < (packed ? BHk * g.ntile : 0); x++)
                bw_pack_tile(c, &g, x / g.ntile / pr->Hkv, x / g.ntile % pr->Hkv, x % g.ntile,
                             KV + x * g.tile, w.tmp);
#pragma omp for schedule(dynamic)
            for (int64_t x = 0; x < BHk * ngrp; x++) { /* the group's query heads in head order */
                const int64_t bh = x / ngrp, gi = x % ngrp, b = bh / pr->Hkv, hk = bh % pr->Hkv;
                const int64_t g0 = gi * BKG * BK, g1 = bmin(Lk, g0 + BKG * BK);
                const uint32_t *kv = packed ? KV + bh * g.ntile * g.tile : NULL;
                memset(w.dka, 0, (size_t)((g1 - g0) * g.dkp) * 4);
                memset(w.dva, 0, (size_t)((g1 - g0) * g.dvp) * 4);
                for (int64_t h = hk * G; h < (hk + 1) * G; h++)
                    for (int64_t qb = 0; qb < g.nqb; qb++)
                        bw_block(c, &g, &w, kv, b, h, qb, gi * BKG, bmin(g.ntile, (gi + 1) * BKG),
                                 w.dka, w.dva, g0, 0);
                bw_write(c->dk, b, hk, g0, g1 - g0, pr->Dk, w.dka, g.dkp, pr->scale);
                bw_write(c->dv, b, hk, g0, g1 - g0, pr->Dv, w.dva, g.dvp, 1.0f);
            }
#pragma omp for schedule(dynamic)
            for (int64_t x = 0; x < BH * g.nqb; x++) {
                const int64_t bh = x / g.nqb, qb = g.nqb - 1 - x % g.nqb;
                const int64_t b = bh / pr->H, h = bh % pr->H, kv = b * pr->Hkv + attn_kv_head(pr, h);
                bw_block(c, &g, &w, packed ? KV + kv * g.ntile * g.tile : NULL, b, h, qb, 0,
                         g.ntile, NULL, NULL, 0, 1);
            }
        }
        if (!g.direct) bf16_tiles_leave(&ts);
        attn_fp_leave(fpm);
    }
    free(all);
    free(KV);
    return ATTN_OK;
}

#endif
