"""The pass of :mod:`dfairpca.engine._engine` that also keeps a few chosen rows.

A report on a representation needs the additive statistics of all its rows (the test of
equal group means) and a bounded random sample of them (a classifier's cross-validation,
which is not additive).  Drawing the sample in a second pass would read X twice; here each
fold task, which already holds its chunk, also copies the chosen rows of it, so X is read
once and what travels back is the statistics plus the sample.  The representation itself can
be computed in the fold too (``represent``): each task then reads its chunk of X, maps it and
folds it, so that the reads stay inside the chains, as in the fit's pass, whatever the map.
"""

from __future__ import annotations

import numpy as np

from . import _accumulator
from ._engine import chain_reduce, row_slice
from ..stats.moments import Moments
from ._compute import ship

# Deferred imports: dask (heavy or optional) and package modules that load such libraries, or this
# module, at import are imported in the functions that use them, so that importing this module stays
# light.

__all__ = ["moments_and_sample"]


def moments_and_sample(Y, codes, categories, rows, *, represent=None, group_scatter: bool = False,
                       progress: bool = False, split_every: int = 8) -> tuple[Moments, np.ndarray]:
    """The float64 statistics of every row of Y with its groups, and the rows ``rows``.

    Parameters
    ----------
    Y : array of shape (n, d), numpy or Dask
        Dask input is reduced as :func:`dfairpca.compute_moments` reduces it (one chain of
        folds per worker thread, on the active Client if there is one), each fold also
        copying its chunk's rows of ``rows``.
    codes : int array of shape (n, p)
        Group index of every row for each of p attributes.
    categories : sequence of p arrays
        The labels of each attribute's groups.
    rows : int array
        Sorted global indices of the rows to keep.
    represent : callable, optional
        A picklable map of rows, numpy (r, d) -> (r, k), applied to every chunk before its
        sums (and the statistics and the sample are those of its output); for Dask input it
        travels once per worker (:func:`dfairpca.cluster.ship`).  Default: Y as it is.
    group_scatter : bool
        Also keep every group's scatter about its own mean (k x k per group).
    progress : bool
        A bar of the pass's tasks on the open report (:func:`dfairpca.base.progress.reporting`;
        Dask input only).
    split_every : int
        Fan-in of the merges of the chains' sums.

    Returns
    -------
    Moments
        The statistics of all rows (products in float64), of ``represent(Y)`` if given.
    ndarray of float64, shape (len(rows), k)
        Those rows, in the order of ``rows``.
    """
    import dask.array as da

    rows = np.asarray(rows, dtype=np.intp)
    kw = dict(categories=list(categories), dtype=np.float64, group_scatter=group_scatter)
    if not isinstance(Y, da.Array):
        from ._engine import coded_moments

        Y = np.asarray(Y) if represent is None else np.asarray(represent(Y))
        return (coded_moments(Y, codes, categories, dtype=np.float64, group_scatter=group_scatter),
                np.asarray(Y[rows], np.float64))
    shared = None if represent is None else ship(represent)

    def args(s: int, e: int):
        lo, hi = np.searchsorted(rows, [s, e])
        return row_slice(codes, s, e), rows[lo:hi] - s, s, kw, shared

    total, picked = chain_reduce(Y, _fold, _combine, args, split_every=split_every, progress=progress)
    order = np.argsort(np.concatenate([i for i, _ in picked]), kind="stable")
    sample = np.concatenate([r for _, r in picked])[order]
    return total.finalize(), sample


def _fold(acc, block, codes, local, offset, kw, represent):
    """Add one chunk's sums (of ``represent(block)`` if given) to the chain's running total
    (in place) and keep its chosen rows (``local``: their indices in the chunk) with their
    global indices."""
    if represent is not None:
        block = represent(block)
    kept = (local + offset, np.asarray(block[local], dtype=np.float64))
    total, picked = (None, []) if acc is None else acc
    return _accumulator.fold(total, block, codes, mask=None, row_offset=offset, **kw), picked + [kept]


def _combine(parts):
    """The chains' totals merged, their rows gathered."""
    total = _accumulator.combine([t for t, _ in parts])
    return total, [k for _, picked in parts for k in picked]
