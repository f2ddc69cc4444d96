"""A resumable statistics pass: the rows in segments, the running total saved after each.

A pass over tens of terabytes can outlive a batch job's time limit or the cluster it runs
on.  :func:`compute_moments_checkpointed` splits the row chunks of a Dask array into
contiguous segments, reduces each segment with :func:`dfairpca.compute_moments` and, after
each, atomically replaces a small checkpoint directory holding

* ``total/``: the merged :class:`~dfairpca.moments.Moments` of the finished segments (one
  running total, d x d float64: 330 MB at d = 6400, however many segments), and
* ``progress.json``: the segments' row ranges, which of them are finished, the NaN
  bookkeeping of the total, and a fingerprint of the job.

Run again with the same arguments and the finished segments are skipped.  Because the
statistics of a union are the merge of the parts' statistics, the result equals one
uninterrupted pass up to rounding.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np

from ._engine import _sl, compute_moments
from .io import atomic_directory, check_progress, check_target, local_zarr_roots
from .moments import Moments, merge

__all__ = [
    "compute_moments_checkpointed", "job_fingerprint", "segment_bounds", "CheckpointMismatch",
]

#: version of the checkpoint layout, checked on resume
CHECKPOINT_VERSION = 2  # 2: the total is saved as upper-triangle panels

#: fingerprint entries stored as digests, and what to say when they differ
_DIGESTS = {"chunks": "the chunks differ", "codes": "the group codes differ",
            "categories": "the group labels differ", "mask": "the row mask differs"}


class CheckpointMismatch(ValueError):
    """A checkpoint was written for a different job than the one being resumed."""


def compute_moments_checkpointed(
    X,
    codes=None,
    categories=(),
    *,
    checkpoint,
    resume: bool = True,
    segment_rows: int | None = None,
    on_segment=None,
    **compute_kw,
) -> Moments:
    """:func:`dfairpca.compute_moments` over a Dask array, resumable after an interruption.

    Parameters
    ----------
    X : dask.array.Array of shape (n, d) or (n, h, w)
        E.g. :func:`dfairpca.from_zarr`, chunked along rows only; segments are cut at its
        row-chunk boundaries.
    codes, categories
        As in :func:`dfairpca.compute_moments`; ``codes`` (n, p) is sliced per segment.
    checkpoint : str or Path
        Checkpoint directory (created; replaced atomically after every segment).  It is
        left in place at the end, holding the full statistics; delete it once the model
        is saved (:func:`dfairpca.io.remove_directory`).  Refused before the pass if it
        exists and is not a dfairpca checkpoint, or holds the store the pass reads.
    resume : bool, default True
        Continue from ``checkpoint`` if it exists; False starts over and overwrites it.
    segment_rows : int, optional
        Rows per segment, rounded up to whole row chunks.  Default: enough chunks to give
        every thread of the cluster 8 chunk tasks, and at most about 20 segments.  On
        resume the segments recorded in the checkpoint are used, whatever this says.
    on_segment : callable, optional
        ``on_segment(i, n_segments)`` after segment ``i`` (0-based) was computed and
        checkpointed; not called for the segments a resume skips.
    **compute_kw
        ``mask``, ``dtype``, ``split_every``, ``group_scatter``, ``progress`` of
        :func:`dfairpca.compute_moments`; ``mask`` (n,) is sliced per segment.

    Returns
    -------
    Moments
        Equal (up to rounding) to ``compute_moments(X, codes, categories, **compute_kw)``,
        with NaN rows reported by their global index.

    Raises
    ------
    CheckpointMismatch
        ``checkpoint`` holds another job's progress (see :func:`job_fingerprint`).
    """
    import dask.array as da

    if not isinstance(X, da.Array):
        raise TypeError(
            f"X must be a Dask array (e.g. dfairpca.from_zarr(...)); got {type(X).__name__}"
        )
    if X.ndim < 2 or X.shape[0] == 0:
        raise ValueError(f"X must be (n, d) or (n, h, w) with n >= 1; got shape {X.shape}")
    path = Path(checkpoint)
    # before any work: the checkpoint may replace only a checkpoint, never the data it reads
    check_target(path, "checkpoint", overwrite=True,
                 protect=[("the input store", root) for root in local_zarr_roots(X)])
    mask = compute_kw.pop("mask", None)
    for name, a in (("codes", codes), ("mask", mask)):
        if a is not None and len(a) != X.shape[0]:
            raise ValueError(f"{name} has {len(a)} rows but X has {X.shape[0]}")
    fingerprint = job_fingerprint(X, codes, categories, mask, **compute_kw)
    state = _load(path) if resume else None
    if state is None:
        rows = _default_segment_rows(X.chunks[0]) if segment_rows is None else segment_rows
        segments, done, total = segment_bounds(X.chunks[0], rows), [], None
    else:
        _check_same_job(path, state["fingerprint"], fingerprint)
        segments, done, total = state["segments"], state["done"], state["total"]
    for i, (s, e) in enumerate(segments):
        if i in done:
            continue
        # the total stays a pass's running sum (upper-triangle panels, added in place) and
        # is saved as such: half the bytes, and no d x d copies on the client
        part = compute_moments(X[s:e], _sl(codes, s, e), categories,
                               mask=_sl(mask, s, e), row_offset=s, symmetric=False,
                               **compute_kw)
        total = part if total is None else merge([total, part], reuse_first=True)
        done = done + [i]
        _save(path, total, fingerprint, segments, done)
        if on_segment is not None:
            on_segment(i, len(segments))
    return total.symmetrize()


def segment_bounds(row_chunks, segment_rows: int) -> list[tuple[int, int]]:
    """Contiguous ``(start, stop)`` row ranges of whole row chunks.

    Each range holds at least ``segment_rows`` rows, except possibly the last.
    """
    if segment_rows < 1:
        raise ValueError(f"segment_rows must be a positive integer; got {segment_rows!r}")
    bounds, start, stop = [], 0, 0
    for size in row_chunks:
        stop += int(size)
        if stop - start >= segment_rows:
            bounds.append((start, stop))
            start = stop
    if stop > start:
        bounds.append((start, stop))
    return bounds


def job_fingerprint(X, codes=None, categories=(), mask=None, *, dtype=np.float64,
                    group_scatter: bool = False, **_ignored) -> dict:
    """What identifies a pass: a checkpoint is resumed only if this is unchanged.

    Shape, dtype and chunking of X, the Zarr stores its graph reads (their URLs), digests
    of the codes, labels and mask, and the options that change the statistics (compute
    ``dtype``, ``group_scatter``).  ``split_every`` and ``progress`` change only the order
    of the sums and are ignored.  The stores' contents are not hashed: rewriting a store
    in place under the same shape is not detected.
    """
    return {
        "shape": list(X.shape),
        "dtype": str(X.dtype),
        "chunks": _digest(json.dumps([list(c) for c in X.chunks]).encode()),
        "stores": _zarr_sources(X),
        "codes": _digest(codes),
        "categories": _digest(json.dumps([np.asarray(c).tolist() for c in categories]).encode()),
        "mask": _digest(mask),
        "compute_dtype": str(np.dtype(dtype)),
        "group_scatter": bool(group_scatter),
    }


def _default_segment_rows(row_chunks) -> int:
    """8 chunk tasks per thread of the active cluster, and no more than about 20 segments."""
    n_chunks = len(row_chunks)
    per_segment = max(8 * _threads(), -(-n_chunks // 20))
    return per_segment * int(max(row_chunks))


def _threads() -> int:
    """Threads of the active distributed cluster, else of Dask's local pool."""
    from ._engine import _local_threads, _worker_slots

    return len(_worker_slots()) or _local_threads()


def _digest(a) -> str | None:
    """sha256 of an array's dtype, shape and bytes (or of raw bytes)."""
    if a is None:
        return None
    h = hashlib.sha256()
    if not isinstance(a, bytes):
        a = np.ascontiguousarray(a)
        h.update(f"{a.dtype.str}{a.shape}".encode())
        a = a.tobytes()
    h.update(a)
    return h.hexdigest()


def _zarr_sources(X) -> list[str]:
    """URLs of the Zarr arrays X's graph reads from (``file:///...``, ``s3://...``)."""
    import zarr

    graph = X.__dask_graph__()
    layers = getattr(graph, "layers", {"": graph})
    found = set()
    for layer in layers.values():
        for node in layer.values():
            node = node if isinstance(node, zarr.Array) else getattr(node, "value", None)
            if isinstance(node, zarr.Array):
                found.add(str(node.store_path))
    return sorted(found)


def _check_same_job(path: Path, saved: dict, now: dict) -> None:
    """Raise :class:`CheckpointMismatch` naming every entry of the fingerprint that differs."""
    diffs = []
    for key in sorted(set(saved) | set(now)):
        old, new = saved.get(key), now.get(key)
        if old == new:
            continue
        if key in _DIGESTS:
            diffs.append(_DIGESTS[key])
        else:
            diffs.append(f"{key} {old} in the checkpoint but {new} now")
    if diffs:
        raise CheckpointMismatch(
            f"checkpoint {str(path)!r} was written for a different job ({'; '.join(diffs)}); "
            "delete that directory or pass resume=False to start over"
        )


def _save(path: Path, total: Moments, fingerprint: dict, segments, done) -> None:
    """Atomically replace the checkpoint with the running total and the progress."""
    progress = {
        "kind": "dfairpca checkpoint",
        "version": CHECKPOINT_VERSION,
        "fingerprint": fingerprint,
        "segments": [list(b) for b in segments],
        "done": list(done),
    }
    with atomic_directory(path, "checkpoint", overwrite=True) as tmp:
        total.save(tmp / "total")
        (tmp / "progress.json").write_text(json.dumps(progress, indent=1))


def _load(path: Path) -> dict | None:
    """The saved progress and total, or None if there is no checkpoint at ``path``."""
    if not path.exists():
        return None
    file = path / "progress.json"
    try:
        progress = json.loads(file.read_text())
        ok = isinstance(progress, dict) and progress.get("kind") == "dfairpca checkpoint"
    except (OSError, ValueError):
        ok = False
    if not ok:
        raise ValueError(
            f"{str(path)!r} exists but is not a dfairpca checkpoint; choose another "
            "checkpoint directory"
        )
    check_progress(progress, file)
    if progress["version"] > CHECKPOINT_VERSION:
        raise ValueError(
            f"checkpoint {str(path)!r} was written by a newer dfairpca; upgrade dfairpca "
            "or pass resume=False to start over"
        )
    total = Moments.load(path / "total")
    check_progress(progress, file, total)
    return {
        "fingerprint": progress["fingerprint"],
        "segments": [tuple(b) for b in progress["segments"]],
        "done": progress["done"],
        "total": total,
    }
