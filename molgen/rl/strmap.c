/* molgen optimize's string map (see strmap.h). */
#define _POSIX_C_SOURCE 200809L
#include "rl/strmap.h"

#include <stdlib.h>
#include <string.h>

#include "base/util.h"

void mg_strmap_free(mg_strmap *m) {
    for (size_t i = 0; i < m->cap; i++) free(m->keys[i]);
    free(m->keys);
    free(m->vals);
    memset(m, 0, sizeof *m);
}

/* k's slot: where it is, or the free slot where it goes. */
static size_t map_slot(const mg_strmap *m, const char *k) {
    size_t i = (size_t)mg_fnv1a(MG_FNV1A_INIT, k, strlen(k)) & (m->cap - 1);
    while (m->keys[i] && strcmp(m->keys[i], k)) i = (i + 1) & (m->cap - 1);
    return i;
}

int64_t *mg_strmap_find(const mg_strmap *m, const char *k) {
    if (!m->cap) return NULL;
    const size_t i = map_slot(m, k);
    return m->keys[i] ? &m->vals[i] : NULL;
}

/* m with twice the slots (64 at first), every key moved over. */
static int map_grow(mg_strmap *m) {
    mg_strmap g = {0};
    g.cap = m->cap ? 2 * m->cap : 64;
    g.keys = calloc(g.cap, sizeof *g.keys);
    g.vals = calloc(g.cap, sizeof *g.vals);
    if (!g.keys || !g.vals) {
        free(g.keys);
        free(g.vals);
        return -1;
    }
    for (size_t i = 0; i < m->cap; i++)
        if (m->keys[i]) {
            const size_t j = map_slot(&g, m->keys[i]);
            g.keys[j] = m->keys[i];
            g.vals[j] = m->vals[i];
        }
    g.n = m->n;
    free(m->keys);
    free(m->vals);
    *m = g;
    return 0;
}

int mg_strmap_put(mg_strmap *m, const char *k, int64_t v) {
    if (2 * (m->n + 1) > m->cap && map_grow(m)) return -1;
    const size_t i = map_slot(m, k);
    if (!m->keys[i]) {
        if (!(m->keys[i] = strdup(k))) return -1;
        m->n++;
    }
    m->vals[i] = v;
    return 0;
}
