/* libFuzzer target: molgen's checkpoint reader (mg_st_parse in
 * molgen/base/safetensors.c: the same validation mg_st_load runs on a file) and
 * its accessors.
 *
 * Input: a safetensors file (8-byte little-endian header size N, N bytes of
 * JSON header, the data buffer). A rejected input must come with a message.
 * For an accepted one, checked against the input bytes themselves:
 *   - the tensors, in file order, tile the data buffer exactly (each one's
 *     bytes are prod(shape) x dtype size and follow the previous one's), and
 *     mg_st_copy returns exactly the input's bytes at that place;
 *   - names are unique and found by mg_st_find; mg_st_get with the tensor's
 *     own dtype and shape succeeds (unless misaligned), with another dtype or
 *     rank fails with a message;
 *   - metadata pairs are found by mg_st_meta; the "vocab" value goes
 *     through mg_vocab_from_json as molgen's loaders do (fuzz_json covers
 *     the JSON parser itself);
 *   - round trip: writing the tensors and metadata again (mg_st_serialize)
 *     and parsing that gives the same tensors, bytes and metadata.
 */
#include "fuzz_util.h"
#include "base/safetensors.h"
#include "chem/tokenizer.h"

static uint64_t le64(const uint8_t *b) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | b[i];
    return v;
}

/* Metadata keys the writer owns (refused as user metadata). */
static int reserved_key(const char *k) {
#ifdef MG_ST_CHECKSUM_KEY
    return strcmp(k, MG_ST_CHECKSUM_KEY) == 0;
#else
    (void)k;
    return 0;
#endif
}

static void check_tensor(const mg_st_file *f, const mg_st_tensor *t, const uint8_t *buf,
                         size_t buflen, size_t at) {
    FZ_CHECK(t->name && strcmp(t->name, "__metadata__") != 0, "bad name");
    size_t es = mg_st_dtype_size(t->dtype);
    FZ_CHECK(es > 0 && mg_st_dtype_name(t->dtype), "dtype %d", (int)t->dtype);
    FZ_CHECK(t->ndim >= 0 && t->ndim <= MG_ST_MAX_DIMS, "ndim %d", t->ndim);
    /* the exact product: 0 if any extent is 0, else checked for overflow */
    uint64_t nb = es;
    int overflow = 0, empty = 0;
    for (int d = 0; d < t->ndim; d++) {
        FZ_CHECK(t->shape[d] >= 0, "shape[%d] = %lld", d, (long long)t->shape[d]);
        empty |= t->shape[d] == 0;
        overflow |= __builtin_mul_overflow(nb, (uint64_t)t->shape[d], &nb);
    }
    if (empty) {
        nb = 0;
        overflow = 0;
    }
    FZ_CHECK(!overflow && nb == t->nbytes, "'%s': %zu bytes, shape says %llu%s", t->name, t->nbytes,
             (unsigned long long)nb, overflow ? " (overflow)" : "");
    FZ_CHECK(at + t->nbytes <= buflen, "'%s' ends past the data buffer", t->name);
    FZ_CHECK(mg_st_find(f, t->name) == t, "'%s' not found or not unique", t->name);

    mg_error err = {0};
    void *copy = malloc(t->nbytes ? t->nbytes : 1);
    FZ_CHECK(copy != NULL, "out of memory");
    mg_status rc = mg_st_copy(f, t->name, t->dtype, t->ndim, t->shape, copy, t->nbytes, &err);
    FZ_CHECK(rc == 0, "mg_st_copy of '%s': %s", t->name, err.message);
    FZ_CHECK(!t->nbytes || !memcmp(copy, buf + at, t->nbytes), "'%s': bytes differ from the input",
             t->name);
    FZ_CHECK(!t->nbytes || !memcmp(t->data, buf + at, t->nbytes), "'%s': data differs", t->name);
    free(copy);

    const void *p = NULL;
    rc = mg_st_get(f, t->name, t->dtype, t->ndim, t->shape, &p, &err);
    FZ_CHECK((rc == 0 && p == t->data) || (rc != 0 && ((uintptr_t)t->data % es) != 0),
             "mg_st_get of '%s': %d %s", t->name, rc, err.message);
    mg_st_dtype other = t->dtype == MG_ST_F32 ? MG_ST_I32 : MG_ST_F32;
    err = (mg_error){0};
    rc = mg_st_get(f, t->name, other, t->ndim, t->shape, &p, &err);
    FZ_CHECK(rc != 0 && p == NULL && fz_err_ok(&err, rc), "other dtype accepted");
    if (t->ndim < MG_ST_MAX_DIMS) {
        int64_t shp[MG_ST_MAX_DIMS] = {0};
        memcpy(shp, t->shape, (size_t)t->ndim * sizeof *shp);
        shp[t->ndim] = 1;
        err = (mg_error){0};
        rc = mg_st_get(f, t->name, t->dtype, t->ndim + 1, shp, &p, &err);
        FZ_CHECK(rc != 0 && fz_err_ok(&err, rc), "rank %d accepted for '%s'", t->ndim + 1, t->name);
    }
}

static void check_meta(const mg_st_file *f) {
    size_t nm = mg_st_meta_count(f);
    for (size_t i = 0; i < nm; i++) {
        const char *k = NULL, *v = NULL;
        FZ_CHECK(mg_st_meta_at(f, i, &k, &v) == 0 && k && v, "meta %zu", i);
        FZ_CHECK(mg_st_meta(f, k) == v, "meta key '%.60s' not unique", k);
        if (!strcmp(k, "vocab")) {
            mg_vocab *voc = NULL;
            mg_error err = {0};
            mg_status rc = mg_vocab_from_json(v, strlen(v), &voc, &err);
            if (rc != MG_OK)
                FZ_CHECK(voc == NULL && fz_err_ok(&err, rc), "vocab rejected without a message");
            mg_vocab_free(voc);
        }
    }
    FZ_CHECK(mg_st_meta_at(f, nm, NULL, NULL) == -1, "meta index %zu past the end", nm);
}

static void check_roundtrip(const mg_st_file *f) {
    size_t nt = mg_st_count(f), nm = mg_st_meta_count(f);
    mg_st_tensor *t = calloc(nt ? nt : 1, sizeof *t);
    mg_st_kv *kv = calloc(nm ? nm : 1, sizeof *kv);
    FZ_CHECK(t && kv, "out of memory");
    int writable = 1;
    for (size_t i = 0; i < nt; i++) {
        t[i] = *mg_st_at(f, i);
        writable &= t[i].name[0] != '\0'; /* the writer refuses empty names */
    }
    size_t m = 0;
    for (size_t i = 0; i < nm; i++) {
        mg_st_meta_at(f, i, &kv[m].key, &kv[m].value);
        if (!reserved_key(kv[m].key)) m++;
    }
    unsigned char *out = NULL;
    size_t outlen = 0;
    mg_error err = {0};
    mg_status rc = mg_st_serialize(t, nt, kv, m, &out, &outlen, &err);
    if (!writable) {
        FZ_CHECK(rc != 0 && fz_err_ok(&err, rc), "empty name written");
    } else {
        FZ_CHECK(rc == 0, "cannot write back what was read: %s", err.message);
        mg_st_file *g = NULL;
        rc = mg_st_parse(out, outlen, &g, &err);
        FZ_CHECK(rc == 0, "cannot read back what was written: %s", err.message);
        FZ_CHECK(mg_st_count(g) == nt, "%zu tensors read back, %zu written", mg_st_count(g), nt);
        for (size_t i = 0; i < nt; i++) {
            const mg_st_tensor *a = &t[i], *b = mg_st_find(g, a->name);
            FZ_CHECK(b && b->dtype == a->dtype && b->ndim == a->ndim && b->nbytes == a->nbytes &&
                         !memcmp(b->shape, a->shape, (size_t)a->ndim * sizeof *a->shape) &&
                         (!a->nbytes || !memcmp(b->data, a->data, a->nbytes)),
                     "tensor '%s' differs after the round trip", a->name);
        }
        for (size_t i = 0; i < m; i++) {
            const char *v = mg_st_meta(g, kv[i].key);
            FZ_CHECK(v && !strcmp(v, kv[i].value), "metadata '%.60s' differs after the round trip",
                     kv[i].key);
        }
        size_t m2 = 0;
        for (size_t i = 0; i < mg_st_meta_count(g); i++) {
            const char *k = NULL;
            mg_st_meta_at(g, i, &k, NULL);
            m2 += !reserved_key(k);
        }
        FZ_CHECK(m2 == m, "%zu metadata entries read back, %zu written", m2, m);
        mg_st_free(g);
    }
    free(out);
    free(t);
    free(kv);
}

size_t LLVMFuzzerMutate(uint8_t *data, size_t size, size_t max_size);

/* Half of the mutations edit the JSON header alone and rewrite the 8-byte
 * size in front of it: a plain byte mutation of the header almost always
 * breaks that size, so without this the parser rarely sees a changed header
 * (measured: coverage and features reached in equal time, README). The other
 * half are libFuzzer's own, which also exercise the size checks. */
size_t LLVMFuzzerCustomMutator(uint8_t *data, size_t size, size_t max_size, unsigned int seed) {
    if (seed % 2 == 0 || size < 8 || le64(data) == 0 || le64(data) > size - 8)
        return LLVMFuzzerMutate(data, size, max_size);
    uint64_t n = le64(data);
    size_t dlen = size - 8 - (size_t)n;
    if (max_size < 8 + dlen + 1) return LLVMFuzzerMutate(data, size, max_size);
    uint8_t *tail = malloc(dlen ? dlen : 1);
    FZ_CHECK(tail != NULL, "out of memory");
    memcpy(tail, data + 8 + n, dlen);
    size_t nh = LLVMFuzzerMutate(data + 8, (size_t)n, max_size - 8 - dlen);
    memcpy(data + 8 + nh, tail, dlen);
    free(tail);
    for (int i = 0; i < 8; i++) data[i] = (uint8_t)((uint64_t)nh >> (8 * i));
    return 8 + nh + dlen;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    mg_st_file *f = NULL;
    mg_error err = {0};
    mg_status rc = mg_st_parse(data, size, &f, &err);
    if (rc != 0) {
        FZ_CHECK(f == NULL && fz_err_ok(&err, rc), "rejected without a message");
        return 0;
    }
    FZ_CHECK(f != NULL && size >= 8, "accepted %zu bytes", size);
    uint64_t n = le64(data);
    FZ_CHECK(n <= size - 8, "header size %llu", (unsigned long long)n);
    const uint8_t *buf = data + 8 + n;
    size_t buflen = size - 8 - (size_t)n;
    size_t nt = mg_st_count(f), at = 0;
    for (size_t i = 0; i < nt; i++) {
        const mg_st_tensor *t = mg_st_at(f, i);
        FZ_CHECK(t != NULL, "tensor %zu missing", i);
        check_tensor(f, t, buf, buflen, at);
        at += t->nbytes;
    }
    FZ_CHECK(at == buflen, "tensors cover %zu of %zu data bytes", at, buflen);
    FZ_CHECK(mg_st_at(f, nt) == NULL, "tensor index past the end");
    FZ_CHECK(mg_st_find(f, "__metadata__") == NULL, "__metadata__ as a tensor");
    check_meta(f);
    check_roundtrip(f);
    mg_st_free(f);
    return 0;
}
