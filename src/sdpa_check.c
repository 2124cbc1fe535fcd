/* Argument validation for scaled dot-product attention, shared by the
 * forward, the backward and every kernel: after attn_sdpa_check succeeds a
 * kernel can index every tensor and mask without further checks. */
#include "internal.h"

#include <stdint.h>

static const char *const kDimName[4] = {"B", "H", "L", "D"};

attn_status attn_check_tensor(const attn_tensor *t, const char *name, attn_error *err) {
    if (!t) return attn_fail(err, ATTN_ERR_NULL, "%s is NULL", name);
    if (!t->data) return attn_fail(err, ATTN_ERR_NULL, "%s->data is NULL", name);
    int64_t span = 0, count = 1;
    for (int d = 0; d < 4; d++) {
        if (t->dim[d] <= 0)
            return attn_fail(err, ATTN_ERR_SHAPE, "%s: dim %s = %lld must be > 0", name,
                             kDimName[d], (long long)t->dim[d]);
        /* INT64_MIN has no magnitude in int64: reject it before negating. */
        if (t->stride[d] == INT64_MIN)
            return attn_fail(err, ATTN_ERR_OVERFLOW, "%s: stride %s = INT64_MIN overflows", name,
                             kDimName[d]);
        int64_t s = t->stride[d] < 0 ? -t->stride[d] : t->stride[d], reach;
        if (!attn_mul64(t->dim[d] - 1, s, &reach) || !attn_add64(span, reach, &span) ||
            !attn_mul64(count, t->dim[d], &count))
            return attn_fail(err, ATTN_ERR_OVERFLOW, "%s: shape [%lld, %lld, %lld, %lld] overflows",
                             name, (long long)t->dim[0], (long long)t->dim[1], (long long)t->dim[2],
                             (long long)t->dim[3]);
    }
    if ((uint64_t)span >= SIZE_MAX / sizeof(float) || (uint64_t)count >= SIZE_MAX / sizeof(float))
        return attn_fail(err, ATTN_ERR_OVERFLOW, "%s: size in bytes overflows size_t", name);
    return ATTN_OK;
}

attn_status attn_check_same_shape(const attn_tensor *t, const attn_tensor *like, const char *name,
                                  const char *like_name, attn_error *err) {
    attn_status s = attn_check_tensor(t, name, err);
    if (s) return s;
    for (int d = 0; d < 4; d++)
        if (t->dim[d] != like->dim[d])
            return attn_fail(err, ATTN_ERR_SHAPE, "%s dim %s = %lld does not match %s's %lld", name,
                             kDimName[d], (long long)t->dim[d], like_name, (long long)like->dim[d]);
    return ATTN_OK;
}

static attn_status check_mask(const attn_mask *m, const char *name, const attn_problem *pr,
                              int64_t strides[4], attn_error *err) {
    if (!m->data) return attn_fail(err, ATTN_ERR_NULL, "%s->data is NULL", name);
    const int64_t want[4] = {pr->B, pr->H, pr->Lq, pr->Lk};
    for (int d = 0; d < 4; d++) {
        int ok = m->dim[d] == want[d] || (d < 2 && m->dim[d] == 1);
        if (!ok)
            return attn_fail(err, ATTN_ERR_MASK,
                             "%s of shape [%lld, %lld, %lld, %lld] does not broadcast to "
                             "[B=%lld, H=%lld, Lq=%lld, Lk=%lld] (dims 0-1 may be 1)",
                             name, (long long)m->dim[0], (long long)m->dim[1], (long long)m->dim[2],
                             (long long)m->dim[3], (long long)pr->B, (long long)pr->H,
                             (long long)pr->Lq, (long long)pr->Lk);
        strides[d] = m->dim[d] == 1 ? 0 : m->stride[d];
    }
    attn_tensor probe = {(float *)(uintptr_t)m->data,
                         {m->dim[0], m->dim[1], m->dim[2], m->dim[3]},
                         {strides[0], strides[1], strides[2], strides[3]}};
    return attn_check_tensor(&probe, name, err);
}

attn_status attn_sdpa_check(const attn_tensor *q, const attn_tensor *k, const attn_tensor *v,
                            const attn_tensor *out, const attn_sdpa_params *p, attn_problem *pr,
                            attn_error *err) {
    static const attn_sdpa_params defaults;
    if (!p) p = &defaults;
    attn_status s;
    if ((s = attn_check_tensor(q, "q", err)) || (s = attn_check_tensor(k, "k", err)) ||
        (s = attn_check_tensor(v, "v", err)))
        return s;
    *pr = (attn_problem){0};
    pr->B = q->dim[0];
    pr->H = q->dim[1];
    pr->Lq = q->dim[2];
    pr->Dk = q->dim[3];
    pr->Lk = k->dim[2];
    pr->Dv = v->dim[3];
    pr->Hkv = k->dim[1];
    if (k->dim[0] != pr->B || v->dim[0] != pr->B || v->dim[1] != pr->Hkv)
        return attn_fail(err, ATTN_ERR_SHAPE,
                         "batch/head dims differ: q [%lld, %lld], k [%lld, %lld], v [%lld, %lld] "
                         "(k and v share B and their head count H_kv; q shares B)",
                         (long long)q->dim[0], (long long)q->dim[1], (long long)k->dim[0],
                         (long long)k->dim[1], (long long)v->dim[0], (long long)v->dim[1]);
    if (pr->H % pr->Hkv)
        return attn_fail(err, ATTN_ERR_SHAPE,
                         "q has %lld heads, k and v %lld: the query heads must be a multiple of "
                         "the key/value heads (grouped-query attention)",
                         (long long)pr->H, (long long)pr->Hkv);
    pr->group = pr->H / pr->Hkv;
    if (k->dim[3] != pr->Dk)
        return attn_fail(err, ATTN_ERR_SHAPE, "k head size %lld != q head size %lld",
                         (long long)k->dim[3], (long long)pr->Dk);
    if (v->dim[2] != pr->Lk)
        return attn_fail(err, ATTN_ERR_SHAPE, "v length %lld != k length %lld",
                         (long long)v->dim[2], (long long)pr->Lk);
    if (out) {
        attn_tensor want = {0, {pr->B, pr->H, pr->Lq, pr->Dv}, {0, 0, 0, 0}};
        if ((s = attn_check_same_shape(out, &want, "out", "[B, H, Lq, Dv]", err))) return s;
    }
    int64_t bh, rows, cells;
    if (!attn_mul64(pr->B, pr->H, &bh) || !attn_mul64(bh, pr->Lq, &rows) ||
        !attn_mul64(rows, pr->Lk, &cells) || (uint64_t)cells >= SIZE_MAX / sizeof(float) ||
        (uint64_t)cells >= (uint64_t)INT64_MAX / sizeof(float))
        return attn_fail(err, ATTN_ERR_OVERFLOW, "B*H*Lq*Lk = %lld*%lld*%lld*%lld overflows",
                         (long long)pr->B, (long long)pr->H, (long long)pr->Lq, (long long)pr->Lk);
    if (pr->Lq > UINT32_MAX || pr->Lk / 4 > UINT32_MAX || pr->H > UINT32_MAX || pr->B > UINT32_MAX)
        return attn_fail(err, ATTN_ERR_OVERFLOW, "a dimension exceeds 2^32");

    if (!p->use_scale && p->scale != 0.0f)
        return attn_fail(err, ATTN_ERR_ARG,
                         "scale is %g but use_scale is 0: set use_scale = 1 to use it (since 0.2 "
                         "scale 0 no longer means 1/sqrt(d_k); leave both 0 for that)",
                         (double)p->scale);
    if (!isfinite(p->scale))
        return attn_fail(err, ATTN_ERR_ARG, "scale must be finite, got %g", (double)p->scale);
    pr->scale = p->use_scale ? p->scale : 1.0f / sqrtf((float)pr->Dk);

    if (!p->use_softcap && p->softcap != 0.0f)
        return attn_fail(err, ATTN_ERR_ARG,
                         "softcap is %g but use_softcap is 0: set use_softcap = 1 to use it",
                         (double)p->softcap);
    if (p->use_softcap) {
        if (!(p->softcap > 0.0f) || !isfinite(p->softcap))
            return attn_fail(err, ATTN_ERR_ARG, "softcap must be finite and > 0, got %g",
                             (double)p->softcap);
        pr->softcap = p->softcap;
    }
    if (p->alibi_slopes) {
        for (int64_t h = 0; h < pr->H; h++)
            if (!isfinite(p->alibi_slopes[h]))
                return attn_fail(err, ATTN_ERR_ARG, "alibi_slopes[%lld] = %g is not finite",
                                 (long long)h, (double)p->alibi_slopes[h]);
        pr->alibi = p->alibi_slopes;
    }
    if (p->sinks) {
        for (int64_t h = 0; h < pr->H; h++)
            if (!isfinite(p->sinks[h]))
                return attn_fail(err, ATTN_ERR_ARG, "sinks[%lld] = %g is not finite",
                                 (long long)h, (double)p->sinks[h]);
        pr->sinks = p->sinks;
    }

    pr->causal = p->causal != 0;
    if (p->key_lengths) {
        for (int64_t b = 0; b < pr->B; b++)
            if (p->key_lengths[b] < 0 || p->key_lengths[b] > pr->Lk)
                return attn_fail(err, ATTN_ERR_MASK,
                                 "key_lengths[%lld] = %lld outside [0, Lk=%lld]", (long long)b,
                                 (long long)p->key_lengths[b], (long long)pr->Lk);
        pr->key_lengths = p->key_lengths;
    }
    if (p->use_window) {
        if (p->window_left < ATTN_UNBOUNDED || p->window_right < ATTN_UNBOUNDED)
            return attn_fail(err, ATTN_ERR_ARG,
                             "window (%lld, %lld): each side must be >= 0 or ATTN_UNBOUNDED (-1)",
                             (long long)p->window_left, (long long)p->window_right);
        /* A side at least Lq + Lk wide excludes nothing: treat it as
         * unbounded so the range arithmetic cannot overflow. */
        const int64_t span = pr->Lq + pr->Lk;
        pr->use_window = 1;
        pr->window_left = p->window_left >= span ? ATTN_UNBOUNDED : p->window_left;
        pr->window_right = p->window_right >= span ? ATTN_UNBOUNDED : p->window_right;
    }
    if (p->bool_mask) {
        if ((s = check_mask(p->bool_mask, "bool_mask", pr, pr->bms, err))) return s;
        pr->bmask = (const uint8_t *)p->bool_mask->data;
    }
    if (p->add_mask) {
        if ((s = check_mask(p->add_mask, "add_mask", pr, pr->ams, err))) return s;
        pr->amask = (const float *)p->add_mask->data;
    }

    if (!(p->dropout_p >= 0.0f && p->dropout_p < 1.0f))
        return attn_fail(err, ATTN_ERR_ARG, "dropout_p must be in [0, 1), got %g",
                         (double)p->dropout_p);
    if (p->training && p->dropout_p > 0.0f) {
        pr->dropout = 1;
        double t = ldexp((double)p->dropout_p, 32);
        pr->drop_threshold = t >= 4294967295.0 ? UINT32_MAX : (uint32_t)t;
        pr->keep_scale = 1.0f / (1.0f - p->dropout_p);
        pr->drop_key = attn_dropout_key(p->seed, p->offset);
        if (p->dropout_row0 < 0 || p->dropout_row0 > ((int64_t)1 << 32) - pr->B)
            return attn_fail(err, ATTN_ERR_ARG,
                             "dropout_row0 %lld: need 0 <= dropout_row0 and dropout_row0 + B "
                             "(%lld) <= 2^32",
                             (long long)p->dropout_row0, (long long)pr->B);
        pr->drop_b0 = p->dropout_row0;
    }
    if (p->impl != ATTN_IMPL_AUTO && p->impl != ATTN_IMPL_REFERENCE && p->impl != ATTN_IMPL_FUSED)
        return attn_fail(err, ATTN_ERR_ARG, "impl %d is not an attn_impl value", (int)p->impl);
    if ((p->dtype != ATTN_DTYPE_DEFAULT && p->dtype != ATTN_F32 && p->dtype != ATTN_BF16) ||
        (p->out_dtype != ATTN_DTYPE_DEFAULT && p->out_dtype != ATTN_F32 &&
         p->out_dtype != ATTN_BF16))
        return attn_fail(err, ATTN_ERR_ARG,
                         "dtype %d / out_dtype %d: each must be ATTN_DTYPE_DEFAULT (0), ATTN_F32 "
                         "(1) or ATTN_BF16 (2)",
                         (int)p->dtype, (int)p->out_dtype);
    /* Resolved here, so every kernel sees only ATTN_F32 or ATTN_BF16:
     * dtype 0 is fp32, out_dtype 0 is dtype's. */
    pr->dtype = p->dtype == ATTN_BF16 ? ATTN_BF16 : ATTN_F32;
    pr->out_dtype = p->out_dtype == ATTN_DTYPE_DEFAULT ? pr->dtype : p->out_dtype;
    if (pr->out_dtype == ATTN_BF16 && pr->dtype != ATTN_BF16)
        return attn_fail(err, ATTN_ERR_ARG,
                         "out_dtype ATTN_BF16 needs dtype ATTN_BF16 (fp32 inputs give fp32 out)");
    if (p->num_threads < 0 || p->num_threads > ATTN_MAX_THREADS)
        return attn_fail(err, ATTN_ERR_ARG, "num_threads must be in [0, %d], got %d",
                         ATTN_MAX_THREADS, p->num_threads);
    pr->threads = attn_threads_for(p->num_threads);
    return ATTN_OK;
}

/* ------------------------------------------------------------- aliasing */

/* A view's bytes: element (i0..i3) at lo + sum i_d * s[d], each esize bytes
 * long; strides made positive (a negative stride's lowest address is its
 * last element), so the set of addresses is the same. */
typedef struct {
    uintptr_t lo, hi; /* [lo, hi): every byte the view can touch */
    int64_t n[4];
    uint64_t s[4], esize;
} byte_view;

/* attn_check_tensor bounded each view: (dim - 1) * |stride| summed over the
 * dims is below 2^62 elements, so the byte counts fit in uint64. */
static byte_view view_of(const attn_alias_view *v) {
    byte_view b = {(uintptr_t)v->data, 0, {0}, {0}, (uint64_t)v->esize};
    uint64_t span = b.esize;
    for (int d = 0; d < 4; d++) {
        int64_t st = v->stride[d];
        uint64_t sb = (st < 0 ? (uint64_t)0 - (uint64_t)st : (uint64_t)st) * b.esize;
        uint64_t reach = (uint64_t)(v->dim[d] - 1) * sb;
        b.n[d] = v->dim[d];
        if (st < 0) b.lo -= (uintptr_t)reach;
        b.s[d] = sb;
        span += reach;
    }
    b.hi = b.lo + (uintptr_t)span;
    return b;
}

attn_alias_view attn_alias_tensor(const attn_tensor *t, const char *name, int bf16) {
    attn_alias_view v = {name, t->data, {0}, {0}, bf16 ? 2 : 4};
    for (int d = 0; d < 4; d++) v.dim[d] = t->dim[d], v.stride[d] = t->stride[d];
    return v;
}

attn_alias_view attn_alias_floats(const float *data, int64_t n, const char *name) {
    attn_alias_view v = {name, n > 0 ? data : NULL, {n, 1, 1, 1}, {1, 1, 1, 1}, 4};
    return v; /* n 0 (a varlen call without weights to write): nothing */
}

typedef __int128 i128;

static i128 floor_div(i128 a, i128 b) { /* b > 0 */
    i128 q = a / b;
    return (a % b != 0 && a < 0) ? q - 1 : q;
}

/* Strides (bytes) of the two views merged: index differences k_g of one
 * stride s_g range over [kmin_g, kmax_g] (a's indices count negatively,
 * b's positively; both views' dims of one stride add their ranges, and a
 * sum of integer ranges is an integer range). */
typedef struct {
    i128 s, kmin, kmax;
} stride_group;

/* Is there a k with L < sum_{h >= g} k_h s_h < U? Groups sorted by stride,
 * largest first; at each only the k_g that the inner groups' reach can
 * still bring into (L, U) are tried (1 or 2 for a nested layout). *work
 * counts the nodes; at 0 the answer is "cannot tell" (2). */
static int find_overlap(const stride_group *gr, int ng, int g, i128 L, i128 U, long *work) {
    if (--*work <= 0) return 2;
    if (g == ng) return L < 0 && 0 < U;
    i128 in_lo = 0, in_hi = 0;
    for (int h = g + 1; h < ng; h++) in_lo += gr[h].kmin * gr[h].s, in_hi += gr[h].kmax * gr[h].s;
    /* need k s_g in (L - in_hi, U - in_lo) */
    i128 k0 = floor_div(L - in_hi, gr[g].s) + 1, k1 = -floor_div(-(U - in_lo), gr[g].s) - 1;
    if (k0 < gr[g].kmin) k0 = gr[g].kmin;
    if (k1 > gr[g].kmax) k1 = gr[g].kmax;
    for (i128 k = k0; k <= k1; k++) {
        int r = find_overlap(gr, ng, g + 1, L - k * gr[g].s, U - k * gr[g].s, work);
        if (r) return r;
    }
    return 0;
}

/* 0: a and b share no byte; 1: they do; 2: could not settle (treated as 1). */
static int views_overlap(const attn_alias_view *va, const attn_alias_view *vb) {
    byte_view a = view_of(va), b = view_of(vb);
    if (a.hi <= b.lo || b.hi <= a.lo) return 0;
    stride_group gr[8];
    int ng = 0;
    for (int v = 0; v < 2; v++) {
        const byte_view *x = v ? &b : &a;
        for (int d = 0; d < 4; d++) {
            if (x->n[d] <= 1 || x->s[d] == 0) continue;
            i128 lo = v ? 0 : -(i128)(x->n[d] - 1), hi = v ? (i128)(x->n[d] - 1) : 0;
            int g = 0;
            while (g < ng && gr[g].s != (i128)x->s[d]) g++;
            if (g == ng) gr[ng++] = (stride_group){(i128)x->s[d], 0, 0};
            gr[g].kmin += lo, gr[g].kmax += hi;
        }
    }
    for (int i = 1; i < ng; i++) /* insertion sort, largest stride first */
        for (int j = i; j > 0 && gr[j].s > gr[j - 1].s; j--) {
            stride_group t = gr[j];
            gr[j] = gr[j - 1], gr[j - 1] = t;
        }
    /* a's element at x, b's at y = x + delta + sum k s: bytes overlap iff
     * -b.esize < y - x < a.esize. delta fits: the two spans intersect. */
    i128 delta = (i128)b.lo - (i128)a.lo;
    long work = 1L << 16;
    return find_overlap(gr, ng, 0, -(i128)b.esize - delta, (i128)a.esize - delta, &work);
}

attn_status attn_check_alias(const attn_alias_view *in, int nin, const attn_alias_view *out,
                             int nout, attn_error *err) {
    for (int o = 0; o < nout; o++) {
        if (!out[o].data) continue;
        for (int j = 0; j < nin + o; j++) {
            const attn_alias_view *other = j < nin ? &in[j] : &out[j - nin];
            if (!other->data) continue;
            int r = views_overlap(&out[o], other);
            if (r == 1)
                return attn_fail(err, ATTN_ERR_ALIAS,
                                 "%s shares memory with %s: outputs must not overlap the inputs "
                                 "or one another",
                                 out[o].name, other->name);
            if (r == 2)
                return attn_fail(err, ATTN_ERR_ALIAS,
                                 "%s may share memory with %s (their strides interleave too "
                                 "intricately to check): give them separate buffers",
                                 out[o].name, other->name);
        }
    }
    return ATTN_OK;
}
