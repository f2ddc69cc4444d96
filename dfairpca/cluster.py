"""Connecting the command line to a Dask cluster.

The estimators never create or choose a cluster: like every Dask library they run on the
active ``distributed.Client`` when there is one.  :func:`connect` is what the ``dfairpca``
command line uses to make one active: a running scheduler given by address
(``--scheduler tcp://host:8786``) or by scheduler file (``--scheduler-file``), or else a
:class:`distributed.LocalCluster` sized to this machine.  Recipes for starting schedulers
and workers on SSH hosts, SLURM/PBS and Kubernetes are in the repository's ``cluster/``.

Workers open the local paths they are given (the data, the output stores) on their own
machines: :func:`check_workers_see` asks every worker, before the work, whether it sees
there what this process sees, and :class:`NotShared` names those that do not.

When every worker leaves, Dask's scheduler waits for new ones without a limit; the
computations of a fit go through :func:`compute`, which inside :func:`worker_timeout`
ends with :class:`WorkersLost` once the Client has had no worker for that many seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import hashlib
import importlib.util
import json
import logging
import os
import secrets
import signal
import socket
import ssl
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from .base._system import cpu_count
from .errors import DfairpcaError, InvalidInputError, PathNotFoundError, UnreachableError

#: where the cluster's size, dashboard and waits are told (INFO): the command line shows
#: them on stderr; a program sees them only if it configures logging to
log = logging.getLogger(__name__)

__all__ = [
    "SchedulerUnreachable", "NoWorkers", "WorkersLost", "NotShared", "connect", "describe",
    "local_cluster_size", "scheduler_address_from_file", "check_scheduler", "check_workers_see",
    "check_inputs_shared", "active_client", "not_here", "compute", "worker_timeout", "check_timeout",
    "current_timeout", "gather_watched", "ship",
]


#: what to check when nothing (or no scheduler) answers
_CHECK_RUNNING = (
    "check that `dask scheduler` is running there and that the address and port "
    "(default 8786) are right and not blocked by a firewall"
)


class SchedulerUnreachable(DfairpcaError, ConnectionError):
    """No Dask scheduler answered at the given address within the timeout."""


class NoWorkers(DfairpcaError, ConnectionError):
    """The scheduler answered, but no worker joined it within the timeout."""


class WorkersLost(NoWorkers):
    """Every worker left while a fit computed, and none joined within its ``timeout``.

    ``seconds`` is that timeout, ``address`` the scheduler's; a checkpointed fit also says
    where it saved what it had finished: ``checkpoint``, and ``progress`` such as "16 of
    60 chunks" (else both None).  ``what`` is what happened, without the way on.
    """

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


class NotShared(DfairpcaError, FileNotFoundError):
    """A local path this process reads or writes is not the same on some of the cluster's
    workers: they run on machines that do not share this machine's files there."""


#: what to do about a path the workers do not share, said by every :class:`NotShared`
SHARE_FIX = ("put it on a file system that every worker mounts at the same path, give an "
             "object-store URL instead (s3://..., with storage_options / --storage-options), or "
             "compute on this machine (a local cluster: no --scheduler)")
#: the same without the URL, for an input that only a local folder can be (CelebA's JPEGs)
SHARE_FIX_LOCAL = ("put it on a file system that every worker mounts at the same path, or "
                   "compute on this machine (no --scheduler)")
#: bytes of an input file compared between this process and the workers (its size, whole)
_HEAD_BYTES = 1 << 20
#: workers named in a message, before "and N more"
_NAMED_WORKERS = 5


@contextlib.contextmanager
def connect(
    scheduler: str | None = None,
    scheduler_file=None,
    *,
    timeout: float = 60,
    local: bool = True,
    n_workers: int | None = None,
    threads_per_worker: int | None = None,
    memory_limit="auto",
    quiet: bool = False,
    security=None,
):
    """Yield a ``distributed.Client`` (the active one while the block runs), then close it.

    Parameters
    ----------
    scheduler : str, optional
        Address of a running scheduler, e.g. ``"tcp://10.0.0.5:8786"`` or
        ``"tls://head:8786"``.
    scheduler_file : str or Path, optional
        JSON file written by ``dask scheduler --scheduler-file PATH`` (usually on shared
        storage); waited for up to ``timeout`` seconds, since a batch job's scheduler may
        still be starting.
    timeout : float, default 60
        Seconds to wait for the scheduler to answer, and then for its first worker (a
        batch system may start the workers after this process).
    local : bool, default True
        With neither ``scheduler`` nor ``scheduler_file``: start a local cluster of worker
        processes (True) or refuse (False).
    n_workers, threads_per_worker : int, optional
        Size of the local cluster; default from :func:`local_cluster_size`.
    memory_limit : str or int, default "auto"
        Memory limit per local worker; "auto" splits this machine's memory evenly.
    quiet : bool, default False
        Do not log (at INFO, to the ``dfairpca.cluster`` logger) the local cluster's size
        and dashboard address, nor that this waits for a worker.
    security : distributed.security.Security, optional
        TLS settings for a ``tls://`` scheduler; default: Dask's configuration
        (``distributed.comm.tls.*``), see ``cluster/tls.md``.

    Yields
    ------
    distributed.Client
        The client, active (Dask computes on it) until the block ends; it is closed then,
        and a local cluster started for it shut down.

    Raises
    ------
    SchedulerUnreachable
        Nothing answered as a Dask scheduler within ``timeout``.  One-line message.
    NoWorkers
        The scheduler had no worker and none joined within ``timeout``.  One-line message
        saying how to start workers.
    FileNotFoundError
        ``scheduler_file`` did not appear within ``timeout``.
    ValueError
        Both or, with ``local=False``, neither of ``scheduler`` and ``scheduler_file``; a
        malformed address or scheduler file.
    """
    from distributed import Client, LocalCluster

    if scheduler is not None and scheduler_file is not None:
        raise InvalidInputError("give either scheduler (an address) or scheduler_file, not both")
    origin = ""
    if scheduler_file is not None:
        scheduler = scheduler_address_from_file(scheduler_file, timeout)
        origin = f" (read from scheduler file {str(scheduler_file)!r})"
    if scheduler is not None:
        check_scheduler(scheduler, timeout, security, origin)
        with _dropping("asyncio", _abandoned_gathers), Client(scheduler, timeout=timeout,
                                                               security=security) as client:
            # without a worker every computation waits forever, silently
            _wait_for_a_worker(client, scheduler, scheduler_file, timeout, quiet)
            yield client
        return
    if not local:
        raise InvalidInputError(
            "no scheduler given: pass scheduler='tcp://host:8786' or scheduler_file=... "
            "(CLI: --scheduler / --scheduler-file), or local=True for a cluster on this machine"
        )
    workers, threads = local_cluster_size(n_workers, threads_per_worker)
    with _sigint_only_here():
        cluster = LocalCluster(
            n_workers=workers, threads_per_worker=threads, processes=True, host="127.0.0.1",
            memory_limit=memory_limit, dashboard_address=_dashboard_address(),
        )
    interrupted = _Switch()
    # the nanny's warnings are dropped only while the cluster closes after a Ctrl-C
    with _dropping("asyncio", _abandoned_gathers), \
            _dropping("distributed.nanny", _nanny_kills(interrupted)), cluster, Client(cluster) as client:
        client.run(_quiet_cancelled_tasks)  # in the workers this started, not here
        if not quiet:
            log.info("local Dask cluster, %s", describe(client))
            log.info("dashboard %s", _dashboard(client))
        try:
            yield client
        except KeyboardInterrupt:
            interrupted.on = True
            raise
        finally:  # the workers end with this block: no unclosed session, also after an error
            if not interrupted.on:
                from .io._remote import close_sessions

                with contextlib.suppress(Exception):  # workers lost: the error raised stands
                    client.run(close_sessions)


#: the dashboard's port when it is free (Dask's default); else any free port, chosen by
#: the system rather than by distributed, which would warn "Port 8787 is already in use"
DASHBOARD_PORT = 8787


def _dashboard_address() -> str:
    """``":8787"`` if nothing listens there (another cluster's dashboard), else ``":0"``."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind(("", DASHBOARD_PORT))
        except OSError:
            return ":0"
    return f":{DASHBOARD_PORT}"


class _Switch:
    """A flag a filter reads: set when the block it guards was interrupted."""

    on = False


def _abandoned_gathers(record: logging.LogRecord) -> bool:
    """asyncio's "Task exception was never retrieved" for distributed's ``AllExit``.

    A gather interrupted by Ctrl-C leaves one waiting task per result; when the client
    releases the results each fails with ``AllExit``, which nobody awaits any more, and
    asyncio would log a traceback for every one of them.
    """
    exc = record.exc_info[1] if record.exc_info else None
    return type(exc).__name__ == "AllExit" and type(exc).__module__ == "distributed.client"


def _nanny_kills(interrupted: _Switch):
    """The nanny's warnings (not its errors) once ``interrupted``: closing the local cluster
    after Ctrl-C kills a busy worker, which does not stop within the nanny's 4 s grace
    inside a long BLAS product, and the nanny warns "Worker process still alive after 4.0
    seconds, killing": the kill is what Ctrl-C asked for."""
    def dropped(record: logging.LogRecord) -> bool:
        return interrupted.on and record.levelno < logging.ERROR

    return dropped


def _quiet_cancelled_tasks() -> None:
    """Run on the local workers: no warning for a task cancelled because the cluster closes.

    After Ctrl-C the cluster is closed while a fold is running, and every worker would
    print "Async instruction ... ended with CancelledError" (the only warning of that
    logger; its errors still show).
    """
    logging.getLogger("distributed.worker.state_machine").setLevel(logging.ERROR)


@contextlib.contextmanager
def _dropping(name: str, drop):
    """While the block runs, the records of logger ``name`` that ``drop(record)`` selects
    are not logged.

    The filter sits on that one logger and is removed when the block ends, so that a
    program's logging is as it was once :func:`connect` returns.
    """
    logger = logging.getLogger(name)

    def keep(record: logging.LogRecord) -> bool:
        return not drop(record)

    logger.addFilter(keep)
    try:
        yield
    finally:
        logger.removeFilter(keep)


@contextlib.contextmanager
def _sigint_only_here():
    """Processes and threads started in this block never see SIGINT; this process still does.

    Ctrl-C in a terminal signals every process of the foreground group: local workers
    would die printing tracebacks while this process closes them in order.  A blocked
    signal mask is inherited by threads and across fork and exec, and the main thread's
    is restored at the end, so a Ctrl-C during the block is delivered then, not lost.
    multiprocessing's resource tracker unblocks SIGINT in the thread that starts it (the
    one that would go on to start the workers), so it is started first, outside the block.
    """
    if threading.current_thread() is not threading.main_thread() or not hasattr(
            signal, "pthread_sigmask"):  # only the main thread gets signals; Windows has none
        yield
        return
    from multiprocessing import resource_tracker

    resource_tracker.ensure_running()
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def _wait_for_a_worker(client, address: str, scheduler_file, timeout: float, quiet: bool):
    """Return once the scheduler has a worker; raise :class:`NoWorkers` after ``timeout`` s."""
    if client.nthreads():
        return
    if not quiet:
        log.info("waiting up to %g s for a worker to join the scheduler at %s", timeout, address)
    try:
        client.wait_for_workers(1, timeout=timeout)
    except TimeoutError:
        how = f"--scheduler-file {scheduler_file}" if scheduler_file is not None else address
        raise NoWorkers(
            f"the Dask scheduler at {address} has no workers (waited {timeout:g} s); start "
            f"them with `dask worker {how}` on the machines that should compute, or wait "
            "longer with --timeout"
        ) from None


def local_cluster_size(n_workers: int | None = None, threads_per_worker: int | None = None):
    """(workers, threads per worker) for a local cluster using every core of this machine.

    One process per two cores (one per core below four cores): every thread keeps one
    running d x d sum during a pass, whatever the layout, and two threads per process share
    one process's fixed cost (Python and the libraries, about 0.3 GB) while their products
    still run side by side (the BLAS call releases the GIL).  Either number, when given,
    is kept and the other fills the cores.

    Parameters
    ----------
    n_workers : int, optional
        Number of worker processes; default: from the cores.
    threads_per_worker : int, optional
        Threads per worker; default: from the cores.

    Returns
    -------
    n_workers : int
        Worker processes.
    threads_per_worker : int
        Threads in each.
    """
    cores = cpu_count()
    if threads_per_worker is None:
        if n_workers is not None:
            threads_per_worker = max(1, cores // n_workers)
        else:
            threads_per_worker = 2 if cores >= 4 else 1
    if n_workers is None:
        n_workers = max(1, cores // threads_per_worker)
    return int(n_workers), int(threads_per_worker)


def describe(client) -> str:
    """One line: scheduler address, number of workers, threads and total memory limit.

    Parameters
    ----------
    client : distributed.Client
        The client whose cluster to describe.

    Returns
    -------
    str
        The description, for a log or the command line's summary.
    """
    from dask.utils import format_bytes

    info = client.scheduler_info(n_workers=-1)
    workers = info["workers"].values()
    threads = sum(w["nthreads"] for w in workers)
    limits = [w.get("memory_limit") or 0 for w in workers]
    memory = f"{format_bytes(sum(limits))} memory" if limits and all(limits) else "no memory limit"
    return f"scheduler {info['address']}: {len(workers)} worker(s), {threads} thread(s), {memory}"


def scheduler_address_from_file(path, timeout: float = 10) -> str:
    """The ``address`` in a scheduler file, waiting up to ``timeout`` s for it to appear.

    The scheduler writes the file in place, so a reader can find it empty or half written:
    unreadable content is read again until the deadline, and only then is an error.

    Parameters
    ----------
    path : str or os.PathLike
        The file ``dask scheduler --scheduler-file PATH`` writes.
    timeout : float
        Seconds to wait for it to appear and hold an address.

    Returns
    -------
    str
        The scheduler's address, e.g. ``"tcp://10.0.0.5:8786"``.
    """
    path = Path(path)
    deadline = time.monotonic() + timeout
    while True:
        problem = None
        if path.exists():
            try:
                return str(json.loads(path.read_text())["address"])
            except (ValueError, KeyError, TypeError) as exc:
                problem = exc
        if time.monotonic() >= deadline:
            break
        time.sleep(0.1)
    if problem is None:
        raise PathNotFoundError(
            f"scheduler file {str(path)!r} does not exist (waited {timeout:g} s); start the "
            f"scheduler with `dask scheduler --scheduler-file {path}` on storage this "
            "machine shares, or give the address with --scheduler tcp://host:8786"
        )
    raise InvalidInputError(
        f"{str(path)!r} is not a Dask scheduler file (expected JSON with an 'address'): {problem}"
    )


def check_scheduler(address: str, timeout: float = 10, security=None, origin: str = "") -> None:
    """Raise :class:`SchedulerUnreachable` unless a Dask scheduler answers at ``address``.

    Asks for the scheduler's identity with one hard deadline, so that an address where
    nothing listens, a firewall that drops packets, or a server that is not Dask (and never
    replies to Dask's handshake) all fail within ``timeout`` seconds; ``distributed.Client``
    alone can wait forever on the last.

    Parameters
    ----------
    address : str
        ``tcp://host:port``, ``tls://host:port`` (or any scheme distributed knows).
    timeout : float
        Seconds for the whole probe.
    security : distributed.security.Security, optional
        TLS settings; default: Dask's configuration.
    origin : str
        Said after the address in the message (e.g. which scheduler file it came from).

    Raises
    ------
    SchedulerUnreachable
        One line: the address, the timeout, the cause and what to check.
    ValueError
        A malformed address, or a ``tls://`` address without a client certificate.
    """
    from distributed.comm.addressing import parse_address
    from distributed.comm.registry import get_backend
    from distributed.security import Security

    try:
        scheme, where = parse_address(address)
        get_backend(scheme)
    except ValueError as exc:
        raise InvalidInputError(
            f"{address!r} is not a scheduler address; expected e.g. tcp://host:8786 ({exc})"
        ) from None
    problem = None if scheme == "inproc" else _host_port_problem(where)
    if problem is not None:  # nothing would answer: say so before connecting, not after
        raise InvalidInputError(f"{address!r}{origin} is not a scheduler address: {problem}; a valid "
                         "one looks like tcp://host:8786 (scheme://host:port)")
    security = security or Security()
    tls = security.get_tls_config_for_role("client")
    if scheme == "tls" and not (tls.get("ca_file") and tls.get("cert")):
        raise InvalidInputError(
            f"{address} is a TLS address but no TLS client certificate is configured: pass "
            "security=Security(tls_ca_file=..., tls_client_cert=..., tls_client_key=...) or "
            "set distributed.comm.tls.ca-file and distributed.comm.tls.client.cert/key in the "
            "Dask configuration (see cluster/tls.md)"
        )
    try:
        with ThreadPoolExecutor(1) as pool:  # own event loop, also under a running one
            identity = pool.submit(asyncio.run, _identity(address, timeout, security)).result()
    except Exception as exc:  # a garbled reply can surface as any exception type
        reason, hint = _diagnose(exc)
    else:
        kind = identity.get("type") if isinstance(identity, dict) else None
        if kind == "Scheduler":
            return
        reason = f"it answered as a Dask {kind}, not a scheduler" if kind else "not Dask"
        hint = _CHECK_RUNNING
    message = (f"cannot reach a Dask scheduler at {address}{origin} within {timeout:g} s "
               f"({reason}); {hint}")
    raise SchedulerUnreachable(" ".join(message.split())) from None



def _host_port_problem(where: str) -> str | None:
    """What is wrong with the ``host:port`` part of an address, or None."""
    host, colon, port = where.rpartition(":")
    if not colon or not port:
        return "it has no port"
    if not port.isdigit():
        return f"its port {port!r} is not a number"
    if not 0 < int(port) < 65536:
        return f"its port {port} is not in 1-65535"
    if not host.strip("[]"):
        return "it has no host"
    return None


async def _identity(address: str, timeout: float, security) -> dict:
    """The ``identity`` reply of whatever Dask server listens at ``address``."""
    from distributed.core import rpc

    args = security.get_connection_args("client")

    async def ask():
        async with rpc(address, timeout=timeout, connection_args=args) as server:
            return await server.identity()

    return await asyncio.wait_for(ask(), timeout)


def _diagnose(exc: BaseException) -> tuple[str, str]:
    """(cause, what to check) of a failed probe, for the one-line message."""
    chain: list[BaseException] = []
    link: BaseException | None = exc
    while link is not None and len(chain) < 10:
        chain.append(link)
        link = link.__cause__ or link.__context__
    tls = [e for e in chain if isinstance(e, ssl.SSLError)]
    if tls:
        return (f"TLS handshake failed: {tls[-1]}", "check that the CA file and the client "
                "certificate belong to the cluster's CA (see cluster/tls.md)")
    first, text = chain[0], str(chain[0]).strip()
    if isinstance(first, (TimeoutError, asyncio.TimeoutError)) or text.startswith("Timed out"):
        return "timed out", _CHECK_RUNNING
    if isinstance(first, OSError):
        return (text.splitlines()[0] if text else type(first).__name__), _CHECK_RUNNING
    return f"the reply was not Dask's protocol: {type(first).__name__}", _CHECK_RUNNING


# ---------------------------------------------------------------------------- shared paths
def active_client():
    """The active ``distributed.Client`` (the one Dask computes on), or None.

    Returns
    -------
    distributed.Client or None
        The client, or None when Dask computes without one (its local schedulers).
    """
    if "distributed" not in sys.modules:  # never imported: no client can be active
        return None
    try:
        from distributed import get_client

        return get_client()
    except (ImportError, ValueError):
        return None


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
    client = active_client()
    if client is None:
        import dask

        return dask.delayed(value)
    return client.scatter(value, hash=True)  # hashed: the same matrix is sent once


def check_workers_see(client, path, what: str, *, output: bool = False, shown=None,
                      fix: str = SHARE_FIX) -> None:
    """Raise :class:`NotShared` unless every worker of ``client`` sees ``path`` as this
    process does; nothing for a URL (every worker reaches it) or without a client.

    A worker opens a local path on its own machine, and one that does not share this
    machine's files finds nothing there: it would fail on the first chunk (or read an
    absent store as fill values), or write its chunks to its own disk, out of this
    process's sight.  One round trip to every worker, before the work, finds it out.

    Parameters
    ----------
    client : distributed.Client or None
        The workers to ask; None: nothing to check.
    path : str or Path
        Input: a file this process reads (a Zarr array's metadata), which every worker must
        find with the same size and first MiB.  ``output``: a folder this process made
        for the workers to write into (a temporary one: a token file is written there and
        removed), whose token every worker must read, and where it must be able to write.
    what : str
        What ``path`` is, for the message ("the input store").
    output : bool
        Whether ``path`` is a folder the workers write into (see ``path``) rather than an
        input they read.
    shown : str or Path, optional
        The path the user gave, named in the message (default ``path``).
    fix : str
        What to do about it, said at the end of the message.
    """
    from .io._remote import is_remote

    if client is None or is_remote(path):
        return
    path = os.path.abspath(path)
    if output:
        name = f".dfairpca-probe-{secrets.token_hex(8)}"
        token = secrets.token_hex(16)
        with open(os.path.join(path, name), "w") as f:
            f.write(token)
        try:
            seen = client.run(_sees_folder, path, name, token, on_error="return")
        finally:
            os.unlink(os.path.join(path, name))
        here = None
    else:
        here = _sees_file(path)
        if isinstance(here, str):  # not readable here either: nothing to compare with
            return
        seen = client.run(_sees_file, path, on_error="return")
    failed = sorted((a, e) for a, e in seen.items() if isinstance(e, BaseException))
    if failed:  # not an answer about the path: a worker that cannot run the question
        (address, exc), more = failed[0], len(failed) - 1
        raise UnreachableError(
            f"cannot ask the Dask worker {address}{f' (and {more} more)' if more else ''} whether "
            f"it sees {str(shown or path)!r} ({type(exc).__name__}: {exc}); every worker needs "
            "the same dfairpca, dask and distributed versions as this process"
        )
    bad = {}
    for address, answer in sorted(seen.items()):
        if output and answer is not None:
            bad[address] = answer
        elif not output and answer != here:
            bad[address] = answer if isinstance(answer, str) else "another file is there"
    if bad:
        named = ", ".join(f"{a} ({why})" for a, why in list(bad.items())[:_NAMED_WORKERS])
        rest = f" and {len(bad) - _NAMED_WORKERS} more" if len(bad) > _NAMED_WORKERS else ""
        verb = "write" if output else "read"
        who = f"{len(bad)} of the {len(seen)} Dask workers" if len(seen) > 1 else "the Dask worker"
        raise NotShared(
            f"{who} cannot {verb} {what} "
            f"{str(shown or path)!r} at that path, which they open on their own machines: "
            f"{named}{rest}; {fix}"
        )


def check_inputs_shared(X, client=None) -> None:
    """:func:`check_workers_see` for every local Zarr array the Dask array X's graph reads
    (its metadata file).

    Parameters
    ----------
    X : dask.array.Array or any
        The input; anything but a Dask array reading local Zarr stores is not checked.
    client : distributed.Client, optional
        The workers to ask (default: the active client, if any).
    """
    client = client if client is not None else active_client()
    if client is None:
        return
    from .io._remote import zarr_arrays

    seen = set()
    for array in zarr_arrays(X):
        root = getattr(array.store, "root", None)  # a local store's folder
        if root is None:
            continue
        meta = "zarr.json" if array.metadata.zarr_format == 3 else ".zarray"
        folder = os.path.join(os.fspath(root), *array.path.split("/")) if array.path else os.fspath(root)
        if folder not in seen:
            seen.add(folder)
            check_workers_see(client, os.path.join(folder, meta), "the Zarr array", shown=folder)


def not_here(path, what: str, verb: str = "reads") -> NotShared:
    """The error of a process that does not find ``what`` at ``path`` (a worker reading
    a store that is not there): names this worker and the fix.

    Parameters
    ----------
    path : str or os.PathLike
        Where it looked.
    what : str
        What it looked for ("the input store").
    verb : str
        What it does with it ("reads", "writes"), for the message.

    Returns
    -------
    NotShared
        The error, to raise.
    """
    try:
        from distributed import get_worker

        where = f"the Dask worker {get_worker().address}"
    except (ImportError, ValueError):
        where = f"this process (host {socket.gethostname()})"
    return NotShared(f"{what} {str(path)!r} does not exist on {where}, which {verb} it at that "
                     f"path on its own machine; {SHARE_FIX}")


def _sees_file(path: str):
    """(size, sha256 of the first MiB) of the file ``path`` as this process sees it, or
    why it cannot (run on every worker by :func:`check_workers_see`)."""
    try:
        with open(path, "rb") as f:
            head = f.read(_HEAD_BYTES)
            size = os.fstat(f.fileno()).st_size
    except OSError as exc:
        return _why(exc)
    return size, hashlib.sha256(head).hexdigest()


def _sees_folder(path: str, name: str, token: str):
    """None if the folder ``path`` holds the file ``name`` with ``token`` and takes a new
    file; else why not (run on every worker by :func:`check_workers_see`)."""
    try:
        with open(os.path.join(path, name)) as f:
            if f.read() != token:
                return "another folder is there"
    except OSError as exc:
        return _why(exc)
    probe = os.path.join(path, f"{name}-{secrets.token_hex(8)}")
    try:
        with open(probe, "w"):
            pass
        os.unlink(probe)
    except OSError as exc:
        return f"cannot write there: {_why(exc)}"
    return None


def _why(exc: OSError) -> str:
    """An OSError as a few words: "not there", "no permission", or its strerror."""
    if isinstance(exc, (FileNotFoundError, NotADirectoryError)):
        return "not there"
    if isinstance(exc, PermissionError):
        return "no permission"
    return exc.strerror or type(exc).__name__


def _dashboard(client) -> str:
    """The dashboard's address, noting when bokeh (which draws it) is missing."""
    link = client.dashboard_link
    if importlib.util.find_spec("bokeh") is None:
        return f"{link} (needs `pip install bokeh`)"
    return link


# ---------------------------------------------------------------------------- workers that all leave
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
    from .base._params import is_real

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
