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

/* Per-thread forward scratch, in floats. */
static int64_t fwd_scratch(const attn_problem *pr, int64_t dvp) {
    return rup(pr->Dk * FQ, 16) + rup(FK * FQ, 16) + rup(FQ * dvp, 16) + rup(FK * dvp, 16) +
           4 * rup(FQ, 16) + 64;
}

/* One query block of head (b, h) in flight: rows [i0, i0 + nq), lanes nqv
 * (nvq vectors); its keys [hlo, hhi) in tiles [t0, t1). Scratch:
 *   qt [Dk][nqv] Qᵀ   S [FK][nqv] a tile of Sᵀ, then P   O [nq][dvp]
 *   vt [FK][dvp] packed V rows   m, l, al [nqv] max, sum, rescale per row */
typedef struct {
    int64_t b, h, i0, nq, nqv, nvq, hlo, hhi, t0, t1;
    float *qt, *S, *O, *vt, *m, *l, *al;
} fblock;

static void fwd_block_init(const kctx *c, float *ws, int64_t b, int64_t h, int64_t i0, int64_t nq,
                           fblock *f) {
    const attn_problem *pr = c->pr;
    f->b = b, f->h = h, f->i0 = i0, f->nq = nq;
    f->nqv = rup(nq, VL), f->nvq = f->nqv / VL;
    f->qt = carve(&ws, pr->Dk * FQ), f->S = carve(&ws, FK * FQ), f->O = carve(&ws, FQ * c->dvp);
    f->vt = carve(&ws, FK * c->dvp), f->m = carve(&ws, FQ), f->l = carve(&ws, FQ);
    f->al = carve(&ws, FQ);
    pack_transposed(f->qt, f->nqv, c->q, b, h, i0, nq, pr->Dk);
    block_tiles(pr, b, i0, nq, &f->hlo, &f->hhi, &f->t0, &f->t1);
}

/* S = scale·K·Qᵀ for keys [j0, j0 + nk) of the block (K/V head KVH(h)),
 * soft-capped and ALiBi-biased, masked. */
static void fwd_scores(const kctx *c, const fblock *f, int64_t j0, int64_t nk) {
    const attn_problem *pr = c->pr;
    const attn_tensor *K = c->k;
    const tile_prod t = {nk,           f->nvq,       pr->Dk, row_of(K, f->b, KVH(pr, f->h), j0),
                         K->stride[2], K->stride[3], f->qt,  f->nqv,
                         f->S,         f->nqv};
    gemm_d(&t, pr->scale, c->mode);
    if (attn_has_score_variants(pr)) variants_tile(pr, f->S, f->nqv, f->h, f->i0, f->nq, j0, nk, NULL);
    mask_tile(pr, f->S, f->nqv, f->b, f->h, f->i0, f->nq, j0, nk);
}

/* Online softmax over a tile (lanes = query rows): S becomes exp(S - m_new),
 * l and m are updated, al holds exp(m_old - m_new). Returns nonzero when
 * some row's max moved (its O must be rescaled). */
static int fwd_softmax_tile(const fblock *f, int64_t nk) {
    const int64_t nqv = f->nqv;
    for (int64_t vq = 0; vq < f->nvq; vq++) {
        const vf mold = v_load(f->m + vq * VL);
        vf mx = mold;
        for (int64_t j = 0; j < nk; j++) mx = v_max(v_load(f->S + j * nqv + vq * VL), mx);
        const vf mu = v_zero_if_eq(mx, mx, kNegInf);
        const vf alpha = v_exp(v_sub(mold, mu));
        vf sum = v_zero();
        for (int64_t j = 0; j < nk; j++) {
            float *s = f->S + j * nqv + vq * VL;
            const vf p = v_exp(v_sub(v_load(s), mu));
            v_store(s, p);
            sum = v_add(sum, p);
        }
        v_store(f->l + vq * VL, v_add(v_mul(v_load(f->l + vq * VL), alpha), sum));
        v_store(f->m + vq * VL, mx);
        v_store(f->al + vq * VL, alpha);
    }
    int moved = 0;
    for (int64_t i = 0; i < f->nq; i++) moved |= f->al[i] != 1.0f;
    return moved;
}

/* One key tile [j0, j0 + nk) into the block's running (m, l, O). */
static void fwd_tile(const kctx *c, const fblock *f, int64_t j0, int64_t nk, int mode) {
    const attn_problem *pr = c->pr;
    const int64_t dvp = c->dvp;
    fwd_scores(c, f, j0, nk);
    const int moved = fwd_softmax_tile(f, nk);
    if (pr->dropout) dropout_tile(pr, f->S, f->nqv, f->b, f->h, f->i0, f->nq, j0, nk, 1);
    if (moved)
        for (int64_t i = 0; i < f->nq; i++) {
            if (f->al[i] == 1.0f) continue;
            const vf a = v_set1(f->al[i]);
            float *o = f->O + i * dvp;
            for (int64_t d = 0; d < dvp; d += VL) v_store(o + d, v_mul(v_load(o + d), a));
        }
    int64_t ldv;
    const float *vb = key_rows(c->v, c->v_rows, f->b, KVH(pr, f->h), j0, nk, pr->Dv, dvp, f->vt, &ldv);
    const tile_prod t = {f->nq, dvp / VL, nk, f->S, 1, f->nqv, vb, ldv, f->O, dvp};
    gemm(&t, 1, 1.0f, mode);
}

/* Nonzero when a row with a finite sum has a non-finite output: a zero
 * weight met a non-finite V entry. */
static int fwd_poisoned(const kctx *c, const fblock *f) {
    vf bad = v_zero();
    for (int64_t i = 0; i < f->nq; i++)
        if (f->l[i] > 0.0f)
            for (int64_t d = 0; d < c->dvp; d += VL)
                bad = v_fma(v_load(f->O + i * c->dvp + d), v_zero(), bad);
    return v_hsum(bad) != 0.0f; /* NaN iff some entry was NaN or Inf */
}

/* out = O / l and lse per row, the head's sink (if any) joining the sum
 * (attn_sink_fold); m and al become the max and 1/sum the weights use. */
static void fwd_finish(const kctx *c, const fblock *f, const attn_tensor *out, float *lse_out) {
    const int64_t Dv = c->pr->Dv, so = out->stride[3];
    const float sink = c->pr->sinks ? c->pr->sinks[f->h] : -INFINITY;
    for (int64_t i = 0; i < f->nq; i++) {
        float *o = row_mut(out, f->b, f->h, f->i0 + i);
        const float L = f->l[i];
        float M, il, ls;
        const float inv = attn_sink_fold(f->m[i], L, sink, &M, &il, &ls); /* NaN: poisoned row */
        const float *src = f->O + i * c->dvp;
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
        f->m[i] = M;
        f->al[i] = il;
    }
}

/* Exact weights [nq][Lk] in a second pass over the same tiles:
 * exp(s - m) / l, which is exp(s - lse) without the rounding of lse (at
 * |s| ~ 1e4 the rounding of lse alone would cost 1e-4 relative). */
static void fwd_weights(const kctx *c, const fblock *f, float *weights) {
    const int64_t Lk = c->pr->Lk, nqv = f->nqv;
    for (int64_t i = 0; i < nqv; i++) {
        if (i >= f->nq) f->al[i] = 0.0f, f->m[i] = 0.0f;
        if (f->m[i] == -INFINITY) f->m[i] = 0.0f;
    }
    for (int64_t i = 0; i < f->nq; i++) {
        float *w = weights + i * Lk;
        for (int64_t j = 0; j < f->hlo; j++) w[j] = 0.0f;
        for (int64_t j = f->hhi; j < Lk; j++) w[j] = 0.0f;
    }
    for (int64_t t = f->t0; t < f->t1; t++) {
        const int64_t j0 = imax(t * FK, f->hlo), j1 = imin((t + 1) * FK, f->hhi), nk = j1 - j0;
        fwd_scores(c, f, j0, nk);
        for (int64_t vq = 0; vq < f->nvq; vq++) {
            const vf mv = v_load(f->m + vq * VL), iv = v_load(f->al + vq * VL);
            for (int64_t j = 0; j < nk; j++) {
                float *s = f->S + j * nqv + vq * VL;
                const vf x = v_load(s);
                v_store(s, v_zero_if_eq(v_mul(v_exp(v_sub(x, mv)), iv), x, kNegInf));
            }
        }
        for (int64_t i = 0; i < f->nq; i++) {
            float *w = weights + i * Lk + j0;
            for (int64_t j = 0; j < nk; j++) w[j] = f->S[j * nqv + i];
        }
    }
}

/* One block of query rows [i0, i0 + nq) of head (b, h): the tiles with the
 * own kernel, then (only if a row came out poisoned) again with
 * zero-skipping products, then out, lse and the weights. */
static void fwd_block(const kctx *c, float *ws, int64_t b, int64_t h, int64_t i0, int64_t nq,
                      const attn_tensor *out, float *lse_out, float *weights) {
    fblock f;
    fwd_block_init(c, ws, b, h, i0, nq, &f);
    for (int safe = 0; safe < 2; safe++) {
        for (int64_t i = 0; i < f.nqv; i++) f.m[i] = -INFINITY, f.l[i] = 0.0f;
        memset(f.O, 0, (size_t)(nq * c->dvp) * sizeof(float));
        for (int64_t t = f.t0; t < f.t1; t++) {
            const int64_t j0 = imax(t * FK, f.hlo), j1 = imin((t + 1) * FK, f.hhi);
            fwd_tile(c, &f, j0, j1 - j0, safe ? TILE_SAFE : c->mode);
        }
        if (safe || !fwd_poisoned(c, &f)) break;
    }
    fwd_finish(c, &f, out, lse_out);
    if (weights) fwd_weights(c, &f, weights);
}

/* The forward over all (b, h, query block) items. */
static attn_status fwd_forward(const kctx *c, const attn_fused_call *call, attn_error *err) {
    const attn_problem *pr = call->pr;
    const int64_t B = pr->B, H = pr->H, Lq = pr->Lq, Lk = pr->Lk;
    const int64_t nqb = (Lq + FQ - 1) / FQ, items = B * H * nqb;
    const int nt = pr->threads;
    const int64_t per = fwd_scratch(pr, c->dvp);
    float *ws = call->ws ? call->ws : falloc(nt * per);
    if (!ws)
        return attn_fail(err, ATTN_ERR_NOMEM, "out of memory for %d x %lld scratch floats", nt,
                         (long long)per);
#pragma omp parallel for num_threads(nt) schedule(dynamic, 1)
    for (int64_t it = 0; it < items; it++) {
        /* Last blocks of a head first: under a causal mask they are the
         * longest, so the dynamic schedule ends on short ones. */
        const int64_t bh = it / nqb, blk = nqb - 1 - it % nqb, b = bh / H, h = bh % H;
        const int64_t i0 = blk * FQ, nq = imin(FQ, Lq - i0);
        fwd_block(c, ws + (int64_t)omp_get_thread_num() * per, b, h, i0, nq, call->out,
                  call->lse ? call->lse + bh * Lq + i0 : NULL,
                  call->weights ? call->weights + (bh * Lq + i0) * Lk : NULL);
    }
    if (!call->ws) free(ws);
    return ATTN_OK;
}

#endif
