"""The stores a Dask graph reads (what a cluster and a checkpoint ask of them), and the
sessions a process's reads of object storage leave open.  Where a URL leads is
:mod:`dfairpca.io._urls`; the write protocol on object storage is :mod:`dfairpca.io._fsspec`.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from ._urls import store_url

__all__ = ["close_sessions", "zarr_arrays", "zarr_roots"]


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
    from zarr.core.sync import sync

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
    """The Zarr arrays a Dask array's graph reads (dask's from_array keeps the array)."""
    import zarr

    graph = X.__dask_graph__()
    found: dict[int, Any] = {}
    for layer in getattr(graph, "layers", {"": graph}).values():
        for node in layer.values():
            node = node if isinstance(node, zarr.Array) else getattr(node, "value", None)
            if isinstance(node, zarr.Array):
                found.setdefault(id(node), node)
    return list(found.values())


def zarr_roots(X) -> list:
    """The roots of the stores X's graph reads: local folders (Path) and URLs (str)."""
    roots = set()
    for array in zarr_arrays(X):
        root = getattr(getattr(array, "store", None), "root", None)
        roots.add(Path(root) if root is not None else store_url(array.store))
    roots.discard(None)
    return sorted(roots, key=str)
