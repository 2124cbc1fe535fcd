/* Fused SDPA kernels with AVX-512F vectors (16 lanes, 32 registers: 6x4
 * micro-kernel). Built with -mavx512f -mavx2 -mfma on x86-64 only (see
 * CMakeLists.txt); sdpa_fused.c calls it only where the CPU has AVX-512F. */
#include "internal.h"

#if defined(__x86_64__)
#if !defined(__AVX512F__) || !defined(__AVX2__) || !defined(__FMA__)
#error "sdpa_fused_avx512.c needs -mavx512f -mavx2 -mfma (CMakeLists.txt sets them)"
#endif
#include <immintrin.h>

#define VL 16
typedef __m512 vf;
#define UKR_MR 6
#define UKR_NV 4
#define FUSED_SUFFIX avx512

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
/* exp for x <= 88.3: Cephes' expf (two-constant ln 2 reduction, degree-6
 * polynomial, ~1 ulp); x <= -88 (and -inf) gives exactly 0, NaN stays NaN. */
static inline vf v_exp(vf x) {
    x = _mm512_max_ps(_mm512_set1_ps(-88.0f), x);
    x = _mm512_min_ps(_mm512_set1_ps(88.3f), x);
    const vf fx = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                       _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    vf r = _mm512_fnmadd_ps(fx, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(fx, _mm512_set1_ps(-2.12194440e-4f), r);
    vf y = _mm512_set1_ps(1.9875691500e-4f);
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.3981999507e-3f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(8.3334519073e-3f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(4.1665795894e-2f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.6666665459e-1f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(5.0000001201e-1f));
    y = _mm512_fmadd_ps(y, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    __m512i n = _mm512_cvtps_epi32(fx);
    n = _mm512_slli_epi32(_mm512_add_epi32(n, _mm512_set1_epi32(127)), 23);
    return _mm512_mul_ps(y, _mm512_castsi512_ps(n));
}

#include "sdpa_fused_template.h"

#else
typedef int attn_fused_avx512_not_built; /* not x86-64: portable kernels only */
#endif
