/* molgen gradient dump for the PyTorch oracle (see grad_dump.h). */
#include "harness/grad_dump.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/safetensors.h"
#include "base/util.h"

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

mg_status mg_grad_dump(const mg_grad_dump_opts *o, mg_grad_dump_result *r, mg_error *err) {
    if (!o || !r || !o->out)
        return mg_fail(err, MG_ERR_ARG, "grad dump: NULL options, result or output");
    memset(r, 0, sizeof *r);
    mg_model *m = NULL;
    mg_model_config mc = o->model;
    const int64_t B = o->batch;
    uint64_t s = o->seed ^ 0x5DEECE66Dull;
    mg_status rc;
    if (o->model_path) {
        if ((rc = mg_model_load(o->model_path, MG_LOAD_RAW, &m, NULL, NULL, err))) return rc;
        mc = *mg_model_get_config(m);
        if (mc.vocab_size <= MG_NUM_SPECIAL || mc.ctx_len < 2) {
            mg_model_free(m);
            return mg_fail(err, MG_ERR_ARG, "model too small for a batch");
        }
    } else {
        if ((rc = mg_model_create(&mc, &m, err))) return rc;
        mg_model_init(m, o->seed);
        float *p = mg_model_params(m);
        for (size_t i = 0; i < mg_model_num_params(m); i++) {
            double u = (double)(mg_splitmix64(&s) >> 11) * 0x1.0p-53;
            p[i] += (float)((u - 0.5) * o->perturb);
        }
    }
    mg_model_set_threads(m, o->threads);
    mg_model_set_dtype(m, (mg_dtype)o->dtype);
    if ((rc = mg_model_set_label_smoothing(m, o->label_smoothing, err))) {
        mg_model_free(m);
        return rc;
    }
    const int T = mc.ctx_len + 1, V = mc.vocab_size;
    int32_t *ids = malloc((size_t)B * T * sizeof(int32_t));
    int64_t *len = malloc((size_t)B * sizeof(int64_t));
    const size_t nt = mg_model_num_tensors(m), P = mg_model_num_params(m);
    mg_st_tensor *t = calloc(2 * nt + 2, sizeof *t);
    char(*names)[80] = calloc(nt, sizeof *names);
    rc = MG_OK;
    if (!ids || !len || !t || !names) {
        rc = mg_fail(err, MG_ERR_NOMEM, "out of memory");
        goto out;
    }
    for (long long b = 0; b < B; b++) {
        len[b] = b == 0 ? T : 2 + (int64_t)(mg_splitmix64(&s) % (uint64_t)(T - 1));
        for (int k = 0; k < T; k++) {
            int32_t id =
                k == 0 ? MG_BOS
                : k < len[b] - 1
                    ? (int32_t)(MG_NUM_SPECIAL + mg_splitmix64(&s) % (uint64_t)(V - MG_NUM_SPECIAL))
                : k == len[b] - 1 ? MG_EOS
                                  : MG_PAD;
            ids[b * T + k] = id;
        }
    }
    float loss;
    int64_t ntok;
    if ((rc = mg_model_forward(m, ids, len, (int)B, T, o->label_smoothing > 0, 0, &loss, &ntok,
                               err)) ||
        (rc = mg_model_backward(m, err)))
        goto out;
    mg_model_st_tensors(m, t, nt);
    for (size_t i = 0; i < nt; i++) {
        t[nt + i] = t[i];
        snprintf(names[i], sizeof names[i], "grad.%s", t[i].name);
        t[nt + i].name = names[i];
        t[nt + i].data = mg_model_grads(m) + mg_model_tensor(m, i)->offset;
    }
    t[2 * nt].name = "batch.ids";
    t[2 * nt].dtype = MG_ST_I32;
    t[2 * nt].ndim = 2;
    t[2 * nt].shape[0] = B;
    t[2 * nt].shape[1] = T;
    t[2 * nt].data = ids;
    t[2 * nt + 1].name = "batch.lengths";
    t[2 * nt + 1].dtype = MG_ST_I64;
    t[2 * nt + 1].ndim = 1;
    t[2 * nt + 1].shape[0] = B;
    t[2 * nt + 1].data = len;
    char cfg[512], ls[64], ns[32], eps[32];
    mg_model_config_to_json(&mc, cfg, sizeof cfg);
    snprintf(ls, sizeof ls, "%.9g", (double)loss);
    snprintf(ns, sizeof ns, "%" PRId64, ntok);
    snprintf(eps, sizeof eps, "%.9g", (double)o->label_smoothing);
    const mg_st_kv meta[] = {{"format", "molgen-debug-grads"},
                             {"config", cfg},
                             {"loss", ls},
                             {"ntok", ns},
                             {"label_smoothing", eps},
                             {"dtype", mg_dtype_name((mg_dtype)o->dtype)}};
    if ((rc = mg_st_write(o->out, t, 2 * nt + 2, meta, sizeof meta / sizeof meta[0], err)))
        goto out;
    r->loss = loss;
    r->ntok = ntok;
    r->params = P;
out:
    free(ids);
    free(len);
    free(t);
    free(names);
    mg_model_free(m);
    return rc;
}
