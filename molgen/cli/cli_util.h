/* molgen: the helpers every command shares (the command layer; the engine
 * never calls them): the option loop (cli_options.h reads the option tables
 * through it), output checks, atomic output files, loading a model with its
 * messages. */
#ifndef MG_CLI_UTIL_H
#define MG_CLI_UTIL_H

#include <getopt.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "base/errors.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The option loop under cli_options.h: getopt_long over argv (argv[0] is the
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
/* s for echoing in a message: as is when shorter than n, else cut to its
 * first n - 24 characters + "... (LEN chars)" in buf[n] (n >= 32). */
const char *mg_cli_cut(const char *s, char *buf, size_t n);

/* Outputs. Every file a command writes is checked before any work
 * (mg_cli_claim_outputs) and written by kind (mg_cli_output_kind):
 *  - a new name or a regular file: to a new temporary beside it,
 *    "<target>.tmp.<pid>.XXXXXX" (util.h's mg_temp_create), renamed over
 *    <target> at the end (nothing half-written is ever seen); <target> is the
 *    path with its symbolic links followed, so a link is kept and the file it
 *    names is replaced (a dangling link: the file it names is created);
 *  - an existing FIFO or character device (/dev/null, a tty): written
 *    through, opened as it is (no temporary, no rename), never replaced;
 *  - this process's standard output or error under any name (/dev/stdout,
 *    /proc/self/fd/1, the file stdout is redirected to): written through
 *    that descriptor;
 *  - a directory, block device or socket: refused. */
enum { MG_CLI_OUT_FILE = 0, MG_CLI_OUT_STREAM = 1, MG_CLI_OUT_STDOUT = 2 };
/* The kind path would be written as (MG_CLI_OUT_STDOUT: fd 1 itself;
 * stderr counts as a STREAM); MG_CLI_OUT_FILE for anything refused too. */
int mg_cli_output_kind(const char *path);
/* path with the symbolic links of its last component followed (up to 40),
 * in buf[n]: the name a FILE output is renamed to. Returns buf, or path
 * itself when it cannot be resolved (a loop, too long). */
const char *mg_cli_output_target(const char *path, char *buf, size_t n);
/* 1 when a and b (both given) name the same existing file (device + inode,
 * links followed). */
int mg_cli_same_file(const char *a, const char *b);

/* One file of a command: its option (for messages), its path (NULL: not
 * given, skipped) and, for outputs, flags. */
enum {
    MG_CLI_WHOLE = 1, /* written whole and renamed (a checkpoint): no FIFO or device */
    MG_CLI_BESIDE = 2 /* written beside the first output (a sidecar): its lock covers it */
};
typedef struct {
    const char *opt, *path;
    unsigned flags;
} mg_cli_file;
/* Checks and claims a command's outputs outs[0..n_out) before any work:
 * each is not empty, not a directory / block device / socket, not a FIFO or
 * device when MG_CLI_WHOLE; a FILE output's directory (created when
 * missing) takes a new file (a probe is created and removed); no FILE
 * output is the same file (device + inode; two new names: the same name in
 * the same directory) as an input ins[0..n_in) that is a regular file, or
 * as another output; then each FILE output (MG_CLI_BESIDE excepted) is
 * locked: "<target>.lock" created new (O_EXCL semantics: a temporary
 * linked to the name), holding the line "molgen lock pid P", flock'ed
 * (LOCK_EX | LOCK_NB) and removed at exit. The lock file, not the output,
 * is locked because the output is replaced by rename (a lock on it would
 * go with the old inode); a lock held by this process already is taken
 * again; molgen's own lock that nobody holds (a killed run's) is replaced;
 * anything else at the name (a user's file, a link, a hard link to another
 * file, a FIFO) is refused and left untouched. Returns 0, or -1 with a
 * message naming the option ("--out F is the --model file M (same file):
 * ..."; "--out F is being written by another molgen (pid P); refusing to
 * start"; "--out F: F.lock is there and is not molgen's lock file ..."). */
mg_status mg_cli_check_outputs(const mg_cli_file *outs, size_t n_out, const mg_cli_file *ins,
                               size_t n_in, mg_error *err);
/* mg_cli_check_outputs for command cmd, collective: under mpirun (dist.h)
 * the outputs are rank 0's, so rank 0 checks and locks them (then removes
 * the stale temporaries of each FILE output, mg_st_remove_stale_temps) and
 * prints "molgen CMD: <reason>"; every rank returns -1 when rank 0 failed,
 * else the number of temporaries removed (0 on the other ranks). Alone:
 * the same for this process. */
int mg_cli_claim_outputs(const char *cmd, const mg_cli_file *outs, size_t n_out,
                         const mg_cli_file *ins, size_t n_in);
/* An output directory (its files are claimed on their own): not empty,
 * created when missing, a probe file can be created in it. */
mg_status mg_cli_check_output_dir(const char *dir, mg_error *err);

/* Writing an output by its kind: mg_cli_atomic_open opens a FILE output's
 * temporary "<target>.tmp.<pid>.XXXXXX" (its name in tmp[tmplen]) or a STREAM /
 * STDOUT output itself (tmp[0] = 0); mg_cli_atomic_commit commits a temporary
 * over the target durably (base/atomic_file.h: flushed, fsynced, renamed,
 * its directory synced), or on any error (a full disk, EFBIG) removes it and leaves the target as it was ("... (nothing
 * written)"); a stream is flushed and closed, its error reported. Both
 * return NULL / -1 with a message. */
FILE *mg_cli_atomic_open(const char *path, char *tmp, size_t tmplen, mg_error *err);
mg_status mg_cli_atomic_commit(FILE *f, const char *tmp, const char *path, mg_error *err);
/* mg_cli_atomic_commit when the writer succeeded (write_rc 0); else closes
 * and removes the temporary: "error writing PATH: <the failed write's
 * reason> (nothing written)" (a stream: without the last part). */
mg_status mg_cli_atomic_commit_if(FILE *f, int write_rc, const char *tmp, const char *path,
                                  mg_error *err);

/* The longest path the output functions resolve (links followed): a
 * buffer for mg_cli_output_target; a temporary's name is at most this + 32. */
#define MG_CLI_PATH_MAX 4096
/* Writes the output path whole by its kind: mg_cli_atomic_open, then
 * write(f, user) (0: all written; nonzero, e.g. on a signal: the temporary
 * goes, the output stays), then mg_cli_atomic_commit_if. */
mg_status mg_cli_write_output(const char *path, int (*write)(FILE *f, void *user), void *user,
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

/* --dtype bf16 (dtype MG_DT_BF16) on a CPU without AVX512_BF16: one note on
 * stderr (rank 0) that bf16 is emulated there and slower than fp32. */
void mg_cli_note_dtype(const char *cmd, int dtype);

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
