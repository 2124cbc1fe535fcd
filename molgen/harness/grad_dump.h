/* molgen gradient dump: one forward/backward of a random batch written out,
 * for the PyTorch oracle test (molgen/tests/nn/test_model_torch.py through
 * `molgen debug-grads`).
 *
 * The model: the file at model_path as is, or a fresh one of the given
 * config (GPT-2 init from seed, then every parameter += U(-p/2, p/2) with
 * p = perturb). The batch: batch rows of random tokens, row 0 full length,
 * the others of random lengths, from seed. The file (safetensors): the
 * parameters under their names, their gradients as "grad.<name>", the batch
 * as "batch.ids" I32 [B, T] and "batch.lengths" I64 [B], and metadata
 * format=molgen-debug-grads, config, loss, ntok, label_smoothing, dtype. */
#ifndef MG_GRAD_DUMP_H
#define MG_GRAD_DUMP_H

#include <stddef.h>
#include <stdint.h>

#include "base/errors.h"
#include "nn/model.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    mg_model_config model;  /* for a fresh model */
    const char *model_path; /* NULL: a fresh model */
    int64_t batch;
    uint64_t seed;
    double perturb;
    int threads;           /* 0: molgen's default */
    float label_smoothing; /* > 0: the forward runs in training mode with it
                               (dropout must be 0 for the oracle) */
    int dtype;             /* mg_dtype of the products (mg_model_set_dtype) */
    const char *out;
} mg_grad_dump_opts;

typedef struct {
    float loss;
    int64_t ntok;
    size_t params;
} mg_grad_dump_result;

/* 2 layers, d_model 16, 2 heads, ctx 8, vocab 10; batch 3, seed 1, perturb 0.6. */
void mg_grad_dump_opts_default(mg_grad_dump_opts *o);
mg_status mg_grad_dump(const mg_grad_dump_opts *o, mg_grad_dump_result *r, mg_error *err);

#ifdef __cplusplus
}
#endif
#endif /* MG_GRAD_DUMP_H */
