/* molgen safetensors: dtypes and the reader (see safetensors.h); the writer
 * is safetensors_write.c. */
#define _POSIX_C_SOURCE 200809L
#include "safetensors.h"
#include "errors.h"
#include "st_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

int mg_st_host_le(void)
{
    const uint16_t x = 1;
    unsigned char b;
    memcpy(&b, &x, 1);
    return b == 1;
}


/* CRC-32 (zlib's, the same as Python's zlib.crc32) of n bytes. */
uint32_t mg_st_crc32(const void *p, size_t n)
{
    return (uint32_t)crc32_z(crc32_z(0L, Z_NULL, 0), (const Bytef *)p, n);
}

/* ================================================================ JSON */

typedef struct {
    const char *s;
    size_t len, pos;
    mg_error *err;
    int failed;
} jparser;

static int jfail(jparser *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int jfail(jparser *p, const char *fmt, ...)
{
    if (!p->failed && p->err) {
        char msg[160];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, sizeof msg, fmt, ap);
        va_end(ap);
        mg_fail(p->err, MG_ERR_FORMAT, "JSON error at byte %zu: %s", p->pos, msg);
    }
    p->failed = 1;
    return -1;
}

static void jskip_ws(jparser *p)
{
    while (p->pos < p->len) {
        char c = p->s[p->pos];
        if (c == ' ' || c == '\t' || c == '\n' || c == '\r')
            p->pos++;
        else
            break;
    }
}

static void json_clear(mg_json *j)
{
    if (!j)
        return;
    if (j->type == MG_JSON_ARRAY || j->type == MG_JSON_OBJECT) {
        for (size_t i = 0; i < j->len; i++) {
            json_clear(&j->items[i]);
            if (j->keys)
                free(j->keys[i]);
        }
        free(j->items);
        free(j->keys);
    }
    free(j->str);
    memset(j, 0, sizeof *j);
}

void mg_json_free(mg_json *j)
{
    if (!j)
        return;
    json_clear(j);
    free(j);
}

static void put_utf8(char *out, size_t *o, uint32_t cp)
{
    if (cp < 0x80) {
        out[(*o)++] = (char)cp;
    } else if (cp < 0x800) {
        out[(*o)++] = (char)(0xC0 | (cp >> 6));
        out[(*o)++] = (char)(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
        out[(*o)++] = (char)(0xE0 | (cp >> 12));
        out[(*o)++] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[(*o)++] = (char)(0x80 | (cp & 0x3F));
    } else {
        out[(*o)++] = (char)(0xF0 | (cp >> 18));
        out[(*o)++] = (char)(0x80 | ((cp >> 12) & 0x3F));
        out[(*o)++] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[(*o)++] = (char)(0x80 | (cp & 0x3F));
    }
}

static int hex4(jparser *p, uint32_t *v)
{
    if (p->len - p->pos < 4)
        return jfail(p, "truncated \\u escape");
    uint32_t x = 0;
    for (int i = 0; i < 4; i++) {
        char c = p->s[p->pos + (size_t)i];
        x <<= 4;
        if (c >= '0' && c <= '9')
            x |= (uint32_t)(c - '0');
        else if (c >= 'a' && c <= 'f')
            x |= (uint32_t)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F')
            x |= (uint32_t)(c - 'A' + 10);
        else
            return jfail(p, "bad hex digit in \\u escape");
    }
    p->pos += 4;
    *v = x;
    return 0;
}

/* p->pos at the opening quote. Decoded string (NUL-terminated) into *out. */
static int jparse_string(jparser *p, char **out, size_t *outlen)
{
    p->pos++; /* '"' */
    /* Decoded length <= raw length, so the raw span bounds the buffer. */
    size_t start = p->pos, end = start;
    while (end < p->len && p->s[end] != '"') {
        if (p->s[end] == '\\')
            end++;
        end++;
    }
    if (end >= p->len)
        return jfail(p, "unterminated string");
    char *buf = malloc(end - start + 1);
    if (!buf)
        return jfail(p, "out of memory");
    size_t o = 0;
    while (p->pos < end) {
        unsigned char c = (unsigned char)p->s[p->pos];
        if (c < 0x20) {
            free(buf);
            return jfail(p, "control character 0x%02X in string", c);
        }
        if (c != '\\') {
            buf[o++] = (char)c;
            p->pos++;
            continue;
        }
        p->pos++;
        char e = p->s[p->pos++];
        switch (e) {
        case '"': buf[o++] = '"'; break;
        case '\\': buf[o++] = '\\'; break;
        case '/': buf[o++] = '/'; break;
        case 'b': buf[o++] = '\b'; break;
        case 'f': buf[o++] = '\f'; break;
        case 'n': buf[o++] = '\n'; break;
        case 'r': buf[o++] = '\r'; break;
        case 't': buf[o++] = '\t'; break;
        case 'u': {
            uint32_t cp;
            if (hex4(p, &cp)) {
                free(buf);
                return -1;
            }
            if (cp >= 0xD800 && cp <= 0xDBFF) {
                uint32_t lo;
                if (p->pos + 2 > end || p->s[p->pos] != '\\' || p->s[p->pos + 1] != 'u') {
                    free(buf);
                    return jfail(p, "lone high surrogate");
                }
                p->pos += 2;
                if (hex4(p, &lo)) {
                    free(buf);
                    return -1;
                }
                if (lo < 0xDC00 || lo > 0xDFFF) {
                    free(buf);
                    return jfail(p, "bad low surrogate");
                }
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
                free(buf);
                return jfail(p, "lone low surrogate");
            } else if (cp == 0) {
                free(buf);
                return jfail(p, "\\u0000 not supported");
            }
            /* \uXXXX takes 6 raw bytes and decodes to <= 3 (4 for a 12-byte
             * pair), so the buffer cannot overflow. */
            put_utf8(buf, &o, cp);
            break;
        }
        default:
            free(buf);
            return jfail(p, "bad escape '\\%c'", (e >= 0x20 && e < 0x7f) ? e : '?');
        }
        if (p->pos > end) { /* an escape ran over the closing quote */
            free(buf);
            return jfail(p, "unterminated string");
        }
    }
    p->pos = end + 1;
    buf[o] = '\0';
    *out = buf;
    if (outlen)
        *outlen = o;
    return 0;
}

static int jparse_number(jparser *p, mg_json *j)
{
    size_t st = p->pos, i = p->pos;
    int is_int = 1;
    if (i < p->len && p->s[i] == '-')
        i++;
    if (i >= p->len)
        return jfail(p, "truncated number");
    if (p->s[i] == '0') {
        i++;
    } else if (p->s[i] >= '1' && p->s[i] <= '9') {
        while (i < p->len && p->s[i] >= '0' && p->s[i] <= '9')
            i++;
    } else {
        return jfail(p, "bad number");
    }
    if (i < p->len && p->s[i] == '.') {
        is_int = 0;
        i++;
        size_t d = i;
        while (i < p->len && p->s[i] >= '0' && p->s[i] <= '9')
            i++;
        if (i == d)
            return jfail(p, "bad number: no digits after '.'");
    }
    if (i < p->len && (p->s[i] == 'e' || p->s[i] == 'E')) {
        is_int = 0;
        i++;
        if (i < p->len && (p->s[i] == '+' || p->s[i] == '-'))
            i++;
        size_t d = i;
        while (i < p->len && p->s[i] >= '0' && p->s[i] <= '9')
            i++;
        if (i == d)
            return jfail(p, "bad number: no exponent digits");
    }
    size_t n = i - st;
    char tmp[64];
    char *buf = tmp;
    if (n >= sizeof tmp) {
        buf = malloc(n + 1);
        if (!buf)
            return jfail(p, "out of memory");
    }
    memcpy(buf, p->s + st, n);
    buf[n] = '\0';
    j->type = MG_JSON_NUMBER;
    j->number = strtod(buf, NULL);
    if (is_int) {
        /* exact int64 parse with overflow detection */
        const char *q = buf;
        int neg = 0;
        if (*q == '-') {
            neg = 1;
            q++;
        }
        uint64_t acc = 0;
        int ok = 1;
        for (; *q; q++) {
            uint64_t d = (uint64_t)(*q - '0');
            if (acc > (UINT64_MAX - d) / 10) {
                ok = 0;
                break;
            }
            acc = acc * 10 + d;
        }
        if (ok && !neg && acc <= (uint64_t)INT64_MAX) {
            j->is_int = 1;
            j->integer = (int64_t)acc;
        } else if (ok && neg && acc <= (uint64_t)INT64_MAX + 1u) {
            j->is_int = 1;
            j->integer = acc == (uint64_t)INT64_MAX + 1u ? INT64_MIN : -(int64_t)acc;
        }
    }
    if (buf != tmp)
        free(buf);
    p->pos = i;
    return 0;
}

static int cmp_keyptr(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static int jparse_value(jparser *p, mg_json *j, int depth);

static int jgrow(jparser *p, mg_json *j, size_t *cap, int with_keys)
{
    if (j->len < *cap)
        return 0;
    size_t nc = *cap ? *cap * 2 : 4;
    mg_json *it = realloc(j->items, nc * sizeof *it);
    if (!it)
        return jfail(p, "out of memory");
    j->items = it;
    if (with_keys) {
        char **k = realloc(j->keys, nc * sizeof *k);
        if (!k)
            return jfail(p, "out of memory");
        j->keys = k;
    }
    *cap = nc;
    return 0;
}

static int jparse_container(jparser *p, mg_json *j, int depth, int is_obj)
{
    char close = is_obj ? '}' : ']';
    j->type = is_obj ? MG_JSON_OBJECT : MG_JSON_ARRAY;
    size_t cap = 0;
    p->pos++;
    jskip_ws(p);
    if (p->pos < p->len && p->s[p->pos] == close) {
        p->pos++;
        return 0;
    }
    for (;;) {
        if (jgrow(p, j, &cap, is_obj))
            return -1;
        char *key = NULL;
        if (is_obj) {
            jskip_ws(p);
            if (p->pos >= p->len || p->s[p->pos] != '"')
                return jfail(p, "expected a string key");
            if (jparse_string(p, &key, NULL))
                return -1;
            jskip_ws(p);
            if (p->pos >= p->len || p->s[p->pos] != ':') {
                free(key);
                return jfail(p, "expected ':'");
            }
            p->pos++;
        }
        mg_json *item = &j->items[j->len];
        memset(item, 0, sizeof *item);
        if (is_obj)
            j->keys[j->len] = key;
        j->len++; /* counted now so that it is freed on failure */
        if (jparse_value(p, item, depth + 1))
            return -1;
        jskip_ws(p);
        if (p->pos >= p->len)
            return jfail(p, "unexpected end inside %s", is_obj ? "object" : "array");
        char c = p->s[p->pos];
        if (c == ',') {
            p->pos++;
            continue;
        }
        if (c == close) {
            p->pos++;
            break;
        }
        return jfail(p, "expected ',' or '%c'", close);
    }
    if (is_obj && j->len > 1) {
        char **sorted = malloc(j->len * sizeof *sorted);
        if (!sorted)
            return jfail(p, "out of memory");
        memcpy(sorted, j->keys, j->len * sizeof *sorted);
        qsort(sorted, j->len, sizeof *sorted, cmp_keyptr);
        for (size_t i = 1; i < j->len; i++)
            if (strcmp(sorted[i - 1], sorted[i]) == 0) {
                jfail(p, "duplicate key \"%.60s\"", sorted[i]);
                free(sorted);
                return -1;
            }
        free(sorted);
    }
    return 0;
}

static int jparse_lit(jparser *p, const char *lit)
{
    size_t n = strlen(lit);
    if (p->len - p->pos < n || memcmp(p->s + p->pos, lit, n) != 0)
        return jfail(p, "unexpected character");
    p->pos += n;
    return 0;
}

static int jparse_value(jparser *p, mg_json *j, int depth)
{
    if (depth > MG_JSON_MAX_DEPTH)
        return jfail(p, "nesting deeper than %d", MG_JSON_MAX_DEPTH);
    jskip_ws(p);
    if (p->pos >= p->len)
        return jfail(p, "unexpected end of input");
    char c = p->s[p->pos];
    switch (c) {
    case '{':
        return jparse_container(p, j, depth, 1);
    case '[':
        return jparse_container(p, j, depth, 0);
    case '"':
        j->type = MG_JSON_STRING;
        return jparse_string(p, &j->str, &j->len);
    case 't':
        j->type = MG_JSON_BOOL;
        j->boolean = 1;
        return jparse_lit(p, "true");
    case 'f':
        j->type = MG_JSON_BOOL;
        return jparse_lit(p, "false");
    case 'n':
        j->type = MG_JSON_NULL;
        return jparse_lit(p, "null");
    default:
        if (c == '-' || (c >= '0' && c <= '9'))
            return jparse_number(p, j);
        if ((unsigned char)c >= 0x20 && (unsigned char)c < 0x7f)
            return jfail(p, "unexpected character '%c'", c);
        return jfail(p, "unexpected byte 0x%02X", (unsigned char)c);
    }
}

mg_status mg_json_parse(const char *text, size_t len, mg_json **out, mg_error *err)
{
    if (!out || (!text && len > 0))
        return mg_fail(err, MG_ERR_ARG, "mg_json_parse: bad argument");
    *out = NULL;
    mg_json *j = calloc(1, sizeof *j);
    if (!j)
        return mg_fail(err, MG_ERR_NOMEM, "out of memory");
    jparser p = {text, len, 0, err, 0};
    if (jparse_value(&p, j, 0)) {
        mg_json_free(j);
        return MG_ERR_FORMAT;
    }
    jskip_ws(&p);
    if (p.pos != len) {
        jfail(&p, "trailing characters after the value");
        mg_json_free(j);
        return MG_ERR_FORMAT;
    }
    *out = j;
    return 0;
}

const mg_json *mg_json_get(const mg_json *j, const char *key)
{
    if (!j || !key || j->type != MG_JSON_OBJECT)
        return NULL;
    for (size_t i = 0; i < j->len; i++)
        if (strcmp(j->keys[i], key) == 0)
            return &j->items[i];
    return NULL;
}

size_t mg_json_quote(const char *s, char *out, size_t outlen)
{
    size_t n = 0;
    char esc[8];
#define PUTC(ch)                          \
    do {                                  \
        if (out && n + 1 < outlen)        \
            out[n] = (ch);                \
        n++;                              \
    } while (0)
    PUTC('"');
    for (const unsigned char *q = (const unsigned char *)(s ? s : ""); *q; q++) {
        const char *e = NULL;
        switch (*q) {
        case '"': e = "\\\""; break;
        case '\\': e = "\\\\"; break;
        case '\n': e = "\\n"; break;
        case '\r': e = "\\r"; break;
        case '\t': e = "\\t"; break;
        case '\b': e = "\\b"; break;
        case '\f': e = "\\f"; break;
        default:
            if (*q < 0x20) {
                snprintf(esc, sizeof esc, "\\u%04x", *q);
                e = esc;
            }
        }
        if (e) {
            for (; *e; e++)
                PUTC(*e);
        } else {
            PUTC((char)*q);
        }
    }
    PUTC('"');
#undef PUTC
    if (out && outlen > 0)
        out[n < outlen ? n : outlen - 1] = '\0';
    return n;
}

/* ================================================================ dtypes */

static const struct {
    const char *name;
    size_t size;
} k_dtypes[MG_ST_NUM_DTYPES] = {
    [MG_ST_BOOL] = {"BOOL", 1},       [MG_ST_U8] = {"U8", 1},
    [MG_ST_I8] = {"I8", 1},           [MG_ST_F8_E5M2] = {"F8_E5M2", 1},
    [MG_ST_F8_E4M3] = {"F8_E4M3", 1}, [MG_ST_I16] = {"I16", 2},
    [MG_ST_U16] = {"U16", 2},         [MG_ST_F16] = {"F16", 2},
    [MG_ST_BF16] = {"BF16", 2},       [MG_ST_I32] = {"I32", 4},
    [MG_ST_U32] = {"U32", 4},         [MG_ST_F32] = {"F32", 4},
    [MG_ST_F64] = {"F64", 8},         [MG_ST_I64] = {"I64", 8},
    [MG_ST_U64] = {"U64", 8},
};

const char *mg_st_dtype_name(mg_st_dtype dt)
{
    if ((int)dt < 0 || dt >= MG_ST_NUM_DTYPES)
        return NULL;
    return k_dtypes[dt].name;
}

size_t mg_st_dtype_size(mg_st_dtype dt)
{
    if ((int)dt < 0 || dt >= MG_ST_NUM_DTYPES)
        return 0;
    return k_dtypes[dt].size;
}

int mg_st_dtype_parse(const char *name, mg_st_dtype *dt)
{
    if (!name)
        return -1;
    for (int i = 0; i < MG_ST_NUM_DTYPES; i++)
        if (strcmp(name, k_dtypes[i].name) == 0) {
            if (dt)
                *dt = (mg_st_dtype)i;
            return 0;
        }
    return -1;
}

/* prod(shape) * elsize with overflow detection; -1 on overflow. */
int mg_st_nbytes(const int64_t *shape, int ndim, size_t elsize, uint64_t *out)
{
    uint64_t n = 1;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0)
            return -1;
        uint64_t d = (uint64_t)shape[i];
        if (d != 0 && n > UINT64_MAX / d)
            return -1;
        n *= d;
    }
    if (elsize && n > UINT64_MAX / elsize)
        return -1;
    *out = n * elsize;
    return 0;
}

static void shape_str(const int64_t *shape, int ndim, char *out, size_t outlen)
{
    size_t o = 0;
    o += (size_t)snprintf(out, outlen, "[");
    for (int i = 0; i < ndim && o < outlen; i++)
        o += (size_t)snprintf(out + o, outlen - o, "%s%lld", i ? "," : "",
                              (long long)shape[i]);
    if (o < outlen)
        snprintf(out + o, outlen - o, "]");
}

/* ================================================================ reading */

struct mg_st_file {
    mg_json *hdr;           /* owns the name / metadata strings */
    const char *checksums;  /* __metadata__[MG_ST_CHECKSUM_KEY] (not listed as metadata) */
    int checksummed;        /* every tensor's CRC-32 was in the metadata and matched */
    unsigned char *data;    /* byte buffer (malloc'ed, so 16-aligned) */
    size_t data_len;
    size_t nt;
    mg_st_tensor *t;        /* sorted by offset */
    size_t nmeta;
    const char **mkey, **mval;
};

void mg_st_free(mg_st_file *f)
{
    if (!f)
        return;
    mg_json_free(f->hdr);
    free(f->data);
    free(f->t);
    free(f->mkey);
    free(f->mval);
    free(f);
}

typedef struct {
    uint64_t begin, end;
    size_t idx;
} span64;

static int cmp_span(const void *a, const void *b)
{
    const span64 *x = a, *y = b;
    if (x->begin != y->begin)
        return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end)
        return x->end < y->end ? -1 : 1;
    return 0;
}

/* The checksums in __metadata__[MG_ST_CHECKSUM_KEY], when present, must name
 * exactly the file's tensors and match their bytes. */
static mg_status verify_checksums(mg_st_file *f, mg_error *err)
{
    const char *cs = f->checksums;
    if (!cs)
        return 0;
    mg_json *j = NULL;
    mg_error e;
    if (mg_json_parse(cs, strlen(cs), &j, &e) || j->type != MG_JSON_OBJECT) {
        mg_json_free(j);
        return mg_fail(err, MG_ERR_FORMAT, "the checksum table (metadata '%s') is corrupt%s%s",
                       MG_ST_CHECKSUM_KEY, j ? "" : ": ", j ? "" : e.message);
    }
    mg_status rc = MG_OK;
    if (j->len != f->nt)
        rc = mg_fail(err, MG_ERR_FORMAT, "the checksum table lists %zu tensors, the file has %zu", j->len,
                     f->nt);
    for (size_t k = 0; !rc && k < f->nt; k++) {
        const mg_st_tensor *x = &f->t[k];
        const mg_json *v = mg_json_get(j, x->name);
        char *end = NULL;
        unsigned long want = v && v->type == MG_JSON_STRING && strlen(v->str) == 8
                                 ? strtoul(v->str, &end, 16) : 0;
        if (!end || *end)
            rc = mg_fail(err, MG_ERR_FORMAT, "the checksum table has no valid entry for tensor '%.60s'",
                         x->name);
        else if ((uint32_t)want != mg_st_crc32(x->data, x->nbytes))
            rc = mg_fail(err, MG_ERR_FORMAT, 
                         "tensor '%.60s' fails its checksum (CRC-32 %08x, recorded %08lx): the "
                         "file is corrupt", x->name, (unsigned)mg_st_crc32(x->data, x->nbytes), want);
    }
    mg_json_free(j);
    f->checksummed = rc == 0;
    return rc;
}

/* Validate the header (text hdr[0..hlen)) against a byte buffer of dlen
 * bytes; takes ownership of data on success and failure. */
static mg_status st_build(const char *hdr, size_t hlen, unsigned char *data, size_t dlen,
                    mg_st_file **out, mg_error *err)
{
    *out = NULL;
    mg_st_file *f = calloc(1, sizeof *f);
    if (!f) {
        free(data);
        return mg_fail(err, MG_ERR_NOMEM, "out of memory");
    }
    f->data = data;
    f->data_len = dlen;
    span64 *sp = NULL;
    mg_error e2;
    if (hlen == 0 || hdr[0] != '{') {
        mg_fail(err, MG_ERR_FORMAT, "not a safetensors file: header does not start with '{'");
        goto fail;
    }
    if (mg_json_parse(hdr, hlen, &f->hdr, &e2)) {
        mg_fail(err, e2.status, "safetensors header: %s", e2.message);
        goto fail;
    }
    const mg_json *h = f->hdr;
    if (h->type != MG_JSON_OBJECT) {
        mg_fail(err, MG_ERR_FORMAT, "safetensors header: not a JSON object");
        goto fail;
    }
    f->t = calloc(h->len ? h->len : 1, sizeof *f->t);
    sp = calloc(h->len ? h->len : 1, sizeof *sp);
    if (!f->t || !sp) {
        mg_fail(err, MG_ERR_NOMEM, "out of memory");
        goto fail;
    }
    for (size_t i = 0; i < h->len; i++) {
        const char *name = h->keys[i];
        const mg_json *e = &h->items[i];
        if (strcmp(name, "__metadata__") == 0) {
            if (e->type != MG_JSON_OBJECT) {
                mg_fail(err, MG_ERR_FORMAT, "safetensors header: __metadata__ is not an object");
                goto fail;
            }
            f->mkey = calloc(e->len ? e->len : 1, sizeof *f->mkey);
            f->mval = calloc(e->len ? e->len : 1, sizeof *f->mval);
            if (!f->mkey || !f->mval) {
                mg_fail(err, MG_ERR_NOMEM, "out of memory");
                goto fail;
            }
            for (size_t k = 0; k < e->len; k++) {
                if (e->items[k].type != MG_JSON_STRING) {
                    mg_fail(err, MG_ERR_FORMAT, 
                            "safetensors header: __metadata__ value of '%.60s' is not a string",
                            e->keys[k]);
                    goto fail;
                }
                if (strcmp(e->keys[k], MG_ST_CHECKSUM_KEY) == 0) {
                    f->checksums = e->items[k].str;
                    continue;
                }
                f->mkey[f->nmeta] = e->keys[k];
                f->mval[f->nmeta] = e->items[k].str;
                f->nmeta++;
            }
            continue;
        }
        if (e->type != MG_JSON_OBJECT) {
            mg_fail(err, MG_ERR_FORMAT, "tensor '%.60s': entry is not an object", name);
            goto fail;
        }
        const mg_json *jd = NULL, *js = NULL, *jo = NULL;
        for (size_t k = 0; k < e->len; k++) {
            if (strcmp(e->keys[k], "dtype") == 0)
                jd = &e->items[k];
            else if (strcmp(e->keys[k], "shape") == 0)
                js = &e->items[k];
            else if (strcmp(e->keys[k], "data_offsets") == 0)
                jo = &e->items[k];
            else {
                mg_fail(err, MG_ERR_FORMAT, "tensor '%.60s': unexpected field '%.40s'", name,
                        e->keys[k]);
                goto fail;
            }
        }
        if (!jd || !js || !jo) {
            mg_fail(err, MG_ERR_FORMAT, "tensor '%.60s': missing %s", name,
                    !jd ? "dtype" : !js ? "shape" : "data_offsets");
            goto fail;
        }
        mg_st_tensor *x = &f->t[f->nt];
        x->name = name;
        if (jd->type != MG_JSON_STRING || mg_st_dtype_parse(jd->str, &x->dtype)) {
            mg_fail(err, MG_ERR_FORMAT, "tensor '%.60s': unknown dtype %s%.20s%s", name,
                    jd->type == MG_JSON_STRING ? "'" : "(not a string)",
                    jd->type == MG_JSON_STRING ? jd->str : "",
                    jd->type == MG_JSON_STRING ? "'" : "");
            goto fail;
        }
        if (js->type != MG_JSON_ARRAY) {
            mg_fail(err, MG_ERR_FORMAT, "tensor '%.60s': shape is not an array", name);
            goto fail;
        }
        if (js->len > MG_ST_MAX_DIMS) {
            mg_fail(err, MG_ERR_FORMAT, "tensor '%.60s': %zu dimensions, more than the %d supported",
                    name, js->len, MG_ST_MAX_DIMS);
            goto fail;
        }
        x->ndim = (int)js->len;
        for (size_t d = 0; d < js->len; d++) {
            const mg_json *v = &js->items[d];
            if (v->type != MG_JSON_NUMBER || !v->is_int || v->integer < 0) {
                mg_fail(err, MG_ERR_FORMAT, "tensor '%.60s': shape[%zu] is not a non-negative integer",
                        name, d);
                goto fail;
            }
            x->shape[d] = v->integer;
        }
        if (jo->type != MG_JSON_ARRAY || jo->len != 2) {
            mg_fail(err, MG_ERR_FORMAT, "tensor '%.60s': data_offsets is not a [begin, end] pair", name);
            goto fail;
        }
        for (int k = 0; k < 2; k++) {
            const mg_json *v = &jo->items[k];
            if (v->type != MG_JSON_NUMBER || !v->is_int || v->integer < 0) {
                mg_fail(err, MG_ERR_FORMAT, 
                        "tensor '%.60s': data_offsets[%d] is not a non-negative integer", name, k);
                goto fail;
            }
        }
        uint64_t b = (uint64_t)jo->items[0].integer, en = (uint64_t)jo->items[1].integer;
        if (b > en) {
            mg_fail(err, MG_ERR_FORMAT, "tensor '%.60s': data_offsets [%llu, %llu] reversed", name,
                    (unsigned long long)b, (unsigned long long)en);
            goto fail;
        }
        if (en > dlen) {
            mg_fail(err, MG_ERR_FORMAT, 
                    "tensor '%.60s': data_offsets [%llu, %llu] beyond the %zu-byte data buffer "
                    "(truncated file?)",
                    name, (unsigned long long)b, (unsigned long long)en, dlen);
            goto fail;
        }
        uint64_t nb;
        char shp[160];
        shape_str(x->shape, x->ndim, shp, sizeof shp);
        if (mg_st_nbytes(x->shape, x->ndim, mg_st_dtype_size(x->dtype), &nb)) {
            mg_fail(err, MG_ERR_FORMAT, "tensor '%.60s': shape %s overflows", name, shp);
            goto fail;
        }
        if (nb != en - b) {
            mg_fail(err, MG_ERR_FORMAT, 
                    "tensor '%.60s': %s %s needs %llu bytes but data_offsets span %llu", name,
                    mg_st_dtype_name(x->dtype), shp, (unsigned long long)nb,
                    (unsigned long long)(en - b));
            goto fail;
        }
        x->data = data + b;
        x->nbytes = (size_t)nb;
        sp[f->nt].begin = b;
        sp[f->nt].end = en;
        sp[f->nt].idx = f->nt;
        f->nt++;
    }
    qsort(sp, f->nt, sizeof *sp, cmp_span);
    uint64_t at = 0;
    for (size_t k = 0; k < f->nt; k++) {
        const char *nm = f->t[sp[k].idx].name;
        if (sp[k].begin < at) {
            mg_fail(err, MG_ERR_FORMAT, "tensor '%.60s': data_offsets [%llu, %llu] overlap another tensor",
                    nm, (unsigned long long)sp[k].begin, (unsigned long long)sp[k].end);
            goto fail;
        }
        if (sp[k].begin > at) {
            mg_fail(err, MG_ERR_FORMAT, 
                    "tensor '%.60s': data_offsets begin at %llu, leaving a hole after byte %llu",
                    nm, (unsigned long long)sp[k].begin, (unsigned long long)at);
            goto fail;
        }
        at = sp[k].end;
    }
    if (at != dlen) {
        mg_fail(err, MG_ERR_FORMAT, 
                "data buffer has %zu bytes but the tensors cover %llu (trailing garbage or "
                "truncation)",
                dlen, (unsigned long long)at);
        goto fail;
    }
    if (verify_checksums(f, err))
        goto fail;
    /* reorder tensors by offset */
    {
        mg_st_tensor *sorted = calloc(f->nt ? f->nt : 1, sizeof *sorted);
        if (!sorted) {
            mg_fail(err, MG_ERR_NOMEM, "out of memory");
            goto fail;
        }
        for (size_t k = 0; k < f->nt; k++)
            sorted[k] = f->t[sp[k].idx];
        free(f->t);
        f->t = sorted;
    }
    free(sp);
    *out = f;
    return 0;
fail:
    free(sp);
    mg_st_free(f);
    return -1;
}

static uint64_t rd_le64(const unsigned char *b)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | b[i];
    return v;
}

static mg_status check_sizes(uint64_t n, size_t total, mg_error *err)
{
    if (total < 8)
        return mg_fail(err, MG_ERR_FORMAT, "not a safetensors file: %zu bytes, shorter than the 8-byte "
                                    "header size",
                       total);
    if (n > MG_ST_MAX_HEADER)
        return mg_fail(err, MG_ERR_FORMAT, 
                       "not a safetensors file: header size %llu is absurd (limit %u)",
                       (unsigned long long)n, MG_ST_MAX_HEADER);
    if (n > total - 8)
        return mg_fail(err, MG_ERR_FORMAT, 
                       "header size %llu larger than the rest of the file (%zu bytes): "
                       "truncated or not a safetensors file",
                       (unsigned long long)n, total - 8);
    return 0;
}

mg_status mg_st_parse(const void *buf, size_t len, mg_st_file **out, mg_error *err)
{
    mg_status rc_;
    if (!out || (!buf && len > 0))
        return mg_fail(err, MG_ERR_ARG, "mg_st_parse: bad argument");
    *out = NULL;
    if (!mg_st_host_le())
        return mg_fail(err, MG_ERR_FORMAT, "safetensors reader: big-endian hosts are not supported");
    const unsigned char *b = buf;
    uint64_t n = len >= 8 ? rd_le64(b) : 0;
    if ((rc_ = check_sizes(n, len, err)))
        return rc_;
    size_t dlen = len - 8 - (size_t)n;
    unsigned char *data = malloc(dlen ? dlen : 1);
    if (!data)
        return mg_fail(err, MG_ERR_NOMEM, "out of memory");
    if (dlen)
        memcpy(data, b + 8 + n, dlen);
    return st_build((const char *)b + 8, (size_t)n, data, dlen, out, err);
}

mg_status mg_st_load(const char *path, mg_st_file **out, mg_error *err)
{
    if (!out || !path)
        return mg_fail(err, MG_ERR_ARG, "mg_st_load: bad argument");
    *out = NULL;
    if (!mg_st_host_le())
        return mg_fail(err, MG_ERR_FORMAT, "safetensors reader: big-endian hosts are not supported");
    FILE *f = fopen(path, "rb");
    if (!f)
        return mg_fail(err, MG_ERR_IO, "cannot open %s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode)) {
        fclose(f);
        return mg_fail(err, MG_ERR_IO, "%s: not a regular file", path);
    }
    size_t total = (size_t)st.st_size;
    unsigned char n8[8] = {0};
    size_t got = fread(n8, 1, 8, f);
    uint64_t n = rd_le64(n8);
    mg_error e2;
    if (check_sizes(n, got < 8 ? got : total, &e2)) {
        fclose(f);
        return mg_fail(err, e2.status, "%s: %s", path, e2.message);
    }
    char *hdr = malloc(n ? (size_t)n : 1);
    size_t dlen = total - 8 - (size_t)n;
    unsigned char *data = malloc(dlen ? dlen : 1);
    if (!hdr || !data) {
        free(hdr);
        free(data);
        fclose(f);
        return mg_fail(err, MG_ERR_NOMEM, "%s: out of memory", path);
    }
    if (fread(hdr, 1, (size_t)n, f) != (size_t)n || fread(data, 1, dlen, f) != dlen) {
        free(hdr);
        free(data);
        fclose(f);
        return mg_fail(err, MG_ERR_IO, "%s: short read (file changed while reading?)", path);
    }
    fclose(f);
    mg_status rc = st_build(hdr, (size_t)n, data, dlen, out, &e2);
    free(hdr);
    if (rc)
        return mg_fail(err, e2.status, "%s: %s", path, e2.message);
    return 0;
}

size_t mg_st_count(const mg_st_file *f)
{
    return f ? f->nt : 0;
}

const mg_st_tensor *mg_st_at(const mg_st_file *f, size_t i)
{
    if (!f || i >= f->nt)
        return NULL;
    return &f->t[i];
}

const mg_st_tensor *mg_st_find(const mg_st_file *f, const char *name)
{
    if (!f || !name)
        return NULL;
    for (size_t i = 0; i < f->nt; i++)
        if (strcmp(f->t[i].name, name) == 0)
            return &f->t[i];
    return NULL;
}

static mg_status check_tensor(const mg_st_file *f, const char *name, mg_st_dtype dtype, int ndim,
                        const int64_t *shape, const mg_st_tensor **out, mg_error *err)
{
    const mg_st_tensor *x = mg_st_find(f, name);
    if (!x)
        return mg_fail(err, MG_ERR_FORMAT, "tensor '%s' not found", name ? name : "(null)");
    if (x->dtype != dtype)
        return mg_fail(err, MG_ERR_FORMAT, "tensor '%s': dtype %s, expected %s", name,
                       mg_st_dtype_name(x->dtype),
                       mg_st_dtype_name(dtype) ? mg_st_dtype_name(dtype) : "(invalid)");
    int same = x->ndim == ndim && (ndim == 0 || shape);
    for (int i = 0; same && i < ndim; i++)
        same = x->shape[i] == shape[i];
    if (!same) {
        char a[160], b[160];
        shape_str(x->shape, x->ndim, a, sizeof a);
        if (shape && ndim >= 0 && ndim <= MG_ST_MAX_DIMS)
            shape_str(shape, ndim, b, sizeof b);
        else
            snprintf(b, sizeof b, "(ndim %d)", ndim);
        return mg_fail(err, MG_ERR_FORMAT, "tensor '%s': shape %s, expected %s", name, a, b);
    }
    *out = x;
    return 0;
}

mg_status mg_st_get(const mg_st_file *f, const char *name, mg_st_dtype dtype, int ndim,
              const int64_t *shape, const void **data, mg_error *err)
{
    mg_status rc_;
    const mg_st_tensor *x;
    if (data)
        *data = NULL;
    if ((rc_ = check_tensor(f, name, dtype, ndim, shape, &x, err)))
        return rc_;
    size_t es = mg_st_dtype_size(x->dtype);
    if (((uintptr_t)x->data) % es != 0)
        return mg_fail(err, MG_ERR_FORMAT, "tensor '%s': data not aligned to %zu bytes; use mg_st_copy",
                       name, es);
    if (data)
        *data = x->data;
    return 0;
}

mg_status mg_st_copy(const mg_st_file *f, const char *name, mg_st_dtype dtype, int ndim,
               const int64_t *shape, void *dst, size_t dst_bytes, mg_error *err)
{
    mg_status rc_;
    const mg_st_tensor *x;
    if ((rc_ = check_tensor(f, name, dtype, ndim, shape, &x, err)))
        return rc_;
    if (dst_bytes != x->nbytes || (!dst && x->nbytes))
        return mg_fail(err, MG_ERR_FORMAT, "tensor '%s': %zu bytes, destination has %zu", name,
                       x->nbytes, dst_bytes);
    if (x->nbytes)
        memcpy(dst, x->data, x->nbytes);
    return 0;
}

const char *mg_st_meta(const mg_st_file *f, const char *key)
{
    if (!f || !key)
        return NULL;
    for (size_t i = 0; i < f->nmeta; i++)
        if (strcmp(f->mkey[i], key) == 0)
            return f->mval[i];
    return NULL;
}

int mg_st_checksummed(const mg_st_file *f)
{
    return f ? f->checksummed : 0;
}

int mg_st_remove_stale_temps(const char *path)
{
    if (!path || !*path)
        return 0;
    const char *slash = strrchr(path, '/');
    char dir[4096];
    const char *base = slash ? slash + 1 : path;
    if (!slash)
        snprintf(dir, sizeof dir, ".");
    else if (snprintf(dir, sizeof dir, "%.*s", slash == path ? 1 : (int)(slash - path), path) >=
             (int)sizeof dir)
        return 0;
    DIR *d = opendir(dir);
    if (!d)
        return 0;
    const size_t bl = strlen(base);
    int removed = 0;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        const char *n = de->d_name;
        if (strncmp(n, base, bl) != 0 || strncmp(n + bl, ".tmp.", 5) != 0)
            continue;
        const char *digits = n + bl + 5;
        char *end;
        errno = 0;
        long pid = strtol(digits, &end, 10);
        if (!*digits || *end || errno || pid <= 0 || pid == (long)getpid())
            continue;
        /* a writer that is still alive (or whose liveness we cannot tell) keeps its file */
        if (kill((pid_t)pid, 0) == 0 || errno != ESRCH)
            continue;
        char full[8192];
        if (snprintf(full, sizeof full, "%s/%s", dir, n) < (int)sizeof full && unlink(full) == 0)
            removed++;
    }
    closedir(d);
    return removed;
}

size_t mg_st_meta_count(const mg_st_file *f)
{
    return f ? f->nmeta : 0;
}

int mg_st_meta_at(const mg_st_file *f, size_t i, const char **key, const char **value)
{
    if (!f || i >= f->nmeta)
        return -1;
    if (key)
        *key = f->mkey[i];
    if (value)
        *value = f->mval[i];
    return 0;
}

