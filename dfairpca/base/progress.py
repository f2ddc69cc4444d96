"""Progress of a fit: the pass's bar, then each phase of the solve, to a terminal or a log.

A fit with ``progress=True`` reports on one stream (standard error unless the caller names
another; the command line names its standard output).  What it writes depends on that
stream:

* a terminal: tqdm's bars, redrawn in place, and for each phase of the solve a line that
  says what runs and how long it has run, redrawn every second, so that a long eigensolve
  never leaves the terminal silent;
* anything else (a pipe, a log file, a notebook's captured output): whole lines only, no
  carriage return, a few per phase: the pass at every quarter, a phase when it starts,
  every :data:`HEARTBEAT_SECONDS` while it runs, and when it ends.

The estimators open a report with :func:`reporting` around a fit; the layers below call
:func:`progress_bar` and :func:`phase`, which do nothing when no report is open, so that
the pass and the solvers need no ``progress`` argument of their own for it.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import sys
import threading
import time
from collections.abc import Iterator
from typing import IO

# Deferred imports: tqdm (heavy or optional) is imported in the functions that use it, so that
# importing this module stays light.

__all__ = ["is_terminal", "reporting", "reported", "progress_bar", "phase", "LineBar", "NullBar", "HEARTBEAT_SECONDS"]

#: seconds between the "still running" lines of a phase written to a log (a terminal's line
#: is redrawn every second instead): a few lines per phase of a minute or two
HEARTBEAT_SECONDS = 30.0
#: seconds between the redraws of a terminal's bar or phase line, so that the elapsed time
#: moves even while one step takes long (the issue: a terminal silent for over a minute)
REDRAW_SECONDS = 1.0

_STREAM: contextvars.ContextVar[IO[str] | None] = contextvars.ContextVar("dfairpca_progress",
                                                                        default=None)


def is_terminal(stream) -> bool:
    """Whether ``stream`` is an interactive terminal (False for files, pipes, closed streams)."""
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):
        return False


@contextlib.contextmanager
def reporting(progress: bool, stream: IO[str] | None = None) -> Iterator[None]:
    """Report the bars and phases of what runs inside to ``stream`` if ``progress``.

    Parameters
    ----------
    progress : bool
        Whether to report; False silences the bars and phases inside (an enclosing report
        stays open when ``progress`` is True and ``stream`` None).
    stream : text stream, optional
        Where to write; default the enclosing report's stream, else ``sys.stderr``.

    Yields
    ------
    None
    """
    if not progress:
        token = _STREAM.set(None)
    else:
        token = _STREAM.set(stream or _STREAM.get() or sys.stderr)
    try:
        yield
    finally:
        _STREAM.reset(token)


def reported(method):
    """Decorate an estimator's method: what it runs reports under :func:`reporting` of the
    estimator's ``progress`` parameter (to the enclosing report's stream, if any)."""
    @functools.wraps(method)
    def run(self, *args, **kwargs):
        with reporting(bool(getattr(self, "progress", False))):
            return method(self, *args, **kwargs)
    return run


def _count(n: int, unit: str) -> str:
    """``n`` units in words: "1 block", "2,048 blocks"."""
    return f"{n:,} {unit}" + ("" if n == 1 else "s")


def _elapsed(seconds: float) -> str:
    return f"{seconds:.1f} s" if seconds < 60 else f"{int(seconds // 60)} min {seconds % 60:02.0f} s"


class LineBar:
    """A progress bar for a stream that is not a terminal: one whole line at each quarter.

    Parameters
    ----------
    total : int
        Steps to do.
    desc : str
        What runs ("pass").
    unit : str
        What a step is ("block").
    stream : text stream
        Where the lines go.
    """

    def __init__(self, total: int, desc: str, unit: str, stream: IO[str]):
        self.total, self.desc, self.unit, self.stream = int(total), desc, unit, stream
        self.n, self._quarter, self._start, self._closed = 0, 0, time.perf_counter(), False
        self._lock = threading.Lock()
        self._line(f"{desc}: {_count(self.total, unit)}" if self.total else f"{desc} ...")

    def _line(self, text: str) -> None:
        with contextlib.suppress(ValueError, OSError):  # a closed stream: nothing to report to
            self.stream.write(text + "\n")
            self.stream.flush()

    def update(self, n: int = 1) -> None:
        """Add ``n`` steps done; a line when a new quarter is reached (not the last: :meth:`close`)."""
        self.update_to(self.n + n)

    def update_to(self, n: int, total: int | None = None) -> None:
        """Set the steps done to ``n`` (and the total, which Dask's schedulers learn late)."""
        with self._lock:
            if self._closed:  # a count that arrives late (another thread's) says nothing more
                return
            if total:
                self.total = int(total)
            self.n = int(n)
            quarter = 4 * self.n // self.total if self.total else 0
            if 0 < quarter < 4 and quarter > self._quarter:
                self._quarter = quarter
                self._line(f"{self.desc}: {25 * quarter}% ({self.n:,} of "
                           f"{_count(self.total, self.unit)}) after "
                           f"{_elapsed(time.perf_counter() - self._start)}")

    def refresh(self) -> None:
        """Nothing: a log gets lines at the quarters only."""

    def close(self) -> None:
        """The last line: steps done and the time taken ("stopped" short of the total)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            how = "done in" if self.n >= self.total else "stopped after"
            self._line(f"{self.desc}: {self.n:,} of {_count(self.total, self.unit)} {how} "
                       f"{_elapsed(time.perf_counter() - self._start)}")


class NullBar:
    """A bar that shows nothing, for a caller that always wants one (``n``: steps done)."""

    def __init__(self) -> None:
        self.n = 0

    def update(self, n: int = 1) -> None:
        """Count ``n`` more steps."""
        self.n += n

    def update_to(self, n: int, total: int | None = None) -> None:
        """Set the steps done to ``n``."""
        self.n = int(n)

    def refresh(self) -> None:
        """Nothing to redraw."""

    def close(self) -> None:
        """Nothing to close."""


class _Redrawn:
    """A tqdm bar redrawn every :data:`REDRAW_SECONDS` by a thread, so its elapsed time moves
    while a step takes long; ``update_to`` as :meth:`LineBar.update_to`."""

    def __init__(self, bar):
        self.bar = bar
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._redraw, daemon=True)
        self._thread.start()

    def _redraw(self) -> None:
        while not self._stop.wait(REDRAW_SECONDS):
            with contextlib.suppress(Exception):  # a closed terminal: nothing to redraw
                self.bar.refresh()

    @property
    def n(self) -> int:
        return self.bar.n

    def update(self, n: int = 1) -> None:
        self.bar.update(n)

    def update_to(self, n: int, total: int | None = None) -> None:
        if total and total != self.bar.total:
            self.bar.total = int(total)
        self.bar.update(int(n) - self.bar.n)

    def refresh(self) -> None:
        self.bar.refresh()

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.bar.close()


def progress_bar(total: int | None, desc: str, unit: str = "it"):
    """A bar of ``total`` steps on the open report's stream, or None when none is open.

    Parameters
    ----------
    total : int or None
        Steps to do (None: not yet known; set by ``update_to``).
    desc : str
        What runs.
    unit : str, default "it"
        What a step is.

    Returns
    -------
    bar or None
        With ``update(n)``, ``update_to(n, total=None)`` and ``close()``: tqdm's on a
        terminal, a :class:`LineBar` elsewhere.
    """
    stream = _STREAM.get()
    if stream is None:
        return None
    if not is_terminal(stream):
        return LineBar(total or 0, desc, unit, stream)
    from tqdm import tqdm

    return _Redrawn(tqdm(total=total, desc=desc, unit=unit, file=stream))


@contextlib.contextmanager
def phase(what: str) -> Iterator[None]:
    """Report a step of the fit that shows no bar of its own (an eigensolve, a basis).

    On a terminal a line ``what (12 s)`` redrawn every second, left as ``what: done in
    70.1 s``; elsewhere a line when it starts, one every :data:`HEARTBEAT_SECONDS` while
    it runs, and one when it ends.  Nothing when no report is open.

    Parameters
    ----------
    what : str
        What runs, in words ("eigensolve: top 400 of 6,400 dimensions (LAPACK)").

    Yields
    ------
    None
    """
    stream = _STREAM.get()
    if stream is None:
        yield
        return
    start, stop = time.perf_counter(), threading.Event()
    tty = is_terminal(stream)

    def write(text: str, end: str) -> None:
        with contextlib.suppress(ValueError, OSError):
            stream.write(text + end)
            stream.flush()

    def tick() -> None:
        every = REDRAW_SECONDS if tty else HEARTBEAT_SECONDS
        while not stop.wait(every):
            t = _elapsed(time.perf_counter() - start)
            if tty:
                write(f"\r{what} ({t})\x1b[K", "")
            else:
                write(f"{what}: still running after {t}", "\n")

    if tty:
        write(f"\r{what} ...\x1b[K", "")
    else:
        write(f"{what} ...", "\n")
    thread = threading.Thread(target=tick, daemon=True)
    thread.start()
    ok = False
    try:
        yield
        ok = True
    finally:
        stop.set()
        thread.join()
        outcome = "done" if ok else "stopped"
        text = f"{what}: {outcome} in {_elapsed(time.perf_counter() - start)}"
        write(("\r" + text + "\x1b[K") if tty else text, "\n")
