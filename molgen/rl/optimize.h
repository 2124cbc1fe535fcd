/* molgen optimize: goal-directed generation by reinforcement learning
 * against an external scorer (scorer_process.h), as REINVENT 4 does it.
 *
 * The agent starts as the prior (a second copy of it; the prior stays
 * frozen). Step s:
 *  1. sample B molecules from the agent (KV decoding, sample.h; seed
 *     mix(seed, s); --constrain as molgen sample's);
 *  2. score them: a molecule that fails molgen's SMILES check, ends
 *     without EOS, or that the scorer answers "nan" is invalid (score 0, no
 *     budget); one already scored (cache key: the scorer's canonical= field,
 *     else the SMILES) is served from the cache (no call); every new
 *     canonical molecule is one call of the budget, numbered in order;
 *     molecules past the budget are left out of the step;
 *  3. the learning score s' of each row: the score, 0 for an in-batch
 *     duplicate (the later copies), times repeat_penalty for a molecule
 *     first scored in an earlier step, and 0 when the diversity filter's
 *     bucket of the molecule (df SCAFFOLD: the scorer's scaffold= field,
 *     else the canonical SMILES; df SMILES: the canonical SMILES) holds more
 *     than df_bucket molecules scored >= df_min_score;
 *  4. the DAP loss over the batch rows and `replay` rows drawn from the
 *     inception memory (the `memory` best distinct molecules by s', each
 *     with its prior NLL):
 *        loss = mean_r (prior_ll_r + sigma s'_r - agent_ll_r)^2
 *     (ll = -NLL, the summed log-likelihood of the row's tokens after BOS,
 *     EOS included), its gradient through mg_model_backward's row weights
 *     w_r = 2 (prior_ll_r + sigma s'_r - agent_ll_r) / N, one Adam step
 *     (AdamW of optim.h: lr, betas 0.9/0.999, eps 1e-8, no weight decay, no
 *     clipping, constant rate);
 *  5. aug_rounds > 0 (Augmented Memory): that many more Adam steps, each on
 *     the memory's molecules spelled as randomized SMILES (the chemistry
 *     helper's randomize with helper on, else the scorer's !randomize),
 *     their prior NLL recomputed for the spelling.
 * All of a step's scorer traffic happens before any state changes, so a
 * scorer fault leaves the state of the step's start (saved: resumable, the
 * same step redone).
 *
 * The run ends when `budget` molecules are scored ("budget"), after
 * max_steps steps ("max-steps"), on mode collapse ("collapse": for
 * collapse_steps consecutive steps the share of the batch that was new to
 * the cache is below collapse_share), after step stop_after ("stop-after",
 * to be resumed), on a signal ("interrupted") or on an error.
 *
 * Determinism: the whole run is a function of the prior, the options and
 * the scorer's answers (thread count fixed); mg_opt_save writes everything
 * it depends on, so a resumed run continues bit for bit.
 *
 * Ranks (opts.dist, dist.h; every rank holds the prior, the agent and its
 * own scorer process, and every call below is collective): step s's batch
 * is sampled split by index (mg_sample's dist: molecule i from stream i,
 * the one-process batch) and shared with every rank; each chunk of
 * molecules sent for scoring is split by index over the ranks' scorers and
 * the replies shared, so every rank applies the cache, budget, diversity
 * filter and memory to the same replies in the same order; the loss rows
 * (batch + replay, and Augmented Memory's rows) are split by index, each
 * rank runs the prior and agent forwards and the backward of its rows, the
 * NLLs are shared and the gradients summed (mg_dist_sum_f32) before the
 * same Adam step on every rank. What equals one process: the sampled
 * molecules given the agent, the scorer's answers, and so the cache,
 * calls and scored.csv's order; what does not bitwise: a row's NLL comes
 * from a forward over another set of rows (another matrix height in the
 * products) and the gradient is summed in another order, so the agent
 * differs from one process's by rounding, which could flip a sampled
 * token in a later step (not seen in the tests). Every failure is agreed
 * (mg_dist_agree: the lowest failing rank keeps its error, the others get
 * MG_ERR_PEER); the save hook is called on every rank (the command writes
 * on rank 0).
 *
 * Conventions: errors.h; nothing prints (progress through a callback). */
#ifndef MG_OPTIMIZE_H
#define MG_OPTIMIZE_H

#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "base/dist.h"
#include "base/errors.h"
#include "nn/packed_gemm.h"
#include "nn/model.h"
#include "chem/smiles_check.h"
#include "chem/tokenizer.h"
#include "rl/opt_settings.h"

#ifdef __cplusplus
extern "C" {
#endif


/* A run of prior (its parameters read only) and agent (a model of the same
 * config and parameters: it is trained) with the scorer's process already
 * started (struct mg_scorer, scorer_process.h); none are owned. Both models are set
 * to opts->dtype, and the scorer's waits to end on opts->stop. */
struct mg_scorer;
mg_status mg_opt_new(mg_model *prior, mg_model *agent, const mg_vocab *vocab,
                     struct mg_scorer *scorer, const mg_opt_opts *opts, mg_opt **out,
                     mg_error *err);
void mg_opt_free(mg_opt *o); /* NULL fine */
/* The scorer command the restored state recorded (NULL: none, or not
 * restored; bytes >= 0x80 of a command that is not UTF-8 written \xNN),
 * valid while o is; *other (non-NULL) says whether it is not this run's
 * opts.scorer_cmd (taken with scorer_changed). */
const char *mg_opt_saved_scorer(const mg_opt *o, int *other);
/* Runs to the end; returns 0 (stop reason: mg_opt_stop_reason) or the
 * error (the state at the start of the failing step is saved first when it
 * can be; *saved says whether). */
mg_status mg_opt_run(mg_opt *o, int *saved, mg_error *err);
const char *mg_opt_stop_reason(const mg_opt *o); /* "" while running */
int64_t mg_opt_calls(const mg_opt *o);
int64_t mg_opt_steps(const mg_opt *o);
/* A hash of the run's state (agent and Adam state bits, step, scored
 * molecules, memory): the ranks check they resumed the same run. */
uint64_t mg_opt_state_digest(mg_opt *o);

#ifdef __cplusplus
}
#endif
#endif /* MG_OPTIMIZE_H */
