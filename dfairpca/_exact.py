"""The exact solve: components from complete statistics (``fitted_svd_solver_`` is
"covariance_eigh"), the sibling of the matrix-free :mod:`dfairpca._randomized`.

The one-pass statistics give the d x d matrix whose eigenvectors are wanted
(:func:`fitted_space`); the components are its top eigenvectors for ``n_components`` as an
int, None or a fraction of the variance (scikit-learn's meanings), standard
(:func:`standard_components`) or restricted to the complement of the fairness constraints
(:func:`fair_constraints`, :func:`fair_components`, with Fair PCA-S's equalising
directions).  Every eigensolve is :mod:`dfairpca._solvers`'.
"""

from __future__ import annotations

import numbers

import numpy as np

from . import _solvers
from ._chunk import OVERFLOW_MESSAGE
from ._fairness import covariance_terms, group_constraints, numeric_constraints
from ._params import is_int
from .moments import Moments

__all__ = ["fitted_space", "check_variance", "standard_components", "fair_constraints",
           "fair_components", "fraction_to_k"]


def fitted_space(m: Moments, center: bool, standardize: bool):
    """(S, scale, e): the matrix whose eigenvectors we want, in the fitted feature space,
    as ``S * 4**e`` (e is the statistics' ``scatter_exponent``, 0 but for data of
    extreme magnitude; 0 when standardized, which is unit-free), and the true scale."""
    if m.n < 2:
        raise ValueError(f"need at least 2 samples to fit; got {m.n} (n_samples={m.n})")
    if not (np.all(np.isfinite(m.mean)) and np.all(np.isfinite(np.diagonal(m.scatter)))):
        raise ValueError(OVERFLOW_MESSAGE)
    e = m.scatter_exponent
    S = m.scatter
    if not center:
        mu = np.ldexp(m.mean, -e)  # in the scatter's units
        S = S + m.n * np.outer(mu, mu)
    scale = None
    if standardize:
        sd, scale = _solvers.standard_scale(m.n, m.mean, np.diag(m.scatter), e)
        S = S / np.outer(sd, sd)
        e = 0
    check_variance(float(np.trace(S)), m.n, m.mean)
    return S, scale, e


def check_variance(total: float, n: int, mean) -> None:
    """Refuse data whose total variance (the trace of the fitted operator) is zero: no
    direction holds any of it, and every explained variance ratio would be 0 / 0.

    All rows equal is the cause; all of them zero (``mean`` zero too) is also what a store
    read as fill values looks like, which the message says.
    """
    if total > 0:
        return
    rows = "zero" if not np.any(mean) else "equal"
    raise ValueError(
        f"X has zero total variance: all its {int(n):,} rows are {rows}, so there is no "
        "direction to fit; check the data (a Zarr store whose chunks are absent, read with "
        "missing_chunks='fill', is its fill value throughout)"
    )


def standard_components(S: np.ndarray, n: int, k, eigen_solver: str) -> np.ndarray:
    """Components (k, d) of standard PCA of S for ``n_components`` k (int, fraction or
    None, scikit-learn's meanings) from n rows."""
    rank = min(n, S.shape[0])
    if k is None:
        return _solvers.pca_components(S, rank, eigen_solver)
    if isinstance(k, numbers.Integral):
        return _solvers.pca_components(S, k, eigen_solver)
    w, V = _solvers.top_eigh(S, rank, "dense")
    k = fraction_to_k(w, np.trace(S), k, "the data")
    return _solvers.flip_signs(V[:, :k].T)


def fair_constraints(m: Moments, mf: Moments, num: np.ndarray, keep: np.ndarray, names,
                     scale) -> np.ndarray:
    """The constraint vectors (rows) in the fitted feature space: every group's mean
    deviation (of ``mf``, the statistics of the feature columns ``keep`` of m), then every
    numeric attribute's (columns ``num`` of m) covariance with the features; ``names``
    name the attributes in that order for the warnings."""
    p = len(mf.attributes)
    C = group_constraints(mf, names[:p])
    if len(num):
        C = np.vstack([C, numeric_constraints(m, num, keep, names[p:])])
    return C if scale is None else C / scale[None, :]


def fair_components(S, Q, mf: Moments, scale, largest: int, k, equalize,
                    eigen_solver: str) -> np.ndarray:
    """Fair components (k, d) of S outside Q's columns for ``n_components`` k (int,
    fraction or None; None and a fraction consider the ``largest`` allowed), with Fair
    PCA-S's equalising directions for ``equalize_covariance`` (from mf's group scatters)."""
    r = Q.shape[1]
    if k is None or is_int(k):
        k = largest if k is None else k
        terms = covariance_terms(mf, scale, k, r, equalize)
        return _solvers.fair_components(S, Q, k, *terms, solver=eigen_solver)
    U = _solvers.fair_components(S, Q, largest, solver="dense")
    captured = np.sum((U @ S) * U, axis=1)
    return U[: fraction_to_k(captured, np.trace(S), k, "the fair subspace")]


def fraction_to_k(variances, total: float, fraction: float, where: str) -> int:
    """The smallest k whose first k ``variances`` (descending) exceed ``fraction`` of
    ``total``, scikit-learn's rule (``searchsorted(cumsum(ratio), fraction, "right") + 1``);
    ValueError if all of them do not."""
    cumulative = np.cumsum(np.asarray(variances) / total)
    if not len(cumulative) or cumulative[-1] <= fraction:
        held = float(cumulative[-1]) if len(cumulative) else 0.0
        raise ValueError(
            f"n_components={fraction}: {where} holds {held:.2%} of the variance, not more than "
            f"{fraction:.2%}; pass a smaller fraction or an int"
        )
    return int(np.searchsorted(cumulative, fraction, side="right")) + 1
