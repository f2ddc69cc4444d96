"""The rules derived from statistics' fields, as functions of the fields themselves: the
fairness constraint rows and the rounding floor of a group-mean deviation.
:class:`dfairpca.stats.moments.Moments` applies them through its methods, to complete
statistics and to the randomized fit's first-order ones alike."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np


__all__ = ["constraint_matrix", "deviation_floor"]


def constraint_matrix(attributes: Sequence[Any], d: int) -> np.ndarray:
    """``Z_comb^T X`` of the paper (Sec. 3.4/3.5): rows ``n_g (mean_g - mean)``.

    Shape (sum of m_r, d); its row space is what fair PCA must be orthogonal to.  Each
    attribute's rows are re-centred so that they sum to zero exactly (they do in exact
    arithmetic), which keeps the rank at m_r - 1 when the sums ran in float32.

    Parameters
    ----------
    attributes : sequence of AttributeMoments
        The per-group statistics of each protected attribute.
    d : int
        Number of features.

    Returns
    -------
    ndarray of float64, shape (sum of m_r, d)
        One row per group; groups without rows give zero rows.
    """
    if not attributes:
        return np.zeros((0, d))
    rows = []
    for a in attributes:
        w = a.counts[:, None].astype(np.float64)
        dev = a.deviation - (w * a.deviation).sum(0) / max(w.sum(), 1)
        rows.append(np.where(w > 0, w * dev, 0.0))
    return np.concatenate(rows)


def deviation_floor(n: float, mean: np.ndarray, sq: np.ndarray, exponent: int,
                    terms: int | None = None) -> np.ndarray:
    """Per feature: the size below which a group-mean deviation is float64 rounding, from
    the column sums of squares about the mean ``sq`` (stored as ``true * 4**-exponent``).

    The means are float64 sums of the rows (whatever dtype the products ran in), and
    a sum of n terms is off by at most ``n * eps * sum |x_i|`` (recursive summation, the
    worst case); so the mean of feature j is off by at most ``n * eps`` times its root
    mean square ``rms_j``, and a group mean minus the overall mean by ``2 n eps rms_j``.
    Per feature, not over the row norm: a huge constant feature (a timestamp in ns)
    must not hide a real deviation of the others.  A deviation above this in any
    feature is the data's, not the arithmetic's.  Weighted statistics: ``n`` is the total
    weight (the variance's denominator) and ``terms`` the rows summed (the rounding's count).

    Parameters
    ----------
    n : int or float
        Number of rows (total weight for weighted statistics).
    mean : ndarray of shape (d,)
        The mean.
    sq : ndarray of shape (d,)
        Column sums of squares about the mean, stored as ``true * 4**-exponent``.
    exponent : int
        The scale exponent of ``sq`` (:attr:`Moments.scatter_exponent`).
    terms : int, optional
        Rows summed, where it differs from ``n`` (weighted statistics); defaults to ``n``.

    Returns
    -------
    ndarray of float64, shape (d,)
        The floor of each feature, in true units.
    """
    if terms is None:
        n = max(n, 1)
        terms = int(n)
    with np.errstate(over="ignore", under="ignore"):
        sd = np.ldexp(np.sqrt(np.maximum(sq, 0.0) / (n if n > 0 else 1)), exponent)  # true = stored * 4**exponent
        rms = np.hypot(np.abs(mean), sd)
    return 2.0 * max(terms, 1) * float(np.finfo(np.float64).eps) * rms
