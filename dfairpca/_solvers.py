"""The small local solve: eigenvectors of d x d matrices built from :class:`Moments`.

Fair PCA (Kleindessner et al. 2023, Alg. 1/2, Sec. 3.5) maximises ``trace(U^T S U)`` over
orthonormal U subject to ``Z^T X U = 0``.  The paper builds an explicit basis R of the
nullspace of ``Z^T X`` (d x (d - r)) and solves ``R^T S R``.  Here R is never formed: with
Q an orthonormal basis of the r constraint directions (the group-mean deviations) and
``P = I - Q Q^T``, the top-k eigenvectors of ``P S P - c Q Q^T`` (c > 0 pushes the
constraint directions below every admissible eigenvalue) span the same subspace ``R Lambda``.
A final projection and Rayleigh-Ritz step make ``Q^T U = 0`` hold to rounding.
"""

from __future__ import annotations

import numpy as np
import scipy.linalg

__all__ = ["top_eigh", "constraint_basis", "fair_components", "pca_components", "flip_signs"]


def top_eigh(M: np.ndarray, k: int):
    """Largest k eigenpairs of symmetric M, eigenvalues descending."""
    d = M.shape[0]
    if k >= d:
        w, V = scipy.linalg.eigh(M)
    else:
        w, V = scipy.linalg.eigh(M, subset_by_index=[d - k, d - 1], driver="evr")
    return w[::-1][:k], V[:, ::-1][:, :k]


def constraint_basis(C: np.ndarray, atol: float = 0.0, rtol: float | None = None) -> np.ndarray:
    """Orthonormal basis (d, r) of the row space of C (the constraint directions).

    Rows whose norm is at most ``atol`` are noise and dropped; singular values below
    ``rtol * s_max`` count as rank deficiency (default ``10 * max(C.shape) * eps``, the
    rule of ``scipy.linalg.null_space``).
    """
    d = C.shape[1]
    C = C[np.linalg.norm(C, axis=1) > atol]
    if C.shape[0] == 0:
        return np.zeros((d, 0))
    U, s, _ = scipy.linalg.svd(C.T, full_matrices=False)
    if rtol is None:
        rtol = max(C.shape) * np.finfo(np.float64).eps * 10
    r = int(np.sum(s > rtol * s[0]))
    return U[:, :r]


def pca_components(S: np.ndarray, k: int) -> np.ndarray:
    """Top-k eigenvectors of S as rows (k, d), signs fixed."""
    _, V = top_eigh(S, k)
    return flip_signs(V.T)


def fair_components(S: np.ndarray, Q: np.ndarray, k: int) -> np.ndarray:
    """Top-k eigenvectors of S restricted to the orthogonal complement of Q's columns.

    Returns (k, d) orthonormal rows U with ``U Q = 0``; equivalent to Alg. 2's ``R Lambda``.
    """
    if Q.shape[1] == 0:
        return pca_components(S, k)
    SQ = S @ Q
    QtSQ = Q.T @ SQ
    c = abs(np.trace(S)) + 1.0
    # P S P - c Q Q^T, formed with rank-r updates (O(d^2 r)), no d x d projector
    M = S - Q @ SQ.T - SQ @ Q.T + Q @ (QtSQ - c * np.eye(Q.shape[1])) @ Q.T
    M = (M + M.T) / 2
    _, V = top_eigh(M, k)
    # enforce the constraint to rounding and re-diagonalise (Rayleigh-Ritz on span V)
    V = V - Q @ (Q.T @ V)
    V, _ = np.linalg.qr(V)
    w, G = np.linalg.eigh(V.T @ S @ V)
    V = V @ G[:, ::-1]
    return flip_signs(V.T)


def flip_signs(U: np.ndarray) -> np.ndarray:
    """Make the largest-magnitude entry of every row positive (as scikit-learn's svd_flip)."""
    idx = np.argmax(np.abs(U), axis=1)
    signs = np.sign(U[np.arange(U.shape[0]), idx])
    signs[signs == 0] = 1
    return U * signs[:, None]
