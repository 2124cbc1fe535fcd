/* The README's C example: causal self-attention over 3 tokens, weights out. */
#include <attn.h>
#include <stdio.h>

int main(void) {
    float q[3 * 2] = {1, 0, 0, 1, 1, 1}, k[3 * 2] = {1, 0, 0, 1, 1, 1},
                v[3 * 2] = {1, 2, 3, 4, 5, 6};
    float o[3 * 2], w[3 * 3];
    attn_tensor Q = attn_tensor_bhld(q, 1, 1, 3, 2), K = attn_tensor_bhld(k, 1, 1, 3, 2),
                V = attn_tensor_bhld(v, 1, 1, 3, 2), O = attn_tensor_bhld(o, 1, 1, 3, 2);
    attn_sdpa_params p = {.causal = 1};
    attn_error err;
    if (attn_sdpa_forward(&Q, &K, &V, &p, &O, w, NULL, NULL, &err))
        return fprintf(stderr, "%s\n", err.message), 1;
    for (int i = 0; i < 3; i++)
        printf("out %.4f %.4f   weights %.4f %.4f %.4f\n", o[2 * i], o[2 * i + 1], w[3 * i],
               w[3 * i + 1], w[3 * i + 2]);
    return 0;
}
