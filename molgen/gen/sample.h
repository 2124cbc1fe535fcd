/* molgen sampling: generate SMILES from a trained model.
 *
 * Decoding goes through gen/decoder.h (naive or KV; a row can restart at
 * position 0 while the others continue), so mg_sample keeps every row busy:
 * when a molecule ends, the next one starts in its slot (continuous
 * batching).
 *
 * Token choice (mg_sample_token): PAD and BOS are never sampled; then
 *   temperature == 0            greedy: argmax (ties: lowest id);
 *   otherwise z = logits / temperature, candidates sorted by (z desc, id
 *   asc); top_k > 0 keeps the first top_k; top_p < 1 keeps the shortest
 *   prefix whose probability mass (renormalised over the top-k) reaches
 *   top_p (at least one token); one multinomial draw from the renormalised
 *   rest. top_k == 1 and a tiny top_p are therefore both the greedy argmax.
 * Randomness: molecule i of a run uses its own xoshiro256** stream seeded
 * from (seed, i), so a molecule does not depend on the batch size or on the
 * other molecules' lengths; with the same seed and thread count the output
 * is identical.
 *
 * Constrained sampling (opts.constrain, constrain.h), two methods
 * (opts.method):
 *   MG_CONSTRAIN_REJECT  every token is drawn from the model's own
 *     distribution (temperature, top-k, top-p as unconstrained: the same
 *     uniform from the molecule's stream, so a molecule whose first draw
 *     passes is bitwise the unconstrained one); when the drawn token (or
 *     EOS) fails the level's check on that prefix (mg_token_mask_accepts:
 *     mg_smiles_check's conditions, so no string the check accepts is cut
 *     off) or the molecule reaches ctx_len without EOS, it starts again from
 *     BOS, drawing on from its stream. The molecules that come out are then
 *     exactly the model's samples conditioned on ending by EOS and passing
 *     mg_smiles_check: the valid part of unconstrained sampling. After
 *     MG_SAMPLE_REJECTS restarts (after the first with greedy choices,
 *     temperature 0 or top_k 1, which would repeat it) the molecule is
 *     begun once more under the mask (fallback bit MG_FALLBACK_MASKED,
 *     counted in masked).
 *   MG_CONSTRAIN_MASK  before each draw the logits of tokens that cannot
 *     lead to a string passing the level's rules are set to -inf, so each
 *     step is renormalised over the allowed tokens (not the model's
 *     distribution conditioned on validity: a prefix that derails is kept
 *     alive); no allowed token means MG_ERR_STATE with the molecule's
 *     prefix. When the mask's Kekulé look-ahead leaves no token (a dead end)
 *     the molecule starts again from BOS, drawing on from its own stream;
 *     after MG_SAMPLE_RESTARTS of them the check is dropped at the next dead
 *     end (fallback bit MG_FALLBACK_KEKULE, counted in fallbacks).
 * Either way the draws' random numbers come from the molecule's stream, so
 * the output does not depend on threads, batch or ranks.
 *
 * Generation stops at EOS or when a row has ctx_len tokens after BOS
 * (scaffold prefix included: the longest the model has positions for);
 * such a molecule is kept as generated and counted in truncated.
 *
 * Conventions: errors.h; nothing aborts or prints.
 */
#ifndef MG_SAMPLE_H
#define MG_SAMPLE_H

#include <stddef.h>
#include <stdint.h>

#include "base/dist.h"
#include "base/errors.h"
#include "nn/packed_gemm.h"

#include "nn/model.h"
#include "chem/smiles_check.h" /* mg_constrain */
#include "chem/tokenizer.h"
#include "gen/decoder.h"

#ifdef __cplusplus
extern "C" {
#endif

/* mg_sample_token / mg_argmax_token: no token can be chosen. */
#define MG_NO_TOKEN (-1)

/* ------------------------------------------------------------ RNG */

/* xoshiro256** (Blackman & Vigna), seeded through splitmix64. */
typedef struct {
    uint64_t s[4];
} mg_rng;

/* Seed stream `stream` of `seed` (distinct streams are independent). */
void mg_rng_seed(mg_rng *r, uint64_t seed, uint64_t stream);
uint64_t mg_rng_next(mg_rng *r);
/* Uniform in [0, 1), 53 random bits. */
double mg_rng_uniform(mg_rng *r);

/* ------------------------------------------------------------ token choice */

typedef struct {
    float temperature; /* >= 0; 0 = greedy */
    int top_k;         /* >= 0; 0 = no limit */
    float top_p;       /* (0, 1]; 1 = no limit */
} mg_sampling;

/* temperature 1, top_k 0, top_p 1: plain multinomial sampling. */
void mg_sampling_default(mg_sampling *s);
mg_status mg_sampling_check(const mg_sampling *s, mg_error *err);

/* Choose the next token from logits[V] (V > MG_NUM_SPECIAL) as described
 * above. Returns the id (>= 0), or MG_NO_TOKEN if no allowed logit is
 * finite (NaN weights). rng may be NULL for greedy choices. */
int mg_sample_token(const float *logits, int V, const mg_sampling *s, mg_rng *rng);

/* Argmax over the allowed ids (not PAD, not BOS), ties to the lowest id;
 * MG_NO_TOKEN if none is finite. */
int mg_argmax_token(const float *logits, int V);

/* ------------------------------------------------------------ sampling */

/* How constrained sampling keeps to the rules (above). */
typedef enum { MG_CONSTRAIN_MASK = 0, MG_CONSTRAIN_REJECT = 1 } mg_constrain_method;

/* The default of molgen sample and optimize (mg_sample_opts_default):
 * rejection keeps the model's distribution (docs/molgen.md, "Constrained
 * sampling": the KL score of the ZINC prior's samples); masking keeps
 * molecules that derail (longer and heavier than the model's). */
#define MG_CONSTRAIN_METHOD_DEFAULT MG_CONSTRAIN_REJECT

/* "mask" / "reject"; parse returns 1 and sets *out, or 0. */
const char *mg_constrain_method_name(mg_constrain_method k);
int mg_constrain_method_parse(const char *s, mg_constrain_method *out);

typedef struct {
    size_t n;  /* molecules to generate */
    int batch; /* rows decoded together (slots), >= 1 */
    mg_decode_kind kind;
    mg_dtype dtype; /* KV decoding's products and cache: MG_DT_F32 or MG_DT_BF16 (kv_decode.h);
                       the naive decoder is fp32 only */
    mg_sampling sampling;
    uint64_t seed;
    mg_constrain constrain; /* NONE: the model's distribution as it is;
                               SYNTAX / VALENCE: renormalised over the tokens
                               the mask allows (constrain.h) */
    mg_constrain_method method; /* with constrain: REJECT or MASK (above) */
    /* A conditional model's request (condition.h): condition [n_cond]
     * normalised values (NaN: not given), NULL: none (the missing
     * embeddings). guidance w: 0 or 1 samples from the conditional logits
     * c; otherwise classifier-free guidance, u + w (c - u) with u the
     * logits with no condition given (each row decoded twice). */
    const float *condition;
    float guidance;
    /* A scaffold model's prefix (model config "scaffold", data.h): scaffold
     * [scaffold_len] token ids (no specials), fed after BOS and followed by
     * a second BOS, each molecule sampled after it (its tokens and string
     * exclude the prefix; --constrain applies to the molecule). NULL / 0:
     * none (an unconditioned molecule). */
    const int32_t *scaffold;
    int scaffold_len;
    /* The ranks sampling together (NULL: alone): each rank generates its
     * consecutive part (mg_dist_range; molecule k always from stream k), rank 0
     * gets all n in order, the other ranks none (out->n 0). Collective. */
    mg_dist *dist;
    /* Nonzero *stop (e.g. &mg_stop_signal, errors.h) ends the sampling at
     * the next step: MG_ERR_INTERRUPTED, nothing returned. NULL: never. */
    const volatile sig_atomic_t *stop;
} mg_sample_opts;

/* n 1000, batch 64, KV cache, default sampling, seed 0, unconstrained
 * (method MASK where constrain is set). */
void mg_sample_opts_default(mg_sample_opts *o);

typedef struct {
    size_t n;
    char **smiles;        /* n decoded strings (owned; "" if EOS came first) */
    int *ntok;            /* n: tokens before EOS (or ctx_len if truncated) */
    unsigned char *ended; /* n: 1 ended by EOS, 0 truncated at ctx_len */
    size_t truncated;     /* molecules without EOS */
    /* constrained sampling (above): per molecule, the times it started
     * again from BOS (rejected draws, Kekulé dead ends), and its fallback
     * bits: MG_FALLBACK_MASKED (rejection gave up after MG_SAMPLE_REJECTS:
     * masked from then on), MG_FALLBACK_KEKULE (the mask's Kekulé check
     * dropped after MG_SAMPLE_RESTARTS dead ends: its string may fail
     * kekulisation); the sums over the molecules: restarts, and the
     * molecules with each bit */
    int *restarts;
    unsigned char *fallback;
    size_t restarts_total, fallbacks, masked;
    int64_t tokens;       /* sum of ntok (+1 per EOS) */
    double seconds;       /* wall time of the generation */
    /* private: */
    char *blob_;
} mg_samples;

/* Kekulé dead ends (constrain.h) a masked molecule restarts at before the
 * check is dropped for it. */
#define MG_SAMPLE_RESTARTS 100
/* Rejected draws a molecule restarts at before it is masked instead. */
#define MG_SAMPLE_REJECTS 1000
#define MG_FALLBACK_KEKULE 1
#define MG_FALLBACK_MASKED 2

/* Generate o->n molecules. */
mg_status mg_sample(mg_model *m, const mg_vocab *v, const mg_sample_opts *o, mg_samples *out,
                    mg_error *err);
void mg_samples_free(mg_samples *s); /* zeroes it; NULL fine */
/* A sample set as bytes for the ranks to exchange: per molecule
 * [ended: 1 byte][fallback: 1 byte][restarts: int32][ntok: int32][SMILES, NUL]. pack: *buf (malloc'd, the
 * caller frees) of *bytes; unpack: the n molecules of buf[0..bytes) into
 * out (freed first; tokens and truncated counted), MG_ERR_STATE when they are not there. */
mg_status mg_samples_pack(const mg_samples *s, char **buf, size_t *bytes, mg_error *err);
mg_status mg_samples_unpack(const char *buf, size_t bytes, size_t n, mg_samples *out,
                            mg_error *err);

#ifdef __cplusplus
}
#endif
#endif /* MG_SAMPLE_H */
