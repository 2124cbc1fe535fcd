/* Dense products for the multi-head layer's projections, through OpenBLAS
 * (Debian libopenblas): its sgemm is the fastest this project measured for
 * these shapes; see README "Dependencies". The threading policy is attn.h's
 * "Threads and OpenBLAS": our team splits the rows, OpenBLAS runs on one
 * thread per call, and no per-call setting of OpenBLAS or OpenMP. */
#include "internal.h"

#include <cblas.h>
#include <omp.h>

/* OpenBLAS's pthread build keeps a process-wide thread count and pool: set
 * it to 1 once (called from the library's one-time init). The OpenMP build
 * needs nothing (see attn_sgemm); the sequential build has no threads. */
void attn_blas_init(void) {
    if (openblas_get_parallel() == 1) openblas_set_num_threads(1);
}

/* Rows of C are cut into a fixed set of slices that depends on M only, never
 * on the thread count: NS = M / 32 slices (1 to 16) of ceil(M / NS) rows, one
 * single-threaded sgemm per slice, the slices shared out over the threads.
 * So every element comes from the same call whatever the threads: bitwise
 * the same result for any thread count, by construction (OpenBLAS computes
 * an element with the kernel of its micro-tile, and its tail rows with
 * narrower kernels that sum in another order, so a thread-dependent cut
 * would change bits). 32+ rows per slice keep its kernels efficient; with
 * one thread the slices are NS calls in a row (W repacked per call: ~1 %). */
#define GEMM_MIN_SLICE 32
#define GEMM_MAX_SLICES 16

void attn_sgemm(int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A,
                int64_t lda, const float *B, int64_t ldb, float beta, float *C, int64_t ldc,
                int threads) {
    attn_env_get(); /* the one-time init: OpenBLAS policy applied */
    int64_t ns = M / GEMM_MIN_SLICE;
    ns = ns < 1 ? 1 : ns > GEMM_MAX_SLICES ? GEMM_MAX_SLICES : ns;
    const int64_t rows = (M + ns - 1) / ns;
    ns = (M + rows - 1) / rows;
    if (threads > ns) threads = (int)ns;
#pragma omp parallel num_threads(threads)
    {
        /* This region's own thread-count ICV (it ends with the region): with
         * a team of one the region is inactive, and OpenBLAS's OpenMP build
         * would otherwise start a team of the caller's default size. */
        omp_set_num_threads(1);
        const int nth = omp_get_num_threads(), id = omp_get_thread_num();
        for (int64_t sl = ns * id / nth; sl < ns * (id + 1) / nth; sl++) {
            const int64_t r0 = sl * rows, r1 = r0 + rows < M ? r0 + rows : M;
            cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans,
                        tb ? CblasTrans : CblasNoTrans, (blasint)(r1 - r0), (blasint)N,
                        (blasint)K, alpha, ta ? A + r0 : A + r0 * lda, (blasint)lda, B,
                        (blasint)ldb, beta, C + r0 * ldc, (blasint)ldc);
        }
    }
}
