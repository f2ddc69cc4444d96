"""Files: reading Zarr stores as Dask arrays, saving and loading models without pickle.

A saved object is a directory holding ``arrays.npz`` (plain numeric/string arrays, read
with ``allow_pickle=False``) and ``meta.json``.  Every write goes to a temporary sibling
directory that is moved into place only when complete, so an interrupted save never leaves
a half-written model under the final name.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import uuid
from pathlib import Path

import numpy as np

__all__ = ["from_zarr", "save_arrays", "load_arrays", "atomic_directory", "FORMAT_VERSION"]

FORMAT_VERSION = 1


def from_zarr(store, component: str | None = None, *, rows_per_chunk: int | None = None,
              storage_options: dict | None = None):
    """Open a Zarr array lazily as a Dask array chunked along rows only.

    Parameters
    ----------
    store : str, Path, zarr.Array or zarr.Group
        A Zarr array, or a group together with ``component``.
    component : str, optional
        Name of the array inside the group (e.g. ``"images"``).
    rows_per_chunk : int, optional
        Rows per Dask chunk; default: the store's own chunking along the first axis,
        merged up to roughly 64 MiB per chunk.
    storage_options : dict, optional
        For a URL (``s3://``, ``gs://``, any fsspec protocol): options of the file system,
        e.g. ``{"anon": True}``; the package (s3fs, gcsfs, ...) must be installed on the
        client and on every worker.

    Returns
    -------
    dask.array.Array
        Lazy; workers read the chunks themselves (the graph holds the store, not data).
    """
    import dask.array as da
    import zarr

    node = store
    if isinstance(store, str) and "://" in store:
        try:
            node = zarr.open(store, mode="r", storage_options=storage_options)
        except Exception as exc:
            raise ValueError(f"cannot open the Zarr store {store!r}: {exc}") from exc
    elif isinstance(store, (str, os.PathLike)):
        path = Path(store)
        if not path.exists():
            raise FileNotFoundError(f"no Zarr store at {str(path)!r}")
        try:
            node = zarr.open(str(path), mode="r")
        except Exception as exc:  # zarr raises several types for "not a store"
            raise ValueError(f"{str(path)!r} is not a Zarr store: {exc}") from exc
    if isinstance(node, zarr.Group):
        names = sorted(name for name, _ in node.arrays())
        if component is None:
            raise ValueError(
                f"{_name(store)} is a Zarr group, not an array; name the array with "
                f"component=..., one of {names}"
            )
        if component not in names:
            raise KeyError(
                f"{_name(store)} has no array {component!r}; it holds {names or 'no arrays'}"
            )
        node = node[component]
    elif component is not None:
        raise ValueError(f"{_name(store)} is a single array; drop component={component!r}")
    shape, chunks = node.shape, node.chunks
    if len(shape) < 2:
        raise ValueError(f"{_name(store)} has shape {shape}; need (n, d) or (n, h, w)")
    row_bytes = int(np.prod(shape[1:])) * node.dtype.itemsize
    if rows_per_chunk is None:
        target = max(1, (64 << 20) // max(row_bytes, 1))
        rows_per_chunk = max(chunks[0], (target // chunks[0]) * chunks[0])
    arr = da.from_zarr(node, chunks=(rows_per_chunk,) + tuple(shape[1:]))
    return arr


def _name(store) -> str:
    return repr(str(store)) if isinstance(store, (str, os.PathLike)) else "the store"


@contextlib.contextmanager
def atomic_directory(path, overwrite: bool = True):
    """Yield a temporary directory that replaces ``path`` only if the block succeeds."""
    path = Path(path)
    if path.exists() and not overwrite:
        raise FileExistsError(f"{str(path)!r} exists; pass overwrite=True (CLI: --overwrite)")
    tmp = path.parent / f".{path.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir(parents=True)
    try:
        yield tmp
        if path.exists():
            old = path.parent / f".{path.name}.old-{uuid.uuid4().hex[:8]}"
            os.replace(path, old)
            os.replace(tmp, path)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, path)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def save_arrays(path, arrays: dict, meta: dict, overwrite: bool = True) -> Path:
    """Write ``arrays`` (.npz) and ``meta`` (JSON) to directory ``path`` atomically."""
    path = Path(path)
    with atomic_directory(path, overwrite=overwrite) as tmp:
        np.savez(tmp / "arrays.npz", **{k: np.asarray(v) for k, v in arrays.items()})
        with open(tmp / "meta.json", "w") as f:
            json.dump({"format_version": FORMAT_VERSION, **meta}, f, indent=1, default=_jsonable)
    return path


def load_arrays(path, kind: str | None = None):
    """Read what :func:`save_arrays` wrote; never unpickles anything."""
    path = Path(path)
    if not (path / "meta.json").exists() or not (path / "arrays.npz").exists():
        raise FileNotFoundError(
            f"{str(path)!r} is not a saved dfairpca object (expected meta.json and arrays.npz)"
        )
    with open(path / "meta.json") as f:
        meta = json.load(f)
    if meta.get("format_version", 0) > FORMAT_VERSION:
        raise ValueError(
            f"{str(path)!r} was written by a newer dfairpca (format {meta['format_version']}); "
            "upgrade dfairpca to read it"
        )
    if kind is not None and meta.get("kind") != kind:
        raise ValueError(f"{str(path)!r} holds a {meta.get('kind')!r}, not a {kind!r}")
    with np.load(path / "arrays.npz", allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    return arrays, meta


def _jsonable(o):
    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    raise TypeError(f"cannot store {type(o).__name__} in model metadata")
