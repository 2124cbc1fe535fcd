/* molgen: the helpers every command shares (the command layer; the engine
 * never calls them): option parsing, strict numbers, output checks, atomic
 * output files, loading a model with its messages. */
#ifndef MG_CLI_UTIL_H
#define MG_CLI_UTIL_H

#include <getopt.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "errors.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Option parsing for every command: getopt_long over argv (argv[0] is the
 * command's name), exact long names only (getopt_long alone would take a
 * unique prefix), --opt VALUE and --opt=VALUE, stopping at the first
 * argument that is not an option. mg_cli_begin() before the first
 * mg_cli_next() of a command. mg_cli_next returns the next option's val
 * (*value its argument or NULL), -1 at the end, or -2 after printing
 * "molgen CMD: unknown option '--x'", "... option --x needs a value" or
 * "... unexpected argument 'x'" (each with "(see molgen CMD --help)") to
 * stderr; the caller then exits with status 2. */
void mg_cli_begin(void);
int mg_cli_next(const char *cmd, int argc, char **argv, const char *shorts,
                const struct option *opts, const char **value);
/* After mg_cli_next returned an option whose value does not parse: prints
 * "molgen CMD: bad value 'V' for --opt (see molgen CMD --help)" and returns 2. */
int mg_cli_bad_value(const char *cmd, char **argv, const char *value);

/* Whole-string parses; return 1 on success, 0 on junk / out of range. */
int mg_cli_int(const char *s, long long lo, long long hi, long long *out);
int mg_cli_u64(const char *s, uint64_t *out);  /* decimal digits only */
int mg_cli_double(const char *s, double *out); /* finite only */

/* s for echoing in a message: as is when shorter than n, else cut to its
 * first n - 24 characters + "... (LEN chars)" in buf[n] (n >= 32). */
const char *mg_cli_cut(const char *s, char *buf, size_t n);

/* Checks an output file before any work is done: the path is not empty, not
 * a directory, not the same file (device + inode, so also through links) as
 * any of inputs[0..n_inputs) (NULL entries skipped), and its directory
 * (created when missing) takes a new file: a probe file is created there
 * and removed. Returns 0, or -1 with a message. */
mg_status mg_cli_check_output(const char *path, const char *const *inputs, size_t n_inputs,
                              mg_error *err);
/* The same for an output directory: not empty, created when missing, a
 * probe file can be created in it. */
mg_status mg_cli_check_output_dir(const char *dir, mg_error *err);

/* Writing an output atomically: mg_cli_atomic_open creates "<path>.tmp.<pid>"
 * (its name in tmp[tmplen]); mg_cli_atomic_commit flushes, closes and
 * renames it over path, or on any error (a full disk, EFBIG) removes it and
 * leaves path as it was. Both return NULL / -1 with a message. */
FILE *mg_cli_atomic_open(const char *path, char *tmp, size_t tmplen, mg_error *err);
mg_status mg_cli_atomic_commit(FILE *f, const char *tmp, const char *path, mg_error *err);
/* mg_cli_atomic_commit when the writer succeeded (write_rc 0); else closes
 * and removes the temporary: "error writing PATH (nothing written)". */
mg_status mg_cli_atomic_commit_if(FILE *f, int write_rc, const char *tmp, const char *path,
                                  mg_error *err);

/* Loads a model for command `cmd` (model.h's mg_model_load with flags): on
 * an error prints "molgen CMD: <reason>" and returns -1; a file without
 * checksums, and one whose averaged weights are used, load with a one-line
 * note on stderr; *averaged (may be NULL): mg_model_file_info's. Under mpirun (dist.h) every rank
 * loads it and all return -1 when one failed, which alone says why. */
struct mg_model;
struct mg_vocab;
int mg_cli_load_model(const char *cmd, const char *path, unsigned flags, struct mg_model **m,
                      struct mg_vocab **v, int *averaged);

/* Under mpirun (dist.h) the output is rank 0's: rank 0 checks path
 * (mg_cli_check_output, then removes stale temporaries) and prints
 * "molgen CMD: --out: <reason>"; every rank returns its verdict, 0 or -1.
 * Alone: the same for this process. Collective. */
int mg_cli_check_output_ranks(const char *cmd, const char *path, const char *const *inputs,
                              size_t n_inputs);
/* "molgen CMD: <message>" on stderr, "molgen CMD: rank K of N: <message>"
 * under mpirun; nothing for MG_ERR_PEER (the failed rank says why). */
void mg_cli_report(const char *cmd, mg_status rc, const mg_error *err);

/* mkdir -p of path's parent directory (nothing for a bare file name).
 * Returns 0, or -1 with a message. */
mg_status mg_cli_mkdir_parent(const char *path, mg_error *err);
/* mkdir -p dir. */
mg_status mg_cli_mkdir_p(const char *dir, mg_error *err);

#ifdef __cplusplus
}
#endif
#endif /* MG_CLI_UTIL_H */
