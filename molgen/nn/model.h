/* molgen model: a decoder-only transformer over SMILES tokens (GPT-2 layout),
 * forward and backward in C on libattn and OpenBLAS.
 *
 *   x0      = drop(tok_emb[ids] + pos_emb[0..L))                  [B, L, d]
 *   block l = x += drop(MHA(LN1(x)))     causal, key padding, attention dropout
 *             x += drop(MLP(LN2(x)))     fc [4d, d] -> GELU(tanh) -> proj [d, 4d]
 *   logits  = LN_f(x) head.weightᵀ + head.bias                    [B, L, V]
 *
 * Only the valid positions (t < the row's length) are computed: every layer
 * runs on them packed as rows [Rv, d], attention included (the projections
 * are products over the packed rows; the attention itself is libattn's
 * attn_sdpa_varlen_*, each batch row one sequence), so padding costs
 * nothing anywhere.
 *
 * LayerNorm eps 1e-5 (PyTorch's default); GELU is the tanh approximation
 * (GPT-2; torch.nn.functional.gelu(x, approximate="tanh")). The head is not
 * tied to tok_emb. molgen/torch_model.py is the same model in PyTorch.
 *
 * Parameters live in one contiguous float buffer described by a table of
 * named tensors in PyTorch's naming, in this order:
 *   tok_emb.weight [V, d]             pos_emb.weight [ctx_len, d]
 *   blocks.{i}.ln1.weight [d]         blocks.{i}.ln1.bias [d]
 *   blocks.{i}.attn.in_proj_weight [3d, d]   blocks.{i}.attn.in_proj_bias [3d]
 *   blocks.{i}.attn.out_proj.weight [d, d]   blocks.{i}.attn.out_proj.bias [d]
 *   blocks.{i}.ln2.weight [d]         blocks.{i}.ln2.bias [d]
 *   blocks.{i}.mlp.fc.weight [4d, d]  blocks.{i}.mlp.fc.bias [4d]
 *   blocks.{i}.mlp.proj.weight [d, 4d] blocks.{i}.mlp.proj.bias [d]
 *   ln_f.weight [d]  ln_f.bias [d]    head.weight [V, d]  head.bias [V]
 *   cond.weight [K, d]  cond.missing [K, d]     (conditional models only)
 * The four attention tensors of a block are contiguous in
 * attn_mha_weights_from_buffer's order; the gradients buffer has the same
 * layout. Checkpoints are safetensors files with these names (F32), plus the
 * metadata "config" (mg_model_config_to_json) and "vocab" (mg_vocab_to_json).
 *
 * Init (deterministic in the seed; each tensor has its own stream, so a
 * tensor's values do not depend on the sizes of the others): GPT-2's scheme,
 * N(0, 0.02) for embeddings and every linear weight (attention in/out
 * projections included; attn_mha_init's Xavier init is not used), with the
 * two projections that write into the residual stream (attn.out_proj and
 * mlp.proj) scaled by 1/sqrt(2 n_layer); biases 0; LayerNorm weight 1,
 * bias 0.
 *
 * Dropout (training only, probability cfg.dropout for all three kinds):
 * embedding output, both residual branches, and attention weights (libattn's
 * Philox dropout with seed = the forward's dropout seed, offset = block
 * index and dropout_row0 = the global batch row of batch row 0,
 * mg_batch.row0). Embedding/residual masks come from a
 * counter-based hash of (seed, site, element ((global row) * ctx_len +
 * position) * d_model + feature). Every mask is thus a function of (seed,
 * global row, position, feature): not of the padded length, the ranks or
 * the threads.
 *
 * Threads: mg_model_threads() OpenMP threads (the model's own setting). OpenBLAS runs
 * single-threaded inside them (each thread multiplies a slice of the rows),
 * and the varlen attention runs on a team of as many (its work items are
 * (row, head, query block)), so OpenBLAS's own thread pool is never used
 * (on 2 cores its spinning threads and libgomp's starve each other).
 * Results are deterministic for a given thread count (and independent of
 * it except for the row split of the products).
 *
 * Conventions: errors.h (an mg_status, a one-line message in the caller's
 * mg_error). Nothing aborts or prints.
 * A model is not thread-safe: forward/logits/backward use its buffers.
 */
#ifndef MG_MODEL_H
#define MG_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "base/errors.h"
#include "nn/packed_gemm.h"

#include "base/safetensors.h"
#include "chem/tokenizer.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    int n_layer;    /* N blocks, >= 1 */
    int d_model;    /* d, divisible by n_head */
    int n_head;     /* H */
    int ctx_len;    /* positions (rows of pos_emb): the longest input */
    int vocab_size; /* V, specials included */
    float dropout;  /* [0, 1): embedding, residual and attention dropout */
    /* DEBUG ONLY: nonzero builds attention WITHOUT the causal mask, so that
     * tests can show mg_model_causal_guard catching the leak. Stored in the
     * config JSON as "causal": false. */
    int no_causal_mask;
    /* Conditioning (condition.h): K conditions (0: an unconditional model,
     * whose files and numbers are those of molgen before conditioning), and
     * where their embedding is added: 0 every position, 1 position 0 only.
     * In the config JSON as "n_cond" and "cond_bos" when K > 0. */
    int n_cond;
    int cond_bos;
    /* S > 0: trained with scaffold prefixes of up to S tokens (BOS scaffold
     * BOS molecule EOS, the prefix without loss: condition.h), so that
     * sampling may be given a scaffold; ctx_len covers the prefix. No
     * tensor of its own. In the config JSON as "scaffold": S when S > 0. */
    int scaffold;
} mg_model_config;

/* Default architecture for this project's 2-core machines: 4 layers,
 * d_model 128, 4 heads, dropout 0 (0.81M parameters); ctx_len and
 * vocab_size 0 (unset: the trainer takes them from the data). Sized for a
 * two-minute demonstration run; the README gives the measured speed, and the
 * 60-minute recipe of the shipped model (more layers). MolGPT's 8 x 256 also
 * works (mg_model_config_molgpt). */
void mg_model_config_default(mg_model_config *c);
/* MolGPT's architecture: 8 layers, d_model 256, 8 heads, dropout 0.1. */
void mg_model_config_molgpt(mg_model_config *c);
mg_status mg_model_config_check(const mg_model_config *c, mg_error *err);
/* {"n_layer":4,"d_model":128,"n_head":4,"ctx_len":54,"vocab_size":26,
 *  "dropout":0,"causal":true}; returns the length like snprintf. */
int mg_model_config_to_json(const mg_model_config *c, char *out, size_t outlen);
/* Parse the above (all keys but "dropout" and "causal" required; unknown
 * keys are an error) and check the result. */
mg_status mg_model_config_from_json(const char *json, mg_model_config *c, mg_error *err);

/* One named parameter tensor: params[offset .. offset + numel). */
typedef struct {
    const char *name;
    int ndim; /* 1 or 2 */
    int64_t shape[2];
    size_t offset, numel;
    int decay; /* 1: a linear layer's weight matrix (AdamW decays it);
                          0: biases, LayerNorm, embeddings */
} mg_param_info;

typedef struct mg_model mg_model;

/* Allocate a model (parameters zero: call mg_model_init or load weights). */
mg_status mg_model_create(const mg_model_config *c, mg_model **out, mg_error *err);
void mg_model_free(mg_model *m); /* NULL fine */
/* GPT-2 init (see above), deterministic in seed. */
void mg_model_init(mg_model *m, uint64_t seed);

const mg_model_config *mg_model_get_config(const mg_model *m);
/* Threads of the model's parallel loops (and of whatever runs on it: the
 * KV decoder, the trainer's optimizer): n >= 1, or 0 for molgen's default
 * (mg_default_threads: ATTN_NUM_THREADS, else all cores), which a new model
 * starts with. molgen's own count: libattn's global count is not read. */
void mg_model_set_threads(mg_model *m, int n);
int mg_model_threads(const mg_model *m);
/* The dense products' operands: MG_DT_F32 (the default) or MG_DT_BF16
 * (mixed precision: bf16 operands, fp32 accumulation, layers.h); the
 * parameters, gradients, LayerNorm, attention, softmax and loss stay fp32. */
void mg_model_set_dtype(mg_model *m, mg_dtype dt);
mg_dtype mg_model_dtype(const mg_model *m);
/* Inference weights: the dense products' weights packed once in the
 * model's dtype (packed_gemm.h's mg_packed), so that a forward no longer packs W
 * per call (molgen score: one molecule per forward). The forwards then use
 * them (the same arithmetic as mg_matmul_forward for K up to MG_GEMM_KC
 * in bf16; fp32: one FMA per k from 0, then the bias); mg_model_backward
 * refuses (MG_ERR_STATE) until mg_model_unpack_inference, and the
 * parameters must not change meanwhile. mg_model_set_dtype to another
 * dtype drops them. */
mg_status mg_model_pack_inference(mg_model *m, mg_error *err);
void mg_model_unpack_inference(mg_model *m); /* none: nothing */
/* Label smoothing eps in [0, 1) of the training loss (forwards with
 * training != 0): the target distribution is (1 - eps) onehot + eps / V over
 * all V ids, as PyTorch's cross_entropy(label_smoothing=eps). Evaluation
 * forwards and mg_model_logits are unaffected. A new model has 0. */
mg_status mg_model_set_label_smoothing(mg_model *m, float eps, mg_error *err);
/* A call's conditions (mg_batch.cond, cond_rows) for a batch of B rows,
 * checked and copied into *buf [cond_rows, K] (realloc'd; *buf_rows =
 * cond_rows, 0 for none): what the forwards keep for their backward and the
 * decoders (decoder.h) for their steps. MG_ERR_ARG for conditions given to
 * an unconditional model, cond_rows < 0 or not 1 or B, or an infinite value
 * (NaN is "not given"); cond NULL or cond_rows 0: none given. On an error
 * *buf_rows is 0. */
mg_status mg_model_keep_conditions(const mg_model *m, const float *cond, int cond_rows, int B,
                                   float **buf, int *buf_rows, mg_error *err);
/* One row's condition embedding [d] (condition.h) for its values v [K]
 * (normalised, NaN = not given; v NULL: none given, every k takes
 * cond.missing[k]); zero for an unconditional model. The forwards' and the
 * KV decoder's. */
void mg_model_condition_embedding(const mg_model *m, const float *v, float *out);
/* The "condition" metadata (mg_cond_info JSON) a conditional model's file
 * carries: set before saving (copied), NULL for an unconditional model. */
mg_status mg_model_set_condition_meta(mg_model *m, const char *json, mg_error *err);
const char *mg_model_condition_meta(const mg_model *m);
/* Freeze the embeddings (tok_emb, pos_emb and a conditional model's
 * cond.*) and blocks [0, n_blocks) (0 <= n_blocks <= n_layer; 0, a new
 * model's, freezes nothing): the backward leaves their gradients 0 and does
 * no work for them (it stops at block n_blocks' input).
 * mg_model_tensor_frozen: is tensor i one of them; mg_model_frozen_params:
 * how many parameters they hold. */
mg_status mg_model_set_frozen(mg_model *m, int n_blocks, mg_error *err);
int mg_model_frozen(const mg_model *m);
int mg_model_tensor_frozen(const mg_model *m, size_t i);
size_t mg_model_frozen_params(const mg_model *m);
size_t mg_model_num_params(const mg_model *m);
float *mg_model_params(mg_model *m); /* [num_params] */
/* The digest of the parameters' bits (FNV-1a of the float array): the one
 * hash of a model's weights (optimize's state stores its prior's; train's
 * ranks compare theirs). */
uint64_t mg_model_params_digest(mg_model *m);
/* The model's fingerprint (what ranks compare before they split work, so
 * every rank samples or scores the same model): a 64-bit hash of its shape,
 * its parameters' digest (as loaded: averaged or raw), its vocabulary v's
 * tokens and its condition normalisation. Not stored anywhere. */
uint64_t mg_model_fingerprint(mg_model *m, const mg_vocab *v);
float *mg_model_grads(mg_model *m);  /* [num_params], same layout */
size_t mg_model_num_tensors(const mg_model *m);
const mg_param_info *mg_model_tensor(const mg_model *m, size_t i);
const mg_param_info *mg_model_find_tensor(const mg_model *m, const char *name);

/* Vocabulary extension (train --extend-vocab): a new model with new_v >=
 * V ids whose first V are base's (the tokens mg_vocab_extend appends come
 * last), every tensor copied by name, the grown ones (tok_emb.weight,
 * head.weight, head.bias) row by row. q [new_v - V, V] (or NULL): per new
 * token a distribution over base's ids (need not sum to 1; the train
 * command gives base's mean next-token distribution where the token occurs
 * in the data), the new token k's rows:
 *   head.weight  sum_v q_v w_v           (q normalised)
 *   head.bias    sum_v q_v b_v + H(q) - margin - (fp32 rounding of the row)
 *   tok_emb      the mean of base's data-token rows (ids MG_NUM_SPECIAL..V-1)
 * so its logit is q.z + H(q) - margin, and since log sum_v exp z_v >= q.z +
 * H(q) (Gibbs' inequality) at ANY input, its probability is <= e^-margin
 * while it starts where base predicts what it replaces. A token whose q
 * row is all 0 (or q NULL): head.weight 0, head.bias
 * mg_model_new_token_bias(base, margin) (the same bound by Jensen). Either way each new token has
 * probability <= e^-margin at step 0 and every old token's probability is
 * base's times 1 / (1 + s), s <= (new_v - V) e^-margin: unchanged up to
 * rounding for margin >= 17 (fp32's 2^-24). */
mg_status mg_model_extend_vocab(const mg_model *base, int new_v, double margin, const double *q,
                                mg_model **out, mg_error *err);
/* The first id of the tokens a run added (mg_model_extend_vocab sets it to
 * base's V; 0: none, as a new or loaded model): their tok_emb and head
 * rows get their own optimizer spans (checkpoint.h). A checkpoint keeps it
 * for --resume ("new_rows" in its "train" metadata). */
mg_status mg_model_set_new_rows(mg_model *m, int first, mg_error *err);
int mg_model_new_rows(const mg_model *m);
/* The bias above: log V + mean(head.bias) + wbar.beta - |wbar * gamma|_2
 * sqrt(d) - margin (wbar the mean row of head.weight, gamma and beta ln_f's
 * weight and bias), a lower bound of log sum_v exp(logit_v) since LayerNorm's
 * normalised vector has norm <= sqrt(d). In double. */
double mg_model_new_token_bias(const mg_model *m, double margin);

/* One call's inputs: the forwards (mg_model_forward, mg_model_sequence_nll,
 * mg_model_logits) take them as an argument and keep nothing of them on the
 * model beyond what the backward of that forward reads (the conditions).
 *   ids         [B, T]   the forward's rows BOS t1 .. tk EOS PAD.. (data.h
 *                        layout), T - 1 <= ctx_len; for mg_model_logits T is
 *                        L, the input positions (L <= ctx_len)
 *   lengths     [B]      the forward's k + 2, in [2, T]; mg_model_logits':
 *                        valid positions in [1, L] (key padding), or NULL:
 *                        all L (with the causal mask keys after a position
 *                        never matter, so NULL is right for sampling)
 *   cond        [cond_rows, K] or NULL: the conditions of a conditional
 *                        model (mg_model_keep_conditions); cond_rows 1
 *                        applies to every row; NULL: none given (every row
 *                        takes the missing embeddings)
 *   loss_prefix [B] or NULL: row b's first loss_prefix[b] targets (those of
 *                        input positions 0 .. loss_prefix[b] - 1: a scaffold
 *                        prefix, data.h) are inputs only, with no loss and no
 *                        gradient, and not counted in ntok; in
 *                        [0, lengths[b] - 1). Forwards with a loss only.
 *   row0                 global index in [0, 2^31) of batch row 0: row b's
 *                        dropout masks are those of global row row0 + b, so
 *                        a global batch split over the ranks of an mpirun job
 *                        (each rank's rows from its first global index) drops
 *                        what one process with the whole batch drops. Read
 *                        by training forwards only.
 * Zero-initialise it and set what a call uses: the other fields are then
 * none / 0. A bad field is MG_ERR_ARG. */
typedef struct {
    const int32_t *ids;
    const int64_t *lengths;
    int B, T;
    const float *cond;
    int cond_rows;
    const int64_t *loss_prefix;
    int64_t row0;
} mg_batch;

/* Training / evaluation forward on whole rows (mg_batch b above).
 * input = ids[:, 0:T-1], target = ids[:, 1:T]; the loss is the mean
 * cross-entropy (label-smoothed in training, mg_model_set_label_smoothing)
 * over the positions t < lengths[b] - 1 (the non-pad targets) past the
 * row's loss prefix, *ntok (may be NULL) their number; attention uses
 * causal masking and key_lengths = lengths - 1. training != 0 turns dropout
 * on (when cfg.dropout > 0) with masks drawn from dropout_seed and b->row0.
 * The activations (and the conditions' values) are kept for
 * mg_model_backward. */
mg_status mg_model_forward(mg_model *m, const mg_batch *b, int training, uint64_t dropout_seed,
                           float *loss, int64_t *ntok, mg_error *err);

/* Evaluation forward (no dropout, no label smoothing) of the same rows, and
 * per row the summed cross-entropy of its loss targets in nats: nll [B]
 * (double; positions t < lengths[b] - 1 past the row's loss prefix, i.e.
 * without one every token after BOS up to and including EOS, the targets
 * the training loss averages over). For a batch of one, nll[0] /
 * (lengths[0] - 1) is mg_model_forward's evaluation loss up to its float
 * rounding. */
mg_status mg_model_sequence_nll(mg_model *m, const mg_batch *b, double *nll, mg_error *err);

/* Gradients into mg_model_grads (OVERWRITTEN, not accumulated) of the
 * LAST mg_model_forward's loss (its batch, conditions, prefixes, dropout
 * masks): the backward is always of the forward just before it, and fails
 * (MG_ERR_STATE) if there was none since, or another call used the model
 * in between. row_weights [n_weights] or NULL (n_weights 0), n_weights the
 * forward's B, else MG_ERR_ARG: with them the
 * gradient of sum_b w[b] NLL_b (NLL_b row b's summed cross-entropy over its
 * loss positions, as mg_model_sequence_nll; label smoothing still applies
 * in training) instead of the mean loss's; each finite, else MG_ERR_ARG.
 * (molgen optimize: the REINVENT loss's per-molecule factors, optimize.h,
 * which depend on the forward's NLLs.) */
mg_status mg_model_backward(mg_model *m, const float *row_weights, int n_weights,
                            mg_error *err);

/* Inference (no dropout, nothing kept for a backward) of b's rows: ids
 * [B, L] input positions (b->T = L <= ctx_len), e.g. BOS t1 t2 ..., lengths
 * NULL or [B] in [1, L], conditions as above; a loss prefix is refused.
 *   logits  [B, L, V] out; zero at padded positions t >= lengths[b]
 *   attn_weights  optional [n_layer, B, H, L, L]: each block's attention
 *                 probabilities per head (zero at padded queries and keys).
 * Position t's logits predict token t + 1. */
mg_status mg_model_logits(mg_model *m, const mg_batch *b, float *logits, float *attn_weights,
                          mg_error *err);

/* Causal-leak guard: random token rows of length ctx_len; for several cut
 * points t, re-draws every token after t and checks that the logits of
 * positions <= t do not change (max abs difference <= 1e-6; in practice
 * bitwise equal). Returns 0, or MG_ERR_LEAK with e.g. "causal leak:
 * logits at position 3 changed by 2.1e-03 when tokens after position 5
 * changed". Leaves the parameters untouched. */
mg_status mg_model_causal_guard(mg_model *m, uint64_t seed, mg_error *err);

/* ------------------------------------------------------------ files */

/* Fill t[0 .. num_tensors) with the parameter tensors (F32, names and shapes
 * of the table, data pointing into the params buffer) for mg_st_write.
 * Returns the number written, or 0 if cap is too small. */
size_t mg_model_st_tensors(const mg_model *m, mg_st_tensor *t, size_t cap);

/* Create a model from a loaded safetensors file: the "config" metadata and
 * every parameter tensor (names, F32, exact shapes; other tensors, e.g. an
 * optimizer's, are ignored). */
mg_status mg_model_from_st(const mg_st_file *f, mg_model **out, mg_error *err);

/* Write a model file: parameters + metadata format=molgen, config, vocab
 * (vocab may be NULL: no "vocab" key). Atomic (mg_st_write). */
mg_status mg_model_save(const mg_model *m, const mg_vocab *vocab, const char *path, mg_error *err);
/* What mg_model_load found. */
typedef struct {
    int checksummed; /* 1: the file carried tensor checksums (verified); 0: written before
                        molgen stored them */
    int averaged;    /* 1: the parameters are the file's averaged ones ("ema", train --ema) */
} mg_model_file_info;

/* Load a model file or a training checkpoint. The parameters are the
 * file's averaged ones when it has them (a checkpoint of train --ema: the
 * "ema" tensor, checkpoint.h) unless flags has MG_LOAD_RAW (then, like a
 * file without an average, the last step's). *vocab (may be NULL) gets the
 * stored vocabulary (an error if the file has none); *info may be NULL.
 * Every message starts with the path. */
enum { MG_LOAD_RAW = 1 };
mg_status mg_model_load(const char *path, unsigned flags, mg_model **out, mg_vocab **vocab,
                        mg_model_file_info *info, mg_error *err);

#ifdef __cplusplus
}
#endif
#endif /* MG_MODEL_H */
