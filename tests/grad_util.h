/* fp64 helpers for the gradient and dropout tests: an SDPA forward and its
 * analytic backward with every mask and explicit dropout multipliers, a
 * central finite-difference checker, strided test views, and a reader of the
 * library's dropout keep mask that uses only the public API.
 *
 * The dropout mask is read with the identity trick: a forward with V = I
 * (Dv = Lk) gives out[b,h,i,j] = P_ij * mult_ij and weights (pre-dropout)
 * give P_ij, so mult_ij = out / weights wherever weights > 0. It relies on
 * the documented property that the keep decision of (b, h, i, j) does not
 * depend on Dv (or on q, k, masks), so a mask read this way is the mask of
 * any call with the same (B, H, Lq, Lk), seed and offset. */
#ifndef ATTN_GRAD_UTIL_H
#define ATTN_GRAD_UTIL_H

#include "ref_oracle.h"

/* ------------------------------------------------------------ views */

enum { GU_BHLD, GU_BLHD, GU_PADDED, GU_INNER2, GU_LAYOUTS };
static const char *const gu_lay_name[GU_LAYOUTS] = {"bhld", "blhd", "padded", "inner-stride-2"};

/* A [B,H,L,D] view over its own buffer; every float of the buffer (gaps
 * included) starts as `fill`. */
typedef struct {
    attn_tensor t;
    float *buf;
    size_t n;
} gu_view;

static inline gu_view gu_make_view(int lay, int64_t B, int64_t H, int64_t L, int64_t D,
                                   float fill) {
    gu_view v;
    int64_t *dim = v.t.dim, *st = v.t.stride;
    dim[0] = B, dim[1] = H, dim[2] = L, dim[3] = D;
    switch (lay) {
    case GU_BLHD: /* packed [B, L, H, D] */
        st[3] = 1, st[1] = D, st[2] = H * D, st[0] = L * H * D;
        break;
    case GU_PADDED: /* gaps after every row, head and batch */
        st[3] = 1, st[2] = D + 3, st[1] = L * (D + 3) + 5, st[0] = H * st[1] + 7;
        break;
    case GU_INNER2: /* every other float, heads outermost */
        st[3] = 2, st[2] = 2 * D + 1, st[0] = L * st[2], st[1] = B * st[0];
        break;
    default: st[3] = 1, st[2] = D, st[1] = L * D, st[0] = H * L * D; break;
    }
    v.n = tu_span(dim, st);
    v.buf = tu_malloc(v.n * sizeof(float));
    for (size_t i = 0; i < v.n; i++) v.buf[i] = fill;
    v.t.data = v.buf;
    return v;
}

static inline void gu_fill_view(gu_view *v, tu_rng *r, float lo, float hi) {
    const attn_tensor *t = &v->t;
    for (int64_t b = 0; b < t->dim[0]; b++)
        for (int64_t h = 0; h < t->dim[1]; h++)
            for (int64_t l = 0; l < t->dim[2]; l++)
                for (int64_t d = 0; d < t->dim[3]; d++)
                    v->buf[tu_off(t, b, h, l, d)] = lo + (hi - lo) * (float)tu_unif(r);
}

/* Number of buffer floats outside the view that no longer hold `fill`. */
static inline size_t gu_gaps_touched(const gu_view *v, float fill) {
    unsigned char *in = tu_malloc(v->n);
    memset(in, 0, v->n);
    const attn_tensor *t = &v->t;
    for (int64_t b = 0; b < t->dim[0]; b++)
        for (int64_t h = 0; h < t->dim[1]; h++)
            for (int64_t l = 0; l < t->dim[2]; l++)
                for (int64_t d = 0; d < t->dim[3]; d++) in[tu_off(t, b, h, l, d)] = 1;
    size_t bad = 0;
    for (size_t i = 0; i < v->n; i++) bad += !in[i] && memcmp(&v->buf[i], &fill, sizeof fill) != 0;
    free(in);
    return bad;
}

/* ------------------------------------------------------------ fp64 SDPA */

typedef struct {
    int64_t B, H, Lq, Lk, Dk, Dv;
} gu_dims;

static inline double gu_scale(const attn_sdpa_params *p, int64_t Dk) {
    return p->use_scale ? (double)p->scale : 1.0 / sqrt((double)Dk);
}

/* Row (b, h, i): masked, scaled scores into s[Lk], visibility into in[Lk];
 * P (softmax over visible keys) into P[Lk]. Returns 0 when no key is
 * visible (P all 0). */
static inline int gu_row_softmax(const gu_dims *d, const double *q, const double *k,
                                 const attn_sdpa_params *p, int64_t b, int64_t h, int64_t i,
                                 double *P) {
    const int64_t bh = b * d->H + h;
    const double scale = gu_scale(p, d->Dk);
    const double *qi = q + (bh * d->Lq + i) * d->Dk;
    double m = -INFINITY;
    int any = 0;
    for (int64_t j = 0; j < d->Lk; j++) {
        P[j] = -INFINITY;
        if (!ref_visible(p, b, h, i, j, d->Lq, d->Lk)) continue;
        const double *kj = k + (bh * d->Lk + j) * d->Dk;
        double s = 0.0;
        for (int64_t x = 0; x < d->Dk; x++) s += qi[x] * kj[x];
        s *= scale;
        if (p->add_mask)
            s += (double)((const float *)p->add_mask->data)[ref_mask_off(p->add_mask, b, h, i, j)];
        if (s == -INFINITY) continue;
        P[j] = s;
        any = 1;
        if (s > m) m = s;
    }
    if (!any) {
        for (int64_t j = 0; j < d->Lk; j++) P[j] = 0.0;
        return 0;
    }
    double sum = 0.0;
    for (int64_t j = 0; j < d->Lk; j++) {
        P[j] = P[j] == -INFINITY ? 0.0 : exp(P[j] - m);
        sum += P[j];
    }
    for (int64_t j = 0; j < d->Lk; j++) P[j] /= sum;
    return 1;
}

/* O = (P ∘ mult) V with contiguous [B,H,L,D] doubles; mult [B,H,Lq,Lk] or
 * NULL (no dropout). */
static inline void gu_sdpa_fwd(const gu_dims *d, const double *q, const double *k, const double *v,
                               const attn_sdpa_params *p, const double *mult, double *out) {
    double *P = tu_malloc((size_t)d->Lk * sizeof(double));
    for (int64_t b = 0; b < d->B; b++)
        for (int64_t h = 0; h < d->H; h++)
            for (int64_t i = 0; i < d->Lq; i++) {
                const int64_t bh = b * d->H + h, row = bh * d->Lq + i;
                double *o = out + row * d->Dv;
                for (int64_t x = 0; x < d->Dv; x++) o[x] = 0.0;
                if (!gu_row_softmax(d, q, k, p, b, h, i, P)) continue;
                for (int64_t j = 0; j < d->Lk; j++) {
                    const double w = P[j] * (mult ? mult[row * d->Lk + j] : 1.0);
                    if (w == 0.0) continue;
                    const double *vj = v + (bh * d->Lk + j) * d->Dv;
                    for (int64_t x = 0; x < d->Dv; x++) o[x] += w * vj[x];
                }
            }
    free(P);
}

/* Analytic gradients of L = Σ dO ∘ O (dq, dk, dv overwritten):
 *   dV_j = Σ_i P_ij m_ij dO_i,  dP_ij = m_ij dO_i·V_j,
 *   dS_ij = P_ij (dP_ij - Σ_k P_ik dP_ik),
 *   dQ_i = scale Σ_j dS_ij K_j,  dK_j = scale Σ_i dS_ij Q_i. */
static inline void gu_sdpa_bwd(const gu_dims *d, const double *q, const double *k, const double *v,
                               const double *dout, const attn_sdpa_params *p, const double *mult,
                               double *dq, double *dk, double *dv) {
    const double scale = gu_scale(p, d->Dk);
    memset(dq, 0, (size_t)(d->B * d->H * d->Lq * d->Dk) * sizeof(double));
    memset(dk, 0, (size_t)(d->B * d->H * d->Lk * d->Dk) * sizeof(double));
    memset(dv, 0, (size_t)(d->B * d->H * d->Lk * d->Dv) * sizeof(double));
    double *P = tu_malloc((size_t)d->Lk * sizeof(double));
    double *dP = tu_malloc((size_t)d->Lk * sizeof(double));
    for (int64_t b = 0; b < d->B; b++)
        for (int64_t h = 0; h < d->H; h++)
            for (int64_t i = 0; i < d->Lq; i++) {
                const int64_t bh = b * d->H + h, row = bh * d->Lq + i;
                if (!gu_row_softmax(d, q, k, p, b, h, i, P)) continue;
                const double *go = dout + row * d->Dv, *qi = q + row * d->Dk;
                double Di = 0.0;
                for (int64_t j = 0; j < d->Lk; j++) {
                    dP[j] = 0.0;
                    if (P[j] == 0.0) continue;
                    const double m = mult ? mult[row * d->Lk + j] : 1.0;
                    const double *vj = v + (bh * d->Lk + j) * d->Dv;
                    double *gv = dv + (bh * d->Lk + j) * d->Dv;
                    double acc = 0.0;
                    for (int64_t x = 0; x < d->Dv; x++) {
                        acc += go[x] * vj[x];
                        gv[x] += P[j] * m * go[x];
                    }
                    dP[j] = m * acc;
                    Di += P[j] * dP[j];
                }
                double *gq = dq + row * d->Dk;
                for (int64_t j = 0; j < d->Lk; j++) {
                    if (P[j] == 0.0) continue;
                    const double ds = scale * P[j] * (dP[j] - Di);
                    const double *kj = k + (bh * d->Lk + j) * d->Dk;
                    double *gk = dk + (bh * d->Lk + j) * d->Dk;
                    for (int64_t x = 0; x < d->Dk; x++) {
                        gq[x] += ds * kj[x];
                        gk[x] += ds * qi[x];
                    }
                }
            }
    free(P);
    free(dP);
}

/* Entries of dq, dk, dv that receive no term at all (structural zeros):
 * rq[B*H*Lq] = 1 for a query row that sees no key, rk[B*H*Lk] = 1 for a key
 * no query sees, rv[B*H*Lk] = 1 for a key with P·mult = 0 in every row (not
 * seen, or dropped wherever seen). A row that sees exactly one key has
 * dq = 0 only by cancellation (P = 1, dS = dP - dP): not structural. */
static inline void gu_structural_zeros(const gu_dims *d, const double *q, const double *k,
                                       const attn_sdpa_params *p, const double *mult,
                                       unsigned char *rq, unsigned char *rk, unsigned char *rv) {
    double *P = tu_malloc((size_t)d->Lk * sizeof(double));
    memset(rk, 1, (size_t)(d->B * d->H * d->Lk));
    memset(rv, 1, (size_t)(d->B * d->H * d->Lk));
    for (int64_t b = 0; b < d->B; b++)
        for (int64_t h = 0; h < d->H; h++)
            for (int64_t i = 0; i < d->Lq; i++) {
                const int64_t bh = b * d->H + h, row = bh * d->Lq + i;
                rq[row] = (unsigned char)!gu_row_softmax(d, q, k, p, b, h, i, P);
                for (int64_t j = 0; j < d->Lk; j++)
                    if (P[j] > 0.0) {
                        rk[bh * d->Lk + j] = 0;
                        if (!mult || mult[row * d->Lk + j] != 0.0) rv[bh * d->Lk + j] = 0;
                    }
            }
    free(P);
}

/* got[rows, D] must be exactly 0 (and not NaN) on every row flagged in z;
 * returns the number of offending elements, *count the flagged elements. */
static inline size_t gu_rows_not_zero(const float *got, const unsigned char *z, size_t rows,
                                      int64_t D, size_t *count) {
    size_t bad = 0, c = 0;
    for (size_t r = 0; r < rows; r++)
        if (z[r])
            for (int64_t x = 0; x < D; x++, c++) bad += got[r * (size_t)D + (size_t)x] != 0.0f;
    if (count) *count = c;
    return bad;
}

static inline double gu_dot(const double *a, const double *b, size_t n) {
    double s = 0.0;
    for (size_t i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

/* ------------------------------------------------------------ FD */

/* Scalar loss of the current parameters. */
typedef double (*gu_loss_fn)(void *ctx);

/* Central differences (L(x+h) - L(x-h)) / 2h for every step-th element of
 * x[n] (step 1: all), compared with grad[n]; returns max |fd - grad|. x is
 * restored. */
static inline double gu_fd_maxerr(double *x, size_t n, size_t step, const double *grad, double h,
                                  gu_loss_fn loss, void *ctx) {
    double worst = 0.0;
    for (size_t i = 0; i < n; i += step) {
        const double x0 = x[i];
        x[i] = x0 + h;
        const double lp = loss(ctx);
        x[i] = x0 - h;
        const double lm = loss(ctx);
        x[i] = x0;
        const double e = fabs((lp - lm) / (2.0 * h) - grad[i]);
        if (!(e <= worst)) /* NaN sticks */
            worst = e;
    }
    return worst;
}

static inline double gu_maxabs_d(const double *x, size_t n) {
    double m = 0.0;
    for (size_t i = 0; i < n; i++)
        if (fabs(x[i]) > m) m = fabs(x[i]);
    return m;
}

/* max |got - want| / max|want| (max|want| floored at `floor`); NaN or inf
 * in got gives +inf. */
static inline double gu_relerr(const float *got, const double *want, size_t n, double floor) {
    double s = gu_maxabs_d(want, n);
    if (s < floor) s = floor;
    double m = 0.0;
    for (size_t i = 0; i < n; i++) {
        double e = isfinite(got[i]) ? fabs((double)got[i] - want[i]) : INFINITY;
        if (e > m) m = e;
    }
    return m / s;
}

/* Like gu_relerr, but non-finite values must match (tu_maxdiff): max
 * |got - want| / max(max|want|, floor). */
static inline double gu_relerr_nf(const float *got, const double *want, size_t n, double floor) {
    double m = 0.0;
    for (size_t i = 0; i < n; i++) m = fmax(m, fabs(want[i]));
    return tu_maxdiff(got, want, n) / fmax(m, floor);
}

/* ------------------------------------------------------------ dropout mask */

/* The library's dropout multipliers for a call of shape (B, H, Lq, Lk) with
 * params p (masks, seed, offset, dropout_p, training, impl), read through the
 * public forward with q = k = 0 (Dk = 1) and V = I (Dv = Lk). mult[B,H,Lq,Lk]
 * gets 0 or 1/(1-p) where the key is visible, 0 elsewhere; visible (may be
 * NULL) gets 1 where weights > 0. Returns the number of visible entries
 * whose out/weights ratio is neither 0 nor the keep scale (should be 0), or
 * -1 when the forward fails. */
static inline long gu_dropout_mult(int64_t B, int64_t H, int64_t Lq, int64_t Lk,
                                   const attn_sdpa_params *p, double *mult,
                                   unsigned char *visible) {
    const size_t nq = (size_t)(B * H * Lq), nk = (size_t)(B * H * Lk), nw = nq * (size_t)Lk;
    float *q = tu_malloc(nq * sizeof(float)), *k = tu_malloc(nk * sizeof(float));
    float *v = tu_malloc(nk * (size_t)Lk * sizeof(float)), *o = tu_malloc(nw * sizeof(float));
    float *w = tu_malloc(nw * sizeof(float));
    memset(q, 0, nq * sizeof(float));
    memset(k, 0, nk * sizeof(float));
    memset(v, 0, nk * (size_t)Lk * sizeof(float));
    for (int64_t bh = 0; bh < B * H; bh++)
        for (int64_t j = 0; j < Lk; j++) v[(bh * Lk + j) * Lk + j] = 1.0f;
    attn_tensor tq = attn_tensor_bhld(q, B, H, Lq, 1), tk = attn_tensor_bhld(k, B, H, Lk, 1),
                tv = attn_tensor_bhld(v, B, H, Lk, Lk), to = attn_tensor_bhld(o, B, H, Lq, Lk);
    attn_sdpa_params pp = *p;
    pp.use_scale = 1, pp.scale = 1.0f; /* q = 0: the scale does not matter, Dk = 1 */
    long bad = 0;
    attn_error err;
    if (attn_sdpa_forward(&tq, &tk, &tv, &pp, &to, w, NULL, NULL, &err) != ATTN_OK) {
        fprintf(stderr, "gu_dropout_mult: %s\n", err.message);
        bad = -1;
    } else {
        const double keep = 1.0 / (1.0 - (double)p->dropout_p);
        const int active = p->training && p->dropout_p > 0.0f;
        for (size_t x = 0; x < nw; x++) {
            double m = 0.0;
            if (w[x] > 0.0f) {
                m = (double)o[x] / (double)w[x];
                if (m != 0.0) {
                    if (fabs(m - (active ? keep : 1.0)) <= 1e-6 * keep)
                        m = active ? keep : 1.0;
                    else
                        bad++;
                }
            } else if (o[x] != 0.0f) {
                bad++;
            }
            mult[x] = m;
            if (visible) visible[x] = w[x] > 0.0f;
        }
    }
    free(q), free(k), free(v), free(o), free(w);
    return bad;
}

#endif /* ATTN_GRAD_UTIL_H */
