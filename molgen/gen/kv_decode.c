/* molgen KV-cache decoding (see kv_decode.h). */
#include "gen/kv_decode.h"
#include "base/errors.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attn.h"
#include "nn/packed_gemm.h"
#include "nn/layers.h"

typedef struct {
    const float *ln1_w, *ln1_b, *ln2_w, *ln2_b, *fc_b, *proj_b;
    const float *in_b, *out_b;
    mg_packed *in_w, *out_w, *fc, *proj; /* the block's weights, packed at mg_kv_new (packed_gemm.h) */
    void *k, *v; /* [B, ctx, d] each (float, or bf16 under MG_DT_BF16): position t of row r at
                  * (r * ctx + t) * d */
} kv_layer;

struct mg_kv_decoder {
    mg_model *m;
    int B, n;
    int nt; /* threads of every step */
    mg_dtype dt;
    int N, d, H, V, ctx;
    const float *tok_emb, *pos_emb, *lnf_w, *lnf_b, *head_w, *head_b;
    kv_layer *layers;
    mg_packed *head;
    int64_t *len;  /* [B] positions held by each row (the same in every block) */
    int64_t *klen; /* [B] a step's key lengths: len + 1 */
    void *kvmem;   /* every block's keys and values, one allocation */
    uint16_t *qb;  /* [B, d] a step's queries in bf16 (MG_DT_BF16) */
    float *mem;    /* everything below, one allocation */
    float *x, *h, *qkv, *att, *tmp, *fc;
    float *cond;   /* [cond_n, K] rows' conditions (mg_kv_set_conditions; 0: none) */
    int cond_n;
};

static const float *param(mg_model *m, const char *name, size_t numel, mg_error *err, int *bad) {
    const mg_param_info *t = mg_model_find_tensor(m, name);
    if (!t || t->numel != numel) {
        if (!*bad)
            mg_fail(err, MG_ERR_ARG, "decode: model has no tensor '%s' of %zu floats", name, numel);
        *bad = 1;
        return NULL;
    }
    return mg_model_params(m) + t->offset;
}

mg_status mg_kv_new(mg_model *m, int B, int threads, mg_kv_decoder **out, mg_error *err) {
    return mg_kv_new_dtype(m, B, threads, MG_DT_F32, out, err);
}

/* Block l's tensors (views of the model's parameters; the products'
 * weights packed in d->dt) and its slice of the KV cache (per_block
 * elements of el bytes for keys, then values). A tensor missing or out of
 * place sets *bad (the message in err); a packing failure is returned. */
static mg_status kv_layer_setup(mg_kv_decoder *d, int l, size_t per_block, size_t el, int *bad,
                                mg_error *err) {
    const size_t D = (size_t)d->d, F = 4 * D;
    const mg_dtype dt = d->dt;
    kv_layer *L = &d->layers[l];
    char name[96];
#define P(lhs, suffix, numel)                                                                      \
    do {                                                                                           \
        snprintf(name, sizeof name, "blocks.%d.%s", l, suffix);                                    \
        lhs = param(d->m, name, numel, err, bad);                                                  \
    } while (0)
    const float *in_w, *in_b, *out_w, *out_b, *fc_w, *proj_w;
    P(L->ln1_w, "ln1.weight", D);
    P(L->ln1_b, "ln1.bias", D);
    P(in_w, "attn.in_proj_weight", 3 * D * D);
    P(in_b, "attn.in_proj_bias", 3 * D);
    P(out_w, "attn.out_proj.weight", D * D);
    P(out_b, "attn.out_proj.bias", D);
    P(L->ln2_w, "ln2.weight", D);
    P(L->ln2_b, "ln2.bias", D);
    P(fc_w, "mlp.fc.weight", F * D);
    P(L->fc_b, "mlp.fc.bias", F);
    P(proj_w, "mlp.proj.weight", D * F);
    P(L->proj_b, "mlp.proj.bias", D);
#undef P
    if (*bad) return MG_OK;
    /* the four attention tensors, back to back as the model's table
     * lays them out: the block mg_attn_in_proj and model.c read */
    if (in_b != in_w + 3 * D * D || out_w != in_b + 3 * D || out_b != out_w + D * D) {
        mg_fail(err, MG_ERR_ARG, "decode: block %d's attention tensors are not packed", l);
        *bad = 1;
        return MG_OK;
    }
    L->in_b = in_b;
    L->out_b = out_b;
    mg_status prc;
    if ((prc = mg_packed_new(in_w, 3 * (int)D, (int)D, dt, &L->in_w, err)) ||
        (prc = mg_packed_new(out_w, (int)D, (int)D, dt, &L->out_w, err)) ||
        (prc = mg_packed_new(fc_w, (int)F, (int)D, dt, &L->fc, err)) ||
        (prc = mg_packed_new(proj_w, (int)D, (int)F, dt, &L->proj, err)))
        return prc;
    L->k = (char *)d->kvmem + (size_t)l * 2 * per_block * el;
    L->v = (char *)L->k + per_block * el;
    return MG_OK;
}

/* d's work buffers, carved from d->mem. */
static void kv_carve(mg_kv_decoder *d) {
    const size_t B = (size_t)d->B, D = (size_t)d->d;
    float *p = d->mem;
    d->x = p;
    p += B * D;
    d->h = p;
    p += B * D;
    d->qkv = p;
    p += B * 3 * D;
    d->att = p;
    p += B * D;
    d->tmp = p;
    p += B * D;
    d->fc = p;
}

mg_status mg_kv_new_dtype(mg_model *m, int B, int threads, mg_dtype dt, mg_kv_decoder **out,
                          mg_error *err) {
    if (!m || !out) return mg_fail(err, MG_ERR_ARG, "decode: model and out must be non-NULL");
    *out = NULL;
    const mg_model_config *c = mg_model_get_config(m);
    if (B < 1) return mg_fail(err, MG_ERR_ARG, "decode: batch %d < 1", B);
    if (c->no_causal_mask)
        return mg_fail(err, MG_ERR_ARG,
                       "decode: a KV cache needs a causal model (this one has no causal mask)");
    mg_kv_decoder *d = calloc(1, sizeof *d);
    if (!d) return mg_fail(err, MG_ERR_NOMEM, "decode: out of memory");
    d->m = m;
    d->B = B;
    d->dt = dt;
    d->nt = threads > 0 ? threads : mg_model_threads(m);
    d->N = c->n_layer;
    d->d = c->d_model;
    d->H = c->n_head;
    d->V = c->vocab_size;
    d->ctx = c->ctx_len;
    const size_t D = (size_t)d->d, F = 4 * D, V = (size_t)d->V;
    int bad = 0;
    d->tok_emb = param(m, "tok_emb.weight", V * D, err, &bad);
    d->pos_emb = param(m, "pos_emb.weight", (size_t)d->ctx * D, err, &bad);
    d->lnf_w = param(m, "ln_f.weight", D, err, &bad);
    d->lnf_b = param(m, "ln_f.bias", D, err, &bad);
    d->head_w = param(m, "head.weight", V * D, err, &bad);
    d->head_b = param(m, "head.bias", V, err, &bad);
    d->layers = calloc((size_t)d->N, sizeof *d->layers);
    /* one KV cache per block: ctx_len positions per row */
    const size_t per_block = (size_t)B * (size_t)d->ctx * D;
    size_t kvfloats;
    if (__builtin_mul_overflow(per_block, 2 * (size_t)d->N, &kvfloats) ||
        kvfloats > SIZE_MAX / sizeof(float)) {
        mg_kv_free(d);
        return mg_fail(err, MG_ERR_NOMEM,
                       "decode: a KV cache of %d rows x %d positions x %d blocks is too large", B,
                       d->ctx, d->N);
    }
    if (dt != MG_DT_F32 && dt != MG_DT_BF16) {
        mg_kv_free(d);
        return mg_fail(err, MG_ERR_ARG, "decode: unknown dtype %d", (int)dt);
    }
    const size_t el = dt == MG_DT_BF16 ? sizeof(uint16_t) : sizeof(float);
    const size_t total = (size_t)B * (D * 7 + F);
    d->mem = calloc(total, sizeof(float));
    d->kvmem = calloc(kvfloats, el); /* keys past a row's length: finite (zero) */
    d->qb = calloc((size_t)B * D, sizeof(uint16_t));
    d->len = calloc((size_t)B, sizeof *d->len);
    d->klen = calloc((size_t)B, sizeof *d->klen);
    if (!d->layers || !d->mem || !d->kvmem || !d->qb || !d->len || !d->klen) {
        mg_kv_free(d);
        return mg_fail(err, MG_ERR_NOMEM,
                       "decode: out of memory (%zu floats, %zu floats of KV cache)", total,
                       kvfloats);
    }
    for (int l = 0; l < d->N && !bad; l++) {
        mg_status prc = kv_layer_setup(d, l, per_block, el, &bad, err);
        if (prc) {
            mg_kv_free(d);
            return prc;
        }
    }
    if (!bad) {
        mg_status prc = mg_packed_new(d->head_w, d->V, (int)D, dt, &d->head, err);
        if (prc) {
            mg_kv_free(d);
            return prc;
        }
    }
    if (bad) {
        mg_kv_free(d);
        return MG_ERR_FORMAT;
    }
    kv_carve(d);
    d->n = 0;
    *out = d;
    return 0;
}

void mg_kv_free(mg_kv_decoder *d) {
    if (!d) return;
    for (int l = 0; d->layers && l < d->N; l++) {
        kv_layer *L = &d->layers[l];
        mg_packed_free(L->in_w);
        mg_packed_free(L->out_w);
        mg_packed_free(L->fc);
        mg_packed_free(L->proj);
    }
    mg_packed_free(d->head);
    free(d->qb);
    free(d->cond);
    free(d->layers);
    free(d->mem);
    free(d->kvmem);
    free(d->len);
    free(d->klen);
    free(d);
}

/* Row r's positions in every block's cache: from 0. */
static void restart(mg_kv_decoder *d, int r) { d->len[r] = 0; }

mg_status mg_kv_reset(mg_kv_decoder *d, int n, mg_error *err) {
    if (!d) return mg_fail(err, MG_ERR_ARG, "decode: decoder is NULL");
    if (n < 1 || n > d->B) return mg_fail(err, MG_ERR_ARG, "decode: %d rows, need 1..%d", n, d->B);
    d->n = n;
    for (int r = 0; r < n; r++) restart(d, r);
    return 0;
}

mg_status mg_kv_set_conditions(mg_kv_decoder *d, const float *cond, int n, mg_error *err) {
    if (!d) return mg_fail(err, MG_ERR_ARG, "decode: decoder is NULL");
    return mg_model_keep_conditions(d->m, cond, n, d->B, &d->cond, &d->cond_n, err);
}

mg_status mg_kv_restart_row(mg_kv_decoder *d, int r, mg_error *err) {
    if (!d) return mg_fail(err, MG_ERR_ARG, "decode: decoder is NULL");
    if (r < 0 || r >= d->n)
        return mg_fail(err, MG_ERR_ARG, "decode: row %d is outside [0, %d)", r, d->n);
    restart(d, r);
    return 0;
}

int mg_kv_pos(const mg_kv_decoder *d, int r) {
    return d && r >= 0 && r < d->n ? (int)d->len[r] : 0;
}

/* Block L's attention on the step's rows: tmp [n, d] from h [n, d] =
 * ln1's output at each row's position len[r]. qkv = h in_projᵀ + b and
 * tmp = att out_projᵀ + b through the packed weights; the new key and value
 * go into the block's cache at len[r] (rounded to bf16 under MG_DT_BF16,
 * with the queries), and libattn's SDPA (its fused decode kernel, one query
 * per row) attends over the row's len[r] + 1 cached positions. */
static mg_status attention_step(mg_kv_decoder *d, const kv_layer *L, mg_error *err) {
    const int n = d->n, D = d->d, H = d->H, dk = D / H;
    const int64_t T = d->ctx;
    const int bf = d->dt == MG_DT_BF16;
    mg_status rc = mg_packed_forward(d->qkv, d->h, n, L->in_w, L->in_b, d->nt, err);
    if (rc) return rc;
    int64_t Lk = 1;
    for (int r = 0; r < n; r++) {
        const size_t at = (size_t)(r * T + d->len[r]) * D;
        const float *row = d->qkv + (size_t)r * 3 * D;
        if (bf) {
            attn_bf16_from_f32(row, d->qb + (size_t)r * D, (size_t)D);
            attn_bf16_from_f32(row + D, (uint16_t *)L->k + at, (size_t)D);
            attn_bf16_from_f32(row + 2 * D, (uint16_t *)L->v + at, (size_t)D);
        } else {
            memcpy((float *)L->k + at, row + D, (size_t)D * sizeof(float));
            memcpy((float *)L->v + at, row + 2 * D, (size_t)D * sizeof(float));
        }
        d->klen[r] = d->len[r] + 1;
        if (d->klen[r] > Lk) Lk = d->klen[r];
    }
    /* q [n, H, 1, dk] inside the rows of qkv (fp32) or qb (bf16); k, v
     * [n, H, Lk, dk] in the cache; the key lengths are the mask (one query
     * per row: causal is the same mask) */
    attn_tensor q = {d->qkv, {n, H, 1, dk}, {3 * D, dk, 3 * D, 1}};
    if (bf) q = (attn_tensor){(float *)d->qb, {n, H, 1, dk}, {D, dk, D, 1}};
    attn_tensor k = {(float *)L->k, {n, H, Lk, dk}, {T * D, dk, D, 1}};
    attn_tensor v = {(float *)L->v, {n, H, Lk, dk}, {T * D, dk, D, 1}};
    attn_tensor o = attn_tensor_blhd(d->att, n, H, 1, dk);
    attn_sdpa_params p;
    memset(&p, 0, sizeof p);
    p.causal = 1;
    p.key_lengths = d->klen;
    p.num_threads = d->nt;
    p.dtype = bf ? ATTN_BF16 : ATTN_F32;
    p.out_dtype = ATTN_F32; /* the output stays fp32 (0 would follow dtype) */
    attn_error e;
    if (attn_sdpa_forward(&q, &k, &v, &p, &o, NULL, NULL, NULL, &e))
        return mg_fail(err, mg_from_attn(e.status), "%s", e.message);
    return mg_packed_forward(d->tmp, d->att, n, L->out_w, L->out_b, d->nt, err);
}

mg_status mg_kv_step(mg_kv_decoder *d, const int32_t *tok, float *logits, mg_error *err) {
    if (!d || !tok || !logits)
        return mg_fail(err, MG_ERR_ARG, "decode: decoder, tokens and logits must be non-NULL");
    if (d->n < 1) return mg_fail(err, MG_ERR_ARG, "decode: step before reset");
    const int n = d->n, D = d->d, F = 4 * D, ctx = d->ctx;
    for (int b = 0; b < n; b++) {
        const int pos = mg_kv_pos(d, b);
        if (pos >= ctx)
            return mg_fail(err, MG_ERR_ARG, "decode: row %d: position %d is past ctx_len %d", b,
                           pos, ctx);
    }
    const int nt = d->nt;
    const mg_model_config *cc = mg_model_get_config(d->m);

    for (int b = 0; b < n; b++) {
        if (tok[b] < 0 || tok[b] >= d->V)
            return mg_fail(err, MG_ERR_ARG, "decode: token[%d] = %d is outside [0, %d)", b,
                           (int)tok[b], d->V);
        const float *te = d->tok_emb + (size_t)tok[b] * D;
        const float *pe = d->pos_emb + (size_t)mg_kv_pos(d, b) * D;
        float *x = d->x + (size_t)b * D;
        for (int c = 0; c < D; c++) x[c] = te[c] + pe[c];
        if (cc->n_cond > 0 && (!cc->cond_bos || mg_kv_pos(d, b) == 0)) { /* condition.h */
            float *e = d->tmp + (size_t)b * D;
            const int K = cc->n_cond;
            mg_model_condition_embedding(
                d->m, d->cond_n ? d->cond + (size_t)(d->cond_n == 1 ? 0 : b) * K : NULL, e);
            for (int c = 0; c < D; c++) x[c] += e[c];
        }
    }
    mg_status rc;
    for (int l = 0; l < d->N; l++) {
        kv_layer *L = &d->layers[l];
        mg_layernorm_forward(d->h, NULL, NULL, d->x, L->ln1_w, L->ln1_b, n, D, nt);
        mg_error e;
        if ((rc = attention_step(d, L, &e)))
            return mg_fail(err, rc, "decode: block %d attention: %s", l, e.message);
        for (size_t i = 0; i < (size_t)n * D; i++) d->x[i] = d->x[i] + d->tmp[i];
        mg_layernorm_forward(d->h, NULL, NULL, d->x, L->ln2_w, L->ln2_b, n, D, nt);
        if ((rc = mg_packed_forward(d->fc, d->h, n, L->fc, L->fc_b, nt, err))) return rc;
        mg_gelu_forward(d->fc, d->fc, NULL, n, F, nt);
        if ((rc = mg_packed_forward(d->tmp, d->fc, n, L->proj, L->proj_b, nt, err)))
            return rc;
        for (size_t i = 0; i < (size_t)n * D; i++) d->x[i] = d->x[i] + d->tmp[i];
    }
    for (int b = 0; b < n; b++) d->len[b]++;
    mg_layernorm_forward(d->h, NULL, NULL, d->x, d->lnf_w, d->lnf_b, n, D, nt);
    return mg_packed_forward(logits, d->h, n, d->head, d->head_b, nt, err);
}
