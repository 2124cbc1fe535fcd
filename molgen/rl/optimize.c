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
#include "rl/chem_helper.h"
#include "rl/dap_loss.h"
#include "rl/opt_state.h"
#include "rl/scorer_process.h"
#include "base/util.h"

/* ------------------------------------------------------------ state */

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
    if (opts->helper && !opts->chem) {
        free(o);
        return mg_fail(err, MG_ERR_ARG, "helper on needs the chemistry helper started (chem)");
    }
    o->sc = scorer;
    mg_scorer_set_stop(scorer, opts->stop); /* a signal ends a wait for the scorer */
    if (opts->chem) mg_chem_set_stop(opts->chem, opts->stop);
    mg_model_set_dtype(prior, opts->dtype);
    mg_model_set_dtype(agent, opts->dtype);
    o->op = *opts;
    mg_df_init(&o->df, opts->df, opts->df_bucket, opts->df_min_score);
    o->alone = (mg_dist){0, 1, 0.0};
    o->d = opts->dist ? opts->dist : &o->alone;
    o->ctx = c->ctx_len;
    o->V = c->vocab_size;
    o->prior_digest = mg_model_params_digest(prior);
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
    o->cap_rows = opts->batch + opts->ga_offspring +
                  (opts->memory > opts->replay ? opts->memory : opts->replay);
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

void mg_opt_free(mg_opt *o) {
    if (!o) return;
    free(o->saved_scorer);
    for (size_t i = 0; i < o->nmol; i++) mg_opt_mol_clear(&o->mols[i]);
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

/* ------------------------------------------------------------ one step */

enum { ROW_OUT = -3, ROW_INVALID = -2, ROW_PENDING = -1 };

/* A step's rows: [0, nb) the agent's batch (smp), [nb, B) the GA's
 * children (kids), then the replayed memory rows (nreplay). */
typedef struct {
    mg_samples smp;
    int B, nb;
    const char **smi;      /* [B] each row's SMILES (smp's or kids') */
    char **kids;           /* [B - nb] the GA's children (NULL: none) */
    char **key;            /* [B] with the helper: RDKit's canonical SMILES (NULL: unreadable) */
    int64_t *gi;           /* [B] mol index (nmol + j: the step's new j), or ROW_* */
    unsigned char *enc;    /* [B] the row is encoded (a loss row) */
    double *s, *s2;        /* [B] score, learning score */
    opt_mol *newm;             /* the step's new molecules */
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
    for (int i = 0; i < w->B - w->nb && w->kids; i++) free(w->kids[i]);
    for (int i = 0; i < w->B && w->key; i++) free(w->key[i]);
    free(w->kids);
    free(w->key);
    free(w->smi);
    mg_samples_free(&w->smp);
    for (size_t j = 0; j < w->nnew; j++) mg_opt_mol_clear(&w->newm[j]);
    free(w->newm);
    free(w->gi);
    free(w->enc);
    free(w->s);
    free(w->s2);
    free(w->mem);
}

static const opt_mol *mol_at(const mg_opt *o, const step_work *w, int64_t gi) {
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

/* With the helper: RDKit's canonical SMILES of the pending rows into
 * w->key (one request per distinct spelling); a row RDKit cannot read is
 * invalid (no call), one whose molecule was scored before is served from the
 * cache. Every rank asks its own helper (the same answers). */
static mg_status canon_rows(mg_opt *o, step_work *w, mg_error *err) {
    const int B = w->B;
    const char **q = malloc((size_t)B * sizeof *q);
    int *at = malloc((size_t)B * sizeof *at); /* row -> index in q */
    char **k = calloc((size_t)B, sizeof *k);
    w->key = calloc((size_t)B, sizeof *w->key);
    mg_status rc = q && at && k && w->key ? MG_OK : mg_fail(err, MG_ERR_NOMEM, "out of memory");
    int n = 0;
    for (int i = 0; !rc && i < B; i++) {
        at[i] = -1;
        if (w->gi[i] != ROW_PENDING) continue;
        for (int j = 0; j < i && at[i] < 0; j++)
            if (at[j] >= 0 && !strcmp(w->smi[j], w->smi[i])) at[i] = at[j];
        if (at[i] < 0) q[n] = w->smi[i], at[i] = n++;
    }
    if (!rc) rc = mg_chem_canon(o->op.chem, q, (size_t)n, k, err);
    for (int i = 0; !rc && i < B; i++) {
        if (at[i] < 0) continue;
        const char *c = k[at[i]];
        if (!c) {
            w->gi[i] = ROW_INVALID;
            continue;
        }
        const int64_t *f = mg_strmap_find(&o->by_key, c);
        if (f) w->gi[i] = *f;
        else if (!(w->key[i] = strdup(c))) rc = mg_fail(err, MG_ERR_NOMEM, "out of memory");
    }
    for (int j = 0; j < n && k; j++) free(k[j]);
    free(k);
    free(q);
    free(at);
    return rc;
}

/* Scores the batch's pending molecules within the budget (no state change):
 * each distinct key once (with the helper the canonical SMILES, sent to the
 * scorer as such; without it the spelling, and the scorer's canonical=
 * answer the key). */
static mg_status score_batch(mg_opt *o, step_work *w, mg_error *err) {
    const int B = w->B;
    const char **pend = malloc((size_t)B * sizeof *pend);
    mg_score_reply *rep = calloc((size_t)B, sizeof *rep);
    w->newm = calloc((size_t)B, sizeof *w->newm);
    int np = 0;
    mg_status rc = MG_OK;
    if (!pend || !rep || !w->newm) rc = mg_fail(err, MG_ERR_NOMEM, "out of memory");
    if (!rc && o->op.helper) rc = canon_rows(o, w, err);
    if ((rc = agreed(o, rc, err))) goto done;
#define ROW_KEY(i) (o->op.helper ? (const char *)w->key[i] : w->smi[i])
    for (int i = 0; i < B; i++) {
        if (w->gi[i] != ROW_PENDING) continue;
        int dup = 0;
        for (int k = 0; k < np && !dup; k++) dup = !strcmp(pend[k], ROW_KEY(i));
        if (!dup) pend[np++] = ROW_KEY(i);
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
                const char *key = o->op.helper || !r->canonical || !*r->canonical ? smi
                                                                                  : r->canonical;
                const int64_t *f = mg_strmap_find(&o->by_key, key);
                if (f) gi = *f;
                for (size_t q = 0; !f && q < w->nnew && gi < 0; q++)
                    if (!strcmp(w->newm[q].canonical, key)) gi = (int64_t)(o->nmol + q);
                if (gi < 0) {
                    opt_mol *m = &w->newm[w->nnew];
                    int row = 0; /* the first row of this key: its spelling */
                    while (row < B && (w->gi[row] != ROW_PENDING || strcmp(ROW_KEY(row), smi)))
                        row++;
                    m->smiles = strdup(row < B ? w->smi[row] : smi);
                    m->canonical = strdup(key);
                    m->scaffold = r->scaffold ? strdup(r->scaffold) : NULL;
                    m->comps = r->comps ? strdup(r->comps) : strdup("");
                    m->score = r->score;
                    m->step = o->step;
                    m->ga = row >= w->nb && row < B;
                    m->call = (int64_t)(o->nmol + w->nnew) + 1;
                    gi = (int64_t)(o->nmol + w->nnew++);
                    if (!m->smiles || !m->canonical || !m->comps)
                        rc = mg_fail(err, MG_ERR_NOMEM, "out of memory");
                }
            }
            for (int i = 0; i < B; i++)
                if (w->gi[i] == ROW_PENDING && !strcmp(ROW_KEY(i), smi)) w->gi[i] = gi;
            mg_score_reply_clear(r);
        }
        if ((rc = agreed(o, rc, err))) goto done;
        sent += k;
    }
#undef ROW_KEY
    for (int i = 0; i < B; i++)
        if (w->gi[i] == ROW_PENDING) w->gi[i] = ROW_OUT; /* past the budget */
done:
    for (int j = 0; j < B && rep; j++) mg_score_reply_clear(&rep[j]);
    free(pend);
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
        const opt_mol *m = mol_at(o, w, w->gi[i]);
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
            const char *bk = mg_opt_bucket_key(o, m);
            int64_t pending = 0;
            for (size_t q = 0; q < w->nnew; q++)
                pending += mg_df_counts(&o->df, w->newm[q].score) &&
                           !strcmp(mg_opt_bucket_key(o, &w->newm[q]), bk);
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
    mg_status rc = MG_OK;
    if (b > a && o->op.helper) /* the helper spells them, else the scorer (!randomize) */
        rc = mg_chem_randomize(o->op.chem, smi + a, seeds + a, b - a, K, w->aug + a * (size_t)K,
                               err);
    else if (b > a)
        rc = mg_scorer_randomize(o->sc, smi + a, seeds + a, b - a, K, w->aug + a * (size_t)K, err);
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
        opt_mol *m = &w->newm[j];
        const int64_t gi = (int64_t)(o->nmol);
        for (int i = 0; i < w->B; i++)
            if (w->gi[i] == gi && w->enc[i]) {
                m->prior_nll = o->pnll[i];
                m->agent_nll = o->anll[i];
                break;
            }
        mg_status rc = mg_opt_add_mol(o, m, err);
        memset(m, 0, sizeof *m);
        if (rc) return rc;
    }
    w->nnew = 0;
    for (int i = 0; i < w->B; i++)
        if ((w->gi[i] == ROW_INVALID || w->gi[i] >= 0) &&
            mg_strmap_put(&o->raw, w->smi[i], w->gi[i] >= 0 ? w->gi[i] : -1))
            return mg_fail(err, MG_ERR_NOMEM, "out of memory");
    memcpy(o->mem, w->mem, (size_t)w->nmem * sizeof *o->mem);
    o->nmem = w->nmem;
    o->nan_sent += w->nnan;
    return MG_OK;
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

/* k distinct indices of [0, n) into out, drawn by weight (Tripp et al.'s
 * rank weights 1 / (coef n + r) for the r-th best of a memory of n, or
 * alike when coef is 0) from rng. */
static void draw_ranked(mg_rng *rng, int n, double coef, int k, int *out) {
    double wt[1024], total = 0;
    for (int r = 0; r < n; r++) total += wt[r] = coef > 0 ? 1.0 / (coef * n + r) : 1.0;
    for (int j = 0; j < k; j++) {
        double u = mg_rng_uniform(rng) * total;
        int pick = -1;
        for (int r = 0; r < n; r++) {
            if (wt[r] <= 0) continue;
            pick = r; /* the last one left, should u round past the sum */
            if ((u -= wt[r]) < 0) break;
        }
        out[j] = pick;
        total -= wt[pick];
        wt[pick] = 0;
    }
}

/* min(--replay, memory) distinct entries of the memory into idx: by rank
 * with --rank-coef, else alike (a partial shuffle, the runs before
 * --rank-coef); returns how many. */
static int draw_memory(const mg_opt *o, mg_rng *rng, int *idx) {
    const int nm = o->nmem < 1024 ? o->nmem : 1024, k = o->op.replay < nm ? o->op.replay : nm;
    if (o->op.rank_coef > 0) {
        draw_ranked(rng, nm, o->op.rank_coef, k, idx);
        return k;
    }
    for (int r = 0; r < nm; r++) idx[r] = r;
    for (int r = 0; r < k; r++) {
        const int j = r + (int)(mg_rng_next(rng) % (uint64_t)(nm - r));
        const int t = idx[r];
        idx[r] = idx[j];
        idx[j] = t;
    }
    return k;
}

/* Best first: the higher score, then the earlier molecule (a total order,
 * so the pool is the same on every rank and after a resume). */
typedef struct {
    double score;
    int64_t mol;
} pool_row;
static int best_first(const void *a, const void *b) {
    const pool_row *x = a, *y = b;
    if (x->score != y->score) return x->score > y->score ? -1 : 1;
    return (x->mol > y->mol) - (x->mol < y->mol);
}

/* --ga-pool: the min(N, molecules) best molecules scored so far, best
 * first, into *pool (all of them sorted: ~10^4 in a PMO run, about a
 * millisecond a step); returns how many, or -1 out of memory. */
static int ga_pool(const mg_opt *o, pool_row **pool) {
    pool_row *p = malloc((o->nmol ? o->nmol : 1) * sizeof *p);
    if (!p) return -1;
    for (size_t i = 0; i < o->nmol; i++) p[i] = (pool_row){o->mols[i].score, (int64_t)i};
    qsort(p, o->nmol, sizeof *p, best_first);
    *pool = p;
    return (int64_t)o->nmol < o->op.ga_pool ? (int)o->nmol : o->op.ga_pool;
}

/* The GA's children of the step (rows [nb, B)): --ga-offspring pairs of
 * distinct molecules drawn by rank (a stream of the step) from the memory,
 * or with --ga-pool from the best molecules scored so far, each pair's
 * child from the helper (NULL where none passed its checks). */
static mg_status offspring(mg_opt *o, step_work *w, mg_error *err) {
    const int G = o->op.ga_offspring;
    pool_row *pool = NULL;
    const int nm = !G                ? 0
                   : o->op.ga_pool ? ga_pool(o, &pool)
                                   : (o->nmem < 1024 ? o->nmem : 1024);
    if (nm < 0) return mg_fail(err, MG_ERR_NOMEM, "out of memory");
    if (nm < 2) {
        free(pool);
        return MG_OK;
    }
    w->kids = calloc((size_t)G, sizeof *w->kids);
    const char **par = malloc(2 * (size_t)G * sizeof *par);
    mg_status rc = w->kids && par ? MG_OK : mg_fail(err, MG_ERR_NOMEM, "out of memory");
    mg_rng rng;
    mg_rng_seed(&rng, o->op.seed, 0x2000000000ull + (uint64_t)o->step);
    for (int g = 0; !rc && g < G; g++) {
        int ab[2];
        draw_ranked(&rng, nm, o->op.rank_coef, 2, ab);
        for (int e = 0; e < 2; e++)
            par[2 * g + e] = o->mols[pool ? pool[ab[e]].mol : o->mem[ab[e]].mol].smiles;
    }
    free(pool);
    const uint64_t seed = mg_mix64(o->op.seed ^ mg_mix64((uint64_t)o->step + 0x6A09E667F3BCC909ull));
    if (!rc) rc = mg_chem_offspring(o->op.chem, seed & 0x7fffffffffffffffull, o->op.ga_mutation,
                                    par, (size_t)G, w->kids, err);
    free(par);
    if (!rc) w->B += G;
    return rc;
}

/* Prepares rows: the agent's batch rows [0, nb) from the sample, the GA's
 * children [nb, B), then the replay rows. */
static mg_status prepare(mg_opt *o, step_work *w, mg_error *err) {
    const int nb = o->op.batch;
    w->B = w->nb = nb;
    mg_sample_opts so;
    mg_sample_opts_default(&so);
    so.n = (size_t)nb;
    so.batch = nb;
    so.seed = mg_mix64(o->op.seed ^ mg_mix64((uint64_t)o->step + 0x5851F42D4C957F2Dull));
    so.constrain = o->op.constrain;
    so.method = (mg_constrain_method)o->op.constrain_method;
    so.dtype = o->op.dtype;
    so.stop = o->op.stop;
    so.dist = o->d->size > 1 ? o->d : NULL;
    mg_status rc = mg_sample(o->agent, o->vocab, &so, &w->smp, err);
    if (!rc) rc = share_batch(o, &w->smp, (size_t)nb, err);
    if (!rc) rc = agreed(o, offspring(o, w, err), err);
    if (rc) return rc;
    const int B = w->B;
    w->smi = malloc((size_t)B * sizeof *w->smi);
    w->gi = malloc((size_t)B * sizeof *w->gi);
    w->enc = calloc((size_t)B, 1);
    w->s = calloc((size_t)B, sizeof *w->s);
    w->s2 = calloc((size_t)B, sizeof *w->s2);
    if (!w->smi || !w->gi || !w->enc || !w->s || !w->s2)
        return mg_fail(err, MG_ERR_NOMEM, "out of memory");
    for (int i = 0; i < B; i++) {
        const char *kid = i < nb ? NULL : w->kids[i - nb];
        const char *smi = w->smi[i] = i < nb ? w->smp.smiles[i] : kid ? kid : "";
        w->enc[i] = (i < nb ? w->smp.ended[i] : kid != NULL) && mg_opt_encode_row(o, i, smi);
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
    w->nreplay = draw_memory(o, &rng, idx);
    for (int k = 0; k < w->nreplay; k++) {
        w->rmol[k] = o->mem[idx[k]].mol;
        w->rscore[k] = o->mem[idx[k]].score;
        const opt_mol *m = &o->mols[w->rmol[k]];
        if (!mg_opt_encode_row(o, B + k, m->smiles))
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
                               r < B ? w->smi[r] : o->mols[w->rmol[r - B]].smiles, v[k],
                               OPT_NLL_MAX);
    }
    return MG_OK;
}

/* The NLLs of the loss rows [0, N = B + replay): this rank's part [a, b)
 * (mg_dist_range) through the prior (sampled rows; the replayed ones' are
 * stored) and the agent (its activations kept for mg_opt_dap_update), then every
 * rank's parts to every rank (a sum over zeros elsewhere: exact). */
static mg_status row_nlls(mg_opt *o, const step_work *w, mg_error *err) {
    const int B = w->B, N = B + w->nreplay;
    size_t a, b;
    mg_dist_range((size_t)N, o->d->rank, o->d->size, &a, &b);
    const int pb = (int)b < B ? (int)b : B, pa = (int)a < pb ? (int)a : pb;
    mg_status rc = mg_opt_rows_nll(o, o->prior, pa, pb - pa, o->pnll + pa, err);
    for (int k = 0; k < w->nreplay; k++) o->pnll[B + k] = o->mols[w->rmol[k]].prior_nll;
    if (!rc) rc = mg_opt_rows_nll(o, o->agent, (int)a, (int)(b - a), o->anll + a, err);
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
            const opt_mol *m = &o->mols[o->mem[r].mol];
            use[r] = 1;
            if (!sp || !mg_opt_encode_row(o, r, sp)) mg_opt_encode_row(o, r, m->smiles);
        }
        double loss;
        rc = mg_opt_rows_nll(o, o->prior, (int)a, (int)(b - a), o->pnll + a, err);
        if (!rc) rc = mg_opt_rows_nll(o, o->agent, (int)a, (int)(b - a), o->anll + a, err);
        for (int r = 0; r < n; r++) sc[r] = o->mem[r].score;
        if (!(rc = agreed(o, rc, err))) rc = mg_opt_dap_update(o, n, sc, use, &loss, err);
    }
    free(sc);
    free(use);
    return rc;
}

/* Genetic GFN's experience loop: --replay-loops more updates on the
 * committed memory, each on rows [0, R) of R entries drawn afresh (a stream
 * of the step and loop) with their stored prior NLLs and scores. */
static mg_status replay_loops(mg_opt *o, mg_error *err) {
    mg_status rc = MG_OK;
    for (int l = 0; !rc && l < o->op.replay_loops; l++) {
        mg_rng rng;
        mg_rng_seed(&rng, o->op.seed, 0x2000000000ull + (uint64_t)o->step * 128u + (uint64_t)l);
        int idx[1024];
        double sc[1024];
        unsigned char use[1024];
        const int R = draw_memory(o, &rng, idx);
        if (!R) break;
        for (int k = 0; k < R; k++) {
            const opt_mol *m = &o->mols[o->mem[idx[k]].mol];
            if (!mg_opt_encode_row(o, k, m->smiles))
                return mg_fail(err, MG_ERR_STATE, "memory molecule '%s' cannot be encoded",
                               m->smiles);
            o->pnll[k] = m->prior_nll;
            sc[k] = o->mem[idx[k]].score;
            use[k] = 1;
        }
        size_t a, b; /* this rank's rows */
        mg_dist_range((size_t)R, o->d->rank, o->d->size, &a, &b);
        double loss;
        rc = agreed(o, mg_opt_rows_nll(o, o->agent, (int)a, (int)(b - a), o->anll + a, err), err);
        if (!rc) rc = mg_opt_dap_update(o, R, sc, use, &loss, err);
    }
    return rc;
}

/* Tests (molgen/tests/rl/test_optimize.py's float64 oracle of a step with
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

/* Molecules scored above 0 so far. */
static size_t hits(const mg_opt *o) {
    size_t n = 0;
    for (size_t i = 0; i < o->nmol; i++) n += o->mols[i].score > 0;
    return n;
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
    const double top100 = mg_opt_top_mean(o, 100);
    if (!rc) rc = agreed(o, commit(o, &w, err), err); /* past here the step is the state's */
    /* mol_opt compares the top 100 only past 1,000 calls; and only once
     * 100 molecules have scored above 0: before, the top 100 are mostly
     * zeros and their mean does not say the run has converged (PMO's
     * valsartan_smarts: its SMARTS matches 1 in 20,000 ZINC-like molecules;
     * a run that found one, at 0.0015, stopped 5 steps later) */
    if (!rc)
        o->plateau_run = o->nmol > 1000 && hits(o) >= 100 && mg_opt_top_mean(o, 100) == top100
                             ? o->plateau_run + 1
                             : 0;
    const int B = w.B, N = B + w.nreplay;
    double s2[N > 0 ? N : 1];
    unsigned char use[N > 0 ? N : 1];
    int valid = 0, uniq = 0;
    double sum = 0;
    for (int i = 0; !rc && i < N; i++) {
        s2[i] = i < B ? w.s2[i] : w.rscore[i - B];
        use[i] = i >= B || w.enc[i];
        if (i < w.nb && w.gi[i] >= 0) {
            valid++;
            sum += w.s[i];
            int dup = 0;
            for (int k = 0; k < i && !dup; k++) dup = w.gi[k] == w.gi[i];
            uniq += !dup;
        }
    }
    double loss = 0;
    if (!rc) rc = mg_opt_dap_update(o, N, s2, use, &loss, err);
    if (!rc) rc = dump_step(o, &w, N, s2, use, loss, err);
    if (!rc) rc = aug_rounds(o, &w, err);
    if (!rc) rc = replay_loops(o, err);
    aug_free(&w, o->op.aug_rounds);
    work_free(&w);
    if (rc) return rc;
    o->step++;
    *pg = (mg_opt_progress){.step = o->step,
                            .calls = (int64_t)o->nmol,
                            .budget = o->op.budget,
                            .batch = w.nb,
                            .mean = sum / w.nb,
                            .top10 = mg_opt_top_mean(o, 10),
                            .valid = (double)valid / w.nb,
                            .unique = (double)uniq / w.nb,
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
    uint64_t h = mg_model_params_digest(o->agent);
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
