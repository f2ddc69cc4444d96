"""Kernel functions and the numerical steps of :class:`~dfairpca.FairKernelPCA`.

Kernels (scikit-learn's definitions, computed in float64 row blocks), the expansion
``k(x, basis) @ coef - offset`` that every transform and the Nyström features are, the
exact method's solve on the n x n centred kernel (:func:`exact_fair_kernel`: centring,
the constraint's feature-space directions from its
:class:`~dfairpca.solve._fairness.FairnessConstraint`, the downdate ``Kc - D D^T``, dual
coefficients, the certificate's feature-space shares) and the lazy variance
``gamma="scale"`` needs.  See :mod:`dfairpca.decomposition.kernel` for the method.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
import scipy.linalg
from sklearn.metrics import pairwise

from ..base import _solvers, _system
from ..inputs._validation import check_finite_input, row_origin
from ..errors import InvalidInputError
from ._fairness import certify

# Deferred imports: dask (heavy or optional) and package modules that load such libraries, or this
# module, at import are imported in the functions that use them, so that importing this module stays
# light.

__all__ = ["KERNELS", "BLOCK_BYTES", "kernel_function", "block_rows", "expand", "nystroem_features",
           "kernel_matrix", "centre_in_place", "exact_violations", "clip_to_psd_in_place",
           "downdate_in_place", "dual_coefficients", "KernelSolution", "exact_fair_kernel",
           "inverse_sqrt", "take_rows", "flat_variance", "check_not_identity", "live_components"]

#: the named kernels (scikit-learn's definitions, :mod:`sklearn.metrics.pairwise`)
KERNELS = ("rbf", "poly", "sigmoid", "linear")
#: bytes of kernel values computed at once when expanding rows against the basis (half a
#: pass block: an RBF block also holds its squared distances while it is exponentiated)
BLOCK_BYTES = _system.BLOCK_BYTES // 2


def kernel_function(kernel, gamma, degree, coef0, shift=None):
    """A picklable ``f(A, B)`` returning the kernel matrix of two row blocks: ``kernel``
    a name of :data:`KERNELS` (for "linear", of the rows minus ``shift``) or a callable."""
    if callable(kernel):
        return functools.partial(_callable_kernel, kernel)
    return functools.partial(_named_kernel, kernel, gamma, degree, float(coef0), shift)


def _named_kernel(name, gamma, degree, coef0, shift, A, B):
    A = np.asarray(A, dtype=np.float64)
    B = np.asarray(B, dtype=np.float64)
    if name == "rbf":
        # exp(-gamma |a - b|^2) depends on differences only: centred on B's mean and scaled
        # by sqrt(gamma), the distances come from O(1) values (no cancellation of a large
        # offset, no squares of 1e-150s), so fit(c X + b) is fit(X) with gamma="scale"
        c = B.mean(axis=0)
        s = np.sqrt(gamma)
        D = pairwise.euclidean_distances((A - c) * s, (B - c) * s, squared=True)
        return np.exp(-D, out=D)
    if name == "poly":
        return pairwise.polynomial_kernel(A, B, degree=degree, gamma=gamma, coef0=coef0)
    if name == "sigmoid":
        return pairwise.sigmoid_kernel(A, B, gamma=gamma, coef0=coef0)
    if shift is not None:
        A, B = A - shift, B - shift
    return pairwise.linear_kernel(A, B)


def _callable_kernel(fn, A, B):
    A = np.asarray(A, dtype=np.float64)
    B = np.asarray(B, dtype=np.float64)
    K = np.asarray(fn(A, B), dtype=np.float64)
    if K.shape != (A.shape[0], B.shape[0]):
        raise InvalidInputError(
            f"the kernel callable returned shape {K.shape} for blocks of {A.shape[0]} and "
            f"{B.shape[0]} rows; it must return the ({A.shape[0]}, {B.shape[0]}) kernel matrix"
        )
    return K


def block_rows(width: int) -> int:
    """Rows whose float64 values over ``width`` columns take about :data:`BLOCK_BYTES`."""
    return _system.rows_per_block(8 * max(1, width), BLOCK_BYTES)


def _expand(x, basis, coef, offset, kern, columns=None, block_info=None):
    """``kern(x[:, columns], basis) @ coef - offset`` row block by row block (bounded
    temporaries); ``columns`` None: all of x's.

    Rows of x holding NaN or infinity raise, named (global rows inside ``map_blocks``):
    a kernel may map them to finite values (sklearn's refuse them without the rows, a
    callable may not look), and the test costs O(d) per row against the kernel's O(m d).
    """
    x = np.asarray(x)
    check_finite_input(x, *row_origin(block_info))
    if columns is not None:
        x = x[:, columns]
    basis = np.asarray(basis, dtype=np.float64)  # cast once, not per block
    out = np.empty((x.shape[0], coef.shape[1]))
    step = block_rows(max(basis.shape[0], x.shape[1]))
    for s in range(0, x.shape[0], step):
        out[s : s + step] = kern(x[s : s + step], basis) @ coef - offset
    return out


def expand(X, basis, coef, offset, kern, columns=None):
    """:func:`_expand` of a numpy X, or of each row chunk of a Dask X, lazily (basis and
    coef shipped to the workers once)."""
    import dask.array as da

    if not isinstance(X, da.Array):
        return _expand(X, basis, coef, offset, kern, columns)
    from ..engine._compute import ship

    return da.map_blocks(
        _expand, X, ship(basis), ship(coef), offset, kern, columns, dtype=np.float64,
        chunks=(X.chunks[0], (coef.shape[1],)), meta=np.empty((0, 0)),
    )


def nystroem_features(X, L, W, kern, features, numeric):
    """Lazy (n, r + q): the Nyström features ``kern(x, L) @ W`` of each row chunk of the
    Dask X's ``features`` columns, then its ``numeric`` protected attributes as they are
    (their covariances with the features are the constraint)."""
    from dask import delayed

    # one key each, not futures: the pass computes each chunk's graph on its own
    return X.map_blocks(_phi_block, delayed(L), delayed(W), kern, features, numeric,
                        dtype=np.float64, chunks=(X.chunks[0], (W.shape[1] + len(numeric),)),
                        meta=np.empty((0, 0)))


def _phi_block(x, basis, coef, kern, features, numeric, block_info=None):
    """Nyström features of a row chunk's ``features`` columns, then its ``numeric``
    protected attributes as float64: the columns the Nyström statistics are taken over."""
    phi = _expand(x, basis, coef, 0.0, kern, features if len(numeric) else None, block_info)
    if not len(numeric):
        return phi
    return np.hstack([phi, np.asarray(x)[:, numeric].astype(np.float64)])


def kernel_matrix(X: np.ndarray, kern) -> np.ndarray:
    """The n x n kernel matrix of the rows of X, computed as a chunked Dask array by local
    threads and written block by block into one float64 array (no concatenation copy)."""
    import dask.array as da

    n = X.shape[0]
    side = max(1, int(np.sqrt(BLOCK_BYTES / 8)))
    Xd = da.from_array(X, chunks=(side, -1))
    Kd = da.blockwise(kern, "ij", Xd, "ik", Xd, "jk", dtype=np.float64, concatenate=True)
    K = np.empty((n, n))
    da.store(Kd, K, lock=False, scheduler="threads")
    return K


# ---------------------------------------------------------------------------- exact solve
def centre_in_place(K: np.ndarray) -> np.ndarray:
    """``K <- H K H`` for symmetric K; returns the column means of the uncentred K."""
    col_mean = K.mean(axis=0)
    K -= col_mean[None, :]
    K -= (col_mean - col_mean.mean())[:, None]
    return col_mean


def exact_violations(coef: np.ndarray, columns) -> list:
    """Per attribute, per group: ``|B^T Kc z_g| / sqrt(z_g^T Kc z_g)``, the share of the
    group's feature-space mean deviation that the components (``B^T Kc B = I``) keep; 0
    for groups without signal.  O(n k m)."""
    out = []
    for KZ, sq in columns:
        v = np.zeros(len(sq))
        live = sq > 0
        if live.any():
            v[live] = np.linalg.norm(coef.T @ KZ[:, live], axis=0) / np.sqrt(sq[live])
        out.append(v)
    return out


def clip_to_psd_in_place(K: np.ndarray) -> np.ndarray:
    """``K <- V_+ Lambda_+ V_+^T``, its positive part (a full eigendecomposition, O(n^3)).

    Returns ``V_+`` (n, r), the eigenvectors of the eigenvalues above ``n * eps * max|w|``.
    """
    n = K.shape[0]
    # K is symmetric, so its transpose is the Fortran-ordered array LAPACK wants (no copy)
    w, V = scipy.linalg.eigh(K.T, overwrite_a=True, driver="evr")
    first = int(np.searchsorted(w, n * np.finfo(np.float64).eps * np.abs(w).max(), side="right"))
    Vp = V[:, first:]
    root = np.sqrt(w[first:])
    Vp *= root
    np.matmul(Vp, Vp.T, out=K)
    Vp /= root
    return Vp


def downdate_in_place(K: np.ndarray, D: np.ndarray) -> None:
    """``K <- K - D D^T`` panel by panel (no n x n temporary)."""
    step = block_rows(K.shape[0])
    for s in range(0, K.shape[0], step):
        K[s : s + step] -= D[s : s + step] @ D.T


def dual_coefficients(E, s, ZT, D, tol):
    """B of problem (6) for the eigenpairs (s, E) of ``Kc - D D^T``: ``(E - Z T D^T E) S^(-1/2)``.

    Then ``Kc B = E S^(1/2)`` (the training representation), ``B^T Kc B = I`` and
    ``Z^T Kc B = 0``.  Signs are fixed so that each column of ``E S^(1/2)`` has its largest
    entry positive.  Components with eigenvalue <= tol (kernel rank below k) get zero
    coefficients, as scikit-learn's KernelPCA does.  ``ZT = None``: standard kernel PCA.
    """
    E = _solvers.flip_signs(E.T).T
    if ZT is not None and D.shape[1]:
        E = E - ZT @ (D.T @ E)
    live = s > tol
    B = np.zeros_like(E)
    B[:, live] = E[:, live] / np.sqrt(s[live])
    return B


@dataclass(frozen=True)
class KernelSolution:
    """A certified exact fair kernel PCA solve (problem (6) by the downdate ``Kc - D D^T``).

    ``coef`` (n, k), or (n, 2k) with the λ-scaled standard kernel PCA's after the fair
    ones: the representation is ``kernel(x, X) @ coef - offset``; ``variances`` the k
    fair components' eigenvalues of the downdated kernel (sums of squares, 0 at or below
    rounding), ``total`` the trace of the centred (clipped) kernel; ``n_constraints`` the
    independent constraint directions removed; ``violations`` per attribute, the share of
    every group's feature-space mean deviation the components keep."""

    coef: np.ndarray
    offset: np.ndarray
    variances: np.ndarray
    total: float
    n_constraints: int
    violations: list


def exact_fair_kernel(X: np.ndarray, kern, k: int, *, constraint, codes, categories, numeric,
                      numeric_names, names, tradeoff: float, center: bool, psd: bool, rng,
                      live, estimator: str, fix: str, kernel=None, gamma=None) -> KernelSolution:
    """Fair kernel PCA of the rows of X (the fitted rows' features), exactly: Alg. 3 on the
    n x n kernel of ``kern``, via the downdate ``Kc - D D^T`` (see
    :mod:`dfairpca.decomposition.kernel`).

    ``constraint``: the fairness constraint (:class:`dfairpca.solve._fairness.FairnessConstraint`),
    whose feature-space rows are those of the groups ``codes`` (n, p) of ``categories`` (None
    without labelled attributes) and of the ``numeric`` attributes (n, q); ``names`` name
    them, labelled first.  ``center``: centre the kernel; ``psd``: whether the kernel is
    positive semi-definite (else its positive part is used); ``live(s, k, nonzero)``: the
    components kept (:func:`live_components`).  Certified before it returns
    (:func:`dfairpca.solve._fairness.certify`, naming ``estimator`` and ``fix``).  ``kernel``
    and ``gamma`` name the kernel in the identity-matrix refusal (:func:`check_not_identity`).
    """
    Z = constraint.kernel_indicators(codes, categories, numeric, numeric_names)
    n = X.shape[0]
    K = kernel_matrix(X, kern)
    check_not_identity(K, kernel, gamma)
    col_mean = centre_in_place(K) if center else np.zeros(n)
    positive = None if psd else clip_to_psd_in_place(K)
    total = float(np.trace(K))
    standard = _solvers.top_eigh_exact(K, k, rng) if tradeoff > 0 else None
    cats = ([] if codes is None else list(categories)) + [None] * np.shape(numeric)[1]
    ZT, D, columns = constraint.kernel_rows(K, Z, cats, names)
    downdate_in_place(K, D)
    s, E = _solvers.top_eigh_exact(K, k, rng, overwrite=True)
    del K
    tol = n * np.finfo(np.float64).eps * max(total, 0.0)
    k = live(np.where(s > tol, s, 0.0), k, total > 0)
    s, E = s[:k], E[:, :k]
    coef = dual_coefficients(E, s, ZT, D, tol)
    if standard is not None:
        s0, E0 = standard
        coef = np.hstack([coef, tradeoff * dual_coefficients(E0[:, :k], s0[:k], None, None, tol)])
    if positive is not None:  # coefficients in the clipped kernel's range: Kc B = Kc_+ B
        coef = positive @ (positive.T @ coef)
    if center:
        # Kc 1 = 0, so this keeps Kc B and makes kernel(x, X) B - col_mean B the centred
        # cross-kernel expansion (the row-mean term of the centring multiplies 1^T B = 0)
        coef -= coef.mean(axis=0)
    per_group = exact_violations(coef[:, :k], columns)
    certify(per_group, names, cats, np.finfo(np.float64).eps, estimator, fix=fix)
    return KernelSolution(coef, col_mean @ coef, s, total, D.shape[1], per_group)


# ---------------------------------------------------------------------------- Nyström
def inverse_sqrt(K_LL: np.ndarray) -> np.ndarray:
    """W (m, r) with ``W^T K_LL W = I_r``: ``V_+ Lambda_+^(-1/2)`` over the eigenvalues above
    ``m * eps * max`` (r = numerical rank)."""
    w, V = scipy.linalg.eigh((K_LL + K_LL.T) / 2)
    cut = K_LL.shape[0] * np.finfo(np.float64).eps * max(w.max(), 0.0)
    keep = w > cut
    if not keep.any():
        raise InvalidInputError("the landmark kernel matrix is zero; check the kernel and gamma")
    return V[:, keep] / np.sqrt(w[keep])


# ---------------------------------------------------------------------------- data access
def take_rows(X, rows):
    """X[rows] (all rows if None), lazily: a Dask array (numpy input is wrapped)."""
    import dask.array as da

    if not isinstance(X, da.Array):
        X = da.from_array(X, chunks=(block_rows(X.shape[1]), -1))
    return X if rows is None else X[rows]


def flat_variance(X):
    """Lazy variance of all entries of the Dask array X, in float64.

    Per chunk, the moments of float64 row blocks of about :data:`BLOCK_BYTES`, merged by
    the pairwise update: a chunk is never copied to float64 whole (a 10,240-row chunk of
    80 x 80 faces is 0.5 GB as float64, per thread).
    """
    from dask import delayed

    parts = [delayed(_entry_moments, pure=True)(b) for b in X.to_delayed().ravel()]
    return delayed(_variance_of, pure=True)(parts)


def _entry_moments(x) -> tuple[int, float, float]:
    """(count, mean, sum of squared deviations) of all entries of x."""
    x = np.asarray(x)
    x = x.reshape(x.shape[0], -1) if x.ndim else x.reshape(1, 1)
    acc = (0, 0.0, 0.0)
    for s in range(0, x.shape[0], block_rows(x.shape[1])):
        b = x[s : s + block_rows(x.shape[1])].astype(np.float64)
        if b.size:
            mean = float(b.mean())
            m2 = float(np.square(b - mean).sum())
            # (NaN or infinity in X is refused, named, where the rows are read)
            if (not np.isfinite(m2) and np.isfinite(b).all()) or (
                    m2 < np.finfo(np.float64).tiny and np.ptp(b) > 0):
                raise InvalidInputError(
                    "X's values are too far from 1 for gamma='scale': their variance "
                    f"{'overflows' if not np.isfinite(m2) else 'underflows'} float64; multiply X "
                    "by a constant (e.g. a power of two) that brings it near 1"
                )
            acc = _pairwise(acc, (b.size, mean, m2))
    return acc


def _pairwise(a, b):
    """Chan et al.'s update of (count, mean, M2) for the union of two sets."""
    (na, ma, qa), (nb, mb, qb) = a, b
    n = na + nb
    if nb == 0:
        return a
    delta = mb - ma
    return n, ma + delta * nb / n, qa + qb + delta * delta * na * nb / n


def _variance_of(parts) -> float:
    acc = (0, 0.0, 0.0)
    for p in parts:
        acc = _pairwise(acc, p)
    return acc[2] / acc[0] if acc[0] else float("nan")




# ---------------------------------------------------------------------------- rank checks
def check_not_identity(K: np.ndarray, kernel, gamma) -> None:
    """Raise if the rbf kernel matrix K is the identity to rounding (off the diagonal at
    most ``10 n eps``): every direction then has the same variance, so no top k exist
    (LAPACK's subset eigensolvers return fewer than k pairs or fail on such a cluster),
    and ``transform`` maps every new point to 0."""
    if kernel != "rbf" or K.shape[0] < 2:
        return
    diag = np.diagonal(K).copy()
    np.fill_diagonal(K, 0.0)
    off = float(np.abs(K).max())
    np.fill_diagonal(K, diag)
    if off <= 10 * K.shape[0] * np.finfo(np.float64).eps:
        raise InvalidInputError(
            f"the rbf kernel matrix is numerically the identity (largest entry off the "
            f"diagonal {off:.1e}): gamma={gamma:.3g} makes distinct points orthogonal, "
            "so every direction has the same variance and no top components exist; pass a "
            "smaller gamma, e.g. gamma='scale'"
        )


def live_components(s: np.ndarray, k: int, nonzero: bool, n_components, kernel, gamma) -> int:
    """k, or for ``n_components=None`` the number of components with positive variance
    (``s``: the variances, already 0 at or below rounding; ``nonzero``: whether the
    fitted kernel has any variance); raise when fewer than k (or none) have it, which
    would make ``transform`` return fewer or all-zero columns."""
    live = int(np.count_nonzero(s > 0)) if nonzero else 0
    if n_components is None and live:
        return live
    if live >= k:
        return k
    cause = {
        "rbf": "gamma={:.3g} makes distant points nearly orthogonal",
        "sigmoid": "tanh(gamma <x, y> + coef0) with gamma={:.3g} saturates",
        "poly": "the polynomial kernel with gamma={:.3g} has this rank",
        "linear": "the linear kernel's rank is at most the number of features",
    }.get(kernel if isinstance(kernel, str) else "", "the kernel has this rank")
    cause = cause.format(gamma)
    what = (f"only {live} of the {k} components have positive variance in the fair "
            f"feature space: the fair kernel matrix is numerically of rank {live} ({cause})")
    if kernel == "linear":
        fix = f"pass n_components <= {live}" if live else "check X"
    else:
        fix = (f"pass n_components <= {live} or another gamma" if live else
               "pass another gamma (or kernel)")
    if kernel == "sigmoid":
        fix += ", or centre X"
    raise InvalidInputError(f"{what}; {fix}")
