/* `molgen attention`: options -> one model's attention maps of a molecule
 * (attention_svg.h), written as SVG + TSV and printed as a per-head table. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gen/attention_svg.h"
#include "cli_options.h"
#include "cli_util.h"
#include "commands.h"
#include "nn/model.h"
#include "chem/tokenizer.h"
#include "base/util.h"

typedef struct {
    const char *model, *smiles, *out;
    int threads;
} attention_args;

#define T attention_args
static const mg_setting ATTENTION_OPTIONS[] = {
    {MG_CLI_OPT_MODEL(T)},
    {MG_OPT_STR(T, "smiles", "S", smiles,
                "the molecule (tokens must be in the model's vocabulary) (required)")},
    {MG_OPT_STR(T, "out", "DIR", out,
                "output directory; writes DIR/attention.svg (a heatmap per layer x head) and "
                "DIR/attention_heads.tsv")},
    {MG_CLI_OPT_THREADS(T)},
};
#undef T

static const char ATTENTION_USAGE[] =
    "usage: molgen attention --model FILE --smiles SMILES [--out DIR] [--threads N]\n"
    "Draw what every layer and head of a model attends to in one molecule.\n";
static const char ATTENTION_NOTES[] =
    "Prints a per-head table: mean attention distance (sum_j w_ij |i-j| averaged\n"
    "over the molecule's query tokens), share of weight on the previous token, on\n"
    "the opening digit of a ring bond (queries that close one; '-' if none), on\n"
    "BOS, the mean largest weight per row (peak), and a label (ring-closure,\n"
    "previous-token, BOS-sink, diffuse, n-gram/local, long-range); then the\n"
    "output paths.\n";

/* Everything one run holds, freed once. */
typedef struct {
    attention_args a;
    char *svg_path, *tsv_path;
    mg_model *m;
    mg_vocab *v;
    mg_attention_map map;
} attention_job;

static int write_svg(FILE *f, void *user) {
    const attention_job *j = user;
    const mg_attention_map *a = &j->map;
    char title[1024];
    snprintf(title, sizeof title, "attention of %.700s (%d tokens), model %d layers x %d heads",
             j->a.smiles, a->k, a->n_layer, a->n_head);
    return mg_attention_svg(f, a->weights, a->n_layer, a->n_head, a->L, a->labels, title,
                            a->stats);
}

static int write_tsv(FILE *f, void *user) {
    const mg_attention_map *a = &((const attention_job *)user)->map;
    return mg_attention_tsv(f, a->stats, a->n_layer, a->n_head);
}

static void print_table(const attention_job *j) {
    const mg_attention_map *a = &j->map;
    const int H = a->n_head;
    printf("attention of %s: %d tokens after BOS, %d ring closure%s\n", j->a.smiles, a->k,
           a->closures, a->closures == 1 ? "" : "s");
    printf("layer head  mean-dist   prev   ring    bos   peak  label\n");
    for (int i = 0; i < a->n_layer * H; i++) {
        const mg_head_stats *s = &a->stats[i];
        char ring[16];
        if (s->ring_n)
            snprintf(ring, sizeof ring, "%6.3f", s->ring);
        else
            snprintf(ring, sizeof ring, "%6s", "-");
        printf("%5d %4d  %9.2f  %5.3f %s  %5.3f  %5.3f  %s\n", i / H, i % H, s->mean_dist, s->prev,
               ring, s->bos, s->peak, s->label);
    }
    printf("attention map: %s\n", j->svg_path);
    printf("per-head table: %s\n", j->tsv_path);
}

/* Both outputs are checked before any work, and never replace the model. */
static int run(attention_job *j) {
    mg_error err;
    const size_t plen = strlen(j->a.out) + sizeof "/attention_heads.tsv";
    j->svg_path = malloc(plen);
    j->tsv_path = malloc(plen);
    if (!j->svg_path || !j->tsv_path) {
        fprintf(stderr, "molgen attention: out of memory\n");
        return 1;
    }
    snprintf(j->svg_path, plen, "%s/attention.svg", j->a.out);
    snprintf(j->tsv_path, plen, "%s/attention_heads.tsv", j->a.out);
    if (mg_cli_check_output_dir(j->a.out, &err)) {
        fprintf(stderr, "molgen attention: --out: %s\n", err.message);
        return 1;
    }
    const mg_cli_file outs[] = {{"--out", j->svg_path, 0}, {"--out", j->tsv_path, MG_CLI_BESIDE}};
    const mg_cli_file ins[] = {{"--model", j->a.model, 0}};
    if (mg_cli_claim_outputs("attention", outs, 2, ins, 1) < 0) return 1;
    if (mg_cli_load_model("attention", j->a.model, 0, &j->m, &j->v, NULL)) return 1;
    mg_model_set_threads(j->m, j->a.threads);
    if (mg_attention_compute(j->m, j->v, j->a.smiles, &j->map, &err) ||
        mg_cli_write_output(j->svg_path, write_svg, j, &err) ||
        mg_cli_write_output(j->tsv_path, write_tsv, j, &err)) {
        fprintf(stderr, "molgen attention: %s\n", err.message);
        return 1;
    }
    print_table(j);
    return 0;
}

int cmd_attention(int argc, char **argv) {
    attention_job j;
    memset(&j, 0, sizeof j);
    j.a.out = "out";
    const mg_cli_spec spec = {
        "attention", ATTENTION_USAGE, ATTENTION_NOTES,
        {{ATTENTION_OPTIONS, sizeof ATTENTION_OPTIONS / sizeof *ATTENTION_OPTIONS, &j.a}}, 1};
    int rc = mg_cli_parse(&spec, argc, argv, NULL);
    if (rc) return rc < 0 ? 0 : rc;
    if (!j.a.model || !j.a.smiles)
        return mg_cli_usage("attention", "--model FILE and --smiles S are required");
    rc = run(&j);
    mg_attention_map_free(&j.map);
    free(j.svg_path);
    free(j.tsv_path);
    mg_model_free(j.m);
    mg_vocab_free(j.v);
    return rc;
}
