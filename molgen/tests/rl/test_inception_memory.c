/* molgen optimize's inception memory (rl/inception_memory.h) against
 * results worked out by hand from its definition: which rows enter (a
 * molecule, s' > 0 and not NaN, a readable row, not in it already: the
 * first score stays), the order (score down, then molecule index up) and
 * the cut at M. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>

#include "rl/inception_memory.h"

#include "mg_test.h"

static int same(const mg_mem_entry *a, int n, const mg_mem_entry *want, int nw) {
    if (n != nw) return 0;
    for (int i = 0; i < n; i++)
        if (a[i].mol != want[i].mol || a[i].score != want[i].score) return 0;
    return 1;
}

int main(void) {
    mg_mem_entry out[16];
    {   /* empty memory; an invalid row (-1); molecule 5 twice in the batch */
        const int64_t gi[] = {5, -1, 7, 5};
        const double s2[] = {0.5, 0.9, 0.8, 0.6};
        const unsigned char ok[] = {1, 1, 1, 1};
        const int n = mg_memory_update(NULL, 0, gi, s2, ok, 4, 3, out);
        const mg_mem_entry want[] = {{7, 0.8}, {5, 0.5}};
        CHECK(same(out, n, want, 2), "first step: %d entries", n);
    }
    {   /* old entries merged; s' 0 left out; a tie at 0.4 by molecule; M = 3 */
        const mg_mem_entry old[] = {{1, 0.9}, {2, 0.4}};
        const int64_t gi[] = {3, 4, 6};
        const double s2[] = {0.4, 0.95, 0.0};
        const unsigned char ok[] = {1, 1, 1};
        const int n = mg_memory_update(old, 2, gi, s2, ok, 3, 3, out);
        const mg_mem_entry want[] = {{4, 0.95}, {1, 0.9}, {2, 0.4}};
        CHECK(same(out, n, want, 3), "merged, ordered, cut at 3: %d entries", n);
    }
    {   /* NaN s' and an unreadable row stay out */
        const int64_t gi[] = {8, 9};
        const double s2[] = {NAN, 0.7};
        const unsigned char ok[] = {1, 0};
        CHECK(mg_memory_update(NULL, 0, gi, s2, ok, 2, 5, out) == 0, "nothing enters");
    }
    {   /* a molecule in the memory keeps its first score */
        const mg_mem_entry old[] = {{3, 0.2}};
        const int64_t gi[] = {3};
        const double s2[] = {0.99};
        const unsigned char ok[] = {1};
        const int n = mg_memory_update(old, 1, gi, s2, ok, 1, 4, out);
        const mg_mem_entry want[] = {{3, 0.2}};
        CHECK(same(out, n, want, 1), "first score kept");
    }
    {   /* M = 0: no memory */
        const int64_t gi[] = {1};
        const double s2[] = {0.5};
        const unsigned char ok[] = {1};
        CHECK(mg_memory_update(NULL, 0, gi, s2, ok, 1, 0, out) == 0, "memory 0");
    }
    printf("test_inception_memory: %d checks passed, %d failed\n", tu_pass, tu_fail);
    return tu_fail ? 1 : 0;
}
