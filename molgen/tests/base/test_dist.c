/* molgen dist tests, one process (the MPI runs are molgen/tests/mpi/test_mpi.py):
 *   - mg_dist_range against its definition written out here: N consecutive
 *     parts tiling [0, n) in rank order, the first n % N one item longer
 *     than n / N, for n in 0..300 and N in 1..17 and a few huge n;
 *   - a world of one rank (no mpirun): rank 0 of 1, mg_dist_agree returns
 *     the rank's own status, the sums leave their data alone, the gather
 *     copies, mg_dist_same_u64 is true; MG_ERR_PEER has its name. */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/dist.h"
#include "base/errors.h"

#include "mg_test.h"

static void test_range(void) {
    int bad = 0;
    for (size_t n = 0; n <= 300; n++)
        for (int N = 1; N <= 17; N++) {
            size_t at = 0;
            for (int r = 0; r < N; r++) {
                size_t i0, i1;
                mg_dist_range(n, r, N, &i0, &i1);
                const size_t want = n / (size_t)N + ((size_t)r < n % (size_t)N ? 1 : 0);
                if (i0 != at || i1 - i0 != want) bad++;
                at = i1;
            }
            if (at != n) bad++;
        }
    CHECK(bad == 0, "%d bad parts", bad);
    const size_t huge = SIZE_MAX / 2 + 12345; /* n * r would overflow */
    size_t i0, i1, prev = 0;
    for (int r = 0; r < 7; r++) {
        mg_dist_range(huge, r, 7, &i0, &i1);
        CHECK(i0 == prev && i1 > i0);
        prev = i1;
    }
    CHECK(prev == huge);
}

static void test_world_of_one(void) {
    mg_dist *w = mg_dist_world();
    CHECK(w && w->rank == 0 && w->size == 1);
    mg_error e;
    CHECK(mg_dist_init(NULL, NULL, &e) == MG_OK); /* not launched by mpirun */
    CHECK(mg_dist_agree(w, MG_OK, &e) == MG_OK);
    CHECK(mg_dist_agree(w, MG_ERR_IO, &e) == MG_ERR_IO);
    float f[3] = {1.5f, -2.0f, 3.25f};
    double d[2] = {0.1, 7.0};
    int64_t m[2] = {5, INT64_MIN};
    mg_dist_sum_f32(w, f, 3);
    mg_dist_sum_f64(w, d, 2);
    mg_dist_max_i64(w, m, 2);
    CHECK(f[0] == 1.5f && f[1] == -2.0f && f[2] == 3.25f && d[0] == 0.1 && d[1] == 7.0);
    CHECK(m[0] == 5 && m[1] == INT64_MIN);
    CHECK(mg_dist_same_u64(w, 0x1234) == 1);
    void *all = NULL;
    size_t n = 0;
    CHECK(mg_dist_gather(w, "abc", 3, &all, &n, &e) == MG_OK && n == 3 && !memcmp(all, "abc", 3));
    free(all);
    CHECK(strcmp(mg_status_name(MG_ERR_PEER), "MG_ERR_PEER") == 0);
    mg_dist_finalize();
    CHECK(mg_dist_world()->size == 1);
}

int main(void) {
    test_range();
    test_world_of_one();
    if (tu_fail) {
        fprintf(stderr, "test_dist: %d failure(s)\n", tu_fail);
        return 1;
    }
    printf("test_dist: OK\n");
    return 0;
}
