/* The fused decode kernels for Lq <= FUSED_DECODE_MAXLQ (part of
 * sdpa_fused_template.h): keys split in fixed chunks, a partial (max, sum,
 * acc) per query row and chunk, merged in chunk order; the forward reads a
 * K/V chunk once for all query rows of its group; the backward writes
 * each chunk's dK/dV rows and a partial dQ, summed in chunk order. */
#ifndef ATTN_SDPA_FUSED_DEC_H
#define ATTN_SDPA_FUSED_DEC_H

#include "sdpa_fused_helpers.h"
#include "sdpa_fused_ukr.h"

static int64_t dec_chunk(int64_t Lk) {
    int64_t C = FUSED_DECODE_CHUNK;
    while (Lk > 64 * C) C *= 2;
    return C;
}

/* scale · q·k for query row qr (contiguous, zero-padded to dkp) and key
 * row kr (stride K->stride[3]; copied to tmp when not contiguous). The
 * decode forward and the decode backward both score with this, so the
 * backward's recomputed scores match the forward's bit for bit (at |s| ~ 1e4
 * any difference would show in exp(s - lse)). */
static inline float dec_dot(const kctx *c, const float *qr, const float *kr, float *tmp) {
    const int64_t Dk = c->pr->Dk;
    if (c->k->stride[3] != 1) {
        copy_row(tmp, kr, c->k->stride[3], Dk, c->dkp);
        kr = tmp;
    }
    vf acc = v_zero();
    int64_t d = 0;
    for (; d + VL <= Dk; d += VL) acc = v_fma(v_load(qr + d), v_load(kr + d), acc);
    if (d < Dk) acc = v_fma(v_load(qr + d), v_load_n(kr + d, (int)(Dk - d)), acc);
    return c->pr->scale * v_hsum(acc);
}

/* Scores s[j - a] of query row qr (query head h) against keys [a, e) of
 * K/V head KVH(h): scale·q·k, soft-capped and ALiBi-biased, additive mask
 * added, bool-masked keys -inf. */
static void dec_scores(const kctx *c, const float *qr, float *tmp, int64_t b, int64_t h, int64_t i,
                       int64_t a, int64_t e, float *s) {
    const attn_problem *pr = c->pr;
    const uint8_t *bm =
        pr->bmask ? pr->bmask + b * pr->bms[0] + h * pr->bms[1] + i * pr->bms[2] : NULL;
    const float *am =
        pr->amask ? pr->amask + b * pr->ams[0] + h * pr->ams[1] + i * pr->ams[2] : NULL;
    const int variants = attn_has_score_variants(pr); /* soft-capping, ALiBi: before the masks */
    int64_t j = a;
#if VL == 16 && defined(__GNUC__) && !defined(__clang__)
    /* 16 keys at a time, bitwise dec_dot's: each key's lane sums acc (its
     * own FMA chain over d), transposed, then GCC's _mm512_reduce_add_ps
     * tree (lanes l + 8, l + 4, l + 2, l + 1 added to l) done for the 16 keys
     * at once, one vector add per level instead of a shuffle chain per key.
     * A masked key's dot is computed and then replaced, as below. */
    if (c->k_rows) {
        float blk[2][256] __attribute__((aligned(64)));
        const int64_t Dk = pr->Dk, ks = c->k->stride[2];
        const vf sc = v_set1(pr->scale);
        for (; j + 16 <= e; j += 16) {
            const float *kr = row_of(c->k, b, KVH(pr, h), j);
            for (int u = 0; u < 16; u++, kr += ks) {
                vf acc = v_zero();
                for (int64_t d = 0; d < Dk; d += VL)
                    acc = v_fma(v_load(qr + d), v_load(kr + d), acc);
                v_store(blk[0] + 16 * u, acc);
            }
            v_transpose_block(blk[0], 16, blk[1], 16); /* blk[1] row l: lane l of the 16 keys */
            vf r[8];
            for (int l = 0; l < 8; l++)
                r[l] = v_add(v_load(blk[1] + 16 * (l + 8)), v_load(blk[1] + 16 * l));
            for (int l = 0; l < 4; l++) r[l] = v_add(r[l + 4], r[l]);
            r[0] = v_add(r[0], r[2]);
            r[1] = v_add(r[1], r[3]);
            v_store(s + (j - a), v_mul(sc, v_add(r[0], r[1])));
        }
        for (int64_t u = a; u < j; u++) {
            if (variants) s[u - a] = attn_score_variants(pr, h, i, u, s[u - a], NULL);
            if (bm && !bm[u * pr->bms[3]])
                s[u - a] = -INFINITY;
            else if (am)
                s[u - a] += am[u * pr->ams[3]];
        }
    }
#endif
    for (; j < e; j++) {
        if (bm && !bm[j * pr->bms[3]]) {
            s[j - a] = -INFINITY;
            continue;
        }
        float x = dec_dot(c, qr, row_of(c->k, b, KVH(pr, h), j), tmp);
        if (variants) x = attn_score_variants(pr, h, i, j, x, NULL);
        if (am) x += am[j * pr->ams[3]];
        s[j - a] = x;
    }
}

/* ------------------------------------------------- decode forward, by group
 *
 * A work item reads one K/V head: the group's R = G·Lq query rows (query
 * heads kvh·G .. kvh·G + G - 1, each with its Lq rows, stacked as
 * FlashAttention-3's pack_gqa stacks them) are scored against each key row
 * while it is in registers, and one V row feeds all R rows' sums, so each
 * K/V byte leaves memory once per group instead of once per query head.
 * Each row's arithmetic is the per-row kernel's: the same FMA chain over d
 * per score, the same lanes for its max and sum, the same chain over keys
 * for its P·V (zero weights outside the row's range add exact zeros). */

/* Lane sums (FMA chains over d, dec_dot's) of the RB query rows q (dkp
 * apart) against key row kr (contiguous, Dk a multiple of VL), to out +
 * r·ldo: the key is loaded once for the RB rows. */
static inline __attribute__((always_inline)) void dec_lanes(const int RB, const float *q,
                                                            int64_t dkp, const float *kr,
                                                            int64_t Dk, float *out, int64_t ldo) {
    vf acc[4];
    for (int r = 0; r < RB; r++) acc[r] = v_zero();
    for (int64_t d = 0; d < Dk; d += VL) {
        const vf kv = v_load(kr + d);
        for (int r = 0; r < RB; r++) acc[r] = v_fma(v_load(q + r * dkp + d), kv, acc[r]);
    }
    for (int r = 0; r < RB; r++) v_store(out + r * ldo, acc[r]);
}

static void dec_lanes_n(int rb, const float *q, int64_t dkp, const float *kr, int64_t Dk,
                        float *out, int64_t ldo) {
    switch (rb) {
    case 4: dec_lanes(4, q, dkp, kr, Dk, out, ldo); break;
    case 3: dec_lanes(3, q, dkp, kr, Dk, out, ldo); break;
    case 2: dec_lanes(2, q, dkp, kr, Dk, out, ldo); break;
    default: dec_lanes(1, q, dkp, kr, Dk, out, ldo); break;
    }
}

#if VL == 16 && defined(__GNUC__) && !defined(__clang__)
/* A prefetch cursor over `rows` rows of `lines` 64-byte lines each (row
 * stride rs bytes), into L2, a few lines at a time from inside the
 * arithmetic, so that a thread's requests to memory spread evenly over
 * its compute instead of leaving the stream idle while it computes. */
typedef struct {
    const char *p;
    int64_t rs, rows;
    int lines, col;
} pfcur;

static pfcur pf_rows(const float *row0, int64_t stride, int64_t rows, int64_t cols) {
    const pfcur c = {(const char *)row0, stride * (int64_t)sizeof(float), rows > 0 ? rows : 0,
                     (int)((cols * (int64_t)sizeof(float) + 63) / 64), 0};
    return c;
}

static inline __attribute__((always_inline)) void pf_step(pfcur *c, int n) {
    for (int i = 0; i < n && c->rows > 0; i++) {
        _mm_prefetch(c->p + (int64_t)c->col * 64, _MM_HINT_T1);
        if (++c->col == c->lines) c->col = 0, c->p += c->rs, c->rows--;
    }
}

/* The RB query rows q (dkp apart) against the 4 key rows k + u·ks4 (u < 4;
 * contiguous, Dk a multiple of VL): each (row, key) lane sums as dec_lanes
 * forms them (16 accumulators in registers), then the first two levels of
 * their reduction, out[r] = v_hsum_l12x4 of row r's four keys. */
static inline __attribute__((always_inline)) void dec_quad(const int RB, const float *q,
                                                           int64_t dkp, const float *k,
                                                           int64_t ks4, int64_t Dk, vf *out,
                                                           pfcur *pf, int pn) {
    vf acc[4][4];
    for (int r = 0; r < RB; r++)
        for (int u = 0; u < 4; u++) acc[r][u] = v_zero();
    for (int64_t d = 0; d < Dk; d += VL) {
        if (pf) pf_step(pf, pn);
        vf kv[4];
        for (int u = 0; u < 4; u++) kv[u] = v_load(k + u * ks4 + d);
        for (int r = 0; r < RB; r++) {
            const vf qv = v_load(q + r * dkp + d);
            for (int u = 0; u < 4; u++) acc[r][u] = v_fma(qv, kv[u], acc[r][u]);
        }
    }
    for (int r = 0; r < RB; r++) out[r] = v_hsum_l12x4(acc[r][0], acc[r][1], acc[r][2], acc[r][3]);
}

static void dec_quad_n(int rb, const float *q, int64_t dkp, const float *k, int64_t ks4,
                       int64_t Dk, vf *out, pfcur *pf, int pn) {
    switch (rb) { /* one row: never a prefetch (the cursor compiled out) */
    case 4: dec_quad(4, q, dkp, k, ks4, Dk, out, pf, pn); break;
    case 3: dec_quad(3, q, dkp, k, ks4, Dk, out, pf, pn); break;
    case 2: dec_quad(2, q, dkp, k, ks4, Dk, out, pf, pn); break;
    default: dec_quad(1, q, dkp, k, ks4, Dk, out, NULL, 0); break;
    }
}

/* P·V of RB <= 4 rows: C[r] (ldc apart) = Σ_k s[r·lds + k]·V[k] over n
 * keys, nvec (a multiple of 4) vectors of columns 4 at a time: the tile
 * micro-kernel's chain (ukr_body, acc 0, alpha 1), so the same bits as
 * gemm(), with the cursor stepped pn lines per key. */
static inline __attribute__((always_inline)) void dec_pv(const int RB, int64_t nvec, int64_t n,
                                                         const float *s, int64_t lds,
                                                         const float *V, int64_t vs, float *C,
                                                         int64_t ldc, pfcur *pf, int pn) {
    for (int64_t v0 = 0; v0 < nvec; v0 += 4) {
        vf acc[4][4];
        for (int r = 0; r < RB; r++)
            for (int u = 0; u < 4; u++) acc[r][u] = v_zero();
        const float *vr = V + v0 * VL;
        for (int64_t k = 0; k < n; k++, vr += vs) {
            pf_step(pf, pn);
            vf bv[4];
            for (int u = 0; u < 4; u++) bv[u] = v_load(vr + u * VL);
            for (int r = 0; r < RB; r++) {
                const vf a = v_set1(s[r * lds + k]);
                for (int u = 0; u < 4; u++) acc[r][u] = v_fma(a, bv[u], acc[r][u]);
            }
        }
        for (int r = 0; r < RB; r++)
            for (int u = 0; u < 4; u++) v_store(C + r * ldc + (v0 + u) * VL, acc[r][u]);
    }
}

static void dec_pv_n(int rb, int64_t nvec, int64_t n, const float *s, int64_t lds, const float *V,
                     int64_t vs, float *C, int64_t ldc, pfcur *pf, int pn) {
    switch (rb) {
    case 4: dec_pv(4, nvec, n, s, lds, V, vs, C, ldc, pf, pn); break;
    case 3: dec_pv(3, nvec, n, s, lds, V, vs, C, ldc, pf, pn); break;
    case 2: dec_pv(2, nvec, n, s, lds, V, vs, C, ldc, pf, pn); break;
    default: dec_pv(1, nvec, n, s, lds, V, vs, C, ldc, pf, pn); break;
    }
}
#endif

/* Scores of R rows of a group (q [R][dkp]; row r is query head
 * h0 + (i0 + r) / Lq, row (i0 + r) % Lq) against keys [A, E) of their K/V
 * head: s[r·lds + j - A], each bitwise dec_scores' for that row. tmp:
 * dkp + dvp floats. */
static void dec_scores_group(const kctx *c, const float *q, int64_t R, int64_t b, int64_t h0,
                             int64_t i0, int64_t A, int64_t E, float *s, int64_t lds, float *tmp) {
    const attn_problem *pr = c->pr;
    const int64_t Lq = pr->Lq, dkp = c->dkp;
    if (!c->k_rows) { /* strided or ragged K rows: row by row (copies each key row) */
        for (int64_t r = 0; r < R; r++)
            dec_scores(c, q + r * dkp, tmp, b, h0 + (i0 + r) / Lq, (i0 + r) % Lq, A, E,
                       s + r * lds);
        return;
    }
    const int64_t Dk = pr->Dk, ks = c->k->stride[2];
    const float sc = pr->scale;
    const float *K0 = row_of(c->k, b, KVH(pr, h0), 0);
    int64_t j = A;
#if VL == 16 && defined(__GNUC__) && !defined(__clang__)
    /* 16 keys at a time, reduced as dec_scores reduces them (GCC's
     * _mm512_reduce_add_ps tree) without leaving the registers: quad c
     * holds keys j + c, j + c + 4, j + c + 8, j + c + 12, so that
     * v_hsum_l34x4 puts key j + l in lane l. */
    {
        const vf scv = v_set1(sc);
        /* Prefetch (one-row groups skip it: the stream alone bounds them,
         * and it cost them 20 %): the K rows 16 keys ahead into L1, and
         * the chunk's V rows into L2 for the P·V after the scores, a few
         * lines per step of the arithmetic (the P·V below does the same
         * for the next chunk's K rows). Zen 5, H_q 32, H_kv 8, Lk 8192,
         * 2 threads: 2.43 -> 1.69 ms against no prefetch (docs/speed.md). */
        const int pf = R >= 2;
        const float *V0 = pf && c->v_rows ? row_of(c->v, b, KVH(pr, h0), A) : NULL;
        pfcur vc = pf_rows(V0, c->v->stride[2], V0 ? (E - A) / 16 * 16 : 0, pr->Dv);
        const int64_t iters = (E - A) / 16 * ((R + 3) / 4) * 4 * (Dk / VL);
        const int vpn = iters ? (int)((vc.rows * vc.lines + iters - 1) / iters) : 0;
        for (; j + 16 <= E; j += 16) {
            for (int64_t u = j + 16; u < (pf ? imin(j + 32, pr->Lk) : 0); u++)
                for (int64_t x = 0; x < Dk; x += VL)
                    _mm_prefetch((const char *)(K0 + u * ks + x), _MM_HINT_T0);
            for (int64_t r0 = 0; r0 < R; r0 += 4) {
                const int rb = (int)imin(4, R - r0);
                vf l2[4][4];
                for (int c4 = 0; c4 < 4; c4++)
                    dec_quad_n(rb, q + r0 * dkp, dkp, K0 + (j + c4) * ks, 4 * ks, Dk, l2[c4],
                               &vc, vpn);
                for (int r = 0; r < rb; r++)
                    v_store(s + (r0 + r) * lds + (j - A),
                            v_mul(scv, v_hsum_l34x4(l2[0][r], l2[1][r], l2[2][r], l2[3][r])));
            }
        }
    }
#endif
    for (; j < E; j++) {
        float lanes[4 * VL] __attribute__((aligned(64)));
        for (int64_t r0 = 0; r0 < R; r0 += 4) {
            const int rb = (int)imin(4, R - r0);
            dec_lanes_n(rb, q + r0 * dkp, dkp, K0 + j * ks, Dk, lanes, VL);
            for (int r = 0; r < rb; r++)
                s[(r0 + r) * lds + (j - A)] = sc * v_hsum(v_load(lanes + r * VL));
        }
    }
    /* soft-capping, ALiBi, then the masks, per row (dec_scores' order) */
    const int variants = attn_has_score_variants(pr);
    for (int64_t r = 0; r < R; r++) {
        const int64_t h = h0 + (i0 + r) / Lq, i = (i0 + r) % Lq;
        const uint8_t *bm =
            pr->bmask ? pr->bmask + b * pr->bms[0] + h * pr->bms[1] + i * pr->bms[2] : NULL;
        const float *am =
            pr->amask ? pr->amask + b * pr->ams[0] + h * pr->ams[1] + i * pr->ams[2] : NULL;
        if (!variants && !bm && !am) continue;
        float *sr = s + r * lds - A;
        for (int64_t u = A; u < E; u++) {
            if (variants) sr[u] = attn_score_variants(pr, h, i, u, sr[u], NULL);
            if (bm && !bm[u * pr->bms[3]])
                sr[u] = -INFINITY;
            else if (am)
                sr[u] += am[u * pr->ams[3]];
        }
    }
}

/* acc[dvp] = Σ_j s[j]·V[a + j] over n keys of K/V head kvh, skipping zero
 * weights (a zero weight times a non-finite V entry would give NaN where
 * the reference skips the key). tmp: dvp floats. */
static void dec_pv_skip(const kctx *c, int64_t b, int64_t kvh, int64_t a, int64_t n, const float *s,
                        float *acc, float *tmp) {
    const attn_tensor *V = c->v;
    const int64_t Dv = c->pr->Dv, dvp = c->dvp;
    const int vcontig = V->stride[3] == 1;
    memset(acc, 0, (size_t)dvp * sizeof(float));
    for (int64_t j = 0; j < n; j++) {
        const float p = s[j];
        if (p == 0.0f) continue; /* zero weight: V row not read (reference semantics) */
        const float *vr = row_of(V, b, kvh, a + j);
        if (!vcontig) {
            copy_row(tmp, vr, V->stride[3], Dv, dvp);
            vr = tmp;
        }
        const vf pv = v_set1(p);
        int64_t d = 0;
        for (; d + VL <= Dv; d += VL) v_store(acc + d, v_fma(pv, v_load(vr + d), v_load(acc + d)));
        if (d < Dv) v_store(acc + d, v_fma(pv, v_load_n(vr + d, (int)(Dv - d)), v_load(acc + d)));
    }
}

/* The decode forward's scratch (dec_total floats), carved:
 *   per thread [per]: a batch of R <= DEC_ROWS rows of a group for one
 *     chunk: q [R][dkp], s [R][lds] (scores, then
 *     weights; lds = rup(C + VL, 16)), tmp [dkp + dvp], mx, sm [R]
 *   pm, pl [rows][nch], pacc [rows][nch][dvp]: the chunk partials
 *   lsv, mrow, ilrow [rows]: lse, max and 1/sum per row */
typedef struct {
    int64_t C, nch, rows, per, lds;
    float *ws, *pm, *pl, *pacc, *lsv, *mrow, *ilrow;
} dws;

#define DEC_ROWS 16 /* a group's rows taken at once (more: the chunk's K/V again, from cache) */

/* Rows of a batch: the scratch depends on H and Lq, not on the K/V heads. */
static int64_t dec_batch_rows(const attn_problem *pr) { return imin(DEC_ROWS, pr->H * pr->Lq); }

static int64_t dec_scratch(const attn_problem *pr, int64_t dkp, int64_t dvp) {
    const int64_t R = dec_batch_rows(pr), lds = rup(dec_chunk(pr->Lk) + VL, 16);
    const int64_t grp = R * rup(dkp, 16) + R * lds + rup(dkp + dvp, 16) + 2 * rup(R, 16);
    const int64_t row = rup(dkp, 16) + lds + rup(dvp, 16) + rup(dkp + dvp, 16); /* weights */
    return (grp > row ? grp : row) + 64;
}

/* Floats of the whole decode forward scratch. */
static int64_t dec_total(const attn_problem *pr, int64_t dkp, int64_t dvp) {
    const int64_t C = dec_chunk(pr->Lk), nch = (pr->Lk + C - 1) / C, rows = pr->B * pr->H * pr->Lq;
    return pr->threads * dec_scratch(pr, dkp, dvp) + rows * nch * (dvp + 2) + 3 * rows + 16;
}

static dws dec_carve(const kctx *c, float *ws) {
    const attn_problem *pr = c->pr;
    dws w;
    w.C = dec_chunk(pr->Lk), w.nch = (pr->Lk + w.C - 1) / w.C, w.rows = pr->B * pr->H * pr->Lq;
    w.per = dec_scratch(pr, c->dkp, c->dvp), w.lds = rup(w.C + VL, 16);
    w.ws = ws;
    w.pm = ws + pr->threads * w.per, w.pl = w.pm + w.rows * w.nch, w.pacc = w.pl + w.rows * w.nch;
    w.lsv = w.pacc + w.rows * w.nch * c->dvp, w.mrow = w.lsv + w.rows, w.ilrow = w.mrow + w.rows;
    return w;
}

/* Chunk ch of K/V head (b, kvh) for rows [rb, rb + R) of its group (R <=
 * dec_batch_rows; the group's row r is query head kvh·G + r / Lq, row
 * r % Lq): each row's partial softmax (max pm, sum pl, acc pacc [dvp]) over
 * its keys in the chunk. A group's rows are consecutive rows of the output. */
static void dec_group_chunk(const kctx *c, const dws *d, float *w, int64_t b, int64_t kvh,
                            int64_t ch, int64_t rb, int64_t R) {
    const attn_problem *pr = c->pr;
    const int64_t Lq = pr->Lq, G = pr->group, dkp = c->dkp, dvp = c->dvp, nch = d->nch,
                  lds = d->lds;
    const int64_t c0 = ch * d->C, c1 = imin(pr->Lk, c0 + d->C);
    /* the batch's first row: query head h0, row i0 (rows r: h0 + (i0 + r) / Lq) */
    const int64_t h0 = kvh * G + rb / Lq, i0 = rb % Lq, row0 = (b * pr->H + kvh * G) * Lq + rb;
    float *q = carve(&w, R * dkp), *s = carve(&w, R * lds), *tmp = carve(&w, dkp + dvp);
    float *mx = carve(&w, R), *sm = carve(&w, R);
    float *pm = d->pm + row0 * nch + ch, *pl = d->pl + row0 * nch + ch;
    float *pacc = d->pacc + (row0 * nch + ch) * dvp; /* row r's at + r·nch·dvp */
    /* the keys some row sees (a row's range depends on i only) */
    int64_t A = c1, E = c0;
    for (int64_t r = 0; r < imin(Lq, R); r++) { /* the batch's distinct rows i */
        int64_t lo, hi;
        attn_row_range(pr, b, (i0 + r) % Lq, &lo, &hi);
        if (imax(lo, c0) < imin(hi, c1)) A = imin(A, imax(lo, c0)), E = imax(E, imin(hi, c1));
    }
    if (A >= E) {
        for (int64_t r = 0; r < R; r++) {
            pm[r * nch] = -INFINITY, pl[r * nch] = 0.0f;
            memset(pacc + r * nch * dvp, 0, (size_t)dvp * sizeof(float));
        }
        return;
    }
    for (int64_t r = 0; r < R; r++)
        copy_row(q + r * dkp, row_of(c->q, b, h0 + (i0 + r) / Lq, (i0 + r) % Lq), c->q->stride[3],
                 pr->Dk, dkp);
    dec_scores_group(c, q, R, b, h0, i0, A, E, s, lds, tmp);
    /* each row's weights over its own keys [a, e), lanes from key a (the
     * per-row kernel's); 0 at the group's other keys */
    for (int64_t r = 0; r < R; r++) {
        const int64_t h = h0 + (i0 + r) / Lq, i = (i0 + r) % Lq;
        int64_t lo, hi;
        attn_row_range(pr, b, i, &lo, &hi);
        const int64_t a = imax(lo, c0), e = imin(hi, c1), n = e - a;
        float *srow = s + r * lds;
        mx[r] = -INFINITY, sm[r] = 0.0f;
        if (n <= 0) {
            memset(srow, 0, (size_t)(E - A) * sizeof(float));
            continue;
        }
        float *sr = srow + (a - A);
        const int64_t np = rup(n, VL);
        for (int64_t j = n; j < np; j++) sr[j] = -INFINITY; /* within lds: a - A + np < C + VL */
        vf mv = v_set1(-INFINITY);
        for (int64_t j = 0; j < np; j += VL) mv = v_max(v_load(sr + j), mv);
        const float M = v_hmax(mv);
        const vf mu = v_set1(M == -INFINITY ? 0.0f : M);
        vf sum = v_zero();
        for (int64_t j = 0; j < np; j += VL) {
            const vf p = v_exp(v_sub(v_load(sr + j), mu));
            v_store(sr + j, p);
            sum = v_add(sum, p);
        }
        for (int64_t j = 0; j < a - A; j++) srow[j] = 0.0f;
        for (int64_t j = e - A; j < E - A; j++) srow[j] = 0.0f;
        if (pr->dropout) {
            for (int64_t j = 0; j < n; j++) {
                if (sr[j] == 0.0f) continue;
                uint32_t wd[4];
                attn_philox_block(pr->drop_key, b + pr->drop_b0, h, i, (a + j) >> 2, wd);
                sr[j] = wd[(a + j) & 3] < pr->drop_threshold ? 0.0f : sr[j] * pr->keep_scale;
            }
        }
        mx[r] = M, sm[r] = v_hsum(sum);
    }
    /* P·V for the R rows at once (V rows read in place, once per group);
     * a row poisoned by a zero weight on a non-finite V entry is redone
     * skipping zero weights, as is every row when V rows are not in place */
#if VL == 16 && defined(__GNUC__) && !defined(__clang__)
    /* groups of 2-4 rows: the direct P·V (gemm's bits), stepping a prefetch
     * of the next chunk's K rows into L2 */
    if (c->v_rows && c->mode == TILE_OWN && R >= 2 && R <= 4 && (dvp / VL) % 4 == 0) {
        const int64_t n = E - A, nk = c->k_rows ? imin(d->C, pr->Lk - c1) : 0;
        pfcur kc = pf_rows(nk > 0 ? row_of(c->k, b, kvh, c1) : NULL, c->k->stride[2], nk, pr->Dk);
        const int64_t iters = n * (dvp / VL / 4);
        const int kpn = iters ? (int)((kc.rows * kc.lines + iters - 1) / iters) : 0;
        dec_pv_n((int)R, dvp / VL, n, s, lds, row_of(c->v, b, kvh, A), c->v->stride[2], pacc,
                 nch * dvp, &kc, kpn);
    } else
#endif
    if (c->v_rows) {
        const tile_prod t = {
            R,    dvp / VL, E - A, s, lds, 1, row_of(c->v, b, kvh, A), c->v->stride[2],
            pacc, nch * dvp};
        gemm(&t, 0, 1.0f, c->mode);
    }
    for (int64_t r = 0; r < R; r++) {
        float *acc = pacc + r * nch * dvp;
        if (mx[r] == -INFINITY && sm[r] == 0.0f) { /* no key of the chunk visible */
            pm[r * nch] = -INFINITY, pl[r * nch] = 0.0f;
            memset(acc, 0, (size_t)dvp * sizeof(float));
            continue;
        }
        int redo = !c->v_rows;
        if (!redo) {
            vf bad = v_zero();
            for (int64_t dd = 0; dd < dvp; dd += VL) bad = v_fma(v_load(acc + dd), v_zero(), bad);
            redo = v_hsum(bad) != 0.0f;
        }
        if (redo) dec_pv_skip(c, b, kvh, A, E - A, s + r * lds, acc, tmp);
        pl[r * nch] = sm[r];
        pm[r * nch] =
            sm[r] == sm[r] ? mx[r] : INFINITY; /* NaN sum (poisoned row): make the merge see it */
    }
}

/* Merge the chunk partials of decode row r (chunk order) into out; keeps
 * the row's lse, max and 1/sum for the weights. ob: dvp floats of scratch. */
static void dec_merge_row(const kctx *c, const attn_fused_call *call, int64_t r, int64_t nch,
                          const float *pm, const float *pl, const float *pacc, float *ob,
                          float *lsv, float *mrow, float *ilrow) {
    const attn_problem *pr = c->pr;
    const int64_t Lq = pr->Lq, H = pr->H, Dv = pr->Dv, dvp = c->dvp;
    const int64_t bh = r / Lq, i = r % Lq, b = bh / H, h = bh % H;
    const float *m = pm + r * nch, *l = pl + r * nch, *acc = pacc + r * nch * dvp;
    float M = -INFINITY;
    for (int64_t ch = 0; ch < nch; ch++) M = m[ch] > M ? m[ch] : M;
    float *o = row_mut(call->out, b, h, i);
    const int64_t so = call->out->stride[3];
    mrow[r] = 0.0f;
    ilrow[r] = 0.0f;
    if (M == -INFINITY) {
        for (int64_t d = 0; d < Dv; d++) o[d * so] = 0.0f;
        lsv[r] = pr->sinks ? pr->sinks[h] : -INFINITY; /* a sink takes the whole mass */
        return;
    }
    float L = 0.0f;
    memset(ob, 0, (size_t)dvp * sizeof(float));
    for (int64_t ch = 0; ch < nch; ch++) {
        if (m[ch] == -INFINITY) continue;
        const float f = expf(m[ch] - M); /* NaN when M = +inf: poisoned row */
        L += l[ch] * f;
        if (f == 0.0f) continue;
        const vf fv = v_set1(f);
        for (int64_t d = 0; d < dvp; d += VL)
            v_store(ob + d, v_fma(fv, v_load(acc + ch * dvp + d), v_load(ob + d)));
    }
    float MM, inv, ls; /* the sink (if any) joins the sum */
    const float f = attn_sink_fold(M, L, pr->sinks ? pr->sinks[h] : -INFINITY, &MM, &inv, &ls);
    for (int64_t d = 0; d < Dv; d++) o[d * so] = ob[d] * f;
    lsv[r] = ls;
    mrow[r] = MM;
    ilrow[r] = inv;
}

/* Work item `it` on thread tid. Whole-group items (whole) take K/V head
 * (b, kvh) whole: its chunks in chunk order, then the merge of its group's
 * rows (no barrier in between); else the item is one chunk of one K/V head,
 * merged after a barrier. */
static void dec_item(const kctx *c, const attn_fused_call *call, const dws *d, int whole,
                     int64_t it, int tid) {
    const attn_problem *pr = c->pr;
    const int64_t nch = d->nch, R = pr->group * pr->Lq, RB = dec_batch_rows(pr);
    float *w = d->ws + (int64_t)tid * d->per;
    const int64_t g = whole ? it : it / nch, b = g / pr->Hkv, kvh = g % pr->Hkv;
    for (int64_t ch = whole ? 0 : it % nch; ch < (whole ? nch : it % nch + 1); ch++)
        for (int64_t rb = 0; rb < R; rb += RB)
            dec_group_chunk(c, d, w, b, kvh, ch, rb, imin(RB, R - rb));
    if (!whole) return;
    const int64_t row0 = (b * pr->H + kvh * pr->group) * pr->Lq;
    for (int64_t r = row0; r < row0 + R; r++)
        dec_merge_row(c, call, r, nch, d->pm, d->pl, d->pacc, w, d->lsv, d->mrow, d->ilrow);
}

/* The exact weights of row r [Lk] from its max and 1/sum, chunk by chunk. */
static void dec_weights_row(const kctx *c, const dws *d, int64_t r, float *w, float *wr) {
    const attn_problem *pr = c->pr;
    const int64_t Lq = pr->Lq, H = pr->H, Lk = pr->Lk, C = d->C;
    float *qr = carve(&w, c->dkp), *s = carve(&w, C + VL);
    carve(&w, c->dvp);
    float *tmp = carve(&w, c->dkp + c->dvp);
    const int64_t bh = r / Lq, i = r % Lq, b = bh / H, h = bh % H;
    int64_t lo, hi;
    attn_row_range(pr, b, i, &lo, &hi);
    for (int64_t j = 0; j < lo; j++) wr[j] = 0.0f;
    for (int64_t j = imax(lo, hi); j < Lk; j++) wr[j] = 0.0f;
    copy_row(qr, row_of(c->q, b, h, i), c->q->stride[3], pr->Dk, c->dkp);
    const vf mv = v_set1(d->mrow[r]), iv = v_set1(d->ilrow[r]);
    for (int64_t a = lo; a < hi; a += C) {
        const int64_t e = imin(hi, a + C), n = e - a, np = rup(n, VL);
        dec_scores(c, qr, tmp, b, h, i, a, e, s);
        for (int64_t j = n; j < np; j++) s[j] = -INFINITY;
        for (int64_t j = 0; j < np; j += VL) {
            const vf x = v_load(s + j);
            v_store(s + j, v_zero_if_eq(v_mul(v_exp(v_sub(x, mv)), iv), x, kNegInf));
        }
        memcpy(wr + a, s, (size_t)n * sizeof(float));
    }
}

static attn_status dec_forward(const kctx *c, const attn_fused_call *call, attn_error *err) {
    const attn_problem *pr = c->pr;
    const int nt = pr->threads;
    float *ws = call->ws ? call->ws : falloc(dec_total(pr, c->dkp, c->dvp));
    if (!ws) return attn_fail(err, ATTN_ERR_NOMEM, "out of memory for the decode scratch");
    const dws d = dec_carve(c, ws);
    /* The key split is fixed (C keys per chunk, merged in chunk order); only
     * who computes which chunk depends on the shape: with enough K/V heads a
     * work item is a whole group, else single chunks spread over the threads. */
    const int64_t groups = pr->B * pr->Hkv;
    const int whole = groups >= 4 * (int64_t)nt;
    const int64_t items = whole ? groups : groups * d.nch;
#pragma omp parallel num_threads(nt)
    {
        const unsigned fpm = attn_fp_enter();
        const int tid = omp_get_thread_num();
#pragma omp for schedule(dynamic, 1)
        for (int64_t it = 0; it < items; it++) dec_item(c, call, &d, whole, it, tid);
        if (!whole) {
#pragma omp for schedule(static)
            for (int64_t r = 0; r < d.rows; r++)
                dec_merge_row(c, call, r, d.nch, d.pm, d.pl, d.pacc, ws + (int64_t)tid * d.per,
                              d.lsv, d.mrow, d.ilrow);
        }
        attn_fp_leave(fpm);
    }
    if (call->lse) memcpy(call->lse, d.lsv, (size_t)d.rows * sizeof(float));
    if (call->weights) {
#pragma omp parallel num_threads(nt)
        {
            const unsigned fpm = attn_fp_enter();
#pragma omp for schedule(dynamic, 1)
            for (int64_t r = 0; r < d.rows; r++)
                dec_weights_row(c, &d, r, ws + (int64_t)omp_get_thread_num() * d.per,
                                call->weights + r * pr->Lk);
            attn_fp_leave(fpm);
        }
    }
    if (!call->ws) free(ws);
    return ATTN_OK;
}

/* ------------------------------------------------------------ decode backward */

/* a · b over n contiguous floats as VL lane sums then a fixed reduction: the
 * decode backward's dot for both D = dO·O and dP = dO·V, so that a row that
 * sees a single key (O = V) gets dP - D = 0 exactly. */
static inline float dec_vdot(const float *a, const float *b, int64_t n) {
    vf acc = v_zero();
    int64_t d = 0;
    for (; d + VL <= n; d += VL) acc = v_fma(v_load(a + d), v_load(b + d), acc);
    if (d < n) acc = v_fma(v_load_n(a + d, (int)(n - d)), v_load_n(b + d, (int)(n - d)), acc);
    return v_hsum(acc);
}

#define DEC_KB 64 /* keys scored at once in the decode backward */

static int64_t dec_bwd_scratch(const attn_problem *pr, int64_t dkp, int64_t dvp) {
    const int64_t Lq = pr->Lq;
    return Lq * rup(dkp, 16) + 2 * Lq * rup(dvp, 16) + Lq * rup(DEC_KB + VL, 16) + 2 * rup(Lq, 16) +
           rup(dkp, 16) + rup(dvp, 16) + rup(dkp, 16) + rup(dvp, 16) + 64;
}

/* One decode backward work item (head b, h; keys [c0, c1) of chunk ch) in
 * flight. Per thread scratch, carved from dec_bwd_scratch floats:
 *   qr, gr, orow [Lq][ld*] the rows of Q, dO and O, zero-padded
 *   sc [Lq][lds] P of DEC_KB keys    dv_i, ls [Lq] D = dO·O and lse per row
 *   gk, gv: one key's dK, dV    kt, vt: a key's K, V row made contiguous
 * pdq: this item's partial dQ rows [Lq] of [dkp] (in the shared array). */
typedef struct {
    int64_t b, h, ch, c0, c1, ldq, ldg, lds;
    float *qr, *gr, *orow, *sc, *dv_i, *ls, *gk, *gv, *kt, *vt;
    float *pdq; /* row i's partial dQ: pdq + i * pdq_ld */
    int64_t pdq_ld;
} dbitem;

static void dec_bwd_item_init(const kctx *c, const attn_fused_call *call, float *w, float *pdq_all,
                              int64_t it, dbitem *t) {
    const attn_problem *pr = c->pr;
    const int64_t Lq = pr->Lq, dkp = c->dkp, dvp = c->dvp, C = dec_chunk(pr->Lk);
    const int64_t nch = (pr->Lk + C - 1) / C, bh = it / nch;
    t->b = bh / pr->H, t->h = bh % pr->H, t->ch = it % nch;
    t->c0 = t->ch * C, t->c1 = imin(pr->Lk, t->c0 + C);
    t->ldq = rup(dkp, 16), t->ldg = rup(dvp, 16), t->lds = rup(DEC_KB + VL, 16);
    t->qr = carve(&w, Lq * t->ldq), t->gr = carve(&w, Lq * t->ldg);
    t->orow = carve(&w, Lq * t->ldg), t->sc = carve(&w, Lq * t->lds);
    t->dv_i = carve(&w, Lq), t->ls = carve(&w, Lq);
    t->gk = carve(&w, dkp), t->gv = carve(&w, dvp), t->kt = carve(&w, dkp), t->vt = carve(&w, dvp);
    t->pdq =
        pdq_all + (bh * Lq * nch + t->ch) * dkp; /* [rows][nch][dkp]: row bh·Lq + i, chunk ch */
    t->pdq_ld = nch * dkp;
    for (int64_t i = 0; i < Lq; i++) {
        copy_row(t->qr + i * t->ldq, row_of(c->q, t->b, t->h, i), c->q->stride[3], pr->Dk, dkp);
        copy_row(t->gr + i * t->ldg, row_of(call->dout, t->b, t->h, i), call->dout->stride[3],
                 pr->Dv, dvp);
        copy_row(t->orow + i * t->ldg, row_of(call->out, t->b, t->h, i), call->out->stride[3],
                 pr->Dv, dvp);
        t->dv_i[i] = dec_vdot(t->gr + i * t->ldg, t->orow + i * t->ldg, pr->Dv);
        t->ls[i] = call->lse_in[bh * Lq + i];
        memset(t->pdq + i * t->pdq_ld, 0, (size_t)dkp * sizeof(float));
    }
}

/* P of keys [a, e) for every row of the item, row by row (0 where not visible). */
static void dec_bwd_probs(const kctx *c, const dbitem *t, int64_t a, int64_t e) {
    const attn_problem *pr = c->pr;
    const int64_t np = rup(e - a, VL);
    for (int64_t i = 0; i < pr->Lq; i++) {
        float *s = t->sc + i * t->lds;
        int64_t lo, hi;
        attn_row_range(pr, t->b, i, &lo, &hi);
        for (int64_t j = 0; j < np; j++) s[j] = -INFINITY;
        const int64_t a2 = imax(a, lo), e2 = imin(e, hi);
        if (a2 < e2 && t->ls[i] != -INFINITY)
            dec_scores(c, t->qr + i * t->ldq, t->kt, t->b, t->h, i, a2, e2, s + (a2 - a));
        const vf lv = v_set1(t->ls[i]);
        for (int64_t j = 0; j < np; j += VL) {
            const vf x = v_load(s + j);
            v_store(s + j, v_zero_if_eq(v_exp(v_sub(x, lv)), x, kNegInf));
        }
    }
}

/* Key j (in the block starting at a): its dK, dV rows written, its share
 * added to each row's partial dQ. */
static void dec_bwd_key(const kctx *c, const attn_fused_call *call, const dbitem *t, int64_t a,
                        int64_t j) {
    const attn_problem *pr = c->pr;
    const int64_t Lq = pr->Lq, Dk = pr->Dk, Dv = pr->Dv, dkp = c->dkp, dvp = c->dvp;
    const float *kr = row_of(c->k, t->b, t->h, j), *vr = row_of(c->v, t->b, t->h, j);
    if (c->k->stride[3] != 1) {
        copy_row(t->kt, kr, c->k->stride[3], Dk, dkp);
        kr = t->kt;
    }
    if (c->v->stride[3] != 1) {
        copy_row(t->vt, vr, c->v->stride[3], Dv, dvp);
        vr = t->vt;
    }
    memset(t->gk, 0, (size_t)dkp * sizeof(float));
    memset(t->gv, 0, (size_t)dvp * sizeof(float));
    for (int64_t i = 0; i < Lq; i++) {
        const float p = t->sc[i * t->lds + (j - a)];
        if (p == 0.0f) continue; /* not visible (or underflow): no term */
        float z = 1.0f;
        if (pr->dropout) {
            uint32_t wd[4];
            attn_philox_block(pr->drop_key, t->b + pr->drop_b0, t->h, i, j >> 2, wd);
            z = wd[j & 3] < pr->drop_threshold ? 0.0f : pr->keep_scale;
        }
        const float *g = t->gr + i * t->ldg, *q = t->qr + i * t->ldq;
        const float dp = z * dec_vdot(g, vr, Dv);
        const float ds = pr->scale * p * (dp - t->dv_i[i]);
        const float pz = p * z;
        if (pz != 0.0f) {
            const vf pv = v_set1(pz);
            for (int64_t d = 0; d < dvp; d += VL)
                v_store(t->gv + d, v_fma(pv, v_load(g + d), v_load(t->gv + d)));
        }
        const vf dsv = v_set1(ds);
        float *dq = t->pdq + i * t->pdq_ld;
        int64_t d = 0;
        for (; d + VL <= Dk; d += VL) {
            v_store(t->gk + d, v_fma(dsv, v_load(q + d), v_load(t->gk + d)));
            v_store(dq + d, v_fma(dsv, v_load(kr + d), v_load(dq + d)));
        }
        if (d < Dk) {
            v_store(t->gk + d, v_fma(dsv, v_load(q + d), v_load(t->gk + d)));
            v_store(dq + d, v_fma(dsv, v_load_n(kr + d, (int)(Dk - d)), v_load(dq + d)));
        }
    }
    write_rows(call->dk, t->b, t->h, j, 1, Dk, t->gk, dkp);
    write_rows(call->dv, t->b, t->h, j, 1, Dv, t->gv, dvp);
}

/* Backward for Lq <= FUSED_DECODE_MAXLQ: one work item per (b, h, key
 * chunk) writes that chunk's dK, dV rows and a partial dQ; the partials are
 * summed in chunk order afterwards (deterministic for any thread count). */
static attn_status dec_backward(const kctx *c, const attn_fused_call *call, attn_error *err) {
    const attn_problem *pr = c->pr;
    const int64_t B = pr->B, H = pr->H, Lq = pr->Lq, dkp = c->dkp;
    const int64_t C = dec_chunk(pr->Lk), nch = (pr->Lk + C - 1) / C, rows = B * H * Lq;
    const int nt = pr->threads;
    const int64_t per = dec_bwd_scratch(pr, dkp, c->dvp);
    float *ws = falloc(nt * per + rows * nch * dkp);
    if (!ws) return attn_fail(err, ATTN_ERR_NOMEM, "out of memory for the decode backward scratch");
    float *pdq = ws + nt * per; /* [rows][nch][dkp] partial dQ */
    const int64_t items = B * H * nch;
    int64_t grain = items / (8 * (int64_t)nt); /* scheduling only: results unaffected */
    grain = grain < 1 ? 1 : grain > nch ? nch : grain;
#pragma omp parallel num_threads(nt)
    {
        const unsigned fpm = attn_fp_enter();
#pragma omp for schedule(dynamic, grain)
        for (int64_t it = 0; it < items; it++) {
            dbitem t;
            dec_bwd_item_init(c, call, ws + (int64_t)omp_get_thread_num() * per, pdq, it, &t);
            for (int64_t a = t.c0; a < t.c1; a += DEC_KB) {
                const int64_t e = imin(t.c1, a + DEC_KB);
                dec_bwd_probs(c, &t, a, e);
                for (int64_t j = a; j < e; j++) dec_bwd_key(c, call, &t, a, j);
            }
        }
        /* dQ: the chunks' partials in chunk order */
#pragma omp for schedule(static)
        for (int64_t r = 0; r < rows; r++) {
            const int64_t bh = r / Lq, i = r % Lq, b = bh / H, h = bh % H;
            float *acc = pdq + r * nch * dkp; /* chunk 0's partial accumulates the rest */
            for (int64_t ch = 1; ch < nch; ch++)
                for (int64_t d = 0; d < dkp; d += VL)
                    v_store(acc + d, v_add(v_load(acc + d), v_load(acc + ch * dkp + d)));
            write_rows(call->dq, b, h, i, 1, pr->Dk, acc, dkp);
        }
        attn_fp_leave(fpm);
    }
    free(ws);
    return ATTN_OK;
}

#endif
