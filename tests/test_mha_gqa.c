/* The multi-head layer with grouped-query / multi-query attention
 * (attn_mha_config.num_kv_heads = H_kv < H) against an fp64 layer written
 * here from attn.h's definition:
 *     Qp = query Wqᵀ + bq [.., E],  Kp = key Wkᵀ + bk, Vp = value Wvᵀ + bv
 *     [.., Ekv], Ekv = H_kv·E/H; query head h attends with K/V head
 *     h / (H / H_kv) (PyTorch's repeat_interleave), out = Ao Woᵀ + bo.
 *
 *   - Parameter layout: attn_mha_param_count and the pointers of
 *     attn_mha_weights_from_buffer against the sizes worked out here.
 *   - Forward (H_kv = 1 (MQA), 2, 3 and H of H = 6; self- and
 *     cross-attention with kdim, vdim != E; bias on and off; causal, key
 *     padding, sinks; both paths; per-head weights) vs the fp64 layer:
 *     1e-5 of max|out| (fp32 sums of <= 24 terms, ~1e-7 from fp64, as in
 *     test_mha.c).
 *   - Backward: every input and parameter gradient and d_sinks vs central
 *     differences of the fp64 layer's loss Σ G∘out (h = 1e-5 in fp64: exact
 *     to ~1e-9), TOL 2e-5 of the tensor's max|grad| (test_mha_grad.c's
 *     bound and argument).
 *   - H_kv = H gives bitwise what num_kv_heads 0 (plain MHA) gives: forward,
 *     weights and every gradient.
 *   - Decoding: attn_mha_step token by token and in chunks, stacked and
 *     separate weight buffers, vs the causal forward's rows of the prefix
 *     and the fp64 layer (1e-5 of max|out|); with soft-capping, ALiBi and
 *     sinks over rows at different lengths vs the forward with them.
 *   - The KV cache's bytes: its keys and values take 2·batch·max_len·Ekv
 *     floats, H/H_kv times fewer than with H heads.
 *   - 1, 2 and 3 threads give bitwise the same forward, backward and steps.
 *   - A bad num_kv_heads (negative, > H, not dividing H) is ATTN_ERR_SHAPE
 *     from every call taking the config; a step whose config's H_kv is not
 *     the cache's is ATTN_ERR_SHAPE. */
#include "testutil.h"

#define TOL_FWD 1e-5
#define TOL_GRAD 2e-5
#define FD_H 1e-5

/* ------------------------------------------------------------ fp64 layer */

enum { P_WQ, P_WK, P_WV, P_BQ, P_BK, P_BV, P_WO, P_BO, NPARAM }; /* the packed order */
static const char *const pname[NPARAM] = {"w_q", "w_k", "w_v", "b_q", "b_k", "b_v", "w_o", "b_o"};

typedef struct {
    int64_t E, H, Hkv, kd, vd;
    int bias;
    int64_t B, Lq, Lk;
    int causal;
    const int64_t *klen; /* [B] or NULL */
    int sinks;           /* one sink logit per query head */
} shape;

static int64_t ekv(const shape *s) { return s->Hkv * (s->E / s->H); }

/* Floats of parameter i, worked out from the definition. */
static int64_t psize(const shape *s, int i) {
    const int64_t E = s->E, Ekv = ekv(s);
    switch (i) {
    case P_WQ:
    case P_WO: return E * E;
    case P_WK: return Ekv * s->kd;
    case P_WV: return Ekv * s->vd;
    case P_BQ:
    case P_BO: return s->bias ? E : 0;
    default: return s->bias ? Ekv : 0; /* b_k, b_v */
    }
}

/* The fp64 values of one call: parameters, inputs, sinks. */
typedef struct {
    double *w[NPARAM];
    double *xq, *xk, *xv; /* [B, Lq, E], [B, Lk, kd], [B, Lk, vd]; aliases for self-attention */
    double *sink;         /* [H] or NULL */
} vals;

/* out [B, Lq, E] (and weights [B, H, Lq, Lk] when wts) of the fp64 layer. */
static void layer64(const shape *s, const vals *v, double *out, double *wts) {
    const int64_t E = s->E, H = s->H, Dh = E / H, Ekv = ekv(s), G = H / s->Hkv;
    const int64_t B = s->B, Lq = s->Lq, Lk = s->Lk;
    double *Qp = tu_malloc((size_t)(B * Lq * E) * sizeof(double));
    double *Kp = tu_malloc((size_t)(B * Lk * Ekv) * sizeof(double));
    double *Vp = tu_malloc((size_t)(B * Lk * Ekv) * sizeof(double));
    double *Ao = tu_malloc((size_t)(B * Lq * E) * sizeof(double));
    double *sc = tu_malloc((size_t)Lk * sizeof(double));
    const double *X[3] = {v->xq, v->xk, v->xv}, *W[3] = {v->w[P_WQ], v->w[P_WK], v->w[P_WV]};
    const double *Bi[3] = {v->w[P_BQ], v->w[P_BK], v->w[P_BV]};
    double *Y[3] = {Qp, Kp, Vp};
    const int64_t rows[3] = {B * Lq, B * Lk, B * Lk}, in[3] = {E, s->kd, s->vd},
                  outw[3] = {E, Ekv, Ekv};
    for (int m = 0; m < 3; m++)
        for (int64_t r = 0; r < rows[m]; r++)
            for (int64_t o = 0; o < outw[m]; o++) {
                double acc = s->bias ? Bi[m][o] : 0.0;
                for (int64_t c = 0; c < in[m]; c++)
                    acc += X[m][r * in[m] + c] * W[m][o * in[m] + c];
                Y[m][r * outw[m] + o] = acc;
            }
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++) {
            const int64_t g = h / G; /* the K/V head of query head h */
            for (int64_t i = 0; i < Lq; i++) {
                double mx = v->sink ? v->sink[h] : -INFINITY, den = 0.0;
                int any = 0;
                for (int64_t j = 0; j < Lk; j++) {
                    const int on = (!s->causal || j <= i + Lk - Lq) && (!s->klen || j < s->klen[b]);
                    sc[j] = -INFINITY;
                    if (!on) continue;
                    double d = 0.0;
                    for (int64_t e = 0; e < Dh; e++)
                        d +=
                            Qp[(b * Lq + i) * E + h * Dh + e] * Kp[(b * Lk + j) * Ekv + g * Dh + e];
                    sc[j] = d / sqrt((double)Dh);
                    mx = sc[j] > mx ? sc[j] : mx;
                    any = 1;
                }
                if (any) {
                    if (v->sink) den += exp(v->sink[h] - mx);
                    for (int64_t j = 0; j < Lk; j++)
                        if (sc[j] > -INFINITY)
                            den += (sc[j] = exp(sc[j] - mx));
                        else
                            sc[j] = 0.0;
                }
                for (int64_t j = 0; j < Lk; j++) {
                    sc[j] = any ? sc[j] / den : 0.0; /* a row without keys: 0 */
                    if (wts) wts[((b * H + h) * Lq + i) * Lk + j] = sc[j];
                }
                for (int64_t e = 0; e < Dh; e++) {
                    double acc = 0.0;
                    for (int64_t j = 0; j < Lk; j++)
                        acc += sc[j] * Vp[(b * Lk + j) * Ekv + g * Dh + e];
                    Ao[(b * Lq + i) * E + h * Dh + e] = acc;
                }
            }
        }
    for (int64_t r = 0; r < B * Lq; r++)
        for (int64_t o = 0; o < E; o++) {
            double acc = s->bias ? v->w[P_BO][o] : 0.0;
            for (int64_t c = 0; c < E; c++) acc += Ao[r * E + c] * v->w[P_WO][o * E + c];
            out[r * E + o] = acc;
        }
    free(Qp), free(Kp), free(Vp), free(Ao), free(sc);
}

static double loss64(const shape *s, const vals *v, const double *G) {
    const size_t n = (size_t)(s->B * s->Lq * s->E);
    double *out = tu_malloc(n * sizeof(double)), L = 0.0;
    layer64(s, v, out, NULL);
    for (size_t i = 0; i < n; i++) L += G[i] * out[i];
    free(out);
    return L;
}

/* Central difference of the loss in x[0 .. n) into d. */
static void fd(const shape *s, const vals *v, const double *G, double *x, int64_t n, double *d) {
    for (int64_t i = 0; i < n; i++) {
        const double x0 = x[i];
        x[i] = x0 + FD_H;
        const double lp = loss64(s, v, G);
        x[i] = x0 - FD_H;
        const double lm = loss64(s, v, G);
        x[i] = x0;
        d[i] = (lp - lm) / (2 * FD_H);
    }
}

/* ------------------------------------------------------------ the library side */

static attn_mha_config cfg_of(const shape *s) {
    attn_mha_config c;
    memset(&c, 0, sizeof c);
    c.embed_dim = s->E, c.num_heads = s->H, c.kdim = s->kd, c.vdim = s->vd, c.bias = s->bias;
    c.num_kv_heads = s->Hkv;
    return c;
}

/* A layer's fp32 parameters (random, biases included) and their fp64 copies. */
typedef struct {
    float *buf;
    size_t count;
    attn_mha_weights w;
    float *param[NPARAM]; /* w's pointers in the packed order */
} layer;

static void layer_new(const shape *s, uint64_t seed, layer *l) {
    attn_mha_config c = cfg_of(s);
    attn_error err;
    l->count = 0;
    CHECK(attn_mha_param_count(&c, &l->count, &err) == ATTN_OK, "%s", err.message);
    l->buf = tu_malloc(l->count * sizeof(float));
    CHECK(attn_mha_weights_from_buffer(&c, l->buf, &l->w, &err) == ATTN_OK, "%s", err.message);
    float *p[NPARAM] = {l->w.w_q, l->w.w_k, l->w.w_v, l->w.b_q,
                        l->w.b_k, l->w.b_v, l->w.w_o, l->w.b_o};
    memcpy(l->param, p, sizeof p);
    tu_rng r = tu_seed(seed);
    tu_fill(&r, l->buf, l->count, -0.5f, 0.5f); /* nonzero biases too */
}

static void vals_new(const shape *s, const layer *l, const float *xq, const float *xk,
                     const float *xv, const float *sink, vals *v) {
    for (int i = 0; i < NPARAM; i++)
        v->w[i] = psize(s, i) ? tu_doubles(l->param[i], (size_t)psize(s, i)) : NULL;
    v->xq = tu_doubles(xq, (size_t)(s->B * s->Lq * s->E));
    v->xk = xk == xq ? v->xq : tu_doubles(xk, (size_t)(s->B * s->Lk * s->kd));
    v->xv = xv == xq ? v->xq : xv == xk ? v->xk : tu_doubles(xv, (size_t)(s->B * s->Lk * s->vd));
    v->sink = sink ? tu_doubles(sink, (size_t)s->H) : NULL;
}

static void vals_free(vals *v) {
    for (int i = 0; i < NPARAM; i++) free(v->w[i]);
    if (v->xv != v->xq && v->xv != v->xk) free(v->xv);
    if (v->xk != v->xq) free(v->xk);
    free(v->xq), free(v->sink);
}

static attn_sdpa_params params_of(const shape *s, const float *sink, attn_impl impl, int threads) {
    attn_sdpa_params p;
    memset(&p, 0, sizeof p);
    p.causal = s->causal, p.key_lengths = s->klen, p.sinks = sink, p.impl = impl;
    p.num_threads = threads;
    return p;
}

static double rel(const float *got, const double *want, size_t n) {
    double m = 0.0;
    for (size_t i = 0; i < n; i++) m = fabs(want[i]) > m ? fabs(want[i]) : m;
    return tu_maxdiff(got, want, n) / (m > 0 ? m : 1.0);
}

/* ------------------------------------------------------------ layout */

static void test_layout(void) {
    const shape cases[] = {{24, 6, 2, 24, 24, 1, 0, 0, 0, 0, NULL, 0},
                           {24, 6, 1, 10, 14, 0, 0, 0, 0, 0, NULL, 0},
                           {24, 6, 3, 10, 14, 1, 0, 0, 0, 0, NULL, 0}};
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        const shape *s = &cases[k];
        layer l;
        layer_new(s, 1 + k, &l);
        size_t want = 0;
        for (int i = 0; i < NPARAM; i++) {
            const ptrdiff_t at = l.param[i] ? l.param[i] - l.buf : -1;
            CHECK(psize(s, i) ? at == (ptrdiff_t)want : l.param[i] == NULL,
                  "case %zu: %s at %td, want %zu", k, pname[i], at, want);
            want += (size_t)psize(s, i);
        }
        CHECK(l.count == want, "case %zu: param_count %zu, want %zu", k, l.count, want);
        free(l.buf);
    }
}

/* ------------------------------------------------------------ forward, backward */

static double g_worst_fwd, g_worst_grad;

/* One call of shape s on path impl: forward (with per-head weights) vs the
 * fp64 layer; then the backward vs central differences. self: query, key
 * and value are one buffer (and d_query = d_key = d_value one buffer). */
static void check_case(const char *name, const shape *s, int self, attn_impl impl) {
    const int64_t E = s->E, H = s->H, B = s->B, Lq = s->Lq, Lk = s->Lk;
    attn_mha_config c = cfg_of(s);
    layer l;
    layer_new(s, 77 + (uint64_t)s->Hkv, &l);
    tu_rng r = tu_seed(5 + (uint64_t)s->Hkv);
    const size_t nq = (size_t)(B * Lq * E), nk = (size_t)(B * Lk * s->kd),
                 nv = (size_t)(B * Lk * s->vd), nw = (size_t)(B * H * Lq * Lk);
    float *xq = tu_malloc(nq * sizeof(float)), *xk = xq, *xv = xq;
    tu_fill(&r, xq, nq, -1.0f, 1.0f);
    if (!self) {
        xk = tu_malloc(nk * sizeof(float)), xv = tu_malloc(nv * sizeof(float));
        tu_fill(&r, xk, nk, -1.0f, 1.0f), tu_fill(&r, xv, nv, -1.0f, 1.0f);
    }
    float sink[16];
    for (int64_t h = 0; h < H; h++) sink[h] = (float)(0.3 * (double)h - 0.5);
    const float *sk = s->sinks ? sink : NULL;
    vals v;
    vals_new(s, &l, xq, xk, xv, sk, &v);

    /* forward */
    size_t ncache = 0;
    attn_error err;
    CHECK(attn_mha_cache_size(&c, B, Lq, Lk, &ncache, &err) == ATTN_OK, "%s", err.message);
    CHECK(ncache == (size_t)(B * (2 * Lq * E + 2 * Lk * ekv(s) + H * Lq)), "%s: cache %zu", name,
          ncache);
    float *cache = tu_malloc(ncache * sizeof(float)), *out = tu_malloc(nq * sizeof(float));
    float *w32 = tu_malloc(nw * sizeof(float));
    double *out64 = tu_malloc(nq * sizeof(double)), *w64 = tu_malloc(nw * sizeof(double));
    attn_sdpa_params p = params_of(s, sk, impl, 0);
    attn_status st = attn_mha_forward(&c, &l.w, B, Lq, Lk, xq, xk, xv, &p, out,
                                      ATTN_WEIGHTS_PER_HEAD, w32, cache, &err);
    CHECK(st == ATTN_OK, "%s: forward: %s", name, err.message);
    layer64(s, &v, out64, w64);
    const double eo = rel(out, out64, nq), ew = tu_maxdiff(w32, w64, nw);
    g_worst_fwd = eo > g_worst_fwd ? eo : g_worst_fwd;
    CHECK(eo <= TOL_FWD, "%s: out error %.3g of max|out|", name, eo);
    CHECK(ew <= TOL_FWD, "%s: weights error %.3g", name, ew);

    /* backward: gradients into zeroed buffers, vs central differences */
    double *G = tu_malloc(nq * sizeof(double));
    float *g32 = tu_malloc(nq * sizeof(float));
    for (size_t i = 0; i < nq; i++) G[i] = g32[i] = (float)(tu_unif(&r) * 2.0 - 1.0);
    float *gbuf = calloc(l.count, sizeof(float));
    attn_mha_weights gw;
    CHECK(attn_mha_weights_from_buffer(&c, gbuf, &gw, &err) == ATTN_OK, "%s", err.message);
    float *dq = calloc(nq, sizeof(float)), *dk = self ? dq : calloc(nk, sizeof(float));
    float *dv = self ? dq : calloc(nv, sizeof(float)), dsink[16] = {0};
    p.d_sinks = s->sinks ? dsink : NULL;
    st = attn_mha_backward(&c, &l.w, B, Lq, Lk, xq, xk, xv, &p, cache, g32, dq, dk, dv, &gw, &err);
    CHECK(st == ATTN_OK, "%s: backward: %s", name, err.message);
    /* each tensor: (library gradient, fp64 values to perturb, size) */
    struct {
        const char *what;
        const float *got;
        double *x;
        int64_t n;
    } t[NPARAM + 4];
    int nt = 0;
    const float *gp[NPARAM] = {gw.w_q, gw.w_k, gw.w_v, gw.b_q, gw.b_k, gw.b_v, gw.w_o, gw.b_o};
    for (int i = 0; i < NPARAM; i++)
        if (psize(s, i))
            t[nt].what = pname[i], t[nt].got = gp[i], t[nt].x = v.w[i], t[nt++].n = psize(s, i);
    t[nt].what = self ? "d_x" : "d_query", t[nt].got = dq, t[nt].x = v.xq, t[nt++].n = (int64_t)nq;
    if (!self) {
        t[nt].what = "d_key", t[nt].got = dk, t[nt].x = v.xk, t[nt++].n = (int64_t)nk;
        t[nt].what = "d_value", t[nt].got = dv, t[nt].x = v.xv, t[nt++].n = (int64_t)nv;
    }
    if (s->sinks) t[nt].what = "d_sinks", t[nt].got = dsink, t[nt].x = v.sink, t[nt++].n = H;
    double wk_scale = 0.0; /* max|dL/dw_k| */
    for (int i = 0; i < nt; i++) {
        double *want = tu_malloc((size_t)t[i].n * sizeof(double));
        fd(s, &v, G, t[i].x, t[i].n, want);
        double e = rel(t[i].got, want, (size_t)t[i].n);
        if (!strcmp(t[i].what, "w_k"))
            for (int64_t j = 0; j < t[i].n; j++) wk_scale = fmax(wk_scale, fabs(want[j]));
        if (!strcmp(t[i].what, "b_k")) {
            /* q·(k_j + b_k) shifts a whole score row by q·b_k, which softmax
             * ignores: without sinks the exact b_k gradient is 0 (a sink's
             * logit is not shifted, so with sinks it is not). The library's
             * colsum(dKp) keeps the rounding of the dKp rows, so it is then
             * measured against max|dL/dw_k| = max|dKpᵀ key|, built from the
             * same rows (as test_mha_grad.c does). */
            double m = 0.0;
            for (int64_t j = 0; j < t[i].n; j++) m = fmax(m, fabs(want[j]));
            if (!s->sinks) {
                CHECK(m <= 1e-9 * fmax(1.0, wk_scale), "%s: fp64 FD b_k gradient %.3g, not 0", name,
                      m);
                e = tu_maxdiff(t[i].got, want, (size_t)t[i].n) / wk_scale;
            }
        }
        g_worst_grad = e > g_worst_grad ? e : g_worst_grad;
        CHECK(e <= TOL_GRAD, "%s: %s error %.3g of max|grad|", name, t[i].what, e);
        free(want);
    }
    vals_free(&v);
    free(l.buf), free(gbuf), free(cache), free(out), free(w32), free(out64), free(w64), free(G);
    free(g32), free(dq);
    if (!self) free(xk), free(xv), free(dk), free(dv);
    free(xq);
}

static void test_against_fp64(void) {
    const int64_t kl[2] = {7, 4};
    const int hkv[] = {1, 2, 3, 6};
    for (size_t a = 0; a < sizeof hkv / sizeof *hkv; a++)
        for (int impl = ATTN_IMPL_REFERENCE; impl <= ATTN_IMPL_FUSED; impl++) {
            char name[96];
            const char *path = impl == ATTN_IMPL_FUSED ? "fused" : "reference";
            /* self-attention, causal, bias */
            shape s = {24, 6, hkv[a], 24, 24, 1, 2, 7, 7, 1, NULL, 0};
            snprintf(name, sizeof name, "self causal H_kv %d %s", hkv[a], path);
            check_case(name, &s, 1, (attn_impl)impl);
            /* cross-attention, kdim/vdim != E, no bias, key padding, sinks */
            shape x = {24, 6, hkv[a], 10, 14, 0, 2, 5, 7, 0, kl, 1};
            snprintf(name, sizeof name, "cross padded sinks H_kv %d %s", hkv[a], path);
            check_case(name, &x, 0, (attn_impl)impl);
            /* decode-shaped cross call (Lq 1 < Lk), causal, bias */
            shape d = {24, 6, hkv[a], 24, 24, 1, 2, 1, 9, 1, NULL, 0};
            snprintf(name, sizeof name, "decode-shaped H_kv %d %s", hkv[a], path);
            check_case(name, &d, 0, (attn_impl)impl);
        }
    printf("worst vs fp64: forward %.3g of max|out|, gradients %.3g of max|grad|\n", g_worst_fwd,
           g_worst_grad);
}

/* ------------------------------------------------------------ H_kv = H is MHA */

static void test_full_heads_is_mha(void) {
    const int64_t E = 24, H = 6, B = 2, L = 9;
    attn_mha_config c0 = {E, H, 0, 0, 1, 0}, cH = c0;
    cH.num_kv_heads = H;
    size_t n0 = 0, nH = 0, nc = 0;
    attn_mha_param_count(&c0, &n0, NULL), attn_mha_param_count(&cH, &nH, NULL);
    attn_mha_cache_size(&c0, B, L, L, &nc, NULL);
    CHECK(n0 == nH);
    float *buf = tu_malloc(n0 * sizeof(float)), *x = tu_malloc((size_t)(B * L * E) * sizeof(float));
    attn_mha_weights w0, wH;
    attn_mha_weights_from_buffer(&c0, buf, &w0, NULL),
        attn_mha_weights_from_buffer(&cH, buf, &wH, NULL);
    CHECK(!memcmp(&w0, &wH, sizeof w0));
    tu_rng r = tu_seed(9);
    tu_fill(&r, buf, n0, -0.5f, 0.5f), tu_fill(&r, x, (size_t)(B * L * E), -1, 1);
    float *out[2], *wts[2], *cache[2], *dx[2], *g[2];
    attn_mha_config *cs[2] = {&c0, &cH};
    attn_sdpa_params p;
    memset(&p, 0, sizeof p);
    p.causal = 1;
    for (int k = 0; k < 2; k++) {
        out[k] = tu_malloc((size_t)(B * L * E) * sizeof(float));
        wts[k] = tu_malloc((size_t)(B * H * L * L) * sizeof(float));
        cache[k] = tu_malloc(nc * sizeof(float));
        dx[k] = calloc((size_t)(B * L * E), sizeof(float));
        g[k] = calloc(n0, sizeof(float));
        attn_mha_weights gw;
        attn_mha_weights_from_buffer(cs[k], g[k], &gw, NULL);
        CHECK(attn_mha_forward(cs[k], &w0, B, L, L, x, x, x, &p, out[k], ATTN_WEIGHTS_PER_HEAD,
                               wts[k], cache[k], NULL) == ATTN_OK);
        CHECK(attn_mha_backward(cs[k], &w0, B, L, L, x, x, x, &p, cache[k], x, dx[k], dx[k], dx[k],
                                &gw, NULL) == ATTN_OK);
    }
    CHECK(!memcmp(out[0], out[1], (size_t)(B * L * E) * sizeof(float)), "H_kv = H: out differs");
    CHECK(!memcmp(wts[0], wts[1], (size_t)(B * H * L * L) * sizeof(float)), "weights differ");
    CHECK(!memcmp(dx[0], dx[1], (size_t)(B * L * E) * sizeof(float)), "d_x differs");
    CHECK(!memcmp(g[0], g[1], n0 * sizeof(float)), "parameter gradients differ");
    for (int k = 0; k < 2; k++) free(out[k]), free(wts[k]), free(cache[k]), free(dx[k]), free(g[k]);
    free(buf), free(x);
}

/* ------------------------------------------------------------ decoding */

static void *kv_new(const attn_mha_config *c, attn_mha_kv *kv, int64_t batch, int64_t max_len,
                    int64_t max_step, int threads) {
    attn_mha_kv_shape sh = {batch, max_len, max_step, threads};
    size_t bytes = 0;
    attn_error err;
    CHECK(attn_mha_kv_bytes(c, &sh, &bytes, &err) == ATTN_OK, "%s", err.message);
    void *mem = tu_malloc(bytes);
    CHECK(attn_mha_kv_init(c, &sh, mem, bytes, kv, &err) == ATTN_OK, "%s", err.message);
    return mem;
}

/* Steps of `chunk` positions (1: token by token) over a B x L sequence vs
 * the causal forward of the whole sequence and the fp64 layer; separate:
 * w_q, w_k, w_v in separate buffers (three products, not the stacked one). */
enum { DEC_B = 2, DEC_L = 11 }; /* keep: DEC_B·DEC_L·E floats */

static void check_decode(int64_t Hkv, int64_t chunk, int separate, int threads, float *keep) {
    const int64_t E = 24, H = 6, B = DEC_B, L = DEC_L;
    const shape s = {E, H, Hkv, E, E, 1, B, L, L, 1, NULL, 0};
    attn_mha_config c = cfg_of(&s);
    layer l;
    layer_new(&s, 300 + (uint64_t)Hkv, &l);
    attn_mha_weights w = l.w;
    float *sep = NULL;
    if (separate) { /* the same values, not stacked */
        sep = tu_malloc(l.count * 2 * sizeof(float));
        const int64_t Ekv = ekv(&s);
        w.w_q = sep, w.w_k = sep + E * E + 64, w.w_v = w.w_k + Ekv * E + 64;
        memcpy(w.w_q, l.w.w_q, (size_t)(E * E) * sizeof(float));
        memcpy(w.w_k, l.w.w_k, (size_t)(Ekv * E) * sizeof(float));
        memcpy(w.w_v, l.w.w_v, (size_t)(Ekv * E) * sizeof(float));
    }
    const size_t n = (size_t)(B * L * E);
    float *x = tu_malloc(n * sizeof(float)), *full = tu_malloc(n * sizeof(float));
    float *got = tu_malloc(n * sizeof(float)), *xs = tu_malloc(n * sizeof(float));
    float *ys = tu_malloc(n * sizeof(float));
    tu_rng r = tu_seed(41);
    tu_fill(&r, x, n, -1.0f, 1.0f);
    attn_sdpa_params p;
    memset(&p, 0, sizeof p);
    p.causal = 1;
    CHECK(attn_mha_forward(&c, &l.w, B, L, L, x, x, x, &p, full, ATTN_WEIGHTS_NONE, NULL, NULL,
                           NULL) == ATTN_OK);
    vals v;
    vals_new(&s, &l, x, x, x, NULL, &v);
    double *want = tu_malloc(n * sizeof(double));
    layer64(&s, &v, want, NULL);
    vals_free(&v);

    attn_mha_kv kv;
    void *mem = kv_new(&c, &kv, B, L, chunk, threads);
    CHECK(kv.num_kv_heads == Hkv, "kv.num_kv_heads %lld", (long long)kv.num_kv_heads);
    attn_sdpa_params sp;
    memset(&sp, 0, sizeof sp);
    sp.num_threads = threads;
    for (int64_t t0 = 0; t0 < L; t0 += chunk) {
        const int64_t T = t0 + chunk <= L ? chunk : L - t0;
        for (int64_t b = 0; b < B; b++)
            memcpy(xs + b * T * E, x + (b * L + t0) * E, (size_t)(T * E) * sizeof(float));
        attn_error err;
        CHECK(attn_mha_step(&c, &w, &kv, B, T, xs, &sp, ys, &err) == ATTN_OK, "step: %s",
              err.message);
        for (int64_t b = 0; b < B; b++)
            memcpy(got + (b * L + t0) * E, ys + b * T * E, (size_t)(T * E) * sizeof(float));
    }
    CHECK(kv.len[0] == L && kv.len[1] == L);
    const double e_fwd = rel(got, want, n);
    double m = 0.0, d = 0.0;
    for (size_t i = 0; i < n; i++) {
        m = fabs(full[i]) > m ? fabs(full[i]) : m;
        d = fabs(full[i] - got[i]) > d ? fabs(full[i] - got[i]) : d;
    }
    CHECK(e_fwd <= TOL_FWD, "H_kv %lld chunk %lld: step vs fp64 %.3g", (long long)Hkv,
          (long long)chunk, e_fwd);
    CHECK(d <= TOL_FWD * m, "H_kv %lld chunk %lld: step vs forward %.3g", (long long)Hkv,
          (long long)chunk, d / m);
    if (keep) memcpy(keep, got, n * sizeof(float));
    free(mem), free(l.buf), free(sep), free(x), free(full), free(got), free(xs), free(ys);
    free(want);
}

static void test_decode(void) {
    const int hkv[] = {1, 2, 3};
    for (size_t a = 0; a < 3; a++)
        for (int64_t chunk = 1; chunk <= 4; chunk += 3)
            for (int sep = 0; sep < 2; sep++) check_decode(hkv[a], chunk, sep, 0, NULL);
}

/* Steps with soft-capping, ALiBi and sinks over rows at different lengths
 * (row 1 starts `lag` positions after row 0), in chunks of 1 and 2
 * positions, vs attn_mha_forward with the same variants over each row's
 * prefix. */
static void test_decode_variants(void) {
    enum { E = 24, H = 6, L = 9, LAG = 3 };
    const shape s = {E, H, 2, E, E, 1, 1, L, L, 1, NULL, 0};
    attn_mha_config c = cfg_of(&s);
    layer l;
    layer_new(&s, 900, &l);
    static float x[2][L * E], want[2][L * E], got[2][L * E];
    tu_rng r = tu_seed(901);
    tu_fill(&r, &x[0][0], 2 * L * E, -1.0f, 1.0f);
    const float slopes[H] = {0.5f, 0.25f, 0.125f, 0.0625f, 0.03125f, 0.015625f};
    const float sinks[H] = {0.5f, -0.5f, 1.0f, 0.0f, 2.0f, -1.0f};
    attn_sdpa_params p;
    memset(&p, 0, sizeof p);
    p.use_softcap = 1, p.softcap = 2.0f; /* small: the cap bends the scores */
    p.alibi_slopes = slopes, p.sinks = sinks;
    for (int b = 0; b < 2; b++) {
        attn_sdpa_params f = p;
        f.causal = 1;
        const int64_t len = b ? L - LAG : L;
        CHECK(attn_mha_forward(&c, &l.w, 1, len, len, x[b], x[b], x[b], &f, want[b],
                               ATTN_WEIGHTS_NONE, NULL, NULL, NULL) == ATTN_OK);
    }
    for (int64_t chunk = 1; chunk <= 2; chunk++) {
        attn_mha_kv kv;
        void *mem = kv_new(&c, &kv, 2, L, chunk, 0);
        float xs[2 * 2 * E], ys[2 * 2 * E];
        int64_t t = 0;
        while (t < L) {
            const int64_t n = t < LAG ? 1 : 2; /* row 1 joins at position LAG of row 0 */
            int64_t T = chunk;
            if (t + T > L) T = L - t;
            if (t < LAG && t + T > LAG) T = LAG - t;
            for (int64_t b = 0; b < n; b++)
                memcpy(xs + b * T * E, x[b] + (b ? t - LAG : t) * E,
                       (size_t)(T * E) * sizeof(float));
            attn_error err;
            CHECK(attn_mha_step(&c, &l.w, &kv, n, T, xs, &p, ys, &err) == ATTN_OK, "step: %s",
                  err.message);
            for (int64_t b = 0; b < n; b++)
                memcpy(got[b] + (b ? t - LAG : t) * E, ys + b * T * E,
                       (size_t)(T * E) * sizeof(float));
            t += T;
        }
        for (int b = 0; b < 2; b++) {
            const size_t m = (size_t)((b ? L - LAG : L) * E);
            double *w64 = tu_doubles(want[b], m), mx = tu_maxabs(want[b], m);
            const double e = tu_maxdiff(got[b], w64, m) / mx;
            CHECK(e <= TOL_FWD, "variants, chunk %lld, row %d: step vs forward %.3g",
                  (long long)chunk, b, e);
            free(w64);
        }
        free(mem);
    }
    /* an invalid cap is the SDPA call's error, with the lengths unchanged */
    attn_mha_kv kv;
    void *mem = kv_new(&c, &kv, 1, L, 1, 0);
    attn_error err;
    p.softcap = -1.0f;
    float y[E];
    CHECK_ERR(attn_mha_step(&c, &l.w, &kv, 1, 1, x[0], &p, y, &err), ATTN_ERR_ARG, &err);
    CHECK(kv.len[0] == 0);
    free(mem), free(l.buf);
}

/* The keys and values take 2·batch·max_len·Ekv floats: H/H_kv times fewer. */
static void test_kv_bytes(void) {
    const int64_t E = 64, H = 8, batch = 1, T = 4096;
    const attn_mha_kv_shape sh = {batch, T, 1, 2};
    size_t bytes[9] = {0};
    for (int64_t hkv = 1; hkv <= H; hkv++) {
        if (H % hkv) continue;
        attn_mha_config c = {E, H, 0, 0, 1, hkv};
        attn_error err;
        CHECK(attn_mha_kv_bytes(&c, &sh, &bytes[hkv], &err) == ATTN_OK, "%s", err.message);
        /* the cache proper is at least K and V */
        CHECK(bytes[hkv] >= (size_t)(2 * batch * T * hkv * (E / H)) * sizeof(float));
    }
    for (int64_t hkv = 1; hkv < H; hkv *= 2) {
        /* what H_kv saves over H heads: exactly K and V's share (the rest
         * of the block, the step's scratch, does not depend on H_kv), up
         * to the 64-byte rounding of the 4 parts that hold K/V floats */
        const double saved = (double)(bytes[H] - bytes[hkv]);
        const double kv_saved =
            (double)(2 * batch * T * (H - hkv) * (E / H) * 4 + 2 * batch * (H - hkv) * (E / H) * 4);
        CHECK(fabs(saved - kv_saved) <= 4 * 64, "H_kv %lld: saves %.0f bytes, K/V %.0f",
              (long long)hkv, saved, kv_saved);
    }
    printf("kv bytes over %lld positions, E %lld, H %lld: H_kv 8: %zu, 4: %zu, 2: %zu, 1: %zu "
           "(8/2: %.2fx)\n",
           (long long)T, (long long)E, (long long)H, bytes[8], bytes[4], bytes[2], bytes[1],
           (double)bytes[8] / (double)bytes[2]);
}

/* ------------------------------------------------------------ threads */

static void test_threads(void) {
    const shape s = {24, 6, 2, 24, 24, 1, 2, 13, 13, 1, NULL, 0};
    const int64_t E = s.E, B = s.B, L = s.Lq;
    attn_mha_config c = cfg_of(&s);
    layer l;
    layer_new(&s, 55, &l);
    const size_t n = (size_t)(B * L * E);
    size_t nc = 0;
    attn_mha_cache_size(&c, B, L, L, &nc, NULL);
    float *x = tu_malloc(n * sizeof(float)), *gout = tu_malloc(n * sizeof(float));
    tu_rng r = tu_seed(66);
    tu_fill(&r, x, n, -1, 1), tu_fill(&r, gout, n, -1, 1);
    float *out[3], *dx[3], *g[3], *steps[3];
    const size_t nsteps = (size_t)(DEC_B * DEC_L * E);
    for (int k = 0; k < 3; k++) {
        attn_sdpa_params p;
        memset(&p, 0, sizeof p);
        p.causal = 1, p.num_threads = k + 1;
        float *cache = tu_malloc(nc * sizeof(float));
        out[k] = tu_malloc(n * sizeof(float)), dx[k] = calloc(n, sizeof(float));
        g[k] = calloc(l.count, sizeof(float)), steps[k] = tu_malloc(nsteps * sizeof(float));
        attn_mha_weights gw;
        attn_mha_weights_from_buffer(&c, g[k], &gw, NULL);
        CHECK(attn_mha_forward(&c, &l.w, B, L, L, x, x, x, &p, out[k], ATTN_WEIGHTS_NONE, NULL,
                               cache, NULL) == ATTN_OK);
        CHECK(attn_mha_backward(&c, &l.w, B, L, L, x, x, x, &p, cache, gout, dx[k], dx[k], dx[k],
                                &gw, NULL) == ATTN_OK);
        free(cache);
        check_decode(2, 1, 0, k + 1, steps[k]);
    }
    for (int k = 1; k < 3; k++) {
        CHECK(!memcmp(out[0], out[k], n * sizeof(float)), "%d threads: forward differs", k + 1);
        CHECK(!memcmp(dx[0], dx[k], n * sizeof(float)), "%d threads: d_x differs", k + 1);
        CHECK(!memcmp(g[0], g[k], l.count * sizeof(float)), "%d threads: grads differ", k + 1);
        CHECK(!memcmp(steps[0], steps[k], nsteps * sizeof(float)), "%d threads: steps differ",
              k + 1);
    }
    for (int k = 0; k < 3; k++) free(out[k]), free(dx[k]), free(g[k]), free(steps[k]);
    free(x), free(gout), free(l.buf);
}

/* ------------------------------------------------------------ bad H_kv */

static void test_bad_kv_heads(void) {
    const int64_t bad[] = {-1, -6, 7, 4, 5};
    float buf[8] = {0}, x[24] = {0}, out[24];
    for (size_t k = 0; k < sizeof bad / sizeof *bad; k++) {
        attn_mha_config c = {24, 6, 0, 0, 1, bad[k]};
        attn_mha_weights w = {buf, buf, buf, buf, buf, buf, buf, buf};
        attn_mha_kv_shape sh = {1, 8, 1, 1};
        attn_error err;
        size_t n;
        CHECK_ERR(attn_mha_param_count(&c, &n, &err), ATTN_ERR_SHAPE, &err);
        CHECK(strstr(err.message, "num_kv_heads") != NULL, "message: %s", err.message);
        CHECK_ERR(attn_mha_weights_from_buffer(&c, buf, &w, &err), ATTN_ERR_SHAPE, &err);
        CHECK_ERR(attn_mha_init(&c, &w, 1, &err), ATTN_ERR_SHAPE, &err);
        CHECK_ERR(attn_mha_cache_size(&c, 1, 1, 1, &n, &err), ATTN_ERR_SHAPE, &err);
        CHECK_ERR(attn_mha_forward(&c, &w, 1, 1, 1, x, x, x, NULL, out, ATTN_WEIGHTS_NONE, NULL,
                                   NULL, &err),
                  ATTN_ERR_SHAPE, &err);
        CHECK_ERR(attn_mha_kv_bytes(&c, &sh, &n, &err), ATTN_ERR_SHAPE, &err);
    }
    /* a step whose config's H_kv is not the cache's */
    attn_mha_config c2 = {24, 6, 0, 0, 1, 2}, c3 = c2;
    c3.num_kv_heads = 3;
    layer l;
    const shape s = {24, 6, 3, 24, 24, 1, 1, 1, 1, 0, NULL, 0};
    layer_new(&s, 3, &l);
    attn_mha_kv kv;
    void *mem = kv_new(&c2, &kv, 1, 8, 1, 1);
    attn_error err;
    CHECK_ERR(attn_mha_step(&c3, &l.w, &kv, 1, 1, x, NULL, out, &err), ATTN_ERR_SHAPE, &err);
    CHECK(kv.len[0] == 0);
    free(mem), free(l.buf);
}

int main(void) {
    test_layout();
    test_against_fp64();
    test_full_heads_is_mha();
    test_decode();
    test_decode_variants();
    test_kv_bytes();
    test_threads();
    test_bad_kv_heads();
    return tu_report("test_mha_gqa");
}
