/* molgen errors: see errors.h. */
#define _POSIX_C_SOURCE 200809L
#include "base/errors.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

const char *mg_status_name(mg_status s) {
    static const char *const names[] = {
        "MG_OK",          "MG_ERR_ARG",           "MG_ERR_NOMEM",    "MG_ERR_IO",   "MG_ERR_FORMAT",
        "MG_ERR_TOKEN",   "MG_ERR_UNKNOWN_TOKEN", "MG_ERR_TOO_LONG", "MG_ERR_LEAK", "MG_ERR_STATE",
        "MG_ERR_NUMERIC", "MG_ERR_MISMATCH",      "MG_ERR_PEER",     "MG_ERR_INTERRUPTED"};
    return (unsigned)s < sizeof names / sizeof names[0] ? names[s] : "MG_ERR_?";
}

mg_status mg_fail(mg_error *err, mg_status s, const char *fmt, ...) {
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->message, sizeof err->message, fmt, ap);
        va_end(ap);
        err->status = s;
    }
    return s;
}

volatile sig_atomic_t mg_stop_signal = 0;

static void on_stop_signal(int signo) { mg_stop_signal = signo; }

void mg_hold_stop_signals(int hold) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sigemptyset(&sa.sa_mask);
    /* holding: every signal only sets the flag; released: the first one
     * caught once (SA_RESETHAND), or the default action when one came */
    sa.sa_handler = !hold && mg_stop_signal ? SIG_DFL : on_stop_signal;
    sa.sa_flags = hold ? 0 : SA_RESETHAND;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
}

void mg_catch_stop_signals(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESETHAND; /* a second signal: the default action */
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
}
