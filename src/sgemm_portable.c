/* fp32 GEMM micro-kernel in portable C: GCC/Clang generic vectors of 4
 * floats (SSE2 on baseline x86-64, NEON on aarch64), a 4 x 8 tile. Runs
 * anywhere; ATTN_FUSED_ISA=portable forces it. Multiply and add are two
 * roundings here (ISO C: no contraction), as in the fused portable kernels. */
#include "internal.h"

#include <string.h>

#define VL 4
typedef float vf __attribute__((vector_size(16)));
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

#define SG_MR 4
#define SG_NV 2
#define SG_KC 256
#define SG_MC 128
#define SG_NC 1024
#include "sgemm_template.h"

const attn_sgemm_kernel attn_sgemm_kernel_portable = SGEMM_KERNEL("portable");
