/* Tests for the value rules of molgen/train/checkpoint.h:
 * the checkpoint writer (mg_ckpt_save) and the model writer (mg_model_save)
 * refuse a NaN / Inf parameter, moment or average and a negative second
 * moment, naming the tensor and element, and leave the file that was there
 * byte for byte; mg_ckpt_check_values at any alignment. The loaders' side is
 * test_checkpoint_validation.py's (mutated files through the binary). */
#define _POSIX_C_SOURCE 200809L
#include <dirent.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "train/checkpoint.h"
#include "nn/model.h"
#include "chem/tokenizer.h"
#include "train/train.h"

#include "mg_test.h"

static unsigned char *slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    const long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *b = malloc(len > 0 ? (size_t)len : 1);
    *n = b && fread(b, 1, (size_t)len, f) == (size_t)len ? (size_t)len : 0;
    fclose(f);
    return b;
}

/* Files in dir (the checkpoint and any temporary left beside it). */
static int files_in(const char *dir) {
    DIR *d = opendir(dir);
    int n = 0;
    for (struct dirent *e; d && (e = readdir(d));) n += e->d_name[0] != '.';
    if (d) closedir(d);
    return n;
}

typedef struct {
    mg_model *m;
    mg_vocab *v;
    mg_adamw opt;
    mg_train_config s;
    mg_train_state st;
} fixture;

static int fixture_make(fixture *x) {
    const char *toks[] = {"C", "c", "1", "O", "N", "(", ")", "="};
    mg_error err;
    memset(x, 0, sizeof *x);
    mg_model_config c;
    mg_model_config_default(&c);
    c.n_layer = 1, c.d_model = 8, c.n_head = 2, c.ctx_len = 8;
    mg_adamw_config oc;
    mg_adamw_config_default(&oc);
    if (mg_vocab_from_tokens(toks, 8, &x->v, &err)) return fprintf(stderr, "%s\n", err.message), 0;
    c.vocab_size = mg_vocab_size(x->v);
    if (mg_model_create(&c, &x->m, &err) || mg_ckpt_optimizer(x->m, &oc, &x->opt, &err) ||
        mg_adamw_enable_ema(&x->opt, 0.9, mg_model_params(x->m), &err))
        return fprintf(stderr, "%s\n", err.message), 0;
    mg_model_init(x->m, 7);
    mg_train_config_default(&x->s);
    x->s.data_path = "d.smi";
    x->s.csv_column = "smiles";
    x->s.ema = 0.9;
    x->s.model = c;
    x->st.step = 3;
    x->st.val_loss = NAN;
    /* moments as a run leaves them: m of either sign, v > 0 */
    for (size_t i = 0; i < x->opt.n; i++) {
        x->opt.m[i] = (float)((double)i * 1e-4 - 0.01);
        x->opt.v[i] = (float)((double)i * 1e-6 + 1e-8);
    }
    return 1;
}

static void fixture_free(fixture *x) {
    mg_model_free(x->m);
    mg_vocab_free(x->v);
    mg_adamw_free(&x->opt);
}

/* One bad value at *slot: mg_ckpt_save fails with MG_ERR_NUMERIC and a
 * message holding `want`, the file keeps its n bytes `good`, no temporary
 * is left; *slot is restored. */
static void refused(fixture *x, const char *path, const char *dir, const unsigned char *good,
                    size_t n, float *slot, float bad, const char *want) {
    const float keep = *slot;
    *slot = bad;
    mg_error err = {0};
    const mg_status rc = mg_ckpt_save(path, x->m, x->v, &x->opt, &x->s, &x->st, &err);
    CHECK(rc == MG_ERR_NUMERIC, "%s: status %d (%s)", want, (int)rc, err.message);
    CHECK(strstr(err.message, want) && strstr(err.message, "refusing to write checkpoint") &&
              strstr(err.message, path),
          "message '%s' lacks '%s'", err.message, want);
    size_t n2 = 0;
    unsigned char *now = slurp(path, &n2);
    CHECK(now && n2 == n && !memcmp(now, good, n), "%s: the previous file changed", want);
    CHECK(files_in(dir) == 1, "%s: %d files in %s (a temporary left?)", want, files_in(dir), dir);
    free(now);
    printf("%-40s -> %s\n", want, err.message);
    *slot = keep;
}

static void test_writer_refuses(void) {
    char dir[] = "/tmp/mg_test_checkpoint_XXXXXX", path[300];
    fixture x;
    if (!mkdtemp(dir) || !fixture_make(&x)) {
        CHECK(0, "setup");
        return;
    }
    snprintf(path, sizeof path, "%s/ck.safetensors", dir);
    mg_error err = {0};
    CHECK(mg_ckpt_save(path, x.m, x.v, &x.opt, &x.s, &x.st, &err) == 0, "%s", err.message);
    size_t n = 0;
    unsigned char *good = slurp(path, &n);
    CHECK(good && n > 0, "no checkpoint written");
    if (!good || !n) return;
    float *p = mg_model_params(x.m);
    /* the parameter buffer starts with tok_emb.weight [V, d]; an
     * unconditional model's last tensor is head.bias [V] (model.h) */
    const mg_param_info *hb = mg_model_tensor(x.m, mg_model_num_tensors(x.m) - 1);
    CHECK(!strcmp(hb->name, "head.bias"), "last tensor %s", hb->name);
    refused(&x, path, dir, good, n, &p[7], NAN,
            "tensor 'tok_emb.weight' holds a non-finite value (nan at element 7)");
    refused(&x, path, dir, good, n, &p[hb->offset + 2], -INFINITY,
            "tensor 'head.bias' holds a non-finite value (-inf at element 2)");
    refused(&x, path, dir, good, n, &x.opt.m[11], INFINITY,
            "tensor 'optim.m' holds a non-finite value (inf at element 11)");
    refused(&x, path, dir, good, n, &x.opt.v[17], -0.5f,
            "tensor 'optim.v' holds a negative value (-0.5 at element 17): a second moment must "
            "be >= 0");
    refused(&x, path, dir, good, n, &x.opt.v[4], NAN,
            "tensor 'optim.v' holds a non-finite value (nan at element 4)");
    refused(&x, path, dir, good, n, &x.opt.ema[3], NAN,
            "tensor 'ema' holds a non-finite value (nan at element 3)");
    /* a zero second moment (a frozen or never-touched parameter) and a
     * negative first moment are valid */
    x.opt.v[0] = 0.0f;
    x.opt.v[1] = -0.0f;
    CHECK(mg_ckpt_save(path, x.m, x.v, &x.opt, &x.s, &x.st, &err) == 0, "%s", err.message);
    mg_ckpt ck;
    CHECK(mg_ckpt_load(path, &ck, &err) == 0, "%s", err.message);
    mg_ckpt_free(&ck);
    free(good);

    /* the model writer: a NaN weight is refused, the file kept */
    good = slurp(path, &n);
    p[5] = NAN;
    const mg_status rc = mg_model_save(x.m, x.v, path, &err);
    CHECK(rc == MG_ERR_NUMERIC &&
              strstr(err.message, "tensor 'tok_emb.weight' holds a non-finite value (nan at "
                                  "element 5)"),
          "mg_model_save: %d %s", (int)rc, err.message);
    size_t n2 = 0;
    unsigned char *now = slurp(path, &n2);
    CHECK(good && now && n2 == n && !memcmp(now, good, n), "mg_model_save changed the file");
    CHECK(files_in(dir) == 1, "mg_model_save left a temporary");
    free(now);
    free(good);
    remove(path);
    rmdir(dir);
    fixture_free(&x);
}

/* mg_ckpt_check_values reads any alignment and finds the first bad value. */
static void test_check_values(void) {
    unsigned char buf[4 * 8 + 1];
    const float vals[8] = {1.0f, -2.0f, 0.0f, -0.0f, 3e38f, 1e-45f, -1e-45f, 5.0f};
    mg_error err = {0};
    for (int shift = 0; shift < 2; shift++) {
        memcpy(buf + shift, vals, sizeof vals);
        CHECK(mg_ckpt_check_values("optim.m", buf + shift, 8, &err) == 0, "%s", err.message);
        CHECK(mg_ckpt_check_values("optim.v", buf + shift, 8, &err) == MG_ERR_NUMERIC &&
                  strstr(err.message, "(-2 at element 1)"),
              "%s", err.message);
        const float inf = INFINITY;
        memcpy(buf + shift + 4 * 6, &inf, 4);
        CHECK(mg_ckpt_check_values("w", buf + shift, 8, &err) == MG_ERR_NUMERIC &&
                  !strcmp(err.message, "tensor 'w' holds a non-finite value (inf at element 6)"),
              "%s", err.message);
        CHECK(mg_ckpt_check_values("w", buf + shift, 6, &err) == 0, "%s", err.message);
    }
}

int main(void) {
    test_check_values();
    test_writer_refuses();
    printf("%d passed, %d failed\n", tu_pass, tu_fail);
    return tu_fail ? 1 : 0;
}
