"""The restricted eigensolve of fair PCA: the top eigenpairs of a symmetric S on the
orthogonal complement of Q's orthonormal columns (the constraint directions), where the
projector ``P = I - Q Q^T`` is written once (:class:`Nullspace`) and never formed as a
d x d matrix.

Two ways to stay in that complement, by solver: LAPACK on the deflated matrix
``P S P + c Q Q^T`` with c below every eigenvalue of the PSD S (Q's directions then leave
the top), or block subspace iteration (:func:`dfairpca.base._solvers.subspace_iteration`)
that projects every block it forms.  The generic eigensolvers of :mod:`dfairpca.base._solvers`
know nothing of Q.
"""

from __future__ import annotations

import numpy as np

from ..base import _solvers
from ..base._solvers import EIGEN_SOLVERS, iterative
from ..base.progress import phase
from ..errors import InvalidInputError

__all__ = ["Nullspace", "restricted_top", "restricted_components", "ORTHONORMAL_ATOL"]


class Nullspace:
    """``P = I - Q Q^T`` for orthonormal columns Q (d, r), applied by rank-r products.

    Q with no columns (or None) is the identity."""

    def __init__(self, Q: np.ndarray | None, d: int | None = None) -> None:
        if Q is None:
            Q = np.zeros((0 if d is None else d, 0))
        self.Q = Q

    @property
    def rank(self) -> int:
        """r, the directions P removes."""
        return self.Q.shape[1]

    def project(self, A: np.ndarray) -> np.ndarray:
        """``P A`` (A: (d,) or (d, p)), a new array; A itself without Q."""
        Q = self.Q
        return A - Q @ (Q.T @ A) if Q.shape[1] else A

    def project_in_place(self):
        """``proj(A)``: A (d x p, C-ordered) projected by P in place, ``A -= Q (Q^T A)``, and
        returned (the identity without Q).  By blocks of rows: the temporaries stay in cache."""
        Q = self.Q
        if not Q.shape[1]:
            return lambda A: A
        Qt = np.ascontiguousarray(Q.T)

        def proj(A):
            T = Qt @ A  # (r, p)
            for s in range(0, A.shape[0], 512):
                A[s : s + 512] -= Q[s : s + 512] @ T
            return A

        return proj

    def deflate(self, A: np.ndarray, c: float) -> np.ndarray:
        """``P A P + c Q Q^T`` for symmetric A (d, d), by rank-r updates (no d x d
        projector): with c outside A's spectrum, Q's directions leave the top (or bottom)
        eigenpairs.  Symmetric to rounding."""
        Q = self.Q
        AQ = A @ Q
        M = A - Q @ AQ.T - AQ @ Q.T + Q @ (Q.T @ AQ + c * np.eye(Q.shape[1])) @ Q.T
        return (M + M.T) / 2


def restricted_top(S: np.ndarray, k: int, Q: np.ndarray | None, solver: str = "dense",
                   rtol: float = 1e-8, seed: int = 0):
    """Largest k eigenpairs (descending) of the PSD S on the complement of Q's columns.

    ``solver`` as :func:`dfairpca.base._solvers.top_eigh`'s: "dense" is LAPACK on the
    deflated S (Q's directions at ``-trace S``, below every eigenvalue of the PSD S, at its
    own scale); "subspace" block subspace iteration with every block projected off Q; "auto"
    :func:`~dfairpca.base._solvers.iterative`'s choice.  Without Q, the plain top-k."""
    null = Nullspace(Q, S.shape[0])
    if not null.rank:
        return _solvers.top_eigh(S, k, solver, rtol=rtol, seed=seed)
    d = S.shape[0]
    if solver == "auto":
        solver = "subspace" if iterative(d, k) else "dense"
    if solver not in EIGEN_SOLVERS:
        raise InvalidInputError(f"eigen_solver must be one of {EIGEN_SOLVERS}; got {solver!r}")
    if solver == "subspace" and k < d:
        with phase(f"eigensolve: top {k:,} of {d:,} dimensions "
                   "(block subspace iteration)"):
            return _solvers.subspace_iteration(S, k, project=null.project_in_place(), rtol=rtol,
                                               seed=seed)
    return _solvers.top_eigh(null.deflate(S, -(abs(np.trace(S)) or 1.0)), k, "dense")


#: the largest ``|U^T U - I|`` entry of the eigensolvers' components, after their
#: projection off Q, that is taken as orthonormal (Householder and Cholesky QR leave a few
#: eps times sqrt(k); a projection that moved U more is re-orthonormalised)
ORTHONORMAL_ATOL = 1e-12


def restricted_components(S: np.ndarray, Q: np.ndarray, k: int, within: np.ndarray | None = None,
                          solver: str = "dense") -> np.ndarray:
    """Top-k eigenvectors of S restricted to the orthogonal complement of Q's columns, as
    (k, d) orthonormal rows U with ``U Q = 0`` to rounding, signs fixed; equivalent to
    Alg. 2's ``R Lambda``.

    ``within`` (d, l), orthonormal and orthogonal to Q: the search is further restricted to
    its span (Fair PCA-S's equalising directions, see
    :func:`dfairpca.solve._fairness.equalizing_basis`)."""
    null = Nullspace(Q, S.shape[0])
    if within is not None:
        _, V = _solvers.top_eigh(within.T @ S @ within, k, solver)
        U = within @ V
    else:
        _, U = restricted_top(S, k, null.Q, solver)
    # enforce the constraint to rounding; where that moved U off orthonormal (a solver
    # that does not project, as LAPACK on the deflated matrix), re-orthonormalise and
    # re-diagonalise (Rayleigh-Ritz on span U): the eigensolvers return Ritz vectors, so
    # an orthonormal U needs neither (at d = 6,400, k = 400 two products of S saved)
    U = null.project(U)
    if np.abs(U.T @ U - np.eye(U.shape[1])).max() > ORTHONORMAL_ATOL:
        U = _solvers.orthonormal(U)
        _, G = np.linalg.eigh(U.T @ S @ U)
        U = U @ G[:, ::-1]
    return _solvers.flip_signs(U.T)
