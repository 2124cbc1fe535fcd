/* `molgen score`: a SMILES file (or stdin) -> mg_score_molecules (score.h)
 * -> one CSV row per input record (or stdout), in input order. */
#define _POSIX_C_SOURCE 200809L
#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "cli_util.h"
#include "commands.h"
#include "data.h"
#include "dist.h"
#include "safetensors.h"
#include "score.h"
#include "train_settings.h" /* MG_MAX_THREADS */
#include "util.h"

static const char *SCORE_USAGE =
    "usage: molgen score --model FILE --smiles FILE|- [--out FILE.csv|-]\n"
    "                    [--csv-column NAME] [--threads N] [--batch N] [--quiet]\n"
    "                    [--raw-weights]\n"
    "Negative log-likelihood of given molecules under a trained model: one CSV row\n"
    "per input record, in input order:\n"
    "  line,smiles,nll,nll_per_token,tokens,status\n"
    "nll: summed over the targets in nats; tokens: the targets, the SMILES tokens\n"
    "plus EOS (what training averages its loss over), so nll_per_token is the\n"
    "model's training loss on that molecule alone (no dropout). status: ok, empty,\n"
    "bad_char, unknown_token (not in the model's vocabulary), too_long (more\n"
    "targets than the model's context) or bad_line; nll is empty unless ok.\n"
    "  --model FILE       model or checkpoint (.safetensors) with its vocabulary\n"
    "  --smiles FILE|-    .smi (first field of each line; blank lines are records,\n"
    "                     status empty; '#' lines are comments) or .csv (a header\n"
    "                     row, see --csv-column); - reads stdin (.smi unless\n"
    "                     --csv-column is given)\n"
    "  --out FILE|-       output CSV, written atomically (default -: stdout)\n"
    "  --csv-column NAME  CSV column with the SMILES (default smiles)\n"
    "  --threads N        threads (default: ATTN_NUM_THREADS or all cores)\n"
    "  --batch N          molecules a thread takes at a time (default 16); neither\n"
    "                     this nor --threads changes any result: each molecule is\n"
    "                     its own forward\n"
    "  --quiet            no summary on stderr\n"
    "  --raw-weights      a checkpoint of train --ema: its last step's parameters,\n"
    "                     not the averaged ones (the default)\n"
    "The summary (counts per status, the first bad rows as file:line, molecules/s)\n"
    "goes to stderr; a bad row is reported, never an error. Under mpirun -np N the\n"
    "input is split over the ranks and rank 0 writes every row in input order; the\n"
    "ranks must agree on the model, the records read and --csv-column/--raw-weights\n"
    "(else one error names what differs). SIGINT/SIGTERM: nothing is written, the\n"
    "exit status is 128 + the signal.\n";

/* A CSV field: as is, or quoted ("" for a quote) when it holds a comma, a
 * quote, whitespace or other control characters. */
static void csv_field(FILE *f, const char *s) {
    int quote = 0;
    for (const char *p = s; *p && !quote; p++)
        quote = *p == ',' || *p == '"' || isspace((unsigned char)*p) || iscntrl((unsigned char)*p);
    if (!quote) {
        fputs(s, f);
        return;
    }
    fputc('"', f);
    for (const char *p = s; *p; p++) {
        if (*p == '"') fputc('"', f);
        fputc(*p, f);
    }
    fputc('"', f);
}

static int write_rows(FILE *f, const mg_smiles_list *l, const mg_score *sc) {
    fputs("line,smiles,nll,nll_per_token,tokens,status\n", f);
    for (size_t i = 0; i < l->n; i++) {
        fprintf(f, "%ld,", l->line[i]);
        csv_field(f, l->smiles[i]);
        if (sc[i].status == MG_SCORE_OK)
            fprintf(f, ",%.6f,%.6f,%d,ok\n", sc[i].nll, sc[i].nll / sc[i].tokens, sc[i].tokens);
        else if (sc[i].tokens > 0)
            fprintf(f, ",,,%d,%s\n", sc[i].tokens, mg_score_status_name(sc[i].status));
        else
            fprintf(f, ",,,,%s\n", mg_score_status_name(sc[i].status));
    }
    return ferror(f) ? -1 : 0;
}

/* The records as rows: their SMILES, line numbers and flaws. */
static uint64_t records_hash(const mg_smiles_list *l) {
    uint64_t h = mg_dist_hash(&l->n, sizeof l->n);
    for (size_t i = 0; i < l->n; i++) {
        const unsigned char flaw = l->flaw ? l->flaw[i] : 0;
        h = mg_fnv1a(h, l->smiles[i], strlen(l->smiles[i]) + 1);
        h = mg_fnv1a(h, &l->line[i], sizeof l->line[i]);
        h = mg_fnv1a(h, &flaw, 1);
    }
    return h;
}

typedef struct {
    int on;
    double t0, last;
} progress_state;

/* A line every 10 s on stderr for long inputs. */
static void on_progress(void *user, size_t done, size_t n) {
    progress_state *p = user;
    const double t = mg_now_s();
    if (!p->on || t - p->last < 10.0 || done == n) return; /* the summary ends it */
    p->last = t;
    fprintf(stderr, "scored %zu/%zu molecules, %.0f molecules/s\n", done, n,
            (double)done / (t - p->t0 > 1e-9 ? t - p->t0 : 1e-9));
}

int cmd_score(int argc, char **argv) {
    const char *model_path = NULL, *smiles_path = NULL, *out_path = "-", *column = NULL;
    int threads = 0, batch = 16, quiet = 0;
    unsigned load_flags = 0;
    enum { O_MODEL = 1, O_SMILES, O_OUT, O_COLUMN, O_THREADS, O_BATCH, O_QUIET, O_RAW };
    static const struct option opts[] = {{"model", required_argument, NULL, O_MODEL},
                                         {"smiles", required_argument, NULL, O_SMILES},
                                         {"out", required_argument, NULL, O_OUT},
                                         {"csv-column", required_argument, NULL, O_COLUMN},
                                         {"threads", required_argument, NULL, O_THREADS},
                                         {"batch", required_argument, NULL, O_BATCH},
                                         {"quiet", no_argument, NULL, O_QUIET},
                                         {"raw-weights", no_argument, NULL, O_RAW},
                                         {"help", no_argument, NULL, 'h'},
                                         {NULL, 0, NULL, 0}};
    const char *val;
    int c;
    mg_cli_begin();
    while ((c = mg_cli_next("score", argc, argv, "h", opts, &val)) != -1) {
        int ok = 1;
        long long ll = 0;
        switch (c) {
        case -2: return 2;
        case 'h': fputs(SCORE_USAGE, stdout); return 0;
        case O_MODEL: model_path = val; break;
        case O_SMILES: smiles_path = val; break;
        case O_OUT: out_path = val; break;
        case O_COLUMN: column = val; break;
        case O_THREADS:
            ok = mg_cli_int(val, 1, MG_MAX_THREADS, &ll);
            threads = (int)ll;
            break;
        case O_BATCH:
            ok = mg_cli_int(val, 1, 1 << 20, &ll);
            batch = (int)ll;
            break;
        case O_QUIET: quiet = 1; break;
        case O_RAW: load_flags = MG_LOAD_RAW; break;
        }
        if (!ok) return mg_cli_bad_value("score", argv, val);
    }
    if (!model_path || !smiles_path) {
        fprintf(stderr, "molgen score: --model FILE and --smiles FILE are required (see molgen "
                        "score --help)\n");
        return 2;
    }
    const int from_stdin = !strcmp(smiles_path, "-"), to_stdout = !strcmp(out_path, "-");
    mg_error err;
    /* under mpirun every rank reads the input and scores its part; rank 0
     * writes every row (mpirun gives stdin to rank 0 only) */
    mg_dist *world = mg_dist_world();
    if (from_stdin && world->size > 1) {
        if (world->rank == 0)
            fprintf(stderr, "molgen score: --smiles - (stdin) does not run as several MPI ranks: "
                            "give a file\n");
        return 2;
    }
    mg_catch_stop_signals(); /* SIGINT / SIGTERM: nothing written, 128 + the signal */
    /* the ranks score one list with one model: the options that change a
     * row agree now, the model and the records once read (--threads,
     * --batch and --quiet change none; --out is rank 0's) */
    const mg_dist_field opt_fields[] = {{"--csv-column", mg_dist_hash_str(column)},
                                        {"--raw-weights", load_flags}};
    if (mg_dist_agree_fields(world, opt_fields, 2, &err)) {
        mg_cli_report("score", err.status, &err);
        return 1;
    }
    if (!to_stdout) {
        const mg_cli_file outs[] = {{"--out", out_path, 0}};
        const mg_cli_file ins[] = {{"--model", model_path, 0},
                                   {"--smiles", from_stdin ? NULL : smiles_path, 0}};
        if (mg_cli_claim_outputs("score", outs, 1, ins, 2) < 0) return 1;
    }
    mg_model *m = NULL;
    mg_vocab *v = NULL;
    if (mg_cli_load_model("score", model_path, load_flags, &m, &v, NULL)) return 1;
    const char *name = from_stdin ? "(stdin)" : smiles_path;
    size_t nl = strlen(smiles_path);
    const int csv = column != NULL || (nl >= 4 && !strcasecmp(smiles_path + nl - 4, ".csv"));
    mg_smiles_list l;
    memset(&l, 0, sizeof l);
    mg_report rep;
    mg_status lrc = mg_read_records(from_stdin ? stdin : NULL, name, csv, column, &l, &rep, &err);
    if (!(lrc = mg_dist_agree(world, lrc, &err)) && world->size > 1) {
        const mg_dist_field in_fields[] = {
            {"the --model file (its weights)", mg_dist_hash_model(m, v)},
            {"the --smiles file (its records)", records_hash(&l)}};
        lrc = mg_dist_agree_fields(world, in_fields, 2, &err);
    }
    if (lrc) {
        mg_cli_report("score", lrc, &err);
        mg_smiles_list_free(&l);
        mg_model_free(m);
        mg_vocab_free(v);
        return 1;
    }
    mg_score *sc = calloc(l.n ? l.n : 1, sizeof *sc);
    progress_state ps = {!quiet, mg_now_s(), 0};
    ps.last = ps.t0;
    mg_score_opts so = {threads > 0 ? threads : mg_default_threads(), batch, on_progress, &ps,
                        world, &mg_stop_signal};
    mg_status src = sc ? MG_OK : mg_fail(&err, MG_ERR_NOMEM, "out of memory");
    if (!(src = mg_dist_agree(world, src, &err)))
        src = mg_score_molecules(m, v, (const char *const *)l.smiles, l.flaw, l.n, &so, sc, &err);
    int rc = 0;
    if (src) {
        mg_cli_report("score", src, &err);
        rc = 1;
    }
    const int writer = world->rank == 0 && !mg_stop_signal; /* rank 0 writes and reports */
    const double secs = mg_now_s() - ps.t0;
    if (!rc && writer && to_stdout) {
        if (write_rows(stdout, &l, sc) || fflush(stdout)) {
            fprintf(stderr, "molgen score: error writing stdout\n");
            rc = 1;
        }
    } else if (!rc && writer) {
        char tmp[4200];
        FILE *f = mg_cli_atomic_open(out_path, tmp, sizeof tmp, &err);
        /* a signal while writing: the temporary goes, the output stays */
        if (!f || mg_cli_atomic_commit_if(f, write_rows(f, &l, sc) || mg_stop_signal, tmp,
                                          out_path, &err)) {
            if (!mg_stop_signal) fprintf(stderr, "molgen score: %s\n", err.message);
            rc = 1;
        }
    }
    if (mg_stop_signal) { /* said above when it stopped the scoring, else here */
        if (src != MG_ERR_INTERRUPTED && src != MG_ERR_PEER && world->rank == 0)
            fprintf(stderr, "molgen score: interrupted by signal %d\n", (int)mg_stop_signal);
        rc = 128 + mg_stop_signal;
    }
    if (!rc && !quiet && writer) {
        size_t count[MG_SCORE_BAD_LINE + 1] = {0}, shown = 0;
        double nll = 0.0;
        long tok = 0;
        for (size_t i = 0; i < l.n; i++) {
            count[sc[i].status]++;
            if (sc[i].status == MG_SCORE_OK) {
                nll += sc[i].nll;
                tok += sc[i].tokens;
            } else if (shown < MG_REPORT_MSGS) {
                char why[256];
                mg_score_reason(m, v, l.smiles[i], l.flaw ? l.flaw[i] : 0, why, sizeof why);
                fprintf(stderr, "%s:%ld: %s: %s\n", name, l.line[i],
                        mg_score_status_name(sc[i].status), why);
                shown++;
            }
        }
        if (l.n - count[MG_SCORE_OK] > shown)
            fprintf(stderr, "... and %zu more\n", l.n - count[MG_SCORE_OK] - shown);
        fprintf(stderr, "scored %zu molecules: ok %zu", l.n, count[MG_SCORE_OK]);
        for (int s = 1; s <= MG_SCORE_BAD_LINE; s++)
            if (count[s]) fprintf(stderr, ", %s %zu", mg_score_status_name(s), count[s]);
        char mean[64] = "no mean NLL (no molecule ok)";
        if (tok) snprintf(mean, sizeof mean, "mean NLL %.4f nats per token", nll / (double)tok);
        fprintf(stderr, "; %s; %.0f molecules/s (%d threads)%s%s\n", mean,
                (double)l.n / (secs > 1e-9 ? secs : 1e-9), so.threads, to_stdout ? "" : "; ",
                to_stdout ? "" : out_path);
    }
    free(sc);
    mg_smiles_list_free(&l);
    mg_model_free(m);
    mg_vocab_free(v);
    return rc;
}
