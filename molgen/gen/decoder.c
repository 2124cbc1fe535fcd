/* molgen's decoder (see decoder.h). */
#include "gen/decoder.h"

#include <stdlib.h>
#include <string.h>

#include "chem/tokenizer.h" /* MG_PAD */
#include "gen/kv_decode.h"

const char *mg_decode_kind_name(mg_decode_kind k) {
    return k == MG_DECODE_KV ? "kv" : k == MG_DECODE_NAIVE ? "naive" : "?";
}

struct mg_decoder {
    mg_decode_kind kind;
    mg_model *m;
    int B, n, V, ctx;
    int *pos; /* [B] (naive) */
    mg_kv_decoder *kv;
    /* naive */
    int32_t *hist;   /* [B, ctx] tokens so far */
    int32_t *prefix; /* [B, ctx] packed [n, L] */
    int64_t *len;    /* [B] */
    float *full;     /* [B, ctx, V] */
    float *cond;     /* [cond_n, K] the rows' conditions (cond_n 0: none) */
    int cond_n;
};

mg_status mg_decoder_new_on(mg_model *m, mg_decode_kind kind, mg_dtype dt, int B, int threads,
                            mg_decoder **out, mg_error *err) {
    if (!m || !out) return mg_fail(err, MG_ERR_ARG, "decoder: model and out must be non-NULL");
    *out = NULL;
    if (B < 1) return mg_fail(err, MG_ERR_ARG, "decoder: batch %d < 1", B);
    if (kind != MG_DECODE_NAIVE && kind != MG_DECODE_KV)
        return mg_fail(err, MG_ERR_ARG, "decoder: unknown kind %d", (int)kind);
    const mg_model_config *c = mg_model_get_config(m);
    mg_decoder *d = calloc(1, sizeof *d);
    if (!d) return mg_fail(err, MG_ERR_NOMEM, "decoder: out of memory");
    d->kind = kind;
    d->m = m;
    d->B = B;
    d->V = c->vocab_size;
    d->ctx = c->ctx_len;
    if (kind == MG_DECODE_KV) {
        mg_status rc = mg_kv_new_dtype(m, B, threads, dt, &d->kv, err);
        if (rc) {
            free(d);
            return rc;
        }
    } else {
        const size_t cells = (size_t)B * (size_t)d->ctx;
        d->pos = calloc((size_t)B, sizeof *d->pos);
        d->len = calloc((size_t)B, sizeof *d->len);
        d->hist = malloc(cells * sizeof *d->hist);
        d->prefix = malloc(cells * sizeof *d->prefix);
        d->full = malloc(cells * (size_t)d->V * sizeof *d->full);
        if (!d->pos || !d->len || !d->hist || !d->prefix || !d->full) {
            mg_decoder_free(d);
            return mg_fail(err, MG_ERR_NOMEM, "decoder: out of memory");
        }
    }
    *out = d;
    return 0;
}

mg_status mg_decoder_new(mg_model *m, mg_decode_kind kind, int B, mg_decoder **out, mg_error *err) {
    return mg_decoder_new_on(m, kind, MG_DT_F32, B, 0, out, err);
}

void mg_decoder_free(mg_decoder *d) {
    if (!d) return;
    mg_kv_free(d->kv);
    free(d->pos);
    free(d->len);
    free(d->hist);
    free(d->prefix);
    free(d->full);
    free(d->cond);
    free(d);
}

mg_status mg_decoder_reset(mg_decoder *d, int n, mg_error *err) {
    if (!d) return mg_fail(err, MG_ERR_ARG, "decoder is NULL");
    if (n < 1 || n > d->B) return mg_fail(err, MG_ERR_ARG, "decoder: %d rows, need 1..%d", n, d->B);
    d->n = n;
    if (d->kv) return mg_kv_reset(d->kv, n, err);
    for (int r = 0; r < n; r++) d->pos[r] = 0;
    return 0;
}

mg_status mg_decoder_set_conditions(mg_decoder *d, const float *cond, int n, mg_error *err) {
    if (!d) return mg_fail(err, MG_ERR_ARG, "decoder is NULL");
    if (d->kv) return mg_kv_set_conditions(d->kv, cond, n, err);
    return mg_model_keep_conditions(d->m, cond, n, d->B, &d->cond, &d->cond_n, err);
}

mg_status mg_decoder_restart_row(mg_decoder *d, int r, mg_error *err) {
    if (!d) return mg_fail(err, MG_ERR_ARG, "decoder is NULL");
    if (r < 0 || r >= d->n)
        return mg_fail(err, MG_ERR_ARG, "decoder: row %d is outside [0, %d)", r, d->n);
    if (d->kv) return mg_kv_restart_row(d->kv, r, err);
    d->pos[r] = 0;
    return 0;
}

int mg_decoder_pos(const mg_decoder *d, int r) {
    if (!d || r < 0 || r >= d->n) return 0;
    return d->kv ? mg_kv_pos(d->kv, r) : d->pos[r];
}

mg_status mg_decoder_step(mg_decoder *d, const int32_t *tok, float *logits, mg_error *err) {
    if (!d || !tok || !logits)
        return mg_fail(err, MG_ERR_ARG, "decoder, tokens and logits must be non-NULL");
    if (d->n < 1) return mg_fail(err, MG_ERR_STATE, "decoder: step before reset");
    if (d->kv) return mg_kv_step(d->kv, tok, logits, err);
    const int n = d->n, V = d->V, ctx = d->ctx;
    int L = 0;
    for (int b = 0; b < n; b++) {
        if (d->pos[b] >= ctx)
            return mg_fail(err, MG_ERR_ARG, "decoder: row %d: position %d is past ctx_len %d", b,
                           d->pos[b], ctx);
        if (d->pos[b] + 1 > L) L = d->pos[b] + 1;
    }
    /* rows shorter than L are key-padded: with the causal mask their
     * positions < length never see the padding */
    for (int b = 0; b < n; b++) {
        const int lb = d->pos[b] + 1;
        d->hist[(size_t)b * ctx + d->pos[b]] = tok[b];
        memcpy(d->prefix + (size_t)b * L, d->hist + (size_t)b * ctx, (size_t)lb * sizeof(int32_t));
        for (int t = lb; t < L; t++) d->prefix[(size_t)b * L + t] = MG_PAD;
        d->len[b] = lb;
    }
    mg_batch bt = {.ids = d->prefix, .lengths = d->len, .B = n, .T = L, .cond = d->cond};
    bt.cond_rows = d->cond_n == 1 ? 1 : d->cond_n ? n : 0; /* rows 0 .. n-1, or the one of all */
    mg_status rc = mg_model_logits(d->m, &bt, d->full, NULL, err);
    if (rc) return rc;
    for (int b = 0; b < n; b++) {
        memcpy(logits + (size_t)b * V, d->full + ((size_t)b * L + (size_t)d->pos[b]) * V,
               (size_t)V * sizeof(float));
        d->pos[b]++;
    }
    return 0;
}
