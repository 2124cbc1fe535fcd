/* molgen tokenizer: see tokenizer.h. */
#include "chem/tokenizer.h"
#include "base/errors.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/json.h"
#include "base/util.h"

static const char *const k_specials[MG_NUM_SPECIAL] = {"<pad>", "<bos>", "<eos>"};

typedef char mg_tokstr[MG_TOKEN_MAX + 1];

/* Most ids a vocabulary may have (real ones have < 100). */
#define MG_VOCAB_MAX 4096

struct mg_vocab {
    int n;          /* ids, specials included */
    mg_tokstr *tok; /* n strings, id order */
    int *order;     /* n ids sorted by strcmp of their strings */
};

/* A printable rendering of one byte for messages. */
static void show_char(unsigned char c, char out[8]) {
    if (c >= 0x20 && c < 0x7f)
        snprintf(out, 8, "%c", c);
    else
        snprintf(out, 8, "\\x%02X", c);
}

/* ------------------------------------------------------------ scanning */

int mg_token_len(const char *s) {
    if (!s) return -1;
    unsigned char c = (unsigned char)s[0];
    switch (c) {
    case '\0': return 0;
    case '[': {
        int i = 1;
        while (s[i] && s[i] != ']') i++;
        if (s[i] != ']' || i == 1) /* unclosed, or "[]" */
            return -1;
        if (i + 1 > MG_TOKEN_MAX) return -1;
        if (!mg_utf8_valid(s + 1, (size_t)(i - 1))) /* a vocabulary is JSON: UTF-8 */
            return -1;
        return i + 1;
    }
    case 'B': return s[1] == 'r' ? 2 : 1;
    case 'C': return s[1] == 'l' ? 2 : 1;
    case '%':
        if (s[1] >= '0' && s[1] <= '9' && s[2] >= '0' && s[2] <= '9') return 3;
        return -1;
    case '<':
    case 'N':
    case 'O':
    case 'S':
    case 'P':
    case 'F':
    case 'I':
    case 'b':
    case 'c':
    case 'n':
    case 'o':
    case 's':
    case 'p':
    case '(':
    case ')':
    case '.':
    case '=':
    case '#':
    case '-':
    case '+':
    case '\\':
    case '/':
    case ':':
    case '~':
    case '@':
    case '?':
    case '>':
    case '*':
    case '$': return 1;
    default:
        if (c >= '0' && c <= '9') return 1;
        return -1;
    }
}

mg_status mg_tokenize(const char *smiles, mg_span *spans, int cap, int *ntok, int *errpos,
                      mg_error *err) {
    int n = 0;
    if (ntok) *ntok = 0;
    if (!smiles || cap < 0 || (cap > 0 && !spans))
        return mg_fail(err, MG_ERR_ARG, "mg_tokenize: bad argument");
    int pos = 0;
    int overflow = 0;
    for (;;) {
        int l = mg_token_len(smiles + pos);
        if (l == 0) break;
        if (l < 0) {
            char ch[8];
            show_char((unsigned char)smiles[pos], ch);
            if (errpos) *errpos = pos;
            if (ntok) *ntok = n;
            if (smiles[pos] == '[')
                return mg_fail(err, MG_ERR_TOKEN,
                               "position %d: cannot tokenise '[' (unclosed, empty "
                               "or longer than %d bytes bracket atom)",
                               pos, MG_TOKEN_MAX);
            if (smiles[pos] == '%')
                return mg_fail(err, MG_ERR_TOKEN,
                               "position %d: cannot tokenise '%%' (needs two digits)", pos);
            return mg_fail(err, MG_ERR_TOKEN, "position %d: cannot tokenise '%s'", pos, ch);
        }
        if (n < cap) {
            spans[n].start = pos;
            spans[n].len = l;
        } else {
            overflow = 1;
        }
        n++;
        pos += l;
    }
    if (ntok) *ntok = n;
    if (overflow) return mg_fail(err, MG_ERR_TOO_LONG, "%d tokens, more than the limit %d", n, cap);
    return 0;
}

/* ------------------------------------------------------------ vocabulary */

/* strcmp of a NUL-terminated a against the slice b[0..blen). */
static int cmp_slice(const char *a, const char *b, int blen) {
    int r = strncmp(a, b, (size_t)blen);
    if (r != 0) return r;
    return a[blen] ? 1 : 0;
}

static void build_order(mg_vocab *v) {
    for (int i = 0; i < v->n; i++) v->order[i] = i;
    /* Insertion sort (no qsort context pointer in C11); n is small. */
    for (int i = 1; i < v->n; i++) {
        int x = v->order[i];
        int j = i - 1;
        while (j >= 0 && strcmp(v->tok[v->order[j]], v->tok[x]) > 0) {
            v->order[j + 1] = v->order[j];
            j--;
        }
        v->order[j + 1] = x;
    }
}

static mg_vocab *vocab_alloc(int n) {
    mg_vocab *v = calloc(1, sizeof *v);
    if (!v) return NULL;
    v->tok = calloc((size_t)n, sizeof *v->tok);
    v->order = calloc((size_t)n, sizeof *v->order);
    if (!v->tok || !v->order) {
        free(v->tok);
        free(v->order);
        free(v);
        return NULL;
    }
    v->n = n;
    return v;
}

void mg_vocab_free(mg_vocab *v) {
    if (!v) return;
    free(v->tok);
    free(v->order);
    free(v);
}

static int cmp_str_ptr(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static int is_special(const char *t) {
    for (int i = 0; i < MG_NUM_SPECIAL; i++)
        if (strcmp(t, k_specials[i]) == 0) return 1;
    return 0;
}

mg_status mg_vocab_from_tokens(const char *const *tokens, size_t n, mg_vocab **out, mg_error *err) {
    if (!out || (n > 0 && !tokens))
        return mg_fail(err, MG_ERR_ARG, "mg_vocab_from_tokens: bad argument");
    *out = NULL;
    if (n > MG_VOCAB_MAX - MG_NUM_SPECIAL)
        return mg_fail(err, MG_ERR_ARG, "vocabulary of %zu tokens is absurd", n);
    for (size_t i = 0; i < n; i++) {
        const char *t = tokens[i];
        if (!t) return mg_fail(err, MG_ERR_ARG, "token %zu is NULL", i);
        if (is_special(t))
            return mg_fail(err, MG_ERR_ARG, "token %zu '%s' is a special token", i, t);
        int l = mg_token_len(t);
        if (l <= 0 || t[l] != '\0')
            return mg_fail(err, MG_ERR_ARG, "token %zu '%.40s' is not exactly one SMILES token", i,
                           t);
    }
    const char **sorted = malloc((n ? n : 1) * sizeof *sorted);
    if (!sorted) return mg_fail(err, MG_ERR_NOMEM, "out of memory");
    memcpy(sorted, tokens, n * sizeof *sorted);
    qsort(sorted, n, sizeof *sorted, cmp_str_ptr);
    size_t m = 0;
    for (size_t i = 0; i < n; i++)
        if (m == 0 || strcmp(sorted[m - 1], sorted[i]) != 0) sorted[m++] = sorted[i];
    mg_vocab *v = vocab_alloc((int)m + MG_NUM_SPECIAL);
    if (!v) {
        free(sorted);
        return mg_fail(err, MG_ERR_NOMEM, "out of memory");
    }
    for (int i = 0; i < MG_NUM_SPECIAL; i++) strcpy(v->tok[i], k_specials[i]);
    for (size_t i = 0; i < m; i++) strcpy(v->tok[MG_NUM_SPECIAL + i], sorted[i]);
    free(sorted);
    build_order(v);
    *out = v;
    return 0;
}

mg_status mg_vocab_extend(const mg_vocab *base, const char *const *tokens, size_t n,
                          mg_vocab **out, int *added, mg_error *err) {
    if (added) *added = 0;
    if (!base || !out || (n > 0 && !tokens))
        return mg_fail(err, MG_ERR_ARG, "mg_vocab_extend: bad argument");
    *out = NULL;
    mg_vocab *nv = NULL; /* the new tokens alone, sorted and deduplicated */
    mg_status rc = mg_vocab_from_tokens(tokens, n, &nv, err);
    if (rc) return rc;
    int m = 0;
    for (int i = MG_NUM_SPECIAL; i < nv->n; i++)
        m += mg_vocab_lookup(base, nv->tok[i], -1) < 0;
    if (base->n + m > MG_VOCAB_MAX) {
        mg_vocab_free(nv);
        return mg_fail(err, MG_ERR_ARG, "vocabulary of %d tokens is absurd", base->n + m);
    }
    mg_vocab *v = vocab_alloc(base->n + m);
    if (!v) {
        mg_vocab_free(nv);
        return mg_fail(err, MG_ERR_NOMEM, "out of memory");
    }
    memcpy(v->tok, base->tok, (size_t)base->n * sizeof *v->tok);
    int k = base->n;
    for (int i = MG_NUM_SPECIAL; i < nv->n; i++) /* nv's ids are in strcmp order */
        if (mg_vocab_lookup(base, nv->tok[i], -1) < 0) strcpy(v->tok[k++], nv->tok[i]);
    mg_vocab_free(nv);
    build_order(v);
    if (added) *added = m;
    *out = v;
    return MG_OK;
}

/* A tiny open-addressing set of token strings, for building. */
typedef struct {
    size_t cap, n;
    mg_tokstr *slot;
    unsigned char *used;
} tokset;

static uint64_t hash_slice(const char *s, int len) {
    uint64_t h = 1469598103934665603ULL;
    for (int i = 0; i < len; i++) {
        h ^= (unsigned char)s[i];
        h *= 1099511628211ULL;
    }
    return h;
}

static int tokset_init(tokset *s, size_t cap) {
    s->cap = cap;
    s->n = 0;
    s->slot = calloc(cap, sizeof *s->slot);
    s->used = calloc(cap, 1);
    if (!s->slot || !s->used) {
        free(s->slot);
        free(s->used);
        return -1;
    }
    return 0;
}

static void tokset_free(tokset *s) {
    free(s->slot);
    free(s->used);
    s->slot = NULL;
    s->used = NULL;
}

static int tokset_add(tokset *s, const char *t, int len);

static int tokset_grow(tokset *s) {
    tokset bigger;
    if (tokset_init(&bigger, s->cap * 2)) return -1;
    for (size_t i = 0; i < s->cap; i++)
        if (s->used[i]) tokset_add(&bigger, s->slot[i], (int)strlen(s->slot[i]));
    tokset_free(s);
    *s = bigger;
    return 0;
}

static int tokset_add(tokset *s, const char *t, int len) {
    if ((s->n + 1) * 2 > s->cap && tokset_grow(s)) return -1;
    size_t i = (size_t)(hash_slice(t, len) & (s->cap - 1));
    while (s->used[i]) {
        if (cmp_slice(s->slot[i], t, len) == 0) return 0;
        i = (i + 1) & (s->cap - 1);
    }
    s->used[i] = 1;
    memcpy(s->slot[i], t, (size_t)len);
    s->slot[i][len] = '\0';
    s->n++;
    return 0;
}

mg_status mg_vocab_build(const char *const *smiles, size_t n, mg_vocab **out, mg_error *err) {
    if (!out || (n > 0 && !smiles)) return mg_fail(err, MG_ERR_ARG, "mg_vocab_build: bad argument");
    *out = NULL;
    tokset set;
    if (tokset_init(&set, 256)) return mg_fail(err, MG_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < n; i++) {
        const char *s = smiles[i];
        if (!s) {
            tokset_free(&set);
            return mg_fail(err, MG_ERR_ARG, "smiles[%zu] is NULL", i);
        }
        int pos = 0;
        for (;;) {
            int l = mg_token_len(s + pos);
            if (l == 0) break;
            if (l < 0) {
                mg_error e2;
                mg_tokenize(s, NULL, 0, NULL, NULL, &e2);
                tokset_free(&set);
                return mg_fail(err, e2.status, "smiles[%zu] %s", i, e2.message);
            }
            if (tokset_add(&set, s + pos, l)) {
                tokset_free(&set);
                return mg_fail(err, MG_ERR_NOMEM, "out of memory");
            }
            pos += l;
        }
    }
    const char **list = malloc((set.n ? set.n : 1) * sizeof *list);
    if (!list) {
        tokset_free(&set);
        return mg_fail(err, MG_ERR_NOMEM, "out of memory");
    }
    size_t m = 0;
    for (size_t i = 0; i < set.cap; i++)
        if (set.used[i]) list[m++] = set.slot[i];
    mg_status rc = mg_vocab_from_tokens(list, m, out, err);
    free(list);
    tokset_free(&set);
    return rc;
}

int mg_vocab_size(const mg_vocab *v) { return v ? v->n : 0; }

const char *mg_vocab_token(const mg_vocab *v, int id) {
    if (!v || id < 0 || id >= v->n) return NULL;
    return v->tok[id];
}

int mg_vocab_lookup(const mg_vocab *v, const char *tok, int len) {
    if (!v || !tok) return -1;
    if (len < 0) len = (int)strlen(tok);
    if (len > MG_TOKEN_MAX) return -1;
    int lo = 0, hi = v->n - 1;
    while (lo <= hi) {
        int mid = lo + (hi - lo) / 2;
        int id = v->order[mid];
        int c = cmp_slice(v->tok[id], tok, len);
        if (c == 0) return id;
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid - 1;
    }
    return -1;
}

mg_status mg_vocab_encode(const mg_vocab *v, const char *smiles, int32_t *ids, int cap, int *n,
                          mg_error *err) {
    if (n) *n = 0;
    if (!v || !smiles || cap < 0 || (cap > 0 && !ids))
        return mg_fail(err, MG_ERR_ARG, "mg_vocab_encode: bad argument");
    int k = 0, pos = 0;
    for (;;) {
        int l = mg_token_len(smiles + pos);
        if (l == 0) break;
        if (l < 0) {
            if (n) *n = k;
            mg_tokenize(smiles, NULL, 0, NULL, NULL, err); /* the message */
            return MG_ERR_TOKEN;
        }
        int id = mg_vocab_lookup(v, smiles + pos, l);
        if (id < MG_NUM_SPECIAL) { /* absent, or a special's text (impossible) */
            if (n) *n = k;
            return mg_fail(err, MG_ERR_UNKNOWN_TOKEN, "unknown token '%.*s' at position %d", l,
                           smiles + pos, pos);
        }
        if (k < cap) ids[k] = id;
        k++;
        pos += l;
    }
    if (n) *n = k;
    if (k > cap) return mg_fail(err, MG_ERR_TOO_LONG, "%d tokens, more than the limit %d", k, cap);
    return 0;
}

mg_status mg_vocab_decode(const mg_vocab *v, const int32_t *ids, int n, char *out, size_t outlen,
                          size_t *len, mg_error *err) {
    if (len) *len = 0;
    if (!v || (n > 0 && !ids) || n < 0 || !out || outlen == 0)
        return mg_fail(err, MG_ERR_ARG, "mg_vocab_decode: bad argument");
    size_t pos = 0;
    out[0] = '\0';
    for (int i = 0; i < n; i++) {
        int32_t id = ids[i];
        if (id < 0 || id >= v->n)
            return mg_fail(err, MG_ERR_ARG, "id %ld at position %d out of range [0, %d)", (long)id,
                           i, v->n);
        if (id == MG_EOS) break;
        if (id == MG_BOS || id == MG_PAD) continue;
        size_t l = strlen(v->tok[id]);
        if (pos + l + 1 > outlen) {
            size_t room = outlen - 1 - pos;
            memcpy(out + pos, v->tok[id], room);
            out[outlen - 1] = '\0';
            return mg_fail(err, MG_ERR_TOO_LONG,
                           "decoded string longer than the buffer (%zu bytes)", outlen);
        }
        memcpy(out + pos, v->tok[id], l);
        pos += l;
        out[pos] = '\0';
    }
    if (len) *len = pos;
    return MG_OK;
}

char *mg_vocab_to_json(const mg_vocab *v) {
    if (!v) return NULL;
    json_t *a = json_array();
    for (int i = 0; a && i < v->n; i++)
        if (json_array_append_new(a, json_string(v->tok[i]))) {
            json_decref(a);
            return NULL;
        }
    char *s = mg_json_dump(a, 17);
    json_decref(a);
    return s;
}

mg_status mg_vocab_from_json(const char *json, size_t len, mg_vocab **out, mg_error *err) {
    if (!out || !json) return mg_fail(err, MG_ERR_ARG, "mg_vocab_from_json: bad argument");
    *out = NULL;
    json_t *j = NULL;
    mg_error e2;
    if (mg_json_parse(json, len, &j, &e2))
        return mg_fail(err, e2.status, "vocab JSON: %s", e2.message);
    mg_status rc = MG_OK;
    mg_vocab *v = NULL;
    if (!json_is_array(j)) {
        rc = mg_fail(err, MG_ERR_FORMAT, "vocab JSON: not an array");
        goto done;
    }
    const size_t n = json_array_size(j);
    if (n < MG_NUM_SPECIAL || n > MG_VOCAB_MAX) {
        rc = mg_fail(err, MG_ERR_FORMAT, "vocab JSON: %zu entries", n);
        goto done;
    }
    for (size_t i = 0; i < n; i++) {
        const json_t *e = json_array_get(j, i);
        if (!json_is_string(e)) {
            rc = mg_fail(err, MG_ERR_FORMAT, "vocab JSON: entry %zu is not a string", i);
            goto done;
        }
        const char *str = json_string_value(e);
        if (i < MG_NUM_SPECIAL) {
            if (strcmp(str, k_specials[i]) != 0) {
                rc = mg_fail(err, MG_ERR_FORMAT, "vocab JSON: entry %zu is '%.40s', expected '%s'",
                             i, str, k_specials[i]);
                goto done;
            }
        } else {
            int l = mg_token_len(str);
            if (l <= 0 || (size_t)l != json_string_length(e) || is_special(str)) {
                rc = mg_fail(err, MG_ERR_FORMAT,
                             "vocab JSON: entry %zu '%.40s' is not exactly one SMILES token", i,
                             str);
                goto done;
            }
        }
    }
    v = vocab_alloc((int)n);
    if (!v) {
        rc = mg_fail(err, MG_ERR_NOMEM, "out of memory");
        goto done;
    }
    for (size_t i = 0; i < n; i++) strcpy(v->tok[i], json_string_value(json_array_get(j, i)));
    build_order(v);
    for (int i = 1; i < v->n; i++)
        if (strcmp(v->tok[v->order[i - 1]], v->tok[v->order[i]]) == 0) {
            rc = mg_fail(err, MG_ERR_FORMAT, "vocab JSON: duplicate token '%s'",
                         v->tok[v->order[i]]);
            mg_vocab_free(v);
            v = NULL;
            goto done;
        }
    *out = v;
done:
    json_decref(j);
    return rc;
}

int mg_vocab_equal(const mg_vocab *a, const mg_vocab *b) {
    if (!a || !b || a->n != b->n) return 0;
    for (int i = 0; i < a->n; i++)
        if (strcmp(a->tok[i], b->tok[i]) != 0) return 0;
    return 1;
}
