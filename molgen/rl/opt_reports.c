/* molgen optimize: the reports (see opt_reports.h). */
#define _POSIX_C_SOURCE 200809L
#include "rl/opt_reports.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/json.h"
#include "rl/opt_checkpoint.h"
#include "rl/opt_state.h"

/* ------------------------------------------------------------ reports */

static void csv_field(FILE *f, const char *s) {
    if (!s) s = "";
    if (!strpbrk(s, ",\"\n")) {
        fputs(s, f);
        return;
    }
    fputc('"', f);
    for (; *s; s++) {
        if (*s == '"') fputc('"', f);
        fputc(*s, f);
    }
    fputc('"', f);
}

int mg_opt_write_scored(const mg_opt *o, FILE *f) {
    fputs("call,step,smiles,canonical,score,prior_nll,agent_nll,scaffold,components,source\n", f);
    for (size_t i = 0; i < o->nmol; i++) {
        const opt_mol *m = &o->mols[i];
        fprintf(f, "%lld,%lld,", (long long)m->call, (long long)m->step);
        csv_field(f, m->smiles);
        fputc(',', f);
        csv_field(f, m->canonical);
        fprintf(f, ",%.10g,%.6f,%.6f,", m->score, m->prior_nll, m->agent_nll);
        csv_field(f, m->scaffold);
        fputc(',', f);
        csv_field(f, m->comps);
        fputs(m->ga ? ",ga\n" : ",agent\n", f);
    }
    return ferror(f) ? -1 : 0;
}

static const mg_opt *g_sort_opt;
static int best_cmp(const void *a, const void *b) {
    const size_t x = *(const size_t *)a, y = *(const size_t *)b;
    const double sx = g_sort_opt->mols[x].score, sy = g_sort_opt->mols[y].score;
    if (sx != sy) return sx > sy ? -1 : 1;
    return (x > y) - (x < y);
}

int mg_opt_write_best(const mg_opt *o, FILE *f, size_t n) {
    size_t *ix = malloc((o->nmol ? o->nmol : 1) * sizeof *ix);
    if (!ix) return -1;
    for (size_t i = 0; i < o->nmol; i++) ix[i] = i;
    g_sort_opt = o;
    qsort(ix, o->nmol, sizeof *ix, best_cmp);
    for (size_t i = 0; i < n && i < o->nmol; i++)
        fprintf(f, "%s\t%.10g\n", o->mols[ix[i]].canonical, o->mols[ix[i]].score);
    free(ix);
    return ferror(f) ? -1 : 0;
}

/* mean of the `top` best of s[0..n) (fewer when n < top), in buf[n] */
static double top_of(const double *s, size_t n, int top, double *buf) {
    if (!n) return 0;
    memcpy(buf, s, n * sizeof *buf);
    qsort(buf, n, sizeof *buf, mg_opt_cmp_desc);
    const size_t k = (size_t)top < n ? (size_t)top : n;
    double t = 0;
    for (size_t i = 0; i < k; i++) t += buf[i];
    return t / (double)k;
}

double mg_opt_auc_top(const double *s, size_t n, int top, int freq, int64_t budget) {
    if (!n || budget < 1) return 0;
    if ((int64_t)n > budget) n = (size_t)budget;
    double *buf = malloc(n * sizeof *buf);
    if (!buf) return NAN;
    double sum = 0, prev = 0;
    size_t called = 0;
    for (size_t idx = (size_t)freq; idx < n; idx += (size_t)freq) {
        const double now = top_of(s, idx, top, buf);
        sum += freq * (now + prev) / 2;
        prev = now;
        called = idx;
    }
    const double now = top_of(s, n, top, buf);
    sum += (double)(n - called) * (now + prev) / 2;
    if ((int64_t)n < budget) sum += (double)(budget - (int64_t)n) * now;
    free(buf);
    return sum / (double)budget;
}

int mg_opt_write_summary(const mg_opt *o, FILE *f, double seconds) {
    double *s = malloc((o->nmol ? o->nmol : 1) * sizeof *s);
    if (!s) return -1;
    for (size_t i = 0; i < o->nmol; i++) s[i] = o->mols[i].score;
    json_t *j = json_object();
    int bad = !j || mg_json_put(j, "calls", json_integer((json_int_t)o->nmol)) ||
              mg_json_put(j, "steps", json_integer(o->step)) ||
              mg_json_put(j, "budget", json_integer(o->op.budget)) ||
              mg_json_put(j, "top1", json_real(mg_opt_top_mean(o, 1))) ||
              mg_json_put(j, "top10", json_real(mg_opt_top_mean(o, 10))) ||
              mg_json_put(j, "top100", json_real(mg_opt_top_mean(o, 100))) ||
              mg_json_put(j, "auc_top1", json_real(mg_opt_auc_top(s, o->nmol, 1, 100, o->op.budget))) ||
              mg_json_put(j, "auc_top10", json_real(mg_opt_auc_top(s, o->nmol, 10, 100, o->op.budget))) ||
              mg_json_put(j, "auc_top100", json_real(mg_opt_auc_top(s, o->nmol, 100, 100, o->op.budget))) ||
              mg_json_put(j, "seconds", json_real(seconds)) ||
              mg_json_put(j, "stop", json_string(o->reason[0] ? o->reason : "error")) ||
              (o->op.scorer_cmd && mg_json_put(j, "scorer", mg_opt_scorer_json(o->op.scorer_cmd))) ||
              mg_json_put(j, "options", mg_opt_options_json(&o->op));
    free(s);
    char *t = bad ? NULL : mg_json_dump(j, 6);
    json_decref(j);
    if (!t) return -1;
    fprintf(f, "%s\n", t);
    free(t);
    return ferror(f) ? -1 : 0;
}
