/* The fused path's front: picks the instruction set at run time (AVX-512F,
 * AVX2+FMA or portable C), describes the path for attn_sdpa_info, and calls
 * the kernels of sdpa_fused_template.h compiled for that instruction set. */
#include "internal.h"

#include <stdio.h>
#include <string.h>

static attn_isa isa_detect(void) {
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx2") &&
        __builtin_cpu_supports("fma"))
        return ATTN_ISA_AVX512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return ATTN_ISA_AVX2;
#endif
    return ATTN_ISA_PORTABLE;
}

/* The best the CPU runs, lowered (never raised) to the one ATTN_FUSED_ISA
 * names; called by the one-time init (status.c). */
int attn_isa_cpu(void) { return (int)isa_detect(); }

int attn_isa_from_env(const char *e) {
    attn_isa best = isa_detect();
    if (e && *e) {
        attn_isa want = best;
        if (strcmp(e, "portable") == 0)
            want = ATTN_ISA_PORTABLE;
        else if (strcmp(e, "avx2") == 0)
            want = ATTN_ISA_AVX2;
        else if (strcmp(e, "avx512") == 0)
            want = ATTN_ISA_AVX512;
        if (want < best) best = want;
    }
    return (int)best;
}

attn_isa attn_fused_isa(void) { return (attn_isa)attn_env_get()->isa; }

const char *attn_isa_name(attn_isa isa) {
    switch (isa) {
    case ATTN_ISA_AVX512: return "avx512";
    case ATTN_ISA_AVX2: return "avx2";
    default: return "portable";
    }
}

/* One pass per head when the heads spread over the threads with at most a
 * third of a round idle; else two passes (which recompute S and dP once
 * more, 7 tile products instead of 5, but parallelise over key and query
 * blocks). Either gives bit-identical results. */
int attn_fused_bwd_one_pass(const attn_problem *pr) {
    const int64_t bh = pr->B * pr->H, T = pr->threads;
    if (T <= 1) return 1;
    const int64_t rounds = (bh + T - 1) / T;
    return rounds * T * 3 <= bh * 4;
}

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

int attn_fused_varlen_one_pass(const attn_problem *pr, const attn_varlen *vl) {
    if (pr->threads <= 1) return 1;
    double total = 0, largest = 0; /* Lq·Lk per (sequence, head) */
    for (int64_t s = 0; s < vl->n; s++) {
        const double w =
            (double)(vl->cu_q[s + 1] - vl->cu_q[s]) * (double)(vl->cu_k[s + 1] - vl->cu_k[s]);
        total += w * (double)pr->H;
        largest = w > largest ? w : largest;
    }
    return largest * 3.0 * pr->threads <= total;
}

void attn_sdpa_fused_describe(const attn_problem *pr, const attn_varlen *vl, int backward,
                              char *buf, size_t n) {
    const char *isa = attn_isa_name(attn_fused_isa());
    const char *gemm = attn_fused_blas_on() ? ", tile products via OpenBLAS" : "";
    if (vl) {
        snprintf(buf, n,
                 "fused path: %s kernels, %dx%d tiles per sequence (varlen, %lld sequences)%s%s",
                 isa, ATTN_FUSED_QTILE, ATTN_FUSED_KTILE, (long long)vl->n,
                 !backward                            ? ""
                 : attn_fused_varlen_one_pass(pr, vl) ? ", backward one pass per head"
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

int64_t attn_fused_forward_scratch(const attn_problem *pr) {
    /* each instruction set the CPU runs (only those: the AVX-512 file may
     * use AVX-512 anywhere) */
    int64_t n = attn_fused_forward_scratch_portable(pr);
#if defined(__x86_64__)
    const int cpu = attn_env_get()->cpu_isa;
    if (cpu >= ATTN_ISA_AVX2) {
        const int64_t a = attn_fused_forward_scratch_avx2(pr);
        n = a > n ? a : n;
    }
    if (cpu >= ATTN_ISA_AVX512) {
        const int64_t a = attn_fused_forward_scratch_avx512(pr);
        n = a > n ? a : n;
    }
#endif
    return n;
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
    if (ws && ws_floats < attn_fused_forward_scratch(pr))
        return attn_fail(err, ATTN_ERR_NOMEM, "fused forward: scratch of %lld floats, needs %lld",
                         (long long)ws_floats, (long long)attn_fused_forward_scratch(pr));
    switch (attn_fused_isa()) {
#if defined(__x86_64__)
    case ATTN_ISA_AVX512: return attn_fused_forward_avx512(&c, err);
    case ATTN_ISA_AVX2: return attn_fused_forward_avx2(&c, err);
#endif
    default: return attn_fused_forward_portable(&c, err);
    }
}

attn_status attn_sdpa_fused_backward(const attn_problem *pr, const attn_tensor *q,
                                     const attn_tensor *k, const attn_tensor *v,
                                     const attn_tensor *out, const float *lse,
                                     const attn_tensor *dout, attn_tensor *dq, attn_tensor *dk,
                                     attn_tensor *dv, attn_error *err) {
    attn_fused_call c;
    memset(&c, 0, sizeof c);
    c.pr = pr, c.q = q, c.k = k, c.v = v, c.out = out, c.lse_in = lse, c.dout = dout;
    c.dq = dq, c.dk = dk, c.dv = dv;
    c.blas = attn_fused_blas_on();
    switch (attn_fused_isa()) {
#if defined(__x86_64__)
    case ATTN_ISA_AVX512: return attn_fused_backward_avx512(&c, err);
    case ATTN_ISA_AVX2: return attn_fused_backward_avx2(&c, err);
#endif
    default: return attn_fused_backward_portable(&c, err);
    }
}

attn_status attn_sdpa_fused_varlen(const attn_fused_call *c, int backward, attn_error *err) {
    switch (attn_fused_isa()) {
#if defined(__x86_64__)
    case ATTN_ISA_AVX512:
        return backward ? attn_fused_backward_avx512(c, err) : attn_fused_forward_avx512(c, err);
    case ATTN_ISA_AVX2:
        return backward ? attn_fused_backward_avx2(c, err) : attn_fused_forward_avx2(c, err);
#endif
    default:
        return backward ? attn_fused_backward_portable(c, err)
                        : attn_fused_forward_portable(c, err);
    }
}
