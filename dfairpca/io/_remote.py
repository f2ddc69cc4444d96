"""The stores a Dask graph reads (what a cluster and a checkpoint ask of them), the sessions
a process's reads of object storage leave open, and how long a read of a remote store may
go unanswered (:func:`answered`).  Where a URL leads is :mod:`dfairpca.io._urls`; the write
protocol on object storage is :mod:`dfairpca.io._fsspec`.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import sys
from collections.abc import Awaitable, Iterator
from pathlib import Path
from typing import Any, TypeVar
from zarr.core.sync import sync
import zarr

from ._urls import store_url
from ..errors import UnreachableError

__all__ = ["close_sessions", "zarr_arrays", "zarr_roots", "STORE_TIMEOUT_ANNOTATION",
           "store_timeout", "task_store_timeout", "answered", "StoreTimeout"]

T = TypeVar("T")

#: the Dask annotation under which a computation's tasks carry the seconds a request to a
#: remote store may go unanswered (a fit's ``timeout``; see :func:`task_store_timeout`)
STORE_TIMEOUT_ANNOTATION = "dfairpca_store_timeout"

_STORE_TIMEOUT: contextvars.ContextVar = contextvars.ContextVar("dfairpca_store_timeout",
                                                                default=None)


class StoreTimeout(UnreachableError):
    """A request to a remote store got no answer within the computation's timeout.

    ``url`` is the store's, ``endpoint`` its server's (if the options name one), ``key``
    what was being read; a checkpointed pass also says where it saved what it had
    finished: ``checkpoint``, and ``progress`` such as "16 of 60 chunks" (else both None).
    ``what`` is what happened, without the way on.
    """

    def __init__(self, url: str, seconds: float, key: str, endpoint: str | None = None,
                 checkpoint=None, progress: str | None = None):
        self.url, self.seconds, self.key, self.endpoint = url, seconds, key, endpoint
        self.checkpoint, self.progress = checkpoint, progress
        self.what = (f"the storage of {url}{f' at {endpoint}' if endpoint else ''} did not "
                     f"answer within {seconds:g} s (reading {key!r})")
        check = "check that the server is up and reachable from the Dask workers"
        if checkpoint is None:
            how = f"{check}, or wait longer with a larger timeout (timeout=, --timeout)"
        else:
            how = (f"the checkpoint {str(checkpoint)!r} holds {progress}: {check}, then run "
                   "the same call again to continue")
        super().__init__(f"{self.what}; {how}")

    def __reduce__(self):  # travels from a worker to the client intact
        return type(self), (self.url, self.seconds, self.key, self.endpoint, self.checkpoint,
                            self.progress)

    def saved(self, checkpoint, progress: str) -> "StoreTimeout":
        """The same timeout, saying that ``checkpoint`` holds ``progress``.

        Parameters
        ----------
        checkpoint : str or os.PathLike
            The checkpoint of the interrupted pass, named in the message.
        progress : str
            What it holds (e.g. "12 of 40 chunks"), said in the message.

        Returns
        -------
        StoreTimeout
            A new error with the longer message; raise it ``from`` this one.
        """
        return StoreTimeout(self.url, self.seconds, self.key, self.endpoint, checkpoint, progress)


def task_store_timeout() -> float | None:
    """The seconds of :data:`STORE_TIMEOUT_ANNOTATION` on the Dask task this thread runs on
    a distributed worker, or None (no such task, or no such annotation).

    The timeout is a property of the computation, given when the fit starts, long after the
    graph (and the Zarr arrays in it) were made: it reaches the worker as an annotation of
    every task of that computation.
    """
    worker_module = sys.modules.get("distributed.worker")
    if worker_module is None:  # not a distributed worker process
        return None
    key = getattr(worker_module.thread_state, "key", None)
    if key is None:
        return None
    try:
        task = worker_module.get_worker().state.tasks.get(key)
    except (ValueError, AttributeError):  # not on a worker's thread
        return None
    seconds = ((task.annotations if task is not None else None) or {}).get(STORE_TIMEOUT_ANNOTATION)
    return float(seconds) if seconds is not None else None


@contextlib.contextmanager
def store_timeout(seconds: float | None) -> Iterator[None]:
    """Requests to remote stores awaited through :func:`answered` in this context (and in
    the coroutines it starts: asyncio copies the context into them) end after ``seconds``
    without an answer (None: no limit of dfairpca's, only the file system's own).

    Parameters
    ----------
    seconds : float or None
        How long a request may go unanswered.

    Yields
    ------
    None
        The block runs with that limit.
    """
    token = _STORE_TIMEOUT.set(seconds)
    try:
        yield
    finally:
        _STORE_TIMEOUT.reset(token)


async def answered(store, request: Awaitable[T], key: str) -> T:
    """``await request`` (a read of ``key`` from ``store``), ending with :class:`StoreTimeout`
    when a remote store has not answered within the :func:`store_timeout` in force.

    s3fs alone retries a request that times out (5 times, each up to 5 botocore attempts
    of a 15 s read timeout): a server that stops answering would hold a fit for half an
    hour.  The whole request, retries included, gets the computation's timeout instead.
    The request runs as its own task, cancelled at the timeout and not awaited after:
    whatever its cancellation still does (closing a connection to a silent server), the
    read ends now.
    """
    seconds = _STORE_TIMEOUT.get()
    url = store_url(store) if seconds is not None else None
    if url is None:  # no limit, or a local store (a disk is not a server that can freeze)
        return await request
    task = asyncio.ensure_future(request)
    try:
        done, _ = await asyncio.wait({task}, timeout=seconds)
    except asyncio.CancelledError:  # the read itself was cancelled: so is its request
        task.cancel()
        raise
    if task in done:
        return task.result()
    task.cancel()
    task.add_done_callback(_forget)
    options = getattr(getattr(store, "fs", None), "storage_options", None) or {}
    endpoint = options.get("endpoint_url") or (options.get("client_kwargs") or {}).get("endpoint_url")
    raise StoreTimeout(url, seconds, key, endpoint)


def _forget(task: asyncio.Future) -> None:
    """Collect the outcome of a request left behind, so that asyncio does not log it."""
    if not task.cancelled():
        task.exception()


def close_sessions() -> None:
    """Close the HTTP sessions of this process's asynchronous s3fs file systems, those
    zarr opens for ``s3://`` stores, and forget them (a later read makes new ones).

    s3fs closes its synchronous file systems when they are collected, but never an
    asynchronous one: a worker process that read or wrote an S3 store would end with
    aiohttp's "Unclosed client session" on stderr.  Called on a local cluster's workers
    before they close (:func:`dfairpca.cluster.connect`).
    """
    s3fs = sys.modules.get("s3fs")
    if s3fs is None:  # never imported: no session to close
        return
    cache = s3fs.S3FileSystem._cache
    for key, fs in list(cache.items()):
        s3 = getattr(fs, "_s3", None)
        if not fs.asynchronous or s3 is None:
            continue
        del cache[key]
        fs._s3 = None
        try:  # on zarr's event loop, which made the session
            sync(s3.__aexit__(None, None, None), timeout=10)
        except Exception:  # a session that cannot close is left to the collector
            pass


def zarr_arrays(X) -> list:
    """The Zarr arrays a Dask array's graph reads (dask's from_array keeps the array).

    Parameters
    ----------
    X : dask.array.Array
        The array.

    Returns
    -------
    list of zarr.Array
        Each array its graph reads, once.
    """
    graph = X.__dask_graph__()
    found: dict[int, Any] = {}
    for layer in getattr(graph, "layers", {"": graph}).values():
        for node in layer.values():
            node = node if isinstance(node, zarr.Array) else getattr(node, "value", None)
            if isinstance(node, zarr.Array):
                found.setdefault(id(node), node)
    return list(found.values())


def zarr_roots(X) -> list:
    """The roots of the stores X's graph reads: local folders (Path) and URLs (str).

    Parameters
    ----------
    X : dask.array.Array
        The array.

    Returns
    -------
    list of pathlib.Path or str
        The roots, sorted.
    """
    roots = set()
    for array in zarr_arrays(X):
        root = getattr(getattr(array, "store", None), "root", None)
        roots.add(Path(root) if root is not None else store_url(array.store))
    roots.discard(None)
    return sorted(roots, key=str)
