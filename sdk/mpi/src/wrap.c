/* wrap.c: the registration of the wrappers' ids, the start of Canopy at MPI_Init, and the ranks of other
 * communicators in MPI_COMM_WORLD. */
#define _GNU_SOURCE
#include <dlfcn.h>

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

void *cm_next(const char *name, void *fallback) {
    void *next = dlsym(RTLD_NEXT, name);
    return next != NULL ? next : fallback;
}
