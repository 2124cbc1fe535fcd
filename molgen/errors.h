/* molgen: the one error-message helper every molgen module uses. */
#ifndef MG_ERRORS_H
#define MG_ERRORS_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Formats the printf-style message into err (when err is non-NULL and
 * errlen > 0; truncated to fit) and returns code, so a caller can write
 * `return mg_fail(err, errlen, MG_MODEL_ERR, "bad %d", x);`. */
int mg_fail(char *err, size_t errlen, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

#ifdef __cplusplus
}
#endif

#endif /* MG_ERRORS_H */
