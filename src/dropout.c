/* Counter-based dropout randomness: Philox-4x32-10 (Salmon et al., SC'11).
 * Each (b, h, i, j/4) gets its own counter, so the keep/drop decision of an
 * attention element never depends on threads, tiling or visiting order, and
 * the backward regenerates the forward's mask instead of storing it. */
#include "internal.h"

/* One splitmix64 step: a bijection of 64-bit words with strong mixing. */
static uint64_t splitmix64(uint64_t z) {
    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* key = splitmix64(splitmix64(seed) ^ offset): for one seed, distinct
 * offsets give distinct keys (both steps are bijections), and no linear
 * relation between (seed, offset) pairs makes two of them collide. */
uint64_t attn_dropout_key(uint64_t seed, uint64_t offset) {
    return splitmix64(splitmix64(seed) ^ offset);
}

void attn_philox_block(uint64_t key, int64_t b, int64_t h, int64_t i, int64_t c, uint32_t out[4]) {
    uint32_t c0 = (uint32_t)c, c1 = (uint32_t)i, c2 = (uint32_t)h, c3 = (uint32_t)b;
    uint32_t k0 = (uint32_t)key, k1 = (uint32_t)(key >> 32);
    for (int r = 0; r < 10; r++) {
        uint64_t p0 = (uint64_t)0xD2511F53u * c0;
        uint64_t p1 = (uint64_t)0xCD9E8D57u * c2;
        uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0;
        uint32_t n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1;
        c1 = (uint32_t)p1;
        c3 = (uint32_t)p0;
        c0 = n0;
        c2 = n2;
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
    }
    out[0] = c0;
    out[1] = c1;
    out[2] = c2;
    out[3] = c3;
}

/* attn_philox_block of PHILOX_LANES consecutive counters c + l at once,
 * word u of counter l in out[u][l]: the same rounds lane by lane, which the
 * compiler turns into vector multiplies (one block at a time, a call per 4
 * mask elements, was a tenth of a MolGPT training step). Cloned for
 * AVX-512, AVX2 and the baseline, picked at load time; elsewhere one
 * version. */
#define PHILOX_LANES 16
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
__attribute__((target_clones("avx512f", "avx2", "default")))
#endif
static void philox_lanes(uint64_t key, int64_t b, int64_t h, int64_t i, int64_t c,
                         uint32_t out[4][PHILOX_LANES]) {
    uint32_t c0[PHILOX_LANES], c1[PHILOX_LANES], c2[PHILOX_LANES], c3[PHILOX_LANES];
    for (int l = 0; l < PHILOX_LANES; l++) {
        c0[l] = (uint32_t)c + (uint32_t)l;
        c1[l] = (uint32_t)i;
        c2[l] = (uint32_t)h;
        c3[l] = (uint32_t)b;
    }
    uint32_t k0 = (uint32_t)key, k1 = (uint32_t)(key >> 32);
    for (int r = 0; r < 10; r++) {
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC unroll 1 /* kept a loop, for the vectoriser (not 16 scalar copies) */
#endif
        for (int l = 0; l < PHILOX_LANES; l++) {
            const uint64_t p0 = (uint64_t)0xD2511F53u * c0[l], p1 = (uint64_t)0xCD9E8D57u * c2[l];
            const uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1[l] ^ k0;
            const uint32_t n2 = (uint32_t)(p0 >> 32) ^ c3[l] ^ k1;
            c1[l] = (uint32_t)p1;
            c3[l] = (uint32_t)p0;
            c0[l] = n0;
            c2[l] = n2;
        }
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
    }
    for (int l = 0; l < PHILOX_LANES; l++) {
        out[0][l] = c0[l];
        out[1][l] = c1[l];
        out[2][l] = c2[l];
        out[3][l] = c3[l];
    }
}

attn_status attn_dropout_mask(const attn_sdpa_params *p, int64_t n, int64_t cols, const int64_t *b,
                              int64_t h, const int64_t *i, float *mask, attn_error *err) {
    const int64_t two32 = (int64_t)1 << 32;
    if (!p || !b || !i || !mask)
        return attn_fail(err, ATTN_ERR_NULL, "dropout mask: p, b, i and mask must be non-NULL");
    if (n < 1 || cols < 1)
        return attn_fail(err, ATTN_ERR_SHAPE, "dropout mask: %lld rows x %lld columns: need >= 1",
                         (long long)n, (long long)cols);
    if (cols > 4 * two32 || n > INT64_MAX / cols)
        return attn_fail(err, ATTN_ERR_OVERFLOW, "dropout mask: %lld rows x %lld columns",
                         (long long)n, (long long)cols);
    if (!(p->dropout_p >= 0.0f && p->dropout_p < 1.0f))
        return attn_fail(err, ATTN_ERR_ARG, "dropout mask: dropout_p must be in [0, 1), got %g",
                         (double)p->dropout_p);
    if (p->num_threads < 0 || p->num_threads > ATTN_MAX_THREADS)
        return attn_fail(err, ATTN_ERR_ARG, "dropout mask: num_threads must be in [0, %d], got %d",
                         ATTN_MAX_THREADS, p->num_threads);
    if (h < 0 || h >= two32 || p->dropout_row0 < 0 || p->dropout_row0 >= two32)
        return attn_fail(err, ATTN_ERR_ARG,
                         "dropout mask: h %lld and dropout_row0 %lld must be in [0, 2^32)",
                         (long long)h, (long long)p->dropout_row0);
    for (int64_t r = 0; r < n; r++)
        if (b[r] < 0 || b[r] >= two32 - p->dropout_row0 || i[r] < 0 || i[r] >= two32)
            return attn_fail(err, ATTN_ERR_ARG,
                             "dropout mask: row %lld: b %lld (+ dropout_row0 %lld) and i %lld "
                             "must be in [0, 2^32)",
                             (long long)r, (long long)b[r], (long long)p->dropout_row0,
                             (long long)i[r]);
    const int on = p->training && p->dropout_p > 0.0f;
    /* the constants of sdpa_check.c's attn_problem, so the decisions are
     * attention's */
    const double t = ldexp((double)p->dropout_p, 32);
    const uint32_t thr = t >= 4294967295.0 ? UINT32_MAX : (uint32_t)t;
    const float keep = on ? 1.0f / (1.0f - p->dropout_p) : 1.0f;
    const uint64_t key = attn_dropout_key(p->seed, p->offset);
#pragma omp parallel for num_threads(attn_threads_for(p->num_threads)) schedule(static)
    for (int64_t r = 0; r < n; r++) {
        float *row = mask + r * cols;
        if (!on) {
            for (int64_t j = 0; j < cols; j++) row[j] = 1.0f;
            continue;
        }
        uint32_t w[4][PHILOX_LANES];
        for (int64_t j0 = 0; j0 < cols; j0 += 4 * PHILOX_LANES) {
            philox_lanes(key, b[r] + p->dropout_row0, h, i[r], j0 >> 2, w);
            const int64_t nj = cols - j0 < 4 * PHILOX_LANES ? cols - j0 : 4 * PHILOX_LANES;
            for (int64_t j = 0; j < nj; j++) row[j0 + j] = w[j & 3][j >> 2] < thr ? 0.0f : keep;
        }
    }
    return attn_ok(err);
}
