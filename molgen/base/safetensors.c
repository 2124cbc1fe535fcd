/* molgen safetensors: dtypes and the reader (see safetensors.h; the header
 * is parsed with jansson through json.h); the writer is safetensors_write.c. */
#define _POSIX_C_SOURCE 200809L
#include "base/safetensors.h"
#include "base/errors.h"
#include "base/json.h"
#include "base/st_internal.h"
#include "base/util.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

int mg_st_host_le(void) {
    const uint16_t x = 1;
    unsigned char b;
    memcpy(&b, &x, 1);
    return b == 1;
}

/* ================================================================ dtypes */

static const struct {
    const char *name;
    size_t size;
} k_dtypes[MG_ST_NUM_DTYPES] = {
    [MG_ST_BOOL] = {"BOOL", 1},       [MG_ST_U8] = {"U8", 1},           [MG_ST_I8] = {"I8", 1},
    [MG_ST_F8_E5M2] = {"F8_E5M2", 1}, [MG_ST_F8_E4M3] = {"F8_E4M3", 1}, [MG_ST_I16] = {"I16", 2},
    [MG_ST_U16] = {"U16", 2},         [MG_ST_F16] = {"F16", 2},         [MG_ST_BF16] = {"BF16", 2},
    [MG_ST_I32] = {"I32", 4},         [MG_ST_U32] = {"U32", 4},         [MG_ST_F32] = {"F32", 4},
    [MG_ST_F64] = {"F64", 8},         [MG_ST_I64] = {"I64", 8},         [MG_ST_U64] = {"U64", 8},
};

const char *mg_st_dtype_name(mg_st_dtype dt) {
    if ((int)dt < 0 || dt >= MG_ST_NUM_DTYPES) return NULL;
    return k_dtypes[dt].name;
}

size_t mg_st_dtype_size(mg_st_dtype dt) {
    if ((int)dt < 0 || dt >= MG_ST_NUM_DTYPES) return 0;
    return k_dtypes[dt].size;
}

int mg_st_dtype_parse(const char *name, mg_st_dtype *dt) {
    if (!name) return -1;
    for (int i = 0; i < MG_ST_NUM_DTYPES; i++)
        if (strcmp(name, k_dtypes[i].name) == 0) {
            if (dt) *dt = (mg_st_dtype)i;
            return 0;
        }
    return -1;
}

/* prod(shape) * elsize with overflow detection; -1 on overflow. */
int mg_st_nbytes(const int64_t *shape, int ndim, size_t elsize, uint64_t *out) {
    uint64_t n = 1;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0) return -1;
        uint64_t d = (uint64_t)shape[i];
        if (d != 0 && n > UINT64_MAX / d) return -1;
        n *= d;
    }
    if (elsize && n > UINT64_MAX / elsize) return -1;
    *out = n * elsize;
    return 0;
}

static void shape_str(const int64_t *shape, int ndim, char *out, size_t outlen) {
    size_t o = 0;
    o += (size_t)snprintf(out, outlen, "[");
    for (int i = 0; i < ndim && o < outlen; i++)
        o += (size_t)snprintf(out + o, outlen - o, "%s%lld", i ? "," : "", (long long)shape[i]);
    if (o < outlen) snprintf(out + o, outlen - o, "]");
}

/* ================================================================ reading */

struct mg_st_file {
    json_t *hdr;           /* owns the name / metadata strings */
    const char *checksums; /* __metadata__[MG_ST_CHECKSUM_KEY] (not listed as metadata) */
    int checksummed;       /* every tensor's CRC-32 was in the metadata and matched */
    unsigned char *data;   /* byte buffer (malloc'ed, so 16-aligned) */
    size_t data_len;
    size_t nt;
    mg_st_tensor *t; /* sorted by offset */
    size_t nmeta;
    const char **mkey, **mval;
};

void mg_st_free(mg_st_file *f) {
    if (!f) return;
    json_decref(f->hdr);
    free(f->data);
    free(f->t);
    free(f->mkey);
    free(f->mval);
    free(f);
}

typedef struct {
    uint64_t begin, end;
    size_t idx;
} span64;

static int cmp_span(const void *a, const void *b) {
    const span64 *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return 0;
}

/* The checksums in __metadata__[MG_ST_CHECKSUM_KEY], when present, must name
 * exactly the file's tensors and match their bytes. */
static mg_status verify_checksums(mg_st_file *f, mg_error *err) {
    const char *cs = f->checksums;
    if (!cs) return MG_OK;
    json_t *j = NULL;
    mg_error e;
    if (mg_json_parse(cs, strlen(cs), &j, &e) || !json_is_object(j)) {
        json_decref(j);
        return mg_fail(err, MG_ERR_FORMAT, "the checksum table (metadata '%s') is corrupt%s%s",
                       MG_ST_CHECKSUM_KEY, j ? "" : ": ", j ? "" : e.message);
    }
    mg_status rc = MG_OK;
    if (json_object_size(j) != f->nt)
        rc = mg_fail(err, MG_ERR_FORMAT, "the checksum table lists %zu tensors, the file has %zu",
                     json_object_size(j), f->nt);
    for (size_t k = 0; !rc && k < f->nt; k++) {
        const mg_st_tensor *x = &f->t[k];
        const json_t *v = json_object_get(j, x->name);
        const char *hex = json_string_value(v);
        char *end = NULL;
        unsigned long want = hex && strlen(hex) == 8 ? strtoul(hex, &end, 16) : 0;
        if (!end || *end)
            rc = mg_fail(err, MG_ERR_FORMAT,
                         "the checksum table has no valid entry for tensor '%.60s'", x->name);
        else if ((uint32_t)want != mg_crc32(x->data, x->nbytes))
            rc = mg_fail(err, MG_ERR_FORMAT,
                         "tensor '%.60s' fails its checksum (CRC-32 %08x, recorded %08lx): the "
                         "file is corrupt",
                         x->name, (unsigned)mg_crc32(x->data, x->nbytes), want);
    }
    json_decref(j);
    f->checksummed = rc == MG_OK;
    return rc;
}

/* __metadata__: string values only; the checksum table is kept apart. */
static mg_status read_metadata(mg_st_file *f, json_t *meta, mg_error *err) {
    if (!json_is_object(meta))
        return mg_fail(err, MG_ERR_FORMAT, "safetensors header: __metadata__ is not an object");
    const size_t n = json_object_size(meta);
    f->mkey = calloc(n ? n : 1, sizeof *f->mkey);
    f->mval = calloc(n ? n : 1, sizeof *f->mval);
    if (!f->mkey || !f->mval) return mg_fail(err, MG_ERR_NOMEM, "out of memory");
    const char *key;
    json_t *v;
    json_object_foreach(meta, key, v) {
        if (!json_is_string(v))
            return mg_fail(err, MG_ERR_FORMAT,
                           "safetensors header: __metadata__ value of '%.60s' is not a string",
                           key);
        if (strcmp(key, MG_ST_CHECKSUM_KEY) == 0) {
            f->checksums = json_string_value(v);
            continue;
        }
        f->mkey[f->nmeta] = key;
        f->mval[f->nmeta] = json_string_value(v);
        f->nmeta++;
    }
    return MG_OK;
}

/* A non-negative JSON integer, or -1. */
static int64_t nonneg_int(const json_t *v) {
    return json_is_integer(v) && json_integer_value(v) >= 0 ? (int64_t)json_integer_value(v) : -1;
}

/* One tensor entry {"dtype", "shape", "data_offsets"} into *x and its byte
 * span, checked against a data buffer of dlen bytes. */
static mg_status read_tensor(const char *name, json_t *e, size_t dlen, mg_st_tensor *x,
                             span64 *span, mg_error *err) {
    if (!json_is_object(e))
        return mg_fail(err, MG_ERR_FORMAT, "tensor '%.60s': entry is not an object", name);
    const json_t *jd = NULL, *js = NULL, *jo = NULL;
    const char *key;
    json_t *v;
    json_object_foreach(e, key, v) {
        if (strcmp(key, "dtype") == 0)
            jd = v;
        else if (strcmp(key, "shape") == 0)
            js = v;
        else if (strcmp(key, "data_offsets") == 0)
            jo = v;
        else
            return mg_fail(err, MG_ERR_FORMAT, "tensor '%.60s': unexpected field '%.40s'", name,
                           key);
    }
    if (!jd || !js || !jo)
        return mg_fail(err, MG_ERR_FORMAT, "tensor '%.60s': missing %s", name,
                       !jd   ? "dtype"
                       : !js ? "shape"
                             : "data_offsets");
    x->name = name;
    if (!json_is_string(jd) || mg_st_dtype_parse(json_string_value(jd), &x->dtype))
        return mg_fail(err, MG_ERR_FORMAT, "tensor '%.60s': unknown dtype %s%.20s%s", name,
                       json_is_string(jd) ? "'" : "(not a string)",
                       json_is_string(jd) ? json_string_value(jd) : "",
                       json_is_string(jd) ? "'" : "");
    if (!json_is_array(js))
        return mg_fail(err, MG_ERR_FORMAT, "tensor '%.60s': shape is not an array", name);
    if (json_array_size(js) > MG_ST_MAX_DIMS)
        return mg_fail(err, MG_ERR_FORMAT,
                       "tensor '%.60s': %zu dimensions, more than the %d supported", name,
                       json_array_size(js), MG_ST_MAX_DIMS);
    x->ndim = (int)json_array_size(js);
    for (size_t d = 0; d < json_array_size(js); d++) {
        x->shape[d] = nonneg_int(json_array_get(js, d));
        if (x->shape[d] < 0)
            return mg_fail(err, MG_ERR_FORMAT,
                           "tensor '%.60s': shape[%zu] is not a non-negative integer", name, d);
    }
    if (!json_is_array(jo) || json_array_size(jo) != 2)
        return mg_fail(err, MG_ERR_FORMAT,
                       "tensor '%.60s': data_offsets is not a [begin, end] pair", name);
    int64_t off[2];
    for (int k = 0; k < 2; k++) {
        off[k] = nonneg_int(json_array_get(jo, (size_t)k));
        if (off[k] < 0)
            return mg_fail(err, MG_ERR_FORMAT,
                           "tensor '%.60s': data_offsets[%d] is not a non-negative integer", name,
                           k);
    }
    const uint64_t b = (uint64_t)off[0], en = (uint64_t)off[1];
    if (b > en)
        return mg_fail(err, MG_ERR_FORMAT, "tensor '%.60s': data_offsets [%llu, %llu] reversed",
                       name, (unsigned long long)b, (unsigned long long)en);
    if (en > dlen)
        return mg_fail(err, MG_ERR_FORMAT,
                       "tensor '%.60s': data_offsets [%llu, %llu] beyond the %zu-byte data buffer "
                       "(truncated file?)",
                       name, (unsigned long long)b, (unsigned long long)en, dlen);
    uint64_t nb;
    char shp[160];
    shape_str(x->shape, x->ndim, shp, sizeof shp);
    if (mg_st_nbytes(x->shape, x->ndim, mg_st_dtype_size(x->dtype), &nb))
        return mg_fail(err, MG_ERR_FORMAT, "tensor '%.60s': shape %s overflows", name, shp);
    if (nb != en - b)
        return mg_fail(err, MG_ERR_FORMAT,
                       "tensor '%.60s': %s %s needs %llu bytes but data_offsets span %llu", name,
                       mg_st_dtype_name(x->dtype), shp, (unsigned long long)nb,
                       (unsigned long long)(en - b));
    x->nbytes = (size_t)nb;
    span->begin = b;
    span->end = en;
    return MG_OK;
}

/* The spans sp[0..n) (sorted) must tile [0, dlen) exactly. */
static mg_status check_tiling(const mg_st_file *f, const span64 *sp, size_t n, size_t dlen,
                              mg_error *err) {
    uint64_t at = 0;
    for (size_t k = 0; k < n; k++) {
        const char *nm = f->t[sp[k].idx].name;
        if (sp[k].begin < at)
            return mg_fail(err, MG_ERR_FORMAT,
                           "tensor '%.60s': data_offsets [%llu, %llu] overlap another tensor", nm,
                           (unsigned long long)sp[k].begin, (unsigned long long)sp[k].end);
        if (sp[k].begin > at)
            return mg_fail(
                err, MG_ERR_FORMAT,
                "tensor '%.60s': data_offsets begin at %llu, leaving a hole after byte %llu", nm,
                (unsigned long long)sp[k].begin, (unsigned long long)at);
        at = sp[k].end;
    }
    if (at != dlen)
        return mg_fail(err, MG_ERR_FORMAT,
                       "data buffer has %zu bytes but the tensors cover %llu (trailing garbage or "
                       "truncation)",
                       dlen, (unsigned long long)at);
    return MG_OK;
}

/* Validate the header (text hdr[0..hlen)) against a byte buffer of dlen
 * bytes; takes ownership of data on success and failure. */
static mg_status st_build(const char *hdr, size_t hlen, unsigned char *data, size_t dlen,
                          mg_st_file **out, mg_error *err) {
    *out = NULL;
    mg_st_file *f = calloc(1, sizeof *f);
    if (!f) {
        free(data);
        return mg_fail(err, MG_ERR_NOMEM, "out of memory");
    }
    f->data = data;
    f->data_len = dlen;
    span64 *sp = NULL;
    mg_status rc;
    mg_error e;
    if (hlen == 0 || hdr[0] != '{') {
        rc = mg_fail(err, MG_ERR_FORMAT, "not a safetensors file: header does not start with '{'");
        goto fail;
    }
    if ((rc = mg_json_parse(hdr, hlen, &f->hdr, &e))) {
        rc = mg_fail(err, rc, "safetensors header: %s", e.message);
        goto fail;
    }
    if (!json_is_object(f->hdr)) {
        rc = mg_fail(err, MG_ERR_FORMAT, "safetensors header: not a JSON object");
        goto fail;
    }
    const size_t n = json_object_size(f->hdr);
    f->t = calloc(n ? n : 1, sizeof *f->t);
    sp = calloc(n ? n : 1, sizeof *sp);
    if (!f->t || !sp) {
        rc = mg_fail(err, MG_ERR_NOMEM, "out of memory");
        goto fail;
    }
    const char *name;
    json_t *v;
    json_object_foreach(f->hdr, name, v) {
        if (strcmp(name, "__metadata__") == 0) {
            if ((rc = read_metadata(f, v, err))) goto fail;
            continue;
        }
        mg_st_tensor *x = &f->t[f->nt];
        if ((rc = read_tensor(name, v, dlen, x, &sp[f->nt], err))) goto fail;
        x->data = data + sp[f->nt].begin;
        sp[f->nt].idx = f->nt;
        f->nt++;
    }
    qsort(sp, f->nt, sizeof *sp, cmp_span);
    if ((rc = check_tiling(f, sp, f->nt, dlen, err)) || (rc = verify_checksums(f, err))) goto fail;
    /* reorder tensors by offset */
    mg_st_tensor *sorted = calloc(f->nt ? f->nt : 1, sizeof *sorted);
    if (!sorted) {
        rc = mg_fail(err, MG_ERR_NOMEM, "out of memory");
        goto fail;
    }
    for (size_t k = 0; k < f->nt; k++) sorted[k] = f->t[sp[k].idx];
    free(f->t);
    f->t = sorted;
    free(sp);
    *out = f;
    return MG_OK;
fail:
    free(sp);
    mg_st_free(f);
    return rc;
}

static uint64_t rd_le64(const unsigned char *b) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | b[i];
    return v;
}

static mg_status check_sizes(uint64_t n, size_t total, mg_error *err) {
    if (total < 8)
        return mg_fail(err, MG_ERR_FORMAT,
                       "not a safetensors file: %zu bytes, shorter than the 8-byte "
                       "header size",
                       total);
    if (n > MG_ST_MAX_HEADER)
        return mg_fail(err, MG_ERR_FORMAT,
                       "not a safetensors file: header size %llu is absurd (limit %u)",
                       (unsigned long long)n, MG_ST_MAX_HEADER);
    if (n > total - 8)
        return mg_fail(err, MG_ERR_FORMAT,
                       "header size %llu larger than the rest of the file (%zu bytes): "
                       "truncated or not a safetensors file",
                       (unsigned long long)n, total - 8);
    return 0;
}

mg_status mg_st_parse(const void *buf, size_t len, mg_st_file **out, mg_error *err) {
    mg_status rc_;
    if (!out || (!buf && len > 0)) return mg_fail(err, MG_ERR_ARG, "mg_st_parse: bad argument");
    *out = NULL;
    if (!mg_st_host_le())
        return mg_fail(err, MG_ERR_FORMAT,
                       "safetensors reader: big-endian hosts are not supported");
    const unsigned char *b = buf;
    uint64_t n = len >= 8 ? rd_le64(b) : 0;
    if ((rc_ = check_sizes(n, len, err))) return rc_;
    size_t dlen = len - 8 - (size_t)n;
    unsigned char *data = malloc(dlen ? dlen : 1);
    if (!data) return mg_fail(err, MG_ERR_NOMEM, "out of memory");
    if (dlen) memcpy(data, b + 8 + n, dlen);
    return st_build((const char *)b + 8, (size_t)n, data, dlen, out, err);
}

mg_status mg_st_load(const char *path, mg_st_file **out, mg_error *err) {
    if (!out || !path) return mg_fail(err, MG_ERR_ARG, "mg_st_load: bad argument");
    *out = NULL;
    if (!mg_st_host_le())
        return mg_fail(err, MG_ERR_FORMAT,
                       "safetensors reader: big-endian hosts are not supported");
    FILE *f = fopen(path, "rb");
    if (!f) return mg_fail(err, MG_ERR_IO, "cannot open %s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode)) {
        fclose(f);
        return mg_fail(err, MG_ERR_IO, "%s: not a regular file", path);
    }
    size_t total = (size_t)st.st_size;
    unsigned char n8[8] = {0};
    size_t got = fread(n8, 1, 8, f);
    uint64_t n = rd_le64(n8);
    mg_error e2;
    if (check_sizes(n, got < 8 ? got : total, &e2)) {
        fclose(f);
        return mg_fail(err, e2.status, "%s: %s", path, e2.message);
    }
    char *hdr = malloc(n ? (size_t)n : 1);
    size_t dlen = total - 8 - (size_t)n;
    unsigned char *data = malloc(dlen ? dlen : 1);
    if (!hdr || !data) {
        free(hdr);
        free(data);
        fclose(f);
        return mg_fail(err, MG_ERR_NOMEM, "%s: out of memory", path);
    }
    if (fread(hdr, 1, (size_t)n, f) != (size_t)n || fread(data, 1, dlen, f) != dlen) {
        free(hdr);
        free(data);
        fclose(f);
        return mg_fail(err, MG_ERR_IO, "%s: short read (file changed while reading?)", path);
    }
    fclose(f);
    mg_status rc = st_build(hdr, (size_t)n, data, dlen, out, &e2);
    free(hdr);
    if (rc) return mg_fail(err, e2.status, "%s: %s", path, e2.message);
    return 0;
}

size_t mg_st_count(const mg_st_file *f) { return f ? f->nt : 0; }

const mg_st_tensor *mg_st_at(const mg_st_file *f, size_t i) {
    if (!f || i >= f->nt) return NULL;
    return &f->t[i];
}

const mg_st_tensor *mg_st_find(const mg_st_file *f, const char *name) {
    if (!f || !name) return NULL;
    for (size_t i = 0; i < f->nt; i++)
        if (strcmp(f->t[i].name, name) == 0) return &f->t[i];
    return NULL;
}

static mg_status check_tensor(const mg_st_file *f, const char *name, mg_st_dtype dtype, int ndim,
                              const int64_t *shape, const mg_st_tensor **out, mg_error *err) {
    const mg_st_tensor *x = mg_st_find(f, name);
    if (!x) return mg_fail(err, MG_ERR_FORMAT, "tensor '%s' not found", name ? name : "(null)");
    if (x->dtype != dtype)
        return mg_fail(err, MG_ERR_FORMAT, "tensor '%s': dtype %s, expected %s", name,
                       mg_st_dtype_name(x->dtype),
                       mg_st_dtype_name(dtype) ? mg_st_dtype_name(dtype) : "(invalid)");
    int same = x->ndim == ndim && (ndim == 0 || shape);
    for (int i = 0; same && i < ndim; i++) same = x->shape[i] == shape[i];
    if (!same) {
        char a[160], b[160];
        shape_str(x->shape, x->ndim, a, sizeof a);
        if (shape && ndim >= 0 && ndim <= MG_ST_MAX_DIMS)
            shape_str(shape, ndim, b, sizeof b);
        else
            snprintf(b, sizeof b, "(ndim %d)", ndim);
        return mg_fail(err, MG_ERR_FORMAT, "tensor '%s': shape %s, expected %s", name, a, b);
    }
    *out = x;
    return 0;
}

mg_status mg_st_get(const mg_st_file *f, const char *name, mg_st_dtype dtype, int ndim,
                    const int64_t *shape, const void **data, mg_error *err) {
    mg_status rc_;
    const mg_st_tensor *x;
    if (data) *data = NULL;
    if ((rc_ = check_tensor(f, name, dtype, ndim, shape, &x, err))) return rc_;
    size_t es = mg_st_dtype_size(x->dtype);
    if (((uintptr_t)x->data) % es != 0)
        return mg_fail(err, MG_ERR_FORMAT,
                       "tensor '%s': data not aligned to %zu bytes; use mg_st_copy", name, es);
    if (data) *data = x->data;
    return 0;
}

mg_status mg_st_copy(const mg_st_file *f, const char *name, mg_st_dtype dtype, int ndim,
                     const int64_t *shape, void *dst, size_t dst_bytes, mg_error *err) {
    mg_status rc_;
    const mg_st_tensor *x;
    if ((rc_ = check_tensor(f, name, dtype, ndim, shape, &x, err))) return rc_;
    if (dst_bytes != x->nbytes || (!dst && x->nbytes))
        return mg_fail(err, MG_ERR_FORMAT, "tensor '%s': %zu bytes, destination has %zu", name,
                       x->nbytes, dst_bytes);
    if (x->nbytes) memcpy(dst, x->data, x->nbytes);
    return 0;
}

const char *mg_st_meta(const mg_st_file *f, const char *key) {
    if (!f || !key) return NULL;
    for (size_t i = 0; i < f->nmeta; i++)
        if (strcmp(f->mkey[i], key) == 0) return f->mval[i];
    return NULL;
}

int mg_st_checksummed(const mg_st_file *f) { return f ? f->checksummed : 0; }

int mg_st_remove_stale_temps(const char *path) {
    if (!path || !*path) return 0;
    const char *slash = strrchr(path, '/');
    char dir[4096];
    const char *base = slash ? slash + 1 : path;
    if (!slash)
        snprintf(dir, sizeof dir, ".");
    else if (snprintf(dir, sizeof dir, "%.*s", slash == path ? 1 : (int)(slash - path), path) >=
             (int)sizeof dir)
        return 0;
    DIR *d = opendir(dir);
    if (!d) return 0;
    const size_t bl = strlen(base);
    int removed = 0;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        const char *n = de->d_name;
        if (strncmp(n, base, bl) != 0 || strncmp(n + bl, ".tmp.", 5) != 0) continue;
        const char *digits = n + bl + 5;
        char *end;
        errno = 0;
        long pid = strtol(digits, &end, 10);
        /* "<pid>" (an older molgen's) or "<pid>.XXXXXX" (mg_temp_create's) */
        const int ok_end = !*end || (*end == '.' && strlen(end) == 7);
        if (!*digits || !ok_end || errno || pid <= 0 || pid == (long)getpid()) continue;
        /* a writer that is still alive (or whose liveness we cannot tell) keeps its file */
        if (kill((pid_t)pid, 0) == 0 || errno != ESRCH) continue;
        char full[8192];
        struct stat st;
        /* only a regular file (what molgen writes); a link or anything else stays */
        if (snprintf(full, sizeof full, "%s/%s", dir, n) < (int)sizeof full &&
            lstat(full, &st) == 0 && S_ISREG(st.st_mode) && unlink(full) == 0)
            removed++;
    }
    closedir(d);
    return removed;
}

size_t mg_st_meta_count(const mg_st_file *f) { return f ? f->nmeta : 0; }

int mg_st_meta_at(const mg_st_file *f, size_t i, const char **key, const char **value) {
    if (!f || i >= f->nmeta) return -1;
    if (key) *key = f->mkey[i];
    if (value) *value = f->mval[i];
    return 0;
}
