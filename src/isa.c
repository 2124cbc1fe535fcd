/* The fused kernels' instruction sets: one table, best first, one row per
 * sdpa_fused_<isa>.c (its kernels) with the CPU test that says whether this
 * CPU runs it. The CPU is tested once; ATTN_FUSED_ISA (read by status.c)
 * lowers the choice to a row below the CPU's best, never raises it.
 *
 * Adding an instruction set: its sdpa_fused_<isa>.c (the vector vocabulary,
 * #include "sdpa_fused_template.h", and its one export, const
 * attn_fused_kernels attn_fused_kernels_<isa> = FUSED_KERNELS("<isa>")), a
 * row here with its CPU test, and its compiler flags in CMakeLists.txt. */
#include "internal.h"

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
extern const attn_fused_kernels attn_fused_kernels_avx512, attn_fused_kernels_avx2;
#endif
static int cpu_any(void) { return 1; }
extern const attn_fused_kernels attn_fused_kernels_portable;

static const struct {
    const attn_fused_kernels *kernels;
    int (*cpu_runs)(void);
} g_isas[] = {
#if defined(__x86_64__)
    {&attn_fused_kernels_avx512, cpu_avx512},
    {&attn_fused_kernels_avx2, cpu_avx2},
#endif
    {&attn_fused_kernels_portable, cpu_any}, /* last: runs anywhere */
};
enum { N_ISAS = sizeof g_isas / sizeof g_isas[0] };

static int g_cpu; /* the first row the CPU runs */
static pthread_once_t g_cpu_once = PTHREAD_ONCE_INIT;

static void detect(void) {
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
#endif
    int i = 0;
    while (i + 1 < N_ISAS && !g_isas[i].cpu_runs()) i++;
    g_cpu = i;
}

static int cpu_row(void) {
    pthread_once(&g_cpu_once, detect);
    return g_cpu;
}

const attn_fused_kernels *attn_fused_kernels_active(void) {
    const char *want = attn_env_get()->fused_isa;
    int row = cpu_row();
    for (int i = row + 1; *want && i < N_ISAS; i++)
        if (strcmp(want, g_isas[i].kernels->name) == 0) row = i;
    return g_isas[row].kernels;
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
    return i >= 0 && i < N_ISAS ? g_isas[i].kernels->name : NULL;
}
