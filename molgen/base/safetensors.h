/* molgen safetensors: write / read checkpoint files in the safetensors format
 * (https://github.com/huggingface/safetensors); the header JSON goes through
 * json.h (jansson).
 *
 * File layout: 8-byte little-endian u64 N, then N bytes of UTF-8 JSON
 *   {"name":{"dtype":"F32","shape":[2,3],"data_offsets":[begin,end]}, ...,
 *    "__metadata__":{"key":"value", ...}}
 * padded with spaces so that 8 + N is a multiple of 8, then the byte buffer;
 * offsets are relative to the buffer, which is covered exactly (no holes, no
 * overlaps). Tensor data is little-endian, row-major.
 *
 * Integrity: the writer stores every tensor's CRC-32 (zlib's) in the metadata
 * under MG_ST_CHECKSUM_KEY, as a JSON object {"name": "8 hex digits"} held
 * in a string (so any safetensors reader still opens the file); the reader
 * verifies them when present (a flipped byte is an error naming the tensor)
 * and accepts files without them (mg_st_checksummed says which). The table
 * is the format's own: mg_st_meta and mg_st_meta_at do not list it.
 *
 * Errors: errors.h (MG_ERR_FORMAT for a truncated, corrupt or foreign file,
 * MG_ERR_IO, MG_ERR_NOMEM, MG_ERR_ARG). Nothing aborts, exits or prints; a bad
 * file is an error, never a crash.
 */
#ifndef MG_SAFETENSORS_H
#define MG_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "base/errors.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MG_ST_MAX_DIMS 8
/* The reader refuses headers larger than this (same limit as the reference
 * implementation). */
#define MG_ST_MAX_HEADER (100u * 1024u * 1024u)
/* Metadata key of the checksum table (reserved: mg_st_write refuses it). */
#define MG_ST_CHECKSUM_KEY "crc32"

typedef enum {
    MG_ST_BOOL,
    MG_ST_U8,
    MG_ST_I8,
    MG_ST_F8_E5M2,
    MG_ST_F8_E4M3,
    MG_ST_I16,
    MG_ST_U16,
    MG_ST_F16,
    MG_ST_BF16,
    MG_ST_I32,
    MG_ST_U32,
    MG_ST_F32,
    MG_ST_F64,
    MG_ST_I64,
    MG_ST_U64,
    MG_ST_NUM_DTYPES
} mg_st_dtype;

/* "F32", "I64", ...; NULL for an invalid value. */
const char *mg_st_dtype_name(mg_st_dtype dt);
/* Bytes per element (1, 2, 4 or 8); 0 for an invalid value. */
size_t mg_st_dtype_size(mg_st_dtype dt);
/* Parse a dtype name; returns 0 and sets *dt, or -1. */
int mg_st_dtype_parse(const char *name, mg_st_dtype *dt);

/* A tensor: for writing, fill it in; when reading, the library fills it. */
typedef struct {
    const char *name;
    mg_st_dtype dtype;
    int ndim; /* 0 (scalar) .. MG_ST_MAX_DIMS */
    int64_t shape[MG_ST_MAX_DIMS];
    const void *data; /* prod(shape) * dtype_size bytes */
    size_t nbytes;    /* reading: byte size; writing: ignored */
} mg_st_tensor;

typedef struct {
    const char *key;
    const char *value;
} mg_st_kv;

/* ------------------------------------------------------------ writing */

/* Write tensors t[0..nt) and metadata meta[0..nmeta) (may be 0/NULL) to path,
 * atomically: the file is written to a new temporary beside it,
 * "<path>.tmp.<pid>.XXXXXX" (util.h's mg_temp_create: never an existing
 * name, never through a link), flushed, fsync'ed,
 * renamed over path, and the directory is fsync'ed; on failure the temporary
 * is removed and path is untouched. Names must be non-empty, unique and not
 * "__metadata__"; metadata keys unique. Tensors are laid out by descending
 * element size (stable), so every tensor's data is aligned to its element
 * size in the file and in a buffer loaded at an 8-aligned address. */
mg_status mg_st_write(const char *path, const mg_st_tensor *t, size_t nt, const mg_st_kv *meta,
                      size_t nmeta, mg_error *err);

/* Same, into a malloc'ed memory buffer (*out, *outlen; caller frees). */
mg_status mg_st_serialize(const mg_st_tensor *t, size_t nt, const mg_st_kv *meta, size_t nmeta,
                          unsigned char **out, size_t *outlen, mg_error *err);

/* ------------------------------------------------------------ reading */

typedef struct mg_st_file mg_st_file; /* opaque */

/* Load and validate a whole file: size >= 8; header size N <= file size - 8
 * and <= MG_ST_MAX_HEADER; header is a well-formed JSON object; each entry
 * has a known dtype, a shape of non-negative integers (<= MG_ST_MAX_DIMS),
 * data_offsets [begin, end] with end - begin == prod(shape) * dtype size;
 * offsets cover the buffer exactly without overlap; names unique;
 * __metadata__ (optional) maps strings to strings. */
mg_status mg_st_load(const char *path, mg_st_file **out, mg_error *err);
/* Same from memory (the bytes are copied). */
mg_status mg_st_parse(const void *buf, size_t len, mg_st_file **out, mg_error *err);
void mg_st_free(mg_st_file *f); /* NULL fine */

/* Tensors in file order (by data offset). Pointers are owned by f. */
size_t mg_st_count(const mg_st_file *f);
const mg_st_tensor *mg_st_at(const mg_st_file *f, size_t i);
/* NULL if absent. */
const mg_st_tensor *mg_st_find(const mg_st_file *f, const char *name);

/* Look up name and check it has dtype and shape[0..ndim) exactly; on success
 * *data points at its bytes (owned by f; aligned to the element size for
 * files written by mg_st_write). Errors name the tensor and both shapes /
 * dtypes, e.g. "tensor 'wte': shape [26,128] expected [30,128]". */
mg_status mg_st_get(const mg_st_file *f, const char *name, mg_st_dtype dtype, int ndim,
                    const int64_t *shape, const void **data, mg_error *err);
/* As mg_st_get, but copies the bytes into dst[dst_bytes] (must be exactly the
 * tensor's size): safe for any alignment. */
mg_status mg_st_copy(const mg_st_file *f, const char *name, mg_st_dtype dtype, int ndim,
                     const int64_t *shape, void *dst, size_t dst_bytes, mg_error *err);

/* 1 if the file carried checksums for its tensors (all verified at load), 0
 * for a file written without them (an older molgen, another writer). */
int mg_st_checksummed(const mg_st_file *f);

/* Removes the regular files "<path>.tmp.<pid>" and "<path>.tmp.<pid>.XXXXXX"
 * (mg_st_write's and the CLI's temporaries) whose writer process no longer
 * exists: left by a killed run (links and other kinds are left alone).
 * Returns how many. */
int mg_st_remove_stale_temps(const char *path);

/* Metadata value of key, or NULL. Owned by f. */
const char *mg_st_meta(const mg_st_file *f, const char *key);
size_t mg_st_meta_count(const mg_st_file *f);
/* i-th pair (file order); returns 0, or -1 if i is out of range. */
int mg_st_meta_at(const mg_st_file *f, size_t i, const char **key, const char **value);

#ifdef __cplusplus
}
#endif
#endif /* MG_SAFETENSORS_H */
