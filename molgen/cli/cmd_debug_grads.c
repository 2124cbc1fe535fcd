/* `molgen debug-grads` (hidden, for tests): options -> mg_grad_dump
 * (grad_dump.h). */
#define _POSIX_C_SOURCE 200809L
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli_options.h"
#include "cli_util.h"
#include "commands.h"
#include "harness/grad_dump.h"
#include "base/util.h"

#define T mg_grad_dump_opts
static const mg_setting DEBUG_GRADS_OPTIONS[] = {
    {MG_OPT_STR(T, "out", "FILE", out, "the safetensors file to write (required)")},
    {MG_OPT_STR(T, "model", "FILE", model_path,
                "use this model / checkpoint as is (no init, no perturbation)")},
    {MG_OPT_INT(T, "layers", "N", model.n_layer, 1, 64, "transformer blocks")},
    {MG_OPT_INT(T, "d-model", "N", model.d_model, 1, 4096, "width")},
    {MG_OPT_INT(T, "heads", "N", model.n_head, 1, 4096, "attention heads")},
    {MG_OPT_INT(T, "ctx-len", "N", model.ctx_len, 1, 4096, "positions")},
    {MG_OPT_INT(T, "vocab", "N", model.vocab_size, 4, 100000, "vocabulary size")},
    {MG_OPT_I64(T, "batch", "N", batch, 1, 100000, "rows of the random batch")},
    {MG_CLI_OPT_THREADS(T)},
    {MG_OPT_U64(T, "seed", "N", seed, "init and batch seed")},
    {MG_OPT_F64(T, "perturb", "X", perturb, 0, INFINITY, MG_CLOSED,
                "every parameter += U(-X/2, X/2) after the init")},
    {MG_OPT_F32(T, "label-smoothing", "X", label_smoothing, 0, 1, MG_OPEN_HI,
                "the training loss's (then a training-mode forward)")},
    {MG_OPT_CHOICE(T, "dtype", "fp32|bf16", dtype,
                   "the products' operands: fp32, or bf16 with fp32 accumulation (train "
                   "--dtype bf16's mixed precision)")},
};
#undef T

static const char DEBUG_GRADS_USAGE[] =
    "usage: molgen debug-grads --out FILE [options]   (testing tool)\n"
    "Builds a model (GPT-2 init from --seed, then every parameter += U(-p/2, p/2)\n"
    "with p = --perturb), runs one forward/backward on a random batch and writes a\n"
    "safetensors file: the parameters under their names, their gradients as\n"
    "\"grad.<name>\", the batch as \"batch.ids\" I32 [B, T] and \"batch.lengths\"\n"
    "I64 [B], and metadata config, loss, ntok, dtype. molgen/tests/\n"
    "test_model_torch.py and test_bf16_train_twin.py compare them with PyTorch\n"
    "autograd.\n";

int cmd_debug_grads(int argc, char **argv) {
    mg_grad_dump_opts g;
    mg_grad_dump_opts_default(&g);
    const mg_cli_spec spec = {
        "debug-grads", DEBUG_GRADS_USAGE, NULL,
        {{DEBUG_GRADS_OPTIONS, sizeof DEBUG_GRADS_OPTIONS / sizeof *DEBUG_GRADS_OPTIONS, &g}}, 1};
    int rc = mg_cli_parse(&spec, argc, argv, NULL);
    if (rc) return rc < 0 ? 0 : rc;
    if (!g.out) {
        fprintf(stderr, "molgen debug-grads: --out FILE is required\n");
        return 2;
    }
    /* the file is written whole and renamed (a symbolic link is kept) */
    const mg_cli_file outs[] = {{"--out", g.out, MG_CLI_WHOLE}};
    const mg_cli_file ins[] = {{"--model", g.model_path, 0}};
    if (mg_cli_claim_outputs("debug-grads", outs, 1, ins, 1) < 0) return 1;
    const char *out = g.out;
    char *target = malloc(MG_CLI_PATH_MAX);
    mg_grad_dump_result r;
    mg_error err;
    if (!target)
        rc = mg_fail(&err, MG_ERR_NOMEM, "out of memory");
    else {
        g.out = mg_cli_output_target(out, target, MG_CLI_PATH_MAX);
        rc = mg_grad_dump(&g, &r, &err);
    }
    free(target);
    if (rc) {
        fprintf(stderr, "molgen debug-grads: %s\n", err.message);
        return 1;
    }
    printf("%s loss %.9g over %" PRId64 " tokens, %zu parameters\n", out, (double)r.loss, r.ntok,
           r.params);
    return 0;
}
