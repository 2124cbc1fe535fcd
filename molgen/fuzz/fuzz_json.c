/* libFuzzer target: molgen's JSON reading (mg_json_parse in molgen/base/json.c,
 * jansson with molgen's rules; it reads the safetensors header and the
 * config / vocab / optimizer / training JSON in its metadata) and the
 * vocabulary reader on top of it.
 *
 * Input: JSON text. Checked, for every input the parser accepts:
 *   - the value is well formed: strings with length = strlen (no NUL
 *     inside: "\u0000" is refused), nesting within MG_JSON_MAX_DEPTH;
 *   - round trip: the value written back (mg_json_dump, reals with 17
 *     digits) parses to an equal value (json_equal);
 *   - mg_vocab_from_json either refuses it with a message or returns a
 *     vocabulary that writes back to the same JSON array.
 * A rejected input must come with its status and a message; an "at byte N"
 * in it lies within the input. Every input that is UTF-8 is also written as
 * a JSON string (mg_json_dump_to: its snprintf-like length and truncation)
 * and must parse back to itself.
 */
#include "fuzz_util.h"
#include "base/json.h"
#include "chem/tokenizer.h"

/* Depth of nesting, the outermost container being 0 (-1 for a scalar). */
static int depth(const json_t *j) {
    int d = -1;
    if (json_is_array(j)) {
        size_t i;
        const json_t *v;
        json_array_foreach(j, i, v) {
            const int k = depth(v);
            if (k > d) d = k;
        }
        return d + 1;
    }
    if (json_is_object(j)) {
        const char *key;
        const json_t *v;
        json_object_foreach((json_t *)j, key, v) {
            const int k = depth(v);
            if (k > d) d = k;
        }
        return d + 1;
    }
    if (json_is_string(j))
        FZ_CHECK(strlen(json_string_value(j)) == json_string_length(j), "string with a NUL inside");
    return -1;
}

static void check_string(const uint8_t *data, size_t size) {
    char *s = fz_cstr(data, size);
    json_t *str = json_string(s);
    if (str) { /* UTF-8 */
        const int need = mg_json_dump_to(str, 17, NULL, 0);
        FZ_CHECK(need >= 2, "dump length %d", need);
        char *q = malloc((size_t)need + 1);
        FZ_CHECK(q != NULL, "out of memory");
        FZ_CHECK(mg_json_dump_to(str, 17, q, (size_t)need + 1) == need && strlen(q) == (size_t)need,
                 "dump length");
        if (need > 4) { /* truncated: NUL-terminated, a prefix of the full one */
            char *t = malloc((size_t)need / 2 + 1);
            FZ_CHECK(t != NULL, "out of memory");
            FZ_CHECK(mg_json_dump_to(str, 17, t, (size_t)need / 2 + 1) == need,
                     "truncated dump length");
            FZ_CHECK(strlen(t) == (size_t)need / 2 && !memcmp(t, q, (size_t)need / 2),
                     "truncated dump content");
            free(t);
        }
        json_t *j = NULL;
        mg_error err = {0};
        FZ_CHECK(mg_json_parse(q, (size_t)need, &j, &err) == MG_OK,
                 "a written string does not parse: %s", err.message);
        FZ_CHECK(json_is_string(j) && !strcmp(json_string_value(j), s),
                 "a written string parses to another");
        json_decref(j);
        free(q);
        json_decref(str);
    }
    free(s);
}

static void check_vocab(const uint8_t *data, size_t size) {
    mg_vocab *v = NULL;
    mg_error err = {0};
    const mg_status rc = mg_vocab_from_json((const char *)data, size, &v, &err);
    if (rc != MG_OK) {
        FZ_CHECK(v == NULL && fz_err_ok(&err, rc),
                 "vocab refused without its status and a message");
        return;
    }
    char *back = mg_vocab_to_json(v);
    FZ_CHECK(back != NULL, "vocab does not write back");
    mg_vocab *w = NULL;
    FZ_CHECK(mg_vocab_from_json(back, strlen(back), &w, &err) == MG_OK && mg_vocab_equal(v, w),
             "vocab round trip: %s", err.message);
    mg_vocab_free(w);
    free(back);
    mg_vocab_free(v);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    json_t *j = NULL;
    mg_error err = {0};
    mg_status rc = mg_json_parse((const char *)data, size, &j, &err);
    if (rc != MG_OK) {
        FZ_CHECK(j == NULL && fz_err_ok(&err, rc), "rejected without its status and a message");
        const char *p = strstr(err.message, "at byte ");
        if (p) {
            unsigned long long at = strtoull(p + 8, NULL, 10);
            FZ_CHECK(at <= size, "error at byte %llu of %zu", at, size);
        }
    } else {
        FZ_CHECK(depth(j) <= MG_JSON_MAX_DEPTH, "depth %d", depth(j));
        char *text = mg_json_dump(j, 17);
        FZ_CHECK(text != NULL, "an accepted value does not write back");
        json_t *k = NULL;
        rc = mg_json_parse(text, strlen(text), &k, &err);
        FZ_CHECK(rc == MG_OK, "the value written back does not parse: %s\n  %.300s", err.message,
                 text);
        FZ_CHECK(json_equal(j, k), "round trip differs:\n  %.300s", text);
        json_decref(k);
        free(text);
        json_decref(j);
        check_vocab(data, size);
    }
    check_string(data, size);
    return 0;
}
