! stencil.f90: a 2-D Jacobi stencil over MPI, instrumented with Canopy's Fortran module.
!
! The grid of N x N points is split by columns among the ranks. Each iteration exchanges its halo columns with
! the neighbouring ranks (MPI_Sendrecv), sweeps its block and computes the global residual (MPI_Allreduce), each
! under its own timer inside "iteration"; it counts the bytes it sent ("bytes_exchanged"), reports each message
! as a message-send event, and dumps its profile. canopy_finalize runs before MPI_Finalize.
!
!   mpirun -np 4 ./stencil [ITERATIONS [N]]      defaults: 100 iterations, N = 256
program stencil
    use mpi
    use canopy
    use, intrinsic :: iso_fortran_env, only: real64, int64, error_unit
    implicit none

    integer :: iterations, n, ierr, rank, nranks, up, down, first, cols, it, neighbours
    integer :: status(MPI_STATUS_SIZE)
    real(real64), allocatable :: a(:, :), b(:, :)
    real(real64) :: local, residual, t0, elapsed
    character(len=16) :: seconds, resid
    integer(int64) :: message_bytes
    type(canopy_timer_t) :: t_iter, t_halo, t_sweep, t_resid

    call MPI_Init(ierr)
    call MPI_Comm_rank(MPI_COMM_WORLD, rank, ierr)
    call MPI_Comm_size(MPI_COMM_WORLD, nranks, ierr)
    iterations = int_arg(1, 100)
    n = int_arg(2, 256)
    if (iterations < 0 .or. n < nranks .or. n < 4) then
        if (rank == 0) write (error_unit, '(a)') 'usage: stencil [ITERATIONS [N (>= 4, >= ranks)]]'
        call MPI_Finalize(ierr)
        stop 2
    end if

    ! The rank and size from MPI itself, rather than the launcher's environment.
    call canopy_init('stencil', rank, nranks, ierr)
    if (ierr /= CANOPY_OK) then
        write (error_unit, '(a)') 'stencil: canopy_init: ' // canopy_last_error() // ' (running without monitoring)'
    end if
    t_iter = canopy_timer('iteration')
    t_halo = canopy_timer('halo_exchange')
    t_sweep = canopy_timer('sweep')
    t_resid = canopy_timer('residual')

    ! This rank's columns first .. first + cols - 1 of 1 .. n, with a ghost column on each side; rows 0 and n + 1
    ! are the fixed edges. The first rank's left ghost column is the hot edge.
    cols = n / nranks
    first = rank * cols + min(rank, mod(n, nranks)) + 1
    if (rank < mod(n, nranks)) cols = cols + 1
    allocate (a(0:n + 1, 0:cols + 1), b(0:n + 1, 0:cols + 1))
    a = 0.0_real64
    if (rank == 0) a(:, 0) = 1.0_real64
    b = a
    up = MPI_PROC_NULL
    down = MPI_PROC_NULL
    if (rank > 0) up = rank - 1
    if (rank < nranks - 1) down = rank + 1
    neighbours = count([up, down] /= MPI_PROC_NULL)
    message_bytes = int(n, int64) * storage_size(a) / 8

    t0 = MPI_Wtime()
    residual = 0.0_real64
    do it = 1, iterations
        call canopy_start(t_iter)

        call canopy_start(t_halo)
        call MPI_Sendrecv(a(1:n, 1), n, MPI_DOUBLE_PRECISION, up, 0, &
                          a(1:n, cols + 1), n, MPI_DOUBLE_PRECISION, down, 0, MPI_COMM_WORLD, status, ierr)
        call MPI_Sendrecv(a(1:n, cols), n, MPI_DOUBLE_PRECISION, down, 1, &
                          a(1:n, 0), n, MPI_DOUBLE_PRECISION, up, 1, MPI_COMM_WORLD, status, ierr)
        if (up /= MPI_PROC_NULL) call canopy_send(up, message_bytes)
        if (down /= MPI_PROC_NULL) call canopy_send(down, message_bytes)
        call canopy_counter('bytes_exchanged', neighbours * message_bytes)
        call canopy_stop(t_halo)

        call canopy_start(t_sweep)
        b(1:n, 1:cols) = 0.25_real64 * (a(0:n - 1, 1:cols) + a(2:n + 1, 1:cols) &
                                         + a(1:n, 0:cols - 1) + a(1:n, 2:cols + 1))
        call canopy_stop(t_sweep)

        call canopy_start(t_resid)
        local = sum((b(1:n, 1:cols) - a(1:n, 1:cols))**2)
        call MPI_Allreduce(local, residual, 1, MPI_DOUBLE_PRECISION, MPI_SUM, MPI_COMM_WORLD, ierr)
        a(1:n, 1:cols) = b(1:n, 1:cols)
        call canopy_stop(t_resid)

        call canopy_stop(t_iter)
        call canopy_dump()
    end do
    elapsed = MPI_Wtime() - t0

    call canopy_finalize(ierr)
    if (ierr /= CANOPY_OK) write (error_unit, '(a)') 'stencil: canopy_finalize: ' // canopy_last_error()
    if (rank == 0) then
        write (seconds, '(f16.6)') elapsed
        write (resid, '(es13.6)') residual
        write (*, '(a, i0, a, i0, a, i0, a, i0, a)') 'stencil: ', iterations, ' iterations of ', n, 'x', n, ' on ', &
            nranks, ' ranks in ' // trim(adjustl(seconds)) // ' s, residual ' // trim(adjustl(resid))
    end if
    call MPI_Finalize(ierr)

contains

    ! The i-th command-line argument as an integer, or the default when it is absent.
    integer function int_arg(i, default) result(v)
        integer, intent(in) :: i, default
        character(len=32) :: s
        integer :: length, stat
        v = default
        call get_command_argument(i, s, length)
        if (length == 0) return
        read (s, *, iostat=stat) v
        if (stat /= 0) v = -1
    end function int_arg

end program stencil
