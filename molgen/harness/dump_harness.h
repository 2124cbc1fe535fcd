/* The pieces the gradient dumps share (grad_dump.h for `molgen
 * debug-grads`, dap_dump.h for `molgen debug-dap`): one random stream, a
 * perturbation of a model's parameters, a random batch, the gradient
 * tensors' table. Both dumps feed float64 oracles in PyTorch
 * (molgen/tests/nn/test_model_torch.py, test_optimize.py), which read the
 * batch from the file, so only its shape is a contract:
 *
 *   stream        splitmix64 from seed ^ 0x5DEECE66D (mg_dump_stream)
 *   perturbation  every parameter += U(-p/2, p/2), one draw each in order
 *   batch [B, T]  row 0 full length (T), row b > 0 of 2 + U{0..T-2}
 *                 positions: BOS, random data tokens, EOS, then PAD */
#ifndef MG_DUMP_HARNESS_H
#define MG_DUMP_HARNESS_H

#include <stddef.h>
#include <stdint.h>

#include "base/safetensors.h"
#include "nn/model.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The random stream of a dump with this seed. */
uint64_t mg_dump_stream(uint64_t seed);

/* m's parameters += U(-p/2, p/2), drawn from *s. */
void mg_dump_perturb(mg_model *m, uint64_t *s, double p);

/* ids [B, T] and len [B] as above, for a vocabulary of V tokens, drawn
 * from *s. */
void mg_dump_random_batch(int32_t *ids, int64_t *len, int B, int T, int V, uint64_t *s);

/* t[0..nt) = m's gradients as "grad.<name>" (names [nt]: their storage),
 * nt = mg_model_num_tensors(m), in the parameters' order and shapes. */
void mg_dump_grad_tensors(mg_model *m, mg_st_tensor *t, char (*names)[96]);

#ifdef __cplusplus
}
#endif
#endif /* MG_DUMP_HARNESS_H */
