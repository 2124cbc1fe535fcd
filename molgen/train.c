/* molgen train: training loop, validation, progress, checkpoints, resume,
 * (see train.h). */
#define _POSIX_C_SOURCE 200809L
#include "train.h"
#include "errors.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "attn.h"
#include "checkpoint.h"
#include "data.h"
#include "safetensors.h"
#include "tokenizer.h"
#include "util.h"


/* ------------------------------------------------------------ stop flag */

static volatile sig_atomic_t g_stop_signal = 0;

/* total_steps of a schedule still to be sized from the time limit. */
#define MG_STEPS_UNSIZED (INT64_MAX / 4)

void mg_train_request_stop(int signo) { g_stop_signal = signo ? signo : SIGINT; }

int mg_train_stop_signal(void) { return (int)g_stop_signal; }

static void on_signal(int signo) { mg_train_request_stop(signo); }

void mg_train_install_signal_handlers(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESETHAND; /* a second signal: default action */
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
}

/* ------------------------------------------------------------ config */

void mg_train_config_default(mg_train_config *c) {
    memset(c, 0, sizeof *c);
    c->val_frac = 0.05;
    mg_model_config_default(&c->model);
    mg_adamw_config_default(&c->optim);
    c->batch_size = 32;
    c->max_tokens = MG_MAX_TOKENS_DEFAULT;
    c->val_every = -1;
    c->val_max = 2000;
    c->ckpt_every = 1000;
    c->seed = 1;
    c->progress = 1;
}

/* ------------------------------------------------------------ helpers */

/* Dropout seed of step s: a function of (seed, s) only, so resume needs no
 * RNG state beyond the step. */
static uint64_t step_seed(uint64_t seed, int64_t s) {
    return mg_mix64(seed * 0x9E3779B97F4A7C15ull + 0x632BE59BD9B4E019ull * (uint64_t)(s + 1));
}

/* FNV-1a over the dataset's ids and lengths: detects a changed data file on
 * resume. */
static uint64_t dataset_hash(const mg_dataset *d) {
    uint64_t h = 0xcbf29ce484222325ull;
    const unsigned char *p = (const unsigned char *)d->ids;
    for (size_t i = 0; i < d->n * (size_t)d->T * sizeof(int32_t); i++) h = (h ^ p[i]) * 0x100000001b3ull;
    p = (const unsigned char *)d->lengths;
    for (size_t i = 0; i < d->n * sizeof(int64_t); i++) h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

/* Entropy (nats) of the target-token distribution of d: every token after
 * BOS up to and including EOS. */
static double unigram_entropy(const mg_dataset *d, int V) {
    double *cnt = calloc((size_t)V, sizeof(double)), total = 0.0, h = 0.0;
    if (!cnt) return NAN;
    for (size_t r = 0; r < d->n; r++)
        for (int64_t t = 1; t < d->lengths[r]; t++) {
            int32_t id = d->ids[r * (size_t)d->T + (size_t)t];
            if (id >= 0 && id < V) cnt[id] += 1.0;
            total += 1.0;
        }
    for (int v = 0; v < V; v++)
        if (cnt[v] > 0) h -= cnt[v] / total * log(cnt[v] / total);
    free(cnt);
    return h;
}

/* Validation interval when not given: about 10 validations per run. */
static int auto_val_every(int64_t total) {
    int64_t k = total / 10;
    return (int)(k < 10 ? 10 : k > INT32_MAX ? INT32_MAX : k);
}

static void fmt_duration(double s, char *out, size_t n) {
    if (!(s >= 0) || s > 1e7) {
        snprintf(out, n, "?");
        return;
    }
    long t = (long)(s + 0.5);
    if (t >= 3600) snprintf(out, n, "%ldh%02ldm", t / 3600, (t / 60) % 60);
    else if (t >= 60) snprintf(out, n, "%ldm%02lds", t / 60, t % 60);
    else snprintf(out, n, "%lds", t);
}

/* ------------------------------------------------------------ logging */

typedef struct {
    FILE *f;
    int quiet, progress, tty;
    int line_open;    /* a \r progress line is on screen */
    double last_draw; /* time of the last progress output */
} logger;

static void log_msg(logger *lg, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void log_msg(logger *lg, const char *fmt, ...) {
    if (lg->quiet) return;
    if (lg->line_open) {
        fputs("\r\033[K", lg->f);
        lg->line_open = 0;
    }
    va_list ap;
    va_start(ap, fmt);
    vfprintf(lg->f, fmt, ap);
    va_end(ap);
    fputc('\n', lg->f);
    fflush(lg->f);
}

/* ------------------------------------------------------------ validation */

/* Mean loss over the first nv rows of val, in batches of B (eval mode). */
static mg_status validate(mg_model *m, const mg_dataset *val, size_t nv, int B, int32_t *buf, double *loss,
                    mg_error *err) {
    double sum = 0.0;
    int64_t count = 0;
    for (size_t r0 = 0; r0 < nv; r0 += (size_t)B) {
        int nb = (int)((nv - r0) < (size_t)B ? (nv - r0) : (size_t)B);
        const int32_t *ids = val->ids + r0 * (size_t)val->T;
        const int64_t *len = val->lengths + r0;
        int Tb = mg_trim_batch(ids, len, nb, val->T, buf);
        float l;
        int64_t nt;
        mg_error e;
        if (mg_model_forward(m, buf, len, nb, Tb, 0, 0, &l, &nt, &e))
            return mg_fail(err, e.status, "validation: %s", e.message);
        sum += (double)l * (double)nt;
        count += nt;
    }
    *loss = count ? sum / (double)count : NAN;
    return 0;
}

/* ------------------------------------------------------------ the run */

mg_status mg_train_run(const mg_train_config *c, mg_train_result *result, mg_error *err) {
    mg_status rc_;
    const double t0 = mg_now_s();
    mg_train_result res;
    memset(&res, 0, sizeof res);
    res.val_loss = res.first_val_loss = NAN;
    if (!c) return mg_fail(err, MG_ERR_ARG, "train config is NULL");
    g_stop_signal = 0;

    logger lg = {c->log ? c->log : stderr, c->quiet, c->progress, 0, 0, 0.0};
    lg.tty = isatty(fileno(lg.f));

    mg_ckpt ck;
    memset(&ck, 0, sizeof ck);
    mg_dataset all, train, val;
    memset(&all, 0, sizeof all);
    memset(&train, 0, sizeof train);
    memset(&val, 0, sizeof val);
    mg_batcher *batcher = NULL;
    int32_t *bids = NULL, *bbuf = NULL;
    int64_t *blen = NULL;
    mg_status rc = MG_ERR_ARG; /* every failure path sets it */
    mg_error e;
    const int resuming = c->resume_path != NULL;

    /* ---- configuration: fresh, or the checkpoint's */
    mg_train_state ts;
    memset(&ts, 0, sizeof ts);
    if (resuming) {
        if ((rc_ = mg_ckpt_load(c->resume_path, &ck, err))) return rc_;
        ts = ck.ts;
        if (c->data_path && strlen(c->data_path) < sizeof ts.data) snprintf(ts.data, sizeof ts.data, "%s", c->data_path);
        if (c->steps > 0 && c->steps < ts.step) {
            const int64_t total = ck.opt.cfg.total_steps;
            mg_ckpt_free(&ck);
            return mg_fail(err, MG_ERR_ARG, "%s is at step %" PRId64 " of a %" PRId64 "-step schedule: --steps %" PRId64
                    " is behind it (give more steps than the checkpoint has done, or none to finish its schedule)",
                    c->resume_path, ts.step, total, c->steps);
        }
        log_msg(&lg, "resuming from %s at step %" PRId64, c->resume_path, ts.step);
    } else {
        if (!c->data_path) return mg_fail(err, MG_ERR_ARG, "no data file given");
        if (strlen(c->data_path) >= sizeof ts.data) return mg_fail(err, MG_ERR_ARG, "data path too long");
        if (c->batch_size < 1) return mg_fail(err, MG_ERR_ARG, "batch size %d must be >= 1", c->batch_size);
        if (!(c->val_frac >= 0 && c->val_frac < 1))
            return mg_fail(err, MG_ERR_ARG, "validation fraction %g must be in [0, 1)", c->val_frac);
        if (c->val_every < -1 || c->val_max < 0 || c->ckpt_every < 0 || c->max_tokens < 0)
            return mg_fail(err, MG_ERR_ARG, "val_every (-1: auto), val_max, ckpt_every and max_tokens must be >= 0");
        snprintf(ts.data, sizeof ts.data, "%s", c->data_path);
        snprintf(ts.csv_column, sizeof ts.csv_column, "%s", c->csv_column ? c->csv_column : "smiles");
        ts.seed = c->seed;
        ts.batch_size = c->batch_size;
        ts.val_frac = c->val_frac;
        ts.max_tokens = c->max_tokens;
        ts.val_every = c->val_every;
        ts.val_max = c->val_max;
        ts.ckpt_every = c->ckpt_every;
        ts.val_loss = NAN;
    }
    if (c->steps < 0 || !(c->time_limit >= 0 && c->time_limit <= MG_TIME_LIMIT_MAX) || c->stop_after < 0)
        return mg_ckpt_free(&ck), mg_fail(err, MG_ERR_ARG, "steps and stop_after must be >= 0, the "
                                             "time limit in [0, %g] seconds", MG_TIME_LIMIT_MAX);
    if (!resuming && c->steps == 0 && c->time_limit <= 0)
        return mg_fail(err, MG_ERR_ARG, "give a number of steps or a time limit");
    if (!c->out_path) return mg_ckpt_free(&ck), mg_fail(err, MG_ERR_ARG, "no output path given");

    /* ---- data */
    {
        mg_load_opts lo;
        memset(&lo, 0, sizeof lo);
        lo.csv_column = ts.csv_column;
        lo.max_tokens = ts.max_tokens;
        if (resuming) lo.T = mg_model_get_config(ck.model)->ctx_len + 1;
        else lo.T = c->model.ctx_len > 0 ? c->model.ctx_len + 1 : 0;
        mg_report rep;
        mg_vocab *built = NULL;
        if (mg_dataset_load(ts.data, &lo, resuming ? ck.vocab : NULL, resuming ? NULL : &built, &all,
                            &rep, &e)) {
            rc = mg_fail(err, e.status, "%s", e.message);
            goto done;
        }
        if (!resuming) ck.vocab = built;
        res.skipped = rep.skipped;
        char msg[4096];
        mg_report_format(&rep, msg, sizeof msg);
        log_msg(&lg, "data %s: %s", ts.data, msg);
        if (rep.skipped > 0 && !lg.quiet)
            log_msg(&lg, "warning: %ld line(s) skipped (see above)", rep.skipped);
        if (resuming) {
            const uint64_t h = dataset_hash(&all);
            if ((uint64_t)all.n != ts.data_rows || h != ts.data_hash) {
                rc = mg_fail(err, MG_ERR_MISMATCH, "data %s differs from the checkpoint's (%zu molecules vs %" PRIu64
                     "%s): resume needs the same data", ts.data, all.n, ts.data_rows,
                     (uint64_t)all.n == ts.data_rows ? ", same count but different content" : "");
                goto done;
            }
        } else {
            ts.data_rows = all.n;
            ts.data_hash = dataset_hash(&all);
        }
        if (mg_dataset_split(&all, ts.val_frac, ts.seed, &train, &val, &e)) {
            rc = mg_fail(err, e.status, "%s", e.message);
            goto done;
        }
        if (train.n < (size_t)ts.batch_size) {
            rc = mg_fail(err, MG_ERR_ARG, "training split has %zu molecules, fewer than the batch size %d",
                 train.n, ts.batch_size);
            goto done;
        }
    }
    res.n_train = train.n;
    res.n_val = val.n;

    /* ---- model and optimizer */
    if (!resuming) {
        mg_model_config mc = c->model;
        mc.vocab_size = mg_vocab_size(ck.vocab);
        mc.ctx_len = all.T - 1;
        if (mg_model_create(&mc, &ck.model, &e)) {
            rc = mg_fail(err, e.status, "model: %s", e.message);
            goto done;
        }
        mg_model_init(ck.model, ts.seed);
        const size_t nt = mg_model_num_tensors(ck.model);
        mg_optim_span *spans = malloc(nt * sizeof *spans);
        if (!spans) {
            rc = mg_fail(err, MG_ERR_NOMEM, "out of memory");
            goto done;
        }
        for (size_t i = 0; i < nt; i++) {
            const mg_param_info *pi = mg_model_tensor(ck.model, i);
            spans[i].offset = pi->offset;
            spans[i].numel = pi->numel;
            spans[i].decay = pi->decay;
        }
        mg_adamw_config oc = c->optim;
        oc.total_steps = c->steps > 0 ? c->steps : MG_STEPS_UNSIZED; /* estimated later */
        mg_status orc = mg_adamw_init(&ck.opt, &oc, mg_model_num_params(ck.model), spans, nt, &e);
        free(spans);
        if (orc) {
            rc = mg_fail(err, e.status, "optimizer: %s", e.message);
            goto done;
        }
    } else if (c->steps > 0 && c->steps != ck.opt.cfg.total_steps) {
        log_msg(&lg, "note: schedule length changed from %" PRId64 " to %" PRId64 " steps",
                ck.opt.cfg.total_steps, c->steps);
        ck.opt.cfg.total_steps = c->steps;
    }
    /* A time-limited run stopped before its schedule was sized (the first
     * timed steps) is sized again when resumed, which needs a time limit. */
    int total_known = c->steps > 0 || (resuming && ck.opt.cfg.total_steps < MG_STEPS_UNSIZED);
    if (!total_known && c->time_limit <= 0) {
        rc = mg_fail(err, MG_ERR_ARG, 
                "%s stopped before its schedule length was known: resume with --steps N or "
                "--time-limit SECONDS", c->resume_path);
        goto done;
    }
    int time_sized = 0; /* the schedule length was estimated from the time limit */
    if (total_known && ts.val_every < 0) ts.val_every = auto_val_every(ck.opt.cfg.total_steps);
    mg_adamw *opt = &ck.opt;
    mg_model *model = ck.model;
    const mg_model_config *mc = mg_model_get_config(model);
    if (total_known && opt->cfg.warmup_steps > opt->cfg.total_steps / 2 && !resuming) {
        opt->cfg.warmup_steps = opt->cfg.total_steps / 10 > 1 ? opt->cfg.total_steps / 10 : 1;
        log_msg(&lg, "note: warm-up shortened to %" PRId64 " steps (a tenth of the run)",
                opt->cfg.warmup_steps);
    }
    res.vocab_size = mc->vocab_size;
    res.ctx_len = mc->ctx_len;
    res.unigram_entropy = unigram_entropy(&train, mc->vocab_size);
    log_msg(&lg,
            "model: %d layers, d_model %d, %d heads, ctx %d, vocab %d, dropout %g: %zu parameters; "
            "%zu train / %zu validation molecules; batch %d; %d thread(s)",
            mc->n_layer, mc->d_model, mc->n_head, mc->ctx_len, mc->vocab_size, (double)mc->dropout,
            mg_model_num_params(model), train.n, val.n, ts.batch_size, attn_get_num_threads());

    /* ---- causal-leak guard */
    if (!c->skip_guard) {
        if (mg_model_causal_guard(model, ts.seed, &e)) {
            rc = mg_fail(err, e.status, "causal-leak guard failed: %s", e.message);
            goto done;
        }
    }

    /* ---- batches */
    const int B = ts.batch_size, T = all.T;
    if (mg_batcher_new(&train, B, ts.seed, 1, &batcher, &e)) {
        rc = mg_fail(err, e.status, "%s", e.message);
        goto done;
    }
    mg_batcher_seek(batcher, (uint64_t)ts.step);
    bids = malloc((size_t)B * T * sizeof(int32_t));
    bbuf = malloc((size_t)B * T * sizeof(int32_t));
    blen = malloc((size_t)B * sizeof(int64_t));
    if (!bids || !bbuf || !blen) {
        rc = mg_fail(err, MG_ERR_NOMEM, "out of memory for batches");
        goto done;
    }
    const size_t nv = (ts.val_max > 0 && (size_t)ts.val_max < val.n) ? (size_t)ts.val_max : val.n;

    /* ---- initial validation (also times one validation pass) */
    double t_val = 0.0;
    if (nv > 0) {
        double tv = mg_now_s();
        if ((rc = validate(model, &val, nv, B, bbuf, &res.first_val_loss, err))) goto done;
        t_val = mg_now_s() - tv;
        res.val_loss = res.first_val_loss;
        log_msg(&lg, "step %" PRId64 ": val loss %.4f (%zu molecules; unigram entropy %.4f)", ts.step,
                res.first_val_loss, nv, res.unigram_entropy);
    }

    /* ---- the loop */
    const int64_t start_step = ts.step;
    const int CAL = 10; /* steps timed before estimating the schedule length */
    double step_time = 0.0, timed_tokens = 0.0, loss_ema = NAN;
    int64_t timed_steps = 0;
    double last_val_at = -1;
    mg_stop_reason stop = MG_STOP_DONE;
    for (;;) {
        if (total_known && ts.step >= opt->cfg.total_steps) {
            stop = MG_STOP_DONE;
            break;
        }
        if (g_stop_signal) {
            stop = MG_STOP_SIGNAL;
            break;
        }
        if (c->stop_after > 0 && ts.step >= c->stop_after) {
            stop = MG_STOP_AFTER;
            break;
        }
        if (c->time_limit > 0 && timed_steps > 0) {
            const double avg = step_time / (double)timed_steps;
            if (mg_now_s() - t0 + avg + t_val > c->time_limit) {
                stop = MG_STOP_TIME;
                break;
            }
        }
        /* one step */
        const double ts0 = mg_now_s();
        mg_batcher_next(batcher, bids, blen, NULL);
        const int Tb = mg_trim_batch(bids, blen, B, T, bbuf);
        float loss, gnorm, lr;
        int64_t ntok;
        if (mg_model_forward(model, bbuf, blen, B, Tb, 1, step_seed(ts.seed, ts.step), &loss, &ntok, &e) ||
            mg_model_backward(model, &e) ||
            mg_adamw_step(opt, mg_model_params(model), mg_model_grads(model), &gnorm, &lr, &e)) {
            rc = mg_fail(err, MG_ERR_ARG, "step %" PRId64 ": %s", ts.step, e.message);
            goto done;
        }
        ts.step++;
        const double dt = mg_now_s() - ts0;
        if (ts.step - start_step > 1) { /* the first step warms caches: not timed */
            step_time += dt;
            timed_tokens += (double)ntok;
            timed_steps++;
        }
        res.tokens += ntok;
        res.train_loss = loss;
        loss_ema = isnan(loss_ema) ? loss : 0.9 * loss_ema + 0.1 * loss;

        /* A schedule sized from the time limit is re-sized every 2% of it
         * from the average step time so far (the machine's load may change),
         * so that the cosine still ends near the limit. */
        if (time_sized && ts.step % (opt->cfg.total_steps / 50 > CAL ? opt->cfg.total_steps / 50 : CAL) == 0) {
            const double avg = step_time / (double)timed_steps;
            const int64_t vals_left = ts.val_every > 0 && nv > 0 ? (opt->cfg.total_steps - ts.step) / ts.val_every : 0;
            const double budget = 0.97 * (c->time_limit - (mg_now_s() - t0) - t_val) - (double)vals_left * t_val;
            int64_t more = budget > 0 ? (int64_t)(budget / avg) : 0;
            opt->cfg.total_steps = ts.step + (more > 1 ? more : 1);
        }
        /* schedule length from the time limit, once CAL steps are timed */
        if (!total_known && timed_steps >= CAL) {
            const double avg = step_time / (double)timed_steps;
            const double remaining = c->time_limit - (mg_now_s() - t0) - t_val;
            /* validations to come: every val_every steps, or ~10 when auto */
            double budget = 0.97 * remaining, per_step = avg;
            int64_t n_vals = 0; /* auto: up to 10, costing at most 5% of the time */
            if (ts.val_every > 0 && nv > 0) per_step += t_val / ts.val_every;
            if (ts.val_every < 0 && nv > 0 && t_val > 0) {
                n_vals = (int64_t)(0.05 * remaining / t_val);
                n_vals = n_vals < 1 ? 1 : n_vals > 10 ? 10 : n_vals;
                budget -= (double)(n_vals - 1) * t_val; /* the last one is the final validation */
            }
            int64_t more = budget > 0 ? (int64_t)(budget / per_step) : 0;
            opt->cfg.total_steps = ts.step + (more > 0 ? more : 0);
            if (opt->cfg.total_steps < 1) opt->cfg.total_steps = 1;
            if (opt->cfg.warmup_steps > opt->cfg.total_steps / 2)
                opt->cfg.warmup_steps = opt->cfg.total_steps / 10 > CAL ? opt->cfg.total_steps / 10 : CAL;
            total_known = 1;
            time_sized = 1;
            if (ts.val_every < 0) {
                const int64_t k = n_vals > 0 ? (opt->cfg.total_steps - ts.step) / n_vals : 0;
                ts.val_every = n_vals > 0 ? (int)(k < 1 ? 1 : k > INT32_MAX ? INT32_MAX : k) : 0;
            }
            log_msg(&lg, "schedule: %" PRId64 " steps fit in the time limit (%.0f ms/step), warm-up %" PRId64,
                    opt->cfg.total_steps, 1e3 * avg, opt->cfg.warmup_steps);
        }
        const int final_step = total_known && ts.step >= opt->cfg.total_steps;
        if (ts.val_every > 0 && nv > 0 && ts.step % ts.val_every == 0) {
            double tv = mg_now_s();
            if ((rc = validate(model, &val, nv, B, bbuf, &res.val_loss, err))) goto done;
            t_val = mg_now_s() - tv;
            last_val_at = (double)ts.step;
            char el[32];
            fmt_duration(mg_now_s() - t0, el, sizeof el);
            log_msg(&lg, "step %" PRId64 "/%" PRId64 ": train loss %.4f, val loss %.4f, lr %.2e, %.0f tok/s, %s",
                    ts.step, total_known ? opt->cfg.total_steps : (int64_t)0, loss_ema, res.val_loss,
                    (double)lr, step_time > 0 ? timed_tokens / step_time : 0.0, el);
        }
        if (ts.ckpt_every > 0 && ts.step % ts.ckpt_every == 0 && !final_step) {
            ts.val_loss = res.val_loss;
            if ((rc = mg_ckpt_save(c->out_path, model, ck.vocab, opt, &ts, err))) goto done;
        }
        /* progress line */
        if (lg.progress && !lg.quiet) {
            const double t = mg_now_s();
            const double every = lg.tty ? 0.2 : 10.0;
            if (t - lg.last_draw >= every || final_step) {
                lg.last_draw = t;
                const double avg = timed_steps ? step_time / (double)timed_steps : dt;
                char el[32], eta[32], vl[32], tot[32];
                fmt_duration(t - t0, el, sizeof el);
                double left = total_known ? (double)(opt->cfg.total_steps - ts.step) * avg : NAN;
                if (c->time_limit > 0) {
                    double tl = c->time_limit - (t - t0);
                    if (!(left <= tl)) left = tl > 0 ? tl : 0;
                }
                fmt_duration(left, eta, sizeof eta);
                if (isnan(res.val_loss)) snprintf(vl, sizeof vl, "-");
                else snprintf(vl, sizeof vl, "%.4f", res.val_loss);
                if (total_known) snprintf(tot, sizeof tot, "%" PRId64, opt->cfg.total_steps);
                else snprintf(tot, sizeof tot, "?");
                char line[256];
                snprintf(line, sizeof line,
                         "step %" PRId64 "/%s | loss %.4f | val %s | %.1fk tok/s | %s | ETA %s", ts.step,
                         tot, loss_ema, vl, (step_time > 0 ? timed_tokens / step_time : 0.0) / 1e3, el,
                         eta);
                if (lg.tty) {
                    fprintf(lg.f, "\r%s\033[K", line);
                    lg.line_open = 1;
                } else {
                    fprintf(lg.f, "%s\n", line);
                }
                fflush(lg.f);
            }
        }
    }

    /* ---- end: final validation, checkpoint, summary */
    if (nv > 0 && last_val_at != (double)ts.step && ts.step > start_step) {
        if ((rc = validate(model, &val, nv, B, bbuf, &res.val_loss, err))) goto done;
    }
    ts.val_loss = res.val_loss;
    if ((rc = mg_ckpt_save(c->out_path, model, ck.vocab, opt, &ts, err))) goto done;
    res.step = ts.step;
    res.total_steps = opt->cfg.total_steps;
    res.stop = stop;
    res.seconds = mg_now_s() - t0;
    res.tokens_per_sec = step_time > 0 ? timed_tokens / step_time : 0.0;
    {
        static const char *const why[] = {"finished", "time limit reached", "interrupted", "stopped as asked"};
        char el[32];
        fmt_duration(res.seconds, el, sizeof el);
        log_msg(&lg, "%s at step %" PRId64 "/%" PRId64 ": train loss %.4f, val loss %.4f, %.0f tok/s, %s; "
                "checkpoint %s", why[stop], ts.step, opt->cfg.total_steps, loss_ema, res.val_loss,
                res.tokens_per_sec, el, c->out_path);
    }
    rc = 0;
done:
    if (lg.line_open && !lg.quiet) {
        fputc('\n', lg.f);
        lg.line_open = 0;
    }
    if (result) *result = res;
    free(bids);
    free(bbuf);
    free(blen);
    mg_batcher_free(batcher);
    mg_dataset_free(&train);
    mg_dataset_free(&val);
    mg_dataset_free(&all);
    mg_ckpt_free(&ck);
    return rc;
}
