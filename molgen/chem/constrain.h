/* molgen constrain: the token mask of grammar-constrained sampling.
 *
 * One mask step per row and position, independent of how the logits were
 * made (unconditional or conditioned sampling call the same three
 * functions): before a row's token is drawn, mg_token_mask_apply sets the
 * logits of every token that cannot lead to a string passing the row's
 * level (smiles_check.h: MG_CONSTRAIN_SYNTAX / VALENCE) to -INFINITY, so the
 * softmax, temperature, top-k and top-p that follow renormalise the model's
 * distribution over the allowed tokens; after the draw, mg_token_mask_push
 * advances the row. A token is allowed when the row's parser accepts it,
 * the open ring bonds can still close afterwards
 * (mg_smiles_state_viable), and the tokens still needed to end fit in the
 * model's context (so the molecule can reach EOS before ctx_len; when
 * that estimate leaves no token, the tokens the other rules allow are
 * kept and the molecule may end at ctx_len without EOS); EOS is allowed
 * when the string may end (mg_smiles_state_end). At level VALENCE the
 * tokens (and EOS) after which the aromatic atoms can still be kekulised
 * (mg_smiles_state_kekule) are the only ones allowed; when that check
 * leaves none (it assumes more of the future than can always come) the
 * molecule is at a dead end (mg_token_mask_apply). PAD and BOS are never
 * allowed.
 *
 * Conventions: errors.h; nothing aborts or prints.
 */
#ifndef MG_CONSTRAIN_H
#define MG_CONSTRAIN_H

#include <stdint.h>

#include "base/errors.h"
#include "chem/smiles_check.h"
#include "chem/tokenizer.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mg_token_mask mg_token_mask;

/* Largest vocabulary a mask takes. */
#define MG_TOKEN_MASK_VMAX 4096

/* A mask for `rows` rows of at most ctx tokens over vocabulary v (which
 * must outlive it); level SYNTAX or VALENCE (MG_ERR_ARG otherwise). */
mg_status mg_token_mask_new(const mg_vocab *v, int rows, int ctx, mg_constrain level,
                            mg_token_mask **out, mg_error *err);
void mg_token_mask_free(mg_token_mask *m); /* NULL fine */
/* Row r starts a new molecule. */
void mg_token_mask_reset_row(mg_token_mask *m, int r);
/* Mask logits[V] of row r's next token. Returns the number of tokens left
 * (0: none can follow; the caller reports it as an error), or, when the
 * Kekulé check leaves no token the other rules allow (a dead end: its
 * look-ahead let through a prefix no kekulisable string follows) and
 * fallback is 0, -1 with logits untouched: the caller restarts the
 * molecule. With fallback 1 a dead end keeps the tokens the other rules
 * allow (the string then fails the Kekulé check). */
int mg_token_mask_apply(mg_token_mask *m, int r, float *logits, int fallback);
/* Row r appends token id t (not EOS). MG_ERR_ARG if the rules refuse it
 * (a token that apply masked). */
mg_status mg_token_mask_push(mg_token_mask *m, int r, int t, mg_error *err);
/* Rejection sampling's test (sample.h, MG_CONSTRAIN_REJECT): 1 if row r's
 * string may go on with data token t (the parser accepts it, the string
 * stays viable and passes mg_smiles_state_kekule(s, 0)) or, t == MG_EOS,
 * may end here (mg_smiles_state_end and the final Kekulé check): exactly
 * the conditions mg_smiles_check puts on each prefix and on the end, with
 * no length estimate; 0 otherwise (PAD, BOS). The row is not advanced. */
int mg_token_mask_accepts(mg_token_mask *m, int r, int t);
/* The string row r has so far, for messages: at most n - 1 bytes. */
void mg_token_mask_prefix(const mg_token_mask *m, int r, char *out, size_t n);

#ifdef __cplusplus
}
#endif
#endif /* MG_CONSTRAIN_H */
