/* attn_mha_forward against an fp64 re-implementation of
 * torch.nn.MultiheadAttention (batch_first): Q = query W_qᵀ + b_q (likewise K
 * from key, V from value), split E into H heads of E/H, SDPA per head (the
 * oracle in ref_oracle.h), concat, out = concat W_oᵀ + b_o.
 * Also attn_mha_param_count / weights_from_buffer / init.
 *
 * Tolerance: inputs in [-1, 1], weights ~ Xavier (|w| <= 0.5), E <= 32: each
 * projection is a dot product of <= 32 terms, ~32*eps relative error, which
 * the softmax and output projection carry through at most a few-fold, so
 * 1e-5 relative to max|out| (and 1e-5 absolute on the weights, in [0, 1])
 * leaves a margin over the measured error. */
#include "ref_oracle.h"

#define TOL_OUT 1e-5 /* relative to max(1, max|out|) */
#define TOL_W 1e-5

static double g_err_out, g_err_w;

/* y[n, o] = sum_i x[n, i] W[o, i] + b[o]   (W is [out, in], PyTorch layout) */
static void linear(const double *x, int64_t n, int64_t in, const float *W, const float *b,
                   int64_t out, double *y) {
    for (int64_t r = 0; r < n; r++)
        for (int64_t o = 0; o < out; o++) {
            double acc = b ? (double)b[o] : 0.0;
            for (int64_t i = 0; i < in; i++) acc += x[r * in + i] * (double)W[o * in + i];
            y[r * out + o] = acc;
        }
}

/* fp64 MHA. out [B, Lq, E]; weights [B, H, Lq, Lk] (per head, always). */
static void ref_mha(const attn_mha_config *c, const attn_mha_weights *w, int64_t B, int64_t Lq,
                    int64_t Lk, const float *query, const float *key, const float *value,
                    const attn_sdpa_params *p, double *out, double *weights) {
    const int64_t E = c->embed_dim, H = c->num_heads, hd = E / H;
    const int64_t kd = c->kdim ? c->kdim : E, vd = c->vdim ? c->vdim : E;
    attn_sdpa_params none = {0};
    if (!p) p = &none;
    double *xq = tu_doubles(query, (size_t)(B * Lq * E));
    double *xk = tu_doubles(key, (size_t)(B * Lk * kd));
    double *xv = tu_doubles(value, (size_t)(B * Lk * vd));
    double *Q = tu_malloc((size_t)(B * Lq * E) * sizeof(double));
    double *K = tu_malloc((size_t)(B * Lk * E) * sizeof(double));
    double *V = tu_malloc((size_t)(B * Lk * E) * sizeof(double));
    double *qh = tu_malloc((size_t)(B * Lq * E) * sizeof(double));
    double *kh = tu_malloc((size_t)(B * Lk * E) * sizeof(double));
    double *vh = tu_malloc((size_t)(B * Lk * E) * sizeof(double));
    double *oh = tu_malloc((size_t)(B * Lq * E) * sizeof(double));
    double *lse = tu_malloc((size_t)(B * H * Lq) * sizeof(double));
    linear(xq, B * Lq, E, w->w_q, w->b_q, E, Q);
    linear(xk, B * Lk, kd, w->w_k, w->b_k, E, K);
    linear(xv, B * Lk, vd, w->w_v, w->b_v, E, V);
    ref_split_heads(Q, B, Lq, H, hd, qh);
    ref_split_heads(K, B, Lk, H, hd, kh);
    ref_split_heads(V, B, Lk, H, hd, vh);
    ref_sdpa(B, H, Lq, Lk, hd, hd, qh, kh, vh, p, oh, weights, lse, NULL);
    ref_merge_heads(oh, B, Lq, H, hd, Q); /* reuse Q as the concat buffer */
    linear(Q, B * Lq, E, w->w_o, w->b_o, E, out);
    free(xq), free(xk), free(xv), free(Q), free(K), free(V);
    free(qh), free(kh), free(vh), free(oh), free(lse);
}

typedef struct {
    const char *name;
    int64_t E, H, kdim, vdim;
    int bias;
    int64_t B, Lq, Lk;
    int self; /* query == key == value pointer */
} mha_case;

static void run_mha(const mha_case *mc, const attn_sdpa_params *p, attn_weights_mode mode,
                    attn_impl impl, uint64_t seed) {
    const int64_t E = mc->E, H = mc->H, B = mc->B, Lq = mc->Lq, Lk = mc->Lk;
    attn_mha_config c = {E, H, mc->kdim, mc->vdim, mc->bias, 0};
    const int64_t kd = c.kdim ? c.kdim : E, vd = c.vdim ? c.vdim : E;
    attn_error err;
    memset(&err, 0, sizeof err);
    tu_rng r = tu_seed(seed);

    size_t np = 0;
    attn_status st = attn_mha_param_count(&c, &np, &err);
    CHECK(st == ATTN_OK, "%s: param_count: %s", mc->name, err.message);
    float *params = tu_malloc(np * sizeof(float));
    attn_mha_weights w;
    st = attn_mha_weights_from_buffer(&c, params, &w, &err);
    CHECK(st == ATTN_OK, "%s: weights_from_buffer: %s", mc->name, err.message);
    if (st != ATTN_OK) {
        free(params);
        return;
    }
    tu_fill(&r, params, np, -0.5f, 0.5f); /* nonzero biases too */

    float *query = tu_malloc((size_t)(B * Lq * E) * sizeof(float));
    float *key = mc->self ? query : tu_malloc((size_t)(B * Lk * kd) * sizeof(float));
    float *value = mc->self ? query : tu_malloc((size_t)(B * Lk * vd) * sizeof(float));
    tu_fill(&r, query, (size_t)(B * Lq * E), -1.0f, 1.0f);
    if (!mc->self) {
        tu_fill(&r, key, (size_t)(B * Lk * kd), -1.0f, 1.0f);
        tu_fill(&r, value, (size_t)(B * Lk * vd), -1.0f, 1.0f);
    }

    const size_t nO = (size_t)(B * Lq * E), nWh = (size_t)(B * H * Lq * Lk);
    double *ro = tu_malloc(nO * sizeof(double)), *rw = tu_malloc(nWh * sizeof(double));
    ref_mha(&c, &w, B, Lq, Lk, query, key, value, p, ro, rw);
    size_t nW = nWh;
    if (mode == ATTN_WEIGHTS_AVERAGE) { /* mean over heads, in place */
        nW = (size_t)(B * Lq * Lk);
        for (int64_t b = 0; b < B; b++)
            for (int64_t ij = 0; ij < Lq * Lk; ij++) {
                double s = 0.0;
                for (int64_t h = 0; h < H; h++) s += rw[(b * H + h) * Lq * Lk + ij];
                rw[b * Lq * Lk + ij] = s / (double)H;
            }
    }

    attn_sdpa_params pp = {0}, *pu = NULL;
    if (p || impl != ATTN_IMPL_AUTO) {
        if (p) pp = *p;
        pp.impl = impl;
        pu = &pp;
    }
    float *out = tu_malloc(nO * sizeof(float));
    float *wts = mode == ATTN_WEIGHTS_NONE ? NULL : tu_malloc(nW * sizeof(float));
    for (size_t i = 0; i < nO; i++) out[i] = NAN;
    for (size_t i = 0; wts && i < nW; i++) wts[i] = NAN;
    st = attn_mha_forward(&c, &w, B, Lq, Lk, query, key, value, pu, out, mode, wts, NULL, &err);
    CHECK(st == ATTN_OK, "%s: mha_forward: %s %s", mc->name, attn_status_name(st), err.message);
    if (st == ATTN_OK) {
        double omax = 1.0;
        for (size_t i = 0; i < nO; i++)
            if (fabs(ro[i]) > omax) omax = fabs(ro[i]);
        double eo = tu_maxdiff(out, ro, nO) / omax;
        CHECK(eo <= TOL_OUT, "%s (mode %d, impl %d): max|out err|/max|out| = %.3g", mc->name,
              (int)mode, (int)impl, eo);
        if (eo > g_err_out) g_err_out = eo;
        if (wts) {
            double ew = tu_maxdiff(wts, rw, nW);
            CHECK(ew <= TOL_W, "%s (mode %d, impl %d): max|weight err| = %.3g", mc->name, (int)mode,
                  (int)impl, ew);
            if (ew > g_err_w) g_err_w = ew;
        }

        /* A training cache must not change the output (bitwise). */
        size_t nc = 0;
        st = attn_mha_cache_size(&c, B, Lq, Lk, &nc, &err);
        CHECK(st == ATTN_OK && nc > 0, "%s: cache_size %s: %s", mc->name, attn_status_name(st),
              err.message);
        if (st == ATTN_OK) {
            float *cache = tu_malloc(nc * sizeof(float));
            float *out2 = tu_malloc(nO * sizeof(float));
            st = attn_mha_forward(&c, &w, B, Lq, Lk, query, key, value, pu, out2, ATTN_WEIGHTS_NONE,
                                  NULL, cache, &err);
            CHECK(st == ATTN_OK && memcmp(out, out2, nO * sizeof(float)) == 0,
                  "%s: forward with a cache differs from inference (%s)", mc->name, err.message);
            free(cache), free(out2);
        }
    }
    free(out), free(wts), free(ro), free(rw), free(params), free(query);
    if (!mc->self) free(key), free(value);
}

static void test_forward(void) {
    const mha_case cases[] = {
        /* name, E, H, kdim, vdim, bias, B, Lq, Lk, self */
        {"self, bias", 16, 4, 0, 0, 1, 2, 11, 11, 1},
        {"self, no bias", 16, 4, 0, 0, 0, 2, 11, 11, 1},
        {"cross kdim/vdim != E, bias", 24, 3, 12, 20, 1, 2, 7, 13, 0},
        {"cross kdim/vdim != E, no bias", 24, 3, 12, 20, 0, 3, 9, 5, 0},
        {"cross, kdim == vdim == E", 32, 8, 0, 0, 1, 2, 6, 17, 0},
        {"one head", 8, 1, 0, 0, 1, 1, 5, 5, 1},
        {"head size 1", 6, 6, 5, 3, 1, 2, 4, 6, 0},
        {"L = 1", 12, 2, 0, 0, 1, 1, 1, 1, 1},
    };
    const int64_t lens[3] = {3, 0, 5}; /* batch 1 fully padded: out = b_o */
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const mha_case *mc = &cases[i];
        uint64_t seed = 100 + 10 * i;
        /* p NULL: no masks, auto path. */
        run_mha(mc, NULL, ATTN_WEIGHTS_PER_HEAD, ATTN_IMPL_AUTO, seed);
        run_mha(mc, NULL, ATTN_WEIGHTS_AVERAGE, ATTN_IMPL_REFERENCE, seed + 1);
        run_mha(mc, NULL, ATTN_WEIGHTS_NONE, ATTN_IMPL_AUTO, seed + 2);

        /* causal + key padding, both paths, both weight modes. */
        int64_t l3[3];
        for (int b = 0; b < 3; b++) l3[b] = lens[b] < mc->Lk ? lens[b] : mc->Lk;
        attn_sdpa_params p = {0};
        p.causal = 1;
        p.key_lengths = l3;
        run_mha(mc, &p, ATTN_WEIGHTS_PER_HEAD, ATTN_IMPL_REFERENCE, seed + 3);
        run_mha(mc, &p, ATTN_WEIGHTS_AVERAGE, ATTN_IMPL_AUTO, seed + 4);
        run_mha(mc, &p, ATTN_WEIGHTS_NONE, ATTN_IMPL_AUTO, seed + 5);

        /* custom scale + additive mask broadcast over batch [1, H, Lq, Lk]. */
        const int64_t H = mc->H, Lq = mc->Lq, Lk = mc->Lk;
        float *am = tu_malloc((size_t)(H * Lq * Lk) * sizeof(float));
        tu_rng r = tu_seed(seed + 6);
        tu_fill(&r, am, (size_t)(H * Lq * Lk), -1.0f, 1.0f);
        am[0] = -INFINITY;
        attn_mask m = {am, {1, H, Lq, Lk}, {0, Lq * Lk, Lk, 1}};
        attn_sdpa_params pa = {0};
        pa.use_scale = 1, pa.scale = 0.2f;
        pa.add_mask = &m;
        run_mha(mc, &pa, ATTN_WEIGHTS_PER_HEAD, ATTN_IMPL_REFERENCE, seed + 7);
        run_mha(mc, &pa, ATTN_WEIGHTS_AVERAGE, ATTN_IMPL_AUTO, seed + 8);
        free(am);
    }
}

/* ------------------------------------------------------------ init */

static double maxabs_n(const float *x, size_t n, int *nonfinite) {
    double m = 0.0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(x[i])) *nonfinite = 1;
        if (fabs((double)x[i]) > m) m = fabs((double)x[i]);
    }
    return m;
}

static int all_zero(const float *x, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (x[i] != 0.0f) return 0;
    return 1;
}

/* One config: layout of the packed buffer, bounds, determinism. */
static void check_init(int64_t E, int64_t H, int64_t kdim, int64_t vdim, int bias) {
    attn_mha_config c = {E, H, kdim, vdim, bias, 0};
    const int64_t kd = kdim ? kdim : E, vd = vdim ? vdim : E;
    attn_error err;
    memset(&err, 0, sizeof err);
    size_t np = 0;
    attn_status st = attn_mha_param_count(&c, &np, &err);
    const size_t want = (size_t)(2 * E * E + E * kd + E * vd + (bias ? 4 * E : 0));
    CHECK(st == ATTN_OK && np == want,
          "param_count E=%lld kdim=%lld vdim=%lld bias=%d: %zu, want %zu", (long long)E,
          (long long)kd, (long long)vd, bias, np, want);
    if (st != ATTN_OK || np != want) return;

    /* Order w_q, w_k, w_v, b_q, b_k, b_v, w_o, b_o. */
    float *buf = tu_malloc(np * sizeof(float));
    attn_mha_weights w;
    memset(&w, 0xAB, sizeof w);
    st = attn_mha_weights_from_buffer(&c, buf, &w, &err);
    CHECK(st == ATTN_OK, "weights_from_buffer: %s", err.message);
    float *b0 = buf + E * E + E * kd + E * vd;
    CHECK(w.w_q == buf && w.w_k == buf + E * E && w.w_v == buf + E * E + E * kd,
          "weights_from_buffer: in-projection offsets");
    if (bias)
        CHECK(w.b_q == b0 && w.b_k == b0 + E && w.b_v == b0 + 2 * E && w.w_o == b0 + 3 * E &&
                  w.b_o == b0 + 3 * E + E * E,
              "weights_from_buffer: bias/out offsets");
    else
        CHECK(!w.b_q && !w.b_k && !w.b_v && !w.b_o && w.w_o == b0,
              "weights_from_buffer: without bias b_* must be NULL and w_o follow w_v");

    for (size_t i = 0; i < np; i++) buf[i] = NAN; /* every parameter must be written */
    st = attn_mha_init(&c, &w, 7, &err);
    CHECK(st == ATTN_OK, "init: %s", err.message);
    int nonfinite = 0;
    const double bo = 1.0 / sqrt((double)E);
    double mq = maxabs_n(w.w_q, (size_t)(E * E), &nonfinite);
    double mk = maxabs_n(w.w_k, (size_t)(E * kd), &nonfinite);
    double mv = maxabs_n(w.w_v, (size_t)(E * vd), &nonfinite);
    double mo = maxabs_n(w.w_o, (size_t)(E * E), &nonfinite);
    CHECK(!nonfinite, "init left a NaN/inf (unwritten parameter?)");
    if (bias)
        CHECK(all_zero(w.b_q, (size_t)E) && all_zero(w.b_k, (size_t)E) &&
                  all_zero(w.b_v, (size_t)E) && all_zero(w.b_o, (size_t)E),
              "init: biases must be zero");
    /* Xavier: U(-a, a), a = sqrt(6 / (fan_in + fan_out)); with kdim == vdim
     * == E over the stacked [3E, E] matrix, else per matrix. The max of
     * >= 36 samples lies above 0.75 a with probability > 1 - 1e-4. */
    double aq, ak, av;
    if (kd == E && vd == E) {
        aq = ak = av = sqrt(6.0 / (double)(3 * E + E));
    } else {
        aq = sqrt(6.0 / (double)(E + E));
        ak = sqrt(6.0 / (double)(E + kd));
        av = sqrt(6.0 / (double)(E + vd));
    }
    /* 1 + 1e-6: the library may round the bound itself to fp32. */
    const double up = 1.0 + 1e-6;
    CHECK(mq <= aq * up && mq > 0.75 * aq, "init w_q: max|w| %.4f, Xavier bound %.4f", mq, aq);
    CHECK(mk <= ak * up && mk > 0.75 * ak, "init w_k: max|w| %.4f, Xavier bound %.4f", mk, ak);
    CHECK(mv <= av * up && mv > 0.75 * av, "init w_v: max|w| %.4f, Xavier bound %.4f", mv, av);
    CHECK(mo <= bo * up && mo > 0.75 * bo, "init w_o: max|w| %.4f, bound 1/sqrt(E) %.4f", mo, bo);
    double mean = 0.0;
    for (int64_t i = 0; i < E * E; i++) mean += w.w_q[i];
    mean /= (double)(E * E); /* sd of the mean: a / sqrt(3 E^2) */
    CHECK(fabs(mean) < 4.0 * aq / sqrt(3.0 * (double)(E * E)), "init w_q: mean %.4f", mean);

    /* Same seed: bitwise equal. Other seed: (almost) every weight differs. */
    float *buf2 = tu_malloc(np * sizeof(float));
    attn_mha_weights w2;
    attn_mha_weights_from_buffer(&c, buf2, &w2, &err);
    st = attn_mha_init(&c, &w2, 7, &err);
    CHECK(st == ATTN_OK && memcmp(buf, buf2, np * sizeof(float)) == 0,
          "init not deterministic in seed");
    st = attn_mha_init(&c, &w2, 8, &err);
    size_t same = 0;
    for (size_t i = 0; i < np; i++) same += buf[i] == buf2[i] && buf[i] != 0.0f;
    CHECK(st == ATTN_OK && same < np / 50, "init: seeds 7 and 8 share %zu of %zu weights", same,
          np);
    free(buf), free(buf2);
}

static void test_init(void) {
    check_init(16, 4, 0, 0, 1);
    check_init(16, 4, 16, 16, 0); /* explicit kdim == vdim == E: stacked bound */
    check_init(16, 2, 8, 24, 1);
    check_init(32, 8, 40, 6, 0);
    check_init(64, 4, 0, 0, 1);
}

int main(void) {
    test_forward();
    test_init();
    printf("test_mha: max error vs fp64 oracle: out %.3g (rel. to max|out|), weights %.3g\n",
           g_err_out, g_err_w);
    return tu_report("test_mha");
}
