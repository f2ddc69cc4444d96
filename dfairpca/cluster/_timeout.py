"""Computations that end once every worker has left: Dask's scheduler waits for new workers
without a limit, :func:`compute` inside :func:`worker_timeout` stops with
:class:`~dfairpca.cluster.WorkersLost`."""

from __future__ import annotations

import contextlib
import contextvars
import time

from ..errors import InvalidInputError
from ._errors import WorkersLost


#: longest pause (s) between two looks at the Client's workers while a computation waits
WORKER_POLL_SECONDS = 1.0

#: seconds :func:`compute` waits on a Client without workers (None: as long as Dask does)
_WORKER_TIMEOUT: contextvars.ContextVar = contextvars.ContextVar("dfairpca_worker_timeout",
                                                                 default=None)


def current_timeout() -> float | None:
    """The seconds of the innermost :func:`worker_timeout` block around this call (None:
    none, wait as Dask does).

    Returns
    -------
    float or None
        The seconds, or None outside any block (or in a ``worker_timeout(None)`` one).
    """
    return _WORKER_TIMEOUT.get()


def check_timeout(timeout) -> None:
    """Refuse a ``timeout`` that is not None or a number of seconds > 0.

    Parameters
    ----------
    timeout : float or None
        The value to check.
    """
    from ..base._params import is_real

    if timeout is not None and not (is_real(timeout) and timeout > 0):
        raise InvalidInputError(
            f"timeout must be None (wait for new workers as long as it takes) or the seconds "
            f"to wait once every worker has left, a number > 0; got {timeout!r}"
        )


@contextlib.contextmanager
def worker_timeout(timeout):
    """Computations of :func:`compute` inside this block end once the active Client has had
    no worker for ``timeout`` seconds (None: they wait for new workers, as Dask does).

    Parameters
    ----------
    timeout : float or None
        Seconds without a worker after which a computation ends with
        :class:`WorkersLost`; checked by :func:`check_timeout`.

    Yields
    ------
    None
        The block runs with the timeout in force; blocks nest, the innermost one counts.
    """
    check_timeout(timeout)
    token = _WORKER_TIMEOUT.set(None if timeout is None else float(timeout))
    try:
        yield
    finally:
        _WORKER_TIMEOUT.reset(token)


def compute(*args) -> tuple:
    """``dask.compute(*args)``, ending as :func:`worker_timeout` says on a Client that has
    lost every worker.

    Parameters
    ----------
    *args : any
        Dask collections (and other objects, passed through), as ``dask.compute`` takes.

    Returns
    -------
    tuple
        Their computed values, one per argument.
    """
    import dask

    seconds = _WORKER_TIMEOUT.get()
    client = _scheduling_client() if seconds is not None else None
    if client is None:
        return dask.compute(*args)
    return tuple(gather_watched(client, client.compute(list(args)), seconds))


def _scheduling_client():
    """The ``distributed.Client`` that ``dask.compute`` would run on now, or None."""
    from dask.base import get_scheduler

    try:
        from distributed import Client
    except ImportError:
        return None
    owner = getattr(get_scheduler(), "__self__", None)
    return owner if isinstance(owner, Client) else None


def gather_watched(client, futures: list, seconds: float) -> list:
    """The results of ``futures`` (other items as they are), looking at the Client's workers
    while they run: with none for ``seconds``, :class:`~dfairpca.cluster.WorkersLost`.
    The futures are released at the end whatever happens, as ``dask.compute`` does.

    Parameters
    ----------
    client : distributed.Client
        The client the futures run on.
    futures : list
        Futures, and other items to return as they are.
    seconds : float
        How long the Client may be without a worker before this gives up.

    Returns
    -------
    list
        The results, in the order of ``futures``.
    """
    from distributed import Future, wait

    pending = [f for f in futures if isinstance(f, Future)]
    poll = min(WORKER_POLL_SECONDS, seconds / 4)
    since = None  # when the Client was first seen without a worker
    try:
        while True:
            try:
                wait(pending, timeout=poll)
            except TimeoutError:  # still running: a look at the workers
                if client.nthreads():
                    since = None  # a worker (a new one, maybe) is there: the tasks go on
                elif since is None:
                    since = time.monotonic()
                elif time.monotonic() - since >= seconds:
                    raise WorkersLost(seconds, client.scheduler.address) from None
                continue
            return client.gather(futures)
    finally:
        for f in pending:
            f.release()
