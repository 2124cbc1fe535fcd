/* bfloat16 for the scaled dot-product calls (attn.h: attn_dtype): the
 * scalar conversions every bf16 file shares, and the fp32 copies through
 * which the reference path and a bf16 forward that asks for weights run
 * the fp32 code on the converted values (sdpa_bf16.c; a leaf: it calls
 * nothing of the library but attn_fail). */
#ifndef ATTN_SDPA_BF16_H
#define ATTN_SDPA_BF16_H

#include "internal.h"

#include <string.h>

/* fp32 -> bf16, round to nearest, ties to even; NaN stays a quiet NaN. */
static inline uint16_t attn_bf16_round(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x0040u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
/* bf16 -> fp32, exact. */
static inline float attn_bf16_to_f32(uint16_t h) {
    const uint32_t u = (uint32_t)h << 16;
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}
/* Element (b, h, l, d) of a bf16 view (attn_tensor.data holds uint16_t). */
static inline const uint16_t *attn_bf16_row(const attn_tensor *t, int64_t b, int64_t h,
                                            int64_t l) {
    return (const uint16_t *)(const void *)t->data + b * t->stride[0] + h * t->stride[1] +
           l * t->stride[2];
}

/* A bf16 call seen as an fp32 one: pr with dtype and out_dtype ATTN_F32,
 * contiguous fp32 copies of the bf16 tensors among q, k, v (and for the
 * backward out and grad_out), and for a bf16 out of the forward an fp32
 * buffer the fp32 kernels write, rounded into the caller's out by
 * attn_bf16_narrow_out. fp32 tensors are used in place. */
typedef struct {
    attn_problem pr;
    attn_tensor q, k, v, out, dout;
    float *buf[5];
} attn_bf16_f32;

/* backward 0: out is the forward's output (allocated when bf16, not read);
 * backward 1: out and dout are inputs (converted). */
attn_status attn_bf16_widen(const attn_problem *pr, const attn_tensor *q, const attn_tensor *k,
                            const attn_tensor *v, const attn_tensor *out, const attn_tensor *dout,
                            int backward, attn_bf16_f32 *w, attn_error *err);
/* The forward's fp32 result w->out into the caller's out (rounded when bf16). */
void attn_bf16_narrow_out(const attn_bf16_f32 *w, const attn_problem *pr, const attn_tensor *out);
void attn_bf16_free(attn_bf16_f32 *w);

/* isa.c: the bf16 fused forward of the active row (VDPBF16PS where the CPU
 * has AVX512_BF16, else the portable kernels; ATTN_FUSED_ISA lowers it as
 * for fp32), forward and backward. */
const attn_fused_kernels *attn_fused_bf16_kernels_active(void);

#endif
