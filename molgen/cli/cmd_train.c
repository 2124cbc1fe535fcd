/* `molgen train`: the table of train_settings.h as options (cli_options.h)
 * -> an mg_train_config -> mg_train_run (train.h), whose messages and
 * progress this file draws on stderr; a one-line JSON summary on stdout. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli_options.h"
#include "cli_util.h"
#include "commands.h"
#include "base/dist.h"
#include "base/json.h"
#include "base/safetensors.h"
#include "train/train.h"
#include "base/util.h"

/* --preset, the one option outside the settings table: applied before
 * every setting given, whatever the order. */
typedef struct {
    int preset; /* 0 default, 1 molgpt */
} train_extra;

static const mg_setting PRESET_OPTION[] = {
    {MG_OPT_CHOICE(train_extra, "preset", "default|molgpt", preset,
                   "default (4 layers, d_model 128, 4 heads, dropout 0) or molgpt (8 layers, "
                   "d_model 256, 8 heads, dropout 0.1), then the model options above, whatever "
                   "their order"),
     .group = MG_GROUP_MODEL},
};

static const char TRAIN_USAGE[] =
    "usage: molgen train [options]\n"
    "Train the SMILES transformer; writes a checkpoint (safetensors) that `molgen\n"
    "sample` reads and `--resume` continues bit for bit (same thread count).\n"
    "Under mpirun -np N each batch is split over the ranks, their gradients summed:\n"
    "the same training, N times the compute (rank 0 reports and checkpoints).\n"
    "With --resume, an option marked [same on resume] must have the checkpoint's\n"
    "value (another is refused: the run continues bit for bit); every other option\n"
    "given applies to the resumed run.\n";
static const char TRAIN_NOTES[] =
    "Progress goes to stderr; a one-line JSON summary to stdout. SIGINT/SIGTERM\n"
    "write a checkpoint and exit with 128 + the signal number; errors exit 1.\n";

/* ------------------------------------------------------------ display */

typedef struct {
    FILE *f;
    int quiet, progress, tty;
    int line_open;    /* a \r progress line is on screen */
    double last_draw; /* time of the last progress line */
} display;

static void close_line(display *d) {
    if (d->line_open) {
        fputs("\r\033[K", d->f);
        d->line_open = 0;
    }
}

static void on_message(void *user, const char *text) {
    display *d = user;
    if (d->quiet) return;
    close_line(d);
    fprintf(d->f, "%s\n", text);
    fflush(d->f);
}

/* One line every 0.2 s on a terminal (redrawn in place), every 10 s
 * otherwise, and at the last step. */
static void on_progress(void *user, const mg_train_progress *p) {
    display *d = user;
    if (!d->progress || d->quiet) return;
    const double t = mg_now_s();
    if (t - d->last_draw < (d->tty ? 0.2 : 10.0) && !p->last) return;
    d->last_draw = t;
    char el[32], eta[32], vl[32], tot[32], line[256];
    mg_fmt_duration(p->elapsed, el, sizeof el);
    mg_fmt_duration(p->eta, eta, sizeof eta);
    if (isnan(p->val_loss))
        snprintf(vl, sizeof vl, "-");
    else
        snprintf(vl, sizeof vl, "%.4f", p->val_loss);
    if (p->total_steps > 0)
        snprintf(tot, sizeof tot, "%lld", (long long)p->total_steps);
    else
        snprintf(tot, sizeof tot, "?");
    snprintf(line, sizeof line, "step %lld/%s | loss %.4f | val %s | %.1fk tok/s | %s | ETA %s",
             (long long)p->step, tot, p->loss, vl, p->tokens_per_sec / 1e3, el, eta);
    if (d->tty) {
        fprintf(d->f, "\r%s\033[K", line);
        d->line_open = 1;
    } else {
        fprintf(d->f, "%s\n", line);
    }
    fflush(d->f);
}

/* The summary line: where the checkpoint is and how the run went. */
static void print_summary(const char *out, const char *init, const mg_train_result *r) {
    static const char *const why[] = {"done", "time_limit", "signal", "stop_after",
                                      "no_improvement"};
    json_t *ranks = r->ranks > 1 ? json_pack("{si,sf}", "ranks", r->ranks, "comm_ms_per_step",
                                             round(1e4 * r->comm_per_step) / 10)
                                 : NULL;
    json_t *j = json_pack(
        "{ss,sI,sI,sf,sf,sf,sf,sf,sf,ss,sI}", "out", out, "step", (json_int_t)r->step,
        "total_steps", (json_int_t)r->total_steps, "train_loss", r->train_loss, "val_loss",
        isnan(r->val_loss) ? -1.0 : r->val_loss, "first_val_loss",
        isnan(r->first_val_loss) ? -1.0 : r->first_val_loss, "unigram_entropy", r->unigram_entropy,
        "tokens_per_sec", round(10 * r->tokens_per_sec) / 10, "seconds",
        round(10 * r->seconds) / 10, "stop", why[r->stop], "skipped_lines", (json_int_t)r->skipped);
    if (ranks) json_object_update(j, ranks);
    json_decref(ranks);
    if (j && init) mg_json_put(j, "init", json_string(init));
    if (j && !isnan(r->val_loss_ema)) mg_json_put(j, "val_loss_ema", json_real(r->val_loss_ema));
    if (j) { /* what --out holds, the validation curve [[step, loss], ...], the sample check */
        mg_json_put(j, "keep", json_string(r->keep_best ? "best" : "last"));
        mg_json_put(j, "kept_step", json_integer((json_int_t)r->kept_step));
        if (!isnan(r->kept_val_loss)) mg_json_put(j, "kept_val_loss", json_real(r->kept_val_loss));
        json_t *curve = json_array();
        for (int i = 0; curve && i < r->n_curve; i++)
            json_array_append_new(
                curve, json_pack("[I,f]", (json_int_t)r->curve_step[i], r->curve_loss[i]));
        mg_json_put(j, "val_curve", curve);
        if (r->curve_stride > 1) mg_json_put(j, "val_curve_stride", json_integer(r->curve_stride));
        json_t *chk = NULL;
        if (r->check_n > 0)
            chk =
                json_pack(
                    "{sI,sI,sI,sf,sI,sI,sf}", "samples", (json_int_t)r->check_n, "syntax_ok",
                    (json_int_t)r->check_valid, "copies", (json_int_t)r->check_copies, "copy_share",
                    r->check_valid ? (double)r->check_copies / (double)r->check_valid : 0.0,
                    "distinct", (json_int_t)r->check_distinct, "novel_distinct",
                    (json_int_t)r->check_novel, "novelty",
                    r->check_distinct ? (double)r->check_novel / (double)r->check_distinct : 0.0);
        if (chk && r->check_base_valid >= 0) /* the base model's on the same draws */
            json_object_set_new(chk, "base_syntax_ok", json_integer((json_int_t)r->check_base_valid));
        if (chk) mg_json_put(j, "check", chk);
    }
    char *s = mg_json_dump(j, 6);
    json_decref(j);
    printf("%s\n", s ? s : "{}");
    free(s);
    fflush(stdout);
}

/* ------------------------------------------------------------ the command */

/* Under mpirun the ranks train one run: every setting agrees (the bits of
 * its value, and whether it was given). Not compared: the inputs' paths,
 * whose contents mg_train_run compares (data and --augment-file by their
 * hash, --init and --resume by the parameters), rank 0's outputs and clock
 * (--time-limit), and each machine's own (--threads, the display). */
static mg_status agree_settings(mg_dist *d, const mg_train_config *c, mg_error *err) {
    static const char *const own[] = {"data",       "augment_file", "init",    "resume",
                                      "out",        "loss_log",     "dump_rows", "time_limit",
                                      "threads",    "progress",     "quiet"};
    mg_dist_field f[MG_TRAIN_SETTING_COUNT];
    char names[MG_TRAIN_SETTING_COUNT][40];
    size_t n = 0;
    for (size_t i = 0; i < MG_TRAIN_NUM_SETTINGS; i++) {
        const mg_setting *s = &MG_TRAIN_SETTING[i];
        int skip = 0;
        for (size_t j = 0; j < sizeof own / sizeof own[0]; j++) skip |= !strcmp(s->key, own[j]);
        if (skip) continue;
        const char *p = (const char *)c + s->offset;
        const size_t bytes = s->kind == MG_KIND_INT || s->kind == MG_KIND_FLAG ? sizeof(int)
                             : s->kind == MG_KIND_F32                        ? sizeof(float)
                                                                             : sizeof(int64_t);
        const uint64_t h = s->kind == MG_KIND_STR ? mg_dist_hash_str(*(const char *const *)p)
                                                  : mg_dist_hash(p, bytes);
        snprintf(names[n], sizeof names[n], "--%s", s->cli);
        f[n] = (mg_dist_field){names[n], mg_mix64(h) ^ c->given[i]};
        n++;
    }
    return mg_dist_agree_fields(d, f, n, err);
}

/* The options into c: the preset first, then every setting given (marked
 * in c->given), then the checks between them and the fine-tuning defaults.
 * 0, -1 (--help printed) or 2 (a usage error, said). */
static int parse_args(mg_train_config *c, int argc, char **argv) {
    mg_train_config_default(c);
    train_extra x = {0};
    mg_cli_value vals[MG_TRAIN_SETTING_COUNT + 1];
    const mg_cli_spec spec = {"train", TRAIN_USAGE, TRAIN_NOTES,
                              {{MG_TRAIN_SETTING, MG_TRAIN_NUM_SETTINGS, c}, {PRESET_OPTION, 1, &x}},
                              2};
    int rc = mg_cli_read(&spec, argc, argv, vals);
    if (!rc) rc = mg_cli_apply(&spec, 1, vals);
    if (!rc && x.preset == 1) mg_model_config_molgpt(&c->model);
    if (!rc) rc = mg_cli_apply(&spec, 0, vals);
    if (rc) return rc;
    for (size_t i = 0; i < MG_TRAIN_NUM_SETTINGS; i++) c->given[i] = vals[i].opt[0] != 0;
    const int preset_given = vals[MG_TRAIN_NUM_SETTINGS].opt[0] != 0;
    if (c->init_path && preset_given)
        return mg_cli_usage("train", "--preset with --init: a fine-tuned model keeps MODEL's shape");
    if (c->resume_path && preset_given)
        return mg_cli_usage("train", "--preset with --resume: the checkpoint fixes the model");
    if (c->freeze > 0 && !c->init_path && !c->resume_path)
        return mg_cli_usage("train", "--freeze needs --init MODEL: it keeps a trained model's "
                                     "lower layers fixed (a fresh model's would stay random)");
    /* fine-tuning defaults (train_settings.h, measured) where not given */
    if (c->init_path && !c->given[mg_setting_find("lr") - MG_TRAIN_SETTING])
        c->optim.lr = (float)MG_FINETUNE_LR;
    if (c->init_path && !c->given[mg_setting_find("val_frac") - MG_TRAIN_SETTING])
        c->val_frac = MG_FINETUNE_VAL_FRAC;
    if (!c->init_path && c->model.d_model % c->model.n_head)
        return mg_cli_usage("train", "--heads %d does not divide --d-model %d", c->model.n_head,
                            c->model.d_model);
    if (!c->resume_path && c->steps == 0 && c->time_limit <= 0)
        return mg_cli_usage("train", "give --steps N or --time-limit SECONDS (or both)");
    if (!c->out_path) c->out_path = c->resume_path ? c->resume_path : "out/model.safetensors";
    return 0;
}

/* What one run holds, freed once. */
typedef struct {
    mg_train_config c;
    char *data_default; /* $MOLGEN_SHARED_DATA/moses_176k.smi */
    char *out_target;   /* --out with its symbolic links followed */
} train_job;

/* The data file when none is given: $MOLGEN_SHARED_DATA's or the repo's. */
static int default_data(train_job *j) {
    const char *dir = getenv("MOLGEN_SHARED_DATA");
    if (j->c.data_path || j->c.resume_path) return 0;
    if (!dir || !*dir) {
        j->c.data_path = "data/moses_20k.smi";
        return 0;
    }
    const size_t n = strlen(dir) + sizeof "/moses_176k.smi";
    if (!(j->data_default = malloc(n))) return 1;
    snprintf(j->data_default, n, "%s/moses_176k.smi", dir);
    j->c.data_path = j->data_default;
    return 0;
}

/* Every output is checked and locked before any work (a run is never lost
 * at its first checkpoint) and is none of the inputs; --out may be the
 * --resume file, which is then an output only (a --loss-log over it is one
 * over --out). Under mpirun rank 0 writes, so rank 0 checks; every rank
 * learns. A symbolic link --out is kept: the file it names is replaced. */
static int claim_outputs(train_job *j) {
    mg_train_config *c = &j->c;
    const int out_is_resume = mg_cli_same_file(c->out_path, c->resume_path);
    const mg_cli_file outs[] = {{"--out", c->out_path, MG_CLI_WHOLE},
                                {"--loss-log", c->loss_log, 0},
                                {"--debug-dump-rows", c->dump_rows, 0}};
    const mg_cli_file ins[] = {{"--data", c->data_path, 0},
                               {"--init", c->init_path, 0},
                               {"--augment-file", c->augment_file, 0},
                               {"--resume", out_is_resume ? NULL : c->resume_path, 0}};
    const int stale = mg_cli_claim_outputs("train", outs, 3, ins, 4);
    if (stale < 0) return 1;
    if (stale > 0 && !c->quiet)
        fprintf(stderr, "removed %d stale temporary file(s) of %s left by killed runs\n", stale,
                c->out_path);
    if (!(j->out_target = malloc(MG_CLI_PATH_MAX))) {
        fprintf(stderr, "molgen train: out of memory\n");
        return 1;
    }
    c->out_path = mg_cli_output_target(c->out_path, j->out_target, MG_CLI_PATH_MAX);
    return 0;
}

static int run(train_job *j) {
    mg_train_config *c = &j->c;
    mg_dist *world = mg_dist_world();
    mg_error e;
    if (default_data(j)) {
        fprintf(stderr, "molgen train: out of memory\n");
        return 1;
    }
    if (agree_settings(world, c, &e)) {
        mg_cli_report("train", e.status, &e);
        return 1;
    }
    const char *out_given = c->out_path;
    if (claim_outputs(j)) return 1;
    display d = {stderr, c->quiet, c->progress, isatty(fileno(stderr)), 0, -1e300};
    c->dist = world;
    c->log = (mg_train_log){on_message, on_progress, &d};
    mg_train_install_signal_handlers();
    mg_train_result r;
    const mg_status rc = mg_train_run(c, &r, &e);
    if (d.line_open) fputc('\n', d.f); /* the last progress line stays */
    if (rc) { /* a failed rank says why; the others stop quietly */
        mg_cli_report("train", rc, &e);
        return 1;
    }
    if (world->rank == 0) print_summary(out_given, c->init_path, &r);
    if (r.stop == MG_STOP_SIGNAL)
        return 128 + (mg_train_stop_signal() ? mg_train_stop_signal() : SIGINT);
    return 0;
}

int cmd_train(int argc, char **argv) {
    train_job j;
    memset(&j, 0, sizeof j);
    int rc = parse_args(&j.c, argc, argv);
    if (!rc) rc = run(&j);
    free(j.data_default);
    free(j.out_target);
    return rc < 0 ? 0 : rc;
}
