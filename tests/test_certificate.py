"""Every fair fit is certified: the share of each group's mean deviation its components keep,
measured in float64 after the solve; a group is dropped only below float64 rounding, and
never silently; n < k is an error before the pass."""

import warnings

import dask
import dask.array as da
import numpy as np
import pytest

import dfairpca
import dfairpca.solve._kernels as kernels
from dfairpca.solve._fairness import constraint_violation
from dfairpca.solve._fairness import certify, constraint_of
from dfairpca.decomposition.kernel import FairKernelPCA
from dfairpca.stats.moments import Moments
from oracle import make_data, max_angle_deg


def projected_gap(U, X, z, g0, g1):
    """|U (mean_g1 - mean_g0)| / |mean_g1 - mean_g0| over the rows of X (float64)."""
    X = np.asarray(X, np.float64)
    gap = X[z == g1].mean(0) - X[z == g0].mean(0)
    return np.linalg.norm(U @ gap) / np.linalg.norm(gap)


# ----------------------------------------------------------------------------- issue 10, item 2
def test_float32_input_with_offset_keeps_its_constraint():
    """The group sums are float64: a 0.1 gap on a 1e4 offset is signal, not float32 noise."""
    rng = np.random.default_rng(3)
    X = rng.normal(size=(10000, 50)) + 1e4
    z = rng.integers(0, 2, 10000)
    X[z == 1] += 0.1
    X32 = X.astype(np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing dropped, nothing to warn about
        m = dfairpca.FairPCA(8).fit(X32, sensitive_features=z)
        m64 = dfairpca.FairPCA(8, compute_dtype="float64").fit(X32, sensitive_features=z)
    assert m.n_constraints_ == 1
    assert projected_gap(m.components_, X32, z, 0, 1) < 1e-12  # was 0.85 of the gap
    assert m.fairness_violation_ < 1e-12
    # the float32 products cost variance-optimality only at their precision
    assert max_angle_deg(m.components_.T, m64.components_.T) < 0.05


def test_group_with_the_overall_mean_is_dropped_with_a_warning():
    """Integer data: group 'c' has exactly the overall mean, so it constrains nothing."""
    rng = np.random.default_rng(0)
    base = rng.integers(-50, 50, size=(200, 6)).astype(np.float64)
    v = rng.integers(-5, 5, size=6).astype(np.float64)
    X = np.concatenate([base, base + 2 * v, base + v])
    z = np.repeat(np.array(["a", "b", "c"]), 200)
    with pytest.warns(UserWarning, match=r"group c of groups: .*float64 rounding") as rec:
        m = dfairpca.FairPCA(3).fit(X, sensitive_features=z)
    assert len(rec) == 1
    assert m.n_constraints_ == 1  # a - b (and so b - c) still removed
    assert m.fairness_violation_ < 1e-12
    assert projected_gap(m.components_, X, z, "a", "b") < 1e-12


def test_a_gap_just_above_float64_rounding_is_kept():
    """The floor is float64's: a deviation of 1e-9 of the data's size is still a constraint."""
    X, (z,) = make_data(400, 6, (2,), seed=4, shift=0.0)
    X[z == 1] += 1e-9 * np.abs(X).max() * np.eye(6)[0]
    m = dfairpca.FairPCA(3).fit(X, sensitive_features=z)
    assert m.n_constraints_ == 1
    assert m.statistics_.deviation_floor().max() < 1e-9 * np.abs(X).max() / 100


# ----------------------------------------------------------------------------- the certificate
def test_constraint_violation_is_the_share_of_each_deviation_kept():
    rng = np.random.default_rng(1)
    U = np.linalg.qr(rng.normal(size=(9, 3)))[0].T
    C = rng.normal(size=(4, 9)) * np.array([1e-170, 1.0, 1e150, 0.0])[:, None]
    got = constraint_violation(U, C)
    for i in range(3):
        v = C[i] / np.abs(C[i]).max()
        assert got[i] == pytest.approx(np.linalg.norm(U @ v) / np.linalg.norm(v), rel=1e-12)
    assert got[3] == 0.0  # no deviation, nothing to keep


def test_certify_names_the_group_and_the_fixes():
    X, (z,) = make_data(300, 6, (3,), seed=2)
    pca = dfairpca.PCA(3).fit(X)  # not fair: keeps much of every gap
    m = dfairpca.compute_moments(X, sensitive_features=z)
    per_group = [constraint_violation(pca.components_, m.constraint_matrix())]
    f32 = float(np.finfo(np.float32).eps)
    with pytest.raises(ValueError, match=r"keep .* of group .* of race .*compute_dtype='float64'"
                                         r".*standardize=True.*merge or drop group"):
        certify(per_group, ["race"], [np.array(["x", "y", "w"])], f32, "FairPCA")
    with pytest.raises(ValueError) as err:
        certify(per_group, ["race"], [np.array(["x", "y", "w"])], np.finfo(float).eps, "FairPCA")
    assert "compute_dtype" not in str(err.value)  # the products were float64 already
    fair = dfairpca.FairPCA(3).fit(X, sensitive_features=z)
    certify([constraint_violation(fair.components_, m.constraint_matrix())], ["race"],
            [np.arange(3)], f32, "FairPCA")  # passes


@pytest.mark.parametrize("kw", [
    dict(),
    dict(standardize=True),
    dict(center=False),
    dict(equalize_covariance=0.5),
    dict(tradeoff=0.5),
    dict(eigen_solver="subspace"),
])
def test_every_fair_fit_is_certified_and_saved(kw, tmp_path):
    X, (z1, z2) = make_data(500, 12, (2, 3), seed=5)
    X[:, 3] *= 1e3  # features of very different scale (what standardize is for)
    m = dfairpca.FairPCA(4, **kw).fit(X, sensitive_features=[z1, z2])
    assert 0.0 <= m.fairness_violation_ <= 1e-12
    assert m.fairness_violation_per_attribute_.shape == (2,)
    assert m.fairness_violation_ == m.fairness_violation_per_attribute_.max()
    # the certificate is in the fitted feature space: standardized rows when standardize
    Xs = X if not kw.get("standardize") else X / m.scale_
    for z in (z1, z2):
        for g in np.unique(z)[1:]:
            assert projected_gap(m.components_, Xs, z, 0, g) < 1e-11
    if kw.get("tradeoff"):  # the λ-scaled standard half is, by design, not fair
        assert projected_gap(m.standard_components_, X, z1, 0, 1) > 1e-3
    m.save(tmp_path / "m")
    back = dfairpca.load(tmp_path / "m")
    assert back.fairness_violation_ == m.fairness_violation_
    np.testing.assert_array_equal(back.fairness_violation_per_attribute_,
                                  m.fairness_violation_per_attribute_)


@pytest.mark.parametrize("edit", [
    {"fairness_violation_per_attribute_": [0.0]},  # one number for two attributes
    {"fairness_violation_": -1.0},
    {"fairness_violation_": "tiny"},
])
def test_a_tampered_certificate_is_refused_at_load(edit, tmp_path):
    import json

    X, (z1, z2) = make_data(200, 6, (2, 2), seed=5)
    dfairpca.FairPCA(2).fit(X, sensitive_features=[z1, z2]).save(tmp_path / "m")
    meta_path = tmp_path / "m" / "meta.json"
    meta = json.loads(meta_path.read_text())
    meta.update(edit)
    meta_path.write_text(json.dumps(meta))
    with pytest.raises(dfairpca.io.SavedFileError, match="fairness_violation_"):
        dfairpca.load(tmp_path / "m")


def test_equal_opportunity_is_certified_on_the_positive_rows():
    X, (z,) = make_data(600, 8, (2,), seed=6)
    y = np.random.default_rng(6).integers(0, 2, 600)
    X[(z == 1) & (y == 0)] += 3.0  # a gap among the y == 0 rows only
    m = dfairpca.FairPCA(3, constraint="equal_opportunity").fit(X, y, sensitive_features=z)
    assert m.fairness_violation_ <= 1e-12
    assert projected_gap(m.components_, X[y == 1], z[y == 1], 0, 1) < 1e-11
    assert projected_gap(m.components_, X[y == 0], z[y == 0], 0, 1) > 1e-3


def test_fit_statistics_certifies_partial_fits():
    X, (z,) = make_data(400, 7, (3,), seed=7)
    est = dfairpca.FairPCA(3)
    for s in range(0, 400, 100):
        est.partial_fit(X[s : s + 100], sensitive_features=z[s : s + 100])
    assert est.fairness_violation_ <= 1e-12
    assert projected_gap(est.components_, X, z, 0, 2) < 1e-11


# ----------------------------------------------------------------------------- kernel
def dense_centred_rbf(X, gamma):
    sq = ((X[:, None, :] - X[None, :, :]) ** 2).sum(-1)
    K = np.exp(-gamma * sq)
    H = np.eye(len(X)) - 1.0 / len(X)
    return H @ K @ H


def test_exact_kernel_certificate_is_the_feature_space_share():
    """The exact method's certificate, ``|B^T Kc z_g| / sqrt(z_g^T Kc z_g)``, is the share of
    the group's feature-space mean deviation the components keep: checked densely on the
    standard (unfair) half of a tradeoff=1 fit, where it is large."""
    X, (z,) = make_data(150, 4, (3,), seed=8)
    m = FairKernelPCA(3, tradeoff=1.0).fit(X, sensitive_features=z)
    assert m.fairness_violation_ <= 1e-10
    Kc = dense_centred_rbf(X, m.gamma_)
    Y = m.transform(X)  # training representation: Kc B (fair), Kc B_std (standard)
    dp = constraint_of("demographic_parity")
    Z = dp.kernel_indicators(z[:, None], [np.arange(3)], np.zeros((len(z), 0)), [])
    _, _, columns = dp.kernel_rows(Kc, Z, [np.arange(3)], ["z"])
    for half, coef in ((slice(0, 3), m.dual_coef_[:, :3]), (slice(3, 6), m.dual_coef_[:, 3:])):
        got = kernels.exact_violations(coef, columns)[0]
        for g in range(3):
            zg = (z == g) - np.mean(z == g)
            dense = (np.linalg.norm(Y[z == g, half].mean(0) - Y[:, half].mean(0))
                     / (np.sqrt(zg @ Kc @ zg) / np.sum(z == g)))
            assert got[g] == pytest.approx(dense, rel=1e-6, abs=1e-9)
    assert got.max() > 1e-3  # the standard half keeps part of the gaps


@pytest.mark.parametrize("kw", [dict(), dict(n_landmarks=80), dict(tradeoff=0.3)])
def test_kernel_fits_are_certified_and_saved(kw, tmp_path):
    X, (z1, z2) = make_data(200, 5, (2, 2), seed=9)
    m = FairKernelPCA(3, **kw).fit(X, sensitive_features=[z1, z2])
    assert 0.0 <= m.fairness_violation_ <= 1e-10
    assert m.fairness_violation_per_attribute_.shape == (2,)
    m.save(tmp_path / "k")
    back = dfairpca.load(tmp_path / "k")
    assert back.fairness_violation_ == m.fairness_violation_
    np.testing.assert_array_equal(back.fairness_violation_per_attribute_,
                                  m.fairness_violation_per_attribute_)


# ----------------------------------------------------------------------------- n < k
def exploding(n, d):
    """A Dask array of known shape whose every chunk raises when computed."""
    def boom():
        raise AssertionError("the pass ran before n < k was checked")
    return da.from_delayed(dask.delayed(boom)(), shape=(n, d), dtype=np.float64)


def test_fewer_rows_than_components_is_an_error_before_the_pass():
    X = np.random.default_rng(0).normal(size=(5, 10))
    with pytest.raises(ValueError, match=r"n_components=6 .* 5 rows.* largest k is 5"):
        dfairpca.PCA(6).fit(X)
    with pytest.raises(ValueError, match=r"n_components=6 .* 5 rows.* largest k is 5"):
        dfairpca.PCA(6).fit(exploding(5, 10))
    z = np.array([0, 1, 0, 1, 0])
    with pytest.raises(ValueError, match=r"n_components=6 .* 5 rows.* largest k is 5"):
        dfairpca.FairPCA(6).fit(exploding(5, 10), sensitive_features=z)
    y = np.array([1, 1, 1, 0, 0])
    with pytest.raises(ValueError, match=r"n_components=4 .* 3 rows with y == 1.* largest k is 3"):
        dfairpca.FairPCA(4, constraint="equal_opportunity").fit(exploding(5, 10), y,
                                                                 sensitive_features=z)
    stats = Moments.from_chunk(X, z[:, None], [np.arange(2)])
    with pytest.raises(ValueError, match=r"n_components=6 .* 5 rows"):
        dfairpca.FairPCA(6).fit_statistics(stats)


def test_partial_fit_waits_for_k_rows():
    X, (z,) = make_data(40, 8, (2,), seed=3)
    est = dfairpca.FairPCA(5)
    est.partial_fit(X[:4], sensitive_features=z[:4])
    assert not hasattr(est, "components_") and est.n_samples_seen_ == 4
    est.partial_fit(X[4:], sensitive_features=z[4:])
    full = dfairpca.FairPCA(5).fit(X, sensitive_features=z)
    assert max_angle_deg(est.components_.T, full.components_.T) < 1e-6
    pca = dfairpca.PCA(5)
    pca.partial_fit(X[:3])
    assert not hasattr(pca, "components_")
    pca.partial_fit(X[3:])
    assert pca.components_.shape == (5, 8)


# ----------------------------------------------------------------------------- issue 10, item 6
@pytest.fixture
def item6_data(two_groups):
    return two_groups(2000, 20, shift=0.3, spread=True)


@pytest.mark.parametrize("kw", [dict(), dict(equalize_covariance=0.5)])
def test_small_magnitude_data_is_solved_as_the_original(kw, item6_data):
    X, z = item6_data
    ref = dfairpca.FairPCA(5, **kw).fit(X, sensitive_features=z)
    for c in (1e-10, 1e-150, 1e150):
        m = dfairpca.FairPCA(5, **kw).fit(X * c, sensitive_features=z)
        assert max_angle_deg(m.components_.T, ref.components_.T) < 1e-8  # was 75-89 deg
        np.testing.assert_allclose(m.explained_variance_ratio_, ref.explained_variance_ratio_, rtol=1e-9)


@pytest.mark.parametrize("c", [1e-170, 1e170])
def test_pca_beyond_float64_squares(c, item6_data):
    """X^T X of 1e-170 data underflows float64: the statistics carry a power-of-two exponent."""
    X, _ = item6_data
    ref = dfairpca.PCA(3).fit(X)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no RuntimeWarning either
        m = dfairpca.PCA(3).fit(X * c)
    assert max_angle_deg(m.components_.T, ref.components_.T) < 1e-8
    np.testing.assert_allclose(m.explained_variance_ratio_, ref.explained_variance_ratio_, rtol=1e-10)
    assert np.all(np.isfinite(m.explained_variance_ratio_))
    assert m.statistics_.scatter_exponent != 0


def test_values_whose_sums_overflow_are_an_error(item6_data):
    X, _ = item6_data
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # numpy's own overflow notice
        with pytest.raises(ValueError, match="too large for float64 sums.*divide X"):
            dfairpca.PCA(3).fit(X * 1e306)


def test_rbf_gamma_scale_beyond_float64_is_an_error(item6_data):
    """gamma="scale" is 1 / (d Var): the variance of 1e-170s is 1e-340, which float64 cannot
    hold; the fit says so instead of using gamma = 1 on a kernel of ones."""
    X, z = item6_data
    with pytest.raises(ValueError, match="too far from 1 for gamma='scale'.*underflows"):
        FairKernelPCA(3).fit(X[:200] * 1e-170, sensitive_features=z[:200])


@pytest.mark.parametrize("standardize", [False, True])
def test_a_huge_constant_feature_does_not_hide_a_real_gap(standardize, two_groups):
    """The rounding floor of a deviation is per feature: a constant column of 1.7e18 (a
    timestamp in ns) once raised it above a real 0.3 sd gap, the constraint was dropped
    and the certificate read 0.0."""
    X, z = two_groups(4000, 10, shift=0.3)
    X[:, 0] = 1.7e18
    est = dfairpca.FairPCA(3, standardize=standardize).fit(X, sensitive_features=z)
    Y = est.transform(X)
    assert est.n_constraints_ == 1 and est.fairness_violation_ < 1e-12
    assert np.abs(Y[z == 0].mean(0) - Y[z == 1].mean(0)).max() < 1e-10


def test_standardize_leaves_a_feature_constant_to_rounding_unscaled(two_groups):
    """A column whose rows differ only by rounding (0.3 and 0.1 + 0.2) has a variance of
    rounding size, possibly negative: it is constant, not divided by noise (was NaN)."""
    X, z = two_groups(1000, 6, seed=1, shift=0.5)
    X[:, 0] = 0.3
    X[::2, 0] = 0.1 + 0.2
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        pca = dfairpca.PCA(3, standardize=True).fit(X)
        fair = dfairpca.FairPCA(3, standardize=True).fit(X, sensitive_features=z)
    assert pca.scale_[0] == 1.0 and np.all(np.isfinite(pca.components_))
    assert fair.fairness_violation_ < 1e-12


def test_a_saved_model_edited_to_be_unfair_is_refused_at_load(tmp_path, two_groups):
    """The stored certificate is not trusted: load recomputes what the components keep of
    the saved group-mean differences (a reviewer swapped in PCA's components and an empty
    constraint basis, and the model loaded with its old certificate)."""
    import json

    X, z = two_groups(800, 8, shift=1.0)
    path = tmp_path / "m"
    dfairpca.FairPCA(3).fit(X, sensitive_features=z).save(path)
    arrays = dict(np.load(path / "arrays.npz"))
    arrays["components_"] = dfairpca.PCA(3).fit(X).components_
    arrays["constraint_basis_"] = np.zeros((8, 0))
    np.savez(path / "arrays.npz", **arrays)
    meta = json.loads((path / "meta.json").read_text())
    meta["n_constraints_"] = 0
    (path / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match="keep 9.*the model is not fair"):
        dfairpca.load(path)
    dfairpca.FairPCA(3).fit(X, sensitive_features=z).save(tmp_path / "m2")
    meta = json.loads((tmp_path / "m2" / "meta.json").read_text())
    meta["fairness_violation_"] = 0.5
    meta["fairness_violation_per_attribute_"] = [0.5]
    (tmp_path / "m2" / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match="above the tolerance"):
        dfairpca.load(tmp_path / "m2")
