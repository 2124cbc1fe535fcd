/* molgen errors: see errors.h. */
#include "errors.h"

#include <stdarg.h>
#include <stdio.h>

int mg_fail(char *err, size_t errlen, int code, const char *fmt, ...)
{
    if (err && errlen > 0) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return code;
}
