/* molgen scorer client (see scorer_process.h). */
#define _GNU_SOURCE
#include "rl/scorer_process.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "chem/smiles_check.h"
#include "base/util.h"

struct mg_scorer {
    pid_t pid;
    int in, out;   /* our ends: the scorer's stdin (write), stdout (read) */
    double timeout;
    char *buf;     /* bytes read but not yet consumed */
    size_t len, cap;
    int exited, code, signo; /* code: exit status; signo: the killing signal (0: none) */
    struct sigaction old_pipe;
    const volatile sig_atomic_t *stop; /* nonzero: a signal asked to stop (mg_scorer_set_stop) */
    const char *who;  /* the process in messages: "scorer" or "chemistry helper" */
    const char *verb; /* mg_scorer_randomize's request: "!randomize" or "randomize" */
    const char *opt;  /* the option that sets its timeout, for messages */
    size_t exchanges; /* requests made so far */
};

void mg_scorer_set_stop(mg_scorer *s, const volatile sig_atomic_t *stop) { s->stop = stop; }

void mg_scorer_set_role(mg_scorer *s, const char *who, const char *randomize_verb,
                        const char *timeout_option) {
    s->who = who;
    s->verb = randomize_verb;
    s->opt = timeout_option;
}

void mg_score_reply_clear(mg_score_reply *r) {
    if (!r) return;
    free(r->canonical);
    free(r->scaffold);
    free(r->comps);
    memset(r, 0, sizeof *r);
}

/* The scorer's group leader (the child molgen forks; it never returns):
 * it forks the shell that runs the command and waits. The group dies with
 * molgen, also when molgen is SIGKILLed (mpirun's abort): the kernel sends
 * the leader SIGUSR1 when the thread that forked it exits
 * (PR_SET_PDEATHSIG; molgen forks on its main thread) and the leader kills
 * its whole group, the processes the command started included (a
 * PDEATHSIG on the shell alone misses them: dash forks for `python x.py`).
 * When the shell ends, the leader ends the same way (its exit status or
 * signal), which is what molgen sees of the scorer. */
static void guard(pid_t parent, const char *command, int in, int out,
                  const struct sigaction *old_pipe) {
    sigset_t set, old;
    sigemptyset(&set);
    sigaddset(&set, SIGCHLD);
    sigaddset(&set, SIGUSR1);
    sigprocmask(SIG_BLOCK, &set, &old);
    /* molgen may be gone before prctl: getppid() then differs */
    if (prctl(PR_SET_PDEATHSIG, SIGUSR1) || getppid() != parent) _exit(127);
    const pid_t sh = fork();
    if (sh < 0) _exit(127);
    if (sh == 0) {
        sigprocmask(SIG_SETMASK, &old, NULL);
        sigaction(SIGPIPE, old_pipe, NULL);
        dup2(in, 0);
        dup2(out, 1);
        execl("/bin/sh", "sh", "-c", command, (char *)NULL);
        _exit(127);
    }
    /* the leader holds no end of the pipes: molgen's EOF is the command's */
    const int nul = open("/dev/null", O_RDWR);
    if (nul >= 0) dup2(nul, 0), dup2(nul, 1);
    close(in), close(out);
    for (;;) {
        siginfo_t si;
        if (sigwaitinfo(&set, &si) < 0) continue;
        if (si.si_signo == SIGUSR1) { /* molgen died */
            kill(0, SIGKILL);
            _exit(137);
        }
        int st;
        if (waitpid(sh, &st, WNOHANG) != sh) continue;
        if (WIFEXITED(st)) _exit(WEXITSTATUS(st));
        const int sig = WTERMSIG(st); /* the same death */
        signal(sig, SIG_DFL);
        sigprocmask(SIG_SETMASK, &old, NULL);
        sigdelset(&set, sig);
        raise(sig);
        _exit(128 + sig);
    }
}

mg_status mg_scorer_start(const char *command, double timeout_s, mg_scorer **out, mg_error *err) {
    if (!command || !*command || !out) return mg_fail(err, MG_ERR_ARG, "no scorer command");
    *out = NULL;
    mg_scorer *s = calloc(1, sizeof *s);
    if (!s) return mg_fail(err, MG_ERR_NOMEM, "out of memory");
    int pin[2], pout[2];
    if (pipe2(pin, O_CLOEXEC)) {
        free(s);
        return mg_fail(err, MG_ERR_IO, "scorer: pipe: %s", strerror(errno));
    }
    if (pipe2(pout, O_CLOEXEC)) {
        close(pin[0]);
        close(pin[1]);
        free(s);
        return mg_fail(err, MG_ERR_IO, "scorer: pipe: %s", strerror(errno));
    }
    struct sigaction ign;
    memset(&ign, 0, sizeof ign);
    ign.sa_handler = SIG_IGN;
    sigaction(SIGPIPE, &ign, &s->old_pipe);
    fflush(NULL);
    const pid_t parent = getpid();
    const pid_t pid = fork();
    if (pid < 0) {
        const int e = errno;
        close(pin[0]), close(pin[1]), close(pout[0]), close(pout[1]);
        sigaction(SIGPIPE, &s->old_pipe, NULL);
        free(s);
        return mg_fail(err, MG_ERR_IO, "scorer: fork: %s", strerror(e));
    }
    if (pid == 0) { /* the child: its own group (a hang kills the whole pipeline) */
        setpgid(0, 0);
        guard(parent, command, pin[0], pout[1], &s->old_pipe);
    }
    setpgid(pid, pid);
    close(pin[0]);
    close(pout[1]);
    s->pid = pid;
    s->in = pin[1];
    s->out = pout[0];
    s->timeout = timeout_s;
    s->who = "scorer";
    s->verb = "!randomize";
    s->opt = "--scorer-timeout";
    fcntl(s->in, F_SETFL, fcntl(s->in, F_GETFL) | O_NONBLOCK);
    *out = s;
    return MG_OK;
}

/* Has the scorer exited? Not reaped (WNOWAIT): the zombie keeps its pid and
 * so its process group's id from being reused until mg_scorer_free. */
static int reap(mg_scorer *s) {
    siginfo_t si;
    memset(&si, 0, sizeof si);
    if (!s->exited && !waitid(P_PID, (id_t)s->pid, &si, WEXITED | WNOHANG | WNOWAIT) &&
        si.si_pid == s->pid) {
        s->exited = 1;
        s->code = si.si_code == CLD_EXITED ? si.si_status : 0;
        s->signo = si.si_code == CLD_EXITED ? 0 : si.si_status;
    }
    return s->exited;
}

/* Up to 1 s for the scorer to exit after its EOF, then its whole group is
 * killed: also the processes it left behind (a child holding the pipes). */
void mg_scorer_free(mg_scorer *s) {
    if (!s) return;
    if (s->in >= 0) close(s->in);
    for (int i = 0; i < 100 && !reap(s); i++) nanosleep(&(struct timespec){0, 10000000}, NULL);
    kill(-s->pid, SIGKILL);
    waitpid(s->pid, NULL, 0);
    close(s->out);
    sigaction(SIGPIPE, &s->old_pipe, NULL);
    free(s->buf);
    free(s);
}

/* "exited with status 3" / "was killed by signal 9" / "closed its output".
 * Its end waited for up to 2 s after its output closed: on a loaded machine
 * the exit can lag the close by far more than a scheduler tick. */
static const char *gone(mg_scorer *s, char *buf, size_t n) {
    for (int i = 0; i < 200 && !reap(s); i++) nanosleep(&(struct timespec){0, 10000000}, NULL);
    if (!s->exited) return "closed its output";
    if (s->signo)
        snprintf(buf, n, "was killed by signal %d", s->signo);
    else
        snprintf(buf, n, "exited with status %d%s", s->code,
                 s->code == 127   ? " (the shell found no such command)"
                 : s->code == 126 ? " (the command is not executable)"
                                  : "");
    return buf;
}

/* text for a one-line message: up to its first line break, cut to a
 * readable length */
static const char *cut(const char *s, char *buf, size_t n) {
    const size_t l = strcspn(s, "\r\n");
    if (l < n && !s[l]) return s;
    snprintf(buf, n, "%.*s...", (int)(l < n - 4 ? l : n - 4), s);
    return buf;
}

/* The longest answer line: far above any score, canonical, scaffold and
 * components; it bounds the memory a scorer that never ends a line takes. */
#define MG_SCORER_MAX_LINE ((size_t)1 << 20)

/* Why answer line p[0..n) is refused (NULL: it is text), the offending
 * byte's offset in *at: a NUL byte or a control character (TAB separates
 * fields) would cut or break scored.csv and the checkpoint, invalid UTF-8
 * could not be saved in its JSON. */
static const char *bad_text(const unsigned char *p, size_t n, size_t *at) {
    for (size_t i = 0; i < n;) {
        const unsigned c = p[i];
        *at = i;
        if (c == 0) return "holds a NUL byte";
        if ((c < 0x20 && c != '\t') || c == 0x7f) return "holds a control character";
        if (c < 0x80) {
            i++;
            continue;
        }
        /* a UTF-8 sequence: its length, the range of its 2nd byte (no overlongs,
         * surrogates or code points past U+10FFFF), continuation bytes after */
        const size_t k = c >= 0xc2 && c <= 0xdf ? 2 : c >= 0xe0 && c <= 0xef ? 3 : c >= 0xf0 && c <= 0xf4 ? 4 : 0;
        const unsigned lo = c == 0xe0 ? 0xa0 : c == 0xf0 ? 0x90 : 0x80;
        const unsigned hi = c == 0xed ? 0x9f : c == 0xf4 ? 0x8f : 0xbf;
        if (!k || i + k > n || p[i + 1] < lo || p[i + 1] > hi) return "is not UTF-8 text";
        for (size_t j = 2; j < k; j++)
            if ((p[i + j] & 0xc0) != 0x80) return "is not UTF-8 text";
        i += k;
    }
    return NULL;
}

/* One exchange's progress (exchange below). */
typedef struct {
    const char *req;
    size_t rlen, n;
    size_t sent, got;  /* request bytes written; answer lines read */
    size_t scan, seen; /* the current line's start; bytes searched for '\n' */
    double exit_seen;  /* when the scorer was first seen exited, no bytes since */
    double last;       /* the last progress (bytes either way) */
    char **lines;
    const char *const *what;
} xchg;

/* Bytes before the request: a line more than the last request asked, which
 * would shift every answer of this one. Before the first request nothing was
 * asked: what is there is the first answer, written before it was read (a
 * greeting that needs no question, or a program that is not a scorer), and
 * the reply's check says which. */
static mg_status early_bytes(mg_scorer *s, const char *const *what, mg_error *err) {
    char mb[96], gb[64];
    struct pollfd p0 = {s->out, POLLIN, 0};
    if (poll(&p0, 1, 0) != 1 || !(p0.revents & POLLIN)) return MG_OK;
    char early[64];
    const ssize_t r = read(s->out, early, sizeof early - 1);
    if (r <= 0) return MG_OK;
    early[r] = 0;
    return mg_fail(err, MG_ERR_FORMAT,
                   "the %s wrote more lines than molecules asked ('%s' came before "
                   "molecule 1 of the batch '%s' was sent)",
                   s->who, cut(early, gb, sizeof gb), cut(what[0], mb, sizeof mb));
}

/* A poll that found nothing (left: the seconds of --scorer-timeout still
 * to wait): MG_OK when the wait goes on, else why it ends. */
static mg_status idle_poll(mg_scorer *s, xchg *x, double left, mg_error *err) {
    char mb[96], gb[64];
    if (left > 0.2) {
        if (!reap(s)) {
            x->exit_seen = 0;
            return MG_OK;
        }
        /* exited: what it wrote is in the pipe; 0.5 s for the rest */
        if (!x->exit_seen) x->exit_seen = mg_now_s();
        if (mg_now_s() - x->exit_seen < 0.5) return MG_OK;
        return mg_fail(err, MG_ERR_IO,
                       "the %s %s before answering molecule %zu of the batch '%s' (a "
                       "process it started still holds its output open)",
                       s->who, gone(s, gb, sizeof gb), x->got + 1, cut(x->what[x->got], mb, sizeof mb));
    }
    return mg_fail(err, MG_ERR_IO,
                   "the %s gave no answer for molecule %zu of the batch '%s' within "
                   "%g s (%s)%s",
                   s->who, x->got + 1, cut(x->what[x->got], mb, sizeof mb), s->timeout, s->opt,
                   x->sent == x->rlen && x->got == 0 && x->n > 1
                       ? "; it must answer each line as it reads it and flush "
                         "(one that reads all its input before answering waits for an "
                         "end that never comes)"
                       : "");
}

/* Writes what the scorer's stdin takes of the rest of the request. */
static mg_status write_some(mg_scorer *s, xchg *x, mg_error *err) {
    char mb[96], gb[64];
    const ssize_t w = write(s->in, x->req + x->sent, x->rlen - x->sent);
    if (w < 0 && errno == EPIPE) { /* it stopped reading: what it wrote, or its end, says why */
        x->sent = x->rlen;
        return MG_OK;
    }
    if (w < 0 && errno != EAGAIN && errno != EINTR)
        return mg_fail(err, MG_ERR_IO,
                       "the %s %s before answering molecule %zu of the batch '%s' "
                       "(writing to it: %s)",
                       s->who, gone(s, gb, sizeof gb), x->got + 1, cut(x->what[x->got], mb, sizeof mb),
                       strerror(errno));
    if (w > 0) x->sent += (size_t)w, x->last = mg_now_s();
    return MG_OK;
}

/* The complete lines in s->buf since x->seen (their starts as offsets: buf
 * may move), each NUL-terminated; refused when not text. */
static mg_status split_lines(mg_scorer *s, xchg *x, mg_error *err) {
    char mb[96], gb[64];
    for (size_t i = x->seen; i < s->len && x->got < x->n; i++) {
        if (s->buf[i] != '\n') continue;
        size_t e = i, at = 0;
        if (e > x->scan && s->buf[e - 1] == '\r') e--;
        const char *why = bad_text((const unsigned char *)s->buf + x->scan, e - x->scan, &at);
        if (why) {
            s->buf[x->scan + at] = 0; /* the text before the offending byte */
            return mg_fail(err, MG_ERR_FORMAT,
                           "the %s's line for molecule %zu of the batch '%s' %s (after '%s')",
                           s->who, x->got + 1, cut(x->what[x->got], mb, sizeof mb), why,
                           cut(s->buf + x->scan, gb, sizeof gb));
        }
        s->buf[e] = 0;
        x->lines[x->got++] = (char *)(uintptr_t)x->scan;
        x->scan = i + 1;
    }
    x->seen = s->len;
    if (x->got < x->n && s->len - x->scan > MG_SCORER_MAX_LINE)
        return mg_fail(err, MG_ERR_FORMAT,
                       "the %s's line for molecule %zu of the batch '%s' is longer than "
                       "%zu bytes (not an answer)",
                       s->who, x->got + 1, cut(x->what[x->got], mb, sizeof mb), MG_SCORER_MAX_LINE);
    return MG_OK;
}

/* Reads what the scorer's stdout holds into s->buf and splits its lines. */
static mg_status read_some(mg_scorer *s, xchg *x, mg_error *err) {
    char mb[96], gb[64], pb[64];
    if (s->cap - s->len < 4096) {
        char *nb = realloc(s->buf, s->cap * 2 + 8192);
        if (!nb) return mg_fail(err, MG_ERR_NOMEM, "out of memory reading the %s", s->who);
        s->buf = nb;
        s->cap = s->cap * 2 + 8192;
    }
    const ssize_t r = read(s->out, s->buf + s->len, s->cap - s->len - 1);
    if (r < 0 && errno == EINTR) return MG_OK;
    if (r <= 0) {
        s->buf[s->len] = 0;
        const char *part = x->got < x->n && s->len > x->scan ? s->buf + x->scan : NULL;
        return mg_fail(err, MG_ERR_IO,
                       "the %s %s before answering molecule %zu of the batch '%s'%s%s%s",
                       s->who, gone(s, gb, sizeof gb), x->got + 1, cut(x->what[x->got], mb, sizeof mb),
                       part ? " (an unfinished line '" : "", part ? cut(part, pb, sizeof pb) : "",
                       part ? "')" : "");
    }
    s->len += (size_t)r;
    x->last = mg_now_s();
    return split_lines(s, x, err);
}

/* (scorer_process.h) Writes req[0..rlen) and reads n lines (their starts into
 * lines[n], each NUL-terminated in s->buf; valid until the next exchange). what[i] names
 * line i's molecule for the messages. */
mg_status mg_scorer_lines(mg_scorer *s, const char *req, size_t rlen, size_t n, char **lines,
                          const char *const *what, mg_error *err) {
    xchg x = {.req = req, .rlen = rlen, .n = n, .last = mg_now_s(), .lines = lines, .what = what};
    char mb[96], gb[64];
    s->len = 0;
    mg_status rc = s->exchanges++ ? early_bytes(s, what, err) : MG_OK;
    while (!rc && x.got < n) {
        if (s->stop && *s->stop) /* a signal interrupted the wait (poll or read: EINTR) */
            return mg_fail(err, MG_ERR_INTERRUPTED,
                           "interrupted by signal %d waiting for the %s's answer to molecule "
                           "%zu of the batch '%s'",
                           (int)*s->stop, s->who, x.got + 1, cut(what[x.got], mb, sizeof mb));
        struct pollfd p[2] = {{s->out, POLLIN, 0}, {s->in, POLLOUT, 0}};
        const int np = x.sent < rlen ? 2 : 1;
        const double left = s->timeout > 0 ? s->timeout - (mg_now_s() - x.last) : 1e9;
        /* waits in slices of 0.2 s: a scorer that exited is seen even when a
         * process it started still holds its output open (no EOF) */
        const int pr = left <= 0 ? 0 : poll(p, (nfds_t)np, left > 0.2 ? 200 : (int)(left * 1000) + 1);
        if (pr < 0 && errno == EINTR) continue;
        if (pr < 0) return mg_fail(err, MG_ERR_IO, "%s: poll: %s", s->who, strerror(errno));
        if (pr == 0) {
            rc = idle_poll(s, &x, left, err); /* MG_OK: the wait goes on */
            continue;
        }
        /* what it wrote first: one that answered and exited (a greeting,
         * a program that is not a scorer) is judged by its answer, not by
         * the broken pipe of the request it no longer reads */
        if (p[0].revents & (POLLIN | POLLHUP | POLLERR)) rc = read_some(s, &x, err);
        if (!rc && x.got < n && np == 2 && (p[1].revents & (POLLOUT | POLLERR)))
            rc = write_some(s, &x, err);
    }
    if (rc) return rc;
    if (s->len > x.scan)
        return mg_fail(err, MG_ERR_FORMAT,
                       "the %s wrote more lines than molecules asked (after molecule %zu of "
                       "the batch '%s': '%s')",
                       s->who, n, cut(what[n - 1], mb, sizeof mb), cut(s->buf + x.scan, gb, sizeof gb));
    for (size_t i = 0; i < n; i++) lines[i] = s->buf + (uintptr_t)lines[i];
    return MG_OK;
}

static char *dup_n(const char *p, size_t n) {
    char *d = malloc(n + 1);
    if (d) memcpy(d, p, n), d[n] = 0;
    return d;
}

/* A decimal number (strtod over the whole text, spaces around it allowed,
 * zero padding of any length; no hexadecimal, inf or nan). */
static int number(const char *p, size_t n, double *v) {
    while (n && p[0] == ' ') p++, n--;
    while (n && p[n - 1] == ' ') n--;
    if (n == 0 || n > 4096 || memchr(p, 'x', n) || memchr(p, 'X', n)) return 0;
    char tmp[4097];
    memcpy(tmp, p, n);
    tmp[n] = 0;
    if (strpbrk(tmp, "\t\f\v")) return 0;
    char *end;
    errno = 0;
    *v = strtod(tmp, &end);
    return *end == 0;
}

/* One answer line into r; MG_ERR_FORMAT naming the molecule and the line. */
static mg_status parse_reply(const char *line, const char *mol, size_t idx, mg_score_reply *r,
                             mg_error *err) {
    char mb[96], lb[128];
    const char *tab = strchr(line, '\t');
    const size_t n0 = tab ? (size_t)(tab - line) : strlen(line);
    double v = 0;
    size_t b0 = 0, e0 = n0; /* the score without the spaces around it */
    while (b0 < e0 && line[b0] == ' ') b0++;
    while (e0 > b0 && line[e0 - 1] == ' ') e0--;
    if (e0 - b0 == 3 && !strncasecmp(line + b0, "nan", 3)) {
        r->valid = 0;
    } else if (!number(line, n0, &v) || isnan(v)) {
        return mg_fail(err, MG_ERR_FORMAT,
                       "the scorer's line '%s' for molecule %zu of the batch '%s' does not start "
                       "with a number in [0, 1] or nan",
                       cut(line, lb, sizeof lb), idx + 1, cut(mol, mb, sizeof mb));
    } else if (!(v >= 0.0 && v <= 1.0)) {
        return mg_fail(err, MG_ERR_FORMAT,
                       "the scorer's line '%s' for molecule %zu of the batch '%s': the score %.*s "
                       "is outside [0, 1] (refused, not clipped)",
                       cut(line, lb, sizeof lb), idx + 1, cut(mol, mb, sizeof mb),
                       (int)(n0 < 40 ? n0 : 40), line);
    } else {
        r->valid = 1;
        r->score = v + 0.0; /* -0 as 0 */
    }
    size_t clen = 0, ccap = 64;
    r->comps = malloc(ccap);
    if (!r->comps) return mg_fail(err, MG_ERR_NOMEM, "out of memory");
    r->comps[0] = 0;
    while (tab) {
        const char *f = tab + 1;
        tab = strchr(f, '\t');
        const size_t fl = tab ? (size_t)(tab - f) : strlen(f);
        const char *eq = memchr(f, '=', fl);
        if (!eq || eq == f) continue;
        const size_t kl = (size_t)(eq - f), vl = fl - kl - 1;
        char **dst = kl == 9 && !memcmp(f, "canonical", 9) ? &r->canonical
                     : kl == 8 && !memcmp(f, "scaffold", 8) ? &r->scaffold
                                                             : NULL;
        if (dst && vl > MG_SCORER_MAX_FIELD)
            return mg_fail(err, MG_ERR_FORMAT,
                           "the scorer's line for molecule %zu of the batch '%s': its %s field "
                           "is %zu bytes, longer than %d (a field is kept for every scored "
                           "molecule in the state)",
                           idx + 1, cut(mol, mb, sizeof mb),
                           kl == 9 ? "canonical=" : "scaffold=", vl,
                           MG_SCORER_MAX_FIELD);
        if (dst) {
            free(*dst);
            if (!(*dst = dup_n(eq + 1, vl))) return mg_fail(err, MG_ERR_NOMEM, "out of memory");
            continue;
        }
        double cv;
        if (!number(eq + 1, vl, &cv) || memchr(f, ';', kl) || memchr(f, ',', kl)) continue;
        if (clen + fl + 2 > ccap) {
            ccap = 2 * (clen + fl + 2);
            char *nb = realloc(r->comps, ccap);
            if (!nb) return mg_fail(err, MG_ERR_NOMEM, "out of memory");
            r->comps = nb;
        }
        if (clen + fl + 1 > MG_SCORER_MAX_FIELD)
            return mg_fail(err, MG_ERR_FORMAT,
                           "the scorer's line for molecule %zu of the batch '%s': its components "
                           "take more than %d bytes (a field is kept for every scored molecule "
                           "in the state)",
                           idx + 1, cut(mol, mb, sizeof mb), MG_SCORER_MAX_FIELD);
        if (clen) r->comps[clen++] = ';';
        memcpy(r->comps + clen, f, fl);
        clen += fl;
        r->comps[clen] = 0;
    }
    return MG_OK;
}

/* A request line may not hold a newline (it would shift every answer). */
static mg_status check_line(const char *smi, mg_error *err) {
    if (strpbrk(smi, "\n\r\t"))
        return mg_fail(err, MG_ERR_ARG, "a molecule with a newline or tab cannot be scored");
    return MG_OK;
}

mg_status mg_scorer_score(mg_scorer *s, const char *const *smiles, size_t n, mg_score_reply *out,
                          mg_error *err) {
    memset(out, 0, n * sizeof *out);
    if (n == 0) return MG_OK;
    size_t rlen = 0;
    for (size_t i = 0; i < n; i++) {
        mg_status rc = check_line(smiles[i], err);
        if (rc) return rc;
        rlen += strlen(smiles[i]) + 1;
    }
    char *req = malloc(rlen + 1);
    char **lines = malloc(n * sizeof *lines);
    mg_status rc = MG_OK;
    if (!req || !lines) {
        rc = mg_fail(err, MG_ERR_NOMEM, "out of memory");
        goto done;
    }
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        const size_t l = strlen(smiles[i]);
        memcpy(req + o, smiles[i], l);
        req[o + l] = '\n';
        o += l + 1;
    }
    rc = mg_scorer_lines(s, req, rlen, n, lines, smiles, err);
    for (size_t i = 0; !rc && i < n; i++) rc = parse_reply(lines[i], smiles[i], i, &out[i], err);
    if (rc)
        for (size_t i = 0; i < n; i++) mg_score_reply_clear(&out[i]);
done:
    free(req);
    free(lines);
    return rc;
}

/* The heavy atoms of SMILES s as element symbols packed in a uint32
 * (aromatic ones upper-cased: "c" and "C" both carbon, "[se]" "Se"; '*' a
 * dummy atom; hydrogens "[H]" "[2H]" left out), sorted into a[] (room for
 * strlen(s) atoms); their number. */
static size_t heavy_atoms(const char *s, uint32_t *a) {
    size_t n = 0;
    for (const char *p = s; *p; p++) {
        char sym[3] = {0, 0, 0};
        if (*p == '[') {
            const char *q = p + 1;
            while (*q >= '0' && *q <= '9') q++; /* isotope */
            if (*q == '*') sym[0] = '*';
            else if (*q >= 'a' && *q <= 'z') /* aromatic: se as te, else one letter */
                sym[0] = *q, sym[1] = (q[1] == 'e' && (*q == 's' || *q == 't')) ||
                                              (*q == 'a' && q[1] == 's') ? q[1] : 0;
            else if (*q >= 'A' && *q <= 'Z')
                sym[0] = *q, sym[1] = q[1] >= 'a' && q[1] <= 'z' ? q[1] : 0;
            while (*p && *p != ']') p++;
            if (!*p) break;
            if (sym[0] == 'H' && !sym[1]) continue; /* a hydrogen atom */
        } else if ((p[0] == 'C' && p[1] == 'l') || (p[0] == 'B' && p[1] == 'r')) {
            sym[0] = p[0], sym[1] = p[1];
            p++;
        } else if (strchr("BCNOPSFIbcnops*", *p) && *p) {
            sym[0] = *p;
        } else {
            continue; /* bonds, branches, ring closures, '.' */
        }
        if (sym[0] >= 'a' && sym[0] <= 'z') sym[0] = (char)(sym[0] - 'a' + 'A');
        a[n++] = (uint32_t)(unsigned char)sym[0] << 8 | (unsigned char)sym[1];
    }
    for (size_t i = 1; i < n; i++) /* insertion sort: molecules are small */
        for (size_t j = i; j > 0 && a[j - 1] > a[j]; j--) {
            const uint32_t t = a[j];
            a[j] = a[j - 1], a[j - 1] = t;
        }
    return n;
}

/* Is spelling sp (field j of the scorer's !randomize line for request
 * molecule i, mol) the same molecule? What can be checked without a
 * toolkit: it is a SMILES (mg_smiles_syntax_ok) with the same heavy atoms
 * (element multiset). A wrong answer would train the agent on another
 * string (an answer "1" made it sample "1"). */
static mg_status same_molecule(const mg_scorer *s, const char *mol, const char *sp,
                               const char *line, size_t i, int j, mg_error *err) {
    char why[96], mb[96], lb[96], sb[96];
    if (!mg_smiles_syntax_ok(sp, why, sizeof why))
        return mg_fail(err, MG_ERR_FORMAT,
                       "the %s's %s line '%s' for molecule %zu '%s': spelling %d "
                       "'%s' is not a SMILES (%s)",
                       s->who, s->verb, cut(line, lb, sizeof lb), i + 1, cut(mol, mb, sizeof mb), j + 1,
                       cut(sp, sb, sizeof sb), why);
    const size_t lm = strlen(mol), ls = strlen(sp);
    uint32_t *a = malloc((lm + ls + 2) * sizeof *a), *b = a ? a + lm + 1 : NULL;
    if (!a) return mg_fail(err, MG_ERR_NOMEM, "out of memory");
    const size_t na = heavy_atoms(mol, a), nb = heavy_atoms(sp, b);
    const int same = na == nb && !memcmp(a, b, na * sizeof *a);
    free(a);
    if (!same)
        return mg_fail(err, MG_ERR_FORMAT,
                       "the %s's %s line '%s' for molecule %zu '%s': spelling %d "
                       "'%s' is another molecule (%zu heavy atoms against the molecule's %zu, or "
                       "other elements)",
                       s->who, s->verb, cut(line, lb, sizeof lb), i + 1, cut(mol, mb, sizeof mb), j + 1,
                       cut(sp, sb, sizeof sb), nb, na);
    return MG_OK;
}

mg_status mg_scorer_randomize(mg_scorer *s, const char *const *smiles, const uint64_t *seeds,
                              size_t n, int k, char **out, mg_error *err) {
    memset(out, 0, n * (size_t)k * sizeof *out);
    if (n == 0) return MG_OK;
    size_t rlen = 0;
    for (size_t i = 0; i < n; i++) {
        mg_status rc = check_line(smiles[i], err);
        if (rc) return rc;
        rlen += strlen(smiles[i]) + 64;
    }
    char *req = malloc(rlen);
    char **lines = malloc(n * sizeof *lines);
    mg_status rc = MG_OK;
    if (!req || !lines) {
        rc = mg_fail(err, MG_ERR_NOMEM, "out of memory");
        goto done;
    }
    size_t o = 0;
    for (size_t i = 0; i < n; i++)
        o += (size_t)sprintf(req + o, "%s\t%llu\t%d\t%s\n", s->verb, (unsigned long long)seeds[i],
                             k, smiles[i]);
    rc = mg_scorer_lines(s, req, o, n, lines, smiles, err);
    for (size_t i = 0; !rc && i < n; i++) {
        const char *p = lines[i];
        for (int j = 0; !rc && j < k && *p; j++) {
            const char *t = strchr(p, '\t');
            const size_t l = t ? (size_t)(t - p) : strlen(p);
            char **dst = &out[i * (size_t)k + j];
            if (l && !(*dst = dup_n(p, l)))
                rc = mg_fail(err, MG_ERR_NOMEM, "out of memory");
            if (*dst) rc = same_molecule(s, smiles[i], *dst, lines[i], i, j, err);
            p = t ? t + 1 : p + l;
        }
    }
    if (rc)
        for (size_t i = 0; i < n * (size_t)k; i++) free(out[i]), out[i] = NULL;
done:
    free(req);
    free(lines);
    return rc;
}
