/* molgen dist: MPI's collectives behind dist.h; without MG_HAVE_MPI (no MPI
 * found at build time) one rank and no-ops. */
#define _POSIX_C_SOURCE 200809L
#include "dist.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"

#ifdef MG_HAVE_MPI
#include <mpi.h>
#endif

static mg_dist g_world = {0, 1, 0.0};
static int g_mpi_started = 0;

int mg_dist_compiled(void) {
#ifdef MG_HAVE_MPI
    return 1;
#else
    return 0;
#endif
}

mg_dist *mg_dist_world(void) { return &g_world; }

/* The launcher's word: the job has ranks (Open MPI, MPICH/Hydra, PMIx). */
static int launched_as_ranks(void) {
    static const char *const vars[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++)
        if (getenv(vars[i])) return 1;
    return 0;
}

mg_status mg_dist_init(int *argc, char ***argv, mg_error *err) {
    if (!launched_as_ranks()) return MG_OK;
#ifdef MG_HAVE_MPI
    int provided = 0;
    if (MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS)
        return mg_fail(err, MG_ERR_IO, "MPI_Init failed");
    g_mpi_started = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &g_world.rank);
    MPI_Comm_size(MPI_COMM_WORLD, &g_world.size);
    return MG_OK;
#else
    (void)argc;
    (void)argv;
    const char *n = getenv("OMPI_COMM_WORLD_SIZE");
    if (!n) n = getenv("PMI_SIZE");
    if (n && atoi(n) == 1) return MG_OK;
    return mg_fail(err, MG_ERR_ARG,
                   "this molgen was built without MPI (CMake found no libopenmpi-dev): it cannot "
                   "run as several ranks under mpirun");
#endif
}

void mg_dist_finalize(void) {
#ifdef MG_HAVE_MPI
    if (g_mpi_started) MPI_Finalize();
#endif
    g_mpi_started = 0;
    g_world.rank = 0;
    g_world.size = 1;
}

void mg_dist_range(size_t n, int rank, int size, size_t *i0, size_t *i1) {
    const size_t q = n / (size_t)size, extra = n % (size_t)size, r = (size_t)rank;
    *i0 = q * r + (r < extra ? r : extra);
    *i1 = *i0 + q + (r < extra);
}

#ifdef MG_HAVE_MPI
/* MPI counts are int: large buffers go in pieces. */
#define MG_MPI_PIECE ((size_t)1 << 28)
#endif

mg_status mg_dist_agree(mg_dist *d, mg_status rc, mg_error *err) {
    if (!d || d->size <= 1) return rc;
#ifdef MG_HAVE_MPI
    int mine = rc ? d->rank : INT_MAX, first = INT_MAX;
    const double t = mg_now_s();
    MPI_Allreduce(&mine, &first, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    d->comm_s += mg_now_s() - t;
    if (first == INT_MAX) return MG_OK;
    if (first == d->rank) return rc;
    return mg_fail(err, MG_ERR_PEER, "rank %d of %d failed", first, d->size);
#else
    (void)err;
    return rc;
#endif
}

void mg_dist_sum_f32(mg_dist *d, float *x, size_t n) {
    if (!d || d->size <= 1) return;
#ifdef MG_HAVE_MPI
    const double t = mg_now_s();
    for (size_t i = 0; i < n; i += MG_MPI_PIECE) {
        const size_t k = n - i < MG_MPI_PIECE ? n - i : MG_MPI_PIECE;
        MPI_Allreduce(MPI_IN_PLACE, x + i, (int)k, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    }
    d->comm_s += mg_now_s() - t;
#else
    (void)x;
    (void)n;
#endif
}

void mg_dist_sum_f64(mg_dist *d, double *x, size_t n) {
    if (!d || d->size <= 1) return;
#ifdef MG_HAVE_MPI
    const double t = mg_now_s();
    for (size_t i = 0; i < n; i += MG_MPI_PIECE) {
        const size_t k = n - i < MG_MPI_PIECE ? n - i : MG_MPI_PIECE;
        MPI_Allreduce(MPI_IN_PLACE, x + i, (int)k, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    }
    d->comm_s += mg_now_s() - t;
#else
    (void)x;
    (void)n;
#endif
}

void mg_dist_max_i64(mg_dist *d, int64_t *x, size_t n) {
    if (!d || d->size <= 1) return;
#ifdef MG_HAVE_MPI
    const double t = mg_now_s();
    MPI_Allreduce(MPI_IN_PLACE, x, (int)n, MPI_INT64_T, MPI_MAX, MPI_COMM_WORLD);
    d->comm_s += mg_now_s() - t;
#else
    (void)x;
    (void)n;
#endif
}

int mg_dist_same_u64(mg_dist *d, uint64_t x) {
    if (!d || d->size <= 1) return 1;
#ifdef MG_HAVE_MPI
    uint64_t v[2] = {x, ~x}; /* max of x and of ~x: the max and the min */
    MPI_Allreduce(MPI_IN_PLACE, v, 2, MPI_UINT64_T, MPI_MAX, MPI_COMM_WORLD);
    return v[0] == x && v[1] == ~x;
#else
    (void)x;
    return 1;
#endif
}

mg_status mg_dist_gather(mg_dist *d, const void *bytes, size_t n, void **all, size_t *all_n,
                         mg_error *err) {
    *all = NULL;
    *all_n = 0;
    if (!d || d->size <= 1) {
        if (!(*all = malloc(n ? n : 1))) return mg_fail(err, MG_ERR_NOMEM, "out of memory");
        if (n) memcpy(*all, bytes, n);
        *all_n = n;
        return MG_OK;
    }
#ifdef MG_HAVE_MPI
    mg_status rc = MG_OK;
    if (n > INT_MAX)
        rc = mg_fail(err, MG_ERR_TOO_LONG, "rank %d's part is %zu bytes: more than MPI's count",
                     d->rank, n);
    if ((rc = mg_dist_agree(d, rc, err))) return rc;
    int mine = (int)n, *counts = NULL, *at = NULL;
    size_t total = 0;
    if (d->rank == 0) {
        counts = malloc((size_t)d->size * sizeof *counts);
        at = malloc((size_t)d->size * sizeof *at);
        if (!counts || !at) rc = mg_fail(err, MG_ERR_NOMEM, "out of memory");
    }
    if ((rc = mg_dist_agree(d, rc, err))) goto done;
    MPI_Gather(&mine, 1, MPI_INT, counts, 1, MPI_INT, 0, MPI_COMM_WORLD);
    if (d->rank == 0) {
        for (int r = 0; r < d->size; r++) total += (size_t)counts[r];
        if (total > INT_MAX)
            rc = mg_fail(err, MG_ERR_TOO_LONG, "%zu bytes to gather: more than MPI's count", total);
        else if (!(*all = malloc(total ? total : 1)))
            rc = mg_fail(err, MG_ERR_NOMEM, "out of memory for %zu bytes", total);
        for (int r = 0, o = 0; r < d->size && !rc; r++) {
            at[r] = o;
            o += counts[r];
        }
    }
    if (!(rc = mg_dist_agree(d, rc, err))) {
        MPI_Gatherv(bytes, mine, MPI_BYTE, *all, counts, at, MPI_BYTE, 0, MPI_COMM_WORLD);
        *all_n = total;
    } else {
        free(*all);
        *all = NULL;
    }
done:
    free(counts);
    free(at);
    return rc;
#else
    return mg_fail(err, MG_ERR_STATE, "no MPI");
#endif
}
