/* attn-bench: time attn_sdpa_forward / attn_sdpa_backward on a suite of
 * shapes, for the fused and the reference path.
 *
 *   attn-bench [--threads N] [--impl reference|fused] [--case B,H,Lq,Lk,D,causal]...
 *              [--varlen N,H,Lmin,Lmax,D,causal]...
 *              [--reps N] [--json] [--clock wall|cpu] [--tile-gemm own|blas]
 *              [--kv-heads N] [--softcap C] [--alibi] [--sinks] [--forward-only]
 *
 * --kv-heads N gives the --case (and suite) calls' k and v N heads
 * (grouped-query attention: N divides each case's H; 0, the default: H);
 * the varlen cases keep H.
 *
 * The variants of attn_sdpa_params, for the --case (and suite) calls, to
 * time each against the plain call (the varlen cases run plain):
 * --softcap C soft-caps the scores at C (C > 0: s -> C·tanh(s / C));
 * --alibi adds ALiBi biases with BLOOM's slopes m_h = 2^(−8(h+1)/H);
 * --sinks gives every query head a sink logit (σ_h = 0.5 − h/H, a spread of
 * values near the scores' own) and the backward its d_sinks.
 *
 * --tile-gemm blas runs the fused path's tile products through OpenBLAS
 * sgemm (single-threaded) instead of its own micro-kernel, to measure the
 * one against the other (a hook of src/internal.h; not in the library's API).
 *
 * Each case runs forward ("fwd") and backward ("bwd"; not with --forward-only,
 * which leaves a forward alone under a profiler): one warm-up call, then
 * the median of --reps (default 5) timed calls, or of more for short calls
 * (about 0.5 s worth, at most 51: steadier medians on a shared machine). GFLOP/s use the dense count
 * 4·B·H·Lq·Lk·D (fwd) and 10·B·H·Lq·Lk·D (bwd), also under a causal mask, so
 * causal cases show the work they skip as speed. peak_frac divides by an fp32
 * FMA peak measured at start-up on the same threads (a register-resident FMA
 * loop, ~1 s). rss_mb is the process's peak RSS so far (getrusage), so it
 * only bounds a case's own footprint when the case runs alone or first.
 * Without --impl both paths run, but the reference path is skipped when
 * Lq·Lk > 2048·2048 (it would take minutes); --impl reference forces it.
 *
 * A varlen case (--varlen; without --case and --varlen the suite ends with
 * 64,8,20,57,32,causal, a molgen batch) packs N self-attention sequences of
 * lengths drawn uniformly from [Lmin, Lmax] (fixed seed) back to back and
 * times attn_sdpa_varlen_forward/backward on them against
 * attn_sdpa_forward/backward on the same data padded to [N, Lmax] with
 * key_lengths (molgen's way today), packed and padded calls interleaved,
 * median of each. GFLOP/s and peak_frac count the useful work of both,
 * 4·H·Σ Lᵢ²·D (fwd) and 10·H·Σ Lᵢ²·D (bwd), so speedup is padded / packed.
 *
 * A decode case (Lq = 1) is bound by memory, not by FMAs: its lines also
 * give gbps, the bytes it must move over its time (fwd: K and V read once,
 * 2·B·H_kv·Lk·D elements of 4 bytes, 2 with --dtype bf16; bwd: also dK and
 * dV written, 2·B·H_kv·Lk·D floats more), and
 * stream_frac, that over a read bandwidth measured at start-up on the same
 * threads (a 256 MiB buffer summed by every thread, best of 5, in a child
 * process so that it stays out of rss_mb). */
#define _POSIX_C_SOURCE 200809L
#include "attn.h"
#include "fma_peak.h"
#include "internal.h" /* attn_test_fused_blas */
#include "sdpa_bf16.h" /* attn_fused_bf16_kernels_active */

#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

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
static int g_bf16;         /* --dtype bf16: q, k, v in bfloat16 (params.dtype); out, grads fp32 */
static int64_t g_kv_heads; /* --kv-heads: K/V heads of every case (0: its H) */
static int64_t kv_heads(const bcase *c) { return g_kv_heads ? g_kv_heads : c->H; }
static float g_softcap;            /* --softcap C: 0 off */
static int g_no_bwd;               /* --forward-only: the cases' forwards alone (for profiles) */
static int g_alibi, g_sinks;       /* --alibi, --sinks */
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

/* Read bandwidth in GB/s on `threads` threads: a 256 MiB buffer (far
 * beyond the caches) summed in parallel, best of 5 passes after one that
 * touches the pages. 0 if it cannot be allocated. */
static double stream_gbps_here(int threads) {
    const size_t n = (size_t)64 << 20; /* floats */
    float *x = malloc(n * sizeof(float));
    if (!x) return 0.0;
    double best = 0.0;
    volatile float sink = 0.0f;
    for (int pass = 0; pass < 6; pass++) {
        const double t0 = now_s();
        float total = 0.0f;
        if (pass == 0)
#pragma omp parallel for num_threads(threads) schedule(static)
            for (size_t i = 0; i < n; i++) x[i] = (float)(i & 7);
        /* simd: the sum in vector lanes (the order of a plain loop would
         * make it latency-bound, not memory-bound) */
#pragma omp parallel for simd num_threads(threads) reduction(+ : total) schedule(static)
        for (size_t i = 0; i < n; i++) total += x[i];
        const double dt = now_s() - t0;
        sink += total;
        if (pass > 0 && n * sizeof(float) / dt / 1e9 > best) best = n * sizeof(float) / dt / 1e9;
    }
    (void)sink;
    free(x);
    return best;
}
static double g_stream_gbps;

/* stream_gbps_here in a child process, so that its buffer stays out of this
 * process's peak RSS (rss_mb); called before this process starts OpenMP
 * threads (a child of a process with a thread pool could not use one). */
static double stream_gbps(int threads) {
    int fd[2];
    if (pipe(fd)) return 0.0;
    const pid_t pid = fork();
    if (pid == 0) {
        const double g = stream_gbps_here(threads);
        _exit(write(fd[1], &g, sizeof g) == (ssize_t)sizeof g ? 0 : 1);
    }
    close(fd[1]);
    double g = 0.0;
    if (pid < 0 || read(fd[0], &g, sizeof g) != (ssize_t)sizeof g) g = 0.0;
    close(fd[0]);
    if (pid > 0) waitpid(pid, NULL, 0);
    return g;
}

static void emit(const result *r, int json, double peak) {
    /* decode: the bytes K and V take (2 each in bf16), and in the backward
     * also dK and dV (fp32), over the time */
    const double kv_elems = 2.0 * (double)r->c.B * (double)kv_heads(&r->c) * (double)r->c.Lk *
                            (double)r->c.D;
    const double bytes = kv_elems * ((g_bf16 ? 2.0 : 4.0) + (strcmp(r->op, "bwd") ? 0.0 : 4.0));
    const int dec = r->c.Lq == 1 && g_stream_gbps > 0;
    const double gbps = bytes / (r->ms * 1e-3) / 1e9;
    if (json) {
        printf("{\"impl\": \"%s\", \"op\": \"%s\", \"B\": %lld, \"H\": %lld, \"Lq\": %lld, "
               "\"Lk\": %lld, \"D\": %lld, \"causal\": %s, \"ms\": %.3f, \"gflops\": %.2f, "
               "\"peak_frac\": %.4f, \"rss_mb\": %.1f, \"dtype\": \"%s\", \"Hkv\": %lld",
               r->impl, r->op, (long long)r->c.B, (long long)r->c.H, (long long)r->c.Lq,
               (long long)r->c.Lk, (long long)r->c.D, r->c.causal ? "true" : "false", r->ms,
               r->gflops, r->peak_frac, r->rss_mb, g_bf16 ? "bf16" : "f32",
               (long long)kv_heads(&r->c));
        if (dec) printf(", \"gbps\": %.2f, \"stream_frac\": %.4f", gbps, gbps / g_stream_gbps);
        printf(", \"softcap\": %g, \"alibi\": %s, \"sinks\": %s}\n", (double)g_softcap,
               g_alibi ? "true" : "false", g_sinks ? "true" : "false");
    } else {
        printf("%-9s %-3s %5lld %3lld %6lld %6lld %4lld %-6s %10.3f %9.1f %6.1f%% %9.1f", r->impl,
               r->op, (long long)r->c.B, (long long)r->c.H, (long long)r->c.Lq, (long long)r->c.Lk,
               (long long)r->c.D, r->c.causal ? "yes" : "no", r->ms, r->gflops,
               100.0 * r->peak_frac, r->rss_mb);
        if (dec) printf("  %.1f GB/s, %.0f%% of stream", gbps, 100.0 * gbps / g_stream_gbps);
        if (kv_heads(&r->c) != r->c.H) printf("  H_kv %lld", (long long)kv_heads(&r->c));
        if (g_softcap > 0) printf("  softcap %g", (double)g_softcap);
        if (g_alibi) printf("  alibi");
        if (g_sinks) printf("  sinks");
        printf("\n");
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
    const int64_t B = c->B, H = c->H, Hkv = kv_heads(c), Lq = c->Lq, Lk = c->Lk, D = c->D;
    const size_t nq = (size_t)(B * H * Lq * D), nk = (size_t)(B * Hkv * Lk * D),
                 nl = (size_t)(B * H * Lq);
    float *q = alloc_fill(nq, 1), *k = alloc_fill(nk, 2), *v = alloc_fill(nk, 3);
    float *o = alloc_fill(nq, 4), *lse = alloc_fill(nl, 5);
    attn_tensor tq = attn_tensor_bhld(q, B, H, Lq, D), tk = attn_tensor_bhld(k, B, Hkv, Lk, D),
                tv = attn_tensor_bhld(v, B, Hkv, Lk, D), to = attn_tensor_bhld(o, B, H, Lq, D);
    uint16_t *qb = NULL, *kb = NULL, *vb = NULL; /* --dtype bf16: the inputs rounded */
    if (g_bf16) {
        qb = malloc(nq * 2), kb = malloc(nk * 2), vb = malloc(nk * 2);
        attn_bf16_from_f32(q, qb, nq), attn_bf16_from_f32(k, kb, nk), attn_bf16_from_f32(v, vb, nk);
        tq = attn_tensor_bhld_bf16(qb, B, H, Lq, D), tk = attn_tensor_bhld_bf16(kb, B, Hkv, Lk, D);
        tv = attn_tensor_bhld_bf16(vb, B, Hkv, Lk, D);
    }
    attn_sdpa_params p;
    memset(&p, 0, sizeof p);
    p.dtype = g_bf16 ? ATTN_BF16 : ATTN_F32;
    p.out_dtype = ATTN_F32; /* out and grads fp32 (0 would follow dtype) */
    p.causal = c->causal;
    p.impl = impl;
    p.num_threads = threads;
    /* the variants: slopes, sinks and d_sinks [H] */
    float *slopes = malloc((size_t)H * sizeof(float)), *sinks = malloc((size_t)H * sizeof(float)),
          *d_sinks = malloc((size_t)H * sizeof(float));
    for (int64_t h = 0; h < H; h++) {
        slopes[h] = exp2f(-8.0f * (float)(h + 1) / (float)H);
        sinks[h] = 0.5f - (float)h / (float)H;
    }
    if (g_softcap > 0) p.use_softcap = 1, p.softcap = g_softcap;
    if (g_alibi) p.alibi_slopes = slopes;
    if (g_sinks) p.sinks = sinks, p.d_sinks = d_sinks;
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
    if (g_no_bwd) {
        free(ts), free(q), free(k), free(v), free(o), free(lse), free(qb), free(kb), free(vb);
        free(slopes), free(sinks), free(d_sinks);
        return 0;
    }

    /* backward (out and lse from the last forward) */
    float *go = alloc_fill(nq, 6), *dq = alloc_fill(nq, 7), *dk = alloc_fill(nk, 8),
          *dv = alloc_fill(nk, 9);
    attn_tensor tgo = attn_tensor_bhld(go, B, H, Lq, D), tdq = attn_tensor_bhld(dq, B, H, Lq, D),
                tdk = attn_tensor_bhld(dk, B, Hkv, Lk, D),
                tdv = attn_tensor_bhld(dv, B, Hkv, Lk, D);
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
    free(go), free(dq), free(dk), free(dv), free(qb), free(kb), free(vb);
    free(slopes), free(sinks), free(d_sinks);
    return 0;
}

/* ------------------------------------------------------------ varlen */

typedef struct {
    int64_t N, H, Lmin, Lmax, D;
    int causal;
} vcase;

static const vcase kVarlenSuite[] = {{64, 8, 20, 57, 32, 1}};

/* The packed or the padded call of a varlen case. */
typedef struct {
    attn_tensor q, k, v, o, go, dq, dk, dv;
    float *lse;
    int64_t batch, *cu; /* packed: batch sequences at cu */
    int packed;
    attn_sdpa_params p;
} vcall;

static attn_status vcall_fwd(vcall *c, attn_error *err) {
    if (c->packed)
        return attn_sdpa_varlen_forward(&c->q, &c->k, &c->v, c->batch, c->cu, NULL, &c->p, &c->o,
                                        NULL, c->lse, NULL, err);
    return attn_sdpa_forward(&c->q, &c->k, &c->v, &c->p, &c->o, NULL, c->lse, NULL, err);
}
static attn_status vcall_bwd(vcall *c, attn_error *err) {
    if (c->packed)
        return attn_sdpa_varlen_backward(&c->q, &c->k, &c->v, &c->o, c->lse, &c->go, c->batch,
                                         c->cu, NULL, &c->p, &c->dq, &c->dk, &c->dv, NULL, err);
    return attn_sdpa_backward(&c->q, &c->k, &c->v, &c->o, c->lse, &c->go, &c->p, &c->dq, &c->dk,
                              &c->dv, NULL, err);
}

static int run_varlen(const vcase *vc, attn_impl impl, int threads, int reps, double peak,
                      int json) {
    const int64_t N = vc->N, H = vc->H, D = vc->D, Lmax = vc->Lmax, row = H * D;
    int64_t *cu = malloc((size_t)(N + 1) * sizeof *cu), *len = malloc((size_t)N * sizeof *len);
    unsigned s = 12345u;
    cu[0] = 0;
    double sq = 0; /* Σ Lᵢ² */
    for (int64_t i = 0; i < N; i++) {
        s = s * 1664525u + 1013904223u;
        len[i] = vc->Lmin + (int64_t)((s >> 8) % (unsigned)(vc->Lmax - vc->Lmin + 1));
        cu[i + 1] = cu[i] + len[i];
        sq += (double)len[i] * (double)len[i];
    }
    const int64_t T = cu[N];
    /* q (= k = v), grad_out, out, dq, dk, dv: packed [T, H, D] and padded
     * [N, Lmax, H, D] holding the same rows (padding rows: other values) */
    float *bp[6], *bd[6];
    for (int i = 0; i < 6; i++) {
        bp[i] = alloc_fill((size_t)(T * row), (unsigned)i + 1);
        bd[i] = alloc_fill((size_t)(N * Lmax * row), 99);
        if (i < 2)
            for (int64_t b = 0; b < N; b++)
                memcpy(bd[i] + b * Lmax * row, bp[i] + cu[b] * row,
                       (size_t)(len[b] * row) * sizeof(float));
    }
    vcall pk, pd;
    memset(&pk, 0, sizeof pk);
    memset(&pd, 0, sizeof pd);
    vcall *calls[2] = {&pk, &pd};
    for (int c = 0; c < 2; c++) {
        float **b = c ? bd : bp;
        const int64_t B = c ? N : 1, L = c ? Lmax : T;
        vcall *x = calls[c];
        x->q = x->k = x->v = attn_tensor_blhd(b[0], B, H, L, D);
        x->go = attn_tensor_blhd(b[1], B, H, L, D), x->o = attn_tensor_blhd(b[2], B, H, L, D);
        x->dq = attn_tensor_blhd(b[3], B, H, L, D), x->dk = attn_tensor_blhd(b[4], B, H, L, D);
        x->dv = attn_tensor_blhd(b[5], B, H, L, D);
        x->lse = alloc_fill((size_t)(B * H * L), 8);
        x->p.causal = vc->causal, x->p.impl = impl, x->p.num_threads = threads;
    }
    pk.packed = 1, pk.batch = N, pk.cu = cu;
    pd.p.key_lengths = len;
    attn_error err;
    /* warm-up: each call once; its time sizes the run */
    double worst = 0;
    for (int c = 0; c < 2; c++) {
        const double t0 = now_s();
        if (vcall_fwd(calls[c], &err) || vcall_bwd(calls[c], &err)) {
            fprintf(stderr, "attn-bench: varlen case failed: %s\n", err.message);
            return 1;
        }
        if (now_s() - t0 > worst) worst = now_s() - t0;
    }
    const int n = runs_for(worst / 2, reps);
    double *ts[4]; /* fwd packed, fwd padded, bwd packed, bwd padded */
    for (int i = 0; i < 4; i++) ts[i] = malloc((size_t)n * sizeof(double));
    for (int r = 0; r < n; r++)
        for (int c = 0; c < 2; c++) {
            double t0 = timer_s();
            vcall_fwd(calls[c], &err);
            ts[c][r] = timer_s() - t0;
            t0 = timer_s();
            vcall_bwd(calls[c], &err);
            ts[2 + c][r] = timer_s() - t0;
        }
    const char *iname = impl == ATTN_IMPL_REFERENCE ? "reference" : "fused";
    for (int op = 0; op < 2; op++) {
        double med[2];
        for (int c = 0; c < 2; c++) {
            qsort(ts[2 * op + c], (size_t)n, sizeof(double), cmp_double);
            med[c] = ts[2 * op + c][n / 2];
        }
        const double gf = (op ? 10.0 : 4.0) * (double)H * sq * (double)D / med[0] / 1e9;
        const char *ops = op ? "bwd" : "fwd";
        if (json)
            printf("{\"impl\": \"%s\", \"op\": \"%s\", \"varlen\": true, \"N\": %lld, \"H\": %lld, "
                   "\"Lmin\": %lld, \"Lmax\": %lld, \"D\": %lld, \"causal\": %s, \"tokens\": %lld, "
                   "\"packed_ms\": %.3f, \"padded_ms\": %.3f, \"speedup\": %.3f, \"gflops\": %.2f, "
                   "\"peak_frac\": %.4f, \"runs\": %d}\n",
                   iname, ops, (long long)N, (long long)H, (long long)vc->Lmin, (long long)Lmax,
                   (long long)D, vc->causal ? "true" : "false", (long long)T, 1e3 * med[0],
                   1e3 * med[1], med[1] / med[0], gf, gf / peak, n);
        else
            printf("%-9s %-3s varlen N %lld H %lld L %lld..%lld D %lld %s, %lld tokens: packed "
                   "%.3f ms (%.1f GFLOP/s, %.1f%% of peak), padded to %lld: %.3f ms, %.2fx\n",
                   iname, ops, (long long)N, (long long)H, (long long)vc->Lmin, (long long)Lmax,
                   (long long)D, vc->causal ? "causal" : "full", (long long)T, 1e3 * med[0], gf,
                   100.0 * gf / peak, (long long)Lmax, 1e3 * med[1], med[1] / med[0]);
    }
    fflush(stdout);
    for (int i = 0; i < 4; i++) free(ts[i]);
    for (int i = 0; i < 6; i++) free(bp[i]), free(bd[i]);
    free(pk.lse), free(pd.lse), free(cu), free(len);
    return 0;
}

static int parse_causal(const char *cz, int *causal) {
    if (!strcmp(cz, "1") || !strcmp(cz, "yes") || !strcmp(cz, "true"))
        *causal = 1;
    else if (!strcmp(cz, "0") || !strcmp(cz, "no") || !strcmp(cz, "false"))
        *causal = 0;
    else
        return 0;
    return 1;
}

static int parse_varlen(const char *s, vcase *c) {
    long long n, h, lo, hi, d;
    char cz[16] = {0};
    if (sscanf(s, "%lld,%lld,%lld,%lld,%lld,%15s", &n, &h, &lo, &hi, &d, cz) != 6) return 0;
    if (n <= 0 || h <= 0 || lo <= 0 || hi < lo || d <= 0 || n > 100000 || hi > 100000 || h > 4096 ||
        d > 4096 || !parse_causal(cz, &c->causal))
        return 0;
    c->N = n, c->H = h, c->Lmin = lo, c->Lmax = hi, c->D = d;
    return 1;
}

static int parse_case(const char *s, bcase *c) {
    long long b, h, lq, lk, d;
    char cz[16] = {0};
    if (sscanf(s, "%lld,%lld,%lld,%lld,%lld,%15s", &b, &h, &lq, &lk, &d, cz) != 6) return 0;
    if (b <= 0 || h <= 0 || lq <= 0 || lk <= 0 || d <= 0 || !parse_causal(cz, &c->causal)) return 0;
    c->B = b, c->H = h, c->Lq = lq, c->Lk = lk, c->D = d;
    return 1;
}

static void usage(void) {
    fprintf(stderr,
            "usage: attn-bench [--threads N] [--impl reference|fused] [--reps N] [--json]\n"
            "                  [--clock wall|cpu] [--tile-gemm own|blas] [--dtype f32|bf16]\n"
            "                  [--case B,H,Lq,Lk,D,causal]...   (causal: 0/1 or no/yes)\n"
            "                  [--varlen N,H,Lmin,Lmax,D,causal]... [--kv-heads N]\n"
            "                  [--softcap C] [--alibi] [--sinks] [--forward-only]\n");
}

int main(int argc, char **argv) {
    int threads = attn_get_num_threads(), json = 0, reps = 5, want_ref = 1, want_fused = 1,
        forced = 0;
    bcase *cases = NULL;
    vcase *vcases = NULL;
    size_t ncases = 0, nvar = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--json")) {
            json = 1;
        } else if (!strcmp(a, "--forward-only")) {
            g_no_bwd = 1;
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
        } else if (!strcmp(a, "--dtype") && i + 1 < argc) {
            const char *v = argv[++i];
            if (!strcmp(v, "bf16"))
                g_bf16 = 1;
            else if (strcmp(v, "f32") && strcmp(v, "fp32"))
                return usage(), 2;
        } else if (!strcmp(a, "--kv-heads") && i + 1 < argc) {
            g_kv_heads = atoll(argv[++i]);
            if (g_kv_heads < 0) return usage(), 2;
        } else if (!strcmp(a, "--softcap") && i + 1 < argc) {
            char *end;
            g_softcap = strtof(argv[++i], &end);
            if (*end || !(g_softcap > 0) || !isfinite(g_softcap)) {
                fprintf(stderr, "attn-bench: --softcap needs a finite C > 0, not '%s'\n", argv[i]);
                return usage(), 2;
            }
        } else if (!strcmp(a, "--alibi")) {
            g_alibi = 1;
        } else if (!strcmp(a, "--sinks")) {
            g_sinks = 1;
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
        } else if (!strcmp(a, "--varlen") && i + 1 < argc) {
            vcases = realloc(vcases, (nvar + 1) * sizeof *vcases);
            if (!parse_varlen(argv[++i], &vcases[nvar])) {
                fprintf(stderr, "attn-bench: bad --varlen '%s'\n", argv[i]);
                return usage(), 2;
            }
            nvar++;
        } else {
            return usage(), 2;
        }
    }
    if (!ncases && !nvar) {
        ncases = sizeof kSuite / sizeof kSuite[0];
        cases = malloc(sizeof kSuite);
        memcpy(cases, kSuite, sizeof kSuite);
        nvar = sizeof kVarlenSuite / sizeof kVarlenSuite[0];
        vcases = malloc(sizeof kVarlenSuite);
        memcpy(vcases, kVarlenSuite, sizeof kVarlenSuite);
    }
    for (size_t i = 0; i < ncases; i++)
        if (cases[i].H % kv_heads(&cases[i])) {
            fprintf(stderr, "attn-bench: --kv-heads %lld does not divide H %lld of a case\n",
                    (long long)g_kv_heads, (long long)cases[i].H);
            return 2;
        }
    for (size_t i = 0; i < ncases; i++)
        if (cases[i].Lq == 1) {
            g_stream_gbps = stream_gbps(threads); /* once: 0 if it failed */
            break;
        }
    attn_set_num_threads(threads, NULL);
    g_threads = threads;
    const char *peak_isa;
    const double peak = fma_peak_gflops(threads, timer_s, &peak_isa);
    /* a benchmark is an application: it takes AMX where the CPU has it
     * (ATTN_FUSED_ISA=avx512bf16 measures the row below) */
    attn_enable_amx();
    const char *bf16_row = attn_fused_bf16_kernels_active()->name;
    if (json)
        printf("{\"peak_gflops\": %.2f, \"peak_isa\": \"%s\", \"threads\": %d, \"clock\": "
               "\"%s\", \"stream_gbps\": %.2f, \"bf16_row\": \"%s\"}\n",
               peak, peak_isa, threads, g_cpu_clock ? "cpu" : "wall", g_stream_gbps, bf16_row);
    else
        printf("threads %d, measured fp32 FMA peak %.1f GFLOP/s (%s), read bandwidth %.1f GB/s, "
               "%s clock, bf16 kernels %s\n"
               "%-9s %-3s %5s %3s %6s %6s %4s %-6s %10s %9s %7s %9s\n",
               threads, peak, peak_isa, g_stream_gbps, g_cpu_clock ? "cpu-time" : "wall", bf16_row,
               "impl",
               "op", "B", "H", "Lq", "Lk", "D", "causal", "ms", "GFLOP/s", "peak", "rss_MB");
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
    if (g_bf16 && nvar) {
        fprintf(stderr, "attn-bench: varlen cases skipped (the fused varlen path is fp32 only)\n");
        nvar = 0;
    }
    for (size_t i = 0; i < nvar; i++) {
        if (want_fused) rc |= run_varlen(&vcases[i], ATTN_IMPL_FUSED, threads, reps, peak, json);
        if (want_ref) rc |= run_varlen(&vcases[i], ATTN_IMPL_REFERENCE, threads, reps, peak, json);
    }
    free(cases), free(vcases);
    return rc;
}
