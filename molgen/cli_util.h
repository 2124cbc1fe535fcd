/* molgen: small helpers shared by the sample / attention / bench commands:
 * strict number parsing, option values, creating an output's directory. */
#ifndef MG_CLI_UTIL_H
#define MG_CLI_UTIL_H

#include <stddef.h>
#include <stdint.h>

#include "errors.h"
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

/* argv[*i] is an option that takes a value: "--opt VALUE" (advances *i) or
 * "--opt=VALUE". Returns 1 with *val set, or 0 with a message in err
 * ("option --opt needs a value"). An option spelled "--opt=VALUE" is cut at
 * the '=' in place (argv[*i] then reads "--opt"; argv must be writable, as
 * main's is). */
int mg_cli_value(int argc, char **argv, int *i, const char **val, mg_error *err);

/* The same without touching argv: the option's name ("--opt") goes to
 * name[namelen]. */
int mg_cli_option(int argc, char **argv, int *i, char *name, size_t namelen, const char **val,
                  mg_error *err);

/* 1 if argv[i]'s option name (before any '=') is in names (NULL-terminated). */
int mg_cli_known(const char *arg, const char *const *names);

/* The value option at argv[*i] of command `cmd` ("sample", ...): checks its
 * name against names (NULL-terminated), then reads it as mg_cli_option does.
 * Returns 1, or 0 after printing "molgen CMD: unknown option '...' (see
 * molgen CMD --help)" or "molgen CMD: option ... needs a value" to stderr
 * (the caller then exits with status 2). */
int mg_cli_take(const char *cmd, int argc, char **argv, int *i, const char *const *names,
                char *name, size_t namelen, const char **val);

/* Whole-string parses; return 1 on success, 0 on junk / out of range. */
int mg_cli_int(const char *s, long long lo, long long hi, long long *out);
int mg_cli_u64(const char *s, uint64_t *out); /* decimal digits only */
int mg_cli_double(const char *s, double *out); /* finite only */

/* s for echoing in a message: as is when shorter than n, else cut to its
 * first n - 24 characters + "... (LEN chars)" in buf[n] (n >= 32). */
const char *mg_cli_cut(const char *s, char *buf, size_t n);

/* Checks an output file before any work is done: the path is not empty, not
 * a directory, not the same file (device + inode, so also through links) as
 * any of inputs[0..n_inputs) (NULL entries skipped), and its directory
 * (created when missing) takes a new file: a probe file is created there
 * and removed. Returns 0, or -1 with a message. */
mg_status mg_cli_check_output(const char *path, const char *const *inputs, size_t n_inputs, mg_error *err);
/* The same for an output directory: not empty, created when missing, a
 * probe file can be created in it. */
mg_status mg_cli_check_output_dir(const char *dir, mg_error *err);

/* Writing an output atomically: mg_cli_atomic_open creates "<path>.tmp.<pid>"
 * (its name in tmp[tmplen]); mg_cli_atomic_commit flushes, closes and
 * renames it over path, or on any error (a full disk, EFBIG) removes it and
 * leaves path as it was. Both return NULL / -1 with a message. */
FILE *mg_cli_atomic_open(const char *path, char *tmp, size_t tmplen, mg_error *err);
mg_status mg_cli_atomic_commit(FILE *f, const char *tmp, const char *path, mg_error *err);

/* Loads a model for command `cmd` (model.h's mg_model_load): on an error
 * prints "molgen CMD: <reason>" and returns -1; a file without checksums
 * loads with a one-line note on stderr. */
struct mg_model;
struct mg_vocab;
int mg_cli_load_model(const char *cmd, const char *path, struct mg_model **m, struct mg_vocab **v);

/* mkdir -p of path's parent directory (nothing for a bare file name).
 * Returns 0, or -1 with a message. */
mg_status mg_cli_mkdir_parent(const char *path, mg_error *err);
/* mkdir -p dir. */
mg_status mg_cli_mkdir_p(const char *dir, mg_error *err);

#ifdef __cplusplus
}
#endif
#endif /* MG_CLI_UTIL_H */
