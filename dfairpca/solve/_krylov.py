"""The block Krylov space of the matrix-free solve (:mod:`dfairpca.solve._randomized`): its
growth by one block per pass, the Rayleigh-Ritz step, the convergence estimate and the
components it gives.  Pure linear algebra on d x w blocks; the passes over X that apply the
operator are the driver's.
"""

from __future__ import annotations

import numpy as np
import scipy.linalg

from ..base import _solvers

__all__ = ["Krylov", "ritz_components", "RANK_RTOL"]

#: a direction of a new block is kept unless its residual against the blocks before is
#: below this share of the block's largest column: an exhausted space, or what the Gram
#: matrix of the block cannot tell from rounding (its eigenvalues are exact to about
#: ``eps * |W|^2``, so singular values below ``sqrt(eps) |W|`` are noise)
RANK_RTOL = 1e-7


# ----------------------------------------------------------------------------- Krylov
class Krylov:
    """A block Krylov space of a symmetric PSD operator, grown by one block per pass.

    ``pending`` is the newest orthonormal block, waiting for the operator; ``extend(W)``
    takes ``W = M @ pending``, adds the new entries of ``H = K^T M K`` (each pair of blocks
    once: ``B_i^T M B_j = B_i^T W_j`` by symmetry) and makes the next block from what W
    adds to the space.  ``proj`` keeps every block in the constraint's complement.  The
    blocks are kept apart (``blocks``), never copied into one d x (all) basis: at
    d = 116,412 each is 56 MB, and the client holds each once.
    """

    def __init__(self, W: np.ndarray, proj, k: int):
        self.proj, self.k, self.d = proj, k, W.shape[0]
        self.blocks: list[np.ndarray] = []
        self.H = np.zeros((0, 0))
        # the captured variance (top-k Ritz values' sum) after each block
        self.history: list[float] = []
        self.missing: list[float] = []  # the share of it still missing, estimated (_missing)
        self.pending = self._next(W)

    def _outside(self, R: np.ndarray) -> np.ndarray:
        """R minus its part in the span of the blocks (one classical Gram-Schmidt sweep)."""
        coef = [B.T @ R for B in self.blocks]
        for B, c in zip(self.blocks, coef):
            R = R - B @ c
        return R

    def _next(self, W: np.ndarray) -> np.ndarray | None:
        ref = float(np.sqrt(np.max(np.einsum("ij,ij->j", W, W), initial=0.0)))
        R = self.proj(W)
        for _ in range(2):  # twice is enough (Giraud et al. 2005)
            R = self._outside(R)
        U = _range(R, RANK_RTOL * ref)
        if not U.shape[1]:
            return None  # the space is invariant: nothing new to add
        # directions of a small residual lost orthogonality in the normalisation: once more
        return _range(self._outside(self.proj(U)), 0.5)

    @property
    def block(self) -> np.ndarray:
        """The pending block (asked for only while there is one)."""
        assert self.pending is not None
        return self.pending

    def extend(self, W: np.ndarray) -> None:
        B = self.block
        col = np.vstack([Bi.T @ W for Bi in self.blocks] + [B.T @ W])  # (K, B)^T M B
        s = self.H.shape[0]
        top = col[s:]
        H = np.zeros((s + B.shape[1], s + B.shape[1]))
        H[:s, :s] = self.H
        H[:s, s:] = col[:s]
        H[s:, :s] = col[:s].T
        H[s:, s:] = (top + top.T) / 2
        self.blocks.append(B)
        self.H = H
        R = W  # what M adds outside the space: the Ritz pairs' residuals
        at = 0
        for Bi in self.blocks:
            R = R - Bi @ col[at : at + Bi.shape[1]]
            at += Bi.shape[1]
        w, G = scipy.linalg.eigh(H)
        order = np.argsort(w)[::-1]
        g = G[s:, order[: self.k]]  # the newest block's share of the top-k Ritz vectors
        res2 = np.maximum(np.einsum("ij,ij->j", g, (R.T @ R) @ g), 0.0)
        theta = w[order]
        captured = float(theta[: self.k].sum())
        self.history.append(captured)
        self.missing.append(_missing(theta, res2, self.k, captured))
        self.pending = self._next(R)

    def state(self, name: str) -> dict:
        """The arrays that :meth:`restore` continues from (a checkpoint's)."""
        out = {f"{name}_H": self.H, f"{name}_history": np.asarray(self.history, np.float64),
               f"{name}_missing": np.asarray(self.missing, np.float64)}
        out.update({f"{name}_block_{i}": B for i, B in enumerate(self.blocks)})
        if self.pending is not None:
            out[f"{name}_pending"] = self.pending
        return out

    @classmethod
    def restore(cls, arrays: dict, name: str, proj, k: int, d: int) -> "Krylov":
        """The space :meth:`state` saved, to go on growing."""
        space = cls.__new__(cls)
        space.proj, space.k, space.d, space.H = proj, k, d, arrays[f"{name}_H"]
        space.blocks = []
        while f"{name}_block_{len(space.blocks)}" in arrays:
            space.blocks.append(arrays[f"{name}_block_{len(space.blocks)}"])
        if sum(B.shape[1] for B in space.blocks) != space.H.shape[0]:
            raise KeyError(f"{name}_block_{len(space.blocks)}")  # a block is missing
        space.history = [float(v) for v in arrays[f"{name}_history"]]
        space.missing = [float(v) for v in arrays[f"{name}_missing"]]
        space.pending = arrays.get(f"{name}_pending")
        return space

    def ritz(self) -> tuple[np.ndarray, np.ndarray]:
        """The top-k Ritz values (descending) and vectors (d, k) of the blocks so far."""
        w, G = scipy.linalg.eigh(self.H)
        top = np.argsort(w)[::-1][: self.k]
        U, at = np.zeros((self.d, len(top))), 0
        for B in self.blocks:
            U = U + B @ G[at : at + B.shape[1], top]
            at += B.shape[1]
        return w[top], U


def _missing(theta, res2, k: int, captured: float) -> float:
    """The share of the optimal captured variance the top-k Ritz pairs still miss, estimated
    by the quadratic residual bound ``sum_i |r_i|^2 / (theta_i - lambda_{k+1})`` (Ritz value
    theta_i, residual ``r_i = M u_i - theta_i u_i``), with the Ritz value theta_{k+1} for the
    unknown eigenvalue lambda_{k+1}; infinite while the space holds no theta_{k+1} or it
    ties with theta_k."""
    if len(theta) <= k or captured <= 0:
        return float("inf")
    gaps = theta[:k] - theta[k]
    if np.any(gaps <= 0):
        return float("inf")
    return float(np.sum(res2 / gaps) / captured)


def _range(A: np.ndarray, floor: float) -> np.ndarray:
    """An orthonormal basis (d, r) of the directions of A (d, w) whose singular values exceed
    ``floor``, largest first, from the w x w Gram matrix: one GEMM, where a d x w SVD or QR
    (LAPACK's panel factorisation, bound by memory) took 0.9 s at d = 116,412 and w = 60 on
    one core, 40 times as long.  Orthonormal to ``eps * (|A| / floor)^2``: callers
    orthonormalise a second time (then exact) unless A's columns are nearly so."""
    s2, V = scipy.linalg.eigh(A.T @ A)
    keep = np.flatnonzero(s2 > floor * floor)[::-1] if floor > 0 else np.zeros(0, np.intp)
    return (A @ V[:, keep]) / np.sqrt(s2[keep])


def ritz_components(space: Krylov, k: int, project) -> tuple[np.ndarray, np.ndarray]:
    """(captured, components (k, d)): the top-k Ritz pairs, held in the complement to
    rounding and signs fixed.  Fewer than k directions (data of rank below k) are completed
    by orthonormal directions of zero variance."""
    theta, U = space.ritz()
    if U.shape[1] < k:
        rng = np.random.default_rng(0)
        extra = project(rng.standard_normal((U.shape[0], k - U.shape[1])))
        extra -= U @ (U.T @ extra)
        U = np.hstack([U, np.linalg.qr(extra)[0]])
        theta = np.concatenate([theta, np.zeros(k - len(theta))])
    # Cholesky QR: U is orthonormal to rounding already, so U^T U = L L^T is well conditioned
    # and U L^-T exact; L's positive diagonal keeps every column's sign (the Ritz vectors')
    U = project(U)
    L = np.linalg.cholesky(U.T @ U)
    U = scipy.linalg.solve_triangular(L, U.T, lower=True).T
    return theta, _solvers.flip_signs(U.T)
