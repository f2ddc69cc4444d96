"""Estimators: :class:`PCA` and :class:`FairPCA` on numpy, pandas, xarray, Dask and Zarr arrays.

They are thin: check the input, run the one-pass statistics (:mod:`dfairpca._engine`),
solve the small eigenproblem (:mod:`dfairpca._solvers`) and keep the fitted attributes.
``transform`` is lazy on Dask input (``map_blocks``) and eager on numpy input.

Both follow :class:`sklearn.decomposition.PCA` wherever the two meet (``n_components``
as an int, a fraction of the variance or None; ``whiten``; ``svd_solver``; the fitted
``singular_values_`` and ``noise_variance_``; the probabilistic-PCA ``get_covariance``,
``get_precision``, ``score`` and ``score_samples``; ``feature_names_in_``), with equal
numbers where both apply (``tests/test_sklearn.py``).
"""

from __future__ import annotations

import math
import numbers
import warnings
from pathlib import Path

import numpy as np
from sklearn.base import BaseEstimator, ClassNamePrefixFeaturesOutMixin, TransformerMixin
from sklearn.exceptions import NotFittedError

from . import _solvers
from ._engine import compute_moments
from ._system import rows_per_block
from ._groups import binary_target, encode_groups, group_labels
from ._validation import (
    Input, check_finite_input, check_finite_output, check_input,
    compute_dtype_for, is_xarray, row_origin, with_known_rows,
)
from .moments import (
    OVERFLOW_MESSAGE, Moments, _categories_from_json, _categories_to_json, merge, saved_group_counts,
)

__all__ = ["PCA", "FairPCA", "load"]

CONSTRAINTS = ("demographic_parity", "equal_opportunity")
#: scikit-learn's ``svd_solver`` values: every one but "randomized" is the exact solve here
SVD_SOLVERS = ("auto", "full", "covariance_eigh", "randomized")
RANDOMIZED_NOT_BUILT = (
    "svd_solver='randomized' is not built yet: matrix-free randomized passes over X are the "
    "full-resolution work still open; use svd_solver='auto' (the exact solve of the d x d "
    "covariance, one pass over X), or eigen_solver='randomized' for a faster local solve"
)


class _BaseDecomposition(ClassNamePrefixFeaturesOutMixin, TransformerMixin, BaseEstimator):
    """Shared fit-from-statistics, transform, inverse_transform, the probabilistic model, save."""

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.allow_nan = False  # NaN rows are refused, named
        tags.input_tags.sparse = False  # centring densifies: refused with what to do
        # float32 input is projected in float32 (compute_dtype="auto"), float64 in float64
        tags.transformer_tags.preserves_dtype = ["float64", "float32"]
        return tags

    # ------------------------------------------------------------------ parameters
    def _check_params(self):
        k = self.n_components
        whole = isinstance(k, numbers.Integral) and not isinstance(k, bool)
        fraction = isinstance(k, numbers.Real) and not whole and not isinstance(k, bool)
        if k is not None and not ((whole and k > 0) or (fraction and 0 < k < 1)):
            raise ValueError(
                f"n_components must be a positive integer, a fraction in (0, 1) of the variance "
                f"to keep, or None; got {k!r}"
            )
        if not isinstance(self.split_every, numbers.Integral) or self.split_every < 2:
            raise ValueError(f"split_every must be an integer >= 2; got {self.split_every!r}")
        compute_dtype_for(np.float64, self.compute_dtype)  # validates the option
        if self.eigen_solver not in _solvers.EIGEN_SOLVERS:
            raise ValueError(
                f"eigen_solver must be one of {_solvers.EIGEN_SOLVERS}; got {self.eigen_solver!r}"
            )
        if not isinstance(self.whiten, (bool, np.bool_)):
            raise ValueError(f"whiten must be True or False; got {self.whiten!r}")
        if self.svd_solver not in SVD_SOLVERS:
            raise ValueError(f"svd_solver must be one of {SVD_SOLVERS}; got {self.svd_solver!r}")
        if self.svd_solver == "randomized":
            raise NotImplementedError(RANDOMIZED_NOT_BUILT)
        p = self.iterated_power
        if not (p == "auto" if isinstance(p, str) else
                isinstance(p, numbers.Integral) and not isinstance(p, bool) and p >= 0):
            raise ValueError(f"iterated_power must be 'auto' or an integer >= 0; got {p!r}")
        o = self.n_oversamples
        if not (isinstance(o, numbers.Integral) and not isinstance(o, bool) and o >= 1):
            raise ValueError(f"n_oversamples must be an integer >= 1; got {o!r}")
        r = self.random_state
        if not (r is None or isinstance(r, (numbers.Integral, np.random.RandomState,
                                            np.random.Generator)) and not isinstance(r, bool)):
            raise ValueError(f"random_state must be None, an int or a numpy random generator; got {r!r}")

    # ------------------------------------------------------------------ fitting
    def _input(self, X, *, reset, min_samples: int = 1) -> Input:
        """X checked (:func:`dfairpca._validation.check_input`), its sensitive columns found."""
        return check_input(self, X, reset=reset, min_samples=min_samples,
                           ids=getattr(self, "sensitive_feature_ids", None))

    def _pass(self, X, groups=None, mask=None, checkpoint=None, numeric: bool = False):
        """The statistics of X; ``numeric``: X holds numeric protected attributes, whose
        covariances with the features are the constraint, so the products run in float64
        (float32 products would hold them to 1e-7 only) unless compute_dtype says otherwise."""
        auto = self.compute_dtype in ("auto", None)
        dtype = np.dtype(np.float64) if numeric and auto else compute_dtype_for(X.dtype, self.compute_dtype)
        codes, cats = (None, ()) if groups is None else (groups.codes, groups.categories)
        kw = dict(
            mask=mask, dtype=dtype, split_every=self.split_every,
            group_scatter=getattr(self, "equalize_covariance", None) is not None,
            progress=self.progress,
        )
        if checkpoint is None:
            m = compute_moments(X, codes, cats, **kw)
        else:
            import dask.array as da

            from .checkpoint import compute_moments_checkpointed

            if not isinstance(X, da.Array):
                X = da.from_array(X, chunks=(rows_per_block(X.shape[1] * X.itemsize), -1))
            m = compute_moments_checkpointed(X, codes, cats, checkpoint=checkpoint, **kw)
        m.check_finite()
        return m

    def _space(self, m: Moments):
        """(S, scale, e): the matrix whose eigenvectors we want, in the fitted feature space,
        as ``S * 4**e`` (e is the statistics' ``scatter_exponent``, 0 but for data of
        extreme magnitude; 0 when standardized, which is unit-free), and the true scale."""
        m.symmetrize()
        if m.n < 2:
            raise ValueError(f"need at least 2 samples to fit; got {m.n} (n_samples={m.n})")
        if not (np.all(np.isfinite(m.mean)) and np.all(np.isfinite(np.diagonal(m.scatter)))):
            raise ValueError(OVERFLOW_MESSAGE)
        e = m.scatter_exponent
        S = m.scatter
        if not self.center:
            mu = np.ldexp(m.mean, -e)  # in the scatter's units
            S = S + m.n * np.outer(mu, mu)
        scale = None
        if self.standardize:
            # the population standard deviation (ddof=0), as StandardScaler divides by
            var = np.maximum(np.diag(m.scatter) / m.n, 0.0)  # rounding may leave it < 0
            # a feature whose variance is within the rounding of its mean is constant (as
            # StandardScaler's test): left unscaled, not divided by noise
            with np.errstate(over="ignore", under="ignore"):
                noise = (2.0 * m.n * np.finfo(np.float64).eps * np.ldexp(m.mean, -e)) ** 2
            sd = np.sqrt(var)
            sd[var <= noise] = 1.0
            S = S / np.outer(sd, sd)
            scale = np.ldexp(sd, e)
            scale[scale == 0] = 1.0
            e = 0
        return S, scale, e

    def _pca_solve(self, S: np.ndarray, n: int) -> np.ndarray:
        """Components (k, d) of standard PCA of S for ``n_components`` (int, fraction or
        None, scikit-learn's meanings) from n rows."""
        d = S.shape[0]
        rank = min(n, d)
        k = self.n_components
        if k is None:
            return _solvers.pca_components(S, rank, self.eigen_solver)
        if isinstance(k, numbers.Integral):
            return _solvers.pca_components(S, k, self.eigen_solver)
        w, V = _solvers.top_eigh(S, rank, "dense")
        k = _fraction_to_k(w, np.trace(S), k, "the data")
        return _solvers.flip_signs(V[:, :k].T)

    def _set_fitted(self, m: Moments, U: np.ndarray, S: np.ndarray, scale, e: int = 0):
        d = m.n_features
        n = int(m.n)
        self.statistics_ = m
        self.n_features_in_ = d + len(getattr(self, "sensitive_feature_indices_", ()))
        self.n_samples_seen_ = n
        self.n_components_ = U.shape[0]
        self.components_ = U
        self.mean_ = m.mean.copy() if self.center else np.zeros(d)
        self.scale_ = scale
        denom = n - 1
        captured = np.sum((U @ S) * U, axis=1) / denom
        total = np.trace(S) / denom
        noise = _noise_variance(captured, total, min(n, d))
        with np.errstate(over="ignore", under="ignore"):  # the true values, as float64 holds them
            self.explained_variance_ = np.ldexp(captured, 2 * e)
            self.singular_values_ = np.ldexp(np.sqrt(np.maximum(captured, 0.0) * denom), e)
            self.noise_variance_ = float(np.ldexp(noise, 2 * e))
        self.explained_variance_ratio_ = captured / total

    # ------------------------------------------------------------------ transforming
    def _check_fitted(self):
        if not hasattr(self, "components_"):
            hint = (
                " (partial_fit has not yet seen two groups of every attribute, or "
                "n_components rows)"
                if hasattr(self, "statistics_") else ""
            )
            raise NotFittedError(
                f"this {type(self).__name__} is not fitted yet{hint}; call fit(...) before using it"
            )

    def _projection(self) -> np.ndarray:
        """(d, k_out) matrix applied to standardised, centred rows (whitening folded in)."""
        W = self.components_.T
        return W / _whitening(self.explained_variance_) if self.whiten else W

    @property
    def _n_features_out(self):
        return self._projection().shape[1]

    def _check_layout(self, inp: Input) -> None:
        """Raise unless X's sensitive columns sit where they sat at fit (a DataFrame column
        of labels at fit and of numbers now would move the others)."""
        fitted = np.asarray(getattr(self, "numeric_sensitive_columns_", ()), dtype=np.intp)
        if inp.data.shape[1] != self.components_.shape[1] + len(fitted) or not np.array_equal(
                inp.numeric, fitted):
            raise ValueError(
                f"X's sensitive columns differ from those at fit ({len(inp.numeric)} numeric "
                f"of {inp.data.shape[1]} read now, {len(fitted)} at fit): give the columns the "
                "dtypes they had at fit"
            )

    def _folded(self, inp: Input, dtype):
        """(mu, W) over the columns of ``inp.data``: ``(x - mu) @ W`` is the transform, with
        the scaling folded into W and zero rows for the sensitive columns."""
        W = self._projection()
        scale = np.ones(W.shape[0]) if self.scale_ is None else self.scale_
        # ((x - mu) / s) @ W == (x - mu) @ (W / s[:, None])
        Wf = np.zeros((inp.data.shape[1], W.shape[1]))
        mu = np.zeros(inp.data.shape[1])
        Wf[inp.features] = W / scale[:, None]
        mu[inp.features] = self.mean_
        return mu.astype(dtype), Wf.astype(dtype)

    def transform(self, X):
        """Project X: ``((X - mean_) / scale_) @ components_.T`` (divided by
        ``sqrt(explained_variance_)`` when ``whiten``).

        numpy or pandas in, numpy out; Dask (or Zarr) in, lazy Dask out with X's row chunks;
        an xarray DataArray in, a DataArray out with X's row dimension and coordinate and a
        "component" dimension (lazy if X was).  X has all ``n_features_in_`` columns; the
        ones named by ``sensitive_feature_ids`` are left out of the projection.
        float64 input gives float64 output, other dtypes float32 (see ``compute_dtype``).
        Rows holding NaN or infinity raise ``ValueError`` naming them: at once for numpy
        input, when the chunk is computed for Dask input (integer input is not checked:
        it cannot hold either).
        """
        self._check_fitted()
        inp = self._input(X, reset=False)
        self._check_layout(inp)
        Xa = inp.data
        dtype = compute_dtype_for(Xa.dtype, self.compute_dtype)
        mu, Ws = self._folded(inp, dtype)
        import dask.array as da

        if isinstance(Xa, da.Array):
            out = Xa.map_blocks(
                _project_block, mu, Ws, dtype=dtype, chunks=(Xa.chunks[0], (Ws.shape[1],)),
                meta=np.empty((0, 0), dtype),
            )
            return inp.wrap(out, self.get_feature_names_out())
        out = np.empty((Xa.shape[0], Ws.shape[1]), dtype)
        rows = rows_per_block(Xa.shape[1] * dtype.itemsize)
        for s in range(0, Xa.shape[0], rows):
            out[s : s + rows] = _project(Xa[s : s + rows], mu, Ws)
        check_finite_output(out, Xa)  # all rows at once: the error counts every bad row
        return inp.wrap(out, self.get_feature_names_out())

    def inverse_transform(self, Y):
        """Map representations back to feature space:
        ``Y[:, :k] @ components_ * scale_ + mean_`` (times ``sqrt(explained_variance_)``
        first when ``whiten``).

        With ``tradeoff > 0`` only the first k (fair) columns are used.  The result has the
        columns of ``components_``: the columns named by ``sensitive_feature_ids`` are not
        reconstructed.
        """
        self._check_fitted()
        import dask.array as da

        k = self.n_components_
        if is_xarray(Y):
            Y = Y.data
        if Y.ndim != 2 or Y.shape[1] not in (k, self._n_features_out):
            raise ValueError(f"Y must have shape (n, {k}); got {Y.shape}")
        d = self.components_.shape[1]
        scale = np.ones(d) if self.scale_ is None else self.scale_
        B = self.components_ * scale[None, :]
        if self.whiten:
            B = B * _whitening(self.explained_variance_)[:, None]
        if isinstance(Y, da.Array):
            dtype = Y.dtype if Y.dtype.kind == "f" else np.float64
            Yk = Y[:, :k].rechunk({1: -1})
            return Yk.map_blocks(
                _reconstruct_block, B.astype(dtype), self.mean_.astype(dtype), dtype=dtype,
                chunks=(Yk.chunks[0], (d,)), meta=np.empty((0, 0), dtype),
            )
        Y = np.asarray(Y)
        dtype = Y.dtype if Y.dtype.kind == "f" else np.float64
        return _reconstruct_block(Y[:, :k], B.astype(dtype), self.mean_.astype(dtype))

    # ------------------------------------------------------------------ probabilistic model
    def get_covariance(self):
        """Covariance of the features under the probabilistic PCA model (Tipping & Bishop
        1999): ``components_.T @ diag(explained_variance_ - noise_variance_) @ components_
        + noise_variance_ * I``, scikit-learn's formula (also under ``whiten``), in the
        units of X (rescaled by ``scale_`` when ``standardize``).  Shape (d, d) over the
        columns of ``components_``.
        """
        self._check_fitted()
        U, ev, noise = self._model()
        cov = (U.T * np.where(ev > noise, ev - noise, 0.0)) @ U
        cov[np.diag_indices_from(cov)] += noise
        return cov if self.scale_ is None else cov * np.outer(self.scale_, self.scale_)

    def get_precision(self):
        """The inverse of :meth:`get_covariance`, by the matrix inversion lemma as in
        scikit-learn (a k x k inverse).  Components whose variance is not above
        ``noise_variance_`` add nothing to the model (scikit-learn's formula gives them
        weight 0 too) and are left out of the lemma, where they would divide by 0: a fair
        component may hold less variance than the mean of the directions it leaves."""
        self._check_fitted()
        import scipy.linalg

        U, ev, noise = self._model()
        d = U.shape[1]
        if noise == 0.0:
            precision = scipy.linalg.inv(self.get_covariance())
            return precision
        live = ev > noise
        U, diff = U[live], (ev - noise)[live]
        precision = np.eye(d) / noise
        if len(diff):
            inner = U @ U.T / noise
            inner[np.diag_indices_from(inner)] += 1.0 / diff
            precision -= U.T @ scipy.linalg.inv(inner) @ U / noise**2
        return precision if self.scale_ is None else precision / np.outer(self.scale_, self.scale_)

    def _model(self):
        """(components, explained variances, noise variance) of the fitted space, the way
        scikit-learn's formulas take them (components scaled by sqrt(variance) when
        whitening)."""
        U, ev = self.components_, self.explained_variance_
        if self.whiten:
            U = U * np.sqrt(ev)[:, None]
        return U, ev, float(self.noise_variance_)

    def score_samples(self, X):
        """Log-likelihood of every row of X under the probabilistic PCA model (Bishop,
        *Pattern Recognition and Machine Learning*, 12.2.1), as scikit-learn's
        ``PCA.score_samples``, of the non-sensitive columns; lazy for Dask input."""
        self._check_fitted()
        inp = self._input(X, reset=False)
        self._check_layout(inp)
        precision = self.get_precision()
        from sklearn.utils.extmath import fast_logdet

        d = precision.shape[0]
        const = -0.5 * (d * math.log(2.0 * np.pi) - fast_logdet(precision))
        args = (inp.features, self.mean_, precision, const)
        import dask.array as da

        if isinstance(inp.data, da.Array):
            return inp.data.map_blocks(_loglik_block, *args, drop_axis=1, dtype=np.float64,
                                       meta=np.empty((0,), np.float64))
        check_finite_input(inp.data)
        return _loglik_block(inp.data, *args)

    def score(self, X, y=None):
        """Mean log-likelihood of the rows of X (:meth:`score_samples`); y is ignored."""
        ll = self.score_samples(X)
        return float(ll.mean().compute() if hasattr(ll, "compute") else np.mean(ll))

    # ------------------------------------------------------------------ persistence
    _array_attrs = ("components_", "mean_", "scale_", "explained_variance_",
                    "explained_variance_ratio_", "singular_values_")
    _meta_attrs = ("n_features_in_", "n_samples_seen_", "n_components_", "noise_variance_")

    def save(self, path, *, statistics: bool = False, overwrite: bool = False) -> Path:
        """Save the fitted model to directory ``path`` (arrays in .npz, metadata in JSON).

        ``statistics=True`` also saves :attr:`statistics_` (d x d float64, 330 MB at
        d = 6400) so that ``partial_fit`` can continue after :func:`load`.  Never pickles.
        ``path`` must not exist or be an empty directory; ``overwrite=True`` replaces a
        model saved by dfairpca there, atomically, and nothing else (see
        :func:`dfairpca.io.atomic_directory`).
        """
        from ._writes import atomic_directory
        from .io import save_arrays

        self._check_fitted()
        arrays = {a: getattr(self, a) for a in self._array_attrs if getattr(self, a, None) is not None}
        arrays.update(self._extra_arrays())
        meta = {
            "kind": "estimator",
            "class": type(self).__name__,
            "params": self.get_params(),
            **{a: getattr(self, a) for a in self._meta_attrs if hasattr(self, a)},
            **_input_meta(self),
            **self._extra_meta(),
        }
        with atomic_directory(path, "model", overwrite=overwrite) as tmp:
            save_arrays(tmp / "model", arrays, meta)
            if statistics:
                self.statistics_.save(tmp / "statistics")
        return Path(path)

    def _extra_meta(self) -> dict:
        return {}

    def _extra_arrays(self) -> dict:
        return {}

    def _restore_extra(self, meta: dict, arrays: dict) -> None:
        pass


class PCA(_BaseDecomposition):
    """Principal component analysis on the one-pass statistics engine.

    A drop-in for :class:`sklearn.decomposition.PCA` on data of any size: the same
    parameters, fitted attributes and numbers (``tests/test_sklearn.py``), computed from
    one chunked pass over numpy, pandas, xarray, Dask or Zarr input.

    Parameters
    ----------
    n_components : int, float in (0, 1) or None, default None
        Number of components k.  A float keeps the smallest k whose
        ``explained_variance_ratio_`` sums to more than it (as scikit-learn; it solves the
        whole d x d spectrum).  None keeps ``min(n_samples, n_features)``.  An int above
        the number of rows is an error (raised before the pass when the rows are known).
    whiten : bool, default False
        Divide every component by the square root of its explained variance in
        ``transform`` (and multiply back in ``inverse_transform``), as scikit-learn.
    svd_solver : {"auto", "full", "covariance_eigh", "randomized"}, default "auto"
        scikit-learn's parameter.  "auto", "full" and "covariance_eigh" are all the same
        exact solve here: the eigendecomposition of the d x d covariance accumulated in
        float64 by one pass (scikit-learn's "covariance_eigh", without its cancellation).
        "randomized" raises ``NotImplementedError``: matrix-free randomized passes over X
        are not built yet.  ``eigen_solver`` chooses how the local d x d problem is solved.
    iterated_power : "auto" or int >= 0, default "auto"
    n_oversamples : int >= 1, default 10
    random_state : None, int or numpy random generator, default None
        Stored for compatibility with scikit-learn; they apply to
        ``svd_solver="randomized"`` only, which is not built yet.
    center : bool, default True
        Subtract the mean.  ``False`` uses the uncentred ``X^T X`` (the paper's formula).
    standardize : bool, default False
        Divide every feature by its population standard deviation (ddof=0; features with
        zero variance are left unscaled), i.e. PCA of the correlation matrix: the same
        components, variances and transform as ``StandardScaler()`` followed by PCA.
        The probabilistic model (``get_covariance``, ``score``) is then in X's own units.
    compute_dtype : {"auto", "float32", "float64"}, default "auto"
        Dtype of the per-chunk products and of ``transform``'s output. "auto": float64 for
        float64 (and 32/64-bit integer) input, float32 otherwise.  Sums are always float64.
    split_every : int, default 8
        Fan-in of the merges that combine the pass's running sums (one per worker thread;
        each folds its share of the row chunks in place) at the end of a Dask pass.
    progress : bool, default False
        Show a progress bar during the pass (numpy input: one step per block of rows).
    eigen_solver : {"auto", "dense", "randomized"}, default "auto"
        The local d x d solve: LAPACK ``eigh`` (subset by index) or block subspace iteration
        with Rayleigh-Ritz, stopped when the captured variance changes by < 1e-8 relative;
        "auto" takes the latter for d >= 2000 and k <= d / 10 (measured faster there).

    Attributes
    ----------
    components_ : ndarray (k, d)
        Orthonormal rows, largest variance first, signs fixed (largest entry positive).
    explained_variance_, explained_variance_ratio_ : ndarray (k,)
        Variance along each component (ddof=1) and its share of the total variance.
    singular_values_ : ndarray (k,)
        ``sqrt((n - 1) * explained_variance_)``: the norms of the centred data's projections,
        scikit-learn's singular values of the centred X.
    noise_variance_ : float
        The mean variance of the discarded directions, ``(total variance - sum of
        explained_variance_) / (min(n, d) - k)`` (0 when k = min(n, d)): the probabilistic
        PCA model's noise, scikit-learn's definition.
    mean_ : ndarray (d,)
    scale_ : ndarray (d,) or None
    n_features_in_, n_samples_seen_, n_components_ : int
    feature_names_in_ : ndarray of str
        X's column names when X was a DataFrame with text column names.
    statistics_ : Moments
        The additive statistics the model was solved from.

    Examples
    --------
    >>> import numpy as np, dfairpca
    >>> X = np.random.default_rng(0).normal(size=(100, 5))
    >>> dfairpca.PCA(n_components=2).fit(X).transform(X).shape
    (100, 2)
    """

    def __init__(self, n_components=None, *, whiten=False, svd_solver="auto",
                 iterated_power="auto", n_oversamples=10, random_state=None, center=True,
                 standardize=False, compute_dtype="auto", split_every=8, progress=False,
                 eigen_solver="auto"):
        self.n_components = n_components
        self.whiten = whiten
        self.svd_solver = svd_solver
        self.iterated_power = iterated_power
        self.n_oversamples = n_oversamples
        self.random_state = random_state
        self.center = center
        self.standardize = standardize
        self.compute_dtype = compute_dtype
        self.split_every = split_every
        self.progress = progress
        self.eigen_solver = eigen_solver

    def fit(self, X, y=None, *, checkpoint=None, keep_checkpoint=False):
        """Fit on X (numpy, pandas, xarray, Dask or Zarr; (n, d) or (n, h, w)) in one pass.

        ``checkpoint``: a directory where the pass saves its running statistics after every
        segment of chunks; a fit interrupted (Ctrl-C raises
        :class:`~dfairpca.checkpoint.PassInterrupted`) and run again with the same
        checkpoint skips the finished segments, after checking that their rows are the
        ones it folded (see :mod:`dfairpca.checkpoint`; other data is refused with
        :class:`~dfairpca.checkpoint.CheckpointMismatch`).  ``keep_checkpoint``: keep the
        checkpoint after a successful fit; by default it is deleted then.
        """
        self._check_params()
        inp = self._input(X, reset=True, min_samples=2)
        (Xa,) = with_known_rows(inp.data)
        self._check_k(Xa.shape[1], Xa.shape[0])  # rows now known, also of a filtered Dask X
        self.fit_statistics(self._pass(Xa, checkpoint=checkpoint))
        _release(checkpoint, keep_checkpoint)
        return self

    def validate_fit(self, X, y=None):
        """Raise the error ``fit(X, y)`` would raise for the parameters and X's shape.

        Reads no data: the command line calls it before it connects to a cluster.
        """
        self._check_params()
        inp = self._input(X, reset=None, min_samples=2)
        self._check_k(inp.data.shape[1], inp.data.shape[0])

    def partial_fit(self, X, y=None):
        """Add the rows of X to what was seen so far and refit (equals fit on the union).

        Until ``n_components`` rows have been seen only the statistics are kept.
        """
        self._check_params()
        inp = self._input(X, reset=not hasattr(self, "statistics_"))
        (Xa,) = with_known_rows(inp.data)
        self._check_previous(Xa.shape[1])
        self._check_k(Xa.shape[1])
        m = self._pass(Xa)
        if hasattr(self, "statistics_"):
            m = merge([self.statistics_, m])
        if _whole(self.n_components) and m.n < self.n_components:
            self._keep_statistics(m)
            return self
        return self.fit_statistics(m)

    def _keep_statistics(self, m: Moments) -> None:
        """Record the statistics of a partial_fit that cannot be solved yet."""
        self.statistics_ = m
        self.n_samples_seen_ = int(m.n)

    def fit_statistics(self, statistics: Moments):
        """Solve from precomputed (e.g. merged or loaded) statistics."""
        self._check_params()
        self._check_k(statistics.n_features, statistics.n)
        S, scale, e = self._space(statistics)
        U = self._pca_solve(S, statistics.n)
        self._set_fitted(statistics, U, S, scale, e)
        return self

    def _check_k(self, d, n=None):
        """Raise unless ``n_components <= min(n, d)`` (n: rows, when known)."""
        k = self.n_components
        if not _whole(k):
            return
        if k > d:
            raise ValueError(f"n_components={k} is too large: X has {d} features")
        _check_rows(k, n, min(d, n) if _known(n) else d, "rows")

    def _check_previous(self, d):
        if hasattr(self, "statistics_") and d != self.statistics_.n_features:
            raise ValueError(f"X has {d} features; earlier partial_fit calls had "
                             f"{self.statistics_.n_features}")


class FairPCA(PCA):
    """Fair PCA (Kleindessner, Donini, Russell & Zafar, AISTATS 2023).

    The best k-dimensional orthonormal projection under which every group of every
    protected attribute has the same mean (Alg. 1 for two groups, Alg. 2 for m groups,
    Sec. 3.5 for several attributes): the top-k eigenvectors of the covariance restricted
    to the orthogonal complement of the group-mean deviations.  With p attributes of
    m_1, ..., m_p groups (and q numeric attributes, see ``sensitive_feature_ids``) at most
    ``d - sum(m_r) + p - q`` components exist.

    Parameters
    ----------
    n_components : int, float in (0, 1) or None, default None
        k; None takes the largest allowed, ``d - sum(m_r) + p - q`` (at most n).  A float
        keeps the smallest k whose ``explained_variance_ratio_`` (shares of the *total*
        variance, as scikit-learn's) sums to more than it; a fraction the fair subspace
        cannot hold is an error naming what it holds.  Not with ``equalize_covariance``.
    sensitive_feature_ids : list of column names or int, default None
        The protected attributes as columns of X, as fairlearn's ``CorrelationRemover``
        takes them: names of a DataFrame's (or a DataArray's feature coordinate's) columns,
        or integer indices.  They are left out of the projection, in ``fit`` and in
        ``transform`` (which takes the same full-width X): ``n_features_in_`` counts them,
        ``components_`` does not.  A column of text or categories is group labels (every
        group gets the same mean).  A numeric column z is a number, as in
        CorrelationRemover: the components are made uncorrelated with it
        (``cov(X U, z) = 0``); for a two-valued column (0/1) that is exactly equal group
        means, and for one-hot columns exactly equal means of the encoded groups, but
        integer codes 0, 1, 2, ... of more groups are only decorrelated from the code:
        one-hot encode them, or give them as text, categories or ``sensitive_features=``.
        The covariances are then the constraint, so the pass runs its products in float64
        (``compute_dtype="auto"``).  Giving both this and ``sensitive_features=`` is an
        error.  Works for numpy, pandas, xarray and Dask input (for Dask nothing is read
        beyond the pass itself, but text columns of a Dask DataFrame are computed first).
    whiten, svd_solver, iterated_power, n_oversamples, random_state : as in :class:`PCA`
    center, standardize, compute_dtype, split_every, progress, eigen_solver : as in :class:`PCA`
    constraint : {"demographic_parity", "equal_opportunity"}
        "equal_opportunity" (Sec. 3.2) fits on the rows with ``y == 1`` only, both the
        covariance and the group means.
    tradeoff : float in [0, 1], default 0
        λ of Sec. 3.1.  ``transform`` returns ``[X U_fair, λ X U_pca]`` of shape (n, 2k)
        when λ > 0 and (n, k) when λ = 0 (named "fairpca0", ... and "fairpca_standard0",
        ... by ``get_feature_names_out``).  λ enters linearly; the paper's experiments
        swept λ = (i/10)^3, so pass ``tradeoff=t**3`` to reproduce that grid.  Only the
        fair half is fair (and certified, see ``fairness_violation_``): the λ-scaled
        standard half is, by design, not.  ``whiten`` whitens each half by its own
        variances before λ scales the standard one.
    equalize_covariance : None, float in (0, 1] or int, default None
        Fair PCA-S (Sec. 3.6): also (approximately) equalise the group covariances by
        searching only the l directions of the fair subspace along which they differ least;
        a float f gives the paper's "Fair PCA-S (f)", ``l = max(k, floor(f d))``, an int is
        l itself.  Smaller l, fairer covariances, less variance.  Needs per-group d x d
        statistics, accumulated in the same single pass.  Two groups follow the paper;
        with more groups (or attributes) the directions minimise
        ``sum_g (n_g/n) ||R^T (Sigma_g - Sigma_pooled) R v||^2`` (equal to the paper's
        choice for two groups), see :func:`dfairpca._solvers.equalizing_basis`.  Group
        labels only (numeric attributes have no groups).

    Attributes
    ----------
    components_ : ndarray (k, d)
        The fair projection (rows orthonormal and orthogonal to every group-mean deviation
        and to the covariance with every numeric attribute), over the non-sensitive columns.
    standard_components_ : ndarray (k, d) or None
        Standard PCA from the same statistics, used when ``tradeoff > 0``.
    standard_explained_variance_ : ndarray (k,) or None
        Their variances (for ``whiten``), when ``tradeoff > 0``.
    explained_variance_ratio_ : ndarray (k,)
        Shares of the total variance of the non-sensitive columns.
    noise_variance_ : float
        ``(total variance - sum of explained_variance_) / (min(n, d) - k)``, the mean
        variance outside the fair components (scikit-learn's definition over the full
        covariance).  With the components fixed this is the maximum-likelihood noise of the
        probabilistic PCA model, so ``get_covariance``, ``score`` and ``score_samples`` are
        that model of the fair components (for ``PCA`` it is scikit-learn's number).
    groups_ : list of ndarray
        Labels seen, per attribute given as labels.
    attribute_names_ : list of str
        The attributes given as labels, then the numeric ones.
    sensitive_feature_indices_ : ndarray of int
        Positions in X of the columns named by ``sensitive_feature_ids`` (empty without).
    numeric_sensitive_columns_ : ndarray of int
        Positions, among the columns of ``statistics_``, of the numeric attributes.
    n_constraints_ : int
        Rank of the constraint (number of directions removed).  A group whose mean equals
        the overall mean to float64 rounding (:meth:`Moments.deviation_floor`), or a numeric
        attribute whose covariance with the features is rounding, imposes none, with a
        warning naming it.
    fairness_violation_ : float
        The fit's certificate: the largest share ``|U^T v| / |v|`` of any constraint vector
        v that ``components_`` keep, computed in float64 from the statistics after the
        solve, in the fitted feature space (standardized when ``standardize``; over the
        ``y == 1`` rows for equal opportunity).  v is a group's mean deviation
        ``mu_g - mu``, or a numeric attribute's covariance with the features.  A fit above
        :data:`dfairpca._solvers.FAIRNESS_TOLERANCE` (1e-8) raises ``ValueError``; typical
        values are 1e-16 to 1e-14.
    fairness_violation_per_attribute_ : ndarray (p + q,)
        The same, per protected attribute (in the order of ``attribute_names_``).
    constraint_basis_ : ndarray (d, n_constraints_)
        Orthonormal basis of the removed directions (in the standardised space when
        ``standardize``); ``I - Q Q^T`` is fair PCA at the largest k.
    group_means_ : list of ndarray (m_r, d)
        Mean of every group of every attribute given as labels, in the training data.
    max_components_ : int
        ``d - sum(m_r) + p - q``.
    explained_variance_, singular_values_, mean_, scale_, n_features_in_, feature_names_in_,
    n_samples_seen_, statistics_ : as in :class:`PCA`.

    Examples
    --------
    >>> import numpy as np, dfairpca
    >>> rng = np.random.default_rng(0)
    >>> X, z = rng.normal(size=(200, 6)), rng.integers(0, 2, 200)
    >>> X[z == 1] += 1.0
    >>> Y = dfairpca.FairPCA(n_components=2).fit_transform(X, sensitive_features=z)
    >>> bool(np.allclose(Y[z == 0].mean(0), Y[z == 1].mean(0)))
    True
    >>> Xz = np.column_stack([z, X])  # the attribute as column 0 of X, e.g. in a Pipeline
    >>> Y2 = dfairpca.FairPCA(2, sensitive_feature_ids=[0]).fit_transform(Xz)
    >>> bool(np.allclose(np.abs(Y2), np.abs(Y)))
    True
    """

    def __init__(self, n_components=None, *, sensitive_feature_ids=None, whiten=False,
                 svd_solver="auto", iterated_power="auto", n_oversamples=10, random_state=None,
                 center=True, standardize=False, constraint="demographic_parity", tradeoff=0.0,
                 equalize_covariance=None, compute_dtype="auto", split_every=8, progress=False,
                 eigen_solver="auto"):
        super().__init__(n_components, whiten=whiten, svd_solver=svd_solver,
                         iterated_power=iterated_power, n_oversamples=n_oversamples,
                         random_state=random_state, center=center, standardize=standardize,
                         compute_dtype=compute_dtype, split_every=split_every, progress=progress,
                         eigen_solver=eigen_solver)
        self.sensitive_feature_ids = sensitive_feature_ids
        self.constraint = constraint
        self.tradeoff = tradeoff
        self.equalize_covariance = equalize_covariance

    def _check_params(self):
        super()._check_params()
        if self.constraint not in CONSTRAINTS:
            raise ValueError(f"constraint must be one of {CONSTRAINTS}; got {self.constraint!r}")
        t = self.tradeoff
        if not isinstance(t, numbers.Real) or isinstance(t, bool) or not 0.0 <= t <= 1.0:
            raise ValueError(f"tradeoff must be a number in [0, 1]; got {t!r}")
        e = self.equalize_covariance
        if e is not None:
            if isinstance(e, bool) or not isinstance(e, numbers.Real):
                raise ValueError(f"equalize_covariance must be None, a fraction in (0, 1] or an int; got {e!r}")
            if isinstance(e, numbers.Integral):
                if _whole(self.n_components) and e < self.n_components:
                    raise ValueError(
                        f"equalize_covariance={e} directions cannot hold n_components="
                        f"{self.n_components}; pass l >= k or a fraction in (0, 1]"
                    )
            elif not 0.0 < e <= 1.0:
                raise ValueError(f"equalize_covariance as a fraction must be in (0, 1]; got {e!r}")
            if self.n_components is not None and not _whole(self.n_components):
                raise ValueError(
                    f"n_components={self.n_components} (a fraction of the variance) cannot be "
                    "combined with equalize_covariance, whose l depends on k: pass an int k"
                )

    def _prepare(self, X, groups, y, partial, reset):
        """(X's pass columns, encoded group labels or None, y == 1 mask or None), checked,
        with k checked against the rows unless ``partial``; ``reset`` as in
        :func:`dfairpca._validation.check_input`."""
        self._check_params()
        inp = self._input(X, reset=reset, min_samples=1 if partial else 2)
        labels = group_labels(self, inp, groups)
        Xa, labels, y = with_known_rows(inp.data, labels, y)
        n, width = Xa.shape
        mask = binary_target(y, n) if self.constraint == "equal_opportunity" else None
        g = None if labels is None else encode_groups(labels, n, mask=mask, require_two=not partial)
        names = ([] if g is None else list(g.names)) + inp.numeric_names
        if reset:
            self.sensitive_feature_indices_ = inp.sensitive
            self.numeric_sensitive_columns_ = inp.numeric
            self.attribute_names_ = names
        elif reset is False and hasattr(self, "statistics_"):
            self._check_layout_of(inp)
        if not partial:
            fitted = n if mask is None else int(np.count_nonzero(mask))
            ms = [] if g is None else [len(c) for c in g.categories]
            self._check_k_groups(width - len(inp.numeric), ms, fitted, len(inp.numeric))
        return Xa, g, mask, len(inp.numeric) > 0

    def _check_layout_of(self, inp: Input) -> None:
        """Raise unless a later partial_fit's X has its sensitive columns where the first had."""
        if not (np.array_equal(inp.sensitive, self.sensitive_feature_indices_)
                and np.array_equal(inp.numeric, self.numeric_sensitive_columns_)):
            raise ValueError(
                "X's sensitive columns differ from those of the earlier partial_fit calls: "
                "give the same columns, with the same dtypes"
            )

    def fit(self, X, y=None, *, sensitive_features=None, checkpoint=None,
            keep_checkpoint=False):
        """Fit on X with protected attribute(s) ``sensitive_features`` in one pass over X.

        Parameters
        ----------
        X : (n, d) or (n, h, w) numpy, pandas, xarray, Dask or Zarr array (or a path to a
            Zarr array)
        y : (n,) binary task label, used only by ``constraint="equal_opportunity"``; it is
            never taken for the protected attribute
        sensitive_features : (n,) labels of any type, (n, p) array, list of p label vectors,
            or a pandas/Dask DataFrame (one column per attribute); required unless
            ``sensitive_feature_ids`` names columns of X (keyword only, as in fairlearn,
            so scikit-learn's metadata routing can pass it)
        checkpoint : path, optional
            Resumable pass, as in :meth:`PCA.fit`.
        keep_checkpoint : bool, default False
            Keep ``checkpoint`` after a successful fit (by default it is deleted).
        """
        Xa, g, mask, numeric = self._prepare(X, sensitive_features, y, partial=False, reset=True)
        self.fit_statistics(self._pass(Xa, g, mask, checkpoint, numeric=numeric))
        _release(checkpoint, keep_checkpoint)
        return self

    def validate_fit(self, X, y=None, *, sensitive_features=None):
        """Raise the error ``fit`` would raise for the parameters, X's shape and the groups.

        Reads no data of X (only the row counts of a Dask array of unknown chunk sizes):
        the command line calls it before it connects to a cluster.
        """
        self._prepare(X, sensitive_features, y, partial=False, reset=None)

    def fit_transform(self, X, y=None, *, sensitive_features=None):
        """``fit(X, y, sensitive_features=...).transform(X)`` (two passes over X)."""
        return self.fit(X, y, sensitive_features=sensitive_features).transform(X)

    def partial_fit(self, X, y=None, *, sensitive_features=None):
        """Add the rows of X and refit; a sequence of calls equals one fit on the union."""
        first = not hasattr(self, "statistics_")
        Xa, g, mask, numeric = self._prepare(X, sensitive_features, y, partial=True, reset=first)
        self._check_previous(Xa.shape[1])
        p = 0 if g is None else g.n_attributes
        if not first and len(self.statistics_.attributes) != p:
            raise ValueError(
                f"groups has {p} attribute(s); earlier partial_fit calls had "
                f"{len(self.statistics_.attributes)}"
            )
        m = self._pass(Xa, g, mask, numeric=numeric)
        if not first:
            m = merge([self.statistics_, m])
        num = self.numeric_sensitive_columns_
        if any(np.sum(a.counts > 0) < 2 for a in m.attributes) or (
                _whole(self.n_components) and m.n < self.n_components) or (
                len(num) and m.n < 2) or np.any(np.diagonal(m.symmetrize().scatter)[num] == 0):
            # not solvable yet (a piece may hold a single group, a constant numeric
            # attribute, or fewer than k rows)
            self._keep_statistics(m)
            return self
        return self.fit_statistics(m)

    def _check_k_groups(self, d, ms, n=None, q: int = 0):
        """The largest k the attributes allow, ``d - sum(m_r) + p - q``; raise if
        n_components exceeds it or the n fitted rows (when known)."""
        limit = d - sum(ms) + len(ms) - q
        k = self.n_components
        numeric = f" and {q} numeric attribute(s)" if q else ""
        if limit < 1:
            raise ValueError(
                f"no fair projection exists: {d} features cannot absorb "
                f"{sum(ms) - len(ms) + q} constraints from groups of sizes {ms}{numeric}"
            )
        if _whole(k) and k > limit:
            desc = " and ".join(f"{m} groups" for m in ms) or "no groups"
            formula = (f"d - sum(m) + p = {d} - {sum(ms)} + {len(ms)} = {limit}" if not q else
                       f"d - sum(m) + p - q = {d} - {sum(ms)} + {len(ms)} - {q} = {limit}")
            raise ValueError(
                f"n_components={k} is too large: with {desc}{numeric} the largest k is {formula}"
            )
        what = "rows with y == 1" if self.constraint == "equal_opportunity" else "rows"
        _check_rows(k if _whole(k) else None, n, min(limit, n) if _known(n) else limit, what)
        return limit

    def fit_statistics(self, statistics: Moments):
        """Solve fair PCA from precomputed (merged, loaded) statistics, and certify it.

        The statistics' columns are the features, except those of
        ``numeric_sensitive_columns_`` (set by ``fit``; none for statistics computed
        elsewhere, which then need group labels).  After the solve, the share of every
        constraint vector that the components keep is measured in float64
        (``fairness_violation_``); a fit above
        :data:`~dfairpca._solvers.FAIRNESS_TOLERANCE` raises ``ValueError``.
        """
        self._check_params()
        m = statistics.symmetrize()
        num = np.asarray(getattr(self, "numeric_sensitive_columns_", ()), dtype=np.intp)
        p, q = len(m.attributes), len(num)
        if p + q == 0:
            raise ValueError("these statistics carry no groups; FairPCA needs protected attributes")
        if q and num.max() >= m.n_features:
            raise ValueError(f"numeric_sensitive_columns_ {num.tolist()} exceed the statistics' "
                             f"{m.n_features} columns")
        names = list(getattr(self, "attribute_names_", None) or [])
        if len(names) != p + q:
            names = [f"attribute {j}" for j in range(p + q)]
        for name, a in zip(names, m.attributes):
            present = int(np.sum(a.counts > 0))
            if present < 2:
                raise ValueError(
                    f"{name} has {present} non-empty group(s) among the rows seen; fair PCA "
                    "needs at least two"
                )
        keep = np.setdiff1d(np.arange(m.n_features), num)
        mf = _columns(m, keep) if q else m
        ms = [int(np.sum(a.counts > 0)) for a in mf.attributes]
        limit = self._check_k_groups(mf.n_features, ms, m.n, q)
        if self.equalize_covariance is not None and not p:
            raise ValueError("equalize_covariance equalises the covariances of groups: give the "
                             "protected attribute as group labels, or leave it None")
        S, scale, e = self._space(mf)
        C = self._constraints(mf, names[:p])
        if q:
            C = np.vstack([C, _numeric_constraints(m, num, keep, names[p:])])
        if scale is not None:
            C = C / scale[None, :]
        Q = _solvers.constraint_basis(C)
        U = self._fair_solve(S, Q, mf, scale, min(limit, m.n))
        k = U.shape[0]
        sizes = [a.n_groups for a in mf.attributes] + [1] * q
        per_group = np.split(_solvers.constraint_violation(U, C), np.cumsum(sizes)[:-1])
        categories = [a.categories for a in mf.attributes] + [None] * q
        certify(per_group, names, categories, m.precision, type(self).__name__)
        self._set_fitted(mf, U, S, scale, e)
        self.statistics_ = m
        self.fairness_violation_per_attribute_ = np.array([float(v.max(initial=0.0)) for v in per_group])
        self.fairness_violation_ = float(self.fairness_violation_per_attribute_.max())
        self.n_constraints_ = Q.shape[1]
        self.constraint_basis_ = Q
        self.group_means_ = [mf.group_means(j) for j in range(p)]
        self.max_components_ = limit
        self.groups_ = [a.categories for a in mf.attributes]
        self.attribute_names_ = list(names)
        self.standard_components_ = self.standard_explained_variance_ = None
        if self.tradeoff > 0:
            V = _solvers.pca_components(S, k, self.eigen_solver)
            self.standard_components_ = V
            with np.errstate(over="ignore", under="ignore"):
                self.standard_explained_variance_ = np.ldexp(
                    np.sum((V @ S) * V, axis=1) / (m.n - 1), 2 * e)
        return self

    def _fair_solve(self, S, Q, mf: Moments, scale, largest: int) -> np.ndarray:
        """Fair components (k, d) for ``n_components`` (int, fraction or None; None and a
        fraction consider the ``largest`` allowed)."""
        k = self.n_components
        if _whole(k):
            terms = self._covariance_terms(mf, scale, k, Q.shape[1])
            return _solvers.fair_components(S, Q, k, *terms, solver=self.eigen_solver)
        if k is None:
            terms = self._covariance_terms(mf, scale, largest, Q.shape[1])
            return _solvers.fair_components(S, Q, largest, *terms, solver=self.eigen_solver)
        U = _solvers.fair_components(S, Q, largest, solver="dense")
        captured = np.sum((U @ S) * U, axis=1)
        return U[: _fraction_to_k(captured, np.trace(S), k, "the fair subspace")]

    @staticmethod
    def _constraints(m: Moments, names) -> np.ndarray:
        """The constraint matrix (rows ``n_g (mean_g - mean)``), with the rows of groups whose
        mean is the overall mean to float64 rounding set to 0, with a warning for each."""
        C = m.constraint_matrix()
        if not m.attributes:
            return C
        counts = np.concatenate([a.counts for a in m.attributes]).astype(np.float64)
        floor = m.deviation_floor()
        # a deviation is rounding only if it is within the rounding bound in every feature
        with np.errstate(over="ignore", under="ignore", invalid="ignore"):
            dev = np.abs(C) / np.maximum(counts, 1.0)[:, None]
        zero = (counts > 0) & np.all(dev <= floor[None, :], axis=1)
        if zero.any():
            start = 0
            for name, a in zip(names, m.attributes):
                hit = np.flatnonzero(zero[start : start + a.n_groups])
                start += a.n_groups
                if hit.size:
                    labels = ", ".join(str(a.categories[i]) for i in hit)
                    word = "group" if hit.size == 1 else "groups"
                    warnings.warn(
                        f"{word} {labels} of {name}: the mean of each equals the overall mean to "
                        "float64 rounding in every feature (within 2 n eps of the feature's root "
                        "mean square, the rounding bound of means of these rows), so they impose "
                        "no constraint and none is kept for them",
                        UserWarning, stacklevel=4,
                    )
            C[zero] = 0.0
        return C

    def _covariance_terms(self, m: Moments, scale, k: int, r: int):
        """(cov_diffs, l) for Fair PCA-S, or (None, None)."""
        e = self.equalize_covariance
        if e is None:
            return None, None
        d = m.n_features
        l = int(e) if isinstance(e, numbers.Integral) else max(k, int(np.floor(e * d)))
        if l >= d - r:  # the whole fair subspace: plain fair PCA (the paper's "S(1.0)")
            return None, None
        if not m.has_group_scatter:
            raise ValueError(
                "these statistics hold no per-group scatter matrices; fit with "
                "equalize_covariance set so that the pass accumulates them"
            )
        inv = 1.0 if scale is None else 1.0 / np.outer(scale, scale)
        covs = []  # per attribute: [(n_g, Sigma_g)] of the groups with two or more rows
        for a in m.attributes:
            covs.append([(c, a.scatter[g] / (c - 1) * inv) for g, c in enumerate(a.counts) if c > 1])
        if len(covs) == 1 and len(covs[0]) == 2:
            return [(1.0, covs[0][0][1] - covs[0][1][1])], l
        diffs = []
        for groups in covs:
            n = sum(c for c, _ in groups)
            pooled = sum(c / n * cov for c, cov in groups)
            diffs += [(c / n, cov - pooled) for c, cov in groups]
        return diffs, l

    def _projection(self):
        W = super()._projection()
        V = getattr(self, "standard_components_", None)
        if self.tradeoff > 0 and V is not None:
            V = V.T
            if self.whiten:
                V = V / _whitening(self.standard_explained_variance_)
            return np.concatenate([W, self.tradeoff * V], axis=1)
        return W

    def get_feature_names_out(self, input_features=None):
        """"fairpca0", ... for the fair components, then "fairpca_standard0", ... for the
        λ-scaled standard ones when ``tradeoff > 0``."""
        return fair_feature_names(self, super().get_feature_names_out(input_features))

    _array_attrs = _BaseDecomposition._array_attrs + ("standard_components_", "constraint_basis_",
                                                      "standard_explained_variance_")
    _meta_attrs = _BaseDecomposition._meta_attrs + ("n_constraints_", "max_components_", "attribute_names_",
                                                    "fairness_violation_")

    def _extra_meta(self):
        return {"groups_": [_categories_to_json(c) for c in self.groups_],
                "fairness_violation_per_attribute_": [float(v) for v in self.fairness_violation_per_attribute_]}

    def _extra_arrays(self):
        return {f"group_means_{j}": gm for j, gm in enumerate(self.group_means_)}

    def _restore_extra(self, meta, arrays):
        self.groups_ = [_categories_from_json(c) for c in meta["groups_"]]
        self.group_means_ = [arrays[f"group_means_{j}"] for j in range(len(self.groups_))]
        if "fairness_violation_per_attribute_" in meta:
            self.fairness_violation_per_attribute_ = np.array(meta["fairness_violation_per_attribute_"], float)


def fair_feature_names(est, names) -> np.ndarray:
    """``names`` ("<class>0", ...) with the λ-scaled standard half of a ``tradeoff > 0``
    model named "<class>_standard0", ... (the first k stay the fair ones)."""
    k = est.n_components_
    if len(names) == k:
        return names
    prefix = type(est).__name__.lower()
    return np.asarray([f"{prefix}{i}" for i in range(k)] + [f"{prefix}_standard{i}" for i in range(k)],
                      dtype=object)


def _whole(k) -> bool:
    """Whether n_components is an int (not None, not a fraction)."""
    return isinstance(k, numbers.Integral) and not isinstance(k, bool)


def _fraction_to_k(variances, total: float, fraction: float, where: str) -> int:
    """The smallest k whose first k ``variances`` (descending) exceed ``fraction`` of
    ``total``, scikit-learn's rule (``searchsorted(cumsum(ratio), fraction, "right") + 1``);
    ValueError if all of them do not."""
    cumulative = np.cumsum(np.asarray(variances) / total)
    if not len(cumulative) or cumulative[-1] <= fraction:
        held = float(cumulative[-1]) if len(cumulative) else 0.0
        raise ValueError(
            f"n_components={fraction}: {where} holds {held:.2%} of the variance, not more than "
            f"{fraction:.2%}; pass a smaller fraction or an int"
        )
    return int(np.searchsorted(cumulative, fraction, side="right")) + 1


def _noise_variance(captured: np.ndarray, total: float, rank: int) -> float:
    """Mean variance of the ``rank - k`` directions the k components leave (0 if none):
    scikit-learn's ``noise_variance_``, the probabilistic PCA model's sigma^2."""
    k = len(captured)
    if k >= rank:
        return 0.0
    return max(float(total - np.sum(captured)), 0.0) / (rank - k)


def _whitening(variances) -> np.ndarray:
    """sqrt of the variances, those below float64 eps raised to it (scikit-learn's guard for
    rank-deficient data: whitening must not divide by 0)."""
    scale = np.sqrt(np.maximum(np.asarray(variances, dtype=np.float64), 0.0))
    return np.maximum(scale, np.finfo(np.float64).eps)


def _columns(m: Moments, keep: np.ndarray) -> Moments:
    """The statistics of the columns ``keep`` of the rows m was computed from (every
    statistic restricts column-wise; the rows, counts and precision are m's)."""
    import dataclasses

    ix = np.ix_(keep, keep)
    attrs = [dataclasses.replace(a, deviation=a.deviation[:, keep],
                                 scatter=None if a.scatter is None else a.scatter[:, keep][:, :, keep])
             for a in m.attributes]
    return dataclasses.replace(m.symmetrize(), mean=m.mean[keep], scatter=m.scatter[ix], attributes=attrs)


def _numeric_constraints(m: Moments, num: np.ndarray, keep: np.ndarray, names) -> np.ndarray:
    """Rows ``sum_i (z_i - mean z)(x_i - mean x)`` (in the scatter's units) of the numeric
    attributes z (columns ``num`` of m) against the features (``keep``).

    A row below the rounding of such a sum (at most ``2 n eps |z - mean z| |X - mean X|``
    for products in the statistics' precision eps, by Cauchy-Schwarz) is set to 0 with a
    warning: that attribute is uncorrelated with the features to rounding and constrains
    nothing.  A constant attribute (spread below the rounding of its mean) is an error.
    """
    S = m.scatter
    C = S[np.ix_(num, keep)].copy()
    zz = np.maximum(np.diagonal(S)[num], 0.0)
    ff = max(float(np.trace(S[np.ix_(keep, keep)])), 0.0)
    eps = float(np.finfo(np.float64).eps)
    spread = np.ldexp(np.sqrt(zz / max(m.n, 1)), m.scatter_exponent)
    for j, name in enumerate(names):
        if spread[j] <= 2 * m.n * eps * abs(m.mean[num[j]]) or zz[j] == 0:
            raise ValueError(
                f"{name} is constant over the rows fitted, so it tells no one apart; drop it "
                "from sensitive_feature_ids"
            )
    floor = 2.0 * m.n * m.precision * np.sqrt(zz * ff)
    zero = _solvers.row_norms(C) <= floor
    for j in np.flatnonzero(zero):
        warnings.warn(
            f"{names[j]}: its covariance with the features is float64 rounding (below "
            f"{floor[j]:.2e} in the scatter's units), so it imposes no constraint and none is kept",
            UserWarning, stacklevel=4,
        )
    C[zero] = 0.0
    return C


def _input_meta(est) -> dict:
    """What a saved model keeps of the input's layout: column names, sensitive columns."""
    out = {}
    if hasattr(est, "feature_names_in_"):
        out["feature_names_in_"] = [str(c) for c in est.feature_names_in_]
    for a in ("sensitive_feature_indices_", "numeric_sensitive_columns_"):
        if hasattr(est, a):
            out[a] = [int(i) for i in getattr(est, a)]
    return out


def _known(n) -> bool:
    """Whether a row count is known (a Dask array of unknown chunk sizes has NaN rows)."""
    return n is not None and not (isinstance(n, float) and np.isnan(n))


def _check_rows(k, n, largest: int, what: str) -> None:
    """Raise if k exceeds the n fitted rows (checked before the pass wherever n is known)."""
    if k is not None and _known(n) and k > n:
        raise ValueError(
            f"n_components={k} is too large: X has {int(n)} {what}, fewer than k; the "
            f"largest k is {int(largest)}"
        )


def certify(per_group, names, categories, precision: float, estimator: str,
            fix: str | None = None) -> None:
    """Raise ``ValueError`` if any constraint vector keeps more than ``FAIRNESS_TOLERANCE``
    of itself under the fitted components (``per_group``: one array per attribute, from
    :func:`dfairpca._solvers.constraint_violation`), naming it and the fixes.

    ``categories`` holds each attribute's group labels, or None for a numeric attribute
    (one vector: its covariance with the features).  ``fix``: the estimator's own remedy,
    in place of the linear estimators' (compute_dtype, standardize)."""
    worst, where = 0.0, None
    for name, cats, v in zip(names, categories, per_group):
        if len(v) and v.max() > worst:
            worst = float(v.max())
            where = (name, None if cats is None else cats[int(np.argmax(v))])
    if worst <= _solvers.FAIRNESS_TOLERANCE:
        return
    name, group = where
    if isinstance(group, np.generic):  # 0, not np.int64(0)
        group = group.item()
    dtype_fix = ("compute_dtype='float64' (the products ran in float32), "
                 if precision > np.finfo(np.float64).eps else "")
    fix = fix or f"{dtype_fix}standardize=True if the features differ greatly in scale"
    what = (f"the covariance with {name}" if group is None else
            f"the mean deviation of group {group!r} of {name}")
    drop = f"drop {name} from sensitive_feature_ids" if group is None else f"merge or drop group {group!r}"
    raise ValueError(
        f"{estimator} could not satisfy its fairness constraint: the components keep "
        f"{worst:.2e} of {what} (tolerance "
        f"{_solvers.FAIRNESS_TOLERANCE:g}); the constraint vectors are too close to "
        f"linearly dependent or too different in size for float64. Fit with {fix}, "
        f"or {drop}"
    )


def _release(checkpoint, keep: bool) -> None:
    """Delete a successful fit's checkpoint unless the caller keeps it."""
    if checkpoint is not None and not keep:
        from ._writes import remove_directory

        remove_directory(checkpoint, "checkpoint")


def _project(x, mu, W):
    """``(x - mu) @ W`` in W's dtype."""
    x = np.asarray(x)
    with np.errstate(invalid="ignore", over="ignore"):  # such rows raise, named, instead
        return (x.astype(W.dtype, copy=False) - mu) @ W


def _project_block(x, mu, W, block_info=None):
    """:func:`_project` of one Dask chunk, raising for NaN/inf rows with their row numbers."""
    out = _project(x, mu, W)
    check_finite_output(out, x, *row_origin(block_info))
    return out


def _loglik_block(x, features, mean, precision, const, block_info=None):
    """Probabilistic PCA log-likelihood of each row of x (its columns ``features``)."""
    x = np.asarray(x)
    check_finite_input(x, *row_origin(block_info))
    xr = x[:, features].astype(np.float64) - mean
    return -0.5 * np.sum(xr * (xr @ precision), axis=1) + const


def _reconstruct_block(y, B, mu):
    return np.asarray(y, dtype=B.dtype) @ B + mu


_CLASSES = {"PCA": PCA, "FairPCA": FairPCA}


def load(path):
    """Load a model written by ``save``; reads only .npz arrays and JSON, never pickle.

    Everything is checked before it is trusted: meta.json's keys and types for the model's
    class, the declared shape of every array against the others (before any is read) and
    their values (finite, orthonormal components).  A truncated, edited or inconsistent
    model raises :class:`dfairpca.io.SavedFileError` naming the file and what is wrong.
    """
    from ._writes import recover_for_reading
    from .io import SavedFileError, load_arrays

    path = Path(path)
    recover_for_reading(path)  # a replace cut short: put the intact old version back
    arrays, meta = load_arrays(path / "model", kind="estimator", layout=_saved_layout)
    try:
        if meta["class"] == "FairKernelPCA":
            from .kernel import FairKernelPCA

            return FairKernelPCA._from_saved(arrays, meta)
        cls = _CLASSES[meta["class"]]
        est = cls(**meta["params"])
        for a in cls._array_attrs:
            setattr(est, a, arrays.get(a))
        for a in cls._meta_attrs:
            if a in meta:
                setattr(est, a, meta[a])
        restore_input_meta(est, meta)
        est._restore_extra(meta, arrays)
        _derive_missing(est)
        _check_saved_values(est)
    except ValueError as exc:
        raise SavedFileError(f"cannot load {str(path / 'model')!r}: {exc}; it was edited or "
                             "not written by dfairpca: save the model again") from None
    if (path / "statistics").exists():
        stats = Moments.load(path / "statistics")
        p = len(getattr(est, "groups_", []))
        width = est.components_.shape[1] + len(getattr(est, "numeric_sensitive_columns_", ()))
        if stats.n_features != width or len(stats.attributes) != p:
            raise SavedFileError(
                f"cannot load {str(path)!r}: statistics/ hold {stats.n_features} features and "
                f"{len(stats.attributes)} attributes, the model {width} and {p}; "
                "they were not saved together: save the model again"
            )
        est.statistics_ = stats
    return est


#: the classes a saved model may name: the allow-list (FairKernelPCA lives in kernel.py,
#: which imports this module)
SAVED_CLASSES = (*_CLASSES, "FairKernelPCA")


def _saved_layout(meta: dict, headers: dict) -> dict:
    """Check a saved estimator's meta.json for its class; the arrays it implies."""
    from .io import meta_value

    name = meta_value(meta, "class", SAVED_CLASSES)
    if name == "FairKernelPCA":
        from .kernel import FairKernelPCA

        return FairKernelPCA._saved_layout(meta, headers)
    cls = _CLASSES[name]
    saved_params(cls, meta)
    width = meta_value(meta, "n_features_in_", "positive")
    sensitive, numeric = saved_input_meta(meta, width)
    d = width - len(sensitive)  # the projected columns
    k = meta_value(meta, "n_components_", "positive")
    meta_value(meta, "n_samples_seen_", "count")
    noise = meta_value(meta, "noise_variance_", "number", optional=True)
    if noise is not None and noise < 0:
        raise ValueError(f"meta.json: 'noise_variance_' must be >= 0; got {noise!r}")
    if k > d:
        raise ValueError(f"meta.json: 'n_components_' {k} exceeds the {d} projected features")
    specs = {"components_": ((k, d), "f"), "mean_": ((d,), "f"),
             "scale_": ((d,), "f" if meta["params"].get("standardize") else "?f"),
             "explained_variance_": ((k,), "f"), "explained_variance_ratio_": ((k,), "f"),
             "singular_values_": ((k,), "?f")}  # absent in models saved before it was fitted
    if cls is FairPCA:
        ms = saved_groups(meta, len(numeric))
        saved_certificate(meta, len(ms) + len(numeric))
        r = meta_value(meta, "n_constraints_", "count")
        meta_value(meta, "max_components_", "int")
        if r + k > d:
            raise ValueError(f"meta.json: {k} components and {r} constraints exceed {d} features")
        specs["constraint_basis_"] = ((d, r), "f")
        specs["standard_components_"] = ((k, d), "?f")
        specs["standard_explained_variance_"] = ((k,), "?f")
        for j, m in enumerate(ms):
            specs[f"group_means_{j}"] = ((m, d), "f")
    elif sensitive:
        raise ValueError("meta.json: a PCA has no sensitive columns")
    return specs


def saved_input_meta(meta: dict, width: int) -> tuple[list, list]:
    """Check meta.json's ``feature_names_in_`` (width strings), ``sensitive_feature_indices_``
    (distinct columns of X) and ``numeric_sensitive_columns_`` (as many or fewer columns of
    the statistics); all optional.  Returns the last two."""
    from .io import meta_value

    names = meta_value(meta, "feature_names_in_", "list", optional=True)
    if names is not None and (len(names) != width or not all(isinstance(c, str) for c in names)):
        raise ValueError(f"meta.json: 'feature_names_in_' must be {width} strings; got {names!r:.80}")
    sensitive = meta_value(meta, "sensitive_feature_indices_", "list", optional=True) or []
    numeric = meta_value(meta, "numeric_sensitive_columns_", "list", optional=True) or []
    ints = all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < width
               for i in sensitive + numeric)
    if not ints or len(set(sensitive)) != len(sensitive) or len(set(numeric)) != len(numeric) \
            or len(numeric) > len(sensitive) or len(sensitive) >= width:
        raise ValueError(
            f"meta.json: 'sensitive_feature_indices_' {sensitive!r:.60} and "
            f"'numeric_sensitive_columns_' {numeric!r:.60} must be distinct columns of the "
            f"{width}, the second no more than the first, leaving a feature"
        )
    return sensitive, numeric


def restore_input_meta(est, meta: dict) -> None:
    """Set what :func:`_input_meta` saved (checked by :func:`saved_input_meta`)."""
    if "feature_names_in_" in meta:
        est.feature_names_in_ = np.asarray(meta["feature_names_in_"], dtype=object)
    takes_ids = "sensitive_feature_ids" in est.get_params()  # models saved before: none
    for a in ("sensitive_feature_indices_", "numeric_sensitive_columns_"):
        if a in meta or takes_ids:
            setattr(est, a, np.asarray(meta.get(a, []), dtype=np.intp))


def _derive_missing(est) -> None:
    """Fitted attributes a model saved before they existed lacks, from what it has:
    ``singular_values_`` from the variances, ``noise_variance_`` from them and their ratios."""
    n, ev = est.n_samples_seen_, est.explained_variance_
    if getattr(est, "singular_values_", None) is None:
        est.singular_values_ = np.sqrt(np.maximum(ev, 0.0) * max(n - 1, 0))
    if not hasattr(est, "noise_variance_"):
        ratio = est.explained_variance_ratio_
        total = float(ev.sum() / ratio.sum()) if ratio.sum() > 0 else 0.0
        est.noise_variance_ = _noise_variance(ev, total, min(n, est.components_.shape[1]))
    if isinstance(est, FairPCA) and not hasattr(est, "standard_explained_variance_"):
        est.standard_explained_variance_ = None


def saved_params(cls, meta: dict) -> dict:
    """meta.json's ``params``, checked to be ``cls``'s parameters with valid values."""
    from .io import meta_value

    params = meta_value(meta, "params", "dict")
    unknown = sorted(set(params) - set(cls._get_param_names()))
    if unknown:
        raise ValueError(f"meta.json: 'params' has keys {unknown} that {cls.__name__} does not take")
    try:
        cls(**params)._check_params()
    except (ValueError, TypeError) as exc:
        raise ValueError(f"meta.json: 'params': {exc}") from None
    return params


def saved_certificate(meta: dict, p: int) -> None:
    """Check meta.json's fairness certificate: ``fairness_violation_`` a number >= 0 and
    ``fairness_violation_per_attribute_`` p of them (both absent in models saved before
    fits were certified)."""
    from .io import meta_value

    total = meta_value(meta, "fairness_violation_", "number", optional=True)
    per = meta_value(meta, "fairness_violation_per_attribute_", "list", optional=True)
    if total is None and per is None:
        return
    ok = (total is not None and per is not None and total >= 0 and len(per) == p
          and all(isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v <= total
                  for v in per))
    if not ok:
        raise ValueError(f"meta.json: 'fairness_violation_' {total!r:.40} and "
                         f"'fairness_violation_per_attribute_' {per!r:.80} must be a number >= 0 "
                         f"and {p} numbers between 0 and it")
    if total > _solvers.FAIRNESS_TOLERANCE:  # a fit above it raises: no model carries one
        raise ValueError(f"meta.json: 'fairness_violation_' {total:g} is above the tolerance "
                         f"{_solvers.FAIRNESS_TOLERANCE:g} that every fit is certified to")


def saved_groups(meta: dict, q: int = 0) -> list[int]:
    """Group counts of each attribute from meta.json's ``groups_`` and ``attribute_names_``
    (which also names the q numeric attributes, after the labelled ones)."""
    from .io import meta_value

    groups = meta_value(meta, "groups_", "list")
    names = meta_value(meta, "attribute_names_", "list")
    if len(groups) + q < 1 or len(names) != len(groups) + q or not all(isinstance(n, str) for n in names):
        raise ValueError(f"meta.json: 'attribute_names_' must name each of the {len(groups)} "
                         f"attributes of 'groups_' and the {q} numeric ones (at least one); got "
                         f"{names!r:.80}")
    return saved_group_counts(groups, "groups_", [repr(n) for n in names[:len(groups)]])


def _check_saved_values(est) -> None:
    """ValueError if a loaded PCA/FairPCA's values contradict what a fit gives (O(k^2 d))."""
    U, tol = est.components_, 1e-6
    problem = (
        "the rows of 'components_' are not orthonormal"
        if np.abs(U @ U.T - np.eye(len(U))).max() > tol else
        "'explained_variance_' has negative entries"
        if (est.explained_variance_ < -tol * max(1.0, est.explained_variance_.max())).any() else
        "'scale_' has entries <= 0"
        if getattr(est, "scale_", None) is not None and (est.scale_ <= 0).any() else None
    )
    Q = getattr(est, "constraint_basis_", None)
    if problem is None and Q is not None and Q.size and np.abs(U @ Q).max() > tol:
        problem = "'components_' are not orthogonal to 'constraint_basis_' (the model is not fair)"
    if problem is None:
        problem = _saved_unfairness(est)
    if problem:
        raise ValueError(f"arrays.npz: {problem}")


def _saved_unfairness(est) -> str | None:
    """Whether a loaded FairPCA's components keep a share of a difference of its saved
    group means above the certificate's tolerance plus that difference's float64 rounding
    (O(d m k)): the stored certificate is recomputed, not trusted."""
    means = getattr(est, "group_means_", None)
    if not means:
        return None
    U = np.asarray(est.components_, np.float64)
    scale = getattr(est, "scale_", None)
    eps = float(np.finfo(np.float64).eps)
    names = getattr(est, "attribute_names_", None) or []
    for j, M in enumerate(means):
        M = np.asarray(M, np.float64)
        if scale is not None:
            M = M / scale[None, :]
        for g in range(1, len(M)):
            diff = M[g] - M[0]
            size = float(_solvers.row_norms(diff[None])[0])
            if not size > 0:
                continue
            kept = float(_solvers.row_norms((U @ (diff / size))[None])[0])
            rounding = 4 * eps * np.sqrt(M.shape[1]) * (
                float(_solvers.row_norms(M[[0, g]]).sum()) / size)
            if kept > _solvers.FAIRNESS_TOLERANCE + rounding:
                name = names[j] if j < len(names) else f"attribute {j}"
                return (f"'components_' keep {kept:.2e} of the difference between the saved "
                        f"means of two groups of {name} (a fair model keeps at most "
                        f"{_solvers.FAIRNESS_TOLERANCE:g}): the model is not fair")
    return None
