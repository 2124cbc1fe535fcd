/* molgen optimize: the settings table of opt_settings.h as rows of
 * option_table.h, the defaults and the check of a whole mg_opt_opts. */
#define _POSIX_C_SOURCE 200809L
#include "rl/opt_settings.h"

#include <stddef.h>
#include <string.h>

/* Each kind's option_table.h kind and integer range (a real bound such as
 * 1e6 stays a double; U64 has no range). */
#define MG_OPT_KIND_U64 MG_KIND_U64
#define MG_OPT_KIND_I64 MG_KIND_I64
#define MG_OPT_KIND_INT MG_KIND_INT
#define MG_OPT_KIND_F64 MG_KIND_F64
#define MG_OPT_KIND_WORD MG_KIND_CHOICE
#define MG_OPT_KIND_INDEX MG_KIND_CHOICE
#define MG_OPT_ILIM_U64(x) 0
#define MG_OPT_ILIM_I64(x) ((int64_t)(x))
#define MG_OPT_ILIM_INT(x) ((int64_t)(x))
#define MG_OPT_ILIM_F64(x) 0
#define MG_OPT_ILIM_WORD(x) ((int64_t)(x))
#define MG_OPT_ILIM_INDEX(x) ((int64_t)(x))
#define MG_OPT_CHOICES_U64(arg) NULL
#define MG_OPT_CHOICES_I64(arg) NULL
#define MG_OPT_CHOICES_INT(arg) NULL
#define MG_OPT_CHOICES_F64(arg) NULL
#define MG_OPT_CHOICES_WORD(arg) arg
#define MG_OPT_CHOICES_INDEX(arg) arg
#define MG_OPT_WORD_WORD 1
#define MG_OPT_WORD_U64 0
#define MG_OPT_WORD_I64 0
#define MG_OPT_WORD_INT 0
#define MG_OPT_WORD_F64 0
#define MG_OPT_WORD_INDEX 0
#define MG_OPT_RESUME_SAME MG_RESUME_SAME
#define MG_OPT_RESUME_GROW MG_RESUME_NEW
#define MG_OPT_RESUME_FREE MG_RESUME_NEW

#define MG_OPT_ROW(key_, field_, kind_, cli_, arg_, def_, lo_, hi_, bounds_, resume_, help_)      \
    {.row = {.key = #key_,                                                                         \
             .cli = cli_,                                                                          \
             .arg = arg_,                                                                          \
             .help = help_,                                                                        \
             .kind = MG_OPT_KIND_##kind_,                                                          \
             .resume = MG_OPT_RESUME_##resume_,                                                    \
             .lo = (double)(lo_),                                                                  \
             .hi = (double)(hi_),                                                                  \
             .ilo = MG_OPT_ILIM_##kind_(lo_),                                                      \
             .ihi = MG_OPT_ILIM_##kind_(hi_),                                                      \
             .bounds = bounds_,                                                                    \
             .choices = MG_OPT_CHOICES_##kind_(arg_),                                              \
             .offset = offsetof(mg_opt_opts, field_)},                                             \
     .resume = MG_OPT_##resume_,                                                                   \
     .word = MG_OPT_WORD_##kind_},

const mg_opt_setting MG_OPT_SETTING[] = {MG_OPT_SETTINGS(MG_OPT_ROW)};
const size_t MG_OPT_NUM_SETTINGS = sizeof MG_OPT_SETTING / sizeof MG_OPT_SETTING[0];

#define MG_OPT_DEFAULT(key, field, kind, cli, arg, def, lo, hi, bounds, resume, help)              \
    o->field = def;

void mg_opt_opts_default(mg_opt_opts *o) {
    memset(o, 0, sizeof *o);
    MG_OPT_SETTINGS(MG_OPT_DEFAULT)
}

void mg_opt_opts_fold(mg_opt_opts *o) {
    if (o->df > MG_DF_SCAFFOLD) o->df -= 2; /* identical-smiles|-murcko */
}

mg_status mg_opt_opts_check(const mg_opt_opts *o, mg_error *err) {
    for (size_t i = 0; i < MG_OPT_NUM_SETTINGS; i++) {
        const mg_setting *s = &MG_OPT_SETTING[i].row;
        if (s->kind == MG_KIND_CHOICE) { /* option_table.h does not range-check a CHOICE */
            const int v = *(const int *)((const char *)o + s->offset);
            if (v < s->ilo || v > s->ihi)
                return mg_fail(err, MG_ERR_ARG, "%s %d is not one of %s", s->key, v, s->choices);
        } else {
            const mg_status rc = mg_setting_check(s, o, err);
            if (rc) return rc;
        }
    }
    if (o->replay > o->memory)
        return mg_fail(err, MG_ERR_ARG, "replay %d must be in [0, memory %d]", o->replay,
                       o->memory);
    if (o->replay_loops > 0 && o->replay == 0)
        return mg_fail(err, MG_ERR_ARG, "replay loops need replayed molecules (--replay > 0)");
    if (o->aug_rounds > 0 && o->memory == 0)
        return mg_fail(err, MG_ERR_ARG, "augmented memory needs a memory (--memory > 0)");
    if (o->ga_offspring > 0 && !o->helper)
        return mg_fail(err, MG_ERR_ARG,
                       "ga-offspring needs molgen's chemistry helper (--helper on): the GA runs "
                       "there, not in the scorer");
    if (o->ga_offspring > 0 && o->ga_pool == 0 && o->memory < 2)
        return mg_fail(err, MG_ERR_ARG, "ga-offspring needs a memory of 2 or more (--memory) or a pool "
                       "(--ga-pool)");
    if (o->ga_pool == 1)
        return mg_fail(err, MG_ERR_ARG, "ga-pool 1: a child needs two distinct parents (0 or 2+)");
    return MG_OK;
}
