/* molgen training settings: the table of train_settings.h as rows of
 * option_table.h, the defaults and the range check of a whole config. */
#define _POSIX_C_SOURCE 200809L
#include "train/train_settings.h"

#include <stddef.h>
#include <string.h>

/* Range columns as each kind uses them (a real bound such as 1e30 must not
 * become an integer constant). */
#define MG_ILIM_STR(x) 0
#define MG_ILIM_INT(x) ((int64_t)(x))
#define MG_ILIM_I64(x) ((int64_t)(x))
#define MG_ILIM_U64(x) 0
#define MG_ILIM_F64(x) 0
#define MG_ILIM_F32(x) 0
#define MG_ILIM_FLAG(x) ((int64_t)(x))
#define MG_FLAGDEF_STR(x) 0
#define MG_FLAGDEF_INT(x) 0
#define MG_FLAGDEF_I64(x) 0
#define MG_FLAGDEF_U64(x) 0
#define MG_FLAGDEF_F64(x) 0
#define MG_FLAGDEF_F32(x) 0
#define MG_FLAGDEF_FLAG(x) (x)
#define MG_SETTING_ROW(key_, field_, kind_, cli_, arg_, def_, lo_, hi_, bounds_, save_, resume_,   \
                       group_, help_)                                                              \
    {.key = #key_,                                                                                 \
     .cli = cli_,                                                                                  \
     .arg = arg_,                                                                                  \
     .group = group_,                                                                              \
     .help = help_,                                                                                \
     .kind = MG_KIND_##kind_,                                                                      \
     .save = MG_SAVE_##save_,                                                                      \
     .resume = MG_RESUME_##resume_,                                                                \
     .lo = (double)(lo_),                                                                          \
     .hi = (double)(hi_),                                                                          \
     .ilo = MG_ILIM_##kind_(lo_),                                                                  \
     .ihi = MG_ILIM_##kind_(hi_),                                                                  \
     .bounds = bounds_,                                                                            \
     .flag_default = MG_FLAGDEF_##kind_(def_),                                                     \
     .offset = offsetof(mg_train_config, field_)},

const mg_setting MG_TRAIN_SETTING[] = {MG_TRAIN_SETTINGS(MG_SETTING_ROW)};
const size_t MG_TRAIN_NUM_SETTINGS = sizeof MG_TRAIN_SETTING / sizeof MG_TRAIN_SETTING[0];

/* Defaults: the table's, except model.* and optim.* (their owners'). */
#define MG_DEF_RUN(field, def) c->field = def;
#define MG_DEF_CKPT(field, def) c->field = def;
#define MG_DEF_CKPT_NEW(field, def) c->field = def;
#define MG_DEF_MODEL(field, def)
#define MG_DEF_OPTIM(field, def)
#define MG_SETTING_DEFAULT(key, field, kind, cli, arg, def, lo, hi, bounds, save, resume, group,   \
                           help)                                                                   \
    MG_DEF_##save(field, def)

void mg_train_config_default(mg_train_config *c) {
    memset(c, 0, sizeof *c);
    mg_model_config_default(&c->model);
    mg_adamw_config_default(&c->optim);
    MG_TRAIN_SETTINGS(MG_SETTING_DEFAULT)
}

const mg_setting *mg_setting_find(const char *key) {
    for (size_t i = 0; key && i < MG_TRAIN_NUM_SETTINGS; i++)
        if (!strcmp(MG_TRAIN_SETTING[i].key, key)) return &MG_TRAIN_SETTING[i];
    return NULL;
}

mg_status mg_train_config_check(const mg_train_config *c, mg_error *err) {
    if (!c) return mg_fail(err, MG_ERR_ARG, "train config is NULL");
    for (size_t i = 0; i < MG_TRAIN_NUM_SETTINGS; i++) {
        const mg_status rc = mg_setting_check(&MG_TRAIN_SETTING[i], c, err);
        if (rc) return rc;
    }
    return MG_OK;
}
