#define _POSIX_C_SOURCE 200809L
/* bf16 scaled dot-product attention (attn.h: attn_sdpa_params.dtype):
 * FlashAttention's accuracy rule against float64 of the same bf16 inputs,
 * |attn - fp64| <= 2 |PyTorch-like bf16 math path - fp64| + 1e-3 (max over
 * elements), for out and every gradient, on every instruction-set row the
 * CPU runs (the portable row forced too), the backward from an fp32 and
 * from a bf16 grad_out; the fused backward gives the same bits on 1 thread
 * (one pass per head) and 3 (two passes), the forward (grouped-query, and
 * a head's blocks shared out) on 1, 2, 3 and 5 threads; the reference path on bf16 equals
 * the fp32 reference on the converted values bitwise; bad dtypes refused. */
#include "testutil.h"
#include "internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static uint16_t bf(float x) {
    uint16_t h;
    attn_bf16_from_f32(&x, &h, 1);
    return h;
}
static float fb(uint16_t h) {
    float x;
    attn_f32_from_bf16(&h, &x, 1);
    return x;
}
#define CHECK_OK(call, e)                                                                          \
    do {                                                                                           \
        const attn_status st_ = (call);                                                            \
        CHECK(st_ == ATTN_OK, "%s: %s", attn_status_name(st_), (e)->message);                    \
    } while (0)

static float rb(float x) { return fb(bf(x)); } /* rounded to bf16 */

typedef struct {
    int64_t B, H, Lq, Lk, D;
    int mask; /* 0 none, 1 causal, 2 key padding */
} shape;

/* Visible (i, j) of batch row b. */
static int visible(const shape *s, const int64_t *klen, int64_t b, int64_t i, int64_t j) {
    if (s->mask == 1) return j <= i + s->Lk - s->Lq;
    if (s->mask == 2) return j < klen[b];
    return 1;
}

/* Forward and backward of one (b, h) slice: x[L][D] rows contiguous, in
 * double (round 0) or emulating PyTorch's bf16 math path (round 1: q scaled
 * and rounded, every product's result, the softmax and its gradient
 * rounded to bf16, fp32 accumulation). */
static void slice(const shape *s, const int64_t *klen, int64_t b, int round, const float *q,
                  const float *k, const float *v, const float *dout, double *out, double *dq,
                  double *dk, double *dv) {
    const int64_t Lq = s->Lq, Lk = s->Lk, D = s->D;
    const double scale = 1.0 / sqrt((double)D);
    double *P = calloc((size_t)(Lq * Lk), sizeof(double)), *dP = calloc((size_t)(Lq * Lk), sizeof(double));
    double *qs = calloc((size_t)(Lq * D), sizeof(double));
#define R(x) (round ? (double)rb((float)(x)) : (x))
    for (int64_t i = 0; i < Lq * D; i++) qs[i] = R(q[i] * scale);
    for (int64_t i = 0; i < Lq; i++) {
        double m = -INFINITY, l = 0;
        for (int64_t j = 0; j < Lk; j++) {
            double a = 0;
            for (int64_t d = 0; d < D; d++) a += round ? (double)((float)qs[i * D + d] * k[j * D + d]) : qs[i * D + d] * k[j * D + d];
            P[i * Lk + j] = visible(s, klen, b, i, j) ? R(a) : -INFINITY;
            if (P[i * Lk + j] > m) m = P[i * Lk + j];
        }
        for (int64_t j = 0; j < Lk; j++) l += P[i * Lk + j] == -INFINITY ? 0 : exp(P[i * Lk + j] - m);
        for (int64_t j = 0; j < Lk; j++)
            P[i * Lk + j] = P[i * Lk + j] == -INFINITY ? 0 : R(exp(P[i * Lk + j] - m) / l);
        for (int64_t d = 0; d < D; d++) {
            double a = 0;
            for (int64_t j = 0; j < Lk; j++) a += P[i * Lk + j] * v[j * D + d];
            out[i * D + d] = R(a);
        }
    }
    for (int64_t i = 0; i < Lq; i++) {
        double Di = 0;
        for (int64_t j = 0; j < Lk; j++) {
            double a = 0;
            for (int64_t d = 0; d < D; d++) a += dout[i * D + d] * v[j * D + d];
            dP[i * Lk + j] = R(a);
            Di += dP[i * Lk + j] * P[i * Lk + j];
        }
        for (int64_t j = 0; j < Lk; j++) dP[i * Lk + j] = R(P[i * Lk + j] * (dP[i * Lk + j] - Di)); /* dS */
    }
    for (int64_t j = 0; j < Lk; j++)
        for (int64_t d = 0; d < D; d++) {
            double a = 0, c = 0;
            for (int64_t i = 0; i < Lq; i++) a += P[i * Lk + j] * dout[i * D + d], c += dP[i * Lk + j] * qs[i * D + d];
            dv[j * D + d] = R(a);
            dk[j * D + d] = R(c);
        }
    for (int64_t i = 0; i < Lq; i++)
        for (int64_t d = 0; d < D; d++) {
            double a = 0;
            for (int64_t j = 0; j < Lk; j++) a += dP[i * Lk + j] * k[j * D + d];
            dq[i * D + d] = R(R(a) * scale);
        }
#undef R
    free(P), free(dP), free(qs);
}

static double maxerr_f(const float *got, const double *want, size_t n) {
    double e = 0;
    for (size_t i = 0; i < n; i++) e = fmax(e, fabs((double)got[i] - want[i]));
    return e;
}
static double maxerr_d(const double *got, const double *want, size_t n) {
    double e = 0;
    for (size_t i = 0; i < n; i++) e = fmax(e, fabs(got[i] - want[i]));
    return e;
}

static double g_worst[4]; /* per tensor: the largest attn error / allowed error seen */

static void run_shape(const shape *s, attn_impl impl, const char *isa) {
    const int64_t B = s->B, H = s->H, Lq = s->Lq, Lk = s->Lk, D = s->D;
    const size_t nq = (size_t)(B * H * Lq * D), nk = (size_t)(B * H * Lk * D);
    tu_rng r = tu_seed((uint64_t)(Lq * 1000 + Lk * 7 + D + s->mask));
    float *q = malloc(nq * 4), *k = malloc(nk * 4), *v = malloc(nk * 4), *g = malloc(nq * 4);
    uint16_t *qb = malloc(nq * 2), *kb = malloc(nk * 2), *vb = malloc(nk * 2), *ob = malloc(nq * 2),
             *gb = malloc(nq * 2);
    tu_fill(&r, q, nq, -2, 2), tu_fill(&r, k, nk, -2, 2), tu_fill(&r, v, nk, -1, 1);
    tu_fill(&r, g, nq, -1, 1);
    attn_bf16_from_f32(q, qb, nq), attn_bf16_from_f32(k, kb, nk), attn_bf16_from_f32(v, vb, nk);
    attn_bf16_from_f32(g, gb, nq);
    attn_f32_from_bf16(qb, q, nq), attn_f32_from_bf16(kb, k, nk), attn_f32_from_bf16(vb, v, nk);
    attn_f32_from_bf16(gb, g, nq);
    int64_t klen[8];
    for (int64_t b = 0; b < B; b++) klen[b] = s->mask == 2 ? (b * 5 + 1) % Lk + 1 : Lk;
    if (s->mask == 2) klen[0] = 0; /* an empty row: 0, lse -inf */

    float *out = malloc(nq * 4), *lse = malloc((size_t)(B * H * Lq) * 4);
    float *dq = malloc(nq * 4), *dk = malloc(nk * 4), *dv = malloc(nk * 4);
    attn_tensor tq = attn_tensor_bhld_bf16(qb, B, H, Lq, D), tk = attn_tensor_bhld_bf16(kb, B, H, Lk, D),
                tv = attn_tensor_bhld_bf16(vb, B, H, Lk, D), to = attn_tensor_bhld(out, B, H, Lq, D),
                tob = attn_tensor_bhld_bf16(ob, B, H, Lq, D), tg = attn_tensor_bhld(g, B, H, Lq, D),
                tdq = attn_tensor_bhld(dq, B, H, Lq, D), tdk = attn_tensor_bhld(dk, B, H, Lk, D),
                tdv = attn_tensor_bhld(dv, B, H, Lk, D);
    attn_sdpa_params p = {0};
    p.dtype = ATTN_BF16, p.out_dtype = ATTN_F32; /* fp32 out (0 would follow dtype) */
    p.impl = impl;
    p.causal = s->mask == 1;
    p.key_lengths = s->mask == 2 ? klen : NULL;
    attn_error e;
    attn_sdpa_info info;
    CHECK_OK(attn_sdpa_forward(&tq, &tk, &tv, &p, &to, NULL, lse, &info, &e), &e);
    CHECK(impl == ATTN_IMPL_REFERENCE || strstr(info.reason, "bf16"), "reason %s", info.reason);
    attn_sdpa_params pb = p;
    pb.out_dtype = ATTN_BF16;
    CHECK_OK(attn_sdpa_forward(&tq, &tk, &tv, &pb, &tob, NULL, NULL, NULL, &e), &e);
    size_t same = 0;
    for (size_t i = 0; i < nq; i++) same += ob[i] == bf(out[i]);
    CHECK(same == nq, "bf16 out is the fp32 out rounded once: %zu of %zu", same, nq);
    /* grad_out in fp32 here (out fp32), so out_dtype stays fp32 */
    CHECK_OK(attn_sdpa_backward(&tq, &tk, &tv, &to, lse, &tg, &p, &tdq, &tdk, &tdv, NULL, &e), &e);

    double *o64 = malloc(nq * 8), *dq64 = malloc(nq * 8), *dk64 = malloc(nk * 8), *dv64 = malloc(nk * 8);
    double *opt = malloc(nq * 8), *dqpt = malloc(nq * 8), *dkpt = malloc(nk * 8), *dvpt = malloc(nk * 8);
    for (int64_t bh = 0; bh < B * H; bh++) {
        const int64_t oq = bh * Lq * D, ok = bh * Lk * D, b = bh / H;
        slice(s, klen, b, 0, q + oq, k + ok, v + ok, g + oq, o64 + oq, dq64 + oq, dk64 + ok, dv64 + ok);
        slice(s, klen, b, 1, q + oq, k + ok, v + ok, g + oq, opt + oq, dqpt + oq, dkpt + ok, dvpt + ok);
    }
    /* the backward again from the bf16 out and a bf16 grad_out (out_dtype bf16) */
    float *dq2 = malloc(nq * 4), *dk2 = malloc(nk * 4), *dv2 = malloc(nk * 4);
    attn_tensor tgb = attn_tensor_bhld_bf16(gb, B, H, Lq, D), tdq2 = attn_tensor_bhld(dq2, B, H, Lq, D),
                tdk2 = attn_tensor_bhld(dk2, B, H, Lk, D), tdv2 = attn_tensor_bhld(dv2, B, H, Lk, D);
    CHECK_OK(attn_sdpa_backward(&tq, &tk, &tv, &tob, lse, &tgb, &pb, &tdq2, &tdk2, &tdv2, NULL, &e), &e);
    const char *names[7] = {"out", "dq", "dk", "dv", "dq (bf16 grad_out)", "dk (bf16 grad_out)",
                            "dv (bf16 grad_out)"};
    const float *got[7] = {out, dq, dk, dv, dq2, dk2, dv2};
    const double *want[7] = {o64, dq64, dk64, dv64, dq64, dk64, dv64};
    const double *pt[7] = {opt, dqpt, dkpt, dvpt, dqpt, dkpt, dvpt};
    const size_t n[7] = {nq, nq, nk, nk, nq, nk, nk};
    for (int t = 0; t < 7; t++) {
        const double ea = maxerr_f(got[t], want[t], n[t]), ep = maxerr_d(pt[t], want[t], n[t]);
        const double allowed = 2 * ep + 1e-3;
        g_worst[t < 4 ? t : t - 3] = fmax(g_worst[t < 4 ? t : t - 3], ea / allowed);
        CHECK(ea <= allowed, "%s %s [%lld,%lld,%lld,%lld,%lld] mask %d: %s error %.3g > 2 x %.3g + 1e-3",
              isa, impl == ATTN_IMPL_REFERENCE ? "reference" : "fused", (long long)B, (long long)H,
              (long long)Lq, (long long)Lk, (long long)D, s->mask, names[t], ea, ep);
    }
    free(dq2), free(dk2), free(dv2);
    if (s->mask == 2) /* row b = 0 sees no key */
        CHECK(lse[0] == -INFINITY && out[0] == 0.0f, "empty row: lse %g out %g", lse[0], out[0]);

    if (impl == ATTN_IMPL_REFERENCE) { /* the oracle: the fp32 reference on the converted values */
        float *o2 = malloc(nq * 4), *l2 = malloc((size_t)(B * H * Lq) * 4);
        attn_tensor fq = attn_tensor_bhld(q, B, H, Lq, D), fk = attn_tensor_bhld(k, B, H, Lk, D),
                    fv = attn_tensor_bhld(v, B, H, Lk, D), fo = attn_tensor_bhld(o2, B, H, Lq, D);
        attn_sdpa_params pf = p;
        pf.dtype = ATTN_F32;
        CHECK_OK(attn_sdpa_forward(&fq, &fk, &fv, &pf, &fo, NULL, l2, NULL, &e), &e);
        CHECK(memcmp(o2, out, nq * 4) == 0 && memcmp(l2, lse, (size_t)(B * H * Lq) * 4) == 0,
              "bf16 reference == fp32 reference of the converted values");
        free(o2), free(l2);
    }
    free(q), free(k), free(v), free(g), free(qb), free(kb), free(vb), free(ob), free(gb);
    free(out), free(lse), free(dq), free(dk), free(dv);
    free(o64), free(dq64), free(dk64), free(dv64), free(opt), free(dqpt), free(dkpt), free(dvpt);
}

static void test_errors(void) {
    uint16_t x[64] = {0};
    float o[64];
    attn_tensor t = attn_tensor_bhld_bf16(x, 1, 1, 4, 16), to = attn_tensor_bhld(o, 1, 1, 4, 16);
    attn_sdpa_params p = {0};
    attn_error e;
    p.out_dtype = ATTN_BF16; /* bf16 out from fp32 inputs */
    CHECK_ERR(attn_sdpa_forward(&t, &t, &t, &p, &to, NULL, NULL, NULL, &e), ATTN_ERR_ARG, &e);
    p.out_dtype = ATTN_F32, p.dtype = (attn_dtype)7;
    CHECK_ERR(attn_sdpa_forward(&t, &t, &t, &p, &to, NULL, NULL, NULL, &e), ATTN_ERR_ARG, &e);
    p.dtype = ATTN_BF16, p.out_dtype = (attn_dtype)-1;
    CHECK_ERR(attn_sdpa_forward(&t, &t, &t, &p, &to, NULL, NULL, NULL, &e), ATTN_ERR_ARG, &e);
    p.out_dtype = ATTN_F32;
    const int64_t cu[2] = {0, 4};
    CHECK_ERR(attn_sdpa_varlen_forward(&t, &t, &t, 1, cu, NULL, &p, &to, NULL, NULL, NULL, &e),
              ATTN_ERR_ARG, &e);
    /* conversions: ties to even, NaN stays NaN, overflow to inf */
    CHECK(bf(1.00390625f) == 0x3f80 && bf(1.01171875f) == 0x3f82 && bf(-0.0f) == 0x8000);
    CHECK(isnan(fb(bf(NAN))) && bf(INFINITY) == 0x7f80 && bf(3.4e38f) == 0x7f80);
}

/* The fused bf16 backward on 1 thread (one pass per head) and on 3 (two
 * passes: B·H = 2 < 3 threads) gives the same bits: Lq queries over 250
 * keys, causal; Lq = 250 (four query blocks), 40 (one block: tiles packed
 * one at a time) and 3 (decoding: K and V read as rows). */
static void test_threads(int64_t Lq) {
    const int64_t B = 1, H = 2, L = 250, D = 40;
    const size_t n = (size_t)(B * H * L * D), nq = (size_t)(B * H * Lq * D);
    tu_rng r = tu_seed(77);
    float *x = malloc(n * 4), *out = malloc(nq * 4), *lse = malloc((size_t)(B * H * Lq) * 4);
    float *g[2][3];
    uint16_t *qkv = malloc(3 * n * 2);
    tu_fill(&r, x, n, -2, 2), attn_bf16_from_f32(x, qkv, n);
    tu_fill(&r, x, n, -2, 2), attn_bf16_from_f32(x, qkv + n, n);
    tu_fill(&r, x, n, -1, 1), attn_bf16_from_f32(x, qkv + 2 * n, n);
    tu_fill(&r, x, nq, -1, 1); /* grad_out */
    attn_tensor tq = attn_tensor_bhld_bf16(qkv, B, H, Lq, D),
                tk = attn_tensor_bhld_bf16(qkv + n, B, H, L, D),
                tv = attn_tensor_bhld_bf16(qkv + 2 * n, B, H, L, D),
                to = attn_tensor_bhld(out, B, H, Lq, D), tg = attn_tensor_bhld(x, B, H, Lq, D);
    attn_sdpa_params p = {0};
    p.dtype = ATTN_BF16, p.out_dtype = ATTN_F32;
    p.impl = ATTN_IMPL_FUSED;
    p.causal = 1;
    attn_error e;
    attn_sdpa_info info;
    CHECK_OK(attn_sdpa_forward(&tq, &tk, &tv, &p, &to, NULL, lse, NULL, &e), &e);
    for (int a = 0; a < 2; a++) {
        p.num_threads = a ? 3 : 1;
        for (int t = 0; t < 3; t++) g[a][t] = malloc(n * 4);
        attn_tensor dq = attn_tensor_bhld(g[a][0], B, H, Lq, D),
                    dk = attn_tensor_bhld(g[a][1], B, H, L, D),
                    dv = attn_tensor_bhld(g[a][2], B, H, L, D);
        CHECK_OK(attn_sdpa_backward(&tq, &tk, &tv, &to, lse, &tg, &p, &dq, &dk, &dv, &info, &e), &e);
        CHECK(strstr(info.reason, a ? "two passes" : "one pass"), "reason %s", info.reason);
    }
    for (int t = 0; t < 3; t++) {
        CHECK(memcmp(g[0][t], g[1][t], (t ? n : nq) * 4) == 0,
              "bf16 backward, Lq %lld: 1 and 3 threads differ (grad %d)", (long long)Lq, t);
        free(g[0][t]), free(g[1][t]);
    }
    free(x), free(out), free(lse), free(qkv);
}

/* The forward on 1, 2, 3 and 5 threads gives the same bits, every output
 * written (each run's output starts as NaN). 8 query heads on 1 K/V head
 * (Lq 20 and 40: query blocks of whole and partial 16-row blocks, for the
 * amx row): the thread count decides how many query heads a block stacks.
 * Over 300 queries, causal or not, K/V heads spread evenly over 1 to 3
 * threads run head by head (attn_fused_bwd_one_pass), their blocks taken
 * one at a time and a thread done early packing another's head to help;
 * 5 threads pack all heads first: 4 on 2 (one stack of 2 heads per block),
 * 16 on 2 (two stacks of 4), 24 on 3 (two threads help each other). */
static void test_gqa_threads(int64_t H, int64_t Hkv, int64_t Lq, int64_t L, int causal) {
    const int64_t B = 1, D = 64;
    const int threads[] = {1, 2, 3, 5}, nt = 4;
    const size_t nq = (size_t)(B * H * Lq * D), nk = (size_t)(B * Hkv * L * D);
    tu_rng r = tu_seed(78);
    float *x = malloc((nq > nk ? nq : nk) * 4), *out[4];
    uint16_t *q = malloc(nq * 2), *kv = malloc(2 * nk * 2);
    tu_fill(&r, x, nq, -2, 2), attn_bf16_from_f32(x, q, nq);
    tu_fill(&r, x, nk, -2, 2), attn_bf16_from_f32(x, kv, nk);
    tu_fill(&r, x, nk, -1, 1), attn_bf16_from_f32(x, kv + nk, nk);
    attn_tensor tq = attn_tensor_bhld_bf16(q, B, H, Lq, D),
                tk = attn_tensor_bhld_bf16(kv, B, Hkv, L, D),
                tv = attn_tensor_bhld_bf16(kv + nk, B, Hkv, L, D);
    attn_sdpa_params p = {0};
    p.dtype = ATTN_BF16, p.out_dtype = ATTN_F32, p.impl = ATTN_IMPL_FUSED;
    p.causal = causal;
    attn_error e;
    for (int t = 0; t < nt; t++) {
        out[t] = malloc(nq * 4);
        for (size_t i = 0; i < nq; i++) out[t][i] = NAN;
        attn_tensor to = attn_tensor_bhld(out[t], B, H, Lq, D);
        p.num_threads = threads[t];
        CHECK_OK(attn_sdpa_forward(&tq, &tk, &tv, &p, &to, NULL, NULL, NULL, &e), &e);
    }
    size_t unwritten = 0;
    for (size_t i = 0; i < nq; i++) unwritten += isnan(out[0][i]);
    CHECK(unwritten == 0, "bf16 forward, %lld heads on %lld, Lq %lld, causal %d: %zu outputs "
          "not written", (long long)H, (long long)Hkv, (long long)Lq, causal, unwritten);
    for (int t = 1; t < nt; t++)
        CHECK(memcmp(out[0], out[t], nq * 4) == 0, "bf16 forward, %lld heads on %lld, Lq %lld, "
              "causal %d: %d threads differ from 1", (long long)H, (long long)Hkv, (long long)Lq,
              causal, threads[t]);
    for (int t = 0; t < nt; t++) free(out[t]);
    free(x), free(q), free(kv);
}

/* The worst error / allowed of each tensor over the shapes, then reset. */
static void report(const char *what) {
    printf("%-12s worst error / (2 x PyTorch-like + 1e-3): out %.3g dq %.3g dk %.3g dv %.3g\n", what,
           g_worst[0], g_worst[1], g_worst[2], g_worst[3]);
    memset(g_worst, 0, sizeof g_worst);
}

int main(void) {
    attn_enable_amx(); /* the amx row too, where the CPU has it */
    const shape shapes[] = {
        {1, 1, 1, 1, 16, 0},    {2, 3, 37, 37, 16, 1},   {2, 2, 70, 200, 64, 0},
        {1, 2, 300, 300, 128, 1}, {3, 2, 50, 130, 32, 2}, {2, 4, 1, 300, 64, 2},
        {2, 2, 3, 97, 80, 1},   {1, 1, 129, 64, 24, 0},
    };
    const int ns = (int)(sizeof shapes / sizeof shapes[0]);
    test_errors();
    for (int i = 0; i < ns; i++) run_shape(&shapes[i], ATTN_IMPL_REFERENCE, "-");
    report("reference");
    for (int a = 0; attn_test_isa_name(a); a++) {
        const char *isa = attn_test_isa_name(a);
        setenv("ATTN_FUSED_ISA", isa, 1);
        attn_test_reload_env(); /* the library reads the environment once */
        for (int i = 0; i < ns; i++) run_shape(&shapes[i], ATTN_IMPL_FUSED, isa);
        test_threads(250), test_threads(40), test_threads(3);
        test_gqa_threads(8, 1, 20, 100, 0), test_gqa_threads(8, 1, 40, 100, 0);
        for (int causal = 0; causal < 2; causal++)
            test_gqa_threads(4, 2, 300, 300, causal), test_gqa_threads(16, 2, 300, 300, causal),
                test_gqa_threads(24, 3, 300, 300, causal);
        report(isa);
    }
    return tu_report("test_sdpa_bf16");
}
