/* molgen gradient dump for the PyTorch oracle (see grad_dump.h). */
#include "harness/grad_dump.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/safetensors.h"
#include "chem/tokenizer.h"
#include "harness/dump_harness.h"

void mg_grad_dump_opts_default(mg_grad_dump_opts *o) {
    memset(o, 0, sizeof *o);
    o->model.n_layer = 2;
    o->model.d_model = 16;
    o->model.n_head = 2;
    o->model.ctx_len = 8;
    o->model.vocab_size = 10;
    o->batch = 3;
    o->seed = 1;
    o->perturb = 0.6;
}

/* The dump's model (o->model_path's, or a fresh perturbed one drawing on
 * *s) with o's threads, dtype and label smoothing; its config in *mc. */
static mg_status dump_model(const mg_grad_dump_opts *o, uint64_t *s, mg_model **out,
                            mg_model_config *mc, mg_error *err) {
    mg_model *m = NULL;
    mg_status rc;
    *mc = o->model;
    if (o->model_path) {
        if ((rc = mg_model_load(o->model_path, MG_LOAD_RAW, &m, NULL, NULL, err))) return rc;
        *mc = *mg_model_get_config(m);
        if (mc->vocab_size <= MG_NUM_SPECIAL || mc->ctx_len < 2) {
            mg_model_free(m);
            return mg_fail(err, MG_ERR_ARG, "model too small for a batch");
        }
    } else {
        if ((rc = mg_model_create(mc, &m, err))) return rc;
        mg_model_init(m, o->seed);
        mg_dump_perturb(m, s, o->perturb);
    }
    mg_model_set_threads(m, o->threads);
    mg_model_set_dtype(m, (mg_dtype)o->dtype);
    if ((rc = mg_model_set_label_smoothing(m, o->label_smoothing, err))) {
        mg_model_free(m);
        return rc;
    }
    *out = m;
    return MG_OK;
}

/* The file: t [2 nt + 2] (parameters, then gradients and the batch, filled
 * here), the metadata of grad_dump.h. */
static mg_status write_dump(const mg_grad_dump_opts *o, mg_model *m, const mg_model_config *mc,
                            mg_st_tensor *t, char (*names)[96], int32_t *ids, int64_t *len,
                            int64_t B, int T, float loss, int64_t ntok, mg_error *err) {
    const size_t nt = mg_model_num_tensors(m);
    mg_model_st_tensors(m, t, nt);
    mg_dump_grad_tensors(m, t + nt, names);
    t[2 * nt] = (mg_st_tensor){.name = "batch.ids", .dtype = MG_ST_I32, .ndim = 2,
                               .shape = {B, T}, .data = ids};
    t[2 * nt + 1] = (mg_st_tensor){.name = "batch.lengths", .dtype = MG_ST_I64, .ndim = 1,
                                   .shape = {B}, .data = len};
    char cfg[512], ls[64], ns[32], eps[32];
    mg_model_config_to_json(mc, cfg, sizeof cfg);
    snprintf(ls, sizeof ls, "%.9g", (double)loss);
    snprintf(ns, sizeof ns, "%" PRId64, ntok);
    snprintf(eps, sizeof eps, "%.9g", (double)o->label_smoothing);
    const mg_st_kv meta[] = {{"format", "molgen-debug-grads"},
                             {"config", cfg},
                             {"loss", ls},
                             {"ntok", ns},
                             {"label_smoothing", eps},
                             {"dtype", mg_dtype_name((mg_dtype)o->dtype)}};
    return mg_st_write(o->out, t, 2 * nt + 2, meta, sizeof meta / sizeof meta[0], err);
}

mg_status mg_grad_dump(const mg_grad_dump_opts *o, mg_grad_dump_result *r, mg_error *err) {
    if (!o || !r || !o->out)
        return mg_fail(err, MG_ERR_ARG, "grad dump: NULL options, result or output");
    memset(r, 0, sizeof *r);
    mg_model *m = NULL;
    mg_model_config mc;
    const int64_t B = o->batch;
    uint64_t s = mg_dump_stream(o->seed);
    mg_status rc = dump_model(o, &s, &m, &mc, err);
    if (rc) return rc;
    const int T = mc.ctx_len + 1, V = mc.vocab_size;
    int32_t *ids = malloc((size_t)B * T * sizeof(int32_t)); /* [B, T] */
    int64_t *len = malloc((size_t)B * sizeof(int64_t));     /* [B] */
    const size_t nt = mg_model_num_tensors(m);
    mg_st_tensor *t = calloc(2 * nt + 2, sizeof *t);
    char(*names)[96] = calloc(nt, sizeof *names);
    if (!ids || !len || !t || !names) {
        rc = mg_fail(err, MG_ERR_NOMEM, "out of memory");
        goto out;
    }
    mg_dump_random_batch(ids, len, (int)B, T, V, &s);
    float loss;
    int64_t ntok;
    const mg_batch bt = {.ids = ids, .lengths = len, .B = (int)B, .T = T};
    if ((rc = mg_model_forward(m, &bt, o->label_smoothing > 0, 0, &loss, &ntok, err)) ||
        (rc = mg_model_backward(m, NULL, 0, err)) ||
        (rc = write_dump(o, m, &mc, t, names, ids, len, B, T, loss, ntok, err)))
        goto out;
    r->loss = loss;
    r->ntok = ntok;
    r->params = mg_model_num_params(m);
out:
    free(ids);
    free(len);
    free(t);
    free(names);
    mg_model_free(m);
    return rc;
}
