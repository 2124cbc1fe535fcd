/* molgen C tests: the shared harness (header-only; include it once per test
 * program, after the system headers).
 *
 *   CHECK, tu_pass, tu_fail  the counting check of tests/check.h;
 *   mg_test_data_dir()       $MOLGEN_SHARED_DATA, or ../shared/data;
 *   mg_splitmix64(&s)        (util.h) for the tests' own inputs.
 * CTest runs them with OMP_WAIT_POLICY=PASSIVE (molgen/CMakeLists.txt). */
#ifndef MG_TEST_H
#define MG_TEST_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "../../tests/check.h" /* CHECK, tu_pass, tu_fail */
#include "base/util.h"

static inline const char *mg_test_data_dir(void) {
    const char *d = getenv("MOLGEN_SHARED_DATA");
    return (d && d[0]) ? d : "../shared/data";
}

#endif /* MG_TEST_H */
