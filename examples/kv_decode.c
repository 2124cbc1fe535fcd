/* Incremental decoding with a KV cache: a causal multi-head layer run one
 * position at a time (attn_mha_step) gives what the full causal forward
 * (attn_mha_forward) gives for the whole sequence. Built as build/kv_decode. */
#include <attn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

enum { E = 32, H = 4, B = 2, L = 10 };

int main(void) {
    attn_mha_config cfg = {.embed_dim = E, .num_heads = H, .bias = 1};
    attn_error err;
    size_t np;
    attn_mha_param_count(&cfg, &np, NULL);
    float *params = malloc(np * sizeof(float));
    attn_mha_weights w;
    attn_mha_weights_from_buffer(&cfg, params, &w, NULL);
    attn_mha_init(&cfg, &w, 1, NULL);

    static float x[B * L * E], full[B * L * E], step[B * L * E];
    for (int i = 0; i < B * L * E; i++) x[i] = sinf(0.37f * (float)i);
    attn_sdpa_params causal = {.causal = 1};
    if (attn_mha_forward(&cfg, &w, B, L, L, x, x, x, &causal, full, ATTN_WEIGHTS_NONE, NULL, NULL,
                         &err))
        return fprintf(stderr, "%s\n", err.message), 1;

    /* the cache: B rows of up to L positions, one position per step */
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
    printf("%d steps over %d rows: cache holds %lld and %lld positions (%zu bytes); "
           "max |step - forward| = %.2g\n",
           L, B, (long long)kv.len[0], (long long)kv.len[1], bytes, (double)worst);
    /* one more step: the cache is full, and says so */
    float xt[B * E] = {0}, yt[B * E];
    attn_status s = attn_mha_step(&cfg, &w, &kv, B, 1, xt, NULL, yt, &err);
    printf("step %d: %s: %s\n", L + 1, attn_status_name(s), err.message);
    free(mem), free(params);
    return 0;
}
