/* wrap_fortran.h: what the Fortran wrappers need beyond wrap.h. Fortran passes every argument by reference,
 * handles as MPI_Fint, and MPI_IN_PLACE and MPI_STATUS_IGNORE as the addresses of the MPI library's own
 * variables. */
#ifndef CANOPY_MPI_WRAP_FORTRAN_H
#define CANOPY_MPI_WRAP_FORTRAN_H

#include "wrap.h"

_Static_assert(sizeof(MPI_Fint) == sizeof(int), "Fortran count arrays are read as int arrays");

#ifdef OPEN_MPI
/* Open MPI's Fortran MPI_IN_PLACE: the address of this common block. */
extern int mpi_fortran_in_place_ __attribute__((weak));
#endif

static inline int cm_f_in_place(const void *buf) {
#ifdef OPEN_MPI
    return &mpi_fortran_in_place_ != NULL && buf == (const void *)&mpi_fortran_in_place_;
#else
    (void)buf;
    return 0;
#endif
}

static inline int cm_f_status_ignore(const void *status) {
    return status == (const void *)MPI_F_STATUS_IGNORE;
}

/* cm_sumw_bytes for Fortran's arguments: the types are handles to convert one by one. */
static inline uint64_t cm_f_sumw_bytes(const MPI_Fint *counts, const MPI_Fint *types, int n) {
    uint64_t total = 0;
#ifndef OPEN_MPI
    /* Only Open MPI's Fortran MPI_IN_PLACE is recognized (cm_f_in_place): elsewhere the counts and types may be
     * the dummies an in-place call passes, so no bytes are read from them. */
    return 0;
#endif
    if (counts == NULL || types == NULL) return 0;
    for (int i = 0; i < n; i++) total += cm_bytes(counts[i], PMPI_Type_f2c(types[i]));
    return total;
}

/* A Fortran entry point was called but the MPI library's Fortran bindings are not loaded. */
static inline void cm_no_fortran(const char *name) {
    fprintf(stderr, "canopy-mpi: %s was called but the MPI library's p%s is not loaded\n", name, name);
}

#endif /* CANOPY_MPI_WRAP_FORTRAN_H */
