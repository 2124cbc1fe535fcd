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
#include "gen/sample.h"      /* mg_constrain_method */
#include "nn/packed_gemm.h"  /* mg_dtype */
#include "base/option_table.h"
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

/* molgen optimize's settings, declared once.
 *
 * Every setting of a run is one line of MG_OPT_SETTINGS. From it come: its
 * field of mg_opt_opts, its default (mg_opt_opts_default), its range
 * (checked by the command line, by mg_opt_opts_check and when a saved state
 * is read: one range, one message), its option and --help text (a row of
 * option_table.h), whether the state and summary.json save it and under
 * which key (opt_checkpoint.c), and what a resume does with it. To add a
 * setting: add its line here, then use the field where it acts. A saved
 * setting added later needs its key in older states: such a state is
 * refused as "missing" (no saved run predates a row today).
 *
 * X(key, field, kind, cli, arg, def, lo, hi, bounds, resume, help)
 *   key     the JSON key in the saved "options" (state and summary.json),
 *           and the name in the engine's messages
 *   field   member of mg_opt_opts
 *   kind    U64 (a JSON string of decimal digits), I64, INT, F64, WORD or
 *           INDEX (an int: the index of the word given among arg's
 *           '|'-separated words; WORD saved as the word, INDEX as the
 *           index, as the states written before this table hold them)
 *   lo, hi  range (WORD / INDEX: hi the last index a run can hold)
 *   bounds  MG_CLOSED [lo, hi], MG_OPEN_LO (lo, hi], ...
 *   resume  SAME  saved; a resume takes the saved value and refuses another
 *                 (the run continues bit for bit)
 *           GROW  saved; a resume may give another (the budget: a larger
 *                 one continues the run, one at or below the calls made
 *                 ends it at once; the patience stop)
 *           FREE  this invocation's, not saved
 *   help    one sentence for --help (default and range are added) */
#define MG_OPT_SETTINGS(X)                                                                         \
    X(seed, seed, U64, "seed", "S", 0, 0, 0, MG_CLOSED, SAME,                                      \
      "random seed; same seed + threads + scorer = the same run")                                  \
    X(budget, budget, I64, "budget", "N", 10000, 1, 1000000000000LL, MG_CLOSED, GROW,              \
      "scoring calls: distinct valid molecules")                                                   \
    /* 4,096: the command line's limit since the first release (so every     \
     * saved run is inside it); a step's logits are batch x ctx x vocab     \
     * floats, gigabytes past it, and REINVENT 4 uses 64-128 */              \
    X(batch, batch, INT, "batch", "B", 64, 1, 4096, MG_CLOSED, SAME, "molecules sampled per step") \
    X(sigma, sigma, F64, "sigma", "X", 128, 0, 1e6, MG_CLOSED, SAME,                               \
      "score weight of the augmented likelihood")                                                  \
    /* (0, 1]: the command line's; Adam steps past 1 only diverge, and the   \
     * engine's (0, 10) and the reader's [0, 10] let a C caller or an edited \
     * state run what no command could start */                              \
    X(lr, lr, F64, "lr", "X", 1e-4, 0, 1, MG_OPEN_LO, SAME, "Adam learning rate")                  \
    X(constrain, constrain, WORD, "constrain", "none|syntax|valence", MG_CONSTRAIN_VALENCE, 0, 2,  \
      MG_CLOSED, SAME,                                                                             \
      "constrained sampling as molgen sample's (valence: the most valid molecules for the least "  \
      "time)")                                                                                     \
    /* mask keeps a molecule that derails (its NLL under the prior ~10x a   \
     * ZINC molecule's, 70-135 heavy atoms: 2.7-4.6 % of the agent's        \
     * samples on PMO's hop tasks); the states written before this row     \
     * sampled so */                                                        \
    X(constrain_method, constrain_method, WORD, "constrain-method", "mask|reject",                 \
      MG_CONSTRAIN_METHOD_DEFAULT, 0, 1, MG_CLOSED, SAME,                                          \
      "with --constrain syntax|valence: how, as molgen sample's (reject: the model's own strings, " \
      "restarted when one fails the check; mask: refused tokens masked, derailed molecules kept)") \
    X(dtype, dtype, WORD, "dtype", "fp32|bf16", MG_DT_F32, 0, 1, MG_CLOSED, SAME,                  \
      "the prior's and agent's products and the sampler's: fp32, or bf16 with fp32 accumulation " \
      "(train and sample --dtype; faster on AVX512_BF16)")                                         \
    /* identical-smiles / identical-murcko: REINVENT 4's names of smiles /   \
     * scaffold, folded into them by mg_opt_opts_fold (hi 2: a run holds the \
     * three mg_df_kind values) */                                            \
    X(df, df, INDEX, "df", "none|smiles|scaffold|identical-smiles|identical-murcko", MG_DF_SCAFFOLD,  \
      0, 2, MG_CLOSED, SAME,                                                                       \
      "diversity filter: scaffold = identical-murcko (the scorer's scaffold= field; without one "  \
      "the canonical SMILES), smiles = identical-smiles (the molecule), or none")                  \
    X(df_bucket, df_bucket, INT, "df-bucket", "N", 25, 1, 1000000000, MG_CLOSED, SAME,             \
      "molecules per bucket before it scores 0")                                                   \
    X(df_min_score, df_min_score, F64, "df-min-score", "X", 0.4, 0, 1, MG_CLOSED, SAME,            \
      "only molecules scoring >= X fill buckets")                                                  \
    X(repeat_penalty, repeat_penalty, F64, "repeat-penalty", "X", 0.5, 0, 1, MG_CLOSED, SAME,      \
      "learning score factor of a molecule scored in an earlier step (1: none)")                   \
    /* 1,000: the command line's (every saved run is inside it); the memory \
     * is searched linearly on each insertion, and PMO uses 100 */            \
    X(memory, memory, INT, "memory", "N", 50, 0, 1000, MG_CLOSED, SAME,                            \
      "inception memory: the N best molecules")                                                    \
    X(replay, replay, INT, "replay", "N", 10, 0, 1000, MG_CLOSED, SAME,                            \
      "memory molecules replayed per step (at most --memory)")                                     \
    /* Genetic GFN's experience loop (its PMO settings: 8 loops of 64 from  \
     * a memory of 1,024, drawn by rank) */                                 \
    X(replay_loops, replay_loops, INT, "replay-loops", "L", 0, 0, 100, MG_CLOSED, SAME,            \
      "L more updates per step, each on --replay molecules drawn afresh from the memory (by rank " \
      "with --rank-coef) with their stored prior NLLs (0: off; needs --replay > 0)")               \
    X(augmented_memory, aug_rounds, INT, "augmented-memory", "K", 0, 0, 100, MG_CLOSED, SAME,      \
      "Augmented Memory: K more updates per step on the memory spelled as randomized SMILES (by " \
      "the chemistry helper with --helper on, else the scorer's !randomize; 0: off; needs "       \
      "--memory > 0)")                                                                             \
    /* the chemistry helper (rl/chem_helper.h): off keeps a run that needs \
     * no RDKit beside molgen (REINVENT 4's defaults) */                      \
    X(helper, helper, WORD, "helper", "off|on", 0, 0, 1, MG_CLOSED, SAME,                          \
      "molgen's chemistry helper (python3 -m molgen.chem_helper, RDKit): RDKit's canonical "        \
      "SMILES as the budget and cache key whatever the scorer answers (PMO's count: two "          \
      "spellings, one call), Augmented Memory's spellings, and --ga-offspring")                    \
    X(ga_offspring, ga_offspring, INT, "ga-offspring", "N", 0, 0, 1024, MG_CLOSED, SAME,           \
      "GA-guided exploration (Genetic GFN): each step N graph-GA children (crossover, then "       \
      "mutation) of memory molecules drawn by --rank-coef are scored beside the batch (they "      \
      "spend budget) and trained on (0: off; needs --helper on and --memory >= 2)")                \
    X(ga_mutation, ga_mutation, F64, "ga-mutation", "X", 0.01, 0, 1, MG_CLOSED, SAME,              \
      "the GA's mutation rate per child")                                                          \
    /* 1,024: draw_ranked's bound, and Genetic GFN's pool (its num_keep) */ \
    X(ga_pool, ga_pool, INT, "ga-pool", "N", 0, 0, 1024, MG_CLOSED, SAME,                          \
      "the GA's parents drawn (by --rank-coef) from the N best molecules scored so far, as "       \
      "Genetic GFN draws them from its 1,024 best, instead of from the memory (0: the memory)")    \
    /* Tripp et al.'s rank weights, as Genetic GFN's replay and GA parents */ \
    X(rank_coef, rank_coef, F64, "rank-coef", "X", 0, 0, 1e6, MG_CLOSED, SAME,                     \
      "rank-based draws of replayed molecules and GA parents: the memory's r-th best (r from 0) "  \
      "weighs 1 / (X M + r) for a memory of M (0: every molecule alike)")                           \
    X(collapse_steps, collapse_steps, INT, "collapse-steps", "K", 20, 0, 1000000000, MG_CLOSED,    \
      SAME,                                                                                        \
      "mode-collapse stop: K consecutive steps in which the share of the batch new to the cache "  \
      "is below --collapse-share (0: never)")                                                      \
    X(collapse_share, collapse_share, F64, "collapse-share", "X", 0.02, 0, 1, MG_CLOSED, SAME,     \
      "the share of --collapse-steps")                                                             \
    /* GROW: it decides when the run ends, never what a step does, so a    \
     * run it stopped, resumed with 0, goes on to the budget as the run     \
     * without the stop, bit for bit (with another K > 0 it takes at least  \
     * one step more before the stop is checked) */                         \
    X(patience, patience, INT, "patience", "K", 0, 0, 1000000000, MG_CLOSED, GROW,                 \
      "convergence stop (mol_opt's REINVENT): past 1,000 calls, K consecutive steps that leave "   \
      "the mean of the 100 best scores unchanged, once 100 molecules scored above 0 (0: never)")  \
    X(max_steps, max_steps, I64, "max-steps", "N", 0, 0, 1000000000000LL, MG_CLOSED, FREE,         \
      "stop after N steps (0: no limit)")                                                          \
    X(stop_after, stop_after, I64, "stop-after", "N", 0, 0, 1000000000000LL, MG_CLOSED, FREE,      \
      "stop after step N, checkpointed, to be resumed (0: never)")                                 \
    X(save_every, save_every, INT, "save-every", "N", 20, 1, 1000000000, MG_CLOSED, FREE,          \
      "checkpoint every N steps (also at the end and on any error)")

#define MG_OPT_CTYPE_U64 uint64_t
#define MG_OPT_CTYPE_I64 int64_t
#define MG_OPT_CTYPE_INT int
#define MG_OPT_CTYPE_F64 double
#define MG_OPT_CTYPE_WORD int
#define MG_OPT_CTYPE_INDEX int
#define MG_OPT_DECL(key, field, kind, cli, arg, def, lo, hi, bounds, resume, help)                 \
    MG_OPT_CTYPE_##kind field;

typedef struct {
    /* the settings (MG_OPT_SETTINGS; constrain an mg_constrain,
     * constrain_method an mg_constrain_method, dtype an mg_dtype, df an
     * mg_df_kind) */
    MG_OPT_SETTINGS(MG_OPT_DECL)
    /* the scorer's command (not owned; NULL: none recorded): saved in the
     * state and summary.json; a resume refuses a state recorded with
     * another one unless scorer_changed (then the new one is recorded) */
    const char *scorer_cmd;
    int scorer_changed;
    /* this invocation's */
    const volatile sig_atomic_t *stop; /* under ranks: any rank's signal stops all */
    struct mg_chem *chem;              /* the chemistry helper (helper on; not owned) */
    mg_dist *dist;                     /* the ranks (NULL: alone) */
    void (*progress)(void *ctx, const mg_opt_progress *p);
    /* writes the run's files (the command layer: mg_opt_write_*) */
    mg_status (*save)(void *ctx, mg_opt *o, mg_error *err);
    void *ctx;
} mg_opt_opts;

/* What a resume does with a setting (MG_OPT_SETTINGS' resume column). */
typedef enum { MG_OPT_SAME, MG_OPT_GROW, MG_OPT_FREE } mg_opt_resume;

/* A line of MG_OPT_SETTINGS: its option_table.h row (offset into
 * mg_opt_opts; key the saved key; resume MG_RESUME_SAME for SAME, so that
 * --help marks it) and the columns option_table.h has no room for. */
typedef struct {
    mg_setting row;
    mg_opt_resume resume;
    int word; /* a CHOICE saved as its word (WORD), else as its index */
} mg_opt_setting;

extern const mg_opt_setting MG_OPT_SETTING[];
extern const size_t MG_OPT_NUM_SETTINGS;

/* Every setting at its table default (seed 0, budget 10000, batch 64, sigma
 * 128, lr 1e-4, valence, fp32, scaffold filter of bucket 25 and min score
 * 0.4, repeat penalty 0.5, memory 50, replay 10, collapse below 0.02 for 20
 * steps, checkpoint every 20 steps), no scorer, no callbacks. */
void mg_opt_opts_default(mg_opt_opts *o);
/* --df identical-smiles / identical-murcko (indices 3, 4) as the filters
 * they name (smiles, scaffold). */
void mg_opt_opts_fold(mg_opt_opts *o);
/* Every setting in its range ("batch 5000 is not in [1, 4096]"), replay <=
 * memory, augmented memory only with a memory. */
mg_status mg_opt_opts_check(const mg_opt_opts *o, mg_error *err);

#ifdef __cplusplus
}
#endif
#endif /* MG_OPT_SETTINGS_H */
