/* stencil_mpi.c: a 2-D Jacobi stencil decomposed by rows over MPI ranks, with no Canopy call in it.
 *
 * Each rank owns ROWS rows of an N-column grid. Every iteration it exchanges its halo rows with the ranks
 * above and below (two MPI_Sendrecv, MPI_PROC_NULL at the edges), sweeps its rows, and computes the global
 * residual with MPI_Allreduce. At the end rank 0 prints every rank's own count of those calls and of the bytes
 * it sent, and a checksum of the grid: the same output with or without Canopy's wrapper preloaded. The time
 * of the iterations, wall and rank 0's process CPU (all its threads), goes to stderr.
 *
 *   stencil_mpi [ITERATIONS [N [ROWS]]]     defaults: 100 iterations, N = 256, ROWS = 64
 *
 * Monitor it unmodified: mpirun -x LD_PRELOAD=libcanopy_mpi.so ./stencil_mpi, or link it with -lcanopy_mpi. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    int iterations = argc > 1 ? atoi(argv[1]) : 100;
    int n = argc > 2 ? atoi(argv[2]) : 256;
    int rows = argc > 3 ? atoi(argv[3]) : 64;
    if (iterations < 0 || n < 4 || rows < 1) {
        if (rank == 0) fprintf(stderr, "usage: stencil_mpi [ITERATIONS [N (>= 4) [ROWS (>= 1)]]]\n");
        MPI_Finalize();
        return 2;
    }
    /* rows + 2 halo rows; the top edge of rank 0 is hot. */
    double *a = calloc((size_t)(rows + 2) * n, sizeof *a), *b = calloc((size_t)(rows + 2) * n, sizeof *b);
    if (!a || !b) {
        fprintf(stderr, "stencil_mpi: out of memory\n");
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    if (rank == 0)
        for (int j = 0; j < n; j++) a[n + j] = b[n + j] = 1.0;
    int up = rank > 0 ? rank - 1 : MPI_PROC_NULL, down = rank < size - 1 ? rank + 1 : MPI_PROC_NULL;
    long sendrecvs = 0, allreduces = 0, bytes_sent = 0;

    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime(), residual = 0.0;
    clock_t c0 = clock();
    for (int it = 0; it < iterations; it++) {
        /* Halo: my first row goes up while the row below comes in; my last row goes down while the row above
         * comes in. */
        MPI_Sendrecv(&a[1 * n], n, MPI_DOUBLE, up, 0, &a[(rows + 1) * n], n, MPI_DOUBLE, down, 0, MPI_COMM_WORLD,
                     MPI_STATUS_IGNORE);
        MPI_Sendrecv(&a[rows * n], n, MPI_DOUBLE, down, 1, &a[0], n, MPI_DOUBLE, up, 1, MPI_COMM_WORLD,
                     MPI_STATUS_IGNORE);
        sendrecvs += 2;
        bytes_sent += (up != MPI_PROC_NULL ? n : 0) * (long)sizeof(double);
        bytes_sent += (down != MPI_PROC_NULL ? n : 0) * (long)sizeof(double);

        double local = 0.0;
        for (int i = 1; i <= rows; i++) {
            int global_row = rank * rows + i - 1;
            for (int j = 1; j < n - 1; j++) {
                if (global_row == 0) continue; /* the hot edge stays fixed */
                double v = 0.25 * (a[(i - 1) * n + j] + a[(i + 1) * n + j] + a[i * n + j - 1] + a[i * n + j + 1]);
                double d = v - a[i * n + j];
                local += d * d;
                b[i * n + j] = v;
            }
        }
        double *t = a;
        a = b;
        b = t;
        MPI_Allreduce(&local, &residual, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
        allreduces++;
    }
    double elapsed = MPI_Wtime() - t0, cpu = (double)(clock() - c0) / CLOCKS_PER_SEC;

    double sum = 0.0, checksum = 0.0;
    for (int i = 1; i <= rows; i++)
        for (int j = 0; j < n; j++) sum += a[i * n + j] * (1.0 + (rank * rows + i) % 7);
    MPI_Reduce(&sum, &checksum, 1, MPI_DOUBLE, MPI_SUM, 0, MPI_COMM_WORLD);
    long mine[3] = {sendrecvs, allreduces, bytes_sent};
    long *all = rank == 0 ? malloc(3 * sizeof(long) * (size_t)size) : NULL;
    MPI_Gather(mine, 3, MPI_LONG, all, 3, MPI_LONG, 0, MPI_COMM_WORLD);
    if (rank == 0) {
        for (int r = 0; r < size; r++)
            printf("rank %d: MPI_Sendrecv %ld MPI_Allreduce %ld bytes_sent %ld\n", r, all[3 * r], all[3 * r + 1],
                   all[3 * r + 2]);
        printf("residual %.10e checksum %.10e\n", residual, checksum);
        fprintf(stderr, "stencil_mpi: %d ranks, %d iterations of %d x %d in %.6f s (rank 0's process CPU %.6f s)\n",
                size, iterations, rows, n, elapsed, cpu);
        free(all);
    }
    free(a);
    free(b);
    MPI_Finalize();
    return 0;
}
