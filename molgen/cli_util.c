/* molgen CLI helpers (see cli_util.h). */
#define _POSIX_C_SOURCE 200809L
#include "cli_util.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>

int mg_cli_value(int argc, char **argv, int *i, const char **val, char *err, size_t errlen) {
    char *a = argv[*i];
    char *eq = (a[0] == '-' && a[1] == '-') ? strchr(a, '=') : NULL;
    if (eq) {
        *eq = '\0';
        *val = eq + 1;
        return 1;
    }
    if (*i + 1 >= argc) {
        if (err && errlen) snprintf(err, errlen, "option %s needs a value", a);
        return 0;
    }
    *val = argv[++*i];
    return 1;
}

int mg_cli_option(int argc, char **argv, int *i, char *name, size_t namelen, const char **val,
                  char *err, size_t errlen) {
    const char *a = argv[*i];
    const char *eq = (a[0] == '-' && a[1] == '-') ? strchr(a, '=') : NULL;
    if (eq) {
        snprintf(name, namelen, "%.*s", (int)(eq - a), a);
        *val = eq + 1;
        return 1;
    }
    snprintf(name, namelen, "%s", a);
    if (*i + 1 >= argc) {
        if (err && errlen) snprintf(err, errlen, "option %s needs a value", a);
        return 0;
    }
    *val = argv[++*i];
    return 1;
}

int mg_cli_known(const char *arg, const char *const *names) {
    const char *eq = (arg[0] == '-' && arg[1] == '-') ? strchr(arg, '=') : NULL;
    const size_t n = eq ? (size_t)(eq - arg) : strlen(arg);
    for (; *names; names++)
        if (strlen(*names) == n && !strncmp(*names, arg, n)) return 1;
    return 0;
}

int mg_cli_take(const char *cmd, int argc, char **argv, int *i, const char *const *names,
                char *name, size_t namelen, const char **val) {
    if (!mg_cli_known(argv[*i], names)) {
        fprintf(stderr, "molgen %s: unknown option '%s' (see molgen %s --help)\n", cmd, argv[*i], cmd);
        return 0;
    }
    char err[512];
    if (!mg_cli_option(argc, argv, i, name, namelen, val, err, sizeof err)) {
        fprintf(stderr, "molgen %s: %s\n", cmd, err);
        return 0;
    }
    return 1;
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
    if (!s || !*s || *s == '-' || *s == '+') return 0;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 0);
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

int mg_cli_mkdir_p(const char *dir, char *err, size_t errlen) {
    char buf[4096];
    size_t n = strlen(dir);
    if (n == 0) return 0;
    if (n >= sizeof buf) {
        if (err && errlen) snprintf(err, errlen, "path too long: %s", dir);
        return -1;
    }
    memcpy(buf, dir, n + 1);
    for (size_t i = 1; i <= n; i++) {
        if (buf[i] == '/' || buf[i] == '\0') {
            char c = buf[i];
            buf[i] = '\0';
            if (mkdir(buf, 0777) != 0 && errno != EEXIST) {
                if (err && errlen) snprintf(err, errlen, "cannot create directory %s: %s", buf, strerror(errno));
                return -1;
            }
            buf[i] = c;
        }
    }
    struct stat st;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode)) {
        if (err && errlen) snprintf(err, errlen, "%s is not a directory", dir);
        return -1;
    }
    return 0;
}

int mg_cli_mkdir_parent(const char *path, char *err, size_t errlen) {
    const char *slash = strrchr(path, '/');
    if (!slash || slash == path) return 0;
    char buf[4096];
    size_t n = (size_t)(slash - path);
    if (n >= sizeof buf) {
        if (err && errlen) snprintf(err, errlen, "path too long: %s", path);
        return -1;
    }
    memcpy(buf, path, n);
    buf[n] = '\0';
    return mg_cli_mkdir_p(buf, err, errlen);
}
