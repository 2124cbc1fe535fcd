/* attn_sdpa_forward (REFERENCE and AUTO paths) against the fp64 oracle in
 * ref_oracle.h: odd shapes, strided views, every mask alone and combined,
 * empty rows, large logits, NaN propagation, custom scale.
 *
 * Tolerances (fp32 storage, fp32 accumulation, |q|,|k|,|v| <= 1, Dk <= 32,
 * Lk <= 64): a score carries ~Dk*eps*|q||k| ~ 4e-6 absolute error, which is
 * the relative error of every weight; out = sum_j w_j v_j then adds ~Lk*eps.
 * So |out err| <= 1e-5 * max|V|, |weight err| <= 1e-5, |lse err| <=
 * 1e-5 * max(1, |lse|) hold with a few-fold margin over the measured error. */
#include "grad_util.h"

#define TOL_OUT 1e-5 /* relative to max|V| */
#define TOL_W 1e-5   /* absolute, weights are in [0, 1] */
#define TOL_LSE 1e-5 /* relative to max(1, |lse|) */

static double g_err_out, g_err_w, g_err_lse; /* worst measured, for the log */
static int g_cases;

/* Strided test views (every float, gaps too, starts as the fill value, so
 * stray writes show up): grad_util.h's gu_view, gu_make_view, gu_fill_view. */

/* ------------------------------------------------------------ masks */

enum { MV_CONTIG, MV_STRIDE0, MV_DIM1_GARBAGE, MV_TRANSPOSED, MV_KEYONLY, MV_COUNT };

/* A mask broadcastable to [B,H,Lq,Lk] with dims mB (B or 1) x mH (H or 1):
 *   MV_CONTIG       contiguous [mB, mH, Lq, Lk]
 *   MV_STRIDE0      dims [B, H, Lq, Lk] but stride 0 where mB/mH is 1
 *   MV_DIM1_GARBAGE dims of size 1 carry a huge stride that must be ignored
 *   MV_TRANSPOSED   [mB, mH, Lq, Lk] stored key-major (stride[2] == 1)
 *   MV_KEYONLY      [mB, mH, Lq, Lk] with stride[2] == 0: one row of Lk per
 *                   (b, h), the usual padding-mask shape */
typedef struct {
    attn_mask m;
    void *buf;
} mask_buf;

static mask_buf make_mask(int is_bool, int variant, int64_t B, int64_t H, int64_t mB, int64_t mH,
                          int64_t Lq, int64_t Lk, tu_rng *r, double p_drop) {
    mask_buf mb;
    int64_t *dim = mb.m.dim, *st = mb.m.stride;
    dim[0] = mB, dim[1] = mH, dim[2] = Lq, dim[3] = Lk;
    st[3] = 1, st[2] = Lk, st[1] = Lq * Lk, st[0] = mH * Lq * Lk;
    size_t n = (size_t)(mB * mH * Lq * Lk);
    if (variant == MV_STRIDE0) {
        dim[0] = B, dim[1] = H;
        st[1] = mH == 1 ? 0 : Lq * Lk;
        st[0] = mB == 1 ? 0 : mH * Lq * Lk;
    } else if (variant == MV_DIM1_GARBAGE) {
        if (mH == 1) st[1] = (int64_t)1 << 40;
        if (mB == 1) st[0] = (int64_t)1 << 41;
        if (mH == 1 && mB != 1) st[0] = Lq * Lk;
    } else if (variant == MV_TRANSPOSED) {
        st[2] = 1, st[3] = Lq;
    } else if (variant == MV_KEYONLY) {
        st[2] = 0, st[1] = Lk, st[0] = mH * Lk;
        n = (size_t)(mB * mH * Lk);
    }
    size_t esz = is_bool ? 1 : sizeof(float);
    mb.buf = tu_malloc(n * esz);
    for (size_t i = 0; i < n; i++) {
        int drop = tu_unif(r) < p_drop;
        if (is_bool) {
            static const uint8_t keep[4] = {1, 2, 7, 255}; /* nonzero = keep */
            ((uint8_t *)mb.buf)[i] = drop ? 0 : keep[tu_next(r) & 3];
        } else {
            ((float *)mb.buf)[i] = drop ? -INFINITY : (float)(4.0 * tu_unif(r) - 2.0);
        }
    }
    mb.m.data = mb.buf;
    return mb;
}

/* ------------------------------------------------------------ one case */

typedef struct {
    const char *name;
    int64_t B, H, Lq, Lk, Dk, Dv;
    int lay_q, lay_k, lay_v, lay_o;
    float in_lo, in_hi; /* uniform range of q and k (v is always [-1, 1]) */
} shape;

/* Runs the case with `impl`, with and without weights/lse, and compares
 * everything with the oracle. q/k/v are filled from seed unless
 * pre-filled views are given (prep != NULL) . */
typedef void (*prep_fn)(gu_view *q, gu_view *k, gu_view *v, tu_rng *r);

static void run_case(const shape *s, const attn_sdpa_params *p0, attn_impl impl, uint64_t seed,
                     prep_fn prep) {
    const int64_t B = s->B, H = s->H, Lq = s->Lq, Lk = s->Lk, Dk = s->Dk, Dv = s->Dv;
    tu_rng r = tu_seed(seed);
    gu_view q = gu_make_view(s->lay_q, B, H, Lq, Dk, 0.0f);
    gu_view k = gu_make_view(s->lay_k, B, H, Lk, Dk, 0.0f);
    gu_view v = gu_make_view(s->lay_v, B, H, Lk, Dv, 0.0f);
    gu_view o = gu_make_view(s->lay_o, B, H, Lq, Dv, 1234.5f);
    gu_fill_view(&q, &r, s->in_lo, s->in_hi);
    gu_fill_view(&k, &r, s->in_lo, s->in_hi);
    gu_fill_view(&v, &r, -1.0f, 1.0f);
    if (prep) prep(&q, &k, &v, &r);

    /* Copies to prove the inputs are read only. */
    float *q0 = tu_malloc(q.n * sizeof(float)), *k0 = tu_malloc(k.n * sizeof(float)),
          *v0 = tu_malloc(v.n * sizeof(float));
    memcpy(q0, q.buf, q.n * sizeof(float));
    memcpy(k0, k.buf, k.n * sizeof(float));
    memcpy(v0, v.buf, v.n * sizeof(float));

    const size_t nO = (size_t)(B * H * Lq * Dv), nW = (size_t)(B * H * Lq * Lk),
                 nL = (size_t)(B * H * Lq);
    double *qd = tu_to_double(&q.t), *kd = tu_to_double(&k.t), *vd = tu_to_double(&v.t);
    double *ro = tu_malloc(nO * sizeof(double)), *rw = tu_malloc(nW * sizeof(double)),
           *rl = tu_malloc(nL * sizeof(double));
    unsigned char *empty = tu_malloc(nL);
    ref_sdpa(B, H, Lq, Lk, Dk, Dv, qd, kd, vd, p0, ro, rw, rl, empty);

    float *w = tu_malloc(nW * sizeof(float)), *lse = tu_malloc(nL * sizeof(float));
    for (size_t i = 0; i < nW; i++) w[i] = NAN; /* sentinels: every entry must be written */
    for (size_t i = 0; i < nL; i++) lse[i] = NAN;

    attn_sdpa_params p = *p0;
    p.impl = impl;
    const double vmax = tu_maxabs(v.buf, v.n) > 0 ? tu_maxabs(v.buf, v.n) : 1.0;
    const char *iname = impl == ATTN_IMPL_REFERENCE ? "REFERENCE" : "AUTO";

    for (int with_wl = 1; with_wl >= 0; with_wl--) {
        attn_sdpa_info info;
        attn_error err;
        memset(&info, 0, sizeof info);
        memset(&err, 0, sizeof err);
        for (size_t i = 0; i < o.n; i++) o.buf[i] = 1234.5f;
        attn_status st = attn_sdpa_forward(&q.t, &k.t, &v.t, &p, &o.t, with_wl ? w : NULL,
                                           with_wl ? lse : NULL, &info, &err);
        CHECK(st == ATTN_OK, "%s/%s%s: status %s: %s", s->name, iname,
              with_wl ? "" : " (no weights)", attn_status_name(st), err.message);
        if (st != ATTN_OK) break;
        g_cases++;
        CHECK(info.reason[0] != '\0', "%s: empty info.reason", s->name);
        if (impl == ATTN_IMPL_REFERENCE)
            CHECK(info.impl == ATTN_IMPL_REFERENCE, "%s: info.impl %d", s->name, (int)info.impl);

        float *og = tu_gather(&o.t);
        double eo = tu_maxdiff(og, ro, nO) / vmax;
        CHECK(eo <= TOL_OUT, "%s/%s [%s q, %s k, %s v, %s out]%s: max|out err|/max|V| = %.3g",
              s->name, iname, gu_lay_name[s->lay_q], gu_lay_name[s->lay_k], gu_lay_name[s->lay_v],
              gu_lay_name[s->lay_o], with_wl ? "" : " (no weights)", eo);
        if (eo > g_err_out) g_err_out = eo;

        /* Empty rows: exactly 0, never NaN. */
        int empty_ok = 1;
        for (size_t row = 0; row < nL; row++)
            if (empty[row])
                for (int64_t d = 0; d < Dv; d++)
                    if (og[row * (size_t)Dv + (size_t)d] != 0.0f) empty_ok = 0;
        CHECK(empty_ok, "%s/%s: an empty row's output is not exactly 0", s->name, iname);

        /* Bytes outside the out view (padding) stay untouched: count them. */
        size_t untouched = 0;
        for (size_t i = 0; i < o.n; i++) untouched += o.buf[i] == 1234.5f;
        CHECK(untouched >= o.n - nO, "%s/%s: writes outside the out view", s->name, iname);
        free(og);

        if (with_wl) {
            double ew = tu_maxdiff(w, rw, nW);
            double el = tu_maxreldiff1(lse, rl, nL);
            CHECK(ew <= TOL_W, "%s/%s: max|weight err| = %.3g", s->name, iname, ew);
            CHECK(el <= TOL_LSE, "%s/%s: max|lse err| = %.3g", s->name, iname, el);
            if (ew > g_err_w && isfinite(ew)) g_err_w = ew;
            if (el > g_err_lse && isfinite(el)) g_err_lse = el;
            int eok = 1;
            for (size_t row = 0; row < nL; row++)
                if (empty[row]) {
                    if (!(isinf(lse[row]) && lse[row] < 0)) eok = 0;
                    for (int64_t j = 0; j < Lk; j++)
                        if (w[row * (size_t)Lk + (size_t)j] != 0.0f) eok = 0;
                }
            CHECK(eok, "%s/%s: empty row without weights 0 and lse -inf", s->name, iname);
        }
    }
    CHECK(memcmp(q0, q.buf, q.n * sizeof(float)) == 0 &&
              memcmp(k0, k.buf, k.n * sizeof(float)) == 0 &&
              memcmp(v0, v.buf, v.n * sizeof(float)) == 0,
          "%s: inputs modified", s->name);

    free(q0), free(k0), free(v0), free(qd), free(kd), free(vd);
    free(ro), free(rw), free(rl), free(empty), free(w), free(lse);
    free(q.buf), free(k.buf), free(v.buf), free(o.buf);
}

static void run_both(const shape *s, const attn_sdpa_params *p, uint64_t seed, prep_fn prep) {
    run_case(s, p, ATTN_IMPL_REFERENCE, seed, prep);
    run_case(s, p, ATTN_IMPL_AUTO, seed, prep);
}

static shape sh(const char *name, int64_t B, int64_t H, int64_t Lq, int64_t Lk, int64_t Dk,
                int64_t Dv) {
    shape s = {name, B, H, Lq, Lk, Dk, Dv, GU_BHLD, GU_BHLD, GU_BHLD, GU_BHLD, -1.0f, 1.0f};
    return s;
}

/* ------------------------------------------------------------ tests */

static void test_shapes(void) {
    attn_sdpa_params p = {0};
    const shape cases[] = {
        sh("basic", 2, 3, 17, 17, 16, 16),      sh("lq<lk, dv!=dk", 2, 2, 5, 29, 8, 24),
        sh("lq>lk", 1, 2, 31, 7, 12, 5),        sh("L=1", 1, 1, 1, 1, 1, 1),
        sh("Lq=1 decode", 3, 2, 1, 33, 16, 16), sh("Lk=1", 2, 1, 19, 1, 7, 3),
        sh("D=1", 2, 2, 9, 11, 1, 1),           sh("odd", 1, 3, 63, 61, 31, 17),
        sh("long", 1, 1, 64, 64, 32, 32),
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
        run_both(&cases[c], &p, 100 + c, NULL);

    /* Every layout for each operand, the packed [B,L,H,D] one included. */
    for (int lq = 0; lq < GU_LAYOUTS; lq++)
        for (int lk = 0; lk < GU_LAYOUTS; lk++) {
            shape s = sh("layouts", 2, 3, 13, 21, 8, 6);
            s.lay_q = lq, s.lay_k = lk, s.lay_v = (lq + lk) % GU_LAYOUTS;
            s.lay_o = (lq + 2 * lk) % GU_LAYOUTS;
            run_both(&s, &p, 200 + (uint64_t)(lq * 8 + lk), NULL);
        }
}

static void test_scale(void) {
    const float scales[] = {0.37f, 1.0f, -0.5f, 3.0f, 1e-3f};
    for (size_t i = 0; i < sizeof scales / sizeof scales[0]; i++) {
        attn_sdpa_params p = {0};
        p.use_scale = 1, p.scale = scales[i];
        shape s = sh("custom scale", 2, 2, 11, 14, 10, 9);
        run_both(&s, &p, 300 + i, NULL);
    }
}

static void test_causal(void) {
    attn_sdpa_params p = {0};
    p.causal = 1;
    shape s1 = sh("causal square", 2, 2, 23, 23, 8, 8);
    shape s2 = sh("causal lq<lk (kv cache)", 2, 2, 7, 30, 8, 8);
    shape s3 = sh("causal lq>lk (empty rows)", 2, 2, 30, 7, 8, 8);
    shape s4 = sh("causal decode Lq=1", 2, 3, 1, 17, 8, 8);
    run_both(&s1, &p, 401, NULL);
    run_both(&s2, &p, 402, NULL);
    run_both(&s3, &p, 403, NULL);
    run_both(&s4, &p, 404, NULL);
}

static void test_key_padding(void) {
    const int64_t lens[3] = {0, 9, 20}; /* empty, partial, full */
    attn_sdpa_params p = {0};
    p.key_lengths = lens;
    shape s = sh("key padding", 3, 2, 12, 20, 8, 8);
    run_both(&s, &p, 501, NULL);
    const int64_t lens2[3] = {1, 1, 1};
    p.key_lengths = lens2;
    shape s2 = sh("key padding len 1", 3, 2, 5, 9, 4, 4);
    run_both(&s2, &p, 502, NULL);
}

static void test_window(void) {
    /* {left, right}, ATTN_UNBOUNDED = no limit on that side. */
    const int64_t wins[][2] = {
        {2, 1}, {0, 0},  {ATTN_UNBOUNDED, 0}, {3, ATTN_UNBOUNDED}, {ATTN_UNBOUNDED, ATTN_UNBOUNDED},
        {0, 5}, {40, 40}};
    const int64_t lq[] = {16, 5, 25};
    const int64_t lk[] = {16, 21, 9};
    for (size_t w = 0; w < sizeof wins / sizeof wins[0]; w++)
        for (size_t l = 0; l < 3; l++) {
            attn_sdpa_params p = {0};
            p.use_window = 1;
            p.window_left = wins[w][0];
            p.window_right = wins[w][1];
            shape s = sh("window", 1, 2, lq[l], lk[l], 8, 8);
            run_both(&s, &p, 600 + w * 4 + l, NULL);
        }
    /* use_window == 0 disables it whatever the bounds. */
    attn_sdpa_params p = {0};
    p.window_left = 0, p.window_right = 0;
    shape s = sh("window off", 1, 2, 10, 10, 8, 8);
    run_both(&s, &p, 650, NULL);
}

/* Bool and additive masks in every broadcast shape and storage variant. */
static void test_masks(void) {
    const int64_t B = 2, H = 3, Lq = 9, Lk = 14;
    uint64_t seed = 700;
    for (int is_bool = 0; is_bool < 2; is_bool++)
        for (int variant = 0; variant < MV_COUNT; variant++)
            for (int bc = 0; bc < 4; bc++) {
                const int64_t mB = (bc & 1) ? 1 : B, mH = (bc & 2) ? 1 : H;
                tu_rng r = tu_seed(++seed);
                mask_buf mb = make_mask(is_bool, variant, B, H, mB, mH, Lq, Lk, &r, 0.3);
                attn_sdpa_params p = {0};
                if (is_bool)
                    p.bool_mask = &mb.m;
                else
                    p.add_mask = &mb.m;
                shape s = sh(is_bool ? "bool mask" : "add mask", B, H, Lq, Lk, 8, 8);
                run_both(&s, &p, seed, NULL);
                free(mb.buf);
            }
}

/* Rows that see no key, by each mechanism; output 0, weights 0, lse -inf. */
static void test_empty_rows(void) {
    const int64_t B = 2, H = 2, Lq = 6, Lk = 8;
    tu_rng r = tu_seed(801);
    shape s = sh("empty rows", B, H, Lq, Lk, 8, 8);

    /* Bool mask with all-zero rows 0 and 3 (per batch/head everywhere). */
    mask_buf mb = make_mask(1, MV_CONTIG, B, H, B, H, Lq, Lk, &r, 0.2);
    uint8_t *bm = mb.buf;
    for (int64_t bh = 0; bh < B * H; bh++)
        for (int64_t j = 0; j < Lk; j++)
            bm[(bh * Lq + 0) * Lk + j] = bm[(bh * Lq + 3) * Lk + j] = 0;
    attn_sdpa_params p = {0};
    p.bool_mask = &mb.m;
    run_both(&s, &p, 802, NULL);

    /* Additive mask: a full row of -inf, and a row with a single finite key. */
    mask_buf ma = make_mask(0, MV_CONTIG, B, H, 1, 1, Lq, Lk, &r, 0.0);
    float *am = ma.buf;
    for (int64_t j = 0; j < Lk; j++) {
        am[1 * Lk + j] = -INFINITY;
        am[4 * Lk + j] = j == 5 ? 0.5f : -INFINITY;
    }
    attn_sdpa_params pa = {0};
    pa.add_mask = &ma.m;
    run_both(&s, &pa, 803, NULL);

    /* Both masks together, plus causal and key padding (batch 1 empty). */
    const int64_t lens[2] = {5, 0};
    pa.bool_mask = &mb.m;
    pa.causal = 1;
    pa.key_lengths = lens;
    run_both(&s, &pa, 804, NULL);

    /* Window that ends before the first valid key: i' - left > len. */
    attn_sdpa_params pw = {0};
    const int64_t lens2[2] = {2, 8};
    pw.use_window = 1, pw.window_left = 1, pw.window_right = 0;
    pw.key_lengths = lens2;
    run_both(&s, &pw, 805, NULL);
    free(mb.buf);
    free(ma.buf);
}

/* Logits of +-1e4: integer q in +-[500, 2500], k in {1, 2} and the default
 * scale 1/sqrt(4) = 0.5 make every score an exact fp32 integer, so only the softmax's stability is
 * measured (a naive exp overflows to inf, or underflows to an empty row). */
static void prep_large(gu_view *q, gu_view *k, gu_view *v, tu_rng *r) {
    (void)v;
    const attn_tensor *tq = &q->t, *tk = &k->t;
    for (int64_t b = 0; b < tq->dim[0]; b++)
        for (int64_t h = 0; h < tq->dim[1]; h++) {
            for (int64_t l = 0; l < tq->dim[2]; l++)
                for (int64_t d = 0; d < 4; d++) {
                    /* Odd rows all negative: every score near -1e4. */
                    float mag = (float)tu_int(r, 500, 2500);
                    q->buf[tu_off(tq, b, h, l, d)] = (l & 1) ? -mag : mag;
                }
            for (int64_t l = 0; l < tk->dim[2]; l++)
                for (int64_t d = 0; d < 4; d++)
                    k->buf[tu_off(tk, b, h, l, d)] = (float)(1 + tu_int(r, 0, 1));
        }
}

/* Keys that take part in no row may hold garbage: NaN in K and V beyond
 * key_lengths, and in key 2, which the bool mask removes from every row. */
static const int64_t nan_lens[2] = {4, 7};
static void prep_nan_keys(gu_view *q, gu_view *k, gu_view *v, tu_rng *r) {
    (void)q, (void)r;
    for (int64_t b = 0; b < k->t.dim[0]; b++)
        for (int64_t h = 0; h < k->t.dim[1]; h++)
            for (int64_t j = 0; j < k->t.dim[2]; j++) {
                if (j < nan_lens[b] && j != 2) continue;
                for (int64_t d = 0; d < k->t.dim[3]; d++) k->buf[tu_off(&k->t, b, h, j, d)] = NAN;
                for (int64_t d = 0; d < v->t.dim[3]; d++) v->buf[tu_off(&v->t, b, h, j, d)] = NAN;
            }
}

static void test_garbage_in_removed_keys(void) {
    const int64_t Lq = 5, Lk = 9;
    uint8_t bm[5 * 9];
    for (int64_t i = 0; i < Lq * Lk; i++) bm[i] = i % Lk != 2;
    attn_mask m = {bm, {1, 1, Lq, Lk}, {0, 0, Lk, 1}};
    attn_sdpa_params p = {0};
    p.key_lengths = nan_lens;
    p.bool_mask = &m;
    shape s = sh("NaN in removed keys", 2, 2, Lq, Lk, 6, 5);
    run_both(&s, &p, 1201, prep_nan_keys);
    p.causal = 1;
    run_both(&s, &p, 1202, prep_nan_keys);
}

static void test_large_logits(void) {
    attn_sdpa_params p = {0};
    shape s = sh("logits +-1e4", 2, 2, 10, 12, 4, 8);
    run_both(&s, &p, 901, prep_large);
    p.causal = 1;
    run_both(&s, &p, 902, prep_large);
    /* Same with an additive mask: -inf entries and small offsets. */
    tu_rng r = tu_seed(903);
    mask_buf ma = make_mask(0, MV_CONTIG, 2, 2, 1, 2, 10, 12, &r, 0.3);
    float *am = ma.buf;
    for (int i = 0; i < 2 * 10 * 12; i++) /* quarters: score + mask stays exact */
        am[i] = roundf(am[i] * 4.0f) / 4.0f;
    p.add_mask = &ma.m;
    run_both(&s, &p, 904, prep_large);
    free(ma.buf);
}

/* NaN in one element of one query row: that row's output, weights and lse
 * are NaN (the oracle says so), every other row is exact. */
static void prep_nan(gu_view *q, gu_view *k, gu_view *v, tu_rng *r) {
    (void)k, (void)v, (void)r;
    q->buf[tu_off(&q->t, 1, 0, 3, 2)] = NAN;
}

static void test_nan_row(void) {
    attn_sdpa_params p = {0};
    shape s = sh("NaN query row", 2, 2, 7, 9, 5, 6);
    run_both(&s, &p, 1001, prep_nan);
    p.causal = 1;
    run_both(&s, &p, 1002, prep_nan);
}

/* Random shapes, layouts and mask combinations. */
static void test_random(void) {
    tu_rng r = tu_seed(0xC0FFEE);
    for (int it = 0; it < 60; it++) {
        shape s = sh("random", tu_int(&r, 1, 3), tu_int(&r, 1, 3), tu_int(&r, 1, 40),
                     tu_int(&r, 1, 40), tu_int(&r, 1, 32), tu_int(&r, 1, 32));
        s.lay_q = (int)tu_int(&r, 0, GU_LAYOUTS - 1);
        s.lay_k = (int)tu_int(&r, 0, GU_LAYOUTS - 1);
        s.lay_v = (int)tu_int(&r, 0, GU_LAYOUTS - 1);
        s.lay_o = (int)tu_int(&r, 0, GU_LAYOUTS - 1);
        attn_sdpa_params p = {0};
        int64_t lens[3];
        mask_buf mb = {{0}, NULL}, ma = {{0}, NULL};
        p.causal = tu_unif(&r) < 0.4;
        if (tu_unif(&r) < 0.4) {
            for (int b = 0; b < s.B; b++) lens[b] = tu_int(&r, 0, s.Lk);
            p.key_lengths = lens;
        }
        if (tu_unif(&r) < 0.4) {
            p.use_window = 1;
            p.window_left = tu_int(&r, -1, 6);
            p.window_right = tu_int(&r, -1, 6);
        }
        if (tu_unif(&r) < 0.4) {
            mb = make_mask(1, (int)tu_int(&r, 0, MV_COUNT - 1), s.B, s.H,
                           tu_unif(&r) < 0.5 ? 1 : s.B, tu_unif(&r) < 0.5 ? 1 : s.H, s.Lq, s.Lk, &r,
                           0.2);
            p.bool_mask = &mb.m;
        }
        if (tu_unif(&r) < 0.4) {
            ma = make_mask(0, (int)tu_int(&r, 0, MV_COUNT - 1), s.B, s.H,
                           tu_unif(&r) < 0.5 ? 1 : s.B, tu_unif(&r) < 0.5 ? 1 : s.H, s.Lq, s.Lk, &r,
                           0.1);
            p.add_mask = &ma.m;
        }
        if (tu_unif(&r) < 0.2) p.use_scale = 1, p.scale = (float)(tu_unif(&r) * 0.8 + 0.05);
        run_both(&s, &p, 2000 + (uint64_t)it, NULL);
        free(mb.buf);
        free(ma.buf);
    }
}

/* Dropout is inactive unless training: p = 0.5 without training is exact. */
static void test_dropout_inactive(void) {
    attn_sdpa_params p = {0};
    p.dropout_p = 0.5f;
    p.seed = 42;
    shape s = sh("dropout_p without training", 2, 2, 8, 8, 8, 8);
    run_both(&s, &p, 1101, NULL);
}

int main(void) {
    test_shapes();
    test_scale();
    test_causal();
    test_key_padding();
    test_window();
    test_masks();
    test_empty_rows();
    test_large_logits();
    test_nan_row();
    test_dropout_inactive();
    test_garbage_in_removed_keys();
    test_random();
    printf("test_sdpa_reference: %d forward calls; max error vs fp64 oracle: "
           "out %.3g (rel. to max|V|), weights %.3g, lse %.3g (rel. to max(1,|lse|))\n",
           g_cases, g_err_out, g_err_w, g_err_lse);
    return tu_report("test_sdpa_reference");
}
