/* Packed variable-length attention (attn_sdpa_varlen_*, entry points in
 * sdpa.c): validation of the cumulative lengths, the per-sequence problem
 * and views the kernels run on, and the reference path as a loop of padded
 * reference calls, one per sequence (the oracle, not a second copy). */
#include "internal.h"

#include <stdlib.h>
#include <string.h>

/* cu[0] = 0, non-decreasing, cu[n] = total; each prefix is checked against
 * total before it is used, so no later difference or sum overflows. */
static attn_status check_cu(const int64_t *cu, const char *name, int64_t n, int64_t total,
                            attn_error *err) {
    if (!cu) return attn_fail(err, ATTN_ERR_NULL, "%s is NULL", name);
    if (cu[0] != 0)
        return attn_fail(err, ATTN_ERR_SHAPE, "%s[0] = %lld, must be 0", name, (long long)cu[0]);
    for (int64_t s = 0; s < n; s++) {
        if (cu[s + 1] < cu[s])
            return attn_fail(err, ATTN_ERR_SHAPE,
                             "%s decreases: [%lld] = %lld after [%lld] = %lld (lengths are >= 0)",
                             name, (long long)(s + 1), (long long)cu[s + 1], (long long)s,
                             (long long)cu[s]);
        if (cu[s + 1] > total)
            return attn_fail(err, ATTN_ERR_SHAPE, "%s[%lld] = %lld exceeds the packed length %lld",
                             name, (long long)(s + 1), (long long)cu[s + 1], (long long)total);
    }
    if (cu[n] != total)
        return attn_fail(err, ATTN_ERR_SHAPE,
                         "%s[batch = %lld] = %lld, must be the packed length %lld", name,
                         (long long)n, (long long)cu[n], (long long)total);
    return ATTN_OK;
}

attn_status attn_varlen_check(const attn_tensor *q, const attn_tensor *k, const attn_tensor *v,
                              const attn_tensor *out, int64_t batch, const int64_t *cu_seqlens_q,
                              const int64_t *cu_seqlens_k, const attn_sdpa_params *p,
                              attn_problem *pr, attn_varlen *varlen, attn_error *err) {
    static const attn_sdpa_params defaults;
    if (!p) p = &defaults;
    *varlen = (attn_varlen){0};
    if (p->key_lengths || p->bool_mask || p->add_mask)
        return attn_fail(err, ATTN_ERR_ARG,
                         "varlen: key_lengths, bool_mask and add_mask are not taken (the "
                         "cumulative lengths are the padding; element masks need the padded call)");
    attn_status s = attn_sdpa_check(q, k, v, out, p, pr, err);
    if (s) return s;
    if (pr->B != 1)
        return attn_fail(err, ATTN_ERR_SHAPE,
                         "varlen: the packed tensors have dim B = 1 (the sequences lie back to "
                         "back along L), got B = %lld",
                         (long long)pr->B);
    if (batch < 1 || batch > (int64_t)UINT32_MAX)
        return attn_fail(err, ATTN_ERR_SHAPE, "varlen: batch = %lld must be in [1, 2^32)",
                         (long long)batch);
    if (pr->drop_b0 > ((int64_t)1 << 32) - batch)
        return attn_fail(err, ATTN_ERR_ARG, "varlen: dropout_row0 %lld + batch %lld exceeds 2^32",
                         (long long)pr->drop_b0, (long long)batch);
    if ((s = check_cu(cu_seqlens_q, "cu_seqlens_q", batch, pr->Lq, err)) ||
        (s = check_cu(cu_seqlens_k ? cu_seqlens_k : cu_seqlens_q,
                      cu_seqlens_k ? "cu_seqlens_k" : "cu_seqlens_k (NULL: cu_seqlens_q)", batch,
                      pr->Lk, err)))
        return s;
    int64_t *at = malloc((size_t)(batch + 1) * sizeof *at);
    if (!at)
        return attn_fail(err, ATTN_ERR_NOMEM, "out of memory for %lld offsets", (long long)batch);
    const int64_t *ck = cu_seqlens_k ? cu_seqlens_k : cu_seqlens_q;
    at[0] = 0;
    for (int64_t b = 0; b < batch; b++) {
        int64_t hq, cells;
        if (!attn_mul64(pr->H, cu_seqlens_q[b + 1] - cu_seqlens_q[b], &hq) ||
            !attn_mul64(hq, ck[b + 1] - ck[b], &cells) || !attn_add64(at[b], cells, &at[b + 1]) ||
            (uint64_t)at[b + 1] >= SIZE_MAX / sizeof(float)) {
            free(at);
            return attn_fail(
                err, ATTN_ERR_OVERFLOW,
                "varlen: sum of H*Lq*Lk over the sequences overflows (at sequence %lld)",
                (long long)b);
        }
    }
    varlen->n = batch;
    varlen->cu_q = cu_seqlens_q;
    varlen->cu_k = ck;
    varlen->weights_at = at;
    return ATTN_OK;
}

void attn_varlen_free(attn_varlen *varlen) {
    free(varlen->weights_at);
    varlen->weights_at = NULL;
}

void attn_varlen_seq(const attn_problem *pr, const attn_varlen *varlen, int64_t s,
                     attn_problem *sub) {
    *sub = *pr;
    sub->B = 1;
    sub->Lq = varlen->cu_q[s + 1] - varlen->cu_q[s];
    sub->Lk = varlen->cu_k[s + 1] - varlen->cu_k[s];
    sub->drop_b0 = pr->drop_b0 + s;
}

attn_tensor attn_varlen_rows(const attn_tensor *t, int64_t row0, int64_t n) {
    attn_tensor r = *t;
    if (n > 0) r.data += row0 * t->stride[2];
    r.dim[2] = n;
    return r;
}

/* H rows of n lse values, rows ld_dst / ld_src apart: the packed [H, total]
 * layout against one sequence's [H, n]. */
static void lse_copy(float *dst, int64_t ld_dst, const float *src, int64_t ld_src, int64_t H,
                     int64_t n) {
    for (int64_t h = 0; h < H; h++)
        memcpy(dst + h * ld_dst, src + h * ld_src, (size_t)n * sizeof(float));
}

static int64_t max_len(const int64_t *cu, int64_t n) {
    int64_t m = 1;
    for (int64_t s = 0; s < n; s++) m = cu[s + 1] - cu[s] > m ? cu[s + 1] - cu[s] : m;
    return m;
}

attn_status attn_varlen_reference_forward(const attn_problem *pr, const attn_varlen *varlen,
                                          const attn_tensor *q, const attn_tensor *k,
                                          const attn_tensor *v, attn_tensor *out, float *weights,
                                          float *lse, attn_error *err) {
    float *tmp =
        lse ? malloc((size_t)(pr->H * max_len(varlen->cu_q, varlen->n)) * sizeof(float)) : NULL;
    if (lse && !tmp) return attn_fail(err, ATTN_ERR_NOMEM, "out of memory for the lse rows");
    attn_status st = ATTN_OK;
    for (int64_t s = 0; s < varlen->n && !st; s++) {
        attn_problem sub;
        attn_varlen_seq(pr, varlen, s, &sub);
        if (sub.Lq == 0) continue;
        const int64_t q0 = varlen->cu_q[s], k0 = varlen->cu_k[s];
        attn_tensor qs = attn_varlen_rows(q, q0, sub.Lq), ks = attn_varlen_rows(k, k0, sub.Lk),
                    vs = attn_varlen_rows(v, k0, sub.Lk), os = attn_varlen_rows(out, q0, sub.Lq);
        st = attn_sdpa_reference_forward(
            &sub, &qs, &ks, &vs, &os, weights ? weights + varlen->weights_at[s] : NULL, tmp, err);
        if (!st && lse) lse_copy(lse + q0, pr->Lq, tmp, sub.Lq, pr->H, sub.Lq);
    }
    free(tmp);
    return st;
}

attn_status attn_varlen_reference_backward(const attn_problem *pr, const attn_varlen *varlen,
                                           const attn_tensor *q, const attn_tensor *k,
                                           const attn_tensor *v, const attn_tensor *out,
                                           const float *lse, const attn_tensor *dout,
                                           attn_tensor *dq, attn_tensor *dk, attn_tensor *dv,
                                           double *sink_acc, attn_error *err) {
    float *tmp = malloc((size_t)(pr->H * max_len(varlen->cu_q, varlen->n)) * sizeof(float));
    if (!tmp) return attn_fail(err, ATTN_ERR_NOMEM, "out of memory for the lse rows");
    attn_status st = ATTN_OK;
    for (int64_t s = 0; s < varlen->n && !st; s++) {
        attn_problem sub;
        attn_varlen_seq(pr, varlen, s, &sub);
        const int64_t q0 = varlen->cu_q[s], k0 = varlen->cu_k[s], nq = sub.Lq, nk = sub.Lk;
        attn_tensor qs = attn_varlen_rows(q, q0, nq), ks = attn_varlen_rows(k, k0, nk),
                    vs = attn_varlen_rows(v, k0, nk), os = attn_varlen_rows(out, q0, nq),
                    gs = attn_varlen_rows(dout, q0, nq), dqs = attn_varlen_rows(dq, q0, nq),
                    dks = attn_varlen_rows(dk, k0, nk), dvs = attn_varlen_rows(dv, k0, nk);
        lse_copy(tmp, nq, lse + q0, pr->Lq, pr->H, nq);
        st =
            attn_sdpa_reference_backward(&sub, &qs, &ks, &vs, &os, tmp, &gs, &dqs, &dks, &dvs,
                                         sink_acc, err);
    }
    free(tmp);
    return st;
}
