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

from . import _solvers, _system
from ._engine import compute_moments
from ._groups import binary_target, encode_groups, group_labels
from ._validation import (
    Input, check_finite_input, check_input,
    row_origin, with_known_rows,
)
from .decomposition import CONSTRAINTS, FairPCA, certify, fair_feature_names

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
#: bytes of kernel values computed at once when expanding rows against the basis (half a
#: pass block: an RBF block also holds its squared distances while it is exponentiated)
BLOCK_BYTES = _system.BLOCK_BYTES // 2
#: what a failed certificate suggests (FairKernelPCA has no standardize or compute_dtype):
#: a gamma that brings the kernel's entries away from 0 and 1 separates the groups' directions
KERNEL_CERTIFY_FIX = "another kernel or gamma"
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
    n_components : int or None, default None
        k, the dimension of the representation.  At most ``n - sum(m_r) + p - q`` (exact)
        or ``m - sum(m_r) + p - q`` (Nyström) for p attributes with m_1, ..., m_p groups
        and q numeric attributes.  None keeps every fair component of non-zero variance
        among those (as scikit-learn's KernelPCA keeps all non-zero components): an
        eigendecomposition of the whole n x n kernel for the exact method.
    sensitive_feature_ids : list of column names or int, default None
        The protected attributes as columns of X, as in :class:`dfairpca.FairPCA` (and
        fairlearn's CorrelationRemover): left out of the kernel in ``fit`` and
        ``transform`` (which takes the same full-width X); a column of text or categories
        is group labels, a numeric column a number the representation is made
        uncorrelated with (for a 0/1 column: equal group means).  Not together with
        ``sensitive_features=``.
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
    kernel_shift_ : ndarray (d,) or None
        For the centred "linear" kernel, the mean of the fitted rows (exact) or landmarks
        (Nyström): the kernel used is ``<x - kernel_shift_, y - kernel_shift_>``, whose
        centred matrix is the same but free of the cancellation far from the origin.
    n_components_ : int
    sensitive_feature_indices_ : ndarray of int
        Positions in X of the columns named by ``sensitive_feature_ids`` (empty without).
    numeric_sensitive_columns_ : ndarray of int
        Positions of the numeric ones among X's numeric columns.
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
        Labels seen, per attribute given as labels.
    attribute_names_ : list of str
        The attributes given as labels, then the numeric ones.
    n_features_in_, n_samples_seen_ : int
        X's columns (the sensitive ones included), and rows fitted on (the ``y == 1`` rows
        for equal opportunity).
    feature_names_in_ : ndarray of str
        X's column names when X was a DataFrame with text column names.

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

    def __init__(self, n_components=None, *, sensitive_feature_ids=None, kernel="rbf",
                 gamma="scale", degree=3, coef0=1.0, n_landmarks=None, landmarks="uniform",
                 constraint="demographic_parity", tradeoff=0.0, center=True, random_state=0,
                 max_memory=None, split_every=8):
        self.n_components = n_components
        self.sensitive_feature_ids = sensitive_feature_ids
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

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.allow_nan = False  # NaN rows are refused, named
        tags.input_tags.sparse = False
        return tags

    # ------------------------------------------------------------------ parameters
    def _check_params(self):
        k = self.n_components
        if k is not None and (not _is_int(k) or k <= 0):
            raise ValueError(f"n_components must be a positive integer or None; got {k!r}")
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
        if self.n_components is not None and m < self.n_components:
            raise ValueError(
                f"n_landmarks={m} is smaller than n_components={self.n_components}; a "
                f"k-dimensional representation needs at least k landmarks"
            )
        return m

    def _check_k(self, size: int, what: str, ms: list[int], fix: str, q: int = 0) -> int:
        """The largest k, ``size - sum(m_r) + p - q`` (``what`` names size); raise if
        n_components exceeds it."""
        limit = size - sum(ms) + len(ms) - q
        k = limit if self.n_components is None else self.n_components
        if k > limit or limit < 1:
            desc = " and ".join([f"{m} groups" for m in ms] + ([f"{q} numeric attribute(s)"] if q else []))
            minus = f" - {q}" if q else ""
            head = (f"n_components={k} is too large" if limit >= 1 else
                    "no fair representation exists")
            raise ValueError(
                f"{head}: with {desc} and {what} the largest k is "
                f"{size} - {sum(ms)} + {len(ms)}{minus} = {limit}; {fix}"
            )
        return limit

    def _kernel_function(self, gamma, shift=None):
        """A picklable ``f(A, B)`` returning the kernel matrix of two row blocks (for
        "linear", of the rows minus ``shift``)."""
        if callable(self.kernel):
            return functools.partial(_callable_kernel, self.kernel)
        return functools.partial(_named_kernel, self.kernel, gamma, self.degree, float(self.coef0),
                                 shift)

    def _kernel_shift(self, rows: np.ndarray):
        """kernel_shift_: the mean of ``rows`` for the centred linear kernel, else None.

        Centred, the linear kernel is shift-invariant, but ``<x, y>`` of rows far from the
        origin loses the data to cancellation (X + 3e6 with unit spread: the certificate
        failed at 4e-6, Nyström's landmark kernel had rank 2 of 6); ``<x - c, y - c>``
        has the same centred kernel and keeps it."""
        if self.kernel != "linear" or not self.center or not rows.shape[0]:
            return None
        return rows.mean(axis=0, dtype=np.float64)

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
        """Fit on X (numpy, pandas, xarray, Dask or Zarr; (n, d) or images (n, h, w)) and
        protected attributes.

        Parameters
        ----------
        X : (n, d) or (n, h, w) array, DataFrame, DataArray, Dask array, Zarr array or path
            to a Zarr array
        y : (n,) binary task label, used only by ``constraint="equal_opportunity"``
        sensitive_features : (n,) labels, (n, p) array, list of p label vectors, or a
            DataFrame; required unless ``sensitive_feature_ids`` names columns of X,
            keyword only (never taken from y)

        Returns
        -------
        self
        """
        self._check_params()
        inp = check_input(self, X, reset=True, min_samples=2, ids=self.sensitive_feature_ids)
        labels = group_labels(self, inp, sensitive_features)
        Xa, labels, y = with_known_rows(inp.data, labels, y)
        n = Xa.shape[0]
        mask = binary_target(y, n) if self.constraint == "equal_opportunity" else None
        g = None if labels is None else encode_groups(labels, n, mask=mask)
        fit_rows = np.arange(n) if mask is None else np.flatnonzero(mask)
        ms = [] if g is None else [len(c) for c in g.categories]
        q = len(inp.numeric)
        names = ([] if g is None else list(g.names)) + inp.numeric_names
        m = self._choose_method(len(fit_rows), len(inp.features))
        if m is None:
            limit = self._check_k(len(fit_rows), f"n = {len(fit_rows)} fitted rows", ms,
                                  "pass a smaller n_components", q)
            self._fit_exact(Xa, fit_rows, g, inp, names, limit)
        else:
            self._check_k(m, f"n_landmarks = {m}", ms,
                          "pass a smaller n_components or more landmarks", q)
            self._fit_nystroem(Xa, fit_rows, mask, g, m, inp, names)
        self.n_features_in_ = inp.width
        self.sensitive_feature_indices_ = inp.sensitive
        self.numeric_sensitive_columns_ = inp.numeric
        self.n_samples_seen_ = len(fit_rows)
        self.groups_ = [] if g is None else list(g.categories)
        self.attribute_names_ = names
        return self

    def fit_transform(self, X, y=None, *, sensitive_features=None):
        """``fit(X, y, sensitive_features=...).transform(X)``."""
        return self.fit(X, y, sensitive_features=sensitive_features).transform(X)

    def _fit_exact(self, Xa, fit_rows, g, inp: Input, names, limit: int):
        """Alg. 3 on the centred kernel of the fitted rows, via the downdate ``Kc - D D^T``."""
        import dask

        rows = None if len(fit_rows) == Xa.shape[0] else fit_rows
        Xr = _take_rows(Xa, rows)
        var = _flat_variance(Xr[:, inp.features]) if self._needs_variance() else None
        Xr, var = dask.compute(Xr, var)
        _check_finite(Xr, fit_rows)
        Xf = Xr[:, inp.features] if len(inp.numeric) else Xr
        Zn = _numeric_attributes(Xr[:, inp.numeric], inp.numeric_names)
        n = Xf.shape[0]
        k = limit if self.n_components is None else self.n_components
        self.gamma_ = self._resolve_gamma(var, Xf.shape[1])
        self.kernel_shift_ = self._kernel_shift(Xf)
        kern = self._kernel_function(self.gamma_, self.kernel_shift_)
        rng = np.random.default_rng(self.random_state)

        K = _kernel_matrix(Xf, kern)
        self._check_not_identity(K)
        col_mean = _centre_in_place(K) if self.center else np.zeros(n)
        positive = None if self._kernel_is_psd() else _clip_to_psd_in_place(K)
        total = float(np.trace(K))
        standard = _top_eigenpairs(K, k, rng, overwrite=False) if self.tradeoff > 0 else None
        parts = [] if g is None else [_centred_onehot(g.codes[fit_rows], g.categories)]
        Z = np.hstack(parts + [Zn])
        categories = ([] if g is None else list(g.categories)) + [None] * Zn.shape[1]
        ZT, D, C, G = _constraint_directions(K, Z)
        columns = _zero_groups(C, G, Z, K, categories, names)
        _downdate_in_place(K, D)
        s, E = _top_eigenpairs(K, k, rng, overwrite=True)
        del K
        tol = n * np.finfo(np.float64).eps * max(total, 0.0)
        k = self._live_components(np.where(s > tol, s, 0.0), k, total > 0)
        s, E = s[:k], E[:, :k]
        coef = _dual_coefficients(E, s, ZT, D, tol)
        if standard is not None:
            s0, E0 = standard
            coef = np.hstack([coef, self.tradeoff * _dual_coefficients(E0[:, :k], s0[:k], None, None, tol)])
        if positive is not None:  # coefficients in the clipped kernel's range: Kc B = Kc_+ B
            coef = positive @ (positive.T @ coef)
        if self.center:
            # Kc 1 = 0, so this keeps Kc B and makes kernel(x, X) B - col_mean B the centred
            # cross-kernel expansion (the row-mean term of the centring multiplies 1^T B = 0)
            coef -= coef.mean(axis=0)

        per_group = _exact_violations(coef[:, :k], columns)
        certify(per_group, names, categories, np.finfo(np.float64).eps, type(self).__name__,
                fix=KERNEL_CERTIFY_FIX)
        self._set_certificate(per_group)
        self.method_ = "exact"
        self.n_landmarks_ = n
        self.basis_ = Xf
        self.basis_indices_ = fit_rows
        self.dual_coef_ = coef
        self.offset_ = col_mean @ coef
        self.n_components_ = k
        self.explained_variance_ = np.maximum(s, 0.0) / (n - 1)
        self.explained_variance_ratio_ = np.maximum(s, 0.0) / total
        self.n_constraints_ = D.shape[1]
        self.max_components_ = limit

    def _fit_nystroem(self, Xa, fit_rows, mask, g, m, inp: Input, names):
        """Linear fair PCA on Nyström features, from one chunked pass of additive statistics."""
        import dask
        import dask.array as da

        rng = np.random.default_rng(self.random_state)
        idx = np.sort(rng.choice(fit_rows, size=m, replace=False))
        var_rows = None if mask is None else fit_rows
        var = _flat_variance(_take_rows(Xa, var_rows)[:, inp.features]) if self._needs_variance() else None
        L, var = dask.compute(_take_rows(Xa, idx), var)
        _check_finite(L, idx)
        L = L[:, inp.features]
        self.gamma_ = self._resolve_gamma(var, L.shape[1])
        self.kernel_shift_ = self._kernel_shift(L)
        kern = self._kernel_function(self.gamma_, self.kernel_shift_)

        K_LL = kern(L, L)
        self._check_not_identity(K_LL)
        W = _inverse_sqrt(K_LL)
        ms = [] if g is None else [len(c) for c in g.categories]
        q = len(inp.numeric)
        if W.shape[1] < m:
            self._check_k(W.shape[1], f"the landmark kernel matrix of rank {W.shape[1]} < "
                          f"{m} (duplicate landmarks or a low-rank kernel)", ms,
                          "pass a smaller n_components", q)
        if not isinstance(Xa, da.Array):
            Xa = da.from_array(Xa, chunks=(_rows_per_block(max(Xa.shape[1], W.shape[1])), -1))
        r = W.shape[1]
        # phi(x) of the features, then the numeric attributes as they are: their covariances
        # with phi are the constraint (FairPCA's numeric_sensitive_columns_)
        from dask import delayed

        phi = Xa.map_blocks(_phi_block, delayed(L), delayed(W), kern, inp.features,
                            inp.numeric, dtype=np.float64, chunks=(Xa.chunks[0], (r + q,)),
                            meta=np.empty((0, 0)))
        codes, cats = (None, ()) if g is None else (g.codes, g.categories)
        stats = compute_moments(phi, codes, cats, mask=mask, dtype=np.float64,
                                split_every=self.split_every)
        stats.check_finite()
        fair = FairPCA(self.n_components, center=self.center, constraint=self.constraint,
                       tradeoff=self.tradeoff, split_every=self.split_every)
        fair.attribute_names_ = list(names)
        fair.numeric_sensitive_columns_ = np.arange(r, r + q)
        fair.fit_statistics(stats)

        total = float(np.sum(fair.explained_variance_))
        tol = r * np.finfo(np.float64).eps * total
        k = self._live_components(fair.explained_variance_ * (fair.explained_variance_ > tol),
                                  fair.n_components_, total > 0)
        P = fair.components_[:k].T
        if self.tradeoff > 0:
            P = np.hstack([P, self.tradeoff * fair.standard_components_[:k].T])
        self.method_ = "nystroem"
        self.n_landmarks_ = m
        self.basis_ = L
        self.basis_indices_ = idx
        self.dual_coef_ = W @ P
        self.offset_ = fair.mean_ @ P
        self.n_components_ = k
        self.explained_variance_ = fair.explained_variance_[:k]
        self.explained_variance_ratio_ = fair.explained_variance_ratio_[:k]
        self.n_constraints_ = fair.n_constraints_
        self.max_components_ = fair.max_components_
        self.fairness_violation_ = fair.fairness_violation_
        self.fairness_violation_per_attribute_ = fair.fairness_violation_per_attribute_

    def _check_not_identity(self, K: np.ndarray) -> None:
        """Raise if the rbf kernel matrix K is the identity to rounding (off the diagonal at
        most ``10 n eps``): every direction then has the same variance, so no top k exist
        (LAPACK's subset eigensolvers return fewer than k pairs or fail on such a cluster),
        and ``transform`` maps every new point to 0."""
        if self.kernel != "rbf" or K.shape[0] < 2:
            return
        diag = np.diagonal(K).copy()
        np.fill_diagonal(K, 0.0)
        off = float(np.abs(K).max())
        np.fill_diagonal(K, diag)
        if off <= 10 * K.shape[0] * np.finfo(np.float64).eps:
            raise ValueError(
                f"the rbf kernel matrix is numerically the identity (largest entry off the "
                f"diagonal {off:.1e}): gamma={self.gamma_:.3g} makes distinct points orthogonal, "
                "so every direction has the same variance and no top components exist; pass a "
                "smaller gamma, e.g. gamma='scale'"
            )

    def _live_components(self, s: np.ndarray, k: int, nonzero: bool) -> int:
        """k, or for ``n_components=None`` the number of components with positive variance
        (``s``: the variances, already 0 at or below rounding; ``nonzero``: whether the
        fitted kernel has any variance); raise when fewer than k (or none) have it, which
        would make ``transform`` return fewer or all-zero columns."""
        live = int(np.count_nonzero(s > 0)) if nonzero else 0
        if self.n_components is None and live:
            return live
        if live >= k:
            return k
        cause = {
            "rbf": "gamma={:.3g} makes distant points nearly orthogonal",
            "sigmoid": "tanh(gamma <x, y> + coef0) with gamma={:.3g} saturates",
            "poly": "the polynomial kernel with gamma={:.3g} has this rank",
            "linear": "the linear kernel's rank is at most the number of features",
        }.get(self.kernel if isinstance(self.kernel, str) else "", "the kernel has this rank")
        cause = cause.format(self.gamma_)
        what = (f"only {live} of the {k} components have positive variance in the fair "
                f"feature space: the fair kernel matrix is numerically of rank {live} ({cause})")
        if self.kernel == "linear":
            fix = f"pass n_components <= {live}" if live else "check X"
        else:
            fix = (f"pass n_components <= {live} or another gamma" if live else
                   "pass another gamma (or kernel)")
        if self.kernel == "sigmoid":
            fix += ", or centre X"
        raise ValueError(f"{what}; {fix}")

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

        from .decomposition import _input_meta
        from ._writes import atomic_directory
        from .io import save_arrays
        from .moments import _categories_to_json

        self._check_fitted()
        if callable(self.kernel):
            raise ValueError(
                "a FairKernelPCA with a callable kernel cannot be saved: the format holds "
                "arrays and JSON only, never pickled code; use a named kernel to save"
            )
        arrays = {a: np.asarray(getattr(self, a)) for a in self._array_attrs}
        if getattr(self, "kernel_shift_", None) is not None:
            arrays["kernel_shift_"] = self.kernel_shift_
        meta = {
            "kind": "estimator",
            "class": type(self).__name__,
            "params": self.get_params(),
            **{a: getattr(self, a) for a in self._meta_attrs},
            **_input_meta(self),
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
        from .decomposition import restore_input_meta
        from .moments import _categories_from_json

        est = cls(**meta["params"])
        for a in cls._array_attrs:
            setattr(est, a, arrays[a])
        est.kernel_shift_ = arrays.get("kernel_shift_")
        for a in cls._meta_attrs:
            setattr(est, a, meta[a])
        restore_input_meta(est, meta)
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
        from .decomposition import saved_certificate, saved_groups, saved_input_meta, saved_params
        from .io import meta_value

        kernel = meta_value(meta, "params", "dict").get("kernel", "rbf")
        if kernel not in KERNELS:  # a saved kernel is a name, never code
            raise ValueError(f"meta.json: kernel {kernel!r:.40} is not one of {list(KERNELS)}")
        params = saved_params(cls, meta)
        gamma = meta_value(meta, "gamma_", "number", optional=True)
        if (gamma is None) != (kernel == "linear") or (gamma is not None and gamma <= 0):
            raise ValueError(f"meta.json: 'gamma_' {gamma!r} does not suit the {kernel} kernel")
        meta_value(meta, "method_", ("exact", "nystroem"))
        width = meta_value(meta, "n_features_in_", "positive")
        sensitive, numeric = saved_input_meta(meta, width)
        d = width - len(sensitive)  # the columns of the kernel
        k = meta_value(meta, "n_components_", "positive")
        b = meta_value(meta, "n_landmarks_", "positive")
        n = meta_value(meta, "n_samples_seen_", "positive")
        meta_value(meta, "n_constraints_", "count")
        meta_value(meta, "max_components_", "int")
        saved_certificate(meta, len(saved_groups(meta, len(numeric))) + len(numeric))
        if b > n:
            raise ValueError(f"meta.json: 'n_landmarks_' {b} exceeds 'n_samples_seen_' {n}")
        out = 2 * k if params.get("tradeoff", 0) > 0 else k
        # the basis keeps X's dtype (integers too): transform casts it to float64 either way
        return {"basis_": ((b, d), "fiu"), "basis_indices_": ((b,), "iu"),
                "dual_coef_": ((b, out), "f"), "offset_": ((out,), "f"),
                "explained_variance_": ((k,), "f"), "explained_variance_ratio_": ((k,), "f"),
                "kernel_shift_": ((d,), "?f")}

    # ------------------------------------------------------------------ transforming
    def _check_fitted(self):
        if not hasattr(self, "dual_coef_"):
            raise NotFittedError(
                f"this {type(self).__name__} is not fitted yet; call fit(...) before using it"
            )

    @property
    def _n_features_out(self):
        return self.dual_coef_.shape[1]

    def get_feature_names_out(self, input_features=None):
        """"fairkernelpca0", ... for the fair components, then "fairkernelpca_standard0",
        ... for the λ-scaled standard ones when ``tradeoff > 0``."""
        return fair_feature_names(self, super().get_feature_names_out(input_features))

    def transform(self, X):
        """Represent X: ``kernel(X, basis_) @ dual_coef_ - offset_`` (the centred kernel expansion).

        numpy or pandas in, numpy out; Dask (or Zarr) in, lazy Dask out with X's row chunks;
        a DataArray in, a DataArray out (rows and a "component" dimension).  float64.  X
        has all ``n_features_in_`` columns; those named by ``sensitive_feature_ids`` are
        left out of the kernel.
        """
        self._check_fitted()
        import dask.array as da

        inp = check_input(self, X, reset=False, ids=self.sensitive_feature_ids)
        fitted = np.asarray(getattr(self, "numeric_sensitive_columns_", ()), dtype=np.intp)
        if not np.array_equal(inp.numeric, fitted) or \
                inp.data.shape[1] != self.basis_.shape[1] + len(fitted):
            raise ValueError("X's sensitive columns differ from those at fit: give the columns "
                             "the dtypes they had at fit")
        Xa = inp.data
        columns = inp.features if len(fitted) else None
        # models saved before kernel_shift_ existed use the unshifted kernel they were fitted with
        kern = self._kernel_function(self.gamma_, getattr(self, "kernel_shift_", None))
        if isinstance(Xa, da.Array):
            out = _expand_lazily(Xa, self.basis_, self.dual_coef_, self.offset_, kern, columns)
        else:
            out = _expand(Xa, self.basis_, self.dual_coef_, self.offset_, kern, columns)
        return inp.wrap(out, self.get_feature_names_out())


# ---------------------------------------------------------------------------- kernels
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
        raise ValueError(
            f"the kernel callable returned shape {K.shape} for blocks of {A.shape[0]} and "
            f"{B.shape[0]} rows; it must return the ({A.shape[0]}, {B.shape[0]}) kernel matrix"
        )
    return K


def _rows_per_block(width: int) -> int:
    """Rows whose float64 values over ``width`` columns take about :data:`BLOCK_BYTES`."""
    return max(1, BLOCK_BYTES // (8 * max(1, width)))


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
    step = _rows_per_block(max(basis.shape[0], x.shape[1]))
    for s in range(0, x.shape[0], step):
        out[s : s + step] = kern(x[s : s + step], basis) @ coef - offset
    return out


def _expand_lazily(X, basis, coef, offset, kern, columns=None):
    """:func:`_expand` per row chunk of the Dask array X (basis and coef shipped once)."""
    from dask import delayed

    return X.map_blocks(
        _expand, delayed(basis), delayed(coef), offset, kern, columns, dtype=np.float64,
        chunks=(X.chunks[0], (coef.shape[1],)), meta=np.empty((0, 0)),
    )


def _phi_block(x, basis, coef, kern, features, numeric, block_info=None):
    """Nyström features of a row chunk's ``features`` columns, then its ``numeric``
    protected attributes as float64: the columns the Nyström statistics are taken over."""
    phi = _expand(x, basis, coef, 0.0, kern, features if len(numeric) else None, block_info)
    if not len(numeric):
        return phi
    return np.hstack([phi, np.asarray(x)[:, numeric].astype(np.float64)])


def _numeric_attributes(values, names) -> np.ndarray:
    """Centred numeric protected attributes (n, q): the Z columns of the exact method
    (``Z^T Kc B = 0``: the representation is uncorrelated with each); a constant one is an
    error."""
    Z = np.asarray(values, dtype=np.float64)
    for j, name in enumerate(names):
        if Z.shape[0] and np.ptp(Z[:, j]) == 0:
            raise ValueError(f"{name} is constant over the rows fitted, so it tells no one "
                             "apart; drop it from sensitive_feature_ids")
    return Z - Z.mean(axis=0)


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
    centred indicator is minus the sum of the other m - 1 columns of Z), or for a numeric
    attribute (categories None) its one centred column, with those without signal
    (:func:`_noise_level`) set to zero and a warning naming them."""
    level = _noise_level(Kc)
    columns, start = [], 0
    for cats, name in zip(categories, names):
        numeric = cats is None
        width = 1 if numeric else len(cats) - 1
        cols = np.arange(start, start + width)
        start += width
        Zb = Z[:, cols]
        Gb = G[np.ix_(cols, cols)]
        if numeric:
            KZ, sq, zsq = C[:, cols].copy(), np.diagonal(Gb).copy(), np.einsum("ij,ij->j", Zb, Zb)
        else:
            KZ = np.hstack([C[:, cols], -C[:, cols].sum(axis=1, keepdims=True)])
            sq = np.append(np.diagonal(Gb), Gb.sum())
            zsq = np.append(np.einsum("ij,ij->j", Zb, Zb), np.square(Zb.sum(axis=1)).sum())
        zero = sq <= level * zsq
        if zero.any():
            what = (f"{name}: its covariance with the kernel's features is rounding" if numeric else
                    f"group(s) {', '.join(str(c) for c in np.asarray(cats)[zero])} of {name}: "
                    "the mean in the kernel's feature space equals the overall mean to rounding")
            warnings.warn(f"{what}, so they impose no constraint and none is kept",
                          UserWarning, stacklevel=4)
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
    # M is symmetric, so its transpose is the Fortran-ordered array LAPACK wants (no copy).
    # On a cluster of (nearly) equal top eigenvalues "evr" may return fewer than k pairs or
    # fail; the caller then finds fewer than k components with variance and says so.
    try:
        w, V = scipy.linalg.eigh(M.T, subset_by_index=[n - k, n - 1], overwrite_a=overwrite,
                                 driver="evr")
    except np.linalg.LinAlgError:
        w, V = np.empty(0), np.empty((n, 0))
    w, V = w[::-1], V[:, ::-1]
    short = k - len(w)
    return np.append(w, np.zeros(short)), np.hstack([V, np.zeros((n, short))])


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
