/* molgen optim: AdamW, warm-up + cosine schedule, global-norm clipping
 * (see optim.h). */
#include "nn/optim.h"
#include "base/errors.h"
#include "nn/layers.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attn.h"
#include "base/json.h"
#include "base/util.h"

#ifdef _OPENMP
#include <omp.h>
#endif

void mg_adamw_config_default(mg_adamw_config *c) {
    c->lr = 2e-3f;
    c->min_lr_frac = 0.1f;
    c->warmup_steps = 100;
    c->total_steps = 1000;
    c->beta1 = 0.9f;
    c->beta2 = 0.95f;
    c->eps = 1e-8f;
    c->weight_decay = 0.1f;
    c->grad_clip = 1.0f;
}

mg_status mg_adamw_config_check(const mg_adamw_config *c, mg_error *err) {
    if (!c) return mg_fail(err, MG_ERR_ARG, "optimizer config is NULL");
    if (!(c->lr > 0.0f && c->lr < 10.0f))
        return mg_fail(err, MG_ERR_ARG, "lr %g must be in (0, 10)", (double)c->lr);
    if (!(c->min_lr_frac >= 0.0f && c->min_lr_frac <= 1.0f))
        return mg_fail(err, MG_ERR_ARG, "min_lr_frac %g must be in [0, 1]", (double)c->min_lr_frac);
    if (c->warmup_steps < 0) return mg_fail(err, MG_ERR_ARG, "warmup_steps must be >= 0");
    if (c->total_steps < 1) return mg_fail(err, MG_ERR_ARG, "total_steps must be >= 1");
    if (!(c->beta1 >= 0.0f && c->beta1 < 1.0f) || !(c->beta2 >= 0.0f && c->beta2 < 1.0f))
        return mg_fail(err, MG_ERR_ARG, "betas (%g, %g) must be in [0, 1)", (double)c->beta1,
                       (double)c->beta2);
    if (!(c->eps > 0.0f)) return mg_fail(err, MG_ERR_ARG, "eps must be > 0");
    if (!(c->weight_decay >= 0.0f && c->weight_decay < 1.0f))
        return mg_fail(err, MG_ERR_ARG, "weight_decay %g must be in [0, 1)",
                       (double)c->weight_decay);
    if (!(c->grad_clip >= 0.0f))
        return mg_fail(err, MG_ERR_ARG, "grad_clip %g must be >= 0 (0 = off)",
                       (double)c->grad_clip);
    return 0;
}

int mg_adamw_config_to_json(const mg_adamw_config *c, char *out, size_t outlen) {
    json_t *j = json_pack("{sf,sf,sI,sI,sf,sf,sf,sf,sf}", "lr", (double)c->lr, "min_lr_frac",
                          (double)c->min_lr_frac, "warmup_steps", (json_int_t)c->warmup_steps,
                          "total_steps", (json_int_t)c->total_steps, "beta1", (double)c->beta1,
                          "beta2", (double)c->beta2, "eps", (double)c->eps, "weight_decay",
                          (double)c->weight_decay, "grad_clip", (double)c->grad_clip);
    const int n = mg_json_dump_to(j, 9, out, outlen);
    json_decref(j);
    return n;
}

mg_status mg_adamw_config_from_json(const char *json, mg_adamw_config *c, mg_error *err) {
    if (!json || !c) return mg_fail(err, MG_ERR_ARG, "optimizer JSON or output is NULL");
    json_t *j = NULL;
    mg_error jerr;
    if (mg_json_parse(json, strlen(json), &j, &jerr))
        return mg_fail(err, jerr.status, "optimizer config JSON: %s", jerr.message);
    static const char *const keys[] = {"lr",          "min_lr_frac",  "warmup_steps",
                                       "total_steps", "beta1",        "beta2",
                                       "eps",         "weight_decay", "grad_clip"};
    double val[9];
    mg_status rc = MG_OK;
    if (!json_is_object(j)) {
        rc = mg_fail(err, MG_ERR_FORMAT, "optimizer config JSON is not an object");
        goto done;
    }
    const char *key;
    json_t *v;
    json_object_foreach(j, key, v) {
        int known = 0;
        for (int k = 0; k < 9; k++) known |= !strcmp(key, keys[k]);
        if (!known) {
            rc = mg_fail(err, MG_ERR_FORMAT, "optimizer config: unknown key \"%s\"", key);
            goto done;
        }
    }
    for (int k = 0; k < 9; k++) {
        v = json_object_get(j, keys[k]);
        if (!json_is_number(v)) {
            rc = mg_fail(err, MG_ERR_FORMAT, "optimizer config: \"%s\" missing or not a number",
                         keys[k]);
            goto done;
        }
        if ((k == 2 || k == 3) &&
            (!json_is_integer(v) || json_integer_value(v) < 0)) { /* step counts */
            rc = mg_fail(err, MG_ERR_FORMAT, "optimizer config: \"%s\" must be an integer >= 0",
                         keys[k]);
            goto done;
        }
        val[k] = json_number_value(v);
    }
    mg_adamw_config r;
    r.lr = (float)val[0];
    r.min_lr_frac = (float)val[1];
    r.warmup_steps = json_integer_value(json_object_get(j, keys[2]));
    r.total_steps = json_integer_value(json_object_get(j, keys[3]));
    r.beta1 = (float)val[4];
    r.beta2 = (float)val[5];
    r.eps = (float)val[6];
    r.weight_decay = (float)val[7];
    r.grad_clip = (float)val[8];
    if ((rc = mg_adamw_config_check(&r, err))) goto done;
    *c = r;
done:
    json_decref(j);
    return rc;
}

float mg_lr_at(const mg_adamw_config *c, int64_t s) {
    if (s < c->warmup_steps) return c->lr * (float)(s + 1) / (float)c->warmup_steps;
    const double floor_lr = (double)c->lr * c->min_lr_frac;
    int64_t span = c->total_steps - c->warmup_steps;
    if (span < 1) span = 1;
    double prog = (double)(s - c->warmup_steps) / (double)span;
    if (prog > 1.0) prog = 1.0;
    return (float)(floor_lr +
                   ((double)c->lr - floor_lr) * 0.5 * (1.0 + cos(3.141592653589793 * prog)));
}

mg_status mg_adamw_init(mg_adamw *o, const mg_adamw_config *c, size_t n, const mg_optim_span *spans,
                        size_t nspans, mg_error *err) {
    mg_status rc_;
    if (!o) return mg_fail(err, MG_ERR_ARG, "optimizer is NULL");
    memset(o, 0, sizeof *o);
    if ((rc_ = mg_adamw_config_check(c, err))) return rc_;
    if (n == 0 || !spans || nspans == 0) return mg_fail(err, MG_ERR_ARG, "no parameters or spans");
    size_t at = 0;
    for (size_t i = 0; i < nspans; i++) {
        if (spans[i].offset != at || spans[i].numel == 0)
            return mg_fail(err, MG_ERR_ARG,
                           "span %zu starts at %zu, expected %zu (spans must tile the buffer)", i,
                           spans[i].offset, at);
        at += spans[i].numel;
    }
    if (at != n) return mg_fail(err, MG_ERR_ARG, "spans cover %zu parameters, not %zu", at, n);
    o->cfg = *c;
    o->n = n;
    o->m = calloc(n, sizeof(float));
    o->v = calloc(n, sizeof(float));
    o->spans = malloc(nspans * sizeof *spans);
    if (!o->m || !o->v || !o->spans) {
        mg_adamw_free(o);
        return mg_fail(err, MG_ERR_NOMEM, "out of memory for the optimizer state (%zu parameters)",
                       n);
    }
    memcpy(o->spans, spans, nspans * sizeof *spans);
    o->nspans = nspans;
    return 0;
}

void mg_adamw_free(mg_adamw *o) {
    if (!o) return;
    free(o->m);
    free(o->v);
    free(o->spans);
    free(o->ema);
    memset(o, 0, sizeof *o);
}

mg_status mg_adamw_enable_ema(mg_adamw *o, double decay, const float *params, mg_error *err) {
    if (!o || !o->m || !params)
        return mg_fail(err, MG_ERR_ARG, "optimizer not initialised or NULL parameters");
    if (!(decay > 0.0 && decay < 1.0))
        return mg_fail(err, MG_ERR_ARG, "average decay %g is not in (0, 1)", decay);
    free(o->ema);
    o->ema = malloc(o->n * sizeof(float));
    if (!o->ema) {
        o->ema_decay = 0.0;
        return mg_fail(err, MG_ERR_NOMEM, "out of memory for the parameter average (%zu floats)",
                       o->n);
    }
    memcpy(o->ema, params, o->n * sizeof(float));
    o->ema_decay = decay;
    return 0;
}

/* Sum of squares of chunk [i0, i1) in double: an OpenMP simd reduction,
 * like the LayerNorm sums (layers.c). */
MG_CLONES static double chunk_squares(const float *g, size_t i0, size_t i1) {
    double s = 0.0;
#pragma omp simd reduction(+ : s)
    for (size_t i = i0; i < i1; i++) s += (double)g[i] * g[i];
    return s;
}

/* Sum of squares in double: fixed chunks of 4096, then the chunk sums in
 * order; the same for any thread count. */
static double sum_squares(const float *g, size_t n, int nt) {
    const size_t CH = 4096, nch = (n + CH - 1) / CH;
    double *part = malloc(nch * sizeof(double));
    double total = 0.0;
    if (!part) { /* serial fallback, same order */
        for (size_t c = 0; c < nch; c++)
            total += chunk_squares(g, c * CH, c * CH + CH < n ? c * CH + CH : n);
        return total;
    }
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int64_t c = 0; c < (int64_t)nch; c++) {
        const size_t i0 = (size_t)c * CH;
        part[c] = chunk_squares(g, i0, i0 + CH < n ? i0 + CH : n);
    }
    for (size_t c = 0; c < nch; c++) total += part[c];
    free(part);
    return total;
}

/* AdamW on n elements; g is scaled in place (the clipped gradient). */
MG_CLONES static void adamw_update(float *p, float *g, float *m, float *v, int64_t n, float scale,
                                   float wd, float lr, float b1, float b2, float bc1, float bc2,
                                   float eps) {
    for (int64_t i = 0; i < n; i++) {
        const float gi = g[i] * scale;
        g[i] = gi;
        p[i] -= wd * p[i];
        m[i] = b1 * m[i] + (1.0f - b1) * gi;
        v[i] = b2 * v[i] + (1.0f - b2) * gi * gi;
        const float mh = m[i] / bc1, vh = v[i] / bc2;
        p[i] -= lr * mh / (sqrtf(vh) + eps);
    }
}

/* ema += w (p - ema) on n elements, w = 1 - d_t. */
MG_CLONES static void ema_update(float *ema, const float *p, int64_t n, float w) {
    for (int64_t i = 0; i < n; i++) ema[i] += w * (p[i] - ema[i]);
}

mg_status mg_adamw_step(mg_adamw *o, float *params, float *grads, float *grad_norm, float *lr_used,
                        mg_error *err) {
    if (!o || !o->m || !params || !grads)
        return mg_fail(err, MG_ERR_ARG, "optimizer not initialised or NULL buffers");
    const int nt = o->threads > 0 ? o->threads : mg_default_threads();
    const double norm = sqrt(sum_squares(grads, o->n, nt));
    if (grad_norm) *grad_norm = (float)norm;
    if (!isfinite(norm))
        return mg_fail(err, MG_ERR_NUMERIC, "gradient norm is %g at step %lld (diverged?)", norm,
                       (long long)o->step);
    const float lr = mg_lr_at(&o->cfg, o->step);
    if (lr_used) *lr_used = lr;
    const float scale = (o->cfg.grad_clip > 0.0f && norm > o->cfg.grad_clip)
                            ? (float)(o->cfg.grad_clip / norm)
                            : 1.0f;
    const int64_t t = o->step + 1;
    const float b1 = o->cfg.beta1, b2 = o->cfg.beta2, eps = o->cfg.eps;
    const float bc1 = (float)(1.0 - pow((double)b1, (double)t));
    const float bc2 = (float)(1.0 - pow((double)b2, (double)t));
    const double dt = (1.0 + (double)t) / (10.0 + (double)t);
    const float ema_w = (float)(1.0 - (dt < o->ema_decay ? dt : o->ema_decay));
    /* One parallel region for all tensors (spans are disjoint: no barrier
     * between them); every element's update is independent of the split. */
#pragma omp parallel num_threads(nt)
    for (size_t s = 0; s < o->nspans; s++) {
        const mg_optim_span *sp = &o->spans[s];
        if (sp->frozen) continue;
        const float wd = sp->decay ? lr * o->cfg.weight_decay : 0.0f;
        const float slr = sp->lr_mult > 0.0f ? lr * sp->lr_mult : lr;
        float *p = params + sp->offset, *g = grads + sp->offset;
        float *m = o->m + sp->offset, *v = o->v + sp->offset;
        int64_t i0, i1;
        mg_thread_range((int64_t)sp->numel, &i0, &i1);
        adamw_update(p + i0, g + i0, m + i0, v + i0, i1 - i0, scale, wd, slr, b1, b2, bc1, bc2, eps);
        if (o->ema) ema_update(o->ema + sp->offset + i0, p + i0, i1 - i0, ema_w);
    }
    o->step = t;
    return 0;
}
