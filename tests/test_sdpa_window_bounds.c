/* Sliding-window bounds at the edge of int64: a finite bound larger than any
 * distance (e.g. INT64_MAX) limits nothing, so the result must be bitwise the
 * same as with ATTN_UNBOUNDED on that side. The bounds are added to the
 * query's absolute position i' = i + Lk - Lq, which is negative for the
 * first rows when Lq > Lk: i' - left and i' + right + 1 must not overflow.
 * Kept apart from test_sdpa_reference because an overflow here can write
 * out of bounds and crash the whole executable. */
#include "testutil.h"

enum { B = 2, H = 2, D = 8 };

static void one(int64_t Lq, int64_t Lk, int64_t left, int64_t right, int64_t uleft,
                int64_t uright) {
    const size_t nq = (size_t)(B * H * Lq * D), nk = (size_t)(B * H * Lk * D),
                 nw = (size_t)(B * H * Lq * Lk), nl = (size_t)(B * H * Lq);
    float *q = tu_malloc(nq * sizeof(float)), *k = tu_malloc(nk * sizeof(float)),
          *v = tu_malloc(nk * sizeof(float));
    tu_rng r = tu_seed((uint64_t)(Lq * 100 + Lk));
    tu_fill(&r, q, nq, -1, 1);
    tu_fill(&r, k, nk, -1, 1);
    tu_fill(&r, v, nk, -1, 1);
    float *o[2], *w[2], *l[2];
    for (int t = 0; t < 2; t++) {
        o[t] = tu_malloc(nq * sizeof(float));
        w[t] = tu_malloc(nw * sizeof(float));
        l[t] = tu_malloc(nl * sizeof(float));
        attn_tensor tq = attn_tensor_bhld(q, B, H, Lq, D), tk = attn_tensor_bhld(k, B, H, Lk, D),
                    tv = attn_tensor_bhld(v, B, H, Lk, D), to = attn_tensor_bhld(o[t], B, H, Lq, D);
        attn_sdpa_params p = {0};
        p.use_window = 1;
        p.window_left = t ? uleft : left;
        p.window_right = t ? uright : right;
        attn_error err;
        attn_status s = attn_sdpa_forward(&tq, &tk, &tv, &p, &to, w[t], l[t], NULL, &err);
        CHECK(s == ATTN_OK, "window (%lld, %lld): %s", (long long)p.window_left,
              (long long)p.window_right, err.message);
    }
    const int same = memcmp(o[0], o[1], nq * sizeof(float)) == 0 &&
                     memcmp(w[0], w[1], nw * sizeof(float)) == 0 &&
                     memcmp(l[0], l[1], nl * sizeof(float)) == 0;
    CHECK(same, "Lq=%lld Lk=%lld: window (%lld, %lld) differs from (%lld, %lld)", (long long)Lq,
          (long long)Lk, (long long)left, (long long)right, (long long)uleft, (long long)uright);
    for (int t = 0; t < 2; t++) free(o[t]), free(w[t]), free(l[t]);
    free(q), free(k), free(v);
}

int main(void) {
    const int64_t U = ATTN_UNBOUNDED, M = INT64_MAX;
    const int64_t lens[][2] = {{6, 6}, {3, 9}, {9, 3}};
    for (int i = 0; i < 3; i++) {
        const int64_t Lq = lens[i][0], Lk = lens[i][1];
        one(Lq, Lk, U, M, U, U);
        one(Lq, Lk, M, U, U, U);
        one(Lq, Lk, M, M, U, U);
        one(Lq, Lk, M - 1, M - 1, U, U);
        one(Lq, Lk, M, 0, U, 0);
        one(Lq, Lk, 2, M, 2, U);
    }
    return tu_report("test_sdpa_window_bounds");
}
