/* Internal declarations shared by the library's translation units. */
#ifndef ATTN_INTERNAL_H
#define ATTN_INTERNAL_H

#include "attn.h"

#include <math.h>
#include <stdint.h>

#if defined(__GNUC__)
#define ATTN_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define ATTN_PRINTF(a, b)
#endif

/* Fill err (if any) and return s. */
attn_status attn_fail(attn_error *err, attn_status s, const char *fmt, ...) ATTN_PRINTF(3, 4);
attn_status attn_ok(attn_error *err);

/* Threads for one call: p_threads > 0 wins, else the global setting. */
int attn_threads_for(int p_threads);

/* The environment, read once (pthread_once) at the first call that needs
 * it (status.c, the ground: it calls nothing of the library above it).
 * That call also applies the OpenBLAS policy of attn.h ("Threads and
 * OpenBLAS"). Whoever needs a variable asks
 * attn_env_get: isa.c interprets fused_isa. */
typedef struct {
    int env_threads;    /* ATTN_NUM_THREADS when valid, else 0 */
    int cores;          /* omp_get_num_procs() */
    int verbose;        /* ATTN_VERBOSE set to anything but "" or "0" */
    char fused_isa[16]; /* ATTN_FUSED_ISA as set ("" when unset or longer) */
} attn_env;
const attn_env *attn_env_get(void);

/* Test and measurement hooks (tests/, bench/; not in attn.h, not exported
 * from libattn.so, reached through libattn.a). Not thread-safe against
 * calls in flight: use them between calls.
 *   attn_test_reload_env: read the environment again, as the first call did
 *     (tests that setenv() ATTN_NUM_THREADS or ATTN_FUSED_ISA).
 *   attn_test_isa_name: the name of row i of isa.c's table (best first),
 *     NULL past its end: the ATTN_FUSED_ISA values a test can ask for.
 *   attn_test_fused_blas: nonzero routes the fused path's tile products
 *     through OpenBLAS sgemm (single-threaded) instead of the own
 *     micro-kernel, to measure the one against the other.
 *   attn_test_tanh: y = tanh(x) by the vector tanh that soft-capping uses
 *     in row i's fp32 (bf16 0) or bf16 (bf16 1) kernels; 0 (y untouched)
 *     when the CPU does not run row i or there is none, else 1. */
void attn_test_reload_env(void);
const char *attn_test_isa_name(int i);
int attn_test_tanh(int i, int bf16, const float *x, float *y, int64_t n);
void attn_test_fused_blas(int on);
int attn_fused_blas_on(void);

/* Overflow-checked int64 arithmetic: return 0 on overflow. */
int attn_mul64(int64_t a, int64_t b, int64_t *r);
int attn_add64(int64_t a, int64_t b, int64_t *r);

/* A validated SDPA problem: sizes, scale, masks with broadcast strides
 * resolved (0 on a broadcast dim), dropout decision constants. Built once by
 * attn_sdpa_check and read by every kernel (reference and fused). */
typedef struct {
    int64_t B, H, Lq, Lk, Dk, Dv;
    int64_t Hkv, group; /* K/V heads and query heads per K/V head (H / Hkv) */
    float scale;
    float softcap;         /* > 0: s -> softcap·tanh(s / softcap); 0: off */
    const float *alibi;    /* [H] ALiBi slopes or NULL */
    const float *sinks;    /* [H] sink logits or NULL */
    int causal;
    const int64_t *key_lengths; /* [B] or NULL */
    int use_window;
    int64_t window_left, window_right; /* ATTN_UNBOUNDED = no limit */
    const uint8_t *bmask;
    int64_t bms[4]; /* bool mask and its strides */
    const float *amask;
    int64_t ams[4];          /* additive mask and its strides */
    int dropout;             /* nonzero: apply dropout */
    uint32_t drop_threshold; /* drop iff philox word < this */
    float keep_scale;        /* 1 / (1 - p) */
    uint64_t drop_key;       /* Philox key from (seed, offset) */
    int64_t drop_b0; /* dropout counter's batch word b + drop_b0 (dropout_row0; varlen: + seq) */
    int threads;
    attn_dtype dtype, out_dtype; /* storage of q, k, v / of out, grad_out (sdpa_bf16.h) */
} attn_problem;

/* A validated packed variable-length call (attn_sdpa_varlen_*): n sequences,
 * sequence s on query rows [cu_q[s], cu_q[s+1]) and key rows [cu_k[s],
 * cu_k[s+1]) of the packed [1, H, total, D] tensors; weights_at[s] is the
 * offset of its [H, Lq_s, Lk_s] weights block (weights_at[n]: all of them). */
typedef struct {
    int64_t n;
    const int64_t *cu_q, *cu_k;
    int64_t *weights_at; /* [n + 1], owned: attn_varlen_free */
} attn_varlen;

/* Validate a varlen call (the padded checks on the packed tensors, then the
 * cumulative lengths) into pr (the packed problem, B = 1) and varlen. */
attn_status attn_varlen_check(const attn_tensor *q, const attn_tensor *k, const attn_tensor *v,
                              const attn_tensor *out, int64_t batch, const int64_t *cu_seqlens_q,
                              const int64_t *cu_seqlens_k, const attn_sdpa_params *p,
                              attn_problem *pr, attn_varlen *varlen, attn_error *err);
void attn_varlen_free(attn_varlen *varlen);
/* Sequence s of a varlen call as a padded problem of one batch row (its
 * dropout counters those of batch row s) and the views of its rows. */
void attn_varlen_seq(const attn_problem *pr, const attn_varlen *varlen, int64_t s,
                     attn_problem *sub);
attn_tensor attn_varlen_rows(const attn_tensor *t, int64_t row0, int64_t n);

/* attn_sdpa_forward with the fused path's scratch given (ws, ws_floats as
 * for attn_sdpa_fused_forward; NULL: allocated in the call). */
attn_status attn_sdpa_forward_ws(const attn_tensor *q, const attn_tensor *k, const attn_tensor *v,
                                 const attn_sdpa_params *p, attn_tensor *out, float *weights,
                                 float *lse, attn_sdpa_info *info, float *ws, int64_t ws_floats,
                                 attn_error *err);

/* Validate q, k, v, out (and for the backward, grad/dq/dk/dv when non-NULL
 * are checked by the caller with attn_check_same_shape) and fill pr. */
attn_status attn_sdpa_check(const attn_tensor *q, const attn_tensor *k, const attn_tensor *v,
                            const attn_tensor *out, const attn_sdpa_params *p, attn_problem *pr,
                            attn_error *err);
attn_status attn_check_tensor(const attn_tensor *t, const char *name, attn_error *err);
attn_status attn_check_same_shape(const attn_tensor *t, const attn_tensor *like, const char *name,
                                  const char *like_name, attn_error *err);

/* Aliasing: each output view is checked against every input and every
 * earlier output, element by element (interleaved views that share no
 * element pass); a shared element, or a pair too intricate to settle in a
 * bounded search, gives ATTN_ERR_ALIAS naming both. Views with data NULL
 * are skipped. esize: bytes per element (4 fp32, 2 bf16). */
typedef struct {
    const char *name;
    const void *data;
    int64_t dim[4], stride[4], esize;
} attn_alias_view;
attn_alias_view attn_alias_tensor(const attn_tensor *t, const char *name, int bf16);
attn_alias_view attn_alias_floats(const float *data, int64_t n, const char *name);
attn_status attn_check_alias(const attn_alias_view *in, int nin, const attn_alias_view *out,
                             int nout, attn_error *err);

/* Subnormal floats flushed to zero on the calling thread for a fused
 * kernel's parallel region (MXCSR FTZ and DAZ on x86; restored by
 * attn_fp_leave, so the caller's and the pool threads' modes are as they
 * were). Scores far below their row's max (ALiBi's distance penalty, large
 * finite negative masks) give exp() results and P·V, dS terms below
 * FLT_MIN; Intel cores take a microcode assist for each (measured on a
 * Xeon, 1,8,1024 with ALiBi: forward 43 -> 19 ms, backward 182 -> 42 ms),
 * AMD cores do not. Only values below 1.2e-38 change. The reference path
 * keeps IEEE subnormals: it is the oracle. */
#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
static inline unsigned attn_fp_enter(void) {
    const unsigned m = _mm_getcsr();
    _mm_setcsr(m | 0x8040u); /* FTZ (bit 15), DAZ (bit 6) */
    return m;
}
static inline void attn_fp_leave(unsigned m) { _mm_setcsr(m); }
#else
static inline unsigned attn_fp_enter(void) { return 0; }
static inline void attn_fp_leave(unsigned m) { (void)m; }
#endif

/* Keys [*lo, *hi) that the structural masks (causal, key padding, window)
 * leave visible to query i of batch b; *lo >= *hi when none. */
static inline void attn_row_range(const attn_problem *pr, int64_t b, int64_t i, int64_t *lo,
                                  int64_t *hi) {
    int64_t l = 0, h = pr->Lk;
    int64_t ia = i + pr->Lk - pr->Lq; /* the query's absolute position */
    if (pr->causal && ia + 1 < h) h = ia + 1;
    if (pr->key_lengths && pr->key_lengths[b] < h) h = pr->key_lengths[b];
    if (pr->use_window) {
        if (pr->window_left != ATTN_UNBOUNDED && ia - pr->window_left > l) l = ia - pr->window_left;
        if (pr->window_right != ATTN_UNBOUNDED && ia + pr->window_right + 1 < h)
            h = ia + pr->window_right + 1;
    }
    *lo = l;
    *hi = h;
}

/* The K/V head query head h reads (grouped-query attention). */
static inline int64_t attn_kv_head(const attn_problem *pr, int64_t h) { return h / pr->group; }

/* A raw scaled score s of (h, i, j) through soft-capping and ALiBi, before
 * the masks (attn.h's order). *dcap (optional) gets ds_out/ds = 1 − tanh²
 * (1 without a cap), the factor the backward multiplies dS by. */
static inline float attn_score_variants(const attn_problem *pr, int64_t h, int64_t i, int64_t j,
                                        float s, float *dcap) {
    if (pr->softcap > 0.0f) {
        const float t = tanhf(s / pr->softcap);
        s = pr->softcap * t;
        if (dcap) *dcap = 1.0f - t * t;
    } else if (dcap) {
        *dcap = 1.0f;
    }
    if (pr->alibi) {
        const int64_t dist = i + pr->Lk - pr->Lq - j;
        s -= pr->alibi[h] * (float)(dist < 0 ? -dist : dist);
    }
    return s;
}
static inline int attn_has_score_variants(const attn_problem *pr) {
    return pr->softcap > 0.0f || pr->alibi != NULL;
}

/* Fold a row's sink logit into its softmax statistics: the row's keys gave
 * max m and sum l (Σ exp(s - m); l 0 and m -inf when no key is visible).
 * Returns the factor f that turns the keys' unnormalised output O into
 * out = O·f, and sets *M (the new max) and *inv (1 / the new sum, for the
 * weights exp(s - M)·inv) and *lse. Without a sink (sink -inf) it is the
 * plain 1/l (0 for an empty row, lse -inf). */
static inline float attn_sink_fold(float m, float l, float sink, float *M, float *inv, float *lse) {
    if (sink == -INFINITY || !(l == l)) { /* no sink, or a poisoned row (NaN l) */
        *M = m;
        *inv = 1.0f / l;
        *lse = l == 0.0f ? -INFINITY : m + logf(l);
        return l == 0.0f ? 0.0f : *inv;
    }
    if (l == 0.0f) { /* no visible key: the sink takes the mass */
        *M = sink;
        *inv = 1.0f;
        *lse = sink;
        return 0.0f;
    }
    const float mm = m > sink ? m : sink;
    const float em = expf(m - mm); /* NaN when m = +inf: poisoned, stays NaN */
    const float L = l * em + expf(sink - mm);
    *M = mm;
    *inv = 1.0f / L;
    *lse = mm + logf(L);
    return em / L;
}

/* The sinks' gradient (attn.h, d_sinks) from the saved out and lse and
 * grad_out of a call with pr->sinks: rows [B, H, Lq] of out / grad_out
 * (fp32 or bf16 by pr->out_dtype), lse row (b, h, i) at
 * (b·H + h)·lse_ld + i. Written to d [H]. */
void attn_sinks_grad(const attn_problem *pr, const attn_tensor *out, const attn_tensor *dout,
                     const float *lse, int64_t lse_ld, float *d);

/* Philox-4x32-10 block for dropout: the four words decide keys 4c..4c+3 of
 * row (b, h, i). Same inputs, same words, on any thread or tile. */
void attn_philox_block(uint64_t key, int64_t b, int64_t h, int64_t i, int64_t c, uint32_t out[4]);
uint64_t attn_dropout_key(uint64_t seed, uint64_t offset);

/* Kernels. They trust a validated problem. The reference backward ADDS the
 * sinks' gradient (pr->sinks) to sink_acc [H] when it is non-NULL. */
attn_status attn_sdpa_reference_forward(const attn_problem *pr, const attn_tensor *q,
                                        const attn_tensor *k, const attn_tensor *v,
                                        attn_tensor *out, float *weights, float *lse,
                                        attn_error *err);
attn_status attn_sdpa_reference_backward(const attn_problem *pr, const attn_tensor *q,
                                         const attn_tensor *k, const attn_tensor *v,
                                         const attn_tensor *out, const float *lse,
                                         const attn_tensor *dout, attn_tensor *dq, attn_tensor *dk,
                                         attn_tensor *dv, double *sink_acc, attn_error *err);

/* The varlen reference: attn_sdpa_reference_* per sequence (lse [H, total_q]). */
attn_status attn_varlen_reference_forward(const attn_problem *pr, const attn_varlen *varlen,
                                          const attn_tensor *q, const attn_tensor *k,
                                          const attn_tensor *v, attn_tensor *out, float *weights,
                                          float *lse, attn_error *err);
attn_status attn_varlen_reference_backward(const attn_problem *pr, const attn_varlen *varlen,
                                           const attn_tensor *q, const attn_tensor *k,
                                           const attn_tensor *v, const attn_tensor *out,
                                           const float *lse, const attn_tensor *dout,
                                           attn_tensor *dq, attn_tensor *dk, attn_tensor *dv,
                                           double *sink_acc, attn_error *err);

/* Row-major C[M,N] = alpha * op(A) op(B) + beta * C (ta/tb nonzero:
 * transpose) on `threads` threads of the library's own team, by the packed
 * micro-kernel of isa.c's active row (gemm.c). Bitwise the same C for any
 * thread count: K is blocked from 0 whatever the threads, and the threads
 * share out whole MR x NR tiles of C. beta = 0: C is not read. */
void attn_sgemm(int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A,
                int64_t lda, const float *B, int64_t ldb, float beta, float *C, int64_t ldc,
                int threads);
/* The active micro-kernel's MR: threads cut C at multiples of it (rows) and
 * of its NR (columns). */
int64_t attn_sgemm_row_step(void);

/* One instruction set's fp32 GEMM micro-kernel and its cache blocking
 * (sgemm_<isa>.c, from sgemm_template.h): a column of isa.c's table. */
#define ATTN_SGEMM_TILE_MAX (14 * 32) /* the largest MR x NR of any row */
typedef struct {
    const char *name;
    int mr, nr;             /* the micro-tile: mr x nr elements of C, mr * nr <= ATTN_SGEMM_TILE_MAX */
    int64_t kc, mc, nc;     /* blocks: K, rows of packed A, columns of packed B */
    /* C[mr x nr] (row stride ldc) from packed panels Ap [kc][mr], Bp
     * [kc][nr]: acc = sum_k Ap Bp (one FMA chain from 0); first: C = alpha
     * acc + beta C (C not read when beta = 0), else C = alpha acc + C */
    void (*ukr)(int64_t kc, const float *Ap, const float *Bp, float *C, int64_t ldc, float alpha,
                float beta, int first);
    /* the same on the first 1, 2, 4, 8 rows only (ukr_rows[i]: min(2^i, mr)
     * rows; the same arithmetic per element), for a panel's last rows */
    void (*ukr_rows[4])(int64_t kc, const float *Ap, const float *Bp, float *C, int64_t ldc,
                        float alpha, float beta, int first);
    /* panels p0 <= p < p1 (mr rows each) of op(A)[i0 : i0+mc, k0 : k0+kc]
     * into Ap (panel p at Ap + p*mr*kc: [kc][mr], rows past mc zeros) */
    void (*pack_a)(const float *A, int64_t lda, int ta, int64_t i0, int64_t mc, int64_t k0,
                   int64_t kc, int64_t p0, int64_t p1, float *Ap);
    /* panels q0 <= q < q1 (nr columns each) of op(B)[k0 : k0+kc, j0 : j0+nc]
     * into Bp (panel q at Bp + q*nr*kc: [kc][nr], columns past nc zeros) */
    void (*pack_b)(const float *B, int64_t ldb, int tb, int64_t k0, int64_t kc, int64_t j0,
                   int64_t nc, int64_t q0, int64_t q1, float *Bp);
} attn_sgemm_kernel;
/* Measurement hook (bench/sgemm_candidates.c): blocking KC, MC, NC in
 * place of every kernel's own (MC and NC rounded up to whole tiles); 0: the
 * kernel's. Not thread-safe against products in flight. */
void attn_test_sgemm_blocking(int64_t kc, int64_t mc, int64_t nc);
/* Test hook: nonzero sends every product down the fallback a failed packing
 * allocation takes (one single-threaded OpenBLAS sgemm); 0: normal. */
void attn_test_sgemm_fallback(int on);
/* isa.c: the micro-kernel of the active row (as attn_fused_kernels_active). */
const attn_sgemm_kernel *attn_sgemm_kernel_active(void);

/* ---------------------------------------------------------------- fused path
 * Tiled online-softmax kernels (sdpa_fused*.c). One algorithm, compiled per
 * instruction set (sdpa_fused_<isa>.c), chosen at run time from isa.c's
 * table. */

#define ATTN_FUSED_QTILE 64    /* query rows per block */
#define ATTN_FUSED_KTILE 96    /* keys per tile */
#define FUSED_DECODE_MAXLQ 4   /* Lq at or below this: decode kernel */
#define FUSED_DECODE_CHUNK 256 /* decode key chunk (doubled until <= 64 chunks) */

/* Everything one fused call reads and writes. */
typedef struct {
    const attn_problem *pr;
    const attn_tensor *q, *k, *v, *out; /* out: written by the forward, read by the backward */
    float *weights, *lse;               /* forward outputs, optional */
    const float *lse_in;                /* backward input */
    const attn_tensor *dout;            /* backward */
    attn_tensor *dq, *dk, *dv;          /* backward outputs */
    int blas;              /* nonzero: tile products through OpenBLAS sgemm (measurement only) */
    float *ws;             /* forward scratch given by the caller (64-byte aligned), */
    int64_t ws_floats;     /* or NULL: the kernel allocates it */
    const attn_varlen *varlen; /* non-NULL: a packed varlen call (pr is the packed problem) */
    float *sink_rows; /* bf16 backward, optional: Σ_j P_ij·dP_ij per query row [B·H·Lq]
                         (the sinks' gradient without the bf16 rounding of O in dO·O) */
} attn_fused_call;

/* One instruction set's kernels (sdpa_fused_<isa>.c, from
 * sdpa_fused_template.h): a row of isa.c's table. */
typedef struct {
    const char *name; /* ATTN_FUSED_ISA value; "fused path: NAME kernels" */
    attn_status (*forward)(const attn_fused_call *c, attn_error *err);
    attn_status (*backward)(const attn_fused_call *c, attn_error *err);
    /* scratch floats the forward of a weights-free call of pr takes (what
     * attn_fused_call.ws must hold) */
    int64_t (*forward_scratch)(const attn_problem *pr);
    /* y[i] = tanh(x[i]), i < n: the kernels' soft-capping tanh (tests) */
    void (*tanh_n)(const float *x, float *y, int64_t n);
} attn_fused_kernels;

/* isa.c: the kernels the fused path uses: the best the CPU runs (detected
 * once), lowered (never raised) to the one ATTN_FUSED_ISA names. */
const attn_fused_kernels *attn_fused_kernels_active(void);
/* The most scratch any instruction set the CPU runs takes for pr. */
int64_t attn_fused_forward_scratch(const attn_problem *pr);

/* Query heads stacked in one block of the fused forward (pack_gqa, as
 * FlashAttention-3 stacks them): the same `rows` query rows of P heads of
 * one K/V head's group share the block's K/V tiles, read once for the P
 * heads. P is the largest divisor of the group with P·rows <= 256 that
 * still leaves 4 blocks per thread (nqb blocks per head). Every row's
 * arithmetic is the one-head block's, so results do not depend on P. */
static inline int64_t attn_fused_gqa_pack(const attn_problem *pr, int64_t rows, int64_t nqb) {
    int64_t P = 1;
    for (int64_t p = 2; p <= pr->group && p * rows <= 256; p++)
        if (pr->group % p == 0 && pr->B * (pr->H / p) * nqb >= 4 * (int64_t)pr->threads) P = p;
    return P;
}

/* Nonzero: the backward runs one pass per (b, h) (the heads spread over
 * the threads with at most a third of a round idle); else two passes
 * (which recompute S and dP once more, 7 tile products instead of 5, but
 * parallelise over key and query blocks). Either gives bit-identical
 * results. */
static inline int attn_fused_bwd_one_pass(const attn_problem *pr) {
    const int64_t bh = pr->B * pr->Hkv, T = pr->threads; /* an item: a K/V head's group */
    if (T <= 1) return 1;
    const int64_t rounds = (bh + T - 1) / T;
    return rounds * T * 3 <= bh * 4;
}
/* Nonzero: the varlen backward runs one pass per (sequence, head): the
 * largest item is at most a third of a thread's share of the work. */
static inline int attn_fused_varlen_one_pass(const attn_problem *pr, const attn_varlen *varlen) {
    if (pr->threads <= 1) return 1;
    double total = 0, largest = 0; /* Lq·Lk per (sequence, head) */
    for (int64_t s = 0; s < varlen->n; s++) {
        const double w = (double)(varlen->cu_q[s + 1] - varlen->cu_q[s]) *
                         (double)(varlen->cu_k[s + 1] - varlen->cu_k[s]);
        total += w * (double)pr->H; /* an item: a K/V head's group of query heads */
        largest = w * (double)pr->group > largest ? w * (double)pr->group : largest;
    }
    return largest * 3.0 * pr->threads <= total;
}
/* Describe the fused path for pr in buf (for attn_sdpa_info.reason). */
void attn_sdpa_fused_describe(const attn_problem *pr, const attn_varlen *varlen, int backward,
                              char *buf, size_t n);

/* ws: scratch of ws_floats (>= attn_fused_forward_scratch(pr), 64-byte
 * aligned), or NULL to allocate it in the call. */
attn_status attn_sdpa_fused_forward(const attn_problem *pr, const attn_tensor *q,
                                    const attn_tensor *k, const attn_tensor *v, attn_tensor *out,
                                    float *weights, float *lse, float *ws, int64_t ws_floats,
                                    attn_error *err);
attn_status attn_sdpa_fused_backward(const attn_problem *pr, const attn_tensor *q,
                                     const attn_tensor *k, const attn_tensor *v,
                                     const attn_tensor *out, const float *lse,
                                     const attn_tensor *dout, attn_tensor *dq, attn_tensor *dk,
                                     attn_tensor *dv, float *sink_rows, attn_error *err);
/* The packed varlen forward / backward: every (sequence, head, query block)
 * in one parallel region, tiles planned per sequence (cost Σ Lq_s·Lk_s);
 * lse [H, total_q], weights as attn_varlen.weights_at lays them out. */
attn_status attn_sdpa_fused_varlen(const attn_fused_call *c, int backward, attn_error *err);

#endif
