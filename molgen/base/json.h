/* molgen JSON: jansson (Debian libjansson-dev) with the rules molgen's files
 * need, in one place. Everything that reads or writes JSON (the safetensors
 * header, the model / optimizer / training configs, the vocabulary, the
 * train command's summary) goes through here.
 *
 * Reading: one value (an object, array, string, number, true, false or
 * null), nothing after it but whitespace; duplicate object keys, "\u0000",
 * invalid UTF-8 and integers beyond int64 are errors (jansson's checks), and
 * so is nesting deeper than MG_JSON_MAX_DEPTH (the outermost container is
 * depth 0; molgen's files nest 2 deep).
 * Errors are MG_ERR_FORMAT with "JSON error at byte N: <what>".
 *
 * Writing: compact (no spaces), keys in insertion order, reals with a given
 * number of significant digits (9 round-trips a float, 17 a double; jansson
 * writes "1.0" for a real that is integral, so it reads back as a real). */
#ifndef MG_JSON_H
#define MG_JSON_H

#include <jansson.h>
#include <stddef.h>

#include "base/errors.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MG_JSON_MAX_DEPTH 64

/* Parses text[0..len) (need not be NUL-terminated). *out: a new reference
 * (json_decref it), NULL on failure. */
mg_status mg_json_parse(const char *text, size_t len, json_t **out, mg_error *err);

/* j as text: malloc'ed and NUL-terminated (free() it); NULL when out of
 * memory or j is not serialisable (a string that is not UTF-8). */
char *mg_json_dump(const json_t *j, int real_digits);
/* The same into out[outlen], NUL-terminated and truncated if needed (outlen
 * 0: nothing written); returns the length it needs like snprintf, or -1 when
 * j cannot be serialised. */
int mg_json_dump_to(const json_t *j, int real_digits, char *out, size_t outlen);

/* Adds key: value to obj and drops the reference to value (json_object_set_new);
 * 0, or -1 when value is NULL (a failed json_* constructor) or out of memory. */
int mg_json_put(json_t *obj, const char *key, json_t *value);

#ifdef __cplusplus
}
#endif
#endif /* MG_JSON_H */
