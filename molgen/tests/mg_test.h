/* molgen C tests: the shared harness (header-only; include it once per test
 * program, after the system headers).
 *
 *   CHECK, tu_pass, tu_fail  the counting check of tests/check.h;
 *   mg_test_data_dir()       $MOLGEN_SHARED_DATA, or ../shared/data;
 *   mg_test_splitmix64(&s)   a SplitMix64 step, for the tests' own RNGs;
 *   mg_test_passive_wait(argv)  re-exec once with OMP_WAIT_POLICY=PASSIVE. */
#ifndef MG_TEST_H
#define MG_TEST_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "../../tests/check.h" /* CHECK, tu_pass, tu_fail */

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
