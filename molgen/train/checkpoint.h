/* molgen checkpoints: what `molgen train` writes and --resume reads.
 *
 * A checkpoint is a model file (model.h: parameters, "config", "vocab")
 * plus
 *   tensors  "optim.m", "optim.v"  F32 [num_params]
 *            "ema"  F32 [num_params], with the "ema" setting (--ema): the
 *            averaged parameters in the parameters' layout (what
 *            mg_model_load gives inference unless asked for the raw ones)
 *   metadata "format"="molgen", "optim" (mg_adamw_config JSON incl. the
 *            schedule's total_steps), "train" (JSON: the CKPT and CKPT_NEW
 *            settings of train_settings.h under their keys, and the run's
 *            state: step, data_rows, data_hash, val_loss, and for a run
 *            initialised from a model (--init, kept under "init")
 *            init_crc32), "step".
 * Written atomically (mg_st_write). Files of every earlier molgen that wrote
 * "train" load: a CKPT_NEW setting they lack takes its default.
 *
 * Values: every parameter, moment and average is finite and every second
 * moment (optim.v) >= 0. Each load path checks this (mg_ckpt_load for
 * --resume; mg_model_load for sample, score, attention, bench, --init, with
 * or without --raw) and mg_ckpt_save refuses to write a checkpoint that
 * breaks it, so a diverged run keeps its last good file. */
#ifndef MG_CHECKPOINT_H
#define MG_CHECKPOINT_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "base/errors.h"
#include "nn/model.h"
#include "nn/optim.h"
#include "base/safetensors.h"
#include "nn/ckpt_values.h"
#include "chem/tokenizer.h"
#include "train/train_settings.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Where a run stands, besides its settings, model and optimizer. */
typedef struct {
    int64_t step;        /* optimizer steps done */
    uint64_t data_rows;  /* molecules kept from the data file */
    uint64_t data_hash;  /* FNV-1a of their ids and lengths: the same data on resume */
    double val_loss;     /* the last validation loss (NAN: none) */
    uint32_t init_crc32; /* with settings.init (fine-tuning): the CRC-32 of MODEL's parameters,
                            F32 in the tensor table's order (model.h) */
    int new_rows;        /* --extend-vocab: the first added token id (mg_model_new_rows; 0: none) */
} mg_train_state;

/* Everything a checkpoint holds. settings has the saved settings (CKPT,
 * CKPT_NEW) and the defaults elsewhere; its strings point into train_json,
 * which the checkpoint owns. */
typedef struct {
    mg_model *model;
    mg_vocab *vocab;
    mg_adamw opt;
    mg_train_config settings;
    mg_train_state state;
    json_t *train_json;
} mg_ckpt;

/* Writes the checkpoint; refused (MG_ERR_NUMERIC, nothing written, path as
 * it was) when a value breaks the rules above. */
mg_status mg_ckpt_save(const char *path, const mg_model *m, const mg_vocab *vocab,
                       const mg_adamw *opt, const mg_train_config *settings,
                       const mg_train_state *state, mg_error *err);
mg_status mg_ckpt_load(const char *path, mg_ckpt *ck, mg_error *err);
void mg_ckpt_free(mg_ckpt *c);

/* Load a checkpoint's parameters and optimizer state (for tests and tools):
 * *model and, if non-NULL, *opt (initialised here; free with mg_adamw_free)
 * and *step. */
mg_status mg_checkpoint_load(const char *path, mg_model **model, mg_adamw *opt, int64_t *step,
                             mg_error *err);

/* An AdamW for m's parameters (mg_adamw_init with the model's tensors as
 * spans, weight decay on its weight matrices, m's frozen tensors
 * (mg_model_tensor_frozen) frozen; rows of new tokens (mg_model_new_rows,
 * train --extend-vocab) of tok_emb and head spans of their own stepping at
 * MG_NEW_ROWS_LR_MULT times the learning rate). */
#define MG_NEW_ROWS_LR_MULT 100.0f
mg_status mg_ckpt_optimizer(const mg_model *m, const mg_adamw_config *c, mg_adamw *opt,
                            mg_error *err);

#ifdef __cplusplus
}
#endif
#endif /* MG_CHECKPOINT_H */
