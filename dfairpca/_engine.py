"""The one pass: reduce :class:`~dfairpca.moments.Moments` over the row chunks of X.

numpy input is walked block by block in this process; Dask input becomes one task per row
chunk (the task reads its chunk, e.g. from Zarr, casts it and computes its statistics in the
worker) followed by a tree of merge tasks with fan-in ``split_every``, so no process holds
more than ``split_every + 1`` partial statistics and nothing of size n x d is ever gathered.
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
) -> Moments:
    """Statistics of all rows of X (numpy or Dask, 2-D) in one chunked pass.

    ``codes`` (n, p) and ``mask`` (n,) are small numpy arrays; they are sliced to each
    chunk.  See :meth:`Moments.from_chunk` for the meaning of the arguments; ``row_offset``
    is the global index of X's first row (for the NaN report when X is a slice).
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
    blocks = X.to_delayed().ravel()
    chunk_fn = delayed(_chunk_moments, pure=True)
    parts = [
        chunk_fn(b, _sl(codes, s, e), _sl(mask, s, e), row_offset + int(s), kw)
        for b, s, e in zip(blocks, bounds[:-1], bounds[1:])
    ]
    merge_fn = delayed(_merge_list, pure=True)
    if len(parts) > split_every:
        # first level: chains, each folding split_every partials one at a time, so a partial
        # is merged as soon as it exists instead of waiting for its siblings
        chains = []
        for i in range(0, len(parts), split_every):
            acc = parts[i]
            for j, q in enumerate(parts[i + 1 : i + split_every]):
                acc = merge_fn([acc, q], False, j > 0)  # a chain's own sum is reused in place
            chains.append(acc)
        parts = chains
    while len(parts) > split_every:
        parts = [merge_fn(parts[i : i + split_every]) for i in range(0, len(parts), split_every)]
    root = merge_fn(parts, True)  # the last merge also fills the lower triangles
    if progress:
        return _compute_with_progress(root)
    (result,) = dask.compute(root)
    return result


def _sl(a, s, e):
    return None if a is None else a[s:e]


def _chunk_moments(block, codes, mask, offset, kw):
    return Moments.from_chunk(block, codes, mask=mask, row_offset=offset, symmetric=False, **kw)


def _merge_list(parts, final=False, reuse_first=False):
    out = merge(parts, reuse_first=reuse_first)
    return out.symmetrize() if final else out


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
