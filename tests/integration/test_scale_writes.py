"""The stores the command line writes, checked by content at the user's scale: float32
chunks over Dask's 128 MiB ``array.chunk-size`` (where ``to_zarr`` into an existing array
rechunks across Zarr chunks and loses rows), 3-D images, the demo's 20,000 held-out faces;
every row compared with the library's own transform of the same rows."""

import json

import numpy as np
import pytest
import zarr

import dfairpca
from dfairpca.celeba import synth_celeba
from dfairpca.cli import main

pytestmark = pytest.mark.scale


def run(args, capsys):
    code = main([str(a) for a in args])
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.fixture(scope="module")
def sched(client):
    return ["--scheduler", client.scheduler.address]


@pytest.fixture(scope="module")
def big_store(tmp_path_factory):
    """60,000 images of 32 x 32 uint8 in Zarr chunks of 36,000 rows (147 MB as float32) and a
    binary attribute that shifts the mean."""
    path = tmp_path_factory.mktemp("scale") / "big.zarr"
    rng = np.random.default_rng(0)
    n = 60_000
    g = (rng.random(n) < 0.3).astype(np.int8)
    X = np.clip(rng.normal(120, 40, size=(n, 32, 32)) + 30 * g[:, None, None]
                + np.linspace(0, 40, 32)[None, :, None], 0, 255).astype(np.uint8)
    root = zarr.open_group(str(path), mode="w")
    root.create_array("X", data=X, chunks=(36_000, 32, 32))
    root.create_array("g", data=g, chunks=(36_000,))
    return {"store": path, "X": X, "g": g}


def _written(path, name):
    arr = zarr.open_group(str(path), mode="r")[name]
    return arr, arr[:]


def _assert_rows_equal(got, want, rtol=1e-4):
    """Every row equal to the library's up to float32 rounding, relative to the row's scale."""
    got = got.reshape(len(got), -1).astype(np.float64)
    want = want.reshape(len(want), -1).astype(np.float64)
    off = np.abs(got - want).max(axis=1)
    scale = np.abs(want).max(axis=1) + 1e-30
    bad = np.flatnonzero(off > rtol * scale)
    assert bad.size == 0, f"{bad.size} wrong rows, e.g. {bad[:5]}"


def test_erase_and_transform_of_chunks_over_dask_chunk_size(big_store, tmp_path, capsys, sched):
    d = big_store
    code, out, err = run(["erase", d["store"], "--array", "X", "--sensitive-array", "g",
                          "--out", tmp_path / "erased.zarr", "--model", tmp_path / "eraser",
                          "--json", *sched], capsys)
    assert code == 0, err
    assert json.loads(out)["shape"] == [60_000, 32, 32]
    E, values = _written(tmp_path / "erased.zarr", "X")
    assert E.chunks == (36_000, 32, 32) and E.dtype == np.float32  # X's row chunks, 147 MB
    eraser = dfairpca.load(tmp_path / "eraser")
    _assert_rows_equal(values, eraser.transform(d["X"]))

    code, out, err = run(["fit", d["store"], "--array", "X", "--method", "pca", "-k", "12",
                          "--out", tmp_path / "pca", *sched], capsys)
    assert code == 0, err
    pca = dfairpca.load(tmp_path / "pca")
    code, out, err = run(["transform", tmp_path / "pca", d["store"], "--array", "X",
                          "--out", tmp_path / "rep.zarr", *sched], capsys)
    assert code == 0, err
    R, values = _written(tmp_path / "rep.zarr", "representation")
    assert R.chunks == (60_000, 12)  # 1.7 MB in X's row chunks: whole multiples, at least 8 MiB
    _assert_rows_equal(values, pca.transform(d["X"]))

    code, out, err = run(["transform", tmp_path / "pca", d["store"], "--array", "X", "--reconstruct",
                          "--out", tmp_path / "rec.zarr", *sched], capsys)
    assert code == 0, err
    B, values = _written(tmp_path / "rec.zarr", "X")
    assert B.chunks == (36_000, 32, 32) and B.dtype == np.uint8
    want = np.clip(np.round(pca.inverse_transform(pca.transform(d["X"]))), 0, 255)
    assert np.abs(values.reshape(60_000, -1).astype(float) - want).max() <= 1


def test_erase_of_the_demos_held_out_faces(tmp_path, capsys, sched):
    """The demo's 20,000 faces of 80 x 80: Zarr chunks of 2,048 faces, Dask blocks of 64 MB
    of uint8 (256 MB as float32, several Zarr chunks each)."""
    store = synth_celeba(tmp_path / "faces.zarr", n=20_000, size=80, progress=False, n_jobs=2)
    code, out, err = run(["erase", store, "--attribute", "Eyeglasses", "--out", tmp_path / "e.zarr",
                          "--model", tmp_path / "eraser", *sched], capsys)
    assert code == 0, err
    E, values = _written(tmp_path / "e.zarr", "images")
    X = dfairpca.from_zarr(store, "images")
    assert E.shape == X.shape and E.chunks[0] == zarr.open_group(str(store))["images"].chunks[0]
    eraser = dfairpca.load(tmp_path / "eraser")
    # the rows at every boundary of a Zarr chunk or a Dask block, and 2,000 more
    c = E.chunks[0]
    edges = np.unique(np.concatenate([np.cumsum((0,) + X.chunks[0][:-1]), np.arange(0, 20_000, c)]))
    rows = np.unique(np.concatenate([edges, edges - 1, np.random.default_rng(1).integers(0, 20_000, 2000)]))
    rows = rows[(rows >= 0) & (rows < 20_000)]
    _assert_rows_equal(values[rows], eraser.transform(X[rows].compute()))
