/* molgen dist: MPI's collectives behind dist.h; without MG_HAVE_MPI (no MPI
 * found at build time) one rank and no-ops. */
#define _POSIX_C_SOURCE 200809L
#include "base/dist.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/util.h"

#ifdef MG_HAVE_MPI
#include <mpi.h>
#endif

static mg_dist g_world = {0, 1, 0.0};
static int g_mpi_started = 0;

/* mg_dist_hold_output: the real stdout and stderr (dups; -1: not held) and
 * the temporary files that take what is printed meanwhile. */
static int g_saved_fd[2] = {-1, -1};
static FILE *g_held[2] = {NULL, NULL};

static void write_all(int fd, const char *p, size_t n) {
    while (n > 0) {
        const ssize_t k = write(fd, p, n);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return;
        p += k;
        n -= (size_t)k;
    }
}

/* Ends the hold: fd 1 and 2 back to the real ones; what was held is written
 * there (pass) or dropped. */
static void hold_end(int pass) {
    if (g_saved_fd[0] < 0 && g_saved_fd[1] < 0) return;
    fflush(stdout);
    fflush(stderr);
    for (int i = 0; i < 2; i++) {
        if (g_saved_fd[i] < 0) continue;
        dup2(g_saved_fd[i], i + 1);
        close(g_saved_fd[i]);
        g_saved_fd[i] = -1;
        char buf[4096];
        size_t k;
        rewind(g_held[i]);
        while (pass && (k = fread(buf, 1, sizeof buf, g_held[i])) > 0) write_all(i + 1, buf, k);
        fclose(g_held[i]);
        g_held[i] = NULL;
    }
}

#ifdef MG_HAVE_MPI
/* Every collective starts here: a rank that reached one passes its output. */
static void collective(void) {
    if (g_saved_fd[0] >= 0 || g_saved_fd[1] >= 0) hold_end(1);
}
#endif

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
    hold_end(0);
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
    collective();
    /* a rank holding MG_ERR_PEER (an earlier agreement) is not the origin */
    int mine = !rc ? INT_MAX : rc == MG_ERR_PEER ? INT_MAX - 1 : d->rank, first = INT_MAX;
    const double t = mg_now_s();
    MPI_Allreduce(&mine, &first, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    d->comm_s += mg_now_s() - t;
    if (first == INT_MAX) return MG_OK;
    if (first == d->rank || (first == INT_MAX - 1 && rc)) return rc;
    if (first == INT_MAX - 1) return mg_fail(err, MG_ERR_PEER, "a rank of %d failed", d->size);
    return mg_fail(err, MG_ERR_PEER, "rank %d of %d failed", first, d->size);
#else
    (void)err;
    return rc;
#endif
}

void mg_dist_sum_f32(mg_dist *d, float *x, size_t n) {
    if (!d || d->size <= 1) return;
#ifdef MG_HAVE_MPI
    collective();
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
    collective();
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
    collective();
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
    collective();
    uint64_t v[2] = {x, ~x}; /* max of x and of ~x: the max and the min */
    MPI_Allreduce(MPI_IN_PLACE, v, 2, MPI_UINT64_T, MPI_MAX, MPI_COMM_WORLD);
    return v[0] == x && v[1] == ~x;
#else
    (void)x;
    return 1;
#endif
}

/* The one-rank gather and allgather: *all = a copy of this rank's n bytes. */
static mg_status gather_self(const void *bytes, size_t n, void **all, size_t *all_n,
                             mg_error *err) {
    if (!(*all = malloc(n ? n : 1))) return mg_fail(err, MG_ERR_NOMEM, "out of memory");
    if (n) memcpy(*all, bytes, n);
    *all_n = n;
    return MG_OK;
}

#ifdef MG_HAVE_MPI
/* A rank's part must fit MPI's int count. */
static mg_status part_fits(const mg_dist *d, size_t n, mg_error *err) {
    if (n <= INT_MAX) return MG_OK;
    return mg_fail(err, MG_ERR_TOO_LONG, "rank %d's part is %zu bytes: more than MPI's count",
                   d->rank, n);
}

/* counts[size] (bytes per rank) -> at[size] (each part's offset), *total
 * (their sum, within MPI's int count) and *all (total bytes, malloc'd). */
static mg_status gather_layout(const mg_dist *d, const int *counts, int *at, size_t *total,
                               void **all, mg_error *err) {
    *total = 0;
    for (int r = 0; r < d->size; r++) *total += (size_t)counts[r];
    if (*total > INT_MAX)
        return mg_fail(err, MG_ERR_TOO_LONG, "%zu bytes to gather: more than MPI's count",
                       *total);
    if (!(*all = malloc(*total ? *total : 1)))
        return mg_fail(err, MG_ERR_NOMEM, "out of memory for %zu bytes", *total);
    for (int r = 0, o = 0; r < d->size; r++) {
        at[r] = o;
        o += counts[r];
    }
    return MG_OK;
}
#endif

mg_status mg_dist_gather(mg_dist *d, const void *bytes, size_t n, void **all, size_t *all_n,
                         mg_error *err) {
    *all = NULL;
    *all_n = 0;
    if (!d || d->size <= 1) return gather_self(bytes, n, all, all_n, err);
#ifdef MG_HAVE_MPI
    collective();
    mg_status rc = part_fits(d, n, err);
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
    if (d->rank == 0) rc = gather_layout(d, counts, at, &total, all, err);
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

mg_status mg_dist_allgather(mg_dist *d, const void *bytes, size_t n, void **all, size_t *all_n,
                            mg_error *err) {
    *all = NULL;
    *all_n = 0;
    if (!d || d->size <= 1) return gather_self(bytes, n, all, all_n, err);
#ifdef MG_HAVE_MPI
    collective();
    mg_status rc = part_fits(d, n, err);
    int *counts = malloc((size_t)d->size * sizeof *counts);
    int *at = malloc((size_t)d->size * sizeof *at);
    if (!rc && (!counts || !at)) rc = mg_fail(err, MG_ERR_NOMEM, "out of memory");
    if ((rc = mg_dist_agree(d, rc, err))) goto done;
    const double t = mg_now_s();
    int mine = (int)n;
    MPI_Allgather(&mine, 1, MPI_INT, counts, 1, MPI_INT, MPI_COMM_WORLD);
    size_t total;
    rc = gather_layout(d, counts, at, &total, all, err);
    if (!(rc = mg_dist_agree(d, rc, err))) {
        MPI_Allgatherv(bytes, mine, MPI_BYTE, *all, counts, at, MPI_BYTE, MPI_COMM_WORLD);
        *all_n = total;
    } else {
        free(*all);
        *all = NULL;
    }
    d->comm_s += mg_now_s() - t;
done:
    free(counts);
    free(at);
    return rc;
#else
    return mg_fail(err, MG_ERR_STATE, "no MPI");
#endif
}

uint64_t mg_dist_hash(const void *p, size_t n) { return mg_fnv1a(MG_FNV1A_INIT, p, n); }

uint64_t mg_dist_hash_str(const char *s) { return mg_dist_hash(s ? s : "", s ? strlen(s) : 0); }

/* Fields compared (more are a programming error: the rest go unchecked). */
#define MG_DIST_FIELDS_MAX 128

mg_status mg_dist_agree_fields(mg_dist *d, const mg_dist_field *f, size_t n, mg_error *err) {
    if (!d || d->size <= 1) return MG_OK;
#ifdef MG_HAVE_MPI
    collective();
    const double t = mg_now_s();
    /* rank 0's count, then its (name hash, value) pairs, to every rank */
    uint64_t n0 = n < MG_DIST_FIELDS_MAX ? n : MG_DIST_FIELDS_MAX, v[2 * MG_DIST_FIELDS_MAX];
    MPI_Bcast(&n0, 1, MPI_UINT64_T, 0, MPI_COMM_WORLD);
    for (size_t i = 0; d->rank == 0 && i < n0; i++) {
        v[2 * i] = mg_dist_hash_str(f[i].what);
        v[2 * i + 1] = f[i].value;
    }
    MPI_Bcast(v, (int)(2 * n0), MPI_UINT64_T, 0, MPI_COMM_WORLD);
    const size_t m = n < n0 ? n : (size_t)n0;
    size_t first = n == n0 ? SIZE_MAX : m; /* this rank's first difference */
    for (size_t i = 0; i < m && first == SIZE_MAX; i++)
        if (v[2 * i] != mg_dist_hash_str(f[i].what) || v[2 * i + 1] != f[i].value) first = i;
    int mine = first != SIZE_MAX ? d->rank : INT_MAX, low = INT_MAX;
    MPI_Allreduce(&mine, &low, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    d->comm_s += mg_now_s() - t;
    if (low == INT_MAX) return MG_OK;
    if (low != d->rank) return mg_fail(err, MG_ERR_PEER, "rank %d of %d differs", low, d->size);
    if (first < m && v[2 * first] == mg_dist_hash_str(f[first].what))
        return mg_fail(err, MG_ERR_MISMATCH, "the ranks disagree: %s differs from rank 0's",
                       f[first].what);
    return mg_fail(err, MG_ERR_MISMATCH,
                   "the ranks disagree: this rank runs another command (or molgen) than rank 0");
#else
    (void)f;
    (void)n;
    (void)err;
    return MG_OK;
#endif
}

void mg_dist_hold_output(int argc, char **argv) {
    mg_dist *d = &g_world;
    if (d->size <= 1) return;
    uint64_t h = MG_FNV1A_INIT; /* argv[0] may differ: another path to molgen */
    for (int i = 1; i < argc; i++) h = mg_fnv1a(h, argv[i], strlen(argv[i]) + 1);
    if (!mg_dist_same_u64(d, h) || d->rank == 0) return;
    fflush(stdout);
    fflush(stderr);
    for (int i = 0; i < 2; i++) {
        FILE *tmp = tmpfile();
        const int saved = tmp ? dup(i + 1) : -1;
        if (saved < 0 || dup2(fileno(tmp), i + 1) < 0) { /* not held: said by every rank */
            if (saved >= 0) close(saved);
            if (tmp) fclose(tmp);
            continue;
        }
        g_saved_fd[i] = saved;
        g_held[i] = tmp;
    }
}
