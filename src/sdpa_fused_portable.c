/* Fused SDPA kernels in portable C: GCC/Clang generic vectors of 4 floats
 * (SSE2 on baseline x86-64, NEON on aarch64), exp through libm. Used where
 * neither AVX-512 nor AVX2+FMA is available, or when ATTN_FUSED_ISA=portable. */
#include "internal.h"

#include <math.h>
#include <string.h>

#define VL 4
typedef float vf __attribute__((vector_size(16)));
typedef int32_t vi __attribute__((vector_size(16)));
#define UKR_MR 6
#define UKR_NV 2

static inline vf v_load(const float *p) {
    vf x;
    memcpy(&x, p, sizeof x);
    return x;
}
static inline void v_store(float *p, vf x) { memcpy(p, &x, sizeof x); }
static inline vf v_set1(float x) {
    vf r;
    for (int i = 0; i < VL; i++) r[i] = x;
    return r;
}
static inline vf v_zero(void) { return v_set1(0.0f); }
static inline vf v_fma(vf a, vf b, vf c) { return a * b + c; }
static inline vf v_mul(vf a, vf b) { return a * b; }
static inline vf v_add(vf a, vf b) { return a + b; }
static inline vf v_sub(vf a, vf b) { return a - b; }
/* max(a, b); b when either is NaN (as x86 maxps). */
static inline vf v_max(vf a, vf b) {
    const vi m = a > b;
    return (vf)((m & (vi)a) | (~m & (vi)b));
}
/* x where s != c (or s is NaN), else +0. */
static inline vf v_zero_if_eq(vf x, vf s, float c) {
    const vi m = s != v_set1(c);
    return (vf)(m & (vi)x);
}
static inline float v_hsum(vf x) {
    float s = 0.0f;
    for (int i = 0; i < VL; i++) s += x[i];
    return s;
}
static inline float v_hmax(vf x) {
    float s = x[0];
    for (int i = 1; i < VL; i++) s = x[i] > s ? x[i] : s;
    return s;
}
static inline vf v_load_n(const float *p, int n) {
    vf x = v_zero();
    for (int i = 0; i < n; i++) x[i] = p[i];
    return x;
}
/* dst[c][r] = src[r][c] for a VL x VL block. */
static inline void v_transpose_block(const float *src, int64_t lds, float *dst, int64_t ldd) {
    for (int r = 0; r < VL; r++)
        for (int c = 0; c < VL; c++) dst[c * ldd + r] = src[r * lds + c];
}
static inline vf v_exp(vf x) {
    vf r;
    for (int i = 0; i < VL; i++) r[i] = expf(x[i]);
    return r;
}
static inline vf v_tanh(vf x) { /* libm's, the reference's function */
    vf r;
    for (int i = 0; i < VL; i++) r[i] = tanhf(x[i]);
    return r;
}

#include "sdpa_fused_template.h"

const attn_fused_kernels attn_fused_kernels_portable = FUSED_KERNELS("portable");
