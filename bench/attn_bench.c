/* attn-bench: time attn_sdpa_forward / attn_sdpa_backward on a suite of
 * shapes, for the fused and the reference path.
 *
 *   attn-bench [--threads N] [--impl reference|fused] [--case B,H,Lq,Lk,D,causal]...
 *              [--reps N] [--json] [--clock wall|cpu] [--tile-gemm own|blas]
 *
 * --tile-gemm blas runs the fused path's tile products through OpenBLAS
 * sgemm (single-threaded) instead of its own micro-kernel, to measure the
 * one against the other (a hook of src/internal.h; not in the library's API).
 *
 * Each case runs forward ("fwd") and backward ("bwd"): one warm-up call, then
 * the median of --reps (default 5) timed calls, or of more for short calls
 * (about 0.5 s worth, at most 51: steadier medians on a shared machine). GFLOP/s use the dense count
 * 4·B·H·Lq·Lk·D (fwd) and 10·B·H·Lq·Lk·D (bwd), also under a causal mask, so
 * causal cases show the work they skip as speed. peak_frac divides by an fp32
 * FMA peak measured at start-up on the same threads (a register-resident FMA
 * loop, ~1 s). rss_mb is the process's peak RSS so far (getrusage), so it
 * only bounds a case's own footprint when the case runs alone or first.
 * Without --impl both paths run, but the reference path is skipped when
 * Lq·Lk > 2048·2048 (it would take minutes); --impl reference forces it. */
#define _POSIX_C_SOURCE 200809L
#include "attn.h"
#include "internal.h" /* attn_test_fused_blas */

#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif

typedef struct {
    int64_t B, H, Lq, Lk, D;
    int causal;
} bcase;

static const bcase kSuite[] = {
    {32, 8, 64, 64, 32, 0},      {32, 8, 128, 128, 32, 1},  {4, 8, 512, 512, 64, 1},
    {1, 8, 1024, 1024, 64, 0},   {1, 8, 2048, 2048, 64, 1}, {1, 8, 4096, 4096, 64, 0},
    {1, 8, 16384, 16384, 64, 1}, {16, 8, 1, 2048, 64, 0},
};
#define REF_MAX_CELLS (2048LL * 2048LL)

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* --clock cpu: the process's CPU time divided by the thread count, i.e. what
 * a call would take on cores of its own (spin-waiting included). For shared
 * machines, where wall time mostly measures the neighbours. */
static int g_cpu_clock, g_threads = 1;
static double timer_s(void) {
    if (!g_cpu_clock) return now_s();
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return ((double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec) / g_threads;
}

static double peak_rss_mb(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_maxrss / 1024.0; /* Linux: kilobytes */
}

/* ------------------------------------------------------------ FMA peak */

/* FLOPs of `iters` iterations of 12 independent FMA chains of vector width
 * w on one thread: a register-resident loop, no memory traffic (12 chains
 * cover 2 FMA units x 4-6 cycles latency). Spelled out so that the
 * accumulators live in registers at any optimisation level. */
#define FMA12(fma)                                                                                 \
    a0 = fma(a0, x, y), a1 = fma(a1, x, y), a2 = fma(a2, x, y), a3 = fma(a3, x, y);                \
    a4 = fma(a4, x, y), a5 = fma(a5, x, y), a6 = fma(a6, x, y), a7 = fma(a7, x, y);                \
    a8 = fma(a8, x, y), a9 = fma(a9, x, y), a10 = fma(a10, x, y), a11 = fma(a11, x, y)
#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target("avx512f"))) static double fma_loop_avx512(long iters) {
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
__attribute__((target("avx2,fma"))) static double fma_loop_avx2(long iters) {
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
static double fma_loop_scalar(long iters) {
    const float x = 0.999999f, y = 1e-7f;
    float a0 = 0.f, a1 = 1.f, a2 = 2.f, a3 = 3.f, a4 = 4.f, a5 = 5.f, a6 = 6.f, a7 = 7.f, a8 = 8.f,
          a9 = 9.f, a10 = 10.f, a11 = 11.f;
    for (long it = 0; it < iters; it++) { FMA12(fmaf); }
    volatile float sink = a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7 + a8 + a9 + a10 + a11;
    (void)sink;
    return (double)iters * 12 * 2;
}

static const char *g_peak_isa = "scalar";
static double fma_loop(long iters) {
#if defined(__x86_64__) && defined(__GNUC__)
    if (__builtin_cpu_supports("avx512f")) return fma_loop_avx512(iters);
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        return fma_loop_avx2(iters);
#endif
    return fma_loop_scalar(iters);
}

/* GFLOP/s of all threads running the loop at once, best of 3 (~1 s). */
static double measure_peak(int threads) {
#if defined(__x86_64__) && defined(__GNUC__)
    g_peak_isa = __builtin_cpu_supports("avx512f")                                 ? "avx512"
                 : __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") ? "avx2"
                                                                                   : "scalar";
#endif
    long iters = 1 << 20;
    double best = 0.0;
    for (;;) { /* size the loop to ~0.3 s */
        double t0 = now_s(), fl = fma_loop(iters), dt = now_s() - t0;
        (void)fl;
        if (dt > 0.05) {
            iters = (long)((double)iters * 0.3 / dt);
            break;
        }
        iters *= 4;
    }
    for (int rep = 0; rep < 3; rep++) {
        double flops = 0.0, t0 = timer_s();
#pragma omp parallel num_threads(threads) reduction(+ : flops)
        flops += fma_loop(iters);
        double g = flops / (timer_s() - t0) / 1e9;
        if (g > best) best = g;
    }
    return best;
}

/* ------------------------------------------------------------ timing */

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static float *alloc_fill(size_t n, unsigned seed) {
    float *x = malloc(n * sizeof(float));
    if (!x) {
        fprintf(stderr, "attn-bench: out of memory (%zu floats)\n", n);
        exit(2);
    }
    unsigned s = seed * 2654435761u + 1u;
    for (size_t i = 0; i < n; i++) {
        unsigned h = (unsigned)i * 2246822519u ^ s;
        h ^= h >> 15;
        h *= 2654435761u;
        h ^= h >> 13;
        x[i] = (float)(h & 0xFFFF) / 32768.0f - 1.0f;
    }
    return x;
}

typedef struct {
    const char *impl, *op;
    bcase c;
    double ms, gflops, peak_frac, rss_mb;
} result;

static void emit(const result *r, int json, double peak) {
    if (json) {
        printf("{\"impl\": \"%s\", \"op\": \"%s\", \"B\": %lld, \"H\": %lld, \"Lq\": %lld, "
               "\"Lk\": %lld, \"D\": %lld, \"causal\": %s, \"ms\": %.3f, \"gflops\": %.2f, "
               "\"peak_frac\": %.4f, \"rss_mb\": %.1f}\n",
               r->impl, r->op, (long long)r->c.B, (long long)r->c.H, (long long)r->c.Lq,
               (long long)r->c.Lk, (long long)r->c.D, r->c.causal ? "true" : "false", r->ms,
               r->gflops, r->peak_frac, r->rss_mb);
    } else {
        printf("%-9s %-3s %5lld %3lld %6lld %6lld %4lld %-6s %10.3f %9.1f %6.1f%% %9.1f\n", r->impl,
               r->op, (long long)r->c.B, (long long)r->c.H, (long long)r->c.Lq, (long long)r->c.Lk,
               (long long)r->c.D, r->c.causal ? "yes" : "no", r->ms, r->gflops,
               100.0 * r->peak_frac, r->rss_mb);
    }
    (void)peak;
    fflush(stdout);
}

/* Timed calls for one measurement: at least reps, more for short calls
 * (about 0.5 s of them, at most 51) so that the median is not at the mercy
 * of the scheduler's time slices on a shared machine. */
static int runs_for(double warmup_s, int reps) {
    int n = reps;
    if (warmup_s > 0 && 0.5 / warmup_s > n) n = (int)(0.5 / warmup_s);
    if (n > 51 && n > reps) n = reps > 51 ? reps : 51;
    return n;
}

static int run_case(const bcase *c, attn_impl impl, int threads, int reps, double peak, int json) {
    const int64_t B = c->B, H = c->H, Lq = c->Lq, Lk = c->Lk, D = c->D;
    const size_t nq = (size_t)(B * H * Lq * D), nk = (size_t)(B * H * Lk * D),
                 nl = (size_t)(B * H * Lq);
    float *q = alloc_fill(nq, 1), *k = alloc_fill(nk, 2), *v = alloc_fill(nk, 3);
    float *o = alloc_fill(nq, 4), *lse = alloc_fill(nl, 5);
    attn_tensor tq = attn_tensor_bhld(q, B, H, Lq, D), tk = attn_tensor_bhld(k, B, H, Lk, D),
                tv = attn_tensor_bhld(v, B, H, Lk, D), to = attn_tensor_bhld(o, B, H, Lq, D);
    attn_sdpa_params p;
    memset(&p, 0, sizeof p);
    p.causal = c->causal;
    p.impl = impl;
    p.num_threads = threads;
    attn_error err;
    const char *iname = impl == ATTN_IMPL_REFERENCE ? "reference" : "fused";
    double *ts = malloc((size_t)reps * sizeof(double));
    const double cells = (double)B * (double)H * (double)Lq * (double)Lk * (double)D;

    /* forward: warm-up (also sizes the run), then the timed calls */
    double tw = now_s();
    if (attn_sdpa_forward(&tq, &tk, &tv, &p, &to, NULL, lse, NULL, &err) != ATTN_OK) {
        fprintf(stderr, "attn-bench: forward failed: %s\n", err.message);
        return 1;
    }
    int n = runs_for(now_s() - tw, reps);
    ts = realloc(ts, (size_t)n * sizeof(double));
    for (int r = 0; r < n; r++) {
        double t0 = timer_s();
        attn_sdpa_forward(&tq, &tk, &tv, &p, &to, NULL, lse, NULL, &err);
        ts[r] = timer_s() - t0;
    }
    qsort(ts, (size_t)n, sizeof(double), cmp_double);
    result res = {iname, "fwd", *c, 0, 0, 0, 0};
    res.ms = 1e3 * ts[n / 2];
    res.gflops = 4.0 * cells / ts[n / 2] / 1e9;
    res.peak_frac = res.gflops / peak;
    res.rss_mb = peak_rss_mb();
    emit(&res, json, peak);

    /* backward (out and lse from the last forward) */
    float *go = alloc_fill(nq, 6), *dq = alloc_fill(nq, 7), *dk = alloc_fill(nk, 8),
          *dv = alloc_fill(nk, 9);
    attn_tensor tgo = attn_tensor_bhld(go, B, H, Lq, D), tdq = attn_tensor_bhld(dq, B, H, Lq, D),
                tdk = attn_tensor_bhld(dk, B, H, Lk, D), tdv = attn_tensor_bhld(dv, B, H, Lk, D);
    tw = now_s();
    if (attn_sdpa_backward(&tq, &tk, &tv, &to, lse, &tgo, &p, &tdq, &tdk, &tdv, NULL, &err) !=
        ATTN_OK) {
        fprintf(stderr, "attn-bench: backward failed: %s\n", err.message);
        return 1;
    }
    n = runs_for(now_s() - tw, reps);
    ts = realloc(ts, (size_t)n * sizeof(double));
    for (int r = 0; r < n; r++) {
        double t0 = timer_s();
        attn_sdpa_backward(&tq, &tk, &tv, &to, lse, &tgo, &p, &tdq, &tdk, &tdv, NULL, &err);
        ts[r] = timer_s() - t0;
    }
    qsort(ts, (size_t)n, sizeof(double), cmp_double);
    res.op = "bwd";
    res.ms = 1e3 * ts[n / 2];
    res.gflops = 10.0 * cells / ts[n / 2] / 1e9;
    res.peak_frac = res.gflops / peak;
    res.rss_mb = peak_rss_mb();
    emit(&res, json, peak);

    free(ts), free(q), free(k), free(v), free(o), free(lse);
    free(go), free(dq), free(dk), free(dv);
    return 0;
}

static int parse_case(const char *s, bcase *c) {
    long long b, h, lq, lk, d;
    char cz[16] = {0};
    if (sscanf(s, "%lld,%lld,%lld,%lld,%lld,%15s", &b, &h, &lq, &lk, &d, cz) != 6) return 0;
    if (b <= 0 || h <= 0 || lq <= 0 || lk <= 0 || d <= 0) return 0;
    if (!strcmp(cz, "1") || !strcmp(cz, "yes") || !strcmp(cz, "true"))
        c->causal = 1;
    else if (!strcmp(cz, "0") || !strcmp(cz, "no") || !strcmp(cz, "false"))
        c->causal = 0;
    else
        return 0;
    c->B = b, c->H = h, c->Lq = lq, c->Lk = lk, c->D = d;
    return 1;
}

static void usage(void) {
    fprintf(stderr, "usage: attn-bench [--threads N] [--impl reference|fused] [--reps N] [--json]\n"
                    "                  [--clock wall|cpu] [--tile-gemm own|blas]\n"
                    "                  [--case B,H,Lq,Lk,D,causal]...   (causal: 0/1 or no/yes)\n");
}

int main(int argc, char **argv) {
    int threads = attn_get_num_threads(), json = 0, reps = 5, want_ref = 1, want_fused = 1,
        forced = 0;
    bcase *cases = NULL;
    size_t ncases = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--json")) {
            json = 1;
        } else if (!strcmp(a, "--threads") && i + 1 < argc) {
            threads = atoi(argv[++i]);
            if (threads < 1) return usage(), 2;
        } else if (!strcmp(a, "--clock") && i + 1 < argc) {
            const char *v = argv[++i];
            if (!strcmp(v, "cpu"))
                g_cpu_clock = 1;
            else if (!strcmp(v, "wall"))
                g_cpu_clock = 0;
            else
                return usage(), 2;
        } else if (!strcmp(a, "--tile-gemm") && i + 1 < argc) {
            const char *v = argv[++i];
            if (!strcmp(v, "blas"))
                attn_test_fused_blas(1);
            else if (strcmp(v, "own"))
                return usage(), 2;
        } else if (!strcmp(a, "--reps") && i + 1 < argc) {
            reps = atoi(argv[++i]);
            if (reps < 1) return usage(), 2;
        } else if (!strcmp(a, "--impl") && i + 1 < argc) {
            const char *v = argv[++i];
            if (!forced) want_ref = want_fused = 0;
            forced = 1;
            if (!strcmp(v, "reference"))
                want_ref = 1;
            else if (!strcmp(v, "fused"))
                want_fused = 1;
            else
                return usage(), 2;
        } else if (!strcmp(a, "--case") && i + 1 < argc) {
            cases = realloc(cases, (ncases + 1) * sizeof *cases);
            if (!parse_case(argv[++i], &cases[ncases])) {
                fprintf(stderr, "attn-bench: bad --case '%s'\n", argv[i]);
                return usage(), 2;
            }
            ncases++;
        } else {
            return usage(), 2;
        }
    }
    if (!ncases) {
        ncases = sizeof kSuite / sizeof kSuite[0];
        cases = malloc(sizeof kSuite);
        memcpy(cases, kSuite, sizeof kSuite);
    }
    attn_set_num_threads(threads, NULL);
    g_threads = threads;
    const double peak = measure_peak(threads);
    if (json)
        printf(
            "{\"peak_gflops\": %.2f, \"peak_isa\": \"%s\", \"threads\": %d, \"clock\": \"%s\"}\n",
            peak, g_peak_isa, threads, g_cpu_clock ? "cpu" : "wall");
    else
        printf("threads %d, measured fp32 FMA peak %.1f GFLOP/s (%s), %s clock\n"
               "%-9s %-3s %5s %3s %6s %6s %4s %-6s %10s %9s %7s %9s\n",
               threads, peak, g_peak_isa, g_cpu_clock ? "cpu-time" : "wall", "impl", "op", "B", "H",
               "Lq", "Lk", "D", "causal", "ms", "GFLOP/s", "peak", "rss_MB");
    int rc = 0;
    for (size_t i = 0; i < ncases; i++) {
        const bcase *c = &cases[i];
        if (want_fused) rc |= run_case(c, ATTN_IMPL_FUSED, threads, reps, peak, json);
        if (want_ref) {
            if (!forced && (double)c->Lq * (double)c->Lk > (double)REF_MAX_CELLS) {
                if (json)
                    printf("{\"impl\": \"reference\", \"B\": %lld, \"H\": %lld, \"Lq\": %lld, "
                           "\"Lk\": %lld, \"D\": %lld, \"causal\": %s, \"skipped\": \"Lq*Lk > "
                           "2048*2048; pass --impl reference to run it\"}\n",
                           (long long)c->B, (long long)c->H, (long long)c->Lq, (long long)c->Lk,
                           (long long)c->D, c->causal ? "true" : "false");
                else
                    printf("reference skipped for Lq*Lk > 2048*2048 (pass --impl reference)\n");
                continue;
            }
            rc |= run_case(c, ATTN_IMPL_REFERENCE, threads, reps, peak, json);
        }
    }
    free(cases);
    return rc;
}
