/* molgen KV-cache decoding (see decode.h). */
#include "decode.h"
#include "errors.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attn.h"
#include "layers.h"

typedef struct {
    const float *ln1_w, *ln1_b, *ln2_w, *ln2_b, *fc_w, *fc_b, *proj_w, *proj_b;
    attn_mha_weights w; /* views of attn.in_proj_* / attn.out_proj.* */
    attn_mha_kv kv;     /* the block's KV cache (libattn's layout, in kvmem) */
} kv_layer;

struct mg_kv_decoder {
    mg_model *m;
    int B, n;
    int nt; /* threads of every step */
    int N, d, H, V, ctx;
    attn_mha_config cfg;
    const float *tok_emb, *pos_emb, *lnf_w, *lnf_b, *head_w, *head_b;
    kv_layer *layers;
    void *kvmem; /* every block's KV cache, one allocation */
    float *mem;  /* everything below, one allocation */
    float *x, *h, *att, *tmp, *fc;
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
    d->cfg = (attn_mha_config){d->d, d->H, 0, 0, 1};
    /* one KV cache per block: ctx_len positions per row, one per step,
     * scratch for the model's threads */
    attn_mha_kv_shape ks = {B, d->ctx, 1, d->nt};
    size_t kvbytes = 0;
    attn_error aerr;
    if (attn_mha_kv_bytes(&d->cfg, &ks, &kvbytes, &aerr)) {
        mg_kv_free(d);
        return mg_fail(err, MG_ERR_ARG, "decode: KV cache: %s", aerr.message);
    }
    const size_t total = (size_t)B * (D * 4 + F);
    d->mem = calloc(total, sizeof(float));
    d->kvmem = malloc(kvbytes * (size_t)d->N);
    if (!d->layers || !d->mem || !d->kvmem) {
        mg_kv_free(d);
        return mg_fail(err, MG_ERR_NOMEM,
                       "decode: out of memory (%zu floats, %zu bytes of KV cache)", total,
                       kvbytes * (size_t)d->N);
    }
    for (int l = 0; l < d->N && !bad; l++) {
        kv_layer *L = &d->layers[l];
        char name[96];
#define P(lhs, suffix, numel)                                                                      \
    do {                                                                                           \
        snprintf(name, sizeof name, "blocks.%d.%s", l, suffix);                                    \
        lhs = param(m, name, numel, err, &bad);                                                    \
    } while (0)
        const float *in_w, *in_b, *out_w, *out_b;
        P(L->ln1_w, "ln1.weight", D);
        P(L->ln1_b, "ln1.bias", D);
        P(in_w, "attn.in_proj_weight", 3 * D * D);
        P(in_b, "attn.in_proj_bias", 3 * D);
        P(out_w, "attn.out_proj.weight", D * D);
        P(out_b, "attn.out_proj.bias", D);
        P(L->ln2_w, "ln2.weight", D);
        P(L->ln2_b, "ln2.bias", D);
        P(L->fc_w, "mlp.fc.weight", F * D);
        P(L->fc_b, "mlp.fc.bias", F);
        P(L->proj_w, "mlp.proj.weight", D * F);
        P(L->proj_b, "mlp.proj.bias", D);
#undef P
        if (bad) break;
        /* PyTorch's layout: in_proj stacks q, k, v (libattn reads them
         * through these pointers and never writes them) */
        float *iw = (float *)in_w, *ib = (float *)in_b;
        L->w = (attn_mha_weights){iw, iw + D * D, iw + 2 * D * D, (float *)out_w,
                                  ib, ib + D,     ib + 2 * D,     (float *)out_b};
        if (attn_mha_kv_init(&d->cfg, &ks, (char *)d->kvmem + (size_t)l * kvbytes, kvbytes, &L->kv,
                             &aerr)) {
            mg_kv_free(d);
            return mg_fail(err, MG_ERR_ARG, "decode: KV cache: %s", aerr.message);
        }
    }
    if (bad) {
        mg_kv_free(d);
        return MG_ERR_FORMAT;
    }
    float *p = d->mem;
    d->x = p;
    p += (size_t)B * D;
    d->h = p;
    p += (size_t)B * D;
    d->att = p;
    p += (size_t)B * D;
    d->tmp = p;
    p += (size_t)B * D;
    d->fc = p;
    d->n = 0;
    *out = d;
    return 0;
}

void mg_kv_free(mg_kv_decoder *d) {
    if (!d) return;
    free(d->layers);
    free(d->mem);
    free(d->kvmem);
    free(d);
}

/* Row r's positions in every block's cache: from 0 (same in all blocks). */
static void restart(mg_kv_decoder *d, int r) {
    for (int l = 0; l < d->N; l++) d->layers[l].kv.len[r] = 0;
}

mg_status mg_kv_reset(mg_kv_decoder *d, int n, mg_error *err) {
    if (!d) return mg_fail(err, MG_ERR_ARG, "decode: decoder is NULL");
    if (n < 1 || n > d->B) return mg_fail(err, MG_ERR_ARG, "decode: %d rows, need 1..%d", n, d->B);
    d->n = n;
    for (int r = 0; r < n; r++) restart(d, r);
    return 0;
}

mg_status mg_kv_restart_row(mg_kv_decoder *d, int r, mg_error *err) {
    if (!d) return mg_fail(err, MG_ERR_ARG, "decode: decoder is NULL");
    if (r < 0 || r >= d->n)
        return mg_fail(err, MG_ERR_ARG, "decode: row %d is outside [0, %d)", r, d->n);
    restart(d, r);
    return 0;
}

int mg_kv_pos(const mg_kv_decoder *d, int r) {
    return d && r >= 0 && r < d->n && d->N > 0 ? (int)d->layers[0].kv.len[r] : 0;
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
            mg_model_condition_embedding(d->m, b, e);
            for (int c = 0; c < D; c++) x[c] += e[c];
        }
    }
    attn_sdpa_params ap;
    memset(&ap, 0, sizeof ap);
    ap.num_threads = nt;
    attn_error aerr;
    for (int l = 0; l < d->N; l++) {
        kv_layer *L = &d->layers[l];
        mg_layernorm_forward(d->h, NULL, NULL, d->x, L->ln1_w, L->ln1_b, n, D, nt);
        /* libattn's incremental step: projections, the new keys and values
         * into the block's cache, the decode kernel over each row's cached
         * positions, the output projection */
        if (attn_mha_step(&d->cfg, &L->w, &L->kv, n, 1, d->h, &ap, d->att, &aerr))
            return mg_fail(err, MG_ERR_ARG, "decode: block %d attention: %s", l, aerr.message);
        for (size_t i = 0; i < (size_t)n * D; i++) d->x[i] = d->x[i] + d->att[i];
        mg_layernorm_forward(d->h, NULL, NULL, d->x, L->ln2_w, L->ln2_b, n, D, nt);
        mg_matmul_forward(d->fc, d->h, L->fc_w, L->fc_b, n, D, F, nt);
        mg_gelu_forward(d->fc, d->fc, (int64_t)n * F, nt);
        mg_matmul_forward(d->tmp, d->fc, L->proj_w, L->proj_b, n, F, D, nt);
        for (size_t i = 0; i < (size_t)n * D; i++) d->x[i] = d->x[i] + d->tmp[i];
    }
    mg_layernorm_forward(d->h, NULL, NULL, d->x, d->lnf_w, d->lnf_b, n, D, nt);
    mg_matmul_forward(logits, d->h, d->head_w, d->head_b, n, D, d->V, nt);
    return 0;
}
