/* molgen bench's FLOP count (mg_train_step_flops, the numerator of mfu)
 * against an independent count: the matmul weights read from the model's
 * own tensor table (every 2-D weight but the two embeddings, which are
 * lookups) and the causally visible (query, key) pairs counted one by one,
 * on random row lengths; and the measured peak (mg_bench_peak) positive and
 * finite. */
#include <math.h>
#include <string.h>

#include "harness/bench.h"
#include "nn/model.h"

#include "mg_test.h"

static double brute_flops(const mg_model *m, const int64_t *len, int B) {
    const mg_model_config *c = mg_model_get_config(m);
    double weights = 0;
    for (size_t i = 0; i < mg_model_num_tensors(m); i++) {
        const mg_param_info *t = mg_model_tensor(m, i);
        if (t->ndim == 2 && strncmp(t->name, "tok_emb", 7) && strncmp(t->name, "pos_emb", 7))
            weights += (double)t->numel;
    }
    double flops = 0;
    for (int b = 0; b < B; b++) {
        const int64_t L = len[b] - 1; /* input positions */
        int64_t pairs = 0;
        for (int64_t i = 0; i < L; i++)
            for (int64_t j = 0; j < L; j++) pairs += j <= i || c->no_causal_mask;
        /* per position: 2 FLOPs per weight forward, 4 backward; per pair and
         * layer: 2 products of d forward (Q·K, P·V), 4 backward */
        flops += 6.0 * weights * (double)L + 12.0 * c->n_layer * c->d_model * (double)pairs;
    }
    return flops;
}

int main(void) {
    const int shapes[][4] = {{4, 128, 4, 54}, {8, 256, 8, 100}, {1, 8, 2, 3}};
    uint64_t s = 5;
    for (int k = 0; k < 3; k++) {
        mg_model_config c;
        mg_model_config_default(&c);
        c.n_layer = shapes[k][0], c.d_model = shapes[k][1], c.n_head = shapes[k][2];
        c.ctx_len = shapes[k][3], c.vocab_size = 27 + k;
        c.no_causal_mask = k == 2; /* the debug config attends to every position */
        mg_model *m = NULL;
        mg_error err = {0};
        CHECK(mg_model_create(&c, &m, &err) == 0, "%s", err.message);
        if (!m) continue;
        int64_t len[16];
        for (int b = 0; b < 16; b++)
            len[b] = 2 + (int64_t)(mg_splitmix64(&s) % (uint64_t)c.ctx_len);
        len[0] = c.ctx_len + 1; /* a full row */
        const double want = brute_flops(m, len, 16), got = mg_train_step_flops(&c, len, 16);
        CHECK(fabs(got - want) <= 1e-12 * want, "config %d: %.17g FLOPs, counted %.17g", k, got,
              want);
        mg_model_free(m);
    }
    const char *isa = NULL;
    const double peak = mg_bench_peak(1, &isa);
    CHECK(isfinite(peak) && peak > 0.1 && isa && isa[0], "peak %g (%s)", peak, isa ? isa : "?");
    printf("test_bench: measured 1-thread fp32 FMA peak %.1f GFLOP/s (%s)\n", peak, isa);
    printf("test_bench: %d checks passed, %d failed\n", tu_pass, tu_fail);
    return tu_fail ? 1 : 0;
}
