/* Dense fp32 products, C = alpha op(A) op(B) + beta C (row-major), for
 * attn_matmul and the multi-head layer's projections: BLIS's scheme, own
 * code. op(B) is copied ("packed") in blocks of KC x NC, op(A) in blocks of
 * MC x KC, each into the panels the micro-kernel streams (A: MR rows per
 * panel, B: NR columns, k-major, zero-padded to whole panels); the
 * micro-kernel (sgemm_template.h, one per instruction set: sgemm_<isa>.c)
 * forms one MR x NR tile of C from a panel pair. The kernel and its
 * blocking come from isa.c's table, the row the fused kernels use
 * (ATTN_FUSED_ISA lowers it).
 *
 * Why not OpenBLAS: run where OPENBLAS_CORETYPE=Haswell is set (this
 * project's machines and CI), it uses its AVX2 kernels, half of what a
 * full-width AVX-512 core does; docs/speed.md "fp32 products" has the
 * measurements that chose this code over OpenBLAS, BLIS and oneDNN.
 *
 * Bitwise the same C for any thread count: K is cut into blocks of KC from
 * k = 0 whatever the threads, each element's sum runs through the one
 * micro-kernel (edge tiles too, through a zero-padded copy), and threads
 * only share out whole tiles. OpenBLAS remains as the fallback when the
 * packing buffers cannot be allocated (one single-threaded call; its
 * rounding differs from the packed path's). */
#include "internal.h"

#include <cblas.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

int64_t attn_sgemm_row_step(void) { return attn_sgemm_kernel_active()->mr; }

/* attn_test_sgemm_blocking: KC, MC, NC in place of the kernel's (0: its
 * own), for the blocking candidates of bench/sgemm_candidates.c. */
static int64_t g_block[3];

void attn_test_sgemm_blocking(int64_t kc, int64_t mc, int64_t nc) {
    g_block[0] = kc, g_block[1] = mc, g_block[2] = nc;
}

/* attn_test_sgemm_fallback: nonzero takes the path of a failed packing
 * allocation (OpenBLAS), so that the tests reach it. */
static int g_fallback;

void attn_test_sgemm_fallback(int on) { g_fallback = on; }

static inline int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
/* C = beta C (K = 0 or alpha = 0: A and B are not read; beta = 0 writes
 * zeros without reading C). */
static void scale_c(int64_t M, int64_t N, float beta, float *C, int64_t ldc) {
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < N; j++) C[i * ldc + j] = beta == 0.0f ? 0.0f : beta * C[i * ldc + j];
}

/* One MR x NR tile; a partial one (rows x cols) through a zero-padded copy,
 * so that it gets the same arithmetic as a whole one. */
static void tile(const attn_sgemm_kernel *kr, int64_t kc, const float *Ap, const float *Bp,
                 float *C, int64_t ldc, int64_t rows, int64_t cols, float alpha, float beta,
                 int first) {
    if (rows == kr->mr && cols == kr->nr) {
        kr->ukr(kc, Ap, Bp, C, ldc, alpha, beta, first);
        return;
    }
    float t[ATTN_SGEMM_TILE_MAX]; /* [mr][nr] */
    const int64_t nr = kr->nr;
    memset(t, 0, sizeof t);
    if (!first || beta != 0.0f)
        for (int64_t r = 0; r < rows; r++) memcpy(t + r * nr, C + r * ldc, (size_t)cols * sizeof *t);
    /* a panel's last rows: the kernel of the fewest rows that covers them */
    int i = 0;
    while (i < 3 && (1 << i) < rows) i++;
    ((1 << i) >= rows && (1 << i) < kr->mr ? kr->ukr_rows[i] : kr->ukr)(kc, Ap, Bp, t, nr, alpha,
                                                                       beta, first);
    for (int64_t r = 0; r < rows; r++) memcpy(C + r * ldc, t + r * nr, (size_t)cols * sizeof *t);
}

/* The fallback: OpenBLAS, one single-threaded call. */
static void sgemm_blas(int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha,
                       const float *A, int64_t lda, const float *B, int64_t ldb, float beta,
                       float *C, int64_t ldc) {
#pragma omp parallel num_threads(1)
    {
        /* this region's thread-count ICV: OpenBLAS's OpenMP build would
         * otherwise start a team of the caller's default size */
        omp_set_num_threads(1);
        cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
                    (blasint)M, (blasint)N, (blasint)K, alpha, A, (blasint)lda, B, (blasint)ldb,
                    beta, C, (blasint)ldc);
    }
}

void attn_sgemm(int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A,
                int64_t lda, const float *B, int64_t ldb, float beta, float *C, int64_t ldc,
                int threads) {
    if (M <= 0 || N <= 0) return;
    if (K <= 0 || alpha == 0.0f) {
        scale_c(M, N, beta, C, ldc);
        return;
    }
    const attn_sgemm_kernel *kr = attn_sgemm_kernel_active();
    const int64_t MR = kr->mr, NR = kr->nr;
    const int64_t kcx = g_block[0] ? g_block[0] : kr->kc;
    const int64_t mcx = g_block[1] ? (g_block[1] + MR - 1) / MR * MR : kr->mc;
    const int64_t ncx = g_block[2] ? (g_block[2] + NR - 1) / NR * NR : kr->nc;
    const int64_t KCb = min64(K, kcx);                         /* K block */
    const int64_t MCb = min64((M + MR - 1) / MR * MR, mcx);    /* rows of A's block */
    const int64_t NCb = min64((N + NR - 1) / NR * NR, ncx);    /* columns of B's block */
    /* The threads: a grid of tm x tn. Enough rows: each thread its own
     * band of whole row panels (tm = threads), its own packed A, all of B's
     * columns; then the threads meet only around each packing of B. Few
     * rows: each thread its share of the column panels (tn = threads),
     * packing all of A for itself (A is small then). */
    const int64_t P = (M + MR - 1) / MR; /* row panels of C */
    int tm = threads, tn = 1;
    if (P < 2 * (int64_t)threads) {
        const int64_t nq_max = NCb / NR; /* column panels of one B block */
        tm = 1, tn = threads < nq_max ? threads : (int)nq_max;
    }
    threads = tm * tn;
    const size_t abytes = (size_t)(MCb * KCb) * sizeof(float), bbytes = (size_t)(KCb * NCb) * sizeof(float);
    /* threads x [MCb/MR][KCb][MR] and [NCb/NR][KCb][NR]; aligned_alloc
     * wants a size that is a multiple of the alignment */
    const size_t astep = (abytes + 63) / 64 * 64;
    float *Apall = aligned_alloc(64, astep * (size_t)threads);
    float *Bp = aligned_alloc(64, (bbytes + 63) / 64 * 64);
    if (!Apall || !Bp || g_fallback) {
        free(Apall), free(Bp);
        sgemm_blas(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
        return;
    }
#pragma omp parallel num_threads(threads)
    {
        const int64_t nth = omp_get_num_threads(), id = omp_get_thread_num();
        /* a smaller team than asked (OpenMP may give one): the same grid
         * rule on what came */
        const int64_t gm = nth == threads ? tm : (tm > 1 ? nth : 1), gn = nth / gm;
        const int64_t im = id % gm, in = id / gm;
        float *Ap = (float *)((char *)Apall + astep * (size_t)id);
        /* this thread's rows: whole panels, so its tiles are the tiles of
         * the one-thread grid */
        const int64_t r_lo = min64(M, P * im / gm * MR), r_hi = min64(M, P * (im + 1) / gm * MR);
        for (int64_t jc = 0; jc < N; jc += NCb) {
            const int64_t nc = min64(NCb, N - jc), nq = (nc + NR - 1) / NR;
            const int64_t q0 = in < gn ? nq * in / gn : 0, q1 = in < gn ? nq * (in + 1) / gn : 0;
            for (int64_t pc = 0; pc < K; pc += KCb) {
                const int64_t kc = min64(KCb, K - pc);
                const int first = pc == 0;
                kr->pack_b(B, ldb, tb, pc, kc, jc, nc, nq * id / nth, nq * (id + 1) / nth, Bp);
#pragma omp barrier
                /* the band in nblk blocks of at most MCb rows, even to a
                 * panel (a last block of a few rows would stream all of B
                 * for little work) */
                const int64_t bp = (r_hi - r_lo + MR - 1) / MR, nblk = (bp + MCb / MR - 1) / (MCb / MR);
                for (int64_t blk = 0; blk < nblk && q1 > q0; blk++) {
                    const int64_t ic = r_lo + bp * blk / nblk * MR;
                    const int64_t mc = min64(r_hi, r_lo + bp * (blk + 1) / nblk * MR) - ic;
                    const int64_t np = (mc + MR - 1) / MR;
                    kr->pack_a(A, lda, ta, ic, mc, pc, kc, 0, np, Ap);
                    /* B panel by B panel: each stays in cache across A's */
                    for (int64_t q = q0; q < q1; q++)
                        for (int64_t p = 0; p < np; p++)
                            tile(kr, kc, Ap + p * MR * kc, Bp + q * NR * kc,
                                 C + (ic + p * MR) * ldc + jc + q * NR, ldc,
                                 min64(MR, mc - p * MR), min64(NR, nc - q * NR), alpha, beta,
                                 first);
                }
#pragma omp barrier /* before B is packed again */
            }
        }
    }
    free(Apall), free(Bp);
}
