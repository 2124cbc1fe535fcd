/* The fp32 FMA peak of this machine on N threads, measured: a
 * register-resident FMA loop on every thread at once. Header-only, shared
 * by attn-bench (bench/attn_bench.c) and molgen bench (molgen/harness/bench.c), so
 * both divide by the same measurement. It lives in common/, a folder of
 * neither: it measures the machine, not attention, so it is not libattn's
 * API, and molgen does not reach into bench/ for it. Needs OpenMP and
 * clock_gettime (_POSIX_C_SOURCE >= 199309L). */
#ifndef ATTN_FMA_PEAK_H
#define ATTN_FMA_PEAK_H

#include <math.h>
#include <time.h>
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif

/* FLOPs of `iters` iterations of 12 independent FMA chains of vector width
 * w on one thread: a register-resident loop, no memory traffic (12 chains
 * cover 2 FMA units x 4-6 cycles latency). Spelled out so that the
 * accumulators live in registers at any optimisation level. */
#define FMA12(fma)                                                                                 \
    a0 = fma(a0, x, y), a1 = fma(a1, x, y), a2 = fma(a2, x, y), a3 = fma(a3, x, y);                \
    a4 = fma(a4, x, y), a5 = fma(a5, x, y), a6 = fma(a6, x, y), a7 = fma(a7, x, y);                \
    a8 = fma(a8, x, y), a9 = fma(a9, x, y), a10 = fma(a10, x, y), a11 = fma(a11, x, y)
#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target("avx512f"))) static inline double fma_loop_avx512(long iters) {
    const __m512 x = _mm512_set1_ps(0.999999f), y = _mm512_set1_ps(1e-7f);
    __m512 a0 = _mm512_set1_ps(0.f), a1 = _mm512_set1_ps(1.f), a2 = _mm512_set1_ps(2.f),
           a3 = _mm512_set1_ps(3.f), a4 = _mm512_set1_ps(4.f), a5 = _mm512_set1_ps(5.f),
           a6 = _mm512_set1_ps(6.f), a7 = _mm512_set1_ps(7.f), a8 = _mm512_set1_ps(8.f),
           a9 = _mm512_set1_ps(9.f), a10 = _mm512_set1_ps(10.f), a11 = _mm512_set1_ps(11.f);
    for (long it = 0; it < iters; it++) { FMA12(_mm512_fmadd_ps); }
    __m512 s = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)),
                             _mm512_add_ps(_mm512_add_ps(a4, a5), _mm512_add_ps(a6, a7)));
    s = _mm512_add_ps(s, _mm512_add_ps(_mm512_add_ps(a8, a9), _mm512_add_ps(a10, a11)));
    volatile float sink = _mm512_reduce_add_ps(s);
    (void)sink;
    return (double)iters * 12 * 16 * 2;
}
__attribute__((target("avx2,fma"))) static inline double fma_loop_avx2(long iters) {
    const __m256 x = _mm256_set1_ps(0.999999f), y = _mm256_set1_ps(1e-7f);
    __m256 a0 = _mm256_set1_ps(0.f), a1 = _mm256_set1_ps(1.f), a2 = _mm256_set1_ps(2.f),
           a3 = _mm256_set1_ps(3.f), a4 = _mm256_set1_ps(4.f), a5 = _mm256_set1_ps(5.f),
           a6 = _mm256_set1_ps(6.f), a7 = _mm256_set1_ps(7.f), a8 = _mm256_set1_ps(8.f),
           a9 = _mm256_set1_ps(9.f), a10 = _mm256_set1_ps(10.f), a11 = _mm256_set1_ps(11.f);
    for (long it = 0; it < iters; it++) { FMA12(_mm256_fmadd_ps); }
    __m256 s = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)),
                             _mm256_add_ps(_mm256_add_ps(a4, a5), _mm256_add_ps(a6, a7)));
    s = _mm256_add_ps(s, _mm256_add_ps(_mm256_add_ps(a8, a9), _mm256_add_ps(a10, a11)));
    float t[8];
    _mm256_storeu_ps(t, s);
    volatile float sink = t[0] + t[7];
    (void)sink;
    return (double)iters * 12 * 8 * 2;
}
#endif
static inline double fma_loop_scalar(long iters) {
    const float x = 0.999999f, y = 1e-7f;
    float a0 = 0.f, a1 = 1.f, a2 = 2.f, a3 = 3.f, a4 = 4.f, a5 = 5.f, a6 = 6.f, a7 = 7.f, a8 = 8.f,
          a9 = 9.f, a10 = 10.f, a11 = 11.f;
    for (long it = 0; it < iters; it++) { FMA12(fmaf); }
    volatile float sink = a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7 + a8 + a9 + a10 + a11;
    (void)sink;
    return (double)iters * 12 * 2;
}

/* The widest loop this CPU runs: its fp32 lanes, 16 (AVX-512F), 8 (AVX2
 * and FMA) or 1. */
static inline int fma_loop_lanes(void) {
#if defined(__x86_64__) && defined(__GNUC__)
    if (__builtin_cpu_supports("avx512f")) return 16;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return 8;
#endif
    return 1;
}

static inline double fma_loop(long iters) {
#if defined(__x86_64__) && defined(__GNUC__)
    const int lanes = fma_loop_lanes();
    if (lanes == 16) return fma_loop_avx512(iters);
    if (lanes == 8) return fma_loop_avx2(iters);
#endif
    return fma_loop_scalar(iters);
}

static inline double fma_peak_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* GFLOP/s of `threads` threads running the loop at once, best of 3 (~1 s),
 * timed with timer (NULL: the monotonic clock); *isa (may be NULL) gets
 * the loop's instruction set, "avx512", "avx2" or "scalar". */
static inline double fma_peak_gflops(int threads, double (*timer)(void), const char **isa) {
    if (!timer) timer = fma_peak_now;
    const int lanes = fma_loop_lanes();
    if (isa) *isa = lanes == 16 ? "avx512" : lanes == 8 ? "avx2" : "scalar";
    long iters = 1 << 20;
    double best = 0.0;
    for (;;) { /* size the loop to ~0.3 s */
        double t0 = fma_peak_now(), fl = fma_loop(iters), dt = fma_peak_now() - t0;
        (void)fl;
        if (dt > 0.05) {
            iters = (long)((double)iters * 0.3 / dt);
            break;
        }
        iters *= 4;
    }
    for (int rep = 0; rep < 3; rep++) {
        double flops = 0.0, t0 = timer();
#pragma omp parallel num_threads(threads) reduction(+ : flops)
        flops += fma_loop(iters);
        double g = flops / (timer() - t0) / 1e9;
        if (g > best) best = g;
    }
    return best;
}

#endif /* ATTN_FMA_PEAK_H */
