"""The one base of the estimators: what PCA, FairPCA and FairKernelPCA share.

:class:`Estimator` holds what every estimator does alike: the parameter check (the class's
``_parameter_rules``, :mod:`dfairpca.base._params`), the fitted check, the output width and
names that scikit-learn's ``get_feature_names_out`` reads, ``fit_transform``, and the
save/load path (:mod:`dfairpca.decomposition._saved`).  The linear estimators add the shared transform
and probabilistic model (:class:`dfairpca.decomposition._linear.LinearDecomposition`); each concrete
class declares its parameters, its fit and what it saves.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any, Self

import numpy as np
import numpy.typing as npt
from sklearn.base import BaseEstimator, ClassNamePrefixFeaturesOutMixin, TransformerMixin
from sklearn.exceptions import NotFittedError

from ..base._compat import current_params
from ..base._params import validate_params
from ..engine._checkpoint_files import saved_compute_dtype
from ..engine._compute import worker_timeout
from ..engine._engine import auto_choice_for_pass, coded_moments
from ..engine.checkpoint import coded_moments_checkpointed
from ..errors import InvalidInputError
from ..inputs._validation import Input, check_input
from ..stats._auto import row_width
from ..stats._exact import statistics_dtype
from ..stats.moments import Moments, merge
from ._fair_input import FairInput, fair_input
from ._saved import input_meta, restore_input_meta
from ..base._typing import ArrayInput, ArrayOutput, PathInput
from ..io import SavedFileError, atomic_directory, storage_for, write_arrays

# Deferred imports: package modules that load such libraries, or this module, at import are imported
# in the functions that use them, so that importing this module stays light.

__all__ = ["Estimator", "StatisticsEstimator", "fit_context", "set_certificate", "fair_feature_names"]


def fit_context(method):
    """Check the estimator's parameters once, before ``method`` (a public fit) runs: the
    one place they are validated, as scikit-learn's ``_fit_context`` does for its
    ``_parameter_constraints`` (``set_params`` may change them between calls)."""

    @functools.wraps(method)
    def checked(self, *args, **kwargs):
        self._check_params()
        return method(self, *args, **kwargs)

    return checked


class Estimator(ClassNamePrefixFeaturesOutMixin, TransformerMixin, BaseEstimator):
    """Shared parameter check, fitted check, feature names, fit_transform, save and load.

    A subclass declares ``_parameter_rules`` (every ``__init__`` parameter),
    ``_fitted_attribute`` (set by a successful fit), ``_array_attrs`` and ``_meta_attrs``
    (the fitted attributes saved to arrays.npz and meta.json), and implements
    ``_output_matrix`` and ``_saved_layout``.
    """

    _parameter_rules: dict = {}
    _fitted_attribute = "components_"
    _array_attrs: tuple = ()
    _meta_attrs: tuple = ()

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.allow_nan = False  # NaN rows are refused, named
        tags.input_tags.sparse = False  # centring densifies: refused with what to do
        return tags

    def _check_params(self) -> None:
        """Raise the first error of this class's parameter table."""
        validate_params(self)

    # ------------------------------------------------------------------ fitted state
    def _check_fitted(self) -> None:
        if not hasattr(self, self._fitted_attribute):
            raise NotFittedError(
                f"this {type(self).__name__} is not fitted yet{self._not_fitted_hint()}; "
                "call fit(...) before using it"
            )

    def _not_fitted_hint(self) -> str:
        """Why an estimator that has seen data is not fitted yet ("" if nothing to say)."""
        return ""

    # ------------------------------------------------------------------ the input
    def _input(self, X, *, reset, min_samples: int = 1) -> Input:
        """X checked (:func:`dfairpca.inputs._validation.check_input`), its sensitive columns found."""
        return check_input(self, X, reset=reset, min_samples=min_samples,
                           ids=getattr(self, "sensitive_feature_ids", None))

    def _represented(self, X) -> ArrayOutput:
        """``transform``: X checked once, against the fitted model, then represented."""
        self._check_fitted()
        return self._represent(self._input(X, reset=False), X)

    def _represent(self, inp: Input, X) -> ArrayOutput:
        """The representation of X, checked already as ``inp`` (:meth:`_input`), its
        sensitive columns checked against the fit's first: ``transform`` without checking
        X again."""
        raise NotImplementedError

    def _check_layout(self, inp: Input) -> None:
        check_layout(self, inp, self._features_fitted())

    def _features_fitted(self) -> int:
        """The features (sensitive columns excluded) the model was fitted on."""
        raise NotImplementedError


    def _output_matrix(self) -> np.ndarray:
        """The matrix whose columns are transform's outputs."""
        raise NotImplementedError

    @property
    def _n_features_out(self):
        return self._output_matrix().shape[1]

    def get_feature_names_out(self, input_features: npt.ArrayLike | None = None) -> np.ndarray:
        """"<class>0", ... for the components, then "<class>_standard0", ... for the
        λ-scaled standard ones when ``tradeoff > 0`` (e.g. "fairpca0", "fairpca_standard0").

        Parameters
        ----------
        input_features : array-like of str, optional
            Checked against ``feature_names_in_`` as in scikit-learn; the output names do
            not depend on it.

        Returns
        -------
        ndarray of str
            One name per column of :meth:`transform`'s output.
        """
        return fair_feature_names(self, super().get_feature_names_out(input_features))

    def fit_transform(self, X: ArrayInput, y: Any = None, **fit_params: Any) -> ArrayOutput:
        """``fit(X, y, **fit_params).transform(X)``: two passes over X.

        Parameters
        ----------
        X : array-like of shape (n, d) or (n, h, w)
            The data, as ``fit`` takes it.
        y : array-like of shape (n,), optional
            As ``fit`` takes it.
        **fit_params
            The keywords of ``fit`` (``sensitive_features=``, ``checkpoint=``), passed to it.

        Returns
        -------
        ndarray, Dask array or xarray.DataArray of shape (n, k)
            The projection of X, as :meth:`transform` gives it (k columns: see
            :meth:`get_feature_names_out`).
        """
        return self.fit(X, y, **fit_params).transform(X)

    # ------------------------------------------------------------------ persistence
    def save(self, path: PathInput, *, overwrite: bool = False) -> Path:
        """Save the fitted model to directory ``path`` (arrays in .npz, metadata in JSON).

        Loaded back by :func:`dfairpca.load`.  Never pickles.

        Parameters
        ----------
        path : str or os.PathLike
            The directory (local, or a URL such as ``s3://bucket/key``); it must not exist
            or be an empty directory, unless ``overwrite``.
        overwrite : bool
            Replace a model saved by dfairpca there, atomically, and nothing else (see
            :func:`dfairpca.io.atomic_directory`).

        Returns
        -------
        pathlib.Path or str
            The directory written: a Path for a local one, the URL as given for a remote one.
        """
        return self._write(path, overwrite)

    def _write(self, path, overwrite: bool, statistics=None) -> Path:
        """Write the model (and ``statistics``, a Moments, beside it) atomically."""
        self._check_fitted()
        validate_params(self)  # set_params after the fit: a model load() would refuse
        self._check_savable()
        arrays = {a: np.asarray(getattr(self, a)) for a in self._array_attrs
                  if getattr(self, a, None) is not None}
        arrays.update(self._extra_arrays())
        meta = {
            "kind": "estimator",
            "class": type(self).__name__,
            "params": self.get_params(),
            **{a: getattr(self, a) for a in self._meta_attrs if hasattr(self, a)},
            **input_meta(self),
            **self._extra_meta(),
        }
        # the model's files at the top of its folder (``--out m`` is the model), its
        # statistics in a folder beside them
        with atomic_directory(path, "model", overwrite=overwrite) as tmp:  # a URL's: uploaded
            write_arrays(tmp, arrays, meta)
            if statistics is not None:
                statistics.save(tmp / "statistics")
        return storage_for(path).user_path()  # a URL as given, a local Path

    def _check_savable(self) -> None:
        """Raise if the fitted model cannot be written as arrays and JSON."""

    def _extra_meta(self) -> dict:
        return {}

    def _extra_arrays(self) -> dict:
        return {}

    @classmethod
    def _from_saved(cls, arrays: dict, meta: dict):
        """The model from what :func:`dfairpca.io.load_arrays` read with
        ``cls._saved_layout``; ValueError saying what is inconsistent."""
        est = cls(**current_params(meta["params"]))  # an old spelling: quietly the new
        for a in cls._array_attrs:
            setattr(est, a, arrays.get(a))
        for a in cls._meta_attrs:
            if a in meta:
                setattr(est, a, meta[a])
        restore_input_meta(est, meta)
        est._restore_extra(meta, arrays)
        est._check_restored()
        return est

    @classmethod
    def _saved_layout(cls, meta: dict, headers: dict) -> dict:
        """Check a saved model's meta.json; the shape and kind of each array it implies."""
        raise NotImplementedError

    def _restore_extra(self, meta: dict, arrays: dict) -> None:
        """Set the fitted attributes saved other than as ``_array_attrs`` / ``_meta_attrs``."""

    def _check_restored(self) -> None:
        """ValueError if the loaded values contradict what a fit gives."""

    def _restore_statistics(self, path: Path) -> None:
        """Attach the ``statistics/`` saved beside the model at ``path``."""
        raise SavedFileError(f"cannot load {str(path)!r}: a {type(self).__name__} saves no "
                             "statistics/, so it was not written by dfairpca: save the model again")


class StatisticsEstimator(Estimator):
    """An estimator solved from the one-pass statistics of X (:class:`~dfairpca.PCA`,
    :class:`~dfairpca.FairPCA`, :class:`~dfairpca.ConceptEraser`): the input route, the pass
    and its dtype, ``partial_fit``, the column-layout and statistics checks, written once.

    A subclass says what it solves from the statistics (``_fit_statistics``), what it
    checks of the input before the pass (``_check_input``), when gathered statistics can
    be solved (``_solvable``) and which attributes it keeps.
    """

    #: whether a fit takes protected attributes (``sensitive_features`` or columns of X)
    _takes_groups = False
    #: the float dtype compute_dtype="auto" passes in where it does not choose exact sums
    #: (None: X's, :func:`~dfairpca.stats._exact.compute_dtype_for`)
    _auto_float: type[np.floating] | None = None
    #: what an attribute's two non-empty groups are needed for (said where it has fewer)
    _two_groups_for = "fitting needs at least two"

    # ------------------------------------------------------------------ the input
    def _read(self, X, y=None, sensitive_features=None, sample_weight=None, *, reset,
              partial: bool = False) -> FairInput:
        """X, its protected attributes, y and the weights of a fit, checked once
        (:func:`~dfairpca.decomposition._fair_input.fair_input`).  ``reset``: a fit keeps
        X's column layout; False: a later call is compared with the statistics gathered so
        far; None: checked only (``validate_fit``).  ``partial``: one call of partial_fit."""
        f = fair_input(self, X, sensitive_features, y if self._takes_groups else None, reset=reset,
                       min_samples=1 if partial else 2, sample_weight=sample_weight,
                       partial=partial, groups=self._takes_groups)
        if reset and self._takes_groups:
            self.sensitive_feature_indices_ = f.checked.sensitive
            self.numeric_sensitive_columns_ = f.checked.numeric
            self.attribute_names_ = f.names
        elif reset is False and hasattr(self, "statistics_"):
            self._check_previous(f)
        self._check_input(f, partial)
        return f

    def _check_input(self, f: FairInput, partial: bool) -> None:
        """Raise, before the pass, what the input cannot give (the estimator's k)."""

    def _check_previous(self, f: FairInput) -> None:
        """Raise unless a later partial_fit's X has the columns, sensitive ones and
        attributes of the statistics gathered so far."""
        before = self.statistics_
        check_layout(self, f.checked, None)
        d, p = f.data.shape[1], 0 if f.groups is None else f.groups.n_attributes
        if d != before.n_features:
            raise InvalidInputError(f"X has {d} features; earlier partial_fit calls had "
                                    f"{before.n_features}")
        if p != len(before.attributes):
            raise InvalidInputError(f"groups has {p} attribute(s); earlier partial_fit calls had "
                                    f"{len(before.attributes)}")

    # ------------------------------------------------------------------ the pass
    def _pass_dtype(self, X, numeric: bool = False, *, weighted: bool = False,
                    matrix_free: bool = False, resumed=None):
        """The dtype of a pass over X (:func:`dfairpca.stats._exact.statistics_dtype`, the
        one place it is decided).  ``numeric``: X holds numeric protected attributes,
        whose covariances with the features are the constraint, so "auto" passes in
        float64 (float32 products would hold them to 1e-7 only); ``resumed``: what a
        checkpoint's "auto" chose when it began."""
        return statistics_dtype(
            X.dtype, self.compute_dtype, width=row_width(X), choose=auto_choice_for_pass,
            weighted=weighted, matrix_free=matrix_free, resumed=resumed,
            auto_float=np.float64 if numeric else self._auto_float,
            auto_exact=not (numeric and self._auto_float is None), n=X.shape[0])

    def _pass(self, X, groups=None, mask=None, checkpoint=None, numeric: bool = False,
              weights=None) -> Moments:
        """The statistics of X with its encoded ``groups`` (the one pass), of the rows of
        ``mask`` (None: all), weighted by the checked ``weights`` (or None), saved to
        ``checkpoint`` as it goes if given."""
        resumed = None
        if checkpoint is not None and self.compute_dtype in ("auto", None):
            resumed = saved_compute_dtype(checkpoint)  # "auto" resumes what it chose then
        dtype = self._pass_dtype(X, numeric, weighted=weights is not None, resumed=resumed)
        codes, cats = (None, ()) if groups is None else (groups.codes, groups.categories)
        kw = dict(
            mask=mask, dtype=dtype, split_every=self.split_every,
            group_scatter=getattr(self, "equalize_covariance", None) is not None,
            progress=self.progress,
        )
        if weights is not None:
            kw["weights"] = weights
        if checkpoint is None:
            m = coded_moments(X, codes, cats, **kw)
        else:
            m = coded_moments_checkpointed(X, codes, cats, checkpoint=checkpoint, **kw)
        m.check_finite()
        return m

    # ------------------------------------------------------------------ fitting
    def _fit(self, X, y=None, sensitive_features=None, sample_weight=None, *, checkpoint=None,
             keep_checkpoint: bool = False, timeout=None):
        """``fit``: the input checked, the one pass (or the matrix-free passes where the
        estimator runs them), the solve; ``checkpoint`` released after it unless kept."""
        with worker_timeout(timeout):
            f = self._read(X, y, sensitive_features, sample_weight, reset=True)
            if not self._fit_matrix_free(f, checkpoint):
                self._fit_statistics(self._pass(f.data, f.groups, f.mask, checkpoint,
                                                numeric=f.n_numeric > 0, weights=f.weights))
        release(checkpoint, keep_checkpoint)
        return self

    def _fit_matrix_free(self, f: FairInput, checkpoint) -> bool:
        """Fit without the d x d statistics where the estimator chooses to (True if it did)."""
        return False

    def _fit_statistics(self, m: Moments) -> Self:
        """Solve from the statistics and keep the fitted attributes (an estimator may take
        more, keyword-only, arguments: the names of what it was fitted with)."""
        raise NotImplementedError

    def _solvable(self, m: Moments) -> bool:
        """Whether the statistics gathered by partial_fit can be solved yet (a piece may
        hold a single group of an attribute)."""
        return all(np.sum(a.counts > 0) >= 2 for a in m.attributes)

    def _check_partial(self) -> None:
        """Raise where partial_fit cannot add rows to the statistics."""

    def _partial_fit(self, X, y, sensitive_features, sample_weight):
        """``partial_fit``: the statistics of X merged with those gathered so far, solved
        once they can be (until then only kept)."""
        self._check_partial()
        before: Moments | None = getattr(self, "statistics_", None)
        first = before is None
        f = self._read(X, y, sensitive_features, sample_weight, reset=first, partial=True)
        m = self._pass(f.data, f.groups, f.mask, numeric=f.n_numeric > 0, weights=f.weights)
        if before is not None:
            m = merge([before, m])
        if not self._solvable(m):
            self.statistics_ = m
            self.n_samples_seen_ = m.rows
            return self
        return self._fit_statistics(m)

    @fit_context
    def partial_fit(self, X: ArrayInput, y: Any = None, *,
                    sample_weight: ArrayInput | None = None) -> Self:
        """Add the rows of X to the statistics seen so far and refit (equals fit on the union).

        Until the statistics can be solved (``n_components`` rows seen) only they are
        kept.  Always the exact solve (it adds to the d x d statistics); not after a
        randomized fit.

        Parameters
        ----------
        X : array-like of shape (n, d) or (n, h, w)
            More rows, with the features of the earlier calls.
        y : None
            Ignored; present for the scikit-learn API.
        sample_weight : array-like of shape (n,), optional
            As in ``fit`` (calls with and without weights mix: no weights is weight 1).

        Returns
        -------
        self
            The fitted estimator.
        """
        return self._partial_fit(X, y, None, sample_weight)

    def _not_fitted_hint(self) -> str:
        if hasattr(self, "statistics_"):
            return (" (partial_fit has not yet seen two groups of every attribute, or "
                    "n_components rows)")
        return ""

    def _checked_statistics(self, m: Moments, num, names) -> list:
        """The attribute names (given, else "attribute 0", ...) of statistics ``m`` whose
        columns ``num`` are numeric protected attributes; raise unless they carry
        protected attributes, each labelled one with two non-empty groups."""
        if not isinstance(m, Moments):
            raise InvalidInputError(f"statistics must be a dfairpca.Moments; got {type(m).__name__}")
        p, q = len(m.attributes), len(num)
        if p + q == 0:
            raise InvalidInputError(f"these statistics carry no groups; {type(self).__name__} "
                                    "needs protected attributes")
        if q and (num.min() < 0 or num.max() >= m.n_features):
            raise InvalidInputError(f"numeric columns {num.tolist()} are not columns of the "
                                    f"statistics' {m.n_features}")
        names = list(names or [])
        if len(names) != p + q:
            names = [f"attribute {j}" for j in range(p + q)]
        for name, a in zip(names, m.attributes):
            present = int(np.sum(a.counts > 0))
            if present < 2:
                raise InvalidInputError(f"{name} has {present} non-empty group(s) among the "
                                        f"rows seen; {self._two_groups_for}")
        return names


class FairStatisticsEstimator(StatisticsEstimator):
    """A :class:`StatisticsEstimator` of data with protected attributes (FairPCA, ConceptEraser)."""

    _takes_groups = True

    @fit_context
    def partial_fit(self, X: ArrayInput, y: ArrayInput | None = None, *,
                    sensitive_features: ArrayInput | None = None,
                    sample_weight: ArrayInput | None = None) -> Self:
        """Add the rows of X to the statistics and refit; a sequence of calls equals one fit
        on the union (the statistics merge exactly).

        Until every attribute has shown two groups the statistics are kept and the model
        is not fitted yet.  Always the exact solve (it adds to the d x d statistics).

        Parameters
        ----------
        X : array-like of shape (n, d) or (n, h, w)
            More rows, with the columns (and sensitive columns) of the earlier calls.
        y : array-like of shape (n,), optional
            Binary task label, as in ``fit`` (never taken for the protected attributes).
        sensitive_features : array-like, list of arrays or DataFrame, optional
            The rows' protected attribute(s), as in ``fit``; the same attributes in every
            call (a call may see only some of the groups).
        sample_weight : array-like of shape (n,), optional
            As in ``fit`` (a call without weights: weights of 1).

        Returns
        -------
        self
            The estimator, fitted once the statistics can be solved.
        """
        return self._partial_fit(X, y, sensitive_features, sample_weight)

    def _not_fitted_hint(self) -> str:
        if hasattr(self, "statistics_"):
            return " (partial_fit has not yet seen two groups of every attribute)"
        return ""


def release(checkpoint, keep: bool) -> None:
    """Delete a successful fit's checkpoint unless the caller keeps it."""
    if checkpoint is not None and not keep:
        from ..io import remove_directory

        remove_directory(checkpoint, "checkpoint")


def check_layout(est, inp: Input, d: int | None) -> None:
    """Raise unless X's sensitive columns sit where they sat when ``est`` was fitted on d
    features (a DataFrame column of labels at fit and of numbers now would move the
    others); d None: where they sat in the earlier partial_fit calls, which gave the same
    sensitive columns (X's width is compared with their statistics')."""
    fitted = np.asarray(getattr(est, "numeric_sensitive_columns_", ()), dtype=np.intp)
    if d is None:
        before = np.asarray(getattr(est, "sensitive_feature_indices_", ()), dtype=np.intp)
        if not (np.array_equal(inp.sensitive, before) and np.array_equal(inp.numeric, fitted)):
            raise InvalidInputError(
                "X's sensitive columns differ from those of the earlier partial_fit calls: "
                "give the same columns, with the same dtypes"
            )
    elif inp.data.shape[1] != d + len(fitted) or not np.array_equal(inp.numeric, fitted):
        raise InvalidInputError(
            f"X's sensitive columns differ from those at fit ({len(inp.numeric)} numeric "
            f"of {inp.data.shape[1]} read now, {len(fitted)} at fit): give the columns the "
            "dtypes they had at fit"
        )


def set_certificate(est, per_group) -> None:
    """Record a certified fit's ``fairness_violation_per_attribute_`` (the worst share per
    attribute) and ``fairness_violation_`` (the worst of all) on ``est``."""
    est.fairness_violation_per_attribute_ = np.array([float(v.max(initial=0.0)) for v in per_group])
    est.fairness_violation_ = float(est.fairness_violation_per_attribute_.max())


def fair_feature_names(est, names) -> np.ndarray:
    """``names`` ("<class>0", ...) with the λ-scaled standard half of a ``tradeoff > 0``
    model named "<class>_standard0", ... (the first k stay the fair ones)."""
    k = est.n_components_
    if len(names) == k:
        return names
    prefix = type(est).__name__.lower()
    return np.asarray([f"{prefix}{i}" for i in range(k)] + [f"{prefix}_standard{i}" for i in range(k)],
                      dtype=object)
