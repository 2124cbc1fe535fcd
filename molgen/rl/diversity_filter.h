/* molgen optimize's diversity filter (REINVENT 4's identical-Murcko /
 * identical-SMILES filters): molecules are counted in buckets by a key, and
 * a molecule whose bucket already holds more than bucket_size counted
 * molecules learns nothing (learning score 0).
 *
 *   key     with MG_DF_SCAFFOLD the scorer's scaffold when it gave a
 *           non-empty one, else (and with MG_DF_SMILES) the canonical SMILES
 *   counted a molecule scoring >= min_score; with MG_DF_NONE nothing is
 *   full    count(key) > bucket_size, the molecule itself included in the
 *           count (so bucket_size molecules of a bucket learn, the next
 *           ones not)
 */
#ifndef MG_DIVERSITY_FILTER_H
#define MG_DIVERSITY_FILTER_H

#include <stdint.h>

#include "rl/strmap.h"

#ifdef __cplusplus
extern "C" {
#endif

/* --df: none, smiles (identical-smiles), scaffold (identical-murcko). */
typedef enum { MG_DF_NONE = 0, MG_DF_SMILES = 1, MG_DF_SCAFFOLD = 2 } mg_df_kind;

typedef struct {
    mg_df_kind kind;
    int64_t bucket_size; /* >= 1 */
    double min_score;
    mg_strmap count; /* key -> molecules counted */
} mg_diversity_filter;

/* An empty filter (free with mg_df_free). */
void mg_df_init(mg_diversity_filter *f, mg_df_kind kind, int64_t bucket_size, double min_score);
void mg_df_free(mg_diversity_filter *f);
/* A molecule's bucket key (the rule above); scaffold may be NULL. */
const char *mg_df_key(const mg_diversity_filter *f, const char *scaffold, const char *canonical);
/* Whether a molecule of this score is counted. */
int mg_df_counts(const mg_diversity_filter *f, double score);
/* Molecules counted in key's bucket so far. */
int64_t mg_df_count(const mg_diversity_filter *f, const char *key);
/* Counts a molecule (when mg_df_counts). 0, or -1 out of memory. */
int mg_df_add(mg_diversity_filter *f, const char *key, double score);
/* Whether a molecule counted in key's bucket with `pending` more not yet
 * added (the batch's other new ones) finds it full. */
int mg_df_full(const mg_diversity_filter *f, const char *key, int64_t pending);

#ifdef __cplusplus
}
#endif
#endif /* MG_DIVERSITY_FILTER_H */
