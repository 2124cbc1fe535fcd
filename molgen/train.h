/* molgen train: the training engine (data -> model -> AdamW), validation,
 * checkpoints and bit-exact resume. No argv and no printing: the settings
 * come in an mg_train_config (train_settings.h declares every one), what a
 * run has to say goes to the config's log callbacks (cmd_train.c draws it).
 *
 * A run: load the SMILES file (data.h), build the vocabulary (or take the
 * checkpoint's), split off val_frac for validation (seeded), check the model
 * with the causal-leak guard, then step: batch (seeded shuffle, epoch by
 * epoch) -> forward -> backward -> clip -> AdamW. Each batch is trimmed to
 * its longest row (pure padding columns are never computed).
 *
 * Checkpoints (checkpoint.h) keep the model, optimizer, the settings marked
 * CKPT / CKPT_NEW / MODEL / OPTIM and the step. Resume restores all of it;
 * the batch stream is re-positioned with mg_batcher_seek(step) and the
 * dropout seed of step s is a hash of (seed, s), so a resumed run continues
 * bit for bit as if never stopped (same thread count, same number of
 * ranks; with another number of ranks it continues from the same step with
 * the same batches, the sums of the gradients in another order).
 *
 * Stopping: after total steps, at the time limit, at stop_after, when
 * patience scheduled validations in a row did not improve on the best
 * (keep best), or when mg_train_request_stop() was called (the
 * SIGINT/SIGTERM handler does): in every case a checkpoint is written first.
 *
 * What --out holds (keep): the last step's state, or (best, the default of
 * a fine-tuning run) the whole state of the step with the lowest loss among
 * the scheduled validations (the run's first, every val_every steps, the
 * schedule's end), also in periodic checkpoints. A resume of such a file
 * continues from that step and, the steps being a function of the step
 * number, retraces the same steps: the scheduled validations and so the
 * best and the patience count come out as in a run never stopped.
 *
 * Resume and the settings given (train_settings.h's resume column): NEW
 * ones apply, SAME ones must equal the checkpoint's (c->given marks the
 * settings a caller gave; unmarked ones are ignored on resume).
 *
 * Errors: errors.h. */
#ifndef MG_TRAIN_H
#define MG_TRAIN_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "dist.h"
#include "errors.h"
#include "model.h"
#include "optim.h"
#include "train_settings.h"

#ifdef __cplusplus
extern "C" {
#endif

/* What a run reports while it trains, through mg_train_log.progress: after
 * every step (the caller decides how often to draw it). */
typedef struct {
    int64_t step;          /* steps done */
    int64_t total_steps;   /* the schedule's; 0 while a time-limited one is sized */
    double loss;           /* training loss, smoothed (EMA 0.9) */
    double val_loss;       /* the last validation (NAN: none yet) */
    double tokens_per_sec; /* non-pad target tokens per second of timed steps */
    double elapsed;        /* seconds since the run started */
    double eta;            /* seconds left (NAN: not known yet) */
    int last;              /* 1 on the run's last step */
} mg_train_progress;

/* Callbacks (any may be NULL): message gets every line a run has to say
 * (the data report, the model, validations, notes, the end; no trailing
 * newline; the data report spans several lines); progress as above. */
typedef struct {
    void (*message)(void *user, const char *text);
    void (*progress)(void *user, const mg_train_progress *p);
    void *user;
} mg_train_log;

/* The settings' C types (kind column of train_settings.h). */
#define MG_CTYPE_STR const char *
#define MG_CTYPE_INT int
#define MG_CTYPE_I64 int64_t
#define MG_CTYPE_U64 uint64_t
#define MG_CTYPE_F64 double
#define MG_CTYPE_F32 float
#define MG_CTYPE_FLAG int
/* A field of its own for RUN and CKPT settings; MODEL and OPTIM ones set a
 * member of model / optim. */
#define MG_DECL_RUN(ctype, field) ctype field;
#define MG_DECL_CKPT(ctype, field) ctype field;
#define MG_DECL_CKPT_NEW(ctype, field) ctype field;
#define MG_DECL_MODEL(ctype, field)
#define MG_DECL_OPTIM(ctype, field)
#define MG_TRAIN_DECL(key, field, kind, cli, arg, def, lo, hi, bounds, save, resume, group, help)  \
    MG_DECL_##save(MG_CTYPE_##kind, field)

/* The number of settings as a constant expression. */
#define MG_TRAIN_COUNT_ONE(...) +1
enum { MG_TRAIN_SETTING_COUNT = 0 MG_TRAIN_SETTINGS(MG_TRAIN_COUNT_ONE) };

typedef struct {
    /* model: vocab_size is always the data's. optim: eps is the default's,
     * total_steps comes from steps (or the time-limit estimate). */
    mg_model_config model;
    mg_adamw_config optim;
    MG_TRAIN_SETTINGS(MG_TRAIN_DECL)
    /* 1: the setting of that index of MG_TRAIN_SETTING was given (the
     * command line marks them; all 0 by default). With --init a MODEL
     * setting given must equal MODEL's (dropout excepted). */
    unsigned char given[MG_TRAIN_SETTING_COUNT];
    mg_train_log log;
    /* The ranks training together (NULL: this process alone). Every rank
     * runs mg_train_run with the same config; each global batch is split
     * by index (consecutive rows in rank order, mg_dist_range), the gradients summed
     * (weighted by the ranks' target tokens: the gradient of the global
     * mean loss), so every rank takes the same AdamW step on the same
     * parameters; validation is split the same way; messages, progress and
     * checkpoints come from rank 0. A failure on any rank ends every rank's
     * run (MG_ERR_PEER on the others). */
    mg_dist *dist;
} mg_train_config;

/* Every setting at its default (train_settings.h; model and optimizer:
 * mg_model_config_default, mg_adamw_config_default), no callbacks. */
void mg_train_config_default(mg_train_config *c);
/* Every setting within its range (a resumed run also checks the ones it
 * takes from the checkpoint when it reads them). */
mg_status mg_train_config_check(const mg_train_config *c, mg_error *err);

typedef enum {
    MG_STOP_DONE = 0,    /* reached total steps */
    MG_STOP_TIME = 1,    /* time limit */
    MG_STOP_SIGNAL = 2,  /* mg_train_request_stop (SIGINT / SIGTERM) */
    MG_STOP_AFTER = 3,   /* stop_after */
    MG_STOP_PATIENCE = 4 /* patience validations without improvement (keep best) */
} mg_stop_reason;

/* Validations a result keeps (more: every other one is dropped, and the
 * stride doubles). */
#define MG_CURVE_MAX 256

typedef struct {
    int64_t step;          /* steps done (including resumed ones) */
    int64_t total_steps;   /* the schedule's */
    double train_loss;     /* mean loss of the last step */
    double val_loss;       /* last validation (NAN if none) */
    double first_val_loss; /* validation before the first step of this run */
    double val_loss_ema;   /* with --ema: the last validation of the averaged weights (NAN: none) */
    double unigram_entropy; /* entropy (nats) of the training targets'
                               token distribution: the loss of the best
                               context-free model, a bound to beat */
    double tokens_per_sec;  /* non-pad target tokens per second of steps */
    double seconds;         /* wall time of this run */
    int64_t tokens;         /* non-pad target tokens trained on in this run */
    mg_stop_reason stop;
    long skipped;          /* data lines skipped at load */
    size_t n_train, n_val; /* molecules */
    int vocab_size, ctx_len;
    int ranks;            /* of the job (1 alone) */
    double comm_per_step; /* seconds per timed step in the ranks' sums (0 alone) */
    /* this run's validations (step, loss), every curve_stride-th one when
     * there were more than MG_CURVE_MAX; the step whose state --out holds
     * (keep best: the best scheduled validation's; last: the last step) */
    int n_curve, curve_stride;
    int64_t curve_step[MG_CURVE_MAX];
    double curve_loss[MG_CURVE_MAX];
    int keep_best;
    int64_t kept_step;
    double kept_val_loss; /* NAN: not validated */
    /* check_samples: molecules sampled from the kept parameters, those that
     * pass mg_smiles_syntax_ok, those equal to a data line's molecule as
     * written (string match), the distinct passing ones and those of them
     * not in the data (0 everywhere: no check) */
    int64_t check_n, check_valid, check_copies, check_distinct, check_novel;
} mg_train_result;

/* Run training as configured. result may be NULL. */
mg_status mg_train_run(const mg_train_config *c, mg_train_result *result, mg_error *err);

/* Ask a running mg_train_run to checkpoint and stop after the current step.
 * Async-signal-safe. mg_train_run clears the request when it starts. */
void mg_train_request_stop(int signo);
/* SIGINT and SIGTERM -> mg_train_request_stop; a second signal of the same
 * kind kills the process as usual. */
void mg_train_install_signal_handlers(void);
/* The signal that stopped the last run (0: none). */
int mg_train_stop_signal(void);

/* Load a checkpoint's parameters and optimizer state (for tests and tools):
 * *model and, if non-NULL, *opt (initialised here; free with mg_adamw_free)
 * and *step. */
mg_status mg_checkpoint_load(const char *path, mg_model **model, mg_adamw *opt, int64_t *step,
                             mg_error *err);

/* ------------------------------------------------------------ the table */

/* The lines of train_settings.h as data, for the code that treats them
 * alike (the command line, --help, the checkpoint's "train" JSON). */
typedef enum {
    MG_KIND_STR,
    MG_KIND_INT,
    MG_KIND_I64,
    MG_KIND_U64,
    MG_KIND_F64,
    MG_KIND_F32,
    MG_KIND_FLAG
} mg_setting_kind;
typedef enum {
    MG_SAVE_RUN,
    MG_SAVE_CKPT,
    MG_SAVE_CKPT_NEW,
    MG_SAVE_MODEL,
    MG_SAVE_OPTIM
} mg_setting_save;
/* Given with --resume (train_settings.h's resume column). */
typedef enum { MG_RESUME_NEW, MG_RESUME_SAME, MG_RESUME_PATH } mg_setting_resume;
enum { MG_CLOSED, MG_OPEN_HI, MG_OPEN_LO, MG_OPEN };

typedef struct {
    const char *key, *cli, *arg, *group, *help;
    mg_setting_kind kind;
    mg_setting_save save;
    mg_setting_resume resume;
    double lo, hi;    /* the range of F64 / F32 values */
    int64_t ilo, ihi; /* the range of INT / I64 values */
    int bounds;       /* MG_CLOSED ... */
    int flag_default; /* a FLAG's default (the option sets the opposite) */
    size_t offset;    /* of the value in mg_train_config */
} mg_setting;

extern const mg_setting MG_TRAIN_SETTING[];
extern const size_t MG_TRAIN_NUM_SETTINGS;

/* NULL if no setting has that key. */
const mg_setting *mg_setting_find(const char *key);
/* Parses a command-line value (decimal integers; finite reals; STR as is,
 * kept by pointer) into c and checks its range; a FLAG takes NULL and gets
 * the opposite of its default. MG_ERR_ARG "bad value 'x' for --cli (an
 * integer in [0, 10])". */
mg_status mg_setting_parse(const mg_setting *s, const char *text, mg_train_config *c,
                           mg_error *err);
/* dst's value of s = src's. */
void mg_setting_copy(const mg_setting *s, mg_train_config *dst, const mg_train_config *src);
/* The value in c within its range? MG_ERR_ARG "key N is not in [lo, hi]". */
mg_status mg_setting_check(const mg_setting *s, const mg_train_config *c, mg_error *err);
/* The value as text ("0.05", "(none)" for a NULL string). */
void mg_setting_format(const mg_setting *s, const mg_train_config *c, char *out, size_t n);
/* The range as text ("an integer in [1, 1024]", "a number in [0, 1)",
 * "a decimal integer in [0, 2^64)", "text"). */
void mg_setting_range(const mg_setting *s, char *out, size_t n);
/* The value as a JSON value (a new reference; NULL when out of memory or a
 * string is not UTF-8), and back (type and range checked; a string is kept
 * by pointer into v). */
json_t *mg_setting_to_json(const mg_setting *s, const mg_train_config *c);
mg_status mg_setting_from_json(const mg_setting *s, const json_t *v, mg_train_config *c,
                               mg_error *err);

#ifdef __cplusplus
}
#endif
#endif /* MG_TRAIN_H */
