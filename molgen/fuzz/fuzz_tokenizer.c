/* libFuzzer target: the SMILES tokenizer and vocabulary (molgen/chem/tokenizer.c).
 *
 * Input: text; every line (split at '\n' and NUL) is a SMILES. Checked:
 *   - mg_token_len at each position against an independent oracle, the
 *     MolGPT regex of tokenizer.h compiled by POSIX regcomp (ERE, anchored;
 *     for these alternatives leftmost-longest and Python's leftmost-first
 *     pick the same match), with the documented differences: no match, "[]",
 *     bracket atoms over MG_TOKEN_MAX bytes and bracket atoms that are not
 *     UTF-8 (jansson's json_stringn decides) are -1;
 *   - mg_tokenize: the spans tile the line exactly; on an error the position
 *     is the first byte that starts no token and *ntok the tokens before it;
 *     a too small capacity gives MG_ERR_TOO_LONG with the full count;
 *   - against the vocabulary of the first line, every line encodes or fails
 *     with the first unknown token / bad character that a string comparison
 *     of the spans predicts; building over all lines fails on the first bad
 *     one; each line as one token (mg_vocab_from_tokens) is accepted exactly
 *     when every line is a single non-special token;
 *   - a vocabulary built from the lines that tokenise (mg_vocab_build) is
 *     sorted and unique, equals mg_vocab_from_tokens of the same tokens,
 *     encodes every line and decodes it back byte for byte (and reports a
 *     too small output buffer), and its JSON round-trips;
 *   - the whole input parsed as a vocabulary JSON (mg_vocab_from_json, what
 *     a checkpoint's "vocab" metadata holds): accepted ones round-trip and
 *     hold only specials and single tokens; rejected ones give a message.
 */
#include <jansson.h>
#include <regex.h>

#include "fuzz_util.h"
#include "chem/tokenizer.h"

#define MOLGPT_ERE                                                                                 \
    "^(\\[[^]]+]|<|Br?|Cl?|N|O|S|P|F|I|b|c|n|o|s|p|\\(|\\)|\\.|=|#|-|\\+|\\\\|/|:|~|@|\\?|>|"      \
    "\\*|\\$|%[0-9]{2}|[0-9])"

static regex_t g_re;
static int g_re_ready;

/* The oracle's token length at s (s non-empty, NUL-terminated). */
static int oracle_token_len(const char *s) {
    regmatch_t m[1];
    if (regexec(&g_re, s, 1, m, 0) != 0) return -1;
    FZ_CHECK(m[0].rm_so == 0 && m[0].rm_eo > 0, "anchored match at %d..%d", (int)m[0].rm_so,
             (int)m[0].rm_eo);
    int len = (int)m[0].rm_eo;
    if (s[0] == '[' && len > MG_TOKEN_MAX) return -1;
    if (s[0] == '[') {
        json_t *j = json_stringn(s + 1, (size_t)len - 2);
        json_decref(j);
        if (!j) return -1;
    }
    return len;
}

static void check_line(const char *s, mg_span *spans, int cap) {
    int len = (int)strlen(s);
    int ntok = -1, errpos = -1;
    mg_error err = {0};
    mg_status rc = mg_tokenize(s, spans, cap, &ntok, &errpos, &err);
    int pos = 0, k = 0;
    for (;;) {
        int l = mg_token_len(s + pos);
        if (s[pos] == '\0') {
            FZ_CHECK(l == 0, "mg_token_len at the end is %d", l);
            break;
        }
        int want = oracle_token_len(s + pos);
        FZ_CHECK(l == want, "mg_token_len at %d of '%.80s' is %d, the regex says %d", pos, s, l,
                 want);
        if (l < 0) break;
        FZ_CHECK(spans[k].start == pos && spans[k].len == l,
                 "span %d is (%d, %d), expected (%d, %d)", k, spans[k].start, spans[k].len, pos, l);
        k++;
        pos += l;
    }
    if (pos == len) {
        FZ_CHECK(rc == 0 && ntok == k, "rc %d ntok %d, expected 0 and %d tokens", rc, ntok, k);
        if (k > 0) { /* one slot short */
            int n2 = -1;
            mg_error e2 = {0};
            mg_status rc2 = mg_tokenize(s, spans, k - 1, &n2, NULL, &e2);
            FZ_CHECK(rc2 == MG_ERR_TOO_LONG && n2 == k && fz_err_ok(&e2, rc2),
                     "cap %d of %d tokens: rc %d n %d '%s'", k - 1, k, rc2, n2, e2.message);
        }
    } else {
        FZ_CHECK(rc == MG_ERR_TOKEN && errpos == pos && ntok == k && fz_err_ok(&err, rc),
                 "untokenisable at %d: rc %d errpos %d ntok %d (want %d) '%s'", pos, rc, errpos,
                 ntok, k, err.message);
    }
}

static void check_vocab_roundtrip(const mg_vocab *v) {
    char *js = mg_vocab_to_json(v);
    FZ_CHECK(js != NULL, "mg_vocab_to_json failed");
    mg_vocab *w = NULL;
    mg_error err = {0};
    mg_status rc = mg_vocab_from_json(js, strlen(js), &w, &err);
    FZ_CHECK(rc == 0 && mg_vocab_equal(v, w), "vocab JSON does not round-trip: %s (%.200s)",
             err.message, js);
    mg_vocab_free(w);
    free(js);
}

static void check_vocab(const char *const *lines, size_t n, mg_span *spans, int cap,
                        size_t input_size) {
    mg_vocab *v = NULL;
    mg_error err = {0};
    mg_status rc = mg_vocab_build(lines, n, &v, &err);
    if (rc == MG_ERR_ARG && input_size > 3 * 4000) {
        /* more distinct tokens than a vocabulary may hold (4093): needs
         * thousands of distinct bracket atoms, i.e. a long input */
        FZ_CHECK(v == NULL && fz_err_ok(&err, rc), "refused vocabulary without a message");
        return;
    }
    FZ_CHECK(rc == 0, "mg_vocab_build of %zu tokenisable lines: %d %s", n, rc, err.message);
    int nv = mg_vocab_size(v);
    FZ_CHECK(nv >= MG_NUM_SPECIAL, "vocab size %d", nv);
    FZ_CHECK(!strcmp(mg_vocab_token(v, MG_PAD), "<pad>") &&
                 !strcmp(mg_vocab_token(v, MG_BOS), "<bos>") &&
                 !strcmp(mg_vocab_token(v, MG_EOS), "<eos>"),
             "specials");
    FZ_CHECK(mg_vocab_token(v, -1) == NULL && mg_vocab_token(v, nv) == NULL, "ids out of range");
    for (int id = 0; id < nv; id++) {
        const char *t = mg_vocab_token(v, id);
        FZ_CHECK(mg_vocab_lookup(v, t, -1) == id, "lookup of '%s' is not %d", t, id);
        if (id > MG_NUM_SPECIAL)
            FZ_CHECK(strcmp(mg_vocab_token(v, id - 1), t) < 0, "ids %d, %d not in strcmp order",
                     id - 1, id);
    }
    /* The same tokens listed again (each twice) give the same vocabulary. */
    const char **toks = malloc(2 * (size_t)nv * sizeof *toks);
    FZ_CHECK(toks != NULL, "out of memory");
    int nt = 0;
    for (int id = nv - 1; id >= MG_NUM_SPECIAL; id--) {
        toks[nt++] = mg_vocab_token(v, id);
        toks[nt++] = mg_vocab_token(v, id);
    }
    mg_vocab *w = NULL;
    rc = mg_vocab_from_tokens(toks, (size_t)nt, &w, &err);
    FZ_CHECK(rc == 0 && mg_vocab_equal(v, w), "mg_vocab_from_tokens differs: %d %s", rc,
             err.message);
    mg_vocab_free(w);
    free(toks);
    check_vocab_roundtrip(v);

    int32_t *ids = malloc(((size_t)cap + 1) * sizeof *ids);
    char *out = malloc((size_t)cap + 8);
    FZ_CHECK(ids && out, "out of memory");
    for (size_t i = 0; i < n; i++) {
        const char *s = lines[i];
        int len = (int)strlen(s), ntok = 0;
        rc = mg_tokenize(s, spans, cap, &ntok, NULL, &err);
        FZ_CHECK(rc == 0, "line %zu no longer tokenises", i);
        int k = -1;
        rc = mg_vocab_encode(v, s, ids, ntok, &k, &err);
        FZ_CHECK(rc == 0 && k == ntok, "encode: rc %d, %d ids for %d tokens: %s", rc, k, ntok,
                 err.message);
        for (int j = 0; j < k; j++) {
            const char *t = mg_vocab_token(v, ids[j]);
            FZ_CHECK(ids[j] >= MG_NUM_SPECIAL && t && (int)strlen(t) == spans[j].len &&
                         !memcmp(t, s + spans[j].start, (size_t)spans[j].len),
                     "id %d of token %d", (int)ids[j], j);
        }
        if (k > 0) {
            int k2 = -1;
            rc = mg_vocab_encode(v, s, ids, k - 1, &k2, &err);
            FZ_CHECK(rc == MG_ERR_TOO_LONG && k2 == k, "encode cap %d: rc %d n %d", k - 1, rc, k2);
        }
        size_t dlen = 0;
        rc = mg_vocab_decode(v, ids, k, out, (size_t)len + 1, &dlen, &err);
        FZ_CHECK(rc == MG_OK && dlen == (size_t)len && !strcmp(out, s),
                 "decode gives %d, %zu bytes '%.80s' for '%.80s'", rc, dlen, out, s);
        if (len > 0) {
            rc = mg_vocab_decode(v, ids, k, out, (size_t)len, &dlen, &err);
            FZ_CHECK(rc == MG_ERR_TOO_LONG && fz_err_ok(&err, rc) && strlen(out) < (size_t)len &&
                         !strncmp(out, s, strlen(out)),
                     "decode into %d bytes: rc %d '%.80s'", len, rc, out);
        }
    }
    /* BOS / PAD are skipped and decoding stops at EOS; a bad id is an error. */
    int32_t sp[4] = {MG_BOS, MG_PAD, MG_EOS, nv};
    size_t dlen = 1;
    rc = mg_vocab_decode(v, sp, 4, out, 8, &dlen, &err);
    FZ_CHECK(rc == MG_OK && dlen == 0 && out[0] == '\0', "specials decode to %d '%s'", rc, out);
    rc = mg_vocab_decode(v, sp + 3, 1, out, 8, &dlen, &err);
    FZ_CHECK(rc == MG_ERR_ARG && fz_err_ok(&err, rc), "id %d decodes: %d", nv, rc);
    free(ids);
    free(out);
    mg_vocab_free(v);
}

/* Every line, tokenisable or not, against the vocabulary of the first
 * tokenisable line: the expected result comes from the spans and a plain
 * string comparison with that line's tokens, not from the vocabulary. Also
 * mg_vocab_build over all lines and mg_vocab_from_tokens with each line as
 * one token. */
static void check_errors(const char *const *all, size_t nall, const char *first, mg_span *spans,
                         int cap) {
    mg_error err = {0};
    mg_vocab *v = NULL;
    mg_status rc = mg_vocab_build(&first, 1, &v, &err);
    FZ_CHECK(rc == 0, "vocabulary of one line: %s", err.message);
    int nf = 0;
    mg_span *fs = malloc(((size_t)cap + 1) * sizeof *fs);
    int32_t *ids = malloc(((size_t)cap + 1) * sizeof *ids);
    FZ_CHECK(fs && ids, "out of memory");
    FZ_CHECK(mg_tokenize(first, fs, cap, &nf, NULL, NULL) == 0, "first line");
    int bad_line = -1, all_single = 1;
    for (size_t i = 0; i < nall; i++) {
        const char *s = all[i];
        int ntok = 0, errpos = -1;
        mg_status trc = mg_tokenize(s, spans, cap, &ntok, &errpos, NULL);
        if (trc != 0 && bad_line < 0) bad_line = (int)i;
        int l = mg_token_len(s);
        all_single &=
            l > 0 && s[l] == '\0' && strcmp(s, "<pad>") && strcmp(s, "<bos>") && strcmp(s, "<eos>");
        mg_status want = MG_OK; /* expected: the first unknown token, or the bad character */
        for (int k = 0; k < ntok && want == 0; k++) {
            int known = 0;
            for (int q = 0; q < nf && !known; q++)
                known = fs[q].len == spans[k].len &&
                        !memcmp(first + fs[q].start, s + spans[k].start, (size_t)spans[k].len);
            if (!known) want = MG_ERR_UNKNOWN_TOKEN;
        }
        if (want == 0 && trc == MG_ERR_TOKEN) want = MG_ERR_TOKEN;
        int n = -1;
        err = (mg_error){0};
        rc = mg_vocab_encode(v, s, ids, cap, &n, &err);
        FZ_CHECK(rc == want && (rc == 0 || fz_err_ok(&err, rc)),
                 "encode '%.80s' with the vocabulary of '%.80s': %d, expected %d (%s)", s, first,
                 rc, want, err.message);
    }
    mg_vocab_free(v);
    v = NULL;
    err = (mg_error){0};
    rc = mg_vocab_build(all, nall, &v, &err);
    if (bad_line >= 0) {
        char want[32];
        snprintf(want, sizeof want, "smiles[%d] position ", bad_line);
        FZ_CHECK(rc == MG_ERR_TOKEN && v == NULL && !strncmp(err.message, want, strlen(want)),
                 "build over a bad line %d: %d '%s'", bad_line, rc, err.message);
    } else {
        FZ_CHECK(rc == 0 || (rc == MG_ERR_ARG && v == NULL), "build over all lines: %d %s", rc,
                 err.message);
    }
    mg_vocab_free(v);
    v = NULL;
    err = (mg_error){0};
    rc = mg_vocab_from_tokens(all, nall, &v, &err);
    FZ_CHECK(all_single ? rc == 0 : (rc == MG_ERR_ARG && v == NULL && fz_err_ok(&err, rc)),
             "lines as tokens: %d (all single tokens: %d) %s", rc, all_single, err.message);
    mg_vocab_free(v);
    free(fs);
    free(ids);
}

static void check_vocab_json(const uint8_t *data, size_t size) {
    mg_vocab *v = NULL;
    mg_error err = {0};
    mg_status rc = mg_vocab_from_json((const char *)data, size, &v, &err);
    if (rc != 0) {
        FZ_CHECK(v == NULL && fz_err_ok(&err, rc), "rejected vocab JSON without a message");
        return;
    }
    int nv = mg_vocab_size(v);
    for (int id = MG_NUM_SPECIAL; id < nv; id++) {
        const char *t = mg_vocab_token(v, id);
        FZ_CHECK(mg_token_len(t) == (int)strlen(t) && mg_vocab_lookup(v, t, -1) == id,
                 "entry %d '%s' is not one token", id, t);
    }
    check_vocab_roundtrip(v);
    mg_vocab_free(v);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!g_re_ready) {
        FZ_CHECK(regcomp(&g_re, MOLGPT_ERE, REG_EXTENDED) == 0, "regcomp");
        g_re_ready = 1;
    }
    char *text = fz_cstr(data, size);
    const char **lines = malloc((size + 1) * sizeof *lines);
    const char **all = malloc((size + 1) * sizeof *all);
    mg_span *spans = malloc((size + 1) * sizeof *spans);
    FZ_CHECK(lines && all && spans, "out of memory");
    int cap = (int)size + 1;
    size_t ngood = 0, nall = 0;
    char *p = text, *end = text + size;
    for (;;) {
        char *e = p;
        while (e < end && *e != '\n' && *e != '\0') e++;
        int last = e == end;
        *e = '\0';
        check_line(p, spans, cap);
        all[nall++] = p;
        int ntok = 0;
        if (mg_tokenize(p, spans, cap, &ntok, NULL, NULL) == 0) lines[ngood++] = p;
        if (last) break;
        p = e + 1;
    }
    check_vocab(lines, ngood, spans, cap, size);
    if (ngood > 0) check_errors(all, nall, lines[0], spans, cap);
    check_vocab_json(data, size);
    free(lines);
    free(all);
    free(spans);
    free(text);
    return 0;
}
