/* families.c: one use of each family of MPI procedure beyond point-to-point and the classic collectives, so a
 * profiler's counts can be checked against what the program did: persistent requests, neighbourhood
 * collectives on a Cartesian ring, Alltoallw, a distributed graph, derived datatypes, one-sided with an
 * allocated window, and MPI-IO on a shared file. Each rank prints how many times it called each procedure.
 *
 *   mpicc -O2 -o families families.c && mpirun -np 4 ./families ITERATIONS FILE
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

#define COUNT 64

int main(int argc, char **argv) {
    int rank, size, iterations = argc > 1 ? atoi(argv[1]) : 5;
    const char *path = argc > 2 ? argv[2] : "families.dat";
    int sendbuf[COUNT], recvbuf[COUNT], ring[2 * COUNT];
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    for (int i = 0; i < COUNT; i++) sendbuf[i] = rank * COUNT + i;

    /* Persistent requests around a ring: created once, started every iteration. */
    int right = (rank + 1) % size, left = (rank + size - 1) % size;
    MPI_Request persistent[2];
    MPI_Send_init(sendbuf, COUNT, MPI_INT, right, 7, MPI_COMM_WORLD, &persistent[0]);
    MPI_Recv_init(recvbuf, COUNT, MPI_INT, left, 7, MPI_COMM_WORLD, &persistent[1]);
    for (int it = 0; it < iterations; it++) {
        MPI_Startall(2, persistent);
        MPI_Waitall(2, persistent, MPI_STATUSES_IGNORE);
    }
    MPI_Request_free(&persistent[0]);
    MPI_Request_free(&persistent[1]);

    /* A periodic 1-D Cartesian ring and its neighbourhood collectives. */
    int dims[1] = {0}, periods[1] = {1}, src, dst;
    MPI_Comm cart;
    MPI_Dims_create(size, 1, dims);
    MPI_Cart_create(MPI_COMM_WORLD, 1, dims, periods, 0, &cart);
    MPI_Cart_shift(cart, 0, 1, &src, &dst);
    int halves[2] = {COUNT / 2, COUNT / 2}, offsets[2] = {0, COUNT / 2};
    for (int it = 0; it < iterations; it++) {
        MPI_Request gathered;
        MPI_Neighbor_allgather(sendbuf, COUNT, MPI_INT, ring, COUNT, MPI_INT, cart);
        MPI_Neighbor_alltoall(sendbuf, COUNT / 2, MPI_INT, ring, COUNT / 2, MPI_INT, cart);
        MPI_Neighbor_alltoallv(sendbuf, halves, offsets, MPI_INT, ring, halves, offsets, MPI_INT, cart);
        MPI_Ineighbor_allgather(sendbuf, COUNT, MPI_INT, ring, COUNT, MPI_INT, cart, &gathered);
        MPI_Wait(&gathered, MPI_STATUS_IGNORE);
    }
    MPI_Comm_free(&cart);

    /* A matched probe and receive: one message from the left neighbour. */
    MPI_Message message;
    MPI_Status probed;
    MPI_Request to_right;
    MPI_Isend(sendbuf, COUNT, MPI_INT, right, 9, MPI_COMM_WORLD, &to_right);
    MPI_Mprobe(left, 9, MPI_COMM_WORLD, &message, &probed);
    MPI_Mrecv(recvbuf, COUNT, MPI_INT, &message, MPI_STATUS_IGNORE);
    MPI_Wait(&to_right, MPI_STATUS_IGNORE);

    /* A nonblocking receive of half a block, its bytes known when a wait completes it. */
    MPI_Request from_left;
    int which = -1;
    MPI_Irecv(ring, COUNT, MPI_INT, left, 10, MPI_COMM_WORLD, &from_left);
    MPI_Send(sendbuf, COUNT / 2, MPI_INT, right, 10, MPI_COMM_WORLD);
    MPI_Waitany(1, &from_left, &which, MPI_STATUS_IGNORE);

    /* A distributed graph of the same ring. */
    int sources[1] = {left}, destinations[1] = {right};
    MPI_Comm graph;
    int weights[1] = {1};
    MPI_Dist_graph_create_adjacent(MPI_COMM_WORLD, 1, sources, weights, 1, destinations, weights,
                                   MPI_INFO_NULL, 0, &graph);
    MPI_Comm_free(&graph);

    /* Alltoallw: this rank's number to every rank, each block in its own type: a double between two ranks whose
     * numbers add up to an odd number, an int between the others (both sides of a pair agree). */
    int *counts = malloc(size * sizeof(int)), *displs = malloc(size * sizeof(int));
    MPI_Datatype *types = malloc(size * sizeof(MPI_Datatype));
    int *all_out = malloc(size * sizeof(int));
    double *w_in = malloc(size * sizeof(double)), *w_out = malloc(size * sizeof(double));
    for (int i = 0; i < size; i++) {
        counts[i] = 1;
        displs[i] = i * (int)sizeof(double);
        types[i] = (rank + i) % 2 ? MPI_DOUBLE : MPI_INT;
        if (types[i] == MPI_DOUBLE)
            w_in[i] = rank;
        else
            *(int *)(void *)((char *)w_in + displs[i]) = rank;
    }
    MPI_Alltoallw(w_in, counts, displs, types, w_out, counts, displs, types, MPI_COMM_WORLD);
    for (int i = 0; i < size; i++)
        all_out[i] = types[i] == MPI_DOUBLE ? (int)w_out[i] : *(int *)(void *)((char *)w_out + displs[i]);

    /* Derived datatypes: a vector and a contiguous block, committed, used and freed. */
    MPI_Datatype every_other, block;
    MPI_Type_vector(COUNT / 2, 1, 2, MPI_INT, &every_other);
    MPI_Type_commit(&every_other);
    MPI_Type_contiguous(COUNT, MPI_INT, &block);
    MPI_Type_commit(&block);
    MPI_Allreduce(MPI_IN_PLACE, all_out, size, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    MPI_Type_free(&every_other);
    MPI_Type_free(&block);

    /* One-sided: an allocated window, a Put to the right neighbour between fences. */
    int *base;
    MPI_Win win;
    MPI_Win_allocate(COUNT * sizeof(int), sizeof(int), MPI_INFO_NULL, MPI_COMM_WORLD, &base, &win);
    MPI_Win_fence(0, win);
    MPI_Put(sendbuf, COUNT, MPI_INT, right, 0, COUNT, MPI_INT, win);
    MPI_Win_fence(0, win);
    /* A request-based put and an atomic fetch-and-add in a passive epoch. */
    int one = 1, before = 0;
    MPI_Request put;
    MPI_Win_lock(MPI_LOCK_SHARED, right, 0, win);
    MPI_Rput(sendbuf, COUNT, MPI_INT, right, 0, COUNT, MPI_INT, win, &put);
    MPI_Wait(&put, MPI_STATUS_IGNORE);
    MPI_Fetch_and_op(&one, &before, MPI_INT, right, 0, MPI_SUM, win);
    MPI_Win_unlock(right, win);
    MPI_Win_free(&win);

    /* MPI-IO: each rank writes its block of a shared file at its offset, collectively and alone, and reads it
     * back. */
    MPI_File fh;
    MPI_Status status;
    MPI_Offset at = (MPI_Offset)rank * COUNT * sizeof(int);
    MPI_File_open(MPI_COMM_WORLD, path, MPI_MODE_CREATE | MPI_MODE_RDWR, MPI_INFO_NULL, &fh);
    MPI_File_write_at_all(fh, at, sendbuf, COUNT, MPI_INT, &status);
    MPI_File_write_at(fh, at, sendbuf, COUNT, MPI_INT, &status);
    /* In rank order from the shared file pointer at 0: each block lands where write_at put it. */
    MPI_File_write_ordered(fh, sendbuf, COUNT, MPI_INT, &status);
    MPI_File_sync(fh);
    MPI_File_read_at(fh, at, recvbuf, COUNT, MPI_INT, &status);
    MPI_File_read_at_all(fh, at, recvbuf, COUNT, MPI_INT, &status);
    MPI_File_close(&fh);
    int ok = 1;
    for (int i = 0; i < COUNT; i++) ok &= recvbuf[i] == sendbuf[i];

#if MPI_VERSION >= 4
    /* MPI 4: a persistent collective started every iteration, a nonblocking send-receive around the ring and a
     * large-count broadcast. */
    MPI_Request summed;
    int total[COUNT];
    MPI_Allreduce_init(sendbuf, total, COUNT, MPI_INT, MPI_SUM, MPI_COMM_WORLD, MPI_INFO_NULL, &summed);
    for (int it = 0; it < iterations; it++) {
        MPI_Start(&summed);
        MPI_Wait(&summed, MPI_STATUS_IGNORE);
    }
    MPI_Request_free(&summed);
    MPI_Request exchanged;
    MPI_Isendrecv(sendbuf, COUNT, MPI_INT, right, 11, recvbuf, COUNT, MPI_INT, left, 11, MPI_COMM_WORLD, &exchanged);
    MPI_Wait(&exchanged, MPI_STATUS_IGNORE);
    MPI_Bcast_c(total, (MPI_Count)COUNT, MPI_INT, 0, MPI_COMM_WORLD);
#endif

    /* Procedures outside the annotated list: wrapped as mpi.h declares them. */
    char host[MPI_MAX_PROCESSOR_NAME];
    int host_len = 0, version = 0, subversion = 0;
    MPI_Get_processor_name(host, &host_len);
    MPI_Get_version(&version, &subversion);
    MPI_Get_version(&version, &subversion);

    /* What the file held back is checked by the exit status. */
    printf("rank %d: MPI_Startall %d MPI_Neighbor_allgather %d MPI_Neighbor_alltoall %d MPI_Alltoallw 1 "
           "MPI_Type_commit 2 MPI_Put 1 MPI_File_write_at 1 MPI_File_read_at 1 MPI_Dist_graph_create_adjacent 1 "
           "MPI_Get_processor_name 1 MPI_Get_version 2\n",
           rank, iterations, iterations, iterations);
    free(counts);
    free(displs);
    free(types);
    free(all_out);
    free(w_in);
    free(w_out);
    MPI_Finalize();
    return ok ? 0 : 1;
}
