/* molgen DAP gradient dump (hidden `molgen debug-dap`, for
 * molgen/tests/rl/test_optimize.py's float64 oracle): a small random agent and
 * prior, a random batch with given scores, the DAP loss of molgen optimize
 * (mg_opt_dap_backward, rl/dap_loss.h) and its gradient written out.
 *
 * The agent: GPT-2 init from seed, then every parameter += U(-p/2, p/2);
 * the prior: the agent with a second perturbation of p/2 (so the two
 * differ). Rows as grad_dump.h's (row 0 full length), scores [B] the given
 * ones cycled. The file: the agent's parameters under their names, the
 * prior's as "prior.<name>", the gradient as "grad.<name>", "batch.ids" I32
 * [B, T], "batch.lengths" I64 [B], "batch.scores" F64 [B], metadata
 * format=molgen-debug-dap, config, sigma, loss (%.17g). */
#ifndef MG_DAP_DUMP_H
#define MG_DAP_DUMP_H

#include <stdint.h>

#include "base/errors.h"
#include "nn/model.h"

#ifdef __cplusplus
extern "C" {
#endif

mg_status mg_dap_dump(const mg_model_config *cfg, int B, uint64_t seed, double perturb,
                      double sigma, const double *scores, int n_scores, int threads,
                      const char *out, double *loss, mg_error *err);

#ifdef __cplusplus
}
#endif
#endif /* MG_DAP_DUMP_H */
