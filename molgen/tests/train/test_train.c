/* molgen training tests.
 *
 * 1. Learning: a small model (2 layers, d_model 64, 4 heads) trained for 300
 *    steps of 32 molecules on 1000 molecules of moses_train5k.smi must reach
 *    a validation loss below 0.75 x the unigram entropy of the training
 *    targets (about 0.75 x 2.36 = 1.77 nats). The unigram entropy is the
 *    loss of the best model that ignores the context, so beating it by 25%
 *    means the model uses the prefix (measured: ~1.2 nats; a 4-layer model
 *    trained for minutes reaches ~0.6). Under sanitizers the run is 80
 *    steps and the bound 0.85 x entropy.
 * 2. Resume: N steps straight == N/2 steps + checkpoint + resume + N/2 steps,
 *    bitwise (parameters, AdamW moments and the parameter average of --ema,
 *    which inference loads by default), with dropout on so the per-step
 *    dropout seeds and the batch stream position are exercised, and with
 *    validations and periodic checkpoints in between.
 * 3. SIGINT and SIGTERM during training: checkpoint written, stop reason "signal", and
 *    the checkpoint resumes.
 * 4. Corrupt / truncated / foreign checkpoints, a model file without
 *    optimizer state, changed data, and a model without the causal mask are
 *    clear errors.
 * 5. Fine-tuning (--init): at step 0 the weights are the init's bitwise and
 *    the checkpoint records the init's path and the CRC-32 (zlib's, here an
 *    independent call) of its parameters; with --freeze 1 the embeddings
 *    and block 0 are bitwise unchanged after steps (and their AdamW moments
 *    0) while every other tensor changed; the frozen backward gives 0 for the
 *    frozen prefix and the full backward's gradient bitwise elsewhere; data
 *    lines with tokens outside the init's vocabulary or longer than its
 *    context are skipped and counted, all of them skipped is an error; a
 *    model setting other than the init's is refused, the same value is not;
 *    --resume of a fine-tuning checkpoint continues bit for bit. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>
#include <zlib.h>

#include "nn/model.h"
#include "nn/optim.h"
#include "base/safetensors.h"
#include "train/train.h"

#if defined(__SANITIZE_ADDRESS__)
#define SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define SANITIZED 1
#endif
#endif
#ifndef SANITIZED
#define SANITIZED 0
#endif

#include "mg_test.h"

static char tmpdir[256];
static char data1k[300];

static void path_in_tmp(char *out, size_t n, const char *name) {
    snprintf(out, n, "%s/%s", tmpdir, name);
}

/* The first `count` lines of moses_train5k.smi into dst. */
static int make_subset(const char *dst, int count) {
    char src[1024];
    snprintf(src, sizeof src, "%s/moses_train5k.smi", mg_test_data_dir());
    FILE *in = fopen(src, "r");
    if (!in) {
        fprintf(stderr, "cannot open %s (set MOLGEN_SHARED_DATA)\n", src);
        return -1;
    }
    FILE *out = fopen(dst, "w");
    if (!out) {
        fclose(in);
        return -1;
    }
    char line[4096];
    int n = 0;
    while (n < count && fgets(line, sizeof line, in)) {
        fputs(line, out);
        n++;
    }
    fclose(in);
    fclose(out);
    return n == count ? 0 : -1;
}

/* AdamW against a double-precision reference of optim.h's formulas (which
 * are torch.optim.AdamW's), with clipping and a decay / no-decay split, and
 * the warm-up + cosine schedule at known points. */
static void test_optim(void) {
    mg_adamw_config oc;
    mg_adamw_config_default(&oc);
    oc.lr = 1.0f;
    oc.min_lr_frac = 0.1f;
    oc.warmup_steps = 10;
    oc.total_steps = 110;
    CHECK(fabsf(mg_lr_at(&oc, 0) - 0.1f) < 1e-7f, "lr(0) %g", (double)mg_lr_at(&oc, 0));
    CHECK(fabsf(mg_lr_at(&oc, 9) - 1.0f) < 1e-7f, "lr(9) %g", (double)mg_lr_at(&oc, 9));
    CHECK(fabsf(mg_lr_at(&oc, 10) - 1.0f) < 1e-7f, "lr(10) %g", (double)mg_lr_at(&oc, 10));
    CHECK(fabsf(mg_lr_at(&oc, 60) - 0.55f) < 1e-6f, "lr(60) %g", (double)mg_lr_at(&oc, 60));
    CHECK(fabsf(mg_lr_at(&oc, 110) - 0.1f) < 1e-7f, "lr(110) %g", (double)mg_lr_at(&oc, 110));
    CHECK(fabsf(mg_lr_at(&oc, 500) - 0.1f) < 1e-7f, "lr(500) %g", (double)mg_lr_at(&oc, 500));
    for (int64_t k = 11; k < 110; k++)
        CHECK(mg_lr_at(&oc, k) < mg_lr_at(&oc, k - 1), "cosine not decreasing at %lld",
              (long long)k);

    enum { N = 10 };
    mg_adamw_config_default(&oc);
    oc.lr = 0.01f;
    oc.warmup_steps = 2;
    oc.total_steps = 6;
    oc.grad_clip = 0.5f;
    const mg_optim_span spans[2] = {{0, 4, 1, 0, 0}, {4, 6, 0, 0, 0}};
    mg_adamw o;
    mg_error err = {0};
    CHECK(mg_adamw_init(&o, &oc, N, spans, 2, &err) == 0, "%s", err.message);
    const mg_optim_span gap[2] = {{0, 4, 1, 0, 0}, {5, 5, 0, 0, 0}};
    mg_adamw bad;
    CHECK(mg_adamw_init(&bad, &oc, N, gap, 2, &err) != 0, "spans with a gap accepted");
    float p[N], g[N];
    double rp[N], rm[N] = {0}, rv[N] = {0};
    for (int i = 0; i < N; i++) rp[i] = p[i] = 0.5f - 0.1f * (float)i;
    for (int step = 0; step < 6; step++) {
        double norm2 = 0;
        for (int i = 0; i < N; i++) {
            g[i] = (float)sin(1.0 + step * 0.7 + i * 1.3) * (step == 3 ? 0.01f : 1.0f);
            norm2 += (double)g[i] * g[i];
        }
        const double norm = sqrt(norm2);
        const double scale = norm > oc.grad_clip ? oc.grad_clip / norm : 1.0;
        const double lr = mg_lr_at(&oc, step);
        const int t = step + 1;
        for (int i = 0; i < N; i++) {
            double gi = (double)g[i] * scale;
            if (i < 4) rp[i] -= lr * oc.weight_decay * rp[i];
            rm[i] = oc.beta1 * rm[i] + (1 - oc.beta1) * gi;
            rv[i] = oc.beta2 * rv[i] + (1 - oc.beta2) * gi * gi;
            double mh = rm[i] / (1 - pow(oc.beta1, t)), vh = rv[i] / (1 - pow(oc.beta2, t));
            rp[i] -= lr * mh / (sqrt(vh) + oc.eps);
        }
        float gn, lr_used;
        CHECK(mg_adamw_step(&o, p, g, &gn, &lr_used, &err) == 0, "%s", err.message);
        CHECK(fabs(gn - norm) <= 1e-6 * norm && lr_used == (float)lr, "norm %g vs %g", (double)gn,
              norm);
    }
    double worst = 0;
    for (int i = 0; i < N; i++) worst = fmax(worst, fabs(p[i] - rp[i]));
    CHECK(worst < 1e-6, "AdamW differs from the reference by %g", worst);
    CHECK(o.step == 6, "step %lld", (long long)o.step);
    g[0] = NAN;
    CHECK(mg_adamw_step(&o, p, g, NULL, NULL, &err) != 0 && o.step == 6, "NaN gradient accepted");
    printf("AdamW vs double reference: max |diff| %.2e after 6 steps\n", worst);
    mg_adamw_free(&o);

    /* The parameter average against a double reference of its formula
     * (optim.h), fed the parameters the optimizer produced; a frozen span
     * keeps ema = p; averaging changes no parameter (the same steps as
     * above, bitwise). */
    const mg_optim_span fz[2] = {{0, 4, 1, 1, 0}, {4, 6, 0, 0, 0}};
    mg_adamw a, plain;
    CHECK(mg_adamw_init(&a, &oc, N, fz, 2, &err) == 0 && mg_adamw_init(&plain, &oc, N, fz, 2, &err) == 0,
          "%s", err.message);
    float pa[N], pp[N], ga[N];
    double re[N];
    for (int i = 0; i < N; i++) re[i] = pa[i] = pp[i] = 0.5f - 0.1f * (float)i;
    CHECK(mg_adamw_enable_ema(&a, 1.5, pa, &err) != 0 && !a.ema, "decay 1.5 accepted");
    CHECK(mg_adamw_enable_ema(&a, 0.9, pa, &err) == 0, "%s", err.message);
    for (int step = 0; step < 40; step++) {
        for (int i = 0; i < N; i++) ga[i] = g[i] = (float)cos(0.3 + step * 1.1 + i * 0.7);
        CHECK(mg_adamw_step(&a, pa, ga, NULL, NULL, &err) == 0 &&
                  mg_adamw_step(&plain, pp, g, NULL, NULL, &err) == 0,
              "%s", err.message);
        const double t = step + 1, d = fmin(0.9, (1 + t) / (10 + t));
        for (int i = 0; i < N; i++) re[i] = d * re[i] + (1 - d) * (double)pa[i];
    }
    double ew = 0;
    for (int i = 0; i < N; i++) ew = fmax(ew, fabs(a.ema[i] - re[i]));
    CHECK(ew < 1e-6, "average differs from the reference by %g", ew);
    CHECK(memcmp(pa, pp, sizeof pa) == 0, "averaging changed the parameters");
    CHECK(memcmp(a.ema, pa, 4 * sizeof(float)) == 0, "a frozen span's average moved");
    CHECK(fabs(a.ema[9] - pa[9]) > 1e-4, "the average equals the parameters: nothing averaged");
    printf("parameter average vs double reference: max |diff| %.2e after 40 steps\n", ew);
    mg_adamw_free(&a);
    mg_adamw_free(&plain);
}

static mg_train_config small_config(const char *out) {
    mg_train_config c;
    mg_train_config_default(&c);
    c.data_path = data1k;
    c.out_path = out;
    c.model.n_layer = 2;
    c.model.d_model = 32;
    c.model.n_head = 2;
    c.batch_size = 16;
    c.val_frac = 0.1;
    c.val_every = 7;
    c.val_max = 40;
    c.ckpt_every = 5;
    c.seed = 42;
    c.quiet = 1;
    c.progress = 0;
    c.optim.warmup_steps = 5;
    return c;
}

static int files_equal_params(const char *a, const char *b, const char *what) {
    mg_model *ma = NULL, *mb = NULL;
    mg_adamw oa, ob;
    int64_t sa = -1, sb = -2;
    mg_error err = {0};
    int ok = 1;
    if (mg_checkpoint_load(a, &ma, &oa, &sa, &err)) {
        fprintf(stderr, "%s: %s\n", what, err.message);
        return 0;
    }
    if (mg_checkpoint_load(b, &mb, &ob, &sb, &err)) {
        fprintf(stderr, "%s: %s\n", what, err.message);
        mg_model_free(ma);
        mg_adamw_free(&oa);
        return 0;
    }
    const size_t P = mg_model_num_params(ma);
    ok &= P == mg_model_num_params(mb);
    ok &= sa == sb;
    if (ok) {
        size_t diff = 0;
        double maxd = 0;
        for (size_t i = 0; i < P; i++) {
            float x = mg_model_params(ma)[i], y = mg_model_params(mb)[i];
            if (memcmp(&x, &y, sizeof x)) {
                diff++;
                if (fabs((double)x - y) > maxd) maxd = fabs((double)x - y);
            }
        }
        printf("%s: %zu of %zu parameters differ (max |diff| %.3g); steps %lld vs %lld\n", what,
               diff, P, maxd, (long long)sa, (long long)sb);
        ok &= diff == 0;
        ok &= memcmp(oa.m, ob.m, P * sizeof(float)) == 0;
        ok &= memcmp(oa.v, ob.v, P * sizeof(float)) == 0;
        ok &= oa.step == ob.step && oa.cfg.total_steps == ob.cfg.total_steps;
        ok &= !oa.ema == !ob.ema && oa.ema_decay == ob.ema_decay;
        ok &= !oa.ema || memcmp(oa.ema, ob.ema, P * sizeof(float)) == 0;
    }
    mg_model_free(ma);
    mg_model_free(mb);
    mg_adamw_free(&oa);
    mg_adamw_free(&ob);
    return ok;
}

static void test_learns(void) {
    char out[300];
    path_in_tmp(out, sizeof out, "learn.safetensors");
    mg_train_config c = small_config(out);
    c.model.d_model = 64;
    c.model.n_head = 4;
    c.batch_size = 32;
    c.steps = SANITIZED ? 80 : 300;
    c.optim.lr = 3e-3f;
    c.optim.warmup_steps = 20;
    c.val_every = 0;
    c.val_max = 0; /* all 100 validation molecules */
    c.ckpt_every = 0;
    mg_train_result r;
    mg_error err = {0};
    int rc = mg_train_run(&c, &r, &err);
    CHECK(rc == 0, "train: %s", err.message);
    if (rc) return;
    const double factor = SANITIZED ? 0.85 : 0.75;
    printf("learning: %lld steps, val loss %.4f -> %.4f, unigram entropy %.4f (bound %.4f), "
           "train loss %.4f, %.0f tok/s, %.1f s\n",
           (long long)r.step, r.first_val_loss, r.val_loss, r.unigram_entropy,
           factor * r.unigram_entropy, r.train_loss, r.tokens_per_sec, r.seconds);
    CHECK(r.step == c.steps && r.stop == MG_STOP_DONE, "stopped at %lld", (long long)r.step);
    CHECK(r.unigram_entropy > 1.5 && r.unigram_entropy < 3.5, "entropy %g", r.unigram_entropy);
    CHECK(r.val_loss < factor * r.unigram_entropy, "val loss %.4f not below %.2f x entropy %.4f",
          r.val_loss, factor, r.unigram_entropy);
    CHECK(r.val_loss < r.first_val_loss - 1.0, "val loss %.4f vs initial %.4f", r.val_loss,
          r.first_val_loss);
    CHECK(r.skipped == 0 && r.n_train == 900 && r.n_val == 100, "split %zu/%zu skipped %ld",
          r.n_train, r.n_val, r.skipped);
    remove(out);
}

static void test_resume(void) {
    char straight[300], half[300], resumed[300];
    path_in_tmp(straight, sizeof straight, "straight.safetensors");
    path_in_tmp(half, sizeof half, "half.safetensors");
    path_in_tmp(resumed, sizeof resumed, "resumed.safetensors");
    const int64_t N = SANITIZED ? 12 : 24;
    mg_error err = {0};
    mg_train_result r;

    mg_train_config c = small_config(straight);
    c.model.dropout = 0.1f;
    c.ema = 0.9; /* the average is part of the state resumed */
    c.steps = N;
    CHECK(mg_train_run(&c, &r, &err) == 0, "straight: %s", err.message);
    CHECK(r.step == N, "straight stopped at %lld", (long long)r.step);

    c.out_path = half;
    c.stop_after = N / 2 + 1; /* not a multiple of ckpt_every or val_every */
    CHECK(mg_train_run(&c, &r, &err) == 0, "first half: %s", err.message);
    CHECK(r.step == N / 2 + 1 && r.stop == MG_STOP_AFTER, "first half stopped at %lld (%d)",
          (long long)r.step, (int)r.stop);

    mg_train_config rc = small_config(resumed);
    rc.resume_path = half;
    rc.data_path = NULL; /* the checkpoint's */
    /* Everything that shapes training comes from the checkpoint: changing it
     * here has no effect. */
    rc.batch_size = 3;
    rc.seed = 7;
    rc.model.n_layer = 5;
    rc.optim.lr = 1.0f;
    CHECK(mg_train_run(&rc, &r, &err) == 0, "resume: %s", err.message);
    CHECK(r.step == N && r.stop == MG_STOP_DONE, "resume stopped at %lld", (long long)r.step);
    CHECK(files_equal_params(straight, resumed, "resume equality"),
          "straight and resumed runs differ");

    CHECK(isfinite(r.val_loss_ema) && r.val_loss_ema != r.val_loss,
          "averaged validation %g (last step's %g)", r.val_loss_ema, r.val_loss);
    /* Inference loads the average unless asked for the last step's
     * parameters (model.h, MG_LOAD_RAW). */
    {
        mg_model *avg = NULL, *raw = NULL, *ck = NULL;
        mg_adamw o;
        mg_model_file_info ia, ir;
        CHECK(mg_model_load(resumed, 0, &avg, NULL, &ia, &err) == 0 &&
                  mg_model_load(resumed, MG_LOAD_RAW, &raw, NULL, &ir, &err) == 0 &&
                  mg_checkpoint_load(resumed, &ck, &o, NULL, &err) == 0,
              "%s", err.message);
        const size_t P = mg_model_num_params(ck);
        CHECK(ia.averaged && !ir.averaged, "averaged flags %d %d", ia.averaged, ir.averaged);
        CHECK(memcmp(mg_model_params(avg), o.ema, P * sizeof(float)) == 0,
              "default load is not the average");
        CHECK(memcmp(mg_model_params(raw), mg_model_params(ck), P * sizeof(float)) == 0,
              "raw load is not the parameters");
        CHECK(memcmp(o.ema, mg_model_params(ck), P * sizeof(float)) != 0, "average == parameters");
        mg_model_free(avg);
        mg_model_free(raw);
        mg_model_free(ck);
        mg_adamw_free(&o);
    }

    /* Resuming a finished run does nothing more and keeps the state. */
    rc.resume_path = resumed;
    rc.out_path = half;
    CHECK(mg_train_run(&rc, &r, &err) == 0 && r.step == N, "resume finished: %s", err.message);
    CHECK(files_equal_params(straight, half, "resume of a finished run"), "changed");

    /* A longer schedule on resume continues past N. */
    rc.steps = N + 3;
    CHECK(mg_train_run(&rc, &r, &err) == 0 && r.step == N + 3, "extend: %s", err.message);
    remove(straight);
    remove(half);
    remove(resumed);
}

static volatile sig_atomic_t g_send_sig = SIGINT;
static void send_signal(int sig) {
    (void)sig;
    kill(getpid(), g_send_sig);
}

/* sig (SIGINT or SIGTERM) one second into a run */
static void test_signal(int sig) {
    const char *name = sig == SIGINT ? "SIGINT" : "SIGTERM";
    char out[300];
    path_in_tmp(out, sizeof out, "signal.safetensors");
    mg_train_config c = small_config(out);
    c.steps = 1000000;
    c.time_limit = 60; /* safety net */
    c.ckpt_every = 0;
    mg_train_install_signal_handlers();
    g_send_sig = sig;
    signal(SIGALRM, send_signal);
    alarm(1);
    mg_train_result r;
    mg_error err = {0};
    int rc = mg_train_run(&c, &r, &err);
    alarm(0);
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    CHECK(rc == 0, "%s: %s", name, err.message);
    CHECK(r.stop == MG_STOP_SIGNAL, "%s: stop reason %d after %.1f s", name, (int)r.stop,
          r.seconds);
    mg_model *m = NULL;
    int64_t step = -1;
    CHECK(mg_checkpoint_load(out, &m, NULL, &step, &err) == 0, "%s", err.message);
    CHECK(step == r.step && step > 0, "checkpoint step %lld vs %lld", (long long)step,
          (long long)r.step);
    printf("%s after 1 s: stopped at step %lld, checkpoint at step %lld\n", name, (long long)r.step,
           (long long)step);
    mg_model_free(m);
    /* and it resumes */
    mg_train_config rcfg = small_config(out);
    rcfg.resume_path = out;
    rcfg.data_path = NULL;
    rcfg.stop_after = step + 2;
    CHECK(mg_train_run(&rcfg, &r, &err) == 0 && r.step == step + 2, "resume after signal: %s",
          err.message);
    remove(out);
}

static void write_bytes(const char *path, const void *p, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) return;
    fwrite(p, 1, n, f);
    fclose(f);
}

static void expect_resume_error(const char *path, const char *needle, const char *what) {
    char out[300];
    path_in_tmp(out, sizeof out, "unused.safetensors");
    mg_train_config c = small_config(out);
    c.resume_path = path;
    c.data_path = NULL;
    mg_train_result r;
    mg_error err = {0};
    int rc = mg_train_run(&c, &r, &err);
    CHECK(rc != 0, "%s: resumed from a bad checkpoint", what);
    CHECK(strstr(err.message, needle) != NULL && strchr(err.message, '\n') == NULL,
          "%s: message '%s' lacks '%s'", what, err.message, needle);
    printf("%-28s -> %s\n", what, err.message);
    CHECK(access(out, F_OK) != 0, "%s: wrote an output", what);
}

static void test_bad_checkpoints(void) {
    char good[300], bad[300];
    path_in_tmp(good, sizeof good, "good.safetensors");
    path_in_tmp(bad, sizeof bad, "bad.safetensors");
    mg_train_config c = small_config(good);
    c.steps = 3;
    mg_train_result r;
    mg_error err = {0};
    CHECK(mg_train_run(&c, &r, &err) == 0, "%s", err.message);
    FILE *f = fopen(good, "rb");
    if (!f) {
        CHECK(0, "no checkpoint written");
        return;
    }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *buf = malloc((size_t)n);
    CHECK(fread(buf, 1, (size_t)n, f) == (size_t)n, "read");
    fclose(f);

    write_bytes(bad, buf, (size_t)n / 2);
    expect_resume_error(bad, bad, "truncated checkpoint");
    write_bytes(bad, "hello, world", 12);
    expect_resume_error(bad, bad, "not a safetensors file");
    unsigned char *cp = malloc((size_t)n);
    memcpy(cp, buf, (size_t)n);
    cp[9] = '['; /* break the JSON header */
    write_bytes(bad, cp, (size_t)n);
    expect_resume_error(bad, bad, "corrupt header");
    free(cp);
    expect_resume_error("/nonexistent/ckpt.safetensors", "/nonexistent/ckpt.safetensors",
                        "missing file");

    /* a model file (no optimizer state) cannot be resumed */
    mg_model *m = NULL;
    CHECK(mg_checkpoint_load(good, &m, NULL, NULL, &err) == 0, "%s", err.message);
    if (m) {
        CHECK(mg_model_save(m, NULL, bad, &err) == 0, "%s", err.message);
        expect_resume_error(bad, "cannot resume", "model file without state");
        mg_model_free(m);
    }
    /* different data */
    char other[300];
    path_in_tmp(other, sizeof other, "other.smi");
    write_bytes(other, "CCO\nc1ccccc1\nCC(=O)O\n", 21);
    mg_train_config rc = small_config(bad);
    rc.resume_path = good;
    rc.data_path = other;
    CHECK(mg_train_run(&rc, &r, &err) != 0 && strstr(err.message, "differs"), "changed data: %s",
          err.message);
    printf("%-28s -> %s\n", "different data", err.message);
    remove(other);

    /* a model without the causal mask: the guard refuses to train it */
    mg_train_config lc = small_config(bad);
    lc.steps = 3;
    lc.model.no_causal_mask = 1;
    CHECK(mg_train_run(&lc, &r, &err) != 0 && strstr(err.message, "causal leak"), "leaky model: %s",
          err.message);
    printf("%-28s -> %s\n", "model without causal mask", err.message);

    /* bad configurations */
    mg_train_config bc = small_config(bad);
    CHECK(mg_train_run(&bc, &r, &err) != 0, "no steps and no time limit accepted");
    bc.steps = 3;
    bc.batch_size = 5000;
    bc.given[mg_setting_find("batch_size") - MG_TRAIN_SETTING] = 1; /* asked for, not defaulted */
    CHECK(mg_train_run(&bc, &r, &err) != 0 && strstr(err.message, "batch"), "huge batch: %s",
          err.message);
    bc.batch_size = 8;
    bc.data_path = "/nonexistent.smi";
    CHECK(mg_train_run(&bc, &r, &err) != 0 && strstr(err.message, "nonexistent"),
          "missing data: %s", err.message);
    free(buf);
    remove(good);
    remove(bad);
}

/* ------------------------------------------------------------ fine-tuning */

/* A message callback that asks the run to stop at its "model:" line: the
 * run then checkpoints before its first step. */
static void stop_at_model_line(void *user, const char *text) {
    (void)user;
    if (!strncmp(text, "model:", 6)) mg_train_request_stop(SIGINT);
}

/* The checkpoint's "train" metadata, parsed (NULL on failure). */
static json_t *train_meta(const char *path) {
    mg_st_file *f = NULL;
    mg_error err;
    if (mg_st_load(path, &f, &err)) return NULL;
    const char *t = mg_st_meta(f, "train");
    json_t *j = t ? json_loads(t, 0, NULL) : NULL;
    mg_st_free(f);
    return j;
}

static mg_train_config finetune_config(const char *init, const char *out) {
    mg_train_config c = small_config(out);
    c.init_path = init;
    c.model.n_layer = 5; /* not given: ignored, the init's shape is used */
    c.optim.lr = 1e-3f;
    c.steps = 6;
    return c;
}

static void test_finetune(void) {
    char init[300], out[300], half[300], resumed[300], vdata[300], bad[300];
    path_in_tmp(init, sizeof init, "init.safetensors");
    path_in_tmp(out, sizeof out, "ft.safetensors");
    path_in_tmp(half, sizeof half, "ft_half.safetensors");
    path_in_tmp(resumed, sizeof resumed, "ft_resumed.safetensors");
    path_in_tmp(vdata, sizeof vdata, "ft_data.smi");
    path_in_tmp(bad, sizeof bad, "ft_bad.smi");
    mg_train_result r;
    mg_error err = {0};
    mg_train_config ic = small_config(init);
    ic.steps = 8;
    CHECK(mg_train_run(&ic, &r, &err) == 0, "init run: %s", err.message);
    mg_model *im = NULL;
    CHECK(mg_checkpoint_load(init, &im, NULL, NULL, &err) == 0, "%s", err.message);
    if (!im) return;
    const size_t P = mg_model_num_params(im);
    const float *ip = mg_model_params(im);
    const uint32_t crc = (uint32_t)crc32(0L, (const Bytef *)ip, (uInt)(P * sizeof(float)));

    /* data: 200 molecules of the init's data plus lines it cannot take */
    FILE *in = fopen(data1k, "r"), *o = fopen(vdata, "w");
    char line[4096];
    for (int i = 0; i < 200 && in && o && fgets(line, sizeof line, in); i++) fputs(line, o);
    const int ctx = mg_model_get_config(im)->ctx_len;
    if (o) {
        for (int i = 0; i < ctx + 3; i++) fputc('C', o); /* longer than the context */
        fputc('\n', o);
        fclose(o);
    }
    if (in) fclose(in);

    /* step 0: the init's weights, and the metadata */
    mg_train_config c = finetune_config(init, out);
    c.data_path = vdata;
    c.log.message = stop_at_model_line;
    CHECK(mg_train_run(&c, &r, &err) == 0 && r.step == 0 && r.stop == MG_STOP_SIGNAL,
          "step-0 run: %s (step %lld)", err.message, (long long)r.step);
    CHECK(r.skipped == 1, "%ld lines skipped, want 1", r.skipped);
    mg_model *fm = NULL;
    mg_adamw fo;
    CHECK(mg_checkpoint_load(out, &fm, &fo, NULL, &err) == 0, "%s", err.message);
    if (fm) {
        CHECK(mg_model_num_params(fm) == P && !memcmp(mg_model_params(fm), ip, P * sizeof(float)),
              "fine-tuning checkpoint at step 0 differs from the init");
        mg_model_free(fm);
        mg_adamw_free(&fo);
    }
    json_t *j = train_meta(out);
    const char *jinit = json_string_value(json_object_get(j, "init"));
    const char *jcrc = json_string_value(json_object_get(j, "init_crc32"));
    char want[16];
    snprintf(want, sizeof want, "%08x", (unsigned)crc);
    CHECK(jinit && !strcmp(jinit, init), "train.init = %s", jinit ? jinit : "(none)");
    CHECK(jcrc && !strcmp(jcrc, want), "train.init_crc32 = %s, zlib says %s", jcrc ? jcrc : "-",
          want);
    json_decref(j);

    /* --freeze 1: the prefix bitwise fixed, everything else trained */
    c.log.message = NULL;
    c.freeze = 1;
    CHECK(mg_train_run(&c, &r, &err) == 0 && r.step == 6, "freeze run: %s", err.message);
    fm = NULL;
    CHECK(mg_checkpoint_load(out, &fm, &fo, NULL, &err) == 0, "%s", err.message);
    if (fm) {
        CHECK(mg_model_frozen(fm) == 1, "checkpoint's model frozen %d", mg_model_frozen(fm));
        const size_t F = mg_model_frozen_params(fm);
        const mg_param_info *b1 = mg_model_find_tensor(fm, "blocks.1.ln1.weight");
        CHECK(b1 && F == b1->offset && F > 0, "frozen prefix %zu", F);
        int prefix = 1; /* an unconditional model's frozen tensors: a prefix */
        for (size_t t = 0; t < mg_model_num_tensors(fm); t++)
            prefix &= mg_model_tensor_frozen(fm, t) == (mg_model_tensor(fm, t)->offset < F);
        CHECK(prefix, "frozen tensors are not the prefix of %zu parameters", F);
        CHECK(!memcmp(mg_model_params(fm), ip, F * sizeof(float)), "frozen parameters changed");
        int mv_zero = 1;
        for (size_t i = 0; i < F; i++) mv_zero &= fo.m[i] == 0.0f && fo.v[i] == 0.0f;
        CHECK(mv_zero, "AdamW moments of frozen parameters are not 0");
        int changed = 0, trained = 0;
        for (size_t t = 0; t < mg_model_num_tensors(fm); t++) {
            const mg_param_info *pi = mg_model_tensor(fm, t);
            if (pi->offset < F) continue;
            trained++;
            changed += memcmp(mg_model_params(fm) + pi->offset, ip + pi->offset,
                              pi->numel * sizeof(float)) != 0;
        }
        CHECK(changed == trained && trained > 0, "%d of %d trained tensors changed", changed,
              trained);
        printf("fine-tuning --freeze 1: %zu of %zu parameters bitwise fixed, %d of %d other "
               "tensors changed\n",
               F, P, changed, trained);

        /* the frozen backward: 0 below, the full backward's bits above */
        int32_t ids[2 * 8] = {1, 4, 5, 6, 2, 0, 0, 0, 1, 7, 4, 4, 4, 6, 5, 2};
        const int64_t len[2] = {5, 8};
        float loss;
        float *full = malloc(P * sizeof(float));
        mg_model_set_frozen(fm, 0, &err);
        CHECK(mg_model_forward(fm, &(mg_batch){.ids = ids, .lengths = len, .B = 2, .T = 8}, 0, 0,
                               &loss, NULL, &err) == 0 &&
                  mg_model_backward(fm, NULL, 0, &err) == 0,
              "%s", err.message);
        memcpy(full, mg_model_grads(fm), P * sizeof(float));
        mg_model_set_frozen(fm, 1, &err);
        CHECK(mg_model_forward(fm, &(mg_batch){.ids = ids, .lengths = len, .B = 2, .T = 8}, 0, 0,
                               &loss, NULL, &err) == 0 &&
                  mg_model_backward(fm, NULL, 0, &err) == 0,
              "%s", err.message);
        int zero = 1;
        for (size_t i = 0; i < F; i++) zero &= mg_model_grads(fm)[i] == 0.0f;
        CHECK(zero, "frozen gradients are not 0");
        CHECK(!memcmp(mg_model_grads(fm) + F, full + F, (P - F) * sizeof(float)),
              "trained gradients differ from the full backward's");
        CHECK(mg_model_set_frozen(fm, 3, &err) != 0, "froze 3 blocks of a 2-block model");
        free(full);
        mg_model_free(fm);
        mg_adamw_free(&fo);
    }

    /* resume of a fine-tuning run: bit for bit */
    mg_train_config sc = finetune_config(init, half);
    sc.data_path = vdata;
    sc.freeze = 1;
    sc.stop_after = 3;
    CHECK(mg_train_run(&sc, &r, &err) == 0 && r.step == 3, "first half: %s", err.message);
    mg_train_config rc = small_config(resumed);
    rc.resume_path = half;
    rc.data_path = NULL;
    CHECK(mg_train_run(&rc, &r, &err) == 0 && r.step == 6, "resume: %s", err.message);
    CHECK(files_equal_params(out, resumed, "fine-tuning resume equality"),
          "straight and resumed fine-tuning runs differ");
    j = train_meta(resumed);
    jcrc = json_string_value(json_object_get(j, "init_crc32"));
    CHECK(jcrc && !strcmp(jcrc, want) && json_integer_value(json_object_get(j, "freeze")) == 1,
          "resumed checkpoint lost init_crc32 / freeze");
    json_decref(j);
    rc.init_path = init;
    CHECK(mg_train_run(&rc, &r, &err) != 0 && strstr(err.message, "--init and --resume"),
          "--init with --resume: %s", err.message);

    /* a model setting other than the init's: refused; the same value: fine */
    mg_train_config gc = finetune_config(init, out);
    gc.data_path = vdata;
    const size_t il = (size_t)(mg_setting_find("n_layer") - MG_TRAIN_SETTING);
    gc.given[il] = 1;
    gc.model.n_layer = 3;
    CHECK(mg_train_run(&gc, &r, &err) != 0 && strstr(err.message, "--layers 3 conflicts"),
          "conflicting --layers: %s", err.message);
    printf("%-28s -> %s\n", "conflicting shape", err.message);
    gc.model.n_layer = mg_model_get_config(im)->n_layer;
    gc.steps = 1;
    CHECK(mg_train_run(&gc, &r, &err) == 0, "agreeing --layers refused: %s", err.message);

    /* tokens outside the vocabulary: refused before training, each named
     * with its count and first line, and the flag that adds them */
    write_bytes(bad, "CC[Se]CC\nc1cc[Te]cc1\n", 21);
    gc.data_path = bad;
    CHECK(mg_train_run(&gc, &r, &err) != 0 && strstr(err.message, "--extend-vocab") &&
              strstr(err.message, "'[Te]' (1 molecule, first at ") && strstr(err.message, "ft_bad.smi:2)"),
          "unknown tokens: %s", err.message);
    mg_model_free(im);
    remove(init);
    remove(out);
    remove(half);
    remove(resumed);
    remove(vdata);
    remove(bad);
}

int main(void) {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/molgen_test_train_%d", (int)getpid());
    char cmd[400];
    snprintf(cmd, sizeof cmd, "mkdir -p %s", tmpdir);
    if (system(cmd) != 0) return 2;
    path_in_tmp(data1k, sizeof data1k, "moses1k.smi");
    if (make_subset(data1k, 1000)) return 2;
    test_optim();
    test_learns();
    test_resume();
    test_signal(SIGINT);
    test_signal(SIGTERM);
    test_bad_checkpoints();
    test_finetune();
    remove(data1k);
    rmdir(tmpdir);
    printf("test_train: %d checks passed, %d failed\n", tu_pass, tu_fail);
    return tu_fail ? 1 : 0;
}
