/* molgen optimize's inception memory (see inception_memory.h). */
#include "rl/inception_memory.h"

#include <stdlib.h>

/* score descending, then molecule ascending: a total order (no molecule is
 * in the memory twice) */
static int mem_cmp(const void *a, const void *b) {
    const mg_mem_entry *x = a, *y = b;
    if (x->score != y->score) return x->score > y->score ? -1 : 1;
    return (x->mol > y->mol) - (x->mol < y->mol);
}

int mg_memory_update(const mg_mem_entry *old, int nmem, const int64_t *gi, const double *s2,
                     const unsigned char *ok, int B, int M, mg_mem_entry *out) {
    int n = 0;
    for (int k = 0; k < nmem; k++) out[n++] = old[k];
    for (int i = 0; i < B; i++) {
        if (gi[i] < 0 || !(s2[i] > 0) || !ok[i]) continue; /* NaN: not > 0 */
        int have = 0;
        for (int k = 0; k < n && !have; k++) have = out[k].mol == gi[i];
        if (!have) out[n++] = (mg_mem_entry){gi[i], s2[i]};
    }
    qsort(out, (size_t)n, sizeof *out, mem_cmp);
    return n < M ? n : M;
}
