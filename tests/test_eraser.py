"""ConceptEraser: LEACE and the orthogonal projection against a dense numpy oracle of the
closed form, the erasure itself (no group indicator covaries with any output feature),
lazy Dask/Zarr/xarray transforms, a Pipeline with routing, save/load and rank-deficient
covariances."""

import dask.array as da
import numpy as np
import pytest
import sklearn
import xarray as xr
import zarr
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import roc_auc_score
from sklearn.pipeline import make_pipeline

import dfairpca
from dfairpca import ConceptEraser
from dfairpca.io import SavedFileError
from oracle import leace, leace_full_rank, make_data


def _oracle_erase(X, groups, w=None, method="leace", rtol=None):
    mu, E = leace(X, groups, w, method, rtol)
    return X - (X - mu) @ E


def _cross_covariance(Y, groups, w=None):
    """Largest |cov(indicator of g, output feature j)| over groups and features, relative
    to the same for X's raw data scale (the output's spread)."""
    w = np.ones(len(Y)) if w is None else w
    Yc = Y - w @ Y / w.sum()
    worst = 0.0
    for g in groups:
        Z = (g[:, None] == np.unique(g)[None, :]).astype(float)
        Zc = Z - w @ Z / w.sum()
        worst = max(worst, float(np.abs((Yc * w[:, None]).T @ Zc).max() / w.sum()))
    return worst / float(np.sqrt(np.mean(Yc ** 2)))


@pytest.mark.parametrize("method", ["leace", "orth"])
def test_transform_equals_the_dense_oracle(method):
    X, (g,) = make_data(400, 8, (3,), seed=1)
    est = ConceptEraser(method).fit(X, sensitive_features=g)
    np.testing.assert_allclose(est.transform(X), _oracle_erase(X, [g], method=method),
                               rtol=0, atol=1e-8 * np.abs(X).max())
    assert est.n_constraints_ == 2 and est.fairness_violation_ < 1e-12
    assert est.proj_left_.shape == (8, 2) and est.proj_right_.shape == (2, 8)
    np.testing.assert_allclose(est.mean_, X.mean(0), atol=1e-12 * np.abs(X).max())


def test_weights_and_two_attributes_equal_the_oracle():
    X, (g, h) = make_data(500, 10, (2, 4), seed=2)
    w = np.random.default_rng(3).uniform(0.1, 3.0, len(X))
    for method in ("leace", "orth"):
        est = ConceptEraser(method).fit(X, sensitive_features=[g, h], sample_weight=w)
        Y = est.transform(X)
        np.testing.assert_allclose(Y, _oracle_erase(X, [g, h], w, method),
                                   rtol=0, atol=1e-8 * np.abs(X).max())
        assert est.n_constraints_ == 1 + 3 and len(est.groups_) == 2
        assert est.fairness_violation_per_attribute_.shape == (2,)
        assert est.sample_weight_sum_ == pytest.approx(w.sum()) and est.n_samples_seen_ == 500
        assert _cross_covariance(Y, [g, h], w) < 1e-12


def test_no_group_covaries_with_any_output_feature_and_leace_changes_least():
    X, (g, h) = make_data(2000, 12, (2, 3), seed=4, shift=3.0)
    leace_, orth = (ConceptEraser(m).fit(X, sensitive_features=[g, h]) for m in ("leace", "orth"))
    before = _cross_covariance(X, [g, h])
    assert before > 0.1
    change = {}
    for name, est in (("leace", leace_), ("orth", orth)):
        Y = est.transform(X)
        assert _cross_covariance(Y, [g, h]) < 1e-12
        assert est.fairness_violation_ < 1e-12
        change[name] = float(np.mean(np.sum((Y - X) ** 2, axis=1)))
    assert change["leace"] <= change["orth"] * (1 + 1e-12)
    assert change["leace"] < change["orth"]  # correlated features: strictly less here


def _correlation(Y, groups):
    """Largest |correlation| of a group's indicator with an output feature: each feature
    on its own scale, where features' scales span 1e6."""
    Yc = Y - Y.mean(axis=0)
    worst = 0.0
    for g in groups:
        Z = (g[:, None] == np.unique(g)[None, :]).astype(float)
        Zc = Z - Z.mean(axis=0)
        c = (Yc.T @ Zc) / np.outer(np.linalg.norm(Yc, axis=0), np.linalg.norm(Zc, axis=0))
        worst = max(worst, float(np.abs(c).max()))
    return worst


def _ill_conditioned(groups, decades, seed=4):
    """(X, groups, change): well-conditioned data Y mapped by A = diag(s) Q (feature scales
    s spanning 10**decades before a rotation Q), and LEACE's change ``x - r(x)`` of X's rows
    from Y's own closed form: LEACE is equivariant under invertible linear maps (it is
    the least change in every norm at once), so ``r_X(x) = r_Y(x A^-1) A``, exact to the
    rounding of well-conditioned Y whatever A's condition."""
    Y, gs = make_data(3000, 12, groups, seed=seed, shift=1.0)
    A = np.logspace(0, decades, 12)[:, None] * np.linalg.qr(
        np.random.default_rng(seed + 1).normal(size=(12, 12)))[0]
    mu, E = leace_full_rank(Y, gs)
    return Y @ A + 1e3, gs, (Y - mu) @ E @ A


@pytest.mark.parametrize("groups", [(2,), (3,), (2, 3), (2, 2, 3)])
@pytest.mark.parametrize("decades", [3, 5, 6])
def test_leace_is_its_closed_form_on_ill_conditioned_covariances(groups, decades):
    """Up to a condition number of 1e12: the rank counted where the whitening's
    magnification of rounding cannot pose as a direction (m - 1 per attribute), the
    change equal to the closed form to eps * cond(Sigma) (the accuracy of the eigenvectors
    of Sigma's smallest eigenvalues) and no larger, the cross-covariance 0."""
    X, gs, change = _ill_conditioned(groups, decades)
    cond = np.linalg.cond(np.cov(X.T))
    tol = np.finfo(float).eps * cond
    est = ConceptEraser().fit(X, sensitive_features=gs)
    assert est.n_constraints_ == sum(m - 1 for m in groups) and est.support_rank_ == 12
    got = X - est.transform(X)
    assert np.linalg.norm(got - change) <= tol * np.linalg.norm(change)
    mu, E = leace_full_rank(X, gs)  # the same closed form computed on X itself
    assert np.linalg.norm(got - (X - mu) @ E) <= tol * np.linalg.norm(change)
    assert np.linalg.norm(got) <= (1 + tol) * np.linalg.norm(change)  # the least change
    assert _correlation(X, gs) > 0.3 and _correlation(X - got, gs) < 1e-9
    assert est.fairness_violation_ < 1e-10
    orth = ConceptEraser("orth").fit(X, sensitive_features=gs)
    assert orth.n_constraints_ == est.n_constraints_


def _smooth_images(n, noise, seed):
    """16 x 16 images: 9 smooth cosines with random, group-shifted weights, plus pixel noise."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:16, 0:16] / 15.0
    basis = np.stack([np.cos(np.pi * (a * xx + b * yy))
                      for a in range(3) for b in range(3)]).reshape(9, -1)
    g = rng.integers(0, 2, n)
    h = rng.integers(0, 3, n)
    c = rng.normal(size=(n, 9)) + g[:, None] * 0.7 + rng.normal(size=(3, 9))[h] * 0.5
    return c @ basis + noise * rng.normal(size=(n, 256)), g, h


def test_leace_is_its_closed_form_on_smooth_images_with_small_pixel_noise():
    X, g, h = _smooth_images(4000, 1e-4, seed=20)
    cond = np.linalg.cond(np.cov(X.T))
    assert cond > 1e10
    tol = np.finfo(float).eps * cond
    for gs in ([g], [g, h]):
        est = ConceptEraser().fit(X, sensitive_features=gs)
        assert est.n_constraints_ == sum(len(np.unique(a)) - 1 for a in gs)
        mu, E = leace_full_rank(X, gs)
        change, got = (X - mu) @ E, X - est.transform(X)
        assert np.linalg.norm(got - change) <= tol * np.linalg.norm(change)
        assert np.linalg.norm(got) <= (1 + tol) * np.linalg.norm(change)
        assert _correlation(X, gs) > 0.3 and _correlation(X - got, gs) < 1e-9


def test_a_linear_probe_cannot_recover_the_groups_after_erasure():
    X, (g,) = make_data(3000, 10, (2,), seed=5, shift=2.0)
    probe = LogisticRegression(max_iter=2000)
    assert roc_auc_score(g, probe.fit(X, g).decision_function(X)) > 0.95
    Y = ConceptEraser().fit(X, sensitive_features=g).transform(X)
    # the training AUC of a linear probe on the erased data is chance (its rows are
    # uncorrelated with g; what is left is fitted noise)
    assert abs(roc_auc_score(g, probe.fit(Y, g).decision_function(Y)) - 0.5) < 0.06


def test_dask_input_equals_numpy_and_stays_lazy_with_its_chunks():
    X, (g, h) = make_data(600, 9, (2, 3), seed=6)
    ref = ConceptEraser().fit(X, sensitive_features=[g, h])
    for chunks in ((150, -1), (100, 4)):  # row blocks, and column chunks too
        Xd = da.from_array(X, chunks=chunks)
        est = ConceptEraser().fit(Xd, sensitive_features=[g, h])
        np.testing.assert_allclose(est.proj_left_ @ est.proj_right_, ref.proj_left_ @ ref.proj_right_,
                                   atol=1e-10)
        Y = est.transform(Xd)
        assert isinstance(Y, da.Array) and Y.shape == X.shape and Y.chunks == Xd.chunks
        np.testing.assert_allclose(Y.compute(), ref.transform(X), atol=1e-9 * np.abs(X).max())


def test_a_zarr_store_is_erased_lazily_with_its_chunks(tmp_path):
    X, (g,) = make_data(1200, 16, (2,), seed=7)
    X32 = X.astype(np.float32)
    z = zarr.open_array(str(tmp_path / "x.zarr"), mode="w", shape=X32.shape, chunks=(200, 16),
                        dtype="f4")
    z[:] = X32
    est = ConceptEraser().fit(str(tmp_path / "x.zarr"), sensitive_features=g)
    assert est.statistics_kernel_ == "float64"  # float32 data: the products in float64
    lazy = dfairpca.from_zarr(tmp_path / "x.zarr")
    Y = est.transform(str(tmp_path / "x.zarr"))
    assert isinstance(Y, da.Array) and Y.dtype == np.float32
    assert Y.shape == X.shape and Y.chunks == lazy.chunks
    ref = ConceptEraser().fit(X32.astype(float), sensitive_features=g).transform(X32.astype(float))
    # written chunk by chunk to another store: never all of X in memory at once
    Y.to_zarr(str(tmp_path / "erased.zarr"))
    back = zarr.open_array(str(tmp_path / "erased.zarr"), mode="r")
    assert back.chunks == (lazy.chunks[0][0], 16)
    np.testing.assert_allclose(back[:], ref, atol=1e-4 * np.abs(X).max())


def test_images_and_xarray_keep_their_shape_dims_and_coords():
    X, (g,) = make_data(300, 12, (2,), seed=8)
    imgs = da.from_array(X.reshape(300, 3, 4), chunks=(100, 3, 4))
    est = ConceptEraser().fit(imgs, sensitive_features=g)
    Y = est.transform(imgs)
    assert Y.shape == (300, 3, 4) and Y.chunks == imgs.chunks
    flat = ConceptEraser().fit(X, sensitive_features=g).transform(X)
    np.testing.assert_allclose(Y.compute().reshape(300, -1), flat, atol=1e-9 * np.abs(X).max())
    arr = xr.DataArray(X, dims=("face", "pixel"),
                       coords={"face": np.arange(300) + 10, "pixel": [f"p{i}" for i in range(12)]})
    out = ConceptEraser().fit(arr, sensitive_features=g).transform(arr)
    assert isinstance(out, xr.DataArray) and out.dims == ("face", "pixel")
    assert list(out["face"].values[:2]) == [10, 11] and out["pixel"].values[0] == "p0"
    np.testing.assert_allclose(out.values, flat, atol=1e-9 * np.abs(X).max())


def test_sensitive_columns_of_x_are_left_out_of_the_output():
    X, (g,) = make_data(400, 6, (2,), seed=9)
    Xz = np.column_stack([g, X])
    est = ConceptEraser(sensitive_feature_ids=[0]).fit(Xz)
    Y = est.transform(Xz)
    assert Y.shape == (400, 6) and list(est.get_feature_names_out()) == [f"x{i}" for i in range(1, 7)]
    np.testing.assert_allclose(Y, ConceptEraser().fit(X, sensitive_features=g).transform(X),
                               atol=1e-9 * np.abs(X).max())
    Yd = est.transform(da.from_array(Xz, chunks=(100, -1)))
    assert Yd.chunks == ((100,) * 4, (6,))
    np.testing.assert_allclose(Yd.compute(), Y, atol=1e-12 * np.abs(X).max())
    arr = xr.DataArray(Xz, dims=("row", "col"), coords={"col": ["z"] + [f"f{i}" for i in range(6)]})
    out = ConceptEraser(sensitive_feature_ids=["z"]).fit(arr).transform(arr)
    assert out.dims == ("row", "col") and list(out["col"].values) == [f"f{i}" for i in range(6)]
    np.testing.assert_allclose(out.values, Y, atol=1e-12 * np.abs(X).max())


def test_a_pipeline_routes_the_groups_and_weights():
    X, (g,) = make_data(800, 8, (2,), seed=10)
    y = (X[:, 0] > np.median(X[:, 0])).astype(int)
    w = np.random.default_rng(1).uniform(0.5, 2.0, len(X))
    with sklearn.config_context(enable_metadata_routing=True):
        eraser = ConceptEraser().set_fit_request(sensitive_features=True, sample_weight=True)
        clf = LogisticRegression().set_fit_request(sample_weight=True)
        pipe = make_pipeline(eraser, clf).fit(X, y, sensitive_features=g, sample_weight=w)
    ref = ConceptEraser().fit(X, sensitive_features=g, sample_weight=w)
    np.testing.assert_allclose(pipe[0].transform(X), ref.transform(X), atol=1e-9 * np.abs(X).max())
    assert pipe.predict(X).shape == (800,)


def test_fit_statistics_from_one_pass_serves_fairpca_and_the_eraser():
    X, (g,) = make_data(500, 8, (3,), seed=11)
    fair = dfairpca.FairPCA(3).fit(X, sensitive_features=g)
    est = ConceptEraser().fit_statistics(fair.statistics_, attribute_names=["g"])
    ref = ConceptEraser().fit(X, sensitive_features=g)
    np.testing.assert_allclose(est.transform(X), ref.transform(X), atol=1e-9 * np.abs(X).max())
    assert est.attribute_names_ == ["g"] and est.n_features_in_ == 8
    m = dfairpca.compute_moments(X, sensitive_features=g)
    np.testing.assert_allclose(ConceptEraser("orth").fit_statistics(m).transform(X),
                               _oracle_erase(X, [g], method="orth"), atol=1e-8 * np.abs(X).max())


def test_save_and_load_round_trip_without_pickle(tmp_path):
    X, (g, h) = make_data(300, 7, (2, 3), seed=12)
    est = ConceptEraser().fit(X, sensitive_features=[g, h])
    est.save(tmp_path / "m")
    back = dfairpca.load(tmp_path / "m")
    assert type(back) is ConceptEraser and back.get_params() == est.get_params()
    np.testing.assert_array_equal(back.transform(X), est.transform(X))
    assert back.fairness_violation_ == est.fairness_violation_
    assert [list(c) for c in back.groups_] == [list(c) for c in est.groups_]
    # a model whose erasure was edited so that it keeps a group's mean difference is refused
    arrays = dict(np.load(tmp_path / "m" / "arrays.npz"))
    arrays["proj_left_"] = arrays["proj_left_"] * 0.5
    np.savez(tmp_path / "m" / "arrays.npz", **arrays)
    with pytest.raises(SavedFileError, match="does not erase them"):
        dfairpca.load(tmp_path / "m")


@pytest.mark.parametrize("case", ["constant and duplicated features", "d > n"])
def test_rank_deficient_covariance_uses_its_support(case):
    rng = np.random.default_rng(13)
    if case == "d > n":
        X, (g,) = make_data(30, 50, (2,), seed=13)
    else:
        X, (g,) = make_data(400, 6, (3,), seed=13)
        X = np.column_stack([X, np.full(400, 7.0), X[:, 0] + X[:, 1], rng.normal(size=400)])
    est = ConceptEraser().fit(X, sensitive_features=g)
    rank = np.linalg.matrix_rank(np.cov(X.T))
    assert est.support_rank_ == rank < X.shape[1]
    Y = est.transform(X)
    assert _cross_covariance(Y, [g]) < 1e-10 and est.fairness_violation_ < 1e-10
    np.testing.assert_allclose(Y, _oracle_erase(X, [g]), rtol=0, atol=1e-8 * np.abs(X).max())
    if case != "d > n":
        np.testing.assert_allclose(Y[:, 6], 7.0)  # a constant feature is left as it is


def test_a_support_too_small_for_the_concept_is_refused_naming_the_fix():
    X, (g,) = make_data(500, 8, (2,), seed=14, decay=0.5)
    with pytest.raises(ValueError, match="could not satisfy its fairness constraint: the erased "
                                         "output keeps .* a smaller rtol"):
        ConceptEraser(rtol=0.5).fit(X, sensitive_features=g)


def test_inverse_transform_is_not_offered_and_says_why():
    X, (g,) = make_data(100, 4, (2,), seed=15)
    est = ConceptEraser().fit(X, sensitive_features=g)
    assert not hasattr(est, "inverse_transform")
    with pytest.raises(AttributeError, match="erasure is not invertible"):
        est.inverse_transform(X)


def test_errors_name_the_fix():
    X, (g,) = make_data(100, 4, (2,), seed=16)
    with pytest.raises(ValueError, match="sensitive_features="):
        ConceptEraser().fit(X)
    with pytest.raises(ValueError, match="method must be one of"):
        ConceptEraser("inlp").fit(X, sensitive_features=g)
    with pytest.raises(ValueError, match="rtol must be"):
        ConceptEraser(rtol=2.0).fit(X, sensitive_features=g)
    est = ConceptEraser().fit(X, sensitive_features=g)
    with pytest.raises(ValueError, match="X has 3 features"):
        est.transform(X[:, :3])
    bad = X.copy()
    bad[7, 2] = np.nan
    with pytest.raises(ValueError, match=r"NaN or infinity in 1 row\(s\) \(rows 7\)"):
        est.transform(da.from_array(bad, chunks=(50, 4))).compute()


@pytest.mark.parametrize("scale, offset", [(1e-150, 0.0), (1e150, 0.0), (1.0, 1e6), (1e-30, 1e-24)])
def test_erasure_is_equivariant_to_scale_and_shift(scale, offset):
    """r(cX + b) = c r(X) + b, to float64 rounding of the shifted data, over the range
    float64 holds (the statistics' exponent keeps the extremes' scatter)."""
    X, (g, h) = make_data(500, 8, (2, 3), seed=17)
    ref = ConceptEraser().fit(X, sensitive_features=[g, h]).transform(X)
    b = offset * X.std() * scale
    Xs = scale * X + b
    est = ConceptEraser().fit(Xs, sensitive_features=[g, h])
    assert est.fairness_violation_ < 1e-12 and np.all(np.isfinite(est.proj_left_))
    Y = (est.transform(Xs) - b) / scale
    np.testing.assert_allclose(Y, ref, rtol=0, atol=(1e-12 + 1e-15 * offset) * np.abs(X).max())


def test_float32_products_still_erase_and_say_so():
    X, (g,) = make_data(800, 10, (3,), seed=18)
    est = ConceptEraser(compute_dtype="float32").fit(X.astype(np.float32), sensitive_features=g)
    assert est.statistics_kernel_ == "float32" and est.rtol_ == pytest.approx(10 * np.finfo(np.float32).eps)
    Y = est.transform(X.astype(np.float32))
    assert Y.dtype == np.float32 and est.fairness_violation_ < 1e-10
    # the erasure of Sigma_XZ does not depend on Sigma's rounding: float32 output rounding only
    assert _cross_covariance(Y.astype(np.float64), [g]) < 1e-6


def test_partial_fit_equals_one_fit_on_the_union():
    X, (g, h) = make_data(900, 8, (2, 3), seed=19)
    w = np.random.default_rng(2).uniform(0.5, 2.0, 900)
    order = np.argsort(g, kind="stable")  # the first piece holds one group of g only
    X, g, h, w = X[order], g[order], h[order], w[order]
    est = ConceptEraser()
    est.partial_fit(X[:200], sensitive_features=[g[:200], h[:200]], sample_weight=w[:200])
    with pytest.raises(sklearn.exceptions.NotFittedError, match="two groups of every attribute"):
        est.transform(X)
    for s in range(200, 900, 350):
        est.partial_fit(X[s : s + 350], sensitive_features=[g[s : s + 350], h[s : s + 350]],
                        sample_weight=w[s : s + 350])
    ref = ConceptEraser().fit(X, sensitive_features=[g, h], sample_weight=w)
    np.testing.assert_allclose(est.transform(X), ref.transform(X), atol=1e-9 * np.abs(X).max())
    assert est.n_samples_seen_ == 900 and est.fairness_violation_ < 1e-12
