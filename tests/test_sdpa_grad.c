/* attn_sdpa_backward, REFERENCE and AUTO paths, checked through a chain
 *     fp32 library  ≈  fp64 analytic gradient  ≈  fp64 finite differences
 * for the scalar loss L = Σ dO ∘ O, with every mask the forward accepts
 * (causal incl. Lq < Lk and Lq > Lk, key padding incl. a length-0 batch,
 * sliding windows, bool and additive masks in broadcast forms, all combined),
 * Lq != Lk, Dv != Dk, L = 1, strided views, custom scale, empty rows, and
 * dropout (training, p = 0.3) with the keep mask read back from the library
 * by the identity trick (grad_util.h).
 *
 * Tolerances.
 *  - Analytic vs FD (both fp64): central differences with h = 1e-5 have
 *    truncation error h²/6·|∂³L| ~ 2e-11 (inputs O(1), scale <= 1) and
 *    rounding error ~ u·Σ|dO∘O| / h with u = 1.1e-16 and Σ|dO∘O| <= ~100,
 *    i.e. ~1e-9. TOL_FD = 1e-8 relative to max(1, max|grad|) leaves a ~10x
 *    margin over that bound (measured errors are ~1e-10).
 *  - Library vs analytic: the fp32 kernel's scores carry ~(Dk + 2)·u32
 *    relative error (u32 = 6e-8, Dk <= 8), P_ij = exp(s - lse) inherits it,
 *    and each gradient is a sum of n <= max(Lq, Lk) such terms. For the
 *    small cases (n <= 12) even the worst case n·u32 is < 1e-6; for the
 *    multi-tile ones (n up to 600) rounding of mixed-sign terms grows like
 *    sqrt(n)·u32 ~ 1.5e-6. TOL_LIB = 1e-5 relative to the tensor's max|grad|
 *    (floored at 0.1 x the case's largest max|grad|, for tensors that vanish
 *    by cancellation, e.g. dq and dk when every row sees one key); measured
 *    <= 1e-6 (REFERENCE and fused AUTO). Structural zeros (no term reaches the entry: a row that sees
 *    no key, a key no row sees, for dv also a key dropout removes wherever
 *    it is seen) must be exactly 0, never NaN.
 *  - The dq/dk/dv views are pre-filled with a sentinel: every element is
 *    overwritten (the result is independent of it), gaps are left alone. */
#include "grad_util.h"

#define TOL_FD 1e-8
#define TOL_LIB 1e-5
#define FD_H 1e-5
#define SENTINEL 777.25f

static double g_worst_lib, g_worst_fd;

#define FD_SAMPLES 48
/* Odd stride so the samples walk across rows and columns. */
static size_t fd_step(size_t n) { return n <= 2 * FD_SAMPLES ? 1 : (n / FD_SAMPLES) | 1; }

typedef struct {
    gu_dims d;
    double *q, *k, *v, *dout, *mult, *out;
    const attn_sdpa_params *p;
} fd_ctx;

static double fd_loss(void *c) {
    fd_ctx *x = c;
    const gu_dims *d = &x->d;
    gu_sdpa_fwd(d, x->q, x->k, x->v, x->p, x->mult, x->out);
    return gu_dot(x->dout, x->out, (size_t)(d->B * d->H * d->Lq * d->Dv));
}

typedef struct {
    const char *name;
    gu_dims d;
    int lay;      /* layout of every tensor, GU_* */
    float lo, hi; /* uniform range of q and k */
    uint64_t seed;
} gcase;

static const char *impl_name(attn_impl i) {
    return i == ATTN_IMPL_REFERENCE ? "REFERENCE" : "AUTO";
}

/* One case on one path. FD runs once per case (on the REFERENCE pass): the
 * analytic gradient does not depend on the path. */
static void run_impl(const gcase *c, const attn_sdpa_params *p0, attn_impl impl) {
    const gu_dims d = c->d;
    const int64_t B = d.B, H = d.H, Lq = d.Lq, Lk = d.Lk, Dk = d.Dk, Dv = d.Dv;
    const size_t nq = (size_t)(B * H * Lq * Dk), nk = (size_t)(B * H * Lk * Dk),
                 nv = (size_t)(B * H * Lk * Dv), no = (size_t)(B * H * Lq * Dv),
                 nl = (size_t)(B * H * Lq), nw = nl * (size_t)Lk;
    attn_sdpa_params p = *p0;
    p.impl = impl;
    const char *in = impl_name(impl);

    tu_rng r = tu_seed(c->seed);
    gu_view q = gu_make_view(c->lay, B, H, Lq, Dk, 0.0f),
            k = gu_make_view(c->lay, B, H, Lk, Dk, 0.0f),
            v = gu_make_view(c->lay, B, H, Lk, Dv, 0.0f),
            go = gu_make_view(c->lay, B, H, Lq, Dv, 0.0f),
            o = gu_make_view(c->lay, B, H, Lq, Dv, SENTINEL);
    gu_fill_view(&q, &r, c->lo, c->hi);
    gu_fill_view(&k, &r, c->lo, c->hi);
    gu_fill_view(&v, &r, -1.0f, 1.0f);
    gu_fill_view(&go, &r, -1.0f, 1.0f);
    gu_view gq = gu_make_view(c->lay, B, H, Lq, Dk, SENTINEL),
            gk = gu_make_view(c->lay, B, H, Lk, Dk, SENTINEL),
            gv = gu_make_view(c->lay, B, H, Lk, Dv, SENTINEL);
    float *lse = tu_malloc(nl * sizeof(float));

    double *mult = NULL;
    const int drop = p.training && p.dropout_p > 0.0f;
    if (drop) {
        mult = tu_malloc(nw * sizeof(double));
        long bad = gu_dropout_mult(B, H, Lq, Lk, &p, mult, NULL);
        CHECK(bad == 0, "%s/%s: dropout mask read-back: %ld entries neither 0 nor 1/(1-p)", c->name,
              in, bad);
    }

    attn_error err;
    attn_sdpa_info info;
    attn_status s = attn_sdpa_forward(&q.t, &k.t, &v.t, &p, &o.t, NULL, lse, &info, &err);
    CHECK(s == ATTN_OK, "%s/%s: forward %s: %s", c->name, in, attn_status_name(s), err.message);
    s = attn_sdpa_backward(&q.t, &k.t, &v.t, &o.t, lse, &go.t, &p, &gq.t, &gk.t, &gv.t, &info,
                           &err);
    CHECK(s == ATTN_OK, "%s/%s: backward %s: %s", c->name, in, attn_status_name(s), err.message);
    if (impl == ATTN_IMPL_REFERENCE)
        CHECK(info.impl == ATTN_IMPL_REFERENCE, "%s: info.impl %d", c->name, (int)info.impl);

    double *qd = tu_to_double(&q.t), *kd = tu_to_double(&k.t), *vd = tu_to_double(&v.t),
           *god = tu_to_double(&go.t);
    double *ao = tu_malloc(no * sizeof(double)), *aq = tu_malloc(nq * sizeof(double)),
           *ak = tu_malloc(nk * sizeof(double)), *av = tu_malloc(nv * sizeof(double));
    gu_sdpa_fwd(&d, qd, kd, vd, &p, mult, ao);
    gu_sdpa_bwd(&d, qd, kd, vd, god, &p, mult, aq, ak, av);

    /* The fp64 forward agrees with the shared oracle (no dropout there). */
    if (!drop) {
        double *ro = tu_malloc(no * sizeof(double)), *rw = tu_malloc(nw * sizeof(double)),
               *rl = tu_malloc(nl * sizeof(double));
        ref_sdpa(B, H, Lq, Lk, Dk, Dv, qd, kd, vd, &p, ro, rw, rl, NULL);
        double e = 0.0;
        for (size_t i = 0; i < no; i++) e = fmax(e, fabs(ro[i] - ao[i]));
        CHECK(e <= 1e-12, "%s: fp64 forward vs ref_oracle: %.3g", c->name, e);
        free(ro), free(rw), free(rl);
    }
    float *og = tu_gather(&o.t);
    double eo = gu_relerr(og, ao, no, 1.0);
    CHECK(eo <= TOL_LIB, "%s/%s: forward out vs fp64: %.3g", c->name, in, eo);

    float *fq = tu_gather(&gq.t), *fk = tu_gather(&gk.t), *fv = tu_gather(&gv.t);
    /* Floor of the error scale: a tensor that is 0 only by cancellation (a
     * row with one visible key: P = 1, dS = dP - dP) keeps the fp32
     * rounding of the terms that cancel, which are of the size of the
     * case's other gradients. */
    const double floor =
        0.1 * fmax(gu_maxabs_d(aq, nq), fmax(gu_maxabs_d(ak, nk), gu_maxabs_d(av, nv)));
    const double eq = gu_relerr(fq, aq, nq, floor), ek = gu_relerr(fk, ak, nk, floor),
                 ev = gu_relerr(fv, av, nv, floor);
    CHECK(eq <= TOL_LIB && ek <= TOL_LIB && ev <= TOL_LIB,
          "%s/%s [%s]: lib vs fp64 analytic: dq %.3g dk %.3g dv %.3g (tol %g)", c->name, in,
          gu_lay_name[c->lay], eq, ek, ev, TOL_LIB);
    unsigned char *rq = tu_malloc(nl), *rk = tu_malloc((size_t)(B * H * Lk)),
                  *rv = tu_malloc((size_t)(B * H * Lk));
    gu_structural_zeros(&d, qd, kd, &p, mult, rq, rk, rv);
    size_t zq, zk, zv;
    const size_t bz = gu_rows_not_zero(fq, rq, nl, Dk, &zq) +
                      gu_rows_not_zero(fk, rk, (size_t)(B * H * Lk), Dk, &zk) +
                      gu_rows_not_zero(fv, rv, (size_t)(B * H * Lk), Dv, &zv);
    CHECK(bz == 0,
          "%s/%s: %zu structurally-zero gradient entries (no term reaches them) are not exactly 0",
          c->name, in, bz);
    free(rq), free(rk), free(rv);
    CHECK(gu_gaps_touched(&gq, SENTINEL) + gu_gaps_touched(&gk, SENTINEL) +
                  gu_gaps_touched(&gv, SENTINEL) ==
              0,
          "%s/%s: backward wrote outside the dq/dk/dv views", c->name, in);
    double el = fmax(eq, fmax(ek, ev));
    if (el > g_worst_lib) g_worst_lib = el;

    double efd = -1.0;
    if (impl == ATTN_IMPL_REFERENCE) {
        fd_ctx x = {d, qd, kd, vd, god, mult, tu_malloc(no * sizeof(double)), &p};
        const double sq = fmax(1.0, gu_maxabs_d(aq, nq)), sk = fmax(1.0, gu_maxabs_d(ak, nk)),
                     sv = fmax(1.0, gu_maxabs_d(av, nv));
        /* Every element of small cases; about FD_SAMPLES (a fixed stride)
         * of each tensor of the multi-tile cases. */
        const double fq_ = gu_fd_maxerr(qd, nq, fd_step(nq), aq, FD_H, fd_loss, &x) / sq,
                     fk_ = gu_fd_maxerr(kd, nk, fd_step(nk), ak, FD_H, fd_loss, &x) / sk,
                     fv_ = gu_fd_maxerr(vd, nv, fd_step(nv), av, FD_H, fd_loss, &x) / sv;
        efd = fmax(fq_, fmax(fk_, fv_));
        CHECK(efd <= TOL_FD, "%s: fp64 analytic vs FD: dq %.3g dk %.3g dv %.3g (tol %g)", c->name,
              fq_, fk_, fv_, TOL_FD);
        if (efd > g_worst_fd) g_worst_fd = efd;
        free(x.out);
    }
    printf("  %-34s %-9s (%s) lib-vs-fp64 dq %.2e dk %.2e dv %.2e", c->name, in,
           info.impl == ATTN_IMPL_FUSED ? "fused" : "ref", eq, ek, ev);
    if (efd >= 0) printf(" | fp64-vs-FD %.2e", efd);
    printf(" | structural zeros %zu/%zu/%zu\n", zq, zk, zv);

    free(og), free(fq), free(fk), free(fv), free(lse), free(mult);
    free(qd), free(kd), free(vd), free(god), free(ao), free(aq), free(ak), free(av);
    free(q.buf), free(k.buf), free(v.buf), free(go.buf), free(o.buf);
    free(gq.buf), free(gk.buf), free(gv.buf);
}

static void run(const gcase *c, const attn_sdpa_params *p) {
    run_impl(c, p, ATTN_IMPL_REFERENCE);
    run_impl(c, p, ATTN_IMPL_AUTO);
}

static gcase mk(const char *name, int64_t B, int64_t H, int64_t Lq, int64_t Lk, int64_t Dk,
                int64_t Dv, uint64_t seed) {
    gcase c = {name, {B, H, Lq, Lk, Dk, Dv}, GU_BHLD, -1.0f, 1.0f, seed};
    return c;
}

/* ------------------------------------------------------------ masks */

/* A bool mask [mB, mH, Lq, Lk] (contiguous) with about `frac` zeros; rows
 * listed in `empty_rows` (row index i, -1 terminated) are cleared for every
 * (b, h) so they see no key. */
static uint8_t *bool_buf(tu_rng *r, size_t n, double frac) {
    uint8_t *m = tu_malloc(n);
    for (size_t i = 0; i < n; i++) m[i] = tu_unif(r) < frac ? 0 : (uint8_t)(1 + (tu_next(r) & 127));
    return m;
}

static float *add_buf(tu_rng *r, size_t n, double frac_inf) {
    float *m = tu_malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++)
        m[i] = tu_unif(r) < frac_inf ? -INFINITY : (float)(4.0 * tu_unif(r) - 2.0);
    return m;
}

/* ------------------------------------------------------------ tests */

static void test_plain(void) {
    attn_sdpa_params p = {0};
    gcase c1 = mk("plain Lq<Lk Dv!=Dk", 2, 2, 5, 7, 6, 4, 11);
    gcase c2 = mk("plain Lq>Lk", 1, 2, 7, 4, 3, 5, 12);
    gcase c3 = mk("L=1 (Lq=Lk=1)", 2, 1, 1, 1, 3, 2, 13);
    gcase c4 = mk("Lk=1", 1, 2, 4, 1, 2, 3, 14);
    gcase c5 = mk("Dk=Dv=1", 1, 1, 3, 5, 1, 1, 15);
    gcase c6 = mk("wide inputs [-2,2] Dk=8", 1, 2, 6, 9, 8, 3, 16);
    c6.lo = -2.0f, c6.hi = 2.0f;
    run(&c1, &p);
    run(&c2, &p);
    run(&c3, &p);
    run(&c4, &p);
    run(&c5, &p);
    run(&c6, &p);
    p.use_scale = 1, p.scale = 0.7f;
    gcase c7 = mk("custom scale 0.7", 2, 1, 4, 6, 5, 3, 17);
    run(&c7, &p);
    p.use_scale = 1, p.scale = -1.3f;
    gcase c8 = mk("negative scale -1.3", 1, 2, 3, 5, 4, 4, 18);
    run(&c8, &p);
}

static void test_layouts(void) {
    attn_sdpa_params p = {0};
    p.causal = 1;
    const char *names[GU_LAYOUTS] = {"causal bhld", "causal blhd (packed) views",
                                     "causal padded views", "causal inner-stride-2 views"};
    for (int l = 0; l < GU_LAYOUTS; l++) {
        gcase c = mk(names[l], 2, 3, 5, 6, 4, 3, 20 + (uint64_t)l);
        c.lay = l;
        run(&c, &p);
    }
}

static void test_causal(void) {
    attn_sdpa_params p = {0};
    p.causal = 1;
    gcase c1 = mk("causal square", 2, 2, 6, 6, 4, 4, 31);
    gcase c2 = mk("causal Lq<Lk (bottom-right)", 2, 2, 3, 8, 4, 5, 32);
    gcase c3 = mk("causal Lq>Lk (empty top rows)", 1, 2, 8, 5, 4, 3, 33);
    gcase c4 = mk("causal decode Lq=1", 2, 2, 1, 9, 4, 4, 34);
    run(&c1, &p);
    run(&c2, &p);
    run(&c3, &p);
    run(&c4, &p);
}

static void test_key_padding(void) {
    attn_sdpa_params p = {0};
    const int64_t lens[3] = {7, 0, 3}; /* full, empty batch, partial */
    p.key_lengths = lens;
    gcase c1 = mk("key padding {7,0,3}", 3, 2, 4, 7, 4, 3, 41);
    run(&c1, &p);
    const int64_t lens2[2] = {1, 5};
    p.key_lengths = lens2;
    p.causal = 1;
    gcase c2 = mk("key padding {1,5} + causal Lq<Lk", 2, 2, 3, 6, 3, 4, 42);
    run(&c2, &p);
}

static void test_window(void) {
    struct {
        const char *name;
        int64_t left, right, Lq, Lk;
        int causal;
    } w[] = {
        {"window (2,1) square", 2, 1, 6, 6, 0},
        {"window (1,2) Lq<Lk", 1, 2, 4, 9, 0},
        {"window (0,0) Lq>Lk (empty rows)", 0, 0, 7, 4, 0},
        {"window (left 3, unbounded)", 3, ATTN_UNBOUNDED, 6, 8, 0},
        {"window (unbounded, 1)", ATTN_UNBOUNDED, 1, 5, 7, 0},
        {"window left 2 + causal (local)", 2, ATTN_UNBOUNDED, 6, 6, 1},
    };
    for (size_t i = 0; i < sizeof w / sizeof w[0]; i++) {
        attn_sdpa_params p = {0};
        p.use_window = 1;
        p.window_left = w[i].left;
        p.window_right = w[i].right;
        p.causal = w[i].causal;
        gcase c = mk(w[i].name, 2, 2, w[i].Lq, w[i].Lk, 4, 3, 50 + i);
        run(&c, &p);
    }
}

static void test_bool_mask(void) {
    enum { B = 2, H = 2, LQ = 5, LK = 7 };
    tu_rng r = tu_seed(61);
    /* [1, H, Lq, Lk] contiguous, row 2 of head 1 fully masked. */
    uint8_t *m1 = bool_buf(&r, H * LQ * LK, 0.35);
    memset(m1 + (1 * LQ + 2) * LK, 0, LK);
    attn_mask bm1 = {m1, {1, H, LQ, LK}, {0, LQ * LK, LK, 1}};
    attn_sdpa_params p = {0};
    p.bool_mask = &bm1;
    gcase c1 = mk("bool [1,H,Lq,Lk] + empty row", B, H, LQ, LK, 4, 3, 62);
    run(&c1, &p);
    /* Key-only [B, 1, Lq (stride 0), Lk] padding shape, batch 1 all masked. */
    uint8_t *m2 = bool_buf(&r, B * LK, 0.3);
    memset(m2 + LK, 0, LK);
    attn_mask bm2 = {m2, {B, 1, LQ, LK}, {LK, 0, 0, 1}};
    p.bool_mask = &bm2;
    gcase c2 = mk("bool key-only [B,1,Lq:0,Lk], empty batch", B, H, LQ, LK, 4, 3, 63);
    run(&c2, &p);
    /* Full [B, H, Lq, Lk] stored key-major (transposed strides). */
    uint8_t *m3 = bool_buf(&r, B * H * LQ * LK, 0.4);
    attn_mask bm3 = {m3, {B, H, LQ, LK}, {H * LQ * LK, LQ * LK, 1, LQ}};
    p.bool_mask = &bm3;
    gcase c3 = mk("bool [B,H,Lq,Lk] key-major", B, H, LQ, LK, 4, 3, 64);
    run(&c3, &p);
    free(m1), free(m2), free(m3);
}

static void test_add_mask(void) {
    enum { B = 2, H = 2, LQ = 5, LK = 6 };
    tu_rng r = tu_seed(71);
    /* [B, 1, Lq, Lk] with -inf entries and one all -inf row. */
    float *a1 = add_buf(&r, B * LQ * LK, 0.25);
    for (int j = 0; j < LK; j++) a1[(1 * LQ + 3) * LK + j] = -INFINITY;
    attn_mask am1 = {a1, {B, 1, LQ, LK}, {LQ * LK, 0, LK, 1}};
    attn_sdpa_params p = {0};
    p.add_mask = &am1;
    gcase c1 = mk("add [B,1,Lq,Lk] -inf + empty row", B, H, LQ, LK, 4, 3, 72);
    run(&c1, &p);
    /* [1, 1, Lq, Lk] expressed as dims [B, H, ...] with stride 0. */
    float *a2 = add_buf(&r, LQ * LK, 0.0);
    attn_mask am2 = {a2, {B, H, LQ, LK}, {0, 0, LK, 1}};
    p.add_mask = &am2;
    gcase c2 = mk("add [B:0,H:0,Lq,Lk] finite", B, H, LQ, LK, 4, 3, 73);
    run(&c2, &p);
    /* Key-only [B, 1, Lq (stride 0), Lk] with a -inf key column. */
    float *a3 = add_buf(&r, B * LK, 0.0);
    a3[0 * LK + 2] = -INFINITY;
    attn_mask am3 = {a3, {B, 1, LQ, LK}, {LK, 0, 0, 1}};
    p.add_mask = &am3;
    gcase c3 = mk("add key-only [B,1,Lq:0,Lk] -inf key", B, H, LQ, LK, 4, 3, 74);
    run(&c3, &p);
    free(a1), free(a2), free(a3);
}

/* Every mask at once, Lq < Lk, with strided views. */
static void test_combined(void) {
    enum { B = 3, H = 2, LQ = 5, LK = 8 };
    tu_rng r = tu_seed(81);
    uint8_t *bm = bool_buf(&r, H * LQ * LK, 0.2);
    float *am = add_buf(&r, B * LQ * LK, 0.1);
    attn_mask bmask = {bm, {1, H, LQ, LK}, {0, LQ * LK, LK, 1}};
    attn_mask amask = {am, {B, 1, LQ, LK}, {LQ * LK, 0, LK, 1}};
    const int64_t lens[B] = {8, 0, 5};
    attn_sdpa_params p = {0};
    p.causal = 1;
    p.key_lengths = lens;
    p.use_window = 1;
    p.window_left = 3;
    p.window_right = ATTN_UNBOUNDED;
    p.bool_mask = &bmask;
    p.add_mask = &amask;
    gcase c = mk("combined causal+pad+window+bool+add", B, H, LQ, LK, 4, 3, 82);
    run(&c, &p);
    c.name = "combined, blhd views";
    c.lay = GU_BLHD;
    run(&c, &p);
    free(bm), free(am);
}

/* Dropout (training, p = 0.3): the same chain, with the library's keep mask
 * read back by the identity trick and applied in fp64. */
static void test_dropout(void) {
    attn_sdpa_params p = {0};
    p.training = 1;
    p.dropout_p = 0.3f;
    p.seed = 1234;
    p.offset = 7;
    gcase c1 = mk("dropout 0.3 plain", 2, 2, 6, 9, 4, 3, 91);
    run(&c1, &p);
    gcase c2 = mk("dropout 0.3 Lq>Lk, packed views", 1, 3, 9, 6, 3, 5, 92);
    c2.lay = GU_BLHD;
    run(&c2, &p);
    const int64_t lens[2] = {9, 0};
    p.causal = 1;
    p.key_lengths = lens;
    p.seed = 99;
    p.offset = 0;
    gcase c3 = mk("dropout 0.3 causal+pad{9,0}", 2, 2, 5, 9, 4, 4, 93);
    run(&c3, &p);
    enum { B = 2, H = 2, LQ = 6, LK = 7 };
    tu_rng r = tu_seed(94);
    uint8_t *bm = bool_buf(&r, H * LQ * LK, 0.2);
    float *am = add_buf(&r, B * LQ * LK, 0.1);
    attn_mask bmask = {bm, {1, H, LQ, LK}, {0, LQ * LK, LK, 1}};
    attn_mask amask = {am, {B, 1, LQ, LK}, {LQ * LK, 0, LK, 1}};
    attn_sdpa_params p2 = {0};
    p2.training = 1;
    p2.dropout_p = 0.3f;
    p2.seed = 5;
    p2.offset = 3;
    p2.use_window = 1;
    p2.window_left = 2;
    p2.window_right = 2;
    p2.bool_mask = &bmask;
    p2.add_mask = &amask;
    gcase c4 = mk("dropout 0.3 window+bool+add, padded", B, H, LQ, LK, 5, 3, 95);
    c4.lay = GU_PADDED;
    run(&c4, &p2);
    free(bm), free(am);
}

/* Shapes past one 64x64 tile of the fused path, not multiples of 64: the
 * two-pass backward (B*H = 1 with 2 threads) and the one-pass one (B*H >=
 * 2; picked from B*H and the thread count, see src/sdpa_fused.c), the
 * split-key decode forward (Lq <= 4, Lk > 256) feeding the
 * backward, with masks and dropout. */
static void test_tiles(void) {
    attn_sdpa_params p = {0};
    p.causal = 1;
    gcase c1 = mk("tiles 70x150 causal, BH=1", 1, 1, 70, 150, 8, 5, 101);
    run(&c1, &p);
    const int64_t lens[2] = {70, 33};
    attn_sdpa_params p2 = {0};
    p2.key_lengths = lens;
    gcase c2 = mk("tiles 130x70 pad{70,33}, BH=4", 2, 2, 130, 70, 6, 7, 102);
    run(&c2, &p2);
    attn_sdpa_params p3 = {0};
    p3.use_window = 1;
    p3.window_left = 40;
    p3.window_right = 20;
    p3.training = 1;
    p3.dropout_p = 0.3f;
    p3.seed = 808;
    p3.offset = 1;
    gcase c3 = mk("tiles 65x129 window(40,20) drop", 1, 3, 65, 129, 4, 4, 103);
    c3.lay = GU_BLHD;
    run(&c3, &p3);
    attn_sdpa_params p4 = {0};
    p4.causal = 1;
    p4.training = 1;
    p4.dropout_p = 0.3f;
    p4.seed = 909;
    gcase c4 = mk("tiles 100x100 causal drop, BH=1", 1, 1, 100, 100, 5, 3, 104);
    run(&c4, &p4);
    const int64_t dl[2] = {300, 257};
    attn_sdpa_params p5 = {0};
    p5.key_lengths = dl;
    p5.causal = 1;
    gcase c5 = mk("decode Lq=2 Lk=300 causal+pad", 2, 1, 2, 300, 8, 4, 105);
    run(&c5, &p5);
    attn_sdpa_params p6 = {0};
    p6.training = 1;
    p6.dropout_p = 0.3f;
    p6.seed = 11;
    gcase c6 = mk("decode Lq=1 Lk=600 drop", 1, 2, 1, 600, 4, 4, 106);
    run(&c6, &p6);
}

int main(void) {
    /* One thread for the many tiny calls (a fork/join per call is slow on
     * a loaded machine); two for the multi-tile cases, where the fused
     * backward's two-pass split needs more than one thread. */
    attn_set_num_threads(1, NULL);
    test_plain();
    test_layouts();
    test_causal();
    test_key_padding();
    test_window();
    test_bool_mask();
    test_add_mask();
    test_combined();
    test_dropout();
    attn_set_num_threads(2, NULL);
    test_tiles();
    printf("worst: lib vs fp64 analytic %.3g (tol %g), fp64 analytic vs FD %.3g (tol %g)\n",
           g_worst_lib, TOL_LIB, g_worst_fd, TOL_FD);
    attn_set_num_threads(0, NULL);
    return tu_report("test_sdpa_grad");
}
