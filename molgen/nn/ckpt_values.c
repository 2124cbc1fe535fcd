/* molgen checkpoints' value rules (see ckpt_values.h). */
#include "nn/ckpt_values.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

mg_status mg_ckpt_check_values(const char *name, const void *data, size_t n, mg_error *err) {
    const int moment2 = !strcmp(name, "optim.v");
    const unsigned char *b = data;
    for (size_t k = 0; k < n; k++) {
        float x;
        memcpy(&x, b + k * sizeof x, sizeof x);
        if (isnan(x)) /* the sign of a NaN means nothing: not printed */
            return mg_fail(err, MG_ERR_NUMERIC,
                           "tensor '%s' holds a non-finite value (nan at element %zu)", name, k);
        if (isinf(x))
            return mg_fail(err, MG_ERR_NUMERIC,
                           "tensor '%s' holds a non-finite value (%s at element %zu)", name,
                           x > 0 ? "inf" : "-inf", k);
        if (moment2 && x < 0)
            return mg_fail(err, MG_ERR_NUMERIC,
                           "tensor '%s' holds a negative value (%g at element %zu): a second "
                           "moment must be >= 0",
                           name, (double)x, k);
    }
    return MG_OK;
}

mg_status mg_ckpt_check_state(const mg_st_file *f, size_t P, mg_error *err) {
    static const char *const names[] = {"optim.m", "optim.v", "ema"};
    const int64_t shape[1] = {(int64_t)P};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        const void *data;
        mg_status rc;
        if (!mg_st_find(f, names[i])) continue;
        mg_error e;
        if ((rc = mg_st_get(f, names[i], MG_ST_F32, 1, shape, &data, err))) return rc;
        if ((rc = mg_ckpt_check_values(names[i], data, P, &e)))
            return mg_fail(err, rc, "%s: the %s is corrupt", e.message,
                           i < 2 ? "optimizer state" : "average of the parameters");
    }
    return MG_OK;
}
