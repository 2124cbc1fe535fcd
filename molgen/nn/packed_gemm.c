/* molgen's bf16 products and packed decode products (see packed_gemm.h).
 *
 * Layout: B (the weights, op(B) [K, N]) is cut into panels of NR = 32
 * output columns, the last padded with zeros. fp32 panel: [K][32] floats.
 * bf16 panel: [Kp / 2][32][2], a pair of consecutive k's per column (what
 * VDPBF16PS multiplies), Kp = K rounded up to even, the padding k zero.
 * A micro-kernel computes MR <= 8 rows x one panel: 2 x MR accumulators
 * of 16 lanes, one broadcast of A per row and k (a pair of k's in bf16). */
#include "nn/packed_gemm.h"

#include "attn.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define MG_X86 1
#endif
#include "amx_tiles.h"

#define NR 32
#define MR 8

const char *mg_dtype_name(mg_dtype dt) { return dt == MG_DT_BF16 ? "bf16" : "fp32"; }

int mg_dtype_parse(const char *s, mg_dtype *dt) {
    if (!s) return -1;
    if (!strcmp(s, "fp32")) *dt = MG_DT_F32;
    else if (!strcmp(s, "bf16")) *dt = MG_DT_BF16;
    else return -1;
    return 0;
}

/* ------------------------------------------------------------ dispatch */

static atomic_int g_forced; /* mg_gemm_force_portable */
/* bit 0: AVX-512F, bit 1: AVX512_BF16, bit 2: AVX2 and FMA (the C kernels'
 * FMA build: the portable bits, so forcing the portable kernels keeps it),
 * bit 3: AMX tiles (with AVX512_BF16; MOLGEN_GEMM_ISA=avx512bf16 clears
 * it); -1 not read yet. From libattn's table of the CPU (attn_cpu_features), so
 * the library and molgen dispatch on one reading of the CPU. */
static atomic_int g_isa = -1;

static int isa_bits(void) {
    int bits = atomic_load_explicit(&g_isa, memory_order_relaxed);
    if (bits < 0) {
        const unsigned f = attn_cpu_features();
        bits = ((f & ATTN_CPU_AVX512) ? 1 : 0) | ((f & ATTN_CPU_AVX512BF16) ? 2 : 0) |
               ((f & ATTN_CPU_AVX2_FMA) ? 4 : 0) |
               ((f & ATTN_CPU_AMX) && (f & ATTN_CPU_AVX512BF16) ? 8 : 0);
        const char *env = getenv("MOLGEN_GEMM_ISA");
        if (env && !strcmp(env, "portable")) bits &= 4;
        if (env && !strcmp(env, "avx512bf16")) bits &= ~8;
        /* the same value whichever thread stores it first */
        atomic_store_explicit(&g_isa, bits, memory_order_relaxed);
    }
    return atomic_load_explicit(&g_forced, memory_order_relaxed) ? bits & 4 : bits;
}

int mg_gemm_isa_f32(void) { return (isa_bits() & 1) != 0; }
int mg_gemm_isa_bf16(void) { return (isa_bits() & 2) != 0; }
void mg_gemm_force_portable(int on) { atomic_store(&g_forced, on != 0); }

static atomic_int g_amx; /* mg_gemm_allow_amx: 1 once permitted */
void mg_gemm_allow_amx(int on) { atomic_store(&g_amx, on && attn_enable_amx()); }
int mg_gemm_isa_amx(void) { return (isa_bits() & 8) && atomic_load(&g_amx); }
const char *mg_gemm_dtype_note(mg_dtype dt) {
    return dt == MG_DT_BF16 && !mg_gemm_isa_bf16()
               ? "this CPU has no AVX512_BF16: --dtype bf16 is emulated (fp32 arithmetic on bf16 "
                 "values) and runs slower than --dtype fp32 here"
               : NULL;
}

/* fp32 -> bf16, nearest, ties to even; NaN stays a (quiet) NaN. */
static inline uint16_t bf16_round(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    const uint32_t r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16, q = (u >> 16) | 0x40u;
    return (uint16_t)((u & 0x7fffffffu) > 0x7f800000u ? q : r); /* a select: vectorises */
}

static inline float bf16_float(uint16_t h) {
    const uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* The store of every kernel: c = acc (+ bias[j]) (+ cscale * c) over the
 * first nc columns; cscale 0 does not read c. */
static inline void store_row_scalar(float *c, const float *acc, int nc, const float *bias,
                                    float cscale) {
    for (int j = 0; j < nc; j++) {
        float v = acc[j];
        if (bias) v = v + bias[j];
        if (cscale != 0.0f) v = v + cscale * c[j];
        c[j] = v;
    }
}

/* ------------------------------------------------------ portable kernels */

/* The C kernels are compiled twice on x86-64: plain (software fmaf on a
 * CPU without FMA) and with target("avx2,fma") (kern_*_fma, picked when
 * the CPU has both: every AVX2 CPU without AVX-512, Zen 3 among them), the
 * same bits either way (fmaf is exact). GCC's target_clones("arch=haswell")
 * did this before, but its dispatcher tests the CPU model, not features:
 * AMD CPUs got the software fmaf, 65x slower (sampling 5.9 against 385
 * molecules/s). */
#define C_KERNEL static inline __attribute__((always_inline))

/* mr rows of fp32 A (row stride lda) x one fp32 panel over K k's. */
C_KERNEL void kern_f32_c(int mr, const float *a, int64_t lda, const float *b, int64_t K, float *c,
                         int64_t ldc, int nc, const float *bias, float cscale) {
    float acc[MR][NR];
    memset(acc, 0, sizeof acc);
    for (int64_t k = 0; k < K; k++) {
        const float *bk = b + k * NR;
        for (int i = 0; i < mr; i++) {
            const float ai = a[i * lda + k];
            for (int j = 0; j < NR; j++) acc[i][j] = __builtin_fmaf(ai, bk[j], acc[i][j]);
        }
    }
    for (int i = 0; i < mr; i++) store_row_scalar(c + i * ldc, acc[i], nc, bias, cscale);
}

/* mr rows of bf16 A (pairs, row stride lda in uint16) x one bf16 panel
 * over kp pairs: VDPBF16PS's arithmetic (odd k of the pair first). */
C_KERNEL void kern_bf16_c(int mr, const uint16_t *a, int64_t lda, const uint16_t *b, int64_t kp,
                          float *c, int64_t ldc, int nc, const float *bias, float cscale) {
    float acc[MR][NR];
    memset(acc, 0, sizeof acc);
    for (int64_t k = 0; k < kp; k++) {
        const uint16_t *bk = b + k * 2 * NR;
        float b0[NR], b1[NR];
        for (int j = 0; j < NR; j++) {
            b0[j] = bf16_float(bk[2 * j]);
            b1[j] = bf16_float(bk[2 * j + 1]);
        }
        for (int i = 0; i < mr; i++) {
            const float a0 = bf16_float(a[i * lda + 2 * k]), a1 = bf16_float(a[i * lda + 2 * k + 1]);
            for (int j = 0; j < NR; j++) {
                acc[i][j] = __builtin_fmaf(a1, b1[j], acc[i][j]);
                acc[i][j] = __builtin_fmaf(a0, b0[j], acc[i][j]);
            }
        }
    }
    for (int i = 0; i < mr; i++) store_row_scalar(c + i * ldc, acc[i], nc, bias, cscale);
}

#define C_KERNEL_ARGS_F32                                                                          \
    int mr, const float *a, int64_t lda, const float *b, int64_t K, float *c, int64_t ldc, int nc, \
        const float *bias, float cscale
#define C_KERNEL_ARGS_BF16                                                                         \
    int mr, const uint16_t *a, int64_t lda, const uint16_t *b, int64_t kp, float *c, int64_t ldc,  \
        int nc, const float *bias, float cscale
static void kern_f32_portable(C_KERNEL_ARGS_F32) { kern_f32_c(mr, a, lda, b, K, c, ldc, nc, bias, cscale); }
static void kern_bf16_portable(C_KERNEL_ARGS_BF16) {
    kern_bf16_c(mr, a, lda, b, kp, c, ldc, nc, bias, cscale);
}
#ifdef MG_X86
__attribute__((target("avx2,fma"))) static void kern_f32_fma(C_KERNEL_ARGS_F32) {
    kern_f32_c(mr, a, lda, b, K, c, ldc, nc, bias, cscale);
}
__attribute__((target("avx2,fma"))) static void kern_bf16_fma(C_KERNEL_ARGS_BF16) {
    kern_bf16_c(mr, a, lda, b, kp, c, ldc, nc, bias, cscale);
}
#endif

/* ------------------------------------------------------- AVX-512 kernels */

#ifdef MG_X86
#define AVX512 __attribute__((target("avx512f")))
#define AVX512BF16 __attribute__((target("avx512f,avx512bf16")))

static inline __mmask16 lane_mask(int n) { /* the first n (0..16) lanes */
    return n >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n > 0 ? n : 0)) - 1u);
}

#define STORE_ROW(c, acc0, acc1)                                                                   \
    do {                                                                                           \
        __m512 v0 = acc0, v1 = acc1;                                                               \
        if (bias) {                                                                                \
            v0 = _mm512_add_ps(v0, _mm512_maskz_loadu_ps(m0, bias));                               \
            v1 = _mm512_add_ps(v1, _mm512_maskz_loadu_ps(m1, bias + 16));                          \
        }                                                                                          \
        if (cscale != 0.0f) {                                                                      \
            const __m512 s = _mm512_set1_ps(cscale);                                               \
            v0 = _mm512_add_ps(v0, _mm512_mul_ps(s, _mm512_maskz_loadu_ps(m0, c)));                \
            v1 = _mm512_add_ps(v1, _mm512_mul_ps(s, _mm512_maskz_loadu_ps(m1, c + 16)));           \
        }                                                                                          \
        _mm512_mask_storeu_ps(c, m0, v0);                                                          \
        _mm512_mask_storeu_ps(c + 16, m1, v1);                                                     \
    } while (0)

static inline __attribute__((always_inline)) AVX512 void
kern_f32_body(const int mr, const float *a, int64_t lda, const float *b, int64_t K, float *c,
              int64_t ldc, int nc, const float *bias, float cscale) {
    __m512 acc[MR][2];
    for (int i = 0; i < mr; i++) acc[i][0] = acc[i][1] = _mm512_setzero_ps();
    for (int64_t k = 0; k < K; k++) {
        const __m512 b0 = _mm512_loadu_ps(b + k * NR), b1 = _mm512_loadu_ps(b + k * NR + 16);
        for (int i = 0; i < mr; i++) {
            const __m512 ai = _mm512_set1_ps(a[i * lda + k]);
            acc[i][0] = _mm512_fmadd_ps(ai, b0, acc[i][0]);
            acc[i][1] = _mm512_fmadd_ps(ai, b1, acc[i][1]);
        }
    }
    const __mmask16 m0 = lane_mask(nc), m1 = lane_mask(nc - 16);
    for (int i = 0; i < mr; i++) STORE_ROW(c + i * ldc, acc[i][0], acc[i][1]);
}

static inline __attribute__((always_inline)) AVX512BF16 void
kern_bf16_body(const int mr, const uint16_t *a, int64_t lda, const uint16_t *b, int64_t kp,
               float *c, int64_t ldc, int nc, const float *bias, float cscale) {
    __m512 acc[MR][2];
    for (int i = 0; i < mr; i++) acc[i][0] = acc[i][1] = _mm512_setzero_ps();
    for (int64_t k = 0; k < kp; k++) {
        const __m512bh b0 = (__m512bh)_mm512_loadu_si512(b + k * 2 * NR);
        const __m512bh b1 = (__m512bh)_mm512_loadu_si512(b + k * 2 * NR + NR);
        for (int i = 0; i < mr; i++) {
            uint32_t pair;
            memcpy(&pair, a + i * lda + 2 * k, sizeof pair);
            const __m512bh ai = (__m512bh)_mm512_set1_epi32((int)pair);
            acc[i][0] = _mm512_dpbf16_ps(acc[i][0], ai, b0);
            acc[i][1] = _mm512_dpbf16_ps(acc[i][1], ai, b1);
        }
    }
    const __mmask16 m0 = lane_mask(nc), m1 = lane_mask(nc - 16);
    for (int i = 0; i < mr; i++) STORE_ROW(c + i * ldc, acc[i][0], acc[i][1]);
}

/* One copy per row count, so each keeps its accumulators in registers. */
#define KERNELS(R)                                                                                 \
    AVX512 static void kf32_##R(const float *a, int64_t lda, const float *b, int64_t K, float *c,  \
                                int64_t ldc, int nc, const float *bias, float cscale) {            \
        kern_f32_body(R, a, lda, b, K, c, ldc, nc, bias, cscale);                                  \
    }                                                                                              \
    AVX512BF16 static void kbf16_##R(const uint16_t *a, int64_t lda, const uint16_t *b,            \
                                     int64_t kp, float *c, int64_t ldc, int nc, const float *bias, \
                                     float cscale) {                                               \
        kern_bf16_body(R, a, lda, b, kp, c, ldc, nc, bias, cscale);                                \
    }
KERNELS(1)
KERNELS(2)
KERNELS(3)
KERNELS(4)
KERNELS(5)
KERNELS(6)
KERNELS(7)
KERNELS(8)
#undef KERNELS

typedef void (*kf32_fn)(const float *, int64_t, const float *, int64_t, float *, int64_t, int,
                        const float *, float);
typedef void (*kbf16_fn)(const uint16_t *, int64_t, const uint16_t *, int64_t, float *, int64_t,
                         int, const float *, float);
static const kf32_fn kf32[MR + 1] = {NULL, kf32_1, kf32_2, kf32_3, kf32_4,
                                     kf32_5, kf32_6, kf32_7, kf32_8};
static const kbf16_fn kbf16[MR + 1] = {NULL,     kbf16_1, kbf16_2, kbf16_3, kbf16_4,
                                       kbf16_5, kbf16_6, kbf16_7, kbf16_8};

/* 16 rows x one panel over kn pairs on AMX tiles (common/amx_tiles.h):
 * the first kn / 16 * 16 pairs as two 16 x 16 accumulator tiles (A's 16
 * rows of 16 pairs in tile 2, the panel's two halves of 16 columns in
 * tiles 3 and 4: its rows of 32 pairs are 128 bytes apart), stored as
 * the vector kernels store; the pairs left over by the vector kernel onto
 * them. The caller's thread has loaded the tile configuration. */
AVX512BF16 static void kern_bf16_amx16(const uint16_t *a, int64_t lda, const uint16_t *b,
                                       int64_t kn, float *c, int64_t ldc, int nc, const float *bias,
                                       float cscale) {
    const int64_t kn16 = kn / 16 * 16;
    if (kn16 > 0) {
        float acc[16][NR] __attribute__((aligned(64)));
        AMX_ZERO(0);
        AMX_ZERO(1);
        for (int64_t k = 0; k < kn16; k += 16) {
            AMX_LOAD(2, a + 2 * k, lda * 2);
            AMX_LOAD(3, b + k * 2 * NR, 4 * NR);
            AMX_LOAD(4, b + k * 2 * NR + NR, 4 * NR);
            AMX_DP(0, 2, 3);
            AMX_DP(1, 2, 4);
        }
        AMX_STORE(0, &acc[0][0], NR * 4);
        AMX_STORE(1, &acc[0][16], NR * 4);
        const __mmask16 m0 = lane_mask(nc), m1 = lane_mask(nc - 16);
        for (int i = 0; i < 16; i++)
            STORE_ROW(c + i * ldc, _mm512_load_ps(acc[i]), _mm512_load_ps(acc[i] + 16));
        cscale = 1.0f, bias = NULL; /* the rest adds onto the stored sums */
    }
    if (kn16 < kn)
        for (int h = 0; h < 2; h++)
            kbf16[MR](a + h * MR * lda + 2 * kn16, lda, b + kn16 * 2 * NR, kn - kn16,
                      c + h * MR * ldc, ldc, nc, bias, cscale);
}
#endif

static void kern_f32(int isa, int mr, const float *a, int64_t lda, const float *b, int64_t K,
                     float *c, int64_t ldc, int nc, const float *bias, float cscale) {
#ifdef MG_X86
    if (isa) {
        kf32[mr](a, lda, b, K, c, ldc, nc, bias, cscale);
        return;
    }
#endif
    (void)isa;
#ifdef MG_X86
    if (isa_bits() & 4) {
        kern_f32_fma(mr, a, lda, b, K, c, ldc, nc, bias, cscale);
        return;
    }
#endif
    kern_f32_portable(mr, a, lda, b, K, c, ldc, nc, bias, cscale);
}

static void kern_bf16(int isa, int mr, const uint16_t *a, int64_t lda, const uint16_t *b,
                      int64_t kp, float *c, int64_t ldc, int nc, const float *bias, float cscale) {
#ifdef MG_X86
    if (isa) {
        kbf16[mr](a, lda, b, kp, c, ldc, nc, bias, cscale);
        return;
    }
#endif
    (void)isa;
#ifdef MG_X86
    if (isa_bits() & 4) {
        kern_bf16_fma(mr, a, lda, b, kp, c, ldc, nc, bias, cscale);
        return;
    }
#endif
    kern_bf16_portable(mr, a, lda, b, kp, c, ldc, nc, bias, cscale);
}

/* ---------------------------------------------------------------- packing */

static void thread_range(int64_t n, int64_t *lo, int64_t *hi) {
    int nth = 1, id = 0;
#ifdef _OPENMP
    nth = omp_get_num_threads();
    id = omp_get_thread_num();
#endif
    *lo = n * id / nth;
    *hi = n * (id + 1) / nth;
}

#ifdef MG_X86
/* AVX-512 packers: the same bits as the C loops below (bf16_round's
 * integer rounding, not VCVTNEPS2BF16, which flushes denormals), 16 lanes
 * at a time; transposed operands go through 16 x 16 transposes of 32-bit
 * words (a pair of bf16 per word). Measured (molgen bench, default model,
 * bf16, 2 threads): the C packers were 26 % of a training step. */

/* bf16_round of 16 floats, each in the low half of its 32-bit lane. */
static inline __attribute__((always_inline)) AVX512 __m512i round_lanes(__m512 x) {
    const __m512i u = _mm512_castps_si512(x), hi = _mm512_srli_epi32(u, 16);
    const __m512i lsb = _mm512_and_si512(hi, _mm512_set1_epi32(1));
    const __m512i r = _mm512_srli_epi32(
        _mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), lsb), 16);
    const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)),
                                                  _mm512_set1_epi32(0x7f800000));
    return _mm512_mask_or_epi32(r, nan, hi, _mm512_set1_epi32(0x40));
}

/* Pairs of bf16: lane l = bf16(x0[l]) | bf16(x1[l]) << 16. */
static inline __attribute__((always_inline)) AVX512 __m512i pair_lanes(__m512 x0, __m512 x1) {
    return _mm512_or_si512(round_lanes(x0), _mm512_slli_epi32(round_lanes(x1), 16));
}

/* p[r] lane c -> p[c] lane r, 32-bit words. */
static inline __attribute__((always_inline)) AVX512 void transpose16(__m512i p[16]) {
    __m512i t[16], u[16];
    for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_epi32(p[2 * i], p[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_epi32(p[2 * i], p[2 * i + 1]);
    }
    for (int i = 0; i < 4; i++) { /* u[4i + j], 128-bit lane L: column 4L + j, rows 4i.. */
        u[4 * i] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
        u[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
        u[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
        u[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
    }
    for (int j = 0; j < 4; j++) {
        const __m512i v0 = _mm512_shuffle_i32x4(u[j], u[4 + j], 0x44);
        const __m512i v1 = _mm512_shuffle_i32x4(u[j], u[4 + j], 0xee);
        const __m512i w0 = _mm512_shuffle_i32x4(u[8 + j], u[12 + j], 0x44);
        const __m512i w1 = _mm512_shuffle_i32x4(u[8 + j], u[12 + j], 0xee);
        p[j] = _mm512_shuffle_i32x4(v0, w0, 0x88);
        p[4 + j] = _mm512_shuffle_i32x4(v0, w0, 0xdd);
        p[8 + j] = _mm512_shuffle_i32x4(v1, w1, 0x88);
        p[12 + j] = _mm512_shuffle_i32x4(v1, w1, 0xdd);
    }
}

/* pack_a_bf16 on AVX-512. */
AVX512 static void pack_a_avx512(int ta, const float *A, int64_t lda, int64_t K, int64_t kp2,
                                 int64_t r0, int64_t r1, uint16_t *out) {
    if (!ta) {
        for (int64_t m = r0; m < r1; m++) {
            const float *src = A + m * lda;
            uint16_t *dst = out + (m - r0) * kp2;
            for (int64_t k = 0; k < kp2; k += 16) { /* zeros past K (kp2 - K <= 1) */
                if (m + 4 < r1) _mm_prefetch((const char *)(src + 4 * lda + k), _MM_HINT_T0);
                const __mmask16 ld = lane_mask((int)(K - k < 16 ? K - k : 16));
                _mm512_mask_cvtepi32_storeu_epi16(dst + k, lane_mask((int)(kp2 - k < 16 ? kp2 - k : 16)),
                                                  round_lanes(_mm512_maskz_loadu_ps(ld, src + k)));
            }
        }
        return;
    }
    /* element (m, k) at A[k * lda + m]: 16 m's x 16 pairs of k per block */
    const int64_t kp = kp2 / 2;
    for (int64_t t0 = 0; t0 < kp; t0 += 16) {
        const int nt = (int)(kp - t0 < 16 ? kp - t0 : 16);
        for (int64_t m0 = r0; m0 < r1; m0 += 16) {
            const int nm = (int)(r1 - m0 < 16 ? r1 - m0 : 16);
            const __mmask16 lm = lane_mask(nm);
            __m512i p[16];
            for (int t = 0; t < 16; t++) {
                const int64_t k = 2 * (t0 + t);
                if (k + 33 < K) { /* the next block's rows, these m's */
                    _mm_prefetch((const char *)(A + (k + 32) * lda + m0), _MM_HINT_T0);
                    _mm_prefetch((const char *)(A + (k + 33) * lda + m0), _MM_HINT_T0);
                }
                const __m512 x0 = k < K ? _mm512_maskz_loadu_ps(lm, A + k * lda + m0)
                                        : _mm512_setzero_ps();
                const __m512 x1 = k + 1 < K ? _mm512_maskz_loadu_ps(lm, A + (k + 1) * lda + m0)
                                            : _mm512_setzero_ps();
                p[t] = pair_lanes(x0, x1);
            }
            transpose16(p);
            for (int m = 0; m < nm; m++)
                _mm512_mask_storeu_epi32(out + (m0 - r0 + m) * kp2 + 2 * t0, lane_mask(nt), p[m]);
        }
    }
}

/* pack_b_bf16 on AVX-512: every word of each panel written (zeros past K
 * and N). */
AVX512 static void pack_b_avx512(int tb, const float *B, int64_t ldb, int64_t K, int64_t N,
                                 int64_t kp, int64_t p0, int64_t p1, uint16_t *out) {
    if (!tb) {
        /* rows 2t and 2t + 1 of B give row t of every panel: rows outer, so
         * B is read in row order (panel by panel, each panel's 128 bytes of
         * a row came from L3 or memory once per panel: 6 % of a bf16 step
         * stalled on those loads, molgen bench's dW products) */
        for (int64_t t = 0; t < kp; t++) {
            const float *s0 = B + 2 * t * ldb, *s1 = s0 + ldb;
            const int two = 2 * t + 1 < K;
            if (2 * t + 9 < K) /* the pair 4 ahead, this thread's columns */
                for (int64_t n = p0 * NR; n < p1 * NR && n < N; n += 16) {
                    _mm_prefetch((const char *)(s0 + 8 * ldb + n), _MM_HINT_T0);
                    _mm_prefetch((const char *)(s1 + 8 * ldb + n), _MM_HINT_T0);
                }
            for (int64_t p = p0; p < p1; p++) {
                uint16_t *dst = out + (p * kp + t) * 2 * NR; /* word j at dst + 2 j */
                const int64_t n0 = p * NR;
                const int nc = (int)(N - n0 < NR ? N - n0 : NR);
                for (int j = 0; j < NR; j += 16) {
                    const __mmask16 lm = lane_mask(nc - j);
                    const __m512 x0 = _mm512_maskz_loadu_ps(lm, s0 + n0 + j);
                    const __m512 x1 =
                        two ? _mm512_maskz_loadu_ps(lm, s1 + n0 + j) : _mm512_setzero_ps();
                    _mm512_storeu_si512(dst + 2 * j, pair_lanes(x0, x1));
                }
            }
        }
        return;
    }
    for (int64_t p = p0; p < p1; p++) {
        uint16_t *dst = out + p * kp * 2 * NR; /* word (t, j) at dst + 2 (t NR + j) */
        const int64_t n0 = p * NR;
        const int nc = (int)(N - n0 < NR ? N - n0 : NR);
        /* column j's k's are row n0 + j of B: 16 columns x 16 pairs per block */
        for (int64_t t0 = 0; t0 < kp; t0 += 16) {
            const int64_t k0 = 2 * t0;
            const int nt = (int)(kp - t0 < 16 ? kp - t0 : 16);
            const __mmask16 l0 = lane_mask((int)(K - k0 < 16 ? K - k0 : 16));
            const __mmask16 l1 = lane_mask((int)(K - k0 - 16 < 16 ? K - k0 - 16 : 16));
            for (int j0 = 0; j0 < NR; j0 += 16) {
                __m512i q[16];
                for (int j = 0; j < 16; j++) {
                    if (j0 + j >= nc) {
                        q[j] = _mm512_setzero_si512();
                        continue;
                    }
                    const float *src = B + (n0 + j0 + j) * ldb + k0;
                    const __m256i a = _mm512_cvtepi32_epi16(round_lanes(_mm512_maskz_loadu_ps(l0, src)));
                    const __m256i b =
                        _mm512_cvtepi32_epi16(round_lanes(_mm512_maskz_loadu_ps(l1, src + 16)));
                    q[j] = _mm512_inserti64x4(_mm512_castsi256_si512(a), b, 1);
                }
                transpose16(q);
                for (int t = 0; t < nt; t++)
                    _mm512_storeu_si512(dst + 2 * ((t0 + t) * NR + j0), q[t]);
            }
        }
    }
}
#endif

/* Panels [p0, p1) of op(B) [K, N] (element (k, n) at B[n * ldb + k] with tb,
 * B[k * ldb + n] without) in bf16 pairs: panel p at out + p * kp * 2 * NR. */
static void pack_b_bf16(int tb, const float *B, int64_t ldb, int64_t K, int64_t N, int64_t kp,
                        int64_t p0, int64_t p1, uint16_t *out) {
#ifdef MG_X86
    if (isa_bits() & 1) {
        pack_b_avx512(tb, B, ldb, K, N, kp, p0, p1, out);
        return;
    }
#endif
    for (int64_t p = p0; p < p1; p++) {
        uint16_t *dst = out + p * kp * 2 * NR;
        const int64_t n0 = p * NR, nc = N - n0 < NR ? N - n0 : NR;
        if (nc < NR || 2 * kp != K) memset(dst, 0, (size_t)kp * 2 * NR * sizeof(uint16_t));
        if (tb) /* column j's k's are a row of B */
            for (int64_t j = 0; j < nc; j++) {
                const float *src = B + (n0 + j) * ldb;
                for (int64_t k = 0; k < K; k++) dst[(k >> 1) * 2 * NR + 2 * j + (k & 1)] = bf16_round(src[k]);
            }
        else /* row k of B holds every column's k */
            for (int64_t k = 0; k < K; k++) {
                const float *src = B + k * ldb + n0;
                uint16_t *d = dst + (k >> 1) * 2 * NR + (k & 1);
                for (int64_t j = 0; j < nc; j++) d[2 * j] = bf16_round(src[j]);
            }
    }
}

/* Rows [r0, r1) of op(A) [M, K] (element (m, k) at A[k * lda + m] with ta)
 * in bf16, row stride kp2 = 2 kp (the padding k zero); row r0 at out. */
static void pack_a_bf16(int ta, const float *A, int64_t lda, int64_t K, int64_t kp2, int64_t r0,
                        int64_t r1, uint16_t *out) {
#ifdef MG_X86
    if (isa_bits() & 1) {
        pack_a_avx512(ta, A, lda, K, kp2, r0, r1, out);
        return;
    }
#endif
    if (ta) /* blocks of 64 k's: the 64 source rows stay in L1 across the m's */
        for (int64_t k0 = 0; k0 < K; k0 += 64) {
            const int64_t k1 = k0 + 64 < K ? k0 + 64 : K;
            for (int64_t m = r0; m < r1; m++)
                for (int64_t k = k0; k < k1; k++)
                    out[(m - r0) * kp2 + k] = bf16_round(A[k * lda + m]);
        }
    for (int64_t m = r0; m < r1; m++) {
        uint16_t *dst = out + (m - r0) * kp2;
        if (!ta)
            for (int64_t k = 0; k < K; k++) dst[k] = bf16_round(A[m * lda + k]);
        for (int64_t k = K; k < kp2; k++) dst[k] = 0;
    }
}

/* ----------------------------------------------------------- mg_gemm_bf16 */

/* mg_gemm_bf16's packing buffers, kept between calls: a malloc and free of
 * them per call let glibc give the heap's top back to the system and fault
 * it in again on the next call (when A's and B's buffers were of a size,
 * as in the dW products of d-wide layers: 5x slower, the time in page
 * faults). SCRATCH_SLOTS callers at a time take a slot each (more than
 * that malloc their own); a slot grows and stays until the process ends
 * (not freed by a destructor: a thread of the embedding program could still
 * be using it; it stays reachable, so leak checkers do not report it). */
#define SCRATCH_SLOTS 4
static struct {
    atomic_flag busy;
    void *p;
    size_t n;
} g_scratch[SCRATCH_SLOTS] = {{ATOMIC_FLAG_INIT, NULL, 0}, {ATOMIC_FLAG_INIT, NULL, 0},
                              {ATOMIC_FLAG_INIT, NULL, 0}, {ATOMIC_FLAG_INIT, NULL, 0}};

/* n bytes (64-aligned) and the slot holding them (-1: the caller's own). */
static void *scratch_take(size_t n, int *slot) {
    n = (n + 63) / 64 * 64;
    for (int i = 0; i < SCRATCH_SLOTS; i++) {
        if (atomic_flag_test_and_set_explicit(&g_scratch[i].busy, memory_order_acquire))
            continue;
        if (g_scratch[i].n < n) {
            free(g_scratch[i].p);
            g_scratch[i].n = 0;
            if (!(g_scratch[i].p = aligned_alloc(64, n))) {
                atomic_flag_clear_explicit(&g_scratch[i].busy, memory_order_release);
                return NULL;
            }
            g_scratch[i].n = n;
        }
        *slot = i;
        return g_scratch[i].p;
    }
    *slot = -1;
    return aligned_alloc(64, n);
}

static void scratch_give(void *p, int slot) {
    if (slot < 0) free(p);
    else atomic_flag_clear_explicit(&g_scratch[slot].busy, memory_order_release);
}

/* The calling thread's AMX tile configuration loaded (on; the thread's
 * own kept in *saved) or put back (common/amx_tiles.h). */
static void tiles(int amx, int on, amx_tile_config *saved) {
#ifdef MG_X86
    if (amx && on) amx_tiles_enter(saved);
    if (amx && !on) amx_tiles_leave(saved);
#else
    (void)amx, (void)on, (void)saved;
#endif
}

/* This thread's row blocks [*rb0, *rb1) of row_blocks; with amx, whole
 * pairs (2g, 2g + 1), so that which rows go through the tiles does not
 * depend on the thread count. */
static void thread_row_blocks(int64_t row_blocks, int amx, int64_t *rb0, int64_t *rb1) {
    if (!amx) {
        thread_range(row_blocks, rb0, rb1);
        return;
    }
    thread_range((row_blocks + 1) / 2, rb0, rb1);
    *rb0 *= 2;
    *rb1 = 2 * *rb1 < row_blocks ? 2 * *rb1 : row_blocks;
}

/* C's row blocks [cb, ce) (row cb·MR at a and c) x one panel (nc
 * columns, kn pairs at bp): c = A·B (+ bias) (+ cs·c). With amx, blocks
 * 2g and 2g + 1 of whole rows (both in [cb, ce), which starts even) go
 * through the tiles together. */
static void row_blocks_bf16(int isa, int amx, int64_t cb, int64_t ce, int64_t M,
                            const uint16_t *a, int64_t lda, const uint16_t *bp, int64_t kn,
                            float *c, int64_t ldc, int nc, const float *bias, float cs) {
    for (int64_t rb = cb; rb < ce; rb++) {
        const int64_t r = rb * MR, i = (rb - cb) * MR; /* C's row; the row in a and c */
#ifdef MG_X86
        if (amx && rb % 2 == 0 && rb + 1 < ce && r + 2 * MR <= M) {
            kern_bf16_amx16(a + i * lda, lda, bp, kn, c + i * ldc, ldc, nc, bias, cs);
            rb++;
            continue;
        }
#endif
        kern_bf16(isa, (int)(M - r < MR ? M - r : MR), a + i * lda, lda, bp, kn, c + i * ldc, ldc,
                  nc, bias, cs);
    }
}

mg_status mg_gemm_bf16(int ta, int tb, int64_t M, int64_t N, int64_t K, const float *A,
                       int64_t lda, const float *B, int64_t ldb, float beta, float *C, int64_t ldc,
                       int nt, mg_error *err) {
    if (!A || !B || !C) return mg_fail(err, MG_ERR_ARG, "gemm_bf16: A, B and C must be non-NULL");
    if (M < 1 || N < 1 || K < 1)
        return mg_fail(err, MG_ERR_ARG, "gemm_bf16: M %lld, N %lld, K %lld must all be >= 1",
                       (long long)M, (long long)N, (long long)K);
    if (lda < (ta ? M : K) || ldb < (tb ? K : N) || ldc < N)
        return mg_fail(err, MG_ERR_ARG, "gemm_bf16: a leading dimension is below its row");
    const int64_t kp = (K + 1) / 2, np = (N + NR - 1) / NR;
    const int nth = nt > 0 ? nt : 1;
    /* MR-row blocks; chunk of them reuse each panel from L1 */
    const int64_t row_blocks = (M + MR - 1) / MR, chunk = 8;
    /* rows split when there are enough row blocks; else column panels */
    const int split_rows = row_blocks >= 4 * nth || np < 2;
    /* A in bf16: split rows, each thread packs a chunk of its rows just
     * before it multiplies them, into its own buffer of chunk MR rows that
     * stays in L2 (all of A packed first was written to memory and read
     * back: 7 % of a bf16 step); split panels, every thread reads all of A,
     * packed once before the products. */
    const int64_t own_rows = MR * (row_blocks < chunk ? row_blocks : chunk); /* a thread's */
    const int64_t pa_rows = split_rows ? nth * own_rows : M;
    const size_t pb_bytes = ((size_t)np * (size_t)kp * 2 * NR * sizeof(uint16_t) + 63) / 64 * 64;
    const size_t pa_bytes = (size_t)pa_rows * (size_t)(2 * kp) * sizeof(uint16_t);
    int slot;
    uint16_t *pb = scratch_take(pb_bytes + pa_bytes, &slot);
    if (!pb)
        return mg_fail(err, MG_ERR_NOMEM, "gemm_bf16: out of memory for %lld x %lld x %lld",
                       (long long)M, (long long)N, (long long)K);
    uint16_t *pa = pb + pb_bytes / sizeof(uint16_t); /* after B's panels */
    const int isa = mg_gemm_isa_bf16(), amx = mg_gemm_isa_amx() && M >= 2 * MR;
    const int64_t kcp = MG_GEMM_KC / 2; /* pairs per accumulation block */
#pragma omp parallel num_threads(nth)
    {
        int64_t lo, hi;
        int tid = 0;
#ifdef _OPENMP
        tid = omp_get_thread_num();
#endif
        amx_tile_config ts;
        tiles(amx, 1, &ts);
        if (!split_rows) {
            thread_range(M, &lo, &hi);
            pack_a_bf16(ta, A, lda, K, 2 * kp, lo, hi, pa + lo * 2 * kp);
        }
        thread_range(np, &lo, &hi);
        pack_b_bf16(tb, B, ldb, K, N, kp, lo, hi, pb);
#pragma omp barrier
        int64_t rb0 = 0, rb1 = row_blocks, p0 = 0, p1 = np;
        if (split_rows) thread_row_blocks(row_blocks, amx, &rb0, &rb1);
        else thread_range(np, &p0, &p1);
        uint16_t *own_a = split_rows ? pa + tid * own_rows * 2 * kp : NULL; /* this thread's */
        for (int64_t cb = rb0; cb < rb1; cb += chunk) {
            const int64_t ce = cb + chunk < rb1 ? cb + chunk : rb1;
            /* row r of op(A) in bf16 at a_rows + (r - a_r0) 2 kp */
            const uint16_t *a_rows = pa;
            int64_t a_r0 = 0;
            if (split_rows) {
                a_r0 = cb * MR;
                pack_a_bf16(ta, A, lda, K, 2 * kp, a_r0, ce * MR < M ? ce * MR : M, own_a);
                a_rows = own_a;
            }
            for (int64_t k0 = 0; k0 < kp; k0 += kcp) {
                const int64_t kn = kp - k0 < kcp ? kp - k0 : kcp;
                const float cs = k0 == 0 ? beta : 1.0f;
                for (int64_t p = p0; p < p1; p++) {
                    const int64_t n0 = p * NR;
                    const int nc = (int)(N - n0 < NR ? N - n0 : NR);
                    const uint16_t *bp = pb + (p * kp + k0) * 2 * NR;
                    row_blocks_bf16(isa, amx, cb, ce, M, a_rows + (cb * MR - a_r0) * 2 * kp + 2 * k0,
                                    2 * kp, bp, kn, C + cb * MR * ldc + n0, ldc, nc, NULL, cs);
                }
            }
        }
        tiles(amx, 0, &ts);
    }
    scratch_give(pb, slot);
    return MG_OK;
}

/* ------------------------------------------------------------- mg_packed */

struct mg_packed {
    mg_dtype dt;
    int N, K;
    int64_t kp, np; /* bf16: pairs; panels */
    void *w;        /* the panels */
    uint16_t *xa;   /* bf16: rows of X, grown on demand (one caller at a time) */
    int64_t xa_rows;
};

mg_status mg_packed_new(const float *W, int N, int K, mg_dtype dt, mg_packed **out,
                        mg_error *err) {
    if (!W || !out) return mg_fail(err, MG_ERR_ARG, "packed: W and out must be non-NULL");
    *out = NULL;
    if (N < 1 || K < 1) return mg_fail(err, MG_ERR_ARG, "packed: N %d and K %d must be >= 1", N, K);
    mg_packed *p = calloc(1, sizeof *p);
    if (!p) return mg_fail(err, MG_ERR_NOMEM, "packed: out of memory");
    p->dt = dt;
    p->N = N;
    p->K = K;
    p->np = (N + NR - 1) / NR;
    p->kp = (K + 1) / 2;
    const size_t n = dt == MG_DT_BF16 ? (size_t)p->np * (size_t)p->kp * 2 * NR * sizeof(uint16_t)
                                      : (size_t)p->np * (size_t)K * NR * sizeof(float);
    if (!(p->w = aligned_alloc(64, (n + 63) / 64 * 64))) {
        free(p);
        return mg_fail(err, MG_ERR_NOMEM, "packed: out of memory for [%d, %d]", N, K);
    }
    if (dt == MG_DT_BF16) {
        pack_b_bf16(1, W, K, K, N, p->kp, 0, p->np, p->w);
    } else {
        float *dst = p->w;
        for (int64_t q = 0; q < p->np; q++)
            for (int64_t k = 0; k < K; k++)
                for (int j = 0; j < NR; j++) {
                    const int64_t n0 = q * NR + j;
                    dst[(q * K + k) * NR + j] = n0 < N ? W[n0 * K + k] : 0.0f;
                }
    }
    *out = p;
    return MG_OK;
}

void mg_packed_free(mg_packed *p) {
    if (!p) return;
    free(p->w);
    free(p->xa);
    free(p);
}

mg_status mg_packed_forward(float *out, const float *X, int64_t M, const mg_packed *cp,
                            const float *bias, int nt, mg_error *err) {
    if (!out || !X || !cp) return mg_fail(err, MG_ERR_ARG, "packed: out, X and W must be non-NULL");
    if (M < 1) return mg_fail(err, MG_ERR_ARG, "packed: %lld rows", (long long)M);
    mg_packed *p = (mg_packed *)cp; /* only its X scratch changes */
    const int N = p->N, K = p->K;
    const int64_t kp = p->kp, np = p->np;
    if (p->dt == MG_DT_BF16 && p->xa_rows < M) {
        uint16_t *xa = realloc(p->xa, (size_t)M * (size_t)(2 * kp) * sizeof(uint16_t));
        if (!xa) return mg_fail(err, MG_ERR_NOMEM, "packed: out of memory for %lld rows", (long long)M);
        p->xa = xa;
        p->xa_rows = M;
    }
    const int isa = p->dt == MG_DT_BF16 ? mg_gemm_isa_bf16() : mg_gemm_isa_f32();
    const int64_t row_blocks = (M + MR - 1) / MR;
    /* column panels split (each thread reads only its share of W), rows when
     * there are fewer panels than threads */
    const int split_rows = np < (nt > 0 ? nt : 1);
    /* bf16 on AMX: pairs of row blocks of whole rows (row_blocks_bf16) */
    const int amx = p->dt == MG_DT_BF16 && mg_gemm_isa_amx() && M >= 2 * MR;
#pragma omp parallel num_threads(nt > 0 ? nt : 1)
    {
        int64_t lo, hi;
        amx_tile_config ts;
        tiles(amx, 1, &ts);
        if (p->dt == MG_DT_BF16) {
            thread_range(M, &lo, &hi);
            pack_a_bf16(0, X, K, K, 2 * kp, lo, hi, p->xa + lo * 2 * kp);
#pragma omp barrier
        }
        int64_t rb0 = 0, rb1 = row_blocks, p0 = 0, p1 = np;
        if (split_rows) thread_row_blocks(row_blocks, amx, &rb0, &rb1);
        else thread_range(np, &p0, &p1);
        for (int64_t q = p0; q < p1; q++) {
            const int64_t n0 = q * NR;
            const int nc = (int)(N - n0 < NR ? N - n0 : NR);
            const float *bq = bias ? bias + n0 : NULL;
            if (p->dt == MG_DT_BF16) {
                row_blocks_bf16(isa, amx, rb0, rb1, M, p->xa + rb0 * MR * 2 * kp, 2 * kp,
                                (const uint16_t *)p->w + q * kp * 2 * NR, kp,
                                out + rb0 * MR * N + n0, N, nc, bq, 0.0f);
                continue;
            }
            for (int64_t rb = rb0; rb < rb1; rb++) {
                const int64_t r = rb * MR;
                kern_f32(isa, (int)(M - r < MR ? M - r : MR), X + r * K, K,
                         (const float *)p->w + q * K * NR, K, out + r * N + n0, N, nc, bq, 0.0f);
            }
        }
        tiles(amx, 0, &ts);
    }
    return MG_OK;
}
