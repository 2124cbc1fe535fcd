/* molgen optimize's options (mg_opt_opts: the algorithm's, saved with the
 * run, and this invocation's), their defaults and their check, and the
 * progress figures of a step. */
#ifndef MG_OPT_SETTINGS_H
#define MG_OPT_SETTINGS_H

#include <signal.h>
#include <stdint.h>

#include "base/dist.h"
#include "base/errors.h"
#include "chem/smiles_check.h" /* mg_constrain */
#include "nn/packed_gemm.h"  /* mg_dtype */
#include "rl/diversity_filter.h" /* mg_df_kind */

#ifdef __cplusplus
extern "C" {
#endif

/* One step's figures, for the progress line. */
typedef struct {
    int64_t step, calls, budget;
    int batch;
    double mean;     /* mean score of the batch (invalid 0) */
    double top10;    /* mean of the 10 best scores so far */
    double valid;    /* share of the batch valid */
    double unique;   /* share of the batch distinct valid molecules */
    double fresh;    /* share new to the cache */
    double loss;
    double seconds;  /* of this invocation so far */
    int64_t calls0;  /* calls when this invocation started */
} mg_opt_progress;

typedef struct mg_opt mg_opt;

typedef struct {
    /* the run's algorithm (saved; a resume must give the same) */
    uint64_t seed;
    int64_t budget;
    int batch;
    double sigma, lr;
    mg_constrain constrain;
    mg_df_kind df;
    int df_bucket;
    double df_min_score, repeat_penalty;
    int memory, replay, aug_rounds;
    int collapse_steps;
    double collapse_share;
    int patience; /* mol_opt's convergence stop (0: none) */
    mg_dtype dtype; /* the prior's and agent's products and the sampler's
                       (train/sample --dtype; MG_DT_F32 default) */
    /* the scorer's command (not owned; NULL: none recorded): saved in the
     * state and summary.json; a resume refuses a state recorded with
     * another one unless scorer_changed (then the new one is recorded) */
    const char *scorer_cmd;
    int scorer_changed;
    /* this invocation's */
    int64_t max_steps;  /* 0: none */
    int64_t stop_after; /* 0: none */
    int save_every;     /* steps between checkpoints (and at the end, faults) */
    const volatile sig_atomic_t *stop; /* under ranks: any rank's signal stops all */
    mg_dist *dist;                     /* the ranks (NULL: alone) */
    void (*progress)(void *ctx, const mg_opt_progress *p);
    /* writes the run's files (the command layer: mg_opt_write_*) */
    mg_status (*save)(void *ctx, mg_opt *o, mg_error *err);
    void *ctx;
} mg_opt_opts;

/* seed 0, budget 10000, batch 64, sigma 128, lr 1e-4, constrain VALENCE,
 * df SCAFFOLD (bucket 25, min score 0.4), repeat penalty 0.5, memory 50,
 * replay 10, no augmentation, collapse below 0.02 for 20 steps, no
 * patience stop, checkpoint
 * every 20 steps. */
void mg_opt_opts_default(mg_opt_opts *o);
mg_status mg_opt_opts_check(const mg_opt_opts *o, mg_error *err);

#ifdef __cplusplus
}
#endif
#endif /* MG_OPT_SETTINGS_H */
