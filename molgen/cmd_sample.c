/* `molgen sample`: options -> mg_sample (sample.h) -> one SMILES per line. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attn.h"
#include "cli_util.h"
#include "commands.h"
#include "safetensors.h"
#include "sample.h"
#include "smiles_check.h"

static const char *SAMPLE_USAGE =
    "usage: molgen sample --model FILE [-n N] [--seed S] [--out FILE]\n"
    "                     [--temperature T] [--top-k K] [--top-p P]\n"
    "                     [--batch B] [--threads N] [--decode kv|naive]\n"
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
    "Prints the output path on stdout; molecules/s and the syntax-valid fraction\n"
    "(molgen's SMILES grammar check, not RDKit) on stderr. An empty line is a\n"
    "molecule that ended at once; a molecule without EOS by ctx_len is kept.\n";

int cmd_sample(int argc, char **argv) {
    const char *model_path = NULL, *out_path = "out/samples.smi";
    mg_sample_opts o;
    mg_sample_opts_default(&o);
    int threads = 0;
    mg_error err;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            fputs(SAMPLE_USAGE, stdout);
            return 0;
        }
        static const char *const value_opts[] = {"--model", "--out", "-n", "--n", "--num", "--seed", "--temperature", "--top-k", "--top-p", "--batch", "--threads", "--decode", NULL};
        const char *val = NULL;
        char opt[64];
        if (!mg_cli_take("sample", argc, argv, &i, value_opts, opt, sizeof opt, &val)) return 2;
        a = opt;
        int ok = 1;
        long long ll;
        double dv;
        if (!strcmp(a, "--model")) model_path = val;
        else if (!strcmp(a, "--out")) out_path = val;
        else if (!strcmp(a, "-n") || !strcmp(a, "--n") || !strcmp(a, "--num")) {
            ok = mg_cli_int(val, 1, 100000000, &ll);
            o.n = (size_t)ll;
        } else if (!strcmp(a, "--seed")) {
            uint64_t u;
            ok = mg_cli_u64(val, &u);
            o.seed = u;
        } else if (!strcmp(a, "--temperature")) {
            ok = mg_cli_double(val, &dv) && dv >= 0 && dv <= 1e6;
            o.sampling.temperature = (float)dv;
        } else if (!strcmp(a, "--top-k")) {
            ok = mg_cli_int(val, 0, 1 << 30, &ll);
            o.sampling.top_k = (int)ll;
        } else if (!strcmp(a, "--top-p")) {
            ok = mg_cli_double(val, &dv) && dv > 0 && dv <= 1;
            o.sampling.top_p = (float)dv;
        } else if (!strcmp(a, "--batch")) {
            ok = mg_cli_int(val, 1, 1 << 20, &ll);
            o.batch = (int)ll;
        } else if (!strcmp(a, "--threads")) {
            ok = mg_cli_int(val, 1, ATTN_MAX_THREADS, &ll);
            threads = (int)ll;
        } else if (!strcmp(a, "--decode")) {
            if (!strcmp(val, "kv")) o.kind = MG_DECODE_KV;
            else if (!strcmp(val, "naive")) o.kind = MG_DECODE_NAIVE;
            else ok = 0;
        } else {
            fprintf(stderr, "molgen sample: unknown option '%s' (see molgen sample --help)\n", a);
            return 2;
        }
        if (!ok) {
            char cut[96];
            fprintf(stderr, "molgen sample: bad value '%s' for %s (see molgen sample --help)\n",
                    mg_cli_cut(val, cut, sizeof cut), a);
            return 2;
        }
    }
    if (!model_path) {
        fprintf(stderr, "molgen sample: --model FILE is required (see molgen sample --help)\n");
        return 2;
    }
    if (threads > 0 && attn_set_num_threads(threads, NULL) != ATTN_OK) {
        fprintf(stderr, "molgen sample: cannot use %d threads\n", threads);
        return 2;
    }
    /* the output is checked before any work, and never replaces the model */
    const char *inputs[] = {model_path};
    if (mg_cli_check_output(out_path, inputs, 1, &err)) {
        fprintf(stderr, "molgen sample: --out: %s\n", err.message);
        return 1;
    }
    mg_st_remove_stale_temps(out_path);
    mg_model *m = NULL;
    mg_vocab *v = NULL;
    if (mg_cli_load_model("sample", model_path, &m, &v)) return 1;
    mg_samples s;
    mg_status rc = mg_sample(m, v, &o, &s, &err);
    mg_model_free(m);
    mg_vocab_free(v);
    if (rc) {
        fprintf(stderr, "molgen sample: %s\n", err.message);
        return 1;
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
        if (!s.smiles[i][0]) empty++;
        else if (mg_smiles_syntax_ok(s.smiles[i], NULL, 0)) valid++;
    }
    if (mg_cli_atomic_commit(f, tmp, out_path, &err)) {
        fprintf(stderr, "molgen sample: %s\n", err.message);
        mg_samples_free(&s);
        return 1;
    }
    const double secs = s.seconds > 0 ? s.seconds : 1e-9;
    fprintf(stderr,
            "sampled %zu molecules in %.2f s: %.1f molecules/s, %.0f tokens/s (%s decoding, "
            "batch %d, %d threads)\n",
            s.n, s.seconds, (double)s.n / secs, (double)s.tokens / secs, mg_decode_kind_name(o.kind),
            o.batch, attn_get_num_threads());
    fprintf(stderr, "syntax-valid %.4f (%zu/%zu; grammar check, not RDKit); empty %zu; no EOS %zu\n",
            s.n ? (double)valid / (double)s.n : 0.0, valid, s.n, empty, s.truncated);
    printf("%s\n", out_path);
    mg_samples_free(&s);
    return rc;
}
