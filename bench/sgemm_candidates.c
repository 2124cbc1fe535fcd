/* fp32 GEMM candidates side by side: attn_sgemm (each isa.c row this CPU
 * runs, forced through ATTN_FUSED_ISA), OpenBLAS, BLIS and oneDNN, on
 * row-major C = A B (SIZE: M = N = K, or MxNxK), in interleaved rounds; per
 * candidate the median over rounds of each round's best of REPS.
 *   sgemm_candidates [SIZE [THREADS [ROUNDS [REPS]]]]
 * SGEMM_BLOCKS="KC,MC,NC KC,MC,NC ..." compares blockings of the CPU's best
 * attn row (or SGEMM_ROW's, an ATTN_FUSED_ISA value) instead, with OpenBLAS
 * beside them as the common reference.
 * SGEMM_CLOCK=cpu times by the process's CPU time instead of the wall clock
 * (steadier on a shared machine; with 1 thread only: it sums the threads).
 * "micro-kernel alone" is the best row's micro-kernel over one packed
 * block pair (A: MC x KC, B: KC x NC, the kernel's blocking capped at the
 * problem, whole tiles only), the driver's loop order without its packing
 * and with C's block written in place: the ceiling the driver works under.
 * BLIS and oneDNN are opened with dlopen (RTLD_LOCAL: BLIS's BLAS symbols
 * would clash with OpenBLAS's); a missing one is skipped. Built and run by
 * bench/sgemm_candidates.sh. */
#define _POSIX_C_SOURCE 200809L
#include <cblas.h>
#include <dlfcn.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fma_peak.h"
#include "internal.h"

typedef void (*bli_sgemm_fn)(int, int, int64_t, int64_t, int64_t, const float *, const float *,
                             int64_t, int64_t, const float *, int64_t, int64_t, const float *,
                             float *, int64_t, int64_t);
typedef void (*bli_threads_fn)(int64_t);
typedef int (*dnnl_sgemm_fn)(char, char, int64_t, int64_t, int64_t, float, const float *, int64_t,
                             const float *, int64_t, float, float *, int64_t);

static bli_sgemm_fn g_bli;
static bli_threads_fn g_bli_threads;
static dnnl_sgemm_fn g_dnnl;
static int64_t g_m, g_n, g_k;
static int g_threads;
static const float *g_A, *g_B;
static float *g_C;

static clockid_t g_clock = CLOCK_MONOTONIC;

static double now(void);
static double timer(void) { return now(); }

static double now(void) {
    struct timespec t;
    clock_gettime(g_clock, &t);
    return t.tv_sec + 1e-9 * t.tv_nsec;
}

enum { MAXC = 16 };
static const char *g_names[MAXC];
static int g_kinds[MAXC]; /* 0: attn row (g_rows), 1 OpenBLAS, 2 BLIS, 3 oneDNN, 4 micro-kernel */
static double g_flops[MAXC]; /* per call */
/* the micro-kernel alone: its kernel, packed blocks [np][kc][mr] and
 * [nq][kc][nr] */
static const attn_sgemm_kernel *g_uk;
static float *g_ukA, *g_ukB;
static int64_t g_uk_kc, g_uk_np, g_uk_nq;
static const char *g_rows[MAXC];
static int64_t g_blocks[MAXC][3]; /* attn rows: blocking (0: the kernel's) */
static int g_nc;

static void run(int c) {
    const int64_t m = g_m, n = g_n, k = g_k;
    switch (g_kinds[c]) {
    case 0:
        setenv("ATTN_FUSED_ISA", g_rows[c], 1);
        attn_test_reload_env();
        attn_test_sgemm_blocking(g_blocks[c][0], g_blocks[c][1], g_blocks[c][2]);
        attn_sgemm(0, 0, m, n, k, 1.0f, g_A, k, g_B, n, 0.0f, g_C, n, g_threads);
        break;
    case 1:
        openblas_set_num_threads(g_threads);
        omp_set_num_threads(g_threads);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (blasint)m, (blasint)n, (blasint)k,
                    1.0f, g_A, (blasint)k, g_B, (blasint)n, 0.0f, g_C, (blasint)n);
        break;
    case 2: {
        const float one = 1.0f, zero = 0.0f;
        g_bli_threads(g_threads);
        g_bli(0, 0, m, n, k, &one, g_A, k, 1, g_B, n, 1, &zero, g_C, n, 1);
        break;
    }
    case 3:
        omp_set_num_threads(g_threads);
        g_dnnl('N', 'N', m, n, k, 1.0f, g_A, k, g_B, n, 0.0f, g_C, n);
        break;
    case 4: {
        const int64_t mr = g_uk->mr, nr = g_uk->nr, kc = g_uk_kc;
        for (int64_t q = 0; q < g_uk_nq; q++)
            for (int64_t p = 0; p < g_uk_np; p++)
                g_uk->ukr(kc, g_ukA + p * mr * kc, g_ukB + q * nr * kc, g_C + p * mr * n + q * nr, n,
                          1.0f, 0.0f, 1);
        break;
    }
    }
}

static int cmp(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    long long dims[3] = {1024, 1024, 1024};
    if (argc > 1 && sscanf(argv[1], "%lldx%lldx%lld", &dims[0], &dims[1], &dims[2]) != 3)
        dims[0] = dims[1] = dims[2] = atoll(argv[1]);
    g_m = dims[0], g_n = dims[1], g_k = dims[2];
    g_threads = argc > 2 ? atoi(argv[2]) : 1;
    const int rounds = argc > 3 ? atoi(argv[3]) : 5, reps = argc > 4 ? atoi(argv[4]) : 3;
    const int64_t m = g_m, n = g_n, k = g_k;
    const char *clk = getenv("SGEMM_CLOCK");
    if (clk && !strcmp(clk, "cpu")) g_clock = CLOCK_PROCESS_CPUTIME_ID;
    float *A = malloc((size_t)(m * k) * sizeof(float)), *B = malloc((size_t)(k * n) * sizeof(float));
    g_C = malloc((size_t)(m * n) * sizeof(float));
    for (int64_t i = 0; i < m * k; i++) A[i] = (float)(i % 13) * 0.1f - 0.6f;
    for (int64_t i = 0; i < k * n; i++) B[i] = (float)(i % 7) * 0.2f - 0.6f;
    g_A = A, g_B = B;
    const char *blocks = getenv("SGEMM_BLOCKS");
    static char names[MAXC][48];
    while (blocks && *blocks && g_nc < MAXC - 1) {
        long long kc, mc, nc;
        int used;
        if (sscanf(blocks, " %lld,%lld,%lld%n", &kc, &mc, &nc, &used) != 3) break;
        blocks += used;
        g_blocks[g_nc][0] = kc, g_blocks[g_nc][1] = mc, g_blocks[g_nc][2] = nc;
        snprintf(names[g_nc], sizeof names[0], "attn KC %lld MC %lld NC %lld", kc, mc, nc);
        const char *row = getenv("SGEMM_ROW");
        g_names[g_nc] = names[g_nc], g_kinds[g_nc] = 0, g_rows[g_nc++] = row ? row : "";
    }
    const int by_blocks = g_nc > 0;
    for (int i = 0; !by_blocks && attn_test_isa_name(i); i++) {
        const char *row = attn_test_isa_name(i);
        if (!strcmp(row, "avx512bf16")) continue; /* the same micro-kernel as avx512 */
        setenv("ATTN_FUSED_ISA", row, 1);
        attn_test_reload_env();
        if (strcmp(attn_sgemm_kernel_active()->name, row)) continue; /* the CPU does not run it */
        snprintf(names[g_nc], sizeof names[0], "attn %s", row);
        g_names[g_nc] = names[g_nc], g_kinds[g_nc] = 0, g_rows[g_nc++] = row;
    }
    if (!by_blocks && g_threads == 1 && g_nc > 0) {
        /* the best row's micro-kernel alone (one thread: the driver's
         * threads share out these tiles) */
        setenv("ATTN_FUSED_ISA", g_rows[0], 1);
        attn_test_reload_env();
        g_uk = attn_sgemm_kernel_active();
        const int64_t mr = g_uk->mr, nr = g_uk->nr;
        g_uk_kc = k < g_uk->kc ? k : g_uk->kc;
        g_uk_np = (m < g_uk->mc ? m : g_uk->mc) / mr, g_uk_nq = (n < g_uk->nc ? n : g_uk->nc) / nr;
        g_ukA = aligned_alloc(64, ((size_t)(g_uk_np * mr * g_uk_kc) * sizeof(float) + 63) / 64 * 64);
        g_ukB = aligned_alloc(64, ((size_t)(g_uk_nq * nr * g_uk_kc) * sizeof(float) + 63) / 64 * 64);
        if (g_uk_np > 0 && g_uk_nq > 0 && g_ukA && g_ukB) {
            g_uk->pack_a(A, k, 0, 0, g_uk_np * mr, 0, g_uk_kc, 0, g_uk_np, g_ukA);
            g_uk->pack_b(B, n, 0, 0, g_uk_kc, 0, g_uk_nq * nr, 0, g_uk_nq, g_ukB);
            static char ukname[48];
            snprintf(ukname, sizeof ukname, "attn %s micro-kernel alone", g_rows[0]);
            g_flops[g_nc] = 2.0 * (double)(g_uk_np * mr) * (double)(g_uk_nq * nr) * (double)g_uk_kc;
            g_names[g_nc] = ukname, g_kinds[g_nc++] = 4;
        }
    }
    static char obname[64];
    snprintf(obname, sizeof obname, "OpenBLAS (%s)", openblas_get_corename());
    g_names[g_nc] = obname, g_kinds[g_nc++] = 1;
    void *blis = getenv("SGEMM_BLOCKS") ? NULL : dlopen("libblis.so.4", RTLD_NOW | RTLD_LOCAL);
    if (blis && (g_bli = (bli_sgemm_fn)dlsym(blis, "bli_sgemm")) &&
        (g_bli_threads = (bli_threads_fn)dlsym(blis, "bli_thread_set_num_threads")))
        g_names[g_nc] = "BLIS", g_kinds[g_nc++] = 2;
    void *dnnl = getenv("SGEMM_BLOCKS") ? NULL : dlopen("libdnnl.so.2", RTLD_NOW | RTLD_LOCAL);
    if (dnnl && (g_dnnl = (dnnl_sgemm_fn)dlsym(dnnl, "dnnl_sgemm")))
        g_names[g_nc] = "oneDNN", g_kinds[g_nc++] = 3;
    double t[MAXC][64];
    const char *peak_isa;
    const int no_peak = getenv("SGEMM_NOPEAK") != NULL; /* set: skip the peak (comparing builds) */
    const double peak0 = no_peak ? 1 : fma_peak_gflops(g_threads, timer, &peak_isa);
    for (int c = 0; c < g_nc; c++) run(c); /* warm-up */
    for (int r = 0; r < rounds && r < 64; r++)
        for (int c = 0; c < g_nc; c++) {
            double best = 1e30;
            for (int k = 0; k < reps; k++) {
                const double t0 = now();
                run(c);
                const double dt = now() - t0;
                best = dt < best ? dt : best;
            }
            t[c][r] = best;
        }
    const double peak1 = no_peak ? 1 : fma_peak_gflops(g_threads, timer, NULL);
    const double peak = 0.5 * (peak0 + peak1);
    if (!no_peak)
        printf("FMA peak (%s loop), %d thread(s): %.1f GFLOP/s before, %.1f after\n", peak_isa,
           g_threads, peak0, peak1);
    printf("sgemm %lldx%lldx%lld, %d thread(s), %d interleaved rounds (median of each round's best of %d), "
           "%s clock\n",
           (long long)m, (long long)n, (long long)k, g_threads, rounds, reps, g_clock == CLOCK_MONOTONIC ? "wall" : "CPU");
    for (int c = 0; c < g_nc; c++) {
        qsort(t[c], (size_t)rounds, sizeof(double), cmp);
        const double med = t[c][rounds / 2];
        const double g = (g_flops[c] > 0 ? g_flops[c] : 2.0 * m * n * k) / med * 1e-9;
        if (no_peak)
            printf("  %-34s %8.1f GFLOP/s\n", g_names[c], g);
        else
            printf("  %-34s %8.1f GFLOP/s  %5.1f %% of peak\n", g_names[c], g, 100.0 * g / peak);
    }
    free(A), free(B), free(g_C), free(g_ukA), free(g_ukB);
    return 0;
}
