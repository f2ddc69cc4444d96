"""Fair kernel PCA (Kleindessner et al., AISTATS 2023, Sec. 3.3 and Alg. 3), exact and Nyström.

Both methods give a representation of the same form,

    rep(x) = k(x, basis_) @ dual_coef_ - offset_,

where ``basis_`` holds the n training rows (exact) or m landmark rows (Nyström), so one
``transform`` serves both, lazily (``map_blocks``) on Dask input.

Exact method
------------
Problem (6) of the paper with the centred kernel ``Kc = H K H`` (``H = I - 11^T/n``, as
scikit-learn's ``KernelCenterer``) and the stacked centred one-hot matrix Z of all attributes
(Sec. 3.4/3.5): maximise ``trace(B^T Kc Kc B)`` subject to ``B^T Kc B = I`` and
``Z^T Kc B = 0``.  In feature space this is: the top-k directions of the centred data after
projecting out the r constraint directions ``Phi Z T`` (T chosen so that they are
orthonormal, ``T^T Z^T Kc Z T = I``).  With ``D = Kc Z T`` (n x r) the projected data's
Gram matrix is the rank-r downdate

    M = Kc - D D^T,

and the solution is ``M = E S E^T`` (top k): the training representation is ``E S^(1/2)``
and ``B = (E - Z T D^T E) S^(-1/2)``, whose centred-kernel expansion reproduces it for the
training rows and extends it to new points.  This is the same subspace as Alg. 3 of the
paper (``R`` = nullspace of ``Z^T Kc``, generalised eigenvectors of
``(R^T Kc Kc R, R^T Kc R)``; ``tests/test_kernel.py`` checks it against a dense Alg. 3), at the
cost of one n x n kernel matrix and a top-k eigensolve instead of an n x n nullspace, two
n x n products and a generalised eigenproblem.

*The paper's 1e-5 fallback.*  With a centred kernel ``R^T Kc R`` is always singular (the
constant vector lies in the nullspace of ``Z^T Kc`` and of ``Kc``), so the paper's remedy for
SciPy's ``eigsh`` (App. C.1: add ``1e-5 I`` to the right-hand matrix) would always fire and
would move the subspace by O(1e-5 / eigenvalue).  The formulation above needs no such
regularisation: it works on the range of ``Kc`` exactly, which is the limit of the paper's
solution as the added multiple of I goes to 0 (the tests compare with both).

*Kernels that are not positive semi-definite* ("sigmoid", "poly" with ``coef0 < 0``, and
callables, which cannot be checked) have no feature space, and problem (6) is then not
well posed (``R^T Kc R`` indefinite).  The exact method replaces ``Kc`` by its positive part
``V_+ Lambda_+ V_+^T`` (spectrum clipping; a full O(n^3) eigendecomposition) and keeps the
coefficients in its range, so the training representation is ``Kc B = Kc_+ B``.  The
Nyström method clips the landmark kernel the same way (below).

Nyström method
--------------
m landmark rows L sampled uniformly from the fitted rows define features
``phi(x) = k(x, L) V_+ Lambda_+^(-1/2)``, with ``K_LL = V Lambda V^T`` and eigenvalues below
``m * eps * max(Lambda)`` dropped (``k(x, L) K_LL^(-1/2)`` up to an orthogonal rotation, in
``rank(K_LL)`` dimensions).  Linear fair PCA on phi, centred in phi space (the centred
Nyström approximation of fair kernel PCA), is solved from the one-pass additive statistics
of :func:`dfairpca.compute_moments` over ``phi`` computed chunk by chunk, and
:meth:`FairPCA.fit_statistics`; the n x m feature matrix is never materialised.  With all
rows as landmarks it equals the exact method.
"""

from __future__ import annotations

import functools
import numbers
import warnings

import numpy as np
import scipy.linalg
import scipy.sparse.linalg
from sklearn.base import BaseEstimator, ClassNamePrefixFeaturesOutMixin, TransformerMixin
from sklearn.exceptions import NotFittedError
from sklearn.metrics import pairwise

from . import _solvers
from ._engine import compute_moments
from ._validation import (
    as_data, binary_target, check_finite_input, check_n_features, encode_groups,
    require_sensitive_features, row_origin, with_known_rows,
)
from .decomposition import CONSTRAINTS, FairPCA, certify

__all__ = ["FairKernelPCA", "KERNELS", "exact_fit_bytes"]

#: the named kernels (scikit-learn's definitions, :mod:`sklearn.metrics.pairwise`)
KERNELS = ("rbf", "poly", "sigmoid", "linear")
#: "auto" uses the exact method up to this many fitted rows (if it fits in memory) ...
AUTO_EXACT_MAX_ROWS = 20_000
#: ... and Nyström with this many landmarks (at most n) beyond
AUTO_LANDMARKS = 2_000
#: n x n float64 matrices alive at the peak of an exact fit (the kernel, an eigensolver copy
#: or the eigenvectors of a clipped kernel, and headroom for the blocks in flight)
EXACT_MATRICES = 3
#: bytes of kernel values computed at once when expanding rows against the basis
BLOCK_BYTES = 32 << 20
#: the Lanczos eigensolver (ARPACK) replaces dense ``eigh`` above this n when k < n / 10
LANCZOS_MIN_ROWS = 1_000


def exact_fit_bytes(n: int, d: int) -> int:
    """Memory the exact method needs for n fitted rows of d features, in bytes.

    ``EXACT_MATRICES`` n x n float64 matrices plus the fitted rows as float64.
    """
    return 8 * (EXACT_MATRICES * n * n + n * d)


class FairKernelPCA(ClassNamePrefixFeaturesOutMixin, TransformerMixin, BaseEstimator):
    """Fair kernel PCA: a k-dimensional non-linear representation with equal group means.

    The k directions of largest variance in the kernel's feature space (RKHS) among those
    along which every group of every protected attribute has the same mean, i.e. no linear
    function of the representation is correlated with group membership (Sec. 3.3 of
    Kleindessner et al. 2023).  Exactly (Alg. 3; O(n^2) memory, O(n^2 k) to O(n^3) time) or by
    the Nyström approximation with m landmarks (one chunked pass over the data, m x m
    statistics, out of core).  See the module docstring for the formulation.

    Parameters
    ----------
    n_components : int
        k, the dimension of the representation.  At most ``n - sum(m_r) + p`` (exact) or
        ``m - sum(m_r) + p`` (Nyström) for p attributes with m_1, ..., m_p groups.
    kernel : {"rbf", "poly", "sigmoid", "linear"} or callable, default "rbf"
        scikit-learn's kernels: ``exp(-gamma ||x - y||^2)``, ``(gamma <x, y> + coef0)^degree``,
        ``tanh(gamma <x, y> + coef0)``, ``<x, y>``.  A callable ``kernel(A, B)`` must return the
        ``(len(A), len(B))`` kernel matrix of two float64 row blocks (and be picklable to
        run on a distributed cluster).
    gamma : "scale" or float > 0, default "scale"
        "scale" is ``1 / (d * Var(X))`` with Var over the flattened fitted rows (the paper's
        App. C.1 and scikit-learn's SVC default; 1 if that variance is 0), computed by a
        lazy reduction.  Unused by "linear" and callables.
    degree : int, default 3
        Degree of "poly".
    coef0 : float, default 1.0
        Constant of "poly" and "sigmoid".
    n_landmarks : None, int or "auto", default None
        None: the exact method.  int m: Nyström with m landmarks, ``n_components <= m <= n``.
        "auto": exact when n <= 20,000 fitted rows and :func:`exact_fit_bytes` is within
        ``max_memory`` (exact is then affordable: O(n^2) memory, seconds to minutes), else
        Nyström with ``m = min(n, 2000)`` (one pass, memory O(m^2 + chunk * m)).  The choice
        is recorded in ``method_`` and ``n_landmarks_``.
    landmarks : {"uniform"}, default "uniform"
        How landmarks are chosen: uniformly without replacement from the fitted rows,
        deterministic given ``random_state``.
    constraint : {"demographic_parity", "equal_opportunity"}, default "demographic_parity"
        "equal_opportunity" (Sec. 3.2) fits on the rows with ``y == 1`` only (kernel,
        centring, landmarks, gamma and group means).
    tradeoff : float in [0, 1], default 0
        λ of Sec. 3.1: ``transform`` returns ``[fair, λ * standard kernel PCA]`` of shape
        (n, 2k) when λ > 0.  λ enters linearly, as in :class:`dfairpca.FairPCA`.
    center : bool, default True
        Centre the kernel (in feature space; the exact method as ``KernelCenterer``).
        False uses the uncentred kernel, as the paper's formulas.
    random_state : int or None, default 0
        Seeds the landmark sample and the Lanczos start vector.
    max_memory : int or None, default None
        Bytes the exact method may use; None is 50% of the currently available memory
        (``psutil``).  The exact method refuses to start (ValueError) above it.
    split_every : int, default 8
        Fan-in of the merges of the pass's running sums of the Nyström statistics (one
        sum per worker thread, see :func:`dfairpca.compute_moments`).

    Attributes
    ----------
    method_ : {"exact", "nystroem"}
    n_landmarks_ : int
        Rows in ``basis_``: n (exact) or m (Nyström).
    basis_ : ndarray (n_landmarks_, d)
        The fitted rows (exact) or the landmarks (Nyström), in the input dtype.
    basis_indices_ : ndarray of int (n_landmarks_,)
        Their row indices in the X given to ``fit``.
    dual_coef_ : ndarray (n_landmarks_, k) or (n_landmarks_, 2k)
        ``transform(x) = kernel(x, basis_) @ dual_coef_ - offset_``.
    offset_ : ndarray (k,) or (2k,)
    gamma_ : float or None
        The kernel parameter used (None for "linear" and callables).
    n_components_ : int
    explained_variance_ : ndarray (k,)
        Variance of each fair component over the fitted rows (sum of squares / (n - 1)).
    explained_variance_ratio_ : ndarray (k,)
        Its share of the total variance in feature space, ``trace(Kc) / (n - 1)``; for
        Nyström of the Nyström-approximated kernel.
    n_constraints_ : int
        Number of independent constraint directions removed.
    fairness_violation_ : float
        The fit's certificate, checked after the solve on the training statistics: the
        largest share ``|U^T delta_g| / |delta_g|`` of any group's mean deviation delta_g
        (in the kernel's feature space: exact, from the kernel's group means; Nyström, in
        the Nyström feature space) that the k fair components keep; a fit above
        :data:`dfairpca._solvers.FAIRNESS_TOLERANCE` raises ``ValueError``.  With
        ``tradeoff > 0`` it certifies the fair half; the λ-scaled standard half is by
        design not fair.
    fairness_violation_per_attribute_ : ndarray (p,)
        The same, per attribute.
    max_components_ : int
        The largest k allowed.
    groups_ : list of ndarray
    attribute_names_ : list of str
    n_features_in_, n_samples_seen_ : int
        Features, and rows fitted on (the ``y == 1`` rows for equal opportunity).

    Examples
    --------
    >>> import numpy as np
    >>> from dfairpca.kernel import FairKernelPCA
    >>> rng = np.random.default_rng(0)
    >>> X, z = rng.normal(size=(300, 4)), rng.integers(0, 2, 300)
    >>> X[z == 1] += 1.0
    >>> Y = FairKernelPCA(3).fit_transform(X, sensitive_features=z)
    >>> bool(np.allclose(Y[z == 0].mean(0), Y[z == 1].mean(0)))
    True
    """

    def __init__(self, n_components, *, kernel="rbf", gamma="scale", degree=3, coef0=1.0,
                 n_landmarks=None, landmarks="uniform", constraint="demographic_parity",
                 tradeoff=0.0, center=True, random_state=0, max_memory=None, split_every=8):
        self.n_components = n_components
        self.kernel = kernel
        self.gamma = gamma
        self.degree = degree
        self.coef0 = coef0
        self.n_landmarks = n_landmarks
        self.landmarks = landmarks
        self.constraint = constraint
        self.tradeoff = tradeoff
        self.center = center
        self.random_state = random_state
        self.max_memory = max_memory
        self.split_every = split_every

    # ------------------------------------------------------------------ parameters
    def _check_params(self):
        k = self.n_components
        if not _is_int(k) or k <= 0:
            raise ValueError(f"n_components must be a positive integer; got {k!r}")
        if not callable(self.kernel) and self.kernel not in KERNELS:
            valid = ", ".join(repr(s) for s in KERNELS)
            raise ValueError(
                f"unknown kernel {self.kernel!r}; use one of {valid} or a callable "
                "kernel(A, B) returning the (len(A), len(B)) kernel matrix"
            )
        g = self.gamma
        if not (isinstance(g, str) and g == "scale") and not (_is_real(g) and g > 0):
            raise ValueError(f"gamma must be 'scale' or a number > 0; got {g!r}")
        if not _is_int(self.degree) or self.degree < 1:
            raise ValueError(f"degree must be a positive integer; got {self.degree!r}")
        if not _is_real(self.coef0):
            raise ValueError(f"coef0 must be a number; got {self.coef0!r}")
        m = self.n_landmarks
        valid = m is None or (isinstance(m, str) and m == "auto") or (_is_int(m) and m > 0)
        if not valid:
            raise ValueError(
                f"n_landmarks must be None (exact), 'auto' or a positive integer; got {m!r}"
            )
        if self.landmarks != "uniform":
            raise ValueError(f"landmarks must be 'uniform'; got {self.landmarks!r}")
        if self.constraint not in CONSTRAINTS:
            raise ValueError(f"constraint must be one of {CONSTRAINTS}; got {self.constraint!r}")
        t = self.tradeoff
        if not _is_real(t) or not 0.0 <= t <= 1.0:
            raise ValueError(f"tradeoff must be a number in [0, 1]; got {t!r}")
        if self.max_memory is not None and not (_is_real(self.max_memory) and self.max_memory > 0):
            raise ValueError(
                f"max_memory must be None or a positive number of bytes; got {self.max_memory!r}"
            )
        if not _is_int(self.split_every) or self.split_every < 2:
            raise ValueError(f"split_every must be an integer >= 2; got {self.split_every!r}")

    def _memory_budget(self) -> float:
        if self.max_memory is not None:
            return float(self.max_memory)
        import psutil

        return 0.5 * psutil.virtual_memory().available

    def _choose_method(self, n: int, d: int) -> int | None:
        """Landmark count m for Nyström, or None for the exact method (checked to fit)."""
        m = self.n_landmarks
        if m == "auto":
            fits = exact_fit_bytes(n, d) <= self._memory_budget()
            return None if n <= AUTO_EXACT_MAX_ROWS and fits else min(n, AUTO_LANDMARKS)
        if m is None:
            need, budget = exact_fit_bytes(n, d), self._memory_budget()
            if need > budget:
                raise ValueError(
                    f"the exact method needs about {need / 2**30:.1f} GiB ({need} bytes: "
                    f"{EXACT_MATRICES} kernel-sized {n} x {n} float64 matrices) for the {n} "
                    f"fitted rows, more than max_memory = {budget:.0f} bytes; use the Nyström "
                    f"approximation, e.g. n_landmarks={min(n, AUTO_LANDMARKS)} (or "
                    "n_landmarks='auto'), or raise max_memory"
                )
            return None
        if m > n:
            raise ValueError(
                f"n_landmarks={m} exceeds the {n} fitted rows; pass n_landmarks <= {n}, or "
                "n_landmarks=None for the exact method"
            )
        if m < self.n_components:
            raise ValueError(
                f"n_landmarks={m} is smaller than n_components={self.n_components}; a "
                f"k-dimensional representation needs at least k landmarks"
            )
        return m

    def _check_k(self, size: int, what: str, ms: list[int], fix: str) -> None:
        """Raise if n_components exceeds ``size - sum(m_r) + p`` (``what`` names size)."""
        limit = size - sum(ms) + len(ms)
        k = self.n_components
        if k > limit:
            desc = " and ".join(f"{m} groups" for m in ms)
            raise ValueError(
                f"n_components={k} is too large: with {desc} and {what} the largest k is "
                f"{size} - {sum(ms)} + {len(ms)} = {limit}; {fix}"
            )

    def _kernel_function(self, gamma):
        """A picklable ``f(A, B)`` returning the kernel matrix of two row blocks."""
        if callable(self.kernel):
            return functools.partial(_callable_kernel, self.kernel)
        return functools.partial(_named_kernel, self.kernel, gamma, self.degree, float(self.coef0))

    def _resolve_gamma(self, variance, d: int):
        """gamma_: the given number, or "scale" ``1 / (d * variance)`` (1 if the variance is
        0); None when the kernel takes no gamma."""
        if not self._needs_gamma():
            return None
        if self.gamma != "scale":
            return float(self.gamma)
        return 1.0 / (d * variance) if variance > 0 else 1.0

    def _kernel_is_psd(self) -> bool:
        """Whether the kernel is positive semi-definite for all data and parameters."""
        if callable(self.kernel):
            return False
        return self.kernel in ("rbf", "linear") or (self.kernel == "poly" and self.coef0 >= 0)

    def _needs_gamma(self) -> bool:
        return not callable(self.kernel) and self.kernel != "linear"

    def _needs_variance(self) -> bool:
        return self._needs_gamma() and isinstance(self.gamma, str)

    # ------------------------------------------------------------------ fitting
    def fit(self, X, y=None, *, sensitive_features=None):
        """Fit on X (numpy, Dask or Zarr; (n, d) or images (n, h, w)) and protected attributes.

        Parameters
        ----------
        X : (n, d) or (n, h, w) array, Dask array, Zarr array or path to a Zarr array
        y : (n,) binary task label, used only by ``constraint="equal_opportunity"``
        sensitive_features : (n,) labels, (n, p) array, list of p label vectors, or a
            DataFrame; required, keyword only (never taken from y)

        Returns
        -------
        self
        """
        self._check_params()
        Xa = as_data(X)
        require_sensitive_features(self, sensitive_features)
        Xa, groups, y = with_known_rows(Xa, sensitive_features, y)
        n, d = Xa.shape
        mask = binary_target(y, n) if self.constraint == "equal_opportunity" else None
        g = encode_groups(groups, n, mask=mask)
        fit_rows = np.arange(n) if mask is None else np.flatnonzero(mask)
        ms = [len(c) for c in g.categories]
        m = self._choose_method(len(fit_rows), d)
        if m is None:
            self._check_k(len(fit_rows), f"n = {len(fit_rows)} fitted rows", ms,
                          "pass a smaller n_components")
            self._fit_exact(Xa, fit_rows, g)
        else:
            self._check_k(m, f"n_landmarks = {m}", ms,
                          "pass a smaller n_components or more landmarks")
            self._fit_nystroem(Xa, fit_rows, mask, g, m)
        self.n_features_in_ = d
        self.n_samples_seen_ = len(fit_rows)
        self.n_components_ = self.n_components
        self.groups_ = list(g.categories)
        self.attribute_names_ = list(g.names)
        return self

    def fit_transform(self, X, y=None, *, sensitive_features=None):
        """``fit(X, y, sensitive_features=...).transform(X)``."""
        return self.fit(X, y, sensitive_features=sensitive_features).transform(X)

    def _fit_exact(self, Xa, fit_rows, g):
        """Alg. 3 on the centred kernel of the fitted rows, via the downdate ``Kc - D D^T``."""
        import dask

        rows = None if len(fit_rows) == Xa.shape[0] else fit_rows
        Xf = _take_rows(Xa, rows)
        var = _flat_variance(Xf) if self._needs_variance() else None
        Xf, var = dask.compute(Xf, var)
        _check_finite(Xf, fit_rows)
        n, k = Xf.shape[0], self.n_components
        self.gamma_ = self._resolve_gamma(var, Xf.shape[1])
        kern = self._kernel_function(self.gamma_)
        rng = np.random.default_rng(self.random_state)

        K = _kernel_matrix(Xf, kern)
        col_mean = _centre_in_place(K) if self.center else np.zeros(n)
        positive = None if self._kernel_is_psd() else _clip_to_psd_in_place(K)
        total = float(np.trace(K))
        standard = _top_eigenpairs(K, k, rng, overwrite=False) if self.tradeoff > 0 else None
        Z = _centred_onehot(g.codes[fit_rows], g.categories)
        ZT, D, C, G = _constraint_directions(K, Z)
        columns = _zero_groups(C, G, Z, K, g.categories, g.names)
        _downdate_in_place(K, D)
        s, E = _top_eigenpairs(K, k, rng, overwrite=True)
        del K
        tol = n * np.finfo(np.float64).eps * max(total, 0.0)
        coef = _dual_coefficients(E, s, ZT, D, tol)
        if standard is not None:
            s0, E0 = standard
            coef = np.hstack([coef, self.tradeoff * _dual_coefficients(E0, s0, None, None, tol)])
        if positive is not None:  # coefficients in the clipped kernel's range: Kc B = Kc_+ B
            coef = positive @ (positive.T @ coef)
        if self.center:
            # Kc 1 = 0, so this keeps Kc B and makes kernel(x, X) B - col_mean B the centred
            # cross-kernel expansion (the row-mean term of the centring multiplies 1^T B = 0)
            coef -= coef.mean(axis=0)

        per_group = _exact_violations(coef[:, :k], columns)
        certify(per_group, g.names, g.categories, np.finfo(np.float64).eps, type(self).__name__)
        self._set_certificate(per_group)
        self.method_ = "exact"
        self.n_landmarks_ = n
        self.basis_ = Xf
        self.basis_indices_ = fit_rows
        self.dual_coef_ = coef
        self.offset_ = col_mean @ coef
        self.explained_variance_ = np.maximum(s, 0.0) / (n - 1)
        self.explained_variance_ratio_ = np.maximum(s, 0.0) / total
        self.n_constraints_ = D.shape[1]
        self.max_components_ = n - sum(len(c) for c in g.categories) + len(g.categories)

    def _fit_nystroem(self, Xa, fit_rows, mask, g, m):
        """Linear fair PCA on Nyström features, from one chunked pass of additive statistics."""
        import dask
        import dask.array as da

        rng = np.random.default_rng(self.random_state)
        idx = np.sort(rng.choice(fit_rows, size=m, replace=False))
        var_rows = None if mask is None else fit_rows
        var = _flat_variance(_take_rows(Xa, var_rows)) if self._needs_variance() else None
        L, var = dask.compute(_take_rows(Xa, idx), var)
        _check_finite(L, idx)
        self.gamma_ = self._resolve_gamma(var, Xa.shape[1])
        kern = self._kernel_function(self.gamma_)

        W = _inverse_sqrt(kern(L, L))
        ms = [len(c) for c in g.categories]
        if W.shape[1] < m:
            self._check_k(W.shape[1], f"the landmark kernel matrix of rank {W.shape[1]} < "
                          f"{m} (duplicate landmarks or a low-rank kernel)", ms,
                          "pass a smaller n_components")
        if not isinstance(Xa, da.Array):
            Xa = da.from_array(Xa, chunks=(_rows_per_block(max(Xa.shape[1], W.shape[1])), -1))
        phi = _expand_lazily(Xa, L, W, np.zeros(W.shape[1]), kern)
        stats = compute_moments(phi, g.codes, g.categories, mask=mask, dtype=np.float64,
                                split_every=self.split_every)
        stats.check_finite()
        fair = FairPCA(self.n_components, center=self.center, constraint=self.constraint,
                       tradeoff=self.tradeoff, split_every=self.split_every)
        fair.attribute_names_ = list(g.names)
        fair.fit_statistics(stats)

        P = fair.components_.T
        if self.tradeoff > 0:
            P = np.hstack([P, self.tradeoff * fair.standard_components_.T])
        self.method_ = "nystroem"
        self.n_landmarks_ = m
        self.basis_ = L
        self.basis_indices_ = idx
        self.dual_coef_ = W @ P
        self.offset_ = fair.mean_ @ P
        self.explained_variance_ = fair.explained_variance_
        self.explained_variance_ratio_ = fair.explained_variance_ratio_
        self.n_constraints_ = fair.n_constraints_
        self.max_components_ = fair.max_components_
        self.fairness_violation_ = fair.fairness_violation_
        self.fairness_violation_per_attribute_ = fair.fairness_violation_per_attribute_

    def _set_certificate(self, per_group) -> None:
        self.fairness_violation_per_attribute_ = np.array([float(v.max(initial=0.0)) for v in per_group])
        self.fairness_violation_ = float(self.fairness_violation_per_attribute_.max())

    # ------------------------------------------------------------------ persistence
    _array_attrs = ("basis_", "basis_indices_", "dual_coef_", "offset_", "explained_variance_",
                    "explained_variance_ratio_")
    _meta_attrs = ("gamma_", "method_", "n_landmarks_", "n_features_in_", "n_samples_seen_",
                   "n_components_", "n_constraints_", "max_components_", "attribute_names_")

    def save(self, path, *, overwrite: bool = False):
        """Save the fitted model to directory ``path`` (.npz + JSON, written atomically).

        Loaded back by :func:`dfairpca.load`.  Never pickles, so a callable ``kernel``
        cannot be saved (refit after loading, or use a named kernel).  ``overwrite=True``
        replaces a model saved by dfairpca at ``path`` and nothing else.
        """
        from pathlib import Path

        from .io import atomic_directory, save_arrays
        from .moments import _categories_to_json

        self._check_fitted()
        if callable(self.kernel):
            raise ValueError(
                "a FairKernelPCA with a callable kernel cannot be saved: the format holds "
                "arrays and JSON only, never pickled code; use a named kernel to save"
            )
        arrays = {a: np.asarray(getattr(self, a)) for a in self._array_attrs}
        meta = {
            "kind": "estimator",
            "class": type(self).__name__,
            "params": self.get_params(),
            **{a: getattr(self, a) for a in self._meta_attrs},
            "groups_": [_categories_to_json(c) for c in self.groups_],
            "fairness_violation_": float(self.fairness_violation_),
            "fairness_violation_per_attribute_": [float(v) for v in self.fairness_violation_per_attribute_],
        }
        with atomic_directory(path, "model", overwrite=overwrite) as tmp:
            save_arrays(tmp / "model", arrays, meta)
        return Path(path)

    @classmethod
    def _from_saved(cls, arrays: dict, meta: dict) -> "FairKernelPCA":
        """The model from what :func:`dfairpca.io.load_arrays` read with :meth:`_saved_layout`;
        ValueError saying what is inconsistent."""
        from .moments import _categories_from_json

        est = cls(**meta["params"])
        for a in cls._array_attrs:
            setattr(est, a, arrays[a])
        for a in cls._meta_attrs:
            setattr(est, a, meta[a])
        est.groups_ = [_categories_from_json(c) for c in meta["groups_"]]
        if "fairness_violation_" in meta:  # models saved before the certificate lack it
            est.fairness_violation_ = float(meta["fairness_violation_"])
            est.fairness_violation_per_attribute_ = np.array(meta["fairness_violation_per_attribute_"], float)
        idx = est.basis_indices_
        if idx.size and (idx.min() < 0 or idx.max() >= est.n_samples_seen_):
            raise ValueError(f"arrays.npz: 'basis_indices_' points outside the "
                             f"{est.n_samples_seen_} fitted rows")
        return est

    @classmethod
    def _saved_layout(cls, meta: dict, headers: dict) -> dict:
        """Check a saved FairKernelPCA's meta.json (kernel from :data:`KERNELS` only); the
        shape and kind of each array it implies."""
        from .decomposition import saved_certificate, saved_groups, saved_params
        from .io import meta_value

        kernel = meta_value(meta, "params", "dict").get("kernel", "rbf")
        if kernel not in KERNELS:  # a saved kernel is a name, never code
            raise ValueError(f"meta.json: kernel {kernel!r:.40} is not one of {list(KERNELS)}")
        params = saved_params(cls, meta)
        gamma = meta_value(meta, "gamma_", "number", optional=True)
        if (gamma is None) != (kernel == "linear") or (gamma is not None and gamma <= 0):
            raise ValueError(f"meta.json: 'gamma_' {gamma!r} does not suit the {kernel} kernel")
        meta_value(meta, "method_", ("exact", "nystroem"))
        d = meta_value(meta, "n_features_in_", "positive")
        k = meta_value(meta, "n_components_", "positive")
        b = meta_value(meta, "n_landmarks_", "positive")
        n = meta_value(meta, "n_samples_seen_", "positive")
        meta_value(meta, "n_constraints_", "count")
        meta_value(meta, "max_components_", "int")
        saved_certificate(meta, len(saved_groups(meta)))
        if b > n:
            raise ValueError(f"meta.json: 'n_landmarks_' {b} exceeds 'n_samples_seen_' {n}")
        out = 2 * k if params.get("tradeoff", 0) > 0 else k
        return {"basis_": ((b, d), "f"), "basis_indices_": ((b,), "iu"),
                "dual_coef_": ((b, out), "f"), "offset_": ((out,), "f"),
                "explained_variance_": ((k,), "f"), "explained_variance_ratio_": ((k,), "f")}

    # ------------------------------------------------------------------ transforming
    def _check_fitted(self):
        if not hasattr(self, "dual_coef_"):
            raise NotFittedError(
                f"this {type(self).__name__} is not fitted yet; call fit(X, groups) before using it"
            )

    @property
    def _n_features_out(self):
        return self.dual_coef_.shape[1]

    def transform(self, X):
        """Represent X: ``kernel(X, basis_) @ dual_coef_ - offset_`` (the centred kernel expansion).

        numpy in, numpy out; Dask (or Zarr) in, lazy Dask out with X's row chunks.  float64.
        """
        self._check_fitted()
        import dask.array as da

        Xa = as_data(X)
        d = Xa.shape[1]
        check_n_features(self, d)
        kern = self._kernel_function(self.gamma_)
        if isinstance(Xa, da.Array):
            return _expand_lazily(Xa, self.basis_, self.dual_coef_, self.offset_, kern)
        return _expand(Xa, self.basis_, self.dual_coef_, self.offset_, kern)


# ---------------------------------------------------------------------------- kernels
def _named_kernel(name, gamma, degree, coef0, A, B):
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
    return pairwise.linear_kernel(A, B)


def _callable_kernel(fn, A, B):
    A = np.asarray(A, dtype=np.float64)
    B = np.asarray(B, dtype=np.float64)
    K = np.asarray(fn(A, B), dtype=np.float64)
    if K.shape != (A.shape[0], B.shape[0]):
        raise ValueError(
            f"the kernel callable returned shape {K.shape} for blocks of {A.shape[0]} and "
            f"{B.shape[0]} rows; it must return the ({A.shape[0]}, {B.shape[0]}) kernel matrix"
        )
    return K


def _rows_per_block(width: int) -> int:
    """Rows whose float64 values over ``width`` columns take about :data:`BLOCK_BYTES`."""
    return max(1, BLOCK_BYTES // (8 * max(1, width)))


def _expand(x, basis, coef, offset, kern, block_info=None):
    """``kern(x, basis) @ coef - offset`` row block by row block (bounded temporaries).

    Rows of x holding NaN or infinity raise, named (global rows inside ``map_blocks``):
    a kernel may map them to finite values (sklearn's refuse them without the rows, a
    callable may not look), and the test costs O(d) per row against the kernel's O(m d).
    """
    x = np.asarray(x)
    check_finite_input(x, *row_origin(block_info))
    basis = np.asarray(basis, dtype=np.float64)  # cast once, not per block
    out = np.empty((x.shape[0], coef.shape[1]))
    step = _rows_per_block(max(basis.shape[0], x.shape[1]))
    for s in range(0, x.shape[0], step):
        out[s : s + step] = kern(x[s : s + step], basis) @ coef - offset
    return out


def _expand_lazily(X, basis, coef, offset, kern):
    """:func:`_expand` per row chunk of the Dask array X (basis and coef shipped once)."""
    from dask import delayed

    return X.map_blocks(
        _expand, delayed(basis), delayed(coef), offset, kern, dtype=np.float64,
        chunks=(X.chunks[0], (coef.shape[1],)), meta=np.empty((0, 0)),
    )


def _kernel_matrix(X: np.ndarray, kern) -> np.ndarray:
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
def _centre_in_place(K: np.ndarray) -> np.ndarray:
    """``K <- H K H`` for symmetric K; returns the column means of the uncentred K."""
    col_mean = K.mean(axis=0)
    K -= col_mean[None, :]
    K -= (col_mean - col_mean.mean())[:, None]
    return col_mean


def _centred_onehot(codes: np.ndarray, categories) -> np.ndarray:
    """Z_comb of Sec. 3.5 without each attribute's last column, (n, sum(m_r) - p).

    The centred one-hot columns of an attribute sum to zero, so its last column is minus the
    sum of the others: leaving it out keeps the nullspace of ``Z^T Kc`` and makes the
    structural rank deficiency disappear instead of leaving it to rounding.
    """
    cols = []
    for j, cats in enumerate(categories):
        onehot = (codes[:, j][:, None] == np.arange(len(cats) - 1)[None, :]).astype(np.float64)
        cols.append(onehot - onehot.mean(axis=0))
    return np.hstack(cols)


def _constraint_directions(Kc: np.ndarray, Z: np.ndarray):
    """(Z T, D = Kc Z T, C = Kc Z, G = Z^T Kc Z): T makes the feature-space constraint
    directions ``Phi Z T`` orthonormal.

    G is their Gram matrix.  Its columns are scaled to a unit diagonal first (every group's
    direction then counts alike, however the groups' deviations differ in size), columns
    of groups without signal (:func:`_zero_groups`) are left out, and eigenvalues at or
    below ``10 max(n, q) eps`` times the largest are rounding noise of the Gram product
    (dependent constraints, e.g. two attributes that split the rows alike) and are dropped.
    """
    C = Kc @ Z
    G = Z.T @ C
    G = (G + G.T) / 2
    live = np.flatnonzero(np.diagonal(G) > _noise_level(Kc) * np.einsum("ij,ij->j", Z, Z))
    if live.size == 0:
        return Z[:, :0], C[:, :0], C, G
    N = 1.0 / np.sqrt(np.diagonal(G)[live])
    w, V = scipy.linalg.eigh(G[np.ix_(live, live)] * np.outer(N, N))
    rtol = 10 * max(Z.shape) * np.finfo(np.float64).eps
    keep = w > rtol * max(w.max(), 0.0)
    T = N[:, None] * V[:, keep] / np.sqrt(w[keep])
    return Z[:, live] @ T, C[:, live] @ T, C, G


def _noise_level(Kc: np.ndarray) -> float:
    """``z^T Kc z`` below ``level * |z|^2`` is rounding noise of the kernel's entries
    (``level = 10 n eps max|Kc|``): a group whose centred indicator z gives less has the
    overall mean in the kernel's feature space, to the kernel's precision."""
    n = Kc.shape[0]
    return 10 * n * np.finfo(np.float64).eps * (float(np.abs(np.diagonal(Kc)).max()) if n else 0.0)


def _zero_groups(C, G, Z, Kc, categories, names):
    """Per attribute: ``(Kc z_g, z_g^T Kc z_g)`` for all m groups (the last group's
    centred indicator is minus the sum of the other m - 1 columns of Z), with the groups
    without signal (:func:`_noise_level`) set to zero and a warning naming them."""
    level = _noise_level(Kc)
    columns, start = [], 0
    for cats, name in zip(categories, names):
        cols = np.arange(start, start + len(cats) - 1)
        start += len(cats) - 1
        Zb = Z[:, cols]
        KZ = np.hstack([C[:, cols], -C[:, cols].sum(axis=1, keepdims=True)])
        Gb = G[np.ix_(cols, cols)]
        sq = np.append(np.diagonal(Gb), Gb.sum())
        zsq = np.append(np.einsum("ij,ij->j", Zb, Zb), np.square(Zb.sum(axis=1)).sum())
        zero = sq <= level * zsq
        if zero.any():
            labels = ", ".join(str(c) for c in np.asarray(cats)[zero])
            warnings.warn(
                f"group(s) {labels} of {name}: the mean in the kernel's feature space equals "
                "the overall mean to rounding, so they impose no constraint and none is kept",
                UserWarning, stacklevel=4,
            )
            KZ[:, zero], sq[zero] = 0.0, 0.0
        columns.append((KZ, sq))
    return columns


def _exact_violations(coef: np.ndarray, columns) -> list:
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


def _clip_to_psd_in_place(K: np.ndarray) -> np.ndarray:
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


def _downdate_in_place(K: np.ndarray, D: np.ndarray) -> None:
    """``K <- K - D D^T`` panel by panel (no n x n temporary)."""
    step = _rows_per_block(K.shape[0])
    for s in range(0, K.shape[0], step):
        K[s : s + step] -= D[s : s + step] @ D.T


def _top_eigenpairs(M: np.ndarray, k: int, rng, overwrite: bool):
    """Largest k eigenpairs (descending) of the symmetric n x n matrix M.

    Lanczos (ARPACK ``eigsh``, converged to machine precision) when n > 1000 and k < n / 10:
    O(n^2) per iteration instead of dense ``eigh``'s O(n^3) tridiagonalisation; dense ``eigh``
    otherwise, or if ARPACK does not converge.  ``overwrite`` lets ``eigh`` destroy M.
    """
    n = M.shape[0]
    if n > LANCZOS_MIN_ROWS and 10 * k < n:
        try:
            w, V = scipy.sparse.linalg.eigsh(M, k, which="LA", tol=0.0, v0=rng.uniform(-1, 1, n))
            order = np.argsort(w)[::-1]
            return w[order], V[:, order]
        except scipy.sparse.linalg.ArpackNoConvergence:
            pass
    # M is symmetric, so its transpose is the Fortran-ordered array LAPACK wants (no copy)
    w, V = scipy.linalg.eigh(M.T, subset_by_index=[n - k, n - 1], overwrite_a=overwrite,
                             driver="evr")
    return w[::-1], V[:, ::-1]


def _dual_coefficients(E, s, ZT, D, tol):
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


# ---------------------------------------------------------------------------- Nyström
def _inverse_sqrt(K_LL: np.ndarray) -> np.ndarray:
    """W (m, r) with ``W^T K_LL W = I_r``: ``V_+ Lambda_+^(-1/2)`` over the eigenvalues above
    ``m * eps * max`` (r = numerical rank)."""
    w, V = scipy.linalg.eigh((K_LL + K_LL.T) / 2)
    cut = K_LL.shape[0] * np.finfo(np.float64).eps * max(w.max(), 0.0)
    keep = w > cut
    if not keep.any():
        raise ValueError("the landmark kernel matrix is zero; check the kernel and gamma")
    return V[:, keep] / np.sqrt(w[keep])


# ---------------------------------------------------------------------------- data access
def _take_rows(X, rows):
    """X[rows] (all rows if None), lazily: a Dask array (numpy input is wrapped)."""
    import dask.array as da

    if not isinstance(X, da.Array):
        X = da.from_array(X, chunks=(_rows_per_block(X.shape[1]), -1))
    return X if rows is None else X[rows]


def _flat_variance(X):
    """Lazy variance of all entries of the Dask array X, in float64.

    Per chunk, the moments of float64 row blocks of about :data:`BLOCK_BYTES` (a chunk is
    never copied to float64 whole: ``X.astype(float64).var()`` held two such copies per
    thread, 1 GB for a 10,240-row chunk of 80 x 80 faces), merged by the pairwise update.
    """
    from dask import delayed

    parts = [delayed(_entry_moments, pure=True)(b) for b in X.to_delayed().ravel()]
    return delayed(_variance_of, pure=True)(parts)


def _entry_moments(x) -> tuple[int, float, float]:
    """(count, mean, sum of squared deviations) of all entries of x."""
    x = np.asarray(x)
    x = x.reshape(x.shape[0], -1) if x.ndim else x.reshape(1, 1)
    acc = (0, 0.0, 0.0)
    for s in range(0, x.shape[0], _rows_per_block(x.shape[1])):
        b = x[s : s + _rows_per_block(x.shape[1])].astype(np.float64)
        if b.size:
            mean = float(b.mean())
            m2 = float(np.square(b - mean).sum())
            # (NaN or infinity in X is refused, named, where the rows are read)
            if (not np.isfinite(m2) and np.isfinite(b).all()) or (
                    m2 < np.finfo(np.float64).tiny and np.ptp(b) > 0):
                raise ValueError(
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


def _check_finite(rows: np.ndarray, index: np.ndarray) -> None:
    bad = ~np.isfinite(rows).all(axis=1) if rows.dtype.kind == "f" else np.zeros(len(rows), bool)
    if bad.any():
        shown = ", ".join(str(int(i)) for i in index[bad][:10])
        raise ValueError(
            f"X contains NaN or infinity in {int(bad.sum())} fitted row(s) (rows {shown}); drop "
            "or impute them before fitting"
        )


def _is_int(v) -> bool:
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def _is_real(v) -> bool:
    return isinstance(v, numbers.Real) and not isinstance(v, bool)
