"""What :class:`~dfairpca.PCA` and :class:`~dfairpca.FairPCA` share: the pass, the
choice of solve (exact, :mod:`dfairpca.solve._exact`, or randomized), the fitted attributes,
the transform and the probabilistic model.

Both follow :class:`sklearn.decomposition.PCA` wherever the two meet (``n_components``
as an int, a fraction of the variance or None; ``whiten``; ``svd_solver``; the fitted
``singular_values_`` and ``noise_variance_``; the probabilistic-PCA ``get_covariance``,
``get_precision``, ``score`` and ``score_samples``; ``feature_names_in_``), with equal
numbers where both apply (``tests/test_sklearn.py``).  ``transform`` is lazy on Dask input
(``map_blocks``) and eager on numpy input.
"""

from __future__ import annotations

from pathlib import Path

import dask.array as da
import numpy as np

from ..base import _solvers
from ..engine._compute import ship
from ._probabilistic import ProbabilisticPCA, noise_variance
from ..base._compat import current
from ..base._params import (
    BOOL, SPLIT_EVERY, Check, RenamedOneOf, Rule, int_at_least, is_int, is_real, one_of,
)
from ._saved import check_linear_values, linear_layout, load_statistics
from ..base._system import rows_per_block
from ..inputs._validation import (
    Input, check_finite_output, is_xarray,
    row_origin,
)
from ..stats._exact import check_exact, check_unweighted, compute_dtype_for, is_exact, kernel_name
from ..stats.moments import Moments
from ..base._typing import ArrayInput, ArrayOutput, PathInput
from ..errors import InvalidInputError
from ..solve._choice import check_exact_memory, choose_svd_solver, memory_budget, needs_dense_message
from ..engine._checkpoint_files import saved_solver
from ..solve._randomized import fit_randomized

# Deferred imports: xarray (heavy or optional) is imported in the functions that use it, so that
# importing this module stays light.

__all__ = ["LinearDecomposition", "LINEAR_RULES", "SVD_SOLVERS", "n_components_ok"]

#: scikit-learn's ``svd_solver`` values: "full" and "covariance_eigh" are the exact solve of
#: the d x d covariance from one pass, "randomized" the matrix-free passes of
#: :mod:`dfairpca.solve._randomized`, "auto" chooses (:meth:`LinearDecomposition._fit_solver`)
SVD_SOLVERS = ("auto", "full", "covariance_eigh", "randomized")

#: why a weighted fit runs the exact solve (its passes are the one-pass statistics')
WEIGHTED_BLOCKER = ("svd_solver='randomized' does not take sample_weight (its passes sum "
                    "unweighted products): use svd_solver='full' or 'auto' for a weighted fit")


def n_components_ok(k) -> bool:
    return k is None or (is_int(k) and k > 0) or (is_real(k) and not is_int(k) and 0 < k < 1)


def _random_state_ok(r) -> bool:
    return r is None or is_int(r) or isinstance(r, (np.random.RandomState, np.random.Generator))


#: the parameters PCA and FairPCA share, with their rules, in the order they are checked
LINEAR_RULES = {
    "n_components": [Rule(n_components_ok, "a positive integer, a fraction in (0, 1) of the "
                                            "variance to keep, or None")],
    "split_every": SPLIT_EVERY,
    "compute_dtype": [Check(lambda est, v: compute_dtype_for(np.float64, v))],
    "eigen_solver": [RenamedOneOf(_solvers.EIGEN_SOLVERS)],
    "whiten": BOOL,
    "svd_solver": [one_of(SVD_SOLVERS)],
    "iterated_power": [Rule(lambda p: p == "auto" if isinstance(p, str) else is_int(p) and p >= 0,
                            "'auto' or an integer >= 0")],
    "n_oversamples": [int_at_least(1)],
    "random_state": [Rule(_random_state_ok, "None, an int or a numpy random generator")],
    "center": BOOL, "standardize": BOOL, "progress": BOOL,
}


class LinearDecomposition(ProbabilisticPCA):
    """Shared fit-from-statistics, transform, inverse_transform, the probabilistic model, save."""

    _fitted_attribute = "components_"
    #: whether the model is fair (saves groups, group means and a constraint basis)
    _fair = False
    _array_attrs: tuple[str, ...] = ("components_", "mean_", "scale_", "explained_variance_",
                    "explained_variance_ratio_", "singular_values_")
    _meta_attrs: tuple[str, ...] = ("n_features_in_", "n_samples_seen_", "n_components_",
                                    "noise_variance_", "sample_weight_sum_")

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        # float32 input is projected in float32 (compute_dtype="auto"), float64 in float64
        tags.transformer_tags.preserves_dtype = ["float64", "float32"]
        return tags

    def planned_svd_solver(self, n_features: int, *, checkpoint=None, weighted: bool = False) -> str:
        """The solve a fit of ``n_features`` features runs, known before any pass over X.

        What ``svd_solver="auto"`` chooses depends on the data's width, so a caller that
        has opened the data can say ahead of the fit which solve runs (the command line
        notes that the randomized options are unused when auto chooses the exact fit).

        Parameters
        ----------
        n_features : int
            The features of X (its columns, numeric protected attributes excluded).
        checkpoint : str or path-like, optional
            The checkpoint of a fit to resume: a resumed fit goes on with the solve it began.
        weighted : bool
            Whether the fit has ``sample_weight`` (always the exact solve).

        Returns
        -------
        str
            ``"covariance_eigh"`` (the exact eigensolve of the d x d covariance, from one
            pass) or ``"randomized"`` (matrix-free passes over X).

        Raises
        ------
        dfairpca.errors.InvalidInputError
            ``svd_solver="randomized"`` where it cannot run, or an exact fit whose d x d
            statistics do not fit in memory.
        """
        return self._fit_solver(int(n_features), checkpoint=checkpoint, weighted=weighted)

    def _fit_solver(self, d: int, *, groups: int = 0, checkpoint=None, weighted: bool = False) -> str:
        """The solve a fit of d features runs, "covariance_eigh" (the exact eigensolve of
        the d x d covariance from one pass) or "randomized" (matrix-free passes over X):
        what ``svd_solver`` names, "full" being the exact one; for "auto" the cheaper by
        :func:`dfairpca.solve._choice.choose_svd_solver` among those that can run.
        "randomized" where it cannot run raises, naming why (``groups``: the groups of all
        attributes, whose d x d covariances Fair PCA-S needs)."""
        blocker = self._randomized_blocker(d, groups) or (WEIGHTED_BLOCKER if weighted else None)
        if self.svd_solver == "randomized":
            if blocker:
                raise InvalidInputError(blocker)
            return "randomized"
        if self.svd_solver != "auto":
            return "covariance_eigh"
        # a resumed fit goes on with the solve it began (a weighted fit: always the exact one)
        saved = None if checkpoint is None or weighted else saved_solver(checkpoint)
        if saved is not None:
            return "randomized" if saved == "randomized" else "covariance_eigh"
        if blocker is None and choose_svd_solver(d, self.n_components, self.n_oversamples) == "randomized":
            return "randomized"
        check_exact_memory(d, memory_budget(), "pass svd_solver='randomized' (matrix-free: memory "
                           "O(d (k + p)))" if blocker is None else f"the matrix-free fit cannot run ({blocker})")
        return "covariance_eigh"

    def _solver_of(self, X, groups=None, checkpoint=None, weighted: bool = False) -> str:
        """:meth:`_fit_solver` for X's features (its columns but the numeric attributes)
        and the encoded ``groups`` (None without); ``weighted``: a sample_weight is given."""
        d = X.shape[1] - len(getattr(self, "numeric_sensitive_columns_", ()))
        n_groups = 0 if groups is None else sum(len(c) for c in groups.categories)
        if is_exact(self.compute_dtype):
            # exact statistics are the d x d sums: the covariance solve, never matrix-free
            # passes; float X and weighted rows refused here, before any work (the kernels'
            # loading and self-test wait for the pass: validate_fit stays cheap)
            check_unweighted(self.compute_dtype, weighted)
            check_exact(X.dtype, float("nan"))
            if self.svd_solver == "randomized":
                raise InvalidInputError(
                    "compute_dtype='exact' sums the d x d statistics exactly, which the "
                    "matrix-free svd_solver='randomized' never forms: pass svd_solver='full' "
                    "(or 'auto'), or compute_dtype='float32' / 'float64'")
            self._fit_solver(d, groups=n_groups, checkpoint=checkpoint, weighted=weighted)  # its checks only
            return "covariance_eigh"
        return self._fit_solver(d, groups=n_groups, checkpoint=checkpoint, weighted=weighted)

    @property
    def _eigen_solver(self) -> str:
        """``eigen_solver`` in its current spelling (a deprecated one mapped)."""
        return current("eigen_solver", self.eigen_solver)

    def _features(self, m) -> np.ndarray:
        """The feature columns of statistics m (all but the numeric attributes)."""
        num = np.asarray(getattr(self, "numeric_sensitive_columns_", ()), dtype=np.intp)
        return np.setdiff1d(np.arange(m.n_features), num)

    def _randomized_blocker(self, d: int, groups: int) -> str | None:
        """Why the randomized solve cannot fit (None if it can)."""
        k = self.n_components
        if not is_int(k):
            return (f"svd_solver='randomized' needs n_components as an int, got {k!r}: None, "
                    "fractions of the variance and 'mle' need the whole spectrum (svd_solver='full')")
        if getattr(self, "equalize_covariance", None) is not None:
            return needs_dense_message("Fair PCA-S (equalize_covariance)", d, 1 + groups,
                                       "equalize_covariance=None (fair PCA, matrix-free)")
        return None

    def _randomized_fit(self, X, groups=None, mask=None, numeric: bool = False, checkpoint=None):
        """:func:`dfairpca.solve._randomized.fit_randomized` of X with this estimator's
        parameters (products in float64 where ``numeric``, as :meth:`_pass`), saving its
        state after every pass to ``checkpoint`` if given."""
        dtype = self._pass_dtype(X, numeric, matrix_free=True)
        codes, cats = (None, ()) if groups is None else (groups.codes, groups.categories)
        return fit_randomized(
            X, self.n_components, codes=codes, categories=cats, mask=mask,
            names=getattr(self, "attribute_names_", None),
            numeric=getattr(self, "numeric_sensitive_columns_", ()) if numeric else (),
            standard=getattr(self, "tradeoff", 0) > 0, center=self.center,
            standardize=self.standardize, dtype=dtype, n_oversamples=self.n_oversamples,
            iterated_power=self.iterated_power, random_state=self.random_state,
            split_every=self.split_every, progress=self.progress, checkpoint=checkpoint)

    def _fit_matrix_free(self, f, checkpoint) -> bool:
        """Fit by randomized passes where the solve chosen is "randomized"."""
        if self._solver_of(f.data, f.groups, checkpoint, weighted=f.weights is not None) != "randomized":
            return False
        self._set_randomized(self._randomized_fit(f.data, f.groups, f.mask, f.n_numeric > 0, checkpoint))
        return True

    def _validate_fit(self, X, y=None, sensitive_features=None, sample_weight=None) -> None:
        """``validate_fit``: the errors of fit before its pass (the input, k and the solve)."""
        f = self._read(X, y, sensitive_features, sample_weight, reset=None)
        self._solver_of(f.data, f.groups, weighted=f.weights is not None)

    def _solvable(self, m) -> bool:
        k = self.n_components
        return super()._solvable(m) and not (is_int(k) and m.n_effective < k)

    def _set_randomized(self, fit) -> None:
        """The fitted attributes of a randomized fit (``statistics_``: its first-order
        statistics)."""
        self._set_model(fit.statistics.n, fit.mean, fit.components, fit.captured, fit.total,
                        fit.scale, fit.exponent)
        self.statistics_ = fit.statistics
        self.statistics_kernel_ = kernel_name(fit.statistics)
        self.fitted_svd_solver_ = "randomized"
        self.n_passes_ = fit.passes

    def _set_fitted(self, m: Moments, U: np.ndarray, S: np.ndarray, scale, e: int = 0):
        """The fitted attributes of the exact solve U of S (``S * 4**e`` in true units)."""
        self._set_model(m.n, m.mean, U, np.sum((U @ S) * U, axis=1), np.trace(S), scale, e,
                        rows=m.n_rows, rank=m.n_effective)
        self.statistics_ = m
        self.statistics_kernel_ = kernel_name(m)
        self.fitted_svd_solver_ = "covariance_eigh"

    def _set_model(self, n, mean, U, captured, total, scale, e: int = 0, rows=None,
                   rank=None) -> None:
        """The fitted attributes of components U (k, d) of n rows of the given mean that
        capture ``captured`` of the operator's trace ``total`` (``* 4**e`` in true units).

        Weighted rows (``rows`` given): n is their total weight, the count in every
        formula (the variances' ``n - 1``), ``n_samples_seen_`` the rows of positive weight
        and ``sample_weight_sum_`` the total weight; ``rank`` bounds the rank (the
        statistics' ``n_effective``)."""
        d = U.shape[1]
        self.n_features_in_ = d + len(getattr(self, "sensitive_feature_indices_", ()))
        if rows is None:
            n = int(n)
            self.n_samples_seen_ = n
            self.__dict__.pop("sample_weight_sum_", None)  # from an earlier weighted fit
        else:
            n = float(n)
            self.n_samples_seen_ = int(rows)
            self.sample_weight_sum_ = n
        self.n_components_ = U.shape[0]
        self.components_ = U
        self.mean_ = mean.copy() if self.center else np.zeros(d)
        self.scale_ = scale
        denom = n - 1
        captured = np.asarray(captured) / denom
        total = total / denom
        noise = noise_variance(captured, total, min(self.n_samples_seen_ if rank is None else rank, d))
        with np.errstate(over="ignore", under="ignore"):  # the true values, as float64 holds them
            self.explained_variance_ = np.ldexp(captured, 2 * e)
            self.singular_values_ = np.ldexp(np.sqrt(np.maximum(captured, 0.0) * denom), e)
            self.noise_variance_ = float(np.ldexp(noise, 2 * e))
        self.explained_variance_ratio_ = captured / total

    # ------------------------------------------------------------------ fitting
    def _check_partial(self) -> None:
        """partial_fit adds to the exact fit's d x d statistics: refuse where there are none."""
        if self.svd_solver == "randomized":
            raise InvalidInputError("partial_fit adds rows to the exact fit's d x d statistics; "
                             "svd_solver='randomized' needs passes over all rows: call fit, or "
                             "use svd_solver='full'")
        if getattr(self, "fitted_svd_solver_", None) == "randomized":
            raise InvalidInputError("this model was fitted by randomized passes, which keep no d x d "
                             "statistics for partial_fit to add rows to: fit it again with "
                             "svd_solver='full' to go on with partial_fit")

    # ------------------------------------------------------------------ transforming
    def _projection(self) -> np.ndarray:
        """(d, k_out) matrix applied to standardised, centred rows (whitening folded in)."""
        W = self.components_.T
        return W / whitening(self.explained_variance_) if self.whiten else W

    def _output_matrix(self) -> np.ndarray:
        return self._projection()

    def _features_fitted(self) -> int:
        return self.components_.shape[1]

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

    def transform(self, X: ArrayInput) -> ArrayOutput:
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

        Parameters
        ----------
        X : array-like of shape (n, d) or (n, h, w)
            numpy, pandas, xarray, Dask or Zarr array (or a path to a Zarr array), with all
            ``n_features_in_`` columns.

        Returns
        -------
        ndarray, Dask array or xarray.DataArray of shape (n, n_features_out)
            The representations: ``n_components_`` columns, then the λ-scaled standard
            components when ``tradeoff > 0`` (:meth:`get_feature_names_out`).
        """
        return self._represented(X)

    def _represent(self, inp: Input, X) -> ArrayOutput:
        self._check_layout(inp)
        Xa = inp.data
        dtype = compute_dtype_for(Xa.dtype, self.compute_dtype)
        mu, Ws = self._folded(inp, dtype)
        if isinstance(Xa, da.Array):
            # the matrices by key: shipped to a cluster once, not inside the graph
            out = da.map_blocks(
                _project_block, Xa, ship(mu), ship(Ws), dtype=dtype, chunks=(Xa.chunks[0], (Ws.shape[1],)),
                meta=np.empty((0, 0), dtype),
            )
            return inp.wrap(out, self.get_feature_names_out())
        out = np.empty((Xa.shape[0], Ws.shape[1]), dtype)
        rows = rows_per_block(Xa.shape[1] * dtype.itemsize)
        for s in range(0, Xa.shape[0], rows):
            out[s : s + rows] = _project(Xa[s : s + rows], mu, Ws)
        check_finite_output(out, Xa)  # all rows at once: the error counts every bad row
        return inp.wrap(out, self.get_feature_names_out())

    def inverse_transform(self, Y: ArrayOutput) -> ArrayOutput:
        """Map representations back to feature space:
        ``Y[:, :k] @ components_ * scale_ + mean_`` (times ``sqrt(explained_variance_)``
        first when ``whiten``).

        Parameters
        ----------
        Y : ndarray, Dask array or xarray.DataArray of shape (n, k) or (n, n_features_out)
            Representations, as :meth:`transform` gives them.  With ``tradeoff > 0`` only
            the first k (fair) columns are used.

        Returns
        -------
        ndarray, Dask array or xarray.DataArray of shape (n, d)
            The reconstruction, with the columns of ``components_``: the columns named by
            ``sensitive_feature_ids`` are not reconstructed.  Lazy for Dask input; for a
            DataArray Y, a DataArray named "reconstruction" with Y's row dimension and
            coordinate and a "feature" dimension.
        """
        self._check_fitted()
        if is_xarray(Y):
            import xarray as xr

            dim = Y.dims[0]
            coords = {dim: Y.coords[dim]} if dim in Y.coords else {}
            return xr.DataArray(self.inverse_transform(Y.data), dims=(dim, "feature"),
                                coords=coords, name="reconstruction")
        k = self.n_components_
        if Y.ndim != 2 or Y.shape[1] not in (k, self._n_features_out):
            raise InvalidInputError(f"Y must have shape (n, {k}); got {Y.shape}")
        d = self.components_.shape[1]
        scale = np.ones(d) if self.scale_ is None else self.scale_
        B = self.components_ * scale[None, :]
        if self.whiten:
            B = B * whitening(self.explained_variance_)[:, None]
        if isinstance(Y, da.Array):
            dtype = Y.dtype if Y.dtype.kind == "f" else np.float64
            Yk = Y[:, :k].rechunk({1: -1})
            return Yk.map_blocks(
                _reconstruct_block, ship(B.astype(dtype)), ship(self.mean_.astype(dtype)), dtype=dtype,
                chunks=(Yk.chunks[0], (d,)), meta=np.empty((0, 0), dtype),
            )
        Y = np.asarray(Y)
        dtype = Y.dtype if Y.dtype.kind == "f" else np.float64
        return _reconstruct_block(Y[:, :k], B.astype(dtype), self.mean_.astype(dtype))

    # ------------------------------------------------------------------ persistence
    def save(self, path: PathInput, *, statistics: bool = False, overwrite: bool = False) -> Path:
        """Save the fitted model to directory ``path`` (arrays in .npz, metadata in JSON).

        Loaded back by :func:`dfairpca.load`.  Never pickles.

        Parameters
        ----------
        path : str or os.PathLike
            The directory (local, or a URL such as ``s3://bucket/key``); it must not exist
            or be an empty directory, unless ``overwrite``.
        statistics : bool
            Also save :attr:`statistics_` (d x d float64, 330 MB at d = 6400) so that
            ``partial_fit`` can continue after :func:`load`.
        overwrite : bool
            Replace a model saved by dfairpca there, atomically, and nothing else (see
            :func:`dfairpca.io.atomic_directory`).

        Returns
        -------
        pathlib.Path or str
            The directory written: a Path for a local one, the URL as given for a remote one.
        """
        if statistics and self.statistics_.scatter is None:
            raise InvalidInputError("this model was fitted by randomized passes, which keep first-order "
                             "statistics only (no d x d scatter for partial_fit to go on from): "
                             "save it without statistics=True, or fit with svd_solver='full'")
        return self._write(path, overwrite, self.statistics_ if statistics else None)

    @classmethod
    def _saved_layout(cls, meta: dict, headers: dict) -> dict:
        return linear_layout(cls, meta, fair=cls._fair)

    def _restore_extra(self, meta: dict, arrays: dict) -> None:
        """Fitted attributes a model saved before they existed lacks, from what it has:
        ``singular_values_`` from the variances, ``noise_variance_`` from them and their
        ratios."""
        n, ev = self.n_samples_seen_, self.explained_variance_
        if self.singular_values_ is None:
            self.singular_values_ = np.sqrt(np.maximum(ev, 0.0) * max(n - 1, 0))
        if not hasattr(self, "noise_variance_"):
            ratio = self.explained_variance_ratio_
            total = float(ev.sum() / ratio.sum()) if ratio.sum() > 0 else 0.0
            self.noise_variance_ = noise_variance(ev, total, min(n, self.components_.shape[1]))

    def _check_restored(self) -> None:
        check_linear_values(self)

    def _restore_statistics(self, path: Path) -> None:
        load_statistics(self, path)
        if getattr(self, "statistics_", None) is not None:  # saved with its statistics
            self.statistics_kernel_ = kernel_name(self.statistics_)


# ---------------------------------------------------------------------------- helpers
def whitening(variances) -> np.ndarray:
    """sqrt of the variances, those below float64 eps raised to it (scikit-learn's guard for
    rank-deficient data: whitening must not divide by 0)."""
    scale = np.sqrt(np.maximum(np.asarray(variances, dtype=np.float64), 0.0))
    return np.maximum(scale, np.finfo(np.float64).eps)


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


def _reconstruct_block(y, B, mu):
    return np.asarray(y, dtype=B.dtype) @ B + mu
