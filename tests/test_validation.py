"""Input the estimators must refuse clearly or handle: sparse matrices, missing and
mixed-type labels, and CLI attributes outside 0/1.  Real numpy, scipy, pandas and Dask
objects; real Zarr stores."""

import dask.array as da
import numpy as np
import pandas as pd
import pytest
import scipy.sparse as sp
import zarr

import dfairpca
from dfairpca._validation import encode_groups
from dfairpca.celeba import synth_celeba
from dfairpca.cli import main


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(7)
    n, d = 600, 8
    X = rng.normal(size=(n, d)) * np.linspace(1, 3, d)
    z = rng.integers(0, 2, n)
    X[z == 1] += 0.7
    return X, z


def _fitted(kind, X, z):
    if kind == "PCA":
        return dfairpca.PCA(3).fit(X)
    if kind == "FairPCA":
        return dfairpca.FairPCA(3).fit(X, sensitive_features=z)
    return dfairpca.FairKernelPCA(3, n_landmarks=None).fit(X[:200], sensitive_features=z[:200])


def _angle(A, B):
    """Largest principal angle (degrees) between the row spaces of A and B."""
    qa, _ = np.linalg.qr(np.asarray(A).T)
    qb, _ = np.linalg.qr(np.asarray(B).T)
    sine = np.linalg.norm(qb - qa @ (qa.T @ qb), 2)  # well conditioned near 0, unlike arccos
    return float(np.degrees(np.arcsin(min(sine, 1.0))))


ESTIMATORS = ["PCA", "FairPCA", "FairKernelPCA"]


# ----------------------------------------------------------------------------- sparse
SPARSE = [sp.csr_matrix, sp.csr_array, sp.coo_matrix]
CALLS = [("PCA", "fit"), ("PCA", "partial_fit"), ("PCA", "transform"),
         ("FairPCA", "fit"), ("FairPCA", "partial_fit"), ("FairPCA", "transform"),
         ("FairKernelPCA", "fit"), ("FairKernelPCA", "transform")]


@pytest.mark.parametrize("fmt", SPARSE, ids=lambda f: f.__name__)
@pytest.mark.parametrize("kind,method", CALLS)
def test_sparse_input_is_refused_naming_how_to_densify(data, fmt, kind, method):
    X, z = data
    S = fmt(X[:200])
    if method == "transform":
        call = lambda: _fitted(kind, X, z).transform(S)  # noqa: E731
    else:
        est = getattr(dfairpca, kind)(2)
        kw = {} if kind == "PCA" else {"sensitive_features": z[:200]}
        call = lambda: getattr(est, method)(S, **kw)  # noqa: E731
    with pytest.raises(TypeError, match=r"sparse matrices are not supported .*X.toarray\(\)"):
        call()


def test_dask_array_of_sparse_chunks_is_refused_and_the_named_fix_works(data):
    X, z = data
    S = sp.csr_matrix(X)
    Sd = da.from_array(S, chunks=(100, -1))
    with pytest.raises(TypeError, match=r"Dask array of csr_matrix chunks: sparse matrices are "
                                        r"not supported .*X.map_blocks\(lambda b: b.toarray\(\)"):
        dfairpca.FairPCA(2).fit(Sd, sensitive_features=z)
    # the recipe the message gives for a scipy matrix, as written there
    dense = da.from_array(S, chunks=(10_000, -1)).map_blocks(lambda b: b.toarray(), dtype=S.dtype)
    a = dfairpca.FairPCA(2).fit(dense, sensitive_features=z)
    b = dfairpca.FairPCA(2).fit(X, sensitive_features=z)
    assert _angle(a.components_, b.components_) < 1e-6


# ----------------------------------------------------------------------------- labels
def _na_series(dtype):
    s = pd.Series(np.where(np.arange(600) % 2 == 0, "a", "b"), dtype=dtype)
    s.iloc[[3, 40]] = pd.NA
    return s


@pytest.mark.parametrize("labels", [
    pytest.param(lambda: _na_series(object), id="object"),
    pytest.param(lambda: _na_series("string"), id="string"),
    pytest.param(lambda: _na_series("string[pyarrow]"), id="string[pyarrow]"),
    pytest.param(lambda: pd.Series(np.arange(600) % 2, dtype="Int64").mask(
        pd.Series(np.isin(np.arange(600), [3, 40])), pd.NA), id="Int64"),
    pytest.param(lambda: np.array(["a", "b"] * 150 + [None] + ["a"] * 299, object), id="None"),
    pytest.param(lambda: pd.DataFrame({"sex": _na_series("string")}), id="DataFrame"),
])
def test_pandas_na_and_none_are_missing_labels_not_a_group(data, labels):
    X, z = data
    with pytest.raises(ValueError, match=r"missing labels .* every row needs a group"):
        dfairpca.FairPCA(2).fit(X, sensitive_features=labels())


def test_missing_label_error_names_the_rows(data):
    X, _ = data
    with pytest.raises(ValueError, match=r"in 2 row\(s\) \(rows 3, 40\)"):
        dfairpca.FairPCA(2).fit(X, sensitive_features=_na_series("string[pyarrow]"))


def test_labels_mixing_1_and_text_1_are_refused_showing_both(data):
    X, z = data
    mixed = z.astype(object)
    mixed[mixed == 1] = "1"
    mixed[7] = 1
    with pytest.raises(ValueError, match=r"mixes labels of different types, e.g. 1 \(int\) and '1' \(str\)"):
        dfairpca.FairPCA(2).fit(X, sensitive_features=mixed)
    with pytest.raises(ValueError, match=r"mixes labels"):
        dfairpca.FairPCA(2).fit(X, sensitive_features=pd.Series(mixed))


def test_numbers_in_an_object_column_are_the_groups_numpy_would_give(data):
    X, z = data
    as_objects = z.astype(object)
    as_objects[as_objects == 1] = 1.0  # 1 and 1.0 are one group, as in numpy and pandas
    g = encode_groups(as_objects, len(z))
    np.testing.assert_array_equal(g.categories[0], [0, 1])
    np.testing.assert_array_equal(g.codes[:, 0], z)
    wide = np.array([2**63 + 1, 2**63] * 300, object)  # too wide for float64: kept apart
    assert len(encode_groups(wide, 600).categories[0]) == 2
    with pytest.raises(ValueError, match="would merge"):
        encode_groups(np.array([2**63 + 1, 2**63, 0.5] * 200, object), 600)


# ----------------------------------------------------------------------------- CLI
@pytest.fixture(scope="module")
def store(tmp_path_factory):
    path = tmp_path_factory.mktemp("attrs") / "faces.zarr"
    synth_celeba(path, n=300, size=8, chunk_rows=100, progress=False, n_jobs=1)
    return path


def _with_column(store, tmp_path, values):
    """A copy of the store whose Eyeglasses column holds ``values`` (cycled)."""
    import shutil

    path = tmp_path / "edited.zarr"
    shutil.copytree(store, path)
    attrs = zarr.open_group(str(path), mode="r+")["attributes"]
    j = list(attrs.attrs["names"]).index("Eyeglasses")
    col = np.resize(np.asarray(values, np.int8), attrs.shape[0])
    block = attrs[:]
    block[:, j] = col
    attrs[:] = block
    return path


def test_cli_refuses_attribute_values_outside_0_1_with_the_values(store, tmp_path, capsys):
    path = _with_column(store, tmp_path, [0, 1, 2])
    code = main(["fit", str(path), "--attribute", "Eyeglasses", "-k", "3",
                 "--out", str(tmp_path / "m"), "--scheduler", "tcp://127.0.0.1:1"])
    err = capsys.readouterr().err
    assert code == 2
    assert "attribute 'Eyeglasses'" in err and "holds the values 0, 1, 2" in err
    assert "must be 0/1 (or CelebA's -1/1)" in err
    assert not (tmp_path / "m").exists()


def test_cli_reads_celeba_minus_one_one_as_0_1(store, tmp_path, capsys, client):
    path = _with_column(store, tmp_path, [-1, 1, 1])
    code = main(["fit", str(path), "--attribute", "Eyeglasses", "-k", "3",
                 "--out", str(tmp_path / "m"), "--scheduler", client.scheduler.address])
    out = capsys.readouterr()
    assert code == 0, out.err
    assert "Eyeglasses: 200 with / 100 without" in out.out
    assert [list(g) for g in dfairpca.load(tmp_path / "m").groups_] == [[0, 1]]
