/* fp32 GEMM micro-kernel with AVX2 + FMA vectors: a 6 x 16 tile, 12 of the
 * 16 registers accumulating, 2 holding B's row and 1 A's broadcast. Built
 * with -mavx2 -mfma on x86-64 only (CMakeLists.txt); isa.c's table picks it
 * where the CPU has AVX2 and FMA. */
#include "internal.h"

#if defined(__x86_64__)
#if !defined(__AVX2__) || !defined(__FMA__)
#error "sgemm_avx2.c needs -mavx2 -mfma (CMakeLists.txt sets them)"
#endif
#include <immintrin.h>

#define VL 8
typedef __m256 vf;
static inline vf v_load(const float *p) { return _mm256_loadu_ps(p); }
static inline void v_store(float *p, vf x) { _mm256_storeu_ps(p, x); }
static inline vf v_set1(float x) { return _mm256_set1_ps(x); }
static inline vf v_zero(void) { return _mm256_setzero_ps(); }
static inline vf v_fma(vf a, vf b, vf c) { return _mm256_fmadd_ps(a, b, c); }
static inline vf v_mul(vf a, vf b) { return _mm256_mul_ps(a, b); }

#define SG_MR 6
#define SG_NV 2
#define SG_KC 512
#define SG_MC 144
#define SG_NC 1024
#include "sgemm_template.h"

const attn_sgemm_kernel attn_sgemm_kernel_avx2 = SGEMM_KERNEL("avx2");
#endif
