"""Input the estimators must refuse clearly or handle: NaN/inf at transform, sparse
matrices, Dask arrays of unknown chunk sizes, and CLI attributes outside 0/1.  Real numpy,
scipy, pandas and Dask objects; real Zarr stores.  Group labels: test_groups.py."""

import threading

import dask
import dask.array as da
import numpy as np
import pandas as pd
import pytest
import scipy.sparse as sp
import zarr

import dfairpca
from dfairpca.engine._compute import with_known_rows
from dfairpca.celeba import synth_celeba
from dfairpca.cli import main


@pytest.fixture(scope="module")
def data(two_groups):
    return two_groups(600, 8, seed=7, shift=0.7, spread=True)


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


@pytest.fixture(scope="module")
def fitted(data):
    """Each of ``ESTIMATORS`` fitted on ``data`` once (the tests that use them only transform)."""
    return {kind: _fitted(kind, *data) for kind in ESTIMATORS}


def _spoiled(X, cells: dict):
    """A copy of X holding ``value`` at every ``(row, column): value`` of ``cells``."""
    Xb = X.copy()
    for (i, j), value in cells.items():
        Xb[i, j] = value
    return Xb


# ----------------------------------------------------------------------------- NaN / inf
@pytest.mark.parametrize("kind", ESTIMATORS)
def test_transform_names_nan_and_inf_rows_of_numpy_input_at_once(data, fitted, kind):
    X, z = data
    est = fitted[kind]
    Xb = _spoiled(X, {(5, 2): np.nan, (301, 0): -np.inf})
    with pytest.raises(ValueError, match=r"NaN or infinity in 2 row\(s\) \(rows 5, 301\); drop or impute"):
        est.transform(Xb)
    with pytest.raises(ValueError, match=r"in 1 row\(s\) \(rows 5\)"):
        est.transform(Xb[:300].astype(np.float32))


@pytest.mark.parametrize("kind", ESTIMATORS)
def test_transform_of_dask_input_stays_lazy_and_names_global_rows_at_compute(data, fitted, kind):
    X, z = data
    est = fitted[kind]
    Xb = _spoiled(X, {(250, 4): np.nan, (251, 1): np.inf})
    Y = est.transform(da.from_array(Xb, chunks=(100, -1)))  # nothing computed: no error yet
    assert isinstance(Y, da.Array)
    good = Y[:200].compute()  # the clean chunks compute
    np.testing.assert_allclose(good, est.transform(X[:200]), rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match=r"NaN or infinity in 2 row\(s\) \(rows 250, 251\)"):
        Y.compute()


def test_unknown_chunk_sizes_name_the_chunk_and_how_to_get_global_rows(data):
    X, z = data
    est = dfairpca.PCA(3).fit(X)
    Xb = X.copy()
    Xb[:, 0] = np.abs(Xb[:, 0]) + 1  # every row passes the mask below
    Xb[150, 3] = np.nan
    Xd = da.from_array(Xb, chunks=(100, -1))
    Xm = Xd[Xd[:, 0] > 0]
    with pytest.raises(ValueError, match=r"rows 50 of row chunk 1; .*X.compute_chunk_sizes\(\)"):
        est.transform(Xm).compute()
    Xm.compute_chunk_sizes()
    with pytest.raises(ValueError, match=r"\(rows 150\)"):
        est.transform(Xm).compute()


def test_integer_input_is_not_checked_and_projects_exactly(data):
    X, z = data
    Xi = np.clip(X * 20 + 128, 0, 255).astype(np.uint8)
    est = dfairpca.FairPCA(3).fit(Xi, sensitive_features=z)
    Y = est.transform(da.from_array(Xi, chunks=(128, -1))).compute()
    ref = (Xi.astype(np.float64) - est.mean_) @ est.components_.T
    np.testing.assert_allclose(Y, ref, rtol=1e-4, atol=1e-3)


def test_overflow_of_finite_input_says_compute_dtype_float64(data):
    X, z = data
    est = dfairpca.PCA(3, compute_dtype="float32").fit(X)
    Xb = X.copy()
    Xb[9] = 1e39  # finite in float64, infinite once cast to the float32 compute dtype
    with pytest.raises(ValueError, match=r"projection of 1 row\(s\) \(rows 9\) overflows "
                                         r"float32 .*compute_dtype='float64'"):
        est.transform(Xb)


def test_nan_in_a_nystroem_pass_names_the_row(data):
    X, z = data
    Xb = X.copy()
    est = dfairpca.FairKernelPCA(2, n_landmarks=20, random_state=0)
    landmarks = set(np.random.default_rng(0).choice(len(X), 20, replace=False).tolist())
    row = next(r for r in range(400, 600) if r not in landmarks)
    Xb[row, 0] = np.nan
    with pytest.raises(ValueError, match=rf"NaN or infinity in 1 row\(s\) \(rows {row}\)"):
        est.fit(da.from_array(Xb, chunks=(150, -1)), sensitive_features=z)


# ----------------------------------------------------------------------------- sparse
SPARSE = [sp.csr_matrix, sp.csr_array, sp.coo_matrix]
CALLS = [("PCA", "fit"), ("PCA", "partial_fit"), ("PCA", "transform"),
         ("FairPCA", "fit"), ("FairPCA", "partial_fit"), ("FairPCA", "transform"),
         ("FairKernelPCA", "fit"), ("FairKernelPCA", "transform")]


@pytest.mark.parametrize("fmt", SPARSE, ids=lambda f: f.__name__)
@pytest.mark.parametrize("kind,method", CALLS)
def test_sparse_input_is_refused_naming_how_to_densify(data, fitted, fmt, kind, method):
    X, z = data
    S = fmt(X[:200])
    if method == "transform":
        call = lambda: fitted[kind].transform(S)  # noqa: E731
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


# ----------------------------------------------------------------------------- unknown chunks
def _masked(X, z, y=None):
    """X, z (and y) as Dask arrays filtered by the same condition on X: unknown chunks."""
    Xd = da.from_array(X, chunks=(100, -1))
    keep = Xd[:, 0] > -1.0
    out = [Xd[keep], da.from_array(z, chunks=100)[keep]]
    if y is not None:
        out.append(da.from_array(y, chunks=100)[keep])
    assert np.isnan(out[0].shape[0]) and np.isnan(out[1].shape[0])
    return out, X[:, 0] > -1.0


def test_pca_fit_and_transform_on_unknown_chunk_sizes(data):
    X, z = data
    (Xm, _), keep = _masked(X, z)
    est = dfairpca.PCA(3).fit(Xm)
    ref = dfairpca.PCA(3).fit(X[keep])
    assert est.n_samples_seen_ == keep.sum()
    assert _angle(est.components_, ref.components_) < 1e-6
    np.testing.assert_allclose(est.transform(Xm).compute(), ref.transform(X[keep]), atol=1e-8)
    part = dfairpca.PCA(3).partial_fit(Xm)
    assert _angle(part.components_, ref.components_) < 1e-6


@pytest.mark.parametrize("labels", ["dask", "numpy", "pandas"])
def test_fair_pca_on_x_and_groups_masked_the_same_way(data, labels):
    X, z = data
    (Xm, zm), keep = _masked(X, z)
    groups = {"dask": zm, "numpy": z[keep], "pandas": pd.Series(z[keep])}[labels]
    est = dfairpca.FairPCA(3).fit(Xm, sensitive_features=groups)
    ref = dfairpca.FairPCA(3).fit(X[keep], sensitive_features=z[keep])
    assert _angle(est.components_, ref.components_) < 1e-6
    Y = est.transform(Xm).compute()
    zk = z[keep]
    assert np.abs(Y[zk == 1].mean(0) - Y[zk == 0].mean(0)).max() < 1e-8


def test_fair_pca_partial_fit_and_equal_opportunity_on_unknown_chunks(data):
    X, z = data
    y = (X[:, 1] > 0).astype(int)
    (Xm, zm, ym), keep = _masked(X, z, y)
    eo = dfairpca.FairPCA(2, constraint="equal_opportunity").fit(Xm, ym, sensitive_features=zm)
    ref = dfairpca.FairPCA(2, constraint="equal_opportunity").fit(
        X[keep], y[keep], sensitive_features=z[keep])
    assert _angle(eo.components_, ref.components_) < 1e-6
    part = dfairpca.FairPCA(2).partial_fit(Xm, sensitive_features=zm)
    ref = dfairpca.FairPCA(2).fit(X[keep], sensitive_features=z[keep])
    assert _angle(part.components_, ref.components_) < 1e-6


@pytest.mark.parametrize("landmarks", [None, 60])
def test_fair_kernel_pca_on_unknown_chunks(data, landmarks):
    X, z = data
    (Xm, zm), keep = _masked(X[:300], z[:300])
    kw = dict(n_landmarks=landmarks, random_state=0)
    est = dfairpca.FairKernelPCA(2, **kw).fit(Xm, sensitive_features=zm)
    ref = dfairpca.FairKernelPCA(2, **kw).fit(X[:300][keep], sensitive_features=z[:300][keep])
    np.testing.assert_allclose(
        np.abs(est.transform(Xm).compute()), np.abs(ref.transform(X[:300][keep])), atol=1e-6)


def test_images_of_unknown_chunk_sizes_are_flattened(data):
    X, z = data
    imgs = X.reshape(len(X), 2, 4)
    Id = da.from_array(imgs, chunks=(100, 2, 4))
    keep = X[:, 0] > -1.0
    est = dfairpca.FairPCA(2).fit(Id[Id[:, 0, 0] > -1.0], sensitive_features=z[keep])
    ref = dfairpca.FairPCA(2).fit(X[keep], sensitive_features=z[keep])
    assert _angle(est.components_, ref.components_) < 1e-6


def test_groups_that_do_not_line_up_with_the_rows_are_refused(data):
    X, z = data
    (Xm, _), keep = _masked(X, z)
    zd = da.from_array(z, chunks=100)
    other = zd[zd >= 0]  # all 600 labels, unknown chunks: more than X's rows
    with pytest.raises(ValueError, match=rf"600 labels but X has {keep.sum()} rows"):
        dfairpca.FairPCA(2).fit(Xm, sensitive_features=other)


def test_sizes_and_labels_are_computed_in_one_read_of_each_chunk(data):
    X, z = data
    reads, lock = [0], threading.Lock()

    def read(b):
        with lock:
            reads[0] += 1
        return b

    Xd = da.from_array(X, chunks=(100, -1)).map_blocks(read, dtype=X.dtype)
    keep = Xd[:, 0] > -1.0
    reads[0] = 0  # map_blocks called read once on an empty array to learn its output type
    with dask.config.set(scheduler="threads"):  # counted in this process, even with a Client
        Xk, zk = with_known_rows(Xd[keep], da.from_array(z, chunks=100)[keep])
    assert reads[0] == 6  # six chunks, each read once for both the sizes and the labels
    assert Xk.chunks[0] == tuple(int(keep[i:i + 100].sum().compute()) for i in range(0, 600, 100))
    np.testing.assert_array_equal(zk, z[X[:, 0] > -1.0])


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


# ----------------------------------------------------------------------------- on a cluster
def test_lazy_error_travels_from_a_distributed_worker(data, client):
    X, z = data
    est = dfairpca.FairPCA(3).fit(X, sensitive_features=z)
    Xb = _spoiled(X, {(444, 0): np.nan})
    with pytest.raises(ValueError, match=r"\(rows 444\)"):
        est.transform(da.from_array(Xb, chunks=(100, -1))).compute()
