"""Write tests/data/pickles: fitted estimators pickled by dfairpca at main 4bcf169 (version
0.2.0, before the randomized fit's first-order statistics became a Moments), for
test_pickles_of_older_versions.

* ``pca_randomized.pkl``, ``fair_randomized.pkl``: ``PCA`` / ``FairPCA`` fitted with
  ``svd_solver="randomized"`` (their ``statistics_`` a ``FirstMoments`` then);
* ``fair_exact.pkl``: ``FairPCA`` fitted exactly (its ``statistics_`` a ``Moments`` without
  the fields added since);
* ``expected.npz``: the data, the groups and each model's ``transform`` of it.

Run as ``PYTHONPATH=/path/to/that/checkout python make_pickles.py OUT``.
"""
import pickle
import sys
from pathlib import Path

import numpy as np

from dfairpca import PCA, FairPCA

out = Path(sys.argv[1])
rng = np.random.default_rng(29)
n, d = 300, 10
z = rng.integers(0, 2, n)
X = rng.normal(size=(n, d)) * np.linspace(1, 3, d) + 2.0
X[z == 1, :3] += 0.8
models = {
    "pca_randomized": PCA(3, svd_solver="randomized", random_state=0).fit(X),
    "fair_randomized": FairPCA(3, svd_solver="randomized", random_state=0).fit(X, sensitive_features=z),
    "fair_exact": FairPCA(3, svd_solver="full").fit(X, sensitive_features=z),
}
expected = {"X": X, "z": z}
for name, model in models.items():
    (out / f"{name}.pkl").write_bytes(pickle.dumps(model, protocol=4))
    expected[name] = model.transform(X)
np.savez(out / "expected.npz", **expected)
