/* The bf16 fused kernels' tile sizes and integer helpers, shared by the
 * forward (sdpa_fused_bf16.h) and the backward (sdpa_fused_bf16_bwd.h), so
 * that neither header uses what the other defines. */
#ifndef ATTN_SDPA_FUSED_BF16_TILES_H
#define ATTN_SDPA_FUSED_BF16_TILES_H

#include <stdint.h>

#define BQ 64 /* query rows per block */
#define BK 96 /* keys per tile (6 vectors of 16) */

static inline int64_t bmin(int64_t a, int64_t b) { return a < b ? a : b; }
static inline int64_t bmax(int64_t a, int64_t b) { return a > b ? a : b; }

#endif /* ATTN_SDPA_FUSED_BF16_TILES_H */
