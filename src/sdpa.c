/* Public scaled dot-product attention entry points: validate, choose a path,
 * say which path ran and why (attn_sdpa_info, or stderr with ATTN_VERBOSE=1). */
#include "internal.h"
#include "sdpa_bf16.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void report(attn_sdpa_info *info, const char *op, attn_impl impl, const char *reason) {
    if (info) {
        info->impl = impl;
        snprintf(info->reason, sizeof info->reason, "%s", reason);
    }
    if (attn_env_get()->verbose) fprintf(stderr, "attn: %s: %s\n", op, reason);
}

/* The path for a validated problem, and why, in reason (n bytes).
 * ATTN_IMPL_AUTO and ATTN_IMPL_FUSED take the fused path, which supports
 * every call the validation accepts (all masks, dropout, weights, strides,
 * any sizes); ATTN_IMPL_REFERENCE takes the reference path. */
static attn_impl choose(const attn_problem *pr, const attn_varlen *varlen, attn_impl requested,
                        int backward, char *reason, size_t n) {
    if (requested == ATTN_IMPL_REFERENCE) {
        snprintf(reason, n, "reference path: requested by the caller");
        return ATTN_IMPL_REFERENCE;
    }
    attn_sdpa_fused_describe(pr, varlen, backward, reason, n);
    return ATTN_IMPL_FUSED;
}

/* The aliasing preconditions (attn.h): out, weights, lse against q, k, v
 * and one another; weights_floats is what the call writes there. */
static attn_status check_forward_alias(const attn_problem *pr, const attn_tensor *q,
                                       const attn_tensor *k, const attn_tensor *v,
                                       const attn_tensor *out, const float *weights,
                                       int64_t weights_floats, const float *lse,
                                       attn_error *err) {
    const int bf = pr->dtype == ATTN_BF16, obf = pr->out_dtype == ATTN_BF16;
    attn_alias_view in[3] = {attn_alias_tensor(q, "q", bf), attn_alias_tensor(k, "k", bf),
                             attn_alias_tensor(v, "v", bf)};
    attn_alias_view outs[3] = {attn_alias_tensor(out, "out", obf),
                               attn_alias_floats(weights, weights_floats, "weights"),
                               attn_alias_floats(lse, pr->B * pr->H * pr->Lq, "lse")};
    return attn_check_alias(in, 3, outs, 3, err);
}

/* dq, dk, dv against q, k, v, out, grad_out, lse and one another. */
static attn_status check_backward_alias(const attn_problem *pr, const attn_tensor *q,
                                        const attn_tensor *k, const attn_tensor *v,
                                        const attn_tensor *out, const float *lse,
                                        const attn_tensor *grad_out, const attn_tensor *dq,
                                        const attn_tensor *dk, const attn_tensor *dv,
                                        attn_error *err) {
    const int bf = pr->dtype == ATTN_BF16, obf = pr->out_dtype == ATTN_BF16;
    attn_alias_view in[6] = {attn_alias_tensor(q, "q", bf),
                             attn_alias_tensor(k, "k", bf),
                             attn_alias_tensor(v, "v", bf),
                             attn_alias_tensor(out, "out", obf),
                             attn_alias_tensor(grad_out, "grad_out", obf),
                             attn_alias_floats(lse, pr->B * pr->H * pr->Lq, "lse")};
    attn_alias_view outs[3] = {attn_alias_tensor(dq, "dq", 0), attn_alias_tensor(dk, "dk", 0),
                               attn_alias_tensor(dv, "dv", 0)};
    return attn_check_alias(in, 6, outs, 3, err);
}

attn_status attn_sdpa_forward(const attn_tensor *q, const attn_tensor *k, const attn_tensor *v,
                              const attn_sdpa_params *p, attn_tensor *out, float *weights,
                              float *lse, attn_sdpa_info *info, attn_error *err) {
    return attn_sdpa_forward_ws(q, k, v, p, out, weights, lse, info, NULL, 0, err);
}

attn_status attn_sdpa_forward_ws(const attn_tensor *q, const attn_tensor *k, const attn_tensor *v,
                                 const attn_sdpa_params *p, attn_tensor *out, float *weights,
                                 float *lse, attn_sdpa_info *info, float *ws, int64_t ws_floats,
                                 attn_error *err) {
    if (!out) return attn_fail(err, ATTN_ERR_NULL, "out is NULL");
    attn_problem pr;
    attn_status s = attn_sdpa_check(q, k, v, out, p, &pr, err);
    if (s) return s;
    if ((s = check_forward_alias(&pr, q, k, v, out, weights, pr.B * pr.H * pr.Lq * pr.Lk, lse,
                                 err)))
        return s;
    char reason[160];
    attn_impl impl = choose(&pr, NULL, p ? p->impl : ATTN_IMPL_AUTO, 0, reason, sizeof reason);
    report(info, "forward", impl, reason);
    s = impl == ATTN_IMPL_FUSED
            ? attn_sdpa_fused_forward(&pr, q, k, v, out, weights, lse, ws, ws_floats, err)
            : attn_sdpa_reference_forward(&pr, q, k, v, out, weights, lse, err);
    return s ? s : attn_ok(err);
}

static inline float elem(const attn_tensor *t, int bf16, int64_t b, int64_t h, int64_t i,
                         int64_t d) {
    const int64_t o = b * t->stride[0] + h * t->stride[1] + i * t->stride[2] + d * t->stride[3];
    return bf16 ? attn_bf16_to_f32(((const uint16_t *)(const void *)t->data)[o]) : t->data[o];
}

void attn_sinks_grad(const attn_problem *pr, const attn_tensor *out, const attn_tensor *dout,
                     const float *lse, int64_t lse_ld, float *d) {
    const int bf16 = pr->out_dtype == ATTN_BF16;
    const int64_t H = pr->H;
    /* dL/dσ_h = −Σ_{b,i} exp(σ_h − lse)·(dO·O): one head per task, (b, i)
     * in order, in double: the same bits for any thread count. */
#pragma omp parallel for num_threads(pr->threads) schedule(static)
    for (int64_t h = 0; h < H; h++) {
        double acc = 0.0;
        for (int64_t b = 0; b < pr->B; b++)
            for (int64_t i = 0; i < pr->Lq; i++) {
                const double ps = exp((double)pr->sinks[h] - (double)lse[(b * H + h) * lse_ld + i]);
                double dd = 0.0;
                for (int64_t c = 0; c < pr->Dv; c++)
                    dd += (double)elem(dout, bf16, b, h, i, c) * (double)elem(out, bf16, b, h, i, c);
                acc -= ps * dd;
            }
        d[h] = (float)acc;
    }
}

/* d_sinks[h] = −Σ_{b,i} exp(σ_h − lse)·rows[(b·H + h)·Lq + i] (rows: Σ_j
 * P·dP per query row, from the bf16 fused backward), in double, (b, i) in
 * order: the same bits for any thread count. */
static void sinks_from_rows(const attn_problem *pr, const float *rows, const float *lse,
                            float *d) {
    for (int64_t h = 0; h < pr->H; h++) {
        double acc = 0.0;
        for (int64_t b = 0; b < pr->B; b++)
            for (int64_t i = 0; i < pr->Lq; i++) {
                const int64_t r = (b * pr->H + h) * pr->Lq + i;
                if (rows[r] != 0.0f)
                    acc -= exp((double)pr->sinks[h] - (double)lse[r]) * (double)rows[r];
            }
        d[h] = (float)acc;
    }
}

/* The reference backward's sinks accumulator: zeroed doubles [H], on the
 * stack (ds) for up to ATTN_SINKS_STACK heads, else allocated (NULL: out of
 * memory). */
#define ATTN_SINKS_STACK 64
static double *sinks_acc(const attn_problem *pr, double *ds) {
    double *a = pr->H <= ATTN_SINKS_STACK ? ds : malloc((size_t)pr->H * sizeof *a);
    if (a) memset(a, 0, (size_t)pr->H * sizeof *a);
    return a;
}
/* d_sinks (when the backward succeeded, s 0) from the reference's
 * accumulator, or (acc NULL: the fused path) from the saved out and lse
 * (attn_sinks_grad); frees an allocated accumulator. */
static void sinks_finish(const attn_problem *pr, attn_status s, double *acc, double *ds,
                         const attn_tensor *out, const attn_tensor *dout, const float *lse,
                         float *d_sinks) {
    if (!acc) {
        if (!s) attn_sinks_grad(pr, out, dout, lse, pr->Lq, d_sinks);
        return;
    }
    if (!s)
        for (int64_t h = 0; h < pr->H; h++) d_sinks[h] = (float)acc[h];
    if (acc != ds) free(acc);
}

/* grad_out like out, dq, dk, dv like q, k, v. */
static attn_status check_grads(const attn_tensor *out, const attn_tensor *grad_out,
                               const attn_tensor *q, const attn_tensor *k, const attn_tensor *v,
                               const attn_tensor *dq, const attn_tensor *dk, const attn_tensor *dv,
                               attn_error *err) {
    attn_status s;
    if ((s = attn_check_same_shape(grad_out, out, "grad_out", "out", err)) ||
        (s = attn_check_same_shape(dq, q, "dq", "q", err)) ||
        (s = attn_check_same_shape(dk, k, "dk", "k", err)) ||
        (s = attn_check_same_shape(dv, v, "dv", "v", err)))
        return s;
    return ATTN_OK;
}

attn_status attn_sdpa_backward(const attn_tensor *q, const attn_tensor *k, const attn_tensor *v,
                               const attn_tensor *out, const float *lse,
                               const attn_tensor *grad_out, const attn_sdpa_params *p,
                               attn_tensor *dq, attn_tensor *dk, attn_tensor *dv,
                               attn_sdpa_info *info, attn_error *err) {
    if (!out) return attn_fail(err, ATTN_ERR_NULL, "out is NULL");
    attn_problem pr;
    attn_status s = attn_sdpa_check(q, k, v, out, p, &pr, err);
    if (s) return s;
    if (!lse) return attn_fail(err, ATTN_ERR_NULL, "lse is NULL (save it in the forward)");
    if ((s = check_grads(out, grad_out, q, k, v, dq, dk, dv, err)) ||
        (s = check_backward_alias(&pr, q, k, v, out, lse, grad_out, dq, dk, dv, err)))
        return s;
    char reason[160];
    attn_impl impl = choose(&pr, NULL, p ? p->impl : ATTN_IMPL_AUTO, 1, reason, sizeof reason);
    report(info, "backward", impl, reason);
    const int want_ds = pr.sinks && p->d_sinks;
    double ds[ATTN_SINKS_STACK];
    double *acc = want_ds && impl == ATTN_IMPL_REFERENCE ? sinks_acc(&pr, ds) : NULL;
    if (want_ds && impl == ATTN_IMPL_REFERENCE && !acc)
        return attn_fail(err, ATTN_ERR_NOMEM, "out of memory for the sinks' gradient");
    /* bf16 kernels: Σ P·dP per row from the backward itself (dO·O with out
     * rounded to bf16 cost 3-4x the math path's error in d_sinks) */
    float *rows = NULL;
    if (want_ds && impl == ATTN_IMPL_FUSED && pr.dtype == ATTN_BF16) {
        rows = calloc((size_t)(pr.B * pr.H * pr.Lq) + 1, sizeof *rows);
        if (!rows) return attn_fail(err, ATTN_ERR_NOMEM, "out of memory for the sinks' gradient");
    }
    s = impl == ATTN_IMPL_FUSED
            ? attn_sdpa_fused_backward(&pr, q, k, v, out, lse, grad_out, dq, dk, dv, rows, err)
            : attn_sdpa_reference_backward(&pr, q, k, v, out, lse, grad_out, dq, dk, dv, acc, err);
    if (rows) {
        if (!s) sinks_from_rows(&pr, rows, lse, p->d_sinks);
        free(rows);
    } else if (want_ds) {
        sinks_finish(&pr, s, acc, ds, out, grad_out, lse, p->d_sinks);
    }
    return s ? s : attn_ok(err);
}

attn_status attn_sdpa_varlen_forward(const attn_tensor *q, const attn_tensor *k,
                                     const attn_tensor *v, int64_t batch,
                                     const int64_t *cu_seqlens_q, const int64_t *cu_seqlens_k,
                                     const attn_sdpa_params *p, attn_tensor *out, float *weights,
                                     float *lse, attn_sdpa_info *info, attn_error *err) {
    if (!out) return attn_fail(err, ATTN_ERR_NULL, "out is NULL");
    attn_problem pr;
    attn_varlen varlen;
    attn_status s =
        attn_varlen_check(q, k, v, out, batch, cu_seqlens_q, cu_seqlens_k, p, &pr, &varlen, err);
    if (s) return s;
    if ((s = check_forward_alias(&pr, q, k, v, out, weights, varlen.weights_at[varlen.n], lse,
                                 err))) {
        attn_varlen_free(&varlen);
        return s;
    }
    char reason[160];
    attn_impl impl = choose(&pr, &varlen, p ? p->impl : ATTN_IMPL_AUTO, 0, reason, sizeof reason);
    report(info, "varlen forward", impl, reason);
    if (impl == ATTN_IMPL_FUSED) {
        attn_fused_call c;
        memset(&c, 0, sizeof c);
        c.pr = &pr, c.q = q, c.k = k, c.v = v, c.out = out, c.weights = weights, c.lse = lse;
        c.blas = attn_fused_blas_on(), c.varlen = &varlen;
        s = attn_sdpa_fused_varlen(&c, 0, err);
    } else {
        s = attn_varlen_reference_forward(&pr, &varlen, q, k, v, out, weights, lse, err);
    }
    attn_varlen_free(&varlen);
    return s ? s : attn_ok(err);
}

attn_status attn_sdpa_varlen_backward(const attn_tensor *q, const attn_tensor *k,
                                      const attn_tensor *v, const attn_tensor *out,
                                      const float *lse, const attn_tensor *grad_out, int64_t batch,
                                      const int64_t *cu_seqlens_q, const int64_t *cu_seqlens_k,
                                      const attn_sdpa_params *p, attn_tensor *dq, attn_tensor *dk,
                                      attn_tensor *dv, attn_sdpa_info *info, attn_error *err) {
    if (!out) return attn_fail(err, ATTN_ERR_NULL, "out is NULL");
    attn_problem pr;
    attn_varlen varlen;
    attn_status s =
        attn_varlen_check(q, k, v, out, batch, cu_seqlens_q, cu_seqlens_k, p, &pr, &varlen, err);
    if (s) return s;
    if (!lse)
        s = attn_fail(err, ATTN_ERR_NULL, "lse is NULL (save it in the forward)");
    else if (!(s = check_grads(out, grad_out, q, k, v, dq, dk, dv, err)))
        s = check_backward_alias(&pr, q, k, v, out, lse, grad_out, dq, dk, dv, err);
    if (s) {
        attn_varlen_free(&varlen);
        return s;
    }
    char reason[160];
    attn_impl impl = choose(&pr, &varlen, p ? p->impl : ATTN_IMPL_AUTO, 1, reason, sizeof reason);
    report(info, "varlen backward", impl, reason);
    const int want_ds = pr.sinks && p->d_sinks;
    double ds[ATTN_SINKS_STACK];
    double *acc = want_ds && impl == ATTN_IMPL_REFERENCE ? sinks_acc(&pr, ds) : NULL;
    if (want_ds && impl == ATTN_IMPL_REFERENCE && !acc) {
        attn_varlen_free(&varlen);
        return attn_fail(err, ATTN_ERR_NOMEM, "out of memory for the sinks' gradient");
    }
    if (impl == ATTN_IMPL_FUSED) {
        attn_fused_call c;
        memset(&c, 0, sizeof c);
        c.pr = &pr, c.q = q, c.k = k, c.v = v, c.out = out, c.lse_in = lse, c.dout = grad_out;
        c.dq = dq, c.dk = dk, c.dv = dv, c.blas = attn_fused_blas_on(), c.varlen = &varlen;
        s = attn_sdpa_fused_varlen(&c, 1, err);
    } else {
        s = attn_varlen_reference_backward(&pr, &varlen, q, k, v, out, lse, grad_out, dq, dk, dv,
                                           acc, err);
    }
    /* (fused: the packed rows as one batch row of total_q queries) */
    if (want_ds) sinks_finish(&pr, s, acc, ds, out, grad_out, lse, p->d_sinks);
    attn_varlen_free(&varlen);
    return s ? s : attn_ok(err);
}
