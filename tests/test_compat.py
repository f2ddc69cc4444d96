"""dfairpca.base._compat: what older dfairpca wrote or accepted keeps working until the
version each shim names."""

import importlib
import warnings

import numpy as np
import pytest

import dfairpca
from dfairpca.base import _compat


@pytest.mark.parametrize("old, names", [
    ("dfairpca.io.writes", ["atomic_directory", "atomic_file", "check_target", "MARKER"]),
    ("dfairpca.io.storage", ["storage_for", "is_remote", "location", "open_zarr", "read_capped"]),
    ("dfairpca.base.runtime", ["cpu_count", "code_digest", "__version__", "BLOCK_BYTES"]),
])
def test_a_public_module_of_0_2_0_still_imports_its_names(old, names):
    module = importlib.import_module(old)
    new = importlib.import_module(_compat.MOVED_MODULES[old])
    for name in names:
        assert getattr(module, name) is getattr(new, name)


def test_a_renamed_parameter_value_is_mapped_with_a_warning_at_fit_and_quietly_on_load():
    assert _compat.current_params({"eigen_solver": "randomized", "n_components": 2}) == {
        "eigen_solver": "subspace", "n_components": 2}
    X = np.random.default_rng(0).normal(size=(50, 4))
    with pytest.warns(FutureWarning, match="eigen_solver='subspace'"):
        est = dfairpca.PCA(2, eigen_solver="randomized").fit(X)
    assert est.eigen_solver == "randomized"  # the parameter as given (scikit-learn's clone)


def test_statistics_pickled_before_a_field_existed_get_its_default():
    m = dfairpca.compute_moments(np.arange(12.0).reshape(6, 2))
    state = dict(m.__dict__)
    del state["numeric"], state["cross"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        restored = object.__new__(type(m))
        restored.__setstate__(state)
    assert restored.numeric.shape == (0,) and restored.cross is None
    np.testing.assert_array_equal(restored.covariance(), m.covariance())


def test_first_moments_of_0_2_0_become_first_order_moments_state():
    got = _compat.first_moments_state({"sq": np.ones(3), "exponent": 2, "n": 5})
    assert got["scatter"] is None and got["scatter_exponent"] == 2 and "sq" not in got
    np.testing.assert_array_equal(got["diagonal"], np.ones(3))
