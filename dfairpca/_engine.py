"""The one pass: reduce :class:`~dfairpca.moments.Moments` over the row chunks of X.

numpy input is walked block by block in this process.  Dask input becomes one chain of
tasks per worker thread: each task reads one row chunk (e.g. from Zarr), computes its
statistics in the compute dtype and adds them in place to the chain's running float64 sum,
which stays on its worker; the few sums are merged at the end (fan-in ``split_every``) and
only the result, the upper triangle of a d x d matrix, travels to the caller.  What a
worker holds is therefore its threads' sums and the chunks at hand, independent of n, and
nothing of size n x d is ever gathered.
The computation runs on the active ``distributed.Client`` when there is one (the Dask
convention), otherwise on Dask's default scheduler.
"""

from __future__ import annotations

import numpy as np

from .moments import Moments, merge

__all__ = ["compute_moments"]

#: bytes of input per block when walking a numpy array
NUMPY_BLOCK_BYTES = 64 << 20


def compute_moments(
    X,
    codes=None,
    categories=(),
    *,
    mask=None,
    dtype=np.float64,
    split_every: int = 8,
    group_scatter: bool = False,
    progress: bool = False,
    row_offset: int = 0,
    n_chains: int | None = None,
) -> Moments:
    """Statistics of all rows of X (numpy or Dask, 2-D) in one chunked pass.

    ``codes`` (n, p) and ``mask`` (n,) are small numpy arrays; they are sliced to each
    chunk.  See :meth:`Moments.from_chunk` for the meaning of the arguments; ``row_offset``
    is the global index of X's first row (for the NaN report when X is a slice).
    ``n_chains`` is how many running sums a Dask pass keeps (default: one per thread of
    the active Client's workers, or of Dask's local pool); ``split_every`` is the fan-in of
    the merges of those sums.
    """
    import dask.array as da

    if split_every < 2:
        raise ValueError(f"split_every must be at least 2; got {split_every}")
    kw = dict(categories=list(categories), dtype=dtype, group_scatter=group_scatter)
    if not isinstance(X, da.Array):
        X = np.asarray(X)
        n, d = X.shape
        rows = max(1, NUMPY_BLOCK_BYTES // max(1, d * X.itemsize))
        total = None
        for s in range(0, n, rows):
            e = min(n, s + rows)
            part = Moments.from_chunk(X[s:e], _sl(codes, s, e), mask=_sl(mask, s, e), row_offset=row_offset + s,
                                      symmetric=False, **kw)
            # the running float64 sum is ours: add each block into it in place
            total = part if total is None else merge([total, part], reuse_first=True)
        return total.symmetrize()

    import dask
    from dask import delayed

    bounds = np.concatenate([[0], np.cumsum(X.chunks[0])]).astype(int)
    blocks = _block_sources(X)
    # one chain per thread of the cluster: each folds its run of row chunks, one at a time,
    # into a single running sum (upper-triangle float64 panels updated in place), so what a
    # process holds is its threads' sums plus the chunk at hand, whatever n is
    width = max(1, min(len(blocks), n_chains or _parallelism()))
    fold = delayed(_fold, pure=True)
    parts = []
    for run in np.array_split(np.arange(len(blocks)), width):
        acc = None
        for i in run:
            s, e = bounds[i], bounds[i + 1]
            acc = fold(acc, blocks[i], _sl(codes, s, e), _sl(mask, s, e), row_offset + int(s), kw)
        parts.append(acc)
    merge_fn = delayed(_merge_list, pure=True)
    while len(parts) > 1:  # the chains' sums: a tree of fan-in split_every, in place
        parts = [merge_fn(parts[i : i + split_every]) for i in range(0, len(parts), split_every)]
    root = parts[0]
    # the sum travels as upper-triangle panels (half the bytes) and is completed here
    if progress:
        return _compute_with_progress(root).symmetrize()
    (result,) = dask.compute(root)
    return result.symmetrize()


def _block_sources(X) -> list:
    """What each fold task gets for its row chunk: a :class:`_Block` that it computes itself.

    A chunk that is its own small graph (read a Zarr chunk, cast, scale...) is read inside
    the task that folds it.  Were the reads separate tasks, they would be ready from the
    start and idle workers would run them far ahead of the chains, holding chunks of X in
    memory.  A graph whose chunks share work (a rechunk that splits chunks, a statistic of
    all of X) or large data cannot be split like that; its chunks stay task dependencies.
    """
    import pickle

    from dask.core import flatten, istask
    from dask.optimization import cull

    keys = list(flatten(X.__dask_keys__()))
    try:
        dsk = dict(X.__dask_optimize__(X.__dask_graph__(), keys))
        subs = [cull(dsk, k)[0] for k in keys]
    except Exception:  # an exotic graph: let Dask schedule it as it stands
        return list(X.to_delayed().ravel())
    seen: dict = {}
    for sub in subs:
        for k in sub:
            seen[k] = seen.get(k, 0) + 1
    shared = [k for k, c in seen.items() if c > 1]
    try:
        shared_bytes = sum(len(pickle.dumps(dsk[k])) for k in shared)
    except Exception:
        shared_bytes = None
    # shared keys are fine only as small data (the Zarr array object), never as tasks
    if shared_bytes is None or shared_bytes > 1 << 20 or any(istask(dsk[k]) for k in shared):
        return list(X.to_delayed().ravel())
    return [_Block(sub, k, X.name) for sub, k in zip(subs, keys)]


class _Block:
    """One row chunk of a Dask array as a self-contained graph, computed where it is used."""

    def __init__(self, graph: dict, key, name: str):
        self.graph, self.key, self.name = graph, key, name

    def __dask_tokenize__(self):
        return ("dfairpca-block", self.name, str(self.key))

    def compute(self):
        import dask

        return dask.get(self.graph, self.key)


def _parallelism() -> int:
    """Threads that can run tasks: the active Client's workers', else Dask's local pool."""
    import os

    try:
        from distributed import get_client

        threads = sum(get_client().nthreads().values())
        if threads:
            return threads
    except (ImportError, ValueError):
        pass
    import dask

    if dask.config.get("scheduler", None) in ("sync", "synchronous", "single-threaded"):
        return 1
    return int(dask.config.get("num_workers", None) or os.cpu_count() or 1)


def _sl(a, s, e):
    return None if a is None else a[s:e]


def _fold(acc, block, codes, mask, offset, kw):
    """Add one chunk's statistics to a chain's running sum (in place) or start the chain."""
    if isinstance(block, _Block):
        block = block.compute()
    part = Moments.from_chunk(block, codes, mask=mask, row_offset=offset, symmetric=False, **kw)
    return merge([part] if acc is None else [acc, part], reuse_first=acc is not None)


def _merge_list(parts):
    return merge(parts, reuse_first=True)


def _compute_with_progress(root):
    """Compute with a progress bar: distributed's when a Client is active, else Dask's."""
    try:
        from distributed import get_client, progress

        client = get_client()
    except (ImportError, ValueError):
        client = None
    if client is not None:
        fut = client.compute(root)
        progress(fut)
        return fut.result()
    from dask.diagnostics import ProgressBar

    with ProgressBar():
        return root.compute()
