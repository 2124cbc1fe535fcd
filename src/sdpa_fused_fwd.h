/* The fused forward for Lq > FUSED_DECODE_MAXLQ (part of
 * sdpa_fused_template.h): blocks of FQ query rows, tiles of FK keys,
 * online softmax with O kept unnormalised. */
#ifndef ATTN_SDPA_FUSED_FWD_H
#define ATTN_SDPA_FUSED_FWD_H

#include "sdpa_fused_helpers.h"
#include "sdpa_fused_ukr.h"

/* Tiles [t0, t1) of the key grid that query block blk touches. */
static void block_tiles(const attn_problem *pr, int64_t b, int64_t i0, int64_t nq, int64_t *hlo,
                        int64_t *hhi, int64_t *t0, int64_t *t1) {
    block_hull(pr, b, i0, nq, hlo, hhi);
    *t0 = *hlo / FK;
    *t1 = *hhi > *hlo ? (*hhi + FK - 1) / FK : *t0;
}

/* Query heads per block (attn_fused_gqa_pack): a block holds the same FQ
 * query rows of P heads of one group along its lanes. */
static int64_t fwd_pack(const attn_problem *pr) {
    return attn_fused_gqa_pack(pr, FQ, (pr->Lq + FQ - 1) / FQ);
}

/* Per-thread forward scratch, in floats. */
static int64_t fwd_scratch(const attn_problem *pr, int64_t dvp) {
    const int64_t nl = fwd_pack(pr) * FQ;
    return rup(pr->Dk * nl, 16) + rup(FK * nl, 16) + rup(nl * dvp, 16) + rup(FK * dvp, 16) +
           4 * rup(nl, 16) + 64;
}

/* One query block in flight: rows [i0, i0 + nq) of query heads
 * [h, h + np) (one K/V head's), head g's rows in lanes [g·nqv, g·nqv + nq)
 * (nqv = rup(nq, VL)), nl = np·nqv lanes (nvl vectors); its keys [hlo, hhi)
 * in tiles [t0, t1). Scratch:
 *   qt [Dk][nl] Qᵀ   S [FK][nl] a tile of Sᵀ, then P   O [nl][dvp] (row = lane)
 *   vt [FK][dvp] packed V rows   m, l, al [nl] max, sum, rescale per lane */
typedef struct {
    int64_t b, h, np, i0, nq, nqv, nl, nvl, hlo, hhi, t0, t1;
    float *qt, *S, *O, *vt, *m, *l, *al;
} fblock;

static void fwd_block_init(const kctx *c, float *ws, int64_t b, int64_t h, int64_t np, int64_t i0,
                           int64_t nq, fblock *f) {
    const attn_problem *pr = c->pr;
    f->b = b, f->h = h, f->np = np, f->i0 = i0, f->nq = nq;
    f->nqv = rup(nq, VL), f->nl = np * f->nqv, f->nvl = f->nl / VL;
    f->qt = carve(&ws, pr->Dk * f->nl), f->S = carve(&ws, FK * f->nl);
    f->O = carve(&ws, f->nl * c->dvp), f->vt = carve(&ws, FK * c->dvp);
    f->m = carve(&ws, f->nl), f->l = carve(&ws, f->nl), f->al = carve(&ws, f->nl);
    for (int64_t g = 0; g < np; g++)
        pack_transposed(f->qt + g * f->nqv, f->nl, c->q, b, h + g, i0, nq, pr->Dk);
    block_tiles(pr, b, i0, nq, &f->hlo, &f->hhi, &f->t0, &f->t1);
}

/* S = scale·K·Qᵀ for keys [j0, j0 + nk) of the block (K/V head KVH(h)),
 * soft-capped and ALiBi-biased, masked, each head's lanes by its rules. */
static void fwd_scores(const kctx *c, const fblock *f, int64_t j0, int64_t nk) {
    const attn_problem *pr = c->pr;
    const attn_tensor *K = c->k;
    const tile_prod t = {nk,           f->nvl,       pr->Dk, row_of(K, f->b, KVH(pr, f->h), j0),
                         K->stride[2], K->stride[3], f->qt,  f->nl,
                         f->S,         f->nl};
    gemm_d(&t, pr->scale, c->mode);
    for (int64_t g = 0; g < f->np; g++) {
        float *S = f->S + g * f->nqv;
        if (attn_has_score_variants(pr))
            variants_tile(pr, S, f->nl, f->h + g, f->i0, f->nq, j0, nk, NULL);
        mask_tile(pr, S, f->nl, f->b, f->h + g, f->i0, f->nq, j0, nk);
    }
}

/* Online softmax over a tile (lanes = query rows): S becomes exp(S - m_new),
 * l and m are updated, al holds exp(m_old - m_new). Returns nonzero when
 * some row's max moved (its O must be rescaled). */
static int fwd_softmax_tile(const fblock *f, int64_t nk) {
    const int64_t nl = f->nl;
    for (int64_t vq = 0; vq < f->nvl; vq++) {
        const vf mold = v_load(f->m + vq * VL);
        /* four chains: one max chain is bound by its latency */
        vf m0 = mold, m1 = mold, m2 = mold, m3 = mold;
        int64_t jm = 0;
        for (; jm + 4 <= nk; jm += 4) {
            const float *s = f->S + jm * nl + vq * VL;
            m0 = v_max(v_load(s), m0), m1 = v_max(v_load(s + nl), m1);
            m2 = v_max(v_load(s + 2 * nl), m2), m3 = v_max(v_load(s + 3 * nl), m3);
        }
        for (; jm < nk; jm++) m0 = v_max(v_load(f->S + jm * nl + vq * VL), m0);
        const vf mx = v_max(v_max(m0, m1), v_max(m2, m3));
        const vf mu = v_zero_if_eq(mx, mx, kNegInf);
        const vf alpha = v_exp(v_sub(mold, mu));
        vf sum = v_zero();
        for (int64_t j = 0; j < nk; j++) {
            float *s = f->S + j * nl + vq * VL;
            const vf p = v_exp(v_sub(v_load(s), mu));
            v_store(s, p);
            sum = v_add(sum, p);
        }
        v_store(f->l + vq * VL, v_add(v_mul(v_load(f->l + vq * VL), alpha), sum));
        v_store(f->m + vq * VL, mx);
        v_store(f->al + vq * VL, alpha);
    }
    int moved = 0;
    for (int64_t g = 0; g < f->np; g++)
        for (int64_t i = 0; i < f->nq; i++) moved |= f->al[g * f->nqv + i] != 1.0f;
    return moved;
}

/* One key tile [j0, j0 + nk) into the block's running (m, l, O). */
static void fwd_tile(const kctx *c, const fblock *f, int64_t j0, int64_t nk, int mode) {
    const attn_problem *pr = c->pr;
    const int64_t dvp = c->dvp;
    fwd_scores(c, f, j0, nk);
    const int moved = fwd_softmax_tile(f, nk);
    if (pr->dropout)
        for (int64_t g = 0; g < f->np; g++)
            dropout_tile(pr, f->S + g * f->nqv, f->nl, f->b, f->h + g, f->i0, f->nq, j0, nk, 1);
    if (moved)
        for (int64_t g = 0; g < f->np; g++)
            for (int64_t i = g * f->nqv; i < g * f->nqv + f->nq; i++) {
                if (f->al[i] == 1.0f) continue;
                const vf a = v_set1(f->al[i]);
                float *o = f->O + i * dvp;
                for (int64_t d = 0; d < dvp; d += VL) v_store(o + d, v_mul(v_load(o + d), a));
            }
    int64_t ldv;
    const float *vb = key_rows(c->v, c->v_rows, f->b, KVH(pr, f->h), j0, nk, pr->Dv, dvp, f->vt, &ldv);
    /* rows up to the last head's last: the padding lanes between heads hold P = 0 */
    const tile_prod t = {(f->np - 1) * f->nqv + f->nq, dvp / VL, nk, f->S, 1, f->nl, vb, ldv, f->O,
                         dvp};
    gemm(&t, 1, 1.0f, mode);
}

/* Nonzero when a row with a finite sum has a non-finite output: a zero
 * weight met a non-finite V entry. */
static int fwd_poisoned(const kctx *c, const fblock *f) {
    vf bad = v_zero();
    for (int64_t g = 0; g < f->np; g++)
        for (int64_t i = g * f->nqv; i < g * f->nqv + f->nq; i++)
            if (f->l[i] > 0.0f)
                for (int64_t d = 0; d < c->dvp; d += VL)
                    bad = v_fma(v_load(f->O + i * c->dvp + d), v_zero(), bad);
    return v_hsum(bad) != 0.0f; /* NaN iff some entry was NaN or Inf */
}

/* Head g's rows: out = O / l and lse per row (lse_out: the head's), the
 * head's sink (if any) joining the sum (attn_sink_fold); m and al become
 * the max and 1/sum the weights use. */
static void fwd_finish(const kctx *c, const fblock *f, int64_t g, const attn_tensor *out,
                       float *lse_out) {
    const int64_t Dv = c->pr->Dv, so = out->stride[3], h = f->h + g;
    const float sink = c->pr->sinks ? c->pr->sinks[h] : -INFINITY;
    for (int64_t i = 0; i < f->nq; i++) {
        const int64_t r = g * f->nqv + i; /* the row's lane */
        float *o = row_mut(out, f->b, h, f->i0 + i);
        const float L = f->l[r];
        float M, il, ls;
        const float inv = attn_sink_fold(f->m[r], L, sink, &M, &il, &ls); /* NaN: poisoned row */
        const float *src = f->O + r * c->dvp;
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
        if (lse_out) lse_out[i] = ls;
        f->m[r] = M;
        f->al[r] = il;
    }
}

/* Exact weights [nq][Lk] of each head (head g's at weights + g·whs) in a
 * second pass over the same tiles: exp(s - m) / l, which is exp(s - lse)
 * without the rounding of lse (at |s| ~ 1e4 the rounding of lse alone
 * would cost 1e-4 relative). */
static void fwd_weights(const kctx *c, const fblock *f, float *weights, int64_t whs) {
    const int64_t Lk = c->pr->Lk, nl = f->nl;
    for (int64_t r = 0; r < nl; r++) {
        if (r % f->nqv >= f->nq) f->al[r] = 0.0f, f->m[r] = 0.0f;
        if (f->m[r] == -INFINITY) f->m[r] = 0.0f;
    }
    for (int64_t g = 0; g < f->np; g++)
        for (int64_t i = 0; i < f->nq; i++) {
            float *w = weights + g * whs + i * Lk;
            for (int64_t j = 0; j < f->hlo; j++) w[j] = 0.0f;
            for (int64_t j = f->hhi; j < Lk; j++) w[j] = 0.0f;
        }
    for (int64_t t = f->t0; t < f->t1; t++) {
        const int64_t j0 = imax(t * FK, f->hlo), j1 = imin((t + 1) * FK, f->hhi), nk = j1 - j0;
        fwd_scores(c, f, j0, nk);
        for (int64_t vq = 0; vq < f->nvl; vq++) {
            const vf mv = v_load(f->m + vq * VL), iv = v_load(f->al + vq * VL);
            for (int64_t j = 0; j < nk; j++) {
                float *s = f->S + j * nl + vq * VL;
                const vf x = v_load(s);
                v_store(s, v_zero_if_eq(v_mul(v_exp(v_sub(x, mv)), iv), x, kNegInf));
            }
        }
        for (int64_t g = 0; g < f->np; g++)
            for (int64_t i = 0; i < f->nq; i++) {
                float *w = weights + g * whs + i * Lk + j0;
                for (int64_t j = 0; j < nk; j++) w[j] = f->S[j * nl + g * f->nqv + i];
            }
    }
}

/* One block of query rows [i0, i0 + nq) of query heads [h, h + np) of one
 * group: the tiles with the own kernel, then (only if a row came out
 * poisoned) again with zero-skipping products, then out, lse and the
 * weights (head g's lse at lse_out + g·lhs, weights at weights + g·whs). */
static void fwd_block(const kctx *c, float *ws, int64_t b, int64_t h, int64_t np, int64_t i0,
                      int64_t nq, const attn_tensor *out, float *lse_out, int64_t lhs,
                      float *weights, int64_t whs) {
    fblock f;
    fwd_block_init(c, ws, b, h, np, i0, nq, &f);
    for (int safe = 0; safe < 2; safe++) {
        for (int64_t i = 0; i < f.nl; i++) f.m[i] = -INFINITY, f.l[i] = 0.0f;
        memset(f.O, 0, (size_t)(f.nl * c->dvp) * sizeof(float));
        for (int64_t t = f.t0; t < f.t1; t++) {
            const int64_t j0 = imax(t * FK, f.hlo), j1 = imin((t + 1) * FK, f.hhi);
            fwd_tile(c, &f, j0, j1 - j0, safe ? TILE_SAFE : c->mode);
        }
        if (safe || !fwd_poisoned(c, &f)) break;
    }
    for (int64_t g = 0; g < np; g++) fwd_finish(c, &f, g, out, lse_out ? lse_out + g * lhs : NULL);
    if (weights) fwd_weights(c, &f, weights, whs);
}

/* The forward over all (b, stacked heads, query block) items. */
static attn_status fwd_forward(const kctx *c, const attn_fused_call *call, attn_error *err) {
    const attn_problem *pr = call->pr;
    const int64_t B = pr->B, H = pr->H, Lq = pr->Lq, Lk = pr->Lk, P = fwd_pack(pr), HP = H / P;
    const int64_t nqb = (Lq + FQ - 1) / FQ, items = B * HP * nqb;
    const int nt = pr->threads;
    const int64_t per = fwd_scratch(pr, c->dvp);
    float *ws = call->ws ? call->ws : falloc(nt * per);
    if (!ws)
        return attn_fail(err, ATTN_ERR_NOMEM, "out of memory for %d x %lld scratch floats", nt,
                         (long long)per);
#pragma omp parallel num_threads(nt)
    {
        const unsigned fpm = attn_fp_enter();
#pragma omp for schedule(dynamic, 1)
        for (int64_t it = 0; it < items; it++) {
            /* Last blocks of a head first: under a causal mask they are the
             * longest, so the dynamic schedule ends on short ones. */
            const int64_t bp = it / nqb, blk = nqb - 1 - it % nqb, b = bp / HP, h = bp % HP * P;
            const int64_t bh = b * H + h, i0 = blk * FQ, nq = imin(FQ, Lq - i0);
            fwd_block(c, ws + (int64_t)omp_get_thread_num() * per, b, h, P, i0, nq, call->out,
                      call->lse ? call->lse + bh * Lq + i0 : NULL, Lq,
                      call->weights ? call->weights + (bh * Lq + i0) * Lk : NULL, Lq * Lk);
        }
        attn_fp_leave(fpm);
    }
    if (!call->ws) free(ws);
    return ATTN_OK;
}

#endif
