/* molgen constrain: see constrain.h. */
#include "chem/constrain.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct mg_token_mask {
    const mg_vocab *v;
    int V, rows, ctx;
    mg_smiles_state **row;  /* rows parsers */
    mg_smiles_state *trial; /* scratch: a row's parser plus one candidate */
    int32_t *ids;           /* [rows, ctx] tokens so far (messages) */
};

mg_status mg_token_mask_new(const mg_vocab *v, int rows, int ctx, mg_constrain level,
                            mg_token_mask **out, mg_error *err) {
    if (!v || !out)
        return mg_fail(err, MG_ERR_ARG, "token mask: vocabulary and out must be non-NULL");
    *out = NULL;
    if (level != MG_CONSTRAIN_SYNTAX && level != MG_CONSTRAIN_VALENCE)
        return mg_fail(err, MG_ERR_ARG, "token mask: level '%s' masks nothing",
                       mg_constrain_name(level));
    if (mg_vocab_size(v) > MG_TOKEN_MASK_VMAX)
        return mg_fail(err, MG_ERR_ARG, "token mask: %d tokens, at most %d", mg_vocab_size(v),
                       MG_TOKEN_MASK_VMAX);
    if (rows < 1 || ctx < 1)
        return mg_fail(err, MG_ERR_ARG, "token mask: %d rows of %d tokens", rows, ctx);
    mg_token_mask *m = calloc(1, sizeof *m);
    if (!m) return mg_fail(err, MG_ERR_NOMEM, "token mask: out of memory");
    m->v = v;
    m->V = mg_vocab_size(v);
    m->rows = rows;
    m->ctx = ctx;
    m->row = calloc((size_t)rows, sizeof *m->row);
    m->ids = malloc((size_t)rows * (size_t)ctx * sizeof *m->ids);
    mg_status rc = m->row && m->ids ? 0 : mg_fail(err, MG_ERR_NOMEM, "token mask: out of memory");
    for (int r = 0; r < rows && !rc; r++) rc = mg_smiles_state_new(ctx, level, &m->row[r], err);
    if (!rc) rc = mg_smiles_state_new(ctx, level, &m->trial, err);
    if (rc) {
        mg_token_mask_free(m);
        return rc;
    }
    *out = m;
    return 0;
}

void mg_token_mask_free(mg_token_mask *m) {
    if (!m) return;
    if (m->row)
        for (int r = 0; r < m->rows; r++) mg_smiles_state_free(m->row[r]);
    free(m->row);
    mg_smiles_state_free(m->trial);
    free(m->ids);
    free(m);
}

void mg_token_mask_reset_row(mg_token_mask *m, int r) { mg_smiles_state_reset(m->row[r]); }

/* Does row r accept token t and stay viable? 3: and the estimated ending
 * still fits before ctx (EOS at a position < ctx: tokens + still needed <=
 * ctx - 1) and the aromatic atoms may still be kekulised, 2: only the
 * first two, 1: only without the length estimate, 0: no. */
static int allows(mg_token_mask *m, int r, int t) {
    const char *tok = mg_vocab_token(m->v, t);
    mg_smiles_state_copy(m->trial, m->row[r]);
    if (!mg_smiles_state_push(m->trial, tok, (int)strlen(tok), NULL, 0)) return 0;
    if (!mg_smiles_state_viable(m->trial)) return 0;
    if (mg_smiles_state_tokens(m->trial) + mg_smiles_state_min_tokens(m->trial) > m->ctx - 1)
        return 1;
    return mg_smiles_state_kekule(m->trial, 0) ? 3 : 2;
}

int mg_token_mask_apply(mg_token_mask *m, int r, float *logits, int fallback) {
    unsigned char lvl[MG_TOKEN_MASK_VMAX];
    int best = 0;
    for (int t = 0; t < m->V; t++) {
        if (t == MG_PAD || t == MG_BOS)
            lvl[t] = 0;
        else if (t == MG_EOS)
            lvl[t] = !mg_smiles_state_end(m->row[r], NULL, 0) ? 0
                     : mg_smiles_state_kekule(m->row[r], 1) ? 3
                                                            : 2;
        else
            lvl[t] = (unsigned char)allows(m, r, t);
        if (lvl[t] > best) best = lvl[t];
    }
    /* the length estimate is an estimate: when it leaves nothing, the
     * molecule goes on under the rules and may end without EOS at ctx_len
     * (counted as truncated) rather than stop the run. The Kekulé check
     * assumes more of the future than can always come (it is permissive),
     * so it can leave nothing after a prefix it let through: a dead end,
     * which the caller answers by restarting the molecule, or (fallback)
     * the step goes on without it */
    if (best == 2 && !fallback) return -1;
    int left = 0;
    for (int t = 0; t < m->V; t++) {
        if (best && lvl[t] == best)
            left++;
        else
            logits[t] = -INFINITY;
    }
    return left;
}

int mg_token_mask_accepts(mg_token_mask *m, int r, int t) {
    if (t == MG_EOS) return mg_smiles_state_end(m->row[r], NULL, 0) && mg_smiles_state_kekule(m->row[r], 1);
    const char *tok = t >= MG_NUM_SPECIAL && t < m->V ? mg_vocab_token(m->v, t) : NULL;
    if (!tok) return 0;
    mg_smiles_state_copy(m->trial, m->row[r]);
    return mg_smiles_state_push(m->trial, tok, (int)strlen(tok), NULL, 0) &&
           mg_smiles_state_viable(m->trial) && mg_smiles_state_kekule(m->trial, 0);
}

mg_status mg_token_mask_push(mg_token_mask *m, int r, int t, mg_error *err) {
    const char *tok = mg_vocab_token(m->v, t);
    if (t < MG_NUM_SPECIAL || !tok)
        return mg_fail(err, MG_ERR_ARG, "token mask: id %d is not a data token", t);
    const int k = mg_smiles_state_tokens(m->row[r]);
    char why[160];
    if (k >= m->ctx || !mg_smiles_state_push(m->row[r], tok, (int)strlen(tok), why, sizeof why))
        return mg_fail(err, MG_ERR_ARG, "token mask: '%s' refused: %s", tok,
                       k >= m->ctx ? "context full" : why);
    m->ids[(size_t)r * m->ctx + k] = t;
    return 0;
}

void mg_token_mask_prefix(const mg_token_mask *m, int r, char *out, size_t n) {
    if (!n) return;
    out[0] = '\0';
    mg_vocab_decode(m->v, m->ids + (size_t)r * m->ctx, mg_smiles_state_tokens(m->row[r]), out, n,
                    NULL, NULL);
}
