/* molgen option tables: every option of every command is one row of its
 * command's table (train: the MG_TRAIN_SETTINGS lines of train_settings.h;
 * the others: a static table in cmd_<name>.c). A row says the option's
 * name, kind, range, --help text and destination (an offset into the
 * command's settings struct); from it come parsing and the range check
 * (here), the checkpoint's JSON of a training setting (here, for
 * checkpoint.c) and the option loop and --help (cli_options.h). No argv,
 * no printing. */
#ifndef MG_OPTION_TABLE_H
#define MG_OPTION_TABLE_H

#include <float.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "base/errors.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The value's C type at the destination: STR const char * (kept by pointer),
 * INT int, I64 int64_t, U64 uint64_t (decimal digits only), F64 double, F32
 * float (0 or a normal float that is the value given, rounded), FLAG int (the
 * option takes no value and sets the opposite of its default), CHOICE int
 * (the index of the word given in choices "kv|naive"). */
typedef enum {
    MG_KIND_STR,
    MG_KIND_INT,
    MG_KIND_I64,
    MG_KIND_U64,
    MG_KIND_F64,
    MG_KIND_F32,
    MG_KIND_FLAG,
    MG_KIND_CHOICE
} mg_setting_kind;
/* train's checkpoint and resume columns (train_settings.h says what they
 * mean); the other commands' rows leave them 0 (RUN, NEW). */
typedef enum {
    MG_SAVE_RUN,
    MG_SAVE_CKPT,
    MG_SAVE_CKPT_NEW,
    MG_SAVE_MODEL,
    MG_SAVE_OPTIM
} mg_setting_save;
typedef enum { MG_RESUME_NEW, MG_RESUME_SAME, MG_RESUME_PATH } mg_setting_resume;
/* The range [lo, hi], [lo, hi), (lo, hi], (lo, hi) of INT, I64, F64, F32. */
enum { MG_CLOSED, MG_OPEN_HI, MG_OPEN_LO, MG_OPEN };

typedef struct {
    const char *key;   /* the name in messages (train: the checkpoint's JSON key) */
    const char *cli;   /* the option without "--" */
    const char *arg;   /* its value in --help ("" for a FLAG) */
    const char *group; /* the --help section (NULL: none) */
    const char *help;  /* one sentence; --help adds the default and the range */
    mg_setting_kind kind;
    mg_setting_save save;
    mg_setting_resume resume;
    double lo, hi;    /* the range of F64 / F32 values (hi INFINITY: none) */
    int64_t ilo, ihi; /* the range of INT / I64 values */
    int bounds;       /* MG_CLOSED ... */
    int flag_default; /* a FLAG's default (the option sets the opposite) */
    size_t offset;    /* of the value in the command's settings struct */
    char short_name;  /* -x besides --cli (0: none) */
    const char *alias;   /* another long name (NULL: none) */
    const char *choices; /* CHOICE: the words, '|'-separated */
    const char *shown_default; /* --help's default when the value's text is not it
                                  ("ATTN_NUM_THREADS or all cores"); NULL: the value */
} mg_setting;

/* Rows for the commands' tables, in designated initializers so that a row
 * can add .short_name, .alias, .shown_default: {MG_OPT_INT(T, ...), .short_name = 'n'}.
 * T is the settings struct, field its member. */
#define MG_OPT_BASE(T, name, arg_, field, kind_, help_)                                           \
    .key = name, .cli = name, .arg = arg_, .help = help_, .kind = MG_KIND_##kind_,               \
    .offset = offsetof(T, field)
#define MG_OPT_STR(T, name, arg, field, help) MG_OPT_BASE(T, name, arg, field, STR, help)
#define MG_OPT_INT(T, name, arg, field, lo_, hi_, help)                                            \
    MG_OPT_BASE(T, name, arg, field, INT, help), .ilo = lo_, .ihi = hi_, .lo = lo_, .hi = hi_
#define MG_OPT_I64(T, name, arg, field, lo_, hi_, help)                                            \
    MG_OPT_BASE(T, name, arg, field, I64, help), .ilo = lo_, .ihi = hi_, .lo = lo_, .hi = hi_
#define MG_OPT_U64(T, name, arg, field, help) MG_OPT_BASE(T, name, arg, field, U64, help)
#define MG_OPT_F64(T, name, arg, field, lo_, hi_, bounds_, help)                                   \
    MG_OPT_BASE(T, name, arg, field, F64, help), .lo = lo_, .hi = hi_, .bounds = bounds_
#define MG_OPT_F32(T, name, arg, field, lo_, hi_, bounds_, help)                                   \
    MG_OPT_BASE(T, name, arg, field, F32, help), .lo = lo_, .hi = hi_, .bounds = bounds_
/* A FLAG whose default is 0 (the option sets 1); .flag_default = 1 for the
 * opposite. */
#define MG_OPT_FLAG(T, name, field, help) MG_OPT_BASE(T, name, "", field, FLAG, help), .ihi = 1
#define MG_OPT_CHOICE(T, name, words, field, help)                                                 \
    MG_OPT_BASE(T, name, words, field, CHOICE, help), .choices = words

/* Parses a command-line value into base's field and checks its range (a
 * FLAG takes NULL and gets the opposite of its default). opt is the option
 * as given, for the message (NULL: "--cli"). MG_ERR_ARG "bad value 'x' for
 * --cli (an integer in [0, 10])"; a F32 that rounds out of its range: "bad
 * value 'x' for --cli: a 32-bit float cannot hold it (it would be V;
 * RANGE)"; a nonzero F32 that would be kept as 0 or a subnormal: "--cli x
 * is too small to keep (it would be stored as V): give 0 or at least
 * FLT_MIN". */
mg_status mg_setting_parse(const mg_setting *s, const char *opt, const char *text, void *base,
                           mg_error *err);
/* base's value of s within its range? MG_ERR_ARG "key N is not in [lo, hi]". */
mg_status mg_setting_check(const mg_setting *s, const void *base, mg_error *err);
/* dst's value of s = src's. */
void mg_setting_copy(const mg_setting *s, void *dst, const void *src);
/* The value as text: reals in the fewest digits that read back as the
 * value ("0.05", "0.99999994"), "(none)" for a NULL string, a CHOICE's word. */
void mg_setting_format(const mg_setting *s, const void *base, char *out, size_t n);
/* The range as text: "an integer in [1, 1024]", "an integer >= 0", "a
 * number in [0, 1)", "a number >= 0", "a decimal integer in [0, 2^64)",
 * "one of kv|naive", "no value", "text". */
void mg_setting_range(const mg_setting *s, char *out, size_t n);
/* The value as a JSON value (a new reference; NULL when out of memory or a
 * string is not UTF-8), and back (type and range checked; a string is kept
 * by pointer into v); MG_ERR_FORMAT "\"key\" missing or out of range". */
json_t *mg_setting_to_json(const mg_setting *s, const void *base);
mg_status mg_setting_from_json(const mg_setting *s, const json_t *v, void *base, mg_error *err);

#ifdef __cplusplus
}
#endif
#endif /* MG_OPTION_TABLE_H */
