/* molgen sampling (see sample.h). */
#define _POSIX_C_SOURCE 200809L
#include "gen/sample.h"
#include "base/errors.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "attn.h"
#include "chem/constrain.h"
#include "base/safetensors.h"
#include "gen/kv_decode.h"
#include "chem/smiles_check.h"
#include "base/util.h"

/* ------------------------------------------------------------ RNG */

void mg_rng_seed(mg_rng *r, uint64_t seed, uint64_t stream) {
    uint64_t s = seed;
    uint64_t a = mg_splitmix64(&s);
    s = a ^ (stream * 0xD1B54A32D192ED03ull + 0x8CB92BA72F3D8DD7ull);
    for (int i = 0; i < 4; i++) r->s[i] = mg_splitmix64(&s);
}

static inline uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

uint64_t mg_rng_next(mg_rng *r) {
    uint64_t *s = r->s;
    const uint64_t result = rotl(s[1] * 5, 7) * 9;
    const uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

double mg_rng_uniform(mg_rng *r) { return (double)(mg_rng_next(r) >> 11) * 0x1.0p-53; }

/* ------------------------------------------------------------ token choice */

void mg_sampling_default(mg_sampling *s) {
    s->temperature = 1.0f;
    s->top_k = 0;
    s->top_p = 1.0f;
}

mg_status mg_sampling_check(const mg_sampling *s, mg_error *err) {
    if (!s) return mg_fail(err, MG_ERR_ARG, "sampling settings are NULL");
    if (!(s->temperature >= 0.0f) || !isfinite(s->temperature))
        return mg_fail(err, MG_ERR_ARG, "temperature %g: need a finite value >= 0",
                       (double)s->temperature);
    if (s->top_k < 0) return mg_fail(err, MG_ERR_ARG, "top-k %d: need >= 0", s->top_k);
    if (!(s->top_p > 0.0f && s->top_p <= 1.0f))
        return mg_fail(err, MG_ERR_ARG, "top-p %g: need 0 < top-p <= 1", (double)s->top_p);
    return 0;
}

static int allowed(int id) { return id != MG_PAD && id != MG_BOS; }

int mg_argmax_token(const float *logits, int V) {
    int best = MG_NO_TOKEN;
    for (int i = 0; i < V; i++) {
        if (!allowed(i) || isnan(logits[i]) || logits[i] == -INFINITY) continue;
        if (best < 0 || logits[i] > logits[best]) best = i;
    }
    return best;
}

#define MAX_STACK_V 256

int mg_sample_token(const float *logits, int V, const mg_sampling *s, mg_rng *rng) {
    if (!logits || !s || V <= MG_NUM_SPECIAL) return MG_NO_TOKEN;
    if (s->temperature == 0.0f || s->top_k == 1 || !rng) return mg_argmax_token(logits, V);
    int order_stack[MAX_STACK_V];
    double p_stack[MAX_STACK_V];
    int *order = order_stack;
    double *p = p_stack;
    if (V > MAX_STACK_V) {
        order = malloc((size_t)V * sizeof *order);
        p = malloc((size_t)V * sizeof *p);
        if (!order || !p) {
            free(order);
            free(p);
            return mg_argmax_token(logits, V);
        }
    }
    /* candidates sorted by (logit desc, id asc): insertion sort, V is small */
    int n = 0;
    for (int i = 0; i < V; i++) {
        if (!allowed(i) || isnan(logits[i]) || logits[i] == -INFINITY) continue;
        int j = n++;
        while (j > 0 && logits[order[j - 1]] < logits[i]) {
            order[j] = order[j - 1];
            j--;
        }
        order[j] = i;
    }
    int result = MG_NO_TOKEN;
    if (n > 0 && logits[order[0]] != INFINITY) {
        int keep = n;
        if (s->top_k > 0 && s->top_k < keep) keep = s->top_k;
        const double inv_t = 1.0 / (double)s->temperature, zmax = (double)logits[order[0]] * inv_t;
        double total = 0.0;
        for (int j = 0; j < keep; j++) {
            p[j] = exp((double)logits[order[j]] * inv_t - zmax);
            total += p[j];
        }
        if (s->top_p < 1.0f) {
            const double target = (double)s->top_p * total;
            double cum = 0.0;
            int m = 0;
            while (m < keep) {
                cum += p[m++];
                if (cum >= target) break;
            }
            keep = m;
            total = cum;
        }
        const double u = mg_rng_uniform(rng) * total;
        double acc = 0.0;
        result = order[keep - 1];
        for (int j = 0; j < keep; j++) {
            acc += p[j];
            if (u < acc) {
                result = order[j];
                break;
            }
        }
    } else if (n > 0) {
        result = order[0]; /* +inf logit: certain */
    }
    if (order != order_stack) {
        free(order);
        free(p);
    }
    return result;
}

/* ------------------------------------------------------------ constraint methods */

const char *mg_constrain_method_name(mg_constrain_method k) {
    return k == MG_CONSTRAIN_MASK ? "mask" : k == MG_CONSTRAIN_REJECT ? "reject" : "?";
}

int mg_constrain_method_parse(const char *s, mg_constrain_method *out) {
    if (!s) return 0;
    if (!strcmp(s, "mask")) *out = MG_CONSTRAIN_MASK;
    else if (!strcmp(s, "reject")) *out = MG_CONSTRAIN_REJECT;
    else return 0;
    return 1;
}

/* ------------------------------------------------------------ sampling */

void mg_sample_opts_default(mg_sample_opts *o) {
    memset(o, 0, sizeof *o);
    o->n = 1000;
    o->batch = 64;
    o->kind = MG_DECODE_KV;
    o->method = MG_CONSTRAIN_METHOD_DEFAULT;
    mg_sampling_default(&o->sampling);
    o->seed = 0;
}

void mg_samples_free(mg_samples *s) {
    if (!s) return;
    if (s->smiles)
        for (size_t i = 0; i < s->n; i++) free(s->smiles[i]);
    free(s->smiles);
    free(s->ntok);
    free(s->ended);
    free(s->restarts);
    free(s->fallback);
    free(s->blob_);
    memset(s, 0, sizeof *s);
}

/* out's n molecules, zeroed: 1, or 0 when out of memory (out then freed
 * and zeroed). */
static int samples_alloc(mg_samples *out, size_t n) {
    out->n = n;
    out->smiles = calloc(n ? n : 1, sizeof *out->smiles);
    out->ntok = calloc(n ? n : 1, sizeof *out->ntok);
    out->ended = calloc(n ? n : 1, sizeof *out->ended);
    out->restarts = calloc(n ? n : 1, sizeof *out->restarts);
    out->fallback = calloc(n ? n : 1, sizeof *out->fallback);
    if (out->smiles && out->ntok && out->ended && out->restarts && out->fallback) return 1;
    mg_samples_free(out);
    return 0;
}

/* What every part of a run shares: the slots per decoder (B, doubled to
 * DB with guidance), the scaffold prefix's length P, and a conditional
 * model's condition rows cond [DB, K] (NULL for an unconditional one) that
 * every part's decoder copies: no per-call input is left on the caller's
 * model (the naive decoder still runs forwards on it: its activations are
 * the last step's). */
typedef struct {
    int B, DB, P, guide;
    float *cond;
} sample_plan;

/* The options checked against the model and the plan for B slots per
 * decoder (pl->cond to free). */
static mg_status plan_sample(const mg_model *m, const mg_vocab *v, const mg_sample_opts *o, int B,
                             sample_plan *pl, mg_error *err) {
    mg_status rc = mg_sampling_check(&o->sampling, err);
    if (rc) return rc;
    if (o->batch < 1) return mg_fail(err, MG_ERR_ARG, "batch %d: need >= 1", o->batch);
    if (o->method != MG_CONSTRAIN_MASK && o->method != MG_CONSTRAIN_REJECT)
        return mg_fail(err, MG_ERR_ARG, "constrain method %d: mask or reject", (int)o->method);
    if (o->dtype != MG_DT_F32 && o->kind != MG_DECODE_KV)
        return mg_fail(err, MG_ERR_ARG, "sample: dtype %s needs KV decoding",
                       mg_dtype_name(o->dtype));
    const mg_model_config *c = mg_model_get_config(m);
    const int V = c->vocab_size, ctx = c->ctx_len;
    if (mg_vocab_size(v) != V)
        return mg_fail(err, MG_ERR_ARG, "vocabulary has %d tokens, the model %d", mg_vocab_size(v),
                       V);
    if (V <= MG_NUM_SPECIAL)
        return mg_fail(err, MG_ERR_ARG, "vocabulary of %d tokens has no data tokens", V);
    const int K = c->n_cond;
    if (!isfinite(o->guidance))
        return mg_fail(err, MG_ERR_ARG, "guidance %g is not finite", (double)o->guidance);
    if (o->condition && K == 0)
        return mg_fail(err, MG_ERR_ARG, "a condition given to an unconditional model");
    /* a scaffold: positions 1 .. P are the prefix (scaffold tokens, BOS),
     * fed without sampling; the molecule starts at position P + 1 */
    const int P = o->scaffold && o->scaffold_len > 0 ? o->scaffold_len + 1 : 0;
    if (P && !c->scaffold)
        return mg_fail(err, MG_ERR_ARG,
                       "a scaffold given to a model not trained with scaffolds (molgen train "
                       "--scaffold-column)");
    for (int j = 0; j < P - 1; j++)
        if (o->scaffold[j] < MG_NUM_SPECIAL || o->scaffold[j] >= V)
            return mg_fail(err, MG_ERR_ARG, "scaffold token %d: id %d is not a data token", j,
                           (int)o->scaffold[j]);
    if (P + 1 >= ctx)
        return mg_fail(err, MG_ERR_ARG,
                       "a scaffold of %d tokens leaves no room in the model's %d positions",
                       P - 1, ctx);
    /* guidance: rows B..2B-1 decode the same tokens with no condition given */
    const int guide = o->condition && o->guidance != 0.0f && o->guidance != 1.0f;
    const int DB = guide ? 2 * B : B;
    float *cond_rows = K ? malloc((size_t)DB * K * sizeof(float)) : NULL;
    if (K && !cond_rows) return mg_fail(err, MG_ERR_NOMEM, "out of memory");
    for (int r = 0; r < DB * K; r++) cond_rows[r] = o->condition && r < B * K ? o->condition[r % K] : NAN;
    *pl = (sample_plan){B, DB, P, guide, cond_rows};
    return MG_OK;
}

/* Slot r's molecule k starts again at BOS (its decoder row r and, with
 * guidance, row g >= 0; its mask row), counted in out->restarts[k]. */
static mg_status restart_molecule(mg_decoder *dec, mg_token_mask *mask, int r, int g,
                                  mg_samples *out, size_t k, int32_t *tok, int *len, int *fed,
                                  mg_error *err) {
    out->restarts[k]++;
    mg_status rc = mg_decoder_restart_row(dec, r, err);
    if (!rc && g >= 0) rc = mg_decoder_restart_row(dec, g, err);
    if (rc) return rc;
    tok[r] = MG_BOS;
    len[r] = 0;
    fed[r] = 0;
    mg_token_mask_reset_row(mask, r);
    return MG_OK;
}

/* One part's sampling state: B slots, decoded on DB rows (2B with guidance:
 * rows B..2B-1 without the condition). */
typedef struct {
    const mg_vocab *v;
    const mg_sample_opts *o;
    int B, DB, P, guide, V, ctx;
    int room;              /* molecule tokens before the context is full */
    int refill;            /* continuous batching (KV decoding; below) */
    int reject, greedy;    /* --constrain-method reject; greedy choices */
    size_t first, n, next; /* molecules first .. first + n - 1; the next to start */
    int live;              /* active slots */
    int32_t *gen;          /* [B, ctx] each slot's molecule tokens */
    int32_t *tok;          /* [DB] the tokens of the next step */
    int *len;              /* [B] molecule tokens so far */
    int *fed;              /* [B] prefix tokens fed so far */
    unsigned char *active; /* [B] */
    float *logits;         /* [DB, V] */
    mg_rng *rng;           /* [B] the stream of the slot's molecule */
    size_t *mol;           /* [B] the slot's molecule */
    char *sbuf;            /* [slen] a decoded string */
    size_t slen;
    mg_decoder *dec;
    mg_token_mask *mask;
    mg_samples *out;
} sampler;

static void sampler_free(sampler *s) {
    mg_decoder_free(s->dec);
    mg_token_mask_free(s->mask);
    free(s->gen);
    free(s->tok);
    free(s->len);
    free(s->fed);
    free(s->active);
    free(s->logits);
    free(s->rng);
    free(s->mol);
    free(s->sbuf);
}

/* s for molecules first .. first + n - 1 of o into out, on one decoder of
 * pl's slots and `threads` threads (0: the model's); with n == 0 no
 * decoder. */
static mg_status sampler_open(sampler *s, mg_model *m, const mg_vocab *v, const mg_sample_opts *o,
                              const sample_plan *pl, int threads, size_t first, size_t n,
                              mg_samples *out, mg_error *err) {
    memset(out, 0, sizeof *out);
    const mg_model_config *c = mg_model_get_config(m);
    const int B = pl->B, DB = pl->DB, V = c->vocab_size, ctx = c->ctx_len;
    *s = (sampler){.v = v, .o = o, .B = B, .DB = DB, .P = pl->P, .guide = pl->guide, .V = V,
                   .ctx = ctx, .room = ctx - pl->P, .first = first, .n = n, .out = out};
    const int have_out = samples_alloc(out, n);
    s->gen = malloc((size_t)B * (size_t)ctx * sizeof *s->gen);
    s->tok = malloc((size_t)DB * sizeof *s->tok);
    s->len = malloc((size_t)B * sizeof *s->len);
    s->fed = malloc((size_t)B * sizeof *s->fed);
    s->active = malloc((size_t)B);
    s->logits = malloc((size_t)DB * (size_t)V * sizeof *s->logits);
    s->rng = malloc((size_t)B * sizeof *s->rng);
    s->mol = malloc((size_t)B * sizeof *s->mol);
    s->slen = (size_t)ctx * (MG_TOKEN_MAX + 1) + 1;
    s->sbuf = malloc(s->slen);
    if (!have_out || !s->gen || !s->tok || !s->len || !s->fed || !s->active || !s->logits ||
        !s->rng || !s->mol || !s->sbuf)
        return mg_fail(err, MG_ERR_NOMEM, "out of memory for %zu molecules", n);
    if (n == 0) return MG_OK;
    /* plan_sample refused a dtype other than fp32 with naive decoding */
    mg_status rc = mg_decoder_new_on(m, o->kind, o->dtype, DB, threads, &s->dec, err);
    if (!rc && pl->cond) rc = mg_decoder_set_conditions(s->dec, pl->cond, DB, err);
    if (!rc && o->constrain != MG_CONSTRAIN_NONE)
        rc = mg_token_mask_new(v, B, ctx, o->constrain, &s->mask, err);
    /* KV decoding uses continuous batching: slot r holds molecule mol[r];
     * when it ends, the next molecule starts in that slot at position 0.
     * The naive decoder runs batch by batch instead (a refilled slot would
     * make every step re-run the longest prefix of the batch): a finished
     * row idles until the whole batch is done. Idle slots restart every
     * step as cheap dummies at position 0. Results do not depend on this:
     * molecule k always draws from RNG stream k. */
    s->refill = o->kind == MG_DECODE_KV;
    s->reject = s->mask && o->method == MG_CONSTRAIN_REJECT;
    s->greedy = o->sampling.temperature == 0.0f || o->sampling.top_k == 1;
    return rc;
}

/* The next molecule starts in slot r (its stream, its mask row). */
static void slot_start(sampler *s, int r) {
    s->mol[r] = s->next;
    mg_rng_seed(&s->rng[r], s->o->seed, (uint64_t)(s->first + s->next));
    if (s->mask) mg_token_mask_reset_row(s->mask, r);
    s->next++;
}

/* Every slot at BOS, filled with the next molecules while there are any. */
static mg_status start_batch(sampler *s, mg_error *err) {
    mg_status rc = mg_decoder_reset(s->dec, s->DB, err);
    if (rc) return rc;
    for (int r = 0; r < s->B; r++) {
        s->tok[r] = MG_BOS;
        s->len[r] = 0;
        s->fed[r] = 0;
        s->active[r] = s->next < s->n;
        if (!s->active[r]) continue;
        slot_start(s, r);
        s->live++;
    }
    return MG_OK;
}

/* One decoder step on tok; with guidance the logits of slot r become
 * u + w (c - u), c = row r's logits, u = row B + r's. */
static mg_status decode_step(sampler *s, mg_error *err) {
    const size_t BV = (size_t)s->B * (size_t)s->V;
    float *lg = s->logits;
    if (s->guide) memcpy(s->tok + s->B, s->tok, (size_t)s->B * sizeof *s->tok);
    mg_status rc = mg_decoder_step(s->dec, s->tok, lg, err);
    if (rc || !s->guide) return rc;
    for (size_t i = 0; i < BV; i++) lg[i] = lg[BV + i] + s->o->guidance * (lg[i] - lg[BV + i]);
    return MG_OK;
}

/* An idle slot restarts as a cheap dummy at position 0. */
static mg_status idle_row(sampler *s, int r, mg_error *err) {
    s->tok[r] = MG_BOS;
    mg_status rc = mg_decoder_restart_row(s->dec, r, err);
    if (!rc && s->guide) rc = mg_decoder_restart_row(s->dec, s->B + r, err);
    return rc;
}

/* Slot r's next token for molecule k into *t (the rules of sample.h), or
 * *t = -1 when the molecule starts again instead. */
static mg_status draw_token(sampler *s, int r, size_t k, int *t, mg_error *err) {
    mg_samples *out = s->out;
    float *lg = s->logits + (size_t)r * s->V;
    const int g = s->guide ? s->B + r : -1;
    *t = -1;
    /* rejection draws from the unmasked logits; a molecule it gave up on is
     * masked (its Kekulé restarts counted past the rejections) */
    const int masking = s->mask && (!s->reject || (out->fallback[k] & MG_FALLBACK_MASKED));
    const int kek = out->restarts[k] - (s->reject ? (s->greedy ? 1 : MG_SAMPLE_REJECTS) : 0);
    int left = masking ? mg_token_mask_apply(s->mask, r, lg, 0) : 1;
    if (left < 0 && kek >= MG_SAMPLE_RESTARTS) {
        /* restarted often enough: this time the check goes */
        out->fallback[k] |= MG_FALLBACK_KEKULE;
        left = mg_token_mask_apply(s->mask, r, lg, 1);
    } else if (left < 0) { /* a Kekulé dead end: the molecule starts again */
        return restart_molecule(s->dec, s->mask, r, g, out, k, s->tok, s->len, s->fed, err);
    }
    if (masking && left == 0) {
        mg_token_mask_prefix(s->mask, r, s->sbuf, s->slen);
        return mg_fail(err, MG_ERR_STATE,
                       "molecule %zu position %d: no token can follow '%s' under --constrain %s",
                       s->first + k, s->len[r] + 1, s->sbuf, mg_constrain_name(s->o->constrain));
    }
    const int tk = mg_sample_token(lg, s->V, &s->o->sampling, &s->rng[r]);
    if (tk < 0)
        return mg_fail(err, MG_ERR_NUMERIC, "molecule %zu position %d: the logits are not finite",
                       s->first + k, s->len[r] + 1);
    if (s->mask && !masking &&
        (!mg_token_mask_accepts(s->mask, r, tk) || (tk != MG_EOS && s->len[r] + 1 >= s->room))) {
        /* a draw the check refuses, or no room left for EOS: rejected, the
         * molecule starts again */
        mg_status rc = restart_molecule(s->dec, s->mask, r, g, out, k, s->tok, s->len, s->fed, err);
        if (rc) return rc;
        /* greedy choices repeat the refused string: no use retrying */
        if (out->restarts[k] >= MG_SAMPLE_REJECTS || s->greedy)
            out->fallback[k] |= MG_FALLBACK_MASKED;
        return MG_OK;
    }
    *t = tk;
    return MG_OK;
}

/* Slot r's molecule k is complete (EOS, or no position left): its string
 * and counts into out; the slot takes the next molecule or idles. */
static mg_status finish_molecule(sampler *s, int r, size_t k, mg_error *err) {
    mg_samples *out = s->out;
    size_t sl = 0;
    mg_status rc = mg_vocab_decode(s->v, s->gen + (size_t)r * s->ctx, s->len[r], s->sbuf, s->slen,
                                   &sl, err);
    if (rc) return rc;
    char *str = malloc(sl + 1);
    if (!str) return mg_fail(err, MG_ERR_NOMEM, "out of memory");
    memcpy(str, s->sbuf, sl + 1);
    out->smiles[k] = str;
    out->ntok[k] = s->len[r];
    out->tokens += s->len[r] + (out->ended[k] ? 1 : 0);
    if (!out->ended[k]) out->truncated++;
    out->restarts_total += (size_t)out->restarts[k];
    out->fallbacks += (out->fallback[k] & MG_FALLBACK_KEKULE) != 0;
    out->masked += (out->fallback[k] & MG_FALLBACK_MASKED) != 0;
    rc = idle_row(s, r, err); /* the slot back at BOS */
    if (rc) return rc;
    s->len[r] = 0;
    s->fed[r] = 0;
    if (s->refill && s->next < s->n) {
        slot_start(s, r);
    } else {
        s->active[r] = 0;
        s->live--;
    }
    return MG_OK;
}

/* Active slot r after a step: the prefix fed, or a token drawn and kept. */
static mg_status row_step(sampler *s, int r, mg_error *err) {
    if (s->fed[r] < s->P) { /* the prefix: scaffold tokens, then BOS */
        s->tok[r] = s->fed[r] < s->P - 1 ? s->o->scaffold[s->fed[r]] : MG_BOS;
        s->fed[r]++;
        return MG_OK;
    }
    const size_t k = s->mol[r];
    int t;
    mg_status rc = draw_token(s, r, k, &t, err);
    if (rc || t < 0) return rc;
    if (t == MG_EOS) {
        s->out->ended[k] = 1;
        return finish_molecule(s, r, k, err);
    }
    if (s->mask && (rc = mg_token_mask_push(s->mask, r, t, err))) return rc;
    s->gen[(size_t)r * s->ctx + s->len[r]++] = t;
    s->tok[r] = t;
    /* no position left for the next token */
    return s->len[r] >= s->room ? finish_molecule(s, r, k, err) : MG_OK;
}

/* Steps until every molecule of the part is complete. */
static mg_status sample_loop(sampler *s, mg_error *err) {
    const double t0 = mg_now_s();
    for (;;) {
        if (s->o->stop && *s->o->stop)
            return mg_fail(err, MG_ERR_INTERRUPTED, "interrupted by signal %d", (int)*s->o->stop);
        mg_status rc = MG_OK;
        if (s->live == 0) {
            if (s->next >= s->n) break;
            rc = start_batch(s, err);
        }
        if (!rc) rc = decode_step(s, err);
        for (int r = 0; !rc && r < s->B; r++)
            rc = s->active[r] ? row_step(s, r, err) : idle_row(s, r, err);
        if (rc) return rc;
    }
    s->out->seconds = mg_now_s() - t0;
    return MG_OK;
}

/* Molecules first .. first + n - 1 of o (streams first + k) into out, on
 * one decoder of pl's slots and `threads` threads (0: the model's). */
static mg_status sample_part(mg_model *m, const mg_vocab *v, const mg_sample_opts *o,
                             const sample_plan *pl, int threads, size_t first, size_t n,
                             mg_samples *out, mg_error *err) {
    sampler s;
    mg_status rc = sampler_open(&s, m, v, o, pl, threads, first, n, out, err);
    if (!rc && n > 0) rc = sample_loop(&s, err);
    sampler_free(&s);
    if (rc) mg_samples_free(out);
    return rc;
}

mg_status mg_samples_pack(const mg_samples *s, char **buf, size_t *bytes, mg_error *err) {
    size_t total = 0;
    for (size_t i = 0; i < s->n; i++) total += 2 + 2 * sizeof(int32_t) + strlen(s->smiles[i]) + 1;
    char *p = *buf = malloc(total ? total : 1);
    *bytes = total;
    if (!p) return mg_fail(err, MG_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < s->n; i++) {
        const int32_t t = s->ntok[i];
        const size_t sl = strlen(s->smiles[i]) + 1;
        const int32_t rs = s->restarts[i];
        *p++ = (char)s->ended[i];
        *p++ = (char)s->fallback[i];
        memcpy(p, &rs, sizeof rs);
        p += sizeof rs;
        memcpy(p, &t, sizeof t);
        p += sizeof t;
        memcpy(p, s->smiles[i], sl);
        p += sl;
    }
    return MG_OK;
}

mg_status mg_samples_unpack(const char *buf, size_t bytes, size_t n, mg_samples *out,
                            mg_error *err) {
    mg_samples_free(out);
    if (!samples_alloc(out, n)) return mg_fail(err, MG_ERR_NOMEM, "out of memory");
    const char *q = buf, *end = buf + bytes;
    mg_status rc = MG_OK;
    for (size_t k = 0; !rc && k < n; k++) {
        const char *z = q + 2 + 2 * sizeof(int32_t);
        const size_t sl = z < end ? strnlen(z, (size_t)(end - z)) + 1 : 0;
        if (!sl || z + sl > end) {
            rc = mg_fail(err, MG_ERR_STATE, "the ranks sent %zu molecules, not %zu", k, n);
            break;
        }
        int32_t t, rs;
        out->ended[k] = (unsigned char)q[0];
        out->fallback[k] = (unsigned char)q[1];
        memcpy(&rs, q + 2, sizeof rs);
        memcpy(&t, q + 2 + sizeof rs, sizeof t);
        out->restarts[k] = rs;
        out->restarts_total += (size_t)rs;
        out->fallbacks += (out->fallback[k] & MG_FALLBACK_KEKULE) != 0;
        out->masked += (out->fallback[k] & MG_FALLBACK_MASKED) != 0;
        out->ntok[k] = t;
        if (!(out->smiles[k] = malloc(sl))) {
            rc = mg_fail(err, MG_ERR_NOMEM, "out of memory");
            break;
        }
        memcpy(out->smiles[k], z, sl);
        out->tokens += t + (out->ended[k] ? 1 : 0);
        if (!out->ended[k]) out->truncated++;
        q = z + sl;
    }
    if (rc) mg_samples_free(out);
    return rc;
}

/* Rank 0's out = every rank's part, in rank order (mg_samples_pack's bytes). */
static mg_status gather_parts(mg_dist *d, const mg_samples *part, size_t n, mg_samples *out,
                              mg_error *err) {
    memset(out, 0, sizeof *out);
    char *buf = NULL;
    size_t bytes = 0;
    mg_status rc = mg_samples_pack(part, &buf, &bytes, err);
    void *all = NULL;
    size_t all_n = 0;
    if (!(rc = mg_dist_agree(d, rc, err))) rc = mg_dist_gather(d, buf, bytes, &all, &all_n, err);
    free(buf);
    if (!rc && !d->rank) rc = mg_samples_unpack(all, all_n, n, out, err);
    free(all);
    return rc;
}

/* Molecules first .. first + n - 1 into out. A KV run on T > 1 threads is
 * split into T consecutive parts of the molecules, each decoded on one
 * thread by its own decoder of batch / T slots (rounded up): one
 * thread's steps never wait for another's, where a shared decoder's small
 * products would meet at a barrier every few microseconds, dozens of times
 * per step. A molecule's tokens come from its own stream and its rows'
 * single-threaded products, so the output is that of --threads 1 (up to
 * the rounding of a row that lands in OpenBLAS's tail kernel in one split
 * and not the other, as for the batch size). The naive decoder shares the
 * model's buffers and runs on the model's threads. */
static mg_status sample_range(mg_model *m, const mg_vocab *v, const mg_sample_opts *o, size_t first,
                              size_t n, mg_samples *out, mg_error *err) {
    memset(out, 0, sizeof *out);
    const int T = o->kind == MG_DECODE_KV && mg_model_threads(m) > 1 ? mg_model_threads(m) : 1;
    const size_t per = (n + (size_t)T - 1) / (size_t)T;
    size_t B = o->batch > 0 ? ((size_t)o->batch + (size_t)T - 1) / (size_t)T : 1;
    if (B > per) B = per ? per : 1;
    sample_plan pl;
    mg_status rc = plan_sample(m, v, o, (int)B, &pl, err);
    if (rc) return rc;
    if (T == 1) {
        rc = sample_part(m, v, o, &pl, 0, first, n, out, err);
        free(pl.cond);
        return rc;
    }
    const double t0 = mg_now_s();
    mg_samples *ps = calloc((size_t)T, sizeof *ps);
    mg_error *es = calloc((size_t)T, sizeof *es);
    mg_status *rs = calloc((size_t)T, sizeof *rs);
    if (!ps || !es || !rs) {
        free(ps);
        free(es);
        free(rs);
        free(pl.cond);
        return mg_fail(err, MG_ERR_NOMEM, "out of memory");
    }
#pragma omp parallel for num_threads(T) schedule(static, 1)
    for (int t = 0; t < T; t++) {
        size_t a, b;
        mg_dist_range(n, t, T, &a, &b);
        rs[t] = sample_part(m, v, o, &pl, 1, first + a, b - a, &ps[t], &es[t]);
    }
    for (int t = 0; t < T && !rc; t++)
        if (rs[t]) rc = mg_fail(err, rs[t], "%s", es[t].message);
    if (!rc) { /* the parts in order; their strings move to out */
        if (!samples_alloc(out, n)) rc = mg_fail(err, MG_ERR_NOMEM, "out of memory");
        for (int t = 0, k = 0; t < T && !rc; t++) {
            for (size_t i = 0; i < ps[t].n; i++, k++) {
                out->smiles[k] = ps[t].smiles[i];
                out->ntok[k] = ps[t].ntok[i];
                out->ended[k] = ps[t].ended[i];
                out->restarts[k] = ps[t].restarts[i];
                out->fallback[k] = ps[t].fallback[i];
                ps[t].smiles[i] = NULL;
            }
            out->tokens += ps[t].tokens;
            out->truncated += ps[t].truncated;
            out->restarts_total += ps[t].restarts_total;
            out->fallbacks += ps[t].fallbacks;
            out->masked += ps[t].masked;
        }
        out->seconds = mg_now_s() - t0;
    }
    for (int t = 0; t < T; t++) mg_samples_free(&ps[t]);
    free(ps);
    free(es);
    free(rs);
    free(pl.cond);
    return rc;
}

mg_status mg_sample(mg_model *m, const mg_vocab *v, const mg_sample_opts *o, mg_samples *out,
                    mg_error *err) {
    if (!m || !v || !o || !out)
        return mg_fail(err, MG_ERR_ARG, "model, vocab, options and out must be non-NULL");
    mg_dist *d = o->dist;
    if (!d || d->size <= 1) return sample_range(m, v, o, 0, o->n, out, err);
    const double t0 = mg_now_s();
    size_t i0, i1;
    mg_dist_range(o->n, d->rank, d->size, &i0, &i1);
    mg_samples part;
    mg_status rc = mg_dist_agree(d, sample_range(m, v, o, i0, i1 - i0, &part, err), err);
    if (!rc) rc = gather_parts(d, &part, o->n, out, err);
    mg_samples_free(&part);
    if (!rc) out->seconds = mg_now_s() - t0;
    return rc;
}
