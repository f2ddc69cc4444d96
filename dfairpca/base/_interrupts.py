"""A Ctrl-C that Python would drop is delivered again.

Python raises a signal's KeyboardInterrupt in whatever Python code the main thread runs
next.  When that code is a garbage-collector callback (distributed's scheduler and workers
install one), a ``__del__`` method or a weakref callback, Python cannot propagate it: it
reports it as "Exception ignored in ..." and goes on as if no Ctrl-C had come.  A busy
machine makes that window wide (a collection's callbacks take longer), and a command then
runs on after the Ctrl-C.  Inside :func:`ctrl_c_kept` such a KeyboardInterrupt is not
reported: the SIGINT handler runs again, so the interrupt surfaces in ordinary code.
"""

from __future__ import annotations

import _thread
import contextlib
import queue
import sys
import threading
import time
from collections.abc import Iterator

#: seconds after a dropped Ctrl-C that it is delivered again: long enough for the callback
#: that dropped it to have returned, short beside a person's reaction
REDELIVER_SECONDS = 0.01

# One hook for the process however many blocks (in however many threads) are open: installed
# when the first opens, the previous one put back when the last closes.  The hook only puts
# on a SimpleQueue (safe inside a finalizer or a gc callback, where starting a thread is not);
# a daemon thread, started outside any callback, trips SIGINT again.
_LOCK = threading.Lock()
_state: dict = {"depth": 0, "previous": None, "pending": 0, "thread": None}
_REQUESTS: queue.SimpleQueue = queue.SimpleQueue()


def _hook(unraisable) -> None:
    if unraisable.exc_type is not None and issubclass(unraisable.exc_type, KeyboardInterrupt):
        # tripped here, SIGINT's handler would run before this hook returns and raise into
        # the hook (dropped again); should the next one land in such a callback too, this
        # hook runs again.  A SIGINT Python does not handle (SIG_IGN, SIG_DFL) stays so.
        _state["pending"] += 1
        _REQUESTS.put(True)
        return
    previous = _state["previous"]
    (previous or sys.__unraisablehook__)(unraisable)


def _redeliver() -> None:
    while True:
        _REQUESTS.get()
        time.sleep(REDELIVER_SECONDS)
        with _LOCK:
            if _state["pending"] and _state["depth"]:
                _state["pending"] -= 1
                _thread.interrupt_main()


@contextlib.contextmanager
def ctrl_c_kept() -> Iterator[None]:
    """Within the block, a KeyboardInterrupt that Python could only report as unraisable
    (raised in a gc callback, a finalizer or a weakref callback) is raised again by the
    SIGINT handler at the next point where it can propagate; one still on its way when
    the block ends is raised as the block ends.  Nestable and usable from several threads
    at once; the previous ``sys.unraisablehook`` handles everything else, and is put back
    when the last open block ends.

    Yields
    ------
    None
    """
    with _LOCK:
        if _state["depth"] == 0:
            _state["previous"], _state["pending"] = sys.unraisablehook, 0
            sys.unraisablehook = _hook
        _state["depth"] += 1
        if _state["thread"] is None:
            redeliverer = threading.Thread(target=_redeliver, name="dfairpca-ctrl-c", daemon=True)
            redeliverer.start()
            _state["thread"] = redeliverer
    interrupted = False
    try:
        yield
    except KeyboardInterrupt:
        interrupted = True
        raise
    finally:
        with _LOCK:
            _state["depth"] -= 1
            undelivered = _state["pending"] if _state["depth"] == 0 else 0
            if _state["depth"] == 0:
                _state["pending"] = 0
                if sys.unraisablehook is _hook:  # else a later hook was installed: leave it be
                    sys.unraisablehook = _state["previous"]
                _state["previous"] = None
        if undelivered and not interrupted and sys.exc_info()[0] is None:
            raise KeyboardInterrupt
