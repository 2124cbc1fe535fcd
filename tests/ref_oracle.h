/* Independent fp64 oracle for scaled dot-product attention, written from the
 * header's semantics only: materialise the full score row in double, apply
 * every mask, take a max-subtracted softmax, multiply V. */
#ifndef ATTN_REF_ORACLE_H
#define ATTN_REF_ORACLE_H

#include "testutil.h"

/* Element offset of (b, h, i, j) in a broadcastable mask: a dim of size 1 is
 * broadcast whatever its stride; a stride of 0 broadcasts by itself. */
static inline int64_t ref_mask_off(const attn_mask *m, int64_t b, int64_t h, int64_t i, int64_t j) {
    const int64_t idx[4] = {b, h, i, j};
    int64_t off = 0;
    for (int x = 0; x < 4; x++)
        if (m->dim[x] != 1) off += idx[x] * m->stride[x];
    return off;
}

/* Does key j take part for query i (all boolean-style masks)? */
static inline int ref_visible(const attn_sdpa_params *p, int64_t b, int64_t h, int64_t i, int64_t j,
                              int64_t Lq, int64_t Lk) {
    const int64_t ia = i + (Lk - Lq); /* absolute query position */
    if (p->causal && j > ia) return 0;
    if (p->key_lengths && j >= p->key_lengths[b]) return 0;
    if (p->use_window) {
        /* j < ia - left and j > ia + right, written so that huge bounds
         * cannot overflow (|ia - j| <= Lq + Lk). */
        if (p->window_left != ATTN_UNBOUNDED && ia - j > p->window_left) return 0;
        if (p->window_right != ATTN_UNBOUNDED && j - ia > p->window_right) return 0;
    }
    if (p->bool_mask) {
        const uint8_t *m = p->bool_mask->data;
        if (!m[ref_mask_off(p->bool_mask, b, h, i, j)]) return 0;
    }
    return 1;
}

/* q [B,H,Lq,Dk], k [B,H,Lk,Dk], v [B,H,Lk,Dv]: contiguous doubles.
 * Writes out [B,H,Lq,Dv], w [B,H,Lq,Lk], lse [B,H,Lq] and, if non-NULL,
 * empty [B,H,Lq] (1 where the row sees no key). Dropout is not modelled.
 * An empty row gives out 0, w 0, lse -inf; a NaN score poisons its row. */
static inline void ref_sdpa(int64_t B, int64_t H, int64_t Lq, int64_t Lk, int64_t Dk, int64_t Dv,
                            const double *q, const double *k, const double *v,
                            const attn_sdpa_params *p, double *out, double *w, double *lse,
                            unsigned char *empty) {
    const double scale = p->use_scale ? (double)p->scale : 1.0 / sqrt((double)Dk);
    double *s = tu_malloc((size_t)Lk * sizeof(double));
    unsigned char *in = tu_malloc((size_t)Lk);
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t i = 0; i < Lq; i++) {
                const int64_t bh = b * H + h, row = bh * Lq + i;
                const double *qi = q + row * Dk;
                double m = -INFINITY, sum = 0.0;
                int any = 0, has_nan = 0;
                for (int64_t j = 0; j < Lk; j++) {
                    const double *kj = k + (bh * Lk + j) * Dk;
                    double dot = 0.0;
                    for (int64_t d = 0; d < Dk; d++) dot += qi[d] * kj[d];
                    s[j] = dot * scale;
                    if (p->add_mask) {
                        const float *am = p->add_mask->data;
                        s[j] += (double)am[ref_mask_off(p->add_mask, b, h, i, j)];
                    }
                    in[j] = ref_visible(p, b, h, i, j, Lq, Lk) && s[j] != -INFINITY;
                    if (!in[j]) continue;
                    any = 1;
                    if (isnan(s[j]))
                        has_nan = 1;
                    else if (s[j] > m)
                        m = s[j];
                }
                double *o = out + row * Dv, *wr = w + row * Lk;
                if (empty) empty[row] = (unsigned char)!any;
                if (!any || has_nan) {
                    const double fill = has_nan ? NAN : 0.0;
                    for (int64_t d = 0; d < Dv; d++) o[d] = fill;
                    for (int64_t j = 0; j < Lk; j++) wr[j] = in[j] ? fill : 0.0;
                    lse[row] = has_nan ? NAN : -INFINITY;
                    continue;
                }
                for (int64_t j = 0; j < Lk; j++) sum += in[j] ? exp(s[j] - m) : 0.0;
                lse[row] = m + log(sum);
                for (int64_t d = 0; d < Dv; d++) o[d] = 0.0;
                for (int64_t j = 0; j < Lk; j++) {
                    wr[j] = in[j] ? exp(s[j] - m) / sum : 0.0;
                    if (!in[j]) continue; /* a removed key's V never takes part */
                    const double *vj = v + (bh * Lk + j) * Dv;
                    for (int64_t d = 0; d < Dv; d++) o[d] += wr[j] * vj[d];
                }
            }
    free(s);
    free(in);
}

/* Packed [B, L, H*hd] -> [B, H, L, hd] (split) and back (merge), in double;
 * the MHA oracles' head reshapes. */
static inline void ref_split_heads(const double *x, int64_t B, int64_t L, int64_t H, int64_t hd,
                                   double *y) {
    for (int64_t b = 0; b < B; b++)
        for (int64_t l = 0; l < L; l++)
            for (int64_t h = 0; h < H; h++)
                for (int64_t d = 0; d < hd; d++)
                    y[((b * H + h) * L + l) * hd + d] = x[(b * L + l) * H * hd + h * hd + d];
}

static inline void ref_merge_heads(const double *x, int64_t B, int64_t L, int64_t H, int64_t hd,
                                   double *y) {
    for (int64_t b = 0; b < B; b++)
        for (int64_t l = 0; l < L; l++)
            for (int64_t h = 0; h < H; h++)
                for (int64_t d = 0; d < hd; d++)
                    y[(b * L + l) * H * hd + h * hd + d] = x[((b * H + h) * L + l) * hd + d];
}

#endif /* ATTN_REF_ORACLE_H */
