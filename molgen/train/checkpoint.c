/* molgen checkpoints: a model file plus the optimizer state, the saved
 * settings and the run's state (see checkpoint.h). */
#define _POSIX_C_SOURCE 200809L
#include "train/checkpoint.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/json.h"
#include "base/safetensors.h"

mg_status mg_ckpt_optimizer(const mg_model *m, const mg_adamw_config *c, mg_adamw *opt,
                            mg_error *err) {
    const size_t nt = mg_model_num_tensors(m);
    const int V = mg_model_get_config(m)->vocab_size, v0 = mg_model_new_rows(m);
    mg_optim_span *spans = calloc(2 * nt, sizeof *spans); /* a grown tensor: two */
    if (!spans) {
        memset(opt, 0, sizeof *opt);
        return mg_fail(err, MG_ERR_NOMEM, "out of memory");
    }
    size_t ns = 0;
    for (size_t i = 0; i < nt; i++) {
        const mg_param_info *pi = mg_model_tensor(m, i);
        const int grown = v0 > 0 && v0 < V && pi->shape[0] == V &&
                          (!strcmp(pi->name, "tok_emb.weight") || !strncmp(pi->name, "head.", 5));
        /* rows [0, v0) then the new rows [v0, V) at MG_NEW_ROWS_LR_MULT */
        const size_t row = pi->ndim == 2 ? (size_t)pi->shape[1] : 1, cut = grown ? (size_t)v0 * row : pi->numel;
        spans[ns++] = (mg_optim_span){pi->offset, cut, pi->decay, mg_model_tensor_frozen(m, i), 0.0f};
        if (grown)
            spans[ns++] = (mg_optim_span){pi->offset + cut, pi->numel - cut, pi->decay,
                                          mg_model_tensor_frozen(m, i), MG_NEW_ROWS_LR_MULT};
    }
    const mg_status rc = mg_adamw_init(opt, c, mg_model_num_params(m), spans, ns, err);
    free(spans);
    return rc;
}

static int saved_in_train(const mg_setting *s) {
    return s->save == MG_SAVE_CKPT || s->save == MG_SAVE_CKPT_NEW;
}

/* The "train" metadata: the saved settings, then the state. */
static char *train_json(const mg_train_config *settings, const mg_train_state *st) {
    json_t *j = json_object();
    char buf[32];
    int ok = j != NULL;
    for (size_t i = 0; ok && i < MG_TRAIN_NUM_SETTINGS; i++)
        if (saved_in_train(&MG_TRAIN_SETTING[i]))
            ok = !mg_json_put(j, MG_TRAIN_SETTING[i].key,
                              mg_setting_to_json(&MG_TRAIN_SETTING[i], settings));
    snprintf(buf, sizeof buf, "%016" PRIx64, st->data_hash);
    ok =
        ok && !mg_json_put(j, "step", json_integer((json_int_t)st->step)) &&
        !mg_json_put(j, "data_rows", json_integer((json_int_t)st->data_rows)) &&
        !mg_json_put(j, "data_hash", json_string(buf)) &&
        !mg_json_put(j, "val_loss", isfinite(st->val_loss) ? json_real(st->val_loss) : json_null());
    snprintf(buf, sizeof buf, "%08" PRIx32, st->init_crc32);
    ok = ok && (!settings->init_path || !mg_json_put(j, "init_crc32", json_string(buf)));
    ok = ok && (!st->new_rows || !mg_json_put(j, "new_rows", json_integer(st->new_rows)));
    char *s = ok ? mg_json_dump(j, 17) : NULL;
    json_decref(j);
    return s;
}

static mg_status train_from_json(const char *text, mg_ckpt *ck, mg_error *err) {
    mg_error e;
    if (mg_json_parse(text, strlen(text), &ck->train_json, &e))
        return mg_fail(err, e.status, "checkpoint \"train\" metadata: %s", e.message);
    const json_t *j = ck->train_json;
    if (!json_is_object(j))
        return mg_fail(err, MG_ERR_FORMAT, "checkpoint \"train\" metadata is not an object");
    mg_train_config_default(&ck->settings);
    for (size_t i = 0; i < MG_TRAIN_NUM_SETTINGS; i++) {
        const mg_setting *s = &MG_TRAIN_SETTING[i];
        const json_t *v = json_object_get(j, s->key);
        if (!saved_in_train(s) || (!v && s->save == MG_SAVE_CKPT_NEW)) continue;
        if (mg_setting_from_json(s, v, &ck->settings, &e))
            return mg_fail(err, e.status, "checkpoint \"train\" metadata: %s", e.message);
    }
    if (!ck->settings.data_path || !ck->settings.csv_column)
        return mg_fail(err, MG_ERR_FORMAT,
                       "checkpoint \"train\" metadata: \"%s\" missing or not a string",
                       ck->settings.data_path ? "csv_column" : "data");
    const json_t *step = json_object_get(j, "step"), *rows = json_object_get(j, "data_rows");
    const char *hash = json_string_value(json_object_get(j, "data_hash"));
    if (!json_is_integer(step) || json_integer_value(step) < 0)
        return mg_fail(err, MG_ERR_FORMAT,
                       "checkpoint \"train\" metadata: \"step\" missing or out of range");
    if (!json_is_integer(rows) || json_integer_value(rows) < 0)
        return mg_fail(err, MG_ERR_FORMAT,
                       "checkpoint \"train\" metadata: \"data_rows\" missing or out of range");
    if (!hash)
        return mg_fail(err, MG_ERR_FORMAT,
                       "checkpoint \"train\" metadata: \"data_hash\" missing or not a string");
    ck->state.step = json_integer_value(step);
    ck->state.data_rows = (uint64_t)json_integer_value(rows);
    ck->state.data_hash = strtoull(hash, NULL, 16);
    const json_t *vl = json_object_get(j, "val_loss");
    ck->state.val_loss = json_is_number(vl) ? json_number_value(vl) : NAN;
    const char *crc = json_string_value(json_object_get(j, "init_crc32"));
    if (ck->settings.init_path &&
        (!crc || strlen(crc) != 8 || strspn(crc, "0123456789abcdef") != 8))
        return mg_fail(err, MG_ERR_FORMAT,
                       "checkpoint \"train\" metadata: \"init_crc32\" missing or not 8 hex digits");
    ck->state.init_crc32 = crc ? (uint32_t)strtoul(crc, NULL, 16) : 0;
    const json_t *nr = json_object_get(j, "new_rows");
    if (nr && (!json_is_integer(nr) || json_integer_value(nr) < 0 ||
               json_integer_value(nr) > 65536))
        return mg_fail(err, MG_ERR_FORMAT,
                       "checkpoint \"train\" metadata: \"new_rows\" is not a token id");
    ck->state.new_rows = nr ? (int)json_integer_value(nr) : 0;
    /* Written by molgen versions that bucketed batches by length: this one
     * draws other batches, so it cannot continue such a run as promised. */
    const json_t *bk = json_object_get(j, "bucket");
    if (bk && !(json_is_number(bk) && json_number_value(bk) == 0))
        return mg_fail(err, MG_ERR_FORMAT,
                       "checkpoint was trained with length-bucketed batches, which this "
                       "molgen no longer makes: it cannot be resumed bit for bit");
    return MG_OK;
}

mg_status mg_ckpt_save(const char *path, const mg_model *m, const mg_vocab *vocab,
                       const mg_adamw *opt, const mg_train_config *settings,
                       const mg_train_state *state, mg_error *err) {
    const size_t nt = mg_model_num_tensors(m);
    mg_st_tensor *t = calloc(nt + 3, sizeof *t);
    char *vj = mg_vocab_to_json(vocab), *tj = train_json(settings, state);
    char cfg[512], ocfg[512], step[32];
    if (!t || !vj || !tj) {
        free(t);
        free(vj);
        free(tj);
        return mg_fail(err, MG_ERR_NOMEM, "out of memory writing the checkpoint");
    }
    mg_model_st_tensors(m, t, nt);
    const int64_t P = (int64_t)mg_model_num_params(m);
    t[nt].name = "optim.m";
    t[nt + 1].name = "optim.v";
    t[nt + 2].name = "ema";
    t[nt].data = opt->m;
    t[nt + 1].data = opt->v;
    t[nt + 2].data = opt->ema;
    const size_t nx = opt->ema ? 3 : 2; /* the average only with --ema */
    for (size_t i = nt; i < nt + nx; i++) {
        t[i].dtype = MG_ST_F32;
        t[i].ndim = 1;
        t[i].shape[0] = P;
    }
    mg_model_config_to_json(mg_model_get_config(m), cfg, sizeof cfg);
    mg_adamw_config_to_json(&opt->cfg, ocfg, sizeof ocfg);
    snprintf(step, sizeof step, "%" PRId64, state->step);
    const char *cond = mg_model_condition_meta(m); /* a conditional model's (condition.h) */
    const mg_st_kv meta[] = {{"format", "molgen"}, {"config", cfg}, {"vocab", vj},
                             {"optim", ocfg},      {"train", tj},   {"step", step},
                             {"condition", cond}};
    mg_error e;
    mg_status rc = MG_OK;
    for (size_t i = 0; !rc && i < nt + nx; i++) /* a diverged run keeps its last good file */
        rc = mg_ckpt_check_values(t[i].name, t[i].data,
                                  i < nt ? mg_model_tensor(m, i)->numel : (size_t)P, &e);
    if (rc) {
        free(t);
        free(vj);
        free(tj);
        return mg_fail(err, rc,
                       "refusing to write checkpoint %s: %s (the run diverged?); the file on disk "
                       "is left as it was",
                       path, e.message);
    }
    rc = mg_st_write(path, t, nt + nx, meta, sizeof meta / sizeof meta[0] - !cond, &e);
    free(t);
    free(vj);
    free(tj);
    if (rc) return mg_fail(err, e.status, "writing checkpoint %s: %s", path, e.message);
    return MG_OK;
}

void mg_ckpt_free(mg_ckpt *c) {
    mg_model_free(c->model);
    mg_vocab_free(c->vocab);
    mg_adamw_free(&c->opt);
    json_decref(c->train_json);
    memset(c, 0, sizeof *c);
}

mg_status mg_ckpt_load(const char *path, mg_ckpt *ck, mg_error *err) {
    memset(ck, 0, sizeof *ck);
    mg_st_file *f = NULL;
    mg_error e;
    mg_status rc = mg_st_load(path, &f, &e);
    if (rc) return mg_fail(err, rc, "checkpoint: %s", e.message); /* e.message names the path */
    const char *fmt = mg_st_meta(f, "format");
    const char *oj = mg_st_meta(f, "optim"), *tj = mg_st_meta(f, "train"),
               *vj = mg_st_meta(f, "vocab");
    mg_adamw_config oc;
    if (!fmt || strcmp(fmt, "molgen")) {
        rc = mg_fail(err, MG_ERR_FORMAT,
                     "checkpoint %s: not a molgen file (metadata \"format\" missing)", path);
    } else if (!oj || !tj || !vj) {
        rc = mg_fail(err, MG_ERR_FORMAT,
                     "checkpoint %s: a model file without training state (no \"%s\" metadata): "
                     "cannot resume from it",
                     path,
                     !oj   ? "optim"
                     : !tj ? "train"
                           : "vocab");
    } else if ((rc = mg_model_from_st(f, &ck->model, &e)) ||
               (rc = mg_ckpt_check_state(f, mg_model_num_params(ck->model), &e))) {
        rc = mg_fail(err, rc, "checkpoint %s: %s", path, e.message);
    } else if ((rc = mg_vocab_from_json(vj, strlen(vj), &ck->vocab, &e))) {
        rc = mg_fail(err, rc, "checkpoint %s: vocab: %s", path, e.message);
    } else if (mg_vocab_size(ck->vocab) != mg_model_get_config(ck->model)->vocab_size) {
        rc = mg_fail(err, MG_ERR_FORMAT, "checkpoint %s: vocab has %d tokens, the model %d", path,
                     mg_vocab_size(ck->vocab), mg_model_get_config(ck->model)->vocab_size);
    } else if ((rc = mg_adamw_config_from_json(oj, &oc, &e)) ||
               (rc = train_from_json(tj, ck, &e)) ||
               (rc = mg_model_set_frozen(ck->model, ck->settings.freeze, &e)) ||
               (rc = mg_model_set_new_rows(ck->model, ck->state.new_rows, &e)) ||
               (rc = mg_ckpt_optimizer(ck->model, &oc, &ck->opt, &e))) {
        rc = mg_fail(err, rc, "checkpoint %s: %s", path, e.message);
    } else {
        const size_t P = mg_model_num_params(ck->model);
        const int64_t shape[1] = {(int64_t)P};
        if ((rc =
                 mg_st_copy(f, "optim.m", MG_ST_F32, 1, shape, ck->opt.m, P * sizeof(float), &e)) ||
            (rc = mg_st_copy(f, "optim.v", MG_ST_F32, 1, shape, ck->opt.v, P * sizeof(float), &e)) ||
            (ck->settings.ema > 0 &&
             ((rc = mg_adamw_enable_ema(&ck->opt, ck->settings.ema, mg_model_params(ck->model),
                                        &e)) ||
              (rc = mg_st_copy(f, "ema", MG_ST_F32, 1, shape, ck->opt.ema, P * sizeof(float),
                               &e)))))
            rc = mg_fail(err, rc, "checkpoint %s: %s", path, e.message);
        ck->opt.step = ck->state.step;
    }
    mg_st_free(f);
    if (rc) mg_ckpt_free(ck);
    return rc;
}

mg_status mg_checkpoint_load(const char *path, mg_model **model, mg_adamw *opt, int64_t *step,
                             mg_error *err) {
    if (!path || !model) return mg_fail(err, MG_ERR_ARG, "path or model pointer is NULL");
    mg_ckpt ck;
    const mg_status rc = mg_ckpt_load(path, &ck, err);
    if (rc) return rc;
    *model = ck.model;
    ck.model = NULL;
    if (opt) {
        *opt = ck.opt;
        memset(&ck.opt, 0, sizeof ck.opt);
    }
    if (step) *step = ck.state.step;
    mg_ckpt_free(&ck);
    return MG_OK;
}
