/* The README's training example: fit a causal multi-head attention layer to
 * a fixed random teacher layer by plain SGD, with attention dropout, using
 * attn_mha_forward (with a cache) and attn_mha_backward (which accumulates
 * into the gradient buffer, so it is zeroed each step). */
#include <attn.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { B = 8, L = 16, E = 32, H = 4 };

static float frand(uint64_t *s) { /* xorshift64*, [-1, 1) */
    *s ^= *s >> 12, *s ^= *s << 25, *s ^= *s >> 27;
    return (float)((*s * 0x2545F4914F6CDD1Dull) >> 40) / 8388608.0f - 1.0f;
}

int main(void) {
    attn_mha_config cfg = {.embed_dim = E, .num_heads = H, .bias = 1};
    attn_error err;
    size_t np, nc;
    attn_mha_param_count(&cfg, &np, NULL);
    attn_mha_cache_size(&cfg, B, L, L, &nc, NULL);
    float *teacher = malloc(np * sizeof(float)), *student = malloc(np * sizeof(float));
    float *grad = malloc(np * sizeof(float)), *cache = malloc(nc * sizeof(float));
    float *x = malloc(B * L * E * sizeof(float)), *y = malloc(B * L * E * sizeof(float));
    float *target = malloc(B * L * E * sizeof(float)), *dy = malloc(B * L * E * sizeof(float));
    attn_mha_weights wt, ws, g;
    attn_mha_weights_from_buffer(&cfg, teacher, &wt, NULL);
    attn_mha_weights_from_buffer(&cfg, student, &ws, NULL);
    attn_mha_weights_from_buffer(&cfg, grad, &g, NULL);
    attn_mha_init(&cfg, &wt, 1, NULL);
    attn_mha_init(&cfg, &ws, 2, NULL);
    uint64_t rng = 42;
    attn_sdpa_params eval = {.causal = 1};
    attn_sdpa_params train = {.causal = 1, .dropout_p = 0.1f, .training = 1, .seed = 7};
    for (int step = 0; step <= 300; step++) {
        for (int i = 0; i < B * L * E; i++) x[i] = frand(&rng);
        if (attn_mha_forward(&cfg, &wt, B, L, L, x, x, x, &eval, target, ATTN_WEIGHTS_NONE, NULL,
                             NULL, &err))
            return fprintf(stderr, "%s\n", err.message), 1;
        train.offset = (uint64_t)step; /* a fresh dropout mask every step */
        if (attn_mha_forward(&cfg, &ws, B, L, L, x, x, x, &train, y, ATTN_WEIGHTS_NONE, NULL, cache,
                             &err))
            return fprintf(stderr, "%s\n", err.message), 1;
        double loss = 0; /* mean squared error and its gradient */
        for (int i = 0; i < B * L * E; i++) {
            float d = y[i] - target[i];
            loss += (double)d * d / (B * L * E);
            dy[i] = 2.0f * d / (B * L * E);
        }
        memset(grad, 0, np * sizeof(float));
        if (attn_mha_backward(&cfg, &ws, B, L, L, x, x, x, &train, cache, dy, NULL, NULL, NULL, &g,
                              &err))
            return fprintf(stderr, "%s\n", err.message), 1;
        for (size_t i = 0; i < np; i++) student[i] -= 2.0f * grad[i];
        if (step % 50 == 0) printf("step %3d  loss %.6f\n", step, loss);
    }
    free(teacher), free(student), free(grad), free(cache), free(x), free(y), free(target), free(dy);
    return 0;
}
