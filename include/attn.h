/* attn: exact scaled dot-product and multi-head attention in C.
 *
 * Conventions
 *   - fp32 in and out, fp32 accumulation; the scaled dot-product calls also
 *     take bfloat16 inputs and outputs (attn_dtype below), still with fp32
 *     accumulation, softmax and log-sum-exp.
 *   - Every function returns an attn_status; on failure it also fills the
 *     optional caller-owned attn_error with a readable message. Nothing in the
 *     library aborts, exits or prints (except the dispatch notes that
 *     ATTN_VERBOSE set to anything but "" or "0" sends to stderr).
 *   - Memory is the caller's: outputs, weights, caches and workspaces are
 *     passed in. The library may allocate small per-call scratch with malloc
 *     when no workspace is given; failure is ATTN_ERR_NOMEM, never a crash.
 *   - The only global state is the thread count (attn_set_num_threads, or the
 *     ATTN_NUM_THREADS environment variable; default: all cores). See
 *     "Threads and OpenBLAS" below for what the library does and does not
 *     touch in the process.
 *   - The environment (ATTN_NUM_THREADS, ATTN_VERBOSE, ATTN_FUSED_ISA) is
 *     read once, at the library's first call (pthread_once); setting it
 *     later has no effect.
 *   - The shared library exports exactly the functions declared here
 *     (ATTN_API; everything else is built with hidden visibility).
 *
 * A query row that sees no key (every key masked) gets output 0, weights 0,
 * log-sum-exp -inf and zero gradient. PyTorch's math path returns NaN for such
 * a row; the tutorial's masked_fill(-1e9) returns the mean of V instead.
 * (With attention sinks such a row's sink takes the whole mass: output 0,
 * log-sum-exp the sink's logit.)
 *
 * Attention variants (attn_sdpa_params; the peers' conventions, FlashAttention-2,
 * PyTorch, gpt-oss), all combinable with each other and with every mask,
 * causal, window, key padding and dropout:
 *   - grouped-query / multi-query attention: k and v have H_kv heads (their
 *     dim[1]), H_q % H_kv == 0; query head h reads K/V head
 *     h / (H_q / H_kv) (PyTorch's repeat_interleave). MQA is H_kv = 1. The
 *     backward's dk, dv have k's and v's shapes: each K/V head's gradient
 *     is the sum over its group's query heads, in head order (bitwise the
 *     same for any thread count).
 *   - logit soft-capping (use_softcap, softcap = c > 0): the scaled score s
 *     becomes c·tanh(s / c), before ALiBi and masks (Gemma 2).
 *   - ALiBi (alibi_slopes, one slope m_h per query head): −m_h·|i′ − j| is
 *     added after soft-capping, i′ = i + Lk − Lq the query's absolute
 *     position.
 *   - attention sinks (sinks, one logit σ_h per query head): σ_h joins every
 *     row's softmax denominator and carries no value,
 *     p_ij = exp(s_ij) / (exp(σ_h) + Σ_k exp(s_ik)); the weights returned
 *     are these p (a row sums to 1 − p_sink), the log-sum-exp includes σ_h,
 *     and the backward returns dL/dσ in d_sinks.
 */
#ifndef ATTN_H
#define ATTN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Visibility of the public functions (the library is built with
 * -fvisibility=hidden, so nothing else is exported). */
#if defined(__GNUC__)
#define ATTN_API __attribute__((visibility("default")))
#else
#define ATTN_API
#endif

/* The header's version. attn_version() returns the library's: the two
 * differ when a program runs against another build than it was compiled
 * with (the struct layouts here are the ABI; the soname changes with them). */
#define ATTN_VERSION_MAJOR 0
#define ATTN_VERSION_MINOR 6
#define ATTN_VERSION_PATCH 0
#define ATTN_VERSION "0.6.0"
ATTN_API const char *attn_version(void);

/* What this CPU runs of the library's instruction-set table: ATTN_CPU_*
 * bits, read once (thread-safely) at the first call; 0 on a CPU other than
 * x86-64. The CPU's, not lowered by ATTN_FUSED_ISA. For applications with
 * kernels of their own, so that they dispatch on the table the library
 * uses (molgen's products do). */
#define ATTN_CPU_AVX2_FMA 1u   /* AVX2 and FMA3 */
#define ATTN_CPU_AVX512 2u     /* AVX-512F (with AVX2 and FMA3) */
#define ATTN_CPU_AVX512BF16 4u /* AVX512_BF16 (VDPBF16PS), the OS saving the AVX-512 state */
#define ATTN_CPU_AMX 8u        /* AMX-BF16 tiles (with AVX512_BF16), the OS enabling them */
ATTN_API unsigned attn_cpu_features(void);

/* Lets the bf16 fused kernels use AMX tiles (TDPBF16PS: 16 times
 * VDPBF16PS's products per instruction) on a CPU with ATTN_CPU_AMX. Linux
 * gives a process the use of tile data only when it asks (arch_prctl
 * ARCH_REQ_XCOMP_PERM): a process-wide grant that cannot be undone and
 * enlarges every thread's signal frames, which is why no other call of
 * the library asks. Call it once, from the application, when that suits
 * the process; if the process already held the permission at the
 * library's first call (asked itself or through another library) the
 * library uses AMX without this call.
 * Returns 1 when the amx row is in use from now on (ATTN_FUSED_ISA can
 * still lower it), 0 where the CPU, the OS or the kernel refuses. Results
 * differ from the avx512bf16 row's by the order of the fp32 sums only. */
ATTN_API int attn_enable_amx(void);

/* ---------------------------------------------------------------- errors */

typedef enum {
    ATTN_OK = 0,
    ATTN_ERR_NULL = 1,     /* a required pointer is NULL */
    ATTN_ERR_SHAPE = 2,    /* a size is <= 0 or sizes do not match */
    ATTN_ERR_OVERFLOW = 3, /* a size product overflows size_t / int64 */
    ATTN_ERR_MASK = 4,     /* a mask does not broadcast, or bad key length */
    ATTN_ERR_ARG = 5,      /* another invalid argument (dropout_p, scale...) */
    ATTN_ERR_NOMEM = 6,    /* allocation failed or workspace too small */
    ATTN_ERR_STATE = 7,    /* call order (e.g. backward without a cache) */
    ATTN_ERR_ALIAS = 8     /* an output overlaps an input or another output */
} attn_status;

/* Caller-owned error report. Pass NULL if you only want the status. */
typedef struct {
    attn_status status;
    char message[256];
} attn_error;

/* Static name of a status code, e.g. "ATTN_ERR_SHAPE". Never NULL. */
ATTN_API const char *attn_status_name(attn_status s);

/* ---------------------------------------------------------------- threads */

/* Threads and OpenBLAS: the policy.
 *   - Every parallel part of the library runs on its own OpenMP team of
 *     attn_set_num_threads (or params.num_threads) threads, with an explicit
 *     num_threads clause: the caller's OpenMP settings are neither read nor
 *     changed.
 *   - The dense products (attn_matmul, the multi-head layer's projections)
 *     run the library's own packed fp32 kernels on that team; they do not
 *     call OpenBLAS. OpenBLAS is called only as a fallback, when a product's
 *     packing buffers cannot be allocated, and then single-threaded: with
 *     OpenBLAS's OpenMP build (libopenblas-openmp, which the build prefers)
 *     without any global setting (the library sets its one-thread region's
 *     own thread count, which ends with the region); with the pthread build
 *     OpenBLAS's thread count is process-wide: the library sets it to 1
 *     once, at its first call, and never again (an application that wants
 *     OpenBLAS threads for its own products sets them after that). The
 *     library never sets OpenBLAS's or OpenMP's thread counts per call.
 *   - Hence concurrent calls from several application threads are safe by
 *     construction: no call reads state another call writes, except the
 *     thread count itself (atomic).
 *   - Results are bitwise identical for any thread count and do not depend
 *     on how many callers run at once. (For the products this rests on
 *     cutting K into the same blocks whatever the threads and sharing out
 *     only whole tiles of C, each formed by the same micro-kernel.)
 *   - The fused attention kernels flush subnormal floats to zero (x86:
 *     MXCSR's FTZ and DAZ) on each of their threads while they run, and put
 *     back each thread's own mode when they end: Intel cores are several
 *     times slower on the subnormal results that ALiBi and masks produce.
 *     Only values below 1.2e-38 change; the reference path keeps IEEE
 *     subnormals. */

#define ATTN_MAX_THREADS 1024

/* 1 <= n <= ATTN_MAX_THREADS sets the thread count for every parallel part of the library;
 * n == 0 restores the default (ATTN_NUM_THREADS if set, else all cores). */
ATTN_API attn_status attn_set_num_threads(int n, attn_error *err);
ATTN_API int attn_get_num_threads(void);

/* ---------------------------------------------------------- dense products */

/* Row-major C [M, N] = alpha op(A) op(B) + beta C, the product the library's
 * own projections use, for an application's dense layers: op(X) is X, or
 * Xᵀ when trans_x is nonzero; op(A) is [M, K] and op(B) [K, N]; lda, ldb,
 * ldc are the row strides of A, B, C as stored (A is [M, >= K], or [K, >= M]
 * when transposed; likewise B; C is [M, >= N]). beta 0: C's old values are
 * not read (NaN there stays out of the result).
 * Runs by the policy above on num_threads threads of the library's team (0:
 * the global setting): the packed micro-kernel of the best instruction set
 * this CPU runs (AVX-512, AVX2 or portable; ATTN_FUSED_ISA lowers it, as
 * for the fused kernels), the threads sharing out whole tiles of C, so C is
 * bitwise the same for any thread count (not across instruction sets).
 * Errors, with C untouched: a NULL pointer (ATTN_ERR_NULL), M, N or K < 1 or
 * a leading dimension below its row's length (ATTN_ERR_SHAPE), a size or
 * leading dimension above INT_MAX (OpenBLAS's int, for the fallback;
 * ATTN_ERR_OVERFLOW), a non-finite alpha or beta, num_threads outside
 * [0, ATTN_MAX_THREADS] (ATTN_ERR_ARG). */
ATTN_API attn_status attn_matmul(int trans_a, int trans_b, int64_t M, int64_t N, int64_t K,
                                 float alpha, const float *A, int64_t lda, const float *B,
                                 int64_t ldb, float beta, float *C, int64_t ldc, int num_threads,
                                 attn_error *err);

/* ---------------------------------------------------------------- tensors */

/* A strided 4-D fp32 view, dims [B, H, L, D], strides in elements.
 * The projections' packed layout [B, L, H, D] is the view with strides
 * {L*H*D, D, H*D, 1}; no copy needed. Inputs are read only. */
typedef struct {
    float *data;
    int64_t dim[4];
    int64_t stride[4];
} attn_tensor;

/* Contiguous [B, H, L, D] view of data. */
ATTN_API attn_tensor attn_tensor_bhld(float *data, int64_t B, int64_t H, int64_t L, int64_t D);
/* Packed [B, L, H, D] memory seen as [B, H, L, D]. */
ATTN_API attn_tensor attn_tensor_blhd(float *data, int64_t B, int64_t H, int64_t L, int64_t D);

/* ---------------------------------------------------------------- bfloat16 */

/* Storage type of the q, k, v, out and grad_out tensors of the scaled
 * dot-product calls (attn_sdpa_params.dtype, .out_dtype). ATTN_BF16 is
 * bfloat16 (1 sign, 8 exponent, 7 mantissa bits: the top half of an fp32)
 * held in uint16_t; an attn_tensor of bf16 points at it through a cast
 * (attn_tensor_bhld_bf16 does it) and counts its strides in 2-byte
 * elements.
 * ATTN_DTYPE_DEFAULT (0, what zero-initialised params hold) means fp32 for
 * dtype and "the same as dtype" for out_dtype, so the natural call
 * (dtype = ATTN_BF16, out_dtype left 0) reads and writes bf16 and never
 * writes fp32 into a bf16-sized out. An fp32 out from bf16 inputs is asked
 * for explicitly: out_dtype = ATTN_F32. (0.4 had ATTN_F32 = 0 and
 * ATTN_BF16 = 1 with out_dtype 0 meaning fp32; the values moved in 0.5,
 * with the soname.) */
typedef enum {
    ATTN_DTYPE_DEFAULT = 0, /* dtype: fp32; out_dtype: dtype's */
    ATTN_F32 = 1,           /* float */
    ATTN_BF16 = 2           /* bfloat16 in uint16_t */
} attn_dtype;

/* n values between fp32 and bf16. To bf16: round to nearest, ties to even;
 * NaN stays NaN (quiet), ±inf and ±0 stay, values above bf16's largest
 * finite (3.39e38) after rounding become ±inf. To fp32: exact. src and dst
 * must not overlap. */
ATTN_API void attn_bf16_from_f32(const float *src, uint16_t *dst, size_t n);
ATTN_API void attn_f32_from_bf16(const uint16_t *src, float *dst, size_t n);

/* attn_tensor_bhld / attn_tensor_blhd over bf16 storage (strides in
 * bf16 elements). */
ATTN_API attn_tensor attn_tensor_bhld_bf16(uint16_t *data, int64_t B, int64_t H, int64_t L,
                                           int64_t D);
ATTN_API attn_tensor attn_tensor_blhd_bf16(uint16_t *data, int64_t B, int64_t H, int64_t L,
                                           int64_t D);

/* A mask view broadcastable to [B, H, Lq, Lk]: dim[0] is B or 1, dim[1] is H
 * or 1, dim[2] == Lq, dim[3] == Lk. Strides in elements; a dim of size 1 is
 * broadcast whatever its stride, and stride 0 broadcasts any dim. */
typedef struct {
    const void *data; /* uint8_t (bool, nonzero = takes part) or float (added) */
    int64_t dim[4];
    int64_t stride[4];
} attn_mask;

/* -------------------------------------------------- scaled dot-product */

#define ATTN_UNBOUNDED (-1) /* window side without a limit */

typedef enum {
    ATTN_IMPL_AUTO = 0,      /* fastest path that supports the call */
    ATTN_IMPL_REFERENCE = 1, /* materialise each row of scores; the oracle */
    ATTN_IMPL_FUSED = 2      /* tiled online softmax (see attn_sdpa_info) */
} attn_impl;

/* Everything about a call except the tensors. Zero-initialise, then set what
 * you need: {0} means scale 1/sqrt(d_k), no mask, no dropout, auto path. */
typedef struct {
    /* use_scale nonzero: the scores are scaled by scale, any finite value
     * (0 included: every score 0). use_scale 0: 1/sqrt(d_k), and scale must
     * be left 0 (a nonzero scale without use_scale is refused, so code
     * written for 0.1's "scale 0 means default" fails loudly). */
    int use_scale;
    float scale;

    /* Causal: query i sees keys j <= i + (Lk - Lq); when Lq < Lk the queries
     * are the last Lq positions (decoding with a KV cache). */
    int causal;

    /* Key padding: keys j >= key_lengths[b] do not take part; [B], each in
     * [0, Lk]. NULL: all keys valid. */
    const int64_t *key_lengths;

    /* Sliding window around the query's absolute position i' = i + Lk - Lq:
     * keys in [i' - window_left, i' + window_right]; ATTN_UNBOUNDED for no
     * limit on that side. Active only when use_window is nonzero. */
    int use_window;
    int64_t window_left, window_right;

    /* Optional masks broadcastable to [B, H, Lq, Lk]; both may be given.
     * bool_mask: uint8_t, nonzero = takes part. add_mask: float added to the
     * scaled scores; -inf removes the key. */
    const attn_mask *bool_mask;
    const attn_mask *add_mask;

    /* Dropout on the attention weights, inverted scaling 1/(1 - p). Active
     * only when training is nonzero and dropout_p > 0. Element (b, h, i, j)
     * is kept or dropped by Philox-4x32-10 with key
     * splitmix64(splitmix64(seed) ^ offset) and counter
     * (j / 4, i, h, dropout_row0 + b), word j % 4; dropped iff that word <
     * dropout_p * 2^32. The same mask for any thread count or tiling,
     * regenerated by the backward; i is the query's index within the call.
     * dropout_row0 (default 0; dropout_row0 + B <= 2^32) lets a caller that
     * runs a batch in pieces give each piece the masks of its rows in the
     * whole batch. Weights returned are before dropout. */
    float dropout_p;
    int training;
    uint64_t seed, offset;
    int64_t dropout_row0;

    attn_impl impl;  /* ATTN_IMPL_AUTO by default */
    int num_threads; /* 0: the global setting */

    /* Storage of q, k, v (dtype) and of out and grad_out (out_dtype):
     * ATTN_F32 or ATTN_BF16; ATTN_DTYPE_DEFAULT (0) is fp32 for dtype and
     * dtype's own type for out_dtype (so dtype = ATTN_BF16 alone gives a
     * bf16 out and grad_out; set out_dtype = ATTN_F32 for fp32 ones).
     * out_dtype ATTN_BF16 needs dtype ATTN_BF16 (other pairs and values:
     * ATTN_ERR_ARG). weights, lse and the
     * gradients dq, dk, dv are always fp32 (fp32 gradients of bf16 inputs:
     * the most accurate, and what an fp32 master copy wants; round them
     * with attn_bf16_from_f32 for bf16). Taken by attn_sdpa_forward and
     * attn_sdpa_backward (and so by decoding over a bf16 K/V cache with
     * Lq <= 4); the varlen and multi-head calls are fp32 only and refuse
     * ATTN_BF16 (ATTN_ERR_ARG).
     * A dtype here rather than in attn_tensor: one entry point per operation
     * as in fp32, attn_tensor and its initialisers stay as they are, and
     * zero-initialised params (the documented way) stay fp32.
     * Semantics of bf16 (FlashAttention / PyTorch 2.x CPU flash attention):
     *   - reference path: the bf16 values converted to fp32 exactly, then
     *     the fp32 computation (the oracle);
     *   - fused forward: S = Q·Kᵀ from the bf16 values with fp32
     *     accumulation (VDPBF16PS on AVX512_BF16, fp32 FMA on converted
     *     values elsewhere: the same rounding of P, not bitwise the same
     *     sums), scale, masks, online softmax, l and lse in fp32, P rounded
     *     to bf16 (ties to even) for P·V, the output tile accumulated in
     *     fp32 and rounded once to out_dtype. A call that asks for weights
     *     runs the fp32 fused kernels on the converted values;
     *   - fused backward (PyTorch 2.x's CPU flash backward): S = Q·Kᵀ and
     *     dP = dO·Vᵀ from bf16 values with fp32 accumulation, P and
     *     dS = P ∘ (dP - D) (D = dO·O) in fp32 and rounded to bf16 for
     *     dV = Pᵀ·dO, dK = dSᵀ·Q, dQ = dS·K (fp32 accumulation); an fp32
     *     grad_out is rounded to bf16 for these products. Reference
     *     backward: the fp32 one on the converted values.
     * Non-finite values: as the fp32 path, except that the bf16 fused
     * kernels do not skip zero weights inside a row's key range (a NaN
     * or inf in K or V at a key a mask hides from one row, visible to
     * another, can reach the first); keys past key_lengths (padding) are
     * never read: garbage there stays out, as in fp32. */
    attn_dtype dtype, out_dtype;

    /* Logit soft-capping: use_softcap nonzero applies s -> softcap·tanh(s /
     * softcap) to the scaled scores, before ALiBi and the masks; softcap
     * must then be finite and > 0. use_softcap 0: off, and softcap must be
     * left 0 (as scale/use_scale). ATTN_ERR_ARG otherwise. */
    int use_softcap;
    float softcap;

    /* ALiBi: [H_q] finite slopes m_h (NULL: none); the bias −m_h·|i′ − j|,
     * i′ = i + Lk − Lq, is added after soft-capping. A non-finite slope is
     * ATTN_ERR_ARG. Not differentiated (a fixed bias). */
    const float *alibi_slopes;

    /* Attention sinks: [H_q] finite logits σ_h (NULL: none), taken in the
     * softmax's denominator of every row of head h (gpt-oss). A non-finite
     * one is ATTN_ERR_ARG. */
    const float *sinks;

    /* The backward's gradient of the sinks: d_sinks [H_q] is OVERWRITTEN with
     * dL/dσ_h = −Σ_{b,i} p_sink(b,h,i)·D(b,h,i), D = dO·O = Σ_j P_ij·dP_ij
     * (the reference path sums the latter, from the recomputed weights, so
     * that a bf16-rounded out does not enter), summed in (b, i) order in
     * double (varlen: over the packed rows; the multi-head
     * backward ADDS it, like its other gradients). NULL: not wanted. Read
     * only by the backward calls (a forward ignores it) and only with sinks
     * given. */
    float *d_sinks;
} attn_sdpa_params;

/* Dropout multipliers from the attention dropout's generator, for an
 * application's own dropout (on activations, residual branches): row r of
 * mask [n, cols] gets the factors attention dropout with p would apply to
 * the weights (b, h, i, j) = (b[r], h, i[r], j), j = 0 .. cols - 1: 0 where
 * dropped, else 1 / (1 - dropout_p); every factor 1 when p's dropout is off
 * (training 0 or dropout_p 0). p's dropout_p, training, seed, offset,
 * dropout_row0 and num_threads are read; the rest is ignored. The same
 * mask for any thread count. Attention calls with the same seed and offset
 * draw the same words: give such a site an offset of its own.
 * Errors: a NULL pointer (ATTN_ERR_NULL), n or cols < 1 (ATTN_ERR_SHAPE),
 * n * cols or cols / 4 too large (ATTN_ERR_OVERFLOW), dropout_p outside
 * [0, 1), num_threads outside [0, ATTN_MAX_THREADS], h, i[r] or
 * b[r] + dropout_row0 outside [0, 2^32) (ATTN_ERR_ARG). */
ATTN_API attn_status attn_dropout_mask(const attn_sdpa_params *p, int64_t n, int64_t cols,
                                       const int64_t *b, int64_t h, const int64_t *i, float *mask,
                                       attn_error *err);

/* Which path ran and why; optional out-parameter. */
typedef struct {
    attn_impl impl;
    char reason[160];
} attn_sdpa_info;

/* O = softmax(Q Kᵀ·scale + masks) V.
 *   q   [B, H, Lq, Dk]      k [B, Hkv, Lk, Dk]    v [B, Hkv, Lk, Dv]
 *   out [B, H, Lq, Dv]      (strided views; out must not alias the inputs)
 *   H % Hkv == 0 (Hkv < H: grouped-query attention, see the top of this
 *   file; masks broadcast to [B, H, Lq, Lk], H the query heads)
 *   weights [B, H, Lq, Lk]  contiguous, optional (NULL)
 *   lse     [B, H, Lq]      contiguous, optional: per-row log-sum-exp of the
 *                           masked, scaled scores (-inf for an empty row);
 *                           the backward needs it.
 *   info    optional: the path that ran and why.
 * No output may share memory with an input or another output: out, weights
 * and lse are each checked against q, k, v and one another, element by
 * element (views that interleave in one buffer without sharing an element,
 * such as q, k and v's slices of a packed [B, L, 3, H, D] buffer, are
 * fine), and an overlap is refused with ATTN_ERR_ALIAS before anything is
 * written. (The check also refuses, conservatively, a pair of strided views
 * whose overlap it cannot settle within a fixed amount of work; inputs may
 * alias one another freely: q = k = v for self-attention.) */
ATTN_API attn_status attn_sdpa_forward(const attn_tensor *q, const attn_tensor *k,
                                       const attn_tensor *v, const attn_sdpa_params *p,
                                       attn_tensor *out, float *weights, float *lse,
                                       attn_sdpa_info *info, attn_error *err);

/* Gradients of attn_sdpa_forward, from the saved out and lse and grad_out
 * (same shape as out). dq, dk, dv have the shapes of q, k, v and are
 * OVERWRITTEN. p must equal the forward's (same masks, seed and offset).
 * dq, dk and dv must not share memory with one another nor with q, k, v,
 * out, lse or grad_out (ATTN_ERR_ALIAS, checked as in the forward; dq, dk,
 * dv as slices of one packed [B, L, 3, H, D] gradient buffer are fine). */
ATTN_API attn_status attn_sdpa_backward(const attn_tensor *q, const attn_tensor *k,
                                        const attn_tensor *v, const attn_tensor *out,
                                        const float *lse, const attn_tensor *grad_out,
                                        const attn_sdpa_params *p, attn_tensor *dq, attn_tensor *dk,
                                        attn_tensor *dv, attn_sdpa_info *info, attn_error *err);

/* ------------------------------------ packed variable-length attention */

/* Several sequences packed back to back (FlashAttention's cu_seqlens), each
 * attending only within itself, at a cost of Σ Lq_s·Lk_s (tiles never cross
 * a sequence boundary), not total_q·total_k.
 *   q   [1, H, total_q, Dk]   k [1, Hkv, total_k, Dk]   v [1, Hkv, total_k, Dv]
 *       (H % Hkv == 0: grouped-query attention as for attn_sdpa_forward)
 *   out [1, H, total_q, Dv]   strided views as for attn_sdpa_forward; the
 *       packed rows [total, H, D] are attn_tensor_blhd(data, 1, H, total, D).
 *   batch >= 1 sequences; sequence s holds query rows cu_seqlens_q[s] ..
 *       cu_seqlens_q[s+1] - 1 and key rows cu_seqlens_k[s] ..
 *       cu_seqlens_k[s+1] - 1. Both arrays are int64 [batch + 1]: 0 first,
 *       non-decreasing (empty sequences allowed), total_q / total_k last.
 *       cu_seqlens_k NULL: the same as cu_seqlens_q (self-attention).
 *   p   as for attn_sdpa_forward, each sequence being batch row s of a padded
 *       call with Lq = Lq_s, Lk = Lk_s (causal and window as there: the
 *       queries are the last Lq_s of its keys when Lq_s < Lk_s). key_lengths,
 *       bool_mask and add_mask are refused (ATTN_ERR_ARG). Dropout: element
 *       (s, h, i, j), i and j counted within the sequence, is decided by the
 *       padded call's counter for (b = s, h, i, j): the same mask as
 *       attn_sdpa_forward on the padded batch with the same seed and offset.
 *       Soft-capping, ALiBi (positions counted within the sequence) and sinks
 *       as there; d_sinks sums over every sequence's rows.
 *   weights optional: sequence s's [H, Lq_s, Lk_s] block, contiguous, the
 *       blocks back to back (Σ_s H·Lq_s·Lk_s floats).
 *   lse optional: [H, total_q], contiguous; the backward needs it.
 * A query row of a sequence without keys gets 0 and lse -inf. Outputs that
 * share memory with an input or one another: ATTN_ERR_ALIAS, as for
 * attn_sdpa_forward. */
ATTN_API attn_status attn_sdpa_varlen_forward(
    const attn_tensor *q, const attn_tensor *k, const attn_tensor *v, int64_t batch,
    const int64_t *cu_seqlens_q, const int64_t *cu_seqlens_k, const attn_sdpa_params *p,
    attn_tensor *out, float *weights, float *lse, attn_sdpa_info *info, attn_error *err);

/* Gradients of attn_sdpa_varlen_forward from its out and lse; dq, dk, dv
 * (the shapes of q, k, v) are OVERWRITTEN. Same batch, lengths and p as the
 * forward; aliasing refused as in attn_sdpa_backward (ATTN_ERR_ALIAS). */
ATTN_API attn_status attn_sdpa_varlen_backward(
    const attn_tensor *q, const attn_tensor *k, const attn_tensor *v, const attn_tensor *out,
    const float *lse, const attn_tensor *grad_out, int64_t batch, const int64_t *cu_seqlens_q,
    const int64_t *cu_seqlens_k, const attn_sdpa_params *p, attn_tensor *dq, attn_tensor *dk,
    attn_tensor *dv, attn_sdpa_info *info, attn_error *err);

/* -------------------------------------------------- multi-head attention */

/* Layer shape. kdim/vdim: 0 means embed_dim. */
typedef struct {
    int64_t embed_dim; /* E, divisible by num_heads */
    int64_t num_heads; /* H; head size E / H */
    int64_t kdim, vdim;
    int bias; /* nonzero: b_q, b_k, b_v, b_o present */
    /* H_kv, grouped-query attention: key and value have H_kv heads of size
     * E / H, Ekv = H_kv·E/H wide (w_k [Ekv, kdim], w_v [Ekv, vdim], b_k,
     * b_v [Ekv]); query head h reads K/V head h / (H / H_kv) (PyTorch's
     * repeat_interleave); H_kv = 1 is multi-query attention. 1 <= H_kv <= H
     * and H % H_kv == 0, else ATTN_ERR_SHAPE from every call taking the
     * config. 0: num_heads (multi-head attention; Ekv = E). */
    int64_t num_kv_heads;
} attn_mha_config;

/* Parameters in torch.nn.MultiheadAttention's layout (y = x Wᵀ + b),
 * caller-owned. in_proj_weight [3E, E] is w_q, w_k, w_v stacked
 * ([E + 2·Ekv, E] with grouped-query attention). Ekv = num_kv_heads·E/H
 * (E when num_kv_heads is 0 or num_heads). */
typedef struct {
    float *w_q;                   /* [E, E]      */
    float *w_k;                   /* [Ekv, kdim] */
    float *w_v;                   /* [Ekv, vdim] */
    float *w_o;                   /* [E, E]      */
    float *b_q, *b_k, *b_v, *b_o; /* b_q, b_o [E], b_k, b_v [Ekv]; NULL when !bias */
} attn_mha_weights;

/* Number of floats all parameters take, packed in the order
 * w_q, w_k, w_v, b_q, b_k, b_v, w_o, b_o (PyTorch's in_proj then out_proj):
 * 2·E·E + Ekv·(kdim + vdim) (+ 2·E + 2·Ekv with bias). */
ATTN_API attn_status attn_mha_param_count(const attn_mha_config *c, size_t *count, attn_error *err);
/* Point w at a packed buffer of attn_mha_param_count floats in that order. */
ATTN_API attn_status attn_mha_weights_from_buffer(const attn_mha_config *c, float *buffer,
                                                  attn_mha_weights *w, attn_error *err);
/* PyTorch's init: Xavier-uniform in-projection (over the stacked
 * [E + 2·Ekv, E], PyTorch's [3E, E], when kdim == vdim == E, else each of
 * w_q, w_k, w_v), out-projection
 * U(-1/sqrt(E), 1/sqrt(E)), zero biases. Deterministic in seed. */
ATTN_API attn_status attn_mha_init(const attn_mha_config *c, const attn_mha_weights *w,
                                   uint64_t seed, attn_error *err);

/* Floats of activation cache the backward needs for a call of this shape:
 * B * (2*Lq*E + 2*Lk*Ekv + H*Lq), B times the count for one batch row (so a
 * caller may run batch rows in chunks, each at its row's offset). */
ATTN_API attn_status attn_mha_cache_size(const attn_mha_config *c, int64_t B, int64_t Lq,
                                         int64_t Lk, size_t *count, attn_error *err);

typedef enum {
    ATTN_WEIGHTS_NONE = 0,
    ATTN_WEIGHTS_PER_HEAD = 1, /* weights [B, H, Lq, Lk] */
    ATTN_WEIGHTS_AVERAGE = 2   /* weights [B, Lq, Lk], mean over heads */
} attn_weights_mode;

/* Batch-first multi-head attention (grouped-query with num_kv_heads < H:
 * the keys and values are projected to H_kv heads, Ekv wide, and the
 * scaled dot-product call reads them as K/V heads of the query heads'
 * groups; weights, masks, ALiBi slopes and sinks are per query head).
 *   query [B, Lq, E]   key [B, Lk, kdim]   value [B, Lk, vdim]  (contiguous;
 *   self-attention passes the same pointer three times)
 *   out   [B, Lq, E]
 *   p     masks, dropout and path as for attn_sdpa_forward (without
 *         use_scale the scale is 1/sqrt(E/H)); may be NULL for none.
 *   weights: see mode; NULL with ATTN_WEIGHTS_NONE.
 *   cache: NULL for inference, else attn_mha_cache_size floats that the
 *          backward reads. */
ATTN_API attn_status attn_mha_forward(const attn_mha_config *c, const attn_mha_weights *w,
                                      int64_t B, int64_t Lq, int64_t Lk, const float *query,
                                      const float *key, const float *value,
                                      const attn_sdpa_params *p, float *out, attn_weights_mode mode,
                                      float *weights, float *cache, attn_error *err);

/* Backward of attn_mha_forward from its cache. All gradients ACCUMULATE
 * (+=) into the caller's buffers, like PyTorch's .grad: zero them first.
 * Each gradient is computed whole and then added, so two calls give exactly
 * g + g (gradient accumulation does not depend on BLAS blocking).
 * Self-attention passes one d_x buffer as d_query, d_key and d_value and
 * gets the sum. Any of d_query, d_key, d_value may be NULL (not needed).
 * g has the layout of w (g->b_* NULL when !bias). */
ATTN_API attn_status attn_mha_backward(const attn_mha_config *c, const attn_mha_weights *w,
                                       int64_t B, int64_t Lq, int64_t Lk, const float *query,
                                       const float *key, const float *value,
                                       const attn_sdpa_params *p, const float *cache,
                                       const float *grad_out, float *d_query, float *d_key,
                                       float *d_value, const attn_mha_weights *g, attn_error *err);

/* ------------------------------------------- incremental decoding (KV cache) */

/* What a KV cache is sized for. */
typedef struct {
    int64_t batch;    /* sequences (rows) it holds */
    int64_t max_len;  /* positions each sequence can hold */
    int64_t max_step; /* positions one attn_mha_step may append per row (1 for
                       * token-by-token decoding; up to max_len for a prompt) */
    int threads;      /* the most threads a step may use (the step's scratch is
                       * sized for them); 0: attn_get_num_threads() now */
} attn_mha_kv_shape;

/* The keys and values of one self-attention layer for incremental decoding,
 * and the scratch its steps need, all in one caller-owned block of memory
 * (attn_mha_kv_bytes bytes; the library never allocates in a step).
 * Filled by attn_mha_kv_init; the caller reads len and may lower len[b]
 * (0: row b starts a new sequence, the others keep theirs). The other
 * fields are the library's. */
typedef struct {
    int64_t *len; /* [batch] positions held by each row, in [0, max_len] */
    float *k, *v; /* [batch, max_len, Ekv] each, Ekv = H_kv·E/H (E without
                       * grouped-query attention): position t of row b at
                       * (b * max_len + t) * Ekv, the packed [B, L, H_kv, E/H]
                       * layout */
    int64_t batch, max_len, max_step, embed_dim, num_heads;
    int threads;
    void *work; /* step scratch */
    size_t work_bytes;
    int64_t num_kv_heads; /* H_kv: k, v rows hold H_kv·E/H floats (see k, v) */
} attn_mha_kv;

/* Bytes of memory a KV cache of this shape takes for layer config c
 * (self-attention: kdim and vdim must be embed_dim). The keys and values,
 * 2·batch·max_len·Ekv floats, are most of it for long caches: H/H_kv
 * times fewer than multi-head attention's. */
ATTN_API attn_status attn_mha_kv_bytes(const attn_mha_config *c, const attn_mha_kv_shape *s,
                                       size_t *bytes, attn_error *err);
/* Lay out kv in mem (bytes >= attn_mha_kv_bytes for (c, s); any alignment)
 * with every row empty (len 0). */
ATTN_API attn_status attn_mha_kv_init(const attn_mha_config *c, const attn_mha_kv_shape *s,
                                      void *mem, size_t bytes, attn_mha_kv *kv, attn_error *err);

/* One incremental step of causal self-attention for rows 0..n-1 of kv:
 *   x   [n, Lq, E] the inputs at each row's next Lq positions
 *       (len[b] .. len[b] + Lq - 1; rows may be at different positions)
 *   out [n, Lq, E] the layer's output at those positions
 * Appends the positions' keys and values to the cache (len[b] += Lq) and
 * attends over all of row b's cached positions through the fused path (its
 * decode kernel for Lq <= 4). out equals attn_mha_forward's rows at those
 * positions for the whole prefix with p.causal = 1, up to fp32 rounding
 * (summation order). With w_q, w_k, w_v (and their biases) stacked as
 * attn_mha_weights_from_buffer lays them out, the three projections are one
 * product over [E + 2·Ekv, E].
 * p: may be NULL; scale (use_scale), soft-capping, ALiBi slopes, sinks,
 * impl and num_threads are used as in attn_mha_forward (an invalid cap,
 * slope or sink is ATTN_ERR_ARG with len unchanged). Masks, dropout and
 * p->causal are not taken (the cache lengths and causality are the step's
 * mask): a mask, a window or training with dropout_p > 0 is refused.
 * Errors, with nothing written:
 * a row whose len[b] + Lq exceeds max_len (the cache is full:
 * ATTN_ERR_STATE), n outside [1, batch] or Lq outside [1, max_step]
 * (ATTN_ERR_SHAPE), a config that does not match kv's (ATTN_ERR_SHAPE),
 * more threads than kv was sized for (ATTN_ERR_NOMEM). */
ATTN_API attn_status attn_mha_step(const attn_mha_config *c, const attn_mha_weights *w,
                                   attn_mha_kv *kv, int64_t n, int64_t Lq, const float *x,
                                   const attn_sdpa_params *p, float *out, attn_error *err);

#ifdef __cplusplus
}
#endif
#endif /* ATTN_H */
