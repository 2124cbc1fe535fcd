/* molgen optimize's run state, shared by the files of rl/ that read or
 * write it (optimize.c the step and the run, dap_loss.c the loss,
 * opt_checkpoint.c save and resume, opt_reports.c the reports): the scored
 * molecules and their indexes, the memory, the counters, a step's scratch.
 * Not for other folders: they see mg_opt through optimize.h's functions. */
#ifndef MG_OPT_STATE_H
#define MG_OPT_STATE_H

#include <stddef.h>
#include <stdint.h>

#include "base/errors.h"
#include "chem/tokenizer.h"
#include "nn/model.h"
#include "nn/optim.h"
#include "rl/diversity_filter.h"
#include "rl/inception_memory.h"
#include "rl/opt_settings.h"
#include "rl/scorer_process.h"
#include "rl/strmap.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The state file's format (opt_checkpoint.c). */
#define OPT_FORMAT 1
/* The range of a molecule's NLL (nats) in the state: a sum of per-token
 * NLLs lse - z_t >= 0 (exactly: lse = max + log(sum) with sum >= 1), and
 * real ones are tens of nats (13 to 66 in the tests' runs, ~60 tokens at
 * most); 1e6 is 15,000 times that, yet keeps the DAP difference
 * -prior_nll + sigma s + agent_nll (sigma <= 1e6) within 3e6, so the float
 * row weights and the squared loss stay finite. A run never saves one
 * outside (row_nlls refuses it), so the reader refuses only edited files. */
#define OPT_NLL_MAX 1e6

/* A scored molecule (its strings owned). */
typedef struct {
    char *smiles, *canonical, *scaffold, *comps;
    double score, prior_nll, agent_nll;
    int64_t call, step;
    int ga; /* 1: a child of the GA (--ga-offspring), 0: sampled by the agent */
} opt_mol;

struct mg_opt {
    mg_model *prior, *agent;
    const mg_vocab *vocab;
    mg_scorer *sc;
    mg_opt_opts op;
    mg_dist *d, alone; /* the ranks (alone: op.dist NULL) */
    mg_adamw adam;
    int ctx, V;
    uint64_t prior_digest;
    opt_mol *mols;
    size_t nmol, capmol;
    mg_strmap by_key, raw; /* canonical -> molecule; every spelling sampled -> molecule or -1 */
    mg_diversity_filter df;
    mg_mem_entry *mem;
    int nmem;
    int64_t step, collapse_run, plateau_run, step0, calls0;
    int64_t nan_sent; /* molecules the scorer answered nan (this invocation) */
    char *saved_scorer; /* the restored state's scorer command (NULL: none) */
    int scorer_other;   /* ... and it is not this run's (--scorer-changed) */
    char reason[32];
    double t0;
    /* scratch of a step */
    int32_t *ids;
    int64_t *len;
    double *pnll, *anll;
    float *w;
    int cap_rows;
};

/* Frees m's strings. */
void mg_opt_mol_clear(opt_mol *m);
/* The diversity filter's bucket of m. */
const char *mg_opt_bucket_key(const mg_opt *o, const opt_mol *m);
/* Appends m (taking its strings) and indexes it: the score cache, the
 * spellings, the diversity filter. */
mg_status mg_opt_add_mol(mg_opt *o, opt_mol *m, mg_error *err);
/* Row r of the step's scratch batch (o->ids, o->len) from smiles: 1, or 0
 * when it cannot be a row (a token outside the vocabulary, too long). */
int mg_opt_encode_row(mg_opt *o, int r, const char *smiles);
/* qsort's order of doubles, largest first. */
int mg_opt_cmp_desc(const void *a, const void *b);
/* The mean of the n best scores so far (0: none scored; NaN: out of
 * memory). */
double mg_opt_top_mean(const mg_opt *o, size_t n);

#ifdef __cplusplus
}
#endif
#endif /* MG_OPT_STATE_H */
