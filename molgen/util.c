/* molgen shared helpers (see util.h). */
#define _POSIX_C_SOURCE 200809L
#include "util.h"

#include <time.h>

double mg_now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}
