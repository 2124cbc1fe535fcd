/* Dense products for the multi-head layer's projections, through OpenBLAS
 * (Debian libopenblas): its sgemm is the fastest this project measured for
 * these shapes; see README "Dependencies". */
#include "internal.h"

#include <cblas.h>

void attn_sgemm(int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A,
                int64_t lda, const float *B, int64_t ldb, float beta, float *C, int64_t ldc,
                int threads) {
    /* OpenBLAS's thread count is process-wide: set ours, then give the
     * application's back. */
    const int before = openblas_get_num_threads();
    if (before != threads) openblas_set_num_threads(threads);
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
                (blasint)M, (blasint)N, (blasint)K, alpha, A, (blasint)lda, B, (blasint)ldb, beta,
                C, (blasint)ldc);
    if (before != threads) openblas_set_num_threads(before);
}
