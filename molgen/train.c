/* molgen train: training loop, validation, progress, checkpoints, resume,
 * and the `molgen train` command (see train.h). */
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
#include "cli_util.h"
#include "commands.h"
#include "data.h"
#include "safetensors.h"
#include "tokenizer.h"

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* ------------------------------------------------------------ stop flag */

static volatile sig_atomic_t g_stop_signal = 0;

/* total_steps of a schedule still to be sized from the time limit. */
#define MG_STEPS_UNSIZED (INT64_MAX / 4)

void mg_train_request_stop(int signo) { g_stop_signal = signo ? signo : SIGINT; }

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

static uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Dropout seed of step s: a function of (seed, s) only, so resume needs no
 * RNG state beyond the step. */
static uint64_t step_seed(uint64_t seed, int64_t s) {
    return mix64(seed * 0x9E3779B97F4A7C15ull + 0x632BE59BD9B4E019ull * (uint64_t)(s + 1));
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

/* ------------------------------------------------------------ checkpoints */

typedef struct {
    int64_t step;
    uint64_t seed;
    int batch_size;
    double val_frac;
    int max_tokens;
    char csv_column[128];
    char data[1024];
    uint64_t data_rows, data_hash;
    int val_every, val_max, ckpt_every;
    double val_loss;
} train_state;

static int train_state_to_json(const train_state *s, char *out, size_t n) {
    char col[300], data[2200];
    mg_json_quote(s->csv_column, col, sizeof col);
    mg_json_quote(s->data, data, sizeof data);
    char vl[32];
    if (isfinite(s->val_loss)) snprintf(vl, sizeof vl, "%.9g", s->val_loss);
    else snprintf(vl, sizeof vl, "null");
    return snprintf(out, n,
                    "{\"step\":%" PRId64 ",\"seed\":\"%" PRIu64 "\",\"batch_size\":%d,\"val_frac\":%.17g,"
                    "\"max_tokens\":%d,\"csv_column\":%s,\"data\":%s,\"data_rows\":%" PRIu64
                    ",\"data_hash\":\"%016" PRIx64 "\",\"val_every\":%d,\"val_max\":%d,"
                    "\"ckpt_every\":%d,\"val_loss\":%s}",
                    s->step, s->seed, s->batch_size, s->val_frac, s->max_tokens, col, data,
                    s->data_rows, s->data_hash, s->val_every, s->val_max, s->ckpt_every, vl);
}

static int json_int(const mg_json *j, const char *key, int64_t lo, int64_t hi, int64_t *out,
                    char *err, size_t errlen) {
    const mg_json *v = mg_json_get(j, key);
    if (!v || v->type != MG_JSON_NUMBER || !v->is_int || v->integer < lo || v->integer > hi)
        return mg_fail(err, errlen, -1, "checkpoint \"train\" metadata: \"%s\" missing or out of range", key);
    *out = v->integer;
    return 0;
}

static int json_str(const mg_json *j, const char *key, char *out, size_t n, char *err, size_t errlen) {
    const mg_json *v = mg_json_get(j, key);
    if (!v || v->type != MG_JSON_STRING || v->len >= n)
        return mg_fail(err, errlen, -1, "checkpoint \"train\" metadata: \"%s\" missing or not a string", key);
    memcpy(out, v->str, v->len + 1);
    return 0;
}

static int train_state_from_json(const char *js, train_state *s, char *err, size_t errlen) {
    mg_json *j = NULL;
    char e[200];
    if (mg_json_parse(js, strlen(js), &j, e, sizeof e))
        return mg_fail(err, errlen, -1, "checkpoint \"train\" metadata: %s", e);
    int rc = -1;
    int64_t x;
    char buf[64];
    memset(s, 0, sizeof *s);
    if (j->type != MG_JSON_OBJECT) {
        mg_fail(err, errlen, -1, "checkpoint \"train\" metadata is not an object");
        goto done;
    }
    if (json_int(j, "step", 0, INT64_MAX, &s->step, err, errlen)) goto done;
    if (json_str(j, "seed", buf, sizeof buf, err, errlen)) goto done;
    s->seed = strtoull(buf, NULL, 10);
    if (json_int(j, "batch_size", 1, 1 << 20, &x, err, errlen)) goto done;
    s->batch_size = (int)x;
    const mg_json *vf = mg_json_get(j, "val_frac");
    if (!vf || vf->type != MG_JSON_NUMBER || !(vf->number >= 0 && vf->number < 1)) {
        mg_fail(err, errlen, -1, "checkpoint \"train\" metadata: bad \"val_frac\"");
        goto done;
    }
    s->val_frac = vf->number;
    if (json_int(j, "max_tokens", 0, INT32_MAX, &x, err, errlen)) goto done;
    s->max_tokens = (int)x;
    if (json_str(j, "csv_column", s->csv_column, sizeof s->csv_column, err, errlen)) goto done;
    if (json_str(j, "data", s->data, sizeof s->data, err, errlen)) goto done;
    if (json_int(j, "data_rows", 0, INT64_MAX, &x, err, errlen)) goto done;
    s->data_rows = (uint64_t)x;
    if (json_str(j, "data_hash", buf, sizeof buf, err, errlen)) goto done;
    s->data_hash = strtoull(buf, NULL, 16);
    if (json_int(j, "val_every", -1, INT32_MAX, &x, err, errlen)) goto done;
    s->val_every = (int)x;
    if (json_int(j, "val_max", 0, INT32_MAX, &x, err, errlen)) goto done;
    s->val_max = (int)x;
    if (json_int(j, "ckpt_every", 0, INT32_MAX, &x, err, errlen)) goto done;
    s->ckpt_every = (int)x;
    const mg_json *vl = mg_json_get(j, "val_loss");
    s->val_loss = (vl && vl->type == MG_JSON_NUMBER) ? vl->number : NAN;
    /* Written by molgen versions that bucketed batches by length: this one
     * draws other batches, so it cannot continue such a run as promised. */
    const mg_json *bk = mg_json_get(j, "bucket");
    if (bk && !(bk->type == MG_JSON_NUMBER && bk->number == 0)) {
        mg_fail(err, errlen, -1, "checkpoint was trained with length-bucketed batches, which this "
                                 "molgen no longer makes: it cannot be resumed bit for bit");
        goto done;
    }
    rc = 0;
done:
    mg_json_free(j);
    return rc;
}

static int save_checkpoint(const char *path, const mg_model *m, const mg_vocab *vocab,
                           const mg_adamw *opt, const train_state *ts, char *err, size_t errlen) {
    const size_t nt = mg_model_num_tensors(m);
    mg_st_tensor *t = calloc(nt + 2, sizeof *t);
    char *vj = mg_vocab_to_json(vocab);
    char cfg[512], ocfg[512], tjs[4096], step[32];
    if (!t || !vj) {
        free(t);
        free(vj);
        return mg_fail(err, errlen, -1, "out of memory writing the checkpoint");
    }
    mg_model_st_tensors(m, t, nt);
    const int64_t P = (int64_t)mg_model_num_params(m);
    t[nt].name = "optim.m";
    t[nt + 1].name = "optim.v";
    t[nt].data = opt->m;
    t[nt + 1].data = opt->v;
    for (size_t i = nt; i < nt + 2; i++) {
        t[i].dtype = MG_ST_F32;
        t[i].ndim = 1;
        t[i].shape[0] = P;
    }
    mg_model_config_to_json(mg_model_get_config(m), cfg, sizeof cfg);
    mg_adamw_config_to_json(&opt->cfg, ocfg, sizeof ocfg);
    train_state_to_json(ts, tjs, sizeof tjs);
    snprintf(step, sizeof step, "%" PRId64, ts->step);
    const mg_st_kv meta[] = {{"format", "molgen"}, {"config", cfg}, {"vocab", vj},
                             {"optim", ocfg},      {"train", tjs},  {"step", step}};
    char e[300];
    int rc = mg_st_write(path, t, nt + 2, meta, sizeof meta / sizeof meta[0], e, sizeof e);
    free(t);
    free(vj);
    if (rc) return mg_fail(err, errlen, -1, "writing checkpoint %s: %s", path, e);
    return 0;
}

/* Everything a checkpoint holds. */
typedef struct {
    mg_model *model;
    mg_vocab *vocab;
    mg_adamw opt;
    train_state ts;
} checkpoint;

static void checkpoint_free(checkpoint *c) {
    mg_model_free(c->model);
    mg_vocab_free(c->vocab);
    mg_adamw_free(&c->opt);
    memset(c, 0, sizeof *c);
}

static int load_checkpoint(const char *path, checkpoint *ck, char *err, size_t errlen) {
    memset(ck, 0, sizeof *ck);
    mg_st_file *f = NULL;
    char e[300];
    if (mg_st_load(path, &f, e, sizeof e)) return mg_fail(err, errlen, -1, "checkpoint: %s", e); /* e names the path */
    int rc = -1;
    const char *fmt = mg_st_meta(f, "format");
    const char *oj = mg_st_meta(f, "optim"), *tj = mg_st_meta(f, "train"), *vj = mg_st_meta(f, "vocab");
    if (!fmt || strcmp(fmt, "molgen")) {
        mg_fail(err, errlen, -1, "checkpoint %s: not a molgen file (metadata \"format\" missing)", path);
        goto done;
    }
    if (!oj || !tj || !vj) {
        mg_fail(err, errlen, -1, "checkpoint %s: a model file without training state (no \"%s\" metadata): "
             "cannot resume from it", path, !oj ? "optim" : !tj ? "train" : "vocab");
        goto done;
    }
    if (mg_model_from_st(f, &ck->model, e, sizeof e)) {
        mg_fail(err, errlen, -1, "checkpoint %s: %s", path, e);
        goto done;
    }
    if (mg_vocab_from_json(vj, strlen(vj), &ck->vocab, e, sizeof e)) {
        mg_fail(err, errlen, -1, "checkpoint %s: vocab: %s", path, e);
        goto done;
    }
    if (mg_vocab_size(ck->vocab) != mg_model_get_config(ck->model)->vocab_size) {
        mg_fail(err, errlen, -1, "checkpoint %s: vocab has %d tokens, the model %d", path,
             mg_vocab_size(ck->vocab), mg_model_get_config(ck->model)->vocab_size);
        goto done;
    }
    mg_adamw_config oc;
    if (mg_adamw_config_from_json(oj, &oc, e, sizeof e)) {
        mg_fail(err, errlen, -1, "checkpoint %s: %s", path, e);
        goto done;
    }
    if (train_state_from_json(tj, &ck->ts, e, sizeof e)) {
        mg_fail(err, errlen, -1, "checkpoint %s: %s", path, e);
        goto done;
    }
    const size_t P = mg_model_num_params(ck->model), nt = mg_model_num_tensors(ck->model);
    mg_optim_span *spans = malloc(nt * sizeof *spans);
    if (!spans) {
        mg_fail(err, errlen, -1, "out of memory");
        goto done;
    }
    for (size_t i = 0; i < nt; i++) {
        const mg_param_info *pi = mg_model_tensor(ck->model, i);
        spans[i].offset = pi->offset;
        spans[i].numel = pi->numel;
        spans[i].decay = pi->decay;
    }
    int orc = mg_adamw_init(&ck->opt, &oc, P, spans, nt, e, sizeof e);
    free(spans);
    if (orc) {
        mg_fail(err, errlen, -1, "checkpoint %s: %s", path, e);
        goto done;
    }
    const int64_t shape[1] = {(int64_t)P};
    if (mg_st_copy(f, "optim.m", MG_ST_F32, 1, shape, ck->opt.m, P * sizeof(float), e, sizeof e) ||
        mg_st_copy(f, "optim.v", MG_ST_F32, 1, shape, ck->opt.v, P * sizeof(float), e, sizeof e)) {
        mg_fail(err, errlen, -1, "checkpoint %s: %s", path, e);
        goto done;
    }
    ck->opt.step = ck->ts.step;
    rc = 0;
done:
    mg_st_free(f);
    if (rc) checkpoint_free(ck);
    return rc;
}

int mg_checkpoint_load(const char *path, mg_model **model, mg_adamw *opt, int64_t *step, char *err,
                       size_t errlen) {
    if (!path || !model) return mg_fail(err, errlen, -1, "path or model pointer is NULL");
    checkpoint ck;
    if (load_checkpoint(path, &ck, err, errlen)) return -1;
    *model = ck.model;
    ck.model = NULL;
    if (opt) {
        *opt = ck.opt;
        memset(&ck.opt, 0, sizeof ck.opt);
    }
    if (step) *step = ck.ts.step;
    checkpoint_free(&ck);
    return 0;
}

/* ------------------------------------------------------------ validation */

/* Mean loss over the first nv rows of val, in batches of B (eval mode). */
static int validate(mg_model *m, const mg_dataset *val, size_t nv, int B, int32_t *buf, double *loss,
                    char *err, size_t errlen) {
    double sum = 0.0;
    int64_t count = 0;
    for (size_t r0 = 0; r0 < nv; r0 += (size_t)B) {
        int nb = (int)((nv - r0) < (size_t)B ? (nv - r0) : (size_t)B);
        const int32_t *ids = val->ids + r0 * (size_t)val->T;
        const int64_t *len = val->lengths + r0;
        int Tb = mg_trim_batch(ids, len, nb, val->T, buf);
        float l;
        int64_t nt;
        char e[300];
        if (mg_model_forward(m, buf, len, nb, Tb, 0, 0, &l, &nt, e, sizeof e))
            return mg_fail(err, errlen, -1, "validation: %s", e);
        sum += (double)l * (double)nt;
        count += nt;
    }
    *loss = count ? sum / (double)count : NAN;
    return 0;
}

/* ------------------------------------------------------------ the run */

int mg_train_run(const mg_train_config *c, mg_train_result *result, char *err, size_t errlen) {
    const double t0 = now_s();
    mg_train_result res;
    memset(&res, 0, sizeof res);
    res.val_loss = res.first_val_loss = NAN;
    if (!c) return mg_fail(err, errlen, -1, "train config is NULL");
    g_stop_signal = 0;

    logger lg = {c->log ? c->log : stderr, c->quiet, c->progress, 0, 0, 0.0};
    lg.tty = isatty(fileno(lg.f));

    checkpoint ck;
    memset(&ck, 0, sizeof ck);
    mg_dataset all, train, val;
    memset(&all, 0, sizeof all);
    memset(&train, 0, sizeof train);
    memset(&val, 0, sizeof val);
    mg_batcher *batcher = NULL;
    int32_t *bids = NULL, *bbuf = NULL;
    int64_t *blen = NULL;
    int rc = -1;
    char e[512];
    const int resuming = c->resume_path != NULL;

    /* ---- configuration: fresh, or the checkpoint's */
    train_state ts;
    memset(&ts, 0, sizeof ts);
    if (resuming) {
        if (load_checkpoint(c->resume_path, &ck, err, errlen)) return -1;
        ts = ck.ts;
        if (c->data_path && strlen(c->data_path) < sizeof ts.data) snprintf(ts.data, sizeof ts.data, "%s", c->data_path);
        if (c->steps > 0 && c->steps < ts.step) {
            mg_fail(err, errlen, -1, "%s is at step %" PRId64 " of a %" PRId64 "-step schedule: --steps %" PRId64
                    " is behind it (give more steps than the checkpoint has done, or none to finish its schedule)",
                    c->resume_path, ts.step, ck.opt.cfg.total_steps, c->steps);
            checkpoint_free(&ck);
            return -1;
        }
        log_msg(&lg, "resuming from %s at step %" PRId64, c->resume_path, ts.step);
    } else {
        if (!c->data_path) return mg_fail(err, errlen, -1, "no data file given");
        if (strlen(c->data_path) >= sizeof ts.data) return mg_fail(err, errlen, -1, "data path too long");
        if (c->batch_size < 1) return mg_fail(err, errlen, -1, "batch size %d must be >= 1", c->batch_size);
        if (!(c->val_frac >= 0 && c->val_frac < 1))
            return mg_fail(err, errlen, -1, "validation fraction %g must be in [0, 1)", c->val_frac);
        if (c->val_every < -1 || c->val_max < 0 || c->ckpt_every < 0 || c->max_tokens < 0)
            return mg_fail(err, errlen, -1, "val_every (-1: auto), val_max, ckpt_every and max_tokens must be >= 0");
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
        return checkpoint_free(&ck), mg_fail(err, errlen, -1, "steps and stop_after must be >= 0, the "
                                             "time limit in [0, %g] seconds", MG_TIME_LIMIT_MAX);
    if (!resuming && c->steps == 0 && c->time_limit <= 0)
        return mg_fail(err, errlen, -1, "give a number of steps or a time limit");
    if (!c->out_path) return checkpoint_free(&ck), mg_fail(err, errlen, -1, "no output path given");

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
                            &rep, e, sizeof e)) {
            mg_fail(err, errlen, -1, "%s", e);
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
                mg_fail(err, errlen, -1, "data %s differs from the checkpoint's (%zu molecules vs %" PRIu64
                     "%s): resume needs the same data", ts.data, all.n, ts.data_rows,
                     (uint64_t)all.n == ts.data_rows ? ", same count but different content" : "");
                goto done;
            }
        } else {
            ts.data_rows = all.n;
            ts.data_hash = dataset_hash(&all);
        }
        if (mg_dataset_split(&all, ts.val_frac, ts.seed, &train, &val, e, sizeof e)) {
            mg_fail(err, errlen, -1, "%s", e);
            goto done;
        }
        if (train.n < (size_t)ts.batch_size) {
            mg_fail(err, errlen, -1, "training split has %zu molecules, fewer than the batch size %d",
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
        if (mg_model_create(&mc, &ck.model, e, sizeof e)) {
            mg_fail(err, errlen, -1, "model: %s", e);
            goto done;
        }
        mg_model_init(ck.model, ts.seed);
        const size_t nt = mg_model_num_tensors(ck.model);
        mg_optim_span *spans = malloc(nt * sizeof *spans);
        if (!spans) {
            mg_fail(err, errlen, -1, "out of memory");
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
        int orc = mg_adamw_init(&ck.opt, &oc, mg_model_num_params(ck.model), spans, nt, e, sizeof e);
        free(spans);
        if (orc) {
            mg_fail(err, errlen, -1, "optimizer: %s", e);
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
        mg_fail(err, errlen, -1,
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
        if (mg_model_causal_guard(model, ts.seed, e, sizeof e)) {
            mg_fail(err, errlen, -1, "causal-leak guard failed: %s", e);
            goto done;
        }
    }

    /* ---- batches */
    const int B = ts.batch_size, T = all.T;
    if (mg_batcher_new(&train, B, ts.seed, 1, &batcher, e, sizeof e)) {
        mg_fail(err, errlen, -1, "%s", e);
        goto done;
    }
    mg_batcher_seek(batcher, (uint64_t)ts.step);
    bids = malloc((size_t)B * T * sizeof(int32_t));
    bbuf = malloc((size_t)B * T * sizeof(int32_t));
    blen = malloc((size_t)B * sizeof(int64_t));
    if (!bids || !bbuf || !blen) {
        mg_fail(err, errlen, -1, "out of memory for batches");
        goto done;
    }
    const size_t nv = (ts.val_max > 0 && (size_t)ts.val_max < val.n) ? (size_t)ts.val_max : val.n;

    /* ---- initial validation (also times one validation pass) */
    double t_val = 0.0;
    if (nv > 0) {
        double tv = now_s();
        if (validate(model, &val, nv, B, bbuf, &res.first_val_loss, err, errlen)) goto done;
        t_val = now_s() - tv;
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
            if (now_s() - t0 + avg + t_val > c->time_limit) {
                stop = MG_STOP_TIME;
                break;
            }
        }
        /* one step */
        const double ts0 = now_s();
        mg_batcher_next(batcher, bids, blen, NULL);
        const int Tb = mg_trim_batch(bids, blen, B, T, bbuf);
        float loss, gnorm, lr;
        int64_t ntok;
        if (mg_model_forward(model, bbuf, blen, B, Tb, 1, step_seed(ts.seed, ts.step), &loss, &ntok, e,
                             sizeof e) ||
            mg_model_backward(model, e, sizeof e) ||
            mg_adamw_step(opt, mg_model_params(model), mg_model_grads(model), &gnorm, &lr, e, sizeof e)) {
            mg_fail(err, errlen, -1, "step %" PRId64 ": %s", ts.step, e);
            goto done;
        }
        ts.step++;
        const double dt = now_s() - ts0;
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
            const double budget = 0.97 * (c->time_limit - (now_s() - t0) - t_val) - (double)vals_left * t_val;
            int64_t more = budget > 0 ? (int64_t)(budget / avg) : 0;
            opt->cfg.total_steps = ts.step + (more > 1 ? more : 1);
        }
        /* schedule length from the time limit, once CAL steps are timed */
        if (!total_known && timed_steps >= CAL) {
            const double avg = step_time / (double)timed_steps;
            const double remaining = c->time_limit - (now_s() - t0) - t_val;
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
            double tv = now_s();
            if (validate(model, &val, nv, B, bbuf, &res.val_loss, err, errlen)) goto done;
            t_val = now_s() - tv;
            last_val_at = (double)ts.step;
            char el[32];
            fmt_duration(now_s() - t0, el, sizeof el);
            log_msg(&lg, "step %" PRId64 "/%" PRId64 ": train loss %.4f, val loss %.4f, lr %.2e, %.0f tok/s, %s",
                    ts.step, total_known ? opt->cfg.total_steps : (int64_t)0, loss_ema, res.val_loss,
                    (double)lr, step_time > 0 ? timed_tokens / step_time : 0.0, el);
        }
        if (ts.ckpt_every > 0 && ts.step % ts.ckpt_every == 0 && !final_step) {
            ts.val_loss = res.val_loss;
            if (save_checkpoint(c->out_path, model, ck.vocab, opt, &ts, err, errlen)) goto done;
        }
        /* progress line */
        if (lg.progress && !lg.quiet) {
            const double t = now_s();
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
        if (validate(model, &val, nv, B, bbuf, &res.val_loss, err, errlen)) goto done;
    }
    ts.val_loss = res.val_loss;
    if (save_checkpoint(c->out_path, model, ck.vocab, opt, &ts, err, errlen)) goto done;
    res.step = ts.step;
    res.total_steps = opt->cfg.total_steps;
    res.stop = stop;
    res.seconds = now_s() - t0;
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
    checkpoint_free(&ck);
    return rc;
}

/* ------------------------------------------------------------ molgen train */

static const char TRAIN_USAGE[] =
    "usage: molgen train [options]\n"
    "Train the SMILES transformer; writes a checkpoint (safetensors) that `molgen\n"
    "sample` reads and `--resume` continues bit for bit (same thread count).\n"
    "Data and output:\n"
    "  --data FILE          .smi (first field per line) or .csv (see --csv-column);\n"
    "                       default $MOLGEN_SHARED_DATA/moses_176k.smi when that\n"
    "                       is set, else data/moses_20k.smi (the shipped sample)\n"
    "  --csv-column NAME    CSV column with the SMILES (default smiles)\n"
    "  --out FILE           checkpoint written periodically and at the end\n"
    "                       (default out/model.safetensors, or the --resume file;\n"
    "                       written atomically)\n"
    "  --resume FILE        continue a checkpoint (its model, optimizer, data split,\n"
    "                       seed and batch size; --data overrides its data path)\n"
    "  --max-tokens N       skip molecules longer than N tokens (default 256; 0 = no\n"
    "                       limit); skipped lines are reported as file:line\n"
    "  --val-frac X         validation fraction, split by seed (default 0.05)\n"
    "Length (whichever comes first; one of them is required for a fresh run):\n"
    "  --steps N            optimizer steps of the schedule (total, from step 0)\n"
    "  --time-limit SEC     wall-clock limit for this run (at most a year); without\n"
    "                       --steps the schedule length is estimated from 10 timed\n"
    "                       steps\n"
    "Model (ignored with --resume):\n"
    "  --preset NAME        default (4 layers, d_model 128, 4 heads, dropout 0) or\n"
    "                       molgpt (8 layers, d_model 256, 8 heads, dropout 0.1)\n"
    "  --layers N  --d-model N  --heads N  --dropout X (in [0, 1))\n"
    "  --ctx-len N          positions (default: longest molecule + 1)\n"
    "Optimizer (AdamW, warm-up + cosine; ignored with --resume):\n"
    "  --batch-size N (32)  --lr X (2e-3)  --min-lr-frac X (0.1)  --warmup N (100)\n"
    "  --weight-decay X (0.1)  --grad-clip X (1.0; >= 0, 0 = off)  --beta1 X (0.9)\n"
    "  --beta2 X (0.95)\n"
    "Run:\n"
    "  --seed N             init, split, shuffle and dropout seed, decimal in\n"
    "                       [0, 2^64) (default 1)\n"
    "  --threads N          threads (default: ATTN_NUM_THREADS or all cores)\n"
    "  --val-every N        validation every N steps (0 = at the end only; default\n"
    "                       auto: about 10 per run, at most 5% of a time-limited run)\n"
    "  --val-max N          validation molecules used (default 2000; 0 = all)\n"
    "  --ckpt-every N       periodic checkpoint every N steps (default 1000; 0 = off)\n"
    "  --no-progress        no progress line (validation lines only)\n"
    "  --quiet              print nothing on stderr except errors\n"
    "Testing:\n"
    "  --stop-after N       stop (and checkpoint) once N steps are done\n"
    "  --debug-no-causal-mask  build attention WITHOUT the causal mask: the\n"
    "                       causal-leak guard must refuse to train it\n"
    "  --no-guard           skip the causal-leak guard\n"
    "Progress goes to stderr; a one-line JSON summary to stdout. SIGINT/SIGTERM\n"
    "write a checkpoint and exit with 128 + the signal number; errors exit 1.\n";

static int train_usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int train_usage_error(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("molgen train: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputs(" (see molgen train --help)\n", stderr);
    va_end(ap);
    return 2;
}

int cmd_train(int argc, char **argv) {
    mg_train_config c;
    mg_train_config_default(&c);
    c.out_path = NULL;
    /* model flags are applied after the preset, whatever their order */
    long long layers = -1, dmodel = -1, heads = -1, ctx = -1;
    double dropout = 0;
    int dropout_set = 0;
    const char *preset = "default";
    int threads = 0, no_mask = 0;
    char err[1024];
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            fputs(TRAIN_USAGE, stdout);
            return 0;
        }
        if (!strcmp(a, "--no-progress")) { c.progress = 0; continue; }
        if (!strcmp(a, "--quiet")) { c.quiet = 1; continue; }
        if (!strcmp(a, "--debug-no-causal-mask")) { no_mask = 1; continue; }
        if (!strcmp(a, "--no-guard")) { c.skip_guard = 1; continue; }
        if (strncmp(a, "--", 2)) return train_usage_error("unexpected argument '%s'", a);
        static const char *const value_opts[] = {
            "--data", "--csv-column", "--out", "--resume", "--preset", "--seed", "--time-limit",
            "--steps", "--stop-after", "--max-tokens", "--batch-size", "--warmup", "--val-every",
            "--val-max", "--ckpt-every", "--threads", "--layers", "--d-model", "--heads",
            "--ctx-len", "--dropout", "--val-frac", "--lr", "--min-lr-frac", "--weight-decay",
            "--grad-clip", "--beta1", "--beta2"};
        int known = 0;
        const size_t alen = strcspn(a, "=");
        for (size_t k = 0; k < sizeof value_opts / sizeof value_opts[0]; k++)
            known |= strlen(value_opts[k]) == alen && !strncmp(a, value_opts[k], alen);
        if (!known) return train_usage_error("unknown option %.*s", (int)alen, a);
        const char *v = NULL;
        if (!mg_cli_value(argc, argv, &i, &v, err, sizeof err)) return train_usage_error("%s", err);
        long long ll = 0;
        double dv = 0;
        uint64_t u = 0;
        int ok = 1;
#define INT_OPT(name, lo, hi, dst) \
    else if (!strcmp(a, name)) { ok = mg_cli_int(v, lo, hi, &ll); dst = ll; }
#define DBL_OPT(name, dst) \
    else if (!strcmp(a, name)) { ok = mg_cli_double(v, &dv); dst = dv; }
        if (!strcmp(a, "--data")) c.data_path = v;
        else if (!strcmp(a, "--csv-column")) c.csv_column = v;
        else if (!strcmp(a, "--out")) c.out_path = v;
        else if (!strcmp(a, "--resume")) c.resume_path = v;
        else if (!strcmp(a, "--preset")) preset = v;
        else if (!strcmp(a, "--seed")) { ok = mg_cli_u64(v, &u); c.seed = u; }
        else if (!strcmp(a, "--time-limit")) {
            ok = mg_cli_double(v, &dv) && dv > 0 && dv <= MG_TIME_LIMIT_MAX;
            c.time_limit = dv;
        }
        INT_OPT("--steps", 1, INT64_MAX / 8, c.steps)
        INT_OPT("--stop-after", 1, INT64_MAX / 8, c.stop_after)
        INT_OPT("--max-tokens", 0, 1000000, c.max_tokens)
        INT_OPT("--batch-size", 1, 1 << 20, c.batch_size)
        INT_OPT("--warmup", 0, INT64_MAX / 8, c.optim.warmup_steps)
        INT_OPT("--val-every", 0, INT32_MAX, c.val_every)
        INT_OPT("--val-max", 0, INT32_MAX, c.val_max)
        INT_OPT("--ckpt-every", 0, INT32_MAX, c.ckpt_every)
        INT_OPT("--threads", 1, 4096, threads)
        INT_OPT("--layers", 1, 1024, layers)
        INT_OPT("--d-model", 1, 65536, dmodel)
        INT_OPT("--heads", 1, 65536, heads)
        INT_OPT("--ctx-len", 1, 65536, ctx)
        else if (!strcmp(a, "--dropout")) { ok = mg_cli_double(v, &dropout); dropout_set = 1; }
        DBL_OPT("--val-frac", c.val_frac)
        DBL_OPT("--lr", c.optim.lr)
        DBL_OPT("--min-lr-frac", c.optim.min_lr_frac)
        DBL_OPT("--weight-decay", c.optim.weight_decay)
        DBL_OPT("--grad-clip", c.optim.grad_clip)
        DBL_OPT("--beta1", c.optim.beta1)
        DBL_OPT("--beta2", c.optim.beta2)
        else return train_usage_error("unknown option %s", a);
#undef INT_OPT
#undef DBL_OPT
        if (!ok) {
            char cut[96];
            if (!strcmp(a, "--time-limit"))
                return train_usage_error("bad value '%s' for --time-limit (seconds, > 0 and <= %g)",
                                         mg_cli_cut(v, cut, sizeof cut), MG_TIME_LIMIT_MAX);
            return train_usage_error("bad value '%s' for %s", mg_cli_cut(v, cut, sizeof cut), a);
        }
    }
    if (!strcmp(preset, "default")) mg_model_config_default(&c.model);
    else if (!strcmp(preset, "molgpt")) mg_model_config_molgpt(&c.model);
    else return train_usage_error("unknown preset '%s' (default or molgpt)", preset);
    if (layers > 0) c.model.n_layer = (int)layers;
    if (dmodel > 0) c.model.d_model = (int)dmodel;
    if (heads > 0) c.model.n_head = (int)heads;
    if (ctx > 0) c.model.ctx_len = (int)ctx;
    if (dropout_set) c.model.dropout = (float)dropout;
    c.model.no_causal_mask = no_mask;
    if (c.model.d_model % c.model.n_head)
        return train_usage_error("--heads %d does not divide --d-model %d", c.model.n_head, c.model.d_model);
    if (!(c.model.dropout >= 0 && c.model.dropout < 1))
        return train_usage_error("--dropout %g must be in [0, 1)", (double)c.model.dropout);
    if (!c.resume_path) {
        mg_adamw_config oc = c.optim;
        oc.total_steps = 1;
        if (mg_adamw_config_check(&oc, err, sizeof err)) return train_usage_error("%s", err);
        if (c.steps == 0 && c.time_limit <= 0)
            return train_usage_error("give --steps N or --time-limit SECONDS (or both)");
    }
    if (!c.out_path) c.out_path = c.resume_path ? c.resume_path : "out/model.safetensors";
    char data_default[4096];
    if (!c.data_path && !c.resume_path) {
        const char *dir = getenv("MOLGEN_SHARED_DATA");
        if (dir && *dir) {
            snprintf(data_default, sizeof data_default, "%s/moses_176k.smi", dir);
            c.data_path = data_default;
        } else {
            c.data_path = "data/moses_20k.smi";
        }
    }
    if (threads > 0 && attn_set_num_threads(threads, NULL))
        return train_usage_error("cannot use %d threads", threads);
    /* every output is checked before any work (a run is never lost at its
     * first checkpoint), and never overwrites the data */
    const char *inputs[] = {c.data_path};
    if (mg_cli_check_output(c.out_path, inputs, 1, err, sizeof err)) {
        fprintf(stderr, "molgen train: --out: %s\n", err);
        return 1;
    }
    int stale = mg_st_remove_stale_temps(c.out_path);
    if (stale > 0 && !c.quiet)
        fprintf(stderr, "removed %d stale temporary file(s) of %s left by killed runs\n", stale,
                c.out_path);
    mg_train_install_signal_handlers();
    mg_train_result r;
    if (mg_train_run(&c, &r, err, sizeof err)) {
        fprintf(stderr, "molgen train: %s\n", err);
        return 1;
    }
    char out_q[4200];
    mg_json_quote(c.out_path, out_q, sizeof out_q);
    static const char *const why[] = {"done", "time_limit", "signal", "stop_after"};
    printf("{\"out\":%s,\"step\":%" PRId64 ",\"total_steps\":%" PRId64 ",\"train_loss\":%.6g,"
           "\"val_loss\":%.6g,\"first_val_loss\":%.6g,\"unigram_entropy\":%.6g,"
           "\"tokens_per_sec\":%.1f,\"seconds\":%.1f,\"stop\":\"%s\",\"skipped_lines\":%ld}\n",
           out_q, r.step, r.total_steps, r.train_loss, isnan(r.val_loss) ? -1.0 : r.val_loss,
           isnan(r.first_val_loss) ? -1.0 : r.first_val_loss, r.unigram_entropy, r.tokens_per_sec,
           r.seconds, why[r.stop], r.skipped);
    fflush(stdout);
    if (r.stop == MG_STOP_SIGNAL) return 128 + (g_stop_signal ? (int)g_stop_signal : SIGINT);
    return 0;
}

/* ------------------------------------------------------------ molgen debug-grads */

static const char DEBUG_GRADS_USAGE[] =
    "usage: molgen debug-grads --out FILE [options]   (testing tool)\n"
    "Builds a model (GPT-2 init from --seed, then every parameter += U(-p/2, p/2)\n"
    "with p = --perturb), runs one forward/backward on a random batch and writes a\n"
    "safetensors file: the parameters under their names, their gradients as\n"
    "\"grad.<name>\", the batch as \"batch.ids\" I32 [B, T] and \"batch.lengths\"\n"
    "I64 [B], and metadata config, loss, ntok. molgen/tests/test_model_torch.py\n"
    "compares them with PyTorch autograd.\n"
    "  --model FILE    use this model / checkpoint as is (no init, no perturbation)\n"
    "  --layers N (2)  --d-model N (16)  --heads N (2)  --ctx-len N (8)  --vocab N (10)\n"
    "  --batch N (3)  --seed N (1)  --perturb X (0.6)  --threads N\n";

int cmd_debug_grads(int argc, char **argv) {
    mg_model_config mc;
    memset(&mc, 0, sizeof mc);
    mc.n_layer = 2;
    mc.d_model = 16;
    mc.n_head = 2;
    mc.ctx_len = 8;
    mc.vocab_size = 10;
    long long B = 3, threads = 0, ll;
    uint64_t seed = 1;
    double perturb = 0.6;
    const char *out = NULL, *model_path = NULL;
    char err[512];
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            fputs(DEBUG_GRADS_USAGE, stdout);
            return 0;
        }
        const char *v = NULL;
        if (!mg_cli_value(argc, argv, &i, &v, err, sizeof err)) {
            fprintf(stderr, "molgen debug-grads: %s\n", err);
            return 2;
        }
        int ok = 1;
        if (!strcmp(a, "--out")) out = v;
        else if (!strcmp(a, "--model")) model_path = v;
        else if (!strcmp(a, "--layers")) { ok = mg_cli_int(v, 1, 64, &ll); mc.n_layer = (int)ll; }
        else if (!strcmp(a, "--d-model")) { ok = mg_cli_int(v, 1, 4096, &ll); mc.d_model = (int)ll; }
        else if (!strcmp(a, "--heads")) { ok = mg_cli_int(v, 1, 4096, &ll); mc.n_head = (int)ll; }
        else if (!strcmp(a, "--ctx-len")) { ok = mg_cli_int(v, 1, 4096, &ll); mc.ctx_len = (int)ll; }
        else if (!strcmp(a, "--vocab")) { ok = mg_cli_int(v, 4, 100000, &ll); mc.vocab_size = (int)ll; }
        else if (!strcmp(a, "--batch")) ok = mg_cli_int(v, 1, 100000, &B);
        else if (!strcmp(a, "--threads")) ok = mg_cli_int(v, 1, 4096, &threads);
        else if (!strcmp(a, "--seed")) ok = mg_cli_u64(v, &seed);
        else if (!strcmp(a, "--perturb")) ok = mg_cli_double(v, &perturb) && perturb >= 0;
        else {
            fprintf(stderr, "molgen debug-grads: unknown option %s\n", a);
            return 2;
        }
        if (!ok) {
            fprintf(stderr, "molgen debug-grads: bad value '%s' for %s\n", v, a);
            return 2;
        }
    }
    if (!out) {
        fprintf(stderr, "molgen debug-grads: --out FILE is required\n");
        return 2;
    }
    if (threads > 0) attn_set_num_threads((int)threads, NULL);
    mg_model *m = NULL;
    uint64_t s = seed ^ 0x5DEECE66Dull;
    if (model_path) {
        if (mg_model_load(model_path, &m, NULL, NULL, err, sizeof err)) {
            fprintf(stderr, "molgen debug-grads: %s\n", err);
            return 1;
        }
        mc = *mg_model_get_config(m);
        if (mc.vocab_size <= MG_NUM_SPECIAL || mc.ctx_len < 2) {
            fprintf(stderr, "molgen debug-grads: model too small for a batch\n");
            mg_model_free(m);
            return 1;
        }
    } else {
        if (mg_model_create(&mc, &m, err, sizeof err)) {
            fprintf(stderr, "molgen debug-grads: %s\n", err);
            return 1;
        }
        mg_model_init(m, seed);
        float *p = mg_model_params(m);
        for (size_t i = 0; i < mg_model_num_params(m); i++) {
            double u = (double)(mg_splitmix64(&s) >> 11) * 0x1.0p-53;
            p[i] += (float)((u - 0.5) * perturb);
        }
    }
    const int T = mc.ctx_len + 1, V = mc.vocab_size;
    int32_t *ids = malloc((size_t)B * T * sizeof(int32_t));
    int64_t *len = malloc((size_t)B * sizeof(int64_t));
    const size_t nt = mg_model_num_tensors(m), P = mg_model_num_params(m);
    mg_st_tensor *t = calloc(2 * nt + 2, sizeof *t);
    char (*names)[80] = calloc(nt, sizeof *names);
    int rc = 1;
    if (!ids || !len || !t || !names) {
        fprintf(stderr, "molgen debug-grads: out of memory\n");
        goto out;
    }
    for (long long b = 0; b < B; b++) {
        len[b] = b == 0 ? T : 2 + (int64_t)(mg_splitmix64(&s) % (uint64_t)(T - 1));
        for (int k = 0; k < T; k++) {
            int32_t id = k == 0 ? MG_BOS
                         : k < len[b] - 1 ? (int32_t)(MG_NUM_SPECIAL + mg_splitmix64(&s) % (uint64_t)(V - MG_NUM_SPECIAL))
                         : k == len[b] - 1 ? MG_EOS : MG_PAD;
            ids[b * T + k] = id;
        }
    }
    float loss;
    int64_t ntok;
    if (mg_model_forward(m, ids, len, (int)B, T, 0, 0, &loss, &ntok, err, sizeof err) ||
        mg_model_backward(m, err, sizeof err)) {
        fprintf(stderr, "molgen debug-grads: %s\n", err);
        goto out;
    }
    mg_model_st_tensors(m, t, nt);
    for (size_t i = 0; i < nt; i++) {
        t[nt + i] = t[i];
        snprintf(names[i], sizeof names[i], "grad.%s", t[i].name);
        t[nt + i].name = names[i];
        t[nt + i].data = mg_model_grads(m) + mg_model_tensor(m, i)->offset;
    }
    t[2 * nt].name = "batch.ids";
    t[2 * nt].dtype = MG_ST_I32;
    t[2 * nt].ndim = 2;
    t[2 * nt].shape[0] = B;
    t[2 * nt].shape[1] = T;
    t[2 * nt].data = ids;
    t[2 * nt + 1].name = "batch.lengths";
    t[2 * nt + 1].dtype = MG_ST_I64;
    t[2 * nt + 1].ndim = 1;
    t[2 * nt + 1].shape[0] = B;
    t[2 * nt + 1].data = len;
    char cfg[512], ls[64], ns[32];
    mg_model_config_to_json(&mc, cfg, sizeof cfg);
    snprintf(ls, sizeof ls, "%.9g", (double)loss);
    snprintf(ns, sizeof ns, "%" PRId64, ntok);
    const mg_st_kv meta[] = {{"format", "molgen-debug-grads"}, {"config", cfg}, {"loss", ls}, {"ntok", ns}};
    if (mg_st_write(out, t, 2 * nt + 2, meta, 4, err, sizeof err)) {
        fprintf(stderr, "molgen debug-grads: %s\n", err);
        goto out;
    }
    printf("%s loss %.9g over %" PRId64 " tokens, %zu parameters\n", out, (double)loss, ntok, P);
    rc = 0;
out:
    free(ids);
    free(len);
    free(t);
    free(names);
    mg_model_free(m);
    return rc;
}
