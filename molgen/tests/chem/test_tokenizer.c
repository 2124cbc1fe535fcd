/* Tests for molgen/chem/tokenizer.{h,c}: scanner, errors, vocabulary, JSON, and
 * the three shared corpora (every line tokenises and round-trips). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chem/tokenizer.h"

#include "mg_test.h"

/* Tokenise s and compare with the expected space-separated token list. */
static void expect_tokens(const char *s, const char *expected) {
    mg_span sp[256];
    int n = -1;
    mg_error err = {0};
    int rc = mg_tokenize(s, sp, 256, &n, NULL, &err);
    if (rc != 0) {
        fprintf(stderr, "tokenize(%s) failed: %s\n", s, err.message);
        tu_fail++;
        return;
    }
    char got[2048] = "";
    size_t o = 0;
    for (int i = 0; i < n; i++)
        o += (size_t)snprintf(got + o, sizeof got - o, "%s%.*s", i ? " " : "", sp[i].len,
                              s + sp[i].start);
    if (strcmp(got, expected) != 0) {
        fprintf(stderr, "tokenize(%s):\n  got      %s\n  expected %s\n", s, got, expected);
        tu_fail++;
    }
}

static void expect_error(const char *s, int code, int pos, const char *needle) {
    mg_span sp[64];
    int n = -1, ep = -1;
    mg_error err = {0};
    int rc = mg_tokenize(s, sp, 64, &n, &ep, &err);
    if (rc != code || (code == MG_ERR_TOKEN && ep != pos) ||
        (needle && !strstr(err.message, needle))) {
        fprintf(stderr,
                "tokenize(\"%s\"): rc %d pos %d err.message '%s'; expected rc %d pos %d '%s'\n", s,
                rc, ep, err.message, code, pos, needle ? needle : "");
        tu_fail++;
    }
}

static void test_scanner(void) {
    expect_tokens("CC(=O)Nc1ccc(Cl)cc1Br", "C C ( = O ) N c 1 c c c ( Cl ) c c 1 Br");
    expect_tokens("[nH]1cccc1", "[nH] 1 c c c c 1");
    expect_tokens("C[C@@H](N)C(=O)[O-]", "C [C@@H] ( N ) C ( = O ) [O-]");
    expect_tokens("[NH3+]CC", "[NH3+] C C");
    expect_tokens("C%10CC%10", "C %10 C C %10");
    expect_tokens("c1ccc2c(c1)%99", "c 1 c c c 2 c ( c 1 ) %99");
    expect_tokens("F/C=C\\F", "F / C = C \\ F");
    expect_tokens("C#N.O", "C # N . O");
    expect_tokens("BrB", "Br B");
    expect_tokens("ClC", "Cl C");
    expect_tokens("CCl", "C Cl"); /* "Cl" wins over "C" + "l" */
    expect_tokens("Bc", "B c");
    expect_tokens("*C$C~C", "* C $ C ~ C");
    expect_tokens("<>?@+-:", "< > ? @ + - :");
    expect_tokens("[2H][13C@H]", "[2H] [13C@H]");
    expect_tokens("", "");

    /* counting only, and the capacity error */
    int n = -1;
    CHECK(mg_tokenize("CCO", NULL, 0, &n, NULL, NULL) == MG_ERR_TOO_LONG && n == 3);
    mg_span sp[2];
    CHECK(mg_tokenize("CCO", sp, 2, &n, NULL, NULL) == MG_ERR_TOO_LONG && n == 3);
    CHECK(sp[1].start == 1 && sp[1].len == 1);
    CHECK(mg_tokenize("", NULL, 0, &n, NULL, NULL) == 0 && n == 0);

    /* errors name the position */
    expect_error("CCX", MG_ERR_TOKEN, 2, "position 2");
    expect_error("CCX", MG_ERR_TOKEN, 2, "'X'");
    expect_error("C[NH", MG_ERR_TOKEN, 1, "position 1");
    expect_error("C[]C", MG_ERR_TOKEN, 1, "position 1");
    expect_error("CC%1", MG_ERR_TOKEN, 2, "position 2");
    expect_error("CC%", MG_ERR_TOKEN, 2, NULL);
    expect_error(" C", MG_ERR_TOKEN, 0, "position 0");
    expect_error("C C", MG_ERR_TOKEN, 1, NULL);
    expect_error("Ca", MG_ERR_TOKEN, 1, "'a'");
    expect_error("c1ccccc1\n", MG_ERR_TOKEN, 8, "\\x0A");
    expect_error("CC\xc3\xa9", MG_ERR_TOKEN, 2, "\\xC3");
    /* a bracket atom must be UTF-8 (a vocabulary is JSON); "[\xc3\xa9]" is */
    expect_error("C[\xff]C", MG_ERR_TOKEN, 1, "position 1");
    expect_error("C[C\xc3]", MG_ERR_TOKEN, 1, "position 1");
    expect_error("C[\xed\xa0\x80]", MG_ERR_TOKEN, 1, "position 1"); /* a surrogate */
    CHECK(mg_token_len("[\xc3\xa9]") == 4);
    expect_error("C[CCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCC]", MG_ERR_TOKEN, 1, NULL);

    CHECK(mg_token_len("") == 0);
    CHECK(mg_token_len("Cl") == 2);
    CHECK(mg_token_len("[Fe+2]C") == 6);
    CHECK(mg_token_len("%12") == 3);
    CHECK(mg_token_len("%1") == -1);
    CHECK(mg_token_len("x") == -1);
    CHECK(mg_token_len(NULL) == -1);
}

static void test_vocab_basic(void) {
    const char *smi[] = {"CC(=O)O", "c1ccccc1Cl", "[NH3+]CC[O-]", "C%10CC%10"};
    mg_vocab *v = NULL;
    mg_error err = {0};
    CHECK(mg_vocab_build(smi, 4, &v, &err) == 0);
    if (!v) return;
    /* data tokens: % ( ) = 1 C Cl O [NH3+] [O-] c -- sorted by strcmp */
    const char *expect[] = {"<pad>", "<bos>", "<eos>", "%10", "(",      ")",    "1",
                            "=",     "C",     "Cl",    "O",   "[NH3+]", "[O-]", "c"};
    int ne = (int)(sizeof expect / sizeof *expect);
    CHECK(mg_vocab_size(v) == ne);
    for (int i = 0; i < ne && i < mg_vocab_size(v); i++) {
        CHECK(strcmp(mg_vocab_token(v, i), expect[i]) == 0);
        CHECK(mg_vocab_lookup(v, expect[i], -1) == i);
    }
    CHECK(mg_vocab_token(v, -1) == NULL);
    CHECK(mg_vocab_token(v, ne) == NULL);
    CHECK(mg_vocab_lookup(v, "Br", -1) == -1);
    CHECK(mg_vocab_lookup(v, "Clx", 2) == 9); /* slice "Cl" */
    CHECK(mg_vocab_lookup(v, "C", 1) == 8);
    CHECK(mg_vocab_lookup(v, "", 0) == -1);

    /* encode / decode */
    int32_t ids[32];
    int n = 0;
    CHECK(mg_vocab_encode(v, "CC(=O)O", ids, 32, &n, &err) == 0 && n == 7);
    CHECK(ids[0] == 8 && ids[2] == 4 && ids[3] == 7);
    char out[64];
    size_t dl = 0;
    CHECK(mg_vocab_decode(v, ids, n, out, sizeof out, &dl, &err) == 0 && dl == 7);
    CHECK(strcmp(out, "CC(=O)O") == 0);
    int32_t framed[] = {MG_BOS, 8, 10, MG_EOS, 8, 8};
    CHECK(mg_vocab_decode(v, framed, 6, out, sizeof out, &dl, &err) == 0 && dl == 2);
    CHECK(strcmp(out, "CO") == 0);
    int32_t padded[] = {MG_PAD, 8, MG_PAD, 9};
    CHECK(mg_vocab_decode(v, padded, 4, out, sizeof out, &dl, NULL) == 0 && dl == 3 &&
          !strcmp(out, "CCl"));
    int32_t bad[] = {8, 99};
    CHECK(mg_vocab_decode(v, bad, 2, out, sizeof out, NULL, &err) == MG_ERR_ARG);
    CHECK(strstr(err.message, "99") != NULL);
    CHECK(mg_vocab_decode(v, ids, n, out, 4, NULL, &err) == MG_ERR_TOO_LONG);
    CHECK(strlen(out) == 3);

    CHECK(mg_vocab_encode(v, "CCBr", ids, 32, &n, &err) == MG_ERR_UNKNOWN_TOKEN);
    CHECK(strstr(err.message, "'Br'") && strstr(err.message, "position 2"));
    CHECK(mg_vocab_encode(v, "CCX", ids, 32, &n, &err) == MG_ERR_TOKEN);
    CHECK(strstr(err.message, "position 2") != NULL);
    CHECK(mg_vocab_encode(v, "CCCC", ids, 2, &n, &err) == MG_ERR_TOO_LONG && n == 4);

    /* JSON round trip */
    char *js = mg_vocab_to_json(v);
    CHECK(js != NULL);
    if (js) {
        {
            const char *pre = "[\"<pad>\",\"<bos>\",\"<eos>\",\"%10\",\"(\"";
            CHECK(strncmp(js, pre, strlen(pre)) == 0);
        }
        mg_vocab *w = NULL;
        CHECK(mg_vocab_from_json(js, strlen(js), &w, &err) == 0);
        CHECK(w && mg_vocab_equal(v, w));
        mg_vocab_free(w);
        free(js);
    }
    /* tokens with characters JSON must escape */
    const char *bs[] = {"\\", "/", "C"};
    mg_vocab *b = NULL;
    CHECK(mg_vocab_from_tokens(bs, 3, &b, &err) == 0);
    if (b) {
        js = mg_vocab_to_json(b);
        CHECK(js && strcmp(js, "[\"<pad>\",\"<bos>\",\"<eos>\",\"/\",\"C\",\"\\\\\"]") == 0);
        mg_vocab *w = NULL;
        CHECK(js && mg_vocab_from_json(js, strlen(js), &w, &err) == 0);
        CHECK(w && mg_vocab_equal(b, w));
        mg_vocab_free(w);
        free(js);
        mg_vocab_free(b);
    }
    /* from_json keeps the given order */
    const char *unsorted = "[\"<pad>\",\"<bos>\",\"<eos>\",\"c\",\"C\"]";
    mg_vocab *u = NULL;
    CHECK(mg_vocab_from_json(unsorted, strlen(unsorted), &u, &err) == 0);
    CHECK(u && mg_vocab_lookup(u, "c", -1) == 3 && mg_vocab_lookup(u, "C", -1) == 4);
    mg_vocab_free(u);

    /* bad JSON vocabularies */
    const char *bad_js[] = {
        "",
        "{}",
        "[\"<pad>\",\"<bos>\"]",
        "[\"<bos>\",\"<pad>\",\"<eos>\",\"C\"]",
        "[\"<pad>\",\"<bos>\",\"<eos>\",\"C\",\"C\"]",
        "[\"<pad>\",\"<bos>\",\"<eos>\",\"CC\"]",
        "[\"<pad>\",\"<bos>\",\"<eos>\",\"X\"]",
        "[\"<pad>\",\"<bos>\",\"<eos>\",1]",
        "[\"<pad>\",\"<bos>\",\"<eos>\",\"<pad>\"]",
        "[\"<pad>\",\"<bos>\",\"<eos>\",\"C\"",
        "[\"<pad>\",\"<bos>\",\"<eos>\",\"\"]",
    };
    for (size_t i = 0; i < sizeof bad_js / sizeof *bad_js; i++) {
        mg_vocab *w = (mg_vocab *)1;
        err.message[0] = '\0';
        int rc = mg_vocab_from_json(bad_js[i], strlen(bad_js[i]), &w, &err);
        if (rc == 0 || w != NULL || !err.message[0]) {
            fprintf(stderr, "bad vocab JSON %zu accepted: %s\n", i, bad_js[i]);
            tu_fail++;
        }
        if (rc == 0) mg_vocab_free(w);
    }
    const char *bad_tok[] = {"C", "<bos>"};
    mg_vocab *w = NULL;
    CHECK(mg_vocab_from_tokens(bad_tok, 2, &w, &err) != 0 && w == NULL);
    const char *bad_tok2[] = {"CC"};
    CHECK(mg_vocab_from_tokens(bad_tok2, 1, &w, &err) != 0 && w == NULL);
    const char *dups[] = {"C", "C", "O"};
    CHECK(mg_vocab_from_tokens(dups, 3, &w, &err) == 0 && mg_vocab_size(w) == 5);
    mg_vocab_free(w);
    const char *bad_smi[] = {"CC", "CCX"};
    CHECK(mg_vocab_build(bad_smi, 2, &w, &err) == MG_ERR_TOKEN && w == NULL);
    CHECK(strstr(err.message, "smiles[1]") && strstr(err.message, "position 2"));

    mg_vocab_free(v);
}

/* Read all lines of a corpus: a malloc'ed array of malloc'ed strings. */
static char **read_lines(const char *path, size_t *n) {
    FILE *f = fopen(path, "r");
    *n = 0;
    if (!f) {
        fprintf(stderr, "cannot open %s (set MOLGEN_SHARED_DATA)\n", path);
        tu_fail++;
        return NULL;
    }
    size_t cap = 1024;
    char **v = malloc(cap * sizeof *v);
    char buf[4096];
    while (fgets(buf, sizeof buf, f)) {
        size_t l = strlen(buf);
        while (l && (buf[l - 1] == '\n' || buf[l - 1] == '\r')) buf[--l] = '\0';
        if (*n == cap) {
            cap *= 2;
            v = realloc(v, cap * sizeof *v);
        }
        v[*n] = malloc(l + 1);
        memcpy(v[*n], buf, l + 1);
        (*n)++;
    }
    fclose(f);
    return v;
}

static void test_corpus(const char *file, int expect_vocab, const char *expect_tokens_list) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", mg_test_data_dir(), file);
    size_t n;
    char **lines = read_lines(path, &n);
    if (!lines) return;
    CHECK(n > 1000);
    mg_span sp[512];
    char buf[4096];
    size_t bad = 0, maxtok = 0;
    for (size_t i = 0; i < n; i++) {
        int nt = 0;
        mg_error err = {0};
        int rc = mg_tokenize(lines[i], sp, 512, &nt, NULL, &err);
        if (rc != 0) {
            if (bad++ < 5) fprintf(stderr, "%s:%zu: %s\n", file, i + 1, err.message);
            continue;
        }
        /* spans are contiguous and the concatenation is the input */
        size_t o = 0;
        int pos = 0;
        for (int k = 0; k < nt; k++) {
            if (sp[k].start != pos || sp[k].len <= 0) bad++;
            memcpy(buf + o, lines[i] + sp[k].start, (size_t)sp[k].len);
            o += (size_t)sp[k].len;
            pos += sp[k].len;
        }
        buf[o] = '\0';
        if (strcmp(buf, lines[i]) != 0) {
            if (bad++ < 5) fprintf(stderr, "%s:%zu: round trip gives %s\n", file, i + 1, buf);
        }
        if ((size_t)nt > maxtok) maxtok = (size_t)nt;
    }
    CHECK(bad == 0);
    mg_vocab *v = NULL;
    mg_error err = {0};
    CHECK(mg_vocab_build((const char *const *)lines, n, &v, &err) == 0);
    if (v) {
        int vs = mg_vocab_size(v);
        printf("%s: %zu molecules, max %zu tokens, %d data tokens (+3 specials)\n", file, n, maxtok,
               vs - MG_NUM_SPECIAL);
        if (expect_vocab > 0) CHECK(vs - MG_NUM_SPECIAL == expect_vocab);
        if (expect_tokens_list) {
            char got[1024] = "";
            size_t o = 0;
            for (int i = MG_NUM_SPECIAL; i < vs; i++)
                o += (size_t)snprintf(got + o, sizeof got - o, "%s%s",
                                      i > MG_NUM_SPECIAL ? " " : "", mg_vocab_token(v, i));
            if (strcmp(got, expect_tokens_list) != 0) {
                fprintf(stderr, "%s vocabulary:\n  got      %s\n  expected %s\n", file, got,
                        expect_tokens_list);
                tu_fail++;
            }
        }
        /* encode + decode round trip through ids */
        int32_t ids[512];
        size_t badrt = 0;
        for (size_t i = 0; i < n; i++) {
            int k = 0;
            if (mg_vocab_encode(v, lines[i], ids, 512, &k, &err) != 0 ||
                mg_vocab_decode(v, ids, k, buf, sizeof buf, NULL, &err) != 0 ||
                strcmp(buf, lines[i]) != 0)
                badrt++;
        }
        CHECK(badrt == 0);
        mg_vocab_free(v);
    }
    for (size_t i = 0; i < n; i++) free(lines[i]);
    free(lines);
}

int main(void) {
    test_scanner();
    test_vocab_basic();
    /* ../shared/data/README.md lists the MolGPT-regex vocabulary of
     * moses_176k: 24 tokens (Python's re.findall with the same regex agrees;
     * zinc250k_24k has 47 by both, the README says 46). */
    test_corpus("moses_176k.smi", 24, "# ( ) - 1 2 3 4 5 6 = Br C Cl F N O S [H] [nH] c n o s");
    test_corpus("moses_train5k.smi", 0, NULL);
    test_corpus("zinc250k_24k.smi", 47,
                "# ( ) - / 1 2 3 4 5 6 = Br C Cl F I N O P S [C@@H] [C@@] [C@H] [C@] [N+] [N-] "
                "[NH+] [NH-] [NH2+] [NH3+] [O-] [P@@] [P@] [S-] [S@@] [S@] [n+] [n-] [nH+] [nH] "
                "[o+] \\ c n o s");
    if (tu_fail) {
        fprintf(stderr, "test_tokenizer: %d failure(s)\n", tu_fail);
        return 1;
    }
    printf("test_tokenizer: OK\n");
    return 0;
}
