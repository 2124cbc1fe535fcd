/* molgen: the small helpers every module shares, each defined once here.
 *
 *   mg_splitmix64  SplitMix64 (Steele, Lea & Flood): advances *state by the
 *                  golden-ratio increment and returns the mixed value; the
 *                  seed stream of every molgen RNG (init, split, shuffle,
 *                  sampling streams, the causal guard, the tests' inputs);
 *   mg_mix64       its finalizer alone: a counter-based hash of z (the
 *                  dropout masks and the per-step dropout seeds hash a
 *                  counter instead of advancing a state);
 *   mg_fnv1a       FNV-1a of a byte range (data fingerprints);
 *   mg_now_s       monotonic wall clock in seconds;
 *   mg_crc32       zlib's CRC-32 (checkpoint checksums).
 * The hashes are inline, so the dropout loops that hash every element
 * keep their speed. */
#ifndef MG_UTIL_H
#define MG_UTIL_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

static inline uint64_t mg_mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static inline uint64_t mg_splitmix64(uint64_t *state) {
    return mg_mix64(*state += 0x9E3779B97F4A7C15ull);
}

/* FNV-1a, 64 bit, of n bytes, continuing from h (start: MG_FNV1A_INIT):
 * fingerprints of data, augmentation copies and batches, compared across
 * runs (resume) and ranks. */
#define MG_FNV1A_INIT 0xcbf29ce484222325ull
static inline uint64_t mg_fnv1a(uint64_t h, const void *p, size_t n) {
    const unsigned char *b = (const unsigned char *)p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

double mg_now_s(void);

/* CRC-32 (zlib's, the same as Python's zlib.crc32) of n bytes: the
 * checkpoint tensors' checksums and --init's record of its model. */
uint32_t mg_crc32(const void *p, size_t n);

/* 1 if s[0..n) is valid UTF-8 (no overlong forms, surrogates or code
 * points past U+10FFFF: what JSON, and so jansson, accepts). */
int mg_utf8_valid(const char *s, size_t n);

/* s seconds as "42s", "3m07s", "1h02m"; "?" when negative, NaN or absurd. */
void mg_fmt_duration(double s, char *out, size_t n);

/* A new temporary file beside path, for writing path whole and renaming
 * it over path: "<path>.tmp.<pid>.<6 random letters>", opened
 * O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW (mode 0666 less the umask, as
 * fopen's), so whatever already sits at a name (a planted symbolic link,
 * another writer's file) is never followed, written or reused: another name
 * is drawn (up to 100). Its name in tmp[n] (len(path) + 32 always fits).
 * Returns the descriptor, or -1 with errno (ENAMETOOLONG: n too short). */
int mg_temp_create(const char *path, char *tmp, size_t n);

/* molgen's default thread count: ATTN_NUM_THREADS when set to 1..1024,
 * else every core (omp_get_num_procs), divided among the ranks that mpirun
 * started on this machine (OMPI_COMM_WORLD_LOCAL_SIZE). Read at every call. */
int mg_default_threads(void);
/* Most threads a command may ask for (--threads). */
#define MG_MAX_THREADS 1024

#ifdef __cplusplus
}
#endif
#endif /* MG_UTIL_H */
