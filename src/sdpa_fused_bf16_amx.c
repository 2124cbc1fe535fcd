/* The bf16 fused kernels with AMX tiles (TDPBF16PS) for the products whose
 * rows are whole 16-row blocks, VDPBF16PS for the rest: sdpa_fused_bf16_avx512.c
 * compiled a second time with ATTN_BF16_AMX (its flags; the tile
 * instructions are asm there, which needs no compiler flag). x86-64 only;
 * isa.c's table picks it only where the CPU has AMX-BF16, the OS enables
 * the tile state and the process holds the permission to use it
 * (attn_enable_amx). */
#define ATTN_BF16_AMX 1
#include "sdpa_fused_bf16_avx512.c"
