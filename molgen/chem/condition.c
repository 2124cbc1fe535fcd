/* molgen conditioning: names, statistics, data columns, batches and
 * sampling requests (see condition.h; the embedding itself is model.c's). */
#define _POSIX_C_SOURCE 200809L
#include "chem/condition.h"

#include <ctype.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "base/json.h"
#include "base/util.h"

void mg_cond_info_free(mg_cond_info *c) {
    if (!c) return;
    for (int k = 0; k < c->K && k < MG_COND_MAX; k++) free(c->names[k]);
    memset(c, 0, sizeof *c);
}

static json_t *num_array(const double *x, int K) {
    json_t *a = json_array();
    for (int k = 0; a && k < K; k++)
        if (json_array_append_new(a, json_real(x[k]))) {
            json_decref(a);
            return NULL;
        }
    return a;
}

char *mg_cond_info_to_json(const mg_cond_info *c) {
    json_t *j = json_object(), *names = json_array();
    int ok = j && names;
    for (int k = 0; ok && k < c->K; k++) {
        json_t *s = json_string(c->names[k]);
        ok = s && !json_array_append_new(names, s);
    }
    ok = ok && !mg_json_put(j, "names", names);
    if (!ok) json_decref(names);
    ok = ok && !mg_json_put(j, "mean", num_array(c->mean, c->K)) &&
         !mg_json_put(j, "std", num_array(c->std, c->K)) &&
         !mg_json_put(j, "min", num_array(c->min, c->K)) &&
         !mg_json_put(j, "max", num_array(c->max, c->K)) &&
         !mg_json_put(j, "p01", num_array(c->p01, c->K)) &&
         !mg_json_put(j, "p99", num_array(c->p99, c->K));
    char *s = ok ? mg_json_dump(j, 17) : NULL;
    json_decref(j);
    return s;
}

/* Why a condition name cannot be given as sampling's name=value,...
 * (mg_cond_request), or NULL when it can. */
static const char *bad_name(const char *s) {
    if (!*s) return "is empty";
    if (strchr(s, ',')) return "contains ','";
    if (strchr(s, '=')) return "contains '='";
    for (const char *q = s; *q; q++)
        if (*q != ' ' && (isspace((unsigned char)*q) || iscntrl((unsigned char)*q)))
            return "contains a tab, line break or control character";
    if (s[0] == ' ' || s[strlen(s) - 1] == ' ') return "starts or ends with a space";
    return NULL;
}

/* json with the bare words NaN, Infinity, -Infinity, inf, -inf (in any
 * case; Python's json writes the first three, they are not JSON) outside
 * strings replaced by null, so that such a value is reported by field
 * rather than as a parse error. malloc'ed; NULL when out of memory. */
static char *nonfinite_to_null(const char *json) {
    static const char *const words[] = {"-infinity", "infinity", "-inf", "inf", "nan"};
    const size_t n = strlen(json);
    char *out = malloc(2 * n + 1), *o = out; /* each word of >= 3 bytes grows by <= 1 */
    if (!out) return NULL;
    int in_str = 0;
    for (size_t i = 0; i < n;) {
        const char ch = json[i];
        if (in_str) {
            *o++ = json[i++];
            if (ch == '\\' && i < n)
                *o++ = json[i++];
            else if (ch == '"')
                in_str = 0;
            continue;
        }
        if (ch == '"') in_str = 1;
        size_t w = 0;
        if (i == 0 || !isalnum((unsigned char)json[i - 1]))
            for (size_t q = 0; !w && q < sizeof words / sizeof words[0]; q++) {
                const size_t l = strlen(words[q]);
                if (!strncasecmp(json + i, words[q], l) && !isalnum((unsigned char)json[i + l]))
                    w = l;
            }
        if (w) {
            memcpy(o, "null", 4);
            o += 4;
            i += w;
        } else {
            *o++ = json[i++];
        }
    }
    *o = '\0';
    return out;
}

/* The metadata's "names" (K of them, each usable as name=value, no two
 * alike) into c->names, c->K. */
static mg_status cond_names(const json_t *names, int K, mg_cond_info *c, mg_error *err) {
    for (int k = 0; k < K; k++) {
        const char *s = json_string_value(json_array_get(names, k));
        if (!s)
            return mg_fail(err, MG_ERR_FORMAT, "condition metadata: name %d is not a string", k);
        if (bad_name(s))
            return mg_fail(err, MG_ERR_FORMAT,
                           "condition metadata: name %d '%.60s' %s: it cannot be given as "
                           "name=value",
                           k, s, bad_name(s));
        for (int q = 0; q < k; q++)
            if (!strcmp(c->names[q], s))
                return mg_fail(err, MG_ERR_FORMAT, "condition metadata: '%s' twice", s);
        if (!(c->names[k] = strdup(s))) return mg_fail(err, MG_ERR_NOMEM, "out of memory");
        c->K = k + 1;
    }
    return MG_OK;
}

/* The K conditions' statistics ("mean", "std", ..., float numbers). */
static mg_status cond_stats(const json_t *j, int K, mg_cond_info *c, mg_error *err) {
    static const char *const keys[] = {"mean", "std", "min", "max", "p01", "p99"};
    double *dst[] = {c->mean, c->std, c->min, c->max, c->p01, c->p99};
    for (int q = 0; q < 6; q++) {
        const json_t *a = json_object_get(j, keys[q]);
        if (!json_is_array(a) || (int)json_array_size(a) != K)
            return mg_fail(err, MG_ERR_FORMAT, "condition metadata: \"%s\" must be %d numbers",
                           keys[q], K);
        /* values are float (training's and sampling's): each field must be one */
        for (int k = 0; k < K; k++) {
            const json_t *v = json_array_get(a, k);
            dst[q][k] = json_is_number(v) ? json_number_value(v) : NAN;
            if (!isfinite(dst[q][k]))
                return mg_fail(err, MG_ERR_FORMAT,
                               "condition metadata: '%s': \"%s\" is not a finite number",
                               c->names[k], keys[q]);
            if (fabs(dst[q][k]) > FLT_MAX)
                return mg_fail(err, MG_ERR_FORMAT,
                               "condition metadata: '%s': \"%s\" %g is beyond the float range "
                               "(|x| <= %g)",
                               c->names[k], keys[q], dst[q][k], (double)FLT_MAX);
        }
    }
    return MG_OK;
}

/* Each condition's statistics consistent: std > 0, min <= p01 <= p99 <=
 * max, the training range normalising within the float range. */
static mg_status cond_ranges(int K, const mg_cond_info *c, mg_error *err) {
    mg_status rc = MG_OK;
    for (int k = 0; k < K; k++) {
        const char *nm = c->names[k];
        /* the normalised ends of the training range, what a request can give */
        const double lo = (c->min[k] - c->mean[k]) / c->std[k],
                     hi = (c->max[k] - c->mean[k]) / c->std[k];
        if (!(c->std[k] > 0))
            rc = mg_fail(err, MG_ERR_FORMAT, "condition metadata: '%s': \"std\" %g must be > 0",
                         nm, c->std[k]);
        else if (!(c->min[k] <= c->p01[k] && c->p01[k] <= c->p99[k] && c->p99[k] <= c->max[k]))
            rc = mg_fail(err, MG_ERR_FORMAT,
                         "condition metadata: '%s': \"min\" %g, \"p01\" %g, \"p99\" %g, "
                         "\"max\" %g are not in increasing order",
                         nm, c->min[k], c->p01[k], c->p99[k], c->max[k]);
        else if (!(fabs(lo) <= FLT_MAX && fabs(hi) <= FLT_MAX))
            rc = mg_fail(err, MG_ERR_FORMAT,
                         "condition metadata: '%s': \"std\" %g is too small for \"mean\" %g: "
                         "the training range [%g, %g] normalises beyond the float range",
                         nm, c->std[k], c->mean[k], c->min[k], c->max[k]);
        if (rc) return rc;
    }
    return MG_OK;
}

mg_status mg_cond_info_from_json(const char *json, mg_cond_info *c, mg_error *err) {
    memset(c, 0, sizeof *c);
    json_t *j = NULL;
    mg_error e;
    if (!json) return mg_fail(err, MG_ERR_FORMAT, "condition metadata missing");
    char *text = nonfinite_to_null(json);
    if (!text) return mg_fail(err, MG_ERR_NOMEM, "out of memory");
    const mg_status prc = mg_json_parse(text, strlen(text), &j, &e);
    free(text);
    if (prc) return mg_fail(err, e.status, "condition metadata: %s", e.message);
    mg_status rc = MG_OK;
    const json_t *names = json_object_get(j, "names");
    if (!json_is_object(j) || !json_is_array(names) || json_array_size(names) < 1 ||
        json_array_size(names) > MG_COND_MAX) {
        rc = mg_fail(err, MG_ERR_FORMAT,
                     "condition metadata: \"names\" must be an array of 1 to %d names",
                     MG_COND_MAX);
        goto done;
    }
    const int K = (int)json_array_size(names);
    if (!(rc = cond_names(names, K, c, err)) && !(rc = cond_stats(j, K, c, err)))
        rc = cond_ranges(K, c, err);
done:
    json_decref(j);
    if (rc) mg_cond_info_free(c);
    return rc;
}

mg_status mg_cond_parse_names(const char *list, mg_cond_info *c, mg_error *err) {
    memset(c, 0, sizeof *c);
    if (!list || !*list) return mg_fail(err, MG_ERR_ARG, "no condition names given");
    const char *p = list;
    for (;;) {
        while (*p == ' ') p++;
        const char *e = p;
        while (*e && *e != ',') e++;
        const char *end = e;
        while (end > p && end[-1] == ' ') end--;
        if (end == p) {
            mg_cond_info_free(c);
            return mg_fail(err, MG_ERR_ARG, "condition list '%s' has an empty name", list);
        }
        if (c->K >= MG_COND_MAX) {
            mg_cond_info_free(c);
            return mg_fail(err, MG_ERR_ARG, "more than %d conditions in '%s'", MG_COND_MAX, list);
        }
        char *name = strndup(p, (size_t)(end - p));
        if (!name) {
            mg_cond_info_free(c);
            return mg_fail(err, MG_ERR_NOMEM, "out of memory");
        }
        if (bad_name(name)) {
            mg_fail(err, MG_ERR_ARG,
                    "condition name '%s' %s: sampling could not give it as --condition "
                    "name=value,...",
                    name, bad_name(name));
            free(name);
            mg_cond_info_free(c);
            return MG_ERR_ARG;
        }
        for (int q = 0; q < c->K; q++)
            if (!strcmp(c->names[q], name)) {
                mg_fail(err, MG_ERR_ARG, "condition '%s' is named twice", name);
                free(name);
                mg_cond_info_free(c);
                return MG_ERR_ARG;
            }
        c->names[c->K++] = name;
        if (!*e) break;
        p = e + 1;
    }
    return MG_OK;
}

/* A number filling the whole field (surrounding blanks allowed) that is
 * finite as a float (values are stored as float: 1e39 would become inf). */
static int parse_value(const char *s, double *out) {
    char *end;
    while (isspace((unsigned char)*s)) s++;
    if (!*s) return 0;
    const double v = strtod(s, &end);
    while (isspace((unsigned char)*end)) end++;
    if (*end || !(fabs(v) <= FLT_MAX)) return 0;
    *out = v;
    return 1;
}

mg_status mg_cond_read(const char *path, const mg_cond_info *c, const mg_dataset *d, float **values,
                       size_t *missing, mg_error *err) {
    *values = NULL;
    if (missing) *missing = 0;
    const int K = c->K;
    long max_line = 0;
    for (size_t i = 0; i < d->n; i++)
        if (d->line[i] > max_line) max_line = d->line[i];
    /* by_line [max_line + 1]: a column's value on each line of the file */
    float *by_line = malloc(((size_t)max_line + 1) * sizeof(float));
    float *v = malloc((d->n ? d->n : 1) * (size_t)K * sizeof(float));
    if (!by_line || !v) {
        free(by_line);
        free(v);
        return mg_fail(err, MG_ERR_NOMEM, "out of memory for the condition values");
    }
    size_t miss = 0;
    for (int k = 0; k < K; k++) {
        mg_smiles_list col;
        mg_error e;
        mg_status rc = mg_read_smiles(path, c->names[k], &col, NULL, &e);
        if (rc) {
            free(by_line);
            free(v);
            return mg_fail(err, rc, "condition '%s': %s", c->names[k], e.message);
        }
        for (long l = 0; l <= max_line; l++) by_line[l] = NAN;
        for (size_t i = 0; i < col.n; i++) {
            double x;
            if (col.line[i] >= 0 && col.line[i] <= max_line && parse_value(col.smiles[i], &x))
                by_line[col.line[i]] = (float)x;
        }
        mg_smiles_list_free(&col);
        for (size_t i = 0; i < d->n; i++) {
            v[i * K + k] = by_line[d->line[i]];
            miss += isnan(v[i * K + k]);
        }
    }
    free(by_line);
    *values = v;
    if (missing) *missing = miss;
    return MG_OK;
}

static int cmp_float(const void *a, const void *b) {
    const float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

mg_status mg_cond_stats(mg_cond_info *c, const float *values, size_t n, mg_error *err) {
    const int K = c->K;
    float *col = malloc((n ? n : 1) * sizeof(float));
    if (!col) return mg_fail(err, MG_ERR_NOMEM, "out of memory");
    for (int k = 0; k < K; k++) {
        size_t m = 0;
        double sum = 0.0;
        for (size_t i = 0; i < n; i++)
            if (!isnan(values[i * K + k])) {
                col[m++] = values[i * K + k];
                sum += values[i * K + k];
            }
        if (m < 2) {
            free(col);
            return mg_fail(err, MG_ERR_ARG,
                           "condition '%s': %zu training rows have a value, need at least 2",
                           c->names[k], m);
        }
        const double mean = sum / (double)m;
        double ss = 0.0;
        for (size_t i = 0; i < m; i++) ss += ((double)col[i] - mean) * ((double)col[i] - mean);
        qsort(col, m, sizeof(float), cmp_float);
        c->mean[k] = mean;
        c->std[k] = sqrt(ss / (double)(m - 1));
        c->min[k] = col[0];
        c->max[k] = col[m - 1];
        c->p01[k] = col[(size_t)(0.01 * (double)(m - 1))];
        c->p99[k] = col[(size_t)(0.99 * (double)(m - 1) + 0.5)];
        if (!(c->std[k] > 0)) {
            free(col);
            return mg_fail(err, MG_ERR_ARG, "condition '%s' is constant (%g) in the training rows",
                           c->names[k], c->min[k]);
        }
    }
    free(col);
    return MG_OK;
}

void mg_cond_normalise(const mg_cond_info *c, float *values, size_t n) {
    for (size_t i = 0; i < n; i++)
        for (int k = 0; k < c->K; k++) {
            float *x = &values[i * c->K + k];
            if (!isnan(*x)) *x = (float)(((double)*x - c->mean[k]) / c->std[k]);
        }
}

/* A training drop: the top 53 bits of the hash z, as a fraction, are < p. */
static int dropped(uint64_t z, double p) { return (double)(z >> 11) * 0x1.0p-53 < p; }

void mg_cond_batch(const float *values, int K, const size_t *rows, int B, double drop,
                   uint64_t seed, float *out) {
    for (int b = 0; b < B; b++)
        for (int k = 0; k < K; k++) {
            const uint64_t z = mg_mix64(seed ^ (0x9E3779B97F4A7C15ull * ((uint64_t)b * K + k + 1)));
            out[(size_t)b * K + k] =
                dropped(z, drop) ? NAN : values[rows[b] * (size_t)K + (size_t)k];
        }
}

mg_status mg_scaffold_read(const char *path, const char *column, const mg_vocab *v,
                           const mg_dataset *d, int max_tokens, size_t **first, int32_t **toks,
                           int *longest, size_t *missing, size_t *bad, char *note, size_t notelen,
                           mg_error *err) {
    *first = NULL;
    *toks = NULL;
    *longest = 0;
    *missing = *bad = 0;
    if (notelen) note[0] = '\0';
    mg_smiles_list col;
    mg_error e;
    mg_status rc = mg_read_smiles(path, column, &col, NULL, &e);
    if (rc) return mg_fail(err, rc, "scaffold column '%s': %s", column, e.message);
    long max_line = 0;
    for (size_t i = 0; i < d->n; i++)
        if (d->line[i] > max_line) max_line = d->line[i];
    /* by_line [max_line + 1]: the column's entry on each line, or SIZE_MAX */
    size_t *by_line = malloc(((size_t)max_line + 1) * sizeof *by_line);
    size_t *f = malloc((d->n + 1) * sizeof *f);
    const int cap = max_tokens > 0 ? max_tokens : 1;
    int32_t *t = NULL, *one = malloc((size_t)cap * sizeof *one);
    size_t nt = 0, tcap = 0;
    if (!by_line || !f || !one) {
        rc = mg_fail(err, MG_ERR_NOMEM, "out of memory for the scaffolds");
        goto out;
    }
    for (long l = 0; l <= max_line; l++) by_line[l] = SIZE_MAX;
    for (size_t i = 0; i < col.n; i++)
        if (col.line[i] >= 0 && col.line[i] <= max_line) by_line[col.line[i]] = i;
    for (size_t i = 0; i < d->n; i++) {
        f[i] = nt;
        const size_t j = by_line[d->line[i]];
        int n = 0;
        if (j == SIZE_MAX || !col.smiles[j][0]) {
            (*missing)++;
            continue;
        }
        const mg_status st = mg_vocab_encode(v, col.smiles[j], one, cap, &n, &e);
        if (st || n == 0) {
            (*missing)++;
            if ((*bad)++ == 0 && notelen)
                snprintf(note, notelen, "%s:%ld: scaffold '%.200s': %s", path, d->line[i],
                         col.smiles[j], st ? e.message : "no tokens");
            continue;
        }
        if (nt + (size_t)n > tcap) {
            const size_t nc = tcap ? 2 * tcap + (size_t)n : 4096;
            int32_t *g = realloc(t, nc * sizeof *t);
            if (!g) {
                rc = mg_fail(err, MG_ERR_NOMEM, "out of memory for the scaffolds");
                goto out;
            }
            t = g;
            tcap = nc;
        }
        memcpy(t + nt, one, (size_t)n * sizeof *one);
        nt += (size_t)n;
        if (n > *longest) *longest = n;
    }
    f[d->n] = nt;
out:
    mg_smiles_list_free(&col);
    free(by_line);
    free(one);
    if (rc) {
        free(f);
        free(t);
        return rc;
    }
    *first = f;
    *toks = t ? t : malloc(sizeof *t);
    if (!*toks) {
        free(f);
        *first = NULL;
        return mg_fail(err, MG_ERR_NOMEM, "out of memory for the scaffolds");
    }
    return MG_OK;
}

void mg_scaffold_row(const int32_t *ids, int64_t len, const int32_t *scaf, int m, int b,
                     double drop, uint64_t seed, int Tw, int32_t *out, int64_t *out_len,
                     int64_t *prefix) {
    const uint64_t z = mg_mix64(seed ^ (0xD1B54A32D192ED03ull * ((uint64_t)b + 1)));
    const int keep = m == 0 || dropped(z, drop) || m + len + 1 > Tw;
    int64_t p = 0;
    if (!keep) { /* BOS s1 .. sm, then the row from its BOS */
        out[0] = MG_BOS;
        memcpy(out + 1, scaf, (size_t)m * sizeof *out);
        p = m + 1;
    }
    memcpy(out + p, ids, (size_t)len * sizeof *out);
    for (int64_t t = p + len; t < Tw; t++) out[t] = MG_PAD;
    *out_len = p + len;
    *prefix = p;
}

mg_status mg_cond_request(const mg_cond_info *c, const char *text, float *out, char *warn,
                          size_t warnlen, mg_error *err) {
    if (warn && warnlen) warn[0] = '\0';
    for (int k = 0; k < c->K; k++) out[k] = NAN;
    char known[1024] = "";
    for (int k = 0; k < c->K; k++)
        snprintf(known + strlen(known), sizeof known - strlen(known), "%s%s", k ? ", " : "",
                 c->names[k]);
    const char *p = text;
    if (!p || !*p) return mg_fail(err, MG_ERR_ARG, "empty condition (give name=value,...)");
    for (;;) {
        const char *e = p;
        while (*e && *e != ',') e++;
        const char *eq = memchr(p, '=', (size_t)(e - p));
        if (!eq)
            return mg_fail(err, MG_ERR_ARG, "condition '%.*s' is not name=value", (int)(e - p), p);
        const char *n0 = p, *n1 = eq;
        while (n0 < n1 && *n0 == ' ') n0++;
        while (n1 > n0 && n1[-1] == ' ') n1--;
        int k = -1;
        for (int q = 0; q < c->K; q++)
            if (strlen(c->names[q]) == (size_t)(n1 - n0) &&
                !strncmp(c->names[q], n0, (size_t)(n1 - n0)))
                k = q;
        if (k < 0)
            return mg_fail(err, MG_ERR_ARG,
                           "the model was not trained on a condition '%.*s' (it knows: %s)",
                           (int)(n1 - n0), n0, known);
        if (!isnan(out[k]))
            return mg_fail(err, MG_ERR_ARG, "condition '%s' is given twice", c->names[k]);
        char num[64];
        const size_t nl = (size_t)(e - eq - 1);
        double x;
        if (nl >= sizeof num ||
            (memcpy(num, eq + 1, nl), num[nl] = '\0', !parse_value(num, &x)))
            return mg_fail(err, MG_ERR_ARG, "condition %s: '%.*s' is not a finite number",
                           c->names[k], (int)(e - eq - 1), eq + 1);
        if (x < c->min[k] || x > c->max[k])
            return mg_fail(err, MG_ERR_ARG,
                           "condition %s=%g is outside the training range [%g, %g] of the model "
                           "(it cannot extrapolate there)",
                           c->names[k], x, c->min[k], c->max[k]);
        if ((x < c->p01[k] || x > c->p99[k]) && warn && warnlen)
            snprintf(warn + strlen(warn), warnlen - strlen(warn),
                     "%swarning: %s=%g is rare in the training data (98%% of it lies in [%g, "
                     "%g]): expect a larger deviation",
                     warn[0] ? "\n" : "", c->names[k], x, c->p01[k], c->p99[k]);
        out[k] = (float)((x - c->mean[k]) / c->std[k]);
        if (!*e) break;
        p = e + 1;
    }
    return MG_OK;
}
