/* Reference scaled dot-product attention: one query row at a time, the row's
 * Lk scores materialised, softmax with the row max subtracted, fp32 sums in a
 * fixed order. It is the exact math of the tutorial and the oracle the fused
 * path is tested against; its results do not depend on the thread count
 * (each row, and in the backward each (b, h), is owned by one thread). */
#include "internal.h"
#include "sdpa_bf16.h"

#include <omp.h>
#include <stdlib.h>
#include <string.h>

/* Element pointer of a strided view. */
static inline const float *at(const attn_tensor *t, int64_t b, int64_t h, int64_t l) {
    return t->data + b * t->stride[0] + h * t->stride[1] + l * t->stride[2];
}
static inline float *at_mut(const attn_tensor *t, int64_t b, int64_t h, int64_t l) {
    return t->data + b * t->stride[0] + h * t->stride[1] + l * t->stride[2];
}

/* a · b over n elements with strides sa, sb. Eight partial sums in a fixed
 * order keep it vectorisable and independent of threading. */
static float dot(const float *a, int64_t sa, const float *b, int64_t sb, int64_t n) {
    if (sa == 1 && sb == 1) {
        float acc[8] = {0};
        int64_t d = 0;
        for (; d + 8 <= n; d += 8)
            for (int u = 0; u < 8; u++) acc[u] += a[d + u] * b[d + u];
        float s = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
        for (; d < n; d++) s += a[d] * b[d];
        return s;
    }
    float s = 0.0f;
    for (int64_t d = 0; d < n; d++) s += a[d * sa] * b[d * sb];
    return s;
}

/* y += alpha * x over n elements, strides sy, sx. */
static void axpy(float *y, int64_t sy, float alpha, const float *x, int64_t sx, int64_t n) {
    if (sy == 1 && sx == 1) {
        for (int64_t d = 0; d < n; d++) y[d] += alpha * x[d];
        return;
    }
    for (int64_t d = 0; d < n; d++) y[d * sy] += alpha * x[d * sx];
}

/* Masked, scaled score of (b, h, i, j) for j inside the row's structural
 * range, through soft-capping and ALiBi (h a query head; K read at its K/V
 * head); -inf when an element mask removes it. dcap (optional): the
 * soft-cap's derivative there (attn_score_variants). */
static inline float score(const attn_problem *pr, const attn_tensor *q, const attn_tensor *k,
                          int64_t b, int64_t h, int64_t i, int64_t j, float *dcap) {
    if (dcap) *dcap = 1.0f;
    if (pr->bmask && !pr->bmask[b * pr->bms[0] + h * pr->bms[1] + i * pr->bms[2] + j * pr->bms[3]])
        return -INFINITY;
    float s = pr->scale * dot(at(q, b, h, i), q->stride[3], at(k, b, attn_kv_head(pr, h), j),
                              k->stride[3], pr->Dk);
    s = attn_score_variants(pr, h, i, j, s, dcap);
    if (pr->amask)
        s += pr->amask[b * pr->ams[0] + h * pr->ams[1] + i * pr->ams[2] + j * pr->ams[3]];
    return s;
}

/* Dropout multiplier of (b, h, i, j): 0 or 1/(1-p). */
static inline float drop_mult(const attn_problem *pr, int64_t b, int64_t h, int64_t i, int64_t j) {
    uint32_t w[4];
    attn_philox_block(pr->drop_key, b + pr->drop_b0, h, i, j >> 2, w);
    return w[j & 3] < pr->drop_threshold ? 0.0f : pr->keep_scale;
}

attn_status attn_sdpa_reference_forward(const attn_problem *pr, const attn_tensor *q,
                                        const attn_tensor *k, const attn_tensor *v,
                                        attn_tensor *out, float *weights, float *lse,
                                        attn_error *err) {
    if (pr->dtype != ATTN_F32) { /* bf16: exactly converted, then fp32 (the oracle) */
        attn_bf16_f32 w;
        attn_status s = attn_bf16_widen(pr, q, k, v, out, NULL, 0, &w, err);
        if (s) return s;
        s = attn_sdpa_reference_forward(&w.pr, &w.q, &w.k, &w.v, &w.out, weights, lse, err);
        if (!s) attn_bf16_narrow_out(&w, pr, out);
        attn_bf16_free(&w);
        return s;
    }
    const int64_t B = pr->B, H = pr->H, Lq = pr->Lq, Lk = pr->Lk, Dv = pr->Dv;
    const int nt = pr->threads;
    float *scratch = NULL; /* [threads, Lk] score rows when weights are not wanted */
    if (!weights) {
        scratch = malloc((size_t)nt * (size_t)(Lk > 0 ? Lk : 1) * sizeof(float));
        if (!scratch)
            return attn_fail(err, ATTN_ERR_NOMEM, "out of memory for %d x %lld scores", nt,
                             (long long)Lk);
    }
    const int64_t rows = B * H * Lq;
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        const int64_t b = r / (H * Lq), h = (r / Lq) % H, i = r % Lq;
        float *s = weights ? weights + r * Lk : scratch + (int64_t)omp_get_thread_num() * Lk;
        float *o = at_mut(out, b, h, i);
        const int64_t so = out->stride[3];
        int64_t lo, hi;
        attn_row_range(pr, b, i, &lo, &hi);
        float m = -INFINITY;
        int nan = 0;
        const int64_t g = attn_kv_head(pr, h);
        for (int64_t j = lo; j < hi; j++) {
            float x = score(pr, q, k, b, h, i, j, NULL);
            s[j] = x;
            nan |= x != x;
            m = x > m ? x : m;
        }
        for (int64_t d = 0; d < Dv; d++) o[d * so] = 0.0f;
        if (weights) {
            for (int64_t j = 0; j < lo; j++) s[j] = 0.0f;
            for (int64_t j = hi > lo ? hi : lo; j < Lk; j++) s[j] = 0.0f;
        }
        if (nan || m == INFINITY) { /* poisoned row: NaN out, weights and lse */
            for (int64_t d = 0; d < Dv; d++) o[d * so] = NAN;
            if (weights)
                for (int64_t j = lo; j < hi; j++) s[j] = NAN;
            if (lse) lse[r] = NAN;
            continue;
        }
        const float sink = pr->sinks ? pr->sinks[h] : -INFINITY;
        if (m == -INFINITY) { /* no visible key: zeros, lse -inf (with a sink: its logit) */
            if (weights)
                for (int64_t j = lo; j < hi; j++) s[j] = 0.0f;
            if (lse) lse[r] = sink;
            continue;
        }
        if (sink > m) m = sink; /* the sink joins the max and the sum */
        float l = sink == -INFINITY ? 0.0f : expf(sink - m);
        for (int64_t j = lo; j < hi; j++) {
            s[j] = expf(s[j] - m);
            l += s[j];
        }
        const float inv = 1.0f / l;
        for (int64_t j = lo; j < hi; j++) {
            float pj = s[j] * inv;
            s[j] = pj;
            if (pr->dropout) pj *= drop_mult(pr, b, h, i, j);
            if (pj != 0.0f) axpy(o, so, pj, at(v, b, g, j), v->stride[3], Dv);
        }
        if (lse) lse[r] = m + logf(l);
    }
    free(scratch);
    return ATTN_OK;
}

attn_status attn_sdpa_reference_backward(const attn_problem *pr, const attn_tensor *q,
                                         const attn_tensor *k, const attn_tensor *v,
                                         const attn_tensor *out, const float *lse,
                                         const attn_tensor *dout, attn_tensor *dq, attn_tensor *dk,
                                         attn_tensor *dv, double *sink_acc, attn_error *err) {
    if (pr->dtype != ATTN_F32) {
        attn_bf16_f32 w;
        attn_status s = attn_bf16_widen(pr, q, k, v, out, dout, 1, &w, err);
        if (s) return s;
        s = attn_sdpa_reference_backward(&w.pr, &w.q, &w.k, &w.v, &w.out, lse, &w.dout, dq, dk, dv,
                                         sink_acc, err);
        attn_bf16_free(&w);
        return s;
    }
    const int64_t B = pr->B, H = pr->H, Lq = pr->Lq, Lk = pr->Lk, Dk = pr->Dk, Dv = pr->Dv;
    const int64_t sq = q->stride[3], sk = k->stride[3], sv = v->stride[3], so = out->stride[3];
    const int64_t sdo = dout->stride[3], sdq = dq->stride[3], sdk = dk->stride[3],
                  sdv = dv->stride[3];
    /* One (b, K/V head g) per task: its dK, dV rows are written by that
     * thread only, summed over the group's query heads in head order. */
    const int64_t Hkv = pr->Hkv, G = pr->group;
    /* the sinks' gradient per (b, h): −Σ_i p_sink·Σ_j P_ij dP_ij (D_i from
     * the recomputed P, not dO·O: O may be rounded to bf16), then over b */
    double *sg = NULL;
    if (sink_acc && pr->sinks) {
        sg = calloc((size_t)(B * H), sizeof *sg);
        if (!sg) return attn_fail(err, ATTN_ERR_NOMEM, "out of memory for the sinks' gradient");
    }
#pragma omp parallel for num_threads(pr->threads) schedule(dynamic, 1)
    for (int64_t bg = 0; bg < B * Hkv; bg++) {
        const int64_t b = bg / Hkv, g = bg % Hkv;
        for (int64_t j = 0; j < Lk; j++) {
            float *gk = at_mut(dk, b, g, j), *gv = at_mut(dv, b, g, j);
            for (int64_t d = 0; d < Dk; d++) gk[d * sdk] = 0.0f;
            for (int64_t d = 0; d < Dv; d++) gv[d * sdv] = 0.0f;
        }
        for (int64_t h = g * G; h < (g + 1) * G; h++) {
            const int64_t bh = b * H + h;
            for (int64_t i = 0; i < Lq; i++) {
                float *gq = at_mut(dq, b, h, i);
                for (int64_t d = 0; d < Dk; d++) gq[d * sdq] = 0.0f;
                const float li = lse[bh * Lq + i];
                if (li == -INFINITY) continue; /* row saw no key: zero gradient */
                const float *go = at(dout, b, h, i), *qi = at(q, b, h, i);
                /* D_i = rowsum(dO ∘ O) = Σ_j P_ij dP_ij, also with dropout. */
                const float Di = dot(go, sdo, at(out, b, h, i), so, Dv);
                int64_t lo, hi;
                attn_row_range(pr, b, i, &lo, &hi);
                float Dx = 0.0f; /* Σ_j P_ij dP_ij */
                for (int64_t j = lo; j < hi; j++) {
                    float dcap;
                    const float x = score(pr, q, k, b, h, i, j, &dcap);
                    if (x == -INFINITY) continue;
                    const float pij = expf(x - li);
                    const float mult = pr->dropout ? drop_mult(pr, b, h, i, j) : 1.0f;
                    const float *vj = at(v, b, g, j), *kj = at(k, b, g, j);
                    const float dpij = mult * dot(go, sdo, vj, sv, Dv);
                    Dx += pij * dpij;
                    if (mult != 0.0f) axpy(at_mut(dv, b, g, j), sdv, pij * mult, go, sdo, Dv);
                    /* through the soft-cap: dS_raw = dS · (1 − tanh²) */
                    float ds = pr->scale * pij * (dpij - Di);
                    if (pr->softcap > 0.0f) ds *= dcap;
                    axpy(gq, sdq, ds, kj, sk, Dk);
                    axpy(at_mut(dk, b, g, j), sdk, ds, qi, sq, Dk);
                }
                if (sg) sg[bh] -= exp((double)pr->sinks[h] - (double)li) * (double)Dx;
            }
        }
    }
    if (sg) {
        for (int64_t h = 0; h < H; h++)
            for (int64_t b = 0; b < B; b++) sink_acc[h] += sg[b * H + h];
        free(sg);
    }
    return ATTN_OK;
}
