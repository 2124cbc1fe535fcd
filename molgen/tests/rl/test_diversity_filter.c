/* molgen optimize's diversity filter (rl/diversity_filter.h) and its string
 * map (rl/strmap.h), against expectations worked out by hand from the
 * filter's definition: the key rule, the counting threshold (score >=
 * min_score), a bucket full past bucket_size molecules, MG_DF_NONE counting
 * nothing, and counts that survive the map's growth. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "rl/diversity_filter.h"
#include "rl/strmap.h"

#include "mg_test.h"

static void test_keys(void) {
    mg_diversity_filter f;
    mg_df_init(&f, MG_DF_SMILES, 2, 0.4);
    /* identical-smiles: the canonical SMILES, whatever the scaffold */
    CHECK(!strcmp(mg_df_key(&f, "c1ccccc1", "Cc1ccccc1"), "Cc1ccccc1"), "smiles key");
    mg_df_free(&f);
    mg_df_init(&f, MG_DF_SCAFFOLD, 2, 0.4);
    /* identical-murcko: the scaffold when there is one, else the SMILES */
    CHECK(!strcmp(mg_df_key(&f, "c1ccccc1", "Cc1ccccc1"), "c1ccccc1"), "scaffold key");
    CHECK(!strcmp(mg_df_key(&f, "", "CCO"), "CCO"), "empty scaffold: the SMILES");
    CHECK(!strcmp(mg_df_key(&f, NULL, "CCO"), "CCO"), "no scaffold: the SMILES");
    mg_df_free(&f);
}

static void test_buckets(void) {
    mg_diversity_filter f;
    mg_df_init(&f, MG_DF_SMILES, 2, 0.4);
    CHECK(!mg_df_counts(&f, 0.39) && mg_df_counts(&f, 0.4) && mg_df_counts(&f, 1.0),
          "threshold: score >= 0.4 counts");
    CHECK(mg_df_count(&f, "CCO") == 0 && !mg_df_full(&f, "CCO", 0), "an empty bucket");
    CHECK(mg_df_add(&f, "CCO", 0.5) == 0 && mg_df_count(&f, "CCO") == 1, "first counted");
    CHECK(mg_df_add(&f, "CCO", 0.3) == 0 && mg_df_count(&f, "CCO") == 1, "below the threshold");
    /* one in the bucket: a second molecule (itself pending) makes 2, not > 2 */
    CHECK(!mg_df_full(&f, "CCO", 1), "the second molecule of a bucket of 2 learns");
    CHECK(mg_df_add(&f, "CCO", 0.9) == 0 && mg_df_count(&f, "CCO") == 2, "second counted");
    CHECK(!mg_df_full(&f, "CCO", 0), "2 counted, the molecule among them: not full");
    CHECK(mg_df_full(&f, "CCO", 1), "a third molecule: 3 > 2, full");
    CHECK(mg_df_count(&f, "CCN") == 0 && !mg_df_full(&f, "CCN", 2), "another bucket: apart");
    CHECK(mg_df_full(&f, "CCN", 3), "3 pending in an empty bucket of 2: full");
    mg_df_free(&f);
    CHECK(f.count.n == 0 && f.count.cap == 0, "freed and reusable");
}

static void test_none(void) {
    mg_diversity_filter f;
    mg_df_init(&f, MG_DF_NONE, 1, 0.0);
    CHECK(!mg_df_counts(&f, 1.0), "none counts nothing");
    for (int i = 0; i < 5; i++) CHECK(mg_df_add(&f, "CCO", 1.0) == 0, "add");
    CHECK(mg_df_count(&f, "CCO") == 0, "none: count stays 0");
    mg_df_free(&f);
}

/* 1000 buckets (the map grows from 64 slots past 2048), bucket i holding
 * (i % 3) + 1 molecules: every count as added, whatever the order. */
static void test_many_buckets(void) {
    mg_diversity_filter f;
    mg_df_init(&f, MG_DF_SCAFFOLD, 2, 0.0);
    char key[32];
    int ok = 1;
    for (int round = 0; round < 3; round++)
        for (int i = 999; i >= 0; i--) {
            snprintf(key, sizeof key, "C%dN", i);
            if (round <= i % 3) ok &= mg_df_add(&f, key, 0.5) == 0;
        }
    CHECK(ok, "adds");
    int right = 1;
    for (int i = 0; i < 1000; i++) {
        snprintf(key, sizeof key, "C%dN", i);
        right &= mg_df_count(&f, key) == i % 3 + 1;
        right &= mg_df_full(&f, key, 1) == (i % 3 + 1 + 1 > 2);
    }
    CHECK(right, "1000 buckets' counts");
    CHECK(f.count.n == 1000 && 2 * f.count.n <= f.count.cap, "1000 keys, at most half full: %zu/%zu",
          f.count.n, f.count.cap);
    mg_df_free(&f);
}

static void test_strmap(void) {
    mg_strmap m = {0};
    CHECK(mg_strmap_find(&m, "x") == NULL, "empty map");
    CHECK(mg_strmap_put(&m, "x", 7) == 0 && *mg_strmap_find(&m, "x") == 7, "put");
    CHECK(mg_strmap_put(&m, "x", -1) == 0 && *mg_strmap_find(&m, "x") == -1 && m.n == 1,
          "a key set again: one entry, the new value");
    CHECK(mg_strmap_find(&m, "y") == NULL, "absent key");
    mg_strmap_free(&m);
}

int main(void) {
    test_keys();
    test_buckets();
    test_none();
    test_many_buckets();
    test_strmap();
    printf("test_diversity_filter: %d checks passed, %d failed\n", tu_pass, tu_fail);
    return tu_fail ? 1 : 0;
}
