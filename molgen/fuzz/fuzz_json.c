/* libFuzzer target: the JSON parser of molgen's checkpoint reader
 * (mg_json_parse in molgen/safetensors.c; it reads the safetensors header and
 * the config / vocab / optimizer JSON in its metadata).
 *
 * Input: JSON text. Checked, for every input the parser accepts:
 *   - the DOM is well formed: strings NUL-terminated with len = strlen (no
 *     NUL inside, \u0000 is refused), object keys unique, depth within
 *     MG_JSON_MAX_DEPTH, is_int numbers equal to their double;
 *   - round trip: the DOM written back as JSON (strings through
 *     mg_json_quote, numbers as exact integers or %.17g) parses to an equal
 *     DOM;
 *   - mg_json_get finds every key of an object at its position.
 * A rejected input must come with a message; an "at byte N" in it lies
 * within the input. Every input is also offered to mg_json_quote as a string (its
 * snprintf-like length and truncation).
 */
#include <math.h>

#include "fuzz_util.h"
#include "safetensors.h"

typedef struct {
    char *s;
    size_t n, cap;
} buf;

static void put(buf *b, const char *s, size_t n)
{
    if (b->n + n + 1 > b->cap) {
        size_t c = b->cap ? b->cap : 256;
        while (c < b->n + n + 1)
            c *= 2;
        b->s = realloc(b->s, c);
        FZ_CHECK(b->s != NULL, "out of memory");
        b->cap = c;
    }
    memcpy(b->s + b->n, s, n);
    b->n += n;
    b->s[b->n] = '\0';
}

static void put_quoted(buf *b, const char *s)
{
    size_t n = mg_json_quote(s, NULL, 0);
    char *q = malloc(n + 1);
    FZ_CHECK(q != NULL, "out of memory");
    FZ_CHECK(mg_json_quote(s, q, n + 1) == n && strlen(q) == n, "mg_json_quote length");
    put(b, q, n);
    free(q);
}

static void check_dom(const mg_json *j, int depth)
{
    FZ_CHECK(depth <= MG_JSON_MAX_DEPTH + 1, "depth %d", depth);
    switch (j->type) {
    case MG_JSON_NULL:
    case MG_JSON_BOOL:
        break;
    case MG_JSON_NUMBER:
        FZ_CHECK(!isnan(j->number), "NaN number");
        if (j->is_int)
            FZ_CHECK((double)j->integer == j->number, "integer %lld vs number %.17g",
                     (long long)j->integer, j->number);
        break;
    case MG_JSON_STRING:
        FZ_CHECK(j->str && strlen(j->str) == j->len, "string length %zu vs strlen %zu", j->len,
                 j->str ? strlen(j->str) : 0);
        break;
    case MG_JSON_ARRAY:
    case MG_JSON_OBJECT:
        FZ_CHECK(j->len == 0 || j->items, "container without items");
        for (size_t i = 0; i < j->len; i++) {
            check_dom(&j->items[i], depth + 1);
            if (j->type == MG_JSON_OBJECT) {
                FZ_CHECK(j->keys && j->keys[i], "object key %zu missing", i);
                FZ_CHECK(mg_json_get(j, j->keys[i]) == &j->items[i], "key '%.60s' not unique",
                         j->keys[i]);
            }
        }
        break;
    default:
        FZ_CHECK(0, "bad type %d", (int)j->type);
    }
}

static void write_json(buf *b, const mg_json *j)
{
    char num[64];
    switch (j->type) {
    case MG_JSON_NULL:
        put(b, "null", 4);
        break;
    case MG_JSON_BOOL:
        if (j->boolean)
            put(b, "true", 4);
        else
            put(b, "false", 5);
        break;
    case MG_JSON_NUMBER:
        if (j->is_int)
            snprintf(num, sizeof num, "%lld", (long long)j->integer);
        else if (isinf(j->number)) /* "1e999" overflows to inf again */
            snprintf(num, sizeof num, "%s", j->number > 0 ? "1e999" : "-1e999");
        else
            snprintf(num, sizeof num, "%.17g", j->number);
        put(b, num, strlen(num));
        break;
    case MG_JSON_STRING:
        put_quoted(b, j->str);
        break;
    case MG_JSON_ARRAY:
    case MG_JSON_OBJECT:
        put(b, j->type == MG_JSON_ARRAY ? "[" : "{", 1);
        for (size_t i = 0; i < j->len; i++) {
            if (i)
                put(b, ",", 1);
            if (j->type == MG_JSON_OBJECT) {
                put_quoted(b, j->keys[i]);
                put(b, ":", 1);
            }
            write_json(b, &j->items[i]);
        }
        put(b, j->type == MG_JSON_ARRAY ? "]" : "}", 1);
        break;
    }
}

static int dom_equal(const mg_json *a, const mg_json *b)
{
    if (a->type != b->type)
        return 0;
    switch (a->type) {
    case MG_JSON_NULL:
        return 1;
    case MG_JSON_BOOL:
        return a->boolean == b->boolean;
    case MG_JSON_NUMBER:
        if (a->number != b->number)
            return 0;
        return !a->is_int || (b->is_int && a->integer == b->integer);
    case MG_JSON_STRING:
        return a->len == b->len && !memcmp(a->str, b->str, a->len);
    default:
        if (a->len != b->len)
            return 0;
        for (size_t i = 0; i < a->len; i++) {
            if (a->type == MG_JSON_OBJECT && strcmp(a->keys[i], b->keys[i]))
                return 0;
            if (!dom_equal(&a->items[i], &b->items[i]))
                return 0;
        }
        return 1;
    }
}

static void check_quote(const uint8_t *data, size_t size)
{
    char *s = fz_cstr(data, size);
    size_t need = mg_json_quote(s, NULL, 0);
    char *q = malloc(need + 1);
    FZ_CHECK(q != NULL, "out of memory");
    FZ_CHECK(mg_json_quote(s, q, need + 1) == need && strlen(q) == need, "quote length");
    if (need > 4) { /* truncated: NUL-terminated, a prefix of the full one */
        char *t = malloc(need / 2 + 1);
        FZ_CHECK(t != NULL, "out of memory");
        FZ_CHECK(mg_json_quote(s, t, need / 2 + 1) == need, "truncated quote length");
        FZ_CHECK(strlen(t) == need / 2 && !memcmp(t, q, need / 2), "truncated quote content");
        free(t);
    }
    /* a quoted string parses back to itself */
    mg_json *j = NULL;
    mg_error err = {0};
    FZ_CHECK(mg_json_parse(q, need, &j, &err) == MG_OK, "quoted string does not parse: %s",
             err.message);
    FZ_CHECK(j->type == MG_JSON_STRING && !strcmp(j->str, s), "quoted string parses to another");
    mg_json_free(j);
    free(q);
    free(s);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    mg_json *j = NULL;
    mg_error err = {0};
    mg_status rc = mg_json_parse((const char *)data, size, &j, &err);
    if (rc != MG_OK) {
        FZ_CHECK(j == NULL && fz_err_ok(&err, rc), "rejected without a message");
        const char *p = strstr(err.message, "at byte ");
        if (p) {
            unsigned long long at = strtoull(p + 8, NULL, 10);
            FZ_CHECK(at <= size, "error at byte %llu of %zu", at, size);
        }
    } else {
        check_dom(j, 0);
        buf b = {0};
        write_json(&b, j);
        mg_json *k = NULL;
        rc = mg_json_parse(b.s, b.n, &k, &err);
        FZ_CHECK(rc == MG_OK, "the DOM written back does not parse: %s\n  %.300s", err.message, b.s);
        FZ_CHECK(dom_equal(j, k), "round trip differs:\n  %.300s", b.s);
        mg_json_free(k);
        free(b.s);
        mg_json_free(j);
    }
    check_quote(data, size);
    return 0;
}
