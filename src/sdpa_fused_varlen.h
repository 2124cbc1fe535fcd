/* Packed variable-length calls (part of sdpa_fused_template.h). Sequence s
 * is the padded problem of one batch row over views of its rows
 * (attn_varlen_seq, attn_varlen_rows), so its tiles start at its own first
 * key and never cross into a neighbour: the work is Σ Lq_s·Lk_s. Every
 * (sequence, head, query block) of the call is a work item of one parallel
 * region, run by the padded path's fwd_block / bwd_block. Items are handed
 * out longest sequence first (the dynamic schedule then ends on short ones);
 * each item writes its own rows, so results do not depend on the order or
 * the thread count. A sequence of Lq <= FUSED_DECODE_MAXLQ goes through the
 * block kernels too (the decode kernel's items are whole calls). */
#ifndef ATTN_SDPA_FUSED_VARLEN_H
#define ATTN_SDPA_FUSED_VARLEN_H

#include "sdpa_fused_helpers.h"
#include "sdpa_fused_fwd.h"
#include "sdpa_fused_dec.h"
#include "sdpa_fused_bwd.h"

typedef struct {
    attn_problem pr; /* one batch row, dropout counters of row s */
    attn_tensor q, k, v, out, dout, dq, dk, dv;
    attn_fused_call call; /* the sequence's views (bwd_block writes call.dq) */
    kctx c;
    bctx bc;
    int64_t q0, nqb, ngrp; /* first query row, query blocks, key groups (two-pass) */
} vseq;

typedef struct {
    int64_t cost, s;
} vorder;

static int vorder_cmp(const void *a, const void *b) {
    const vorder *x = a, *y = b;
    if (x->cost != y->cost) return x->cost > y->cost ? -1 : 1;
    return (x->s > y->s) - (x->s < y->s);
}

/* The sequences of a call and their visiting order (ord[r]: the r-th
 * sequence, by decreasing Lq·Lk, ties by index). NULL on failure. */
static vseq *varlen_seqs(const kctx *c0, const attn_fused_call *call, int64_t **ord) {
    const attn_varlen *varlen = call->varlen;
    const attn_problem *pr = call->pr;
    const int64_t n = varlen->n;
    vseq *sq = malloc((size_t)n * sizeof *sq);
    vorder *o = malloc((size_t)n * sizeof *o);
    *ord = malloc((size_t)n * sizeof **ord);
    if (!sq || !o || !*ord) {
        free(sq), free(o), free(*ord);
        return NULL;
    }
    for (int64_t s = 0; s < n; s++) {
        vseq *e = &sq[s];
        memset(e, 0, sizeof *e);
        attn_varlen_seq(pr, varlen, s, &e->pr);
        const int64_t q0 = varlen->cu_q[s], k0 = varlen->cu_k[s], nq = e->pr.Lq, nk = e->pr.Lk;
        e->q0 = q0;
        e->nqb = (nq + FQ - 1) / FQ;
        e->ngrp = ((nk + FK - 1) / FK + KGROUP - 1) / KGROUP;
        e->q = attn_varlen_rows(call->q, q0, nq);
        e->k = attn_varlen_rows(call->k, k0, nk);
        e->v = attn_varlen_rows(call->v, k0, nk);
        if (call->out) e->out = attn_varlen_rows(call->out, q0, nq);
        if (call->dout) {
            e->dout = attn_varlen_rows(call->dout, q0, nq);
            e->dq = attn_varlen_rows(call->dq, q0, nq);
            e->dk = attn_varlen_rows(call->dk, k0, nk);
            e->dv = attn_varlen_rows(call->dv, k0, nk);
        }
        e->c = *c0;
        e->c.pr = &e->pr, e->c.q = &e->q, e->c.k = &e->k, e->c.v = &e->v;
        e->call = *call;
        e->call.pr = &e->pr, e->call.q = &e->q, e->call.k = &e->k, e->call.v = &e->v;
        e->call.out = &e->out, e->call.dout = &e->dout;
        e->call.dq = &e->dq, e->call.dk = &e->dk, e->call.dv = &e->dv;
        e->call.varlen = NULL;
        e->bc = (bctx){&e->out, &e->dout, call->lse_in ? call->lse_in + q0 : NULL, pr->Lq,
                       NULL, 0}; /* kv_ok: the backward sets it */
        o[s] = (vorder){nq * nk, s};
    }
    qsort(o, (size_t)n, sizeof *o, vorder_cmp);
    for (int64_t r = 0; r < n; r++) (*ord)[r] = o[r].s;
    free(o);
    return sq;
}

/* Items per head of a sequence in one loop of a varlen call. */
enum { VARLEN_QBLOCKS, VARLEN_HEADS, VARLEN_KGROUPS };
static int64_t varlen_units(const vseq *e, int kind) {
    return kind == VARLEN_QBLOCKS ? e->nqb : kind == VARLEN_HEADS ? 1 : e->ngrp;
}

/* first[r] = items of the sequences before ord[r] (first[n]: all). */
static void varlen_plan(const vseq *sq, const int64_t *ord, int64_t n, int64_t H, int kind,
                        int64_t *first) {
    first[0] = 0;
    for (int64_t r = 0; r < n; r++) first[r + 1] = first[r] + H * varlen_units(&sq[ord[r]], kind);
}

/* The item it of a plan: its sequence, head and unit (block / group). */
static const vseq *varlen_item(const vseq *sq, const int64_t *ord, const int64_t *first, int64_t n,
                               int kind, int64_t it, int64_t *h, int64_t *u) {
    int64_t lo = 0, hi = n; /* the last r with first[r] <= it */
    while (hi - lo > 1) {
        const int64_t mid = (lo + hi) / 2;
        if (first[mid] <= it)
            lo = mid;
        else
            hi = mid;
    }
    const vseq *e = &sq[ord[lo]];
    const int64_t units = varlen_units(e, kind), local = it - first[lo];
    *h = local / units, *u = local % units;
    return e;
}

static attn_status varlen_nomem(attn_error *err, int64_t n) {
    return attn_fail(err, ATTN_ERR_NOMEM, "out of memory for the plan of %lld sequences",
                     (long long)n);
}

static attn_status varlen_forward(const kctx *c0, const attn_fused_call *call, attn_error *err) {
    const attn_problem *pr = call->pr;
    const attn_varlen *varlen = call->varlen;
    const int64_t n = varlen->n, H = pr->H, Tq = pr->Lq;
    const int nt = pr->threads;
    int64_t *ord, *first = malloc((size_t)(n + 1) * sizeof *first);
    vseq *sq = first ? varlen_seqs(c0, call, &ord) : NULL;
    if (!sq) {
        free(first);
        return varlen_nomem(err, n);
    }
    varlen_plan(sq, ord, n, H, VARLEN_QBLOCKS, first);
    const int64_t per = fwd_scratch(pr, c0->dvp);
    float *ws = falloc(nt * per);
    if (!ws) {
        free(first), free(ord), free(sq);
        return attn_fail(err, ATTN_ERR_NOMEM, "out of memory for %d x %lld scratch floats", nt,
                         (long long)per);
    }
#pragma omp parallel num_threads(nt)
    {
        const unsigned fpm = attn_fp_enter();
#pragma omp for schedule(dynamic, 1)
        for (int64_t it = 0; it < first[n]; it++) {
            int64_t h, u;
            const vseq *e = varlen_item(sq, ord, first, n, VARLEN_QBLOCKS, it, &h, &u);
            const int64_t s = e - sq, Lq = e->pr.Lq, Lk = e->pr.Lk;
            const int64_t i0 = (e->nqb - 1 - u) * FQ, nq = imin(FQ, Lq - i0);
            fwd_block(&e->c, ws + (int64_t)omp_get_thread_num() * per, 0, h, 1, i0, nq, &e->out,
                      call->lse ? call->lse + h * Tq + e->q0 + i0 : NULL, 0,
                      call->weights ? call->weights + varlen->weights_at[s] + (h * Lq + i0) * Lk
                                    : NULL,
                      0);
        }
        attn_fp_leave(fpm);
    }
    free(ws), free(first), free(ord), free(sq);
    return ATTN_OK;
}

static attn_status varlen_backward(const kctx *c0, const attn_fused_call *call, attn_error *err) {
    const attn_problem *pr = call->pr;
    const attn_varlen *varlen = call->varlen;
    const int64_t n = varlen->n, H = pr->H, Hk = pr->Hkv, G = pr->group;
    const int one = attn_fused_varlen_one_pass(pr, varlen);
    int64_t *ord, *first = malloc((size_t)(n + 1) * sizeof *first);
    vseq *sq = first ? varlen_seqs(c0, call, &ord) : NULL;
    if (!sq) {
        free(first);
        return varlen_nomem(err, n);
    }
    /* the keys' finite flags of the packed K, V rows: [Hkv, total] */
    const int64_t total = call->k->dim[2];
    unsigned char *ok = malloc((size_t)(Hk * total) + 1);
    if (!ok) {
        free(first), free(ord), free(sq);
        return attn_fail(err, ATTN_ERR_NOMEM, "out of memory for the keys' finite flags");
    }
    kv_finite(call->k, call->v, 1, Hk, total, pr->Dk, pr->Dv, pr->threads, ok);
    int64_t maxk = 0;
    for (int64_t s = 0; s < n; s++) {
        maxk = imax(maxk, sq[s].pr.Lk);
        sq[s].bc.kv_ok = ok + varlen->cu_k[s], sq[s].bc.kv_ld = total;
    }
    bscratch bs;
    bs.tile = bwd_tile_scratch(pr, c0->dkp, c0->dvp);
    bs.accn = one ? maxk : KGROUP * FK;
    bs.per = bs.tile + rup(bs.accn * c0->dkp, 16) + rup(bs.accn * c0->dvp, 16);
    bs.ws = falloc(pr->threads * bs.per);
    if (!bs.ws) {
        free(first), free(ord), free(sq), free(ok);
        return attn_fail(err, ATTN_ERR_NOMEM, "out of memory for %d x %lld scratch floats",
                         pr->threads, (long long)bs.per);
    }
    const int64_t Dk = pr->Dk, Dv = pr->Dv, dkp = c0->dkp, dvp = c0->dvp;
    if (one) { /* as bwd_one_pass, per (sequence, K/V head) */
        varlen_plan(sq, ord, n, Hk, VARLEN_HEADS, first);
#pragma omp parallel num_threads(pr->threads)
        {
            const unsigned fpm = attn_fp_enter();
#pragma omp for schedule(dynamic, 1)
            for (int64_t it = 0; it < first[n]; it++) {
                int64_t hk, u;
                const vseq *e = varlen_item(sq, ord, first, n, VARLEN_HEADS, it, &hk, &u);
                const int64_t Lk = e->pr.Lk;
                float *dka, *dva;
                const bws w = bwd_thread(c0, &bs, &dka, &dva);
                memset(dka, 0, (size_t)(Lk * dkp) * sizeof(float));
                memset(dva, 0, (size_t)(Lk * dvp) * sizeof(float));
                for (int64_t h = hk * G; h < (hk + 1) * G; h++)
                    for (int64_t blk = 0; blk < e->nqb; blk++)
                        bwd_block(&e->c, &e->call, &e->bc, &w, 0, h, blk, 0, INT64_MAX, dka, dva, 0,
                                  w.dq);
                write_rows(&e->dk, 0, hk, 0, Lk, Dk, dka, dkp);
                write_rows(&e->dv, 0, hk, 0, Lk, Dv, dva, dvp);
            }
            attn_fp_leave(fpm);
        }
    } else { /* as bwd_two_pass, per (sequence, K/V head, key group), then query block */
        varlen_plan(sq, ord, n, Hk, VARLEN_KGROUPS, first);
#pragma omp parallel num_threads(pr->threads)
        {
            const unsigned fpm = attn_fp_enter();
#pragma omp for schedule(dynamic, 1)
            for (int64_t it = 0; it < first[n]; it++) {
                int64_t hk, g;
                const vseq *e = varlen_item(sq, ord, first, n, VARLEN_KGROUPS, it, &hk, &g);
                const int64_t Lk = e->pr.Lk, ntile = (Lk + FK - 1) / FK;
                const int64_t g0 = g * KGROUP * FK, g1 = imin(Lk, g0 + KGROUP * FK);
                float *dka, *dva;
                const bws w = bwd_thread(c0, &bs, &dka, &dva);
                memset(dka, 0, (size_t)((g1 - g0) * dkp) * sizeof(float));
                memset(dva, 0, (size_t)((g1 - g0) * dvp) * sizeof(float));
                for (int64_t h = hk * G; h < (hk + 1) * G; h++)
                    for (int64_t blk = 0; blk < e->nqb; blk++)
                        bwd_block(&e->c, &e->call, &e->bc, &w, 0, h, blk, g * KGROUP,
                                  imin(ntile, (g + 1) * KGROUP), dka, dva, g0, NULL);
                write_rows(&e->dk, 0, hk, g0, g1 - g0, Dk, dka, dkp);
                write_rows(&e->dv, 0, hk, g0, g1 - g0, Dv, dva, dvp);
            }
            attn_fp_leave(fpm);
        }
        varlen_plan(sq, ord, n, H, VARLEN_QBLOCKS, first);
#pragma omp parallel num_threads(pr->threads)
        {
            const unsigned fpm = attn_fp_enter();
#pragma omp for schedule(dynamic, 1)
            for (int64_t it = 0; it < first[n]; it++) {
                int64_t h, u;
                const vseq *e = varlen_item(sq, ord, first, n, VARLEN_QBLOCKS, it, &h, &u);
                float *dka, *dva;
                const bws w = bwd_thread(c0, &bs, &dka, &dva);
                bwd_block(&e->c, &e->call, &e->bc, &w, 0, h, e->nqb - 1 - u, 0, INT64_MAX, NULL,
                          NULL, 0, w.dq);
            }
            attn_fp_leave(fpm);
        }
    }
    free(bs.ws), free(first), free(ord), free(sq), free(ok);
    return ATTN_OK;
}

#endif
