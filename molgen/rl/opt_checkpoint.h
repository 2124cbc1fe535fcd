/* molgen optimize's state file: DIR/agent.safetensors written
 * (mg_opt_save) and read back for --resume (mg_opt_restore,
 * mg_opt_read_options). */
#ifndef MG_OPT_CHECKPOINT_H
#define MG_OPT_CHECKPOINT_H

#include <jansson.h>

#include "base/errors.h"
#include "rl/opt_settings.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The checkpoint: the agent's tensors (molgen sample reads it as a model),
 * "optim.m", "optim.v", and the metadata "optimize" (JSON: options, step,
 * memory, every scored molecule). Atomic (mg_st_write). */
mg_status mg_opt_save(mg_opt *o, const char *path, mg_error *err);
/* Continue the run saved in checkpoint path (mg_opt_save): its agent, Adam
 * state, memory, scored molecules and step; refuses one of another prior,
 * other algorithm options (MG_ERR_MISMATCH naming the option) or another
 * scorer command than opts.scorer_cmd (unless opts.scorer_changed; a state
 * that records none, an older molgen's, is taken: mg_opt_saved_scorer). */
mg_status mg_opt_restore(mg_opt *o, const char *path, mg_error *err);
/* The saved algorithm options of checkpoint path (for the command's
 * defaults on --resume) into *opts' algorithm fields. */
mg_status mg_opt_read_options(const char *path, mg_opt_opts *opts, mg_error *err);
/* The JSON of the saved settings (as saved in the state and
 * summary.json) and of a scorer command (a string; bytes >= 0x80 of one
 * that is not UTF-8 written \xNN). New references; NULL out of memory. */
json_t *mg_opt_options_json(const mg_opt_opts *p);
json_t *mg_opt_scorer_json(const char *cmd);
/* The saved settings (resume column SAME and GROW of MG_OPT_SETTINGS) of
 * an "options" object j into *p, each through the command line's parser
 * (an edited value out of range: MG_ERR_FORMAT with the command line's
 * message "option \"batch\": bad value '5000' for --batch (an integer in
 * [1, 4096])"), then mg_opt_opts_check. FREE settings are left as they are. */
mg_status mg_opt_options_from_json(const json_t *j, mg_opt_opts *p, mg_error *err);

#ifdef __cplusplus
}
#endif
#endif /* MG_OPT_CHECKPOINT_H */
