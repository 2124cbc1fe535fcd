/* The fused kernels' instruction sets: one table, best first, one row per
 * sdpa_fused_<isa>.c (its kernels) with the CPU test that says whether this
 * CPU runs it. The CPU is tested once; ATTN_FUSED_ISA (read by status.c)
 * lowers the choice to a row below the CPU's best, never raises it.
 *
 * Each row also names the bf16 forward it runs (sdpa_fused_bf16_<isa>.c)
 * and the fp32 GEMM micro-kernel of attn_sgemm (sgemm_<isa>.c).
 *
 * Adding an instruction set: its sdpa_fused_<isa>.c (the vector vocabulary,
 * #include "sdpa_fused_template.h", and its one export, const
 * attn_fused_kernels attn_fused_kernels_<isa> = FUSED_KERNELS("<isa>")), a
 * row here with its CPU test, and its compiler flags in CMakeLists.txt. */
#include "internal.h"
#include "sdpa_bf16.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <cpuid.h>
#endif
#include <pthread.h>
#include <string.h>

/* The CPU tests: GCC/Clang builtins, on x86-64 only (other CPUs run the
 * portable row). Here and not in the kernels' files, which are compiled with
 * the instruction set and may use it in any function. */
#if defined(__x86_64__)
static int cpu_avx512(void) {
#if defined(__GNUC__)
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx2") &&
           __builtin_cpu_supports("fma");
#else
    return 0;
#endif
}
static int cpu_avx2(void) {
#if defined(__GNUC__)
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
    return 0;
#endif
}
/* AVX512_BF16 (VDPBF16PS): CPUID leaf 7 subleaf 1 EAX bit 5, with the OS
 * saving the AVX-512 state (XCR0 bits 1, 2, 5, 6, 7). */
static int cpu_avx512bf16(void) {
#if defined(__GNUC__)
    unsigned a, b, c, d;
    if (!cpu_avx512() || !__get_cpuid_count(7, 1, &a, &b, &c, &d) || !(a & (1u << 5))) return 0;
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return (lo & 0xe6u) == 0xe6u;
#else
    return 0;
#endif
}
extern const attn_fused_kernels attn_fused_kernels_avx512, attn_fused_kernels_avx2;
extern const attn_fused_kernels attn_fused_bf16_kernels_avx512bf16, attn_fused_bf16_kernels_avx2;
extern const attn_sgemm_kernel attn_sgemm_kernel_avx512, attn_sgemm_kernel_avx2;
#endif
static int cpu_any(void) { return 1; }
extern const attn_fused_kernels attn_fused_kernels_portable, attn_fused_bf16_kernels_portable;
extern const attn_sgemm_kernel attn_sgemm_kernel_portable;

/* A row: its ATTN_FUSED_ISA name, the fp32 kernels, the bf16 forward
 * (sdpa_fused_bf16_<isa>.c) and the GEMM micro-kernel (sgemm_<isa>.c) it
 * runs. The avx512bf16 row differs from the
 * avx512 one in its bf16 kernels only; avx512 and avx2 run the C bf16
 * kernels built for AVX2 (the portable bits, 8 wide). */
static const struct {
    const char *name;
    const attn_fused_kernels *kernels, *bf16;
    const attn_sgemm_kernel *sgemm;
    int (*cpu_runs)(void);
} g_isas[] = {
#if defined(__x86_64__)
    {"avx512bf16", &attn_fused_kernels_avx512, &attn_fused_bf16_kernels_avx512bf16,
     &attn_sgemm_kernel_avx512, cpu_avx512bf16},
    {"avx512", &attn_fused_kernels_avx512, &attn_fused_bf16_kernels_avx2,
     &attn_sgemm_kernel_avx512, cpu_avx512},
    {"avx2", &attn_fused_kernels_avx2, &attn_fused_bf16_kernels_avx2,
     &attn_sgemm_kernel_avx2, cpu_avx2},
#endif
    {"portable", &attn_fused_kernels_portable, &attn_fused_bf16_kernels_portable,
     &attn_sgemm_kernel_portable, cpu_any}, /* last: runs anywhere */
};
enum { N_ISAS = sizeof g_isas / sizeof g_isas[0] };

static int g_cpu;           /* the first row the CPU runs */
static unsigned g_features; /* ATTN_CPU_* bits */
static pthread_once_t g_cpu_once = PTHREAD_ONCE_INIT;

static void detect(void) {
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
#endif
    int i = 0;
    while (i + 1 < N_ISAS && !g_isas[i].cpu_runs()) i++;
    g_cpu = i;
#if defined(__x86_64__)
    g_features = (cpu_avx2() ? ATTN_CPU_AVX2_FMA : 0u) | (cpu_avx512() ? ATTN_CPU_AVX512 : 0u) |
                 (cpu_avx512bf16() ? ATTN_CPU_AVX512BF16 : 0u);
#endif
}

static int cpu_row(void) {
    pthread_once(&g_cpu_once, detect);
    return g_cpu;
}

unsigned attn_cpu_features(void) {
    pthread_once(&g_cpu_once, detect);
    return g_features;
}

static int active_row(void) {
    const char *want = attn_env_get()->fused_isa;
    int row = cpu_row();
    for (int i = row + 1; *want && i < N_ISAS; i++)
        if (strcmp(want, g_isas[i].name) == 0) row = i;
    return row;
}

const attn_fused_kernels *attn_fused_kernels_active(void) { return g_isas[active_row()].kernels; }

const attn_sgemm_kernel *attn_sgemm_kernel_active(void) { return g_isas[active_row()].sgemm; }

const attn_fused_kernels *attn_fused_bf16_kernels_active(void) {
    return g_isas[active_row()].bf16;
}

/* Each row the CPU runs (only those: a row's scratch function is compiled
 * with its instruction set). */
int64_t attn_fused_forward_scratch(const attn_problem *pr) {
    int64_t n = 0;
    for (int i = cpu_row(); i < N_ISAS; i++) {
        const int64_t a = g_isas[i].kernels->forward_scratch(pr);
        n = a > n ? a : n;
    }
    return n;
}

const char *attn_test_isa_name(int i) {
    return i >= 0 && i < N_ISAS ? g_isas[i].name : NULL;
}

int attn_test_tanh(int i, int bf16, const float *x, float *y, int64_t n) {
    if (i < cpu_row() || i >= N_ISAS) return 0;
    (bf16 ? g_isas[i].bf16 : g_isas[i].kernels)->tanh_n(x, y, n);
    return 1;
}
