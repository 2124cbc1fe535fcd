/* Fused SDPA kernels with AVX-512F vectors (16 lanes, 32 registers: 6x4
 * micro-kernel). Built with -mavx512f -mavx2 -mfma on x86-64 only (see
 * CMakeLists.txt); isa.c's table picks it only where the CPU has AVX-512F. */
#include "internal.h"

#if defined(__x86_64__)
#if !defined(__AVX512F__) || !defined(__AVX2__) || !defined(__FMA__)
#error "sdpa_fused_avx512.c needs -mavx512f -mavx2 -mfma (CMakeLists.txt sets them)"
#endif
#include <immintrin.h>

#include "exp_avx512.h"
#include "hsum_avx512.h"
#include "tanh_avx512.h"

#define VL 16
typedef __m512 vf;
#define UKR_MR 6
#define UKR_NV 4

static inline vf v_load(const float *p) { return _mm512_loadu_ps(p); }
static inline void v_store(float *p, vf x) { _mm512_storeu_ps(p, x); }
static inline vf v_set1(float x) { return _mm512_set1_ps(x); }
static inline vf v_zero(void) { return _mm512_setzero_ps(); }
static inline vf v_fma(vf a, vf b, vf c) { return _mm512_fmadd_ps(a, b, c); }
static inline vf v_mul(vf a, vf b) { return _mm512_mul_ps(a, b); }
static inline vf v_add(vf a, vf b) { return _mm512_add_ps(a, b); }
static inline vf v_sub(vf a, vf b) { return _mm512_sub_ps(a, b); }
/* max(a, b); b when either is NaN (so v_max(x, acc) ignores a NaN x). */
static inline vf v_max(vf a, vf b) { return _mm512_max_ps(a, b); }
/* x where s != c (or s is NaN), else +0. */
static inline vf v_zero_if_eq(vf x, vf s, float c) {
    return _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(s, _mm512_set1_ps(c), _CMP_NEQ_UQ), x);
}
static inline float v_hsum(vf x) { return _mm512_reduce_add_ps(x); }
static inline float v_hmax(vf x) { return _mm512_reduce_max_ps(x); }
static inline vf v_load_n(const float *p, int n) {
    return _mm512_maskz_loadu_ps((__mmask16)((1u << n) - 1u), p);
}
/* dst[c][r] = src[r][c] for a 16 x 16 block (rows lds / ldd apart). */
static inline void v_transpose_block(const float *src, int64_t lds, float *dst, int64_t ldd) {
    __m512 r[16], t[16];
    for (int i = 0; i < 16; i++) r[i] = _mm512_loadu_ps(src + i * lds);
    for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    for (int g = 0; g < 4; g++) { /* r[4g + c], 128-bit lane L: column 4L + c, rows 4g..4g+3 */
        const __m512d a = _mm512_castps_pd(t[4 * g]), b = _mm512_castps_pd(t[4 * g + 2]);
        const __m512d c = _mm512_castps_pd(t[4 * g + 1]), d = _mm512_castps_pd(t[4 * g + 3]);
        r[4 * g] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, b));
        r[4 * g + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, b));
        r[4 * g + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(c, d));
        r[4 * g + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(c, d));
    }
    for (int c = 0; c < 4; c++) {
        const __m512 x = _mm512_shuffle_f32x4(r[c], r[4 + c], 0x88);
        const __m512 y = _mm512_shuffle_f32x4(r[8 + c], r[12 + c], 0x88);
        const __m512 x2 = _mm512_shuffle_f32x4(r[c], r[4 + c], 0xdd);
        const __m512 y2 = _mm512_shuffle_f32x4(r[8 + c], r[12 + c], 0xdd);
        _mm512_storeu_ps(dst + c * ldd, _mm512_shuffle_f32x4(x, y, 0x88));
        _mm512_storeu_ps(dst + (8 + c) * ldd, _mm512_shuffle_f32x4(x, y, 0xdd));
        _mm512_storeu_ps(dst + (4 + c) * ldd, _mm512_shuffle_f32x4(x2, y2, 0x88));
        _mm512_storeu_ps(dst + (12 + c) * ldd, _mm512_shuffle_f32x4(x2, y2, 0xdd));
    }
}
/* Levels 1-2 and 3-4 of 16 horizontal sums at once (hsum_avx512.h). */
static inline vf v_hsum_l12x4(vf a, vf b, vf c, vf d) { return attn_hsum_l12x4(a, b, c, d); }
static inline vf v_hsum_l34x4(vf a, vf b, vf c, vf d) { return attn_hsum_l34x4(a, b, c, d); }
static inline vf v_exp(vf x) { return attn_exp_avx512(x); }
static inline vf v_tanh(vf x) { return attn_tanh_avx512(x); } /* a few ulp */

#include "sdpa_fused_template.h"

const attn_fused_kernels attn_fused_kernels_avx512 = FUSED_KERNELS("avx512");

#else
typedef int attn_fused_avx512_not_built; /* not x86-64: portable kernels only */
#endif
