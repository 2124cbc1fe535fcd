/* libFuzzer target: the SMILES grammar check (molgen/chem/smiles_check.c).
 *
 * Input: one SMILES (the bytes up to the first NUL). Checked:
 *   - the verdict is 0 or 1, the same with a NULL, a 1-byte and a short
 *     reason buffer (always NUL-terminated within its size);
 *   - a rejection has a reason; "position P" in it lies inside the string;
 *     a string that does not tokenise is rejected with the tokenizer's
 *     message;
 *   - an accepted string tokenises and has no reaction / SMARTS token
 *     ('<' '>' '?' '~');
 *   - metamorphic: s accepted implies "s.s" accepted (two disconnected
 *     copies share no bond, ring label or branch);
 *   - the incremental parser at the VALENCE level with its Kekulé check
 *     (what --constrain valence asks after every token and at the end)
 *     runs on every input, and an input it lets end also ends as "s.s".
 */
#include "fuzz_util.h"
#include "chem/smiles_check.h"
#include "chem/tokenizer.h"

static void check_one(const char *s) {
    size_t len = strlen(s);
    char why[512];
    memset(why, 'x', sizeof why);
    int ok = mg_smiles_syntax_ok(s, why, sizeof why);
    FZ_CHECK(ok == 0 || ok == 1, "verdict %d", ok);
    FZ_CHECK(mg_smiles_syntax_ok(s, NULL, 0) == ok, "verdict differs without a reason buffer");
    char tiny[1] = {'x'}, small[12];
    memset(small, 'x', sizeof small);
    FZ_CHECK(mg_smiles_syntax_ok(s, tiny, sizeof tiny) == ok, "verdict differs with 1 byte");
    FZ_CHECK(mg_smiles_syntax_ok(s, small, sizeof small) == ok, "verdict differs with 12 bytes");
    if (!ok) {
        FZ_CHECK(tiny[0] == '\0', "1-byte reason not NUL-terminated");
        FZ_CHECK(memchr(small, '\0', sizeof small) != NULL, "12-byte reason not NUL-terminated");
    }

    int ntok = 0, errpos = -1;
    mg_error terr = {0};
    mg_status trc = mg_tokenize(s, NULL, 0, &ntok, &errpos, &terr);
    if (trc == MG_ERR_TOKEN) {
        FZ_CHECK(!ok && !strncmp(why, terr.message, sizeof why - 1),
                 "untokenisable string: ok %d, reason '%s' vs '%s'", ok, why, terr.message);
        return;
    }
    if (!ok) {
        FZ_CHECK(fz_msg_ok(why, sizeof why), "rejected without a reason");
        const char *p = strstr(why, "position ");
        if (p) {
            long at = strtol(p + 9, NULL, 10);
            FZ_CHECK(at >= 0 && (size_t)at <= len, "reason '%s' points outside the %zu bytes", why,
                     len);
        } else {
            FZ_CHECK(len == 0 || !strcmp(why, "out of memory"), "reason without a position: '%s'",
                     why);
        }
        return;
    }
    FZ_CHECK(len > 0, "empty string accepted");
    for (const char *q = s; *q;) {
        int l = mg_token_len(q);
        FZ_CHECK(l > 0, "accepted string does not tokenise at %d", (int)(q - s));
        FZ_CHECK(!(l == 1 && strchr("<>?~", *q)), "accepted '%c' at %d", *q, (int)(q - s));
        q += l;
    }
}

/* The string through the VALENCE-level parser as the mask walks it: after
 * every token viable and the Kekulé check of a string still being written,
 * at the end the end checks and the final Kekulé check. 1: it may end. */
static int valence_walk(const char *s) {
    mg_smiles_state *st = NULL;
    if (mg_smiles_state_new((int)strlen(s) + 1, MG_CONSTRAIN_VALENCE, &st, NULL)) return 0;
    int ok = 1;
    for (const char *q = s; ok && *q;) {
        const int l = mg_token_len(q);
        if (l <= 0) {
            ok = 0;
            break;
        }
        ok = mg_smiles_state_push(st, q, l, NULL, 0);
        if (ok) {
            (void)mg_smiles_state_viable(st);
            (void)mg_smiles_state_kekule(st, 0);
        }
        q += l;
    }
    ok = ok && mg_smiles_state_end(st, NULL, 0) && mg_smiles_state_kekule(st, 1);
    mg_smiles_state_free(st);
    return ok;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *s = fz_cstr(data, size);
    check_one(s);
    size_t len = strlen(s);
    if (len > 0 && len <= 2048 && mg_smiles_syntax_ok(s, NULL, 0)) {
        char *two = malloc(2 * len + 2);
        FZ_CHECK(two != NULL, "out of memory");
        memcpy(two, s, len);
        two[len] = '.';
        memcpy(two + len + 1, s, len + 1);
        char why[256] = "";
        FZ_CHECK(mg_smiles_syntax_ok(two, why, sizeof why) == 1,
                 "'%.100s' accepted but two copies joined by '.' rejected: %s", s, why);
        if (valence_walk(s))
            FZ_CHECK(valence_walk(two), "'%.100s' ends at level valence but not as two copies", s);
        free(two);
    }
    else if (len > 0 && len <= 2048)
        (void)valence_walk(s);
    free(s);
    return 0;
}
