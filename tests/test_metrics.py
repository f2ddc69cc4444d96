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
    with pytest.raises(ValueError, match="two groups"):
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


def test_delta_dp_and_eo():
    pred = np.array([1, 1, 0, 0, 1, 0, 0, 0])
    grp = np.array([0, 0, 0, 0, 1, 1, 1, 1])
    y = np.array([1, 1, 1, 0, 1, 1, 0, 0])
    assert metrics.delta_dp(pred, grp) == pytest.approx(0.5 - 0.25)
    assert metrics.delta_eo(pred, y, grp) == pytest.approx(2 / 3 - 1 / 2)
    with pytest.raises(ValueError, match="two groups"):
        metrics.delta_dp(pred, np.zeros(8))
