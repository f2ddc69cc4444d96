"""The one base of the estimators: what PCA, FairPCA and FairKernelPCA share.

:class:`Estimator` holds what every estimator does alike: the parameter check (the class's
``_parameter_rules``, :mod:`dfairpca.base._params`), the fitted check, the output width and
names that scikit-learn's ``get_feature_names_out`` reads, ``fit_transform``, and the
save/load path (:mod:`dfairpca.decomposition._saved`).  The linear estimators add the shared transform
and probabilistic model (:class:`dfairpca.decomposition._linear.LinearDecomposition`); each concrete
class declares its parameters, its fit and what it saves.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy.typing as npt

import numpy as np
from sklearn.base import BaseEstimator, ClassNamePrefixFeaturesOutMixin, TransformerMixin
from sklearn.exceptions import NotFittedError

from ..base._compat import current_params
from ..base._params import validate_params
from ._saved import input_meta, restore_input_meta
from ..base._typing import ArrayInput, ArrayOutput, PathInput

__all__ = ["Estimator", "set_certificate", "fair_feature_names"]


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
        from ..io import atomic_directory, storage_for, write_arrays

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
        from ..io import SavedFileError

        raise SavedFileError(f"cannot load {str(path)!r}: a {type(self).__name__} saves no "
                             "statistics/, so it was not written by dfairpca: save the model again")


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
