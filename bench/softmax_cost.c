/* What the fused fp32 forward's online softmax costs next to its two
 * products, on one AVX-512 core, in the kernel's own layout: a tile of
 * Sᵀ [96 keys][64 query lanes] in L1, and per 16 scores (one vector)
 *   max pass    the running max over keys (four chains, as the kernel)
 *   exp pass    p = exp(s - m) stored back, sum += p (the kernel's exp:
 *               src/exp_avx512.h)
 *   products    S = K·Qᵀ and O += P·V cost 2·D FMAs per 16 scores
 *               (D = 64: 128 VFMADD231PS), timed as 12 independent chains
 * so the ceiling of the forward's fraction of the FMA peak at head size D,
 * with perfect products, is products / (products + max + exp).
 *   gcc -O2 -mavx512f -mfma -Isrc bench/softmax_cost.c -o /tmp/smc && taskset -c 1 /tmp/smc
 * (docs/speed.md: "The fused forward's ceiling"). Needs AVX-512F. */
#include <immintrin.h>
#include <stdio.h>
#include <time.h>

#include "exp_avx512.h"

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

enum { NK = 96, NL = 64, NV = NL / 16, ITERS = 4000 };
static float S[NK * NL] __attribute__((aligned(64)));

static void fill(void) {
    for (int i = 0; i < NK * NL; i++) S[i] = -(float)(i % 997) / 97.0f;
}

/* ns per vector of the max pass */
static double max_pass(float *sink) {
    fill();
    __m512 acc = _mm512_setzero_ps();
    const double t = now();
    for (int it = 0; it < ITERS; it++)
        for (int vq = 0; vq < NV; vq++) {
            __m512 m0 = _mm512_set1_ps(-1e30f), m1 = m0, m2 = m0, m3 = m0;
            for (int j = 0; j < NK; j += 4) {
                const float *s = S + j * NL + vq * 16;
                m0 = _mm512_max_ps(_mm512_load_ps(s), m0);
                m1 = _mm512_max_ps(_mm512_load_ps(s + NL), m1);
                m2 = _mm512_max_ps(_mm512_load_ps(s + 2 * NL), m2);
                m3 = _mm512_max_ps(_mm512_load_ps(s + 3 * NL), m3);
            }
            acc = _mm512_add_ps(acc, _mm512_max_ps(_mm512_max_ps(m0, m1), _mm512_max_ps(m2, m3)));
        }
    const double dt = now() - t;
    *sink += _mm512_reduce_add_ps(acc);
    return dt / ((double)ITERS * NK * NV) * 1e9;
}

/* ns per vector of the exp pass (the tile is refilled each round so that
 * the values stay in range; the refill is outside the timed loop) */
static double exp_pass(float *sink) {
    double total = 0;
    __m512 acc = _mm512_setzero_ps();
    for (int it = 0; it < ITERS; it++) {
        if (it % 64 == 0) fill();
        const double t = now();
        for (int vq = 0; vq < NV; vq++) {
            const __m512 mu = _mm512_set1_ps(0.5f);
            __m512 sum = _mm512_setzero_ps();
            for (int j = 0; j < NK; j++) {
                float *s = S + j * NL + vq * 16;
                const __m512 p = attn_exp_avx512(_mm512_sub_ps(_mm512_load_ps(s), mu));
                _mm512_store_ps(s, p);
                sum = _mm512_add_ps(sum, p);
            }
            acc = _mm512_add_ps(acc, sum);
        }
        total += now() - t;
    }
    *sink += _mm512_reduce_add_ps(acc);
    return total / ((double)ITERS * NK * NV) * 1e9;
}

/* ns per VFMADD231PS at full issue (12 independent chains) */
static double fma_issue(float *sink) {
    __m512 a[12];
    for (int i = 0; i < 12; i++) a[i] = _mm512_setzero_ps();
    __m512 x = _mm512_set1_ps(1.0f);
    const __m512 y = _mm512_set1_ps(1e-9f);
    const long n = 20000000;
    const double t = now();
    for (long k = 0; k < n; k++) {
#define F(i) a[i] = _mm512_fmadd_ps(x, y, a[i]);
        F(0) F(1) F(2) F(3) F(4) F(5) F(6) F(7) F(8) F(9) F(10) F(11)
#undef F
        __asm__ volatile("" : "+v"(x));
    }
    const double dt = now() - t;
    for (int i = 0; i < 12; i++) *sink += _mm512_reduce_add_ps(a[i]);
    return dt / (12.0 * n) * 1e9;
}

int main(void) {
    float sink = 0;
    for (int r = 0; r < 3; r++) {
        const double f = fma_issue(&sink), m = max_pass(&sink), e = exp_pass(&sink);
        printf("round %d: per 16 scores: max %.3f ns (%.1f FMA slots), exp %.3f ns (%.1f FMA "
               "slots); FMA %.4f ns each (%.1f GFLOP/s)\n",
               r, m, m / f, e, e / f, f, 32.0 / f);
        for (int D = 64; D <= 128; D *= 2) {
            const double prod = 2.0 * D * f;
            printf("  D = %3d: products %.2f ns per 16 scores; ceiling with perfect products "
                   "%.1f %% of the FMA peak\n",
                   D, prod, 100.0 * prod / (prod + m + e));
        }
    }
    return sink == 12345.0f; /* keep the work */
}
