/* molgen score: see nll_score.h. */
#define _POSIX_C_SOURCE 200809L
#include "gen/nll_score.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "chem/data.h"

/* Molecules between two progress calls (each block is one parallel region). */
#define SCORE_BLOCK 4096

const char *mg_score_status_name(mg_score_status s) {
    static const char *const names[] = {"ok",       "empty",   "bad_char", "unknown_token",
                                        "too_long", "bad_line"};
    return (unsigned)s < sizeof names / sizeof names[0] ? names[s] : "?";
}

/* Encodes s as BOS tokens EOS into seq [ctx_len + 1]: the status, *len
 * (k + 2), *tokens (k + 1 when known), the reason into e. */
static mg_score_status encode(const mg_model *m, const mg_vocab *v, const char *s,
                              unsigned char flaw, int32_t *seq, int64_t *len, int *tokens,
                              mg_error *e) {
    const int T = mg_model_get_config(m)->ctx_len + 1;
    *tokens = 0;
    e->message[0] = '\0';
    if (flaw) {
        snprintf(e->message, sizeof e->message, "%s",
                 flaw == MG_REC_LINE_TOO_LONG ? "line longer than the reader's limit"
                 : flaw == MG_REC_NUL         ? "NUL byte in line"
                                              : "CSV row without the SMILES column");
        return MG_SCORE_BAD_LINE;
    }
    if (!s[0]) return MG_SCORE_EMPTY;
    const mg_status rc = mg_encode_row(v, s, T, seq, len, e);
    if (rc == MG_ERR_TOO_LONG) {
        int k = 0;
        mg_tokenize(s, NULL, 0, &k, NULL, NULL);
        *tokens = k + 1;
        /* the wording of train's data report (data.c): SMILES tokens against
         * the most a molecule may have, the context less its end token */
        snprintf(e->message, sizeof e->message, "%d tokens, more than the model's limit %d", k,
                 T - 2);
        return MG_SCORE_TOO_LONG;
    }
    if (rc == MG_ERR_UNKNOWN_TOKEN) return MG_SCORE_UNKNOWN_TOKEN;
    if (rc) return MG_SCORE_BAD_CHAR;
    *tokens = (int)*len - 1;
    return MG_SCORE_OK;
}

void mg_score_reason(const mg_model *m, const mg_vocab *v, const char *s, unsigned char flaw,
                     char *out, size_t n) {
    const int T = mg_model_get_config(m)->ctx_len + 1;
    int32_t *seq = malloc((size_t)T * sizeof *seq);
    int64_t len;
    int tokens;
    mg_error e;
    if (!seq) {
        snprintf(out, n, "out of memory");
        return;
    }
    const mg_score_status st = encode(m, v, s, flaw, seq, &len, &tokens, &e);
    snprintf(out, n, "%s",
             st == MG_SCORE_OK      ? ""
             : st == MG_SCORE_EMPTY ? "empty SMILES"
                                    : e.message);
    free(seq);
}

/* rep [nt]: m itself, then nt - 1 copies of its parameters, each on one
 * thread, scoring in m's dtype. */
static mg_status make_replicas(mg_model *m, mg_model **rep, int nt, mg_error *err) {
    const mg_model_config *cfg = mg_model_get_config(m);
    mg_status rc = MG_OK;
    rep[0] = m;
    for (int t = 1; t < nt && !rc; t++) {
        mg_error e;
        if ((rc = mg_model_create(cfg, &rep[t], &e)))
            rc = mg_fail(err, rc, "model copy for thread %d: %s", t, e.message);
        else
            memcpy(mg_model_params(rep[t]), mg_model_params(m),
                   mg_model_num_params(m) * sizeof(float));
    }
    for (int t = 0; t < nt && !rc; t++) {
        mg_model_set_threads(rep[t], 1);
        mg_model_set_dtype(rep[t], mg_model_dtype(m)); /* the copies score as m does */
        /* bf16: one molecule per forward packed W per call (most of the
         * time): packed once instead. fp32 keeps attn_matmul, whose bits
         * are the training loss's (the packed fp32 sum runs in another
         * order past OpenBLAS's K block). */
        if (mg_model_dtype(m) == MG_DT_BF16) rc = mg_model_pack_inference(rep[t], err);
    }
    return rc;
}

/* Molecules [0, n) of these arrays, in this process. */
static mg_status score_part(mg_model *m, const mg_vocab *v, const char *const *smiles,
                            const unsigned char *flaw, size_t n, const mg_score_opts *o,
                            mg_score *out, mg_error *err) {
    if (!m || !v || (n && (!smiles || !out)))
        return mg_fail(err, MG_ERR_ARG, "mg_score_molecules: model, vocab, smiles and out needed");
    if (mg_vocab_size(v) != mg_model_get_config(m)->vocab_size)
        return mg_fail(err, MG_ERR_MISMATCH, "vocabulary of %d tokens for a model of %d",
                       mg_vocab_size(v), mg_model_get_config(m)->vocab_size);
    int nt = o && o->threads > 0 ? o->threads : mg_model_threads(m);
    const int batch = o && o->batch > 0 ? o->batch : 16;
    if ((size_t)nt > n) nt = n > 0 ? (int)n : 1;
    const mg_model_config *cfg = mg_model_get_config(m);
    const int T = cfg->ctx_len + 1;
    /* replica 0 is m itself (one thread while it scores) */
    mg_model **rep = calloc((size_t)nt, sizeof *rep);
    int32_t *seq = malloc((size_t)nt * (size_t)T * sizeof *seq);
    if (!rep || !seq) {
        free(rep);
        free(seq);
        return mg_fail(err, MG_ERR_NOMEM, "out of memory");
    }
    const int m_threads = mg_model_threads(m);
    mg_status rc = make_replicas(m, rep, nt, err);
    mg_status failed = MG_OK;
    char msg[sizeof err->message + 32] = ""; /* "molecule N: " + the message */
    for (size_t b0 = 0; b0 < n && !rc; b0 += SCORE_BLOCK) {
        const size_t b1 = n - b0 < SCORE_BLOCK ? n : b0 + SCORE_BLOCK;
#pragma omp parallel num_threads(nt)
        {
            int id = 0;
#ifdef _OPENMP
            id = omp_get_thread_num();
#endif
            mg_model *r = rep[id];
            int32_t *s = seq + (size_t)id * T;
#pragma omp for schedule(dynamic, batch)
            for (size_t i = b0; i < b1; i++) {
                mg_score *sc = &out[i];
                int64_t len = 0;
                mg_error e;
                sc->nll = NAN;
                if (o && o->stop && *o->stop) continue;
                sc->status = encode(r, v, smiles[i], flaw ? flaw[i] : 0, s, &len, &sc->tokens, &e);
                if (sc->status != MG_SCORE_OK) continue;
                const mg_status frc = mg_model_sequence_nll(
                    r, &(mg_batch){.ids = s, .lengths = &len, .B = 1, .T = (int)len}, &sc->nll, &e);
                if (frc) {
#pragma omp critical(mg_score_error)
                    if (!failed) {
                        failed = frc;
                        snprintf(msg, sizeof msg, "molecule %zu: %s", i, e.message);
                    }
                }
            }
        }
        if (failed) rc = mg_fail(err, failed, "%s", msg);
        if (!rc && o && o->stop && *o->stop)
            rc = mg_fail(err, MG_ERR_INTERRUPTED, "interrupted by signal %d", (int)*o->stop);
        if (!rc && o && o->progress) o->progress(o->user, b1, n);
    }
    mg_model_set_threads(m, m_threads);
    mg_model_unpack_inference(m);
    for (int t = 1; t < nt; t++) mg_model_free(rep[t]);
    free(rep);
    free(seq);
    return rc;
}

/* Rank 0's progress: its part of `of` molecules as a share of all n. */
typedef struct {
    const mg_score_opts *o;
    size_t n, part;
} scaled_progress;

static void progress_scaled(void *user, size_t done, size_t part) {
    const scaled_progress *p = user;
    (void)part;
    p->o->progress(p->o->user, (size_t)((double)done * (double)p->n / (double)p->part), p->n);
}

mg_status mg_score_molecules(mg_model *m, const mg_vocab *v, const char *const *smiles,
                             const unsigned char *flaw, size_t n, const mg_score_opts *o,
                             mg_score *out, mg_error *err) {
    mg_dist *d = o ? o->dist : NULL;
    if (!d || d->size <= 1) return score_part(m, v, smiles, flaw, n, o, out, err);
    size_t i0, i1;
    mg_dist_range(n, d->rank, d->size, &i0, &i1);
    mg_score_opts po = *o;
    scaled_progress sp = {o, n, i1 - i0};
    po.dist = NULL;
    po.progress = d->rank == 0 && o->progress && i1 > i0 ? progress_scaled : NULL;
    po.user = &sp;
    mg_status rc = score_part(m, v, smiles ? smiles + i0 : NULL, flaw ? flaw + i0 : NULL, i1 - i0,
                              &po, out ? out + i0 : NULL, err);
    void *all = NULL;
    size_t all_n = 0;
    if ((rc = mg_dist_agree(d, rc, err)) ||
        (rc = mg_dist_gather(d, out + i0, (i1 - i0) * sizeof *out, &all, &all_n, err)))
        return rc;
    if (d->rank == 0) memcpy(out, all, n * sizeof *out); /* the parts in rank order: [0, n) */
    free(all);
    return MG_OK;
}
