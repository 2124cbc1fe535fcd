/* Dense products for the multi-head layer's projections, through OpenBLAS
 * (Debian libopenblas): its sgemm is the fastest this project measured for
 * these shapes; see README "Dependencies". The threading policy is attn.h's
 * "Threads and OpenBLAS": our team splits the rows, OpenBLAS runs on one
 * thread per call, and nothing of OpenBLAS or OpenMP is set per call.
 *
 * Bitwise the same result for any thread count: OpenBLAS computes each
 * element of C with the micro-kernel of its tile, tiles counted from the
 * first row of the call in steps of the kernel's unroll, the last rows with
 * narrower kernels that sum in another order. A cut at a multiple of the
 * unroll therefore leaves every element with the kernel it gets unsplit; a
 * cut elsewhere changes bits (measured: OpenBLAS 0.3.21's Haswell kernels
 * cut at multiples of 12 rows). The unroll is not part of OpenBLAS's API, so
 * the one-time init measures it: the smallest row step G whose cuts give
 * bitwise the unsplit result for every transpose the library uses. With one
 * thread, or no such G, a product is one call. */
#include "internal.h"

#include <cblas.h>
#include <omp.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

static int64_t g_rows; /* G: row step of the split; 0: never split */

/* Do cuts at G and 2G give the unsplit C, bitwise, for op(A) [M, K] op(B)
 * [K, N] with M = 2G + 5 and this transpose? */
static int cuts_exact(int64_t G, int ta, int tb, int64_t K, float *mem) {
    const int64_t M = 2 * G + 5, N = 40, lda = ta ? M : K, ldb = tb ? K : N;
    float *A = mem, *B = A + M * K, *C = B + K * N, *Ccut = C + M * N;
    uint64_t s = 0x9E3779B97F4A7C15ull * (uint64_t)(G + 31 * ta + 7 * tb + K);
    for (int64_t i = 0; i < M * K + K * N; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        A[i] = (float)(int32_t)(s >> 32) * (1.0f / 2147483648.0f); /* B follows A */
    }
    const CBLAS_TRANSPOSE oa = ta ? CblasTrans : CblasNoTrans, ob = tb ? CblasTrans : CblasNoTrans;
    cblas_sgemm(CblasRowMajor, oa, ob, (blasint)M, (blasint)N, (blasint)K, 1.0f, A, (blasint)lda, B,
                (blasint)ldb, 0.0f, C, (blasint)N);
    for (int64_t cut = G; cut <= 2 * G; cut += G) {
        const int64_t r[3] = {0, cut, M};
        for (int p = 0; p < 2; p++)
            cblas_sgemm(CblasRowMajor, oa, ob, (blasint)(r[p + 1] - r[p]), (blasint)N, (blasint)K,
                        1.0f, ta ? A + r[p] : A + r[p] * lda, (blasint)lda, B, (blasint)ldb, 0.0f,
                        Ccut + r[p] * N, (blasint)N);
        if (memcmp(C, Ccut, (size_t)(M * N) * sizeof(float)) != 0) return 0;
    }
    return 1;
}

/* Once, at the library's first call (status.c) or first product. OpenBLAS's
 * pthread build keeps a process-wide thread count and pool: set it to 1,
 * once (its OpenMP build needs nothing: see attn_sgemm; the sequential build
 * has no threads). Then measure the row step G (tiny products:
 * microseconds). */
static void blas_init_once(void) {
    if (openblas_get_parallel() == 1) openblas_set_num_threads(1);
    static const int64_t steps[] = {4, 8, 12, 16, 24, 32, 48, 64};
    const int64_t Gmax = 64, Kmax = 300, Mmax = 2 * Gmax + 5;
    float *mem = malloc((size_t)(Mmax * Kmax + Kmax * 40 + 2 * Mmax * 40) * sizeof(float));
    int64_t found = 0;
    /* single-threaded OpenBLAS, as in attn_sgemm: its own threading (above
     * its size threshold) would cut the rows its own way */
#pragma omp parallel num_threads(1)
    {
        omp_set_num_threads(1);
        for (size_t i = 0; mem && i < sizeof steps / sizeof steps[0] && !found; i++) {
            int ok = 1;
            for (int t = 0; t < 3 && ok; t++) /* (A, Bᵀ), (A, B), (Aᵀ, B): the library's three */
                for (int64_t K = 37; K <= Kmax && ok; K += Kmax - 37) /* one K block, and several */
                    ok = cuts_exact(steps[i], t == 2, t == 0, K, mem);
            if (ok) found = steps[i];
        }
    }
    g_rows = found;
    free(mem);
}

static pthread_once_t g_blas_once = PTHREAD_ONCE_INIT;

void attn_blas_init(void) { pthread_once(&g_blas_once, blas_init_once); }

int64_t attn_sgemm_row_step(void) {
    attn_blas_init();
    return g_rows;
}

void attn_sgemm(int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A,
                int64_t lda, const float *B, int64_t ldb, float beta, float *C, int64_t ldc,
                int threads) {
    const int64_t G = attn_sgemm_row_step(); /* (runs the one-time init) */
    const int64_t blocks = G ? (M + G - 1) / G : 1;
    if (threads > blocks) threads = (int)blocks;
#pragma omp parallel num_threads(threads)
    {
        /* This region's own thread-count ICV (it ends with the region): with
         * a team of one the region is inactive, and OpenBLAS's OpenMP build
         * would otherwise start a team of the caller's default size. */
        omp_set_num_threads(1);
        const int nth = omp_get_num_threads(), id = omp_get_thread_num();
        const int64_t r0 = nth == 1 ? 0 : blocks * id / nth * G;
        const int64_t r1 = nth == 1 ? M : (id + 1 == nth ? M : blocks * (id + 1) / nth * G);
        if (r1 > r0)
            cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans,
                        tb ? CblasTrans : CblasNoTrans, (blasint)(r1 - r0), (blasint)N, (blasint)K,
                        alpha, ta ? A + r0 : A + r0 * lda, (blasint)lda, B, (blasint)ldb, beta,
                        C + r0 * ldc, (blasint)ldc);
    }
}
