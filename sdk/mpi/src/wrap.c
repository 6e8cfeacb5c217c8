/* wrap.c: the registration of the wrappers' ids, the start of Canopy at MPI_Init, and the ranks of other
 * communicators in MPI_COMM_WORLD. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <string.h>

#include "wrap.h"

int cm_dump_on = -1;
uint64_t cm_dump_every = 1;
uint64_t cm_dump_calls = 0;
MPI_Group cm_world_group = MPI_GROUP_NULL;
static int cm_started_once = 0;

/* Called by lib.rs when the library is loaded: dump after every EVERY-th completed call K. */
void canopy_mpi_c_set_dump_on(int k, uint64_t every) {
    cm_dump_every = every > 0 ? every : 1;
    __atomic_store_n(&cm_dump_on, k, __ATOMIC_RELAXED);
}

int cm_register_activity(int k) {
    int id = canopy_activity(cm_names[k]);
    /* A failed registration is not retried on every call: the call then goes unmeasured. */
    __atomic_store_n(&cm_activity_ids[k], id >= 0 ? id + 1 : -1, __ATOMIC_RELAXED);
    return id;
}

int cm_register_bytes(int k) {
    int id = canopy_counter_id(cm_bytes_names[k]);
    __atomic_store_n(&cm_bytes_ids[k], id >= 0 ? id + 1 : -1, __ATOMIC_RELAXED);
    return id;
}

void cm_register_all(void) {
    for (int k = 0; k < cm_count; k++) {
        if (__atomic_load_n(&cm_activity_ids[k], __ATOMIC_RELAXED) == 0) cm_register_activity(k);
        if (cm_bytes_names[k] != NULL && __atomic_load_n(&cm_bytes_ids[k], __ATOMIC_RELAXED) == 0)
            cm_register_bytes(k);
    }
}

/* After PMPI_Init: the ids, the world's group, and Canopy with MPI's own rank and size (once, whichever of the
 * C and Fortran entry points came first). */
void cm_started(void) {
    int rank = -1, size = -1, initialized = 0;
    if (__atomic_exchange_n(&cm_started_once, 1, __ATOMIC_ACQ_REL)) return;
    if (PMPI_Initialized(&initialized) != MPI_SUCCESS || !initialized) return;
    cm_register_all();
    PMPI_Comm_group(MPI_COMM_WORLD, &cm_world_group);
    PMPI_Comm_rank(MPI_COMM_WORLD, &rank);
    PMPI_Comm_size(MPI_COMM_WORLD, &size);
    canopy_mpi_start(rank, size);
}

/* RANK of COMM (of its remote group, for an intercommunicator) in MPI_COMM_WORLD; -1 if it has none there. */
int cm_world_rank(MPI_Comm comm, int rank) {
    MPI_Group group;
    int inter = 0, world = MPI_UNDEFINED;
    if (cm_world_group == MPI_GROUP_NULL) return -1;
    PMPI_Comm_test_inter(comm, &inter);
    if ((inter ? PMPI_Comm_remote_group(comm, &group) : PMPI_Comm_group(comm, &group)) != MPI_SUCCESS) return -1;
    PMPI_Group_translate_ranks(group, 1, &rank, cm_world_group, &world);
    PMPI_Group_free(&group);
    return world == MPI_UNDEFINED ? -1 : world;
}

/* The ranks a vector collective's counts cover: COMM's size, its remote group's for an intercommunicator. */
int cm_peers(MPI_Comm comm) {
    int inter = 0, n = 0;
    PMPI_Comm_test_inter(comm, &inter);
    if (inter)
        PMPI_Comm_remote_size(comm, &n);
    else
        PMPI_Comm_size(comm, &n);
    return n;
}

/* The blocks a neighbourhood collective's counts cover: COMM's out-neighbours in its topology (two per dimension
 * of a Cartesian one, MPI_PROC_NULL included, as MPI lays out the buffers); 0 without a topology. */
int cm_out_neighbours(MPI_Comm comm) {
    int topo = MPI_UNDEFINED, n = 0;
    if (PMPI_Topo_test(comm, &topo) != MPI_SUCCESS) return 0;
    if (topo == MPI_CART) {
        int dims = 0;
        if (PMPI_Cartdim_get(comm, &dims) == MPI_SUCCESS) n = 2 * dims;
    } else if (topo == MPI_GRAPH) {
        int rank = 0;
        if (PMPI_Comm_rank(comm, &rank) != MPI_SUCCESS || PMPI_Graph_neighbors_count(comm, rank, &n) != MPI_SUCCESS)
            n = 0;
    } else if (topo == MPI_DIST_GRAPH) {
        int in = 0, weighted = 0;
        if (PMPI_Dist_graph_neighbors_count(comm, &in, &n, &weighted) != MPI_SUCCESS) n = 0;
    }
    return n;
}

void *cm_next(const char *name, void *fallback) {
    void *next = dlsym(RTLD_NEXT, name);
    return next != NULL ? next : fallback;
}

/* Requests whose later calls record something: a table, open addressing on the handle's bits, of
 * - persistent sends (MPI_Send_init and its kin) with their message (the destination's rank in MPI_COMM_WORLD,
 *   the bytes): each MPI_Start of one is its message-send event;
 * - persistent collectives (MPI_Allreduce_init...) with their bytes and the counter they go to, added at each
 *   MPI_Start;
 * - receives (MPI_Irecv, MPI_Recv_init, MPI_File_iread...) with the counter their bytes go to, from the status
 *   at their completion in a wait or a test.
 * A persistent request is there from the call that made it to its MPI_Request_free, a receive to its completion.
 * Past CM_PERSISTENT requests at once, the others are not counted, said once. */
#define CM_PERSISTENT 4096
enum { CM_EMPTY, CM_USED, CM_GONE };
struct cm_entry {
    uint64_t key;
    int state;
    int world; /* a send's destination; -1 for a collective */
    int counter; /* the wrapped call whose byte counter its starts or its completions add to; -1 for a send */
    int receive; /* 0: a send or a collective; CM_ONCE or CM_PERSISTENT_RECEIVE: a receive */
    uint64_t bytes;
};
static struct cm_entry cm_persistent[CM_PERSISTENT];
/* Slots whose request left the table (CM_GONE). A lookup of a request the table does not hold (a send's, in a
 * wait) probes until an empty slot: past a quarter of tombstones the table is rebuilt without them. */
static int cm_tombstones = 0;
enum { CM_ONCE = 1, CM_PERSISTENT_RECEIVE = 2 };
int cm_receives_pending = 0;
static pthread_mutex_t cm_persistent_lock = PTHREAD_MUTEX_INITIALIZER;
static int cm_persistent_full_said = 0;

static uint64_t cm_request_key(MPI_Request request) {
    uint64_t key = 0;
    memcpy(&key, &request, sizeof request < sizeof key ? sizeof request : sizeof key);
    return key;
}

/* The slot of KEY, or where it would go (a free one, preferring the first tombstone); -1 when the table holds
 * neither. Called with the lock held. */
static int cm_slot(uint64_t key, int *free_slot) {
    size_t at = (size_t)((key * 0x9E3779B97F4A7C15ull) >> 52) % CM_PERSISTENT;
    *free_slot = -1;
    for (int probe = 0; probe < CM_PERSISTENT; probe++, at = (at + 1) % CM_PERSISTENT) {
        if (cm_persistent[at].state == CM_USED && cm_persistent[at].key == key) return (int)at;
        if (cm_persistent[at].state != CM_USED && *free_slot < 0) *free_slot = (int)at;
        if (cm_persistent[at].state == CM_EMPTY) break;
    }
    return -1;
}

/* Takes the slot AT out of the table. Called with the lock held. */
static void cm_drop(int at) {
    if (cm_persistent[at].receive) __atomic_sub_fetch(&cm_receives_pending, 1, __ATOMIC_RELAXED);
    cm_persistent[at].state = CM_GONE;
    cm_tombstones++;
}

/* Rebuilds the table with its requests only, every other slot empty. Called with the lock held. */
static void cm_compact(void) {
    static struct cm_entry kept[CM_PERSISTENT];
    int n = 0, free_slot;
    for (int i = 0; i < CM_PERSISTENT; i++)
        if (cm_persistent[i].state == CM_USED) kept[n++] = cm_persistent[i];
    memset(cm_persistent, 0, sizeof cm_persistent);
    for (int i = 0; i < n; i++) {
        (void)cm_slot(kept[i].key, &free_slot);
        cm_persistent[free_slot] = kept[i];
    }
    cm_tombstones = 0;
}

/* Remembers REQUEST with WORLD (a send), or COUNTER (a collective, a receive) and BYTES. */
static void cm_remember(MPI_Request request, int world, int counter, int receive, uint64_t bytes) {
    int at, free_slot;
    uint64_t key = cm_request_key(request);
    pthread_mutex_lock(&cm_persistent_lock);
    if (cm_tombstones > CM_PERSISTENT / 4) cm_compact();
    at = cm_slot(key, &free_slot);
    if (at >= 0)
        cm_drop(at);
    else
        at = free_slot;
    if (at >= 0) {
        if (cm_persistent[at].state == CM_GONE) cm_tombstones--;
        cm_persistent[at].key = key;
        cm_persistent[at].state = CM_USED;
        cm_persistent[at].world = world;
        cm_persistent[at].counter = counter;
        cm_persistent[at].receive = receive;
        cm_persistent[at].bytes = bytes;
        if (receive) __atomic_add_fetch(&cm_receives_pending, 1, __ATOMIC_RELAXED);
    } else if (!cm_persistent_full_said) {
        cm_persistent_full_said = 1;
        fprintf(stderr, "canopy-mpi: more than %d requests to follow at once; the starts and completions of the "
                        "others are not counted\n", CM_PERSISTENT);
    }
    pthread_mutex_unlock(&cm_persistent_lock);
}

void cm_persist(MPI_Request request, int dest, int64_t count, MPI_Datatype type, MPI_Comm comm) {
    int world;
    if (dest == MPI_PROC_NULL || dest < 0) return;
    world = comm == MPI_COMM_WORLD ? dest : cm_world_rank(comm, dest);
    if (world < 0) return;
    cm_remember(request, world, -1, 0, cm_bytes(count, type));
}

void cm_persist_bytes(MPI_Request request, int k, uint64_t bytes) {
    cm_remember(request, -1, k, 0, bytes);
}

void cm_track_receive(MPI_Request request, int k, int persistent) {
    if (request == MPI_REQUEST_NULL) return;
    cm_remember(request, -1, k, persistent ? CM_PERSISTENT_RECEIVE : CM_ONCE, 0);
}

void cm_completed(const MPI_Request *requests, const int *indices, int n, const MPI_Status *statuses) {
    pthread_mutex_lock(&cm_persistent_lock);
    for (int i = 0; i < n; i++) {
        MPI_Request request = requests[indices != NULL ? indices[i] : i];
        int at, free_slot, got = 0;
        if (request == MPI_REQUEST_NULL) continue;
        at = cm_slot(cm_request_key(request), &free_slot);
        if (at < 0 || !cm_persistent[at].receive) continue;
        if (PMPI_Get_count(&statuses[i], MPI_BYTE, &got) == MPI_SUCCESS && got > 0 && got != MPI_UNDEFINED)
            cm_add_bytes(cm_persistent[at].counter, (uint64_t)got);
        if (cm_persistent[at].receive == CM_ONCE) cm_drop(at);
    }
    pthread_mutex_unlock(&cm_persistent_lock);
}

void cm_start(MPI_Request request) {
    int at, free_slot, world = -1, counter = -1;
    uint64_t bytes = 0;
    pthread_mutex_lock(&cm_persistent_lock);
    at = cm_slot(cm_request_key(request), &free_slot);
    if (at >= 0) {
        world = cm_persistent[at].world;
        counter = cm_persistent[at].counter;
        bytes = cm_persistent[at].bytes;
    }
    pthread_mutex_unlock(&cm_persistent_lock);
    if (world >= 0)
        canopy_send(world, bytes);
    else if (counter >= 0)
        cm_add_bytes(counter, bytes);
}

void cm_forget(MPI_Request request) {
    int at, free_slot;
    pthread_mutex_lock(&cm_persistent_lock);
    at = cm_slot(cm_request_key(request), &free_slot);
    if (at >= 0) cm_drop(at);
    pthread_mutex_unlock(&cm_persistent_lock);
}
