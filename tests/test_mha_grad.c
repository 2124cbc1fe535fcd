/* attn_mha_backward against central finite differences of an independent
 * fp64 MHA forward written here from the header's definition
 *     Qp = query Wqᵀ + bq, Kp = key Wkᵀ + bk, Vp = value Wvᵀ + bv,
 *     Ao = concat_h SDPA(Qp_h, Kp_h, Vp_h),  out = Ao Woᵀ + bo,
 * with the scalar loss L = Σ G ∘ out: d_query, d_key, d_value and every
 * parameter gradient (w_q, w_k, w_v, w_o, b_q, b_k, b_v, b_o), for
 * self-attention (one pointer for query/key/value, one d_x buffer that gets
 * the sum) and cross-attention with kdim, vdim != E, bias on and off, causal,
 * key padding (incl. an empty batch), an additive mask, dropout (keep mask
 * read back through attn_sdpa_forward, grad_util.h), on both SDPA paths.
 * Then the accumulation contract: a second backward without zeroing gives
 * exactly x + x, a backward onto nonzero buffers adds, NULL d_query /
 * d_key / d_value are allowed and change nothing else (bitwise).
 *
 * Tolerances. FD in fp64 with h = 1e-5 on a smooth function: truncation
 * ~h²·|∂³L| ~ 1e-10, rounding ~u·Σ|G∘out|/h ~ 1e-10, so the FD gradient is
 * exact at the 1e-9 level and is used as the reference. The library is fp32:
 * each of the five stages (three projections, SDPA, out projection, and
 * their transposes in the backward) is a sum of <= max(E, kdim, B·L) <= 16
 * terms with relative error ~n·u32 ~ 1e-6; through the chain that is a few
 * 1e-6 of max|grad|. TOL = 2e-5 relative to the tensor's max|grad|
 * (measured: <= 5e-7). b_k's exact gradient is 0: see check_case. */
#include "grad_util.h"

#define TOL 2e-5
#define FD_H 1e-5

static double g_worst;

/* ------------------------------------------------------------ fp64 MHA */

typedef struct {
    int64_t E, H, kd, vd;
    int bias;
} mcfg;

enum { P_WQ, P_WK, P_WV, P_WO, P_BQ, P_BK, P_BV, P_BO, NPARAM };
static const char *const pname[NPARAM] = {"w_q", "w_k", "w_v", "w_o", "b_q", "b_k", "b_v", "b_o"};

typedef struct {
    mcfg c;
    int64_t B, Lq, Lk;
    double *xq, *xk, *xv; /* xk == xq etc. for self-attention */
    double *w[NPARAM];    /* b_* NULL without bias */
    const attn_sdpa_params *p;
    const double *mult; /* [B,H,Lq,Lk] dropout multipliers or NULL */
    const double *G;    /* [B,Lq,E] */
    /* scratch */
    double *Qp, *Kp, *Vp, *Ao, *qh, *kh, *vh, *oh, *out;
} mha64;

static size_t pcount(const mcfg *c, int i) {
    switch (i) {
    case P_WQ:
    case P_WO: return (size_t)(c->E * c->E);
    case P_WK: return (size_t)(c->E * c->kd);
    case P_WV: return (size_t)(c->E * c->vd);
    default: return c->bias ? (size_t)c->E : 0;
    }
}

/* Y[rows, E] = X[rows, in] Wᵀ + b. */
static void proj64(const double *X, int64_t rows, int64_t in, const double *W, const double *b,
                   int64_t E, double *Y) {
    for (int64_t r = 0; r < rows; r++)
        for (int64_t e = 0; e < E; e++) {
            double s = b ? b[e] : 0.0;
            for (int64_t x = 0; x < in; x++) s += X[r * in + x] * W[e * in + x];
            Y[r * E + e] = s;
        }
}

static double mha64_loss(void *ctx) {
    mha64 *m = ctx;
    const int64_t E = m->c.E, H = m->c.H, Dh = E / H, B = m->B, Lq = m->Lq, Lk = m->Lk;
    proj64(m->xq, B * Lq, E, m->w[P_WQ], m->w[P_BQ], E, m->Qp);
    proj64(m->xk, B * Lk, m->c.kd, m->w[P_WK], m->w[P_BK], E, m->Kp);
    proj64(m->xv, B * Lk, m->c.vd, m->w[P_WV], m->w[P_BV], E, m->Vp);
    ref_split_heads(m->Qp, B, Lq, H, Dh, m->qh);
    ref_split_heads(m->Kp, B, Lk, H, Dh, m->kh);
    ref_split_heads(m->Vp, B, Lk, H, Dh, m->vh);
    gu_dims d = {B, H, Lq, Lk, Dh, Dh};
    gu_sdpa_fwd(&d, m->qh, m->kh, m->vh, m->p, m->mult, m->oh);
    ref_merge_heads(m->oh, B, Lq, H, Dh, m->Ao);
    proj64(m->Ao, B * Lq, E, m->w[P_WO], m->w[P_BO], E, m->out);
    return gu_dot(m->G, m->out, (size_t)(B * Lq * E));
}

/* fp64 FD gradient of every element of x[n]. */
static double *fd_grad(mha64 *m, double *x, size_t n) {
    double *g = tu_malloc(n * sizeof(double));
    for (size_t i = 0; i < n; i++) {
        const double x0 = x[i];
        x[i] = x0 + FD_H;
        const double lp = mha64_loss(m);
        x[i] = x0 - FD_H;
        const double lm = mha64_loss(m);
        x[i] = x0;
        g[i] = (lp - lm) / (2.0 * FD_H);
    }
    return g;
}

/* ------------------------------------------------------------ library side */

typedef struct {
    const char *name;
    mcfg c;
    int64_t B, Lq, Lk;
    int self; /* self-attention: Lq == Lk, kd == vd == E, one x */
    uint64_t seed;
} mcase;

typedef struct {
    float *buf;
    size_t n;
    attn_mha_weights w;
} params;

static params make_params(const attn_mha_config *c) {
    params p;
    attn_mha_param_count(c, &p.n, NULL);
    p.buf = tu_malloc(p.n * sizeof(float));
    memset(p.buf, 0, p.n * sizeof(float));
    attn_mha_weights_from_buffer(c, p.buf, &p.w, NULL);
    return p;
}

static float *pptr(const attn_mha_weights *w, int i) {
    float *const a[NPARAM] = {w->w_q, w->w_k, w->w_v, w->w_o, w->b_q, w->b_k, w->b_v, w->b_o};
    return a[i];
}

/* Inputs and one library forward + backward for a case. */
typedef struct {
    attn_mha_config c;
    params w, g;
    float *xq, *xk, *xv, *G, *cache, *out, *dq, *dk, *dv;
    size_t nq, nk, nv, no, ncache;
} libcall;

static libcall lib_setup(const mcase *mc) {
    libcall L;
    memset(&L, 0, sizeof L);
    L.c = (attn_mha_config){mc->c.E, mc->c.H, mc->c.kd == mc->c.E ? 0 : mc->c.kd,
                            mc->c.vd == mc->c.E ? 0 : mc->c.vd, mc->c.bias, 0};
    L.w = make_params(&L.c);
    L.g = make_params(&L.c);
    tu_rng r = tu_seed(mc->seed);
    tu_fill(&r, L.w.buf, L.w.n, -0.5f, 0.5f);
    L.nq = (size_t)(mc->B * mc->Lq * mc->c.E);
    L.nk = (size_t)(mc->B * mc->Lk * mc->c.kd);
    L.nv = (size_t)(mc->B * mc->Lk * mc->c.vd);
    L.no = L.nq;
    L.xq = tu_malloc(L.nq * sizeof(float));
    tu_fill(&r, L.xq, L.nq, -1.0f, 1.0f);
    if (mc->self) {
        L.xk = L.xv = L.xq;
    } else {
        L.xk = tu_malloc(L.nk * sizeof(float));
        L.xv = tu_malloc(L.nv * sizeof(float));
        tu_fill(&r, L.xk, L.nk, -1.0f, 1.0f);
        tu_fill(&r, L.xv, L.nv, -1.0f, 1.0f);
    }
    L.G = tu_malloc(L.no * sizeof(float));
    tu_fill(&r, L.G, L.no, -1.0f, 1.0f);
    attn_mha_cache_size(&L.c, mc->B, mc->Lq, mc->Lk, &L.ncache, NULL);
    L.cache = tu_malloc(L.ncache * sizeof(float));
    L.out = tu_malloc(L.no * sizeof(float));
    L.dq = tu_malloc(L.nq * sizeof(float));
    memset(L.dq, 0, L.nq * sizeof(float));
    if (mc->self) {
        L.dk = L.dv = L.dq;
    } else {
        L.dk = tu_malloc(L.nk * sizeof(float));
        L.dv = tu_malloc(L.nv * sizeof(float));
        memset(L.dk, 0, L.nk * sizeof(float));
        memset(L.dv, 0, L.nv * sizeof(float));
    }
    return L;
}

static void lib_free(libcall *L, int self) {
    free(L->w.buf), free(L->g.buf), free(L->xq), free(L->G), free(L->cache), free(L->out),
        free(L->dq);
    if (!self) free(L->xk), free(L->xv), free(L->dk), free(L->dv);
}

static attn_status lib_forward(const mcase *mc, libcall *L, const attn_sdpa_params *p) {
    attn_error err;
    attn_status s = attn_mha_forward(&L->c, &L->w.w, mc->B, mc->Lq, mc->Lk, L->xq, L->xk, L->xv, p,
                                     L->out, ATTN_WEIGHTS_NONE, NULL, L->cache, &err);
    CHECK(s == ATTN_OK, "%s: mha forward %s: %s", mc->name, attn_status_name(s), err.message);
    return s;
}

static attn_status lib_backward(const mcase *mc, libcall *L, const attn_sdpa_params *p, float *dq,
                                float *dk, float *dv, const attn_mha_weights *g) {
    attn_error err;
    attn_status s = attn_mha_backward(&L->c, &L->w.w, mc->B, mc->Lq, mc->Lk, L->xq, L->xk, L->xv, p,
                                      L->cache, L->G, dq, dk, dv, g, &err);
    CHECK(s == ATTN_OK, "%s: mha backward %s: %s", mc->name, attn_status_name(s), err.message);
    return s;
}

/* ------------------------------------------------------------ FD check */

static void check_case(const mcase *mc, const attn_sdpa_params *p0, attn_impl impl) {
    attn_sdpa_params p = *p0;
    p.impl = impl;
    const char *in = impl == ATTN_IMPL_REFERENCE ? "REFERENCE" : "AUTO";
    libcall L = lib_setup(mc);
    if (lib_forward(mc, &L, &p) || lib_backward(mc, &L, &p, L.dq, L.dk, L.dv, &L.g.w)) {
        lib_free(&L, mc->self);
        return;
    }

    const int64_t B = mc->B, Lq = mc->Lq, Lk = mc->Lk, H = mc->c.H;
    mha64 m;
    memset(&m, 0, sizeof m);
    m.c = mc->c, m.B = B, m.Lq = Lq, m.Lk = Lk, m.p = &p;
    m.xq = tu_doubles(L.xq, L.nq);
    m.xk = mc->self ? m.xq : tu_doubles(L.xk, L.nk);
    m.xv = mc->self ? m.xq : tu_doubles(L.xv, L.nv);
    for (int i = 0; i < NPARAM; i++)
        m.w[i] = pcount(&mc->c, i) ? tu_doubles(pptr(&L.w.w, i), pcount(&mc->c, i)) : NULL;
    double *G = tu_doubles(L.G, L.no);
    m.G = G;
    double *mult = NULL;
    if (p.training && p.dropout_p > 0.0f) {
        mult = tu_malloc((size_t)(B * H * Lq * Lk) * sizeof(double));
        long bad = gu_dropout_mult(B, H, Lq, Lk, &p, mult, NULL);
        CHECK(bad == 0, "%s: dropout mask read-back: %ld bad entries", mc->name, bad);
        m.mult = mult;
    }
    const int64_t E = mc->c.E;
    m.Qp = tu_malloc((size_t)(B * Lq * E) * sizeof(double));
    m.Kp = tu_malloc((size_t)(B * Lk * E) * sizeof(double));
    m.Vp = tu_malloc((size_t)(B * Lk * E) * sizeof(double));
    m.Ao = tu_malloc((size_t)(B * Lq * E) * sizeof(double));
    m.qh = tu_malloc((size_t)(B * Lq * E) * sizeof(double));
    m.kh = tu_malloc((size_t)(B * Lk * E) * sizeof(double));
    m.vh = tu_malloc((size_t)(B * Lk * E) * sizeof(double));
    m.oh = tu_malloc((size_t)(B * Lq * E) * sizeof(double));
    m.out = tu_malloc((size_t)(B * Lq * E) * sizeof(double));

    /* The forward itself, as a sanity check of the fp64 model. */
    mha64_loss(&m);
    const double eo = gu_relerr(L.out, m.out, L.no, 1e-30);
    CHECK(eo <= TOL, "%s/%s: forward out vs fp64 %.3g", mc->name, in, eo);

    printf("  %-40s %-9s out %.1e |", mc->name, in, eo);
    double worst = 0.0;
    /* Inputs. Self-attention: FD over the one x is the sum of the three. */
    struct {
        const char *n;
        double *x;
        size_t cnt;
        const float *got;
    } ins[3] = {
        {"d_query", m.xq, L.nq, L.dq}, {"d_key", m.xk, L.nk, L.dk}, {"d_value", m.xv, L.nv, L.dv}};
    for (int i = 0; i < (mc->self ? 1 : 3); i++) {
        double *fd = fd_grad(&m, ins[i].x, ins[i].cnt);
        const double e = gu_relerr(ins[i].got, fd, ins[i].cnt, 1e-30);
        CHECK(e <= TOL, "%s/%s: %s%s vs fp64 FD: %.3g (max|g| %.3g)", mc->name, in, ins[i].n,
              mc->self ? " (=d_x, sum)" : "", e, gu_maxabs_d(fd, ins[i].cnt));
        printf(" %s %.1e", mc->self ? "d_x" : ins[i].n + 2, e);
        worst = fmax(worst, e);
        free(fd);
    }
    double *fd_wk = NULL;
    for (int i = 0; i < NPARAM; i++) {
        const size_t n = pcount(&mc->c, i);
        if (!n) {
            CHECK(pptr(&L.g.w, i) == NULL, "%s: grad %s should be NULL without bias", mc->name,
                  pname[i]);
            continue;
        }
        double *fd = fd_grad(&m, m.w[i], n);
        double floor = 1e-30;
        if (i == P_BK) {
            /* q·(k_j + b_k) = q·k_j + q·b_k shifts a whole score row by a
             * constant, which softmax ignores: the exact b_k gradient is 0.
             * The library's b_k = colsum(dKp) keeps the rounding of those
             * dKp rows, so measure it against max|grad w_k| = |dKpᵀ key|,
             * built from the same rows. */
            const double sk = gu_maxabs_d(fd_wk, pcount(&mc->c, P_WK));
            CHECK(gu_maxabs_d(fd, n) <= 1e-9 * fmax(1.0, sk), "%s: fp64 FD grad b_k %.3g, not 0",
                  mc->name, gu_maxabs_d(fd, n));
            floor = sk;
        }
        const double e = gu_relerr(pptr(&L.g.w, i), fd, n, floor);
        CHECK(e <= TOL, "%s/%s: grad %s vs fp64 FD: %.3g (max|g| %.3g)", mc->name, in, pname[i], e,
              gu_maxabs_d(fd, n));
        printf(" %s %.1e", pname[i], e);
        worst = fmax(worst, e);
        if (i == P_WK)
            fd_wk = fd; /* kept for b_k's scale (b_k comes after w_k) */
        else
            free(fd);
    }
    printf("\n");
    free(fd_wk);
    if (worst > g_worst) g_worst = worst;

    free(m.Qp), free(m.Kp), free(m.Vp), free(m.Ao), free(m.qh), free(m.kh), free(m.vh), free(m.oh);
    free(m.out), free(G), free(mult), free(m.xq);
    if (!mc->self) free(m.xk), free(m.xv);
    for (int i = 0; i < NPARAM; i++) free(m.w[i]);
    lib_free(&L, mc->self);
}

static void check_both(const mcase *mc, const attn_sdpa_params *p) {
    check_case(mc, p, ATTN_IMPL_REFERENCE);
    check_case(mc, p, ATTN_IMPL_AUTO);
}

static void test_fd(void) {
    attn_sdpa_params p = {0};
    mcase self_b = {"self-attn, bias", {8, 2, 8, 8, 1}, 2, 5, 5, 1, 101};
    check_both(&self_b, &p);
    mcase self_nb = {"self-attn, no bias, H=4", {8, 4, 8, 8, 0}, 2, 4, 4, 1, 102};
    check_both(&self_nb, &p);
    mcase cross_b = {"cross kdim=6 vdim=5, bias", {8, 2, 6, 5, 1}, 2, 3, 6, 0, 103};
    check_both(&cross_b, &p);
    mcase cross_nb = {"cross kdim=6 vdim=5, no bias", {8, 2, 6, 5, 0}, 2, 4, 3, 0, 104};
    check_both(&cross_nb, &p);

    attn_sdpa_params pc = {0};
    pc.causal = 1;
    const int64_t lens[2] = {6, 2};
    pc.key_lengths = lens;
    mcase cross_c = {"cross causal+pad{6,2} Lq<Lk, bias", {8, 2, 6, 5, 1}, 2, 3, 6, 0, 105};
    check_both(&cross_c, &pc);
    const int64_t lens0[2] = {0, 4};
    pc.key_lengths = lens0;
    mcase self_c = {"self causal+pad{0,4}, bias", {6, 2, 6, 6, 1}, 2, 4, 4, 1, 106};
    check_both(&self_c, &pc);
    pc.causal = 0;
    pc.key_lengths = lens0;
    mcase cross_0 = {"cross pad{0,4} (empty batch), no bias", {6, 3, 4, 7, 0}, 2, 3, 4, 0, 107};
    check_both(&cross_0, &pc);

    /* Additive mask [B, 1, Lq, Lk] with -inf entries. */
    enum { B = 2, LQ = 3, LK = 5 };
    float am[B * LQ * LK];
    tu_rng r = tu_seed(108);
    for (int i = 0; i < B * LQ * LK; i++)
        am[i] = tu_unif(&r) < 0.2 ? -INFINITY : (float)(2.0 * tu_unif(&r) - 1.0);
    attn_mask amask = {am, {B, 1, LQ, LK}, {LQ * LK, 0, LK, 1}};
    attn_sdpa_params pa = {0};
    pa.add_mask = &amask;
    pa.use_scale = 1, pa.scale = 0.8f;
    mcase cross_a = {"cross add-mask, scale 0.8, bias", {8, 2, 6, 5, 1}, B, LQ, LK, 0, 109};
    check_both(&cross_a, &pa);

    /* Dropout p = 0.3, training. */
    attn_sdpa_params pd = {0};
    pd.training = 1;
    pd.dropout_p = 0.3f;
    pd.seed = 42;
    pd.offset = 3;
    pd.causal = 1;
    mcase self_d = {"self dropout 0.3 causal, bias", {8, 2, 8, 8, 1}, 2, 5, 5, 1, 110};
    check_both(&self_d, &pd);
    pd.causal = 0;
    mcase cross_d = {"cross dropout 0.3, kdim/vdim, bias", {8, 2, 6, 5, 1}, 2, 3, 6, 0, 111};
    check_both(&cross_d, &pd);
}

/* ------------------------------------------------------------ accumulation */

static int bits_eq(const float *a, const float *b, size_t n) {
    return memcmp(a, b, n * sizeof(float)) == 0;
}

/* a == b + b bitwise over n floats. */
static size_t twice_mismatch(const float *a, const float *b, size_t n) {
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) {
        const float t = b[i] + b[i];
        bad += memcmp(&a[i], &t, sizeof t) != 0;
    }
    return bad;
}

static void test_accumulate(const mcase *mc, const attn_sdpa_params *p0, attn_impl impl) {
    attn_sdpa_params p = *p0;
    p.impl = impl;
    const char *in = impl == ATTN_IMPL_REFERENCE ? "REFERENCE" : "AUTO";
    libcall L = lib_setup(mc);
    if (lib_forward(mc, &L, &p) || lib_backward(mc, &L, &p, L.dq, L.dk, L.dv, &L.g.w)) {
        lib_free(&L, mc->self);
        return;
    }
    /* Snapshot of one backward. */
    float *g1 = tu_malloc(L.g.n * sizeof(float));
    memcpy(g1, L.g.buf, L.g.n * sizeof(float));
    float *q1 = tu_malloc(L.nq * sizeof(float)), *k1 = tu_malloc(L.nk * sizeof(float)),
          *v1 = tu_malloc(L.nv * sizeof(float));
    memcpy(q1, L.dq, L.nq * sizeof(float));
    memcpy(k1, L.dk, L.nk * sizeof(float));
    memcpy(v1, L.dv, L.nv * sizeof(float));

    /* Same call again on top: exactly twice. */
    lib_backward(mc, &L, &p, L.dq, L.dk, L.dv, &L.g.w);
    for (int i = 0; i < NPARAM; i++) {
        const size_t n = pcount(&mc->c, i);
        if (!n) continue;
        const size_t off = (size_t)(pptr(&L.g.w, i) - L.g.buf);
        const size_t bad = twice_mismatch(pptr(&L.g.w, i), g1 + off, n);
        CHECK(bad == 0, "%s/%s: second backward: grad %s is not bitwise x + x (%zu of %zu differ)",
              mc->name, in, pname[i], bad, n);
    }
    if (mc->self) {
        /* One buffer receives three accumulations per call, so only the
         * rounding of the sum may differ: ((x + a) + b) + c vs 2((a + b) + c). */
        double e = 0.0, s = 1e-30;
        for (size_t i = 0; i < L.nq; i++) {
            e = fmax(e, fabs((double)L.dq[i] - 2.0 * (double)q1[i]));
            s = fmax(s, fabs((double)q1[i]));
        }
        CHECK(e / s <= 1e-6, "%s/%s: second backward: shared d_x not ~2x (%.3g)", mc->name, in,
              e / s);
    } else {
        const size_t bq = twice_mismatch(L.dq, q1, L.nq), bk = twice_mismatch(L.dk, k1, L.nk),
                     bv = twice_mismatch(L.dv, v1, L.nv);
        CHECK(
            bq + bk + bv == 0,
            "%s/%s: second backward: d_query/d_key/d_value not bitwise x + x (%zu/%zu/%zu differ)",
            mc->name, in, bq, bk, bv);
    }

    /* Onto nonzero buffers: g0 + x up to fp32 rounding of the sums. */
    params g0 = make_params(&L.c);
    tu_rng r = tu_seed(mc->seed + 1000);
    tu_fill(&r, g0.buf, g0.n, -1.0f, 1.0f);
    float *init = tu_malloc(g0.n * sizeof(float));
    memcpy(init, g0.buf, g0.n * sizeof(float));
    float *d0 = tu_malloc(L.nv * sizeof(float));
    tu_fill(&r, d0, L.nv, -1.0f, 1.0f);
    float *d0init = tu_malloc(L.nv * sizeof(float));
    memcpy(d0init, d0, L.nv * sizeof(float));
    if (!mc->self) {
        lib_backward(mc, &L, &p, NULL, NULL, d0, &g0.w);
        double e = 0.0;
        for (size_t i = 0; i < g0.n; i++)
            e = fmax(e, fabs((double)g0.buf[i] - ((double)init[i] + (double)g1[i])) /
                            (1.0 + fabs((double)g1[i])));
        for (size_t i = 0; i < L.nv; i++)
            e = fmax(e, fabs((double)d0[i] - ((double)d0init[i] + (double)v1[i])) /
                            (1.0 + fabs((double)v1[i])));
        CHECK(e <= 1e-6, "%s/%s: backward onto nonzero buffers is not g0 + g (%.3g)", mc->name, in,
              e);
    }

    /* NULL input gradients: allowed, everything else bitwise unchanged. */
    if (!mc->self) {
        for (int which = 0; which < 3; which++) {
            params gn = make_params(&L.c);
            float *a = tu_malloc(L.nq * sizeof(float)), *b = tu_malloc(L.nk * sizeof(float)),
                  *c = tu_malloc(L.nv * sizeof(float));
            memset(a, 0, L.nq * sizeof(float));
            memset(b, 0, L.nk * sizeof(float));
            memset(c, 0, L.nv * sizeof(float));
            attn_status s = lib_backward(mc, &L, &p, which == 0 ? NULL : a, which == 1 ? NULL : b,
                                         which == 2 ? NULL : c, &gn.w);
            CHECK(s == ATTN_OK && bits_eq(gn.buf, g1, g0.n) &&
                      (which == 0 || bits_eq(a, q1, L.nq)) &&
                      (which == 1 || bits_eq(b, k1, L.nk)) && (which == 2 || bits_eq(c, v1, L.nv)),
                  "%s/%s: backward with d_%s NULL changes other gradients", mc->name, in,
                  which == 0   ? "query"
                  : which == 1 ? "key"
                               : "value");
            free(gn.buf), free(a), free(b), free(c);
        }
    }
    free(g0.buf), free(init), free(d0), free(d0init);
    free(g1), free(q1), free(k1), free(v1);
    lib_free(&L, mc->self);
}

static void test_accumulation(void) {
    attn_sdpa_params p = {0};
    p.causal = 1;
    const int64_t lens[2] = {6, 3};
    p.key_lengths = lens;
    mcase cross = {"accumulate cross, bias", {8, 2, 6, 5, 1}, 2, 4, 6, 0, 201};
    mcase cross_nb = {"accumulate cross, no bias", {8, 2, 6, 5, 0}, 2, 4, 6, 0, 202};
    mcase self = {"accumulate self, bias", {8, 2, 8, 8, 1}, 2, 6, 6, 1, 203};
    /* Sizes past the BLAS's K blocking (OpenBLAS Haswell sgemm: K > ~256):
     * dX = dY W with K = E = 384, and dW = dYᵀ X with K = B*L = 1024. A
     * GEMM with beta = 1 that adds K-block partial sums into the caller's
     * buffer one at a time is not x + x there. */
    mcase wideE = {"accumulate cross E=384 (K-blocked dX)", {384, 2, 384, 384, 0}, 1, 8, 8, 0, 204};
    mcase longL = {
        "accumulate cross B*L=1024 (K-blocked dW)", {16, 2, 16, 16, 0}, 2, 512, 512, 0, 205};
    const attn_impl impls[2] = {ATTN_IMPL_REFERENCE, ATTN_IMPL_AUTO};
    for (int i = 0; i < 2; i++) {
        test_accumulate(&cross, &p, impls[i]);
        test_accumulate(&cross_nb, &p, impls[i]);
        test_accumulate(&self, &p, impls[i]);
    }
    p.key_lengths = NULL;
    test_accumulate(&wideE, &p, ATTN_IMPL_AUTO);
    test_accumulate(&longL, &p, ATTN_IMPL_AUTO);
}

int main(void) {
    attn_set_num_threads(1, NULL); /* many tiny calls: no fork/join each */
    test_fd();
    /* Once more with two threads (BLAS and the SDPA kernels split work). */
    attn_set_num_threads(2, NULL);
    attn_sdpa_params pc = {0};
    pc.causal = 1;
    const int64_t lens[2] = {6, 2};
    pc.key_lengths = lens;
    mcase two = {"cross causal+pad, bias, 2 threads", {8, 2, 6, 5, 1}, 2, 3, 6, 0, 120};
    check_both(&two, &pc);
    attn_set_num_threads(1, NULL);
    test_accumulation();
    printf("worst lib vs fp64 FD: %.3g (tol %g)\n", g_worst, TOL);
    attn_set_num_threads(0, NULL);
    return tu_report("test_mha_grad");
}
