"""The saved-model format of the estimators: what ``save`` writes and ``load`` checks.

A model is a directory ``model/`` (``meta.json``: the class, its parameters and the
fitted scalars; ``arrays.npz``: the fitted arrays, never pickled) and, for the linear
estimators, an optional ``statistics/`` (:meth:`Moments.save`).  :func:`load` looks the
class up among those registered (:func:`dfairpca.io.register_model_class`) and checks
everything before it is trusted: meta.json's keys and types for that class (its
``_saved_layout``), the declared shape of every array against the others before any is
read (:func:`dfairpca.io.load_arrays`), then the values (the class's ``_check_restored``).  Models written by earlier versions, which
lack some keys, still load: each check says which keys may be absent.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..solve import _fairness
from ..base._compat import current_params
from ..base._params import validate_params
from ..io import (categories_from_json, categories_to_json, meta_value, model_class, model_class_names,
                  saved_group_counts, storage_for)
from ..stats.moments import Moments
from ..base._typing import PathInput
from ..errors import InvalidInputError

# Deferred imports: package modules that load such libraries, or this module, at import are imported
# in the functions that use them, so that importing this module stays light.

if TYPE_CHECKING:  # the estimators' base (._base imports this module)
    from sklearn.base import BaseEstimator

__all__ = ["load", "input_meta", "restore_input_meta", "fair_meta", "restore_fair_meta",
           "saved_params", "saved_input_meta", "saved_certificate", "saved_groups",
           "linear_layout", "kernel_layout", "eraser_layout", "check_linear_values",
           "check_eraser_values", "load_statistics"]


def load(path: PathInput, *, storage_options: dict | None = None) -> BaseEstimator:
    """Load a model written by ``save``; reads only .npz arrays and JSON, never pickle.

    Everything is checked before it is trusted: meta.json's keys and types for the model's
    class, the declared shape of every array against the others (before any is read) and
    their values (finite, orthonormal components).  A truncated, edited or inconsistent
    model, or one holding a link, a named pipe or a device where dfairpca wrote a file or a
    folder, raises :class:`dfairpca.io.SavedFileError` naming the file and what is wrong.

    Parameters
    ----------
    path : str, os.PathLike or fsspec mapper
        The directory ``save`` wrote; a URL (with ``storage_options``) or an fsspec mapper
        is read through a local copy.
    storage_options : dict, optional
        fsspec options of a URL (credentials, endpoint).

    Returns
    -------
    PCA, FairPCA or FairKernelPCA
        The fitted estimator, of the class that was saved, with its statistics where they
        were saved with it.
    """
    # a local model is read where it is (a replace cut short: the intact old version put
    # back first), a URL's from a local copy
    with storage_for(path, storage_options).local_copy() as local:
        return _load_folder(local)


def _load_folder(path: Path) -> BaseEstimator:
    """:func:`load` of the local folder ``path``."""
    from ..io import RESAVE_HINT, SavedFileError, check_folder, load_arrays

    # the model's files: at the top of its folder, or (saved by 0.2) in its "model" folder
    files = path / "model" if is_older_layout(path) else path
    try:
        check_folder(files)
        check_folder(path / "statistics")
    except SavedFileError as exc:
        raise SavedFileError(f"cannot load {str(path)!r}: {exc}{RESAVE_HINT}") from None
    arrays, meta = load_arrays(files, kind="estimator", layout=_layout)
    try:
        est = model_class(meta["class"])._from_saved(arrays, meta)
    except ValueError as exc:
        raise SavedFileError(f"cannot load {str(files)!r}: {exc}; it was edited or "
                             "not written by dfairpca: save the model again") from None
    if (path / "statistics").exists():
        est._restore_statistics(path)
    return est


def is_older_layout(path: Path) -> bool:
    """Whether the saved model at ``path`` keeps its files in a ``model`` folder (as dfairpca
    0.2 and older saved them) rather than at the top of ``path``."""
    return not (path / "meta.json").exists() and (path / "model" / "meta.json").exists()


def _layout(meta: dict, headers: dict) -> dict:
    """Check meta.json's class against the registry, then the rest for that class."""
    name = meta_value(meta, "class", model_class_names())
    return model_class(name)._saved_layout(meta, headers)


# ---------------------------------------------------------------------------- what every model keeps
def input_meta(est) -> dict:
    """What a saved model keeps of the input's layout: column names, sensitive columns."""
    out: dict[str, list] = {}
    if hasattr(est, "feature_names_in_"):
        out["feature_names_in_"] = [str(c) for c in est.feature_names_in_]
    for a in ("sensitive_feature_indices_", "numeric_sensitive_columns_"):
        if hasattr(est, a):
            out[a] = [int(i) for i in getattr(est, a)]
    return out


def restore_input_meta(est, meta: dict) -> None:
    """Set what :func:`input_meta` saved (checked by :func:`saved_input_meta`)."""
    if "feature_names_in_" in meta:
        est.feature_names_in_ = np.asarray(meta["feature_names_in_"], dtype=object)
    takes_ids = "sensitive_feature_ids" in est.get_params()  # models saved before: none
    for a in ("sensitive_feature_indices_", "numeric_sensitive_columns_"):
        if a in meta or takes_ids:
            setattr(est, a, np.asarray(meta.get(a, []), dtype=np.intp))


def fair_meta(est) -> dict:
    """A fair model's groups (as JSON) and its fairness certificate (which a model loaded
    from before fits were certified lacks)."""
    out: dict[str, Any] = {"groups_": [categories_to_json(c) for c in est.groups_]}
    if hasattr(est, "fairness_violation_"):
        out["fairness_violation_"] = float(est.fairness_violation_)
    if hasattr(est, "fairness_violation_per_attribute_"):
        out["fairness_violation_per_attribute_"] = [float(v) for v in est.fairness_violation_per_attribute_]
    return out


def restore_fair_meta(est, meta: dict) -> None:
    """Set what :func:`fair_meta` saved (models saved before fits were certified lack the
    certificate)."""
    est.groups_ = [categories_from_json(c) for c in meta["groups_"]]
    if "fairness_violation_" in meta:
        est.fairness_violation_ = float(meta["fairness_violation_"])
    if "fairness_violation_per_attribute_" in meta:
        est.fairness_violation_per_attribute_ = np.array(meta["fairness_violation_per_attribute_"], float)


# ---------------------------------------------------------------------------- meta.json checks
def saved_params(cls, meta: dict) -> dict:
    """meta.json's ``params``, checked to be ``cls``'s parameters with valid values."""
    params = meta_value(meta, "params", "dict")
    unknown = sorted(set(params) - set(cls._get_param_names()))
    if unknown:
        raise InvalidInputError(f"meta.json: 'params' has keys {unknown} that {cls.__name__} does not take")
    try:
        validate_params(cls(**current_params(params)))
    except (ValueError, TypeError) as exc:
        raise InvalidInputError(f"meta.json: 'params': {exc}") from None
    return params


def saved_input_meta(meta: dict, width: int) -> tuple[list, list]:
    """Check meta.json's ``feature_names_in_`` (width strings), ``sensitive_feature_indices_``
    (distinct columns of X) and ``numeric_sensitive_columns_`` (as many or fewer columns of
    the statistics); all optional.  Returns the last two."""
    names = meta_value(meta, "feature_names_in_", "list", optional=True)
    if names is not None and (len(names) != width or not all(isinstance(c, str) for c in names)):
        raise InvalidInputError(f"meta.json: 'feature_names_in_' must be {width} strings; got {names!r:.80}")
    sensitive = meta_value(meta, "sensitive_feature_indices_", "list", optional=True) or []
    numeric = meta_value(meta, "numeric_sensitive_columns_", "list", optional=True) or []
    ints = all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < width
               for i in sensitive + numeric)
    if not ints or len(set(sensitive)) != len(sensitive) or len(set(numeric)) != len(numeric) \
            or len(numeric) > len(sensitive) or len(sensitive) >= width:
        raise InvalidInputError(
            f"meta.json: 'sensitive_feature_indices_' {sensitive!r:.60} and "
            f"'numeric_sensitive_columns_' {numeric!r:.60} must be distinct columns of the "
            f"{width}, the second no more than the first, leaving a feature"
        )
    return sensitive, numeric


def saved_certificate(meta: dict, p: int) -> None:
    """Check meta.json's fairness certificate: ``fairness_violation_`` a number >= 0 and
    ``fairness_violation_per_attribute_`` p of them (both absent in models saved before
    fits were certified)."""
    total = meta_value(meta, "fairness_violation_", "number", optional=True)
    per = meta_value(meta, "fairness_violation_per_attribute_", "list", optional=True)
    if total is None and per is None:
        return
    ok = (total is not None and per is not None and total >= 0 and len(per) == p
          and all(isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v <= total
                  for v in per))
    if not ok:
        raise InvalidInputError(f"meta.json: 'fairness_violation_' {total!r:.40} and "
                         f"'fairness_violation_per_attribute_' {per!r:.80} must be a number >= 0 "
                         f"and {p} numbers between 0 and it")
    if total > _fairness.FAIRNESS_TOLERANCE:  # a fit above it raises: no model carries one
        raise InvalidInputError(f"meta.json: 'fairness_violation_' {total:g} is above the tolerance "
                         f"{_fairness.FAIRNESS_TOLERANCE:g} that every fit is certified to")


def saved_groups(meta: dict, q: int = 0) -> list[int]:
    """Group counts of each attribute from meta.json's ``groups_`` and ``attribute_names_``
    (which also names the q numeric attributes, after the labelled ones)."""
    groups = meta_value(meta, "groups_", "list")
    names = meta_value(meta, "attribute_names_", "list")
    if len(groups) + q < 1 or len(names) != len(groups) + q or not all(isinstance(n, str) for n in names):
        raise InvalidInputError(f"meta.json: 'attribute_names_' must name each of the {len(groups)} "
                         f"attributes of 'groups_' and the {q} numeric ones (at least one); got "
                         f"{names!r:.80}")
    return saved_group_counts(groups, "groups_", [repr(n) for n in names[:len(groups)]])


def linear_layout(cls, meta: dict, fair: bool) -> dict:
    """Check a saved PCA's (``fair``: FairPCA's) meta.json; the arrays it implies."""
    saved_params(cls, meta)
    width = meta_value(meta, "n_features_in_", "positive")
    sensitive, numeric = saved_input_meta(meta, width)
    d = width - len(sensitive)  # the projected columns
    k = meta_value(meta, "n_components_", "positive")
    meta_value(meta, "n_samples_seen_", "count")
    noise = meta_value(meta, "noise_variance_", "number", optional=True)
    if noise is not None and noise < 0:
        raise InvalidInputError(f"meta.json: 'noise_variance_' must be >= 0; got {noise!r}")
    weight = meta_value(meta, "sample_weight_sum_", "number", optional=True)  # weighted fits
    if weight is not None and not (np.isfinite(weight) and weight > 0):
        raise InvalidInputError(f"meta.json: 'sample_weight_sum_' must be a positive number; got {weight!r}")
    if k > d:
        raise InvalidInputError(f"meta.json: 'n_components_' {k} exceeds the {d} projected features")
    specs = {"components_": ((k, d), "f"), "mean_": ((d,), "f"),
             "scale_": ((d,), "f" if meta["params"].get("standardize") else "?f"),
             "explained_variance_": ((k,), "f"), "explained_variance_ratio_": ((k,), "f"),
             "singular_values_": ((k,), "?f")}  # absent in models saved before it was fitted
    if fair:
        ms = saved_groups(meta, len(numeric))
        saved_certificate(meta, len(ms) + len(numeric))
        r = meta_value(meta, "n_constraints_", "count")
        meta_value(meta, "max_components_", "int")
        if r + k > d:
            raise InvalidInputError(f"meta.json: {k} components and {r} constraints exceed {d} features")
        specs["constraint_basis_"] = ((d, r), "f")
        specs["standard_components_"] = ((k, d), "?f")
        specs["standard_explained_variance_"] = ((k,), "?f")
        for j, m in enumerate(ms):
            specs[f"group_means_{j}"] = ((m, d), "f")
    elif sensitive:
        raise InvalidInputError("meta.json: a PCA has no sensitive columns")
    return specs


def kernel_layout(cls, meta: dict, kernels: tuple) -> dict:
    """Check a saved FairKernelPCA's meta.json (its kernel one of ``kernels``: a saved
    kernel is a name, never code); the shape and kind of each array it implies."""
    kernel = meta_value(meta, "params", "dict").get("kernel", "rbf")
    if kernel not in kernels:
        raise InvalidInputError(f"meta.json: kernel {kernel!r:.40} is not one of {list(kernels)}")
    params = saved_params(cls, meta)
    gamma = meta_value(meta, "gamma_", "number", optional=True)
    if (gamma is None) != (kernel == "linear") or (gamma is not None and gamma <= 0):
        raise InvalidInputError(f"meta.json: 'gamma_' {gamma!r} does not suit the {kernel} kernel")
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
        raise InvalidInputError(f"meta.json: 'n_landmarks_' {b} exceeds 'n_samples_seen_' {n}")
    out = 2 * k if params.get("tradeoff", 0) > 0 else k
    # the basis keeps X's dtype (integers too): transform casts it to float64 either way
    return {"basis_": ((b, d), "fiu"), "basis_indices_": ((b,), "iu"),
            "dual_coef_": ((b, out), "f"), "offset_": ((out,), "f"),
            "explained_variance_": ((k,), "f"), "explained_variance_ratio_": ((k,), "f"),
            "kernel_shift_": ((d,), "?f")}


def eraser_layout(cls, meta: dict) -> dict:
    """Check a saved ConceptEraser's meta.json; the shape and kind of each array it implies."""
    saved_params(cls, meta)
    width = meta_value(meta, "n_features_in_", "positive")
    sensitive, numeric = saved_input_meta(meta, width)
    d = width - len(sensitive)  # the erased columns
    meta_value(meta, "n_samples_seen_", "count")
    r = meta_value(meta, "n_constraints_", "count")
    s = meta_value(meta, "support_rank_", "count")
    rtol = meta_value(meta, "rtol_", "number")
    weight = meta_value(meta, "sample_weight_sum_", "number", optional=True)
    if weight is not None and not weight > 0:
        raise InvalidInputError(f"meta.json: 'sample_weight_sum_' must be a positive number; got {weight!r}")
    if r > d or s > d or not 0 <= rtol < 1:
        raise InvalidInputError(f"meta.json: 'n_constraints_' {r} and 'support_rank_' {s} must be at "
                                f"most the {d} features, 'rtol_' {rtol!r} in [0, 1)")
    ms = saved_groups(meta, len(numeric))
    saved_certificate(meta, len(ms) + len(numeric))
    specs = {"proj_left_": ((d, r), "f"), "proj_right_": ((r, d), "f"), "mean_": ((d,), "f")}
    for j, m in enumerate(ms):
        specs[f"group_means_{j}"] = ((m, d), "f")
    return specs


# ---------------------------------------------------------------------------- values
def check_eraser_values(est) -> None:
    """ValueError if a loaded ConceptEraser's arrays are not finite, or its erasure keeps
    more of a difference of its saved group means than the certificate's tolerance plus
    that difference's rounding (the stored certificate is recomputed, not trusted)."""
    L, R, mu = (np.asarray(a, np.float64) for a in (est.proj_left_, est.proj_right_, est.mean_))
    if not all(np.all(np.isfinite(a)) for a in (L, R, mu)):
        raise InvalidInputError("arrays.npz: 'proj_left_', 'proj_right_' and 'mean_' must be finite")
    eps = float(np.finfo(np.float64).eps)
    # |L R| bounds how much the rounding of a difference is amplified (1 for orth)
    gain = max(1.0, float(np.linalg.norm(L, 2) * np.linalg.norm(R, 2))) if L.size else 1.0
    names = getattr(est, "attribute_names_", None) or []
    for j, M in enumerate(getattr(est, "group_means_", [])):
        M = np.asarray(M, np.float64)
        for g in range(1, len(M)):
            diff = M[g] - M[0]
            size = float(_fairness.row_norms(diff[None])[0])
            if not size > 0:
                continue
            unit = diff / size
            kept = float(_fairness.row_norms((unit - L @ (R @ unit))[None])[0])
            rounding = 4 * eps * np.sqrt(M.shape[1]) * gain * (
                float(_fairness.row_norms(M[[0, g]]).sum()) / size)
            if kept > _fairness.FAIRNESS_TOLERANCE + rounding:
                name = names[j] if j < len(names) else f"attribute {j}"
                raise InvalidInputError(
                    f"arrays.npz: the erasure keeps {kept:.2e} of the difference between the "
                    f"saved means of two groups of {name} (a fitted eraser keeps at most "
                    f"{_fairness.FAIRNESS_TOLERANCE:g}): the model does not erase them")


def check_linear_values(est) -> None:
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
        raise InvalidInputError(f"arrays.npz: {problem}")


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
            size = float(_fairness.row_norms(diff[None])[0])
            if not size > 0:
                continue
            kept = float(_fairness.row_norms((U @ (diff / size))[None])[0])
            rounding = 4 * eps * np.sqrt(M.shape[1]) * (
                float(_fairness.row_norms(M[[0, g]]).sum()) / size)
            if kept > _fairness.FAIRNESS_TOLERANCE + rounding:
                name = names[j] if j < len(names) else f"attribute {j}"
                return (f"'components_' keep {kept:.2e} of the difference between the saved "
                        f"means of two groups of {name} (a fair model keeps at most "
                        f"{_fairness.FAIRNESS_TOLERANCE:g}): the model is not fair")
    return None


def load_statistics(est, path: Path) -> None:
    """Attach ``path/statistics`` to a loaded linear model, refusing statistics of another
    width or number of attributes (they were not saved with it)."""
    from ..io import SavedFileError

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
