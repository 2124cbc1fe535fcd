/* The fused path's front: picks the instruction set at run time (AVX-512F,
 * AVX2+FMA or portable C), describes the path for attn_sdpa_info, and calls
 * the kernels of sdpa_fused_template.h compiled for that instruction set. */
#include "internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cblas.h>

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

/* What the CPU runs, detected once (cpuid traps in a VM: microseconds).
 * A cache of a fact about the machine, not configuration. */
static attn_isa isa_best(void) {
    static int cached = -1;
    int v;
#pragma omp atomic read
    v = cached;
    if (v < 0) {
        v = (int)isa_detect();
#pragma omp atomic write
        cached = v;
    }
    return (attn_isa)v;
}

attn_isa attn_fused_isa(void) {
    attn_isa best = isa_best();
    const char *e = getenv("ATTN_FUSED_ISA");
    if (e && *e) {
        attn_isa want = best;
        if (strcmp(e, "portable") == 0) want = ATTN_ISA_PORTABLE;
        else if (strcmp(e, "avx2") == 0) want = ATTN_ISA_AVX2;
        else if (strcmp(e, "avx512") == 0) want = ATTN_ISA_AVX512;
        if (want < best) best = want; /* only ever lowered to what the CPU runs */
    }
    return best;
}

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

/* ATTN_FUSED_GEMM=blas: tile products through OpenBLAS (for measuring). */
static int use_blas(void) {
    const char *e = getenv("ATTN_FUSED_GEMM");
    return e && strcmp(e, "blas") == 0;
}

void attn_sdpa_fused_describe(const attn_problem *pr, int backward, char *buf, size_t n) {
    const char *isa = attn_isa_name(attn_fused_isa());
    const char *gemm = use_blas() ? ", tile products via OpenBLAS" : "";
    if (!backward && pr->Lq <= FUSED_DECODE_MAXLQ) {
        int64_t C = FUSED_DECODE_CHUNK;
        while (pr->Lk > 64 * C) C *= 2;
        snprintf(buf, n, "fused path: %s kernels, decode (Lq=%lld): keys split in %lld-key chunks%s",
                 isa, (long long)pr->Lq, (long long)C, gemm);
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

/* The BLAS measurement mode calls sgemm from inside our parallel region:
 * OpenBLAS must not start threads of its own there. */
static void blas_single_thread(int blas) {
    if (blas) openblas_set_num_threads(1);
}

attn_status attn_sdpa_fused_forward(const attn_problem *pr, const attn_tensor *q,
                                    const attn_tensor *k, const attn_tensor *v,
                                    attn_tensor *out, float *weights, float *lse,
                                    attn_error *err) {
    attn_fused_call c;
    memset(&c, 0, sizeof c);
    c.pr = pr, c.q = q, c.k = k, c.v = v, c.out = out, c.weights = weights, c.lse = lse;
    c.blas = use_blas();
    blas_single_thread(c.blas);
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
                                     const attn_tensor *dout, attn_tensor *dq,
                                     attn_tensor *dk, attn_tensor *dv, attn_error *err) {
    attn_fused_call c;
    memset(&c, 0, sizeof c);
    c.pr = pr, c.q = q, c.k = k, c.v = v, c.out = out, c.lse_in = lse, c.dout = dout;
    c.dq = dq, c.dk = dk, c.dv = dv;
    c.blas = use_blas();
    blas_single_thread(c.blas);
    switch (attn_fused_isa()) {
#if defined(__x86_64__)
    case ATTN_ISA_AVX512: return attn_fused_backward_avx512(&c, err);
    case ATTN_ISA_AVX2: return attn_fused_backward_avx2(&c, err);
#endif
    default: return attn_fused_backward_portable(&c, err);
    }
}
