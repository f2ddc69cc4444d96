"""The dfairpca command line on real (small) CelebA-schema stores and a real cluster."""

import subprocess
import sys

import numpy as np
import pytest
import zarr
from PIL import Image

import dfairpca
from dfairpca.celeba import synth_celeba
from dfairpca.cli import main


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    path = tmp_path_factory.mktemp("cli") / "faces.zarr"
    synth_celeba(path, n=1500, size=16, chunk_rows=256, progress=False, n_jobs=1)
    return path


def run(args, capsys):
    code = main([str(a) for a in args])
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.fixture(scope="module")
def sched(client):
    return ["--scheduler", client.scheduler.address]


def test_fit_transform_show_round_trip(store, tmp_path, capsys, sched):
    model = tmp_path / "model"
    fit20 = ["fit", store, "--attribute", "Eyeglasses", "--attribute", "Smiling", "-k", "20",
             "--out", model, *sched]
    code, out, err = run(fit20, capsys)
    assert code == 0, err
    assert "n = 1,500 images, d = 256 features" in out and "Eyeglasses:" in out and "Smiling:" in out
    assert "% of the variance kept" in out and "model written to" in out
    est = dfairpca.load(model)
    assert est.attribute_names_ == ["Eyeglasses", "Smiling"] and est.n_components_ == 20
    assert dfairpca.io.read_marker(model)["kind"] == "model"
    # its own model: replaced only when asked
    fit5 = ["fit", store, "--attribute", "Eyeglasses", "-k", "5", "--out", model, *sched]
    code, _, err = run(fit5, capsys)
    assert code == 2 and "--overwrite" in err and dfairpca.load(model).n_components_ == 20
    code, _, err = run([*fit5, "--overwrite"], capsys)
    assert code == 0 and dfairpca.load(model).n_components_ == 5
    code, _, err = run([*fit20, "--overwrite"], capsys)
    assert code == 0 and dfairpca.load(model).n_components_ == 20, err

    rep = tmp_path / "rep.zarr"
    code, out, err = run(["transform", model, store, "--out", rep, *sched], capsys)
    assert code == 0, err
    g = zarr.open_group(str(rep), mode="r")
    Y = g["representation"][:]
    names = list(g["attributes"].attrs["names"])
    assert Y.shape == (1500, 20)
    for name in ("Eyeglasses", "Smiling"):  # group means of the written representation agree
        a = g["attributes"][:, names.index(name)]
        assert np.abs(Y[a == 1].mean(0) - Y[a == 0].mean(0)).max() < 1e-4 * np.abs(Y).max()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temp left
    assert dfairpca.io.read_marker(rep)["kind"] == "store"
    # every chunk on disk, the all-zero ones too (the first 256 rows are all "train", 0)
    assert not g["partition"][:256].any()
    for name in ("representation", "attributes", "partition"):
        a = g[name]
        for i in range(-(-a.shape[0] // a.chunks[0])):
            assert rep.joinpath(name, "c", str(i), *["0"] * (a.ndim - 1)).is_file(), (name, i)

    rec = tmp_path / "rec.zarr"
    code, out, err = run(["transform", model, store, "--out", rec, "--reconstruct", *sched], capsys)
    assert code == 0, err
    imgs = zarr.open_group(str(rec), mode="r")["images"]
    assert imgs.shape == (1500, 16, 16) and imgs.dtype == np.uint8

    png = tmp_path / "faces.png"
    code, out, err = run(["show", model, store, "--out", png, "--n", "3"], capsys)
    assert code == 0, err
    assert str(png) in out
    assert dfairpca.io.read_marker(png)["kind"] == "figure"
    code, out, err = run(["show", model, store, "--out", png, "--n", "3"], capsys)
    assert code == 2 and "--overwrite" in err
    code, out, err = run(["show", model, store, "--out", png, "--n", "3", "--overwrite"], capsys)
    assert code == 0, err
    with Image.open(png) as im:
        assert im.format == "PNG" and im.size[0] > 200 and im.size[1] > 200


def test_fit_methods(store, tmp_path, capsys, sched):
    for method in ("pca", "fair-s"):
        code, out, err = run(["fit", store, "--attribute", "Male", "-k", "5", "--method", method,
                              "--out", tmp_path / method, *sched], capsys)
        assert code == 0, err
    assert type(dfairpca.load(tmp_path / "pca")) is dfairpca.PCA
    assert dfairpca.load(tmp_path / "fair-s").equalize_covariance == 0.5
    code, out, err = run(["fit", store, "--attribute", "Male", "-k", "5", "--constraint",
                          "equal_opportunity", "--target", "Smiling", "--out", tmp_path / "eo", *sched], capsys)
    assert code == 0, err
    est = dfairpca.load(tmp_path / "eo")
    smiling = dfairpca.celeba.attribute_column(store, "Smiling")
    assert est.n_samples_seen_ == int((smiling == 1).sum())


def test_errors(store, tmp_path, capsys, sched):
    code, _, err = run(["fit", store, "--attribute", "Eyeglases", "-k", "5", "--out", tmp_path / "m", *sched], capsys)
    assert code == 2 and "Eyeglases" in err and "Eyeglasses" in err
    code, _, err = run(["fit", store, "--attribute", "Eyeglasses", "-k", "256", "--out", tmp_path / "m", *sched], capsys)
    assert code == 2 and "largest k is" in err and "255" in err
    (tmp_path / "exists").mkdir()
    (tmp_path / "exists" / "notes.txt").write_text("mine")
    code, _, err = run(["fit", store, "--attribute", "Eyeglasses", "-k", "5", "--out", tmp_path / "exists", *sched], capsys)
    assert code == 2 and "remove it yourself" in err
    bare = zarr.open_group(str(tmp_path / "bare.zarr"), mode="w")
    bare.create_array("pixels", shape=(10, 4, 4), chunks=(5, 4, 4), dtype="uint8")
    code, _, err = run(["fit", tmp_path / "bare.zarr", "--attribute", "Male", "-k", "2", "--out", tmp_path / "m2", *sched], capsys)
    assert code == 2 and "images" in err
    # a model of 16x16 images shown against 8x8 images
    small = tmp_path / "small.zarr"
    synth_celeba(small, n=300, size=8, chunk_rows=100, progress=False, n_jobs=1)
    code, _, err = run(["fit", store, "--attribute", "Male", "-k", "3", "--out", tmp_path / "m16", *sched], capsys)
    assert code == 0, err
    code, _, err = run(["transform", tmp_path / "m16", small, "--out", tmp_path / "t.zarr", *sched], capsys)
    assert code == 2 and "64 features" in err and "256" in err
    code, _, err = run(["show", tmp_path / "m16", small, "--out", tmp_path / "x.png"], capsys)
    assert code == 2 and "8x8" in err


def test_console_script_help():
    out = subprocess.run([sys.executable, "-m", "dfairpca.cli", "--help"], capture_output=True, text=True)
    assert out.returncode == 0
    for cmd in ("synth-celeba", "ingest-celeba", "fit", "transform", "show", "demo"):
        assert cmd in out.stdout


def test_fit_resumes_from_checkpoint(store, tmp_path, capsys, sched):
    """An interrupted fit leaves a checkpoint; --resume finishes it with the same result."""
    from dfairpca.checkpoint import compute_moments_checkpointed

    model, ckpt = tmp_path / "m", tmp_path / "m.checkpoint"
    calls = []

    def stop_after_two(i, n):
        calls.append(i)
        if len(calls) == 2:
            raise KeyboardInterrupt

    X = dfairpca.from_zarr(store, "images", rows_per_chunk=100)
    z = dfairpca.celeba.attribute_column(store, "Eyeglasses")
    import pandas as pd
    from dfairpca._validation import encode_groups

    g = encode_groups(pd.DataFrame({"Eyeglasses": z}), len(z))
    with pytest.raises(KeyboardInterrupt):  # the same pass the CLI runs, stopped half-way
        compute_moments_checkpointed(X.reshape(len(z), -1), g.codes, g.categories, checkpoint=ckpt,
                                     dtype=np.float32, on_segment=stop_after_two, segment_rows=300)
    code, _, err = run(["fit", store, "--attribute", "Eyeglasses", "-k", "5", "--out", model, *sched], capsys)
    assert code == 2 and "--resume" in err
    code, out, err = run(["fit", store, "--attribute", "Eyeglasses", "-k", "5", "--out", model,
                          "--resume", "--rows-per-chunk", "100", *sched], capsys)
    assert code == 0, err
    assert not ckpt.exists()
    ref = dfairpca.FairPCA(5).fit(X, sensitive_features=z)
    got = dfairpca.load(model)
    np.testing.assert_allclose(np.abs(got.components_ @ ref.components_.T), np.eye(5), atol=1e-4)


def _nowhere() -> str:
    """A scheduler address where nothing listens."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"tcp://127.0.0.1:{s.getsockname()[1]}"


def test_parameter_errors_come_before_any_cluster(store, tmp_path, capsys, sched):
    """Issue 10: every parameter error is reported before connecting, so with a scheduler
    address where nothing listens (and a long --timeout) the user sees the parameter error
    in one line, at once, and nothing is written."""
    import time

    nowhere = ["--scheduler", _nowhere(), "--timeout", "60"]
    fit = ["fit", store, "--attribute", "Eyeglasses", "--out", tmp_path / "m", *nowhere]
    cases = [
        (["-k", "256"], "largest k is"),
        (["-k", "257", "--method", "pca"], "n_components=257 is too large"),
        (["-k", "0"], "argument -k/--k: must be a positive integer; got '0'"),
        (["-k", "5", "--tradeoff", "1.5"], "tradeoff must be a number in [0, 1]"),
        (["-k", "5", "--method", "fair-s", "--equalize", "0"], "equalize_covariance"),
        (["-k", "5", "--rows-per-chunk", "0"], "--rows-per-chunk: must be a positive integer"),
        (["-k", "5", "--rows-per-chunk", "-3"], "--rows-per-chunk: must be a positive integer"),
        (["-k", "5", "--constraint", "equal_opportunity"], "--target"),
        (["-k", "5", "--timeout", "0"], "--timeout: must be a positive number"),
    ]
    for extra, expected in cases:
        start = time.monotonic()
        code, _, err = run(fit + extra, capsys)
        assert time.monotonic() - start < 5, extra
        assert code == 2 and expected in err and "scheduler" not in err, (extra, err)
        assert err.startswith("dfairpca fit: error: ") and err.count("\n") == 1, err
    assert not (tmp_path / "m").exists()
    # transform: a model of 16x16 images applied to 8x8 images
    code, _, err = run(["fit", store, "--attribute", "Male", "-k", "3", "--out",
                        tmp_path / "m16", *sched], capsys)
    assert code == 0, err
    small = tmp_path / "small.zarr"
    synth_celeba(small, n=300, size=8, chunk_rows=100, progress=False, n_jobs=1)
    start = time.monotonic()
    code, _, err = run(["transform", tmp_path / "m16", small, "--out", tmp_path / "t.zarr",
                        *nowhere], capsys)
    assert code == 2 and "64 features" in err and "scheduler" not in err, err
    assert time.monotonic() - start < 5 and not (tmp_path / "t.zarr").exists()
    code, _, err = run(["show", tmp_path / "m16", store, "--n", "0"], capsys)
    assert code == 2 and "argument --n: must be a positive integer; got '0'" in err


def _noise_store(path, n, size, chunk_rows, seed=0):
    """A CelebA-schema store with one attribute, fast to write: 8 patterns of clearly
    different variance (so that the top components are well separated) plus noise."""
    rng = np.random.default_rng(seed)
    z = (rng.random(n) < 0.3).astype(np.int8)
    g = zarr.open_group(str(path), mode="w")
    images = g.create_array("images", shape=(n, size, size), chunks=(chunk_rows, size, size),
                            dtype="uint8")
    patterns = np.linalg.qr(rng.normal(size=(size * size, 8)))[0].T  # orthonormal rows
    scores = rng.normal(size=(n, 8)) * 400 * 0.7 ** np.arange(8)
    x = 100 + scores @ patterns + rng.normal(scale=5, size=(n, size * size)) + 20 * z[:, None]
    images[:] = np.clip(np.round(x), 0, 255).astype(np.uint8).reshape(n, size, size)
    attributes = g.create_array("attributes", shape=(n, 1), chunks=(n, 1), dtype="int8")
    attributes[:] = z[:, None]
    attributes.attrs["names"] = ["Eyeglasses"]
    return z


# the CLI in a child process on (at most) two cores, so that the local cluster it starts has
# two threads and the pass of 120 chunks has 8 segments of 16 chunks whatever the machine
TWO_CORES = ("import os, sys; os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:2]); "
             "from dfairpca.cli import main; sys.exit(main(sys.argv[1:]))")


def test_ctrl_c_during_fit_is_one_line_exit_130_and_resume_finishes(tmp_path, capsys, sched):
    """Issue 10: Ctrl-C in a terminal (SIGINT to the whole foreground process group: the
    command and the workers of its local cluster) stops a fit with one line, exit status
    130 and no traceback; --resume then finishes it and equals an uninterrupted fit."""
    import json
    import os
    import signal
    import time

    store, model = tmp_path / "noise.zarr", tmp_path / "m"
    ckpt = tmp_path / "m.checkpoint"
    z = _noise_store(store, n=24000, size=32, chunk_rows=200)
    args = ["fit", store, "--attribute", "Eyeglasses", "-k", "5", "--out", model,
            "--rows-per-chunk", "200"]
    # another test's cluster may hold the dashboard port: that warning is not under test
    env = dict(os.environ, PYTHONWARNINGS="ignore:Port 8787 is already in use")
    proc = subprocess.Popen([sys.executable, "-c", TWO_CORES, *map(str, args)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)  # its own group, as a terminal job has
    try:
        deadline = time.monotonic() + 300
        while True:  # until the checkpoint holds a finished segment
            try:
                if json.loads((ckpt / "progress.json").read_text())["done"]:
                    break
            except (OSError, ValueError, KeyError):
                pass
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.02)
        os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    done = json.loads((ckpt / "progress.json").read_text())["done"]
    lines = err.splitlines()
    assert proc.returncode == 130, err
    assert "Traceback" not in err and len(lines) == 3, err
    assert lines[0].startswith("dfairpca: local Dask cluster, ") and lines[1].startswith(
        "dfairpca: dashboard "), err
    assert 1 <= len(done) < 8
    assert lines[2] == (f"dfairpca fit: interrupted after {16 * len(done)} of 120 chunks; "
                        "rerun with --resume")
    assert not model.exists()

    code, out, err = run([*args, "--resume", *sched], capsys)
    assert code == 0, err
    assert not ckpt.exists()
    X = dfairpca.from_zarr(store, "images", rows_per_chunk=200)
    ref = dfairpca.FairPCA(5).fit(X, sensitive_features=z)
    got = dfairpca.load(model)
    np.testing.assert_allclose(np.abs(got.components_ @ ref.components_.T), np.eye(5), atol=1e-4)


def tree(path):
    """Every file and folder under ``path``, with file contents and modification times."""
    return {str(p): (p.read_bytes(), p.stat().st_mtime_ns) if p.is_file() else None
            for p in sorted([path, *path.rglob("*")])}


# every refusal must come before any cluster: the scheduler given is a port nobody serves
NO_CLUSTER = ["--scheduler", "tcp://127.0.0.1:9", "--timeout", "1"]


def test_outputs_never_replace_what_dfairpca_did_not_write(store, tmp_path, capsys):
    """The issue's reproductions: --out/--checkpoint on a user's folder, on the input store
    and on a folder holding it; refused before any work, nothing deleted."""
    res = tmp_path / "res"
    (res / "sub").mkdir(parents=True)
    (res / "thesis.tex").write_text("x\n")
    before = {p: tree(p) for p in (store, res)}
    fit = ["fit", store, "--attribute", "Eyeglasses", "-k", "5"]
    cases = [
        ([*fit, "--out", res, "--overwrite"], "res is a non-empty directory that dfairpca did not write"),
        ([*fit, "--out", tmp_path / "m", "--checkpoint", res, "--overwrite"], "did not write"),
        ([*fit, "--out", tmp_path / "m", "--checkpoint", res, "--resume"], "did not write"),
        ([*fit, "--out", tmp_path / "m", "--checkpoint", store, "--overwrite"], "is the input store"),
        ([*fit, "--out", tmp_path / "m", "--checkpoint", store.parent, "--overwrite"],
         "contains the input store"),
        ([*fit, "--out", store, "--overwrite"], "is the input store"),
        ([*fit, "--out", store.parent, "--overwrite"], "contains the input store"),
        ([*fit, "--out", tmp_path / "m", "--checkpoint", tmp_path / "m"], "is the checkpoint"),
        (["transform", tmp_path / "m", store, "--out", store, "--overwrite"], "is the input store"),
        (["transform", tmp_path / "m", store, "--out", res, "--overwrite"], "did not write"),
        (["show", tmp_path / "m", store, "--out", res / "thesis.tex", "--overwrite"],
         "is a file that dfairpca did not write"),
        (["synth-celeba", res, "--n", "10", "--overwrite"], "did not write"),
    ]
    for args, message in cases:
        cluster = NO_CLUSTER if args[0] in ("fit", "transform") else []
        code, out, err = run([*args, *cluster], capsys)
        assert code == 2 and message in err and "Traceback" not in err, (args, err)
        assert "remove it yourself" in err or "choose another path" in err
        assert {p: tree(p) for p in (store, res)} == before, args
    assert sorted(p.name for p in tmp_path.iterdir()) == ["res"]


def test_a_read_only_output_folder_is_refused_before_any_cluster(store, tmp_path, capsys):
    from test_io import read_only

    locked = tmp_path / "locked"
    locked.mkdir()
    with read_only(locked):
        for args in (["fit", store, "--attribute", "Eyeglasses", "-k", "5", "--out", locked / "m",
                      *NO_CLUSTER],
                     ["fit", store, "--attribute", "Eyeglasses", "-k", "5", "--out", tmp_path / "m",
                      "--checkpoint", locked / "ck", *NO_CLUSTER],
                     ["transform", tmp_path / "m", store, "--out", locked / "r.zarr", *NO_CLUSTER],
                     ["synth-celeba", locked / "s.zarr", "--n", "10"]):
            code, _, err = run(args, capsys)
            assert code == 2 and f"{locked} is not writable" in err, (args, err)
            assert "writable directory" in err
    assert list(locked.iterdir()) == []


def test_checkpoint_overwrite_replaces_only_a_checkpoint(store, tmp_path, capsys, sched):
    """--overwrite discards dfairpca's own checkpoint, and the fit removes it when done."""
    from dfairpca.checkpoint import compute_moments_checkpointed

    model, ckpt = tmp_path / "m", tmp_path / "ck"
    X = dfairpca.from_zarr(store, "images").reshape(1500, -1)
    compute_moments_checkpointed(X[:500], checkpoint=ckpt)  # another job's checkpoint
    args = ["fit", store, "--attribute", "Eyeglasses", "-k", "5", "--out", model, "--checkpoint", ckpt,
            *sched]
    code, _, err = run(args, capsys)
    assert code == 2 and "--overwrite to start over" in err and ckpt.exists()
    code, _, err = run([*args, "--overwrite"], capsys)
    assert code == 0, err
    assert not ckpt.exists() and dfairpca.io.read_marker(model)["kind"] == "model"
    # a model is not a checkpoint, even with --overwrite
    code, _, err = run([*args[:6], "--out", tmp_path / "m2", "--checkpoint", model, "--overwrite",
                        *NO_CLUSTER], capsys)
    assert code == 2 and "holds a dfairpca model, not a checkpoint" in err
    assert dfairpca.load(model).n_components_ == 5
