/* `molgen train`: options -> mg_train_config -> mg_train_run (train.h). */
#define _POSIX_C_SOURCE 200809L
#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attn.h"
#include "cli_util.h"
#include "commands.h"
#include "safetensors.h"
#include "train.h"

static const char TRAIN_USAGE[] =
    "usage: molgen train [options]\n"
    "Train the SMILES transformer; writes a checkpoint (safetensors) that `molgen\n"
    "sample` reads and `--resume` continues bit for bit (same thread count).\n"
    "Data and output:\n"
    "  --data FILE          .smi (first field per line) or .csv (see --csv-column);\n"
    "                       default $MOLGEN_SHARED_DATA/moses_176k.smi when that\n"
    "                       is set, else data/moses_20k.smi (the shipped sample)\n"
    "  --csv-column NAME    CSV column with the SMILES (default smiles)\n"
    "  --out FILE           checkpoint written periodically and at the end\n"
    "                       (default out/model.safetensors, or the --resume file;\n"
    "                       written atomically)\n"
    "  --resume FILE        continue a checkpoint (its model, optimizer, data split,\n"
    "                       seed and batch size; --data overrides its data path)\n"
    "  --max-tokens N       skip molecules longer than N tokens (default 256; 0 = no\n"
    "                       limit); skipped lines are reported as file:line\n"
    "  --val-frac X         validation fraction, split by seed (default 0.05)\n"
    "Length (whichever comes first; one of them is required for a fresh run):\n"
    "  --steps N            optimizer steps of the schedule (total, from step 0)\n"
    "  --time-limit SEC     wall-clock limit for this run (at most a year); without\n"
    "                       --steps the schedule length is estimated from 10 timed\n"
    "                       steps\n"
    "Model (ignored with --resume):\n"
    "  --preset NAME        default (4 layers, d_model 128, 4 heads, dropout 0) or\n"
    "                       molgpt (8 layers, d_model 256, 8 heads, dropout 0.1)\n"
    "  --layers N  --d-model N  --heads N  --dropout X (in [0, 1))\n"
    "  --ctx-len N          positions (default: longest molecule + 1)\n"
    "Optimizer (AdamW, warm-up + cosine; ignored with --resume):\n"
    "  --batch-size N (32)  --lr X (2e-3)  --min-lr-frac X (0.1)  --warmup N (100)\n"
    "  --weight-decay X (0.1)  --grad-clip X (1.0; >= 0, 0 = off)  --beta1 X (0.9)\n"
    "  --beta2 X (0.95)\n"
    "Run:\n"
    "  --seed N             init, split, shuffle and dropout seed, decimal in\n"
    "                       [0, 2^64) (default 1)\n"
    "  --threads N          threads (default: ATTN_NUM_THREADS or all cores)\n"
    "  --val-every N        validation every N steps (0 = at the end only; default\n"
    "                       auto: about 10 per run, at most 5% of a time-limited run)\n"
    "  --val-max N          validation molecules used (default 2000; 0 = all)\n"
    "  --ckpt-every N       periodic checkpoint every N steps (default 1000; 0 = off)\n"
    "  --no-progress        no progress line (validation lines only)\n"
    "  --quiet              print nothing on stderr except errors\n"
    "Testing:\n"
    "  --stop-after N       stop (and checkpoint) once N steps are done\n"
    "  --debug-no-causal-mask  build attention WITHOUT the causal mask: the\n"
    "                       causal-leak guard must refuse to train it\n"
    "  --no-guard           skip the causal-leak guard\n"
    "Progress goes to stderr; a one-line JSON summary to stdout. SIGINT/SIGTERM\n"
    "write a checkpoint and exit with 128 + the signal number; errors exit 1.\n";

static int train_usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int train_usage_error(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("molgen train: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputs(" (see molgen train --help)\n", stderr);
    va_end(ap);
    return 2;
}

int cmd_train(int argc, char **argv) {
    mg_train_config c;
    mg_train_config_default(&c);
    c.out_path = NULL;
    /* model flags are applied after the preset, whatever their order */
    long long layers = -1, dmodel = -1, heads = -1, ctx = -1;
    double dropout = 0;
    int dropout_set = 0;
    const char *preset = "default";
    int threads = 0, no_mask = 0;
    mg_error err;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            fputs(TRAIN_USAGE, stdout);
            return 0;
        }
        if (!strcmp(a, "--no-progress")) { c.progress = 0; continue; }
        if (!strcmp(a, "--quiet")) { c.quiet = 1; continue; }
        if (!strcmp(a, "--debug-no-causal-mask")) { no_mask = 1; continue; }
        if (!strcmp(a, "--no-guard")) { c.skip_guard = 1; continue; }
        if (strncmp(a, "--", 2)) return train_usage_error("unexpected argument '%s'", a);
        static const char *const value_opts[] = {
            "--data", "--csv-column", "--out", "--resume", "--preset", "--seed", "--time-limit",
            "--steps", "--stop-after", "--max-tokens", "--batch-size", "--warmup", "--val-every",
            "--val-max", "--ckpt-every", "--threads", "--layers", "--d-model", "--heads",
            "--ctx-len", "--dropout", "--val-frac", "--lr", "--min-lr-frac", "--weight-decay",
            "--grad-clip", "--beta1", "--beta2"};
        int known = 0;
        const size_t alen = strcspn(a, "=");
        for (size_t k = 0; k < sizeof value_opts / sizeof value_opts[0]; k++)
            known |= strlen(value_opts[k]) == alen && !strncmp(a, value_opts[k], alen);
        if (!known) return train_usage_error("unknown option %.*s", (int)alen, a);
        const char *v = NULL;
        if (!mg_cli_value(argc, argv, &i, &v, &err)) return train_usage_error("%s", err.message);
        long long ll = 0;
        double dv = 0;
        uint64_t u = 0;
        int ok = 1;
#define INT_OPT(name, lo, hi, dst) \
    else if (!strcmp(a, name)) { ok = mg_cli_int(v, lo, hi, &ll); dst = ll; }
#define DBL_OPT(name, dst) \
    else if (!strcmp(a, name)) { ok = mg_cli_double(v, &dv); dst = dv; }
        if (!strcmp(a, "--data")) c.data_path = v;
        else if (!strcmp(a, "--csv-column")) c.csv_column = v;
        else if (!strcmp(a, "--out")) c.out_path = v;
        else if (!strcmp(a, "--resume")) c.resume_path = v;
        else if (!strcmp(a, "--preset")) preset = v;
        else if (!strcmp(a, "--seed")) { ok = mg_cli_u64(v, &u); c.seed = u; }
        else if (!strcmp(a, "--time-limit")) {
            ok = mg_cli_double(v, &dv) && dv > 0 && dv <= MG_TIME_LIMIT_MAX;
            c.time_limit = dv;
        }
        INT_OPT("--steps", 1, INT64_MAX / 8, c.steps)
        INT_OPT("--stop-after", 1, INT64_MAX / 8, c.stop_after)
        INT_OPT("--max-tokens", 0, 1000000, c.max_tokens)
        INT_OPT("--batch-size", 1, 1 << 20, c.batch_size)
        INT_OPT("--warmup", 0, INT64_MAX / 8, c.optim.warmup_steps)
        INT_OPT("--val-every", 0, INT32_MAX, c.val_every)
        INT_OPT("--val-max", 0, INT32_MAX, c.val_max)
        INT_OPT("--ckpt-every", 0, INT32_MAX, c.ckpt_every)
        INT_OPT("--threads", 1, 4096, threads)
        INT_OPT("--layers", 1, 1024, layers)
        INT_OPT("--d-model", 1, 65536, dmodel)
        INT_OPT("--heads", 1, 65536, heads)
        INT_OPT("--ctx-len", 1, 65536, ctx)
        else if (!strcmp(a, "--dropout")) { ok = mg_cli_double(v, &dropout); dropout_set = 1; }
        DBL_OPT("--val-frac", c.val_frac)
        DBL_OPT("--lr", c.optim.lr)
        DBL_OPT("--min-lr-frac", c.optim.min_lr_frac)
        DBL_OPT("--weight-decay", c.optim.weight_decay)
        DBL_OPT("--grad-clip", c.optim.grad_clip)
        DBL_OPT("--beta1", c.optim.beta1)
        DBL_OPT("--beta2", c.optim.beta2)
        else return train_usage_error("unknown option %s", a);
#undef INT_OPT
#undef DBL_OPT
        if (!ok) {
            char cut[96];
            if (!strcmp(a, "--time-limit"))
                return train_usage_error("bad value '%s' for --time-limit (seconds, > 0 and <= %g)",
                                         mg_cli_cut(v, cut, sizeof cut), MG_TIME_LIMIT_MAX);
            return train_usage_error("bad value '%s' for %s", mg_cli_cut(v, cut, sizeof cut), a);
        }
    }
    if (!strcmp(preset, "default")) mg_model_config_default(&c.model);
    else if (!strcmp(preset, "molgpt")) mg_model_config_molgpt(&c.model);
    else return train_usage_error("unknown preset '%s' (default or molgpt)", preset);
    if (layers > 0) c.model.n_layer = (int)layers;
    if (dmodel > 0) c.model.d_model = (int)dmodel;
    if (heads > 0) c.model.n_head = (int)heads;
    if (ctx > 0) c.model.ctx_len = (int)ctx;
    if (dropout_set) c.model.dropout = (float)dropout;
    c.model.no_causal_mask = no_mask;
    if (c.model.d_model % c.model.n_head)
        return train_usage_error("--heads %d does not divide --d-model %d", c.model.n_head, c.model.d_model);
    if (!(c.model.dropout >= 0 && c.model.dropout < 1))
        return train_usage_error("--dropout %g must be in [0, 1)", (double)c.model.dropout);
    if (!c.resume_path) {
        mg_adamw_config oc = c.optim;
        oc.total_steps = 1;
        if (mg_adamw_config_check(&oc, &err)) return train_usage_error("%s", err.message);
        if (c.steps == 0 && c.time_limit <= 0)
            return train_usage_error("give --steps N or --time-limit SECONDS (or both)");
    }
    if (!c.out_path) c.out_path = c.resume_path ? c.resume_path : "out/model.safetensors";
    char data_default[4096];
    if (!c.data_path && !c.resume_path) {
        const char *dir = getenv("MOLGEN_SHARED_DATA");
        if (dir && *dir) {
            snprintf(data_default, sizeof data_default, "%s/moses_176k.smi", dir);
            c.data_path = data_default;
        } else {
            c.data_path = "data/moses_20k.smi";
        }
    }
    if (threads > 0 && attn_set_num_threads(threads, NULL))
        return train_usage_error("cannot use %d threads", threads);
    /* every output is checked before any work (a run is never lost at its
     * first checkpoint), and never overwrites the data */
    const char *inputs[] = {c.data_path};
    if (mg_cli_check_output(c.out_path, inputs, 1, &err)) {
        fprintf(stderr, "molgen train: --out: %s\n", err.message);
        return 1;
    }
    int stale = mg_st_remove_stale_temps(c.out_path);
    if (stale > 0 && !c.quiet)
        fprintf(stderr, "removed %d stale temporary file(s) of %s left by killed runs\n", stale,
                c.out_path);
    mg_train_install_signal_handlers();
    mg_train_result r;
    if (mg_train_run(&c, &r, &err)) {
        fprintf(stderr, "molgen train: %s\n", err.message);
        return 1;
    }
    char out_q[4200];
    mg_json_quote(c.out_path, out_q, sizeof out_q);
    static const char *const why[] = {"done", "time_limit", "signal", "stop_after"};
    printf("{\"out\":%s,\"step\":%" PRId64 ",\"total_steps\":%" PRId64 ",\"train_loss\":%.6g,"
           "\"val_loss\":%.6g,\"first_val_loss\":%.6g,\"unigram_entropy\":%.6g,"
           "\"tokens_per_sec\":%.1f,\"seconds\":%.1f,\"stop\":\"%s\",\"skipped_lines\":%ld}\n",
           out_q, r.step, r.total_steps, r.train_loss, isnan(r.val_loss) ? -1.0 : r.val_loss,
           isnan(r.first_val_loss) ? -1.0 : r.first_val_loss, r.unigram_entropy, r.tokens_per_sec,
           r.seconds, why[r.stop], r.skipped);
    fflush(stdout);
    if (r.stop == MG_STOP_SIGNAL) return 128 + (mg_train_stop_signal() ? mg_train_stop_signal() : SIGINT);
    return 0;
}
