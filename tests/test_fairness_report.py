"""``dfairpca.metrics.fairness_report`` and the test of equal group means under it: figures
against dense numpy, the test's level under random labels, chunked input, the CLI."""

import json
import warnings

import dask.array as da
import numpy as np
import pandas as pd
import pytest
from scipy import stats

import dfairpca
from dfairpca.errors import DfairpcaWarning
from dfairpca.metrics import fairness_report, group_reconstruction_error
from dfairpca.stats.equal_means import group_mean_test
from dfairpca.stats.moments import Moments
from oracle import make_data


def _moments(Y, z):
    cats, codes = np.unique(z, return_inverse=True)
    return Moments.from_chunk(Y, codes.reshape(-1, 1), [cats])


def _dense_gap(Y, z):
    """The largest |group mean - mean| / sd over groups and components, as numpy has it."""
    sd = Y.std(axis=0)
    return max(np.max(np.abs(Y[z == g].mean(0) - Y.mean(0)) / sd) for g in np.unique(z))


def _dense_wilks_p(Y, z):
    """Wilks' lambda from the groups' own scatters, and Rao's F, written out densely."""
    n, p = Y.shape
    cats = np.unique(z)
    q = len(cats) - 1
    Yc = Y - Y.mean(0)
    T = Yc.T @ Yc
    W = sum((Y[z == g] - Y[z == g].mean(0)).T @ (Y[z == g] - Y[z == g].mean(0)) for g in cats)
    lam = np.exp(np.linalg.slogdet(W)[1] - np.linalg.slogdet(T)[1])
    t = np.sqrt((p**2 * q**2 - 4) / (p**2 + q**2 - 5)) if p**2 + q**2 - 5 > 0 else 1.0
    df1 = p * q
    df2 = (n - 1 - (p + q + 1) / 2) * t - (p * q - 2) / 2
    F = (1 - lam ** (1 / t)) / lam ** (1 / t) * df2 / df1
    return stats.f.sf(F, df1, df2)


def _hotelling_p(Y, z):
    """Two-sample Hotelling T² with its exact F distribution."""
    a, b = Y[z == 0], Y[z == 1]
    n1, n2, p = len(a), len(b), Y.shape[1]
    S = ((n1 - 1) * np.atleast_2d(np.cov(a.T)) + (n2 - 1) * np.atleast_2d(np.cov(b.T))) / (n1 + n2 - 2)
    diff = a.mean(0) - b.mean(0)
    t2 = n1 * n2 / (n1 + n2) * diff @ np.linalg.solve(S, diff)
    F = (n1 + n2 - p - 1) / (p * (n1 + n2 - 2)) * t2
    return stats.f.sf(F, p, n1 + n2 - p - 1)


# ----------------------------------------------------------------------------- the test
@pytest.mark.parametrize("p", [1, 2, 5])
def test_two_groups_is_hotellings_t2(p):
    rng = np.random.default_rng(p)
    z = rng.integers(0, 2, 120)
    Y = rng.normal(size=(120, p)) + 0.3 * z[:, None]
    res = group_mean_test(_moments(Y, z))
    assert res.p_value == pytest.approx(_hotelling_p(Y, z), rel=1e-8)
    assert res.df1 == p and res.df2 == 120 - p - 1
    assert res.max_mean_gap_sd == pytest.approx(_dense_gap(Y, z), rel=1e-12)


@pytest.mark.parametrize("m, p", [(3, 1), (3, 4), (5, 3)])
def test_more_groups_is_wilks_with_raos_f(m, p):
    rng = np.random.default_rng(10 * m + p)
    z = rng.integers(0, m, 200)
    Y = rng.normal(size=(200, p)) + 0.2 * (z[:, None] == 1)
    res = group_mean_test(_moments(Y, z))
    assert res.groups == m
    assert res.p_value == pytest.approx(_dense_wilks_p(Y, z), rel=1e-8)
    if p == 1:  # one component: the one-way ANOVA F test
        assert res.p_value == pytest.approx(stats.f_oneway(*[Y[z == g, 0] for g in range(m)]).pvalue, rel=1e-8)


@pytest.mark.parametrize("m, draw", [(2, "normal"), (3, "exponential")])
def test_p_values_are_uniform_under_random_labels(m, draw):
    """Labels independent of Y: p < 0.05 in 5% of 400 trials (a 3.5-sigma binomial band),
    also for skewed data, and p < 0.5 in half of them."""
    rng = np.random.default_rng(m)
    trials, level = 400, 0.05
    pvalues = []
    for _ in range(trials):
        Y = getattr(rng, draw)(size=(150, 4)) @ rng.normal(size=(4, 4))
        pvalues.append(group_mean_test(_moments(Y, rng.integers(0, m, 150))).p_value)
    pvalues = np.asarray(pvalues)
    band = 3.5 * np.sqrt(level * (1 - level) / trials)
    assert abs(np.mean(pvalues < level) - level) < band
    assert abs(np.mean(pvalues < 0.5) - 0.5) < 3.5 * np.sqrt(0.25 / trials)


def test_constant_components_are_left_out():
    rng = np.random.default_rng(4)
    z = rng.integers(0, 2, 100)
    Y = rng.normal(size=(100, 3)) + 0.4 * z[:, None]
    # a constant component and a copy of another add no direction: the same test
    padded = np.column_stack([Y, np.full(100, 7.0), Y[:, 0]])
    a, b = group_mean_test(_moments(Y, z)), group_mean_test(_moments(padded, z))
    assert b.dimension == 3
    assert b.p_value == pytest.approx(a.p_value, rel=1e-8)
    assert b.max_mean_gap_sd == pytest.approx(a.max_mean_gap_sd, rel=1e-12)


def test_nothing_to_test_is_nan_with_the_reason():
    rng = np.random.default_rng(5)
    one = group_mean_test(_moments(rng.normal(size=(50, 3)), np.zeros(50)))
    assert one.groups == 1 and np.isnan(one.p_value) and "1 group present" in one.note
    assert one.max_mean_gap_sd == 0
    flat = group_mean_test(_moments(np.ones((50, 2)), np.arange(50) % 2))
    assert np.isnan(flat.p_value) and "constant" in flat.note
    few = group_mean_test(_moments(rng.normal(size=(6, 5)), np.arange(6) % 2))
    assert np.isnan(few.p_value) and "too few" in few.note


# ----------------------------------------------------------------------------- the report
@pytest.fixture(scope="module")
def faces():
    """Two groups that differ in the leading directions; the first 1,500 rows fit."""
    X, g = make_data(2500, 20, (2, 3), seed=7, shift=1.5)
    return X, g[0], g[1]


def test_fair_pca_on_its_training_rows_and_pca_against_numpy(faces):
    X, z, _ = faces
    tr = slice(0, 1500)
    fair = dfairpca.FairPCA(4).fit(X[tr], sensitive_features=z[tr])
    pca = dfairpca.PCA(4).fit(X[tr])
    rep = fairness_report(fair, X[tr], z[tr], baseline=pca, random_state=0)
    assert list(rep.columns) == ["groups", "max_mean_gap_sd", "p_value", "linear_probe_auc",
                                 "probe_rows", "baseline_max_mean_gap_sd", "baseline_p_value",
                                 "baseline_linear_probe_auc"]
    row = rep.iloc[0]
    assert row.groups == 2 and row.probe_rows == 1500
    assert row.max_mean_gap_sd <= 1e-8 and row.p_value > 0.5
    assert row.linear_probe_auc < 0.6
    Y = pca.transform(X[tr])
    assert row.baseline_max_mean_gap_sd == pytest.approx(_dense_gap(Y, z[tr]), rel=1e-10)
    assert row.baseline_p_value < 1e-10 and row.baseline_linear_probe_auc > 0.8
    # PCA alone: its own columns carry the same figures
    alone = fairness_report(pca, X[tr], z[tr], random_state=0).iloc[0]
    assert alone.max_mean_gap_sd == row.baseline_max_mean_gap_sd
    assert alone.linear_probe_auc == row.baseline_linear_probe_auc
    # held out: a gap, small, of the order of the noise (the test need not reject)
    held = fairness_report(fair, X[1500:], z[1500:], random_state=0).iloc[0]
    assert 1e-6 < held.max_mean_gap_sd < 0.2
    assert held.max_mean_gap_sd == pytest.approx(_dense_gap(fair.transform(X[1500:]), z[1500:]), rel=1e-10)


def test_dask_input_gives_numpys_figures(faces):
    X, z, z3 = faces
    fair = dfairpca.FairPCA(4).fit(X, sensitive_features=np.column_stack([z, z3]))
    sf = pd.DataFrame({"sex": z, "age": z3})
    kw = dict(baseline=dfairpca.PCA(4).fit(X), random_state=3, max_probe_rows=700)
    dense = fairness_report(fair, X, sf, **kw)
    lazy = fairness_report(fair, da.from_array(X, chunks=(333, 20)), sf, **kw)
    assert (dense.probe_rows == 700).all()
    pd.testing.assert_frame_equal(lazy, dense, rtol=1e-9)
    # another sample, another AUC: the seed is used
    other = fairness_report(fair, X, sf, **{**kw, "random_state": 4})
    assert (other.linear_probe_auc != dense.linear_probe_auc).any()


def test_several_attributes_are_rows_of_the_single_reports(faces):
    X, z, z3 = faces
    fair = dfairpca.FairPCA(3).fit(X, sensitive_features=pd.DataFrame({"sex": z, "age": z3}))
    both = fairness_report(fair, X[:800], pd.DataFrame({"sex": z[:800], "age": z3[:800]}), random_state=0)
    assert list(both.index) == ["sex", "age"] and both.index.name == "attribute"
    assert list(both.groups) == [2, 3]
    # a bare 2-D array takes the model's names
    assert list(fairness_report(fair, X[:800], np.column_stack([z, z3])[:800], random_state=0).index) == ["sex", "age"]
    for name, labels in (("sex", z), ("age", z3)):
        one = fairness_report(fair, X[:800], pd.Series(labels[:800], name=name), random_state=0)
        assert list(one.index) == [name]
        pd.testing.assert_series_equal(one.loc[name], both.loc[name], rtol=1e-12)
    assert list(fairness_report(dfairpca.PCA(2).fit(X), X, z, random_state=0).index) == [0]


def test_protected_columns_of_x_and_a_baseline_without_them(faces):
    X, z, _ = faces
    frame = pd.DataFrame(X, columns=[f"f{j}" for j in range(X.shape[1])])
    frame["sex"] = np.where(z == 1, "f", "m")
    fair = dfairpca.FairPCA(3, sensitive_feature_ids=["sex"]).fit(frame)
    pca = dfairpca.PCA(3).fit(frame.drop(columns="sex"))  # the features alone
    rep = fairness_report(fair, frame, baseline=pca, random_state=0)
    assert list(rep.index) == ["sex"]
    assert rep.loc["sex", "max_mean_gap_sd"] <= 1e-8
    assert rep.loc["sex", "baseline_max_mean_gap_sd"] == pytest.approx(_dense_gap(pca.transform(frame.drop(columns="sex")), z), rel=1e-10)


def test_fair_kernel_pca_and_the_join_with_reconstruction_cost(faces):
    X, z, _ = faces
    kern = dfairpca.FairKernelPCA(3).fit(X[:400], sensitive_features=z[:400])
    rep = fairness_report(kern, X[:400], z[:400], random_state=0)
    assert rep.iloc[0].max_mean_gap_sd < 1e-6 and rep.iloc[0].p_value > 0.5
    fair = dfairpca.FairPCA(3).fit(X, sensitive_features=z)
    pca = dfairpca.PCA(3).fit(X)
    rep = fairness_report(fair, X, pd.Series(z, name="sex"), baseline=pca, random_state=0)
    cost = group_reconstruction_error(fair, X, z, baseline=pca)
    joined = rep.join(pd.concat({"sex": cost}, names=["attribute", "group"]))
    assert len(joined) == 2 and set(joined.columns) >= {"p_value", "ratio"}
    assert (joined["p_value"] == rep.loc["sex", "p_value"]).all()


def test_a_single_group_warns_and_bad_arguments_are_refused(faces):
    X, z, _ = faces
    fair = dfairpca.FairPCA(3).fit(X, sensitive_features=z)
    with pytest.warns(DfairpcaWarning, match="1 group present"):
        rep = fairness_report(fair, X[:100], np.zeros(100), random_state=0)
    assert rep.iloc[0].groups == 1 and np.isnan(rep.iloc[0].p_value)
    assert np.isnan(rep.iloc[0].linear_probe_auc)
    with pytest.raises(ValueError, match="not fitted"):
        fairness_report(dfairpca.FairPCA(3), X, z)
    with pytest.raises(ValueError, match="cv must be"):
        fairness_report(fair, X, z, cv=1)
    with pytest.raises(ValueError, match="sensitive_features="):
        fairness_report(fair, X)
    with pytest.raises(ValueError, match="max_probe_rows"):
        fairness_report(fair, X, z, max_probe_rows=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a small group: fewer folds, no warning
        rep = fairness_report(fair, X[:60], np.r_[np.zeros(57), np.ones(3)], random_state=0)
    assert 0 <= rep.iloc[0].linear_probe_auc <= 1


# ----------------------------------------------------------------------------- the CLI
def test_cli_evaluate_prints_the_report(tmp_path, capsys, client):
    from dfairpca.celeba import open_celeba, synth_celeba
    from dfairpca.cli import main

    train, test = tmp_path / "train.zarr", tmp_path / "test.zarr"
    synth_celeba(train, n=400, size=12, seed=0, progress=False, n_jobs=1)
    synth_celeba(test, n=300, size=12, seed=1, progress=False, n_jobs=1)
    images, attrs, names = open_celeba(train)[:3]
    X = np.asarray(images[:]).reshape(400, -1)
    fair = dfairpca.FairPCA(4).fit(X, sensitive_features=np.asarray(attrs[:, names.index("Eyeglasses")]))
    fair.save(tmp_path / "fair")
    common = [str(tmp_path / "fair"), str(test), "--scheduler", client.scheduler.address]
    assert main(["evaluate", *common, "--attribute", "Eyeglasses", "--attribute", "Male",
                 "--baseline-k", "4", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["command"] == "evaluate" and report["n"] == 300 and report["probe_rows"] == 300
    rows = report["attributes"]
    assert list(rows) == ["Eyeglasses", "Male"]
    for row in rows.values():
        assert {"groups", "max_mean_gap_sd", "p_value", "linear_probe_auc",
                "baseline_max_mean_gap_sd", "baseline_p_value"} <= set(row)
        assert row["groups"] == 2 and 0 <= row["p_value"] <= 1
    assert main(["evaluate", *common, "--attribute", "Eyeglasses"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 2 and lines[1].startswith("Eyeglasses: 2 groups;") and "p = " in lines[1]
    assert main(["evaluate", *common]) == 2
    assert "--attribute NAME" in capsys.readouterr().err


def test_chunked_x_with_a_protected_column_and_a_baseline_without_it(faces):
    """The fold transforms each chunk (the baseline without the model's protected column):
    the figures of numpy input, whose models transform X whole."""
    X, z, _ = faces
    Xz = np.column_stack([X, z.astype(float)])  # the protected attribute as a numeric column
    fair = dfairpca.FairPCA(3, sensitive_feature_ids=[X.shape[1]]).fit(Xz)
    pca = dfairpca.PCA(3).fit(X)
    kw = dict(baseline=pca, random_state=1, max_probe_rows=900)
    dense = fairness_report(fair, Xz, z, **kw)
    lazy = fairness_report(fair, da.from_array(Xz, chunks=(400, 7)), z, **kw)
    pd.testing.assert_frame_equal(lazy, dense, rtol=1e-9)
    assert dense.iloc[0].max_mean_gap_sd < 1e-8
    assert dense.iloc[0].baseline_max_mean_gap_sd == pytest.approx(_dense_gap(pca.transform(X), z), rel=1e-10)
