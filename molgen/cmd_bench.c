/* `molgen bench`: options -> the throughput runs of bench.h -> a table or
 * one JSON object. */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "cli_util.h"
#include "commands.h"
#include "data.h"
#include "model.h"
#include "sample.h"
#include "tokenizer.h"
#include "train_settings.h" /* MG_MAX_THREADS */
#include "util.h"

static const char *BENCH_USAGE =
    "usage: molgen bench [--molgpt] [--model FILE] [--batch B] [--ctx L] [--runs R]\n"
    "                    [--warmup W] [--steps S] [--sample-n N] [--naive-n N]\n"
    "                    [--threads N] [--data FILE] [--no-train] [--no-sample] [--json]\n"
    "Throughput of training (tokens/s of forward+backward+AdamW steps) and of\n"
    "sampling (molecules/s, KV-cache and naive decoding); medians of R timed\n"
    "runs after W warm-up runs. Training also reports its FLOP rate and mfu: the\n"
    "step's FLOPs (6 x matmul weights per position + 12 n_layer d_model per\n"
    "causally visible query-key pair) over the fp32 FMA peak measured at start-up\n"
    "on the same threads (attn-bench's loop, about 1 s).\n"
    "  --molgpt        MolGPT's architecture (8 layers, d 256, 8 heads, dropout 0.1)\n"
    "                  instead of the default (4 layers, d 128, 4 heads)\n"
    "  --model FILE    benchmark this trained model instead (its config and vocab)\n"
    "  --batch B       rows per training step and per sampling batch (default 64)\n"
    "  --ctx L         context length of a fresh model (default 54)\n"
    "  --runs R        timed runs (default 5, at most 64)\n"
    "  --warmup W      untimed runs first (default 1)\n"
    "  --steps S       training steps per run (default 3)\n"
    "  --sample-n N    molecules per KV sampling run (default 256)\n"
    "  --naive-n N     molecules per naive sampling run (default 64; 0 skips it)\n"
    "  --threads N     threads (default: ATTN_NUM_THREADS or all cores)\n"
    "  --data FILE     train on this file's molecules (file order, each batch cut\n"
    "                  to its longest row; tokens/s counts real targets) instead\n"
    "                  of random full rows\n"
    "  --no-train / --no-sample   skip a part\n"
    "  --json          one JSON object on stdout instead of the table\n";

int cmd_bench(int argc, char **argv) {
    const char *model_path = NULL, *data_path = NULL;
    int molgpt = 0, batch = 64, ctx = 54, runs = 5, warmup = 1, steps = 3, sample_n = 256,
        naive_n = 64, threads = 0, do_train = 1, do_sample = 1, json = 0;
    mg_error err;
    enum { O_MOLGPT = 1, O_NO_TRAIN, O_NO_SAMPLE, O_JSON, O_MODEL, O_DATA, O_INT };
    /* the integer options: O_INT + their index here */
    static const struct {
        const char *name;
        long long lo, hi;
    } ints[] = {{"batch", 1, 1 << 24},   {"ctx", 2, 4096},
                {"runs", 1, 64},         {"warmup", 0, 100},
                {"steps", 1, 1 << 24},   {"sample-n", 1, 1 << 24},
                {"naive-n", 0, 1 << 24}, {"threads", 1, MG_MAX_THREADS}};
    int *const targets[] = {&batch, &ctx, &runs, &warmup, &steps, &sample_n, &naive_n, &threads};
    enum { NI = sizeof ints / sizeof ints[0] };
    struct option opts[NI + 8] = {{"molgpt", no_argument, NULL, O_MOLGPT},
                                  {"no-train", no_argument, NULL, O_NO_TRAIN},
                                  {"no-sample", no_argument, NULL, O_NO_SAMPLE},
                                  {"json", no_argument, NULL, O_JSON},
                                  {"model", required_argument, NULL, O_MODEL},
                                  {"data", required_argument, NULL, O_DATA},
                                  {"help", no_argument, NULL, 'h'}};
    for (int i = 0; i < NI; i++)
        opts[7 + i] = (struct option){ints[i].name, required_argument, NULL, O_INT + i};
    opts[7 + NI] = (struct option){NULL, 0, NULL, 0};
    const char *val;
    int o;
    mg_cli_begin();
    while ((o = mg_cli_next("bench", argc, argv, "h", opts, &val)) != -1) {
        long long ll;
        switch (o) {
        case -2: return 2;
        case 'h': fputs(BENCH_USAGE, stdout); return 0;
        case O_MOLGPT: molgpt = 1; break;
        case O_NO_TRAIN: do_train = 0; break;
        case O_NO_SAMPLE: do_sample = 0; break;
        case O_JSON: json = 1; break;
        case O_MODEL: model_path = val; break;
        case O_DATA: data_path = val; break;
        default:
            if (!mg_cli_int(val, ints[o - O_INT].lo, ints[o - O_INT].hi, &ll))
                return mg_cli_bad_value("bench", argv, val);
            *targets[o - O_INT] = (int)ll;
        }
    }
    mg_model *m = NULL;
    mg_vocab *v = NULL;
    if (model_path) {
        if (mg_cli_load_model("bench", model_path, 0, &m, &v, NULL)) return 1;
    } else {
        if (mg_vocab_from_tokens(MG_MOSES_TOKENS, MG_MOSES_NUM_TOKENS, &v, &err)) {
            fprintf(stderr, "molgen bench: %s\n", err.message);
            return 1;
        }
        mg_model_config c;
        if (molgpt)
            mg_model_config_molgpt(&c);
        else
            mg_model_config_default(&c);
        c.ctx_len = ctx;
        c.vocab_size = mg_vocab_size(v);
        if (mg_model_create(&c, &m, &err)) {
            fprintf(stderr, "molgen bench: %s\n", err.message);
            mg_vocab_free(v);
            return 1;
        }
        mg_model_init(m, 1);
    }
    mg_model_set_threads(m, threads);
    const mg_model_config *c = mg_model_get_config(m);
    const char *cfg_name = model_path ? model_path : molgpt ? "molgpt" : "default";
    mg_bench_result tr, kv, nv;
    memset(&tr, 0, sizeof tr);
    memset(&kv, 0, sizeof kv);
    memset(&nv, 0, sizeof nv);
    int rc = 0;
    /* the data is read before any timing, so a bad --data fails at once */
    mg_dataset ds;
    mg_batcher *bat = NULL;
    memset(&ds, 0, sizeof ds);
    if (do_train && data_path) {
        mg_load_opts lo = {NULL, c->ctx_len + 1, 0};
        if (mg_dataset_load(data_path, &lo, v, NULL, &ds, NULL, &err) ||
            mg_batcher_new(&ds, batch, 0, 0, &bat, &err)) {
            fprintf(stderr, "molgen bench: %s\n", err.message);
            rc = 1;
            goto done;
        }
    }
    if (!json)
        printf("molgen bench: %s config: %d layers, d_model %d, %d heads, ctx_len %d, vocab %d, "
               "dropout %g; %.2fM parameters; %d threads\n",
               cfg_name, c->n_layer, c->d_model, c->n_head, c->ctx_len, c->vocab_size,
               (double)c->dropout, (double)mg_model_num_params(m) / 1e6, mg_model_threads(m));
    if (do_sample) {
        /* before training: a --model is sampled as trained */
        if (mg_bench_sample(m, v, MG_DECODE_KV, sample_n, batch, warmup, runs, &kv, &err)) {
            fprintf(stderr, "molgen bench: sampling (kv): %s\n", err.message);
            rc = 1;
            goto done;
        }
        if (!json)
            printf("sampling kv    (%d molecules, batch %d): %10.1f molecules/s  [%.1f .. %.1f], "
                   "%.0f tokens/s, %.1f tokens/molecule\n",
                   sample_n, sample_n < batch ? sample_n : batch, kv.median, kv.lo, kv.hi,
                   kv.tok_rate, kv.extra);
        if (naive_n > 0) {
            if (mg_bench_sample(m, v, MG_DECODE_NAIVE, naive_n, batch, warmup, runs, &nv, &err)) {
                fprintf(stderr, "molgen bench: sampling (naive): %s\n", err.message);
                rc = 1;
                goto done;
            }
            if (!json)
                printf(
                    "sampling naive (%d molecules, batch %d): %10.1f molecules/s  [%.1f .. %.1f], "
                    "%.0f tokens/s, %.1f tokens/molecule\n",
                    naive_n, naive_n < batch ? naive_n : batch, nv.median, nv.lo, nv.hi,
                    nv.tok_rate, nv.extra);
            if (!json && nv.median > 0)
                printf("KV cache speed-up over naive: %.1fx (molecules/s)\n",
                       kv.median / nv.median);
        }
    }
    double peak = 0;
    const char *peak_isa = "";
    if (do_train) {
        peak = mg_bench_peak(mg_model_threads(m), &peak_isa);
        rc = mg_bench_train(m, batch, steps, warmup, runs, bat, &tr, &err);
        if (rc) {
            fprintf(stderr, "molgen bench: training: %s\n", err.message);
            goto done;
        }
        if (!json && data_path)
            printf("training (batch %d of %s, fwd+bwd+AdamW, %d steps/run): %10.0f tokens/s  "
                   "[%.0f .. %.0f]\n",
                   batch, data_path, steps, tr.median, tr.lo, tr.hi);
        else if (!json)
            printf(
                "training (batch %d x %d positions, fwd+bwd+AdamW, %d steps/run): %10.0f tokens/s  "
                "[%.0f .. %.0f]\n",
                batch, c->ctx_len, steps, tr.median, tr.lo, tr.hi);
        if (!json)
            printf("training FLOP rate %.2f GFLOP/s, mfu %.1f%% of the measured fp32 FMA peak "
                   "%.1f GFLOP/s (%s, %d threads)\n",
                   tr.flop_rate / 1e9, 100.0 * tr.flop_rate / 1e9 / peak, peak, peak_isa,
                   mg_model_threads(m));
    }
    if (!json) {
        printf("(medians of %d runs after %d warm-up run%s)\n", runs, warmup,
               warmup == 1 ? "" : "s");
    } else {
        printf("{\"config\":\"%s\",\"n_layer\":%d,\"d_model\":%d,\"n_head\":%d,\"ctx_len\":%d,"
               "\"vocab_size\":%d,\"dropout\":%g,\"params\":%zu,\"threads\":%d,\"batch\":%d,"
               "\"runs\":%d,\"warmup\":%d",
               model_path ? "model" : cfg_name, c->n_layer, c->d_model, c->n_head, c->ctx_len,
               c->vocab_size, (double)c->dropout, mg_model_num_params(m), mg_model_threads(m),
               batch, runs, warmup);
        if (do_train)
            printf(
                ",\"train\":{\"tokens_per_s\":%.1f,\"min\":%.1f,\"max\":%.1f,\"steps_per_run\":%d,"
                "\"positions\":%d,\"data\":\"%s\",\"gflops\":%.4f,\"mfu\":%.5f,"
                "\"peak_gflops\":%.2f,\"peak_isa\":\"%s\"}",
                tr.median, tr.lo, tr.hi, steps, c->ctx_len, data_path ? data_path : "",
                tr.flop_rate / 1e9, tr.flop_rate / 1e9 / peak, peak, peak_isa);
        if (do_sample) {
            printf(",\"sample_kv\":{\"molecules_per_s\":%.2f,\"min\":%.2f,\"max\":%.2f,"
                   "\"tokens_per_s\":%.1f,\"tokens_per_molecule\":%.2f,\"n\":%d}",
                   kv.median, kv.lo, kv.hi, kv.tok_rate, kv.extra, sample_n);
            if (naive_n > 0)
                printf(",\"sample_naive\":{\"molecules_per_s\":%.2f,\"min\":%.2f,\"max\":%.2f,"
                       "\"tokens_per_s\":%.1f,\"tokens_per_molecule\":%.2f,\"n\":%d}",
                       nv.median, nv.lo, nv.hi, nv.tok_rate, nv.extra, naive_n);
        }
        printf("}\n");
    }
done:
    mg_batcher_free(bat);
    mg_dataset_free(&ds);
    mg_model_free(m);
    mg_vocab_free(v);
    return rc;
}
