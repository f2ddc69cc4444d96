"""examples/adult_table1.py reproduces the paper's Table 1 on the Lee et al. (2022) splits."""

import importlib.util
from pathlib import Path

import numpy as np
import pytest

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "adult_table1.py"


@pytest.fixture(scope="module")
def table(adult_dir):
    spec = importlib.util.spec_from_file_location("adult_table1", EXAMPLE)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod, mod.table1(adult_dir)


@pytest.mark.parametrize("k", [2, 10])
@pytest.mark.parametrize("method", ["PCA", "Fair PCA", "Fair PCA-S (0.5)", "Fair PCA-S (0.85)"])
def test_matches_paper_table1(table, k, method):
    mod, res = table
    var, mmd = mod.PAPER[(k, method)]
    r = res[(k, method)]
    assert np.mean(r["var"]) == pytest.approx(var, abs=0.006)   # paper prints 2 decimals
    if mmd is not None:  # the data README quotes MMD^2 for PCA and Fair PCA
        assert np.mean(r["mmd2"]) == pytest.approx(mmd, abs=0.0006)  # paper prints 3 decimals
    else:  # Fair PCA-S equalises more than means: lower MMD^2 than Fair PCA
        assert np.mean(r["mmd2"]) < np.mean(res[(k, "Fair PCA")]["mmd2"])


def test_script_prints_the_table(adult_dir, capsys, table):
    mod, _ = table
    mod.main(["--data", str(adult_dir)])
    out = capsys.readouterr().out
    assert "Fair PCA" in out and "19.62" in out and "0.349" in out
