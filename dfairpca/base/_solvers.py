"""Eigensolvers of symmetric matrices, the linear algebra every solve above uses: the top
k eigenpairs by LAPACK or block subspace iteration (one switch rule, :func:`iterative`),
optionally outside the span of an orthonormal Q (:func:`deflated`), and deterministic signs.

The fair PCA algebra built on them (constraint basis, certificate, Fair PCA-S's equalising
basis, the fair eigenproblem) is :mod:`dfairpca.solve._fairness`'.  Every threshold and
shift here is relative to the matrix it applies to, so that the solution of ``c * S`` is
that of S for any c > 0 the dtype can hold.
"""

from __future__ import annotations

import numpy as np
import scipy.linalg
import scipy.sparse.linalg

from .progress import phase
from ..errors import InvalidInputError

__all__ = ["top_eigh", "top_eigh_exact", "iterative", "subspace_iteration", "deflated",
           "pca_components", "flip_signs", "EIGEN_SOLVERS", "ITERATIVE_MIN_SIZE"]


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
        M = deflated(M, Q, -(abs(np.trace(M)) or 1.0))
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


def pca_components(S: np.ndarray, k: int, solver: str = "dense") -> np.ndarray:
    """Top-k eigenvectors of S as rows (k, d), signs fixed."""
    _, V = top_eigh(S, k, solver)
    return flip_signs(V.T)


def deflated(A: np.ndarray, Q: np.ndarray, c: float) -> np.ndarray:
    """``P A P + c Q Q^T`` with ``P = I - Q Q^T``, by rank-r updates (no d x d projector):
    with c outside A's spectrum, Q's directions leave the top (or bottom) eigenpairs.

    Parameters
    ----------
    A : ndarray (d, d)
        A symmetric matrix.
    Q : ndarray (d, r)
        Orthonormal columns.
    c : float
        The eigenvalue given to Q's directions.

    Returns
    -------
    ndarray (d, d)
        The symmetric result.
    """
    AQ = A @ Q
    M = A - Q @ AQ.T - AQ @ Q.T + Q @ (Q.T @ AQ + c * np.eye(Q.shape[1])) @ Q.T
    return (M + M.T) / 2


def flip_signs(U: np.ndarray) -> np.ndarray:
    """Make the largest-magnitude entry of every row positive (as scikit-learn's svd_flip)."""
    idx = np.argmax(np.abs(U), axis=1)
    signs = np.sign(U[np.arange(U.shape[0]), idx])
    signs[signs == 0] = 1
    return U * signs[:, None]
