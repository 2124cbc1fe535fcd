/* Multi-head attention layer, batch first, PyTorch's parameter layout.
 *
 * Forward, with M = B*Lq rows of queries and N = B*Lk rows of keys:
 *   Qp [B, Lq, E] = query Wqᵀ + bq        Kp [B, Lk, E] = key Wkᵀ + bk
 *   Vp [B, Lk, E] = value Wvᵀ + bv
 *   Ao [B, Lq, E] = SDPA over the [B, H, L, E/H] views of Qp, Kp, Vp
 *   out [B, Lq, E] = Ao Woᵀ + bo
 * The cache holds Qp | Kp | Vp | Ao | lse [B, H, Lq], which is everything
 * the backward reads besides the inputs and the weights. */
#include "internal.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
    int64_t E, H, Dh, kdim, vdim;
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
        return attn_fail(err, ATTN_ERR_SHAPE, "kdim (%lld) and vdim (%lld) must be >= 0 (0: embed_dim)",
                         (long long)c->kdim, (long long)c->vdim);
    d->E = c->embed_dim;
    d->H = c->num_heads;
    d->Dh = d->E / d->H;
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
    *count = (size_t)(d.E * (2 * d.E + d.kdim + d.vdim) + (c->bias ? 4 * d.E : 0));
    return attn_ok(err);
}

attn_status attn_mha_weights_from_buffer(const attn_mha_config *c, float *buf,
                                         attn_mha_weights *w, attn_error *err) {
    mha_dims d = {0};
    attn_status s = check_config(c, &d, err);
    if (s) return s;
    if (!buf || !w) return attn_fail(err, ATTN_ERR_NULL, "buffer or weights is NULL");
    const int64_t E = d.E;
    w->w_q = buf;
    w->w_k = w->w_q + E * E;
    w->w_v = w->w_k + E * d.kdim;
    float *next = w->w_v + E * d.vdim;
    if (c->bias) {
        w->b_q = next;
        w->b_k = next + E;
        w->b_v = next + 2 * E;
        next += 3 * E;
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
    const int64_t E = d.E;
    uint64_t st = seed;
    if (d.kdim == E && d.vdim == E) { /* one Xavier bound over in_proj [3E, E] */
        const float bound = sqrtf(6.0f / (float)(E + 3 * E));
        fill_uniform(w->w_q, E * E, bound, &st);
        fill_uniform(w->w_k, E * E, bound, &st);
        fill_uniform(w->w_v, E * E, bound, &st);
    } else {
        fill_uniform(w->w_q, E * E, sqrtf(6.0f / (float)(E + E)), &st);
        fill_uniform(w->w_k, E * d.kdim, sqrtf(6.0f / (float)(d.kdim + E)), &st);
        fill_uniform(w->w_v, E * d.vdim, sqrtf(6.0f / (float)(d.vdim + E)), &st);
    }
    fill_uniform(w->w_o, E * E, 1.0f / sqrtf((float)E), &st);
    if (c->bias) {
        memset(w->b_q, 0, (size_t)E * sizeof(float));
        memset(w->b_k, 0, (size_t)E * sizeof(float));
        memset(w->b_v, 0, (size_t)E * sizeof(float));
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
    *count = (size_t)(B * (2 * Lq * d.E + 2 * Lk * d.E + d.H * Lq));
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
    if (!query || !key || !value || !out)
        return attn_fail(err, ATTN_ERR_NULL, "query, key, value and out must be non-NULL");
    if (mode != ATTN_WEIGHTS_NONE && mode != ATTN_WEIGHTS_PER_HEAD && mode != ATTN_WEIGHTS_AVERAGE)
        return attn_fail(err, ATTN_ERR_ARG, "weights mode %d is not an attn_weights_mode", (int)mode);
    if (mode != ATTN_WEIGHTS_NONE && !weights)
        return attn_fail(err, ATTN_ERR_NULL, "weights buffer is NULL but weights were requested");
    const int64_t E = d.E, H = d.H;
    if (p && (p->num_threads < 0 || p->num_threads > ATTN_MAX_THREADS))
        return attn_fail(err, ATTN_ERR_ARG, "num_threads must be in [0, %d], got %d",
                         ATTN_MAX_THREADS, p->num_threads);
    const int threads = attn_threads_for(p ? p->num_threads : 0);
    size_t ncache;
    attn_mha_cache_size(c, B, Lq, Lk, &ncache, NULL);
    float *buf = cache;
    if (!buf && !(buf = malloc(ncache * sizeof(float))))
        return attn_fail(err, ATTN_ERR_NOMEM, "out of memory for %zu floats of activations", ncache);
    float *Qp = buf, *Kp = Qp + B * Lq * E, *Vp = Kp + B * Lk * E, *Ao = Vp + B * Lk * E;
    float *lse = Ao + B * Lq * E;
    float *wtmp = NULL; /* [B, H, Lq, Lk] per-head weights before averaging */
    if (mode == ATTN_WEIGHTS_AVERAGE && !(wtmp = malloc((size_t)(B * H * Lq * Lk) * sizeof(float)))) {
        if (!cache) free(buf);
        return attn_fail(err, ATTN_ERR_NOMEM, "out of memory for per-head weights");
    }
    project(query, B * Lq, E, w->w_q, w->b_q, E, Qp, threads);
    project(key, B * Lk, d.kdim, w->w_k, w->b_k, E, Kp, threads);
    project(value, B * Lk, d.vdim, w->w_v, w->b_v, E, Vp, threads);
    attn_tensor tq = attn_tensor_blhd(Qp, B, H, Lq, d.Dh), tk = attn_tensor_blhd(Kp, B, H, Lk, d.Dh),
                tv = attn_tensor_blhd(Vp, B, H, Lk, d.Dh), to = attn_tensor_blhd(Ao, B, H, Lq, d.Dh);
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
                              const float *grad_out, float *d_query, float *d_key,
                              float *d_value, const attn_mha_weights *g, attn_error *err) {
    mha_dims d = {0};
    attn_status s = check_config(c, &d, err);
    if (s || (s = check_weights(c, w, "weights", err)) || (s = check_weights(c, g, "grads", err)) ||
        (s = check_call(&d, B, Lq, Lk, err)))
        return s;
    if (!query || !key || !value || !grad_out)
        return attn_fail(err, ATTN_ERR_NULL, "query, key, value and grad_out must be non-NULL");
    if (!cache)
        return attn_fail(err, ATTN_ERR_STATE, "cache is NULL: run attn_mha_forward with a cache first");
    const int64_t E = d.E, H = d.H;
    if (p && (p->num_threads < 0 || p->num_threads > ATTN_MAX_THREADS))
        return attn_fail(err, ATTN_ERR_ARG, "num_threads must be in [0, %d], got %d",
                         ATTN_MAX_THREADS, p->num_threads);
    const int threads = attn_threads_for(p ? p->num_threads : 0);
    const float *Qp = cache, *Kp = Qp + B * Lq * E, *Vp = Kp + B * Lk * E, *Ao = Vp + B * Lk * E;
    const float *lse = Ao + B * Lq * E;
    /* Scratch: dAo [B, Lq, E], dQp [B, Lq, E], dKp, dVp [B, Lk, E], then
     * project_backward's [max(E, B*max(Lq, Lk)) * max(E, kdim, vdim)]. */
    const int64_t widest = d.E > d.kdim ? (d.E > d.vdim ? d.E : d.vdim) : (d.kdim > d.vdim ? d.kdim : d.vdim);
    const int64_t rows = B * (Lq > Lk ? Lq : Lk);
    float *tmp = malloc((size_t)(2 * B * Lq * E + 2 * B * Lk * E + (rows > E ? rows : E) * widest) *
                        sizeof(float));
    if (!tmp) return attn_fail(err, ATTN_ERR_NOMEM, "out of memory for backward scratch");
    float *dAo = tmp, *dQp = dAo + B * Lq * E, *dKp = dQp + B * Lq * E, *dVp = dKp + B * Lk * E;
    float *scratch = dVp + B * Lk * E;

    attn_sgemm(0, 0, B * Lq, E, E, 1.0f, grad_out, E, w->w_o, E, 0.0f, dAo, E, threads);
    project_backward(Ao, B * Lq, E, w->w_o, E, grad_out, g->w_o, g->b_o, NULL, scratch, threads);
    attn_tensor tq = attn_tensor_blhd((float *)Qp, B, H, Lq, d.Dh),
                tk = attn_tensor_blhd((float *)Kp, B, H, Lk, d.Dh),
                tv = attn_tensor_blhd((float *)Vp, B, H, Lk, d.Dh),
                to = attn_tensor_blhd((float *)Ao, B, H, Lq, d.Dh),
                tdo = attn_tensor_blhd(dAo, B, H, Lq, d.Dh), tdq = attn_tensor_blhd(dQp, B, H, Lq, d.Dh),
                tdk = attn_tensor_blhd(dKp, B, H, Lk, d.Dh), tdv = attn_tensor_blhd(dVp, B, H, Lk, d.Dh);
    s = attn_sdpa_backward(&tq, &tk, &tv, &to, lse, &tdo, p, &tdq, &tdk, &tdv, NULL, err);
    if (!s) {
        project_backward(query, B * Lq, E, w->w_q, E, dQp, g->w_q, g->b_q, d_query, scratch, threads);
        project_backward(key, B * Lk, d.kdim, w->w_k, E, dKp, g->w_k, g->b_k, d_key, scratch, threads);
        project_backward(value, B * Lk, d.vdim, w->w_v, E, dVp, g->w_v, g->b_v, d_value, scratch, threads);
    }
    free(tmp);
    return s ? s : attn_ok(err);
}
