/* The bf16 fused forward, written once over a few per-ISA functions and
 * compiled twice: sdpa_fused_bf16_avx512.c (VDPBF16PS) and
 * sdpa_fused_bf16_portable.c (fp32 FMA on converted values) define
 *   gemm_pairs(nr, nvec, zero, A, ars, ats, nt, B, ldb, C, ldc)
 *                                C[r][0, 16 nvec) (+)= Σ_t dot2(A[r·ars + t·ats],
 *                                B[t·ldb + ·]) (fp32 accumulation; S = Q·Kᵀ here,
 *                                the backward's five products)
 *   pv_tile(nr, pd, nkp, vp, dvp, O)  O[r][0, dvp) += Σ_t dot2(pd[r][t], vp[t][·]), r < nr
 *   row_max(s, nvec), exp_row(s, c, m, nvec) (s = exp(s·c - m) with one
 *                                FMA before exp, returns Σ s) over
 *   16 nvec columns, round_pairs(s, nvec, pd) (8 nvec pairs of bf16),
 *   exp_round_row(s, c, m, nvec, pd) (exp_row then round_pairs, the same
 *                                bits; s need not hold P after it),
 *   pair_rows(x0, x1, nvec, dst), bw_row(s, dp, nvec, c, lse, D) (backward:
 *                                P = exp(s·c - lse) as exp_row)
 *   qk_tile(nr, nvec, qd, np, kp, S, rmax)  gemm_pairs for S = Q·Kᵀ of a tile
 *                                and each row's row_max in rmax[r]
 *   qk_direct(nr, q, k, ks, nk, D, S)  S[r][j] = q[r]·k[j·ks], j < nk, from
 *                                the rows themselves (d contiguous; 0 past nk)
 *   pv_direct(nr, pd, v, vs, nk, Dv, dvp, O)  O[r] += P·V from V's rows,
 *                                keys paired (2t, 2t + 1) as in pv_tile
 *   transpose_words(rows, n, nw, dst, ld)  dst[p·ld + j] = word p of bf16
 *                                row j (NULL: 0): K and V tiles as pairs along d
 * over 32-bit pairs of bf16 (low half the even element), then include
 * this file. Semantics (attn.h, attn_sdpa_params.dtype): PyTorch 2.x's CPU
 * flash attention: scores, scale, masks, online softmax, l and the output
 * tile in fp32; P rounded to bf16 before P·V.
 *
 * Layout: K and V of every (b, h) are packed once per call into tiles of BK
 * keys: K as [np][BK] pairs along d (pair p of key j: k[j][2p], k[j][2p+1]),
 * V as [BK/2][dvp] pairs along keys (pair t of column d: v[2t][d],
 * v[2t+1][d]), zero-padded. Then a query block of BQ rows walks the key
 * tiles of its structural range: S = Q·Kᵀ by broadcasting a row's pair
 * over 16 keys, softmax on rows of S, P = bf16(exp(S - m)) as pairs along
 * keys, O += P·V by broadcasting P's pairs over 16 columns of V. Every
 * (b, h, query block) is computed by one thread in a fixed order: results
 * do not depend on the thread count.
 *
 * Small calls pack less: decode (Lq <= 4, d contiguous) packs nothing (the
 * rows feed qk_direct / pv_direct: a K or V row is read once per call
 * anyway), and a call of one query block per (b, h) (Lq <= BQ) packs each
 * tile into its thread's scratch just before use, rather than all of K and
 * V into a call-sized buffer first; when the heads spread evenly over the
 * threads (attn_fused_bwd_one_pass), a thread packs one head's tiles into
 * its scratch and takes that head's blocks one at a time, then helps with
 * the head that has the most left. All per-thread scratch
 * is one allocation per call, sized for min(Lq, BQ) rows. A tile's scores
 * are computed only up to the block's last visible key, rounded up to 16. */
#ifndef ATTN_SDPA_FUSED_BF16_H
#define ATTN_SDPA_FUSED_BF16_H

#include "sdpa_bf16.h"
#include "sdpa_fused_bf16_tiles.h"

#include <math.h>
#include <omp.h>
#include <stdlib.h>

static inline uint32_t pair_at(const uint16_t *row, int64_t sd, int64_t e0, int64_t n) {
    const uint32_t lo = e0 < n ? row[e0 * sd] : 0, hi = e0 + 1 < n ? row[(e0 + 1) * sd] : 0;
    return lo | hi << 16;
}

/* Key tile t of (b, h): kp [np][BK], vp [BK/2][dvp]; zeros past the
 * batch's key length (bf16_key_end). */
static void pack_kv(const attn_problem *pr, const attn_tensor *k, const attn_tensor *v, int64_t b,
                    int64_t h, int64_t t, int64_t np, int64_t dvp, uint32_t *kp, uint32_t *vp) {
    const int64_t j0 = t * BK, nk = bmax(0, bmin(BK, bf16_key_end(pr, b) - j0));
    if (k->stride[3] == 1 && v->stride[3] == 1) { /* branch-free copies */
        const int64_t full = pr->Dk / 2; /* whole pairs of a row */
        if (full == np) { /* a row's words are its pairs: one transpose */
            const uint16_t *rows[BK];
            for (int64_t j = 0; j < BK; j++) rows[j] = j < nk ? attn_bf16_row(k, b, h, j0 + j) : NULL;
            transpose_words(rows, BK, np, kp, BK);
        } else {
            for (int64_t j = 0; j < nk; j++) {
                const uint16_t *r = attn_bf16_row(k, b, h, j0 + j);
                for (int64_t p = 0; p < full; p++) {
                    uint32_t x;
                    memcpy(&x, r + 2 * p, sizeof x);
                    kp[p * BK + j] = x;
                }
                kp[full * BK + j] = r[2 * full];
            }
            for (int64_t p = 0; p < np; p++)
                for (int64_t j = nk; j < BK; j++) kp[p * BK + j] = 0;
        }
        for (int64_t tt = 0; tt < BK / 2; tt++) {
            const uint16_t *r0 = 2 * tt < nk ? attn_bf16_row(v, b, h, j0 + 2 * tt) : NULL;
            pair_two_rows(r0, 2 * tt + 1 < nk ? r0 + v->stride[2] : NULL, pr->Dv, dvp,
                          vp + tt * dvp);
        }
        return;
    }
    for (int64_t j = 0; j < BK; j++) {
        const uint16_t *r = j < nk ? attn_bf16_row(k, b, h, j0 + j) : NULL;
        for (int64_t p = 0; p < np; p++)
            kp[p * BK + j] = r ? pair_at(r, k->stride[3], 2 * p, pr->Dk) : 0;
    }
    const int64_t sd = v->stride[3];
    for (int64_t tt = 0; tt < BK / 2; tt++) {
        const uint16_t *r0 = 2 * tt < nk ? attn_bf16_row(v, b, h, j0 + 2 * tt) : NULL;
        const uint16_t *r1 = 2 * tt + 1 < nk ? attn_bf16_row(v, b, h, j0 + 2 * tt + 1) : NULL;
        uint32_t *o = vp + tt * dvp;
        for (int64_t d = 0; d < dvp; d++) {
            const uint32_t lo = r0 && d < pr->Dv ? r0[d * sd] : 0;
            const uint32_t hi = r1 && d < pr->Dv ? r1[d * sd] : 0;
            o[d] = lo | hi << 16;
        }
    }
}

typedef struct {
    uint32_t *qd; /* [BQ][np] query pairs */
    float *S;     /* [BQ][BK] scores */
    uint32_t *pd; /* [BQ][BK/2] P pairs */
    float *O;     /* [BQ][dvp] unnormalised output */
    float *m, *l; /* [BQ] running max and sum */
    float *rm;    /* [BQ] each row's max of its S tile (qk_tile) */
    uint32_t *kp, *vp; /* packed tiles [np][BK], [BK/2][dvp]: one (local) or a head's */
} bscratch;

/* Scale, mask and softmax-update row r (query i, keys [j0, j0 + nk)) of S;
 * its P pairs into pd. */
static void softmax_row(const attn_problem *pr, bscratch *w, int64_t dvp, int64_t r, int64_t b,
                        int64_t h, int64_t i, int64_t j0, int64_t nk, int64_t nvec, int interior,
                        const float *tile_max) {
    float *s = w->S + r * BK;
    uint32_t *pd = w->pd + r * (BK / 2);
    const int fold = bf16_fold_scale(pr); /* m and l stay in the scaled domain */
    scale_mask_row(pr, s, b, h, i, j0, nk, 16 * nvec, interior, !fold, NULL);
    /* tile_max: the row's max from the product, valid while nothing above
     * changed s (an interior tile, the scale folded, no additive or
     * boolean mask) */
    const int same = tile_max && interior && fold && !pr->amask && !pr->bmask;
    const float rmax = same ? *tile_max : row_max(s, nvec), c = fold ? pr->scale : 1.0f;
    const float mold = w->m[r], mnew = fmaxf(mold, fold ? rmax * c : rmax);
    if (mnew == -INFINITY) { /* nothing visible yet */
        memset(pd, 0, BK / 2 * sizeof *pd);
        return;
    }
    const float alpha = mold == -INFINITY ? 0.0f : mnew == mold ? 1.0f : expf(mold - mnew);
    const float sum =
        pr->dropout ? exp_row(s, c, mnew, nvec) : exp_round_row(s, c, mnew, nvec, pd);
    w->l[r] = w->l[r] * alpha + sum;
    w->m[r] = mnew;
    if (alpha != 1.0f && mold != -INFINITY) { /* before: O is 0 (or NaN), as O * 0 */
        float *o = w->O + r * dvp;
        for (int64_t d = 0; d < dvp; d++) o[d] *= alpha;
    }
    if (pr->dropout) {
        for (int64_t j = 0; j < nk; j += 4) {
            uint32_t word[4];
            attn_philox_block(pr->drop_key, b + pr->drop_b0, h, i, (j0 + j) >> 2, word);
            for (int64_t u = 0; u < 4 && j + u < nk; u++)
                s[j + u] *= word[(j0 + j + u) & 3] < pr->drop_threshold ? 0.0f : pr->keep_scale;
        }
        round_pairs(s, nvec, pd);
    }
}

/* Rows [i0, i0 + nq) of (b, h): O / l into out (rounded when bf16), lse;
 * the head's sink (if any) joins l (attn_sink_fold). */
static void write_rows(const attn_fused_call *c, const bscratch *w, int64_t dvp, int64_t b,
                       int64_t h, int64_t i0, int64_t nq) {
    const attn_problem *pr = c->pr;
    const attn_tensor *out = c->out;
    for (int64_t r = 0; r < nq; r++) {
        const float l = w->l[r];
        float inv = l > 0.0f ? 1.0f / l : 0.0f, lse = l > 0.0f ? w->m[r] + logf(l) : -INFINITY;
        if (pr->sinks) {
            float M, il;
            inv = attn_sink_fold(w->m[r], l, pr->sinks[h], &M, &il, &lse);
        }
        const float *o = w->O + r * dvp;
        const int64_t sd = out->stride[3];
        if (pr->out_dtype == ATTN_BF16) {
            uint16_t *dst = (uint16_t *)(uintptr_t)attn_bf16_row(out, b, h, i0 + r);
            for (int64_t d = 0; d < pr->Dv; d++) dst[d * sd] = attn_bf16_round(o[d] * inv);
        } else {
            float *dst = out->data + b * out->stride[0] + h * out->stride[1] +
                         (i0 + r) * out->stride[2];
            for (int64_t d = 0; d < pr->Dv; d++) dst[d * sd] = o[d] * inv;
        }
        if (c->lse) c->lse[(b * pr->H + h) * pr->Lq + i0 + r] = lse;
    }
}

/* Query block qb of query heads [h, h + nh) of one group (b, h), their
 * rows stacked (pack_gqa, attn_fused_gqa_pack: row r is head h + r / nq,
 * row i0 + r % nq), so each K/V tile is packed or read once for the nh
 * heads; every row's arithmetic is the one-head block's. KP, VP: the
 * packed tiles of its K/V head, or NULL to pack each tile into w->kp,
 * w->vp before use. */
static void bf16_block(const attn_fused_call *c, bscratch *w, const uint32_t *KP, const uint32_t *VP,
                       int64_t np, int64_t dvp, int64_t b, int64_t h, int64_t nh, int64_t qb) {
    const attn_problem *pr = c->pr;
    const int64_t i0 = qb * BQ, nq = bmin(BQ, pr->Lq - i0), R = nh * nq;
    for (int64_t r = 0; r < R; r++) {
        const uint16_t *q = attn_bf16_row(c->q, b, h + r / nq, i0 + r % nq);
        if (c->q->stride[3] == 1 && pr->Dk % 2 == 0) /* the row's words are its pairs */
            memcpy(w->qd + r * np, q, (size_t)np * 4);
        else
            for (int64_t p = 0; p < np; p++)
                w->qd[r * np + p] = pair_at(q, c->q->stride[3], 2 * p, pr->Dk);
        w->m[r] = -INFINITY;
        w->l[r] = 0.0f;
    }
    memset(w->O, 0, (size_t)(R * dvp) * sizeof(float));
    int64_t l0, h0, l1, h1;
    attn_row_range(pr, b, i0, &l0, &h0);
    attn_row_range(pr, b, i0 + nq - 1, &l1, &h1);
    const int64_t lo = l0, hi = h1 > l0 ? h1 : l0;
    for (int64_t t = lo / BK; hi > lo && t <= (hi - 1) / BK; t++) {
        /* keys at or past hi are visible to no row: only nk of the tile,
         * rounded up to 16, are computed */
        const int64_t j0 = t * BK, nk = bmin(BK, hi - j0), nvec = (nk + 15) / 16;
        const uint32_t *kp = w->kp, *vp = w->vp;
        if (!KP)
            pack_kv(pr, c->k, c->v, b, attn_kv_head(pr, h), t, np, dvp, w->kp, w->vp);
        else {
            kp = KP + t * np * BK;
            vp = VP + t * (BK / 2) * dvp;
        }
        /* the products head by head: which rows an instruction set groups
         * (AMX: whole 16-row blocks) then depends on nq, not on how many
         * heads the thread count stacked here */
        for (int64_t g = 0; g < nh; g++)
            qk_tile(nq, nvec, w->qd + g * nq * np, np, kp, w->S + g * nq * BK, w->rm + g * nq);
        const int interior = bf16_interior(j0, nk, l1, h0);
        for (int64_t r = 0; r < R; r++)
            softmax_row(pr, w, dvp, r, b, h + r / nq, i0 + r % nq, j0, nk, nvec, interior,
                        w->rm + r);
        for (int64_t g = 0; g < nh; g++)
            pv_tile((int)nq, w->pd + g * nq * (BK / 2), (nk + 1) / 2, vp, dvp, w->O + g * nq * dvp);
    }
    for (int64_t g = 0; g < nh; g++) { /* head h + g: rows g·nq .. */
        bscratch wh = *w;
        wh.m += g * nq, wh.l += g * nq, wh.O += g * nq * dvp;
        write_rows(c, &wh, dvp, b, h + g, i0, nq);
    }
}

/* Decode: query heads [g0, g1) of K/V head (b, hk)'s group, their
 * R = (g1 - g0)·Lq rows stacked (row r: head hk·G + g0 + r / Lq, row
 * r % Lq), over K and V's rows, no packing. Each K/V tile is read once for
 * all R rows, in batches of BMR rows (the later batches from cache); every
 * row's arithmetic is the same whatever rows share its batch. */
static void bf16_decode(const attn_fused_call *c, bscratch *w, int64_t dvp, int64_t b, int64_t hk,
                        int64_t g0, int64_t g1) {
    const attn_problem *pr = c->pr;
    const int64_t Lq = pr->Lq, R = (g1 - g0) * Lq, h0 = hk * pr->group + g0;
    for (int64_t r = 0; r < R; r++) {
        w->m[r] = -INFINITY;
        w->l[r] = 0.0f;
    }
    memset(w->O, 0, (size_t)(R * dvp) * sizeof(float));
    int64_t l0, h0r, l1, h1;
    attn_row_range(pr, b, 0, &l0, &h0r);
    attn_row_range(pr, b, Lq - 1, &l1, &h1);
    const int64_t lo = l0, hi = h1 > l0 ? h1 : l0;
    const int64_t ks = c->k->stride[2], vs = c->v->stride[2];
    for (int64_t t = lo / BK; hi > lo && t <= (hi - 1) / BK; t++) {
        const int64_t j0 = t * BK, nk = bmin(BK, hi - j0), nvec = (nk + 15) / 16;
        const int interior = bf16_interior(j0, nk, l1, h0r);
        const uint16_t *kt = attn_bf16_row(c->k, b, hk, j0), *vt = attn_bf16_row(c->v, b, hk, j0);
        for (int64_t rb = 0; rb < R; rb += BMR) {
            const int nb = (int)bmin(BMR, R - rb);
            const uint16_t *q[BMR];
            for (int r = 0; r < nb; r++)
                q[r] = attn_bf16_row(c->q, b, h0 + (rb + r) / Lq, (rb + r) % Lq);
            qk_direct(nb, q, kt, ks, nk, pr->Dk, w->S + rb * BK);
            for (int64_t r = rb; r < rb + nb; r++)
                softmax_row(pr, w, dvp, r, b, h0 + r / Lq, r % Lq, j0, nk, nvec, interior, NULL);
            pv_direct(nb, w->pd + rb * (BK / 2), vt, vs, nk, pr->Dv, dvp, w->O + rb * dvp);
        }
    }
    for (int64_t g = 0; g < g1 - g0; g++) { /* head h0 + g: rows g·Lq .. */
        bscratch wh = *w;
        wh.m += g * Lq, wh.l += g * Lq, wh.O += g * Lq * dvp;
        write_rows(c, &wh, dvp, b, h0 + g, 0, Lq);
    }
}

static attn_status bf16_forward(const attn_fused_call *c, attn_error *err) {
    const attn_problem *pr = c->pr;
    const int64_t BH = pr->B * pr->H, BHk = pr->B * pr->Hkv, G = pr->group;
    const int64_t np = (pr->Dk + 1) / 2, dvp = (pr->Dv + 15) / 16 * 16;
    const int64_t ntile = (pr->Lk + BK - 1) / BK, nqb = (pr->Lq + BQ - 1) / BQ;
    const int T = pr->threads;
    const int decode = pr->Lq <= BMR && c->q->stride[3] == 1 && c->k->stride[3] == 1 &&
                       c->v->stride[3] == 1;
    /* local: each tile packed before use (<= 2 blocks per head); head: all
     * tiles of a K/V head packed into the thread's scratch, its group's
     * blocks taken one by one (when the K/V heads spread evenly over the
     * threads); else all K/V heads packed first, blocks spread over the
     * threads. Each K/V tile is packed once per group and thread using it. */
    const int local = !decode && nqb <= 2, head = !decode && !local && attn_fused_bwd_one_pass(pr);
    /* query heads per block (pack_gqa) */
    const int64_t P = decode ? 1 : attn_fused_gqa_pack(pr, bmin(BQ, pr->Lq), nqb);
    uint32_t *KP = NULL, *VP = NULL;
    if (!decode && !local && !head) {
        KP = aligned_alloc(64, (size_t)(BHk * ntile * np * BK * 4));
        VP = aligned_alloc(64, (size_t)(BHk * ntile * (BK / 2) * dvp * 4));
        if (!KP || !VP) {
            free(KP);
            free(VP);
            return attn_fail(err, ATTN_ERR_NOMEM, "bf16 fused forward: out of memory");
        }
#pragma omp parallel num_threads(T)
        {
            const unsigned fpm = attn_fp_enter();
#pragma omp for schedule(static)
            for (int64_t x = 0; x < BHk * ntile; x++)
                pack_kv(pr, c->k, c->v, x / ntile / pr->Hkv, x / ntile % pr->Hkv, x % ntile, np,
                        dvp, KP + x * np * BK, VP + x * (BK / 2) * dvp);
            attn_fp_leave(fpm);
        }
    }
    /* decode: a work item is hpi query heads of one K/V head's group (the
     * whole group unless that leaves threads idle) */
    const int64_t parts = decode ? bmin(G, (4 * T + BHk - 1) / BHk) : 1;
    const int64_t hpi = (G + parts - 1) / parts;
    /* per thread, 64-byte multiples: qd, S, pd, O, m, l, rm for `rows` rows,
     * and one packed tile when local */
    const int64_t rows = decode ? hpi * pr->Lq : P * bmin(BQ, pr->Lq), r16 = (rows + 15) / 16 * 16;
    const int64_t n_qd = (rows * np + 15) / 16 * 16, n_S = rows * BK, n_pd = (rows * BK / 2 + 15) / 16 * 16;
    const int64_t nt = head ? ntile : local, n_O = rows * dvp, n_kp = nt * np * BK,
                  n_vp = nt * (BK / 2) * dvp;
    const int64_t per = n_qd + n_S + n_pd + n_O + 3 * r16 + n_kp + n_vp; /* 4-byte words */
    uint32_t *all = aligned_alloc(64, (size_t)(per * T * 4));
    /* head: blocks taken so far of each K/V head (of nblk), heads claimed */
    const int64_t nblk = G / P * nqb;
    int64_t *next = head ? calloc((size_t)BHk, sizeof *next) : NULL;
    int64_t claimed = 0;
    if (!all || (head && !next)) {
        free(all);
        free(next);
        free(KP);
        free(VP);
        return attn_fail(err, ATTN_ERR_NOMEM, "bf16 fused forward: out of memory");
    }
#pragma omp parallel num_threads(T)
    {
        const unsigned fpm = attn_fp_enter();
        amx_tile_config ts;
        if (!decode) bf16_tiles_enter(&ts); /* decode reads rows: no tiles */
        uint32_t *base = all + per * omp_get_thread_num();
        bscratch w;
        w.qd = base;
        w.S = (float *)(base += n_qd);
        w.pd = base += n_S;
        w.O = (float *)(base += n_pd);
        w.m = (float *)(base += n_O);
        w.l = (float *)(base += r16);
        w.rm = (float *)(base += r16);
        w.kp = (base += r16);
        w.vp = base + n_kp;
        if (decode) {
#pragma omp for schedule(dynamic)
            for (int64_t x = 0; x < BHk * parts; x++) {
                const int64_t kv = x / parts, g0 = x % parts * hpi;
                if (g0 < G)
                    bf16_decode(c, &w, dvp, kv / pr->Hkv, kv % pr->Hkv, g0, bmin(G, g0 + hpi));
            }
        } else if (head) {
            /* A thread claims a K/V head, packs its tiles and takes its
             * blocks one at a time (next[x]); with no head left unclaimed it
             * packs the head with the most blocks left and takes blocks
             * there too. So a thread that another process slows holds up
             * one block at the end, not a head. */
            int64_t have = -1;
            for (;;) {
                int64_t x;
#pragma omp atomic capture
                x = claimed++;
                if (x >= BHk) { /* help where the most blocks are left */
                    int64_t left = 0;
                    x = -1;
                    for (int64_t y = 0; y < BHk; y++) {
                        int64_t n;
#pragma omp atomic read
                        n = next[y];
                        if (nblk - n > left) left = nblk - n, x = y;
                    }
                    if (x < 0) break;
                }
                const int64_t b = x / pr->Hkv, hk = x % pr->Hkv;
                for (;;) {
                    int64_t i;
#pragma omp atomic capture
                    i = next[x]++;
                    if (i >= nblk) break;
                    if (have != x) {
                        for (int64_t t = 0; t < ntile; t++)
                            pack_kv(pr, c->k, c->v, b, hk, t, np, dvp, w.kp + t * np * BK,
                                    w.vp + t * (BK / 2) * dvp);
                        have = x;
                    }
                    /* block i: query block i / S of stack i % S (S stacks of P
                     * heads); with a causal mask the last (longest) first */
                    const int64_t S = G / P, k = i / S;
                    bf16_block(c, &w, w.kp, w.vp, np, dvp, b, hk * G + i % S * P, P,
                               pr->causal ? nqb - 1 - k : k);
                }
            }
        } else {
#pragma omp for schedule(dynamic)
            for (int64_t x = 0; x < BH / P * nqb; x++) {
                const int64_t bh = x / nqb, b = bh / (pr->H / P), h = bh % (pr->H / P) * P;
                const int64_t kv = b * pr->Hkv + attn_kv_head(pr, h);
                bf16_block(c, &w, local ? NULL : KP + kv * ntile * np * BK,
                           local ? NULL : VP + kv * ntile * (BK / 2) * dvp, np, dvp, b, h, P,
                           x % nqb);
            }
        }
        if (!decode) bf16_tiles_leave(&ts);
        attn_fp_leave(fpm);
    }
    free(all);
    free(next);
    free(KP);
    free(VP);
    return ATTN_OK;
}

static int64_t bf16_scratch(const attn_problem *pr) {
    (void)pr;
    return 0; /* allocates its own */
}

#include "sdpa_fused_bf16_bwd.h"

/* softcap_row with cap 1: y = tanh(x) (attn_test_tanh). */
static void bf16_tanh_n(const float *x, float *y, int64_t n) {
    for (int64_t j = 0; j < n; j++) y[j] = x[j];
    softcap_row(y, n, 1.0f, NULL);
}

/* The initializer of this file's export. */
#define FUSED_BF16_KERNELS(name) {name, bf16_forward, bf16_backward, bf16_scratch, bf16_tanh_n}

#endif
