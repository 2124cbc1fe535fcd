/* The ABI's small promises: attn_version() is the header's ATTN_VERSION and
 * the build's project version, and the explicit scale field: use_scale 1
 * takes any finite scale, 0 included (every score 0: weights uniform over
 * the keys a row sees, checked against the exact fractions 1/n, and dq
 * exactly 0), on the reference, the fused and the decode paths; a nonzero
 * scale without use_scale is refused with a message naming use_scale.
 * attn_cpu_features() agrees with the kernel's reading of the CPU
 * (/proc/cpuinfo's flags, where there is one). */
#include "testutil.h"

static void test_version(void) {
    char want[32];
    snprintf(want, sizeof want, "%d.%d.%d", ATTN_VERSION_MAJOR, ATTN_VERSION_MINOR,
             ATTN_VERSION_PATCH);
    CHECK(strcmp(attn_version(), ATTN_VERSION) == 0, "attn_version() %s, header %s", attn_version(),
          ATTN_VERSION);
    CHECK(strcmp(want, ATTN_VERSION) == 0, "ATTN_VERSION %s vs its parts %s", ATTN_VERSION, want);
#ifdef ATTN_PROJECT_VERSION
    CHECK(strcmp(ATTN_PROJECT_VERSION, ATTN_VERSION) == 0, "CMake project version %s, header %s",
          ATTN_PROJECT_VERSION, ATTN_VERSION);
#endif
}

/* scale 0 on one path: out = mean of the visible V rows, weights 1/n. */
static void zero_scale_case(int64_t Lq, int64_t Lk, attn_impl impl) {
    enum { B = 2, H = 2, D = 5 };
    const size_t nq = (size_t)(B * H * Lq * D), nk = (size_t)(B * H * Lk * D);
    float *q = tu_malloc(nq * 4), *k = tu_malloc(nk * 4), *v = tu_malloc(nk * 4),
          *o = tu_malloc(nq * 4);
    float *w = tu_malloc((size_t)(B * H * Lq * Lk) * 4), *lse = tu_malloc((size_t)(B * H * Lq) * 4);
    float *g = tu_malloc(nq * 4), *dq = tu_malloc(nq * 4), *dk = tu_malloc(nk * 4),
          *dv = tu_malloc(nk * 4);
    tu_rng r = tu_seed((uint64_t)(Lq * 131 + Lk + impl));
    tu_fill(&r, q, nq, -3, 3), tu_fill(&r, k, nk, -3, 3), tu_fill(&r, v, nk, -1, 1),
        tu_fill(&r, g, nq, -1, 1);
    attn_tensor tq = attn_tensor_bhld(q, B, H, Lq, D), tk = attn_tensor_bhld(k, B, H, Lk, D),
                tv = attn_tensor_bhld(v, B, H, Lk, D), to = attn_tensor_bhld(o, B, H, Lq, D),
                tg = attn_tensor_bhld(g, B, H, Lq, D), tdq = attn_tensor_bhld(dq, B, H, Lq, D),
                tdk = attn_tensor_bhld(dk, B, H, Lk, D), tdv = attn_tensor_bhld(dv, B, H, Lk, D);
    attn_sdpa_params p = {0};
    p.use_scale = 1, p.scale = 0.0f, p.causal = 1, p.impl = impl;
    attn_error err;
    CHECK(attn_sdpa_forward(&tq, &tk, &tv, &p, &to, w, lse, NULL, &err) == ATTN_OK, "%s",
          err.message);
    CHECK(attn_sdpa_backward(&tq, &tk, &tv, &to, lse, &tg, &p, &tdq, &tdk, &tdv, NULL, &err) ==
              ATTN_OK,
          "%s", err.message);
    double worst_w = 0, worst_o = 0, dq_max = 0;
    for (int64_t bh = 0; bh < B * H; bh++)
        for (int64_t i = 0; i < Lq; i++) {
            const int64_t n = i + Lk - Lq + 1; /* causal: keys 0 .. i + Lk - Lq */
            for (int64_t j = 0; j < Lk; j++) {
                const double want = j < n ? 1.0 / (double)n : 0.0;
                const double e = fabs(w[(bh * Lq + i) * Lk + j] - want);
                worst_w = e > worst_w ? e : worst_w;
            }
            for (int d = 0; d < D; d++) {
                double mean = 0;
                for (int64_t j = 0; j < n; j++) mean += v[(bh * Lk + j) * D + d];
                const double e = fabs(o[(bh * Lq + i) * D + d] - mean / (double)n);
                worst_o = e > worst_o ? e : worst_o;
                dq_max = fabs(dq[(bh * Lq + i) * D + d]) > dq_max ? fabs(dq[(bh * Lq + i) * D + d])
                                                                  : dq_max;
            }
        }
    /* uniform weights are 1/n rounded once (2^-24 relative) and the mean a
     * sum of <= Lk products of |v| <= 1 */
    CHECK(worst_w <= 1e-7 && worst_o <= 1e-6 && dq_max == 0.0,
          "scale 0, Lq %lld Lk %lld impl %d: weights off by %.3g, out by %.3g, max|dq| %.3g",
          (long long)Lq, (long long)Lk, (int)impl, worst_w, worst_o, dq_max);

    /* the 0.1 spelling: a scale without use_scale */
    p.use_scale = 0, p.scale = 0.5f;
    CHECK_ERR(attn_sdpa_forward(&tq, &tk, &tv, &p, &to, NULL, NULL, NULL, &err), ATTN_ERR_ARG,
              &err);
    CHECK(strstr(err.message, "use_scale") != NULL, "message '%s'", err.message);
    CHECK_ERR(attn_sdpa_backward(&tq, &tk, &tv, &to, lse, &tg, &p, &tdq, &tdk, &tdv, NULL, &err),
              ATTN_ERR_ARG, &err);
    free(q), free(k), free(v), free(o), free(w), free(lse), free(g), free(dq), free(dk), free(dv);
}

static void test_scale_field(void) {
    const attn_impl impls[] = {ATTN_IMPL_REFERENCE, ATTN_IMPL_FUSED};
    for (int i = 0; i < 2; i++) {
        zero_scale_case(70, 90, impls[i]); /* tiled */
        zero_scale_case(3, 300, impls[i]); /* decode */
    }
    /* MHA: a scale without use_scale is refused; use_scale with 0 runs */
    attn_mha_config c = {8, 2, 0, 0, 1, 0};
    size_t np = 0;
    attn_mha_param_count(&c, &np, NULL);
    float *params = tu_malloc(np * 4), x[2 * 3 * 8], y[2 * 3 * 8];
    tu_rng r = tu_seed(3);
    tu_fill(&r, params, np, -0.5f, 0.5f), tu_fill(&r, x, sizeof x / 4, -1, 1);
    attn_mha_weights w;
    attn_mha_weights_from_buffer(&c, params, &w, NULL);
    attn_sdpa_params p = {0};
    p.scale = 2.0f;
    attn_error err;
    CHECK_ERR(
        attn_mha_forward(&c, &w, 2, 3, 3, x, x, x, &p, y, ATTN_WEIGHTS_NONE, NULL, NULL, &err),
        ATTN_ERR_ARG, &err);
    p.use_scale = 1, p.scale = 0.0f;
    CHECK(attn_mha_forward(&c, &w, 2, 3, 3, x, x, x, &p, y, ATTN_WEIGHTS_NONE, NULL, NULL, &err) ==
              ATTN_OK,
          "%s", err.message);
    free(params);
}

/* 1 when the "flags" line of /proc/cpuinfo lists flag as a whole word, 0
 * when not, -1 without a flags line (not Linux on x86-64). */
static int cpuinfo_flag(const char *flag) {
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return -1;
    static char line[16384];
    int found = -1;
    while (found < 0 && fgets(line, sizeof line, f)) {
        char *colon = strchr(line, ':');
        if (strncmp(line, "flags", 5) != 0 || !colon) continue;
        found = 0;
        for (char *t = strtok(colon + 1, " \t\n"); t; t = strtok(NULL, " \t\n"))
            if (strcmp(t, flag) == 0) found = 1;
    }
    fclose(f);
    return found;
}

static void test_cpu_features(void) {
    const unsigned f = attn_cpu_features();
    CHECK((f & ~15u) == 0, "attn_cpu_features() %#x has bits outside ATTN_CPU_*", f);
    const int avx2 = cpuinfo_flag("avx2"), fma = cpuinfo_flag("fma"),
              avx512 = cpuinfo_flag("avx512f"), bf16 = cpuinfo_flag("avx512_bf16"),
              amx = cpuinfo_flag("amx_bf16") == 1 && cpuinfo_flag("amx_tile") == 1;
    if (avx2 < 0) {
        printf("  no flags line in /proc/cpuinfo: features %#x not compared\n", f);
        return;
    }
    CHECK(!!(f & ATTN_CPU_AVX2_FMA) == (avx2 && fma), "AVX2_FMA %d, cpuinfo avx2 %d fma %d",
          !!(f & ATTN_CPU_AVX2_FMA), avx2, fma);
    CHECK(!!(f & ATTN_CPU_AVX512) == (avx512 && avx2 && fma), "AVX512 %d, cpuinfo avx512f %d",
          !!(f & ATTN_CPU_AVX512), avx512);
    CHECK(!!(f & ATTN_CPU_AVX512BF16) == (bf16 && avx512 && avx2 && fma),
          "AVX512BF16 %d, cpuinfo avx512_bf16 %d", !!(f & ATTN_CPU_AVX512BF16), bf16);
    /* the kernel lists amx_* only where it enables the tile state */
    CHECK(!!(f & ATTN_CPU_AMX) == (amx && bf16 && avx512 && avx2 && fma),
          "AMX %d, cpuinfo amx_bf16 and amx_tile %d", !!(f & ATTN_CPU_AMX), amx);
    printf("  attn_cpu_features() %#x: the CPU flags agree\n", f);
}

int main(void) {
    test_version();
    test_cpu_features();
    test_scale_field();
    return tu_report("test_abi");
}
