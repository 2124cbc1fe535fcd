/* The fused path's front: describes the path for attn_sdpa_info and calls
 * the kernels of the instruction set isa.c's table picks (sdpa_fused_<isa>.c,
 * compiled from sdpa_fused_template.h). */
#include "internal.h"
#include "sdpa_bf16.h"

#include <stdio.h>
#include <string.h>

/* The measurement hook (internal.h): tile products through OpenBLAS. */
static int g_fused_blas;

void attn_test_fused_blas(int on) {
#pragma omp atomic write
    g_fused_blas = on != 0;
}

int attn_fused_blas_on(void) {
    int on;
#pragma omp atomic read
    on = g_fused_blas;
    return on;
}

void attn_sdpa_fused_describe(const attn_problem *pr, const attn_varlen *varlen, int backward,
                              char *buf, size_t n) {
    const char *isa = attn_fused_kernels_active()->name;
    const char *gemm = attn_fused_blas_on() ? ", tile products via OpenBLAS" : "";
    if (pr->dtype == ATTN_BF16 && !backward && !varlen) {
        snprintf(buf, n, "fused path: bf16 %s kernels (fp32 accumulation, P rounded to bf16)",
                 attn_fused_bf16_kernels_active()->name);
        return;
    }
    if (pr->dtype == ATTN_BF16 && !varlen) {
        snprintf(buf, n,
                 "fused path: bf16 %s kernels, backward %s (fp32 accumulation, P and dS rounded "
                 "to bf16)",
                 attn_fused_bf16_kernels_active()->name,
                 attn_fused_bwd_one_pass(pr) ? "one pass per head" : "two passes");
        return;
    }
    if (varlen) {
        snprintf(buf, n,
                 "fused path: %s kernels, %dx%d tiles per sequence (varlen, %lld sequences)%s%s",
                 isa, ATTN_FUSED_QTILE, ATTN_FUSED_KTILE, (long long)varlen->n,
                 !backward                                ? ""
                 : attn_fused_varlen_one_pass(pr, varlen) ? ", backward one pass per head"
                                                          : ", backward two passes",
                 gemm);
    } else if (!backward && pr->Lq <= FUSED_DECODE_MAXLQ) {
        int64_t C = FUSED_DECODE_CHUNK;
        while (pr->Lk > 64 * C) C *= 2;
        snprintf(buf, n,
                 "fused path: %s kernels, decode (Lq=%lld): keys split in %lld-key chunks%s", isa,
                 (long long)pr->Lq, (long long)C, gemm);
    } else if (backward) {
        snprintf(buf, n, "fused path: %s kernels, %dx%d tiles, backward %s%s", isa,
                 ATTN_FUSED_QTILE, ATTN_FUSED_KTILE,
                 attn_fused_bwd_one_pass(pr) ? "one pass per head"
                                             : "two passes (dK/dV by key block, dQ by query block)",
                 gemm);
    } else {
        snprintf(buf, n, "fused path: %s kernels, %dx%d tiles%s", isa, ATTN_FUSED_QTILE,
                 ATTN_FUSED_KTILE, gemm);
    }
}

attn_status attn_sdpa_fused_forward(const attn_problem *pr, const attn_tensor *q,
                                    const attn_tensor *k, const attn_tensor *v, attn_tensor *out,
                                    float *weights, float *lse, float *ws, int64_t ws_floats,
                                    attn_error *err) {
    attn_fused_call c;
    memset(&c, 0, sizeof c);
    c.pr = pr, c.q = q, c.k = k, c.v = v, c.out = out, c.weights = weights, c.lse = lse;
    c.ws = ws, c.ws_floats = ws_floats;
    c.blas = attn_fused_blas_on();
    if (pr->dtype == ATTN_BF16 && !weights) return attn_fused_bf16_kernels_active()->forward(&c, err);
    if (pr->dtype == ATTN_BF16) { /* weights: the fp32 kernels on the converted values */
        attn_bf16_f32 w;
        attn_status s = attn_bf16_widen(pr, q, k, v, out, NULL, 0, &w, err);
        if (s) return s;
        s = attn_sdpa_fused_forward(&w.pr, &w.q, &w.k, &w.v, &w.out, weights, lse, NULL, 0, err);
        if (!s) attn_bf16_narrow_out(&w, pr, out);
        attn_bf16_free(&w);
        return s;
    }
    if (ws && ws_floats < attn_fused_forward_scratch(pr))
        return attn_fail(err, ATTN_ERR_NOMEM, "fused forward: scratch of %lld floats, needs %lld",
                         (long long)ws_floats, (long long)attn_fused_forward_scratch(pr));
    return attn_fused_kernels_active()->forward(&c, err);
}

attn_status attn_sdpa_fused_backward(const attn_problem *pr, const attn_tensor *q,
                                     const attn_tensor *k, const attn_tensor *v,
                                     const attn_tensor *out, const float *lse,
                                     const attn_tensor *dout, attn_tensor *dq, attn_tensor *dk,
                                     attn_tensor *dv, float *sink_rows, attn_error *err) {
    attn_fused_call c;
    memset(&c, 0, sizeof c);
    c.pr = pr, c.q = q, c.k = k, c.v = v, c.out = out, c.lse_in = lse, c.dout = dout;
    c.dq = dq, c.dk = dk, c.dv = dv, c.sink_rows = sink_rows;
    c.blas = attn_fused_blas_on();
    if (pr->dtype == ATTN_BF16) return attn_fused_bf16_kernels_active()->backward(&c, err);
    return attn_fused_kernels_active()->backward(&c, err);
}

attn_status attn_sdpa_fused_varlen(const attn_fused_call *c, int backward, attn_error *err) {
    if (c->pr->dtype != ATTN_F32)
        return attn_fail(err, ATTN_ERR_ARG,
                         "varlen: the fused path is fp32 only (bf16: ATTN_IMPL_REFERENCE)");
    const attn_fused_kernels *kr = attn_fused_kernels_active();
    return backward ? kr->backward(c, err) : kr->forward(c, err);
}
