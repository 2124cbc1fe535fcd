/* molgen's dense layers (see layers.h): LayerNorm, linear, GELU. */
#include "nn/layers.h"

#include <math.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

/* The row loops are cloned (MG_CLONES in layers.h). Their sums are OpenMP
 * simd reductions: vectorised (an in-order sum is a serial chain of adds),
 * in an order fixed by the clone, so the same on every run of a machine. */

/* LayerNorm forward of rows [r0, r1). */
MG_CLONES static void layernorm_forward_rows(float *out, float *mean, float *rstd, const float *inp,
                                             const float *w, const float *b, int64_t r0, int64_t r1,
                                             int C) {
    for (int64_t r = r0; r < r1; r++) {
        const float *x = inp + r * C;
        float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
        for (int i = 0; i < C; i++) sum += x[i];
        const float m = sum / (float)C;
        float var = 0.0f;
#pragma omp simd reduction(+ : var)
        for (int i = 0; i < C; i++) var += (x[i] - m) * (x[i] - m);
        const float s = 1.0f / sqrtf(var / (float)C + MG_LN_EPS);
        float *o = out + r * C;
        for (int i = 0; i < C; i++) o[i] = (x[i] - m) * s * w[i] + b[i];
        if (mean) mean[r] = m;
        if (rstd) rstd[r] = s;
    }
}

/* out [R, C] = (inp - mean) * rstd * w + b;  mean, rstd [R] kept unless NULL. */
void mg_layernorm_forward(float *out, float *mean, float *rstd, const float *inp, const float *w,
                          const float *b, int64_t R, int C, int nt) {
#pragma omp parallel num_threads(nt)
    {
        int64_t r0, r1;
        mg_thread_range(R, &r0, &r1);
        layernorm_forward_rows(out, mean, rstd, inp, w, b, r0, r1, C);
    }
}

/* d(inp) of rows [r0, r1), added to dinp. */
MG_CLONES static void layernorm_backward_rows(float *dinp, const float *dout, const float *inp,
                                              const float *w, const float *mean, const float *rstd,
                                              int64_t r0, int64_t r1, int C) {
    for (int64_t r = r0; r < r1; r++) {
        const float *g = dout + r * C, *x = inp + r * C;
        const float m = mean[r], s = rstd[r];
        float dn_sum = 0.0f, dnx_sum = 0.0f; /* sums of dnorm, dnorm * norm */
#pragma omp simd reduction(+ : dn_sum, dnx_sum)
        for (int i = 0; i < C; i++) {
            const float dn = g[i] * w[i];
            dn_sum += dn;
            dnx_sum += dn * (x[i] - m) * s;
        }
        const float mean_dn = dn_sum / (float)C, mean_dnx = dnx_sum / (float)C;
        float *di = dinp + r * C;
        for (int i = 0; i < C; i++) {
            const float nrm = (x[i] - m) * s;
            di[i] += s * (g[i] * w[i] - mean_dn - nrm * mean_dnx);
        }
    }
}

/* Column sums over all rows run in chunks of COL_CHUNK columns whose
 * running sums stay in registers (local arrays, which cannot alias the
 * inputs) from the first row to the last: summed into the output row by
 * row, each row's update waited on the previous row's store, so the loop
 * ran at the store-to-load latency and a second thread (half the columns
 * each) made it no faster (perf, 2 threads: 3.7 % of a training step
 * against 0.6 % on one). Same additions in the same order: same bits. */
enum { COL_CHUNK = 32 };

/* dw, db [c0, c1) += the sums over all R rows (in row order). */
MG_CLONES static void layernorm_backward_params(float *dw, float *db, const float *dout,
                                                const float *inp, const float *mean,
                                                const float *rstd, int64_t R, int C, int64_t c0,
                                                int64_t c1) {
    int64_t i0 = c0;
    for (; i0 + COL_CHUNK <= c1; i0 += COL_CHUNK) {
        float aw[COL_CHUNK], ab[COL_CHUNK];
        for (int i = 0; i < COL_CHUNK; i++) aw[i] = dw[i0 + i], ab[i] = db[i0 + i];
        for (int64_t r = 0; r < R; r++) {
            const float *g = dout + r * C + i0, *x = inp + r * C + i0;
            const float m = mean[r], s = rstd[r];
            for (int i = 0; i < COL_CHUNK; i++) {
                aw[i] += g[i] * (x[i] - m) * s;
                ab[i] += g[i];
            }
        }
        for (int i = 0; i < COL_CHUNK; i++) dw[i0 + i] = aw[i], db[i0 + i] = ab[i];
    }
    for (int64_t r = 0; r < R && i0 < c1; r++) {
        const float *g = dout + r * C, *x = inp + r * C;
        const float m = mean[r], s = rstd[r];
        for (int64_t i = i0; i < c1; i++) {
            dw[i] += g[i] * (x[i] - m) * s;
            db[i] += g[i];
        }
    }
}

/* dinp [R, C] += LayerNorm backward of dout; dw, db [C] +=.
 * dinp is split over rows; dw/db over channel ranges (each sums its channels
 * over all rows in row order), in one parallel region. */
void mg_layernorm_backward(float *dinp, float *dw, float *db, const float *dout, const float *inp,
                           const float *w, const float *mean, const float *rstd, int64_t R, int C,
                           int nt) {
#pragma omp parallel num_threads(nt)
    {
        int64_t r0, r1, c0, c1;
        mg_thread_range(R, &r0, &r1);
        mg_thread_range(C, &c0, &c1);
        layernorm_backward_rows(dinp, dout, inp, w, mean, rstd, r0, r1, C);
        layernorm_backward_params(dw, db, dout, inp, mean, rstd, R, C, c0, c1);
    }
}

/* This thread's share of n items in an OpenMP region (layers.h). */
void mg_thread_range(int64_t n, int64_t *lo, int64_t *hi) {
    int nth = 1, id = 0;
#ifdef _OPENMP
    nth = omp_get_num_threads();
    id = omp_get_thread_num();
#endif
    *lo = n * id / nth;
    *hi = n * (id + 1) / nth;
}

mg_status mg_from_attn(attn_status s) {
    switch (s) {
    case ATTN_OK: return MG_OK;
    case ATTN_ERR_NOMEM: return MG_ERR_NOMEM;
    case ATTN_ERR_STATE: return MG_ERR_STATE;
    default: return MG_ERR_ARG; /* NULL, SHAPE, OVERFLOW, MASK, ARG: a bad call */
    }
}

static mg_status product_fail(mg_error *err, const attn_error *e) {
    return mg_fail(err, mg_from_attn(e->status), "%s", e->message);
}

/* The products are libattn's (attn_matmul): one BLAS policy in the
 * process, and results that do not depend on nt. */

/* out [R, C] += bias [C], each thread its rows. */
MG_CLONES static void bias_rows(float *restrict out, const float *restrict bias, int64_t r0,
                                int64_t r1, int C) {
    for (int64_t r = r0; r < r1; r++)
        for (int c = 0; c < C; c++) out[r * C + c] += bias[c];
}

void mg_bias_add(float *out, const float *bias, int64_t R, int C, int nt) {
#pragma omp parallel num_threads(nt)
    {
        int64_t r0, r1;
        mg_thread_range(R, &r0, &r1);
        bias_rows(out, bias, r0, r1, C);
    }
}

/* out [R, OC] = inp [R, IC] wᵀ + bias;  w [OC, IC], bias [OC] (may be NULL).
 * The product first, then the bias in a pass of both threads (a copy of
 * the bias into every row before a beta 1 product was one thread's serial
 * memcpy, 3 % of a training step); the same bits for IC up to the
 * products' K block (one accumulation: round(acc + bias) either way). */
mg_status mg_matmul_forward(float *out, const float *inp, const float *w, const float *bias,
                            int64_t R, int IC, int OC, mg_dtype dt, int nt, mg_error *err) {
    if (dt == MG_DT_BF16) {
        const mg_status rc = mg_gemm_bf16(0, 1, R, OC, IC, inp, IC, w, IC, 0.0f, out, OC, nt, err);
        if (rc) return rc;
    } else {
        attn_error e;
        if (attn_matmul(0, 1, R, OC, IC, 1.0f, inp, IC, w, IC, 0.0f, out, OC, nt, &e))
            return product_fail(err, &e);
    }
    if (bias) mg_bias_add(out, bias, R, OC, nt);
    return MG_OK;
}

/* dbias [c0, c1) += column sums of dout [R, C] in row order (vector lanes
 * across columns: each column's sum keeps its order). */
MG_CLONES static void colsum_range(float *restrict dbias, const float *restrict dout, int64_t R,
                                   int C, int64_t c0, int64_t c1) {
    int64_t j0 = c0; /* in chunks, as layernorm_backward_params */
    for (; j0 + COL_CHUNK <= c1; j0 += COL_CHUNK) {
        float a[COL_CHUNK];
        for (int j = 0; j < COL_CHUNK; j++) a[j] = dbias[j0 + j];
        for (int64_t r = 0; r < R; r++)
            for (int j = 0; j < COL_CHUNK; j++) a[j] += dout[r * C + j0 + j];
        for (int j = 0; j < COL_CHUNK; j++) dbias[j0 + j] = a[j];
    }
    for (int64_t r = 0; r < R && j0 < c1; r++)
        for (int64_t c = j0; c < c1; c++) dbias[c] += dout[r * C + c];
}

/* dinp [R, IC] = dout [R, OC] w (overwritten; skipped if NULL);
 * dw [OC, IC] += doutᵀ inp;  dbias [OC] += column sums of dout (each
 * thread its columns, summed in row order). */
mg_status mg_matmul_backward(float *dinp, float *dw, float *dbias, const float *dout,
                             const float *inp, const float *w, int64_t R, int IC, int OC,
                             mg_dtype dt, int nt, mg_error *err) {
    attn_error e;
    mg_status rc;
    if (dt == MG_DT_BF16) {
        if (dinp && (rc = mg_gemm_bf16(0, 0, R, IC, OC, dout, OC, w, IC, 0.0f, dinp, IC, nt, err)))
            return rc;
        if ((rc = mg_gemm_bf16(1, 0, OC, IC, R, dout, OC, inp, IC, 1.0f, dw, IC, nt, err)))
            return rc;
    } else {
        if (dinp && attn_matmul(0, 0, R, IC, OC, 1.0f, dout, OC, w, IC, 0.0f, dinp, IC, nt, &e))
            return product_fail(err, &e);
        if (attn_matmul(1, 0, OC, IC, R, 1.0f, dout, OC, inp, IC, 1.0f, dw, IC, nt, &e))
            return product_fail(err, &e);
    }
    if (dbias) {
#pragma omp parallel num_threads(nt)
        {
            int64_t c0, c1;
            mg_thread_range(OC, &c0, &c1);
            colsum_range(dbias, dout, R, OC, c0, c1);
        }
    }
    return MG_OK;
}

/* The attention block's projections: w is the block's packed attention
 * parameters (PyTorch's in_proj W [3d, d], in_proj b [3d], out_proj W
 * [d, d], out_proj b [d]). */
mg_status mg_attn_in_proj(float *qkv, const float *x, const float *w, int64_t R, int d, mg_dtype dt,
                          int nt, mg_error *err) {
    const int64_t D = d;
    return mg_matmul_forward(qkv, x, w, w + 3 * D * D, R, d, 3 * d, dt, nt, err);
}

#define GELU_K 0.7978845608028654f /* sqrt(2 / pi) */

/* sigmoid(z) for the GELU loops, in plain C that the compiler vectorises
 * (libm's expf/tanhf are a call per element: they were ~30% of a training
 * step). No float comparisons (which block if-conversion under the default
 * -ftrapping-math): |z| and the sign come from the bits, |z| is clamped at 87
 * with an integer min, then t = e^-|z| in (0, 1] by Cody-Waite reduction
 * x = n ln2 + r and Cephes' degree-6 polynomial for e^r (relative error
 * < 2e-7), and sigmoid = 1/(1+t) for z >= 0, t/(1+t) for z < 0. */
static inline float exp_nonpos(float x) {                                   /* x in [-87, 0] */
    const float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f; /* round(x/ln2) */
    const float r = (x - n * 0.693359375f) + n * 2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * (r * r) + r + 1.0f;
    const int32_t bits = ((int32_t)n + 127) << 23; /* 2^n, n in [-126, 0] */
    float two_n;
    memcpy(&two_n, &bits, sizeof two_n);
    return p * two_n;
}

static inline float fast_sigmoid(float z) {
    int32_t zb;
    memcpy(&zb, &z, sizeof zb);
    const int32_t neg = (int32_t)((uint32_t)zb >> 31);
    int32_t ab = zb & 0x7fffffff;
    ab = ab < 0x42ae0000 ? ab : 0x42ae0000; /* min(|z|, 87.0f) */
    float a;
    memcpy(&a, &ab, sizeof a);
    const float t = exp_nonpos(-a);
    const float inv = 1.0f / (1.0f + t);
    return inv * (1.0f + (float)neg * (t - 1.0f));
}

/* The GELU loops are cloned like the LayerNorm loops: as 4-wide SSE loops
 * they were ~10% of a training step (perf). */

static inline float gelu_of(float x) {
    const float u = GELU_K * (x + 0.044715f * x * x * x);
    return x * fast_sigmoid(2.0f * u);
}

/* out [n] = 0.5 x (1 + tanh(u)),  u = k (x + 0.044715 x³),
 * computed as x * sigmoid(2u) (the same function: 0.5 (1 + tanh(u)) =
 * 1 / (1 + exp(-2u))); with bias, x = inp + bias first, kept in inp.
 * Without a bias out may be inp (the KV decoder's call): that loop runs
 * through a local block, since GCC's vectoriser checks at run time that out
 * and inp do not overlap and ran the in-place call as scalar code (3.05
 * against 0.75 ns an element; the decoder's GELU was 10 % of an optimize
 * step, perf). The arithmetic is the same, element by element. */
enum { GELU_BLOCK = 256 };
MG_CLONES static void gelu_forward_range(float *out, float *inp, const float *bias, int64_t n) {
    if (bias) {
        for (int64_t i = 0; i < n; i++) {
            const float x = inp[i] + bias[i];
            inp[i] = x;
            out[i] = gelu_of(x);
        }
        return;
    }
    float x[GELU_BLOCK];
    for (int64_t i0 = 0; i0 < n; i0 += GELU_BLOCK) {
        const int64_t m = n - i0 < GELU_BLOCK ? n - i0 : GELU_BLOCK;
        memcpy(x, inp + i0, (size_t)m * sizeof *x);
        for (int64_t j = 0; j < m; j++) x[j] = gelu_of(x[j]);
        memcpy(out + i0, x, (size_t)m * sizeof *x);
    }
}

void mg_gelu_forward(float *out, float *inp, const float *bias, int64_t R, int C, int nt) {
#pragma omp parallel num_threads(nt)
    {
        int64_t lo, hi;
        if (bias) { /* by rows: each row adds the bias */
            mg_thread_range(R, &lo, &hi);
            for (int64_t r = lo; r < hi; r++)
                gelu_forward_range(out + r * C, inp + r * C, bias, C);
        } else {
            mg_thread_range(R * C, &lo, &hi);
            gelu_forward_range(out + lo, inp + lo, NULL, hi - lo);
        }
    }
}

/* dinp [n] = dout * gelu'(inp)  (dinp may alias dout). With s = sigmoid(2u):
 * gelu' = 0.5 (1 + tanh u) + 0.5 x (1 - tanh² u) u' = s + 2 x s (1 - s) u',
 * u' = k (1 + 3 * 0.044715 x²). */
MG_CLONES static void gelu_backward_range(float *dinp, const float *inp, const float *dout,
                                          int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        float x = inp[i];
        float u = GELU_K * (x + 0.044715f * x * x * x);
        float s = fast_sigmoid(2.0f * u);
        float du = GELU_K * (1.0f + 3.0f * 0.044715f * x * x);
        dinp[i] = dout[i] * (s + 2.0f * x * s * (1.0f - s) * du);
    }
}

void mg_gelu_backward(float *dinp, const float *inp, const float *dout, int64_t N, int nt) {
#pragma omp parallel num_threads(nt)
    {
        int64_t lo, hi;
        mg_thread_range(N, &lo, &hi);
        gelu_backward_range(dinp + lo, inp + lo, dout + lo, hi - lo);
    }
}
