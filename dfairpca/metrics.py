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
* :func:`fairness_report`: whether a representation's fairness holds on given (typically
  held-out) rows, per protected attribute: the largest gap between a group's mean and the
  overall mean in standard deviations with confidence bounds and a verdict against a
  tolerance, the p-value of a heteroscedastic test of equal group means (Johansen's
  Welch-James test, from additive statistics in one pass) and a cross-validated linear
  probe's ROC AUC; optionally beside a baseline's.

A downstream classifier's demographic-parity and equal-opportunity gaps (the paper's ΔDP
and ΔEO) are fairlearn's, which also handles intersectional groups and sample weights::

    from fairlearn.metrics import demographic_parity_difference, equal_opportunity_difference
    demographic_parity_difference(y_true, y_pred, sensitive_features=z)   # ΔDP
    equal_opportunity_difference(y_true, y_pred, sensitive_features=z)    # ΔEO
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from .base._typing import ArrayInput, Seed
from .engine._compute import compute, with_known_rows
from .errors import DfairpcaWarning, InvalidInputError, InvalidTypeError
from .inputs._validation import as_data, check_input, is_xarray
from .inputs._groups import encode_groups

# Deferred imports: dask, pandas, sklearn (heavy or optional) and package modules that load such
# libraries, or this module, at import are imported in the functions that use them, so that
# importing this module stays light.

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
    "fairness_report",
    "MAX_PROBE_ROWS",
]

#: rows of the representation the linear probe of :func:`fairness_report` is
#: cross-validated on, drawn at random when there are more: the AUC's standard error at
#: 20,000 rows is below 0.005 (Hanley and McNeil, 1982), well under the differences the
#: report is read for, and five logistic regressions on 20,000 x 400 take seconds
MAX_PROBE_ROWS = 20_000


def _dense(a) -> np.ndarray:
    return np.asarray(compute(a)[0] if hasattr(a, "compute") else a, dtype=np.float64)


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
    import dask.array as da
    import pandas as pd

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
        # the model's representation of the X checked above (transform would check it again)
        R = m.inverse_transform(m._represent(inp, X) if m is model else m.transform(source))
        if R.shape[1] != data.shape[1]:
            raise InvalidInputError(
                f"{type(m).__name__} reconstructs {R.shape[1]} features, the model "
                f"{data.shape[1]}: the baseline must be fitted on the same features"
            )
        errors.append(_row_errors(data, R))
    if isinstance(errors[0], da.Array):
        c = da.from_array(codes, chunks=(errors[0].chunks[0],))
        sums = list(compute(*[da.bincount(c, weights=e, minlength=len(combos)) for e in errors]))
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


def fairness_report(model, X: ArrayInput, sensitive_features: ArrayInput | None = None, *,
                    baseline=None, cv: int = 5, random_state: Seed = None,
                    tolerance: float = 0.1, alpha: float = 0.05,
                    max_probe_rows: int | None = MAX_PROBE_ROWS, progress: bool = False) -> pd.DataFrame:
    """How fair a fitted model's representation is on the rows of X, per protected attribute.

    A fair model's certificate (``fairness_violation_``) holds on the rows it was fitted
    on: there the groups' means in the representation are equal to rounding.  On other
    rows they differ by sampling noise at least; this report measures the difference,
    bounds the population's, and says whether it is below a ``tolerance``.  The
    representation is what ``model.transform(X)`` gives (every output column, the λ-scaled
    standard components of ``tradeoff > 0`` included).

    Parameters
    ----------
    model : fitted estimator with ``transform``
        PCA, FairPCA, FairKernelPCA, ConceptEraser, or a scikit-learn Pipeline ending in
        one (a Pipeline's groups are given by ``sensitive_features``).
    X : array-like, Dask or Zarr array of shape (n_samples, n_features_in_)
        Rows as the model takes them, typically held out from its fit.  Chunked input is
        read once, out of core: each chunk is transformed and folded into additive
        statistics of the representation (per group of every attribute: the count, the
        mean and the k x k scatter; overall: the scatter), and the probe's sample is copied
        out in the same pass; the model and the baseline are evaluated in that one pass.
    sensitive_features : array-like of shape (n_samples,) or (n_samples, p), or DataFrame
        The group of every row for each protected attribute, labels of any type.  Default:
        the non-numeric columns of X the model names by ``sensitive_feature_ids``.
    baseline : fitted estimator, optional
        Typically ``dfairpca.PCA(model.n_components_)`` fitted on the same rows as the
        model: its figures are added as columns prefixed ``baseline_``.  It takes X as the
        model does, or X without the model's protected columns.
    cv : int, default 5
        Folds of the probe's stratified cross-validation (fewer when a group has fewer
        rows of the sample: as many as its smallest group has, at least 2).
    random_state : int, numpy.random.Generator, numpy.random.RandomState or None
        Seed of the probe's sample and folds (None: fresh randomness).
    tolerance : float, default 0.1
        The largest group-mean gap, in standard deviations, the user accepts: the verdict
        compares the gap's confidence bounds with it.
    alpha : float, default 0.05
        1 minus the confidence level of the gap's bounds (simultaneous over groups and
        components).
    max_probe_rows : int or None, default :data:`MAX_PROBE_ROWS` (20,000)
        The probe is cross-validated on at most this many rows, a uniform random sample
        without replacement when X has more (the same rows whatever X's type or chunks);
        None: every row (held in memory: n x k floats).  The test and the gap always use
        every row.
    progress : bool, default False
        A bar of the pass over chunked X on the open progress report (standard error when
        none is open).

    Returns
    -------
    pandas.DataFrame
        One row per attribute, indexed by its name (the DataFrame's column, else the
        model's ``attribute_names_`` when it names as many, else 0, 1, ...; index name
        ``attribute``), with the columns

        * ``groups``: groups present in X;
        * ``max_mean_gap_sd``: the largest over groups g and components j of
          ``|mean of component j over group g - its mean over all rows|`` divided by its
          standard deviation over all rows (ddof 0; components constant on these rows are
          left out);
        * ``max_mean_gap_sd_lower``, ``max_mean_gap_sd_upper``: simultaneous (1 - alpha)
          confidence bounds of that gap in the population these rows are drawn from
          (per group and component a Welch interval, Sidak-corrected over them; the upper
          bound is infinite when a group has one row);
        * ``verdict``: "fair" when the upper bound is below ``tolerance``, "not fair" when
          the lower bound is above it, else "inconclusive" (too few rows to tell);
        * ``p_value``: of Johansen's (1980) Welch-James test that every group has the same
          mean vector, valid whatever the groups' covariances and sizes (see
          :mod:`dfairpca.stats.equal_means`); where a group has no more rows than there are
          components it runs on fewer directions and warns;
        * ``linear_probe_auc``: mean ROC AUC over ``cv`` folds of a logistic regression
          (standardised inputs) predicting the group from the representation: 0.5 is
          chance; one-vs-rest macro average for more than two groups;
        * ``probe_rows``: the rows the probe was cross-validated on;
        * with ``baseline``: the same figures prefixed ``baseline_``.

        Where the test cannot use every group or component (one group present, every
        component constant, a group of one row, a group of no more rows than components) a
        :class:`~dfairpca.DfairpcaWarning` says what it did; where the probe cannot run (a
        group of one row) its AUC is NaN.

    Examples
    --------
    ``group_reconstruction_error`` gives what each group pays; its rows join these::

        report = fairness_report(fair, X_test, z_test, baseline=pca, random_state=0)
        cost = group_reconstruction_error(fair, X_test, z_test, baseline=pca)
        report.join(pd.concat({"sex": cost}, names=["attribute", "group"]))
    """
    import dask.array as da
    import pandas as pd

    from .engine.sampled import moments_and_sample
    from .stats.equal_means import group_mean_test, verdict

    models = [model] if baseline is None else [model, baseline]
    for m in models:
        if not hasattr(m, "transform"):
            raise InvalidTypeError(f"{type(m).__name__} has no transform: pass a fitted PCA, "
                                   "FairPCA, FairKernelPCA, ConceptEraser or a Pipeline ending in one")
        _check_fitted(m)
    if not (isinstance(tolerance, (int, float, np.number)) and not isinstance(tolerance, bool)
            and tolerance > 0 and np.isfinite(tolerance)):
        raise InvalidInputError(f"tolerance must be a positive number of standard deviations (e.g. "
                                f"0.1); got {tolerance!r}")
    if not (isinstance(alpha, (int, float, np.number)) and not isinstance(alpha, bool) and 0 < alpha < 1):
        raise InvalidInputError(f"alpha must be in (0, 1) (0.05: 95% confidence); got {alpha!r}")
    if isinstance(cv, bool) or not isinstance(cv, (int, np.integer)) or cv < 2:
        raise InvalidInputError(f"cv must be an integer >= 2 (the probe's folds); got {cv!r}")
    if max_probe_rows is not None and (isinstance(max_probe_rows, bool) or not isinstance(
            max_probe_rows, (int, np.integer)) or max_probe_rows < 2):
        raise InvalidInputError(f"max_probe_rows must be an integer >= 2, or None for every row; "
                                f"got {max_probe_rows!r}")
    if isinstance(X, da.Array):  # rows filtered by their values: their count, in one read
        X, sensitive_features = with_known_rows(X, sensitive_features)
    inp = check_input(model, X, reset=False, ids=getattr(model, "sensitive_feature_ids", None))
    if sensitive_features is None:
        if inp.labels is None:
            raise InvalidInputError(
                "fairness_report needs the group of every row: pass sensitive_features= "
                "(labels, or a DataFrame of several attributes)")
        sensitive_features = inp.labels
    n = int(inp.data.shape[0])
    groups = encode_groups(sensitive_features, n, require_two=False)
    names = _attribute_names(sensitive_features, groups.n_attributes, model)

    drops = []  # per model: the columns of X it does not take (None: it takes X)
    for m in models:
        drop = None
        if m is not model and m.n_features_in_ != model.n_features_in_:
            if m.n_features_in_ != inp.width - len(inp.sensitive):
                raise InvalidInputError(
                    f"the baseline takes {m.n_features_in_} features; X has {inp.width}, "
                    f"{inp.width - len(inp.sensitive)} without the model's protected columns: "
                    "fit the baseline on the same features")
            drop = np.asarray(inp.sensitive, dtype=np.intp)
        drops.append(drop)
    represent = None
    Y: Any  # the rows the pass folds: X itself (mapped in the fold) or the representations
    if (isinstance(inp.data, da.Array) and inp.labels is None and inp.rows is None
            and all(getattr(m, "feature_names_in_", None) is None for m in models)):
        # an array: each fold task transforms its own chunk, so X's reads stay inside the
        # pass's chains (a lazy transform whose matrices live on the cluster would leave
        # them as separate tasks, which idle workers run far ahead of the folds)
        Y = inp.data
        represent = _Representation(models, drops)
        # each model's width, from one row of zeros (a Pipeline need not name its features)
        widths = [int(_Representation([m], [drop])(np.zeros((1, inp.width))).shape[1])
                  for m, drop in zip(models, drops)]
    else:  # numpy, DataFrames, DataArrays: the models' own transform
        reps = []
        for m, drop in zip(models, drops):
            # the model represents the X checked above (its transform would check it again)
            out = (m._represent(inp, X) if m is model and hasattr(m, "_represent")
                   else m.transform(X if drop is None else _without(X, drop)))
            reps.append(out.data if is_xarray(out) else out)
        widths = [int(r.shape[1]) for r in reps]
        if any(isinstance(r, da.Array) for r in reps):
            chunks = next(r for r in reps if isinstance(r, da.Array)).chunks[0]
            Y = da.concatenate([da.asarray(r).rechunk({0: chunks, 1: -1}) for r in reps], axis=1)
        else:
            Y = np.hstack([np.asarray(r) for r in reps])

    if isinstance(random_state, np.random.RandomState):  # scikit-learn's kind of seed
        random_state = int(random_state.randint(2**31 - 1))
    rng = np.random.default_rng(random_state)
    if max_probe_rows is None or n <= max_probe_rows:
        rows = np.arange(n)
    else:
        rows = np.sort(rng.choice(n, max_probe_rows, replace=False))
    seed = int(rng.integers(2**31 - 1))  # the folds': the same for every attribute and model
    stats, sample = moments_and_sample(Y, groups.codes, groups.categories, rows, represent=represent,
                                       group_scatter=True, progress=progress)
    stats.check_finite()

    out = pd.DataFrame(index=pd.Index(names, name="attribute"))
    out["groups"] = [int((a.counts > 0).sum()) for a in stats.attributes]
    bounds = np.concatenate([[0], np.cumsum(widths)])
    for which, prefix in enumerate(["", "baseline_"][: len(models)]):
        cols = np.arange(bounds[which], bounds[which + 1])
        part = stats.columns(cols)
        tests, aucs = [], []
        for j, name in enumerate(names):
            test = group_mean_test(part, j, alpha=alpha)
            if test.limited:
                warnings.warn(f"fairness_report: attribute {name!r}{' (baseline)' if prefix else ''}: "
                              f"{test.note}" + ("" if test.p_value == test.p_value else "; no p-value"),
                              DfairpcaWarning, stacklevel=2)
            tests.append(test)
            aucs.append(_probe_auc(sample[:, cols], groups.codes[rows, j], cv, seed))
        for col in ("max_mean_gap_sd", "max_mean_gap_sd_lower", "max_mean_gap_sd_upper"):
            out[prefix + col] = [getattr(t, col) for t in tests]
        out[prefix + "verdict"] = [verdict(t.max_mean_gap_sd_lower, t.max_mean_gap_sd_upper, tolerance)
                                   for t in tests]
        out[prefix + "p_value"] = [t.p_value for t in tests]
        out[prefix + "linear_probe_auc"] = aucs
        if not prefix:
            out["probe_rows"] = len(rows)
    return out


class _Representation:
    """The models' representations of a chunk of rows side by side (a picklable map that
    travels to the workers with the models): each model takes the chunk less its
    ``drops`` columns (None: all of them)."""

    def __init__(self, models, drops):
        self.models, self.drops = list(models), list(drops)

    def __call__(self, x) -> np.ndarray:
        x = np.asarray(x)
        return np.hstack([np.asarray(m.transform(x if drop is None else np.delete(x, drop, axis=1)),
                                     dtype=np.float64) for m, drop in zip(self.models, self.drops)])


def _check_fitted(model) -> None:
    """Refuse an unfitted model (a Pipeline: its last step) with the fix."""
    from sklearn.exceptions import NotFittedError
    from sklearn.utils.validation import check_is_fitted

    try:
        check_is_fitted(model)
    except NotFittedError:
        raise InvalidInputError(f"{type(model).__name__} is not fitted: call fit first") from None


def _final(model):
    """The estimator that makes the representation: a Pipeline's last step, else the model."""
    steps = getattr(model, "steps", None)
    return steps[-1][1] if steps else model


def _attribute_names(sensitive_features, p: int, model) -> list:
    """The report's index: a DataFrame's columns or a Series' name, else the model's
    ``attribute_names_`` when it names p attributes, else 0 .. p-1."""
    if hasattr(sensitive_features, "columns"):
        return [str(c) for c in sensitive_features.columns]
    name = getattr(sensitive_features, "name", None)
    if p == 1 and isinstance(name, str):
        return [name]
    fitted = getattr(_final(model), "attribute_names_", None)
    numeric = len(getattr(_final(model), "numeric_sensitive_columns_", ()))
    if fitted is not None and len(fitted) - numeric == p:  # the numeric attributes come last
        return [str(c) for c in list(fitted)[:p]]
    return list(range(p))


def _probe_auc(Y: np.ndarray, labels: np.ndarray, cv: int, seed: int) -> float:
    """Mean ROC AUC over stratified folds of a logistic regression predicting ``labels``
    from Y (one-vs-rest macro for more than two groups); NaN when a group has one row."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import StratifiedKFold, cross_val_score
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    _, counts = np.unique(labels, return_counts=True)
    folds = min(cv, int(counts.min())) if counts.size else 0
    if len(counts) < 2 or folds < 2:
        return float("nan")
    probe = make_pipeline(StandardScaler(), LogisticRegression(max_iter=1000))
    scores = cross_val_score(probe, Y, labels, scoring="roc_auc" if len(counts) == 2 else "roc_auc_ovr",
                             cv=StratifiedKFold(folds, shuffle=True, random_state=seed), error_score="raise")
    return float(np.mean(scores))
