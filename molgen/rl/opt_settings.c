/* molgen optimize: its options (see opt_settings.h). */
#define _POSIX_C_SOURCE 200809L
#include "rl/opt_settings.h"

#include <math.h>
#include <string.h>

void mg_opt_opts_default(mg_opt_opts *o) {
    memset(o, 0, sizeof *o);
    o->budget = 10000;
    o->batch = 64;
    o->sigma = 128;
    o->lr = 1e-4;
    o->constrain = MG_CONSTRAIN_VALENCE;
    o->df = MG_DF_SCAFFOLD;
    o->df_bucket = 25;
    o->df_min_score = 0.4;
    o->repeat_penalty = 0.5;
    o->memory = 50;
    o->replay = 10;
    o->collapse_steps = 20;
    o->collapse_share = 0.02;
    o->save_every = 20;
}

mg_status mg_opt_opts_check(const mg_opt_opts *o, mg_error *err) {
    if (o->budget < 1) return mg_fail(err, MG_ERR_ARG, "budget %lld < 1", (long long)o->budget);
    if (o->batch < 1 || o->batch > 100000) return mg_fail(err, MG_ERR_ARG, "batch %d", o->batch);
    if (!(o->sigma >= 0 && isfinite(o->sigma))) return mg_fail(err, MG_ERR_ARG, "sigma %g", o->sigma);
    if (!(o->lr > 0 && o->lr < 10)) return mg_fail(err, MG_ERR_ARG, "lr %g: need (0, 10)", o->lr);
    if (o->memory < 0 || o->replay < 0 || o->replay > o->memory)
        return mg_fail(err, MG_ERR_ARG, "replay %d must be in [0, memory %d]", o->replay,
                       o->memory);
    if (o->aug_rounds < 0 || (o->aug_rounds > 0 && o->memory == 0))
        return mg_fail(err, MG_ERR_ARG, "augmented memory needs a memory (--memory > 0)");
    if (!(o->repeat_penalty >= 0 && o->repeat_penalty <= 1))
        return mg_fail(err, MG_ERR_ARG, "repeat penalty %g: need [0, 1]", o->repeat_penalty);
    if (o->save_every < 1) return mg_fail(err, MG_ERR_ARG, "save every %d < 1", o->save_every);
    return MG_OK;
}
