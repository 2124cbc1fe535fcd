/* attn_mha_step (incremental causal self-attention over a caller-owned KV
 * cache) against the full causal attn_mha_forward and an fp64 oracle.
 *
 *   - Token by token (Lq = 1, the fused decode kernel) over L positions, and
 *     in chunks of 1..5 positions with rows at different lengths (restarts),
 *     each row's outputs vs the fp64 causal MHA of its own sequence: the
 *     same bound as the forward's own test (1e-5 of max|out|, test_mha.c);
 *     the full forward is held to it too, and the worst errors are printed.
 *     Both are fp32 computations of the same sums (dot products over 6-24
 *     terms, softmax over <= 37 keys) that differ only in summation order,
 *     so each is ~1e-7 from fp64; 1e-5 leaves two orders of magnitude.
 *   - A whole sequence in one step over an empty cache (the tiled kernel),
 *     and weights in separate buffers (three products instead of the
 *     stacked one), to the same bound.
 *   - 1, 2 and 3 threads give bitwise-identical steps.
 *   - Every refusal: a full cache (nothing written), rows or positions
 *     beyond the cache's shape, a config other than the cache's, masks,
 *     dropout, the reference path, more threads than the cache was sized
 *     for, too little memory, NULLs. */
#include "testutil.h"

enum { E = 24, NH = 4, DH = E / NH, B = 3, L = 37 };

static float params[4 * E * E + 4 * E];
static float xs[B * L * E]; /* row b's sequence: xs[b][t][:] */

/* fp64 causal MHA of one sequence x [n, E] (bias on) into y [n, E]. */
static void oracle(const attn_mha_weights *w, const float *x, int64_t n, double *y) {
    double *q = tu_malloc((size_t)(3 * n * E) * sizeof(double)), *k = q + n * E, *v = k + n * E;
    double *o = tu_malloc((size_t)(n * E) * sizeof(double)),
           *p = tu_malloc((size_t)n * sizeof(double));
    const float *W[3] = {w->w_q, w->w_k, w->w_v}, *bias[3] = {w->b_q, w->b_k, w->b_v};
    double *P[3] = {q, k, v};
    for (int m = 0; m < 3; m++)
        for (int64_t t = 0; t < n; t++)
            for (int e = 0; e < E; e++) {
                double acc = bias[m][e];
                for (int c = 0; c < E; c++) acc += (double)x[t * E + c] * W[m][e * E + c];
                P[m][t * E + e] = acc;
            }
    for (int h = 0; h < NH; h++)
        for (int64_t i = 0; i < n; i++) {
            double mx = -INFINITY, sum = 0.0;
            for (int64_t j = 0; j <= i; j++) {
                double s = 0.0;
                for (int d = 0; d < DH; d++) s += q[i * E + h * DH + d] * k[j * E + h * DH + d];
                p[j] = s / sqrt((double)DH);
                mx = p[j] > mx ? p[j] : mx;
            }
            for (int64_t j = 0; j <= i; j++) sum += (p[j] = exp(p[j] - mx));
            for (int d = 0; d < DH; d++) {
                double acc = 0.0;
                for (int64_t j = 0; j <= i; j++) acc += p[j] * v[j * E + h * DH + d];
                o[i * E + h * DH + d] = acc / sum;
            }
        }
    for (int64_t t = 0; t < n; t++)
        for (int e = 0; e < E; e++) {
            double acc = w->b_o[e];
            for (int c = 0; c < E; c++) acc += o[t * E + c] * w->w_o[e * E + c];
            y[t * E + e] = acc;
        }
    free(q), free(o), free(p);
}

/* max |got - want| / max|want| */
static double rel_err(const float *got, const double *want, size_t n) {
    double m = 0.0;
    for (size_t i = 0; i < n; i++) m = fabs(want[i]) > m ? fabs(want[i]) : m;
    return tu_maxdiff(got, want, n) / (m > 0 ? m : 1.0);
}

static attn_mha_config g_cfg = {E, NH, 0, 0, 1, 0};
static attn_mha_weights g_w;
static double g_worst_step, g_worst_fwd;

static void *new_kv(attn_mha_kv *kv, int64_t batch, int64_t max_len, int64_t max_step,
                    int threads) {
    attn_mha_kv_shape s = {batch, max_len, max_step, threads};
    size_t bytes = 0;
    attn_error err;
    CHECK(attn_mha_kv_bytes(&g_cfg, &s, &bytes, &err) == ATTN_OK, "kv_bytes: %s", err.message);
    void *mem = tu_malloc(bytes);
    CHECK(attn_mha_kv_init(&g_cfg, &s, mem, bytes, kv, &err) == ATTN_OK, "kv_init: %s",
          err.message);
    return mem;
}

/* Rows step through their sequences in chunks; row r's chunk sizes come
 * from `chunks` (cycled), and row r joins `late[r]` steps after row 0 (so
 * the rows are at different lengths). Outputs per row and position. */
static void run_chunks(const int *chunks, int nchunks, const int *late, int threads, float *ys) {
    attn_mha_kv kv;
    const int most = attn_get_num_threads() > 3 ? attn_get_num_threads() : 3;
    void *mem = new_kv(&kv, B, L, 5, most);
    attn_sdpa_params p = {0};
    p.num_threads = threads;
    attn_error err;
    float x[B * 5 * E], y[B * 5 * E];
    int pos[B] = {0}, step = 0;
    for (;;) {
        /* all rows step together with one Lq: a row that is not due yet, or
         * done, is held at length 0 (restarted after the step) */
        int lq = chunks[step % nchunks], any = 0, n = 0;
        for (int r = 0; r < B; r++) {
            int left = L - pos[r];
            if (step >= late[r] && left > 0 && left < lq) lq = left;
        }
        for (int r = 0; r < B; r++) {
            const int active = step >= late[r] && pos[r] < L;
            any |= active;
            if (active) n = r + 1;
        }
        if (!any) break;
        for (int r = 0; r < n; r++) {
            const int active = step >= late[r] && pos[r] < L;
            if (!active) kv.len[r] = 0;
            for (int i = 0; i < lq; i++)
                memcpy(x + (r * lq + i) * E, xs + ((size_t)r * L + (active ? pos[r] + i : i)) * E,
                       E * sizeof(float));
        }
        attn_status s = attn_mha_step(&g_cfg, &g_w, &kv, n, lq, x, &p, y, &err);
        CHECK(s == ATTN_OK, "step %d (n %d, Lq %d): %s", step, n, lq, err.message);
        if (s) break;
        for (int r = 0; r < n; r++) {
            const int active = step >= late[r] && pos[r] < L;
            if (!active) {
                kv.len[r] = 0;
                continue;
            }
            memcpy(ys + ((size_t)r * L + pos[r]) * E, y + r * lq * E,
                   (size_t)lq * E * sizeof(float));
            pos[r] += lq;
            CHECK(kv.len[r] == pos[r], "row %d: len %lld after the step, want %d", r,
                  (long long)kv.len[r], pos[r]);
        }
        step++;
    }
    free(mem);
}

static void check_rows(const char *what, const float *ys, const double *want) {
    for (int r = 0; r < B; r++) {
        const double e = rel_err(ys + (size_t)r * L * E, want + (size_t)r * L * E, (size_t)L * E);
        g_worst_step = e > g_worst_step ? e : g_worst_step;
        CHECK(e <= 1e-5, "%s: row %d error %.3g vs fp64 (bound 1e-5)", what, r, e);
    }
}

static void test_against_forward(void) {
    double *want = tu_malloc(sizeof(double) * B * L * E);
    for (int r = 0; r < B; r++) oracle(&g_w, xs + (size_t)r * L * E, L, want + (size_t)r * L * E);

    /* the full causal forward over the same sequences */
    float *full = tu_malloc(sizeof(float) * B * L * E);
    attn_sdpa_params pc = {0};
    pc.causal = 1;
    attn_error err;
    CHECK(attn_mha_forward(&g_cfg, &g_w, B, L, L, xs, xs, xs, &pc, full, ATTN_WEIGHTS_NONE, NULL,
                           NULL, &err) == ATTN_OK,
          "forward: %s", err.message);
    for (int r = 0; r < B; r++) {
        const double e = rel_err(full + (size_t)r * L * E, want + (size_t)r * L * E, (size_t)L * E);
        g_worst_fwd = e > g_worst_fwd ? e : g_worst_fwd;
        CHECK(e <= 1e-5, "forward: row %d error %.3g vs fp64", r, e);
    }

    /* token by token, all rows together */
    float *ys = tu_malloc(sizeof(float) * B * L * E);
    const int one[1] = {1}, together[B] = {0, 0, 0}, staggered[B] = {0, 4, 9};
    run_chunks(one, 1, together, 0, ys);
    check_rows("Lq 1", ys, want);
    /* rows at different lengths: the decode kernel's per-row key lengths */
    run_chunks(one, 1, staggered, 0, ys);
    check_rows("Lq 1, staggered rows", ys, want);
    /* chunks 1..5 with staggered rows: Lq > 1 over ragged rows (one call per
     * row) and Lq > 4 (the tiled kernel) */
    const int mixed[5] = {3, 1, 5, 2, 4};
    run_chunks(mixed, 5, staggered, 0, ys);
    check_rows("chunks 1-5, staggered", ys, want);
    run_chunks(mixed, 5, together, 0, ys);
    check_rows("chunks 1-5, together", ys, want);

    /* threads: bitwise the same steps */
    float *y1 = tu_malloc(sizeof(float) * B * L * E);
    run_chunks(mixed, 5, staggered, 1, y1);
    for (int t = 2; t <= 3; t++) {
        run_chunks(mixed, 5, staggered, t, ys);
        CHECK(memcmp(ys, y1, sizeof(float) * B * L * E) == 0, "%d threads differ from 1", t);
        run_chunks(one, 1, staggered, t, ys);
        float *z = tu_malloc(sizeof(float) * B * L * E);
        run_chunks(one, 1, staggered, 1, z);
        CHECK(memcmp(ys, z, sizeof(float) * B * L * E) == 0, "Lq 1: %d threads differ from 1", t);
        free(z);
    }

    /* the whole sequence in one step over an empty cache */
    attn_mha_kv kv;
    void *mem = new_kv(&kv, B, L, L, 0);
    CHECK(attn_mha_step(&g_cfg, &g_w, &kv, B, L, xs, NULL, ys, &err) == ATTN_OK, "prefill: %s",
          err.message);
    check_rows("one-step prefill", ys, want);
    /* weights in buffers of their own: three products, not the stacked one */
    attn_mha_weights w3 = g_w;
    float *const parts[8] = {g_w.w_q, g_w.w_k, g_w.w_v, g_w.w_o,
                             g_w.b_q, g_w.b_k, g_w.b_v, g_w.b_o};
    float **dst[8] = {&w3.w_q, &w3.w_k, &w3.w_v, &w3.w_o, &w3.b_q, &w3.b_k, &w3.b_v, &w3.b_o};
    float *sep[8];
    for (int i = 0; i < 8; i++) {
        const size_t n = i < 4 ? E * E : E;
        sep[i] = tu_malloc(n * sizeof(float));
        memcpy(sep[i], parts[i], n * sizeof(float));
        *dst[i] = sep[i];
    }
    kv.len[0] = kv.len[1] = kv.len[2] = 0;
    CHECK(attn_mha_step(&g_cfg, &w3, &kv, B, L, xs, NULL, ys, &err) == ATTN_OK, "separate: %s",
          err.message);
    check_rows("separate weight buffers", ys, want);
    for (int i = 0; i < 8; i++) free(sep[i]);
    free(mem), free(y1), free(ys), free(full), free(want);
}

static void test_refusals(void) {
    attn_mha_kv kv;
    void *mem = new_kv(&kv, 2, 4, 2, 2);
    attn_error err;
    float x[2 * 2 * E], y[2 * 2 * E];
    tu_rng r = tu_seed(5);
    tu_fill(&r, x, sizeof x / sizeof(float), -1, 1);
    CHECK(attn_mha_step(&g_cfg, &g_w, &kv, 2, 2, x, NULL, y, &err) == ATTN_OK, "%s", err.message);
    CHECK(attn_mha_step(&g_cfg, &g_w, &kv, 2, 2, x, NULL, y, &err) == ATTN_OK, "%s", err.message);
    /* full: ATTN_ERR_STATE, lengths and out untouched */
    for (size_t i = 0; i < sizeof y / sizeof(float); i++) y[i] = 7.0f;
    CHECK_ERR(attn_mha_step(&g_cfg, &g_w, &kv, 2, 1, x, NULL, y, &err), ATTN_ERR_STATE, &err);
    CHECK(strstr(err.message, "full") != NULL, "message '%s'", err.message);
    CHECK(kv.len[0] == 4 && kv.len[1] == 4 && y[0] == 7.0f, "a refused step changed state");
    kv.len[1] = 0; /* row 1 restarts; row 0 still full */
    CHECK_ERR(attn_mha_step(&g_cfg, &g_w, &kv, 2, 1, x, NULL, y, &err), ATTN_ERR_STATE, &err);
    CHECK(attn_mha_step(&g_cfg, &g_w, &kv, 1, 1, x, NULL, y, &err) == ATTN_ERR_STATE, "row 0 full");
    kv.len[0] = 5;
    CHECK_ERR(attn_mha_step(&g_cfg, &g_w, &kv, 1, 1, x, NULL, y, &err), ATTN_ERR_STATE, &err);
    kv.len[0] = 0;
    /* shapes */
    CHECK_ERR(attn_mha_step(&g_cfg, &g_w, &kv, 3, 1, x, NULL, y, &err), ATTN_ERR_SHAPE, &err);
    CHECK_ERR(attn_mha_step(&g_cfg, &g_w, &kv, 0, 1, x, NULL, y, &err), ATTN_ERR_SHAPE, &err);
    CHECK_ERR(attn_mha_step(&g_cfg, &g_w, &kv, 1, 3, x, NULL, y, &err), ATTN_ERR_SHAPE, &err);
    CHECK_ERR(attn_mha_step(&g_cfg, &g_w, &kv, 1, 0, x, NULL, y, &err), ATTN_ERR_SHAPE, &err);
    attn_mha_config other = {2 * E, NH, 0, 0, 1, 0}, cross = {E, NH, E / 2, 0, 1, 0},
                    heads = {E, 2, 0, 0, 1, 0};
    CHECK_ERR(attn_mha_step(&other, &g_w, &kv, 1, 1, x, NULL, y, &err), ATTN_ERR_SHAPE, &err);
    CHECK_ERR(attn_mha_step(&cross, &g_w, &kv, 1, 1, x, NULL, y, &err), ATTN_ERR_SHAPE, &err);
    CHECK_ERR(attn_mha_step(&heads, &g_w, &kv, 1, 1, x, NULL, y, &err), ATTN_ERR_SHAPE, &err);
    /* what the step does not take */
    int64_t lens[2] = {1, 1};
    uint8_t bm[4] = {1, 1, 1, 1};
    attn_mask m = {bm, {1, 1, 1, 4}, {0, 0, 4, 1}};
    attn_sdpa_params p = {0};
    p.key_lengths = lens;
    CHECK_ERR(attn_mha_step(&g_cfg, &g_w, &kv, 1, 1, x, &p, y, &err), ATTN_ERR_ARG, &err);
    p = (attn_sdpa_params){0};
    p.bool_mask = &m;
    CHECK_ERR(attn_mha_step(&g_cfg, &g_w, &kv, 1, 1, x, &p, y, &err), ATTN_ERR_ARG, &err);
    p = (attn_sdpa_params){0};
    p.use_window = 1;
    CHECK_ERR(attn_mha_step(&g_cfg, &g_w, &kv, 1, 1, x, &p, y, &err), ATTN_ERR_ARG, &err);
    p = (attn_sdpa_params){0};
    p.training = 1, p.dropout_p = 0.1f;
    CHECK_ERR(attn_mha_step(&g_cfg, &g_w, &kv, 1, 1, x, &p, y, &err), ATTN_ERR_ARG, &err);
    p = (attn_sdpa_params){0};
    p.impl = ATTN_IMPL_REFERENCE;
    CHECK_ERR(attn_mha_step(&g_cfg, &g_w, &kv, 1, 1, x, &p, y, &err), ATTN_ERR_ARG, &err);
    p = (attn_sdpa_params){0};
    p.num_threads = 3; /* sized for 2 */
    CHECK_ERR(attn_mha_step(&g_cfg, &g_w, &kv, 1, 1, x, &p, y, &err), ATTN_ERR_NOMEM, &err);
    p.num_threads = -1;
    CHECK_ERR(attn_mha_step(&g_cfg, &g_w, &kv, 1, 1, x, &p, y, &err), ATTN_ERR_ARG, &err);
    p = (attn_sdpa_params){0};
    p.scale = 0.5f; /* without use_scale */
    CHECK_ERR(attn_mha_step(&g_cfg, &g_w, &kv, 1, 1, x, &p, y, &err), ATTN_ERR_ARG, &err);
    CHECK(kv.len[0] == 0 && kv.len[1] == 0, "refused steps changed the lengths");
    /* NULLs */
    CHECK_ERR(attn_mha_step(&g_cfg, &g_w, NULL, 1, 1, x, NULL, y, &err), ATTN_ERR_NULL, &err);
    CHECK_ERR(attn_mha_step(&g_cfg, &g_w, &kv, 1, 1, NULL, NULL, y, &err), ATTN_ERR_NULL, &err);
    CHECK_ERR(attn_mha_step(&g_cfg, &g_w, &kv, 1, 1, x, NULL, NULL, &err), ATTN_ERR_NULL, &err);
    CHECK_ERR(attn_mha_step(NULL, &g_w, &kv, 1, 1, x, NULL, y, &err), ATTN_ERR_NULL, &err);
    attn_mha_kv blank;
    memset(&blank, 0, sizeof blank);
    CHECK_ERR(attn_mha_step(&g_cfg, &g_w, &blank, 1, 1, x, NULL, y, &err), ATTN_ERR_NULL, &err);
    free(mem);

    /* sizing and init */
    attn_mha_kv_shape s = {2, 4, 2, 1};
    size_t bytes = 0;
    CHECK(attn_mha_kv_bytes(&g_cfg, &s, &bytes, &err) == ATTN_OK &&
              bytes > 2 * 2 * 4 * E * sizeof(float),
          "kv_bytes %zu", bytes);
    char *small = tu_malloc(bytes + 1);
    CHECK_ERR(attn_mha_kv_init(&g_cfg, &s, small, bytes - 1, &kv, &err), ATTN_ERR_NOMEM, &err);
    /* any alignment of the caller's block */
    CHECK(attn_mha_kv_init(&g_cfg, &s, small + 1, bytes, &kv, &err) == ATTN_OK &&
              (uintptr_t)kv.k % 64 == 0 && (char *)kv.len >= small + 1,
          "unaligned block: %s", err.message);
    p = (attn_sdpa_params){0};
    p.num_threads = 1;
    CHECK(attn_mha_step(&g_cfg, &g_w, &kv, 2, 2, x, &p, y, &err) == ATTN_OK,
          "unaligned block step: %s", err.message);
    CHECK_ERR(attn_mha_kv_init(&g_cfg, &s, NULL, bytes, &kv, &err), ATTN_ERR_NULL, &err);
    CHECK_ERR(attn_mha_kv_bytes(&g_cfg, &s, NULL, &err), ATTN_ERR_NULL, &err);
    CHECK_ERR(attn_mha_kv_bytes(&g_cfg, NULL, &bytes, &err), ATTN_ERR_NULL, &err);
    CHECK_ERR(attn_mha_kv_bytes(&cross, &s, &bytes, &err), ATTN_ERR_SHAPE, &err);
    const attn_mha_kv_shape bad[] = {{0, 4, 1, 1}, {2, 0, 1, 1}, {2, 4, 0, 1}, {2, 4, 5, 1}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        CHECK_ERR(attn_mha_kv_bytes(&g_cfg, &bad[i], &bytes, &err), ATTN_ERR_SHAPE, &err);
    attn_mha_kv_shape th = {2, 4, 1, ATTN_MAX_THREADS + 1};
    CHECK_ERR(attn_mha_kv_bytes(&g_cfg, &th, &bytes, &err), ATTN_ERR_ARG, &err);
    attn_mha_kv_shape huge = {INT64_MAX / 4, INT64_MAX / 4, 1, 1};
    CHECK_ERR(attn_mha_kv_bytes(&g_cfg, &huge, &bytes, &err), ATTN_ERR_OVERFLOW, &err);
    free(small);
}

int main(void) {
    tu_rng r = tu_seed(12);
    tu_fill(&r, params, sizeof params / sizeof(float), -0.4f, 0.4f);
    tu_fill(&r, xs, sizeof xs / sizeof(float), -1, 1);
    attn_mha_weights_from_buffer(&g_cfg, params, &g_w, NULL);
    test_against_forward();
    test_refusals();
    printf("test_mha_step: worst error vs fp64: step %.3g, full forward %.3g (bound 1e-5)\n",
           g_worst_step, g_worst_fwd);
    return tu_report("test_mha_step");
}
