/* packed_gemm.h's products against independent oracles:
 *  - mg_gemm_bf16, all 4 transposes, shapes with row, column and k tails
 *    and K past MG_GEMM_KC, leading dimensions above the rows, beta 0 over
 *    NaN and beta 1 / -0.5: against a double reference of the same
 *    bf16-rounded inputs (the test's own rounding), within the fp32
 *    summation bound gamma_{K+2} (sum |a b| + |beta c|): the products of
 *    bf16 values are exact in fp32, so only the fp32 adds round;
 *  - mg_packed fp32: bitwise the test's own sequential fmaf chain from 0
 *    plus the bias (the documented order), and bf16 against double;
 *  - the products on AMX tiles (where the CPU has them) and on the
 *    AVX512_BF16 kernels alone, each within the bound;
 *  - the AVX-512 and portable kernels (forced) agree within the bound, and
 *    1, 2 and 3 threads give the same bits, so do 6 concurrent callers;
 *  - a KV decoder over packed fp32 weights gives the training forward's
 *    logits (mg_model_logits) within fp32 rounding, and bf16 within a
 *    bf16 bound;
 *  - bad arguments refused. */
#include <math.h>
#include <string.h>

#include "gen/kv_decode.h"
#include "nn/packed_gemm.h"
#include "mg_test.h"
#include "nn/model.h"

static float urand(uint64_t *s) { /* [-1, 1) */
    return (float)((double)(mg_splitmix64(s) >> 11) * 0x1.0p-52 - 1.0);
}

static float round_bf16(float f) { /* nearest, ties to even (finite inputs) */
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* op(A) (m, k) and op(B) (k, n) of stored row-major arrays */
static float at(const float *A, int t, int64_t ld, int64_t r, int64_t c) {
    return t ? A[c * ld + r] : A[r * ld + c];
}

static int check_gemm(int ta, int tb, int64_t M, int64_t N, int64_t K, float beta, int nt,
                      uint64_t seed) {
    const int64_t lda = (ta ? M : K) + 3, ldb = (tb ? K : N) + 5, ldc = N + 2;
    const int64_t arows = ta ? K : M, brows = tb ? N : K;
    float *A = malloc((size_t)(arows * lda) * sizeof(float));
    float *B = malloc((size_t)(brows * ldb) * sizeof(float));
    float *C = malloc((size_t)(M * ldc) * sizeof(float)), *C0 = malloc((size_t)(M * ldc) * sizeof(float));
    uint64_t s = seed;
    for (int64_t i = 0; i < arows * lda; i++) A[i] = urand(&s);
    for (int64_t i = 0; i < brows * ldb; i++) B[i] = urand(&s);
    for (int64_t i = 0; i < M * ldc; i++) C[i] = C0[i] = beta == 0.0f ? NAN : urand(&s);
    mg_error e;
    int ok = mg_gemm_bf16(ta, tb, M, N, K, A, lda, B, ldb, beta, C, ldc, nt, &e) == MG_OK;
    const double u = 0x1.0p-24, g = (double)(K + 2) * u / (1.0 - (double)(K + 2) * u);
    double worst = 0.0;
    for (int64_t i = 0; ok && i < M; i++) {
        for (int64_t j = 0; j < N; j++) {
            double ref = 0.0, mag = 0.0;
            for (int64_t k = 0; k < K; k++) {
                const double p = (double)round_bf16(at(A, ta, lda, i, k)) *
                                 (double)round_bf16(at(B, tb, ldb, k, j));
                ref += p;
                mag += fabs(p);
            }
            if (beta != 0.0f) {
                ref += (double)beta * C0[i * ldc + j];
                mag += fabs((double)beta * C0[i * ldc + j]);
            }
            const double err = fabs((double)C[i * ldc + j] - ref), bound = g * mag + 1e-30;
            if (!(err <= bound)) ok = 0;
            if (err / bound > worst) worst = err / bound;
        }
        for (int64_t j = N; j < ldc; j++) /* padding columns never written */
            if (memcmp(&C[i * ldc + j], &C0[i * ldc + j], sizeof(float))) ok = 0;
    }
    CHECK(ok, "gemm_bf16 ta %d tb %d %lldx%lldx%lld beta %g nt %d: error/bound %.3g", ta, tb,
          (long long)M, (long long)N, (long long)K, (double)beta, nt, worst);
    free(A);
    free(B);
    free(C);
    free(C0);
    return ok;
}

/* The same product on 1, 2, 3 threads and (forced) portable kernels. */
static void check_threads_and_portable(void) {
    const int64_t M = 77, N = 70, K = 901;
    float *A = malloc((size_t)(M * K) * sizeof(float)), *B = malloc((size_t)(K * N) * sizeof(float));
    float *C[4];
    uint64_t s = 5;
    for (int64_t i = 0; i < M * K; i++) A[i] = urand(&s);
    for (int64_t i = 0; i < K * N; i++) B[i] = urand(&s);
    for (int t = 0; t < 4; t++) {
        C[t] = calloc((size_t)(M * N), sizeof(float));
        mg_gemm_force_portable(t == 3);
        CHECK(mg_gemm_bf16(1, 0, M, N, K, A, M, B, N, 0.0f, C[t], N, t == 3 ? 2 : t + 1, NULL) ==
              MG_OK);
    }
    mg_gemm_force_portable(0);
    CHECK(!memcmp(C[0], C[1], (size_t)(M * N) * sizeof(float)) &&
              !memcmp(C[0], C[2], (size_t)(M * N) * sizeof(float)),
          "gemm_bf16: 1, 2, 3 threads differ");
    double worst = 0.0;
    for (int64_t i = 0; i < M * N; i++) {
        const double d = fabs((double)C[0][i] - C[3][i]);
        if (d > worst) worst = d;
    }
    /* both within gamma_{K+2} * sum |a b| <= (K + 2) u K of the exact sum */
    CHECK(worst <= 2.0 * (K + 2) * 0x1.0p-24 * K, "portable vs AVX-512 differ by %g", worst);
    /* 6 callers at once (more than the 4 kept packing buffers: the others
     * allocate their own), each on 1 thread: the bits of the 1-thread call */
    float *Cc[6];
    for (int c = 0; c < 6; c++) Cc[c] = calloc((size_t)(M * N), sizeof(float));
    int fails = 0;
#pragma omp parallel for num_threads(6) reduction(+ : fails)
    for (int c = 0; c < 6; c++)
        fails += mg_gemm_bf16(1, 0, M, N, K, A, M, B, N, 0.0f, Cc[c], N, 1, NULL) != MG_OK;
    CHECK(!fails, "gemm_bf16: a concurrent call failed");
    for (int c = 0; c < 6; c++) {
        CHECK(!memcmp(C[0], Cc[c], (size_t)(M * N) * sizeof(float)),
              "gemm_bf16: concurrent caller %d differs", c);
        free(Cc[c]);
    }
    for (int t = 0; t < 4; t++) free(C[t]);
    free(A);
    free(B);
}

static void check_packed(int N, int K, int64_t M) {
    float *W = malloc((size_t)N * K * sizeof(float)), *X = malloc((size_t)(M * K) * sizeof(float));
    float *bias = malloc((size_t)N * sizeof(float)), *out = malloc((size_t)(M * N) * sizeof(float));
    float *out2 = malloc((size_t)(M * N) * sizeof(float));
    uint64_t s = (uint64_t)N * 131 + (uint64_t)K;
    for (int64_t i = 0; i < (int64_t)N * K; i++) W[i] = urand(&s);
    for (int64_t i = 0; i < M * K; i++) X[i] = urand(&s);
    for (int i = 0; i < N; i++) bias[i] = urand(&s);
    for (int port = 0; port < 2; port++) {
        mg_gemm_force_portable(port);
        mg_packed *p = NULL;
        mg_error e;
        CHECK(mg_packed_new(W, N, K, MG_DT_F32, &p, &e) == MG_OK, "%s", e.message);
        int same = 1;
        for (int nt = 1; nt <= 3; nt++) {
            CHECK(mg_packed_forward(out, X, M, p, bias, nt, &e) == MG_OK, "%s", e.message);
            for (int64_t i = 0; i < M; i++)
                for (int j = 0; j < N; j++) {
                    float acc = 0.0f;
                    for (int k = 0; k < K; k++) acc = fmaf(X[i * K + k], W[(int64_t)j * K + k], acc);
                    acc = acc + bias[j];
                    if (memcmp(&acc, &out[i * N + j], sizeof acc)) same = 0;
                }
        }
        CHECK(same, "packed fp32 %dx%d, %lld rows (portable %d): not the sequential fma sum", N, K,
              (long long)M, port);
        mg_packed_free(p);
        CHECK(mg_packed_new(W, N, K, MG_DT_BF16, &p, &e) == MG_OK, "%s", e.message);
        CHECK(mg_packed_forward(out, X, M, p, bias, 1, &e) == MG_OK, "%s", e.message);
        CHECK(mg_packed_forward(out2, X, M, p, bias, 3, &e) == MG_OK, "%s", e.message);
        CHECK(!memcmp(out, out2, (size_t)(M * N) * sizeof(float)), "packed bf16: threads differ");
        int ok = 1;
        const double g = (double)(K + 2) * 0x1.0p-24;
        for (int64_t i = 0; i < M; i++)
            for (int j = 0; j < N; j++) {
                double ref = bias[j], mag = fabs(bias[j]);
                for (int k = 0; k < K; k++) {
                    const double q = (double)round_bf16(X[i * K + k]) *
                                     (double)round_bf16(W[(int64_t)j * K + k]);
                    ref += q;
                    mag += fabs(q);
                }
                if (!(fabs(out[i * N + j] - ref) <= g * mag)) ok = 0;
            }
        CHECK(ok, "packed bf16 %dx%d, %lld rows (portable %d) vs double", N, K, (long long)M, port);
        mg_packed_free(p);
    }
    mg_gemm_force_portable(0);
    free(W);
    free(X);
    free(bias);
    free(out);
    free(out2);
}

/* A 2-block, 4-head model of width d over 30 tokens, initialised from
 * seed, with nt threads; tok [n] random tokens from tseed. NULL on failure. */
static mg_model *small_model(int d, int ctx, uint64_t seed, int nt, int32_t *tok, int n,
                             uint64_t tseed) {
    mg_model_config c;
    mg_model_config_default(&c);
    c.n_layer = 2;
    c.d_model = d;
    c.n_head = 4;
    c.ctx_len = ctx;
    c.vocab_size = 30;
    c.dropout = 0.0f;
    mg_model *m = NULL;
    mg_error e;
    CHECK(mg_model_create(&c, &m, &e) == MG_OK, "%s", e.message);
    if (!m) return NULL;
    mg_model_init(m, seed);
    mg_model_set_threads(m, nt);
    for (int i = 0; i < n; i++) tok[i] = (int32_t)(mg_splitmix64(&tseed) % 30);
    return m;
}

/* KV decoding over the packed weights vs the training forward of the
 * whole prefix (attn_matmul products, full attention). */
static void check_decoder(mg_dtype dt) {
    enum { R = 5, L = 12 };
    int32_t tok[R * L];
    mg_error e;
    mg_model *m = small_model(64, 16, 3, 2, tok, R * L, 9);
    if (!m) return;
    float *full = malloc((size_t)R * L * 30 * sizeof(float)), *step = malloc(R * 30 * sizeof(float));
    int64_t lens[R];
    for (int r = 0; r < R; r++) lens[r] = L;
    CHECK(mg_model_logits(m, &(mg_batch){.ids = tok, .lengths = lens, .B = R, .T = L}, full, NULL,
                          &e) == MG_OK,
          "%s", e.message);
    mg_kv_decoder *d = NULL;
    CHECK(mg_kv_new_dtype(m, R, 2, dt, &d, &e) == MG_OK && mg_kv_reset(d, R, &e) == MG_OK, "%s",
          e.message);
    double worst = 0.0;
    for (int t = 0; d && t < L; t++) {
        int32_t col[R];
        for (int r = 0; r < R; r++) col[r] = tok[r * L + t];
        CHECK(mg_kv_step(d, col, step, &e) == MG_OK, "%s", e.message);
        for (int r = 0; r < R; r++)
            for (int v = 0; v < 30; v++) {
                const double x = fabs(step[r * 30 + v] - full[((int64_t)r * L + t) * 30 + v]);
                if (x > worst) worst = x;
            }
    }
    /* logits are O(1); fp32: a few ulps through 2 blocks; bf16: operands
     * rounded to 8 bits (relative 2^-9 each) through 2 blocks and the head */
    const double tol = dt == MG_DT_BF16 ? 0.1 : 1e-4;
    CHECK(worst <= tol, "decoder %s vs training forward: max |diff| %g > %g", mg_dtype_name(dt),
          worst, tol);
    if (dt == MG_DT_BF16) CHECK(worst > 0.0, "bf16 decoding equals fp32 exactly: not bf16?");
    mg_kv_free(d);
    free(full);
    free(step);
    mg_model_free(m);
}

/* The model's forward with its weights packed for inference
 * (mg_model_pack_inference) vs the same forward through mg_matmul_forward:
 * the same arithmetic up to the order of the fp32 adds (each product is
 * exact in fp32 for bf16 operands), so the logits agree to a few fp32 ulps
 * of their magnitude in both dtypes; backward refused while packed. */
static void check_inference_pack(mg_dtype dt) {
    enum { R = 1, L = 37 };
    int32_t tok[R * L];
    mg_error e;
    mg_model *m = small_model(128, 40, 5, 1, tok, R * L, 11);
    if (!m) return;
    mg_model_set_dtype(m, dt);
    int64_t lens[R] = {L};
    float *a = malloc((size_t)R * L * 30 * sizeof(float)), *b = malloc((size_t)R * L * 30 * sizeof(float));
    CHECK(mg_model_logits(m, &(mg_batch){.ids = tok, .lengths = lens, .B = R, .T = L}, a, NULL,
                          &e) == MG_OK,
          "%s", e.message);
    CHECK(mg_model_pack_inference(m, &e) == MG_OK, "%s", e.message);
    CHECK(mg_model_logits(m, &(mg_batch){.ids = tok, .lengths = lens, .B = R, .T = L}, b, NULL,
                          &e) == MG_OK,
          "%s", e.message);
    double worst = 0.0, mag = 0.0;
    for (int i = 0; i < R * L * 30; i++) {
        worst = fmax(worst, fabs((double)a[i] - b[i]));
        mag = fmax(mag, fabs((double)a[i]));
    }
    CHECK(worst <= 64 * 0x1.0p-24 * mag, "%s forward packed vs per call: max |diff| %g (max |logit| %g)",
          mg_dtype_name(dt), worst, mag);
    float loss;
    int64_t ntok;
    CHECK(mg_model_forward(m, &(mg_batch){.ids = tok, .lengths = lens, .B = R, .T = L}, 1, 0, &loss,
                           &ntok, &e) == MG_OK,
          "%s", e.message);
    CHECK(mg_model_backward(m, NULL, 0, &e) == MG_ERR_STATE, "backward of a packed model not refused");
    mg_model_unpack_inference(m);
    CHECK(mg_model_forward(m, &(mg_batch){.ids = tok, .lengths = lens, .B = R, .T = L}, 1, 0, &loss,
                           &ntok, &e) == MG_OK &&
              mg_model_backward(m, NULL, 0, &e) == MG_OK,
          "%s", e.message);
    free(a);
    free(b);
    mg_model_free(m);
}

int main(void) {
    check_inference_pack(MG_DT_F32);
    check_inference_pack(MG_DT_BF16);
    static const int64_t shapes[][3] = {{1, 1, 1},   {7, 33, 5},   {9, 31, 2},   {64, 40, 129},
                                        {17, 65, 400}, {130, 96, 385}, {3, 190, 800},
                                        {300, 70, 67}};
    /* AMX tiles where the CPU has them (the process's permission first),
     * then the AVX512_BF16 kernels alone */
    mg_gemm_allow_amx(1);
    const int amx = mg_gemm_isa_amx(); /* 0 without AMX, or MOLGEN_GEMM_ISA=avx512bf16 */
    for (int pass = amx ? 0 : 1; pass < 2; pass++) {
        mg_gemm_allow_amx(pass == 0);
        CHECK(mg_gemm_isa_amx() == (pass == 0));
        for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++)
            for (int t = 0; t < 4; t++)
                check_gemm(t & 1, t >> 1, shapes[i][0], shapes[i][1], shapes[i][2],
                           i % 3 == 0 ? 0.0f : i % 3 == 1 ? 1.0f : -0.5f, 1 + (int)(i % 3),
                           100 + i);
    }
    mg_gemm_allow_amx(amx); /* the rest with the tiles where there are */
    mg_gemm_force_portable(1);
    check_gemm(1, 1, 45, 70, 777, 1.0f, 2, 7);
    check_gemm(0, 0, 20, 33, 3, 0.0f, 1, 8);
    mg_gemm_force_portable(0);
    check_threads_and_portable();
    check_packed(384, 128, 64);
    check_packed(27, 128, 13);
    check_packed(128, 512, 9);
    check_packed(70, 100, 37); /* bf16: 50 pairs (3 tile chunks and 2 more), 2 tile row pairs */
    check_decoder(MG_DT_F32);
    check_decoder(MG_DT_BF16);
    /* bad arguments */
    float x = 0.0f;
    mg_error e;
    mg_packed *p = NULL;
    CHECK(mg_gemm_bf16(0, 0, 0, 1, 1, &x, 1, &x, 1, 0.0f, &x, 1, 1, &e) == MG_ERR_ARG);
    CHECK(mg_gemm_bf16(0, 0, 2, 2, 2, &x, 1, &x, 2, 0.0f, &x, 2, 1, &e) == MG_ERR_ARG);
    CHECK(mg_gemm_bf16(0, 0, 1, 1, 1, NULL, 1, &x, 1, 0.0f, &x, 1, 1, &e) == MG_ERR_ARG);
    CHECK(mg_packed_new(&x, 0, 1, MG_DT_F32, &p, &e) == MG_ERR_ARG && !p);
    CHECK(mg_packed_new(&x, 1, 1, MG_DT_F32, &p, &e) == MG_OK && p);
    CHECK(mg_packed_forward(&x, &x, 0, p, NULL, 1, &e) == MG_ERR_ARG);
    mg_packed_free(p);
    mg_dtype dt;
    CHECK(mg_dtype_parse("bf16", &dt) == 0 && dt == MG_DT_BF16 && mg_dtype_parse("fp16", &dt) < 0);
    printf("test_gemm: %d passed, %d failed (AVX-512 f32 %d, bf16 %d, AMX %d)\n", tu_pass, tu_fail,
           mg_gemm_isa_f32(), mg_gemm_isa_bf16(), mg_gemm_isa_amx());
    return tu_fail ? 1 : 0;
}
