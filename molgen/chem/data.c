/* molgen data: see data.h. */
#define _POSIX_C_SOURCE 200809L
#include "chem/data.h"
#include "base/errors.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static void rep_msg(mg_report *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void rep_msg(mg_report *r, const char *fmt, ...) {
    if (!r || r->nmsg >= MG_REPORT_MSGS) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->msg[r->nmsg], MG_REPORT_MSGLEN, fmt, ap);
    va_end(ap);
    r->nmsg++;
}

char *mg_report_format(const mg_report *r, char *out, size_t outlen) {
    if (!out || outlen == 0) return out;
    out[0] = '\0';
    if (!r) return out;
    size_t o = 0;
#define APP(...)                                                                                   \
    do {                                                                                           \
        if (o < outlen) {                                                                          \
            int w_ = snprintf(out + o, outlen - o, __VA_ARGS__);                                   \
            if (w_ > 0) o += (size_t)w_;                                                           \
        }                                                                                          \
    } while (0)
    APP("read %ld lines, %ld records, kept %ld, skipped %ld", r->lines, r->records, r->kept,
        r->skipped);
    if (r->skipped)
        APP(" (%ld bad character, %ld unknown token, %ld too long, %ld other)", r->bad_char,
            r->unknown_token, r->too_long, r->other);
    for (int i = 0; i < r->nmsg; i++) APP("\n  %s", r->msg[i]);
    if (r->skipped > r->nmsg && r->nmsg > 0) APP("\n  ... and %ld more", r->skipped - r->nmsg);
#undef APP
    return out;
}

/* ------------------------------------------------------------ raw reading */

typedef struct {
    char *blob;
    size_t blen, bcap;
    size_t *off;
    long *line;
    size_t n, cap;
} list_builder;

static int lb_add(list_builder *b, const char *s, size_t len, long line) {
    if (b->n == b->cap) {
        size_t nc = b->cap ? b->cap * 2 : 1024;
        size_t *o = realloc(b->off, nc * sizeof *o);
        if (!o) return -1;
        b->off = o;
        long *l = realloc(b->line, nc * sizeof *l);
        if (!l) return -1;
        b->line = l;
        b->cap = nc;
    }
    if (b->blen + len + 1 > b->bcap) {
        size_t nc = b->bcap ? b->bcap : 65536;
        while (nc < b->blen + len + 1) nc *= 2;
        char *q = realloc(b->blob, nc);
        if (!q) return -1;
        b->blob = q;
        b->bcap = nc;
    }
    memcpy(b->blob + b->blen, s, len);
    b->blob[b->blen + len] = '\0';
    b->off[b->n] = b->blen;
    b->line[b->n] = line;
    b->blen += len + 1;
    b->n++;
    return 0;
}

static void lb_free(list_builder *b) {
    free(b->blob);
    free(b->off);
    free(b->line);
    memset(b, 0, sizeof *b);
}

static int lb_finish(list_builder *b, mg_smiles_list *out) {
    memset(out, 0, sizeof *out);
    out->smiles = malloc((b->n ? b->n : 1) * sizeof *out->smiles);
    if (!out->smiles) return -1;
    for (size_t i = 0; i < b->n; i++) out->smiles[i] = b->blob + b->off[i];
    out->n = b->n;
    out->line = b->line;
    out->blob_ = b->blob;
    out->cap_ = b->n;
    if (!out->line) { /* n == 0 */
        out->line = malloc(sizeof *out->line);
        if (!out->line) {
            free(out->smiles);
            out->smiles = NULL;
            return -1;
        }
    }
    free(b->off);
    memset(b, 0, sizeof *b);
    return 0;
}

void mg_smiles_list_free(mg_smiles_list *l) {
    if (!l) return;
    free(l->smiles);
    free(l->line);
    free(l->blob_);
    free(l->flaw);
    memset(l, 0, sizeof *l);
}

static int ends_with_ci(const char *s, const char *suffix) {
    size_t a = strlen(s), b = strlen(suffix);
    if (a < b) return 0;
    for (size_t i = 0; i < b; i++)
        if (tolower((unsigned char)s[a - b + i]) != tolower((unsigned char)suffix[i])) return 0;
    return 1;
}

/* Split one CSV line into fields (in place). Quoted fields: "a,b" and "" for
 * a quote. Unquoted fields are trimmed. Returns the field count (<= cap) or
 * -1 for an unterminated quote. */
static int csv_split(char *line, char **fields, int cap) {
    int nf = 0;
    char *p = line;
    for (;;) {
        while (*p == ' ' || *p == '\t') p++;
        char *start, *w;
        if (*p == '"') {
            start = w = ++p;
            for (;;) {
                if (*p == '\0') return -1;
                if (*p == '"') {
                    if (p[1] == '"') {
                        *w++ = '"';
                        p += 2;
                        continue;
                    }
                    p++;
                    break;
                }
                *w++ = *p++;
            }
            while (*p && *p != ',') p++; /* ignore junk between the closing quote and ',' */
        } else {
            start = p;
            while (*p && *p != ',') p++;
            w = p;
            while (w > start && (w[-1] == ' ' || w[-1] == '\t')) w--;
        }
        char sep = *p;
        *w = '\0';
        if (nf < cap) fields[nf] = start;
        nf++;
        if (sep != ',') break;
        p++;
    }
    return nf < cap ? nf : cap;
}

static int strcaseeq(const char *a, const char *b) {
    for (; *a && *b; a++, b++)
        if (tolower((unsigned char)*a) != tolower((unsigned char)*b)) return 0;
    return *a == *b;
}

/* One line of f into *buf (grown as needed, NUL-terminated, without its end):
 * "\n", "\r\n" and a lone "\r" (old Mac files) all end a line. A line longer
 * than MG_MAX_LINE_BYTES is read to its end but not kept (*toolong = 1,
 * *len = its length), so memory stays bounded whatever the input. Returns 1
 * for a line, 0 at end of file, -1 when out of memory. */
static int read_line(FILE *f, char **buf, size_t *cap, size_t *len, int *toolong) {
    size_t n = 0;
    int c = EOF, any = 0;
    *toolong = 0;
    while ((c = getc_unlocked(f)) != EOF) {
        any = 1;
        if (c == '\n') break;
        if (c == '\r') {
            int d = getc_unlocked(f);
            if (d != '\n' && d != EOF) ungetc(d, f);
            break;
        }
        if (n >= MG_MAX_LINE_BYTES) {
            *toolong = 1;
            n++;
            continue;
        }
        if (n + 1 >= *cap) {
            size_t nc = *cap ? *cap * 2 : 256;
            char *q = realloc(*buf, nc);
            if (!q) return -1;
            *buf = q;
            *cap = nc;
        }
        (*buf)[n++] = (char)c;
    }
    if (!any) return 0;
    if (!*buf) {
        *buf = malloc(1);
        if (!*buf) return -1;
        *cap = 1;
    }
    (*buf)[*toolong ? 0 : n] = '\0';
    *len = n;
    return 1;
}

#define CSV_MAX_FIELDS 4096

/* read_stream's state: the records so far and where the reader is. */
typedef struct {
    const char *path;
    const char *col; /* the CSV column */
    int csv, keep;
    int colidx;        /* the column's field, -1 before the header */
    char **fields;     /* [CSV_MAX_FIELDS] with csv */
    list_builder b;    /* the records */
    unsigned char *flaw; /* [flaw_cap] with keep: each record's code */
    size_t flaw_cap;
    long lineno;
    mg_report *rep;
} stream_reader;

/* A record of the line: the SMILES s[0..len) (code MG_REC_OK) or a flawed
 * one (its code; kept as "" with keep, else left out). */
static mg_status reader_record(stream_reader *rd, int code, const char *s, size_t len,
                               mg_error *err) {
    if (code != MG_REC_OK && !rd->keep) return MG_OK;
    if (rd->keep && rd->b.n == rd->flaw_cap) {
        const size_t nc = rd->flaw_cap ? 2 * rd->flaw_cap : 1024;
        unsigned char *q = realloc(rd->flaw, nc);
        if (!q) return mg_fail(err, MG_ERR_NOMEM, "out of memory");
        rd->flaw = q;
        rd->flaw_cap = nc;
    }
    if (rd->keep) rd->flaw[rd->b.n] = (unsigned char)code;
    if (lb_add(&rd->b, s, len, rd->lineno)) return mg_fail(err, MG_ERR_NOMEM, "out of memory");
    return MG_OK;
}

/* A line refused before its fields are read (rep's counts, a message). */
static mg_status reader_skip(stream_reader *rd, int code, mg_error *err) {
    rd->rep->other++;
    rd->rep->skipped++;
    return reader_record(rd, code, "", 0, err);
}

/* A CSV line (p: its first non-space byte): the header row, then records. */
static mg_status reader_csv_line(stream_reader *rd, char *line, const char *p, mg_error *err) {
    mg_report *rep = rd->rep;
    if (*p == '\0' && (rd->colidx < 0 || !rd->keep)) return MG_OK;
    const int nf = csv_split(line, rd->fields, CSV_MAX_FIELDS);
    if (rd->colidx < 0) { /* header row */
        if (nf < 0)
            return mg_fail(err, MG_ERR_FORMAT, "%s:%ld: unterminated quote in header", rd->path,
                           rd->lineno);
        for (int i = 0; i < nf && rd->colidx < 0; i++)
            if (strcaseeq(rd->fields[i], rd->col)) rd->colidx = i;
        if (rd->colidx < 0)
            return mg_fail(err, MG_ERR_FORMAT, "%s:%ld: no column named '%s' in the header",
                           rd->path, rd->lineno, rd->col);
        return MG_OK;
    }
    rep->records++;
    if (nf < 0) {
        rep_msg(rep, "%s:%ld: unterminated quote", rd->path, rd->lineno);
        return reader_skip(rd, MG_REC_BAD_CSV, err);
    }
    if (nf <= rd->colidx) {
        rep_msg(rep, "%s:%ld: only %d fields, column '%s' is field %d", rd->path, rd->lineno, nf,
                rd->col, rd->colidx + 1);
        return reader_skip(rd, MG_REC_BAD_CSV, err);
    }
    const char *v = rd->fields[rd->colidx];
    if (!*v && !rd->keep) {
        rep->other++;
        rep->skipped++;
        rep_msg(rep, "%s:%ld: empty '%s' field", rd->path, rd->lineno, rd->col);
        return MG_OK;
    }
    return reader_record(rd, MG_REC_OK, v, strlen(v), err);
}

/* One line of n bytes (toolong: it was cut at the limit). */
static mg_status reader_line(stream_reader *rd, char *line, size_t n, int toolong, mg_error *err) {
    mg_report *rep = rd->rep;
    rep->lines++;
    if (toolong) {
        rep->records++;
        rep->too_long++;
        rep->skipped++;
        rep_msg(rep, "%s:%ld: line of %zu bytes, longer than the %d-byte limit", rd->path,
                rd->lineno, n, MG_MAX_LINE_BYTES);
        return reader_record(rd, MG_REC_LINE_TOO_LONG, "", 0, err);
    }
    if (n != strlen(line)) {
        rep->records++;
        rep_msg(rep, "%s:%ld: NUL byte in line", rd->path, rd->lineno);
        return reader_skip(rd, MG_REC_NUL, err);
    }
    if (rd->lineno == 1 && n >= 3 && (unsigned char)line[0] == 0xEF &&
        (unsigned char)line[1] == 0xBB && (unsigned char)line[2] == 0xBF) {
        memmove(line, line + 3, (size_t)n - 2); /* UTF-8 BOM */
        n -= 3;
    }
    const char *p = line;
    while (*p && isspace((unsigned char)*p)) p++;
    if (rd->csv) return reader_csv_line(rd, line, p, err);
    if (*p == '#' || (*p == '\0' && !rd->keep)) return MG_OK;
    const char *e = p;
    while (*e && !isspace((unsigned char)*e)) e++;
    rep->records++;
    return reader_record(rd, MG_REC_OK, p, (size_t)(e - p), err);
}

/* The end of the stream (got: read_line's last return): the list into
 * out, or why not. */
static mg_status reader_finish(stream_reader *rd, FILE *f, int got, mg_smiles_list *out,
                               mg_error *err) {
    if (got < 0)
        return mg_fail(err, MG_ERR_NOMEM, "%s:%ld: out of memory", rd->path, rd->lineno + 1);
    if (ferror(f)) return mg_fail(err, MG_ERR_IO, "read error on %s", rd->path);
    if (rd->csv && rd->colidx < 0)
        return mg_fail(err, MG_ERR_FORMAT, "%s: empty CSV file (no header row)", rd->path);
    if ((rd->keep && !rd->flaw && !(rd->flaw = malloc(1))) || lb_finish(&rd->b, out))
        return mg_fail(err, MG_ERR_NOMEM, "out of memory");
    out->flaw = rd->flaw;
    rd->flaw = NULL;
    return MG_OK;
}

/* The reader of mg_read_smiles and mg_read_records: records of f in order.
 * keep == 0: records the reader cannot give a SMILES for are skipped and
 * counted in rep; keep == 1: every line after a CSV header except .smi
 * comments is a record, flawed ones with "" and their MG_REC_* code in
 * out->flaw. */
static mg_status read_stream(FILE *f, const char *path, int csv, const char *csv_column, int keep,
                             mg_smiles_list *out, mg_report *rep, mg_error *err) {
    stream_reader rd = {.path = path, .col = csv_column ? csv_column : "smiles", .csv = csv,
                        .keep = keep, .colidx = -1, .rep = rep};
    if (csv && !(rd.fields = malloc(CSV_MAX_FIELDS * sizeof *rd.fields)))
        return mg_fail(err, MG_ERR_NOMEM, "out of memory");
    char *line = NULL;
    size_t lcap = 0, n = 0;
    int got = 0, toolong;
    mg_status rc = MG_OK;
    while (!rc && (got = read_line(f, &line, &lcap, &n, &toolong)) > 0) {
        rd.lineno++;
        rc = reader_line(&rd, line, n, toolong, err);
    }
    if (!rc) rc = reader_finish(&rd, f, got, out, err);
    free(line);
    free(rd.fields);
    free(rd.flaw);
    lb_free(&rd.b);
    return rc;
}

/* path opened for reading, refused unless a regular file (a device or a
 * pipe such as /dev/zero or /dev/urandom may never end). */
static FILE *open_regular(const char *path, mg_error *err) {
    FILE *f = fopen(path, "r");
    if (!f) {
        mg_fail(err, MG_ERR_IO, "cannot open %s: %s", path, strerror(errno));
        return NULL;
    }
    struct stat st;
    if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode)) {
        fclose(f);
        mg_fail(err, MG_ERR_IO, "%s: not a regular file", path);
        return NULL;
    }
    return f;
}

mg_status mg_read_smiles(const char *path, const char *csv_column, mg_smiles_list *out,
                         mg_report *rep, mg_error *err) {
    mg_report dummy;
    if (!rep) rep = &dummy;
    memset(rep, 0, sizeof *rep);
    if (!path || !out) return mg_fail(err, MG_ERR_ARG, "mg_read_smiles: bad argument");
    memset(out, 0, sizeof *out);
    FILE *f = open_regular(path, err);
    if (!f) return err ? err->status : MG_ERR_IO;
    const mg_status rc =
        read_stream(f, path, ends_with_ci(path, ".csv"), csv_column, 0, out, rep, err);
    fclose(f);
    return rc;
}

mg_status mg_read_records(FILE *f, const char *path, int csv, const char *csv_column,
                          mg_smiles_list *out, mg_report *rep, mg_error *err) {
    mg_report dummy;
    if (!rep) rep = &dummy;
    memset(rep, 0, sizeof *rep);
    if (!path || !out) return mg_fail(err, MG_ERR_ARG, "mg_read_records: bad argument");
    memset(out, 0, sizeof *out);
    FILE *own = f ? NULL : open_regular(path, err);
    if (!f && !own) return err ? err->status : MG_ERR_IO;
    const mg_status rc = read_stream(f ? f : own, path, csv, csv_column, 1, out, rep, err);
    if (own) fclose(own);
    return rc;
}

/* ------------------------------------------------------------ augmentation */

mg_status mg_augment_read(const char *path, mg_smiles_list *out, long *data_lines, mg_error *err) {
    if (!path || !out || !data_lines)
        return mg_fail(err, MG_ERR_ARG, "mg_augment_read: bad argument");
    memset(out, 0, sizeof *out);
    *data_lines = 0;
    FILE *f = open_regular(path, err);
    if (!f) return err ? err->status : MG_ERR_IO;
    list_builder b;
    memset(&b, 0, sizeof b);
    char *buf = NULL;
    size_t cap = 0, len = 0;
    int toolong = 0;
    long lineno = 0, want = -1;
    mg_status rc = 0;
    int got;
    while ((got = read_line(f, &buf, &cap, &len, &toolong)) == 1) {
        lineno++;
        if (toolong) {
            rc = mg_fail(err, MG_ERR_FORMAT, "%s:%ld: line longer than %d bytes", path, lineno,
                         MG_MAX_LINE_BYTES);
            break;
        }
        if (lineno == 1) {
            const char *l = strstr(buf, " lines=");
            char *end = NULL;
            if (strncmp(buf, MG_AUGMENT_MAGIC " ", strlen(MG_AUGMENT_MAGIC) + 1) == 0 && l)
                want = strtol(l + 7, &end, 10);
            if (want < 0 || !end || (*end && *end != ' ')) {
                rc = mg_fail(err, MG_ERR_FORMAT,
                             "%s: not a randomized-SMILES file (its first line must be '%s ... "
                             "lines=N ...'; make one with python3 -m molgen.randomize_smiles)",
                             path, MG_AUGMENT_MAGIC);
                break;
            }
            continue;
        }
        if (lineno - 1 > want) {
            rc = mg_fail(err, MG_ERR_FORMAT, "%s:%ld: more lines than the header's lines=%ld", path,
                         lineno, want);
            break;
        }
        for (char *p = buf; *p;) { /* the copies of data line lineno - 1 */
            while (*p == ' ' || *p == '\t') p++;
            char *q = p;
            while (*q && *q != ' ' && *q != '\t') q++;
            if (q > p && lb_add(&b, p, (size_t)(q - p), lineno - 1)) {
                rc = mg_fail(err, MG_ERR_NOMEM, "%s: out of memory", path);
                break;
            }
            p = q;
        }
        if (rc) break;
    }
    if (got < 0 && !rc) rc = mg_fail(err, MG_ERR_NOMEM, "%s: out of memory", path);
    if (!rc && ferror(f)) rc = mg_fail(err, MG_ERR_IO, "%s: read error", path);
    if (!rc && lineno == 0)
        rc = mg_fail(err, MG_ERR_FORMAT, "%s: empty, not a randomized-SMILES file", path);
    if (!rc && lineno - 1 != want)
        rc = mg_fail(err, MG_ERR_FORMAT,
                     "%s: %ld lines of copies, the header says lines=%ld (cut short?)", path,
                     lineno - 1, want);
    free(buf);
    fclose(f);
    if (!rc && lb_finish(&b, out)) rc = mg_fail(err, MG_ERR_NOMEM, "%s: out of memory", path);
    lb_free(&b);
    if (!rc) *data_lines = want;
    return rc;
}

/* ------------------------------------------------------------ dataset */

void mg_dataset_free(mg_dataset *d) {
    if (!d) return;
    free(d->ids);
    free(d->lengths);
    free(d->smiles);
    free(d->line);
    free(d->blob_);
    memset(d, 0, sizeof *d);
}

mg_status mg_encode_row(const mg_vocab *v, const char *smiles, int T, int32_t *seq, int64_t *length,
                        mg_error *err) {
    if (!v || !smiles || !seq || T < 2)
        return mg_fail(err, MG_ERR_ARG, "mg_encode_row: bad argument (T = %d)", T);
    int k = 0;
    mg_status rc = mg_vocab_encode(v, smiles, seq + 1, T - 2, &k, err);
    if (rc == MG_ERR_TOO_LONG)
        return mg_fail(err, MG_ERR_TOO_LONG, "%d tokens, more than T - 2 = %d", k, T - 2);
    if (rc) return rc;
    seq[0] = MG_BOS;
    seq[k + 1] = MG_EOS;
    for (int i = k + 2; i < T; i++) seq[i] = MG_PAD;
    if (length) *length = k + 2;
    return 0;
}

/* Allocate d for n rows of T ids and blob_bytes of strings. */
static int ds_alloc(mg_dataset *d, size_t n, int T, size_t blob_bytes) {
    memset(d, 0, sizeof *d);
    size_t rows = n ? n : 1;
    d->ids = malloc(rows * (size_t)(T > 0 ? T : 1) * sizeof *d->ids);
    d->lengths = malloc(rows * sizeof *d->lengths);
    d->smiles = malloc(rows * sizeof *d->smiles);
    d->line = malloc(rows * sizeof *d->line);
    d->blob_ = malloc(blob_bytes ? blob_bytes : 1);
    if (!d->ids || !d->lengths || !d->smiles || !d->line || !d->blob_) {
        mg_dataset_free(d);
        return -1;
    }
    d->n = n;
    d->T = T;
    return 0;
}

enum { ST_OK = 0, ST_BAD_CHAR, ST_UNKNOWN, ST_TOO_LONG, ST_EMPTY };

/* Record s's status (ST_*) for mg_dataset_from_list: its tokens in *k,
 * with vocab the first token it lacks in msg. */
static int record_status(const mg_vocab *vocab, const char *s, int limit, int *k, mg_error *msg) {
    int pos = 0;
    *k = 0;
    for (;;) {
        int l = mg_token_len(s + pos);
        if (l == 0) break;
        if (l < 0) return ST_BAD_CHAR;
        if (vocab && mg_vocab_lookup(vocab, s + pos, l) < MG_NUM_SPECIAL) {
            snprintf(msg->message, sizeof msg->message, "unknown token '%.*s' at position %d", l,
                     s + pos, pos);
            return ST_UNKNOWN;
        }
        (*k)++;
        pos += l;
    }
    if (*k == 0) return ST_EMPTY;
    return *k > limit ? ST_TOO_LONG : ST_OK;
}

/* A skipped record (status st, k tokens; line ln of where) into rep. */
static void report_skipped(mg_report *rep, const char *where, long ln, int st, const char *s,
                           int k, int limit, mg_error *msg) {
    switch (st) {
    case ST_BAD_CHAR:
        mg_tokenize(s, NULL, 0, NULL, NULL, msg);
        rep->bad_char++;
        rep_msg(rep, "%s:%ld: cannot tokenise: %s", where, ln, msg->message);
        break;
    case ST_UNKNOWN:
        rep->unknown_token++;
        rep_msg(rep, "%s:%ld: %s", where, ln, msg->message);
        break;
    case ST_TOO_LONG:
        rep->too_long++;
        rep_msg(rep, "%s:%ld: too long: %d tokens, more than the model's limit %d", where, ln, k,
                limit); /* the wording of nll_score.c's too_long */
        break;
    default:
        rep->other++;
        rep_msg(rep, "%s:%ld: empty SMILES", where, ln);
        break;
    }
    rep->skipped++;
}

/* The vocabulary of the kept records (status[i] == ST_OK) into *built. */
static mg_status vocab_of_kept(const mg_smiles_list *list, const unsigned char *status,
                               size_t kept, mg_vocab **built, mg_error *err) {
    const char **ok = malloc(kept * sizeof *ok);
    if (!ok) return mg_fail(err, MG_ERR_NOMEM, "out of memory");
    size_t m = 0;
    for (size_t i = 0; i < list->n; i++)
        if (status[i] == ST_OK) ok[m++] = list->smiles[i];
    mg_status rc = mg_vocab_build(ok, m, built, err);
    free(ok);
    return rc;
}

/* out's rows (allocated: kept rows of T ids, blob bytes of strings): the
 * kept records encoded with vocab, in list order. */
static mg_status fill_dataset(const mg_smiles_list *list, const unsigned char *status,
                              const mg_vocab *vocab, int T, mg_dataset *out, mg_error *err) {
    size_t r = 0, bo = 0;
    for (size_t i = 0; i < list->n; i++) {
        if (status[i] != ST_OK) continue;
        const char *s = list->smiles[i];
        int64_t len;
        mg_status rc = mg_encode_row(vocab, s, T, out->ids + r * (size_t)T, &len, err);
        if (rc) { /* cannot happen: checked by record_status */
            mg_dataset_free(out);
            return rc;
        }
        out->lengths[r] = len;
        size_t sl = strlen(s);
        memcpy(out->blob_ + bo, s, sl + 1);
        out->smiles[r] = out->blob_ + bo;
        bo += sl + 1;
        out->line[r] = list->line ? list->line[i] : (long)i + 1;
        r++;
    }
    return MG_OK;
}

mg_status mg_dataset_from_list(const mg_smiles_list *list, const char *where,
                               const mg_load_opts *opts, const mg_vocab *vocab,
                               mg_vocab **vocab_out, mg_dataset *out, mg_report *rep,
                               mg_error *err) {
    mg_report dummy;
    if (!rep) {
        rep = &dummy;
        memset(rep, 0, sizeof *rep);
    }
    if (!list || !out || (!vocab && !vocab_out))
        return mg_fail(err, MG_ERR_ARG, "mg_dataset_from_list: bad argument");
    memset(out, 0, sizeof *out);
    if (!where) where = "(input)";
    int T = opts ? opts->T : 0;
    int maxtok = opts ? opts->max_tokens : 0;
    if (T < 0 || maxtok < 0 || T == 1 || T == 2)
        return mg_fail(err, MG_ERR_ARG,
                       "bad options: T = %d (need 0 or >= 3), "
                       "max_tokens = %d",
                       T, maxtok);
    size_t n = list->n;
    unsigned char *status = calloc(n ? n : 1, 1); /* [n] each record's ST_* */
    if (!status) return mg_fail(err, MG_ERR_NOMEM, "out of memory");
    int limit = INT32_MAX; /* max tokens allowed */
    if (maxtok > 0) limit = maxtok;
    if (T > 0 && T - 2 < limit) limit = T - 2;
    size_t kept = 0, blob = 0;
    int maxk = 0;
    mg_error msg;
    for (size_t i = 0; i < n; i++) {
        const char *s = list->smiles[i];
        int k;
        const int st = record_status(vocab, s, limit, &k, &msg);
        status[i] = (unsigned char)st;
        if (st != ST_OK) {
            report_skipped(rep, where, list->line ? list->line[i] : (long)i + 1, st, s, k, limit,
                           &msg);
            continue;
        }
        kept++;
        blob += strlen(s) + 1;
        if (k > maxk) maxk = k;
    }
    rep->kept = (long)kept;
    mg_status rc = MG_OK;
    mg_vocab *built = NULL;
    if (kept == 0)
        rc = mg_fail(err, MG_ERR_FORMAT, "%s: no usable molecules (%zu records, %ld skipped)",
                     where, n, rep->skipped);
    if (T == 0) T = maxk + 2;
    if (!rc && !vocab && !(rc = vocab_of_kept(list, status, kept, &built, err))) vocab = built;
    if (!rc && ds_alloc(out, kept, T, blob))
        rc = mg_fail(err, MG_ERR_NOMEM, "out of memory (%zu x %d ids)", kept, T);
    if (!rc) rc = fill_dataset(list, status, vocab, T, out, err);
    if (!rc && built) {
        *vocab_out = built;
        built = NULL;
    }
    mg_vocab_free(built);
    free(status);
    return rc;
}

mg_status mg_dataset_load(const char *path, const mg_load_opts *opts, const mg_vocab *vocab,
                          mg_vocab **vocab_out, mg_dataset *out, mg_report *rep, mg_error *err) {
    mg_report local;
    if (!rep) rep = &local;
    if (out) memset(out, 0, sizeof *out);
    mg_smiles_list list;
    mg_status rc = mg_read_smiles(path, opts ? opts->csv_column : NULL, &list, rep, err);
    if (rc) return rc;
    rc = mg_dataset_from_list(&list, path, opts, vocab, vocab_out, out, rep, err);
    mg_smiles_list_free(&list);
    return rc;
}

/* ------------------------------------------------------------ PRNG + split */

void mg_shuffle_indices(size_t *idx, size_t n, uint64_t *state) {
    if (!idx || n < 2) return;
    for (size_t i = n - 1; i > 0; i--) {
        size_t j = (size_t)(mg_splitmix64(state) % (uint64_t)(i + 1));
        size_t t = idx[i];
        idx[i] = idx[j];
        idx[j] = t;
    }
}

/* dst = rows of src where pick[i] == want, in order. */
static int ds_subset(const mg_dataset *src, const unsigned char *pick, unsigned char want,
                     mg_dataset *dst) {
    size_t m = 0, blob = 0;
    for (size_t i = 0; i < src->n; i++)
        if (pick[i] == want) {
            m++;
            blob += strlen(src->smiles[i]) + 1;
        }
    if (m == 0) {
        memset(dst, 0, sizeof *dst);
        dst->T = src->T;
        return 0;
    }
    if (ds_alloc(dst, m, src->T, blob)) return -1;
    size_t r = 0, bo = 0, T = (size_t)src->T;
    for (size_t i = 0; i < src->n; i++) {
        if (pick[i] != want) continue;
        memcpy(dst->ids + r * T, src->ids + i * T, T * sizeof *dst->ids);
        dst->lengths[r] = src->lengths[i];
        dst->line[r] = src->line[i];
        size_t sl = strlen(src->smiles[i]);
        memcpy(dst->blob_ + bo, src->smiles[i], sl + 1);
        dst->smiles[r] = dst->blob_ + bo;
        bo += sl + 1;
        r++;
    }
    return 0;
}

mg_status mg_dataset_split(const mg_dataset *all, double val_frac, uint64_t seed, mg_dataset *train,
                           mg_dataset *val, mg_error *err) {
    if (!all || !train || !val) return mg_fail(err, MG_ERR_ARG, "mg_dataset_split: bad argument");
    memset(train, 0, sizeof *train);
    memset(val, 0, sizeof *val);
    if (!(val_frac >= 0.0 && val_frac < 1.0))
        return mg_fail(err, MG_ERR_ARG, "validation fraction %g outside [0, 1)", val_frac);
    size_t n = all->n;
    size_t nval = (size_t)floor((double)n * val_frac + 0.5);
    if (nval >= n && n > 0) nval = n - 1;
    size_t *idx = malloc((n ? n : 1) * sizeof *idx);
    unsigned char *pick = calloc(n ? n : 1, 1);
    if (!idx || !pick) {
        free(idx);
        free(pick);
        return mg_fail(err, MG_ERR_NOMEM, "out of memory");
    }
    for (size_t i = 0; i < n; i++) idx[i] = i;
    uint64_t st = seed;
    mg_shuffle_indices(idx, n, &st);
    for (size_t i = 0; i < nval; i++) pick[idx[i]] = 1;
    mg_status rc = MG_OK;
    if (ds_subset(all, pick, 0, train) || ds_subset(all, pick, 1, val)) {
        mg_dataset_free(train);
        mg_dataset_free(val);
        rc = mg_fail(err, MG_ERR_NOMEM, "out of memory");
    }
    free(idx);
    free(pick);
    return rc;
}

/* ------------------------------------------------------------ batches */

struct mg_batcher {
    const mg_dataset *d;
    int B;
    uint64_t seed;
    int shuffle;
    uint64_t step;
    uint64_t per_epoch;
    uint64_t perm_epoch; /* epoch whose permutation is in perm */
    int have_perm;
    size_t *perm;
};

static void make_perm(mg_batcher *b, uint64_t epoch) {
    for (size_t i = 0; i < b->d->n; i++) b->perm[i] = i;
    if (b->shuffle) {
        uint64_t st = b->seed ^ (0xD1B54A32D192ED03ULL * (epoch + 1));
        mg_splitmix64(&st);
        mg_shuffle_indices(b->perm, b->d->n, &st);
    }
    b->perm_epoch = epoch;
    b->have_perm = 1;
}

mg_status mg_batcher_new(const mg_dataset *d, int B, uint64_t seed, int shuffle, mg_batcher **out,
                         mg_error *err) {
    if (!out) return mg_fail(err, MG_ERR_ARG, "mg_batcher_new: bad argument");
    *out = NULL;
    if (!d || d->n == 0) return mg_fail(err, MG_ERR_ARG, "mg_batcher_new: empty dataset");
    if (B < 1 || (size_t)B > d->n)
        return mg_fail(err, MG_ERR_ARG, "batch size %d outside [1, %zu] (the dataset size)", B,
                       d->n);
    mg_batcher *b = calloc(1, sizeof *b);
    if (!b) return mg_fail(err, MG_ERR_NOMEM, "out of memory");
    b->perm = malloc(d->n * sizeof *b->perm);
    if (!b->perm) {
        free(b);
        return mg_fail(err, MG_ERR_NOMEM, "out of memory");
    }
    b->d = d;
    b->B = B;
    b->seed = seed;
    b->shuffle = shuffle;
    b->per_epoch = d->n / (size_t)B;
    *out = b;
    return 0;
}

void mg_batcher_free(mg_batcher *b) {
    if (!b) return;
    free(b->perm);
    free(b);
}

int mg_batcher_next(mg_batcher *b, int32_t *ids, int64_t *lengths, size_t *rows) {
    if (!b) return MG_ERR_ARG;
    uint64_t epoch = b->step / b->per_epoch;
    size_t pos = (size_t)(b->step % b->per_epoch) * (size_t)b->B;
    if (!b->have_perm || b->perm_epoch != epoch) make_perm(b, epoch);
    size_t T = (size_t)b->d->T;
    for (int i = 0; i < b->B; i++) {
        size_t r = b->perm[pos + (size_t)i];
        if (ids) memcpy(ids + (size_t)i * T, b->d->ids + r * T, T * sizeof *ids);
        if (lengths) lengths[i] = b->d->lengths[r];
        if (rows) rows[i] = r;
    }
    b->step++;
    return 0;
}

uint64_t mg_batcher_per_epoch(const mg_batcher *b) { return b ? b->per_epoch : 0; }

uint64_t mg_batcher_epoch(const mg_batcher *b) { return b ? b->step / b->per_epoch : 0; }

uint64_t mg_batcher_step(const mg_batcher *b) { return b ? b->step : 0; }

void mg_batcher_seek(mg_batcher *b, uint64_t k) {
    if (b) b->step = k;
}

int mg_trim_batch(const int32_t *ids, const int64_t *lengths, int B, int T, int32_t *out) {
    int Tb = 2;
    for (int b = 0; b < B; b++)
        if (lengths[b] > Tb) Tb = (int)lengths[b];
    for (int b = 0; b < B; b++)
        memcpy(out + (size_t)b * Tb, ids + (size_t)b * T, (size_t)Tb * sizeof(int32_t));
    return Tb;
}
