/* molgen model tests: gradients against central finite differences, the
 * causal-leak guard, padding invariance, inference vs training forward,
 * determinism, and the model file round trip.
 *
 * Finite differences. The model is fp32, so the check uses a fourth-order
 * central stencil
 *     g_fd = [8 (f(x+h) - f(x-h)) - (f(x+2h) - f(x-2h))] / (12 h),  h = 1e-2
 * whose truncation error is h^4 |f^(5)| / 30 ~ 1e-9 here, and whose rounding
 * error is about (18/12) * delta / h with delta the fp32 error of one loss
 * evaluation: |loss| ~ 2.5 and a few hundred roundings of relative 6e-8
 * accumulate to delta ~ 1e-6 typically (3e-6 to be safe), i.e. ~1.5e-4 (4.5e-4)
 * in the gradient. Each sampled element must satisfy
 *     |g - g_fd| <= ATOL + RTOL * |g_fd|,   ATOL = 5e-4, RTOL = 1e-2,
 * and the error over all samples, normalised by the largest gradient seen
 * (max |g - g_fd| / max |g_fd|), must be <= 2e-3. Measured: max |g - g_fd|
 * = 2.3e-5, normalised <= 7.9e-5, relative error of elements with
 * |g_fd| > 1e-2 <= 2.0e-3 (all four configurations, 756 elements). A wrong
 * formula gives O(1) relative errors, far above these bounds. The exact check of every
 * gradient element is test_model_torch.py (PyTorch autograd in float64). */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "nn/model.h"
#include "chem/tokenizer.h"

#include "mg_test.h"

static uint64_t rng_state = 12345;
static uint64_t rnd(void) { return mg_splitmix64(&rng_state); }
static double urand(void) { return (double)(rnd() >> 11) * 0x1.0p-53; }

static mg_model_config tiny_config(void) {
    mg_model_config c;
    memset(&c, 0, sizeof c);
    c.n_layer = 2;
    c.d_model = 16;
    c.n_head = 2;
    c.ctx_len = 8;
    c.vocab_size = 10;
    return c;
}

/* Threads of the models make_model builds (0: molgen's default). */
static int g_threads;
/* gradcheck with loss prefixes (mg_batch.loss_prefix): rows of length
 * >= 5 get a prefix of 2 targets. */
static int g_prefix;

/* Init, then perturb every parameter by U(-0.5, 0.5) * scale so that every
 * path (attention, LayerNorm gains, biases) carries O(1) signal. */
static mg_model *make_model(const mg_model_config *c, uint64_t seed) {
    mg_model *m = NULL;
    mg_error err = {0};
    if (mg_model_create(c, &m, &err)) {
        fprintf(stderr, "create: %s\n", err.message);
        exit(2);
    }
    mg_model_init(m, seed);
    mg_model_set_threads(m, g_threads);
    float *p = mg_model_params(m);
    for (size_t i = 0; i < mg_model_num_params(m); i++) p[i] += (float)(urand() - 0.5) * 0.6f;
    return m;
}

/* A batch of B rows of T ids: BOS, random data tokens, EOS, PAD. */
static void make_batch(int B, int T, int V, const int *lens, int32_t *ids, int64_t *lengths) {
    for (int b = 0; b < B; b++) {
        lengths[b] = lens[b];
        for (int t = 0; t < T; t++) {
            int32_t id;
            if (t == 0)
                id = MG_BOS;
            else if (t < lens[b] - 1)
                id = (int32_t)(MG_NUM_SPECIAL + rnd() % (uint64_t)(V - MG_NUM_SPECIAL));
            else if (t == lens[b] - 1)
                id = MG_EOS;
            else
                id = MG_PAD;
            ids[b * T + t] = id;
        }
    }
}

static double loss_at(mg_model *m, const mg_batch *bt, int training, uint64_t seed) {
    float loss;
    mg_error err = {0};
    if (mg_model_forward(m, bt, training, seed, &loss, NULL, &err)) {
        fprintf(stderr, "forward: %s\n", err.message);
        exit(2);
    }
    return loss;
}

/* B batch rows (B > 8 spans several attention chunks, see model.c). */
static void gradcheck(const char *label, const mg_model_config *c, int training, int B) {
    mg_model *m = make_model(c, 7);
    const int T = c->ctx_len + 1;
    int lens[32];
    int expect_ntok = 0;
    int64_t pre[32];
    for (int b = 0; b < B; b++) {
        lens[b] = b % 3 == 0 ? T : b % 3 == 1 ? (T < 5 ? T : 5) : 2;
        pre[b] = g_prefix && lens[b] >= 5 ? 2 : 0;
        expect_ntok += lens[b] - 1 - (int)pre[b];
    }
    int32_t ids[32 * 16];
    int64_t len[32];
    make_batch(B, T, c->vocab_size, lens, ids, len);
    mg_error err = {0};
    mg_batch bt = {
        .ids = ids, .lengths = len, .B = B, .T = T, .loss_prefix = g_prefix ? pre : NULL};
    float cv[32 * 4];
    if (c->n_cond > 0) { /* row b: condition k given unless (b + k) % 3 == 1 */
        for (int b = 0; b < B; b++)
            for (int k = 0; k < c->n_cond; k++)
                cv[b * c->n_cond + k] = (b + k) % 3 == 1 ? NAN : (float)(urand() * 4.0 - 2.0);
        bt.cond = cv;
        bt.cond_rows = B;
    }
    float loss;
    int64_t ntok;
    const uint64_t seed = 99;
    CHECK(mg_model_forward(m, &bt, training, seed, &loss, &ntok, &err) == 0, "%s", err.message);
    CHECK(ntok == expect_ntok, "ntok %lld", (long long)ntok);
    CHECK(mg_model_backward(m, NULL, 0, &err) == 0, "%s", err.message);
    CHECK(mg_model_backward(m, NULL, 0, &err) != 0, "a second backward must fail");
    const size_t P = mg_model_num_params(m);
    float *g = malloc(P * sizeof(float));
    memcpy(g, mg_model_grads(m), P * sizeof(float));
    float *p = mg_model_params(m);
    const double h = 1e-2, ATOL = 5e-4, RTOL = 1e-2;
    double max_err = 0.0, max_g = 0.0, max_rel = 0.0;
    int checked = 0;
    for (size_t ti = 0; ti < mg_model_num_tensors(m); ti++) {
        const mg_param_info *t = mg_model_tensor(m, ti);
        /* 6 random elements per tensor, plus the one with the largest gradient */
        size_t idx[7];
        size_t best = 0;
        for (size_t k = 0; k < t->numel; k++)
            if (fabsf(g[t->offset + k]) > fabsf(g[t->offset + best])) best = k;
        for (int k = 0; k < 6; k++) idx[k] = (size_t)(rnd() % t->numel);
        idx[6] = best;
        int nonzero = 0;
        for (int k = 0; k < 7; k++) {
            float *x = &p[t->offset + idx[k]];
            const float x0 = *x;
            double f[4];
            const double steps[4] = {h, -h, 2 * h, -2 * h};
            for (int s = 0; s < 4; s++) {
                *x = x0 + (float)steps[s];
                f[s] = loss_at(m, &bt, training, seed);
            }
            *x = x0;
            const double fd = (8.0 * (f[0] - f[1]) - (f[2] - f[3])) / (12.0 * h);
            const double an = g[t->offset + idx[k]];
            const double e = fabs(an - fd);
            CHECK(e <= ATOL + RTOL * fabs(fd), "%s %s[%zu]: analytic %.6e, finite difference %.6e",
                  label, t->name, idx[k], an, fd);
            if (e > max_err) max_err = e;
            if (fabs(fd) > max_g) max_g = fabs(fd);
            if (fabs(fd) > 1e-2 && e / fabs(fd) > max_rel) max_rel = e / fabs(fd);
            nonzero |= fabs(an) > 1e-6;
            checked++;
        }
        /* Every tensor gets gradient (pos_emb rows past the batch's length
         * too, as L = ctx_len here). */
        CHECK(nonzero, "%s %s: all sampled gradients are zero", label, t->name);
    }
    CHECK(max_err <= 2e-3 * max_g, "%s: max error %.3e vs max gradient %.3e", label, max_err,
          max_g);
    printf("gradcheck %-22s %d elements: max |g - fd| = %.3e, max |fd| = %.3e, normalised %.3e, "
           "max rel (|fd| > 1e-2) %.3e\n",
           label, checked, max_err, max_g, max_err / max_g, max_rel);
    free(g);
    mg_model_free(m);
}

/* Loss prefixes against an independent fp64 oracle: from the inference
 * logits (mg_model_logits), the loss is the mean of -log softmax at the
 * targets past each row's prefix, and head.bias's gradient is
 * sum over those positions of (softmax - onehot) / ntok, i.e. the prefix
 * positions carry no loss and no gradient. With row weights w the backward
 * gives sum_b w_b sum_t (softmax - onehot) instead. Refusals: a prefix that
 * leaves no target, a negative prefix, a prefix given to inference, a
 * row weight that is not finite. */
static void test_loss_prefix(void) {
    mg_model_config c = tiny_config();
    mg_model *m = make_model(&c, 11);
    const int B = 4, T = c.ctx_len + 1, L = T - 1, V = c.vocab_size;
    const int lens[4] = {T, 6, T, 4};
    const int64_t pre[4] = {3, 0, 6, 2};
    int32_t ids[4 * 16];
    int64_t len[4];
    make_batch(B, T, V, lens, ids, len);
    mg_error err = {0};
    float *logits = malloc((size_t)B * L * V * sizeof(float));
    int64_t inl[4];
    int32_t in[4 * 16]; /* the inputs [B, L] */
    for (int b = 0; b < B; b++) {
        inl[b] = len[b] - 1;
        for (int t = 0; t < L; t++) in[b * L + t] = ids[b * T + t];
    }
    CHECK(mg_model_logits(m, &(mg_batch){.ids = in, .lengths = inl, .B = B, .T = L}, logits, NULL,
                          &err) == 0,
          "%s", err.message);
    const float wr[4] = {0.5f, -1.25f, 2.0f, 0.75f};
    double want = 0.0, gb[16] = {0}, gw[16] = {0};
    int64_t n = 0;
    for (int b = 0; b < B; b++)
        for (int t = (int)pre[b]; t < len[b] - 1; t++, n++) {
            const float *z = logits + ((size_t)b * L + t) * V;
            double mx = -INFINITY, s = 0.0;
            for (int v = 0; v < V; v++) mx = z[v] > mx ? z[v] : mx;
            for (int v = 0; v < V; v++) s += exp(z[v] - mx);
            const int tg = ids[b * T + t + 1];
            want -= z[tg] - mx - log(s);
        }
    for (int b = 0; b < B; b++)
        for (int t = (int)pre[b]; t < len[b] - 1; t++) {
            const float *z = logits + ((size_t)b * L + t) * V;
            double mx = -INFINITY, s = 0.0;
            for (int v = 0; v < V; v++) mx = z[v] > mx ? z[v] : mx;
            for (int v = 0; v < V; v++) s += exp(z[v] - mx);
            for (int v = 0; v < V; v++) {
                const double d = exp(z[v] - mx) / s - (v == ids[b * T + t + 1]);
                gb[v] += d / (double)n;
                gw[v] += wr[b] * d;
            }
        }
    want /= (double)n;
    float loss;
    int64_t ntok;
    mg_batch bt = {.ids = ids, .lengths = len, .B = B, .T = T, .loss_prefix = pre};
    CHECK(mg_model_forward(m, &bt, 0, 0, &loss, &ntok, &err) == 0, "%s", err.message);
    CHECK(ntok == n, "ntok %lld, want %lld", (long long)ntok, (long long)n);
    CHECK(fabs(loss - want) <= 1e-5 * fabs(want), "prefixed loss %.8f, fp64 oracle %.8f", loss,
          want);
    CHECK(mg_model_backward(m, NULL, 0, &err) == 0, "%s", err.message);
    const mg_param_info *hb = mg_model_find_tensor(m, "head.bias");
    double worst = 0.0;
    for (int v = 0; v < V; v++) {
        const double e = fabs(mg_model_grads(m)[hb->offset + v] - gb[v]);
        worst = e > worst ? e : worst;
    }
    CHECK(worst <= 1e-6, "head.bias gradient off the fp64 oracle by %.3e", worst);
    printf("loss prefix: loss %.6f vs fp64 %.6f over %lld targets, head.bias gradient within "
           "%.2e\n",
           loss, want, (long long)n, worst);
    /* row weights: the backward of the same forward; a refused weight
     * leaves that forward for the next backward */
    CHECK(mg_model_forward(m, &bt, 0, 0, &loss, &ntok, &err) == 0, "%s", err.message);
    const float bad[4] = {1, NAN, 1, 1};
    CHECK(mg_model_backward(m, bad, B, &err) == MG_ERR_ARG, "a NaN row weight accepted");
    CHECK(mg_model_backward(m, wr, B - 1, &err) == MG_ERR_ARG && strstr(err.message, "3 row weights"),
          "3 row weights for a batch of 4 accepted (%s)", err.message);
    CHECK(mg_model_backward(m, wr, B, &err) == 0, "%s", err.message);
    double wworst = 0.0, gmax = 0.0;
    for (int v = 0; v < V; v++) {
        wworst = fmax(wworst, fabs(mg_model_grads(m)[hb->offset + v] - gw[v]));
        gmax = fmax(gmax, fabs(gw[v]));
    }
    CHECK(wworst <= 1e-6 * fmax(gmax, 1.0),
          "weighted head.bias gradient off the fp64 oracle by "
          "%.3e (max %.3e)",
          wworst, gmax);
    printf("row weights: head.bias gradient within %.2e of fp64 (max %.2e)\n", wworst, gmax);
    /* the same model without prefixes: more targets, another loss */
    float plain;
    bt.loss_prefix = NULL;
    CHECK(mg_model_forward(m, &bt, 0, 0, &plain, &ntok, &err) == 0, "%s", err.message);
    CHECK(ntok == n + 11, "no prefix: ntok %lld", (long long)ntok);
    const int64_t longest[4] = {T - 2, 0, 0, 0}; /* the largest accepted: one target left */
    bt.loss_prefix = longest;
    CHECK(mg_model_forward(m, &bt, 0, 0, &loss, &ntok, &err) == 0, "%s", err.message);
    CHECK(ntok == 1 + (len[1] - 1) + (len[2] - 1) + (len[3] - 1), "longest prefix: ntok %lld",
          (long long)ntok);
    const int64_t too_long[4] = {T - 1, 0, 0, 0}, neg[4] = {0, -1, 0, 0};
    bt.loss_prefix = too_long;
    CHECK(mg_model_forward(m, &bt, 0, 0, &loss, NULL, &err) == MG_ERR_ARG,
          "a prefix leaving no target must be refused");
    bt.loss_prefix = neg;
    CHECK(mg_model_forward(m, &bt, 0, 0, &loss, NULL, &err) == MG_ERR_ARG, "a negative prefix");
    /* inference has no loss: a prefix there is refused */
    CHECK(mg_model_logits(m, &(mg_batch){.ids = in, .B = B, .T = L, .loss_prefix = pre}, logits,
                          NULL, &err) == MG_ERR_ARG,
          "a loss prefix given to mg_model_logits");
    free(logits);
    mg_model_free(m);
}

/* The guard passes the causal model and catches the one without the mask. */
static void test_guard(void) {
    mg_error err = {0};
    mg_model_config c = tiny_config();
    mg_model *m = make_model(&c, 1);
    CHECK(mg_model_causal_guard(m, 5, &err) == 0, "causal model flagged: %s", err.message);
    mg_model_free(m);
    /* GPT-2 init (no perturbation) too: the leak is still far above 1e-6. */
    c.no_causal_mask = 1;
    mg_model *bad = NULL;
    CHECK(mg_model_create(&c, &bad, &err) == 0, "%s", err.message);
    mg_model_init(bad, 1);
    err.message[0] = 0;
    int rc = mg_model_causal_guard(bad, 5, &err);
    CHECK(rc == MG_ERR_LEAK, "leaky model passed the guard (rc %d)", rc);
    CHECK(strstr(err.message, "causal leak") != NULL, "message: %s", err.message);
    printf("guard on the no-mask model: %s\n", err.message);
    mg_model_free(bad);
    /* Default-size model with GPT-2 init. */
    mg_model_config_default(&c);
    c.ctx_len = 20;
    c.vocab_size = 26;
    CHECK(mg_model_create(&c, &m, &err) == 0, "%s", err.message);
    mg_model_init(m, 3);
    CHECK(mg_model_causal_guard(m, 5, &err) == 0, "default model flagged: %s", err.message);
    mg_model_free(m);
}

/* Tokens after a row's EOS (padding) change neither the loss nor the
 * gradients; inference logits match the training forward's loss. */
static void test_padding_and_inference(void) {
    mg_model_config c = tiny_config();
    mg_model *m = make_model(&c, 3);
    enum { B = 3 };
    const int T = c.ctx_len + 1, L = T - 1, V = c.vocab_size;
    const int lens[B] = {4, T, 6};
    int32_t ids[B * 9], ids2[B * 9];
    int64_t len[B];
    make_batch(B, T, V, lens, ids, len);
    memcpy(ids2, ids, sizeof ids);
    for (int b = 0; b < B; b++)
        for (int t = lens[b]; t < T; t++) ids2[b * T + t] = (int32_t)(rnd() % (uint64_t)V);
    mg_error err = {0};
    float l1, l2;
    CHECK(mg_model_forward(m, &(mg_batch){.ids = ids, .lengths = len, .B = B, .T = T}, 0, 0, &l1,
                           NULL, &err) == 0,
          "%s", err.message);
    const size_t P = mg_model_num_params(m);
    float *g1 = malloc(P * sizeof(float));
    CHECK(mg_model_backward(m, NULL, 0, &err) == 0, "%s", err.message);
    memcpy(g1, mg_model_grads(m), P * sizeof(float));
    CHECK(mg_model_forward(m, &(mg_batch){.ids = ids2, .lengths = len, .B = B, .T = T}, 0, 0, &l2,
                           NULL, &err) == 0,
          "%s", err.message);
    CHECK(mg_model_backward(m, NULL, 0, &err) == 0, "%s", err.message);
    CHECK(l1 == l2, "padding changed the loss: %.9g vs %.9g", l1, l2);
    CHECK(memcmp(g1, mg_model_grads(m), P * sizeof(float)) == 0, "padding changed the gradients");

    /* Same batch twice: bitwise identical loss and gradients. */
    CHECK(mg_model_forward(m, &(mg_batch){.ids = ids, .lengths = len, .B = B, .T = T}, 0, 0, &l2,
                           NULL, &err) == 0,
          "%s", err.message);
    CHECK(mg_model_backward(m, NULL, 0, &err) == 0, "%s", err.message);
    CHECK(l1 == l2 && memcmp(g1, mg_model_grads(m), P * sizeof(float)) == 0, "not deterministic");

    /* Loss recomputed from mg_model_logits (with key lengths, and without:
     * causal attention makes them equal on the counted positions). */
    for (int pass = 0; pass < 2; pass++) {
        int32_t in[B * 8];
        int64_t kl[B];
        float *lg = malloc((size_t)B * L * V * sizeof(float));
        for (int b = 0; b < B; b++) {
            kl[b] = len[b] - 1;
            for (int t = 0; t < L; t++) in[b * L + t] = ids[b * T + t];
        }
        CHECK(mg_model_logits(m,
                              &(mg_batch){.ids = in, .lengths = pass ? NULL : kl, .B = B, .T = L},
                              lg, NULL, &err) == 0,
              "%s", err.message);
        double sum = 0;
        int n = 0;
        for (int b = 0; b < B; b++)
            for (int t = 0; t < kl[b]; t++) {
                const float *r = lg + ((size_t)b * L + t) * V;
                double mx = -1e30, se = 0;
                for (int v = 0; v < V; v++) mx = r[v] > mx ? r[v] : mx;
                for (int v = 0; v < V; v++) se += exp(r[v] - mx);
                sum += mx + log(se) - r[ids[b * T + t + 1]];
                n++;
            }
        CHECK(fabs(sum / n - l1) <= 1e-5 * fabs(l1), "logits loss %.9g vs forward %.9g", sum / n,
              l1);
        free(lg);
    }
    /* Dropout: training differs from eval, is reproducible for a seed, and
     * differs across seeds. */
    mg_model_config cd = c;
    cd.dropout = 0.3f;
    mg_model *md = NULL;
    CHECK(mg_model_create(&cd, &md, &err) == 0, "%s", err.message);
    memcpy(mg_model_params(md), mg_model_params(m), P * sizeof(float));
    float e0, t1, t1b, t2;
    mg_model_forward(md, &(mg_batch){.ids = ids, .lengths = len, .B = B, .T = T}, 0, 1, &e0, NULL,
                     &err);
    mg_model_forward(md, &(mg_batch){.ids = ids, .lengths = len, .B = B, .T = T}, 1, 1, &t1, NULL,
                     &err);
    mg_model_forward(md, &(mg_batch){.ids = ids, .lengths = len, .B = B, .T = T}, 1, 1, &t1b, NULL,
                     &err);
    mg_model_forward(md, &(mg_batch){.ids = ids, .lengths = len, .B = B, .T = T}, 1, 2, &t2, NULL,
                     &err);
    CHECK(e0 == l1, "eval with dropout config %.9g vs %.9g", e0, l1);
    CHECK(t1 == t1b && t1 != e0 && t1 != t2, "dropout losses %g %g %g %g", e0, t1, t1b, t2);
    /* The masks are those of the global batch row (mg_batch.row0):
     * the batch as row 0 alone and rows 1..2 at row0 = 1 gives the whole
     * batch's token-weighted loss and gradient (the mean's decomposition);
     * rows 1..2 at row0 = 0 draw other masks. */
    {
        float lf, la, lb, lx;
        int64_t nf, na, nb, nx;
        float *gf = malloc(P * sizeof(float)), *ga = malloc(P * sizeof(float));
        CHECK(mg_model_forward(md, &(mg_batch){.ids = ids, .lengths = len, .B = B, .T = T}, 1, 5,
                               &lf, &nf, &err) == 0 &&
                  mg_model_backward(md, NULL, 0, &err) == 0,
              "%s", err.message);
        memcpy(gf, mg_model_grads(md), P * sizeof(float));
        CHECK(mg_model_forward(md, &(mg_batch){.ids = ids, .lengths = len, .B = 1, .T = T}, 1, 5,
                               &la, &na, &err) == 0 &&
                  mg_model_backward(md, NULL, 0, &err) == 0,
              "%s", err.message);
        memcpy(ga, mg_model_grads(md), P * sizeof(float));
        mg_batch rest = {.ids = ids + T, .lengths = len + 1, .B = B - 1, .T = T, .row0 = 1};
        CHECK(mg_model_forward(md, &rest, 1, 5, &lb, &nb, &err) == 0 &&
                  mg_model_backward(md, NULL, 0, &err) == 0,
              "%s", err.message);
        const float *gb = mg_model_grads(md);
        const double whole = (double)la * na + (double)lb * nb;
        CHECK(na + nb == nf && fabs(whole / nf - lf) <= 1e-6 * lf,
              "split at row 1: loss %.9g vs whole batch %.9g", whole / nf, lf);
        double worst = 0, gmax = 0;
        for (size_t i = 0; i < P; i++) {
            const double gs = ((double)ga[i] * na + (double)gb[i] * nb) / nf;
            worst = fmax(worst, fabs(gs - gf[i]));
            gmax = fmax(gmax, fabs(gf[i]));
        }
        CHECK(worst <= 1e-5 * gmax, "split at row 1: gradient off by %.3g (max %.3g)", worst, gmax);
        CHECK(mg_model_forward(md, &rest, 1, 5, &lx, &nx, &err) == 0, "%s", err.message);
        rest.row0 = 0;
        float l0;
        CHECK(mg_model_forward(md, &rest, 1, 5, &l0, &nx, &err) == 0, "%s", err.message);
        CHECK(l0 != lx, "rows 1..2 at row0 0 and 1 drew the same masks (%.9g)", l0);
        rest.row0 = -1;
        CHECK(mg_model_forward(md, &rest, 1, 5, &l0, &nx, &err) == MG_ERR_ARG, "row0 -1 accepted");
        rest.row0 = (int64_t)1 << 31;
        CHECK(mg_model_forward(md, &rest, 1, 5, &l0, &nx, &err) == MG_ERR_ARG,
              "row0 2^31 accepted");
        free(gf), free(ga);
    }
    mg_model_free(md);

    /* Bad inputs are errors, not crashes. */
    int64_t badlen[B] = {1, 3, 3};
    CHECK(mg_model_forward(m, &(mg_batch){.ids = ids, .lengths = badlen, .B = B, .T = T}, 0, 0, &l2,
                           NULL, &err) != 0,
          "length 1");
    CHECK(mg_model_forward(m, &(mg_batch){.ids = ids, .lengths = len, .B = B, .T = T + 1}, 0, 0,
                           &l2, NULL, &err) != 0,
          "T too long");
    ids2[0] = 99;
    CHECK(mg_model_forward(m, &(mg_batch){.ids = ids2, .lengths = len, .B = B, .T = T}, 0, 0, &l2,
                           NULL, &err) != 0,
          "id out of range");
    free(g1);
    mg_model_free(m);
}

static void test_config_and_files(void) {
    mg_error err = {0};
    char js[512];
    mg_model_config c = tiny_config(), r;
    c.dropout = 0.1f;
    mg_model_config_to_json(&c, js, sizeof js);
    CHECK(mg_model_config_from_json(js, &r, &err) == 0, "%s", err.message);
    CHECK(memcmp(&c, &r, sizeof c) == 0, "config JSON round trip: %s", js);
    CHECK(mg_model_config_from_json("{\"n_layer\":2}", &r, &err) != 0, "missing keys");
    CHECK(mg_model_config_from_json("{\"n_layer\":2,\"d_model\":15,\"n_head\":2,\"ctx_len\":8,"
                                    "\"vocab_size\":10}",
                                    &r, &err) != 0,
          "d %% H");
    mg_model_config_molgpt(&c);
    c.ctx_len = 54;
    c.vocab_size = 26;
    mg_model *big = NULL;
    CHECK(mg_model_create(&c, &big, &err) == 0, "MolGPT config: %s", err.message);
    if (big) {
        const mg_param_info *t = mg_model_find_tensor(big, "blocks.7.attn.in_proj_weight");
        CHECK(t && t->shape[0] == 768 && t->shape[1] == 256 && t->decay, "in_proj shape");
        t = mg_model_find_tensor(big, "blocks.7.mlp.proj.weight");
        CHECK(t && t->shape[0] == 256 && t->shape[1] == 1024, "proj shape");
        /* 8 * 12 d^2 + 8 * 13 d + 2 V d + ctx d + 2 d + V */
        size_t expect = 8 * (12 * 256 * 256 + 13 * 256) + 2 * 26 * 256 + 54 * 256 + 2 * 256 + 26;
        CHECK(mg_model_num_params(big) == expect, "params %zu vs %zu", mg_model_num_params(big),
              expect);
        mg_model_free(big);
    }

    /* Save / load round trip with the vocabulary. */
    c = tiny_config();
    mg_model *m = make_model(&c, 11);
    const char *toks[] = {"C", "c", "1", "(", ")", "=", "O"};
    mg_vocab *v = NULL;
    CHECK(mg_vocab_from_tokens(toks, 7, &v, &err) == 0, "%s", err.message);
    char path[64];
    snprintf(path, sizeof path, "/tmp/molgen_test_model_%d.safetensors", (int)getpid());
    CHECK(mg_model_save(m, v, path, &err) == 0, "save: %s", err.message);
    mg_model *m2 = NULL;
    mg_vocab *v2 = NULL;
    CHECK(mg_model_load(path, 0, &m2, &v2, NULL, &err) == 0, "load: %s", err.message);
    if (m2) {
        CHECK(mg_model_num_params(m2) == mg_model_num_params(m) &&
                  memcmp(mg_model_params(m2), mg_model_params(m),
                         mg_model_num_params(m) * sizeof(float)) == 0,
              "parameters differ after load");
        CHECK(v2 && mg_vocab_equal(v, v2), "vocab differs after load");
    }
    mg_model_free(m2);
    mg_vocab_free(v2);
    /* A truncated file is a clear error. */
    FILE *f = fopen(path, "r+b");
    if (f) {
        CHECK(ftruncate(fileno(f), 100) == 0, "truncate");
        fclose(f);
    }
    m2 = NULL;
    CHECK(mg_model_load(path, 0, &m2, NULL, NULL, &err) != 0 && !m2, "truncated file loaded");
    printf("truncated model file: %s\n", err.message);
    /* A config that asks for more parameters than the file holds (here 5.5e13,
     * the fuzzer's regression input) is refused before any allocation. */
    const char *huge =
        "{\"n_layer\":1024,\"d_model\":65536,\"n_head\":1,\"ctx_len\":8,\"vocab_size\":10}";
    const mg_st_kv meta[] = {{"format", "molgen"}, {"config", huge}};
    CHECK(mg_st_write(path, NULL, 0, meta, 2, &err) == 0, "%s", err.message);
    m2 = NULL;
    const mg_status hrc = mg_model_load(path, 0, &m2, NULL, NULL, &err);
    CHECK(hrc == MG_ERR_FORMAT && !m2 && strstr(err.message, "asks for"), "huge config: %d %s",
          (int)hrc, err.message);
    printf("huge config: %s\n", err.message);
    remove(path);
    mg_vocab_free(v);
    mg_model_free(m);
}

int main(void) {
    mg_model_config c = tiny_config();
    gradcheck("tiny", &c, 0, 3);
    c.dropout = 0.2f;
    gradcheck("tiny + dropout 0.2", &c, 1, 3);
    gradcheck("tiny + dropout, B 19", &c, 1, 19);
    c = tiny_config();
    c.n_layer = 1;
    c.d_model = 12;
    c.n_head = 3;
    c.ctx_len = 6;
    c.vocab_size = 5;
    gradcheck("1 layer, 3 heads", &c, 0, 3);
    c = tiny_config(); /* conditioning (condition.h): cond.weight and cond.missing */
    c.n_cond = 3;
    gradcheck("3 conditions", &c, 0, 3);
    c.dropout = 0.2f;
    gradcheck("3 conditions + dropout", &c, 1, 19);
    c.dropout = 0.0f;
    c.cond_bos = 1;
    gradcheck("3 conditions at BOS", &c, 0, 3);
    c = tiny_config();
    g_prefix = 1;
    gradcheck("loss prefixes", &c, 0, 3);
    c.dropout = 0.2f;
    gradcheck("loss prefixes + dropout", &c, 1, 19);
    g_prefix = 0;
    test_loss_prefix();
    test_guard();
    test_padding_and_inference();
    test_config_and_files();
    /* Thread-count independence is not promised, but 1 thread must work. */
    g_threads = 1;
    c = tiny_config();
    gradcheck("tiny, 1 thread", &c, 0, 3);
    printf("test_model: %d checks passed, %d failed\n", tu_pass, tu_fail);
    return tu_fail ? 1 : 0;
}
