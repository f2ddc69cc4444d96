"""How good and how fair a representation is (the measures of the paper's Sec. 5.1).

* :func:`explained_variance_pct`: ``100 trace(U^T A U) / trace(A)``, A the covariance of
  (held-out) data; one pass of :func:`dfairpca.compute_moments` for chunked data.
* :func:`mmd2`: squared maximum mean discrepancy between the groups' representations with a
  Gaussian kernel ``exp(-||a - b||^2 / (2 sigma^2))`` (biased V-statistic, as Lee et al.
  2022), the largest over pairs of groups when there are more than two;
  :func:`mmd_bandwidth` is their bandwidth rule.  O(n^2): on chunked or large data both take
  a uniform random sample of at most ``max_samples`` rows per group (documented default
  2,000, fixed seed).
* :func:`linear_inseparability`: balanced error of a logistic regression that predicts the
  group from the representation (1 - 1/m = m groups linearly indistinguishable, 0 =
  separable).
* :func:`group_reconstruction_error`: what a projection costs each group, the mean squared
  reconstruction error per group, and its ratio to a baseline's (standard PCA at the same
  k: the price of fairness per group); one pass for chunked data.

A downstream classifier's demographic-parity and equal-opportunity gaps (the paper's ΔDP
and ΔEO) are fairlearn's, which also handles intersectional groups and sample weights::

    from fairlearn.metrics import demographic_parity_difference, equal_opportunity_difference
    demographic_parity_difference(y_true, y_pred, sensitive_features=z)   # ΔDP
    equal_opportunity_difference(y_true, y_pred, sensitive_features=z)    # ΔEO
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from .base._typing import ArrayInput, Seed
from .errors import InvalidInputError, InvalidTypeError

if TYPE_CHECKING:
    import dask.array
    import pandas as pd

    from .decomposition._linear import LinearDecomposition

    #: a representation Y: numpy or Dask, (n, k)
    Representation = np.ndarray | dask.array.Array

__all__ = [
    "explained_variance_pct",
    "mmd2",
    "mmd_bandwidth",
    "linear_inseparability",
    "group_reconstruction_error",
]


def _dense(a) -> np.ndarray:
    return np.asarray(a.compute() if hasattr(a, "compute") else a, dtype=np.float64)


def explained_variance_pct(X: ArrayInput, components: npt.ArrayLike) -> float:
    """Percentage of the (centred) variance of X captured by the rows of ``components``.

    Parameters
    ----------
    X : array-like of shape (n, d)
        numpy, Dask or Zarr array; chunked input is reduced in one pass.
    components : array-like of shape (k, d)
        Orthonormal rows, e.g. a fitted model's ``components_``.

    Returns
    -------
    float
        The share of the trace of X's scatter matrix that the components span, in percent.
    """
    from .engine._engine import compute_moments
    from .inputs._validation import as_data

    Xa = as_data(X)
    U = np.asarray(components, dtype=np.float64)
    if U.ndim != 2 or U.shape[1] != Xa.shape[1]:
        raise InvalidInputError(f"components must be (k, {Xa.shape[1]}); got {U.shape}")
    A = compute_moments(Xa).full_scatter()
    return float(100.0 * np.sum((U @ A) * U) / np.trace(A))


def _sample_rows(Y, idx, max_samples, rng):
    idx = np.flatnonzero(idx)
    if max_samples is not None and idx.size > max_samples:
        idx = np.sort(rng.choice(idx, max_samples, replace=False))
    return _dense(Y[idx]) if hasattr(Y, "compute") else np.asarray(Y, np.float64)[idx]


def _sq_dists(A, B):
    d = (A * A).sum(1)[:, None] + (B * B).sum(1)[None, :] - 2.0 * A @ B.T
    return np.maximum(d, 0.0)


def mmd_bandwidth(Y: Representation, max_samples: int | None = 2000, random_state: Seed = 0) -> float:
    """Bandwidth rule of Lee et al. (2022): ``sigma = sqrt(median ||y_i - y_j||^2 / 2)``.

    Parameters
    ----------
    Y : array-like of shape (n, k)
        numpy or Dask array, typically the training data projected by standard PCA.
    max_samples : int or None
        Rows sampled when Y has more (the median is over the distinct pairs i < j of the
        sample); None: every row (n^2 / 2 distances).
    random_state : int or numpy.random.Generator
        Seed of the sample.

    Returns
    -------
    float
        The bandwidth sigma, for :func:`mmd2`.
    """
    rng = np.random.default_rng(random_state)
    S = _sample_rows(Y, np.ones(Y.shape[0], bool), max_samples, rng)
    D = _sq_dists(S, S)
    iu = np.triu_indices(S.shape[0], k=1)
    return float(np.sqrt(np.median(D[iu]) / 2.0))


def mmd2(Y: Representation, groups: npt.ArrayLike, sigma: float, max_samples: int | None = 2000,
         random_state: Seed = 0) -> float:
    """Squared MMD between the groups of rows of Y (biased V-statistic).

    Parameters
    ----------
    Y : array-like of shape (n, k)
        The representation (numpy or Dask).
    groups : array-like of shape (n,)
        Labels with two or more distinct values; with more than two the largest pairwise
        MMD² is returned (the worst-treated pair, as ΔDP takes max - min).
    sigma : float
        Gaussian kernel bandwidth (see :func:`mmd_bandwidth`).
    max_samples : int or None
        Rows sampled per group when a group is larger (None: use all).
    random_state : int or numpy.random.Generator
        Seed of the samples.

    Returns
    -------
    float
        The squared MMD (0 when the groups' samples have the same distribution under
        the kernel).
    """
    groups = np.asarray(groups)
    if groups.ndim != 1 or groups.shape[0] != Y.shape[0]:
        raise InvalidInputError(
            f"groups must be 1-D with one label per row of Y ({Y.shape[0]}); got shape "
            f"{groups.shape} (for several attributes pass one combined label per row)"
        )
    cats = np.unique(groups)
    if len(cats) < 2:
        raise InvalidInputError(f"mmd2 compares two or more groups; got {len(cats)} ({cats[:5]})")
    if not sigma > 0:
        raise InvalidInputError(f"sigma must be positive; got {sigma}")
    rng = np.random.default_rng(random_state)
    samples = [_sample_rows(Y, groups == c, max_samples, rng) for c in cats]
    g = 1.0 / (2.0 * sigma**2)
    within = [np.exp(-g * _sq_dists(A, A)).mean() for A in samples]
    worst = 0.0
    for i in range(len(samples)):
        for j in range(i + 1, len(samples)):
            kab = np.exp(-g * _sq_dists(samples[i], samples[j])).mean()
            worst = max(worst, float(within[i] + within[j] - 2.0 * kab))
    return worst


def linear_inseparability(Y_train: Representation, g_train: npt.ArrayLike, Y_test: Representation,
                          g_test: npt.ArrayLike, C: float = 1.0) -> float:
    """Balanced error of a logistic regression predicting the group (higher is fairer).

    With m groups the regression is multinomial and chance level is ``1 - 1/m``.

    Parameters
    ----------
    Y_train : array-like of shape (n_train, k)
        Representation the regression is fitted on (numpy or Dask).
    g_train : array-like of shape (n_train,)
        The group of each training row.
    Y_test : array-like of shape (n_test, k)
        Representation the regression is scored on.
    g_test : array-like of shape (n_test,)
        The group of each test row.
    C : float
        Inverse regularisation strength of the logistic regression.

    Returns
    -------
    float
        ``1 - balanced accuracy`` on the test rows.
    """
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import balanced_accuracy_score

    clf = LogisticRegression(C=C, max_iter=2000).fit(_dense(Y_train), np.asarray(g_train))
    return float(1.0 - balanced_accuracy_score(np.asarray(g_test), clf.predict(_dense(Y_test))))


def group_reconstruction_error(model: LinearDecomposition, X: ArrayInput, sensitive_features: ArrayInput | None = None,
                               *, baseline: LinearDecomposition | None = None) -> pd.DataFrame:
    """Per group, the mean squared reconstruction error of ``model`` on X.

    The error of a row is ``||x - inverse_transform(transform(x))||^2`` summed over the
    reconstructed features (the model's columns: those named by ``sensitive_feature_ids``
    are not reconstructed), averaged over the rows of each group.  Fair PCA gives up some
    reconstruction to equalise the groups' means, and not every group pays the same: the
    ratio to standard PCA's error at the same k shows who pays.

    Parameters
    ----------
    model : fitted :class:`~dfairpca.PCA` or :class:`~dfairpca.FairPCA`
        Any fitted estimator with ``transform`` and ``inverse_transform``.
    X : array-like, Dask or Zarr array of shape (n_samples, n_features_in_)
        Data as the model takes it; chunked input is read once, out of core (the model
        and the baseline are evaluated in the same pass).
    sensitive_features : array-like of shape (n_samples,) or (n_samples, p), or DataFrame
        The group of every row, labels of any type; several attributes give one row per
        combination present (intersectional groups).  Default: the non-numeric columns of
        X the model names by ``sensitive_feature_ids``.
    baseline : fitted estimator, optional
        Typically ``dfairpca.PCA(model.n_components_).fit(X_train)``: its error per group
        and the ratio ``error / baseline_error`` are added.  It must reconstruct the same
        features as ``model``.

    Returns
    -------
    pandas.DataFrame
        Indexed by group (a MultiIndex for several attributes), sorted; columns ``rows``,
        ``error`` and, with a baseline, ``baseline_error`` and ``ratio``.

    Examples
    --------
    The same numbers from fairlearn's ``MetricFrame`` (numpy input)::

        from fairlearn.metrics import MetricFrame
        R = model.inverse_transform(model.transform(X))
        sq = lambda x, r: float(((x - r) ** 2).sum(axis=1).mean())
        MetricFrame(metrics=sq, y_true=X, y_pred=R, sensitive_features=z).by_group
    """
    import dask
    import dask.array as da
    import pandas as pd

    from .inputs._groups import encode_groups
    from .engine._compute import with_known_rows

    models = [model] if baseline is None else [model, baseline]
    for m in models:
        if not (hasattr(m, "transform") and hasattr(m, "inverse_transform")):
            raise InvalidTypeError(
                f"{type(m).__name__} has no inverse_transform, so it has no reconstruction "
                "error (a kernel method's representation has no way back to the features): "
                "pass a fitted PCA or FairPCA"
            )
        if not hasattr(m, "components_"):
            raise InvalidInputError(f"{type(m).__name__} is not fitted: call fit first")
    if isinstance(X, da.Array):  # rows filtered by their values: their count, in one read
        X, sensitive_features = with_known_rows(X, sensitive_features)
    inp = model._input(X, reset=False)
    if sensitive_features is None:
        if inp.labels is None:
            raise InvalidInputError(
                "group_reconstruction_error needs the group of every row: pass "
                "sensitive_features= (labels, or a DataFrame of several attributes)"
            )
        sensitive_features = inp.labels
    data = inp.data[:, inp.features] if len(inp.numeric) else inp.data
    # the reconstructed features: X less the model's protected columns; a baseline may take
    # X as the model does, or those features alone (a PCA fitted without the protected columns)
    if baseline is not None and baseline.n_features_in_ not in (model.n_features_in_, data.shape[1]):
        raise InvalidInputError(
            f"the baseline takes {baseline.n_features_in_} features; the model takes "
            f"{model.n_features_in_} and reconstructs {data.shape[1]}: fit the baseline on the "
            "same features (with or without the protected columns)"
        )
    n = data.shape[0]
    groups = encode_groups(sensitive_features, n, require_two=False)
    # one code per combination of the attributes' groups present
    combos, codes = np.unique(groups.codes, axis=0, return_inverse=True)
    codes = codes.reshape(-1)
    errors = []
    for m in models:
        source = X if m is model or m.n_features_in_ == model.n_features_in_ else _without(X, inp.sensitive)
        R = m.inverse_transform(m.transform(source))
        if R.shape[1] != data.shape[1]:
            raise InvalidInputError(
                f"{type(m).__name__} reconstructs {R.shape[1]} features, the model "
                f"{data.shape[1]}: the baseline must be fitted on the same features"
            )
        errors.append(_row_errors(data, R))
    if isinstance(errors[0], da.Array):
        c = da.from_array(codes, chunks=(errors[0].chunks[0],))
        sums = dask.compute(*[da.bincount(c, weights=e, minlength=len(combos)) for e in errors])
    else:
        sums = [np.bincount(codes, weights=e, minlength=len(combos)) for e in errors]
    rows = np.bincount(codes, minlength=len(combos))
    labels = [[groups.categories[j][i] for j, i in enumerate(combo)] for combo in combos]
    if groups.n_attributes == 1:
        index = pd.Index([lab[0] for lab in labels], name=groups.names[0])
    else:
        index = pd.MultiIndex.from_tuples([tuple(lab) for lab in labels], names=groups.names)
    out = pd.DataFrame({"rows": rows, "error": sums[0] / rows}, index=index)
    if baseline is not None:
        out["baseline_error"] = sums[1] / rows
        out["ratio"] = out["error"] / out["baseline_error"]
    return out


def _without(X, positions):
    """X without its columns at ``positions`` (a DataFrame keeps its column names)."""
    keep = np.setdiff1d(np.arange(X.shape[1]), np.asarray(positions, dtype=np.intp))
    return X.iloc[:, keep] if hasattr(X, "iloc") else X[:, keep]


def _row_errors(X, R):
    """``||x - r||^2`` of every row, in float64 (lazy for Dask input)."""
    import dask.array as da

    if isinstance(X, da.Array) or isinstance(R, da.Array):
        X = da.asarray(X)
        R = da.asarray(R).rechunk({0: X.chunks[0]})
        return ((X.astype(np.float64) - R.astype(np.float64)) ** 2).sum(axis=1)
    diff = np.asarray(X, np.float64) - np.asarray(R, np.float64)
    return np.einsum("ij,ij->i", diff, diff)
