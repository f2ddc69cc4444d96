"""Write tests/data/saved_models: models saved by dfairpca at main 69683cd (before the
estimator base), with the data and each model's transform, for test_io-style loading."""
import sys
from pathlib import Path

import numpy as np
import pandas as pd

import dfairpca

out = Path(sys.argv[1])
rng = np.random.default_rng(7)
n, d = 60, 5
X = rng.normal(size=(n, d)) * np.array([3.0, 2.0, 1.0, 0.5, 0.2]) + 10.0
race = np.array(["a", "b", "c"])[np.arange(n) % 3]
sex = (np.arange(n) % 2).astype(np.int64)
X[race == "b"] += 1.0
X[sex == 1, :2] -= 0.5
z = (np.arange(n) % 4 == 0).astype(float)  # a numeric protected column
X[:, 3] += z
df = pd.DataFrame(np.column_stack([z, X]), columns=["z"] + [f"f{i}" for i in range(d)])
models = {
    "pca": (dfairpca.PCA(2, whiten=True, standardize=True), X, {}),
    "fair": (dfairpca.FairPCA(2, tradeoff=0.5), X, dict(sensitive_features=[race, sex])),
    "fair_ids": (dfairpca.FairPCA(2, sensitive_feature_ids=["z"]), df, {}),
    "kernel_exact": (dfairpca.FairKernelPCA(2), X, dict(sensitive_features=race)),
    "kernel_nystroem": (dfairpca.FairKernelPCA(2, kernel="linear", n_landmarks=30,
                                               sensitive_feature_ids=["z"], tradeoff=0.3), df, {}),
}
expected = {"X": X, "race": race.astype("U1"), "sex": sex, "z": z}
for name, (est, data, kw) in models.items():
    est.fit(data, **kw)
    est.save(out / name, **({"statistics": True} if name == "fair" else {}))
    expected[name] = est.transform(data)
np.savez(out / "expected.npz", **expected)
