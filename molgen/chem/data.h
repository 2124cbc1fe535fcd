/* molgen data: read SMILES files, encode to fixed-length id sequences,
 * deterministic train/validation split, batch iterator.
 *
 * Sequence layout (one molecule per row, T ids):
 *     BOS t1 t2 ... tk EOS PAD ... PAD         length = k + 2 <= T
 * The model uses input = row[0 .. T-1), target = row[1 .. T), masks the loss
 * where target == PAD (i.e. positions >= length-1), and passes
 * key_lengths = length - 1 (the number of real input positions) to attention.
 *
 * Errors: an mg_status with a message in the caller's mg_error (errors.h).
 * Nothing aborts, exits or prints.
 */
#ifndef MG_DATA_H
#define MG_DATA_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "base/errors.h"

#include "chem/tokenizer.h"
#include "base/util.h" /* mg_splitmix64 */

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------ report */

#define MG_REPORT_MSGS 8            /* messages kept verbatim */
#define MG_MAX_LINE_BYTES (1 << 20) /* longer input lines are skipped */
#define MG_REPORT_MSGLEN 256

/* What a load skipped. Never silent: every skipped line is counted, and the
 * first MG_REPORT_MSGS are kept as "file:line: reason". */
typedef struct {
    long lines;         /* physical lines read (header included) */
    long records;       /* candidate molecules (non-blank, non-comment) */
    long kept;          /* molecules in the dataset */
    long skipped;       /* = bad_char + unknown_token + too_long + other */
    long bad_char;      /* does not tokenise */
    long unknown_token; /* token not in the fixed vocabulary */
    long too_long;      /* k + 2 > T */
    long other;         /* e.g. csv row without the column, empty field */
    int nmsg;           /* messages stored (<= MG_REPORT_MSGS) */
    char msg[MG_REPORT_MSGS][MG_REPORT_MSGLEN];
} mg_report;

/* Human-readable multi-line summary of a report into out[outlen]
 * ("read 1000 records, kept 998, skipped 2 (1 bad character, ...)" followed
 * by the stored messages, one per line). Returns out. */
char *mg_report_format(const mg_report *r, char *out, size_t outlen);

/* ------------------------------------------------------------ raw reading */

/* A list of SMILES strings with their source line numbers (1-based). */
typedef struct {
    size_t n;
    char **smiles;       /* n NUL-terminated strings */
    long *line;          /* n line numbers */
    unsigned char *flaw; /* mg_read_records: n MG_REC_* codes; NULL otherwise */
    /* private: */
    char *blob_;
    size_t cap_;
} mg_smiles_list;

/* Read molecules from a file, no tokenisation yet.
 * Format by extension: ".csv" (case-insensitive) = CSV with a header row,
 * the column named csv_column (NULL -> "smiles"; matched case-insensitively,
 * surrounding whitespace ignored); double-quoted fields with "" escapes are
 * handled (no newlines inside quotes). Anything else = .smi: the first
 * whitespace-separated field of each line; blank lines and lines whose first
 * non-blank character is '#' are skipped. "\n", "\r\n" and a lone "\r" all
 * end a line. Only regular files are read (a device such as /dev/zero is
 * an error); a line longer than MG_MAX_LINE_BYTES is skipped and counted as
 * too long without being held in memory; out of memory is an error.
 * rep may be NULL; if given it is zeroed and receives lines/records and
 * "other" skips (e.g. csv rows missing the column). */
mg_status mg_read_smiles(const char *path, const char *csv_column, mg_smiles_list *out,
                         mg_report *rep, mg_error *err);
void mg_smiles_list_free(mg_smiles_list *l); /* zeroes it; NULL fine */

/* Why mg_read_records could not give a record's SMILES (it is "" then). */
enum {
    MG_REC_OK = 0,
    MG_REC_LINE_TOO_LONG = 1, /* longer than MG_MAX_LINE_BYTES */
    MG_REC_NUL = 2,           /* a NUL byte in the line */
    MG_REC_BAD_CSV = 3        /* an unterminated quote, or fewer fields than the column */
};

/* For a tool that must answer for every input line (molgen score): like
 * mg_read_smiles, but every line is a record except a CSV header and .smi
 * comments; blank lines and empty CSV fields are records with SMILES "",
 * lines the reader cannot use are records with "" and their code in
 * out->flaw (rep still counts and names them). f: an open stream (a pipe
 * is fine), or NULL to open path (a regular file); path names the input in
 * messages; csv: the format (mg_read_smiles decides it by extension). */
mg_status mg_read_records(FILE *f, const char *path, int csv, const char *csv_column,
                          mg_smiles_list *out, mg_report *rep, mg_error *err);

/* ------------------------------------------------------------ augmentation */

/* A file of randomized SMILES (python3 -m molgen.randomize_smiles): the header
 * "#molgen-augment v1 k=K seed=S lines=N source=NAME", then N lines, line
 * i + 1 holding the space-separated copies of line i of the data file
 * (none when the data line is blank, a comment or not a molecule). */
#define MG_AUGMENT_MAGIC "#molgen-augment v1"

/* Every copy in file order; out->line[j] is the DATA line (1-based) copy j
 * belongs to; *data_lines = N. MG_ERR_FORMAT for a missing / bad header or
 * a line count other than N; MG_ERR_IO, MG_ERR_NOMEM. */
mg_status mg_augment_read(const char *path, mg_smiles_list *out, long *data_lines, mg_error *err);

/* ------------------------------------------------------------ dataset */

typedef struct {
    size_t n;         /* molecules (rows) */
    int T;            /* ids per row (context length incl. BOS/EOS) */
    int32_t *ids;     /* n*T, row-major */
    int64_t *lengths; /* n: k + 2 (BOS + k tokens + EOS), <= T */
    char **smiles;    /* n source strings (owned) */
    long *line;       /* n source line numbers (1-based) */
    /* private: */
    char *blob_;
} mg_dataset;

typedef struct {
    const char *csv_column; /* NULL -> "smiles" */
    int T;                  /* context length; 0 = automatic: the longest
                               kept molecule + 2 (only then nothing is
                               skipped as too long) */
    int max_tokens;         /* 0 = no extra limit; else molecules with more
                               than max_tokens tokens are skipped as too long
                               (T is then at most max_tokens + 2) */
} mg_load_opts;

/* Load a file into a dataset.
 * vocab == NULL: molecules that do not tokenise or are too long are skipped,
 *   and a vocabulary is built from the kept ones and returned in *vocab_out
 *   (required non-NULL then; caller frees).
 * vocab != NULL: fixed vocabulary; molecules with an unknown token are
 *   skipped too; *vocab_out (may be NULL) is left untouched.
 * rep (may be NULL) is zeroed and filled. Zero kept molecules is an error.
 * The dataset must be released with mg_dataset_free. */
mg_status mg_dataset_load(const char *path, const mg_load_opts *opts, const mg_vocab *vocab,
                          mg_vocab **vocab_out, mg_dataset *out, mg_report *rep, mg_error *err);

/* Same from an in-memory list (line numbers taken from it; "where" names the
 * source in report messages, e.g. the file name). rep (may be NULL) is NOT
 * zeroed: counts and messages are added to it (kept is set). */
mg_status mg_dataset_from_list(const mg_smiles_list *list, const char *where,
                               const mg_load_opts *opts, const mg_vocab *vocab,
                               mg_vocab **vocab_out, mg_dataset *out, mg_report *rep,
                               mg_error *err);

void mg_dataset_free(mg_dataset *d); /* zeroes it; NULL fine */

/* Encode one SMILES as a row: seq[0..T) = BOS tokens EOS PAD...,
 * *length = k + 2. Errors as mg_vocab_encode (MG_ERR_TOO_LONG if
 * k + 2 > T). */
mg_status mg_encode_row(const mg_vocab *v, const char *smiles, int T, int32_t *seq, int64_t *length,
                        mg_error *err);

/* Deterministic split: a seeded shuffle (splitmix64 + Fisher-Yates) of the
 * row indices; the first round(n * val_frac) (at most n - 1) go to
 * validation, the rest to training; each part keeps the original file order
 * and T. val_frac in [0, 1). A part may be empty (n == 0, pointers NULL).
 * Both must be freed. */
mg_status mg_dataset_split(const mg_dataset *all, double val_frac, uint64_t seed, mg_dataset *train,
                           mg_dataset *val, mg_error *err);

/* ------------------------------------------------------------ PRNG */

/* Fisher-Yates shuffle of idx[0..n) driven by mg_splitmix64(state). */
void mg_shuffle_indices(size_t *idx, size_t n, uint64_t *state);

/* ------------------------------------------------------------ batches */

typedef struct mg_batcher mg_batcher; /* opaque */

/* An endless stream of batches of exactly B rows over d (which must outlive
 * the batcher). Epoch e visits the rows in a permutation that depends only on
 * (seed, e) (shuffle == 0: file order every epoch); the last n % B rows of a
 * permutation are dropped so every batch is full. Requires 1 <= B <= d->n. */
mg_status mg_batcher_new(const mg_dataset *d, int B, uint64_t seed, int shuffle, mg_batcher **out,
                         mg_error *err);
void mg_batcher_free(mg_batcher *b);

/* Fill the next batch: ids[B*T], lengths[B], rows[B] (the dataset row
 * indices; may be NULL). Returns 0. */
int mg_batcher_next(mg_batcher *b, int32_t *ids, int64_t *lengths, size_t *rows);

/* Copy a batch ids [B, T] into a compact out [B, Tb], Tb the longest of
 * lengths [B] (at least 2); returns Tb. */
int mg_trim_batch(const int32_t *ids, const int64_t *lengths, int B, int T, int32_t *out);

/* Batches per epoch = n / B. */
uint64_t mg_batcher_per_epoch(const mg_batcher *b);
/* Epoch of the next batch (0-based) and the number of batches handed out. */
uint64_t mg_batcher_epoch(const mg_batcher *b);
uint64_t mg_batcher_step(const mg_batcher *b);
/* Position the stream so that the next batch is global batch number k (as
 * if k batches had been taken): for resuming training from a checkpoint. */
void mg_batcher_seek(mg_batcher *b, uint64_t k);

#ifdef __cplusplus
}
#endif
#endif /* MG_DATA_H */
