/* molgen checkpoints: a model file plus the optimizer state and the training
 * state (see checkpoint.h). */
#define _POSIX_C_SOURCE 200809L
#include "checkpoint.h"
#include "errors.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "safetensors.h"

static int train_state_to_json(const mg_train_state *s, char *out, size_t n) {
    char col[300], data[2200];
    mg_json_quote(s->csv_column, col, sizeof col);
    mg_json_quote(s->data, data, sizeof data);
    char vl[32];
    if (isfinite(s->val_loss)) snprintf(vl, sizeof vl, "%.9g", s->val_loss);
    else snprintf(vl, sizeof vl, "null");
    return snprintf(out, n,
                    "{\"step\":%" PRId64 ",\"seed\":\"%" PRIu64 "\",\"batch_size\":%d,\"val_frac\":%.17g,"
                    "\"max_tokens\":%d,\"csv_column\":%s,\"data\":%s,\"data_rows\":%" PRIu64
                    ",\"data_hash\":\"%016" PRIx64 "\",\"val_every\":%d,\"val_max\":%d,"
                    "\"ckpt_every\":%d,\"val_loss\":%s}",
                    s->step, s->seed, s->batch_size, s->val_frac, s->max_tokens, col, data,
                    s->data_rows, s->data_hash, s->val_every, s->val_max, s->ckpt_every, vl);
}

static mg_status json_int(const mg_json *j, const char *key, int64_t lo, int64_t hi, int64_t *out,
                    mg_error *err) {
    const mg_json *v = mg_json_get(j, key);
    if (!v || v->type != MG_JSON_NUMBER || !v->is_int || v->integer < lo || v->integer > hi)
        return mg_fail(err, MG_ERR_FORMAT, "checkpoint \"train\" metadata: \"%s\" missing or out of range", key);
    *out = v->integer;
    return 0;
}

static mg_status json_str(const mg_json *j, const char *key, char *out, size_t n, mg_error *err) {
    const mg_json *v = mg_json_get(j, key);
    if (!v || v->type != MG_JSON_STRING || v->len >= n)
        return mg_fail(err, MG_ERR_FORMAT, "checkpoint \"train\" metadata: \"%s\" missing or not a string", key);
    memcpy(out, v->str, v->len + 1);
    return 0;
}

static mg_status train_state_from_json(const char *js, mg_train_state *s, mg_error *err) {
    mg_json *j = NULL;
    mg_error e;
    if (mg_json_parse(js, strlen(js), &j, &e))
        return mg_fail(err, e.status, "checkpoint \"train\" metadata: %s", e.message);
    mg_status rc = MG_ERR_ARG; /* every failure path sets it */
    int64_t x;
    char buf[64];
    memset(s, 0, sizeof *s);
    if (j->type != MG_JSON_OBJECT) {
        rc = mg_fail(err, MG_ERR_FORMAT, "checkpoint \"train\" metadata is not an object");
        goto done;
    }
    if ((rc = json_int(j, "step", 0, INT64_MAX, &s->step, err))) goto done;
    if ((rc = json_str(j, "seed", buf, sizeof buf, err))) goto done;
    s->seed = strtoull(buf, NULL, 10);
    if ((rc = json_int(j, "batch_size", 1, 1 << 20, &x, err))) goto done;
    s->batch_size = (int)x;
    const mg_json *vf = mg_json_get(j, "val_frac");
    if (!vf || vf->type != MG_JSON_NUMBER || !(vf->number >= 0 && vf->number < 1)) {
        rc = mg_fail(err, MG_ERR_FORMAT, "checkpoint \"train\" metadata: bad \"val_frac\"");
        goto done;
    }
    s->val_frac = vf->number;
    if ((rc = json_int(j, "max_tokens", 0, INT32_MAX, &x, err))) goto done;
    s->max_tokens = (int)x;
    if ((rc = json_str(j, "csv_column", s->csv_column, sizeof s->csv_column, err))) goto done;
    if ((rc = json_str(j, "data", s->data, sizeof s->data, err))) goto done;
    if ((rc = json_int(j, "data_rows", 0, INT64_MAX, &x, err))) goto done;
    s->data_rows = (uint64_t)x;
    if ((rc = json_str(j, "data_hash", buf, sizeof buf, err))) goto done;
    s->data_hash = strtoull(buf, NULL, 16);
    if ((rc = json_int(j, "val_every", -1, INT32_MAX, &x, err))) goto done;
    s->val_every = (int)x;
    if ((rc = json_int(j, "val_max", 0, INT32_MAX, &x, err))) goto done;
    s->val_max = (int)x;
    if ((rc = json_int(j, "ckpt_every", 0, INT32_MAX, &x, err))) goto done;
    s->ckpt_every = (int)x;
    const mg_json *vl = mg_json_get(j, "val_loss");
    s->val_loss = (vl && vl->type == MG_JSON_NUMBER) ? vl->number : NAN;
    /* Written by molgen versions that bucketed batches by length: this one
     * draws other batches, so it cannot continue such a run as promised. */
    const mg_json *bk = mg_json_get(j, "bucket");
    if (bk && !(bk->type == MG_JSON_NUMBER && bk->number == 0)) {
        rc = mg_fail(err, MG_ERR_FORMAT, "checkpoint was trained with length-bucketed batches, which this "
                                 "molgen no longer makes: it cannot be resumed bit for bit");
        goto done;
    }
    rc = 0;
done:
    mg_json_free(j);
    return rc;
}

mg_status mg_ckpt_save(const char *path, const mg_model *m, const mg_vocab *vocab,
                           const mg_adamw *opt, const mg_train_state *ts, mg_error *err) {
    const size_t nt = mg_model_num_tensors(m);
    mg_st_tensor *t = calloc(nt + 2, sizeof *t);
    char *vj = mg_vocab_to_json(vocab);
    char cfg[512], ocfg[512], tjs[4096], step[32];
    if (!t || !vj) {
        free(t);
        free(vj);
        return mg_fail(err, MG_ERR_NOMEM, "out of memory writing the checkpoint");
    }
    mg_model_st_tensors(m, t, nt);
    const int64_t P = (int64_t)mg_model_num_params(m);
    t[nt].name = "optim.m";
    t[nt + 1].name = "optim.v";
    t[nt].data = opt->m;
    t[nt + 1].data = opt->v;
    for (size_t i = nt; i < nt + 2; i++) {
        t[i].dtype = MG_ST_F32;
        t[i].ndim = 1;
        t[i].shape[0] = P;
    }
    mg_model_config_to_json(mg_model_get_config(m), cfg, sizeof cfg);
    mg_adamw_config_to_json(&opt->cfg, ocfg, sizeof ocfg);
    train_state_to_json(ts, tjs, sizeof tjs);
    snprintf(step, sizeof step, "%" PRId64, ts->step);
    const mg_st_kv meta[] = {{"format", "molgen"}, {"config", cfg}, {"vocab", vj},
                             {"optim", ocfg},      {"train", tjs},  {"step", step}};
    mg_error e;
    mg_status rc = mg_st_write(path, t, nt + 2, meta, sizeof meta / sizeof meta[0], &e);
    free(t);
    free(vj);
    if (rc) return mg_fail(err, e.status, "writing checkpoint %s: %s", path, e.message);
    return 0;
}

void mg_ckpt_free(mg_ckpt *c) {
    mg_model_free(c->model);
    mg_vocab_free(c->vocab);
    mg_adamw_free(&c->opt);
    memset(c, 0, sizeof *c);
}

mg_status mg_ckpt_load(const char *path, mg_ckpt *ck, mg_error *err) {
    memset(ck, 0, sizeof *ck);
    mg_st_file *f = NULL;
    mg_error e;
    if (mg_st_load(path, &f, &e)) return mg_fail(err, e.status, "checkpoint: %s", e.message); /* e.message names the path */
    mg_status rc = MG_ERR_ARG; /* every failure path sets it */
    const char *fmt = mg_st_meta(f, "format");
    const char *oj = mg_st_meta(f, "optim"), *tj = mg_st_meta(f, "train"), *vj = mg_st_meta(f, "vocab");
    if (!fmt || strcmp(fmt, "molgen")) {
        rc = mg_fail(err, MG_ERR_FORMAT, "checkpoint %s: not a molgen file (metadata \"format\" missing)", path);
        goto done;
    }
    if (!oj || !tj || !vj) {
        rc = mg_fail(err, MG_ERR_FORMAT, "checkpoint %s: a model file without training state (no \"%s\" metadata): "
             "cannot resume from it", path, !oj ? "optim" : !tj ? "train" : "vocab");
        goto done;
    }
    if (mg_model_from_st(f, &ck->model, &e)) {
        rc = mg_fail(err, e.status, "checkpoint %s: %s", path, e.message);
        goto done;
    }
    if (mg_vocab_from_json(vj, strlen(vj), &ck->vocab, &e)) {
        rc = mg_fail(err, e.status, "checkpoint %s: vocab: %s", path, e.message);
        goto done;
    }
    if (mg_vocab_size(ck->vocab) != mg_model_get_config(ck->model)->vocab_size) {
        rc = mg_fail(err, MG_ERR_FORMAT, "checkpoint %s: vocab has %d tokens, the model %d", path,
             mg_vocab_size(ck->vocab), mg_model_get_config(ck->model)->vocab_size);
        goto done;
    }
    mg_adamw_config oc;
    if (mg_adamw_config_from_json(oj, &oc, &e)) {
        rc = mg_fail(err, e.status, "checkpoint %s: %s", path, e.message);
        goto done;
    }
    if (train_state_from_json(tj, &ck->ts, &e)) {
        rc = mg_fail(err, e.status, "checkpoint %s: %s", path, e.message);
        goto done;
    }
    const size_t P = mg_model_num_params(ck->model), nt = mg_model_num_tensors(ck->model);
    mg_optim_span *spans = malloc(nt * sizeof *spans);
    if (!spans) {
        rc = mg_fail(err, MG_ERR_NOMEM, "out of memory");
        goto done;
    }
    for (size_t i = 0; i < nt; i++) {
        const mg_param_info *pi = mg_model_tensor(ck->model, i);
        spans[i].offset = pi->offset;
        spans[i].numel = pi->numel;
        spans[i].decay = pi->decay;
    }
    mg_status orc = mg_adamw_init(&ck->opt, &oc, P, spans, nt, &e);
    free(spans);
    if (orc) {
        rc = mg_fail(err, e.status, "checkpoint %s: %s", path, e.message);
        goto done;
    }
    const int64_t shape[1] = {(int64_t)P};
    if (mg_st_copy(f, "optim.m", MG_ST_F32, 1, shape, ck->opt.m, P * sizeof(float), &e) ||
        mg_st_copy(f, "optim.v", MG_ST_F32, 1, shape, ck->opt.v, P * sizeof(float), &e)) {
        rc = mg_fail(err, e.status, "checkpoint %s: %s", path, e.message);
        goto done;
    }
    ck->opt.step = ck->ts.step;
    rc = 0;
done:
    mg_st_free(f);
    if (rc) mg_ckpt_free(ck);
    return rc;
}

mg_status mg_checkpoint_load(const char *path, mg_model **model, mg_adamw *opt, int64_t *step, mg_error *err) {
    mg_status rc_;
    if (!path || !model) return mg_fail(err, MG_ERR_ARG, "path or model pointer is NULL");
    mg_ckpt ck;
    if ((rc_ = mg_ckpt_load(path, &ck, err))) return rc_;
    *model = ck.model;
    ck.model = NULL;
    if (opt) {
        *opt = ck.opt;
        memset(&ck.opt, 0, sizeof ck.opt);
    }
    if (step) *step = ck.ts.step;
    mg_ckpt_free(&ck);
    return 0;
}

