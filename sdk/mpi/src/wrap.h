/* wrap.h: what the generated MPI wrappers (build.rs writes them from functions.list) share: the activity and
 * counter ids of every wrapped call, the byte arithmetic, and the dump every N-th call of one function.
 *
 * Every wrapper is `canopy_mpi_c_<symbol>`, hidden in the library; the exported MPI_<Name> and mpi_<name>_
 * are jumps to it (see lib.rs), since a Rust cdylib exports only what Rust defines. */
#ifndef CANOPY_MPI_WRAP_H
#define CANOPY_MPI_WRAP_H

#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "canopy.h"

/* Generated with the wrappers: the number of wrapped calls, their activity names ("MPI_Send") and the names of
 * their byte counters ("MPI_Allreduce bytes"). */
extern const int cm_count;
extern const char *const cm_names[];
extern const char *const cm_bytes_names[];

/* From lib.rs: Canopy starts for this rank (rank and size from MPI_COMM_WORLD) and finishes. */
void canopy_mpi_start(int rank, int size);
void canopy_mpi_finish(void);

/* Ids + 1 (0: not yet registered), by call. */
extern int cm_activity_ids[];
extern int cm_bytes_ids[];
/* The call whose every N-th completion dumps (-1: none), N, and the calls counted so far. */
extern int cm_dump_on;
extern uint64_t cm_dump_every;
extern uint64_t cm_dump_calls;
extern MPI_Group cm_world_group;

/* The next definition of NAME after this library in link order (a PMPI tool loaded after it, or the MPI
 * library), so that tools loaded together each see every call; FALLBACK (PMPI_NAME) where there is none. */
void *cm_next(const char *name, void *fallback);

int cm_register_activity(int k);
int cm_register_bytes(int k);
void cm_register_all(void);
void cm_started(void);
int cm_world_rank(MPI_Comm comm, int rank);
int cm_peers(MPI_Comm comm);
int cm_out_neighbours(MPI_Comm comm);

/* Persistent requests (wrap.c): MPI_Send_init's message remembered with its request, a message-send event at
 * each MPI_Start of it; a persistent collective's bytes remembered with its request and the call K that made
 * it, added to K's byte counter at each start; forgotten at MPI_Request_free. */
void cm_persist(MPI_Request request, int dest, int64_t count, MPI_Datatype type, MPI_Comm comm);
void cm_persist_bytes(MPI_Request request, int k, uint64_t bytes);

/* Receives (wrap.c): REQUEST of the receive call K followed to its completion, where the bytes its status says
 * go to K's counter (every completion of a PERSISTENT one, until MPI_Request_free). */
void cm_track_receive(MPI_Request request, int k, int persistent);
/* N requests completed: REQUESTS[i] (REQUESTS[INDICES[i]] with INDICES) with STATUSES[i]. */
void cm_completed(const MPI_Request *requests, const int *indices, int n, const MPI_Status *statuses);
/* How many receives the table follows: 0, and waits and tests look at nothing. */
extern int cm_receives_pending;

/* A wait's or a test's view of its requests while receives are followed: their handles before the call (which
 * sets completed ones to MPI_REQUEST_NULL) and statuses of its own where the program ignores them. */
#define CM_SMALL 16
typedef struct {
    int on, n;
    MPI_Request *requests, small_requests[CM_SMALL];
    MPI_Status *statuses, small_statuses[CM_SMALL];
} cm_watch_t;

/* Starts watching N requests; returns the statuses to pass to MPI (STATUSES, or the watch's own when they are
 * ignored). Nothing is watched while no receive is followed, or when memory for a large array is short. */
static inline MPI_Status *cm_watch(cm_watch_t *w, const MPI_Request *requests, int n, MPI_Status *statuses,
                                   int ignored) {
    w->on = 0;
    w->n = n;
    w->requests = w->small_requests;
    w->statuses = w->small_statuses;
    if (__atomic_load_n(&cm_receives_pending, __ATOMIC_RELAXED) == 0 || n <= 0 || requests == NULL)
        return statuses;
    if (n > CM_SMALL) {
        w->requests = (MPI_Request *)malloc((size_t)n * sizeof(MPI_Request));
        w->statuses = ignored ? (MPI_Status *)malloc((size_t)n * sizeof(MPI_Status)) : NULL;
        if (w->requests == NULL || (ignored && w->statuses == NULL)) {
            free(w->requests);
            free(w->statuses);
            w->requests = w->small_requests;
            w->statuses = w->small_statuses;
            return statuses;
        }
    }
    memcpy(w->requests, requests, (size_t)n * sizeof(MPI_Request));
    w->on = 1;
    return ignored ? w->statuses : statuses;
}

/* The requests at INDICES (all of them with NULL), N of them, completed with STATUSES. */
static inline void cm_watched(const cm_watch_t *w, const int *indices, int n, const MPI_Status *statuses) {
    if (w->on && n > 0 && n != MPI_UNDEFINED) cm_completed(w->requests, indices, n, statuses);
}

/* The request at INDEX completed with STATUS (a Waitany or a Testany). */
static inline void cm_watched_one(const cm_watch_t *w, int index, const MPI_Status *status) {
    if (w->on && index >= 0 && index != MPI_UNDEFINED && index < w->n) cm_completed(&w->requests[index], NULL, 1, status);
}

static inline void cm_unwatch(cm_watch_t *w) {
    if (w->requests != w->small_requests) free(w->requests);
    if (w->statuses != w->small_statuses) free(w->statuses);
}
void cm_start(MPI_Request request);
void cm_forget(MPI_Request request);

static inline int cm_activity(int k) {
    int v = __atomic_load_n(&cm_activity_ids[k], __ATOMIC_RELAXED);
    return v > 0 ? v - 1 : cm_register_activity(k);
}

static inline void cm_begin(int k) {
    int id = cm_activity(k);
    if (id >= 0) canopy_begin(id);
}

static inline void cm_end(int k) {
    int id = cm_activity(k);
    if (id >= 0) canopy_end(id);
    if (k == __atomic_load_n(&cm_dump_on, __ATOMIC_RELAXED) &&
        __atomic_add_fetch(&cm_dump_calls, 1, __ATOMIC_RELAXED) % cm_dump_every == 0)
        canopy_dump();
}

/* COUNT elements of TYPE in bytes; 0 for what MPI ignores (a null type, no elements). COUNT is an int, or an
 * MPI_Count for the large-count (`_c`) procedures. */
static inline uint64_t cm_bytes(int64_t count, MPI_Datatype type) {
    int size = 0;
    if (count <= 0 || type == MPI_DATATYPE_NULL) return 0;
    if (PMPI_Type_size(type, &size) != MPI_SUCCESS || size <= 0) return 0;
    return (uint64_t)count * (uint64_t)size;
}

/* Per-block counts each in its own type (MPI_Alltoallw): the sum over N blocks of COUNTS[i] elements of
 * TYPES[i], in bytes. */
static inline uint64_t cm_sumw_bytes_int(const int *counts, const MPI_Datatype *types, int n) {
    uint64_t total = 0;
    if (counts == NULL || types == NULL) return 0;
    for (int i = 0; i < n; i++) total += cm_bytes(counts[i], types[i]);
    return total;
}

static inline uint64_t cm_sumw_bytes_count(const MPI_Count *counts, const MPI_Datatype *types, int n) {
    uint64_t total = 0;
    if (counts == NULL || types == NULL) return 0;
    for (int i = 0; i < n; i++) total += cm_bytes((int64_t)counts[i], types[i]);
    return total;
}

/* The sum of N blocks of COUNTS, in bytes of TYPE. */
static inline uint64_t cm_sum_bytes_int(const int *counts, MPI_Datatype type, int n) {
    uint64_t elems = 0;
    if (counts == NULL) return 0;
    for (int i = 0; i < n; i++)
        if (counts[i] > 0) elems += (uint64_t)counts[i];
    return elems * cm_bytes(1, type);
}

static inline uint64_t cm_sum_bytes_count(const MPI_Count *counts, MPI_Datatype type, int n) {
    uint64_t elems = 0;
    if (counts == NULL) return 0;
    for (int i = 0; i < n; i++)
        if (counts[i] > 0) elems += (uint64_t)counts[i];
    return elems * cm_bytes(1, type);
}

/* The sums over N blocks, for the counts as the procedure takes them: ints, or MPI_Counts (`_c` procedures). */
#define cm_sum_bytes(counts, type, n)                                                                          \
    _Generic((counts), const MPI_Count *: cm_sum_bytes_count, MPI_Count *: cm_sum_bytes_count,                  \
             default: cm_sum_bytes_int)(counts, type, n)
#define cm_sumw_bytes(counts, types, n)                                                                        \
    _Generic((counts), const MPI_Count *: cm_sumw_bytes_count, MPI_Count *: cm_sumw_bytes_count,                \
             default: cm_sumw_bytes_int)(counts, types, n)

static inline void cm_add_bytes(int k, uint64_t bytes) {
    int v, id;
    if (bytes == 0) return;
    v = __atomic_load_n(&cm_bytes_ids[k], __ATOMIC_RELAXED);
    id = v > 0 ? v - 1 : cm_register_bytes(k);
    if (id >= 0) canopy_count(id, (double)bytes);
}

/* A message of COUNT elements of TYPE to rank DEST of COMM: a send event to its rank in MPI_COMM_WORLD. */
static inline void cm_send(int dest, int64_t count, MPI_Datatype type, MPI_Comm comm) {
    int world;
    if (dest == MPI_PROC_NULL || dest < 0) return;
    world = comm == MPI_COMM_WORLD ? dest : cm_world_rank(comm, dest);
    if (world >= 0) canopy_send(world, cm_bytes(count, type));
}

/* The bytes a receive brought, from its status. */
static inline void cm_received(int k, const MPI_Status *status) {
    int n = 0;
    if (PMPI_Get_count(status, MPI_BYTE, &n) == MPI_SUCCESS && n > 0 && n != MPI_UNDEFINED)
        cm_add_bytes(k, (uint64_t)n);
}

#endif /* CANOPY_MPI_WRAP_H */
