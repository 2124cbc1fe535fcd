/* The bf16 fused forward on any CPU: the per-ISA functions of
 * sdpa_fused_bf16.h in plain C, the bf16 pairs converted to fp32 (exact)
 * and multiplied-added in fp32; P rounded to bf16 as with VDPBF16PS.
 * Built without instruction-set flags (the compiler's auto-vectorisation),
 * and a second time as sdpa_fused_bf16_avx2.c with AVX2 (wider vectors,
 * fp contraction off: the same results bit for bit). */
#include "sdpa_bf16.h"

#define BMR 4

static inline float lo_f(uint32_t x) { return attn_bf16_to_f32((uint16_t)(x & 0xffffu)); }
static inline float hi_f(uint32_t x) { return attn_bf16_to_f32((uint16_t)(x >> 16)); }

static void pv_tile(int nr, const uint32_t *pd, int64_t nkp, const uint32_t *vp, int64_t dvp,
                    float *O) {
    for (int r = 0; r < nr; r++) {
        float *o = O + r * dvp;
        for (int64_t t = 0; t < nkp; t++) {
            const float a0 = lo_f(pd[r * 48 + t]), a1 = hi_f(pd[r * 48 + t]);
            const uint32_t *b = vp + t * dvp;
            for (int64_t d = 0; d < dvp; d++) o[d] = o[d] + a0 * lo_f(b[d]) + a1 * hi_f(b[d]);
        }
    }
}

static inline float row_max(const float *s, int64_t nvec) {
    float m = s[0];
    for (int64_t j = 1; j < 16 * nvec; j++) m = s[j] > m ? s[j] : m;
    return m;
}

/* s[j] = cap·tanh(s[j]/cap) for j < n (libm, the reference's function);
 * dcap[j] (optional) = 1 - tanh². */
static inline void softcap_row(float *s, int64_t n, float cap, float *dcap) {
    for (int64_t j = 0; j < n; j++) {
        const float t = tanhf(s[j] / cap);
        s[j] = cap * t;
        if (dcap) dcap[j] = 1.0f - t * t;
    }
}

static inline float exp_row(float *s, float c, float m, int64_t nvec) {
    float sum = 0.0f;
    for (int64_t j = 0; j < 16 * nvec; j++) {
        s[j] = expf(s[j] * c - m); /* no fmaf: software on a CPU without FMA */
        sum += s[j];
    }
    return sum;
}

/* Decode scores from the rows: pairs along d in order, as gemm_pairs on packed K. */
static void qk_direct(int nr, const uint16_t *const *q, const uint16_t *k, int64_t ks, int64_t nk,
                      int64_t D, float *S) {
    for (int r = 0; r < nr; r++) {
        for (int64_t j = 0; j < nk; j++) {
            const uint16_t *kr = k + j * ks;
            float s = 0.0f;
            int64_t d = 0;
            for (; d + 1 < D; d += 2)
                s = s + attn_bf16_to_f32(q[r][d]) * attn_bf16_to_f32(kr[d]) +
                    attn_bf16_to_f32(q[r][d + 1]) * attn_bf16_to_f32(kr[d + 1]);
            if (d < D) s = s + attn_bf16_to_f32(q[r][d]) * attn_bf16_to_f32(kr[d]);
            S[r * 96 + j] = s;
        }
        for (int64_t j = nk; j < 96; j++) S[r * 96 + j] = 0.0f;
    }
}

/* Decode P·V from V's rows, keys paired (2t, 2t + 1) as pv_tile. */
static void pv_direct(int nr, const uint32_t *pd, const uint16_t *v, int64_t vs, int64_t nk,
                      int64_t Dv, int64_t dvp, float *O) {
    for (int r = 0; r < nr; r++) {
        float *o = O + r * dvp;
        for (int64_t t = 0; 2 * t < nk; t++) {
            const float a0 = lo_f(pd[r * 48 + t]), a1 = hi_f(pd[r * 48 + t]);
            const uint16_t *v0 = v + 2 * t * vs, *v1 = v0 + vs;
            if (2 * t + 1 < nk)
                for (int64_t d = 0; d < Dv; d++)
                    o[d] = o[d] + a0 * attn_bf16_to_f32(v0[d]) + a1 * attn_bf16_to_f32(v1[d]);
            else
                for (int64_t d = 0; d < Dv; d++) o[d] = o[d] + a0 * attn_bf16_to_f32(v0[d]) + a1 * 0.0f;
        }
    }
}

/* The backward's products: C[r][c] (+)= Σ_t dot2(A[r·ars + t·ats],
 * B[t·ldb + c]), c < 16 nvec. */
static void gemm_pairs(int64_t nr, int64_t nvec, int zero, const uint32_t *A, int64_t ars,
                       int64_t ats, int64_t nt, const uint32_t *B, int64_t ldb, float *C,
                       int64_t ldc) {
    const int64_t nc = 16 * nvec;
    for (int64_t r = 0; r < nr; r++) {
        float *c = C + r * ldc;
        if (zero)
            for (int64_t j = 0; j < nc; j++) c[j] = 0.0f;
        for (int64_t t = 0; t < nt; t++) {
            const uint32_t x = A[r * ars + t * ats];
            const float a0 = lo_f(x), a1 = hi_f(x);
            const uint32_t *b = B + t * ldb;
            for (int64_t j = 0; j < nc; j++) c[j] = c[j] + a0 * lo_f(b[j]) + a1 * hi_f(b[j]);
        }
    }
}

/* The forward's S = Q·Kᵀ of a tile and each row's row_max. */
static void qk_tile(int64_t nr, int64_t nvec, const uint32_t *qd, int64_t np, const uint32_t *kp,
                    float *S, float *rmax) {
    gemm_pairs(nr, nvec, 1, qd, np, 1, np, kp, 96, S, 96);
    for (int64_t r = 0; r < nr; r++) rmax[r] = row_max(S + r * 96, nvec);
}

static void pair_rows(const float *x0, const float *x1, int64_t nvec, uint32_t *dst) {
    for (int64_t j = 0; j < 16 * nvec; j++)
        dst[j] = (uint32_t)attn_bf16_round(x0[j]) | (x1 ? (uint32_t)attn_bf16_round(x1[j]) << 16 : 0u);
}

static void round_pairs(const float *s, int64_t nvec, uint32_t *pd) {
    for (int64_t t = 0; t < 8 * nvec; t++)
        pd[t] = (uint32_t)attn_bf16_round(s[2 * t]) | (uint32_t)attn_bf16_round(s[2 * t + 1]) << 16;
}

/* exp_row, then round_pairs: the forward's row without dropout. */
static inline float exp_round_row(float *s, float c, float m, int64_t nvec, uint32_t *pd) {
    const float sum = exp_row(s, c, m, nvec);
    round_pairs(s, nvec, pd);
    return sum;
}

static void bw_row(float *s, float *dp, int64_t nvec, float c, float lse, float D) {
    for (int64_t j = 0; j < 16 * nvec; j++) {
        const float p = expf(s[j] * c - lse);
        s[j] = p;
        dp[j] = p * (dp[j] - D);
    }
}

/* dst[p·ld + j] = word p of rows[j] (rows[j] NULL: 0), j < n, p < nw. */
static void transpose_words(const uint16_t *const *rows, int64_t n, int64_t nw, uint32_t *dst,
                            int64_t ld) {
    for (int64_t j = 0; j < n; j++)
        for (int64_t p = 0; p < nw; p++) {
            uint32_t x = 0;
            if (rows[j]) memcpy(&x, rows[j] + 2 * p, sizeof x);
            dst[p * ld + j] = x;
        }
}

#include "sdpa_fused_bf16.h"

#ifndef BF16_C_EXPORT /* sdpa_fused_bf16_avx2.c names its own */
#define BF16_C_EXPORT attn_fused_bf16_kernels_portable
#define BF16_C_NAME "portable"
#endif
const attn_fused_kernels BF16_C_EXPORT = FUSED_BF16_KERNELS(BF16_C_NAME);
