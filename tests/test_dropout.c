/* Dropout on the attention weights (attn_sdpa_params.dropout_p, training,
 * seed, offset), REFERENCE and AUTO paths:
 *  - determinism: same (seed, offset) -> bitwise identical out and
 *    gradients; another seed or offset -> another mask, disagreeing on a
 *    2p(1-p) fraction of elements as independent masks would (also for
 *    pairs with equal seed + offset·golden-ratio constant);
 *  - 1, 2 and 3 threads give bitwise identical out, weights, lse and
 *    gradients (SDPA and the MHA layer);
 *  - keep rate over 524288 elements (B=4, H=8, Lq=512, Lk=32) within 4 sigma of 1 - p for p = 0.1,
 *    0.5, 0.9, also per Philox output word and for pairs of keys;
 *  - unbiased: over N seeds the mean output and mean gradients match the
 *    no-dropout ones within statistical error;
 *  - no-ops: p = 0 with training = 1 and training = 0 with p > 0 are bitwise
 *    the no-dropout call; with dropout, weights and lse are bitwise the
 *    pre-dropout ones; invalid dropout_p is ATTN_ERR_ARG with a message;
 *  - the keep decision of (b, h, i, j) does not depend on Dv, Lk, Lq, B, H
 *    of the call or on the path (tiling), where the same indices exist;
 *  - the documented generator: Philox-4x32-10 (checked against the
 *    Random123 known-answer vectors), counter (j/4, i, h, b), word j%4,
 *    drop iff word < p·2^32; with dropout_row0 the batch word is row0 + b. The key derivation from (seed, offset) is not
 *    in the header; the replica below mirrors src/dropout.c and pins it;
 *  - attn_dropout_mask (a caller's own dropout) gives those words' factors
 *    and attention's own on the same (b, h, i, j), for any thread count.
 * Masks are read through the public API with the identity trick
 * (grad_util.h): forward with V = I gives out = P ∘ mult. */
#include "grad_util.h"

static const attn_impl kImpls[2] = {ATTN_IMPL_REFERENCE, ATTN_IMPL_AUTO};
static const char *iname(attn_impl i) { return i == ATTN_IMPL_REFERENCE ? "REFERENCE" : "AUTO"; }

/* ------------------------------------------------------------ one SDPA run */

typedef struct {
    int64_t B, H, Lq, Lk, Dk, Dv;
    float *q, *k, *v, *go;
    float *out, *w, *lse, *dq, *dk, *dv;
} sdpa_run;

static sdpa_run sr_make(int64_t B, int64_t H, int64_t Lq, int64_t Lk, int64_t Dk, int64_t Dv,
                        uint64_t seed) {
    sdpa_run s = {B, H, Lq, Lk, Dk, Dv, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
    const size_t nq = (size_t)(B * H * Lq * Dk), nk = (size_t)(B * H * Lk * Dk),
                 nv = (size_t)(B * H * Lk * Dv), no = (size_t)(B * H * Lq * Dv);
    tu_rng r = tu_seed(seed);
    s.q = tu_malloc(nq * sizeof(float)), s.k = tu_malloc(nk * sizeof(float));
    s.v = tu_malloc(nv * sizeof(float)), s.go = tu_malloc(no * sizeof(float));
    tu_fill(&r, s.q, nq, -1, 1), tu_fill(&r, s.k, nk, -1, 1);
    tu_fill(&r, s.v, nv, -1, 1), tu_fill(&r, s.go, no, -1, 1);
    s.out = tu_malloc(no * sizeof(float));
    s.w = tu_malloc((size_t)(B * H * Lq * Lk) * sizeof(float));
    s.lse = tu_malloc((size_t)(B * H * Lq) * sizeof(float));
    s.dq = tu_malloc(nq * sizeof(float)), s.dk = tu_malloc(nk * sizeof(float));
    s.dv = tu_malloc(nv * sizeof(float));
    return s;
}

static void sr_free(sdpa_run *s) {
    free(s->q), free(s->k), free(s->v), free(s->go), free(s->out), free(s->w), free(s->lse);
    free(s->dq), free(s->dk), free(s->dv);
}

/* Forward (with weights and lse) and backward. */
static attn_status sr_call(sdpa_run *s, const attn_sdpa_params *p, const char *what) {
    attn_tensor tq = attn_tensor_bhld(s->q, s->B, s->H, s->Lq, s->Dk),
                tk = attn_tensor_bhld(s->k, s->B, s->H, s->Lk, s->Dk),
                tv = attn_tensor_bhld(s->v, s->B, s->H, s->Lk, s->Dv),
                to = attn_tensor_bhld(s->out, s->B, s->H, s->Lq, s->Dv),
                tg = attn_tensor_bhld(s->go, s->B, s->H, s->Lq, s->Dv),
                tdq = attn_tensor_bhld(s->dq, s->B, s->H, s->Lq, s->Dk),
                tdk = attn_tensor_bhld(s->dk, s->B, s->H, s->Lk, s->Dk),
                tdv = attn_tensor_bhld(s->dv, s->B, s->H, s->Lk, s->Dv);
    attn_error err;
    attn_status st = attn_sdpa_forward(&tq, &tk, &tv, p, &to, s->w, s->lse, NULL, &err);
    CHECK(st == ATTN_OK, "%s: forward: %s", what, err.message);
    if (st) return st;
    st = attn_sdpa_backward(&tq, &tk, &tv, &to, s->lse, &tg, p, &tdq, &tdk, &tdv, NULL, &err);
    CHECK(st == ATTN_OK, "%s: backward: %s", what, err.message);
    return st;
}

static size_t sr_nout(const sdpa_run *s) { return (size_t)(s->B * s->H * s->Lq * s->Dv); }

/* Bitwise comparison of every result of two runs of the same shape. */
static int sr_same(const sdpa_run *a, const sdpa_run *b) {
    const size_t nq = (size_t)(a->B * a->H * a->Lq * a->Dk),
                 nk = (size_t)(a->B * a->H * a->Lk * a->Dk),
                 nv = (size_t)(a->B * a->H * a->Lk * a->Dv),
                 nw = (size_t)(a->B * a->H * a->Lq * a->Lk), nl = (size_t)(a->B * a->H * a->Lq);
    return !memcmp(a->out, b->out, sr_nout(a) * sizeof(float)) &&
           !memcmp(a->w, b->w, nw * sizeof(float)) && !memcmp(a->lse, b->lse, nl * sizeof(float)) &&
           !memcmp(a->dq, b->dq, nq * sizeof(float)) && !memcmp(a->dk, b->dk, nk * sizeof(float)) &&
           !memcmp(a->dv, b->dv, nv * sizeof(float));
}

static void sr_copy_results(sdpa_run *dst, const sdpa_run *src) {
    const size_t nq = (size_t)(src->B * src->H * src->Lq * src->Dk),
                 nk = (size_t)(src->B * src->H * src->Lk * src->Dk),
                 nv = (size_t)(src->B * src->H * src->Lk * src->Dv),
                 nw = (size_t)(src->B * src->H * src->Lq * src->Lk),
                 nl = (size_t)(src->B * src->H * src->Lq);
    memcpy(dst->out, src->out, sr_nout(src) * sizeof(float));
    memcpy(dst->w, src->w, nw * sizeof(float));
    memcpy(dst->lse, src->lse, nl * sizeof(float));
    memcpy(dst->dq, src->dq, nq * sizeof(float));
    memcpy(dst->dk, src->dk, nk * sizeof(float));
    memcpy(dst->dv, src->dv, nv * sizeof(float));
}

/* ------------------------------------------------------------ determinism */

static void test_determinism(void) {
    enum { B = 2, H = 3, LQ = 19, LK = 27, DK = 8, DV = 6 };
    const int64_t lens[B] = {LK, 13};
    for (int ii = 0; ii < 2; ii++) {
        attn_sdpa_params p = {0};
        p.impl = kImpls[ii];
        p.training = 1;
        p.dropout_p = 0.3f;
        p.seed = 2024;
        p.offset = 11;
        p.causal = 1;
        p.key_lengths = lens;
        sdpa_run a = sr_make(B, H, LQ, LK, DK, DV, 1), b = sr_make(B, H, LQ, LK, DK, DV, 1);
        sr_call(&a, &p, "determinism a");
        sr_call(&b, &p, "determinism b");
        CHECK(sr_same(&a, &b), "%s: same seed/offset, results differ", iname(p.impl));
        p.seed = 2025;
        sr_call(&b, &p, "other seed");
        CHECK(memcmp(a.out, b.out, sr_nout(&a) * sizeof(float)) != 0 &&
                  memcmp(a.dq, b.dq, (size_t)(B * H * LQ * DK) * sizeof(float)) != 0,
              "%s: another seed gives the same out/dq", iname(p.impl));
        p.seed = 2024;
        p.offset = 12;
        sr_call(&b, &p, "other offset");
        CHECK(memcmp(a.out, b.out, sr_nout(&a) * sizeof(float)) != 0 &&
                  memcmp(a.dq, b.dq, (size_t)(B * H * LQ * DK) * sizeof(float)) != 0,
              "%s: another offset gives the same out/dq", iname(p.impl));
        sr_free(&a), sr_free(&b);
    }

    /* Masks of (s, o), (s+1, o), (s, o+1): pairwise they disagree on a
     * fraction 2p(1-p) of the elements, as independent masks would. So must
     * pairs whose seed + offset·G agree (G = 0x9E3779B97F4A7C15, the golden
     * ratio constant): per-layer seeds k·G with offset = step are a common
     * pattern, and (G, 0) must not replay (0, 1). */
    enum { MB = 2, MH = 4, ML = 64, NM = 7 };
    const size_t n = (size_t)(MB * MH * ML * ML);
    const double pd = 0.3;
    double *m[NM];
    const uint64_t G = 0x9E3779B97F4A7C15ull;
    const uint64_t so[NM][2] = {{7, 100}, {8, 100}, {7, 101}, {G, 0}, {0, 1}, {3 * G, 5}, {0, 8}};
    for (int t = 0; t < NM; t++) {
        attn_sdpa_params p = {0};
        p.training = 1;
        p.dropout_p = (float)pd;
        p.seed = so[t][0];
        p.offset = so[t][1];
        m[t] = tu_malloc(n * sizeof(double));
        CHECK(gu_dropout_mult(MB, MH, ML, ML, &p, m[t], NULL) == 0, "mask read-back %d", t);
    }
    const double want = 2.0 * pd * (1.0 - pd), sd = sqrt(want * (1.0 - want) / (double)n);
    const int pairs[5][2] = {{0, 1}, {0, 2}, {1, 2}, {3, 4}, {5, 6}};
    for (int t = 0; t < 5; t++) {
        size_t diff = 0;
        for (size_t x = 0; x < n; x++)
            diff += (m[pairs[t][0]][x] == 0.0) != (m[pairs[t][1]][x] == 0.0);
        const double z = ((double)diff / (double)n - want) / sd;
        const uint64_t *a = so[pairs[t][0]], *b = so[pairs[t][1]];
        printf("  masks (seed %#llx, offset %llu) vs (%#llx, %llu): disagree %.4f (independent: "
               "%.4f), "
               "z = %+.2f\n",
               (unsigned long long)a[0], (unsigned long long)a[1], (unsigned long long)b[0],
               (unsigned long long)b[1], (double)diff / (double)n, want, z);
        CHECK(fabs(z) <= 4.0,
              "masks of (seed %#llx, offset %llu) and (%#llx, %llu) disagree on %.4f of elements, "
              "want %.4f (z %.2f)",
              (unsigned long long)a[0], (unsigned long long)a[1], (unsigned long long)b[0],
              (unsigned long long)b[1], (double)diff / (double)n, want, z);
    }
    for (int t = 0; t < NM; t++) free(m[t]);
}

/* ------------------------------------------------------------ threads */

typedef struct {
    float *out, *w, *dx, *dk, *dv, *g;
} mha_res;

static void test_threads(void) {
    enum { B = 2, H = 3, LQ = 21, LK = 33, DK = 16, DV = 8 };
    const int64_t lens[B] = {LK, 17};
    for (int ii = 0; ii < 2; ii++) {
        attn_sdpa_params p = {0};
        p.impl = kImpls[ii];
        p.training = 1;
        p.dropout_p = 0.4f;
        p.seed = 77;
        p.offset = 5;
        p.causal = 1;
        p.key_lengths = lens;
        sdpa_run ref = sr_make(B, H, LQ, LK, DK, DV, 3);
        for (int t = 1; t <= 3; t++) {
            sdpa_run s = sr_make(B, H, LQ, LK, DK, DV, 3);
            attn_set_num_threads(t, NULL);
            sr_call(&s, &p, "threads");
            if (t == 1)
                sr_copy_results(&ref, &s);
            else
                CHECK(sr_same(&s, &ref), "%s: SDPA with dropout, %d threads differ from 1",
                      iname(p.impl), t);
            sr_free(&s);
        }
        sr_free(&ref);

        /* MHA: cross-attention, bias, per-head weights, all gradients. */
        enum { E = 12, NH = 3, KD = 10, VD = 7 };
        attn_mha_config c = {E, NH, KD, VD, 1, 0};
        size_t np, nc;
        attn_mha_param_count(&c, &np, NULL);
        attn_mha_cache_size(&c, B, LQ, LK, &nc, NULL);
        float *wb = tu_malloc(np * sizeof(float));
        tu_rng r = tu_seed(9);
        tu_fill(&r, wb, np, -0.4f, 0.4f);
        const size_t nq = (size_t)(B * LQ * E), nk = (size_t)(B * LK * KD),
                     nv = (size_t)(B * LK * VD), nw = (size_t)(B * NH * LQ * LK);
        float *xq = tu_malloc(nq * sizeof(float)), *xk = tu_malloc(nk * sizeof(float)),
              *xv = tu_malloc(nv * sizeof(float)), *G = tu_malloc(nq * sizeof(float)),
              *cache = tu_malloc(nc * sizeof(float));
        tu_fill(&r, xq, nq, -1, 1), tu_fill(&r, xk, nk, -1, 1), tu_fill(&r, xv, nv, -1, 1);
        tu_fill(&r, G, nq, -1, 1);
        attn_mha_weights w;
        attn_mha_weights_from_buffer(&c, wb, &w, NULL);
        mha_res res[3];
        for (int t = 1; t <= 3; t++) {
            mha_res *m = &res[t - 1];
            m->out = tu_malloc(nq * sizeof(float)), m->w = tu_malloc(nw * sizeof(float));
            m->dx = calloc(nq, sizeof(float)), m->dk = calloc(nk, sizeof(float));
            m->dv = calloc(nv, sizeof(float)), m->g = calloc(np, sizeof(float));
            attn_mha_weights g;
            attn_mha_weights_from_buffer(&c, m->g, &g, NULL);
            attn_set_num_threads(t, NULL);
            attn_error err;
            attn_status s1 = attn_mha_forward(&c, &w, B, LQ, LK, xq, xk, xv, &p, m->out,
                                              ATTN_WEIGHTS_PER_HEAD, m->w, cache, &err);
            attn_status s2 = attn_mha_backward(&c, &w, B, LQ, LK, xq, xk, xv, &p, cache, G, m->dx,
                                               m->dk, m->dv, &g, &err);
            CHECK(s1 == ATTN_OK && s2 == ATTN_OK, "mha %d threads: %s", t, err.message);
        }
        for (int t = 2; t <= 3; t++) {
            const mha_res *a = &res[0], *b = &res[t - 1];
            CHECK(!memcmp(a->out, b->out, nq * sizeof(float)) &&
                      !memcmp(a->w, b->w, nw * sizeof(float)) &&
                      !memcmp(a->dx, b->dx, nq * sizeof(float)) &&
                      !memcmp(a->dk, b->dk, nk * sizeof(float)) &&
                      !memcmp(a->dv, b->dv, nv * sizeof(float)) &&
                      !memcmp(a->g, b->g, np * sizeof(float)),
                  "%s: MHA with dropout, %d threads differ from 1", iname(p.impl), t);
        }
        for (int t = 0; t < 3; t++)
            free(res[t].out), free(res[t].w), free(res[t].dx), free(res[t].dk), free(res[t].dv),
                free(res[t].g);
        free(wb), free(xq), free(xk), free(xv), free(G), free(cache);
    }
    attn_set_num_threads(2, NULL);
}

/* ------------------------------------------------------------ keep rate */

/* Keep rate of a Bernoulli(1 - p) mask of n elements: z = (k/n - (1-p)) /
 * sqrt(p(1-p)/n). Also per Philox word (j % 4) and for key pairs inside a
 * block (j, j+1 with j % 4 == 0) and across blocks (j % 4 == 3), whose
 * both-kept rate must be (1-p)². */
static double zscore(size_t hits, size_t n, double prob) {
    return ((double)hits / (double)n - prob) / sqrt(prob * (1.0 - prob) / (double)n);
}

static void test_keep_rate(void) {
    /* n = B·H·Lq·Lk = 524288; reading the mask costs n·Lk, so Lk is short. */
    enum { B = 4, H = 8, LQ = 512, L = 32 };
    const size_t n = (size_t)B * H * LQ * L;
    const float ps[3] = {0.1f, 0.5f, 0.9f};
    double *m = tu_malloc(n * sizeof(double));
    for (int t = 0; t < 3; t++) {
        attn_sdpa_params p = {0};
        p.training = 1;
        p.dropout_p = ps[t];
        p.seed = 31337 + (uint64_t)t;
        p.offset = 0;
        p.impl = ATTN_IMPL_AUTO;
        CHECK(gu_dropout_mult(B, H, LQ, L, &p, m, NULL) == 0, "keep-rate mask read-back p=%g",
              (double)ps[t]);
        const double keep = 1.0 - (double)ps[t];
        size_t kept = 0, word[4] = {0, 0, 0, 0}, in_pair = 0, across = 0, n_in = 0, n_across = 0;
        for (size_t x = 0; x < n; x++) {
            const int k = m[x] != 0.0;
            const size_t j = x % L;
            kept += (size_t)k;
            word[j % 4] += (size_t)k;
            if (j + 1 < L) {
                const int k2 = m[x + 1] != 0.0;
                if (j % 4 == 0)
                    in_pair += (size_t)(k && k2), n_in++;
                else if (j % 4 == 3)
                    across += (size_t)(k && k2), n_across++;
            }
        }
        const double z = zscore(kept, n, keep);
        double zw = 0.0;
        for (int w = 0; w < 4; w++)
            if (fabs(zscore(word[w], n / 4, keep)) > fabs(zw)) zw = zscore(word[w], n / 4, keep);
        const double zin = zscore(in_pair, n_in, keep * keep),
                     zac = zscore(across, n_across, keep * keep);
        printf("  p=%.1f: keep rate %.5f over %zu (want %.5f) z = %+.2f; worst word z = %+.2f; "
               "pair-in-block z = %+.2f, pair-across z = %+.2f\n",
               (double)ps[t], (double)kept / (double)n, n, keep, z, zw, zin, zac);
        CHECK(fabs(z) <= 4.0, "p=%g: keep rate %.5f, z = %.2f", (double)ps[t],
              (double)kept / (double)n, z);
        CHECK(fabs(zw) <= 4.0, "p=%g: a Philox word's keep rate is off, z = %.2f", (double)ps[t],
              zw);
        CHECK(fabs(zin) <= 4.0 && fabs(zac) <= 4.0, "p=%g: key pairs correlated: z %.2f / %.2f",
              (double)ps[t], zin, zac);
    }
    free(m);
}

/* ------------------------------------------------------------ expectation */

/* E[mult] = 1, and out, dq, dk, dv are linear in the multipliers, so their
 * mean over seeds is the no-dropout value. Per element e over N seeds:
 * z_e = (mean_e - ref_e) / (sd_e / sqrt(N)). Bounds: max |z_e| <= 5 (the
 * chance that any of the ~800 elements passes 5 sigma is ~5e-4 for a
 * correct generator); for out, whose elements (Dv = 1, one per row) are
 * independent, also the aggregate Σ z_e² ~ chi²(n) <= n + 4 sqrt(2n). An
 * element with sd_e = 0 (no randomness reaches it) must equal ref. */
static void expect_stats(const char *what, const double *sum, const double *sum2, const float *ref,
                         size_t n, int N, int chi2) {
    double zmax = 0.0, chi = 0.0;
    size_t dof = 0, fixed_bad = 0;
    for (size_t e = 0; e < n; e++) {
        const double mean = sum[e] / N;
        const double var = (sum2[e] - N * mean * mean) / (N - 1);
        const double se = sqrt(var > 0 ? var : 0) / sqrt((double)N);
        if (se <= 1e-7 * (1.0 + fabs(mean))) {
            fixed_bad += fabs(mean - (double)ref[e]) > 1e-5 * (1.0 + fabs((double)ref[e]));
            continue;
        }
        const double z = (mean - (double)ref[e]) / se;
        chi += z * z;
        dof++;
        if (fabs(z) > zmax) zmax = fabs(z);
    }
    printf("  E[%s] over %d seeds: %zu random elements, max|z| %.2f", what, N, dof, zmax);
    if (chi2)
        printf(", chi2 %.1f (dof %zu, bound %.1f)", chi, dof,
               (double)dof + 4.0 * sqrt(2.0 * (double)dof));
    printf("\n");
    CHECK(dof > n / 2, "%s: only %zu of %zu elements vary with the seed", what, dof, n);
    CHECK(zmax <= 5.0, "%s: mean over seeds off the no-dropout value, max|z| = %.2f", what, zmax);
    CHECK(fixed_bad == 0, "%s: %zu seed-independent elements differ from no-dropout", what,
          fixed_bad);
    if (chi2)
        CHECK(chi <= (double)dof + 4.0 * sqrt(2.0 * (double)dof), "%s: chi2 %.1f for %zu dof", what,
              chi, dof);
}

static void test_expectation(void) {
    enum { B = 1, H = 2, LQ = 16, LK = 24, DK = 8, DV = 1, N = 400 };
    for (int ii = 0; ii < 2; ii++) {
        attn_sdpa_params p = {0};
        p.impl = kImpls[ii];
        p.num_threads = 1; /* 4N tiny calls: no fork/join per call */
        sdpa_run ref = sr_make(B, H, LQ, LK, DK, DV, 5), s = sr_make(B, H, LQ, LK, DK, DV, 5);
        sr_call(&ref, &p, "expectation ref");
        p.training = 1;
        p.dropout_p = 0.5f;
        const size_t no = sr_nout(&ref), nq = (size_t)(B * H * LQ * DK),
                     nk = (size_t)(B * H * LK * DK), nv = (size_t)(B * H * LK * DV);
        const size_t n = no + nq + nk + nv;
        double *sum = calloc(n, sizeof(double)), *sum2 = calloc(n, sizeof(double));
        for (int t = 0; t < N; t++) {
            p.seed = 1000 + (uint64_t)t;
            p.offset = (uint64_t)t * 3;
            sr_call(&s, &p, "expectation");
            const float *parts[4] = {s.out, s.dq, s.dk, s.dv};
            const size_t cnt[4] = {no, nq, nk, nv};
            size_t o = 0;
            for (int q = 0; q < 4; q++)
                for (size_t e = 0; e < cnt[q]; e++, o++) {
                    sum[o] += parts[q][e];
                    sum2[o] += (double)parts[q][e] * parts[q][e];
                }
        }
        printf("  [%s]\n", iname(p.impl));
        expect_stats("out", sum, sum2, ref.out, no, N, 1);
        expect_stats("dq", sum + no, sum2 + no, ref.dq, nq, N, 0);
        expect_stats("dk", sum + no + nq, sum2 + no + nq, ref.dk, nk, N, 0);
        expect_stats("dv", sum + no + nq + nk, sum2 + no + nq + nk, ref.dv, nv, N, 0);
        free(sum), free(sum2);
        sr_free(&ref), sr_free(&s);
    }
}

/* ------------------------------------------------------------ no-ops */

static void test_noop(void) {
    enum { B = 2, H = 2, LQ = 9, LK = 14, DK = 8, DV = 5 };
    const int64_t lens[B] = {14, 6};
    for (int ii = 0; ii < 2; ii++) {
        attn_sdpa_params p = {0};
        p.impl = kImpls[ii];
        p.causal = 1;
        p.key_lengths = lens;
        sdpa_run ref = sr_make(B, H, LQ, LK, DK, DV, 8), s = sr_make(B, H, LQ, LK, DK, DV, 8);
        sr_call(&ref, &p, "noop ref");
        attn_sdpa_params a = p;
        a.training = 1;
        a.dropout_p = 0.0f;
        a.seed = 99;
        sr_call(&s, &a, "p=0 training");
        CHECK(sr_same(&s, &ref), "%s: p = 0 with training = 1 is not bitwise the no-dropout call",
              iname(p.impl));
        a.dropout_p = -0.0f;
        sr_call(&s, &a, "p=-0 training");
        CHECK(sr_same(&s, &ref), "%s: p = -0 with training = 1 is not a no-op", iname(p.impl));
        /* Training with p > 0: weights and lse are those before dropout,
         * bitwise the no-dropout ones; out differs. */
        a.dropout_p = 0.5f;
        sr_call(&s, &a, "p=0.5 training");
        CHECK(!memcmp(s.w, ref.w, (size_t)(B * H * LQ * LK) * sizeof(float)) &&
                  !memcmp(s.lse, ref.lse, (size_t)(B * H * LQ) * sizeof(float)) &&
                  memcmp(s.out, ref.out, sr_nout(&s) * sizeof(float)) != 0,
              "%s: with dropout, weights/lse are not the pre-dropout ones (or out is unchanged)",
              iname(p.impl));
        a.training = 0;
        sr_call(&s, &a, "eval p=0.5");
        CHECK(sr_same(&s, &ref), "%s: training = 0 with p = 0.5 is not bitwise the no-dropout call",
              iname(p.impl));
        sr_free(&ref), sr_free(&s);

        /* MHA: eval mode with p > 0 is the no-dropout layer. */
        enum { E = 8, NH = 2 };
        attn_mha_config c = {E, NH, 0, 0, 1, 0};
        size_t np, nc;
        attn_mha_param_count(&c, &np, NULL);
        attn_mha_cache_size(&c, B, LQ, LQ, &nc, NULL);
        float *wb = tu_malloc(np * sizeof(float)),
              *x = tu_malloc((size_t)(B * LQ * E) * sizeof(float));
        tu_rng r = tu_seed(12);
        tu_fill(&r, wb, np, -0.5f, 0.5f);
        tu_fill(&r, x, (size_t)(B * LQ * E), -1, 1);
        attn_mha_weights w;
        attn_mha_weights_from_buffer(&c, wb, &w, NULL);
        float *o[2], *cache = tu_malloc(nc * sizeof(float));
        attn_sdpa_params pm[2];
        memset(pm, 0, sizeof pm);
        pm[0].impl = pm[1].impl = kImpls[ii];
        pm[1].dropout_p = 0.5f;
        pm[1].seed = 3;
        for (int t = 0; t < 2; t++) {
            o[t] = tu_malloc((size_t)(B * LQ * E) * sizeof(float));
            CHECK(attn_mha_forward(&c, &w, B, LQ, LQ, x, x, x, &pm[t], o[t], ATTN_WEIGHTS_NONE,
                                   NULL, cache, NULL) == ATTN_OK,
                  "mha noop forward");
        }
        CHECK(!memcmp(o[0], o[1], (size_t)(B * LQ * E) * sizeof(float)),
              "%s: MHA eval with p = 0.5 differs from no dropout", iname(kImpls[ii]));
        free(o[0]), free(o[1]), free(cache), free(wb), free(x);
    }
}

/* ------------------------------------------------------------ invalid p */

static void test_invalid(void) {
    enum { B = 1, H = 2, L = 5, D = 4 };
    const float bad[] = {-0.1f, 1.0f, 1.5f, NAN, INFINITY, -INFINITY, -1e-30f};
    sdpa_run s = sr_make(B, H, L, L, D, D, 4);
    attn_tensor tq = attn_tensor_bhld(s.q, B, H, L, D), tk = attn_tensor_bhld(s.k, B, H, L, D),
                tv = attn_tensor_bhld(s.v, B, H, L, D), to = attn_tensor_bhld(s.out, B, H, L, D),
                tg = attn_tensor_bhld(s.go, B, H, L, D), tdq = attn_tensor_bhld(s.dq, B, H, L, D),
                tdk = attn_tensor_bhld(s.dk, B, H, L, D), tdv = attn_tensor_bhld(s.dv, B, H, L, D);
    attn_sdpa_params ok = {0};
    attn_sdpa_forward(&tq, &tk, &tv, &ok, &to, NULL, s.lse, NULL, NULL);

    enum { E = 8, NH = 2 };
    attn_mha_config c = {E, NH, 0, 0, 1, 0};
    size_t np, nc;
    attn_mha_param_count(&c, &np, NULL);
    attn_mha_cache_size(&c, B, L, L, &nc, NULL);
    float *wb = calloc(np, sizeof(float)), *gb = calloc(np, sizeof(float)),
          *x = calloc((size_t)(B * L * E), sizeof(float)),
          *y = calloc((size_t)(B * L * E), sizeof(float)), *cache = calloc(nc, sizeof(float));
    attn_mha_weights w, g;
    attn_mha_weights_from_buffer(&c, wb, &w, NULL);
    attn_mha_weights_from_buffer(&c, gb, &g, NULL);
    attn_mha_forward(&c, &w, B, L, L, x, x, x, &ok, y, ATTN_WEIGHTS_NONE, NULL, cache, NULL);

    /* each bad dropout_p, then dropout_row0 outside [0, 2^32 - B] (the
     * counter's batch word would wrap) with p 0.5 */
    const size_t nbad = sizeof bad / sizeof bad[0];
    const int64_t bad_row0[2] = {-1, ((int64_t)1 << 32) - B + 1};
    for (size_t t = 0; t < nbad + 2; t++) {
        attn_sdpa_params p = {0};
        p.training = 1;
        p.dropout_p = t < nbad ? bad[t] : 0.5f;
        p.dropout_row0 = t < nbad ? 0 : bad_row0[t - nbad];
        attn_error err;
        memset(&err, 0, sizeof err);
        CHECK_ERR(attn_sdpa_forward(&tq, &tk, &tv, &p, &to, NULL, s.lse, NULL, &err), ATTN_ERR_ARG,
                  &err);
        memset(&err, 0, sizeof err);
        CHECK_ERR(
            attn_sdpa_backward(&tq, &tk, &tv, &to, s.lse, &tg, &p, &tdq, &tdk, &tdv, NULL, &err),
            ATTN_ERR_ARG, &err);
        memset(&err, 0, sizeof err);
        CHECK_ERR(
            attn_mha_forward(&c, &w, B, L, L, x, x, x, &p, y, ATTN_WEIGHTS_NONE, NULL, cache, &err),
            ATTN_ERR_ARG, &err);
        memset(&err, 0, sizeof err);
        CHECK_ERR(attn_mha_backward(&c, &w, B, L, L, x, x, x, &p, cache, y, x, x, x, &g, &err),
                  ATTN_ERR_ARG, &err);
    }
    /* The largest float below 1 is accepted. */
    attn_sdpa_params p = {0};
    p.training = 1;
    p.dropout_p = nextafterf(1.0f, 0.0f);
    attn_error err;
    CHECK(attn_sdpa_forward(&tq, &tk, &tv, &p, &to, NULL, s.lse, NULL, &err) == ATTN_OK,
          "dropout_p = 1 - 2^-24 rejected: %s", err.message);
    sr_free(&s);
    free(wb), free(gb), free(x), free(y), free(cache);
}

/* ------------------------------------------------------------ tiling */

/* The keep decision of (b, h, i, j) is the same in any call where those
 * indices exist: another Dv (checked through the output of a Dv = 5 call,
 * rebuilt from its weights and the mask read at Dv = Lk), fewer batches or
 * heads, fewer keys (Lk not a multiple of 4), fewer queries, causal
 * masking on, and either path. Sizes cross 64-wide tiles. */
static void test_tiling(void) {
    enum { B = 2, H = 3, LQ = 70, LK = 150 };
    const size_t n = (size_t)(B * H * LQ * LK);
    attn_sdpa_params p = {0};
    p.training = 1;
    p.dropout_p = 0.35f;
    p.seed = 4242;
    p.offset = 17;
    p.impl = ATTN_IMPL_REFERENCE;
    double *full = tu_malloc(n * sizeof(double));
    CHECK(gu_dropout_mult(B, H, LQ, LK, &p, full, NULL) == 0, "tiling: full mask");

    /* Same shape, AUTO path, and causal on (compare where visible). */
    double *m = tu_malloc(n * sizeof(double));
    unsigned char *vis = tu_malloc(n);
    for (int variant = 0; variant < 2; variant++) {
        attn_sdpa_params a = p;
        a.impl = ATTN_IMPL_AUTO;
        a.causal = variant;
        CHECK(gu_dropout_mult(B, H, LQ, LK, &a, m, vis) == 0, "tiling: auto mask");
        size_t diff = 0, seen = 0;
        for (size_t x = 0; x < n; x++)
            if (vis[x]) seen++, diff += m[x] != full[x];
        CHECK(diff == 0 && seen > n / 3, "tiling: AUTO%s mask differs from REFERENCE in %zu of %zu",
              variant ? " causal" : "", diff, seen);
    }

    /* Prefix shapes: (b < B2, h < H2, i < Lq2, j < Lk2). */
    const int64_t sub[3][4] = {{1, 2, LQ, LK}, {B, H, LQ, 101}, {B, H, 33, LK}};
    for (int t = 0; t < 3; t++) {
        const int64_t B2 = sub[t][0], H2 = sub[t][1], Q2 = sub[t][2], K2 = sub[t][3];
        double *m2 = tu_malloc((size_t)(B2 * H2 * Q2 * K2) * sizeof(double));
        for (int ii = 0; ii < 2; ii++) {
            attn_sdpa_params a = p;
            a.impl = kImpls[ii];
            CHECK(gu_dropout_mult(B2, H2, Q2, K2, &a, m2, NULL) == 0, "tiling: sub mask");
            size_t diff = 0;
            for (int64_t b = 0; b < B2; b++)
                for (int64_t h = 0; h < H2; h++)
                    for (int64_t i = 0; i < Q2; i++)
                        for (int64_t j = 0; j < K2; j++)
                            diff += m2[((b * H2 + h) * Q2 + i) * K2 + j] !=
                                    full[((b * H + h) * LQ + i) * LK + j];
            CHECK(diff == 0,
                  "%s: mask of a [%lld,%lld,%lld,%lld] call differs from the full call in %zu",
                  iname(a.impl), (long long)B2, (long long)H2, (long long)Q2, (long long)K2, diff);
        }
        free(m2);
    }

    /* Dv = 5: out rebuilt in fp64 from the call's own weights and the mask
     * read at Dv = Lk. A different mask would move out by O(1). */
    enum { DK = 8, DV = 5 };
    for (int ii = 0; ii < 2; ii++) {
        attn_sdpa_params a = p;
        a.impl = kImpls[ii];
        sdpa_run s = sr_make(B, H, LQ, LK, DK, DV, 6);
        sr_call(&s, &a, "tiling Dv=5");
        double e = 0.0;
        for (int64_t bh = 0; bh < B * H; bh++)
            for (int64_t i = 0; i < LQ; i++)
                for (int64_t d = 0; d < DV; d++) {
                    double acc = 0.0;
                    for (int64_t j = 0; j < LK; j++)
                        acc += (double)s.w[(bh * LQ + i) * LK + j] * full[(bh * LQ + i) * LK + j] *
                               (double)s.v[(bh * LK + j) * DV + d];
                    e = fmax(e, fabs(acc - (double)s.out[(bh * LQ + i) * DV + d]));
                }
        CHECK(e <= 1e-5, "%s: Dv = 5 output is not P∘mask·V with the Dv = Lk mask (err %.3g)",
              iname(a.impl), e);
        printf("  tiling: Dv=5 out vs P∘mask(Dv=Lk)·V [%s]: max err %.2e\n", iname(a.impl), e);
        sr_free(&s);
    }
    free(full), free(m), free(vis);
}

/* ------------------------------------------------------------ generator */

/* Philox-4x32-10, written from Salmon et al. (SC'11) / Random123. */
static void philox(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]) {
    uint32_t c0 = ctr[0], c1 = ctr[1], c2 = ctr[2], c3 = ctr[3], k0 = key[0], k1 = key[1];
    for (int r = 0; r < 10; r++) {
        if (r) {
            k0 += 0x9E3779B9u;
            k1 += 0xBB67AE85u;
        }
        const uint64_t p0 = (uint64_t)0xD2511F53u * c0, p1 = (uint64_t)0xCD9E8D57u * c2;
        const uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0, n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1;
        c1 = (uint32_t)p1, c3 = (uint32_t)p0, c0 = n0, c2 = n2;
    }
    out[0] = c0, out[1] = c1, out[2] = c2, out[3] = c3;
}

/* Mirror of src/dropout.c's key derivation (not part of the header). */
static uint64_t splitmix_step(uint64_t z) {
    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* attn.h: key = splitmix64(splitmix64(seed) ^ offset). */
static uint64_t key_of(uint64_t seed, uint64_t offset) {
    return splitmix_step(splitmix_step(seed) ^ offset);
}

static void test_generator(void) {
    /* Random123 known-answer vectors for philox4x32_10. */
    const uint32_t kat[3][10] = {
        {0, 0, 0, 0, 0, 0, 0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u},
        {0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu, 0x408f276du,
         0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu},
        {0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u, 0xa4093822u, 0x299f31d0u, 0xd16cfe09u,
         0x94fdccebu, 0x5001e420u, 0x24126ea1u},
    };
    for (int t = 0; t < 3; t++) {
        uint32_t o[4];
        philox(kat[t], kat[t] + 4, o);
        CHECK(!memcmp(o, kat[t] + 6, sizeof o), "philox KAT %d: %08x %08x %08x %08x", t, o[0], o[1],
              o[2], o[3]);
    }
    enum { B = 2, H = 3, LQ = 9, LK = 23 };
    const float ps[3] = {0.3f, 0.77f, 0.5f};
    /* dropout_row0 0, 1 and the largest allowed (the batch word 2^32 - 1 last) */
    const int64_t row0[3] = {0, 1, ((int64_t)1 << 32) - B};
    double *m = tu_malloc((size_t)(B * H * LQ * LK) * sizeof(double));
    for (int t = 0; t < 3; t++) {
        attn_sdpa_params p = {0};
        p.training = 1;
        p.dropout_p = ps[t];
        p.seed = 0x123456789abcdefull + (uint64_t)t;
        p.offset = 1000 + (uint64_t)t;
        p.dropout_row0 = row0[t];
        for (int ii = 0; ii < 2; ii++) {
            p.impl = kImpls[ii];
            CHECK(gu_dropout_mult(B, H, LQ, LK, &p, m, NULL) == 0, "generator: mask read-back");
            const uint64_t key = key_of(p.seed, p.offset);
            const uint32_t k[2] = {(uint32_t)key, (uint32_t)(key >> 32)};
            const double t32 = ldexp((double)p.dropout_p, 32);
            const uint32_t thr = t32 >= 4294967295.0 ? UINT32_MAX : (uint32_t)t32;
            size_t diff = 0;
            for (int64_t b = 0; b < B; b++)
                for (int64_t h = 0; h < H; h++)
                    for (int64_t i = 0; i < LQ; i++)
                        for (int64_t j = 0; j < LK; j++) {
                            const uint32_t ctr[4] = {(uint32_t)(j / 4), (uint32_t)i, (uint32_t)h,
                                                     (uint32_t)(b + row0[t])};
                            uint32_t w[4];
                            philox(ctr, k, w);
                            const int keep = w[j % 4] >= thr;
                            diff += keep != (m[((b * H + h) * LQ + i) * LK + j] != 0.0);
                        }
            CHECK(diff == 0,
                  "%s p=%g row0=%lld: %zu keep decisions differ from Philox(counter "
                  "(j/4,i,h,row0+b))",
                  iname(p.impl), (double)ps[t], (long long)row0[t], diff);
        }
    }
    free(m);
}

/* attn_dropout_mask: row r is attention's weights row (b[r], h, i[r]); the
 * words are Philox's (the replica above); 1 and 3 threads alike; off: all
 * 1; bad arguments refused with C untouched. COLS 150: two whole blocks
 * of the 64 columns (16 counters) it draws at once and a partial one. */
static void test_mask_api(void) {
    enum { N = 40, COLS = 150, B = 3, H = 4, LQ = 11 };
    int64_t bi[N], ii[N];
    for (int r = 0; r < N; r++) bi[r] = (r * 7) % B, ii[r] = (r * 5 + 3) % LQ;
    attn_sdpa_params p = {0};
    p.training = 1;
    p.dropout_p = 0.35f;
    p.seed = 0xfeedbeefull;
    p.offset = 77;
    p.dropout_row0 = 9;
    float *m1 = tu_malloc(N * COLS * sizeof(float)), *m3 = tu_malloc(N * COLS * sizeof(float));
    double *att = tu_malloc((size_t)(B * H * LQ * COLS) * sizeof(double));
    attn_error e;
    p.num_threads = 1;
    CHECK(attn_dropout_mask(&p, N, COLS, bi, 2, ii, m1, &e) == ATTN_OK, "mask: %s", e.message);
    p.num_threads = 3;
    CHECK(attn_dropout_mask(&p, N, COLS, bi, 2, ii, m3, &e) == ATTN_OK, "mask: %s", e.message);
    CHECK(!memcmp(m1, m3, N * COLS * sizeof(float)), "mask: 3 threads differ from 1");
    p.num_threads = 0;
    CHECK(gu_dropout_mult(B, H, LQ, COLS, &p, att, NULL) == 0, "mask: attention read-back");
    const uint64_t key = key_of(p.seed, p.offset);
    const uint32_t k[2] = {(uint32_t)key, (uint32_t)(key >> 32)};
    const uint32_t thr = (uint32_t)ldexp((double)p.dropout_p, 32);
    const float keep = 1.0f / (1.0f - p.dropout_p);
    size_t off_philox = 0, off_attn = 0, dropped = 0;
    for (int r = 0; r < N; r++)
        for (int j = 0; j < COLS; j++) {
            const uint32_t ctr[4] = {(uint32_t)(j / 4), (uint32_t)ii[r], 2u,
                                     (uint32_t)(bi[r] + p.dropout_row0)};
            uint32_t w[4];
            philox(ctr, k, w);
            const float want = w[j % 4] < thr ? 0.0f : keep, got = m1[r * COLS + j];
            off_philox += got != want;
            off_attn += (got != 0.0f) != (att[((bi[r] * H + 2) * LQ + ii[r]) * COLS + j] != 0.0);
            dropped += got == 0.0f;
        }
    CHECK(off_philox == 0, "mask: %zu factors differ from Philox (j/4, i, h, row0 + b)",
          off_philox);
    CHECK(off_attn == 0, "mask: %zu decisions differ from attention's on the same weights",
          off_attn);
    CHECK(dropped > 0 && dropped < N * COLS, "mask: %zu of %d dropped", dropped, N * COLS);
    p.training = 0;
    CHECK(attn_dropout_mask(&p, N, COLS, bi, 2, ii, m1, &e) == ATTN_OK, "mask off: %s", e.message);
    size_t ones = 0;
    for (int x = 0; x < N * COLS; x++) ones += m1[x] == 1.0f;
    CHECK(ones == N * COLS, "mask off: %zu of %d factors are 1", ones, N * COLS);
    p.training = 1;
    const int64_t huge_b[1] = {((int64_t)1 << 32) - 9}, neg_i[1] = {-1};
    struct {
        const char *what;
        int64_t n, cols, h;
        const int64_t *b, *i;
        float pdrop;
        int threads;
        attn_status want;
    } bad[] = {
        {"b NULL", N, COLS, 0, NULL, ii, 0.35f, 0, ATTN_ERR_NULL},
        {"n 0", 0, COLS, 0, bi, ii, 0.35f, 0, ATTN_ERR_SHAPE},
        {"cols 0", N, 0, 0, bi, ii, 0.35f, 0, ATTN_ERR_SHAPE},
        {"dropout_p 1", N, COLS, 0, bi, ii, 1.0f, 0, ATTN_ERR_ARG},
        {"h -1", N, COLS, -1, bi, ii, 0.35f, 0, ATTN_ERR_ARG},
        {"b + row0 = 2^32", 1, COLS, 0, huge_b, ii, 0.35f, 0, ATTN_ERR_ARG},
        {"i -1", 1, COLS, 0, bi, neg_i, 0.35f, 0, ATTN_ERR_ARG},
        {"threads -1", N, COLS, 0, bi, ii, 0.35f, -1, ATTN_ERR_ARG},
    };
    for (size_t t = 0; t < sizeof bad / sizeof *bad; t++) {
        for (int x = 0; x < N * COLS; x++) m1[x] = 5.0f;
        p.dropout_p = bad[t].pdrop;
        p.num_threads = bad[t].threads;
        memset(&e, 0, sizeof e);
        const attn_status st =
            attn_dropout_mask(&p, bad[t].n, bad[t].cols, bad[t].b, bad[t].h, bad[t].i, m1, &e);
        size_t touched = 0;
        for (int x = 0; x < N * COLS; x++) touched += m1[x] != 5.0f;
        CHECK(st == bad[t].want && e.message[0] && touched == 0, "mask %s: %s (%s), %zu written",
              bad[t].what, attn_status_name(st), e.message, touched);
    }
    free(m1), free(m3), free(att);
}

int main(void) {
    attn_set_num_threads(2, NULL);
    test_generator();
    test_mask_api();
    test_determinism();
    test_threads();
    test_keep_rate();
    test_expectation();
    test_noop();
    test_invalid();
    test_tiling();
    attn_set_num_threads(0, NULL);
    return tu_report("test_dropout");
}
