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

#include "train/checkpoint.h"
#include "base/dist.h"
#include "base/errors.h"
#include "nn/model.h"
#include "nn/optim.h"
#include "train/train_settings.h"

#ifdef __cplusplus
extern "C" {
#endif

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
    /* fine-tuning (--init, not resumed): the same check_n molecules (seed 1)
     * sampled from MODEL itself, those that pass the syntax check (-1: not
     * checked) */
    int64_t check_base_valid;
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

#ifdef __cplusplus
}
#endif
#endif /* MG_TRAIN_H */
