"""Writing a lazy Dask array into a Zarr array safely at any size, and checking by content
what was written.

A Zarr chunk is read, modified and written whole: two tasks that write parts of one chunk
lose one's rows without an error.  ``dask.array.to_zarr`` into an existing array rechunks
the data to Dask's ``array.chunk-size`` first, pieces that can straddle the Zarr chunks
(it warns "risk of data loss" and writes anyway).  So dfairpca never relies on it: the
output's chunks are chosen here (:func:`output_chunks`), the data is cut into blocks made
of whole chunks (:func:`aligned_to`) and stored block by block (:func:`store_aligned`),
each Zarr chunk written by exactly one task.  Then rows from every chunk, recomputed from
the input, are compared with what the store holds (:func:`sample_rows`,
:func:`check_rows`): a store that does not hold its rows is never reported written.
"""

from __future__ import annotations

import math
import os
from typing import TYPE_CHECKING

import numpy as np
import zarr

from ..errors import RunError

# Deferred imports: dask (heavy or optional) and package modules that load such libraries, or this
# module, at import are imported in the functions that use them, so that importing this module stays
# light.

if TYPE_CHECKING:  # Dask is imported where it is used: a store writer's processes never need it
    import dask.array as da

#: the most bytes one chunk of an output store holds: a worker holds the block being
#: written, its input and its products at once, and a reader decodes a chunk whole; X's row
#: chunks are kept up to this size (the demo's 2,048 faces of 80 x 80 in float32 are
#: 52 MB), cut evenly beyond it
OUTPUT_CHUNK_BYTES = 512 * 2**20
#: the fewest bytes a chunk of an output store holds where X's row chunks are smaller (a
#: representation of k = 10 columns, X sharded in chunks of one row): whole multiples of
#: X's row chunk up to this, so that neither the store's chunks nor the rows checked after
#: the write (three per chunk) grow with n
MIN_OUTPUT_CHUNK_BYTES = 8 * 2**20


class WrongRowsError(RunError):
    """The rows read back from a store just written differ from the same rows recomputed
    from the input: the store is not kept."""


def output_chunks(shape: tuple[int, ...], dtype, rows: int | None,
                  limit: int = OUTPUT_CHUNK_BYTES, least: int = MIN_OUTPUT_CHUNK_BYTES) -> tuple[int, ...]:
    """The chunks of an output store of ``shape`` and ``dtype``: ``rows`` rows per chunk
    (X's own row chunks; default all rows), whole along every other axis; a whole
    multiple of ``rows`` where a chunk would hold less than ``least`` bytes, and cut evenly
    into fewer rows when a chunk would exceed ``limit`` bytes.

    Parameters
    ----------
    shape : tuple of int
        The output's shape, rows first.
    dtype : dtype-like
        The output's dtype.
    rows : int or None
        Rows per chunk wanted (the input's Zarr row chunk).
    limit : int
        The most bytes a chunk may hold.
    least : int
        The fewest bytes a chunk holds (unless it holds every row).

    Returns
    -------
    tuple of int
        One chunk's shape: at least one row, whole along the other axes.
    """
    n = int(shape[0])
    row_bytes = max(1, math.prod(shape[1:]) * np.dtype(dtype).itemsize)
    wanted = max(1, min(int(rows) if rows else n, n))
    if wanted * row_bytes < least:
        wanted = min(n, wanted * math.ceil(least / (wanted * row_bytes)))
    pieces = math.ceil(wanted * row_bytes / limit)
    per_chunk = max(1, math.ceil(wanted / pieces))
    return (per_chunk, *(int(s) for s in shape[1:]))


def aligned_to(Y: da.Array, chunks: tuple[int, ...]) -> da.Array:
    """``Y`` cut into blocks of whole output chunks: every block boundary along the rows a
    multiple of ``chunks[0]``, every other axis one block.

    Y's blocks are kept where they already are so (no rechunk, no extra copy); otherwise
    Y is rechunked to as many whole chunks per block as its largest block holds, at least
    one.

    Parameters
    ----------
    Y : dask.array.Array
        The data to write.
    chunks : tuple of int
        The output array's chunk shape (:func:`output_chunks`).

    Returns
    -------
    dask.array.Array
        Y with blocks that each cover whole chunks of the output.
    """
    c = int(chunks[0])
    whole = tuple((s,) for s in Y.shape[1:])
    if Y.chunks[1:] != whole:
        Y = Y.rechunk((Y.chunks[0], *whole))
    ends = np.cumsum(Y.chunks[0])
    if np.all((ends[:-1] % c) == 0):
        return Y
    per_block = max(1, max(Y.chunks[0]) // c) * c
    return Y.rechunk((per_block, *whole))


def _check_alignment(Y: da.Array, array: zarr.Array) -> None:
    """Refuse to store ``Y`` into ``array`` unless every block covers whole chunks."""
    for axis, (blocks, chunk) in enumerate(zip(Y.chunks, array.chunks)):
        ends = np.cumsum(blocks)[:-1]
        if np.any(ends % chunk):
            raise ValueError(
                f"a block boundary of the data along axis {axis} cuts a Zarr chunk of "
                f"{chunk}: two tasks would write one chunk and one's rows would be lost; cut "
                "the data with dfairpca.io.aligned_to first"
            )


def store_aligned(Y: da.Array, array: zarr.Array):
    """The lazy store of ``Y`` into ``array``, block by block, each Zarr chunk written by
    exactly one task (no lock needed, none taken).

    Parameters
    ----------
    Y : dask.array.Array
        Data cut with :func:`aligned_to` for ``array``'s chunks.
    array : zarr.Array
        The array to write, of Y's shape (created with :func:`output_chunks`).

    Returns
    -------
    dask.delayed.Delayed
        Computing it writes every block.

    Raises
    ------
    ValueError
        If a block of Y would cut a Zarr chunk, or the shapes differ.
    """
    if tuple(Y.shape) != tuple(array.shape):
        raise ValueError(f"the data has shape {Y.shape} but the array {array.shape}")
    import dask.array as da

    _check_alignment(Y, array)
    return da.store(Y, array, lock=False, compute=False)  # type: ignore[arg-type]  # a zarr.Array takes slices


def sample_rows(n: int, chunk_rows: int, seed: int = 0) -> np.ndarray:
    """The rows checked after a write: the first and the last row of every chunk of
    ``chunk_rows`` rows, and one more row drawn inside each (sorted, unique).

    Parameters
    ----------
    n : int
        Rows written.
    chunk_rows : int
        Rows per chunk of the output.
    seed : int, default 0
        Seed of the rows drawn inside the chunks.

    Returns
    -------
    numpy.ndarray
        Row indices, int64, sorted.
    """
    if n <= 0:
        return np.zeros(0, dtype=np.int64)
    starts = np.arange(0, n, int(chunk_rows), dtype=np.int64)
    stops = np.minimum(starts + int(chunk_rows), n)
    drawn = np.random.default_rng(seed).integers(starts, stops)
    return np.unique(np.concatenate([starts, stops - 1, drawn]))


def check_rows(written, expected, rows: np.ndarray, shown: object) -> None:
    """Raise :class:`WrongRowsError` unless every row read back from a store equals the
    same row recomputed from the input.

    Equal means: to the rounding of the output dtype (the two computations add in
    different orders; relative to each row's largest value, 1e-3 for float32, 1e-9 for
    float64). An integer or bool output checked against float ``expected`` (the values
    before they were rounded or thresholded) must be a rounding of them: within 0.5 (and
    that rounding tolerance) of the value clipped to the dtype's range, or for bool,
    ``expected > 0.5`` unless the value sits within the tolerance of 0.5.  Integers
    against integers must be equal, or within one unit where the dtype holds more than
    0, 1 and 2 (faces drawn again on another CPU, rounded at .5).  A row shifted, zeroed
    or written by another block is off by the data's own scale.

    Parameters
    ----------
    written : numpy.ndarray
        The rows as the store holds them.
    expected : numpy.ndarray
        The same rows computed again from the input.
    rows : numpy.ndarray
        Their indices, named in the message.
    shown : str or os.PathLike
        The store, as the user named it.
    """
    if len(rows) == 0:
        return
    w = np.asarray(written).reshape(len(rows), -1)
    e = np.asarray(expected).reshape(len(rows), -1)
    if w.shape != e.shape:
        raise WrongRowsError(f"{str(shown)!r} holds rows of {w.shape[1:]} values, the input gives "
                             f"{e.shape[1:]}: the store is not kept")
    we, ee = w.astype(np.float64), e.astype(np.float64)
    # the rounding of two summation orders, relative to the row's largest value
    rtol = 1e-9 if np.float64 in (w.dtype, e.dtype) and w.dtype.kind == "f" else 1e-3
    tol = rtol * (np.abs(ee).max(axis=1, initial=0)[:, None] + np.finfo(np.float64).tiny)
    if w.dtype.kind == "b" and e.dtype.kind == "f":
        ok = (w == (ee > 0.5)) | (np.abs(ee - 0.5) <= tol)
    elif w.dtype.kind in "iu" and e.dtype.kind == "f":
        info = np.iinfo(w.dtype)
        ok = np.abs(we - np.clip(ee, info.min, info.max)) <= 0.5 + tol
    elif w.dtype.kind in "biu":
        wide = w.dtype.kind != "b" and np.iinfo(w.dtype).max - np.iinfo(w.dtype).min > 2
        ok = np.abs(we - ee) <= (1 if wide else 0)
    else:
        ok = np.abs(we - ee) <= tol  # NaN in either is wrong too
    bad = ~ok.all(axis=1)
    if bad.any():
        wrong = rows[bad]
        raise WrongRowsError(
            f"{str(shown)!r} was written but {bad.sum()} of the {len(rows)} rows checked differ "
            f"from the same rows computed again (rows {', '.join(str(int(r)) for r in wrong[:5])}"
            f"{', ...' if len(wrong) > 5 else ''}): the store is not kept; this is a bug in "
            "dfairpca or the storage, please report it with the command"
        )


def chunks_written(store, name: str) -> int | None:
    """How many chunk files the array ``name`` of the local Zarr store ``store`` holds now
    (one walk of its folder: a progress count while it is written).

    Parameters
    ----------
    store : str, os.PathLike or Location
        The store being written.
    name : str
        The array's path in it.

    Returns
    -------
    int or None
        The chunk files found, or None for a store that is not a local folder (counting
        would list a bucket every time).
    """
    from ._urls import is_remote

    if not isinstance(store, (str, os.PathLike)) or is_remote(store):
        return None
    root = os.path.join(os.fspath(store), name)
    return sum(len([f for f in files if f != "zarr.json"]) for _, _, files in os.walk(root))
