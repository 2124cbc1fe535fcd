/* The scaled dot-product calls' memory preconditions (attn.h):
 *   - out_dtype left 0 follows dtype: dtype = ATTN_BF16 alone writes bf16
 *     into a bf16-sized out (0.4 wrote fp32 there, past the buffer) and reads
 *     a bf16 grad_out; checked against float64 attention on the same bf16
 *     values, with guard words after the buffer;
 *   - outputs that share memory with an input or another output are refused
 *     with ATTN_ERR_ALIAS before anything is written (forward, backward,
 *     varlen), while views that interleave in one buffer without sharing an
 *     element (q, k, v and dq, dk, dv as slices of packed [B, L, 3, H, D])
 *     run and give the same bits as separate buffers;
 *   - the overlap test itself against brute force (every byte of both views
 *     marked) on random small strided views, negative strides included. */
#include "testutil.h"
#include "internal.h"

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

enum { GUARD = 16 };
static const uint16_t kGuard = 0xBEEF;

/* float64 softmax(q kᵀ / sqrt(D)) v for contiguous [BH, L, D] slices. */
static void attention64(const float *q, const float *k, const float *v, int64_t BH, int64_t Lq,
                        int64_t Lk, int64_t D, double *out) {
    double *s = malloc((size_t)Lk * sizeof *s);
    for (int64_t bh = 0; bh < BH; bh++)
        for (int64_t i = 0; i < Lq; i++) {
            double m = -INFINITY, l = 0;
            for (int64_t j = 0; j < Lk; j++) {
                double x = 0;
                for (int64_t d = 0; d < D; d++)
                    x += (double)q[(bh * Lq + i) * D + d] * k[(bh * Lk + j) * D + d];
                s[j] = x / sqrt((double)D);
                m = s[j] > m ? s[j] : m;
            }
            for (int64_t j = 0; j < Lk; j++) l += s[j] = exp(s[j] - m);
            for (int64_t d = 0; d < D; d++) {
                double o = 0;
                for (int64_t j = 0; j < Lk; j++) o += s[j] / l * v[(bh * Lk + j) * D + d];
                out[(bh * Lq + i) * D + d] = o;
            }
        }
    free(s);
}

/* dtype = ATTN_BF16 with out_dtype left 0, on both paths: out is bf16
 * (each element within bf16's rounding of float64 attention on the same
 * bf16 inputs: 2^-8 relative, plus 2^-8 max|v| on the fused path, which
 * rounds the weights to bf16 for P·V), the guard words after the exact
 * bf16-sized buffer untouched; the backward with out_dtype 0 reads a bf16
 * grad_out: the same bits as out_dtype = ATTN_BF16 said explicitly. */
static void test_default_out_dtype(attn_impl impl) {
    enum { B = 2, H = 2, Lq = 9, Lk = 13, D = 16 };
    const size_t nq = B * H * Lq * D, nk = B * H * Lk * D;
    float *x = tu_malloc(nk * 4), *q = tu_malloc(nq * 4), *k = tu_malloc(nk * 4),
          *v = tu_malloc(nk * 4);
    uint16_t *qb = tu_malloc(nq * 2), *kb = tu_malloc(nk * 2), *vb = tu_malloc(nk * 2);
    uint16_t *ob = tu_malloc((nq + GUARD) * 2), *gb = tu_malloc(nq * 2);
    float *lse = tu_malloc(B * H * Lq * 4);
    tu_rng r = tu_seed(77 + impl);
    uint16_t *dst[4] = {qb, kb, vb, gb};
    float *back[4] = {q, k, v, x};
    const size_t cnt[4] = {nq, nk, nk, nq};
    for (int t = 0; t < 4; t++) { /* bf16 values and their exact fp32 */
        tu_fill(&r, x, cnt[t], -2, 2);
        attn_bf16_from_f32(x, dst[t], cnt[t]);
        attn_f32_from_bf16(dst[t], back[t], cnt[t]);
    }
    for (int g = 0; g < GUARD; g++) ob[nq + g] = kGuard;
    attn_tensor tq = attn_tensor_bhld_bf16(qb, B, H, Lq, D), tk = attn_tensor_bhld_bf16(kb, B, H, Lk, D),
                tv = attn_tensor_bhld_bf16(vb, B, H, Lk, D), to = attn_tensor_bhld_bf16(ob, B, H, Lq, D),
                tg = attn_tensor_bhld_bf16(gb, B, H, Lq, D);
    attn_sdpa_params p = {0};
    p.dtype = ATTN_BF16; /* out_dtype left 0 */
    p.impl = impl;
    attn_error e;
    CHECK_OK(attn_sdpa_forward(&tq, &tk, &tv, &p, &to, NULL, lse, NULL, &e), &e);
    int guards = 0;
    for (int g = 0; g < GUARD; g++) guards += ob[nq + g] == kGuard;
    CHECK(guards == GUARD, "impl %d: %d of %d guard words after the bf16 out overwritten", impl,
          GUARD - guards, GUARD);
    double *o64 = tu_malloc(nq * 8), worst = 0;
    attention64(q, k, v, B * H, Lq, Lk, D, o64);
    for (size_t i = 0; i < nq; i++) {
        const double bound = fabs(o64[i]) / 256 + (impl == ATTN_IMPL_FUSED ? 2.0 / 256 : 0) + 1e-6;
        const double err = fabs(fb(ob[i]) - o64[i]) / bound;
        worst = err > worst ? err : worst;
    }
    CHECK(worst <= 1.0, "impl %d: bf16 out (out_dtype 0) vs float64: worst error %.3g of the bound",
          impl, worst);

    /* backward: grad_out bf16 (out_dtype 0 = dtype's) */
    float *d[2][3];
    for (int a = 0; a < 2; a++) {
        for (int t = 0; t < 3; t++) d[a][t] = tu_malloc((t ? nk : nq) * 4);
        attn_tensor dq = attn_tensor_bhld(d[a][0], B, H, Lq, D),
                    dk = attn_tensor_bhld(d[a][1], B, H, Lk, D),
                    dv = attn_tensor_bhld(d[a][2], B, H, Lk, D);
        attn_sdpa_params pb = p;
        pb.out_dtype = a ? ATTN_BF16 : ATTN_DTYPE_DEFAULT;
        CHECK_OK(attn_sdpa_backward(&tq, &tk, &tv, &to, lse, &tg, &pb, &dq, &dk, &dv, NULL, &e), &e);
    }
    for (int t = 0; t < 3; t++)
        CHECK(memcmp(d[0][t], d[1][t], (t ? nk : nq) * 4) == 0,
              "impl %d: backward with out_dtype 0 differs from out_dtype ATTN_BF16 (grad %d)", impl,
              t);
    /* out_dtype = ATTN_F32 explicitly: an fp32 out from bf16 inputs */
    float *of = tu_malloc(nq * 4);
    attn_tensor tof = attn_tensor_bhld(of, B, H, Lq, D);
    p.out_dtype = ATTN_F32;
    CHECK_OK(attn_sdpa_forward(&tq, &tk, &tv, &p, &tof, NULL, NULL, NULL, &e), &e);
    size_t same = 0;
    for (size_t i = 0; i < nq; i++) same += bf(of[i]) == ob[i];
    CHECK(same == nq, "impl %d: fp32 out rounded is the bf16 out: %zu of %zu", impl, same, nq);
    /* both 0: fp32 in and out (zero-initialised params) */
    attn_sdpa_params pz = {0};
    pz.impl = impl;
    attn_tensor fq = attn_tensor_bhld(q, B, H, Lq, D), fk = attn_tensor_bhld(k, B, H, Lk, D),
                fv = attn_tensor_bhld(v, B, H, Lk, D);
    CHECK_OK(attn_sdpa_forward(&fq, &fk, &fv, &pz, &tof, NULL, NULL, NULL, &e), &e);
    worst = 0;
    for (size_t i = 0; i < nq; i++) worst = fmax(worst, fabs(of[i] - o64[i]));
    CHECK(worst < 1e-5, "impl %d: fp32 (params {0}) vs float64: %.3g", impl, worst);
    /* bad values */
    p.out_dtype = (attn_dtype)3;
    CHECK_ERR(attn_sdpa_forward(&tq, &tk, &tv, &p, &to, NULL, NULL, NULL, &e), ATTN_ERR_ARG, &e);
    p.out_dtype = ATTN_BF16, p.dtype = ATTN_DTYPE_DEFAULT; /* bf16 out from fp32 in */
    CHECK_ERR(attn_sdpa_forward(&fq, &fk, &fv, &p, &to, NULL, NULL, NULL, &e), ATTN_ERR_ARG, &e);
    for (int a = 0; a < 2; a++)
        for (int t = 0; t < 3; t++) free(d[a][t]);
    free(x), free(q), free(k), free(v), free(qb), free(kb), free(vb), free(ob), free(gb), free(lse);
    free(o64), free(of);
}

/* The refusal: ATTN_ERR_ALIAS, a message naming both, and the output
 * buffer (here: all of mem) unchanged. */
static void expect_alias(attn_status got, const attn_error *e, const float *mem,
                         const float *before, size_t n, const char *a, const char *b,
                         const char *what) {
    CHECK_ERR(got, ATTN_ERR_ALIAS, e);
    CHECK(strstr(e->message, a) && strstr(e->message, b), "%s: message \"%s\" names %s and %s",
          what, e->message, a, b);
    CHECK(memcmp(mem, before, n * 4) == 0, "%s: memory written before the refusal", what);
}

/* Overlaps refused, interleaving allowed: the forward and backward on a
 * small problem whose tensors are placed in one arena. */
static void test_alias_calls(void) {
    enum { B = 2, H = 3, L = 7, D = 8 };
    const size_t n = B * H * L * D; /* one tensor */
    const size_t total = 16 * n;
    float *mem = tu_malloc(total * 4), *before = tu_malloc(total * 4);
    tu_rng r = tu_seed(5);
    tu_fill(&r, mem, total, -1, 1);
    float *q = mem, *k = mem + n, *v = mem + 2 * n, *o = mem + 3 * n, *g = mem + 4 * n,
          *lse = mem + 5 * n, *w = mem + 6 * n, *dq = mem + 8 * n, *dk = mem + 9 * n,
          *dv = mem + 10 * n;
    attn_tensor tq = attn_tensor_bhld(q, B, H, L, D), tk = attn_tensor_bhld(k, B, H, L, D),
                tv = attn_tensor_bhld(v, B, H, L, D), to = attn_tensor_bhld(o, B, H, L, D),
                tg = attn_tensor_bhld(g, B, H, L, D), tdq = attn_tensor_bhld(dq, B, H, L, D),
                tdk = attn_tensor_bhld(dk, B, H, L, D), tdv = attn_tensor_bhld(dv, B, H, L, D);
    attn_sdpa_params p = {0};
    p.causal = 1;
    attn_error e;
    /* separate buffers: fine (the baseline) */
    CHECK_OK(attn_sdpa_forward(&tq, &tk, &tv, &p, &to, w, lse, NULL, &e), &e);
    CHECK_OK(attn_sdpa_backward(&tq, &tk, &tv, &to, lse, &tg, &p, &tdq, &tdk, &tdv, NULL, &e), &e);
    memcpy(before, mem, total * 4);
    attn_tensor t;
#define FWD(O, W, LSE) attn_sdpa_forward(&tq, &tk, &tv, &p, O, W, LSE, NULL, &e)
#define BWD(DQ, DK, DV, G, LSE) attn_sdpa_backward(&tq, &tk, &tv, &to, LSE, G, &p, DQ, DK, DV, NULL, &e)
    expect_alias(FWD(&tq, NULL, NULL), &e, mem, before, total, "out", "q", "out = q");
    t = attn_tensor_bhld(k + 5, B, H, L, D); /* out over k, shifted */
    expect_alias(FWD(&t, NULL, NULL), &e, mem, before, total, "out", "k", "out over k");
    t = attn_tensor_bhld(v + n - 1, B, H, L, D); /* one shared element: v's last */
    expect_alias(FWD(&t, NULL, NULL), &e, mem, before, total, "out", "v", "out's first = v's last");
    t = tq; /* q reversed: strides negative, element 0 at q's last float */
    t.data = q + n - 1;
    for (int d = 0; d < 4; d++) t.stride[d] = -t.stride[d];
    expect_alias(FWD(&t, NULL, NULL), &e, mem, before, total, "out", "q", "out = q reversed");
    expect_alias(FWD(&to, v, NULL), &e, mem, before, total, "weights", "v", "weights over v");
    expect_alias(FWD(&to, w, o + 3), &e, mem, before, total, "lse", "out", "lse over out");
    expect_alias(FWD(&to, w, w + 10), &e, mem, before, total, "lse", "weights", "lse over weights");
    /* byte granularity: bf16 inputs (2 bytes) over the first half of k's
     * bytes, an fp32 out (out_dtype ATTN_F32) ending 4 bytes into them
     * (their last two elements): refused; starting right after them: runs */
    attn_sdpa_params pbf = p;
    pbf.dtype = ATTN_BF16, pbf.out_dtype = ATTN_F32;
    attn_tensor hk = attn_tensor_bhld_bf16((uint16_t *)(void *)k, B, H, L, D);
    const size_t hbytes = n * 2;
    t = attn_tensor_bhld((float *)(void *)((char *)k + hbytes - 4), B, H, L, D);
    expect_alias(attn_sdpa_forward(&hk, &hk, &hk, &pbf, &t, NULL, NULL, NULL, &e), &e, mem, before,
                 total, "out", "q", "fp32 out over the bf16 inputs' last 4 bytes");
    t = attn_tensor_bhld((float *)(void *)((char *)k + hbytes), B, H, L, D);
    CHECK_OK(attn_sdpa_forward(&hk, &hk, &hk, &pbf, &t, NULL, NULL, NULL, &e), &e);
    memcpy(before, mem, total * 4);
    /* backward */
    expect_alias(BWD(&tdq, &tdq, &tdv, &tg, lse), &e, mem, before, total, "dk", "dq", "dk = dq");
    t = attn_tensor_bhld(dq + 1, B, H, L, D);
    expect_alias(BWD(&tdq, &t, &tdv, &tg, lse), &e, mem, before, total, "dk", "dq", "dk over dq");
    expect_alias(BWD(&tg, &tdk, &tdv, &tg, lse), &e, mem, before, total, "dq", "grad_out",
                 "dq = grad_out");
    expect_alias(BWD(&tq, &tdk, &tdv, &tg, lse), &e, mem, before, total, "dq", "q", "dq = q");
    t = attn_tensor_bhld(lse + 4, B, H, L, D); /* over lse [B, H, L] from its 5th float */
    expect_alias(BWD(&tdq, &tdk, &t, &tg, lse), &e, mem, before, total, "dv", "lse", "dv over lse");
    expect_alias(BWD(&tdq, &tdk, &to, &tg, lse), &e, mem, before, total, "dv", "out", "dv = out");
    /* varlen: the same checks */
    const int64_t cu[3] = {0, 3, L};
    attn_tensor vq = attn_tensor_bhld(q, 1, H, L, D), vk = attn_tensor_bhld(k, 1, H, L, D),
                vv = attn_tensor_bhld(v, 1, H, L, D), vo = attn_tensor_bhld(o, 1, H, L, D),
                vg = attn_tensor_bhld(g, 1, H, L, D), vdq = attn_tensor_bhld(dq, 1, H, L, D),
                vdk = attn_tensor_bhld(dk, 1, H, L, D), vdv = attn_tensor_bhld(dv, 1, H, L, D);
    expect_alias(attn_sdpa_varlen_forward(&vq, &vk, &vv, 2, cu, NULL, &p, &vk, NULL, NULL, NULL, &e),
                 &e, mem, before, total, "out", "k", "varlen out = k");
    expect_alias(attn_sdpa_varlen_backward(&vq, &vk, &vv, &vo, lse, &vg, 2, cu, NULL, &p, &vdq, &vdq,
                                           &vdv, NULL, &e),
                 &e, mem, before, total, "dk", "dq", "varlen dk = dq");
    expect_alias(attn_sdpa_varlen_backward(&vq, &vk, &vv, &vo, lse, &vg, 2, cu, NULL, &p, &vdq, &vdk,
                                           &vg, NULL, &e),
                 &e, mem, before, total, "dv", "grad_out", "varlen dv = grad_out");
#undef FWD
#undef BWD
    free(mem), free(before);
}

/* q, k, v as slices of one packed [B, L, 3, H, D] buffer and dq, dk, dv of
 * another: they interleave but share no element, so the calls run, with the
 * same bits as separate contiguous copies. A packed gradient buffer whose
 * dk slice is shifted by half a head (D/2 floats) into dq's: refused. */
static void test_alias_packed(void) {
    enum { B = 2, H = 2, L = 11, D = 8 };
    const size_t n = B * H * L * D;
    float *qkv = tu_malloc(3 * n * 4), *grad = tu_malloc((3 * n + D) * 4), *sep = tu_malloc(3 * n * 4);
    float *o = tu_malloc(n * 4), *g = tu_malloc(n * 4), *lse = tu_malloc(B * H * L * 4);
    float *ds = tu_malloc(3 * n * 4), *o2 = tu_malloc(n * 4), *lse2 = tu_malloc(B * H * L * 4);
    tu_rng r = tu_seed(9);
    tu_fill(&r, qkv, 3 * n, -2, 2), tu_fill(&r, g, n, -1, 1);
    attn_tensor pk[3], pd[3], sk[3], sd[3];
    for (int t = 0; t < 3; t++) { /* element (b, h, l, d) at ((b L + l) 3 + t) H D + h D + d */
        attn_tensor x = {qkv + t * H * D, {B, H, L, D}, {L * 3 * H * D, D, 3 * H * D, 1}};
        pk[t] = x;
        x.data = grad + t * H * D, pd[t] = x;
        for (int64_t b = 0; b < B; b++)
            for (int64_t h = 0; h < H; h++)
                for (int64_t l = 0; l < L; l++)
                    for (int64_t d = 0; d < D; d++)
                        sep[t * n + ((b * H + h) * L + l) * D + d] =
                            pk[t].data[b * pk[t].stride[0] + h * D + l * pk[t].stride[2] + d];
        sk[t] = attn_tensor_bhld(sep + t * n, B, H, L, D);
        sd[t] = attn_tensor_bhld(ds + t * n, B, H, L, D);
    }
    attn_tensor to = attn_tensor_bhld(o, B, H, L, D), to2 = attn_tensor_bhld(o2, B, H, L, D),
                tg = attn_tensor_bhld(g, B, H, L, D);
    attn_sdpa_params p = {0};
    p.causal = 1;
    attn_error e;
    CHECK_OK(attn_sdpa_forward(&pk[0], &pk[1], &pk[2], &p, &to, NULL, lse, NULL, &e), &e);
    CHECK_OK(attn_sdpa_backward(&pk[0], &pk[1], &pk[2], &to, lse, &tg, &p, &pd[0], &pd[1], &pd[2],
                                NULL, &e),
             &e);
    CHECK_OK(attn_sdpa_forward(&sk[0], &sk[1], &sk[2], &p, &to2, NULL, lse2, NULL, &e), &e);
    CHECK_OK(attn_sdpa_backward(&sk[0], &sk[1], &sk[2], &to2, lse2, &tg, &p, &sd[0], &sd[1], &sd[2],
                                NULL, &e),
             &e);
    CHECK(memcmp(o, o2, n * 4) == 0, "packed q, k, v: out differs from separate buffers");
    size_t same = 0;
    for (int t = 0; t < 3; t++)
        for (int64_t b = 0; b < B; b++)
            for (int64_t h = 0; h < H; h++)
                for (int64_t l = 0; l < L; l++)
                    for (int64_t d = 0; d < D; d++)
                        same += pd[t].data[b * pd[t].stride[0] + h * D + l * pd[t].stride[2] + d] ==
                                ds[t * n + ((b * H + h) * L + l) * D + d];
    CHECK(same == 3 * n, "packed dq, dk, dv: %zu of %zu equal to separate buffers", same, 3 * n);
    /* dk shifted by D/2: its first half-head lies on dq's second half */
    attn_tensor bad = pd[1];
    bad.data = grad + D / 2;
    float *snap = tu_malloc((3 * n + D) * 4);
    memcpy(snap, grad, (3 * n + D) * 4);
    CHECK_ERR(attn_sdpa_backward(&pk[0], &pk[1], &pk[2], &to, lse, &tg, &p, &pd[0], &bad, &pd[2],
                                 NULL, &e),
              ATTN_ERR_ALIAS, &e);
    CHECK(memcmp(snap, grad, (3 * n + D) * 4) == 0, "refused packed backward wrote");
    free(qkv), free(grad), free(sep), free(o), free(g), free(lse), free(ds), free(o2), free(lse2);
    free(snap);
}

/* attn_check_alias against brute force: random views (dims 1-4, strides
 * -9..9, 2- or 4-byte elements, offsets) in a 640-byte arena; the brute force
 * marks every byte of the input view and looks for a marked byte in the
 * output view. The check may answer "cannot tell" (refuses) only where the
 * brute force finds no overlap: counted, and must be rare (none here). */
static void test_alias_bruteforce(void) {
    enum { ARENA = 640, TRIALS = 20000 };
    static unsigned char mark[ARENA];
    static char base[ARENA];
    tu_rng r = tu_seed(123);
    int wrong = 0, refused_free = 0, overlaps = 0;
    for (int trial = 0; trial < TRIALS; trial++) {
        attn_alias_view v[2];
        for (int i = 0; i < 2; i++) {
            v[i].name = i ? "a" : "b";
            v[i].esize = tu_int(&r, 0, 1) ? 4 : 2;
            int64_t lo = 0, hi = 0;
            for (int d = 0; d < 4; d++) {
                v[i].dim[d] = tu_int(&r, 1, 4);
                /* mostly nested layouts (as real tensors), sometimes anything */
                v[i].stride[d] = tu_int(&r, -9, 9);
                const int64_t reach = (v[i].dim[d] - 1) * v[i].stride[d] * v[i].esize;
                if (reach < 0) lo += reach;
                else hi += reach;
            }
            /* element 0 at an offset that keeps every byte in the arena */
            const int64_t start = -lo, end = ARENA - v[i].esize - hi;
            v[i].data = base + (start < end ? tu_int(&r, start, end) : start);
            if (start >= end) v[i].dim[0] = 0; /* marker: skip */
        }
        if (v[0].dim[0] == 0 || v[1].dim[0] == 0) continue;
        memset(mark, 0, sizeof mark);
        int64_t idx[4];
        int truth = 0;
        for (int pass = 0; pass < 2; pass++)
            for (idx[0] = 0; idx[0] < v[pass].dim[0]; idx[0]++)
                for (idx[1] = 0; idx[1] < v[pass].dim[1]; idx[1]++)
                    for (idx[2] = 0; idx[2] < v[pass].dim[2]; idx[2]++)
                        for (idx[3] = 0; idx[3] < v[pass].dim[3]; idx[3]++) {
                            int64_t off = (const char *)v[pass].data - base;
                            for (int d = 0; d < 4; d++) off += idx[d] * v[pass].stride[d] * v[pass].esize;
                            for (int64_t byte = off; byte < off + v[pass].esize; byte++) {
                                if (pass == 0) mark[byte] = 1;
                                else truth |= mark[byte];
                            }
                        }
        attn_error e;
        const attn_status s = attn_check_alias(&v[0], 1, &v[1], 1, &e);
        overlaps += truth;
        if (truth && s != ATTN_ERR_ALIAS) wrong++;
        if (!truth && s == ATTN_ERR_ALIAS) {
            if (strstr(e.message, "may share")) refused_free++;
            else wrong++;
        }
    }
    CHECK(wrong == 0, "attn_check_alias wrong on %d of %d random view pairs", wrong, TRIALS);
    CHECK(refused_free == 0, "attn_check_alias could not settle %d pairs", refused_free);
    CHECK(overlaps > TRIALS / 10 && overlaps < TRIALS * 9 / 10,
          "the random views overlap in %d of %d pairs: both cases tested", overlaps, TRIALS);
}

int main(void) {
    test_default_out_dtype(ATTN_IMPL_REFERENCE);
    test_default_out_dtype(ATTN_IMPL_FUSED);
    test_alias_calls();
    test_alias_packed();
    test_alias_bruteforce();
    return tu_report("test_sdpa_preconditions");
}
