/* molgen: the command line of every command from its option table
 * (option_table.h): the option loop, the range checks and --help. A command
 * is parse (mg_cli_parse) -> engine -> print.
 *
 * Options are exact long names (a row's cli and alias; getopt_long alone
 * would take a unique prefix) and a row's short name, as --opt VALUE or
 * --opt=VALUE, up to the first argument that is not one; -h / --help prints
 * the help. Values are stored after the whole line is read, table by table
 * in row order (the last of a repeated option wins), so that an option's
 * effect does not depend on where it stands. */
#ifndef MG_CLI_OPTIONS_H
#define MG_CLI_OPTIONS_H

#include <stddef.h>
#include <stdio.h>

#include "base/option_table.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Rows that several commands' tables share (T: the settings struct, with
 * members threads, model and raw): the same option, range and help in each. */
#define MG_CLI_OPT_THREADS(T)                                                                      \
    MG_OPT_INT(T, "threads", "N", threads, 1, MG_MAX_THREADS, "threads"),                          \
        .shown_default = "ATTN_NUM_THREADS or all cores"
#define MG_CLI_OPT_MODEL(T)                                                                        \
    MG_OPT_STR(T, "model", "FILE", model,                                                          \
               "model or checkpoint (.safetensors) with its vocabulary (required)")
#define MG_CLI_OPT_RAW_WEIGHTS(T)                                                                  \
    MG_OPT_FLAG(T, "raw-weights", raw,                                                             \
                "a checkpoint of train --ema: its last step's parameters, not the averaged "      \
                "ones (the default)")

/* Rows a command may have, all its tables together. */
#define MG_CLI_MAX_ROWS 96

/* Rows and the settings struct they write (base). Until parsed, base holds
 * the defaults: --help shows them from there. */
typedef struct {
    const mg_setting *rows;
    size_t n;
    void *base;
} mg_cli_table;

typedef struct {
    const char *name;  /* "sample": "molgen sample: ..." */
    const char *usage; /* --help before the options */
    const char *notes; /* --help after them (NULL: none) */
    mg_cli_table tables[2];
    size_t n_tables;
} mg_cli_spec;

/* A row's option as given on the command line (opt[0] 0: not given) and
 * its value (NULL for a FLAG). */
typedef struct {
    char opt[48];
    const char *text;
} mg_cli_value;

/* Reads argv (argv[0]: the command) into vals (one per row, the tables'
 * rows in order). Returns 0, -1 after printing --help on stdout (the
 * command then exits 0), or 2 after a usage message on stderr ("unknown
 * option", "needs a value", "unexpected argument"). */
int mg_cli_read(const mg_cli_spec *spec, int argc, char **argv, mg_cli_value *vals);
/* Stores the given values (vals as mg_cli_read left them) of table t into
 * its base,
 * each checked against its row; 0, or 2 after "molgen CMD: bad value ...
 * (see molgen CMD --help)". */
int mg_cli_apply(const mg_cli_spec *spec, size_t t, const mg_cli_value *vals);
/* mg_cli_read, then mg_cli_apply of every table. vals may be NULL. */
int mg_cli_parse(const mg_cli_spec *spec, int argc, char **argv, mg_cli_value *vals);
/* "molgen CMD: <message> (see molgen CMD --help)" on stderr; returns 2. */
int mg_cli_usage(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* The help: usage, then every option by group (in the order the groups
 * first come, over the tables), each with its default (where it has one)
 * and range, "[same on resume]" for a row of resume column SAME; then the
 * notes. */
void mg_cli_help(FILE *f, const mg_cli_spec *spec);

#ifdef __cplusplus
}
#endif
#endif /* MG_CLI_OPTIONS_H */
