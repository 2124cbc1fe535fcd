/* Sixteen horizontal sums of AVX-512F vectors at once, each bitwise
 * _mm512_reduce_add_ps's under GCC (its tree: lane l + 8, then l + 4,
 * l + 2, l + 1 added to lane l; fp32 addition commutes, so the order of
 * the operands does not matter), without leaving the registers: the
 * decode kernels' scores of 16 keys, one vector of lane sums per key. The
 * fp32 and bf16 AVX-512 kernels'. */
#ifndef ATTN_HSUM_AVX512_H
#define ATTN_HSUM_AVX512_H

#include <immintrin.h>

/* The first two levels for four vectors: block i (lanes 4i..4i+3) of the
 * result holds x_i's four partial sums. */
static inline __m512 attn_hsum_l12x4(__m512 x0, __m512 x1, __m512 x2, __m512 x3) {
    const __m512 a = _mm512_add_ps(_mm512_mask_blend_ps(0xff00, x0, x1),
                                   _mm512_shuffle_f32x4(x0, x1, 0x4e));
    const __m512 b = _mm512_add_ps(_mm512_mask_blend_ps(0xff00, x2, x3),
                                   _mm512_shuffle_f32x4(x2, x3, 0x4e));
    return _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x88), _mm512_shuffle_f32x4(a, b, 0xdd));
}

/* The last two levels over four attn_hsum_l12x4 results: lane 4i + c is
 * the whole sum of y_c's block i (of the vector in slot 4c + i of the 16).
 * So with key j + 4i + c in slot 4c + i (y_c = the keys j + c, j + c + 4,
 * j + c + 8, j + c + 12), lane l holds key j + l. */
static inline __m512 attn_hsum_l34x4(__m512 y0, __m512 y1, __m512 y2, __m512 y3) {
    const __m512d a = _mm512_castps_pd(y0), b = _mm512_castps_pd(y1);
    const __m512d c = _mm512_castps_pd(y2), d = _mm512_castps_pd(y3);
    const __m512 u = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(a, b)),
                                   _mm512_castpd_ps(_mm512_unpackhi_pd(a, b)));
    const __m512 w = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(c, d)),
                                   _mm512_castpd_ps(_mm512_unpackhi_pd(c, d)));
    return _mm512_add_ps(_mm512_shuffle_ps(u, w, 0x88), _mm512_shuffle_ps(u, w, 0xdd));
}

#endif /* ATTN_HSUM_AVX512_H */
