/* molgen attention-map tests:
 *   - per-head statistics on hand-built weight matrices whose answers follow
 *     from the definitions (shifted identity: previous-token share 1,
 *     distance 1; uniform causal: distance L/4, shares 1/(i+1); all on BOS;
 *     ring-closure weight);
 *   - ring-closure pairing on "c1ccccc1", "C1CC2CCC12", "%10" labels, label
 *     reuse, bracket atoms with digits;
 *   - the SVG (well-formed start/end, escaped labels, one cell per visible
 *     weight);
 *   - cmd_attention end to end on a small saved model (files written, exit
 *     codes, unknown token named in the error). */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gen/attention_svg.h"
#include "commands.h"
#include "nn/model.h"
#include "chem/tokenizer.h"

#include "mg_test.h"
#define NEAR(a, b) (fabs((double)(a) - (double)(b)) <= 1e-6 * (1.0 + fabs((double)(b))))

/* Tokenise smiles into strings tok[i] (static storage), returns the count. */
static char tokbuf[128][MG_TOKEN_MAX + 1];
static const char *tokptr[128];
static int tokens_of(const char *smiles) {
    mg_span sp[128];
    int n = 0;
    if (mg_tokenize(smiles, sp, 128, &n, NULL, NULL)) return -1;
    for (int i = 0; i < n; i++) {
        snprintf(tokbuf[i], sizeof tokbuf[i], "%.*s", sp[i].len, smiles + sp[i].start);
        tokptr[i] = tokbuf[i];
    }
    return n;
}

static void test_ring_pairs(void) {
    CHECK(mg_is_ring_label("1", -1) && mg_is_ring_label("0", -1) && mg_is_ring_label("%10", -1) &&
              mg_is_ring_label("%99", 3),
          "labels");
    CHECK(!mg_is_ring_label("C", -1) && !mg_is_ring_label("%1", -1) &&
              !mg_is_ring_label("[nH]", -1) && !mg_is_ring_label("[13C]", -1) &&
              !mg_is_ring_label("", -1) && !mg_is_ring_label("%1a", -1),
          "non-labels");
    int pair[128];
    struct {
        const char *smiles;
        int closures;
        int expect[16]; /* pair per token, -2 terminates */
    } cases[] = {
        /* c 1 c c c c c 1 */
        {"c1ccccc1", 1, {-1, -1, -1, -1, -1, -1, -1, 1, -2}},
        /* C 1 C C 2 C C C 1 2 */
        {"C1CC2CCC12", 2, {-1, -1, -1, -1, -1, -1, -1, -1, 1, 4, -2}},
        /* C %10 C C C C C %10 */
        {"C%10CCCCC%10", 1, {-1, -1, -1, -1, -1, -1, -1, 1, -2}},
        /* C 1 C C 1 C 1 C C 1 : label reuse */
        {"C1CC1C1CC1", 2, {-1, -1, -1, -1, 1, -1, -1, -1, -1, 6, -2}},
        /* C %10 C C 1 C C %10 C C 1 : %10 and 1 interleaved */
        {"C%10CC1CC%10CC1", 2, {-1, -1, -1, -1, -1, -1, -1, 1, -1, -1, 4, -2}},
        /* [13CH3] c 1 c c [nH] c 1 : digits inside brackets are not labels */
        {"[13CH3]c1cc[nH]c1", 1, {-1, -1, -1, -1, -1, -1, -1, 2, -2}},
        /* C = 1 C C C C 1 : bond before a label */
        {"C=1CCCC1", 1, {-1, -1, -1, -1, -1, -1, -1, 2, -2}},
        {"CCO", 0, {-1, -1, -1, -2}},
    };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        int n = tokens_of(cases[c].smiles);
        CHECK(n > 0, "tokenise %s", cases[c].smiles);
        if (n <= 0) continue;
        int got = mg_ring_pairs(tokptr, n, pair);
        CHECK(got == cases[c].closures, "%s: %d closures, expected %d", cases[c].smiles, got,
              cases[c].closures);
        int m = 0;
        while (cases[c].expect[m] != -2) m++;
        CHECK(m == n, "%s: %d tokens, table has %d", cases[c].smiles, n, m);
        for (int i = 0; i < n && i < m; i++)
            CHECK(pair[i] == cases[c].expect[i], "%s token %d '%s': pair %d, expected %d",
                  cases[c].smiles, i, tokptr[i], pair[i], cases[c].expect[i]);
    }
}

static void test_stats(void) {
    enum { L = 7 };
    float w[L * L];
    mg_head_stats s;

    /* shifted identity: row 0 on itself (BOS), row i on i-1 */
    memset(w, 0, sizeof w);
    w[0] = 1;
    for (int i = 1; i < L; i++) w[i * L + i - 1] = 1;
    mg_head_stats_compute(w, L, 1, NULL, &s);
    CHECK(NEAR(s.mean_dist, 1.0), "shifted identity: distance %g", s.mean_dist);
    CHECK(NEAR(s.prev, 1.0), "shifted identity: prev %g", s.prev);
    CHECK(NEAR(s.bos, 1.0 / (L - 1)), "shifted identity: bos %g", s.bos);
    CHECK(s.ring_n == 0 && isnan(s.ring), "no ring key: ring %g n %d", s.ring, s.ring_n);
    CHECK(s.rows == L - 1, "rows %d", s.rows);
    CHECK(!strcmp(s.label, "previous-token"), "label %s", s.label);
    /* with row 0 included: row 0 has distance 0 and no previous token */
    mg_head_stats_compute(w, L, 0, NULL, &s);
    CHECK(NEAR(s.mean_dist, (double)(L - 1) / L) && NEAR(s.prev, (double)(L - 1) / L),
          "first 0: dist %g prev %g", s.mean_dist, s.prev);

    /* identity (each token on itself): distance 0, prev 0 -> n-gram/local */
    memset(w, 0, sizeof w);
    for (int i = 0; i < L; i++) w[i * L + i] = 1;
    mg_head_stats_compute(w, L, 1, NULL, &s);
    CHECK(NEAR(s.mean_dist, 0.0) && NEAR(s.prev, 0.0) && NEAR(s.bos, 0.0), "identity");
    CHECK(!strcmp(s.label, "n-gram/local"), "identity label %s", s.label);

    /* uniform causal: row i = 1/(i+1) on 0..i; distance of row i = i/2 */
    memset(w, 0, sizeof w);
    double dist = 0, prev = 0;
    for (int i = 0; i < L; i++)
        for (int j = 0; j <= i; j++) w[i * L + j] = 1.0f / (float)(i + 1);
    for (int i = 1; i < L; i++) {
        dist += i / 2.0;
        prev += 1.0 / (i + 1);
    }
    dist /= L - 1;
    prev /= L - 1;
    mg_head_stats_compute(w, L, 1, NULL, &s);
    CHECK(NEAR(s.mean_dist, dist) && NEAR(dist, L / 4.0), "uniform: distance %g expected %g",
          s.mean_dist, dist);
    CHECK(NEAR(s.prev, prev) && NEAR(s.bos, prev), "uniform: prev %g bos %g expected %g", s.prev,
          s.bos, prev);
    CHECK(NEAR(s.peak, prev) && NEAR(s.peak_uniform, prev), "uniform: peak %g", s.peak);
    CHECK(NEAR(s.dist_uniform, dist), "uniform: dist_uniform %g", s.dist_uniform);
    CHECK(!strcmp(s.label, "diffuse"), "uniform label %s", s.label);

    /* 0.45 on the previous token, 0.55 on itself: prev 0.45 -> previous-token */
    memset(w, 0, sizeof w);
    w[0] = 1;
    for (int i = 1; i < L; i++) w[i * L + i - 1] = 0.45f, w[i * L + i] = 0.55f;
    mg_head_stats_compute(w, L, 1, NULL, &s);
    CHECK(NEAR(s.prev, 0.45) && NEAR(s.mean_dist, 0.45), "prev 0.45: prev %g dist %g", s.prev,
          s.mean_dist);
    CHECK(!strcmp(s.label, "previous-token"), "prev 0.45 label %s", s.label);

    /* everything on BOS: distance mean(i) = L/2, label BOS-sink */
    memset(w, 0, sizeof w);
    for (int i = 0; i < L; i++) w[i * L] = 1;
    mg_head_stats_compute(w, L, 1, NULL, &s);
    CHECK(NEAR(s.mean_dist, L / 2.0) && NEAR(s.bos, 1.0), "BOS: dist %g bos %g", s.mean_dist,
          s.bos);
    CHECK(!strcmp(s.label, "BOS-sink"), "BOS label %s", s.label);

    /* far back: row i on key max(0, i-4) except the first rows -> long-range */
    memset(w, 0, sizeof w);
    w[0] = 1;
    for (int i = 1; i < L; i++) w[i * L + (i >= 4 ? i - 4 : i)] = 1;
    mg_head_stats_compute(w, L, 1, NULL, &s);
    CHECK(NEAR(s.mean_dist, 4.0 * 3 / 6), "far: %g", s.mean_dist);
    CHECK(!strcmp(s.label, "n-gram/local"), "far label %s", s.label);
    /* rows 1, 2 on themselves (distance 0); 3, 4, 5 three back; 6 five back:
     * mean (3 * 3 + 5) / 6 = 2.33, bos 1/6, prev 0 -> long-range */
    memset(w, 0, sizeof w);
    w[0] = 1;
    const int far_key[L] = {0, 1, 2, 0, 1, 2, 1};
    for (int i = 1; i < L; i++) w[i * L + far_key[i]] = 1;
    mg_head_stats_compute(w, L, 1, NULL, &s);
    CHECK(NEAR(s.mean_dist, 14.0 / 6.0) && NEAR(s.bos, 1.0 / 6) && NEAR(s.prev, 0.0), "far2: %g",
          s.mean_dist);
    CHECK(!strcmp(s.label, "long-range"), "far2 label %s", s.label);

    /* ring closure: BOS c 1 c c c c c 1 (positions 0..8), the closing '1' at
     * position 8 puts 0.75 on the opening '1' at position 2 */
    const int n = tokens_of("c1ccccc1");
    CHECK(n == 8, "tokens %d", n);
    int pair[8], key[9];
    mg_ring_pairs(tokptr, n, pair);
    key[0] = -1;
    for (int i = 0; i < n; i++) key[i + 1] = pair[i] >= 0 ? pair[i] + 1 : -1;
    CHECK(key[8] == 2, "ring key of position 8: %d", key[8]);
    enum { L2 = 9 };
    float w2[L2 * L2];
    memset(w2, 0, sizeof w2);
    w2[0] = 1;
    for (int i = 1; i < L2; i++) w2[i * L2 + i - 1] = 1; /* previous token ... */
    w2[8 * L2 + 7] = 0.25f;                              /* ... except the closing digit */
    w2[8 * L2 + 2] = 0.75f;
    mg_head_stats_compute(w2, L2, 1, key, &s);
    CHECK(s.ring_n == 1 && NEAR(s.ring, 0.75), "ring: %g over %d", s.ring, s.ring_n);
    CHECK(!strcmp(s.label, "ring-closure"), "ring label %s", s.label);
    CHECK(NEAR(s.prev, (7 + 0.25) / 8.0), "ring prev %g", s.prev);
    CHECK(NEAR(s.mean_dist, (7 + 0.25 + 0.75 * 6) / 8.0), "ring dist %g", s.mean_dist);
    /* two closures averaged: C1CC2CCC12 with weight 1 / 0.5 on the openers */
    const int n3 = tokens_of("C1CC2CCC12");
    int pair3[16], key3[17];
    mg_ring_pairs(tokptr, n3, pair3);
    key3[0] = -1;
    for (int i = 0; i < n3; i++) key3[i + 1] = pair3[i] >= 0 ? pair3[i] + 1 : -1;
    const int L3 = n3 + 1;
    float *w3 = calloc((size_t)L3 * L3, sizeof *w3);
    for (int i = 0; i < L3; i++) w3[i * L3] = 1;
    w3[9 * L3] = 0;
    w3[9 * L3 + 2] = 1.0f; /* closing 1 (position 9) -> opening 1 (position 2) */
    w3[10 * L3] = 0.5f;
    w3[10 * L3 + 5] = 0.5f; /* closing 2 (position 10) -> opening 2 (position 5) */
    mg_head_stats_compute(w3, L3, 1, key3, &s);
    CHECK(s.ring_n == 2 && NEAR(s.ring, 0.75), "two rings: %g over %d", s.ring, s.ring_n);
    free(w3);
}

static void test_svg(void) {
    const char *labels[4] = {"<bos>", "C", "1", "&"};
    float w[2 * 1 * 4 * 4];
    memset(w, 0, sizeof w);
    for (int l = 0; l < 2; l++)
        for (int i = 0; i < 4; i++)
            for (int j = 0; j <= i; j++) w[l * 16 + i * 4 + j] = 1.0f / (float)(i + 1);
    mg_head_stats st[2];
    for (int l = 0; l < 2; l++) mg_head_stats_compute(w + l * 16, 4, 1, NULL, &st[l]);
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    CHECK(f != NULL, "open_memstream");
    if (!f) return;
    CHECK(mg_attention_svg(f, w, 2, 1, 4, labels, "t <x>", st) == 0, "svg");
    fclose(f);
    CHECK(len > 100 && !strncmp(buf, "<?xml", 5), "svg start");
    CHECK(strstr(buf, "</svg>\n") != NULL, "svg end");
    CHECK(strstr(buf, "&lt;bos&gt;") != NULL && strstr(buf, "&amp;") != NULL, "escaped labels");
    CHECK(strstr(buf, "<bos>") == NULL, "unescaped label");
    CHECK(strstr(buf, "t &lt;x&gt;") != NULL, "title");
    /* one rect with a <title> per visible (lower-triangle) weight: 2 x 10 */
    int cells = 0;
    for (const char *p = buf; (p = strstr(p, "<title>")); p++) cells++;
    CHECK(cells == 20, "cells %d", cells);
    CHECK(strstr(buf, "layer 1 head 0") != NULL, "panel title");
    free(buf);
}

static void test_cmd(void) {
    char dir[] = "/tmp/mg_test_attention_XXXXXX";
    if (!mkdtemp(dir)) {
        CHECK(0, "mkdtemp");
        return;
    }
    const char *toks[] = {"C", "c", "1", "2", "(", ")", "O", "N", "=", "n"};
    mg_error err = {0};
    char model[256], out[256], path[300];
    mg_vocab *v = NULL;
    mg_model *m = NULL;
    CHECK(mg_vocab_from_tokens(toks, 10, &v, &err) == 0, "%s", err.message);
    mg_model_config c;
    mg_model_config_default(&c);
    c.n_layer = 2;
    c.d_model = 16;
    c.n_head = 2;
    c.ctx_len = 16;
    c.vocab_size = mg_vocab_size(v);
    CHECK(mg_model_create(&c, &m, &err) == 0, "%s", err.message);
    if (!m || !v) return;
    mg_model_init(m, 3);
    snprintf(model, sizeof model, "%s/m.safetensors", dir);
    snprintf(out, sizeof out, "%s/maps", dir);
    CHECK(mg_model_save(m, v, model, &err) == 0, "%s", err.message);
    char *argv1[] = {"attention", "--model", model, "--smiles", "c1ccccc1O", "--out", out, NULL};
    CHECK(cmd_attention(7, argv1) == 0, "cmd_attention failed");
    snprintf(path, sizeof path, "%s/attention.svg", out);
    CHECK(access(path, R_OK) == 0, "%s missing", path);
    snprintf(path, sizeof path, "%s/attention_heads.tsv", out);
    FILE *f = fopen(path, "r");
    CHECK(f != NULL, "%s missing", path);
    if (f) {
        int lines = 0, ch;
        while ((ch = fgetc(f)) != EOF) lines += ch == '\n';
        fclose(f);
        CHECK(lines == 1 + 2 * 2, "tsv lines %d", lines);
    }
    fprintf(stderr,
            "(an error about an unknown token and a too-long molecule are expected next)\n");
    char *argv2[] = {"attention", "--model", model, "--smiles", "c1ccccc1Cl", "--out", out, NULL};
    CHECK(cmd_attention(7, argv2) != 0, "unknown token accepted");
    char *argv3[] = {"attention", "--model", model, "--smiles", "CCCCCCCCCCCCCCCCCCCC",
                     "--out",     out,       NULL};
    CHECK(cmd_attention(7, argv3) != 0, "too long accepted");
    char *argv4[] = {"attention", "--model", model, NULL};
    CHECK(cmd_attention(3, argv4) == 2, "missing --smiles");
    char *argv5[] = {"attention", "--help", NULL};
    CHECK(cmd_attention(2, argv5) == 0, "--help");
    /* clean up */
    snprintf(path, sizeof path, "%s/attention.svg", out);
    remove(path);
    snprintf(path, sizeof path, "%s/attention_heads.tsv", out);
    remove(path);
    remove(out);
    remove(model);
    remove(dir);
    mg_model_free(m);
    mg_vocab_free(v);
}

int main(void) {
    test_ring_pairs();
    test_stats();
    test_svg();
    test_cmd();
    printf("test_attention: %d passed, %d failed\n", tu_pass, tu_fail);
    return tu_fail ? 1 : 0;
}
