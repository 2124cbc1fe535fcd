/* attn_matmul (attn.h, "dense products"):
 *  - C = alpha op(A) op(B) + beta C against a double-precision reference
 *    for every transpose combination, odd shapes (1x1x1 up to several
 *    OpenBLAS blocks), leading dimensions above the row lengths, beta 0
 *    over a C full of NaN (not read) and beta != 0 (accumulate); the
 *    padding columns of C are never written. Bound per element: the fp32
 *    dot-product error gamma_(K+2) (|alpha| sum_k |a b| + |beta c|), with
 *    gamma_n = n u / (1 - n u), u = 2^-24.
 *  - 1, 2 and 3 threads give bitwise the same C, on shapes with rows past
 *    several row steps (and with a row count that is not a multiple).
 *  - bad arguments: each is its attn_status with a message, C untouched. */
#include <float.h>
#include <limits.h>
#include <string.h>

#include "internal.h"
#include "testutil.h"

/* Element (r, c) of a row-major matrix stored with leading dimension ld,
 * read as op(X) when t: X is then stored transposed. */
static double at(const float *X, int64_t ld, int t, int64_t r, int64_t c) {
    return t ? X[c * ld + r] : X[r * ld + c];
}

typedef struct {
    int64_t M, N, K;
    float alpha, beta;
} shape;

static void one_case(const shape *s, int ta, int tb, tu_rng *rng) {
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
    for (int64_t r = 0; r < M; r++) /* padding columns: a sentinel */
        for (int64_t c = N; c < ldc; c++) C0[r * ldc + c] = 12345.0f;
    if (s->beta == 0.0f)
        for (int64_t r = 0; r < M; r++)
            for (int64_t c = 0; c < N; c++) C0[r * ldc + c] = NAN;
    memcpy(C, C0, (size_t)(M * ldc) * sizeof(float));
    attn_error e;
    const attn_status st =
        attn_matmul(ta, tb, M, N, K, s->alpha, A, lda, B, ldb, s->beta, C, ldc, 1, &e);
    CHECK(st == ATTN_OK, "%lldx%lldx%lld ta %d tb %d: %s", (long long)M, (long long)N, (long long)K,
          ta, tb, e.message);
    const double u = ldexp(1.0, -24), gam = (K + 2) * u / (1 - (K + 2) * u);
    int64_t bad = 0, pad = 0;
    double worst = 0;
    for (int64_t r = 0; r < M; r++) {
        for (int64_t c = 0; c < N; c++) {
            double ref = 0, mag = 0;
            for (int64_t k = 0; k < K; k++) {
                const double p = at(A, lda, ta, r, k) * at(B, ldb, tb, k, c);
                ref += p;
                mag += fabs(p);
            }
            const double c0 = s->beta == 0.0f ? 0.0 : (double)C0[r * ldc + c];
            ref = s->alpha * ref + s->beta * c0;
            const double bound = gam * (fabs(s->alpha) * mag + fabs(s->beta * c0)) + 1e-30;
            const double err = fabs((double)C[r * ldc + c] - ref);
            if (!(err <= bound)) bad++;
            if (err / bound > worst) worst = err / bound;
        }
        for (int64_t c = N; c < ldc; c++) pad += C[r * ldc + c] != 12345.0f;
    }
    CHECK(bad == 0,
          "%lldx%lldx%lld ta %d tb %d alpha %g beta %g: %lld elements past the bound "
          "(worst %.2f of it)",
          (long long)M, (long long)N, (long long)K, ta, tb, (double)s->alpha, (double)s->beta,
          (long long)bad, worst);
    CHECK(pad == 0, "%lldx%lldx%lld ta %d tb %d: %lld padding elements of C written", (long long)M,
          (long long)N, (long long)K, ta, tb, (long long)pad);
    free(A), free(B), free(C), free(C0);
}

static void test_reference(void) {
    const shape shapes[] = {
        {1, 1, 1, 1.0f, 0.0f},       {7, 13, 5, 1.0f, 0.0f},    {37, 29, 300, 0.7f, 1.5f},
        {131, 67, 45, -1.25f, 1.0f}, {3, 190, 257, 1.0f, 1.0f}, {65, 1, 17, 2.0f, -0.5f},
    };
    tu_rng rng = tu_seed(24);
    for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++)
        for (int t = 0; t < 4; t++) one_case(&shapes[i], t & 1, t >> 1, &rng);
}

/* Bitwise the same C on 1, 2 and 3 threads. */
static void test_threads(void) {
    const int64_t G = attn_sgemm_row_step();
    printf("test_matmul: measured row step %lld\n", (long long)G);
    const int64_t Ms[2] = {4 * (G ? G : 16) + 7, 5 * (G ? G : 16)};
    tu_rng rng = tu_seed(7);
    for (int im = 0; im < 2; im++)
        for (int t = 0; t < 4; t++) {
            const int ta = t & 1, tb = t >> 1;
            const int64_t M = Ms[im], N = 45, K = 133;
            const int64_t lda = ta ? M : K, ldb = tb ? K : N;
            float *A = tu_malloc((size_t)(M * K) * sizeof(float));
            float *B = tu_malloc((size_t)(K * N) * sizeof(float));
            float *C[3];
            tu_fill(&rng, A, (size_t)(M * K), -1.0f, 1.0f);
            tu_fill(&rng, B, (size_t)(K * N), -1.0f, 1.0f);
            for (int nt = 1; nt <= 3; nt++) {
                C[nt - 1] = tu_malloc((size_t)(M * N) * sizeof(float));
                for (int64_t x = 0; x < M * N; x++) C[nt - 1][x] = (float)(x % 7) - 3.0f;
                CHECK(attn_matmul(ta, tb, M, N, K, 0.9f, A, lda, B, ldb, 1.0f, C[nt - 1], N, nt,
                                  NULL) == ATTN_OK);
            }
            for (int nt = 2; nt <= 3; nt++)
                CHECK(!memcmp(C[0], C[nt - 1], (size_t)(M * N) * sizeof(float)),
                      "M %lld ta %d tb %d: %d threads differ from 1 bitwise", (long long)M, ta, tb,
                      nt);
            free(A), free(B), free(C[0]), free(C[1]), free(C[2]);
        }
}

/* Each bad argument: its status, a message, C untouched. */
static void test_invalid(void) {
    float A[12], B[12], C[12];
    for (int i = 0; i < 12; i++) A[i] = B[i] = 1.0f;
    const float big = 1e30f;
    struct {
        const char *what;
        int ta, tb;
        int64_t M, N, K, lda, ldb, ldc;
        float alpha, beta;
        int nulls; /* 1 A, 2 B, 4 C */
        int threads;
        attn_status want;
    } cases[] = {
        {"A NULL", 0, 0, 2, 2, 2, 2, 2, 2, 1, 0, 1, 1, ATTN_ERR_NULL},
        {"B NULL", 0, 0, 2, 2, 2, 2, 2, 2, 1, 0, 2, 1, ATTN_ERR_NULL},
        {"C NULL", 0, 0, 2, 2, 2, 2, 2, 2, 1, 0, 4, 1, ATTN_ERR_NULL},
        {"M 0", 0, 0, 0, 2, 2, 2, 2, 2, 1, 0, 0, 1, ATTN_ERR_SHAPE},
        {"N -1", 0, 0, 2, -1, 2, 2, 2, 2, 1, 0, 0, 1, ATTN_ERR_SHAPE},
        {"K 0", 0, 0, 2, 2, 0, 2, 2, 2, 1, 0, 0, 1, ATTN_ERR_SHAPE},
        {"lda < K", 0, 0, 2, 2, 3, 2, 2, 2, 1, 0, 0, 1, ATTN_ERR_SHAPE},
        {"lda < M (A transposed)", 1, 0, 3, 2, 2, 2, 2, 2, 1, 0, 0, 1, ATTN_ERR_SHAPE},
        {"ldb < K (B transposed)", 0, 1, 2, 2, 3, 3, 2, 2, 1, 0, 0, 1, ATTN_ERR_SHAPE},
        {"ldc < N", 0, 0, 2, 3, 2, 2, 3, 2, 1, 0, 0, 1, ATTN_ERR_SHAPE},
        {"M > INT_MAX", 0, 0, (int64_t)INT_MAX + 1, 2, 2, 2, 2, 2, 1, 0, 0, 1, ATTN_ERR_OVERFLOW},
        {"ld > INT_MAX", 0, 0, 2, 2, 2, (int64_t)INT_MAX + 1, 2, 2, 1, 0, 0, 1, ATTN_ERR_OVERFLOW},
        {"K > INT_MAX", 0, 0, 2, 2, (int64_t)INT_MAX + 1, 2, 2, 2, 1, 0, 0, 1, ATTN_ERR_OVERFLOW},
        {"alpha NaN", 0, 0, 2, 2, 2, 2, 2, 2, NAN, 0, 0, 1, ATTN_ERR_ARG},
        {"beta inf", 0, 0, 2, 2, 2, 2, 2, 2, 1, big * big, 0, 1, ATTN_ERR_ARG},
        {"threads -1", 0, 0, 2, 2, 2, 2, 2, 2, 1, 0, 0, -1, ATTN_ERR_ARG},
        {"threads > max", 0, 0, 2, 2, 2, 2, 2, 2, 1, 0, 0, ATTN_MAX_THREADS + 1, ATTN_ERR_ARG},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        for (int j = 0; j < 12; j++) C[j] = 7.0f;
        attn_error e;
        memset(&e, 0, sizeof e);
        const attn_status st =
            attn_matmul(cases[i].ta, cases[i].tb, cases[i].M, cases[i].N, cases[i].K,
                        cases[i].alpha, cases[i].nulls & 1 ? NULL : A, cases[i].lda,
                        cases[i].nulls & 2 ? NULL : B, cases[i].ldb, cases[i].beta,
                        cases[i].nulls & 4 ? NULL : C, cases[i].ldc, cases[i].threads, &e);
        CHECK(st == cases[i].want && e.status == st && e.message[0], "%s: got %s (%s), want %s",
              cases[i].what, attn_status_name(st), e.message, attn_status_name(cases[i].want));
        int touched = 0;
        for (int j = 0; j < 12; j++) touched |= C[j] != 7.0f;
        CHECK(!touched, "%s: C written", cases[i].what);
    }
}

int main(void) {
    test_reference();
    test_threads();
    test_invalid();
    return tu_report("test_matmul");
}
