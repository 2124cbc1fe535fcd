/* molgen checkpoints' value rules, below the model and the checkpoint
 * (both load files that hold the optimizer state and the average): every
 * parameter, moment and average is finite and every second moment
 * ("optim.v") >= 0 (checkpoint.h says where each is checked). */
#ifndef MG_CKPT_VALUES_H
#define MG_CKPT_VALUES_H

#include <stddef.h>

#include "base/errors.h"
#include "base/safetensors.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The n F32 values at data (any alignment) of the tensor `name`: finite,
 * and >= 0 when name is "optim.v". MG_ERR_NUMERIC naming the tensor and its
 * first bad element, e.g. "tensor 'optim.v' holds a negative value (-0.5 at
 * element 17): a second moment must be >= 0". */
mg_status mg_ckpt_check_values(const char *name, const void *data, size_t n, mg_error *err);
/* The training state of a file for P parameters: those of "optim.m",
 * "optim.v" and "ema" it holds are F32 [P] with values as above (the
 * message then ends "...: the optimizer state is corrupt"). */
mg_status mg_ckpt_check_state(const mg_st_file *f, size_t P, mg_error *err);

#ifdef __cplusplus
}
#endif
#endif /* MG_CKPT_VALUES_H */
