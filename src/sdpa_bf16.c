/* bfloat16: the public conversions and the fp32 copies of a bf16 call
 * (sdpa_bf16.h). */
#include "sdpa_bf16.h"

#include <omp.h>
#include <stdlib.h>

void attn_bf16_from_f32(const float *src, uint16_t *dst, size_t n) {
    for (size_t i = 0; i < n; i++) dst[i] = attn_bf16_round(src[i]);
}

void attn_f32_from_bf16(const uint16_t *src, float *dst, size_t n) {
    for (size_t i = 0; i < n; i++) dst[i] = attn_bf16_to_f32(src[i]);
}

attn_tensor attn_tensor_bhld_bf16(uint16_t *data, int64_t B, int64_t H, int64_t L, int64_t D) {
    attn_tensor t = {(float *)(void *)data, {B, H, L, D}, {H * L * D, L * D, D, 1}};
    return t;
}

attn_tensor attn_tensor_blhd_bf16(uint16_t *data, int64_t B, int64_t H, int64_t L, int64_t D) {
    attn_tensor t = {(float *)(void *)data, {B, H, L, D}, {L * H * D, D, H * D, 1}};
    return t;
}

/* A contiguous [B, H, L, D] fp32 copy of bf16 view t (convert: read t). */
static attn_status widen_one(const attn_tensor *t, int convert, int threads, attn_tensor *dst,
                             float **buf, attn_error *err) {
    const int64_t B = t->dim[0], H = t->dim[1], L = t->dim[2], D = t->dim[3];
    float *f = malloc((size_t)(B * H * L * D) * sizeof(float));
    if (!f) return attn_fail(err, ATTN_ERR_NOMEM, "bf16: no memory for an fp32 copy");
    *buf = f;
    *dst = attn_tensor_bhld(f, B, H, L, D);
    if (!convert) return ATTN_OK;
    const int64_t sd = t->stride[3];
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t r = 0; r < B * H * L; r++) {
        const uint16_t *s = attn_bf16_row(t, r / (H * L), r / L % H, r % L);
        float *o = f + r * D;
        for (int64_t d = 0; d < D; d++) o[d] = attn_bf16_to_f32(s[d * sd]);
    }
    return ATTN_OK;
}

attn_status attn_bf16_widen(const attn_problem *pr, const attn_tensor *q, const attn_tensor *k,
                            const attn_tensor *v, const attn_tensor *out, const attn_tensor *dout,
                            int backward, attn_bf16_f32 *w, attn_error *err) {
    memset(w, 0, sizeof *w);
    w->pr = *pr;
    w->pr.dtype = w->pr.out_dtype = ATTN_F32;
    const attn_tensor *src[5] = {q, k, v, out, dout};
    attn_tensor *dst[5] = {&w->q, &w->k, &w->v, &w->out, &w->dout};
    for (int i = 0; i < 5; i++) {
        if (!src[i]) continue;
        const int bf16 = (i < 3 ? pr->dtype : pr->out_dtype) == ATTN_BF16;
        if (!bf16) {
            *dst[i] = *src[i];
            continue;
        }
        attn_status s = widen_one(src[i], i < 3 || backward, pr->threads, dst[i], &w->buf[i], err);
        if (s) {
            attn_bf16_free(w);
            return s;
        }
    }
    return ATTN_OK;
}

void attn_bf16_narrow_out(const attn_bf16_f32 *w, const attn_problem *pr, const attn_tensor *out) {
    if (pr->out_dtype != ATTN_BF16) return;
    const int64_t H = out->dim[1], L = out->dim[2], D = out->dim[3], sd = out->stride[3];
    const float *f = w->buf[3];
#pragma omp parallel for num_threads(pr->threads) schedule(static)
    for (int64_t r = 0; r < out->dim[0] * H * L; r++) {
        uint16_t *o = (uint16_t *)(uintptr_t)attn_bf16_row(out, r / (H * L), r / L % H, r % L);
        for (int64_t d = 0; d < D; d++) o[d * sd] = attn_bf16_round(f[r * D + d]);
    }
}

void attn_bf16_free(attn_bf16_f32 *w) {
    for (int i = 0; i < 5; i++) {
        free(w->buf[i]);
        w->buf[i] = NULL;
    }
}
