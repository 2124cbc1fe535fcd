/* The all-reduce of molgen's data-parallel step alone: MPI_Allreduce (sum,
 * in place) of N floats, the gradient buffer's size, REPS times after a
 * warm-up; rank 0 prints the median and the bus bandwidth it implies
 * (a ring all-reduce moves 2 (P - 1) / P of the bytes per rank).
 * Build and run: bench/mpi_scaling.sh does it, or
 *   mpicc -O2 bench/mpi_allreduce.c -o /tmp/mpi_allreduce
 *   mpirun -np 2 /tmp/mpi_allreduce 813000 50 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

static int by_time(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    const long n = argc > 1 ? atol(argv[1]) : 813000;
    const int reps = argc > 2 ? atoi(argv[2]) : 50;
    float *x = malloc((size_t)n * sizeof *x);
    double *t = malloc((size_t)reps * sizeof *t);
    if (!x || !t || n < 1 || reps < 1) {
        fprintf(stderr, "mpi_allreduce: bad size or out of memory\n");
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    for (long i = 0; i < n; i++) x[i] = 1e-3f * (float)(i % 1000);
    for (int r = -5; r < reps; r++) {
        MPI_Barrier(MPI_COMM_WORLD);
        const double t0 = MPI_Wtime();
        MPI_Allreduce(MPI_IN_PLACE, x, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        if (r >= 0) t[r] = MPI_Wtime() - t0;
    }
    qsort(t, (size_t)reps, sizeof *t, by_time);
    const double med = t[reps / 2], bytes = 4.0 * (double)n;
    if (rank == 0)
        printf("allreduce of %ld floats (%.2f MB) over %d ranks: median %.3f ms, min %.3f ms; "
               "bus bandwidth %.2f GB/s\n",
               n, bytes / 1e6, size, 1e3 * med, 1e3 * t[0],
               2.0 * (size - 1) / size * bytes / med / 1e9);
    free(x);
    free(t);
    MPI_Finalize();
    return 0;
}
