/* molgen errors: see errors.h. */
#include "errors.h"

#include <stdarg.h>
#include <stdio.h>

const char *mg_status_name(mg_status s) {
    static const char *const names[] = {
        "MG_OK",          "MG_ERR_ARG",           "MG_ERR_NOMEM",    "MG_ERR_IO",   "MG_ERR_FORMAT",
        "MG_ERR_TOKEN",   "MG_ERR_UNKNOWN_TOKEN", "MG_ERR_TOO_LONG", "MG_ERR_LEAK", "MG_ERR_STATE",
        "MG_ERR_NUMERIC", "MG_ERR_MISMATCH",      "MG_ERR_PEER"};
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
