/* The fused SDPA kernels, written once over a small vector vocabulary and
 * compiled three times: sdpa_fused_avx512.c, sdpa_fused_avx2.c and
 * sdpa_fused_portable.c define the vocabulary (vf, VL, v_*) and the
 * micro-kernel shape (UKR_MR rows x UKR_NV vectors), then include
 * this file. Not a public header; only those three files include it. It
 * includes, bottom up (each header includes what it uses and uses nothing
 * of a header that includes it):
 *   sdpa_fused_helpers.h  tile sizes, scratch, masks, packing (kctx)
 *   sdpa_fused_ukr.h      the tile product (tile_prod) and its micro-kernel
 *   sdpa_fused_fwd.h      the forward (Lq > FUSED_DECODE_MAXLQ)
 *   sdpa_fused_dec.h      the decode forward and backward (Lq <= it)
 *   sdpa_fused_bwd.h      the backward
 *   sdpa_fused_varlen.h   packed variable-length calls, over the blocks above
 * and then defines the entry points, which the including file exports as
 * one attn_fused_kernels (internal.h): its row in isa.c's table.
 *
 * Layout ("transposed scores"): a tile of scores is stored as Sᵀ, keys as
 * rows and query rows as vector lanes. Then
 *   - Sᵀ = K·Qᵀ reads K in its own layout (broadcasts of K[j][d]) and the
 *     query block transposed once per block (Qᵀ, vector loads);
 *   - the softmax statistics (running max m, sum l, rescale factor) are
 *     vectors over query rows: no horizontal reductions in the hot loop;
 *   - O += P·V broadcasts P[i][j] from Sᵀ and loads V rows as vectors.
 * Every tile product is one generic micro-kernel: C[M×N] (+)= A[M×K]·B[K×N]
 * where A is read by broadcasts with any (row, k) strides and B by vector
 * loads of its rows; N is a multiple of VL (scratch is padded with zeros).
 *
 * Forward: tiles FQ query rows x FK keys, online softmax with O kept
 * unnormalised (rescaled by exp(m_old - m_new) only when the max moved) and
 * divided by l once at the end; only the log-sum-exp leaves the kernel.
 * Tiles outside the block's structural key range are skipped; boundary tiles
 * get per-row -inf; bool/additive masks are applied inside the tile.
 * Backward: FlashAttention-2 recomputation of P from the log-sum-exp, and
 * D = rowsum(dO∘O). One pass per (b, h) when heads spread evenly over the
 * threads, else two passes (dK/dV by key group, dQ by query block). Both
 * schemes compute every tile with the same code and accumulate every output
 * element in the same order, so results do not depend on the scheme or the
 * thread count.
 * Decode (Lq <= FUSED_DECODE_MAXLQ): keys split in fixed chunks (independent
 * of the thread count), partial (max, sum, accumulator) per chunk, merged in
 * chunk order; a work item reads one K/V head (or one chunk of it) for all
 * query rows of its group at once (grouped-query attention); its backward writes each chunk's dK/dV rows and a partial dQ,
 * summed in chunk order. Scores there are row dot products (vectors along
 * d), the same function in forward and backward.
 *
 * Memory: per-thread scratch sized up front from the shapes (a few tiles;
 * the one-pass backward adds a [Lk x D] dK/dV accumulator per thread, the
 * decode paths a (max, sum, acc) or dQ partial per row and chunk). Nothing
 * is O(Lq·Lk) unless the caller asks for the weights.
 *
 * Accuracy: products over the head dimension (S = K·Qᵀ, dP = V·dOᵀ, and D)
 * sum in blocks of UKR_KB terms, which keeps their rounding within about the
 * reference's split dot products; sums over keys or queries run in one chain
 * across tiles, as the reference's do.
 *
 * Non-finite inputs: a product that multiplies a zero weight by a NaN/Inf
 * operand would poison rows the reference leaves clean (the reference skips
 * zero weights). The forward detects such rows after the fact (non-finite
 * output with a finite sum) and recomputes the block with zero-skipping
 * products; the backward checks each tile's operands and uses zero-skipping
 * products for tiles that hold a non-finite value. */

#include "sdpa_fused_helpers.h"
#include "sdpa_fused_ukr.h"
#include "sdpa_fused_fwd.h"
#include "sdpa_fused_dec.h"
#include "sdpa_fused_bwd.h"
#include "sdpa_fused_varlen.h"

/* ------------------------------------------------------------ entry points */

static void make_ctx(kctx *c, const attn_fused_call *call) {
    const attn_problem *pr = call->pr;
    c->pr = pr;
    c->q = call->q;
    c->k = call->k;
    c->v = call->v;
    c->dkp = rup(pr->Dk, VL);
    c->dvp = rup(pr->Dv, VL);
    c->k_rows = call->k->stride[3] == 1 && pr->Dk % VL == 0;
    c->v_rows = call->v->stride[3] == 1 && pr->Dv % VL == 0;
    c->mode = call->blas ? TILE_BLAS : TILE_OWN;
}

static attn_status fused_forward(const attn_fused_call *call, attn_error *err) {
    kctx c;
    make_ctx(&c, call);
    if (call->varlen) return varlen_forward(&c, call, err);
    if (call->pr->Lq <= FUSED_DECODE_MAXLQ) return dec_forward(&c, call, err);
    return fwd_forward(&c, call, err);
}

static int64_t fused_forward_scratch(const attn_problem *pr) {
    const int64_t dkp = rup(pr->Dk, VL), dvp = rup(pr->Dv, VL);
    if (pr->Lq <= FUSED_DECODE_MAXLQ) return dec_total(pr, dkp, dvp);
    return pr->threads * fwd_scratch(pr, dvp);
}

static attn_status fused_backward(const attn_fused_call *call, attn_error *err) {
    kctx c;
    make_ctx(&c, call);
    if (call->varlen) return varlen_backward(&c, call, err);
    /* The decode backward writes each key's dK/dV row from one query head;
     * grouped heads and the score variants take the tiled backward (any Lq). */
    const attn_problem *pr = call->pr;
    if (pr->Lq <= FUSED_DECODE_MAXLQ && pr->group == 1 && !attn_has_score_variants(pr))
        return dec_backward(&c, call, err);
    return bwd_backward(&c, call, err);
}

/* y = tanh(x) by v_tanh, VL at a time (attn_test_tanh). */
static void fused_tanh_n(const float *x, float *y, int64_t n) {
    float buf[VL] = {0};
    for (int64_t i = 0; i < n; i += VL) {
        const int64_t m = imin(VL, n - i);
        memcpy(buf, x + i, (size_t)m * sizeof(float));
        v_store(buf, v_tanh(v_load(buf)));
        memcpy(y + i, buf, (size_t)m * sizeof(float));
    }
}

/* The initializer of this instruction set's row, which its
 * sdpa_fused_<isa>.c exports as const attn_fused_kernels
 * attn_fused_kernels_<isa> = FUSED_KERNELS("<isa>"). */
#define FUSED_KERNELS(name) {name, fused_forward, fused_backward, fused_forward_scratch, fused_tanh_n}
