/* molgen optimize: REINVENT's DAP loss (see dap_loss.h). */
#include "rl/dap_loss.h"

#include <stdlib.h>
#include <string.h>

#include "base/dist.h"
#include "nn/optim.h"
#include "rl/opt_state.h"

/* rows [first, first + n) packed for a forward: the longest length */
static int rows_T(const mg_opt *o, int first, int n) {
    int T = 2;
    for (int r = first; r < first + n; r++)
        if (o->len[r] > T) T = (int)o->len[r];
    return T;
}

/* The rows are repacked to width T in place of the scratch's ctx + 1 into
 * a temporary. */
mg_status mg_opt_rows_nll(mg_opt *o, mg_model *m, int first, int n, double *nll, mg_error *err) {
    if (n <= 0) return MG_OK;
    const int W = o->ctx + 1, T = rows_T(o, first, n);
    int32_t *p = malloc((size_t)n * T * sizeof *p);
    if (!p) return mg_fail(err, MG_ERR_NOMEM, "out of memory");
    for (int r = 0; r < n; r++)
        memcpy(p + (size_t)r * T, o->ids + (size_t)(first + r) * W, (size_t)T * sizeof *p);
    mg_status rc = mg_model_sequence_nll(
        m, &(mg_batch){.ids = p, .lengths = o->len + first, .B = n, .T = T}, nll, err);
    free(p);
    return rc;
}

/* The DAP gradient of n rows that are part of a loss over N used rows (all
 * ranks'): weights 2 d_r / N, the sum of d_r^2 of these rows into *sumsq;
 * no backward (the gradients untouched) when none of them is used. */
static mg_status dap_rows(mg_model *agent, int n, const double *prior_nll,
                          const double *agent_nll, const double *score, const unsigned char *use,
                          double sigma, int N, float *w, double *sumsq, mg_error *err) {
    double L = 0;
    int any = 0;
    for (int r = 0; r < n; r++) {
        /* target - agent_ll = (-prior_nll + sigma s) + agent_nll */
        const double d = use[r] ? -prior_nll[r] + sigma * score[r] + agent_nll[r] : 0.0;
        L += d * d;
        w[r] = N ? (float)(2.0 * d / N) : 0.0f;
        any |= use[r];
    }
    *sumsq = L;
    if (!any || !N) return MG_OK;
    return mg_model_backward(agent, w, n, err);
}

mg_status mg_opt_dap_backward(mg_model *agent, int n, const double *prior_nll,
                              const double *agent_nll, const double *score,
                              const unsigned char *use, double sigma, float *w, double *loss,
                              mg_error *err) {
    int N = 0;
    for (int r = 0; r < n; r++) N += use[r] != 0;
    double L = 0;
    mg_status rc = dap_rows(agent, n, prior_nll, agent_nll, score, use, sigma, N, w, &L, err);
    *loss = N ? L / N : 0.0;
    return rc;
}

mg_status mg_opt_dap_update(mg_opt *o, int n, const double *score, const unsigned char *use,
                            double *loss, mg_error *err) {
    size_t a, b;
    mg_dist_range((size_t)n, o->d->rank, o->d->size, &a, &b);
    int N = 0;
    for (int r = 0; r < n; r++) N += use[r] != 0;
    double L = 0;
    mg_status rc = dap_rows(o->agent, (int)(b - a), o->pnll + a, o->anll + a, score + a, use + a,
                            o->op.sigma, N, o->w, &L, err);
    int mine = 0;
    for (size_t r = a; r < b; r++) mine |= use[r];
    float *g = mg_model_grads(o->agent);
    const size_t P = mg_model_num_params(o->agent);
    if (!mine && o->d->size > 1) memset(g, 0, P * sizeof *g); /* no rows: adds nothing */
    if ((rc = mg_dist_agree(o->d, rc, err))) return rc;
    if (o->d->size > 1 && N) {
        mg_dist_sum_f32(o->d, g, P);
        mg_dist_sum_f64(o->d, &L, 1);
    }
    *loss = N ? L / N : 0.0;
    if (N) rc = mg_adamw_step(&o->adam, mg_model_params(o->agent), g, NULL, NULL, err);
    return mg_dist_agree(o->d, rc, err);
}
