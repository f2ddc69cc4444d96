"""dfairpca.datasets: the Lee et al. (2022) splits ship inside the package and load like
scikit-learn's ``load_*``; the facts of their READMEs hold on the packaged arrays."""

import gzip
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from importlib import resources
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import dfairpca
from dfairpca import datasets, metrics

ROOT = Path(__file__).resolve().parents[1]
LOADERS = {"adult": datasets.load_adult, "german": datasets.load_german, "compas": datasets.load_compas}
#: (n_train, n_test, d) of the data READMEs: 70/30 splits of 2261, 1000 and 2468 records
SHAPES = {"adult": (1582, 679, 97), "german": (700, 300, 57), "compas": (1727, 741, 11)}


def _hot(col):
    """0/1 of a standardized binary column (standardizing keeps the order; a constant is 0)."""
    return (col == col.max()) & (col.max() > col.min())


def _both(b):
    """train and test of one split together: the whole (sub)sample of records."""
    return (np.vstack([b.X_train, b.X_test]), np.concatenate([b.y_train, b.y_test]),
            np.concatenate([b.sensitive_train, b.sensitive_test]))


@pytest.mark.parametrize("name", LOADERS)
def test_bunch_shapes_types_and_readme_facts(name):
    n_tr, n_te, d = SHAPES[name]
    b = LOADERS[name](split=3)
    assert (b.split, b.n_splits) == (3, datasets.N_SPLITS) and datasets.N_SPLITS == 10
    assert b.X_train.shape == (n_tr, d) and b.X_test.shape == (n_te, d)
    assert b.X_train.dtype == np.float64 and b.X_train.flags.c_contiguous
    for a, n in [(b.y_train, n_tr), (b.y_test, n_te), (b.sensitive_train, n_tr), (b.sensitive_test, n_te)]:
        assert a.shape == (n,) and a.dtype == np.int64 and set(np.unique(a)) == {0, 1}
    assert len(b.feature_names) == d == len(set(b.feature_names))
    # the protected attribute is also a feature (AIF360 keeps it): its standardized column
    j = b.sensitive_feature_index
    assert b.feature_names[j] == b.sensitive_name
    np.testing.assert_array_equal(_hot(b.X_train[:, j]), b.sensitive_train)
    np.testing.assert_array_equal(_hot(b.X_test[:, j]), b.sensitive_test)
    # standardized with the train split's mean and std (a constant column is all zeros)
    sd = b.X_train.std(0)
    np.testing.assert_allclose(b.X_train.mean(0), 0, atol=1e-12)
    np.testing.assert_allclose(sd[sd > 0], 1, atol=1e-12)
    assert b.paper_table and "Lee et al. (2022)" in b.DESCR and "licence" in b.DESCR.lower()


def test_splits_differ_and_each_file_holds_n_splits():
    a, b = datasets.load_compas(split=0), datasets.load_compas(split=9)
    assert not np.array_equal(a.X_train, b.X_train)
    npz = [f for f in datasets.data_files() if f.endswith(".npz")]
    assert len(npz) == 3
    for f in npz:
        with resources.files(datasets).joinpath(f).open("rb") as fh, np.load(fh) as z:
            assert z["X_train"].shape[0] == datasets.N_SPLITS, f


@pytest.mark.parametrize("name", LOADERS)
def test_one_hot_blocks_of_the_feature_names(name):
    # every "column=value" block of feature_names is one categorical column: exactly one
    # hot entry per record, so the block boundaries (and sizes) of the names are right
    b = LOADERS[name](split=0)
    X, _, _ = _both(b)
    blocks = {}
    for j, f in enumerate(b.feature_names):
        if "=" in f and f != b.sensitive_name:
            blocks.setdefault(f.split("=")[0], []).append(j)
    assert blocks
    for col, js in blocks.items():
        hot = np.column_stack([_hot(X[:, j]) for j in js])
        assert (hot.sum(1) == 1).all(), col


def test_adult_names_agree_with_the_numeric_columns():
    b = datasets.load_adult()
    X, _, s = _both(b)
    f = {n: j for j, n in enumerate(b.feature_names)}
    # education-num is the rank of the education level: one value per level, increasing
    levels = ("Preschool 1st-4th 5th-6th 7th-8th 9th 10th 11th 12th HS-grad Some-college "
              "Assoc-voc Assoc-acdm Bachelors Masters Prof-school Doctorate").split()
    nums = [np.unique(X[_hot(X[:, f["education=" + e]]), f["education-num"]]) for e in levels]
    assert all(v.size == 1 for v in nums) and np.all(np.diff(np.concatenate(nums)) > 0)
    assert s[_hot(X[:, f["relationship=Husband"]])].min() == 1  # husbands are male
    assert s[_hot(X[:, f["relationship=Wife"]])].max() == 0
    assert np.argmax([_hot(X[:, f[n]]).sum() for n in b.feature_names if n.startswith("native-country=")]) \
        == [n for n in b.feature_names if n.startswith("native-country=")].index("native-country=United-States")


def test_german_names_give_the_uci_counts():
    # German is whole (1000 records) in every split: the category counts of UCI's german.doc
    b = datasets.load_german(split=7)
    X, y, s = _both(b)
    counts = {n: int(_hot(X[:, j]).sum()) for j, n in enumerate(b.feature_names)}
    uci = {"status=A11": 274, "status=A14": 394, "credit_history=A32": 530, "purpose=A40": 234,
           "purpose=A410": 12, "purpose=A43": 280, "purpose=A48": 9, "savings=A65": 183,
           "employment=A73": 339, "property=A124": 154, "housing=A153": 108,
           "skill_level=A171": 22, "telephone=A192": 404, "foreign_worker=A202": 37}
    assert {n: counts[n] for n in uci} == uci
    assert y.sum() == 300  # 300 bad credits (label 1)
    assert s.sum() == 851  # age >= 25


def test_compas_age_category_agrees_with_age():
    b = datasets.load_compas(split=5)
    X, _, _ = _both(b)
    f = {n: j for j, n in enumerate(b.feature_names)}
    age = X[:, f["age"]]
    young, mid, old = (age[_hot(X[:, f["age_cat=" + c]])] for c in ("Less than 25", "25 - 45", "Greater than 45"))
    assert young.max() < mid.min() and mid.max() < old.min()


def test_as_frame():
    b = datasets.load_german(split=2, as_frame=True)
    assert isinstance(b.X_train, pd.DataFrame) and list(b.X_train.columns) == b.feature_names
    assert isinstance(b.y_test, pd.Series) and b.y_test.name == b.target_name
    assert isinstance(b.sensitive_train, pd.Series) and b.sensitive_train.name == b.sensitive_name
    np.testing.assert_array_equal(b.X_train.to_numpy(), datasets.load_german(split=2).X_train)


def test_loaders_return_fresh_arrays():
    a = datasets.load_compas()
    a.X_train[:] = 0
    assert datasets.load_compas().X_train.any()


@pytest.mark.parametrize("split", [-1, 10, 11])
def test_split_out_of_range_names_the_range(split):
    with pytest.raises(ValueError, match=r"split=-?\d+ is out of range.*0 to 9"):
        datasets.load_adult(split=split)


@pytest.mark.parametrize("split", [1.0, "0", True, None])
def test_split_must_be_an_integer(split):
    with pytest.raises(TypeError, match="split must be an integer from 0 to 9"):
        datasets.load_german(split=split)


def test_as_frame_must_be_a_bool():
    with pytest.raises(TypeError, match="as_frame must be True or False"):
        datasets.load_compas(as_frame="yes")


@pytest.mark.parametrize("name", LOADERS)
def test_pca_variance_of_the_paper_tables(name):
    # the paper's tables (1, 2 and 3) are reproduced by PCA and Fair PCA on the packaged
    # splits; tests/integration/test_adult_table1.py checks all of Table 1 through the example script
    table = datasets.PAPER_TABLES[name]
    splits = [LOADERS[name](split=split) for split in range(datasets.N_SPLITS)]  # read once
    for k in (2, 10):
        got = {"PCA": [], "Fair PCA": []}
        for b in splits:
            got["PCA"].append(metrics.explained_variance_pct(b.X_test, dfairpca.PCA(k).fit(b.X_train).components_))
            fair = dfairpca.FairPCA(k).fit(b.X_train, sensitive_features=b.sensitive_train)
            got["Fair PCA"].append(metrics.explained_variance_pct(b.X_test, fair.components_))
        for method, v in got.items():
            paper = table[(k, method)]
            assert np.mean(v) == pytest.approx(paper.var, abs=0.006), (k, method)  # 2 decimals
            assert np.std(v) == pytest.approx(paper.var_std, abs=0.006), (k, method)


def test_converter_rebuilds_the_packaged_file_from_source_csvs(tmp_path):
    # the source layout: one train_i/test_i.csv.gz per split, each row the standardized
    # features, then the label, then the protected attribute (np.savetxt's %.18e, as Lee et al.)
    from dfairpca.datasets import _make_data

    src = tmp_path / "compas_lee2022"
    src.mkdir()
    bunches = [datasets.load_compas(split=i) for i in range(datasets.N_SPLITS)]
    for i, b in enumerate(bunches):
        for part in ("train", "test"):
            rows = np.column_stack([b[f"X_{part}"], b[f"y_{part}"], b[f"sensitive_{part}"]])
            with gzip.open(src / f"{part}_{i}.csv.gz", "wt") as fh:
                np.savetxt(fh, rows, delimiter=",")
    out = tmp_path / "compas_lee2022.npz"
    _make_data.convert(src, out)
    with np.load(out) as new, resources.files(datasets).joinpath("data/compas_lee2022.npz").open("rb") as fh, \
            np.load(fh) as old:
        assert sorted(new.files) == sorted(old.files)
        for key in old.files:
            np.testing.assert_array_equal(new[key], old[key])
            assert new[key].dtype == old[key].dtype


def test_converter_refuses_a_folder_without_the_splits(tmp_path):
    from dfairpca.datasets import _make_data

    with pytest.raises(FileNotFoundError, match="train_0.csv.gz"):
        _make_data.convert(tmp_path, tmp_path / "x.npz")


# ---------------------------------------------------------------------------------------
# packaging: the data travels with the package (a user's clone, wheel or sdist has no
# ../shared folder beside it)


def test_installed_package_finds_every_data_file():
    files = datasets.data_files()
    assert {f"data/{n}_lee2022.{e}" for n in LOADERS for e in ("npz", "md")} <= set(files)
    for f in files:
        res = resources.files(datasets).joinpath(f)
        assert res.is_file() and res.read_bytes(), f


def _copy_repo(dst: Path) -> Path:
    """What a fresh clone holds of the files a build reads (no virtualenv, caches, outputs)."""
    dst.mkdir()
    for f in ROOT.iterdir():  # pyproject.toml, README.md, LICENSE, MANIFEST.in, ...
        if f.is_file() and not f.name.startswith("."):
            shutil.copy2(f, dst / f.name)
    # byte code comes along as in a working clone: MANIFEST.in must keep it out of the sdist
    for d in ("dfairpca", "tests", "examples"):
        shutil.copytree(ROOT / d, dst / d, ignore=shutil.ignore_patterns("*.egg-info"))
    return dst


def _build(src: Path, hook: str, out: Path) -> Path:
    """Run setuptools' PEP 517 hook (build_sdist or build_wheel) as pip or build would,
    without build isolation (no network): the file it wrote."""
    out.mkdir()
    code = f"from setuptools import build_meta as b; print(b.{hook}({str(out)!r}))"
    r = subprocess.run([sys.executable, "-c", code], cwd=src, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    return out / r.stdout.strip().splitlines()[-1]


@pytest.mark.integration
def test_wheel_and_sdist_carry_the_data_and_load_without_the_repo(tmp_path):
    src = _copy_repo(tmp_path / "dfairpca-clone")
    assert not (src.parent / "shared").exists()
    data = {"dfairpca/datasets/" + f for f in datasets.data_files()}

    wheel = _build(src, "build_wheel", tmp_path / "wheel")
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        assert data <= names, data - names
        z.extractall(tmp_path / "site")
    # the unpacked wheel alone (no repository, no editable install) loads every dataset
    code = ("import dfairpca.datasets as d, sys; assert d.__file__.startswith(sys.argv[1]), d.__file__; "
            "print(sum(f(split=9).X_test.shape[0] for f in (d.load_adult, d.load_german, d.load_compas)))")
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "site")}
    r = subprocess.run([sys.executable, "-c", code, str(tmp_path / "site")], cwd=tmp_path,
                       env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.split() == [str(679 + 300 + 741)], r.stderr[-3000:]

    sdist = _build(src, "build_sdist", tmp_path / "sdist")
    with tarfile.open(sdist) as t:
        names = {n.split("/", 1)[1] for n in t.getnames() if "/" in n}
    needed = data | {"tests/conftest.py", "tests/oracle.py", "tests/test_datasets.py",
                     "tests/integration/test_adult_table1.py", "examples/adult_table1.py", "MANIFEST.in"}
    assert needed <= names, needed - names
    assert not any("__pycache__" in n for n in names)
