/* molgen checkpoints: what `molgen train` writes and --resume reads.
 *
 * A checkpoint is a model file (model.h: parameters, "config", "vocab")
 * plus
 *   tensors  "optim.m", "optim.v"  F32 [num_params]
 *   metadata "format"="molgen", "optim" (mg_adamw_config JSON incl. the
 *            schedule's total_steps), "train" (mg_train_state as JSON),
 *            "step".
 * Written atomically (mg_st_write). */
#ifndef MG_CHECKPOINT_H
#define MG_CHECKPOINT_H

#include <stddef.h>
#include <stdint.h>

#include "errors.h"

#include "model.h"
#include "optim.h"
#include "tokenizer.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The training state a checkpoint carries besides model and optimizer. */
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
} mg_train_state;

/* Everything a checkpoint holds. */
typedef struct {
    mg_model *model;
    mg_vocab *vocab;
    mg_adamw opt;
    mg_train_state ts;
} mg_ckpt;

mg_status mg_ckpt_save(const char *path, const mg_model *m, const mg_vocab *vocab, const mg_adamw *opt,
                 const mg_train_state *ts, mg_error *err);
mg_status mg_ckpt_load(const char *path, mg_ckpt *ck, mg_error *err);
void mg_ckpt_free(mg_ckpt *c);

#ifdef __cplusplus
}
#endif
#endif /* MG_CHECKPOINT_H */
