"""At home in scikit-learn and fairlearn: the estimator checks, PCA parity with
``sklearn.decomposition.PCA`` and protected attributes as columns of X
(``sensitive_feature_ids``, the way fairlearn's CorrelationRemover takes them)."""

import warnings

import dask.array as da
import numpy as np
import pandas as pd
import pytest
import scipy.stats
import sklearn
import sklearn.decomposition as skd
from sklearn.linear_model import LogisticRegression
from sklearn.base import clone
from sklearn.model_selection import GridSearchCV
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler
from sklearn.utils.estimator_checks import parametrize_with_checks

import dfairpca
from dfairpca import FairKernelPCA, FairPCA
from oracle import make_data, max_angle_deg

# The checks' X has 2 columns in these: with column 0 the protected attribute, the one
# feature left is correlated with it, so no fair projection exists and fit rightly raises.
NO_FAIR_PROJECTION = "2-column X: the 1 feature left after column 0 is correlated with it, so no fair projection exists"
# sample_weight checks whose 2-column X leaves no fair projection, as above
WEIGHT_CHECKS_2_COLUMNS = ("check_sample_weights_pandas_series", "check_sample_weights_not_an_array",
                           "check_sample_weights_shape", "check_sample_weights_not_overwritten")
# n_components=None keeps min(n, d) = 27 components of data of rank 8: those beyond the
# rank are an arbitrary basis of the null space, so the projections of the rows of weight 0
# (not fitted) onto them differ between two fits; test_weights.py checks the identity for
# the components the data determines
NULL_SPACE = ("n_components=None keeps components beyond the data's rank (an arbitrary null-space "
              "basis), onto which the unfitted rows of weight 0 project differently")
KERNEL_REFUSES_WEIGHTS = "FairKernelPCA refuses sample_weight, naming why"
KERNEL_WEIGHT_CHECKS = WEIGHT_CHECKS_2_COLUMNS + (
    "check_sample_weights_list", "check_all_zero_sample_weights_error",
    "check_sample_weight_equivalence_on_dense_data")
EXPECTED_FAILURES = {
    "FairPCA": {**{name: NO_FAIR_PROJECTION for name in (
        "check_estimators_overwrite_params", "check_estimators_fit_returns_self",
        "check_readonly_memmap_input", "check_fit_idempotent", "check_fit_check_is_fitted",
        "check_n_features_in") + WEIGHT_CHECKS_2_COLUMNS},
        "check_sample_weight_equivalence_on_dense_data": NULL_SPACE},
    "PCA": {"check_sample_weight_equivalence_on_dense_data": NULL_SPACE},
    "FairKernelPCA": {name: KERNEL_REFUSES_WEIGHTS for name in KERNEL_WEIGHT_CHECKS},
}


@parametrize_with_checks(
    [dfairpca.PCA(), FairPCA(sensitive_feature_ids=[0]), FairKernelPCA(sensitive_feature_ids=[0]),
     dfairpca.ConceptEraser(sensitive_feature_ids=[0])],
    expected_failed_checks=lambda est: EXPECTED_FAILURES.get(type(est).__name__, {}),
)
def test_sklearn_estimator_checks(estimator, check, monkeypatch):
    # check_array_api_input skips unless SCIPY_ARRAY_API is set; it then runs its
    # numpy-only variant (array API dispatch on, numpy input, as for every estimator
    # without array API support), which needs no scipy array-API mode
    monkeypatch.setenv("SCIPY_ARRAY_API", "1")
    check(estimator)


def _messages(exc) -> str:
    """exc's message and those of the exceptions it was raised from or during."""
    out = []
    while exc is not None:
        out.append(str(exc))
        exc = exc.__cause__ or exc.__context__
    return " | ".join(out)


@pytest.mark.parametrize("name", sorted(n for n, why in EXPECTED_FAILURES["FairPCA"].items()
                                        if why == NO_FAIR_PROJECTION))
def test_expected_failures_fail_for_their_stated_reason(name):
    import sklearn.utils.estimator_checks as checks

    with pytest.raises(ValueError) as info:
        getattr(checks, name)("FairPCA", FairPCA(sensitive_feature_ids=[0]))
    assert "no fair projection exists: 1 features cannot absorb 1" in _messages(info.value)


@pytest.mark.parametrize("name", KERNEL_WEIGHT_CHECKS)
def test_kernel_weight_checks_fail_by_the_refusal(name):
    import sklearn.utils.estimator_checks as checks

    with pytest.raises(Exception) as info:
        getattr(checks, name)("FairKernelPCA", FairKernelPCA(sensitive_feature_ids=[0]))
    assert "FairKernelPCA does not take sample_weight" in _messages(info.value)


@pytest.mark.parametrize("est", [dfairpca.PCA(), FairPCA(sensitive_feature_ids=[0])])
def test_null_space_check_fails_only_past_the_rank(est):
    """The sample-weight equivalence check fails for the stated reason only: with
    n_components within the data's rank (9 rows of positive weight: rank 8) it passes."""
    import sklearn.utils.estimator_checks as checks

    check = checks.check_sample_weight_equivalence_on_dense_data
    with pytest.raises(AssertionError, match="not equivalent"):
        check(type(est).__name__, est)
    check(type(est).__name__, clone(est).set_params(n_components=5))


# ----------------------------------------------------------------------------- PCA parity
def _data(n, d, seed=0):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, d)) * np.linspace(1, 4, d) + 3


def _signs(a, b):
    """Signs that align the rows of b with those of a."""
    return np.sign(np.sum(a * b, axis=1))[:, None]


@pytest.mark.parametrize("n, d, k", [(300, 8, 3), (300, 8, None), (300, 8, 0.8), (20, 30, 3),
                                     (20, 30, 0.8)])
@pytest.mark.parametrize("whiten", [False, True])
def test_pca_equals_sklearn(n, d, k, whiten):
    X = _data(n, d)
    ours = dfairpca.PCA(k, whiten=whiten).fit(X)
    ref = skd.PCA(k, whiten=whiten, svd_solver="full").fit(X)
    assert ours.n_components_ == ref.n_components_
    s = _signs(ours.components_, ref.components_)
    np.testing.assert_allclose(ours.components_, ref.components_ * s, atol=1e-12)
    for a in ("explained_variance_", "explained_variance_ratio_", "singular_values_", "mean_"):
        np.testing.assert_allclose(getattr(ours, a), getattr(ref, a), rtol=1e-12, err_msg=a)
    assert ours.noise_variance_ == pytest.approx(ref.noise_variance_, rel=1e-12, abs=1e-14)
    np.testing.assert_allclose(ours.get_covariance(), ref.get_covariance(), rtol=1e-10, atol=1e-11)
    np.testing.assert_allclose(ours.get_precision(), ref.get_precision(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(ours.score_samples(X), ref.score_samples(X), rtol=1e-11)
    assert ours.score(X) == pytest.approx(ref.score(X), rel=1e-11)
    Y = ours.transform(X)
    np.testing.assert_allclose(Y, ref.transform(X) * s.T, atol=1e-11)
    np.testing.assert_allclose(ours.inverse_transform(Y), ref.inverse_transform(ref.transform(X)),
                               atol=1e-10)


@pytest.mark.parametrize("seed, n, d, rank", [(0, 300, 10, 3), (1, 500, 25, 6), (2, 60, 40, 4),
                                               (3, 2000, 12, 1), (4, 400, 16, 15)])
def test_mle_chooses_scikit_learns_k(seed, n, d, rank):
    """Minka's estimate: the same k and components as scikit-learn's, for numpy and Dask."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, rank)) @ rng.normal(size=(rank, d)) * 2 + rng.normal(size=(n, d))
    ref = skd.PCA("mle", svd_solver="full").fit(X)
    for data in (X, da.from_array(X, chunks=(n // 3 + 1, d))):
        ours = dfairpca.PCA("mle").fit(data)
        assert ours.n_components_ == ref.n_components_
        np.testing.assert_allclose(ours.components_, ref.components_ * _signs(ours.components_, ref.components_),
                                   atol=1e-10)
        np.testing.assert_allclose(ours.noise_variance_, ref.noise_variance_, rtol=1e-10)


def test_mle_log_likelihood_of_every_rank_equals_scikit_learns_formula():
    """Every k's evidence, not only the argmax: the prefix sums over pairs are the
    double loop of the formula (scikit-learn's private function is the oracle)."""
    from sklearn.decomposition._pca import _assess_dimension

    from dfairpca.solve._exact import mle_evidence, mle_rank

    rng = np.random.default_rng(7)
    X = rng.normal(size=(300, 4)) @ rng.normal(size=(4, 9)) + 0.3 * rng.normal(size=(300, 9))
    spectrum = np.linalg.svd(X - X.mean(0), compute_uv=False) ** 2 / 299
    ll = [_assess_dimension(spectrum, r, 300) for r in range(1, 9)]
    np.testing.assert_allclose(mle_evidence(spectrum, 300), ll, rtol=1e-12)
    assert mle_rank(spectrum, 300) == int(np.argmax(ll)) + 1
    assert mle_rank(spectrum * 1e6, 300) == mle_rank(spectrum, 300)  # any common scale


def test_mle_on_exactly_low_rank_data_keeps_the_rank_whatever_the_chunking():
    """Eigenvalues at the rounding of the covariance are no dimension: k never exceeds the
    rank, for any chunking or scale."""
    rng = np.random.default_rng(0)
    L = rng.standard_normal((500, 3)) @ rng.standard_normal((3, 20))
    for scale in (1.0, 1e9):
        for rows in (500, 100, 37, 7):
            fit = dfairpca.PCA("mle").fit(da.from_array(L * scale, chunks=(rows, 20)))
            assert fit.n_components_ == 3, (scale, rows)


def test_mle_is_refused_where_it_cannot_run():
    X = _data(20, 30)
    with pytest.raises(ValueError, match="mle.*at least as many rows as features"):
        dfairpca.PCA("mle").fit(X)
    with pytest.raises(ValueError, match="'mle' need the whole spectrum"):
        dfairpca.PCA("mle", svd_solver="randomized").fit(_data(100, 5))
    with pytest.raises(ValueError, match="n_components must be"):
        dfairpca.PCA("MLE").fit(_data(100, 5))
    with pytest.raises(ValueError, match="n_components must be"):  # fair PCA has no such model
        FairPCA("mle").fit(_data(100, 5), sensitive_features=np.arange(100) % 2)


def test_svd_solver_values_and_randomized_parameters():
    X = _data(200, 6)
    ref = dfairpca.PCA(3).fit(X).components_
    for solver in ("full", "covariance_eigh"):  # all exact here: the same solve
        np.testing.assert_array_equal(dfairpca.PCA(3, svd_solver=solver).fit(X).components_, ref)
    est = dfairpca.PCA(3, svd_solver="randomized", iterated_power=2, n_oversamples=5, random_state=0)
    assert est.get_params()["iterated_power"] == 2 and est.get_params()["random_state"] == 0
    est.fit(X)  # matrix-free passes: the same components (6 features: the space is exhausted)
    assert est.fitted_svd_solver_ == "randomized" and est.n_passes_ >= 2
    np.testing.assert_allclose(est.components_, ref, atol=1e-12)
    assert dfairpca.PCA(3).fit(X).fitted_svd_solver_ == "covariance_eigh"  # "auto" at d = 6
    with pytest.raises(ValueError, match="svd_solver must be one of"):
        dfairpca.PCA(3, svd_solver="arpak").fit(X)
    with pytest.raises(ValueError, match=r"fraction in \(0, 1\)"):
        dfairpca.PCA(1.5).fit(X)


def test_grid_search_scores_by_log_likelihood():
    X = _data(200, 8)
    ours = GridSearchCV(dfairpca.PCA(), {"n_components": [2, 4]}, cv=3).fit(X)
    ref = GridSearchCV(skd.PCA(), {"n_components": [2, 4]}, cv=3).fit(X)
    assert ours.best_params_ == ref.best_params_
    np.testing.assert_allclose(ours.cv_results_["mean_test_score"],
                               ref.cv_results_["mean_test_score"], rtol=1e-10)


def test_standardize_equals_standard_scaler_then_pca():
    X = _data(300, 7) * np.array([1, 10, 100, 1, 1e3, 5, 0.1])
    ours = dfairpca.PCA(3, standardize=True).fit(X)
    pipe = make_pipeline(StandardScaler(), skd.PCA(3)).fit(X)
    ref = pipe[-1]
    s = _signs(ours.components_, ref.components_)
    np.testing.assert_allclose(ours.components_, ref.components_ * s, atol=1e-12)
    np.testing.assert_allclose(ours.scale_, pipe[0].scale_, rtol=1e-13)  # population sd
    np.testing.assert_allclose(ours.explained_variance_, ref.explained_variance_, rtol=1e-12)
    np.testing.assert_allclose(ours.transform(X), pipe.transform(X) * s.T, atol=1e-11)
    # the probabilistic model is of X in its own units: the pipeline's, rescaled
    np.testing.assert_allclose(ours.get_covariance(),
                               ref.get_covariance() * np.outer(ours.scale_, ours.scale_), rtol=1e-10)
    np.testing.assert_allclose(ours.score_samples(X),
                               ref.score_samples(pipe[0].transform(X)) - np.log(ours.scale_).sum(),
                               rtol=1e-11)


def test_fair_pca_probabilistic_model():
    X, (z,) = make_data(600, 10, (2,), seed=3)
    est = FairPCA(3).fit(X, sensitive_features=z)
    ev, k, d = est.explained_variance_, 3, 10
    total = np.trace(np.cov(X.T))
    # noise_variance_: the mean variance outside the fair components (full covariance)
    assert est.noise_variance_ == pytest.approx((total - ev.sum()) / (d - k), rel=1e-12)
    np.testing.assert_allclose(est.singular_values_, np.sqrt(ev * (600 - 1)), rtol=1e-13)
    np.testing.assert_allclose(est.get_precision() @ est.get_covariance(), np.eye(d), atol=1e-10)
    logpdf = scipy.stats.multivariate_normal(est.mean_, est.get_covariance()).logpdf(X)
    np.testing.assert_allclose(est.score_samples(X), logpdf, rtol=1e-10)
    lazy = est.score_samples(da.from_array(X, chunks=100))
    assert isinstance(lazy, da.Array)
    np.testing.assert_allclose(lazy.compute(), logpdf, rtol=1e-10)
    with pytest.raises(ValueError, match=r"NaN or infinity in 1 row\(s\) \(rows 5\)"):
        est.score_samples(np.where(np.arange(600)[:, None] == 5, np.nan, X))


def test_fair_pca_fraction_whiten_and_feature_names():
    X, (z,) = make_data(600, 10, (3,), seed=4)
    full = FairPCA().fit(X, sensitive_features=z)
    assert full.n_components_ == full.max_components_ == 8
    cum = np.cumsum(full.explained_variance_ratio_)
    f = float((cum[2] + cum[3]) / 2)  # between the 3rd and the 4th: k = 4
    est = FairPCA(f).fit(X, sensitive_features=z)
    assert est.n_components_ == 4
    np.testing.assert_allclose(est.components_, full.components_[:4], atol=1e-10)
    with pytest.raises(ValueError, match=r"fair subspace holds .*% of the variance"):
        FairPCA(float(cum[-1]) + (1 - cum[-1]) / 2).fit(X, sensitive_features=z)
    with pytest.raises(ValueError, match="cannot be combined with equalize_covariance"):
        FairPCA(0.5, equalize_covariance=0.5).fit(X, sensitive_features=z)
    white = FairPCA(3, whiten=True, tradeoff=0.5).fit(X, sensitive_features=z)
    Y = white.transform(X)
    np.testing.assert_allclose(Y[:, :3].var(axis=0, ddof=1), 1.0, rtol=1e-10)
    np.testing.assert_allclose(Y[:, 3:].var(axis=0, ddof=1), 0.25, rtol=1e-10)  # λ² of whitened
    np.testing.assert_allclose(white.inverse_transform(Y),
                               FairPCA(3).fit(X, sensitive_features=z).inverse_transform(
                                   FairPCA(3).fit(X, sensitive_features=z).transform(X)), atol=1e-9)
    assert list(white.get_feature_names_out()) == [
        "fairpca0", "fairpca1", "fairpca2", "fairpca_standard0", "fairpca_standard1",
        "fairpca_standard2"]
    kern = FairKernelPCA(2, tradeoff=0.5).fit(X[:200], sensitive_features=z[:200])
    assert list(kern.get_feature_names_out()) == [
        "fairkernelpca0", "fairkernelpca1", "fairkernelpca_standard0", "fairkernelpca_standard1"]


def test_feature_names_and_reordered_columns():
    X = _data(200, 5)
    df = pd.DataFrame(X, columns=list("abcde"))
    est = dfairpca.PCA(2).fit(df)
    assert list(est.feature_names_in_) == list("abcde")
    np.testing.assert_allclose(est.transform(df), dfairpca.PCA(2).fit(X).transform(X), atol=1e-12)
    with pytest.raises(ValueError, match="feature names should match"):
        est.transform(df[list("bacde")])
    est.set_output(transform="pandas")
    assert list(est.transform(df).columns) == ["pca0", "pca1"]


# ----------------------------------------------------------------------------- sensitive_feature_ids
def _with_attribute(seed=5, n=600, d=8):
    X, (z,) = make_data(n, d, (2,), seed=seed)
    return X, z, np.column_stack([z, X])


def test_ids_of_a_binary_column_equal_sensitive_features():
    X, z, Xz = _with_attribute()
    ref = FairPCA(3).fit(X, sensitive_features=z)
    est = FairPCA(3, sensitive_feature_ids=[0]).fit(Xz)
    assert est.n_features_in_ == 9 and est.components_.shape == (3, 8)
    assert list(est.sensitive_feature_indices_) == [0]
    np.testing.assert_allclose(est.components_, ref.components_, atol=1e-9)
    np.testing.assert_allclose(est.transform(Xz), ref.transform(X), atol=1e-9)
    np.testing.assert_allclose(est.explained_variance_, ref.explained_variance_, rtol=1e-10)
    assert est.fairness_violation_ < 1e-12
    assert est.inverse_transform(est.transform(Xz)).shape == (600, 8)
    with pytest.raises(ValueError, match="one way"):
        FairPCA(3, sensitive_feature_ids=[0]).fit(Xz, sensitive_features=z)
    with pytest.raises(ValueError, match=r"9 is not a column of X \(9 feature\(s\)\)"):
        FairPCA(3, sensitive_feature_ids=[9]).fit(Xz)
    with pytest.raises(ValueError, match="names a column twice"):
        FairPCA(3, sensitive_feature_ids=[0, 0]).fit(Xz)
    with pytest.raises(ValueError, match="X has no column names"):
        FairPCA(3, sensitive_feature_ids=["sex"]).fit(Xz)
    with pytest.raises(ValueError, match="constant over the rows fitted"):
        FairPCA(3, sensitive_feature_ids=[0]).fit(np.column_stack([np.ones(600), X]))


def test_ids_work_in_a_plain_pipeline_and_never_take_y():
    X, z, Xz = _with_attribute()
    y = (X[:, 1] > np.median(X[:, 1])).astype(int)
    pipe = make_pipeline(FairPCA(3, sensitive_feature_ids=[0]), LogisticRegression()).fit(Xz, y)
    ref = FairPCA(3).fit(X, sensitive_features=z)
    np.testing.assert_allclose(pipe[0].components_, ref.components_, atol=1e-9)
    assert pipe.score(Xz, y) > 0.5


def test_numeric_columns_are_decorrelated_one_hot_columns_are_groups():
    X, (g,) = make_data(900, 10, (3,), seed=6)
    onehot = (g[:, None] == np.arange(3)).astype(float)
    est = FairPCA(3, sensitive_feature_ids=[0, 1, 2]).fit(np.column_stack([onehot, X]))
    ref = FairPCA(3).fit(X, sensitive_features=g)
    assert max_angle_deg(est.components_.T, ref.components_.T) < 1e-6
    # a continuous attribute (e.g. age): the representation is uncorrelated with it
    age = X[:, 0] * 2 + np.random.default_rng(0).normal(size=900)
    Y = FairPCA(4, sensitive_feature_ids=[0]).fit_transform(np.column_stack([age, X]))
    corr = np.corrcoef(np.column_stack([age, Y]).T)[0, 1:]
    assert np.abs(corr).max() < 1e-10
    assert np.abs(np.corrcoef(np.column_stack([age, PCAfit(X, 4)]).T)[0, 1:]).max() > 0.1


def test_integer_codes_of_more_than_two_groups_are_never_silently_decorrelated():
    X, (g,) = make_data(900, 10, (5,), seed=9)
    with pytest.warns(UserWarning, match="5 distinct whole numbers.*sensitive_features="):
        FairPCA(3, sensitive_feature_ids=[0]).fit(np.column_stack([g, X]))
    df = pd.DataFrame(X, columns=[f"f{i}" for i in range(10)]).assign(race=g)
    with pytest.warns(UserWarning, match="column race holds 5"):
        FairPCA(3, sensitive_feature_ids=["race"]).fit(df)
    # as a categorical column the codes are groups with equal means, and nothing is said
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        est = FairPCA(3, sensitive_feature_ids=["race"]).fit(df.astype({"race": "category"}))
    ref = FairPCA(3).fit(X, sensitive_features=g)
    assert max_angle_deg(est.components_.T, ref.components_.T) < 1e-6


def PCAfit(X, k):
    return dfairpca.PCA(k).fit_transform(X)


def test_ids_in_a_dataframe_name_text_columns_as_groups():
    X, (g, h) = make_data(600, 6, (3, 2), seed=7)
    df = pd.DataFrame(X, columns=[f"f{i}" for i in range(6)])
    df.insert(2, "race", np.array(["a", "b", "c"])[g])
    df["sex"] = h  # numeric 0/1
    est = FairPCA(2, sensitive_feature_ids=["race", "sex"]).fit(df)
    ref = FairPCA(2).fit(X, sensitive_features=[g, h])
    assert est.n_features_in_ == 8 and list(est.feature_names_in_) == list(df.columns)
    assert est.attribute_names_ == ["race", "sex"]
    assert max_angle_deg(est.components_.T, ref.components_.T) < 1e-6
    np.testing.assert_allclose(np.abs(est.transform(df)), np.abs(ref.transform(X)), atol=1e-8)
    with pytest.raises(ValueError, match="feature names should match"):
        est.transform(df[["race"] + [c for c in df.columns if c != "race"]])
    kern = FairKernelPCA(2, sensitive_feature_ids=["race", "sex"]).fit(df.iloc[:300])
    kref = FairKernelPCA(2).fit(X[:300], sensitive_features=[g[:300], h[:300]])
    np.testing.assert_allclose(kern.transform(df.iloc[:300]), kref.transform(X[:300]), atol=1e-8)


def test_ids_with_dask_stay_lazy_and_agree():
    import dask.dataframe as dd

    X, z, Xz = _with_attribute(seed=8)
    ref = FairPCA(3, sensitive_feature_ids=[0]).fit(Xz)
    lazy = da.from_array(Xz, chunks=(150, -1))
    est = FairPCA(3, sensitive_feature_ids=[0]).fit(lazy)
    np.testing.assert_allclose(est.components_, ref.components_, atol=1e-10)
    out = est.transform(lazy)
    assert isinstance(out, da.Array) and out.chunks[0] == lazy.chunks[0]
    np.testing.assert_allclose(out.compute(), ref.transform(Xz), atol=1e-10)
    ddf = dd.from_pandas(pd.DataFrame(Xz, columns=["z"] + [f"f{i}" for i in range(8)]), npartitions=3)
    est = FairPCA(3, sensitive_feature_ids=["z"]).fit(ddf)
    np.testing.assert_allclose(est.components_, ref.components_, atol=1e-10)
    np.testing.assert_allclose(np.asarray(est.transform(ddf)), ref.transform(Xz), atol=1e-10)
    for kw in ({}, {"n_landmarks": 150}):
        k_ref = FairKernelPCA(3, **kw).fit(X[:300], sensitive_features=z[:300])
        k_est = FairKernelPCA(3, sensitive_feature_ids=[0], **kw).fit(da.from_array(Xz[:300], chunks=100))
        np.testing.assert_allclose(k_est.transform(Xz[:300]), k_ref.transform(X[:300]), atol=1e-8)


def test_partial_fit_with_ids_equals_fit():
    X, z, Xz = _with_attribute(seed=9)
    est = FairPCA(3, sensitive_feature_ids=[0])
    for s in range(0, 600, 200):
        est.partial_fit(Xz[s : s + 200])
    ref = FairPCA(3, sensitive_feature_ids=[0]).fit(Xz)
    np.testing.assert_allclose(est.components_, ref.components_, atol=1e-10)
    with pytest.raises(ValueError, match="expecting 9 features"):
        est.partial_fit(X)


@pytest.mark.parametrize("make", ["fair", "kernel", "pca"])
def test_save_load_keeps_the_new_attributes(tmp_path, make):
    X, z, Xz = _with_attribute(seed=10, n=300)
    df = pd.DataFrame(Xz, columns=["z"] + [f"f{i}" for i in range(8)])
    est = {"fair": lambda: FairPCA(3, sensitive_feature_ids=["z"], whiten=True, tradeoff=0.3),
           "kernel": lambda: FairKernelPCA(3, sensitive_feature_ids=["z"]),
           "pca": lambda: dfairpca.PCA(0.9, whiten=True)}[make]().fit(df)
    est.save(tmp_path / "m")
    back = dfairpca.load(tmp_path / "m")
    assert list(back.feature_names_in_) == list(df.columns)
    np.testing.assert_array_equal(back.transform(df), est.transform(df))
    if make != "kernel":
        np.testing.assert_array_equal(back.singular_values_, est.singular_values_)
        assert back.noise_variance_ == est.noise_variance_
        np.testing.assert_array_equal(back.score_samples(df), est.score_samples(df))
    if make != "pca":
        np.testing.assert_array_equal(back.sensitive_feature_indices_, [0])
        np.testing.assert_array_equal(back.numeric_sensitive_columns_, [0])


def test_metadata_routing_still_passes_sensitive_features():
    X, z, _ = _with_attribute(seed=11)
    y = (X[:, 1] > 0).astype(int)
    with sklearn.config_context(enable_metadata_routing=True):
        fair = FairPCA(3).set_fit_request(sensitive_features=True)
        pipe = make_pipeline(fair, LogisticRegression()).fit(X, y, sensitive_features=z)
    np.testing.assert_allclose(pipe[0].components_,
                               FairPCA(3).fit(X, sensitive_features=z).components_, atol=1e-12)


def test_a_model_saved_before_these_attributes_loads(tmp_path):
    """Models written before singular_values_, noise_variance_, the sensitive columns and
    the new parameters existed load, and get those from what they hold."""
    import json

    X, (z,) = make_data(400, 7, (2,), seed=12)
    est = FairPCA(3).fit(X, sensitive_features=z)
    est.save(tmp_path / "m", statistics=True)
    model = tmp_path / "m"  # the model's files at the top of its folder
    meta = json.loads((model / "meta.json").read_text())
    for key in ("noise_variance_", "sensitive_feature_indices_", "numeric_sensitive_columns_"):
        del meta[key]
    for key in ("whiten", "svd_solver", "iterated_power", "n_oversamples", "random_state",
                "sensitive_feature_ids"):
        del meta["params"][key]
    (model / "meta.json").write_text(json.dumps(meta))
    with np.load(model / "arrays.npz") as f:
        arrays = {k: f[k] for k in f.files if k not in ("singular_values_",)}
    np.savez(model / "arrays.npz", **arrays)
    back = dfairpca.load(tmp_path / "m")
    np.testing.assert_allclose(back.singular_values_, est.singular_values_, rtol=1e-12)
    assert back.noise_variance_ == pytest.approx(est.noise_variance_, rel=1e-12)
    np.testing.assert_array_equal(back.transform(X), est.transform(X))
    back.partial_fit(X[:40], sensitive_features=z[:40])
    assert back.n_samples_seen_ == 440
