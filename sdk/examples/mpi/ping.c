/* ping.c: the cost of a cheap MPI call in a tight loop (MPI_Comm_rank), for the wrapper's added cost per call.
 *
 *   ping [CALLS]      default 10000000; prints the nanoseconds per call */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    long calls = argc > 1 ? atol(argv[1]) : 10000000;
    int rank = 0;
    /* Warm up: the first calls register the activity and fault in the code. */
    for (int i = 0; i < 1000; i++) MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    double t0 = MPI_Wtime();
    for (long i = 0; i < calls; i++) {
        MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    }
    double elapsed = MPI_Wtime() - t0;
    if (rank == 0) printf("ping: %ld calls of MPI_Comm_rank, %.2f ns per call\n", calls, elapsed * 1e9 / calls);
    MPI_Finalize();
    return 0;
}
