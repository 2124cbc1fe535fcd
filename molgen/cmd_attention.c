/* `molgen attention`: options -> one model's attention maps of a molecule
 * (attention.h), written as SVG + TSV and printed as a per-head table. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "attention.h"
#include "attn.h"
#include "cli_util.h"
#include "commands.h"
#include "model.h"
#include "tokenizer.h"

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
    const char *model_path = NULL, *smiles = NULL, *out_dir = "out";
    int threads = 0;
    mg_error err;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            fputs(ATTENTION_USAGE, stdout);
            return 0;
        }
        static const char *const value_opts[] = {"--model", "--smiles", "--out", "--threads", NULL};
        const char *val = NULL;
        char opt[64];
        if (!mg_cli_take("attention", argc, argv, &i, value_opts, opt, sizeof opt, &val)) return 2;
        a = opt;
        long long ll;
        if (!strcmp(a, "--model")) model_path = val;
        else if (!strcmp(a, "--smiles")) smiles = val;
        else if (!strcmp(a, "--out")) out_dir = val;
        else if (!strcmp(a, "--threads")) {
            if (!mg_cli_int(val, 1, ATTN_MAX_THREADS, &ll)) {
                fprintf(stderr, "molgen attention: bad value '%s' for --threads\n", val);
                return 2;
            }
            threads = (int)ll;
        } else {
            fprintf(stderr, "molgen attention: unknown option '%s' (see molgen attention --help)\n", a);
            return 2;
        }
    }
    if (!model_path || !smiles) {
        fprintf(stderr, "molgen attention: --model FILE and --smiles S are required (see molgen attention --help)\n");
        return 2;
    }
    if (threads > 0) attn_set_num_threads(threads, NULL);
    /* both outputs are checked before any work, and never replace the model */
    const size_t plen = strlen(out_dir) + 32;
    char *svg_path = malloc(plen), *tsv_path = malloc(plen);
    if (!svg_path || !tsv_path) {
        free(svg_path);
        free(tsv_path);
        fprintf(stderr, "molgen attention: out of memory\n");
        return 1;
    }
    snprintf(svg_path, plen, "%s/attention.svg", out_dir);
    snprintf(tsv_path, plen, "%s/attention_heads.tsv", out_dir);
    const char *inputs[] = {model_path};
    if (mg_cli_check_output_dir(out_dir, &err) ||
        mg_cli_check_output(svg_path, inputs, 1, &err) ||
        mg_cli_check_output(tsv_path, inputs, 1, &err)) {
        fprintf(stderr, "molgen attention: --out: %s\n", err.message);
        free(svg_path);
        free(tsv_path);
        return 1;
    }
    mg_model *m = NULL;
    mg_vocab *v = NULL;
    if (mg_cli_load_model("attention", model_path, &m, &v)) {
        free(svg_path);
        free(tsv_path);
        return 1;
    }
    const mg_model_config *c = mg_model_get_config(m);
    const int N = c->n_layer, H = c->n_head, ctx = c->ctx_len;
    int rc = 1, k = 0;
    char cut[96];
    const char *smiles_echo = mg_cli_cut(smiles, cut, sizeof cut);
    char tmp[4200];
    int32_t *ids = malloc((size_t)(ctx + 1) * sizeof *ids);
    float *logits = NULL, *wts = NULL;
    int *ring_key = NULL, *pair = NULL;
    const char **labels = NULL;
    mg_head_stats *stats = NULL;
    FILE *f = NULL;
    if (!ids) goto oom;
    int er = mg_vocab_encode(v, smiles, ids + 1, ctx, &k, &err);
    if (er == MG_ERR_TOO_LONG || (er == 0 && k + 1 > ctx)) {
        fprintf(stderr, "molgen attention: '%s' has %d tokens; the model takes at most %d (ctx_len %d minus BOS)\n",
                smiles_echo, k, ctx - 1, ctx);
        goto done;
    }
    if (er) {
        fprintf(stderr, "molgen attention: '%s': %s\n", smiles_echo, err.message);
        goto done;
    }
    if (k == 0) {
        fprintf(stderr, "molgen attention: empty SMILES\n");
        goto done;
    }
    ids[0] = MG_BOS;
    const int L = k + 1;
    logits = malloc((size_t)L * c->vocab_size * sizeof *logits);
    wts = malloc((size_t)N * H * L * L * sizeof *wts);
    ring_key = malloc((size_t)L * sizeof *ring_key);
    pair = malloc((size_t)L * sizeof *pair);
    labels = malloc((size_t)L * sizeof *labels);
    stats = malloc((size_t)N * H * sizeof *stats);
    if (!logits || !wts || !ring_key || !pair || !labels || !stats) goto oom;
    if (mg_model_logits(m, ids, NULL, 1, L, logits, wts, &err)) {
        fprintf(stderr, "molgen attention: %s\n", err.message);
        goto done;
    }
    for (int i = 0; i < L; i++) labels[i] = mg_vocab_token(v, ids[i]);
    const int closures = mg_ring_pairs(labels + 1, k, pair);
    ring_key[0] = -1;
    for (int i = 0; i < k; i++) ring_key[i + 1] = pair[i] >= 0 ? pair[i] + 1 : -1;
    for (int l = 0; l < N; l++)
        for (int h = 0; h < H; h++)
            mg_head_stats_compute(wts + ((size_t)l * H + h) * L * L, L, 1, ring_key,
                                  &stats[l * H + h]);

    char title[1024];
    snprintf(title, sizeof title, "attention of %.700s (%d tokens), model %d layers x %d heads", smiles,
             k, N, H);
    f = mg_cli_atomic_open(svg_path, tmp, sizeof tmp, &err);
    if (!f) {
        fprintf(stderr, "molgen attention: %s\n", err.message);
        goto done;
    }
    int werr = mg_attention_svg(f, wts, N, H, L, labels, title, stats);
    if (werr) {
        fclose(f);
        unlink(tmp);
        snprintf(err.message, sizeof err.message, "error writing %s (nothing written)", svg_path);
    } else {
        werr = mg_cli_atomic_commit(f, tmp, svg_path, &err);
    }
    f = NULL;
    if (werr) {
        fprintf(stderr, "molgen attention: %s\n", err.message);
        goto done;
    }
    f = mg_cli_atomic_open(tsv_path, tmp, sizeof tmp, &err);
    if (!f) {
        fprintf(stderr, "molgen attention: %s\n", err.message);
        goto done;
    }
    fprintf(f, "layer\thead\tmean_distance\tprev_token\tring_closure\tbos\tpeak\tlabel\n");
    for (int i = 0; i < N * H; i++) {
        const mg_head_stats *s = &stats[i];
        if (s->ring_n)
            fprintf(f, "%d\t%d\t%.4f\t%.4f\t%.4f\t%.4f\t%.4f\t%s\n", i / H, i % H, s->mean_dist,
                    s->prev, s->ring, s->bos, s->peak, s->label);
        else
            fprintf(f, "%d\t%d\t%.4f\t%.4f\t-\t%.4f\t%.4f\t%s\n", i / H, i % H, s->mean_dist,
                    s->prev, s->bos, s->peak, s->label);
    }
    werr = mg_cli_atomic_commit(f, tmp, tsv_path, &err);
    f = NULL;
    if (werr) {
        fprintf(stderr, "molgen attention: %s\n", err.message);
        goto done;
    }

    printf("attention of %s: %d tokens after BOS, %d ring closure%s\n", smiles, k, closures,
           closures == 1 ? "" : "s");
    printf("layer head  mean-dist   prev   ring    bos   peak  label\n");
    for (int i = 0; i < N * H; i++) {
        const mg_head_stats *s = &stats[i];
        char ring[16];
        if (s->ring_n) snprintf(ring, sizeof ring, "%6.3f", s->ring);
        else snprintf(ring, sizeof ring, "%6s", "-");
        printf("%5d %4d  %9.2f  %5.3f %s  %5.3f  %5.3f  %s\n", i / H, i % H, s->mean_dist, s->prev,
               ring, s->bos, s->peak, s->label);
    }
    printf("attention map: %s\n", svg_path);
    printf("per-head table: %s\n", tsv_path);
    rc = 0;
    goto done;
oom:
    fprintf(stderr, "molgen attention: out of memory\n");
done:
    if (f) fclose(f);
    free(ids);
    free(logits);
    free(wts);
    free(ring_key);
    free(pair);
    free(labels);
    free(stats);
    free(svg_path);
    free(tsv_path);
    mg_model_free(m);
    mg_vocab_free(v);
    return rc;
}
