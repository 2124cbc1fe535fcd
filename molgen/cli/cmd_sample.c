/* `molgen sample`: options -> mg_sample (sample.h) -> one SMILES per line. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli_options.h"
#include "cli_util.h"
#include "commands.h"
#include "chem/condition.h"
#include "base/dist.h"
#include "base/json.h"
#include "base/safetensors.h"
#include "gen/sample.h"
#include "chem/smiles_check.h"
#include "base/util.h"

/* The options as given; mg_sample_opts takes them after the checks. */
typedef struct {
    const char *model, *out, *condition, *scaffold;
    int64_t n;
    uint64_t seed;
    float temperature, top_p, guidance;
    int top_k, batch, threads;
    int decode;    /* the word's index: 0 kv, 1 naive */
    int dtype;     /* mg_dtype: fp32, bf16 */
    int constrain; /* mg_constrain: none, syntax, valence */
    int method;    /* mg_constrain_method: mask, reject */
    int raw;       /* --raw-weights */
} sample_args;

#define T sample_args
static const mg_setting SAMPLE_OPTIONS[] = {
    {MG_CLI_OPT_MODEL(T)},
    {MG_OPT_I64(T, "n", "N", n, 1, 100000000, "molecules to generate"), .short_name = 'n',
     .alias = "num"},
    {MG_OPT_U64(T, "seed", "S", seed, "random seed; same seed + threads = same output")},
    {MG_OPT_STR(T, "out", "FILE", out, "output .smi; parent dirs created")},
    {MG_OPT_F32(T, "temperature", "T", temperature, 0, 1e6, MG_CLOSED,
                "softmax temperature; 0 = greedy")},
    {MG_OPT_INT(T, "top-k", "K", top_k, 0, 1 << 30, "keep the K most likely tokens, 0 = all")},
    {MG_OPT_F32(T, "top-p", "P", top_p, 0, 1, MG_OPEN_LO,
                "nucleus: the smallest set of tokens with mass >= P")},
    {MG_OPT_INT(T, "batch", "B", batch, 1, 1 << 20, "molecules decoded together")},
    {MG_CLI_OPT_THREADS(T)},
    {MG_OPT_CHOICE(T, "decode", "kv|naive", decode,
                   "KV-cache incremental decoding, or re-running the whole prefix every step "
                   "(MolGPT's way; slower)")},
    {MG_OPT_CHOICE(T, "dtype", "fp32|bf16", dtype,
                   "KV decoding's products and cache: fp32, or bf16 operands with fp32 "
                   "accumulation (weights converted once per load; faster on AVX512_BF16)")},
    {MG_OPT_CHOICE(T, "constrain", "none|syntax|valence", constrain,
                   "none: the model's distribution as it is; syntax: mask tokens after which the "
                   "string cannot pass molgen's SMILES check (brackets, bonds, branches, ring "
                   "closures, EOS, unbracketed valences); valence: also the valences of bracket "
                   "and aromatic atoms (how: --constrain-method)")},
    {MG_OPT_CHOICE(T, "constrain-method", "mask|reject", method,
                   "with --constrain syntax|valence: reject draws every token from the model as "
                   "it is and starts a molecule again from its first token when a draw fails the "
                   "check (exactly the model's distribution over the strings the check accepts; "
                   "after 1000 restarts that molecule is masked); mask sets the refused tokens' "
                   "probabilities to 0 and renormalises at every step (no restarts, but a "
                   "molecule that derails is kept: longer, heavier molecules than the model's)")},
    {MG_OPT_STR(T, "condition", "NAME=VALUE,...", condition,
                "a conditional model's requested property values (any subset of the conditions "
                "it was trained on, in their units, within their training range; the others are "
                "drawn as in the data)")},
    {MG_OPT_F32(T, "guidance", "W", guidance, 0, 100, MG_CLOSED,
                "with --condition: classifier-free guidance, the logits u + W (c - u) of the "
                "conditional c and the unconditional u (0 or 1: plain conditional sampling; > 1 "
                "decodes every molecule twice)")},
    {MG_OPT_STR(T, "scaffold", "SMILES", scaffold,
                "a scaffold model's (train --scaffold-column) prefix: the molecules are "
                "generated on this Murcko scaffold, written as molgen/props.py writes it "
                "(RDKit's canonical SMILES)")},
    {MG_CLI_OPT_RAW_WEIGHTS(T)},
};
#undef T

static const char SAMPLE_USAGE[] =
    "usage: molgen sample --model FILE [options]\n"
    "Generate SMILES from a trained model; writes one molecule per line.\n";
static const char SAMPLE_NOTES[] =
    "Writes FILE.json beside the output: the model and its weights (averaged or\n"
    "raw), seed, sampling settings and constrain mode, condition and scaffold\n"
    "(molgen/metrics.py reports it).\n"
    "Under mpirun -np N the molecules are split over the ranks by index; rank 0\n"
    "writes them in order: the file is the one a single process writes; the ranks\n"
    "must agree on the model and every option but --batch, --threads and --out\n"
    "(else one error names what differs). SIGINT/SIGTERM: nothing is written, the\n"
    "exit status is 128 + the signal.\n"
    "Prints the output path on stdout; molecules/s and the syntax-valid fraction\n"
    "(molgen's SMILES grammar check, not RDKit) on stderr. An empty line is a\n"
    "molecule that ended at once; a molecule without EOS by ctx_len is kept.\n";

/* Everything one run holds, freed once (job_free). */
typedef struct {
    sample_args a;
    mg_sample_opts o;
    char *meta_path; /* FILE.json, NULL: none (a FIFO, a device or stdout as --out) */
    int out_kind, averaged;
    mg_model *m;
    mg_vocab *v;
    float cv[MG_COND_MAX];
    int32_t scaffold[1024];
    mg_samples s;
} sample_job;

static void job_free(sample_job *j) {
    free(j->meta_path);
    mg_model_free(j->m);
    mg_vocab_free(j->v);
    mg_samples_free(&j->s);
}

/* The options into j (defaults first: --help shows them); 0, -1 (--help
 * printed) or 2 (a usage error, said). */
static int parse_args(sample_job *j, int argc, char **argv) {
    mg_sample_opts_default(&j->o);
    sample_args *a = &j->a;
    *a = (sample_args){.out = "out/samples.smi", .n = (int64_t)j->o.n, .seed = j->o.seed,
                       .temperature = j->o.sampling.temperature, .top_p = j->o.sampling.top_p,
                       .top_k = j->o.sampling.top_k, .batch = j->o.batch,
                       .decode = j->o.kind == MG_DECODE_KV ? 0 : 1,
                       .constrain = (int)j->o.constrain, .method = (int)j->o.method,
                       .guidance = j->o.guidance};
    const mg_cli_spec spec = {"sample", SAMPLE_USAGE, SAMPLE_NOTES,
                              {{SAMPLE_OPTIONS, sizeof SAMPLE_OPTIONS / sizeof *SAMPLE_OPTIONS, a}},
                              1};
    const int rc = mg_cli_parse(&spec, argc, argv, NULL);
    if (rc) return rc;
    if (!a->model) return mg_cli_usage("sample", "--model FILE is required");
    if (a->dtype != MG_DT_F32 && a->decode != 0)
        return mg_cli_usage("sample", "--dtype bf16 needs --decode kv");
    if (a->guidance != 0.0f && !a->condition) {
        fprintf(stderr, "molgen sample: --guidance needs --condition\n");
        return 2;
    }
    char why[256], cut[96];
    if (a->scaffold && *a->scaffold && !mg_smiles_syntax_ok(a->scaffold, why, sizeof why)) {
        fprintf(stderr, "molgen sample: --scaffold '%s' is not a complete SMILES: %s\n",
                mg_cli_cut(a->scaffold, cut, sizeof cut), why);
        return 2;
    }
    j->o.n = (size_t)a->n;
    j->o.seed = a->seed;
    j->o.sampling = (mg_sampling){a->temperature, a->top_k, a->top_p};
    j->o.batch = a->batch;
    j->o.kind = a->decode == 0 ? MG_DECODE_KV : MG_DECODE_NAIVE;
    j->o.constrain = (mg_constrain)a->constrain;
    j->o.method = (mg_constrain_method)a->method;
    j->o.dtype = (mg_dtype)a->dtype;
    mg_cli_note_dtype("sample", a->dtype);
    j->o.guidance = a->guidance;
    return 0;
}

static int write_text(FILE *f, void *text) {
    return fprintf(f, "%s\n", (const char *)text) < 0;
}

/* FILE.json beside the samples: what made them, for molgen/metrics.py. */
static mg_status write_meta(const sample_job *j, mg_error *err) {
    const sample_args *a = &j->a;
    const mg_sample_opts *o = &j->o;
    json_t *js = json_object();
    char seed[24];
    snprintf(seed, sizeof seed, "%llu", (unsigned long long)o->seed);
    int bad = !js;
    bad = bad || mg_json_put(js, "model", json_string(a->model));
    bad = bad || mg_json_put(js, "weights", json_string(j->averaged ? "averaged" : "raw"));
    bad = bad || mg_json_put(js, "n", json_integer((json_int_t)j->s.n));
    bad = bad || mg_json_put(js, "seed", json_string(seed));
    bad = bad || mg_json_put(js, "temperature", json_real(o->sampling.temperature));
    bad = bad || mg_json_put(js, "top_k", json_integer(o->sampling.top_k));
    bad = bad || mg_json_put(js, "top_p", json_real(o->sampling.top_p));
    bad = bad || mg_json_put(js, "constrain", json_string(mg_constrain_name(o->constrain)));
    bad = bad || mg_json_put(js, "decode", json_string(mg_decode_kind_name(o->kind)));
    bad = bad || mg_json_put(js, "dtype", json_string(mg_dtype_name(o->dtype)));
    bad = bad ||
          mg_json_put(js, "condition", a->condition ? json_string(a->condition) : json_null());
    bad = bad || mg_json_put(js, "guidance", json_real(o->guidance));
    bad = bad || mg_json_put(js, "scaffold", a->scaffold ? json_string(a->scaffold) : json_null());
    bad = bad || mg_json_put(js, "threads",
                             json_integer(a->threads > 0 ? a->threads : mg_default_threads()));
    bad = bad || mg_json_put(js, "no_eos", json_integer((json_int_t)j->s.truncated));
    if (o->constrain != MG_CONSTRAIN_NONE)
        bad = bad || mg_json_put(js, "constrain_method",
                                 json_string(mg_constrain_method_name(o->method)));
    if (o->constrain != MG_CONSTRAIN_NONE && o->method == MG_CONSTRAIN_REJECT) {
        /* molecules begun again (rejected draws), and those masked after
         * MG_SAMPLE_REJECTS of them */
        bad = bad || mg_json_put(js, "reject_restarts", json_integer((json_int_t)j->s.restarts_total));
        bad = bad || mg_json_put(js, "reject_fallbacks", json_integer((json_int_t)j->s.masked));
    }
    if (o->constrain == MG_CONSTRAIN_VALENCE &&
        (o->method == MG_CONSTRAIN_MASK || j->s.masked)) {
        if (o->method == MG_CONSTRAIN_MASK)
            bad = bad || mg_json_put(js, "kekule_restarts",
                                     json_integer((json_int_t)j->s.restarts_total));
        bad = bad || mg_json_put(js, "kekule_fallbacks", json_integer((json_int_t)j->s.fallbacks));
    }
    char *text = bad ? NULL : mg_json_dump(js, 9);
    json_decref(js);
    if (!text)
        return mg_fail(err, MG_ERR_NOMEM, "%s: cannot serialise (model path not UTF-8?)",
                       j->meta_path);
    const mg_status rc = mg_cli_write_output(j->meta_path, write_text, text, err);
    free(text);
    return rc;
}

/* --condition: the request checked against the model's conditions
 * (condition.h) into v [n_cond]; says what is conditioned (unless quiet:
 * under mpirun every rank fails alike, and rank 0 alone speaks). */
static int parse_conditions(const mg_model *m, const char *model_path, const char *text, float *v,
                            int quiet) {
    const char *meta = mg_model_condition_meta(m);
    if (!meta) {
        if (!quiet)
            fprintf(stderr, "molgen sample: --condition: %s is an unconditional model\n",
                    model_path);
        return 1;
    }
    mg_cond_info ci;
    mg_error err;
    char warn[2048];
    if (mg_cond_info_from_json(meta, &ci, &err) ||
        mg_cond_request(&ci, text, v, warn, sizeof warn, &err)) {
        if (!quiet) fprintf(stderr, "molgen sample: --condition: %s\n", err.message);
        mg_cond_info_free(&ci);
        return 1;
    }
    if (warn[0] && !quiet) fprintf(stderr, "molgen sample: %s\n", warn);
    char rest[1024] = "";
    for (int k = 0; k < ci.K; k++)
        if (isnan(v[k]))
            snprintf(rest + strlen(rest), sizeof rest - strlen(rest), "%s%s", rest[0] ? ", " : "",
                     ci.names[k]);
    if (!quiet)
        fprintf(stderr, "conditioned on %s; drawn as in the data: %s\n", text,
                rest[0] ? rest : "(none)");
    mg_cond_info_free(&ci);
    return 0;
}

/* --scaffold: S encoded with the model's vocabulary into ids [cap], *n
 * tokens; refused for a model without scaffolds, a token outside the
 * vocabulary or a scaffold with no room left; a warning when it is longer
 * than any the model was trained on. */
static int parse_scaffold(const mg_model *m, const mg_vocab *v, const char *model_path,
                          const char *text, int32_t *ids, int cap, int *n, int quiet) {
    const mg_model_config *c = mg_model_get_config(m);
    mg_error err;
    if (!c->scaffold) {
        if (!quiet)
            fprintf(stderr,
                    "molgen sample: --scaffold: %s was not trained with scaffolds (molgen train "
                    "--scaffold-column)\n",
                    model_path);
        return 1;
    }
    const mg_status st = mg_vocab_encode(v, text, ids, cap, n, &err);
    if (st || *n == 0 || *n + 2 >= c->ctx_len) {
        if (!quiet) {
            if (!st && *n == 0)
                fprintf(stderr, "molgen sample: --scaffold: an empty scaffold\n");
            else if (st == MG_ERR_TOO_LONG || (!st && *n + 2 >= c->ctx_len))
                fprintf(stderr,
                        "molgen sample: --scaffold '%s': %d tokens leave no room in the model's "
                        "%d positions (it was trained on scaffolds of up to %d)\n",
                        text, *n, c->ctx_len, c->scaffold);
            else
                fprintf(stderr, "molgen sample: --scaffold '%s': %s (the model's vocabulary)\n",
                        text, err.message);
        }
        return 1;
    }
    if (*n > c->scaffold && !quiet)
        fprintf(stderr,
                "molgen sample: warning: --scaffold has %d tokens, more than any the model was "
                "trained on (%d)\n",
                *n, c->scaffold);
    if (!quiet) fprintf(stderr, "scaffold %s (%d tokens)\n", text, *n);
    return 0;
}
/* The options that decide which molecules come out, for the ranks to agree
 * on (--batch and --threads change none; --out is rank 0's) into f; their
 * count. */
static size_t sample_fields(const sample_job *j, mg_dist_field *f) {
    const mg_sample_opts *o = &j->o;
    size_t k = 0;
    f[k++] = (mg_dist_field){"-n", o->n};
    f[k++] = (mg_dist_field){"--seed", o->seed};
    f[k++] = (mg_dist_field){"--temperature", mg_dist_hash(&o->sampling.temperature, sizeof(float))};
    f[k++] = (mg_dist_field){"--top-k", (uint64_t)o->sampling.top_k};
    f[k++] = (mg_dist_field){"--top-p", mg_dist_hash(&o->sampling.top_p, sizeof(float))};
    f[k++] = (mg_dist_field){"--decode", o->kind};
    f[k++] = (mg_dist_field){"--dtype", o->dtype};
    f[k++] = (mg_dist_field){"--constrain", o->constrain};
    f[k++] = (mg_dist_field){"--constrain-method", o->method};
    f[k++] = (mg_dist_field){"--condition", mg_dist_hash_str(j->a.condition)};
    f[k++] = (mg_dist_field){"--guidance", mg_dist_hash(&o->guidance, sizeof(float))};
    f[k++] = (mg_dist_field){"--scaffold", mg_dist_hash_str(j->a.scaffold)};
    f[k++] = (mg_dist_field){"--raw-weights", j->a.raw ? MG_LOAD_RAW : 0};
    return k;
}

/* Everything before the sampling: the ranks agree on the options, the
 * output is checked (never the model) and claimed, the model loaded (and
 * agreed on), --condition and --scaffold read against it. 0, 1 or 2. */
static int prepare(sample_job *j) {
    mg_dist *world = mg_dist_world();
    mg_dist_field fields[16];
    mg_error err;
    if (mg_dist_agree_fields(world, fields, sample_fields(j, fields), &err)) {
        mg_cli_report("sample", err.status, &err);
        return 1;
    }
    /* a FIFO, a device or stdout as --out is written through, with no
     * sidecar beside it (none to write: /dev/stdout.json) */
    j->out_kind = mg_cli_output_kind(j->a.out);
    if (j->out_kind == MG_CLI_OUT_FILE) {
        const size_t n = strlen(j->a.out) + sizeof ".json";
        if (!(j->meta_path = malloc(n))) {
            fprintf(stderr, "molgen sample: out of memory\n");
            return 1;
        }
        snprintf(j->meta_path, n, "%s.json", j->a.out);
    }
    const mg_cli_file outs[] = {{"--out", j->a.out, 0},
                                {"--out (its sidecar)", j->meta_path, MG_CLI_BESIDE}};
    const mg_cli_file ins[] = {{"--model", j->a.model, 0}};
    if (mg_cli_claim_outputs("sample", outs, 2, ins, 1) < 0) return 1;
    if (mg_cli_load_model("sample", j->a.model, j->a.raw ? MG_LOAD_RAW : 0, &j->m, &j->v,
                          &j->averaged))
        return 1;
    const mg_dist_field model_field = {"the --model file (its weights)",
                                       world->size > 1 ? mg_model_fingerprint(j->m, j->v) : 0};
    if (mg_dist_agree_fields(world, &model_field, 1, &err)) {
        mg_cli_report("sample", err.status, &err);
        return 1;
    }
    mg_model_set_threads(j->m, j->a.threads);
    j->o.dist = world;
    j->o.stop = &mg_stop_signal;
    const int quiet = world->rank != 0;
    if (j->a.condition && parse_conditions(j->m, j->a.model, j->a.condition, j->cv, quiet))
        return 2;
    j->o.condition = j->a.condition ? j->cv : NULL;
    if (j->a.scaffold && parse_scaffold(j->m, j->v, j->a.model, j->a.scaffold, j->scaffold, 1024,
                                        &j->o.scaffold_len, quiet))
        return 2;
    j->o.scaffold = j->a.scaffold ? j->scaffold : NULL;
    return 0;
}

/* The molecules, one per line, counted as they are written. */
typedef struct {
    const mg_samples *s;
    size_t valid, empty;
} smiles_out;

static int write_smiles(FILE *f, void *user) {
    smiles_out *w = user;
    for (size_t i = 0; i < w->s->n; i++) {
        const char *smi = w->s->smiles[i];
        fprintf(f, "%s\n", smi);
        if (!smi[0])
            w->empty++;
        else if (mg_smiles_syntax_ok(smi, NULL, 0))
            w->valid++;
    }
    return mg_stop_signal != 0; /* a signal while writing: the temporary goes, the output stays */
}

static void print_summary(const sample_job *j, const smiles_out *w) {
    const mg_samples *s = &j->s;
    const double secs = s->seconds > 0 ? s->seconds : 1e-9;
    const int threads = j->a.threads > 0 ? j->a.threads : mg_default_threads();
    fprintf(stderr,
            "sampled %zu molecules in %.2f s: %.1f molecules/s, %.0f tokens/s (%s decoding, "
            "batch %d, %d threads%s)\n",
            s->n, s->seconds, (double)s->n / secs, (double)s->tokens / secs,
            mg_decode_kind_name(j->o.kind), j->o.batch, threads,
            mg_dist_world()->size > 1 ? " on each of the MPI ranks" : "");
    fprintf(stderr,
            "syntax-valid %.4f (%zu/%zu; grammar check, not RDKit); empty %zu; no EOS %zu; "
            "constrain %s%s%s\n",
            s->n ? (double)w->valid / (double)s->n : 0.0, w->valid, s->n, w->empty, s->truncated,
            mg_constrain_name(j->o.constrain), j->o.constrain ? ", method " : "",
            j->o.constrain ? mg_constrain_method_name(j->o.method) : "");
    if (j->o.constrain != MG_CONSTRAIN_NONE && j->o.method == MG_CONSTRAIN_REJECT)
        fprintf(stderr,
                "rejection: %zu restarts (%.2f per molecule), %zu molecules masked after %d "
                "restarts\n",
                s->restarts_total, s->n ? (double)s->restarts_total / (double)s->n : 0.0,
                s->masked, MG_SAMPLE_REJECTS);
    else if (j->o.constrain == MG_CONSTRAIN_VALENCE)
        fprintf(stderr,
                "kekule dead ends: %zu restarts (molecules begun again), %zu molecules went on "
                "without the check after %d restarts\n",
                s->restarts_total, s->fallbacks, MG_SAMPLE_RESTARTS);
    if (!j->meta_path)
        fprintf(stderr,
                "molgen sample: --out %s is written through (a FIFO, a device or the standard "
                "output): no sidecar %s.json written\n",
                j->a.out, j->a.out);
    if (j->out_kind != MG_CLI_OUT_STDOUT) printf("%s\n", j->a.out);
}

/* Sample, then (rank 0) write the molecules and their sidecar. */
static int run(sample_job *j) {
    mg_error err;
    const mg_status rc = mg_sample(j->m, j->v, &j->o, &j->s, &err);
    if (rc) {
        mg_cli_report("sample", rc, &err);
        return mg_stop_signal ? 128 + mg_stop_signal : 1;
    }
    if (mg_dist_world()->rank) /* rank 0 writes them all */
        return mg_stop_signal ? 128 + mg_stop_signal : 0;
    smiles_out w = {&j->s, 0, 0};
    if (mg_cli_write_output(j->a.out, write_smiles, &w, &err) ||
        (j->meta_path && write_meta(j, &err))) {
        if (mg_stop_signal) {
            fprintf(stderr, "molgen sample: interrupted by signal %d\n", (int)mg_stop_signal);
            return 128 + mg_stop_signal;
        }
        fprintf(stderr, "molgen sample: %s\n", err.message);
        return 1;
    }
    print_summary(j, &w);
    return 0;
}

int cmd_sample(int argc, char **argv) {
    sample_job j;
    memset(&j, 0, sizeof j);
    int rc = parse_args(&j, argc, argv);
    if (!rc) {
        mg_catch_stop_signals(); /* SIGINT / SIGTERM: nothing written, 128 + the signal */
        rc = prepare(&j);
    }
    if (!rc) rc = run(&j);
    job_free(&j);
    return rc < 0 ? 0 : rc;
}
