/* Status codes, error reports, the version, the environment (read once) and
 * the one piece of global state: threads. */
#include "internal.h"

#include <cblas.h>
#include <omp.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *attn_status_name(attn_status s) {
    switch (s) {
    case ATTN_OK: return "ATTN_OK";
    case ATTN_ERR_NULL: return "ATTN_ERR_NULL";
    case ATTN_ERR_SHAPE: return "ATTN_ERR_SHAPE";
    case ATTN_ERR_OVERFLOW: return "ATTN_ERR_OVERFLOW";
    case ATTN_ERR_MASK: return "ATTN_ERR_MASK";
    case ATTN_ERR_ARG: return "ATTN_ERR_ARG";
    case ATTN_ERR_NOMEM: return "ATTN_ERR_NOMEM";
    case ATTN_ERR_STATE: return "ATTN_ERR_STATE";
    case ATTN_ERR_ALIAS: return "ATTN_ERR_ALIAS";
    }
    return "ATTN_ERR_UNKNOWN";
}

attn_status attn_fail(attn_error *err, attn_status s, const char *fmt, ...) {
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->message, sizeof err->message, fmt, ap);
        va_end(ap);
        err->status = s;
    }
    return s;
}

attn_status attn_ok(attn_error *err) {
    if (err) {
        err->status = ATTN_OK;
        err->message[0] = '\0';
    }
    return ATTN_OK;
}

int attn_mul64(int64_t a, int64_t b, int64_t *r) { return !__builtin_mul_overflow(a, b, r); }
int attn_add64(int64_t a, int64_t b, int64_t *r) { return !__builtin_add_overflow(a, b, r); }

const char *attn_version(void) { return ATTN_VERSION; }

/* ---------------------------------------------------------------- environment */

static attn_env g_env;
static pthread_once_t g_env_once = PTHREAD_ONCE_INIT;

static void read_env(void) {
    attn_env e = {0, 1, 0, ""};
    const char *t = getenv("ATTN_NUM_THREADS");
    if (t && *t) {
        char *end;
        long v = strtol(t, &end, 10);
        if (*end == '\0' && v >= 1 && v <= ATTN_MAX_THREADS) e.env_threads = (int)v;
    }
    e.cores = omp_get_num_procs();
    const char *v = getenv("ATTN_VERBOSE");
    e.verbose = v && *v && strcmp(v, "0") != 0;
    const char *isa = getenv("ATTN_FUSED_ISA"); /* isa.c: which kernels it names */
    if (isa && strlen(isa) < sizeof e.fused_isa) strcpy(e.fused_isa, isa);
    g_env = e;
}

/* The OpenBLAS policy of attn.h ("Threads and OpenBLAS"): its pthread
 * build keeps a process-wide thread count and pool; set it to 1, once (the
 * library calls OpenBLAS single-threaded only: gemm.c's fallback and the
 * fused path's measurement hook). Its OpenMP build needs nothing; the
 * sequential build has no threads. */
static void blas_policy(void) {
    if (openblas_get_parallel() == 1) openblas_set_num_threads(1);
}

/* The library's first call: the environment, and the OpenBLAS policy. */
static void init_once(void) {
    read_env();
    blas_policy();
}

const attn_env *attn_env_get(void) {
    pthread_once(&g_env_once, init_once);
    return &g_env;
}

void attn_test_reload_env(void) {
    attn_env_get();
    read_env();
}

/* ---------------------------------------------------------------- threads */

/* 0: not set by the API; then ATTN_NUM_THREADS, else all cores. */
static int g_threads;

attn_status attn_set_num_threads(int n, attn_error *err) {
    if (n < 0 || n > ATTN_MAX_THREADS)
        return attn_fail(err, ATTN_ERR_ARG,
                         "thread count must be in [1, %d] (or 0 for the default), got %d",
                         ATTN_MAX_THREADS, n);
#pragma omp atomic write
    g_threads = n;
    return attn_ok(err);
}

int attn_get_num_threads(void) {
    int n;
#pragma omp atomic read
    n = g_threads;
    if (n > 0) return n;
    const attn_env *e = attn_env_get();
    return e->env_threads > 0 ? e->env_threads : e->cores;
}

int attn_threads_for(int p_threads) { return p_threads > 0 ? p_threads : attn_get_num_threads(); }

attn_tensor attn_tensor_bhld(float *data, int64_t B, int64_t H, int64_t L, int64_t D) {
    attn_tensor t = {data, {B, H, L, D}, {H * L * D, L * D, D, 1}};
    return t;
}

attn_tensor attn_tensor_blhd(float *data, int64_t B, int64_t H, int64_t L, int64_t D) {
    attn_tensor t = {data, {B, H, L, D}, {L * H * D, D, H * D, 1}};
    return t;
}
