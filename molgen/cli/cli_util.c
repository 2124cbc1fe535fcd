/* molgen CLI helpers (see cli_util.h). */
#define _POSIX_C_SOURCE 200809L
#include "cli_util.h"
#include "base/dist.h"
#include "nn/packed_gemm.h"
#include "nn/model.h"
#include "base/util.h"
#include "base/atomic_file.h"

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

void mg_cli_begin(void) {
    optind = 0; /* GNU getopt: 0 re-initialises (a command may run twice in a process) */
    opterr = 0;
}

int mg_cli_next(const char *cmd, int argc, char **argv, const char *shorts,
                const struct option *opts, const char **value) {
    char optstring[64];
    snprintf(optstring, sizeof optstring, "+:%s", shorts ? shorts : "");
    const int before = optind < 1 ? 1 : optind;
    int li = -1;
    const int c = getopt_long(argc, argv, optstring, opts, &li);
    *value = optarg;
    if (c == -1) {
        if (optind < argc) {
            fprintf(stderr, "molgen %s: unexpected argument '%s' (see molgen %s --help)\n", cmd,
                    argv[optind], cmd);
            return -2;
        }
        return -1;
    }
    /* the element that held the option: argv[before] for a long option */
    const char *arg = before < argc ? argv[before] : "";
    if (c == '?') {
        fprintf(stderr, "molgen %s: unknown option '%s' (see molgen %s --help)\n", cmd,
                optopt && arg[0] == '-' && arg[1] != '-' ? arg : argv[optind - 1], cmd);
        return -2;
    }
    if (c == ':') {
        fprintf(stderr, "molgen %s: option %s needs a value (see molgen %s --help)\n", cmd,
                argv[optind - 1], cmd);
        return -2;
    }
    if (li >= 0) { /* getopt_long takes unique prefixes; molgen wants the whole name */
        const size_t n = strlen(opts[li].name);
        if (strncmp(arg, "--", 2) || strncmp(arg + 2, opts[li].name, n) ||
            (arg[2 + n] && arg[2 + n] != '=')) {
            const size_t k = strcspn(arg, "=");
            fprintf(stderr, "molgen %s: unknown option '%.*s' (see molgen %s --help)\n", cmd,
                    (int)k, arg, cmd);
            return -2;
        }
    }
    return c;
}

mg_status mg_cli_mkdir_p(const char *dir, mg_error *err) {
    char buf[4096];
    size_t n = strlen(dir);
    if (n == 0) return 0;
    if (n >= sizeof buf) { return mg_fail(err, MG_ERR_ARG, "path too long: %s", dir); }
    memcpy(buf, dir, n + 1);
    for (size_t i = 1; i <= n; i++) {
        if (buf[i] == '/' || buf[i] == '\0') {
            char c = buf[i];
            buf[i] = '\0';
            if (mkdir(buf, 0777) != 0 && errno != EEXIST) {
                return mg_fail(err, MG_ERR_IO, "cannot create directory %s: %s", buf,
                               strerror(errno));
            }
            buf[i] = c;
        }
    }
    struct stat st;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode)) {
        return mg_fail(err, MG_ERR_ARG, "%s is not a directory", dir);
    }
    return 0;
}

mg_status mg_cli_mkdir_parent(const char *path, mg_error *err) {
    const char *slash = strrchr(path, '/');
    if (!slash || slash == path) return 0;
    char buf[4096];
    size_t n = (size_t)(slash - path);
    if (n >= sizeof buf) { return mg_fail(err, MG_ERR_ARG, "path too long: %s", path); }
    memcpy(buf, path, n);
    buf[n] = '\0';
    return mg_cli_mkdir_p(buf, err);
}

const char *mg_cli_cut(const char *s, char *buf, size_t n) {
    if (!s) return "(null)";
    const size_t len = strlen(s);
    if (n < 32 || len < n) return s;
    snprintf(buf, n, "%.*s... (%zu chars)", (int)(n - 24), s, len);
    return buf;
}

/* A file can be created in dir: a probe created and removed. 0 or an errno. */
static int probe_dir(const char *dir) {
    char probe[4200];
    if (snprintf(probe, sizeof probe, "%s/.molgen-probe.XXXXXX", *dir ? dir : ".") >=
        (int)sizeof probe)
        return ENAMETOOLONG;
    const int fd = mkstemp(probe);
    if (fd < 0) return errno;
    close(fd);
    unlink(probe);
    return 0;
}

/* The directory part of path in dir[n]: "." for a bare name, "/" for "/x". */
static void dir_of(const char *path, char *dir, size_t n) {
    const char *slash = strrchr(path, '/');
    if (!slash)
        snprintf(dir, n, ".");
    else if (slash == path)
        snprintf(dir, n, "/");
    else
        snprintf(dir, n, "%.*s", (int)(slash - path), path);
}

/* path with the links of its last component followed, in buf[n]: 0 or an
 * errno (ELOOP, ENAMETOOLONG, readlink's). Links in the directories above
 * need no following: rename() goes through them. */
static int follow_links(const char *path, char *buf, size_t n) {
    char cur[4096], link[4096], dir[4096];
    if (snprintf(cur, sizeof cur, "%s", path) >= (int)sizeof cur) return ENAMETOOLONG;
    for (int hops = 0;; hops++) {
        struct stat st;
        if (lstat(cur, &st) != 0 || !S_ISLNK(st.st_mode)) break;
        if (hops == 40) return ELOOP;
        const ssize_t k = readlink(cur, link, sizeof link);
        if (k < 0) return errno;
        if ((size_t)k >= sizeof link) return ENAMETOOLONG;
        link[k] = '\0';
        dir_of(cur, dir, sizeof dir);
        const int w = link[0] == '/' ? snprintf(cur, sizeof cur, "%s", link)
                                     : snprintf(cur, sizeof cur, "%s/%s", dir, link);
        if (w >= (int)sizeof cur) return ENAMETOOLONG;
    }
    return snprintf(buf, n, "%s", cur) >= (int)n ? ENAMETOOLONG : 0;
}

const char *mg_cli_output_target(const char *path, char *buf, size_t n) {
    return follow_links(path, buf, n) ? path : buf;
}

/* What an output path is now (links followed). */
typedef struct {
    int kind;            /* MG_CLI_OUT_* */
    int fd;              /* 1 or 2: the descriptor the output is written through; else -1 */
    const char *what;    /* a stream or a refused kind, for messages */
    int refused, errnum; /* a directory, block device, socket; stat's error (not ENOENT) */
} out_info;

static void classify(const char *path, out_info *o) {
    memset(o, 0, sizeof *o);
    o->fd = -1;
    struct stat st, sd;
    if (strcmp(path, "-") == 0) { /* the Unix convention: '-' is standard output */
        o->kind = MG_CLI_OUT_STDOUT, o->fd = 1, o->what = "this process's standard output";
        return;
    }
    if (stat(path, &st) != 0) { /* a new file (or a dangling link: its target is new) */
        o->errnum = errno == ENOENT ? 0 : errno;
        return;
    }
    if (S_ISDIR(st.st_mode)) {
        o->refused = 1, o->what = "a directory";
        return;
    }
    for (int fd = 1; fd <= 2; fd++)
        if (fstat(fd, &sd) == 0 && sd.st_dev == st.st_dev && sd.st_ino == st.st_ino) {
            o->kind = fd == 1 ? MG_CLI_OUT_STDOUT : MG_CLI_OUT_STREAM;
            o->fd = fd;
            o->what = fd == 1 ? "this process's standard output" : "this process's standard error";
            return;
        }
    if (S_ISREG(st.st_mode)) return;
    if (S_ISFIFO(st.st_mode) || S_ISCHR(st.st_mode)) {
        o->kind = MG_CLI_OUT_STREAM;
        o->what = S_ISFIFO(st.st_mode) ? "a FIFO" : "a character device";
        return;
    }
    o->refused = 1;
    o->what = S_ISBLK(st.st_mode) ? "a block device" : S_ISSOCK(st.st_mode) ? "a socket"
                                                                            : "not a regular file";
}

int mg_cli_output_kind(const char *path) {
    out_info o;
    classify(path, &o);
    return o.refused ? MG_CLI_OUT_FILE : o.kind;
}

int mg_cli_same_file(const char *a, const char *b) {
    struct stat sa, sb;
    return a && b && stat(a, &sa) == 0 && stat(b, &sb) == 0 && sa.st_dev == sb.st_dev &&
           sa.st_ino == sb.st_ino;
}

/* One output as checked: where it is written and what it is. */
typedef struct {
    out_info info;
    char target[4096];
    dev_t dev; /* the file when it exists (base ""), else its directory + base */
    ino_t ino;
    const char *base; /* "" or the last component of target */
    int has_id;
} out_state;

/* The per-output checks of mg_cli_check_outputs, into *s. */
static mg_status check_one(const mg_cli_file *o, out_state *s, mg_error *err) {
    if (!*o->path) return mg_fail(err, MG_ERR_ARG, "%s: the path is empty", o->opt);
    classify(o->path, &s->info);
    if (s->info.errnum)
        return mg_fail(err, MG_ERR_IO, "%s %s: %s", o->opt, o->path, strerror(s->info.errnum));
    if (s->info.refused)
        return mg_fail(err, MG_ERR_ARG, "%s %s is %s: refusing to write to it", o->opt, o->path,
                       s->info.what);
    if (s->info.kind != MG_CLI_OUT_FILE) {
        if (o->flags & MG_CLI_WHOLE)
            return mg_fail(err, MG_ERR_ARG,
                           "%s %s is %s: a checkpoint is written whole to a temporary file and "
                           "renamed over %s, which would replace %s; give a regular file",
                           o->opt, o->path, s->info.what, o->opt, s->info.what);
        return MG_OK; /* written through: no directory to check, no lock */
    }
    const int e = follow_links(o->path, s->target, sizeof s->target);
    if (e) return mg_fail(err, MG_ERR_ARG, "%s %s: %s", o->opt, o->path, strerror(e));
    /* The directory must exist: a mistyped path fails here, before any
     * work, with one message (under mpirun: rank 0's), instead of growing
     * a directory tree nobody asked for. */
    char dir[4096];
    dir_of(s->target, dir, sizeof dir);
    struct stat ds;
    if (stat(dir, &ds) != 0)
        return mg_fail(err, MG_ERR_IO, "%s %s: the directory %s does not exist (%s); create it "
                       "first", o->opt, o->path, dir, strerror(errno));
    if (!S_ISDIR(ds.st_mode))
        return mg_fail(err, MG_ERR_IO, "%s %s: %s is not a directory", o->opt, o->path, dir);
    const int pe = probe_dir(dir);
    if (pe)
        return mg_fail(err, MG_ERR_IO, "%s %s: cannot create a file in %s: %s", o->opt, o->path,
                       dir, strerror(pe));
    struct stat st;
    s->base = "";
    if (stat(s->target, &st) == 0) {
        s->has_id = 1;
    } else if (stat(dir, &st) == 0) {
        const char *slash = strrchr(s->target, '/');
        s->base = slash ? slash + 1 : s->target;
        s->has_id = 1;
    }
    if (s->has_id) s->dev = st.st_dev, s->ino = st.st_ino;
    return MG_OK;
}

/* ---- locks: "<target>.lock", held until exit */

enum { MAX_LOCKS = 16 };
static struct {
    int fd;
    dev_t dev;
    ino_t ino;
    char path[4200];
} held[MAX_LOCKS];
static int n_held;

/* At exit: each lock file removed while still locked (one that is no longer
 * ours is left), then closed. A waiter that locked the removed file sees it
 * gone and takes a new one (lock_output). */
static void release_locks(void) {
    for (int i = n_held - 1; i >= 0; i--) {
        struct stat st;
        if (stat(held[i].path, &st) == 0 && st.st_dev == held[i].dev && st.st_ino == held[i].ino)
            unlink(held[i].path);
        close(held[i].fd);
    }
    n_held = 0;
}

/* A lock file's whole content: this line, so that molgen knows its own
 * lock from anything else at the name (a user's poetry.lock, a link). */
#define LOCK_LINE "molgen lock pid %ld\n"

/* What lock file fd holds: its pid when it is molgen's line, 0 when empty
 * (its creator is writing it), -1 when it is something else. */
static long lock_content(int fd) {
    char buf[64];
    const ssize_t k = pread(fd, buf, sizeof buf - 1, 0);
    if (k <= 0) return k == 0 ? 0 : -1;
    buf[k] = '\0';
    long pid = 0;
    int used = 0;
    if (sscanf(buf, "molgen lock pid %ld\n%n", &pid, &used) != 1 || used != (int)k || pid <= 0)
        return -1;
    char again[64];
    snprintf(again, sizeof again, LOCK_LINE, pid);
    return strcmp(again, buf) ? -1 : pid;
}

/* The pid a held lock file holds: waits up to 0.5 s while it is empty (0:
 * still empty; -1: not molgen's). */
static long holder_pid(int fd) {
    for (int tries = 0; tries < 50; tries++) {
        const long pid = lock_content(fd);
        if (pid != 0) return pid;
        const struct timespec ms10 = {0, 10000000};
        nanosleep(&ms10, NULL);
    }
    return 0;
}

/* Creates lock file lp, new (never one that is there): its line written and
 * flock'ed in a new temporary beside it, then hard-linked to lp (link()
 * fails on an existing name, so lp is never seen empty); where the file
 * system has no hard links, lp itself is created O_CREAT | O_EXCL |
 * O_NOFOLLOW, locked and written. Returns the locked descriptor, or -1 with
 * errno (EEXIST: something is at lp). */
static int create_lock(const char *lp) {
    char line[64], tl[4300];
    const int len = snprintf(line, sizeof line, LOCK_LINE, (long)getpid());
    int fd = mg_temp_create(lp, tl, sizeof tl);
    if (fd < 0) return -1;
    if (pwrite(fd, line, (size_t)len, 0) != len || flock(fd, LOCK_EX | LOCK_NB) != 0) {
        const int e = errno;
        close(fd);
        unlink(tl);
        errno = e;
        return -1;
    }
    const int linked = link(tl, lp) == 0;
    const int e = errno;
    unlink(tl);
    if (linked) return fd;
    close(fd);
    if (e != EPERM && e != ENOTSUP && e != EOPNOTSUPP && e != ENOSYS && e != EMLINK) {
        errno = e;
        return -1;
    }
    fd = open(lp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0666);
    if (fd < 0) return -1;
    if (flock(fd, LOCK_EX | LOCK_NB) != 0 || pwrite(fd, line, (size_t)len, 0) != len) {
        const int e2 = errno;
        close(fd);
        unlink(lp);
        errno = e2;
        return -1;
    }
    return fd;
}

/* Refusing what is at lock path lp: it is not molgen's lock. */
static mg_status foreign_lock(const mg_cli_file *o, const char *lp, mg_error *err) {
    return mg_fail(err, MG_ERR_IO,
                   "%s %s: %s is there and is not molgen's lock file (molgen keeps its lock at "
                   "that name while it writes %s): refusing to touch it; move it away or choose "
                   "another %s",
                   o->opt, o->path, lp, o->opt, o->opt);
}

/* What lock_output does about an existing lp */
enum { LK_RETRY, LK_OURS, LK_FAIL };

/* lp exists (create_lock said EEXIST): opened without following, writing
 * or blocking; ours already (LK_OURS); held by another molgen or not
 * molgen's (LK_FAIL, a message); molgen's and unheld (a killed run's):
 * removed while we lock it, or gone meanwhile (LK_RETRY). try: the attempt. */
static int examine_lock(const mg_cli_file *o, const char *lp, int try, mg_error *err) {
    const int fd = open(lp, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
    if (fd < 0) {
        if (errno == ENOENT) return LK_RETRY; /* its holder removed it meanwhile */
        if (errno == ELOOP) return foreign_lock(o, lp, err), LK_FAIL; /* a symbolic link */
        mg_fail(err, MG_ERR_IO, "%s %s: cannot open its lock file %s: %s", o->opt, o->path, lp,
                strerror(errno));
        return LK_FAIL;
    }
    struct stat a, b;
    int out = LK_FAIL;
    if (fstat(fd, &a) != 0) {
        mg_fail(err, MG_ERR_IO, "%s: %s", lp, strerror(errno));
        goto done;
    }
    for (int i = 0; i < n_held; i++)
        if (held[i].dev == a.st_dev && held[i].ino == a.st_ino) { /* ours already */
            out = LK_OURS;
            goto done;
        }
    if (!S_ISREG(a.st_mode)) {
        foreign_lock(o, lp, err);
        goto done;
    }
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        const int e = errno;
        const long pid = e == EWOULDBLOCK ? holder_pid(fd) : 0;
        if (e != EWOULDBLOCK)
            mg_fail(err, MG_ERR_IO, "%s %s: cannot lock %s: %s", o->opt, o->path, lp, strerror(e));
        else if (pid < 0) /* another program's lock on its own file */
            foreign_lock(o, lp, err);
        else if (pid > 0)
            mg_fail(err, MG_ERR_IO,
                    "%s %s is being written by another molgen (pid %ld); refusing to start",
                    o->opt, o->path, pid);
        else
            mg_fail(err, MG_ERR_IO,
                    "%s %s is being written by another molgen (it holds %s); refusing to start",
                    o->opt, o->path, lp);
        goto done;
    }
    /* nobody holds it. Gone or replaced since we opened it: look again */
    out = LK_RETRY;
    if (stat(lp, &b) != 0 || b.st_dev != a.st_dev || b.st_ino != a.st_ino) goto done;
    const long pid = lock_content(fd);
    if (pid == 0 && try < 50) { /* its creator (no hard links) is about to lock it */
        const struct timespec ms10 = {0, 10000000};
        nanosleep(&ms10, NULL);
        goto done;
    }
    if (pid <= 0 || fstat(fd, &a) != 0 || a.st_nlink != 1) { /* a link to another file too */
        foreign_lock(o, lp, err);
        out = LK_FAIL;
        goto done;
    }
    unlink(lp); /* a killed molgen's, still locked by us: removed, a new one made */
done:
    close(fd);
    return out;
}

/* "<target>.lock": created new (create_lock) and held until exit. One that
 * is there is taken over only when it is molgen's (its line, one link, a
 * regular file) and no process holds it (a killed run's): it is removed
 * and a new one created. Anything else at the name is refused, named, and
 * left as it is. */
static mg_status lock_output(const mg_cli_file *o, const char *target, mg_error *err) {
    char lp[4200];
    if (snprintf(lp, sizeof lp, "%s.lock", target) >= (int)sizeof lp)
        return mg_fail(err, MG_ERR_ARG, "%s: path too long", o->opt);
    for (int tries = 0; tries < 100; tries++) {
        const int fd = create_lock(lp);
        if (fd < 0 && errno != EEXIST)
            return mg_fail(err, MG_ERR_IO, "%s %s: cannot create its lock file %s: %s", o->opt,
                           o->path, lp, strerror(errno));
        if (fd < 0) {
            const int what = examine_lock(o, lp, tries, err);
            if (what == LK_RETRY) continue;
            return what == LK_OURS ? MG_OK : MG_ERR_IO;
        }
        struct stat a;
        if (fstat(fd, &a) != 0 || n_held == MAX_LOCKS) {
            const int e = n_held == MAX_LOCKS ? EMFILE : errno;
            unlink(lp); /* just created: ours */
            close(fd);
            return mg_fail(err, MG_ERR_IO, "%s %s: cannot keep its lock file %s: %s", o->opt,
                           o->path, lp, strerror(e));
        }
        if (n_held == 0) atexit(release_locks);
        held[n_held].fd = fd;
        held[n_held].dev = a.st_dev;
        held[n_held].ino = a.st_ino;
        snprintf(held[n_held].path, sizeof held[n_held].path, "%s", lp);
        n_held++;
        return MG_OK;
    }
    return mg_fail(err, MG_ERR_IO, "%s %s: cannot lock %s (it keeps being replaced)", o->opt,
                   o->path, lp);
}

enum { MAX_OUTPUTS = 8 };

mg_status mg_cli_check_outputs(const mg_cli_file *outs, size_t n_out, const mg_cli_file *ins,
                               size_t n_in, mg_error *err) {
    mg_status rc;
    static out_state st[MAX_OUTPUTS];
    if (n_out > MAX_OUTPUTS) return mg_fail(err, MG_ERR_ARG, "too many outputs");
    for (size_t i = 0; i < n_out; i++) {
        memset(&st[i], 0, sizeof st[i]);
        if (outs[i].path && (rc = check_one(&outs[i], &st[i], err))) return rc;
    }
    for (size_t i = 0; i < n_out; i++) {
        if (!outs[i].path || !st[i].has_id) continue;
        for (size_t j = 0; j < n_in && !st[i].base[0]; j++) {
            struct stat in;
            if (ins[j].path && stat(ins[j].path, &in) == 0 && S_ISREG(in.st_mode) &&
                in.st_dev == st[i].dev && in.st_ino == st[i].ino)
                return mg_fail(err, MG_ERR_ARG,
                               "%s %s is the %s file %s (same file): refusing to write over an "
                               "input",
                               outs[i].opt, outs[i].path, ins[j].opt, ins[j].path);
        }
        for (size_t j = 0; j < i; j++)
            if (outs[j].path && st[j].has_id && st[j].dev == st[i].dev &&
                st[j].ino == st[i].ino && !strcmp(st[j].base, st[i].base))
                return mg_fail(err, MG_ERR_ARG,
                               "%s %s and %s %s are the same file: give each output its own",
                               outs[j].opt, outs[j].path, outs[i].opt, outs[i].path);
    }
    for (size_t i = 0; i < n_out; i++)
        if (outs[i].path && st[i].info.kind == MG_CLI_OUT_FILE && !(outs[i].flags & MG_CLI_BESIDE) &&
            (rc = lock_output(&outs[i], st[i].target, err)))
            return rc;
    return MG_OK;
}


mg_status mg_cli_check_output_dir(const char *dir, mg_error *err) {
    mg_status rc_;
    if (!dir || !*dir) { return mg_fail(err, MG_ERR_ARG, "the output directory is empty"); }
    if ((rc_ = mg_cli_mkdir_p(dir, err))) return rc_;
    const int e = probe_dir(dir);
    return e ? mg_fail(err, MG_ERR_IO, "cannot write %s: %s", dir, strerror(e)) : MG_OK;
}

FILE *mg_cli_atomic_open(const char *path, char *tmp, size_t tmplen, mg_error *err) {
    out_info o;
    classify(path, &o);
    if (o.kind != MG_CLI_OUT_FILE) { /* written through, never replaced */
        if (tmplen) tmp[0] = '\0';
        if (o.fd >= 0) fflush(o.fd == 1 ? stdout : stderr);
        const int fd = o.fd >= 0 ? dup(o.fd) : open(path, O_WRONLY | O_NOCTTY | O_CLOEXEC);
        FILE *f = fd >= 0 ? fdopen(fd, "w") : NULL;
        if (!f) {
            const int e = errno;
            if (fd >= 0) close(fd);
            mg_fail(err, MG_ERR_IO, "cannot open %s: %s", path, strerror(e));
        }
        return f;
    }
    char target[4096];
    const int e = follow_links(path, target, sizeof target);
    if (e) {
        mg_fail(err, MG_ERR_ARG, "%s: %s", path, strerror(e));
        return NULL;
    }
    /* a new file, never one that is there (a planted link is not followed) */
    const int fd = mg_temp_create(target, tmp, tmplen);
    if (fd < 0) {
        if (errno == ENAMETOOLONG)
            mg_fail(err, MG_ERR_ARG, "path too long: %s", path);
        else
            mg_fail(err, MG_ERR_IO, "cannot create a temporary for %s in its directory: %s", path,
                    strerror(errno));
        return NULL;
    }
    FILE *f = fdopen(fd, "w");
    if (!f) {
        const int e2 = errno;
        close(fd);
        unlink(tmp);
        mg_fail(err, MG_ERR_IO, "cannot open %s: %s", tmp, strerror(e2));
    }
    return f;
}

mg_status mg_cli_write_output(const char *path, int (*write)(FILE *f, void *user), void *user,
                              mg_error *err) {
    char *tmp = malloc(MG_CLI_PATH_MAX + 32);
    if (!tmp) return mg_fail(err, MG_ERR_NOMEM, "out of memory");
    FILE *f = mg_cli_atomic_open(path, tmp, MG_CLI_PATH_MAX + 32, err);
    const mg_status rc =
        f ? mg_cli_atomic_commit_if(f, write(f, user), tmp, path, err) : (err ? err->status : MG_ERR_IO);
    free(tmp);
    return rc;
}

/* The name a temporary of mg_cli_atomic_open is renamed to: tmp less its
 * ".tmp.<pid>.XXXXXX" (path itself if tmp is not of that form). */
static const char *target_of(const char *tmp, const char *path, char *buf, size_t n) {
    char suffix[40];
    const size_t ls = (size_t)snprintf(suffix, sizeof suffix, ".tmp.%ld.", (long)getpid()) + 6;
    const size_t lt = strlen(tmp);
    if (lt <= ls || lt - ls >= n || strncmp(tmp + lt - ls, suffix, ls - 6)) return path;
    memcpy(buf, tmp, lt - ls);
    buf[lt - ls] = '\0';
    return buf;
}

mg_status mg_cli_atomic_commit(FILE *f, const char *tmp, const char *path, mg_error *err) {
    if (tmp[0]) { /* a file: the one durable commit (atomic_file.h) */
        char target[4096];
        return mg_atomic_commit(f, 1, tmp, target_of(tmp, path, target, sizeof target), path, err);
    }
    int bad = fflush(f) != 0 || ferror(f);
    int e = errno;
    if (fclose(f) != 0 && !bad) {
        bad = 1;
        e = errno;
    }
    return bad ? mg_fail(err, MG_ERR_IO, "error writing %s: %s", path, strerror(e)) : MG_OK;
}

mg_status mg_cli_atomic_commit_if(FILE *f, int write_rc, const char *tmp, const char *path,
                                  mg_error *err) {
    if (!write_rc) return mg_cli_atomic_commit(f, tmp, path, err);
    const int e = ferror(f) ? errno : 0; /* the failed write's */
    fclose(f);
    if (tmp[0]) unlink(tmp);
    return mg_fail(err, MG_ERR_IO, "error writing %s%s%s%s", path, e ? ": " : "",
                   e ? strerror(e) : "", tmp[0] ? " (nothing written)" : "");
}

int mg_cli_load_model(const char *cmd, const char *path, unsigned flags, struct mg_model **m,
                      struct mg_vocab **v, int *averaged) {
    mg_error err;
    mg_model_file_info info = {0, 0};
    mg_dist *world = mg_dist_world();
    mg_status rc =
        mg_dist_agree(world, mg_model_load(path, flags, m, v, &info, &err), &err);
    if (rc) {
        mg_cli_report(cmd, rc, &err);
        mg_model_free(*m);
        *m = NULL;
        if (v) {
            mg_vocab_free(*v);
            *v = NULL;
        }
        return -1;
    }
    if (averaged) *averaged = info.averaged;
    if (info.averaged && world->rank == 0)
        fprintf(stderr,
                "molgen %s: %s: using its averaged weights (train --ema)\n",
                cmd, path);
    if (!info.checksummed && world->rank == 0)
        fprintf(stderr,
                "molgen %s: note: %s has no tensor checksums (written before molgen stored "
                "them): loaded without an integrity check\n",
                cmd, path);
    return 0;
}

void mg_cli_note_dtype(const char *cmd, int dtype) {
    const char *note = mg_gemm_dtype_note((mg_dtype)dtype);
    if (note && mg_dist_world()->rank == 0) fprintf(stderr, "molgen %s: note: %s\n", cmd, note);
}

int mg_cli_claim_outputs(const char *cmd, const mg_cli_file *outs, size_t n_out,
                         const mg_cli_file *ins, size_t n_in) {
    mg_dist *world = mg_dist_world();
    mg_error err;
    mg_status rc = MG_OK;
    int removed = 0;
    if (world->rank == 0) {
        rc = mg_cli_check_outputs(outs, n_out, ins, n_in, &err);
        if (rc) mg_cli_report(cmd, rc, &err); /* "rank 0 of N: " under mpirun */
        for (size_t i = 0; !rc && i < n_out; i++) {
            char t[4096];
            if (outs[i].path && mg_cli_output_kind(outs[i].path) == MG_CLI_OUT_FILE)
                removed += mg_st_remove_stale_temps(mg_cli_output_target(outs[i].path, t, sizeof t));
        }
    }
    return mg_dist_agree(world, rc, &err) ? -1 : removed;
}

void mg_cli_report(const char *cmd, mg_status rc, const mg_error *err) {
    const mg_dist *world = mg_dist_world();
    if (rc == MG_ERR_PEER) return;
    if (world->size > 1)
        fprintf(stderr, "molgen %s: rank %d of %d: %s\n", cmd, world->rank, world->size,
                err->message);
    else
        fprintf(stderr, "molgen %s: %s\n", cmd, err->message);
}
