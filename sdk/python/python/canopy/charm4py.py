"""Canopy for charm4py programs, with no other change to them.

One line before ``charm.start(...)``::

    import canopy.charm4py

or, for a program left as it is::

    python -m charmrun.start +p4 -m canopy.charm4py app.py ARGS

Each PE is a rank (``charm.myPe()`` of ``charm.numPes()``), the application the program's name. Each entry
method is the activity ``Class::method``, timed around each execution; a coroutine entry method (``@coro``) is
timed until it first waits, and what it runs after it resumes is timed with the entry method that resumed it.
The PE's time outside entry methods is the activity ``Idle``: charm4py's scheduler is Charm++'s, in C, so
Python sees only the gaps between entry methods, which include the runtime's own message handling. Rounds are
time rounds (``CANOPY_DUMP_PERIOD_MS``, 1000 unless set); the last one is taken when the process exits.
"""

import os
import runpy
import sys

import canopy
from canopy import _canopy

try:
    from charm4py import charm
    from charm4py import entry_method as _entry_method
except ImportError as e:  # pragma: no cover - said plainly to the user
    raise ImportError(f"canopy.charm4py needs charm4py (pip install charm4py): {e}") from e

_state = {"started": False, "depth": 0, "idle": False}


def _start():
    """Starts the SDK on this PE at its first entry method, when charm4py knows the PE."""
    if _state["started"]:
        return
    _state["started"] = True
    os.environ.setdefault("CANOPY_DUMP_PERIOD_MS", "1000")
    app = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "charm4py"
    try:
        canopy.init(app, charm.myPe(), charm.numPes())
    except canopy.CanopyError as e:
        print(f"canopy: PE {charm.myPe()} is not monitored: {e}", file=sys.stderr)


def _timed(run, name):
    timer = canopy.timer(name)

    def run_timed(obj, header, args, ret_fut=False):
        _start()
        state = _state
        if state["depth"] == 0 and state["idle"]:
            state["idle"] = False
            _canopy.idle_end()
        state["depth"] += 1
        timer.start()
        try:
            return run(obj, header, args, ret_fut=ret_fut)
        finally:
            timer.stop()
            state["depth"] -= 1
            if state["depth"] == 0:
                state["idle"] = True
                _canopy.idle_begin()

    return run_timed


def _install():
    original = _entry_method.EntryMethod.__init__
    if getattr(original, "_canopy", False):
        return

    def __init__(self, C, name, *args, **kwargs):
        original(self, C, name, *args, **kwargs)
        self.run = _timed(self.run, f"{C.__name__}::{name}")

    __init__._canopy = True
    _entry_method.EntryMethod.__init__ = __init__


_install()


def main(argv=None):
    """``python -m canopy.charm4py app.py ARGS``: runs app.py with its entry methods monitored."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv:
        sys.exit("usage: python -m canopy.charm4py app.py [ARGS...]")
    sys.argv = argv
    runpy.run_path(argv[0], run_name="__main__")


if __name__ == "__main__":
    main()
