/* molgen safetensors writer: the header, the atomic file write (see
 * safetensors.h). */
#define _POSIX_C_SOURCE 200809L
#include "base/safetensors.h"
#include "base/atomic_file.h"
#include "base/errors.h"
#include "base/json.h"
#include "base/st_internal.h"
#include "base/util.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The inputs mg_st_write documents: names, dtypes, shapes, data, keys. */
static mg_status check_inputs(const mg_st_tensor *t, size_t nt, const mg_st_kv *meta, size_t nmeta,
                              mg_error *err) {
    if (!mg_st_host_le())
        return mg_fail(err, MG_ERR_ARG, "safetensors writer: big-endian hosts are not supported");
    if ((nt > 0 && !t) || (nmeta > 0 && !meta))
        return mg_fail(err, MG_ERR_ARG, "safetensors writer: bad argument");
    for (size_t i = 0; i < nt; i++) {
        const mg_st_tensor *x = &t[i];
        if (!x->name || !x->name[0]) return mg_fail(err, MG_ERR_ARG, "tensor %zu: empty name", i);
        if (strcmp(x->name, "__metadata__") == 0)
            return mg_fail(err, MG_ERR_ARG, "tensor %zu: the name __metadata__ is reserved", i);
        if (!mg_st_dtype_name(x->dtype))
            return mg_fail(err, MG_ERR_ARG, "tensor '%s': invalid dtype %d", x->name,
                           (int)x->dtype);
        if (x->ndim < 0 || x->ndim > MG_ST_MAX_DIMS)
            return mg_fail(err, MG_ERR_ARG, "tensor '%s': ndim %d outside [0, %d]", x->name,
                           x->ndim, MG_ST_MAX_DIMS);
        uint64_t nb;
        if (mg_st_nbytes(x->shape, x->ndim, mg_st_dtype_size(x->dtype), &nb))
            return mg_fail(err, MG_ERR_ARG, "tensor '%s': negative or overflowing shape", x->name);
        if (nb > 0 && !x->data)
            return mg_fail(err, MG_ERR_ARG, "tensor '%s': data is NULL", x->name);
        for (size_t k = 0; k < i; k++)
            if (strcmp(t[k].name, x->name) == 0)
                return mg_fail(err, MG_ERR_ARG, "duplicate tensor name '%s'", x->name);
    }
    for (size_t i = 0; i < nmeta; i++) {
        if (!meta[i].key || !meta[i].value)
            return mg_fail(err, MG_ERR_ARG, "metadata entry %zu: NULL key or value", i);
        if (strcmp(meta[i].key, MG_ST_CHECKSUM_KEY) == 0)
            return mg_fail(err, MG_ERR_ARG, "metadata key '%s' is reserved for the checksums",
                           MG_ST_CHECKSUM_KEY);
        for (size_t k = 0; k < i; k++)
            if (strcmp(meta[k].key, meta[i].key) == 0)
                return mg_fail(err, MG_ERR_ARG, "duplicate metadata key '%s'", meta[i].key);
    }
    return MG_OK;
}

static uint64_t nbytes_of(const mg_st_tensor *x) {
    uint64_t nb = 0;
    mg_st_nbytes(x->shape, x->ndim, mg_st_dtype_size(x->dtype), &nb);
    return nb;
}

/* The header object: __metadata__ (the caller's pairs, then the checksum
 * table: {"name":"8 hex digits", ...} in layout order, held in a string so
 * that any safetensors reader still opens the file), then the tensors in
 * layout order ord[0..nt). NULL when out of memory or a string is not UTF-8
 * (*bad names it). */
static json_t *header_json(const mg_st_tensor *t, size_t nt, const size_t *ord,
                           const mg_st_kv *meta, size_t nmeta, const char **bad) {
    json_t *h = json_object(), *md = json_object(), *cs = json_object();
    int ok = h && md && cs;
    for (size_t k = 0; ok && k < nt; k++) {
        const mg_st_tensor *x = &t[ord[k]];
        char hex[16];
        snprintf(hex, sizeof hex, "%08x", (unsigned)mg_crc32(x->data, (size_t)nbytes_of(x)));
        if (mg_json_put(cs, x->name, json_string(hex))) ok = 0, *bad = x->name;
    }
    for (size_t i = 0; ok && i < nmeta; i++)
        if (mg_json_put(md, meta[i].key, json_string(meta[i].value))) ok = 0, *bad = meta[i].key;
    char *cstext = ok ? mg_json_dump(cs, 17) : NULL;
    ok = ok && cstext && !mg_json_put(md, MG_ST_CHECKSUM_KEY, json_string(cstext)) &&
         !json_object_set(h, "__metadata__", md);
    free(cstext);
    uint64_t off = 0;
    for (size_t k = 0; ok && k < nt; k++) {
        const mg_st_tensor *x = &t[ord[k]];
        const uint64_t nb = nbytes_of(x);
        json_t *e = json_object(), *shape = json_array();
        for (int d = 0; e && shape && d < x->ndim; d++)
            if (json_array_append_new(shape, json_integer(x->shape[d]))) ok = 0;
        ok = ok && e && shape &&
             !mg_json_put(e, "dtype", json_string(mg_st_dtype_name(x->dtype))) &&
             !json_object_set(e, "shape", shape) &&
             !mg_json_put(e, "data_offsets",
                          json_pack("[II]", (json_int_t)off, (json_int_t)(off + nb)));
        json_decref(shape);
        if (ok && mg_json_put(h, x->name, e))
            ok = 0, *bad = x->name;
        else if (!ok)
            json_decref(e);
        off += nb;
    }
    json_decref(md);
    json_decref(cs);
    if (!ok) {
        json_decref(h);
        return NULL;
    }
    return h;
}

/* Validates the inputs, computes the layout order and builds the padded
 * header. On success: *hdr (malloc'ed, *hlen bytes, 8 + hlen multiple of 8),
 * *order (malloc'ed nt indices), *data_len. */
static mg_status build_header(const mg_st_tensor *t, size_t nt, const mg_st_kv *meta, size_t nmeta,
                              char **hdr, size_t *hlen, size_t **order, uint64_t *data_len,
                              mg_error *err) {
    *hdr = NULL;
    *order = NULL;
    mg_status rc = check_inputs(t, nt, meta, nmeta, err);
    if (rc) return rc;
    size_t *ord = malloc((nt ? nt : 1) * sizeof *ord);
    if (!ord) return mg_fail(err, MG_ERR_NOMEM, "out of memory");
    /* stable insertion sort by descending element size */
    for (size_t i = 0; i < nt; i++) {
        size_t j = i;
        while (j > 0 && mg_st_dtype_size(t[ord[j - 1]].dtype) < mg_st_dtype_size(t[i].dtype)) {
            ord[j] = ord[j - 1];
            j--;
        }
        ord[j] = i;
    }
    const char *bad = NULL;
    json_t *h = header_json(t, nt, ord, meta, nmeta, &bad);
    char *text = h ? mg_json_dump(h, 17) : NULL;
    json_decref(h);
    const size_t n = text ? strlen(text) : 0, padded = n + (8 - (8 + n) % 8) % 8;
    char *b = text ? realloc(text, padded + 1) : NULL;
    if (!b) {
        free(text);
        free(ord);
        if (bad) return mg_fail(err, MG_ERR_ARG, "'%.60s' (or its value) is not valid UTF-8", bad);
        return mg_fail(err, MG_ERR_NOMEM, "out of memory");
    }
    memset(b + n, ' ', padded - n);
    b[padded] = '\0';
    uint64_t total = 0;
    for (size_t k = 0; k < nt; k++) total += nbytes_of(&t[k]);
    *hdr = b;
    *hlen = padded;
    *order = ord;
    *data_len = total;
    return MG_OK;
}

static void le64(unsigned char out[8], uint64_t v) {
    for (int i = 0; i < 8; i++) out[i] = (unsigned char)(v >> (8 * i));
}

mg_status mg_st_serialize(const mg_st_tensor *t, size_t nt, const mg_st_kv *meta, size_t nmeta,
                          unsigned char **out, size_t *outlen, mg_error *err) {
    mg_status rc_;
    if (!out || !outlen) return mg_fail(err, MG_ERR_ARG, "mg_st_serialize: bad argument");
    *out = NULL;
    *outlen = 0;
    char *hdr;
    size_t hlen, *ord;
    uint64_t dlen;
    if ((rc_ = build_header(t, nt, meta, nmeta, &hdr, &hlen, &ord, &dlen, err))) return rc_;
    size_t total = 8 + hlen + (size_t)dlen;
    unsigned char *buf = malloc(total ? total : 1);
    if (!buf) {
        free(hdr);
        free(ord);
        return mg_fail(err, MG_ERR_NOMEM, "out of memory (%zu bytes)", total);
    }
    le64(buf, hlen);
    memcpy(buf + 8, hdr, hlen);
    size_t o = 8 + hlen;
    for (size_t k = 0; k < nt; k++) {
        const mg_st_tensor *x = &t[ord[k]];
        uint64_t nb = 0;
        mg_st_nbytes(x->shape, x->ndim, mg_st_dtype_size(x->dtype), &nb);
        if (nb) memcpy(buf + o, x->data, (size_t)nb);
        o += (size_t)nb;
    }
    free(hdr);
    free(ord);
    *out = buf;
    *outlen = total;
    return 0;
}

/* The file's bytes into f: the header's length, the header, the tensors'
 * data in ord's order. 1 when every write succeeded. */
static int write_body(FILE *f, const char *hdr, size_t hlen, const mg_st_tensor *t, size_t nt,
                      const size_t *ord) {
    unsigned char n8[8];
    le64(n8, hlen);
    int ok = fwrite(n8, 1, 8, f) == 8 && fwrite(hdr, 1, hlen, f) == hlen;
    for (size_t k = 0; ok && k < nt; k++) {
        const mg_st_tensor *x = &t[ord[k]];
        uint64_t nb = 0;
        mg_st_nbytes(x->shape, x->ndim, mg_st_dtype_size(x->dtype), &nb);
        if (nb && fwrite(x->data, 1, (size_t)nb, f) != (size_t)nb) ok = 0;
    }
    return ok;
}

mg_status mg_st_write(const char *path, const mg_st_tensor *t, size_t nt, const mg_st_kv *meta,
                      size_t nmeta, mg_error *err) {
    mg_status rc_;
    if (!path || !path[0]) return mg_fail(err, MG_ERR_ARG, "mg_st_write: empty path");
    char *hdr;
    size_t hlen, *ord;
    uint64_t dlen;
    if ((rc_ = build_header(t, nt, meta, nmeta, &hdr, &hlen, &ord, &dlen, err))) return rc_;
    size_t plen = strlen(path);
    char *tmp = malloc(plen + 40);
    if (!tmp) {
        free(hdr);
        free(ord);
        return mg_fail(err, MG_ERR_NOMEM, "out of memory");
    }
    mg_status rc = MG_OK;
    /* a new file beside path, never one that is there (a planted link) */
    const int tfd = mg_temp_create(path, tmp, plen + 40);
    FILE *f = tfd >= 0 ? fdopen(tfd, "wb") : NULL;
    if (!f) {
        const int e = errno;
        if (tfd >= 0) {
            close(tfd);
            remove(tmp);
        }
        rc = mg_fail(err, MG_ERR_IO, "cannot create a temporary for %s: %s", path, strerror(e));
    } else {
        rc = mg_atomic_commit(f, write_body(f, hdr, hlen, t, nt, ord), tmp, path, path, err);
    }
    free(tmp);
    free(hdr);
    free(ord);
    return rc;
}
