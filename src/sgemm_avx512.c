/* fp32 GEMM micro-kernel with AVX-512F vectors: a 14 x 32 tile, 28 of the
 * 32 registers accumulating, 2 holding B's row and 1 A's broadcast (each k:
 * 2 loads, 14 broadcasts, 28 FMAs). Built with -mavx512f -mfma on x86-64
 * only (CMakeLists.txt); isa.c's table picks it where the CPU has AVX-512F. */
#include "internal.h"

#if defined(__x86_64__)
#if !defined(__AVX512F__) || !defined(__FMA__)
#error "sgemm_avx512.c needs -mavx512f -mfma (CMakeLists.txt sets them)"
#endif
#include <immintrin.h>

#define VL 16
typedef __m512 vf;
static inline vf v_load(const float *p) { return _mm512_loadu_ps(p); }
static inline void v_store(float *p, vf x) { _mm512_storeu_ps(p, x); }
static inline vf v_set1(float x) { return _mm512_set1_ps(x); }
static inline vf v_zero(void) { return _mm512_setzero_ps(); }
static inline vf v_fma(vf a, vf b, vf c) { return _mm512_fmadd_ps(a, b, c); }
static inline vf v_mul(vf a, vf b) { return _mm512_mul_ps(a, b); }

/* r[i] = column i of the 16 x 16 block r[0..15] (row j = r[j]). */
static inline void transpose16(vf r[16]) {
    vf t[16];
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 16; i += 4) {
        r[i] = _mm512_shuffle_ps(t[i], t[i + 2], 0x44);
        r[i + 1] = _mm512_shuffle_ps(t[i], t[i + 2], 0xee);
        r[i + 2] = _mm512_shuffle_ps(t[i + 1], t[i + 3], 0x44);
        r[i + 3] = _mm512_shuffle_ps(t[i + 1], t[i + 3], 0xee);
    }
    for (int h = 0; h < 16; h += 8)
        for (int i = 0; i < 4; i++) {
            t[h + i] = _mm512_shuffle_f32x4(r[h + i], r[h + 4 + i], 0x88);
            t[h + 4 + i] = _mm512_shuffle_f32x4(r[h + i], r[h + 4 + i], 0xdd);
        }
    for (int i = 0; i < 8; i++) {
        r[i] = _mm512_shuffle_f32x4(t[i], t[8 + i], 0x88);
        r[8 + i] = _mm512_shuffle_f32x4(t[i], t[8 + i], 0xdd);
    }
}

/* dst[k * dstride + j] = src[j * lds + k] for j < n (n <= 16; lanes past n
 * of the source are zeros) and k < kc: blocks of 16 k's, each 16 rows
 * loaded, transposed in registers and stored as 16 k-rows of `width`
 * lanes (width >= n: the padding lanes get zeros). The `ahead` rows after
 * the n (the next panel's, ahead <= 16) are fetched into cache meanwhile:
 * without it the loads waited on memory (perf: most of the packing's time). */
static inline void pack_transposed(const float *src, int64_t lds, int n, int ahead, int width,
                                   int64_t kc, float *dst, int64_t dstride) {
    const __mmask16 wmask = (__mmask16)((1u << width) - 1u);
    for (int64_t k = 0; k < kc; k += 16) {
        const int kk = kc - k < 16 ? (int)(kc - k) : 16;
        const __mmask16 kmask = (__mmask16)((1u << kk) - 1u);
        vf r[16];
        for (int j = 0; j < 16; j++)
            r[j] = j < n ? _mm512_maskz_loadu_ps(kmask, src + j * lds + k) : _mm512_setzero_ps();
        for (int j = 0; j < ahead; j++) _mm_prefetch((const char *)(src + (n + j) * lds + k), _MM_HINT_T0);
        transpose16(r);
        for (int i = 0; i < kk; i++) _mm512_mask_storeu_ps(dst + (k + i) * dstride, wmask, r[i]);
    }
}

/* The packing hooks of sgemm_template.h: an A panel [kc][14] from 14 rows,
 * a B panel [kc][32] from 32 rows, 16 k's at a time. */
#define SG_PACK_A_ROWS(src, lda, rows, ahead, kc, dst)                                             \
    pack_transposed(src, lda, (int)(rows), (int)(ahead), SG_MR, kc, dst, SG_MR)
/* dst[k][0 : width) = src[k * lds + 0 : n), zeros past n (n <= width <= 32),
 * k < kc: rows of the source copied with masked vector loads (the plain
 * loop became one-float inserts), the row 16 ahead fetched meanwhile (the
 * loads waited on memory). */
static inline void pack_rows(const float *src, int64_t lds, int n, int width, int64_t kc,
                             float *dst) {
    const __mmask16 l0 = (__mmask16)((1u << (n < 16 ? n : 16)) - 1u);
    const __mmask16 l1 = (__mmask16)((1u << (n > 16 ? n - 16 : 0)) - 1u);
    const __mmask16 w0 = (__mmask16)((1u << (width < 16 ? width : 16)) - 1u);
    for (int64_t k = 0; k < kc; k++, src += lds, dst += width) {
        if (k + 16 < kc) {
            _mm_prefetch((const char *)(src + 16 * lds), _MM_HINT_T0);
            if (n > 16) _mm_prefetch((const char *)(src + 16 * lds + 16), _MM_HINT_T0);
        }
        _mm512_mask_storeu_ps(dst, w0, _mm512_maskz_loadu_ps(l0, src));
        if (width > 16) _mm512_storeu_ps(dst + 16, _mm512_maskz_loadu_ps(l1, src + 16));
    }
}
#define SG_PACK_A_COLS(src, lda, rows, kc, dst) pack_rows(src, lda, (int)(rows), SG_MR, kc, dst)
#define SG_PACK_B_ROWS(src, ldb, cols, kc, dst) pack_rows(src, ldb, (int)(cols), SG_NR, kc, dst)
#define SG_PACK_B_COLS(src, ldb, cols, kc, dst)                                                    \
    do {                                                                                           \
        const int c_ = (int)(cols);                                                                \
        pack_transposed(src, ldb, c_ < 16 ? c_ : 16, 0, 16, kc, dst, 32);                          \
        pack_transposed(c_ > 16 ? (src) + 16 * (ldb) : (src), ldb, c_ > 16 ? c_ - 16 : 0, 0, 16,   \
                        kc, (dst) + 16, 32);                                                       \
    } while (0)

#define SG_MR 14
#define SG_NV 2
#define SG_KC 1024
#define SG_MC 168
#define SG_NC 1024
#include "sgemm_template.h"

const attn_sgemm_kernel attn_sgemm_kernel_avx512 = SGEMM_KERNEL("avx512");
#endif
