/* The bf16 fused forward with VDPBF16PS (AVX512_BF16: 32 bf16 products per
 * instruction, fp32 accumulation): the per-ISA functions of
 * sdpa_fused_bf16.h. Built with -mavx512f -mavx512bf16 on x86-64 only
 * (CMakeLists.txt); isa.c's table picks it only where the CPU and the OS
 * run AVX512_BF16. */
#include "internal.h"

#if defined(__x86_64__)
#if !defined(__AVX512F__) || !defined(__AVX512BF16__)
#error "sdpa_fused_bf16_avx512.c needs -mavx512f -mavx512bf16 (CMakeLists.txt sets them)"
#endif
#include <immintrin.h>
#include <string.h>

#include "exp_avx512.h"
#include "hsum_avx512.h"
#include "tanh_avx512.h"

#define BMR 4 /* rows per micro-tile */

#if defined(__GNUC__) && !defined(__clang__)
#define BUNROLL _Pragma("GCC unroll 8")
#else
#define BUNROLL
#endif

static inline __m512 dot2(__m512 acc, __m512i a, __m512i b) {
    return _mm512_dpbf16_ps(acc, (__m512bh)a, (__m512bh)b);
}

static inline float row_max(const float *s, int64_t nvec) {
    __m512 m = _mm512_loadu_ps(s);
    for (int64_t v = 1; v < nvec; v++) m = _mm512_max_ps(m, _mm512_loadu_ps(s + 16 * v));
    return _mm512_reduce_max_ps(m);
}

static inline float exp_row(float *s, float c, float m, int64_t nvec) {
    const __m512 cv = _mm512_set1_ps(c), mv = _mm512_set1_ps(m);
    __m512 sum = _mm512_setzero_ps();
    for (int64_t v = 0; v < nvec; v++) {
        const __m512 e = attn_exp_avx512(_mm512_fmsub_ps(_mm512_loadu_ps(s + 16 * v), cv, mv));
        _mm512_storeu_ps(s + 16 * v, e);
        sum = _mm512_add_ps(sum, e);
    }
    return _mm512_reduce_add_ps(sum);
}

/* s[j] = cap·tanh(s[j]/cap) for j < n (attn_tanh_avx512, a few ulp);
 * dcap[j] (optional) = 1 - tanh². */
static inline void softcap_row(float *s, int64_t n, float cap, float *dcap) {
    const __m512 c = _mm512_set1_ps(cap), ic = _mm512_set1_ps(1.0f / cap);
    const __m512 one = _mm512_set1_ps(1.0f);
    for (int64_t j = 0; j < n; j += 16) {
        const __mmask16 k = n - j >= 16 ? (__mmask16)0xffffu : (__mmask16)((1u << (n - j)) - 1u);
        const __m512 t = attn_tanh_avx512(_mm512_mul_ps(_mm512_maskz_loadu_ps(k, s + j), ic));
        _mm512_mask_storeu_ps(s + j, k, _mm512_mul_ps(c, t));
        if (dcap) _mm512_mask_storeu_ps(dcap + j, k, _mm512_fnmadd_ps(t, t, one));
    }
}

static inline __mmask32 mask32(int64_t n) { /* the first min(n, 32) of 32 */
    return n >= 32 ? 0xffffffffu : (__mmask32)((1u << n) - 1u);
}

/* Decode scores of NR rows against the 4 keys k + u·ks4 (u < 4), D a
 * multiple of 32: each (row, key) accumulator as qk_direct forms it (its
 * chain over the 32-element chunks), then the first two levels of their
 * horizontal sums, out[r] (attn_hsum_l12x4 of row r's four keys). */
static inline __attribute__((always_inline)) void qk_quad(const int NR,
                                                          const uint16_t *const *q,
                                                          const uint16_t *k, int64_t ks4,
                                                          int64_t nc, __m512 *out) {
    __m512 acc[4][4];
    for (int r = 0; r < NR; r++)
        for (int u = 0; u < 4; u++) acc[r][u] = _mm512_setzero_ps();
    for (int64_t c = 0; c < nc; c++) {
        __m512i kv[4];
        for (int u = 0; u < 4; u++) kv[u] = _mm512_loadu_si512(k + u * ks4 + 32 * c);
        for (int r = 0; r < NR; r++) {
            const __m512i qv = _mm512_loadu_si512(q[r] + 32 * c);
            for (int u = 0; u < 4; u++) acc[r][u] = dot2(acc[r][u], qv, kv[u]);
        }
    }
    for (int r = 0; r < NR; r++)
        out[r] = attn_hsum_l12x4(acc[r][0], acc[r][1], acc[r][2], acc[r][3]);
}

/* 16 keys at a time (D a multiple of 32): quad c holds keys c, c + 4,
 * c + 8, c + 12, so attn_hsum_l34x4 puts key l in lane l; bitwise the
 * per-key loop's sums (GCC's _mm512_reduce_add_ps tree). Returns the keys
 * done (a multiple of 16). */
static int64_t qk_direct16(int nr, const uint16_t *const *q, const uint16_t *k, int64_t ks,
                           int64_t nk, int64_t D, float *S) {
#if defined(__GNUC__) && !defined(__clang__)
    if (D % 32) return 0;
    int64_t j = 0;
    for (; j + 16 <= nk; j += 16) {
        for (int u = 0; u < 16; u++) /* the next block's rows */
            for (int64_t c = 0; c < D; c += 32)
                _mm_prefetch((const char *)(k + (j + 16 + u) * ks + c), _MM_HINT_T0);
        __m512 l2[4][4];
        for (int c4 = 0; c4 < 4; c4++) {
            const uint16_t *kr = k + (j + c4) * ks;
            switch (nr) {
            case 4: qk_quad(4, q, kr, 4 * ks, D / 32, l2[c4]); break;
            case 3: qk_quad(3, q, kr, 4 * ks, D / 32, l2[c4]); break;
            case 2: qk_quad(2, q, kr, 4 * ks, D / 32, l2[c4]); break;
            default: qk_quad(1, q, kr, 4 * ks, D / 32, l2[c4]); break;
            }
        }
        for (int r = 0; r < nr; r++)
            _mm512_storeu_ps(S + r * 96 + j,
                             attn_hsum_l34x4(l2[0][r], l2[1][r], l2[2][r], l2[3][r]));
    }
    return j;
#else
    (void)nr, (void)q, (void)k, (void)ks, (void)nk, (void)D, (void)S;
    return 0;
#endif
}

/* Decode scores: S[r][j] = q[r]·k[j] for j < nk, 32 products of a row per
 * VDPBF16PS, then a horizontal sum (16 keys at once by qk_direct16). */
static void qk_direct(int nr, const uint16_t *const *q, const uint16_t *k, int64_t ks, int64_t nk,
                      int64_t D, float *S) {
    const int64_t nc = (D + 31) / 32;
    for (int64_t j = qk_direct16(nr, q, k, ks, nk, D, S); j < nk; j++) {
        const uint16_t *kr = k + j * ks;
        _mm_prefetch((const char *)(kr + 16 * ks), _MM_HINT_T0); /* rows ahead */
        _mm_prefetch((const char *)(kr + 16 * ks) + 64, _MM_HINT_T0);
        __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(),
                         _mm512_setzero_ps()};
        for (int64_t c = 0; c < nc; c++) {
            const __mmask32 m = mask32(D - 32 * c);
            const __m512i kv = m == 0xffffffffu ? _mm512_loadu_si512(kr + 32 * c)
                                                : _mm512_maskz_loadu_epi16(m, kr + 32 * c);
            for (int r = 0; r < nr; r++)
                acc[r] = dot2(acc[r], _mm512_maskz_loadu_epi16(m, q[r] + 32 * c), kv);
        }
        for (int r = 0; r < nr; r++) S[r * 96 + j] = _mm512_reduce_add_ps(acc[r]);
    }
    for (int r = 0; r < nr; r++)
        for (int64_t j = nk; j < 96; j++) S[r * 96 + j] = 0.0f;
}

/* Decode P·V for NR rows over columns [d0, d0 + 32 NB): rows 2t and 2t + 1
 * of V interleaved into pairs (VPERMT2W, lo_i / hi_i), then as gp_rows;
 * the accumulators stay in registers and each P pair is broadcast once for
 * the NB blocks of 32 columns. */
static inline __attribute__((always_inline)) void pv_pass(const int NR, const int NB,
                                                          const uint32_t *pd, const uint16_t *v,
                                                          int64_t vs, int64_t nk, int64_t Dv,
                                                          int64_t dvp, float *O, int64_t d0,
                                                          __m512i lo_i, __m512i hi_i) {
    const int64_t nkp = (nk + 1) / 2;
    __m512 acc[4][4];
    __mmask32 m[2];
    int two[2];
    for (int b = 0; b < NB; b++) {
        const int64_t d = d0 + 32 * b;
        m[b] = mask32(Dv - d), two[b] = d + 16 < dvp; /* a second vector of 16 columns */
        for (int r = 0; r < NR; r++) {
            acc[r][2 * b] = _mm512_loadu_ps(O + r * dvp + d);
            acc[r][2 * b + 1] =
                two[b] ? _mm512_loadu_ps(O + r * dvp + d + 16) : _mm512_setzero_ps();
        }
    }
    for (int64_t t = 0; t < nkp; t++) {
        __m512i lo[2], hi[2];
        for (int b = 0; b < NB; b++) {
            const uint16_t *v0 = v + 2 * t * vs + d0 + 32 * b;
            _mm_prefetch((const char *)(v0 + 16 * vs), _MM_HINT_T0);
            _mm_prefetch((const char *)(v0 + 17 * vs), _MM_HINT_T0);
            const __m512i x = _mm512_maskz_loadu_epi16(m[b], v0);
            const __m512i y =
                2 * t + 1 < nk ? _mm512_maskz_loadu_epi16(m[b], v0 + vs) : _mm512_setzero_si512();
            lo[b] = _mm512_permutex2var_epi16(x, lo_i, y);
            hi[b] = _mm512_permutex2var_epi16(x, hi_i, y);
        }
        for (int r = 0; r < NR; r++) {
            const __m512i p = _mm512_set1_epi32((int)pd[r * 48 + t]);
            for (int b = 0; b < NB; b++) {
                acc[r][2 * b] = dot2(acc[r][2 * b], p, lo[b]);
                acc[r][2 * b + 1] = dot2(acc[r][2 * b + 1], p, hi[b]);
            }
        }
    }
    for (int b = 0; b < NB; b++)
        for (int r = 0; r < NR; r++) {
            _mm512_storeu_ps(O + r * dvp + d0 + 32 * b, acc[r][2 * b]);
            if (two[b]) _mm512_storeu_ps(O + r * dvp + d0 + 32 * b + 16, acc[r][2 * b + 1]);
        }
}

#define PV_PASS(NB)                                                                                \
    switch (nr) {                                                                                  \
    case 4: pv_pass(4, NB, pd, v, vs, nk, Dv, dvp, O, d0, lo_i, hi_i); break;                     \
    case 3: pv_pass(3, NB, pd, v, vs, nk, Dv, dvp, O, d0, lo_i, hi_i); break;                     \
    case 2: pv_pass(2, NB, pd, v, vs, nk, Dv, dvp, O, d0, lo_i, hi_i); break;                     \
    default: pv_pass(1, NB, pd, v, vs, nk, Dv, dvp, O, d0, lo_i, hi_i); break;                    \
    }

/* Decode P·V: O[r] += P·V from V's rows for r < nr (<= 4), 64 columns a
 * pass (32 for the last one when fewer are left). */
static void pv_direct(int nr, const uint32_t *pd, const uint16_t *v, int64_t vs, int64_t nk,
                      int64_t Dv, int64_t dvp, float *O) {
    uint16_t il[32], ih[32];
    for (int i = 0; i < 16; i++) {
        il[2 * i] = (uint16_t)i, il[2 * i + 1] = (uint16_t)(32 + i);
        ih[2 * i] = (uint16_t)(16 + i), ih[2 * i + 1] = (uint16_t)(48 + i);
    }
    const __m512i lo_i = _mm512_loadu_si512(il), hi_i = _mm512_loadu_si512(ih);
    for (int64_t d0 = 0; d0 < Dv; d0 += 64) {
        if (Dv - d0 > 32) {
            PV_PASS(2)
        } else {
            PV_PASS(1)
        }
    }
}

/* The backward's products (sdpa_fused_bf16_bwd.h): C[r][16 v + ·] (+)=
 * Σ_t dot2(A[r·ars + t·ats], B[t·ldb + 16 v + ·]) for NR rows, NV vectors. */
static inline __attribute__((always_inline)) void gp_rows(const int NR, const int NV, int zero,
                                                         const uint32_t *A, int64_t ars,
                                                         int64_t ats, int64_t nt,
                                                         const uint32_t *B, int64_t ldb, float *C,
                                                         int64_t ldc, float *rmax) {
    __m512 acc[8][6];
    BUNROLL for (int r = 0; r < NR; r++) BUNROLL for (int v = 0; v < NV; v++) acc[r][v] =
        zero ? _mm512_setzero_ps() : _mm512_loadu_ps(C + r * ldc + 16 * v);
    for (int64_t t = 0; t < nt; t++) {
        __m512i b[6];
        BUNROLL for (int v = 0; v < NV; v++) b[v] = _mm512_loadu_si512(B + t * ldb + 16 * v);
        BUNROLL for (int r = 0; r < NR; r++) {
            const __m512i a = _mm512_set1_epi32((int)A[r * ars + t * ats]);
            BUNROLL for (int v = 0; v < NV; v++) acc[r][v] = dot2(acc[r][v], a, b[v]);
        }
    }
    BUNROLL for (int r = 0; r < NR; r++) BUNROLL for (int v = 0; v < NV; v++)
        _mm512_storeu_ps(C + r * ldc + 16 * v, acc[r][v]);
    if (rmax) /* row_max's order of operands: the same value, NaN included */
        BUNROLL for (int r = 0; r < NR; r++) {
            __m512 m = acc[r][0];
            BUNROLL for (int v = 1; v < NV; v++) m = _mm512_max_ps(m, acc[r][v]);
            rmax[r] = _mm512_reduce_max_ps(m);
        }
}

#define GP_NV(NR)                                                                                  \
    switch (nv) {                                                                                  \
    case 6: gp_rows(NR, 6, zero, a, ars, ats, nt, b, ldb, cc, ldc, rm); break;                     \
    case 5: gp_rows(NR, 5, zero, a, ars, ats, nt, b, ldb, cc, ldc, rm); break;                     \
    case 4: gp_rows(NR, 4, zero, a, ars, ats, nt, b, ldb, cc, ldc, rm); break;                     \
    case 3: gp_rows(NR, 3, zero, a, ars, ats, nt, b, ldb, cc, ldc, rm); break;                     \
    case 2: gp_rows(NR, 2, zero, a, ars, ats, nt, b, ldb, cc, ldc, rm); break;                     \
    default: gp_rows(NR, 1, zero, a, ars, ats, nt, b, ldb, cc, ldc, rm); break;                    \
    }

#define GP_NV2(NR)                                                                                 \
    if (nv == 2)                                                                                   \
        gp_rows(NR, 2, zero, a, ars, ats, nt, b, ldb, cc, ldc, rm);                                \
    else                                                                                           \
        gp_rows(NR, 1, zero, a, ars, ats, nt, b, ldb, cc, ldc, rm);

/* C[nr][16 nvec] (+)= A·B over nt pairs: vectors in groups of at most 6,
 * as even as possible; rows by 8 when a group has at most 2 vectors (the
 * backward's dQ, dK, dV at head size 32), else by 4. Each element's sum
 * runs over t in order whatever the grouping. */
static void gemm_pairs_max_v(int64_t nr, int64_t nvec, int zero, const uint32_t *A,
                             int64_t ars, int64_t ats, int64_t nt, const uint32_t *B, int64_t ldb,
                             float *C, int64_t ldc, float *rmax) {
    if (nvec <= 0) return;
    const int64_t ng = (nvec + 5) / 6, per = (nvec + ng - 1) / ng, step = per <= 2 ? 8 : 4;
    for (int64_t v0 = 0; v0 < nvec; v0 += per) {
        const int nv = (int)(per < nvec - v0 ? per : nvec - v0);
        for (int64_t r = 0; r < nr; r += step) {
            const uint32_t *a = A + r * ars, *b = B + 16 * v0;
            float *cc = C + r * ldc + 16 * v0, *rm = rmax ? rmax + r : NULL;
            switch (nr - r < step ? nr - r : step) {
            case 8: GP_NV2(8) break;
            case 7: GP_NV2(7) break;
            case 6: GP_NV2(6) break;
            case 5: GP_NV2(5) break;
            case 4: GP_NV(4) break;
            case 3: GP_NV(3) break;
            case 2: GP_NV(2) break;
            default: GP_NV(1) break;
            }
        }
    }
}

#if defined(ATTN_BF16_AMX)
/* AMX (sdpa_fused_bf16_amx.c): TDPBF16PS multiplies a tile of 16 rows x 16
 * pairs of bf16 (A) by one of 16 pairs x 16 columns (B, pairs along the
 * sum: the packed K and V tiles' layout) into 16 x 16 fp32 (C), 16 times
 * VDPBF16PS's work per instruction (common/amx_tiles.h: the one
 * configuration, loaded by each thread of a parallel region, and the
 * instructions). Whole 16-row blocks and whole 16-pair chunks of the
 * sum go through the tiles; rows and pairs left over through the vector
 * code (onto the tiles' sums), so any shape is exact to the same bound.
 * A's rows need their pairs contiguous: a transposed A (the backward's
 * dV = Pᵀ·dO and dK = dSᵀ·Q) is transposed into rows first. */
#define BF16_TILES 1
#include "amx_tiles.h"

static void bf16_tiles_enter(amx_tile_config *saved) { amx_tiles_enter(saved); }
static void bf16_tiles_leave(const amx_tile_config *saved) { amx_tiles_leave(saved); }

/* C[16][16 nv] (zero: =, else +=) of one 16-row block over nc chunks of 16
 * pairs: A rows ars words apart, B rows ldb words apart, C rows ldc floats
 * apart. Up to 4 accumulator tiles (0-3), A in tile 4, B in 5-7. */
#define TILE_C(i)                                                                                  \
    if ((i) < nv) {                                                                                \
        if (zero)                                                                                  \
            AMX_ZERO(i);                                                                           \
        else                                                                                       \
            AMX_LOAD(i, C + 16 * (i), ldc * 4);                                                    \
    }
#define TILE_DP(i, tb)                                                                             \
    if ((i) < nv) {                                                                                \
        AMX_LOAD(tb, b + 16 * (i), ldb * 4);                                                       \
        AMX_DP(i, 4, tb);                                                                          \
    }
#define TILE_ST(i)                                                                                 \
    if ((i) < nv) AMX_STORE(i, C + 16 * (i), ldc * 4);

static void amx_block(int nv, int zero, const uint32_t *A, int64_t ars, int64_t nc,
                      const uint32_t *B, int64_t ldb, float *C, int64_t ldc) {
    TILE_C(0) TILE_C(1) TILE_C(2) TILE_C(3)
    for (int64_t k = 0; k < nc; k++) {
        const uint32_t *b = B + 16 * k * ldb;
        AMX_LOAD(4, A + 16 * k, ars * 4);
        TILE_DP(0, 5) TILE_DP(1, 6) TILE_DP(2, 7) TILE_DP(3, 5)
    }
    TILE_ST(0) TILE_ST(1) TILE_ST(2) TILE_ST(3)
}

static void transpose_words(const uint16_t *const *rows, int64_t n, int64_t nw, uint32_t *dst,
                            int64_t ld);

static void gemm_pairs_max(int64_t nr, int64_t nvec, int zero, const uint32_t *A, int64_t ars,
                           int64_t ats, int64_t nt, const uint32_t *B, int64_t ldb, float *C,
                           int64_t ldc, float *rmax) {
    const int64_t nr16 = nr / 16 * 16, nt16 = nt / 16 * 16;
    if (nr16 == 0 || nt16 == 0 || nvec <= 0 || (ats != 1 && (ars != 1 || nr > 96 || nt > 64))) {
        gemm_pairs_max_v(nr, nvec, zero, A, ars, ats, nt, B, ldb, C, ldc, rmax);
        return;
    }
    if (ats != 1) { /* A transposed (the backward's Pᵀ and dSᵀ, <= 96 x 64 words): rows made */
        uint32_t at[96 * 64];
        const uint16_t *rows[64];
        for (int64_t t = 0; t < nt; t++) rows[t] = (const uint16_t *)(const void *)(A + t * ats);
        transpose_words(rows, nt, nr, at, nt); /* at[r·nt + t] = A[r + t·ats] */
        gemm_pairs_max(nr, nvec, zero, at, nt, 1, nt, B, ldb, C, ldc, rmax);
        return;
    }
    for (int64_t r = 0; r < nr16; r += 16)
        for (int64_t v = 0; v < nvec; v += 4)
            amx_block((int)(nvec - v < 4 ? nvec - v : 4), zero, A + r * ars, ars, nt16 / 16,
                      B + 16 * v, ldb, C + r * ldc + 16 * v, ldc);
    if (nt16 < nt) /* the last pairs onto the tiles' sums */
        gemm_pairs_max_v(nr16, nvec, 0, A + nt16, ars, 1, nt - nt16, B + nt16 * ldb, ldb, C, ldc,
                         NULL);
    if (rmax)
        for (int64_t r = 0; r < nr16; r++) rmax[r] = row_max(C + r * ldc, nvec);
    if (nr16 < nr)
        gemm_pairs_max_v(nr - nr16, nvec, zero, A + nr16 * ars, ars, 1, nt, B, ldb, C + nr16 * ldc,
                         ldc, rmax ? rmax + nr16 : NULL);
}

#else
static void gemm_pairs_max(int64_t nr, int64_t nvec, int zero, const uint32_t *A, int64_t ars,
                           int64_t ats, int64_t nt, const uint32_t *B, int64_t ldb, float *C,
                           int64_t ldc, float *rmax) {
    gemm_pairs_max_v(nr, nvec, zero, A, ars, ats, nt, B, ldb, C, ldc, rmax);
}
#endif

/* O[r] += P·V for rows r < nr: the product of P's pairs (rows 48 words
 * apart) and V's packed tile, accumulated onto O. */
static void pv_tile(int nr, const uint32_t *pd, int64_t nkp, const uint32_t *vp, int64_t dvp,
                    float *O) {
    gemm_pairs_max(nr, dvp / 16, 0, pd, 48, 1, nkp, vp, dvp, O, dvp, NULL);
}

static void gemm_pairs(int64_t nr, int64_t nvec, int zero, const uint32_t *A, int64_t ars,
                       int64_t ats, int64_t nt, const uint32_t *B, int64_t ldb, float *C,
                       int64_t ldc) {
    gemm_pairs_max(nr, nvec, zero, A, ars, ats, nt, B, ldb, C, ldc, NULL);
}

/* The forward's S = Q·Kᵀ of a tile (nvec <= 6: one group of vectors) and
 * each row's row_max in rmax[r], taken from the registers. */
static void qk_tile(int64_t nr, int64_t nvec, const uint32_t *qd, int64_t np, const uint32_t *kp,
                    float *S, float *rmax) {
    gemm_pairs_max(nr, nvec, 1, qd, np, 1, np, kp, 96, S, 96, rmax);
}

/* dst[j] = bf16(x0[j]) | bf16(x1[j]) << 16, j < 16 nvec (x1 NULL: 0). */
static void pair_rows(const float *x0, const float *x1, int64_t nvec, uint32_t *dst) {
    uint16_t ix[32];
    for (int i = 0; i < 16; i++) ix[2 * i] = (uint16_t)i, ix[2 * i + 1] = (uint16_t)(16 + i);
    const __m512i il = _mm512_loadu_si512(ix);
    for (int64_t v = 0; v < nvec; v++) {
        const __m256i a = (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(x0 + 16 * v));
        const __m256i b =
            x1 ? (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(x1 + 16 * v)) : _mm256_setzero_si256();
        const __m512i ab = _mm512_inserti64x4(_mm512_castsi256_si512(a), b, 1);
        _mm512_storeu_si512(dst + 16 * v, _mm512_permutexvar_epi16(il, ab));
    }
}

/* pd[t] = bf16(s[2t]) | bf16(s[2t + 1]) << 16, t < 8 nvec. */
static void round_pairs(const float *s, int64_t nvec, uint32_t *pd) {
    int64_t v = 0;
    for (; v + 1 < nvec; v += 2) {
        const __m512bh h = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(s + 16 * v + 16),
                                                _mm512_loadu_ps(s + 16 * v));
        _mm512_storeu_si512(pd + 8 * v, (__m512i)h);
    }
    if (v < nvec)
        _mm256_storeu_si256((__m256i *)(void *)(pd + 8 * v),
                            (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(s + 16 * v)));
}

/* exp_row and round_pairs in one pass (the forward's row without dropout):
 * the same sum in the same order, P rounded from the registers, s not
 * written back. */
static inline float exp_round_row(float *s, float c, float m, int64_t nvec, uint32_t *pd) {
    const __m512 cv = _mm512_set1_ps(c), mv = _mm512_set1_ps(m);
    __m512 sum = _mm512_setzero_ps();
    int64_t v = 0;
    for (; v + 1 < nvec; v += 2) {
        const __m512 e0 = attn_exp_avx512(_mm512_fmsub_ps(_mm512_loadu_ps(s + 16 * v), cv, mv));
        const __m512 e1 =
            attn_exp_avx512(_mm512_fmsub_ps(_mm512_loadu_ps(s + 16 * v + 16), cv, mv));
        sum = _mm512_add_ps(_mm512_add_ps(sum, e0), e1);
        _mm512_storeu_si512(pd + 8 * v, (__m512i)_mm512_cvtne2ps_pbh(e1, e0));
    }
    if (v < nvec) {
        const __m512 e = attn_exp_avx512(_mm512_fmsub_ps(_mm512_loadu_ps(s + 16 * v), cv, mv));
        sum = _mm512_add_ps(sum, e);
        _mm256_storeu_si256((__m256i *)(void *)(pd + 8 * v), (__m256i)_mm512_cvtneps_pbh(e));
    }
    return _mm512_reduce_add_ps(sum);
}

/* One row of the backward: s = P = exp(s·c - lse) (one FMA), dp = dS = P (dp - D). */
static void bw_row(float *s, float *dp, int64_t nvec, float c, float lse, float D) {
    const __m512 cv = _mm512_set1_ps(c), lv = _mm512_set1_ps(lse), dv = _mm512_set1_ps(D);
    for (int64_t v = 0; v < nvec; v++) {
        const __m512 p = attn_exp_avx512(_mm512_fmsub_ps(_mm512_loadu_ps(s + 16 * v), cv, lv));
        _mm512_storeu_ps(s + 16 * v, p);
        _mm512_storeu_ps(dp + 16 * v,
                         _mm512_mul_ps(p, _mm512_sub_ps(_mm512_loadu_ps(dp + 16 * v), dv)));
    }
}

/* dst[p·ld + j] = word p of rows[j] (a pair of bf16, low half the even
 * element; rows[j] NULL: 0) for j < n, p < nw: 16 x 16 word transposes
 * (the packed K and V tiles: pairs along d, keys as columns). */
static void transpose_words(const uint16_t *const *rows, int64_t n, int64_t nw, uint32_t *dst,
                            int64_t ld) {
    for (int64_t j0 = 0; j0 < n; j0 += 16) {
        const int64_t nj = n - j0 < 16 ? n - j0 : 16;
        for (int64_t p0 = 0; p0 < nw; p0 += 16) {
            const int64_t np = nw - p0 < 16 ? nw - p0 : 16;
            const __mmask16 mp = (__mmask16)((1u << np) - 1u);
            __m512i x[16];
            for (int j = 0; j < 16; j++)
                x[j] = j < nj && rows[j0 + j]
                           ? _mm512_maskz_loadu_epi32(mp, rows[j0 + j] + 2 * p0)
                           : _mm512_setzero_si512();
            __m512i t[16], u[16]; /* x[j] lane p -> x[p] lane j */
            for (int i = 0; i < 8; i++) {
                t[2 * i] = _mm512_unpacklo_epi32(x[2 * i], x[2 * i + 1]);
                t[2 * i + 1] = _mm512_unpackhi_epi32(x[2 * i], x[2 * i + 1]);
            }
            for (int i = 0; i < 4; i++) {
                u[4 * i] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
                u[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
                u[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
                u[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
            }
            for (int i = 0; i < 4; i++) {
                const __m512i v0 = _mm512_shuffle_i32x4(u[i], u[4 + i], 0x44);
                const __m512i v1 = _mm512_shuffle_i32x4(u[i], u[4 + i], 0xee);
                const __m512i w0 = _mm512_shuffle_i32x4(u[8 + i], u[12 + i], 0x44);
                const __m512i w1 = _mm512_shuffle_i32x4(u[8 + i], u[12 + i], 0xee);
                x[i] = _mm512_shuffle_i32x4(v0, w0, 0x88);
                x[4 + i] = _mm512_shuffle_i32x4(v0, w0, 0xdd);
                x[8 + i] = _mm512_shuffle_i32x4(v1, w1, 0x88);
                x[12 + i] = _mm512_shuffle_i32x4(v1, w1, 0xdd);
            }
            const __mmask16 mj = (__mmask16)((1u << nj) - 1u);
            for (int64_t q = 0; q < np; q++)
                _mm512_mask_storeu_epi32(dst + (p0 + q) * ld + j0, mj, x[q]);
        }
    }
}

#include "sdpa_fused_bf16.h"

#if defined(ATTN_BF16_AMX)
const attn_fused_kernels attn_fused_bf16_kernels_amx = FUSED_BF16_KERNELS("amx");
#else
const attn_fused_kernels attn_fused_bf16_kernels_avx512bf16 = FUSED_BF16_KERNELS("avx512bf16");
#endif

#else
typedef int attn_fused_bf16_avx512_not_built; /* not x86-64: portable kernels only */
#endif
