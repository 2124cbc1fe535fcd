/* molgen bench (see bench.h). */
#define _POSIX_C_SOURCE 200809L
#include "harness/bench.h"
#include "train/checkpoint.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fma_peak.h"
#include "chem/data.h"
#include "nn/model.h"
#include "nn/optim.h"
#include "gen/sample.h"
#include "chem/tokenizer.h"
#include "base/util.h"

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double mg_median(double *x, int n) {
    if (n <= 0) return 0.0;
    qsort(x, (size_t)n, sizeof *x, cmp_double);
    return n % 2 ? x[n / 2] : 0.5 * (x[n / 2 - 1] + x[n / 2]);
}

/* The MOSES vocabulary (moses_176k.smi's 24 tokens). */
const char *const MG_MOSES_TOKENS[] = {"#", "(", ")",   "-",    "1", "2",  "3", "4",
                                       "5", "6", "=",   "Br",   "C", "Cl", "F", "N",
                                       "O", "S", "[H]", "[nH]", "c", "n",  "o", "s"};

static void finish(mg_bench_result *r) {
    double tmp[64];
    memcpy(tmp, r->rate, sizeof tmp);
    r->median = mg_median(tmp, r->runs);
    r->lo = tmp[0];
    r->hi = tmp[r->runs - 1];
}

double mg_train_step_flops(const mg_model_config *c, const int64_t *lengths, int B) {
    const double d = c->d_model, matmul = 12.0 * c->n_layer * d * d + (double)c->vocab_size * d;
    double pos = 0, pairs = 0;
    for (int b = 0; b < B; b++) {
        const double L = (double)(lengths[b] - 1);
        pos += L;
        pairs += c->no_causal_mask ? L * L : L * (L + 1) / 2;
    }
    return 6.0 * matmul * pos + 12.0 * c->n_layer * d * pairs;
}

double mg_bench_peak(int threads, const char **isa) { return fma_peak_gflops(threads, NULL, isa); }

/* Training steps on random full rows, or (data != NULL) on its batches of
 * real molecules in file order, each cut to its longest row as molgen train
 * does, counting the real targets. */
mg_status mg_bench_train(mg_model *m, int B, int steps, int warmup, int runs, mg_batcher *data,
                         mg_bench_result *r, mg_error *err) {
    const mg_model_config *c = mg_model_get_config(m);
    const int T = c->ctx_len + 1, V = c->vocab_size;
    mg_status rc = MG_ERR_ARG; /* every failure path sets it */
    int32_t *ids = malloc((size_t)B * T * sizeof *ids);
    int32_t *full = data ? malloc((size_t)B * T * sizeof *full) : NULL;
    int64_t *len = malloc((size_t)B * sizeof *len);
    mg_adamw opt;
    memset(&opt, 0, sizeof opt);
    if (!ids || !len || (data && !full)) {
        rc = mg_fail(err, MG_ERR_NOMEM, "out of memory");
        goto done;
    }
    mg_adamw_config oc;
    mg_adamw_config_default(&oc);
    oc.warmup_steps = 10;
    oc.total_steps = 1000000;
    if ((rc = mg_ckpt_optimizer(m, &oc, &opt, err))) goto done;
    opt.threads = mg_model_threads(m);
    uint64_t s = 2024;
    for (int b = 0; b < B; b++) {
        ids[(size_t)b * T] = MG_BOS;
        for (int t = 1; t < T - 1; t++)
            ids[(size_t)b * T + t] =
                (int32_t)(MG_NUM_SPECIAL + mg_splitmix64(&s) % (uint64_t)(V - MG_NUM_SPECIAL));
        ids[(size_t)b * T + T - 1] = MG_EOS;
        len[b] = T;
    }
    int64_t step = 0;
    float loss = 0;
    double flop_rate[64];
    for (int run = -warmup; run < runs; run++) {
        int64_t tokens = 0;
        double flops = 0;
        const double t0 = mg_now_s();
        for (int k = 0; k < steps; k++, step++) {
            int64_t ntok = 0;
            int Tb = T;
            if (data) {
                mg_batcher_next(data, full, len, NULL);
                Tb = mg_trim_batch(full, len, B, T, ids);
            }
            rc = mg_model_forward(m, &(mg_batch){.ids = ids, .lengths = len, .B = B, .T = Tb}, 1,
                                  (uint64_t)step, &loss, &ntok, err);
            if (!rc) rc = mg_model_backward(m, NULL, 0, err);
            if (!rc) rc = mg_adamw_step(&opt, mg_model_params(m), mg_model_grads(m), NULL, NULL, err);
            if (rc) goto done; /* the failing call's status, not 1 */
            tokens += ntok;
            flops += mg_train_step_flops(c, len, B);
        }
        const double dt = mg_now_s() - t0;
        if (run >= 0) {
            r->rate[run] = (double)tokens / (dt > 0 ? dt : 1e-9);
            flop_rate[run] = flops / (dt > 0 ? dt : 1e-9);
        }
    }
    r->runs = runs;
    r->extra = loss;
    finish(r);
    r->flop_rate = mg_median(flop_rate, runs);
    rc = 0;
done:
    mg_adamw_free(&opt);
    free(ids);
    free(full);
    free(len);
    return rc;
}

mg_status mg_bench_sample(mg_model *m, const mg_vocab *v, mg_decode_kind kind, int n, int batch,
                          int warmup, int runs, mg_bench_result *r, mg_error *err) {
    mg_status rc_;
    mg_sample_opts o;
    mg_sample_opts_default(&o);
    o.n = (size_t)n;
    o.batch = batch;
    o.kind = kind;
    o.seed = 1;
    o.dtype = mg_model_dtype(m);
    double tok_rate[64];
    for (int run = -warmup; run < runs; run++) {
        mg_samples s;
        if ((rc_ = mg_sample(m, v, &o, &s, err))) return rc_;
        const double dt = s.seconds > 0 ? s.seconds : 1e-9;
        if (run >= 0) {
            r->rate[run] = (double)s.n / dt;
            tok_rate[run] = (double)s.tokens / dt;
            r->extra = (double)s.tokens / (double)s.n;
        }
        mg_samples_free(&s);
    }
    r->runs = runs;
    finish(r);
    r->tok_rate = mg_median(tok_rate, runs);
    return 0;
}
