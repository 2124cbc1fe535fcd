/* The C tests' counting CHECK, shared by tests/testutil.h (attn) and
 * molgen/tests/mg_test.h (molgen). Header-only; include once per program.
 *
 *   CHECK(cond)              counts a pass, or prints "file:line: CHECK(cond)
 *                            failed" and counts a failure;
 *   CHECK(cond, fmt, ...)    the same with a printf message;
 *   tu_pass, tu_fail         the counters (tests may also bump tu_fail).
 * Only the first 40 failures are printed, to keep logs readable. */
#ifndef ATTN_TEST_CHECK_H
#define ATTN_TEST_CHECK_H

#include <stdio.h>

static int tu_pass, tu_fail;

#define TU_CHECK_(cond, has_msg, ...)                                                              \
    do {                                                                                           \
        if (cond) {                                                                                \
            tu_pass++;                                                                             \
        } else {                                                                                   \
            if (tu_fail++ < 40) {                                                                  \
                fprintf(stderr, "%s:%d: CHECK(%s) failed%s", __FILE__, __LINE__, #cond,            \
                        (has_msg) ? ": " : "");                                                    \
                fprintf(stderr, __VA_ARGS__);                                                      \
                fputc('\n', stderr);                                                               \
            }                                                                                      \
        }                                                                                          \
    } while (0)
#define TU_CHECK1_(cond) TU_CHECK_(cond, 0, "%s", "")
#define TU_CHECKM_(cond, ...) TU_CHECK_(cond, 1, __VA_ARGS__)
/* CHECK with one argument -> TU_CHECK1_, with 2..32 -> TU_CHECKM_ (plain C11,
 * no empty __VA_ARGS__). */
#define TU_CHECK_PICK_(_1, _2, _3, _4, _5, _6, _7, _8, _9, _10, _11, _12, _13, _14, _15, _16, _17, \
                       _18, _19, _20, _21, _22, _23, _24, _25, _26, _27, _28, _29, _30, _31, _32,  \
                       NAME, ...)                                                                  \
    NAME
#define CHECK(...)                                                                                 \
    TU_CHECK_PICK_(__VA_ARGS__, TU_CHECKM_, TU_CHECKM_, TU_CHECKM_, TU_CHECKM_, TU_CHECKM_,        \
                   TU_CHECKM_, TU_CHECKM_, TU_CHECKM_, TU_CHECKM_, TU_CHECKM_, TU_CHECKM_,         \
                   TU_CHECKM_, TU_CHECKM_, TU_CHECKM_, TU_CHECKM_, TU_CHECKM_, TU_CHECKM_,         \
                   TU_CHECKM_, TU_CHECKM_, TU_CHECKM_, TU_CHECKM_, TU_CHECKM_, TU_CHECKM_,         \
                   TU_CHECKM_, TU_CHECKM_, TU_CHECKM_, TU_CHECKM_, TU_CHECKM_, TU_CHECKM_,         \
                   TU_CHECKM_, TU_CHECKM_, TU_CHECK1_, TU_CHECK1_)                                 \
    (__VA_ARGS__)

#endif /* ATTN_TEST_CHECK_H */
