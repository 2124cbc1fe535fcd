/* The fused kernels' instruction sets: one table, best first, one row per
 * sdpa_fused_<isa>.c (its kernels) with the CPU test that says whether this
 * CPU runs it. The CPU is tested once; ATTN_FUSED_ISA (read by status.c)
 * lowers the choice to a row below the CPU's best, never raises it.
 *
 * The amx row also needs the process's permission (attn_enable_amx).
 * Each row also names the bf16 forward it runs (sdpa_fused_bf16_<isa>.c)
 * and the fp32 GEMM micro-kernel of attn_sgemm (sgemm_<isa>.c).
 *
 * Adding an instruction set: its sdpa_fused_<isa>.c (the vector vocabulary,
 * #include "sdpa_fused_template.h", and its one export, const
 * attn_fused_kernels attn_fused_kernels_<isa> = FUSED_KERNELS("<isa>")), a
 * row here with its CPU test, and its compiler flags in CMakeLists.txt. */
#if defined(__linux__) && !defined(_GNU_SOURCE)
#define _GNU_SOURCE /* syscall(): arch_prctl has no libc wrapper */
#endif
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
/* AMX-BF16 and AMX-TILE (CPUID leaf 7 EDX bits 22, 24) with the OS
 * enabling the tile state (XCR0 bits 17, 18): the hardware half of the amx
 * row; the process's permission is the other (amx_permitted). */
static int cpu_amx_hw(void) {
#if defined(__GNUC__)
    unsigned a, b, c, d;
    if (!cpu_avx512bf16() || !__get_cpuid_count(7, 0, &a, &b, &c, &d) ||
        (d & (5u << 22)) != (5u << 22))
        return 0;
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return (lo & (3u << 17)) == (3u << 17);
#else
    return 0;
#endif
}
extern const attn_fused_kernels attn_fused_kernels_avx512, attn_fused_kernels_avx2;
extern const attn_fused_kernels attn_fused_bf16_kernels_amx, attn_fused_bf16_kernels_avx512bf16,
    attn_fused_bf16_kernels_avx2;
extern const attn_sgemm_kernel attn_sgemm_kernel_avx512, attn_sgemm_kernel_avx2;
#endif
static int cpu_any(void) { return 1; }

/* The amx row runs where the hardware has AMX and the process may use its
 * tile data: Linux grants that per process (arch_prctl
 * ARCH_REQ_XCOMP_PERM), irreversibly, with larger signal frames in every
 * thread, so the library never asks on its own; the application asks
 * through attn_enable_amx, or has asked already (itself or through another
 * library), which detect() reads. 1 once permitted: it cannot be revoked. */
#if defined(__x86_64__) && defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#define ARCH_GET_XCOMP_PERM 0x1022
#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18
static int amx_perm_held(void) {
    unsigned long bits = 0;
    return syscall(SYS_arch_prctl, ARCH_GET_XCOMP_PERM, &bits) == 0 &&
           (bits & (1ul << XFEATURE_XTILEDATA));
}
static int amx_perm_request(void) {
    return syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0 &&
           amx_perm_held();
}
#else
static int amx_perm_held(void) { return 0; }
static int amx_perm_request(void) { return 0; }
#endif
static int g_amx_ok; /* atomic: 1 when the amx row may run */
static int amx_permitted(void) { return __atomic_load_n(&g_amx_ok, __ATOMIC_ACQUIRE); }
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
    {"amx", &attn_fused_kernels_avx512, &attn_fused_bf16_kernels_amx, &attn_sgemm_kernel_avx512,
     amx_permitted},
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

/* g_cpu: the first row the CPU runs, the amx row left out (cpu_row adds
 * it once permitted). */
static void detect(void) {
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
#endif
    int i = 0;
#if defined(__x86_64__)
    g_features = (cpu_avx2() ? ATTN_CPU_AVX2_FMA : 0u) | (cpu_avx512() ? ATTN_CPU_AVX512 : 0u) |
                 (cpu_avx512bf16() ? ATTN_CPU_AVX512BF16 : 0u) | (cpu_amx_hw() ? ATTN_CPU_AMX : 0u);
    i = 1; /* past amx */
    if ((g_features & ATTN_CPU_AMX) && amx_perm_held())
        __atomic_store_n(&g_amx_ok, 1, __ATOMIC_RELEASE);
#endif
    while (i + 1 < N_ISAS && !g_isas[i].cpu_runs()) i++;
    g_cpu = i;
}

static int cpu_row(void) {
    pthread_once(&g_cpu_once, detect);
    return amx_permitted() ? 0 : g_cpu;
}

int attn_enable_amx(void) {
    pthread_once(&g_cpu_once, detect);
#if defined(__x86_64__)
    if (!amx_permitted() && (g_features & ATTN_CPU_AMX) && amx_perm_request())
        __atomic_store_n(&g_amx_ok, 1, __ATOMIC_RELEASE);
#endif
    return amx_permitted();
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
