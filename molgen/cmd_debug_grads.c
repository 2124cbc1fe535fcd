/* `molgen debug-grads` (hidden, for tests): one forward/backward of a random
 * batch written out for the PyTorch oracle. */
#define _POSIX_C_SOURCE 200809L
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attn.h"
#include "cli_util.h"
#include "commands.h"
#include "model.h"
#include "safetensors.h"
#include "util.h"

static const char DEBUG_GRADS_USAGE[] =
    "usage: molgen debug-grads --out FILE [options]   (testing tool)\n"
    "Builds a model (GPT-2 init from --seed, then every parameter += U(-p/2, p/2)\n"
    "with p = --perturb), runs one forward/backward on a random batch and writes a\n"
    "safetensors file: the parameters under their names, their gradients as\n"
    "\"grad.<name>\", the batch as \"batch.ids\" I32 [B, T] and \"batch.lengths\"\n"
    "I64 [B], and metadata config, loss, ntok. molgen/tests/test_model_torch.py\n"
    "compares them with PyTorch autograd.\n"
    "  --model FILE    use this model / checkpoint as is (no init, no perturbation)\n"
    "  --layers N (2)  --d-model N (16)  --heads N (2)  --ctx-len N (8)  --vocab N (10)\n"
    "  --batch N (3)  --seed N (1)  --perturb X (0.6)  --threads N\n";

int cmd_debug_grads(int argc, char **argv) {
    mg_model_config mc;
    memset(&mc, 0, sizeof mc);
    mc.n_layer = 2;
    mc.d_model = 16;
    mc.n_head = 2;
    mc.ctx_len = 8;
    mc.vocab_size = 10;
    long long B = 3, threads = 0, ll;
    uint64_t seed = 1;
    double perturb = 0.6;
    const char *out = NULL, *model_path = NULL;
    mg_error err;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            fputs(DEBUG_GRADS_USAGE, stdout);
            return 0;
        }
        const char *v = NULL;
        if (!mg_cli_value(argc, argv, &i, &v, &err)) {
            fprintf(stderr, "molgen debug-grads: %s\n", err.message);
            return 2;
        }
        int ok = 1;
        if (!strcmp(a, "--out")) out = v;
        else if (!strcmp(a, "--model")) model_path = v;
        else if (!strcmp(a, "--layers")) { ok = mg_cli_int(v, 1, 64, &ll); mc.n_layer = (int)ll; }
        else if (!strcmp(a, "--d-model")) { ok = mg_cli_int(v, 1, 4096, &ll); mc.d_model = (int)ll; }
        else if (!strcmp(a, "--heads")) { ok = mg_cli_int(v, 1, 4096, &ll); mc.n_head = (int)ll; }
        else if (!strcmp(a, "--ctx-len")) { ok = mg_cli_int(v, 1, 4096, &ll); mc.ctx_len = (int)ll; }
        else if (!strcmp(a, "--vocab")) { ok = mg_cli_int(v, 4, 100000, &ll); mc.vocab_size = (int)ll; }
        else if (!strcmp(a, "--batch")) ok = mg_cli_int(v, 1, 100000, &B);
        else if (!strcmp(a, "--threads")) ok = mg_cli_int(v, 1, 4096, &threads);
        else if (!strcmp(a, "--seed")) ok = mg_cli_u64(v, &seed);
        else if (!strcmp(a, "--perturb")) ok = mg_cli_double(v, &perturb) && perturb >= 0;
        else {
            fprintf(stderr, "molgen debug-grads: unknown option %s\n", a);
            return 2;
        }
        if (!ok) {
            fprintf(stderr, "molgen debug-grads: bad value '%s' for %s\n", v, a);
            return 2;
        }
    }
    if (!out) {
        fprintf(stderr, "molgen debug-grads: --out FILE is required\n");
        return 2;
    }
    if (threads > 0) attn_set_num_threads((int)threads, NULL);
    mg_model *m = NULL;
    uint64_t s = seed ^ 0x5DEECE66Dull;
    if (model_path) {
        if (mg_model_load(model_path, &m, NULL, NULL, &err)) {
            fprintf(stderr, "molgen debug-grads: %s\n", err.message);
            return 1;
        }
        mc = *mg_model_get_config(m);
        if (mc.vocab_size <= MG_NUM_SPECIAL || mc.ctx_len < 2) {
            fprintf(stderr, "molgen debug-grads: model too small for a batch\n");
            mg_model_free(m);
            return 1;
        }
    } else {
        if (mg_model_create(&mc, &m, &err)) {
            fprintf(stderr, "molgen debug-grads: %s\n", err.message);
            return 1;
        }
        mg_model_init(m, seed);
        float *p = mg_model_params(m);
        for (size_t i = 0; i < mg_model_num_params(m); i++) {
            double u = (double)(mg_splitmix64(&s) >> 11) * 0x1.0p-53;
            p[i] += (float)((u - 0.5) * perturb);
        }
    }
    const int T = mc.ctx_len + 1, V = mc.vocab_size;
    int32_t *ids = malloc((size_t)B * T * sizeof(int32_t));
    int64_t *len = malloc((size_t)B * sizeof(int64_t));
    const size_t nt = mg_model_num_tensors(m), P = mg_model_num_params(m);
    mg_st_tensor *t = calloc(2 * nt + 2, sizeof *t);
    char (*names)[80] = calloc(nt, sizeof *names);
    int rc = 1;
    if (!ids || !len || !t || !names) {
        fprintf(stderr, "molgen debug-grads: out of memory\n");
        goto out;
    }
    for (long long b = 0; b < B; b++) {
        len[b] = b == 0 ? T : 2 + (int64_t)(mg_splitmix64(&s) % (uint64_t)(T - 1));
        for (int k = 0; k < T; k++) {
            int32_t id = k == 0 ? MG_BOS
                         : k < len[b] - 1 ? (int32_t)(MG_NUM_SPECIAL + mg_splitmix64(&s) % (uint64_t)(V - MG_NUM_SPECIAL))
                         : k == len[b] - 1 ? MG_EOS : MG_PAD;
            ids[b * T + k] = id;
        }
    }
    float loss;
    int64_t ntok;
    if (mg_model_forward(m, ids, len, (int)B, T, 0, 0, &loss, &ntok, &err) ||
        mg_model_backward(m, &err)) {
        fprintf(stderr, "molgen debug-grads: %s\n", err.message);
        goto out;
    }
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
    char cfg[512], ls[64], ns[32];
    mg_model_config_to_json(&mc, cfg, sizeof cfg);
    snprintf(ls, sizeof ls, "%.9g", (double)loss);
    snprintf(ns, sizeof ns, "%" PRId64, ntok);
    const mg_st_kv meta[] = {{"format", "molgen-debug-grads"}, {"config", cfg}, {"loss", ls}, {"ntok", ns}};
    if (mg_st_write(out, t, 2 * nt + 2, meta, 4, &err)) {
        fprintf(stderr, "molgen debug-grads: %s\n", err.message);
        goto out;
    }
    printf("%s loss %.9g over %" PRId64 " tokens, %zu parameters\n", out, (double)loss, ntok, P);
    rc = 0;
out:
    free(ids);
    free(len);
    free(t);
    free(names);
    mg_model_free(m);
    return rc;
}
