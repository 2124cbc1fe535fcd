/* molgen bench: training and sampling throughput of the C implementation.
 *
 *   training   tokens/s of full optimizer steps (mg_model_forward in training
 *              mode + mg_model_backward + mg_adamw_step) on batches of random
 *              tokens, B rows x ctx_len input positions, every position a
 *              real (non-pad) target: tokens = B * ctx_len per step;
 *   sampling   molecules/s (and tokens/s) of mg_sample with the KV-cache
 *              decoder and with the naive one (whole prefix every step).
 * Each figure is the median of --runs timed runs after --warmup untimed
 * ones. Without --model the model is freshly initialised (GPT-2 init) with
 * the MOSES vocabulary (27 ids); its molecules end at random lengths, so
 * compare samplers on a trained model (--model) for realistic lengths.
 * molgen/torch_sample.py and molgen/torch_model.py's bench mode measure
 * the same with PyTorch. */
#ifndef MG_BENCH_H
#define MG_BENCH_H

#ifdef __cplusplus
extern "C" {
#endif

/* Median of x[0..n) (sorts x in place); 0 for n == 0. */
double mg_median(double *x, int n);

/* `molgen bench ...`; argv[0] is "bench". Returns the exit code. */
int cmd_bench(int argc, char **argv);

#ifdef __cplusplus
}
#endif
#endif /* MG_BENCH_H */
