/* An MPI + OpenMP program with no Canopy call: each iteration a parallel loop, then an MPI_Allreduce on the
 * main thread. Under `canopy run --openmp` both are one rank's profile.
 *
 *   OMPI_CC=clang mpicc -g -O2 -fopenmp hybrid.c -o hybrid
 *   OMP_NUM_THREADS=2 canopy run --openmp -- mpirun -np 2 -x OMP_NUM_THREADS ./hybrid 10
 */
#include <mpi.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>

#define N (1 << 14)

static double a[N];

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    int iterations = argc > 1 ? atoi(argv[1]) : 10;
    double sum = 0, total = 0;
    for (int it = 0; it < iterations; it++) {
#pragma omp parallel for reduction(+ : sum)
        for (int i = 0; i < N; i++) {
            a[i] += i;
            sum += a[i];
        }
        MPI_Allreduce(&sum, &total, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    }
    printf("hybrid: rank %d iterations %d threads %d total %g\n", rank, iterations, omp_get_max_threads(), total);
    MPI_Finalize();
    return 0;
}
