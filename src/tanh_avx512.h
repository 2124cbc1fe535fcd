/* tanh on 16 fp32 lanes of AVX-512F, for logit soft-capping (c·tanh(s/c)):
 * Cephes' tanhf. |x| <= 0.625: x + x·z·P(z), z = x², P of degree 4 (no
 * cancellation near 0); else 1 - 2/(e^{2|x|} + 1) with the sign of x, e by
 * attn_exp_avx512 of 2·min(|x|, 10) (tanh(10) rounds to 1 in fp32) and the
 * reciprocal by vrcp14ps and one Newton step. Measured against fp64 tanh
 * (tests/test_sdpa_variants.c): a few ulp. NaN stays NaN (it takes the
 * polynomial's side), ±inf gives ±1. The fp32 and bf16 AVX-512 kernels'. */
#ifndef ATTN_TANH_AVX512_H
#define ATTN_TANH_AVX512_H

#include <immintrin.h>
#include <stdint.h>

#include "exp_avx512.h"

static inline __m512 attn_tanh_avx512(__m512 x) {
    const __m512 one = _mm512_set1_ps(1.0f), two = _mm512_set1_ps(2.0f);
    const __m512 ax = _mm512_abs_ps(x), z = _mm512_mul_ps(x, x);
    __m512 p = _mm512_set1_ps(-5.70498872745e-3f);
    p = _mm512_fmadd_ps(p, z, _mm512_set1_ps(2.06390887954e-2f));
    p = _mm512_fmadd_ps(p, z, _mm512_set1_ps(-5.37397155531e-2f));
    p = _mm512_fmadd_ps(p, z, _mm512_set1_ps(1.33314422036e-1f));
    p = _mm512_fmadd_ps(p, z, _mm512_set1_ps(-3.33332819422e-1f));
    const __m512 small = _mm512_fmadd_ps(_mm512_mul_ps(p, z), ax, ax); /* tanh|x|, as big */
    const __mmask16 isbig = _mm512_cmp_ps_mask(ax, _mm512_set1_ps(0.625f), _CMP_GT_OQ);
    __m512 t = small;
    if (isbig) { /* skipped when every lane is small (soft-capping's usual case) */
        const __m512 a = _mm512_min_ps(_mm512_set1_ps(10.0f), ax); /* NaN: ax (second operand) */
        const __m512 d = _mm512_add_ps(attn_exp_avx512(_mm512_add_ps(a, a)), one);
        __m512 r = _mm512_rcp14_ps(d);
        r = _mm512_mul_ps(r, _mm512_fnmadd_ps(d, r, two)); /* 1/d to ~2^-28 */
        const __m512 big = _mm512_fnmadd_ps(two, r, one);  /* 1 - 2/d, >= 0 */
        t = _mm512_mask_blend_ps(isbig, small, big);
    }
    return _mm512_castsi512_ps(
        _mm512_or_si512(/* x's sign (-0 stays -0) */
                        _mm512_castps_si512(t),
                        _mm512_and_si512(_mm512_castps_si512(x), _mm512_set1_epi32(INT32_MIN))));
}

#endif /* ATTN_TANH_AVX512_H */
