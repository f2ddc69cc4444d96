"""Eigensolvers of symmetric matrices, the linear algebra every solve above uses: the top
k eigenpairs by LAPACK or block subspace iteration (one switch rule, :func:`iterative`),
and deterministic signs.

The fair PCA algebra built on them (the restriction to the complement of the constraint
directions, :mod:`dfairpca.solve._restricted`; the constraints, certificate and Fair PCA-S's
equalising basis, :mod:`dfairpca.solve._fairness`) lives in :mod:`dfairpca.solve`.  Every threshold and
shift here is relative to the matrix it applies to, so that the solution of ``c * S`` is
that of S for any c > 0 the dtype can hold.
"""

from __future__ import annotations

import warnings

import numpy as np
import scipy.linalg
import scipy.sparse.linalg

from sklearn.exceptions import ConvergenceWarning

from .progress import phase
from ..errors import InvalidInputError

__all__ = ["top_eigh", "top_eigh_exact", "iterative", "subspace_iteration", "orthonormal",
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


def top_eigh(M: np.ndarray, k: int, solver: str = "dense", rtol: float = 1e-8, seed: int = 0):
    """Largest k eigenpairs of symmetric M, eigenvalues descending.

    ``solver="dense"`` is LAPACK (``eigh`` with ``subset_by_index``); "subspace" is block
    subspace iteration with Rayleigh-Ritz (:func:`subspace_iteration`), for PSD M, which
    captures the variance of the top k to ``rtol`` relative (at d = 6400, k = 400: 1e-9).
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
            return subspace_iteration(M, k, rtol=rtol, seed=seed)
        return _dense_top(M, k)


def _dense_top(M: np.ndarray, k: int):
    """:func:`top_eigh` by LAPACK."""
    d = M.shape[0]
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


def subspace_iteration(S: np.ndarray, k: int, project=None, rtol: float = 1e-8, max_iter: int = 100,
                       oversample: int | None = None, seed: int = 0):
    """Top-k eigenpairs of PSD S by block iteration, restricted to a subspace by ``project``:
    a callable that maps a d x p block (C-ordered float64) onto it in place and returns it,
    applied to every block formed (the identity if None; for fair PCA the projector off
    the constraint directions, :meth:`dfairpca.solve._restricted.Nullspace.project_in_place`).

    A random block of ``p = k + oversample`` vectors is filtered by a polynomial of
    ``P S P`` and re-orthonormalised; before every filter a Rayleigh-Ritz step rotates the
    block to Ritz vectors.  Iteration stops when the sum of the top-k Ritz values, i.e. the
    variance the components capture, changes by less than ``rtol`` relative: the quantity
    PCA maximises, which converges even where eigenvalues around k are nearly equal and the
    individual vectors are not defined.  Past ``max_iter`` steps it stops with a
    ``ConvergenceWarning`` that says how far from converged, its block rotated to the
    Ritz vectors of its last product.

    The filter, where the block's k-th Ritz value is over 1.02 times its smallest, b (a
    gap between the wanted eigenvalues and the rest of the block): ``S (S - c) / b**2``
    with ``c = (2 sqrt 2 - 2) b``, the degree-2 polynomial that is 0 at 0 and smallest in
    magnitude on ``[0, b]`` relative to its growth above b.  Per two products it shrinks
    the unwanted part of an eigenvalue in [0, b] by about 12x where a plain power step
    does 3.7x, on the faces at d = 6,400, k = 400 (lambda_600 / lambda_400 = 0.52); the
    solve then takes 9 products and 4 orthonormalisations instead of 10 of each
    (benchmarks/eigensolvers.py).  Without such a gap (a cluster of equal eigenvalues
    across k, where any k of them are as good) the filter would damp the eigenvalues
    inside [0, b] no more than those at b, and the sum would stall short of its maximum,
    so that step is a plain power step, which removes what lies below.  1.02: on a flat
    spectrum (eigenvalues ``i ** -0.1``, k = 50: a ratio of 1.04) the filter converges in
    51 products where power steps are 7e-7 short after 100; on clusters of equal
    eigenvalues across k (a ratio of 1) power steps converge in 12-15 products where the
    filter stalls (tests/test_solver_edges.py).
    """
    d = S.shape[0]
    p = min(d, k + (oversample if oversample is not None else max(16, k // 2)))
    proj = project if project is not None else (lambda A: A)
    # an exact power of two that brings S near 1: the filter's products square S's scale,
    # which overflows (or underflows) for a norm beyond about 1e150 (1e-150)
    e = _exponent(float(np.abs(np.trace(S))))
    if abs(e) > 400:
        S = np.ldexp(S, -e)
    # three d x p blocks, reused: fresh 30 MB arrays at every step (d = 6,400, p = 600)
    # cost as much in page faults as the orthonormalisations' arithmetic
    W, Y = np.empty((d, p)), np.empty((d, p))
    V = orthonormal(proj(np.random.default_rng(seed).standard_normal((d, p))), overwrite=True, spare=Y)
    prev, change = None, np.inf
    for step in range(max_iter):
        proj(np.matmul(S, V, out=W))
        w, G = np.linalg.eigh(V.T @ W)  # Rayleigh-Ritz in span(V), ascending
        total = w[-k:].sum()
        if prev is not None:
            change = abs(total - prev) / abs(total) if total else 0.0
            if change <= rtol:
                break
        if step == max_iter - 1:
            warnings.warn(
                f"block subspace iteration stopped after {max_iter} steps with the captured "
                f"variance still changing by {change:.1e} (relative; the target is {rtol:g}): "
                f"{_stall_cause(w, k, rtol, max_iter)}; eigen_solver='dense' solves it exactly",
                ConvergenceWarning, stacklevel=3)
            break
        prev = total
        b, wanted = w[0], w[::-1][k - 1]
        # the filtered block is rotated to the Ritz vectors' order (one product with G): its
        # columns are then nearly orthogonal, as Cholesky QR needs
        if b > np.finfo(float).eps * abs(w[-1]) and wanted > FILTER_GAP * b and p < d:
            # Y = (S V - c b V) G / b, then V = P S Y / b, in V's own memory
            W -= np.multiply(V, FILTER_ZERO * b, out=Y)
            np.matmul(W, G[:, ::-1] / b, out=Y)
            proj(np.matmul(S, Y, out=V))
            V /= b
            V = orthonormal(V, overwrite=True, spare=Y)
        else:  # no gap above b, or S singular within the block: a plain power step
            np.matmul(W, np.ascontiguousarray(G[:, ::-1]), out=Y)
            V, Y = orthonormal(Y, overwrite=True, spare=V), V
    V = V @ G[:, ::-1]
    w = w[::-1][:k]
    return (np.ldexp(w, e) if abs(e) > 400 else w), V[:, :k]


def _stall_cause(w: np.ndarray, k: int, rtol: float, max_iter: int) -> str:
    """Why :func:`subspace_iteration` did not converge, from its last Ritz values w
    (ascending, the block's p): the gap ratio r = (block's smallest) / (k-th largest),
    about lambda_p / lambda_k, by which each step shrinks the error of the captured variance
    at least r**2 (a plain power step; the filter does better), so that converging to
    rtol takes about ``log(rtol) / (2 log r)`` steps.  Clustered eigenvalues only where r
    is within :data:`FILTER_GAP` of 1; too few steps where the gap needs more than
    ``max_iter``; otherwise the spectrum would have converged and the change is rounding
    (a target below what float64 resolves in the sum, an ill-conditioned or
    not positive semi-definite S)."""
    if not np.all(np.isfinite(w)):
        return "S holds NaN or infinity"
    wanted, b, top = float(w[::-1][k - 1]), float(w[0]), float(np.abs(w).max())
    r = max(b, 0.0) / wanted if wanted > 0 else 1.0
    negative = (f"; S is not positive semi-definite (a Ritz value of {b:.2e} against a "
                f"largest of {top:.2e})") if b < -w.size * np.finfo(float).eps * top else ""
    if r * FILTER_GAP >= 1:
        return (f"the eigenvalues around k are clustered (the block's smallest Ritz value is "
                f"{r:.4f} of the k-th: components of nearly equal variance, nearly "
                f"interchangeable){negative}")
    need = int(np.ceil(np.log(min(rtol, 0.5)) / (2 * np.log(r)))) if r > 0 else 1
    if need > max_iter:
        return (f"iterations exhausted: the gap around k (the block's smallest Ritz value "
                f"{r:.3f} of the k-th) needs about {need} steps{negative}")
    return (f"not the spectrum, whose gap (the block's smallest Ritz value {r:.3f} of the "
            f"k-th) converges in about {need} steps: the change is rounding, a target below "
            f"what float64 resolves or an ill-conditioned S{negative}")


#: the ratio of the k-th Ritz value to the block's smallest above which
#: :func:`subspace_iteration` filters (below it, a plain power step)
FILTER_GAP = 1.02
#: the filter's second root, as a multiple of b: ``(2 sqrt 2 - 2)`` equalises the
#: polynomial's magnitude at b and at its minimum c / 2
FILTER_ZERO = 2 * np.sqrt(2) - 2


def _exponent(x: float) -> int:
    """The binary exponent of x (0 for 0, inf or NaN)."""
    return int(np.frexp(x)[1]) if np.isfinite(x) and x > 0 else 0


def orthonormal(A: np.ndarray, overwrite: bool = False, spare: np.ndarray | None = None) -> np.ndarray:
    """An orthonormal basis of the columns of A (d x p, p <= d), in their order.

    Cholesky QR, twice, of A with its columns scaled to unit norm: its products are
    level-3 BLAS (a Gram matrix, and the block times the inverse of the small triangular
    factor), several times faster than Householder QR on a 6,400 x 600 block.  The first
    pass leaves a block whose Gram matrix is I + E; the second is accepted only where its
    factor is within 0.1 of I (E small), where one more pass is orthonormal to rounding.
    Householder QR otherwise: a factorisation that fails, or a block too ill-conditioned
    for the first pass (a column within 1e-7 of the span of those before it).

    With ``overwrite`` (A C-ordered float64) the passes run in A's memory, which holds the
    result, and in ``spare``'s if given (an array of A's shape): no d x p array is
    allocated.  A Householder QR after a pass then factors the block that pass left: each
    pass multiplies the block by a lower triangular matrix's transpose, so the basis is
    the same in exact arithmetic, with the rounding of that pass amplified by the block's
    conditioning, which R's diagonal above 1e-7 does not bound (a Kahan matrix passes it
    with a condition number near 1e19, its spans then off by about 1e-7): where a caller
    needs more (not subspace iteration, whose next step corrects it), it keeps
    ``overwrite`` off and the fallback factors A itself.

    Only numpy's BLAS is called (the solver's products use it too: a second BLAS library's
    threads, spinning after each call, would slow them).
    """
    norms = np.sqrt(np.einsum("ij,ij->j", A, A))
    if not (np.all(norms > 0) and np.all(np.isfinite(norms))):
        return np.linalg.qr(A)[0]
    inplace = overwrite and A.dtype == np.float64 and A.flags.c_contiguous
    B = A if inplace else np.array(A, dtype=np.float64, order="C")
    B /= norms
    if spare is None or spare.shape != B.shape or spare.dtype != np.float64 or spare is B:
        spare = np.empty_like(B)
    src, dst = B, spare
    try:
        for _ in range(2):
            R = np.linalg.cholesky(src.T @ src)  # lower: src^T src = R R^T
            # unit columns: R's diagonal is each column's distance from the span of those
            # before it; within 1e-7 the pass would amplify rounding by more than 1e7
            if not np.all(np.diagonal(R) > 1e-7):
                raise np.linalg.LinAlgError("ill-conditioned")
            np.matmul(src, np.tril(np.linalg.inv(R)).T, out=dst)  # src R^-T
            src, dst = dst, src
        if np.abs(R - np.eye(R.shape[0])).max() <= 0.1 and np.all(np.isfinite(src)):
            return src  # B's memory again, after two passes
    except np.linalg.LinAlgError:
        pass
    return np.linalg.qr(src if inplace else A)[0]  # the same columns' spans, in order (see above)


def pca_components(S: np.ndarray, k: int, solver: str = "dense") -> np.ndarray:
    """Top-k eigenvectors of S as rows (k, d), signs fixed."""
    _, V = top_eigh(S, k, solver)
    return flip_signs(V.T)


def flip_signs(U: np.ndarray) -> np.ndarray:
    """Make the largest-magnitude entry of every row positive (as scikit-learn's svd_flip)."""
    idx = np.argmax(np.abs(U), axis=1)
    signs = np.sign(U[np.arange(U.shape[0]), idx])
    signs[signs == 0] = 1
    return U * signs[:, None]
