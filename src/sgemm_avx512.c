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

#define SG_MR 14
#define SG_NV 2
#define SG_KC 1024
#define SG_MC 168
#define SG_NC 1024
#include "sgemm_template.h"

const attn_sgemm_kernel attn_sgemm_kernel_avx512 = SGEMM_KERNEL("avx512");
#endif
