/* `molgen bench`: options -> the throughput runs of bench.h -> a table or
 * one JSON object. */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness/bench.h"
#include "cli_options.h"
#include "cli_util.h"
#include "commands.h"
#include "chem/data.h"
#include "nn/model.h"
#include "gen/sample.h"
#include "chem/tokenizer.h"
#include "base/util.h"

typedef struct {
    const char *model, *data;
    int molgpt, batch, ctx, runs, warmup, steps, sample_n, naive_n, threads;
    int no_train, no_sample, json;
    int dtype; /* mg_dtype: fp32, bf16 */
} bench_args;

#define T bench_args
static const mg_setting BENCH_OPTIONS[] = {
    {MG_OPT_FLAG(T, "molgpt", molgpt,
                 "MolGPT's architecture (8 layers, d 256, 8 heads, dropout 0.1) instead of the "
                 "default (4 layers, d 128, 4 heads)")},
    {MG_OPT_STR(T, "model", "FILE", model,
                "benchmark this trained model instead (its config and vocab)")},
    {MG_OPT_INT(T, "batch", "B", batch, 1, 1 << 24, "rows per training step and per sampling batch")},
    {MG_OPT_INT(T, "ctx", "L", ctx, 2, 4096, "context length of a fresh model")},
    {MG_OPT_INT(T, "runs", "R", runs, 1, 64, "timed runs")},
    {MG_OPT_INT(T, "warmup", "W", warmup, 0, 100, "untimed runs first")},
    {MG_OPT_INT(T, "steps", "S", steps, 1, 1 << 24, "training steps per run")},
    {MG_OPT_INT(T, "sample-n", "N", sample_n, 1, 1 << 24, "molecules per KV sampling run")},
    {MG_OPT_INT(T, "naive-n", "N", naive_n, 0, 1 << 24,
                "molecules per naive sampling run (0 skips it)")},
    {MG_CLI_OPT_THREADS(T)},
    {MG_OPT_STR(T, "data", "FILE", data,
                "train on this file's molecules (file order, each batch cut to its longest row; "
                "tokens/s counts real targets) instead of random full rows")},
    {MG_OPT_CHOICE(T, "dtype", "fp32|bf16", dtype,
                   "the products' operands in training and KV sampling: fp32, or bf16 with fp32 "
                   "accumulation (train/sample --dtype bf16); naive sampling is fp32 only and "
                   "is skipped under bf16")},
    {MG_OPT_FLAG(T, "no-train", no_train, "skip the training part")},
    {MG_OPT_FLAG(T, "no-sample", no_sample, "skip the sampling part")},
    {MG_OPT_FLAG(T, "json", json, "one JSON object on stdout instead of the table")},
};
#undef T

static const char BENCH_USAGE[] =
    "usage: molgen bench [--molgpt] [--model FILE] [--batch B] [--ctx L] [--runs R]\n"
    "                    [--warmup W] [--steps S] [--sample-n N] [--naive-n N]\n"
    "                    [--threads N] [--data FILE] [--dtype fp32|bf16] [--no-train]\n"
    "                    [--no-sample] [--json]\n"
    "Throughput of training (tokens/s of forward+backward+AdamW steps) and of\n"
    "sampling (molecules/s, KV-cache and naive decoding); medians of R timed\n"
    "runs after W warm-up runs. Training also reports its FLOP rate and mfu: the\n"
    "step's FLOPs (6 x matmul weights per position + 12 n_layer d_model per\n"
    "causally visible query-key pair) over the fp32 FMA peak measured at start-up\n"
    "on the same threads (attn-bench's loop, about 1 s).\n";

/* Everything one run holds, freed once. */
typedef struct {
    bench_args a;
    const char *cfg_name;
    mg_model *m;
    mg_vocab *v;
    mg_dataset ds;
    mg_batcher *bat;
    mg_bench_result tr, kv, nv;
    double peak;
    const char *peak_isa;
} bench_job;

/* The --model, or a fresh model of the default or MolGPT shape with the
 * MOSES vocabulary; then the --data (read before any timing, so a bad one
 * fails at once). */
static int setup(bench_job *j) {
    const bench_args *a = &j->a;
    mg_error err;
    j->cfg_name = a->model ? a->model : a->molgpt ? "molgpt" : "default";
    if (a->model && mg_cli_load_model("bench", a->model, 0, &j->m, &j->v, NULL)) return 1;
    if (!a->model) {
        mg_model_config c;
        if (a->molgpt)
            mg_model_config_molgpt(&c);
        else
            mg_model_config_default(&c);
        c.ctx_len = a->ctx;
        if (mg_vocab_from_tokens(MG_MOSES_TOKENS, MG_MOSES_NUM_TOKENS, &j->v, &err) ||
            (c.vocab_size = mg_vocab_size(j->v), mg_model_create(&c, &j->m, &err))) {
            fprintf(stderr, "molgen bench: %s\n", err.message);
            return 1;
        }
        mg_model_init(j->m, 1);
    }
    mg_model_set_threads(j->m, a->threads);
    mg_model_set_dtype(j->m, (mg_dtype)a->dtype);
    mg_cli_note_dtype("bench", a->dtype);
    if (!a->no_train && a->data) {
        mg_load_opts lo = {NULL, mg_model_get_config(j->m)->ctx_len + 1, 0};
        if (mg_dataset_load(a->data, &lo, j->v, NULL, &j->ds, NULL, &err) ||
            mg_batcher_new(&j->ds, a->batch, 0, 0, &j->bat, &err)) {
            fprintf(stderr, "molgen bench: %s\n", err.message);
            return 1;
        }
    }
    return 0;
}

static void print_sample_line(const char *kind, int n, int batch, const mg_bench_result *r) {
    printf("sampling %-5s (%d molecules, batch %d): %10.1f molecules/s  [%.1f .. %.1f], %.0f "
           "tokens/s, %.1f tokens/molecule\n",
           kind, n, n < batch ? n : batch, r->median, r->lo, r->hi, r->tok_rate, r->extra);
}

/* KV-cache and naive sampling, before training: a --model is sampled as
 * trained. */
static int bench_sampling(bench_job *j) {
    const bench_args *a = &j->a;
    mg_error err;
    if (mg_bench_sample(j->m, j->v, MG_DECODE_KV, a->sample_n, a->batch, a->warmup, a->runs,
                        &j->kv, &err)) {
        fprintf(stderr, "molgen bench: sampling (kv): %s\n", err.message);
        return 1;
    }
    if (!a->json) print_sample_line("kv", a->sample_n, a->batch, &j->kv);
    if (a->naive_n <= 0 || a->dtype != MG_DT_F32) return 0; /* naive decoding is fp32 only */
    if (mg_bench_sample(j->m, j->v, MG_DECODE_NAIVE, a->naive_n, a->batch, a->warmup, a->runs,
                        &j->nv, &err)) {
        fprintf(stderr, "molgen bench: sampling (naive): %s\n", err.message);
        return 1;
    }
    if (!a->json) print_sample_line("naive", a->naive_n, a->batch, &j->nv);
    if (!a->json && j->nv.median > 0)
        printf("KV cache speed-up over naive: %.1fx (molecules/s)\n", j->kv.median / j->nv.median);
    return 0;
}

static int bench_training(bench_job *j) {
    const bench_args *a = &j->a;
    const int threads = mg_model_threads(j->m);
    mg_error err;
    j->peak = mg_bench_peak(threads, &j->peak_isa);
    if (mg_bench_train(j->m, a->batch, a->steps, a->warmup, a->runs, j->bat, &j->tr, &err)) {
        fprintf(stderr, "molgen bench: training: %s\n", err.message);
        return 1;
    }
    if (a->json) return 0;
    const mg_bench_result *tr = &j->tr;
    if (a->data)
        printf("training (batch %d of %s, fwd+bwd+AdamW, %d steps/run): %10.0f tokens/s  "
               "[%.0f .. %.0f]\n",
               a->batch, a->data, a->steps, tr->median, tr->lo, tr->hi);
    else
        printf("training (batch %d x %d positions, fwd+bwd+AdamW, %d steps/run): %10.0f tokens/s  "
               "[%.0f .. %.0f]\n",
               a->batch, mg_model_get_config(j->m)->ctx_len, a->steps, tr->median, tr->lo, tr->hi);
    printf("training FLOP rate %.2f GFLOP/s, mfu %.1f%% of the measured fp32 FMA peak %.1f "
           "GFLOP/s (%s, %d threads)\n",
           tr->flop_rate / 1e9, 100.0 * tr->flop_rate / 1e9 / j->peak, j->peak, j->peak_isa,
           threads);
    return 0;
}

static void print_json(const bench_job *j) {
    const bench_args *a = &j->a;
    const mg_model_config *c = mg_model_get_config(j->m);
    const mg_bench_result *tr = &j->tr, *kv = &j->kv, *nv = &j->nv;
    printf("{\"config\":\"%s\",\"n_layer\":%d,\"d_model\":%d,\"n_head\":%d,\"ctx_len\":%d,"
           "\"vocab_size\":%d,\"dropout\":%g,\"params\":%zu,\"threads\":%d,\"batch\":%d,"
           "\"runs\":%d,\"warmup\":%d,\"dtype\":\"%s\"",
           a->model ? "model" : j->cfg_name, c->n_layer, c->d_model, c->n_head, c->ctx_len,
           c->vocab_size, (double)c->dropout, mg_model_num_params(j->m), mg_model_threads(j->m),
           a->batch, a->runs, a->warmup, mg_dtype_name((mg_dtype)a->dtype));
    if (!a->no_train)
        printf(",\"train\":{\"tokens_per_s\":%.1f,\"min\":%.1f,\"max\":%.1f,\"steps_per_run\":%d,"
               "\"positions\":%d,\"data\":\"%s\",\"gflops\":%.4f,\"mfu\":%.5f,"
               "\"peak_gflops\":%.2f,\"peak_isa\":\"%s\"}",
               tr->median, tr->lo, tr->hi, a->steps, c->ctx_len, a->data ? a->data : "",
               tr->flop_rate / 1e9, tr->flop_rate / 1e9 / j->peak, j->peak, j->peak_isa);
    if (!a->no_sample) {
        printf(",\"sample_kv\":{\"molecules_per_s\":%.2f,\"min\":%.2f,\"max\":%.2f,"
               "\"tokens_per_s\":%.1f,\"tokens_per_molecule\":%.2f,\"n\":%d}",
               kv->median, kv->lo, kv->hi, kv->tok_rate, kv->extra, a->sample_n);
        if (a->naive_n > 0 && a->dtype == MG_DT_F32)
            printf(",\"sample_naive\":{\"molecules_per_s\":%.2f,\"min\":%.2f,\"max\":%.2f,"
                   "\"tokens_per_s\":%.1f,\"tokens_per_molecule\":%.2f,\"n\":%d}",
                   nv->median, nv->lo, nv->hi, nv->tok_rate, nv->extra, a->naive_n);
    }
    printf("}\n");
}

static int run(bench_job *j) {
    const bench_args *a = &j->a;
    if (setup(j)) return 1;
    const mg_model_config *c = mg_model_get_config(j->m);
    if (!a->json)
        printf("molgen bench: %s config: %d layers, d_model %d, %d heads, ctx_len %d, vocab %d, "
               "dropout %g; %.2fM parameters; %d threads; %s\n",
               j->cfg_name, c->n_layer, c->d_model, c->n_head, c->ctx_len, c->vocab_size,
               (double)c->dropout, (double)mg_model_num_params(j->m) / 1e6,
               mg_model_threads(j->m), mg_dtype_name((mg_dtype)a->dtype));
    if ((!a->no_sample && bench_sampling(j)) || (!a->no_train && bench_training(j))) return 1;
    if (a->json)
        print_json(j);
    else
        printf("(medians of %d runs after %d warm-up run%s)\n", a->runs, a->warmup,
               a->warmup == 1 ? "" : "s");
    return 0;
}

int cmd_bench(int argc, char **argv) {
    bench_job j;
    memset(&j, 0, sizeof j);
    j.a = (bench_args){.batch = 64, .ctx = 54, .runs = 5, .warmup = 1, .steps = 3,
                       .sample_n = 256, .naive_n = 64};
    const mg_cli_spec spec = {"bench", BENCH_USAGE, NULL,
                              {{BENCH_OPTIONS, sizeof BENCH_OPTIONS / sizeof *BENCH_OPTIONS, &j.a}},
                              1};
    int rc = mg_cli_parse(&spec, argc, argv, NULL);
    if (rc) return rc < 0 ? 0 : rc;
    rc = run(&j);
    mg_batcher_free(j.bat);
    mg_dataset_free(&j.ds);
    mg_model_free(j.m);
    mg_vocab_free(j.v);
    return rc;
}
