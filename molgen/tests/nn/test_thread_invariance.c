/* The model's results do not depend on the thread count (layers.h: the
 * products are libattn's attn_matmul, cut only at its measured row step;
 * the element loops split rows or channels, never a sum):
 *  - a training forward and backward (rows of different lengths, dropout
 *    0.1, d_model 96 so the products have rows past several row steps):
 *    loss and every gradient bitwise equal on 1, 2 and 3 threads;
 *  - KV-cache decoding: the logits of 12 steps of 37 rows bitwise equal on
 *    1, 2 and 3 threads.
 * The reference is the 1-thread run: one sgemm call per product. */
#include <string.h>

#include "gen/kv_decode.h"
#include "mg_test.h"
#include "nn/model.h"
#include "chem/tokenizer.h"

enum { B = 29, T = 18, STEPS = 12, ROWS = 37 };

static mg_model_config config(void) {
    mg_model_config c;
    mg_model_config_default(&c);
    c.n_layer = 2;
    c.d_model = 96;
    c.n_head = 4;
    c.ctx_len = 24;
    c.vocab_size = 40;
    c.dropout = 0.1f;
    return c;
}

static mg_model *make(int threads) {
    const mg_model_config c = config();
    mg_model *m = NULL;
    mg_error e;
    if (mg_model_create(&c, &m, &e)) {
        fprintf(stderr, "create: %s\n", e.message);
        exit(2);
    }
    mg_model_init(m, 11);
    mg_model_set_threads(m, threads);
    return m;
}

static void test_training(void) {
    int32_t ids[B * T];
    int64_t len[B];
    uint64_t s = 5;
    for (int b = 0; b < B; b++) {
        len[b] = 2 + (int64_t)(mg_splitmix64(&s) % (T - 1));
        for (int t = 0; t < T; t++)
            ids[b * T + t] =
                t == 0 ? MG_BOS
                       : (int32_t)(MG_NUM_SPECIAL + mg_splitmix64(&s) % (40 - MG_NUM_SPECIAL));
    }
    float loss[3];
    float *grads[3];
    size_t np = 0;
    for (int nt = 1; nt <= 3; nt++) {
        mg_model *m = make(nt);
        mg_error e;
        CHECK(mg_model_forward(m, &(mg_batch){.ids = ids, .lengths = len, .B = B, .T = T}, 1, 99,
                               &loss[nt - 1], NULL, &e) == MG_OK,
              "forward: %s", e.message);
        CHECK(mg_model_backward(m, NULL, 0, &e) == MG_OK, "backward: %s", e.message);
        np = mg_model_num_params(m);
        grads[nt - 1] = malloc(np * sizeof(float));
        memcpy(grads[nt - 1], mg_model_grads(m), np * sizeof(float));
        mg_model_free(m);
    }
    for (int nt = 2; nt <= 3; nt++) {
        CHECK(memcmp(&loss[0], &loss[nt - 1], sizeof(float)) == 0,
              "loss on %d threads %.9g vs 1 thread %.9g", nt, (double)loss[nt - 1],
              (double)loss[0]);
        size_t diff = 0;
        for (size_t i = 0; i < np; i++) diff += memcmp(&grads[0][i], &grads[nt - 1][i], 4) != 0;
        CHECK(diff == 0, "%zu of %zu gradients on %d threads differ from 1 thread", diff, np, nt);
    }
    for (int i = 0; i < 3; i++) free(grads[i]);
}

static void test_decoding(void) {
    const int V = 40;
    float *logits[3];
    for (int nt = 1; nt <= 3; nt++) {
        mg_model *m = make(nt);
        mg_kv_decoder *d = NULL;
        mg_error e;
        CHECK(mg_kv_new(m, ROWS, nt, &d, &e) == MG_OK, "kv_new: %s", e.message);
        CHECK(mg_kv_reset(d, ROWS, &e) == MG_OK, "reset: %s", e.message);
        logits[nt - 1] = malloc((size_t)STEPS * ROWS * V * sizeof(float));
        uint64_t s = 17;
        for (int st = 0; st < STEPS; st++) {
            int32_t tok[ROWS];
            for (int r = 0; r < ROWS; r++)
                tok[r] = st == 0
                             ? MG_BOS
                             : (int32_t)(MG_NUM_SPECIAL + mg_splitmix64(&s) % (V - MG_NUM_SPECIAL));
            CHECK(mg_kv_step(d, tok, logits[nt - 1] + (size_t)st * ROWS * V, &e) == MG_OK,
                  "step: %s", e.message);
        }
        mg_kv_free(d);
        mg_model_free(m);
    }
    for (int nt = 2; nt <= 3; nt++)
        CHECK(!memcmp(logits[0], logits[nt - 1], (size_t)STEPS * ROWS * V * sizeof(float)),
              "decoding logits on %d threads differ from 1 thread", nt);
    for (int i = 0; i < 3; i++) free(logits[i]);
}

int main(void) {
    test_training();
    test_decoding();
    printf("test_thread_invariance: %d checks passed, %d failed\n", tu_pass, tu_fail);
    return tu_fail ? 1 : 0;
}
