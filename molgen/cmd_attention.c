/* `molgen attention`: options -> one model's attention maps of a molecule
 * (attention.h), written as SVG + TSV and printed as a per-head table. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "attention.h"
#include "cli_util.h"
#include "commands.h"
#include "model.h"
#include "tokenizer.h"
#include "train_settings.h" /* MG_MAX_THREADS */

static const char *ATTENTION_USAGE =
    "usage: molgen attention --model FILE --smiles SMILES [--out DIR] [--threads N]\n"
    "Draw what every layer and head of a model attends to in one molecule.\n"
    "  --model FILE     model or checkpoint (.safetensors) with its vocabulary\n"
    "  --smiles S       the molecule (tokens must be in the model's vocabulary)\n"
    "  --out DIR        output directory (default out); writes DIR/attention.svg\n"
    "                   (a heatmap per layer x head) and DIR/attention_heads.tsv\n"
    "  --threads N      threads (default: ATTN_NUM_THREADS or all cores)\n"
    "Prints a per-head table: mean attention distance (sum_j w_ij |i-j| averaged\n"
    "over the molecule's query tokens), share of weight on the previous token, on\n"
    "the opening digit of a ring bond (queries that close one; '-' if none), on\n"
    "BOS, the mean largest weight per row (peak), and a label (ring-closure,\n"
    "previous-token, BOS-sink, diffuse, n-gram/local, long-range); then the\n"
    "output paths.\n";

int cmd_attention(int argc, char **argv) {
    const char *model_path = NULL, *smiles = NULL, *out_dir = "out", *val;
    int threads = 0, o;
    enum { O_MODEL = 1, O_SMILES, O_OUT, O_THREADS };
    static const struct option opts[] = {{"model", required_argument, NULL, O_MODEL},
                                         {"smiles", required_argument, NULL, O_SMILES},
                                         {"out", required_argument, NULL, O_OUT},
                                         {"threads", required_argument, NULL, O_THREADS},
                                         {"help", no_argument, NULL, 'h'},
                                         {NULL, 0, NULL, 0}};
    mg_cli_begin();
    while ((o = mg_cli_next("attention", argc, argv, "h", opts, &val)) != -1) {
        long long ll;
        switch (o) {
        case -2: return 2;
        case 'h': fputs(ATTENTION_USAGE, stdout); return 0;
        case O_MODEL: model_path = val; break;
        case O_SMILES: smiles = val; break;
        case O_OUT: out_dir = val; break;
        case O_THREADS:
            if (!mg_cli_int(val, 1, MG_MAX_THREADS, &ll))
                return mg_cli_bad_value("attention", argv, val);
            threads = (int)ll;
            break;
        }
    }
    if (!model_path || !smiles) {
        fprintf(stderr, "molgen attention: --model FILE and --smiles S are required (see molgen "
                        "attention --help)\n");
        return 2;
    }
    /* both outputs are checked before any work, and never replace the model */
    const size_t plen = strlen(out_dir) + 32;
    char *svg_path = malloc(plen), *tsv_path = malloc(plen);
    mg_model *m = NULL;
    mg_vocab *v = NULL;
    mg_attention_map a;
    memset(&a, 0, sizeof a);
    mg_error err;
    int rc = 1;
    if (!svg_path || !tsv_path) {
        fprintf(stderr, "molgen attention: out of memory\n");
        goto done;
    }
    snprintf(svg_path, plen, "%s/attention.svg", out_dir);
    snprintf(tsv_path, plen, "%s/attention_heads.tsv", out_dir);
    if (mg_cli_check_output_dir(out_dir, &err)) {
        fprintf(stderr, "molgen attention: --out: %s\n", err.message);
        goto done;
    }
    const mg_cli_file outs[] = {{"--out", svg_path, 0}, {"--out", tsv_path, MG_CLI_BESIDE}};
    const mg_cli_file ins[] = {{"--model", model_path, 0}};
    if (mg_cli_claim_outputs("attention", outs, 2, ins, 1) < 0) goto done;
    if (mg_cli_load_model("attention", model_path, 0, &m, &v, NULL)) goto done;
    mg_model_set_threads(m, threads);
    if (mg_attention_compute(m, v, smiles, &a, &err)) {
        fprintf(stderr, "molgen attention: %s\n", err.message);
        goto done;
    }
    const int N = a.n_layer, H = a.n_head;
    char title[1024], tmp[4200];
    snprintf(title, sizeof title, "attention of %.700s (%d tokens), model %d layers x %d heads",
             smiles, a.k, N, H);
    FILE *f = mg_cli_atomic_open(svg_path, tmp, sizeof tmp, &err);
    if (!f || mg_cli_atomic_commit_if(
                  f, mg_attention_svg(f, a.weights, N, H, a.L, a.labels, title, a.stats), tmp,
                  svg_path, &err)) {
        fprintf(stderr, "molgen attention: %s\n", err.message);
        goto done;
    }
    f = mg_cli_atomic_open(tsv_path, tmp, sizeof tmp, &err);
    if (!f || mg_cli_atomic_commit_if(f, mg_attention_tsv(f, a.stats, N, H), tmp, tsv_path, &err)) {
        fprintf(stderr, "molgen attention: %s\n", err.message);
        goto done;
    }
    printf("attention of %s: %d tokens after BOS, %d ring closure%s\n", smiles, a.k, a.closures,
           a.closures == 1 ? "" : "s");
    printf("layer head  mean-dist   prev   ring    bos   peak  label\n");
    for (int i = 0; i < N * H; i++) {
        const mg_head_stats *s = &a.stats[i];
        char ring[16];
        if (s->ring_n)
            snprintf(ring, sizeof ring, "%6.3f", s->ring);
        else
            snprintf(ring, sizeof ring, "%6s", "-");
        printf("%5d %4d  %9.2f  %5.3f %s  %5.3f  %5.3f  %s\n", i / H, i % H, s->mean_dist, s->prev,
               ring, s->bos, s->peak, s->label);
    }
    printf("attention map: %s\n", svg_path);
    printf("per-head table: %s\n", tsv_path);
    rc = 0;
done:
    mg_attention_map_free(&a);
    free(svg_path);
    free(tsv_path);
    mg_model_free(m);
    mg_vocab_free(v);
    return rc;
}
