/* The attention variants of attn.h (grouped-query / multi-query attention,
 * logit soft-capping, ALiBi, attention sinks) against an independent fp64
 * oracle written here from the header's formulas, forward (out, lse,
 * weights) and backward (dq, dk, dv, d_sinks), on the reference and the
 * fused (auto) paths, combined with causal, window, key padding (rows with
 * no key), bool and additive masks and dropout; the oracle's own gradients
 * against central finite differences; varlen against the oracle per
 * sequence; bf16 inputs against the oracle on their values; bitwise
 * thread-count invariance; every bad argument a clear error.
 * Accuracy rule (FlashAttention's): the reference's error vs fp64 within a
 * fixed bound, the fused path's within 2x the reference's + 1e-5 (fp32). */
#include "testutil.h"
#include "grad_util.h"
#include "ref_oracle.h"
#include "internal.h" /* attn_test_tanh: the kernels' vector tanh */

/* ------------------------------------------------------------ the oracle */

typedef struct {
    int64_t B, H, Hkv, Lq, Lk, Dk, Dv;
} vdims;

/* Forward and backward in double. q [B,H,Lq,Dk], k [B,Hkv,Lk,Dk],
 * v [B,Hkv,Lk,Dv], g (grad_out) [B,H,Lq,Dv] contiguous; mult [B,H,Lq,Lk]
 * dropout multipliers or NULL; sinks/alibi from p (floats) unless sinkd
 * (double [H], for finite differences) is given. Outputs out, lse, w; with
 * g: dq, dk, dv (zeroed here) and dsink [H]. */
static void oracle(const vdims *d, const double *q, const double *k, const double *v,
                   const attn_sdpa_params *p, const double *sinkd, const double *mult,
                   double *out, double *lse, double *w, const double *g, double *dq, double *dk,
                   double *dv, double *dsink) {
    const int64_t B = d->B, H = d->H, Lq = d->Lq, Lk = d->Lk, Dk = d->Dk, Dv = d->Dv;
    const int64_t G = H / d->Hkv;
    const double scale = p->use_scale ? (double)p->scale : 1.0 / sqrt((double)Dk);
    double *s = tu_malloc((size_t)Lk * sizeof(double)), *dc = tu_malloc((size_t)Lk * sizeof(double));
    double *pr = tu_malloc((size_t)Lk * sizeof(double));
    unsigned char *in = tu_malloc((size_t)Lk);
    if (g) {
        memset(dq, 0, (size_t)(B * H * Lq * Dk) * sizeof(double));
        memset(dk, 0, (size_t)(B * d->Hkv * Lk * Dk) * sizeof(double));
        memset(dv, 0, (size_t)(B * d->Hkv * Lk * Dv) * sizeof(double));
        memset(dsink, 0, (size_t)H * sizeof(double));
    }
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t i = 0; i < Lq; i++) {
                const int64_t kh = b * d->Hkv + h / G, row = (b * H + h) * Lq + i;
                const double *qi = q + row * Dk;
                const int has_sink = p->sinks != NULL;
                const double sig = has_sink ? (sinkd ? sinkd[h] : (double)p->sinks[h]) : 0.0;
                double m = has_sink ? sig : -INFINITY;
                int any = 0;
                for (int64_t j = 0; j < Lk; j++) {
                    const double *kj = k + (kh * Lk + j) * Dk;
                    double x = 0.0;
                    for (int64_t c = 0; c < Dk; c++) x += qi[c] * kj[c];
                    x *= scale;
                    dc[j] = 1.0;
                    if (p->use_softcap) {
                        const double cap = p->softcap, t = tanh(x / cap);
                        x = cap * t;
                        dc[j] = 1.0 - t * t;
                    }
                    if (p->alibi_slopes)
                        x -= (double)p->alibi_slopes[h] * fabs((double)(i + Lk - Lq - j));
                    if (p->add_mask)
                        x += (double)((const float *)p->add_mask->data)[ref_mask_off(
                            p->add_mask, b, h, i, j)];
                    s[j] = x;
                    in[j] = ref_visible(p, b, h, i, j, Lq, Lk) && x != -INFINITY;
                    if (in[j]) any = 1, m = x > m ? x : m;
                }
                double Z = has_sink ? exp(sig - m) : 0.0;
                for (int64_t j = 0; j < Lk; j++) Z += in[j] ? exp(s[j] - m) : 0.0;
                double *o = out + row * Dv;
                for (int64_t c = 0; c < Dv; c++) o[c] = 0.0;
                if (!any) {
                    lse[row] = has_sink ? sig : -INFINITY;
                    for (int64_t j = 0; j < Lk; j++) w[row * Lk + j] = 0.0;
                    continue; /* out 0, no gradient (a sink's is -p_sink·dO·O = 0) */
                }
                lse[row] = m + log(Z);
                for (int64_t j = 0; j < Lk; j++) {
                    pr[j] = in[j] ? exp(s[j] - m) / Z : 0.0;
                    w[row * Lk + j] = pr[j];
                    const double z = mult ? mult[row * Lk + j] : 1.0;
                    if (pr[j] * z != 0.0)
                        for (int64_t c = 0; c < Dv; c++) o[c] += pr[j] * z * v[(kh * Lk + j) * Dv + c];
                }
                if (!g) continue;
                const double *go = g + row * Dv;
                double D = 0.0;
                for (int64_t c = 0; c < Dv; c++) D += go[c] * o[c];
                if (has_sink) dsink[h] -= exp(sig - lse[row]) * D;
                for (int64_t j = 0; j < Lk; j++) {
                    if (pr[j] == 0.0) continue;
                    const double z = mult ? mult[row * Lk + j] : 1.0;
                    const double *vj = v + (kh * Lk + j) * Dv, *kj = k + (kh * Lk + j) * Dk;
                    double dp = 0.0;
                    for (int64_t c = 0; c < Dv; c++) dp += go[c] * vj[c];
                    dp *= z;
                    for (int64_t c = 0; c < Dv; c++) dv[(kh * Lk + j) * Dv + c] += pr[j] * z * go[c];
                    const double ds = pr[j] * (dp - D) * dc[j] * scale;
                    for (int64_t c = 0; c < Dk; c++) {
                        dq[row * Dk + c] += ds * kj[c];
                        dk[(kh * Lk + j) * Dk + c] += ds * qi[c];
                    }
                }
            }
    free(s), free(dc), free(pr), free(in);
}

/* ------------------------------------------------------------ FD of the oracle */

typedef struct {
    const vdims *d;
    double *q, *k, *v, *sink;
    const attn_sdpa_params *p;
    const double *g, *mult;
    double *out, *lse, *w;
} fdctx;

static double fd_loss(void *vc) {
    fdctx *c = vc;
    oracle(c->d, c->q, c->k, c->v, c->p, c->sink, c->mult, c->out, c->lse, c->w, NULL, NULL, NULL,
           NULL, NULL);
    double L = 0.0;
    for (int64_t x = 0; x < c->d->B * c->d->H * c->d->Lq * c->d->Dv; x++) L += c->out[x] * c->g[x];
    return L;
}

static double *rand_d(tu_rng *r, size_t n, double lo, double hi) {
    double *x = tu_malloc(n * sizeof(double));
    for (size_t i = 0; i < n; i++) x[i] = lo + (hi - lo) * tu_unif(r);
    return x;
}

/* The oracle's analytic gradients (q, k, v, sinks) against central
 * differences, with every variant on, GQA 4:2, causal + window + padding. */
static void test_oracle_fd(void) {
    const vdims d = {2, 4, 2, 5, 7, 3, 4};
    tu_rng r = tu_seed(77);
    const size_t nq = (size_t)(d.B * d.H * d.Lq * d.Dk), nk = (size_t)(d.B * d.Hkv * d.Lk * d.Dk),
                 nv = (size_t)(d.B * d.Hkv * d.Lk * d.Dv), no = (size_t)(d.B * d.H * d.Lq * d.Dv);
    double *q = rand_d(&r, nq, -2, 2), *k = rand_d(&r, nk, -2, 2), *v = rand_d(&r, nv, -1, 1);
    double *g = rand_d(&r, no, -1, 1), sink[4] = {0.3, -0.5, 1.2, 0.0};
    float sinkf[4] = {0.3f, -0.5f, 1.2f, 0.0f}, slopes[4] = {0.5f, 0.25f, 0.125f, 0.0625f};
    const int64_t kl[2] = {7, 4};
    for (int variant = 0; variant < 4; variant++) {
        attn_sdpa_params p = {0};
        p.use_softcap = variant != 1, p.softcap = variant != 1 ? 1.5f : 0.0f;
        p.alibi_slopes = variant != 2 ? slopes : NULL;
        p.sinks = variant != 3 ? sinkf : NULL;
        p.causal = 1, p.key_lengths = kl, p.use_window = 1, p.window_left = 3;
        p.window_right = ATTN_UNBOUNDED;
        double *out = tu_malloc(no * 8), *lse = tu_malloc(40 * 8), *w = tu_malloc(40 * 7 * 8);
        double *dq = tu_malloc(nq * 8), *dk = tu_malloc(nk * 8), *dv = tu_malloc(nv * 8), ds[4];
        oracle(&d, q, k, v, &p, sink, NULL, out, lse, w, g, dq, dk, dv, ds);
        fdctx c = {&d, q, k, v, sink, &p, g, NULL, tu_malloc(no * 8), tu_malloc(40 * 8),
                   tu_malloc(40 * 7 * 8)};
        const double h = 1e-6;
        const double eq = gu_fd_maxerr(q, nq, 1, dq, h, fd_loss, &c);
        const double ek = gu_fd_maxerr(k, nk, 1, dk, h, fd_loss, &c);
        const double ev = gu_fd_maxerr(v, nv, 1, dv, h, fd_loss, &c);
        const double es = p.sinks ? gu_fd_maxerr(sink, 4, 1, ds, h, fd_loss, &c) : 0.0;
        CHECK(eq < 1e-7 && ek < 1e-7 && ev < 1e-7 && es < 1e-7,
              "oracle FD variant %d: dq %.2e dk %.2e dv %.2e dsink %.2e", variant, eq, ek, ev, es);
        free(out), free(lse), free(w), free(dq), free(dk), free(dv);
        free(c.out), free(c.lse), free(c.w);
    }
    free(q), free(k), free(v), free(g);
}

/* ------------------------------------------------------------ library vs oracle */

typedef struct {
    float *q, *k, *v, *o, *w, *lse, *g, *dq, *dk, *dv, ds[16];
} lbufs;

static double maxabs_d(const double *x, size_t n) {
    double m = 0;
    for (size_t i = 0; i < n; i++)
        if (isfinite(x[i]) && fabs(x[i]) > m) m = fabs(x[i]);
    return m;
}

/* Errors of one run vs the oracle: [0] out, [1] lse, [2] weights, [3] dq,
 * [4] dk, [5] dv, [6] d_sinks; each max|got - want| / max(max|want|, 1e-3)
 * (lse: absolute, -inf must match). */
static void run_errs(const vdims *d, lbufs *L, const attn_sdpa_params *p0, attn_impl impl,
                     const double *want_o, const double *want_lse, const double *want_w,
                     const double *wdq, const double *wdk, const double *wdv, const double *wds,
                     double e[7], int threads) {
    const int64_t B = d->B, H = d->H, Hk = d->Hkv;
    attn_tensor tq = attn_tensor_bhld(L->q, B, H, d->Lq, d->Dk),
                tk = attn_tensor_bhld(L->k, B, Hk, d->Lk, d->Dk),
                tv = attn_tensor_bhld(L->v, B, Hk, d->Lk, d->Dv),
                to = attn_tensor_bhld(L->o, B, H, d->Lq, d->Dv),
                tg = attn_tensor_bhld(L->g, B, H, d->Lq, d->Dv),
                tdq = attn_tensor_bhld(L->dq, B, H, d->Lq, d->Dk),
                tdk = attn_tensor_bhld(L->dk, B, Hk, d->Lk, d->Dk),
                tdv = attn_tensor_bhld(L->dv, B, Hk, d->Lk, d->Dv);
    attn_sdpa_params p = *p0;
    p.impl = impl, p.num_threads = threads, p.d_sinks = L->ds;
    attn_error err;
    attn_sdpa_info fi, bi;
    attn_status s = attn_sdpa_forward(&tq, &tk, &tv, &p, &to, L->w, L->lse, &fi, &err);
    CHECK(s == ATTN_OK, "forward: %s", err.message);
    s = attn_sdpa_backward(&tq, &tk, &tv, &to, L->lse, &tg, &p, &tdq, &tdk, &tdv, &bi, &err);
    CHECK(s == ATTN_OK, "backward: %s", err.message);
    /* auto: the fused kernels take every variant (fp32) */
    const attn_impl want = impl == ATTN_IMPL_AUTO ? ATTN_IMPL_FUSED : impl;
    CHECK(fi.impl == want && bi.impl == want, "impl %d: forward ran %d (%s), backward %d (%s)",
          (int)impl, (int)fi.impl, fi.reason, (int)bi.impl, bi.reason);
    const size_t no = (size_t)(B * H * d->Lq * d->Dv), nr = (size_t)(B * H * d->Lq);
    e[0] = tu_maxdiff(L->o, want_o, no) / fmax(maxabs_d(want_o, no), 1e-3);
    e[1] = tu_maxdiff(L->lse, want_lse, nr);
    e[2] = tu_maxdiff(L->w, want_w, nr * (size_t)d->Lk);
    e[3] = gu_relerr(L->dq, wdq, (size_t)(B * H * d->Lq * d->Dk), 1e-3);
    e[4] = gu_relerr(L->dk, wdk, (size_t)(B * Hk * d->Lk * d->Dk), 1e-3);
    e[5] = gu_relerr(L->dv, wdv, (size_t)(B * Hk * d->Lk * d->Dv), 1e-3);
    e[6] = p.sinks ? gu_relerr(L->ds, wds, (size_t)H, 1e-3) : 0.0;
}

static const char *const kErrName[7] = {"out", "lse", "weights", "dq", "dk", "dv", "d_sinks"};

/* One configuration: random inputs, the oracle, the reference and fused
 * paths; the reference within `bound` of fp64, fused within 2x + 1e-5. */
static void variant_case(const vdims *d, const attn_sdpa_params *p, uint64_t seed, int dropout,
                         const char *what) {
    tu_rng r = tu_seed(seed);
    const int64_t B = d->B, H = d->H, Hk = d->Hkv;
    const size_t nq = (size_t)(B * H * d->Lq * d->Dk), nk = (size_t)(B * Hk * d->Lk * d->Dk),
                 nv = (size_t)(B * Hk * d->Lk * d->Dv), no = (size_t)(B * H * d->Lq * d->Dv),
                 nr = (size_t)(B * H * d->Lq), nw = nr * (size_t)d->Lk;
    lbufs L;
    L.q = tu_malloc(nq * 4), L.k = tu_malloc(nk * 4), L.v = tu_malloc(nv * 4), L.o = tu_malloc(no * 4);
    L.w = tu_malloc(nw * 4), L.lse = tu_malloc(nr * 4), L.g = tu_malloc(no * 4);
    L.dq = tu_malloc(nq * 4), L.dk = tu_malloc(nk * 4), L.dv = tu_malloc(nv * 4);
    tu_fill(&r, L.q, nq, -2, 2), tu_fill(&r, L.k, nk, -2, 2), tu_fill(&r, L.v, nv, -1, 1);
    tu_fill(&r, L.g, no, -1, 1);
    double *q = tu_doubles(L.q, nq), *k = tu_doubles(L.k, nk), *v = tu_doubles(L.v, nv),
           *g = tu_doubles(L.g, no);
    attn_sdpa_params pp = *p;
    double *mult = NULL;
    if (dropout) {
        pp.dropout_p = 0.2f, pp.training = 1, pp.seed = seed, pp.offset = 3;
        mult = tu_malloc(nw * sizeof(double));
        float *mrow = tu_malloc((size_t)d->Lk * 4);
        for (int64_t b = 0; b < B; b++)
            for (int64_t h = 0; h < H; h++)
                for (int64_t i = 0; i < d->Lq; i++) {
                    attn_error err;
                    CHECK(attn_dropout_mask(&pp, 1, d->Lk, &b, h, &i, mrow, &err) == ATTN_OK, "%s",
                          err.message);
                    for (int64_t j = 0; j < d->Lk; j++)
                        mult[((b * H + h) * d->Lq + i) * d->Lk + j] = mrow[j];
                }
        free(mrow);
    }
    double *out = tu_malloc(no * 8), *lse = tu_malloc(nr * 8), *w = tu_malloc(nw * 8);
    double *dq = tu_malloc(nq * 8), *dk = tu_malloc(nk * 8), *dv = tu_malloc(nv * 8), ds[16];
    oracle(d, q, k, v, &pp, NULL, mult, out, lse, w, g, dq, dk, dv, ds);
    double er[7], ef[7];
    run_errs(d, &L, &pp, ATTN_IMPL_REFERENCE, out, lse, w, dq, dk, dv, ds, er, 0);
    run_errs(d, &L, &pp, ATTN_IMPL_AUTO, out, lse, w, dq, dk, dv, ds, ef, 0);
    /* fixed bounds for the reference (fp32 sums over <= 200 terms of O(1)) */
    const double bound[7] = {2e-6, 2e-6, 1e-6, 1e-5, 1e-5, 1e-5, 1e-5};
    for (int x = 0; x < 7; x++) {
        CHECK(er[x] <= bound[x], "%s: reference %s error %.3g > %.3g", what, kErrName[x], er[x],
              bound[x]);
        CHECK(ef[x] <= 2 * er[x] + 1e-5, "%s: fused %s error %.3g > 2 x reference %.3g + 1e-5",
              what, kErrName[x], ef[x], er[x]);
    }
    /* rows that see no key: out exactly 0, lse -inf or the sink's logit */
    for (size_t row = 0; row < nr; row++) {
        int empty = 1;
        for (int64_t j = 0; j < d->Lk; j++) empty &= w[row * (size_t)d->Lk + (size_t)j] == 0.0;
        if (!empty || !(lse[row] == -INFINITY || (p->sinks && lse[row] == p->sinks[(row / (size_t)d->Lq) % (size_t)H])))
            continue;
        int zero = 1;
        for (int64_t c = 0; c < d->Dv; c++) zero &= L.o[row * (size_t)d->Dv + (size_t)c] == 0.0f;
        CHECK(zero && L.lse[row] == (float)lse[row], "%s: empty row %zu: out not 0 or lse %g != %g",
              what, row, (double)L.lse[row], lse[row]);
    }
    free(q), free(k), free(v), free(g), free(out), free(lse), free(w), free(dq), free(dk), free(dv);
    free(mult);
    free(L.q), free(L.k), free(L.v), free(L.o), free(L.w), free(L.lse), free(L.g), free(L.dq);
    free(L.dk), free(L.dv);
}

/* Every variant combination x GQA ratio x mask kind x decode/tiled shapes. */
static void test_variants_grid(void) {
    static float slopes[8] = {0.5f, 0.25f, 0.125f, 0.0625f, 0.03125f, 0.7f, 0.0f, 1.0f / 256};
    static float sinks[8] = {0.5f, -1.0f, 2.0f, 0.0f, -3.0f, 1.0f, 4.0f, -0.25f};
    const int64_t kv[3][2] = {{4, 4}, {4, 2}, {4, 1}};
    const int64_t shapes[3][2] = {{70, 100}, {3, 130}, {1, 9}}; /* tiled, decode, tiny */
    int n = 0;
    for (int mk = 0; mk < 6; mk++)
        for (int var = 1; var < 8; var++)
            for (int g = 0; g < 3; g++) {
                const int sh = (mk + var + g) % 3;
                vdims d = {2, kv[g][0], kv[g][1], shapes[sh][0], shapes[sh][1], 16, 8};
                attn_sdpa_params p = {0};
                if (var & 1) p.use_softcap = 1, p.softcap = 2.0f;
                if (var & 2) p.alibi_slopes = slopes;
                if (var & 4) p.sinks = sinks;
                int64_t kl[2] = {d.Lk, 0}; /* batch row 1 sees no key */
                attn_mask am, bm;
                float *amd = NULL;
                uint8_t *bmd = NULL;
                switch (mk) {
                case 0: break;
                case 1: p.causal = 1; break;
                case 2:
                    p.use_window = 1, p.window_left = 5, p.window_right = 2;
                    break;
                case 3: p.key_lengths = kl, p.causal = 1; break;
                case 4: { /* bool mask [1, H, Lq, Lk] (row 0 of head 1 sees nothing) + causal */
                    bmd = tu_malloc((size_t)(d.H * d.Lq * d.Lk));
                    tu_rng r = tu_seed(5 + (uint64_t)n);
                    for (int64_t x = 0; x < d.H * d.Lq * d.Lk; x++)
                        bmd[x] = tu_unif(&r) < 0.7 && !(x / (d.Lq * d.Lk) == 1 && x % (d.Lq * d.Lk) < d.Lk);
                    bm = (attn_mask){bmd, {1, d.H, d.Lq, d.Lk}, {0, d.Lq * d.Lk, d.Lk, 1}};
                    p.bool_mask = &bm, p.causal = 1;
                    break;
                }
                case 5: { /* additive mask [B, 1, Lq, Lk] with some -inf */
                    amd = tu_malloc((size_t)(d.B * d.Lq * d.Lk) * 4);
                    tu_rng r = tu_seed(9 + (uint64_t)n);
                    for (int64_t x = 0; x < d.B * d.Lq * d.Lk; x++)
                        amd[x] = tu_unif(&r) < 0.2 ? -INFINITY : (float)(tu_unif(&r) * 2 - 1);
                    am = (attn_mask){amd, {d.B, 1, d.Lq, d.Lk}, {d.Lq * d.Lk, 0, d.Lk, 1}};
                    p.add_mask = &am;
                    break;
                }
                }
                char what[96];
                snprintf(what, sizeof what, "mask %d variant %d Hq %lld Hkv %lld Lq %lld Lk %lld",
                         mk, var, (long long)d.H, (long long)d.Hkv, (long long)d.Lq,
                         (long long)d.Lk);
                variant_case(&d, &p, 1000 + (uint64_t)n, mk == 2 && var == 7, what);
                free(amd), free(bmd);
                n++;
            }
    /* plain GQA / MQA without the other variants, and dropout with GQA */
    for (int g = 1; g < 3; g++) {
        vdims d = {2, kv[g][0], kv[g][1], 70, 100, 16, 8};
        attn_sdpa_params p = {0};
        p.causal = 1;
        variant_case(&d, &p, 3000 + (uint64_t)g, 0, "GQA causal");
        variant_case(&d, &p, 3100 + (uint64_t)g, 1, "GQA causal dropout");
        d.Lq = 2;
        variant_case(&d, &p, 3200 + (uint64_t)g, 0, "GQA decode");
    }
    vdims d6 = {1, 6, 3, 33, 33, 12, 20}; /* H 6 over 3 K/V heads, Dk != Dv */
    attn_sdpa_params p = {0};
    p.use_softcap = 1, p.softcap = 0.5f, p.alibi_slopes = slopes, p.sinks = sinks;
    variant_case(&d6, &p, 4000, 1, "6:3 all variants dropout");
}

/* ------------------------------------------------------------ grouped decode */

/* Decode (Lq 1..4) with H 8 query heads over G = 1, 2, 4, 8 per K/V head at
 * a head size the kernels read in place (D 64: K and V rows feed the
 * stacked products directly), keys over two chunks (300 = 256 + 44, not a
 * multiple of a vector), rows whose key ranges differ within a group
 * (causal, window, key padding, a bool mask per head) and a group of more
 * rows than one batch (G 8 with Lq 3 or 4: 24 or 32 rows): against the
 * oracle, with and without soft-capping, ALiBi and sinks together. Then the
 * forward bitwise the same on 1, 2 and 3 threads (2 x 2 K/V heads run whole
 * on 1 thread and as chunks spread over the threads on 2 and 3); bf16 the
 * same way with 8 query heads on one K/V head. */
static void test_grouped_decode(void) {
    static float slopes[8] = {0.5f, 0.25f, 0.125f, 0.0625f, 0.03125f, 0.7f, 0.0f, 1.0f / 256};
    static float sinks[8] = {0.5f, -1.0f, 2.0f, 0.0f, -3.0f, 1.0f, 4.0f, -0.25f};
    const int64_t H = 8, Lk = 300, D = 64;
    int n = 0;
    for (int64_t G = 1; G <= 8; G *= 2)
        for (int64_t lq = 1; lq <= 4; lq++, n++) {
            vdims d = {2, H, H / G, lq, Lk, D, D};
            attn_sdpa_params p = {0};
            if (n % 2)
                p.use_softcap = 1, p.softcap = 4.0f, p.alibi_slopes = slopes, p.sinks = sinks;
            int64_t kl[2] = {Lk, 37};
            attn_mask bm;
            uint8_t *bmd = NULL;
            const int mk = (int)((n / 2) % 4);
            switch (mk) {
            case 0: p.causal = 1; break;
            case 1: p.use_window = 1, p.window_left = 200, p.window_right = 0; break;
            case 2: p.key_lengths = kl, p.causal = 1; break;
            default: { /* bool mask [1, H, Lq, Lk] */
                bmd = tu_malloc((size_t)(H * lq * Lk));
                tu_rng r = tu_seed(77 + (uint64_t)n);
                for (int64_t x = 0; x < H * lq * Lk; x++) bmd[x] = tu_unif(&r) < 0.7;
                bm = (attn_mask){bmd, {1, H, lq, Lk}, {0, lq * Lk, Lk, 1}};
                p.bool_mask = &bm;
            }
            }
            char what[96];
            snprintf(what, sizeof what, "grouped decode G %lld Lq %lld mask %d variants %d",
                     (long long)G, (long long)lq, mk, n % 2);
            variant_case(&d, &p, 5000 + (uint64_t)n, 0, what);
            free(bmd);
        }
    /* thread invariance of the grouped decode forward: G 4, Lq 3, 700 keys */
    const int64_t B = 2, Hk = 2, Lq = 3, Lk2 = 700;
    tu_rng r = tu_seed(515);
    const size_t nq = (size_t)(B * H * Lq * D), nk = (size_t)(B * Hk * Lk2 * D),
                 nr = (size_t)(B * H * Lq);
    float *q = tu_malloc(nq * 4), *k = tu_malloc(nk * 4), *v = tu_malloc(nk * 4);
    tu_fill(&r, q, nq, -2, 2), tu_fill(&r, k, nk, -2, 2), tu_fill(&r, v, nk, -1, 1);
    float *o[3], *lse[3];
    for (int t = 0; t < 3; t++) {
        o[t] = tu_malloc(nq * 4), lse[t] = tu_malloc(nr * 4);
        attn_tensor tq = attn_tensor_bhld(q, B, H, Lq, D), tk = attn_tensor_bhld(k, B, Hk, Lk2, D),
                    tv = attn_tensor_bhld(v, B, Hk, Lk2, D),
                    to = attn_tensor_bhld(o[t], B, H, Lq, D);
        attn_sdpa_params p = {0};
        p.causal = 1, p.use_softcap = 1, p.softcap = 3.0f, p.alibi_slopes = slopes, p.sinks = sinks;
        p.impl = ATTN_IMPL_FUSED, p.num_threads = t + 1;
        attn_error err;
        attn_sdpa_info fi;
        CHECK(attn_sdpa_forward(&tq, &tk, &tv, &p, &to, NULL, lse[t], &fi, &err) == ATTN_OK, "%s",
              err.message);
        CHECK(strstr(fi.reason, "decode") != NULL, "not the decode kernels: %s", fi.reason);
    }
    for (int t = 1; t < 3; t++)
        CHECK(memcmp(o[0], o[t], nq * 4) == 0 && memcmp(lse[0], lse[t], nr * 4) == 0,
              "grouped decode: threads 1 vs %d differ", t + 1);
    for (int t = 0; t < 3; t++) free(o[t]), free(lse[t]);
    free(q), free(k), free(v);
    /* bf16: 8 query heads on one K/V head, Lq 3 (24 rows: batches of the
     * kernel's rows mixing heads), against the oracle on the bf16 values
     * (out in fp32; the bound of test_bf16's bf16 out), and bitwise the
     * same on 1 and 3 threads (the group split in parts differently) */
    {
        const vdims d8 = {2, H, 1, Lq, Lk, D, D};
        const size_t nq8 = (size_t)(2 * H * Lq * D), nk8 = (size_t)(2 * Lk * D);
        float *fq = tu_malloc(nq8 * 4), *fk = tu_malloc(nk8 * 4), *fv = tu_malloc(nk8 * 4);
        uint16_t *hq = tu_malloc(nq8 * 2), *hk = tu_malloc(nk8 * 2), *hv = tu_malloc(nk8 * 2);
        tu_fill(&r, fq, nq8, -2, 2), tu_fill(&r, fk, nk8, -2, 2), tu_fill(&r, fv, nk8, -1, 1);
        attn_bf16_from_f32(fq, hq, nq8), attn_bf16_from_f32(fk, hk, nk8);
        attn_bf16_from_f32(fv, hv, nk8);
        attn_f32_from_bf16(hq, fq, nq8), attn_f32_from_bf16(hk, fk, nk8);
        attn_f32_from_bf16(hv, fv, nk8);
        double *q8 = tu_doubles(fq, nq8), *k8 = tu_doubles(fk, nk8), *v8 = tu_doubles(fv, nk8);
        double *out = tu_malloc(nq8 * 8), *lse8 = tu_malloc(nq8 * 8),
               *w8 = tu_malloc(nq8 / D * Lk * 8);
        attn_sdpa_params p = {0};
        p.causal = 1, p.use_softcap = 1, p.softcap = 3.0f, p.alibi_slopes = slopes, p.sinks = sinks;
        oracle(&d8, q8, k8, v8, &p, NULL, NULL, out, lse8, w8, NULL, NULL, NULL, NULL, NULL);
        float *ob[2];
        for (int t = 0; t < 2; t++) {
            ob[t] = tu_malloc(nq8 * 4);
            attn_tensor tq = attn_tensor_bhld_bf16(hq, 2, H, Lq, D),
                        tk = attn_tensor_bhld_bf16(hk, 2, 1, Lk, D),
                        tv = attn_tensor_bhld_bf16(hv, 2, 1, Lk, D),
                        to = attn_tensor_bhld(ob[t], 2, H, Lq, D);
            attn_sdpa_params pb = p;
            pb.dtype = ATTN_BF16, pb.out_dtype = ATTN_F32, pb.impl = ATTN_IMPL_FUSED;
            pb.num_threads = t ? 3 : 1;
            attn_error err;
            CHECK(attn_sdpa_forward(&tq, &tk, &tv, &pb, &to, NULL, NULL, NULL, &err) == ATTN_OK,
                  "%s", err.message);
        }
        const double eo = gu_relerr(ob[0], out, nq8, 1e-3);
        CHECK(eo < 5e-3, "grouped decode bf16 (G 8, Lq 3): out error %.2e", eo);
        CHECK(memcmp(ob[0], ob[1], nq8 * 4) == 0, "grouped decode bf16: threads 1 vs 3 differ");
        free(ob[0]), free(ob[1]), free(fq), free(fk), free(fv), free(hq), free(hk), free(hv);
        free(q8), free(k8), free(v8), free(out), free(lse8), free(w8);
    }
}

/* Grouped decode, bitwise: G 4 (8 query heads over 2 K/V heads), Lq 1 and
 * 3, 700 keys (chunks of 256, the last of 188 = 11·16 + 12: a 16-key tail),
 * D 64, fp32 and bf16: out and lse the same on 1, 2 and 3 threads and the
 * same as the call with H_kv = H on K and V repeated per query head; fp32
 * also the same with K's d stride 2 (scored key by key, each by
 * _mm512_reduce_add_ps on AVX-512, where contiguous rows take 16 keys at
 * once in registers). */
static void test_grouped_decode_bits(void) {
    static float sinks[8] = {0.5f, -1.0f, 2.0f, 0.0f, -3.0f, 1.0f, 4.0f, -0.25f};
    const int64_t H = 8, Hk = 2, G = H / Hk, Lk = 700, D = 64;
    const size_t hs = (size_t)(Lk * D), nk = Hk * hs, nqm = (size_t)(H * 3 * D);
    tu_rng r = tu_seed(919);
    float *q = tu_malloc(nqm * 4), *k = tu_malloc(nk * 4), *v = tu_malloc(nk * 4);
    float *kr = tu_malloc(nk * G * 4), *vr = tu_malloc(nk * G * 4), *k2 = tu_malloc(nk * 8);
    tu_fill(&r, q, nqm, -2, 2), tu_fill(&r, k, nk, -2, 2), tu_fill(&r, v, nk, -1, 1);
    for (int64_t h = 0; h < H; h++) /* query head h's copy of K/V head h / G */
        memcpy(kr + h * hs, k + h / G * hs, hs * 4), memcpy(vr + h * hs, v + h / G * hs, hs * 4);
    for (size_t x = 0; x < nk; x++) k2[2 * x] = k[x], k2[2 * x + 1] = NAN; /* never read */
    uint16_t *hq = tu_malloc(nqm * 2), *hk = tu_malloc(nk * 2), *hv = tu_malloc(nk * 2),
             *hkr = tu_malloc(nk * G * 2), *hvr = tu_malloc(nk * G * 2);
    attn_bf16_from_f32(q, hq, nqm), attn_bf16_from_f32(k, hk, nk), attn_bf16_from_f32(v, hv, nk);
    attn_bf16_from_f32(kr, hkr, nk * G), attn_bf16_from_f32(vr, hvr, nk * G);
    for (int64_t Lq = 1; Lq <= 3; Lq += 2)
        for (int bf = 0; bf < 2; bf++) {
            const size_t nq = (size_t)(H * Lq * D), nr = (size_t)(H * Lq);
            float *o[5], *lse[5]; /* threads 1..3; H_kv = H repeated; K's d stride 2 (fp32) */
            const int runs = bf ? 4 : 5;
            for (int t = 0; t < runs; t++) {
                const int64_t hkv = t == 3 ? H : Hk;
                o[t] = tu_malloc(nq * 4), lse[t] = tu_malloc(nr * 4);
                attn_tensor tq = attn_tensor_bhld(q, 1, H, Lq, D),
                            tk = attn_tensor_bhld(t == 3 ? kr : k, 1, hkv, Lk, D),
                            tv = attn_tensor_bhld(t == 3 ? vr : v, 1, hkv, Lk, D),
                            to = attn_tensor_bhld(o[t], 1, H, Lq, D);
                if (t == 4) /* the same values, d stride 2 */
                    tk = (attn_tensor){k2, {1, Hk, Lk, D}, {2 * (int64_t)nk, 2 * (int64_t)hs,
                                                              2 * D, 2}};
                if (bf) {
                    tq = attn_tensor_bhld_bf16(hq, 1, H, Lq, D);
                    tk = attn_tensor_bhld_bf16(t == 3 ? hkr : hk, 1, hkv, Lk, D);
                    tv = attn_tensor_bhld_bf16(t == 3 ? hvr : hv, 1, hkv, Lk, D);
                }
                attn_sdpa_params p = {0};
                p.causal = 1, p.sinks = sinks, p.impl = ATTN_IMPL_FUSED;
                p.num_threads = t < 3 ? t + 1 : 1;
                if (bf) p.dtype = ATTN_BF16, p.out_dtype = ATTN_F32;
                attn_error err;
                CHECK(attn_sdpa_forward(&tq, &tk, &tv, &p, &to, NULL, lse[t], NULL, &err) ==
                          ATTN_OK,
                      "%s", err.message);
            }
            for (int t = 1; t < runs; t++)
                CHECK(memcmp(o[0], o[t], nq * 4) == 0 && memcmp(lse[0], lse[t], nr * 4) == 0,
                      "grouped decode %s Lq %lld: %s differs from 1 thread", bf ? "bf16" : "fp32",
                      (long long)Lq,
                      t < 3 ? "a thread count" : t == 3 ? "H_kv = H on repeated K/V" : "strided K");
            for (int t = 0; t < runs; t++) free(o[t]), free(lse[t]);
        }
    free(q), free(k), free(v), free(kr), free(vr), free(k2), free(hq), free(hk), free(hv);
    free(hkr), free(hvr);
}

/* ------------------------------------------------------------ pack_gqa */

/* The tiled forward stacks up to 4 query heads of a group in one block
 * (pack_gqa; how many depends on the shape and the thread count). fp32
 * against the oracle for H_kv 1, 2, 4 of 8 at Lq below, at and across the
 * 64-row block, with masks and variants (out, lse, weights and the
 * backward); then, fp32 and bf16, forward out and lse bitwise the same on
 * 1 to 4 threads (4, 2, 2 and 1 heads per block for H_kv 1) and bitwise
 * the same as the call with H_kv = H on K and V repeated per query head
 * (PyTorch's repeat_interleave), whose blocks hold one head each. */
static void test_pack_gqa(void) {
    static float slopes[8] = {0.5f, 0.25f, 0.125f, 0.0625f, 0.03125f, 0.7f, 0.0f, 1.0f / 256};
    static float sinks[8] = {0.5f, -1.0f, 2.0f, 0.0f, -3.0f, 1.0f, 4.0f, -0.25f};
    const int64_t H = 8, lqs[4] = {5, 64, 100, 130};
    int n = 0;
    for (int64_t hk = 1; hk <= 4; hk *= 2)
        for (int x = 0; x < 4; x++, n++) {
            vdims d = {1, H, hk, lqs[x], 150, 32, 32};
            attn_sdpa_params p = {0};
            if (n % 2) p.use_softcap = 1, p.softcap = 4.0f, p.alibi_slopes = slopes, p.sinks = sinks;
            if (n % 3 == 0) p.causal = 1;
            if (n % 3 == 1) p.use_window = 1, p.window_left = 40, p.window_right = 3;
            char what[80];
            snprintf(what, sizeof what, "pack_gqa H_kv %lld Lq %lld", (long long)hk,
                     (long long)lqs[x]);
            variant_case(&d, &p, 7000 + (uint64_t)n, n % 4 == 3, what);
        }
    const int64_t Lq = 130, Lk = 200, D = 32, Hk = 1;
    tu_rng r = tu_seed(717);
    const size_t nq = (size_t)(H * Lq * D), nk = (size_t)(Hk * Lk * D), nr = (size_t)(H * Lq);
    float *q = tu_malloc(nq * 4), *k = tu_malloc(nk * 4), *v = tu_malloc(nk * 4);
    float *kr = tu_malloc(nk * H * 4), *vr = tu_malloc(nk * H * 4);
    tu_fill(&r, q, nq, -2, 2), tu_fill(&r, k, nk, -2, 2), tu_fill(&r, v, nk, -1, 1);
    for (int64_t h = 0; h < H; h++) /* K/V head h / H for query head h */
        memcpy(kr + (size_t)h * nk, k, nk * 4), memcpy(vr + (size_t)h * nk, v, nk * 4);
    uint16_t *hq = tu_malloc(nq * 2), *hk = tu_malloc(nk * 2), *hv = tu_malloc(nk * 2),
             *hkr = tu_malloc(nk * H * 2), *hvr = tu_malloc(nk * H * 2);
    attn_bf16_from_f32(q, hq, nq), attn_bf16_from_f32(k, hk, nk), attn_bf16_from_f32(v, hv, nk);
    attn_bf16_from_f32(kr, hkr, nk * H), attn_bf16_from_f32(vr, hvr, nk * H);
    for (int bf = 0; bf < 2; bf++) {
        float *o[5], *lse[5]; /* threads 1..4 grouped, then H_kv = H on 1 thread */
        for (int t = 0; t < 5; t++) {
            const int64_t hkv = t < 4 ? Hk : H;
            o[t] = tu_malloc(nq * 4), lse[t] = tu_malloc(nr * 4);
            attn_tensor tq = bf ? attn_tensor_bhld_bf16(hq, 1, H, Lq, D) : attn_tensor_bhld(q, 1, H, Lq, D),
                        tk = bf ? attn_tensor_bhld_bf16(t < 4 ? hk : hkr, 1, hkv, Lk, D)
                                : attn_tensor_bhld(t < 4 ? k : kr, 1, hkv, Lk, D),
                        tv = bf ? attn_tensor_bhld_bf16(t < 4 ? hv : hvr, 1, hkv, Lk, D)
                                : attn_tensor_bhld(t < 4 ? v : vr, 1, hkv, Lk, D),
                        to = attn_tensor_bhld(o[t], 1, H, Lq, D);
            attn_sdpa_params p = {0};
            p.causal = 1, p.use_softcap = 1, p.softcap = 3.0f, p.alibi_slopes = slopes;
            p.sinks = sinks, p.impl = ATTN_IMPL_FUSED, p.num_threads = t < 4 ? t + 1 : 1;
            if (bf) p.dtype = ATTN_BF16, p.out_dtype = ATTN_F32;
            attn_error err;
            CHECK(attn_sdpa_forward(&tq, &tk, &tv, &p, &to, NULL, lse[t], NULL, &err) == ATTN_OK,
                  "%s", err.message);
        }
        for (int t = 1; t < 5; t++)
            CHECK(memcmp(o[0], o[t], nq * 4) == 0 && memcmp(lse[0], lse[t], nr * 4) == 0,
                  "pack_gqa %s: %s differs from 1 thread", bf ? "bf16" : "fp32",
                  t < 4 ? "a thread count" : "H_kv = H on repeated K/V");
        for (int t = 0; t < 5; t++) free(o[t]), free(lse[t]);
    }
    free(q), free(k), free(v), free(kr), free(vr), free(hq), free(hk), free(hv), free(hkr),
        free(hvr);
}

/* ------------------------------------------------------------ thread invariance */

/* Bitwise the same for 1, 2 and 3 threads, every variant together: the
 * tiled kernels (Lq 130), decode (Lq 2, one key chunk) and split-KV decode
 * (Lq 1, 3000 keys: 12 chunks of 256; B·H = 4 heads run whole on 1 thread
 * and as chunks spread over the threads on 2 and 3). */
static void test_threads(void) {
    static float slopes[4] = {0.5f, 0.25f, 0.125f, 0.0625f}, sinks[4] = {0.5f, -1.0f, 2.0f, 0.0f};
    const int64_t B = 2, H = 4, Hk = 2, Lq = 130, LkMax = 3000, D = 16;
    tu_rng r = tu_seed(4242);
    const size_t nqm = (size_t)(B * H * Lq * D), nkm = (size_t)(B * Hk * LkMax * D);
    float *q = tu_malloc(nqm * 4), *k = tu_malloc(nkm * 4), *v = tu_malloc(nkm * 4),
          *g = tu_malloc(nqm * 4);
    tu_fill(&r, q, nqm, -2, 2), tu_fill(&r, k, nkm, -2, 2), tu_fill(&r, v, nkm, -1, 1);
    tu_fill(&r, g, nqm, -1, 1);
    for (int dec = 0; dec < 3; dec++) {
        const int64_t lq = dec == 0 ? Lq : dec == 1 ? 2 : 1, Lk = dec == 2 ? LkMax : 200;
        const int64_t b = dec == 2 ? 1 : B; /* split-KV: B·H = 4 */
        const size_t nq = (size_t)(b * H * lq * D), nk = (size_t)(b * Hk * Lk * D);
        float *res[3][6];
        for (int t = 0; t < 3; t++) {
            float *o = tu_malloc(nq * 4), *lse = tu_malloc((size_t)(b * H * lq) * 4);
            float *dq = tu_malloc(nq * 4), *dk = tu_malloc(nk * 4), *dv = tu_malloc(nk * 4);
            float *ds = tu_malloc(16);
            attn_tensor tq = attn_tensor_bhld(q, b, H, lq, D), tk = attn_tensor_bhld(k, b, Hk, Lk, D),
                        tv = attn_tensor_bhld(v, b, Hk, Lk, D), to = attn_tensor_bhld(o, b, H, lq, D),
                        tg = attn_tensor_bhld(g, b, H, lq, D), tdq = attn_tensor_bhld(dq, b, H, lq, D),
                        tdk = attn_tensor_bhld(dk, b, Hk, Lk, D),
                        tdv = attn_tensor_bhld(dv, b, Hk, Lk, D);
            attn_sdpa_params p = {0};
            p.causal = 1, p.use_softcap = 1, p.softcap = 3.0f, p.alibi_slopes = slopes;
            p.sinks = sinks, p.d_sinks = ds, p.num_threads = t + 1;
            attn_error err;
            attn_sdpa_info fi, bi;
            CHECK(attn_sdpa_forward(&tq, &tk, &tv, &p, &to, NULL, lse, &fi, &err) == ATTN_OK, "%s",
                  err.message);
            CHECK(attn_sdpa_backward(&tq, &tk, &tv, &to, lse, &tg, &p, &tdq, &tdk, &tdv, &bi,
                                     &err) == ATTN_OK,
                  "%s", err.message);
            CHECK(fi.impl == ATTN_IMPL_FUSED && bi.impl == ATTN_IMPL_FUSED, "not fused: %s / %s",
                  fi.reason, bi.reason);
            res[t][0] = o, res[t][1] = lse, res[t][2] = dq, res[t][3] = dk, res[t][4] = dv;
            res[t][5] = ds;
        }
        const size_t n[6] = {nq, (size_t)(b * H * lq), nq, nk, nk, 4};
        for (int x = 0; x < 6; x++) {
            for (int t = 1; t < 3; t++)
                CHECK(memcmp(res[0][x], res[t][x], n[x] * 4) == 0,
                      "threads 1 vs %d differ in output %d (case %d)", t + 1, x, dec);
            for (int t = 0; t < 3; t++) free(res[t][x]);
        }
    }
    free(q), free(k), free(v), free(g);
}

/* ------------------------------------------------------------ varlen */

/* Three sequences (one without keys) packed, every variant and GQA 4:2, vs
 * the oracle on each sequence alone. */
static void test_varlen(void) {
    static float slopes[4] = {0.5f, 0.25f, 0.125f, 0.0625f}, sinks[4] = {0.5f, -1.0f, 2.0f, 0.0f};
    const int64_t H = 4, Hk = 2, D = 8, cq[4] = {0, 5, 75, 78}, ck[4] = {0, 9, 109, 109};
    const int64_t TQ = 78, TK = 109;
    tu_rng r = tu_seed(99);
    float *q = tu_malloc((size_t)(H * TQ * D) * 4), *k = tu_malloc((size_t)(Hk * TK * D) * 4),
          *v = tu_malloc((size_t)(Hk * TK * D) * 4), *g = tu_malloc((size_t)(H * TQ * D) * 4);
    tu_fill(&r, q, (size_t)(H * TQ * D), -2, 2), tu_fill(&r, k, (size_t)(Hk * TK * D), -2, 2);
    tu_fill(&r, v, (size_t)(Hk * TK * D), -1, 1), tu_fill(&r, g, (size_t)(H * TQ * D), -1, 1);
    for (int impl = 0; impl < 2; impl++) {
        float *o = tu_malloc((size_t)(H * TQ * D) * 4), *lse = tu_malloc((size_t)(H * TQ) * 4);
        float *dq = tu_malloc((size_t)(H * TQ * D) * 4), *dk = tu_malloc((size_t)(Hk * TK * D) * 4),
              *dv = tu_malloc((size_t)(Hk * TK * D) * 4), ds[4];
        attn_tensor tq = attn_tensor_blhd(q, 1, H, TQ, D), tk = attn_tensor_blhd(k, 1, Hk, TK, D),
                    tv = attn_tensor_blhd(v, 1, Hk, TK, D), to = attn_tensor_blhd(o, 1, H, TQ, D),
                    tg = attn_tensor_blhd(g, 1, H, TQ, D), tdq = attn_tensor_blhd(dq, 1, H, TQ, D),
                    tdk = attn_tensor_blhd(dk, 1, Hk, TK, D), tdv = attn_tensor_blhd(dv, 1, Hk, TK, D);
        attn_sdpa_params p = {0};
        p.causal = 1, p.use_softcap = 1, p.softcap = 2.0f, p.alibi_slopes = slopes, p.sinks = sinks;
        p.d_sinks = ds, p.impl = impl ? ATTN_IMPL_AUTO : ATTN_IMPL_REFERENCE;
        attn_error err;
        attn_sdpa_info fi, bi;
        CHECK(attn_sdpa_varlen_forward(&tq, &tk, &tv, 3, cq, ck, &p, &to, NULL, lse, &fi, &err) ==
                  ATTN_OK,
              "varlen forward: %s", err.message);
        CHECK(attn_sdpa_varlen_backward(&tq, &tk, &tv, &to, lse, &tg, 3, cq, ck, &p, &tdq, &tdk,
                                        &tdv, &bi, &err) == ATTN_OK,
              "varlen backward: %s", err.message);
        const attn_impl want = impl ? ATTN_IMPL_FUSED : ATTN_IMPL_REFERENCE;
        CHECK(fi.impl == want && bi.impl == want, "varlen impl %d ran: %s / %s", impl, fi.reason,
              bi.reason);
        double wds[4] = {0, 0, 0, 0}, eo = 0, edq = 0, edk = 0, edv = 0, el = 0;
        for (int s = 0; s < 3; s++) {
            const vdims d = {1, H, Hk, cq[s + 1] - cq[s], ck[s + 1] - ck[s], D, D};
            if (d.Lq == 0) continue;
            const int64_t lk = d.Lk > 0 ? d.Lk : 1;
            double *sq = tu_malloc((size_t)(H * d.Lq * D) * 8), *sg = tu_malloc((size_t)(H * d.Lq * D) * 8);
            double *sk = tu_malloc((size_t)(Hk * lk * D) * 8), *sv = tu_malloc((size_t)(Hk * lk * D) * 8);
            for (int64_t h = 0; h < H; h++)
                for (int64_t i = 0; i < d.Lq; i++)
                    for (int64_t c = 0; c < D; c++) {
                        sq[(h * d.Lq + i) * D + c] = q[((cq[s] + i) * H + h) * D + c];
                        sg[(h * d.Lq + i) * D + c] = g[((cq[s] + i) * H + h) * D + c];
                    }
            for (int64_t h = 0; h < Hk; h++)
                for (int64_t j = 0; j < d.Lk; j++)
                    for (int64_t c = 0; c < D; c++) {
                        sk[(h * d.Lk + j) * D + c] = k[((ck[s] + j) * Hk + h) * D + c];
                        sv[(h * d.Lk + j) * D + c] = v[((ck[s] + j) * Hk + h) * D + c];
                    }
            double *out = tu_malloc((size_t)(H * d.Lq * D) * 8), *l = tu_malloc((size_t)(H * d.Lq) * 8),
                   *w = tu_malloc((size_t)(H * d.Lq * lk) * 8), *wq = tu_malloc((size_t)(H * d.Lq * D) * 8),
                   *wk = tu_malloc((size_t)(Hk * lk * D) * 8), *wv = tu_malloc((size_t)(Hk * lk * D) * 8), ws[4];
            oracle(&d, sq, sk, sv, &p, NULL, NULL, out, l, w, sg, wq, wk, wv, ws);
            for (int h = 0; h < 4; h++) wds[h] += ws[h];
            for (int64_t h = 0; h < H; h++)
                for (int64_t i = 0; i < d.Lq; i++) {
                    el = fmax(el, fabs((double)lse[h * TQ + cq[s] + i] - l[h * d.Lq + i]));
                    for (int64_t c = 0; c < D; c++) {
                        eo = fmax(eo, fabs((double)o[((cq[s] + i) * H + h) * D + c] - out[(h * d.Lq + i) * D + c]));
                        edq = fmax(edq, fabs((double)dq[((cq[s] + i) * H + h) * D + c] - wq[(h * d.Lq + i) * D + c]));
                    }
                }
            for (int64_t h = 0; h < Hk; h++)
                for (int64_t j = 0; j < d.Lk; j++)
                    for (int64_t c = 0; c < D; c++) {
                        edk = fmax(edk, fabs((double)dk[((ck[s] + j) * Hk + h) * D + c] - wk[(h * d.Lk + j) * D + c]));
                        edv = fmax(edv, fabs((double)dv[((ck[s] + j) * Hk + h) * D + c] - wv[(h * d.Lk + j) * D + c]));
                    }
            free(sq), free(sg), free(sk), free(sv), free(out), free(l), free(w), free(wq), free(wk), free(wv);
        }
        double eds = 0;
        for (int h = 0; h < 4; h++) eds = fmax(eds, fabs((double)ds[h] - wds[h]));
        CHECK(eo < 1e-5 && el < 1e-5 && edq < 1e-4 && edk < 1e-4 && edv < 1e-4 && eds < 1e-4,
              "varlen impl %d: out %.2e lse %.2e dq %.2e dk %.2e dv %.2e d_sinks %.2e", impl, eo, el,
              edq, edk, edv, eds);
        free(o), free(lse), free(dq), free(dk), free(dv);
    }
    free(q), free(k), free(v), free(g);
}

/* ------------------------------------------------------------ bf16 */

/* bf16 q, k, v and out with every variant and GQA: against the oracle on
 * the bf16 values (out rounded to bf16: within 2^-8 relative plus the
 * fp32 error); gradients within 1e-2 of max (P and dS in bf16). */
static void test_bf16(void) {
    static float slopes[4] = {0.5f, 0.25f, 0.125f, 0.0625f}, sinks[4] = {0.5f, -1.0f, 2.0f, 0.0f};
    const vdims d = {2, 4, 2, 70, 100, 16, 16};
    const size_t nq = (size_t)(d.B * d.H * d.Lq * d.Dk), nk = (size_t)(d.B * d.Hkv * d.Lk * d.Dk);
    tu_rng r = tu_seed(31);
    float *f[4];
    uint16_t *h[4];
    const size_t n[4] = {nq, nk, nk, nq};
    for (int x = 0; x < 4; x++) {
        f[x] = tu_malloc(n[x] * 4), h[x] = tu_malloc(n[x] * 2);
        tu_fill(&r, f[x], n[x], x == 2 || x == 3 ? -1 : -2, x == 2 || x == 3 ? 1 : 2);
        attn_bf16_from_f32(f[x], h[x], n[x]);
        attn_f32_from_bf16(h[x], f[x], n[x]);
    }
    double *q = tu_doubles(f[0], nq), *k = tu_doubles(f[1], nk), *v = tu_doubles(f[2], nk),
           *g = tu_doubles(f[3], nq);
    attn_sdpa_params p = {0};
    p.causal = 1, p.use_softcap = 1, p.softcap = 2.0f, p.alibi_slopes = slopes, p.sinks = sinks;
    double *out = tu_malloc(nq * 8), *lse = tu_malloc(nq * 8), *w = tu_malloc(nq / 16 * 100 * 8);
    double *dq = tu_malloc(nq * 8), *dk = tu_malloc(nk * 8), *dv = tu_malloc(nk * 8), ds[4];
    oracle(&d, q, k, v, &p, NULL, NULL, out, lse, w, g, dq, dk, dv, ds);
    for (int impl = 0; impl < 2; impl++) {
        uint16_t *o = tu_malloc(nq * 2);
        float *of = tu_malloc(nq * 4), *ls = tu_malloc(nq / 16 * 4), *gq = tu_malloc(nq * 4),
              *gk = tu_malloc(nk * 4), *gv = tu_malloc(nk * 4), gs[4];
        attn_tensor tq = attn_tensor_bhld_bf16(h[0], 2, 4, 70, 16),
                    tk = attn_tensor_bhld_bf16(h[1], 2, 2, 100, 16),
                    tv = attn_tensor_bhld_bf16(h[2], 2, 2, 100, 16),
                    to = attn_tensor_bhld_bf16(o, 2, 4, 70, 16),
                    tg = attn_tensor_bhld_bf16(h[3], 2, 4, 70, 16),
                    tdq = attn_tensor_bhld(gq, 2, 4, 70, 16), tdk = attn_tensor_bhld(gk, 2, 2, 100, 16),
                    tdv = attn_tensor_bhld(gv, 2, 2, 100, 16);
        attn_sdpa_params pb = p;
        pb.dtype = pb.out_dtype = ATTN_BF16, pb.d_sinks = gs, pb.num_threads = 1;
        pb.impl = impl ? ATTN_IMPL_AUTO : ATTN_IMPL_REFERENCE;
        attn_error err;
        attn_sdpa_info fi, bi;
        CHECK(attn_sdpa_forward(&tq, &tk, &tv, &pb, &to, NULL, ls, &fi, &err) == ATTN_OK, "%s",
              err.message);
        CHECK(attn_sdpa_backward(&tq, &tk, &tv, &to, ls, &tg, &pb, &tdq, &tdk, &tdv, &bi, &err) ==
                  ATTN_OK,
              "%s", err.message);
        const attn_impl want = impl ? ATTN_IMPL_FUSED : ATTN_IMPL_REFERENCE;
        CHECK(fi.impl == want && bi.impl == want, "bf16 impl %d ran: %s / %s", impl, fi.reason,
              bi.reason);
        if (impl) { /* the bf16 kernels: the same bits on 3 threads (two-pass schemes) */
            uint16_t *o3 = tu_malloc(nq * 2);
            float *ls3 = tu_malloc(nq / 16 * 4), *gq3 = tu_malloc(nq * 4), *gk3 = tu_malloc(nk * 4),
                  *gv3 = tu_malloc(nk * 4), gs3[4];
            attn_tensor to3 = attn_tensor_bhld_bf16(o3, 2, 4, 70, 16),
                        tdq3 = attn_tensor_bhld(gq3, 2, 4, 70, 16),
                        tdk3 = attn_tensor_bhld(gk3, 2, 2, 100, 16),
                        tdv3 = attn_tensor_bhld(gv3, 2, 2, 100, 16);
            attn_sdpa_params p3 = pb;
            p3.num_threads = 3, p3.d_sinks = gs3;
            CHECK(attn_sdpa_forward(&tq, &tk, &tv, &p3, &to3, NULL, ls3, NULL, &err) == ATTN_OK,
                  "%s", err.message);
            CHECK(attn_sdpa_backward(&tq, &tk, &tv, &to3, ls3, &tg, &p3, &tdq3, &tdk3, &tdv3, NULL,
                                     &err) == ATTN_OK,
                  "%s", err.message);
            CHECK(memcmp(o, o3, nq * 2) == 0 && memcmp(ls, ls3, nq / 16 * 4) == 0 &&
                      memcmp(gq, gq3, nq * 4) == 0 && memcmp(gk, gk3, nk * 4) == 0 &&
                      memcmp(gv, gv3, nk * 4) == 0 && memcmp(gs, gs3, sizeof gs) == 0,
                  "bf16: threads 1 (default %d) vs 3 differ", pb.num_threads);
            free(o3), free(ls3), free(gq3), free(gk3), free(gv3);
        }
        attn_f32_from_bf16(o, of, nq);
        const double eo = gu_relerr(of, out, nq, 1e-3), eq = gu_relerr(gq, dq, nq, 1e-3),
                     ek = gu_relerr(gk, dk, nk, 1e-3), ev = gu_relerr(gv, dv, nk, 1e-3),
                     es = gu_relerr(gs, ds, 4, 1e-3);
        /* out: bf16 rounding of the output (2^-9 relative) plus fp32 error;
         * gradients: from the bf16-rounded out (d_sinks through dO·O) */
        CHECK(eo < 5e-3 && eq < 2e-2 && ek < 2e-2 && ev < 2e-2 && es < 2e-2,
              "bf16 impl %d: out %.2e dq %.2e dk %.2e dv %.2e d_sinks %.2e", impl, eo, eq, ek, ev, es);
        free(o), free(of), free(ls), free(gq), free(gk), free(gv);
    }
    for (int x = 0; x < 4; x++) free(f[x]), free(h[x]);
    free(q), free(k), free(v), free(g), free(out), free(lse), free(w), free(dq), free(dk), free(dv);
}

/* ------------------------------------------------------------ bad input */

static void test_errors(void) {
    float q[4 * 3 * 2 * 4], k[4 * 2 * 2 * 4], o[4 * 3 * 2 * 4], slopes[3] = {1, 1, 1},
                                                               sinks[3] = {0, 0, 0};
    memset(q, 0, sizeof q), memset(k, 0, sizeof k);
    attn_tensor tq = attn_tensor_bhld(q, 1, 3, 2, 4), tk = attn_tensor_bhld(k, 1, 2, 2, 4),
                to = attn_tensor_bhld(o, 1, 3, 2, 4);
    attn_error e;
    attn_sdpa_params p = {0};
    /* 3 query heads over 2 K/V heads */
    CHECK_ERR(attn_sdpa_forward(&tq, &tk, &tk, &p, &to, NULL, NULL, NULL, &e), ATTN_ERR_SHAPE, &e);
    CHECK(strstr(e.message, "multiple") != NULL, "H %% Hkv message: %s", e.message);
    /* k and v with different head counts */
    attn_tensor tk1 = attn_tensor_bhld(k, 1, 1, 2, 4), tq3 = attn_tensor_bhld(q, 1, 3, 2, 4);
    CHECK_ERR(attn_sdpa_forward(&tq3, &tk1, &tk, &p, &to, NULL, NULL, NULL, &e), ATTN_ERR_SHAPE, &e);
    const float bad_caps[4] = {0.0f, -1.0f, NAN, INFINITY};
    for (int x = 0; x < 4; x++) {
        p = (attn_sdpa_params){0};
        p.use_softcap = 1, p.softcap = bad_caps[x];
        CHECK_ERR(attn_sdpa_forward(&tq3, &tk1, &tk1, &p, &to, NULL, NULL, NULL, &e), ATTN_ERR_ARG,
                  &e);
        CHECK(strstr(e.message, "softcap") != NULL, "softcap message: %s", e.message);
    }
    p = (attn_sdpa_params){0};
    p.softcap = 2.0f; /* without use_softcap */
    CHECK_ERR(attn_sdpa_forward(&tq3, &tk1, &tk1, &p, &to, NULL, NULL, NULL, &e), ATTN_ERR_ARG, &e);
    CHECK(strstr(e.message, "use_softcap") != NULL, "use_softcap message: %s", e.message);
    const float nonfinite[3] = {NAN, INFINITY, -INFINITY};
    for (int x = 0; x < 3; x++) {
        p = (attn_sdpa_params){0};
        slopes[2] = nonfinite[x];
        p.alibi_slopes = slopes;
        CHECK_ERR(attn_sdpa_forward(&tq3, &tk1, &tk1, &p, &to, NULL, NULL, NULL, &e), ATTN_ERR_ARG,
                  &e);
        CHECK(strstr(e.message, "alibi_slopes[2]") != NULL, "slopes message: %s", e.message);
        slopes[2] = 1;
        p = (attn_sdpa_params){0};
        sinks[1] = nonfinite[x];
        p.sinks = sinks;
        CHECK_ERR(attn_sdpa_forward(&tq3, &tk1, &tk1, &p, &to, NULL, NULL, NULL, &e), ATTN_ERR_ARG,
                  &e);
        CHECK(strstr(e.message, "sinks[1]") != NULL, "sinks message: %s", e.message);
        sinks[1] = 0;
    }
    /* the backward checks dk, dv against k, v (H_kv heads) */
    float lse[6] = {0}, g[24] = {0}, dq[24], dk[8], dv[8];
    attn_tensor tg = attn_tensor_bhld(g, 1, 3, 2, 4), tdq = attn_tensor_bhld(dq, 1, 3, 2, 4),
                tdk = attn_tensor_bhld(dk, 1, 1, 2, 4), tdk3 = attn_tensor_bhld(dq, 1, 3, 2, 4);
    p = (attn_sdpa_params){0};
    CHECK_ERR(attn_sdpa_backward(&tq3, &tk1, &tk1, &to, lse, &tg, &p, &tdq, &tdk3, &tdk, NULL, &e),
              ATTN_ERR_SHAPE, &e);
    attn_tensor tdv = attn_tensor_bhld(dv, 1, 1, 2, 4);
    memset(o, 0, sizeof o);
    CHECK(attn_sdpa_backward(&tq3, &tk1, &tk1, &to, lse, &tg, &p, &tdq, &tdk, &tdv, NULL, &e) ==
              ATTN_OK,
          "MQA backward: %s", e.message);
}

/* ------------------------------------------ the kernels' vector tanh */

/* Error of y against t = tanh(x) in fp64, in ulps of the float nearest t
 * (the float spacing at |t|; denormal spacing near 0). */
static double ulps(float y, double t) {
    const float tf = (float)t;
    const double sp = tf == 0.0f ? ldexp(1.0, -149)
                                 : fabs((double)nextafterf(fabsf(tf), INFINITY) - fabs((double)tf));
    return fabs((double)y - t) / sp;
}

/* Soft-capping's tanh on every ISA row the CPU runs (fp32 and bf16 kernels)
 * against fp64 tanh: tiny |x| (where 1 - 2/(e^{2x} + 1) would cancel: the
 * polynomial side), the 0.625 switch, large |x| (saturation to ±1),
 * ±0, ±inf, NaN; and 1 - tanh², the backward's factor, to within the
 * rounding of t (the reference's 1 - t·t). */
static void test_tanh(void) {
    enum { N = 40000 };
    static float x[N], y[N];
    int n = 0;
    for (int e = -149; e <= 6 && n < N - 200; e++) /* ±2^e and the 2^e..2^e+1 ramp */
        for (int k = 0; k < 24; k++) {
            const float a = ldexpf(1.0f + (float)k / 24.0f, e);
            x[n++] = a, x[n++] = -a;
        }
    for (int k = 0; n < N - 8; k++) x[n++] = -12.0f + 24.0f * (float)k / 30000.0f;
    x[n++] = 0.0f, x[n++] = -0.0f, x[n++] = 0.625f, x[n++] = nextafterf(0.625f, 1.0f);
    x[n++] = INFINITY, x[n++] = -INFINITY, x[n++] = NAN, x[n++] = 1e30f;
    for (int row = 0; attn_test_isa_name(row); row++)
        for (int bf = 0; bf < 2; bf++) {
            if (!attn_test_tanh(row, bf, x, y, n)) continue;
            double worst = 0.0, wd = 0.0;
            float wx = 0.0f;
            int bad = 0;
            for (int i = 0; i < n; i++) {
                if (isnan(x[i])) {
                    bad += !isnan(y[i]);
                    continue;
                }
                const double t = tanh((double)x[i]), u = ulps(y[i], t);
                bad += y[i] > 1.0f || y[i] < -1.0f || signbit(y[i]) != signbit(x[i]);
                if (u > worst) worst = u, wx = x[i];
                /* 1 - y², against 1 - t² in fp64: the error y's own error
                 * makes (2|t|·|y - t|) plus fp32 rounding */
                const double dc = 1.0 - (double)y[i] * y[i], dt = 1.0 - t * t;
                const double allow = 2.0 * fabs(t) * fabs((double)y[i] - t) + 2e-7;
                if (fabs((double)(1.0f - y[i] * y[i]) - dt) > allow + 1e-7 || fabs(dc - dt) > allow)
                    wd = fmax(wd, fabs(dc - dt));
            }
            CHECK(bad == 0, "%s%s tanh: %d values out of [-1, 1], with the wrong sign or not NaN",
                  attn_test_isa_name(row), bf ? " bf16" : "", bad);
            CHECK(worst <= 4.0, "%s%s tanh: %.2f ulp at x = %g (want <= 4)", attn_test_isa_name(row),
                  bf ? " bf16" : "", worst, (double)wx);
            CHECK(wd == 0.0, "%s%s 1 - tanh^2: error %g past its bound", attn_test_isa_name(row),
                  bf ? " bf16" : "", wd);
            printf("  tanh %s%s: worst %.2f ulp (x = %g) over %d values\n",
                   attn_test_isa_name(row), bf ? " bf16" : "", worst, (double)wx, n);
        }
}

int main(void) {
    attn_enable_amx(); /* the amx row too, where the CPU has it */
    test_tanh();
    test_oracle_fd();
    test_errors();
    test_variants_grid();
    test_grouped_decode();
    test_grouped_decode_bits();
    test_pack_gqa();
    test_threads();
    test_varlen();
    test_bf16();
    return tu_report("test_sdpa_variants");
}
