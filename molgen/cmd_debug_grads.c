/* `molgen debug-grads` (hidden, for tests): options -> mg_grad_dump
 * (grad_dump.h). */
#define _POSIX_C_SOURCE 200809L
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli_util.h"
#include "commands.h"
#include "grad_dump.h"
#include "train_settings.h" /* MG_MAX_THREADS */

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
    "  --batch N (3)  --seed N (1)  --perturb X (0.6)  --threads N\n"
    "  --label-smoothing X (0)  the training loss's (then a training-mode forward)\n";

int cmd_debug_grads(int argc, char **argv) {
    mg_grad_dump_opts g;
    mg_grad_dump_opts_default(&g);
    mg_model_config mc = g.model;
    long long B = g.batch, threads = 0, ll;
    uint64_t seed = g.seed;
    double perturb = g.perturb, ls = 0;
    const char *out = NULL, *model_path = NULL;
    enum {
        O_OUT = 1,
        O_MODEL,
        O_LAYERS,
        O_DMODEL,
        O_HEADS,
        O_CTX,
        O_VOCAB,
        O_BATCH,
        O_THREADS,
        O_SEED,
        O_PERTURB,
        O_LS
    };
    static const struct option opts[] = {{"out", required_argument, NULL, O_OUT},
                                         {"model", required_argument, NULL, O_MODEL},
                                         {"layers", required_argument, NULL, O_LAYERS},
                                         {"d-model", required_argument, NULL, O_DMODEL},
                                         {"heads", required_argument, NULL, O_HEADS},
                                         {"ctx-len", required_argument, NULL, O_CTX},
                                         {"vocab", required_argument, NULL, O_VOCAB},
                                         {"batch", required_argument, NULL, O_BATCH},
                                         {"threads", required_argument, NULL, O_THREADS},
                                         {"seed", required_argument, NULL, O_SEED},
                                         {"perturb", required_argument, NULL, O_PERTURB},
                                         {"label-smoothing", required_argument, NULL, O_LS},
                                         {"help", no_argument, NULL, 'h'},
                                         {NULL, 0, NULL, 0}};
    const char *v;
    int o;
    mg_cli_begin();
    while ((o = mg_cli_next("debug-grads", argc, argv, "h", opts, &v)) != -1) {
        int ok = 1;
        switch (o) {
        case -2: return 2;
        case 'h': fputs(DEBUG_GRADS_USAGE, stdout); return 0;
        case O_OUT: out = v; break;
        case O_MODEL: model_path = v; break;
        case O_LAYERS:
            ok = mg_cli_int(v, 1, 64, &ll);
            mc.n_layer = (int)ll;
            break;
        case O_DMODEL:
            ok = mg_cli_int(v, 1, 4096, &ll);
            mc.d_model = (int)ll;
            break;
        case O_HEADS:
            ok = mg_cli_int(v, 1, 4096, &ll);
            mc.n_head = (int)ll;
            break;
        case O_CTX:
            ok = mg_cli_int(v, 1, 4096, &ll);
            mc.ctx_len = (int)ll;
            break;
        case O_VOCAB:
            ok = mg_cli_int(v, 4, 100000, &ll);
            mc.vocab_size = (int)ll;
            break;
        case O_BATCH: ok = mg_cli_int(v, 1, 100000, &B); break;
        case O_THREADS: ok = mg_cli_int(v, 1, MG_MAX_THREADS, &threads); break;
        case O_SEED: ok = mg_cli_u64(v, &seed); break;
        case O_PERTURB: ok = mg_cli_double(v, &perturb) && perturb >= 0; break;
        case O_LS: ok = mg_cli_double(v, &ls) && ls >= 0 && ls < 1; break;
        }
        if (!ok) return mg_cli_bad_value("debug-grads", argv, v);
    }
    if (!out) {
        fprintf(stderr, "molgen debug-grads: --out FILE is required\n");
        return 2;
    }
    /* the file is written whole and renamed (a symbolic link is kept) */
    const mg_cli_file outs[] = {{"--out", out, MG_CLI_WHOLE}};
    const mg_cli_file ins[] = {{"--model", model_path, 0}};
    if (mg_cli_claim_outputs("debug-grads", outs, 1, ins, 1) < 0) return 1;
    char target[4096];
    g.model = mc;
    g.out = mg_cli_output_target(out, target, sizeof target);
    g.model_path = model_path;
    g.batch = B;
    g.seed = seed;
    g.perturb = perturb;
    g.threads = (int)threads;
    g.label_smoothing = (float)ls;
    mg_grad_dump_result r;
    mg_error err;
    if (mg_grad_dump(&g, &r, &err)) {
        fprintf(stderr, "molgen debug-grads: %s\n", err.message);
        return 1;
    }
    printf("%s loss %.9g over %" PRId64 " tokens, %zu parameters\n", out, (double)r.loss, r.ntok,
           r.params);
    return 0;
}
