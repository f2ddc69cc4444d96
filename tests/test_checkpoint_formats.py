"""Checkpoints written by an earlier dfairpca (tests/data/checkpoints, made by its
make_checkpoints.py) resume here: the exact pass's running total and the randomized fit's
saved state, its first-order statistics included, read as they were written."""

import shutil
from pathlib import Path

import dask
import dask.array as da
import numpy as np
import pytest

from dfairpca.engine.checkpoint import compute_moments_checkpointed
from dfairpca.errors import InvalidInputError
from dfairpca.inputs._groups import encode_groups
from dfairpca.solve._randomized import fit_randomized

SAVED = Path(__file__).parent / "data" / "checkpoints"
RANDOMIZED = dict(numeric=[0], iterated_power=2, n_oversamples=3, random_state=4)


@pytest.fixture(scope="module")
def expected():
    with np.load(SAVED / "expected.npz") as f:
        return {k: f[k] for k in f.files}


def _copy(name, tmp_path) -> Path:
    shutil.copytree(SAVED / name, tmp_path / name)
    return tmp_path / name


def _seen():
    def callback(i, *_):
        callback.seen.append(i)

    callback.seen = []
    return callback


def test_an_exact_pass_checkpoint_of_the_earlier_format_resumes(expected, tmp_path):
    ck, seen = _copy("exact", tmp_path), _seen()
    Xd = da.from_array(expected["X"], chunks=(100, -1))
    with dask.config.set(scheduler="sync"):
        m = compute_moments_checkpointed(Xd, sensitive_features=expected["z"], checkpoint=ck,
                                         segment_rows=200, on_segment=seen)
    assert seen.seen == [1, 2]  # segment 0 came from the checkpoint
    assert m.n == len(expected["X"])
    np.testing.assert_allclose(m.mean, expected["mean"], rtol=1e-12)
    np.testing.assert_allclose(m.scatter, expected["scatter"], rtol=1e-10)


def test_a_randomized_checkpoint_of_the_earlier_format_resumes_to_the_same_fit(expected, tmp_path):
    X, z = expected["X"], expected["z"]
    g = encode_groups([z], len(X))
    kw = dict(codes=g.codes, categories=g.categories, **RANDOMIZED)
    seen = _seen()
    with dask.config.set(scheduler="sync"):
        resumed = fit_randomized(X, 3, checkpoint=_copy("randomized", tmp_path), on_pass=seen, **kw)
        done = fit_randomized(X, 3, checkpoint=_copy("randomized-done", tmp_path), on_pass=seen, **kw)
    assert seen.seen[0] == 2  # pass 1 (the first-order statistics) was read from the checkpoint
    assert resumed.passes == done.passes == int(expected["passes"])
    # the saved answer, to rounding (the statistics' merge may round differently since)
    np.testing.assert_allclose(done.components, expected["components"], rtol=0, atol=1e-12)
    np.testing.assert_allclose(resumed.components, expected["components"], atol=1e-6)
    # the restored first-order statistics: a Moments without the scatter, its diagonal kept
    m = resumed.statistics
    assert m.scatter is None and m.n == len(X) and list(m.numeric) == [0]
    X64 = X.astype(np.float64)
    np.testing.assert_allclose(m.scatter_diagonal, ((X64 - X64.mean(0)) ** 2).sum(0), rtol=1e-6)
    assert m.cross is not None and m.cross.shape == (1, X.shape[1])
    with pytest.raises(InvalidInputError, match="no d x d scatter.*svd_solver='full'"):
        m.covariance()
