"""Reading is whole or an error: Zarr chunks, saved labels, saved models and checkpoints.

Real Zarr stores in tmp_path (written by dfairpca's own synth_celeba or by plain zarr),
chunks deleted or damaged with the file system, saved models edited byte by byte.
"""

import contextlib
import json
import os
import shutil
import sys

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
    assert code == 1
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
    assert code == 1
    line = one_line(err)
    assert "'images/c/2/0/0'" in line and "rows 400-599" in line
    assert not (tmp_path / "r.zarr").exists()


def test_cli_transform_does_not_copy_a_missing_attribute_chunk(store, tmp_path, capsys, client):
    """The attributes copied next to the representation are read whole or not at all."""
    X = open_celeba(store)[0][:].reshape(N, -1)
    z = attribute_column(store, "Eyeglasses")
    dfairpca.FairPCA(3).fit(X, sensitive_features=z).save(tmp_path / "model")
    (store / "attributes" / "c" / "1" / "0").unlink()
    code, out, err = run(["transform", tmp_path / "model", store, "--out", tmp_path / "r.zarr",
                          "--scheduler", client.scheduler.address], capsys)
    assert code == 1
    assert "'attributes/c/1/0' (rows 200-399)" in err.strip().splitlines()[-1]
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
    monkeypatch.setattr(dio._zarr, "LISTING_LIMIT", 0)  # where from_zarr reads it


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


def test_fill_holds_for_an_array_the_caller_opened_writable(tmp_path):
    """An array the caller opened writable (mode "a"): missing_chunks='fill' still fills,
    and the default still names the absent chunk."""
    X = np.arange(40 * 6, dtype=np.float64).reshape(40, 6)
    X[10:20] = 0.0
    zarr.create_array(str(tmp_path / "x.zarr"), shape=X.shape, chunks=(10, 6),
                      dtype="float64", fill_value=0.0)[:] = X
    opened = zarr.open_array(str(tmp_path / "x.zarr"), mode="a")
    Y = dfairpca.from_zarr(opened, missing_chunks="fill")
    np.testing.assert_array_equal(Y.compute(), X)
    with pytest.raises(MissingChunkError, match=r"'c/1/0' \(rows 10-19\)"):
        dfairpca.from_zarr(opened).compute()


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


# ----------------------------------------------------------------------------- sharded stores
# A shard holds several chunks and ends with an index of where each lies (zarr's default);
# zarr reads a shard of zero bytes, or a chunk its index marks as never written, as fill
# values.  Both readings: whole shards (blocks of 10 or 20 rows) and parts of one (5 rows,
# zarr fetches the index first, then the chunks it needs).
SHARDED = np.arange(40 * 6, dtype=np.float64).reshape(40, 6) + 1


def _sharded(path, X=SHARDED, shards=(10, 6), **kw):
    arr = zarr.create_array(str(path), shape=X.shape, chunks=(5, 6), shards=shards,
                            dtype=X.dtype, fill_value=0, **kw)
    arr[:] = X  # zarr's default (write_empty_chunks False): a chunk all fill value is left out
    return arr


def _address(path, via):
    return f"file://{path}" if via == "fsspec" else path


@pytest.mark.parametrize("via", ["local", "fsspec"])
@pytest.mark.parametrize("rows", [5, 10, 20])
def test_an_empty_shard_is_corrupt(tmp_path, via, rows):
    """An interrupted copy or a full disk leaves a shard of zero bytes: a valid one always
    holds its index, so this is damage, not a shard left out on purpose."""
    _sharded(tmp_path / "x.zarr")
    (tmp_path / "x.zarr" / "c" / "1" / "0").write_bytes(b"")
    X = dfairpca.from_zarr(_address(tmp_path / "x.zarr", via), rows_per_chunk=rows)
    with pytest.raises(CorruptChunkError) as info:
        X.compute()
    msg = str(info.value)
    assert "'c/1/0' (rows 10-19)" in msg and "0 bytes" in msg and "\n" not in msg
    assert info.value.__cause__ is None and info.value.__suppress_context__
    with pytest.raises(CorruptChunkError, match=r"'c/1/0' \(rows 10-19\)"):
        dfairpca.PCA(2).fit(X)


def _unwritten(path, **kw):
    """A sharded store whose chunk of rows 15-19 (the second chunk of shard 'c/1/0') was
    never written: its entry in the shard's index says so."""
    X = SHARDED.copy()
    X[15:20] = 0
    _sharded(path, X, **kw)
    return X


@pytest.mark.parametrize("via", ["local", "fsspec"])
@pytest.mark.parametrize("rows", [5, 10, 20])
def test_a_chunk_never_written_inside_a_shard_is_missing(tmp_path, via, rows):
    X = _unwritten(tmp_path / "x.zarr")
    Y = dfairpca.from_zarr(_address(tmp_path / "x.zarr", via), rows_per_chunk=rows)
    with pytest.raises(MissingChunkError) as info:
        Y.compute()
    msg = str(info.value)
    assert "chunk (1, 0) of shard 'c/1/0' (rows 15-19)" in msg, msg
    assert "missing_chunks='fill'" in msg and "\n" not in msg
    assert info.value.key == "c/1/0"
    with pytest.raises(MissingChunkError, match=r"shard 'c/1/0' \(rows 15-19\)"):
        dfairpca.FairPCA(2).fit(Y, sensitive_features=np.arange(40) % 2)
    # asked for, the fill values zarr reads
    filled = dfairpca.from_zarr(_address(tmp_path / "x.zarr", via), rows_per_chunk=rows,
                                missing_chunks="fill")
    np.testing.assert_array_equal(filled.compute(), X)


def test_shard_index_at_the_start(tmp_path):
    from zarr.codecs import ShardingCodec

    X = SHARDED.copy()
    X[15:20] = 0
    arr = zarr.create_array(str(tmp_path / "x.zarr"), shape=X.shape, dtype=X.dtype,
                            chunks=(10, 6), fill_value=0, compressors=None,
                            serializer=ShardingCodec(chunk_shape=(5, 6), index_location="start"))
    arr[:] = X
    for rows in (5, 10):
        with pytest.raises(MissingChunkError, match=r"shard 'c/1/0' \(rows 15-19\)"):
            dfairpca.from_zarr(tmp_path / "x.zarr", rows_per_chunk=rows).compute()
    (tmp_path / "x.zarr" / "c" / "3" / "0").write_bytes(b"")
    with pytest.raises(CorruptChunkError, match=r"'c/3/0' \(rows 30-39\)"):
        dfairpca.from_zarr(tmp_path / "x.zarr", rows_per_chunk=10)[30:].compute()
    # cut short by its last chunk (5 x 6 float64, stored as they are), its index whole:
    # zarr, reading part of the shard, found no bytes there and filled it
    shard = tmp_path / "x.zarr" / "c" / "2" / "0"
    shard.write_bytes(shard.read_bytes()[:-240])
    for rows, where in [(5, r"shard 'c/2/0' \(rows 20-29\)"),
                        (10, r"chunk \(1, 0\) of shard 'c/2/0' \(rows 25-29\)")]:
        with pytest.raises(CorruptChunkError, match=where):
            dfairpca.from_zarr(tmp_path / "x.zarr", rows_per_chunk=rows)[20:30].compute()


@pytest.mark.filterwarnings("ignore:Combining a `sharding_indexed` codec")
def test_shards_that_cannot_be_checked_are_refused(tmp_path):
    """A codec after sharding compresses the whole shard, index included: zarr reads a
    chunk never written inside it as fill values, and dfairpca cannot see it."""
    from zarr.codecs import ShardingCodec

    X = SHARDED
    arr = zarr.create_array(str(tmp_path / "x.zarr"), shape=X.shape, dtype=X.dtype,
                            chunks=(10, 6), serializer=ShardingCodec(chunk_shape=(5, 6)))
    arr[:] = X
    with pytest.raises(ValueError, match=r"cannot check the shards.*'sharding_indexed', 'zstd'"
                       r".*missing_chunks='fill'"):
        dfairpca.from_zarr(tmp_path / "x.zarr")
    np.testing.assert_array_equal(
        dfairpca.from_zarr(tmp_path / "x.zarr", missing_chunks="fill").compute(), X)


def test_complete_sharded_stores_read_whole(tmp_path):
    """No false alarm: a shard at the array's edge leaves out the chunk past its last row
    (zarr never writes it), and a store written whole reads whole either way."""
    X = SHARDED[:37]
    _sharded(tmp_path / "edge.zarr", X, shards=(15, 6))  # last shard: rows 30-44 of 37
    for rows in (5, 15, 37):
        np.testing.assert_array_equal(
            dfairpca.from_zarr(tmp_path / "edge.zarr", rows_per_chunk=rows).compute(), X)


def test_never_written_chunk_is_found_in_a_pickled_array(tmp_path):
    """What a worker process gets: the array unpickled, its shards still checked."""
    import pickle

    _unwritten(tmp_path / "x.zarr")
    X = pickle.loads(pickle.dumps(dfairpca.from_zarr(tmp_path / "x.zarr", rows_per_chunk=10)))
    with pytest.raises(MissingChunkError, match=r"shard 'c/1/0' \(rows 15-19\)"):
        X.compute(scheduler="sync")


@pytest.mark.filterwarnings("ignore:Consolidated metadata")
def test_never_written_chunk_of_a_strict_group(tmp_path):
    """Arrays opened from a group that refuses absent chunks (CelebA's attributes)."""
    g = zarr.open_group(str(tmp_path / "g.zarr"), mode="w")
    X = SHARDED.copy()
    X[15:20] = 0
    g.create_array("x", shape=X.shape, chunks=(5, 6), shards=(10, 6), dtype=X.dtype,
                   fill_value=0)[:] = X
    zarr.consolidate_metadata(str(tmp_path / "g.zarr"))
    for consolidated in (False, True):
        group = zarr.open_group(str(tmp_path / "g.zarr"), mode="r", use_consolidated=consolidated)
        with pytest.raises(MissingChunkError, match=r"shard 'x/c/1/0' \(rows 15-19\)"):
            dio.read_checked(dio.strict_group(group)["x"], slice(None))


# ----------------------------------------------------------------------------- saved labels
def _labelled(labels, n=240, seed=0):
    """(X, z): z takes every label, X's group means differ."""
    rng = np.random.default_rng(seed)
    codes = np.arange(n) % len(labels)
    X = rng.normal(size=(n, 6)) + codes[:, None] * np.linspace(0.5, 1.0, 6)
    return X, codes


LABELS = {
    "uint64 >= 2**63": np.array([2**63, 2**64 - 1], dtype=np.uint64),
    "int64 extremes": np.array([-(2**63), 2**63 - 1], dtype=np.int64),
    "negative ints": np.array([-7, -1, 3]),
    "int8": np.array([-3, 4], dtype=np.int8),
    "bools": np.array([False, True]),
    "floats": np.array([-0.5, 1e-300, 0.1, 1e300]),
    "float32": np.array([0.1, 2.5], dtype=np.float32),
    "unicode": np.array(["x", "été", "日本語"]),
}


@pytest.mark.parametrize("name", list(LABELS) + ["categorical str", "categorical int"])
def test_labels_round_trip_through_save_and_load(name, tmp_path):
    """Issue 10 item 7: uint64 labels >= 2**63 raised OverflowError on load."""
    import pandas as pd

    if name.startswith("categorical"):
        cats = ["b", "a", "c"] if name.endswith("str") else [30, 10, 20]
        X, codes = _labelled(cats)
        z = pd.Series(pd.Categorical(np.asarray(cats, dtype=object)[codes]))
        expected = np.sort(np.asarray(cats))
    else:
        labels = LABELS[name]
        X, codes = _labelled(labels)
        z, expected = labels[codes], np.sort(labels)
    model = dfairpca.FairPCA(2).fit(X, sensitive_features=z)
    model.save(tmp_path / "m", statistics=True)
    back = dfairpca.load(tmp_path / "m")
    for got in (back.groups_[0], back.statistics_.attributes[0].categories):
        assert got.dtype == model.groups_[0].dtype
        np.testing.assert_array_equal(got, expected)
    np.testing.assert_allclose(back.transform(X), model.transform(X), rtol=0, atol=1e-12)
    kernel = dfairpca.FairKernelPCA(2, n_landmarks=40).fit(X, sensitive_features=z)
    kernel.save(tmp_path / "k")
    got = dfairpca.load(tmp_path / "k").groups_[0]
    assert got.dtype == kernel.groups_[0].dtype and np.array_equal(got, expected)


@pytest.mark.parametrize("labels, reason", [
    (np.array(["2020-01-01", "2021-06-30"], dtype="datetime64[D]"), "datetime64"),
    (np.array([1 + 1j, 2 - 1j]), "complex128"),
    (np.array([b"a", b"b"]), r"\|S1"),
])
def test_labels_that_cannot_round_trip_are_refused_at_save(labels, reason, tmp_path):
    X, codes = _labelled(labels)
    model = dfairpca.FairPCA(2).fit(X, sensitive_features=labels[codes])
    with pytest.raises(ValueError, match=rf"labels of dtype {reason}.*cannot be saved"):
        model.save(tmp_path / "m")
    assert not (tmp_path / "m").exists()
    with pytest.raises(ValueError, match="cannot be saved"):
        model.statistics_.save(tmp_path / "s")
    assert not (tmp_path / "s").exists()


def test_object_labels_are_kept_only_if_of_one_kind():
    from dfairpca.io._moments_format import categories_from_json as _categories_from_json, categories_to_json as _categories_to_json

    for values, kind in [(["a", "b"], "U"), ([1, 2**64 - 1], "u"), ([-1, 5], "i"),
                         ([False, True], "b"), ([0.5, 2.0], "f")]:
        saved = _categories_to_json(np.array(values, dtype=object))
        assert saved["kind"] == kind
        assert _categories_from_json(saved).tolist() == values
    for values, reason in [([1, "1"], r"\['int', 'str'\]"), ([object(), object()], r"\['object'\]"),
                           ([2**70, 1], r"\['int'\]"), ([True, 2], r"\['bool', 'int'\]")]:
        with pytest.raises(ValueError, match=rf"labels of types {reason}.*cannot be saved"):
            _categories_to_json(np.array(values, dtype=object))


def test_labels_of_the_first_format_still_load():
    """Files written before the dtype was recorded: uint64 labels load without overflow."""
    from dfairpca.io._moments_format import categories_from_json as _categories_from_json

    got = _categories_from_json({"kind": "u", "values": [3, 2**64 - 1]})
    assert got.dtype == np.uint64 and got[1] == 2**64 - 1
    assert _categories_from_json({"kind": "i", "values": [-1, 4]}).dtype == np.int64
    assert _categories_from_json({"kind": "U", "values": ["a", "b"]}).tolist() == ["a", "b"]


# ----------------------------------------------------------------------------- loading
from dfairpca.io import SavedFileError  # noqa: E402


def _fair_model(tmp_path, **kw):
    X, codes = _labelled(np.array([0, 1, 2]), n=300)
    model = dfairpca.FairPCA(2, **kw).fit(X, sensitive_features=codes)
    model.save(tmp_path / "m", statistics=True)
    return tmp_path / "m", X


def _edit_meta(path, fn):
    import json

    file = path / "meta.json"
    meta = json.loads(file.read_text())
    fn(meta)
    file.write_text(json.dumps(meta))


def _edit_arrays(path, fn, where=""):
    file = path / where / "arrays.npz"
    with np.load(file) as z:
        arrays = {k: z[k] for k in z.files}
    fn(arrays)
    np.savez(file, **arrays)


def _refused(path, *patterns, load=dfairpca.load):
    with pytest.raises(SavedFileError) as info:
        load(path)
    msg = str(info.value)
    assert "\n" not in msg and str(path) in msg, msg
    for p in patterns:
        assert p in msg, msg
    return msg


def test_truncated_files_are_named(tmp_path):
    path, _ = _fair_model(tmp_path)
    npz = path / "arrays.npz"
    data = npz.read_bytes()
    npz.write_bytes(data[: len(data) // 2])
    _refused(path, "arrays.npz is not a complete zip archive")
    npz.write_bytes(data)
    meta = path / "meta.json"
    meta.write_text(meta.read_text()[:40])
    _refused(path, "meta.json is not valid JSON")
    meta.write_text("[1, 2]")
    _refused(path, "meta.json holds a list, not a JSON object")


@pytest.mark.parametrize("edit, message", [
    (lambda m: m.pop("n_components_"), "meta.json has no 'n_components_'"),
    (lambda m: m.update(n_components_="2"), "'n_components_' must be an integer >= 1; got '2'"),
    (lambda m: m.update(n_features_in_=True), "'n_features_in_' must be an integer >= 1"),
    (lambda m: m.update(n_components_=3), "'components_' has shape (2, 6), but meta.json and "
                                          "the other arrays say (3, 6)"),
    (lambda m: m.update(n_features_in_=7), "has shape (2, 6), but meta.json and the other "
                                           "arrays say (2, 7)"),
    (lambda m: m["groups_"][0]["values"].append(3), "'group_means_0' has shape (3, 6), but "
                                                    "meta.json and the other arrays say (4, 6)"),
    (lambda m: m["groups_"][0]["values"].reverse(), "are not distinct, sorted values"),
    (lambda m: m["groups_"][0].update(dtype="|O"), "do not match their dtype object"),
    (lambda m: m["groups_"][0].update(values=[0, 1, 2**64]), "do not fit dtype int64"),
    (lambda m: m.update(attribute_names_=[]), "'attribute_names_' must name each of the 1"),
    (lambda m: m.update(n_constraints_=5), "components and 5 constraints exceed 6 features"),
    (lambda m: m.update({"class": "Pipeline"}), "'class' must be one of ['PCA', 'FairPCA', "
                                                "'FairKernelPCA', 'ConceptEraser']"),
    (lambda m: m["params"].update(n_components=-1), "'params': n_components must be a positive"),
    (lambda m: m["params"].update(solver="x"), "'params' has keys ['solver'] that FairPCA "
                                               "does not take"),
    (lambda m: m.update(params=[]), "'params' must be a dict"),
    (lambda m: m.update(format_version=-1), "'format_version' must be an integer >= 0"),
])
def test_meta_json_is_checked_against_the_class(tmp_path, edit, message):
    path, _ = _fair_model(tmp_path)
    _edit_meta(path, edit)
    _refused(path, str(path), message)


@pytest.mark.parametrize("edit, message", [
    (lambda a: a.update(mean_=np.zeros(7)), "'mean_' has shape (7,), but meta.json and the "
                                            "other arrays say (6,)"),
    (lambda a: a.pop("components_"), "arrays.npz has no 'components_'"),
    (lambda a: a.update(components_=a["components_"].astype(np.int64)),
     "'components_' has dtype int64, expected kind 'f'"),
    (lambda a: a["components_"].__setitem__((0, 0), np.nan), "'components_' holds NaN"),
    (lambda a: a.update(components_=2 * a["components_"]), "rows of 'components_' are not "
                                                           "orthonormal"),
    (lambda a: a.update(components_=np.linalg.qr(
        np.vstack([a["constraint_basis_"][:, 0], a["components_"][1]]).T)[0].T),
     "not orthogonal to 'constraint_basis_' (the model is not fair)"),
    (lambda a: a.update(junk=np.zeros(1 << 18)), "'junk' declares (262144,) float64 (2097152 "
                                                 "bytes), more than any array"),
    (lambda a: a.update(junk=np.array([b"x"], dtype="V1")), "'junk' has dtype |V1, not a plain"),
])
def test_arrays_are_checked_against_meta_and_each_other(tmp_path, edit, message):
    path, _ = _fair_model(tmp_path)
    _edit_arrays(path, edit)
    _refused(path, message)


def test_pickled_object_arrays_are_never_unpickled(tmp_path):
    """np.load(allow_pickle=True) would run a pickle's code; dfairpca refuses to."""
    path, _ = _fair_model(tmp_path)
    _edit_arrays(path, lambda a: a.update(mean_=np.array([object()] * 6, dtype=object)))
    _refused(path, "'mean_' is an array of Python objects", "never unpickles")


def test_declared_sizes_are_checked_before_any_data_is_read(tmp_path):
    """A header declaring 8 TB (a zip bomb, or an edited header) is refused from the header."""
    import zipfile

    path, _ = _fair_model(tmp_path)
    npz = path / "arrays.npz"
    with zipfile.ZipFile(npz) as zf:
        members = {i.filename: zf.read(i) for i in zf.infolist()}
    raw = members["mean_.npy"]
    members["mean_.npy"] = raw.replace(b"(6,)", b"(1000000000000,)".ljust(4)) \
        .replace(b"'shape': (1000000000000,), }", b"'shape': (1000000000000,)}", 1)
    with zipfile.ZipFile(npz, "w") as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    _refused(path, "'mean_' declares (1000000000000,) float64 (8000000000000 bytes) but the "
                   "archive holds")
    # a compressed member (savez_compressed) could inflate far beyond its bytes on disk
    with np.load(npz) as z:
        arrays = {k: z[k] for k in z.files if k != "mean_"}
    np.savez_compressed(npz, mean_=np.zeros(6), **arrays)
    _refused(path, "'mean_' is compressed", "dfairpca stores arrays uncompressed")


def test_kernel_models_are_checked(tmp_path):
    X, codes = _labelled(np.array([0, 1]), n=200)
    dfairpca.FairKernelPCA(2, n_landmarks=30).fit(X, sensitive_features=codes).save(tmp_path / "k")
    path = tmp_path / "k"
    assert dfairpca.load(path).method_ == "nystroem"
    for edit, message in [
        (lambda m: m["params"].update(kernel="os.system"), "kernel 'os.system' is not one of "
                                                           "['rbf', 'poly', 'sigmoid', 'linear']"),
        (lambda m: m.update(gamma_=None), "'gamma_' None does not suit the rbf kernel"),
        (lambda m: m.update(method_="magic"), "'method_' must be one of ['exact', 'nystroem']"),
        (lambda m: m.update(n_landmarks_=31), "'basis_' has shape (30, 6), but meta.json and "
                                              "the other arrays say (31, 6)"),
        (lambda m: m["params"].update(tradeoff=0.5), "'dual_coef_' has shape (30, 2), but "
                                                     "meta.json and the other arrays say (30, 4)"),
    ]:
        shutil.copytree(path, tmp_path / "edit")
        _edit_meta(tmp_path / "edit", edit)
        _refused(tmp_path / "edit", message)
        shutil.rmtree(tmp_path / "edit")
    _edit_arrays(path, lambda a: a["basis_indices_"].__setitem__(0, 10**6))
    _refused(path, "'basis_indices_' points outside the 200 fitted rows")


def test_statistics_are_checked_and_bound_to_their_model(tmp_path):
    path, X = _fair_model(tmp_path)
    stats = path / "statistics"
    _edit_arrays(path, lambda a: a["counts_0"].__setitem__(0, a["counts_0"][0] + 1),
                 where="statistics")
    _refused(stats, "the group counts 'counts_0' do not add up to n = 300",
             load=dfairpca.Moments.load)
    _refused(path, "counts_0")
    other, _ = _fair_model(tmp_path / "other")
    shutil.rmtree(stats)
    shutil.copytree(other / "statistics", stats)
    assert dfairpca.load(path).statistics_.n == 300  # same shape: a valid pair
    dfairpca.PCA(2).fit(np.random.default_rng(1).normal(size=(50, 4))).statistics_.save(
        tmp_path / "s4")
    shutil.rmtree(stats)
    shutil.copytree(tmp_path / "s4", stats)
    _refused(path, "statistics/ hold 4 features and 0 attributes, the model 6 and 1")
    _edit_arrays(path, lambda a: a.update(scatter=np.zeros((5, 4))), where="statistics")
    _refused(path, "'scatter' has shape (5, 4), but meta.json and the other arrays say (4, 4)")


class _Stop(Exception):
    pass


@pytest.fixture
def checkpoint(tmp_path, stop_after):
    """A real checkpoint: a pass interrupted after its first of three segments."""
    import dask.array as da

    from dfairpca.engine.checkpoint import compute_moments_checkpointed

    X = da.from_array(np.random.default_rng(2).normal(size=(300, 5)), chunks=(100, 5))
    path = tmp_path / "ck"

    with pytest.raises(_Stop):
        compute_moments_checkpointed(X, checkpoint=path, segment_rows=100, on_segment=stop_after(0, _Stop))
    return path, X


def _resume(path, X):
    from dfairpca.engine.checkpoint import compute_moments_checkpointed

    return compute_moments_checkpointed(X, checkpoint=path, segment_rows=100)


@pytest.mark.parametrize("edit, message", [
    (lambda p: p.update(segments=[[0, 100], [150, 300]]), "segment [150, 300] does not "
                                                           "continue the row ranges at row 100"),
    (lambda p: p.update(done=[0, 0]), "'done' [0, 0] is not a list of distinct segment indices"),
    (lambda p: p.update(done=[7]), "is not a list of distinct segment indices below 3"),
    (lambda p: p.update(version="2"), "'version' must be an integer"),
    (lambda p: p.pop("fingerprint"), "progress.json has no 'fingerprint'"),
    (lambda p: p.update(done=[]), "its total counts 100 rows, more than the 0 of its finished"),
])
def test_checkpoints_are_checked(checkpoint, edit, message):
    import json

    path, X = checkpoint
    file = path / "progress.json"
    progress = json.loads(file.read_text())
    edit(progress)
    file.write_text(json.dumps(progress))
    with pytest.raises(SavedFileError) as info:
        _resume(path, X)
    assert message in str(info.value) and "progress.json" in str(info.value)


def test_checkpoint_total_is_checked(checkpoint):
    path, X = checkpoint
    npz = path / "total" / "arrays.npz"
    npz.write_bytes(npz.read_bytes()[:-100])
    from dfairpca.engine.checkpoint import CheckpointMismatch

    # its digest finds it before the archive is opened
    with pytest.raises(CheckpointMismatch, match=r"its saved total \(total/\) does not match the digest"):
        _resume(path, X)
    # a checkpoint of version 3 (no digest of its total) is still read whole or refused
    progress = json.loads((path / "progress.json").read_text())
    progress["version"] = 3
    (path / "progress.json").write_text(json.dumps(progress))
    with pytest.raises(SavedFileError, match=r"total.*arrays.npz is not a complete zip"):
        _resume(path, X)


# ----------------------------------------------------------------------------- files that are no files
# A folder shared as an archive can hold, in place of a file dfairpca wrote, a named pipe
# (reading it waits for a writer forever) or a link to a character device (/dev/zero
# never ends); the size the file system reports is 0 for both.
@contextlib.contextmanager
def _bounded(seconds: int = 10, memory: int = 1 << 30):
    """Fail, rather than hang (SIGALRM interrupts a blocked open) or fill the machine's
    memory (the address space may grow by ``memory`` only), if a regression reads on."""
    import resource
    import signal

    def stop(signum, frame):
        raise TimeoutError(f"still reading after {seconds} s")

    with open("/proc/self/status") as f:
        used = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))
    limits = resource.getrlimit(resource.RLIMIT_AS)
    bound = used + memory if limits[1] == resource.RLIM_INFINITY else min(used + memory, limits[1])
    handler = signal.signal(signal.SIGALRM, stop)
    resource.setrlimit(resource.RLIMIT_AS, (bound, limits[1]))
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, handler)
        resource.setrlimit(resource.RLIMIT_AS, limits)


def _replace(file, kind, elsewhere):
    """Put a named pipe, a link to /dev/zero or a link to an intact copy (in the folder
    ``elsewhere``) where ``file`` was."""
    if kind == "copy":
        copy = elsewhere / f"copy-of-{file.name}"
        shutil.copyfile(file, copy)
    file.unlink()
    if kind == "fifo":
        os.mkfifo(file)
    else:
        file.symlink_to("/dev/zero" if kind == "zero" else copy)


def _saved_files(tmp_path, checkpoint):
    """{what: (file, how to read its folder)} for every kind of folder dfairpca loads."""
    path, X = _fair_model(tmp_path)
    stats = tmp_path / "s"
    dfairpca.Moments.load(path / "statistics").save(stats)
    ck, Xc = checkpoint
    return {
        "model meta.json": (path / "meta.json", lambda: dfairpca.load(path)),
        "model arrays.npz": (path / "arrays.npz", lambda: dfairpca.load(path)),
        "statistics meta.json": (stats / "meta.json", lambda: dfairpca.Moments.load(stats)),
        "statistics arrays.npz": (stats / "arrays.npz", lambda: dfairpca.Moments.load(stats)),
        "checkpoint progress.json": (ck / "progress.json", lambda: _resume(ck, Xc)),
        "checkpoint total": (ck / "total" / "meta.json", lambda: _resume(ck, Xc)),
    }


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc, named pipes")
@pytest.mark.parametrize("kind", ["fifo", "zero", "copy"])
@pytest.mark.parametrize("what", ["model meta.json", "model arrays.npz", "statistics meta.json",
                                  "statistics arrays.npz", "checkpoint progress.json",
                                  "checkpoint total"])
def test_only_regular_files_are_read(tmp_path, checkpoint, what, kind):
    """A named pipe, a device or a link in place of a saved file is refused at once,
    naming it; a link is refused even to an intact copy (dfairpca never writes one)."""
    file, read = _saved_files(tmp_path, checkpoint)[what]
    _replace(file, kind, tmp_path)
    with _bounded(), pytest.raises(ValueError) as info:
        read()
    msg = str(info.value)
    assert "\n" not in msg and str(file.parent) in msg and file.name in msg, msg
    assert {"fifo": "named pipe", "zero": "symbolic link", "copy": "symbolic link"}[kind] in msg, msg
    assert "not a regular file" in msg
    if what.startswith(("model", "statistics")):
        assert isinstance(info.value, SavedFileError)


@pytest.mark.parametrize("what", ["statistics"])
def test_a_folder_dfairpca_wrote_is_not_read_through_a_link(tmp_path, what):
    """The folders inside a saved model are read where they are, not where a link leads
    (out of the folder given), even to an intact copy.  (A checkpoint refuses a link as an
    entry it did not write, before reading.)"""
    path, _ = _fair_model(tmp_path)
    folder = path / what
    shutil.copytree(folder, tmp_path / "elsewhere")
    shutil.rmtree(folder)
    folder.symlink_to(tmp_path / "elsewhere")
    with pytest.raises(SavedFileError) as info:
        dfairpca.load(path)
    msg = str(info.value)
    assert "\n" not in msg and f"{folder.name} is a symbolic link, not a folder" in msg, msg
    assert str(folder.parent) in msg


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc, named pipes")
def test_a_named_pipe_in_place_of_a_lock_file_is_not_waited_on(tmp_path):
    """An output's lock file is opened only to lock it; a pipe there must not block."""
    from dfairpca.io._writes import exclusive

    os.mkfifo(tmp_path / "lock")
    with _bounded(), exclusive(tmp_path / "lock", "the output"):
        pass
    assert (tmp_path / "lock").exists()  # not dfairpca's: left as it was


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc, named pipes")
@pytest.mark.parametrize("kind", ["fifo", "zero", "copy"])
def test_a_marker_that_is_no_file_marks_nothing(tmp_path, kind):
    """The folder is then not dfairpca's: an overwrite is refused, not read through a link."""
    from dfairpca.io import MARKER, OutputPathError, read_marker

    path, _ = _fair_model(tmp_path)
    assert read_marker(path) is not None
    _replace(path / MARKER, kind, tmp_path)
    with _bounded():
        assert read_marker(path) is None
        with pytest.raises(OutputPathError):
            dfairpca.load(path).save(path, overwrite=True)


def test_saved_json_is_read_up_to_a_cap(tmp_path, monkeypatch):
    """A file larger than any dfairpca writes is refused after reading one byte past the
    cap, whatever size the file system reports; an object at a URL too."""
    import fsspec

    import dfairpca.io._files
    from dfairpca.io import _fsspec

    path, _ = _fair_model(tmp_path)
    size = len((path / "meta.json").read_bytes())
    monkeypatch.setattr(dfairpca.io._files, "MAX_JSON_BYTES", size - 1)
    _refused(path, f"meta.json holds more than {size - 1} bytes")
    monkeypatch.setattr(dfairpca.io._files, "MAX_JSON_BYTES", size)
    dfairpca.load(path)

    fsspec.filesystem("memory").pipe_file("/capped/progress.json", b"{}" + b" " * 100)
    monkeypatch.setattr(dfairpca.io._files, "MAX_JSON_BYTES", 101)
    with pytest.raises(SavedFileError, match="progress.json holds more than 101 bytes"):
        _fsspec.read_text("memory://capped/progress.json")
    monkeypatch.setattr(dfairpca.io._files, "MAX_JSON_BYTES", 102)
    assert _fsspec.read_text("memory://capped/progress.json").strip() == "{}"


def test_cli_names_a_damaged_model(faces, tmp_path, capsys):
    path, _ = _fair_model(tmp_path)
    _edit_meta(path, lambda m: m.update(n_components_=3))
    code, out, err = run(["transform", path, faces, "--out", tmp_path / "r.zarr"], capsys)
    assert code == 1
    assert "'components_' has shape (2, 6)" in one_line(err)


# ------------------------------------------------------------------ malformed metadata
def _store_with(tmp_path, name: str, edit=None, text: str | None = None, root: bool = False):
    """A real store with one array X whose zarr.json (the root's with ``root``) is edited."""
    import json

    path = tmp_path / f"{name}.zarr"
    g = zarr.open_group(str(path), mode="w")
    g.create_array("X", shape=(20, 4), chunks=(5, 4), dtype="f8")[:] = np.arange(80.0).reshape(20, 4)
    meta = path / ("zarr.json" if root else "X/zarr.json")
    if text is not None:
        meta.write_text(text)
    else:
        doc = json.loads(meta.read_text())
        edit(doc)
        meta.write_text(json.dumps(doc))
    return path


def _grid(doc, chunks):
    doc["chunk_grid"]["configuration"]["chunk_shape"] = chunks


MALFORMED = [
    ("deep", {"text": "[" * 100_000 + "]" * 100_000}, "nested too deeply"),
    ("deep_root", {"text": '{"a":' * 100_000 + "1" + "}" * 100_000, "root": True}, "nested too deeply"),
    ("huge", {"edit": lambda d: d.update(shape=[10**12, 10**6])}, "chunks, over the 1,073,741,824"),
    ("dtype", {"edit": lambda d: d.update(data_type="|O")}, "No Zarr data type found"),
    ("codec", {"edit": lambda d: d.update(codecs=[{"name": "pickle"}])}, "Unknown codec: 'pickle'"),
    ("zero", {"edit": lambda d: _grid(d, [0, 4])}, "chunk shape [0, 4] is not 2 integers >= 1"),
    ("shape", {"edit": lambda d: d.update(shape=[20, "4"])}, "is not a list of integers"),
]


@pytest.mark.parametrize("name, how, why", MALFORMED, ids=[m[0] for m in MALFORMED])
def test_malformed_metadata_is_one_line_before_any_work(tmp_path, capsys, name, how, why):
    """Checked before zarr parses it: a RecursionError, MemoryError, ZeroDivisionError or
    zarr's ValueError with a traceback was what these stores gave."""
    path = _store_with(tmp_path, name, **how)
    doc = "zarr.json" if how.get("root") else "X/zarr.json"
    with pytest.raises(dio.MalformedStoreError, match="is not valid Zarr metadata") as e:
        dfairpca.from_zarr(path, "X")
    assert why in str(e.value) and f"{name}.zarr/{doc}" in str(e.value) and "\n" not in str(e.value)
    code, out, err = run(["fit", path, "--array", "X", "-k", "1", "--out", tmp_path / "m"], capsys)
    assert code == 1 and why in one_line(err) and not (tmp_path / "m").exists()


def test_oversized_metadata_is_refused_unread(tmp_path, monkeypatch):
    from dfairpca.io import _metadata

    path = _store_with(tmp_path, "big", edit=lambda d: d.update(attributes={"pad": "x" * 5000}))
    monkeypatch.setattr(_metadata, "MAX_METADATA_BYTES", 4096)
    with pytest.raises(_metadata.MalformedStoreError, match=r"over the 4,096 a metadata document may"):
        dfairpca.from_zarr(path, "X")


def test_an_array_path_with_dot_parts_is_one_line(tmp_path, capsys):
    path = _store_with(tmp_path, "dots", edit=lambda d: None)
    with pytest.raises(ValueError, match=r"without '\.' or '\.\.' parts"):
        dfairpca.from_zarr(path, "sub/../X")
    code, out, err = run(["fit", path, "--array", "sub/../sub/X", "-k", "1", "--out", tmp_path / "m"],
                         capsys)
    assert code == 2 and "without '.' or '..' parts" in one_line(err)
    # and a well-formed store still reads as before
    np.testing.assert_array_equal(dfairpca.from_zarr(path, "X").compute(), np.arange(80.0).reshape(20, 4))


def test_an_array_added_to_a_store_after_dfairpca_wrote_it_is_read(tmp_path):
    """dfairpca's stores carry consolidated metadata for other readers (xarray); dfairpca
    itself reads the members as stored, so an array a user added since is found."""
    from dfairpca.celeba import synth_celeba
    from dfairpca.celeba.schema import open_group

    store = synth_celeba(tmp_path / "s.zarr", n=30, size=8, progress=False, n_jobs=1)
    zarr.open_group(str(store), mode="r+", use_consolidated=False).create_array(
        "my_labels", data=np.arange(60.0).reshape(30, 2))
    assert "my_labels" not in zarr.open_group(str(store), mode="r")  # the consolidated copy
    np.testing.assert_array_equal(dfairpca.from_zarr(store, "my_labels").compute(),
                                  np.arange(60.0).reshape(30, 2))
    assert "my_labels" in open_group(store)


# ------------------------------------------------------- chunks that inflate past their array
# A chunk's codec allocates what the chunk's bytes say (a gzip stream inflates to whatever it
# holds, a zstd, blosc or lz4 header names a size); the array's metadata says what a chunk
# holds.  Each codec's chunk 1 replaced by 1 MiB of zeros encoded by that codec (a few kB):
# refused before zarr decodes it, naming the chunk, while the untouched store reads whole.
INFLATED = 1 << 20


def _zstd_streamed(data: bytes) -> bytes:
    """A zstd frame of ``data`` without its content size (as a streaming writer leaves it):
    numcodecs then decodes it in a stream with no bound."""
    from numcodecs import Zstd

    frame = Zstd().encode(data)
    assert frame[4] == 0xA0  # one segment (no window byte), then a 4-byte content size
    # neither: a window byte (2**21 bytes, over the data's) and no content size
    return frame[:4] + bytes([0, 0x58]) + frame[9:]


def _codec_cases():
    import numcodecs
    from zarr.codecs import BloscCodec, Crc32cCodec, GzipCodec, ZstdCodec

    def crc(data: bytes) -> bytes:
        import google_crc32c

        return data + google_crc32c.value(data).to_bytes(4, "little")

    zeros = bytes(INFLATED)
    return {
        "gzip": ({"compressors": [GzipCodec()]}, numcodecs.GZip().encode(zeros)),
        "gzip+crc32c": ({"compressors": [GzipCodec(), Crc32cCodec()]},
                        crc(numcodecs.GZip().encode(zeros))),
        "gzip-members": ({"compressors": [GzipCodec()]},  # numcodecs reads every member
                         numcodecs.GZip().encode(bytes(1000)) * (INFLATED // 1000)),
        "zstd": ({"compressors": [ZstdCodec()]}, numcodecs.Zstd().encode(zeros)),
        "zstd-streamed": ({"compressors": [ZstdCodec()]}, _zstd_streamed(zeros)),
        "blosc": ({"compressors": [BloscCodec()]}, numcodecs.Blosc().encode(zeros)),
        "v2-zlib": ({"zarr_format": 2, "compressors": numcodecs.Zlib()}, numcodecs.Zlib().encode(zeros)),
        "v2-bz2": ({"zarr_format": 2, "compressors": numcodecs.BZ2()}, numcodecs.BZ2().encode(zeros)),
        "v2-lzma": ({"zarr_format": 2, "compressors": numcodecs.LZMA()}, numcodecs.LZMA().encode(zeros)),
        "v2-lz4": ({"zarr_format": 2, "compressors": numcodecs.LZ4()}, numcodecs.LZ4().encode(zeros)),
        "v2-zstd": ({"zarr_format": 2, "compressors": numcodecs.Zstd()}, numcodecs.Zstd().encode(zeros)),
        "v2-delta-gzip": ({"zarr_format": 2, "filters": [numcodecs.Delta("i8")],
                           "compressors": numcodecs.GZip()}, numcodecs.GZip().encode(bytes(4 * INFLATED))),
    }


CODEC_CASES = list(_codec_cases())


@pytest.mark.parametrize("case", CODEC_CASES)
def test_a_chunk_that_inflates_past_its_array_is_refused_before_decoding(tmp_path, case):
    kw, bomb = _codec_cases()[case]
    X = np.arange(400 * 32, dtype=np.int64).reshape(400, 32)  # chunks of 100 x 32: 25,600 bytes
    path = tmp_path / "x.zarr"
    zarr.create_array(str(path), shape=X.shape, chunks=(100, 32), dtype=X.dtype, **kw)[:] = X
    np.testing.assert_array_equal(dfairpca.from_zarr(path).compute(), X)  # read whole
    key = "1.0" if kw.get("zarr_format") == 2 else "c/1/0"
    (path / key).write_bytes(bomb)
    assert len(bomb) < INFLATED // 8 or case == "gzip-members"
    for X in (dfairpca.from_zarr(path), dfairpca.from_zarr(path, missing_chunks="fill"),
              dfairpca.from_zarr(zarr.open_array(str(path), mode="r"))):
        with pytest.raises(CorruptChunkError) as e:
            X.compute(scheduler="sync")
        msg = str(e.value)
        assert f"chunk '{key}' (rows 100-199)" in msg and "x.zarr" in msg and "\n" not in msg, msg
        assert "data decodes to " in msg and "bytes, where a chunk of this array holds" in msg, msg


def test_a_gzip_chunk_of_a_gigabyte_is_refused_in_bounded_memory(tmp_path):
    """A gzip chunk of 1 GiB of zeros (about 1 MB stored) in an array of 25,600-byte
    chunks: zarr inflated all of it (3.4 GB peak) before finding the size wrong.  Read in
    a fresh process whose peak memory is measured."""
    import subprocess
    import zlib

    X = np.ones((400, 32))
    path = tmp_path / "x.zarr"
    from zarr.codecs import GzipCodec

    zarr.create_array(str(path), shape=X.shape, chunks=(100, 32), dtype="f8",
                      compressors=[GzipCodec()])[:] = X
    gzip = zlib.compressobj(1, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    block = bytes(16 << 20)
    with open(path / "c" / "1" / "0", "wb") as out:
        for _ in range(64):
            out.write(gzip.compress(block))
        out.write(gzip.flush())
    # the peak of this process's own memory (VmHWM, kB): ru_maxrss would include the
    # pytest process's peak, which Linux keeps across the fork and exec that start it
    script = (
        "import re, sys, dfairpca\n"
        "try:\n"
        f"    dfairpca.from_zarr({str(path)!r}).compute(scheduler='sync')\n"
        "except dfairpca.io.CorruptChunkError as e:\n"
        "    print(e)\n"
        "try:\n"
        "    kb = re.search(r'VmHWM:\\s+(\\d+)', open('/proc/self/status').read()).group(1)\n"
        "except OSError:  # no /proc (macOS: bytes, and the parent's peak may show)\n"
        "    import resource\n"
        "    kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024\n"
        "print(int(kb) // 1024)\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    said, peak = done.stdout.strip().splitlines()
    assert "chunk 'c/1/0' (rows 100-199)" in said and "gzip data decodes to more than 25,600" in said, done
    assert int(peak) < 600, f"peak {peak} MiB"


OPENED = [m for m in MALFORMED if m[0] != "deep_root"]  # zarr cannot open that group itself


@pytest.mark.parametrize("name, how, why", OPENED, ids=[m[0] for m in OPENED])
def test_malformed_metadata_of_a_store_opened_by_zarr_is_one_line(tmp_path, name, how, why):
    """A group the caller opened with zarr: its members' metadata is read for the first
    time by from_zarr, checked as a path's; an array zarr opened (it accepts a chunk shape
    with a 0 and a shape of 1e18 items) is reread checked."""
    path = _store_with(tmp_path, name, **how)
    with pytest.raises(dio.MalformedStoreError, match="is not valid Zarr metadata") as e:
        dfairpca.from_zarr(zarr.open_group(str(path), mode="r"), "X")
    assert why in str(e.value) and "\n" not in str(e.value)
    try:
        array = zarr.open_array(str(path / "X"), mode="r")
    except Exception:  # noqa: BLE001 - zarr's own refusal, in the caller's call
        return
    with pytest.raises(dio.MalformedStoreError) as e:
        dfairpca.from_zarr(array)
    assert why in str(e.value)
    with pytest.raises(dio.MalformedStoreError) as e:  # as sample weights too
        dfairpca.PCA(1).fit(np.ones((20, 4)), sample_weight=array)
    assert why in str(e.value)


def _shard(chunks: list[bytes]) -> bytes:
    """A shard of ``chunks`` in zarr's default layout: the chunks, then an index of
    (offset, length) uint64 pairs and its CRC32C."""
    import google_crc32c

    index, at = [], 0
    for chunk in chunks:
        index += [at, len(chunk)]
        at += len(chunk)
    table = np.array(index, dtype="<u8").tobytes()
    return b"".join(chunks) + table + google_crc32c.value(table).to_bytes(4, "little")


@pytest.mark.parametrize("rows", [100, 200])
def test_a_chunk_inside_a_shard_that_inflates_past_its_array_is_refused(tmp_path, rows):
    """Read whole (200 rows: zarr fetches the shard, every chunk in it is checked) or a
    chunk at a time (100 rows: zarr fetches the index, then each chunk's bytes)."""
    import numcodecs

    X = np.arange(400 * 32, dtype=np.int64).reshape(400, 32)
    path = tmp_path / "x.zarr"
    zarr.create_array(str(path), shape=X.shape, chunks=(100, 32), shards=(200, 32),
                      dtype=X.dtype)[:] = X  # inner codecs: bytes, zstd
    np.testing.assert_array_equal(dfairpca.from_zarr(path, rows_per_chunk=rows).compute(), X)
    zstd = numcodecs.Zstd()
    (path / "c" / "1" / "0").write_bytes(_shard([zstd.encode(X[200:300].tobytes()),
                                                 zstd.encode(bytes(INFLATED))]))
    with pytest.raises(CorruptChunkError) as e:
        dfairpca.from_zarr(path, rows_per_chunk=rows).compute(scheduler="sync")
    where = "chunk (1, 0) of shard 'c/1/0' (rows 300-399)" if rows == 200 else \
        "shard 'c/1/0' (rows 200-399)"
    assert where in str(e.value) and "zstd data decodes to 1,048,576 bytes, where a chunk of " \
        "this array holds 25,600" in str(e.value), str(e.value)
    # the first chunk of that shard is whole: read alone, it reads
    np.testing.assert_array_equal(dfairpca.from_zarr(path, rows_per_chunk=100)[200:300].compute(),
                                  X[200:300])
