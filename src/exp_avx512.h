/* exp on 16 fp32 lanes of AVX-512F: Cephes' expf (two-constant ln 2
 * reduction, degree-6 polynomial, ~1 ulp), the power of two applied by
 * vscalefps (which also gives the denormal results and +inf above ~88.7).
 * x <= -150 (and -inf) gives exactly 0; NaN stays NaN (max returns its
 * second operand when one is NaN). The fp32 and bf16 AVX-512 kernels'. */
#ifndef ATTN_EXP_AVX512_H
#define ATTN_EXP_AVX512_H

#include <immintrin.h>

static inline __m512 attn_exp_avx512(__m512 x) {
    x = _mm512_max_ps(_mm512_set1_ps(-150.0f), x);
    const __m512 fx = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                           _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(fx, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(fx, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 y = _mm512_set1_ps(1.9875691500e-4f);
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.3981999507e-3f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(8.3334519073e-3f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(4.1665795894e-2f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.6666665459e-1f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(5.0000001201e-1f));
    y = _mm512_fmadd_ps(y, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    return _mm512_scalef_ps(y, fx);
}

#endif /* ATTN_EXP_AVX512_H */
