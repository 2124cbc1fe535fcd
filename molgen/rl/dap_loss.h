/* molgen optimize's loss, REINVENT's DAP: for each used row,
 * (prior log-likelihood + sigma score - agent log-likelihood)^2, averaged
 * over the used rows of all ranks; its gradient through the agent and one
 * AdamW step. The rows are the run's step scratch (mg_opt's ids, len,
 * pnll, anll, w: rl/opt_state.h); mg_opt_dap_backward, the same loss on
 * given NLLs, is what the float64 oracle's harness (harness/dap_dump.c)
 * checks. */
#ifndef MG_DAP_LOSS_H
#define MG_DAP_LOSS_H

#include "base/errors.h"
#include "nn/model.h"
#include "rl/opt_settings.h" /* mg_opt */

#ifdef __cplusplus
extern "C" {
#endif

/* The NLLs of scratch rows [first, first + n) under m into nll [n]; m keeps
 * the activations (the agent's: for mg_opt_dap_update's backward). */
mg_status mg_opt_rows_nll(mg_opt *o, mg_model *m, int first, int n, double *nll, mg_error *err);

/* One AdamW step on rows [0, n) whose NLLs under the prior (o->pnll) and
 * the agent (o->anll) are computed, learning scores score [n]; rows with
 * use[r] 0 get no weight. This rank's part of the rows (mg_dist_range) is
 * the agent's last forward; the ranks' gradients are summed. The loss in
 * *loss. */
mg_status mg_opt_dap_update(mg_opt *o, int n, const double *score, const unsigned char *use,
                            double *loss, mg_error *err);

/* The DAP loss of n rows after mg_model_sequence_nll(agent, rows) gave
 * agent_nll [n] (its activations kept): the mean over the rows with use[r]
 * of (prior_ll_r + sigma score_r - agent_ll_r)^2 into *loss, and its
 * gradient into mg_model_grads(agent) (untouched when no row is used);
 * w [n] scratch (the row weights). */
mg_status mg_opt_dap_backward(mg_model *agent, int n, const double *prior_nll,
                              const double *agent_nll, const double *score,
                              const unsigned char *use, double sigma, float *w, double *loss,
                              mg_error *err);

#ifdef __cplusplus
}
#endif

#endif
