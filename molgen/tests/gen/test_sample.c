/* molgen sampling tests:
 *   - KV-cache decoding gives the naive decoder's logits (re-running the
 *     whole prefix through mg_model_logits) within 1e-5 relative at every
 *     step, for a batch of rows with different tokens, to ctx_len;
 *   - token choice: PAD/BOS never chosen, top-k = 1 and tiny top-p are the
 *     argmax, top-k restricts the support, the empirical distribution
 *     matches softmax(logits / T), low temperature concentrates, high
 *     temperature flattens;
 *   - mg_sample: same seed -> identical molecules (also across batch sizes,
 *     thread counts (a KV run's per-thread parts) and KV vs naive), different seeds differ, top-k = 1 equals greedy
 *     (temperature 0) equals a hand-written argmax loop on the naive
 *     decoder;
 *   - errors: bad settings, step before reset / past ctx_len;
 *   - constrained sampling (--constrain syntax / valence) on a wild model
 *     (weights scaled up, most unconstrained strings broken): every
 *     molecule that ends passes mg_smiles_syntax_ok, the output does not
 *     depend on batch size or decoder, and a vocabulary that allows no
 *     first token is MG_ERR_STATE with a message, not NaN.
 * The model is small with random weights scaled up so that logits are O(1)
 * and attention is far from uniform. */
#define _POSIX_C_SOURCE 200809L
#include <malloc.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "commands.h"
#include "chem/constrain.h"
#include "chem/smiles_check.h"
#include "harness/bench.h"
#include "nn/model.h"
#include "gen/sample.h"
#include "chem/tokenizer.h"

#include "mg_test.h"

static uint64_t rs = 777;
static uint64_t rnd(void) { return mg_splitmix64(&rs); }
static double urand(void) { return (double)(rnd() >> 11) * 0x1.0p-53; }

static const char *TOKENS[] = {"C", "c", "N", "O", "(", ")", "1", "2", "=", "n", "Cl", "[nH]"};
#define NTOK ((int)(sizeof TOKENS / sizeof *TOKENS))

static mg_model *make_model(mg_vocab **vocab, int ctx, float scale) {
    mg_error err = {0};
    if (mg_vocab_from_tokens(TOKENS, NTOK, vocab, &err)) {
        fprintf(stderr, "vocab: %s\n", err.message);
        return NULL;
    }
    mg_model_config c;
    mg_model_config_default(&c);
    c.n_layer = 2;
    c.d_model = 32;
    c.n_head = 4;
    c.ctx_len = ctx;
    c.vocab_size = mg_vocab_size(*vocab);
    c.dropout = 0.0f;
    mg_model *m = NULL;
    if (mg_model_create(&c, &m, &err)) {
        fprintf(stderr, "model: %s\n", err.message);
        return NULL;
    }
    mg_model_init(m, 42);
    /* Scale the weight matrices and embeddings, jitter LayerNorm. */
    float *p = mg_model_params(m);
    for (size_t i = 0; i < mg_model_num_tensors(m); i++) {
        const mg_param_info *t = mg_model_tensor(m, i);
        int is_ln = strstr(t->name, "ln") != NULL;
        for (size_t j = 0; j < t->numel; j++) {
            float *x = p + t->offset + j;
            if (is_ln)
                *x += (float)(0.2 * (urand() - 0.5));
            else if (t->ndim == 2)
                *x *= scale;
            else
                *x = (float)(0.1 * (urand() - 0.5));
        }
    }
    return m;
}

/* ---------------------------------------------------------------- KV vs naive */

static void test_kv_vs_naive(mg_model *m) {
    mg_error err = {0};
    const mg_model_config *c = mg_model_get_config(m);
    const int B = 3, V = c->vocab_size, ctx = c->ctx_len;
    mg_decoder *nv = NULL, *kv = NULL;
    CHECK(mg_decoder_new(m, MG_DECODE_NAIVE, B, &nv, &err) == 0, "%s", err.message);
    CHECK(mg_decoder_new(m, MG_DECODE_KV, B, &kv, &err) == 0, "%s", err.message);
    if (!nv || !kv) return;
    float *a = malloc((size_t)B * V * sizeof *a), *b = malloc((size_t)B * V * sizeof *b);
    for (int rows = 1; rows <= B; rows += 2) {
        CHECK(mg_decoder_reset(nv, rows, &err) == 0, "%s", err.message);
        CHECK(mg_decoder_reset(kv, rows, &err) == 0, "%s", err.message);
        int32_t tok[3] = {MG_BOS, MG_BOS, MG_BOS};
        double worst = 0.0, maxabs = 0.0;
        for (int pos = 0; pos < ctx; pos++) {
            CHECK(mg_decoder_pos(kv, 0) == pos && mg_decoder_pos(nv, rows - 1) == pos, "pos");
            int r1 = mg_decoder_step(nv, tok, a, &err);
            CHECK(r1 == 0, "naive step %d: %s", pos, err.message);
            int r2 = mg_decoder_step(kv, tok, b, &err);
            CHECK(r2 == 0, "kv step %d: %s", pos, err.message);
            if (r1 || r2) break;
            for (int i = 0; i < rows * V; i++) {
                double ref = a[i], diff = fabs((double)b[i] - ref);
                double rel = diff / fmax(1.0, fabs(ref));
                if (rel > worst) worst = rel;
                if (fabs(ref) > maxabs) maxabs = fabs(ref);
                if (rel > 1e-5) {
                    CHECK(0, "rows %d pos %d logit %d: kv %.9g naive %.9g", rows, pos, i,
                          (double)b[i], ref);
                    break;
                }
            }
            for (int r = 0; r < rows; r++)
                tok[r] = (int32_t)(MG_NUM_SPECIAL + rnd() % (uint64_t)(V - MG_NUM_SPECIAL));
        }
        printf("kv vs naive, %d rows x %d steps: max relative logit difference %.2e (|logit| up to "
               "%.2f)\n",
               rows, ctx, worst, maxabs);
        CHECK(maxabs > 0.5, "logits too small (%g) for a meaningful comparison", maxabs);
        /* past ctx_len */
        CHECK(mg_decoder_step(kv, tok, b, &err) != 0, "kv step past ctx_len accepted");
        CHECK(mg_decoder_step(nv, tok, a, &err) != 0, "naive step past ctx_len accepted");
    }
    /* Staggered rows (continuous batching): rows restart at different steps,
     * so they sit at different positions; KV vs naive (key padding) must
     * still agree, and each row must equal decoding its tokens alone. */
    {
        enum { R = 3, STEPS = 60 };
        int32_t tok[R], seq[R][64];
        int len[R] = {0, 0, 0};
        mg_decoder *solo = NULL;
        CHECK(mg_decoder_new(m, MG_DECODE_NAIVE, 1, &solo, &err) == 0, "%s", err.message);
        float *one = malloc((size_t)V * sizeof *one);
        CHECK(mg_decoder_reset(nv, R, &err) == 0 && mg_decoder_reset(kv, R, &err) == 0, "%s",
              err.message);
        for (int r = 0; r < R; r++) tok[r] = MG_BOS;
        double worst = 0, worst_solo = 0;
        int restarts = 0, solo_checked = 0;
        for (int step = 0; step < STEPS; step++) {
            for (int r = 0; r < R; r++) seq[r][len[r]] = tok[r];
            CHECK(mg_decoder_step(nv, tok, a, &err) == 0, "naive staggered %d: %s", step,
                  err.message);
            CHECK(mg_decoder_step(kv, tok, b, &err) == 0, "kv staggered %d: %s", step, err.message);
            for (int i = 0; i < R * V; i++) {
                double rel = fabs((double)b[i] - a[i]) / fmax(1.0, fabs((double)a[i]));
                if (rel > worst) worst = rel;
            }
            for (int r = 0; r < R; r++) len[r]++;
            /* row 1 alone, replayed from its start, at a few points */
            if (solo && step % 7 == 3) {
                mg_decoder_reset(solo, 1, NULL);
                for (int t = 0; t < len[1]; t++)
                    CHECK(mg_decoder_step(solo, &seq[1][t], one, &err) == 0, "%s", err.message);
                for (int i = 0; i < V; i++) {
                    double rel = fabs((double)b[V + i] - one[i]) / fmax(1.0, fabs((double)one[i]));
                    if (rel > worst_solo) worst_solo = rel;
                }
                solo_checked++;
            }
            for (int r = 0; r < R; r++) {
                tok[r] = (int32_t)(MG_NUM_SPECIAL + rnd() % (uint64_t)(V - MG_NUM_SPECIAL));
                if (len[r] >= ctx || rnd() % 9 == 0) {
                    CHECK(mg_decoder_restart_row(nv, r, &err) == 0, "%s", err.message);
                    CHECK(mg_decoder_restart_row(kv, r, &err) == 0, "%s", err.message);
                    CHECK(mg_decoder_pos(kv, r) == 0 && mg_decoder_pos(nv, r) == 0,
                          "pos after restart");
                    len[r] = 0;
                    tok[r] = MG_BOS;
                    restarts++;
                }
                CHECK(mg_decoder_pos(kv, r) == len[r] && mg_decoder_pos(nv, r) == len[r],
                      "row %d pos", r);
            }
        }
        CHECK(worst <= 1e-5, "staggered kv vs naive: %.2e", worst);
        CHECK(worst_solo <= 1e-5, "staggered row vs alone: %.2e", worst_solo);
        CHECK(restarts >= 5 && solo_checked >= 5, "restarts %d, solo checks %d", restarts,
              solo_checked);
        printf("staggered rows, %d steps, %d restarts: kv vs naive %.2e, row vs alone %.2e\n",
               STEPS, restarts, worst, worst_solo);
        CHECK(mg_decoder_restart_row(kv, R, &err) != 0, "restart of row n accepted");
        free(one);
        mg_decoder_free(solo);
    }
    /* bad token */
    int32_t badtok[3] = {(int32_t)V, 0, 0};
    CHECK(mg_decoder_reset(kv, 1, &err) == 0, "%s", err.message);
    CHECK(mg_decoder_step(kv, badtok, b, &err) != 0, "out-of-range token accepted");
    CHECK(mg_decoder_reset(kv, B + 1, &err) != 0, "reset to more rows than B accepted");
    free(a);
    free(b);
    mg_decoder_free(nv);
    mg_decoder_free(kv);
    mg_decoder *none = NULL;
    CHECK(mg_decoder_new(m, MG_DECODE_KV, 0, &none, &err) != 0 && !none, "B = 0 accepted");
}

/* ---------------------------------------------------------------- token choice */

static void test_token_choice(void) {
    enum { V = 9 };
    float lg[V] = {50.0f, 60.0f, 1.0f, 0.5f, 2.0f, -1.0f, 2.0f, 0.0f, 1.5f};
    /* argmax skips PAD (0) and BOS (1); ties -> lowest id (4 before 6) */
    CHECK(mg_argmax_token(lg, V) == 4, "argmax %d", mg_argmax_token(lg, V));
    mg_rng r;
    mg_rng_seed(&r, 1, 0);
    mg_sampling s;
    mg_sampling_default(&s);
    s.top_k = 1;
    CHECK(mg_sample_token(lg, V, &s, &r) == 4, "top-k 1");
    mg_sampling_default(&s);
    s.top_p = 1e-6f;
    for (int i = 0; i < 50; i++) CHECK(mg_sample_token(lg, V, &s, &r) == 4, "top-p tiny");
    mg_sampling_default(&s);
    s.temperature = 0.0f;
    CHECK(mg_sample_token(lg, V, &s, &r) == 4, "temperature 0");

    /* empirical distribution vs softmax over ids 2.. at T = 1.5 */
    mg_sampling_default(&s);
    s.temperature = 1.5f;
    enum { DRAWS = 100000 };
    int count[V] = {0};
    for (int i = 0; i < DRAWS; i++) {
        int t = mg_sample_token(lg, V, &s, &r);
        CHECK(t >= 2 && t < V, "token %d", t);
        if (t >= 0 && t < V) count[t]++;
    }
    double z = 0, pr[V];
    for (int i = 2; i < V; i++) z += exp(lg[i] / 1.5);
    double worst = 0;
    for (int i = 0; i < V; i++) {
        pr[i] = i < 2 ? 0.0 : exp(lg[i] / 1.5) / z;
        double f = (double)count[i] / DRAWS, sd = sqrt(pr[i] * (1 - pr[i]) / DRAWS);
        double dev = sd > 0 ? fabs(f - pr[i]) / sd : (f == 0 ? 0 : 1e9);
        if (dev > worst) worst = dev;
        CHECK(dev < 5.0, "id %d: frequency %.4f, softmax %.4f", i, f, pr[i]);
    }
    printf("multinomial at T=1.5: %d draws, worst deviation %.2f sigma\n", DRAWS, worst);

    /* top-k 3: only the three largest (4, 6, 8) */
    mg_sampling_default(&s);
    s.top_k = 3;
    int seen[V] = {0};
    for (int i = 0; i < 3000; i++) {
        int t = mg_sample_token(lg, V, &s, &r);
        if (t >= 0) seen[t]++;
    }
    CHECK(seen[4] && seen[6] && seen[8], "top-k 3 misses one of 4, 6, 8");
    CHECK(seen[4] + seen[6] + seen[8] == 3000, "top-k 3 sampled outside the top 3");

    /* top-p 0.6: sorted probs (T=1) of 4,6,8,2,3,7,5; keep the shortest
     * prefix with mass >= 0.6 of the total */
    mg_sampling_default(&s);
    s.top_p = 0.6f;
    int ord[7] = {4, 6, 8, 2, 3, 7, 5};
    double tot = 0, cum = 0;
    for (int i = 0; i < 7; i++) tot += exp(lg[ord[i]]);
    int keep = 0;
    while (keep < 7) {
        cum += exp(lg[ord[keep++]]);
        if (cum >= 0.6 * tot) break;
    }
    memset(seen, 0, sizeof seen);
    for (int i = 0; i < 5000; i++) {
        int t = mg_sample_token(lg, V, &s, &r);
        if (t >= 0) seen[t]++;
    }
    int inside = 0;
    for (int i = 0; i < keep; i++) inside += seen[ord[i]];
    CHECK(inside == 5000, "top-p 0.6 sampled outside its nucleus of %d tokens", keep);
    for (int i = 0; i < keep; i++) CHECK(seen[ord[i]] > 0, "nucleus token %d never drawn", ord[i]);

    /* temperature: low -> (almost) always the argmax; high -> flatter */
    mg_sampling_default(&s);
    s.temperature = 0.05f;
    int hits = 0;
    for (int i = 0; i < 1000; i++) {
        int t = mg_sample_token(lg, V, &s, &r);
        hits += t == 4 || t == 6;
    }
    CHECK(hits == 1000, "low temperature left the two top tokens: %d", hits);
    s.temperature = 100.0f;
    memset(seen, 0, sizeof seen);
    for (int i = 0; i < 7000; i++) {
        int t = mg_sample_token(lg, V, &s, &r);
        if (t >= 0) seen[t]++;
    }
    for (int i = 2; i < V; i++)
        CHECK(seen[i] > 700 && seen[i] < 1300, "T=100 id %d drawn %d/7000", i, seen[i]);

    /* non-finite */
    float bad[V];
    for (int i = 0; i < V; i++) bad[i] = NAN;
    CHECK(mg_sample_token(bad, V, &s, &r) < 0, "NaN logits accepted");
    bad[5] = 1.0f;
    CHECK(mg_sample_token(bad, V, &s, &r) == 5, "single finite logit");

    /* settings */
    mg_error err = {0};
    mg_sampling_default(&s);
    CHECK(mg_sampling_check(&s, &err) == 0, "%s", err.message);
    s.temperature = -1.0f;
    CHECK(mg_sampling_check(&s, &err) != 0, "negative temperature");
    mg_sampling_default(&s);
    s.top_p = 0.0f;
    CHECK(mg_sampling_check(&s, &err) != 0, "top-p 0");
    s.top_p = 1.5f;
    CHECK(mg_sampling_check(&s, &err) != 0, "top-p 1.5");
    mg_sampling_default(&s);
    s.top_k = -2;
    CHECK(mg_sampling_check(&s, &err) != 0, "top-k -2");

    /* RNG streams */
    mg_rng a, b;
    mg_rng_seed(&a, 5, 0);
    mg_rng_seed(&b, 5, 0);
    int same = 1;
    for (int i = 0; i < 100; i++) same &= mg_rng_next(&a) == mg_rng_next(&b);
    CHECK(same, "same seed/stream differ");
    mg_rng_seed(&b, 5, 1);
    CHECK(mg_rng_next(&a) != mg_rng_next(&b), "streams 0 and 1 coincide");
}

/* ---------------------------------------------------------------- mg_sample */

static int same_samples(const mg_samples *a, const mg_samples *b) {
    if (a->n != b->n) return 0;
    for (size_t i = 0; i < a->n; i++)
        if (strcmp(a->smiles[i], b->smiles[i]) || a->ended[i] != b->ended[i]) return 0;
    return 1;
}

static void test_sample(mg_model *m, const mg_vocab *v) {
    mg_error err = {0};
    mg_sample_opts o;
    mg_sample_opts_default(&o);
    o.n = 21;
    o.batch = 8;
    o.seed = 1234;
    mg_samples s1, s2, s3, s4, s5;
    CHECK(mg_sample(m, v, &o, &s1, &err) == 0, "%s", err.message);
    CHECK(mg_sample(m, v, &o, &s2, &err) == 0, "%s", err.message);
    CHECK(same_samples(&s1, &s2), "same seed, different molecules");
    o.batch = 5;
    CHECK(mg_sample(m, v, &o, &s3, &err) == 0, "%s", err.message);
    CHECK(same_samples(&s1, &s3), "batch size changed the molecules");
    /* on T > 1 threads a KV run is T parts, one decoder and thread each
     * (sample.c): the molecules of one thread, for any split */
    for (int t = 2; t <= 3; t++) {
        mg_samples st;
        mg_model_set_threads(m, t);
        CHECK(mg_sample(m, v, &o, &st, &err) == 0, "%s", err.message);
        CHECK(same_samples(&s1, &st), "%d threads changed the molecules", t);
        mg_samples_free(&st);
    }
    mg_model_set_threads(m, 1);
    o.kind = MG_DECODE_NAIVE;
    CHECK(mg_sample(m, v, &o, &s4, &err) == 0, "%s", err.message);
    CHECK(same_samples(&s1, &s4), "naive and KV decoding sampled different molecules");
    o.kind = MG_DECODE_KV;
    o.seed = 99;
    CHECK(mg_sample(m, v, &o, &s5, &err) == 0, "%s", err.message);
    CHECK(!same_samples(&s1, &s5), "seeds 1234 and 99 gave the same molecules");
    size_t distinct = 0, ended = 0;
    for (size_t i = 0; i < s1.n; i++) {
        ended += s1.ended[i];
        int dup = 0;
        for (size_t j = 0; j < i; j++) dup |= !strcmp(s1.smiles[i], s1.smiles[j]);
        distinct += !dup;
        CHECK(s1.ntok[i] <= mg_model_get_config(m)->ctx_len, "ntok %d", s1.ntok[i]);
    }
    CHECK(distinct > 5, "only %zu distinct molecules of 21", distinct);
    CHECK(s1.truncated + ended == s1.n, "truncated %zu + ended %zu != n", s1.truncated, ended);
    printf("sampled 21 (seed 1234): %zu distinct, %zu ended by EOS; e.g. '%s'\n", distinct, ended,
           s1.smiles[0]);
    mg_samples_free(&s1);
    mg_samples_free(&s2);
    mg_samples_free(&s3);
    mg_samples_free(&s4);
    mg_samples_free(&s5);

    /* greedy: top-k 1 == temperature 0 == an argmax loop on the naive decoder */
    mg_samples g1, g2;
    o.n = 3;
    o.seed = 7;
    o.sampling.top_k = 1;
    CHECK(mg_sample(m, v, &o, &g1, &err) == 0, "%s", err.message);
    mg_sampling_default(&o.sampling);
    o.sampling.temperature = 0.0f;
    o.kind = MG_DECODE_NAIVE;
    o.seed = 8;
    CHECK(mg_sample(m, v, &o, &g2, &err) == 0, "%s", err.message);
    CHECK(same_samples(&g1, &g2), "top-k 1 differs from temperature 0");
    const mg_model_config *c = mg_model_get_config(m);
    mg_decoder *d = NULL;
    if (mg_decoder_new(m, MG_DECODE_NAIVE, 1, &d, &err) == 0) {
        float *lg = malloc((size_t)c->vocab_size * sizeof *lg);
        int32_t ids[64], tok = MG_BOS;
        int n = 0, ended_here = 0;
        mg_decoder_reset(d, 1, NULL);
        for (int pos = 0; pos < c->ctx_len; pos++) {
            if (mg_decoder_step(d, &tok, lg, &err)) break;
            int best = -1;
            for (int i = 0; i < c->vocab_size; i++)
                if (i != MG_PAD && i != MG_BOS && (best < 0 || lg[i] > lg[best])) best = i;
            if (best == MG_EOS) {
                ended_here = 1;
                break;
            }
            ids[n++] = best;
            tok = best;
        }
        char str[1024];
        mg_vocab_decode(v, ids, n, str, sizeof str, NULL, NULL);
        for (size_t i = 0; i < g1.n; i++) {
            CHECK(!strcmp(g1.smiles[i], str), "greedy molecule %zu '%s' vs argmax loop '%s'", i,
                  g1.smiles[i], str);
            CHECK(g1.ended[i] == ended_here, "greedy EOS flag");
        }
        printf("greedy molecule: '%s' (%s)\n", str, ended_here ? "EOS" : "no EOS by ctx_len");
        free(lg);
        mg_decoder_free(d);
    }
    mg_samples_free(&g1);
    mg_samples_free(&g2);

    /* errors */
    mg_samples e;
    mg_sample_opts_default(&o);
    o.n = 2;
    o.sampling.top_p = 2.0f;
    CHECK(mg_sample(m, v, &o, &e, &err) != 0 && e.smiles == NULL, "top-p 2 accepted");
    mg_sample_opts_default(&o);
    o.batch = 0;
    CHECK(mg_sample(m, v, &o, &e, &err) != 0, "batch 0 accepted");
    mg_sample_opts_default(&o);
    o.n = 0;
    CHECK(mg_sample(m, v, &o, &e, &err) == 0 && e.n == 0, "n = 0: %s", err.message);
    mg_samples_free(&e);
    /* bf16 with naive decoding (the CLI refuses the pair;
     * the engine API must too) is refused with nothing kept: no output and
     * no buffer left allocated (glibc's count of bytes in use is the same
     * before and after; under ASan, LeakSanitizer sees any leak at exit) */
    mg_sample_opts_default(&o);
    o.n = 3;
    o.batch = 2;
    o.kind = MG_DECODE_NAIVE;
    o.dtype = MG_DT_BF16;
    struct mallinfo2 mi = mallinfo2(); /* bytes in use: heap chunks + mmap'ed ones */
    const size_t before = mi.uordblks + mi.hblkhd;
    const mg_status rc = mg_sample(m, v, &o, &e, &err);
    mi = mallinfo2();
    const size_t after = mi.uordblks + mi.hblkhd;
    CHECK(rc == MG_ERR_ARG && strstr(err.message, "needs KV decoding") && e.smiles == NULL &&
              e.n == 0,
          "bf16 with naive decoding: rc %d '%s'", (int)rc, err.message);
    CHECK(after == before, "bf16 with naive decoding left %zd bytes allocated",
          (ptrdiff_t)(after - before));
}

static char *slurp(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *buf = malloc(1 << 16);
    size_t n = buf ? fread(buf, 1, (1 << 16) - 1, f) : 0;
    fclose(f);
    if (buf) buf[n] = '\0';
    return buf;
}

/* cmd_sample end to end: output file, determinism, exit codes. */
static void test_cmd(mg_model *m, const mg_vocab *v) {
    char dir[] = "/tmp/mg_test_sample_XXXXXX";
    if (!mkdtemp(dir)) {
        CHECK(0, "mkdtemp");
        return;
    }
    mg_error err = {0};
    char model[300], out1[300], out2[300];
    snprintf(model, sizeof model, "%s/m.safetensors", dir);
    snprintf(out1, sizeof out1, "%s/sub/a.smi", dir);
    snprintf(out2, sizeof out2, "%s/b.smi", dir);
    CHECK(mg_model_save(m, v, model, &err) == 0, "%s", err.message);
    /* an output in a directory that does not exist: refused before sampling */
    char *a0[] = {"sample", "--model", model, "-n", "3", "--out", out1, NULL};
    CHECK(cmd_sample((int)(sizeof a0 / sizeof *a0) - 1, a0) != 0, "output into a missing directory accepted");
    char sub[300];
    snprintf(sub, sizeof sub, "%s/sub", dir);
    CHECK(mkdir(sub, 0700) == 0, "mkdir %s", sub);
    char *a1[] = {"sample", "--model", model, "-n",      "13", "--seed",  "5",   "--out",
                  out1,     "--batch", "4",   "--top-k", "5",  "--top-p", "0.9", "--temperature",
                  "0.8",    NULL};
    CHECK(cmd_sample((int)(sizeof a1 / sizeof *a1) - 1, a1) == 0, "cmd_sample failed");
    char *a2[] = {"sample",   "--model",  model,     "-n",      "13",
                  "--seed=5", "--out",    out2,      "--batch", "13",
                  "--top-k",  "5",        "--top-p", "0.9",     "--temperature",
                  "0.8",      "--decode", "naive",   NULL};
    CHECK(cmd_sample((int)(sizeof a2 / sizeof *a2) - 1, a2) == 0, "cmd_sample (naive) failed");
    char *t1 = slurp(out1), *t2 = slurp(out2);
    CHECK(t1 && t2, "outputs missing");
    if (t1 && t2) {
        int lines = 0;
        for (const char *p = t1; *p; p++) lines += *p == '\n';
        CHECK(lines == 13, "%d lines, expected 13", lines);
        CHECK(!strcmp(t1, t2), "same seed, batch 4 kv vs batch 13 naive: different files");
    }
    free(t1);
    free(t2);
    fprintf(stderr, "(errors from molgen sample are expected next)\n");
    char *e1[] = {"sample", "-n", "3", NULL};
    CHECK(cmd_sample(3, e1) == 2, "missing --model");
    char *e2[] = {"sample", "--model", model, "--top-p", "0", NULL};
    CHECK(cmd_sample(5, e2) == 2, "top-p 0");
    char *e3[] = {"sample", "--model", model, "--bogus", NULL};
    CHECK(cmd_sample(4, e3) == 2, "unknown option");
    char *e4[] = {"sample", "--model", "/nonexistent/m.safetensors", "--out", out2, NULL};
    CHECK(cmd_sample(5, e4) == 1, "missing model file");
    char *e5[] = {"sample", "--model", model, "-n", NULL};
    CHECK(cmd_sample(4, e5) == 2, "-n without a value");
    char *e6[] = {"sample", "--model", model, "-n", "12x", NULL};
    CHECK(cmd_sample(5, e6) == 2, "-n 12x");
    char *e7[] = {"sample", "--model", model, "--decode", "fast", NULL};
    CHECK(cmd_sample(5, e7) == 2, "--decode fast");
    char *h[] = {"sample", "--help", NULL};
    CHECK(cmd_sample(2, h) == 0, "--help");
    remove(out1);
    remove(out2);
    remove(model);
    remove(sub);
    remove(dir);
}

/* mg_median and a tiny cmd_bench run (smoke: exit code only). */
static void test_bench(void) {
    double a[] = {5, 1, 4, 2, 3}, b[] = {4, 1, 3, 2}, c[] = {7};
    CHECK(mg_median(a, 5) == 3.0 && mg_median(b, 4) == 2.5 && mg_median(c, 1) == 7.0 &&
              mg_median(c, 0) == 0.0,
          "median");
    /* one thread: OpenMP + OpenBLAS thread pools spinning on a busy 2-core
     * machine make tiny parallel steps very slow */
    char *args[] = {"bench", "--threads",  "1", "--runs",    "1", "--warmup", "0", "--steps",
                    "1",     "--sample-n", "3", "--naive-n", "2", "--batch",  "2", "--ctx",
                    "6",     "--json",     NULL};
    CHECK(cmd_bench((int)(sizeof args / sizeof *args) - 1, args) == 0, "cmd_bench smoke run");
    char *bad[] = {"bench", "--runs", "0", NULL};
    CHECK(cmd_bench(3, bad) == 2, "--runs 0 accepted");
}

/* ---------------------------------------------------------------- constrained */

static const char *WILD_TOKENS[] = {"C", "c", "N", "O", "(", ")",  "1", "2",    "3",     "=",   "#",
                                    "n", "o", "s", "S", "F", "Cl", "-", "[nH]", "[NH+]", "[O-]"};

static void test_constrained(void) {
    mg_error err = {0};
    mg_vocab *v = NULL;
    CHECK(!mg_vocab_from_tokens(WILD_TOKENS, sizeof WILD_TOKENS / sizeof *WILD_TOKENS, &v, &err),
          "%s", err.message);
    mg_model_config c;
    mg_model_config_default(&c);
    c.n_layer = 1;
    c.d_model = 32;
    c.n_head = 2;
    c.ctx_len = 64;
    c.vocab_size = mg_vocab_size(v);
    mg_model *m = NULL;
    CHECK(!mg_model_create(&c, &m, &err), "%s", err.message);
    if (!m || !v) return;
    mg_model_init(m, 7);
    float *p = mg_model_params(m);
    for (size_t i = 0; i < mg_model_num_tensors(m); i++) {
        const mg_param_info *t = mg_model_tensor(m, i);
        if (t->ndim == 2)
            for (size_t j = 0; j < t->numel; j++) p[t->offset + j] *= 3.0f;
    }
    mg_model_set_threads(m, 1);
    mg_sample_opts o;
    mg_sample_opts_default(&o);
    o.n = 1500;
    o.seed = 5;
    o.method = MG_CONSTRAIN_MASK; /* a wild model: rejection would restart nearly every molecule */
    for (int level = MG_CONSTRAIN_NONE; level <= MG_CONSTRAIN_VALENCE; level++) {
        o.constrain = (mg_constrain)level;
        o.batch = 64;
        o.kind = MG_DECODE_KV;
        mg_samples s, s2;
        CHECK(!mg_sample(m, v, &o, &s, &err), "%s", err.message);
        size_t ok = 0, ended = 0, bad_ended = 0;
        char why[256];
        for (size_t i = 0; i < s.n; i++) {
            const int good = mg_smiles_syntax_ok(s.smiles[i], why, sizeof why);
            ok += good;
            ended += s.ended[i];
            if (s.ended[i] && !good && level != MG_CONSTRAIN_NONE && bad_ended++ < 3)
                fprintf(stderr, "constrain %s emitted '%s': %s\n",
                        mg_constrain_name((mg_constrain)level), s.smiles[i], why);
        }
        printf("constrain %-7s: %zu/%zu pass the SMILES check, %zu without EOS by ctx_len\n",
               mg_constrain_name((mg_constrain)level), ok, s.n, s.n - ended);
        if (level == MG_CONSTRAIN_NONE) {
            /* the oracle can fail: the wild model breaks most strings */
            CHECK(ok < s.n / 2, "unconstrained: %zu/%zu pass", ok, s.n);
        } else {
            CHECK(bad_ended == 0, "%zu molecules ended with a syntax error", bad_ended);
            CHECK(s.n - ended <= s.n / 50, "%zu of %zu without EOS", s.n - ended, s.n);
            /* a molecule's own stream: batch size and decoder change nothing */
            o.batch = 7;
            o.kind = MG_DECODE_NAIVE;
            o.n = 200;
            CHECK(!mg_sample(m, v, &o, &s2, &err), "%s", err.message);
            int same = 1;
            for (size_t i = 0; i < s2.n; i++) same &= !strcmp(s.smiles[i], s2.smiles[i]);
            CHECK(same, "constrain %s: batch 7 naive differs from batch 64 kv",
                  mg_constrain_name((mg_constrain)level));
            mg_samples_free(&s2);
            o.n = 1500;
        }
        mg_samples_free(&s);
    }
    mg_model_free(m);
    mg_vocab_free(v);

    /* nothing can start a string of "(" and ")": a clear error, no NaN */
    static const char *BRANCHES[] = {"(", ")"};
    CHECK(!mg_vocab_from_tokens(BRANCHES, 2, &v, &err), "%s", err.message);
    c.vocab_size = mg_vocab_size(v);
    c.ctx_len = 8;
    CHECK(!mg_model_create(&c, &m, &err), "%s", err.message);
    if (!m || !v) return;
    mg_model_init(m, 1);
    mg_model_set_threads(m, 1);
    o.n = 3;
    o.constrain = MG_CONSTRAIN_SYNTAX;
    mg_samples s;
    for (int t = 1; t <= 2; t++) { /* 2: the failure of one part is the run's */
        mg_model_set_threads(m, t);
        mg_status rc = mg_sample(m, v, &o, &s, &err);
        CHECK(rc == MG_ERR_STATE && strstr(err.message, "no token can follow") && !s.smiles,
              "%d threads: rc %d: %s", t, (int)rc, err.message);
    }
    mg_model_set_threads(m, 1);
    float lg[8] = {0, 0, 0, 0, 0};
    mg_token_mask *mask = NULL;
    CHECK(!mg_token_mask_new(v, 1, 8, MG_CONSTRAIN_VALENCE, &mask, &err), "%s", err.message);
    if (mask) {
        CHECK(mg_token_mask_apply(mask, 0, lg, 0) == 0, "a token allowed before any atom");
        for (int t = 0; t < mg_vocab_size(v); t++) CHECK(lg[t] == -INFINITY, "logit %d kept", t);
    }
    mg_token_mask_free(mask);
    CHECK(mg_token_mask_new(v, 1, 8, MG_CONSTRAIN_NONE, &mask, &err) == MG_ERR_ARG, "NONE mask");
    mg_model_free(m);
    mg_vocab_free(v);
}

int main(void) {
    mg_vocab *v = NULL;
    mg_model *m = make_model(&v, 24, 8.0f);
    CHECK(m != NULL, "model");
    if (m) {
        mg_model_set_threads(m, 2);
        test_kv_vs_naive(m);
        /* the rest on one thread: on a busy 2-core machine, spinning OpenMP
         * and OpenBLAS pools make many tiny parallel steps very slow */
        mg_model_set_threads(m, 1);
        test_token_choice();
        test_sample(m, v);
        test_cmd(m, v);
        test_bench();
        test_constrained();
    }
    /* A model as initialised (small logits) too, with 1 thread. */
    mg_vocab *v2 = NULL;
    mg_model *m2 = make_model(&v2, 10, 1.0f);
    if (m2) {
        mg_model_set_threads(m2, 1);
        mg_error err = {0};
        mg_decoder *a = NULL, *b = NULL;
        const int V = mg_model_get_config(m2)->vocab_size;
        float la[64], lb[64];
        int32_t tok = MG_BOS;
        double worst = 0;
        if (!mg_decoder_new(m2, MG_DECODE_NAIVE, 1, &a, &err) &&
            !mg_decoder_new(m2, MG_DECODE_KV, 1, &b, &err)) {
            mg_decoder_reset(a, 1, NULL);
            mg_decoder_reset(b, 1, NULL);
            for (int pos = 0; pos < 10; pos++) {
                CHECK(!mg_decoder_step(a, &tok, la, &err), "%s", err.message);
                CHECK(!mg_decoder_step(b, &tok, lb, &err), "%s", err.message);
                for (int i = 0; i < V; i++) {
                    double rel = fabs((double)la[i] - lb[i]) / fmax(1.0, fabs((double)la[i]));
                    if (rel > worst) worst = rel;
                }
                tok = 3 + pos % (V - 3);
            }
            CHECK(worst <= 1e-5, "1 thread, init-scale model: kv vs naive %.2e", worst);
        }
        mg_decoder_free(a);
        mg_decoder_free(b);
    }
    mg_model_free(m);
    mg_vocab_free(v);
    mg_model_free(m2);
    mg_vocab_free(v2);
    printf("test_sample: %d passed, %d failed\n", tu_pass, tu_fail);
    return tu_fail ? 1 : 0;
}
