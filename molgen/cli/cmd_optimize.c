/* `molgen optimize`: options -> mg_opt_run (optimize.h) against a scorer
 * process (scorer_process.h) -> DIR/{scored.csv, best.smi, agent.safetensors,
 * summary.json}. Also the hidden `molgen debug-dap` (dap_dump.h). */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli_options.h"
#include "cli_util.h"
#include "commands.h"
#include "harness/dap_dump.h"
#include "base/dist.h"
#include "rl/chem_helper.h"
#include "rl/optimize.h"
#include "rl/opt_checkpoint.h"
#include "rl/opt_reports.h"
#include "rl/scorer_process.h"
#include "base/util.h"

/* The options as given: the run's settings (opt_settings.h's table) and
 * this invocation's paths, scorer wait and threads. */
typedef struct {
    const char *prior, *scorer, *out, *resume;
    int threads, scorer_changed;
    double timeout;
    mg_opt_opts op;
} opt_args;

/* The command's rows: the four paths, every MG_OPT_SETTING row (its offset
 * moved into opt_args' op), then the scorer's wait, threads and
 * --scorer-changed; built once (options_rows). */
#define T opt_args
static const mg_setting OPTIMIZE_HEAD[] = {
    {MG_OPT_STR(T, "prior", "FILE", prior, "the prior model (molgen train's model or checkpoint; required)")},
    {MG_OPT_STR(T, "scorer", "'COMMAND'", scorer,
                "the scorer, started once by /bin/sh -c (protocol below; required)")},
    {MG_OPT_STR(T, "out", "DIR", out, "output directory (created; required unless --resume)")},
    {MG_OPT_STR(T, "resume", "DIR", resume,
                "continue the run saved in DIR bit for bit (its options unless given: the same; "
                "--budget may grow, --patience change)")},
};
static const mg_setting OPTIMIZE_TAIL[] = {
    {MG_OPT_F64(T, "scorer-timeout", "S", timeout, 0, 1e7, MG_OPEN_LO,
                "the longest wait for one answer line, seconds")},
    {MG_CLI_OPT_THREADS(T)},
    {MG_OPT_FLAG(T, "scorer-changed", scorer_changed,
                 "with --resume: go on with a --scorer other than the one the run recorded (the "
                 "scores so far are kept; without it another command is refused)")},
};
#undef T
#define N_HEAD (sizeof OPTIMIZE_HEAD / sizeof *OPTIMIZE_HEAD)
#define N_TAIL (sizeof OPTIMIZE_TAIL / sizeof *OPTIMIZE_TAIL)
enum { ROW_RESUME = 3 }; /* --resume's index among the rows */

/* The rows in *n (filled on the first call: one thread parses). */
static const mg_setting *options_rows(size_t *n) {
    static mg_setting rows[MG_CLI_MAX_ROWS];
    static size_t k;
    if (!k) {
        for (size_t i = 0; i < N_HEAD; i++) rows[k++] = OPTIMIZE_HEAD[i];
        for (size_t i = 0; i < MG_OPT_NUM_SETTINGS; i++) {
            rows[k] = MG_OPT_SETTING[i].row;
            rows[k].key = rows[k].cli; /* the command line's messages say --cli */
            rows[k++].offset += offsetof(opt_args, op);
        }
        for (size_t i = 0; i < N_TAIL; i++) rows[k++] = OPTIMIZE_TAIL[i];
    }
    *n = k;
    return rows;
}

/* --preset, a table of its own: applied after a resumed run's saved options
 * and before every option given, whatever the order. */
typedef struct {
    int preset; /* 0 default, 1 pmo */
} opt_preset;

static const mg_setting PRESET_OPTION[] = {
    {MG_OPT_CHOICE(opt_preset, "preset", "default|pmo", preset,
                   "default (the defaults above: REINVENT 4's) or pmo (the best measured for "
                   "PMO's 10,000 calls, docs/pmo.md: PMO's REINVENT, mol_opt's hparams, "
                   "--sigma 500 --lr 5e-4 --memory 100 --replay 24 --df none, with Genetic "
                   "GFN's GA and experience loop, --helper on --ga-offspring 16 --rank-coef "
                   "0.01 --replay-loops 2, and --patience 20), then the options given, "
                   "whatever their order")},
};

static const char OPTIMIZE_USAGE[] =
    "usage: molgen optimize --prior MODEL --scorer 'COMMAND' --out DIR [options]\n"
    "       molgen optimize --resume DIR --prior MODEL --scorer 'COMMAND' [options]\n"
    "Goal-directed generation (REINVENT 4's reinforcement learning): an agent that\n"
    "starts as the prior samples batches, an external scorer scores them, and the\n"
    "agent is trained on loss = mean (prior_ll + sigma score - agent_ll)^2 (Adam,\n"
    "the prior frozen) until --budget distinct molecules have been scored.\n";
static const char OPTIMIZE_NOTES[] =
    "Scorer protocol: molgen writes one SMILES per line to the scorer's stdin,\n"
    "flushes after each batch, and reads one line per SMILES, in order (answer\n"
    "each line as it is read, and flush): a number in [0, 1] or nan (cannot\n"
    "score: invalid, score 0, no budget; spaces around it allowed), optionally\n"
    "followed by TAB-separated name=value fields: canonical=SMILES (the cache and\n"
    "budget key: two spellings cost one call), scaffold=SMILES (the diversity\n"
    "filter's bucket) and numeric components (kept in scored.csv). The request\n"
    "\"!randomize<TAB>SEED<TAB>N<TAB>SMILES\" is answered by one line of N\n"
    "TAB-separated randomized SMILES (or an empty line), each a SMILES of the\n"
    "request's heavy atoms (checked: another molecule is an error). A line that is not a\n"
    "number, inf, a score outside [0, 1] (refused, never clipped), a missing\n"
    "line, the scorer exiting and no answer within --scorer-timeout each stop the\n"
    "run with an error naming the molecule and the line; the state of that step's\n"
    "start is saved: --resume DIR redoes it. Molecules already scored are served\n"
    "from the cache. Example scorer (share of N atoms):\n"
    "  import sys\n"
    "  from rdkit import Chem\n"
    "  for line in sys.stdin:\n"
    "      m = Chem.MolFromSmiles(line.strip())\n"
    "      if m is None or m.GetNumAtoms() == 0:\n"
    "          print('nan', flush=True); continue\n"
    "      n = sum(a.GetSymbol() == 'N' for a in m.GetAtoms())\n"
    "      print('%.6f\\tcanonical=%s' % (n / m.GetNumAtoms(), Chem.MolToSmiles(m)),\n"
    "            flush=True)\n"
    "DIR holds scored.csv (each scored molecule once: call, step, SMILES, canonical,\n"
    "score, prior and agent NLL, scaffold, components), best.smi (the 100 best),\n"
    "agent.safetensors (the agent: molgen sample reads it; its Adam state, memory\n"
    "and every scored molecule) and summary.json (top-1/10/100 means, PMO's AUC of\n"
    "the top-10 over the budget, steps, stop reason). Progress on stderr.\n"
    "Under mpirun -np N each rank holds the prior and the agent and starts its own\n"
    "scorer (the same COMMAND); each step's batch is sampled and scored split over\n"
    "the ranks by index, and every rank applies the replies in order: the molecules,\n"
    "scores and calls are the single process's; the gradient is summed over the\n"
    "ranks (the agent equals one process's up to float summation order). Rank 0\n"
    "writes DIR and prints. The ranks must agree on every option but --threads,\n"
    "--scorer-timeout and the paths, on the prior's weights and on the scorer\n"
    "command; a scorer fault on any rank is said once (by the lowest failing\n"
    "rank), the state saved. --resume with any number of ranks continues the run.\n";

typedef struct {
    const char *prior, *scorer, *out, *resume;
    double timeout;
    int threads, rank; /* rank: this process's under mpirun (0 alone) */
    char dir_scored[4200], dir_best[4200], dir_agent[4200], dir_summary[4200];
    double t0;
} run_ctx;

/* The options into o and c: a resumed run's saved ones are the defaults of
 * its algorithm options. 0, -1 (--help printed) or 2 (said). */
static int parse(int argc, char **argv, mg_opt_opts *o, run_ctx *c) {
    opt_args a = {.timeout = 300, .op = *o};
    opt_preset x = {0};
    size_t n_opts;
    const mg_setting *rows = options_rows(&n_opts);
    const mg_cli_spec spec = {"optimize", OPTIMIZE_USAGE, OPTIMIZE_NOTES,
                              {{rows, n_opts, &a}, {PRESET_OPTION, 1, &x}},
                              2};
    mg_cli_value vals[MG_CLI_MAX_ROWS];
    int rc = mg_cli_read(&spec, argc, argv, vals);
    if (rc) return rc;
    if (vals[ROW_RESUME].opt[0] && vals[n_opts].opt[0])
        return mg_cli_usage("optimize", "--preset with --resume: the run keeps its saved options");
    if (vals[ROW_RESUME].opt[0]) { /* --resume DIR: its saved options first */
        mg_error err;
        char path[4200];
        snprintf(path, sizeof path, "%s/agent.safetensors", vals[ROW_RESUME].text);
        mg_status st = mg_dist_agree(mg_dist_world(), mg_opt_read_options(path, o, &err), &err);
        if (st) {
            const mg_error e0 = err;
            if (st != MG_ERR_PEER)
                mg_fail(&err, st, "--resume %s: %s", vals[ROW_RESUME].text, e0.message);
            return mg_cli_report("optimize", st, &err), 1;
        }
        a.op = *o;
    }
    if ((rc = mg_cli_apply(&spec, 1, vals))) return rc;
    if (x.preset == 1) { /* mol_opt main/reinvent/hparams_default.yaml */
        a.op.sigma = 500;
        a.op.lr = 5e-4;
        a.op.memory = 100;
        a.op.replay = 24;
        a.op.df = MG_DF_NONE;
        /* the ablations of docs/pmo.md: Genetic GFN's GA, two replay
         * loops, and a patience of 20 (main/run.py's 5 stopped loop runs
         * whose top-10 still rose) */
        a.op.patience = 20;
        a.op.helper = 1;
        a.op.ga_offspring = 16;
        a.op.rank_coef = 0.01;
        a.op.replay_loops = 2;
    }
    if ((rc = mg_cli_apply(&spec, 0, vals))) return rc;
    *o = a.op;
    mg_opt_opts_fold(o);
    o->scorer_cmd = a.scorer;
    o->scorer_changed = a.scorer_changed;
    mg_cli_note_dtype("optimize", o->dtype);
    *c = (run_ctx){.prior = a.prior, .scorer = a.scorer, .out = a.out, .resume = a.resume,
                   .timeout = a.timeout, .threads = a.threads};
    if (c->resume && c->out && strcmp(c->out, c->resume))
        return mg_cli_usage("optimize", "--resume writes to its own DIR: no --out");
    if (c->resume) c->out = c->resume;
    if (!c->prior || !c->scorer || !c->out)
        return mg_cli_usage("optimize", "--prior, --scorer and --out (or --resume) are required");
    if (!c->scorer[strspn(c->scorer, " \t\n")])
        return mg_cli_usage("optimize", "--scorer is empty: give the command that scores");
    if (a.scorer_changed && !c->resume)
        return mg_cli_usage("optimize", "--scorer-changed goes with --resume");
    return 0;
}

static void progress(void *ctx, const mg_opt_progress *p) {
    if (((const run_ctx *)ctx)->rank) return; /* rank 0 prints */
    const int64_t done = p->calls - p->calls0;
    char eta[32] = "?";
    if (done > 0) mg_fmt_duration(p->seconds / (double)done * (double)(p->budget - p->calls), eta, sizeof eta);
    fprintf(stderr,
            "step %lld  mean %.3f  top10 %.3f  valid %.2f  unique %.2f  new %.2f  calls %lld/%lld"
            "  loss %.1f  %.1f s  ETA %s\n",
            (long long)p->step, p->mean, p->top10, p->valid, p->unique, p->fresh,
            (long long)p->calls, (long long)p->budget, p->loss, p->seconds, eta);
}

/* one text output written whole through a temporary */
static mg_status write_out(const char *path, mg_opt *o, int what, double secs, mg_error *err) {
    char tmp[4300];
    FILE *f = mg_cli_atomic_open(path, tmp, sizeof tmp, err);
    if (!f) return MG_ERR_IO;
    const int w = what == 0   ? mg_opt_write_scored(o, f)
                  : what == 1 ? mg_opt_write_best(o, f, 100)
                              : mg_opt_write_summary(o, f, secs);
    return mg_cli_atomic_commit_if(f, w, tmp, path, err);
}

static mg_status save(void *ctx, mg_opt *o, mg_error *err) {
    run_ctx *c = ctx;
    if (c->rank) return MG_OK; /* rank 0 writes DIR */
    const double secs = mg_now_s() - c->t0;
    /* the four files are one save: a signal (two SIGINTs) waits for them */
    mg_hold_stop_signals(1);
    mg_status rc = mg_opt_save(o, c->dir_agent, err);
    const char *pause = getenv("MOLGEN_OPT_SAVE_PAUSE"); /* tests: seconds mid-save */
    for (const double t1 = mg_now_s() + (pause ? atof(pause) : 0); !rc && mg_now_s() < t1;)
        nanosleep(&(struct timespec){0, 10000000}, NULL);
    if (!rc) rc = write_out(c->dir_scored, o, 0, secs, err);
    if (!rc) rc = write_out(c->dir_best, o, 1, secs, err);
    if (!rc) rc = write_out(c->dir_summary, o, 2, secs, err);
    mg_hold_stop_signals(0);
    return rc;
}

/* DIR's files claimed (checked, locked) before any work; 0 or 1 (said). A
 * new run never writes over a saved one (its state would be lost). */
static int claim(run_ctx *c) {
    mg_error err;
    snprintf(c->dir_scored, sizeof c->dir_scored, "%s/scored.csv", c->out);
    snprintf(c->dir_best, sizeof c->dir_best, "%s/best.smi", c->out);
    snprintf(c->dir_agent, sizeof c->dir_agent, "%s/agent.safetensors", c->out);
    snprintf(c->dir_summary, sizeof c->dir_summary, "%s/summary.json", c->out);
    mg_status rc = c->rank ? MG_OK : mg_cli_check_output_dir(c->out, &err);
    if (rc) fprintf(stderr, "molgen optimize: --out %s: %s\n", c->out, err.message);
    if (!rc && !c->rank && !c->resume && access(c->dir_agent, F_OK) == 0) {
        fprintf(stderr, "molgen optimize: --out %s holds a run already (%s): continue it with "
                        "--resume %s, or give another --out\n", c->out, c->dir_agent, c->out);
        rc = MG_ERR_ARG;
    }
    if (mg_dist_agree(mg_dist_world(), rc, &err)) return 1;
    const mg_cli_file outs[] = {{"--out (agent.safetensors)", c->dir_agent, MG_CLI_WHOLE},
                                {"--out (scored.csv)", c->dir_scored, MG_CLI_WHOLE},
                                {"--out (best.smi)", c->dir_best, MG_CLI_WHOLE},
                                {"--out (summary.json)", c->dir_summary, MG_CLI_WHOLE}};
    const mg_cli_file ins[] = {{"--prior", c->prior, 0}};
    return mg_cli_claim_outputs("optimize", outs, 4, ins, 1) < 0;
}

/* The options that decide the run, for the ranks to agree on (--threads,
 * --scorer-timeout and the paths are each rank's) into f (room for
 * MG_OPT_NUM_SETTINGS + 3); their number. A setting is compared as the
 * command line shows it (reals in their shortest exact digits). */
static size_t run_fields(const mg_opt_opts *o, const run_ctx *c, mg_dist_field *f,
                         char (*names)[48]) {
    size_t k = 0;
    for (size_t i = 0; i < MG_OPT_NUM_SETTINGS; i++, k++) {
        const mg_setting *s = &MG_OPT_SETTING[i].row;
        char v[64];
        mg_setting_format(s, o, v, sizeof v);
        snprintf(names[k], sizeof names[k], "--%s", s->cli);
        f[k] = (mg_dist_field){names[k], mg_dist_hash_str(v)};
    }
    f[k++] = (mg_dist_field){"--resume", c->resume != NULL};
    f[k++] = (mg_dist_field){"--scorer", mg_dist_hash_str(c->scorer)};
    f[k++] = (mg_dist_field){"--scorer-changed", (uint64_t)o->scorer_changed};
    return k;
}

/* An engine call's status agreed over the ranks; 0, or 1 (said once). */
static int agreed(mg_status rc, mg_error *err) {
    if (!(rc = mg_dist_agree(mg_dist_world(), rc, err))) return 0;
    mg_cli_report("optimize", rc, err);
    return 1;
}

/* the models, the scorer and the engine; 0 or 1 (said) */
static int setup(run_ctx *c, mg_opt_opts *o, mg_model *mm[2], mg_vocab **v, mg_scorer **sc,
                 mg_chem **chem, mg_opt **opt) {
    mg_error err;
    mg_dist *world = mg_dist_world();
    if (mg_cli_load_model("optimize", c->prior, 0, &mm[0], v, NULL) ||
        mg_cli_load_model("optimize", c->prior, 0, &mm[1], NULL, NULL))
        return 1;
    mg_model_set_threads(mm[0], c->threads);
    mg_model_set_threads(mm[1], c->threads);
    const mg_dist_field prior = {"the --prior file (its weights)",
                                 world->size > 1 ? mg_model_fingerprint(mm[0], *v) : 0};
    if (agreed(mg_dist_agree_fields(world, &prior, 1, &err), &err) ||
        agreed(mg_scorer_start(c->scorer, c->timeout, sc, &err), &err) ||
        (o->helper && agreed(mg_chem_start(NULL, c->timeout, chem, &err), &err)))
        return 1;
    o->chem = *chem;
    if (agreed(mg_opt_new(mm[0], mm[1], *v, *sc, o, opt, &err), &err) ||
        (c->resume && agreed(mg_opt_restore(*opt, c->dir_agent, &err), &err)))
        return 1;
    const mg_dist_field state = {"the --resume checkpoint (its contents)",
                                 c->resume && world->size > 1 ? mg_opt_state_digest(*opt) : 0};
    if (agreed(mg_dist_agree_fields(world, &state, 1, &err), &err)) return 1;
    int other = 0;
    const char *was = c->resume ? mg_opt_saved_scorer(*opt, &other) : NULL;
    if (c->resume && !c->rank && !was)
        fprintf(stderr, "molgen optimize: note: %s records no scorer command (an older molgen's "
                        "state): going on with --scorer '%s', recorded from now on\n",
                c->dir_agent, c->scorer);
    else if (was && !c->rank && other)
        fprintf(stderr, "molgen optimize: note: --scorer-changed: the run was scored by '%s' so "
                        "far; going on with '%s' (recorded from now on)\n", was, c->scorer);
    return 0;
}

int cmd_optimize(int argc, char **argv) {
    mg_opt_opts o;
    mg_opt_opts_default(&o);
    run_ctx c;
    mg_error err;
    int rc = parse(argc, argv, &o, &c);
    if (rc) return rc < 0 ? 0 : rc;
    if (mg_opt_opts_check(&o, &err))
        return fprintf(stderr, "molgen optimize: %s\n", err.message), 2;
    mg_dist_field fields[MG_CLI_MAX_ROWS];
    char names[MG_CLI_MAX_ROWS][48];
    if (agreed(mg_dist_agree_fields(mg_dist_world(), fields, run_fields(&o, &c, fields, names),
                                    &err),
               &err))
        return 1;
    c.rank = mg_dist_world()->rank;
    if (claim(&c)) return 1;
    mg_catch_stop_signals();
    mg_model *mm[2] = {NULL, NULL};
    mg_vocab *v = NULL;
    mg_scorer *sc = NULL;
    mg_chem *chem = NULL;
    mg_opt *opt = NULL;
    o.progress = progress;
    o.save = save;
    o.ctx = &c;
    o.stop = &mg_stop_signal;
    o.dist = mg_dist_world();
    c.t0 = mg_now_s();
    rc = setup(&c, &o, mm, &v, &sc, &chem, &opt);
    int saved = 0;
    mg_status st = rc ? MG_OK : mg_opt_run(opt, &saved, &err);
    if (st) {
        mg_cli_report("optimize", st, &err);
        if (saved && !c.rank)
            fprintf(stderr, "molgen optimize: the state of step %lld's start is saved in %s: "
                            "continue with --resume %s\n",
                    (long long)mg_opt_steps(opt) + 1, c.dir_agent, c.out);
        rc = mg_stop_signal ? 128 + mg_stop_signal : 1;
    } else if (!rc && !c.rank) {
        const mg_dist *w = mg_dist_world();
        char ranks[96] = "";
        if (w->size > 1) /* waits for the other ranks (their scorers) included */
            snprintf(ranks, sizeof ranks, "; %d ranks, rank 0 %.1f s in collectives", w->size,
                     w->comm_s);
        fprintf(stderr, "molgen optimize: %lld calls in %lld steps, %.1f s (stop: %s)%s\n",
                (long long)mg_opt_calls(opt), (long long)mg_opt_steps(opt), mg_now_s() - c.t0,
                mg_opt_stop_reason(opt), ranks);
        printf("%s\n", c.out);
    }
    mg_opt_free(opt);
    mg_scorer_free(sc);
    mg_chem_free(chem);
    mg_model_free(mm[0]);
    mg_model_free(mm[1]);
    mg_vocab_free(v);
    return rc;
}


/* `molgen debug-dap` (hidden, for tests): mg_dap_dump (dap_dump.h). */
typedef struct {
    const char *out, *scores;
    int layers, d, heads, ctx, vocab, batch, threads;
    uint64_t seed;
    double perturb, sigma;
} dap_args;

#define T dap_args
static const mg_setting DAP_OPTIONS[] = {
    {MG_OPT_STR(T, "out", "FILE", out, "the dump (required)")},
    {MG_OPT_STR(T, "scores", "X,Y,..", scores, "the rows' scores, cycled")},
    {MG_OPT_INT(T, "layers", "N", layers, 1, 16, "layers")},
    {MG_OPT_INT(T, "d-model", "N", d, 1, 1024, "model width")},
    {MG_OPT_INT(T, "heads", "N", heads, 1, 64, "heads")},
    {MG_OPT_INT(T, "ctx-len", "N", ctx, 2, 512, "positions")},
    {MG_OPT_INT(T, "vocab", "N", vocab, 4, 1000, "vocabulary size")},
    {MG_OPT_INT(T, "batch", "N", batch, 1, 1000, "rows")},
    {MG_OPT_U64(T, "seed", "S", seed, "seed of the models and rows")},
    {MG_OPT_F64(T, "perturb", "P", perturb, 0, 10, MG_CLOSED, "parameter perturbation")},
    {MG_OPT_F64(T, "sigma", "X", sigma, 0, 1e6, MG_CLOSED, "the DAP sigma")},
    {MG_OPT_INT(T, "threads", "N", threads, 1, MG_MAX_THREADS, "threads")},
};
#undef T

int cmd_debug_dap(int argc, char **argv) {
    dap_args a = {.scores = "0.1,0.9,0,0.5", .layers = 2, .d = 16, .heads = 2, .ctx = 8,
                  .vocab = 10, .batch = 4, .threads = 1, .seed = 1, .perturb = 0.6, .sigma = 128};
    const mg_cli_spec spec = {"debug-dap", "usage: molgen debug-dap --out FILE [options]   "
                              "(testing tool: dap_dump.h)\n", NULL,
                              {{DAP_OPTIONS, sizeof DAP_OPTIONS / sizeof *DAP_OPTIONS, &a}}, 1};
    int rc = mg_cli_parse(&spec, argc, argv, NULL);
    if (rc) return rc < 0 ? 0 : rc;
    if (!a.out) return mg_cli_usage("debug-dap", "--out FILE is required");
    double sc[64];
    int n = 0;
    for (const char *p = a.scores; *p && n < 64; n++) {
        char *end;
        sc[n] = strtod(p, &end);
        if (end == p || (*end && *end != ','))
            return mg_cli_usage("debug-dap", "bad --scores '%s'", a.scores);
        p = *end ? end + 1 : end;
    }
    mg_model_config mc = {.n_layer = a.layers, .d_model = a.d, .n_head = a.heads,
                          .ctx_len = a.ctx, .vocab_size = a.vocab};
    mg_error err;
    double loss;
    if (mg_model_config_check(&mc, &err) ||
        mg_dap_dump(&mc, a.batch, a.seed, a.perturb, a.sigma, sc, n, a.threads, a.out, &loss, &err)) {
        fprintf(stderr, "molgen debug-dap: %s\n", err.message);
        return 1;
    }
    printf("%s loss %.17g\n", a.out, loss);
    return 0;
}
