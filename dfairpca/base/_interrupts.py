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
import sys
import threading
from collections.abc import Iterator

#: seconds after a dropped Ctrl-C that it is delivered again: long enough for the callback
#: that dropped it to have returned, short beside a person's reaction
REDELIVER_SECONDS = 0.01


@contextlib.contextmanager
def ctrl_c_kept() -> Iterator[None]:
    """Within the block, a KeyboardInterrupt that Python could only report as unraisable
    (raised in a gc callback, a finalizer or a weakref callback) is raised again by the
    SIGINT handler at the next point where it can propagate.  Nestable; the previous
    ``sys.unraisablehook`` handles everything else.

    Yields
    ------
    None
    """
    previous = sys.unraisablehook

    def hook(unraisable) -> None:
        if unraisable.exc_type is not None and issubclass(unraisable.exc_type, KeyboardInterrupt):
            # SIGINT tripped again from another thread, shortly: tripped here, its handler
            # would run before this hook returns and raise into the hook (dropped again).
            # Should it land in another such callback, this hook runs again.  A SIGINT that
            # Python does not handle (SIG_IGN, SIG_DFL) is left as it is.
            timer = threading.Timer(REDELIVER_SECONDS, _thread.interrupt_main)
            timer.daemon = True
            timer.start()
            return
        previous(unraisable)

    sys.unraisablehook = hook
    try:
        yield
    finally:
        if sys.unraisablehook is hook:  # else a later hook was installed: leave it be
            sys.unraisablehook = previous
