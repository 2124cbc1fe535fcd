/* molgen sampling (see sample.h). */
#define _POSIX_C_SOURCE 200809L
#include "sample.h"
#include "errors.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "attn.h"
#include "cli_util.h"
#include "safetensors.h"
#include "decode.h"
#include "smiles_check.h"

/* ------------------------------------------------------------ RNG */

static uint64_t splitmix64(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

void mg_rng_seed(mg_rng *r, uint64_t seed, uint64_t stream) {
    uint64_t s = seed;
    uint64_t a = splitmix64(&s);
    s = a ^ (stream * 0xD1B54A32D192ED03ull + 0x8CB92BA72F3D8DD7ull);
    for (int i = 0; i < 4; i++) r->s[i] = splitmix64(&s);
}

static inline uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

uint64_t mg_rng_next(mg_rng *r) {
    uint64_t *s = r->s;
    const uint64_t result = rotl(s[1] * 5, 7) * 9;
    const uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

double mg_rng_uniform(mg_rng *r) { return (double)(mg_rng_next(r) >> 11) * 0x1.0p-53; }

/* ------------------------------------------------------------ token choice */

void mg_sampling_default(mg_sampling *s) {
    s->temperature = 1.0f;
    s->top_k = 0;
    s->top_p = 1.0f;
}

int mg_sampling_check(const mg_sampling *s, char *err, size_t errlen) {
    if (!s) return mg_fail(err, errlen, MG_SAMPLE_ERR, "sampling settings are NULL");
    if (!(s->temperature >= 0.0f) || !isfinite(s->temperature))
        return mg_fail(err, errlen, MG_SAMPLE_ERR, "temperature %g: need a finite value >= 0",
                    (double)s->temperature);
    if (s->top_k < 0) return mg_fail(err, errlen, MG_SAMPLE_ERR, "top-k %d: need >= 0", s->top_k);
    if (!(s->top_p > 0.0f && s->top_p <= 1.0f))
        return mg_fail(err, errlen, MG_SAMPLE_ERR, "top-p %g: need 0 < top-p <= 1", (double)s->top_p);
    return 0;
}

static int allowed(int id) { return id != MG_PAD && id != MG_BOS; }

int mg_argmax_token(const float *logits, int V) {
    int best = MG_SAMPLE_ERR;
    for (int i = 0; i < V; i++) {
        if (!allowed(i) || isnan(logits[i]) || logits[i] == -INFINITY) continue;
        if (best < 0 || logits[i] > logits[best]) best = i;
    }
    return best;
}

#define MAX_STACK_V 256

int mg_sample_token(const float *logits, int V, const mg_sampling *s, mg_rng *rng) {
    if (!logits || !s || V <= MG_NUM_SPECIAL) return MG_SAMPLE_ERR;
    if (s->temperature == 0.0f || s->top_k == 1 || !rng) return mg_argmax_token(logits, V);
    int order_stack[MAX_STACK_V];
    double p_stack[MAX_STACK_V];
    int *order = order_stack;
    double *p = p_stack;
    if (V > MAX_STACK_V) {
        order = malloc((size_t)V * sizeof *order);
        p = malloc((size_t)V * sizeof *p);
        if (!order || !p) {
            free(order);
            free(p);
            return mg_argmax_token(logits, V);
        }
    }
    /* candidates sorted by (logit desc, id asc): insertion sort, V is small */
    int n = 0;
    for (int i = 0; i < V; i++) {
        if (!allowed(i) || isnan(logits[i]) || logits[i] == -INFINITY) continue;
        int j = n++;
        while (j > 0 && logits[order[j - 1]] < logits[i]) {
            order[j] = order[j - 1];
            j--;
        }
        order[j] = i;
    }
    int result = MG_SAMPLE_ERR;
    if (n > 0 && logits[order[0]] != INFINITY) {
        int keep = n;
        if (s->top_k > 0 && s->top_k < keep) keep = s->top_k;
        const double inv_t = 1.0 / (double)s->temperature, zmax = (double)logits[order[0]] * inv_t;
        double total = 0.0;
        for (int j = 0; j < keep; j++) {
            p[j] = exp((double)logits[order[j]] * inv_t - zmax);
            total += p[j];
        }
        if (s->top_p < 1.0f) {
            const double target = (double)s->top_p * total;
            double cum = 0.0;
            int m = 0;
            while (m < keep) {
                cum += p[m++];
                if (cum >= target) break;
            }
            keep = m;
            total = cum;
        }
        const double u = mg_rng_uniform(rng) * total;
        double acc = 0.0;
        result = order[keep - 1];
        for (int j = 0; j < keep; j++) {
            acc += p[j];
            if (u < acc) {
                result = order[j];
                break;
            }
        }
    } else if (n > 0) {
        result = order[0]; /* +inf logit: certain */
    }
    if (order != order_stack) {
        free(order);
        free(p);
    }
    return result;
}

/* ------------------------------------------------------------ decoders */

const char *mg_decode_kind_name(mg_decode_kind k) {
    return k == MG_DECODE_KV ? "kv" : k == MG_DECODE_NAIVE ? "naive" : "?";
}

struct mg_decoder {
    mg_decode_kind kind;
    mg_model *m;
    int B, n, V, ctx;
    int *pos;        /* [B] (naive) */
    mg_kv_decoder *kv;
    /* naive */
    int32_t *hist;   /* [B, ctx] tokens so far */
    int32_t *prefix; /* [B, ctx] packed [n, L] */
    int64_t *len;    /* [B] */
    float *full;     /* [B, ctx, V] */
};

int mg_decoder_new(mg_model *m, mg_decode_kind kind, int B, mg_decoder **out, char *err,
                   size_t errlen) {
    if (!m || !out) return mg_fail(err, errlen, MG_SAMPLE_ERR, "decoder: model and out must be non-NULL");
    *out = NULL;
    if (B < 1) return mg_fail(err, errlen, MG_SAMPLE_ERR, "decoder: batch %d < 1", B);
    if (kind != MG_DECODE_NAIVE && kind != MG_DECODE_KV)
        return mg_fail(err, errlen, MG_SAMPLE_ERR, "decoder: unknown kind %d", (int)kind);
    const mg_model_config *c = mg_model_get_config(m);
    mg_decoder *d = calloc(1, sizeof *d);
    if (!d) return mg_fail(err, errlen, MG_SAMPLE_ERR_NOMEM, "decoder: out of memory");
    d->kind = kind;
    d->m = m;
    d->B = B;
    d->V = c->vocab_size;
    d->ctx = c->ctx_len;
    if (kind == MG_DECODE_KV) {
        int rc = mg_kv_new(m, B, &d->kv, err, errlen);
        if (rc) {
            free(d);
            return rc;
        }
    } else {
        const size_t cells = (size_t)B * (size_t)d->ctx;
        d->pos = calloc((size_t)B, sizeof *d->pos);
        d->len = calloc((size_t)B, sizeof *d->len);
        d->hist = malloc(cells * sizeof *d->hist);
        d->prefix = malloc(cells * sizeof *d->prefix);
        d->full = malloc(cells * (size_t)d->V * sizeof *d->full);
        if (!d->pos || !d->len || !d->hist || !d->prefix || !d->full) {
            mg_decoder_free(d);
            return mg_fail(err, errlen, MG_SAMPLE_ERR_NOMEM, "decoder: out of memory");
        }
    }
    *out = d;
    return 0;
}

void mg_decoder_free(mg_decoder *d) {
    if (!d) return;
    mg_kv_free(d->kv);
    free(d->pos);
    free(d->len);
    free(d->hist);
    free(d->prefix);
    free(d->full);
    free(d);
}

int mg_decoder_reset(mg_decoder *d, int n, char *err, size_t errlen) {
    if (!d) return mg_fail(err, errlen, MG_SAMPLE_ERR, "decoder is NULL");
    if (n < 1 || n > d->B) return mg_fail(err, errlen, MG_SAMPLE_ERR, "decoder: %d rows, need 1..%d", n, d->B);
    d->n = n;
    if (d->kv) return mg_kv_reset(d->kv, n, err, errlen);
    for (int r = 0; r < n; r++) d->pos[r] = 0;
    return 0;
}

int mg_decoder_restart_row(mg_decoder *d, int r, char *err, size_t errlen) {
    if (!d) return mg_fail(err, errlen, MG_SAMPLE_ERR, "decoder is NULL");
    if (r < 0 || r >= d->n)
        return mg_fail(err, errlen, MG_SAMPLE_ERR, "decoder: row %d is outside [0, %d)", r, d->n);
    if (d->kv) return mg_kv_restart_row(d->kv, r, err, errlen);
    d->pos[r] = 0;
    return 0;
}

int mg_decoder_pos(const mg_decoder *d, int r) {
    if (!d || r < 0 || r >= d->n) return 0;
    return d->kv ? mg_kv_pos(d->kv, r) : d->pos[r];
}

int mg_decoder_step(mg_decoder *d, const int32_t *tok, float *logits, char *err, size_t errlen) {
    if (!d || !tok || !logits)
        return mg_fail(err, errlen, MG_SAMPLE_ERR, "decoder, tokens and logits must be non-NULL");
    if (d->n < 1) return mg_fail(err, errlen, MG_SAMPLE_ERR, "decoder: step before reset");
    if (d->kv) return mg_kv_step(d->kv, tok, logits, err, errlen);
    const int n = d->n, V = d->V, ctx = d->ctx;
    int L = 0;
    for (int b = 0; b < n; b++) {
        if (d->pos[b] >= ctx)
            return mg_fail(err, errlen, MG_SAMPLE_ERR, "decoder: row %d: position %d is past ctx_len %d",
                        b, d->pos[b], ctx);
        if (d->pos[b] + 1 > L) L = d->pos[b] + 1;
    }
    /* rows shorter than L are key-padded: with the causal mask their
     * positions < length never see the padding */
    for (int b = 0; b < n; b++) {
        const int lb = d->pos[b] + 1;
        d->hist[(size_t)b * ctx + d->pos[b]] = tok[b];
        memcpy(d->prefix + (size_t)b * L, d->hist + (size_t)b * ctx, (size_t)lb * sizeof(int32_t));
        for (int t = lb; t < L; t++) d->prefix[(size_t)b * L + t] = MG_PAD;
        d->len[b] = lb;
    }
    int rc = mg_model_logits(d->m, d->prefix, d->len, n, L, d->full, NULL, err, errlen);
    if (rc) return rc;
    for (int b = 0; b < n; b++) {
        memcpy(logits + (size_t)b * V, d->full + ((size_t)b * L + (size_t)d->pos[b]) * V,
               (size_t)V * sizeof(float));
        d->pos[b]++;
    }
    return 0;
}

/* ------------------------------------------------------------ sampling */

void mg_sample_opts_default(mg_sample_opts *o) {
    memset(o, 0, sizeof *o);
    o->n = 1000;
    o->batch = 64;
    o->kind = MG_DECODE_KV;
    mg_sampling_default(&o->sampling);
    o->seed = 0;
}

void mg_samples_free(mg_samples *s) {
    if (!s) return;
    if (s->smiles)
        for (size_t i = 0; i < s->n; i++) free(s->smiles[i]);
    free(s->smiles);
    free(s->ntok);
    free(s->ended);
    free(s->blob_);
    memset(s, 0, sizeof *s);
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int mg_sample(mg_model *m, const mg_vocab *v, const mg_sample_opts *o, mg_samples *out,
              char *err, size_t errlen) {
    if (!m || !v || !o || !out)
        return mg_fail(err, errlen, MG_SAMPLE_ERR, "model, vocab, options and out must be non-NULL");
    memset(out, 0, sizeof *out);
    int rc = mg_sampling_check(&o->sampling, err, errlen);
    if (rc) return rc;
    if (o->batch < 1) return mg_fail(err, errlen, MG_SAMPLE_ERR, "batch %d: need >= 1", o->batch);
    const mg_model_config *c = mg_model_get_config(m);
    const int V = c->vocab_size, ctx = c->ctx_len;
    if (mg_vocab_size(v) != V)
        return mg_fail(err, errlen, MG_SAMPLE_ERR, "vocabulary has %d tokens, the model %d",
                    mg_vocab_size(v), V);
    if (V <= MG_NUM_SPECIAL)
        return mg_fail(err, errlen, MG_SAMPLE_ERR, "vocabulary of %d tokens has no data tokens", V);
    const size_t n = o->n;
    const int B = (size_t)o->batch < n ? o->batch : (int)(n ? n : 1);
    out->n = n;
    out->smiles = calloc(n ? n : 1, sizeof *out->smiles);
    out->ntok = calloc(n ? n : 1, sizeof *out->ntok);
    out->ended = calloc(n ? n : 1, sizeof *out->ended);
    int32_t *gen = malloc((size_t)B * (size_t)ctx * sizeof *gen);
    int32_t *tok = malloc((size_t)B * sizeof *tok);
    int *len = malloc((size_t)B * sizeof *len);
    unsigned char *active = malloc((size_t)B);
    float *logits = malloc((size_t)B * (size_t)V * sizeof *logits);
    mg_rng *rng = malloc((size_t)B * sizeof *rng);
    size_t *mol = malloc((size_t)B * sizeof *mol);
    const size_t slen = (size_t)ctx * (MG_TOKEN_MAX + 1) + 1;
    char *sbuf = malloc(slen);
    mg_decoder *dec = NULL;
    if (!out->smiles || !out->ntok || !out->ended || !gen || !tok || !len || !active || !logits ||
        !rng || !mol || !sbuf) {
        rc = mg_fail(err, errlen, MG_SAMPLE_ERR_NOMEM, "out of memory for %zu molecules", n);
        goto done;
    }
    if (n == 0) goto done;
    rc = mg_decoder_new(m, o->kind, B, &dec, err, errlen);
    if (rc) goto done;
    /* KV decoding uses continuous batching: slot r holds molecule mol[r];
     * when it ends, the next molecule starts in that slot at position 0.
     * The naive decoder runs batch by batch instead (a refilled slot would
     * make every step re-run the longest prefix of the batch): a finished
     * row idles until the whole batch is done. Idle slots restart every
     * step as cheap dummies at position 0. Results do not depend on this:
     * molecule k always draws from RNG stream k. */
    const int refill = o->kind == MG_DECODE_KV;
    const double t0 = now_s();
    size_t next = 0;
    int live = 0;
    for (;;) {
        if (live == 0) {
            if (next >= n) break;
            rc = mg_decoder_reset(dec, B, err, errlen);
            if (rc) goto done;
            for (int r = 0; r < B; r++) {
                tok[r] = MG_BOS;
                len[r] = 0;
                active[r] = next < n;
                if (!active[r]) continue;
                mol[r] = next;
                mg_rng_seed(&rng[r], o->seed, (uint64_t)next);
                next++;
                live++;
            }
        }
        rc = mg_decoder_step(dec, tok, logits, err, errlen);
        if (rc) goto done;
        for (int r = 0; r < B; r++) {
            if (!active[r]) {
                tok[r] = MG_BOS;
                rc = mg_decoder_restart_row(dec, r, err, errlen);
                if (rc) goto done;
                continue;
            }
            const size_t k = mol[r];
            int t = mg_sample_token(logits + (size_t)r * V, V, &o->sampling, &rng[r]);
            if (t < 0) {
                rc = mg_fail(err, errlen, MG_SAMPLE_ERR,
                          "molecule %zu position %d: the logits are not finite", k, len[r] + 1);
                goto done;
            }
            int finished = 0;
            if (t == MG_EOS) {
                out->ended[k] = 1;
                finished = 1;
            } else {
                gen[(size_t)r * ctx + len[r]++] = t;
                tok[r] = t;
                finished = len[r] >= ctx; /* no position left for the next token */
            }
            if (!finished) continue;
            int sl = mg_vocab_decode(v, gen + (size_t)r * ctx, len[r], sbuf, slen, err, errlen);
            if (sl < 0) {
                rc = MG_SAMPLE_ERR;
                goto done;
            }
            char *str = malloc((size_t)sl + 1);
            if (!str) {
                rc = mg_fail(err, errlen, MG_SAMPLE_ERR_NOMEM, "out of memory");
                goto done;
            }
            memcpy(str, sbuf, (size_t)sl + 1);
            out->smiles[k] = str;
            out->ntok[k] = len[r];
            out->tokens += len[r] + (out->ended[k] ? 1 : 0);
            if (!out->ended[k]) out->truncated++;
            rc = mg_decoder_restart_row(dec, r, err, errlen);
            if (rc) goto done;
            tok[r] = MG_BOS;
            len[r] = 0;
            if (refill && next < n) {
                mol[r] = next;
                mg_rng_seed(&rng[r], o->seed, (uint64_t)next);
                next++;
            } else {
                active[r] = 0;
                live--;
            }
        }
    }
    out->seconds = now_s() - t0;
done:
    mg_decoder_free(dec);
    free(gen);
    free(tok);
    free(len);
    free(active);
    free(logits);
    free(rng);
    free(mol);
    free(sbuf);
    if (rc) mg_samples_free(out);
    return rc;
}

/* ------------------------------------------------------------ CLI */

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
    char err[512];
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
    if (mg_cli_check_output(out_path, inputs, 1, err, sizeof err)) {
        fprintf(stderr, "molgen sample: --out: %s\n", err);
        return 1;
    }
    mg_st_remove_stale_temps(out_path);
    mg_model *m = NULL;
    mg_vocab *v = NULL;
    if (mg_cli_load_model("sample", model_path, &m, &v)) return 1;
    mg_samples s;
    int rc = mg_sample(m, v, &o, &s, err, sizeof err);
    mg_model_free(m);
    mg_vocab_free(v);
    if (rc) {
        fprintf(stderr, "molgen sample: %s\n", err);
        return 1;
    }
    rc = 0;
    char tmp[4200];
    FILE *f = mg_cli_atomic_open(out_path, tmp, sizeof tmp, err, sizeof err);
    if (!f) {
        fprintf(stderr, "molgen sample: %s\n", err);
        mg_samples_free(&s);
        return 1;
    }
    size_t valid = 0, empty = 0;
    for (size_t i = 0; i < s.n; i++) {
        fprintf(f, "%s\n", s.smiles[i]);
        if (!s.smiles[i][0]) empty++;
        else if (mg_smiles_syntax_ok(s.smiles[i], NULL, 0)) valid++;
    }
    if (mg_cli_atomic_commit(f, tmp, out_path, err, sizeof err)) {
        fprintf(stderr, "molgen sample: %s\n", err);
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
