/* molgen optimize: the run's molecules (see opt_state.h). */
#define _POSIX_C_SOURCE 200809L
#include "rl/opt_state.h"

#include <math.h>
#include <stdlib.h>

void mg_opt_mol_clear(opt_mol *m) {
    free(m->smiles);
    free(m->canonical);
    free(m->scaffold);
    free(m->comps);
}

const char *mg_opt_bucket_key(const mg_opt *o, const opt_mol *m) {
    return mg_df_key(&o->df, m->scaffold, m->canonical);
}

mg_status mg_opt_add_mol(mg_opt *o, opt_mol *m, mg_error *err) {
    if (o->nmol == o->capmol) {
        const size_t nc = o->capmol ? 2 * o->capmol : 256;
        opt_mol *nm = realloc(o->mols, nc * sizeof *nm);
        if (!nm) return mg_fail(err, MG_ERR_NOMEM, "out of memory");
        o->mols = nm;
        o->capmol = nc;
    }
    const int64_t idx = (int64_t)o->nmol;
    o->mols[o->nmol++] = *m;
    const opt_mol *s = &o->mols[idx];
    int bad = mg_strmap_put(&o->by_key, s->canonical, idx) || mg_strmap_put(&o->raw, s->smiles, idx) ||
              mg_strmap_put(&o->raw, s->canonical, idx);
    if (!bad) bad = mg_df_add(&o->df, mg_opt_bucket_key(o, s), s->score);
    return bad ? mg_fail(err, MG_ERR_NOMEM, "out of memory") : MG_OK;
}

/* Row r of the scratch batch from smiles: 1, or 0 when it cannot be a row
 * (a token outside the vocabulary, too long). */
int mg_opt_encode_row(mg_opt *o, int r, const char *smiles) {
    const int T = o->ctx + 1;
    int32_t *row = o->ids + (size_t)r * T;
    int n = 0;
    mg_error e;
    if (mg_vocab_encode(o->vocab, smiles, row + 1, T - 2, &n, &e) || n + 2 > T) return 0;
    row[0] = MG_BOS;
    row[n + 1] = MG_EOS;
    for (int t = n + 2; t < T; t++) row[t] = MG_PAD;
    o->len[r] = n + 2;
    return 1;
}

int mg_opt_cmp_desc(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x < y) - (x > y);
}

/* mean of the n best scores so far */
double mg_opt_top_mean(const mg_opt *o, size_t n) {
    if (!o->nmol) return 0;
    double *s = malloc(o->nmol * sizeof *s);
    if (!s) return NAN;
    for (size_t i = 0; i < o->nmol; i++) s[i] = o->mols[i].score;
    qsort(s, o->nmol, sizeof *s, mg_opt_cmp_desc);
    const size_t k = n < o->nmol ? n : o->nmol;
    double t = 0;
    for (size_t i = 0; i < k; i++) t += s[i];
    free(s);
    return t / (double)k;
}
