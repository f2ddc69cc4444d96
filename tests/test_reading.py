"""Reading is whole or an error: Zarr chunks, saved labels, saved models and checkpoints.

Real Zarr stores in tmp_path (written by dfairpca's own synth_celeba or by plain zarr),
chunks deleted or damaged with the file system, saved models edited byte by byte.
"""

import shutil

import numpy as np
import pytest
import zarr

import dfairpca
import dfairpca.io as dio
from dfairpca.celeba import attribute_column, open_celeba, synth_celeba
from dfairpca.cli import main
from dfairpca.io import CorruptChunkError, MissingChunkError

N, CHUNK, SIZE = 600, 200, 16


@pytest.fixture(scope="module")
def faces(tmp_path_factory):
    """A complete synthetic CelebA store: 600 faces of 16 x 16 in chunks of 200 rows."""
    path = tmp_path_factory.mktemp("reading") / "faces.zarr"
    synth_celeba(path, n=N, size=SIZE, chunk_rows=CHUNK, progress=False, n_jobs=1)
    return path


@pytest.fixture
def store(faces, tmp_path):
    """A private copy of ``faces`` that a test may damage."""
    path = tmp_path / "f.zarr"
    shutil.copytree(faces, path)
    return path


def run(args, capsys):
    code = main([str(a) for a in args])
    out = capsys.readouterr()
    return code, out.out, out.err


def one_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    return lines[0]


def _pixels(path):
    return zarr.open_group(str(path), mode="r")["images"][:].reshape(N, -1).astype(np.float64)


# ----------------------------------------------------------------------------- missing chunks
def test_cli_fit_refuses_a_missing_chunk(store, tmp_path, capsys):
    """Issue 10 item 3: the first chunk deleted was read as zeros and the fit exited 0."""
    (store / "images" / "c" / "0" / "0" / "0").unlink()
    code, out, err = run(["fit", store, "--attribute", "Eyeglasses", "-k", "5",
                          "--out", tmp_path / "m"], capsys)
    assert code == 2
    line = one_line(err)
    assert "images" in line and "'images/c/0/0/0'" in line and "rows 0-199" in line
    assert "missing_chunks='fill'" in line
    assert not (tmp_path / "m").exists()


def test_cli_transform_refuses_a_missing_chunk(store, tmp_path, capsys):
    g = open_celeba(store)
    X = g[0][:].reshape(N, -1)
    z = attribute_column(store, "Eyeglasses")
    dfairpca.FairPCA(3).fit(X, sensitive_features=z).save(tmp_path / "model")
    (store / "images" / "c" / "2" / "0" / "0").unlink()
    code, out, err = run(["transform", tmp_path / "model", store, "--out", tmp_path / "r.zarr"],
                         capsys)
    assert code == 2
    line = one_line(err)
    assert "'images/c/2/0/0'" in line and "rows 400-599" in line
    assert not (tmp_path / "r.zarr").exists()


def test_from_zarr_refuses_a_missing_chunk_before_any_work(store):
    (store / "images" / "c" / "1" / "0" / "0").unlink()
    with pytest.raises(MissingChunkError, match=r"'images/c/1/0/0' \(rows 200-399\)") as info:
        dfairpca.from_zarr(store, "images")
    assert info.value.key == "images/c/1/0/0"
    assert "\n" not in str(info.value)


@pytest.fixture
def unlisted(monkeypatch):
    """Stores too large to list up front: the read tasks alone must find a missing chunk."""
    monkeypatch.setattr(dio, "LISTING_LIMIT", 0)


def test_read_tasks_refuse_a_missing_chunk(store, unlisted):
    """fit, transform and compute all fail, naming the chunk, when it is read."""
    z = attribute_column(store, "Eyeglasses")
    model = dfairpca.FairPCA(3).fit(_pixels(store), sensitive_features=z)
    (store / "images" / "c" / "1" / "0" / "0").unlink()
    X = dfairpca.from_zarr(store, "images")  # no listing: opens fine
    match = r"'images/c/1/0/0' \(rows 200-399\)"
    with pytest.raises(MissingChunkError, match=match):
        dfairpca.FairPCA(3).fit(X, sensitive_features=z)
    with pytest.raises(MissingChunkError, match=match):
        dfairpca.PCA(3).fit(X, checkpoint=store.parent / "ck")
    with pytest.raises(MissingChunkError, match=match):
        model.transform(X.reshape(N, -1)).compute()
    with pytest.raises(MissingChunkError, match=match):
        X.sum().compute()
    # one Dask block over several store chunks: the absent one is still the one named
    with pytest.raises(MissingChunkError, match=match):
        dfairpca.from_zarr(store, "images", rows_per_chunk=N).mean().compute()
    # rows of other chunks still read
    np.testing.assert_array_equal(
        dfairpca.from_zarr(store, "images", rows_per_chunk=CHUNK)[:CHUNK].compute(),
        zarr.open_group(str(store), mode="r")["images"][:CHUNK],
    )


def test_missing_chunk_is_found_on_cluster_workers(store, unlisted, client):
    """The check travels with the graph: worker processes reading the store raise it."""
    (store / "images" / "c" / "2" / "0" / "0").unlink()
    X = dfairpca.from_zarr(store, "images", rows_per_chunk=CHUNK)
    with pytest.raises(MissingChunkError, match=r"'images/c/2/0/0' \(rows 400-599\)"):
        dfairpca.PCA(3).fit(X)
    assert float(X[:400].mean().compute()) > 50  # the chunks that exist read on workers


def test_fill_option_reads_absent_chunks_as_zarr_does(store):
    (store / "images" / "c" / "0" / "0" / "0").unlink()
    X = dfairpca.from_zarr(store, "images", missing_chunks="fill")
    assert float(X[:CHUNK].max().compute()) == 0  # the fill value, as requested
    assert float(X[CHUNK:].mean().compute()) > 50
    with pytest.raises(ValueError, match="missing_chunks must be 'error' or 'fill'"):
        dfairpca.from_zarr(store, "images", missing_chunks="zeros")


def test_attribute_column_refuses_a_missing_chunk(store):
    """Group labels of zeros would move faces between groups without a word."""
    (store / "attributes" / "c" / "1" / "0").unlink()
    with pytest.raises(MissingChunkError, match=r"'attributes/c/1/0' \(rows 200-399\)"):
        attribute_column(store, "Eyeglasses")
    with pytest.raises(MissingChunkError, match="attributes/c/1/0"):
        attribute_column(zarr.open_group(str(store), mode="r"), "Eyeglasses")


def test_constant_chunks_left_out_by_a_foreign_writer(tmp_path):
    """zarr skips chunks equal to the fill value unless told: 'fill' reads such stores."""
    X = np.arange(40 * 6, dtype=np.float64).reshape(40, 6)
    X[10:20] = 0.0
    arr = zarr.create_array(str(tmp_path / "x.zarr"), shape=X.shape, chunks=(10, 6),
                            dtype="float64", fill_value=0.0)
    arr[:] = X
    with pytest.raises(MissingChunkError, match=r"'c/1/0' \(rows 10-19\)"):
        dfairpca.from_zarr(tmp_path / "x.zarr")
    Y = dfairpca.from_zarr(tmp_path / "x.zarr", missing_chunks="fill")
    np.testing.assert_array_equal(Y.compute(), X)


@pytest.mark.parametrize("layout", ["v2", "v2-nested", "sharded"])
def test_other_chunk_layouts(tmp_path, layout, unlisted):
    """Keys of Zarr v2 ('1.0', '1/0') and of shards ('c/1/0' holding several chunks)."""
    X = np.arange(40 * 6, dtype=np.float64).reshape(40, 6) + 1
    path = tmp_path / "x.zarr"
    if layout == "sharded":
        arr = zarr.create_array(str(path), shape=X.shape, chunks=(5, 6), shards=(10, 6),
                                dtype="float64")
        key = "c/1/0"
    else:
        sep = "/" if layout == "v2-nested" else "."
        arr = zarr.create_array(str(path), shape=X.shape, chunks=(10, 6), dtype="float64",
                                zarr_format=2, chunk_key_encoding={"name": "v2", "separator": sep})
        key = f"1{sep}0"
    arr[:] = X
    np.testing.assert_array_equal(dfairpca.from_zarr(path).compute(), X)
    (path / key).unlink()
    with pytest.raises(MissingChunkError, match=rf"'{key}' \(rows 10-19\)"):
        dfairpca.from_zarr(path, rows_per_chunk=20).compute()


def test_listing_finds_missing_chunks_of_v2_and_sharded_stores(tmp_path):
    X = np.ones((40, 6))
    for name, kw, key in [
        ("v2.zarr", {"zarr_format": 2}, "3.0"),
        ("sh.zarr", {"chunks": (5, 6), "shards": (10, 6)}, "c/3/0"),
    ]:
        kw = {"chunks": (10, 6), **kw}
        arr = zarr.create_array(str(tmp_path / name), shape=X.shape, dtype="float64", **kw)
        arr[:] = X
        (tmp_path / name / key).unlink()
        with pytest.raises(MissingChunkError, match=rf"'{key}' \(rows 30-39\)"):
            dfairpca.from_zarr(tmp_path / name)


# ----------------------------------------------------------------------------- corrupt chunks
@pytest.mark.parametrize("damage", ["truncated", "garbage", "empty"])
def test_corrupt_chunk_is_one_line_naming_it(store, damage):
    chunk = store / "images" / "c" / "1" / "0" / "0"
    data = chunk.read_bytes()
    chunk.write_bytes({"truncated": data[: len(data) // 3],
                       "garbage": np.random.default_rng(0).bytes(len(data)),
                       "empty": b""}[damage])
    z = attribute_column(store, "Eyeglasses")
    X = dfairpca.from_zarr(store, "images")  # present, so the listing passes
    with pytest.raises(CorruptChunkError) as info:
        dfairpca.FairPCA(3).fit(X, sensitive_features=z)
    msg = str(info.value)
    assert "\n" not in msg and len(msg) < 600
    assert "'images/c/1/0/0' (rows 200-399)" in msg and "images" in msg
    assert info.value.__cause__ is None and info.value.__suppress_context__


def test_corrupt_attribute_chunk(store):
    (store / "attributes" / "c" / "0" / "0").write_bytes(b"not zstd")
    with pytest.raises(CorruptChunkError, match=r"'attributes/c/0/0' \(rows 0-199\)"):
        attribute_column(store, "Smiling")
