import dask.array as da
import numpy as np
import pytest

import dfairpca
from dfairpca import metrics
from oracle import make_data


def test_explained_variance_pct_chunked_equals_dense():
    X, _ = make_data(500, 10, (), seed=1)
    U = dfairpca.PCA(3).fit(X).components_
    A = np.cov(X.T)
    ref = 100 * np.trace(U @ A @ U.T) / np.trace(A)
    assert metrics.explained_variance_pct(X, U) == pytest.approx(ref, rel=1e-12)
    assert metrics.explained_variance_pct(da.from_array(X, chunks=64), U) == pytest.approx(ref, rel=1e-12)
    assert metrics.explained_variance_pct(X, np.eye(10)) == pytest.approx(100)


def test_mmd2_against_direct_formula_and_sampling():
    rng = np.random.default_rng(0)
    Y = rng.normal(size=(60, 2))
    z = np.repeat([0, 1], 30)
    Y[z == 1] += 1
    s = 0.7
    K = lambda a, b: np.exp(-((a[:, None] - b[None]) ** 2).sum(-1) / (2 * s * s))
    A, B = Y[z == 0], Y[z == 1]
    ref = K(A, A).mean() + K(B, B).mean() - 2 * K(A, B).mean()
    assert metrics.mmd2(Y, z, s) == pytest.approx(ref, rel=1e-12)
    assert metrics.mmd2(da.from_array(Y, chunks=7), z, s) == pytest.approx(ref, rel=1e-12)
    assert metrics.mmd2(np.vstack([A, A]), np.repeat([0, 1], 30), s) == pytest.approx(0, abs=1e-12)
    sub = metrics.mmd2(Y, z, s, max_samples=20)
    assert sub != ref and abs(sub - ref) < 0.3
    d2 = ((Y[:, None] - Y[None]) ** 2).sum(-1)[np.triu_indices(60, 1)]
    assert metrics.mmd_bandwidth(Y) == pytest.approx(np.sqrt(np.median(d2) / 2))
    with pytest.raises(ValueError, match="two or more groups"):
        metrics.mmd2(Y, np.zeros(60), s)


def test_fair_pca_lowers_mmd_and_raises_inseparability():
    X, g = make_data(2000, 12, (2,), seed=3, shift=2.0)
    z = g[0]
    pca = dfairpca.PCA(3).fit(X)
    fair = dfairpca.FairPCA(3).fit(X, sensitive_features=z)
    sigma = metrics.mmd_bandwidth(pca.transform(X))
    assert metrics.mmd2(fair.transform(X), z, sigma) < 0.2 * metrics.mmd2(pca.transform(X), z, sigma)
    tr, te = slice(0, 1000), slice(1000, None)
    ins_pca = metrics.linear_inseparability(pca.transform(X[tr]), z[tr], pca.transform(X[te]), z[te])
    ins_fair = metrics.linear_inseparability(fair.transform(X[tr]), z[tr], fair.transform(X[te]), z[te])
    assert ins_fair > ins_pca and ins_fair > 0.3


def test_mmd2_more_than_two_groups_is_the_worst_pair():
    rng = np.random.default_rng(1)
    Y = rng.normal(size=(90, 2))
    z = np.repeat(["a", "b", "c"], 30)
    Y[z == "c"] += 2.0
    s = 1.0
    pairs = [metrics.mmd2(Y[(z == p) | (z == q)], z[(z == p) | (z == q)], s)
             for p, q in (("a", "b"), ("a", "c"), ("b", "c"))]
    assert metrics.mmd2(Y, z, s) == pytest.approx(max(pairs), rel=1e-12)
    assert max(pairs) == pairs[1] or max(pairs) == pairs[2]
    with pytest.raises(ValueError, match="1-D"):
        metrics.mmd2(Y, np.column_stack([z, z]), s)


def test_linear_inseparability_three_groups_chance_level():
    rng = np.random.default_rng(2)
    Y = rng.normal(size=(3000, 3))
    z = rng.integers(0, 3, 3000)
    err = metrics.linear_inseparability(Y[:1500], z[:1500], Y[1500:], z[1500:])
    assert abs(err - 2 / 3) < 0.05  # indistinguishable groups: chance level 1 - 1/m
    Y[:, 0] += 4 * z
    assert metrics.linear_inseparability(Y[:1500], z[:1500], Y[1500:], z[1500:]) < 0.1


def test_downstream_gaps_with_fairlearn():
    """The ΔDP of docs/fair_pca.rst (Metrics): fairlearn's metric on a classifier trained on the representation."""
    from fairlearn.metrics import demographic_parity_difference
    from sklearn.linear_model import LogisticRegression

    X, g = make_data(3000, 12, (2,), seed=4, shift=2.0)
    z = g[0]
    y = (X[:, :3].sum(1) + 0.5 * z > np.median(X[:, :3].sum(1))).astype(int)
    gaps = {}
    for name, est in (("pca", dfairpca.PCA(3)), ("fair", dfairpca.FairPCA(3))):
        kw = {} if name == "pca" else {"sensitive_features": z[:1500]}
        Y = est.fit(X[:1500], **kw).transform(X)
        pred = LogisticRegression().fit(Y[:1500], y[:1500]).predict(Y[1500:])
        gaps[name] = demographic_parity_difference(y[1500:], pred, sensitive_features=z[1500:])
    assert gaps["fair"] < 0.5 * gaps["pca"], gaps


# ------------------------------------------------------------------ the per-group cost of fairness
def _direct_errors(model, X, z):
    """The definition, row by row: mean over each group's rows of ||x - x_hat||^2."""
    R = model.inverse_transform(model.transform(X))
    err = ((X - R) ** 2).sum(axis=1)
    return {g: err[z == g].mean() for g in np.unique(z)}


def test_group_reconstruction_error_equals_the_direct_computation_numpy_and_dask():
    rng = np.random.default_rng(3)
    X, z = make_data(600, 8, (3,), seed=2)
    z = np.asarray(z).reshape(-1)
    labels = np.array(["a", "b", "c"])[z]
    fair = dfairpca.FairPCA(3).fit(X, sensitive_features=labels)
    pca = dfairpca.PCA(3).fit(X)
    direct, base = _direct_errors(fair, X, z), _direct_errors(pca, X, z)
    for data in (X, da.from_array(X, chunks=(97, 8))):
        got = metrics.group_reconstruction_error(fair, data, labels, baseline=pca)
        assert list(got.index) == ["a", "b", "c"] and got.index.name == "groups"
        assert got["rows"].tolist() == [int((z == g).sum()) for g in range(3)]
        np.testing.assert_allclose(got["error"], [direct[g] for g in range(3)], rtol=1e-10)
        np.testing.assert_allclose(got["baseline_error"], [base[g] for g in range(3)], rtol=1e-10)
        np.testing.assert_allclose(got["ratio"], got["error"] / got["baseline_error"], rtol=1e-12)
    # fairness costs reconstruction overall: never below standard PCA's error in total
    total = (got["error"] * got["rows"]).sum() / len(X)
    assert total >= (got["baseline_error"] * got["rows"]).sum() / len(X) - 1e-12
    # without a baseline: the two columns only; two attributes: intersectional groups
    assert list(metrics.group_reconstruction_error(fair, X, labels).columns) == ["rows", "error"]
    other = rng.integers(0, 2, len(X))
    both = metrics.group_reconstruction_error(fair, X, np.column_stack([labels, other]))
    assert both.index.nlevels == 2 and both["rows"].sum() == len(X)
    err = ((X - fair.inverse_transform(fair.transform(X))) ** 2).sum(axis=1)
    pick = (labels == "b") & (other == 1)
    assert both.loc[("b", "1"), "error"] == pytest.approx(err[pick].mean(), rel=1e-10)


def test_group_reconstruction_error_matches_fairlearns_metricframe():
    from fairlearn.metrics import MetricFrame

    X, z = make_data(400, 6, (2,), seed=5)
    z = np.asarray(z).reshape(-1)
    fair = dfairpca.FairPCA(2).fit(X, sensitive_features=z)
    R = fair.inverse_transform(fair.transform(X))
    frame = MetricFrame(metrics=lambda x, r: float(((x - r) ** 2).sum(axis=1).mean()),
                        y_true=X, y_pred=R, sensitive_features=z)
    got = metrics.group_reconstruction_error(fair, X, z)
    np.testing.assert_allclose(got["error"].to_numpy(), frame.by_group.to_numpy(), rtol=1e-10)


def test_group_reconstruction_error_refuses_what_it_cannot_measure():
    X, z = make_data(200, 5, (2,), seed=1)
    z = np.asarray(z).reshape(-1)
    kernel = dfairpca.FairKernelPCA(2).fit(X, sensitive_features=z)
    with pytest.raises(TypeError, match="no inverse_transform.*PCA or FairPCA"):
        metrics.group_reconstruction_error(kernel, X, z)
    with pytest.raises(ValueError, match="not fitted"):
        metrics.group_reconstruction_error(dfairpca.PCA(2), X, z)
    fair = dfairpca.FairPCA(2).fit(X, sensitive_features=z)
    with pytest.raises(ValueError, match="sensitive_features="):
        metrics.group_reconstruction_error(fair, X)
    with pytest.raises(ValueError, match="same features"):
        metrics.group_reconstruction_error(fair, X, z, baseline=dfairpca.PCA(2).fit(X[:, :4]))


def test_group_reconstruction_error_with_protected_columns_and_filtered_dask_rows():
    """A model fitted with sensitive_feature_ids takes a PCA baseline fitted without those
    columns; Dask rows filtered by their values (unknown chunk sizes) are counted first."""
    import warnings

    import pandas as pd

    rng = np.random.default_rng(4)
    X = rng.normal(size=(400, 6))
    sex = np.where(rng.random(400) < 0.4, "f", "m")
    df = pd.DataFrame(X, columns=[f"f{i}" for i in range(6)])
    df.insert(0, "sex", sex)
    fair = dfairpca.FairPCA(2, sensitive_feature_ids=["sex"]).fit(df)
    pca = dfairpca.PCA(2).fit(df.drop(columns="sex"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "X does not have valid feature names"
        got = metrics.group_reconstruction_error(fair, df, baseline=pca)
    R = fair.inverse_transform(fair.transform(df))
    Rb = pca.inverse_transform(pca.transform(df.drop(columns="sex")))
    for g in ("f", "m"):
        assert got.loc[g, "error"] == pytest.approx(((X - R) ** 2).sum(1)[sex == g].mean(), rel=1e-12)
        assert got.loc[g, "baseline_error"] == pytest.approx(((X - Rb) ** 2).sum(1)[sex == g].mean(),
                                                             rel=1e-12)
    plain = dfairpca.FairPCA(2).fit(X, sensitive_features=sex)
    Xd = da.from_array(X, chunks=(100, 6))
    keep = Xd[:, 0] > 0
    filtered = metrics.group_reconstruction_error(plain, Xd[keep], da.from_array(sex, chunks=100)[keep])
    direct = metrics.group_reconstruction_error(plain, X[X[:, 0] > 0], sex[X[:, 0] > 0])
    np.testing.assert_allclose(filtered["error"], direct["error"], rtol=1e-12)
    assert filtered["rows"].tolist() == direct["rows"].tolist()
