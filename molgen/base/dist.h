/* molgen dist: the ranks of an MPI job (Open MPI), for data-parallel
 * training, sampling and scoring. The one process-wide object is the world
 * (mg_dist_world): main.c starts it with mg_dist_init when the process was
 * launched by mpirun (the launcher's environment says so) and ends it with
 * mg_dist_finalize; otherwise, and in a build without MPI (CMake did not
 * find it), it is one rank of one and every collective below is a no-op.
 * The engine takes it explicitly (mg_train_config.dist, mg_sample_opts.dist).
 *
 * Every function taking a dist is collective: all ranks call it in the same
 * order. A failure of MPI itself (a peer that died) ends the whole job
 * (MPI's default error handler; mpirun kills the other ranks), so nothing
 * here returns an MPI error. Failures of molgen's own work are agreed on
 * with mg_dist_agree at the points where ranks could diverge.
 *
 * Work split by index: n items in N consecutive parts in rank order, the
 * first n % N ranks one item more than the others (n / N). */
#ifndef MG_DIST_H
#define MG_DIST_H

#include <stddef.h>
#include <stdint.h>

#include "base/errors.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    int rank, size; /* 0 and 1 when alone */
    double comm_s;  /* seconds spent in the collectives below (waits included) */
} mg_dist;

/* Starts the world: MPI_Init when launched by mpirun (OMPI_COMM_WORLD_SIZE,
 * PMI_SIZE or PMIX_RANK set), else one rank. A build without MPI launched
 * as several ranks is MG_ERR_ARG ("built without MPI"). */
mg_status mg_dist_init(int *argc, char ***argv, mg_error *err);
/* The world: never NULL (one rank before mg_dist_init). */
mg_dist *mg_dist_world(void);
/* MPI_Finalize; output still held (mg_dist_hold_output) is dropped. */
void mg_dist_finalize(void);

/* [*i0, *i1): rank's part of n items. */
void mg_dist_range(size_t n, int rank, int size, size_t *i0, size_t *i1);

/* Every rank's status: MG_OK when all are MG_OK; else on the lowest failed
 * rank its own rc (err already filled by its caller), on every other rank
 * MG_ERR_PEER "rank K of N failed": one rank reports, even when all failed
 * alike (a bad option, a missing file). A rank whose rc is MG_ERR_PEER (an
 * earlier agreement's) is not a failed rank here: agreeing again keeps the
 * origin's error. */
mg_status mg_dist_agree(mg_dist *d, mg_status rc, mg_error *err);

/* In place, over the ranks: x = the sum (f32: the gradients; f64: losses,
 * counts); the max (i64: flags, a value only rank 0 sets while the others
 * give INT64_MIN). */
void mg_dist_sum_f32(mg_dist *d, float *x, size_t n);
void mg_dist_sum_f64(mg_dist *d, double *x, size_t n);
void mg_dist_max_i64(mg_dist *d, int64_t *x, size_t n);
/* 1 when x is the same on every rank (max == min). */
int mg_dist_same_u64(mg_dist *d, uint64_t x);

/* What every rank must hold alike: an option's value, a hash of an input's
 * contents (what = "--seed", "the --smiles file's contents"). */
typedef struct {
    const char *what;
    uint64_t value;
} mg_dist_field;
/* FNV-1a of s ("" for NULL), and of n bytes: the value of a field. */
uint64_t mg_dist_hash_str(const char *s);
uint64_t mg_dist_hash(const void *p, size_t n);
/* Every rank holds rank 0's fields f[0..n) (the same names, by their hash,
 * and values, in the same order): MG_OK; else on the lowest rank that
 * differs from rank 0 MG_ERR_MISMATCH "the ranks disagree: WHAT differs
 * from rank 0's" (its first differing field), on every other rank
 * MG_ERR_PEER. */
mg_status mg_dist_agree_fields(mg_dist *d, const mg_dist_field *f, size_t n, mg_error *err);

/* Under mpirun, ranks other than 0 started with rank 0's command line
 * (argv[1..argc), compared by hash) hold what they print on stdout and
 * stderr until their next collective: a usage error or --help before it is
 * rank 0's too, so it is said once; from that collective on their output
 * passes through (what was held first). Collective; a no-op alone. */
void mg_dist_hold_output(int argc, char **argv);

/* Rank 0 gets every rank's bytes[0..n) concatenated in rank order
 * (*all malloc'ed, *all_n its length; NULL / 0 on the other ranks).
 * MG_ERR_NOMEM (agreed: every rank sees it). */
mg_status mg_dist_gather(mg_dist *d, const void *bytes, size_t n, void **all, size_t *all_n,
                         mg_error *err);

/* Every rank gets every rank's bytes[0..n) concatenated in rank order
 * (*all malloc'ed, *all_n its length; a rank may give 0 bytes: the other
 * ranks giving none makes it rank 0's broadcast). MG_ERR_NOMEM /
 * MG_ERR_TOO_LONG agreed. Alone: a copy. */
mg_status mg_dist_allgather(mg_dist *d, const void *bytes, size_t n, void **all, size_t *all_n,
                            mg_error *err);

#ifdef __cplusplus
}
#endif
#endif /* MG_DIST_H */
