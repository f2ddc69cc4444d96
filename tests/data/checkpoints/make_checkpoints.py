"""Write tests/data/checkpoints: checkpoints interrupted by dfairpca at main 4bcf169 (before
the randomized fit's first-order statistics became a Moments), for test_checkpoint_formats.

* ``exact/``: compute_moments_checkpointed of ``X`` by ``z``, stopped after segment 0 of 3;
* ``randomized/``: fit_randomized(X, 3, ...) with a numeric attribute (column 0), stopped
  after pass 1 (the first-order statistics and S Omega saved); ``randomized-done/``: the
  same fit run to the end (its checkpoint holds the answer);
* ``expected.npz``: the data, and the uninterrupted results of that dfairpca (the
  statistics' mean and scatter, the randomized fit's components).

Run as ``PYTHONPATH=/path/to/that/checkout python make_checkpoints.py OUT``.
"""
import sys
from pathlib import Path

import dask
import dask.array as da
import numpy as np

from dfairpca import compute_moments
from dfairpca.engine.checkpoint import compute_moments_checkpointed
from dfairpca.inputs._groups import encode_groups
from dfairpca.solve._randomized import fit_randomized

out = Path(sys.argv[1])
rng = np.random.default_rng(23)
n, d = 600, 12
z = np.array(["a", "b", "c"])[rng.integers(0, 3, n)]
X = rng.normal(size=(n, d)) * np.linspace(1, 3, d) + 5.0
X[z == "b", 1:4] += 0.7
X = X.astype(np.float32)
RANDOMIZED = dict(numeric=[0], iterated_power=2, n_oversamples=3, random_state=4)


def stop_at(step):
    def callback(i, *_):
        if i == step:
            raise KeyboardInterrupt
    return callback


with dask.config.set(scheduler="sync"):
    Xd = da.from_array(X, chunks=(100, -1))
    try:
        compute_moments_checkpointed(Xd, sensitive_features=z, checkpoint=out / "exact",
                                     segment_rows=200, on_segment=stop_at(0))
    except KeyboardInterrupt:
        pass
    full = compute_moments(Xd, sensitive_features=z)
    g = encode_groups([z], n)
    try:
        fit_randomized(X, 3, codes=g.codes, categories=g.categories, checkpoint=out / "randomized",
                       on_pass=stop_at(1), **RANDOMIZED)
    except KeyboardInterrupt:
        pass
    fit = fit_randomized(X, 3, codes=g.codes, categories=g.categories,
                         checkpoint=out / "randomized-done", **RANDOMIZED)
np.savez(out / "expected.npz", X=X, z=z, mean=full.mean, scatter=full.scatter,
         components=fit.components, passes=fit.passes)
