/* attn-demo: the tutorial's own examples through libattn.
 * Self-attention over the 4-token sentence "The cat sat down" and over the
 * SMILES "CCO" (ethanol, causal as in a decoder): Q = X W_Q, K = X W_K,
 * V = X W_V, then softmax(Q Kᵀ / sqrt(d_k)) V. Embeddings and weights are
 * random from a fixed seed; the point is the mechanics, not the numbers. */
#include <attn.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>

enum { D_MODEL = 8, D_K = 4, MAX_L = 4 };

static float uniform(uint64_t *s) { /* xorshift64*, [-1, 1) */
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return (float)((*s * 0x2545F4914F6CDD1Dull) >> 40) / 8388608.0f - 1.0f;
}

static void print_matrix(const char *name, const float *m, int rows, int cols,
                         const char *const *labels) {
    printf("%s [%d x %d]\n", name, rows, cols);
    for (int r = 0; r < rows; r++) {
        printf("  %-5s", labels[r]);
        for (int c = 0; c < cols; c++) printf(" %8.4f", (double)m[r * cols + c]);
        printf("\n");
    }
}

static int run(const char *title, const char *const *tokens, int L, int causal, uint64_t seed) {
    float X[MAX_L * D_MODEL], W[3][D_MODEL * D_K], QKV[3][MAX_L * D_K];
    uint64_t s = seed;
    for (int i = 0; i < L * D_MODEL; i++) X[i] = uniform(&s);
    for (int m = 0; m < 3; m++)
        for (int i = 0; i < D_MODEL * D_K; i++) W[m][i] = uniform(&s);
    for (int m = 0; m < 3; m++) /* Q, K, V = X W_Q, X W_K, X W_V */
        for (int i = 0; i < L; i++)
            for (int j = 0; j < D_K; j++) {
                float acc = 0.0f;
                for (int e = 0; e < D_MODEL; e++) acc += X[i * D_MODEL + e] * W[m][e * D_K + j];
                QKV[m][i * D_K + j] = acc;
            }

    printf("== %s: X [%d x %d], W_Q, W_K, W_V [%d x %d]%s\n", title, L, D_MODEL, D_MODEL, D_K,
           causal ? ", causal mask" : "");
    printf("Q, K, V shapes: [%d x %d] each (batch 1, 1 head)\n", L, D_K);
    attn_tensor q = attn_tensor_bhld(QKV[0], 1, 1, L, D_K),
                k = attn_tensor_bhld(QKV[1], 1, 1, L, D_K),
                v = attn_tensor_bhld(QKV[2], 1, 1, L, D_K);
    float O[MAX_L * D_K], P[MAX_L * MAX_L], lse[MAX_L], S[MAX_L * MAX_L];
    attn_tensor o = attn_tensor_bhld(O, 1, 1, L, D_K);
    attn_sdpa_params p = {0};
    p.causal = causal;
    attn_sdpa_info info;
    attn_error err;
    if (attn_sdpa_forward(&q, &k, &v, &p, &o, P, lse, &info, &err) != ATTN_OK) {
        fprintf(stderr, "attn-demo: %s\n", err.message);
        return 1;
    }
    /* The scaled scores Q Kᵀ / sqrt(d_k) are recovered from the weights and
     * the row log-sum-exp: s_ij = log P_ij + lse_i (masked: -inf). */
    for (int i = 0; i < L; i++)
        for (int j = 0; j < L; j++)
            S[i * L + j] = P[i * L + j] > 0 ? logf(P[i * L + j]) + lse[i] : -INFINITY;
    print_matrix("scaled scores Q Kᵀ / sqrt(d_k)", S, L, L, tokens);
    print_matrix("weights softmax(scores), rows sum to 1", P, L, L, tokens);
    print_matrix("output weights · V", O, L, D_K, tokens);
    printf("path: %s (%s)\n\n", info.impl == ATTN_IMPL_FUSED ? "fused" : "reference", info.reason);
    return 0;
}

int main(void) {
    static const char *const sentence[] = {"The", "cat", "sat", "down"};
    static const char *const ethanol[] = {"C", "C", "O"};
    printf("attn %s demo: scaled dot-product self-attention\n\n", attn_version());
    if (run("sentence \"The cat sat down\"", sentence, 4, 0, 42)) return 1;
    if (run("SMILES \"CCO\" (ethanol)", ethanol, 3, 1, 7)) return 1;
    return 0;
}
