/* molgen: small helpers shared by the sample / attention / bench commands:
 * strict number parsing, option values, creating an output's directory. */
#ifndef MG_CLI_UTIL_H
#define MG_CLI_UTIL_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* argv[*i] is an option that takes a value: "--opt VALUE" (advances *i) or
 * "--opt=VALUE". Returns 1 with *val set, or 0 with a message in err
 * ("option --opt needs a value"). An option spelled "--opt=VALUE" is cut at
 * the '=' in place (argv[*i] then reads "--opt"; argv must be writable, as
 * main's is). */
int mg_cli_value(int argc, char **argv, int *i, const char **val, char *err, size_t errlen);

/* The same without touching argv: the option's name ("--opt") goes to
 * name[namelen]. */
int mg_cli_option(int argc, char **argv, int *i, char *name, size_t namelen, const char **val,
                  char *err, size_t errlen);

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
int mg_cli_u64(const char *s, uint64_t *out);
int mg_cli_double(const char *s, double *out); /* finite only */

/* mkdir -p of path's parent directory (nothing for a bare file name).
 * Returns 0, or -1 with a message. */
int mg_cli_mkdir_parent(const char *path, char *err, size_t errlen);
/* mkdir -p dir. */
int mg_cli_mkdir_p(const char *dir, char *err, size_t errlen);

#ifdef __cplusplus
}
#endif
#endif /* MG_CLI_UTIL_H */
