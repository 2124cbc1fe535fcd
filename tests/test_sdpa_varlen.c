/* Packed variable-length attention (attn_sdpa_varlen_forward/backward)
 * against independent oracles, sequence by sequence, for every instruction
 * set the CPU runs:
 *   - fp64: ref_oracle.h's forward (out, weights, lse) and grad_util.h's
 *     analytic backward on each sequence's rows alone; FlashAttention's
 *     criterion: the fused error is at most 2x the varlen reference path's
 *     error against fp64, plus a floor of 4·2^-24 (test_sdpa_fused.c);
 *   - the padded path: self-attention sequences copied into a zero-padded
 *     [N, H, maxL, D] batch with key_lengths and the same params run through
 *     attn_sdpa_forward/backward: the rows of each sequence must be bitwise
 *     the varlen fused result (same tiles: each sequence's start at a tile
 *     edge) and within the fp64 bound for the decode kernel (maxL <= 4);
 *   - dropout: the keep mask is read from the PADDED reference path
 *     (gu_dropout_mult over [N, H, maxLq, maxLk]): a varlen call that used
 *     other counters than batch row s (+ dropout_row0) would be off by O(1);
 *   - 1, 2 and 3 threads bitwise identical (with unequal sequences this also
 *     compares the backward's one-pass and two-pass schemes), nothing
 *     written outside the views, empty sequences (Lq or Lk 0), every layout;
 *   - bad arguments (cumulative lengths, batch, masks, shapes) refused with
 *     a status and a message. */
#define _POSIX_C_SOURCE 200112L
#include "grad_util.h"
#include "internal.h" /* test hooks: ISA from the environment again; FUSED_DECODE_MAXLQ */

#define FLOOR (4.0 / 16777216.0)
#define GRAD_SCALE 1e-6
#define SENT 555.5f
#define MAXS 80

static const char *g_isa = "best";
static double g_ratio;

typedef struct {
    const char *name;
    int64_t H, Dk, Dv, n;
    int64_t lq[MAXS], lk[MAXS];
    int self; /* cu_seqlens_k NULL (lk = lq) */
    int lay;  /* GU_* layout of every tensor */
    attn_sdpa_params p;
} vcase;

typedef struct {
    int64_t cq[MAXS + 1], ck[MAXS + 1], Tq, Tk, nw, maxq, maxk;
} vplan;

static vplan plan_of(const vcase *c) {
    vplan v;
    v.cq[0] = v.ck[0] = 0, v.nw = 0, v.maxq = v.maxk = 0;
    for (int64_t s = 0; s < c->n; s++) {
        const int64_t lk = c->self ? c->lq[s] : c->lk[s];
        v.cq[s + 1] = v.cq[s] + c->lq[s];
        v.ck[s + 1] = v.ck[s] + lk;
        v.nw += c->H * c->lq[s] * lk;
        v.maxq = c->lq[s] > v.maxq ? c->lq[s] : v.maxq;
        v.maxk = lk > v.maxk ? lk : v.maxk;
    }
    v.Tq = v.cq[c->n], v.Tk = v.ck[c->n];
    return v;
}

/* Outputs of one varlen forward + backward, gathered [H, T, D]. */
typedef struct {
    gu_view o, dq, dk, dv;
    float *w, *lse;
} vouts;

static void vouts_free(vouts *r) {
    free(r->o.buf), free(r->dq.buf), free(r->dk.buf), free(r->dv.buf), free(r->w), free(r->lse);
}

static int run_varlen(const vcase *c, const vplan *pl, attn_impl impl, int threads,
                      const gu_view *q, const gu_view *k, const gu_view *v, const gu_view *go,
                      vouts *r) {
    r->o = gu_make_view(c->lay, 1, c->H, pl->Tq, c->Dv, SENT);
    r->dq = gu_make_view(c->lay, 1, c->H, pl->Tq, c->Dk, SENT);
    r->dk = gu_make_view(c->lay, 1, c->H, pl->Tk, c->Dk, SENT);
    r->dv = gu_make_view(c->lay, 1, c->H, pl->Tk, c->Dv, SENT);
    r->w = tu_malloc((size_t)pl->nw * sizeof(float));
    r->lse = tu_malloc((size_t)(c->H * pl->Tq) * sizeof(float));
    for (int64_t i = 0; i < pl->nw; i++) r->w[i] = NAN; /* every entry is written */
    for (int64_t i = 0; i < c->H * pl->Tq; i++) r->lse[i] = NAN;
    attn_sdpa_params p = c->p;
    p.impl = impl, p.num_threads = threads;
    const int64_t *ck = c->self ? NULL : pl->ck;
    attn_error err;
    attn_sdpa_info info;
    attn_status st = attn_sdpa_varlen_forward(&q->t, &k->t, &v->t, c->n, pl->cq, ck, &p, &r->o.t,
                                              r->w, r->lse, &info, &err);
    CHECK(st == ATTN_OK, "[%s] %s: varlen forward: %s", g_isa, c->name, err.message);
    if (st) return 0;
    CHECK(info.impl == (impl == ATTN_IMPL_REFERENCE ? ATTN_IMPL_REFERENCE : ATTN_IMPL_FUSED) &&
              (impl == ATTN_IMPL_REFERENCE || strstr(info.reason, "per sequence")),
          "%s: info %d \"%s\"", c->name, (int)info.impl, info.reason);
    st = attn_sdpa_varlen_backward(&q->t, &k->t, &v->t, &r->o.t, r->lse, &go->t, c->n, pl->cq, ck,
                                   &p, &r->dq.t, &r->dk.t, &r->dv.t, NULL, &err);
    CHECK(st == ATTN_OK, "[%s] %s: varlen backward: %s", g_isa, c->name, err.message);
    return st == ATTN_OK;
}

/* Rows [r0, r0 + n) of a [1, H, T, D] view as contiguous doubles [H, n, D]. */
static double *rows_d(const attn_tensor *t, int64_t r0, int64_t n) {
    const int64_t H = t->dim[1], D = t->dim[3];
    double *x = tu_malloc((size_t)(H * n * D) * sizeof(double));
    for (int64_t h = 0; h < H; h++)
        for (int64_t i = 0; i < n; i++)
            for (int64_t d = 0; d < D; d++)
                x[(h * n + i) * D + d] = t->data[tu_off(t, 0, h, r0 + i, d)];
    return x;
}

/* [H, n, D] doubles into rows [r0, r0 + n) of a packed [H, T, D] array. */
static void put_rows(double *dst, int64_t T, const double *src, int64_t H, int64_t r0, int64_t n,
                     int64_t D) {
    for (int64_t h = 0; h < H; h++)
        memcpy(dst + (h * T + r0) * D, src + h * n * D, (size_t)(n * D) * sizeof(double));
}

static void bound(double ef, double er, const char *what, const vcase *c) {
    CHECK(ef <= 2.0 * er + FLOOR, "[%s] %s: %s fused error %.3g > 2 x reference %.3g + floor",
          g_isa, c->name, what, ef, er);
    if (er < 1e-3) {
        const double ratio = ef / (er > FLOOR ? er : FLOOR);
        if (ratio > g_ratio) g_ratio = ratio;
    }
}

/* The padded batch of a self-attention case: sequence s as batch row s
 * (rows beyond its length zero), key_lengths = lengths, same params; its
 * out, lse and gradients compared with the varlen fused result row by row. */
static void against_padded(const vcase *c, const vplan *pl, const gu_view *q, const gu_view *k,
                           const gu_view *v, const gu_view *go, const vouts *f, const double *o64,
                           const double *dq64, double vmax) {
    const int64_t N = c->n, H = c->H, L = pl->maxq, Dk = c->Dk, Dv = c->Dv;
    if (L == 0) return;
    const attn_tensor *src[4] = {&q->t, &k->t, &v->t, &go->t};
    const int64_t dims[4] = {Dk, Dk, Dv, Dv};
    float *pad[4], *po = tu_malloc((size_t)(N * H * L * Dv) * 4),
                   *pl_ = tu_malloc((size_t)(N * H * L) * 4);
    float *pdq = tu_malloc((size_t)(N * H * L * Dk) * 4),
          *pdk = tu_malloc((size_t)(N * H * L * Dk) * 4),
          *pdv = tu_malloc((size_t)(N * H * L * Dv) * 4);
    for (int a = 0; a < 4; a++) {
        const int64_t D = dims[a];
        pad[a] = tu_malloc((size_t)(N * H * L * D) * 4);
        memset(pad[a], 0, (size_t)(N * H * L * D) * 4);
        for (int64_t s = 0; s < N; s++)
            for (int64_t h = 0; h < H; h++)
                for (int64_t i = 0; i < c->lq[s]; i++)
                    for (int64_t d = 0; d < D; d++)
                        pad[a][((s * H + h) * L + i) * D + d] =
                            src[a]->data[tu_off(src[a], 0, h, pl->cq[s] + i, d)];
    }
    attn_tensor tq = attn_tensor_bhld(pad[0], N, H, L, Dk),
                tk = attn_tensor_bhld(pad[1], N, H, L, Dk),
                tv = attn_tensor_bhld(pad[2], N, H, L, Dv),
                tg = attn_tensor_bhld(pad[3], N, H, L, Dv), to = attn_tensor_bhld(po, N, H, L, Dv),
                tdq = attn_tensor_bhld(pdq, N, H, L, Dk), tdk = attn_tensor_bhld(pdk, N, H, L, Dk),
                tdv = attn_tensor_bhld(pdv, N, H, L, Dv);
    attn_sdpa_params p = c->p;
    p.key_lengths = c->lq;
    p.impl = ATTN_IMPL_FUSED;
    attn_error err;
    attn_status st = attn_sdpa_forward(&tq, &tk, &tv, &p, &to, NULL, pl_, NULL, &err);
    if (!st)
        st = attn_sdpa_backward(&tq, &tk, &tv, &to, pl_, &tg, &p, &tdq, &tdk, &tdv, NULL, &err);
    CHECK(st == ATTN_OK, "%s: padded call: %s", c->name, err.message);
    if (st == ATTN_OK) {
        /* element by element: bitwise equal, or (decode kernel) both within
         * the fp64 bound of the varlen result */
        const int bitwise = L > FUSED_DECODE_MAXLQ;
        size_t diff = 0;
        double worst = 0;
        for (int64_t s = 0; s < N; s++)
            for (int64_t h = 0; h < H; h++)
                for (int64_t i = 0; i < c->lq[s]; i++) {
                    const int64_t pr = (s * H + h) * L + i, vr = pl->cq[s] + i;
                    const float *set[4][2] = {{po + pr * Dv, NULL},
                                              {pdq + pr * Dk, NULL},
                                              {pdk + pr * Dk, NULL},
                                              {pdv + pr * Dv, NULL}};
                    const attn_tensor *vt[4] = {&f->o.t, &f->dq.t, &f->dk.t, &f->dv.t};
                    const int64_t D4[4] = {Dv, Dk, Dk, Dv};
                    for (int a = 0; a < 4; a++)
                        for (int64_t d = 0; d < D4[a]; d++) {
                            const float x = set[a][0][d],
                                        y = vt[a]->data[tu_off(vt[a], 0, h, vr, d)];
                            if (bitwise)
                                diff += memcmp(&x, &y, sizeof x) != 0;
                            else if (a < 2) {
                                const double *ref = a == 0 ? o64 : dq64;
                                const double e = fabs(x - ref[(h * pl->Tq + vr) * D4[a] + d]) /
                                                 (a == 0 ? vmax : 1.0);
                                worst = e > worst ? e : worst;
                            }
                        }
                    const float lp = pl_[pr], lv = f->lse[h * pl->Tq + vr];
                    if (bitwise) diff += memcmp(&lp, &lv, sizeof lp) != 0;
                }
        CHECK(diff == 0, "[%s] %s: %zu values differ from the padded path's bits", g_isa, c->name,
              diff);
        CHECK(worst < 1e-4, "[%s] %s: padded decode path off by %.3g", g_isa, c->name, worst);
    }
    for (int a = 0; a < 4; a++) free(pad[a]);
    free(po), free(pl_), free(pdq), free(pdk), free(pdv);
}

static void run_case(const vcase *c, uint64_t seed) {
    const vplan pl = plan_of(c);
    const int64_t H = c->H, Dk = c->Dk, Dv = c->Dv;
    tu_rng rng = tu_seed(seed);
    gu_view q = gu_make_view(c->lay, 1, H, pl.Tq, Dk, 0.0f),
            k = gu_make_view(c->lay, 1, H, pl.Tk, Dk, 0.0f),
            v = gu_make_view(c->lay, 1, H, pl.Tk, Dv, 0.0f),
            go = gu_make_view(c->lay, 1, H, pl.Tq, Dv, 0.0f);
    gu_fill_view(&q, &rng, -2, 2), gu_fill_view(&k, &rng, -2, 2);
    gu_fill_view(&v, &rng, -1, 1), gu_fill_view(&go, &rng, -1, 1);
    vouts ref, f1, f2, f3;
    const int ok = run_varlen(c, &pl, ATTN_IMPL_REFERENCE, 2, &q, &k, &v, &go, &ref) &
                   run_varlen(c, &pl, ATTN_IMPL_FUSED, 1, &q, &k, &v, &go, &f1) &
                   run_varlen(c, &pl, ATTN_IMPL_FUSED, 2, &q, &k, &v, &go, &f2) &
                   run_varlen(c, &pl, ATTN_IMPL_FUSED, 3, &q, &k, &v, &go, &f3);
    if (ok) {
        const vouts *o[2] = {&f2, &f3};
        for (int t = 0; t < 2; t++)
            CHECK(!memcmp(f1.o.buf, o[t]->o.buf, f1.o.n * 4) &&
                      !memcmp(f1.lse, o[t]->lse, (size_t)(H * pl.Tq) * 4) &&
                      !memcmp(f1.w, o[t]->w, (size_t)pl.nw * 4) &&
                      !memcmp(f1.dq.buf, o[t]->dq.buf, f1.dq.n * 4) &&
                      !memcmp(f1.dk.buf, o[t]->dk.buf, f1.dk.n * 4) &&
                      !memcmp(f1.dv.buf, o[t]->dv.buf, f1.dv.n * 4),
                  "[%s] %s: %d threads differ from 1 thread", g_isa, c->name, t + 2);
        CHECK(gu_gaps_touched(&f1.o, SENT) + gu_gaps_touched(&f1.dq, SENT) +
                      gu_gaps_touched(&f1.dk, SENT) + gu_gaps_touched(&f1.dv, SENT) +
                      gu_gaps_touched(&ref.o, SENT) ==
                  0,
              "[%s] %s: wrote outside a view", g_isa, c->name);

        /* fp64, sequence by sequence, assembled in the packed layouts */
        const size_t nO = (size_t)(H * pl.Tq * Dv), nL = (size_t)(H * pl.Tq),
                     nQ = (size_t)(H * pl.Tq * Dk), nK = (size_t)(H * pl.Tk * Dk),
                     nV = (size_t)(H * pl.Tk * Dv);
        double *o64 = tu_malloc(nO * 8), *l64 = tu_malloc(nL * 8),
               *w64 = tu_malloc((size_t)pl.nw * 8 + 8), *dq64 = tu_malloc(nQ * 8),
               *dk64 = tu_malloc(nK * 8), *dv64 = tu_malloc(nV * 8);
        const int drop = c->p.training && c->p.dropout_p > 0.0f;
        double *mpad = NULL;
        if (drop && pl.maxq > 0 && pl.maxk > 0) { /* the padded path's mask, all keys visible */
            attn_sdpa_params pm = c->p;
            pm.causal = 0, pm.use_window = 0, pm.impl = ATTN_IMPL_REFERENCE;
            mpad = tu_malloc((size_t)(c->n * H * pl.maxq * pl.maxk) * 8);
            CHECK(gu_dropout_mult(c->n, H, pl.maxq, pl.maxk, &pm, mpad, NULL) == 0, "%s: mask",
                  c->name);
        }
        int64_t woff = 0;
        for (int64_t s = 0; s < c->n; s++) {
            const int64_t nq = c->lq[s], nk = pl.ck[s + 1] - pl.ck[s], q0 = pl.cq[s], k0 = pl.ck[s];
            const gu_dims d = {1, H, nq, nk, Dk, Dv};
            double *qd = rows_d(&q.t, q0, nq), *kd = rows_d(&k.t, k0, nk),
                   *vd = rows_d(&v.t, k0, nk), *gd = rows_d(&go.t, q0, nq);
            double *od = tu_malloc((size_t)(H * nq * Dv) * 8),
                   *ld = tu_malloc((size_t)(H * nq) * 8),
                   *aq = tu_malloc((size_t)(H * nq * Dk) * 8),
                   *ak = tu_malloc((size_t)(H * nk * Dk) * 8),
                   *av = tu_malloc((size_t)(H * nk * Dv) * 8), *mult = NULL;
            ref_sdpa(1, H, nq, nk, Dk, Dv, qd, kd, vd, &c->p, od, w64 + woff, ld, NULL);
            if (mpad) { /* batch row s of the padded mask */
                mult = tu_malloc((size_t)(H * nq * nk) * 8);
                for (int64_t h = 0; h < H; h++)
                    for (int64_t i = 0; i < nq; i++)
                        for (int64_t j = 0; j < nk; j++)
                            mult[(h * nq + i) * nk + j] =
                                mpad[((s * H + h) * pl.maxq + i) * pl.maxk + j];
                gu_sdpa_fwd(&d, qd, kd, vd, &c->p, mult, od);
            }
            gu_sdpa_bwd(&d, qd, kd, vd, gd, &c->p, mult, aq, ak, av);
            put_rows(o64, pl.Tq, od, H, q0, nq, Dv), put_rows(l64, pl.Tq, ld, H, q0, nq, 1);
            put_rows(dq64, pl.Tq, aq, H, q0, nq, Dk);
            put_rows(dk64, pl.Tk, ak, H, k0, nk, Dk), put_rows(dv64, pl.Tk, av, H, k0, nk, Dv);
            woff += H * nq * nk;
            free(od), free(ld), free(aq), free(ak), free(av), free(mult);
            free(qd), free(kd), free(vd), free(gd);
        }
        const double vmax = tu_maxabs(v.buf, v.n) > 0 ? tu_maxabs(v.buf, v.n) : 1.0;
        float *fo = tu_gather(&f1.o.t), *ro = tu_gather(&ref.o.t), *fq = tu_gather(&f1.dq.t),
              *rq = tu_gather(&ref.dq.t), *fk = tu_gather(&f1.dk.t), *rk = tu_gather(&ref.dk.t),
              *fv = tu_gather(&f1.dv.t), *rv = tu_gather(&ref.dv.t);
        bound(tu_maxdiff(fo, o64, nO) / vmax, tu_maxdiff(ro, o64, nO) / vmax, "out", c);
        bound(tu_maxdiff(f1.w, w64, (size_t)pl.nw), tu_maxdiff(ref.w, w64, (size_t)pl.nw),
              "weights", c);
        bound(tu_maxreldiff1(f1.lse, l64, nL), tu_maxreldiff1(ref.lse, l64, nL), "lse", c);
        bound(gu_relerr_nf(fq, dq64, nQ, GRAD_SCALE), gu_relerr_nf(rq, dq64, nQ, GRAD_SCALE), "dq",
              c);
        bound(gu_relerr_nf(fk, dk64, nK, GRAD_SCALE), gu_relerr_nf(rk, dk64, nK, GRAD_SCALE), "dk",
              c);
        bound(gu_relerr_nf(fv, dv64, nV, GRAD_SCALE), gu_relerr_nf(rv, dv64, nV, GRAD_SCALE), "dv",
              c);
        /* the reference itself: a few fp32 roundings from fp64 */
        CHECK(tu_maxdiff(ro, o64, nO) / vmax < 1e-5, "%s: reference out off fp64", c->name);
        /* a row without keys: out and dq exactly 0, lse -inf */
        size_t bad = 0, empty = 0;
        for (size_t r = 0; r < nL; r++) {
            if (l64[r] != -INFINITY) continue;
            empty++;
            bad += f1.lse[r] != -INFINITY;
            for (int64_t x = 0; x < Dv; x++) bad += fo[r * (size_t)Dv + (size_t)x] != 0.0f;
            for (int64_t x = 0; x < Dk; x++) bad += fq[r * (size_t)Dk + (size_t)x] != 0.0f;
        }
        CHECK(bad == 0, "[%s] %s: %zu entries of %zu empty rows not exactly 0 / -inf", g_isa,
              c->name, bad, empty);
        if (c->self) against_padded(c, &pl, &q, &k, &v, &go, &f1, o64, dq64, vmax);
        free(fo), free(ro), free(fq), free(rq), free(fk), free(rk), free(fv), free(rv);
        free(mpad);
        free(o64), free(l64), free(w64), free(dq64), free(dk64), free(dv64);
        vouts_free(&ref), vouts_free(&f1), vouts_free(&f2), vouts_free(&f3);
    }
    free(q.buf), free(k.buf), free(v.buf), free(go.buf);
}

static vcase mk(const char *name, int64_t H, int64_t Dk, int64_t Dv, int lay, int self, int64_t n,
                const int64_t *lq, const int64_t *lk) {
    vcase c;
    memset(&c, 0, sizeof c);
    c.name = name, c.H = H, c.Dk = Dk, c.Dv = Dv, c.lay = lay, c.self = self, c.n = n;
    for (int64_t s = 0; s < n; s++) c.lq[s] = lq[s], c.lk[s] = self ? lq[s] : lk[s];
    return c;
}

static void test_fixed(int full) {
    if (full) { /* a molgen batch: 64 SMILES of 20..57 tokens, 8 heads of 32, causal */
        int64_t lq[64];
        tu_rng r = tu_seed(64);
        for (int s = 0; s < 64; s++) lq[s] = tu_int(&r, 20, 57);
        vcase c = mk("molgen batch", 8, 32, 32, GU_BLHD, 1, 64, lq, NULL);
        c.p.causal = 1;
        run_case(&c, 1);
    }
    {
        const int64_t lq[] = {0, 1, 3, 0, 4, 5, 70, 0};
        vcase c = mk("tiny and empty sequences", 2, 5, 7, GU_BHLD, 1, 8, lq, NULL);
        run_case(&c, 2);
        c.p.causal = 1, c.name = "tiny and empty sequences, causal";
        run_case(&c, 3);
    }
    {
        const int64_t lq[] = {300, 10};
        vcase c = mk("one long, one short (two-pass backward)", 1, 16, 16, GU_BLHD, 1, 2, lq, NULL);
        c.p.causal = 1;
        run_case(&c, 4);
    }
    {
        const int64_t lq[] = {5, 0, 17, 130, 3}, lk[] = {9, 6, 0, 100, 3};
        vcase c = mk("cross lengths, causal (Lq > Lk, Lk 0)", 2, 24, 8, GU_PADDED, 0, 5, lq, lk);
        c.p.causal = 1;
        run_case(&c, 5);
        c.p.causal = 0, c.p.use_scale = 1, c.p.scale = 0.3f, c.name = "cross lengths, scale 0.3";
        run_case(&c, 6);
    }
    {
        const int64_t lq[] = {40, 97, 1, 200};
        vcase c = mk("window and dropout", 2, 16, 16, GU_INNER2, 1, 4, lq, NULL);
        c.p.use_window = 1, c.p.window_left = 16, c.p.window_right = 3;
        c.p.dropout_p = 0.3f, c.p.training = 1, c.p.seed = 7, c.p.offset = 11;
        run_case(&c, 7);
    }
    {
        const int64_t lq[] = {10, 70, 0}, lk[] = {33, 5, 4};
        vcase c = mk("cross lengths, dropout, dropout_row0 5", 1, 8, 12, GU_BLHD, 0, 3, lq, lk);
        c.p.dropout_p = 0.5f, c.p.training = 1, c.p.seed = 3, c.p.dropout_row0 = 5;
        run_case(&c, 8);
    }
    {
        const int64_t lq[] = {1, 4, 2, 3};
        vcase c = mk("short sequences (padded: decode kernel)", 3, 8, 8, GU_BHLD, 1, 4, lq, NULL);
        c.p.causal = 1;
        run_case(&c, 9);
    }
}

static void test_random(int iters, uint64_t seed) {
    tu_rng r = tu_seed(seed);
    for (int it = 0; it < iters; it++) {
        int64_t lq[12], lk[12];
        const int64_t n = tu_int(&r, 1, 12);
        for (int s = 0; s < n; s++)
            lq[s] = tu_unif(&r) < 0.15 ? 0 : tu_int(&r, 1, 150),
            lk[s] = tu_unif(&r) < 0.1 ? 0 : tu_int(&r, 1, 150);
        vcase c = mk("random", tu_int(&r, 1, 3), tu_int(&r, 1, 40), tu_int(&r, 1, 40),
                     (int)tu_int(&r, 0, GU_LAYOUTS - 1), tu_unif(&r) < 0.5, n, lq, lk);
        c.p.causal = tu_unif(&r) < 0.5;
        if (tu_unif(&r) < 0.3)
            c.p.use_window = 1, c.p.window_left = tu_int(&r, -1, 40),
            c.p.window_right = tu_int(&r, -1, 5);
        if (tu_unif(&r) < 0.3)
            c.p.training = 1, c.p.dropout_p = (float)(0.1 + 0.5 * tu_unif(&r)),
            c.p.seed = tu_next(&r);
        if (plan_of(&c).Tq == 0 || plan_of(&c).Tk == 0)
            c.lq[0] = c.lk[0] = 3; /* tensors need L >= 1 */
        run_case(&c, tu_next(&r));
    }
}

/* Every bad argument gives its status and a message, and writes nothing. */
static void test_invalid(void) {
    enum { H = 2, T = 10, D = 4 };
    float q[H * T * D], o[H * T * D], lse[H * T], g[H * T * D], d1[H * T * D], d2[H * T * D],
        d3[H * T * D];
    for (int i = 0; i < H * T * D; i++) q[i] = 0.01f * (float)i, g[i] = 1.0f, o[i] = SENT;
    attn_tensor t = attn_tensor_blhd(q, 1, H, T, D), to = attn_tensor_blhd(o, 1, H, T, D),
                tg = attn_tensor_blhd(g, 1, H, T, D), t1 = attn_tensor_blhd(d1, 1, H, T, D),
                t2 = attn_tensor_blhd(d2, 1, H, T, D), t3 = attn_tensor_blhd(d3, 1, H, T, D);
    const int64_t good[] = {0, 4, 4, 10};
    attn_sdpa_params p = {0};
    attn_error e;
    struct {
        const char *what;
        int64_t batch, cu[4];
        attn_status want;
    } bad[] = {
        {"batch 0", 0, {0, 4, 4, 10}, ATTN_ERR_SHAPE},
        {"batch -1", -1, {0, 4, 4, 10}, ATTN_ERR_SHAPE},
        {"cu[0] != 0", 3, {1, 4, 4, 10}, ATTN_ERR_SHAPE},
        {"decreasing", 3, {0, 6, 4, 10}, ATTN_ERR_SHAPE},
        {"last != total", 3, {0, 4, 4, 9}, ATTN_ERR_SHAPE},
        {"beyond the total", 3, {0, INT64_MAX, INT64_MAX, 10}, ATTN_ERR_SHAPE},
        {"negative", 3, {0, -4, 4, 10}, ATTN_ERR_SHAPE},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        CHECK_ERR(attn_sdpa_varlen_forward(&t, &t, &t, bad[i].batch, bad[i].cu, NULL, &p, &to, NULL,
                                           lse, NULL, &e),
                  bad[i].want, &e);
        CHECK_ERR(attn_sdpa_varlen_backward(&t, &t, &t, &to, lse, &tg, bad[i].batch, bad[i].cu,
                                            NULL, &p, &t1, &t2, &t3, NULL, &e),
                  bad[i].want, &e);
        if (bad[i].batch == 3) /* the same lengths as cu_seqlens_k */
            CHECK_ERR(attn_sdpa_varlen_forward(&t, &t, &t, 3, good, bad[i].cu, &p, &to, NULL, lse,
                                               NULL, &e),
                      bad[i].want, &e);
    }
    CHECK(strstr(e.message, "cu_seqlens_k") != NULL, "message names cu_seqlens_k: %s", e.message);
    for (int i = 0; i < H * T * D; i++) o[i] = SENT;
    CHECK_ERR(attn_sdpa_varlen_forward(&t, &t, &t, 3, NULL, NULL, &p, &to, NULL, lse, NULL, &e),
              ATTN_ERR_NULL, &e);
    CHECK_ERR(attn_sdpa_varlen_forward(NULL, &t, &t, 3, good, NULL, &p, &to, NULL, lse, NULL, &e),
              ATTN_ERR_NULL, &e);
    CHECK_ERR(attn_sdpa_varlen_forward(&t, &t, &t, 3, good, NULL, &p, NULL, NULL, lse, NULL, &e),
              ATTN_ERR_NULL, &e);
    /* keys of another total than the queries, cu_seqlens_k NULL */
    attn_tensor tk = attn_tensor_blhd(q, 1, H, T - 1, D);
    CHECK_ERR(attn_sdpa_varlen_forward(&t, &tk, &tk, 3, good, NULL, &p, &to, NULL, lse, NULL, &e),
              ATTN_ERR_SHAPE, &e);
    /* padded tensors (B = 2) */
    attn_tensor tb = attn_tensor_blhd(q, 2, H, T / 2, D), tob = attn_tensor_blhd(o, 2, H, T / 2, D);
    const int64_t cu5[] = {0, 5};
    CHECK_ERR(attn_sdpa_varlen_forward(&tb, &tb, &tb, 1, cu5, NULL, &p, &tob, NULL, NULL, NULL, &e),
              ATTN_ERR_SHAPE, &e);
    size_t touched = 0;
    for (int i = 0; i < H * T * D; i++) touched += o[i] != SENT;
    CHECK(touched == 0, "a refused call wrote %zu output floats", touched);
    /* element masks and key_lengths: refused, not ignored */
    const int64_t kl[] = {4};
    attn_sdpa_params pk = p;
    pk.key_lengths = kl;
    CHECK_ERR(attn_sdpa_varlen_forward(&t, &t, &t, 3, good, NULL, &pk, &to, NULL, lse, NULL, &e),
              ATTN_ERR_ARG, &e);
    uint8_t bm[1] = {1};
    attn_mask m = {bm, {1, 1, T, T}, {0, 0, 0, 0}};
    attn_sdpa_params pb = p;
    pb.bool_mask = &m;
    CHECK_ERR(attn_sdpa_varlen_forward(&t, &t, &t, 3, good, NULL, &pb, &to, NULL, lse, NULL, &e),
              ATTN_ERR_ARG, &e);
    pb = p, pb.add_mask = &m;
    CHECK_ERR(attn_sdpa_varlen_forward(&t, &t, &t, 3, good, NULL, &pb, &to, NULL, lse, NULL, &e),
              ATTN_ERR_ARG, &e);
    attn_sdpa_params pd = p;
    pd.dropout_p = 1.5f, pd.training = 1;
    CHECK_ERR(attn_sdpa_varlen_forward(&t, &t, &t, 3, good, NULL, &pd, &to, NULL, lse, NULL, &e),
              ATTN_ERR_ARG, &e);
    /* a packed length whose scores overflow */
    attn_tensor huge = {q, {1, 1, (int64_t)1 << 40, 1}, {0, 0, 0, 1}};
    attn_tensor hugeo = {o, {1, 1, (int64_t)1 << 40, 1}, {0, 0, 0, 1}};
    const int64_t cuh[] = {0, (int64_t)1 << 40};
    CHECK_ERR(attn_sdpa_varlen_forward(&huge, &huge, &huge, 1, cuh, NULL, &p, &hugeo, NULL, NULL,
                                       NULL, &e),
              ATTN_ERR_OVERFLOW, &e);
    /* backward: lse and gradient shapes */
    CHECK(attn_sdpa_varlen_forward(&t, &t, &t, 3, good, NULL, &p, &to, NULL, lse, NULL, &e) ==
              ATTN_OK,
          "%s", e.message);
    CHECK_ERR(attn_sdpa_varlen_backward(&t, &t, &t, &to, NULL, &tg, 3, good, NULL, &p, &t1, &t2,
                                        &t3, NULL, &e),
              ATTN_ERR_NULL, &e);
    attn_tensor small = attn_tensor_blhd(d1, 1, H, T - 1, D);
    CHECK_ERR(attn_sdpa_varlen_backward(&t, &t, &t, &to, lse, &tg, 3, good, NULL, &p, &small, &t2,
                                        &t3, NULL, &e),
              ATTN_ERR_SHAPE, &e);
}

static int isa_active(const char *isa) {
    float x[8] = {0}, o[8];
    attn_tensor t = attn_tensor_bhld(x, 1, 1, 1, 8), to = attn_tensor_bhld(o, 1, 1, 1, 8);
    attn_sdpa_info info;
    const int64_t cu[] = {0, 1};
    if (attn_sdpa_varlen_forward(&t, &t, &t, 1, cu, NULL, NULL, &to, NULL, NULL, &info, NULL))
        return 0;
    char want[32];
    snprintf(want, sizeof want, "fused path: %s ", isa);
    return strncmp(info.reason, want, strlen(want)) == 0;
}

/* A NaN in one key of the last sequence (packed row ck[2] + 3, head 1):
 * the backward reads its keys' finite flags by packed row, so that
 * sequence's results carry NaN where its own dense fused call's do, and
 * every sequence is its own dense call's bits (NaN where it is NaN). */
static void test_nan_key(void) {
    enum { H = 2, D = 16, N = 3 };
    const int64_t cu[N + 1] = {0, 40, 110, 143}, T = cu[N];
    const size_t n = (size_t)(H * T * D);
    float *buf[8];
    for (int a = 0; a < 8; a++) buf[a] = tu_malloc(n * sizeof(float));
    tu_rng rng = tu_seed(77);
    for (int a = 0; a < 4; a++)
        for (size_t i = 0; i < n; i++) buf[a][i] = (float)(2.0 * tu_unif(&rng) - 1.0);
    buf[1][(1 * T + cu[2] + 3) * D + 5] = NAN; /* k[0, 1, ck[2] + 3, 5] */
    float *lse = tu_malloc((size_t)(H * T) * sizeof(float));
    attn_tensor q = attn_tensor_bhld(buf[0], 1, H, T, D), k = attn_tensor_bhld(buf[1], 1, H, T, D),
                v = attn_tensor_bhld(buf[2], 1, H, T, D), g = attn_tensor_bhld(buf[3], 1, H, T, D),
                o = attn_tensor_bhld(buf[4], 1, H, T, D), dq = attn_tensor_bhld(buf[5], 1, H, T, D),
                dk = attn_tensor_bhld(buf[6], 1, H, T, D), dv = attn_tensor_bhld(buf[7], 1, H, T, D);
    attn_sdpa_params p = {0};
    p.causal = 1, p.impl = ATTN_IMPL_FUSED, p.num_threads = 2;
    attn_error err;
    attn_status st = attn_sdpa_varlen_forward(&q, &k, &v, N, cu, NULL, &p, &o, NULL, lse, NULL, &err);
    if (!st)
        st = attn_sdpa_varlen_backward(&q, &k, &v, &o, lse, &g, N, cu, NULL, &p, &dq, &dk, &dv,
                                       NULL, &err);
    CHECK(st == ATTN_OK, "[%s] nan key: varlen call: %s", g_isa, err.message);
    size_t diff = 0, nans = 0;
    for (int64_t s = 0; s < N && st == ATTN_OK; s++) {
        const int64_t L = cu[s + 1] - cu[s];
        float *so = tu_malloc((size_t)(H * L * D) * 4), *sl = tu_malloc((size_t)(H * L) * 4),
              *sd[3];
        for (int a = 0; a < 3; a++) sd[a] = tu_malloc((size_t)(H * L * D) * 4);
        attn_tensor sq = attn_varlen_rows(&q, cu[s], L), sk = attn_varlen_rows(&k, cu[s], L),
                    sv = attn_varlen_rows(&v, cu[s], L), sg = attn_varlen_rows(&g, cu[s], L),
                    to = attn_tensor_bhld(so, 1, H, L, D), t0 = attn_tensor_bhld(sd[0], 1, H, L, D),
                    t1 = attn_tensor_bhld(sd[1], 1, H, L, D), t2 = attn_tensor_bhld(sd[2], 1, H, L, D);
        attn_status ss = attn_sdpa_forward(&sq, &sk, &sv, &p, &to, NULL, sl, NULL, &err);
        if (!ss) ss = attn_sdpa_backward(&sq, &sk, &sv, &to, sl, &sg, &p, &t0, &t1, &t2, NULL, &err);
        CHECK(ss == ATTN_OK, "[%s] nan key: sequence %lld: %s", g_isa, (long long)s, err.message);
        const attn_tensor *mine[3] = {&dq, &dk, &dv};
        for (int a = 0; a < 3 && !ss; a++)
            for (int64_t h = 0; h < H; h++)
                for (int64_t i = 0; i < L; i++)
                    for (int64_t d = 0; d < D; d++) {
                        const float x = sd[a][(h * L + i) * D + d],
                                    y = mine[a]->data[tu_off(mine[a], 0, h, cu[s] + i, d)];
                        nans += isnan(y);
                        diff += isnan(x) != isnan(y) || (!isnan(x) && memcmp(&x, &y, 4));
                    }
        free(so), free(sl), free(sd[0]), free(sd[1]), free(sd[2]);
    }
    CHECK(diff == 0 && nans > 0, "[%s] nan key: %zu gradients differ from the sequences' own calls "
          "(%zu NaN)", g_isa, diff, nans);
    for (int a = 0; a < 8; a++) free(buf[a]);
    free(lse);
}

int main(void) {
    attn_enable_amx(); /* the amx row too, where the CPU has it */
    test_invalid();
    int done = 0;
    for (int i = 0; attn_test_isa_name(i); i++) { /* the library's table, best first */
        const char *const isa = attn_test_isa_name(i);
        setenv("ATTN_FUSED_ISA", isa, 1);
        attn_test_reload_env();
        if (!isa_active(isa)) {
            printf("test_sdpa_varlen: %s kernels not available on this CPU, skipped\n", isa);
            continue;
        }
        g_isa = isa;
        test_fixed(done == 0);
        test_random(done == 0 ? 16 : 6, 0xBEEF + (uint64_t)i);
        test_nan_key();
        done++;
        printf("test_sdpa_varlen: %s kernels done (%d checks so far)\n", isa,
               tu_pass + tu_fail);
    }
    unsetenv("ATTN_FUSED_ISA");
    attn_test_reload_env();
    printf("test_sdpa_varlen: worst fused/reference error ratio vs fp64 %.3f (bound 2 + floor)\n",
           g_ratio);
    return tu_report("test_sdpa_varlen");
}
