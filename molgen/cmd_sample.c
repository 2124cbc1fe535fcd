/* `molgen sample`: options -> mg_sample (sample.h) -> one SMILES per line. */
#define _POSIX_C_SOURCE 200809L
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli_util.h"
#include "json.h"
#include "commands.h"
#include "condition.h"
#include "dist.h"
#include "safetensors.h"
#include "sample.h"
#include "smiles_check.h"
#include "train_settings.h" /* MG_MAX_THREADS */
#include "util.h"

static const char *SAMPLE_USAGE =
    "usage: molgen sample --model FILE [-n N] [--seed S] [--out FILE]\n"
    "                     [--temperature T] [--top-k K] [--top-p P]\n"
    "                     [--batch B] [--threads N] [--decode kv|naive]\n"
    "                     [--constrain none|syntax|valence]\n"
    "                     [--condition NAME=VALUE,...] [--guidance W]\n"
    "                     [--scaffold SMILES] [--raw-weights]\n"
    "Generate SMILES from a trained model; writes one molecule per line.\n"
    "  --model FILE       model or checkpoint (.safetensors) with its vocabulary\n"
    "  -n N               molecules to generate (default 1000)\n"
    "  --seed S           random seed (default 0); same seed + threads = same output\n"
    "  --out FILE         output .smi (default out/samples.smi); parent dirs created\n"
    "  --temperature T    softmax temperature, >= 0; 0 = greedy (default 1)\n"
    "  --top-k K          keep the K most likely tokens, 0 = all (default 0)\n"
    "  --top-p P          nucleus: smallest set with mass >= P, (0, 1] (default 1)\n"
    "  --batch B          molecules decoded together (default 64)\n"
    "  --threads N        threads (default: ATTN_NUM_THREADS or all cores)\n"
    "  --decode kv|naive  KV-cache incremental decoding (default) or re-running the\n"
    "                     whole prefix every step (MolGPT's way; slower)\n"
    "  --constrain MODE   none (default): the model's distribution as it is;\n"
    "                     syntax: mask tokens after which the string cannot pass\n"
    "                     molgen's SMILES check (brackets, bonds, branches, ring\n"
    "                     closures, EOS, unbracketed valences); valence: also the\n"
    "                     valences of bracket and aromatic atoms. The model's\n"
    "                     probabilities are renormalised over the allowed tokens\n"
    "  --condition NAME=VALUE,...  a conditional model's requested property values\n"
    "                     (any subset of the conditions it was trained on, in their\n"
    "                     units, within their training range; the others are drawn\n"
    "                     as in the data)\n"
    "  --guidance W       with --condition: classifier-free guidance, the logits\n"
    "                     u + W (c - u) of the conditional c and the unconditional u\n"
    "                     (0 or 1: plain conditional sampling, the default; > 1\n"
    "                     decodes every molecule twice)\n"
    "  --scaffold SMILES  a scaffold model's (train --scaffold-column) prefix: the\n"
    "                     molecules are generated on this Murcko scaffold, written as\n"
    "                     molgen/props.py writes it (RDKit's canonical SMILES)\n"
    "  --raw-weights      a checkpoint of train --ema: its last step's parameters,\n"
    "                     not the averaged ones (the default)\n"
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

/* FILE.json beside the samples: what made them, for molgen/metrics.py. */
static mg_status write_meta(const char *path, const char *model_path, const char *weights,
                            const mg_sample_opts *o, const char *cond, const char *scaffold,
                            int threads, const mg_samples *s, mg_error *err) {
    json_t *j = json_object();
    char seed[24];
    snprintf(seed, sizeof seed, "%llu", (unsigned long long)o->seed);
    int bad = !j;
    bad = bad || mg_json_put(j, "model", json_string(model_path));
    bad = bad || mg_json_put(j, "weights", json_string(weights));
    bad = bad || mg_json_put(j, "n", json_integer((json_int_t)s->n));
    bad = bad || mg_json_put(j, "seed", json_string(seed));
    bad = bad || mg_json_put(j, "temperature", json_real(o->sampling.temperature));
    bad = bad || mg_json_put(j, "top_k", json_integer(o->sampling.top_k));
    bad = bad || mg_json_put(j, "top_p", json_real(o->sampling.top_p));
    bad = bad || mg_json_put(j, "constrain", json_string(mg_constrain_name(o->constrain)));
    bad = bad || mg_json_put(j, "decode", json_string(mg_decode_kind_name(o->kind)));
    bad = bad || mg_json_put(j, "condition", cond ? json_string(cond) : json_null());
    bad = bad || mg_json_put(j, "guidance", json_real(o->guidance));
    bad = bad || mg_json_put(j, "scaffold", scaffold ? json_string(scaffold) : json_null());
    bad = bad ||
          mg_json_put(j, "threads", json_integer(threads > 0 ? threads : mg_default_threads()));
    bad = bad || mg_json_put(j, "no_eos", json_integer((json_int_t)s->truncated));
    char *text = bad ? NULL : mg_json_dump(j, 9);
    json_decref(j);
    if (!text)
        return mg_fail(err, MG_ERR_NOMEM, "%s: cannot serialise (model path not UTF-8?)", path);
    char tmp[4300];
    FILE *f = mg_cli_atomic_open(path, tmp, sizeof tmp, err);
    if (!f) {
        free(text);
        return err ? err->status : MG_ERR_IO;
    }
    int wrc = fprintf(f, "%s\n", text) < 0;
    free(text);
    return mg_cli_atomic_commit_if(f, wrc, tmp, path, err);
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

/* A real option kept in a float: 0 or a normal float. A value below
 * FLT_MIN would be kept as a subnormal or 0, another value than the one
 * given: refused with a message (usage error). */
static int as_float(const char *opt, const char *text, double v, float *out) {
    if (v != 0 && fabs(v) < FLT_MIN) {
        fprintf(stderr,
                "molgen sample: %s %s is too small to keep (it would be stored as %g): give 0 "
                "or at least %g\n",
                opt, text, (double)(float)v, (double)FLT_MIN);
        return 0;
    }
    *out = (float)v;
    return 1;
}

/* The options that decide which molecules come out, for the ranks to agree
 * on (--batch and --threads change none; --out is rank 0's) into f; their
 * count. */
static size_t sample_fields(const mg_sample_opts *o, const char *cond, const char *scaffold,
                            unsigned load_flags, mg_dist_field *f) {
    size_t k = 0;
    f[k++] = (mg_dist_field){"-n", o->n};
    f[k++] = (mg_dist_field){"--seed", o->seed};
    f[k++] = (mg_dist_field){"--temperature", mg_dist_hash(&o->sampling.temperature, sizeof(float))};
    f[k++] = (mg_dist_field){"--top-k", (uint64_t)o->sampling.top_k};
    f[k++] = (mg_dist_field){"--top-p", mg_dist_hash(&o->sampling.top_p, sizeof(float))};
    f[k++] = (mg_dist_field){"--decode", o->kind};
    f[k++] = (mg_dist_field){"--constrain", o->constrain};
    f[k++] = (mg_dist_field){"--condition", mg_dist_hash_str(cond)};
    f[k++] = (mg_dist_field){"--guidance", mg_dist_hash(&o->guidance, sizeof(float))};
    f[k++] = (mg_dist_field){"--scaffold", mg_dist_hash_str(scaffold)};
    f[k++] = (mg_dist_field){"--raw-weights", load_flags};
    return k;
}

int cmd_sample(int argc, char **argv) {
    const char *model_path = NULL, *out_path = "out/samples.smi", *cond_text = NULL;
    const char *scaffold_text = NULL;
    mg_sample_opts o;
    mg_sample_opts_default(&o);
    int threads = 0, averaged = 0;
    unsigned load_flags = 0;
    mg_error err;
    enum { O_MODEL = 1, O_OUT, O_N, O_SEED, O_TEMP, O_TOPK, O_TOPP, O_BATCH, O_THREADS, O_DECODE,
           O_CONSTRAIN, O_COND, O_GUIDE, O_SCAFFOLD, O_RAW };
    static const struct option opts[] = {{"model", required_argument, NULL, O_MODEL},
                                         {"out", required_argument, NULL, O_OUT},
                                         {"n", required_argument, NULL, O_N},
                                         {"num", required_argument, NULL, O_N},
                                         {"seed", required_argument, NULL, O_SEED},
                                         {"temperature", required_argument, NULL, O_TEMP},
                                         {"top-k", required_argument, NULL, O_TOPK},
                                         {"top-p", required_argument, NULL, O_TOPP},
                                         {"batch", required_argument, NULL, O_BATCH},
                                         {"threads", required_argument, NULL, O_THREADS},
                                         {"decode", required_argument, NULL, O_DECODE},
                                         {"constrain", required_argument, NULL, O_CONSTRAIN},
                                         {"condition", required_argument, NULL, O_COND},
                                         {"guidance", required_argument, NULL, O_GUIDE},
                                         {"scaffold", required_argument, NULL, O_SCAFFOLD},
                                         {"raw-weights", no_argument, NULL, O_RAW},
                                         {"help", no_argument, NULL, 'h'},
                                         {NULL, 0, NULL, 0}};
    const char *val;
    int c;
    mg_cli_begin();
    while ((c = mg_cli_next("sample", argc, argv, "hn:", opts, &val)) != -1) {
        int ok = 1;
        long long ll = 0;
        double dv = 0;
        uint64_t u = 0;
        switch (c) {
        case -2: return 2;
        case 'h': fputs(SAMPLE_USAGE, stdout); return 0;
        case O_MODEL: model_path = val; break;
        case O_OUT: out_path = val; break;
        case 'n':
        case O_N:
            ok = mg_cli_int(val, 1, 100000000, &ll);
            o.n = (size_t)ll;
            break;
        case O_SEED:
            ok = mg_cli_u64(val, &u);
            o.seed = u;
            break;
        case O_TEMP:
            ok = mg_cli_double(val, &dv) && dv >= 0 && dv <= 1e6;
            if (ok && !as_float("--temperature", val, dv, &o.sampling.temperature)) return 2;
            break;
        case O_TOPK:
            ok = mg_cli_int(val, 0, 1 << 30, &ll);
            o.sampling.top_k = (int)ll;
            break;
        case O_TOPP:
            ok = mg_cli_double(val, &dv) && dv > 0 && dv <= 1;
            if (ok && !as_float("--top-p", val, dv, &o.sampling.top_p)) return 2;
            break;
        case O_BATCH:
            ok = mg_cli_int(val, 1, 1 << 20, &ll);
            o.batch = (int)ll;
            break;
        case O_THREADS:
            ok = mg_cli_int(val, 1, MG_MAX_THREADS, &ll);
            threads = (int)ll;
            break;
        case O_COND: cond_text = val; break;
        case O_SCAFFOLD: scaffold_text = val; break;
        case O_RAW: load_flags = MG_LOAD_RAW; break;
        case O_GUIDE:
            ok = mg_cli_double(val, &dv) && dv >= 0 && dv <= 100;
            if (ok && !as_float("--guidance", val, dv, &o.guidance)) return 2;
            break;
        case O_DECODE:
            if (!strcmp(val, "kv"))
                o.kind = MG_DECODE_KV;
            else if (!strcmp(val, "naive"))
                o.kind = MG_DECODE_NAIVE;
            else
                ok = 0;
            break;
        case O_CONSTRAIN: ok = mg_constrain_parse(val, &o.constrain); break;
        }
        if (!ok) return mg_cli_bad_value("sample", argv, val);
    }
    if (!model_path) {
        fprintf(stderr, "molgen sample: --model FILE is required (see molgen sample --help)\n");
        return 2;
    }
    if (o.guidance != 0.0f && !cond_text) {
        fprintf(stderr, "molgen sample: --guidance needs --condition\n");
        return 2;
    }
    char why[256];
    if (scaffold_text && *scaffold_text && !mg_smiles_syntax_ok(scaffold_text, why, sizeof why)) {
        char cut[96];
        fprintf(stderr, "molgen sample: --scaffold '%s' is not a complete SMILES: %s\n",
                mg_cli_cut(scaffold_text, cut, sizeof cut), why);
        return 2;
    }
    mg_catch_stop_signals(); /* SIGINT / SIGTERM: nothing written, 128 + the signal */
    /* the ranks make one set of molecules: their options agree, then the
     * model once loaded */
    mg_dist *world = mg_dist_world();
    mg_dist_field fields[16];
    if (mg_dist_agree_fields(world, fields,
                             sample_fields(&o, cond_text, scaffold_text, load_flags, fields),
                             &err)) {
        mg_cli_report("sample", err.status, &err);
        return 1;
    }
    /* the output is checked before any work, and never replaces the model;
     * under mpirun rank 0 writes it, and a failure on any rank is every
     * rank's (reported once, by the lowest failed rank) */
    char meta_path[4200];
    if ((size_t)snprintf(meta_path, sizeof meta_path, "%s.json", out_path) >= sizeof meta_path) {
        fprintf(stderr, "molgen sample: --out: path too long\n");
        return 1;
    }
    /* a FIFO, a device or stdout as --out is written through, with no
     * sidecar beside it (none to write: /dev/stdout.json) */
    const int out_kind = mg_cli_output_kind(out_path), sidecar = out_kind == MG_CLI_OUT_FILE;
    const mg_cli_file outs[] = {{"--out", out_path, 0},
                                {"--out (its sidecar)", sidecar ? meta_path : NULL, MG_CLI_BESIDE}};
    const mg_cli_file ins[] = {{"--model", model_path, 0}};
    if (mg_cli_claim_outputs("sample", outs, 2, ins, 1) < 0) return 1;
    mg_model *m = NULL;
    mg_vocab *v = NULL;
    if (mg_cli_load_model("sample", model_path, load_flags, &m, &v, &averaged)) return 1;
    const mg_dist_field model_field = {"the --model file (its weights)",
                                       world->size > 1 ? mg_dist_hash_model(m, v) : 0};
    if (mg_dist_agree_fields(world, &model_field, 1, &err)) {
        mg_cli_report("sample", err.status, &err);
        mg_model_free(m);
        mg_vocab_free(v);
        return 1;
    }
    mg_model_set_threads(m, threads);
    o.dist = world;
    o.stop = &mg_stop_signal;
    float cv[MG_COND_MAX];
    if (cond_text && parse_conditions(m, model_path, cond_text, cv, world->rank != 0)) {
        mg_model_free(m);
        mg_vocab_free(v);
        return 2;
    }
    o.condition = cond_text ? cv : NULL;
    int32_t scaf[1024];
    if (scaffold_text && parse_scaffold(m, v, model_path, scaffold_text, scaf, 1024,
                                        &o.scaffold_len, world->rank != 0)) {
        mg_model_free(m);
        mg_vocab_free(v);
        return 2;
    }
    o.scaffold = scaffold_text ? scaf : NULL;
    mg_samples s;
    mg_status rc = mg_sample(m, v, &o, &s, &err);
    mg_model_free(m);
    mg_vocab_free(v);
    if (rc) {
        mg_cli_report("sample", rc, &err);
        return mg_stop_signal ? 128 + mg_stop_signal : 1;
    }
    if (world->rank) { /* rank 0 writes them all */
        mg_samples_free(&s);
        return mg_stop_signal ? 128 + mg_stop_signal : 0;
    }
    rc = 0;
    char tmp[4200];
    FILE *f = mg_cli_atomic_open(out_path, tmp, sizeof tmp, &err);
    if (!f) {
        fprintf(stderr, "molgen sample: %s\n", err.message);
        mg_samples_free(&s);
        return 1;
    }
    size_t valid = 0, empty = 0;
    for (size_t i = 0; i < s.n; i++) {
        fprintf(f, "%s\n", s.smiles[i]);
        if (!s.smiles[i][0])
            empty++;
        else if (mg_smiles_syntax_ok(s.smiles[i], NULL, 0))
            valid++;
    }
    /* a signal while writing: the temporary goes, the output stays */
    if (mg_cli_atomic_commit_if(f, mg_stop_signal != 0, tmp, out_path, &err) ||
        (sidecar && write_meta(meta_path, model_path, averaged ? "averaged" : "raw", &o,
                               cond_text, scaffold_text, threads, &s, &err))) {
        mg_samples_free(&s);
        if (mg_stop_signal) {
            fprintf(stderr, "molgen sample: interrupted by signal %d\n", (int)mg_stop_signal);
            return 128 + mg_stop_signal;
        }
        fprintf(stderr, "molgen sample: %s\n", err.message);
        return 1;
    }
    const double secs = s.seconds > 0 ? s.seconds : 1e-9;
    fprintf(stderr,
            "sampled %zu molecules in %.2f s: %.1f molecules/s, %.0f tokens/s (%s decoding, "
            "batch %d, %d threads%s)\n",
            s.n, s.seconds, (double)s.n / secs, (double)s.tokens / secs,
            mg_decode_kind_name(o.kind), o.batch, threads > 0 ? threads : mg_default_threads(),
            world->size > 1 ? " on each of the MPI ranks" : "");
    fprintf(stderr,
            "syntax-valid %.4f (%zu/%zu; grammar check, not RDKit); empty %zu; no EOS %zu; "
            "constrain %s\n",
            s.n ? (double)valid / (double)s.n : 0.0, valid, s.n, empty, s.truncated,
            mg_constrain_name(o.constrain));
    if (!sidecar)
        fprintf(stderr, "molgen sample: --out %s is written through (a FIFO, a device or the "
                        "standard output): no sidecar %s written\n",
                out_path, meta_path);
    if (out_kind != MG_CLI_OUT_STDOUT) printf("%s\n", out_path);
    mg_samples_free(&s);
    return rc;
}
