/* A string map for molgen optimize: string keys (copied) -> int64 values,
 * open addressing with linear probing on FNV-1a, grown to keep at most half
 * of its slots used. The score cache, the spellings seen and the diversity
 * filter's buckets are all one of these. */
#ifndef MG_STRMAP_H
#define MG_STRMAP_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    char **keys;    /* [cap] NULL: a free slot */
    int64_t *vals;  /* [cap] */
    size_t cap, n;  /* cap: 0 or a power of two */
} mg_strmap;

void mg_strmap_free(mg_strmap *m); /* and zeroed: reusable */
/* k's value, or NULL. */
int64_t *mg_strmap_find(const mg_strmap *m, const char *k);
/* Sets k -> v (an existing key keeps its slot). 0, or -1 out of memory. */
int mg_strmap_put(mg_strmap *m, const char *k, int64_t v);

#ifdef __cplusplus
}
#endif
#endif /* MG_STRMAP_H */
