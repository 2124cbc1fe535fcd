/* molgen bench: training and sampling throughput of the C implementation.
 *
 *   training   tokens/s of full optimizer steps (mg_model_forward in training
 *              mode + mg_model_backward + mg_adamw_step) on batches of random
 *              tokens, B rows x ctx_len input positions, every position a
 *              real (non-pad) target: tokens = B * ctx_len per step;
 *   sampling   molecules/s (and tokens/s) of mg_sample with the KV-cache
 *              decoder and with the naive one (whole prefix every step).
 * Both run in the model's dtype (mg_model_set_dtype: fp32, or bf16
 * operands with fp32 accumulation). Each figure is the median of --runs timed runs after --warmup untimed
 * ones. Without --model the model is freshly initialised (GPT-2 init) with
 * the MOSES vocabulary (27 ids); its molecules end at random lengths, so
 * compare samplers on a trained model (--model) for realistic lengths.
 * molgen/torch_sample.py and molgen/torch_model.py's bench mode measure
 * the same with PyTorch. */
#ifndef MG_BENCH_H
#define MG_BENCH_H

#include "base/errors.h"
#include "chem/data.h"
#include "nn/model.h"
#include "gen/sample.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Median of x[0..n) (sorts x in place); 0 for n == 0. */
double mg_median(double *x, int n);

/* The MOSES vocabulary's data tokens (moses_176k.smi's 24), for a fresh
 * model. */
#define MG_MOSES_NUM_TOKENS 24
extern const char *const MG_MOSES_TOKENS[MG_MOSES_NUM_TOKENS];

/* Rates of the timed runs and their summary. */
typedef struct {
    double rate[64]; /* per timed run */
    int runs;
    double median, lo, hi;
    double extra;     /* sampling: mean tokens per molecule; training: loss */
    double tok_rate;  /* sampling: tokens/s (median run's) */
    double flop_rate; /* training: median of the runs' FLOP/s (mg_train_step_flops) */
} mg_bench_result;

/* FLOPs of one training step (forward + backward, AdamW not counted) of a
 * model of config c on B rows of lengths[b] - 1 input positions (data.h
 * rows: lengths[b] = tokens + 2), the count MFU divides by the peak:
 *   6 x the matmul weights per position, 6 (12 n_layer d^2 + V d) (in_proj,
 *       out_proj, mlp fc and proj, head; 2 per weight forward, 4 backward;
 *       embeddings and biases are not matmuls), plus
 *   12 n_layer d per causally visible (query, key) pair, L (L + 1) / 2 in a
 *       row of L positions (L^2 for the debug no_causal_mask config;
 *       Q Kᵀ and P V forward, their four products
 *       backward; the backward's recomputation of Q Kᵀ is not counted). */
double mg_train_step_flops(const mg_model_config *c, const int64_t *lengths, int B);

/* The fp32 FMA peak in GFLOP/s measured on `threads` threads (about 1 s;
 * the loop attn-bench measures, common/fma_peak.h); *isa its instruction
 * set. */
double mg_bench_peak(int threads, const char **isa);

/* Training: runs x steps full optimizer steps (B rows) on random full rows,
 * or (data != NULL) on its batches in order, each cut to its longest row;
 * rates in target tokens/s. runs <= 64. */
mg_status mg_bench_train(mg_model *m, int B, int steps, int warmup, int runs, mg_batcher *data,
                         mg_bench_result *r, mg_error *err);
/* Sampling: mg_sample of n molecules (batch rows, seed 1) per run, in the
 * model's dtype (mg_model_dtype; bf16 needs MG_DECODE_KV); rates in
 * molecules/s, tok_rate in tokens/s, extra tokens per molecule. */
mg_status mg_bench_sample(mg_model *m, const mg_vocab *v, mg_decode_kind kind, int n, int batch,
                          int warmup, int runs, mg_bench_result *r, mg_error *err);

#ifdef __cplusplus
}
#endif
#endif /* MG_BENCH_H */
