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

from collections.abc import Callable
from typing import Any, Self

import dask.array as da
import numpy as np

from ..solve import _kernels as kn
from ..solve._kernel_method import choose_method, exact_fit_bytes
from ._base import Estimator, fit_context, set_certificate
from ..engine._compute import compute, worker_timeout
from ..engine._engine import coded_moments
from ..solve._exact import row_variance
from ..solve._fairness import CONSTRAINT_RULES, constraint_of
from ..solve._limits import check_fair_k
from ..base._params import BOOL, SPLIT_EVERY, TRADEOFF, Check, Rule, is_int, is_real
from ..io import register_model_class
from ._saved import fair_meta, kernel_layout, restore_fair_meta
from ._fair_input import fair_input
from ..inputs._validation import SENSITIVE_IDS, Input, check_finite_input
from ._fair import FairPCA
from ..base._typing import ArrayInput, ArrayOutput, ColumnIds, Seed
from ..errors import InvalidInputError

__all__ = ["FairKernelPCA", "KERNELS", "exact_fit_bytes"]

KERNELS = kn.KERNELS
#: what a failed certificate suggests (FairKernelPCA has no standardize or compute_dtype):
#: a gamma that brings the kernel's entries away from 0 and 1 separates the groups' directions
KERNEL_CERTIFY_FIX = "another kernel or gamma"


def _seed_ok(r) -> bool:
    """What ``numpy.random.default_rng`` takes as a seed (the landmarks' and Lanczos'):
    scikit-learn's forms (None, an int, a RandomState) and numpy's newer ones."""
    return r is None or (is_int(r) and r >= 0) or isinstance(
        r, (np.random.RandomState, np.random.Generator, np.random.BitGenerator,
            np.random.SeedSequence))


def _check_kernel(est, kernel) -> None:
    if not callable(kernel) and kernel not in KERNELS:
        valid = ", ".join(repr(s) for s in KERNELS)
        raise InvalidInputError(
            f"unknown kernel {kernel!r}; use one of {valid} or a callable "
            "kernel(A, B) returning the (len(A), len(B)) kernel matrix"
        )


@register_model_class
class FairKernelPCA(Estimator):
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
        run on a distributed cluster); ``save`` refuses a model with one (it never pickles:
        refit after loading, or use a named kernel).
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
    random_state : int, numpy RandomState or Generator, or None, default 0
        Seeds the landmark sample and the Lanczos start vector.
    max_memory : int or None, default None
        Bytes the fit may use; None is 50% of the currently available memory
        (``psutil``).  The exact method, or the Nyström method with the ``n_landmarks``
        given, refuses to start (ValueError) above it.
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
        :data:`dfairpca.solve._fairness.FAIRNESS_TOLERANCE` raises ``ValueError``.  With
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
    >>> from dfairpca.decomposition.kernel import FairKernelPCA
    >>> rng = np.random.default_rng(0)
    >>> X, z = rng.normal(size=(300, 4)), rng.integers(0, 2, 300)
    >>> X[z == 1] += 1.0
    >>> Y = FairKernelPCA(3).fit_transform(X, sensitive_features=z)
    >>> bool(np.allclose(Y[z == 0].mean(0), Y[z == 1].mean(0)))
    True
    """

    _parameter_rules = {
        "n_components": [Rule(lambda k: k is None or (is_int(k) and k > 0),
                              "a positive integer or None")],
        "sensitive_feature_ids": SENSITIVE_IDS,
        "kernel": [Check(_check_kernel)],
        "gamma": [Rule(lambda g: (isinstance(g, str) and g == "scale") or (is_real(g) and g > 0),
                       "'scale' or a number > 0")],
        "degree": [Rule(lambda v: is_int(v) and v >= 1, "a positive integer")],
        "coef0": [Rule(is_real, "a number")],
        "n_landmarks": [Rule(lambda m: m is None or (isinstance(m, str) and m == "auto")
                             or (is_int(m) and m > 0), "None (exact), 'auto' or a positive integer")],
        "landmarks": [Rule(lambda v: v == "uniform", "'uniform'")],
        "constraint": CONSTRAINT_RULES,
        "tradeoff": TRADEOFF,
        "center": BOOL,
        "random_state": [Rule(_seed_ok, "None, an int >= 0, a numpy RandomState or Generator")],
        "max_memory": [Rule(lambda v: v is None or (is_real(v) and v > 0),
                            "None or a positive number of bytes")],
        "split_every": SPLIT_EVERY,
    }
    _fitted_attribute = "dual_coef_"

    def __init__(self, n_components: int | None = None, *,
                 sensitive_feature_ids: ColumnIds | None = None, kernel: str | Callable[..., Any] = "rbf",
                 gamma: float | str = "scale", degree: int = 3, coef0: float = 1.0,
                 n_landmarks: int | str | None = None, landmarks: str = "uniform",
                 constraint: str = "demographic_parity", tradeoff: float = 0.0, center: bool = True,
                 random_state: Seed = 0, max_memory: int | None = None,
                 split_every: int = 8) -> None:
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

    # ------------------------------------------------------------------ parameters
    def _choose_method(self, n: int, d: int) -> int | None:
        """:func:`dfairpca.solve._kernel_method.choose_method` for this estimator."""
        return choose_method(self.n_landmarks, self.n_components, n, d, self.max_memory)

    def _kernel_function(self, gamma, shift=None):
        """A picklable ``f(A, B)`` returning the kernel matrix of two row blocks (for
        "linear", of the rows minus ``shift``)."""
        return kn.kernel_function(self.kernel, gamma, self.degree, self.coef0, shift)

    def _kernel_shift(self, rows: np.ndarray):
        """kernel_shift_: the mean of ``rows`` for the centred linear kernel, else None.

        Centred, the linear kernel is shift-invariant, but ``<x, y>`` of rows far from the
        origin loses the data to cancellation (X + 3e6 with unit spread would fail the
        certificate at 4e-6, and Nyström's landmark kernel would have rank 2 of 6);
        ``<x - c, y - c>`` has the same centred kernel and keeps it."""
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

    def _live_components(self, s: np.ndarray, k: int, nonzero: bool) -> int:
        """:func:`dfairpca.solve._kernels.live_components` for this kernel."""
        return kn.live_components(s, k, nonzero, self.n_components, self.kernel, self.gamma_)

    # ------------------------------------------------------------------ fitting
    @fit_context
    def fit(self, X: ArrayInput, y: ArrayInput | None = None, *,
            sensitive_features: ArrayInput | None = None,
            sample_weight: ArrayInput | None = None, timeout: float | None = None) -> Self:
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
        sample_weight : None
            Refused (InvalidInputError): the exact solve centres the n x n kernel with equal
            weights and the Nyström solve draws its landmarks uniformly, so weights would
            change what the model means, not only its sums.  Weighted fair PCA is
            :class:`dfairpca.FairPCA`'s ``sample_weight``; here, repeat or resample the rows
            by their weights instead.
        timeout : float, optional
            Seconds to wait once every worker has left, as in :meth:`dfairpca.PCA.fit`.

        Returns
        -------
        self
        """
        if sample_weight is not None:
            raise InvalidInputError(
                "FairKernelPCA does not take sample_weight: its exact solve centres the n x n "
                "kernel with equal weights and its Nystroem solve draws landmarks uniformly; use "
                "FairPCA(sample_weight=...) for weighted fair PCA, or repeat/resample the rows "
                "by their weights (e.g. rng.choice(n, size, p=w / w.sum()))")
        with worker_timeout(timeout):
            return self._fit(X, y, sensitive_features)

    def _fit(self, X, y, sensitive_features):
        """:meth:`fit`, its parameters checked."""
        f = fair_input(self, X, sensitive_features, y, reset=True)
        inp, Xa, g, mask, names = f.checked, f.data, f.groups, f.mask, f.names
        fit_rows = np.arange(f.n_rows) if mask is None else np.flatnonzero(mask)
        ms, q = f.group_sizes, f.n_numeric
        m = self._choose_method(len(fit_rows), len(inp.features))
        if m is None:
            limit = check_fair_k(self.n_components, len(fit_rows), ms, q,
                                 basis=f"n = {len(fit_rows)} fitted rows",
                                 fix="pass a smaller n_components")
            self._fit_exact(Xa, fit_rows, g, inp, names, limit)
        else:
            check_fair_k(self.n_components, m, ms, q, basis=f"n_landmarks = {m}",
                         fix="pass a smaller n_components or more landmarks")
            self._fit_nystroem(Xa, fit_rows, mask, g, m, inp, names)
        self.n_features_in_ = inp.width
        self.sensitive_feature_indices_ = inp.sensitive
        self.numeric_sensitive_columns_ = inp.numeric
        self.n_samples_seen_ = len(fit_rows)
        self.groups_ = [] if g is None else list(g.categories)
        self.attribute_names_ = names
        return self

    def _fit_exact(self, Xa, fit_rows, g, inp: Input, names, limit: int):
        """Alg. 3 on the centred kernel of the fitted rows
        (:func:`dfairpca.solve._kernels.exact_fair_kernel`), its rows read here."""
        rows = None if len(fit_rows) == Xa.shape[0] else fit_rows
        Xr = kn.take_rows(Xa, rows)
        var = kn.flat_variance(Xr[:, inp.features]) if self._needs_variance() else None
        Xr, var = compute(Xr, var)
        check_finite_input(Xr, index=fit_rows)
        Xf = Xr[:, inp.features] if len(inp.numeric) else Xr
        if self.center:  # equal rows: a centred kernel of zeros (uncentred, they hold a direction)
            row_variance(Xf)
        n = Xf.shape[0]
        k = limit if self.n_components is None else self.n_components
        self.gamma_ = self._resolve_gamma(var, Xf.shape[1])
        self.kernel_shift_ = self._kernel_shift(Xf)
        sol = kn.exact_fair_kernel(
            Xf, self._kernel_function(self.gamma_, self.kernel_shift_), k,
            constraint=constraint_of(self.constraint),
            codes=None if g is None else g.codes[fit_rows],
            categories=None if g is None else g.categories,
            numeric=Xr[:, inp.numeric], numeric_names=inp.numeric_names, names=names,
            tradeoff=self.tradeoff, center=self.center, psd=self._kernel_is_psd(),
            rng=np.random.default_rng(self.random_state), live=self._live_components,
            estimator=type(self).__name__, fix=KERNEL_CERTIFY_FIX, kernel=self.kernel, gamma=self.gamma_)
        set_certificate(self, sol.violations)
        self.method_ = "exact"
        self.n_landmarks_ = n
        self.basis_ = Xf
        self.basis_indices_ = fit_rows
        self.dual_coef_ = sol.coef
        self.offset_ = sol.offset
        self.n_components_ = len(sol.variances)
        self.explained_variance_ = np.maximum(sol.variances, 0.0) / (n - 1)
        self.explained_variance_ratio_ = np.maximum(sol.variances, 0.0) / sol.total
        self.n_constraints_ = sol.n_constraints
        self.max_components_ = limit

    def _fit_nystroem(self, Xa, fit_rows, mask, g, m, inp: Input, names):
        """Linear fair PCA on Nyström features, from one chunked pass of additive statistics."""
        rng = np.random.default_rng(self.random_state)
        idx = np.sort(rng.choice(fit_rows, size=m, replace=False))
        var_rows = None if mask is None else fit_rows
        var = kn.flat_variance(kn.take_rows(Xa, var_rows)[:, inp.features]) if self._needs_variance() else None
        L, var = compute(kn.take_rows(Xa, idx), var)
        check_finite_input(L, index=idx)
        L = L[:, inp.features]
        self.gamma_ = self._resolve_gamma(var, L.shape[1])
        self.kernel_shift_ = self._kernel_shift(L)
        kern = self._kernel_function(self.gamma_, self.kernel_shift_)

        K_LL = kern(L, L)
        kn.check_not_identity(K_LL, self.kernel, self.gamma_)
        W = kn.inverse_sqrt(K_LL)
        ms = [] if g is None else [len(c) for c in g.categories]
        q = len(inp.numeric)
        if W.shape[1] < m:
            check_fair_k(self.n_components, W.shape[1], ms, q,
                         basis=f"the landmark kernel matrix of rank {W.shape[1]} < {m} "
                               "(duplicate landmarks or a low-rank kernel)",
                         fix="pass a smaller n_components")
        if not isinstance(Xa, da.Array):
            Xa = da.from_array(Xa, chunks=(kn.block_rows(max(Xa.shape[1], W.shape[1])), -1))
        r = W.shape[1]
        # phi(x) of the features, then the numeric attributes as they are: their covariances
        # with phi are the constraint (FairPCA's numeric columns)
        phi = kn.nystroem_features(Xa, L, W, kern, inp.features, inp.numeric)
        codes, cats = (None, ()) if g is None else (g.codes, g.categories)
        stats = coded_moments(phi, codes, cats, mask=mask, dtype=np.float64,
                                split_every=self.split_every)
        stats.check_finite()
        fair = FairPCA(self.n_components, center=self.center, constraint=self.constraint,
                       tradeoff=self.tradeoff, split_every=self.split_every)
        # its parameters are this estimator's, checked by fit: the solve, not the check again
        fair._fit_statistics(stats, attribute_names=names, numeric_columns=np.arange(r, r + q))

        total = float(np.sum(fair.explained_variance_))
        tol = r * np.finfo(np.float64).eps * total
        k = self._live_components(fair.explained_variance_ * (fair.explained_variance_ > tol),
                                  fair.n_components_, total > 0)
        P = fair.components_[:k].T
        if self.tradeoff > 0:
            assert fair.standard_components_ is not None  # a tradeoff fit keeps them
            P = np.hstack([P, self.tradeoff * fair.standard_components_[:k].T])
        self.method_ = "nystroem"
        self.n_landmarks_ = m
        self.basis_ = L
        self.basis_indices_ = idx
        # signs fixed on the landmarks' coefficients (largest entry positive), not in the
        # Nystroem feature space, whose basis W carries the arbitrary signs of eigh's
        # eigenvectors of K_LL: a near-tie there flipped a component between a numpy and a
        # Dask fit of the same data
        A = W @ P
        signs = np.sign(A[np.argmax(np.abs(A), axis=0), np.arange(A.shape[1])])
        signs[signs == 0] = 1
        P = P * signs
        self.dual_coef_ = A * signs
        self.offset_ = fair.mean_ @ P
        self.n_components_ = k
        self.explained_variance_ = fair.explained_variance_[:k]
        self.explained_variance_ratio_ = fair.explained_variance_ratio_[:k]
        self.n_constraints_ = fair.n_constraints_
        self.max_components_ = fair.max_components_
        self.fairness_violation_ = fair.fairness_violation_
        self.fairness_violation_per_attribute_ = fair.fairness_violation_per_attribute_

    # ------------------------------------------------------------------ persistence
    _array_attrs = ("basis_", "basis_indices_", "dual_coef_", "offset_", "explained_variance_",
                    "explained_variance_ratio_", "kernel_shift_")
    _meta_attrs = ("gamma_", "method_", "n_landmarks_", "n_features_in_", "n_samples_seen_",
                   "n_components_", "n_constraints_", "max_components_", "attribute_names_")

    def _check_savable(self) -> None:
        if callable(self.kernel):
            raise InvalidInputError(
                "a FairKernelPCA with a callable kernel cannot be saved: the format holds "
                "arrays and JSON only, never pickled code; use a named kernel to save"
            )

    def _extra_meta(self) -> dict:
        return fair_meta(self)

    @classmethod
    def _saved_layout(cls, meta: dict, headers: dict) -> dict:
        return kernel_layout(cls, meta, KERNELS)

    def _restore_extra(self, meta: dict, arrays: dict) -> None:
        restore_fair_meta(self, meta)
        self.gamma_ = meta.get("gamma_")  # absent (None) for the linear kernel

    def _check_restored(self) -> None:
        idx = self.basis_indices_
        if idx.size and (idx.min() < 0 or idx.max() >= self.n_samples_seen_):
            raise InvalidInputError(f"arrays.npz: 'basis_indices_' points outside the "
                             f"{self.n_samples_seen_} fitted rows")

    # ------------------------------------------------------------------ transforming
    def _output_matrix(self) -> np.ndarray:
        return self.dual_coef_

    def transform(self, X: ArrayInput) -> ArrayOutput:
        """Represent X: ``kernel(X, basis_) @ dual_coef_ - offset_`` (the centred kernel expansion).

        numpy or pandas in, numpy out; Dask (or Zarr) in, lazy Dask out with X's row chunks;
        a DataArray in, a DataArray out (rows and a "component" dimension).  float64.  X
        has all ``n_features_in_`` columns; those named by ``sensitive_feature_ids`` are
        left out of the kernel.

        Parameters
        ----------
        X : array-like of shape (n, d)
            numpy, pandas, xarray, Dask or Zarr array (or a path to a Zarr array).

        Returns
        -------
        ndarray, Dask array or xarray.DataArray of float64, shape (n, k)
            The representations, ``k = n_components_``; lazy for Dask input.
        """
        return self._represented(X)

    def _features_fitted(self) -> int:
        return self.basis_.shape[1]

    def _represent(self, inp: Input, X) -> ArrayOutput:
        self._check_layout(inp)
        columns = inp.features if len(inp.numeric) else None
        # models saved before kernel_shift_ existed use the unshifted kernel they were fitted with
        kern = self._kernel_function(self.gamma_, getattr(self, "kernel_shift_", None))
        out = kn.expand(inp.data, self.basis_, self.dual_coef_, self.offset_, kern, columns)
        return inp.wrap(out, self.get_feature_names_out())
