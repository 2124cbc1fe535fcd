/* AMX tiles (x86-64 AMX-TILE and AMX-BF16) for the bf16 products: one tile
 * configuration and the five instructions, header-only, shared by libattn's
 * amx row (src/sdpa_fused_bf16_avx512.c built as sdpa_fused_bf16_amx.c) and
 * molgen's bf16 GEMM (molgen/nn/packed_gemm.c). In common/, a folder of
 * neither: it is the CPU's vocabulary, not either's API.
 *
 * The configuration: palette 1, tiles 0-7 each 16 rows of 64 bytes (16
 * fp32, or 16 pairs of bf16). TDPBF16PS C, A, B: C[16][16] fp32 +=
 * Σ_k A[m][2k]·B[k][2n] + A[m][2k+1]·B[k][2n+1], A 16 rows of 16 bf16 pairs,
 * B 16 rows (pairs along the sum) of 16 columns.
 *
 * asm that declares its memory use: GCC 12's intrinsics declare no memory
 * read for TILELOADD and 8 bytes for LDTILECFG, so stores before them
 * could be moved past them or dropped (a configuration built on the stack
 * lost its column widths: a fault). AT&T operand order: sources first.
 * The assembler knows the instructions; no compiler flag is needed. A
 * thread runs amx_tiles_enter before its first tile instruction and
 * amx_tiles_leave after its last: a caller's own tile configuration is
 * kept (the ABI leaves saving it to whoever changes it; tile data is
 * caller-saved, so not kept), else the thread's tile state goes back to
 * init. */
#ifndef ATTN_AMX_TILES_H
#define ATTN_AMX_TILES_H

#include <stdint.h>

/* A tile configuration (LDTILECFG's 64 bytes); declared on every machine,
 * so that callers can keep one without an #if of their own. */
typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} __attribute__((aligned(64))) amx_tile_config;

#if defined(__x86_64__) && defined(__GNUC__)
#define AMX_LOAD(t, base, stride)                                                                  \
    __asm__ volatile("tileloadd (%0,%1,1), %%tmm" #t ::"r"((const void *)(base)),                \
                     "r"((long)(stride))                                                           \
                     : "memory")
#define AMX_STORE(t, base, stride)                                                                 \
    __asm__ volatile("tilestored %%tmm" #t ", (%0,%1,1)" ::"r"((void *)(base)),                  \
                     "r"((long)(stride))                                                           \
                     : "memory")
#define AMX_ZERO(t) __asm__ volatile("tilezero %%tmm" #t::)
#define AMX_DP(c, a, b) __asm__ volatile("tdpbf16ps %%tmm" #b ", %%tmm" #a ", %%tmm" #c::)

static const amx_tile_config amx_tiles_16x64 = {
    1, 0, {0}, {64, 64, 64, 64, 64, 64, 64, 64}, {16, 16, 16, 16, 16, 16, 16, 16}};

/* The thread's configuration into *saved (64 zero bytes when it has none),
 * then this one. */
static inline void amx_tiles_enter(amx_tile_config *saved) {
    __asm__ volatile("sttilecfg %0" : "=m"(*saved)::"memory");
    __asm__ volatile("ldtilecfg %0" ::"m"(amx_tiles_16x64) : "memory");
}
/* The thread's configuration as it was: *saved loaded again, or the tile
 * state released (back to init) when there was none. */
static inline void amx_tiles_leave(const amx_tile_config *saved) {
    if (saved->palette)
        __asm__ volatile("ldtilecfg %0" ::"m"(*saved) : "memory");
    else
        __asm__ volatile("tilerelease" ::: "memory");
}
#endif

#endif /* ATTN_AMX_TILES_H */
