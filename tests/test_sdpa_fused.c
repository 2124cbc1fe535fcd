/* The fused path (ATTN_IMPL_FUSED) against the reference path and an fp64
 * oracle, for every instruction set the CPU runs (ATTN_FUSED_ISA=avx512,
 * avx2, portable), on random and hand-picked shapes: sizes that are not
 * multiples of the 64-query x 96-key tile, L = 1, d_k and d_v from 1 to 256, Lq != Lk,
 * the decode kernel (Lq <= 4, keys split in chunks), strided views, every
 * mask alone and combined (causal incl. Lq < Lk and Lq > Lk, key padding incl.
 * length 0, windows, bool and additive masks in broadcast and key-major
 * forms, fully masked rows) and dropout.
 *
 * Accuracy criterion: for out, weights, lse, dq, dk and dv, the fused error
 * against fp64 is at most 2x the reference path's own error against fp64,
 * plus an absolute floor FLOOR = 4·2^-24 (in the quantity's normalised
 * units: out / max|V|, weights, lse / max(1, |lse|), grad / max|grad|).
 * The floor only matters where the reference happens to be exact (e.g. a
 * problem whose rows each see one key): then the fused path may still carry
 * a few fp32 roundings of unit-sized values (its exp polynomial is within
 * ~1 ulp, then 1/l and the final product each round once), i.e. a few times
 * 2^-24. The fp64 forward (ref_oracle.h's, and grad_util.h's gu_sdpa_fwd with
 * dropout) and the analytic fp64 backward (gu_sdpa_bwd) are written from the
 * math; with dropout the keep mask is read back from the REFERENCE path
 * (gu_dropout_mult), so a fused path that dropped other elements would be
 * off by O(1), not by rounding.
 *
 * Determinism: 1, 2 and 3 threads give bitwise-identical out, lse, weights,
 * dq, dk and dv (with B·H of 1 or 2 this also compares the backward's
 * one-pass and two-pass schemes), and out/lse do not change when weights
 * are requested. NaN and Inf: same poisoned rows as the reference. */
#define _POSIX_C_SOURCE 200112L
#include "grad_util.h"
#include "internal.h" /* test hooks: ISA from the environment again, BLAS tiles */

#include <stdlib.h>

#define FLOOR (4.0 / 16777216.0)
/* Gradients are compared relative to max(max|fp64 grad|, GRAD_SCALE): where
 * the fp64 gradient is identically 0 (e.g. every row sees one key) the
 * errors are absolute over 1e-6 and still held to 2x the reference's. */
#define GRAD_SCALE 1e-6
#define SENT 555.5f

static const char *g_isa = "best";
static int g_isa_full; /* ISAs run so far */
static int g_cases;
/* worst fused/reference error ratio (error over max(reference error, FLOOR))
 * and worst absolute fused error per quantity */
enum { Q_OUT, Q_W, Q_LSE, Q_DQ, Q_DK, Q_DV, Q_N };
static const char *const q_name[Q_N] = {"out", "weights", "lse", "dq", "dk", "dv"};
static double g_ratio[Q_N], g_err_f[Q_N], g_err_r[Q_N];

typedef struct {
    const char *name;
    int64_t B, H, Lq, Lk, Dk, Dv;
    int lay_q, lay_k, lay_v, lay_o; /* GU_* layouts; dO and grads use lay_o/lay_q/lay_k/lay_v */
    float amp;                      /* |q|, |k| <= amp */
} shape;

typedef void (*prep_fn)(gu_view *q, gu_view *k, gu_view *v, tu_rng *r);
static void prep_large(gu_view *q, gu_view *k, gu_view *v, tu_rng *r);

static void accuracy(int qi, double ef, double er, const char *what, const shape *s) {
    CHECK(ef <= 2.0 * er + FLOOR,
          "[%s] %s: %s error %.3g > 2 x reference %.3g + floor (B%lld H%lld Lq%lld Lk%lld Dk%lld "
          "Dv%lld lay %d%d%d%d)",
          g_isa, s->name, what, ef, er, (long long)s->B, (long long)s->H, (long long)s->Lq,
          (long long)s->Lk, (long long)s->Dk, (long long)s->Dv, s->lay_q, s->lay_k, s->lay_v,
          s->lay_o);
    if (er > 1e-3) return; /* an all-zero fp64 gradient (see GRAD_SCALE): not a ratio */
    const double ratio = ef / (er > FLOOR ? er : FLOOR);
    if (ratio > g_ratio[qi] && isfinite(ratio)) g_ratio[qi] = ratio;
    if (getenv("RATIO_LOG") && ratio > 1.5)
        printf("ratio %.3f %s [%s] %s B%lld H%lld Lq%lld Lk%lld Dk%lld Dv%lld\n", ratio, what,
               g_isa, s->name, (long long)s->B, (long long)s->H, (long long)s->Lq, (long long)s->Lk,
               (long long)s->Dk, (long long)s->Dv);
    if (ef > g_err_f[qi] && isfinite(ef)) g_err_f[qi] = ef;
    if (er > g_err_r[qi] && isfinite(er)) g_err_r[qi] = er;
}

/* NaN where b is NaN and only there; elsewhere |a - b| <= tol·scale. */
static int nan_pattern_equal(const float *a, const float *b, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (isnan(a[i]) != isnan(b[i])) return 0;
    return 1;
}
static int nan_pattern_d(const float *a, const double *b, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (isnan(a[i]) != isnan(b[i])) return 0;
    return 1;
}

/* Finite-part max |a - b| / scale (NaN positions skipped). */
static double finite_diff(const float *a, const double *b, size_t n, double scale) {
    double m = 0.0;
    for (size_t i = 0; i < n; i++) {
        if (isnan(a[i]) || isnan(b[i])) continue;
        double e = (isinf(a[i]) || isinf(b[i])) ? (a[i] == b[i] ? 0.0 : INFINITY)
                                                : fabs((double)a[i] - b[i]) / scale;
        if (e > m) m = e;
    }
    return m;
}

typedef struct {
    gu_view o, dq, dk, dv;
    float *w, *lse;
} outs;

static outs outs_make(const shape *s) {
    outs r;
    r.o = gu_make_view(s->lay_o, s->B, s->H, s->Lq, s->Dv, SENT);
    r.dq = gu_make_view(s->lay_q, s->B, s->H, s->Lq, s->Dk, SENT);
    r.dk = gu_make_view(s->lay_k, s->B, s->H, s->Lk, s->Dk, SENT);
    r.dv = gu_make_view(s->lay_v, s->B, s->H, s->Lk, s->Dv, SENT);
    const size_t nl = (size_t)(s->B * s->H * s->Lq);
    r.w = tu_malloc(nl * (size_t)s->Lk * sizeof(float));
    r.lse = tu_malloc(nl * sizeof(float));
    for (size_t i = 0; i < nl * (size_t)s->Lk; i++) r.w[i] = NAN; /* every entry is written */
    for (size_t i = 0; i < nl; i++) r.lse[i] = NAN;
    return r;
}
static void outs_free(outs *r) {
    free(r->o.buf), free(r->dq.buf), free(r->dk.buf), free(r->dv.buf), free(r->w), free(r->lse);
}

/* Forward (weights + lse) and backward on one path and thread count. */
static int run_path(const shape *s, const attn_sdpa_params *p0, attn_impl impl, int threads,
                    const gu_view *q, const gu_view *k, const gu_view *v, const gu_view *go,
                    const outs *fwd_from, outs *r) {
    attn_sdpa_params p = *p0;
    p.impl = impl;
    p.num_threads = threads;
    attn_error err;
    attn_sdpa_info info;
    memset(&info, 0, sizeof info);
    attn_status st = attn_sdpa_forward(&q->t, &k->t, &v->t, &p, &r->o.t, r->w, r->lse, &info, &err);
    CHECK(st == ATTN_OK, "[%s] %s: forward %s: %s", g_isa, s->name, attn_status_name(st),
          err.message);
    if (st) return 0;
    CHECK(info.impl == impl, "[%s] %s: info.impl %d, wanted %d", g_isa, s->name, (int)info.impl,
          (int)impl);
    if (impl == ATTN_IMPL_FUSED)
        CHECK(strncmp(info.reason, "fused path: ", 12) == 0, "[%s] reason '%s'", g_isa,
              info.reason);
    else
        CHECK(strcmp(info.reason, "reference path: requested by the caller") == 0,
              "[%s] reason '%s'", g_isa, info.reason);
    /* the backward reads its own path's forward unless told otherwise */
    const outs *f = fwd_from ? fwd_from : r;
    st = attn_sdpa_backward(&q->t, &k->t, &v->t, &f->o.t, f->lse, &go->t, &p, &r->dq.t, &r->dk.t,
                            &r->dv.t, &info, &err);
    CHECK(st == ATTN_OK, "[%s] %s: backward %s: %s", g_isa, s->name, attn_status_name(st),
          err.message);
    return st == ATTN_OK;
}

static int same_bits(const void *a, const void *b, size_t bytes) {
    return memcmp(a, b, bytes) == 0;
}

static void run_case(const shape *s, const attn_sdpa_params *p, uint64_t seed, prep_fn prep) {
    const int64_t B = s->B, H = s->H, Lq = s->Lq, Lk = s->Lk, Dk = s->Dk, Dv = s->Dv;
    const size_t nO = (size_t)(B * H * Lq * Dv), nL = (size_t)(B * H * Lq), nW = nL * (size_t)Lk,
                 nQ = (size_t)(B * H * Lq * Dk), nK = (size_t)(B * H * Lk * Dk),
                 nV = (size_t)(B * H * Lk * Dv);
    tu_rng rng = tu_seed(seed);
    gu_view q = gu_make_view(s->lay_q, B, H, Lq, Dk, 0.0f),
            k = gu_make_view(s->lay_k, B, H, Lk, Dk, 0.0f),
            v = gu_make_view(s->lay_v, B, H, Lk, Dv, 0.0f),
            go = gu_make_view(s->lay_o, B, H, Lq, Dv, 0.0f);
    const float amp = s->amp > 0 ? s->amp : 1.0f;
    gu_fill_view(&q, &rng, -amp, amp);
    gu_fill_view(&k, &rng, -amp, amp);
    gu_fill_view(&v, &rng, -1.0f, 1.0f);
    gu_fill_view(&go, &rng, -1.0f, 1.0f);
    if (prep) prep(&q, &k, &v, &rng);
    g_cases++;

    outs ref = outs_make(s), f1 = outs_make(s), f2 = outs_make(s), f3 = outs_make(s);
    int ok = run_path(s, p, ATTN_IMPL_REFERENCE, 2, &q, &k, &v, &go, NULL, &ref) &&
             run_path(s, p, ATTN_IMPL_FUSED, 1, &q, &k, &v, &go, NULL, &f1) &&
             run_path(s, p, ATTN_IMPL_FUSED, 2, &q, &k, &v, &go, NULL, &f2) &&
             run_path(s, p, ATTN_IMPL_FUSED, 3, &q, &k, &v, &go, NULL, &f3);
    if (!ok) goto done;

    /* bitwise identical for 1, 2, 3 threads */
    {
        const outs *o[2] = {&f2, &f3};
        for (int t = 0; t < 2; t++) {
            CHECK(same_bits(f1.o.buf, o[t]->o.buf, f1.o.n * sizeof(float)) &&
                      same_bits(f1.lse, o[t]->lse, nL * sizeof(float)) &&
                      same_bits(f1.w, o[t]->w, nW * sizeof(float)),
                  "[%s] %s: forward with %d threads differs from 1 thread", g_isa, s->name, t + 2);
            CHECK(same_bits(f1.dq.buf, o[t]->dq.buf, f1.dq.n * sizeof(float)) &&
                      same_bits(f1.dk.buf, o[t]->dk.buf, f1.dk.n * sizeof(float)) &&
                      same_bits(f1.dv.buf, o[t]->dv.buf, f1.dv.n * sizeof(float)),
                  "[%s] %s: backward with %d threads differs from 1 thread", g_isa, s->name, t + 2);
        }
        CHECK(gu_gaps_touched(&f1.o, SENT) + gu_gaps_touched(&f1.dq, SENT) +
                      gu_gaps_touched(&f1.dk, SENT) + gu_gaps_touched(&f1.dv, SENT) ==
                  0,
              "[%s] %s: fused path wrote outside a view", g_isa, s->name);
        /* out and lse do not depend on whether weights are wanted */
        gu_view o2 = gu_make_view(s->lay_o, B, H, Lq, Dv, SENT);
        float *l2 = tu_malloc(nL * sizeof(float));
        attn_sdpa_params pp = *p;
        pp.impl = ATTN_IMPL_FUSED;
        pp.num_threads = 2;
        CHECK(attn_sdpa_forward(&q.t, &k.t, &v.t, &pp, &o2.t, NULL, l2, NULL, NULL) == ATTN_OK &&
                  same_bits(o2.buf, f1.o.buf, o2.n * sizeof(float)) &&
                  same_bits(l2, f1.lse, nL * sizeof(float)),
              "[%s] %s: out/lse change when weights are not requested", g_isa, s->name);
        free(o2.buf), free(l2);
    }

    /* fp64 oracle */
    {
        double *qd = tu_to_double(&q.t), *kd = tu_to_double(&k.t), *vd = tu_to_double(&v.t),
               *god = tu_to_double(&go.t);
        double *ro = tu_malloc(nO * sizeof(double)), *rw = tu_malloc(nW * sizeof(double)),
               *rl = tu_malloc(nL * sizeof(double));
        unsigned char *empty = tu_malloc(nL);
        ref_sdpa(B, H, Lq, Lk, Dk, Dv, qd, kd, vd, p, ro, rw, rl, empty);
        const int drop = p->training && p->dropout_p > 0.0f;
        double *mult = NULL;
        const gu_dims d = {B, H, Lq, Lk, Dk, Dv};
        if (drop) {
            attn_sdpa_params pr = *p;
            pr.impl = ATTN_IMPL_REFERENCE;
            mult = tu_malloc(nW * sizeof(double));
            CHECK(gu_dropout_mult(B, H, Lq, Lk, &pr, mult, NULL) == 0, "%s: mask read-back",
                  s->name);
            gu_sdpa_fwd(&d, qd, kd, vd, p, mult, ro);
        }
        const double vmax = tu_maxabs(v.buf, v.n) > 0 ? tu_maxabs(v.buf, v.n) : 1.0;
        float *fo = tu_gather(&f1.o.t), *rfo = tu_gather(&ref.o.t);
        accuracy(Q_OUT, tu_maxdiff(fo, ro, nO) / vmax, tu_maxdiff(rfo, ro, nO) / vmax, "out", s);
        accuracy(Q_W, tu_maxdiff(f1.w, rw, nW), tu_maxdiff(ref.w, rw, nW), "weights", s);
        accuracy(Q_LSE, tu_maxreldiff1(f1.lse, rl, nL), tu_maxreldiff1(ref.lse, rl, nL), "lse", s);
        if (drop) { /* same mask as the reference: fused within the bound of it */
            double *rfd = tu_doubles(rfo, nO);
            const double e_fr = tu_maxdiff(fo, rfd, nO) / vmax,
                         e_r = tu_maxdiff(rfo, ro, nO) / vmax;
            CHECK(e_fr <= 3.0 * e_r + FLOOR, "[%s] %s: dropout out differs from reference by %.3g",
                  g_isa, s->name, e_fr);
            free(rfd);
        }
        /* backward vs fp64 analytic gradient (from each path's own forward) */
        double *aq = tu_malloc(nQ * sizeof(double)), *ak = tu_malloc(nK * sizeof(double)),
               *av = tu_malloc(nV * sizeof(double));
        gu_sdpa_bwd(&d, qd, kd, vd, god, p, mult, aq, ak, av);
        float *fq = tu_gather(&f1.dq.t), *fk = tu_gather(&f1.dk.t), *fv = tu_gather(&f1.dv.t);
        float *rq = tu_gather(&ref.dq.t), *rk = tu_gather(&ref.dk.t), *rv = tu_gather(&ref.dv.t);
        accuracy(Q_DQ, gu_relerr_nf(fq, aq, nQ, GRAD_SCALE), gu_relerr_nf(rq, aq, nQ, GRAD_SCALE),
                 "dq", s);
        accuracy(Q_DK, gu_relerr_nf(fk, ak, nK, GRAD_SCALE), gu_relerr_nf(rk, ak, nK, GRAD_SCALE),
                 "dk", s);
        accuracy(Q_DV, gu_relerr_nf(fv, av, nV, GRAD_SCALE), gu_relerr_nf(rv, av, nV, GRAD_SCALE),
                 "dv", s);
        /* Structural zeros: a row that sees no key has dq exactly 0; a key
         * that no row sees has dk and dv exactly 0 (never NaN, never a
         * rounding residue). */
        size_t bad = 0;
        for (size_t row = 0; row < nL; row++)
            if (empty[row])
                for (int64_t x = 0; x < Dk; x++) bad += fq[row * (size_t)Dk + (size_t)x] != 0.0f;
        for (int64_t bh = 0; bh < B * H; bh++)
            for (int64_t j = 0; j < Lk; j++) {
                int seen = 0;
                for (int64_t i = 0; i < Lq && !seen; i++)
                    seen = rw[(size_t)((bh * Lq + i) * Lk + j)] != 0.0;
                if (seen) continue;
                for (int64_t x = 0; x < Dk; x++)
                    bad += fk[(size_t)((bh * Lk + j) * Dk + x)] != 0.0f;
                for (int64_t x = 0; x < Dv; x++)
                    bad += fv[(size_t)((bh * Lk + j) * Dv + x)] != 0.0f;
            }
        CHECK(bad == 0, "[%s] %s: %zu structurally zero gradient entries are not exactly 0", g_isa,
              s->name, bad);
        free(qd), free(kd), free(vd), free(god), free(ro), free(rw), free(rl), free(mult),
            free(empty);
        free(fo), free(rfo), free(aq), free(ak), free(av);
        free(fq), free(fk), free(fv), free(rq), free(rk), free(rv);
    }
done:
    outs_free(&ref), outs_free(&f1), outs_free(&f2), outs_free(&f3);
    free(q.buf), free(k.buf), free(v.buf), free(go.buf);
}

/* ------------------------------------------------------------ masks */

typedef struct {
    attn_mask m;
    void *buf;
} mask_buf;

/* Mask of dims [mB, mH, Lq, Lk] (mB in {1, B}, mH in {1, H}), stored
 * row-major or key-major; bool keeps with probability keep, additive values
 * in [-2, 1] with a fraction -inf; `dead_rows` rows fully removed. */
static mask_buf make_mask(int is_bool, int key_major, int64_t mB, int64_t mH, int64_t Lq,
                          int64_t Lk, tu_rng *r, double keep, int dead_rows) {
    mask_buf mb;
    const size_t n = (size_t)(mB * mH * Lq * Lk);
    mb.buf = tu_malloc(n * (is_bool ? 1 : sizeof(float)));
    mb.m.data = mb.buf;
    mb.m.dim[0] = mB, mb.m.dim[1] = mH, mb.m.dim[2] = Lq, mb.m.dim[3] = Lk;
    if (key_major)
        mb.m.stride[3] = Lq, mb.m.stride[2] = 1;
    else
        mb.m.stride[3] = 1, mb.m.stride[2] = Lk;
    mb.m.stride[1] = Lq * Lk, mb.m.stride[0] = mH * Lq * Lk;
    for (int64_t b = 0; b < mB; b++)
        for (int64_t h = 0; h < mH; h++)
            for (int64_t i = 0; i < Lq; i++) {
                const int dead = dead_rows > 0 && (i % 7 == 3) && (int)(i / 7) < dead_rows;
                for (int64_t j = 0; j < Lk; j++) {
                    const size_t off = (size_t)(b * mb.m.stride[0] + h * mb.m.stride[1] +
                                                i * mb.m.stride[2] + j * mb.m.stride[3]);
                    const int kept = !dead && tu_unif(r) < keep;
                    if (is_bool)
                        ((uint8_t *)mb.buf)[off] = (uint8_t)kept;
                    else
                        ((float *)mb.buf)[off] =
                            kept ? (float)(-2.0 + 3.0 * tu_unif(r)) : -INFINITY;
                }
            }
    return mb;
}

/* ------------------------------------------------------------ cases */

/* Integer q in +-[1, 1000] and k in {0, 1, 2}: scores are exact integers. */
static void prep_large(gu_view *q, gu_view *k, gu_view *v, tu_rng *r) {
    (void)v;
    const attn_tensor *tq = &q->t, *tk = &k->t;
    for (int64_t b = 0; b < tq->dim[0]; b++)
        for (int64_t h = 0; h < tq->dim[1]; h++) {
            for (int64_t l = 0; l < tq->dim[2]; l++)
                for (int64_t d = 0; d < tq->dim[3]; d++) {
                    const int64_t mag = tu_int(r, 1, 1000);
                    q->buf[tu_off(tq, b, h, l, d)] = (float)(tu_unif(r) < 0.5 ? -mag : mag);
                }
            for (int64_t l = 0; l < tk->dim[2]; l++)
                for (int64_t d = 0; d < tk->dim[3]; d++)
                    k->buf[tu_off(tk, b, h, l, d)] = (float)tu_int(r, 0, 2);
        }
}

static shape sh(const char *name, int64_t B, int64_t H, int64_t Lq, int64_t Lk, int64_t Dk,
                int64_t Dv) {
    shape s = {name, B, H, Lq, Lk, Dk, Dv, GU_BHLD, GU_BHLD, GU_BHLD, GU_BHLD, 1.0f};
    return s;
}

static void test_fixed(void) {
    const shape cases[] = {
        sh("L=1", 1, 1, 1, 1, 1, 1),
        sh("decode 1x1100 (5 chunks)", 2, 3, 1, 1100, 64, 64),
        sh("decode Lq=3 odd D", 2, 2, 3, 300, 17, 5),
        sh("decode Lq=4 D=256", 1, 2, 4, 70, 256, 256),
        sh("D=256", 1, 2, 5, 7, 256, 256),
        sh("Dk=256 Dv=1", 1, 1, 70, 33, 256, 1),
        sh("non-divisible", 1, 1, 130, 70, 33, 100),
        sh("exact tiles", 2, 1, 128, 192, 16, 16),
        sh("65x129", 1, 1, 65, 129, 8, 1),
        sh("Lq>Lk", 1, 1, 200, 40, 3, 7),
        sh("Lq<Lk", 1, 2, 40, 200, 32, 32),
        sh("BH=3 two-pass", 3, 1, 100, 150, 24, 40),
    };
    const int n = (int)(sizeof cases / sizeof cases[0]);
    for (int c = 0; c < n; c++) {
        attn_sdpa_params p = {0};
        run_case(&cases[c], &p, 100 + (uint64_t)c, NULL);
        p.causal = 1;
        run_case(&cases[c], &p, 200 + (uint64_t)c, NULL);
    }
    /* strided views of every layout, custom scale */
    for (int lay = 0; lay < GU_LAYOUTS; lay++) {
        shape s = sh("layouts", 2, 2, 70, 90, 20, 16);
        s.lay_q = lay, s.lay_k = (lay + 1) % GU_LAYOUTS, s.lay_v = (lay + 2) % GU_LAYOUTS;
        s.lay_o = (lay + 3) % GU_LAYOUTS;
        attn_sdpa_params p = {0};
        p.use_scale = 1, p.scale = 0.3f;
        p.causal = lay & 1;
        run_case(&s, &p, 300 + (uint64_t)lay, NULL);
        shape d = sh("layouts decode", 2, 2, 2, 300, 20, 16);
        d.lay_q = s.lay_q, d.lay_k = s.lay_k, d.lay_v = s.lay_v, d.lay_o = s.lay_o;
        run_case(&d, &p, 310 + (uint64_t)lay, NULL);
    }
    /* large logits: scores up to ~1.6e4, exact integers in fp32 whatever the
     * summation order (so both paths see the same scores and the 2x bound
     * compares exp/log/softmax handling, not the luck of rounding 1e4) */
    {
        shape s = sh("large logits", 2, 2, 70, 80, 8, 8);
        attn_sdpa_params p = {0};
        p.use_scale = 1, p.scale = 1.0f;
        run_case(&s, &p, 400, prep_large);
        p.causal = 1;
        run_case(&s, &p, 401, prep_large);
        s.Lq = 3;
        run_case(&s, &p, 402, prep_large);
    }
}

static void random_params(tu_rng *r, const shape *s, attn_sdpa_params *p, int64_t *lens,
                          mask_buf *mb, mask_buf *ma, int allow_dropout) {
    memset(p, 0, sizeof *p);
    mb->buf = ma->buf = NULL;
    p->causal = tu_unif(r) < 0.4;
    if (tu_unif(r) < 0.3) {
        for (int64_t b = 0; b < s->B; b++) lens[b] = tu_int(r, 0, s->Lk);
        p->key_lengths = lens;
    }
    if (tu_unif(r) < 0.3) {
        p->use_window = 1;
        p->window_left = tu_unif(r) < 0.3 ? ATTN_UNBOUNDED : tu_int(r, 0, 40);
        p->window_right = tu_unif(r) < 0.3 ? ATTN_UNBOUNDED : tu_int(r, 0, 40);
    }
    for (int kind = 1; kind >= 0; kind--) { /* bool, then additive */
        if (tu_unif(r) >= 0.3) continue;
        const int key_major = tu_unif(r) < 0.3;
        const int64_t mB = tu_unif(r) < 0.5 ? 1 : s->B;
        const int64_t mH = tu_unif(r) < 0.5 ? 1 : s->H;
        const int dead = (int)tu_int(r, 0, 2);
        mask_buf *m = kind ? mb : ma;
        *m = make_mask(kind, key_major, mB, mH, s->Lq, s->Lk, r, kind ? 0.8 : 0.9, dead);
        if (kind)
            p->bool_mask = &m->m;
        else
            p->add_mask = &m->m;
    }
    if (allow_dropout && tu_unif(r) < 0.25) {
        p->training = 1;
        p->dropout_p = (float)(0.1 + 0.4 * tu_unif(r));
        p->seed = tu_next(r);
        p->offset = tu_next(r) & 0xFFFF;
    }
    if (tu_unif(r) < 0.2) p->use_scale = 1, p->scale = (float)(0.05 + tu_unif(r));
}

static void test_random(int iters, uint64_t seed) {
    static const int64_t dims[] = {1,  2,  3,  5,  8,  15,  16,  17, 31,
                                   32, 33, 48, 64, 65, 100, 128, 256};
    static const int64_t lens_q[] = {1, 2, 3, 4, 5, 9, 16, 17, 31, 63, 64, 65, 100, 129, 150};
    static const int64_t lens_k[] = {1, 2, 7, 33, 63, 64, 65, 100, 127, 128, 129, 200, 300, 520};
    tu_rng r = tu_seed(seed);
    for (int it = 0; it < iters; it++) {
        /* one draw per statement: argument evaluation order is unspecified */
        const int64_t B = tu_int(&r, 1, 2), H = tu_int(&r, 1, 3);
        const int64_t Lq = lens_q[tu_int(&r, 0, (int64_t)(sizeof lens_q / sizeof lens_q[0]) - 1)];
        const int64_t Lk = lens_k[tu_int(&r, 0, (int64_t)(sizeof lens_k / sizeof lens_k[0]) - 1)];
        const int64_t Dk = dims[tu_int(&r, 0, (int64_t)(sizeof dims / sizeof dims[0]) - 1)];
        const int64_t Dv = dims[tu_int(&r, 0, (int64_t)(sizeof dims / sizeof dims[0]) - 1)];
        shape s = sh("random", B, H, Lq, Lk, Dk, Dv);
        /* keep the fp64 work bounded */
        while ((double)s.B * s.H * s.Lq * s.Lk * (double)(s.Dk + s.Dv) > 3e6) {
            if (s.Dk > 8)
                s.Dk /= 2;
            else if (s.Dv > 8)
                s.Dv /= 2;
            else if (s.Lk > 16)
                s.Lk /= 2;
            else
                s.Lq = (s.Lq + 1) / 2;
        }
        if (tu_unif(&r) < 0.3) s.Lq = s.Lk; /* self-attention shapes */
        s.lay_q = (int)tu_int(&r, 0, GU_LAYOUTS - 1);
        s.lay_k = (int)tu_int(&r, 0, GU_LAYOUTS - 1);
        s.lay_v = (int)tu_int(&r, 0, GU_LAYOUTS - 1);
        s.lay_o = (int)tu_int(&r, 0, GU_LAYOUTS - 1);
        attn_sdpa_params p;
        int64_t lens[2];
        mask_buf mb, ma;
        random_params(&r, &s, &p, lens, &mb, &ma, 1);
        run_case(&s, &p, tu_next(&r), NULL);
        free(mb.buf), free(ma.buf);
    }
}

/* Every mask alone and all together, block and decode shapes. */
static void test_masks(int nshapes) {
    const shape shapes[] = {sh("masks block", 2, 2, 90, 130, 16, 24),
                            sh("masks decode", 2, 2, 3, 600, 16, 24),
                            sh("masks Lq>Lk", 1, 2, 150, 70, 8, 8)};
    for (int si = 0; si < nshapes; si++) {
        const shape *s = &shapes[si];
        tu_rng r = tu_seed(500 + (uint64_t)si);
        int64_t lens[2] = {s->Lk / 2 + 1, 0}; /* batch 1: every key removed */
        if (s->B == 1) lens[0] = s->Lk - 5;
        mask_buf mb = make_mask(1, 0, s->B, 1, s->Lq, s->Lk, &r, 0.7, 2);
        mask_buf mbt = make_mask(1, 1, 1, s->H, s->Lq, s->Lk, &r, 0.7, 1);
        mask_buf ma = make_mask(0, 0, 1, s->H, s->Lq, s->Lk, &r, 0.8, 1);
        mask_buf mat = make_mask(0, 1, s->B, s->H, s->Lq, s->Lk, &r, 0.8, 0);
        for (int variant = 0; variant < 10; variant++) {
            attn_sdpa_params p = {0};
            switch (variant) {
            case 0: p.causal = 1; break;
            case 1: p.key_lengths = lens; break;
            case 2: p.use_window = 1, p.window_left = 5, p.window_right = 0; break;
            case 3: p.use_window = 1, p.window_left = ATTN_UNBOUNDED, p.window_right = 3; break;
            case 4: p.bool_mask = &mb.m; break;
            case 5: p.bool_mask = &mbt.m; break;
            case 6: p.add_mask = &ma.m; break;
            case 7: p.add_mask = &mat.m; break;
            case 8: /* everything */
                p.causal = 1, p.key_lengths = lens, p.use_window = 1, p.window_left = 40;
                p.window_right = 2, p.bool_mask = &mb.m, p.add_mask = &mat.m;
                break;
            default: /* everything + dropout */
                p.causal = 1, p.key_lengths = lens, p.bool_mask = &mbt.m, p.add_mask = &ma.m;
                p.training = 1, p.dropout_p = 0.3f, p.seed = 77, p.offset = 5;
                break;
            }
            run_case(s, &p, 600 + (uint64_t)(si * 16 + variant), NULL);
        }
        free(mb.buf), free(mbt.buf), free(ma.buf), free(mat.buf);
    }
}

static void test_dropout(void) {
    const shape shapes[] = {sh("dropout block", 2, 2, 70, 100, 32, 16),
                            sh("dropout decode", 2, 3, 1, 700, 32, 16),
                            sh("dropout odd", 1, 1, 33, 9, 5, 3)};
    for (int si = 0; si < 3; si++)
        for (int c = 0; c < 2; c++) {
            attn_sdpa_params p = {0};
            p.training = 1;
            p.dropout_p = si == 2 ? 0.6f : 0.2f;
            p.seed = 1234 + (uint64_t)si;
            p.offset = 99;
            p.causal = c;
            run_case(&shapes[si], &p, 700 + (uint64_t)(si * 2 + c), NULL);
        }
}

/* ------------------------------------------------------------ NaN / Inf */

static void prep_nan_q(gu_view *q, gu_view *k, gu_view *v, tu_rng *r) {
    (void)k, (void)v, (void)r;
    q->buf[tu_off(&q->t, 0, 1, q->t.dim[2] - 1, 0)] = NAN;
}
/* NaN in K and V of keys no row sees: beyond key_lengths and key 2. */
static int64_t g_nan_lens[2] = {40, 70};
static void prep_nan_removed(gu_view *q, gu_view *k, gu_view *v, tu_rng *r) {
    (void)q, (void)r;
    for (int64_t b = 0; b < k->t.dim[0]; b++)
        for (int64_t h = 0; h < k->t.dim[1]; h++)
            for (int64_t j = 0; j < k->t.dim[2]; j++) {
                if (j < g_nan_lens[b] && j != 2) continue;
                for (int64_t d = 0; d < k->t.dim[3]; d++) k->buf[tu_off(&k->t, b, h, j, d)] = NAN;
                for (int64_t d = 0; d < v->t.dim[3]; d++) v->buf[tu_off(&v->t, b, h, j, d)] = NAN;
            }
}
/* Inf in V of a key the causal mask hides from the earlier rows. */
static void prep_inf_v(gu_view *q, gu_view *k, gu_view *v, tu_rng *r) {
    (void)q, (void)k, (void)r;
    v->buf[tu_off(&v->t, 0, 0, 20, 1)] = INFINITY;
}

static void run_nonfinite(const shape *s, const attn_sdpa_params *p, uint64_t seed, prep_fn prep) {
    const int64_t B = s->B, H = s->H, Lq = s->Lq, Lk = s->Lk, Dk = s->Dk, Dv = s->Dv;
    const size_t nO = (size_t)(B * H * Lq * Dv), nL = (size_t)(B * H * Lq), nW = nL * (size_t)Lk;
    tu_rng rng = tu_seed(seed);
    gu_view q = gu_make_view(GU_BHLD, B, H, Lq, Dk, 0), k = gu_make_view(GU_BHLD, B, H, Lk, Dk, 0),
            v = gu_make_view(GU_BHLD, B, H, Lk, Dv, 0), go = gu_make_view(GU_BHLD, B, H, Lq, Dv, 0);
    gu_fill_view(&q, &rng, -1, 1), gu_fill_view(&k, &rng, -1, 1);
    gu_fill_view(&v, &rng, -1, 1), gu_fill_view(&go, &rng, -1, 1);
    prep(&q, &k, &v, &rng);
    outs ref = outs_make(s), f1 = outs_make(s), f2 = outs_make(s);
    if (run_path(s, p, ATTN_IMPL_REFERENCE, 1, &q, &k, &v, &go, NULL, &ref) &&
        run_path(s, p, ATTN_IMPL_FUSED, 1, &q, &k, &v, &go, NULL, &f1) &&
        run_path(s, p, ATTN_IMPL_FUSED, 3, &q, &k, &v, &go, NULL, &f2)) {
        g_cases++;
        double *qd = tu_to_double(&q.t), *kd = tu_to_double(&k.t), *vd = tu_to_double(&v.t);
        double *ro = tu_malloc(nO * sizeof(double)), *rw = tu_malloc(nW * sizeof(double)),
               *rl = tu_malloc(nL * sizeof(double));
        ref_sdpa(B, H, Lq, Lk, Dk, Dv, qd, kd, vd, p, ro, rw, rl, NULL);
        float *fo = tu_gather(&f1.o.t), *rfo = tu_gather(&ref.o.t);
        CHECK(nan_pattern_equal(fo, rfo, nO) && nan_pattern_equal(f1.lse, ref.lse, nL),
              "[%s] %s: NaN rows of out/lse differ from the reference", g_isa, s->name);
        CHECK(nan_pattern_d(fo, ro, nO) && nan_pattern_d(f1.w, rw, nW),
              "[%s] %s: NaN entries of out/weights differ from the oracle", g_isa, s->name);
        const double e = finite_diff(fo, ro, nO, 1.0), er = finite_diff(rfo, ro, nO, 1.0);
        CHECK(e <= 2.0 * er + FLOOR, "[%s] %s: finite outputs off by %.3g (reference %.3g)", g_isa,
              s->name, e, er);
        CHECK(finite_diff(f1.w, rw, nW, 1.0) <= 2.0 * finite_diff(ref.w, rw, nW, 1.0) + FLOOR,
              "[%s] %s: finite weights off", g_isa, s->name);
        float *fq = tu_gather(&f1.dq.t), *fk = tu_gather(&f1.dk.t), *fv = tu_gather(&f1.dv.t);
        float *rq = tu_gather(&ref.dq.t), *rk = tu_gather(&ref.dk.t), *rv = tu_gather(&ref.dv.t);
        CHECK(nan_pattern_equal(fq, rq, (size_t)(B * H * Lq * Dk)) &&
                  nan_pattern_equal(fk, rk, (size_t)(B * H * Lk * Dk)) &&
                  nan_pattern_equal(fv, rv, (size_t)(B * H * Lk * Dv)),
              "[%s] %s: NaN pattern of the gradients differs from the reference", g_isa, s->name);
        CHECK(same_bits(f1.o.buf, f2.o.buf, f1.o.n * sizeof(float)) &&
                  same_bits(f1.dk.buf, f2.dk.buf, f1.dk.n * sizeof(float)) &&
                  same_bits(f1.dq.buf, f2.dq.buf, f1.dq.n * sizeof(float)),
              "[%s] %s: thread counts differ", g_isa, s->name);
        free(qd), free(kd), free(vd), free(ro), free(rw), free(rl), free(fo), free(rfo);
        free(fq), free(fk), free(fv), free(rq), free(rk), free(rv);
    }
    outs_free(&ref), outs_free(&f1), outs_free(&f2);
    free(q.buf), free(k.buf), free(v.buf), free(go.buf);
}

static void test_nonfinite(void) {
    const shape blk = sh("NaN query row", 2, 2, 70, 90, 12, 10),
                dec = sh("NaN query row decode", 2, 2, 2, 300, 12, 10);
    attn_sdpa_params p = {0};
    run_nonfinite(&blk, &p, 800, prep_nan_q);
    run_nonfinite(&dec, &p, 801, prep_nan_q);
    p.causal = 1;
    run_nonfinite(&blk, &p, 802, prep_nan_q);

    /* NaN in removed keys leaves every output finite */
    const int64_t Lq = 66, Lk = 90;
    uint8_t *bm = tu_malloc((size_t)(Lq * Lk));
    for (int64_t i = 0; i < Lq * Lk; i++) bm[i] = i % Lk != 2;
    attn_mask m = {bm, {1, 1, Lq, Lk}, {0, 0, Lk, 1}};
    attn_sdpa_params pn = {0};
    pn.key_lengths = g_nan_lens;
    pn.bool_mask = &m;
    shape s = sh("NaN in removed keys", 2, 2, Lq, Lk, 6, 5);
    run_nonfinite(&s, &pn, 810, prep_nan_removed);
    pn.causal = 1;
    run_nonfinite(&s, &pn, 811, prep_nan_removed);
    /* d over one AVX-512 vector: the finiteness checks' whole-vector loads */
    shape sw = sh("NaN in removed keys, d 40", 2, 2, Lq, Lk, 40, 24);
    run_nonfinite(&sw, &pn, 812, prep_nan_removed);
    free(bm);

    /* Inf in V of key 20: rows that do not see it stay finite */
    attn_sdpa_params pc = {0};
    pc.causal = 1;
    shape si = sh("Inf in V, causal", 1, 2, 80, 80, 8, 4);
    run_nonfinite(&si, &pc, 820, prep_inf_v);

    /* +inf additive entry: that row is NaN */
    float *am = tu_malloc((size_t)(70 * 70) * sizeof(float));
    for (int i = 0; i < 70 * 70; i++) am[i] = 0.0f;
    am[5 * 70 + 3] = INFINITY;
    attn_mask ma = {am, {1, 1, 70, 70}, {0, 0, 70, 1}};
    attn_sdpa_params pa = {0};
    pa.add_mask = &ma;
    shape sa = sh("+inf additive", 1, 1, 70, 70, 8, 8);
    run_nonfinite(&sa, &pa, 830, prep_inf_v);
    free(am);
}

/* ------------------------------------------------------------ misc */

/* Tile products through OpenBLAS (the measurement hook of internal.h)
 * meet the same accuracy bound. */
static void test_blas_mode(void) {
    attn_test_fused_blas(1);
    attn_sdpa_params p = {0};
    shape s = sh("blas tiles", 2, 2, 100, 140, 32, 48);
    run_case(&s, &p, 900, NULL);
    p.causal = 1;
    run_case(&s, &p, 901, NULL);
    attn_test_fused_blas(0);
}

/* AUTO takes the fused path and says so. */
static void test_dispatch(void) {
    float q[4 * 8] = {0}, k[4 * 8] = {0}, v[4 * 8] = {0}, o[4 * 8];
    attn_tensor tq = attn_tensor_bhld(q, 1, 1, 4, 8), tk = attn_tensor_bhld(k, 1, 1, 4, 8),
                tv = attn_tensor_bhld(v, 1, 1, 4, 8), to = attn_tensor_bhld(o, 1, 1, 4, 8);
    attn_sdpa_info info;
    attn_sdpa_params p = {0};
    CHECK(attn_sdpa_forward(&tq, &tk, &tv, &p, &to, NULL, NULL, &info, NULL) == ATTN_OK &&
              info.impl == ATTN_IMPL_FUSED && strstr(info.reason, "fused path: ") == info.reason,
          "AUTO: impl %d reason '%s'", (int)info.impl, info.reason);
    p.impl = ATTN_IMPL_REFERENCE;
    CHECK(attn_sdpa_forward(&tq, &tk, &tv, &p, &to, NULL, NULL, &info, NULL) == ATTN_OK &&
              info.impl == ATTN_IMPL_REFERENCE,
          "REFERENCE: impl %d", (int)info.impl);
}

/* Which ISA the library actually uses now (from the reason string). */
static int isa_active(const char *isa) {
    float q[8] = {0}, o[8];
    attn_tensor t = attn_tensor_bhld(q, 1, 1, 1, 8), to = attn_tensor_bhld(o, 1, 1, 1, 8);
    attn_sdpa_info info;
    attn_sdpa_params p = {0};
    if (attn_sdpa_forward(&t, &t, &t, &p, &to, NULL, NULL, &info, NULL) != ATTN_OK) return 0;
    char want[32];
    snprintf(want, sizeof want, "fused path: %s ", isa);
    return strncmp(info.reason, want, strlen(want)) == 0;
}

int main(void) {
    attn_enable_amx(); /* the amx row too, where the CPU has it */
    test_dispatch();
    /* every row of the library's table (best first), those the CPU runs */
    for (int i = 0; attn_test_isa_name(i); i++) {
        const char *const isa = attn_test_isa_name(i);
        setenv("ATTN_FUSED_ISA", isa, 1);
        attn_test_reload_env(); /* the library reads the environment once */
        if (!isa_active(isa)) {
            printf("test_sdpa_fused: %s kernels not available on this CPU, skipped\n", isa);
            continue;
        }
        g_isa = isa;
        const int before = g_cases;
        /* the best kernels get the full set; the others (same algorithm,
         * other vector width) a lighter one to keep the test quick */
        const int full = g_isa_full == 0;
        g_isa_full++;
        if (full || !attn_test_isa_name(i + 1)) test_fixed(); /* and the last, portable */
        test_masks(full ? 3 : 1);
        if (full) test_dropout();
        test_nonfinite();
        test_random(full ? 36 : 10, 0xF00D + (uint64_t)i);
        if (full) test_blas_mode();
        printf("test_sdpa_fused: %s kernels: %d cases (%d checks so far)\n", isa,
               g_cases - before, tu_pass + tu_fail);
    }
    unsetenv("ATTN_FUSED_ISA");
    attn_test_reload_env();
    printf("test_sdpa_fused: worst fused/reference error ratio vs fp64 (bound 2 + floor):\n");
    for (int qi = 0; qi < Q_N; qi++)
        printf("  %-7s ratio %.3f   worst fused %.3g   worst reference %.3g\n", q_name[qi],
               g_ratio[qi], g_err_f[qi], g_err_r[qi]);
    return tu_report("test_sdpa_fused");
}
