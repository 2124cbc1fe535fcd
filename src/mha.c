/* Multi-head attention layer, batch first, PyTorch's parameter layout.
 *
 * Forward, with M = B*Lq rows of queries and N = B*Lk rows of keys, H query
 * heads and H_kv key/value heads of Dh = E/H each (Ekv = H_kv·Dh; H_kv = H,
 * Ekv = E without grouped-query attention):
 *   Qp [B, Lq, E]   = query Wqᵀ + bq      Kp [B, Lk, Ekv] = key Wkᵀ + bk
 *   Vp [B, Lk, Ekv] = value Wvᵀ + bv
 *   Ao [B, Lq, E] = SDPA over the [B, H, Lq, Dh] view of Qp and the
 *                   [B, H_kv, Lk, Dh] views of Kp, Vp (the SDPA call maps
 *                   query head h to K/V head h / (H/H_kv))
 *   out [B, Lq, E] = Ao Woᵀ + bo
 * The cache holds Qp | Kp | Vp | Ao | lse [B, H, Lq], which is everything
 * the backward reads besides the inputs and the weights. */
#include "internal.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
    int64_t E, H, Dh, kdim, vdim;
    int64_t Hkv, Ekv; /* key/value heads, and their width Hkv·Dh */
} mha_dims;

static attn_status check_config(const attn_mha_config *c, mha_dims *d, attn_error *err) {
    if (!c) return attn_fail(err, ATTN_ERR_NULL, "config is NULL");
    if (c->embed_dim <= 0 || c->num_heads <= 0)
        return attn_fail(err, ATTN_ERR_SHAPE, "embed_dim (%lld) and num_heads (%lld) must be > 0",
                         (long long)c->embed_dim, (long long)c->num_heads);
    if (c->embed_dim % c->num_heads)
        return attn_fail(err, ATTN_ERR_SHAPE, "embed_dim %lld is not divisible by num_heads %lld",
                         (long long)c->embed_dim, (long long)c->num_heads);
    if (c->kdim < 0 || c->vdim < 0)
        return attn_fail(err, ATTN_ERR_SHAPE,
                         "kdim (%lld) and vdim (%lld) must be >= 0 (0: embed_dim)",
                         (long long)c->kdim, (long long)c->vdim);
    /* 0 is "as many as num_heads" (zero-initialised configs stay plain MHA) */
    if (c->num_kv_heads < 0 || c->num_kv_heads > c->num_heads ||
        (c->num_kv_heads && c->num_heads % c->num_kv_heads))
        return attn_fail(err, ATTN_ERR_SHAPE,
                         "num_kv_heads %lld: must divide num_heads %lld (1..num_heads; 0 for "
                         "num_heads)",
                         (long long)c->num_kv_heads, (long long)c->num_heads);
    d->E = c->embed_dim;
    d->H = c->num_heads;
    d->Dh = d->E / d->H;
    d->Hkv = c->num_kv_heads ? c->num_kv_heads : d->H;
    d->Ekv = d->Hkv * d->Dh;
    d->kdim = c->kdim ? c->kdim : d->E;
    d->vdim = c->vdim ? c->vdim : d->E;
    if (d->E > (1 << 20) || d->kdim > (1 << 20) || d->vdim > (1 << 20))
        return attn_fail(err, ATTN_ERR_OVERFLOW, "embed_dim, kdim and vdim must be <= 2^20");
    return ATTN_OK;
}

attn_status attn_mha_param_count(const attn_mha_config *c, size_t *count, attn_error *err) {
    mha_dims d = {0};
    attn_status s = check_config(c, &d, err);
    if (s) return s;
    if (!count) return attn_fail(err, ATTN_ERR_NULL, "count is NULL");
    /* w_q, w_o [E, E]; w_k [Ekv, kdim], w_v [Ekv, vdim]; b_q, b_o [E], b_k, b_v [Ekv] */
    *count =
        (size_t)(2 * d.E * d.E + d.Ekv * (d.kdim + d.vdim) + (c->bias ? 2 * d.E + 2 * d.Ekv : 0));
    return attn_ok(err);
}

attn_status attn_mha_weights_from_buffer(const attn_mha_config *c, float *buf, attn_mha_weights *w,
                                         attn_error *err) {
    mha_dims d = {0};
    attn_status s = check_config(c, &d, err);
    if (s) return s;
    if (!buf || !w) return attn_fail(err, ATTN_ERR_NULL, "buffer or weights is NULL");
    const int64_t E = d.E, Ekv = d.Ekv;
    w->w_q = buf;
    w->w_k = w->w_q + E * E;
    w->w_v = w->w_k + Ekv * d.kdim;
    float *next = w->w_v + Ekv * d.vdim;
    if (c->bias) {
        w->b_q = next;
        w->b_k = next + E;
        w->b_v = next + E + Ekv;
        next += E + 2 * Ekv;
    } else {
        w->b_q = w->b_k = w->b_v = NULL;
    }
    w->w_o = next;
    w->b_o = c->bias ? next + E * E : NULL;
    return attn_ok(err);
}

static attn_status check_weights(const attn_mha_config *c, const attn_mha_weights *w,
                                 const char *name, attn_error *err) {
    if (!w) return attn_fail(err, ATTN_ERR_NULL, "%s is NULL", name);
    if (!w->w_q || !w->w_k || !w->w_v || !w->w_o)
        return attn_fail(err, ATTN_ERR_NULL, "%s: w_q, w_k, w_v and w_o must all be set", name);
    if (c->bias && (!w->b_q || !w->b_k || !w->b_v || !w->b_o))
        return attn_fail(err, ATTN_ERR_NULL, "%s: bias is on but a bias pointer is NULL", name);
    return ATTN_OK;
}

/* Uniform floats in [-bound, bound) from a splitmix64 stream. */
static void fill_uniform(float *x, int64_t n, float bound, uint64_t *state) {
    for (int64_t i = 0; i < n; i++) {
        uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        z ^= z >> 31;
        float u = (float)(z >> 40) * (1.0f / 16777216.0f); /* [0, 1) */
        x[i] = (2.0f * u - 1.0f) * bound;
    }
}

attn_status attn_mha_init(const attn_mha_config *c, const attn_mha_weights *w, uint64_t seed,
                          attn_error *err) {
    mha_dims d = {0};
    attn_status s = check_config(c, &d, err);
    if (s || (s = check_weights(c, w, "weights", err))) return s;
    const int64_t E = d.E, Ekv = d.Ekv;
    uint64_t st = seed;
    if (d.kdim == E && d.vdim == E) {
        /* one Xavier bound over the stacked in_proj [E + 2·Ekv, E] (PyTorch's
         * [3E, E] when H_kv = H) */
        const float bound = sqrtf(6.0f / (float)(E + E + 2 * Ekv));
        fill_uniform(w->w_q, E * E, bound, &st);
        fill_uniform(w->w_k, Ekv * E, bound, &st);
        fill_uniform(w->w_v, Ekv * E, bound, &st);
    } else {
        fill_uniform(w->w_q, E * E, sqrtf(6.0f / (float)(E + E)), &st);
        fill_uniform(w->w_k, Ekv * d.kdim, sqrtf(6.0f / (float)(d.kdim + Ekv)), &st);
        fill_uniform(w->w_v, Ekv * d.vdim, sqrtf(6.0f / (float)(d.vdim + Ekv)), &st);
    }
    fill_uniform(w->w_o, E * E, 1.0f / sqrtf((float)E), &st);
    if (c->bias) {
        memset(w->b_q, 0, (size_t)E * sizeof(float));
        memset(w->b_k, 0, (size_t)Ekv * sizeof(float));
        memset(w->b_v, 0, (size_t)Ekv * sizeof(float));
        memset(w->b_o, 0, (size_t)E * sizeof(float));
    }
    return attn_ok(err);
}

static attn_status check_call(const mha_dims *d, int64_t B, int64_t Lq, int64_t Lk,
                              attn_error *err) {
    if (B <= 0 || Lq <= 0 || Lk <= 0)
        return attn_fail(err, ATTN_ERR_SHAPE, "B (%lld), Lq (%lld) and Lk (%lld) must be > 0",
                         (long long)B, (long long)Lq, (long long)Lk);
    int64_t m, n, widest = d->E;
    if (d->kdim > widest) widest = d->kdim;
    if (d->vdim > widest) widest = d->vdim;
    /* The BLAS takes 32-bit sizes: every operand must stay below 2^31 elements. */
    if (!attn_mul64(B, Lq > Lk ? Lq : Lk, &m) || !attn_mul64(m, widest, &n) || n >= INT32_MAX)
        return attn_fail(err, ATTN_ERR_OVERFLOW, "B*L*E = %lld*%lld*%lld is too large (limit 2^31)",
                         (long long)B, (long long)(Lq > Lk ? Lq : Lk), (long long)widest);
    return ATTN_OK;
}

attn_status attn_mha_cache_size(const attn_mha_config *c, int64_t B, int64_t Lq, int64_t Lk,
                                size_t *count, attn_error *err) {
    mha_dims d = {0};
    attn_status s = check_config(c, &d, err);
    if (s || (s = check_call(&d, B, Lq, Lk, err))) return s;
    if (!count) return attn_fail(err, ATTN_ERR_NULL, "count is NULL");
    *count = (size_t)(B * (2 * Lq * d.E + 2 * Lk * d.Ekv + d.H * Lq));
    return attn_ok(err);
}

/* Y [rows, E] = X [rows, in] Wᵀ + b, W [E, in]. */
static void project(const float *X, int64_t rows, int64_t in, const float *W, const float *bias,
                    int64_t E, float *Y, int threads) {
    if (bias)
        for (int64_t r = 0; r < rows; r++) memcpy(Y + r * E, bias, (size_t)E * sizeof(float));
    attn_sgemm(0, 1, rows, E, in, 1.0f, X, in, W, in, bias ? 1.0f : 0.0f, Y, E, threads);
}

/* Gradients of project, added to the caller's buffers: dW += dYᵀ X,
 * db += colsum(dY), dX += dY W (dX may be NULL). Each is computed whole in
 * scratch [max(E, rows) * in] and then added, so accumulating is exactly
 * old + fresh, whatever blocking the BLAS uses. */
static void project_backward(const float *X, int64_t rows, int64_t in, const float *W, int64_t E,
                             const float *dY, float *dW, float *db, float *dX, float *scratch,
                             int threads) {
    attn_sgemm(1, 0, E, in, rows, 1.0f, dY, E, X, in, 0.0f, scratch, in, threads);
    for (int64_t x = 0; x < E * in; x++) dW[x] += scratch[x];
    if (db) {
        memset(scratch, 0, (size_t)E * sizeof(float));
        for (int64_t r = 0; r < rows; r++)
            for (int64_t e = 0; e < E; e++) scratch[e] += dY[r * E + e];
        for (int64_t e = 0; e < E; e++) db[e] += scratch[e];
    }
    if (dX) {
        attn_sgemm(0, 0, rows, in, E, 1.0f, dY, E, W, in, 0.0f, scratch, in, threads);
        for (int64_t x = 0; x < rows * in; x++) dX[x] += scratch[x];
    }
}

attn_status attn_mha_forward(const attn_mha_config *c, const attn_mha_weights *w, int64_t B,
                             int64_t Lq, int64_t Lk, const float *query, const float *key,
                             const float *value, const attn_sdpa_params *p, float *out,
                             attn_weights_mode mode, float *weights, float *cache,
                             attn_error *err) {
    mha_dims d = {0};
    attn_status s = check_config(c, &d, err);
    if (s || (s = check_weights(c, w, "weights", err)) || (s = check_call(&d, B, Lq, Lk, err)))
        return s;
    if (p && ((p->dtype != ATTN_DTYPE_DEFAULT && p->dtype != ATTN_F32) ||
              (p->out_dtype != ATTN_DTYPE_DEFAULT && p->out_dtype != ATTN_F32)))
        return attn_fail(err, ATTN_ERR_ARG,
                         "multi-head attention is fp32 only (p->dtype, out_dtype)");
    if (!query || !key || !value || !out)
        return attn_fail(err, ATTN_ERR_NULL, "query, key, value and out must be non-NULL");
    if (mode != ATTN_WEIGHTS_NONE && mode != ATTN_WEIGHTS_PER_HEAD && mode != ATTN_WEIGHTS_AVERAGE)
        return attn_fail(err, ATTN_ERR_ARG, "weights mode %d is not an attn_weights_mode",
                         (int)mode);
    if (mode != ATTN_WEIGHTS_NONE && !weights)
        return attn_fail(err, ATTN_ERR_NULL, "weights buffer is NULL but weights were requested");
    const int64_t E = d.E, H = d.H, Ekv = d.Ekv;
    if (p && (p->num_threads < 0 || p->num_threads > ATTN_MAX_THREADS))
        return attn_fail(err, ATTN_ERR_ARG, "num_threads must be in [0, %d], got %d",
                         ATTN_MAX_THREADS, p->num_threads);
    const int threads = attn_threads_for(p ? p->num_threads : 0);
    size_t ncache;
    attn_mha_cache_size(c, B, Lq, Lk, &ncache, NULL);
    float *buf = cache;
    if (!buf && !(buf = malloc(ncache * sizeof(float))))
        return attn_fail(err, ATTN_ERR_NOMEM, "out of memory for %zu floats of activations",
                         ncache);
    /* Qp [B, Lq, E] | Kp, Vp [B, Lk, Ekv] | Ao [B, Lq, E] | lse [B, H, Lq] */
    float *Qp = buf, *Kp = Qp + B * Lq * E, *Vp = Kp + B * Lk * Ekv, *Ao = Vp + B * Lk * Ekv;
    float *lse = Ao + B * Lq * E;
    float *wtmp = NULL; /* [B, H, Lq, Lk] per-head weights before averaging */
    if (mode == ATTN_WEIGHTS_AVERAGE &&
        !(wtmp = malloc((size_t)(B * H * Lq * Lk) * sizeof(float)))) {
        if (!cache) free(buf);
        return attn_fail(err, ATTN_ERR_NOMEM, "out of memory for per-head weights");
    }
    project(query, B * Lq, E, w->w_q, w->b_q, E, Qp, threads);
    project(key, B * Lk, d.kdim, w->w_k, w->b_k, Ekv, Kp, threads);
    project(value, B * Lk, d.vdim, w->w_v, w->b_v, Ekv, Vp, threads);
    attn_tensor tq = attn_tensor_blhd(Qp, B, H, Lq, d.Dh),
                tk = attn_tensor_blhd(Kp, B, d.Hkv, Lk, d.Dh),
                tv = attn_tensor_blhd(Vp, B, d.Hkv, Lk, d.Dh),
                to = attn_tensor_blhd(Ao, B, H, Lq, d.Dh);
    float *wout = mode == ATTN_WEIGHTS_PER_HEAD ? weights : wtmp;
    s = attn_sdpa_forward(&tq, &tk, &tv, p, &to, wout, lse, NULL, err);
    if (!s) {
        project(Ao, B * Lq, E, w->w_o, w->b_o, E, out, threads);
        if (mode == ATTN_WEIGHTS_AVERAGE) {
            const float inv = 1.0f / (float)H;
            for (int64_t b = 0; b < B; b++)
                for (int64_t x = 0; x < Lq * Lk; x++) {
                    float acc = 0.0f;
                    for (int64_t h = 0; h < H; h++) acc += wtmp[(b * H + h) * Lq * Lk + x];
                    weights[b * Lq * Lk + x] = acc * inv;
                }
        }
    }
    free(wtmp);
    if (!cache) free(buf);
    return s ? s : attn_ok(err);
}

attn_status attn_mha_backward(const attn_mha_config *c, const attn_mha_weights *w, int64_t B,
                              int64_t Lq, int64_t Lk, const float *query, const float *key,
                              const float *value, const attn_sdpa_params *p, const float *cache,
                              const float *grad_out, float *d_query, float *d_key, float *d_value,
                              const attn_mha_weights *g, attn_error *err) {
    mha_dims d = {0};
    attn_status s = check_config(c, &d, err);
    if (s || (s = check_weights(c, w, "weights", err)) || (s = check_weights(c, g, "grads", err)) ||
        (s = check_call(&d, B, Lq, Lk, err)))
        return s;
    if (p && ((p->dtype != ATTN_DTYPE_DEFAULT && p->dtype != ATTN_F32) ||
              (p->out_dtype != ATTN_DTYPE_DEFAULT && p->out_dtype != ATTN_F32)))
        return attn_fail(err, ATTN_ERR_ARG,
                         "multi-head attention is fp32 only (p->dtype, out_dtype)");
    if (!query || !key || !value || !grad_out)
        return attn_fail(err, ATTN_ERR_NULL, "query, key, value and grad_out must be non-NULL");
    if (!cache)
        return attn_fail(err, ATTN_ERR_STATE,
                         "cache is NULL: run attn_mha_forward with a cache first");
    const int64_t E = d.E, H = d.H, Ekv = d.Ekv;
    if (p && (p->num_threads < 0 || p->num_threads > ATTN_MAX_THREADS))
        return attn_fail(err, ATTN_ERR_ARG, "num_threads must be in [0, %d], got %d",
                         ATTN_MAX_THREADS, p->num_threads);
    const int threads = attn_threads_for(p ? p->num_threads : 0);
    const float *Qp = cache, *Kp = Qp + B * Lq * E, *Vp = Kp + B * Lk * Ekv;
    const float *Ao = Vp + B * Lk * Ekv, *lse = Ao + B * Lq * E;
    /* Scratch: dAo [B, Lq, E], dQp [B, Lq, E], dKp, dVp [B, Lk, Ekv], then
     * project_backward's [max(E, B*max(Lq, Lk)) * max(E, kdim, vdim)]
     * (Ekv <= E outputs for the key and value projections). */
    const int64_t widest =
        d.E > d.kdim ? (d.E > d.vdim ? d.E : d.vdim) : (d.kdim > d.vdim ? d.kdim : d.vdim);
    const int64_t rows = B * (Lq > Lk ? Lq : Lk);
    float *tmp =
        malloc((size_t)(2 * B * Lq * E + 2 * B * Lk * Ekv + (rows > E ? rows : E) * widest) *
               sizeof(float));
    if (!tmp) return attn_fail(err, ATTN_ERR_NOMEM, "out of memory for backward scratch");
    float *dAo = tmp, *dQp = dAo + B * Lq * E, *dKp = dQp + B * Lq * E, *dVp = dKp + B * Lk * Ekv;
    float *scratch = dVp + B * Lk * Ekv;

    attn_sgemm(0, 0, B * Lq, E, E, 1.0f, grad_out, E, w->w_o, E, 0.0f, dAo, E, threads);
    project_backward(Ao, B * Lq, E, w->w_o, E, grad_out, g->w_o, g->b_o, NULL, scratch, threads);
    attn_tensor tq = attn_tensor_blhd((float *)Qp, B, H, Lq, d.Dh),
                tk = attn_tensor_blhd((float *)Kp, B, d.Hkv, Lk, d.Dh),
                tv = attn_tensor_blhd((float *)Vp, B, d.Hkv, Lk, d.Dh),
                to = attn_tensor_blhd((float *)Ao, B, H, Lq, d.Dh),
                tdo = attn_tensor_blhd(dAo, B, H, Lq, d.Dh),
                tdq = attn_tensor_blhd(dQp, B, H, Lq, d.Dh),
                tdk = attn_tensor_blhd(dKp, B, d.Hkv, Lk, d.Dh),
                tdv = attn_tensor_blhd(dVp, B, d.Hkv, Lk, d.Dh);
    /* d_sinks ACCUMULATES here like the layer's other gradients: the SDPA
     * backward writes a private copy, added after it succeeded */
    attn_sdpa_params sp;
    float ds_stack[64], *ds = NULL, *user_ds = NULL;
    if (p && p->sinks && p->d_sinks) {
        ds = H <= 64 ? ds_stack : malloc((size_t)H * sizeof *ds);
        if (!ds) {
            free(tmp);
            return attn_fail(err, ATTN_ERR_NOMEM, "out of memory for the sinks' gradient");
        }
        user_ds = p->d_sinks;
        sp = *p;
        sp.d_sinks = ds;
        p = &sp;
    }
    s = attn_sdpa_backward(&tq, &tk, &tv, &to, lse, &tdo, p, &tdq, &tdk, &tdv, NULL, err);
    if (ds && !s)
        for (int64_t h = 0; h < H; h++) user_ds[h] += ds[h];
    if (ds && ds != ds_stack) free(ds);
    if (!s) {
        project_backward(query, B * Lq, E, w->w_q, E, dQp, g->w_q, g->b_q, d_query, scratch,
                         threads);
        project_backward(key, B * Lk, d.kdim, w->w_k, Ekv, dKp, g->w_k, g->b_k, d_key, scratch,
                         threads);
        project_backward(value, B * Lk, d.vdim, w->w_v, Ekv, dVp, g->w_v, g->b_v, d_value, scratch,
                         threads);
    }
    free(tmp);
    return s ? s : attn_ok(err);
}

/* ------------------------------------------------------------ incremental step
 *
 * KV cache memory, from the caller's block rounded up to 64 bytes, each part
 * 64-byte aligned:
 *   len, klen [batch] int64    (positions held; a step's key lengths)
 *   k, v      [batch, max_len, Ekv]   (H_kv heads: H/H_kv times smaller)
 *   qp, ao    [batch, max_step, E]    (a step's query projection, attention out)
 *   kn, vn    [batch, max_step, Ekv]  (its new keys and values; qp..vn, which
 *                  are contiguous, also hold the stacked projection's rows
 *                  [rows, E + 2·Ekv])
 *   ws        the fused forward's scratch for the largest step
 * The step writes the new keys and values into k, v at each row's positions
 * and runs the fused forward on strided views of the cache. */

typedef struct {
    size_t len, klen, k, v, qp, kn, vn, ao, ws, total; /* byte offsets; total size */
    int64_t ws_floats;
} kv_layout;

static size_t up64(size_t x) { return (x + 63) / 64 * 64; }

/* The fused forward scratch that every step of the shape fits in: its
 * decode scratch grows with Lk except where the key chunk doubles (at
 * Lk = 64·C + 1 it falls), so the bound is the largest over Lk = max_len and
 * each Lk = 64·C below it; it grows with B, Lq and the threads. The tiled
 * forward (Lq > FUSED_DECODE_MAXLQ) does not depend on Lk. */
static int64_t kv_scratch_bound(const mha_dims *d, const attn_mha_kv_shape *s, int threads) {
    attn_problem pr;
    memset(&pr, 0, sizeof pr);
    pr.B = s->batch, pr.H = d->H, pr.Dk = pr.Dv = d->Dh, pr.threads = threads;
    pr.Hkv = d->Hkv, pr.group = d->H / d->Hkv;
    pr.Lq = s->max_step < FUSED_DECODE_MAXLQ ? s->max_step : FUSED_DECODE_MAXLQ;
    int64_t best = 0;
    for (int64_t C = FUSED_DECODE_CHUNK;; C *= 2) {
        pr.Lk = 64 * C < s->max_len ? 64 * C : s->max_len;
        const int64_t n = attn_fused_forward_scratch(&pr);
        best = n > best ? n : best;
        if (pr.Lk == s->max_len) break;
    }
    if (s->max_step > FUSED_DECODE_MAXLQ) {
        pr.Lq = s->max_step, pr.Lk = s->max_len;
        const int64_t n = attn_fused_forward_scratch(&pr);
        best = n > best ? n : best;
    }
    return best;
}

static attn_status kv_plan(const attn_mha_config *c, const attn_mha_kv_shape *s, mha_dims *d,
                           int *threads, kv_layout *lay, attn_error *err) {
    attn_status st = check_config(c, d, err);
    if (st) return st;
    if (!s) return attn_fail(err, ATTN_ERR_NULL, "kv shape is NULL");
    if (d->kdim != d->E || d->vdim != d->E)
        return attn_fail(err, ATTN_ERR_SHAPE,
                         "a KV cache is for self-attention: kdim (%lld) and vdim (%lld) must be "
                         "embed_dim (%lld)",
                         (long long)d->kdim, (long long)d->vdim, (long long)d->E);
    if (s->batch <= 0 || s->max_len <= 0 || s->max_step <= 0 || s->max_step > s->max_len)
        return attn_fail(err, ATTN_ERR_SHAPE,
                         "kv shape: batch (%lld) and max_len (%lld) must be > 0, max_step (%lld) "
                         "in [1, max_len]",
                         (long long)s->batch, (long long)s->max_len, (long long)s->max_step);
    if (s->threads < 0 || s->threads > ATTN_MAX_THREADS)
        return attn_fail(err, ATTN_ERR_ARG, "kv shape: threads must be in [0, %d], got %d",
                         ATTN_MAX_THREADS, s->threads);
    *threads = s->threads ? s->threads : attn_get_num_threads();
    int64_t cache, step;
    if ((st = check_call(d, s->batch, s->max_step, s->max_step, err))) return st;
    if (!attn_mul64(s->batch, s->max_len, &cache) || !attn_mul64(cache, d->Ekv, &cache) ||
        (uint64_t)cache > SIZE_MAX / 8 / sizeof(float))
        return attn_fail(err, ATTN_ERR_OVERFLOW,
                         "kv cache of %lld x %lld x %lld floats is too large", (long long)s->batch,
                         (long long)s->max_len, (long long)d->Ekv);
    step = s->batch * s->max_step * d->E; /* < 2^31 by check_call */
    lay->ws_floats = kv_scratch_bound(d, s, *threads);
    const size_t rows = up64((size_t)s->batch * sizeof(int64_t));
    const size_t kvb = up64((size_t)cache * sizeof(float)), sb = up64((size_t)step * sizeof(float));
    const size_t skv = up64((size_t)(s->batch * s->max_step * d->Ekv) * sizeof(float));
    const size_t wsb = up64((size_t)lay->ws_floats * sizeof(float));
    lay->len = 0, lay->klen = rows, lay->k = 2 * rows, lay->v = lay->k + kvb;
    lay->qp = lay->v + kvb, lay->kn = lay->qp + sb, lay->vn = lay->kn + skv,
    lay->ao = lay->vn + skv;
    lay->ws = lay->ao + sb;
    if (wsb > SIZE_MAX - lay->ws - 64)
        return attn_fail(err, ATTN_ERR_OVERFLOW, "kv cache scratch too large");
    lay->total = lay->ws + wsb + 64; /* + 64: the caller's block may start anywhere */
    return ATTN_OK;
}

attn_status attn_mha_kv_bytes(const attn_mha_config *c, const attn_mha_kv_shape *s, size_t *bytes,
                              attn_error *err) {
    mha_dims d = {0};
    kv_layout lay = {0};
    int threads = 1;
    attn_status st = kv_plan(c, s, &d, &threads, &lay, err);
    if (st) return st;
    if (!bytes) return attn_fail(err, ATTN_ERR_NULL, "bytes is NULL");
    *bytes = lay.total;
    return attn_ok(err);
}

attn_status attn_mha_kv_init(const attn_mha_config *c, const attn_mha_kv_shape *s, void *mem,
                             size_t bytes, attn_mha_kv *kv, attn_error *err) {
    mha_dims d = {0};
    kv_layout lay = {0};
    int threads = 1;
    attn_status st = kv_plan(c, s, &d, &threads, &lay, err);
    if (st) return st;
    if (!mem || !kv) return attn_fail(err, ATTN_ERR_NULL, "mem and kv must be non-NULL");
    if (bytes < lay.total)
        return attn_fail(err, ATTN_ERR_NOMEM,
                         "kv cache memory of %zu bytes, needs %zu (attn_mha_kv_bytes)", bytes,
                         lay.total);
    char *base = (char *)mem + (64 - (uintptr_t)mem % 64) % 64;
    memset(kv, 0, sizeof *kv);
    kv->len = (int64_t *)(base + lay.len);
    kv->k = (float *)(base + lay.k);
    kv->v = (float *)(base + lay.v);
    kv->batch = s->batch, kv->max_len = s->max_len, kv->max_step = s->max_step;
    kv->embed_dim = d.E, kv->num_heads = d.H, kv->num_kv_heads = d.Hkv, kv->threads = threads;
    kv->work = base + lay.klen;
    kv->work_bytes = lay.total - 64 - lay.klen;
    memset(kv->len, 0, (size_t)s->batch * sizeof(int64_t));
    /* keys past a row's length are read by no one, but stay finite */
    memset(kv->k, 0, (size_t)(lay.qp - lay.k));
    return attn_ok(err);
}

/* The step's arguments against kv, p and the row lengths; nothing written. */
static attn_status step_check(const attn_mha_config *c, const attn_mha_weights *w,
                              const attn_mha_kv *kv, int64_t n, int64_t Lq, const float *x,
                              const attn_sdpa_params *p, const float *out, mha_dims *d,
                              int *threads, attn_error *err) {
    attn_status s = check_config(c, d, err);
    if (s || (s = check_weights(c, w, "weights", err))) return s;
    if (!kv || !kv->len || !kv->k || !kv->v || !kv->work)
        return attn_fail(err, ATTN_ERR_NULL, "kv is NULL or not initialised (attn_mha_kv_init)");
    if (!x || !out) return attn_fail(err, ATTN_ERR_NULL, "x and out must be non-NULL");
    if (d->kdim != d->E || d->vdim != d->E || kv->embed_dim != d->E || kv->num_heads != d->H ||
        kv->num_kv_heads != d->Hkv)
        return attn_fail(err, ATTN_ERR_SHAPE,
                         "config (E %lld, H %lld, H_kv %lld, kdim %lld, vdim %lld) does not match "
                         "the kv cache's (E %lld, H %lld, H_kv %lld, self-attention)",
                         (long long)d->E, (long long)d->H, (long long)d->Hkv, (long long)d->kdim,
                         (long long)d->vdim, (long long)kv->embed_dim, (long long)kv->num_heads,
                         (long long)kv->num_kv_heads);
    if (n < 1 || n > kv->batch || Lq < 1 || Lq > kv->max_step)
        return attn_fail(err, ATTN_ERR_SHAPE,
                         "step of %lld rows x %lld positions: the cache takes 1..%lld rows and "
                         "1..%lld positions per step (max_step)",
                         (long long)n, (long long)Lq, (long long)kv->batch,
                         (long long)kv->max_step);
    if (p) {
        if (p->key_lengths || p->bool_mask || p->add_mask || p->use_window)
            return attn_fail(err, ATTN_ERR_ARG,
                             "the step takes no masks or window (its mask is the cache lengths "
                             "and causality)");
        if (p->training && p->dropout_p != 0.0f)
            return attn_fail(err, ATTN_ERR_ARG,
                             "the step takes no dropout (training with "
                             "dropout_p %g)",
                             (double)p->dropout_p);
        if (p->impl == ATTN_IMPL_REFERENCE)
            return attn_fail(err, ATTN_ERR_ARG,
                             "the step runs the fused path only (the reference path allocates); "
                             "attn_mha_forward is the oracle");
        if (p->num_threads < 0 || p->num_threads > ATTN_MAX_THREADS)
            return attn_fail(err, ATTN_ERR_ARG, "num_threads must be in [0, %d], got %d",
                             ATTN_MAX_THREADS, p->num_threads);
    }
    *threads = attn_threads_for(p ? p->num_threads : 0);
    if (*threads > kv->threads)
        return attn_fail(err, ATTN_ERR_NOMEM,
                         "the kv cache's scratch is sized for %d threads, this step runs %d: size "
                         "it for more (attn_mha_kv_shape.threads) or pass num_threads",
                         kv->threads, *threads);
    for (int64_t b = 0; b < n; b++) {
        if (kv->len[b] < 0 || kv->len[b] > kv->max_len)
            return attn_fail(err, ATTN_ERR_STATE, "kv len[%lld] = %lld is outside [0, %lld]",
                             (long long)b, (long long)kv->len[b], (long long)kv->max_len);
        if (kv->len[b] + Lq > kv->max_len)
            return attn_fail(err, ATTN_ERR_STATE,
                             "kv cache full: row %lld holds %lld of %lld positions, cannot append "
                             "%lld",
                             (long long)b, (long long)kv->len[b], (long long)kv->max_len,
                             (long long)Lq);
    }
    return ATTN_OK;
}

attn_status attn_mha_step(const attn_mha_config *c, const attn_mha_weights *w, attn_mha_kv *kv,
                          int64_t n, int64_t Lq, const float *x, const attn_sdpa_params *p,
                          float *out, attn_error *err) {
    mha_dims d = {0};
    int threads = 1;
    attn_status s = step_check(c, w, kv, n, Lq, x, p, out, &d, &threads, err);
    if (s) return s;
    const int64_t E = d.E, H = d.H, Dh = d.Dh, Hkv = d.Hkv, Ekv = d.Ekv, T = kv->max_len;
    const int64_t rows = n * Lq;
    kv_layout lay = {0};
    int ignored = 1;
    attn_mha_kv_shape shape = {kv->batch, kv->max_len, kv->max_step, kv->threads};
    kv_plan(c, &shape, &d, &ignored, &lay, NULL);
    char *base = (char *)kv->len; /* the layout's origin */
    int64_t *klen = (int64_t *)(base + lay.klen);
    float *Qp = (float *)(base + lay.qp), *Kn = (float *)(base + lay.kn);
    float *Vn = (float *)(base + lay.vn), *Ao = (float *)(base + lay.ao);
    float *ws = (float *)(base + lay.ws);

    /* The projections: one product over the stacked in_proj [E + 2·Ekv, E]
     * (PyTorch's [3E, E] when H_kv = H) when w_q, w_k, w_v (and the biases)
     * are stacked, as attn_mha_weights_from_buffer lays them out, into rows
     * of E + 2·Ekv (qp, kn, vn are contiguous in the layout); else three
     * products into rows of E, Ekv, Ekv. One product is one parallel region
     * instead of three (in a decode step, where the products are small, the
     * regions' wake-ups show). ldq, ldkv: the row strides of Qp and Kn, Vn. */
    const int stacked = w->w_k == w->w_q + E * E && w->w_v == w->w_k + Ekv * E &&
                        (!c->bias || (w->b_k == w->b_q + E && w->b_v == w->b_k + Ekv));
    const int64_t ldq = stacked ? E + 2 * Ekv : E, ldkv = stacked ? E + 2 * Ekv : Ekv;
    if (stacked) {
        project(x, rows, E, w->w_q, w->b_q, E + 2 * Ekv, Qp, threads);
        Kn = Qp + E, Vn = Qp + E + Ekv;
    } else {
        project(x, rows, E, w->w_q, w->b_q, E, Qp, threads);
        project(x, rows, E, w->w_k, w->b_k, Ekv, Kn, threads);
        project(x, rows, E, w->w_v, w->b_v, Ekv, Vn, threads);
    }
    int64_t Lk = 0;
    int uniform = 1;
    for (int64_t b = 0; b < n; b++) {
        for (int64_t i = 0; i < Lq; i++) {
            const size_t at = (size_t)((b * T + kv->len[b] + i) * Ekv),
                         from = (size_t)((b * Lq + i) * ldkv);
            memcpy(kv->k + at, Kn + from, (size_t)Ekv * sizeof(float));
            memcpy(kv->v + at, Vn + from, (size_t)Ekv * sizeof(float));
        }
        klen[b] = kv->len[b] + Lq;
        Lk = klen[b] > Lk ? klen[b] : Lk;
        uniform &= kv->len[b] == kv->len[0];
    }
    /* Causal with key_lengths is row b's mask exactly when its queries are
     * the last Lq of the Lk keys: one query per row, or rows of one length;
     * otherwise each row is its own call. ALiBi puts the queries at
     * i + Lk - Lq of the call's Lk, not of row b's length: with one query
     * that shifts row b's biases by a constant, which the softmax ignores,
     * but not the sinks' logits, so ALiBi with sinks over rows of several
     * lengths is one call per row too. */
    attn_sdpa_params sp;
    memset(&sp, 0, sizeof sp);
    if (p) { /* the score variants as in attn_mha_forward (the SDPA call checks them) */
        sp.use_scale = p->use_scale, sp.scale = p->scale, sp.impl = p->impl;
        sp.use_softcap = p->use_softcap, sp.softcap = p->softcap;
        sp.alibi_slopes = p->alibi_slopes, sp.sinks = p->sinks;
    }
    sp.num_threads = threads;
    sp.causal = 1;
    const int per_row = !uniform && (Lq > 1 || (sp.alibi_slopes && sp.sinks));
    const int64_t calls = per_row ? n : 1, nb = calls == 1 ? n : 1;
    for (int64_t r = 0; r < calls && !s; r++) {
        const int64_t lk = calls == 1 ? Lk : klen[r], off = r * T * Ekv;
        sp.key_lengths = calls == 1 ? klen : NULL;
        attn_tensor tq = {Qp + r * Lq * ldq, {nb, H, Lq, Dh}, {Lq * ldq, Dh, ldq, 1}};
        attn_tensor to = attn_tensor_blhd(Ao + r * Lq * E, nb, H, Lq, Dh);
        attn_tensor tk = {kv->k + off, {nb, Hkv, lk, Dh}, {T * Ekv, Dh, Ekv, 1}};
        attn_tensor tv = {kv->v + off, {nb, Hkv, lk, Dh}, {T * Ekv, Dh, Ekv, 1}};
        s = attn_sdpa_forward_ws(&tq, &tk, &tv, &sp, &to, NULL, NULL, NULL, ws, lay.ws_floats, err);
    }
    if (s) return s; /* len unchanged: the keys written past it are not held */
    project(Ao, rows, E, w->w_o, w->b_o, E, out, threads);
    for (int64_t b = 0; b < n; b++) kv->len[b] += Lq;
    return attn_ok(err);
}
