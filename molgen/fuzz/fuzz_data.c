/* libFuzzer target: molgen's data reader (molgen/chem/data.c): .smi and .csv
 * files through mg_dataset_load (mg_read_smiles, tokenisation, the
 * vocabulary, the id matrix), then the split and the batcher.
 *
 * Input: byte 0 selects the options, the rest is the file's contents. The
 * reader takes a path (its format follows the extension), so each run
 * rewrites one file in a private temporary directory (on /dev/shm when it
 * exists), named in.csv or in.smi.
 *   bit 0     CSV (else .smi)
 *   bit 1     a fixed vocabulary (the shipped model's 24 MOSES tokens; else
 *             built from the data)
 *   bits 2-3  T = auto, 8, 24, 64
 *   bits 4-5  max_tokens = none, 3, 12, 40
 *   bit 6     CSV column "SMILES" (else the default, "smiles")
 * Checked, from the documented contract:
 *   - failure: a message, an empty dataset, no vocabulary handed out;
 *   - the report adds up: records = kept + skipped, skipped = the sum of its
 *     reasons, one "path:line: reason" message per skip up to MG_REPORT_MSGS;
 *   - every row is BOS, its tokens, EOS, then PAD, within T and max_tokens,
 *     and decodes back to its source string; line numbers increase; a built
 *     vocabulary has no token that no kept molecule uses;
 *   - the split partitions the rows (file order kept in both parts), and
 *     batches hold dataset rows, trimmed to their longest row;
 *   - mg_read_records (molgen score's reader) on the same file: every record
 *     mg_read_smiles keeps, in order with its line, among at least as many
 *     records; flawed ones "" with a valid code; the same report.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <unistd.h>

#include "chem/data.h"
#include "fuzz_util.h"
#include "chem/tokenizer.h"

static char g_dir[256], g_smi[300], g_csv[300];
static mg_vocab *g_fixed;

static void cleanup(void) {
    unlink(g_smi);
    unlink(g_csv);
    rmdir(g_dir);
}

static void setup(void) {
    const char *base = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : getenv("TMPDIR");
    snprintf(g_dir, sizeof g_dir, "%s/molgen_fuzz_data.XXXXXX", base ? base : "/tmp");
    FZ_CHECK(mkdtemp(g_dir) != NULL, "mkdtemp %s", g_dir);
    snprintf(g_smi, sizeof g_smi, "%s/in.smi", g_dir);
    snprintf(g_csv, sizeof g_csv, "%s/in.csv", g_dir);
    atexit(cleanup);
    static const char *const moses[] = {"#", "(", ")",   "-",    "1", "2",  "3", "4",
                                        "5", "6", "=",   "Br",   "C", "Cl", "F", "N",
                                        "O", "S", "[H]", "[nH]", "c", "n",  "o", "s"};
    mg_error err = {0};
    FZ_CHECK(mg_vocab_from_tokens(moses, sizeof moses / sizeof *moses, &g_fixed, &err) == MG_OK,
             "fixed vocabulary: %s", err.message);
}

static void write_file(const char *path, const uint8_t *p, size_t n) {
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    FZ_CHECK(fd >= 0, "cannot create %s", path);
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        FZ_CHECK(w > 0, "write to %s", path);
        p += w;
        n -= (size_t)w;
    }
    close(fd);
}

static void check_report(const mg_report *r, const char *path, mg_status rc) {
    FZ_CHECK(r->skipped == r->bad_char + r->unknown_token + r->too_long + r->other,
             "skipped %ld != %ld + %ld + %ld + %ld", r->skipped, r->bad_char, r->unknown_token,
             r->too_long, r->other);
    FZ_CHECK(r->lines >= r->records && r->records >= 0, "lines %ld records %ld", r->lines,
             r->records);
    if (rc == 0)
        FZ_CHECK(r->records == r->kept + r->skipped, "records %ld != kept %ld + skipped %ld",
                 r->records, r->kept, r->skipped);
    long want = r->skipped < MG_REPORT_MSGS ? r->skipped : MG_REPORT_MSGS;
    FZ_CHECK(rc != 0 || r->nmsg == want, "%d messages for %ld skips", r->nmsg, r->skipped);
    size_t pl = strlen(path);
    for (int i = 0; i < r->nmsg; i++)
        FZ_CHECK(!strncmp(r->msg[i], path, pl) && r->msg[i][pl] == ':', "message '%s'", r->msg[i]);
    char out[4096], tiny[16];
    mg_report_format(r, out, sizeof out);
    FZ_CHECK(!strncmp(out, "read ", 5), "report '%.80s'", out);
    mg_report_format(r, tiny, sizeof tiny);
    FZ_CHECK(strlen(tiny) < sizeof tiny && !strncmp(tiny, out, strlen(tiny)), "truncated report");
}

static void check_rows(const mg_dataset *d, const mg_vocab *v, const mg_report *r, int T,
                       int maxtok, int built) {
    int nv = mg_vocab_size(v);
    FZ_CHECK(d->n == (size_t)r->kept && d->n >= 1, "%zu rows, %ld kept", d->n, r->kept);
    FZ_CHECK(T == 0 ? d->T >= 3 : d->T == T, "T %d (asked %d)", d->T, T);
    unsigned char *used = calloc((size_t)nv, 1);
    char *dec = malloc((size_t)d->T * (MG_TOKEN_MAX + 1) + 1);
    FZ_CHECK(used && dec, "out of memory");
    for (size_t i = 0; i < d->n; i++) {
        const int32_t *row = d->ids + i * (size_t)d->T;
        int64_t len = d->lengths[i];
        FZ_CHECK(len >= 3 && len <= d->T, "row %zu: length %lld, T %d", i, (long long)len, d->T);
        FZ_CHECK(maxtok == 0 || len - 2 <= maxtok, "row %zu: %lld tokens, max %d", i,
                 (long long)len - 2, maxtok);
        FZ_CHECK(row[0] == MG_BOS && row[len - 1] == MG_EOS, "row %zu: no BOS / EOS", i);
        for (int64_t j = 1; j < len - 1; j++) {
            FZ_CHECK(row[j] >= MG_NUM_SPECIAL && row[j] < nv, "row %zu: id %d at %lld", i,
                     (int)row[j], (long long)j);
            used[row[j]] = 1;
        }
        for (int64_t j = len; j < d->T; j++)
            FZ_CHECK(row[j] == MG_PAD, "row %zu: id %d in the padding", i, (int)row[j]);
        mg_status rc = mg_vocab_decode(v, row, (int)len, dec, (size_t)d->T * (MG_TOKEN_MAX + 1) + 1,
                                       NULL, NULL);
        FZ_CHECK(rc == MG_OK && !strcmp(dec, d->smiles[i]),
                 "row %zu decodes to '%.80s', source '%.80s'", i, dec, d->smiles[i]);
        FZ_CHECK(d->line[i] >= 1 && d->line[i] <= r->lines &&
                     (i == 0 || d->line[i] > d->line[i - 1]),
                 "row %zu: line %ld", i, d->line[i]);
    }
    if (built)
        for (int id = MG_NUM_SPECIAL; id < nv; id++)
            FZ_CHECK(used[id], "token '%s' in the built vocabulary but in no row",
                     mg_vocab_token(v, id));
    free(used);
    free(dec);
}

/* Rows of part are rows of all (same ids), in file order. */
static void check_part(const mg_dataset *all, const mg_dataset *part, unsigned char *seen) {
    FZ_CHECK(part->n == 0 || part->T == all->T, "part T %d", part->T);
    size_t j = 0;
    for (size_t i = 0; i < part->n; i++) {
        while (j < all->n && all->line[j] != part->line[i]) j++;
        FZ_CHECK(j < all->n && !seen[j], "part row %zu (line %ld) not a fresh row in file order", i,
                 part->line[i]);
        seen[j] = 1;
        FZ_CHECK(part->lengths[i] == all->lengths[j] &&
                     !memcmp(part->ids + i * (size_t)all->T, all->ids + j * (size_t)all->T,
                             (size_t)all->T * sizeof *all->ids) &&
                     !strcmp(part->smiles[i], all->smiles[j]),
                 "part row %zu differs from row %zu", i, j);
    }
}

static void check_split_and_batches(const mg_dataset *d, uint64_t seed) {
    mg_dataset tr, va;
    mg_error err = {0};
    mg_status rc = mg_dataset_split(d, 0.3, seed, &tr, &va, &err);
    FZ_CHECK(rc == MG_OK, "split: %s", err.message);
    FZ_CHECK(tr.n + va.n == d->n && tr.n >= 1, "split %zu + %zu of %zu", tr.n, va.n, d->n);
    unsigned char *seen = calloc(d->n, 1);
    FZ_CHECK(seen != NULL, "out of memory");
    check_part(d, &tr, seen);
    check_part(d, &va, seen);
    free(seen);

    int B = tr.n < 3 ? (int)tr.n : 3;
    mg_batcher *b = NULL;
    rc = mg_batcher_new(&tr, B, seed, 1, &b, &err);
    FZ_CHECK(rc == MG_OK, "batcher: %s", err.message);
    int32_t *ids = malloc((size_t)B * (size_t)tr.T * sizeof *ids);
    int32_t *trim = malloc((size_t)B * (size_t)tr.T * sizeof *trim);
    int64_t len[3];
    size_t rows[3];
    FZ_CHECK(ids && trim, "out of memory");
    for (int step = 0; step < 3; step++) {
        mg_batcher_next(b, ids, len, rows);
        int64_t longest = 2;
        for (int k = 0; k < B; k++) {
            FZ_CHECK(rows[k] < tr.n && len[k] == tr.lengths[rows[k]] &&
                         !memcmp(ids + (size_t)k * tr.T, tr.ids + rows[k] * (size_t)tr.T,
                                 (size_t)tr.T * sizeof *ids),
                     "batch row %d is not dataset row %zu", k, rows[k]);
            if (len[k] > longest) longest = len[k];
        }
        int Tb = mg_trim_batch(ids, len, B, tr.T, trim);
        FZ_CHECK(Tb == longest, "trimmed to %d, longest row %lld", Tb, (long long)longest);
        for (int k = 0; k < B; k++)
            FZ_CHECK(
                !memcmp(trim + (size_t)k * Tb, ids + (size_t)k * tr.T, (size_t)Tb * sizeof *ids),
                "trimmed row %d", k);
    }
    free(ids);
    free(trim);
    mg_batcher_free(b);
    mg_dataset_free(&tr);
    mg_dataset_free(&va);
}

/* mg_read_records against mg_read_smiles on the same file. */
static void check_records(const char *path, int csv, const char *column) {
    mg_smiles_list a, b;
    mg_report ra, rb;
    mg_error err = {0};
    const mg_status rca = mg_read_smiles(path, column, &a, &ra, &err);
    const mg_status rcb = mg_read_records(NULL, path, csv, column, &b, &rb, &err);
    FZ_CHECK(rca == rcb, "mg_read_smiles %d, mg_read_records %d", rca, rcb);
    if (rca == MG_OK && rcb == MG_OK) {
        FZ_CHECK(b.flaw != NULL && b.n >= a.n, "%zu records for %zu molecules", b.n, a.n);
        FZ_CHECK(rb.too_long == ra.too_long && rb.lines == ra.lines, "reports differ");
        size_t j = 0;
        for (size_t i = 0; i < b.n; i++) {
            FZ_CHECK(b.flaw[i] <= MG_REC_BAD_CSV && (b.flaw[i] == MG_REC_OK || !b.smiles[i][0]),
                     "record %zu: flaw %d '%.40s'", i, b.flaw[i], b.smiles[i]);
            FZ_CHECK(i == 0 || b.line[i] > b.line[i - 1], "record %zu: line %ld", i, b.line[i]);
            if (j < a.n && b.line[i] == a.line[j]) {
                FZ_CHECK(!strcmp(a.smiles[j], b.smiles[i]), "line %ld: '%.40s' vs '%.40s'",
                         a.line[j], a.smiles[j], b.smiles[i]);
                j++;
            }
        }
        FZ_CHECK(j == a.n, "%zu of %zu molecules among the records", j, a.n);
    }
    mg_smiles_list_free(&a);
    mg_smiles_list_free(&b);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!g_fixed) setup();
    if (size < 1) return 0;
    static const int k_T[4] = {0, 8, 24, 64}, k_max[4] = {0, 3, 12, 40};
    unsigned mode = data[0];
    const char *path = (mode & 1) ? g_csv : g_smi;
    write_file(path, data + 1, size - 1);
    mg_load_opts o = {.csv_column = (mode & 64) ? "SMILES" : NULL,
                      .T = k_T[(mode >> 2) & 3],
                      .max_tokens = k_max[(mode >> 4) & 3]};
    const mg_vocab *fixed = (mode & 2) ? g_fixed : NULL;
    mg_vocab *built = NULL;
    mg_dataset d;
    mg_report r;
    mg_error err = {0};
    check_records(path, mode & 1, o.csv_column);
    mg_status rc = mg_dataset_load(path, &o, fixed, &built, &d, &r, &err);
    check_report(&r, path, rc);
    if (rc != 0) {
        FZ_CHECK(fz_err_ok(&err, rc) && built == NULL && d.n == 0 && d.ids == NULL,
                 "failure: %d '%s', vocabulary %p, %zu rows", rc, err.message, (void *)built, d.n);
        return 0;
    }
    FZ_CHECK(fixed ? built == NULL : built != NULL, "vocabulary handed out: %p", (void *)built);
    check_rows(&d, fixed ? fixed : built, &r, o.T, o.max_tokens, !fixed);
    check_split_and_batches(&d, mode);
    mg_dataset_free(&d);
    mg_vocab_free(built);
    return 0;
}
