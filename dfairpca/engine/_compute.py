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

import asyncio
import concurrent.futures
import contextlib
import contextvars
import time
import weakref
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from ..errors import DfairpcaError, InvalidInputError
from ..inputs._validation import is_dask
from ..io import STORE_TIMEOUT_ANNOTATION, StoreTimeout, active_client, store_timeout
from ._failures import SchedulerLost, WorkerKilled, WorkersLost, WorkersPaused, WorkersTooSmall
from ._memory import OWN_BYTES_COUNTED, WorkingSet, current_working_set, memory_state
from ..base._params import is_real
from . import _on_scheduler

# Deferred imports: cloudpickle, dask, distributed (heavy or optional) are imported in the functions
# that use them, so that importing this module stays light.


def _killed_worker(exc: BaseException) -> WorkerKilled | None:
    """distributed's ``KilledWorker`` as a :class:`WorkerKilled`, else None."""
    try:
        from distributed.scheduler import KilledWorker
    except ImportError:
        return None
    if not isinstance(exc, KilledWorker):
        return None
    last = exc.last_worker  # the scheduler's record of that worker, sent with the error
    address = getattr(last, "address", str(last))
    return WorkerKilled(address, getattr(last, "memory_limit", None) or None,
                        int(exc.allowed_failures) + 1)


def _names_the_loss(client, exc: BaseException) -> bool:
    """Whether ``exc`` itself says that ``client`` lost its scheduler, whatever the
    client's state: distributed's words for it, or a connection to the scheduler's address
    closed or not opened (see :func:`_lost_scheduler`)."""
    if isinstance(exc, DfairpcaError):
        return False
    if "scheduler-connection-lost" in str(exc) or type(exc).__name__ == "ClosedClientError":
        return True
    return isinstance(exc, OSError) and _names_the_scheduler(client, exc)


def _names_the_scheduler(client, exc: OSError) -> bool:
    """Whether ``exc`` names a connection to ``client``'s scheduler: the comm it was on,
    "<TCP ... remote=<the scheduler's address>>", or the one it could not open, "Timed out
    trying to connect to <address> after ...": the address as given (a host name, maybe)
    or as the scheduler told it, whole (tcp://h:5000 is not tcp://h:50001)."""
    known = getattr(client, "_scheduler_identity", None) or {}
    addresses = {_scheduler_address(client), known.get("address")}
    return any(f"remote={a}>" in str(exc) or f"connect to {a} " in str(exc)
               for a in addresses if isinstance(a, str))


def _lost_scheduler(client, exc: BaseException) -> bool:
    """Whether ``exc``, raised by a call of ``client`` (waiting on its futures, sending it a
    graph, asking it about its workers), means the Client lost its scheduler (its futures
    cancelled for that, its connection closed, or the Client closed after failing to
    reconnect) rather than a task's own failure."""
    if isinstance(exc, DfairpcaError):  # said already, in dfairpca's words
        return False
    # distributed's words for it, or a call that met the closed connection before the
    # Client noticed (its status still "running" for a moment after the scheduler died)
    if _names_the_loss(client, exc):
        return True
    if client.status in ("closing", "closed"):  # whatever a closed client's calls raise
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
    lost every worker, never waiting for ever on tasks pinned to a worker that is gone, and
    ending with :class:`SchedulerLost` (one line) when the Client has lost its scheduler
    (see :func:`gather_watched`).

    Parameters
    ----------
    *args : any
        Dask collections (and other objects, passed through), as ``dask.compute`` takes.

    Returns
    -------
    tuple
        Their computed values, one per argument.
    """
    client = _scheduling_client()
    seconds = _WORKER_TIMEOUT.get()
    if client is None:
        return _compute_locally(args, seconds)
    with cluster_failures_said(client):
        futures = submit(client, list(args), seconds)
    return tuple(gather_watched(client, futures, seconds))


class _ContextPool:
    """A thread pool for Dask's threaded scheduler that runs each task in a copy of the
    context that submits it (the scheduler's loop, in the caller's thread): the pool Dask
    makes carries no context variables into its threads, so a task there would not see the
    caller's :func:`dfairpca.io.store_timeout`."""

    def __init__(self, workers: int):
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="dfairpca-compute")
        self._max_workers = workers  # what dask.threaded.get reads of a pool

    def submit(self, fn, /, *args, **kwargs):
        return self._pool.submit(contextvars.copy_context().run, fn, *args, **kwargs)

    def shutdown(self) -> None:
        # not waiting: a task left in a frozen store's read ends at its own timeout
        self._pool.shutdown(wait=False, cancel_futures=True)


def _compute_locally(args, seconds: float | None) -> tuple:
    """``dask.compute(*args)`` without a Client, its reads of remote stores bounded by
    ``seconds`` as on a cluster (:func:`dfairpca.io.store_timeout`): in this thread
    (the synchronous scheduler) and, on the threaded scheduler, in every thread of a pool
    that carries this context into its tasks (:class:`_ContextPool`).  Other schedulers
    (processes) read as the file system does."""
    import dask
    import dask.threaded
    from dask.base import get_scheduler

    if seconds is None:
        return dask.compute(*args)
    with store_timeout(seconds):
        if get_scheduler() is not dask.threaded.get:
            return dask.compute(*args)
        from dask.system import CPU_COUNT

        pool = _ContextPool(dask.config.get("num_workers", None) or CPU_COUNT)
        try:
            return dask.compute(*args, pool=pool)
        finally:
            pool.shutdown()


def submit(client, collections, seconds: float | None):
    """``client.compute(collections)``, its tasks annotated with ``seconds``: a read of a
    remote store that goes unanswered that long ends the task (see
    :data:`dfairpca.io.STORE_TIMEOUT_ANNOTATION`), so that a frozen store ends the fit
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


def _scheduler_address(client) -> str:
    """The address of ``client``'s scheduler, as far as it can still be told."""
    try:
        return client.scheduler.address
    except Exception:  # noqa: BLE001 - a closed client has dropped its connection
        pass
    # the scheduler's own word, or the address the Client was given (private, kept)
    known = getattr(client, "_scheduler_identity", None) or {}
    address = known.get("address") or getattr(client, "_start_arg", None)
    return address if isinstance(address, str) else "(address unknown)"


@contextlib.contextmanager
def cluster_failures_said(client, *, named_only: bool = False):
    """Inside the block, an error of ``client`` that means it has lost its scheduler
    (a closed connection, a closed client, cancelled futures) is :class:`SchedulerLost`,
    naming the scheduler, and distributed's ``KilledWorker`` (a task that killed every
    worker that ran it) is :class:`WorkerKilled`, naming the worker and its memory limit:
    one line each, instead of distributed's own words and traceback (the original's
    notes kept).

    Parameters
    ----------
    client : distributed.Client
        The client the block calls.
    named_only : bool, default False
        Only an error that names the loss itself (distributed's closed-client error, or a
        connection to the scheduler's address) is the loss: for a block that runs other
        code than the client's calls, whose errors the client's state says nothing about.

    Yields
    ------
    None
    """
    address = _scheduler_address(client)
    try:
        yield
    except (DfairpcaError, KeyboardInterrupt, GeneratorExit, SystemExit):  # said, or not an error
        raise
    except BaseException as exc:
        said: DfairpcaError | None = _killed_worker(exc)  # first: a client closing meanwhile does not hide it
        if said is None and (_names_the_loss(client, exc) if named_only else _lost_scheduler(client, exc)):
            _REPORTED_LOSSES.add(client)
            said = SchedulerLost(address)
        if said is None:
            raise
        for note in getattr(exc, "__notes__", ()):
            said.add_note(note)
        raise said from None


#: the Clients whose lost scheduler a computation has reported (:class:`SchedulerLost`)
_REPORTED_LOSSES: weakref.WeakSet = weakref.WeakSet()


def loss_reported(client) -> bool:
    """Whether a computation on ``client`` has reported that it lost its scheduler (raised
    :class:`SchedulerLost`): distributed's own records of that loss only repeat it.

    Parameters
    ----------
    client : distributed.Client
        The client.

    Returns
    -------
    bool
    """
    return client in _REPORTED_LOSSES


def on_scheduler(client, name: str, *args):
    """``client.run_on_scheduler`` of the function ``name`` of
    :mod:`dfairpca.engine._on_scheduler`, sent by value: a scheduler without dfairpca
    installed runs it too."""
    import cloudpickle

    cloudpickle.register_pickle_by_value(_on_scheduler)
    return client.run_on_scheduler(getattr(_on_scheduler, name), *args)


def _release_pinned(client, state: dict) -> None:
    """Ask the scheduler to send on the tasks pinned to workers that are gone
    (:func:`dfairpca.engine._on_scheduler.release_pinned`).  A scheduler that refuses to run
    it is not asked again (``state["refused"]``): the wait is then Dask's alone."""
    if state.get("refused"):
        return
    try:
        on_scheduler(client, "release_pinned")
    except Exception as exc:  # noqa: BLE001 - its loss of the scheduler is seen by the caller
        if not _lost_scheduler(client, exc):
            state["refused"] = True


def gather_watched(client, futures: list, seconds: float | None) -> list:
    """The results of ``futures`` (other items as they are), looking at the Client's workers
    while they run: with none for ``seconds`` (None: no limit), :class:`WorkersLost`; with
    one future failed on a store's timeout (:class:`dfairpca.io.StoreTimeout`), its error
    within a look, without waiting for the others (any other failure waits for them: a
    failed write's other tasks may still be writing).

    With every worker paused for memory (distributed pauses a worker past
    ``distributed.worker.memory.pause`` of its limit) for ``seconds``,
    :class:`WorkersPaused`, naming them, their memory limits and the pass's working set.
    Every look also sends on the tasks that distributed left waiting for a worker that is
    gone, though they may run on any worker (:mod:`dfairpca.engine._on_scheduler`): a
    worker restarted by its nanny mid-pass would otherwise leave the pass waiting for
    ever.  A task that killed every worker that ran it is :class:`WorkerKilled`, a lost
    scheduler :class:`SchedulerLost`, each one line.  The futures are released at the end
    whatever happens, as ``dask.compute`` does.

    Parameters
    ----------
    client : distributed.Client
        The client the futures run on.
    futures : list
        Futures, and other items to return as they are.
    seconds : float or None
        How long the Client may be without a worker before this gives up (None: as long
        as it takes).

    Returns
    -------
    list
        The results, in the order of ``futures``.
    """
    from distributed import Future, wait

    pending = [f for f in futures if isinstance(f, Future)]
    poll = WORKER_POLL_SECONDS if seconds is None else min(WORKER_POLL_SECONDS, seconds / 4)
    since = None  # when the Client was first seen without a worker
    paused = None  # since when every worker has been seen paused
    address = _scheduler_address(client)
    asked: dict = {}
    try:
        with cluster_failures_said(client):
            while True:
                try:
                    wait(pending, timeout=poll)
                except TimeoutError:  # still running: a look at the workers
                    if _store_timed_out(pending):
                        # a store that stopped answering: its error now, not after every
                        # other read has waited as long (only then: the other tasks of a
                        # failed write go on writing, and the caller's clean-up must not
                        # race them)
                        return client.gather(futures)
                    workers = _able_workers(client)
                    now = time.monotonic()
                    if workers:
                        since = None  # a worker (a new one, maybe) is there: the tasks go on
                        paused = _all_paused(workers, paused, now)
                        if paused is not None and seconds is not None and now - paused >= seconds:
                            raise WorkersPaused(seconds, address, [
                                (a, int(w.get("memory_limit") or 0)) for a, w in sorted(workers.items())
                            ], current_working_set()) from None
                        _release_pinned(client, asked)
                    elif since is None:
                        since, paused = now, None
                    elif seconds is not None and now - since >= seconds:
                        raise WorkersLost(seconds, address) from None
                    continue
                return client.gather(futures)
    finally:
        for f in pending:
            f.release()


def scheduler_workers(client) -> dict:
    """Every worker ``client``'s scheduler knows, ``{address: what it says of it}``: some
    versions of distributed list only the first five unless asked for all."""
    try:
        return client.scheduler_info(n_workers=-1).get("workers", {})
    except TypeError:  # versions that list them all take no n_workers
        return client.scheduler_info().get("workers", {})


def _able_workers(client) -> dict:
    """The workers of ``client``'s scheduler that may run a task, now or once their memory
    falls (status running or paused, with threads): ``{address: what the scheduler says of
    it}``, its ``status``, ``nthreads`` and ``memory_limit`` among it."""
    workers = scheduler_workers(client)
    return {a: w for a, w in workers.items()
            if w.get("nthreads") and w.get("status", "running") in ("running", "paused")}


def _all_paused(workers: dict, since: float | None, now: float) -> float | None:
    """Since when every worker of ``workers`` (:func:`_able_workers`) has been paused
    with no task in progress: ``since`` if they still all are, ``now`` if they have just
    become so, None if one runs (a worker that pauses and resumes starts the count again,
    and so does a paused worker still finishing a task it began, as its last heartbeat
    counts: a fold of a large chunk can outlast the timeout)."""
    def executing(w: dict) -> int:
        counts = (w.get("metrics") or {}).get("task_counts") or {}
        return int(counts.get("executing", 0) or 0) + int(counts.get("long-running", 0) or 0)

    if all(w.get("status") == "paused" and not executing(w) for w in workers.values()):
        return now if since is None else since
    return None


def _store_timed_out(futures) -> bool:
    """Whether one of ``futures`` failed with :class:`dfairpca.io.StoreTimeout`."""
    for f in futures:
        if f.status == "error":
            try:
                if isinstance(f.exception(timeout=WORKER_POLL_SECONDS), StoreTimeout):
                    return True
            except Exception:  # noqa: BLE001 - not answered now: looked at again next time
                pass
    return False


#: per Client: the set of workers last asked, their pause fractions and own memory, and
#: the largest working set already checked against them
_CHECKED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def check_workers_hold(ws: WorkingSet, chains: int | None = None) -> None:
    """Raise :class:`WorkersTooSmall` if a worker of the active Client cannot hold its
    threads' working sets ``ws`` (one per thread, or per chain where the pass runs fewer
    ``chains`` than the worker has threads) and the memory it holds of its own
    (:func:`~dfairpca.engine._memory.memory_state`, counted up to
    :data:`~dfairpca.engine._memory.OWN_BYTES_COUNTED`) below its pause threshold.  Workers
    without a memory limit or pause threshold, and a process without a Client, are not
    checked.

    The workers are asked once per set of workers, and a working set no larger than one
    already checked against them is not checked again: the memory a worker keeps after a
    pass (freed pages the allocator holds on to) is reused by the next one, so that
    counting it again at each pass of a fit, or each segment of a checkpointed one, could
    refuse a pass that fits.
    """
    client = _scheduling_client()
    if client is None or ws.total == 0:
        return
    with cluster_failures_said(client):
        workers = scheduler_workers(client)
        key = frozenset(workers)
        known = _CHECKED.get(client)
        if known is None or known["workers"] != key:
            answers = client.run(memory_state, on_error="return")
            known = {"workers": key, "checked": 0,
                     "state": {a: v for a, v in answers.items() if isinstance(v, tuple)}}
            _CHECKED[client] = known
    if ws.total <= known["checked"]:  # this working set, or a larger one, was checked
        return
    for address, w in sorted(workers.items()):
        limit, threads = int(w.get("memory_limit") or 0), int(w.get("nthreads") or 0)
        pause, own = known["state"].get(address, (None, 0))
        own = min(own, OWN_BYTES_COUNTED)
        if chains:
            threads = min(threads, int(chains))
        if limit and threads and pause and threads * ws.total + own > pause * limit:
            raise WorkersTooSmall(address, limit, pause, threads, ws, own)
    known["checked"] = max(known["checked"], ws.total)


_INLINE = contextvars.ContextVar("dfairpca_ship_inline", default=False)


@contextlib.contextmanager
def shipping_inline():
    """Inside the block :func:`ship` sends nothing: for a graph built only to check its
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

    Under a distributed Client it is sent to the scheduler once, as a task of its own that
    returns it, and the graph holds that task's future: the graph of each computation stays
    small whatever the matrix (distributed would warn "Sending large graph" and send the
    bytes with the graph, every time it is computed), and the workers fetch it once each.
    Unlike scattered data, which is lost with the worker that holds it (a worker restarted
    by its nanny mid-transform would cancel the whole computation), the scheduler keeps the
    task and runs it again on another worker.  The result must be computed while that
    client is open.  Without a client it is one ``dask.delayed`` key of the graph (not
    copied into every chunk's task).

    Parameters
    ----------
    value : object
        What the graph's tasks take as an argument (a numpy matrix).

    Returns
    -------
    distributed.Future or dask.delayed.Delayed
        The value's future under a client, else the delayed value.
    """
    import dask

    held = dask.delayed(value, pure=True)  # keyed by its content: the same matrix is one key
    client = None if _INLINE.get() else active_client()
    if client is None:
        return held
    # the one graph that carries the matrix, on purpose: no warning about its size
    with cluster_failures_said(client), dask.config.set(
            {"distributed.admin.large-graph-warning-threshold": "1 PiB"}):
        return client.compute(held)


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
