/* Every validation error of the forward API: the returned status, err.status
 * equal to it, a non-empty message, and attn_status_name non-NULL. Sizes that
 * overflow are passed with tiny buffers: the library must reject them before
 * touching data (ASan would catch a read). */
#include "testutil.h"

static attn_error ge; /* reset by fresh() before each call */

static attn_error *fresh(void) {
    memset(&ge, 0, sizeof ge);
    return &ge;
}

#define EXPECT(call, want) CHECK_ERR((call), (want), &ge)

/* ------------------------------------------------------------ SDPA */

enum { B = 2, H = 3, LQ = 5, LK = 7, DK = 4, DV = 6 };
static float qbuf[B * H * LQ * DK], kbuf[B * H * LK * DK], vbuf[B * H * LK * DV],
    obuf[B * H * LQ * DV], wbuf[B * H * LQ * LK], lbuf[B * H * LQ];
static attn_tensor tq, tk, tv, to;

static void reset_views(void) {
    tq = attn_tensor_bhld(qbuf, B, H, LQ, DK);
    tk = attn_tensor_bhld(kbuf, B, H, LK, DK);
    tv = attn_tensor_bhld(vbuf, B, H, LK, DV);
    to = attn_tensor_bhld(obuf, B, H, LQ, DV);
}

static attn_status fwd(const attn_sdpa_params *p) {
    return attn_sdpa_forward(&tq, &tk, &tv, p, &to, wbuf, lbuf, NULL, fresh());
}

static void test_sdpa_null(void) {
    attn_sdpa_params p = {0};
    reset_views();
    EXPECT(attn_sdpa_forward(NULL, &tk, &tv, &p, &to, NULL, NULL, NULL, fresh()), ATTN_ERR_NULL);
    EXPECT(attn_sdpa_forward(&tq, NULL, &tv, &p, &to, NULL, NULL, NULL, fresh()), ATTN_ERR_NULL);
    EXPECT(attn_sdpa_forward(&tq, &tk, NULL, &p, &to, NULL, NULL, NULL, fresh()), ATTN_ERR_NULL);
    EXPECT(attn_sdpa_forward(&tq, &tk, &tv, &p, NULL, NULL, NULL, NULL, fresh()), ATTN_ERR_NULL);
    attn_tensor *views[4] = {&tq, &tk, &tv, &to};
    for (int i = 0; i < 4; i++) {
        float *keep = views[i]->data;
        views[i]->data = NULL;
        EXPECT(fwd(&p), ATTN_ERR_NULL);
        views[i]->data = keep;
    }
    /* NULL err: same status, no crash. */
    CHECK(attn_sdpa_forward(NULL, &tk, &tv, &p, &to, NULL, NULL, NULL, NULL) == ATTN_ERR_NULL,
          "NULL err changes the status");

    /* NULL params mean defaults (src/sdpa_check.c): same result as {0}. */
    tu_rng r = tu_seed(5);
    tu_fill(&r, qbuf, sizeof qbuf / sizeof(float), -1, 1);
    tu_fill(&r, kbuf, sizeof kbuf / sizeof(float), -1, 1);
    tu_fill(&r, vbuf, sizeof vbuf / sizeof(float), -1, 1);
    static float o2[sizeof obuf / sizeof(float)];
    attn_status s1 = attn_sdpa_forward(&tq, &tk, &tv, NULL, &to, NULL, NULL, NULL, fresh());
    CHECK(s1 == ATTN_OK && ge.status == ATTN_OK, "params NULL: %s", ge.message);
    memcpy(o2, obuf, sizeof obuf);
    attn_status s2 = attn_sdpa_forward(&tq, &tk, &tv, &p, &to, NULL, NULL, NULL, fresh());
    CHECK(s2 == ATTN_OK && memcmp(o2, obuf, sizeof obuf) == 0, "params NULL differs from {0}");

    /* Masks with NULL data. */
    attn_mask m = {NULL, {1, 1, LQ, LK}, {0, 0, LK, 1}};
    p.bool_mask = &m;
    EXPECT(fwd(&p), ATTN_ERR_NULL);
    p.bool_mask = NULL, p.add_mask = &m;
    EXPECT(fwd(&p), ATTN_ERR_NULL);
}

static void test_sdpa_shape(void) {
    attn_sdpa_params p = {0};
    attn_tensor *views[4] = {&tq, &tk, &tv, &to};
    /* Zero and negative sizes in every dim of every tensor. */
    for (int i = 0; i < 4; i++)
        for (int d = 0; d < 4; d++)
            for (int bad = 0; bad < 2; bad++) {
                reset_views();
                views[i]->dim[d] = bad ? -3 : 0;
                EXPECT(fwd(&p), ATTN_ERR_SHAPE);
            }
    /* Mismatches: (tensor, dim, new size), each valid on its own. */
    const struct {
        int t, d;
        int64_t n;
    } mm[] = {
        {1, 0, 1}, {1, 1, 1}, {1, 3, DK + 1},                 /* k vs q: B, H, Dk */
        {2, 0, 1}, {2, 1, 1}, {2, 2, LK - 1},                 /* v vs k: B, H, Lk */
        {3, 0, 1}, {3, 1, 1}, {3, 2, LQ - 1}, {3, 3, DV - 1}, /* out vs [B,H,Lq,Dv] */
    };
    for (size_t i = 0; i < sizeof mm / sizeof mm[0]; i++) {
        reset_views();
        views[mm[i].t]->dim[mm[i].d] = mm[i].n;
        EXPECT(fwd(&p), ATTN_ERR_SHAPE);
    }
    reset_views();
}

/* Huge sizes over 1-float buffers: must fail before any access. */
static void test_sdpa_overflow(void) {
    static float one[1];
    attn_sdpa_params p = {0};
    const int64_t big = INT64_MAX / 2;

    /* Element count B*H*L*D overflows int64. */
    attn_tensor t = {one, {big, 4, 1, 1}, {0, 0, 0, 0}};
    attn_tensor o = t;
    EXPECT(attn_sdpa_forward(&t, &t, &t, &p, &o, NULL, NULL, NULL, fresh()), ATTN_ERR_OVERFLOW);
    /* (dim - 1) * stride overflows. */
    attn_tensor s = {one, {1, 1, 3, 1}, {1, 1, big + 1, 1}};
    attn_tensor so = {one, {1, 1, 3, 1}, {3, 3, 1, 1}};
    EXPECT(attn_sdpa_forward(&s, &s, &s, &p, &so, NULL, NULL, NULL, fresh()), ATTN_ERR_OVERFLOW);
    /* A stride of INT64_MIN has no magnitude: refused without negating it (the
     * UBSan build aborted here on signed overflow). */
    attn_tensor sm = {one, {1, 1, 3, 1}, {1, 1, INT64_MIN, 1}};
    EXPECT(attn_sdpa_forward(&sm, &sm, &sm, &p, &so, NULL, NULL, NULL, fresh()), ATTN_ERR_OVERFLOW);
    attn_tensor sm1 = {one, {1, 1, 1, 1}, {INT64_MIN, 1, 1, 1}};
    attn_tensor so1 = {one, {1, 1, 1, 1}, {1, 1, 1, 1}};
    EXPECT(attn_sdpa_forward(&sm1, &sm1, &sm1, &p, &so1, NULL, NULL, NULL, fresh()),
           ATTN_ERR_OVERFLOW);
    /* Tensors fit (2^32 elements each) but B*H*Lq*Lk = 2^64 does not. */
    const int64_t L = (int64_t)1 << 32;
    attn_tensor l = {one, {1, 1, L, 1}, {0, 0, 1, 1}};
    attn_tensor lo = l;
    EXPECT(attn_sdpa_forward(&l, &l, &l, &p, &lo, one, one, NULL, fresh()), ATTN_ERR_OVERFLOW);
    EXPECT(attn_sdpa_forward(&l, &l, &l, &p, &lo, NULL, NULL, NULL, fresh()), ATTN_ERR_OVERFLOW);
    /* Tensors of 2^60 elements fit, B*H*Lq*Lk = 2^28 * 2^28 * 2^4 * 2^4 does not. */
    attn_tensor bh = {one, {(int64_t)1 << 28, (int64_t)1 << 28, 16, 1}, {0, 0, 0, 0}};
    attn_tensor bho = bh;
    EXPECT(attn_sdpa_forward(&bh, &bh, &bh, &p, &bho, NULL, NULL, NULL, fresh()),
           ATTN_ERR_OVERFLOW);
    /* A mask whose strides overflow. */
    reset_views();
    static uint8_t mb[1];
    attn_mask m = {mb, {1, 1, LQ, LK}, {0, 0, 1, big}};
    p.bool_mask = &m;
    EXPECT(fwd(&p), ATTN_ERR_OVERFLOW);
}

static void test_sdpa_masks(void) {
    static uint8_t bm[B * H * LQ * LK];
    static float am[B * H * LQ * LK];
    reset_views();
    /* dims that do not broadcast to [B, H, Lq, Lk]; dims 2-3 never broadcast. */
    const int64_t bad[][4] = {{3, H, LQ, LK},     {B, 2, LQ, LK}, {B, H, LQ + 1, LK},
                              {B, H, LQ, LK - 1}, {1, 1, 1, LK},  {1, 1, LQ, 1},
                              {0, H, LQ, LK}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        for (int which = 0; which < 2; which++) {
            attn_mask m = {which ? (const void *)am : (const void *)bm,
                           {bad[i][0], bad[i][1], bad[i][2], bad[i][3]},
                           {H * LQ * LK, LQ * LK, LK, 1}};
            attn_sdpa_params p = {0};
            if (which)
                p.add_mask = &m;
            else
                p.bool_mask = &m;
            EXPECT(fwd(&p), ATTN_ERR_MASK);
        }
    /* key_lengths outside [0, Lk]. */
    const int64_t kl[][2] = {{-1, 3}, {3, LK + 1}, {INT64_MIN, 0}, {0, INT64_MAX}};
    for (size_t i = 0; i < sizeof kl / sizeof kl[0]; i++) {
        attn_sdpa_params p = {0};
        p.key_lengths = kl[i];
        EXPECT(fwd(&p), ATTN_ERR_MASK);
    }
    /* The bounds themselves are valid. */
    const int64_t ok[2] = {0, LK};
    attn_sdpa_params p = {0};
    p.key_lengths = ok;
    CHECK(fwd(&p) == ATTN_OK, "key_lengths {0, Lk} rejected: %s", ge.message);
}

static void test_sdpa_args(void) {
    reset_views();
    /* dropout_p outside [0, 1) or NaN (with training on). */
    const float drops[] = {-0.1f, 1.0f, 1.5f, NAN, INFINITY, -INFINITY};
    for (size_t i = 0; i < sizeof drops / sizeof drops[0]; i++) {
        attn_sdpa_params p = {0};
        p.training = 1;
        p.dropout_p = drops[i];
        EXPECT(fwd(&p), ATTN_ERR_ARG);
    }
    /* Non-finite scale. */
    const float scales[] = {NAN, INFINITY, -INFINITY};
    for (size_t i = 0; i < sizeof scales / sizeof scales[0]; i++) {
        attn_sdpa_params p = {0};
        p.use_scale = 1, p.scale = scales[i];
        EXPECT(fwd(&p), ATTN_ERR_ARG);
    }
    /* Window sides below ATTN_UNBOUNDED; ignored when use_window is 0. */
    attn_sdpa_params p = {0};
    p.use_window = 1, p.window_left = -2, p.window_right = 0;
    EXPECT(fwd(&p), ATTN_ERR_ARG);
    p.window_left = 0, p.window_right = INT64_MIN;
    EXPECT(fwd(&p), ATTN_ERR_ARG);
    p.use_window = 0;
    CHECK(fwd(&p) == ATTN_OK, "window bounds checked although use_window == 0: %s", ge.message);
    /* Bad impl value, negative per-call thread count. */
    attn_sdpa_params pi = {0};
    pi.impl = (attn_impl)7;
    EXPECT(fwd(&pi), ATTN_ERR_ARG);
    attn_sdpa_params pt = {0};
    pt.num_threads = -1;
    EXPECT(fwd(&pt), ATTN_ERR_ARG);

    /* The backward needs the forward's lse. */
    static float g[sizeof obuf / sizeof(float)], dq[sizeof qbuf / sizeof(float)],
        dk[sizeof kbuf / sizeof(float)], dv[sizeof vbuf / sizeof(float)];
    attn_tensor tg = attn_tensor_bhld(g, B, H, LQ, DV), tdq = attn_tensor_bhld(dq, B, H, LQ, DK),
                tdk = attn_tensor_bhld(dk, B, H, LK, DK), tdv = attn_tensor_bhld(dv, B, H, LK, DV);
    attn_sdpa_params p0 = {0};
    EXPECT(attn_sdpa_backward(&tq, &tk, &tv, &to, NULL, &tg, &p0, &tdq, &tdk, &tdv, NULL, fresh()),
           ATTN_ERR_NULL);
    tdq.dim[2] = LQ + 1;
    EXPECT(attn_sdpa_backward(&tq, &tk, &tv, &to, lbuf, &tg, &p0, &tdq, &tdk, &tdv, NULL, fresh()),
           ATTN_ERR_SHAPE);
}

/* ------------------------------------------------------------ threads, names */

static void test_threads_and_names(void) {
    EXPECT(attn_set_num_threads(-1, fresh()), ATTN_ERR_ARG);
    EXPECT(attn_set_num_threads(-1000, fresh()), ATTN_ERR_ARG);
    CHECK(attn_set_num_threads(3, fresh()) == ATTN_OK && attn_get_num_threads() == 3,
          "set_num_threads(3): get %d", attn_get_num_threads());
    CHECK(attn_set_num_threads(0, fresh()) == ATTN_OK && attn_get_num_threads() >= 1,
          "set_num_threads(0): get %d", attn_get_num_threads());

    static const char *names[] = {"ATTN_OK",           "ATTN_ERR_NULL", "ATTN_ERR_SHAPE",
                                  "ATTN_ERR_OVERFLOW", "ATTN_ERR_MASK", "ATTN_ERR_ARG",
                                  "ATTN_ERR_NOMEM",    "ATTN_ERR_STATE"};
    for (int s = 0; s < 8; s++) {
        const char *n = attn_status_name((attn_status)s);
        CHECK(n && strcmp(n, names[s]) == 0, "attn_status_name(%d) = %s", s, n ? n : "(null)");
    }
    CHECK(attn_status_name((attn_status)99) != NULL, "attn_status_name(99) is NULL");
    CHECK(attn_status_name((attn_status)-1) != NULL, "attn_status_name(-1) is NULL");
}

/* ------------------------------------------------------------ MHA */

static void test_mha(void) {
    enum { E = 8, NH = 2, MB = 2, MLQ = 3, MLK = 4 };
    attn_mha_config c = {E, NH, 0, 0, 1, 0};
    static float params[4 * E * E + 4 * E], x[MB * MLK * E], y[MB * MLQ * E],
        wts[MB * NH * MLQ * MLK];
    attn_mha_weights w;
    size_t n = 0;
    CHECK(attn_mha_param_count(&c, &n, fresh()) == ATTN_OK && n == sizeof params / sizeof(float),
          "param_count %zu", n);
    CHECK(attn_mha_weights_from_buffer(&c, params, &w, fresh()) == ATTN_OK, "from_buffer: %s",
          ge.message);
    CHECK(attn_mha_init(&c, &w, 1, fresh()) == ATTN_OK, "init: %s", ge.message);
    tu_rng r = tu_seed(9);
    tu_fill(&r, x, sizeof x / sizeof(float), -1, 1);

    /* Config errors, through every function that takes a config. */
    attn_mha_config bad[] = {{0, 1, 0, 0, 0, 0}, {8, 0, 0, 0, 0, 0},  {-8, 2, 0, 0, 0, 0}, {8, -2, 0, 0, 0, 0},
                             {8, 3, 0, 0, 0, 0}, {8, 2, -1, 0, 0, 0}, {8, 2, 0, -5, 0, 0}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        size_t cnt;
        EXPECT(attn_mha_param_count(&bad[i], &cnt, fresh()), ATTN_ERR_SHAPE);
        EXPECT(attn_mha_weights_from_buffer(&bad[i], params, &w, fresh()), ATTN_ERR_SHAPE);
        EXPECT(attn_mha_cache_size(&bad[i], MB, MLQ, MLK, &cnt, fresh()), ATTN_ERR_SHAPE);
    }
    attn_mha_weights_from_buffer(&c, params, &w, NULL);
    /* embed_dim % num_heads: the message must say so. */
    size_t cnt;
    attn_mha_config nd = {10, 4, 0, 0, 0, 0};
    EXPECT(attn_mha_param_count(&nd, &cnt, fresh()), ATTN_ERR_SHAPE);
    CHECK(strstr(ge.message, "divisible") || strstr(ge.message, "num_heads"),
          "E %% H message does not mention it: \"%s\"", ge.message);
    EXPECT(attn_mha_forward(&nd, &w, MB, MLQ, MLK, x, x, x, NULL, y, ATTN_WEIGHTS_NONE, NULL, NULL,
                            fresh()),
           ATTN_ERR_SHAPE);
    /* Oversized embedding. */
    attn_mha_config huge = {(int64_t)1 << 40, 1, 0, 0, 0, 0};
    EXPECT(attn_mha_param_count(&huge, &cnt, fresh()), ATTN_ERR_OVERFLOW);

    /* NULL pointers. */
    EXPECT(attn_mha_param_count(NULL, &cnt, fresh()), ATTN_ERR_NULL);
    EXPECT(attn_mha_param_count(&c, NULL, fresh()), ATTN_ERR_NULL);
    EXPECT(attn_mha_weights_from_buffer(&c, NULL, &w, fresh()), ATTN_ERR_NULL);
    EXPECT(attn_mha_weights_from_buffer(&c, params, NULL, fresh()), ATTN_ERR_NULL);
    EXPECT(attn_mha_init(&c, NULL, 1, fresh()), ATTN_ERR_NULL);
    EXPECT(attn_mha_cache_size(&c, MB, MLQ, MLK, NULL, fresh()), ATTN_ERR_NULL);
#define MHA(cfg, wp, b, lq, lk, q, k, v, p, o, mode, wt)                                           \
    attn_mha_forward((cfg), (wp), (b), (lq), (lk), (q), (k), (v), (p), (o), (mode), (wt), NULL,    \
                     fresh())
    EXPECT(MHA(NULL, &w, MB, MLQ, MLK, x, x, x, NULL, y, ATTN_WEIGHTS_NONE, NULL), ATTN_ERR_NULL);
    EXPECT(MHA(&c, NULL, MB, MLQ, MLK, x, x, x, NULL, y, ATTN_WEIGHTS_NONE, NULL), ATTN_ERR_NULL);
    EXPECT(MHA(&c, &w, MB, MLQ, MLK, NULL, x, x, NULL, y, ATTN_WEIGHTS_NONE, NULL), ATTN_ERR_NULL);
    EXPECT(MHA(&c, &w, MB, MLQ, MLK, x, NULL, x, NULL, y, ATTN_WEIGHTS_NONE, NULL), ATTN_ERR_NULL);
    EXPECT(MHA(&c, &w, MB, MLQ, MLK, x, x, NULL, NULL, y, ATTN_WEIGHTS_NONE, NULL), ATTN_ERR_NULL);
    EXPECT(MHA(&c, &w, MB, MLQ, MLK, x, x, x, NULL, NULL, ATTN_WEIGHTS_NONE, NULL), ATTN_ERR_NULL);
    EXPECT(MHA(&c, &w, MB, MLQ, MLK, x, x, x, NULL, y, ATTN_WEIGHTS_PER_HEAD, NULL), ATTN_ERR_NULL);
    EXPECT(MHA(&c, &w, MB, MLQ, MLK, x, x, x, NULL, y, ATTN_WEIGHTS_AVERAGE, NULL), ATTN_ERR_NULL);
    attn_mha_weights wn = w;
    wn.w_k = NULL;
    EXPECT(MHA(&c, &wn, MB, MLQ, MLK, x, x, x, NULL, y, ATTN_WEIGHTS_NONE, NULL), ATTN_ERR_NULL);
    wn = w, wn.b_o = NULL; /* bias on, one bias missing */
    EXPECT(MHA(&c, &wn, MB, MLQ, MLK, x, x, x, NULL, y, ATTN_WEIGHTS_NONE, NULL), ATTN_ERR_NULL);

    /* Sizes. */
    const int64_t sz[][3] = {{0, MLQ, MLK},  {MB, 0, MLK},  {MB, MLQ, 0},
                             {-1, MLQ, MLK}, {MB, -2, MLK}, {MB, MLQ, -3}};
    for (size_t i = 0; i < sizeof sz / sizeof sz[0]; i++) {
        EXPECT(MHA(&c, &w, sz[i][0], sz[i][1], sz[i][2], x, x, x, NULL, y, ATTN_WEIGHTS_NONE, NULL),
               ATTN_ERR_SHAPE);
        EXPECT(attn_mha_cache_size(&c, sz[i][0], sz[i][1], sz[i][2], &cnt, fresh()),
               ATTN_ERR_SHAPE);
    }
    /* B * L * E beyond what the library handles, over tiny buffers. */
    const int64_t big = INT64_MAX / 2;
    EXPECT(MHA(&c, &w, big, MLQ, MLK, x, x, x, NULL, y, ATTN_WEIGHTS_NONE, NULL),
           ATTN_ERR_OVERFLOW);
    EXPECT(MHA(&c, &w, MB, big, MLK, x, x, x, NULL, y, ATTN_WEIGHTS_NONE, NULL), ATTN_ERR_OVERFLOW);
    EXPECT(MHA(&c, &w, (int64_t)1 << 20, (int64_t)1 << 20, 1, x, x, x, NULL, y, ATTN_WEIGHTS_NONE,
               NULL),
           ATTN_ERR_OVERFLOW);
    EXPECT(attn_mha_cache_size(&c, big, big, big, &cnt, fresh()), ATTN_ERR_OVERFLOW);

    /* Bad mode, and SDPA parameter errors passed through p. */
    EXPECT(MHA(&c, &w, MB, MLQ, MLK, x, x, x, NULL, y, (attn_weights_mode)9, wts), ATTN_ERR_ARG);
    attn_sdpa_params p = {0};
    const int64_t kl[MB] = {1, MLK + 1};
    p.key_lengths = kl;
    EXPECT(MHA(&c, &w, MB, MLQ, MLK, y, x, x, &p, wts, ATTN_WEIGHTS_NONE, NULL), ATTN_ERR_MASK);
    attn_sdpa_params pd = {0};
    pd.training = 1, pd.dropout_p = NAN;
    EXPECT(MHA(&c, &w, MB, MLQ, MLK, y, x, x, &pd, wts, ATTN_WEIGHTS_NONE, NULL), ATTN_ERR_ARG);
    attn_sdpa_params ps = {0};
    ps.use_scale = 1, ps.scale = INFINITY;
    EXPECT(MHA(&c, &w, MB, MLQ, MLK, y, x, x, &ps, wts, ATTN_WEIGHTS_NONE, NULL), ATTN_ERR_ARG);
    static uint8_t bm[MLQ * MLK];
    attn_mask m = {bm, {1, 1, MLK, MLQ}, {0, 0, MLQ, 1}}; /* transposed dims */
    attn_sdpa_params pm = {0};
    pm.bool_mask = &m;
    EXPECT(MHA(&c, &w, MB, MLQ, MLK, y, x, x, &pm, wts, ATTN_WEIGHTS_NONE, NULL), ATTN_ERR_MASK);
#undef MHA

    /* The backward without a cache is a call-order error. */
    static float gp[4 * E * E + 4 * E], go[MB * MLQ * E];
    attn_mha_weights g;
    attn_mha_weights_from_buffer(&c, gp, &g, NULL);
    EXPECT(attn_mha_backward(&c, &w, MB, MLQ, MLK, y, x, x, NULL, NULL, go, NULL, NULL, NULL, &g,
                             fresh()),
           ATTN_ERR_STATE);
}

int main(void) {
    test_sdpa_null();
    test_sdpa_shape();
    test_sdpa_overflow();
    test_sdpa_masks();
    test_sdpa_args();
    test_threads_and_names();
    test_mha();
    return tu_report("test_validation");
}
