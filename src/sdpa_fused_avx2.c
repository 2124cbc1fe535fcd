/* Fused SDPA kernels with AVX2 + FMA vectors (8 lanes, 16 registers: 6x2
 * micro-kernel). Built with -mavx2 -mfma on x86-64 only (see
 * CMakeLists.txt); isa.c's table picks it only where the CPU has AVX2 and
 * FMA. */
#include "internal.h"

#if defined(__x86_64__)
#if !defined(__AVX2__) || !defined(__FMA__)
#error "sdpa_fused_avx2.c needs -mavx2 -mfma (CMakeLists.txt sets them)"
#endif
#include <immintrin.h>

#define VL 8
typedef __m256 vf;
#define UKR_MR 6
#define UKR_NV 2

static inline vf v_load(const float *p) { return _mm256_loadu_ps(p); }
static inline void v_store(float *p, vf x) { _mm256_storeu_ps(p, x); }
static inline vf v_set1(float x) { return _mm256_set1_ps(x); }
static inline vf v_zero(void) { return _mm256_setzero_ps(); }
static inline vf v_fma(vf a, vf b, vf c) { return _mm256_fmadd_ps(a, b, c); }
static inline vf v_mul(vf a, vf b) { return _mm256_mul_ps(a, b); }
static inline vf v_add(vf a, vf b) { return _mm256_add_ps(a, b); }
static inline vf v_sub(vf a, vf b) { return _mm256_sub_ps(a, b); }
/* max(a, b); b when either is NaN (so v_max(x, acc) ignores a NaN x). */
static inline vf v_max(vf a, vf b) { return _mm256_max_ps(a, b); }
/* x where s != c (or s is NaN), else +0. */
static inline vf v_zero_if_eq(vf x, vf s, float c) {
    return _mm256_and_ps(_mm256_cmp_ps(s, _mm256_set1_ps(c), _CMP_NEQ_UQ), x);
}
static inline float v_hsum(vf x) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
static inline float v_hmax(vf x) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
static const int32_t kLaneMask[16] = {-1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0};
static inline vf v_load_n(const float *p, int n) {
    return _mm256_maskload_ps(p, _mm256_loadu_si256((const __m256i *)(kLaneMask + 8 - n)));
}
/* dst[c][r] = src[r][c] for an 8 x 8 block (rows lds / ldd apart). */
static inline void v_transpose_block(const float *src, int64_t lds, float *dst, int64_t ldd) {
    __m256 r[8], t[8];
    for (int i = 0; i < 8; i++) r[i] = _mm256_loadu_ps(src + i * lds);
    for (int i = 0; i < 4; i++) {
        t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    for (int g = 0; g < 2; g++) { /* r[4g + c], 128-bit lane L: column 4L + c, rows 4g..4g+3 */
        r[4 * g] = _mm256_shuffle_ps(t[4 * g], t[4 * g + 2], 0x44);
        r[4 * g + 1] = _mm256_shuffle_ps(t[4 * g], t[4 * g + 2], 0xee);
        r[4 * g + 2] = _mm256_shuffle_ps(t[4 * g + 1], t[4 * g + 3], 0x44);
        r[4 * g + 3] = _mm256_shuffle_ps(t[4 * g + 1], t[4 * g + 3], 0xee);
    }
    for (int c = 0; c < 4; c++) {
        _mm256_storeu_ps(dst + c * ldd, _mm256_permute2f128_ps(r[c], r[4 + c], 0x20));
        _mm256_storeu_ps(dst + (4 + c) * ldd, _mm256_permute2f128_ps(r[c], r[4 + c], 0x31));
    }
}
/* exp for x <= 88.3: Cephes' expf (two-constant ln 2 reduction, degree-6
 * polynomial, ~1 ulp); x <= -88 (and -inf) gives exactly 0, NaN stays NaN. */
static inline vf v_exp(vf x) {
    x = _mm256_max_ps(_mm256_set1_ps(-88.0f), x);
    x = _mm256_min_ps(_mm256_set1_ps(88.3f), x);
    const vf fx = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                  _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    vf r = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.12194440e-4f), r);
    vf y = _mm256_set1_ps(1.9875691500e-4f);
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.3981999507e-3f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(8.3334519073e-3f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(4.1665795894e-2f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.6666665459e-1f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(5.0000001201e-1f));
    y = _mm256_fmadd_ps(y, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    __m256i n = _mm256_cvtps_epi32(fx);
    n = _mm256_slli_epi32(_mm256_add_epi32(n, _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(y, _mm256_castsi256_ps(n));
}
/* tanh (soft-capping), a few ulp: tanh_avx512.h's Cephes tanhf with v_exp
 * and a division. NaN stays NaN, ±inf gives ±1. */
static inline vf v_tanh(vf x) {
    const vf one = _mm256_set1_ps(1.0f), sign = _mm256_set1_ps(-0.0f);
    const vf ax = _mm256_andnot_ps(sign, x), z = _mm256_mul_ps(x, x);
    vf p = _mm256_set1_ps(-5.70498872745e-3f);
    p = _mm256_fmadd_ps(p, z, _mm256_set1_ps(2.06390887954e-2f));
    p = _mm256_fmadd_ps(p, z, _mm256_set1_ps(-5.37397155531e-2f));
    p = _mm256_fmadd_ps(p, z, _mm256_set1_ps(1.33314422036e-1f));
    p = _mm256_fmadd_ps(p, z, _mm256_set1_ps(-3.33332819422e-1f));
    const vf small = _mm256_fmadd_ps(_mm256_mul_ps(p, z), ax, ax); /* tanh|x|, as big */
    const vf isbig = _mm256_cmp_ps(ax, _mm256_set1_ps(0.625f), _CMP_GT_OQ);
    vf t = small;
    if (_mm256_movemask_ps(isbig)) { /* skipped when every lane is small */
        const vf a = _mm256_min_ps(_mm256_set1_ps(10.0f), ax); /* NaN: ax (second operand) */
        const vf d = _mm256_add_ps(v_exp(_mm256_add_ps(a, a)), one);
        const vf big = _mm256_sub_ps(one, _mm256_div_ps(_mm256_set1_ps(2.0f), d));
        t = _mm256_blendv_ps(small, big, isbig);
    }
    return _mm256_or_ps(t, _mm256_and_ps(sign, x)); /* x's sign (-0 stays -0) */
}

#include "sdpa_fused_template.h"

const attn_fused_kernels attn_fused_kernels_avx2 = FUSED_KERNELS("avx2");

#else
typedef int attn_fused_avx2_not_built; /* not x86-64: portable kernels only */
#endif
