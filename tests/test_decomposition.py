"""PCA and FairPCA against the dense oracle, across inputs, options and shapes."""

import dask.array as da
import numpy as np
import pandas as pd
import pytest
import zarr
from hypothesis import given
from hypothesis import strategies as st
from sklearn.base import clone
from sklearn.exceptions import NotFittedError
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import make_pipeline

import dfairpca
import oracle
from oracle import make_data, max_angle_deg

TOL_DEG = 1e-6


# ----------------------------------------------------------------------------- oracle
@pytest.mark.parametrize(
    "n, d, groups, k",
    [
        (500, 12, (2,), 3),
        (800, 30, (3,), 5),
        (1200, 40, (5,), 10),
        (1000, 25, (2, 3), 4),       # two attributes (Sec. 3.5)
        (1500, 20, (2, 2, 4), 6),    # three attributes
        (300, 8, (2,), 7),           # k = d - 1, the largest allowed
        (900, 16, (3, 2), 13),       # k = d - sum(m) + p
    ],
)
@pytest.mark.parametrize("kind", ["numpy", "dask"])
def test_fair_pca_matches_dense_oracle(n, d, groups, k, kind):
    X, g = make_data(n, d, groups, seed=n + d)
    U_ref = oracle.fair_pca(X, g, k)
    Xin = da.from_array(X, chunks=(97, d)) if kind == "dask" else X
    gin = g[0] if len(g) == 1 else np.column_stack(g)
    est = dfairpca.FairPCA(k).fit(Xin, sensitive_features=gin)
    assert est.components_.shape == (k, d)
    assert max_angle_deg(est.components_.T, U_ref) < TOL_DEG
    np.testing.assert_allclose(est.components_ @ est.components_.T, np.eye(k), atol=1e-12)
    assert est.max_components_ == d - sum(groups) + len(groups)
    assert est.n_constraints_ == sum(groups) - len(groups)
    Q = est.constraint_basis_
    assert Q.shape == (d, est.n_constraints_) and np.abs(est.components_ @ Q).max() < 1e-12
    for j, lab in enumerate(g):
        np.testing.assert_allclose(est.group_means_[j], [X[lab == c].mean(0) for c in range(groups[j])])


@pytest.mark.parametrize("center, standardize", [(True, False), (False, False), (True, True)])
def test_center_and_standardize_match_oracle(center, standardize):
    X, g = make_data(700, 15, (3,), seed=3)
    X[:, 4] *= 50  # features on different scales matter when standardizing
    U_ref = oracle.fair_pca(X, g, 4, center=center, standardize=standardize)
    est = dfairpca.FairPCA(4, center=center, standardize=standardize).fit(X, sensitive_features=g[0])
    assert max_angle_deg(est.components_.T, U_ref) < TOL_DEG
    Y = est.transform(X)
    means = [Y[g[0] == c].mean(0) for c in range(3)]
    assert np.abs(means[0] - means[1]).max() < 1e-10 * np.abs(Y).max()


def test_pca_matches_oracle_and_sklearn():
    from sklearn.decomposition import PCA as SkPCA

    X, _ = make_data(600, 20, (), seed=5)
    est = dfairpca.PCA(6).fit(da.from_array(X, chunks=(64, 20)))
    assert max_angle_deg(est.components_.T, oracle.pca(X, 6)) < TOL_DEG
    sk = SkPCA(6).fit(X)
    np.testing.assert_allclose(est.explained_variance_, sk.explained_variance_, rtol=1e-10)
    np.testing.assert_allclose(est.explained_variance_ratio_, sk.explained_variance_ratio_, rtol=1e-10)
    np.testing.assert_allclose(np.abs(est.transform(X)), np.abs(sk.transform(X)), atol=1e-9)


def test_fair_pca_with_no_mean_difference_is_pca():
    X, _ = make_data(400, 10, (), seed=1)
    z = np.tile([0, 1], 200)
    X[z == 1] += X[z == 0].mean(0) - X[z == 1].mean(0)  # identical group means
    with pytest.warns(UserWarning, match=r"groups 0, 1 of groups: .*float64 rounding"):
        est = dfairpca.FairPCA(3).fit(X, sensitive_features=z)
    assert est.n_constraints_ == 0
    assert max_angle_deg(est.components_.T, oracle.pca(X, 3)) < TOL_DEG


# ----------------------------------------------------------------------------- invariants
@given(
    n=st.integers(30, 300),
    d=st.integers(4, 12),
    m=st.integers(2, 4),
    seed=st.integers(0, 10_000),
    chunk=st.integers(7, 120),
    data=st.data(),
)
def test_transformed_group_means_are_equal(n, d, m, seed, chunk, data):
    X, g = make_data(n, d, (m,), seed=seed, shift=data.draw(st.floats(0.1, 20)))
    k = data.draw(st.integers(1, d - m + 1))
    est = dfairpca.FairPCA(k).fit(da.from_array(X, chunks=(chunk, d)), sensitive_features=g[0])
    Y = est.transform(X)
    spread = np.abs(Y - Y.mean(0)).max()
    means = np.stack([Y[g[0] == c].mean(0) for c in range(m)])
    assert np.abs(means - means[0]).max() <= 1e-10 * max(spread, 1e-300)


def test_group_means_equal_for_every_attribute_and_labels_of_any_type():
    X, g = make_data(1000, 20, (2, 3), seed=11)
    df = pd.DataFrame({"sex": np.where(g[0] == 1, "m", "f"), "race": g[1] + 0.5})
    est = dfairpca.FairPCA(8).fit(X, sensitive_features=df)
    assert est.attribute_names_ == ["sex", "race"]
    assert list(est.groups_[0]) == ["f", "m"] and list(est.groups_[1]) == [0.5, 1.5, 2.5]
    Y = est.transform(X)
    for col in df:
        ms = np.stack([Y[df[col] == c].mean(0) for c in np.unique(df[col])])
        assert np.abs(ms - ms[0]).max() < 1e-10 * np.abs(Y).max()


# ----------------------------------------------------------------------------- inputs
def test_numpy_dask_and_zarr_inputs_agree(tmp_path):
    X, g = make_data(1000, 24, (3,), seed=2)
    Xu8 = np.clip(X * 10 + 128, 0, 255).astype(np.uint8)
    store = zarr.open_group(str(tmp_path / "s.zarr"), mode="w")
    arr = store.create_array("X", shape=Xu8.shape, chunks=(128, 24), dtype="uint8")
    arr[:] = Xu8
    ests = [
        dfairpca.FairPCA(5).fit(Xu8, sensitive_features=g[0]),
        dfairpca.FairPCA(5).fit(da.from_array(Xu8, chunks=(100, 24)), sensitive_features=g[0]),
        dfairpca.FairPCA(5).fit(dfairpca.from_zarr(tmp_path / "s.zarr", "X"), sensitive_features=g[0]),
        dfairpca.FairPCA(5).fit(str(tmp_path / "s.zarr/X"), sensitive_features=g[0]),
        dfairpca.FairPCA(5, compute_dtype="float64").fit(Xu8, sensitive_features=g[0]),
    ]
    U_ref = oracle.fair_pca(Xu8.astype(float), g, 5)
    for est in ests[:4]:  # float32 products for uint8 input
        assert max_angle_deg(est.components_.T, U_ref) < 1e-3
    assert max_angle_deg(ests[4].components_.T, U_ref) < TOL_DEG
    Y = ests[2].transform(dfairpca.from_zarr(tmp_path / "s.zarr", "X"))
    assert isinstance(Y, da.Array) and Y.dtype == np.float32 and Y.shape == (1000, 5)
    np.testing.assert_allclose(Y.compute(), ests[0].transform(Xu8), rtol=1e-4, atol=1e-3)


def test_images_are_flattened_lazily():
    X, g = make_data(300, 36, (2,), seed=4)
    imgs = da.from_array(X.reshape(300, 6, 6), chunks=(50, 3, 6))
    est = dfairpca.FairPCA(4).fit(imgs, sensitive_features=g[0])
    assert est.n_features_in_ == 36
    assert max_angle_deg(est.components_.T, oracle.fair_pca(X, g, 4)) < TOL_DEG
    Y = est.transform(imgs)
    assert isinstance(Y, da.Array) and Y.chunks[0] == (50,) * 6


@pytest.mark.parametrize("dtype, out", [(np.float32, np.float32), (np.float64, np.float64),
                                        (np.uint8, np.float32), (np.int64, np.float64)])
def test_dtypes(dtype, out):
    X, g = make_data(400, 10, (2,), seed=6)
    Xt = (np.abs(X) * 10).astype(dtype)
    est = dfairpca.FairPCA(3).fit(Xt, sensitive_features=g[0])
    Y = est.transform(Xt)
    assert Y.dtype == out
    Yd = est.transform(da.from_array(Xt, chunks=(64, 10)))
    assert Yd.dtype == out and Yd.compute().dtype == out
    ref = oracle.fair_pca(Xt.astype(float), g, 3)
    assert max_angle_deg(est.components_.T, ref) < (1e-3 if out == np.float32 else TOL_DEG)


def test_dask_labels_and_lists():
    X, g = make_data(500, 12, (2, 3), seed=8)
    a = dfairpca.FairPCA(3).fit(X, sensitive_features=[da.from_array(g[0], chunks=100), list(g[1])])
    b = dfairpca.FairPCA(3).fit(X, sensitive_features=np.column_stack(g))
    assert max_angle_deg(a.components_.T, b.components_.T) < TOL_DEG


# ----------------------------------------------------------------------------- options
def test_partial_fit_refuses_int_labels_then_the_same_as_text(two_groups):
    """One fit refuses 1 next to '1' (they would become one group as text): so does a
    merge of batches, instead of turning groups_ into text."""
    X, z = two_groups(200, 5)
    est = dfairpca.FairPCA(2).partial_fit(X[:100], sensitive_features=z[:100])
    with pytest.raises(ValueError, match=r"labels of attribute 0 mix types: \d \(int\) in one "
                                         r"part, '\d' \(str\) in another.*astype\(str\)"):
        est.partial_fit(X[100:], sensitive_features=z[100:].astype(str))
    assert [g.dtype.kind for g in est.groups_] == ["i"]  # the earlier batches are kept
    with pytest.raises(ValueError, match="mix types"):
        dfairpca.merge([dfairpca.compute_moments(X[:100], sensitive_features=z[:100]),
                        dfairpca.compute_moments(X[100:], sensitive_features=z[100:].astype(str))])


def test_partial_fit_equals_fit_and_pieces_may_hold_one_group():
    X, g = make_data(900, 14, (3,), seed=9)
    order = np.argsort(g[0], kind="stable")  # pieces sorted by group: single-group pieces
    X, z = X[order], g[0][order]
    full = dfairpca.FairPCA(5).fit(X, sensitive_features=z)
    inc = dfairpca.FairPCA(5)
    for s in range(0, 900, 150):
        inc.partial_fit(X[s : s + 150], sensitive_features=z[s : s + 150])
    assert inc.n_samples_seen_ == 900
    assert max_angle_deg(inc.components_.T, full.components_.T) < TOL_DEG
    np.testing.assert_allclose(inc.explained_variance_, full.explained_variance_, rtol=1e-9)


def test_equal_opportunity_fits_on_positive_rows():
    X, g = make_data(1200, 18, (3,), seed=12)
    y = (X[:, 1] - np.median(X[:, 1]) + np.random.default_rng(0).normal(size=1200) > 0).astype(int)
    assert all((y[g[0] == c] == 1).any() for c in range(3))
    est = dfairpca.FairPCA(5, constraint="equal_opportunity").fit(da.from_array(X, chunks=200), y, sensitive_features=g[0])
    pos = y == 1
    ref = oracle.fair_pca(X[pos], [g[0][pos]], 5)
    assert est.n_samples_seen_ == pos.sum()
    assert max_angle_deg(est.components_.T, ref) < TOL_DEG
    Y = est.transform(X[pos])
    ms = np.stack([Y[g[0][pos] == c].mean(0) for c in range(3)])
    assert np.abs(ms - ms[0]).max() < 1e-10 * np.abs(Y).max()


@pytest.mark.parametrize("lam", [0.0, 0.3, 1.0])
def test_tradeoff_concatenates_scaled_standard_pca(lam):
    X, g = make_data(600, 12, (2,), seed=13)
    est = dfairpca.FairPCA(3, tradeoff=lam).fit(X, sensitive_features=g[0])
    Y = est.transform(X)
    fair = (X - X.mean(0)) @ est.components_.T
    if lam == 0:
        assert Y.shape == (600, 3) and est.standard_components_ is None
        np.testing.assert_allclose(Y, fair, atol=1e-10)
        return
    assert Y.shape == (600, 6)
    std = (X - X.mean(0)) @ est.standard_components_.T
    np.testing.assert_allclose(Y, np.hstack([fair, lam * std]), atol=1e-10)
    assert max_angle_deg(est.standard_components_.T, oracle.pca(X, 3)) < TOL_DEG
    assert est.inverse_transform(Y).shape == (600, 12)


def test_inverse_transform_reconstructs_in_fair_subspace():
    X, g = make_data(500, 10, (2,), seed=14)
    est = dfairpca.FairPCA(9).fit(X, sensitive_features=g[0])  # k = d - 1: only the mean direction is lost
    R = est.inverse_transform(est.transform(X))
    Ud = est.components_
    np.testing.assert_allclose((R - est.mean_) @ Ud.T @ Ud, R - est.mean_, atol=1e-9)
    Rd = est.inverse_transform(est.transform(da.from_array(X, chunks=100))).compute()
    np.testing.assert_allclose(Rd, R, atol=1e-9)
    means = [R[g[0] == c].mean(0) for c in (0, 1)]
    np.testing.assert_allclose(means[0], means[1], atol=1e-9)


def test_sklearn_api_clone_pipeline_params():
    X, g = make_data(400, 10, (2,), seed=15)
    est = dfairpca.FairPCA(3, tradeoff=0.1)
    assert clone(est).get_params() == est.get_params()
    est.set_params(n_components=4)
    assert est.n_components == 4
    pipe = make_pipeline(dfairpca.PCA(5), LogisticRegression())
    pipe.fit(X, g[0])
    assert pipe.score(X, g[0]) > 0.5
    fitted = dfairpca.FairPCA(3).fit(X, sensitive_features=g[0])
    assert list(fitted.get_feature_names_out()) == ["fairpca0", "fairpca1", "fairpca2"]
    Y = dfairpca.FairPCA(3).fit_transform(X, sensitive_features=g[0])
    np.testing.assert_allclose(Y, fitted.transform(X))
    assert dfairpca.PCA(2).fit_transform(X).shape == (400, 2)


def test_task_label_is_never_taken_for_the_groups():
    """The Pipeline trap: ``pipe.fit(X, y)`` hands y to every step's fit as its second
    argument; FairPCA must refuse to run without sensitive features instead of using y."""
    import sklearn

    X, g = make_data(400, 10, (2,), seed=15)
    y = (X[:, 0] > 0).astype(int)
    for est in (dfairpca.FairPCA(3), dfairpca.FairKernelPCA(3)):
        with pytest.raises(ValueError, match="sensitive_features=z"):
            make_pipeline(est, LogisticRegression()).fit(X, y)
        with pytest.raises(ValueError, match="never used"):
            clone(est).fit(X, y)
    # metadata routing passes the groups through the Pipeline, y reaches the classifier
    with sklearn.config_context(enable_metadata_routing=True):
        fair = dfairpca.FairPCA(3).set_fit_request(sensitive_features=True)
        pipe = make_pipeline(fair, LogisticRegression()).fit(X, y, sensitive_features=g[0])
        ref = dfairpca.FairPCA(3).fit(X, sensitive_features=g[0])
        np.testing.assert_allclose(pipe[0].components_, ref.components_)


def test_deterministic_signs():
    X, g = make_data(400, 10, (2,), seed=16)
    a = dfairpca.FairPCA(4).fit(X, sensitive_features=g[0]).components_
    b = dfairpca.FairPCA(4).fit(da.from_array(X, chunks=33), sensitive_features=g[0]).components_
    np.testing.assert_allclose(a, b, atol=1e-10)
    assert np.all(a[np.arange(4), np.abs(a).argmax(1)] > 0)


# ----------------------------------------------------------------------------- persistence
@pytest.mark.parametrize("statistics", [False, True])
def test_save_load_roundtrip(tmp_path, statistics):
    X, g = make_data(500, 12, (2, 3), seed=17)
    labels = pd.DataFrame({"a": np.where(g[0] == 1, "x", "y"), "b": g[1]})
    est = dfairpca.FairPCA(4, tradeoff=0.2, standardize=True).fit(X, sensitive_features=labels)
    est.save(tmp_path / "m", statistics=statistics)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]  # no temporary left behind
    back = dfairpca.load(tmp_path / "m")
    assert type(back) is dfairpca.FairPCA and back.get_params() == est.get_params()
    np.testing.assert_array_equal(back.transform(X), est.transform(X))
    assert [list(c) for c in back.groups_] == [list(c) for c in est.groups_]
    assert back.attribute_names_ == ["a", "b"]
    for a, b in zip(back.group_means_, est.group_means_):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(back.constraint_basis_, est.constraint_basis_)
    if statistics:
        back.partial_fit(X[:50], sensitive_features=labels[:50])
        assert back.n_samples_seen_ == 550
    else:
        assert not hasattr(back, "statistics_")


def test_load_rejects_foreign_directory(tmp_path):
    with pytest.raises(FileNotFoundError, match="not a saved dfairpca"):
        dfairpca.load(tmp_path)


# ----------------------------------------------------------------------------- errors
@pytest.fixture
def xg():
    X, g = make_data(200, 8, (3,), seed=18)
    return X, g[0]


@pytest.mark.parametrize(
    "kwargs, fit_args, exc, match",
    [
        ({"n_components": 0}, {}, ValueError, "positive integer"),
        ({"n_components": 7}, {}, ValueError, r"largest k is d - sum\(m\) \+ p = 8 - 3 \+ 1 = 6"),
        ({"constraint": "parity"}, {}, ValueError, "constraint must be one of"),
        ({"tradeoff": 1.5}, {}, ValueError, r"tradeoff must be a number in \[0, 1\]"),
        ({"constraint": "equal_opportunity"}, {}, ValueError, "pass y"),
        ({"constraint": "equal_opportunity"}, {"y": np.arange(200) % 3}, ValueError, "binary"),
        ({"compute_dtype": "int8"}, {}, ValueError, "compute_dtype"),
    ],
)
def test_bad_parameters(xg, kwargs, fit_args, exc, match):
    X, z = xg
    with pytest.raises(exc, match=match):
        dfairpca.FairPCA(**{"n_components": 2, **kwargs}).fit(X, sensitive_features=z, **fit_args)


def test_bad_inputs(xg):
    X, z = xg
    est = dfairpca.FairPCA(2)
    with pytest.raises(ValueError, match="Reshape your data"):  # scikit-learn's words
        est.fit(X.reshape(-1), sensitive_features=z)
    with pytest.raises(ValueError, match="199 labels but X has 200 rows"):
        est.fit(X, sensitive_features=z[:-1])
    with pytest.raises(ValueError, match="single group"):
        est.fit(X, sensitive_features=np.zeros(200))
    with pytest.raises(ValueError, match="missing labels"):
        est.fit(X, sensitive_features=np.where(z == 0, np.nan, z))
    with pytest.raises(ValueError, match="sensitive_features=z"):
        est.fit(X)
    with pytest.raises(ValueError, match="numeric"):
        est.fit(X.astype(str), sensitive_features=z)
    with pytest.raises(ValueError, match="no fair projection exists"):
        dfairpca.FairPCA().fit(X[:, :2], sensitive_features=z)


def test_empty_group_after_equal_opportunity_filter(xg):
    X, z = xg
    y = (z != 2).astype(int)  # group 2 has no positives
    with pytest.raises(ValueError, match=r"group\(s\) \[.*2\] have no rows with y == 1"):
        dfairpca.FairPCA(2, constraint="equal_opportunity").fit(X, y, sensitive_features=z)


@pytest.mark.parametrize("kind", ["numpy", "dask"])
def test_nan_and_inf_rows_are_named(xg, kind):
    X, z = xg
    X = X.copy()
    X[17, 3] = np.nan
    X[150, 0] = np.inf
    Xin = da.from_array(X, chunks=40) if kind == "dask" else X
    with pytest.raises(ValueError, match=r"NaN or infinity in 2 row\(s\) \(rows 17, 150\)"):
        dfairpca.FairPCA(2).fit(Xin, sensitive_features=z)


@pytest.mark.parametrize("solver", ["full", "randomized"])
@pytest.mark.parametrize("value", [0.0, 3.0])
def test_data_without_variance_is_an_error_naming_the_cause(xg, solver, value):
    """Every explained variance ratio would be 0 / 0 (NaN, and a model saved as if fine)."""
    X, z = xg
    X = np.full_like(X, value)
    rows = "zero" if value == 0 else "equal"
    for est, kw in [(dfairpca.PCA(2, svd_solver=solver), {}),
                    (dfairpca.FairPCA(2, svd_solver=solver), {"sensitive_features": z})]:
        with pytest.raises(ValueError, match=f"zero total variance: all its {len(X)} rows are {rows}"):
            est.fit(X, **kw)
    with pytest.raises(ValueError, match="zero total variance"):
        dfairpca.PCA(2, standardize=True).fit(X)
    # without centring, equal rows still hold a direction: the mean's
    assert dfairpca.PCA(1, center=False).fit(X + 1).explained_variance_ratio_[0] == pytest.approx(1)


def test_identical_rows_are_the_zero_variance_error_within_rounding():
    """Their means round (0.1 + 0.1 + 0.1 != 0.3), leaving a scatter of about 1e-33:
    judged against 0 alone, that was a fit of arbitrary components and a ratio of 1."""
    X = np.tile([0.1, 0.2, 0.3], (3, 1))
    z = np.array([0, 1, 0])
    msg = "zero total variance: all its 3 rows are equal"
    for est, kw in [(dfairpca.PCA(1), {}), (dfairpca.PCA(1, svd_solver="randomized"), {}),
                    (dfairpca.PCA(1, standardize=True), {}),
                    (dfairpca.FairPCA(1), {"sensitive_features": z}),
                    (dfairpca.FairKernelPCA(1), {"sensitive_features": z})]:
        with pytest.raises(ValueError, match=msg):
            est.fit(X, **kw)
    # one row of positive weight is no variance either, whatever the others hold
    rng = np.random.default_rng(3)
    Y = rng.standard_normal((40, 5)) + 1e6
    w = np.zeros(40)
    w[7] = 3.3
    with pytest.raises(ValueError, match="zero total variance: its one row of positive weight"):
        dfairpca.PCA(2).fit(Y, sample_weight=w)
    with pytest.raises(ValueError, match="zero total variance"):
        dfairpca.PCA(2).fit(da.from_array(Y, chunks=(7, 5)), sample_weight=da.from_array(w, chunks=7))
    # fair: two equal rows of positive weight, one per group
    Y[8], w[8] = Y[7], 0.4
    with pytest.raises(ValueError, match="zero total variance: all its 2 rows are equal"):
        dfairpca.FairPCA(1).fit(Y, sensitive_features=np.arange(40) % 2, sample_weight=w)


def test_a_spread_of_data_near_the_largest_floats_is_not_zero_variance():
    """Rows of magnitude 4e153 spread by 2e147: n * mean**2 overflows float64, which once
    made every feature's variance count as rounding (the equal-rows error)."""
    rng = np.random.default_rng(0)
    X = (rng.standard_normal((100, 8)) + 4e6) * 1e147
    z = np.arange(100) % 2
    for est, kw in [(dfairpca.PCA(2), {}), (dfairpca.FairPCA(2), {"sensitive_features": z}),
                    (dfairpca.FairKernelPCA(2), {"sensitive_features": z})]:
        est.fit(X, **kw)
    with pytest.raises(ValueError, match="zero total variance: all its 100 rows are equal"):
        dfairpca.PCA(2).fit(np.tile(X[:1], (100, 1)))


@given(seed=st.integers(0, 2**31), n=st.integers(2, 400), d=st.integers(1, 12),
       offset=st.sampled_from([0.0, 1.0, -3e-4, 1e6, -1e12]),
       dtype=st.sampled_from([np.float64, np.float32]),
       weights=st.sampled_from([None, "random", "one"]))
def test_repeated_rows_are_always_refused_and_tiny_variance_is_fitted(seed, n, d, offset, dtype,
                                                                      weights):
    rng = np.random.default_rng(seed)
    row = rng.standard_normal(d) * 10.0 ** rng.uniform(-4, 4) + offset
    X = np.tile(row, (n, 1)).astype(dtype)
    w = None if weights is None else rng.uniform(1.0, 3.0, n)  # a total of at least 2
    if weights == "one":
        w = np.zeros(n)
        w[rng.integers(n)] = rng.uniform(2.0, 9.0)
    chunk = int(rng.integers(1, n + 1))
    Xd = da.from_array(X, chunks=(chunk, d))
    wd = None if w is None else da.from_array(w, chunks=chunk)
    z = np.arange(n) % 2
    for est, kw in [(dfairpca.PCA(1), {}), (dfairpca.FairPCA(1), {"sensitive_features": z})]:
        if est.__class__ is dfairpca.FairPCA and (n < 3 or d < 2 or weights == "one"):
            continue  # other errors: a group without rows of positive weight, no room for a constraint
        for data, ws in [(X, w), (Xd, wd)]:
            with pytest.raises(ValueError, match="zero total variance"):
                est.fit(data, sample_weight=ws, **kw)
    # a genuine spread 1e-10 of the magnitude (a million ulps in float64) is data, not rounding
    if dtype is np.float64 and weights != "one" and n >= 4:
        scale = np.abs(row).max()
        Y = X + rng.standard_normal(X.shape) * 1e-10 * scale
        for data in [Y, da.from_array(Y, chunks=(chunk, d))]:
            assert dfairpca.PCA(1).fit(data, sample_weight=w).explained_variance_[0] > 0


def test_transform_errors(xg):
    X, z = xg
    with pytest.raises(NotFittedError, match="not fitted yet"):
        dfairpca.FairPCA(2).transform(X)
    est = dfairpca.FairPCA(2).fit(X, sensitive_features=z)
    with pytest.raises(ValueError, match="X has 7 features, but FairPCA is expecting 8 features as input"):
        est.transform(X[:, :7])


def test_zarr_store_without_the_named_array(tmp_path):
    g = zarr.open_group(str(tmp_path / "s.zarr"), mode="w")
    g.create_array("images", shape=(10, 4), chunks=(5, 4), dtype="uint8")[:] = 1
    with pytest.raises(KeyError, match=r"has no array 'pixels'; it holds \['images'\]"):
        dfairpca.from_zarr(tmp_path / "s.zarr", "pixels")
    with pytest.raises(ValueError, match="is a Zarr group, not an array"):
        dfairpca.FairPCA(2).fit(str(tmp_path / "s.zarr"), sensitive_features=np.arange(10) % 2)
    with pytest.raises(FileNotFoundError, match="no Zarr store"):
        dfairpca.from_zarr(tmp_path / "nope.zarr", "images")
    # URLs go through fsspec (s3://, gs://, ...; file:// here)
    X = dfairpca.from_zarr(f"file://{tmp_path}/s.zarr", "images")
    assert X.shape == (10, 4)


@pytest.mark.parametrize("solver", ["dense", "subspace"])
def test_eigen_solvers_agree_with_oracle(solver):
    X, g = make_data(2000, 60, (3, 2), seed=31, decay=0.9)
    ref = oracle.fair_pca(X, g, 8)
    est = dfairpca.FairPCA(8, eigen_solver=solver).fit(X, sensitive_features=np.column_stack(g))
    # subspace iteration stops on the captured variance (1e-8 relative), so vectors are
    # accurate to about the square root of that
    tol = 1e-6 if solver == "dense" else 0.05
    assert max_angle_deg(est.components_.T, ref) < tol
    C = np.cov(X.T)
    captured = lambda U: np.sum((U.T @ C) * U.T)
    assert captured(est.components_.T) == pytest.approx(captured(ref), rel=1e-8)
    pca = dfairpca.PCA(8, eigen_solver=solver).fit(X)
    assert max_angle_deg(pca.components_.T, oracle.pca(X, 8)) < tol
    with pytest.raises(ValueError, match="eigen_solver must be one of"):
        dfairpca.PCA(2, eigen_solver="arpack").fit(X)


def test_eigen_solver_randomized_is_the_deprecated_name_of_subspace(tmp_path):
    """Block subspace iteration is "subspace"; its old name "randomized" (which clashed
    with the randomized SVD of svd_solver) still fits, warning once, and a model saved with
    it loads quietly as "subspace"."""
    import json
    import warnings

    X, g = make_data(400, 12, (2,), seed=3)
    new = dfairpca.FairPCA(3, eigen_solver="subspace").fit(X, sensitive_features=g[0])
    with pytest.warns(FutureWarning, match="eigen_solver='subspace'") as record:
        old = dfairpca.FairPCA(3, eigen_solver="randomized").fit(X, sensitive_features=g[0])
    assert sum(issubclass(w.category, FutureWarning) for w in record) == 1  # validated once
    assert record[0].filename == __file__  # the user's call, not dfairpca's validation
    np.testing.assert_array_equal(old.components_, new.components_)
    with pytest.warns(FutureWarning, match="eigen_solver='subspace'"):
        pca = dfairpca.PCA(3, eigen_solver="randomized").fit(X)
    np.testing.assert_array_equal(pca.components_, dfairpca.PCA(3, eigen_solver="subspace").fit(X).components_)
    with pytest.warns(FutureWarning, match="eigen_solver='subspace'"):  # save checks the params
        old.save(tmp_path / "m")
    assert json.loads((tmp_path / "m" / "meta.json").read_text())["params"]["eigen_solver"] == "randomized"
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        loaded = dfairpca.load(tmp_path / "m")
    assert loaded.eigen_solver == "subspace"
    np.testing.assert_array_equal(loaded.transform(X), old.transform(X))


def test_one_fair_input_serves_both_fair_estimators():
    """FairPCA and FairKernelPCA read X, the attributes, y and the weights through one
    function: the same rows, groups, numeric columns and names, the same refusals."""
    from dfairpca.decomposition._fair_input import fair_input

    X, g = make_data(90, 5, (3,), seed=2)
    # the attributes as columns: group labels as text, a numeric one (0/1)
    Xz = pd.DataFrame(X, columns=[f"x{j}" for j in range(5)]).assign(
        race=np.array(["a", "b", "c"])[g[0]], z=np.arange(90) % 2)
    y = (np.arange(90) % 3 == 0).astype(int)
    w = np.ones(90)
    read = []
    for cls in (dfairpca.FairPCA, dfairpca.FairKernelPCA):
        est = cls(2, sensitive_feature_ids=["race", "z"], constraint="equal_opportunity")
        f = fair_input(est, Xz, None, y, reset=True, sample_weight=w)
        assert (f.n_rows, f.fitted_rows, f.n_features, f.n_numeric) == (90, 30, 5, 1)
        assert f.group_sizes == [3] and f.names == ["race", "z"]
        np.testing.assert_array_equal(f.mask, y == 1)
        read.append(f)
    np.testing.assert_array_equal(read[0].groups.codes, read[1].groups.codes)
    assert read[0].names == read[1].names
    for cls in (dfairpca.FairPCA, dfairpca.FairKernelPCA):
        with pytest.raises(ValueError, match="y == 1"):
            fair_input(cls(2, constraint="equal_opportunity"), X, g[0], y, reset=True,
                       sample_weight=np.where(y == 1, 0.0, 1.0))


# ----------------------------------------------------------------------------- one base
def test_pca_and_fair_pca_are_siblings_on_one_base():
    from dfairpca.decomposition._base import Estimator
    from dfairpca.decomposition._linear import LinearDecomposition

    assert not isinstance(dfairpca.FairPCA(), dfairpca.PCA)
    assert not isinstance(dfairpca.PCA(), dfairpca.FairPCA)
    assert issubclass(dfairpca.PCA, LinearDecomposition) and issubclass(dfairpca.FairPCA, LinearDecomposition)
    assert issubclass(dfairpca.FairKernelPCA, Estimator)
    assert not issubclass(dfairpca.FairKernelPCA, LinearDecomposition)  # no inverse_transform, score
    assert not hasattr(dfairpca.FairKernelPCA(), "inverse_transform")


@pytest.mark.parametrize("cls", [dfairpca.PCA, dfairpca.FairPCA, dfairpca.FairKernelPCA])
def test_every_parameter_is_declared_in_the_table(cls):
    assert sorted(cls._parameter_rules) == sorted(cls._get_param_names())


EQUALIZE = "equalize_covariance must be None, a fraction in (0, 1] or an int; got 'x'"


@pytest.mark.parametrize("cls, params, error, message", [
    ("PCA", {"n_components": 1.5}, ValueError, "n_components must be a positive integer, a "
     "fraction in (0, 1) of the variance to keep, 'mle' or None; got 1.5"),
    ("PCA", {"n_components": True}, ValueError, "n_components must be a positive integer, a "
     "fraction in (0, 1) of the variance to keep, 'mle' or None; got True"),
    ("FairPCA", {"n_components": "mle"}, ValueError, "n_components must be a positive integer, a "
     "fraction in (0, 1) of the variance to keep, or None; got 'mle'"),
    ("PCA", {"split_every": 1}, ValueError, "split_every must be an integer >= 2; got 1"),
    ("PCA", {"compute_dtype": "int8"}, ValueError,
     "compute_dtype must be 'auto', 'float32', 'float64' or 'exact'; got 'int8'"),
    ("PCA", {"eigen_solver": "arpack"}, ValueError,
     "eigen_solver must be one of ('auto', 'dense', 'subspace'); got 'arpack'"),
    ("PCA", {"whiten": "yes"}, ValueError, "whiten must be True or False; got 'yes'"),
    ("PCA", {"svd_solver": "arpak"}, ValueError,
     "svd_solver must be one of ('auto', 'full', 'covariance_eigh', 'randomized'); got 'arpak'"),
    ("PCA", {"iterated_power": -1}, ValueError, "iterated_power must be 'auto' or an integer >= 0; got -1"),
    ("PCA", {"n_oversamples": 0}, ValueError, "n_oversamples must be an integer >= 1; got 0"),
    ("PCA", {"random_state": "x"}, ValueError,
     "random_state must be None, an int or a numpy random generator; got 'x'"),
    ("FairPCA", {"constraint": "parity"}, ValueError,
     "constraint must be one of ('demographic_parity', 'equal_opportunity'); got 'parity'"),
    ("FairPCA", {"tradeoff": True}, ValueError, "tradeoff must be a number in [0, 1]; got True"),
    ("FairPCA", {"equalize_covariance": "x"}, ValueError, EQUALIZE),
    ("FairPCA", {"equalize_covariance": 1.5}, ValueError,
     "equalize_covariance as a fraction must be in (0, 1]; got 1.5"),
    ("FairPCA", {"equalize_covariance": 2, "n_components": 3}, ValueError,
     "equalize_covariance=2 directions cannot hold n_components=3; pass l >= k or a fraction in (0, 1]"),
    ("FairPCA", {"equalize_covariance": 0.5, "n_components": 0.5}, ValueError,
     "n_components=0.5 (a fraction of the variance) cannot be combined with equalize_covariance, "
     "whose l depends on k: pass an int k"),
    ("FairKernelPCA", {"n_components": 0.5}, ValueError,
     "n_components must be a positive integer or None; got 0.5"),
    ("FairKernelPCA", {"kernel": "laplace"}, ValueError,
     "unknown kernel 'laplace'; use one of 'rbf', 'poly', 'sigmoid', 'linear' or a callable "
     "kernel(A, B) returning the (len(A), len(B)) kernel matrix"),
    ("FairKernelPCA", {"gamma": 0}, ValueError, "gamma must be 'scale' or a number > 0; got 0"),
    ("FairKernelPCA", {"degree": 0}, ValueError, "degree must be a positive integer; got 0"),
    ("FairKernelPCA", {"coef0": "a"}, ValueError, "coef0 must be a number; got 'a'"),
    ("FairKernelPCA", {"n_landmarks": "all"}, ValueError,
     "n_landmarks must be None (exact), 'auto' or a positive integer; got 'all'"),
    ("FairKernelPCA", {"landmarks": "kmeans"}, ValueError, "landmarks must be 'uniform'; got 'kmeans'"),
    ("FairKernelPCA", {"max_memory": 0}, ValueError,
     "max_memory must be None or a positive number of bytes; got 0"),
    ("FairKernelPCA", {"split_every": 2.5}, ValueError, "split_every must be an integer >= 2; got 2.5"),
    ("FairKernelPCA", {"random_state": -1}, ValueError,
     "random_state must be None, an int >= 0, a numpy RandomState or Generator; got -1"),
    ("FairPCA", {"sensitive_feature_ids": "race"}, ValueError,
     "sensitive_feature_ids must be a list of column names or indices; got 'race': pass ['race']"),
    ("FairKernelPCA", {"sensitive_feature_ids": 3}, ValueError,
     "sensitive_feature_ids must be a list of column names or indices; got 3: pass [3]"),
    ("FairPCA", {"sensitive_feature_ids": np.array(20)}, ValueError,
     "sensitive_feature_ids must be a list of column names or indices; got array(20): pass [20]"),
])
def test_one_validator_says_what_each_parameter_must_be(cls, params, error, message):
    """The table of each class, checked by one function, before any data is read."""
    from dfairpca.base._params import validate_params

    est = getattr(dfairpca, cls)(**params)
    with pytest.raises(error) as info:
        validate_params(est)
    assert str(info.value) == message if error is ValueError else str(info.value).startswith(message)
    kw = {} if cls == "PCA" else {"sensitive_features": []}
    with pytest.raises(error, match="must|unknown|cannot"):
        est.fit(np.zeros((0, 0)), **kw)  # refused before X is looked at


BOOLEAN_PARAMETERS = [(cls, name) for cls in ("PCA", "FairPCA", "FairKernelPCA")
                      for name, default in getattr(dfairpca, cls)().get_params().items()
                      if isinstance(default, bool)]


@pytest.mark.parametrize("cls, name", BOOLEAN_PARAMETERS)
@pytest.mark.parametrize("value", ["no", "yes", "False", 0, 1, None])
def test_boolean_parameters_take_bools_only(cls, name, value):
    """A string such as "no" is truthy: read as True it would silently do the opposite."""
    from dfairpca.base._params import validate_params

    with pytest.raises(ValueError, match=f"^{name} must be True or False; got {value!r}$"):
        validate_params(getattr(dfairpca, cls)(**{name: value}))
    for fine in (True, False, np.True_, np.False_):
        validate_params(getattr(dfairpca, cls)(**{name: fine}))


def test_every_estimator_has_boolean_parameters_under_test():
    assert {c for c, _ in BOOLEAN_PARAMETERS} == {"PCA", "FairPCA", "FairKernelPCA"}
    assert ("PCA", "center") in BOOLEAN_PARAMETERS and ("FairPCA", "progress") in BOOLEAN_PARAMETERS


def test_fit_statistics_takes_attribute_names_and_numeric_columns():
    """The statistics of [z, X] with z a numeric protected column solve as a fit with
    sensitive_feature_ids=[0]; the names given appear in attribute_names_ and in errors."""
    X, (z,) = make_data(400, 6, (2,), seed=41)
    Xz = np.column_stack([z.astype(float), X])
    ref = dfairpca.FairPCA(3, sensitive_feature_ids=[0]).fit(Xz)
    stats = dfairpca.compute_moments(Xz, dtype=np.float64)
    est = dfairpca.FairPCA(3).fit_statistics(stats, attribute_names=["z"], numeric_columns=[0])
    np.testing.assert_allclose(est.components_, ref.components_, atol=1e-10)
    assert est.attribute_names_ == ["z"] and list(est.numeric_sensitive_columns_) == [0]
    one = dfairpca.Moments.from_chunk(X, np.zeros((400, 1), np.int64), [np.array(["a", "b"])])
    with pytest.raises(ValueError, match="^race has 1 non-empty group"):
        dfairpca.FairPCA(2).fit_statistics(one, attribute_names=["race"])


def test_one_k_limit_for_the_linear_and_both_kernel_methods():
    """d - sum(m) + p - q, with a numeric attribute (q = 1) beside three groups (m = 3):
    the same rule, over X's 6 features, the 200 fitted rows or the 40 landmarks."""
    X, (g,) = make_data(200, 6, (3,), seed=42)
    df = pd.DataFrame(X, columns=[f"f{i}" for i in range(6)])
    df.insert(0, "g", np.array(["a", "b", "c"])[g])
    df.insert(0, "z", (np.arange(200) % 2).astype(float))
    ids = ["z", "g"]
    with pytest.raises(ValueError, match=r"with 3 groups and 1 numeric attribute\(s\) the largest k "
                                         r"is d - sum\(m\) \+ p - q = 6 - 3 \+ 1 - 1 = 3$"):
        dfairpca.FairPCA(4, sensitive_feature_ids=ids).fit(df)
    assert dfairpca.FairPCA(sensitive_feature_ids=ids).fit(df).max_components_ == 3
    for landmarks, basis in ((None, "n = 200 fitted rows"), (40, "n_landmarks = 40")):
        limit = (200 if landmarks is None else 40) - 3 + 1 - 1
        with pytest.raises(ValueError, match=rf"with 3 groups and 1 numeric attribute\(s\) and {basis} "
                                             rf"the largest k is .* - 3 \+ 1 - 1 = {limit};"):
            dfairpca.FairKernelPCA(limit + 1, sensitive_feature_ids=ids, n_landmarks=landmarks).fit(df)
    est = dfairpca.FairKernelPCA(3, sensitive_feature_ids=ids, n_landmarks=40).fit(df)
    assert est.max_components_ == 37


def test_fair_kernel_pca_takes_the_seeds_scikit_learn_takes():
    """random_state as scikit-learn estimators take it (None, an int, a RandomState) and as
    numpy's default_rng does (a Generator): the same RandomState state, the same fit."""
    X, g = make_data(120, 6, (2,), seed=4)
    fits = [dfairpca.FairKernelPCA(3, random_state=r, n_landmarks=40).fit(X, sensitive_features=g[0])
            for r in (np.random.RandomState(5), np.random.RandomState(5))]
    np.testing.assert_array_equal(fits[0].transform(X), fits[1].transform(X))
    dfairpca.FairKernelPCA(3, random_state=np.random.default_rng(5)).fit(X, sensitive_features=g[0])
    with pytest.raises(ValueError, match="RandomState or Generator"):
        dfairpca.FairKernelPCA(3, random_state="five").fit(X, sensitive_features=g[0])


def test_save_refuses_parameters_that_load_would_refuse(tmp_path):
    """A parameter changed with set_params after the fit is checked by save, before any
    write: a saved model that load() refuses would be a file nobody can use."""
    X, _ = make_data(60, 5, (), seed=1)
    est = dfairpca.PCA(2).fit(X).set_params(whiten="yes")
    with pytest.raises(ValueError, match="whiten must be True or False"):
        est.save(tmp_path / "m")
    assert not (tmp_path / "m").exists()


def test_partial_fit_continues_a_fair_fit_of_statistics_computed_elsewhere():
    """fit_statistics of compute_moments' statistics, then partial_fit of more rows with
    their group labels: the fit of all the rows."""
    X, g = make_data(300, 6, (2,), seed=5)
    a = dfairpca.FairPCA(2).fit_statistics(dfairpca.compute_moments(X[:150], sensitive_features=g[0][:150]))
    a.partial_fit(X[150:], sensitive_features=g[0][150:])
    b = dfairpca.FairPCA(2).fit(X, sensitive_features=g[0])
    np.testing.assert_allclose(np.abs(a.components_ @ b.components_.T), np.eye(2), atol=1e-8)


def test_dfairpca_warnings_name_the_users_line():
    """A warning about the data (a numeric attribute, a constraint dropped as rounding)
    points at the fit call that caused it, so that the user can find it and filter it by
    module, wherever inside dfairpca it was found."""
    import warnings

    rng = np.random.default_rng(0)
    X = rng.normal(size=(200, 6))
    X[:, 0] = rng.integers(1, 5, 200)
    A = rng.normal(size=(50, 5))
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        dfairpca.FairPCA(2, sensitive_feature_ids=[0]).fit(X)
        dfairpca.FairPCA(2).fit(np.vstack([A, A]), sensitive_features=np.repeat([0, 1], 50))
    kinds = {w.category.__name__: w.filename for w in record}
    assert kinds == {"NumericAttributeWarning": __file__, "ConstraintDroppedWarning": __file__}
