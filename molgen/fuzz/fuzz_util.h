/* Shared helpers of molgen's libFuzzer targets (molgen/fuzz/fuzz_*.c).
 *
 * FZ_CHECK states an invariant of the code under test; a violation prints
 * the condition and a message and aborts, which libFuzzer reports as a crash
 * and saves the input as an artifact, like a sanitizer report. */
#ifndef MG_FUZZ_UTIL_H
#define MG_FUZZ_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/errors.h"

#define FZ_CHECK(cond, ...)                                                                        \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "fuzz invariant failed at %s:%d: %s\n  ", __FILE__, __LINE__, #cond);  \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fputc('\n', stderr);                                                                   \
            abort();                                                                               \
        }                                                                                          \
    } while (0)

/* malloc'ed copy of data[0..size) with a NUL appended (the fuzzer's bytes are
 * not NUL-terminated; embedded NULs stay, so strlen may be shorter). */
static inline char *fz_cstr(const uint8_t *data, size_t size) {
    char *s = malloc(size + 1);
    if (!s) abort();
    if (size) memcpy(s, data, size);
    s[size] = '\0';
    return s;
}

/* 1 if the message buffer holds a non-empty NUL-terminated string within
 * its n bytes. */
static inline int fz_msg_ok(const char *msg, size_t n) {
    return n > 0 && memchr(msg, '\0', n) != NULL && msg[0] != '\0';
}

/* 1 if a failure of status s left its report in e: the same status and a
 * message (errors.h's convention). */
static inline int fz_err_ok(const mg_error *e, mg_status s) {
    return s != MG_OK && e->status == s && fz_msg_ok(e->message, sizeof e->message);
}

#endif /* MG_FUZZ_UTIL_H */
