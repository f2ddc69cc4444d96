"""Concept erasure at full rank from the one-pass statistics: LEACE (Belrose et al.,
*LEACE: Perfect linear concept erasure in closed form*, NeurIPS 2023) and the orthogonal
projection that removes the group-mean deviations.

Both erasers are affine maps ``r(x) = x - L R (x - mean)`` of rank r, with L (d, r) and R
(r, d) the ``proj_left`` and ``proj_right`` of the ``concept-erasure`` package.  They need
the data only through the covariance Sigma and the cross-covariance Sigma_XZ of the
features with the concept Z (the one-hot indicators of every group of every attribute,
and any numeric attribute): the columns of Sigma_XZ are the rows of the fairness
constraint (:meth:`dfairpca.solve._fairness.FairnessConstraint.rows`, ``n_g (mean_g - mean)`` up to
a common factor), so the statistics of one :class:`~dfairpca.stats.moments.Moments` pass
serve fair PCA and the erasers alike.

* LEACE: ``W = Sigma^(-1/2)`` on Sigma's support, U an orthonormal basis of the column
  space of ``W Sigma_XZ``, ``L = W^+ U``, ``R = U^T W``.  After it no linear classifier
  recovers Z better than a constant, and among all such affine erasers it changes x the
  least in every norm ``E ||r(x) - x||_M^2`` (M positive semi-definite).
* orth: ``L = Q``, ``R = Q^T`` with Q an orthonormal basis of the span of the group-mean
  deviations (fair PCA's projection at full rank, mapped back to the features).

The certificate of either: for every constraint vector v (a column of Sigma_XZ), the
share ``|v - L R v| / |v|`` that the erased output's covariance with that indicator
keeps, in float64, refused above :data:`dfairpca.solve._fairness.FAIRNESS_TOLERANCE` as
fair PCA's (:func:`dfairpca.solve._fairness.certify`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..stats.moments import Moments
from ..errors import InvalidInputError
from ._fairness import by_attribute, certify, constraint_basis, constraint_of, row_norms

__all__ = ["ERASURE_METHODS", "Erasure", "support_whitening", "independent_rows", "erasure_maps",
           "erasure_violation", "fit_erasure", "default_rtol"]

#: the erasers :func:`fit_erasure` builds
ERASURE_METHODS = ("leace", "orth")


@dataclass(frozen=True)
class Erasure:
    """A certified eraser ``r(x) = x - proj_left @ proj_right @ (x - mean)``.

    ``support_rank``: the dimension of Sigma's support the whitening kept (d for "orth");
    ``violations``: per attribute, the share of each constraint vector that survives the
    erasure; ``n`` rows (total weight of a weighted fit) of which ``rows`` have positive
    weight (None unweighted).
    """

    proj_left: np.ndarray
    proj_right: np.ndarray
    mean: np.ndarray
    support_rank: int
    rtol: float
    violations: list
    group_means: list
    names: list
    statistics: Moments
    kernel: str
    n: float
    rows: int | None


def default_rtol(d: int, precision: float) -> float:
    """The relative eigenvalue floor of Sigma's support: ``d * eps`` of the products'
    precision (``torch.linalg.pinv``'s and the ``concept-erasure`` package's rule, with the
    eps of the dtype the scatter was summed from: float32 products round the small
    eigenvalues at 1e-7 of the largest, not 1e-16)."""
    return float(d) * float(precision)


def support_whitening(S: np.ndarray, rtol: float):
    """(V, inv_sqrt, sqrt) of the symmetric positive semi-definite S on its support:
    the eigenvectors V (d, s) of the eigenvalues above ``rtol`` times the largest, and
    those eigenvalues' ``lam^(-1/2)`` and ``lam^(1/2)``, so that ``W = V diag(inv_sqrt) V^T``
    is ``S^(-1/2)`` there and ``W^+ = V diag(sqrt) V^T`` its pseudo-inverse."""
    lam, V = np.linalg.eigh(np.asarray(S, np.float64))
    top = float(lam[-1]) if lam.size else 0.0
    keep = lam > rtol * top if top > 0 else np.zeros(lam.shape, bool)
    lam, V = lam[keep], V[:, keep]
    root = np.sqrt(lam)
    return V, 1.0 / root, root


def independent_rows(C: np.ndarray, sizes) -> int:
    """The most independent directions the constraint rows C can span: per attribute of
    ``sizes[i]`` groups (its rows in order, first), its nonzero rows less one (the rows
    ``n_g (mean_g - mean)`` of one attribute sum to 0 exactly), then one for every
    nonzero row after them (numeric attributes)."""
    live = row_norms(np.asarray(C, np.float64)) > 0
    bound, start = 0, 0
    for size in sizes:
        bound += max(int(live[start : start + size].sum()) - 1, 0)
        start += size
    return bound + int(live[start:].sum())


def erasure_maps(S: np.ndarray, C: np.ndarray, method: str, rtol: float, exponent: int = 0,
                 sizes=()):
    """(L, R, s): the eraser's ``proj_left`` (d, r) and ``proj_right`` (r, d) and the rank s
    of the support kept, from the covariance ``S * 4**exponent`` (any positive multiple of
    it: the erasure ``L R`` does not depend on it, only L and R's scaling does) and the
    constraint rows C (m, d), the columns of Sigma_XZ up to positive factors, the first
    ``sum(sizes)`` of them the groups of attributes of ``sizes`` groups each.

    The rank r is counted before whitening: ``rank(W Sigma_XZ)`` is the rank of
    Sigma_XZ's columns on the support (W is invertible there), and W, whose condition is
    the square root of Sigma's, magnifies the rounding of the rows (one binary
    attribute's two rows are exact negatives to 1e-16) into a second whitened direction
    of 1e-10 at a condition of 1e12, which a rank test in the whitened space keeps.  At
    most :func:`independent_rows` directions, whatever the rounding.

    Never forms W (d x d): ``W C^T``, ``U^T W`` and ``W^+ U`` go through the eigenvectors,
    O(d^2 r) after the eigendecomposition."""
    d = S.shape[0]
    C = np.asarray(C, np.float64)
    bound = independent_rows(C, sizes)
    if method == "orth":
        Q = constraint_basis(C, rank=bound)
        return Q, Q.T.copy(), d
    if method != "leace":
        raise InvalidInputError(f"method must be one of {ERASURE_METHODS}; got {method!r}")
    V, inv_sqrt, root = support_whitening(S, rtol)
    CV = C @ V  # the rows on the support, in its eigenvectors' coordinates, not whitened
    r = constraint_basis(CV, rank=bound).shape[1]
    with np.errstate(over="ignore", under="ignore"):  # true units: the stored ones * 2**exponent
        inv_sqrt, root = np.ldexp(inv_sqrt, -exponent), np.ldexp(root, exponent)
    # the rows of C W: every group's deviation whitened (W symmetric); U its r largest
    # directions: the column space of W Sigma_XZ
    U = constraint_basis((CV * inv_sqrt) @ V.T, rtol=0.0, rank=r)
    VU = V.T @ U
    L = V @ (root[:, None] * VU)
    R = (VU.T * inv_sqrt) @ V.T
    return L, R, V.shape[1]


def erasure_violation(L: np.ndarray, R: np.ndarray, C: np.ndarray) -> np.ndarray:
    """Per row v of C: ``|v - L R v| / |v|`` (0 for v = 0), the share of v that the
    covariance of the erased output with v's indicator keeps, in float64, O(d r m)."""
    C = np.asarray(C, np.float64)
    norms = row_norms(C)
    out = np.zeros(C.shape[0])
    live = norms > 0
    if live.any():
        unit = C[live] / norms[live, None]
        out[live] = row_norms(unit - (unit @ R.T) @ L.T)
    return out


def fit_erasure(m: Moments, num: np.ndarray, names, *, method: str, rtol: float | None,
                estimator: str) -> Erasure:
    """The certified eraser of statistics m (complete: with the d x d scatter), whose
    columns ``num`` are numeric protected attributes and the others the features.

    ``rtol``: the eigenvalue floor of Sigma's support relative to its largest eigenvalue
    (None: :func:`default_rtol`).  Raises before it returns an eraser that fails its
    certificate, naming the group."""
    problem = m.problem(num)
    C = constraint_of(None).rows(problem, names, None)
    d = problem.n_features
    tol = default_rtol(d, problem.precision) if rtol is None else float(rtol)
    assert problem.scatter is not None  # a complete problem
    S = problem.scatter / max(problem.n - 1, 1)  # stored units, 4**scatter_exponent
    L, R, s = erasure_maps(S, C, method, tol, problem.exponent,
                           [len(c) for c in problem.categories])
    per_group = by_attribute(erasure_violation(L, R, C), problem)
    fix = ("compute_dtype='float64' (the products ran in float32), "
           if problem.precision > np.finfo(np.float64).eps else "")
    fix += f"a smaller rtol (the support kept {s} of {d} eigenvalues)" if method == "leace" else \
        "method='leace'"
    certify(per_group, names, problem.categories + [None] * len(num), problem.precision, estimator,
            fix=fix, kept_by="the erased output keeps")
    return Erasure(L, R, problem.mean.copy(), s, tol, per_group, problem.group_means, list(names),
                   m, problem.kernel, problem.n, problem.n_rows)
