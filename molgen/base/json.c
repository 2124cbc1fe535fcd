/* molgen JSON on jansson (see json.h). */
#include "base/json.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Depth of the deepest container in j (a scalar is 0, [] is 1). jansson has
 * already bounded the recursion (its own limit is 2048). */
static int depth_of(const json_t *j) {
    int d = 0;
    if (json_is_array(j)) {
        size_t i;
        const json_t *v;
        json_array_foreach(j, i, v) {
            const int k = depth_of(v);
            if (k > d) d = k;
        }
        return d + 1;
    }
    if (json_is_object(j)) {
        const char *key;
        const json_t *v;
        json_object_foreach((json_t *)j, key, v) {
            const int k = depth_of(v);
            if (k > d) d = k;
        }
        return d + 1;
    }
    return 0;
}

mg_status mg_json_parse(const char *text, size_t len, json_t **out, mg_error *err) {
    if (!out || (!text && len > 0)) return mg_fail(err, MG_ERR_ARG, "mg_json_parse: bad argument");
    *out = NULL;
    json_error_t je;
    json_t *j = json_loadb(text ? text : "", len, JSON_REJECT_DUPLICATES | JSON_DECODE_ANY, &je);
    if (!j) {
        if (json_error_code(&je) == json_error_stack_overflow)
            return mg_fail(err, MG_ERR_FORMAT,
                           "JSON error at byte %d: nesting deeper than %d levels", je.position,
                           MG_JSON_MAX_DEPTH);
        return mg_fail(
            err, json_error_code(&je) == json_error_out_of_memory ? MG_ERR_NOMEM : MG_ERR_FORMAT,
            "JSON error at byte %d: %s", je.position, je.text);
    }
    if (depth_of(j) > MG_JSON_MAX_DEPTH + 1) { /* the outermost container is depth 0 */
        json_decref(j);
        return mg_fail(err, MG_ERR_FORMAT, "JSON error: nesting deeper than %d levels",
                       MG_JSON_MAX_DEPTH);
    }
    *out = j;
    return MG_OK;
}

static size_t dump_flags(int real_digits) {
    const int p = real_digits < 1 ? 17 : real_digits > 31 ? 31 : real_digits;
    return JSON_COMPACT | JSON_ENCODE_ANY | JSON_REAL_PRECISION(p);
}

char *mg_json_dump(const json_t *j, int real_digits) {
    return j ? json_dumps(j, dump_flags(real_digits)) : NULL;
}

int mg_json_dump_to(const json_t *j, int real_digits, char *out, size_t outlen) {
    char *s = mg_json_dump(j, real_digits);
    if (!s) {
        if (out && outlen) out[0] = '\0';
        return -1;
    }
    const size_t n = strlen(s);
    if (out && outlen) {
        const size_t k = n < outlen ? n : outlen - 1;
        memcpy(out, s, k);
        out[k] = '\0';
    }
    free(s);
    return (int)n;
}

int mg_json_put(json_t *obj, const char *key, json_t *value) {
    if (!value) return -1;
    return json_object_set_new(obj, key, value) ? -1 : 0;
}
