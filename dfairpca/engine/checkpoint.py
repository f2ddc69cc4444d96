"""A resumable statistics pass: the rows in segments, the running total saved after each.

A pass over tens of terabytes can outlive a batch job's time limit or the cluster it runs
on.  :func:`compute_moments_checkpointed` splits the row chunks of a Dask array into
contiguous segments, reduces each segment with :func:`dfairpca.compute_moments` and, after
each, atomically replaces a small checkpoint directory holding

* ``total/``: the running total of the finished segments, saved as a
  :class:`~dfairpca.stats.moments.Moments` with its scatter kept as a pass keeps it, the upper
  triangle (177 MB at d = 6400, however many segments), and
* ``progress.json``: the segments' row ranges, which of them are finished, a fingerprint
  of the job and a content digest of every row chunk folded into the total.

Run again with the same arguments and the finished segments are skipped.  Because the
statistics of a union are the merge of the parts' statistics, the result equals one
uninterrupted pass up to rounding.

A checkpoint resumes only the data it was made from.  The job fingerprint (shape, dtype,
chunking, store URLs, groups, options) cannot see data rewritten in place or another numpy
array of the same shape, so every row chunk also gets a sha256 of its values
(:func:`chunk_digests`) just before it is folded, and a resume computes the digests of
the chunks it would skip again and refuses the checkpoint if any differs.  Digests are
computed where the chunks are (on the workers), in a read without any BLAS product.
Measured on one core for a 4,000-row chunk of 80 x 80 uint8 images (25.6 MB): sha256
22 ms (the CPU's SHA instructions; blake2b 34 ms, md5 43 ms), reading it from Zarr (zstd)
and hashing 41-63 ms, reading and folding it (the float32 syrk product) 1.7-2.5 s.  So
the digests add 2-4% to a pass at d = 6400 (11% at d = 1024: hashing grows with d, the
product with d^2), and a resume checks the finished part for that fraction of what
folding it again would cost (in a pass bound by reading: as much as reading it again).
Modification times or sizes of a store's chunk files would be cheaper, but say nothing
about numpy or computed input, and ``cp -p`` or ``rsync -t`` carry them over to other
contents.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from . import _accumulator
from ._accumulator import ExactTotal, RunningTotal
from ._compute import compute, worker_timeout
from ._failures import CLUSTER_FAILURES
from ._engine import check_pass_dtype, check_pass_fits, checked_request, moments_sums_bytes, row_slice, run_moments_pass, threads
from ..base._system import rows_per_block
from ..base.progress import progress_bar, reporting
from ..io import (RESAVE_HINT, SavedFileError, StoreTimeout, atomic_directory, check_inputs_shared,
                  check_target, disk_full, is_disk_full, meta_value, storage_for, zarr_roots)
from ..inputs._weights import check_sample_weight
from ..stats.moments import Moments
from ..errors import InvalidInputError, InvalidTypeError
from ._checkpoint_files import (CHECKPOINT_VERSION, _START_OVER, CheckpointMismatch, Where,
                                _check_same_job, _digest,
                                check_saved_digest, files_digest, _progress_text, _read_progress)
# the checkpoint files' public names are this module's interface (docs/api.rst)
from ._checkpoint_files import (array_digest, check_digests, checkpoint_path, job_fingerprint, open_state,
                                save_state, saved_solver, saved_state_meta)

# Deferred imports: dask (heavy or optional) is imported in the functions that use it, so that
# importing this module stays light.


__all__ = [
    "compute_moments_checkpointed", "job_fingerprint", "segment_bounds", "chunk_digests",
    "CheckpointMismatch", "PassInterrupted", "array_digest", "open_state", "save_state",
    "check_digests", "saved_solver", "saved_state_meta", "checkpoint_path",
]


class PassInterrupted(KeyboardInterrupt):
    """A checkpointed pass was interrupted (Ctrl-C); ``chunks_done`` of ``n_chunks`` are saved.

    A :class:`KeyboardInterrupt`, so that code which handles an interrupt still does.
    """

    def __init__(self, checkpoint: Where, chunks_done: int, n_chunks: int, unit: str = "chunks"):
        self.checkpoint, self.chunks_done, self.n_chunks = checkpoint, chunks_done, n_chunks
        #: what is saved, for people: "3 of 120 chunks" (a randomized fit counts passes)
        self.progress = f"{chunks_done} of {n_chunks} {unit}"
        super().__init__(
            f"interrupted after {self.progress}; the checkpoint "
            f"{str(checkpoint)!r} holds them: run the same call again to continue"
        )


def compute_moments_checkpointed(
    X,
    *,
    sensitive_features=None,
    checkpoint,
    resume: bool = True,
    segment_rows: int | None = None,
    on_segment=None,
    storage_options: dict | None = None,
    timeout: float | None = None,
    sample_weight=None,
    **compute_kw,
) -> Moments:
    """:func:`dfairpca.compute_moments` over a Dask array, resumable after an interruption.

    Parameters
    ----------
    X : dask.array.Array of shape (n, d) or (n, h, w)
        E.g. :func:`dfairpca.from_zarr`, chunked along rows only; segments are cut at its
        row-chunk boundaries.  Every chunk is computed twice, once for its digest and once
        to fold it: persist an expensive graph, or write it to Zarr, first.
    sensitive_features : array-like of shape (n,) or (n, p), or DataFrame, optional
        Group labels of every row, as in :func:`dfairpca.compute_moments`.
    checkpoint : str or Path
        Checkpoint directory (created; replaced atomically after every segment).  It is
        left in place at the end, holding the full statistics; delete it once the model
        is saved (:func:`dfairpca.io.remove_directory`).  Refused before the pass if it
        exists and is not a dfairpca checkpoint, or holds the store the pass reads.  A URL
        (``s3://bucket/run.checkpoint``) or an fsspec mapper works too: the checkpoint is
        uploaded after every segment (see :func:`dfairpca.io.storage_for`).
    resume : bool, default True
        Continue from ``checkpoint`` if it exists; False starts over and overwrites it.
    segment_rows : int, optional
        Rows per segment, rounded up to whole row chunks.  Default: enough chunks to give
        every thread of the cluster 8 chunk tasks, and at most about 20 segments.  On
        resume the segments recorded in the checkpoint are used, whatever this says.
    on_segment : callable, optional
        ``on_segment(i, n_segments)`` after segment ``i`` (0-based) was computed and
        checkpointed; not called for the segments a resume skips.
    storage_options : dict, optional
        For a URL ``checkpoint``: the options of its file system (credentials, endpoint).
    timeout : float, optional
        Seconds the pass waits once every worker of the active Client has left, for new
        ones to take over; then it stops with :class:`~dfairpca.cluster.WorkersLost`,
        saying what ``checkpoint`` holds.  Default None: it waits as long as it takes.
    sample_weight : array-like of shape (n,), optional
        Frequency weights of the rows, as in :func:`dfairpca.compute_moments` (a Dask
        array is read once, up front): their digest is part of the job's fingerprint, so
        a checkpoint of other weights is refused.
    **compute_kw
        ``mask``, ``dtype``, ``split_every``, ``group_scatter``, ``progress`` of
        :func:`dfairpca.compute_moments`; ``mask`` (n,) is sliced per segment.

    Returns
    -------
    Moments
        Equal (up to rounding) to ``compute_moments(X, sensitive_features=...,
        **compute_kw)``,
        with NaN rows reported by their global index.

    Raises
    ------
    CheckpointMismatch
        ``checkpoint`` holds another job's progress (see :func:`job_fingerprint`), or a
        row chunk it holds differs from the same chunk of X now (see :func:`chunk_digests`).
    PassInterrupted
        On Ctrl-C (a :class:`KeyboardInterrupt`), saying how many chunks the checkpoint holds.
    WorkersLost
        No worker for ``timeout`` seconds, saying how many chunks the checkpoint holds.
    SchedulerLost, WorkerKilled
        The scheduler lost, or a task that killed every worker that ran it (past its
        memory limit), saying how many chunks the checkpoint holds.
    """
    import dask.array as da

    codes, categories, sample_weight = checked_request(
        X, sensitive_features, compute_kw.get("mask"), compute_kw.get("split_every", 8), sample_weight)
    if not isinstance(X, da.Array):
        raise InvalidTypeError(
            f"X must be a Dask array (e.g. dfairpca.from_zarr(...)); got {type(X).__name__}"
        )
    if X.ndim < 2 or X.shape[0] == 0:
        raise InvalidInputError(f"X must be (n, d) or (n, h, w) with n >= 1; got shape {X.shape}")
    check_pass_dtype(X, compute_kw.get("dtype", np.float64), sample_weight is not None)
    with worker_timeout(timeout):
        if sample_weight is not None:
            compute_kw["weights"] = sample_weight
        return coded_moments_checkpointed(X, codes, categories, checkpoint=checkpoint,
                                          resume=resume, segment_rows=segment_rows,
                                          on_segment=on_segment,
                                          storage_options=storage_options, **compute_kw)


def chunked(X):
    """X as a Dask array (a checkpoint binds row chunks): numpy and Zarr in blocks of rows."""
    import dask.array as da

    if isinstance(X, da.Array):
        return X
    return da.from_array(X, chunks=(rows_per_block(int(np.prod(X.shape[1:])) * X.dtype.itemsize), -1))


def coded_moments_checkpointed(X, codes=None, categories=(), *, checkpoint, resume: bool = True,
                               segment_rows: int | None = None, on_segment=None,
                               storage_options: dict | None = None, **compute_kw) -> Moments:
    """:func:`compute_moments_checkpointed` of groups already encoded: ``codes`` (n, p)
    indices into ``categories`` (p label arrays), the estimators' route.  Like
    :func:`~dfairpca.engine._engine.coded_moments` it trusts codes, mask and weights as
    checked by the estimators or :func:`compute_moments_checkpointed` (X of at least one
    row: a Dask array, or numpy cut into blocks of rows here, :func:`chunked`); it checks
    what only a checkpoint needs (the checkpoint's place)."""
    X = chunked(X)
    # a URL's Location carries its storage options to every write and read below
    path = storage_for(checkpoint, storage_options).target
    # before any work: the checkpoint may replace only a checkpoint, never the data it reads
    check_target(path, "checkpoint", overwrite=True,
                 protect=[("the input store", root) for root in zarr_roots(X)])
    mask = compute_kw.pop("mask", None)
    weights = _weights_in_memory(compute_kw.pop("weights", None))
    if segment_rows is not None:  # an argument's error before the workers' limits
        _check_segment_rows(segment_rows)
    check_inputs_shared(X)  # before the workers' first read: the digests come before the pass
    # before a saved total is loaded or a chunk read: a pass the workers cannot hold is
    # refused now
    check_pass_fits(X, moments_sums_bytes(int(np.prod(X.shape[1:])), categories,
                                          compute_kw.get("group_scatter", False)))
    fingerprint = job_fingerprint(X, codes, categories, mask, **compute_kw)
    if weights is not None:  # (an unweighted job's fingerprint stays what it was)
        fingerprint["weights"] = _digest(weights)
    state = _load(path) if resume else None
    digests: list[list[str] | None]
    if state is not None:  # the same job goes on where it was saved
        _check_same_job(path, state["fingerprint"], fingerprint)
        segments, done, total = state["segments"], state["done"], state["total"]
        digests = _saved_digests(path, state["digests"], segments, done)
    else:
        rows = _default_segment_rows(X.chunks[0]) if segment_rows is None else segment_rows
        segments, done, total = segment_bounds(X.chunks[0], rows), [], None
        digests = [None] * len(segments)
    # one bar for the whole pass, a step per row chunk, moved once per segment (a bar per
    # segment would draw twenty bars, and twenty times a log's few lines)
    segment_kw = {**compute_kw, "progress": False}
    with reporting(bool(compute_kw.get("progress"))):
        bar = progress_bar(len(X.chunks[0]), "pass", "chunk")
    try:
        if done:
            _check_same_data(path, X, segments, done, digests)
            if bar is not None:
                bar.update(sum(len(X[s:e].chunks[0]) for i, (s, e) in enumerate(segments) if i in done))
        for i, (s, e) in enumerate(segments):
            if i in done:
                continue
            # digests before the fold: a chunk rewritten during the pass can only make the
            # checkpoint refuse a resume, never let one through with stale statistics
            digests[i] = chunk_digests(X[s:e])
            # the total stays a pass's running total (upper-triangle panels, added in
            # place) and is saved as such: half the bytes, and no d x d copies on the client
            wkw = {} if weights is None else {"weights": weights[s:e]}
            part = run_moments_pass(X[s:e], row_slice(codes, s, e), categories,
                            mask=row_slice(mask, s, e), row_offset=s, **segment_kw, **wkw)
            total = part if total is None else _accumulator.combine([total, part])
            _save(path, total, fingerprint, segments, done + [i], digests)
            done = done + [i]  # only once saved: what an interrupt reports is on disk
            if bar is not None:
                bar.update(len(X[s:e].chunks[0]))
            if on_segment is not None:
                on_segment(i, len(segments))
    except KeyboardInterrupt:
        raise PassInterrupted(path, _chunks_saved(path, X, segments, done),
                              len(X.chunks[0])) from None
    except (*CLUSTER_FAILURES, StoreTimeout) as exc:
        saved = _chunks_saved(path, X, segments, done)
        raise exc.saved(path, f"{saved} of {len(X.chunks[0])} chunks") from None
    finally:
        if bar is not None:
            bar.close()
    assert total is not None  # X has a row, hence a segment, which the loop ran or resumed
    return total.finalize()  # (refused there when weighted rows hold no positive weight)


def _chunks_saved(path: Where, X, segments, done: list) -> int:
    """How many row chunks of X the checkpoint at ``path`` holds (what is on disk)."""
    done = _saved_done(path, done)
    return sum(len(X[s:e].chunks[0]) for i, (s, e) in enumerate(segments) if i in done)


def _check_segment_rows(segment_rows) -> None:
    if segment_rows < 1:
        raise InvalidInputError(f"segment_rows must be a positive integer; got {segment_rows!r}")


def segment_bounds(row_chunks, segment_rows: int) -> list[tuple[int, int]]:
    """Contiguous ``(start, stop)`` row ranges of whole row chunks.

    Each range holds at least ``segment_rows`` rows, except possibly the last.
    """
    _check_segment_rows(segment_rows)
    bounds, start, stop = [], 0, 0
    for size in row_chunks:
        stop += int(size)
        if stop - start >= segment_rows:
            bounds.append((start, stop))
            start = stop
    if stop > start:
        bounds.append((start, stop))
    return bounds


def chunk_digests(X) -> list[str]:
    """sha256 (:func:`_digest`: dtype, shape and bytes) of every row chunk of X, in order.

    Computed by the active scheduler where the chunks are; only the digests travel.
    """
    return list(compute(*_digest_tasks(X)))


def _digest_tasks(X) -> list:
    """One delayed :func:`_digest` per row chunk of X.

    The keys are fresh each call (``pure=False``), so that a store rewritten since is
    never answered from an earlier result of the same graph.
    """
    import dask

    whole_rows = X.rechunk({axis: -1 for axis in range(1, X.ndim)})
    return [dask.delayed(_digest, pure=False)(b) for b in whole_rows.to_delayed().ravel()]


def _check_same_data(path: Where, X, segments, done, digests) -> None:
    """Raise :class:`CheckpointMismatch` unless every folded chunk of X has its saved digest.

    One read of the finished chunks, without a product (see the module docstring's costs).
    """
    tasks = {j: _digest_tasks(X[s:e]) for j, (s, e) in enumerate(segments) if j in done}
    (now,) = compute(tasks)
    differ = []  # (first row, last row) of every chunk whose digest changed
    for j in sorted(now):
        start = segments[j][0]
        for size, old, new in zip(X[slice(*segments[j])].chunks[0], digests[j], now[j]):
            if old != new:
                differ.append((start, start + size - 1))
            start += size
    if differ:
        more = f" (and {len(differ) - 1} more chunk(s))" if len(differ) > 1 else ""
        raise CheckpointMismatch(
            f"checkpoint {str(path)!r} was made from different data: rows {differ[0][0]}-"
            f"{differ[0][1]} differ{more} from the rows it holds; {_START_OVER}"
        )


def _saved_done(path: Where, done: list) -> list:
    """The finished segments as the checkpoint on disk says (an interrupt can land between
    its replacement and our note of it); ``done`` if it cannot be read."""
    try:
        return list(json.loads(_progress_text(path))["done"])
    except (OSError, ValueError, KeyError, TypeError):
        return done


def _saved_digests(path: Where, digests, segments, done) -> list:
    """The chunk digests saved with the checkpoint (``digests`` of its progress.json), one
    list per finished segment, checked against the segments."""
    if digests is None:
        raise CheckpointMismatch(
            f"checkpoint {str(path)!r} holds no content fingerprints (an older dfairpca "
            f"wrote it), so it cannot show that it was made from this data; {_START_OVER}"
        )
    if (not isinstance(digests, list) or len(digests) != len(segments)
            or any(not isinstance(digests[i], list) for i in done)):
        raise InvalidInputError(
            f"checkpoint {str(path)!r}: the chunk digests in progress.json do not match its "
            f"segments; {_START_OVER}"
        )
    return list(digests)


def _default_segment_rows(row_chunks) -> int:
    """8 chunk tasks per thread of the active cluster, and no more than about 20 segments."""
    n_chunks = len(row_chunks)
    per_segment = max(8 * threads(), -(-n_chunks // 20))
    return per_segment * int(max(row_chunks))


def _save(path: Where, total: RunningTotal | ExactTotal, fingerprint: dict, segments, done, digests) -> None:
    """Atomically replace the checkpoint with the running total and the progress."""
    progress = {
        "kind": "dfairpca checkpoint",
        "version": CHECKPOINT_VERSION,
        "fingerprint": fingerprint,
        "segments": [list(b) for b in segments],
        "done": list(done),
        "digests": list(digests),
    }
    try:
        with atomic_directory(path, "checkpoint", overwrite=True) as tmp:
            total.save(tmp / "total")
            progress["total_digest"] = files_digest(tmp / "total")
            (tmp / "progress.json").write_text(json.dumps(progress, indent=1))
    except OSError as exc:
        if not is_disk_full(exc):
            raise
        from dask.sizeof import sizeof

        # the temporary is gone (atomic_directory removes it); the last save is whole
        n = segments[-1][1]
        kept_rows = sum(e - s for i, (s, e) in enumerate(segments) if i in done[:-1])
        kept = (f"the unfinished save was removed, the checkpoint keeps its last save "
                f"({kept_rows:,} of {n:,} rows): free space there, then resume from it"
                if kept_rows else "the unfinished save was removed, nothing was saved before it: "
                "free space there or choose a checkpoint on another disk")
        # the new save is written whole beside the last one before it replaces it
        raise disk_full(path, "the checkpoint", kept, needed=int(sizeof(total)), cause=exc) from None


def _load(path: Where) -> dict | None:
    """The saved progress and total, or None if there is no checkpoint at ``path`` (a URL's
    is read from a local copy)."""
    storage = storage_for(path)
    if not storage.exists():
        return None
    with storage.local_copy() as local:  # a local checkpoint is its own copy
        return _load_folder(local)


def _load_folder(path: Path) -> dict:
    """:func:`_load` of the local checkpoint folder ``path``."""
    progress, file = _read_progress(path, "exact")
    check_progress(progress, file)
    if progress["version"] > CHECKPOINT_VERSION:
        raise InvalidInputError(
            f"checkpoint {str(path)!r} was written by a newer dfairpca; upgrade dfairpca "
            "or pass resume=False to start over"
        )
    check_saved_digest(path, progress, "total_digest", path / "total", "total (total/)")
    total = _accumulator.load_total(path / "total")
    check_progress(progress, file, total)
    return {
        "fingerprint": progress["fingerprint"],
        "segments": [tuple(b) for b in progress["segments"]],
        "done": progress["done"],
        "total": total,
        "digests": progress.get("digests"),
    }


def check_progress(progress, file, total=None) -> None:
    """Raise SavedFileError unless ``progress`` (a checkpoint's progress.json) is consistent.

    Segments are contiguous ``[start, stop)`` row ranges from 0; ``done`` lists distinct
    segment indices; the running ``total`` (a Moments), if given, counts no more rows
    than the finished segments hold.
    """
    def bad(what):
        return SavedFileError(f"cannot load checkpoint {str(file)!r}: {what}{RESAVE_HINT}")

    if not isinstance(progress, dict):
        raise bad("it is not a JSON object")
    try:
        meta_value(progress, "version", "int", file=Path(file).name)
        meta_value(progress, "fingerprint", "dict", file=Path(file).name)
        segments = meta_value(progress, "segments", "list", file=Path(file).name)
        done = meta_value(progress, "done", "list", file=Path(file).name)
    except ValueError as exc:
        raise bad(str(exc)) from None
    stop = 0
    for seg in segments:
        if not (isinstance(seg, list) and len(seg) == 2 and all(_is_whole(v) for v in seg)
                and seg[0] == stop and seg[1] > seg[0]):
            raise bad(f"segment {seg!r:.40} does not continue the row ranges at row {stop}")
        stop = seg[1]
    if not all(_is_whole(i) and 0 <= i < len(segments) for i in done) or len(set(done)) != len(done):
        raise bad(f"'done' {done!r:.80} is not a list of distinct segment indices below {len(segments)}")
    if total is not None:
        rows = sum(segments[i][1] - segments[i][0] for i in done)
        held = total.n if getattr(total, "n_rows", None) is None else total.n_rows  # weighted: n is a weight
        if held + total.n_nonfinite > rows:
            raise bad(f"its total counts {held + total.n_nonfinite} rows, more than the "
                      f"{rows} of its finished segments")


def _is_whole(v) -> bool:
    """An int from JSON (``True``/``False`` are not row numbers)."""
    return isinstance(v, int) and not isinstance(v, bool)


def _weights_in_memory(weights):
    """Checked sample weights as float64 numpy (a Dask array computed: n numbers), or None:
    what a checkpointed pass binds its checkpoint to, by their digest.  A Dask array's
    values are checked here, once read (the check of the array itself saw its shape)."""
    if weights is None or isinstance(weights, np.ndarray):
        return weights
    (w,) = compute(weights)
    return check_sample_weight(np.asarray(w), len(w))
