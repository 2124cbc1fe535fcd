/* Tests for molgen/chem/data.{h,c}: reading .smi / .csv, skip reports with
 * file:line, encoding and padding, deterministic split, batch iterator. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "chem/data.h"

#include "mg_test.h"

static void write_file(const char *path, const char *text) {
    FILE *f = fopen(path, "wb");
    if (!f) {
        fprintf(stderr, "cannot write %s\n", path);
        tu_fail++;
        return;
    }
    fputs(text, f);
    fclose(f);
}

static int has_msg(const mg_report *r, const char *needle) {
    for (int i = 0; i < r->nmsg; i++)
        if (strstr(r->msg[i], needle)) return 1;
    return 0;
}

static char g_smi[512], g_csv[512], g_tmp[512];

static void test_smi_file(void) {
    write_file(g_smi, "# a comment line\n"
                      "CCO ethanol\n"             /* 2 */
                      "\n"                        /* 3 blank */
                      "   \t\n"                   /* 4 blank */
                      "c1ccccc1\t benzene 42\r\n" /* 5 CRLF */
                      "  # indented comment\n"    /* 6 */
                      "CCXC\n"                    /* 7 bad char */
                      "CC(=O)OCCCCCCCCCCCCCCC\n"  /* 8 long: 22 tokens */
                      "C[nH]1\n"                  /* 9 */
                      "Cl/C=C\\Br");              /* 10, no final newline */
    mg_error err = {0};
    mg_report rep;
    mg_smiles_list list;
    CHECK(mg_read_smiles(g_smi, NULL, &list, &rep, &err) == 0);
    CHECK(list.n == 6);
    if (list.n == 6) {
        CHECK(strcmp(list.smiles[0], "CCO") == 0 && list.line[0] == 2);
        CHECK(strcmp(list.smiles[1], "c1ccccc1") == 0 && list.line[1] == 5);
        CHECK(strcmp(list.smiles[2], "CCXC") == 0 && list.line[2] == 7);
        CHECK(strcmp(list.smiles[5], "Cl/C=C\\Br") == 0 && list.line[5] == 10);
    }
    CHECK(rep.lines == 10 && rep.records == 6 && rep.skipped == 0);
    mg_smiles_list_free(&list);
    CHECK(list.n == 0 && list.smiles == NULL);

    /* automatic T: the long line is kept, the bad one skipped and reported */
    mg_load_opts o = {0};
    mg_vocab *v = NULL;
    mg_dataset d;
    CHECK(mg_dataset_load(g_smi, &o, NULL, &v, &d, &rep, &err) == 0);
    CHECK(d.n == 5 && d.T == 22 + 2);
    CHECK(rep.kept == 5 && rep.skipped == 1 && rep.bad_char == 1 && rep.nmsg == 1);
    char want[600];
    snprintf(want, sizeof want, "%s:7: cannot tokenise: position 2: cannot tokenise 'X'", g_smi);
    CHECK(has_msg(&rep, want));
    if (!has_msg(&rep, want)) fprintf(stderr, "got: %s\nwant: %s\n", rep.msg[0], want);
    CHECK(v != NULL);
    if (v && d.n == 5) {
        /* row layout: BOS tokens EOS PAD..., lengths = k + 2 */
        CHECK(d.lengths[0] == 5); /* CCO */
        const int32_t *r0 = d.ids;
        CHECK(r0[0] == MG_BOS && r0[4] == MG_EOS);
        for (int i = 5; i < d.T; i++) CHECK(r0[i] == MG_PAD);
        for (size_t r = 0; r < d.n; r++) {
            const int32_t *row = d.ids + r * (size_t)d.T;
            char out[128];
            CHECK(row[0] == MG_BOS && row[d.lengths[r] - 1] == MG_EOS);
            for (int i = 1; i < d.lengths[r] - 1; i++) CHECK(row[i] >= MG_NUM_SPECIAL);
            for (int i = (int)d.lengths[r]; i < d.T; i++) CHECK(row[i] == MG_PAD);
            CHECK(mg_vocab_decode(v, row, d.T, out, sizeof out, NULL, &err) == 0);
            CHECK(strcmp(out, d.smiles[r]) == 0);
        }
        CHECK(d.line[0] == 2 && d.line[4] == 10);
        CHECK(strcmp(d.smiles[3], "C[nH]1") == 0);
        CHECK(d.lengths[2] == 24);
        /* report text */
        char txt[2048];
        mg_report_format(&rep, txt, sizeof txt);
        CHECK(strstr(txt, "kept 5") && strstr(txt, "skipped 1") && strstr(txt, "1 bad character"));
        CHECK(strstr(txt, want) != NULL);
    }
    mg_dataset_free(&d);
    CHECK(d.ids == NULL && d.n == 0);

    /* fixed T: the long molecule is skipped as too long */
    o.T = 16;
    mg_vocab *v2 = NULL;
    CHECK(mg_dataset_load(g_smi, &o, NULL, &v2, &d, &rep, &err) == 0);
    CHECK(d.n == 4 && d.T == 16 && rep.too_long == 1 && rep.bad_char == 1 && rep.skipped == 2);
    snprintf(want, sizeof want, "%s:8: too long: 22 tokens, more than the model's limit 14", g_smi);
    CHECK(has_msg(&rep, want));
    mg_dataset_free(&d);
    mg_vocab_free(v2);
    /* max_tokens with automatic T */
    o.T = 0;
    o.max_tokens = 8; /* benzene has 8 tokens, Cl/C=C\Br 7 */
    CHECK(mg_dataset_load(g_smi, &o, NULL, &v2, &d, &rep, &err) == 0);
    CHECK(d.n == 4 && d.T == 10 && rep.too_long == 1);
    mg_dataset_free(&d);
    mg_vocab_free(v2);
    o.max_tokens = 0;

    /* fixed vocabulary: unknown tokens skipped and named */
    const char *small[] = {"CCO", "c1ccccc1"};
    mg_vocab *fixed = NULL;
    CHECK(mg_vocab_build(small, 2, &fixed, &err) == 0);
    mg_vocab *untouched = (mg_vocab *)0x1;
    CHECK(mg_dataset_load(g_smi, &o, fixed, &untouched, &d, &rep, &err) == 0);
    CHECK(untouched == (mg_vocab *)0x1);
    CHECK(d.n == 2 && rep.unknown_token == 3 && rep.bad_char == 1 && rep.skipped == 4);
    snprintf(want, sizeof want, "%s:8: unknown token '(' at position 2", g_smi);
    CHECK(has_msg(&rep, want));
    snprintf(want, sizeof want, "%s:9: unknown token '[nH]' at position 1", g_smi);
    CHECK(has_msg(&rep, want));
    mg_dataset_free(&d);

    /* every molecule skipped is an error, still reported */
    const char *tiny[] = {"N"};
    mg_vocab *nv = NULL;
    CHECK(mg_vocab_build(tiny, 1, &nv, &err) == 0);
    CHECK(mg_dataset_load(g_smi, &o, nv, NULL, &d, &rep, &err) != 0);
    CHECK(strstr(err.message, "no usable molecules") && rep.skipped == 6 && d.ids == NULL);
    mg_vocab_free(nv);
    mg_vocab_free(fixed);

    /* more than MG_REPORT_MSGS problems: all counted, first few kept */
    FILE *f = fopen(g_tmp, "w");
    for (int i = 0; i < 50; i++) fprintf(f, "%s\n", i % 2 ? "CC" : "C?X");
    fclose(f);
    CHECK(mg_dataset_load(g_tmp, &o, NULL, &v2, &d, &rep, &err) == 0);
    CHECK(d.n == 25 && rep.bad_char == 25 && rep.nmsg == MG_REPORT_MSGS);
    snprintf(want, sizeof want, "%s:1: cannot tokenise: position 2", g_tmp);
    CHECK(has_msg(&rep, want));
    char txt[4096];
    mg_report_format(&rep, txt, sizeof txt);
    CHECK(strstr(txt, "and 17 more") != NULL);
    mg_dataset_free(&d);
    mg_vocab_free(v2);

    /* errors */
    CHECK(mg_dataset_load("/nonexistent-mg/x.smi", &o, NULL, &v2, &d, &rep, &err) != 0);
    CHECK(strstr(err.message, "cannot open /nonexistent-mg/x.smi") != NULL);
    write_file(g_tmp, "# only comments\n\n");
    CHECK(mg_dataset_load(g_tmp, &o, NULL, &v2, &d, &rep, &err) != 0);
    CHECK(strstr(err.message, "no usable molecules") != NULL);
    CHECK(mg_dataset_load(g_smi, &o, NULL, NULL, &d, &rep, &err) != 0);
    o.T = 2;
    CHECK(mg_dataset_load(g_smi, &o, NULL, &v2, &d, &rep, &err) != 0);
    o.T = 0;
    mg_vocab_free(v);
}

static void test_csv_file(void) {
    write_file(g_csv, "id,\"SMILES\", score\n"
                      "1,CCO,0.5\n"
                      "2,\"c1ccccc1\",0.7\n"
                      "\n"
                      "3,\"C\"\"O\",1\n" /* quote inside: C"O -> bad char */
                      "4\n"              /* too few fields */
                      "5,,3\n"           /* empty field */
                      "6, CC(N)=O ,2\n"  /* trimmed */
                      "7,\"unterminated,1\n");
    mg_error err = {0};
    mg_report rep;
    mg_smiles_list list;
    CHECK(mg_read_smiles(g_csv, "smiles", &list, &rep, &err) == 0);
    CHECK(list.n == 4);
    if (list.n == 4) {
        CHECK(strcmp(list.smiles[0], "CCO") == 0 && list.line[0] == 2);
        CHECK(strcmp(list.smiles[1], "c1ccccc1") == 0 && list.line[1] == 3);
        CHECK(strcmp(list.smiles[2], "C\"O") == 0 && list.line[2] == 5);
        CHECK(strcmp(list.smiles[3], "CC(N)=O") == 0 && list.line[3] == 8);
    }
    CHECK(rep.records == 7 && rep.other == 3 && rep.skipped == 3);
    char want[600];
    snprintf(want, sizeof want, "%s:6: only 1 fields", g_csv);
    CHECK(has_msg(&rep, want));
    snprintf(want, sizeof want, "%s:7: empty 'smiles' field", g_csv);
    CHECK(has_msg(&rep, want));
    snprintf(want, sizeof want, "%s:9: unterminated quote", g_csv);
    CHECK(has_msg(&rep, want));
    mg_smiles_list_free(&list);

    /* through the dataset loader: counts accumulate */
    mg_load_opts o = {.csv_column = "SMILES"};
    mg_vocab *v = NULL;
    mg_dataset d;
    CHECK(mg_dataset_load(g_csv, &o, NULL, &v, &d, &rep, &err) == 0);
    CHECK(d.n == 3 && rep.skipped == 4 && rep.bad_char == 1 && rep.other == 3 && rep.kept == 3);
    snprintf(want, sizeof want, "%s:5: cannot tokenise: position 1", g_csv);
    CHECK(has_msg(&rep, want));
    mg_dataset_free(&d);
    mg_vocab_free(v);

    /* another column; unknown column is an error naming it */
    o.csv_column = "id";
    CHECK(mg_read_smiles(g_csv, "id", &list, &rep, &err) == 0);
    CHECK(list.n == 6 && strcmp(list.smiles[0], "1") == 0); /* line 9: bad quote */
    mg_smiles_list_free(&list);
    CHECK(mg_read_smiles(g_csv, "smile", &list, &rep, &err) != 0);
    CHECK(strstr(err.message, "no column named 'smile'") != NULL);
    /* default column name */
    CHECK(mg_read_smiles(g_csv, NULL, &list, &rep, &err) == 0 && list.n == 4);
    mg_smiles_list_free(&list);
}

static int same_dataset(const mg_dataset *a, const mg_dataset *b) {
    if (a->n != b->n || a->T != b->T) return 0;
    for (size_t i = 0; i < a->n; i++)
        if (a->line[i] != b->line[i] || strcmp(a->smiles[i], b->smiles[i]) != 0 ||
            a->lengths[i] != b->lengths[i])
            return 0;
    return a->n == 0 || memcmp(a->ids, b->ids, a->n * (size_t)a->T * sizeof *a->ids) == 0;
}

static void test_split_and_batches(void) {
    char path[1024];
    snprintf(path, sizeof path, "%s/moses_train5k.smi", mg_test_data_dir());
    mg_load_opts o = {.T = 64};
    mg_vocab *v = NULL;
    mg_dataset all;
    mg_report rep;
    mg_error err = {0};
    if (mg_dataset_load(path, &o, NULL, &v, &all, &rep, &err) != 0) {
        fprintf(stderr, "load %s: %s (set MOLGEN_SHARED_DATA)\n", path, err.message);
        tu_fail++;
        return;
    }
    CHECK(all.n == 5000 && rep.skipped == 0 && all.T == 64);

    mg_dataset tr, va, tr2, va2, tr3, va3;
    CHECK(mg_dataset_split(&all, 0.1, 42, &tr, &va, &err) == 0);
    CHECK(mg_dataset_split(&all, 0.1, 42, &tr2, &va2, &err) == 0);
    CHECK(mg_dataset_split(&all, 0.1, 43, &tr3, &va3, &err) == 0);
    CHECK(va.n == 500 && tr.n == 4500);
    CHECK(same_dataset(&tr, &tr2) && same_dataset(&va, &va2));
    CHECK(!same_dataset(&va, &va3));
    /* a partition, each part in file order */
    unsigned char *seen = calloc(all.n + 2, 1);
    for (size_t i = 0; i < tr.n; i++) {
        seen[tr.line[i]]++;
        if (i) CHECK(tr.line[i] > tr.line[i - 1]);
    }
    for (size_t i = 0; i < va.n; i++) {
        seen[va.line[i]]++;
        if (i) CHECK(va.line[i] > va.line[i - 1]);
    }
    size_t once = 0;
    for (size_t i = 1; i <= all.n; i++) once += seen[i] == 1;
    CHECK(once == all.n);
    free(seen);
    /* validation rows are the same bytes as in the full set */
    for (size_t i = 0; i < va.n; i++) {
        size_t r = (size_t)va.line[i] - 1; /* no skipped lines: row = line - 1 */
        CHECK(memcmp(va.ids + i * 64, all.ids + r * 64, 64 * sizeof(int32_t)) == 0);
    }
    /* the shuffle is not a trivial prefix: validation lines spread out */
    CHECK(va.line[0] < 100 && va.line[va.n - 1] > 4900);
    mg_dataset_free(&tr2);
    mg_dataset_free(&va2);
    mg_dataset_free(&tr3);
    mg_dataset_free(&va3);
    /* fractions: 0 -> empty validation; rounding; bad fractions */
    CHECK(mg_dataset_split(&all, 0.0, 1, &tr2, &va2, &err) == 0);
    CHECK(tr2.n == 5000 && va2.n == 0 && va2.ids == NULL);
    mg_dataset_free(&tr2);
    mg_dataset_free(&va2);
    CHECK(mg_dataset_split(&all, 0.00011, 1, &tr2, &va2, &err) == 0 && va2.n == 1);
    mg_dataset_free(&tr2);
    mg_dataset_free(&va2);
    CHECK(mg_dataset_split(&all, 1.0, 1, &tr2, &va2, &err) != 0);
    CHECK(mg_dataset_split(&all, -0.1, 1, &tr2, &va2, &err) != 0);

    /* PRNG: splitmix64 reference values (seed 0), Fisher-Yates is a
     * permutation */
    uint64_t s = 0;
    CHECK(mg_splitmix64(&s) == 0xE220A8397B1DCDAFULL);
    CHECK(mg_splitmix64(&s) == 0x6E789E6AA1B965F4ULL);
    size_t idx[100];
    for (size_t i = 0; i < 100; i++) idx[i] = i;
    s = 7;
    mg_shuffle_indices(idx, 100, &s);
    int cnt[100] = {0};
    size_t fixed = 0;
    for (size_t i = 0; i < 100; i++) {
        cnt[idx[i]]++;
        fixed += idx[i] == i;
    }
    for (size_t i = 0; i < 100; i++) CHECK(cnt[i] == 1);
    CHECK(fixed < 10);

    /* batches */
    const int B = 64;
    mg_batcher *b1 = NULL, *b2 = NULL, *b3 = NULL;
    CHECK(mg_batcher_new(&tr, B, 7, 1, &b1, &err) == 0);
    CHECK(mg_batcher_new(&tr, B, 7, 1, &b2, &err) == 0);
    CHECK(mg_batcher_new(&tr, B, 8, 1, &b3, &err) == 0);
    if (b1 && b2 && b3) {
        uint64_t pe = mg_batcher_per_epoch(b1);
        CHECK(pe == 4500 / 64);
        int32_t *ids1 = malloc((size_t)B * 64 * sizeof *ids1);
        int32_t *ids2 = malloc((size_t)B * 64 * sizeof *ids2);
        int64_t len1[64], len2[64];
        size_t rows1[64], rows2[64], rows3[64];
        unsigned char *used = calloc(tr.n, 1);
        size_t first_rows_epoch1[64];
        int differs_b3 = 0;
        size_t saved_rows[64];
        for (uint64_t k = 0; k < 2 * pe + 3; k++) {
            CHECK(mg_batcher_epoch(b1) == k / pe && mg_batcher_step(b1) == k);
            mg_batcher_next(b1, ids1, len1, rows1);
            mg_batcher_next(b2, ids2, len2, rows2);
            mg_batcher_next(b3, NULL, NULL, rows3);
            CHECK(memcmp(rows1, rows2, sizeof rows1) == 0);
            CHECK(memcmp(ids1, ids2, (size_t)B * 64 * sizeof *ids1) == 0);
            CHECK(memcmp(len1, len2, sizeof len1) == 0);
            if (memcmp(rows1, rows3, sizeof rows1) != 0) differs_b3 = 1;
            for (int i = 0; i < B; i++) {
                CHECK(rows1[i] < tr.n);
                CHECK(len1[i] == tr.lengths[rows1[i]]);
                CHECK(memcmp(ids1 + (size_t)i * 64, tr.ids + rows1[i] * 64, 64 * sizeof *ids1) ==
                      0);
                if (k < pe) {
                    CHECK(used[rows1[i]] == 0); /* no repeats within an epoch */
                    used[rows1[i]] = 1;
                }
            }
            if (k == pe) memcpy(first_rows_epoch1, rows1, sizeof rows1);
            if (k == 5) memcpy(saved_rows, rows1, sizeof rows1);
        }
        CHECK(differs_b3);
        /* epoch 1 is a different permutation from epoch 0 */
        mg_batcher_seek(b2, 0);
        mg_batcher_next(b2, NULL, NULL, rows2);
        CHECK(memcmp(rows2, first_rows_epoch1, sizeof rows2) != 0);
        /* seek reproduces any batch */
        mg_batcher_seek(b2, 5);
        mg_batcher_next(b2, NULL, NULL, rows2);
        CHECK(memcmp(rows2, saved_rows, sizeof rows2) == 0 && mg_batcher_step(b2) == 6);
        mg_batcher_seek(b2, pe);
        mg_batcher_next(b2, NULL, NULL, rows2);
        CHECK(memcmp(rows2, first_rows_epoch1, sizeof rows2) == 0);
        free(ids1);
        free(ids2);
        free(used);
    }
    mg_batcher_free(b1);
    mg_batcher_free(b2);
    mg_batcher_free(b3);
    /* no shuffle: file order, wrapping at n / B * B */
    CHECK(mg_batcher_new(&va, 200, 1, 0, &b1, &err) == 0);
    if (b1) {
        size_t rows[200];
        mg_batcher_next(b1, NULL, NULL, rows);
        CHECK(rows[0] == 0 && rows[199] == 199);
        mg_batcher_next(b1, NULL, NULL, rows);
        CHECK(rows[0] == 200 && rows[199] == 399);
        mg_batcher_next(b1, NULL, NULL, rows); /* 500 / 200 = 2 per epoch */
        CHECK(rows[0] == 0 && mg_batcher_epoch(b1) == 1);
        mg_batcher_free(b1);
    }
    CHECK(mg_batcher_new(&va, 501, 1, 1, &b1, &err) != 0 && b1 == NULL);
    CHECK(strstr(err.message, "batch size 501") != NULL);
    CHECK(mg_batcher_new(&va, 0, 1, 1, &b1, &err) != 0);

    /* encode_row */
    int32_t row[8];
    int64_t len = 0;
    CHECK(mg_encode_row(v, "CCO", 8, row, &len, &err) == 0 && len == 5);
    CHECK(row[0] == MG_BOS && row[4] == MG_EOS && row[5] == MG_PAD && row[7] == MG_PAD);
    CHECK(mg_encode_row(v, "CCCCCCC", 8, row, &len, &err) == MG_ERR_TOO_LONG);
    CHECK(strstr(err.message, "7 tokens, more than T - 2 = 6") != NULL);
    CHECK(mg_encode_row(v, "CCCCCC", 8, row, &len, &err) == 0 && len == 8);

    mg_dataset_free(&tr);
    mg_dataset_free(&va);
    mg_dataset_free(&all);
    mg_vocab_free(v);
}

static void test_big_corpus(void) {
    char path[1024];
    snprintf(path, sizeof path, "%s/moses_176k.smi", mg_test_data_dir());
    mg_load_opts o = {0};
    mg_vocab *v = NULL;
    mg_dataset d;
    mg_report rep;
    mg_error err = {0};
    clock_t t0 = clock();
    CHECK(mg_dataset_load(path, &o, NULL, &v, &d, &rep, &err) == 0);
    double sec = (double)(clock() - t0) / CLOCKS_PER_SEC;
    CHECK(d.n == 176074 && rep.skipped == 0 && d.T == 53 && mg_vocab_size(v) == 27);
    printf("moses_176k: %zu molecules, T = %d, vocab %d, loaded in %.2f s\n", d.n, d.T,
           mg_vocab_size(v), sec);
    mg_dataset_free(&d);
    mg_vocab_free(v);
    snprintf(path, sizeof path, "%s/zinc250k_24k.smi", mg_test_data_dir());
    o.T = 64;
    CHECK(mg_dataset_load(path, &o, NULL, &v, &d, &rep, &err) == 0);
    printf("zinc250k_24k with T = 64: kept %ld, too long %ld, vocab %d\n", rep.kept, rep.too_long,
           mg_vocab_size(v));
    CHECK(rep.kept + rep.too_long == 24445 && rep.too_long > 0);
    mg_dataset_free(&d);
    mg_vocab_free(v);
}

int main(void) {
    const char *t = getenv("TMPDIR");
    if (!t || !t[0]) t = "/tmp";
    snprintf(g_smi, sizeof g_smi, "%s/mg_data_test_%ld.smi", t, (long)getpid());
    snprintf(g_csv, sizeof g_csv, "%s/mg_data_test_%ld.CSV", t, (long)getpid());
    snprintf(g_tmp, sizeof g_tmp, "%s/mg_data_test_%ld_b.smi", t, (long)getpid());
    test_smi_file();
    test_csv_file();
    test_split_and_batches();
    test_big_corpus();
    remove(g_smi);
    remove(g_csv);
    remove(g_tmp);
    if (tu_fail) {
        fprintf(stderr, "test_data: %d failure(s)\n", tu_fail);
        return 1;
    }
    printf("test_data: OK\n");
    return 0;
}
