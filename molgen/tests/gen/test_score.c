/* molgen score (nll_score.h) against the training-loss path.
 *
 * 1. The NLL of a molecule equals the training loss the model computes for
 *    it: for each molecule, mg_model_forward (evaluation, a batch of that
 *    molecule alone, one thread) gives loss == (float)(nll / tokens)
 *    exactly and ntok == tokens (EOS counted); a batched forward over all
 *    of them gives loss * count == sum of nll to fp32 rounding.
 * 2. Deterministic: the same bits for 1, 2 and 3 threads and work batches of
 *    1, 5 and 64, and for a range scored on its own.
 * 3. Rows that cannot be scored get their status: empty, bad_char,
 *    unknown_token, too_long (a molecule of exactly the context is ok, one
 *    token more is too long), bad_line (the reader's NUL byte, a CSV row
 *    without the column); a blank line is a record.
 * Uses the shipped model (models/molgen-moses.safetensors) and
 * data/moses_20k.smi, from the repository root (CTest's working directory). */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "chem/data.h"
#include "nn/model.h"
#include "gen/nll_score.h"

#include "mg_test.h"

#define NMOL 48

static void write_file(const char *path, const char *text, size_t n) {
    FILE *f = fopen(path, "wb");
    if (f) {
        fwrite(text, 1, n, f);
        fclose(f);
    }
}

int main(void) {
    mg_model *m = NULL;
    mg_vocab *v = NULL;
    mg_error err = {0};
    if (mg_model_load("models/molgen-moses.safetensors", 0, &m, &v, NULL, &err)) {
        fprintf(stderr, "%s\n", err.message);
        return 2;
    }
    const int ctx = mg_model_get_config(m)->ctx_len;
    /* NMOL molecules of moses_20k, then the rows that cannot be scored */
    mg_smiles_list data;
    if (mg_read_records(NULL, "data/moses_20k.smi", 0, NULL, &data, NULL, &err)) {
        fprintf(stderr, "%s\n", err.message);
        return 2;
    }
    char *exact = malloc((size_t)ctx + 1), *over = malloc((size_t)ctx + 2);
    memset(exact, 'C', (size_t)ctx - 1); /* ctx - 1 tokens + EOS: ctx targets */
    exact[ctx - 1] = '\0';
    memset(over, 'C', (size_t)ctx);
    over[ctx] = '\0';
    const char *extra[] = {"", "CC[Se]C", "c1ccX", over, exact, "CCO"};
    const mg_score_status want[] = {MG_SCORE_EMPTY,    MG_SCORE_UNKNOWN_TOKEN,
                                    MG_SCORE_BAD_CHAR, MG_SCORE_TOO_LONG,
                                    MG_SCORE_OK,       MG_SCORE_OK};
    enum { NX = sizeof extra / sizeof extra[0], N = NMOL + NX };
    const char *smi[N];
    for (int i = 0; i < NMOL; i++) smi[i] = data.smiles[i];
    for (int i = 0; i < NX; i++) smi[NMOL + i] = extra[i];

    mg_score ref[N], got[N];
    mg_score_opts o = {1, 1, NULL, NULL, NULL, NULL};
    CHECK(mg_score_molecules(m, v, smi, NULL, N, &o, ref, &err) == 0, "%s", err.message);
    for (int i = 0; i < N; i++)
        CHECK(ref[i].status == (i < NMOL ? MG_SCORE_OK : want[i - NMOL]), "row %d: status %s", i,
              mg_score_status_name(ref[i].status));
    CHECK(ref[NMOL + 3].tokens == ctx + 1, "too_long tokens %d", ref[NMOL + 3].tokens);
    CHECK(ref[NMOL + 4].tokens == ctx, "exact-context tokens %d", ref[NMOL + 4].tokens);
    CHECK(isnan(ref[NMOL].nll) && isnan(ref[NMOL + 1].nll), "nll of a bad row is not NAN");

    /* 1. the training-loss path, one molecule at a time and batched */
    mg_model_set_threads(m, 1);
    const int T = ctx + 1;
    int32_t *ids = calloc((size_t)N * T, sizeof *ids);
    int64_t len[N];
    int nb = 0, exact_match = 0;
    double sum = 0.0, worst = 0.0;
    for (int i = 0; i < N; i++) {
        if (ref[i].status != MG_SCORE_OK) continue;
        int32_t *row = ids + (size_t)nb * T;
        CHECK(mg_encode_row(v, smi[i], T, row, &len[nb], &err) == 0, "%s", err.message);
        float loss;
        int64_t ntok;
        CHECK(mg_model_forward(
                  m, &(mg_batch){.ids = row, .lengths = &len[nb], .B = 1, .T = (int)len[nb]}, 0, 0,
                  &loss, &ntok, &err) == 0,
              "%s", err.message);
        CHECK(ntok == ref[i].tokens, "row %d: %lld targets vs %d", i, (long long)ntok,
              ref[i].tokens);
        const float mine = (float)(ref[i].nll / ref[i].tokens);
        exact_match += memcmp(&mine, &loss, sizeof loss) == 0;
        const double rel = fabs((double)mine - loss) / loss;
        worst = rel > worst ? rel : worst;
        sum += ref[i].nll;
        nb++;
    }
    CHECK(exact_match == nb, "%d of %d molecules: score != training loss bitwise (worst %.3g)",
          nb - exact_match, nb, worst);
    float bl;
    int64_t bn;
    CHECK(mg_model_forward(m, &(mg_batch){.ids = ids, .lengths = len, .B = nb, .T = T}, 0, 0, &bl,
                           &bn, &err) == 0,
          "%s", err.message);
    const double brel = fabs((double)bl * (double)bn - sum) / sum;
    CHECK(brel < 1e-6, "batched loss x count %.9g vs sum of nll %.9g (rel %.3g)",
          (double)bl * (double)bn, sum, brel);
    printf("score vs training loss: %d of %d molecules bitwise; batched forward of %d: rel %.2e\n",
           exact_match, nb, nb, brel);

    /* 2. threads and work batches: the same bits; a range on its own too */
    const int threads[] = {1, 2, 3}, batches[] = {1, 5, 64};
    for (int a = 0; a < 3; a++)
        for (int b = 0; b < 3; b++) {
            mg_score_opts ob = {threads[a], batches[b], NULL, NULL, NULL, NULL};
            memset(got, 0xAB, sizeof got);
            CHECK(mg_score_molecules(m, v, smi, NULL, N, &ob, got, &err) == 0, "%s", err.message);
            int same = 1;
            for (int i = 0; i < N; i++)
                same &= got[i].status == ref[i].status && got[i].tokens == ref[i].tokens &&
                        (ref[i].status != MG_SCORE_OK ||
                         memcmp(&got[i].nll, &ref[i].nll, sizeof(double)) == 0);
            CHECK(same, "threads %d batch %d: results differ from 1 thread", threads[a],
                  batches[b]);
        }
    mg_score_opts o2 = {2, 3, NULL, NULL, NULL, NULL};
    CHECK(mg_score_molecules(m, v, smi + 17, NULL, 20, &o2, got, &err) == 0, "%s", err.message);
    CHECK(memcmp(&got[0].nll, &ref[17].nll, sizeof(double)) == 0 &&
              memcmp(&got[19].nll, &ref[36].nll, sizeof(double)) == 0,
          "a range scored on its own differs");

    /* 3. the reader's records: blank lines, a NUL byte, a CSV row without
     * the column, an empty CSV field */
    char path[128];
    snprintf(path, sizeof path, "/tmp/molgen_test_score_%d.smi", (int)getpid());
    static const char smi_text[] = "CCO\n\n# a comment\nC\0C\nc1ccccc1 benzene\n";
    write_file(path, smi_text, sizeof smi_text - 1);
    mg_smiles_list l;
    mg_report rep;
    CHECK(mg_read_records(NULL, path, 0, NULL, &l, &rep, &err) == 0, "%s", err.message);
    CHECK(l.n == 4 && l.flaw, "%zu records", l.n);
    if (l.n == 4 && l.flaw) {
        CHECK(!strcmp(l.smiles[0], "CCO") && l.line[0] == 1 && l.flaw[0] == MG_REC_OK);
        CHECK(!strcmp(l.smiles[1], "") && l.line[1] == 2 && l.flaw[1] == MG_REC_OK);
        CHECK(!strcmp(l.smiles[2], "") && l.line[2] == 4 && l.flaw[2] == MG_REC_NUL);
        CHECK(!strcmp(l.smiles[3], "c1ccccc1") && l.line[3] == 5);
        mg_score s4[4];
        CHECK(mg_score_molecules(m, v, (const char *const *)l.smiles, l.flaw, 4, NULL, s4, &err) ==
              0);
        CHECK(s4[0].status == MG_SCORE_OK && s4[1].status == MG_SCORE_EMPTY &&
                  s4[2].status == MG_SCORE_BAD_LINE && s4[3].status == MG_SCORE_OK,
              "statuses %d %d %d %d", s4[0].status, s4[1].status, s4[2].status, s4[3].status);
    }
    mg_smiles_list_free(&l);
    remove(path);
    snprintf(path, sizeof path, "/tmp/molgen_test_score_%d.csv", (int)getpid());
    static const char csv_text[] = "id,smiles\n1,CCO\n2\n3,\n\n4,\"CC(=O)O\"\n";
    write_file(path, csv_text, sizeof csv_text - 1);
    CHECK(mg_read_records(NULL, path, 1, NULL, &l, &rep, &err) == 0, "%s", err.message);
    CHECK(l.n == 5 && l.flaw, "%zu csv records", l.n);
    if (l.n == 5 && l.flaw)
        CHECK(l.flaw[0] == MG_REC_OK && l.flaw[1] == MG_REC_BAD_CSV && !strcmp(l.smiles[2], "") &&
                  l.flaw[2] == MG_REC_OK && !strcmp(l.smiles[3], "") &&
                  !strcmp(l.smiles[4], "CC(=O)O") && l.line[4] == 6,
              "csv records wrong");
    mg_smiles_list_free(&l);
    remove(path);

    free(ids);
    free(exact);
    free(over);
    mg_smiles_list_free(&data);
    mg_model_free(m);
    mg_vocab_free(v);
    printf("test_score: %d checks passed, %d failed\n", tu_pass, tu_fail);
    return tu_fail ? 1 : 0;
}
