/* The bf16 fused kernels for x86-64 CPUs with AVX2 and no AVX512_BF16
 * (Zen 3; AVX-512 without BF16): sdpa_fused_bf16_portable.c's C compiled
 * with -mavx2 and -ffp-contract=off (CMakeLists.txt), so that the compiler
 * vectorises its conversions and products 8 wide and every result is the
 * portable path's bit for bit. isa.c's avx2 and avx512 rows. */
#if defined(__x86_64__)
#if !defined(__AVX2__)
#error "sdpa_fused_bf16_avx2.c needs -mavx2 (CMakeLists.txt sets it)"
#endif
#define BF16_C_EXPORT attn_fused_bf16_kernels_avx2
#define BF16_C_NAME "avx2"
#include "sdpa_fused_bf16_portable.c"
#else
typedef int attn_fused_bf16_avx2_not_built; /* not x86-64: portable kernels only */
#endif
