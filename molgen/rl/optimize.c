/* molgen optimize: REINVENT-style reinforcement learning (see optimize.h). */
#define _POSIX_C_SOURCE 200809L
#include "rl/optimize.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "train/checkpoint.h"
#include "base/json.h"
#include "nn/optim.h"
#include "base/safetensors.h"
#include "gen/sample.h"
#include "rl/inception_memory.h"
#include "rl/scorer_process.h"
#include "rl/strmap.h"
#include "base/util.h"

#define OPT_FORMAT 1
/* The range of a molecule's NLL (nats) in the state: a sum of per-token
 * NLLs lse - z_t >= 0 (exactly: lse = max + log(sum) with sum >= 1), and
 * real ones are tens of nats (13 to 66 in the tests' runs, ~60 tokens at
 * most); 1e6 is 15,000 times that, yet keeps the DAP difference
 * -prior_nll + sigma s + agent_nll (sigma <= 1e6) within 3e6, so the float
 * row weights and the squared loss stay finite. A run never saves one
 * outside (row_nlls refuses it), so the reader refuses only edited files. */
#define OPT_NLL_MAX 1e6

/* ------------------------------------------------------------ state */

typedef struct {
    char *smiles, *canonical, *scaffold, *comps;
    double score, prior_nll, agent_nll;
    int64_t call, step;
} mol;

struct mg_opt {
    mg_model *prior, *agent;
    const mg_vocab *vocab;
    mg_scorer *sc;
    mg_opt_opts op;
    mg_dist *d, alone; /* the ranks (alone: op.dist NULL) */
    mg_adamw adam;
    int ctx, V;
    uint64_t prior_digest;
    mol *mols;
    size_t nmol, capmol;
    mg_strmap by_key, raw; /* canonical -> molecule; every spelling sampled -> molecule or -1 */
    mg_diversity_filter df;
    mg_mem_entry *mem;
    int nmem;
    int64_t step, collapse_run, plateau_run, step0, calls0;
    int64_t nan_sent; /* molecules the scorer answered nan (this invocation) */
    char *saved_scorer; /* the restored state's scorer command (NULL: none) */
    int scorer_other;   /* ... and it is not this run's (--scorer-changed) */
    char reason[32];
    double t0;
    /* scratch of a step */
    int32_t *ids;
    int64_t *len;
    double *pnll, *anll;
    float *w;
    int cap_rows;
};

void mg_opt_opts_default(mg_opt_opts *o) {
    memset(o, 0, sizeof *o);
    o->budget = 10000;
    o->batch = 64;
    o->sigma = 128;
    o->lr = 1e-4;
    o->constrain = MG_CONSTRAIN_VALENCE;
    o->df = MG_DF_SCAFFOLD;
    o->df_bucket = 25;
    o->df_min_score = 0.4;
    o->repeat_penalty = 0.5;
    o->memory = 50;
    o->replay = 10;
    o->collapse_steps = 20;
    o->collapse_share = 0.02;
    o->save_every = 20;
}

mg_status mg_opt_opts_check(const mg_opt_opts *o, mg_error *err) {
    if (o->budget < 1) return mg_fail(err, MG_ERR_ARG, "budget %lld < 1", (long long)o->budget);
    if (o->batch < 1 || o->batch > 100000) return mg_fail(err, MG_ERR_ARG, "batch %d", o->batch);
    if (!(o->sigma >= 0 && isfinite(o->sigma))) return mg_fail(err, MG_ERR_ARG, "sigma %g", o->sigma);
    if (!(o->lr > 0 && o->lr < 10)) return mg_fail(err, MG_ERR_ARG, "lr %g: need (0, 10)", o->lr);
    if (o->memory < 0 || o->replay < 0 || o->replay > o->memory)
        return mg_fail(err, MG_ERR_ARG, "replay %d must be in [0, memory %d]", o->replay,
                       o->memory);
    if (o->aug_rounds < 0 || (o->aug_rounds > 0 && o->memory == 0))
        return mg_fail(err, MG_ERR_ARG, "augmented memory needs a memory (--memory > 0)");
    if (!(o->repeat_penalty >= 0 && o->repeat_penalty <= 1))
        return mg_fail(err, MG_ERR_ARG, "repeat penalty %g: need [0, 1]", o->repeat_penalty);
    if (o->save_every < 1) return mg_fail(err, MG_ERR_ARG, "save every %d < 1", o->save_every);
    return MG_OK;
}

static uint64_t digest_params(mg_model *m) {
    return mg_fnv1a(MG_FNV1A_INIT, mg_model_params(m), mg_model_num_params(m) * sizeof(float));
}

mg_status mg_opt_new(mg_model *prior, mg_model *agent, const mg_vocab *vocab,
                     struct mg_scorer *scorer, const mg_opt_opts *opts, mg_opt **out,
                     mg_error *err) {
    *out = NULL;
    mg_status rc = mg_opt_opts_check(opts, err);
    if (rc) return rc;
    const mg_model_config *c = mg_model_get_config(prior);
    if (c->n_cond || c->scaffold)
        return mg_fail(err, MG_ERR_ARG,
                       "the prior is a conditional or scaffold model: optimize needs a plain one");
    if (mg_model_num_params(agent) != mg_model_num_params(prior) ||
        memcmp(mg_model_params(agent), mg_model_params(prior),
               mg_model_num_params(prior) * sizeof(float)))
        return mg_fail(err, MG_ERR_ARG, "the agent must start as a copy of the prior");
    mg_opt *o = calloc(1, sizeof *o);
    if (!o) return mg_fail(err, MG_ERR_NOMEM, "out of memory");
    o->prior = prior;
    o->agent = agent;
    o->vocab = vocab;
    o->sc = scorer;
    mg_scorer_set_stop(scorer, opts->stop); /* a signal ends a wait for the scorer */
    mg_model_set_dtype(prior, opts->dtype);
    mg_model_set_dtype(agent, opts->dtype);
    o->op = *opts;
    mg_df_init(&o->df, opts->df, opts->df_bucket, opts->df_min_score);
    o->alone = (mg_dist){0, 1, 0.0};
    o->d = opts->dist ? opts->dist : &o->alone;
    o->ctx = c->ctx_len;
    o->V = c->vocab_size;
    o->prior_digest = digest_params(prior);
    mg_adamw_config ac;
    mg_adamw_config_default(&ac);
    ac.lr = (float)opts->lr;
    ac.min_lr_frac = 1.0f;
    ac.warmup_steps = 0;
    ac.total_steps = 1;
    ac.beta1 = 0.9f;
    ac.beta2 = 0.999f;
    ac.eps = 1e-8f;
    ac.weight_decay = 0.0f;
    ac.grad_clip = 0.0f;
    if ((rc = mg_ckpt_optimizer(agent, &ac, &o->adam, err))) {
        free(o);
        return rc;
    }
    o->adam.threads = mg_model_threads(agent);
    o->cap_rows = opts->batch + (opts->memory > opts->replay ? opts->memory : opts->replay);
    const size_t T = (size_t)o->ctx + 1, R = (size_t)o->cap_rows;
    o->ids = malloc(R * T * sizeof *o->ids);
    o->len = malloc(R * sizeof *o->len);
    o->pnll = malloc(R * sizeof *o->pnll);
    o->anll = malloc(R * sizeof *o->anll);
    o->w = malloc(R * sizeof *o->w);
    o->mem = calloc((size_t)opts->memory + 1, sizeof *o->mem);
    if (!o->ids || !o->len || !o->pnll || !o->anll || !o->w || !o->mem) {
        mg_opt_free(o);
        return mg_fail(err, MG_ERR_NOMEM, "out of memory");
    }
    o->t0 = mg_now_s();
    *out = o;
    return MG_OK;
}

static void mol_clear(mol *m) {
    free(m->smiles);
    free(m->canonical);
    free(m->scaffold);
    free(m->comps);
}

void mg_opt_free(mg_opt *o) {
    if (!o) return;
    free(o->saved_scorer);
    for (size_t i = 0; i < o->nmol; i++) mol_clear(&o->mols[i]);
    free(o->mols);
    mg_strmap_free(&o->by_key);
    mg_strmap_free(&o->raw);
    mg_df_free(&o->df);
    mg_adamw_free(&o->adam);
    free(o->mem);
    free(o->ids);
    free(o->len);
    free(o->pnll);
    free(o->anll);
    free(o->w);
    free(o);
}

const char *mg_opt_saved_scorer(const mg_opt *o, int *other) {
    if (other) *other = o->scorer_other;
    return o->saved_scorer;
}

const char *mg_opt_stop_reason(const mg_opt *o) { return o->reason; }

/* Every rank's rc agreed (alone: rc). */
static mg_status agreed(mg_opt *o, mg_status rc, mg_error *err) {
    return mg_dist_agree(o->d, rc, err);
}
int64_t mg_opt_calls(const mg_opt *o) { return (int64_t)o->nmol; }
int64_t mg_opt_steps(const mg_opt *o) { return o->step; }

/* the diversity filter's bucket of a molecule */
static const char *bucket_key(const mg_opt *o, const mol *m) {
    return mg_df_key(&o->df, m->scaffold, m->canonical);
}

/* Appends m (taking its strings) and indexes it. */
static mg_status add_mol(mg_opt *o, mol *m, mg_error *err) {
    if (o->nmol == o->capmol) {
        const size_t nc = o->capmol ? 2 * o->capmol : 256;
        mol *nm = realloc(o->mols, nc * sizeof *nm);
        if (!nm) return mg_fail(err, MG_ERR_NOMEM, "out of memory");
        o->mols = nm;
        o->capmol = nc;
    }
    const int64_t idx = (int64_t)o->nmol;
    o->mols[o->nmol++] = *m;
    const mol *s = &o->mols[idx];
    int bad = mg_strmap_put(&o->by_key, s->canonical, idx) || mg_strmap_put(&o->raw, s->smiles, idx) ||
              mg_strmap_put(&o->raw, s->canonical, idx);
    if (!bad) bad = mg_df_add(&o->df, bucket_key(o, s), s->score);
    return bad ? mg_fail(err, MG_ERR_NOMEM, "out of memory") : MG_OK;
}

/* ------------------------------------------------------------ rows */

/* Row r of the scratch batch from smiles: 1, or 0 when it cannot be a row
 * (a token outside the vocabulary, too long). */
static int encode_row(mg_opt *o, int r, const char *smiles) {
    const int T = o->ctx + 1;
    int32_t *row = o->ids + (size_t)r * T;
    int n = 0;
    mg_error e;
    if (mg_vocab_encode(o->vocab, smiles, row + 1, T - 2, &n, &e) || n + 2 > T) return 0;
    row[0] = MG_BOS;
    row[n + 1] = MG_EOS;
    for (int t = n + 2; t < T; t++) row[t] = MG_PAD;
    o->len[r] = n + 2;
    return 1;
}

/* rows [first, first + n) packed for a forward: the longest length */
static int rows_T(const mg_opt *o, int first, int n) {
    int T = 2;
    for (int r = first; r < first + n; r++)
        if (o->len[r] > T) T = (int)o->len[r];
    return T;
}

/* NLL of rows [0, n) under m; the rows are repacked to width T in place of
 * the scratch's ctx + 1 into a temporary. Keeps m's activations. */
static mg_status rows_nll(mg_opt *o, mg_model *m, int first, int n, double *nll, mg_error *err) {
    if (n <= 0) return MG_OK;
    const int W = o->ctx + 1, T = rows_T(o, first, n);
    int32_t *p = malloc((size_t)n * T * sizeof *p);
    if (!p) return mg_fail(err, MG_ERR_NOMEM, "out of memory");
    for (int r = 0; r < n; r++)
        memcpy(p + (size_t)r * T, o->ids + (size_t)(first + r) * W, (size_t)T * sizeof *p);
    mg_status rc = mg_model_sequence_nll(m, p, o->len + first, n, T, nll, err);
    free(p);
    return rc;
}

/* The DAP gradient of n rows that are part of a loss over N used rows (all
 * ranks'): weights 2 d_r / N, the sum of d_r^2 of these rows into *sumsq;
 * no backward (the gradients untouched) when none of them is used. */
static mg_status dap_rows(mg_model *agent, int n, const double *prior_nll,
                          const double *agent_nll, const double *score, const unsigned char *use,
                          double sigma, int N, float *w, double *sumsq, mg_error *err) {
    double L = 0;
    int any = 0;
    for (int r = 0; r < n; r++) {
        /* target - agent_ll = (-prior_nll + sigma s) + agent_nll */
        const double d = use[r] ? -prior_nll[r] + sigma * score[r] + agent_nll[r] : 0.0;
        L += d * d;
        w[r] = N ? (float)(2.0 * d / N) : 0.0f;
        any |= use[r];
    }
    *sumsq = L;
    if (!any || !N) return MG_OK;
    mg_status rc = mg_model_set_row_weights(agent, w, n, err);
    if (!rc) rc = mg_model_backward(agent, err);
    mg_error e2;
    mg_model_set_row_weights(agent, NULL, 0, &e2);
    return rc;
}

mg_status mg_opt_dap_backward(mg_model *agent, int n, const double *prior_nll,
                              const double *agent_nll, const double *score,
                              const unsigned char *use, double sigma, float *w, double *loss,
                              mg_error *err) {
    int N = 0;
    for (int r = 0; r < n; r++) N += use[r] != 0;
    double L = 0;
    mg_status rc = dap_rows(agent, n, prior_nll, agent_nll, score, use, sigma, N, w, &L, err);
    *loss = N ? L / N : 0.0;
    return rc;
}

/* One Adam step on rows [0, n) whose NLLs under the prior (pnll) and the
 * agent (anll) are computed, learning scores score [n]; rows with use[r] 0
 * get no weight. This rank's part of the rows (mg_dist_range) is the
 * agent's last forward; the ranks' gradients are summed. The loss in *loss. */
static mg_status dap_update(mg_opt *o, int n, const double *score, const unsigned char *use,
                            double *loss, mg_error *err) {
    size_t a, b;
    mg_dist_range((size_t)n, o->d->rank, o->d->size, &a, &b);
    int N = 0;
    for (int r = 0; r < n; r++) N += use[r] != 0;
    double L = 0;
    mg_status rc = dap_rows(o->agent, (int)(b - a), o->pnll + a, o->anll + a, score + a, use + a,
                            o->op.sigma, N, o->w, &L, err);
    int mine = 0;
    for (size_t r = a; r < b; r++) mine |= use[r];
    float *g = mg_model_grads(o->agent);
    const size_t P = mg_model_num_params(o->agent);
    if (!mine && o->d->size > 1) memset(g, 0, P * sizeof *g); /* no rows: adds nothing */
    if ((rc = agreed(o, rc, err))) return rc;
    if (o->d->size > 1 && N) {
        mg_dist_sum_f32(o->d, g, P);
        mg_dist_sum_f64(o->d, &L, 1);
    }
    *loss = N ? L / N : 0.0;
    if (N) rc = mg_adamw_step(&o->adam, mg_model_params(o->agent), g, NULL, NULL, err);
    return agreed(o, rc, err);
}

/* ------------------------------------------------------------ one step */

enum { ROW_OUT = -3, ROW_INVALID = -2, ROW_PENDING = -1 };

typedef struct {
    mg_samples smp;
    int B;
    int64_t *gi;           /* [B] mol index (nmol + j: the step's new j), or ROW_* */
    unsigned char *enc;    /* [B] the row is encoded (a loss row) */
    double *s, *s2;        /* [B] score, learning score */
    mol *newm;             /* the step's new molecules */
    size_t nnew;
    mg_mem_entry *mem;        /* the memory after the step */
    int nmem;
    char **aug;            /* [nmem * aug_rounds] randomized spellings */
    int64_t nnan;          /* the step's molecules the scorer answered nan */
    int64_t rmol[1024];    /* the replayed memory entries' molecules and scores */
    double rscore[1024];
    int nreplay;
} step_work;

static void work_free(step_work *w) {
    mg_samples_free(&w->smp);
    for (size_t j = 0; j < w->nnew; j++) mol_clear(&w->newm[j]);
    free(w->newm);
    free(w->gi);
    free(w->enc);
    free(w->s);
    free(w->s2);
    free(w->mem);
}

static const mol *mol_at(const mg_opt *o, const step_work *w, int64_t gi) {
    return gi < (int64_t)o->nmol ? &o->mols[gi] : &w->newm[gi - (int64_t)o->nmol];
}

/* reply -> bytes: [valid][score: 8 bytes][3 x (present byte, string NUL)] */
static size_t reply_size(const mg_score_reply *r) {
    const char *f[3] = {r->canonical, r->scaffold, r->comps};
    size_t n = 1 + sizeof(double);
    for (int i = 0; i < 3; i++) n += 1 + (f[i] ? strlen(f[i]) + 1 : 0);
    return n;
}

static char *reply_put(const mg_score_reply *r, char *p) {
    const char *f[3] = {r->canonical, r->scaffold, r->comps};
    *p++ = (char)(r->valid != 0);
    memcpy(p, &r->score, sizeof r->score);
    p += sizeof r->score;
    for (int i = 0; i < 3; i++) {
        *p++ = (char)(f[i] != NULL);
        if (!f[i]) continue;
        const size_t l = strlen(f[i]) + 1;
        memcpy(p, f[i], l);
        p += l;
    }
    return p;
}

/* bytes [p, end) -> r (strings malloc'ed); the next reply, NULL when short */
static const char *reply_get(const char *p, const char *end, mg_score_reply *r) {
    char **f[3] = {&r->canonical, &r->scaffold, &r->comps};
    if (end - p < (ptrdiff_t)(1 + sizeof(double))) return NULL;
    r->valid = *p++;
    memcpy(&r->score, p, sizeof r->score);
    p += sizeof r->score;
    for (int i = 0; i < 3; i++) {
        if (p >= end) return NULL;
        if (!*p++) continue;
        const size_t l = strnlen(p, (size_t)(end - p));
        if (p + l >= end || !(*f[i] = strdup(p))) return NULL;
        p += l + 1;
    }
    return p;
}

/* smiles[0..k) scored: alone by the scorer; under ranks each rank's
 * scorer scores its part (mg_dist_range) and every rank gets all k
 * replies in order. A fault is the lowest failing rank's error. */
static mg_status score_split(mg_opt *o, const char **smi, int k, mg_score_reply *rep,
                             mg_error *err) {
    mg_dist *d = o->d;
    if (d->size <= 1) return mg_scorer_score(o->sc, smi, (size_t)k, rep, err);
    memset(rep, 0, (size_t)k * sizeof *rep);
    size_t a, b, n = 0;
    mg_dist_range((size_t)k, d->rank, d->size, &a, &b);
    mg_status rc = mg_scorer_score(o->sc, smi + a, b - a, rep + a, err);
    for (size_t i = a; !rc && i < b; i++) n += reply_size(&rep[i]);
    char *buf = rc ? NULL : malloc(n ? n : 1), *q = buf;
    if (!rc && !buf) rc = mg_fail(err, MG_ERR_NOMEM, "out of memory");
    for (size_t i = a; !rc && i < b; i++) q = reply_put(&rep[i], q);
    for (size_t i = a; i < b; i++) mg_score_reply_clear(&rep[i]);
    void *all = NULL;
    size_t all_n = 0;
    if (!(rc = agreed(o, rc, err))) rc = mg_dist_allgather(d, buf, n, &all, &all_n, err);
    free(buf);
    const char *p = all, *end = p + all_n;
    for (int i = 0; !rc && i < k; i++)
        if (!(p = reply_get(p, end, &rep[i])))
            rc = mg_fail(err, MG_ERR_STATE, "the ranks' scorer replies are short at %d of %d", i,
                         k);
    free(all);
    if (rc)
        for (int i = 0; i < k; i++) mg_score_reply_clear(&rep[i]);
    return agreed(o, rc, err);
}

/* Scores the batch's pending molecules within the budget (no state change). */
static mg_status score_batch(mg_opt *o, step_work *w, mg_error *err) {
    const int B = w->B;
    const char **pend = malloc((size_t)B * sizeof *pend);
    int *prow = malloc((size_t)B * sizeof *prow);
    mg_score_reply *rep = calloc((size_t)B, sizeof *rep);
    w->newm = calloc((size_t)B, sizeof *w->newm);
    int np = 0;
    mg_status rc = MG_OK;
    if (!pend || !prow || !rep || !w->newm) rc = mg_fail(err, MG_ERR_NOMEM, "out of memory");
    if ((rc = agreed(o, rc, err))) goto done;
    for (int i = 0; i < B; i++) {
        if (w->gi[i] != ROW_PENDING) continue;
        int dup = 0;
        for (int k = 0; k < np && !dup; k++) dup = !strcmp(pend[k], w->smp.smiles[i]);
        if (!dup) pend[np] = w->smp.smiles[i], prow[np++] = i;
    }
    int sent = 0;
    while (sent < np) {
        const int64_t left = o->op.budget - (int64_t)o->nmol - (int64_t)w->nnew;
        if (left <= 0) break;
        const int k = (int64_t)(np - sent) < left ? np - sent : (int)left;
        if ((rc = score_split(o, pend + sent, k, rep, err))) goto done;
        for (int j = 0; j < k; j++) {
            mg_score_reply *r = &rep[j];
            const char *smi = pend[sent + j];
            int64_t gi = ROW_INVALID;
            w->nnan += !r->valid;
            if (r->valid) {
                const char *key = r->canonical && *r->canonical ? r->canonical : smi;
                const int64_t *f = mg_strmap_find(&o->by_key, key);
                if (f) gi = *f;
                for (size_t q = 0; !f && q < w->nnew && gi < 0; q++)
                    if (!strcmp(w->newm[q].canonical, key)) gi = (int64_t)(o->nmol + q);
                if (gi < 0) {
                    mol *m = &w->newm[w->nnew];
                    m->smiles = strdup(smi);
                    m->canonical = strdup(key);
                    m->scaffold = r->scaffold ? strdup(r->scaffold) : NULL;
                    m->comps = r->comps ? strdup(r->comps) : strdup("");
                    m->score = r->score;
                    m->step = o->step;
                    m->call = (int64_t)(o->nmol + w->nnew) + 1;
                    gi = (int64_t)(o->nmol + w->nnew++);
                    if (!m->smiles || !m->canonical || !m->comps)
                        rc = mg_fail(err, MG_ERR_NOMEM, "out of memory");
                }
            }
            for (int i = 0; i < B; i++)
                if (w->gi[i] == ROW_PENDING && !strcmp(w->smp.smiles[i], smi)) w->gi[i] = gi;
            mg_score_reply_clear(r);
        }
        if ((rc = agreed(o, rc, err))) goto done;
        sent += k;
    }
    for (int i = 0; i < B; i++)
        if (w->gi[i] == ROW_PENDING) w->gi[i] = ROW_OUT; /* past the budget */
done:
    for (int j = 0; j < B && rep; j++) mg_score_reply_clear(&rep[j]);
    free(pend);
    free(prow);
    free(rep);
    return rc;
}

/* Learning scores (in-batch duplicates, repeat penalty, diversity filter)
 * and the memory after the step. */
static mg_status learning_scores(mg_opt *o, step_work *w, mg_error *err) {
    const int B = w->B;
    for (int i = 0; i < B; i++) {
        w->s[i] = w->s2[i] = 0;
        if (w->gi[i] < 0) continue;
        const mol *m = mol_at(o, w, w->gi[i]);
        w->s[i] = w->s2[i] = m->score;
        int dup = 0;
        for (int k = 0; k < i && !dup; k++) dup = w->gi[k] == w->gi[i];
        if (dup) {
            w->s2[i] = 0;
            continue;
        }
        if (w->gi[i] < (int64_t)o->nmol) w->s2[i] *= o->op.repeat_penalty;
        if (mg_df_counts(&o->df, m->score)) {
            /* the step's new molecules count too (not added until commit) */
            const char *bk = bucket_key(o, m);
            int64_t pending = 0;
            for (size_t q = 0; q < w->nnew; q++)
                pending += mg_df_counts(&o->df, w->newm[q].score) &&
                           !strcmp(bucket_key(o, &w->newm[q]), bk);
            if (mg_df_full(&o->df, bk, pending)) w->s2[i] = 0;
        }
    }
    w->mem = malloc(((size_t)o->nmem + (size_t)B + 1) * sizeof *w->mem);
    if (!w->mem) return mg_fail(err, MG_ERR_NOMEM, "out of memory");
    w->nmem = mg_memory_update(o->mem, o->nmem, w->gi, w->s2, w->enc, B, o->op.memory, w->mem);
    return MG_OK;
}

/* Augmented Memory's spellings of the new memory (no state change); under
 * ranks each rank's scorer spells the memory rows that rank trains on
 * (aug_rounds' split), the others stay NULL. */
static mg_status augment(mg_opt *o, step_work *w, mg_error *err) {
    const int K = o->op.aug_rounds, n = w->nmem;
    if (!K || !n) return MG_OK;
    size_t a, b;
    mg_dist_range((size_t)n, o->d->rank, o->d->size, &a, &b);
    const char **smi = malloc((size_t)n * sizeof *smi);
    uint64_t *seeds = malloc((size_t)n * sizeof *seeds);
    w->aug = calloc((size_t)n * K, sizeof *w->aug);
    if (!smi || !seeds || !w->aug) {
        free(smi);
        free(seeds);
        return mg_fail(err, MG_ERR_NOMEM, "out of memory");
    }
    for (int k = 0; k < n; k++) {
        smi[k] = mol_at(o, w, w->mem[k].mol)->smiles;
        seeds[k] = mg_mix64(o->op.seed ^ mg_mix64((uint64_t)o->step * 1000003u + (uint64_t)k));
        seeds[k] &= 0x7fffffffu; /* RDKit takes a 31-bit seed */
    }
    mg_status rc = b > a ? mg_scorer_randomize(o->sc, smi + a, seeds + a, b - a, K,
                                               w->aug + a * (size_t)K, err)
                         : MG_OK;
    free(smi);
    free(seeds);
    return rc;
}

static void aug_free(step_work *w, int K) {
    if (!w->aug) return;
    for (int i = 0; i < w->nmem * K; i++) free(w->aug[i]);
    free(w->aug);
    w->aug = NULL;
}

/* The step's molecules and memory into the state. */
static mg_status commit(mg_opt *o, step_work *w, mg_error *err) {
    for (size_t j = 0; j < w->nnew; j++) {
        mol *m = &w->newm[j];
        const int64_t gi = (int64_t)(o->nmol);
        for (int i = 0; i < w->B; i++)
            if (w->gi[i] == gi && w->enc[i]) {
                m->prior_nll = o->pnll[i];
                m->agent_nll = o->anll[i];
                break;
            }
        mg_status rc = add_mol(o, m, err);
        memset(m, 0, sizeof *m);
        if (rc) return rc;
    }
    w->nnew = 0;
    for (int i = 0; i < w->B; i++)
        if ((w->gi[i] == ROW_INVALID || w->gi[i] >= 0) &&
            mg_strmap_put(&o->raw, w->smp.smiles[i], w->gi[i] >= 0 ? w->gi[i] : -1))
            return mg_fail(err, MG_ERR_NOMEM, "out of memory");
    memcpy(o->mem, w->mem, (size_t)w->nmem * sizeof *o->mem);
    o->nmem = w->nmem;
    o->nan_sent += w->nnan;
    return MG_OK;
}

static int cmp_desc(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x < y) - (x > y);
}

/* mean of the n best scores so far */
static double top_mean(const mg_opt *o, size_t n) {
    if (!o->nmol) return 0;
    double *s = malloc(o->nmol * sizeof *s);
    if (!s) return NAN;
    for (size_t i = 0; i < o->nmol; i++) s[i] = o->mols[i].score;
    qsort(s, o->nmol, sizeof *s, cmp_desc);
    const size_t k = n < o->nmol ? n : o->nmol;
    double t = 0;
    for (size_t i = 0; i < k; i++) t += s[i];
    free(s);
    return t / (double)k;
}

/* Under ranks: rank 0's batch (mg_sample gave it all n) to every rank
 * (mg_samples_pack's bytes). */
static mg_status share_batch(mg_opt *o, mg_samples *smp, size_t n, mg_error *err) {
    if (o->d->size <= 1) return MG_OK;
    char *buf = NULL;
    size_t bytes = 0;
    mg_status rc = mg_samples_pack(smp, &buf, &bytes, err);
    void *all = NULL;
    size_t all_n = 0;
    if (!(rc = agreed(o, rc, err))) rc = mg_dist_allgather(o->d, buf, bytes, &all, &all_n, err);
    free(buf);
    if (!rc && o->d->rank != 0) rc = mg_samples_unpack(all, all_n, n, smp, err);
    free(all);
    return rc;
}

/* Prepares rows: batch rows 0..B-1 from the sample, then the replay rows. */
static mg_status prepare(mg_opt *o, step_work *w, mg_error *err) {
    const int B = o->op.batch;
    w->B = B;
    mg_sample_opts so;
    mg_sample_opts_default(&so);
    so.n = (size_t)B;
    so.batch = B;
    so.seed = mg_mix64(o->op.seed ^ mg_mix64((uint64_t)o->step + 0x5851F42D4C957F2Dull));
    so.constrain = o->op.constrain;
    so.dtype = o->op.dtype;
    so.stop = o->op.stop;
    so.dist = o->d->size > 1 ? o->d : NULL;
    mg_status rc = mg_sample(o->agent, o->vocab, &so, &w->smp, err);
    if (!rc) rc = share_batch(o, &w->smp, (size_t)B, err);
    if (rc) return rc;
    w->gi = malloc((size_t)B * sizeof *w->gi);
    w->enc = calloc((size_t)B, 1);
    w->s = calloc((size_t)B, sizeof *w->s);
    w->s2 = calloc((size_t)B, sizeof *w->s2);
    if (!w->gi || !w->enc || !w->s || !w->s2) return mg_fail(err, MG_ERR_NOMEM, "out of memory");
    for (int i = 0; i < B; i++) {
        const char *smi = w->smp.smiles[i];
        w->enc[i] = w->smp.ended[i] && encode_row(o, i, smi);
        if (!w->enc[i]) {
            w->gi[i] = ROW_OUT;
            int32_t *row = o->ids + (size_t)i * (o->ctx + 1); /* a dummy row, no weight */
            for (int t = 0; t <= o->ctx; t++) row[t] = t == 0 ? MG_BOS : t == 1 ? MG_EOS : MG_PAD;
            o->len[i] = 2;
            continue;
        }
        const int64_t *f = mg_strmap_find(&o->raw, smi);
        w->gi[i] = f ? (*f >= 0 ? *f : ROW_INVALID)
                     : (*smi && mg_smiles_syntax_ok(smi, NULL, 0)) ? ROW_PENDING : ROW_INVALID;
    }
    /* replay rows: distinct memory entries drawn by a stream of the step */
    mg_rng rng;
    mg_rng_seed(&rng, o->op.seed, 0x1000000000ull + (uint64_t)o->step);
    int idx[1024];
    const int nm = o->nmem < 1024 ? o->nmem : 1024;
    for (int k = 0; k < nm; k++) idx[k] = k;
    w->nreplay = o->op.replay < nm ? o->op.replay : nm;
    for (int k = 0; k < w->nreplay; k++) {
        const int j = k + (int)(mg_rng_next(&rng) % (uint64_t)(nm - k));
        const int t = idx[k];
        idx[k] = idx[j];
        idx[j] = t;
        w->rmol[k] = o->mem[idx[k]].mol;
        w->rscore[k] = o->mem[idx[k]].score;
        const mol *m = &o->mols[w->rmol[k]];
        if (!encode_row(o, B + k, m->smiles))
            return mg_fail(err, MG_ERR_STATE, "memory molecule '%s' cannot be encoded", m->smiles);
    }
    return MG_OK;
}

/* Every loss row's NLLs in [0, OPT_NLL_MAX] (what the state may hold); an
 * error naming the molecule otherwise. */
static mg_status nlls_in_range(const mg_opt *o, const step_work *w, mg_error *err) {
    const int B = w->B, N = B + w->nreplay;
    for (int r = 0; r < N; r++) {
        const double v[2] = {o->pnll[r], o->anll[r]};
        for (int k = 0; k < 2; k++)
            if (!(v[k] >= 0 && v[k] <= OPT_NLL_MAX))
                return mg_fail(err, MG_ERR_STATE,
                               "the %s's NLL of '%.200s' is %g nats, outside [0, %g]: its logits "
                               "are extreme (not a model this run can train; a state could not "
                               "hold it)",
                               k ? "agent" : "prior",
                               r < B ? w->smp.smiles[r] : o->mols[w->rmol[r - B]].smiles, v[k],
                               OPT_NLL_MAX);
    }
    return MG_OK;
}

/* The NLLs of the loss rows [0, N = B + replay): this rank's part [a, b)
 * (mg_dist_range) through the prior (sampled rows; the replayed ones' are
 * stored) and the agent (its activations kept for dap_update), then every
 * rank's parts to every rank (a sum over zeros elsewhere: exact). */
static mg_status row_nlls(mg_opt *o, const step_work *w, mg_error *err) {
    const int B = w->B, N = B + w->nreplay;
    size_t a, b;
    mg_dist_range((size_t)N, o->d->rank, o->d->size, &a, &b);
    const int pb = (int)b < B ? (int)b : B, pa = (int)a < pb ? (int)a : pb;
    mg_status rc = rows_nll(o, o->prior, pa, pb - pa, o->pnll + pa, err);
    for (int k = 0; k < w->nreplay; k++) o->pnll[B + k] = o->mols[w->rmol[k]].prior_nll;
    if (!rc) rc = rows_nll(o, o->agent, (int)a, (int)(b - a), o->anll + a, err);
    if ((rc = agreed(o, rc, err))) return rc;
    if (o->d->size <= 1) return nlls_in_range(o, w, err);
    for (int r = 0; r < N; r++) {
        if (r < B && (r < pa || r >= pb)) o->pnll[r] = 0.0;
        if (r < (int)a || r >= (int)b) o->anll[r] = 0.0;
    }
    mg_dist_sum_f64(o->d, o->pnll, (size_t)B);
    mg_dist_sum_f64(o->d, o->anll, (size_t)N);
    return agreed(o, nlls_in_range(o, w, err), err); /* the same sums: said once */
}

/* Augmented Memory's extra rounds on the committed memory. */
static mg_status aug_rounds(mg_opt *o, step_work *w, mg_error *err) {
    const int K = o->op.aug_rounds, n = o->nmem;
    size_t a, b; /* this rank's rows (augment's split) */
    mg_dist_range((size_t)n, o->d->rank, o->d->size, &a, &b);
    double *sc = malloc((size_t)(n ? n : 1) * sizeof *sc);
    unsigned char *use = malloc((size_t)(n ? n : 1));
    mg_status rc = agreed(o, sc && use ? MG_OK : mg_fail(err, MG_ERR_NOMEM, "out of memory"), err);
    for (int k = 0; !rc && k < K && n; k++) {
        for (int r = 0; r < n; r++) {
            const char *sp = w->aug ? w->aug[(size_t)r * K + k] : NULL;
            const mol *m = &o->mols[o->mem[r].mol];
            use[r] = 1;
            if (!sp || !encode_row(o, r, sp)) encode_row(o, r, m->smiles);
        }
        double loss;
        rc = rows_nll(o, o->prior, (int)a, (int)(b - a), o->pnll + a, err);
        if (!rc) rc = rows_nll(o, o->agent, (int)a, (int)(b - a), o->anll + a, err);
        for (int r = 0; r < n; r++) sc[r] = o->mem[r].score;
        if (!(rc = agreed(o, rc, err))) rc = dap_update(o, n, sc, use, &loss, err);
    }
    free(sc);
    free(use);
    return rc;
}

/* Tests (molgen/tests/test_optimize.py's float64 oracle of a step with
 * replay): with MOLGEN_OPT_DUMP_STEP=PATH, one process, the first step of
 * this invocation's loss rows and gradient into PATH: "rows.ids" I32
 * [N, ctx + 1] (batch rows, then replayed ones), "rows.lengths" I64 [N],
 * "rows.scores" F64 [N] (learning scores), "rows.use" F64 [N] (0/1),
 * "rows.replay_mol" I64 [replay] (0-based molecule indices), "grad.<name>"
 * the agent's gradient; metadata loss and sigma (%.17g), config. */
static mg_status dump_step(mg_opt *o, const step_work *w, int N, const double *s2,
                           const unsigned char *use, double loss, mg_error *err) {
    const char *path = getenv("MOLGEN_OPT_DUMP_STEP");
    if (!path || !*path || o->step != o->step0 || o->d->size > 1) return MG_OK;
    const size_t nt = mg_model_num_tensors(o->agent);
    mg_st_tensor *t = calloc(nt + 5, sizeof *t);
    char(*names)[96] = calloc(nt + 1, sizeof *names);
    double *u = malloc((size_t)N * sizeof *u);
    int64_t rm[1024];
    mg_status rc = MG_OK;
    if (!t || !names || !u) {
        rc = mg_fail(err, MG_ERR_NOMEM, "out of memory");
        goto out;
    }
    for (int r = 0; r < N; r++) u[r] = use[r];
    for (int k = 0; k < w->nreplay; k++) rm[k] = w->rmol[k];
    mg_model_st_tensors(o->agent, t, nt);
    for (size_t i = 0; i < nt; i++) {
        snprintf(names[i], sizeof names[i], "grad.%s", t[i].name);
        t[i].name = names[i];
        t[i].data = mg_model_grads(o->agent) + mg_model_tensor(o->agent, i)->offset;
    }
    t[nt] = (mg_st_tensor){.name = "rows.ids", .dtype = MG_ST_I32, .ndim = 2,
                           .shape = {N, o->ctx + 1}, .data = o->ids};
    t[nt + 1] = (mg_st_tensor){.name = "rows.lengths", .dtype = MG_ST_I64, .ndim = 1,
                               .shape = {N}, .data = o->len};
    t[nt + 2] = (mg_st_tensor){.name = "rows.scores", .dtype = MG_ST_F64, .ndim = 1,
                               .shape = {N}, .data = s2};
    t[nt + 3] = (mg_st_tensor){.name = "rows.use", .dtype = MG_ST_F64, .ndim = 1,
                               .shape = {N}, .data = u};
    t[nt + 4] = (mg_st_tensor){.name = "rows.replay_mol", .dtype = MG_ST_I64, .ndim = 1,
                               .shape = {w->nreplay}, .data = rm};
    char cfg[512], ls[40], sg[40];
    mg_model_config_to_json(mg_model_get_config(o->agent), cfg, sizeof cfg);
    snprintf(ls, sizeof ls, "%.17g", loss);
    snprintf(sg, sizeof sg, "%.17g", o->op.sigma);
    const mg_st_kv meta[] = {
        {"format", "molgen-debug-opt-step"}, {"config", cfg}, {"sigma", sg}, {"loss", ls}};
    rc = mg_st_write(path, t, nt + (w->nreplay ? 5 : 4), meta, 4, err);
out:
    free(t);
    free(names);
    free(u);
    return rc;
}

static mg_status step_once(mg_opt *o, mg_opt_progress *pg, mg_error *err) {
    step_work w;
    memset(&w, 0, sizeof w);
    mg_status rc = agreed(o, prepare(o, &w, err), err);
    if (!rc) rc = row_nlls(o, &w, err);
    if (!rc) rc = score_batch(o, &w, err);
    if (!rc) rc = agreed(o, learning_scores(o, &w, err), err);
    if (!rc) rc = agreed(o, augment(o, &w, err), err);
    const size_t nnew = w.nnew;
    const double top100 = top_mean(o, 100);
    if (!rc) rc = agreed(o, commit(o, &w, err), err); /* past here the step is the state's */
    if (!rc) /* mol_opt compares the top 100 only past 1,000 calls */
        o->plateau_run = o->nmol > 1000 && top_mean(o, 100) == top100 ? o->plateau_run + 1 : 0;
    const int B = w.B, N = B + w.nreplay;
    double s2[N > 0 ? N : 1];
    unsigned char use[N > 0 ? N : 1];
    int valid = 0, uniq = 0;
    double sum = 0;
    for (int i = 0; !rc && i < N; i++) {
        s2[i] = i < B ? w.s2[i] : w.rscore[i - B];
        use[i] = i >= B || w.enc[i];
        if (i < B && w.gi[i] >= 0) {
            valid++;
            sum += w.s[i];
            int dup = 0;
            for (int k = 0; k < i && !dup; k++) dup = w.gi[k] == w.gi[i];
            uniq += !dup;
        }
    }
    double loss = 0;
    if (!rc) rc = dap_update(o, N, s2, use, &loss, err);
    if (!rc) rc = dump_step(o, &w, N, s2, use, loss, err);
    if (!rc) rc = aug_rounds(o, &w, err);
    aug_free(&w, o->op.aug_rounds);
    work_free(&w);
    if (rc) return rc;
    o->step++;
    *pg = (mg_opt_progress){.step = o->step,
                            .calls = (int64_t)o->nmol,
                            .budget = o->op.budget,
                            .batch = B,
                            .mean = sum / B,
                            .top10 = top_mean(o, 10),
                            .valid = (double)valid / B,
                            .unique = (double)uniq / B,
                            .fresh = (double)nnew / B,
                            .loss = loss,
                            .seconds = mg_now_s() - o->t0,
                            .calls0 = o->calls0};
    return MG_OK;
}

/* ------------------------------------------------------------ the run */

static int finished(mg_opt *o, const mg_opt_progress *pg) {
    const mg_opt_opts *p = &o->op;
    o->collapse_run = pg->fresh < p->collapse_share ? o->collapse_run + 1 : 0;
    const char *r = (int64_t)o->nmol >= p->budget                          ? "budget"
                    : p->collapse_steps > 0 && o->collapse_run >= p->collapse_steps ? "collapse"
                    : p->patience > 0 && o->plateau_run >= p->patience     ? "patience"
                    : p->max_steps > 0 && o->step >= p->max_steps          ? "max-steps"
                    : p->stop_after > 0 && o->step >= p->stop_after        ? "stop-after"
                                                                            : NULL;
    if (r) snprintf(o->reason, sizeof o->reason, "%s", r);
    return r != NULL;
}

/* The save hook, agreed; under ranks first a check that every rank holds
 * the same state (the summed gradients are the same bits on every rank). */
static mg_status save_state(mg_opt *o, mg_error *err) {
    if (!mg_dist_same_u64(o->d, mg_opt_state_digest(o)))
        return mg_fail(err, o->d->rank ? MG_ERR_PEER : MG_ERR_STATE,
                       "the %d ranks hold different states (agents or scored molecules)",
                       o->d->size);
    return agreed(o, o->op.save(o->op.ctx, o, err), err);
}

uint64_t mg_opt_state_digest(mg_opt *o) {
    const size_t P = mg_model_num_params(o->agent);
    uint64_t h = digest_params(o->agent);
    h = mg_fnv1a(h, o->adam.m, P * sizeof(float));
    h = mg_fnv1a(h, o->adam.v, P * sizeof(float));
    const int64_t n[4] = {o->step, o->adam.step, (int64_t)o->nmol, o->nmem};
    h = mg_fnv1a(h, n, sizeof n);
    for (size_t i = 0; i < o->nmol; i++) {
        h = mg_fnv1a(h, o->mols[i].canonical, strlen(o->mols[i].canonical) + 1);
        h = mg_fnv1a(h, &o->mols[i].score, sizeof(double));
    }
    return mg_fnv1a(h, o->mem, (size_t)o->nmem * sizeof *o->mem);
}

mg_status mg_opt_run(mg_opt *o, int *saved, mg_error *err) {
    *saved = 0;
    o->reason[0] = 0;
    o->calls0 = (int64_t)o->nmol;
    o->step0 = o->step;
    o->t0 = mg_now_s();
    mg_status rc = MG_OK;
    if ((int64_t)o->nmol >= o->op.budget) snprintf(o->reason, sizeof o->reason, "budget");
    while (!o->reason[0]) {
        int64_t sig = o->op.stop ? (int64_t)*o->op.stop : 0; /* any rank's */
        mg_dist_max_i64(o->d, &sig, 1);
        if (sig) { /* said once: rank 0 */
            rc = o->d->rank ? mg_fail(err, MG_ERR_PEER, "rank 0 was interrupted")
                            : mg_fail(err, MG_ERR_INTERRUPTED, "interrupted by signal %d", (int)sig);
            break;
        }
        mg_opt_progress pg;
        if ((rc = step_once(o, &pg, err))) break;
        if (o->op.progress) o->op.progress(o->op.ctx, &pg);
        const int done = finished(o, &pg);
        /* a scorer that scores nothing: said, not a "collapse" (every answer
         * nan leaves the batch with nothing new); at the stop, or once it
         * answered nan to 4 batches */
        if (!o->nmol && o->nan_sent && (done || o->nan_sent >= 4 * (int64_t)o->op.batch)) {
            o->reason[0] = 0;
            rc = mg_fail(err, MG_ERR_FORMAT,
                         "the scorer could score nothing: it answered nan to every one of the "
                         "%lld molecules it was sent (try it by hand on one SMILES, e.g. CCO)",
                         (long long)o->nan_sent);
            break;
        }
        if ((done || o->step % o->op.save_every == 0) && o->op.save) {
            if ((rc = save_state(o, err))) return rc;
            *saved = 1;
        }
    }
    if (rc && o->op.save) { /* the state of the failing step's start */
        mg_error e2;
        if (!save_state(o, &e2)) *saved = 1;
    }
    return rc;
}

/* ------------------------------------------------------------ files */

static json_t *options_json(const mg_opt_opts *p) {
    json_t *j = json_object();
    if (!j) return NULL;
    char seed[24];
    snprintf(seed, sizeof seed, "%llu", (unsigned long long)p->seed);
    int bad = mg_json_put(j, "seed", json_string(seed));
    bad |= mg_json_put(j, "budget", json_integer(p->budget));
    bad |= mg_json_put(j, "batch", json_integer(p->batch));
    bad |= mg_json_put(j, "sigma", json_real(p->sigma));
    bad |= mg_json_put(j, "lr", json_real(p->lr));
    bad |= mg_json_put(j, "constrain", json_string(mg_constrain_name(p->constrain)));
    bad |= mg_json_put(j, "dtype", json_string(mg_dtype_name(p->dtype)));
    bad |= mg_json_put(j, "df", json_integer(p->df));
    bad |= mg_json_put(j, "df_bucket", json_integer(p->df_bucket));
    bad |= mg_json_put(j, "df_min_score", json_real(p->df_min_score));
    bad |= mg_json_put(j, "repeat_penalty", json_real(p->repeat_penalty));
    bad |= mg_json_put(j, "memory", json_integer(p->memory));
    bad |= mg_json_put(j, "replay", json_integer(p->replay));
    bad |= mg_json_put(j, "augmented_memory", json_integer(p->aug_rounds));
    bad |= mg_json_put(j, "collapse_steps", json_integer(p->collapse_steps));
    bad |= mg_json_put(j, "collapse_share", json_real(p->collapse_share));
    bad |= mg_json_put(j, "patience", json_integer(p->patience));
    if (bad) {
        json_decref(j);
        return NULL;
    }
    return j;
}

static json_t *str_or_null(const char *s) { return s ? json_string(s) : json_null(); }

/* The scorer command as recorded: itself when it is UTF-8 (a JSON string
 * must be), else with every byte >= 0x80 written \xNN (NULL: out of memory);
 * a resume compares these records. */
static json_t *scorer_json(const char *cmd) {
    json_t *j = json_string(cmd);
    if (j) return j;
    const size_t n = strlen(cmd);
    char *t = malloc(4 * n + 1), *p = t;
    if (!t) return NULL;
    for (const unsigned char *c = (const unsigned char *)cmd; *c; c++) {
        if (*c < 0x80)
            *p++ = (char)*c;
        else
            p += sprintf(p, "\\x%02x", *c);
    }
    *p = '\0';
    j = json_string(t);
    free(t);
    return j;
}

/* The run's state as JSON text (malloc'ed), NULL when out of memory. */
static char *state_text(const mg_opt *o) {
    json_t *j = json_object(), *mols = json_array(), *mem = json_array();
    char dig[24];
    snprintf(dig, sizeof dig, "%016llx", (unsigned long long)o->prior_digest);
    int bad = !j || !mols || !mem;
    if (bad) {
        json_decref(mols);
        json_decref(mem);
    } else {
        bad = mg_json_put(j, "molecules", mols) | mg_json_put(j, "memory", mem);
    }
    bad = bad || mg_json_put(j, "format", json_integer(OPT_FORMAT)) ||
          mg_json_put(j, "options", options_json(&o->op)) ||
          mg_json_put(j, "prior_digest", json_string(dig)) ||
          (o->op.scorer_cmd && mg_json_put(j, "scorer", scorer_json(o->op.scorer_cmd))) ||
          mg_json_put(j, "step", json_integer(o->step)) ||
          mg_json_put(j, "adam_step", json_integer(o->adam.step)) ||
          mg_json_put(j, "collapse_run", json_integer(o->collapse_run)) ||
          mg_json_put(j, "plateau_run", json_integer(o->plateau_run));
    for (size_t i = 0; !bad && i < o->nmol; i++) {
        const mol *m = &o->mols[i];
        bad = json_array_append_new(
            mols, json_pack("[s s o s f f f I I]", m->smiles, m->canonical,
                            str_or_null(m->scaffold), m->comps, m->score, m->prior_nll,
                            m->agent_nll, (json_int_t)m->call, (json_int_t)m->step));
    }
    for (int k = 0; !bad && k < o->nmem; k++)
        bad = json_array_append_new(mem, json_pack("[I f]", (json_int_t)o->mem[k].mol,
                                                   o->mem[k].score));
    char *text = bad ? NULL : mg_json_dump(j, 17);
    json_decref(j);
    return text;
}

/* bytes of s as a JSON string's contents ('"' and '\\' escaped, control
 * characters as \u00XX): the size a metadata value takes in the header */
static size_t json_str_bytes(const char *s) {
    size_t n = 0;
    for (const unsigned char *p = (const unsigned char *)s; *p; p++)
        n += *p == '"' || *p == '\\' ? 2 : *p < 0x20 ? 6 : 1;
    return n;
}

/* The most header bytes the state's metadata may take: what the reader
 * takes (MG_ST_MAX_HEADER) less 1 MiB for the tensors' entries and keys;
 * MOLGEN_OPT_STATE_LIMIT (bytes) lowers it, for the tests. */
static size_t state_limit(void) {
    size_t lim = MG_ST_MAX_HEADER - ((size_t)1 << 20);
    const char *e = getenv("MOLGEN_OPT_STATE_LIMIT");
    char *end;
    const unsigned long long v = e ? strtoull(e, &end, 10) : 0;
    if (e && *e && !*end && v > 0 && v < lim) lim = (size_t)v;
    return lim;
}

mg_status mg_opt_save(mg_opt *o, const char *path, mg_error *err) {
    char *text = state_text(o);
    const size_t nt = mg_model_num_tensors(o->agent);
    mg_st_tensor *t = calloc(nt + 2, sizeof *t);
    char cfg[512];
    char *vj = mg_vocab_to_json(o->vocab);
    mg_status rc = MG_OK;
    if (!text || !t || !vj) {
        rc = mg_fail(err, MG_ERR_NOMEM, "out of memory saving %s", path);
        goto done;
    }
    mg_model_config_to_json(mg_model_get_config(o->agent), cfg, sizeof cfg);
    /* the writer refuses what the reader would (before anything is written:
     * the previous state stays whole) */
    const size_t hb = json_str_bytes(text) + json_str_bytes(vj) + json_str_bytes(cfg);
    if (hb > state_limit()) {
        rc = mg_fail(err, MG_ERR_TOO_LONG,
                     "%s not written: the state of %zu scored molecules takes %zu bytes, more "
                     "than the %zu a checkpoint's header may hold (the previous state is kept; "
                     "see docs/reliability.md, state size)",
                     path, o->nmol, hb, state_limit());
        goto done;
    }
    mg_model_st_tensors(o->agent, t, nt);
    const int64_t P = (int64_t)mg_model_num_params(o->agent);
    t[nt] = (mg_st_tensor){.name = "optim.m", .dtype = MG_ST_F32, .ndim = 1, .shape = {P},
                           .data = o->adam.m};
    t[nt + 1] = (mg_st_tensor){.name = "optim.v", .dtype = MG_ST_F32, .ndim = 1, .shape = {P},
                               .data = o->adam.v};
    const mg_st_kv meta[] = {
        {"format", "molgen"}, {"config", cfg}, {"vocab", vj}, {"optimize", text}};
    rc = mg_st_write(path, t, nt + 2, meta, 4, err);
done:
    free(text);
    free(t);
    free(vj);
    return rc;
}

/* ------------------------------------------------------------ resume */

/* The saved options, each in the range a run can have (the file may have
 * been edited: nothing out of range reaches the engine). */
static mg_status options_from_json(const json_t *j, mg_opt_opts *p, mg_error *err) {
    const char *seed = json_string_value(json_object_get(j, "seed"));
    const char *con = json_string_value(json_object_get(j, "constrain"));
    const char *dts = json_string_value(json_object_get(j, "dtype"));
    json_int_t I[10];
    const char *ik[] = {"budget",  "batch",  "df",     "df_bucket",      "memory",
                        "replay", "augmented_memory", "collapse_steps", "patience", NULL};
    const json_int_t ilo[] = {1, 1, 0, 1, 0, 0, 0, 0, 0};
    const json_int_t ihi[] = {1000000000000LL, 100000, MG_DF_SCAFFOLD, 1000000000, 1000000, 1000000,
                              100, 1000000000, 1000000000};
    for (int k = 0; ik[k]; k++) {
        const json_t *v = json_object_get(j, ik[k]);
        if (!json_is_integer(v))
            return mg_fail(err, MG_ERR_FORMAT, "option \"%s\" missing", ik[k]);
        I[k] = json_integer_value(v);
        if (I[k] < ilo[k] || I[k] > ihi[k])
            return mg_fail(err, MG_ERR_FORMAT, "option \"%s\" is %lld: outside [%lld, %lld]",
                           ik[k], (long long)I[k], (long long)ilo[k], (long long)ihi[k]);
    }
    double D[5];
    const char *dk[] = {"sigma", "lr", "df_min_score", "repeat_penalty", "collapse_share", NULL};
    const double dhi[] = {1e6, 10, 1, 1, 1};
    for (int k = 0; dk[k]; k++) {
        const json_t *v = json_object_get(j, dk[k]);
        if (!json_is_number(v)) return mg_fail(err, MG_ERR_FORMAT, "option \"%s\" missing", dk[k]);
        D[k] = json_number_value(v);
        if (!(D[k] >= 0 && D[k] <= dhi[k]))
            return mg_fail(err, MG_ERR_FORMAT, "option \"%s\" is %g: outside [0, %g]", dk[k],
                           D[k], dhi[k]);
    }
    char *end;
    if (!seed || !con) return mg_fail(err, MG_ERR_FORMAT, "options seed/constrain missing");
    if (!mg_constrain_parse(con, &p->constrain))
        return mg_fail(err, MG_ERR_FORMAT, "constrain '%s'", con);
    if (!dts || mg_dtype_parse(dts, &p->dtype) < 0)
        return mg_fail(err, MG_ERR_FORMAT, "option \"dtype\" missing or not fp32/bf16");
    errno = 0;
    p->seed = strtoull(seed, &end, 10);
    if (!*seed || *end || errno || strspn(seed, "0123456789") != strlen(seed))
        return mg_fail(err, MG_ERR_FORMAT, "option \"seed\" '%.40s' is not a decimal integer",
                       seed);
    p->budget = I[0];
    p->batch = (int)I[1];
    p->df = (mg_df_kind)I[2];
    p->df_bucket = (int)I[3];
    p->memory = (int)I[4];
    p->replay = (int)I[5];
    p->aug_rounds = (int)I[6];
    p->collapse_steps = (int)I[7];
    p->patience = (int)I[8];
    p->sigma = D[0];
    p->lr = D[1];
    p->df_min_score = D[2];
    p->repeat_penalty = D[3];
    p->collapse_share = D[4];
    return mg_opt_opts_check(p, err);
}

/* the "optimize" JSON of checkpoint path (a new reference) and the file */
static mg_status load_state(const char *path, mg_st_file **f, json_t **j, mg_error *err) {
    mg_status rc = mg_st_load(path, f, err);
    if (rc) return rc;
    const char *t = mg_st_meta(*f, "optimize");
    if (!t) {
        mg_st_free(*f);
        *f = NULL;
        return mg_fail(err, MG_ERR_FORMAT, "%s is not a checkpoint of molgen optimize", path);
    }
    rc = mg_json_parse(t, strlen(t), j, err);
    if (!rc && json_integer_value(json_object_get(*j, "format")) != OPT_FORMAT)
        rc = mg_fail(err, MG_ERR_FORMAT, "%s: unknown optimize format", path);
    if (rc) {
        json_decref(*j);
        *j = NULL;
        mg_st_free(*f);
        *f = NULL;
    }
    return rc;
}

mg_status mg_opt_read_options(const char *path, mg_opt_opts *opts, mg_error *err) {
    mg_st_file *f;
    json_t *j;
    mg_status rc = load_state(path, &f, &j, err);
    if (rc) return rc;
    rc = options_from_json(json_object_get(j, "options"), opts, err);
    if (rc) {
        const mg_error e0 = *err; /* the message is an argument: not in place */
        mg_fail(err, MG_ERR_FORMAT, "%s: %s", path, e0.message);
    }
    json_decref(j);
    mg_st_free(f);
    return rc;
}

static int same_d(double a, double b) { return a == b || (isnan(a) && isnan(b)); }

/* Which algorithm option differs (NULL: none); the budget may grow. */
static const char *differs(const mg_opt_opts *a, const mg_opt_opts *b) {
    return a->seed != b->seed                            ? "--seed"
           : a->batch != b->batch                        ? "--batch"
           : !same_d(a->sigma, b->sigma)                 ? "--sigma"
           : !same_d(a->lr, b->lr)                       ? "--lr"
           : a->constrain != b->constrain                ? "--constrain"
           : a->dtype != b->dtype                        ? "--dtype"
           : a->df != b->df                              ? "--df"
           : a->df_bucket != b->df_bucket                ? "--df-bucket"
           : !same_d(a->df_min_score, b->df_min_score)   ? "--df-min-score"
           : !same_d(a->repeat_penalty, b->repeat_penalty) ? "--repeat-penalty"
           : a->memory != b->memory                      ? "--memory"
           : a->replay != b->replay                      ? "--replay"
           : a->aug_rounds != b->aug_rounds              ? "--augmented-memory"
           : a->collapse_steps != b->collapse_steps      ? "--collapse-steps"
           : !same_d(a->collapse_share, b->collapse_share) ? "--collapse-share"
           : a->patience != b->patience                  ? "--patience"
                                                         : NULL;
}

static char *dup_json(const json_t *v) {
    const char *s = json_string_value(v);
    return s ? strdup(s) : NULL;
}

/* an element of a saved array: a number in [lo, hi] */
static int num_in(const json_t *a, size_t i, double lo, double hi, double *v) {
    const json_t *x = json_array_get(a, i);
    *v = json_number_value(x);
    return json_is_number(x) && *v >= lo && *v <= hi;
}

/* The scored molecules and the memory, each checked (the file may have been
 * edited): every molecule a record of a step up to o->step with a score in
 * [0, 1], canonical keys distinct, memory entries distinct molecules that
 * encode, learning scores in [0, 1]. */
static mg_status restore_mols(mg_opt *o, const json_t *mols, const json_t *mem, mg_error *err) {
    size_t i;
    const json_t *e;
    if (!json_is_array(mols) || !json_is_array(mem))
        return mg_fail(err, MG_ERR_FORMAT, "the molecules or the memory are not lists");
    json_array_foreach(mols, i, e) {
        mol m = {0};
        double sc, nll;
        const json_t *sf = json_array_get(e, 2);
        if (json_array_size(e) != 9 || !num_in(e, 4, 0, 1, &sc) ||
            !json_is_integer(json_array_get(e, 7)) || !json_is_integer(json_array_get(e, 8)) ||
            !(json_is_string(sf) || json_is_null(sf)))
            return mg_fail(err, MG_ERR_FORMAT, "scored molecule %zu is malformed", i + 1);
        for (int k = 5; k <= 6; k++) { /* was: +-1e300 taken, every resume then failed */
            const char *name = k == 5 ? "prior_nll" : "agent_nll";
            if (!json_is_number(json_array_get(e, (size_t)k)))
                return mg_fail(err, MG_ERR_FORMAT, "scored molecule %zu: its %s is not a number",
                               i + 1, name);
            if (!num_in(e, (size_t)k, 0, OPT_NLL_MAX, &nll))
                return mg_fail(err, MG_ERR_FORMAT,
                               "scored molecule %zu: its %s %g is outside [0, %g] nats (no "
                               "model gives it: the file was edited)",
                               i + 1, name, nll, OPT_NLL_MAX);
        }
        m.smiles = dup_json(json_array_get(e, 0));
        m.canonical = dup_json(json_array_get(e, 1));
        m.scaffold = dup_json(json_array_get(e, 2));
        m.comps = dup_json(json_array_get(e, 3));
        m.score = json_number_value(json_array_get(e, 4));
        m.prior_nll = json_number_value(json_array_get(e, 5));
        m.agent_nll = json_number_value(json_array_get(e, 6));
        m.call = json_integer_value(json_array_get(e, 7));
        m.step = json_integer_value(json_array_get(e, 8));
        if (!m.smiles || !m.canonical || !m.comps || m.call != (int64_t)i + 1 || m.step < 0 ||
            m.step > o->step || mg_strmap_find(&o->by_key, m.canonical)) {
            mol_clear(&m);
            return mg_fail(err, MG_ERR_FORMAT, "scored molecule %zu is malformed", i + 1);
        }
        mg_status rc = add_mol(o, &m, err);
        if (rc) return rc;
    }
    if (json_array_size(mem) > (size_t)o->op.memory)
        return mg_fail(err, MG_ERR_FORMAT, "the memory holds more than %d molecules",
                       o->op.memory);
    json_array_foreach(mem, i, e) {
        const int64_t k = json_integer_value(json_array_get(e, 0));
        double sc;
        if (!json_is_integer(json_array_get(e, 0)) || k < 0 || k >= (int64_t)o->nmol)
            return mg_fail(err, MG_ERR_FORMAT, "memory entry %zu names no molecule", i + 1);
        if (json_array_size(e) != 2 || !num_in(e, 1, 0, 1, &sc))
            return mg_fail(err, MG_ERR_FORMAT, "memory entry %zu is malformed", i + 1);
        for (size_t q = 0; q < i; q++)
            if (o->mem[q].mol == k)
                return mg_fail(err, MG_ERR_FORMAT, "memory entry %zu repeats molecule %lld", i + 1,
                               (long long)k + 1);
        if (!encode_row(o, 0, o->mols[k].smiles))
            return mg_fail(err, MG_ERR_FORMAT, "memory molecule '%.80s' cannot be encoded",
                           o->mols[k].smiles);
        o->mem[i] = (mg_mem_entry){k, sc};
    }
    o->nmem = (int)json_array_size(mem);
    return MG_OK;
}

/* The scorer recorded in the state j against this run's (--scorer,
 * --scorer-changed). */
static mg_status restore_scorer(mg_opt *o, const json_t *j, const char *path, mg_error *err) {
    /* the scorer: the cache, the memory and the diversity filter hold its
     * scores, so another one is refused unless asked for (none recorded:
     * an older molgen's state, taken) */
    const json_t *js0 = json_object_get(j, "scorer");
    const char *was = json_string_value(js0);
    if (js0 && !was)
        return mg_fail(err, MG_ERR_FORMAT, "the recorded scorer command is not a string");
    json_t *now = o->op.scorer_cmd ? scorer_json(o->op.scorer_cmd) : NULL;
    mg_status rc = MG_OK;
    const int other = was && now && strcmp(was, json_string_value(now));
    if (was && other && !o->op.scorer_changed)
        rc = mg_fail(err, MG_ERR_MISMATCH,
                     "%s was scored by --scorer '%.300s', not '%.300s': a resumed run keeps its "
                     "scorer (its cache and memory hold that scorer's scores); give the same "
                     "--scorer, or add --scorer-changed to go on with the new one (the scores "
                     "so far are kept)",
                     path, was, json_string_value(now));
    else if (o->op.scorer_cmd && !now)
        rc = mg_fail(err, MG_ERR_NOMEM, "out of memory");
    o->scorer_other = other;
    json_decref(now);
    if (rc) return rc;
    if (was && !(o->saved_scorer = strdup(was))) return mg_fail(err, MG_ERR_NOMEM, "out of memory");
    return MG_OK;
}

/* The agent's parameters, Adam's moments and the step counters of the
 * state file f and its JSON j. */
static mg_status restore_tensors(mg_opt *o, mg_st_file *f, const json_t *j, mg_error *err) {
    const size_t P = mg_model_num_params(o->agent), nt = mg_model_num_tensors(o->agent);
    mg_status rc = mg_ckpt_check_state(f, P, err);
    for (size_t i = 0; !rc && i < nt; i++) {
        const mg_param_info *ti = mg_model_tensor(o->agent, i);
        rc = mg_st_copy(f, ti->name, MG_ST_F32, ti->ndim, ti->shape,
                        mg_model_params(o->agent) + ti->offset, ti->numel * sizeof(float), err);
    }
    const int64_t shp[1] = {(int64_t)P};
    if (!rc) rc = mg_st_copy(f, "optim.m", MG_ST_F32, 1, shp, o->adam.m, P * sizeof(float), err);
    if (!rc) rc = mg_st_copy(f, "optim.v", MG_ST_F32, 1, shp, o->adam.v, P * sizeof(float), err);
    /* counters: steps within 2^40, Adam's at most 1 + --augmented-memory per step */
    const json_t *js = json_object_get(j, "step"), *ja = json_object_get(j, "adam_step"),
                 *jc = json_object_get(j, "collapse_run"),
                 *jp = json_object_get(j, "plateau_run");
    o->step = json_integer_value(js);
    o->adam.step = json_integer_value(ja);
    o->collapse_run = json_integer_value(jc);
    o->plateau_run = json_integer_value(jp);
    if (!rc && (!json_is_integer(js) || !json_is_integer(ja) || !json_is_integer(jc) ||
                !json_is_integer(jp) || o->plateau_run < 0 || o->plateau_run > o->step ||
                o->step < 0 || o->step > ((int64_t)1 << 40) || o->adam.step < 0 ||
                o->adam.step > o->step * (1 + o->op.aug_rounds) || o->collapse_run < 0 ||
                o->collapse_run > o->step))
        rc = mg_fail(err, MG_ERR_FORMAT, "the step counters (step %lld, Adam step %lld) are "
                     "malformed", (long long)o->step, (long long)o->adam.step);
    return rc;
}

mg_status mg_opt_restore(mg_opt *o, const char *path, mg_error *err) {
    mg_st_file *f;
    json_t *j;
    mg_status rc = load_state(path, &f, &j, err);
    if (rc) return rc;
    mg_opt_opts saved = o->op;
    char dig[24];
    snprintf(dig, sizeof dig, "%016llx", (unsigned long long)o->prior_digest);
    const char *pd = json_string_value(json_object_get(j, "prior_digest"));
    const char *which = NULL;
    if ((rc = options_from_json(json_object_get(j, "options"), &saved, err))) goto done;
    if (!pd || strcmp(pd, dig)) {
        rc = mg_fail(err, MG_ERR_MISMATCH, "%s was made from another prior (its parameters differ)",
                     path);
        goto done;
    }
    if ((which = differs(&saved, &o->op))) {
        rc = mg_fail(err, MG_ERR_MISMATCH, "%s was made with another %s (a resumed run keeps it)",
                     path, which);
        goto done;
    }
    if ((rc = restore_scorer(o, j, path, err)) || (rc = restore_tensors(o, f, j, err))) goto done;
    rc = restore_mols(o, json_object_get(j, "molecules"), json_object_get(j, "memory"), err);
done:
    if (rc && rc != MG_ERR_MISMATCH && strncmp(err->message, path, strlen(path))) {
        const mg_error e0 = *err; /* the message is an argument: not in place */
        mg_fail(err, rc, "%s: %s", path, e0.message);
    }
    json_decref(j);
    mg_st_free(f);
    return rc;
}

/* ------------------------------------------------------------ reports */

static void csv_field(FILE *f, const char *s) {
    if (!s) s = "";
    if (!strpbrk(s, ",\"\n")) {
        fputs(s, f);
        return;
    }
    fputc('"', f);
    for (; *s; s++) {
        if (*s == '"') fputc('"', f);
        fputc(*s, f);
    }
    fputc('"', f);
}

int mg_opt_write_scored(const mg_opt *o, FILE *f) {
    fputs("call,step,smiles,canonical,score,prior_nll,agent_nll,scaffold,components\n", f);
    for (size_t i = 0; i < o->nmol; i++) {
        const mol *m = &o->mols[i];
        fprintf(f, "%lld,%lld,", (long long)m->call, (long long)m->step);
        csv_field(f, m->smiles);
        fputc(',', f);
        csv_field(f, m->canonical);
        fprintf(f, ",%.10g,%.6f,%.6f,", m->score, m->prior_nll, m->agent_nll);
        csv_field(f, m->scaffold);
        fputc(',', f);
        csv_field(f, m->comps);
        fputc('\n', f);
    }
    return ferror(f) ? -1 : 0;
}

static const mg_opt *g_sort_opt;
static int best_cmp(const void *a, const void *b) {
    const size_t x = *(const size_t *)a, y = *(const size_t *)b;
    const double sx = g_sort_opt->mols[x].score, sy = g_sort_opt->mols[y].score;
    if (sx != sy) return sx > sy ? -1 : 1;
    return (x > y) - (x < y);
}

int mg_opt_write_best(const mg_opt *o, FILE *f, size_t n) {
    size_t *ix = malloc((o->nmol ? o->nmol : 1) * sizeof *ix);
    if (!ix) return -1;
    for (size_t i = 0; i < o->nmol; i++) ix[i] = i;
    g_sort_opt = o;
    qsort(ix, o->nmol, sizeof *ix, best_cmp);
    for (size_t i = 0; i < n && i < o->nmol; i++)
        fprintf(f, "%s\t%.10g\n", o->mols[ix[i]].canonical, o->mols[ix[i]].score);
    free(ix);
    return ferror(f) ? -1 : 0;
}

/* mean of the `top` best of s[0..n) (fewer when n < top), in buf[n] */
static double top_of(const double *s, size_t n, int top, double *buf) {
    if (!n) return 0;
    memcpy(buf, s, n * sizeof *buf);
    qsort(buf, n, sizeof *buf, cmp_desc);
    const size_t k = (size_t)top < n ? (size_t)top : n;
    double t = 0;
    for (size_t i = 0; i < k; i++) t += buf[i];
    return t / (double)k;
}

double mg_opt_auc_top(const double *s, size_t n, int top, int freq, int64_t budget) {
    if (!n || budget < 1) return 0;
    if ((int64_t)n > budget) n = (size_t)budget;
    double *buf = malloc(n * sizeof *buf);
    if (!buf) return NAN;
    double sum = 0, prev = 0;
    size_t called = 0;
    for (size_t idx = (size_t)freq; idx < n; idx += (size_t)freq) {
        const double now = top_of(s, idx, top, buf);
        sum += freq * (now + prev) / 2;
        prev = now;
        called = idx;
    }
    const double now = top_of(s, n, top, buf);
    sum += (double)(n - called) * (now + prev) / 2;
    if ((int64_t)n < budget) sum += (double)(budget - (int64_t)n) * now;
    free(buf);
    return sum / (double)budget;
}

int mg_opt_write_summary(const mg_opt *o, FILE *f, double seconds) {
    double *s = malloc((o->nmol ? o->nmol : 1) * sizeof *s);
    if (!s) return -1;
    for (size_t i = 0; i < o->nmol; i++) s[i] = o->mols[i].score;
    json_t *j = json_object();
    int bad = !j || mg_json_put(j, "calls", json_integer((json_int_t)o->nmol)) ||
              mg_json_put(j, "steps", json_integer(o->step)) ||
              mg_json_put(j, "budget", json_integer(o->op.budget)) ||
              mg_json_put(j, "top1", json_real(top_mean(o, 1))) ||
              mg_json_put(j, "top10", json_real(top_mean(o, 10))) ||
              mg_json_put(j, "top100", json_real(top_mean(o, 100))) ||
              mg_json_put(j, "auc_top1", json_real(mg_opt_auc_top(s, o->nmol, 1, 100, o->op.budget))) ||
              mg_json_put(j, "auc_top10", json_real(mg_opt_auc_top(s, o->nmol, 10, 100, o->op.budget))) ||
              mg_json_put(j, "auc_top100", json_real(mg_opt_auc_top(s, o->nmol, 100, 100, o->op.budget))) ||
              mg_json_put(j, "seconds", json_real(seconds)) ||
              mg_json_put(j, "stop", json_string(o->reason[0] ? o->reason : "error")) ||
              (o->op.scorer_cmd && mg_json_put(j, "scorer", scorer_json(o->op.scorer_cmd))) ||
              mg_json_put(j, "options", options_json(&o->op));
    free(s);
    char *t = bad ? NULL : mg_json_dump(j, 6);
    json_decref(j);
    if (!t) return -1;
    fprintf(f, "%s\n", t);
    free(t);
    return ferror(f) ? -1 : 0;
}
