/* Tiny shared helpers for the C tests: a fixed-seed RNG, a counting CHECK,
 * tensor gathering and error measurement. Header-only (static inline) so each
 * test_*.c stays a single translation unit. */
#ifndef ATTN_TESTUTIL_H
#define ATTN_TESTUTIL_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attn.h"
#include "check.h"

/* Final line and exit code: nonzero on any failure. */
static inline int tu_report(const char *name) {
    printf("%s: %d checks passed, %d failed\n", name, tu_pass, tu_fail);
    return tu_fail ? 1 : 0;
}

static inline void *tu_malloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) {
        fprintf(stderr, "out of memory (%zu bytes)\n", n);
        exit(2);
    }
    return p;
}

/* ------------------------------------------------------------ RNG */

/* xorshift64*: fixed seeds make every run identical. */
typedef struct {
    uint64_t s;
} tu_rng;

static inline tu_rng tu_seed(uint64_t seed) {
    tu_rng r;
    r.s = seed ? seed : 0x9E3779B97F4A7C15ull;
    return r;
}

static inline uint64_t tu_next(tu_rng *r) {
    uint64_t x = r->s;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    r->s = x;
    return x * 2685821657736338717ull;
}

/* Uniform double in [0, 1). */
static inline double tu_unif(tu_rng *r) {
    return (double)(tu_next(r) >> 11) * (1.0 / 9007199254740992.0);
}

/* Uniform integer in [lo, hi]. */
static inline int64_t tu_int(tu_rng *r, int64_t lo, int64_t hi) {
    return lo + (int64_t)(tu_next(r) % (uint64_t)(hi - lo + 1));
}

static inline void tu_fill(tu_rng *r, float *x, size_t n, float lo, float hi) {
    for (size_t i = 0; i < n; i++) x[i] = lo + (hi - lo) * (float)tu_unif(r);
}

/* ------------------------------------------------------------ tensors */

/* Number of floats a strided view spans (offset of its last element + 1). */
static inline size_t tu_span(const int64_t dim[4], const int64_t stride[4]) {
    int64_t last = 0;
    for (int i = 0; i < 4; i++) last += (dim[i] - 1) * stride[i];
    return (size_t)last + 1;
}

static inline int64_t tu_numel(const attn_tensor *t) {
    return t->dim[0] * t->dim[1] * t->dim[2] * t->dim[3];
}

static inline int64_t tu_off(const attn_tensor *t, int64_t b, int64_t h, int64_t l, int64_t d) {
    return b * t->stride[0] + h * t->stride[1] + l * t->stride[2] + d * t->stride[3];
}

/* Contiguous [B,H,L,D] double copy of a strided view (caller frees). */
static inline double *tu_to_double(const attn_tensor *t) {
    double *x = tu_malloc((size_t)tu_numel(t) * sizeof(double));
    size_t n = 0;
    for (int64_t b = 0; b < t->dim[0]; b++)
        for (int64_t h = 0; h < t->dim[1]; h++)
            for (int64_t l = 0; l < t->dim[2]; l++)
                for (int64_t d = 0; d < t->dim[3]; d++) x[n++] = t->data[tu_off(t, b, h, l, d)];
    return x;
}

/* Contiguous [B,H,L,D] float copy of a strided view (caller frees). */
/* A malloc'd double copy of n contiguous floats. */
static inline double *tu_doubles(const float *x, size_t n) {
    double *y = tu_malloc(n * sizeof(double));
    for (size_t i = 0; i < n; i++) y[i] = x[i];
    return y;
}

static inline float *tu_gather(const attn_tensor *t) {
    float *x = tu_malloc((size_t)tu_numel(t) * sizeof(float));
    size_t n = 0;
    for (int64_t b = 0; b < t->dim[0]; b++)
        for (int64_t h = 0; h < t->dim[1]; h++)
            for (int64_t l = 0; l < t->dim[2]; l++)
                for (int64_t d = 0; d < t->dim[3]; d++) x[n++] = t->data[tu_off(t, b, h, l, d)];
    return x;
}

/* ------------------------------------------------------------ errors */

/* Max |got - want| over n values. Non-finite values must match exactly
 * (NaN with NaN, +-inf with the same inf); a mismatch counts as +inf. */
static inline double tu_maxdiff(const float *got, const double *want, size_t n) {
    double m = 0.0;
    for (size_t i = 0; i < n; i++) {
        double g = got[i], w = want[i], e;
        if (isnan(w) || isnan(g))
            e = (isnan(w) && isnan(g)) ? 0.0 : INFINITY;
        else if (isinf(w) || isinf(g))
            e = (g == w) ? 0.0 : INFINITY;
        else
            e = fabs(g - w);
        if (e > m) m = e;
    }
    return m;
}

/* Like tu_maxdiff, scaled per element by 1 / max(1, |want|). */
static inline double tu_maxreldiff1(const float *got, const double *want, size_t n) {
    double m = 0.0;
    for (size_t i = 0; i < n; i++) {
        double e = tu_maxdiff(&got[i], &want[i], 1);
        double s = fabs(want[i]) > 1.0 && isfinite(want[i]) ? fabs(want[i]) : 1.0;
        if (e / s > m) m = e / s;
    }
    return m;
}

static inline double tu_maxabs(const float *x, size_t n) {
    double m = 0.0;
    for (size_t i = 0; i < n; i++)
        if (fabs((double)x[i]) > m) m = fabs((double)x[i]);
    return m;
}

/* An error return must carry a matching status and a readable message. */
static inline void tu_check_err_(const char *file, int line, attn_status got, attn_status want,
                                 const attn_error *e) {
    int ok = got == want && e->status == got && e->message[0] != '\0' &&
             memchr(e->message, '\0', sizeof e->message) != NULL && attn_status_name(got) != NULL;
    if (ok) {
        tu_pass++;
    } else if (tu_fail++ < 40) {
        fprintf(stderr, "%s:%d: expected %s, got %s (err.status %s, message \"%.*s\")\n", file,
                line, attn_status_name(want), attn_status_name(got), attn_status_name(e->status),
                (int)sizeof e->message, e->message);
    }
}
#define CHECK_ERR(got, want, e) tu_check_err_(__FILE__, __LINE__, (got), (want), (e))

#endif /* ATTN_TESTUTIL_H */
