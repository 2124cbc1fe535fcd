/* The gradient dumps' shared pieces (see dump_harness.h). */
#include "harness/dump_harness.h"

#include <stdio.h>

#include "base/util.h"
#include "chem/tokenizer.h"

uint64_t mg_dump_stream(uint64_t seed) { return seed ^ 0x5DEECE66Dull; }

void mg_dump_perturb(mg_model *m, uint64_t *s, double p) {
    float *x = mg_model_params(m);
    for (size_t i = 0; i < mg_model_num_params(m); i++) {
        const double u = (double)(mg_splitmix64(s) >> 11) * 0x1.0p-53;
        x[i] += (float)((u - 0.5) * p);
    }
}

void mg_dump_random_batch(int32_t *ids, int64_t *len, int B, int T, int V, uint64_t *s) {
    for (int b = 0; b < B; b++) {
        len[b] = b == 0 ? T : 2 + (int64_t)(mg_splitmix64(s) % (uint64_t)(T - 1));
        for (int k = 0; k < T; k++)
            ids[(size_t)b * T + k] =
                k == 0 ? MG_BOS
                : k < len[b] - 1
                    ? (int32_t)(MG_NUM_SPECIAL + mg_splitmix64(s) % (uint64_t)(V - MG_NUM_SPECIAL))
                : k == len[b] - 1 ? MG_EOS
                                  : MG_PAD;
    }
}

void mg_dump_grad_tensors(mg_model *m, mg_st_tensor *t, char (*names)[96]) {
    const size_t nt = mg_model_num_tensors(m);
    mg_model_st_tensors(m, t, nt);
    for (size_t i = 0; i < nt; i++) {
        snprintf(names[i], sizeof names[i], "grad.%s", t[i].name);
        t[i].name = names[i];
        t[i].data = mg_model_grads(m) + mg_model_tensor(m, i)->offset;
    }
}
