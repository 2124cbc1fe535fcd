/* molgen training settings: the table of train_settings.h as data, and the
 * code that parses, checks, prints and stores any line of it (see train.h). */
#define _POSIX_C_SOURCE 200809L
#include "train.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Range columns as each kind uses them (a real bound such as 1e30 must not
 * become an integer constant). */
#define MG_ILIM_STR(x) 0
#define MG_ILIM_INT(x) ((int64_t)(x))
#define MG_ILIM_I64(x) ((int64_t)(x))
#define MG_ILIM_U64(x) 0
#define MG_ILIM_F64(x) 0
#define MG_ILIM_F32(x) 0
#define MG_ILIM_FLAG(x) ((int64_t)(x))
#define MG_FLAGDEF_STR(x) 0
#define MG_FLAGDEF_INT(x) 0
#define MG_FLAGDEF_I64(x) 0
#define MG_FLAGDEF_U64(x) 0
#define MG_FLAGDEF_F64(x) 0
#define MG_FLAGDEF_F32(x) 0
#define MG_FLAGDEF_FLAG(x) (x)
#define MG_SETTING_ROW(key, field, kind, cli, arg, def, lo, hi, bounds, save, resume, group, help) \
    {#key,                                                                                         \
     cli,                                                                                          \
     arg,                                                                                          \
     group,                                                                                        \
     help,                                                                                         \
     MG_KIND_##kind,                                                                               \
     MG_SAVE_##save,                                                                               \
     MG_RESUME_##resume,                                                                           \
     (double)(lo),                                                                                 \
     (double)(hi),                                                                                 \
     MG_ILIM_##kind(lo),                                                                           \
     MG_ILIM_##kind(hi),                                                                           \
     bounds,                                                                                       \
     MG_FLAGDEF_##kind(def),                                                                       \
     offsetof(mg_train_config, field)},

const mg_setting MG_TRAIN_SETTING[] = {MG_TRAIN_SETTINGS(MG_SETTING_ROW)};
const size_t MG_TRAIN_NUM_SETTINGS = sizeof MG_TRAIN_SETTING / sizeof MG_TRAIN_SETTING[0];

/* Defaults: the table's, except model.* and optim.* (their owners'). */
#define MG_DEF_RUN(field, def) c->field = def;
#define MG_DEF_CKPT(field, def) c->field = def;
#define MG_DEF_CKPT_NEW(field, def) c->field = def;
#define MG_DEF_MODEL(field, def)
#define MG_DEF_OPTIM(field, def)
#define MG_SETTING_DEFAULT(key, field, kind, cli, arg, def, lo, hi, bounds, save, resume, group,   \
                           help)                                                                   \
    MG_DEF_##save(field, def)

void mg_train_config_default(mg_train_config *c) {
    memset(c, 0, sizeof *c);
    mg_model_config_default(&c->model);
    mg_adamw_config_default(&c->optim);
    MG_TRAIN_SETTINGS(MG_SETTING_DEFAULT)
}

const mg_setting *mg_setting_find(const char *key) {
    for (size_t i = 0; key && i < MG_TRAIN_NUM_SETTINGS; i++)
        if (!strcmp(MG_TRAIN_SETTING[i].key, key)) return &MG_TRAIN_SETTING[i];
    return NULL;
}

#define AT(type, s, c) ((type *)((char *)(c) + (s)->offset))
#define AT_C(type, s, c) ((const type *)((const char *)(c) + (s)->offset))

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

/* "[1, 1024]", "[0, 1)" */
static void bounds_text(const mg_setting *s, char *out, size_t n) {
    const char open = (s->bounds == MG_OPEN_LO || s->bounds == MG_OPEN) ? '(' : '[';
    const char close = (s->bounds == MG_OPEN_HI || s->bounds == MG_OPEN) ? ')' : ']';
    if ((s->kind == MG_KIND_INT || s->kind == MG_KIND_I64) && s->ihi >= INT32_MAX)
        snprintf(out, n, ">= %" PRId64, s->ilo); /* the bound is an overflow guard, not a choice */
    else if (s->kind == MG_KIND_INT || s->kind == MG_KIND_I64 || s->kind == MG_KIND_FLAG)
        snprintf(out, n, "[%" PRId64 ", %" PRId64 "]", s->ilo, s->ihi);
    else {
        char lo[26], hi[26];
        real_text(s->lo, 0, lo, sizeof lo);
        real_text(s->hi, 0, hi, sizeof hi);
        snprintf(out, n, "%c%s, %s%c", open, lo, hi, close);
    }
}

void mg_setting_range(const mg_setting *s, char *out, size_t n) {
    char b[80];
    bounds_text(s, b, sizeof b);
    switch (s->kind) {
    case MG_KIND_INT:
    case MG_KIND_I64: snprintf(out, n, "an integer %s%s", b[0] == '>' ? "" : "in ", b); break;
    case MG_KIND_U64: snprintf(out, n, "a decimal integer in [0, 2^64)"); break;
    case MG_KIND_F64:
    case MG_KIND_F32: snprintf(out, n, "a number in %s", b); break;
    case MG_KIND_FLAG: snprintf(out, n, "no value"); break;
    default: snprintf(out, n, "text");
    }
}

/* The value in c as a double or an integer, for the range checks. */
static int64_t int_of(const mg_setting *s, const mg_train_config *c) {
    switch (s->kind) {
    case MG_KIND_INT:
    case MG_KIND_FLAG: return *AT_C(int, s, c);
    case MG_KIND_I64: return *AT_C(int64_t, s, c);
    default: return 0;
    }
}

static double real_of(const mg_setting *s, const mg_train_config *c) {
    return s->kind == MG_KIND_F32 ? (double)*AT_C(float, s, c) : *AT_C(double, s, c);
}

mg_status mg_setting_check(const mg_setting *s, const mg_train_config *c, mg_error *err) {
    char b[80];
    bounds_text(s, b, sizeof b);
    switch (s->kind) {
    case MG_KIND_INT:
    case MG_KIND_I64:
    case MG_KIND_FLAG: {
        const int64_t v = int_of(s, c);
        if (v < s->ilo || v > s->ihi)
            return mg_fail(err, MG_ERR_ARG, "%s %" PRId64 " is not %s%s", s->key, v,
                           b[0] == '>' ? "" : "in ", b);
        return MG_OK;
    }
    case MG_KIND_F64:
    case MG_KIND_F32:
        if (!real_in(s, real_of(s, c))) {
            char v[32];
            real_text(real_of(s, c), s->kind == MG_KIND_F32, v, sizeof v);
            return mg_fail(err, MG_ERR_ARG, "%s %s is not in %s", s->key, v, b);
        }
        return MG_OK;
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

mg_status mg_setting_parse(const mg_setting *s, const char *text, mg_train_config *c,
                           mg_error *err) {
    if (s->kind == MG_KIND_FLAG) {
        *AT(int, s, c) = !s->flag_default;
        return MG_OK;
    }
    if (s->kind == MG_KIND_STR) {
        *AT(const char *, s, c) = text;
        return MG_OK;
    }
    char range[96], shown[96];
    mg_setting_range(s, range, sizeof range);
    echo(text ? text : "", shown, sizeof shown);
    int ok = text && *text;
    char *end = NULL;
    errno = 0;
    if (ok && (s->kind == MG_KIND_INT || s->kind == MG_KIND_I64)) {
        const long long v = strtoll(text, &end, 10);
        ok = !errno && !*end && v >= s->ilo && v <= s->ihi;
        if (ok && s->kind == MG_KIND_INT) *AT(int, s, c) = (int)v;
        if (ok && s->kind == MG_KIND_I64) *AT(int64_t, s, c) = (int64_t)v;
    } else if (ok && s->kind == MG_KIND_U64) {
        /* decimal digits only: strtoull alone would take " -1" as 2^64 - 1
         * and "0x10" as hex */
        for (const char *p = text; *p; p++) ok &= *p >= '0' && *p <= '9';
        const unsigned long long v = ok ? strtoull(text, &end, 10) : 0;
        ok = ok && !errno && !*end;
        if (ok) *AT(uint64_t, s, c) = (uint64_t)v;
    } else if (ok) {
        const double v = strtod(text, &end);
        ok = !errno && !*end && real_in(s, v);
        if (ok && s->kind == MG_KIND_F64) *AT(double, s, c) = v;
        if (ok && s->kind == MG_KIND_F32) {
            /* a float setting: refused where the float would be another
             * value than rounding (out of range, or a nonzero value become
             * 0 or subnormal) */
            const float f = (float)v;
            if (!real_in(s, (double)f) || (v != 0 && !isnormal(f)))
                return mg_fail(err, MG_ERR_ARG,
                               "bad value '%s' for --%s: a 32-bit float cannot hold it (it would "
                               "be %g; %s)",
                               shown, s->cli, (double)f, range);
            *AT(float, s, c) = f;
        }
    }
    if (!ok) return mg_fail(err, MG_ERR_ARG, "bad value '%s' for --%s (%s)", shown, s->cli, range);
    return MG_OK;
}

void mg_setting_format(const mg_setting *s, const mg_train_config *c, char *out, size_t n) {
    switch (s->kind) {
    case MG_KIND_STR: {
        const char *v = *AT_C(const char *, s, c);
        snprintf(out, n, "%s", v ? v : "(none)");
        break;
    }
    case MG_KIND_U64: snprintf(out, n, "%" PRIu64, *AT_C(uint64_t, s, c)); break;
    case MG_KIND_F64:
    case MG_KIND_F32: real_text(real_of(s, c), s->kind == MG_KIND_F32, out, n); break;
    default: snprintf(out, n, "%" PRId64, int_of(s, c));
    }
}

json_t *mg_setting_to_json(const mg_setting *s, const mg_train_config *c) {
    char buf[32];
    switch (s->kind) {
    case MG_KIND_STR: {
        const char *v = *AT_C(const char *, s, c);
        return v ? json_string(v) : json_null();
    }
    case MG_KIND_U64: /* beyond int64: a decimal string */
        snprintf(buf, sizeof buf, "%" PRIu64, *AT_C(uint64_t, s, c));
        return json_string(buf);
    case MG_KIND_F64:
    case MG_KIND_F32: return json_real(real_of(s, c));
    case MG_KIND_FLAG: return json_boolean(*AT_C(int, s, c));
    default: return json_integer((json_int_t)int_of(s, c));
    }
}

mg_status mg_setting_from_json(const mg_setting *s, const json_t *v, mg_train_config *c,
                               mg_error *err) {
    int ok = 0;
    switch (s->kind) {
    case MG_KIND_STR:
        if ((ok = json_is_string(v) || json_is_null(v)))
            *AT(const char *, s, c) = json_is_string(v) ? json_string_value(v) : NULL;
        break;
    case MG_KIND_U64: {
        const char *t = json_string_value(v);
        ok = t && *t;
        for (const char *p = t; ok && *p; p++) ok = *p >= '0' && *p <= '9';
        char *end = NULL;
        errno = 0;
        const unsigned long long x = ok ? strtoull(t, &end, 10) : 0;
        if ((ok = ok && !errno && !*end)) *AT(uint64_t, s, c) = (uint64_t)x;
        break;
    }
    case MG_KIND_F64:
    case MG_KIND_F32:
        if ((ok = json_is_number(v) && real_in(s, json_number_value(v)))) {
            if (s->kind == MG_KIND_F64)
                *AT(double, s, c) = json_number_value(v);
            else
                *AT(float, s, c) = (float)json_number_value(v);
        }
        break;
    case MG_KIND_FLAG:
        if ((ok = json_is_boolean(v))) *AT(int, s, c) = json_is_true(v);
        break;
    default: {
        const json_int_t x = json_integer_value(v);
        if ((ok = json_is_integer(v) && x >= s->ilo && x <= s->ihi)) {
            if (s->kind == MG_KIND_INT)
                *AT(int, s, c) = (int)x;
            else
                *AT(int64_t, s, c) = (int64_t)x;
        }
    }
    }
    if (!ok) return mg_fail(err, MG_ERR_FORMAT, "\"%s\" missing or out of range", s->key);
    return MG_OK;
}

void mg_setting_copy(const mg_setting *s, mg_train_config *dst, const mg_train_config *src) {
    static const size_t size[] = {
        [MG_KIND_STR] = sizeof(const char *), [MG_KIND_INT] = sizeof(int),
        [MG_KIND_I64] = sizeof(int64_t),      [MG_KIND_U64] = sizeof(uint64_t),
        [MG_KIND_F64] = sizeof(double),       [MG_KIND_F32] = sizeof(float),
        [MG_KIND_FLAG] = sizeof(int)};
    memcpy((char *)dst + s->offset, (const char *)src + s->offset, size[s->kind]);
}

mg_status mg_train_config_check(const mg_train_config *c, mg_error *err) {
    if (!c) return mg_fail(err, MG_ERR_ARG, "train config is NULL");
    for (size_t i = 0; i < MG_TRAIN_NUM_SETTINGS; i++) {
        const mg_status rc = mg_setting_check(&MG_TRAIN_SETTING[i], c, err);
        if (rc) return rc;
    }
    return MG_OK;
}
