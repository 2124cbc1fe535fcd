/* molgen CLI helpers (see cli_util.h). */
#define _POSIX_C_SOURCE 200809L
#include "cli_util.h"
#include "dist.h"
#include "model.h"

#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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

int mg_cli_bad_value(const char *cmd, char **argv, const char *value) {
    /* the option is the element before its value, or the element holding
     * "--opt=value" */
    const char *opt = argv[optind - 1];
    int len = (int)strlen(opt);
    if (opt != value) {
        const char *eq = strchr(opt, '=');
        if (eq && eq + 1 == value)
            len = (int)(eq - opt);
        else
            opt = argv[optind - 2], len = (int)strlen(opt);
    } else {
        opt = argv[optind - 2];
        len = (int)strlen(opt);
    }
    char cut[96];
    fprintf(stderr, "molgen %s: bad value '%s' for %.*s (see molgen %s --help)\n", cmd,
            mg_cli_cut(value, cut, sizeof cut), len, opt, cmd);
    return 2;
}

int mg_cli_int(const char *s, long long lo, long long hi, long long *out) {
    if (!s || !*s) return 0;
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || *end || v < lo || v > hi) return 0;
    *out = v;
    return 1;
}

int mg_cli_u64(const char *s, uint64_t *out) {
    /* decimal digits only: strtoull alone would take " -1" as 2^64 - 1 and
     * "0x10" as hex */
    if (!s || !*s) return 0;
    for (const char *p = s; *p; p++)
        if (*p < '0' || *p > '9') return 0;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || *end) return 0;
    *out = (uint64_t)v;
    return 1;
}

int mg_cli_double(const char *s, double *out) {
    if (!s || !*s) return 0;
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || *end || !isfinite(v)) return 0;
    *out = v;
    return 1;
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

/* A file can be created in dir: create and remove a probe. */
static mg_status probe_dir(const char *dir, const char *what, mg_error *err) {
    char probe[4200];
    if (snprintf(probe, sizeof probe, "%s/.molgen-probe.XXXXXX", *dir ? dir : ".") >=
        (int)sizeof probe) {
        return mg_fail(err, MG_ERR_ARG, "%s: path too long", what);
    }
    int fd = mkstemp(probe);
    if (fd < 0) { return mg_fail(err, MG_ERR_IO, "cannot write %s: %s", what, strerror(errno)); }
    close(fd);
    unlink(probe);
    return 0;
}

mg_status mg_cli_check_output(const char *path, const char *const *inputs, size_t n_inputs,
                              mg_error *err) {
    mg_status rc_;
    if (!path || !*path) { return mg_fail(err, MG_ERR_ARG, "the output path is empty"); }
    struct stat out;
    const int exists = stat(path, &out) == 0;
    if (exists && S_ISDIR(out.st_mode)) {
        return mg_fail(err, MG_ERR_ARG, "output %s is a directory", path);
    }
    for (size_t i = 0; exists && i < n_inputs; i++) {
        struct stat in;
        if (inputs[i] && stat(inputs[i], &in) == 0 && in.st_dev == out.st_dev &&
            in.st_ino == out.st_ino) {
            return mg_fail(err, MG_ERR_ARG,
                           "output %s is the input %s (same file): refusing to overwrite it", path,
                           inputs[i]);
        }
    }
    if ((rc_ = mg_cli_mkdir_parent(path, err))) return rc_;
    char dir[4096];
    const char *slash = strrchr(path, '/');
    if (!slash)
        snprintf(dir, sizeof dir, ".");
    else if (slash == path)
        snprintf(dir, sizeof dir, "/");
    else
        snprintf(dir, sizeof dir, "%.*s", (int)(slash - path), path);
    return probe_dir(dir, path, err);
}

mg_status mg_cli_check_output_dir(const char *dir, mg_error *err) {
    mg_status rc_;
    if (!dir || !*dir) { return mg_fail(err, MG_ERR_ARG, "the output directory is empty"); }
    if ((rc_ = mg_cli_mkdir_p(dir, err))) return rc_;
    return probe_dir(dir, dir, err);
}

FILE *mg_cli_atomic_open(const char *path, char *tmp, size_t tmplen, mg_error *err) {
    if (snprintf(tmp, tmplen, "%s.tmp.%ld", path, (long)getpid()) >= (int)tmplen) {
        mg_fail(err, MG_ERR_ARG, "path too long: %s", path);
        return NULL;
    }
    FILE *f = fopen(tmp, "w");
    if (!f) mg_fail(err, MG_ERR_IO, "cannot create %s: %s", tmp, strerror(errno));
    return f;
}

mg_status mg_cli_atomic_commit(FILE *f, const char *tmp, const char *path, mg_error *err) {
    int bad = fflush(f) != 0 || ferror(f);
    int e = errno;
    if (fclose(f) != 0 && !bad) {
        bad = 1;
        e = errno;
    }
    if (!bad && rename(tmp, path) != 0) {
        bad = 1;
        e = errno;
    }
    if (bad) {
        unlink(tmp);
        return mg_fail(err, MG_ERR_IO, "error writing %s: %s (nothing written)", path, strerror(e));
    }
    return 0;
}

mg_status mg_cli_atomic_commit_if(FILE *f, int write_rc, const char *tmp, const char *path,
                                  mg_error *err) {
    if (!write_rc) return mg_cli_atomic_commit(f, tmp, path, err);
    fclose(f);
    unlink(tmp);
    return mg_fail(err, MG_ERR_IO, "error writing %s (nothing written)", path);
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

int mg_cli_check_output_ranks(const char *cmd, const char *path, const char *const *inputs,
                              size_t n_inputs) {
    mg_dist *world = mg_dist_world();
    mg_error err;
    mg_status rc = MG_OK;
    if (world->rank == 0) {
        rc = mg_cli_check_output(path, inputs, n_inputs, &err);
        if (rc)
            fprintf(stderr, "molgen %s: --out: %s\n", cmd, err.message);
        else
            mg_st_remove_stale_temps(path);
    }
    return mg_dist_agree(world, rc, &err) ? -1 : 0;
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
