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
