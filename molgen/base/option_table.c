/* molgen option tables: parsing, checking, printing and storing one row's
 * value (see option_table.h). */
#define _POSIX_C_SOURCE 200809L
#include "base/option_table.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define AT(type, s, b) ((type *)((char *)(b) + (s)->offset))
#define AT_C(type, s, b) ((const type *)((const char *)(b) + (s)->offset))

/* v in the fewest digits that read back as the same double (f32: the same
 * float), so that no message or --help shows a value other than the one in
 * force ("%g" would print --ema 0.99999999 as 1). */
static void real_text(double v, int f32, char *out, size_t n) {
    for (int prec = 6; prec <= 17; prec++) { /* "%g" when it is exact: 10, not 1e+01 */
        snprintf(out, n, "%.*g", prec, v);
        if (f32 ? strtof(out, NULL) == (float)v : strtod(out, NULL) == v) return;
    }
}

static int real_in(const mg_setting *s, double v) {
    const int lo_ok = (s->bounds == MG_OPEN_LO || s->bounds == MG_OPEN) ? v > s->lo : v >= s->lo;
    const int hi_ok = (s->bounds == MG_OPEN_HI || s->bounds == MG_OPEN) ? v < s->hi : v <= s->hi;
    return isfinite(v) && lo_ok && hi_ok;
}

static int is_int(const mg_setting *s) {
    return s->kind == MG_KIND_INT || s->kind == MG_KIND_I64;
}

/* "[1, 1024]", "[0, 1)", ">= 0" (no upper bound, or one that is only an
 * overflow guard) */
static void bounds_text(const mg_setting *s, char *out, size_t n) {
    const int open_lo = s->bounds == MG_OPEN_LO || s->bounds == MG_OPEN;
    const int open_hi = s->bounds == MG_OPEN_HI || s->bounds == MG_OPEN;
    char lo[26], hi[26];
    if (is_int(s) && s->ihi >= INT32_MAX)
        snprintf(out, n, ">= %" PRId64, s->ilo);
    else if (is_int(s) || s->kind == MG_KIND_FLAG)
        snprintf(out, n, "[%" PRId64 ", %" PRId64 "]", s->ilo, s->ihi);
    else if (isinf(s->hi)) {
        real_text(s->lo, 0, lo, sizeof lo);
        snprintf(out, n, "%s %s", open_lo ? ">" : ">=", lo);
    } else {
        real_text(s->lo, 0, lo, sizeof lo);
        real_text(s->hi, 0, hi, sizeof hi);
        snprintf(out, n, "%c%s, %s%c", open_lo ? '(' : '[', lo, hi, open_hi ? ')' : ']');
    }
}

void mg_setting_range(const mg_setting *s, char *out, size_t n) {
    char b[80];
    bounds_text(s, b, sizeof b);
    const char *in = b[0] == '>' ? "" : "in ";
    switch (s->kind) {
    case MG_KIND_INT:
    case MG_KIND_I64: snprintf(out, n, "an integer %s%s", in, b); break;
    case MG_KIND_U64: snprintf(out, n, "a decimal integer in [0, 2^64)"); break;
    case MG_KIND_F64:
    case MG_KIND_F32: snprintf(out, n, "a number %s%s", in, b); break;
    case MG_KIND_FLAG: snprintf(out, n, "no value"); break;
    case MG_KIND_CHOICE: snprintf(out, n, "one of %s", s->choices); break;
    default: snprintf(out, n, "text");
    }
}

/* The value at base as an integer or a double, for the range checks. */
static int64_t int_of(const mg_setting *s, const void *base) {
    switch (s->kind) {
    case MG_KIND_INT:
    case MG_KIND_FLAG:
    case MG_KIND_CHOICE: return *AT_C(int, s, base);
    case MG_KIND_I64: return *AT_C(int64_t, s, base);
    default: return 0;
    }
}

static double real_of(const mg_setting *s, const void *base) {
    return s->kind == MG_KIND_F32 ? (double)*AT_C(float, s, base) : *AT_C(double, s, base);
}

mg_status mg_setting_check(const mg_setting *s, const void *base, mg_error *err) {
    char b[80], v[32];
    bounds_text(s, b, sizeof b);
    switch (s->kind) {
    case MG_KIND_INT:
    case MG_KIND_I64:
    case MG_KIND_FLAG: {
        const int64_t x = int_of(s, base);
        if (x < s->ilo || x > s->ihi)
            return mg_fail(err, MG_ERR_ARG, "%s %" PRId64 " is not %s%s", s->key, x,
                           b[0] == '>' ? "" : "in ", b);
        return MG_OK;
    }
    case MG_KIND_F64:
    case MG_KIND_F32:
        if (real_in(s, real_of(s, base))) return MG_OK;
        real_text(real_of(s, base), s->kind == MG_KIND_F32, v, sizeof v);
        return mg_fail(err, MG_ERR_ARG, "%s %s is not %s%s", s->key, v,
                       b[0] == '>' ? "" : "in ", b);
    default: return MG_OK;
    }
}

/* s for echoing in a message: cut to 60 characters + "... (LEN chars)". */
static void echo(const char *s, char *out, size_t n) {
    const size_t len = strlen(s);
    if (len <= 72)
        snprintf(out, n, "%s", s);
    else
        snprintf(out, n, "%.60s... (%zu chars)", s, len);
}

/* The index of text among the '|'-separated words, or -1. */
static int choice_index(const char *words, const char *text) {
    const size_t len = strlen(text);
    int i = 0;
    for (const char *p = words; *p; i++) {
        const size_t w = strcspn(p, "|");
        if (w == len && !strncmp(p, text, len)) return i;
        p += w + (p[w] == '|');
    }
    return -1;
}

/* A real value for a F32 row: refused where the float would be another
 * value than rounding (out of range, or a nonzero value become 0 or
 * subnormal). */
static mg_status put_f32(const mg_setting *s, const char *opt, const char *shown, double v,
                         void *base, mg_error *err) {
    const float f = (float)v;
    char range[96];
    mg_setting_range(s, range, sizeof range);
    if (!real_in(s, (double)f))
        return mg_fail(err, MG_ERR_ARG,
                       "bad value '%s' for %s: a 32-bit float cannot hold it (it would be %g; "
                       "%s)",
                       shown, opt, (double)f, range);
    if (v != 0 && !isnormal(f))
        return mg_fail(err, MG_ERR_ARG,
                       "%s %s is too small to keep (it would be stored as %g): give 0 or at "
                       "least %g",
                       opt, shown, (double)f, (double)FLT_MIN);
    *AT(float, s, base) = f;
    return MG_OK;
}

mg_status mg_setting_parse(const mg_setting *s, const char *opt, const char *text, void *base,
                           mg_error *err) {
    char name[80], range[96], shown[96];
    if (!opt) snprintf(name, sizeof name, "--%s", s->cli);
    opt = opt ? opt : name;
    if (s->kind == MG_KIND_FLAG) {
        *AT(int, s, base) = !s->flag_default;
        return MG_OK;
    }
    if (s->kind == MG_KIND_STR) {
        *AT(const char *, s, base) = text;
        return MG_OK;
    }
    echo(text ? text : "", shown, sizeof shown);
    int ok = text && *text;
    char *end = NULL;
    errno = 0;
    if (ok && is_int(s)) {
        const long long v = strtoll(text, &end, 10);
        ok = !errno && !*end && v >= s->ilo && v <= s->ihi;
        if (ok && s->kind == MG_KIND_INT) *AT(int, s, base) = (int)v;
        if (ok && s->kind == MG_KIND_I64) *AT(int64_t, s, base) = (int64_t)v;
    } else if (ok && s->kind == MG_KIND_U64) {
        /* decimal digits only: strtoull alone would take " -1" as 2^64 - 1
         * and "0x10" as hex */
        for (const char *p = text; *p; p++) ok &= *p >= '0' && *p <= '9';
        const unsigned long long v = ok ? strtoull(text, &end, 10) : 0;
        ok = ok && !errno && !*end;
        if (ok) *AT(uint64_t, s, base) = (uint64_t)v;
    } else if (ok && s->kind == MG_KIND_CHOICE) {
        const int i = choice_index(s->choices, text);
        ok = i >= 0;
        if (ok) *AT(int, s, base) = i;
    } else if (ok) {
        const double v = strtod(text, &end);
        ok = !errno && !*end && real_in(s, v);
        if (ok && s->kind == MG_KIND_F32) return put_f32(s, opt, shown, v, base, err);
        if (ok) *AT(double, s, base) = v;
    }
    if (ok) return MG_OK;
    mg_setting_range(s, range, sizeof range);
    return mg_fail(err, MG_ERR_ARG, "bad value '%s' for %s (%s)", shown, opt, range);
}

void mg_setting_format(const mg_setting *s, const void *base, char *out, size_t n) {
    switch (s->kind) {
    case MG_KIND_STR: {
        const char *v = *AT_C(const char *, s, base);
        snprintf(out, n, "%s", v ? v : "(none)");
        break;
    }
    case MG_KIND_U64: snprintf(out, n, "%" PRIu64, *AT_C(uint64_t, s, base)); break;
    case MG_KIND_F64:
    case MG_KIND_F32: real_text(real_of(s, base), s->kind == MG_KIND_F32, out, n); break;
    case MG_KIND_CHOICE: {
        const char *p = s->choices;
        for (int i = *AT_C(int, s, base); i > 0 && *p; i--) {
            p += strcspn(p, "|");
            p += *p == '|';
        }
        snprintf(out, n, "%.*s", (int)strcspn(p, "|"), p);
        break;
    }
    default: snprintf(out, n, "%" PRId64, int_of(s, base));
    }
}

json_t *mg_setting_to_json(const mg_setting *s, const void *base) {
    char buf[32];
    switch (s->kind) {
    case MG_KIND_STR: {
        const char *v = *AT_C(const char *, s, base);
        return v ? json_string(v) : json_null();
    }
    case MG_KIND_U64: /* beyond int64: a decimal string */
        snprintf(buf, sizeof buf, "%" PRIu64, *AT_C(uint64_t, s, base));
        return json_string(buf);
    case MG_KIND_F64:
    case MG_KIND_F32: return json_real(real_of(s, base));
    case MG_KIND_FLAG: return json_boolean(*AT_C(int, s, base));
    default: return json_integer((json_int_t)int_of(s, base));
    }
}

/* A U64 value: a string of decimal digits. */
static int u64_from_json(const json_t *v, uint64_t *out) {
    const char *t = json_string_value(v);
    int ok = t && *t;
    for (const char *p = t; ok && *p; p++) ok = *p >= '0' && *p <= '9';
    char *end = NULL;
    errno = 0;
    const unsigned long long x = ok ? strtoull(t, &end, 10) : 0;
    if ((ok = ok && !errno && !*end)) *out = (uint64_t)x;
    return ok;
}

mg_status mg_setting_from_json(const mg_setting *s, const json_t *v, void *base, mg_error *err) {
    int ok = 0;
    switch (s->kind) {
    case MG_KIND_STR:
        if ((ok = json_is_string(v) || json_is_null(v)))
            *AT(const char *, s, base) = json_is_string(v) ? json_string_value(v) : NULL;
        break;
    case MG_KIND_U64: ok = u64_from_json(v, AT(uint64_t, s, base)); break;
    case MG_KIND_F64:
    case MG_KIND_F32:
        if ((ok = json_is_number(v) && real_in(s, json_number_value(v)))) {
            if (s->kind == MG_KIND_F64)
                *AT(double, s, base) = json_number_value(v);
            else
                *AT(float, s, base) = (float)json_number_value(v);
        }
        break;
    case MG_KIND_FLAG:
        if ((ok = json_is_boolean(v))) *AT(int, s, base) = json_is_true(v);
        break;
    default: {
        const json_int_t x = json_integer_value(v);
        if ((ok = json_is_integer(v) && x >= s->ilo && x <= s->ihi)) {
            if (s->kind == MG_KIND_I64)
                *AT(int64_t, s, base) = (int64_t)x;
            else
                *AT(int, s, base) = (int)x;
        }
    }
    }
    if (!ok) return mg_fail(err, MG_ERR_FORMAT, "\"%s\" missing or out of range", s->key);
    return MG_OK;
}

void mg_setting_copy(const mg_setting *s, void *dst, const void *src) {
    static const size_t size[] = {
        [MG_KIND_STR] = sizeof(const char *), [MG_KIND_INT] = sizeof(int),
        [MG_KIND_I64] = sizeof(int64_t),      [MG_KIND_U64] = sizeof(uint64_t),
        [MG_KIND_F64] = sizeof(double),       [MG_KIND_F32] = sizeof(float),
        [MG_KIND_FLAG] = sizeof(int),         [MG_KIND_CHOICE] = sizeof(int)};
    memcpy((char *)dst + s->offset, (const char *)src + s->offset, size[s->kind]);
}
