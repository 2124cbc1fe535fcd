/* attn_matmul (attn.h, "dense products"): the public product, checked,
 * then gemm.c's attn_sgemm. Kept out of gemm.c, which only computes: the
 * checks need status.c's attn_fail. */
#include "internal.h"

#include <limits.h>

/* Every size and leading dimension must fit OpenBLAS's blasint (Debian's:
 * int), for gemm.c's fallback; then no operand's extent (rows - 1) * ld + cols can overflow int64. */
static attn_status operand_check(const char *name, int64_t rows, int64_t cols, int64_t ld,
                                 attn_error *err) {
    if (ld < cols)
        return attn_fail(err, ATTN_ERR_SHAPE,
                         "matmul: %s is stored [%lld, %lld] with leading dimension %lld < %lld",
                         name, (long long)rows, (long long)cols, (long long)ld, (long long)cols);
    if (ld > INT_MAX)
        return attn_fail(err, ATTN_ERR_OVERFLOW,
                         "matmul: %s [%lld, %lld] with leading dimension %lld is too large", name,
                         (long long)rows, (long long)cols, (long long)ld);
    return ATTN_OK;
}

attn_status attn_matmul(int trans_a, int trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                        const float *A, int64_t lda, const float *B, int64_t ldb, float beta,
                        float *C, int64_t ldc, int num_threads, attn_error *err) {
    if (!A || !B || !C) return attn_fail(err, ATTN_ERR_NULL, "matmul: A, B and C must be non-NULL");
    if (M < 1 || N < 1 || K < 1)
        return attn_fail(err, ATTN_ERR_SHAPE, "matmul: M %lld, N %lld, K %lld must all be >= 1",
                         (long long)M, (long long)N, (long long)K);
    if (M > INT_MAX || N > INT_MAX || K > INT_MAX)
        return attn_fail(err, ATTN_ERR_OVERFLOW,
                         "matmul: M %lld, N %lld, K %lld: each must be at most %d", (long long)M,
                         (long long)N, (long long)K, INT_MAX);
    if (!isfinite(alpha) || !isfinite(beta))
        return attn_fail(err, ATTN_ERR_ARG, "matmul: alpha %g and beta %g must be finite",
                         (double)alpha, (double)beta);
    if (num_threads < 0 || num_threads > ATTN_MAX_THREADS)
        return attn_fail(err, ATTN_ERR_ARG, "matmul: num_threads must be in [0, %d], got %d",
                         ATTN_MAX_THREADS, num_threads);
    attn_status s;
    if ((s = operand_check("A", trans_a ? K : M, trans_a ? M : K, lda, err)) ||
        (s = operand_check("B", trans_b ? N : K, trans_b ? K : N, ldb, err)) ||
        (s = operand_check("C", M, N, ldc, err)))
        return s;
    attn_sgemm(trans_a != 0, trans_b != 0, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc,
               attn_threads_for(num_threads));
    return attn_ok(err);
}
