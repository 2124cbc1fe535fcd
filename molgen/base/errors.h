/* molgen's one error convention, the library's (attn_status / attn_error)
 * applied to molgen: every fallible engine function returns an mg_status
 * and, on failure, fills the caller's optional mg_error with a one-line
 * message. Nothing in the engine aborts, exits or prints.
 *
 *   mg_error e;
 *   if (mg_model_load(path, 0, &m, &v, NULL, &e)) fprintf(stderr, "%s\n", e.message);
 *
 * A caller that adds context keeps the callee's status:
 *   return mg_fail(err, e.status, "checkpoint %s: %s", path, e.message); */
#ifndef MG_ERRORS_H
#define MG_ERRORS_H

#include <signal.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    MG_OK = 0,
    MG_ERR_ARG = 1,           /* a NULL pointer, a setting out of range, a bad call */
    MG_ERR_NOMEM = 2,         /* allocation failed */
    MG_ERR_IO = 3,            /* a file cannot be opened, read, written or renamed */
    MG_ERR_FORMAT = 4,        /* a file or JSON text is malformed, truncated, foreign or corrupt */
    MG_ERR_TOKEN = 5,         /* a character that starts no SMILES token */
    MG_ERR_UNKNOWN_TOKEN = 6, /* a token that is not in the vocabulary */
    MG_ERR_TOO_LONG = 7,      /* more tokens / bytes than the caller's capacity */
    MG_ERR_LEAK = 8,          /* the causal-leak guard saw the future change the past */
    MG_ERR_STATE = 9,         /* call order (a backward without a forward) */
    MG_ERR_NUMERIC = 10,      /* non-finite values (diverged gradients, NaN logits) */
    MG_ERR_MISMATCH = 11,     /* inputs that do not belong together (resume on other data) */
    MG_ERR_PEER = 12, /* another rank of the MPI job failed (dist.h; its message is its own) */
    MG_ERR_INTERRUPTED = 13 /* stopped by SIGINT / SIGTERM (mg_catch_stop_signals) */
} mg_status;

/* Caller-owned error report; pass NULL when only the status matters. */
typedef struct {
    mg_status status;
    char message[1024];
} mg_error;

/* Static name of a status, e.g. "MG_ERR_FORMAT". Never NULL. */
const char *mg_status_name(mg_status s);

/* Formats the printf-style message into err (when non-NULL; truncated to
 * fit), sets err->status and returns s, so a caller can write
 * `return mg_fail(err, MG_ERR_ARG, "bad %d", x);`. */
mg_status mg_fail(mg_error *err, mg_status s, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* SIGINT and SIGTERM as an error of a command that keeps nothing partial
 * (sample, score; train saves a checkpoint: train.h): after
 * mg_catch_stop_signals the first of them sets mg_stop_signal to its
 * number (a second one takes the default action: the process ends); an
 * engine given &mg_stop_signal stops at its next step with
 * MG_ERR_INTERRUPTED, and the command exits with 128 + the signal. */
extern volatile sig_atomic_t mg_stop_signal;
void mg_catch_stop_signals(void);
/* While a command writes a state that must be whole (molgen optimize's
 * save): hold 1 makes SIGINT / SIGTERM only set mg_stop_signal, however
 * many come; hold 0 restores mg_catch_stop_signals' behaviour (after a
 * signal: the next one takes the default action). After
 * mg_catch_stop_signals only. */
void mg_hold_stop_signals(int hold);

#ifdef __cplusplus
}
#endif

#endif /* MG_ERRORS_H */
