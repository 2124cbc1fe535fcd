/* `molgen optimize`: options -> mg_opt_run (optimize.h) against a scorer
 * process (scorer.h) -> DIR/{scored.csv, best.smi, agent.safetensors,
 * summary.json}. */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli_util.h"
#include "commands.h"
#include "dap_dump.h"
#include "optimize.h"
#include "scorer.h"
#include "util.h"

static const char OPTIMIZE_USAGE[] =
    "usage: molgen optimize --prior MODEL --scorer 'COMMAND' --out DIR [options]\n"
    "       molgen optimize --resume DIR --prior MODEL --scorer 'COMMAND' [options]\n"
    "Goal-directed generation (REINVENT 4's reinforcement learning): an agent that\n"
    "starts as the prior samples batches, an external scorer scores them, and the\n"
    "agent is trained on loss = mean (prior_ll + sigma score - agent_ll)^2 (Adam,\n"
    "the prior frozen) until --budget distinct molecules have been scored.\n"
    "  --prior FILE         the prior model (molgen train's model or checkpoint)\n"
    "  --scorer 'COMMAND'   the scorer, started once by /bin/sh -c (protocol below)\n"
    "  --budget N           scoring calls: distinct valid molecules (default 10000)\n"
    "  --seed S             random seed (default 0); same seed + threads + scorer =\n"
    "                       the same run\n"
    "  --out DIR            output directory (created)\n"
    "  --batch B            molecules sampled per step (default 64)\n"
    "  --sigma X            score weight of the augmented likelihood (default 128)\n"
    "  --lr X               Adam learning rate (default 1e-4)\n"
    "  --constrain MODE     none|syntax|valence, as molgen sample (default valence:\n"
    "                       the most valid molecules for the least time)\n"
    "  --df KIND            diversity filter: scaffold (identical Murcko scaffold,\n"
    "                       from the scorer's scaffold= field; without one the\n"
    "                       canonical SMILES), smiles (identical molecule) or none\n"
    "                       (default scaffold; identical-murcko and identical-smiles\n"
    "                       are accepted too)\n"
    "  --df-bucket N        molecules per bucket before it scores 0 (default 25)\n"
    "  --df-min-score X     only molecules scoring >= X fill buckets (default 0.4)\n"
    "  --repeat-penalty X   learning score factor of a molecule scored in an earlier\n"
    "                       step (default 0.5; 1: none)\n"
    "  --memory N           inception memory: the N best molecules (default 50)\n"
    "  --replay N           memory molecules replayed per step (default 10)\n"
    "  --augmented-memory K Augmented Memory: K more updates per step on the memory\n"
    "                       spelled as randomized SMILES (the scorer's !randomize;\n"
    "                       default 0: off)\n"
    "  --collapse-steps K   mode-collapse stop: K consecutive steps (default 20; 0:\n"
    "                       never) in which the share of the batch new to the cache is\n"
    "  --collapse-share X   below X (default 0.02)\n"
    "  --max-steps N        stop after N steps (default 0: no limit)\n"
    "  --stop-after N       stop after step N, checkpointed (to be resumed)\n"
    "  --save-every N       checkpoint every N steps (default 20; also at the end and\n"
    "                       on any error)\n"
    "  --scorer-timeout S   the longest wait for one answer line, seconds (default 300)\n"
    "  --threads N          threads (default: ATTN_NUM_THREADS or all cores)\n"
    "  --resume DIR         continue the run saved in DIR bit for bit (its options\n"
    "                       unless given: the same; --budget may grow)\n"
    "Scorer protocol: molgen writes one SMILES per line to the scorer's stdin,\n"
    "flushes after each batch, and reads one line per SMILES, in order: a number\n"
    "in [0, 1] or nan (cannot score: invalid, score 0, no budget), optionally\n"
    "followed by TAB-separated name=value fields: canonical=SMILES (the cache and\n"
    "budget key: two spellings cost one call), scaffold=SMILES (the diversity\n"
    "filter's bucket) and numeric components (kept in scored.csv). The request\n"
    "\"!randomize<TAB>SEED<TAB>N<TAB>SMILES\" is answered by one line of N\n"
    "TAB-separated randomized SMILES (or an empty line). A line that is not a\n"
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
    "the top-10 over the budget, steps, stop reason). Progress on stderr. Runs as\n"
    "one process (not under mpirun).\n";

typedef struct {
    const char *prior, *scorer, *out, *resume;
    double timeout;
    int threads;
    char dir_scored[4200], dir_best[4200], dir_agent[4200], dir_summary[4200];
    double t0;
} run_ctx;

/* One option: where its value goes and how it parses. */
typedef struct {
    const char *name;
    char kind; /* s string, i int, I int64, u uint64, d double, c constrain, f df */
    void *dst;
    double lo, hi;
} opt_row;

/* Whole-string numbers: 1 and *out, or 0. */
static int int_of(const char *v, double lo, double hi, long long *out) {
    char *end;
    errno = 0;
    *out = strtoll(v, &end, 10);
    return *v && !*end && !errno && *out >= lo && *out <= hi;
}

static int real_of(const char *v, double *out) {
    char *end;
    errno = 0;
    *out = strtod(v, &end);
    return *v && !*end && !errno && isfinite(*out);
}

static int bad_value(const char *cmd, const char *opt, const char *v) {
    fprintf(stderr, "molgen %s: bad value '%s' for --%s (see molgen %s --help)\n", cmd, v, opt,
            cmd);
    return 2;
}

static int parse_value(const opt_row *r, const char *v) {
    long long ll;
    double d;
    switch (r->kind) {
    case 's': *(const char **)r->dst = v; return 1;
    case 'i':
        if (!int_of(v, r->lo, r->hi, &ll)) return 0;
        *(int *)r->dst = (int)ll;
        return 1;
    case 'I':
        if (!int_of(v, r->lo, r->hi, &ll)) return 0;
        *(int64_t *)r->dst = ll;
        return 1;
    case 'u': {
        char *end;
        errno = 0;
        *(uint64_t *)r->dst = strtoull(v, &end, 10);
        return *v >= '0' && *v <= '9' && !*end && !errno;
    }
    case 'd':
        if (!real_of(v, &d) || d < r->lo || d > r->hi) return 0;
        *(double *)r->dst = d;
        return 1;
    case 'c': return mg_constrain_parse(v, (mg_constrain *)r->dst);
    case 'f': {
        mg_df_kind *k = r->dst;
        if (!strcmp(v, "none")) *k = MG_DF_NONE;
        else if (!strcmp(v, "smiles") || !strcmp(v, "identical-smiles")) *k = MG_DF_SMILES;
        else if (!strcmp(v, "scaffold") || !strcmp(v, "identical-murcko")) *k = MG_DF_SCAFFOLD;
        else return 0;
        return 1;
    }
    }
    return 0;
}

/* Parses argv into o and c; 0, 2 (usage error, said), or -1 (--help). With
 * only_resume, just finds --resume (the saved options are the defaults). */
static int parse(int argc, char **argv, mg_opt_opts *o, run_ctx *c, int only_resume) {
    const opt_row rows[] = {
        {"prior", 's', &c->prior, 0, 0},           {"scorer", 's', &c->scorer, 0, 0},
        {"out", 's', &c->out, 0, 0},               {"resume", 's', &c->resume, 0, 0},
        {"budget", 'I', &o->budget, 1, 1e12},      {"seed", 'u', &o->seed, 0, 0},
        {"batch", 'i', &o->batch, 1, 4096},        {"sigma", 'd', &o->sigma, 0, 1e6},
        {"lr", 'd', &o->lr, 1e-12, 1},             {"constrain", 'c', &o->constrain, 0, 0},
        {"df", 'f', &o->df, 0, 0},                 {"df-bucket", 'i', &o->df_bucket, 1, 1e9},
        {"df-min-score", 'd', &o->df_min_score, 0, 1},
        {"repeat-penalty", 'd', &o->repeat_penalty, 0, 1},
        {"memory", 'i', &o->memory, 0, 1000},      {"replay", 'i', &o->replay, 0, 1000},
        {"augmented-memory", 'i', &o->aug_rounds, 0, 100},
        {"collapse-steps", 'i', &o->collapse_steps, 0, 1e9},
        {"collapse-share", 'd', &o->collapse_share, 0, 1},
        {"max-steps", 'I', &o->max_steps, 0, 1e15}, {"stop-after", 'I', &o->stop_after, 0, 1e15},
        {"save-every", 'i', &o->save_every, 1, 1e9},
        {"scorer-timeout", 'd', &c->timeout, 0.001, 1e7},
        {"threads", 'i', &c->threads, 1, 1024},
    };
    enum { NROWS = sizeof rows / sizeof rows[0] };
    struct option lo[NROWS + 2];
    for (int i = 0; i < NROWS; i++) lo[i] = (struct option){rows[i].name, required_argument, NULL, i + 1};
    lo[NROWS] = (struct option){"help", no_argument, NULL, 'h'};
    lo[NROWS + 1] = (struct option){NULL, 0, NULL, 0};
    const char *v;
    int k;
    mg_cli_begin();
    while ((k = mg_cli_next("optimize", argc, argv, "h", lo, &v)) != -1) {
        if (k == -2) return 2;
        if (k == 'h') {
            fputs(OPTIMIZE_USAGE, stdout);
            return -1;
        }
        const opt_row *r = &rows[k - 1];
        if (only_resume && strcmp(r->name, "resume")) continue;
        if (!parse_value(r, v)) return bad_value("optimize", r->name, v);
    }
    return 0;
}

static void progress(void *ctx, const mg_opt_progress *p) {
    (void)ctx;
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
    const double secs = mg_now_s() - c->t0;
    mg_status rc = mg_opt_save(o, c->dir_agent, err);
    if (!rc) rc = write_out(c->dir_scored, o, 0, secs, err);
    if (!rc) rc = write_out(c->dir_best, o, 1, secs, err);
    if (!rc) rc = write_out(c->dir_summary, o, 2, secs, err);
    return rc;
}

/* DIR's files claimed (checked, locked) before any work; 0 or 1 (said). */
static int claim(run_ctx *c) {
    mg_error err;
    if (mg_cli_check_output_dir(c->out, &err)) {
        fprintf(stderr, "molgen optimize: --out %s: %s\n", c->out, err.message);
        return 1;
    }
    snprintf(c->dir_scored, sizeof c->dir_scored, "%s/scored.csv", c->out);
    snprintf(c->dir_best, sizeof c->dir_best, "%s/best.smi", c->out);
    snprintf(c->dir_agent, sizeof c->dir_agent, "%s/agent.safetensors", c->out);
    snprintf(c->dir_summary, sizeof c->dir_summary, "%s/summary.json", c->out);
    const mg_cli_file outs[] = {{"--out (agent.safetensors)", c->dir_agent, MG_CLI_WHOLE},
                                {"--out (scored.csv)", c->dir_scored, MG_CLI_WHOLE},
                                {"--out (best.smi)", c->dir_best, MG_CLI_WHOLE},
                                {"--out (summary.json)", c->dir_summary, MG_CLI_WHOLE}};
    const mg_cli_file ins[] = {{"--prior", c->prior, 0}};
    return mg_cli_claim_outputs("optimize", outs, 4, ins, 1) < 0;
}

/* the models, the scorer and the engine; 0 or 1 (said) */
static int setup(run_ctx *c, const mg_opt_opts *o, mg_model *mm[2], mg_vocab **v, mg_scorer **sc,
                 mg_opt **opt) {
    mg_error err;
    if (mg_cli_load_model("optimize", c->prior, 0, &mm[0], v, NULL) ||
        mg_cli_load_model("optimize", c->prior, 0, &mm[1], NULL, NULL))
        return 1;
    mg_model_set_threads(mm[0], c->threads);
    mg_model_set_threads(mm[1], c->threads);
    if (mg_scorer_start(c->scorer, c->timeout, sc, &err) ||
        mg_opt_new(mm[0], mm[1], *v, *sc, o, opt, &err) ||
        (c->resume && mg_opt_restore(*opt, c->dir_agent, &err))) {
        fprintf(stderr, "molgen optimize: %s\n", err.message);
        return 1;
    }
    return 0;
}

int cmd_optimize(int argc, char **argv) {
    mg_opt_opts o;
    mg_opt_opts_default(&o);
    run_ctx c = {.timeout = 300};
    mg_error err;
    int rc = parse(argc, argv, &o, &c, 1);
    if (rc) return rc < 0 ? 0 : rc;
    char saved_agent[4200];
    snprintf(saved_agent, sizeof saved_agent, "%s/agent.safetensors", c.resume ? c.resume : "");
    if (c.resume && mg_opt_read_options(saved_agent, &o, &err)) {
        fprintf(stderr, "molgen optimize: --resume %s: %s\n", c.resume, err.message);
        return 1;
    }
    if ((rc = parse(argc, argv, &o, &c, 0))) return rc < 0 ? 0 : rc;
    if (c.resume && c.out && strcmp(c.out, c.resume))
        return fprintf(stderr, "molgen optimize: --resume writes to its own DIR: no --out\n"), 2;
    if (c.resume) c.out = c.resume;
    if (!c.prior || !c.scorer || !c.out)
        return fprintf(stderr, "molgen optimize: --prior, --scorer and --out (or --resume) are "
                               "required (see molgen optimize --help)\n"), 2;
    if (mg_opt_opts_check(&o, &err))
        return fprintf(stderr, "molgen optimize: %s\n", err.message), 2;
    if (claim(&c)) return 1;
    mg_catch_stop_signals();
    mg_model *mm[2] = {NULL, NULL};
    mg_vocab *v = NULL;
    mg_scorer *sc = NULL;
    mg_opt *opt = NULL;
    o.progress = progress;
    o.save = save;
    o.ctx = &c;
    o.stop = &mg_stop_signal;
    c.t0 = mg_now_s();
    rc = setup(&c, &o, mm, &v, &sc, &opt);
    int saved = 0;
    if (!rc && mg_opt_run(opt, &saved, &err)) {
        fprintf(stderr, "molgen optimize: %s\n", err.message);
        if (saved)
            fprintf(stderr, "molgen optimize: the state of step %lld's start is saved in %s: "
                            "continue with --resume %s\n",
                    (long long)mg_opt_steps(opt) + 1, c.dir_agent, c.out);
        rc = mg_stop_signal ? 128 + mg_stop_signal : 1;
    } else if (!rc) {
        fprintf(stderr, "molgen optimize: %lld calls in %lld steps, %.1f s (stop: %s)\n",
                (long long)mg_opt_calls(opt), (long long)mg_opt_steps(opt), mg_now_s() - c.t0,
                mg_opt_stop_reason(opt));
        printf("%s\n", c.out);
    }
    mg_opt_free(opt);
    mg_scorer_free(sc);
    mg_model_free(mm[0]);
    mg_model_free(mm[1]);
    mg_vocab_free(v);
    return rc;
}

/* `molgen debug-dap` (hidden, for tests): mg_dap_dump (dap_dump.h). */
int cmd_debug_dap(int argc, char **argv) {
    mg_model_config mc = {.n_layer = 2, .d_model = 16, .n_head = 2, .ctx_len = 8, .vocab_size = 10};
    int B = 4, threads = 1;
    uint64_t seed = 1;
    double perturb = 0.6, sigma = 128, sc[64];
    const char *out = NULL, *scores = "0.1,0.9,0,0.5";
    const opt_row rows[] = {
        {"out", 's', &out, 0, 0},           {"scores", 's', &scores, 0, 0},
        {"layers", 'i', &mc.n_layer, 1, 16}, {"d-model", 'i', &mc.d_model, 1, 1024},
        {"heads", 'i', &mc.n_head, 1, 64},  {"ctx-len", 'i', &mc.ctx_len, 2, 512},
        {"vocab", 'i', &mc.vocab_size, 4, 1000}, {"batch", 'i', &B, 1, 1000},
        {"seed", 'u', &seed, 0, 0},         {"perturb", 'd', &perturb, 0, 10},
        {"sigma", 'd', &sigma, 0, 1e6},     {"threads", 'i', &threads, 1, 1024},
    };
    enum { NROWS = sizeof rows / sizeof rows[0] };
    struct option lo[NROWS + 2];
    for (int i = 0; i < NROWS; i++) lo[i] = (struct option){rows[i].name, required_argument, NULL, i + 1};
    lo[NROWS] = (struct option){"help", no_argument, NULL, 'h'};
    lo[NROWS + 1] = (struct option){NULL, 0, NULL, 0};
    const char *v;
    int k;
    mg_cli_begin();
    while ((k = mg_cli_next("debug-dap", argc, argv, "h", lo, &v)) != -1) {
        if (k == -2) return 2;
        if (k == 'h') {
            puts("usage: molgen debug-dap --out FILE [--scores X,Y,..] [--sigma S] [--batch B]\n"
                 "  [--layers N --d-model N --heads N --ctx-len N --vocab N --seed S --perturb P]\n"
                 "(testing tool: dap_dump.h)");
            return 0;
        }
        if (!parse_value(&rows[k - 1], v)) return bad_value("debug-dap", rows[k - 1].name, v);
    }
    int n = 0;
    for (const char *p = scores; *p && n < 64; n++) {
        char *end;
        sc[n] = strtod(p, &end);
        if (end == p || (*end && *end != ','))
            return fprintf(stderr, "molgen debug-dap: bad --scores '%s'\n", scores), 2;
        p = *end ? end + 1 : end;
    }
    if (!out) return fprintf(stderr, "molgen debug-dap: --out FILE is required\n"), 2;
    mg_error err;
    double loss;
    if (mg_model_config_check(&mc, &err) ||
        mg_dap_dump(&mc, B, seed, perturb, sigma, sc, n, threads, out, &loss, &err)) {
        fprintf(stderr, "molgen debug-dap: %s\n", err.message);
        return 1;
    }
    printf("%s loss %.17g\n", out, loss);
    return 0;
}
