"""The estimator :class:`ConceptEraser`: a protected attribute erased from the features at
full rank (LEACE, or the orthogonal projection of the group-mean deviations), fitted from
the same one-pass statistics as :class:`~dfairpca.FairPCA`.

It checks the input and its protected attributes as FairPCA does
(:func:`dfairpca.decomposition._fair_input.fair_input`), runs the one Moments pass, and keeps what
the certified solve (:func:`dfairpca.solve._erasure.fit_erasure`) found.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Self

import numpy as np
import numpy.typing as npt
from sklearn.base import OneToOneFeatureMixin
import dask.array as da

from ..base._params import BOOL, SPLIT_EVERY, Check, Rule, is_real, one_of
from ..base._system import rows_per_block
from ..base._typing import ArrayInput, ArrayOutput, ColumnIds
from ..engine._compute import ship
from ..inputs._validation import (
    SENSITIVE_IDS, Input, check_finite_input, check_finite_output, is_xarray, row_origin,
)
from ..io import register_model_class
from ..solve._erasure import ERASURE_METHODS, Erasure, fit_erasure
from ..stats._exact import compute_dtype_for
from ..stats.moments import Moments
from ._base import FairStatisticsEstimator, fit_context, set_certificate
from ._saved import eraser_layout, check_eraser_values, fair_meta, restore_fair_meta

# Deferred imports: xarray (heavy or optional) and package modules that load such libraries, or this
# module, at import are imported in the functions that use them, so that importing this module stays
# light.

__all__ = ["ConceptEraser"]

#: why there is no inverse_transform (its ``hasattr`` is False, so a Pipeline knows too)
NOT_INVERTIBLE = ("ConceptEraser has no inverse_transform: erasure is not invertible (it "
                  "removes the directions that carry the concept, and what they held is "
                  "gone); keep the original X where you need it back")


def _rtol_ok(v) -> bool:
    return v is None or (is_real(v) and 0.0 <= float(v) < 1.0)


class _NotInvertible:
    """The eraser's ``inverse_transform``: an AttributeError saying why on an instance
    (scikit-learn's ``available_if`` would replace the message with a generic one)."""

    def __get__(self, obj, owner=None):
        if obj is None:
            return self
        raise AttributeError(NOT_INVERTIBLE)


@register_model_class
class ConceptEraser(OneToOneFeatureMixin, FairStatisticsEstimator):
    """Erase protected attributes from the features at full rank: LEACE or the orthogonal
    projection, from one pass over X.

    Where :class:`FairPCA` reduces X to k fair components, the eraser keeps all d features
    and removes only what tells the groups apart: ``r(x) = x - proj_left_ @ proj_right_ @
    (x - mean_)``.  After it every group indicator of every attribute (and every numeric
    attribute) has zero covariance with every output feature, so no linear classifier
    predicts the groups better than a constant.  Both methods need X only through the
    covariance Sigma and the cross-covariance Sigma_XZ with the group indicators Z, which
    the one-pass statistics hold (:class:`~dfairpca.Moments`: the same pass serves FairPCA,
    see :meth:`fit_statistics`).

    Parameters
    ----------
    method : {"leace", "orth"}, default "leace"
        "leace" (Belrose et al., NeurIPS 2023): ``W = Sigma^(-1/2)`` on Sigma's support,
        P the orthogonal projection onto the column space of ``W Sigma_XZ``,
        ``r(x) = x - W^+ P W (x - mean)``: of all erasers it changes X the least (the mean
        squared change, in any norm ``x^T M x``).  "orth": the orthogonal projection that
        removes the span of the group-mean deviations (fair PCA at full rank), which
        changes X more unless the features are uncorrelated with equal variances.
    sensitive_feature_ids : list of column names or int, default None
        The protected attributes as columns of X, as in :class:`FairPCA` (and fairlearn's
        ``CorrelationRemover``): labels or numbers; they are left out of the output, which
        then has the other ``n_features_in_ - len(ids)`` columns.
    rtol : float in [0, 1) or None, default None
        Eigenvalues of Sigma at or below ``rtol`` times the largest are outside its
        support (constant features, d > n, collinear columns) and left as they are by
        LEACE; None: ``d * eps`` of the products' dtype (``torch.linalg.pinv``'s rule,
        that of the ``concept-erasure`` package; 1.4e-12 for d = 6,400 in float64).
        Unused by "orth".
    compute_dtype : {"auto", "float32", "float64", "exact"}, default "auto"
        The dtype of the pass's products (always summed in float64) and of ``transform``.
        "auto": the pass in float64 (LEACE whitens by Sigma's smallest eigenvalues, which
        float32 products round at 1e-7 of the largest), or exact integer sums for 8-bit
        data where their kernel is not slower than float32 products (as :class:`PCA`); ``transform`` in float32 for data that is not float64 (as
        :class:`PCA`) and in float64 for float64 data.
    split_every, progress : as in :class:`PCA`

    Attributes
    ----------
    proj_left_ : ndarray (d, r)
        ``W^+ U`` (orth: U), U an orthonormal basis of the r erased directions in whitened
        space; named as the ``concept-erasure`` package's ``LeaceEraser.proj_left``.
    proj_right_ : ndarray (r, d)
        ``U^T W`` (orth: ``U^T``), the package's ``proj_right``.
    mean_ : ndarray (d,)
        The (weighted) mean of the features (the package's ``bias``).
    n_constraints_ : int
        r, the directions erased: ``sum(m_r) - p`` for p attributes of m_1, ..., m_p
        groups, plus one per numeric attribute, less any that are dependent or rounding
        (a group whose mean is the overall mean to float64 rounding imposes none, with a
        :class:`~dfairpca.errors.ConstraintDroppedWarning`).
    support_rank_ : int
        The eigenvalues of Sigma kept as its support (``rtol``); d for "orth".
    rtol_ : float
        The eigenvalue floor used (``rtol`` or its default).
    fairness_violation_ : float
        The fit's certificate: the largest share ``|v - L R v| / |v|`` of any constraint
        vector v (a group's mean deviation, i.e. a column of Sigma_XZ, or a numeric
        attribute's covariance with the features) that the erased output's covariance with
        its indicator keeps, in float64 from the statistics.  A fit above
        :data:`dfairpca.solve._fairness.FAIRNESS_TOLERANCE` (1e-8) raises ``ValueError``, as
        :class:`FairPCA`'s does; typical values are 1e-16 to 1e-13.
    fairness_violation_per_attribute_ : ndarray (p + q,)
        The same, per protected attribute.
    groups_, attribute_names_, group_means_, sensitive_feature_indices_,
    numeric_sensitive_columns_ : as in :class:`FairPCA`
    n_features_in_, feature_names_in_, n_samples_seen_, sample_weight_sum_, statistics_,
    statistics_kernel_ : as in :class:`PCA`

    Examples
    --------
    >>> import numpy as np, dfairpca
    >>> rng = np.random.default_rng(0)
    >>> X, z = rng.normal(size=(500, 6)), rng.integers(0, 2, 500)
    >>> X[z == 1, :2] += 1.0
    >>> eraser = dfairpca.ConceptEraser().fit(X, sensitive_features=z)
    >>> Xe = eraser.transform(X)
    >>> Xe.shape, bool(np.allclose(Xe[z == 0].mean(0), Xe[z == 1].mean(0)))
    ((500, 6), True)
    """

    _parameter_rules = {
        "method": [one_of(ERASURE_METHODS)],
        "sensitive_feature_ids": SENSITIVE_IDS,
        "rtol": [Rule(_rtol_ok, "None or a number in [0, 1)")],
        "compute_dtype": [Check(lambda est, v: compute_dtype_for(np.float64, v))],
        "split_every": SPLIT_EVERY,
        "progress": BOOL,
    }
    _fitted_attribute = "proj_left_"
    #: the pass in float64 for "auto" (LEACE whitens by Sigma's smallest eigenvalues, which
    #: float32 products round at 1e-7 of the largest), or exact sums where "auto" chooses them
    _auto_float = np.float64
    _two_groups_for = "erasing it needs at least two"
    statistics_: Moments  # the fitted (or, before partial_fit can solve, the gathered) statistics
    _array_attrs = ("proj_left_", "proj_right_", "mean_")
    _meta_attrs = ("n_features_in_", "n_samples_seen_", "sample_weight_sum_", "n_constraints_",
                   "support_rank_", "rtol_", "attribute_names_")

    def __init__(self, method: str = "leace", *, sensitive_feature_ids: ColumnIds | None = None,
                 rtol: float | None = None, compute_dtype: npt.DTypeLike = "auto",
                 split_every: int = 8, progress: bool = False) -> None:
        self.method = method
        self.sensitive_feature_ids = sensitive_feature_ids
        self.rtol = rtol
        self.compute_dtype = compute_dtype
        self.split_every = split_every
        self.progress = progress

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.transformer_tags.preserves_dtype = ["float64", "float32"]
        return tags

    # ------------------------------------------------------------------ fitting
    @fit_context
    def fit(self, X: ArrayInput, y: ArrayInput | None = None, *,
            sensitive_features: ArrayInput | None = None, sample_weight: ArrayInput | None = None,
            timeout: float | None = None) -> Self:
        """Fit the eraser on X and its protected attribute(s) in one pass over X.

        Parameters
        ----------
        X : array-like of shape (n, d) or (n, h, w)
            numpy, pandas, xarray, Dask or Zarr array (or a path to a Zarr array).
        y : ignored
            The task label; never taken for the protected attributes.
        sensitive_features : array-like, list of arrays or DataFrame, optional
            The protected attribute(s) of every row, as :meth:`FairPCA.fit` takes them
            (labels of any type; several attributes at once, any number of groups);
            required unless ``sensitive_feature_ids`` names columns of X.  Keyword only,
            so that scikit-learn's metadata routing can pass it through a Pipeline.
        sample_weight : array-like of shape (n,), optional
            Frequency weights: the covariance, the group means and the certificate are
            the weighted ones.
        timeout : float, optional
            Seconds to wait once every worker has left, as in :meth:`PCA.fit`.

        Returns
        -------
        self : ConceptEraser
            The fitted eraser.
        """
        return self._fit(X, y, sensitive_features, sample_weight, timeout=timeout)

    def _solvable(self, m: Moments) -> bool:
        return m.n >= 2 and super()._solvable(m)

    def _features_fitted(self) -> int:
        return self.proj_left_.shape[0]

    @fit_context
    def fit_statistics(self, statistics: Moments, *, attribute_names: Sequence[str] | None = None,
                       numeric_columns: npt.ArrayLike | None = None) -> Self:
        """Fit the eraser from precomputed (merged, loaded) statistics, and certify it.

        The statistics a :class:`FairPCA` fit keeps (``statistics_``) or
        :func:`dfairpca.compute_moments` returns serve both: one pass over X, then FairPCA
        and the eraser.

        Parameters
        ----------
        statistics : Moments
            Complete statistics (with the d x d scatter) of the rows, with the groups of
            every labelled attribute; their columns are the features, except the numeric
            protected attributes ``numeric_columns``.
        attribute_names : list of str, optional
            Names of the attributes, labelled ones first (default "attribute 0", ...).
        numeric_columns : sequence of int, optional
            Columns of the statistics that are numeric protected attributes (none by default).

        Returns
        -------
        self : ConceptEraser
            The fitted eraser; ``transform`` then takes X with the statistics' columns.
        """
        num = np.asarray([] if numeric_columns is None else numeric_columns, dtype=np.intp)
        self._fit_statistics(statistics, attribute_names=[] if attribute_names is None else attribute_names,
                             numeric_columns=num)
        self.__dict__.pop("feature_names_in_", None)  # from an earlier fit on a DataFrame
        self.n_features_in_ = statistics.n_features
        self.sensitive_feature_indices_ = num
        self.numeric_sensitive_columns_ = num
        return self

    def _fit_statistics(self, m: Moments, *, attribute_names=None, numeric_columns=None) -> Self:
        """Solve, certify and keep the fitted attributes (nothing is set if it fails); the
        names and numeric columns default to those of the fit that gathered ``m``."""
        num = np.asarray(getattr(self, "numeric_sensitive_columns_", ()) if numeric_columns is None
                         else numeric_columns, dtype=np.intp)
        names = self._checked_statistics(m, num, getattr(self, "attribute_names_", None)
                                         if attribute_names is None else attribute_names)
        self._set_erasure(fit_erasure(m, num, names, method=self.method, rtol=self.rtol,
                                      estimator=type(self).__name__))
        return self

    def _set_erasure(self, e: Erasure) -> None:
        self.proj_left_ = e.proj_left
        self.proj_right_ = e.proj_right
        self.mean_ = e.mean
        self.n_constraints_ = e.proj_left.shape[1]
        self.support_rank_ = e.support_rank
        self.rtol_ = e.rtol
        set_certificate(self, e.violations)
        self.groups_ = [a.categories for a in e.statistics.attributes]
        self.group_means_ = e.group_means
        self.attribute_names_ = e.names
        self.statistics_ = e.statistics
        self.statistics_kernel_ = e.kernel
        if e.rows is None:
            self.n_samples_seen_ = int(e.n)
            self.__dict__.pop("sample_weight_sum_", None)  # from an earlier weighted fit
        else:
            self.n_samples_seen_ = int(e.rows)
            self.sample_weight_sum_ = float(e.n)

    # ------------------------------------------------------------------ transforming
    def get_feature_names_out(self, input_features: npt.ArrayLike | None = None) -> np.ndarray:
        """The input features' names but those named by ``sensitive_feature_ids``.

        Parameters
        ----------
        input_features : array-like of str, optional
            Checked against ``feature_names_in_`` as in scikit-learn.

        Returns
        -------
        ndarray of str
            One name per column of :meth:`transform`'s output.
        """
        names = OneToOneFeatureMixin.get_feature_names_out(self, input_features)
        return np.delete(names, getattr(self, "sensitive_feature_indices_", []))

    def transform(self, X: ArrayInput) -> ArrayOutput:
        """Erase the concept: ``X - (X - mean_) @ proj_right_.T @ proj_left_.T``.

        numpy or pandas in, numpy out; Dask (or Zarr) in, lazy Dask out with X's shape and
        chunks (images (n, h, w) stay images); an xarray DataArray in, a DataArray with
        X's dimensions and coordinates out (lazy if X was).  Without
        ``sensitive_feature_ids`` the output has X's shape; with them, those columns are
        left out.  float64 input gives float64 output, other dtypes float32 (see
        ``compute_dtype``).  Rows holding NaN or infinity raise, naming them.

        Parameters
        ----------
        X : array-like of shape (n, d) or (n, h, w)
            numpy, pandas, xarray, Dask or Zarr array (or a path to a Zarr array), with
            all ``n_features_in_`` columns.

        Returns
        -------
        ndarray, Dask array or xarray.DataArray
            The erased data.
        """
        return self._represented(X)

    def _represent(self, inp: Input, X) -> ArrayOutput:
        self._check_layout(inp)
        Xa = inp.data
        dtype = compute_dtype_for(Xa.dtype, self.compute_dtype)
        # the numeric sensitive columns are left out of the output but still checked: a
        # NaN there is bad input as anywhere else
        feats = inp.features if len(inp.numeric) else None
        mu, L, R = (a.astype(dtype) for a in (self.mean_, self.proj_left_, self.proj_right_))
        if isinstance(Xa, da.Array):
            out = da.map_blocks(_erase_block, Xa, ship(mu), ship(L), ship(R), feats, dtype=dtype,
                                chunks=(Xa.chunks[0], (L.shape[0],)), meta=np.empty((0, 0), dtype))
        else:
            out = np.empty((Xa.shape[0], L.shape[0]), dtype)
            rows = rows_per_block(Xa.shape[1] * dtype.itemsize)
            for s in range(0, Xa.shape[0], rows):
                out[s : s + rows] = _erase_rows(Xa[s : s + rows], mu, L, R, feats, s)
        return _like(X, out, inp, self.get_feature_names_out() if len(inp.sensitive) else None)

    #: not offered: erasure is not invertible (``hasattr(eraser, "inverse_transform")`` is
    #: False, so a Pipeline knows it cannot invert either; using it raises, saying why)
    inverse_transform = _NotInvertible()

    # ------------------------------------------------------------------ persistence
    def _extra_meta(self):
        return fair_meta(self)

    def _extra_arrays(self):
        return {f"group_means_{j}": gm for j, gm in enumerate(self.group_means_)}

    @classmethod
    def _saved_layout(cls, meta: dict, headers: dict) -> dict:
        return eraser_layout(cls, meta)

    def _restore_extra(self, meta, arrays):
        restore_fair_meta(self, meta)
        self.group_means_ = [arrays[f"group_means_{j}"] for j in range(len(self.groups_))]

    def _check_restored(self) -> None:
        check_eraser_values(self)


# ---------------------------------------------------------------------------- helpers
def _erase(x, mu, L, R):
    """``x - ((x - mu) @ R^T) @ L^T`` in L's dtype (rank r: O(d r) per row)."""
    x = np.asarray(x).astype(L.dtype, copy=False)
    with np.errstate(invalid="ignore", over="ignore"):  # such rows raise, named, instead
        return x - ((x - mu) @ R.T) @ L.T


def _erase_block(x, mu, L, R, features=None, block_info=None):
    """:func:`_erase_rows` of one Dask chunk."""
    return _erase_rows(x, mu, L, R, features, *row_origin(block_info))


def _erase_rows(x, mu, L, R, features, start, chunk=None):
    """:func:`_erase` of the ``features`` (None: all) of rows x, the first X's row
    ``start``, raising for NaN/inf rows with their row numbers, in the columns left out
    too."""
    x = np.asarray(x)
    if features is not None:
        check_finite_input(np.delete(x, features, axis=1), start, chunk)
        x = x[:, features]
    out = _erase(x, mu, L, R)
    check_finite_output(out, x, start, chunk)
    return out


def _like(X, out, inp: Input, names):
    """The erased 2-D ``out`` in X's form: X's shape (images stay images) and, for a Dask
    or Zarr X, X's chunks; a DataArray with X's dimensions and coordinates for a DataArray
    X.  ``names``: the output's feature names where sensitive columns were dropped (the
    output is then (n, d - ids) and keeps only X's row chunks and row coordinate)."""
    data = X.data if is_xarray(X) else X
    if names is None:
        if isinstance(data, (str, os.PathLike)) or type(data).__module__.startswith("zarr"):
            from ..io import from_zarr

            data = from_zarr(data)
        shape = tuple(getattr(data, "shape", out.shape))
        known = not any(np.isnan(s) for s in (*shape, *out.shape))  # a Dask array's rows may not be
        if known and len(shape) > 2 and out.shape != shape:
            out = out.reshape(shape)
        if known and isinstance(out, da.Array) and isinstance(data, da.Array) and out.chunks != data.chunks:
            out = out.rechunk(data.chunks)
    if not is_xarray(X):
        return out
    import xarray as xr

    if names is None:
        return xr.DataArray(out, dims=X.dims, coords=X.coords, name=X.name)
    if X.dims[1] in X.coords:  # X's own column labels, but the sensitive ones
        names = np.delete(np.asarray(X.coords[X.dims[1]].data), inp.sensitive)
    return inp.wrap(out, names).rename({"component": X.dims[1]})
