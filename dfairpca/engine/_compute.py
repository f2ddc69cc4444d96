"""Computing on the active client: the engine's service to every layer above it.

Dask's scheduler waits for new workers without a limit; :func:`compute` inside
:func:`worker_timeout` stops with :class:`~dfairpca.cluster.WorkersLost` once the Client has
had no worker for that long, naming the scheduler.  :func:`ship` puts a model's matrix into
a graph by key, and :func:`with_known_rows` computes the row-chunk sizes a pass needs.

The estimators never create or choose a cluster: like every Dask library they run on the
active ``distributed.Client`` when there is one (:func:`dfairpca.cluster.connect` is what the
command line uses to make one active).
"""

from __future__ import annotations

import contextlib
import contextvars
import time

import numpy as np

from ..errors import DfairpcaError, InvalidInputError
from ..inputs._validation import is_dask
from ..io._shared import active_client


class NoWorkers(DfairpcaError, ConnectionError):
    """The scheduler answered, but no worker joined it within the timeout."""

    # documented, raised and pickled under the public name dfairpca.cluster.NoWorkers
    __module__ = "dfairpca.cluster"


class WorkersLost(NoWorkers):
    """Every worker left while a fit computed, and none joined within its ``timeout``.

    ``seconds`` is that timeout, ``address`` the scheduler's; a checkpointed fit also says
    where it saved what it had finished: ``checkpoint``, and ``progress`` such as "16 of
    60 chunks" (else both None).  ``what`` is what happened, without the way on.
    """

    __module__ = "dfairpca.cluster"

    def __init__(self, seconds: float, address: str, checkpoint=None, progress: str | None = None):
        self.seconds, self.address = seconds, address
        self.checkpoint, self.progress = checkpoint, progress
        self.what = (f"the Dask scheduler at {address} has had no workers for {seconds:g} s: all "
                     "left during the fit and none joined, so it stopped")
        start = f"start workers (`dask worker {address}`)"
        if checkpoint is None:
            how = f"{start} and fit again, or wait longer with a larger timeout"
        else:
            how = (f"the checkpoint {str(checkpoint)!r} holds {progress}: {start} and run the "
                   "same call again to continue")
        super().__init__(f"{self.what}; {how}")

    def saved(self, checkpoint, progress: str) -> "WorkersLost":
        """The same loss, saying that ``checkpoint`` holds ``progress``.

        Parameters
        ----------
        checkpoint : str or os.PathLike
            The checkpoint of the interrupted pass, named in the message.
        progress : str
            What it holds (e.g. "12 of 40 segments"), said in the message.

        Returns
        -------
        WorkersLost
            A new error with the longer message; raise it ``from`` this one.
        """
        return WorkersLost(self.seconds, self.address, checkpoint, progress)


class SchedulerLost(DfairpcaError, ConnectionError):
    """The Client lost its Dask scheduler while a fit computed: the scheduler stopped, or
    the network to it failed; the scheduler's tasks and results are gone with it.

    ``address`` is the scheduler's; a checkpointed fit also says where it saved what it had
    finished: ``checkpoint``, and ``progress`` such as "16 of 60 chunks" (else both None).
    ``what`` is what happened, without the way on.
    """

    __module__ = "dfairpca.cluster"

    def __init__(self, address: str, checkpoint=None, progress: str | None = None):
        self.address, self.checkpoint, self.progress = address, checkpoint, progress
        self.what = (f"lost the Dask scheduler at {address} during the fit (it stopped, or the "
                     "network to it failed)")
        start = "start a scheduler and its workers again"
        if checkpoint is None:
            how = f"{start} and fit again"
        else:
            how = (f"the checkpoint {str(checkpoint)!r} holds {progress}: {start} and run the "
                   "same call again to continue")
        super().__init__(f"{self.what}; {how}")

    def saved(self, checkpoint, progress: str) -> "SchedulerLost":
        """The same loss, saying that ``checkpoint`` holds ``progress``.

        Parameters
        ----------
        checkpoint : str or os.PathLike
            The checkpoint of the interrupted pass, named in the message.
        progress : str
            What it holds (e.g. "12 of 40 segments"), said in the message.

        Returns
        -------
        SchedulerLost
            A new error with the longer message; raise it ``from`` this one.
        """
        return SchedulerLost(self.address, checkpoint, progress)


def _lost_scheduler(client, exc: BaseException) -> bool:
    """Whether ``exc``, raised while waiting on ``client``'s futures, means the Client lost
    its scheduler (its futures cancelled for that, or its connection closed) rather than a
    task's own failure."""
    import asyncio
    import concurrent.futures

    if "scheduler-connection-lost" in str(exc):
        return True
    connection = (OSError, asyncio.CancelledError, concurrent.futures.CancelledError)
    return isinstance(exc, connection) and client.status not in ("running", "newly-created")


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
    return tuple(gather_watched(client, submit(client, list(args), seconds), seconds))


def submit(client, collections, seconds: float | None):
    """``client.compute(collections)``, its tasks annotated with ``seconds``: a read of a
    remote store that goes unanswered that long ends the task (see
    :func:`dfairpca.io._remote.task_store_timeout`), so that a frozen store ends the fit
    within its timeout, as a cluster without workers does.

    Parameters
    ----------
    client : distributed.Client
        The client to compute on.
    collections : Dask collection or list of them
        What ``client.compute`` takes.
    seconds : float or None
        The timeout (None: the file system's own, s3fs's retries included).

    Returns
    -------
    distributed.Future or list of them
        As ``client.compute`` returns.
    """
    import dask

    from ..io._remote import STORE_TIMEOUT_ANNOTATION

    if seconds is None:
        return client.compute(collections)
    with dask.annotate(**{STORE_TIMEOUT_ANNOTATION: float(seconds)}):
        return client.compute(collections)


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
    while they run: with none for ``seconds``, :class:`WorkersLost`; with one future
    failed, its error (within a look, without waiting for the others).
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
    address = client.scheduler.address
    try:
        while True:
            try:
                wait(pending, timeout=poll)
            except TimeoutError:  # still running: a look at the workers
                if any(f.status == "error" for f in pending):
                    # one failed (a store that stopped answering): its error now, not after
                    # every other task has failed or finished too
                    return client.gather(futures)
                try:
                    if client.nthreads():
                        since = None  # a worker (a new one, maybe) is there: the tasks go on
                    elif since is None:
                        since = time.monotonic()
                    elif time.monotonic() - since >= seconds:
                        raise WorkersLost(seconds, address) from None
                except WorkersLost:
                    raise
                except BaseException as exc:
                    if _lost_scheduler(client, exc):
                        raise SchedulerLost(address) from None
                    raise
                continue
            return client.gather(futures)
    except (WorkersLost, KeyboardInterrupt):
        raise
    except BaseException as exc:
        # distributed's own words ("FuturesCancelledError: 1 Future cancelled ... Please
        # check your connection") name neither the scheduler nor what was kept
        if _lost_scheduler(client, exc):
            raise SchedulerLost(address) from None
        raise
    finally:
        for f in pending:
            f.release()


_INLINE = contextvars.ContextVar("dfairpca_ship_inline", default=False)


@contextlib.contextmanager
def shipping_inline():
    """Inside the block :func:`ship` scatters nothing: for a graph built only to check its
    arguments (the command line's, before it connects), which a client in this process
    would otherwise be sent matrices for, under keys the real graph then shares.

    Yields
    ------
    None
    """
    token = _INLINE.set(True)
    try:
        yield
    finally:
        _INLINE.reset(token)


def ship(value):
    """``value`` (a model's matrix) as an argument of a lazy graph that holds it by key.

    Under a distributed Client it is scattered to the cluster once and the graph holds its
    future: the graph sent to the scheduler stays small whatever the matrix (distributed
    would warn "Sending large graph" and send the bytes with the graph, every time it is
    computed), and the workers fetch it once each.  The result must then be computed while
    that client is open.  Without a client it is one ``dask.delayed`` key of the graph (not
    copied into every chunk's task).

    Parameters
    ----------
    value : object
        What the graph's tasks take as an argument (a numpy matrix).

    Returns
    -------
    distributed.Future or dask.delayed.Delayed
        The scattered value's future under a client, else the delayed value.
    """
    client = None if _INLINE.get() else active_client()
    if client is None:
        import dask

        return dask.delayed(value)
    return client.scatter(value, hash=True)  # hashed: the same matrix is sent once


def with_known_rows(X, *aligned):
    """``(X, *aligned)`` with X's row-chunk sizes known and Dask label inputs computed.

    A Dask array filtered by its own values (``X[X[:, 0] > 0]``) has unknown chunk sizes,
    but pairing rows with their labels, checkpoints and row numbers in errors need them.
    They are computed together with the Dask collections among ``aligned`` (the groups,
    y: typically filtered by the same mask) in one ``dask.compute``, so the reads and the
    mask they share run once; nothing but the sizes and the labels is kept.  A pass that
    multiplies each chunk by itself (O(n d^2)) costs far more than this read (O(n d)).
    Inputs other than such a Dask array come back unchanged.
    """
    import dask.array as da


    if not isinstance(X, da.Array) or not np.isnan(X.shape[0]):
        return (X, *aligned)
    todo: list[tuple[int, int | None]] = [(i, None) for i, a in enumerate(aligned) if is_dask(a)]
    todo += [(i, j) for i, a in enumerate(aligned) if isinstance(a, (list, tuple))
             for j, v in enumerate(a) if is_dask(v)]
    sizes = da.map_blocks(
        _n_rows, X, chunks=((1,) * X.numblocks[0],), drop_axis=1, dtype=np.int64,
        meta=np.empty((0,), np.int64),
    )
    sizes, *values = compute(sizes, *[
        aligned[i] if j is None else aligned[i][j] for i, j in todo
    ])
    out = list(aligned)
    for (i, j), v in zip(todo, values):
        if j is None:
            out[i] = v
        else:
            out[i] = list(out[i])
            out[i][j] = v
    known = da.Array(X.dask, X.name, (tuple(int(c) for c in sizes), X.chunks[1]), dtype=X.dtype,
                     meta=np.empty((0, 0), X.dtype))
    return (known, *out)


def _n_rows(block):
    """The row count of one chunk, as a 1-element array (one entry per chunk)."""
    return np.array([np.shape(block)[0]], np.int64)
