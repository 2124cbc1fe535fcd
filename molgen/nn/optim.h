/* molgen optim: AdamW with a warm-up + cosine learning-rate schedule and
 * global-norm gradient clipping.
 *
 * Update for step t = step + 1 (PyTorch's torch.optim.AdamW):
 *   g    = grad * min(1, clip / ||grad||)         (global L2 norm, clip > 0)
 *   p   -= lr * weight_decay * p                  (decoupled; decay spans only)
 *   m    = beta1 m + (1 - beta1) g
 *   v    = beta2 v + (1 - beta2) g²
 *   p   -= lr * (m / (1 - beta1^t)) / (sqrt(v / (1 - beta2^t)) + eps)
 *
 * Spans marked frozen are skipped: no update, no decay, their moments
 * untouched (molgen train --freeze; their gradients are 0, so the clipping
 * norm is the trained parameters' alone).
 *
 * Weight decay applies only to the spans marked decay (the model marks the
 * weight matrices of its linear layers: attention in/out projections, MLP,
 * output head); biases, LayerNorm gains/biases and the embeddings are not
 * decayed: shrinking a LayerNorm gain or a bias towards 0 is not a useful
 * prior, and decaying the embedding rows of rare tokens (which get few
 * gradient updates) would erase them (the minGPT / nanoGPT choice).
 *
 * Schedule for step s = 0, 1, ... (the step being taken):
 *   s < warmup:  lr * (s + 1) / warmup
 *   else:        floor + (lr - floor) * 0.5 (1 + cos(pi * min(1, (s - warmup) /
 *                max(1, total - warmup)))),   floor = lr * min_lr_frac.
 * Deterministic: the norm is summed in double in a fixed order.
 *
 * Parameter averaging (optional, mg_adamw_enable_ema): after step t the
 * average follows the parameters,
 *   ema += (1 - d_t) (p - ema),   d_t = min(decay, (1 + t) / (10 + t)),
 * an exponential moving average whose decay ramps up over the first steps
 * (TensorFlow's ExponentialMovingAverage with num_updates), so that the
 * average of a short run is not dominated by the initial weights. It never
 * feeds back into training: the parameters follow the same path with or
 * without it. Frozen spans keep ema = p. */
#ifndef MG_OPTIM_H
#define MG_OPTIM_H

#include <stddef.h>
#include <stdint.h>

#include "base/errors.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    float lr;          /* peak learning rate */
    float min_lr_frac; /* floor = lr * min_lr_frac, in [0, 1] */
    int64_t warmup_steps;
    int64_t total_steps; /* the cosine reaches the floor here */
    float beta1, beta2, eps;
    float weight_decay;
    float grad_clip; /* <= 0: no clipping */
} mg_adamw_config;

/* lr 2e-3, floor 0.1, warm-up 100, total 1000, betas (0.9, 0.95), eps 1e-8,
 * weight decay 0.1, clip 1.0. */
void mg_adamw_config_default(mg_adamw_config *c);
mg_status mg_adamw_config_check(const mg_adamw_config *c, mg_error *err);
/* JSON object of every field, and back (all keys required, unknown keys an
 * error); _to_json returns the length like snprintf. */
int mg_adamw_config_to_json(const mg_adamw_config *c, char *out, size_t outlen);
mg_status mg_adamw_config_from_json(const char *json, mg_adamw_config *c, mg_error *err);

/* Learning rate used by step s (0-based). */
float mg_lr_at(const mg_adamw_config *c, int64_t s);

/* A range of parameters: [offset, offset + numel), decayed or not. */
typedef struct {
    size_t offset, numel;
    int decay;
    int frozen; /* 1: never updated (no decay, moments stay as they are) */
    float lr_mult; /* the span's step is lr_mult * lr (its decay stays lr's); 0 reads as 1 */
} mg_optim_span;

typedef struct {
    mg_adamw_config cfg;
    size_t n;     /* parameters */
    float *m, *v; /* [n] first and second moments */
    int64_t step; /* steps taken so far */
    mg_optim_span *spans;
    size_t nspans;
    int threads; /* of mg_adamw_step; 0 (as mg_adamw_init leaves it):
                           mg_default_threads() */
    double ema_decay; /* in (0, 1) with ema; 0: no average */
    float *ema;       /* [n] the averaged parameters, or NULL */
} mg_adamw;

/* Allocate for n parameters with zero moments and step 0. The spans must
 * cover [0, n) exactly, in order, without overlap. */
mg_status mg_adamw_init(mg_adamw *o, const mg_adamw_config *c, size_t n, const mg_optim_span *spans,
                        size_t nspans, mg_error *err);
void mg_adamw_free(mg_adamw *o); /* zeroes it; NULL fine */

/* Keep an average of the parameters with this decay (in (0, 1)), starting
 * from params [n] (a copy); a resumed run then overwrites o->ema with its
 * saved average. */
mg_status mg_adamw_enable_ema(mg_adamw *o, double decay, const float *params, mg_error *err);

/* One update of params [n] from grads [n] (grads are scaled in place when
 * clipped). *grad_norm (may be NULL): the norm before clipping; *lr_used
 * (may be NULL): the learning rate of this step. A non-finite norm is an
 * error (-1, nothing updated, step unchanged). */
mg_status mg_adamw_step(mg_adamw *o, float *params, float *grads, float *grad_norm, float *lr_used,
                        mg_error *err);

#ifdef __cplusplus
}
#endif
#endif /* MG_OPTIM_H */
