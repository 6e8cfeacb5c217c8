! canopy.f90: the Fortran interface of Canopy's application SDK, a module over libcanopy (canopy.h).
!
! A rank times regions and counts things, and offloads a profile to its node's leaf agent at every dump, while
! the application runs. Strings are handled here: names are trimmed and NUL-terminated for the C library, and
! canopy_last_error() comes back as an allocatable Fortran string. No C type appears in the interface.
!
! Compile this file with the Fortran compiler of the application (a .mod file is specific to its compiler and
! version), then link with -lcanopy:
!
!   mpif90 -c $(pkg-config --variable=includedir canopy)/canopy.f90
!   mpif90 app.f90 canopy.o $(pkg-config --libs canopy)
!
! Calls that can fail take an optional ierr, as MPI's do: CANOPY_OK or a negative code. Without ierr a failure
! is silent (Canopy never stops the application) and canopy_last_error() still says what happened.
!
!   use canopy
!   type(canopy_timer_t) :: sweep
!   call canopy_init('stencil', ierr=ierr)       ! rank and size from the launcher's environment
!   sweep = canopy_timer('sweep')                ! the same name gives the same timer
!   do it = 1, n
!       call canopy_start(sweep)
!       ...
!       call canopy_stop(sweep)
!       call canopy_counter('bytes_exchanged', 4096.0d0)
!       call canopy_dump()                       ! queues a snapshot and returns
!   end do
!   call canopy_finalize(ierr)                   ! ships the rest, FIN, waits for FINACK (bounded)
module canopy
    use, intrinsic :: iso_c_binding, only: c_char, c_int, c_double, c_ptr, c_size_t, c_int64_t, &
        c_null_char, c_null_ptr, c_associated, c_f_pointer
    use, intrinsic :: iso_fortran_env, only: int32, int64, real32, real64
    implicit none
    private

    ! Return codes: CANOPY_OK on success, one of the others on failure (canopy_last_error() says more).
    integer, parameter, public :: CANOPY_OK = 0
    integer, parameter, public :: CANOPY_EINVAL = -1        ! a bad argument or environment variable
    integer, parameter, public :: CANOPY_ESTATE = -2        ! not initialized, initialized twice, or finalized
    integer, parameter, public :: CANOPY_EDROPPED = -3      ! the dump was dropped (queue full); it is counted
    integer, parameter, public :: CANOPY_EUNDELIVERED = -4  ! finalize: some dumps never reached an agent
    integer, parameter, public :: CANOPY_ETIMEOUT = -5      ! finalize: no FINACK from the agent in time

    ! A timer's handle, from canopy_timer(name); valid until the program exits. A handle that was never set, or
    ! that canopy_timer could not make, is ignored by canopy_start and canopy_stop.
    type, public :: canopy_timer_t
        private
        type(c_ptr) :: ptr = c_null_ptr
    end type canopy_timer_t

    public :: canopy_init, canopy_timer, canopy_start, canopy_stop
    public :: canopy_activity, canopy_begin, canopy_end, canopy_send, canopy_idle_begin, canopy_idle_end
    public :: canopy_counter, canopy_counter_id, canopy_count
    public :: canopy_step_start, canopy_step_stop
    public :: canopy_dump, canopy_finalize, canopy_last_error, canopy_stats

    ! Message-send events: the size in bytes as a default or an 8-byte integer.
    interface canopy_send
        module procedure send_int32, send_int64
    end interface canopy_send

    ! Counters take real or integer values of either size.
    interface canopy_counter
        module procedure counter_real64, counter_real32, counter_int32, counter_int64
    end interface canopy_counter

    interface canopy_count
        module procedure count_real64, count_real32, count_int32, count_int64
    end interface canopy_count

    ! The C library (canopy.h). Private: the public procedures below wrap them.
    interface
        function c_init(app, rank, nranks) bind(C, name='canopy_init')
            import :: c_char, c_int
            character(kind=c_char), dimension(*), intent(in) :: app
            integer(c_int), value :: rank, nranks
            integer(c_int) :: c_init
        end function c_init

        function c_timer_get(name) bind(C, name='canopy_timer_get')
            import :: c_char, c_ptr
            character(kind=c_char), dimension(*), intent(in) :: name
            type(c_ptr) :: c_timer_get
        end function c_timer_get

        subroutine c_start(t) bind(C, name='canopy_start')
            import :: c_ptr
            type(c_ptr), value :: t
        end subroutine c_start

        subroutine c_stop(t) bind(C, name='canopy_stop')
            import :: c_ptr
            type(c_ptr), value :: t
        end subroutine c_stop

        function c_activity(name) bind(C, name='canopy_activity')
            import :: c_char, c_int
            character(kind=c_char), dimension(*), intent(in) :: name
            integer(c_int) :: c_activity
        end function c_activity

        subroutine c_begin(id) bind(C, name='canopy_begin')
            import :: c_int
            integer(c_int), value :: id
        end subroutine c_begin

        subroutine c_end(id) bind(C, name='canopy_end')
            import :: c_int
            integer(c_int), value :: id
        end subroutine c_end

        subroutine c_send(dest, bytes) bind(C, name='canopy_send')
            import :: c_int, c_int64_t
            integer(c_int), value :: dest
            integer(c_int64_t), value :: bytes
        end subroutine c_send

        subroutine c_idle_begin() bind(C, name='canopy_idle_begin')
        end subroutine c_idle_begin

        subroutine c_idle_end() bind(C, name='canopy_idle_end')
        end subroutine c_idle_end

        function c_step_start(key, step) bind(C, name='canopy_step_start')
            import :: c_char, c_int, c_int64_t
            character(kind=c_char), dimension(*), intent(in) :: key
            integer(c_int64_t), value :: step
            integer(c_int) :: c_step_start
        end function c_step_start

        function c_step_stop(key, step) bind(C, name='canopy_step_stop')
            import :: c_char, c_int, c_int64_t
            character(kind=c_char), dimension(*), intent(in) :: key
            integer(c_int64_t), value :: step
            integer(c_int) :: c_step_stop
        end function c_step_stop

        subroutine c_counter(name, value) bind(C, name='canopy_counter')
            import :: c_char, c_double
            character(kind=c_char), dimension(*), intent(in) :: name
            real(c_double), value :: value
        end subroutine c_counter

        function c_counter_id(name) bind(C, name='canopy_counter_id')
            import :: c_char, c_int
            character(kind=c_char), dimension(*), intent(in) :: name
            integer(c_int) :: c_counter_id
        end function c_counter_id

        subroutine c_count(counter, value) bind(C, name='canopy_count')
            import :: c_int, c_double
            integer(c_int), value :: counter
            real(c_double), value :: value
        end subroutine c_count

        function c_dump() bind(C, name='canopy_dump')
            import :: c_int
            integer(c_int) :: c_dump
        end function c_dump

        function c_finalize() bind(C, name='canopy_finalize')
            import :: c_int
            integer(c_int) :: c_finalize
        end function c_finalize

        function c_last_error() bind(C, name='canopy_last_error')
            import :: c_ptr
            type(c_ptr) :: c_last_error
        end function c_last_error

        function c_stats(dumps, dropped, delivered) bind(C, name='canopy_stats')
            import :: c_int, c_int64_t
            integer(c_int64_t), intent(out) :: dumps, dropped, delivered
            integer(c_int) :: c_stats
        end function c_stats

        function c_strlen(s) bind(C, name='strlen')
            import :: c_ptr, c_size_t
            type(c_ptr), value :: s
            integer(c_size_t) :: c_strlen
        end function c_strlen
    end interface

contains

    ! A Fortran string as the C library takes it: trailing blanks trimmed, NUL-terminated.
    pure function c_string(s) result(c)
        character(len=*), intent(in) :: s
        character(kind=c_char, len=len_trim(s) + 1) :: c
        c = trim(s) // c_null_char
    end function c_string

    subroutine set_ierr(ierr, rc)
        integer, intent(out), optional :: ierr
        integer(c_int), intent(in) :: rc
        if (present(ierr)) ierr = int(rc)
    end subroutine set_ierr

    ! Starts the SDK. app: the application's name (blank: the program's name). rank and nranks, when absent or
    ! negative, come from the launcher's environment (CANOPY_RANK, PMI_RANK, OMPI_COMM_WORLD_RANK, SLURM_PROCID,
    ! ... and the matching sizes); a process with none is rank 0 of 1. Returns at once.
    subroutine canopy_init(app, rank, nranks, ierr)
        character(len=*), intent(in) :: app
        integer, intent(in), optional :: rank, nranks
        integer, intent(out), optional :: ierr
        integer(c_int) :: r, n
        r = -1
        n = -1
        if (present(rank)) r = int(rank, c_int)
        if (present(nranks)) n = int(nranks, c_int)
        call set_ierr(ierr, c_init(c_string(app), r, n))
    end subroutine canopy_init

    ! The timer of this name, made on first use; the same name gives the same timer. Timers work before
    ! canopy_init. On a bad name the handle does nothing and canopy_last_error() says why.
    function canopy_timer(name) result(t)
        character(len=*), intent(in) :: name
        type(canopy_timer_t) :: t
        t%ptr = c_timer_get(c_string(name))
    end function canopy_timer

    ! Starts and stops a timer on the calling thread. Timers nest: a stop must match the timer started last on
    ! the thread (another stop is ignored). Inclusive time counts once for recursive calls.
    subroutine canopy_start(t)
        type(canopy_timer_t), intent(in) :: t
        call c_start(t%ptr)
    end subroutine canopy_start

    subroutine canopy_stop(t)
        type(canopy_timer_t), intent(in) :: t
        call c_stop(t%ptr)
    end subroutine canopy_stop

    ! The id of the activity of this name (the same event as the timer of that name), registered on first use:
    ! >= 0, or a negative code on error. canopy_begin and canopy_end take it; a negative id is ignored.
    function canopy_activity(name) result(id)
        character(len=*), intent(in) :: name
        integer :: id
        id = int(c_activity(c_string(name)))
    end function canopy_activity

    subroutine canopy_begin(id)
        integer, intent(in) :: id
        call c_begin(int(id, c_int))
    end subroutine canopy_begin

    subroutine canopy_end(id)
        integer, intent(in) :: id
        call c_end(int(id, c_int))
    end subroutine canopy_end

    ! A message of this many bytes sent to rank dest (a negative size counts as 0).
    subroutine send_int32(dest, bytes)
        integer, intent(in) :: dest
        integer(int32), intent(in) :: bytes
        call c_send(int(dest, c_int), int(max(bytes, 0_int32), c_int64_t))
    end subroutine send_int32

    subroutine send_int64(dest, bytes)
        integer, intent(in) :: dest
        integer(int64), intent(in) :: bytes
        call c_send(int(dest, c_int), int(max(bytes, 0_int64), c_int64_t))
    end subroutine send_int64

    ! The calling thread waits (for a message, at a barrier) until canopy_idle_end.
    subroutine canopy_idle_begin()
        call c_idle_begin()
    end subroutine canopy_idle_begin

    subroutine canopy_idle_end()
        call c_idle_end()
    end subroutine canopy_idle_end

    ! Adds value to the counter of this name (bytes sent, cache misses...).
    ! Marks the start of step `step` of the workflow key `key` now (see canopy_step_start in canopy.h); ierr, when
    ! given, gets 0 or a negative code.
    subroutine canopy_step_start(key, step, ierr)
        character(len=*), intent(in) :: key
        integer(int64), intent(in) :: step
        integer, intent(out), optional :: ierr
        integer(c_int) :: rc
        rc = c_step_start(c_string(key), int(step, c_int64_t))
        if (present(ierr)) ierr = int(rc)
    end subroutine canopy_step_start

    ! Marks the end of step `step` of `key` now (see canopy_step_stop in canopy.h).
    subroutine canopy_step_stop(key, step, ierr)
        character(len=*), intent(in) :: key
        integer(int64), intent(in) :: step
        integer, intent(out), optional :: ierr
        integer(c_int) :: rc
        rc = c_step_stop(c_string(key), int(step, c_int64_t))
        if (present(ierr)) ierr = int(rc)
    end subroutine canopy_step_stop

    subroutine counter_real64(name, value)
        character(len=*), intent(in) :: name
        real(real64), intent(in) :: value
        call c_counter(c_string(name), real(value, c_double))
    end subroutine counter_real64

    subroutine counter_real32(name, value)
        character(len=*), intent(in) :: name
        real(real32), intent(in) :: value
        call c_counter(c_string(name), real(value, c_double))
    end subroutine counter_real32

    subroutine counter_int32(name, value)
        character(len=*), intent(in) :: name
        integer(int32), intent(in) :: value
        call c_counter(c_string(name), real(value, c_double))
    end subroutine counter_int32

    subroutine counter_int64(name, value)
        character(len=*), intent(in) :: name
        integer(int64), intent(in) :: value
        call c_counter(c_string(name), real(value, c_double))
    end subroutine counter_int64

    ! The id of the counter of this name, for canopy_count in a hot loop (no string is passed per call):
    ! >= 0, or a negative code on error.
    function canopy_counter_id(name) result(id)
        character(len=*), intent(in) :: name
        integer :: id
        id = int(c_counter_id(c_string(name)))
    end function canopy_counter_id

    ! Adds value to the counter with this id (from canopy_counter_id); a negative id is ignored.
    subroutine count_real64(counter, value)
        integer, intent(in) :: counter
        real(real64), intent(in) :: value
        call c_count(int(counter, c_int), real(value, c_double))
    end subroutine count_real64

    subroutine count_real32(counter, value)
        integer, intent(in) :: counter
        real(real32), intent(in) :: value
        call c_count(int(counter, c_int), real(value, c_double))
    end subroutine count_real32

    subroutine count_int32(counter, value)
        integer, intent(in) :: counter
        integer(int32), intent(in) :: value
        call c_count(int(counter, c_int), real(value, c_double))
    end subroutine count_int32

    subroutine count_int64(counter, value)
        integer, intent(in) :: counter
        integer(int64), intent(in) :: value
        call c_count(int(counter, c_int), real(value, c_double))
    end subroutine count_int64

    ! Offloads this round's profile: round k is the rank's k-th dump. Never blocks.
    subroutine canopy_dump(ierr)
        integer, intent(out), optional :: ierr
        call set_ierr(ierr, c_dump())
    end subroutine canopy_dump

    ! Ships what is queued, sends FIN and waits for the agent's FINACK, up to CANOPY_FINALIZE_TIMEOUT_MS. Call it
    ! before MPI_Finalize. Without an agent it returns CANOPY_EUNDELIVERED at once.
    subroutine canopy_finalize(ierr)
        integer, intent(out), optional :: ierr
        call set_ierr(ierr, c_finalize())
    end subroutine canopy_finalize

    ! The message of the last failed call on this thread ('' if none).
    function canopy_last_error() result(msg)
        character(len=:), allocatable :: msg
        type(c_ptr) :: p
        character(kind=c_char), dimension(:), pointer :: chars
        integer :: n, i
        p = c_last_error()
        if (.not. c_associated(p)) then
            msg = ''
            return
        end if
        n = int(c_strlen(p))
        call c_f_pointer(p, chars, [n])
        allocate(character(len=n) :: msg)
        do i = 1, n
            msg(i:i) = chars(i)
        end do
    end function canopy_last_error

    ! The SDK's counts: dumps taken, dropped and delivered to an agent (each optional), and whether it is
    ! connected to an agent now.
    subroutine canopy_stats(dumps, dropped, delivered, connected)
        integer(int64), intent(out), optional :: dumps, dropped, delivered
        logical, intent(out), optional :: connected
        integer(c_int64_t) :: d, x, v
        integer(c_int) :: rc
        rc = c_stats(d, x, v)
        if (present(dumps)) dumps = int(d, int64)
        if (present(dropped)) dropped = int(x, int64)
        if (present(delivered)) delivered = int(v, int64)
        if (present(connected)) connected = rc /= 0
    end subroutine canopy_stats

end module canopy
