/* molgen optimize's diversity filter (see diversity_filter.h). */
#include "rl/diversity_filter.h"

#include <string.h>

void mg_df_init(mg_diversity_filter *f, mg_df_kind kind, int64_t bucket_size, double min_score) {
    memset(f, 0, sizeof *f);
    f->kind = kind;
    f->bucket_size = bucket_size;
    f->min_score = min_score;
}

void mg_df_free(mg_diversity_filter *f) { mg_strmap_free(&f->count); }

const char *mg_df_key(const mg_diversity_filter *f, const char *scaffold, const char *canonical) {
    return f->kind == MG_DF_SCAFFOLD && scaffold && *scaffold ? scaffold : canonical;
}

int mg_df_counts(const mg_diversity_filter *f, double score) {
    return f->kind != MG_DF_NONE && score >= f->min_score;
}

int64_t mg_df_count(const mg_diversity_filter *f, const char *key) {
    const int64_t *c = mg_strmap_find(&f->count, key);
    return c ? *c : 0;
}

int mg_df_add(mg_diversity_filter *f, const char *key, double score) {
    if (!mg_df_counts(f, score)) return 0;
    return mg_strmap_put(&f->count, key, mg_df_count(f, key) + 1);
}

int mg_df_full(const mg_diversity_filter *f, const char *key, int64_t pending) {
    return mg_df_count(f, key) + pending > f->bucket_size;
}
