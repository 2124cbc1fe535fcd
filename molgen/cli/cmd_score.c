/* `molgen score`: a SMILES file (or stdin) -> mg_score_molecules (nll_score.h)
 * -> one CSV row per input record (or stdout), in input order. */
#define _POSIX_C_SOURCE 200809L
#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "cli_options.h"
#include "cli_util.h"
#include "commands.h"
#include "chem/data.h"
#include "base/dist.h"
#include "base/safetensors.h"
#include "gen/nll_score.h"
#include "base/util.h"

typedef struct {
    const char *model, *smiles, *out, *column;
    int threads, batch, quiet, raw;
    int dtype; /* mg_dtype: fp32, bf16 */
} score_args;

#define T score_args
static const mg_setting SCORE_OPTIONS[] = {
    {MG_CLI_OPT_MODEL(T)},
    {MG_OPT_STR(T, "smiles", "FILE|-", smiles,
                ".smi (first field of each line; blank lines are records, status empty; '#' "
                "lines are comments) or .csv (a header row, see --csv-column); - reads stdin "
                "(.smi unless --csv-column is given) (required)")},
    {MG_OPT_STR(T, "out", "FILE|-", out, "output CSV, written atomically; -: stdout")},
    {MG_OPT_STR(T, "csv-column", "NAME", column, "CSV column with the SMILES"),
     .shown_default = "smiles"},
    {MG_CLI_OPT_THREADS(T)},
    {MG_OPT_INT(T, "batch", "N", batch, 1, 1 << 20,
                "molecules a thread takes at a time; neither this nor --threads changes any "
                "result: each molecule is its own forward")},
    {MG_OPT_CHOICE(T, "dtype", "fp32|bf16", dtype,
                   "the dense products' operands: fp32, or bf16 with fp32 accumulation (the "
                   "loss train --dtype bf16 computes; faster on AVX512_BF16)")},
    {MG_OPT_FLAG(T, "quiet", quiet, "no summary on stderr")},
    {MG_CLI_OPT_RAW_WEIGHTS(T)},
};
#undef T

static const char SCORE_USAGE[] =
    "usage: molgen score --model FILE --smiles FILE|- [options]\n"
    "Negative log-likelihood of given molecules under a trained model: one CSV row\n"
    "per input record, in input order:\n"
    "  line,smiles,nll,nll_per_token,tokens,status,detail\n"
    "nll: summed over the targets in nats; tokens: the targets, the SMILES tokens\n"
    "plus EOS (what training averages its loss over), so nll_per_token is the\n"
    "model's training loss on that molecule alone (no dropout). status: ok, empty,\n"
    "bad_char, unknown_token (not in the model's vocabulary), too_long (more\n"
    "targets than the model's context) or bad_line; nll is empty unless ok;\n"
    "detail says why a row is not ok: the token the model lacks and where, the\n"
    "molecule's tokens and the model's limit, the character that starts no token.\n";
static const char SCORE_NOTES[] =
    "The summary (counts per status, the first bad rows as file:line, molecules/s)\n"
    "goes to stderr; a bad row is reported, never an error. Under mpirun -np N the\n"
    "input is split over the ranks and rank 0 writes every row in input order; the\n"
    "ranks must agree on the model, the records read and --csv-column/--raw-weights/\n"
    "--dtype (else one error names what differs). SIGINT/SIGTERM: nothing is\n"
    "written, the exit status is 128 + the signal.\n";

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

/* The rows; detail: why a row is not ok (mg_score_reason: the token the
 * model lacks, the length and the model's limit, ...), empty when ok. */
static int write_rows(FILE *f, const mg_model *m, const mg_vocab *v, const mg_smiles_list *l,
                      const mg_score *sc) {
    fputs("line,smiles,nll,nll_per_token,tokens,status,detail\n", f);
    for (size_t i = 0; i < l->n; i++) {
        fprintf(f, "%ld,", l->line[i]);
        csv_field(f, l->smiles[i]);
        if (sc[i].status == MG_SCORE_OK) {
            fprintf(f, ",%.6f,%.6f,%d,ok,\n", sc[i].nll, sc[i].nll / sc[i].tokens, sc[i].tokens);
            continue;
        }
        char why[256];
        mg_score_reason(m, v, l->smiles[i], l->flaw ? l->flaw[i] : 0, why, sizeof why);
        if (sc[i].tokens > 0)
            fprintf(f, ",,,%d,%s,", sc[i].tokens, mg_score_status_name(sc[i].status));
        else
            fprintf(f, ",,,,%s,", mg_score_status_name(sc[i].status));
        csv_field(f, why);
        fputc('\n', f);
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


/* Everything one run holds, freed once (job_free). */
typedef struct {
    score_args a;
    int from_stdin, to_stdout;
    const char *name; /* the input in messages */
    mg_model *m;
    mg_vocab *v;
    mg_smiles_list l;
    mg_score *sc;
    progress_state ps;
    int threads;
} score_job;

static void job_free(score_job *j) {
    free(j->sc);
    mg_smiles_list_free(&j->l);
    mg_model_free(j->m);
    mg_vocab_free(j->v);
}

static int parse_args(score_args *a, int argc, char **argv) {
    *a = (score_args){.out = "-", .batch = 16};
    const mg_cli_spec spec = {"score", SCORE_USAGE, SCORE_NOTES,
                              {{SCORE_OPTIONS, sizeof SCORE_OPTIONS / sizeof *SCORE_OPTIONS, a}},
                              1};
    const int rc = mg_cli_parse(&spec, argc, argv, NULL);
    if (rc) return rc;
    if (!a->model || !a->smiles)
        return mg_cli_usage("score", "--model FILE and --smiles FILE are required");
    return 0;
}

/* The ranks agree on the options that change a row, the output is
 * claimed, the model loaded and the records read (and agreed on). */
static int prepare(score_job *j) {
    const score_args *a = &j->a;
    mg_dist *world = mg_dist_world();
    mg_error err;
    /* under mpirun every rank reads the input and scores its part; rank 0
     * writes every row (mpirun gives stdin to rank 0 only) */
    if (j->from_stdin && world->size > 1) {
        if (world->rank == 0)
            fprintf(stderr, "molgen score: --smiles - (stdin) does not run as several MPI ranks: "
                            "give a file\n");
        return 2;
    }
    mg_catch_stop_signals(); /* SIGINT / SIGTERM: nothing written, 128 + the signal */
    /* --threads, --batch and --quiet change no row; --out is rank 0's */
    const mg_dist_field opt_fields[] = {{"--csv-column", mg_dist_hash_str(a->column)},
                                        {"--raw-weights", a->raw ? MG_LOAD_RAW : 0},
                                        {"--dtype", (uint64_t)a->dtype}};
    if (mg_dist_agree_fields(world, opt_fields, 3, &err)) {
        mg_cli_report("score", err.status, &err);
        return 1;
    }
    const mg_cli_file outs[] = {{"--out", j->to_stdout ? NULL : a->out, 0}};
    const mg_cli_file ins[] = {{"--model", a->model, 0},
                               {"--smiles", j->from_stdin ? NULL : a->smiles, 0}};
    if (!j->to_stdout && mg_cli_claim_outputs("score", outs, 1, ins, 2) < 0) return 1;
    if (mg_cli_load_model("score", a->model, a->raw ? MG_LOAD_RAW : 0, &j->m, &j->v, NULL))
        return 1;
    mg_model_set_dtype(j->m, (mg_dtype)a->dtype);
    mg_cli_note_dtype("score", a->dtype);
    const size_t nl = strlen(a->smiles);
    const int csv = a->column != NULL || (nl >= 4 && !strcasecmp(a->smiles + nl - 4, ".csv"));
    mg_report rep;
    mg_status rc = mg_read_records(j->from_stdin ? stdin : NULL, j->name, csv, a->column, &j->l,
                                   &rep, &err);
    if (!(rc = mg_dist_agree(world, rc, &err)) && world->size > 1) {
        const mg_dist_field in_fields[] = {
            {"the --model file (its weights)", mg_model_fingerprint(j->m, j->v)},
            {"the --smiles file (its records)", records_hash(&j->l)}};
        rc = mg_dist_agree_fields(world, in_fields, 2, &err);
    }
    if (rc) mg_cli_report("score", rc, &err);
    return rc ? 1 : 0;
}

/* Scores every record (an error said). */
static mg_status score(score_job *j) {
    mg_dist *world = mg_dist_world();
    mg_error err;
    j->sc = calloc(j->l.n ? j->l.n : 1, sizeof *j->sc);
    j->ps = (progress_state){!j->a.quiet, mg_now_s(), 0};
    j->ps.last = j->ps.t0;
    j->threads = j->a.threads > 0 ? j->a.threads : mg_default_threads();
    const mg_score_opts so = {j->threads, j->a.batch, on_progress, &j->ps, world, &mg_stop_signal};
    mg_status rc = j->sc ? MG_OK : mg_fail(&err, MG_ERR_NOMEM, "out of memory");
    if (!(rc = mg_dist_agree(world, rc, &err)))
        rc = mg_score_molecules(j->m, j->v, (const char *const *)j->l.smiles, j->l.flaw, j->l.n,
                                &so, j->sc, &err);
    if (rc) mg_cli_report("score", rc, &err);
    return rc;
}

static int write_csv(FILE *f, void *user) {
    const score_job *j = user;
    return write_rows(f, j->m, j->v, &j->l, j->sc) || mg_stop_signal;
}

/* The rows to --out (rank 0); 0 or 1 (said, unless a signal stopped it). */
static int write_out(score_job *j) {
    mg_error err;
    if (j->to_stdout) {
        if (!write_rows(stdout, j->m, j->v, &j->l, j->sc) && !fflush(stdout)) return 0;
        fprintf(stderr, "molgen score: error writing stdout\n");
        return 1;
    }
    if (!mg_cli_write_output(j->a.out, write_csv, j, &err)) return 0;
    if (!mg_stop_signal) fprintf(stderr, "molgen score: %s\n", err.message);
    return 1;
}

/* The summary on stderr: counts per status, the first bad rows, the mean
 * NLL, molecules/s. */
static void print_summary(const score_job *j, double secs) {
    const mg_smiles_list *l = &j->l;
    size_t count[MG_SCORE_BAD_LINE + 1] = {0}, shown = 0;
    double nll = 0.0;
    long tok = 0;
    for (size_t i = 0; i < l->n; i++) {
        const mg_score *sc = &j->sc[i];
        count[sc->status]++;
        if (sc->status == MG_SCORE_OK) {
            nll += sc->nll;
            tok += sc->tokens;
        } else if (shown < MG_REPORT_MSGS) {
            char why[256];
            mg_score_reason(j->m, j->v, l->smiles[i], l->flaw ? l->flaw[i] : 0, why, sizeof why);
            fprintf(stderr, "%s:%ld: %s: %s\n", j->name, l->line[i],
                    mg_score_status_name(sc->status), why);
            shown++;
        }
    }
    if (l->n - count[MG_SCORE_OK] > shown)
        fprintf(stderr, "... and %zu more\n", l->n - count[MG_SCORE_OK] - shown);
    fprintf(stderr, "scored %zu molecules: ok %zu", l->n, count[MG_SCORE_OK]);
    for (int s = 1; s <= MG_SCORE_BAD_LINE; s++)
        if (count[s]) fprintf(stderr, ", %s %zu", mg_score_status_name(s), count[s]);
    char mean[64] = "no mean NLL (no molecule ok)";
    if (tok) snprintf(mean, sizeof mean, "mean NLL %.4f nats per token", nll / (double)tok);
    fprintf(stderr, "; %s; %.0f molecules/s (%d threads, %s)%s%s\n", mean,
            (double)l->n / (secs > 1e-9 ? secs : 1e-9), j->threads,
            mg_dtype_name(mg_model_dtype(j->m)), j->to_stdout ? "" : "; ",
            j->to_stdout ? "" : j->a.out);
}

/* Score, then (rank 0) write the rows and the summary; 128 + the signal
 * after SIGINT / SIGTERM. */
static int run(score_job *j) {
    const int rank0 = mg_dist_world()->rank == 0;
    const mg_status src = score(j);
    const int writer = rank0 && !mg_stop_signal; /* rank 0 writes and reports */
    const double secs = mg_now_s() - j->ps.t0;
    int rc = src ? 1 : 0;
    if (!rc && writer) rc = write_out(j);
    if (mg_stop_signal) { /* said above when it stopped the scoring, else here */
        if (src != MG_ERR_INTERRUPTED && src != MG_ERR_PEER && rank0)
            fprintf(stderr, "molgen score: interrupted by signal %d\n", (int)mg_stop_signal);
        rc = 128 + mg_stop_signal;
    }
    if (!rc && !j->a.quiet && writer) print_summary(j, secs);
    return rc;
}

int cmd_score(int argc, char **argv) {
    score_job j;
    memset(&j, 0, sizeof j);
    int rc = parse_args(&j.a, argc, argv);
    if (rc) return rc < 0 ? 0 : rc;
    j.from_stdin = !strcmp(j.a.smiles, "-");
    j.to_stdout = !strcmp(j.a.out, "-");
    j.name = j.from_stdin ? "(stdin)" : j.a.smiles;
    rc = prepare(&j);
    if (!rc) rc = run(&j);
    job_free(&j);
    return rc;
}
