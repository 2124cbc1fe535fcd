/* molgen train: the training engine (see train.h). A run is one `run`
 * struct: set up (fresh or from a checkpoint), data, model, then steps until
 * a stop, then the final validation and checkpoint. */
#define _POSIX_C_SOURCE 200809L
#include "train/train.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

#include "train/checkpoint.h"
#include "chem/condition.h"
#include "chem/data.h"
#include "nn/packed_gemm.h"
#include "base/json.h"
#include "gen/sample.h"
#include "chem/smiles_check.h"
#include "base/util.h"

/* ------------------------------------------------------------ stop flag */

static volatile sig_atomic_t g_stop_signal = 0;

/* total_steps of a schedule still to be sized from the time limit. */
#define MG_STEPS_UNSIZED (INT64_MAX / 4)
/* Steps timed before a schedule is sized from the time limit. */
#define CAL 10

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

/* ------------------------------------------------------------ helpers */

/* Dropout seed of step s: a function of (seed, s) only, so resume needs no
 * RNG state beyond the step. */
static uint64_t step_seed(uint64_t seed, int64_t s) {
    return mg_mix64(seed * 0x9E3779B97F4A7C15ull + 0x632BE59BD9B4E019ull * (uint64_t)(s + 1));
}

/* FNV-1a over the dataset's ids and lengths: detects a changed data file on
 * resume. */
static uint64_t dataset_hash(const mg_dataset *d) {
    const uint64_t h = mg_fnv1a(MG_FNV1A_INIT, d->ids, d->n * (size_t)d->T * sizeof(int32_t));
    return mg_fnv1a(h, d->lengths, d->n * sizeof(int64_t));
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

/* Validation interval when not given: about 10 validations per run; a
 * fine-tuning run (few molecules, few steps) once per epoch of its n_train
 * molecules in batches of B, at most total / 10 steps apart. */
static int auto_val_every(int64_t total, int finetune, size_t n_train, int B) {
    int64_t k = total / 10;
    if (finetune) {
        const int64_t epoch = (int64_t)((n_train + (size_t)B - 1) / (size_t)B);
        k = epoch < k ? epoch : k;
        return (int)(k < 1 ? 1 : k > INT32_MAX ? INT32_MAX : k);
    }
    return (int)(k < 10 ? 10 : k > INT32_MAX ? INT32_MAX : k);
}

/* ------------------------------------------------------------ a run */

typedef struct {
    const mg_train_config *c; /* as given: the RUN settings */
    mg_train_config s;        /* in force: c, with the checkpoint's saved ones on resume */
    int resuming;
    mg_model *init; /* --init: MODEL (its vocabulary is ck.vocab) */
    int added;      /* --extend-vocab: the tokens appended to MODEL's vocabulary */
    mg_vocab *init_vocab; /* --extend-vocab: MODEL's own (r->ck.vocab is the grown one) */
    mg_ckpt ck;     /* model, vocab, optimizer (and what a resume read) */
    mg_train_state st;
    mg_dataset all, train, val;
    /* --augment randomized: the copies of data line l are aug_copy[aug_first[l] ..
     * aug_first[l + 1]) (those the vocabulary and context take) */
    mg_smiles_list aug;
    const char **aug_copy;
    size_t *aug_first;
    long aug_lines;
    FILE *dump; /* --debug-dump-rows (rank 0) */
    size_t nv;  /* validation molecules used */
    mg_batcher *batcher;
    int32_t *bids, *bbuf; /* [B, T] a batch, and the same trimmed */
    int64_t *blen;        /* [B] */
    /* conditioning (condition.h; K = cond.K, 0 without): the normalised
     * values of the training and validation rows [n, K], a batch's [B, K] */
    mg_cond_info cond;
    float *cv_train, *cv_val, *bcond;
    /* --scaffold-column (condition.h): the scaffold tokens of every row of
     * all (sc_toks[sc_first[i] .. sc_first[i + 1])), of training row i at
     * sc_toks + sc_off[i] (sc_len[i] tokens, 0 = none); the widest row Tw
     * (= ctx_len + 1), a batch with its prefixes sbids [B, Tw], slen [B],
     * spre [B] */
    size_t *sc_first, *sc_off;
    int32_t *sc_toks, *sbids;
    int *sc_len, sc_longest, Tw;
    int64_t *slen, *spre;
    mg_train_result res;
    double t0, t_val; /* run start; the last validation's duration */
    double step_time, timed_tokens, loss_ema;
    int64_t timed_steps, start_step;
    int total_known, time_sized;
    mg_dist *d, alone; /* the ranks (alone: c->dist was NULL) */
    size_t b0, b1;     /* this rank's rows of every global batch */
    double comm_time;  /* seconds in the ranks' collectives during timed steps */
    FILE *loss_log;    /* --loss-log (rank 0) */
    size_t *brows;     /* [B] the batch's dataset rows (for the loss log and the conditions) */
    /* keep best: the lowest scheduled validation so far (best_val, NAN:
     * none), its step, the scheduled validations since, and that step's
     * whole state [P] each (best_ema: with --ema), not yet written when
     * best_dirty; scratch [P] holds the live parameters while it is */
    int keep_best, patience, check_samples; /* resolved from the settings (-1 / NULL: auto) */
    int since_best, best_dirty;
    int64_t vals_seen; /* validations of this run (the curve's stride counts them) */
    double best_val;
    int64_t best_step;
    float *best_p, *best_m, *best_v, *best_ema, *scratch;
    int64_t best_opt_step;
    mg_adamw_config best_cfg;
    mg_train_state best_st;
} run;

static void say(const run *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void say(const run *r, const char *fmt, ...) {
    if (!r->c->log.message || r->d->rank) return;
    char line[4608];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    r->c->log.message(r->c->log.user, line);
}

static void run_free(run *r) {
    free(r->best_p);
    free(r->best_m);
    free(r->best_v);
    free(r->best_ema);
    free(r->scratch);
    if (r->loss_log) fclose(r->loss_log);
    if (r->dump) fclose(r->dump);
    mg_smiles_list_free(&r->aug);
    free(r->aug_copy);
    free(r->aug_first);
    free(r->bids);
    free(r->bbuf);
    free(r->blen);
    free(r->brows);
    free(r->cv_train);
    free(r->cv_val);
    free(r->bcond);
    free(r->sc_first);
    free(r->sc_off);
    free(r->sc_toks);
    free(r->sc_len);
    free(r->sbids);
    free(r->slen);
    free(r->spre);
    mg_cond_info_free(&r->cond);
    mg_batcher_free(r->batcher);
    mg_dataset_free(&r->train);
    mg_dataset_free(&r->val);
    mg_dataset_free(&r->all);
    mg_model_free(r->init);
    mg_vocab_free(r->init_vocab);
    mg_ckpt_free(&r->ck);
}

/* Strings a checkpoint stores as JSON must be UTF-8: refused now rather
 * than at the first checkpoint. */
static mg_status check_utf8(const char *what, const char *s, mg_error *err) {
    json_t *j = s ? json_string(s) : NULL;
    json_decref(j);
    if (s && !j)
        return mg_fail(err, MG_ERR_ARG, "%s is not valid UTF-8 (checkpoints store it as JSON)",
                       what);
    return MG_OK;
}

/* --init: MODEL's configuration (and vocabulary, in ck.vocab) for this run;
 * a model setting given on the command line must be MODEL's (the dropout
 * may differ: a regulariser, not the shape). */
static mg_status setup_init(run *r, mg_error *err) {
    const mg_train_config *c = r->c;
    mg_error e;
    mg_status rc = mg_model_load(c->init_path, 0, &r->init, &r->ck.vocab, NULL, &e);
    if (rc) return mg_fail(err, rc, "--init: %s", e.message);
    const mg_model_config *im = mg_model_get_config(r->init);
    if (im->n_cond > 0 || c->condition)
        return mg_fail(err, MG_ERR_ARG,
                       "--init %s: fine-tuning %s is not supported (its conditions' statistics "
                       "would have to come from MODEL)",
                       c->init_path, im->n_cond > 0 ? "a conditional model" : "with --condition");
    if (im->scaffold > 0 || c->scaffold_column)
        return mg_fail(err, MG_ERR_ARG, "--init %s: fine-tuning %s is not supported", c->init_path,
                       im->scaffold > 0 ? "a scaffold model" : "with --scaffold-column");
    for (size_t i = 0; i < MG_TRAIN_NUM_SETTINGS; i++) {
        const mg_setting *s = &MG_TRAIN_SETTING[i];
        if (s->save != MG_SAVE_MODEL || !c->given[i] || !strcmp(s->key, "dropout")) continue;
        mg_train_config mine = *c;
        mine.model = *im;
        char want[64], got[64];
        mg_setting_format(s, &mine, want, sizeof want);
        mg_setting_format(s, c, got, sizeof got);
        if (strcmp(want, got))
            return mg_fail(err, MG_ERR_ARG,
                           "--%s %s conflicts with --init %s, whose %s is %s (a fine-tuned model "
                           "keeps MODEL's shape: leave --%s out)",
                           s->cli, got, c->init_path, s->key, want, s->cli);
    }
    const float dropout = r->s.model.dropout;
    r->s.model = *im;
    if (c->given[mg_setting_find("dropout") - MG_TRAIN_SETTING]) r->s.model.dropout = dropout;
    /* CRC-32 of MODEL's parameters, F32 in the tensor table's order */
    r->st.init_crc32 =
        mg_crc32(mg_model_params(r->init), mg_model_num_params(r->init) * sizeof(float));
    say(r,
        "fine-tuning from %s (parameters' CRC-32 %08" PRIx32 "): %d layers, d_model %d, %d heads, "
        "ctx %d, vocabulary of %d tokens; fresh optimizer and schedule",
        c->init_path, r->st.init_crc32, im->n_layer, im->d_model, im->n_head, im->ctx_len,
        im->vocab_size);
    return MG_OK;
}

/* --resume and the settings the caller gave (train_settings.h's resume
 * column): a NEW one replaces the checkpoint's, a SAME one must be the
 * checkpoint's (r->s holds the checkpoint's by now). */
static mg_status resume_given(run *r, mg_error *err) {
    const mg_train_config *c = r->c;
    for (size_t i = 0; i < MG_TRAIN_NUM_SETTINGS; i++) {
        const mg_setting *s = &MG_TRAIN_SETTING[i];
        if (!c->given[i] || s->resume == MG_RESUME_PATH) continue;
        if (s->resume == MG_RESUME_NEW) {
            mg_setting_copy(s, &r->s, c);
            continue;
        }
        char want[256], got[256];
        mg_setting_format(s, &r->s, want, sizeof want);
        mg_setting_format(s, c, got, sizeof got);
        if (strcmp(want, got))
            return mg_fail(err, MG_ERR_ARG,
                           "--%s %.80s with --resume: the checkpoint's %s is %.80s, and a resumed "
                           "run continues it bit for bit (leave --%s out; to train on with "
                           "another value, start a new run from it: --init %s)",
                           s->cli, got, s->key, want, s->cli, c->resume_path);
    }
    return MG_OK;
}

/* A resumed run's settings: the checkpoint's saved ones, the model's and
 * optimizer's, and the options given that may change (resume_given). */
static mg_status setup_resume(run *r, mg_error *err) {
    const mg_train_config *c = r->c;
    mg_status rc;
    if (c->init_path)
        return mg_fail(err, MG_ERR_ARG,
                       "--init and --resume together: --resume continues a run (a fine-tuning "
                       "one too, from its checkpoint), --init starts one");
    if ((rc = mg_ckpt_load(c->resume_path, &r->ck, err))) return rc;
    for (size_t i = 0; i < MG_TRAIN_NUM_SETTINGS; i++)
        if (MG_TRAIN_SETTING[i].save == MG_SAVE_CKPT ||
            MG_TRAIN_SETTING[i].save == MG_SAVE_CKPT_NEW)
            mg_setting_copy(&MG_TRAIN_SETTING[i], &r->s, &r->ck.settings);
    r->s.model = *mg_model_get_config(r->ck.model);
    r->s.optim = r->ck.opt.cfg;
    if (c->data_path) r->s.data_path = c->data_path; /* the content is checked by its hash */
    if (c->augment_file) r->s.augment_file = c->augment_file; /* so is this one's */
    if ((rc = resume_given(r, err))) return rc;
    r->st = r->ck.state;
    if (c->steps > 0 && c->steps < r->st.step)
        return mg_fail(
            err, MG_ERR_ARG,
            "%s is at step %" PRId64 " of a %" PRId64 "-step schedule: --steps %" PRId64
            " is behind it (give more steps than the checkpoint has done, or none to "
            "finish its schedule)",
            c->resume_path, r->st.step, r->ck.opt.cfg.total_steps, c->steps);
    say(r, "resuming from %s at step %" PRId64, c->resume_path, r->st.step);
    return MG_OK;
}

/* A fresh run's settings: what it needs and the options that go together. */
static mg_status setup_fresh(run *r, mg_error *err) {
    const mg_train_config *c = r->c;
    mg_status rc;
    if (!c->data_path) return mg_fail(err, MG_ERR_ARG, "no data file given");
    if (c->freeze > 0 && !c->init_path)
        return mg_fail(err, MG_ERR_ARG,
                       "--freeze %d needs --init MODEL: it keeps a trained model's lower "
                       "layers fixed (a fresh model's would stay random)",
                       c->freeze);
    if (c->extend_vocab && !c->init_path)
        return mg_fail(err, MG_ERR_ARG,
                       "--extend-vocab needs --init MODEL: it adds the data's new tokens to "
                       "MODEL's vocabulary (a fresh run takes the data's own)");
    if (c->extend_vocab && c->freeze > 0)
        return mg_fail(err, MG_ERR_ARG,
                       "--extend-vocab with --freeze %d: --freeze keeps the embeddings fixed, "
                       "so the new tokens' embeddings could not learn (leave --freeze out)",
                       c->freeze);
    if (c->init_path && (rc = setup_init(r, err))) return rc;
    if (c->steps == 0 && c->time_limit <= 0)
        return mg_fail(err, MG_ERR_ARG, "give a number of steps or a time limit");
    if (!c->csv_column) r->s.csv_column = "smiles";
    r->st.val_loss = NAN;
    return MG_OK;
}

/* The text settings (--dtype, --augment, paths) checked. */
static mg_status check_text_settings(run *r, mg_error *err) {
    mg_status rc;
    mg_dtype dt;
    if (mg_dtype_parse(r->s.dtype, &dt))
        return mg_fail(err, MG_ERR_ARG, "--dtype %s: need fp32 or bf16", r->s.dtype);
    if (strcmp(r->s.augment, "none") && strcmp(r->s.augment, "randomized"))
        return mg_fail(err, MG_ERR_ARG, "--augment %s: need none or randomized", r->s.augment);
    if (!strcmp(r->s.augment, "randomized") && (r->s.condition || r->s.scaffold_column))
        return mg_fail(err, MG_ERR_ARG,
                       "--augment randomized works on .smi data; it is not supported with "
                       "--%s",
                       r->s.condition ? "condition" : "scaffold-column");
    if (!strcmp(r->s.augment, "randomized") && !r->s.augment_file)
        return mg_fail(err, MG_ERR_ARG,
                       "--augment randomized needs --augment-file FILE (make it with "
                       "python3 -m molgen.randomize_smiles DATA FILE)");
    if (r->s.augment_file && (rc = check_utf8("the augment file path", r->s.augment_file, err)))
        return rc;
    if ((rc = check_utf8("the data path", r->s.data_path, err)) ||
        (rc = check_utf8("the --init path", r->s.init_path, err)) ||
        (rc = check_utf8("the CSV column", r->s.csv_column, err)))
        return rc;
    return MG_OK;
}

/* The settings in force: a fresh run's own, or the checkpoint's. */
static mg_status setup(run *r, mg_error *err) {
    const mg_train_config *c = r->c;
    mg_status rc = mg_train_config_check(c, err);
    if (rc) return rc;
    r->s = *c;
    if ((rc = r->resuming ? setup_resume(r, err) : setup_fresh(r, err))) return rc;
    if (!c->out_path) return mg_fail(err, MG_ERR_ARG, "no output path given");
    /* auto (NULL / -1): from whether the run fine-tunes (the checkpoint's
     * init on resume, so a resumed run resolves them alike) */
    const char *keep = r->s.keep ? r->s.keep : r->s.init_path ? "best" : "last";
    if (strcmp(keep, "best") && strcmp(keep, "last"))
        return mg_fail(err, MG_ERR_ARG, "--keep %s: need best or last", keep);
    r->keep_best = !strcmp(keep, "best");
    r->patience = r->s.patience >= 0 ? r->s.patience : r->keep_best ? MG_FINETUNE_PATIENCE : 0;
    if (r->patience > 0 && !r->keep_best)
        return mg_fail(err, MG_ERR_ARG,
                       "--patience %d needs --keep best (an early stop keeps the best step's "
                       "state)",
                       r->patience);
    r->check_samples = r->s.check_samples >= 0 ? r->s.check_samples
                       : r->s.init_path        ? MG_FINETUNE_SAMPLES
                                               : 0;
    return check_text_settings(r, err);
}

/* FNV-1a over the copies in use (0 without augmentation): a changed
 * augment file fails a resume like a changed data file. */
static uint64_t augment_hash(const run *r) {
    if (!r->aug_first) return 0;
    uint64_t h = MG_FNV1A_INIT;
    for (size_t j = 0; j < r->aug_first[r->aug_lines + 1]; j++) /* the NUL too: separates copies */
        h = mg_fnv1a(h, r->aug_copy[j], strlen(r->aug_copy[j]) + 1);
    return h;
}

/* --augment randomized: the data and its copies (mg_augment_read). A fresh
 * run builds the vocabulary from both and sizes the context for the longest
 * of either; a resumed or --init one keeps its model's. Copies the vocabulary or
 * context cannot take, or longer than --max-tokens, are dropped and
 * counted. Then the dataset from the data with that vocabulary and T. */
/* *v grown by the tokens of copy c that it lacks (a fresh run's vocabulary
 * covers its copies), *grown = 1; c that does not tokenise leaves *v as it
 * is. Returns the status of building the new vocabulary. */
static mg_status vocab_add_copy(mg_vocab **v, const char *c, int cap, int *grown, mg_error *e) {
    int nt = 0, nv = mg_vocab_size(*v);
    mg_error ee;
    mg_status rc = MG_OK;
    *grown = 0;
    mg_span *sp = malloc((size_t)cap * sizeof *sp);
    const char **toks = malloc(((size_t)nv + (size_t)cap) * sizeof *toks);
    char *txt = malloc(strlen(c) + (size_t)cap);
    if (sp && toks && txt && !mg_tokenize(c, sp, cap, &nt, NULL, &ee)) {
        int m = 0;
        for (int id = MG_NUM_SPECIAL; id < nv; id++) toks[m++] = mg_vocab_token(*v, id);
        char *w = txt;
        for (int k = 0; k < nt; k++) {
            memcpy(w, c + sp[k].start, (size_t)sp[k].len);
            w[sp[k].len] = '\0';
            toks[m++] = w;
            w += sp[k].len + 1;
        }
        mg_vocab *nvoc = NULL;
        if ((rc = mg_vocab_from_tokens(toks, (size_t)m, &nvoc, e)) == 0) {
            mg_vocab_free(*v);
            *v = nvoc;
            *grown = 1;
        }
    }
    free(sp);
    free(toks);
    free(txt);
    return rc;
}

/* The copies that fit (vocabulary *v, grown unless fixed; T; --max-tokens)
 * into r->aug_copy and the end of each line's range into r->aug_first;
 * their count, the dropped ones' and the longest copy's tokens. */
static mg_status keep_copies(run *r, const mg_load_opts *lo, int fixed, int T, mg_vocab **v,
                             size_t *kept, size_t *dropped, int *longest, mg_error *e) {
    const int cap = 1 << 16;
    int32_t *ids = malloc((size_t)cap * sizeof *ids);
    if (!ids) return mg_fail(e, MG_ERR_NOMEM, "out of memory for %zu copies", r->aug.n);
    mg_status rc = MG_OK;
    for (size_t j = 0; j < r->aug.n && !rc; j++) {
        const char *c = r->aug.smiles[j];
        int n = 0, grown;
        mg_error ee;
        mg_status erc = mg_vocab_encode(*v, c, ids, cap, &n, &ee);
        if (erc == MG_ERR_UNKNOWN_TOKEN && !fixed) { /* a token only copies have */
            if ((rc = vocab_add_copy(v, c, cap, &grown, e))) break;
            erc = grown ? mg_vocab_encode(*v, c, ids, cap, &n, &ee) : MG_ERR_TOKEN;
        }
        if (erc || (lo->max_tokens > 0 && n > lo->max_tokens) || (fixed || lo->T ? n + 2 > T : 0)) {
            (*dropped)++;
            continue;
        }
        if (n > *longest) *longest = n;
        r->aug_copy[(*kept)++] = c;
        r->aug_first[r->aug.line[j] + 1] = *kept; /* lines ascend: the end of line's range */
    }
    free(ids);
    return rc;
}

static mg_status load_augmented(run *r, mg_load_opts *lo, mg_vocab **built, mg_report *rep,
                                mg_error *e) {
    const int fixed = r->resuming || r->init; /* the vocabulary and context are given */
    mg_smiles_list list;
    mg_status rc = mg_read_smiles(r->s.data_path, r->s.csv_column, &list, rep, e);
    if (rc) return rc;
    if ((rc = mg_augment_read(r->s.augment_file, &r->aug, &r->aug_lines, e))) goto out;
    if (r->aug_lines != rep->lines) {
        rc = mg_fail(e, MG_ERR_MISMATCH,
                     "%s covers %ld lines, the data %s has %ld: it was made for another file",
                     r->s.augment_file, r->aug_lines, r->s.data_path, rep->lines);
        goto out;
    }
    mg_vocab *v = NULL;
    int T = lo->T;
    if (fixed) {
        v = r->ck.vocab;
    } else { /* the data's own vocabulary and length first */
        mg_dataset tmp;
        mg_report rtmp = *rep;
        if ((rc = mg_dataset_from_list(&list, r->s.data_path, lo, NULL, &v, &tmp, &rtmp, e)))
            goto out;
        if (!T) T = tmp.T;
        mg_dataset_free(&tmp);
    }
    r->aug_copy = malloc((r->aug.n ? r->aug.n : 1) * sizeof *r->aug_copy);
    r->aug_first = calloc((size_t)r->aug_lines + 2, sizeof *r->aug_first);
    size_t kept = 0, dropped = 0;
    int longest = 0;
    if (!r->aug_copy || !r->aug_first)
        rc = mg_fail(e, MG_ERR_NOMEM, "out of memory for %zu copies", r->aug.n);
    else
        rc = keep_copies(r, lo, fixed, T, &v, &kept, &dropped, &longest, e);
    if (rc) {
        if (!fixed) mg_vocab_free(v);
        goto out;
    }
    for (long l = 1; l <= r->aug_lines + 1; l++) /* lines without copies: empty ranges */
        if (r->aug_first[l] < r->aug_first[l - 1]) r->aug_first[l] = r->aug_first[l - 1];
    if (!fixed && !lo->T && longest + 2 > T) T = longest + 2;
    say(r,
        "augment %s: %zu randomized copies of %ld lines kept, %zu dropped (tokens outside the "
        "vocabulary or longer than the context / --max-tokens)",
        r->s.augment_file, kept, r->aug_lines, dropped);
    mg_load_opts lo2 = *lo;
    lo2.T = T;
    mg_report r2 = *rep;
    rc = mg_dataset_from_list(&list, r->s.data_path, &lo2, v, NULL, &r->all, &r2, e);
    *rep = r2;
    if (!fixed) {
        if (rc)
            mg_vocab_free(v);
        else
            *built = v;
    }
out:
    mg_smiles_list_free(&list);
    return rc;
}

/* --scaffold-column: every row's scaffold tokens (condition.h), and the
 * longest, which with the molecules' context sizes a fresh model's. */
static mg_status load_scaffolds(run *r, mg_error *err) {
    if (!r->s.scaffold_column) return MG_OK;
    const char *path = r->s.data_path;
    const size_t pl = strlen(path);
    if (pl < 4 || strcasecmp(path + pl - 4, ".csv"))
        return mg_fail(err, MG_ERR_ARG,
                       "--scaffold-column needs a .csv data file (%s is not one; molgen/props.py "
                       "writes one)",
                       path);
    if (!strcasecmp(r->s.scaffold_column, r->s.csv_column))
        return mg_fail(err, MG_ERR_ARG, "--scaffold-column %s is the SMILES column",
                       r->s.scaffold_column);
    size_t missing, bad;
    char note[512];
    mg_status rc = mg_scaffold_read(path, r->s.scaffold_column, r->ck.vocab, &r->all,
                                    r->s.max_tokens > 0 ? r->s.max_tokens : MG_MAX_TOKENS_DEFAULT,
                                    &r->sc_first, &r->sc_toks, &r->sc_longest, &missing, &bad, note,
                                    sizeof note, err);
    if (rc) return rc;
    if (r->sc_longest == 0)
        return mg_fail(err, MG_ERR_ARG, "--scaffold-column %s: no row of %s has a scaffold%s%s",
                       r->s.scaffold_column, path, bad ? "; e.g. " : "", bad ? note : "");
    if (r->resuming && r->sc_longest > r->s.model.scaffold)
        return mg_fail(err, MG_ERR_MISMATCH,
                       "scaffolds of %s are up to %d tokens, the checkpoint's model takes %d: "
                       "resume needs the same data",
                       path, r->sc_longest, r->s.model.scaffold);
    say(r,
        "scaffolds (%s): %zu of %zu rows, up to %d tokens; %zu without one (%zu that do not "
        "encode%s%s); each trained without its prefix with p = %g",
        r->s.scaffold_column, r->all.n - missing, r->all.n, r->sc_longest, missing, bad,
        bad ? ", e.g. " : "", bad ? note : "", r->s.scaffold_drop);
    return MG_OK;
}

/* FNV-1a over the scaffold tokens in use (0 without): part of the data a
 * resume checks. */
static uint64_t scaffold_hash(const run *r) {
    if (!r->sc_first) return 0;
    const uint64_t h = mg_fnv1a(MG_FNV1A_INIT, r->sc_first, (r->all.n + 1) * sizeof(size_t));
    return mg_fnv1a(h, r->sc_toks, r->sc_first[r->all.n] * sizeof(int32_t));
}

/* Each training row's scaffold: the row of all with its line (both in file
 * order). */
static mg_status scaffold_train_rows(run *r, mg_error *err) {
    const size_t n = r->train.n;
    r->sc_off = malloc((n ? n : 1) * sizeof *r->sc_off);
    r->sc_len = malloc((n ? n : 1) * sizeof *r->sc_len);
    if (!r->sc_off || !r->sc_len) return mg_fail(err, MG_ERR_NOMEM, "out of memory");
    size_t j = 0;
    for (size_t i = 0; i < n; i++) {
        while (j < r->all.n && r->all.line[j] != r->train.line[i]) j++;
        if (j == r->all.n)
            return mg_fail(err, MG_ERR_STATE, "training row %zu (line %ld) is not in the data", i,
                           r->train.line[i]);
        r->sc_off[i] = r->sc_first[j];
        r->sc_len[i] = (int)(r->sc_first[j + 1] - r->sc_first[j]);
    }
    return MG_OK;
}

/* A token --init MODEL lacks: the data molecules holding it and the first. */
typedef struct {
    char tok[MG_TOKEN_MAX + 1];
    long molecules, line;
    size_t last; /* 1 + the last record counted */
} new_token;

/* The data's tokens that v lacks into *nt [*n_new] (first line, molecules
 * with it), and the molecules longer than limit tokens (*too_long, the
 * first's line and length). */
static mg_status find_new_tokens(const mg_smiles_list *lst, const mg_vocab *v, int limit,
                                 new_token **ntp, size_t *n_new, long *too_long, long *first_long,
                                 int *first_len, mg_error *err) {
    new_token *nt = NULL;
    size_t cap = 0;
    mg_status rc = MG_OK;
    for (size_t i = 0; i < lst->n && !rc; i++) {
        const char *sm = lst->smiles[i];
        int k = 0, l;
        for (int pos = 0; (l = mg_token_len(sm + pos)) > 0; pos += l, k++) {
            if (mg_vocab_lookup(v, sm + pos, l) >= MG_NUM_SPECIAL) continue;
            size_t j = 0;
            while (j < *n_new && (strncmp(nt[j].tok, sm + pos, (size_t)l) || nt[j].tok[l])) j++;
            if (j == *n_new) {
                if (*n_new == cap) {
                    new_token *g = realloc(nt, (cap = cap ? 2 * cap : 16) * sizeof *nt);
                    if (!g) {
                        rc = mg_fail(err, MG_ERR_NOMEM, "out of memory");
                        break;
                    }
                    nt = g;
                }
                memcpy(nt[j].tok, sm + pos, (size_t)l);
                nt[j].tok[l] = '\0';
                nt[j].molecules = 0;
                nt[j].line = lst->line[i];
                nt[j].last = 0;
                (*n_new)++;
            }
            if (nt[j].last != i + 1) { /* once per molecule */
                nt[j].molecules++;
                nt[j].last = i + 1;
            }
        }
        if (l == 0 && k > limit && !(*too_long)++) { /* a line that tokenises, too long */
            *first_long = lst->line[i];
            *first_len = k;
        }
    }
    *ntp = nt;
    return rc;
}

/* "'TOKEN' (N molecules, first at FILE:LINE), ..." of nt [n_new] into
 * list_s [800], " and K more" past its room. */
static void new_tokens_text(const run *r, const new_token *nt, size_t n_new, char *list_s) {
    const size_t room = 800;
    list_s[0] = '\0';
    size_t shown = 0;
    for (; shown < n_new; shown++) {
        char one[320];
        snprintf(one, sizeof one, "%s'%s' (%ld molecule%s, first at %.200s:%ld)",
                 shown ? ", " : "", nt[shown].tok, nt[shown].molecules,
                 nt[shown].molecules == 1 ? "" : "s", r->s.data_path, nt[shown].line);
        if (strlen(list_s) + strlen(one) + 32 > room) break;
        strcat(list_s, one);
    }
    if (shown < n_new)
        snprintf(list_s + strlen(list_s), room - strlen(list_s), " and %zu more",
                 n_new - shown);
}

/* --init: the data's tokens against MODEL's vocabulary, before any
 * training. Tokens it lacks: refused, every one listed with its count and
 * first line, unless --extend-vocab (then r->ck.vocab grows by them, in
 * strcmp order after MODEL's ids, and r->added says how many). Molecules
 * longer than MODEL's context: one line with their count and the first. */
static mg_status scan_init_data(run *r, mg_error *err) {
    mg_smiles_list list;
    mg_error e;
    mg_status rc = mg_read_smiles(r->s.data_path, r->s.csv_column, &list, NULL, &e);
    if (rc) return mg_fail(err, rc, "%s", e.message);
    const mg_vocab *v = r->ck.vocab;
    const int limit = r->s.model.ctx_len - 1; /* SMILES tokens: BOS + k inputs <= ctx_len */
    new_token *nt = NULL;
    size_t n_new = 0;
    long too_long = 0, first_long = 0;
    int first_len = 0;
    rc = find_new_tokens(&list, v, limit, &nt, &n_new, &too_long, &first_long, &first_len, err);
    mg_smiles_list_free(&list);
    if (rc) {
        free(nt);
        return rc;
    }
    if (too_long)
        say(r,
            "warning: %ld molecule(s) of %s longer than the context of --init %s (%d tokens at "
            "most) are skipped; the first at %s:%ld (%d tokens, more than the model's limit %d)",
            too_long, r->s.data_path, r->c->init_path, limit, r->s.data_path, first_long,
            first_len, limit);
    if (n_new == 0) {
        free(nt);
        return MG_OK;
    }
    char list_s[800];
    new_tokens_text(r, nt, n_new, list_s);
    if (!r->s.extend_vocab) {
        rc = mg_fail(err, MG_ERR_UNKNOWN_TOKEN,
                     "data %s has %zu token(s) that --init %s's vocabulary of %d lacks: %s. "
                     "Give --extend-vocab to add them (new embedding and output rows, trained "
                     "from these molecules), or leave those molecules out",
                     r->s.data_path, n_new, r->c->init_path, mg_vocab_size(v), list_s);
        free(nt);
        return rc;
    }
    const char **toks = malloc(n_new * sizeof *toks);
    mg_vocab *grown = NULL;
    if (!toks) rc = mg_fail(err, MG_ERR_NOMEM, "out of memory");
    for (size_t j = 0; !rc && j < n_new; j++) toks[j] = nt[j].tok;
    if (!rc && (rc = mg_vocab_extend(v, toks, n_new, &grown, &r->added, &e)))
        rc = mg_fail(err, rc, "--extend-vocab: %s", e.message);
    free(toks);
    free(nt);
    if (rc) return rc;
    say(r,
        "--extend-vocab: %d new token(s) %s: vocabulary %d -> %d; new rows start with "
        "probability <= e^-%g at any input",
        r->added, list_s, mg_vocab_size(v), mg_vocab_size(grown), MG_EXTEND_MARGIN);
    r->init_vocab = r->ck.vocab; /* the base model's check samples read it */
    r->ck.vocab = grown;
    return MG_OK;
}

/* The seeded train / validation split of all (a fine-tuning run holds out
 * enough to validate on); a default batch size larger than the training
 * split shrinks to it. */
static mg_status split_data(run *r, mg_error *err) {
    mg_error e;
    mg_status rc;
    double vf = r->s.val_frac;
    if (r->s.init_path && vf > 0) { /* fine-tuning: at least MG_FINETUNE_VAL_MIN validation
                                       molecules, or a quarter of the data when that is fewer */
        const size_t n = r->all.n, want = n / 4 < MG_FINETUNE_VAL_MIN ? n / 4 : MG_FINETUNE_VAL_MIN;
        if (floor((double)n * vf + 0.5) < (double)want) vf = ((double)want + 0.25) / (double)n;
    }
    if ((rc = mg_dataset_split(&r->all, vf, r->s.seed, &r->train, &r->val, &e)))
        return mg_fail(err, rc, "%s", e.message);
    if (r->train.n < (size_t)r->s.batch_size) {
        /* a small set (a fine-tuning set of a few dozen): the default batch
         * shrinks to the training split; a batch size asked for (or a
         * checkpoint's) is kept, and the message says what to change */
        const int asked = r->resuming || r->c->given[mg_setting_find("batch_size") - MG_TRAIN_SETTING];
        if (asked || r->train.n == 0)
            return mg_fail(err, MG_ERR_ARG,
                           "the training split has %zu molecules (%zu of the %zu held out for "
                           "validation: --val-frac %g%s), fewer than --batch-size %d: give "
                           "--batch-size %zu or less, a smaller --val-frac, or more molecules",
                           r->train.n, r->val.n, r->all.n, r->s.val_frac,
                           vf != r->s.val_frac ? ", and a fine-tuning run holds out at least 50 "
                                                 "or a quarter of the set, the fewer"
                                               : "",
                           r->s.batch_size, r->train.n ? r->train.n : (size_t)1);
        say(r, "batch size %zu: all of the training split's %zu molecules (fewer than the default "
               "%d; --batch-size sets it)",
            r->train.n, r->train.n, r->s.batch_size);
        r->s.batch_size = (int)r->train.n;
    }
    return MG_OK;
}

/* How many validation molecules each validation reads, and whether --keep
 * best can run. */
static mg_status validation_plan(run *r, mg_error *err) {
    r->res.n_train = r->train.n;
    r->res.n_val = r->val.n;
    r->nv = (r->s.val_max > 0 && (size_t)r->s.val_max < r->val.n) ? (size_t)r->s.val_max : r->val.n;
    if (r->keep_best && r->nv == 0 && !r->s.keep && r->s.patience < 0 && r->s.val_frac > 0) {
        /* --keep best by default (fine-tuning), but too few molecules to
         * hold any out (fewer than 4): the last step is kept */
        say(r, "no validation molecules (%zu in all, too few to hold any out): keeping the last "
               "step (--keep last)",
            r->all.n);
        r->keep_best = 0;
        r->patience = 0;
    }
    if (r->keep_best && r->nv == 0)
        return mg_fail(err, MG_ERR_ARG,
                       "--keep best needs validation molecules: --val-frac %g leaves none of %zu "
                       "(give a larger --val-frac, or --keep last)",
                       r->s.val_frac, r->all.n);
    return MG_OK;
}

/* The data file -> all (checked against the checkpoint on resume) -> the
 * seeded train / validation split. */
static mg_status load_data(run *r, mg_error *err) {
    mg_load_opts lo;
    memset(&lo, 0, sizeof lo);
    lo.csv_column = r->s.csv_column;
    lo.max_tokens = r->s.max_tokens;
    const int fixed = r->resuming || r->init; /* the vocabulary and context are given */
    mg_status rc;
    if (r->init && (rc = scan_init_data(r, err))) return rc;
    /* a resumed scaffold model's context covers the prefix: the molecules' is S + 1 shorter */
    const int sp = r->resuming && r->s.model.scaffold > 0 ? r->s.model.scaffold + 1 : 0;
    lo.T = fixed || r->s.model.ctx_len > 0 ? r->s.model.ctx_len + 1 - sp : 0;
    mg_report rep;
    mg_vocab *built = NULL;
    mg_error e;
    rc = strcmp(r->s.augment, "randomized")
                       ? mg_dataset_load(r->s.data_path, &lo, fixed ? r->ck.vocab : NULL,
                                         fixed ? NULL : &built, &r->all, &rep, &e)
                       : load_augmented(r, &lo, &built, &rep, &e);
    if (rc && r->init && rep.records > 0 && rep.kept == 0) {
        char msg[4096];
        mg_report_format(&rep, msg, sizeof msg);
        return mg_fail(err, rc,
                       "data %s: no molecule fits --init %s (its vocabulary of %d tokens, "
                       "context %d): %s",
                       r->s.data_path, r->c->init_path, mg_vocab_size(r->ck.vocab),
                       r->s.model.ctx_len, msg);
    }
    if (rc) return mg_fail(err, rc, "%s", e.message);
    if (!fixed) r->ck.vocab = built;
    r->res.skipped = rep.skipped;
    char msg[4096];
    mg_report_format(&rep, msg, sizeof msg);
    say(r, "data %s: %s", r->s.data_path, msg);
    if (rep.skipped > 0) say(r, "warning: %ld line(s) skipped (see above)", rep.skipped);
    mg_status src = load_scaffolds(r, err);
    if (src) return src;
    const uint64_t h = dataset_hash(&r->all) ^ augment_hash(r) ^ scaffold_hash(r);
    if (r->resuming && ((uint64_t)r->all.n != r->st.data_rows || h != r->st.data_hash))
        return mg_fail(err, MG_ERR_MISMATCH,
                       "data %s differs from the checkpoint's (%zu molecules vs %" PRIu64
                       "%s): resume needs the same data",
                       r->s.data_path, r->all.n, r->st.data_rows,
                       (uint64_t)r->all.n == r->st.data_rows ? ", same count but different content"
                                                             : "");
    r->st.data_rows = r->all.n;
    r->st.data_hash = h;
    if ((rc = split_data(r, err))) return rc;
    if (r->sc_first && (src = scaffold_train_rows(r, err))) return src;
    return validation_plan(r, err);
}

/* The conditions (condition.h): their columns' values for the training and
 * validation rows, normalised by the training rows' statistics (a resumed
 * run: by the checkpoint's). */
static mg_status load_conditions(run *r, mg_error *err) {
    mg_status rc;
    const char *path = r->s.data_path;
    const size_t pl = strlen(path);
    if (!r->s.condition) {
        if (r->s.model.cond_bos && !r->resuming)
            return mg_fail(err, MG_ERR_ARG, "--condition-prefix needs --condition");
        return MG_OK;
    }
    if (pl < 4 || strcasecmp(path + pl - 4, ".csv"))
        return mg_fail(err, MG_ERR_ARG,
                       "--condition needs a .csv data file with those columns (%s is not one; "
                       "molgen/props.py writes one)",
                       path);
    if ((rc = check_utf8("the condition list", r->s.condition, err)) ||
        (rc = mg_cond_parse_names(r->s.condition, &r->cond, err)))
        return rc;
    for (int k = 0; k < r->cond.K; k++)
        if (!strcasecmp(r->cond.names[k], r->s.csv_column))
            return mg_fail(err, MG_ERR_ARG, "condition '%s' is the SMILES column",
                           r->cond.names[k]);
    size_t miss_t = 0, miss_v = 0;
    if ((rc = mg_cond_read(path, &r->cond, &r->train, &r->cv_train, &miss_t, err)) ||
        (rc = mg_cond_read(path, &r->cond, &r->val, &r->cv_val, &miss_v, err)))
        return rc;
    if (r->resuming) {
        mg_cond_info saved;
        if ((rc = mg_cond_info_from_json(mg_model_condition_meta(r->ck.model), &saved, err)))
            return rc;
        int same = saved.K == r->cond.K;
        for (int k = 0; same && k < saved.K; k++) same = !strcmp(saved.names[k], r->cond.names[k]);
        mg_cond_info_free(&r->cond);
        r->cond = saved;
        if (!same)
            return mg_fail(err, MG_ERR_MISMATCH,
                           "the checkpoint's conditions differ from its model's");
    } else if ((rc = mg_cond_stats(&r->cond, r->cv_train, r->train.n, err))) {
        return rc;
    }
    mg_cond_normalise(&r->cond, r->cv_train, r->train.n);
    mg_cond_normalise(&r->cond, r->cv_val, r->val.n);
    char line[4096] = "";
    for (int k = 0; k < r->cond.K; k++)
        snprintf(line + strlen(line), sizeof line - strlen(line),
                 "%s%s (mean %.4g, std %.4g, range [%.4g, %.4g])", k ? ", " : "", r->cond.names[k],
                 r->cond.mean[k], r->cond.std[k], r->cond.min[k], r->cond.max[k]);
    say(r, "conditions: %s; %zu missing value(s) count as dropped; each dropped with p = %g", line,
        miss_t + miss_v, r->s.condition_drop);
    r->bcond = malloc((size_t)r->s.batch_size * r->cond.K * sizeof(float));
    if (!r->bcond) return mg_fail(err, MG_ERR_NOMEM, "out of memory");
    return MG_OK;
}

/* --extend-vocab: q [added, V0] for mg_model_extend_vocab, per new token
 * the base model's next-token distribution summed over the data rows'
 * first new token (its prefix holds base's tokens only). Rows of a token
 * that never comes first stay 0 (the data-independent start). */
static mg_status new_token_q(run *r, double **q_out, mg_error *err) {
    mg_model *base = r->init;
    const int V0 = mg_model_get_config(base)->vocab_size, T = r->all.T, L = T - 1, BS = 16;
    double *q = calloc((size_t)r->added * V0, sizeof *q);
    int32_t *ids = malloc((size_t)BS * L * sizeof *ids);
    int64_t *len = malloc(BS * sizeof *len);
    int *tgt = malloc(BS * sizeof *tgt);
    float *logits = malloc((size_t)BS * L * V0 * sizeof *logits);
    mg_status rc = q && ids && len && tgt && logits ? MG_OK
                                                    : mg_fail(err, MG_ERR_NOMEM, "out of memory");
    mg_model_set_threads(base, r->c->threads);
    for (size_t i = 0; !rc && i < r->all.n;) {
        int B = 0;
        for (; i < r->all.n && B < BS; i++) { /* rows with a new token */
            const int32_t *row = r->all.ids + i * T;
            int t = 1;
            while (t < r->all.lengths[i] && row[t] < V0) t++;
            if (t >= r->all.lengths[i]) continue;
            for (int u = 0; u < L; u++) ids[B * L + u] = u < t ? row[u] : MG_PAD;
            len[B] = t; /* positions 0..t-1; t-1's logits predict row[t] */
            tgt[B++] = row[t] - V0;
        }
        if (B == 0) break;
        mg_error e;
        if ((rc = mg_model_logits(base, &(mg_batch){.ids = ids, .lengths = len, .B = B, .T = L},
                                  logits, NULL, &e))) {
            rc = mg_fail(err, rc, "--extend-vocab: the base model's forward: %s", e.message);
            break;
        }
        for (int b = 0; b < B; b++) { /* softmax in double */
            const float *z = logits + ((size_t)b * L + (size_t)(len[b] - 1)) * V0;
            double mx = z[0], sum = 0.0;
            for (int v = 1; v < V0; v++) mx = z[v] > mx ? z[v] : mx;
            for (int v = 0; v < V0; v++) sum += exp(z[v] - mx);
            for (int v = 0; v < V0; v++) q[(size_t)tgt[b] * V0 + v] += exp(z[v] - mx) / sum;
        }
    }
    free(ids);
    free(len);
    free(tgt);
    free(logits);
    if (rc) {
        free(q);
        q = NULL;
    }
    *q_out = q;
    return rc;
}

/* A fresh run's model (new, from --init, or --init with added tokens) and
 * optimizer. */
static mg_status build_fresh(run *r, mg_error *err) {
    const mg_train_config *c = r->c;
    mg_error e;
    mg_status rc;
    mg_model_config mc = r->s.model;
    mc.vocab_size = mg_vocab_size(r->ck.vocab);
    mc.ctx_len = r->all.T - 1 + (r->sc_longest ? r->sc_longest + 1 : 0);
    mc.n_cond = r->cond.K;
    mc.scaffold = r->sc_longest;
    if (r->added > 0) { /* MODEL's tensors by name, the grown ones row by row */
        double *q = NULL;
        if ((rc = new_token_q(r, &q, err))) return rc;
        rc = mg_model_extend_vocab(r->init, mc.vocab_size, MG_EXTEND_MARGIN, q, &r->ck.model,
                                   &e);
        free(q);
    } else
        rc = mg_model_create(&mc, &r->ck.model, &e);
    if (rc) return mg_fail(err, rc, "model: %s", e.message);
    r->st.new_rows = mg_model_new_rows(r->ck.model);
    if (r->init && !r->added) /* the same table, so the same layout */
        memcpy(mg_model_params(r->ck.model), mg_model_params(r->init),
               mg_model_num_params(r->init) * sizeof(float));
    else if (!r->init)
        mg_model_init(r->ck.model, r->s.seed);
    if (r->cond.K > 0) {
        char *cj = mg_cond_info_to_json(&r->cond);
        rc = cj ? mg_model_set_condition_meta(r->ck.model, cj, &e)
                : mg_fail(&e, MG_ERR_NOMEM, "out of memory");
        free(cj);
        if (rc) return mg_fail(err, rc, "model: %s", e.message);
    }
    if ((rc = mg_model_set_frozen(r->ck.model, r->s.freeze, &e)))
        return mg_fail(err, rc, "--freeze: %s", e.message);
    mg_adamw_config oc = r->s.optim;
    oc.total_steps = c->steps > 0 ? c->steps : MG_STEPS_UNSIZED; /* estimated later */
    if ((rc = mg_ckpt_optimizer(r->ck.model, &oc, &r->ck.opt, &e)) ||
        (r->s.ema > 0 &&
         (rc = mg_adamw_enable_ema(&r->ck.opt, r->s.ema, mg_model_params(r->ck.model), &e))))
        return mg_fail(err, rc, "optimizer: %s", e.message);
    return MG_OK;
}

/* The model's run-time settings (threads, dtype, label smoothing) and the
 * schedule: its length known or not, validation interval, warm-up. */
static mg_status build_schedule(run *r, mg_error *err) {
    const mg_train_config *c = r->c;
    mg_status rc;
    mg_model_set_threads(r->ck.model, c->threads);
    mg_dtype dt = MG_DT_F32;
    mg_dtype_parse(r->s.dtype, &dt); /* checked with the settings */
    mg_model_set_dtype(r->ck.model, dt);
    const char *note = mg_gemm_dtype_note(dt);
    if (note) say(r, "note: %s", note);
    if ((rc = mg_model_set_label_smoothing(r->ck.model, r->s.label_smoothing, err))) return rc;
    r->ck.opt.threads = c->threads;
    mg_adamw *opt = &r->ck.opt;
    /* A time-limited run stopped before its schedule was sized (the first
     * timed steps) is sized again when resumed, which needs a time limit. */
    r->total_known = c->steps > 0 || (r->resuming && opt->cfg.total_steps < MG_STEPS_UNSIZED);
    if (!r->total_known && c->time_limit <= 0)
        return mg_fail(err, MG_ERR_ARG,
                       "%s stopped before its schedule length was known: resume with --steps N or "
                       "--time-limit SECONDS",
                       c->resume_path);
    if (r->total_known && r->s.val_every < 0)
        r->s.val_every = auto_val_every(opt->cfg.total_steps, r->s.init_path != NULL, r->train.n,
                                        r->s.batch_size);
    if (r->total_known && opt->cfg.warmup_steps > opt->cfg.total_steps / 2 && !r->resuming) {
        opt->cfg.warmup_steps = opt->cfg.total_steps / 10 > 1 ? opt->cfg.total_steps / 10 : 1;
        say(r, "note: warm-up shortened to %" PRId64 " steps (a tenth of the run)",
            opt->cfg.warmup_steps);
    }
    return MG_OK;
}

/* The run's model on stderr and in the result. */
static void report_model(run *r) {
    const mg_model_config *mc = mg_model_get_config(r->ck.model);
    if (r->s.freeze > 0)
        say(r,
            "frozen: the embeddings and blocks 0-%d (%zu of %zu parameters: no update, no "
            "gradient)",
            r->s.freeze - 1, mg_model_frozen_params(r->ck.model), mg_model_num_params(r->ck.model));
    r->res.vocab_size = mc->vocab_size;
    r->res.ctx_len = mc->ctx_len;
    r->res.unigram_entropy = unigram_entropy(&r->train, mc->vocab_size);
    say(r,
        "model: %d layers, d_model %d, %d heads, ctx %d, vocab %d, dropout %g: %zu parameters; "
        "%zu train / %zu validation molecules; batch %d; %d thread(s)",
        mc->n_layer, mc->d_model, mc->n_head, mc->ctx_len, mc->vocab_size, (double)mc->dropout,
        mg_model_num_params(r->ck.model), r->train.n, r->val.n, r->s.batch_size,
        mg_model_threads(r->ck.model));
}

/* A resumed run reads the data its checkpoint names, which the command
 * could not check its outputs against: none may be that data. */
static mg_status outputs_not_inputs(run *r, mg_error *err) {
    const mg_train_config *c = r->c;
    const char *const out_opt[] = {"--out", "--loss-log", "--debug-dump-rows"};
    const char *const outs[] = {c->out_path, c->loss_log, c->dump_rows};
    const char *const ins[] = {r->s.data_path, r->s.augment_file};
    for (int i = 0; r->resuming && r->d->rank == 0 && i < 3; i++)
        for (int j = 0; j < 2; j++) {
            struct stat so, si;
            if (outs[i] && ins[j] && stat(outs[i], &so) == 0 && stat(ins[j], &si) == 0 &&
                S_ISREG(so.st_mode) && so.st_dev == si.st_dev && so.st_ino == si.st_ino)
                return mg_fail(err, MG_ERR_ARG,
                               "%s %s is the %s file %s of the checkpoint (same file): refusing "
                               "to write over an input",
                               out_opt[i], outs[i], j ? "--augment-file" : "--data", ins[j]);
        }
    return MG_OK;
}

/* The loss log and the batch buffers. */
static mg_status build_buffers(run *r, const mg_model_config *mc, int B, int T, mg_error *err) {
    const mg_train_config *c = r->c;
    if (c->loss_log && r->d->rank == 0 && !(r->loss_log = fopen(c->loss_log, "a")))
        return mg_fail(err, MG_ERR_IO, "cannot open the loss log %s", c->loss_log);
    r->bids = malloc((size_t)B * T * sizeof(int32_t));
    r->bbuf = malloc((size_t)B * T * sizeof(int32_t));
    r->blen = malloc((size_t)B * sizeof(int64_t));
    r->brows = malloc((size_t)B * sizeof(size_t));
    if (!r->bids || !r->bbuf || !r->blen || !r->brows)
        return mg_fail(err, MG_ERR_NOMEM, "out of memory for batches");
    if (r->sc_first) { /* rows with their scaffold prefixes, as wide as the model */
        r->Tw = mc->ctx_len + 1;
        free(r->bbuf);
        r->bbuf = malloc((size_t)B * r->Tw * sizeof(int32_t));
        r->sbids = malloc((size_t)B * r->Tw * sizeof(int32_t));
        r->slen = malloc((size_t)B * sizeof(int64_t));
        r->spre = malloc((size_t)B * sizeof(int64_t));
        if (!r->bbuf || !r->sbids || !r->slen || !r->spre)
            return mg_fail(err, MG_ERR_NOMEM, "out of memory for batches");
    }
    return MG_OK;
}

/* A fresh model and optimizer, or the checkpoint's with this run's schedule
 * length; the causal-leak guard; the batch stream and its buffers. */
static mg_status build(run *r, mg_error *err) {
    const mg_train_config *c = r->c;
    mg_error e;
    mg_status rc;
    if (!r->resuming) {
        if ((rc = build_fresh(r, err))) return rc;
    } else if (c->steps > 0 && c->steps != r->ck.opt.cfg.total_steps) {
        say(r, "note: schedule length changed from %" PRId64 " to %" PRId64 " steps",
            r->ck.opt.cfg.total_steps, c->steps);
        r->ck.opt.cfg.total_steps = c->steps;
    }
    if ((rc = build_schedule(r, err))) return rc;
    report_model(r);
    if (!c->skip_guard && (rc = mg_model_causal_guard(r->ck.model, r->s.seed, &e)))
        return mg_fail(err, rc, "causal-leak guard failed: %s", e.message);
    const int B = r->s.batch_size, T = r->all.T;
    if (B < r->d->size)
        return mg_fail(err, MG_ERR_ARG, "batch size %d is smaller than the %d ranks", B,
                       r->d->size);
    mg_dist_range((size_t)B, r->d->rank, r->d->size, &r->b0, &r->b1);
    if ((rc = mg_batcher_new(&r->train, B, r->s.seed, 1, &r->batcher, &e)))
        return mg_fail(err, rc, "%s", e.message);
    mg_batcher_seek(r->batcher, (uint64_t)r->st.step);
    if ((rc = outputs_not_inputs(r, err))) return rc;
    return build_buffers(r, mg_model_get_config(r->ck.model), B, T, err);
}

/* --augment randomized: each row of the batch just drawn becomes one of its
 * molecule's copies, picked by (seed, step, slot) alone, so a resumed run
 * draws the same ones. */
static mg_status augment_batch(run *r, mg_error *err) {
    const int B = r->s.batch_size, T = r->all.T;
    const uint64_t k = step_seed(r->s.seed, r->st.step) ^ 0xA0761D6478BD642Full;
    for (int i = 0; i < B; i++) {
        const long l = r->train.line[r->brows[i]];
        if (l < 1 || l > r->aug_lines) continue;
        const size_t a = r->aug_first[l], n = r->aug_first[l + 1] - a;
        if (n == 0) continue;
        const char *c =
            r->aug_copy[a + mg_mix64(k + 0x9E3779B97F4A7C15ull * (uint64_t)(i + 1)) % n];
        mg_error e;
        mg_status rc = mg_encode_row(r->ck.vocab, c, T, r->bids + (size_t)i * T, &r->blen[i], &e);
        if (rc) return mg_fail(err, rc, "augment copy '%s': %s", c, e.message);
    }
    return MG_OK;
}

/* --scaffold-column: the batch just drawn with its rows' scaffold
 * prefixes (each dropped by a hash of seed, step and slot). */
static void scaffold_batch(run *r) {
    const int B = r->s.batch_size, T = r->all.T;
    const uint64_t seed = step_seed(r->s.seed, r->st.step) ^ 0x5CAFF01D5CAFF01Dull;
    for (int i = 0; i < B; i++) {
        const size_t row = r->brows[i];
        mg_scaffold_row(r->bids + (size_t)i * T, r->blen[i], r->sc_toks + r->sc_off[row],
                        r->sc_len[row], i, r->s.scaffold_drop, seed, r->Tw,
                        r->sbids + (size_t)i * r->Tw, &r->slen[i], &r->spre[i]);
    }
}

/* --debug-dump-rows: the batch's rows as they are trained, one per line. */
static mg_status dump_batch(run *r, mg_error *err) {
    const int B = r->s.batch_size, T = r->all.T;
    if (!r->dump && !(r->dump = fopen(r->c->dump_rows, "a")))
        return mg_fail(err, MG_ERR_IO, "--debug-dump-rows %s: %s", r->c->dump_rows,
                       strerror(errno));
    char s[4096], p[4096];
    for (int i = 0; i < B; i++) {
        mg_error e;
        /* with scaffolds: the row after its prefix, and the prefix's scaffold */
        const int64_t pre = r->sbids ? r->spre[i] : 0;
        const int32_t *row = r->sbids ? r->sbids + (size_t)i * r->Tw : r->bids + (size_t)i * T;
        const int64_t len = r->sbids ? r->slen[i] : r->blen[i];
        mg_status rc =
            mg_vocab_decode(r->ck.vocab, row + pre, (int)(len - pre), s, sizeof s, NULL, &e);
        if (!rc && r->sbids)
            rc = mg_vocab_decode(r->ck.vocab, row, (int)pre, p, sizeof p, NULL, &e);
        if (rc) return mg_fail(err, rc, "--debug-dump-rows: %s", e.message);
        fprintf(r->dump, "%" PRId64 "\t%ld\t%s", r->st.step, r->train.line[r->brows[i]], s);
        fprintf(r->dump, r->sbids ? "\t%s\n" : "\n", r->sbids ? p : "");
    }
    if (fflush(r->dump))
        return mg_fail(err, MG_ERR_IO, "--debug-dump-rows %s: %s", r->c->dump_rows,
                       strerror(errno));
    return MG_OK;
}

/* Mean loss over the first nv validation rows, in batches of B (eval mode);
 * also times the pass (t_val). */
static mg_status validate(run *r, double *loss, mg_error *err) {
    const double tv = mg_now_s();
    const int B = r->s.batch_size;
    const mg_dataset *val = &r->val;
    double sum = 0.0;
    int64_t count = 0;
    /* validation is on the molecules alone: no scaffold prefixes */
    mg_status rc = MG_OK;
    for (size_t r0 = 0; r0 < r->nv && !rc; r0 += (size_t)B) {
        const size_t nb = (r->nv - r0) < (size_t)B ? (r->nv - r0) : (size_t)B;
        size_t i0, i1; /* this rank's rows of the batch (none when nb < ranks) */
        mg_dist_range(nb, r->d->rank, r->d->size, &i0, &i1);
        if (i1 == i0) continue;
        const int32_t *ids = val->ids + (r0 + i0) * (size_t)val->T;
        const int64_t *len = val->lengths + r0 + i0;
        int Tb = mg_trim_batch(ids, len, (int)(i1 - i0), val->T, r->bbuf);
        float l;
        int64_t nt;
        mg_error e;
        const mg_batch bt = {.ids = r->bbuf,
                             .lengths = len,
                             .B = (int)(i1 - i0),
                             .T = Tb,
                             .cond = r->cond.K ? r->cv_val + (r0 + i0) * (size_t)r->cond.K : NULL,
                             .cond_rows = r->cond.K ? (int)(i1 - i0) : 0};
        rc = mg_model_forward(r->ck.model, &bt, 0, 0, &l, &nt, &e);
        if (rc) {
            mg_fail(err, rc, "validation: %s", e.message);
            break;
        }
        sum += (double)l * (double)nt;
        count += nt;
    }
    if ((rc = mg_dist_agree(r->d, rc, err))) return rc;
    double sc[2] = {sum, (double)count};
    mg_dist_sum_f64(r->d, sc, 2);
    *loss = sc[1] > 0 ? sc[0] / sc[1] : NAN;
    r->t_val = mg_now_s() - tv;
    return MG_OK;
}

/* --ema: the validation loss of the averaged weights (res.val_loss_ema),
 * swapped into the model for the pass and back after it. */
static mg_status validate_averaged(run *r, mg_error *err) {
    const size_t P = mg_model_num_params(r->ck.model);
    float *p = mg_model_params(r->ck.model), *keep = malloc(P * sizeof(float));
    mg_status rc =
        keep ? MG_OK : mg_fail(err, MG_ERR_NOMEM, "out of memory for the averaged validation");
    if ((rc = mg_dist_agree(r->d, rc, err))) { /* validate is collective: every rank or none */
        free(keep);
        return rc;
    }
    memcpy(keep, p, P * sizeof(float));
    memcpy(p, r->ck.opt.ema, P * sizeof(float));
    rc = validate(r, &r->res.val_loss_ema, err);
    memcpy(p, keep, P * sizeof(float));
    free(keep);
    char decay[32];
    mg_setting_format(mg_setting_find("ema"), &r->s, decay, sizeof decay);
    if (!rc)
        say(r, "averaged weights (--ema %s): val loss %.4f (the last step's: %.4f)", decay,
            r->res.val_loss_ema, r->res.val_loss);
    return rc;
}

static double avg_step(const run *r) { return r->step_time / (double)r->timed_steps; }

/* A schedule sized from the time limit is re-sized every 2% of it from the
 * average step time so far (the machine's load may change), so that the
 * cosine still ends near the limit; the first sizing comes once CAL steps
 * are timed. */
static void size_schedule(run *r) {
    mg_adamw_config *oc = &r->ck.opt.cfg;
    const int64_t step = r->st.step;
    const double limit = r->c->time_limit;
    if (r->time_sized && step % (oc->total_steps / 50 > CAL ? oc->total_steps / 50 : CAL) == 0) {
        const int64_t vals_left =
            r->s.val_every > 0 && r->nv > 0 ? (oc->total_steps - step) / r->s.val_every : 0;
        const double budget =
            0.97 * (limit - (mg_now_s() - r->t0) - r->t_val) - (double)vals_left * r->t_val;
        int64_t more = budget > 0 ? (int64_t)(budget / avg_step(r)) : 0;
        oc->total_steps = step + (more > 1 ? more : 1);
    }
    if (r->total_known || r->timed_steps < CAL) return;
    const double avg = avg_step(r);
    const double remaining = limit - (mg_now_s() - r->t0) - r->t_val;
    /* validations to come: every val_every steps, or ~10 when auto */
    double budget = 0.97 * remaining, per_step = avg;
    int64_t n_vals = 0; /* auto: up to 10, costing at most 5% of the time */
    if (r->s.val_every > 0 && r->nv > 0) per_step += r->t_val / r->s.val_every;
    if (r->s.val_every < 0 && r->nv > 0 && r->t_val > 0) {
        n_vals = (int64_t)(0.05 * remaining / r->t_val);
        n_vals = n_vals < 1 ? 1 : n_vals > 10 ? 10 : n_vals;
        budget -= (double)(n_vals - 1) * r->t_val; /* the last one is the final validation */
    }
    int64_t more = budget > 0 ? (int64_t)(budget / per_step) : 0;
    oc->total_steps = step + (more > 0 ? more : 0);
    if (oc->total_steps < 1) oc->total_steps = 1;
    if (oc->warmup_steps > oc->total_steps / 2)
        oc->warmup_steps = oc->total_steps / 10 > CAL ? oc->total_steps / 10 : CAL;
    r->total_known = 1;
    r->time_sized = 1;
    if (r->s.val_every < 0) {
        const int64_t k = n_vals > 0 ? (oc->total_steps - step) / n_vals : 0;
        r->s.val_every = n_vals > 0 ? (int)(k < 1 ? 1 : k > INT32_MAX ? INT32_MAX : k) : 0;
    }
    say(r, "schedule: %" PRId64 " steps fit in the time limit (%.0f ms/step), warm-up %" PRId64,
        oc->total_steps, 1e3 * avg, oc->warmup_steps);
}

static double tok_rate(const run *r) {
    return r->step_time > 0 ? r->timed_tokens / r->step_time : 0.0;
}

/* The progress callback after a step that took dt seconds. */
static void report_progress(const run *r, double dt, int last) {
    if (!r->c->log.progress || r->d->rank) return;
    const double t = mg_now_s();
    const int64_t total = r->ck.opt.cfg.total_steps;
    const double avg = r->timed_steps ? avg_step(r) : dt;
    double left = r->total_known ? (double)(total - r->st.step) * avg : NAN;
    if (r->c->time_limit > 0) {
        double tl = r->c->time_limit - (t - r->t0);
        if (!(left <= tl)) left = tl > 0 ? tl : 0;
    }
    const mg_train_progress p = {r->st.step,  r->total_known ? total : 0,
                                 r->loss_ema, r->res.val_loss,
                                 tok_rate(r), t - r->t0,
                                 left,        last};
    r->c->log.progress(r->c->log.user, &p);
}

/* Why the loop stops before the next step, or -1 to go on. */
static int stop_reason(const run *r) {
    if (r->total_known && r->st.step >= r->ck.opt.cfg.total_steps) return MG_STOP_DONE;
    if (r->keep_best && r->patience > 0 && r->since_best >= r->patience) return MG_STOP_PATIENCE;
    if (g_stop_signal) return MG_STOP_SIGNAL;
    if (r->c->stop_after > 0 && r->st.step >= r->c->stop_after) return MG_STOP_AFTER;
    if (r->c->time_limit > 0 && r->timed_steps > 0 &&
        mg_now_s() - r->t0 + avg_step(r) + r->t_val > r->c->time_limit)
        return MG_STOP_TIME;
    return -1;
}

/* stop_reason as rank 0 sees it (its clock decides the time limit), or
 * MG_STOP_SIGNAL when a signal reached any rank. */
static int agreed_stop(const run *r) {
    const int stop = stop_reason(r);
    if (r->d->size <= 1) return stop;
    int64_t v[2] = {r->d->rank == 0 ? stop : INT64_MIN, g_stop_signal};
    mg_dist_max_i64(r->d, v, 2);
    if (v[1] && !g_stop_signal) g_stop_signal = (sig_atomic_t)v[1];
    return v[0] < 0 && v[1] ? MG_STOP_SIGNAL : (int)v[0];
}

/* A schedule sized from the time limit is rank 0's (the others' clocks
 * differ): its length, warm-up and validation interval go to every rank. */
static void share_schedule(run *r) {
    if (r->d->size <= 1) return;
    mg_adamw_config *oc = &r->ck.opt.cfg;
    int64_t v[5] = {oc->total_steps, oc->warmup_steps, r->s.val_every, r->total_known,
                    r->time_sized};
    if (r->d->rank)
        for (int i = 0; i < 5; i++) v[i] = INT64_MIN;
    mg_dist_max_i64(r->d, v, 5);
    oc->total_steps = v[0];
    oc->warmup_steps = v[1];
    r->s.val_every = (int)v[2];
    r->total_known = (int)v[3];
    r->time_sized = (int)v[4];
}

/* Ranks that must hold the same thing: rank 0 says what differs, the
 * others MG_ERR_PEER. */
static mg_status same_on_ranks(run *r, uint64_t x, const char *what, mg_error *err) {
    if (mg_dist_same_u64(r->d, x)) return MG_OK;
    if (r->d->rank) return mg_fail(err, MG_ERR_PEER, "rank 0 failed");
    return mg_fail(err, MG_ERR_MISMATCH, "the %d ranks hold different %s", r->d->size, what);
}

/* A validation of this run into the result's curve (every stride-th; when
 * full, every other entry goes and the stride doubles). */
static void curve_add(run *r, double loss) {
    mg_train_result *q = &r->res;
    if (r->vals_seen++ % q->curve_stride) return;
    if (q->n_curve == MG_CURVE_MAX) {
        for (int i = 0; i < MG_CURVE_MAX / 2; i++) {
            q->curve_step[i] = q->curve_step[2 * i];
            q->curve_loss[i] = q->curve_loss[2 * i];
        }
        q->n_curve = MG_CURVE_MAX / 2;
        q->curve_stride *= 2;
        if ((r->vals_seen - 1) % q->curve_stride) return;
    }
    q->curve_step[q->n_curve] = r->st.step;
    q->curve_loss[q->n_curve++] = loss;
}

/* A scheduled validation (the run's first, every val_every steps, the
 * schedule's end) of loss at this step: a new best, or one more without
 * improvement. keep best: a new best's whole state is copied aside. */
static mg_status note_scheduled(run *r, double loss, mg_error *err) {
    if (!isnan(r->best_val) && !(loss < r->best_val)) {
        r->since_best++;
        return MG_OK;
    }
    r->best_val = loss;
    r->best_step = r->st.step;
    r->since_best = 0;
    if (!r->keep_best) return MG_OK;
    const size_t P = mg_model_num_params(r->ck.model), bytes = P * sizeof(float);
    const mg_adamw *o = &r->ck.opt;
    if (!r->best_p) {
        r->best_p = malloc(bytes);
        r->best_m = malloc(bytes);
        r->best_v = malloc(bytes);
        r->scratch = malloc(bytes);
        r->best_ema = o->ema ? malloc(bytes) : NULL;
        if (!r->best_p || !r->best_m || !r->best_v || !r->scratch || (o->ema && !r->best_ema))
            return mg_fail(err, MG_ERR_NOMEM, "out of memory for the best step's state");
    }
    memcpy(r->best_p, mg_model_params(r->ck.model), bytes);
    memcpy(r->best_m, o->m, bytes);
    memcpy(r->best_v, o->v, bytes);
    if (o->ema) memcpy(r->best_ema, o->ema, bytes);
    r->best_opt_step = o->step;
    r->best_cfg = o->cfg;
    r->best_st = r->st;
    r->best_st.val_loss = loss;
    r->best_dirty = 1;
    return MG_OK;
}

/* keep best at the end: the best step's state becomes the live one. */
static void restore_best(run *r) {
    const size_t bytes = mg_model_num_params(r->ck.model) * sizeof(float);
    mg_adamw *o = &r->ck.opt;
    memcpy(mg_model_params(r->ck.model), r->best_p, bytes);
    memcpy(o->m, r->best_m, bytes);
    memcpy(o->v, r->best_v, bytes);
    if (o->ema) memcpy(o->ema, r->best_ema, bytes);
    o->step = r->best_opt_step;
    o->cfg = r->best_cfg;
    r->st = r->best_st;
}

/* The checkpoint, from rank 0, of parameters every rank holds: the live
 * state, or with keep best the best step's (swapped in for the write). */
static mg_status save(run *r, mg_error *err) {
    const int best = r->keep_best && r->best_p;
    float *p = mg_model_params(r->ck.model);
    const size_t bytes = mg_model_num_params(r->ck.model) * sizeof(float);
    mg_adamw o = r->ck.opt;
    if (best) {
        memcpy(r->scratch, p, bytes);
        memcpy(p, r->best_p, bytes);
        o.m = r->best_m;
        o.v = r->best_v;
        o.ema = r->best_ema;
        o.step = r->best_opt_step;
        o.cfg = r->best_cfg;
    }
    mg_status rc = same_on_ranks(r, mg_model_params_digest(r->ck.model), "parameters", err);
    if (!rc && r->d->rank == 0)
        rc = mg_ckpt_save(r->c->out_path, r->ck.model, r->ck.vocab, &o, &r->s,
                          best ? &r->best_st : &r->st, err);
    if (best) memcpy(p, r->scratch, bytes);
    rc = mg_dist_agree(r->d, rc, err);
    if (!rc && best) r->best_dirty = 0;
    return rc;
}

/* This rank's rows of a global batch -> forward (dropout seed: the step's,
 * every rank; the masks are those of the rows' global indices b0.., so they
 * do not depend on the number of ranks) -> backward
 * -> the gradients and loss of the global batch: each rank's gradient of
 * its mean loss weighted by its share of the batch's target tokens, summed. */
static mg_status step_grads(run *r, float *loss, int64_t *ntok, mg_error *err) {
    mg_model *model = r->ck.model;
    const int sc = r->sbids != NULL; /* rows with scaffold prefixes */
    const int T = sc ? r->Tw : r->all.T, nb = (int)(r->b1 - r->b0);
    const int32_t *ids = (sc ? r->sbids : r->bids) + r->b0 * (size_t)T;
    const int64_t *len = (sc ? r->slen : r->blen) + r->b0;
    const int Tb = mg_trim_batch(ids, len, nb, T, r->bbuf);
    const uint64_t seed = step_seed(r->s.seed, r->st.step);
    mg_batch bt = {.ids = r->bbuf,
                   .lengths = len,
                   .B = nb,
                   .T = Tb,
                   .row0 = r->b0,
                   .loss_prefix = sc ? r->spre + r->b0 : NULL};
    /* conditions: the whole batch's drops (hash of seed, step, row, k), this rank's rows */
    if (r->cond.K) {
        mg_cond_batch(r->cv_train, r->cond.K, r->brows, r->s.batch_size, r->s.condition_drop,
                      ~step_seed(r->s.seed, r->st.step), r->bcond);
        bt.cond = r->bcond + r->b0 * (size_t)r->cond.K;
        bt.cond_rows = nb;
    }
    mg_status rc = mg_model_forward(model, &bt, 1, seed, loss, ntok, err);
    if (!rc) rc = mg_model_backward(model, NULL, 0, err);
    if (r->d->size <= 1 || (rc = mg_dist_agree(r->d, rc, err))) return rc;
    double lt[2] = {(double)*loss * (double)*ntok, (double)*ntok};
    mg_dist_sum_f64(r->d, lt, 2);
    const float w = (float)((double)*ntok / lt[1]);
    float *g = mg_model_grads(model);
    const size_t n = mg_model_num_params(model);
    for (size_t i = 0; i < n; i++) g[i] *= w;
    mg_dist_sum_f32(r->d, g, n);
    *loss = (float)(lt[0] / lt[1]);
    *ntok = (int64_t)lt[1];
    return MG_OK;
}

/* Steps until a stop; validations and periodic checkpoints in between. */
static mg_status loop(run *r, mg_stop_reason *why, double *last_val_at, mg_error *err) {
    mg_model *model = r->ck.model;
    mg_adamw *opt = &r->ck.opt;
    mg_status rc;
    for (;;) {
        const int stop = agreed_stop(r);
        if (stop >= 0) {
            *why = (mg_stop_reason)stop;
            return MG_OK;
        }
        const double ts0 = mg_now_s(), comm0 = r->d->comm_s;
        mg_batcher_next(r->batcher, r->bids, r->blen, r->brows);
        if (r->aug_first && (rc = augment_batch(r, err))) return rc;
        if (r->sbids) scaffold_batch(r);
        if (r->c->dump_rows) { /* rank 0 writes; every rank learns whether it could */
            rc = r->d->rank == 0 ? dump_batch(r, err) : MG_OK;
            if ((rc = mg_dist_agree(r->d, rc, err))) return rc;
        }
        float loss, gnorm, lr;
        int64_t ntok;
        mg_error e;
        /* a non-finite loss ends the run before it updates anything */
        if ((rc = step_grads(r, &loss, &ntok, &e)) ||
            (!isfinite(loss) &&
             (rc = mg_fail(&e, MG_ERR_NUMERIC,
                           "the training loss is %s: the run diverged (try a lower --lr); %s is "
                           "left as it was",
                           isnan(loss) ? "nan" : "inf", r->c->out_path))) ||
            (rc = mg_adamw_step(opt, mg_model_params(model), mg_model_grads(model), &gnorm, &lr,
                                &e)))
            return mg_fail(err, rc, "step %" PRId64 ": %s", r->st.step, e.message);
        r->st.step++;
        const double dt = mg_now_s() - ts0;
        if (r->loss_log) {
            const uint64_t h = /* the batch's row numbers */
                mg_fnv1a(MG_FNV1A_INIT, r->brows, (size_t)r->s.batch_size * sizeof r->brows[0]);
            fprintf(r->loss_log, "%" PRId64 " %.9g %" PRId64 " %.9g %016" PRIx64 "\n", r->st.step,
                    (double)loss, ntok, (double)gnorm, h);
        }
        if (r->st.step - r->start_step > 1) { /* the first step warms caches: not timed */
            r->comm_time += r->d->comm_s - comm0;
            r->step_time += dt;
            r->timed_tokens += (double)ntok;
            r->timed_steps++;
        }
        r->res.tokens += ntok;
        r->res.train_loss = loss;
        r->loss_ema = isnan(r->loss_ema) ? loss : 0.9 * r->loss_ema + 0.1 * loss;
        size_schedule(r);
        share_schedule(r);
        const int last = r->total_known && r->st.step >= opt->cfg.total_steps;
        if (r->s.val_every > 0 && r->nv > 0 && r->st.step % r->s.val_every == 0) {
            if ((rc = validate(r, &r->res.val_loss, err)) ||
                (rc = note_scheduled(r, r->res.val_loss, err)))
                return rc;
            curve_add(r, r->res.val_loss);
            *last_val_at = (double)r->st.step;
            char el[32];
            mg_fmt_duration(mg_now_s() - r->t0, el, sizeof el);
            say(r,
                "step %" PRId64 "/%" PRId64
                ": train loss %.4f, val loss %.4f, lr %.2e, %.0f tok/s, %s",
                r->st.step, r->total_known ? opt->cfg.total_steps : (int64_t)0, r->loss_ema,
                r->res.val_loss, (double)lr, tok_rate(r), el);
        }
        if (r->s.ckpt_every > 0 && r->st.step % r->s.ckpt_every == 0 && !last &&
            (!r->keep_best || r->best_dirty)) { /* keep best: when the best changed */
            r->st.val_loss = r->res.val_loss;
            if ((rc = save(r, err))) return rc;
        }
        report_progress(r, dt, last);
    }
}

/* The validation curve of this run as a table, 6 (step, loss) a line, the
 * kept step marked, and what --out holds. */
static void report_curve(const run *r, mg_stop_reason why) {
    const mg_train_result *q = &r->res;
    if (q->n_curve == 0) return;
    char head[160] = "";
    if (q->curve_stride > 1)
        snprintf(head, sizeof head, ", every %d-th of %" PRId64, q->curve_stride, r->vals_seen);
    say(r, "validation curve (step val-loss%s; * = the state in --out):", head);
    for (int i = 0; i < q->n_curve; i += 6) {
        char line[512] = "";
        for (int k = i; k < q->n_curve && k < i + 6; k++)
            snprintf(line + strlen(line), sizeof line - strlen(line), " %7" PRId64 " %.4f%c",
                     q->curve_step[k], q->curve_loss[k],
                     q->curve_step[k] == q->kept_step ? '*' : ' ');
        say(r, "%s", line);
    }
    if (r->keep_best)
        say(r,
            "keep best: --out holds step %" PRId64 " (val loss %.4f, the lowest scheduled "
            "validation)%s",
            q->kept_step, q->kept_val_loss,
            why == MG_STOP_PATIENCE ? "; stopped after --patience validations without improvement"
                                    : "");
}

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* The data's molecules as written (its rows decoded: the tokeniser's
 * spelling of each line), sorted, into *data [*nd]. */
static mg_status data_strings(run *r, char ***data, size_t *nd, mg_error *err) {
    const mg_dataset *a = &r->all;
    char buf[4096];
    mg_error e;
    mg_status rc = MG_OK;
    *nd = 0;
    *data = malloc((a->n ? a->n : 1) * sizeof **data);
    for (size_t i = 0; *data && i < a->n && !rc; i++) {
        rc = mg_vocab_decode(r->ck.vocab, a->ids + i * (size_t)a->T, (int)a->lengths[i], buf,
                             sizeof buf, NULL, &e);
        if (!rc && !((*data)[(*nd)++] = strdup(buf))) rc = MG_ERR_NOMEM;
    }
    if (!*data || rc)
        return rc == MG_ERR_NOMEM || !rc
                   ? mg_fail(err, MG_ERR_NOMEM, "--check-samples: out of memory")
                   : mg_fail(err, rc, "--check-samples: %s", e.message);
    qsort(*data, *nd, sizeof **data, cmp_str);
    return MG_OK;
}

/* How many of the base model's (--init) molecules on o's draw pass the
 * syntax check, into r->res.check_base_valid. */
static mg_status base_validity(run *r, const mg_sample_opts *o, mg_error *err) {
    mg_train_result *q = &r->res;
    mg_samples base;
    memset(&base, 0, sizeof base);
    mg_error e;
    mg_model_set_threads(r->init, mg_model_threads(r->ck.model));
    mg_status rc = mg_sample(r->init, r->init_vocab ? r->init_vocab : r->ck.vocab, o, &base, &e);
    if (rc) return mg_fail(err, rc, "--check-samples (base model): %s", e.message);
    q->check_base_valid = 0;
    for (size_t i = 0; i < base.n; i++)
        q->check_base_valid +=
            base.ended[i] && base.smiles[i][0] && mg_smiles_syntax_ok(base.smiles[i], NULL, 0);
    mg_samples_free(&base);
    return MG_OK;
}

/* The fine-tuning check's lines: validity against the base model's, copies
 * (nok valid of n sampled). */
static void say_finetune_check(run *r, size_t nok, size_t n) {
    const mg_train_result *q = &r->res;
    /* fine-tuning that stays valid: within MG_FINETUNE_VALID_DROP points
     * of the base's validity, under MG_FINETUNE_COPY_MAX copies */
    const double vf = 100.0 * (double)nok / (double)n,
                 vb = 100.0 * (double)q->check_base_valid / (double)n,
                 cp = 100.0 * (double)q->check_copies / (double)(nok ? nok : 1);
    /* in counts, so that 3.0 points is 3.0 (not a rounding either side) */
    const int drop = 100 * (q->check_base_valid - (int64_t)nok) >=
                     (int64_t)MG_FINETUNE_VALID_DROP * q->check_n,
              copies = 100 * q->check_copies >= (int64_t)MG_FINETUNE_COPY_MAX * (int64_t)nok &&
                       q->check_copies > 0;
    say(r,
        "check: validity %.1f%% fine-tuned vs %.1f%% for %s on the same %" PRId64
        " draws (%+.1f points); copies %.1f%% of the valid samples%s",
        vf, vb, r->c->init_path, q->check_n, vf - vb, cp,
        drop || copies ? ""
                       : ": within the targets (validity less than 3 points below, copies "
                         "under 5%)");
    if (drop || copies)
        say(r,
            "check: warning: %s%s%s. What to change: sample it with --constrain valence "
            "(on 500 quinolines that brought RDKit validity from 5 points below the base "
            "to 1.3 points); train fewer steps (--steps), keep an earlier step (--keep "
            "best, --val-frac), or give more molecules",
            drop ? "validity is 3 points or more below the base model's" : "",
            drop && copies ? "; " : "",
            copies ? "5% or more of the valid samples copy the fine-tuning set" : "");
}

/* check_samples (rank 0): molecules sampled from the kept parameters
 * against the data's molecules as written; the counts go to the result. */
static mg_status sample_check(run *r, mg_error *err) {
    if (r->check_samples <= 0 || r->d->rank) return MG_OK;
    mg_sample_opts o;
    mg_sample_opts_default(&o);
    o.n = (size_t)r->check_samples;
    o.seed = 1;
    mg_samples smp;
    memset(&smp, 0, sizeof smp);
    mg_error e;
    mg_status rc = mg_sample(r->ck.model, r->ck.vocab, &o, &smp, &e);
    if (rc) return mg_fail(err, rc, "--check-samples: %s", e.message);
    char **data = NULL;
    const char **ok = malloc((smp.n ? smp.n : 1) * sizeof *ok);
    size_t nd = 0, nok = 0;
    rc = data_strings(r, &data, &nd, err);
    if (!rc && !ok) rc = mg_fail(err, MG_ERR_NOMEM, "--check-samples: out of memory");
    if (rc) goto out;
    mg_train_result *q = &r->res;
    q->check_n = (int64_t)smp.n;
    for (size_t i = 0; i < smp.n; i++) {
        const char *m = smp.smiles[i];
        if (!smp.ended[i] || !*m || !mg_smiles_syntax_ok(m, NULL, 0)) continue;
        ok[nok++] = m;
        q->check_copies += bsearch(&m, data, nd, sizeof *data, cmp_str) != NULL;
    }
    q->check_valid = (int64_t)nok;
    q->check_base_valid = -1;
    /* the base model's validity on the same draw, for comparison */
    if (r->init && (rc = base_validity(r, &o, err))) goto out;
    qsort(ok, nok, sizeof *ok, cmp_str);
    for (size_t i = 0; i < nok; i++) {
        if (i && !strcmp(ok[i], ok[i - 1])) continue;
        q->check_distinct++;
        q->check_novel += bsearch(&ok[i], data, nd, sizeof *data, cmp_str) == NULL;
    }
    say(r,
        "check: %" PRId64
        " molecules sampled from the kept weights (seed 1, temperature 1): %" PRId64
        " pass the syntax check; %" PRId64 " of those (%.1f%%) copy a molecule of %s as written; "
        "%" PRId64 " distinct, %" PRId64 " of them (%.1f%%) not in it",
        q->check_n, q->check_valid, q->check_copies,
        100.0 * (double)q->check_copies / (double)(nok ? nok : 1), r->s.data_path,
        q->check_distinct, q->check_novel,
        100.0 * (double)q->check_novel / (double)(q->check_distinct ? q->check_distinct : 1));
    if (q->check_base_valid >= 0) say_finetune_check(r, nok, smp.n);
out:
    for (size_t i = 0; data && i < nd; i++) free(data[i]);
    free(data);
    free(ok);
    mg_samples_free(&smp);
    return rc;
}

/* The run's result (the kept step; reached: the last step done) and its
 * closing lines. */
static void finish_result(run *r, int64_t reached, mg_stop_reason why) {
    r->res.keep_best = r->keep_best;
    r->res.kept_step = r->st.step;
    r->res.kept_val_loss = r->keep_best ? r->best_val : r->nv > 0 ? r->res.val_loss : NAN;
    r->st.step = reached;
    r->res.step = r->st.step;
    r->res.total_steps = r->ck.opt.cfg.total_steps;
    r->res.stop = why;
    r->res.seconds = mg_now_s() - r->t0;
    r->res.tokens_per_sec = tok_rate(r);
    r->res.ranks = r->d->size;
    r->res.comm_per_step = r->timed_steps ? r->comm_time / (double)r->timed_steps : 0.0;
    static const char *const what[] = {"finished", "time limit reached", "interrupted",
                                       "stopped as asked", "stopped early"};
    char el[32];
    mg_fmt_duration(r->res.seconds, el, sizeof el);
    say(r,
        "%s at step %" PRId64 "/%" PRId64
        ": train loss %.4f, val loss %.4f, %.0f tok/s, %s; checkpoint %s",
        what[why], r->st.step, r->ck.opt.cfg.total_steps, r->loss_ema, r->res.val_loss,
        r->res.tokens_per_sec, el, r->c->out_path);
    report_curve(r, why);
    if (r->d->size > 1)
        say(r,
            "%d ranks, batch %d split %zu..%zu rows per rank; %.2f ms/step in communication "
            "(%.1f%% of %.1f ms/step)",
            r->d->size, r->s.batch_size, (size_t)r->s.batch_size / (size_t)r->d->size,
            ((size_t)r->s.batch_size + (size_t)r->d->size - 1) / (size_t)r->d->size,
            1e3 * r->res.comm_per_step, r->timed_steps ? 100.0 * r->comm_time / r->step_time : 0.0,
            r->timed_steps ? 1e3 * avg_step(r) : 0.0);
}

mg_status mg_train_run(const mg_train_config *c, mg_train_result *result, mg_error *err) {
    if (!c) return mg_fail(err, MG_ERR_ARG, "train config is NULL");
    run r;
    memset(&r, 0, sizeof r);
    r.c = c;
    r.resuming = c->resume_path != NULL;
    r.t0 = mg_now_s();
    r.alone = (mg_dist){0, 1, 0.0};
    r.d = c->dist ? c->dist : &r.alone;
    r.res.val_loss = r.res.first_val_loss = r.res.val_loss_ema = r.loss_ema = NAN;
    r.res.kept_val_loss = r.best_val = NAN;
    r.res.curve_stride = 1;
    g_stop_signal = 0;
    /* the ranks agree after each phase (one failing ends them all) and then
     * check that they read the same data and built the same model */
    mg_status rc = mg_dist_agree(r.d, setup(&r, err), err);
    if (!rc) rc = mg_dist_agree(r.d, load_data(&r, err), err);
    if (!rc) rc = mg_dist_agree(r.d, load_conditions(&r, err), err);
    if (!rc) rc = mg_dist_agree(r.d, build(&r, err), err);
    if (!rc)
        rc = same_on_ranks(&r, r.st.data_hash, "data (a different file on some machine?)", err);
    if (!rc) rc = same_on_ranks(&r, mg_model_params_digest(r.ck.model), "initial parameters", err);
    if (!rc && r.nv > 0) { /* the initial validation also times one pass */
        rc = validate(&r, &r.res.first_val_loss, err);
        r.res.val_loss = r.res.first_val_loss;
        if (!rc) rc = note_scheduled(&r, r.res.val_loss, err);
        if (!rc) {
            curve_add(&r, r.res.val_loss);
            say(&r, "step %" PRId64 ": val loss %.4f (%zu molecules; unigram entropy %.4f)",
                r.st.step, r.res.first_val_loss, r.nv, r.res.unigram_entropy);
        }
    }
    mg_stop_reason why = MG_STOP_DONE;
    double last_val_at = -1;
    r.start_step = r.st.step;
    if (!rc) rc = loop(&r, &why, &last_val_at, err);
    if (!rc && r.nv > 0 && last_val_at != (double)r.st.step && r.st.step > r.start_step) {
        rc = validate(&r, &r.res.val_loss, err);
        /* the schedule's end is a scheduled validation; a stop elsewhere is
         * not (a run never stopped would not have validated there) */
        if (!rc && why == MG_STOP_DONE) rc = note_scheduled(&r, r.res.val_loss, err);
        if (!rc) curve_add(&r, r.res.val_loss);
    }
    const int64_t reached = r.st.step;
    if (!rc && r.keep_best && r.best_p) restore_best(&r);
    if (!rc && r.nv > 0 && r.ck.opt.ema && why != MG_STOP_SIGNAL) /* a signal: checkpoint at once */
        rc = validate_averaged(&r, err);
    if (!rc) {
        if (!r.keep_best) r.st.val_loss = r.res.val_loss;
        rc = save(&r, err);
    }
    if (!rc) finish_result(&r, reached, why);
    if (!rc) rc = sample_check(&r, err);
    if (result) *result = r.res;
    run_free(&r);
    return rc;
}
