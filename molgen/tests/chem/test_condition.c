/* molgen conditioning (condition.h): the statistics against hand-computed
 * values, dropping rates, sampling requests and their refusals, the
 * metadata through JSON and model files, the KV decoder against the full
 * forward with the same conditions, the conditions as per-call inputs (a
 * call leaves none on the model; the sampler does not change its caller's
 * model) and their refusals. The gradients of cond.weight and
 * cond.missing are test_model.c's finite-difference check. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "chem/condition.h"
#include "gen/kv_decode.h"
#include "nn/model.h"
#include "gen/sample.h"

#include "mg_test.h"

static void test_names(void) {
    mg_cond_info c;
    mg_error err;
    CHECK(mg_cond_parse_names("logp, qed,sas", &c, &err) == 0, "%s", err.message);
    CHECK(c.K == 3 && !strcmp(c.names[0], "logp") && !strcmp(c.names[1], "qed") &&
              !strcmp(c.names[2], "sas"),
          "names %d", c.K);
    mg_cond_info_free(&c);
    CHECK(mg_cond_parse_names("a,,b", &c, &err) == MG_ERR_ARG, "empty name accepted");
    CHECK(mg_cond_parse_names("a,b,a", &c, &err) == MG_ERR_ARG && strstr(err.message, "twice"),
          "repeated name accepted");
    CHECK(mg_cond_parse_names("", &c, &err) == MG_ERR_ARG, "empty list accepted");
}

/* mean, sample std, range and percentiles of a column with a missing value,
 * against values computed by hand. */
static void test_stats_and_json(void) {
    mg_cond_info c;
    mg_error err;
    CHECK(mg_cond_parse_names("x,y", &c, &err) == 0, "%s", err.message);
    /* x: 1 2 3 4 (NaN); y: 10 10 10 20 30 */
    const float v[] = {1, 10, 2, 10, NAN, 10, 3, 20, 4, 30};
    CHECK(mg_cond_stats(&c, v, 5, &err) == 0, "%s", err.message);
    CHECK(fabs(c.mean[0] - 2.5) < 1e-12 && fabs(c.std[0] - sqrt(5.0 / 3.0)) < 1e-12,
          "x mean %g std %g", c.mean[0], c.std[0]);
    CHECK(fabs(c.mean[1] - 16.0) < 1e-12 && fabs(c.std[1] - sqrt(320.0 / 4.0)) < 1e-12,
          "y mean %g std %g", c.mean[1], c.std[1]);
    CHECK(c.min[0] == 1 && c.max[0] == 4 && c.min[1] == 10 && c.max[1] == 30, "ranges");
    float w[10];
    memcpy(w, v, sizeof w);
    mg_cond_normalise(&c, w, 5);
    CHECK(fabsf(w[0] - (float)((1 - 2.5) / sqrt(5.0 / 3.0))) < 1e-6 && isnan(w[4]),
          "normalised %g", (double)w[0]);
    char *j = mg_cond_info_to_json(&c);
    CHECK(j != NULL, "to_json");
    mg_cond_info d;
    CHECK(mg_cond_info_from_json(j, &d, &err) == 0, "%s", err.message);
    int same = d.K == 2;
    for (int k = 0; same && k < 2; k++)
        same = !strcmp(d.names[k], c.names[k]) && d.mean[k] == c.mean[k] && d.std[k] == c.std[k] &&
               d.min[k] == c.min[k] && d.max[k] == c.max[k] && d.p01[k] == c.p01[k] &&
               d.p99[k] == c.p99[k];
    CHECK(same, "JSON round trip changed the statistics: %s", j);
    free(j);
    mg_cond_info_free(&d);
    const float constant[] = {5, 1, 5, 2, 5, 3};
    CHECK(mg_cond_stats(&c, constant, 3, &err) == MG_ERR_ARG && strstr(err.message, "constant"),
          "a constant column accepted");
    mg_cond_info_free(&c);
    CHECK(mg_cond_info_from_json("{\"names\":[\"a\"],\"mean\":[0],\"std\":[0],\"min\":[0],"
                                 "\"max\":[1],\"p01\":[0],\"p99\":[1]}",
                                 &d, &err) == MG_ERR_FORMAT,
          "std 0 accepted");
    CHECK(mg_cond_info_from_json("{\"names\":[\"a\"],\"mean\":[0,1],\"std\":[1],\"min\":[0],"
                                 "\"max\":[1],\"p01\":[0],\"p99\":[1]}",
                                 &d, &err) == MG_ERR_FORMAT,
          "wrong length accepted");
}

/* Dropping: none at 0, all at 1, a binomial share at 0.3. */
static void test_batch(void) {
    enum { B = 1000, K = 4 };
    float *v = malloc(sizeof(float) * B * K), *out = malloc(sizeof(float) * B * K);
    size_t rows[B];
    for (int i = 0; i < B * K; i++) v[i] = (float)i;
    for (int b = 0; b < B; b++) rows[b] = (size_t)(B - 1 - b);
    mg_cond_batch(v, K, rows, B, 0.0, 7, out);
    int ok = 1;
    for (int b = 0; b < B; b++)
        for (int k = 0; k < K; k++) ok &= out[b * K + k] == v[rows[b] * K + k];
    CHECK(ok, "drop 0 must copy the rows");
    mg_cond_batch(v, K, rows, B, 1.0, 7, out);
    ok = 1;
    for (int i = 0; i < B * K; i++) ok &= isnan(out[i]);
    CHECK(ok, "drop 1 must drop everything");
    mg_cond_batch(v, K, rows, B, 0.3, 7, out);
    int dropped[K] = {0};
    ok = 1;
    for (int b = 0; b < B; b++)
        for (int k = 0; k < K; k++) {
            if (isnan(out[b * K + k]))
                dropped[k]++;
            else
                ok &= out[b * K + k] == v[rows[b] * K + k];
        }
    CHECK(ok, "kept values changed");
    /* binomial(1000, 0.3): sd 14.5; 5 sd */
    for (int k = 0; k < K; k++)
        CHECK(abs(dropped[k] - 300) <= 73, "condition %d dropped %d of 1000 at p = 0.3", k,
              dropped[k]);
    float out2[8];
    mg_cond_batch(v, K, rows, 2, 0.5, 8, out);
    mg_cond_batch(v, K, rows, 2, 0.5, 8, out2);
    CHECK(!memcmp(out, out2, sizeof out2), "the drops depend on the seed only");
    free(v);
    free(out);
}

static void test_request(void) {
    mg_cond_info c;
    mg_error err;
    CHECK(mg_cond_parse_names("logp,qed", &c, &err) == 0, "%s", err.message);
    c.mean[0] = 2.0, c.std[0] = 0.5, c.min[0] = -3, c.max[0] = 6, c.p01[0] = 0, c.p99[0] = 4;
    c.mean[1] = 0.7, c.std[1] = 0.1, c.min[1] = 0.2, c.max[1] = 0.95, c.p01[1] = 0.4,
    c.p99[1] = 0.9;
    float v[2];
    char warn[512];
    CHECK(mg_cond_request(&c, "logp=3", v, warn, sizeof warn, &err) == 0, "%s", err.message);
    CHECK(fabsf(v[0] - 2.0f) < 1e-6f && isnan(v[1]) && !warn[0], "logp=3 -> %g %g '%s'",
          (double)v[0], (double)v[1], warn);
    CHECK(mg_cond_request(&c, "qed=0.5, logp=1", v, warn, sizeof warn, &err) == 0, "%s",
          err.message);
    CHECK(fabsf(v[0] + 2.0f) < 1e-6f && fabsf(v[1] + 2.0f) < 1e-5f, "%g %g", (double)v[0],
          (double)v[1]);
    CHECK(mg_cond_request(&c, "logp=5", v, warn, sizeof warn, &err) == 0 &&
              strstr(warn, "rare") && strstr(warn, "[0, 4]"),
          "no warning for a rare value: '%s'", warn);
    CHECK(mg_cond_request(&c, "tpsa=50", v, warn, sizeof warn, &err) == MG_ERR_ARG &&
              strstr(err.message, "tpsa") && strstr(err.message, "logp, qed"),
          "unknown name: %s", err.message);
    CHECK(mg_cond_request(&c, "logp=7", v, warn, sizeof warn, &err) == MG_ERR_ARG &&
              strstr(err.message, "[-3, 6]"),
          "outside the range: %s", err.message);
    CHECK(mg_cond_request(&c, "logp=1,logp=2", v, warn, sizeof warn, &err) == MG_ERR_ARG,
          "twice accepted");
    CHECK(mg_cond_request(&c, "logp=x", v, warn, sizeof warn, &err) == MG_ERR_ARG,
          "not a number accepted");
    CHECK(mg_cond_request(&c, "logp=nan", v, warn, sizeof warn, &err) == MG_ERR_ARG,
          "nan accepted");
    CHECK(mg_cond_request(&c, "logp", v, warn, sizeof warn, &err) == MG_ERR_ARG,
          "no value accepted");
    mg_cond_info_free(&c);
}

static mg_model *cond_model(int cond_bos) {
    mg_model_config c;
    memset(&c, 0, sizeof c);
    c.n_layer = 2, c.d_model = 16, c.n_head = 2, c.ctx_len = 10, c.vocab_size = 9;
    c.n_cond = 2, c.cond_bos = cond_bos;
    mg_model *m = NULL;
    mg_error err;
    if (mg_model_create(&c, &m, &err)) {
        fprintf(stderr, "create: %s\n", err.message);
        exit(2);
    }
    mg_model_init(m, 3);
    /* embeddings of O(1), so that a condition moves the logits visibly */
    float *p = mg_model_params(m);
    uint64_t s = 5;
    for (size_t i = 0; i < mg_model_num_params(m); i++)
        p[i] += (float)((double)(mg_splitmix64(&s) >> 11) * 0x1.0p-53 - 0.5) * 0.6f;
    return m;
}

/* The KV decoder adds the same embedding as the full forward. */
static void test_decoder(int cond_bos) {
    mg_model *m = cond_model(cond_bos);
    mg_error err;
    const int L = 10, V = 9;
    int32_t ids[10] = {MG_BOS, 3, 4, 5, 6, 7, 8, 3, 4, 5};
    float full[10 * 9], base[10 * 9], step[9];
    const float cv[2] = {1.5f, NAN};
    CHECK(mg_model_logits(m, &(mg_batch){.ids = ids, .B = 1, .T = L}, base, NULL, &err) == 0, "%s",
          err.message);
    CHECK(mg_model_logits(m, &(mg_batch){.ids = ids, .B = 1, .T = L, .cond = cv, .cond_rows = 1},
                          full, NULL, &err) == 0,
          "%s", err.message);
    double moved = 0;
    for (int i = 0; i < L * V; i++) moved = fmax(moved, fabs(full[i] - base[i]));
    CHECK(moved > 1e-2, "a condition did not move the logits (%g)", moved);
    mg_kv_decoder *d = NULL;
    CHECK(mg_kv_new(m, 1, 0, &d, &err) == 0 && mg_kv_set_conditions(d, cv, 1, &err) == 0 &&
              mg_kv_reset(d, 1, &err) == 0,
          "%s", err.message);
    double worst = 0;
    for (int t = 0; t < L; t++) {
        CHECK(mg_kv_step(d, &ids[t], step, &err) == 0, "%s", err.message);
        for (int v = 0; v < V; v++) worst = fmax(worst, fabs(step[v] - full[t * V + v]));
    }
    CHECK(worst < 1e-4, "cond_bos %d: KV logits differ from the forward's by %g", cond_bos, worst);
    printf("KV decoder vs forward with a condition (cond_bos %d): max diff %.2e (the condition "
           "moves the logits by up to %.2e)\n",
           cond_bos, worst, moved);
    /* 3 condition rows for a decoder of 1 */
    const float cv3[6] = {0, 0, 1, 1, NAN, NAN};
    CHECK(mg_kv_set_conditions(d, cv3, 3, &err) == MG_ERR_ARG,
          "3 condition rows for a KV decoder of 1 accepted");
    mg_kv_free(d);
    /* the causal-leak guard passes a conditional model */
    CHECK(mg_model_causal_guard(m, 1, &err) == 0, "guard: %s", err.message);
    /* conditions given for 3 rows, a forward of 2 */
    int32_t two[20];
    memcpy(two, ids, sizeof ids);
    memcpy(two + 10, ids, sizeof ids);
    float lg2[2 * 10 * 9];
    CHECK(mg_model_logits(m, &(mg_batch){.ids = two, .B = 2, .T = L, .cond = cv3, .cond_rows = 3},
                          lg2, NULL, &err) == MG_ERR_ARG,
          "3 condition rows for a batch of 2 accepted");
    const float inf[2] = {INFINITY, 0};
    CHECK(mg_model_logits(m, &(mg_batch){.ids = two, .B = 2, .T = L, .cond = inf, .cond_rows = 1},
                          lg2, NULL, &err) == MG_ERR_ARG,
          "an infinite value accepted");
    CHECK(mg_model_logits(m, &(mg_batch){.ids = two, .B = 2, .T = L, .cond = cv3, .cond_rows = -1},
                          lg2, NULL, &err) == MG_ERR_ARG,
          "-1 condition rows accepted");
    /* the conditions are the call's: a forward of 3 rows with them, after
     * the refusals, gives the 3-row forward before them (it read past a
     * shrunk buffer once: ASan), and a call without them the base logits */
    int32_t three[30];
    for (int b = 0; b < 3; b++) memcpy(three + 10 * b, ids, sizeof ids);
    float lg3[3 * 10 * 9], lg3b[3 * 10 * 9];
    const mg_batch b3 = {.ids = three, .B = 3, .T = L, .cond = cv3, .cond_rows = 3};
    CHECK(mg_model_logits(m, &b3, lg3, NULL, &err) == 0, "%s", err.message);
    CHECK(mg_model_logits(m, &(mg_batch){.ids = two, .B = 2, .T = L, .cond = inf, .cond_rows = 1},
                          lg2, NULL, &err) == MG_ERR_ARG,
          "an infinite value accepted");
    CHECK(mg_model_logits(m, &b3, lg3b, NULL, &err) == 0, "%s", err.message);
    CHECK(!memcmp(lg3, lg3b, sizeof lg3),
          "the call after a refused one differs from the call before it");
    CHECK(mg_model_logits(m, &(mg_batch){.ids = ids, .B = 1, .T = L}, full, NULL, &err) == 0, "%s",
          err.message);
    CHECK(!memcmp(full, base, sizeof base), "an earlier call's conditions stayed on the model");
    mg_model_free(m);
}

/* A conditional model's file keeps n_cond, cond_bos and the metadata; one
 * without the metadata is refused; an unconditional config has no trace. */
static void test_files(void) {
    mg_model *m = cond_model(1), *m2 = NULL;
    mg_error err;
    char path[256];
    snprintf(path, sizeof path, "/tmp/molgen_test_condition_%d.safetensors", (int)getpid());
    const char *meta = "{\"names\":[\"a\",\"b\"],\"mean\":[0.5,1],\"std\":[2,3],\"min\":[-1,0],"
                       "\"max\":[1,2],\"p01\":[-0.9,0.1],\"p99\":[0.9,1.9]}";
    CHECK(mg_model_save(m, NULL, path, &err) == 0, "%s", err.message);
    CHECK(mg_model_load(path, 0, &m2, NULL, NULL, &err) == MG_ERR_FORMAT,
          "a conditional model without its condition metadata loaded");
    CHECK(mg_model_set_condition_meta(m, meta, &err) == 0, "%s", err.message);
    CHECK(mg_model_save(m, NULL, path, &err) == 0, "%s", err.message);
    CHECK(mg_model_load(path, 0, &m2, NULL, NULL, &err) == 0, "%s", err.message);
    if (m2) {
        const mg_model_config *c = mg_model_get_config(m2);
        CHECK(c->n_cond == 2 && c->cond_bos == 1, "config %d %d", c->n_cond, c->cond_bos);
        CHECK(mg_model_condition_meta(m2) && !strcmp(mg_model_condition_meta(m2), meta),
              "metadata changed");
        CHECK(mg_model_num_params(m2) == mg_model_num_params(m) &&
                  !memcmp(mg_model_params(m2), mg_model_params(m),
                          mg_model_num_params(m) * sizeof(float)),
              "parameters changed");
        CHECK(mg_model_find_tensor(m2, "cond.weight") && mg_model_find_tensor(m2, "cond.missing"),
              "cond tensors");
    }
    mg_model_free(m2);
    unlink(path);
    mg_model_free(m);
    mg_model_config u;
    memset(&u, 0, sizeof u);
    u.n_layer = 1, u.d_model = 8, u.n_head = 2, u.ctx_len = 4, u.vocab_size = 6;
    char js[512];
    mg_model_config_to_json(&u, js, sizeof js);
    CHECK(!strstr(js, "cond"), "an unconditional config mentions conditions: %s", js);
    mg_model *um = NULL;
    CHECK(mg_model_create(&u, &um, &err) == 0, "%s", err.message);
    CHECK(um && !mg_model_find_tensor(um, "cond.weight"), "cond tensors in an unconditional model");
    const float one = 1.0f;
    int32_t uid[2] = {MG_BOS, MG_NUM_SPECIAL};
    float ulg[2 * 6];
    CHECK(um && mg_model_logits(
                    um, &(mg_batch){.ids = uid, .B = 1, .T = 2, .cond = &one, .cond_rows = 1}, ulg,
                    NULL, &err) == MG_ERR_ARG,
          "conditions given to an unconditional model accepted");
    mg_model_free(um);
}

/* Classifier-free guidance in mg_sample (greedy) against a greedy loop over
 * mg_model_logits with the mixing done here: u + w (c - u). */
static void test_guidance(void) {
    mg_model *m = cond_model(0);
    mg_error err;
    const char *toks[6] = {"C", "N", "O", "c", "1", "("};
    mg_vocab *voc = NULL;
    CHECK(mg_vocab_from_tokens(toks, 6, &voc, &err) == 0, "%s", err.message);
    const float cv[2] = {1.0f, -0.5f}, none[2] = {NAN, NAN};
    const float w = 2.5f;
    const int L = 10, V = 9;
    int32_t ids[11] = {MG_BOS}; /* BOS + up to ctx_len generated tokens */
    float lc[10 * 9], lu[10 * 9], mix[9];
    int n = 1;
    char want[64] = "";
    for (; n <= L; n++) { /* the first n ids predict ids[n] */
        CHECK(mg_model_logits(m,
                              &(mg_batch){.ids = ids, .B = 1, .T = n, .cond = cv, .cond_rows = 1},
                              lc, NULL, &err) == 0 &&
                  mg_model_logits(
                      m, &(mg_batch){.ids = ids, .B = 1, .T = n, .cond = none, .cond_rows = 1}, lu,
                      NULL, &err) == 0,
              "%s", err.message);
        for (int v = 0; v < V; v++) {
            const float u = lu[(n - 1) * V + v], c = lc[(n - 1) * V + v];
            mix[v] = u + w * (c - u);
        }
        ids[n] = mg_argmax_token(mix, V);
        if (ids[n] == MG_EOS) break;
    } /* n - 1 tokens before EOS, or ctx_len of them */
    CHECK(mg_vocab_decode(voc, ids + 1, n - 1, want, sizeof want, NULL, &err) == 0, "%s",
          err.message);
    /* the sampler leaves its caller's model as it was: a plain call after
     * the conditional samples gives the logits of one before them */
    float before[10 * 9], after[10 * 9];
    const int32_t probe[10] = {MG_BOS, 3, 4, 5, 6, 7, 8, 3, 4, 5};
    CHECK(mg_model_logits(m, &(mg_batch){.ids = probe, .B = 1, .T = L}, before, NULL, &err) == 0,
          "%s", err.message);
    const size_t np = mg_model_num_params(m);
    float *params0 = malloc(np * sizeof *params0);
    memcpy(params0, mg_model_params(m), np * sizeof *params0);
    for (int kind = 0; kind < 2; kind++) {
        mg_sample_opts o;
        mg_sample_opts_default(&o);
        o.n = 3;
        o.batch = 2;
        o.kind = kind ? MG_DECODE_KV : MG_DECODE_NAIVE;
        o.sampling.temperature = 0;
        o.condition = cv;
        o.guidance = w;
        mg_samples s;
        CHECK(mg_sample(m, voc, &o, &s, &err) == 0, "%s", err.message);
        for (size_t i = 0; i < s.n; i++)
            CHECK(!strcmp(s.smiles[i], want), "%s decoding, guided greedy molecule %zu: '%s', the "
                  "oracle's '%s'", mg_decode_kind_name(o.kind), i, s.smiles[i], want);
        mg_samples_free(&s);
        o.guidance = 1.0f; /* plain conditional: differs here */
        CHECK(mg_sample(m, voc, &o, &s, &err) == 0, "%s", err.message);
        if (kind) printf("guided greedy molecule '%s', unguided '%s'\n", want, s.smiles[0]);
        mg_samples_free(&s);
    }
    CHECK(mg_model_logits(m, &(mg_batch){.ids = probe, .B = 1, .T = L}, after, NULL, &err) == 0 &&
              !memcmp(before, after, sizeof before),
          "sampling with a condition changed the caller's model");
    CHECK(!memcmp(params0, mg_model_params(m), np * sizeof *params0),
          "sampling changed the caller's parameters");
    free(params0);
    mg_vocab_free(voc);
    mg_model_free(m);
}

int main(void) {
    test_names();
    test_stats_and_json();
    test_batch();
    test_request();
    test_decoder(0);
    test_decoder(1);
    test_files();
    test_guidance();
    printf("test_condition: %d checks passed, %d failed\n", tu_pass, tu_fail);
    return tu_fail ? 1 : 0;
}
