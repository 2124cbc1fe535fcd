/* The fused backward for Lq > FUSED_DECODE_MAXLQ (part of
 * sdpa_fused_template.h): FlashAttention-2 recomputation of P from the
 * log-sum-exp; one pass per (b, h) or two (see attn_fused_bwd_one_pass). */
#ifndef ATTN_SDPA_FUSED_BWD_H
#define ATTN_SDPA_FUSED_BWD_H

#include "sdpa_fused_helpers.h"
#include "sdpa_fused_ukr.h"

typedef struct {
    const attn_tensor *out, *dout;
    const float *lse; /* row (b, h) at (b * H + h) * lse_ld */
    int64_t lse_ld;
    /* kv_ok[(b * Hkv + hk) * kv_ld + j]: 1 when key j's K and V rows hold
     * only finite values (kv_finite, once per call: a tile's check is then
     * nk bytes, not its K and V again for every query block) */
    const unsigned char *kv_ok;
    int64_t kv_ld;
} bctx;

/* ok[(b * Hkv + hk) * Lk + j] for the call's K and V (kv_ok above): each
 * head's keys checked at once first (one horizontal sum, not one per key
 * and tensor: those were 2 % of a training step, perf), key by key only
 * where that finds a non-finite value. */
static void kv_finite(const attn_tensor *K, const attn_tensor *V, int64_t B, int64_t Hkv,
                      int64_t Lk, int64_t Dk, int64_t Dv, int threads, unsigned char *ok) {
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t x = 0; x < B * Hkv; x++) {
        const int64_t b = x / Hkv, hk = x % Hkv;
        if (rows_finite(K, b, hk, 0, Lk, Dk) && rows_finite(V, b, hk, 0, Lk, Dv)) {
            memset(ok + x * Lk, 1, (size_t)Lk);
            continue;
        }
        for (int64_t j = 0; j < Lk; j++)
            ok[x * Lk + j] =
                (unsigned char)(rows_finite(K, b, hk, j, 1, Dk) && rows_finite(V, b, hk, j, 1, Dv));
    }
}

/* A prepared query block: Qᵀ (qt), Q rows (qr), dOᵀ (dout_t), dO rows
 * (dout_r), lse and D lanes. */
typedef struct {
    int64_t i0, nq, nqv;
    float *qt, *dout_t, *lsev, *dvec;
    const float *qr, *dout_r;
    int64_t ldqr, lddout_r;
    int finite; /* Q and dO rows hold only finite values */
} qblock;

static int64_t bwd_tile_scratch(const attn_problem *pr, int64_t dkp, int64_t dvp) {
    return rup(pr->Dk * FQ, 16) + rup(FQ * dkp, 16) + 2 * rup(pr->Dv * FQ, 16) + rup(FQ * dvp, 16) +
           2 * rup(FQ, 16) + 4 * rup(FK * FQ, 16) + rup(FK * dkp, 16) + rup(FK * dvp, 16) +
           rup(FQ * dkp, 16) + 64;
}

typedef struct {
    float *qt, *qr, *dout_t, *ot, *dout_r, *lsev, *dvec, *S, *dP, *Z, *dcap, *kt, *vt, *dq;
} bws; /* dcap: soft-capping's 1 - tanh² per score of a tile */

static bws bwd_carve(const attn_problem *pr, float *ws, int64_t dkp, int64_t dvp) {
    bws w;
    w.qt = carve(&ws, pr->Dk * FQ);
    w.qr = carve(&ws, FQ * dkp);
    w.dout_t = carve(&ws, pr->Dv * FQ);
    w.ot = carve(&ws, pr->Dv * FQ);
    w.dout_r = carve(&ws, FQ * dvp);
    w.lsev = carve(&ws, FQ);
    w.dvec = carve(&ws, FQ);
    w.S = carve(&ws, FK * FQ);
    w.dP = carve(&ws, FK * FQ);
    w.Z = carve(&ws, FK * FQ);
    w.dcap = carve(&ws, FK * FQ);
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
    qb->dout_t = w->dout_t;
    qb->lsev = w->lsev;
    qb->dvec = w->dvec;
    pack_transposed(w->qt, nqv, c->q, b, h, i0, nq, Dk);
    pack_transposed(w->dout_t, nqv, bc->dout, b, h, i0, nq, Dv);
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
        qb->dout_r = row_of(bc->dout, b, h, i0);
        qb->lddout_r = bc->dout->stride[2];
    } else {
        for (int64_t i = 0; i < nq; i++)
            copy_row(w->dout_r + i * dvp, row_of(bc->dout, b, h, i0 + i), bc->dout->stride[3], Dv,
                     dvp);
        qb->dout_r = w->dout_r;
        qb->lddout_r = dvp;
    }
    const float *lse = bc->lse + (b * pr->H + h) * bc->lse_ld + i0;
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
                acc = v_fma(v_load(w->ot + d * nqv + vq * VL),
                            v_load(w->dout_t + d * nqv + vq * VL), acc);
            tot = d0 == 0 ? acc : v_add(tot, acc);
        }
        v_store(qb->dvec + vq * VL, tot);
    }
    qb->finite = rows_finite(c->q, b, h, i0, nq, Dk) && rows_finite(bc->dout, b, h, i0, nq, Dv);
}

/* One (query block, key tile) of the backward: recompute P, dP, dS and add
 * the tile's share to dV, dK (rows j0.., when non-NULL) and dQ (block rows).
 * h is the query head; K, V are read at K/V head KVH(h). */
static void bwd_tile(const kctx *c, const qblock *qb, const bws *w, int64_t b, int64_t h,
                     int64_t j0, int64_t nk, const unsigned char *kv_ok, float *dk_acc,
                     float *dv_acc, float *dq_acc) {
    const attn_problem *pr = c->pr;
    const int64_t hk = KVH(pr, h);
    const int cap = pr->softcap > 0.0f;
    const int64_t Dk = pr->Dk, Dv = pr->Dv, dkp = c->dkp, dvp = c->dvp;
    const int64_t nq = qb->nq, nqv = qb->nqv, nvq = nqv / VL;
    const attn_tensor *K = c->k, *V = c->v;
    float *S = w->S, *dP = w->dP, *Z = w->Z;
    const int safe = !(qb->finite && !memchr(kv_ok, 0, (size_t)nk)); /* keys j0.. */
    const int mode = safe ? TILE_SAFE : c->mode;

    const tile_prod ts = {nk,  nvq, Dk, row_of(K, b, hk, j0), K->stride[2], K->stride[3], qb->qt,
                          nqv, S,   nqv};
    gemm_d(&ts, pr->scale, c->mode);
    if (attn_has_score_variants(pr))
        variants_tile(pr, S, nqv, h, qb->i0, nq, j0, nk, cap ? w->dcap : NULL);
    mask_tile(pr, S, nqv, b, h, qb->i0, nq, j0, nk);
    const tile_prod tp = {nk,  nvq, Dv, row_of(V, b, hk, j0), V->stride[2], V->stride[3], qb->dout_t,
                          nqv, dP,  nqv};
    gemm_d(&tp, 1.0f, c->mode);
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
            /* dS = scale · P ∘ (dP - D) (∘ (1 - tanh²) under a cap), exactly
             * 0 where P is 0. */
            vf ds = v_mul(v_mul(sc, p), v_sub(dp, dv));
            if (cap) ds = v_mul(ds, v_load(w->dcap + o));
            v_store(dP + o, v_zero_if_eq(ds, p, 0.0f));
            v_store(S + o, pr->dropout ? v_mul(p, v_load(Z + o)) : p);
        }
    }
    if (dv_acc) {
        const tile_prod t = {nk, dvp / VL, nq, S, nqv, 1, qb->dout_r, qb->lddout_r, dv_acc, dvp};
        gemm(&t, 1, 1.0f, mode);
    }
    if (dk_acc) {
        const tile_prod t = {nk, dkp / VL, nq, dP, nqv, 1, qb->qr, qb->ldqr, dk_acc, dkp};
        gemm(&t, 1, 1.0f, mode);
    }
    if (dq_acc) {
        int64_t ldk;
        const float *kb = key_rows(K, c->k_rows, b, hk, j0, nk, Dk, dkp, w->kt, &ldk);
        const tile_prod t = {nq, dkp / VL, nk, dP, 1, nqv, kb, ldk, dq_acc, dkp};
        gemm(&t, 1, 1.0f, mode);
    }
}

/* Query block blk of head (b, h) against its key tiles within [u0, u1):
 * dK/dV shares into dka/dva (rows from key g0; NULL: not wanted) and, when
 * dq is given, the block's dQ rows (written to call->dq). */
static void bwd_block(const kctx *c, const attn_fused_call *call, const bctx *bc, const bws *w,
                      int64_t b, int64_t h, int64_t blk, int64_t u0, int64_t u1, float *dka,
                      float *dva, int64_t g0, float *dq) {
    const attn_problem *pr = c->pr;
    const int64_t i0 = blk * FQ, nq = imin(FQ, pr->Lq - i0);
    int64_t hlo, hhi, t0, t1;
    block_tiles(pr, b, i0, nq, &hlo, &hhi, &t0, &t1);
    t0 = imax(t0, u0), t1 = imin(t1, u1);
    if (t0 >= t1 && !dq) return;
    qblock qb;
    prep_qblock(c, bc, w, b, h, i0, nq, &qb);
    if (dq) memset(dq, 0, (size_t)(nq * c->dkp) * sizeof(float));
    const unsigned char *kv_ok = bc->kv_ok + (b * pr->Hkv + KVH(pr, h)) * bc->kv_ld;
    for (int64_t t = t0; t < t1; t++) {
        const int64_t j0 = imax(t * FK, hlo), j1 = imin((t + 1) * FK, hhi);
        bwd_tile(c, &qb, w, b, h, j0, j1 - j0, kv_ok + j0, dka ? dka + (j0 - g0) * c->dkp : NULL,
                 dva ? dva + (j0 - g0) * c->dvp : NULL, dq);
    }
    if (dq) write_rows(call->dq, b, h, i0, nq, pr->Dk, dq, c->dkp);
}

/* Per-thread backward scratch: tile scratch [tile], then dK and dV
 * accumulators for accn key rows (a head's Lk in one pass, a key group in
 * two); per floats in all. */
typedef struct {
    float *ws;
    int64_t tile, accn, per;
} bscratch;

static bws bwd_thread(const kctx *c, const bscratch *s, float **dka, float **dva) {
    float *base = s->ws + (int64_t)omp_get_thread_num() * s->per;
    *dka = base + s->tile;
    *dva = *dka + rup(s->accn * c->dkp, 16);
    return bwd_carve(c->pr, base, c->dkp, c->dvp);
}

/* One pass per (b, K/V head): every query head of its group (in head
 * order), every query block against every key tile, dK/dV accumulated for
 * the whole group in that one order (the two-pass scheme's too). */
static void bwd_one_pass(const kctx *c, const attn_fused_call *call, const bctx *bc,
                         const bscratch *s) {
    const attn_problem *pr = c->pr;
    const int64_t Hk = pr->Hkv, G = pr->group, Lk = pr->Lk, nqb = (pr->Lq + FQ - 1) / FQ;
#pragma omp parallel num_threads(pr->threads)
    {
        const unsigned fpm = attn_fp_enter();
#pragma omp for schedule(dynamic, 1)
        for (int64_t bh = 0; bh < pr->B * Hk; bh++) {
            float *dka, *dva;
            const bws w = bwd_thread(c, s, &dka, &dva);
            const int64_t b = bh / Hk, hk = bh % Hk;
            memset(dka, 0, (size_t)(Lk * c->dkp) * sizeof(float));
            memset(dva, 0, (size_t)(Lk * c->dvp) * sizeof(float));
            for (int64_t h = hk * G; h < (hk + 1) * G; h++)
                for (int64_t blk = 0; blk < nqb; blk++)
                    bwd_block(c, call, bc, &w, b, h, blk, 0, INT64_MAX, dka, dva, 0, w.dq);
            write_rows(call->dk, b, hk, 0, Lk, pr->Dk, dka, c->dkp);
            write_rows(call->dv, b, hk, 0, Lk, pr->Dv, dva, c->dvp);
        }
        attn_fp_leave(fpm);
    }
}

/* Two passes: dK, dV by (K/V head, group of KGROUP key tiles; the query
 * heads of its group in head order), then dQ by (query head, query block). */
static void bwd_two_pass(const kctx *c, const attn_fused_call *call, const bctx *bc,
                         const bscratch *s) {
    const attn_problem *pr = c->pr;
    const int64_t H = pr->H, Hk = pr->Hkv, G = pr->group, Lk = pr->Lk, nqb = (pr->Lq + FQ - 1) / FQ;
    const int64_t ntile = (Lk + FK - 1) / FK, ngrp = (ntile + KGROUP - 1) / KGROUP;
#pragma omp parallel num_threads(pr->threads)
    {
        const unsigned fpm = attn_fp_enter();
#pragma omp for schedule(dynamic, 1)
        for (int64_t it = 0; it < pr->B * Hk * ngrp; it++) {
            float *dka, *dva;
            const bws w = bwd_thread(c, s, &dka, &dva);
            const int64_t bh = it / ngrp, g = it % ngrp, b = bh / Hk, hk = bh % Hk;
            const int64_t g0 = g * KGROUP * FK, g1 = imin(Lk, g0 + KGROUP * FK);
            memset(dka, 0, (size_t)((g1 - g0) * c->dkp) * sizeof(float));
            memset(dva, 0, (size_t)((g1 - g0) * c->dvp) * sizeof(float));
            for (int64_t h = hk * G; h < (hk + 1) * G; h++)
                for (int64_t blk = 0; blk < nqb; blk++)
                    bwd_block(c, call, bc, &w, b, h, blk, g * KGROUP, imin(ntile, (g + 1) * KGROUP),
                              dka, dva, g0, NULL);
            write_rows(call->dk, b, hk, g0, g1 - g0, pr->Dk, dka, c->dkp);
            write_rows(call->dv, b, hk, g0, g1 - g0, pr->Dv, dva, c->dvp);
        }
        attn_fp_leave(fpm);
    }
#pragma omp parallel num_threads(pr->threads)
    {
        const unsigned fpm = attn_fp_enter();
#pragma omp for schedule(dynamic, 1)
        for (int64_t it = 0; it < pr->B * H * nqb; it++) {
            float *dka, *dva;
            const bws w = bwd_thread(c, s, &dka, &dva);
            const int64_t bh = it / nqb, blk = nqb - 1 - it % nqb;
            bwd_block(c, call, bc, &w, bh / H, bh % H, blk, 0, INT64_MAX, NULL, NULL, 0, w.dq);
        }
        attn_fp_leave(fpm);
    }
}

static attn_status bwd_backward(const kctx *c, const attn_fused_call *call, attn_error *err) {
    const attn_problem *pr = c->pr;
    unsigned char *ok = malloc((size_t)(pr->B * pr->Hkv * pr->Lk) + 1);
    if (!ok) return attn_fail(err, ATTN_ERR_NOMEM, "out of memory for the keys' finite flags");
    kv_finite(c->k, c->v, pr->B, pr->Hkv, pr->Lk, pr->Dk, pr->Dv, pr->threads, ok);
    const bctx bc = {call->out, call->dout, call->lse_in, pr->Lq, ok, pr->Lk};
    const int one = attn_fused_bwd_one_pass(pr);
    bscratch s;
    s.tile = bwd_tile_scratch(pr, c->dkp, c->dvp);
    s.accn = one ? pr->Lk : KGROUP * FK;
    s.per = s.tile + rup(s.accn * c->dkp, 16) + rup(s.accn * c->dvp, 16);
    s.ws = falloc(pr->threads * s.per);
    if (!s.ws) {
        free(ok);
        return attn_fail(err, ATTN_ERR_NOMEM, "out of memory for %d x %lld scratch floats",
                         pr->threads, (long long)s.per);
    }
    if (one)
        bwd_one_pass(c, call, &bc, &s);
    else
        bwd_two_pass(c, call, &bc, &s);
    free(s.ws);
    free(ok);
    return ATTN_OK;
}

#endif
