"""The command's errors, exit statuses and output helpers: how a failure becomes one line
on stderr and an exit status, and how a summary becomes JSON."""

from __future__ import annotations

import contextlib
import difflib
import json
import math
import signal
import sys
import threading

import numpy as np

from ..base import ctrl_c_kept
from ..errors import DfairpcaError, InvalidInputError, InvalidTypeError, NotFoundError

#: exit status of a run that failed: what it read, wrote or reached refused (a missing or
#: corrupt file, an existing output, lost workers, a scheduler that does not answer)
EXIT_FAILURE = 1
#: exit status of a command line refused before any work: argparse's own errors and the
#: arguments the command or the library's parameter checks refuse (:class:`UsageError`)
EXIT_USAGE = 2
#: exit status of a command stopped by Ctrl-C (128 + SIGINT), as shells report it
EXIT_INTERRUPTED = 130
#: exit status of a command stopped by SIGTERM (128 + 15): what ``kill``, ``timeout``,
#: SLURM and Kubernetes send
EXIT_TERMINATED = 143


@contextlib.contextmanager
def sigterm_as_interrupt():
    """While the block runs, SIGTERM stops the command as Ctrl-C does: it raises
    KeyboardInterrupt in the main thread, so that every cleanup an interrupt runs (a
    write's temporary removed, a checkpoint's pass saying what it holds, the local
    cluster's processes closed in order, which keeps multiprocessing's resource tracker
    from reporting "leaked semaphore objects") runs for it too.

    Yields a list that holds the signal once one arrived (the caller's exit status and
    line).  A second SIGTERM while the first one's cleanup runs is ignored (an
    orchestrator sends SIGKILL after its grace period anyway); outside the main thread,
    where Python runs no signal handler, nothing changes.  A Ctrl-C or SIGTERM whose
    KeyboardInterrupt Python would drop (raised in a gc callback or a finalizer) is raised
    again where it can propagate (:func:`~dfairpca.base.ctrl_c_kept`).
    """
    received: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield received
        return

    def stop(signum, frame):
        if not received:
            received.append(signum)
            raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        with ctrl_c_kept():  # a Ctrl-C that lands in a gc callback still stops the command
            yield received
    finally:
        signal.signal(signal.SIGTERM, previous)


class CLIError(DfairpcaError):
    """A failure of the run the command reports in one line (exit status 1)."""


class UsageError(CLIError, InvalidInputError):
    """An argument the command refuses before any work (exit status 2): a value, a
    combination of options, a name or a row count that does not fit the data."""


#: the errors a command reports in one line: what dfairpca refuses on purpose and what the
#: operating system refuses (a file, a permission, a connection); anything else is a bug
#: and keeps its traceback
ONE_LINE_ERRORS = (DfairpcaError, OSError)

#: the library's refusals of a value that are about the data read, not an argument: in an
#: :func:`arguments` check they stay failures of the run (module, class; looked up only
#: once the module is imported, which it is if it raised one)
DATA_ERRORS = (("dfairpca.io", "MissingChunkError"), ("dfairpca.io", "CorruptChunkError"),
               ("dfairpca.io", "SavedFileError"), ("dfairpca.engine.checkpoint", "CheckpointMismatch"))


def _data_error(exc: BaseException) -> bool:
    """Whether ``exc`` is one of :data:`DATA_ERRORS`."""
    for module, name in DATA_ERRORS:
        cls = getattr(sys.modules.get(module), name, None)
        if cls is not None and isinstance(exc, cls):
            return True
    return False


@contextlib.contextmanager
def arguments():
    """Run the library's checks of the command's arguments: a value, type or name they
    refuse (InvalidInputError, InvalidTypeError, NotFoundError) becomes a
    :class:`UsageError`, exit status 2.  Only calls that check parameters before any work
    run in here, so that the same error classes raised by the work (a corrupt image, a
    chunk missing) stay failures of the run, exit status 1."""
    try:
        yield
    except (InvalidInputError, InvalidTypeError, NotFoundError) as exc:
        if isinstance(exc, UsageError) or _data_error(exc):
            raise
        raise UsageError(one_line(exc)) from exc


def exit_status(exc: BaseException) -> int:
    """The exit status of a command that raised ``exc``, one of :data:`ONE_LINE_ERRORS` or a
    malformed file: :data:`EXIT_USAGE` for a :class:`UsageError`, else
    :data:`EXIT_FAILURE`."""
    return EXIT_USAGE if isinstance(exc, UsageError) else EXIT_FAILURE


def _malformed_file(exc: BaseException) -> bool:
    """Whether ``exc`` is a reader's refusal of a user's file (a Zarr store's metadata, a
    JSON file) that reached the command unwrapped: said in one line, as a refusal is."""
    zarr_errors = sys.modules.get("zarr.errors")  # imported if a store was opened
    return isinstance(exc, json.JSONDecodeError) or (
        zarr_errors is not None and isinstance(exc, zarr_errors.BaseZarrError))


def one_line(exc: BaseException) -> str:
    """The message of one of :data:`ONE_LINE_ERRORS` (a KeyError's without its quotes)."""
    return str(exc.args[0]) if isinstance(exc, KeyError) and exc.args else str(exc)

#: how many names an error lists before "..." (arrays of a store, columns of a table)
MAX_NAMES_SHOWN = 20


def _shown(names) -> str:
    """``names`` for an error message, at most :data:`MAX_NAMES_SHOWN` of them."""
    names = [str(n) for n in names]
    more = ", ..." if len(names) > MAX_NAMES_SHOWN else ""
    return (", ".join(names[:MAX_NAMES_SHOWN]) + more) or "nothing"


def _did_you_mean(name: str, names) -> str:
    """'; did you mean 'X'?' for the closest of ``names``, or ''."""
    close = difflib.get_close_matches(str(name), [str(n) for n in names], n=1)
    return f"; did you mean {close[0]!r}?" if close else ""



def _plain(value):
    """``value`` as JSON can hold it: numpy scalars and arrays as Python numbers and lists,
    a non-finite float as None (JSON has no NaN)."""
    if isinstance(value, np.ndarray):
        return [_plain(v) for v in value.tolist()]
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value

