/* attn_sgemm, the packed fp32 GEMM (src/gemm.c), on every row of isa.c's
 * table this CPU runs (ATTN_FUSED_ISA forces the row):
 *  - the row's micro-kernel is the one named by the row (avx512bf16 shares
 *    avx512's);
 *  - C = alpha op(A) op(B) + beta C against a double-precision reference,
 *    every transpose combination, leading dimensions above the row lengths,
 *    shapes of 1 and tails that are not multiples of the micro-tile, with
 *    the kernel's own blocking and with a tiny blocking (attn_test_sgemm_
 *    blocking) that crosses every K, row and column block; beta 0 over a C
 *    of NaN (not read), alpha 0 and K 0 (C = beta C, A and B not read);
 *    padding columns of C never written. Bound per element, from the
 *    arithmetic: each product passes through at most K + 4 roundings (its
 *    multiply when the row has no FMA, the chain of its K block, alpha, the
 *    add into C, the adds of the later K blocks, beta's multiply), so
 *    |c - ref| <= gamma_(K+4) (|alpha| sum_k |a b| + |beta c0|), with
 *    gamma_n = n u / (1 - n u), u = 2^-24;
 *  - 1, 2 and 3 threads give bitwise the same C (both blockings);
 *  - the OpenBLAS fallback (taken when the packing buffers cannot be
 *    allocated; attn_test_sgemm_fallback forces it): the same shapes
 *    against the same bound (it holds for any order of the K products'
 *    sums) and 1, 2, 3 threads bitwise equal;
 *  - a row of C does not depend on the rows around it: each row of a
 *    product equals, bitwise, the same row computed alone (M = 1) and in a
 *    product of a few rows starting elsewhere (what lets molgen batch
 *    molecules without changing any one's result). */
#define _POSIX_C_SOURCE 200809L /* setenv */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "testutil.h"

typedef struct {
    int64_t M, N, K;
    float alpha, beta;
} shape;

static double at(const float *X, int64_t ld, int t, int64_t r, int64_t c) {
    return t ? X[c * ld + r] : X[r * ld + c];
}

/* One product against the fp64 reference; returns the worst |err| / bound. */
static double one_case(const char *row, const shape *s, int ta, int tb, tu_rng *rng) {
    const int64_t M = s->M, N = s->N, K = s->K;
    const int64_t lda = (ta ? M : K) + 3, ldb = (tb ? K : N) + 1, ldc = N + 2;
    const int64_t arows = ta ? K : M, brows = tb ? N : K;
    float *A = tu_malloc((size_t)(arows * lda) * sizeof(float));
    float *B = tu_malloc((size_t)(brows * ldb) * sizeof(float));
    float *C = tu_malloc((size_t)(M * ldc) * sizeof(float));
    float *C0 = tu_malloc((size_t)(M * ldc) * sizeof(float));
    tu_fill(rng, A, (size_t)(arows * lda), -1.0f, 1.0f);
    tu_fill(rng, B, (size_t)(brows * ldb), -1.0f, 1.0f);
    tu_fill(rng, C0, (size_t)(M * ldc), -1.0f, 1.0f);
    if (s->alpha == 0.0f) /* A and B must not be read */
        for (int64_t i = 0; i < arows * lda; i++) A[i] = NAN;
    for (int64_t r = 0; r < M; r++) {
        for (int64_t c = 0; c < N; c++)
            if (s->beta == 0.0f) C0[r * ldc + c] = NAN; /* C must not be read */
        for (int64_t c = N; c < ldc; c++) C0[r * ldc + c] = 12345.0f; /* padding: a sentinel */
    }
    memcpy(C, C0, (size_t)(M * ldc) * sizeof(float));
    attn_sgemm(ta, tb, M, N, K, s->alpha, A, lda, B, ldb, s->beta, C, ldc, 1);
    const double u = ldexp(1.0, -24), gam = (K + 4) * u / (1 - (K + 4) * u);
    double worst = 0;
    int64_t bad = 0, pad = 0;
    for (int64_t r = 0; r < M; r++) {
        for (int64_t c = 0; c < N; c++) {
            double ref = 0, mag = 0;
            for (int64_t k = 0; s->alpha != 0.0f && k < K; k++) {
                const double p = at(A, lda, ta, r, k) * at(B, ldb, tb, k, c);
                ref += p;
                mag += fabs(p);
            }
            const double c0 = s->beta == 0.0f ? 0.0 : (double)C0[r * ldc + c];
            ref = (double)s->alpha * ref + (double)s->beta * c0;
            const double bound = gam * (fabs((double)s->alpha) * mag + fabs((double)s->beta * c0));
            const double err = fabs((double)C[r * ldc + c] - ref);
            if (!(err <= bound)) bad++;
            if (bound > 0 && err / bound > worst) worst = err / bound;
        }
        for (int64_t c = N; c < ldc; c++) pad += C[r * ldc + c] != 12345.0f;
    }
    CHECK(bad == 0 && pad == 0,
          "%s: %lldx%lldx%lld ta %d tb %d alpha %g beta %g: %lld elements past the bound, "
          "%lld padding elements written (worst err/bound %.3g)",
          row, (long long)M, (long long)N, (long long)K, ta, tb, (double)s->alpha,
          (double)s->beta, (long long)bad, (long long)pad, worst);
    free(A), free(B), free(C), free(C0);
    return worst;
}

static const shape g_shapes[] = {
    {1, 1, 1, 1.0f, 0.0f},       {1, 37, 5, 1.0f, 0.0f},       {29, 1, 13, 0.5f, 1.0f},
    {14, 32, 64, 1.0f, 0.0f},    {15, 33, 65, 1.25f, -0.5f},   {6, 16, 7, -1.0f, 1.0f},
    {47, 71, 300, 1.0f, 1.0f},   {200, 100, 33, 0.75f, 0.0f},  {13, 45, 1100, 1.0f, 0.25f},
    {33, 290, 129, 2.0f, 0.0f},  {9, 10, 0, 1.0f, 0.5f},       {9, 10, 11, 0.0f, -2.0f},
    {9, 10, 11, 0.0f, 0.0f},     {90, 1030, 20, 1.0f, 1.0f},
};

/* Bitwise the same C on 1, 2 and 3 threads. */
static void thread_invariance(const char *row, int64_t M, int64_t N, int64_t K, tu_rng *rng) {
    for (int t = 0; t < 4; t++) {
        const int ta = t & 1, tb = t >> 1;
        const int64_t lda = ta ? M : K, ldb = tb ? K : N;
        float *A = tu_malloc((size_t)(M * K) * sizeof(float));
        float *B = tu_malloc((size_t)(K * N) * sizeof(float));
        float *C[3];
        tu_fill(rng, A, (size_t)(M * K), -1.0f, 1.0f);
        tu_fill(rng, B, (size_t)(K * N), -1.0f, 1.0f);
        for (int nt = 1; nt <= 3; nt++) {
            C[nt - 1] = tu_malloc((size_t)(M * N) * sizeof(float));
            for (int64_t x = 0; x < M * N; x++) C[nt - 1][x] = (float)(x % 7) - 3.0f;
            attn_sgemm(ta, tb, M, N, K, 0.9f, A, lda, B, ldb, 1.0f, C[nt - 1], N, nt);
        }
        for (int nt = 2; nt <= 3; nt++)
            CHECK(!memcmp(C[0], C[nt - 1], (size_t)(M * N) * sizeof(float)),
                  "%s: %lldx%lldx%lld ta %d tb %d: %d threads differ from 1 bitwise", row,
                  (long long)M, (long long)N, (long long)K, ta, tb, nt);
        free(A), free(B), free(C[0]), free(C[1]), free(C[2]);
    }
}

/* Each row of C[M x N] alone (M = 1) and inside rows [r0, r0 + 5): bitwise
 * the rows of the whole product. */
static void row_independence(const char *row, int ta, int tb, tu_rng *rng) {
    const int64_t M = 37, N = 70, K = 1100, lda = ta ? M : K, ldb = tb ? K : N;
    float *A = tu_malloc((size_t)(M * K) * sizeof(float));
    float *B = tu_malloc((size_t)(K * N) * sizeof(float));
    float *C = tu_malloc((size_t)(M * N) * sizeof(float));
    float *Cpart = tu_malloc((size_t)(5 * N) * sizeof(float));
    tu_fill(rng, A, (size_t)(M * K), -1.0f, 1.0f);
    tu_fill(rng, B, (size_t)(K * N), -1.0f, 1.0f);
    attn_sgemm(ta, tb, M, N, K, 0.7f, A, lda, B, ldb, 0.0f, C, N, 1);
    int64_t bad = 0;
    for (int64_t r = 0; r < M; r++) {
        attn_sgemm(ta, tb, 1, N, K, 0.7f, ta ? A + r : A + r * lda, lda, B, ldb, 0.0f, Cpart, N, 1);
        bad += memcmp(Cpart, C + r * N, (size_t)N * sizeof(float)) != 0;
    }
    for (int64_t r0 = 0; r0 + 5 <= M; r0 += 4) {
        attn_sgemm(ta, tb, 5, N, K, 0.7f, ta ? A + r0 : A + r0 * lda, lda, B, ldb, 0.0f, Cpart, N,
                   2);
        bad += memcmp(Cpart, C + r0 * N, (size_t)(5 * N) * sizeof(float)) != 0;
    }
    CHECK(bad == 0, "%s: ta %d tb %d: %lld rows (or 5-row groups) differ from the whole product's",
          row, ta, tb, (long long)bad);
    free(A), free(B), free(C), free(Cpart);
}

static void test_row(int i, const char *row) {
    setenv("ATTN_FUSED_ISA", row, 1);
    attn_test_reload_env();
    const attn_sgemm_kernel *kr = attn_sgemm_kernel_active();
    const char *want = strcmp(row, "avx512bf16") == 0 ? "avx512" : row;
    CHECK(strcmp(kr->name, want) == 0, "row %d (%s) runs the %s micro-kernel", i, row, kr->name);
    CHECK(kr->mr * kr->nr <= ATTN_SGEMM_TILE_MAX, "%s: tile %dx%d over ATTN_SGEMM_TILE_MAX", row,
          kr->mr, kr->nr);
    tu_rng rng = tu_seed(37 + (uint64_t)i);
    double worst = 0;
    /* the kernel's blocking, then a tiny one: K blocks of 40, two row
     * panels, three column panels per block */
    for (int tiny = 0; tiny < 2; tiny++) {
        attn_test_sgemm_blocking(tiny ? 40 : 0, tiny ? 2 * kr->mr : 0, tiny ? 3 * kr->nr : 0);
        for (size_t s = 0; s < sizeof g_shapes / sizeof *g_shapes; s++)
            for (int t = 0; t < 4; t++) {
                const double w = one_case(row, &g_shapes[s], t & 1, t >> 1, &rng);
                worst = w > worst ? w : worst;
            }
        thread_invariance(row, 5 * kr->mr + 3, 7 * kr->nr + 5, 133, &rng);
        thread_invariance(row, 3 * kr->mr, 2 * kr->nr, kr->kc + 17, &rng);
    }
    attn_test_sgemm_blocking(0, 0, 0);
    for (int t = 0; t < 4; t++) row_independence(row, t & 1, t >> 1, &rng);
    printf("test_sgemm: %s: micro-tile %dx%d, KC %lld MC %lld NC %lld; worst error %.3g of the "
           "bound\n",
           row, kr->mr, kr->nr, (long long)kr->kc, (long long)kr->mc, (long long)kr->nc, worst);
}

/* The fallback, on the CPU's own row. */
static void test_fallback(void) {
    attn_test_sgemm_fallback(1);
    tu_rng rng = tu_seed(99);
    double worst = 0;
    for (size_t s = 0; s < sizeof g_shapes / sizeof *g_shapes; s++)
        for (int t = 0; t < 4; t++) {
            const double w = one_case("fallback", &g_shapes[s], t & 1, t >> 1, &rng);
            worst = w > worst ? w : worst;
        }
    thread_invariance("fallback", 75, 100, 133, &rng);
    attn_test_sgemm_fallback(0);
    printf("test_sgemm: OpenBLAS fallback: worst error %.3g of the bound\n", worst);
}

int main(void) {
    float x = 0.5f, y;
    for (int i = 0; attn_test_isa_name(i); i++) {
        const char *row = attn_test_isa_name(i);
        if (!attn_test_tanh(i, 0, &x, &y, 1)) { /* the CPU does not run this row */
            printf("test_sgemm: %s: not run (this CPU lacks it)\n", row);
            continue;
        }
        test_row(i, row);
    }
    unsetenv("ATTN_FUSED_ISA");
    attn_test_reload_env();
    test_fallback();
    return tu_report("test_sgemm");
}
