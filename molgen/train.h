/* molgen train: the training loop (data -> model -> AdamW), validation,
 * progress display, checkpoints and bit-exact resume.
 *
 * A run: load the SMILES file (data.h), build the vocabulary (or take the
 * checkpoint's), split off val_frac for validation (seeded), check the model
 * with the causal-leak guard, then step: batch (seeded shuffle, epoch by
 * epoch) -> forward -> backward -> clip -> AdamW. Each batch is trimmed to
 * its longest row (pure padding columns are never computed).
 *
 * Checkpoint = model file (model.h: parameters + "config" + "vocab") plus
 *   tensors  "optim.m", "optim.v"  F32 [num_params]
 *   metadata "format"="molgen", "optim" (mg_adamw_config JSON incl. the
 *            schedule's total_steps), "train" (JSON: step, seed, batch_size,
 *            val_frac, max_tokens, csv_column, data path, data rows and hash,
 *            val_every, val_max, ckpt_every, val_loss), "step".
 * Resume restores all of it; the batch stream is re-positioned with
 * mg_batcher_seek(step) and the dropout seed of step s is a hash of
 * (seed, s), so a resumed run continues bit for bit as if never stopped
 * (same thread count). Checkpoints are written atomically (mg_st_write).
 *
 * Stopping: after total steps, at the time limit, at stop_after, or when
 * mg_train_request_stop() was called (the SIGINT/SIGTERM handler does): in
 * every case a checkpoint is written first.
 *
 * Errors: 0 or -1 with a one-line message in err[errlen]. Progress goes to
 * the config's log stream (stderr by default); nothing else is printed. */
#ifndef MG_TRAIN_H
#define MG_TRAIN_H

#include <stddef.h>
#include <stdint.h>

#include "errors.h"
#include <stdio.h>

#include "model.h"
#include "optim.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Default token limit per molecule: longer lines are skipped and counted
 * like every other bad line, so that one runaway line cannot set the context
 * length (MOSES molecules have at most 57 tokens). */
#define MG_MAX_TOKENS_DEFAULT 256
/* Longest --time-limit (a year, in seconds): larger values would overflow
 * the step estimates' float -> int64 conversions. */
#define MG_TIME_LIMIT_MAX 3.2e7

typedef struct {
    /* data */
    const char *data_path;  /* .smi or .csv (required for a fresh run; on
                               resume NULL means the checkpoint's path) */
    const char *csv_column; /* NULL: "smiles" */
    double val_frac;        /* 0.05 */
    int max_tokens;         /* MG_MAX_TOKENS_DEFAULT; longer molecules are
                               skipped and counted; 0: no limit */

    /* model: n_layer, d_model, n_head, dropout, no_causal_mask are used;
     * ctx_len 0 = the longest molecule + 1 (BOS + tokens); vocab_size is
     * always the data's. Ignored on resume (the checkpoint's). */
    mg_model_config model;
    /* optimizer; total_steps is replaced by `steps` (or the time-limit
     * estimate). Ignored on resume, except total_steps when steps > 0. */
    mg_adamw_config optim;

    int batch_size;         /* 32 */
    int64_t steps;          /* total optimizer steps of the schedule, counted
                               from step 0 (a resumed run continues to it);
                               0: the checkpoint's on resume, else estimated
                               from time_limit after 10 timed steps and
                               re-sized every 2% of the run from the mean
                               step time (load changes), so the cosine ends
                               at the limit; such a run is not reproducible */
    double time_limit;      /* seconds for this process's run; 0: none;
                               at most MG_TIME_LIMIT_MAX */
    int64_t stop_after;     /* stop once this many steps are done (0: never):
                               an interruption at a chosen step, for tests */
    int val_every;          /* steps between validations (0: only at the end;
                               -1: auto, about 10 per run and for a time-
                               limited run at most 5% of its time) */
    int val_max;            /* validation molecules evaluated (0: all) */
    int ckpt_every;         /* steps between periodic checkpoints (0: none) */
    uint64_t seed;          /* init, split, shuffle and dropout */
    int skip_guard;         /* 1: do not run the causal-leak guard */

    const char *out_path;    /* checkpoint written periodically and at the end */
    const char *resume_path; /* NULL: fresh run */

    FILE *log;       /* progress and messages; NULL: stderr */
    int progress;    /* 1: a progress line (\r-updated on a terminal, one
                        line every ~10 s otherwise); 0: validation lines only */
    int quiet;       /* 1: print nothing at all */
} mg_train_config;

/* Defaults: model mg_model_config_default, optimizer mg_adamw_config_default
 * (lr 2e-3 ...), batch 32, val_frac 0.05, max_tokens MG_MAX_TOKENS_DEFAULT,
 * val_every -1 (auto), val_max 2000, ckpt_every 1000, seed 1, progress 1. */
void mg_train_config_default(mg_train_config *c);

typedef enum {
    MG_STOP_DONE = 0,       /* reached total steps */
    MG_STOP_TIME = 1,       /* time limit */
    MG_STOP_SIGNAL = 2,     /* mg_train_request_stop (SIGINT / SIGTERM) */
    MG_STOP_AFTER = 3       /* stop_after */
} mg_stop_reason;

typedef struct {
    int64_t step;           /* steps done (including resumed ones) */
    int64_t total_steps;    /* the schedule's */
    double train_loss;      /* mean loss of the last step */
    double val_loss;        /* last validation (NAN if none) */
    double first_val_loss;  /* validation before the first step of this run */
    double unigram_entropy; /* entropy (nats) of the training targets'
                               token distribution: the loss of the best
                               context-free model, a bound to beat */
    double tokens_per_sec;  /* non-pad target tokens per second of steps */
    double seconds;         /* wall time of this run */
    int64_t tokens;         /* non-pad target tokens trained on in this run */
    mg_stop_reason stop;
    long skipped;           /* data lines skipped at load */
    size_t n_train, n_val;  /* molecules */
    int vocab_size, ctx_len;
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

#ifdef __cplusplus
}
#endif
#endif /* MG_TRAIN_H */
