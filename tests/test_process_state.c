/* The library leaves the process as it found it, and concurrent callers are
 * safe by construction (attn.h, "Threads and OpenBLAS"):
 *   - OpenMP's default team size (omp_get_max_threads, which the
 *     application sets here to an odd value) and OpenBLAS's thread count
 *     are the same after every public entry point as before (recorded after
 *     the library's one-time init, which with OpenBLAS's pthread build sets
 *     OpenBLAS to 1 thread once);
 *   - attn_sgemm, the library's one BLAS entry, gives bitwise the same C
 *     for 1, 2 and 3 threads on shapes whose rows cross OpenBLAS's
 *     micro-tile edges (all transposes used; it cuts rows at the step its
 *     init measured), each within fp32 rounding of an fp64 product;
 *   - two application threads running MHA forward + backward and KV-cache
 *     steps at the same time, with different thread counts, get bitwise the
 *     results one caller gets alone;
 *   - the floating-point mode (x86's MXCSR: the fused kernels flush
 *     subnormals inside their parallel regions) is the caller's and every
 *     OpenMP thread's as before, whichever mode the application had set;
 *   - on Linux, the process's permission to use AMX tile data is as before
 *     after bf16 forward and backward calls (only attn_enable_amx asks for
 *     it), and attn_enable_amx gets it exactly where the CPU has AMX. */
#if defined(__linux__) && !defined(_GNU_SOURCE)
#define _GNU_SOURCE /* syscall() */
#endif
#include "internal.h" /* attn_sgemm */
#include "testutil.h"

#include <cblas.h>
#include <omp.h>
#include <pthread.h>
#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#endif
#if defined(__x86_64__) && defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

enum { E = 16, NH = 4, B = 2, L = 29 };

static float params[4 * E * E + 4 * E], x[B * L * E], dy[B * L * E];

typedef struct {
    float y[B * L * E], dx[B * L * E], g[4 * E * E + 4 * E], ys[B * L * E];
} results;

/* One caller's work: causal forward, backward, then the sequence again
 * token by token through a KV cache. */
static void work(int threads, results *r) {
    attn_mha_config c = {E, NH, 0, 0, 1, 0};
    attn_mha_weights w, gw;
    attn_mha_weights_from_buffer(&c, params, &w, NULL);
    memset(r, 0, sizeof *r);
    attn_mha_weights_from_buffer(&c, r->g, &gw, NULL);
    attn_sdpa_params p = {0};
    p.causal = 1, p.num_threads = threads;
    size_t nc = 0;
    attn_mha_cache_size(&c, B, L, L, &nc, NULL);
    float *cache = tu_malloc(nc * sizeof(float));
    attn_error err;
    CHECK(attn_mha_forward(&c, &w, B, L, L, x, x, x, &p, r->y, ATTN_WEIGHTS_NONE, NULL, cache,
                           &err) == ATTN_OK,
          "forward: %s", err.message);
    CHECK(attn_mha_backward(&c, &w, B, L, L, x, x, x, &p, cache, dy, r->dx, r->dx, r->dx, &gw,
                            &err) == ATTN_OK,
          "backward: %s", err.message);
    free(cache);
    attn_mha_kv_shape s = {B, L, 1, threads};
    size_t bytes = 0;
    attn_mha_kv_bytes(&c, &s, &bytes, NULL);
    void *mem = tu_malloc(bytes);
    attn_mha_kv kv;
    attn_mha_kv_init(&c, &s, mem, bytes, &kv, NULL);
    attn_sdpa_params ps = {0};
    ps.num_threads = threads;
    for (int t = 0; t < L; t++) {
        float xt[B * E], yt[B * E];
        for (int b = 0; b < B; b++) memcpy(xt + b * E, x + (b * L + t) * E, E * sizeof(float));
        CHECK(attn_mha_step(&c, &w, &kv, B, 1, xt, &ps, yt, &err) == ATTN_OK, "step: %s",
              err.message);
        for (int b = 0; b < B; b++) memcpy(r->ys + (b * L + t) * E, yt + b * E, E * sizeof(float));
    }
    free(mem);
}

static void test_state_untouched(void) {
    attn_get_num_threads(); /* the one-time init */
    omp_set_num_threads(3);
    const int omp_before = omp_get_max_threads(), blas_before = openblas_get_num_threads();
    results *r = tu_malloc(sizeof *r);
    for (int t = 1; t <= 3; t++) {
        work(t, r);
        CHECK(omp_get_max_threads() == omp_before && openblas_get_num_threads() == blas_before,
              "after calls with %d threads: omp_get_max_threads %d (was %d), OpenBLAS threads %d "
              "(was %d)",
              t, omp_get_max_threads(), omp_before, openblas_get_num_threads(), blas_before);
    }
    /* the SDPA entry points and the fused path's BLAS hook too */
    float q[2 * 3 * 9 * 8], o[2 * 3 * 9 * 8], lse[2 * 3 * 9], dq[2 * 3 * 9 * 8], dk[2 * 3 * 9 * 8],
        dv[2 * 3 * 9 * 8];
    tu_rng rng = tu_seed(4);
    tu_fill(&rng, q, sizeof q / 4, -1, 1);
    attn_tensor t = attn_tensor_bhld(q, 2, 3, 9, 8), to = attn_tensor_bhld(o, 2, 3, 9, 8),
                tdq = attn_tensor_bhld(dq, 2, 3, 9, 8), tdk = attn_tensor_bhld(dk, 2, 3, 9, 8),
                tdv = attn_tensor_bhld(dv, 2, 3, 9, 8);
    for (int blas = 0; blas < 2; blas++)
        for (int impl = 1; impl <= 2; impl++) {
            attn_test_fused_blas(blas);
            attn_sdpa_params p = {0};
            p.impl = (attn_impl)impl, p.num_threads = 1 + blas;
            CHECK(attn_sdpa_forward(&t, &t, &t, &p, &to, NULL, lse, NULL, NULL) == ATTN_OK &&
                      attn_sdpa_backward(&t, &t, &t, &to, lse, &t, &p, &tdq, &tdk, &tdv, NULL,
                                         NULL) == ATTN_OK,
                  "sdpa impl %d", impl);
            CHECK(omp_get_max_threads() == omp_before && openblas_get_num_threads() == blas_before,
                  "after SDPA (impl %d, BLAS tiles %d): omp %d, OpenBLAS %d", impl, blas,
                  omp_get_max_threads(), openblas_get_num_threads());
        }
    attn_test_fused_blas(0);
    omp_set_num_threads(omp_get_num_procs());
    free(r);
}

#if defined(__x86_64__) || defined(__i386__)
/* MXCSR's control bits (not the sticky exception flags, bits 0-5, which
 * any arithmetic raises) of the caller and of 3 OpenMP threads, into m[0..3]. */
static void read_modes(unsigned m[4]) {
    m[0] = _mm_getcsr() & ~0x3fu;
    m[1] = m[2] = m[3] = 0;
#pragma omp parallel num_threads(3)
    m[1 + omp_get_thread_num()] = _mm_getcsr() & ~0x3fu;
}

/* The caller and 3 OpenMP threads set to mode v. */
static void set_modes(unsigned v) {
    _mm_setcsr(v);
#pragma omp parallel num_threads(3)
    _mm_setcsr(v);
}

/* Fused forward and backward (tiled and decode) with ALiBi steep enough
 * that exp() underflows (the kernels flush subnormals meanwhile): every
 * thread's mode after the calls is the one the application set, with its
 * FTZ and DAZ off and on. */
static void test_fp_mode_untouched(void) {
    enum { Bq = 1, Hq = 2, Lq = 70, Lk = 300, D = 16 };
    float *q = tu_malloc(sizeof(float) * Bq * Hq * Lk * D),
          *o = tu_malloc(sizeof(float) * Bq * Hq * Lq * D);
    float *g = tu_malloc(sizeof(float) * Bq * Hq * Lk * D * 3), lse[Bq * Hq * Lq];
    tu_rng rng = tu_seed(6);
    tu_fill(&rng, q, Bq * Hq * Lk * D, -1, 1);
    const float slopes[Hq] = {1.0f, 0.5f};
    const unsigned saved = _mm_getcsr();
    const unsigned mode[2] = {0x1f80u, 0x9fc0u}; /* the default; FTZ and DAZ on */
    for (int app = 0; app < 2; app++) {
        set_modes(mode[app]);
        for (int lq = 1; lq <= Lq; lq += Lq - 1)
            for (int t = 1; t <= 3; t += 2) {
                attn_tensor tq = attn_tensor_bhld(q, Bq, Hq, lq, D),
                            tk = attn_tensor_bhld(q, Bq, Hq, Lk, D),
                            to = attn_tensor_bhld(o, Bq, Hq, lq, D),
                            tdq = attn_tensor_bhld(g, Bq, Hq, lq, D),
                            tdk = attn_tensor_bhld(g + Bq * Hq * Lk * D, Bq, Hq, Lk, D),
                            tdv = attn_tensor_bhld(g + 2 * Bq * Hq * Lk * D, Bq, Hq, Lk, D);
                attn_sdpa_params p = {0};
                p.impl = ATTN_IMPL_FUSED, p.num_threads = t, p.alibi_slopes = slopes;
                attn_error err;
                CHECK(attn_sdpa_forward(&tq, &tk, &tk, &p, &to, NULL, lse, NULL, &err) == ATTN_OK &&
                          attn_sdpa_backward(&tq, &tk, &tk, &to, lse, &to, &p, &tdq, &tdk, &tdv,
                                             NULL, &err) == ATTN_OK,
                      "alibi lq %d threads %d: %s", lq, t, err.message);
                unsigned after[4];
                read_modes(after);
                for (int i = 0; i < 4; i++)
                    CHECK(after[i] == mode[app],
                          "mode %#x, lq %d, threads %d: MXCSR of %s %d is %#x", mode[app], lq, t,
                          i ? "OpenMP thread" : "the caller", i ? i - 1 : 0, after[i]);
            }
    }
    set_modes(saved);
    free(q), free(o), free(g);
}
#else
static void test_fp_mode_untouched(void) {}
#endif

/* attn_sgemm over rows that cross micro-tile edges, every transpose the
 * library uses; threads 1..3 bitwise equal, and close to fp64. */
static void test_sgemm(void) {
    const int64_t Ms[] = {1, 7, 12, 13, 37, 64, 74, 100, 432, 513, 1728}, N = 45, K = 33;
    const int tr[3][2] = {{0, 1}, {1, 0}, {0, 0}};
    for (size_t mi = 0; mi < sizeof Ms / sizeof Ms[0]; mi++)
        for (int ti = 0; ti < 3; ti++) {
            const int64_t M = Ms[mi];
            const int ta = tr[ti][0], tb = tr[ti][1];
            float *A = tu_malloc((size_t)(M * K) * 4), *Bm = tu_malloc((size_t)(N * K) * 4);
            float *C1 = tu_malloc((size_t)(M * N) * 4), *C2 = tu_malloc((size_t)(M * N) * 4);
            tu_rng r = tu_seed((uint64_t)(M * 7 + ti));
            tu_fill(&r, A, (size_t)(M * K), -1, 1), tu_fill(&r, Bm, (size_t)(N * K), -1, 1);
            const int64_t lda = ta ? M : K, ldb = tb ? K : N;
            attn_sgemm(ta, tb, M, N, K, 1.0f, A, lda, Bm, ldb, 0.0f, C1, N, 1);
            double worst = 0;
            for (int64_t i = 0; i < M; i++)
                for (int64_t j = 0; j < N; j++) {
                    double acc = 0;
                    for (int64_t k = 0; k < K; k++)
                        acc += (double)(ta ? A[k * lda + i] : A[i * lda + k]) *
                               (tb ? Bm[j * ldb + k] : Bm[k * ldb + j]);
                    const double e = fabs(C1[i * N + j] - acc);
                    worst = e > worst ? e : worst;
                }
            /* K = 33 products of |x| < 1: fp32 rounding is below 33 * 2^-24 * 33 */
            CHECK(worst < 1e-4, "sgemm M %lld trans %d%d: %.3g from fp64", (long long)M, ta, tb,
                  worst);
            for (int t = 2; t <= 3; t++) {
                attn_sgemm(ta, tb, M, N, K, 1.0f, A, lda, Bm, ldb, 0.0f, C2, N, t);
                CHECK(memcmp(C1, C2, (size_t)(M * N) * 4) == 0,
                      "sgemm M %lld trans %d%d: %d threads differ", (long long)M, ta, tb, t);
            }
            free(A), free(Bm), free(C1), free(C2);
        }
}

typedef struct {
    int threads;
    results r;
} job;

static void *run_job(void *arg) {
    job *j = arg;
    for (int rep = 0; rep < 8; rep++) work(j->threads, &j->r);
    return NULL;
}

static void test_concurrent(void) {
    results *alone = tu_malloc(sizeof *alone);
    work(1, alone);
    job *jobs = tu_malloc(2 * sizeof *jobs);
    jobs[0].threads = 1, jobs[1].threads = 2;
    pthread_t th[2];
    for (int i = 0; i < 2; i++)
        CHECK(pthread_create(&th[i], NULL, run_job, &jobs[i]) == 0, "pthread_create");
    for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
    for (int i = 0; i < 2; i++)
        CHECK(memcmp(&jobs[i].r, alone, sizeof *alone) == 0,
              "caller %d (%d threads), run beside another, differs from one caller alone", i,
              jobs[i].threads);
    free(jobs), free(alone);
}

#if defined(__x86_64__) && defined(__linux__)
/* ARCH_GET_XCOMP_PERM's bits: bit 18 is the tile data (AMX) */
static unsigned long xcomp_perm(void) {
    unsigned long bits = 0;
    return syscall(SYS_arch_prctl, 0x1022, &bits) == 0 ? bits : ~0ul;
}

static void test_amx_permission(void) {
    enum { Bq = 1, Hq = 2, Lq = 80, D = 64 };
    const unsigned long before = xcomp_perm();
    uint16_t *qkv = tu_malloc(sizeof(uint16_t) * Bq * Hq * Lq * D);
    float *o = tu_malloc(sizeof(float) * Bq * Hq * Lq * D * 4), lse[Bq * Hq * Lq];
    for (int i = 0; i < Bq * Hq * Lq * D; i++) qkv[i] = 0x3f80u; /* 1.0 */
    attn_tensor t = attn_tensor_bhld_bf16(qkv, Bq, Hq, Lq, D),
                to = attn_tensor_bhld(o, Bq, Hq, Lq, D),
                tg[3] = {attn_tensor_bhld(o + 1 * Bq * Hq * Lq * D, Bq, Hq, Lq, D),
                         attn_tensor_bhld(o + 2 * Bq * Hq * Lq * D, Bq, Hq, Lq, D),
                         attn_tensor_bhld(o + 3 * Bq * Hq * Lq * D, Bq, Hq, Lq, D)};
    attn_sdpa_params p = {0};
    p.impl = ATTN_IMPL_FUSED, p.dtype = ATTN_BF16, p.out_dtype = ATTN_F32, p.causal = 1;
    attn_error err;
    CHECK(attn_sdpa_forward(&t, &t, &t, &p, &to, NULL, lse, NULL, &err) == ATTN_OK &&
              attn_sdpa_backward(&t, &t, &t, &to, lse, &to, &p, &tg[0], &tg[1], &tg[2], NULL,
                                 &err) == ATTN_OK,
          "bf16 fused calls: %s", err.message);
    CHECK(xcomp_perm() == before, "the AMX permission changed under bf16 calls: %#lx -> %#lx",
          before, xcomp_perm());
    const int has = !!(attn_cpu_features() & ATTN_CPU_AMX), got = attn_enable_amx();
    /* never without the hardware; a kernel or seccomp filter may refuse */
    CHECK(got <= has, "attn_enable_amx %d where the CPU's AMX bit is %d", got, has);
    if (has && !got) printf("test_process_state: this CPU has AMX but the OS refused the tiles\n");
    if (got) {
        CHECK(xcomp_perm() & (1ul << 18), "attn_enable_amx 1 without the permission");
        /* the caller's own tile configuration survives bf16 calls on tiles
         * (1 thread and 2: the caller is thread 0 of the team) */
        unsigned char mine[64] __attribute__((aligned(64))) = {1}, after[64];
        mine[16] = 32, mine[48] = 4; /* tile 0: 4 rows of 32 bytes */
        for (int nt = 1; nt <= 2; nt++) {
            __asm__ volatile("ldtilecfg %0" ::"m"(mine) : "memory");
            p.num_threads = nt;
            CHECK(attn_sdpa_forward(&t, &t, &t, &p, &to, NULL, lse, NULL, &err) == ATTN_OK, "%s",
                  err.message);
            __asm__ volatile("sttilecfg %0" : "=m"(after)::"memory");
            CHECK(memcmp(mine, after, 64) == 0, "%d threads: the caller's tile configuration changed",
                  nt);
        }
        __asm__ volatile("tilerelease" ::: "memory");
    }
    printf("test_process_state: AMX permission %s by library calls; attn_enable_amx %d\n",
           before & (1ul << 18) ? "held before" : "not taken", got);
    free(qkv), free(o);
}
#else
static void test_amx_permission(void) {}
#endif

int main(void) {
    tu_rng r = tu_seed(9);
    tu_fill(&r, params, sizeof params / sizeof(float), -0.4f, 0.4f);
    tu_fill(&r, x, sizeof x / sizeof(float), -1, 1);
    tu_fill(&r, dy, sizeof dy / sizeof(float), -1, 1);
    test_state_untouched();
    test_fp_mode_untouched();
    printf("test_process_state: attn_sgemm cuts rows at multiples of %lld (0: never)\n",
           (long long)attn_sgemm_row_step());
    test_sgemm();
    test_concurrent();
    test_amx_permission(); /* last: it may take the permission */
    return tu_report("test_process_state");
}
