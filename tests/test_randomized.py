"""Matrix-free randomized (fair) PCA (dfairpca.solve._randomized) against the dense oracle and
the exact one-pass solve: subspaces, captured variance, fairness, backends and memory."""

import tracemalloc
import warnings

import dask
import dask.array as da
import numpy as np
import pytest
import scipy.linalg

import dfairpca
import oracle
from dfairpca.solve import _fairness
from dfairpca.solve._choice import choose_svd_solver, needs_dense_message
from dfairpca.solve._randomized import AUTO_RTOL, fit_randomized, resolve_iterated_power
from dfairpca.engine._thin_pass import first_moments
from dfairpca.inputs._groups import encode_groups
from dfairpca.decomposition import FairPCA


def _codes(groups, mask=None):
    g = encode_groups(list(groups), len(groups[0]), mask=mask)
    return g.codes, g.categories


def _fit(X, groups, k, **kw):
    codes, cats = (None, ()) if groups is None else _codes(groups, kw.get("mask"))
    return fit_randomized(X, k, codes=codes, categories=cats, **kw)


def _angle(A, B):
    return oracle.max_angle_deg(np.asarray(A).T, np.asarray(B).T)


def _dense_fair_optimum(X, groups, k, mask=None):
    """(captured variance of the exact fair top-k, total variance) from the dense covariance."""
    rows = slice(None) if mask is None else mask
    Xm = np.asarray(X, np.float64)[rows]
    S = np.cov(Xm.T, ddof=0) * len(Xm)
    U = oracle.fair_pca(Xm, [np.asarray(g)[rows] for g in groups], k)
    return float(np.trace(U.T @ S @ U)), S


# ----------------------------------------------------------------------------- the oracle
@pytest.mark.parametrize("groups_per_attr", [(2,), (3,), (2, 4)])
def test_fair_subspace_matches_dense_oracle(groups_per_attr):
    X, groups = oracle.make_data(3000, 40, groups_per_attr, seed=1)
    k = 6
    fit = _fit(X, groups, k, iterated_power=4, random_state=0)  # converged: the same subspace
    ref = oracle.fair_pca(X, groups, k)
    assert _angle(fit.components, ref.T) < 1e-5
    assert max(float(v.max()) for v in fit.violation) <= _fairness.FAIRNESS_TOLERANCE
    # equal group means after the projection, every group of every attribute
    Y = (X - fit.mean) @ fit.components.T
    spread = np.abs(Y).max()
    for g in groups:
        means = np.array([Y[g == c].mean(0) for c in np.unique(g)])
        assert np.abs(means - means[0]).max() < 1e-10 * spread


def test_pca_matches_dense_oracle_and_exact_variances():
    X, _ = oracle.make_data(2000, 30, seed=2)
    fit = fit_randomized(X, 5, iterated_power=4, random_state=1)
    assert _angle(fit.components, oracle.pca(X, 5).T) < 1e-5
    Xc = X - X.mean(0)
    captured = np.sum((fit.components @ (Xc.T @ Xc)) * fit.components, axis=1)
    np.testing.assert_allclose(fit.captured, captured, rtol=1e-10)
    np.testing.assert_allclose(fit.total, np.sum(Xc * Xc), rtol=1e-12)
    np.testing.assert_allclose(fit.explained_variance, captured / (len(X) - 1), rtol=1e-10)


@pytest.mark.parametrize("kw", [dict(standardize=True), dict(center=False),
                                dict(standardize=True, center=False)])
def test_options_match_the_exact_solve(kw):
    X, groups = oracle.make_data(2500, 25, (2, 3), seed=3)
    X[:, 4] *= 50.0  # scales differ: standardize matters
    k = 5
    fit = _fit(X, groups, k, iterated_power=4, random_state=0, **kw)
    exact = FairPCA(k, eigen_solver="dense", **kw).fit(X, sensitive_features=groups)
    np.testing.assert_allclose(fit.components, exact.components_, atol=1e-7)
    np.testing.assert_allclose(np.ldexp(fit.captured / (len(X) - 1), 2 * fit.exponent),
                               exact.explained_variance_, rtol=1e-9)
    np.testing.assert_allclose(fit.captured / fit.total, exact.explained_variance_ratio_, rtol=1e-9)
    if kw.get("standardize"):
        np.testing.assert_allclose(fit.scale, exact.scale_, rtol=1e-12)


def test_equal_opportunity_uses_the_positive_rows_only():
    X, groups = oracle.make_data(3000, 30, (2,), seed=4)
    y = np.random.default_rng(0).integers(0, 2, len(X))
    mask = y == 1
    fit = _fit(X, groups, 4, mask=mask, iterated_power=4, random_state=0)
    ref = oracle.fair_pca(X[mask], [groups[0][mask]], 4)
    assert _angle(fit.components, ref.T) < 1e-5
    assert fit.statistics.n == mask.sum()


def test_numeric_attribute_column_matches_the_exact_solve():
    X, groups = oracle.make_data(2500, 20, (2,), seed=5)
    Xz = np.column_stack([groups[0].astype(float), X])  # a 0/1 column: equal group means
    fit = fit_randomized(Xz, 4, numeric=np.array([0]), names=["z"], iterated_power=4,
                         random_state=0)
    exact = FairPCA(4, sensitive_feature_ids=[0], eigen_solver="dense").fit(Xz)
    np.testing.assert_allclose(fit.components, exact.components_, atol=1e-7)
    ref = oracle.fair_pca(X, groups, 4)
    assert _angle(fit.components, ref.T) < 1e-5


def test_tradeoff_also_gives_standard_pca_in_the_same_passes():
    X, groups = oracle.make_data(2000, 80, (2,), seed=6)  # 4 blocks of 15 do not fill 80
    fit = _fit(X, groups, 5, standard=True, iterated_power=3, random_state=0)
    plain = _fit(X, groups, 5, iterated_power=3, random_state=0)
    assert fit.passes == plain.passes == 5
    assert _angle(fit.standard_components, oracle.pca(X, 5).T) < 1e-5
    np.testing.assert_allclose(fit.components, plain.components, atol=1e-9)
    Xc = X - X.mean(0)
    V = fit.standard_components
    np.testing.assert_allclose(fit.standard_captured, np.sum((V @ (Xc.T @ Xc)) * V, 1), rtol=1e-10)


# ----------------------------------------------------------------------------- accuracy
def _image_like(n, d, seed=0):
    """Rows with a power-law spectrum (lambda_i ~ i^-1.2, like natural images), an offset
    and two groups whose means differ along a few of the leading directions."""
    rng = np.random.default_rng(seed)
    basis = np.linalg.qr(rng.normal(size=(d, d)))[0]
    sd = 40.0 * (np.arange(1, d + 1) ** -0.6)
    X = (rng.normal(size=(n, d)) * sd) @ basis.T + 120.0
    z = (rng.random(n) < 0.1).astype(int)
    X[z == 1] += 6.0 * basis[:, :3].sum(1)
    return X.astype(np.float32), z


def test_captured_variance_gap_on_an_image_like_spectrum():
    X, z = _image_like(6000, 500)
    k = 50
    fit = _fit(X, [z], k, random_state=0)  # iterated_power="auto", n_oversamples=10
    best, S = _dense_fair_optimum(X, [z], k)
    U = fit.components
    got = float(np.sum((U @ S) * U))
    gap = (best - got) / best
    assert gap <= 1e-4, gap
    assert got <= best * (1 + 1e-6)  # no component is more than the optimum allows
    assert max(float(v.max()) for v in fit.violation) <= _fairness.FAIRNESS_TOLERANCE
    # the history is the captured variance after every Rayleigh-Ritz step, non-decreasing
    h = np.asarray(fit.history)
    assert len(h) == fit.passes - 1 and np.all(np.diff(h) >= -1e-6 * h[-1])


def test_auto_iterated_power_stops_at_convergence_within_sklearns_count():
    X, z = _image_like(3000, 300, seed=1)
    fit = _fit(X, [z], 20, random_state=0)
    cap = resolve_iterated_power("auto", 20, 3000, 300)
    assert cap == 7  # scikit-learn's rule: 7 if k < 0.1 min(n, d), else 4
    assert resolve_iterated_power("auto", 40, 3000, 300) == 4
    assert resolve_iterated_power(2, 40, 3000, 300) == 2
    assert 2 <= fit.passes <= cap + 2
    # it stopped at the first pass whose estimate of the missing variance is below AUTO_RTOL
    assert len(fit.missing) == fit.passes - 1
    assert all(m > AUTO_RTOL for m in fit.missing[:-1])
    if fit.passes < cap + 2:
        assert fit.missing[-1] <= AUTO_RTOL
    best, S = _dense_fair_optimum(X, [z], 20)
    U = fit.components
    assert (best - float(np.sum((U @ S) * U))) / best <= fit.missing[-1]  # pessimistic
    fixed = _fit(X, [z], 20, iterated_power=1, random_state=0)
    assert fixed.passes == 3 and len(fixed.history) == 2


def test_uint8_images_match_the_exact_solve():
    """Small integers minus an integer shift are exact in float32: the first pass sums them
    without a float64 copy, and the group means are the exact fit's."""
    X, z = _image_like(3000, 120, seed=2)
    X = np.clip(X, 0, 255).astype(np.uint8)
    fit = _fit(X, [z], 10, random_state=0)
    exact = FairPCA(10, eigen_solver="dense").fit(X, sensitive_features=z)
    np.testing.assert_allclose(fit.statistics.group_means(0), np.array(exact.group_means_[0]),
                               rtol=1e-14)
    X64 = X.astype(np.float64)
    np.testing.assert_allclose(fit.statistics.scatter_diagonal, ((X64 - X64.mean(0)) ** 2).sum(0), rtol=1e-12)
    signed = _fit((X.astype(np.int16) - 128).astype(np.int8), [z], 10, random_state=0)
    np.testing.assert_allclose(signed.statistics.scatter_diagonal, fit.statistics.scatter_diagonal, rtol=1e-12)
    assert _angle(fit.components[:3], exact.components_[:3]) < 0.1
    S = exact.statistics_.scatter
    got, best = (np.sum((U @ S) * U) for U in (fit.components, exact.components_))
    assert (best - got) / best < 1e-4


# ----------------------------------------------------------------------------- backends
def test_numpy_dask_and_a_cluster_give_the_same_subspace(client):
    X, groups = oracle.make_data(3000, 30, (2, 3), seed=7)
    X = X.astype(np.float32)
    kw = dict(iterated_power=3, random_state=42)
    ref = _fit(X, groups, 5, **kw)
    with dask.config.set(scheduler="threads"):
        local = _fit(da.from_array(X, chunks=(257, -1)), groups, 5, **kw)
    # the active Client (two worker processes on loopback) runs the passes
    dist = _fit(da.from_array(X, chunks=(500, 10)), groups, 5, **kw)
    for other in (local, dist):
        assert other.passes == ref.passes
        assert _angle(other.components, ref.components) < 1e-4
        np.testing.assert_allclose(other.captured, ref.captured, rtol=1e-6)
        np.testing.assert_allclose(other.components, ref.components, atol=1e-5)  # signs too
    assert _angle(ref.components, oracle.fair_pca(X, groups, 5).T) < 1e-2  # float32 products


def test_same_random_state_same_components_other_state_same_subspace():
    X, groups = oracle.make_data(1500, 30, (2,), seed=8)
    a = _fit(X, groups, 4, iterated_power=4, random_state=3)
    b = _fit(X, groups, 4, iterated_power=4, random_state=3)
    c = _fit(X, groups, 4, iterated_power=4, random_state=np.random.RandomState(4))
    np.testing.assert_array_equal(a.components, b.components)
    np.testing.assert_array_equal(_fit(X, groups, 4, iterated_power=4).components,
                                  _fit(X, groups, 4, iterated_power=4, random_state=0).components)
    np.testing.assert_allclose(a.components, c.components, atol=1e-7)  # signs fixed


def test_zarr_backed_dask_input(tmp_path):
    zarr = pytest.importorskip("zarr")
    X, groups = oracle.make_data(1200, 16, (2,), seed=9)
    z = zarr.open_array(str(tmp_path / "x.zarr"), mode="w", shape=X.shape, chunks=(200, 16),
                        dtype="f8")
    z[:] = X
    with dask.config.set(scheduler="sync"):
        fit = _fit(da.from_zarr(z), groups, 3, iterated_power=4, random_state=0)
    assert _angle(fit.components, oracle.fair_pca(X, groups, 3).T) < 1e-5


def test_extreme_magnitudes_give_the_same_components():
    X, groups = oracle.make_data(1500, 20, (2,), seed=10)
    ref = _fit(X, groups, 4, random_state=0)
    for factor in (1e-170, 1e150):
        fit = _fit(X * factor, groups, 4, random_state=0)
        np.testing.assert_allclose(fit.components, ref.components, atol=1e-7)
        np.testing.assert_allclose(fit.captured / fit.total, ref.captured / ref.total, rtol=1e-9)


# ----------------------------------------------------------------------------- memory
def test_memory_never_holds_d_by_d():
    """d = 20,000: a d x d float64 matrix is 3.2 GB; the fit allocates a few d x (k + p)."""
    d, n, k = 20_000, 300, 5
    rng = np.random.default_rng(0)
    X = (rng.normal(size=(n, 40)) @ rng.normal(size=(40, d))).astype(np.float32)
    z = np.arange(n) % 2
    Xd = da.from_array(X, chunks=(100, -1))
    tracemalloc.start()
    try:
        with dask.config.set(scheduler="threads", num_workers=2):
            fit = _fit(Xd, [z], k, iterated_power=2, random_state=0)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert fit.components.shape == (k, d)
    assert peak < d * d * 8 / 40, f"peak {peak / 1e6:.0f} MB"


# ----------------------------------------------------------------------------- refusals
def test_refusals_name_the_fix():
    X, groups = oracle.make_data(200, 10, (2,), seed=11)
    with pytest.raises(ValueError, match="largest k"):
        _fit(X, groups, 10)
    with pytest.raises(ValueError, match="integer"):
        _fit(X, groups, 0.5)
    with pytest.raises(ValueError, match="iterated_power"):
        _fit(X, groups, 2, iterated_power=-1)
    with pytest.raises(ValueError, match="n_oversamples"):
        _fit(X, groups, 2, n_oversamples=0)
    bad = X.copy()
    bad[7, 3] = np.nan
    with pytest.raises(ValueError, match="NaN or infinity in 1 row.*rows 7"):
        _fit(bad, groups, 2)


def test_dense_only_variants_name_the_memory_and_the_option():
    msg = needs_dense_message("Fair PCA-S (equalize_covariance)", 116_412, 3,
                              "equalize_covariance=None (fair PCA, matrix-free)")
    assert f"{3 * 116_412**2 * 8 / 1e9:,.0f} GB" in msg and "svd_solver='full'" in msg and "equalize_covariance=None" in msg


def test_rounding_groups_warn_and_impose_nothing():
    X, _ = oracle.make_data(400, 8, seed=12)
    z = np.arange(400) % 2
    X[z == 1] = X[z == 0]  # identical halves: equal group means, exactly
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        fit = _fit(X, [z], 3, random_state=0)
    assert fit.basis.shape[1] == 0
    assert any("impose no constraint" in str(x.message) for x in w)


def test_first_moments_match_numpy():
    X, groups = oracle.make_data(900, 12, (3,), seed=13)
    codes, cats = _codes(groups)
    Xd = da.from_array(X + 1e6, chunks=(100, -1))
    with dask.config.set(scheduler="sync"):
        m, _ = first_moments(Xd, None, codes=codes, categories=cats)
    np.testing.assert_allclose(m.mean, X.mean(0) + 1e6, rtol=1e-15)
    np.testing.assert_allclose(m.scatter_diagonal, ((X - X.mean(0)) ** 2).sum(0), rtol=1e-8)
    gm = np.array([X[groups[0] == c].mean(0) for c in cats[0]])
    np.testing.assert_allclose(m.group_means(0) - 1e6, gm, atol=1e-8)
    np.testing.assert_array_equal(m.attributes[0].counts, np.bincount(groups[0]))
    assert scipy.linalg.norm(m.constraint_matrix().sum(0)) < 1e-6


# ----------------------------------------------------------------------------- the estimators
@pytest.mark.parametrize("kw", [dict(), dict(tradeoff=0.3, whiten=True), dict(standardize=True),
                                dict(constraint="equal_opportunity")])
def test_fairpca_randomized_is_the_exact_fit(kw):
    X, groups = oracle.make_data(2000, 60, (2, 3), seed=14)
    y = np.random.default_rng(1).integers(0, 2, len(X))
    args = dict(sensitive_features=groups)
    exact = FairPCA(5, **kw).fit(X, y, **args)
    est = FairPCA(5, svd_solver="randomized", iterated_power=5, random_state=0, **kw).fit(X, y, **args)
    assert est.fitted_svd_solver_ == "randomized" and exact.fitted_svd_solver_ == "covariance_eigh"
    assert est.n_passes_ <= 7
    assert est.fairness_violation_ <= _fairness.FAIRNESS_TOLERANCE
    np.testing.assert_allclose(est.components_, exact.components_, atol=1e-8)
    np.testing.assert_allclose(est.transform(X), exact.transform(X), rtol=1e-7, atol=1e-7)
    for a in ("explained_variance_", "explained_variance_ratio_", "singular_values_",
              "noise_variance_", "mean_", "max_components_", "n_constraints_",
              "n_samples_seen_", "n_features_in_"):
        np.testing.assert_allclose(getattr(est, a), getattr(exact, a), rtol=1e-9, err_msg=a)
    for a, b in zip(est.group_means_, exact.group_means_):
        np.testing.assert_allclose(a, b, rtol=1e-12)
    if kw.get("tradeoff"):
        np.testing.assert_allclose(est.standard_components_, exact.standard_components_, atol=1e-8)


def test_pca_randomized_on_dask_with_a_numeric_attribute_column(client):
    X, groups = oracle.make_data(2400, 50, (2,), seed=15)
    Xz = np.column_stack([groups[0].astype(float), X])
    Xd = da.from_array(Xz, chunks=(300, -1))
    exact = FairPCA(4, sensitive_feature_ids=[0]).fit(Xz)
    est = FairPCA(4, sensitive_feature_ids=[0], svd_solver="randomized", iterated_power=5,
                  random_state=0).fit(Xd)
    np.testing.assert_allclose(est.components_, exact.components_, atol=1e-8)
    assert isinstance(est.transform(Xd), da.Array)
    pca = dfairpca.PCA(4, svd_solver="randomized", iterated_power=5, random_state=0).fit(
        da.from_array(X, chunks=(300, -1)))
    np.testing.assert_allclose(pca.components_, dfairpca.PCA(4).fit(X).components_, atol=1e-8)


def test_auto_chooses_by_shape_and_parameters_only():
    """The same call chooses the same solve whatever memory is free."""
    assert choose_svd_solver(6400, 50, 10) == "randomized"  # cheaper passes
    assert choose_svd_solver(6400, 400, 10) == "covariance_eigh"  # k large
    assert choose_svd_solver(500, 5, 10) == "covariance_eigh"  # d small
    X, groups = oracle.make_data(300, 20, (2,), seed=16)
    assert FairPCA(3).fit(X, sensitive_features=groups).fitted_svd_solver_ == "covariance_eigh"
    rng = np.random.default_rng(0)
    Xw = rng.normal(size=(120, 40)) @ rng.normal(size=(40, 4000))  # d = 4,000, k = 3: passes
    est = dfairpca.PCA(3, random_state=0).fit(Xw)
    assert est.fitted_svd_solver_ == "randomized"
    ref = dfairpca.PCA(3, svd_solver="full").fit(Xw)
    got, best = est.explained_variance_.sum(), ref.explained_variance_.sum()
    assert best * (1 - 1e-4) <= got <= best * (1 + 1e-9)  # iterated_power="auto": gap <= 1e-4


def test_too_little_memory_for_the_exact_fit_auto_chose_is_an_error_naming_the_fix(monkeypatch):
    """Memory never changes the choice: it is checked before the pass."""
    X = np.random.default_rng(1).normal(size=(200, 30))
    budgets = iter([1 << 40, 1000])  # plenty, then less than 4 x 8 x 30^2 bytes
    budget = lambda: next(budgets)  # noqa: E731
    monkeypatch.setattr(dfairpca.solve._choice, "memory_budget", budget)
    monkeypatch.setattr(dfairpca.decomposition._linear, "memory_budget", budget)  # its own name
    assert dfairpca.PCA(3).fit(X).fitted_svd_solver_ == "covariance_eigh"
    with pytest.raises(ValueError, match="exact fit.*0.0 GB.*svd_solver='randomized'.*svd_solver='full'"):
        dfairpca.PCA(3).fit(X)
    assert dfairpca.PCA(3, svd_solver="full").fit(X).fitted_svd_solver_ == "covariance_eigh"  # as asked
    with pytest.raises(ValueError, match="matrix-free fit cannot run.*equalize_covariance"):
        monkeypatch.setattr(dfairpca.solve._choice, "memory_budget", lambda: 1000)
        monkeypatch.setattr(dfairpca.decomposition._linear, "memory_budget", lambda: 1000)
        FairPCA(3, equalize_covariance=3).fit(X, sensitive_features=np.arange(200) % 2)



def test_estimator_refusals_name_the_fix(tmp_path):
    X, groups = oracle.make_data(300, 20, (2,), seed=17)
    z = groups[0]
    rnd = dict(svd_solver="randomized", random_state=0)
    with pytest.raises(ValueError, match="needs n_components as an int, got None"):
        FairPCA(**rnd).fit(X, sensitive_features=z)
    with pytest.raises(ValueError, match="needs n_components as an int, got 0.9"):
        dfairpca.PCA(0.9, **rnd).validate_fit(X)
    with pytest.raises(ValueError, match=r"Fair PCA-S.*3 d x d float64 matrices.*equalize_covariance=None"):
        FairPCA(3, equalize_covariance=0.5, **rnd).validate_fit(X, sensitive_features=z)
    with pytest.raises(ValueError, match="partial_fit.*svd_solver='full'"):
        FairPCA(3, **rnd).partial_fit(X, sensitive_features=z)
    est = FairPCA(3, **rnd).fit(X, sensitive_features=z)
    est.set_params(svd_solver="auto")
    with pytest.raises(ValueError, match="fitted by randomized passes.*svd_solver='full'"):
        est.partial_fit(X, sensitive_features=z)
    with pytest.raises(ValueError, match="save it without statistics=True"):
        est.save(tmp_path / "m", statistics=True)
    est.save(tmp_path / "m")
    np.testing.assert_array_equal(dfairpca.load(tmp_path / "m").transform(X), est.transform(X))


# ----------------------------------------------------------------------------- checkpoints
def _resumable_data():
    X, groups = oracle.make_data(1200, 60, (2, 3), seed=18)
    codes, cats = _codes(groups)
    return X.astype(np.float32), dict(codes=codes, categories=cats, iterated_power=3,
                                      n_oversamples=4, random_state=5)


def test_checkpoint_resumes_at_the_next_pass_and_equals_an_uninterrupted_fit(tmp_path, stop_after):
    from dfairpca.engine.checkpoint import PassInterrupted

    X, kw = _resumable_data()
    ck = tmp_path / "ck"
    with dask.config.set(scheduler="threads", num_workers=2):
        with pytest.raises(PassInterrupted, match="after 2 of 5 passes") as info:
            fit_randomized(X, 4, checkpoint=ck, on_pass=stop_after(2), **kw)
        assert info.value.chunks_done == 2 and info.value.checkpoint == ck
        resumed = stop_after(None)  # records the passes, never stops
        got = fit_randomized(X, 4, checkpoint=ck, on_pass=resumed, **kw)
        ref = fit_randomized(X, 4, checkpoint=tmp_path / "other", **kw)
    assert resumed.seen == [3, 4, 5]  # passes 1 and 2 were not read again
    assert got.passes == ref.passes == 5
    np.testing.assert_array_equal(got.components, ref.components)
    np.testing.assert_array_equal(got.captured, ref.captured)
    assert got.history == ref.history and got.missing == ref.missing
    plain = fit_randomized(X, 4, **kw)  # no checkpoint: numpy blocks, another order of sums
    np.testing.assert_allclose(got.components, plain.components, atol=1e-6)
    assert max(float(v.max()) for v in got.violation) <= _fairness.FAIRNESS_TOLERANCE


def test_a_checkpoint_resumes_only_its_own_data_and_options(tmp_path, stop_after):
    from dfairpca.engine.checkpoint import CheckpointMismatch

    X, kw = _resumable_data()
    ck = tmp_path / "ck"
    with dask.config.set(scheduler="sync"):
        with pytest.raises(KeyboardInterrupt):
            fit_randomized(X, 4, checkpoint=ck, on_pass=stop_after(1), **kw)
        before = (ck / "progress.json").read_text()
        other = X.copy()
        other[700, 3] += 1.0
        # the resumed pass reads the data and refuses it before using what it read
        with pytest.raises(CheckpointMismatch, match=r"different data: rows \d+-\d+ differ"):
            fit_randomized(other, 4, checkpoint=ck, **kw)
        with pytest.raises(CheckpointMismatch, match="k 4 in the checkpoint but 5 now"):
            fit_randomized(X, 5, checkpoint=ck, **kw)
        with pytest.raises(CheckpointMismatch, match="start_block"):
            fit_randomized(X, 4, checkpoint=ck, **{**kw, "random_state": 6})
        assert (ck / "progress.json").read_text() == before  # nothing saved over it
        # the exact pass names the solve that wrote it
        with pytest.raises(CheckpointMismatch, match="randomized fit.*svd_solver='randomized'"):
            FairPCA(4, svd_solver="full").fit(X, sensitive_features=kw["categories"][0][kw["codes"][:, 0]],
                                              checkpoint=ck)
        done = fit_randomized(X, 4, checkpoint=ck, resume=False, **kw)  # starts over
        # a finished checkpoint has no pass left to run: it still reads X to bind it
        with pytest.raises(CheckpointMismatch, match="different data"):
            fit_randomized(other, 4, checkpoint=ck, **kw)
        quiet = stop_after(None)
        again = fit_randomized(X, 4, checkpoint=ck, on_pass=quiet, **kw)
    assert quiet.seen == []  # no product pass: the saved state is the answer
    np.testing.assert_array_equal(again.components, done.components)
    assert again.passes == done.passes


def test_estimators_resume_a_randomized_checkpoint(tmp_path, stop_after):
    X, kw = _resumable_data()
    z = kw["categories"][0][kw["codes"][:, 0]]
    ck = tmp_path / "ck"
    est = dict(svd_solver="randomized", iterated_power=3, n_oversamples=4, random_state=5)
    with dask.config.set(scheduler="sync"):
        with pytest.raises(KeyboardInterrupt):  # an interrupted fit of the same job
            fit_randomized(X, 4, codes=kw["codes"][:, :1], categories=kw["categories"][:1],
                           names=["z"], checkpoint=ck, on_pass=stop_after(2),
                           **{k: v for k, v in kw.items() if k not in ("codes", "categories")})
        assert "randomized" in (ck / "progress.json").read_text()
        # "auto" goes on with the solve the checkpoint holds (not its own choice at d = 60)
        got = FairPCA(4, **{**est, "svd_solver": "auto"}).fit(X, sensitive_features=z, checkpoint=ck)
        ref = FairPCA(4, **est).fit(X, sensitive_features=z)
    assert got.fitted_svd_solver_ == "randomized" and got.n_passes_ == 5
    assert not ck.exists()  # deleted after a successful fit, as the exact fit's
    np.testing.assert_allclose(got.components_, ref.components_, atol=1e-6)
    pca = dfairpca.PCA(4, **est).fit(X, checkpoint=ck, keep_checkpoint=True)
    assert pca.fitted_svd_solver_ == "randomized" and (ck / "state.npz").is_file()


def test_the_exact_pass_on_workers_with_many_threads_and_little_memory_is_refused():
    """Each worker thread folds into its own d x d sum: a worker whose threads' sums exceed
    half its memory limit would be restarted mid-pass (a pass that then never ends)."""
    from dfairpca.solve._choice import check_exact_memory

    small = [("tcp://10.0.0.1:1", 16, 500_000_000)]
    with pytest.raises(ValueError, match="16 threads.*tcp://10.0.0.1:1.*svd_solver='randomized'"):
        check_exact_memory(2500, 1 << 40, "pass svd_solver='randomized'", workers=small)
    check_exact_memory(100, 1 << 40, "-", workers=small)  # 16 x 12 x 100^2 bytes: fits
    check_exact_memory(2500, 1 << 40, "-", workers=[("tcp://x:1", 16, 0)])  # no limit: not checked


def test_planned_svd_solver_is_the_solve_the_fit_runs():
    """What an application asks before the pass (the CLI's note on unused randomized
    options) is what the fit then runs: auto takes the randomized solve for a wide X and a
    small k, the exact one otherwise; Fair PCA-S is always exact."""
    rng = np.random.default_rng(3)
    wide, narrow = rng.normal(size=(120, 6400)), rng.normal(size=(120, 40))
    for est, X in ((dfairpca.PCA(10), wide), (dfairpca.PCA(10), narrow),
                   (dfairpca.PCA(10, svd_solver="full"), narrow)):
        planned = est.planned_svd_solver(X.shape[1])
        assert planned == est.fit(X).fitted_svd_solver_, (est, X.shape)
    assert dfairpca.PCA(10).planned_svd_solver(6400) == "randomized"
    assert dfairpca.PCA(10).planned_svd_solver(40) == "covariance_eigh"
    assert dfairpca.FairPCA(10, equalize_covariance=0.5).planned_svd_solver(6400) == "covariance_eigh"


def test_exact_and_matrix_free_fair_solves_end_in_one_certified_solution(monkeypatch):
    """Both fair solves return a FairSolution that the estimator only maps: the same
    fields (certificate per attribute, constraint basis, group means, the largest k), equal
    to the fitted attributes, and each refuses a failing certificate before it returns."""
    from dfairpca.solve._solution import FairSolution, exact_fair_solution, randomized_fair_solution

    X, groups = oracle.make_data(400, 12, (3,), seed=4)
    est = FairPCA(3, svd_solver="full", eigen_solver="dense").fit(X, sensitive_features=groups[0])
    kw = dict(k=3, center=True, standardize=False, equalize=None, eigen_solver="dense",
              tradeoff=0.0, estimator="FairPCA")
    exact = exact_fair_solution(est.statistics_, np.zeros(0, np.intp), ["z"], est.max_components_, **kw)
    fit = _fit(X, groups, 3, iterated_power=6, random_state=0)
    matrix_free = randomized_fair_solution(fit, ["z"], est.max_components_, np.arange(12),
                                           estimator="FairPCA")
    for sol in (exact, matrix_free):
        assert isinstance(sol, FairSolution)
        assert sol.components.shape == (3, 12) and sol.basis.shape == (12, 2)
        assert len(sol.violations) == 1 and max(v.max() for v in sol.violations) < 1e-12
        assert sol.max_components == 12 - 3 + 1 and sol.names == ["z"]
        np.testing.assert_allclose(sol.group_means[0], est.group_means_[0], rtol=1e-10, atol=1e-12)
    assert (exact.solver, matrix_free.solver) == ("covariance_eigh", "randomized")
    np.testing.assert_array_equal(exact.components, est.components_)
    np.testing.assert_array_equal(exact.basis, est.constraint_basis_)
    assert _angle(matrix_free.components, exact.components) < 1e-3
    monkeypatch.setattr(_fairness, "FAIRNESS_TOLERANCE", -1.0)
    with pytest.raises(ValueError, match="fair"):
        exact_fair_solution(est.statistics_, np.zeros(0, np.intp), ["z"], est.max_components_, **kw)
    with pytest.raises(ValueError, match="fair"):
        randomized_fair_solution(fit, ["z"], est.max_components_, np.arange(12), estimator="FairPCA")


def test_an_edited_saved_state_is_refused_naming_the_checkpoint(tmp_path, stop_after):
    """The randomized fit's state carries a digest, as the exact pass's total does."""
    from dfairpca.engine.checkpoint import CheckpointMismatch

    X, kw = _resumable_data()
    ck = tmp_path / "ck"
    with dask.config.set(scheduler="sync"):
        with pytest.raises(KeyboardInterrupt):
            fit_randomized(X, 4, checkpoint=ck, on_pass=stop_after(2), **kw)
        npz = ck / "state.npz"
        with np.load(npz, allow_pickle=False) as f:
            arrays = {k: f[k] for k in f.files}
        name = next(k for k, v in arrays.items() if v.dtype.kind == "f" and v.size > 1)
        arrays[name] = arrays[name] * 1.3
        np.savez(npz, **arrays)
        with pytest.raises(CheckpointMismatch, match=rf"checkpoint '{ck}': its saved state \(state.npz\) "
                                                     r"does not match the digest.*to start over"):
            fit_randomized(X, 4, checkpoint=ck, **kw)
