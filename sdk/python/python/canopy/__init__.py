"""Canopy's application SDK for Python.

Timers, counters and workflow steps, offloaded each round to the node's Canopy agent (CANOPY_AGENT_SOCKET), as
the C and Rust SDKs do::

    import canopy

    canopy.init()                      # rank from the launcher's environment, or mpi4py's COMM_WORLD

    with canopy.timer("solve"):        # a context manager...
        solve()

    @canopy.timer("exchange")          # ...and a decorator
    def exchange():
        ...

    canopy.counter("bytes_exchanged", 4096)
    canopy.dump()                      # one round; canopy.finalize() runs at interpreter exit

An exception inside a timer stops the timer and propagates. Errors are :class:`CanopyError` with the SDK's
message.
"""

import atexit
import functools
import sys
import threading

from . import _canopy
from ._canopy import CanopyError

__all__ = [
    "CanopyError",
    "counter",
    "dump",
    "finalize",
    "init",
    "step_start",
    "step_stop",
    "timer",
]

_lock = threading.Lock()
_started = False
_finished = False


def _mpi_rank():
    """(rank, size) from mpi4py's COMM_WORLD when the program imported mpi4py, else (None, None)."""
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is None:
        return None, None
    try:
        if not mpi.Is_initialized() or mpi.Is_finalized():
            return None, None
        return mpi.COMM_WORLD.Get_rank(), mpi.COMM_WORLD.Get_size()
    except Exception:  # an MPI that cannot answer: the environment decides
        return None, None


def init(app=None, rank=None, nranks=None):
    """Starts the SDK for this process.

    ``app`` names the application (default: the program's name). ``rank`` and ``nranks`` default to mpi4py's
    ``COMM_WORLD`` when the program uses mpi4py, else to the launcher's environment (CANOPY_RANK, PMI_RANK,
    OMPI_COMM_WORLD_RANK, SLURM_PROCID, ...); a process with none is rank 0 of 1. Returns at once: the agent is
    reached from the SDK's own thread. :func:`finalize` runs at interpreter exit.
    """
    global _started
    if rank is None and nranks is None:
        rank, nranks = _mpi_rank()
    with _lock:
        _canopy.init(app or "", rank, nranks)
        if not _started:
            _started = True
            atexit.register(_finalize_at_exit)


class timer:
    """The timer ``name``: a context manager (``with canopy.timer("solve"):``) and a decorator
    (``@canopy.timer("solve")``). ``start()`` and ``stop()`` time by hand. Timers work before :func:`init`."""

    __slots__ = ("_timer",)

    def __init__(self, name):
        self._timer = _canopy.timer(name)

    @property
    def name(self):
        return self._timer.name

    def start(self):
        self._timer.start()

    def stop(self):
        self._timer.stop()

    def __enter__(self):
        self._timer.start()
        return self

    def __exit__(self, kind, value, traceback):
        # Stopped whatever happened inside; an exception goes on.
        self._timer.stop()
        return False

    def __call__(self, function):
        handle = self._timer

        @functools.wraps(function)
        def timed(*args, **kwargs):
            handle.start()
            try:
                return function(*args, **kwargs)
            finally:
                handle.stop()

        return timed


def counter(name, value):
    """Adds ``value`` to the counter ``name`` on the calling thread."""
    _canopy.counter(name, float(value))


def dump():
    """Offloads this round's profile; the SDK's thread ships it. Does nothing while a dump period is in force."""
    _canopy.dump()


def step_start(key, step):
    """Marks the start of step ``step`` of the workflow key ``key`` on this rank (the latency filter pairs the
    earliest start with the latest stop of each step over the tree)."""
    _canopy.step_start(key, int(step))


def step_stop(key, step):
    """Marks the end of step ``step`` of the workflow key ``key`` on this rank."""
    _canopy.step_stop(key, int(step))


def finalize():
    """Takes the last dump, ships what is queued and waits for the agent's acknowledgement. Runs at interpreter
    exit if the program does not call it."""
    global _finished
    with _lock:
        if _finished:
            return
        _finished = True
    _canopy.finalize()


def stats():
    """The SDK's counts: a dict of dumps taken, dropped and delivered, and stops that matched no start."""
    dumps, dropped, delivered, mismatched = _canopy.stats()
    return {"dumps": dumps, "dropped": dropped, "delivered": delivered, "mismatched_stops": mismatched}


def _finalize_at_exit():
    try:
        finalize()
    except CanopyError as e:
        print(f"canopy: finalize at exit: {e}", file=sys.stderr)
