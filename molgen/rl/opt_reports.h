/* molgen optimize's reports: scored.csv, best.smi, summary.json and PMO's
 * AUC of the top-n mean. */
#ifndef MG_OPT_REPORTS_H
#define MG_OPT_REPORTS_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "rl/opt_settings.h"

#ifdef __cplusplus
extern "C" {
#endif

/* scored.csv: call,step,smiles,canonical,score,prior_nll,agent_nll,
 * scaffold,components (components "name=value;..."). Returns 0 or -1 (a
 * write error: ferror). */
int mg_opt_write_scored(const mg_opt *o, FILE *f);
/* The n best scored molecules, "SMILES<TAB>score" by score (ties: call
 * order). */
int mg_opt_write_best(const mg_opt *o, FILE *f, size_t n);
/* summary.json: calls, steps, budget, top1/top10/top100 means, auc_top10
 * (PMO), seconds, stop reason, options. */
int mg_opt_write_summary(const mg_opt *o, FILE *f, double seconds);
/* PMO's AUC of the top-n mean (mol_opt's top_auc, finish=True): scores
 * [n] in call order, a point every freq calls, trapezoids from 0, the rest
 * of the budget padded with the last value, divided by the budget. */
double mg_opt_auc_top(const double *scores, size_t n, int top, int freq, int64_t budget);

#ifdef __cplusplus
}
#endif
#endif /* MG_OPT_REPORTS_H */
