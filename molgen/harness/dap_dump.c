/* molgen DAP gradient dump (see dap_dump.h). */
#define _POSIX_C_SOURCE 200809L
#include "harness/dap_dump.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rl/dap_loss.h"
#include "base/safetensors.h"
#include "harness/dump_harness.h"

mg_status mg_dap_dump(const mg_model_config *cfg, int B, uint64_t seed, double perturb,
                      double sigma, const double *scores, int n_scores, int threads,
                      const char *out, double *loss, mg_error *err) {
    if (B < 1 || n_scores < 1) return mg_fail(err, MG_ERR_ARG, "dap dump: no rows or scores");
    mg_model *a = NULL, *p = NULL;
    mg_status rc = mg_model_create(cfg, &a, err);
    if (!rc) rc = mg_model_create(cfg, &p, err);
    const int T = cfg->ctx_len + 1, V = cfg->vocab_size;
    const size_t nt = a ? mg_model_num_tensors(a) : 0;
    int32_t *ids = malloc((size_t)B * T * sizeof *ids);
    int64_t *len = malloc((size_t)B * sizeof *len);
    double *sc = malloc((size_t)B * sizeof *sc), *pn = malloc((size_t)B * sizeof *pn);
    double *an = malloc((size_t)B * sizeof *an);
    unsigned char *use = malloc((size_t)B);
    float *w = malloc((size_t)B * sizeof *w);
    mg_st_tensor *t = calloc(3 * nt + 3, sizeof *t);
    char(*names)[96] = calloc(2 * nt + 1, sizeof *names);
    if (!rc && (!ids || !len || !sc || !pn || !an || !use || !w || !t || !names))
        rc = mg_fail(err, MG_ERR_NOMEM, "out of memory");
    if (rc) goto out;
    uint64_t s = mg_dump_stream(seed);
    mg_model_init(a, seed);
    mg_dump_perturb(a, &s, perturb);
    memcpy(mg_model_params(p), mg_model_params(a), mg_model_num_params(a) * sizeof(float));
    mg_dump_perturb(p, &s, perturb / 2);
    mg_model_set_threads(a, threads);
    mg_model_set_threads(p, threads);
    mg_dump_random_batch(ids, len, B, T, V, &s);
    for (int b = 0; b < B; b++) {
        sc[b] = scores[b % n_scores];
        use[b] = 1;
    }
    /* the optimizer's path: prior NLL, agent NLL (kept), loss and gradient */
    const mg_batch bt = {.ids = ids, .lengths = len, .B = B, .T = T};
    if ((rc = mg_model_sequence_nll(p, &bt, pn, err)) ||
        (rc = mg_model_sequence_nll(a, &bt, an, err)) ||
        (rc = mg_opt_dap_backward(a, B, pn, an, sc, use, sigma, w, loss, err)))
        goto out;
    mg_model_st_tensors(a, t, nt);
    mg_model_st_tensors(p, t + nt, nt);
    for (size_t i = 0; i < nt; i++) {
        snprintf(names[i], sizeof names[i], "prior.%s", t[i].name);
        t[nt + i].name = names[i];
    }
    mg_dump_grad_tensors(a, t + 2 * nt, names + nt);
    t[3 * nt] = (mg_st_tensor){.name = "batch.ids", .dtype = MG_ST_I32, .ndim = 2,
                               .shape = {B, T}, .data = ids};
    t[3 * nt + 1] = (mg_st_tensor){.name = "batch.lengths", .dtype = MG_ST_I64, .ndim = 1,
                                   .shape = {B}, .data = len};
    t[3 * nt + 2] = (mg_st_tensor){.name = "batch.scores", .dtype = MG_ST_F64, .ndim = 1,
                                   .shape = {B}, .data = sc};
    char cfgj[512], ls[40], sg[40];
    mg_model_config_to_json(cfg, cfgj, sizeof cfgj);
    snprintf(ls, sizeof ls, "%.17g", *loss);
    snprintf(sg, sizeof sg, "%.17g", sigma);
    const mg_st_kv meta[] = {
        {"format", "molgen-debug-dap"}, {"config", cfgj}, {"sigma", sg}, {"loss", ls}};
    rc = mg_st_write(out, t, 3 * nt + 3, meta, 4, err);
out:
    free(ids);
    free(len);
    free(sc);
    free(pn);
    free(an);
    free(use);
    free(w);
    free(t);
    free(names);
    mg_model_free(a);
    mg_model_free(p);
    return rc;
}
