"""The small local solve: eigenvectors of d x d matrices built from :class:`Moments`.

Fair PCA (Kleindessner et al. 2023, Alg. 1/2, Sec. 3.5) maximises ``trace(U^T S U)`` over
orthonormal U subject to ``Z^T X U = 0``.  The paper builds an explicit basis R of the
nullspace of ``Z^T X`` (d x (d - r)) and solves ``R^T S R``.  Here R is never formed: with
Q an orthonormal basis of the r constraint directions (the group-mean deviations) and
``P = I - Q Q^T``, the top-k eigenvectors of ``P S P - c Q Q^T`` (c > 0 pushes the
constraint directions below every admissible eigenvalue) span the same subspace ``R Lambda``.
A final projection and Rayleigh-Ritz step make ``Q^T U = 0`` hold to rounding, and
:func:`constraint_violation` measures what is left, in float64, after every solve.

Every threshold and shift here is relative to the matrix it applies to, so that the
solution of ``c * S`` is that of S for any c > 0 the dtype can hold.
"""

from __future__ import annotations

import numpy as np
import scipy.linalg
import scipy.sparse.linalg

from .progress import phase
from ..errors import InvalidInputError

__all__ = ["top_eigh", "top_eigh_exact", "iterative", "subspace_iteration", "constraint_basis",
           "fair_components", "equalizing_basis", "pca_components", "flip_signs", "row_norms",
           "constraint_violation", "standard_scale", "EIGEN_SOLVERS", "ITERATIVE_MIN_SIZE",
           "FAIRNESS_TOLERANCE"]


#: the values of the estimators' ``eigen_solver``
EIGEN_SOLVERS = ("auto", "dense", "subspace")

#: the one switch rule of every top-k solve of an n x n symmetric matrix (linear d x d
#: covariances and exact kernel n x n matrices alike): an iterative solver replaces dense
#: LAPACK ``eigh`` from this n on when k <= n / 10 (:func:`iterative`).  Below it LAPACK is
#: fast enough that the choice does not matter; above it an iterative solver's O(n^2 k)
#: per step beats the O(n^3) tridiagonalisation (benchmarks/eigensolvers.py: at n = 6400,
#: k = 400, subspace iteration is 1.6x faster than the fastest LAPACK driver; ARPACK on a
#: 1500 x 1500 kernel, k = 10: 0.3 s against 1.0 s, one thread)
ITERATIVE_MIN_SIZE = 2000

#: the largest ``|U^T v| / |v|`` a fitted fair model may leave of any group-mean deviation v
#: (its certificate, :func:`constraint_violation`).  What rounding leaves is far smaller:
#: v is in the span of the constraint basis Q to ``10 max(m, d) sqrt(m) eps`` (the SVD's
#: backward error plus the rank cut of :func:`constraint_basis`, on unit rows) and U is
#: orthogonal to Q to a few eps after its projection and QR, together about 1e-10 at
#: d = 6,400 and m = 40 groups.  1e-8 leaves a hundredfold margin for that, and a
#: projected gap of 1e-8 of the raw gap is far below any sampling error of a group mean.
FAIRNESS_TOLERANCE = 1e-8


def iterative(n: int, k: int) -> bool:
    """Whether a top-k solve of an n x n matrix goes iterative: the one switch rule
    (:data:`ITERATIVE_MIN_SIZE`)."""
    return n >= ITERATIVE_MIN_SIZE and 10 * k <= n


def top_eigh(M: np.ndarray, k: int, solver: str = "dense", Q: np.ndarray | None = None,
             rtol: float = 1e-8, seed: int = 0):
    """Largest k eigenpairs of symmetric M, eigenvalues descending.

    ``solver="dense"`` is LAPACK (``eigh`` with ``subset_by_index``); "subspace" is block
    subspace iteration with Rayleigh-Ritz (:func:`subspace_iteration`), for PSD M, which
    captures the variance of the top k to ``rtol`` relative (at d = 6400, k = 400: 1e-9).
    Q (d, r), if given, is an orthonormal basis the eigenvectors must be orthogonal to.
    "auto" is :func:`iterative`'s choice.
    """
    d = M.shape[0]
    if solver == "auto":
        solver = "subspace" if iterative(d, k) else "dense"
    if solver not in EIGEN_SOLVERS:
        raise InvalidInputError(f"eigen_solver must be one of {EIGEN_SOLVERS}; got {solver!r}")
    how = "block subspace iteration" if solver == "subspace" and k < d else "LAPACK eigh"
    with phase(f"eigensolve: top {k:,} of {d:,} dimensions ({how})"):
        if solver == "subspace" and k < d:
            return subspace_iteration(M, k, Q=Q, rtol=rtol, seed=seed)
        return _dense_top(M, k, Q)


def _dense_top(M: np.ndarray, k: int, Q: np.ndarray | None):
    """:func:`top_eigh` by LAPACK."""
    d = M.shape[0]
    if Q is not None and Q.shape[1]:
        # below every eigenvalue of the PSD M (all in [0, trace]), at M's own scale
        M = _deflated(M, Q, -(abs(np.trace(M)) or 1.0))
    if k >= d:
        w, V = scipy.linalg.eigh(M)
    else:
        w, V = scipy.linalg.eigh(M, subset_by_index=[d - k, d - 1], driver="evr")
    return w[::-1][:k], V[:, ::-1][:, :k]


def top_eigh_exact(M: np.ndarray, k: int, rng, overwrite: bool = False):
    """Largest k eigenpairs (descending) of the symmetric n x n M to machine precision.

    Where :func:`iterative` says so, Lanczos (ARPACK ``eigsh``, ``tol=0``, start vector
    from ``rng``): O(n^2) per iteration; dense LAPACK ``eigh`` otherwise, or if ARPACK does
    not converge.  ``overwrite`` lets ``eigh`` destroy M.  On a cluster of (nearly) equal
    top eigenvalues LAPACK's "evr" may return fewer than k pairs or fail: the missing
    pairs are zeros, and the caller finds fewer than k with positive eigenvalue and says so.
    """
    n = M.shape[0]
    how = "Lanczos" if iterative(n, k) else "LAPACK eigh"
    with phase(f"eigensolve: top {k:,} of {n:,} dimensions ({how})"):
        return _top_exact(M, k, rng, overwrite)


def _top_exact(M: np.ndarray, k: int, rng, overwrite: bool):
    """:func:`top_eigh_exact` without its report."""
    n = M.shape[0]
    if iterative(n, k):
        try:
            w, V = scipy.sparse.linalg.eigsh(M, k, which="LA", tol=0.0, v0=rng.uniform(-1, 1, n))
            order = np.argsort(w)[::-1]
            return w[order], V[:, order]
        except scipy.sparse.linalg.ArpackNoConvergence:
            pass
    # M is symmetric, so its transpose is the Fortran-ordered array LAPACK wants (no copy)
    try:
        w, V = scipy.linalg.eigh(M.T, subset_by_index=[n - k, n - 1], overwrite_a=overwrite,
                                 driver="evr")
    except np.linalg.LinAlgError:
        w, V = np.empty(0), np.empty((n, 0))
    w, V = w[::-1], V[:, ::-1]
    short = k - len(w)
    return np.append(w, np.zeros(short)), np.hstack([V, np.zeros((n, short))])


def subspace_iteration(S: np.ndarray, k: int, Q=None, rtol: float = 1e-8, max_iter: int = 100,
                       oversample: int | None = None, seed: int = 0):
    """Top-k eigenpairs of PSD S (restricted to the complement of Q) by block iteration.

    A random block of ``p = k + oversample`` vectors is multiplied by ``P S P`` and
    re-orthonormalised; after every product a Rayleigh-Ritz step rotates the block to Ritz
    vectors.  Iteration stops when the sum of the top-k Ritz values, i.e. the variance the
    components capture, changes by less than ``rtol`` relative: the quantity PCA maximises,
    which converges even where eigenvalues around k are nearly equal and the individual
    vectors are not defined.  Each step costs one (d x d) x (d x p) product.
    """
    d = S.shape[0]
    p = min(d, k + (oversample if oversample is not None else max(16, k // 2)))
    proj = (lambda A: A - Q @ (Q.T @ A)) if Q is not None and Q.shape[1] else (lambda A: A)
    V, _ = np.linalg.qr(proj(np.random.default_rng(seed).standard_normal((d, p))))
    prev = None
    for _ in range(max_iter):
        W = proj(S @ V)
        w, G = np.linalg.eigh(V.T @ W)  # Rayleigh-Ritz in span(V)
        total = w[-k:].sum()
        if prev is not None and abs(total - prev) <= rtol * abs(total):
            break
        prev = total
        V, _ = np.linalg.qr(W @ G[:, ::-1])
    V = V @ G[:, ::-1]
    return w[::-1][:k], V[:, :k]


def standard_scale(n: float, mean: np.ndarray, sq: np.ndarray, exponent: int = 0):
    """(sd, scale) of ``standardize``: per feature the population standard deviation
    (ddof=0, as StandardScaler divides by) in the stored units of the sums of squares ``sq``
    (``true * 4**-exponent``), and in true units (``scale``, 1 where it is 0).

    A feature whose variance is within the rounding of its mean is constant (as
    StandardScaler's test): left unscaled (sd 1), not divided by noise.
    """
    var = np.maximum(np.asarray(sq, np.float64) / n, 0.0)  # rounding may leave it < 0
    with np.errstate(over="ignore", under="ignore"):
        noise = (2.0 * n * np.finfo(np.float64).eps * np.ldexp(mean, -exponent)) ** 2
    sd = np.sqrt(var)
    sd[var <= noise] = 1.0
    scale = np.ldexp(sd, exponent)
    scale[scale == 0] = 1.0
    return sd, scale


def row_norms(A: np.ndarray) -> np.ndarray:
    """Euclidean norms of the rows of A without underflow or overflow (each row scaled by
    its largest entry first: ``np.linalg.norm`` of a row of 1e-170s is 0)."""
    A = np.asarray(A, dtype=np.float64)
    top = np.abs(A).max(axis=1) if A.shape[1] else np.zeros(A.shape[0])
    safe = np.where(top > 0, top, 1.0)
    return top * np.linalg.norm(A / safe[:, None], axis=1)


def constraint_basis(C: np.ndarray, rtol: float | None = None) -> np.ndarray:
    """Orthonormal basis (d, r) of the row space of C (the constraint directions).

    Zero rows (groups without signal, see ``FairPCA.fit_statistics``) are dropped, and the
    others scaled to unit length: the basis then holds every group's direction to the
    same relative accuracy, however the groups' deviations differ in size (a small
    group's direction is not lost in the rounding of a large one's).  Singular values
    below ``rtol * s_max`` count as rank deficiency, i.e. directions that are
    combinations of the others (default ``10 * max(C.shape) * eps``, the rule of
    ``scipy.linalg.null_space``).
    """
    d = C.shape[1]
    norms = row_norms(C)
    C = C[norms > 0] / norms[norms > 0, None]
    if C.shape[0] == 0:
        return np.zeros((d, 0))
    U, s, _ = scipy.linalg.svd(C.T, full_matrices=False)
    if rtol is None:
        rtol = max(C.shape) * np.finfo(np.float64).eps * 10
    r = int(np.sum(s > rtol * s[0]))
    return U[:, :r]


def constraint_violation(U: np.ndarray, C: np.ndarray) -> np.ndarray:
    """Per row v of C: ``|U v| / |v|``, the share of v that the rows of U keep (0 for v = 0).

    U (k, d) has orthonormal rows (the fitted components); the rows of C are group-mean
    deviations (any positive multiples).  In float64, O(k d m).
    """
    C = np.asarray(C, dtype=np.float64)
    norms = row_norms(C)
    out = np.zeros(C.shape[0])
    live = norms > 0
    if live.any():
        out[live] = row_norms((C[live] / norms[live, None]) @ np.asarray(U, np.float64).T)
    return out


def pca_components(S: np.ndarray, k: int, solver: str = "dense") -> np.ndarray:
    """Top-k eigenvectors of S as rows (k, d), signs fixed."""
    _, V = top_eigh(S, k, solver)
    return flip_signs(V.T)


def _deflated(A: np.ndarray, Q: np.ndarray, c: float) -> np.ndarray:
    """``P A P + c Q Q^T`` with ``P = I - Q Q^T``, by rank-r updates (no d x d projector)."""
    AQ = A @ Q
    M = A - Q @ AQ.T - AQ @ Q.T + Q @ (Q.T @ AQ + c * np.eye(Q.shape[1])) @ Q.T
    return (M + M.T) / 2


def fair_components(S: np.ndarray, Q: np.ndarray, k: int, cov_diffs=None, l=None,
                    solver: str = "dense") -> np.ndarray:
    """Top-k eigenvectors of S restricted to the orthogonal complement of Q's columns.

    Returns (k, d) orthonormal rows U with ``U Q = 0``; equivalent to Alg. 2's ``R Lambda``.
    With ``cov_diffs`` (Fair PCA-S, Sec. 3.6) the search is further restricted to the l
    directions of the complement along which the group covariances differ least, see
    :func:`equalizing_basis`.
    """
    if cov_diffs is not None:
        W = equalizing_basis(cov_diffs, Q, l)
        _, V = top_eigh(W.T @ S @ W, k, solver)
        U = W @ V
    else:
        _, U = top_eigh(S, k, solver, Q=Q)
    # enforce the constraint to rounding and re-diagonalise (Rayleigh-Ritz on span U)
    U = U - Q @ (Q.T @ U)
    U, _ = np.linalg.qr(U)
    _, G = np.linalg.eigh(U.T @ S @ U)
    return flip_signs((U @ G[:, ::-1]).T)


def equalizing_basis(cov_diffs, Q: np.ndarray, l: int) -> np.ndarray:
    """Orthonormal (d, l) basis, orthogonal to Q, where the group covariances agree most.

    ``cov_diffs`` is a list of (weight, D_g) pairs.  With a single ``D = Sigma_0 - Sigma_1``
    (two groups, the paper's Sec. 3.6) these are the eigenvectors of ``R^T D R`` with the l
    smallest |eigenvalues|.  With more groups (``D_g = Sigma_g - Sigma_pooled``) they are the
    l smallest eigenvectors of ``sum_g w_g (R^T D_g R)^2``, i.e. the directions v minimising
    ``sum_g w_g ||R^T D_g R v||^2``; for two groups this is the same subspace as the paper's
    (the sum is proportional to ``(R^T D R)^2``).
    """
    d = Q.shape[0]
    # one power of two for all differences (exact; the order of the eigenvalues is that
    # of c D for any c > 0): they become O(1), so their squares below neither underflow
    # nor overflow and the shift that parks Q's directions is relative
    top = max((float(np.abs(D).max()) for _, D in cov_diffs), default=0.0)
    e = int(np.frexp(top)[1]) if top > 0 else 0
    if len(cov_diffs) == 1:
        (_, D), = cov_diffs
        D = np.ldexp(D, -e)
        big = 2.0 * np.abs(D).sum(1).max() + 1.0  # above every |eigenvalue| of P D P
        w, V = scipy.linalg.eigh(_deflated(D, Q, big))
        order = np.argsort(np.abs(w), kind="stable")
    else:
        T = np.zeros((d, d))
        for wt, D in cov_diffs:
            A = _deflated(np.ldexp(D, -e), Q, 0.0)
            T += wt * (A @ A)
        big = 2.0 * np.abs(T).sum(1).max() + 1.0
        w, V = scipy.linalg.eigh(_deflated(T, Q, big))
        order = np.argsort(w, kind="stable")
    return V[:, order[:l]]


def flip_signs(U: np.ndarray) -> np.ndarray:
    """Make the largest-magnitude entry of every row positive (as scikit-learn's svd_flip)."""
    idx = np.argmax(np.abs(U), axis=1)
    signs = np.sign(U[np.arange(U.shape[0]), idx])
    signs[signs == 0] = 1
    return U * signs[:, None]
