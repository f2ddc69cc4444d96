"""Making a ``distributed.Client`` active: a running scheduler, checked to answer before
connecting, or a local cluster sized to this machine (:func:`connect`)."""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import logging
import socket
import ssl
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from ..base._interrupts import ctrl_c_kept
from ..base._system import cpu_count
from ..errors import InvalidInputError, PathNotFoundError
from ..engine._compute import cluster_failures_said
from ..engine._failures import NoWorkers
from ..io import StoreTimeout
from ._errors import _CHECK_RUNNING, SchedulerUnreachable
from ._signals import (_abandoned_gathers, _cancelled_feeds, _dropping, _early_sync_cancels, _nanny_kills,
                       _quiet_cancelled_tasks, _quiet_closed_heartbeats, _quiet_failed_tasks, _sigint_only_here,
                       _Switch, holding_lost_connections)

# Deferred imports: dask, distributed (heavy or optional) and package modules that load such
# libraries, or this module, at import are imported in the functions that use them, so that
# importing this module stays light.

#: where the cluster's size, dashboard and waits are told (INFO): the command line shows
#: them on stderr; a program sees them only if it configures logging to
log = logging.getLogger("dfairpca.cluster")


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
        and dashboard address, nor that this waits for a worker.  A local cluster has a
        dashboard only where bokeh, which draws it, is installed (``pip install bokeh``).
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
        # a lost scheduler's tracebacks are held, and dropped if the loss is reported in
        # one line (SchedulerLost) or logged if the connection comes back
        # a Ctrl-C raised inside distributed's gc callback would be dropped: kept; the
        # traceback distributed logs for one that lands before its loop started the call
        # interrupted (on a loaded machine) is dropped
        with ctrl_c_kept(), holding_lost_connections() as held:
            with _dropping("asyncio", _abandoned_gathers), \
                    _dropping("tornado.application", _early_sync_cancels), \
                    Client(scheduler, timeout=timeout, security=security) as client:
                held.client = client
                # without a worker every computation waits forever, silently
                _wait_for_a_worker(client, scheduler, scheduler_file, timeout, quiet)
                # a loss met by a call that computes nothing (asking the workers, shipping
                # a model) is said as a computation's is: one line naming the scheduler
                # (only an error that names it: the block runs the caller's code too)
                with cluster_failures_said(client, named_only=True):
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
            # the scheduler's HTTP server (health, metrics) starts anyway; without bokeh,
            # no dashboard on it, and none of distributed's lines about the missing package
            scheduler_kwargs={"dashboard": _has_bokeh()},
        )
    interrupted = _Switch()
    # the nanny's warnings are dropped only while the cluster closes after a Ctrl-C
    # the scheduler's gc callback runs in this process: a Ctrl-C raised in it is kept;
    # distributed's traceback of a Ctrl-C that came before its loop started the call: dropped
    with ctrl_c_kept(), _dropping("asyncio", _abandoned_gathers), \
            _dropping("distributed.nanny", _nanny_kills(interrupted)), \
            _dropping("distributed.scheduler", _cancelled_feeds), \
            _dropping("tornado.application", _early_sync_cancels), \
            cluster, Client(cluster) as client:
        client.run(_quiet_cancelled_tasks)  # in the workers this started, not here
        client.run(_quiet_failed_tasks)
        client.run(_quiet_closed_heartbeats)
        if not quiet:
            log.info("local Dask cluster, %s", describe(client))
            if _has_bokeh():
                log.info("dashboard %s", client.dashboard_link)
        ctrl_c = False
        try:
            yield client
        except KeyboardInterrupt:
            ctrl_c = interrupted.on = True
            raise
        except StoreTimeout:
            # a worker may still be in a read of the frozen store (bounded by the same
            # timeout) when the nanny's 4 s grace ends: its kill is expected, as after Ctrl-C
            interrupted.on = True
            raise
        finally:  # the workers end with this block: no unclosed session, also after an error
            if not ctrl_c:
                from ..io import close_sessions

                with contextlib.suppress(Exception):  # workers lost: the error raised stands
                    client.run(close_sessions)
            if not interrupted.on:  # after a Ctrl-C, distributed's short grace and its kill
                _close_workers(cluster, WORKER_EXIT_SECONDS)


#: the dashboard's port when it is free (Dask's default); else any free port, chosen by
#: the system rather than by distributed, which would warn "Port 8787 is already in use"
DASHBOARD_PORT = 8787
#: seconds a local worker process is given to end at a normal exit before it is killed:
#: distributed's own close gives 4 s, which a process tearing down its interpreter (numpy,
#: SciPy, its threads) on a loaded 2-core machine overruns, and its nanny then warns
#: "Worker process still alive ... killing" at the end of a successful command
WORKER_EXIT_SECONDS = 30


def _has_bokeh() -> bool:
    """Whether bokeh, which draws the dashboard, is installed (without importing it)."""
    return importlib.util.find_spec("bokeh") is not None


def _close_workers(cluster, timeout: float) -> None:
    """Close a local cluster's worker processes, each given ``timeout`` s to end on its own
    (the cluster's close then finds them closed; if this fails, that close does it all)."""
    async def close() -> None:
        await asyncio.gather(*(nanny.close(timeout=timeout) for nanny in list(cluster.workers.values())))

    # the scheduler (in this process) would warn that removing a worker loses the results
    # it holds: at the close, after a failure, no one will read them
    scheduler_log = logging.getLogger("distributed.scheduler")
    level = scheduler_log.level
    scheduler_log.setLevel(logging.ERROR)
    try:
        with contextlib.suppress(Exception):
            cluster.sync(close)
    finally:
        scheduler_log.setLevel(level)


def _dashboard_address() -> str:
    """``":8787"`` if nothing listens there (another cluster's dashboard), else ``":0"``."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind(("", DASHBOARD_PORT))
        except OSError:
            return ":0"
    return f":{DASHBOARD_PORT}"


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
