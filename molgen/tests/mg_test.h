/* molgen C tests: the shared harness (header-only; include it once per test
 * program, after the system headers).
 *
 *   CHECK(cond)              counts a pass, or prints "file:line: CHECK failed:
 *                            cond" and counts a failure;
 *   CHECK(cond, fmt, ...)    the same with a printf message (the first 40
 *                            failures are printed);
 *   n_pass, n_fail           the counters (tests may also bump n_fail);
 *   mg_test_data_dir()       $MOLGEN_SHARED_DATA, or ../shared/data;
 *   mg_test_splitmix64(&s)   a SplitMix64 step, for the tests' own RNGs;
 *   mg_test_passive_wait(argv)  re-exec once with OMP_WAIT_POLICY=PASSIVE. */
#ifndef MG_TEST_H
#define MG_TEST_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static int n_pass, n_fail;

#define MG_CHECK1_(cond)                                                                  \
    do {                                                                                  \
        if (cond) {                                                                       \
            n_pass++;                                                                     \
        } else {                                                                          \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond);     \
            n_fail++;                                                                     \
        }                                                                                 \
    } while (0)
#define MG_CHECKM_(cond, ...)                                                             \
    do {                                                                                  \
        if (cond) {                                                                       \
            n_pass++;                                                                     \
        } else {                                                                          \
            if (n_fail++ < 40) {                                                          \
                fprintf(stderr, "%s:%d: CHECK(%s) failed: ", __FILE__, __LINE__, #cond); \
                fprintf(stderr, __VA_ARGS__);                                             \
                fputc('\n', stderr);                                                      \
            }                                                                             \
        }                                                                                 \
    } while (0)
/* CHECK with one argument -> MG_CHECK1_, with 2..16 -> MG_CHECKM_ (plain C11,
 * no empty __VA_ARGS__). */
#define MG_CHECK_PICK_(_1, _2, _3, _4, _5, _6, _7, _8, _9, _10, _11, _12, _13, _14, _15, _16, \
                       NAME, ...)                                                          \
    NAME
#define CHECK(...)                                                                        \
    MG_CHECK_PICK_(__VA_ARGS__, MG_CHECKM_, MG_CHECKM_, MG_CHECKM_, MG_CHECKM_, MG_CHECKM_, \
                   MG_CHECKM_, MG_CHECKM_, MG_CHECKM_, MG_CHECKM_, MG_CHECKM_, MG_CHECKM_,   \
                   MG_CHECKM_, MG_CHECKM_, MG_CHECKM_, MG_CHECKM_, MG_CHECK1_, MG_CHECK1_)  \
    (__VA_ARGS__)

static inline const char *mg_test_data_dir(void) {
    const char *d = getenv("MOLGEN_SHARED_DATA");
    return (d && d[0]) ? d : "../shared/data";
}

static inline uint64_t mg_test_splitmix64(uint64_t *state) {
    uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* libgomp's spinning idle threads starve the working ones on a loaded 2-core
 * machine (test_model: 10 s with OMP_WAIT_POLICY=passive, 100 s without);
 * libgomp reads the variable only at start-up, so set it and re-run once,
 * as the molgen binary does. Defined where _POSIX_C_SOURCE is (setenv). */
#if defined(_POSIX_C_SOURCE) && _POSIX_C_SOURCE >= 200112L
static inline void mg_test_passive_wait(char **argv) {
    if (!getenv("OMP_WAIT_POLICY") && !getenv("MOLGEN_NO_REEXEC")) {
        setenv("OMP_WAIT_POLICY", "PASSIVE", 1);
        setenv("MOLGEN_NO_REEXEC", "1", 1);
        execv("/proc/self/exe", argv);
    }
}
#endif

#endif /* MG_TEST_H */
