! ring_mpi.f90: a Fortran MPI program with no Canopy call in it: every iteration passes a value around the ring
! of ranks (MPI_Sendrecv) and sums it over all ranks (MPI_Allreduce). Rank 0 prints every rank's own count of
! those calls and the final sum: the same with or without Canopy's wrapper preloaded.
!
!   ring_mpi [ITERATIONS]      default 100
program ring_mpi
    use mpi
    implicit none
    integer :: ierr, rank, size, it, iterations, next, prev, nargs
    integer :: counts(2)
    integer, allocatable :: all(:)
    double precision :: mine, got, total
    character(len=32) :: arg

    call MPI_Init(ierr)
    call MPI_Comm_rank(MPI_COMM_WORLD, rank, ierr)
    call MPI_Comm_size(MPI_COMM_WORLD, size, ierr)
    iterations = 100
    nargs = command_argument_count()
    if (nargs >= 1) then
        call get_command_argument(1, arg)
        read (arg, *) iterations
    end if
    next = mod(rank + 1, size)
    prev = mod(rank - 1 + size, size)
    mine = rank + 1
    counts = 0
    do it = 1, iterations
        call MPI_Sendrecv(mine, 1, MPI_DOUBLE_PRECISION, next, 0, got, 1, MPI_DOUBLE_PRECISION, prev, 0, &
                          MPI_COMM_WORLD, MPI_STATUS_IGNORE, ierr)
        counts(1) = counts(1) + 1
        mine = 0.5d0 * (mine + got)
        call MPI_Allreduce(mine, total, 1, MPI_DOUBLE_PRECISION, MPI_SUM, MPI_COMM_WORLD, ierr)
        counts(2) = counts(2) + 1
    end do
    allocate (all(2 * size))
    call MPI_Gather(counts, 2, MPI_INTEGER, all, 2, MPI_INTEGER, 0, MPI_COMM_WORLD, ierr)
    if (rank == 0) then
        do it = 0, size - 1
            print '(a,i0,a,i0,a,i0)', 'rank ', it, ': MPI_Sendrecv ', all(2 * it + 1), ' MPI_Allreduce ', all(2 * it + 2)
        end do
        print '(a,es20.12)', 'total ', total
    end if
    call MPI_Finalize(ierr)
end program ring_mpi
