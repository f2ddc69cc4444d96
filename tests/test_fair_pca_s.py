"""Fair PCA-S (Sec. 3.6): equalising group covariances as well as means."""

import dask.array as da
import numpy as np
import pytest

import dfairpca
import oracle
from dfairpca.solve import _fairness
from oracle import make_data, max_angle_deg


def two_gaussians(n=3000, d=12, seed=0):
    """The setting of the paper's Figure 1: group covariances differ strongly."""
    rng = np.random.default_rng(seed)
    z = rng.integers(0, 2, n)
    A = rng.normal(size=(d, d)) / np.sqrt(d)
    B = np.diag(np.linspace(3, 0.2, d))
    X = np.where(z[:, None] == 0, rng.normal(size=(n, d)) @ A.T, rng.normal(size=(n, d)) @ B)
    X[z == 1] += 0.5
    return X, z


@pytest.mark.parametrize("eq, l", [(0.5, 6), (0.75, 9), (4, 4), (7, 7)])
@pytest.mark.parametrize("kind", ["numpy", "dask"])
def test_matches_dense_oracle(eq, l, kind):
    X, z = two_gaussians()
    Xin = da.from_array(X, chunks=(256, 12)) if kind == "dask" else X
    est = dfairpca.FairPCA(3 if l >= 3 else l, equalize_covariance=eq).fit(Xin, sensitive_features=z)
    ref = oracle.fair_pca_s(X, z, est.n_components_, l)
    assert max_angle_deg(est.components_.T, ref) < 1e-6


def test_equalizes_covariances_better_than_fair_pca():
    X, z = two_gaussians()
    Y1 = dfairpca.FairPCA(2).fit_transform(X, sensitive_features=z)
    Y2 = dfairpca.FairPCA(2, equalize_covariance=0.5).fit(X, sensitive_features=z).transform(X)
    gap = lambda Y: np.linalg.norm(np.cov(Y[z == 0].T) - np.cov(Y[z == 1].T))
    assert gap(Y2) < 0.5 * gap(Y1)
    for Y in (Y1, Y2):  # the means stay equal
        np.testing.assert_allclose(Y[z == 0].mean(0), Y[z == 1].mean(0), atol=1e-10 * np.abs(Y).max())


def test_fraction_one_is_fair_pca():
    X, z = two_gaussians()
    a = dfairpca.FairPCA(3, equalize_covariance=1.0).fit(X, sensitive_features=z)
    b = dfairpca.FairPCA(3).fit(X, sensitive_features=z)
    assert max_angle_deg(a.components_.T, b.components_.T) < 1e-6


def test_more_groups_generalisation_reduces_to_paper_for_two():
    X, z = two_gaussians(d=10)
    Xc = X - X.mean(0)
    Q = _fairness.constraint_basis((np.stack([Xc[z == 0].mean(0), Xc[z == 1].mean(0)])))
    S0, S1 = np.cov(X[z == 0].T), np.cov(X[z == 1].T)
    n0, n1 = (z == 0).sum(), (z == 1).sum()
    pooled = (n0 * S0 + n1 * S1) / (n0 + n1)
    paper = _fairness.equalizing_basis([(1.0, S0 - S1)], Q, 5)
    general = _fairness.equalizing_basis([(n0 / len(z), S0 - pooled), (n1 / len(z), S1 - pooled)], Q, 5)
    assert max_angle_deg(paper, general) < 1e-6
    assert np.abs(Q.T @ paper).max() < 1e-12


def test_three_groups_and_two_attributes():
    X, g = make_data(3000, 14, (3, 2), seed=5)
    X[g[0] == 2] *= 2.0  # group 2 has a larger covariance
    for groups in (g[0], np.column_stack(g)):
        est = dfairpca.FairPCA(3, equalize_covariance=0.5).fit(X, sensitive_features=groups)
        base = dfairpca.FairPCA(3).fit(X, sensitive_features=groups)
        def spread(model):
            Y = model.transform(X)
            covs = [np.cov(Y[g[0] == c].T) for c in range(3)]
            return sum(np.linalg.norm(c - covs[0]) for c in covs)
        assert spread(est) < spread(base)
        Y = est.transform(X)
        ms = np.stack([Y[g[0] == c].mean(0) for c in range(3)])
        assert np.abs(ms - ms[0]).max() < 1e-10 * np.abs(Y).max()


def test_partial_fit_carries_group_scatter():
    X, z = two_gaussians()
    full = dfairpca.FairPCA(3, equalize_covariance=0.5).fit(X, sensitive_features=z)
    inc = dfairpca.FairPCA(3, equalize_covariance=0.5)
    for s in range(0, 3000, 700):
        inc.partial_fit(X[s : s + 700], sensitive_features=z[s : s + 700])
    assert max_angle_deg(inc.components_.T, full.components_.T) < 1e-6


def test_errors():
    X, z = two_gaussians()
    with pytest.raises(ValueError, match="cannot hold n_components=3"):
        dfairpca.FairPCA(3, equalize_covariance=2).fit(X, sensitive_features=z)
    with pytest.raises(ValueError, match=r"fraction must be in \(0, 1\]"):
        dfairpca.FairPCA(3, equalize_covariance=1.5).fit(X, sensitive_features=z)
    plain = dfairpca.FairPCA(3).fit(X, sensitive_features=z)
    with pytest.raises(ValueError, match="no per-group scatter"):
        dfairpca.FairPCA(3, equalize_covariance=0.5).fit_statistics(plain.statistics_)


def test_a_fit_keeping_under_5_percent_of_the_variance_says_why():
    """Fair PCA-S with a small l: the directions along which the covariances differ least
    are the data's quietest ones, here 1e-3 of the variance; the warning names l."""
    import warnings

    from dfairpca.errors import LowVarianceWarning

    rng = np.random.default_rng(0)
    n, d = 4000, 20
    z = rng.integers(0, 2, n)
    X = rng.normal(size=(n, d)) * np.r_[np.full(d - 3, 10.0), np.full(3, 0.03)]
    X[:, -1] *= np.where(z == 1, 2.0, 1.0)  # the quiet columns' covariances differ least...
    X[:, 0] *= np.where(z == 1, 3.0, 1.0)  # ...a loud column's most
    with pytest.warns(LowVarianceWarning, match=r"Fair PCA-S \(equalize_covariance=3\) searches "
                                                r"only l = 3 of the fair subspace's 19 directions") as w:
        est = dfairpca.FairPCA(2, equalize_covariance=3).fit(X, sensitive_features=z)
    assert est.explained_variance_ratio_.sum() < 0.05
    assert w[0].filename == __file__  # the caller's line, not dfairpca's
    with warnings.catch_warnings():
        warnings.simplefilter("error", LowVarianceWarning)
        kept = dfairpca.FairPCA(2).fit(X, sensitive_features=z).explained_variance_ratio_.sum()
    assert kept > 0.05


def test_the_low_variance_reason_for_plain_fair_pca_is_k():
    from dfairpca.solve._fairness import low_variance_message

    assert low_variance_message(0.06, 2, 100, 1, None) is None
    msg = low_variance_message(0.01, 2, 100, 1, None)
    assert "keeps 1% of the variance" in msg and "a larger k keeps more" in msg
    # l covering the whole fair subspace is plain fair PCA: k is the reason then
    assert "larger k" in low_variance_message(0.01, 2, 100, 1, 99)
