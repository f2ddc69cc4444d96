"""The saved-model format: models written before the estimators shared one base load,
transform as they did, and save again to the same files; load finds classes through the
registry."""

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import dfairpca
from dfairpca.io import _registry
from dfairpca.io import SavedFileError

#: written by dfairpca at commit 69683cd (tests/data/saved_models/README.md)
SAVED = Path(__file__).parent / "data" / "saved_models"
MODELS = ["pca", "fair", "fair_ids", "kernel_exact", "kernel_nystroem"]


def _inputs(name, expected):
    X = expected["X"]
    if name in ("fair_ids", "kernel_nystroem"):
        d = X.shape[1]
        return pd.DataFrame(np.column_stack([expected["z"], X]), columns=["z"] + [f"f{i}" for i in range(d)])
    return X


def _read(model: Path):
    meta = json.loads((model / "meta.json").read_text())
    with np.load(model / "arrays.npz") as f:
        return meta, {k: f[k] for k in f.files}


@pytest.mark.parametrize("name", MODELS)
def test_models_saved_before_the_shared_base_load_and_save_unchanged(name, tmp_path):
    shutil.copytree(SAVED / name, tmp_path / "old")
    with np.load(SAVED / "expected.npz") as f:
        expected = {k: f[k] for k in f.files}
    model = dfairpca.load(tmp_path / "old")
    X = _inputs(name, expected)
    if name.startswith("kernel"):
        # the kernel matrix goes through BLAS kernels whose last bits differ between CPUs
        # (2e-15 on an AMD EPYC against the machine that saved these): the same model
        # within rounding, not bit for bit
        np.testing.assert_allclose(model.transform(X), expected[name], rtol=0, atol=1e-13)
    else:
        np.testing.assert_array_equal(model.transform(X), expected[name])
    model.save(tmp_path / "new", **({"statistics": True} if name == "fair" else {}))
    for part in ["model"] + (["statistics"] if name == "fair" else []):
        old_meta, old_arrays = _read(tmp_path / "old" / part)
        # saved now: the model's files at the top of its folder, statistics beside them
        new_meta, new_arrays = _read(tmp_path / "new" / ("" if part == "model" else part))
        assert new_meta == old_meta
        assert sorted(new_arrays) == sorted(old_arrays)
        for key, value in old_arrays.items():
            assert new_arrays[key].dtype == value.dtype, key
            np.testing.assert_array_equal(new_arrays[key], value, err_msg=key)


def test_load_finds_every_class_in_the_registry_and_only_there(tmp_path):
    assert _registry.names() == ("PCA", "FairPCA", "FairKernelPCA", "ConceptEraser")
    for name in _registry.names():
        assert getattr(dfairpca, name) is _registry.lookup(name)
    shutil.copytree(SAVED / "pca", tmp_path / "m")
    meta_path = tmp_path / "m" / "model" / "meta.json"
    meta = json.loads(meta_path.read_text())
    meta["class"] = "Moments"  # a dfairpca class, but not a registered estimator
    meta_path.write_text(json.dumps(meta))
    with pytest.raises(SavedFileError, match=r"'class' must be one of \['PCA', 'FairPCA', 'FairKernelPCA', 'ConceptEraser'\]"):
        dfairpca.load(tmp_path / "m")


def test_a_kernel_model_loads_in_a_fresh_process_through_the_linear_module():
    """The estimator modules are imported lazily: load imports them itself, whichever
    module it is reached through."""
    import subprocess
    import sys

    code = ("from dfairpca.decomposition import load; "
            f"print(type(load({str(SAVED / 'kernel_exact')!r})).__name__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == "FairKernelPCA", out.stderr


def test_statistics_beside_a_kernel_model_are_refused(tmp_path):
    """Only the linear models save statistics/: one beside a kernel model was put there."""
    shutil.copytree(SAVED / "kernel_exact", tmp_path / "k")
    shutil.copytree(SAVED / "fair" / "statistics", tmp_path / "k" / "statistics")
    with pytest.raises(SavedFileError, match="FairKernelPCA saves no statistics/"):
        dfairpca.load(tmp_path / "k")
