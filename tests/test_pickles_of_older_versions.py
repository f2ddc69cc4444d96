"""Estimators pickled by an older dfairpca (tests/data/pickles, written by its
make_pickles.py at version 0.2.0) unpickle and transform as they did: pickle (or joblib)
is how scikit-learn users store a model, and an upgrade must not strand those files."""

import pickle
from pathlib import Path

import numpy as np
import pytest

import dfairpca

DATA = Path(__file__).parent / "data" / "pickles"


@pytest.mark.parametrize("name", ["pca_randomized", "fair_randomized", "fair_exact"])
def test_an_older_pickle_loads_and_transforms_as_it_did(name):
    expected = np.load(DATA / "expected.npz")
    model = pickle.loads((DATA / f"{name}.pkl").read_bytes())
    np.testing.assert_allclose(model.transform(expected["X"]), expected[name], rtol=0, atol=1e-12)
    m = model.statistics_
    assert isinstance(m, dfairpca.Moments)
    assert m.numeric.shape == (0,)  # a field added since: its default
    if name.endswith("randomized"):  # the first-order statistics of the old type
        assert m.scatter is None and m.diagonal is not None
        np.testing.assert_array_equal(m.scatter_diagonal, m.diagonal)
        X = expected["X"]
        np.testing.assert_allclose(np.ldexp(m.scatter_diagonal, 2 * m.scatter_exponent),
                                   ((X - X.mean(0)) ** 2).sum(0), rtol=1e-10)
        with pytest.raises(ValueError, match="svd_solver='full'"):
            m.covariance()
    else:
        np.testing.assert_allclose(m.covariance(), np.cov(expected["X"].T), rtol=1e-10)
        again = dfairpca.FairPCA(3, svd_solver="full").fit_statistics(m)
        np.testing.assert_allclose(np.abs(again.components_ @ model.components_.T), np.eye(3), atol=1e-10)
