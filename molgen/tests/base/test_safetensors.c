/* Tests for molgen/base/safetensors.{h,c} and json.{h,c}: JSON rules, write/read round trip,
 * every corruption case, truncations, and a little fuzzing. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/json.h"
#include "base/safetensors.h"

#include "mg_test.h"

static uint64_t g_rng = 0x1234567ULL;
static uint64_t rnd(void) { return mg_splitmix64(&g_rng); }

/* ================================================================ JSON */

/* molgen's JSON rules on jansson (json.h): what parses, what is refused and
 * with which message. The needles are jansson's wording (molgen kept its own
 * parser before: its messages differed, the verdicts are the same). */
static void json_ok(const char *s) {
    json_t *j = NULL;
    mg_error err = {0};
    if (mg_json_parse(s, strlen(s), &j, &err) != 0 || !j) {
        fprintf(stderr, "JSON should parse: %s (%s)\n", s, err.message);
        tu_fail++;
    }
    json_decref(j);
}

static void json_bad(const char *s, const char *needle) {
    json_t *j = (json_t *)1;
    mg_error err = {0};
    if (mg_json_parse(s, strlen(s), &j, &err) == 0 || j != NULL || err.status != MG_ERR_FORMAT ||
        (needle && !strstr(err.message, needle)) || !strstr(err.message, "JSON error")) {
        fprintf(stderr, "JSON should fail: %s (got '%s', want '%s')\n", s, err.message,
                needle ? needle : "");
        tu_fail++;
        if (j && j != (json_t *)1) json_decref(j);
    }
}

static void test_json(void) {
    json_t *j = NULL;
    mg_error err = {0};
    const char *doc = " {\"a\": [1, -2, 3.5, 1e3, -0, 9223372036854775807, -9223372036854775808],"
                      " \"s\": \"q\\\"\\\\\\/\\b\\f\\n\\r\\t\\u00e9\\ud83d\\ude00\","
                      " \"t\": true, \"f\": false, \"n\": null, \"o\": {}, \"e\": []} ";
    CHECK(mg_json_parse(doc, strlen(doc), &j, &err) == 0);
    if (j) {
        CHECK(json_is_object(j) && json_object_size(j) == 7);
        const json_t *a = json_object_get(j, "a");
        CHECK(json_is_array(a) && json_array_size(a) == 7);
        if (json_array_size(a) == 7) {
            CHECK(json_is_integer(json_array_get(a, 0)) &&
                  json_integer_value(json_array_get(a, 0)) == 1);
            CHECK(json_is_integer(json_array_get(a, 1)) &&
                  json_integer_value(json_array_get(a, 1)) == -2);
            CHECK(json_is_real(json_array_get(a, 2)) &&
                  json_real_value(json_array_get(a, 2)) == 3.5);
            CHECK(json_is_real(json_array_get(a, 3)) &&
                  json_real_value(json_array_get(a, 3)) == 1000.0);
            CHECK(json_is_integer(json_array_get(a, 4)) &&
                  json_integer_value(json_array_get(a, 4)) == 0);
            CHECK(json_is_integer(json_array_get(a, 5)) &&
                  json_integer_value(json_array_get(a, 5)) == INT64_MAX);
            CHECK(json_is_integer(json_array_get(a, 6)) &&
                  json_integer_value(json_array_get(a, 6)) == INT64_MIN);
        }
        const json_t *s = json_object_get(j, "s");
        CHECK(json_is_string(s));
        if (s) {
            const char expect[] = "q\"\\/\b\f\n\r\t\xc3\xa9\xf0\x9f\x98\x80";
            CHECK(json_string_length(s) == sizeof expect - 1 &&
                  memcmp(json_string_value(s), expect, json_string_length(s)) == 0);
            /* write it back and re-parse: same bytes */
            char q[128];
            int ql = mg_json_dump_to(s, 17, q, sizeof q);
            CHECK(ql > 0 && ql < (int)sizeof q);
            json_t *k = NULL;
            CHECK(mg_json_parse(q, (size_t)ql, &k, &err) == 0);
            CHECK(json_is_string(k) && strcmp(json_string_value(k), json_string_value(s)) == 0);
            json_decref(k);
        }
        CHECK(json_is_true(json_object_get(j, "t")) && json_is_false(json_object_get(j, "f")));
        CHECK(json_is_null(json_object_get(j, "n")));
        CHECK(json_is_object(json_object_get(j, "o")) &&
              json_object_size(json_object_get(j, "o")) == 0);
        CHECK(json_is_array(json_object_get(j, "e")) &&
              json_array_size(json_object_get(j, "e")) == 0);
        CHECK(json_object_get(j, "zz") == NULL);
        CHECK(json_object_get(a, "a") == NULL);
        json_decref(j);
    }
    json_ok("0");
    json_ok("\"\"");
    json_ok("[[[[]]]]");
    json_bad("", "end of file");
    json_bad("   ", NULL);
    json_bad("{", NULL);
    json_bad("[1,]", NULL);
    json_bad("[1 2]", "']' expected");
    json_bad("{\"a\" 1}", "':'");
    json_bad("{\"a\":1,}", "string or '}' expected");
    json_bad("{1:2}", "string or '}' expected");
    json_bad("{\"a\":1,\"a\":2}", "duplicate object key");
    json_bad("01", "invalid token");
    json_bad("1.", "invalid token");
    json_bad("1e", "invalid token");
    json_bad("-", NULL);
    json_bad("+1", NULL);
    json_bad("tru", NULL);
    json_bad("nul", NULL);
    json_bad("\"abc", "premature end of input");
    json_bad("\"abc\\", "invalid escape");
    json_bad("\"a\\x\"", "invalid escape");
    json_bad("\"\\u12\"", NULL);
    json_bad("\"\\u12G4\"", "invalid escape");
    json_bad("\"\\ud83d\"", "invalid Unicode");
    json_bad("\"\\ud83d\\u0041\"", "invalid Unicode");
    json_bad("\"\\ude00\"", "invalid Unicode");
    json_bad("\"\\u0000\"", "u0000");
    json_bad("\"a\nb\"", "unexpected newline");
    json_bad("[1] x", "end of file expected");
    json_bad("\x89PNG", "0x89");
    json_bad("\"\xff\"", "0xff");
    json_bad("{\"a\":[1,2,{\"b\":nul}]}", NULL);
    /* an integer beyond int64 is an error, never rounded to a double */
    json_bad("9223372036854775808", "too big integer");
    json_bad("[1e999]", "overflow");
    /* deep nesting is refused, not a stack overflow */
    size_t deep = 200000;
    char *d = malloc(2 * deep + 1);
    memset(d, '[', deep);
    memset(d + deep, ']', deep);
    d[2 * deep] = '\0';
    json_bad(d, "nesting");
    memset(d, '{', deep);
    json_bad(d, NULL);
    free(d);
    char nest[2 * MG_JSON_MAX_DEPTH + 5];
    memset(nest, '[', MG_JSON_MAX_DEPTH + 1);
    memset(nest + MG_JSON_MAX_DEPTH + 1, ']', MG_JSON_MAX_DEPTH + 1);
    nest[2 * MG_JSON_MAX_DEPTH + 2] = '\0';
    json_ok(nest); /* depth exactly the limit */
    memset(nest, '[', MG_JSON_MAX_DEPTH + 2);
    memset(nest + MG_JSON_MAX_DEPTH + 2, ']', MG_JSON_MAX_DEPTH + 2);
    nest[2 * MG_JSON_MAX_DEPTH + 4] = '\0';
    json_bad(nest, "nesting"); /* one more */
    /* not NUL-terminated input: parse only len bytes */
    CHECK(mg_json_parse("[1]xyz", 3, &j, &err) == 0);
    json_decref(j);
    /* dump_to: truncation follows snprintf semantics */
    char small[4];
    json_t *str = json_string("abcdef"), *ctl = json_string("\x01");
    CHECK(mg_json_dump_to(str, 17, small, sizeof small) == 8 && strcmp(small, "\"ab") == 0);
    CHECK(mg_json_dump_to(ctl, 17, NULL, 0) == 8);
    json_decref(str);
    json_decref(ctl);
    /* a string that is not UTF-8 cannot be written */
    CHECK(json_string("\xff") == NULL);
}

static void fuzz_json(void) {
    static const char alphabet[] = "{}[]\":,0123456789-+.eEtrufalsn \\u\"ab\t\n";
    char buf[256];
    int ok = 0;
    for (int it = 0; it < 20000; it++) {
        size_t n = (size_t)(rnd() % sizeof buf);
        for (size_t i = 0; i < n; i++) {
            uint64_t r = rnd();
            buf[i] = (r & 7) ? alphabet[(r >> 8) % (sizeof alphabet - 1)] : (char)(r >> 16);
        }
        json_t *j = NULL;
        mg_error err = {0};
        if (mg_json_parse(buf, n, &j, &err) == 0) ok++;
        json_decref(j);
    }
    /* mutations of a valid document */
    const char *doc = "{\"w\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]},"
                      "\"__metadata__\":{\"k\":\"v\\n\\u00e9\"},\"l\":[1,2.5e-3,true,null]}";
    size_t dl = strlen(doc);
    for (int it = 0; it < 20000; it++) {
        memcpy(buf, doc, dl);
        int flips = 1 + (int)(rnd() % 4);
        for (int f = 0; f < flips; f++) buf[rnd() % dl] = (char)(rnd() & 0xff);
        size_t n = dl - (size_t)(rnd() % 8);
        json_t *j = NULL;
        if (mg_json_parse(buf, n, &j, NULL) == 0) ok++;
        json_decref(j);
    }
    printf("json fuzz: %d of 40000 random inputs parsed (no crash)\n", ok);
}

/* ================================================================ files */

static const char *tmp_dir(void) {
    const char *t = getenv("TMPDIR");
    return (t && t[0]) ? t : "/tmp";
}

/* How many "<path>.tmp.*" names are in path's directory. */
static int count_temps(const char *path) {
    char dir[512];
    const char *slash = strrchr(path, '/');
    snprintf(dir, sizeof dir, "%.*s", (int)(slash - path), path);
    char prefix[600];
    snprintf(prefix, sizeof prefix, "%s.tmp.", slash + 1);
    DIR *d = opendir(dir);
    int n = 0;
    for (struct dirent *de; d && (de = readdir(d)) != NULL;)
        n += strncmp(de->d_name, prefix, strlen(prefix)) == 0;
    if (d) closedir(d);
    return n;
}

static void write_file(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    if (f) {
        fputs(text, f);
        fclose(f);
    }
}

static int file_is(const char *path, const char *text) {
    char buf[256] = {0};
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    const size_t k = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    return k == strlen(text) && memcmp(buf, text, k) == 0;
}

/* Links planted at the names of mg_st_write's temporary
 * (the "<path>.tmp.<pid>" this process would have used, and the same with
 * the suffixes of a new name) are never followed: the file they name keeps
 * its bytes, path becomes a regular file that loads, the links stay. And
 * mg_st_remove_stale_temps removes a dead writer's regular temporaries
 * (both name forms), never a link or a live writer's file. */
static void test_planted_temporaries(void) {
    char dir[512], path[600], victim[600], link1[700], old_form[700], new_form[700],
        live[700], dead_link[700];
    snprintf(dir, sizeof dir, "%s/mg_st_plant_%ld", tmp_dir(), (long)getpid());
    CHECK(mkdir(dir, 0700) == 0);
    snprintf(path, sizeof path, "%s/ck.safetensors", dir);
    snprintf(victim, sizeof victim, "%s/victim", dir);
    write_file(victim, "victim\n");
    snprintf(link1, sizeof link1, "%s.tmp.%ld", path, (long)getpid());
    CHECK(symlink("victim", link1) == 0);
    const float x[3] = {1, 2, 3};
    const int64_t shape[1] = {3};
    const mg_st_tensor t = {"x", MG_ST_F32, 1, {shape[0]}, x, sizeof x};
    mg_error err = {0};
    CHECK(mg_st_write(path, &t, 1, NULL, 0, &err) == 0);
    struct stat st;
    CHECK(lstat(path, &st) == 0 && S_ISREG(st.st_mode));
    CHECK(file_is(victim, "victim\n"));
    CHECK(lstat(link1, &st) == 0 && S_ISLNK(st.st_mode));
    mg_st_file *f = NULL;
    CHECK(mg_st_load(path, &f, &err) == 0);
    mg_st_free(f);
    CHECK(count_temps(path) == 1); /* the planted link only */

    /* stale temporaries: a dead pid (a child that exited) */
    const pid_t child = fork();
    if (child == 0) _exit(0);
    waitpid(child, NULL, 0);
    snprintf(old_form, sizeof old_form, "%s.tmp.%ld", path, (long)child);
    snprintf(new_form, sizeof new_form, "%s.tmp.%ld.Ab3xY9", path, (long)child);
    snprintf(live, sizeof live, "%s.tmp.1.Ab3xY9", path); /* pid 1 lives */
    snprintf(dead_link, sizeof dead_link, "%s.tmp.%ld.zzzzzz", path, (long)child);
    write_file(old_form, "x");
    write_file(new_form, "x");
    write_file(live, "x");
    CHECK(symlink("victim", dead_link) == 0);
    CHECK(mg_st_remove_stale_temps(path) == 2);
    CHECK(access(old_form, F_OK) != 0 && access(new_form, F_OK) != 0);
    CHECK(access(live, F_OK) == 0);
    CHECK(lstat(dead_link, &st) == 0 && S_ISLNK(st.st_mode));
    CHECK(file_is(victim, "victim\n"));
    unlink(live);
    unlink(dead_link);
    unlink(link1);
    unlink(path);
    unlink(victim);
    CHECK(rmdir(dir) == 0);
}

/* Deterministic tensor contents from formulas. */
static float f32_val(size_t i) { return (float)sin(0.1 * (double)i) * 3.0f + (float)i; }
static int64_t i64_val(size_t i) { return (int64_t)i * (int64_t)i * 1000003LL - 7; }
static double f64_val(size_t i) { return 1.0 / (double)(i + 1); }

static void test_round_trip(void) {
    float w[12], w4[12];
    int64_t ids[5];
    double dd[8];
    int32_t scalar = -42;
    uint8_t bytes[7];
    for (size_t i = 0; i < 12; i++) {
        w[i] = f32_val(i);
        w4[i] = -f32_val(i + 100);
    }
    for (size_t i = 0; i < 5; i++) ids[i] = i64_val(i);
    for (size_t i = 0; i < 8; i++) dd[i] = f64_val(i);
    for (size_t i = 0; i < 7; i++) bytes[i] = (uint8_t)(i * 37 + 1);
    mg_st_tensor t[] = {
        {.name = "bytes", .dtype = MG_ST_U8, .ndim = 1, .shape = {7}, .data = bytes},
        {.name = "w", .dtype = MG_ST_F32, .ndim = 2, .shape = {3, 4}, .data = w},
        {.name = "ids", .dtype = MG_ST_I64, .ndim = 1, .shape = {5}, .data = ids},
        {.name = "step", .dtype = MG_ST_I32, .ndim = 0, .data = &scalar},
        {.name = "empty", .dtype = MG_ST_F32, .ndim = 2, .shape = {0, 3}, .data = NULL},
        {.name = "d", .dtype = MG_ST_F64, .ndim = 3, .shape = {2, 2, 2}, .data = dd},
        {.name = "blk.0.w4", .dtype = MG_ST_F32, .ndim = 4, .shape = {2, 1, 3, 2}, .data = w4},
        {.name = "name with \"quotes\" \\ and \xc3\xa9",
         .dtype = MG_ST_F32,
         .ndim = 1,
         .shape = {1},
         .data = w},
    };
    size_t nt = sizeof t / sizeof *t;
    mg_st_kv meta[] = {
        {"config", "{\"n_layer\": 2, \"d_model\": 64}"},
        {"vocab", "[\"<pad>\",\"<bos>\",\"<eos>\",\"C\",\"\\\\\"]"},
        {"step", "1234"},
        {"weird", "tab\there\nnewline \x01 ctrl"},
    };
    size_t nm = sizeof meta / sizeof *meta;
    char path[512];
    snprintf(path, sizeof path, "%s/mg_st_test_%ld.safetensors", tmp_dir(), (long)getpid());
    mg_error err = {0};
    CHECK(mg_st_write(path, t, nt, meta, nm, &err) == 0);
    if (err.message[0]) fprintf(stderr, "write: %s\n", err.message);
    /* no temporary left behind */
    CHECK(count_temps(path) == 0);

    /* raw layout: N, '{', spaces to a multiple of 8 */
    FILE *f = fopen(path, "rb");
    CHECK(f != NULL);
    unsigned char *raw = NULL;
    size_t rawlen = 0;
    if (f) {
        fseek(f, 0, SEEK_END);
        rawlen = (size_t)ftell(f);
        fseek(f, 0, SEEK_SET);
        raw = malloc(rawlen);
        CHECK(fread(raw, 1, rawlen, f) == rawlen);
        fclose(f);
        uint64_t n = 0;
        for (int i = 7; i >= 0; i--) n = (n << 8) | raw[i];
        CHECK((8 + n) % 8 == 0);
        CHECK(raw[8] == '{');
        CHECK(8 + n <= rawlen);
        size_t data = 12 * 4 + 5 * 8 + 4 + 0 + 8 * 8 + 12 * 4 + 4 + 7;
        CHECK(rawlen == 8 + n + data);
        /* in-memory serialisation is byte-identical */
        unsigned char *mem = NULL;
        size_t memlen = 0;
        CHECK(mg_st_serialize(t, nt, meta, nm, &mem, &memlen, &err) == 0);
        CHECK(memlen == rawlen && mem && memcmp(mem, raw, rawlen) == 0);
        free(mem);
    }

    mg_st_file *st = NULL;
    CHECK(mg_st_load(path, &st, &err) == 0);
    if (!st) {
        fprintf(stderr, "load: %s\n", err.message);
        free(raw);
        return;
    }
    CHECK(mg_st_count(st) == nt);
    /* layout: descending element size, stable */
    const char *order[] = {
        "ids",  "d", "w", "step", "empty", "blk.0.w4", "name with \"quotes\" \\ and \xc3\xa9",
        "bytes"};
    for (size_t i = 0; i < nt; i++) {
        const mg_st_tensor *x = mg_st_at(st, i);
        CHECK(x && strcmp(x->name, order[i]) == 0);
        if (x && x->nbytes) CHECK(((uintptr_t)x->data) % mg_st_dtype_size(x->dtype) == 0);
    }
    CHECK(mg_st_at(st, nt) == NULL);
    for (size_t i = 0; i < nt; i++) {
        const mg_st_tensor *x = mg_st_find(st, t[i].name);
        CHECK(x != NULL);
        if (!x) continue;
        CHECK(x->dtype == t[i].dtype && x->ndim == t[i].ndim);
        for (int d = 0; d < x->ndim; d++) CHECK(x->shape[d] == t[i].shape[d]);
        size_t nb = mg_st_dtype_size(x->dtype);
        for (int d = 0; d < x->ndim; d++) nb *= (size_t)x->shape[d];
        CHECK(x->nbytes == nb);
        if (nb) CHECK(memcmp(x->data, t[i].data, nb) == 0);
    }
    /* values by formula through the typed accessors */
    const void *p = NULL;
    int64_t sw[2] = {3, 4};
    CHECK(mg_st_get(st, "w", MG_ST_F32, 2, sw, &p, &err) == 0);
    if (p)
        for (size_t i = 0; i < 12; i++) CHECK(((const float *)p)[i] == f32_val(i));
    int64_t si[1] = {5};
    CHECK(mg_st_get(st, "ids", MG_ST_I64, 1, si, &p, &err) == 0);
    if (p)
        for (size_t i = 0; i < 5; i++) CHECK(((const int64_t *)p)[i] == i64_val(i));
    CHECK(mg_st_get(st, "step", MG_ST_I32, 0, NULL, &p, &err) == 0);
    CHECK(p && *(const int32_t *)p == -42);
    double dcopy[8];
    int64_t sd[3] = {2, 2, 2};
    CHECK(mg_st_copy(st, "d", MG_ST_F64, 3, sd, dcopy, sizeof dcopy, &err) == 0);
    for (size_t i = 0; i < 8; i++) CHECK(dcopy[i] == f64_val(i));
    /* mismatches are clear errors */
    CHECK(mg_st_get(st, "w", MG_ST_F64, 2, sw, &p, &err) != 0 && p == NULL);
    CHECK(strstr(err.message, "dtype F32, expected F64") != NULL);
    int64_t bad_shape[2] = {4, 3};
    CHECK(mg_st_get(st, "w", MG_ST_F32, 2, bad_shape, &p, &err) != 0);
    CHECK(strstr(err.message, "shape [3,4], expected [4,3]") != NULL);
    CHECK(mg_st_get(st, "w", MG_ST_F32, 1, sw, &p, &err) != 0);
    CHECK(mg_st_get(st, "nope", MG_ST_F32, 1, sw, &p, &err) != 0);
    CHECK(strstr(err.message, "'nope' not found") != NULL);
    CHECK(mg_st_copy(st, "d", MG_ST_F64, 3, sd, dcopy, 8, &err) != 0);
    /* metadata */
    CHECK(mg_st_meta_count(st) == nm);
    for (size_t i = 0; i < nm; i++) {
        const char *v = mg_st_meta(st, meta[i].key);
        CHECK(v && strcmp(v, meta[i].value) == 0);
        const char *k2, *v2;
        CHECK(mg_st_meta_at(st, i, &k2, &v2) == 0 && strcmp(k2, meta[i].key) == 0);
    }
    CHECK(mg_st_meta(st, "absent") == NULL);
    CHECK(mg_st_meta_at(st, nm, NULL, NULL) != 0);
    mg_st_free(st);

    /* every strict truncation is rejected */
    if (raw) {
        int accepted = 0;
        for (size_t len = 0; len < rawlen; len++) {
            mg_st_file *g = NULL;
            if (mg_st_parse(raw, len, &g, &err) == 0) {
                accepted++;
                mg_st_free(g);
            }
        }
        CHECK(accepted == 0);
        /* byte-flip fuzzing: never a crash; a flip in the data part fails the
         * tensor's checksum */
        int ok = 0;
        unsigned char *buf = malloc(rawlen);
        for (int it = 0; it < 5000; it++) {
            memcpy(buf, raw, rawlen);
            int flips = 1 + (int)(rnd() % 3);
            for (int k = 0; k < flips; k++) buf[rnd() % rawlen] ^= (unsigned char)(1 + rnd() % 255);
            size_t len = (rnd() % 4 == 0) ? (size_t)(rnd() % rawlen) : rawlen;
            mg_st_file *g = NULL;
            if (mg_st_parse(buf, len, &g, NULL) == 0) {
                ok++;
                /* whatever loaded must be self-consistent */
                for (size_t i = 0; i < mg_st_count(g); i++) {
                    const mg_st_tensor *x = mg_st_at(g, i);
                    volatile unsigned char s = 0;
                    for (size_t b = 0; b < x->nbytes; b++) s ^= ((const unsigned char *)x->data)[b];
                    (void)s;
                }
                mg_st_free(g);
            }
        }
        free(buf);
        printf("safetensors fuzz: %d of 5000 mutated files still valid (no crash)\n", ok);
    }
    free(raw);

    /* overwrite atomically with different content */
    mg_st_tensor one = {.name = "x", .dtype = MG_ST_I64, .ndim = 1, .shape = {1}, .data = ids};
    CHECK(mg_st_write(path, &one, 1, NULL, 0, &err) == 0);
    CHECK(mg_st_load(path, &st, &err) == 0);
    CHECK(st && mg_st_count(st) == 1 && mg_st_meta_count(st) == 0 && !mg_st_find(st, "w"));
    mg_st_free(st);
    remove(path);

    /* writer argument errors */
    mg_st_tensor dup[2] = {one, one};
    CHECK(mg_st_write(path, dup, 2, NULL, 0, &err) != 0 && strstr(err.message, "duplicate"));
    mg_st_tensor res = one;
    res.name = "__metadata__";
    CHECK(mg_st_write(path, &res, 1, NULL, 0, &err) != 0);
    mg_st_tensor nul = one;
    nul.data = NULL;
    CHECK(mg_st_write(path, &nul, 1, NULL, 0, &err) != 0);
    mg_st_tensor neg = one;
    neg.shape[0] = -1;
    CHECK(mg_st_write(path, &neg, 1, NULL, 0, &err) != 0);
    mg_st_tensor big = one;
    big.ndim = 9;
    CHECK(mg_st_write(path, &big, 1, NULL, 0, &err) != 0);
    mg_st_tensor badt = one;
    badt.dtype = (mg_st_dtype)99;
    CHECK(mg_st_write(path, &badt, 1, NULL, 0, &err) != 0);
    mg_st_kv dm[2] = {{"a", "1"}, {"a", "2"}};
    CHECK(mg_st_write(path, &one, 1, dm, 2, &err) != 0);
    CHECK(access(path, F_OK) != 0); /* nothing written on argument errors */
    CHECK(mg_st_write("/nonexistent-dir-mg/x.safetensors", &one, 1, NULL, 0, &err) != 0);
    CHECK(strstr(err.message, "cannot create") != NULL);
    /* empty file: no tensors at all is valid */
    CHECK(mg_st_write(path, NULL, 0, NULL, 0, &err) == 0);
    CHECK(mg_st_load(path, &st, &err) == 0 && mg_st_count(st) == 0);
    mg_st_free(st);
    remove(path);
}

/* Build "N + header + data" in memory and expect parse to fail with needle. */
static void expect_bad(const char *hdr, size_t dlen, const char *needle) {
    size_t hl = strlen(hdr);
    size_t len = 8 + hl + dlen;
    unsigned char *b = calloc(1, len);
    for (int i = 0; i < 8; i++) b[i] = (unsigned char)((uint64_t)hl >> (8 * i));
    memcpy(b + 8, hdr, hl);
    mg_st_file *f = (mg_st_file *)1;
    mg_error err = {0};
    int rc = mg_st_parse(b, len, &f, &err);
    if (rc == 0 || f != NULL || !err.message[0] || (needle && !strstr(err.message, needle))) {
        fprintf(stderr, "should reject (want '%s'): %s\n  got rc=%d err='%s'\n",
                needle ? needle : "", hdr, rc, err.message);
        tu_fail++;
        if (rc == 0) mg_st_free(f);
    }
    free(b);
}

static void expect_good(const char *hdr, size_t dlen) {
    size_t hl = strlen(hdr);
    size_t len = 8 + hl + dlen;
    unsigned char *b = calloc(1, len);
    for (int i = 0; i < 8; i++) b[i] = (unsigned char)((uint64_t)hl >> (8 * i));
    memcpy(b + 8, hdr, hl);
    mg_st_file *f = NULL;
    mg_error err = {0};
    if (mg_st_parse(b, len, &f, &err) != 0) {
        fprintf(stderr, "should accept: %s\n  got '%s'\n", hdr, err.message);
        tu_fail++;
    }
    mg_st_free(f);
    free(b);
}

#define T4 "{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}"

static void test_corruption(void) {
    mg_error err = {0};
    mg_st_file *f = NULL;
    /* shorter than 8 bytes */
    for (size_t n = 0; n < 8; n++) {
        const unsigned char z[8] = {0};
        CHECK(mg_st_parse(z, n, &f, &err) != 0 && f == NULL);
        CHECK(strstr(err.message, "shorter than") != NULL);
    }
    /* header size larger than the file / absurd */
    unsigned char h[16] = {200, 0, 0, 0, 0, 0, 0, 0, '{', '}'};
    CHECK(mg_st_parse(h, 10, &f, &err) != 0 && strstr(err.message, "larger than"));
    unsigned char h2[16] = {0, 0, 0, 0, 0, 0, 0, 1, '{', '}'};
    CHECK(mg_st_parse(h2, 10, &f, &err) != 0 && strstr(err.message, "absurd"));
    unsigned char h3[16] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, '{', '}'};
    CHECK(mg_st_parse(h3, 10, &f, &err) != 0 && strstr(err.message, "absurd"));
    /* foreign files */
    const unsigned char png[] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n', 0, 0,
                                 0,    13,  'I', 'H', 'D',  'R',  0,    0,    0, 1,
                                 0,    0,   0,   1,   8,    2,    0,    0,    0};
    CHECK(mg_st_parse(png, sizeof png, &f, &err) != 0 && f == NULL);
    const char *txt = "Hello, this is a text file, not a checkpoint.\nSecond line.\n";
    CHECK(mg_st_parse(txt, strlen(txt), &f, &err) != 0 && f == NULL);
    /* a valid size prefix followed by a non-JSON header */
    expect_bad("hello world", 0, "does not start with '{'");
    expect_bad("", 0, "does not start with '{'");
    expect_bad("[1,2]", 0, "does not start");
    /* malformed JSON */
    expect_bad("{\"a\":", 0, "JSON");
    expect_bad("{\"a\":" T4, 4, "JSON");
    expect_bad("{\"a\":" T4 "}}", 4, "end of file expected");
    expect_bad("{\"a\":" T4 ",\"a\":" T4 "}", 8, "duplicate object key");
    expect_bad("{\"a\":" T4 "}\x01", 4, NULL);
    /* structure */
    expect_bad("{\"a\":1}", 0, "not an object");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[1]}}", 4, "missing data_offsets");
    expect_bad("{\"a\":{\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "missing dtype");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"data_offsets\":[0,4]}}", 4, "missing shape");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4],\"x\":1}}", 4,
               "unexpected field");
    expect_bad("{\"a\":{\"dtype\":\"F33\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4,
               "unknown dtype 'F33'");
    expect_bad("{\"a\":{\"dtype\":4,\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "unknown dtype");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", 4,
               "non-negative");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[1.5],\"data_offsets\":[0,4]}}", 4,
               "non-negative integer");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":\"1\",\"data_offsets\":[0,4]}}", 4,
               "not an array");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,4]}}",
               4, "dimensions");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0]}}", 4, "pair");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4,8]}}", 8, "pair");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,-4]}}", 4,
               "non-negative");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,0]}}", 4, "reversed");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,8]}}", 4,
               "beyond the 4-byte");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,4]}}", 4,
               "needs 8 bytes");
    expect_bad("{\"a\":{\"dtype\":\"I64\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4,
               "needs 8 bytes");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[4611686018427387904,4611686018427387904],"
               "\"data_offsets\":[0,4]}}",
               4, "overflows");
    expect_bad(
        "{\"a\":{\"dtype\":\"F32\",\"shape\":[99999999999999999999],\"data_offsets\":[0,4]}}", 4,
        "too big integer");
    /* coverage of the byte buffer */
    expect_bad("{\"a\":" T4 ",\"b\":" T4 "}", 4, "overlap");
    expect_bad("{\"a\":" T4 ",\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]}}", 12,
               "hole");
    expect_bad("{\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8, "hole");
    expect_bad("{\"a\":" T4 "}", 8, "trailing garbage");
    expect_bad("{}", 3, "trailing garbage");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
               "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
               12, "overlap");
    /* metadata */
    expect_bad("{\"__metadata__\":[]}", 0, "__metadata__ is not an object");
    expect_bad("{\"__metadata__\":{\"a\":1}}", 0, "not a string");
    expect_bad("{\"__metadata__\":{\"a\":\"x\",\"a\":\"y\"}}", 0, "duplicate object key");
    /* accepted variants: whitespace padding, any key order, zero-size,
     * scalars, unpadded header, tensors listed out of offset order */
    expect_good("{}", 0);
    expect_good("{}      ", 0);
    expect_good("{\"a\":" T4 "}\n\t ", 4);
    expect_good("{\"a\":{\"data_offsets\":[0,4],\"shape\":[],\"dtype\":\"I32\"}}", 4);
    expect_good("{\"z\":{\"dtype\":\"F32\",\"shape\":[0,5],\"data_offsets\":[0,0]}}", 0);
    expect_good("{\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]},\"a\":" T4 "}", 8);
    expect_good("{\"__metadata__\":{},\"a\":{\"dtype\":\"BF16\",\"shape\":[2],"
                "\"data_offsets\":[0,4]}}",
                4);
    /* load() on files: missing, directory, text, truncated */
    CHECK(mg_st_load("/nonexistent-mg/x.safetensors", &f, &err) != 0 && f == NULL);
    CHECK(strstr(err.message, "cannot open") != NULL);
    CHECK(mg_st_load(tmp_dir(), &f, &err) != 0 && strstr(err.message, "not a regular file"));
    char path[512];
    snprintf(path, sizeof path, "%s/mg_st_bad_%ld.safetensors", tmp_dir(), (long)getpid());
    FILE *fp = fopen(path, "wb");
    fputs(txt, fp);
    fclose(fp);
    CHECK(mg_st_load(path, &f, &err) != 0 && f == NULL);
    CHECK(strstr(err.message, path) != NULL);
    fp = fopen(path, "wb");
    fwrite("\x05\0\0", 1, 3, fp);
    fclose(fp);
    CHECK(mg_st_load(path, &f, &err) != 0 && strstr(err.message, "shorter than"));
    fp = fopen(path, "wb");
    fclose(fp);
    CHECK(mg_st_load(path, &f, &err) != 0 && strstr(err.message, "shorter than"));
    remove(path);
    /* random garbage files with plausible header sizes */
    int ok = 0;
    unsigned char buf[512];
    for (int it = 0; it < 20000; it++) {
        size_t len = (size_t)(rnd() % sizeof buf);
        for (size_t i = 0; i < len; i++) buf[i] = (unsigned char)rnd();
        if (len >= 8 && (rnd() & 1)) {
            uint64_t n = rnd() % (len - 7);
            for (int i = 0; i < 8; i++) buf[i] = (unsigned char)(n >> (8 * i));
            buf[8] = '{';
        }
        mg_st_file *g = NULL;
        if (mg_st_parse(buf, len, &g, NULL) == 0) ok++;
        mg_st_free(g);
    }
    printf("garbage fuzz: %d of 20000 random buffers parsed (no crash)\n", ok);
    /* dtype helpers */
    mg_st_dtype dt;
    CHECK(mg_st_dtype_parse("I64", &dt) == 0 && dt == MG_ST_I64);
    CHECK(mg_st_dtype_parse("i64", &dt) != 0);
    CHECK(mg_st_dtype_size(MG_ST_BF16) == 2 && mg_st_dtype_size(MG_ST_U64) == 8);
    CHECK(mg_st_dtype_name((mg_st_dtype)-1) == NULL && mg_st_dtype_size(MG_ST_NUM_DTYPES) == 0);
    for (int i = 0; i < MG_ST_NUM_DTYPES; i++)
        CHECK(mg_st_dtype_parse(mg_st_dtype_name((mg_st_dtype)i), &dt) == 0 && (int)dt == i);
}

/* Interoperability hooks for molgen/tests/base/test_safetensors_format.py (an
 * independent numpy reader / writer of the format):
 *   MOLGEN_ST_EXPORT=path  write a file of formula-valued tensors there;
 *   MOLGEN_ST_IMPORT=path  load a file written by the Python side and check
 *                          the same formula values and metadata. */
static void interop(void) {
    const char *exp = getenv("MOLGEN_ST_EXPORT");
    const char *imp = getenv("MOLGEN_ST_IMPORT");
    float f32[6];
    int64_t i64[4];
    double f64[3];
    uint8_t u8[5];
    for (size_t i = 0; i < 6; i++) f32[i] = f32_val(i);
    for (size_t i = 0; i < 4; i++) i64[i] = i64_val(i);
    for (size_t i = 0; i < 3; i++) f64[i] = f64_val(i);
    for (size_t i = 0; i < 5; i++) u8[i] = (uint8_t)(i * 37 + 1);
    mg_error err = {0};
    if (exp && exp[0]) {
        mg_st_tensor t[] = {
            {.name = "u8", .dtype = MG_ST_U8, .ndim = 1, .shape = {5}, .data = u8},
            {.name = "f32", .dtype = MG_ST_F32, .ndim = 2, .shape = {2, 3}, .data = f32},
            {.name = "i64", .dtype = MG_ST_I64, .ndim = 1, .shape = {4}, .data = i64},
            {.name = "f64", .dtype = MG_ST_F64, .ndim = 1, .shape = {3}, .data = f64},
        };
        mg_st_kv meta[] = {{"format", "pt"}, {"vocab", "[\"<pad>\",\"C\\\\\"]"}};
        CHECK(mg_st_write(exp, t, 4, meta, 2, &err) == 0);
        printf("interop: wrote %s\n", exp);
    }
    if (imp && imp[0]) {
        mg_st_file *f = NULL;
        CHECK(mg_st_load(imp, &f, &err) == 0);
        if (!f) {
            printf("interop: refused: %s\n", err.message);
            return;
        }
        int64_t s23[2] = {2, 3}, s4[1] = {4}, s3[1] = {3}, s5[1] = {5};
        float g32[6];
        int64_t g64[4];
        double gd[3];
        uint8_t g8[5];
        CHECK(mg_st_copy(f, "f32", MG_ST_F32, 2, s23, g32, sizeof g32, &err) == 0);
        CHECK(mg_st_copy(f, "i64", MG_ST_I64, 1, s4, g64, sizeof g64, &err) == 0);
        CHECK(mg_st_copy(f, "f64", MG_ST_F64, 1, s3, gd, sizeof gd, &err) == 0);
        CHECK(mg_st_copy(f, "u8", MG_ST_U8, 1, s5, g8, sizeof g8, &err) == 0);
        CHECK(memcmp(g32, f32, sizeof g32) == 0 && memcmp(g64, i64, sizeof g64) == 0);
        CHECK(memcmp(gd, f64, sizeof gd) == 0 && memcmp(g8, u8, sizeof g8) == 0);
        const char *v = mg_st_meta(f, "vocab");
        CHECK(v && strcmp(v, "[\"<pad>\",\"C\\\\\"]") == 0);
        CHECK(mg_st_meta(f, "format") && strcmp(mg_st_meta(f, "format"), "pt") == 0);
        printf("interop: read %s (checksummed %d)\n", imp, mg_st_checksummed(f));
        mg_st_free(f);
    }
}

int main(void) {
    test_json();
    fuzz_json();
    test_round_trip();
    test_corruption();
    test_planted_temporaries();
    interop();
    if (tu_fail) {
        fprintf(stderr, "test_safetensors: %d failure(s)\n", tu_fail);
        return 1;
    }
    printf("test_safetensors: OK\n");
    return 0;
}
