"""Remote stores end to end: a real S3-compatible server (moto's standalone server, its own
process on loopback) and a cluster of two worker processes that reach it only through the
storage options in the task graph (their environment holds no credentials)."""

import contextlib
import importlib.util
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest
import zarr
from scipy.linalg import subspace_angles

import dfairpca
import dfairpca.celeba.ingest
import dfairpca.celeba.synth
from dfairpca.io import _fsspec, _marker, _urls
from dfairpca.io._marker import ACTIVE
from dfairpca.io._writes import STAGE_ENV, stage_folder
from dfairpca.celeba import ingest_celeba, synth_celeba, write_celeba_jpegs
from dfairpca.cli import main
from dfairpca.io import OutputPathError

N, SIZE, CHUNK = 1200, 12, 100


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def clean_environment():
    """No AWS variables or files in this process (nor in the workers it starts): every test
    says where the server is and who it is, or checks the error when it does not."""
    saved = dict(os.environ)
    for name in [n for n in os.environ if n.startswith("AWS_")]:
        del os.environ[name]
    os.environ.update({"AWS_EC2_METADATA_DISABLED": "true", "AWS_CONFIG_FILE": "/nonexistent",
                       "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent"})
    yield
    os.environ.clear()
    os.environ.update(saved)


@contextlib.contextmanager
def _server(folder):
    """moto's S3 server on a free loopback port, with the bucket "data"; yields the
    storage options that reach it, and stops it at the end."""
    with _moto(folder) as (_, options):
        yield options


@contextlib.contextmanager
def _moto(folder):
    """``(process, storage options)`` of :func:`_server`: the process, to freeze it."""
    import s3fs

    port = _free_port()
    log = folder / "server.log"
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p",
                                 str(port)], stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
                time.sleep(0.1)
        options = {"key": "testing", "secret": "testing",
                   "endpoint_url": f"http://127.0.0.1:{port}"}
        s3fs.S3FileSystem(**options).mkdir("data")
        yield proc, options
    finally:
        proc.send_signal(signal.SIGCONT)  # a frozen server cannot act on SIGTERM
        proc.terminate()
        proc.wait(timeout=30)


@pytest.fixture(scope="module")
def s3(clean_environment, tmp_path_factory):
    """The module's S3 server (see :func:`_server`)."""
    with _server(tmp_path_factory.mktemp("moto")) as options:
        yield options


@pytest.fixture(scope="module", autouse=True)
def stage_root(tmp_path_factory):
    """Stores for URLs are staged in a folder of the test's, not in the user's cache."""
    with pytest.MonkeyPatch.context() as mp:
        root = tmp_path_factory.mktemp("stages")
        mp.setenv(STAGE_ENV, str(root))
        yield root


@pytest.fixture(scope="module")
def cluster(clean_environment):
    """Two worker processes started without any AWS variable."""
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                      dashboard_address=None, memory_limit="2GiB") as lc, Client(lc) as c:
        yield c


def _faces(path):
    """A small CelebA-layout store: 8 patterns of well separated variance plus noise, and
    one attribute that moves the mean."""
    rng = np.random.default_rng(0)
    z = (rng.random(N) < 0.3).astype(np.int8)
    g = zarr.open_group(str(path), mode="w", attributes=dfairpca.io.marker_attributes("store"))
    patterns = np.linalg.qr(rng.normal(size=(SIZE * SIZE, 8)))[0].T
    x = 100 + (rng.normal(size=(N, 8)) * 400 * 0.7 ** np.arange(8)) @ patterns
    x += rng.normal(scale=5, size=x.shape) + 20 * z[:, None]
    g.create_array("images", shape=(N, SIZE, SIZE), chunks=(CHUNK, SIZE, SIZE),
                   dtype="uint8")[:] = np.clip(np.round(x), 0, 255).reshape(N, SIZE, SIZE)
    a = g.create_array("attributes", shape=(N, 1), chunks=(N, 1), dtype="int8")
    a[:] = z[:, None]
    a.attrs["names"] = ["Eyeglasses"]
    return z


@pytest.fixture(scope="module")
def faces(s3, tmp_path_factory):
    """(url, local copy, z): the same small store on the server and on disk."""
    import s3fs

    local = tmp_path_factory.mktemp("faces") / "faces.zarr"
    z = _faces(local)
    s3fs.S3FileSystem(**s3).put(str(local), "data/faces.zarr", recursive=True)
    return "s3://data/faces.zarr", local, z


def _fs(options):
    import s3fs

    fs = s3fs.S3FileSystem(**options)
    fs.invalidate_cache()
    return fs


def run(args, capsys):
    code = main([str(a) for a in args])
    out = capsys.readouterr()
    return code, out.out, out.err


def _angle(a, b) -> float:
    return float(np.max(subspace_angles(a.components_.T, b.components_.T)))


def test_fit_reads_from_s3_on_the_cluster_and_equals_the_local_fit(s3, faces, cluster):
    url, local, z = faces
    # the workers hold no credentials: what reaches the server travels in the graph
    assert set(cluster.run(lambda: os.environ.get("AWS_ACCESS_KEY_ID")).values()) == {None}
    X = dfairpca.from_zarr(url, "images", storage_options=s3)
    assert X.npartitions == 1 and X.shape == (N, SIZE, SIZE)  # 12 x 12 bytes: one 64 MiB block
    X = dfairpca.from_zarr(url, "images", rows_per_chunk=CHUNK, storage_options=s3)
    remote = dfairpca.FairPCA(5).fit(X.reshape(N, -1), sensitive_features=z)
    here = dfairpca.FairPCA(5).fit(dfairpca.from_zarr(local, "images").reshape(N, -1),
                                   sensitive_features=z)
    assert _angle(remote, here) < 1e-6  # float32 products, summed in another order
    np.testing.assert_allclose(remote.explained_variance_, here.explained_variance_, rtol=1e-6)
    assert remote.fairness_violation_ < 1e-6


def test_a_checkpoint_on_s3_is_interrupted_then_resumed(s3, faces, cluster, stop_after):
    from dfairpca.engine.checkpoint import PassInterrupted, compute_moments_checkpointed

    url, local, z = faces
    X = dfairpca.from_zarr(url, "images", rows_per_chunk=CHUNK, storage_options=s3).reshape(N, -1)
    ckpt = "s3://data/runs/fit.checkpoint"
    stop = stop_after(1)
    with pytest.raises(PassInterrupted) as info:
        compute_moments_checkpointed(X, sensitive_features=z, checkpoint=ckpt, segment_rows=300,
                                     on_segment=stop, storage_options=s3)
    assert info.value.chunks_done == 6 and stop.seen == [0, 1]
    progress = json.loads(_fs(s3).cat_file("data/runs/fit.checkpoint/progress.json"))
    assert progress["done"] == [0, 1]
    assert dfairpca.io.read_marker(ckpt, storage_options=s3)["kind"] == "checkpoint"
    # resumed from the server: only the two unfinished segments are computed
    seen = []
    m = compute_moments_checkpointed(X, sensitive_features=z, checkpoint=ckpt, segment_rows=300,
                                     on_segment=lambda i, n: seen.append(i), storage_options=s3)
    assert seen == [2, 3]
    ref = dfairpca.compute_moments(dfairpca.from_zarr(local, "images").reshape(N, -1),
                                   sensitive_features=z)
    np.testing.assert_allclose(m.covariance(), ref.covariance(), rtol=1e-9, atol=1e-9)
    dfairpca.io.remove_directory(ckpt, "checkpoint", storage_options=s3)
    assert _fs(s3).find("data/runs") == []  # nor any temporary sibling or journal
    # an estimator's checkpoint: a URL with its options is an fsspec mapper
    import fsspec

    est = dfairpca.FairPCA(3).fit(X, sensitive_features=z,
                                  checkpoint=fsspec.get_mapper("s3://data/runs/est", **s3))
    assert est.fairness_violation_ < 1e-6 and _fs(s3).find("data/runs") == []  # deleted after


def test_cli_fit_with_urls_resumes_an_s3_checkpoint_and_transform_writes_back(
        s3, faces, cluster, capsys, stop_after, tmp_path, monkeypatch):
    from dfairpca.engine.checkpoint import compute_moments_checkpointed
    from dfairpca.stats._auto import AUTO_ENV
    from dfairpca.stats._exact import statistics_dtype

    # "auto" measured here and on the workers could differ where the kernels are close:
    # the environment decides for both
    monkeypatch.setenv(AUTO_ENV, "exact")

    url, local, z = faces
    so = ["--storage-options", json.dumps(s3), "--scheduler", cluster.scheduler.address]
    model, ckpt = "s3://data/models/fair", "s3://data/models/fair.checkpoint"
    X = dfairpca.from_zarr(url, "images", rows_per_chunk=CHUNK, storage_options=s3).reshape(N, -1)
    import pandas as pd

    with pytest.raises(KeyboardInterrupt):  # the pass the command runs, stopped half-way
        compute_moments_checkpointed(X, sensitive_features=pd.DataFrame({"Eyeglasses": z}),
                                     checkpoint=ckpt, dtype=statistics_dtype(np.uint8),  # the CLI's
                                     on_segment=stop_after(0), segment_rows=600, storage_options=s3)
    fit = ["fit", url, "--attribute", "Eyeglasses", "-k", "5", "--out", model,
           "--rows-per-chunk", CHUNK, *so]
    code, _, err = run(fit, capsys)
    assert code == 1 and "--resume" in err, err
    code, out, err = run([*fit, "--resume", "--json"], capsys)
    assert code == 0, err
    summary = json.loads(out)
    assert summary["out"] == model and summary["n"] == N
    fs = _fs(s3)
    assert not fs.exists("data/models/fair.checkpoint")
    assert sorted(fs.ls("data/models", detail=False)) == ["data/models/fair"]  # no leftovers
    assert dfairpca.io.read_marker(model, storage_options=s3)["kind"] == "model"
    got = dfairpca.load(model, storage_options=s3)
    ref = dfairpca.FairPCA(5).fit(dfairpca.from_zarr(local, "images").reshape(N, -1),
                                  sensitive_features=z)
    assert _angle(got, ref) < 1e-4
    # the API saves to a URL given with its options as an fsspec mapper
    import fsspec

    got.save(fsspec.get_mapper("s3://data/copies/fair", **s3))
    again = dfairpca.load("s3://data/copies/fair", storage_options=s3)
    np.testing.assert_array_equal(again.components_, got.components_)

    # transform reads the model and the data from the server and writes its result there
    rep = "s3://data/out/rep.zarr"
    code, out, err = run(["transform", model, url, "--out", rep, "--json", *so], capsys)
    assert code == 0, err
    assert json.loads(out)["out"] == rep
    Y = dfairpca.from_zarr(rep, "representation", storage_options=s3).compute()
    expected = got.transform(dfairpca.from_zarr(local, "images").reshape(N, -1)).compute()
    np.testing.assert_allclose(Y, expected, rtol=1e-6, atol=1e-6)
    g = zarr.open_group("s3://data/out/rep.zarr", mode="r", storage_options=s3)
    np.testing.assert_array_equal(g["attributes"][:, 0], z)  # the labels travel along
    assert dfairpca.io.read_marker(rep, storage_options=s3)["kind"] == "transform output"
    assert sorted(_fs(s3).ls("data/out", detail=False)) == ["data/out/rep.zarr"]
    # its own output is replaced only when asked, and then atomically (no leftovers)
    code, _, err = run(["transform", model, url, "--out", rep, *so], capsys)
    assert code == 1 and "already exists" in err and "--overwrite" in err, err
    code, _, err = run(["transform", model, url, "--out", rep, "--reconstruct", "--overwrite",
                        *so], capsys)
    assert code == 0, err
    g = zarr.open_group("s3://data/out/rep.zarr", mode="r", storage_options=s3)
    assert sorted(g.keys()) == ["attribute", "attributes", "images"]  # the old representation is gone
    assert sorted(_fs(s3).ls("data/out", detail=False)) == ["data/out/rep.zarr"]


def test_environment_credentials_reach_the_workers_through_the_graph(s3, faces, cluster, tmp_path):
    """The command in a child process with the usual AWS variables and no --storage-options,
    on the cluster whose workers have none: the endpoint and credentials travel."""
    url, local, z = faces
    env = dict(os.environ, AWS_ACCESS_KEY_ID=s3["key"], AWS_SECRET_ACCESS_KEY=s3["secret"],
               AWS_ENDPOINT_URL=s3["endpoint_url"])
    out = subprocess.run(
        [sys.executable, "-m", "dfairpca", "fit", url, "--attribute", "Eyeglasses", "-k", "3",
         "--out", tmp_path / "m", "--scheduler", cluster.scheduler.address, "--json"],
        env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["n"] == N
    ref = dfairpca.FairPCA(3).fit(dfairpca.from_zarr(local, "images").reshape(N, -1),
                                  sensitive_features=z)
    assert _angle(dfairpca.load(tmp_path / "m"), ref) < 1e-4


def test_ingest_writes_to_s3(s3, tmp_path, capsys):
    from PIL import Image

    from dfairpca.celeba import ingest_celeba
    from dfairpca.celeba.schema import ATTRIBUTE_NAMES

    root = tmp_path / "celeba"
    (root / "img_align_celeba").mkdir(parents=True)
    rng = np.random.default_rng(1)
    values = rng.choice([-1, 1], size=(12, 40))
    lines = ["12", " ".join(ATTRIBUTE_NAMES)]
    for i in range(12):
        name = f"{i + 1:06d}.jpg"
        Image.fromarray(rng.integers(0, 255, (218, 178, 3), dtype=np.uint8)).save(
            root / "img_align_celeba" / name, quality=90)
        lines.append(name + "".join(f" {v}" for v in values[i]))
    (root / "list_attr_celeba.txt").write_text("\n".join(lines) + "\n")
    url = "s3://data/ingested/celeba.zarr"
    code, _, err = run(["ingest-celeba", root, url, "--size", "16", "--storage-options",
                        json.dumps(s3)], capsys)
    assert code == 0, err
    ingest_celeba(root, tmp_path / "local.zarr", size=16, progress=False, n_jobs=1)
    here = zarr.open_group(str(tmp_path / "local.zarr"), mode="r")
    there = zarr.open_group(url, mode="r", storage_options=s3)
    np.testing.assert_array_equal(there["images"][:], here["images"][:])
    np.testing.assert_array_equal(there["attributes"][:], (values > 0).astype(np.int8))
    assert dfairpca.io.read_marker(url, storage_options=s3)["kind"] == "store"
    assert _fs(s3).ls("data/ingested", detail=False) == ["data/ingested/celeba.zarr"]
    # the API, with the options given there
    with pytest.raises(OutputPathError, match="already exists"):
        ingest_celeba(root, url, size=16, progress=False, n_jobs=1, storage_options=s3)
    # and the synthetic store, written the same way
    code, _, err = run(["synth-celeba", "s3://data/ingested/synth.zarr", "--n", "40", "--size", "8",
                        "--storage-options", json.dumps(s3)], capsys)
    assert code == 0, err
    assert zarr.open_group("s3://data/ingested/synth.zarr", mode="r",
                           storage_options=s3)["images"].shape == (40, 8, 8)


NO_CLUSTER = ["--scheduler", "tcp://127.0.0.1:9", "--timeout", "1"]


def test_a_prefix_dfairpca_did_not_write_is_never_replaced(s3, faces, capsys, tmp_path):
    from dfairpca.engine.checkpoint import compute_moments_checkpointed

    url, local, z = faces
    fs = _fs(s3)
    fs.pipe_file("data/mine/notes.txt", b"the user's")
    model = tmp_path / "m"
    dfairpca.PCA(2).fit(dfairpca.from_zarr(local, "images").reshape(N, -1)).save(model)
    so = ["--storage-options", json.dumps(s3)]
    for extra in ([], ["--overwrite"]):
        code, _, err = run(["transform", model, url, "--out", "s3://data/mine", *so, *extra,
                            *NO_CLUSTER], capsys)
        assert code == 1 and "did not write" in err and "scheduler" not in err, err
    # nor the input store, nor a store holding it
    code, _, err = run(["transform", model, url, "--out", url, "--overwrite", *so, *NO_CLUSTER],
                       capsys)
    assert code == 1 and "is the input store" in err, err
    # however the input is spelt (s3a:// and a trailing slash name the same objects)
    code, _, err = run(["transform", model, "s3a://data/faces.zarr/", "--out", url, "--overwrite",
                        *so, *NO_CLUSTER], capsys)
    assert code == 1 and "is the input store" in err, err
    assert fs.exists("data/faces.zarr/zarr.json")
    X = dfairpca.from_zarr(url, "images", storage_options=s3).reshape(N, -1)
    with pytest.raises(OutputPathError, match="did not write"):
        compute_moments_checkpointed(X, checkpoint="s3://data/mine", storage_options=s3)
    with pytest.raises(OutputPathError, match="is the input store"):
        compute_moments_checkpointed(X, checkpoint=url, storage_options=s3)
    with pytest.raises(OutputPathError, match="not a checkpoint written by dfairpca"):
        dfairpca.io.remove_directory("s3://data/mine", "checkpoint", storage_options=s3)
    assert fs.cat_file("data/mine/notes.txt") == b"the user's"
    assert fs.ls("data/mine", detail=False) == ["data/mine/notes.txt"]


def test_a_move_cut_short_between_copy_and_delete_is_finished_by_the_next_reader(s3, tmp_path,
                                                                                 monkeypatch):
    """On S3 a move is a copy then a delete: a crash after the copy leaves the journal, and
    the next read (or write) of the target finishes the move from it."""
    from dfairpca.io import _fsspec

    so = dict(s3)
    arrays, meta = dfairpca.compute_moments(np.random.default_rng(0).normal(size=(50, 4))).to_arrays()
    url = "s3://data/stats/m"
    real = _fsspec._remove_tree

    def crash(loc):  # the process dies after the copy, before the delete (and its cleanup)
        if ".tmp-" in loc.path:
            raise KeyboardInterrupt
        return real(loc)

    _fsspec._remove_tree = crash
    try:
        with pytest.raises(KeyboardInterrupt):
            dfairpca.io.save_arrays(url, arrays, {"kind": "Moments", **meta}, storage_options=so)
    finally:
        _fsspec._remove_tree = real
    fs = _fs(so)
    names = [n.rsplit("/", 1)[-1] for n in fs.ls("data/stats", detail=False)]
    journal = [n for n in names if ".move-" in n]
    assert len(journal) == 1 and any(".tmp-" in n for n in names)
    # a journal of this (living) process is a write under way: its name is freed as if
    # the writer had died, which is what the next process sees
    from dfairpca.io._marker import ACTIVE

    ACTIVE.discard(journal[0])
    ACTIVE.difference_update([n for n in names if ".tmp-" in n])
    monkeypatch.setattr(_marker, "LEASE_STALE_S", 0.0)  # and its leases have run out
    host = journal[0].split("-")[1]  # and the probe of a writer that died at once
    fs.pipe_file(f"data/stats/.m.probe-{host}-99999999-0123abcd", b"")
    loaded, _ = dfairpca.io.load_arrays(url, kind="Moments", storage_options=so)
    np.testing.assert_array_equal(loaded["scatter"], arrays["scatter"])
    assert [n.rsplit("/", 1)[-1] for n in _fs(so).ls("data/stats", detail=False)] == ["m"]


def test_bad_urls_credentials_and_endpoints_are_one_line_errors_before_any_work(
        s3, faces, capsys, tmp_path):
    url, _, _ = faces
    dead = {"key": "k", "secret": "s", "endpoint_url": f"http://127.0.0.1:{_free_port()}"}
    no_credentials = {"endpoint_url": s3["endpoint_url"]}
    cases = [
        ([url, "--storage-options", "{not json"], "--storage-options must be a JSON object"),
        (["s3://data/nothing-here.zarr", "--storage-options", json.dumps(s3)],
         "no Zarr store at s3://data/nothing-here.zarr"),
        (["s3://no-such-bucket/x.zarr", "--storage-options", json.dumps(s3)],
         "no Zarr store at s3://no-such-bucket/x.zarr"),
        (["nosuchprotocol://x/y.zarr"], "cannot open 'nosuchprotocol://x/y.zarr'"),
        ([url, "--storage-options", json.dumps(no_credentials)],
         "no credentials for s3://data/faces.zarr: set AWS_ACCESS_KEY_ID"),
        ([url, "--storage-options", json.dumps(dead)], "cannot reach the storage of"),
    ]
    for extra, expected in cases:
        start = time.monotonic()
        code, _, err = run(["fit", *extra[:1], "--attribute", "Eyeglasses", "-k", "3", "--out",
                            tmp_path / "m", *extra[1:], *NO_CLUSTER], capsys)
        # malformed options are a refused command line (2); storage that is not there, or
        # refuses or cannot use what it is given, a failed run (1)
        status = 2 if expected.startswith("--storage-options") else 1
        assert code == status and expected in err and "scheduler" not in err, (extra, err)
        assert err.startswith("dfairpca fit: error: ") and err.count("\n") == 1, err
        assert time.monotonic() - start < 60, extra
    # the output's storage is checked before any work too
    code, _, err = run(["fit", url, "--attribute", "Eyeglasses", "-k", "3", "--out",
                        "s3://no-such-bucket/m", "--storage-options", json.dumps(s3),
                        *NO_CLUSTER], capsys)
    assert code == 1 and "no bucket 'no-such-bucket'" in err and "scheduler" not in err, err
    # a dead endpoint given in --storage-options is named (not AWS_ENDPOINT_URL's)
    os.environ["AWS_ENDPOINT_URL"] = s3["endpoint_url"]
    try:
        code, _, err = run(["fit", url, "--attribute", "Eyeglasses", "-k", "3", "--out",
                            tmp_path / "m", "--storage-options", json.dumps(dead), *NO_CLUSTER],
                           capsys)
    finally:
        del os.environ["AWS_ENDPOINT_URL"]
    assert code == 1 and f"at {dead['endpoint_url']} (" in err, err
    # a protocol whose package is missing (gcsfs) and a bucket's root: one line, exit 1
    for out, expected in (("gs://b/m", "needs a package that is not installed"),
                          ("s3://data", "cannot write to s3://data, the root of a bucket")):
        code, _, err = run(["fit", url, "--attribute", "Eyeglasses", "-k", "3", "--out", out,
                            "--storage-options", json.dumps(s3), *NO_CLUSTER], capsys)
        assert code == 1 and expected in err and err.count("\n") == 1, (out, err)


@pytest.mark.parametrize("options", [
    {"endpoint_url": 5}, {"endpoint_url": "not a url"}, {"nonsense": 1},
    {"client_kwargs": {"region_name": 5}}, {"config_kwargs": {"retries": 5}},
    {"key": None},  # a secret without its key
])
def test_storage_options_the_client_cannot_be_made_from_are_one_line(
        clean_environment, options, capsys, tmp_path):
    # refused while s3fs makes its client from them, before any request: no server needed
    so = json.dumps({"key": "k", "secret": "hush", **options})
    for args in (["synth-celeba", "s3://data/out.zarr", "--n", "10", "--storage-options", so],
                 ["fit", "s3://data/in.zarr", "--attribute", "Eyeglasses", "-k", "3", "--out",
                  tmp_path / "m", "--storage-options", so, *NO_CLUSTER]):
        code, _, err = run(args, capsys)
        assert code == 1 and err.count("\n") == 1 and "Traceback" not in err, (args, err)
        assert "storage options" in err and "were refused" in err, err
        assert "S3FileSystem" in err and "--storage-options" in err, err
        assert "hush" not in err  # the options are named, their values (a secret) never shown
    assert list(tmp_path.iterdir()) == []


def test_a_server_lost_during_the_pass_is_named_not_taken_for_damaged_data(cluster, tmp_path):
    """The workers' reads fail when the endpoint goes away: the error names the storage
    and its fix, not a "truncated or damaged" chunk."""
    import s3fs

    with _server(tmp_path) as options:
        _faces(tmp_path / "faces.zarr")
        s3fs.S3FileSystem(**options).put(str(tmp_path / "faces.zarr"), "data/faces.zarr",
                                         recursive=True)
        X = dfairpca.from_zarr("s3://data/faces.zarr", "images", rows_per_chunk=CHUNK,
                               storage_options=options).reshape(N, -1)
    with pytest.raises(ConnectionError, match="cannot reach the storage of s3://data/faces.zarr"):
        dfairpca.PCA(3).fit(X)


#: the timeout of the fits whose S3 server freezes, and what the error may take beyond it
#: (a loaded machine; without the bound, s3fs's retries took 20 minutes)
FROZEN_TIMEOUT, FROZEN_SLACK = 4, 8


def _slow_rows(block):
    time.sleep(0.1)
    return block


def _in_a_daemon_thread(call):
    """A started daemon thread running ``call()``, which leaves its result or exception in
    the thread's ``outcome``: a call that waits for ever fails the test (which stops
    waiting for it) instead of hanging it."""
    import threading

    def run():
        try:
            thread.outcome["result"] = call()
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            thread.outcome["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.outcome = {}  # type: ignore[attr-defined]
    thread.start()
    return thread


def test_a_server_that_stops_answering_mid_pass_ends_the_fit_within_its_timeout(cluster, tmp_path):
    """SIGSTOP (a frozen host, a dropped route): connections are accepted, nothing
    answers.  The fit ends with one line naming the store within its timeout."""
    import s3fs

    with _moto(tmp_path) as (server, options):
        _faces(tmp_path / "faces.zarr")
        s3fs.S3FileSystem(**options).put(str(tmp_path / "faces.zarr"), "data/faces.zarr",
                                         recursive=True)
        X = dfairpca.from_zarr("s3://data/faces.zarr", "images", rows_per_chunk=CHUNK // 4,
                               storage_options=options).reshape(N, -1)
        slow = X.map_blocks(_slow_rows, dtype=X.dtype)  # 48 chunks, 0.1 s each
        executed = lambda: sum(cluster.run(  # noqa: E731
            lambda dask_worker: dask_worker.state.executed_count).values())
        before = executed()
        fit = _in_a_daemon_thread(lambda: dfairpca.PCA(3).fit(slow, timeout=FROZEN_TIMEOUT))
        deadline = time.monotonic() + 60
        while executed() < before + 3:  # folds have read chunks: the pass is under way
            assert time.monotonic() < deadline and fit.is_alive(), fit.outcome
            time.sleep(0.02)
        server.send_signal(signal.SIGSTOP)
        frozen = time.monotonic()
        fit.join(FROZEN_TIMEOUT + FROZEN_SLACK)
        took = time.monotonic() - frozen
        assert not fit.is_alive(), f"the fit still waits {took:.0f} s after the server froze"
    error = fit.outcome.get("error")
    assert isinstance(error, ConnectionError), fit.outcome
    msg = str(error)
    # a read sent just before the freeze counts its timeout from then
    assert FROZEN_TIMEOUT / 2 <= took < FROZEN_TIMEOUT + FROZEN_SLACK, (took, msg)
    assert "\n" not in msg and msg.startswith(
        f"the storage of s3://data/faces.zarr at {options['endpoint_url']} did not answer "
        f"within {FROZEN_TIMEOUT} s (reading 'images/c/"), msg
    assert "reachable from the Dask workers" in msg and "--timeout" in msg, msg


@pytest.mark.parametrize("scheduler", ["threads", "synchronous"])
def test_a_frozen_server_ends_a_fit_on_a_local_scheduler_within_its_timeout(
        clean_environment, tmp_path, scheduler):
    """Without a Client (Dask's threaded scheduler, or the synchronous one) a fit's reads
    are bounded by its timeout as on a cluster: one line naming the store."""
    import dask
    import s3fs

    with _moto(tmp_path) as (server, options), dask.config.set(scheduler=scheduler):
        _faces(tmp_path / "faces.zarr")
        s3fs.S3FileSystem(**options).put(str(tmp_path / "faces.zarr"), "data/faces.zarr",
                                         recursive=True)
        X = dfairpca.from_zarr("s3://data/faces.zarr", "images", rows_per_chunk=CHUNK // 4,
                               storage_options=options).reshape(N, -1)
        started = []

        def slow_rows(block):
            started.append(1)
            time.sleep(0.1)
            return block

        slow = X.map_blocks(slow_rows, dtype=X.dtype)  # 48 chunks, 0.1 s each
        fit = _in_a_daemon_thread(lambda: dfairpca.PCA(3).fit(slow, timeout=FROZEN_TIMEOUT))
        deadline = time.monotonic() + 60
        while len(started) < 3:  # chunks have been read: the pass is under way
            assert time.monotonic() < deadline and fit.is_alive(), fit.outcome
            time.sleep(0.02)
        server.send_signal(signal.SIGSTOP)
        frozen = time.monotonic()
        fit.join(FROZEN_TIMEOUT + FROZEN_SLACK)
        took = time.monotonic() - frozen
        assert not fit.is_alive(), f"the fit still waits {took:.0f} s after the server froze"
    error = fit.outcome.get("error")
    assert isinstance(error, ConnectionError), fit.outcome
    msg = str(error)
    assert took < FROZEN_TIMEOUT + FROZEN_SLACK, (took, msg)
    assert "\n" not in msg and msg.startswith(
        f"the storage of s3://data/faces.zarr at {options['endpoint_url']} did not answer "
        f"within {FROZEN_TIMEOUT} s (reading 'images/c/"), msg


def test_a_server_that_stops_answering_during_a_cli_fit_is_one_line_naming_the_checkpoint(
        clean_environment, tmp_path, capsys):
    """The command's checkpointed pass (its folds slowed, tests/slow_folds.py): the server
    freezes after a segment is saved; one line, exit 1, within --timeout, and --resume
    continues once the server answers again."""
    import s3fs

    from processes import DaskProcesses

    with _moto(tmp_path) as (server, options), \
            DaskProcesses(tmp_path, worker_args=["--preload", "slow_folds"]) as procs:
        _faces(tmp_path / "faces.zarr")
        s3fs.S3FileSystem(**options).put(str(tmp_path / "faces.zarr"), "data/faces.zarr",
                                         recursive=True)
        from dfairpca.cluster import connect

        with connect(scheduler_file=procs.scheduler_file, timeout=30, quiet=True) as client:
            client.wait_for_workers(2, timeout=60)
        out = tmp_path / "model"
        ckpt = tmp_path / "model.checkpoint"
        fit = ["fit", "s3://data/faces.zarr", "--attribute", "Eyeglasses", "-k", "3", "--out", out,
               "--rows-per-chunk", CHUNK // 4, "--storage-options", json.dumps(options),
               "--scheduler-file", procs.scheduler_file, "--timeout", FROZEN_TIMEOUT]
        command = _in_a_daemon_thread(lambda: main([str(a) for a in fit]))
        deadline = time.monotonic() + 60
        while not (ckpt / "progress.json").exists():  # a segment of the 48 chunks is saved
            assert time.monotonic() < deadline and command.is_alive(), command.outcome
            time.sleep(0.01)
        server.send_signal(signal.SIGSTOP)
        frozen = time.monotonic()
        command.join(FROZEN_TIMEOUT + FROZEN_SLACK)
        took = time.monotonic() - frozen
        assert not command.is_alive(), f"the command still waits {took:.0f} s after the server froze"
        err = capsys.readouterr().err
        assert command.outcome == {"result": 1}, (command.outcome, err)
        assert took < FROZEN_TIMEOUT + FROZEN_SLACK, took
        assert err.count("\n") == 1 and err.startswith(
            f"dfairpca fit: error: the storage of s3://data/faces.zarr at {options['endpoint_url']} "
            f"did not answer within {FROZEN_TIMEOUT} s (reading 'images/c/"), err
        assert re.search(rf"the checkpoint {re.escape(str(ckpt))} holds (16|32) of 48 chunks: "
                         "check that the server is up and reachable from the Dask workers, then "
                         "rerun with --resume, or wait longer with --timeout$", err.strip()), err
        server.send_signal(signal.SIGCONT)
        assert main([str(a) for a in [*fit, "--resume"]]) == 0, capsys.readouterr().err
    assert dfairpca.load(out).n_components_ == 3


def test_a_frozen_server_during_a_fit_on_the_local_cluster_is_one_line_on_stderr(
        clean_environment, tmp_path):
    """The command as a user runs it (its own local cluster): exit 1 and, besides the
    cluster's two lines, only the error, with nothing from the workers it kills on the way
    out (a worker may still be in a read of the frozen store when the cluster closes)."""
    import s3fs

    with _moto(tmp_path) as (server, options):
        _faces(tmp_path / "faces.zarr")
        s3fs.S3FileSystem(**options).put(str(tmp_path / "faces.zarr"), "data/faces.zarr",
                                         recursive=True)
        ckpt = tmp_path / "model.checkpoint"
        proc = subprocess.Popen(  # 600 chunks of 2 rows: a pass long enough to freeze in
            [sys.executable, "-m", "dfairpca", "fit", "s3://data/faces.zarr", "--attribute",
             "Eyeglasses", "-k", "3", "--out", str(tmp_path / "model"), "--rows-per-chunk", "2",
             "--storage-options", json.dumps(options), "--timeout", str(FROZEN_TIMEOUT)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
        try:
            deadline = time.monotonic() + 120
            while not (ckpt / "progress.json").exists():
                assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()
                time.sleep(0.01)
            server.send_signal(signal.SIGSTOP)
            frozen = time.monotonic()
            out, err = proc.communicate(timeout=FROZEN_TIMEOUT + FROZEN_SLACK + 10)
            took = time.monotonic() - frozen
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    lines = err.splitlines()
    assert proc.returncode == 1, (out, err)
    # the error, then the cluster's close (the nanny's 4 s grace for a busy worker)
    assert took < FROZEN_TIMEOUT + FROZEN_SLACK + 10, (took, err)
    told = [line for line in lines if line.startswith("dfairpca: dashboard ")]
    assert len(told) == (importlib.util.find_spec("bokeh") is not None), err  # where it exists
    lines = [line for line in lines if line not in told]
    assert len(lines) == 2 and lines[0].startswith("dfairpca: local Dask cluster, "), err
    assert lines[1].startswith(
        f"dfairpca fit: error: the storage of s3://data/faces.zarr at {options['endpoint_url']} "
        f"did not answer within {FROZEN_TIMEOUT} s"), err
    assert lines[1].endswith("then rerun with --resume, or wait longer with --timeout"), err


def test_a_zarr_store_whose_overwrite_died_mid_copy_is_read_whole_not_mixed(s3):
    """An overwrite of a store on S3 that died after copying some chunks leaves old and new
    chunks at the target: reading it finishes the move first (or refuses), never mixes."""
    from dfairpca.io import _fsspec, _marker, _urls
    from dfairpca.io._marker import ACTIVE

    so = dict(s3)
    url = "s3://data/mixed/z.zarr"
    fs = _urls.location(url, so).fs  # fsspec binds its sync methods to each instance
    real, real_remove = fs.copy, _fsspec._remove_tree

    def dead(loc):  # a dead process cleans up nothing: its temporary prefix stays
        if ".tmp-" in loc.path:
            raise KeyboardInterrupt
        return real_remove(loc)

    def die(path1, path2, *a, **k):  # the second write dies after 3 of its 4 chunks
        chunks = [i for i, p in enumerate(path1) if "/images/c/" in p]
        if len(chunks) < 4:
            return real(path1, path2, *a, **k)
        real([path1[i] for i in chunks[:3]], [path2[i] for i in chunks[:3]], *a, **k)
        raise KeyboardInterrupt

    for value in (1, 2):
        if value == 2:
            fs.copy, _fsspec._remove_tree = die, dead
        try:
            with _fsspec.atomic_prefix(_urls.location(url, so), "store", overwrite=True) as tmp:
                g = zarr.open_group(_urls.zarr_store(tmp, so), mode="w",
                                    attributes=dfairpca.io.marker_attributes("store"))
                g.create_array("images", shape=(40, 3), chunks=(10, 3), dtype="int8")[:] = value
        except KeyboardInterrupt:
            assert value == 2
        finally:
            fs.copy, _fsspec._remove_tree = real, real_remove
    names = _fs(so).ls("data/mixed", detail=False)
    ACTIVE.difference_update(n.rsplit("/", 1)[-1] for n in names)  # as the next process sees it
    _marker.LEASE_STALE_S, stale = 0.0, _marker.LEASE_STALE_S  # a minute later
    try:
        X = dfairpca.from_zarr(url, "images", storage_options=so)
    finally:
        _marker.LEASE_STALE_S = stale
    np.testing.assert_array_equal(np.asarray(X), 2)
    assert _fs(so).ls("data/mixed", detail=False) == ["data/mixed/z.zarr"]


def test_an_interrupted_synth_to_a_url_says_where_its_stage_is_and_that_it_resumes(
        s3, capsys, monkeypatch):
    """The message names the stage kept on this machine, and the same command resumes."""
    url = "s3://data/cut/synth.zarr"
    args = ["synth-celeba", url, "--n", "40", "--size", "8", "--n-jobs", "1",
            "--storage-options", json.dumps(s3)]
    _record_chunks(monkeypatch, stop_after=1)  # Ctrl-C once the first chunk is written
    code, _, err = run(args, capsys)
    stage = stage_folder(url)
    assert code == 130 and stage.is_dir()
    assert f"kept what it wrote for {url} in {stage}: the same call again resumes" in err, err
    assert "--overwrite, discards it" in err and ".partial" not in err, err
    assert not _fs(s3).exists("data/cut/synth.zarr")
    _record_chunks(monkeypatch)
    code, _, err = run(args, capsys)
    assert code == 0, err
    assert not stage.exists() and _fs(s3).ls("data/cut", detail=False) == ["data/cut/synth.zarr"]


def test_an_overwrite_on_s3_refuses_a_users_object_deep_inside_a_model(s3, faces):
    """The same rule as on disk: every object dfairpca wrote is in the marker's list."""
    url, local, _ = faces
    model = dfairpca.PCA(2).fit(dfairpca.from_zarr(local, "images").reshape(N, -1))
    target = dfairpca.io.location("s3://data/deep/mdl", s3)  # carries the storage options
    model.save(target)
    fs = _fs(s3)
    fs.pipe_file("data/deep/mdl/notes/my_notes.txt", b"mine")
    with pytest.raises(OutputPathError, match=r"did not write \(notes\)"):
        model.save(target, overwrite=True)
    assert fs.cat_file("data/deep/mdl/notes/my_notes.txt") == b"mine"


def test_an_overwrite_on_s3_refuses_a_users_object_inside_a_zarr_array(s3, capsys):
    """The rule of a local store (tests/test_writes.py): inside an array's folder, only the
    chunk keys of its grid are dfairpca's."""
    url, prefix = "s3://data/deepstore/synth.zarr", "data/deepstore/synth.zarr"
    synth = ["synth-celeba", url, "--n", "40", "--size", "8", "--n-jobs", "1",
             "--storage-options", json.dumps(s3)]
    code, _, err = run(synth, capsys)
    assert code == 0, err
    found = dfairpca.io.read_marker(url, storage_options=s3)
    assert dfairpca.io.foreign_entries(url, found, storage_options=s3) == []
    code, _, err = run([*synth, "--overwrite"], capsys)  # a clean store: no false positive
    assert code == 0, err
    fs = _fs(s3)
    users = {"images/notes.txt": "images/notes.txt", "images/c/extra.bin": "images/c/extra.bin",
             "images/c/9/0/0": "images/c/9"}  # a chunk key outside the grid (1, 1, 1)
    for name, named in users.items():
        fs.pipe_file(f"{prefix}/{name}", b"mine")
        code, _, err = run([*synth, "--overwrite"], capsys)
        assert code == 1 and f"did not write ({named})" in err, err
        assert _fs(s3).cat_file(f"{prefix}/{name}") == b"mine"
        fs.rm(f"{prefix}/{name}")
    # an array and an attribute the user added with zarr are named and kept

    group = zarr.open_group(dfairpca.io.zarr_store(url, s3), mode="r+")
    group.create_array("my_hand_labels", data=np.arange(40))
    group.attrs["my_note"] = "hello"
    code, _, err = run([*synth, "--overwrite"], capsys)
    assert code == 1 and "my_hand_labels" in err and "'my_note'" in err, err
    # the members as stored (the consolidated copy dfairpca wrote predates the user's array)
    group = zarr.open_group(dfairpca.io.zarr_store(url, s3), mode="r+", use_consolidated=False)
    assert group["my_hand_labels"][:].tolist() == list(range(40)) and group.attrs["my_note"] == "hello"
    del group["my_hand_labels"]
    del group.attrs["my_note"]
    fs.pipe_file(f"{prefix}/images/c/extra.bin", b"mine")
    with pytest.warns(UserWarning, match="kept the directory"):
        dfairpca.io.remove_directory(url, "store", storage_options=s3)
    assert _fs(s3).find(prefix) == [f"{prefix}/images/c/extra.bin"]


# ----------------------------------------------------------------- resuming a staged store
#: a small colour store of 10 chunks
SYNTH = dict(n=100, seed=3, size=(8, 6), color=True, chunk_rows=10, progress=False, n_jobs=1)
#: the chunk writers, as the modules define them
_CHUNK_WRITERS = {dfairpca.celeba.synth: dfairpca.celeba.synth._synth_chunk,
                  dfairpca.celeba.ingest: dfairpca.celeba.ingest._ingest_chunk}


def _record_chunks(monkeypatch, stop_after=None, module=dfairpca.celeba.synth):
    """The indices of the chunks ``module`` writes from now on, in this process (n_jobs=1);
    with ``stop_after``, a Ctrl-C once that many are written (the last one not yet marked
    done, as a Ctrl-C inside a chunk leaves it)."""
    real = _CHUNK_WRITERS[module]
    written = []

    def chunk(store, index, *args):
        rows = real(store, index, *args)
        written.append(index)
        if len(written) == stop_after:
            raise KeyboardInterrupt
        return rows

    name = "_synth_chunk" if module is dfairpca.celeba.synth else "_ingest_chunk"
    monkeypatch.setattr(module, name, chunk)
    return written


def _objects(options, prefix) -> dict[str, bytes]:
    """Every object under ``prefix`` on the server, by relative key."""
    fs = _fs(options)
    return {k[len(prefix) + 1:]: fs.cat_file(k) for k in sorted(fs.find(prefix))}


def _files(path) -> dict[str, bytes]:
    """Every file of a local store, by relative "/"-separated path."""
    return {p.relative_to(path).as_posix(): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


def test_an_interrupted_synth_to_s3_resumes_its_stage_chunk_by_chunk(s3, tmp_path, monkeypatch):
    url = "s3://data/resume/faces.zarr"
    stage = stage_folder(url)
    _record_chunks(monkeypatch, stop_after=4)
    with pytest.raises(KeyboardInterrupt) as info:
        synth_celeba(url, storage_options=s3, **SYNTH)
    assert info.value.__notes__ == [
        f"dfairpca kept what it wrote for {url} in {stage}: the same call again resumes from "
        "there (overwrite=True, --overwrite, discards it)"]
    done = stage / "work" / ".faces.zarr.partial" / ".done"
    assert sorted(os.listdir(done)) == ["0", "1", "2", "code"]  # chunk 3: written, not marked
    assert not _fs(s3).exists("data/resume/faces.zarr")

    written = _record_chunks(monkeypatch)
    assert synth_celeba(url, storage_options=s3, **SYNTH) == url
    assert written == list(range(3, 10))  # the finished chunks are not drawn again
    assert not stage.exists()
    assert _fs(s3).ls("data/resume", detail=False) == ["data/resume/faces.zarr"]
    reference = synth_celeba(tmp_path / "reference.zarr", **SYNTH)  # in one go
    assert _objects(s3, "data/resume/faces.zarr") == _files(reference)


def test_an_upload_cut_short_is_redone_from_the_finished_stage(s3, tmp_path, monkeypatch):
    """A process that dies while uploading leaves its temporary prefix (marked: the markers
    go first) and the finished local store; the next call deletes the one and uploads the
    other, drawing nothing again."""
    url = "s3://data/upload/faces.zarr"
    stage = stage_folder(url)
    fs = _urls.location(url, s3).fs  # fsspec binds its sync methods to each instance
    real_put, real_remove = fs.put_file, _fsspec._remove_tree
    sent = []

    def cut(local, remote, *args, **kwargs):  # the process dies after 5 objects
        if len(sent) == 5:
            raise KeyboardInterrupt
        sent.append(remote)
        return real_put(local, remote, *args, **kwargs)

    def dead(loc):  # a dead process cleans up nothing: its temporary prefix stays
        if ".tmp-" in loc.path:
            raise KeyboardInterrupt
        return real_remove(loc)

    with monkeypatch.context() as mp:
        mp.setattr(fs, "put_file", cut)
        mp.setattr(_fsspec, "_remove_tree", dead)
        with pytest.raises(KeyboardInterrupt):
            synth_celeba(url, storage_options=s3, **SYNTH)
    (leftover,) = _fs(s3).ls("data/upload", detail=False)
    assert ".faces.zarr.tmp-" in leftover and len(_fs(s3).find(leftover)) == 5
    ACTIVE.discard(leftover.rsplit("/", 1)[-1])  # as the next process sees it, a minute later
    monkeypatch.setattr(_marker, "LEASE_STALE_S", 0.0)
    assert (stage / "work" / "faces.zarr" / "zarr.json").is_file()  # finished, kept

    written = _record_chunks(monkeypatch)
    synth_celeba(url, storage_options=s3, **SYNTH)
    assert written == []  # only the upload was redone
    assert not stage.exists()
    assert _fs(s3).ls("data/upload", detail=False) == ["data/upload/faces.zarr"]
    reference = synth_celeba(tmp_path / "reference.zarr", **SYNTH)
    assert _objects(s3, "data/upload/faces.zarr") == _files(reference)


def test_another_call_or_overwrite_discards_the_stage(s3, tmp_path, monkeypatch):
    url = "s3://data/again/faces.zarr"
    _record_chunks(monkeypatch, stop_after=4)
    with pytest.raises(KeyboardInterrupt):
        synth_celeba(url, storage_options=s3, **SYNTH)
    other = {**SYNTH, "seed": 4}  # its chunks cannot be reused
    written = _record_chunks(monkeypatch, stop_after=4)
    with pytest.warns(UserWarning, match="discarded the interrupted write for s3://data/again"):
        with pytest.raises(KeyboardInterrupt):
            synth_celeba(url, storage_options=s3, **other)
    assert written == [0, 1, 2, 3]  # from the first chunk
    written = _record_chunks(monkeypatch)
    synth_celeba(url, storage_options=s3, overwrite=True, **other)
    assert written == list(range(10))  # overwrite: nothing resumed
    assert not stage_folder(url).exists()
    reference = synth_celeba(tmp_path / "reference.zarr", **other)
    assert _objects(s3, "data/again/faces.zarr") == _files(reference)


def test_a_folder_at_the_stage_path_that_is_not_this_urls_stage_is_refused_and_kept(
        s3, tmp_path, monkeypatch, capsys):
    url, other = "s3://data/refused/faces.zarr", "s3://data/refused/other.zarr"
    stage = stage_folder(url, tmp_path)
    stage.mkdir(parents=True)
    (stage / "notes.txt").write_text("mine")
    for overwrite in (False, True):
        with pytest.raises(OutputPathError, match=rf"did not write.*where {url} is staged.*--stage-dir"):
            synth_celeba(url, storage_options=s3, stage_dir=tmp_path, overwrite=overwrite, **SYNTH)
    assert (stage / "notes.txt").read_text() == "mine"
    # dfairpca's stage of another URL, where a collision of the hashes would put it
    (stage / "notes.txt").unlink()
    stage.rmdir()
    _record_chunks(monkeypatch, stop_after=2)
    with pytest.raises(KeyboardInterrupt):
        synth_celeba(other, storage_options=s3, stage_dir=tmp_path, **SYNTH)
    stage_folder(other, tmp_path).rename(stage)
    _record_chunks(monkeypatch)
    for overwrite in (False, True):
        with pytest.raises(OutputPathError, match=f"stages {other}, not {url}"):
            synth_celeba(url, storage_options=s3, stage_dir=tmp_path, overwrite=overwrite, **SYNTH)
    assert (stage / "work" / ".other.zarr.partial" / ".done" / "0").is_file()  # kept whole
    assert not _fs(s3).exists("data/refused")
    # a stage whose record is gone (its deletion was cut short) is dfairpca's own: made anew
    (stage / "stage.json").unlink()
    written = _record_chunks(monkeypatch)
    synth_celeba(url, storage_options=s3, stage_dir=tmp_path, **SYNTH)
    assert written == list(range(10)) and not stage.exists()
    # a stage folder is for a URL: a local output is written in place
    code, _, err = run(["synth-celeba", tmp_path / "x.zarr", "--stage-dir", tmp_path], capsys)
    assert code == 2 and "drop stage_dir" in err and not (tmp_path / "x.zarr").exists()


def test_a_stage_in_use_is_refused_and_a_stage_dir_must_be_a_writable_local_folder(s3, tmp_path):
    """Two writes to one URL at once would mix their chunks in its one stage: while one holds
    the stage's lock the other is refused, before it touches the stage.  A URL or an
    unusable folder as stage_dir is a one-line error naming the setting."""
    from dfairpca.io._writes import exclusive

    url = "s3://data/busy/faces.zarr"
    stage = stage_folder(url, tmp_path)
    with exclusive(tmp_path / f".{stage.name}.lock", "the first writer"):
        with pytest.raises(OutputPathError, match=r"another dfairpca process on this machine is "
                           r"writing s3://data/busy/faces\.zarr \(its stage"):
            synth_celeba(url, storage_options=s3, stage_dir=tmp_path, **SYNTH)
    assert not stage.exists() and not _fs(s3).exists("data/busy")
    with pytest.raises(ValueError, match="is a URL; a stage is a local folder"):
        synth_celeba(url, storage_options=s3, stage_dir="s3://data/stage", **SYNTH)
    (tmp_path / "a_file").write_text("not a folder")
    with pytest.raises(PermissionError, match=r"where s3://data/busy/faces\.zarr is staged .*--stage-dir"):
        synth_celeba(url, storage_options=s3, stage_dir=tmp_path / "a_file" / "stages", **SYNTH)
    synth_celeba(url, storage_options=s3, stage_dir=tmp_path, **SYNTH)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_file"]  # no stage, no lock left


def test_the_stage_is_under_the_users_cache_one_folder_per_place(monkeypatch, tmp_path):
    import hashlib

    monkeypatch.delenv(STAGE_ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    digest = hashlib.sha256(b"s3://data/x.zarr").hexdigest()[:16]
    assert stage_folder("s3://data/x.zarr") == tmp_path / "dfairpca" / "stage" / digest
    assert stage_folder("s3a://data/x.zarr/") == stage_folder("s3://data/x.zarr")
    assert stage_folder("s3://data/y.zarr") != stage_folder("s3://data/x.zarr")
    assert stage_folder("s3://data/x.zarr", tmp_path / "s") == tmp_path / "s" / digest
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert stage_folder("s3://data/x.zarr") == tmp_path / "home" / ".cache" / "dfairpca" / "stage" / digest


def test_an_ingest_to_s3_that_fails_on_a_bad_image_resumes_from_its_stage(s3, tmp_path, monkeypatch):
    celeba = write_celeba_jpegs(tmp_path / "celeba", 40, seed=2)
    bad = celeba / "img_align_celeba" / "000030.jpg"
    good = bad.read_bytes()
    bad.write_bytes(b"not a jpeg")
    url = "s3://data/ingest-resume/c.zarr"
    kwargs = dict(size=16, chunk_rows=10, progress=False, n_jobs=1)
    with pytest.raises(ValueError, match="000030.jpg") as info:
        ingest_celeba(celeba, url, storage_options=s3, **kwargs)
    stage = stage_folder(url)
    assert len(info.value.__notes__) == 1 and f"in {stage}: the same call again" in info.value.__notes__[0]
    assert sorted(os.listdir(stage / "work" / ".c.zarr.partial" / ".done")) == ["0", "1", "code"]
    bad.write_bytes(good)
    written = _record_chunks(monkeypatch, module=dfairpca.celeba.ingest)
    ingest_celeba(celeba, url, storage_options=s3, **kwargs)
    assert written == [2, 3] and not stage.exists()
    reference = ingest_celeba(celeba, tmp_path / "reference.zarr", **kwargs)
    assert _objects(s3, "data/ingest-resume/c.zarr") == _files(reference)


DROPPED_SESSION = """
import gc, json, sys
import s3fs, zarr
group = zarr.open_group(sys.argv[1], mode="r", storage_options=json.loads(sys.argv[2]))
group["images"][:1]
del group
s3fs.S3FileSystem._cache.clear()
gc.collect()
"""


def test_a_transform_of_an_s3_store_ends_without_an_unclosed_session(s3, faces, tmp_path):
    """The command line's transform of an S3 store to S3 on its own local cluster, run as a
    program (its workers write to its stderr): no aiohttp "Unclosed client session" when
    the workers close.  A process that drops a session zarr opened on S3 prints it (this
    test would see it)."""
    url, local, z = faces
    model = tmp_path / "m"
    dfairpca.FairPCA(3).fit(dfairpca.from_zarr(local, "images").reshape(N, -1),
                            sensitive_features=z).save(model)
    done = subprocess.run(
        [sys.executable, "-m", "dfairpca", "transform", str(model), url, "--out",
         "s3://data/quiet/rep.zarr", "--storage-options", json.dumps(s3)],
        capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "Unclosed" not in done.stderr, done.stderr
    assert dfairpca.io.read_marker("s3://data/quiet/rep.zarr", storage_options=s3)["kind"] == (
        "transform output")
    dropped = subprocess.run([sys.executable, "-c", DROPPED_SESSION, url, json.dumps(s3)],
                             capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert dropped.returncode == 0, dropped.stderr
    assert "Unclosed client session" in dropped.stderr, dropped.stderr
