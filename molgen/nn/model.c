/* molgen model: forward and backward of a GPT-2-style decoder (see model.h).
 *
 * Written in the style of llm.c's train_gpt2.c: each layer's forward sits
 * next to its backward, every buffer carries its shape, all parameters are
 * one buffer and all gradients another with the same layout. Linear layers
 * are layers.h's (y = x Wᵀ + b, PyTorch's layout, through libattn's
 * attn_matmul; the attention projections are layers.h's too, the code
 * kv_decode.c runs), attention itself libattn's packed
 * attn_sdpa_varlen_forward / attn_sdpa_varlen_backward, dropout libattn's
 * Philox (attn_dropout_mask).
 *
 * Shapes: B batch rows, L positions, d = d_model, F = 4d (MLP hidden),
 * V vocabulary, H heads, R = B*L rows of the flattened activations. */
#define _DEFAULT_SOURCE /* madvise, MADV_HUGEPAGE (-std=c11 hides them) */
#include "nn/model.h"
#include "base/errors.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "attn.h"
#include "nn/ckpt_values.h"
#include "chem/condition.h"
#include "nn/packed_gemm.h"
#include "base/json.h"
#include "nn/layers.h"
#include "base/util.h"

#ifdef _OPENMP
#include <omp.h>
#endif

/* ------------------------------------------------------------ config */

void mg_model_config_default(mg_model_config *c) {
    memset(c, 0, sizeof *c);
    c->n_layer = 4;
    c->d_model = 128;
    c->n_head = 4;
}

void mg_model_config_molgpt(mg_model_config *c) {
    memset(c, 0, sizeof *c);
    c->n_layer = 8;
    c->d_model = 256;
    c->n_head = 8;
    c->dropout = 0.1f;
}

mg_status mg_model_config_check(const mg_model_config *c, mg_error *err) {
    if (!c) return mg_fail(err, MG_ERR_ARG, "model config is NULL");
    if (c->n_layer < 1 || c->n_layer > 1024)
        return mg_fail(err, MG_ERR_ARG, "n_layer %d must be in [1, 1024]", c->n_layer);
    if (c->d_model < 1 || c->d_model > 65536)
        return mg_fail(err, MG_ERR_ARG, "d_model %d must be in [1, 65536]", c->d_model);
    if (c->n_head < 1 || c->d_model % c->n_head)
        return mg_fail(err, MG_ERR_ARG, "n_head %d must be >= 1 and divide d_model %d", c->n_head,
                       c->d_model);
    if (c->ctx_len < 1 || c->ctx_len > 65536)
        return mg_fail(err, MG_ERR_ARG, "ctx_len %d must be in [1, 65536]", c->ctx_len);
    if (c->vocab_size < 1 || c->vocab_size > (1 << 24))
        return mg_fail(err, MG_ERR_ARG, "vocab_size %d must be in [1, 2^24]", c->vocab_size);
    if (!(c->dropout >= 0.0f && c->dropout < 1.0f))
        return mg_fail(err, MG_ERR_ARG, "dropout %g must be in [0, 1)", (double)c->dropout);
    if (c->n_cond < 0 || c->n_cond > MG_COND_MAX || (c->cond_bos != 0 && c->cond_bos != 1))
        return mg_fail(err, MG_ERR_ARG, "n_cond %d must be in [0, %d] and cond_bos 0 or 1",
                       c->n_cond, MG_COND_MAX);
    if (c->scaffold < 0 || (c->scaffold > 0 && c->scaffold + 1 >= c->ctx_len))
        return mg_fail(err, MG_ERR_ARG, "scaffold %d must be in [0, ctx_len %d - 1)", c->scaffold,
                       c->ctx_len);
    return 0;
}

int mg_model_config_to_json(const mg_model_config *c, char *out, size_t outlen) {
    json_t *j = json_pack("{si,si,si,si,si,sf,sb}", "n_layer", c->n_layer, "d_model", c->d_model,
                          "n_head", c->n_head, "ctx_len", c->ctx_len, "vocab_size", c->vocab_size,
                          "dropout", (double)c->dropout, "causal", !c->no_causal_mask);
    if (j && c->n_cond > 0) {
        mg_json_put(j, "n_cond", json_integer(c->n_cond));
        mg_json_put(j, "cond_bos", json_boolean(c->cond_bos));
    }
    if (j && c->scaffold > 0) mg_json_put(j, "scaffold", json_integer(c->scaffold));
    const int n = mg_json_dump_to(j, 9, out, outlen);
    json_decref(j);
    return n;
}

static const char *const CONFIG_INTS[] = {"n_layer", "d_model", "n_head", "ctx_len",
                                           "vocab_size"};

/* One key k = v of the config JSON into r (unknown keys refused). */
static mg_status config_key(mg_model_config *r, const char *k, const json_t *v, mg_error *err) {
    int *dst[] = {&r->n_layer, &r->d_model, &r->n_head, &r->ctx_len, &r->vocab_size};
    for (int q = 0; q < 5; q++) {
        if (strcmp(k, CONFIG_INTS[q])) continue;
        if (!json_is_integer(v) || json_integer_value(v) < INT32_MIN ||
            json_integer_value(v) > INT32_MAX)
            return mg_fail(err, MG_ERR_FORMAT, "model config: \"%s\" must be an integer", k);
        *dst[q] = (int)json_integer_value(v);
        return MG_OK;
    }
    if (!strcmp(k, "dropout")) {
        if (!json_is_number(v))
            return mg_fail(err, MG_ERR_FORMAT, "model config: \"dropout\" must be a number");
        r->dropout = (float)json_number_value(v);
    } else if (!strcmp(k, "causal")) {
        if (!json_is_boolean(v))
            return mg_fail(err, MG_ERR_FORMAT, "model config: \"causal\" must be true or false");
        r->no_causal_mask = !json_is_true(v);
    } else if (!strcmp(k, "n_cond")) {
        if (!json_is_integer(v) || json_integer_value(v) < 1 ||
            json_integer_value(v) > MG_COND_MAX)
            return mg_fail(err, MG_ERR_FORMAT, "model config: \"n_cond\" must be in [1, %d]",
                           MG_COND_MAX);
        r->n_cond = (int)json_integer_value(v);
    } else if (!strcmp(k, "cond_bos")) {
        if (!json_is_boolean(v))
            return mg_fail(err, MG_ERR_FORMAT, "model config: \"cond_bos\" must be true or false");
        r->cond_bos = json_is_true(v);
    } else if (!strcmp(k, "scaffold")) {
        if (!json_is_integer(v) || json_integer_value(v) < 1 || json_integer_value(v) > 65536)
            return mg_fail(err, MG_ERR_FORMAT,
                           "model config: \"scaffold\" must be an integer in [1, 65536]");
        r->scaffold = (int)json_integer_value(v);
    } else {
        return mg_fail(err, MG_ERR_FORMAT, "model config: unknown key \"%s\"", k);
    }
    return MG_OK;
}

mg_status mg_model_config_from_json(const char *json, mg_model_config *c, mg_error *err) {
    if (!json || !c) return mg_fail(err, MG_ERR_ARG, "config JSON or output is NULL");
    json_t *j = NULL;
    mg_error jerr;
    if (mg_json_parse(json, strlen(json), &j, &jerr))
        return mg_fail(err, jerr.status, "model config JSON: %s", jerr.message);
    mg_status rc = MG_OK;
    mg_model_config r;
    memset(&r, 0, sizeof r);
    if (!json_is_object(j)) {
        rc = mg_fail(err, MG_ERR_FORMAT, "model config JSON is not an object");
        goto done;
    }
    const char *k;
    json_t *v;
    json_object_foreach(j, k, v) {
        if ((rc = config_key(&r, k, v, err))) goto done;
    }
    for (int q = 0; q < 5; q++)
        if (!json_object_get(j, CONFIG_INTS[q])) {
            rc = mg_fail(err, MG_ERR_FORMAT, "model config: missing \"%s\"", CONFIG_INTS[q]);
            goto done;
        }
    if ((rc = mg_model_config_check(&r, err))) goto done;
    *c = r;
done:
    json_decref(j);
    return rc;
}

/* ------------------------------------------------------------ the model */

/* Views of one block's parameters (or gradients) inside a buffer. */
typedef struct {
    float *ln1_w, *ln1_b; /* [d] */
    float *attn;          /* packed MHA: in_proj_weight [3d, d], in_proj_bias [3d],
                             out_proj.weight [d, d], out_proj.bias [d] */
    float *ln2_w, *ln2_b; /* [d] */
    float *fc_w;          /* [F, d] */
    float *fc_b;          /* [F] */
    float *proj_w;        /* [d, F] */
    float *proj_b;        /* [d] */
} block_params;

typedef struct {
    float *tok_emb;       /* [V, d] */
    float *pos_emb;       /* [ctx_len, d] */
    block_params *blocks; /* [n_layer] */
    float *lnf_w, *lnf_b; /* [d] */
    float *head_w;        /* [V, d] */
    float *head_b;        /* [V] */
    float *cond_w;        /* [K, d] (conditional models only) */
    float *cond_m;        /* [K, d] */
} model_params;

/* Activations of one block for one forward. Training keeps n_layer of these
 * for the backward; inference reuses one. */
typedef struct {
    float *x;          /* [B, L, d] block input (the residual stream) */
    float *ln1;        /* [B, L, d] */
    float *ln1_mean;   /* [B, L] */
    float *ln1_rstd;   /* [B, L] */
    float *qkv;        /* [B, L, 3d] ln1 in_projᵀ + b: q, k, v of each position */
    float *att;        /* [B, L, d] softmax(q kᵀ / sqrt(dk)) v, heads side by side */
    float *lse;        /* [H, B·L] log-sum-exp of each query's scores */
    float *drop_attn;  /* [B, L, d] residual dropout multipliers (dropout only) */
    float *x_mid;      /* [B, L, d] x + drop(attn) */
    float *ln2;        /* [B, L, d] */
    float *ln2_mean;   /* [B, L] */
    float *ln2_rstd;   /* [B, L] */
    float *fc;         /* [B, L, F] before GELU */
    float *gelu;       /* [B, L, F] */
    float *drop_mlp;   /* [B, L, d] residual dropout multipliers (dropout only) */
} block_acts;

#define NAME_LEN 64

/* The weights packed once for inference (mg_model_pack_inference): per
 * block in_proj, out_proj, fc, proj (4 per block), then the head. */
typedef struct {
    mg_dtype dt;
    int n;
    mg_packed **w; /* [4 n_layer + 1] */
} inference_pack;

struct mg_model {
    mg_model_config cfg;
    inference_pack *pack; /* NULL: the products pack their operands per call */
    int nt;                /* OpenMP threads of every parallel loop (mg_model_set_threads) */
    mg_dtype dt;           /* the products' operands (mg_model_set_dtype) */
    float label_smoothing; /* of the training loss (mg_model_set_label_smoothing) */
    int frozen;          /* embeddings + blocks [0, frozen) get no gradient (mg_model_set_frozen) */
    attn_mha_config mha; /* {d, H, 0, 0, bias 1} */
    size_t mha_count;    /* floats of one block's packed attention parameters */
    size_t num_params;
    float *params; /* [num_params] */
    float *grads;  /* [num_params] */
    size_t num_tensors;
    mg_param_info *tensors;  /* [num_tensors] */
    char (*names)[NAME_LEN]; /* [num_tensors] */
    model_params p, g;       /* views into params and grads */
    /* Conditioning (condition.h): the last forward's values [cond_n, K]
     * (copied from its mg_batch, for the backward; cond_n 0: none given),
     * its per-row embeddings [B, d], and the file's "condition" metadata. */
    float *cond_vals, *cond_emb;
    int cond_n, cond_emb_rows;
    char *cond_meta;
    int new_rows; /* mg_model_new_rows: the first new token id (0: none) */

    /* Activations, sized for up to cap_rows rows (R = B*L), cap_b batch rows
     * and cap_slots blocks (n_layer after a training forward, else 1). The
     * shapes below say [B, L, ...]: every buffer holds the Rv <= B*L valid
     * rows only, attention included (libattn's packed varlen path). */
    float *act_mem;
    size_t cap_rows, cap_b, cap_slots;
    block_acts *acts; /* [cap_slots] */
    float *emb_drop;  /* [B, L, d] embedding dropout multipliers (dropout only) */
    float *x_final;   /* [B, L, d] output of the last block (training layout) */
    float *lnf;       /* [B, L, d] */
    float *lnf_mean;  /* [B, L] */
    float *lnf_rstd;  /* [B, L] */
    float *probs;     /* [B, L, V] softmax; the backward turns it into dlogits */
    float *row_loss;  /* [B, L] */
    float *scratch;   /* [B, L, d] attention / MLP branch output */
    float *dx;        /* [B, L, d] gradient of the residual stream */
    float *dln;       /* [B, L, d] gradient of a LayerNorm output */
    float *dbranch;   /* [B, L, d] gradient of a branch output */
    float *dfc;       /* [B, L, F] gradient of the MLP hidden layer */
    int32_t *inputs;  /* [B, L] */
    int32_t *targets; /* [B, L] */
    int64_t *key_len; /* [B] valid input positions per row */
    int64_t *rows;    /* [Rv] padded row b*L + t of each valid position */
    int64_t *row_b, *row_t; /* [Rv] its b and t (the dropout counters) */
    int64_t *cu;      /* [B + 1] first valid row of each batch row (cu_seqlens) */

    /* The last forward, for the backward. */
    int have_forward;
    int B, L, training;
    int64_t Rv; /* valid positions */
    uint64_t seed;
    int64_t fwd_row0; /* row0 of the forward (its dropout masks) */
    int64_t ntok;
};

static void add_tensor(mg_model *m, const char *name, int ndim, int64_t s0, int64_t s1, int decay,
                       size_t *offset) {
    mg_param_info *t = &m->tensors[m->num_tensors];
    snprintf(m->names[m->num_tensors], NAME_LEN, "%s", name);
    t->name = m->names[m->num_tensors];
    t->ndim = ndim;
    t->shape[0] = s0;
    t->shape[1] = ndim == 2 ? s1 : 0;
    t->numel = (size_t)s0 * (size_t)(ndim == 2 ? s1 : 1);
    t->offset = *offset;
    t->decay = decay;
    *offset += t->numel;
    m->num_tensors++;
}

/* The tensor table, in buffer order (see model.h). */
static void build_table(mg_model *m) {
    const int64_t d = m->cfg.d_model, F = 4 * d, V = m->cfg.vocab_size, T = m->cfg.ctx_len;
    size_t off = 0;
    char name[NAME_LEN];
    m->num_tensors = 0;
    add_tensor(m, "tok_emb.weight", 2, V, d, 0, &off);
    add_tensor(m, "pos_emb.weight", 2, T, d, 0, &off);
    for (int l = 0; l < m->cfg.n_layer; l++) {
#define BLOCK_TENSOR(suffix, ndim, s0, s1, decay)                                                  \
    do {                                                                                           \
        snprintf(name, sizeof name, "blocks.%d.%s", l, suffix);                                    \
        add_tensor(m, name, ndim, s0, s1, decay, &off);                                            \
    } while (0)
        BLOCK_TENSOR("ln1.weight", 1, d, 0, 0);
        BLOCK_TENSOR("ln1.bias", 1, d, 0, 0);
        BLOCK_TENSOR("attn.in_proj_weight", 2, 3 * d, d, 1);
        BLOCK_TENSOR("attn.in_proj_bias", 1, 3 * d, 0, 0);
        BLOCK_TENSOR("attn.out_proj.weight", 2, d, d, 1);
        BLOCK_TENSOR("attn.out_proj.bias", 1, d, 0, 0);
        BLOCK_TENSOR("ln2.weight", 1, d, 0, 0);
        BLOCK_TENSOR("ln2.bias", 1, d, 0, 0);
        BLOCK_TENSOR("mlp.fc.weight", 2, F, d, 1);
        BLOCK_TENSOR("mlp.fc.bias", 1, F, 0, 0);
        BLOCK_TENSOR("mlp.proj.weight", 2, d, F, 1);
        BLOCK_TENSOR("mlp.proj.bias", 1, d, 0, 0);
#undef BLOCK_TENSOR
    }
    add_tensor(m, "ln_f.weight", 1, d, 0, 0, &off);
    add_tensor(m, "ln_f.bias", 1, d, 0, 0, &off);
    add_tensor(m, "head.weight", 2, V, d, 1, &off);
    add_tensor(m, "head.bias", 1, V, 0, 0, &off);
    if (m->cfg.n_cond > 0) {
        add_tensor(m, "cond.weight", 2, m->cfg.n_cond, d, 0, &off);
        add_tensor(m, "cond.missing", 2, m->cfg.n_cond, d, 0, &off);
    }
    m->num_params = off;
}

/* Point the views at a buffer laid out like the table. */
static void point_views(const mg_model *m, float *base, model_params *v) {
    const mg_param_info *t = m->tensors;
    size_t i = 0;
    v->tok_emb = base + t[i++].offset;
    v->pos_emb = base + t[i++].offset;
    for (int l = 0; l < m->cfg.n_layer; l++) {
        block_params *b = &v->blocks[l];
        b->ln1_w = base + t[i++].offset;
        b->ln1_b = base + t[i++].offset;
        b->attn = base + t[i].offset; /* in_proj_weight .. out_proj.bias contiguous */
        i += 4;
        b->ln2_w = base + t[i++].offset;
        b->ln2_b = base + t[i++].offset;
        b->fc_w = base + t[i++].offset;
        b->fc_b = base + t[i++].offset;
        b->proj_w = base + t[i++].offset;
        b->proj_b = base + t[i++].offset;
    }
    v->lnf_w = base + t[i++].offset;
    v->lnf_b = base + t[i++].offset;
    v->head_w = base + t[i++].offset;
    v->head_b = base + t[i++].offset;
    v->cond_w = m->cfg.n_cond > 0 ? base + t[i++].offset : NULL;
    v->cond_m = m->cfg.n_cond > 0 ? base + t[i++].offset : NULL;
}

/* mg_model_create, refusing (MG_ERR_FORMAT) a config of more than
 * max_params parameters before allocating them: a file's config that asks
 * for more than the file holds is corrupt, not a reason to allocate. */
static mg_status create(const mg_model_config *c, size_t max_params, mg_model **out,
                        mg_error *err) {
    if (!out) return mg_fail(err, MG_ERR_ARG, "output pointer is NULL");
    *out = NULL;
    mg_status rc = mg_model_config_check(c, err);
    if (rc) return rc;
    mg_model *m = calloc(1, sizeof *m);
    if (!m) return mg_fail(err, MG_ERR_NOMEM, "out of memory for the model");
    m->cfg = *c;
    m->nt = mg_default_threads();
    m->mha.embed_dim = c->d_model;
    m->mha.num_heads = c->n_head;
    m->mha.bias = 1;
    attn_error aerr;
    if (attn_mha_param_count(&m->mha, &m->mha_count, &aerr)) {
        mg_model_free(m);
        return mg_fail(err, MG_ERR_ARG, "attention config: %s", aerr.message);
    }
    const size_t nt = 6 + 12 * (size_t)c->n_layer + 2;
    m->tensors = calloc(nt, sizeof *m->tensors);
    m->names = calloc(nt, sizeof *m->names);
    m->p.blocks = calloc((size_t)c->n_layer, sizeof(block_params));
    m->g.blocks = calloc((size_t)c->n_layer, sizeof(block_params));
    if (!m->tensors || !m->names || !m->p.blocks || !m->g.blocks) {
        mg_model_free(m);
        return mg_fail(err, MG_ERR_NOMEM, "out of memory for the model tables");
    }
    build_table(m);
    if (m->num_params > max_params) {
        const size_t n = m->num_params;
        mg_model_free(m);
        return mg_fail(err, MG_ERR_FORMAT,
                       "the config asks for %zu parameters, the file holds %zu floats", n,
                       max_params);
    }
    m->params = calloc(m->num_params, sizeof(float));
    m->grads = calloc(m->num_params, sizeof(float));
    if (!m->params || !m->grads) {
        size_t n = m->num_params;
        mg_model_free(m);
        return mg_fail(err, MG_ERR_NOMEM, "out of memory for %zu parameters", n);
    }
    point_views(m, m->params, &m->p);
    point_views(m, m->grads, &m->g);
    *out = m;
    return 0;
}

mg_status mg_model_create(const mg_model_config *c, mg_model **out, mg_error *err) {
    return create(c, SIZE_MAX, out, err);
}

static void free_acts(mg_model *m) {
    free(m->act_mem);
    free(m->acts);
    free(m->cu);
    m->cu = NULL;
    free(m->inputs);
    free(m->targets);
    free(m->key_len);
    free(m->rows);
    free(m->row_b);
    free(m->row_t);
    m->rows = m->row_b = m->row_t = NULL;
    m->act_mem = NULL;
    m->acts = NULL;
    m->inputs = m->targets = NULL;
    m->key_len = NULL;
    m->cap_rows = m->cap_b = m->cap_slots = 0;
    m->have_forward = 0;
}

void mg_model_free(mg_model *m) {
    if (!m) return;
    mg_model_unpack_inference(m);
    free_acts(m);
    free(m->params);
    free(m->grads);
    free(m->tensors);
    free(m->names);
    free(m->p.blocks);
    free(m->g.blocks);
    free(m->cond_vals);
    free(m->cond_emb);
    free(m->cond_meta);
    free(m);
}

const mg_model_config *mg_model_get_config(const mg_model *m) { return &m->cfg; }
void mg_model_set_threads(mg_model *m, int n) { m->nt = n > 0 ? n : mg_default_threads(); }

mg_status mg_model_set_label_smoothing(mg_model *m, float eps, mg_error *err) {
    if (!(eps >= 0.0f && eps < 1.0f))
        return mg_fail(err, MG_ERR_ARG, "label smoothing %g must be in [0, 1)", (double)eps);
    m->label_smoothing = eps;
    return MG_OK;
}
int mg_model_threads(const mg_model *m) { return m->nt; }

void mg_model_set_dtype(mg_model *m, mg_dtype dt) {
    m->dt = dt == MG_DT_BF16 ? MG_DT_BF16 : MG_DT_F32;
    if (m->pack && m->pack->dt != m->dt) mg_model_unpack_inference(m);
}

void mg_model_unpack_inference(mg_model *m) {
    if (!m->pack) return;
    for (int i = 0; i < m->pack->n; i++) mg_packed_free(m->pack->w[i]);
    free(m->pack->w);
    free(m->pack);
    m->pack = NULL;
}

mg_status mg_model_pack_inference(mg_model *m, mg_error *err) {
    mg_model_unpack_inference(m);
    const int L = m->cfg.n_layer, d = m->cfg.d_model, F = 4 * d, V = m->cfg.vocab_size;
    const int64_t D = d;
    inference_pack *pk = calloc(1, sizeof *pk);
    if (pk) pk->w = calloc((size_t)(4 * L + 1), sizeof *pk->w);
    if (!pk || !pk->w) {
        free(pk);
        return mg_fail(err, MG_ERR_NOMEM, "out of memory for the inference weights");
    }
    pk->dt = m->dt;
    pk->n = 4 * L + 1;
    m->pack = pk;
    mg_status rc = MG_OK;
    for (int l = 0; l < L && !rc; l++) {
        const block_params *bp = &m->p.blocks[l];
        if ((rc = mg_packed_new(bp->attn, 3 * d, d, m->dt, &pk->w[4 * l], err)) ||
            (rc = mg_packed_new(bp->attn + 3 * D * D + 3 * D, d, d, m->dt, &pk->w[4 * l + 1], err)) ||
            (rc = mg_packed_new(bp->fc_w, F, d, m->dt, &pk->w[4 * l + 2], err)))
            break;
        rc = mg_packed_new(bp->proj_w, d, F, m->dt, &pk->w[4 * l + 3], err);
    }
    if (!rc) rc = mg_packed_new(m->p.head_w, V, d, m->dt, &pk->w[4 * L], err);
    if (rc) mg_model_unpack_inference(m);
    return rc;
}

/* out [R, OC] = inp [R, IC] Wᵀ + bias through inference pack slot k when
 * the model has one, else mg_matmul_forward on w. */
static mg_status product(mg_model *m, int k, float *out, const float *inp, const float *w,
                         const float *bias, int64_t R, int IC, int OC, int nt, mg_error *err) {
    if (m->pack) return mg_packed_forward(out, inp, R, m->pack->w[k], bias, nt, err);
    return mg_matmul_forward(out, inp, w, bias, R, IC, OC, m->dt, nt, err);
}
mg_dtype mg_model_dtype(const mg_model *m) { return m->dt; }

mg_status mg_model_keep_conditions(const mg_model *m, const float *cond, int cond_rows, int B,
                                   float **buf, int *buf_rows, mg_error *err) {
    const int K = m->cfg.n_cond;
    *buf_rows = 0;
    if (!cond || cond_rows == 0) return MG_OK;
    if (K == 0) return mg_fail(err, MG_ERR_ARG, "conditions given to an unconditional model");
    if (cond_rows < 0) return mg_fail(err, MG_ERR_ARG, "%d condition rows", cond_rows);
    if (cond_rows != 1 && cond_rows != B) /* before reading them: the count says how many */
        return mg_fail(err, MG_ERR_ARG, "conditions given for %d rows, the batch has %d", cond_rows,
                       B);
    for (size_t i = 0; i < (size_t)cond_rows * K; i++)
        if (!isnan(cond[i]) && !isfinite(cond[i]))
            return mg_fail(err, MG_ERR_ARG, "condition value %zu is not finite", i);
    float *v = realloc(*buf, (size_t)cond_rows * K * sizeof(float));
    if (!v) return mg_fail(err, MG_ERR_NOMEM, "out of memory for %d condition rows", cond_rows);
    *buf = v;
    memcpy(v, cond, (size_t)cond_rows * K * sizeof(float));
    *buf_rows = cond_rows;
    return MG_OK;
}

void mg_model_condition_embedding(const mg_model *m, const float *v, float *out) {
    const int K = m->cfg.n_cond, d = m->cfg.d_model;
    memset(out, 0, (size_t)d * sizeof(float));
    for (int k = 0; k < K; k++) {
        const float x = v ? v[k] : NAN;
        const float *w = isnan(x) ? m->p.cond_m + (size_t)k * d : m->p.cond_w + (size_t)k * d;
        const float a = isnan(x) ? 1.0f : x;
        for (int c = 0; c < d; c++) out[c] += a * w[c];
    }
}

mg_status mg_model_set_condition_meta(mg_model *m, const char *json, mg_error *err) {
    char *s = json ? malloc(strlen(json) + 1) : NULL;
    if (json && !s) return mg_fail(err, MG_ERR_NOMEM, "out of memory");
    if (s) memcpy(s, json, strlen(json) + 1);
    free(m->cond_meta);
    m->cond_meta = s;
    return MG_OK;
}

const char *mg_model_condition_meta(const mg_model *m) { return m->cond_meta; }

mg_status mg_model_set_new_rows(mg_model *m, int first, mg_error *err) {
    if (first != 0 && (first <= MG_NUM_SPECIAL || first >= m->cfg.vocab_size))
        return mg_fail(err, MG_ERR_FORMAT, "new token rows from id %d of a vocabulary of %d",
                       first, m->cfg.vocab_size);
    m->new_rows = first;
    return MG_OK;
}

int mg_model_new_rows(const mg_model *m) { return m->new_rows; }

mg_status mg_model_set_frozen(mg_model *m, int n_blocks, mg_error *err) {
    if (n_blocks < 0 || n_blocks > m->cfg.n_layer)
        return mg_fail(err, MG_ERR_ARG, "cannot freeze %d blocks of a %d-block model", n_blocks,
                       m->cfg.n_layer);
    m->frozen = n_blocks;
    return MG_OK;
}

int mg_model_frozen(const mg_model *m) { return m->frozen; }

int mg_model_tensor_frozen(const mg_model *m, size_t i) {
    if (m->frozen == 0 || i >= m->num_tensors) return 0;
    char name[NAME_LEN];
    if (m->frozen < m->cfg.n_layer)
        snprintf(name, sizeof name, "blocks.%d.ln1.weight", m->frozen);
    else
        snprintf(name, sizeof name, "ln_f.weight");
    /* the table's order: embeddings, blocks 0.., then the rest; the
     * condition embeddings (last) sit at the input like tok_emb */
    return m->tensors[i].offset < mg_model_find_tensor(m, name)->offset ||
           !strncmp(m->tensors[i].name, "cond.", 5);
}

size_t mg_model_frozen_params(const mg_model *m) {
    size_t n = 0;
    for (size_t i = 0; i < m->num_tensors; i++)
        if (mg_model_tensor_frozen(m, i)) n += m->tensors[i].numel;
    return n;
}
size_t mg_model_num_params(const mg_model *m) { return m->num_params; }
float *mg_model_params(mg_model *m) { return m->params; }
float *mg_model_grads(mg_model *m) { return m->grads; }
size_t mg_model_num_tensors(const mg_model *m) { return m->num_tensors; }

const mg_param_info *mg_model_tensor(const mg_model *m, size_t i) {
    return i < m->num_tensors ? &m->tensors[i] : NULL;
}

const mg_param_info *mg_model_find_tensor(const mg_model *m, const char *name) {
    for (size_t i = 0; i < m->num_tensors; i++)
        if (!strcmp(m->tensors[i].name, name)) return &m->tensors[i];
    return NULL;
}

/* ------------------------------------------------------------ vocabulary extension */

double mg_model_new_token_bias(const mg_model *m, double margin) {
    const int64_t d = m->cfg.d_model, V = m->cfg.vocab_size;
    const float *p = m->params;
    const float *W = p + mg_model_find_tensor(m, "head.weight")->offset; /* [V, d] */
    const float *b = p + mg_model_find_tensor(m, "head.bias")->offset;   /* [V] */
    const float *g = p + mg_model_find_tensor(m, "ln_f.weight")->offset; /* [d] */
    const float *be = p + mg_model_find_tensor(m, "ln_f.bias")->offset;  /* [d] */
    /* log sum_v exp z_v >= log V + mean_v z_v (Jensen), z_v = w_v.y + b_v,
     * y = g * xh + be with |xh|_2 <= sqrt(d) (LayerNorm: |x - mean|^2 = d var
     * < d (var + eps)), so mean_v z_v = wbar.y + bbar >= bbar + wbar.be -
     * |wbar * g|_2 sqrt(d) (Cauchy-Schwarz), wbar the mean row of W. */
    double bbar = 0.0, wb = 0.0, wg2 = 0.0;
    for (int64_t v = 0; v < V; v++) bbar += b[v];
    bbar /= (double)V;
    for (int64_t j = 0; j < d; j++) {
        double wbar = 0.0;
        for (int64_t v = 0; v < V; v++) wbar += W[v * d + j];
        wbar /= (double)V;
        wb += wbar * be[j];
        wg2 += wbar * g[j] * wbar * g[j];
    }
    return log((double)V) + bbar + wb - sqrt(wg2) * sqrt((double)d) - margin;
}

/* A fp32 row rounded from a double one moves a logit by at most
 * sum_j |w32_j - w_j| |y_j|, y = g * xh + be with |xh_j| <= |xh|_2 <= sqrt(d):
 * the bound, to subtract from a bias that must stay below a proven one. */
static double rounding_slack(const double *w, const float *w32, const float *g, const float *be,
                             int64_t d) {
    double s = 0.0;
    for (int64_t j = 0; j < d; j++)
        s += fabs((double)w32[j] - w[j]) * (fabs((double)g[j]) * sqrt((double)d) + fabs((double)be[j]));
    return s;
}

/* The largest float <= x. */
static float float_below(double x) {
    float f = (float)x;
    return (double)f > x ? nextafterf(f, -INFINITY) : f;
}

mg_status mg_model_extend_vocab(const mg_model *base, int new_v, double margin, const double *q,
                                mg_model **out, mg_error *err) {
    const mg_model_config *bc = &base->cfg;
    const int64_t d = bc->d_model, V0 = bc->vocab_size;
    if (!out) return mg_fail(err, MG_ERR_ARG, "mg_model_extend_vocab: out is NULL");
    *out = NULL;
    if (new_v < V0 || V0 <= MG_NUM_SPECIAL || !(margin >= 0.0))
        return mg_fail(err, MG_ERR_ARG,
                       "mg_model_extend_vocab: %d ids for a model of %d, margin %g", new_v,
                       (int)V0, margin);
    mg_model_config c = *bc;
    c.vocab_size = new_v;
    mg_model *m = NULL;
    mg_status rc = mg_model_create(&c, &m, err);
    if (rc) return rc;
    const float bias = (float)mg_model_new_token_bias(base, margin);
    if (base->cond_meta && (rc = mg_model_set_condition_meta(m, base->cond_meta, err))) {
        mg_model_free(m);
        return rc;
    }
    double *wq = malloc((size_t)d * sizeof(double));
    if (!wq) {
        mg_model_free(m);
        return mg_fail(err, MG_ERR_NOMEM, "out of memory");
    }
    const float *g = base->params + mg_model_find_tensor(base, "ln_f.weight")->offset;  /* [d] */
    const float *be = base->params + mg_model_find_tensor(base, "ln_f.bias")->offset; /* [d] */
    const float *bW = base->params + mg_model_find_tensor(base, "head.weight")->offset; /* [V0, d] */
    const float *bb = base->params + mg_model_find_tensor(base, "head.bias")->offset;   /* [V0] */
    const float *bE = base->params + mg_model_find_tensor(base, "tok_emb.weight")->offset;
    float *W = m->params + mg_model_find_tensor(m, "head.weight")->offset; /* [new_v, d] */
    float *b = m->params + mg_model_find_tensor(m, "head.bias")->offset;   /* [new_v] */
    float *E = m->params + mg_model_find_tensor(m, "tok_emb.weight")->offset;
    for (size_t i = 0; i < m->num_tensors; i++) { /* tensor by tensor, by name */
        const mg_param_info *t = &m->tensors[i], *s = mg_model_find_tensor(base, t->name);
        memcpy(m->params + t->offset, base->params + s->offset, s->numel * sizeof(float));
    }
    for (int64_t k = 0; k < new_v - V0; k++) {
        const double *qk = q ? q + k * V0 : NULL; /* [V0] or none */
        double qs = 0.0; /* q's mass */
        for (int64_t v = 0; qk && v < V0; v++) qs += qk[v] > 0.0 ? qk[v] : 0.0;
        float *Wk = W + (V0 + k) * d, *Ek = E + (V0 + k) * d;
        /* the input row: the mean of base's data-token rows (measured on 300
         * boronic acids, a q-weighted mean, near Cl and Br, kept a higher
         * validation loss: 0.5745 against 0.5683) */
        for (int64_t j = 0; j < d; j++) {
            double mean = 0.0;
            for (int64_t v = MG_NUM_SPECIAL; v < V0; v++) mean += bE[v * d + j];
            Ek[j] = (float)(mean / (double)(V0 - MG_NUM_SPECIAL));
        }
        if (!(qs > 0.0)) { /* no q: the data-independent start */
            for (int64_t j = 0; j < d; j++) Wk[j] = 0.0f; /* logit = bias alone */
            b[V0 + k] = bias;
            continue;
        }
        /* q-weighted rows: w = sum_v q_v w_v, b = sum_v q_v b_v + H(q) - margin,
         * so the new logit is q.z + H(q) - margin, and log sum_v exp z_v >=
         * q.z + H(q) (Gibbs) at ANY input: log p_new <= -margin. */
        double bq = 0.0, H = 0.0;
        for (int64_t j = 0; j < d; j++) wq[j] = 0.0;
        for (int64_t v = 0; v < V0; v++) {
            const double p = qk[v] > 0.0 ? qk[v] / qs : 0.0;
            if (p <= 0.0) continue;
            bq += p * bb[v];
            H -= p * log(p);
            for (int64_t j = 0; j < d; j++) wq[j] += p * bW[v * d + j];
        }
        for (int64_t j = 0; j < d; j++) Wk[j] = (float)wq[j];
        b[V0 + k] = float_below(bq + H - margin - rounding_slack(wq, Wk, g, be, d));
    }
    free(wq);
    m->new_rows = new_v > V0 ? (int)V0 : 0;
    *out = m;
    return MG_OK;
}

/* ------------------------------------------------------------ init */

/* Uniform in (0, 1): 53 random bits, never 0. */
static double uniform01(uint64_t *s) {
    return ((double)(mg_splitmix64(s) >> 11) + 0.5) * 0x1.0p-53;
}

static void fill_normal(float *x, size_t n, double std, uint64_t *s) {
    for (size_t i = 0; i < n; i += 2) { /* Box-Muller, two values per pair */
        double r = sqrt(-2.0 * log(uniform01(s))), a = 6.283185307179586 * uniform01(s);
        x[i] = (float)(std * r * cos(a));
        if (i + 1 < n) x[i + 1] = (float)(std * r * sin(a));
    }
}

void mg_model_init(mg_model *m, uint64_t seed) {
    const double std = 0.02, resid_std = 0.02 / sqrt(2.0 * m->cfg.n_layer);
    for (size_t i = 0; i < m->num_tensors; i++) {
        const mg_param_info *t = &m->tensors[i];
        float *x = m->params + t->offset;
        const char *nm = t->name;
        const size_t len = strlen(nm);
        uint64_t s = seed ^ (0xD1B54A32D192ED03ull * (i + 1));
        mg_splitmix64(&s);
        int is_ln = strstr(nm, "ln1.") || strstr(nm, "ln2.") || !strncmp(nm, "ln_f.", 5);
        if (is_ln && len > 7 && !strcmp(nm + len - 7, ".weight")) {
            for (size_t k = 0; k < t->numel; k++) x[k] = 1.0f;
        } else if (t->ndim == 1) { /* biases, LayerNorm biases */
            memset(x, 0, t->numel * sizeof(float));
        } else if (strstr(nm, "attn.out_proj.weight") || strstr(nm, "mlp.proj.weight")) {
            fill_normal(x, t->numel, resid_std, &s);
        } else {
            fill_normal(x, t->numel, std, &s);
        }
    }
}

/* ------------------------------------------------------------ activations */

/* The activations' one block (tens to hundreds of MB), in 2 MB pages where
 * the kernel gives them on request (Linux's transparent huge pages in
 * "madvise" mode): its tensors are streamed by every pass of a step, and
 * with 4 KB pages the products' packing waited on TLB misses. */
static float *alloc_acts(size_t bytes) {
    const size_t huge = (size_t)2 << 20;
    if (bytes < huge) return malloc(bytes);
    const size_t n = (bytes + huge - 1) / huge * huge;
    float *p = aligned_alloc(huge, n);
#ifdef MADV_HUGEPAGE
    if (p) madvise(p, n, MADV_HUGEPAGE); /* a hint: failure is fine */
#endif
    return p;
}

/* The rows to make room for when R (of B batch rows) outgrows them: half as
 * many again, up to B full-length rows. Batches cut to their longest row
 * grow R a little at a time, and each new allocation was touched page by
 * page again (page faults: most of a training run's first steps). */
static size_t rows_with_headroom(const mg_model *m, size_t R, size_t B) {
    const size_t full = B * (size_t)m->cfg.ctx_len, more = R + R / 2;
    return R >= full ? R : more < full ? more : full;
}

/* Make room for R = B*L rows, B batch rows and `slots` blocks. Keeps the
 * buffers when they are already large enough. */
static mg_status ensure_acts(mg_model *m, size_t R, size_t B, size_t slots, mg_error *err) {
    if (R <= m->cap_rows && B <= m->cap_b && slots <= m->cap_slots) return 0;
    R = R > m->cap_rows ? rows_with_headroom(m, R, B) : m->cap_rows;
    if (B < m->cap_b) B = m->cap_b;
    if (slots < m->cap_slots) slots = m->cap_slots;
    free_acts(m);
    const size_t d = (size_t)m->cfg.d_model, F = 4 * d, V = (size_t)m->cfg.vocab_size;
    const int drop = m->cfg.dropout > 0.0f;
    /* Floats per row: per block x, ln1, qkv, att, x_mid, ln2 (8d), lse (H),
     * fc, gelu (2F), 4 LayerNorm stats, 2 dropout masks; plus the shared
     * ones. */
    const size_t H = (size_t)m->cfg.n_head;
    const size_t per_block = 8 * d + H + 2 * F + 4 + (drop ? 2 * d : 0);
    const size_t shared = (drop ? d : 0) + d /* x_final */ + d + 2 /* lnf */ + V /* probs */ +
                          1 /* row_loss */ + 4 * d /* scratch dx dln dbranch */ + F /* dfc */;
    const size_t total = R * (slots * per_block + shared);
    m->act_mem = alloc_acts(total * sizeof(float));
    m->acts = calloc(slots, sizeof(block_acts));
    m->inputs = malloc(R * sizeof(int32_t));
    m->targets = malloc(R * sizeof(int32_t));
    m->key_len = malloc(B * sizeof(int64_t));
    m->rows = malloc(R * sizeof(int64_t));
    m->row_b = malloc(R * sizeof(int64_t));
    m->row_t = malloc(R * sizeof(int64_t));
    m->cu = malloc((B + 1) * sizeof(int64_t));
    if (!m->act_mem || !m->acts || !m->inputs || !m->targets || !m->key_len || !m->rows ||
        !m->row_b || !m->row_t || !m->cu) {
        free_acts(m);
        return mg_fail(err, MG_ERR_NOMEM, "out of memory for activations (%zu rows, %zu floats)", R,
                       total);
    }
    float *p = m->act_mem;
#define CARVE(ptr, n)                                                                              \
    do {                                                                                           \
        (ptr) = p;                                                                                 \
        p += (n);                                                                                  \
    } while (0)
    for (size_t s = 0; s < slots; s++) {
        block_acts *a = &m->acts[s];
        CARVE(a->x, R * d);
        CARVE(a->ln1, R * d);
        CARVE(a->ln1_mean, R);
        CARVE(a->ln1_rstd, R);
        CARVE(a->qkv, R * 3 * d);
        CARVE(a->att, R * d);
        CARVE(a->lse, R * H);
        CARVE(a->x_mid, R * d);
        CARVE(a->ln2, R * d);
        CARVE(a->ln2_mean, R);
        CARVE(a->ln2_rstd, R);
        CARVE(a->fc, R * F);
        CARVE(a->gelu, R * F);
        a->drop_attn = a->drop_mlp = NULL;
        if (drop) {
            CARVE(a->drop_attn, R * d);
            CARVE(a->drop_mlp, R * d);
        }
    }
    m->emb_drop = NULL;
    if (drop) CARVE(m->emb_drop, R * d);
    CARVE(m->x_final, R * d);
    CARVE(m->lnf, R * d);
    CARVE(m->lnf_mean, R);
    CARVE(m->lnf_rstd, R);
    CARVE(m->probs, R * V);
    CARVE(m->row_loss, R);
    CARVE(m->scratch, R * d);
    CARVE(m->dx, R * d);
    CARVE(m->dln, R * d);
    CARVE(m->dbranch, R * d);
    CARVE(m->dfc, R * F);
#undef CARVE
    m->cap_rows = R;
    m->cap_b = B;
    m->cap_slots = slots;
    return 0;
}

/* ------------------------------------------------------------ layers */

/* The network runs on the Rv valid positions only ("compact" rows: row r
 * is position rows[r] = b*L + t of the padded [B, L] batch, t < key_len[b]);
 * padding costs nothing anywhere: attention takes the rows packed too, batch
 * row b being sequence b of libattn's varlen call (cu_seqlens = cu). */

/* m->rows, row_b, row_t [Rv] and cu [B + 1] from key_len [B]; returns Rv. */
static int64_t valid_rows(mg_model *m, int B, int L) {
    int64_t n = 0;
    for (int b = 0; b < B; b++) {
        m->cu[b] = n;
        for (int64_t t = 0; t < m->key_len[b]; t++, n++) {
            m->rows[n] = (int64_t)b * L + t;
            m->row_b[n] = b;
            m->row_t[n] = t;
        }
    }
    m->cu[B] = n;
    return n;
}

/* dst [B, L, C] = src [Rv, C] at the valid positions, zero at the padding.
 * dst may be src: batch rows go last first, and batch row b's rows only
 * move up (b*L >= its offset in src), past the rows still to move. */
static void scatter_rows(float *dst, const float *src, const int64_t *key_len, int B, int L,
                         int C) {
    int64_t off = 0;
    for (int b = 0; b < B; b++) off += key_len[b];
    for (int b = B - 1; b >= 0; b--) {
        const int64_t kl = key_len[b];
        float *o = dst + (int64_t)b * L * C;
        off -= kl;
        memmove(o, src + off * C, (size_t)(kl * C) * sizeof(float));
        memset(o + kl * C, 0, (size_t)((L - kl) * C) * sizeof(float));
    }
}

/* Token + position embedding of the valid positions.
 * out [Rv, d] = tok_emb[inp[p]] + pos_emb[p % L], p = rows[r];  inp [B, L] */
static void encoder_forward(float *out, const int32_t *inp, const float *tok_emb,
                            const float *pos_emb, const int64_t *rows, int64_t Rv, int L, int d,
                            int nt) {
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int64_t r = 0; r < Rv; r++) {
        const int64_t p = rows[r];
        const float *te = tok_emb + (int64_t)inp[p] * d, *pe = pos_emb + (p % L) * d;
        float *o = out + r * d;
        for (int c = 0; c < d; c++) o[c] = te[c] + pe[c];
    }
}

/* dtok_emb [V, d] += scatter of dout [Rv, d] by token; dpos_emb [ctx, d] +=
 * sum over the batch. Each thread owns a range of channels: no races, fixed
 * order. */
static void encoder_backward(float *dtok_emb, float *dpos_emb, const float *dout,
                             const int32_t *inp, const int64_t *rows, int64_t Rv, int L, int d,
                             int nt) {
#pragma omp parallel num_threads(nt)
    {
        int64_t c0, c1;
        mg_thread_range(d, &c0, &c1);
        for (int64_t r = 0; r < Rv; r++) {
            const int64_t p = rows[r];
            const float *g = dout + r * d;
            float *dt = dtok_emb + (int64_t)inp[p] * d, *dp = dpos_emb + (p % L) * d;
            for (int64_t c = c0; c < c1; c++) {
                dt[c] += g[c];
                dp[c] += g[c];
            }
        }
    }
}

/* out [N] = a + branch * mask  (mask NULL: no dropout; out may alias a) */
/* out [R, C] = a + (branch + bias) * mask: the residual add of a branch
 * whose product left out its bias [C] (added here, the product's bits:
 * round(acc + bias)); mask [R, C] the dropout multipliers or NULL. */
MG_CLONES static void residual_rows(float *out, const float *a, const float *branch,
                                    const float *bias, const float *mask, int64_t r0, int64_t r1,
                                    int C) {
    for (int64_t r = r0; r < r1; r++)
        for (int c = 0; c < C; c++) {
            const int64_t i = r * C + c;
            const float y = branch[i] + bias[c];
            out[i] = a[i] + (mask ? y * mask[i] : y);
        }
}
static void residual_forward(float *out, const float *a, const float *branch, const float *bias,
                             const float *mask, int64_t R, int C, int nt) {
#pragma omp parallel num_threads(nt)
    {
        int64_t r0, r1;
        mg_thread_range(R, &r0, &r1);
        residual_rows(out, a, branch, bias, mask, r0, r1, C);
    }
}
/* The residual's backward: d(a) is dout itself (the stream's gradient flows
 * on unchanged); d(branch) [N] = dout * mask, written to dbranch and
 * returned, or dout itself when there is no mask (nothing to copy). */
static const float *residual_branch_backward(float *dbranch, const float *dout, const float *mask,
                                             int64_t N, int nt) {
    if (!mask) return dout;
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int64_t i = 0; i < N; i++) dbranch[i] = dout[i] * mask[i];
    return dbranch;
}

/* Dropout multipliers mask [Rv, d] of the valid positions: 0 with
 * probability p, else 1/(1-p), libattn's Philox (attn_dropout_mask) for
 * element (global batch row row0 + b, site, position t, channel c) with the
 * forward's seed and offset n_layer + site (attention dropout has offsets
 * 0 .. n_layer - 1): a function of the global batch row, not of the padded
 * length L, the split of the batch over ranks (row0) or the threads. */
static mg_status dropout_mask(const mg_model *m, float *mask, int64_t Rv, float p, uint64_t seed,
                              int64_t site, int nt, mg_error *err) {
    attn_sdpa_params ap;
    memset(&ap, 0, sizeof ap);
    ap.dropout_p = p;
    ap.training = 1;
    ap.seed = seed;
    ap.offset = (uint64_t)m->cfg.n_layer + (uint64_t)site;
    ap.dropout_row0 = m->fwd_row0;
    ap.num_threads = nt;
    attn_error e;
    if (attn_dropout_mask(&ap, Rv, m->cfg.d_model, m->row_b, site, m->row_t, mask, &e))
        return mg_fail(err, mg_from_attn(e.status), "dropout: %s", e.message);
    return MG_OK;
}
static void mul_inplace(float *x, const float *mask, int64_t N, int nt) {
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int64_t i = 0; i < N; i++) x[i] *= mask[i];
}

/* Softmax cross-entropy over the Rv valid rows; target of row r is
 * targets[rows[r]], -1 for a position of a loss prefix (row_loss 0, no
 * gradient). logits [Rv, V] -> probs [Rv, V] (probs may alias
 * logits), row_loss [Rv]; returns the sum of the losses (double, fixed
 * order). With label smoothing eps > 0 the target distribution is
 * (1 - eps) onehot + eps / V (PyTorch's cross_entropy(label_smoothing)):
 * row loss (1 - eps)(lse - z_t) + eps (lse - mean_v z_v). */
static double crossentropy_forward(float *probs, float *row_loss, const float *logits,
                                   const int32_t *targets, const int64_t *rows, int64_t Rv, int V,
                                   float eps, int nt) {
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int64_t r = 0; r < Rv; r++) {
        const float *lg = logits + r * V;
        float *pr = probs + r * V;
        const int32_t tg = targets[rows[r]];
        if (tg < 0) { /* a loss prefix position: no loss, and zero "probabilities" */
            row_loss[r] = 0.0f;
            memset(pr, 0, (size_t)V * sizeof(float));
            continue;
        }
        const float target_logit = lg[tg]; /* before probs overwrite logits */
        float mx = -INFINITY, zsum = 0.0f;
        for (int v = 0; v < V; v++) mx = lg[v] > mx ? lg[v] : mx;
        if (eps > 0.0f)
            for (int v = 0; v < V; v++) zsum += lg[v];
        float sum = 0.0f;
        for (int v = 0; v < V; v++) {
            pr[v] = expf(lg[v] - mx);
            sum += pr[v];
        }
        const float inv = 1.0f / sum;
        for (int v = 0; v < V; v++) pr[v] *= inv;
        const float lse = mx + logf(sum);
        row_loss[r] = eps > 0.0f
                          ? (1.0f - eps) * (lse - target_logit) + eps * (lse - zsum / (float)V)
                          : lse - target_logit;
    }
    double total = 0.0;
    for (int64_t r = 0; r < Rv; r++) total += row_loss[r];
    return total;
}

/* dlogits [Rv, V] = (probs - target distribution) / ntok, in place over
 * probs; the distribution is onehot(target), or with label smoothing eps
 * (1 - eps) onehot + eps / V. With row weights w [B] (non-NULL) the factor
 * of a position of batch row rows[r] / L is w[row] instead of 1 / ntok. */
static void crossentropy_backward(float *probs, const int32_t *targets, const int64_t *rows,
                                  int64_t Rv, int V, int64_t ntok, float eps, const float *w,
                                  int L, int nt) {
    const float inv0 = 1.0f / (float)ntok, off = eps / (float)V;
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int64_t r = 0; r < Rv; r++) {
        float *pr = probs + r * V;
        const float inv = w ? w[rows[r] / L] : inv0;
        if (targets[rows[r]] < 0) {
            memset(pr, 0, (size_t)V * sizeof(float));
        } else if (eps > 0.0f) {
            pr[targets[rows[r]]] -= 1.0f - eps;
            for (int v = 0; v < V; v++) pr[v] = (pr[v] - off) * inv;
        } else {
            pr[targets[rows[r]]] -= 1.0f;
            for (int v = 0; v < V; v++) pr[v] *= inv;
        }
    }
}

/* ------------------------------------------------------------ forward */

static int threads_now(const mg_model *m) { return m->nt; }

/* Parameters of block `layer`'s attention call on the packed batch: causal
 * within each row, the model's threads, and dropout keyed by (seed, offset =
 * layer) with the batch's global first row as libattn's dropout_row0, so a
 * row's mask is that of its global batch row. */
static attn_sdpa_params attn_params(const mg_model *m, int layer, int training, uint64_t seed) {
    attn_sdpa_params p;
    memset(&p, 0, sizeof p);
    p.causal = !m->cfg.no_causal_mask;
    p.dropout_p = training ? m->cfg.dropout : 0.0f;
    p.training = training && m->cfg.dropout > 0.0f;
    p.seed = seed;
    p.offset = (uint64_t)layer;
    p.dropout_row0 = p.training ? m->fwd_row0 : 0;
    p.num_threads = threads_now(m);
    return p;
}

/* Head view [1, H, Rv, dk] of column block `which` (0 q, 1 k, 2 v) of the
 * packed rows qkv [Rv, 3d] (which = 0 and stride d: a plain [Rv, d]). */
static attn_tensor head_view(float *base, int64_t Rv, int64_t H, int64_t dk, int64_t stride,
                             int which) {
    attn_tensor t;
    t.data = base + (int64_t)which * H * dk;
    t.dim[0] = 1;
    t.dim[1] = H;
    t.dim[2] = Rv;
    t.dim[3] = dk;
    t.stride[0] = Rv * stride;
    t.stride[1] = dk;
    t.stride[2] = stride;
    t.stride[3] = 1;
    return t;
}

/* Self-attention of block `layer` on the packed rows: qkv [Rv, 3d] = in
 * in_projᵀ + b, att [Rv, d] = attention of each batch row's positions
 * among themselves (varlen, cu), lse [H, Rv], out [Rv, d] = att out_projᵀ +
 * b. weights: [B, H, L, L] (zero at padded queries and keys) or NULL. */
static mg_status attention_forward(mg_model *m, int layer, int B, int L, int64_t Rv,
                                   const float *in, block_acts *a, float *out, float *weights,
                                   int training, uint64_t seed, int nt, mg_error *err) {
    const int64_t d = m->cfg.d_model, H = m->cfg.n_head, dk = d / H;
    const float *w = m->p.blocks[layer].attn; /* in_proj W [3d, d], b [3d], out W [d, d], b [d] */
    mg_status rc = m->pack ? product(m, 4 * layer, a->qkv, in, w, w + 3 * d * d, Rv, (int)d,
                                     3 * (int)d, nt, err)
                           : mg_attn_in_proj(a->qkv, in, w, Rv, (int)d, m->dt, nt, err);
    if (rc) return rc;
    attn_tensor q = head_view(a->qkv, Rv, H, dk, 3 * d, 0), k = head_view(a->qkv, Rv, H, dk, 3 * d, 1),
                v = head_view(a->qkv, Rv, H, dk, 3 * d, 2), o = head_view(a->att, Rv, H, dk, d, 0);
    const attn_sdpa_params p = attn_params(m, layer, training, seed);
    float *blocks = NULL; /* the varlen weights: row b's [H, Lb, Lb], back to back */
    if (weights) {
        int64_t n = 0;
        for (int b = 0; b < B; b++) n += H * m->key_len[b] * m->key_len[b];
        if (!(blocks = malloc((size_t)(n ? n : 1) * sizeof(float))))
            return mg_fail(err, MG_ERR_NOMEM, "out of memory for attention weights");
    }
    attn_error e;
    if (attn_sdpa_varlen_forward(&q, &k, &v, B, m->cu, NULL, &p, &o, blocks, a->lse, NULL, &e)) {
        free(blocks);
        return mg_fail(err, mg_from_attn(e.status), "block %d attention: %s", layer, e.message);
    }
    if (weights) {
        memset(weights, 0, (size_t)B * H * L * L * sizeof(float));
        const float *src = blocks;
        for (int b = 0; b < B; b++) {
            const int64_t n = m->key_len[b];
            for (int64_t h = 0; h < H; h++)
                for (int64_t i = 0; i < n; i++, src += n)
                    memcpy(weights + (((int64_t)b * H + h) * L + i) * L, src,
                           (size_t)n * sizeof(float));
        }
        free(blocks);
    }
    /* its bias is added by the residual that reads out (forward_core) */
    return product(m, 4 * layer + 1, out, a->att, w + 3 * d * d + 3 * d, NULL, Rv, (int)d, (int)d,
                   nt, err);
}

/* Backward of attention_forward from dout [Rv, d]: din [Rv, d] =
 * d(in) (overwritten), the block's attention gradients +=. datt [Rv, d]
 * and dqkv [Rv, 3d] are scratch. */
static mg_status attention_backward(mg_model *m, int layer, int64_t Rv, const float *in,
                                    const block_acts *a, const float *dout, float *din,
                                    float *datt, float *dqkv, int training, uint64_t seed, int nt,
                                    mg_error *err) {
    const int64_t d = m->cfg.d_model, H = m->cfg.n_head, dk = d / H;
    const float *w = m->p.blocks[layer].attn;
    float *g = m->g.blocks[layer].attn;
    mg_status rc = mg_matmul_backward(datt, g + 3 * d * d + 3 * d, g + 4 * d * d + 3 * d, dout,
                                      a->att, w + 3 * d * d + 3 * d, Rv, (int)d, (int)d, m->dt, nt, err);
    if (rc) return rc;
    float *qkv = a->qkv, *att = a->att;
    attn_tensor q = head_view(qkv, Rv, H, dk, 3 * d, 0), k = head_view(qkv, Rv, H, dk, 3 * d, 1),
                v = head_view(qkv, Rv, H, dk, 3 * d, 2), o = head_view(att, Rv, H, dk, d, 0),
                go = head_view(datt, Rv, H, dk, d, 0), dq = head_view(dqkv, Rv, H, dk, 3 * d, 0),
                dkk = head_view(dqkv, Rv, H, dk, 3 * d, 1),
                dv = head_view(dqkv, Rv, H, dk, 3 * d, 2);
    const attn_sdpa_params p = attn_params(m, layer, training, seed);
    attn_error e;
    if (attn_sdpa_varlen_backward(&q, &k, &v, &o, a->lse, &go, m->B, m->cu, NULL, &p, &dq, &dkk,
                                  &dv, NULL, &e))
        return mg_fail(err, mg_from_attn(e.status), "block %d attention backward: %s", layer,
                       e.message);
    return mg_matmul_backward(din, g, g + 3 * d * d, dqkv, in, w, Rv, (int)d, (int)(3 * d),
                              m->dt, nt, err);
}

/* Conditioning (condition.h): e_b = row b's condition embedding, added to
 * x [Rv, d] at the positions it goes to (every one, or t = 0 with
 * cond_bos). e [B, d] is kept in cond_emb. */
static mg_status cond_forward(mg_model *m, float *x, int B, int L, int64_t Rv, mg_error *err) {
    const int d = m->cfg.d_model, K = m->cfg.n_cond;
    if (m->cond_emb_rows < B) {
        float *e = realloc(m->cond_emb, (size_t)B * d * sizeof(float));
        if (!e) return mg_fail(err, MG_ERR_NOMEM, "out of memory for condition embeddings");
        m->cond_emb = e;
        m->cond_emb_rows = B;
    }
    for (int b = 0; b < B; b++) {
        const float *v = m->cond_n ? m->cond_vals + (size_t)(m->cond_n == 1 ? 0 : b) * K : NULL;
        mg_model_condition_embedding(m, v, m->cond_emb + (size_t)b * d);
    }
    for (int64_t r = 0; r < Rv; r++) {
        const int64_t p = m->rows[r];
        if (m->cfg.cond_bos && p % L != 0) continue;
        const float *e = m->cond_emb + (p / L) * d;
        for (int c = 0; c < d; c++) x[r * d + c] += e[c];
    }
    return MG_OK;
}

/* Its backward from dx [Rv, d] (the embedding output's gradient): de_b
 * summed over row b's positions (into cond_emb), then d cond.weight[k] +=
 * v_bk de_b where v_bk is given, d cond.missing[k] += de_b where not. */
static void cond_backward(mg_model *m, const float *dx, int B, int L, int64_t Rv) {
    const int d = m->cfg.d_model, K = m->cfg.n_cond;
    float *de = m->cond_emb;
    memset(de, 0, (size_t)B * d * sizeof(float));
    for (int64_t r = 0; r < Rv; r++) {
        const int64_t p = m->rows[r];
        if (m->cfg.cond_bos && p % L != 0) continue;
        float *g = de + (p / L) * d;
        for (int c = 0; c < d; c++) g[c] += dx[r * d + c];
    }
    for (int b = 0; b < B; b++) {
        const float *v = m->cond_n ? m->cond_vals + (size_t)(m->cond_n == 1 ? 0 : b) * K : NULL;
        for (int k = 0; k < K; k++) {
            const float x = v ? v[k] : NAN;
            float *g = isnan(x) ? m->g.cond_m + (size_t)k * d : m->g.cond_w + (size_t)k * d;
            const float a = isnan(x) ? 1.0f : x;
            for (int c = 0; c < d; c++) g[c] += a * de[(size_t)b * d + c];
        }
    }
}

/* The network on m->inputs [B, L] and m->key_len [B], over the Rv valid
 * positions m->rows. keep != 0: one activation slot per block (for the
 * backward), else all blocks reuse slot 0 and the residual stream is updated
 * in place. Logits [Rv, V] go to `logits`; attention probabilities to
 * attn_weights [N, B, H, L, L] if given. */
static mg_status forward_core(mg_model *m, int B, int L, int64_t Rv, int keep, int training,
                              uint64_t seed, float *logits, float *attn_weights, mg_error *err) {
    const int nt = threads_now(m);
    const int N = m->cfg.n_layer, d = m->cfg.d_model, F = 4 * d, V = m->cfg.vocab_size;
    const int drop = training && m->cfg.dropout > 0.0f;
    const float p_drop = m->cfg.dropout;

    float *x = m->acts[0].x; /* [Rv, d] the residual stream */
    encoder_forward(x, m->inputs, m->p.tok_emb, m->p.pos_emb, m->rows, Rv, L, d, nt);
    if (m->cfg.n_cond > 0) {
        const mg_status rc = cond_forward(m, x, B, L, Rv, err);
        if (rc) return rc;
    }
    if (drop) {
        const mg_status rc = dropout_mask(m, m->emb_drop, Rv, p_drop, seed, 0, nt, err);
        if (rc) return rc;
        mul_inplace(x, m->emb_drop, Rv * d, nt);
    }
    for (int l = 0; l < N; l++) {
        block_acts *a = &m->acts[keep ? l : 0];
        const block_params *bp = &m->p.blocks[l];
        /* keep: block l reads acts[l].x and writes acts[l+1].x (x_final at
         * the end); inference: in place. */
        float *out = keep ? (l + 1 < N ? m->acts[l + 1].x : m->x_final) : a->x;
        const float *in = a->x;

        mg_layernorm_forward(a->ln1, a->ln1_mean, a->ln1_rstd, in, bp->ln1_w, bp->ln1_b, Rv, d,
                             nt);
        float *wts = attn_weights ? attn_weights + (size_t)l * B * m->cfg.n_head * L * L : NULL;
        mg_status rc = attention_forward(m, l, B, L, Rv, a->ln1, a, m->scratch, wts, training, seed, nt,
                                   err);
        if (rc) return rc;
        if (drop && (rc = dropout_mask(m, a->drop_attn, Rv, p_drop, seed, 1 + 2 * (int64_t)l, nt,
                                       err)))
            return rc;
        residual_forward(a->x_mid, in, m->scratch, bp->attn + 4 * (int64_t)d * d + 3 * d,
                         drop ? a->drop_attn : NULL, Rv, d, nt);

        mg_layernorm_forward(a->ln2, a->ln2_mean, a->ln2_rstd, a->x_mid, bp->ln2_w, bp->ln2_b, Rv,
                             d, nt);
        /* the biases of the MLP's products: in the GELU pass and the
         * residual add */
        if ((rc = product(m, 4 * l + 2, a->fc, a->ln2, bp->fc_w, NULL, Rv, d, F, nt, err)))
            return rc;
        mg_gelu_forward(a->gelu, a->fc, bp->fc_b, Rv, F, nt);
        if ((rc = product(m, 4 * l + 3, m->scratch, a->gelu, bp->proj_w, NULL, Rv, F, d, nt, err)))
            return rc;
        if (drop && (rc = dropout_mask(m, a->drop_mlp, Rv, p_drop, seed, 2 + 2 * (int64_t)l, nt,
                                       err)))
            return rc;
        residual_forward(out, a->x_mid, m->scratch, bp->proj_b, drop ? a->drop_mlp : NULL, Rv, d,
                         nt);
    }
    const float *xf = keep ? m->x_final : m->acts[0].x;
    mg_layernorm_forward(m->lnf, m->lnf_mean, m->lnf_rstd, xf, m->p.lnf_w, m->p.lnf_b, Rv, d, nt);
    return product(m, 4 * m->cfg.n_layer, logits, m->lnf, m->p.head_w, m->p.head_b, Rv, d, V, nt,
                   err);
}

mg_status mg_model_forward(mg_model *m, const mg_batch *bt, int training, uint64_t dropout_seed,
                           float *loss, int64_t *ntok, mg_error *err) {
    if (!m || !bt || !bt->ids || !bt->lengths || !loss)
        return mg_fail(err, MG_ERR_ARG, "model, batch, ids, lengths and loss must be non-NULL");
    m->have_forward = 0;
    const int32_t *ids = bt->ids;
    const int64_t *lengths = bt->lengths;
    const int B = bt->B, T = bt->T, V = m->cfg.vocab_size;
    if (B < 1 || T < 2 || T - 1 > m->cfg.ctx_len)
        return mg_fail(err, MG_ERR_ARG, "batch %d x %d: need B >= 1 and 2 <= T <= ctx_len + 1 = %d",
                       B, T, m->cfg.ctx_len + 1);
    if (bt->row0 < 0 || bt->row0 >= ((int64_t)1 << 31))
        return mg_fail(err, MG_ERR_ARG, "batch row0 %lld must be in [0, 2^31)",
                       (long long)bt->row0);
    /* the conditions: cond_forward reads them, and cond_backward after it */
    mg_status rc =
        mg_model_keep_conditions(m, bt->cond, bt->cond_rows, B, &m->cond_vals, &m->cond_n, err);
    if (rc) return rc;
    const int L = T - 1;
    const int64_t R = (int64_t)B * L;
    if ((rc = ensure_acts(m, (size_t)R, (size_t)B, (size_t)m->cfg.n_layer, err))) return rc;
    int64_t count = 0;
    for (int b = 0; b < B; b++) {
        if (lengths[b] < 2 || lengths[b] > T)
            return mg_fail(err, MG_ERR_ARG, "lengths[%d] = %lld is outside [2, %d]", b,
                           (long long)lengths[b], T);
        m->key_len[b] = lengths[b] - 1;
        count += lengths[b] - 1;
        for (int t = 0; t < T; t++) {
            int32_t id = ids[(int64_t)b * T + t];
            if (id < 0 || id >= V)
                return mg_fail(err, MG_ERR_ARG, "ids[%d][%d] = %d is outside [0, %d)", b, t,
                               (int)id, V);
            if (t < L) m->inputs[(int64_t)b * L + t] = id;
            if (t > 0) m->targets[(int64_t)b * L + t - 1] = id;
        }
    }
    if (bt->loss_prefix) { /* the loss prefixes' targets carry no loss */
        for (int b = 0; b < B; b++) {
            const int64_t p = bt->loss_prefix[b];
            if (p < 0)
                return mg_fail(err, MG_ERR_ARG, "loss prefix of row %d is %lld < 0", b,
                               (long long)p);
            if (p >= lengths[b] - 1)
                return mg_fail(err, MG_ERR_ARG,
                               "row %d: loss prefix %lld leaves no target of its %lld", b,
                               (long long)p, (long long)(lengths[b] - 1));
            for (int64_t t = 0; t < p; t++) m->targets[(int64_t)b * L + t] = -1;
            count -= p;
        }
    }
    const int64_t Rv = valid_rows(m, B, L);
    m->fwd_row0 = bt->row0;
    /* The logits go where the probabilities will be: softmax is done in
     * place row by row. */
    rc = forward_core(m, B, L, Rv, 1, training, dropout_seed, m->probs, NULL, err);
    if (rc) return rc;
    const double total =
        crossentropy_forward(m->probs, m->row_loss, m->probs, m->targets, m->rows, Rv, V,
                             training ? m->label_smoothing : 0.0f, threads_now(m));
    *loss = (float)(total / (double)count);
    if (ntok) *ntok = count;
    m->have_forward = 1;
    m->B = B;
    m->L = L;
    m->Rv = Rv;
    m->training = training;
    m->seed = dropout_seed;
    m->ntok = count;
    return 0;
}

mg_status mg_model_sequence_nll(mg_model *m, const mg_batch *b, double *nll, mg_error *err) {
    if (!nll) return mg_fail(err, MG_ERR_ARG, "nll must be non-NULL");
    float loss;
    const mg_status rc = mg_model_forward(m, b, 0, 0, &loss, NULL, err);
    if (rc) return rc;
    /* row_loss [Rv] in the valid rows' order: each molecule's targets in
     * position order, molecules in batch order */
    for (int r = 0; r < b->B; r++) nll[r] = 0.0;
    for (int64_t r = 0; r < m->Rv; r++) nll[m->rows[r] / m->L] += (double)m->row_loss[r];
    return MG_OK;
}

/* ------------------------------------------------------------ backward */

mg_status mg_model_backward(mg_model *m, const float *row_weights, int n_weights,
                            mg_error *err) {
    if (!m) return mg_fail(err, MG_ERR_ARG, "model is NULL");
    if (!m->have_forward)
        return mg_fail(err, MG_ERR_STATE,
                       "backward without a forward (call mg_model_forward first)");
    if (m->pack)
        return mg_fail(err, MG_ERR_STATE, "backward of a model packed for inference "
                       "(mg_model_unpack_inference first)");
    /* checked before dlogits overwrite the probabilities: a refusal keeps the forward */
    if (row_weights ? n_weights != m->B : n_weights != 0)
        return mg_fail(err, MG_ERR_ARG, "%d row weights for a batch of %d", n_weights,
                       row_weights ? m->B : 0);
    for (int b = 0; row_weights && b < m->B; b++)
        if (!isfinite(row_weights[b]))
            return mg_fail(err, MG_ERR_ARG, "row weight %d is not finite (%g)", b,
                           (double)row_weights[b]);
    m->have_forward = 0; /* dlogits overwrite the probabilities */
    const int nt = threads_now(m);
    const int B = m->B, L = m->L, N = m->cfg.n_layer, d = m->cfg.d_model, F = 4 * d;
    const int V = m->cfg.vocab_size;
    const int64_t Rv = m->Rv;
    const int drop = m->training && m->cfg.dropout > 0.0f;
    memset(m->grads, 0, m->num_params * sizeof(float));

    /* Every buffer holds the Rv valid rows, except around attention. */
    float *dlogits = m->probs; /* [Rv, V] */
    crossentropy_backward(dlogits, m->targets, m->rows, Rv, V, m->ntok,
                          m->training ? m->label_smoothing : 0.0f, row_weights, L, nt);
    mg_status rc = mg_matmul_backward(m->dln, m->g.head_w, m->g.head_b, dlogits, m->lnf,
                                      m->p.head_w, Rv, d, V, m->dt, nt, err);
    if (rc) return rc;
    memset(m->dx, 0, (size_t)Rv * d * sizeof(float));
    mg_layernorm_backward(m->dx, m->g.lnf_w, m->g.lnf_b, m->dln, m->x_final, m->p.lnf_w,
                          m->lnf_mean, m->lnf_rstd, Rv, d, nt);

    /* Frozen blocks and the embeddings below them need no gradient: the
     * backward stops at the first trained block's input. */
    for (int l = N - 1; l >= m->frozen; l--) {
        /* m->dx holds the gradient of block l's output. */
        const block_acts *a = &m->acts[l];
        const block_params *bp = &m->p.blocks[l];
        const block_params *bg = &m->g.blocks[l];

        /* MLP branch: out = x_mid + drop(proj(gelu(fc(ln2(x_mid))))) */
        const float *dmlp =
            residual_branch_backward(m->dbranch, m->dx, drop ? a->drop_mlp : NULL, Rv * d, nt);
        if ((rc = mg_matmul_backward(m->dfc, bg->proj_w, bg->proj_b, dmlp, a->gelu, bp->proj_w, Rv,
                                     F, d, m->dt, nt, err)))
            return rc;
        mg_gelu_backward(m->dfc, a->fc, m->dfc, Rv * F, nt);
        if ((rc = mg_matmul_backward(m->dln, bg->fc_w, bg->fc_b, m->dfc, a->ln2, bp->fc_w, Rv, d,
                                     F, m->dt, nt, err)))
            return rc;
        mg_layernorm_backward(m->dx, bg->ln2_w, bg->ln2_b, m->dln, a->x_mid, bp->ln2_w, a->ln2_mean,
                              a->ln2_rstd, Rv, d, nt);

        /* Attention branch: x_mid = x + drop(MHA(ln1(x))); d(ln1) to dln,
         * with scratch and dfc (free here) for d(att) and d(qkv). */
        const float *dattn =
            residual_branch_backward(m->dbranch, m->dx, drop ? a->drop_attn : NULL, Rv * d, nt);
        rc = attention_backward(m, l, Rv, a->ln1, a, dattn, m->dln, m->scratch, m->dfc,
                                m->training, m->seed, nt, err);
        if (rc) return rc;
        mg_layernorm_backward(m->dx, bg->ln1_w, bg->ln1_b, m->dln, a->x, bp->ln1_w, a->ln1_mean,
                              a->ln1_rstd, Rv, d, nt);
    }
    if (m->frozen > 0) return 0;
    if (drop) mul_inplace(m->dx, m->emb_drop, Rv * d, nt);
    encoder_backward(m->g.tok_emb, m->g.pos_emb, m->dx, m->inputs, m->rows, Rv, L, d, nt);
    if (m->cfg.n_cond > 0) cond_backward(m, m->dx, B, L, Rv);
    return 0;
}

/* ------------------------------------------------------------ inference */

mg_status mg_model_logits(mg_model *m, const mg_batch *bt, float *logits, float *attn_weights,
                          mg_error *err) {
    if (!m || !bt || !bt->ids || !logits)
        return mg_fail(err, MG_ERR_ARG, "model, batch, ids and logits must be non-NULL");
    const int32_t *ids = bt->ids;
    const int64_t *lengths = bt->lengths;
    const int B = bt->B, L = bt->T;
    if (B < 1 || L < 1 || L > m->cfg.ctx_len)
        return mg_fail(err, MG_ERR_ARG, "batch %d x %d: need B >= 1 and 1 <= L <= ctx_len %d", B, L,
                       m->cfg.ctx_len);
    if (bt->loss_prefix) return mg_fail(err, MG_ERR_ARG, "logits: a loss prefix has no loss here");
    m->have_forward = 0;
    mg_status rc =
        mg_model_keep_conditions(m, bt->cond, bt->cond_rows, B, &m->cond_vals, &m->cond_n, err);
    if (rc) return rc;
    const int64_t R = (int64_t)B * L;
    if ((rc = ensure_acts(m, (size_t)R, (size_t)B, 1, err))) return rc;
    for (int b = 0; b < B; b++) {
        int64_t kl = lengths ? lengths[b] : L;
        if (kl < 1 || kl > L)
            return mg_fail(err, MG_ERR_ARG, "lengths[%d] = %lld is outside [1, %d]", b,
                           (long long)kl, L);
        m->key_len[b] = kl;
    }
    for (int64_t r = 0; r < R; r++) {
        if (ids[r] < 0 || ids[r] >= m->cfg.vocab_size)
            return mg_fail(err, MG_ERR_ARG, "ids[%lld][%lld] = %d is outside [0, %d)",
                           (long long)(r / L), (long long)(r % L), (int)ids[r], m->cfg.vocab_size);
        m->inputs[r] = ids[r];
    }
    const int64_t Rv = valid_rows(m, B, L);
    rc = forward_core(m, B, L, Rv, 0, 0, 0, logits, attn_weights, err);
    if (rc) return rc;
    scatter_rows(logits, logits, m->key_len, B, L, m->cfg.vocab_size); /* [Rv, V] -> [B, L, V] */
    return 0;
}

/* ------------------------------------------------------------ causal guard */

mg_status mg_model_causal_guard(mg_model *m, uint64_t seed, mg_error *err) {
    if (!m) return mg_fail(err, MG_ERR_ARG, "model is NULL");
    const int B = 2, L = m->cfg.ctx_len, V = m->cfg.vocab_size;
    if (L < 2 || V < 2) return 0; /* nothing after a position can change */
    const size_t R = (size_t)B * L;
    int32_t *ids = malloc(R * sizeof(int32_t)), *ids2 = malloc(R * sizeof(int32_t));
    float *lg = malloc(R * V * sizeof(float)), *lg2 = malloc(R * V * sizeof(float));
    mg_status rc = MG_OK;
    if (!ids || !ids2 || !lg || !lg2) {
        rc = mg_fail(err, MG_ERR_NOMEM, "causal guard: out of memory");
        goto done;
    }
    uint64_t s = seed ^ 0x6A09E667F3BCC909ull;
    for (size_t i = 0; i < R; i++) ids[i] = (int32_t)(mg_splitmix64(&s) % (uint64_t)V);
    if ((rc = mg_model_logits(m, &(mg_batch){.ids = ids, .B = B, .T = L}, lg, NULL, err)))
        goto done;
    const int cuts[4] = {0, L / 3, (2 * L) / 3, L - 2};
    for (int ci = 0; ci < 4; ci++) {
        const int t = cuts[ci];
        memcpy(ids2, ids, R * sizeof(int32_t));
        for (int b = 0; b < B; b++)
            for (int u = t + 1; u < L; u++) { /* a different token at every later position */
                int32_t *x = &ids2[(size_t)b * L + u];
                *x = (int32_t)((*x + 1 + (int32_t)(mg_splitmix64(&s) % (uint64_t)(V - 1))) % V);
            }
        if ((rc = mg_model_logits(m, &(mg_batch){.ids = ids2, .B = B, .T = L}, lg2, NULL, err)))
            goto done;
        double worst = 0.0;
        int worst_pos = -1;
        for (int b = 0; b < B; b++)
            for (int u = 0; u <= t; u++)
                for (int v = 0; v < V; v++) {
                    size_t k = ((size_t)b * L + u) * V + v;
                    double diff = fabs((double)lg[k] - (double)lg2[k]);
                    if (!(diff <= worst)) { /* NaN counts as a leak too */
                        worst = isnan(diff) ? INFINITY : diff;
                        worst_pos = u;
                    }
                }
        if (worst > 1e-6) {
            rc = mg_fail(err, MG_ERR_LEAK,
                         "causal leak: logits at position %d changed by %.2e when the tokens after "
                         "position %d changed",
                         worst_pos, worst, t);
            goto done;
        }
    }
done:
    free(ids);
    free(ids2);
    free(lg);
    free(lg2);
    return rc;
}

/* ------------------------------------------------------------ files */

size_t mg_model_st_tensors(const mg_model *m, mg_st_tensor *t, size_t cap) {
    if (cap < m->num_tensors) return 0;
    for (size_t i = 0; i < m->num_tensors; i++) {
        const mg_param_info *p = &m->tensors[i];
        memset(&t[i], 0, sizeof t[i]);
        t[i].name = p->name;
        t[i].dtype = MG_ST_F32;
        t[i].ndim = p->ndim;
        t[i].shape[0] = p->shape[0];
        t[i].shape[1] = p->shape[1];
        t[i].data = m->params + p->offset;
        t[i].nbytes = p->numel * sizeof(float);
    }
    return m->num_tensors;
}

mg_status mg_model_from_st(const mg_st_file *f, mg_model **out, mg_error *err) {
    if (!f || !out) return mg_fail(err, MG_ERR_ARG, "file or output pointer is NULL");
    *out = NULL;
    const char *cj = mg_st_meta(f, "config");
    if (!cj) return mg_fail(err, MG_ERR_FORMAT, "not a molgen model: no \"config\" metadata");
    mg_model_config c;
    mg_status rc = mg_model_config_from_json(cj, &c, err);
    if (rc) return rc;
    size_t floats = 0; /* what the file holds: every parameter must be among it */
    for (size_t i = 0; i < mg_st_count(f); i++) floats += mg_st_at(f, i)->nbytes / sizeof(float);
    mg_model *m = NULL;
    if ((rc = create(&c, floats, &m, err))) return rc;
    for (size_t i = 0; i < m->num_tensors; i++) {
        const mg_param_info *p = &m->tensors[i];
        float *w = m->params + p->offset;
        mg_error e;
        if ((rc = mg_st_copy(f, p->name, MG_ST_F32, p->ndim, p->shape, w,
                             p->numel * sizeof(float), err))) {
            mg_model_free(m);
            return rc;
        }
        /* an Inf or NaN weight samples garbage; refuse it by name */
        if ((rc = mg_ckpt_check_values(p->name, w, p->numel, &e))) {
            mg_model_free(m);
            return mg_fail(err, rc, "%s: the model is corrupt", e.message);
        }
    }
    if (c.n_cond > 0) { /* the names and normalisation belong to the weights */
        mg_cond_info ci;
        mg_error e;
        const char *meta = mg_st_meta(f, "condition");
        if ((rc = mg_cond_info_from_json(meta, &ci, &e)) ||
            (ci.K != c.n_cond && (rc = mg_fail(&e, MG_ERR_FORMAT,
                                               "condition metadata names %d conditions, the "
                                               "config %d",
                                               ci.K, c.n_cond))) ||
            (rc = mg_model_set_condition_meta(m, meta, &e))) {
            mg_cond_info_free(&ci);
            mg_model_free(m);
            return mg_fail(err, rc == MG_ERR_NOMEM ? rc : MG_ERR_FORMAT, "%s", e.message);
        }
        mg_cond_info_free(&ci);
    }
    *out = m;
    return 0;
}

mg_status mg_model_save(const mg_model *m, const mg_vocab *vocab, const char *path, mg_error *err) {
    if (!m || !path) return mg_fail(err, MG_ERR_ARG, "model or path is NULL");
    mg_st_tensor *t = calloc(m->num_tensors, sizeof *t);
    char cfg[512];
    char *vj = vocab ? mg_vocab_to_json(vocab) : NULL;
    if (!t || (vocab && !vj)) {
        free(t);
        free(vj);
        return mg_fail(err, MG_ERR_NOMEM, "out of memory saving the model");
    }
    mg_model_config_to_json(&m->cfg, cfg, sizeof cfg);
    mg_model_st_tensors(m, t, m->num_tensors);
    mg_error e;
    for (size_t i = 0; i < m->num_tensors; i++) /* a file the loader would refuse */
        if (mg_ckpt_check_values(t[i].name, t[i].data, m->tensors[i].numel, &e)) {
            free(t);
            free(vj);
            return mg_fail(err, e.status, "refusing to write %s: %s", path, e.message);
        }
    mg_st_kv meta[4] = {{"format", "molgen"}, {"config", cfg}, {"vocab", vj}};
    size_t nm = vj ? 3 : 2;
    if (m->cond_meta) meta[nm++] = (mg_st_kv){"condition", m->cond_meta};
    mg_status rc = mg_st_write(path, t, m->num_tensors, meta, nm, err);
    free(t);
    free(vj);
    return rc;
}

/* The averaged parameters of a checkpoint (its "ema" tensor, checked by
 * mg_ckpt_check_state) into m. */
static mg_status load_averaged(const mg_st_file *f, mg_model *m, mg_error *err) {
    const int64_t shape[1] = {(int64_t)m->num_params};
    return mg_st_copy(f, "ema", MG_ST_F32, 1, shape, m->params, m->num_params * sizeof(float),
                      err);
}

mg_status mg_model_load(const char *path, unsigned flags, mg_model **out, mg_vocab **vocab,
                        mg_model_file_info *info, mg_error *err) {
    if (!path || !out) return mg_fail(err, MG_ERR_ARG, "path or output pointer is NULL");
    *out = NULL;
    if (vocab) *vocab = NULL;
    mg_st_file *f = NULL;
    mg_error e;
    if (mg_st_load(path, &f, &e)) return mg_fail(err, e.status, "%s", e.message);
    const int averaged = !(flags & MG_LOAD_RAW) && mg_st_find(f, "ema") != NULL;
    if (info) *info = (mg_model_file_info){mg_st_checksummed(f), averaged};
    mg_model *m = NULL;
    /* the optimizer state too, although unused here: a file that would
     * resume into NaN is refused on every path */
    mg_status rc = mg_model_from_st(f, &m, &e);
    if (!rc && ((rc = mg_ckpt_check_state(f, m->num_params, &e)) ||
                (averaged && (rc = load_averaged(f, m, &e))))) {
        mg_model_free(m);
        m = NULL;
    }
    if (rc) {
        mg_st_free(f);
        return mg_fail(err, e.status, "%s: %s", path, e.message);
    }
    if (vocab) {
        const char *vj = mg_st_meta(f, "vocab");
        if (!vj) {
            rc = mg_fail(err, MG_ERR_FORMAT, "%s: no \"vocab\" metadata", path);
        } else if (mg_vocab_from_json(vj, strlen(vj), vocab, &e)) {
            rc = mg_fail(err, e.status, "%s: vocab: %s", path, e.message);
        } else if (mg_vocab_size(*vocab) != m->cfg.vocab_size) {
            rc = mg_fail(err, MG_ERR_FORMAT, "%s: vocab has %d tokens but the model %d", path,
                         mg_vocab_size(*vocab), m->cfg.vocab_size);
        }
        if (rc) {
            mg_vocab_free(*vocab);
            *vocab = NULL;
        }
    }
    mg_st_free(f);
    if (rc) {
        mg_model_free(m);
        return rc;
    }
    *out = m;
    return 0;
}

uint64_t mg_model_params_digest(mg_model *m) {
    return mg_fnv1a(MG_FNV1A_INIT, mg_model_params(m), mg_model_num_params(m) * sizeof(float));
}

uint64_t mg_model_fingerprint(mg_model *m, const mg_vocab *v) {
    const mg_model_config *c = mg_model_get_config(m);
    const size_t np = mg_model_num_params(m);
    const int64_t shape[] = {c->n_layer, c->d_model,  c->n_head, c->ctx_len,
                             c->vocab_size, c->n_cond, c->cond_bos, c->scaffold, (int64_t)np};
    uint64_t h = mg_fnv1a(MG_FNV1A_INIT, shape, sizeof shape);
    h = mg_mix64(h ^ mg_model_params_digest(m));
    for (int i = 0; i < mg_vocab_size(v); i++) {
        const char *t = mg_vocab_token(v, i);
        h = mg_fnv1a(h, t ? t : "", t ? strlen(t) + 1 : 1); /* each token and its NUL */
    }
    const char *meta = mg_model_condition_meta(m);
    return mg_fnv1a(h, "", 1) ^ mg_fnv1a(MG_FNV1A_INIT, meta ? meta : "", meta ? strlen(meta) : 0);
}
