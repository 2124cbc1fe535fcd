/* Grouped-query attention in the multi-head layer: a layer of 8 query heads
 * whose keys and values have num_kv_heads = 8 (plain), 2 (GQA) or 1 (MQA)
 * heads. Prints each KV cache's size over 4096 positions, then decodes a
 * GQA layer one position at a time and compares with its causal forward.
 * Built as build/gqa_decode. */
#include <attn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

enum { E = 64, H = 8, B = 2, L = 12, T = 4096 };

int main(void) {
    attn_error err;
    /* the cache's size: K and V [1, T, H_kv·E/H] each, and the step's scratch */
    const int64_t kv_heads[] = {8, 2, 1};
    for (int i = 0; i < 3; i++) {
        attn_mha_config cfg = {
            .embed_dim = E, .num_heads = H, .bias = 1, .num_kv_heads = kv_heads[i]};
        attn_mha_kv_shape shape = {.batch = 1, .max_len = T, .max_step = 1, .threads = 1};
        size_t bytes, np;
        if (attn_mha_kv_bytes(&cfg, &shape, &bytes, &err) || attn_mha_param_count(&cfg, &np, &err))
            return fprintf(stderr, "%s\n", err.message), 1;
        const size_t kv = 2 * (size_t)T * (size_t)(kv_heads[i] * (E / H)) * sizeof(float);
        printf("H_kv %lld: %zu parameters, KV cache %zu bytes (K and V %zu)\n",
               (long long)kv_heads[i], np, bytes, kv);
    }

    /* decoding a GQA layer (2 K/V heads) step by step = its causal forward */
    attn_mha_config cfg = {.embed_dim = E, .num_heads = H, .bias = 1, .num_kv_heads = 2};
    size_t np;
    attn_mha_param_count(&cfg, &np, NULL);
    float *params = malloc(np * sizeof(float));
    attn_mha_weights w;
    attn_mha_weights_from_buffer(&cfg, params, &w, NULL); /* w_k, w_v: [16, 64] */
    attn_mha_init(&cfg, &w, 1, NULL);
    static float x[B * L * E], full[B * L * E], step[B * L * E];
    for (int i = 0; i < B * L * E; i++) x[i] = sinf(0.37f * (float)i);
    attn_sdpa_params causal = {.causal = 1};
    if (attn_mha_forward(&cfg, &w, B, L, L, x, x, x, &causal, full, ATTN_WEIGHTS_NONE, NULL, NULL,
                         &err))
        return fprintf(stderr, "%s\n", err.message), 1;
    attn_mha_kv_shape shape = {.batch = B, .max_len = L, .max_step = 1};
    size_t bytes;
    if (attn_mha_kv_bytes(&cfg, &shape, &bytes, &err))
        return fprintf(stderr, "%s\n", err.message), 1;
    void *mem = malloc(bytes);
    attn_mha_kv kv;
    if (attn_mha_kv_init(&cfg, &shape, mem, bytes, &kv, &err))
        return fprintf(stderr, "%s\n", err.message), 1;
    for (int t = 0; t < L; t++) {
        float xt[B * E], yt[B * E];
        for (int b = 0; b < B; b++)
            for (int e = 0; e < E; e++) xt[b * E + e] = x[(b * L + t) * E + e];
        if (attn_mha_step(&cfg, &w, &kv, B, 1, xt, NULL, yt, &err))
            return fprintf(stderr, "%s\n", err.message), 1;
        for (int b = 0; b < B; b++)
            for (int e = 0; e < E; e++) step[(b * L + t) * E + e] = yt[b * E + e];
    }
    float worst = 0.0f;
    for (int i = 0; i < B * L * E; i++) worst = fmaxf(worst, fabsf(step[i] - full[i]));
    printf("GQA (H_kv %lld): %d steps over %d rows, max |step - forward| %.1e (%s 1e-6)\n",
           (long long)kv.num_kv_heads, L, B, (double)worst, worst < 1e-6f ? "<" : ">=");

    /* the K/V heads must divide the query heads */
    cfg.num_kv_heads = 3;
    attn_status s = attn_mha_param_count(&cfg, &np, &err);
    printf("%s: %s\n", attn_status_name(s), err.message);
    free(mem), free(params);
    return 0;
}
