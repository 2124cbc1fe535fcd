/* Forward results are bitwise identical for 1, 2 and 3 threads, set globally
 * (attn_set_num_threads) or per call (params.num_threads): SDPA on both the
 * REFERENCE and AUTO paths (out, weights, lse, also without weights so the
 * per-thread scratch is used) and the MHA layer (out, weights). */
#define _POSIX_C_SOURCE 200809L /* setenv */
#include "internal.h"           /* attn_test_reload_env: the library reads the environment once */
#include "testutil.h"

enum { B = 2, H = 3, LQ = 37, LK = 45, DK = 24, DV = 20 };
enum { E = 24, NH = 4, KD = 16, VD = 12 };

typedef struct {
    float out[B * H * LQ * DV], w[B * H * LQ * LK], lse[B * H * LQ], out_nw[B * H * LQ * DV];
    float mha[B * LQ * E], mha_w[B * NH * LQ * LK], mha_avg[B * LQ * LK];
} results;

static float q[B * H * LQ * DK], k[B * H * LK * DK], v[B * H * LK * DV];
static float xq[B * LQ * E], xk[B * LK * KD], xv[B * LK * VD], mask[H * LQ * LK];
static float params[E * (2 * E + KD + VD) + 4 * E];

/* threads > 0: global setting; threads < 0: per call (-threads), global 1. */
static void run(int threads, attn_impl impl, results *r) {
    attn_error err;
    const int per_call = threads < 0;
    attn_set_num_threads(per_call ? 1 : threads, NULL);
    const int64_t lens[B] = {LK, 29};
    attn_mask am = {mask, {1, H, LQ, LK}, {0, LQ * LK, LK, 1}};
    attn_sdpa_params p = {0};
    p.impl = impl;
    p.causal = 1;
    p.key_lengths = lens;
    p.add_mask = &am;
    p.num_threads = per_call ? -threads : 0;

    attn_tensor tq = attn_tensor_blhd(q, B, H, LQ, DK), tk = attn_tensor_bhld(k, B, H, LK, DK),
                tv = attn_tensor_bhld(v, B, H, LK, DV), to = attn_tensor_bhld(r->out, B, H, LQ, DV);
    attn_status s = attn_sdpa_forward(&tq, &tk, &tv, &p, &to, r->w, r->lse, NULL, &err);
    CHECK(s == ATTN_OK, "threads %d: sdpa %s", threads, err.message);
    to.data = r->out_nw;
    s = attn_sdpa_forward(&tq, &tk, &tv, &p, &to, NULL, NULL, NULL, &err);
    CHECK(s == ATTN_OK, "threads %d: sdpa (no weights) %s", threads, err.message);

    attn_mha_config c = {E, NH, KD, VD, 1, 0};
    attn_mha_weights w;
    attn_mha_weights_from_buffer(&c, params, &w, NULL);
    p.add_mask = NULL;
    s = attn_mha_forward(&c, &w, B, LQ, LK, xq, xk, xv, &p, r->mha, ATTN_WEIGHTS_PER_HEAD, r->mha_w,
                         NULL, &err);
    CHECK(s == ATTN_OK, "threads %d: mha %s", threads, err.message);
    float tmp[B * LQ * E];
    s = attn_mha_forward(&c, &w, B, LQ, LK, xq, xk, xv, &p, tmp, ATTN_WEIGHTS_AVERAGE, r->mha_avg,
                         NULL, &err);
    CHECK(s == ATTN_OK && memcmp(tmp, r->mha, sizeof tmp) == 0,
          "threads %d: mha output depends on the weights mode", threads);
}

static results res[2][6];

/* attn_set_num_threads wins over ATTN_NUM_THREADS; 0 falls back to it, and
 * an unusable value falls back to all cores. */
static void test_env(void) {
    attn_set_num_threads(0, NULL);
    const int cores = attn_get_num_threads();
    CHECK(cores >= 1, "default thread count %d", cores);
    setenv("ATTN_NUM_THREADS", "2", 1);
    attn_test_reload_env();
    CHECK(attn_get_num_threads() == 2, "ATTN_NUM_THREADS=2: get %d", attn_get_num_threads());
    attn_set_num_threads(3, NULL);
    CHECK(attn_get_num_threads() == 3, "set(3) over ATTN_NUM_THREADS=2: get %d",
          attn_get_num_threads());
    attn_set_num_threads(0, NULL);
    CHECK(attn_get_num_threads() == 2, "set(0) with ATTN_NUM_THREADS=2: get %d",
          attn_get_num_threads());
    setenv("ATTN_NUM_THREADS", "lots", 1);
    attn_test_reload_env();
    CHECK(attn_get_num_threads() >= 1, "ATTN_NUM_THREADS=lots: get %d", attn_get_num_threads());
    unsetenv("ATTN_NUM_THREADS");
    attn_test_reload_env();
}

int main(void) {
    tu_rng r = tu_seed(77);
    tu_fill(&r, q, sizeof q / sizeof(float), -1, 1);
    tu_fill(&r, k, sizeof k / sizeof(float), -1, 1);
    tu_fill(&r, v, sizeof v / sizeof(float), -1, 1);
    tu_fill(&r, xq, sizeof xq / sizeof(float), -1, 1);
    tu_fill(&r, xk, sizeof xk / sizeof(float), -1, 1);
    tu_fill(&r, xv, sizeof xv / sizeof(float), -1, 1);
    tu_fill(&r, mask, sizeof mask / sizeof(float), -1, 1);
    tu_fill(&r, params, sizeof params / sizeof(float), -0.3f, 0.3f);

    const int counts[6] = {1, 2, 3, -1, -2, -3};
    const attn_impl impls[2] = {ATTN_IMPL_REFERENCE, ATTN_IMPL_AUTO};
    for (int i = 0; i < 2; i++)
        for (int t = 0; t < 6; t++) {
            run(counts[t], impls[i], &res[i][t]);
            CHECK(memcmp(&res[i][t], &res[i][0], sizeof(results)) == 0,
                  "impl %d: results with %d threads differ from 1 thread", (int)impls[i],
                  counts[t]);
        }
    /* Reference weights/lse on or off: same out. */
    CHECK(memcmp(res[0][0].out, res[0][0].out_nw, sizeof res[0][0].out) == 0,
          "out depends on whether weights are requested");
    test_env();
    attn_set_num_threads(0, NULL);
    return tu_report("test_threads");
}
