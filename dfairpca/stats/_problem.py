"""What a solve reads of statistics (:class:`Problem`), as plain arrays: the feature
columns' moments, the raw fairness constraint and how the products were formed, read once
from a :class:`~dfairpca.stats.moments.Moments` by :meth:`~dfairpca.stats.moments.Moments.problem`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["Problem"]


@dataclass(frozen=True)
class Problem:
    """What a solve reads of statistics, as plain arrays, read once by :meth:`Moments.problem`:
    the feature columns' moments, the raw fairness constraint (:mod:`dfairpca.solve._fairness`
    turns it into rows, a basis and a certificate) and how the products were formed.

    Attributes
    ----------
    n, n_rows, rows, n_effective, precision : as :class:`Moments`'
    mean : ndarray (d,)
        The features' means (true units).
    diagonal : ndarray (d,)
        The features' scatter diagonal, stored units (``true * 4**-exponent``).
    scatter : ndarray (d, d) or None
        The features' scatter, stored units; None for the first-order statistics of a
        matrix-free fit.
    exponent : int
        :attr:`Moments.scatter_exponent`.
    kernel : str
        What formed the products (:func:`dfairpca.stats._exact.kernel_name`).
    categories, counts, group_means : lists, one entry per attribute given as labels
        The group labels, the rows (weight) of each group and each group's mean (m_r, d).
    group_scatter : list of ndarray (m_r, d, d), or None
        Every group's scatter about its own mean (Fair PCA-S), None unless every attribute
        holds them.
    constraint_rows : ndarray (sum m_r, d)
        Every group's ``n_g (mean_g - mean)`` (:func:`dfairpca.stats._derived.constraint_matrix`).
    deviation_floor : ndarray (d,)
        The size below which a group-mean deviation is float64 rounding
        (:func:`dfairpca.stats._derived.deviation_floor`).
    numeric_rows, numeric_own, numeric_means : ndarray (q, d), (q,), (q,)
        The numeric protected attributes' cross sums with the features, their own sums of
        squares (stored units) and their means.
    feature_spread : float
        The features' total scatter (the trace, stored units), against which a numeric
        attribute's cross sums are rounding or not.
    """

    n: float
    n_rows: int | None
    rows: int
    n_effective: int
    precision: float
    mean: np.ndarray
    diagonal: np.ndarray
    scatter: np.ndarray | None
    exponent: int
    kernel: str
    categories: list
    counts: list
    group_means: list
    group_scatter: list | None
    constraint_rows: np.ndarray
    deviation_floor: np.ndarray
    numeric_rows: np.ndarray
    numeric_own: np.ndarray
    numeric_means: np.ndarray
    feature_spread: float

    @property
    def n_features(self) -> int:
        return self.mean.shape[0]

    @property
    def group_sizes(self) -> list[int]:
        """Constraint rows per attribute given as labels (its groups, seen or not)."""
        return [len(c) for c in self.categories]
