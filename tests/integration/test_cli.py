"""The dfairpca command line on real (small) CelebA-schema stores and a real cluster."""

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import zarr
from PIL import Image

import dfairpca
from dfairpca.celeba import synth_celeba
from dfairpca.cli import main
from processes import interrupted


def without_dashboard(lines: list[str]) -> list[str]:
    """``lines`` of a command's stderr without the dashboard's line, after checking that it
    is there once where bokeh (which draws the dashboard) is installed, else not at all."""
    import importlib.util

    told = [line for line in lines if line.startswith("dfairpca: dashboard ")]
    assert len(told) == (importlib.util.find_spec("bokeh") is not None), lines
    return [line for line in lines if line not in told]


def assert_refused_at_once(fit, cases, capsys):
    """Each (extra arguments, expected text) of ``dfairpca fit`` is a one-line error, exit
    2, without connecting: the tests point --scheduler at a dead address, which a
    connection would wait for (--timeout) and then name in its error ("scheduler")."""
    for extra, expected in cases:
        code, _, err = run(fit + extra, capsys)
        assert code == 2 and expected in err and "scheduler" not in err, (extra, err)
        assert err.startswith("dfairpca fit: error: ") and err.count("\n") == 1, err


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


def test_fit_of_a_store_of_fill_values_only_is_a_one_line_error(tmp_path, capsys, sched):
    """Every chunk absent, read as fill values (--missing-chunks fill): zero variance,
    refused instead of "nan% of the variance kept" and a model."""
    data = tmp_path / "x.zarr"
    zarr.create_array(str(data), shape=(40, 6), chunks=(10, 6), dtype="float64", fill_value=0.0)
    code, out, err = run(["fit", data, "--method", "pca", "-k", "2", "--out", tmp_path / "m",
                          "--missing-chunks", "fill", *sched], capsys)
    assert code == 1 and "variance kept" not in out and not (tmp_path / "m").exists(), out + err
    assert err.startswith("dfairpca fit: error: X has zero total variance: all its 40 rows are zero")
    assert "missing_chunks='fill'" in err and err.count("\n") == 1, err


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
    assert code == 1 and "--overwrite" in err and dfairpca.load(model).n_components_ == 20
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
    assert dfairpca.io.read_marker(rep)["kind"] == "transform output"
    # every chunk on disk, the all-zero ones too (the first 256 rows are all "train", 0)
    assert not g["partition"][:256].any()
    for name in ("representation", "attributes", "partition"):
        a = g[name]
        for i in range(-(-a.shape[0] // a.chunks[0])):
            assert rep.joinpath(name, "c", str(i), *["0"] * (a.ndim - 1)).is_file(), (name, i)
    # a user's file inside the written array's own folder: named, kept, never overwritten
    assert dfairpca.io.foreign_entries(rep, dfairpca.io.read_marker(rep)) == []
    notes = rep / "representation" / "c" / "notes.txt"
    notes.write_text("mine")
    again = ["transform", model, store, "--out", rep, "--overwrite", *sched]
    code, _, err = run(again, capsys)
    assert code == 1 and "(representation/c/notes.txt)" in err and notes.read_text() == "mine", err
    notes.unlink()
    code, _, err = run(again, capsys)  # a clean output: no false positive
    assert code == 0, err

    rec = tmp_path / "rec.zarr"
    code, out, err = run(["transform", model, store, "--out", rec, "--reconstruct", *sched], capsys)
    assert code == 0, err
    imgs = zarr.open_group(str(rec), mode="r")["images"]
    assert imgs.shape == (1500, 16, 16) and imgs.dtype == np.uint8
    assert dfairpca.io.foreign_entries(rec, dfairpca.io.read_marker(rec)) == []

    png = tmp_path / "faces.png"
    code, out, err = run(["show", model, store, "--out", png, "--n", "3"], capsys)
    assert code == 0, err
    assert str(png) in out
    assert dfairpca.io.read_marker(png)["kind"] == "figure"
    code, out, err = run(["show", model, store, "--out", png, "--n", "3"], capsys)
    assert code == 1 and "--overwrite" in err
    code, out, err = run(["show", model, store, "--out", png, "--n", "3", "--overwrite"], capsys)
    assert code == 0, err
    with Image.open(png) as im:
        assert im.format == "PNG" and im.size[0] > 200 and im.size[1] > 200


def test_fit_methods(store, tmp_path, capsys, sched):
    for method in ("pca", "fair-s"):
        attribute = [] if method == "pca" else ["--attribute", "Male"]  # pca refuses one
        code, out, err = run(["fit", store, *attribute, "-k", "5", "--method", method,
                              "--out", tmp_path / method, *sched], capsys)
        assert code == 0, err
        assert ("fairness certified: group-mean gap kept" in out) == (method != "pca")
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
    assert code == 1 and "remove it yourself" in err
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
    for cmd in ("synth-celeba", "ingest-celeba", "fit", "transform", "erase", "evaluate", "show", "demo"):
        assert cmd in out.stdout


def test_fit_resumes_from_checkpoint(store, tmp_path, capsys, sched, stop_after, monkeypatch):
    """An interrupted fit leaves a checkpoint; --resume finishes it with the same result."""
    from dfairpca.engine.checkpoint import compute_moments_checkpointed
    from dfairpca.stats._auto import AUTO_ENV
    from dfairpca.stats._exact import statistics_dtype

    # "auto" measured in this process and on the workers could differ where the kernels
    # are close: the environment decides for both (and for the workers, through the CLI)
    monkeypatch.setenv(AUTO_ENV, "exact")

    model, ckpt = tmp_path / "m", tmp_path / "m.checkpoint"
    X = dfairpca.from_zarr(store, "images", rows_per_chunk=100)
    z = dfairpca.celeba.attribute_column(store, "Eyeglasses")
    import pandas as pd

    g = pd.DataFrame({"Eyeglasses": z})
    with pytest.raises(KeyboardInterrupt):  # the same pass the CLI runs, stopped half-way
        compute_moments_checkpointed(X.reshape(len(z), -1), sensitive_features=g, checkpoint=ckpt,
                                     dtype=statistics_dtype(np.uint8),  # the CLI's default here
                                     on_segment=stop_after(1), segment_rows=300)
    code, _, err = run(["fit", store, "--attribute", "Eyeglasses", "-k", "5", "--out", model, *sched], capsys)
    assert code == 1 and "--resume" in err
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

    nowhere = ["--scheduler", _nowhere(), "--timeout", "60"]
    fit = ["fit", store, "--attribute", "Eyeglasses", "--out", tmp_path / "m", *nowhere]
    cases = [
        (["-k", "256"], "largest k is"),
        (["-k", "0"], "argument -k/--k: must be an integer >= 1; got '0'"),
        (["-k", "5", "--tradeoff", "1.5"], "tradeoff must be a number in [0, 1]"),
        (["-k", "5", "--method", "fair-s", "--equalize", "0"], "equalize_covariance"),
        (["-k", "5", "--rows-per-chunk", "0"], "--rows-per-chunk: must be an integer >= 1"),
        (["-k", "5", "--rows-per-chunk", "-3"], "--rows-per-chunk: must be an integer >= 1"),
        (["-k", "5", "--constraint", "equal_opportunity"], "--target"),
        (["-k", "5", "--timeout", "0"], "--timeout: must be a positive number"),
    ]
    assert_refused_at_once(fit, cases, capsys)
    code, _, err = run(["fit", store, "-k", "257", "--method", "pca", "--out", tmp_path / "m",
                        *nowhere], capsys)
    assert code == 2 and "n_components=257 is too large" in err and "scheduler" not in err, err
    assert not (tmp_path / "m").exists()
    # transform: a model of 16x16 images applied to 8x8 images
    code, _, err = run(["fit", store, "--attribute", "Male", "-k", "3", "--out",
                        tmp_path / "m16", *sched], capsys)
    assert code == 0, err
    small = tmp_path / "small.zarr"
    synth_celeba(small, n=300, size=8, chunk_rows=100, progress=False, n_jobs=1)
    code, _, err = run(["transform", tmp_path / "m16", small, "--out", tmp_path / "t.zarr",
                        *nowhere], capsys)
    assert code == 2 and "64 features" in err and "scheduler" not in err, err  # not connected
    assert not (tmp_path / "t.zarr").exists()
    code, _, err = run(["show", tmp_path / "m16", store, "--n", "0"], capsys)
    assert code == 2 and "argument --n: must be an integer >= 1; got '0'" in err


def test_options_the_method_would_ignore_are_refused_before_any_cluster(store, tmp_path,
                                                                         capsys):
    """A fit option that --method ignores is a one-line error naming the fix, at once; an
    option written out at its default is not one the user needs to drop."""

    fit = ["fit", store, "-k", "5", "--out", tmp_path / "m", "--scheduler", _nowhere(),
           "--timeout", "60"]
    eye = ["--attribute", "Eyeglasses"]
    cases = [
        ([*eye, "--equalize", "0.3"], "--equalize needs --method fair-s"),
        ([*eye, "--method", "fair", "--equalize", "0.7"], "--equalize needs --method fair-s"),
        (["--method", "pca", "--equalize", "0.3"], "--equalize needs --method fair-s"),
        (["--method", "pca", "--tradeoff", "0.5"], "--tradeoff needs --method fair or fair-s"),
        (["--method", "pca", "--constraint", "equal_opportunity", "--target", "Smiling"],
         "--constraint needs --method fair or fair-s"),
        (["--method", "pca", *eye], "--attribute needs --method fair or fair-s"),
        (["--method", "pca", "--sensitive-array", "x"],
         "--sensitive-array needs --method fair or fair-s"),
    ]
    assert_refused_at_once(fit, cases, capsys)
    assert not (tmp_path / "m").exists()
    # defaults written out are harmless: these reach the cluster (nothing listens there)
    for extra in (["--method", "pca", "--tradeoff", "0", "--constraint", "demographic_parity"],
                  [*eye, "--method", "fair-s", "--equalize", "0.5"]):
        code, _, err = run(fit + extra + ["--timeout", "0.5"], capsys)
        assert code == 1 and "needs --method" not in err and "scheduler" in err.lower(), err


def test_a_single_group_names_its_label_plainly_and_the_cli_fix(store, tmp_path, capsys):
    n = dfairpca.celeba.open_celeba(store)[0].shape[0]
    table = tmp_path / "people.csv"
    table.write_text("site\n" + "1\n" * n)  # pandas reads it as int64
    code, _, err = run(["fit", store, "-k", "5", "--out", tmp_path / "m", "--sensitive-csv",
                        table, "--sensitive-column", "site", "--scheduler", _nowhere()], capsys)
    assert code == 2 and err.count("\n") == 1, err
    assert "'site' has a single group (1) in all 1,500 rows" in err, err
    assert "--method pca" in err and "np." not in err and "dfairpca.PCA" not in err, err
    assert not (tmp_path / "m").exists()


def test_show_n_is_checked_against_the_store_before_drawing(store, tmp_path, capsys, sched):
    """show --n 100000 on a small store was minutes and gigabytes of subplots; now it is
    refused at once with the largest value, and the default shrinks to a tiny store."""

    model, pca = tmp_path / "m", tmp_path / "p"
    assert run(["fit", store, "--attribute", "Eyeglasses", "-k", "3", "--out", model, *sched],
               capsys)[0] == 0
    assert run(["fit", store, "--method", "pca", "-k", "3", "--out", pca, *sched], capsys)[0] == 0
    from dfairpca.celeba.figures import MAX_FACES_PER_ROW as MAX_SHOW_N

    code, _, err = run(["show", model, store, "--out", tmp_path / "a.png", "--n", "100000"], capsys)
    assert code == 2 and f"use --n {MAX_SHOW_N} or less" in err and err.count("\n") == 1, err
    assert not (tmp_path / "a.png").exists()
    # a store of 10 faces: 3 with eyeglasses, 7 without -> at most 7 per row (PCA: 5)
    tiny = tmp_path / "tiny.zarr"
    g = zarr.open_group(str(tiny), mode="w")
    g.create_array("images", shape=(10, 16, 16), chunks=(10, 16, 16), dtype="uint8")[:] = 7
    src = zarr.open_group(str(store), mode="r")["attributes"]
    names = list(src.attrs["names"])
    flags = np.zeros((10, len(names)), dtype="int8")
    flags[:3, names.index("Eyeglasses")] = 1
    attrs = g.create_array("attributes", shape=flags.shape, chunks=flags.shape, dtype="int8")
    attrs[:] = flags
    attrs.attrs.update(dict(src.attrs))
    for m, largest in ((model, 7), (pca, 5)):
        code, _, err = run(["show", m, tiny, "--out", tmp_path / "t.png", "--n", "9"], capsys)
        assert code == 2 and f"can fill at most {largest} per row" in err, err
        assert f"use --n {largest} or less" in err, err
        code, _, err = run(["show", m, tiny, "--out", tmp_path / f"{m.name}.png", "--n",
                            str(largest)], capsys)
        assert code == 0, err
    code, _, err = run(["show", pca, tiny, "--out", tmp_path / "default.png"], capsys)
    assert code == 0, err  # the default 8 shrinks to 5


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


# TWO_CORES, with the disk stalled once the first checkpoint is written (the next save
# waits a minute): a fit of 120 small chunks takes about 4 s, and on a loaded machine the
# test process once took longer than that to send its Ctrl-C, so the fit had finished.  The
# stall makes the moment of the Ctrl-C certain; the Ctrl-C during a running computation is
# test_cluster's test_ctrl_c_on_a_local_cluster_prints_nothing_of_its_own.
STALLED_AFTER_ONE_SEGMENT = (
    "import time; from dfairpca.engine import checkpoint; saved = checkpoint._save\n"
    "def _save(*args, **kwargs):\n"
    "    if (args[0] / 'progress.json').exists(): time.sleep(60)\n"
    "    saved(*args, **kwargs)\n"
    "checkpoint._save = _save\n" + TWO_CORES)


def test_ctrl_c_during_fit_is_one_line_exit_130_and_resume_finishes(tmp_path, capsys, sched):
    """Issue 10: Ctrl-C in a terminal (SIGINT to the whole foreground process group: the
    command and the workers of its local cluster) stops a fit with one line, exit status
    130 and no traceback; --resume then finishes it and equals an uninterrupted fit."""
    import json
    import os
    import time

    store, model = tmp_path / "noise.zarr", tmp_path / "m"
    ckpt = tmp_path / "m.checkpoint"
    z = _noise_store(store, n=24000, size=32, chunk_rows=200)
    args = ["fit", store, "--attribute", "Eyeglasses", "-k", "5", "--out", model,
            "--rows-per-chunk", "200"]
    # another test's cluster may hold the dashboard port: that warning is not under test
    env = dict(os.environ, PYTHONWARNINGS="ignore:Port 8787 is already in use")

    def a_segment_is_saved(proc):
        deadline = time.monotonic() + 300
        while True:  # until the checkpoint holds a finished segment
            try:
                if json.loads((ckpt / "progress.json").read_text())["done"]:
                    return
            except (OSError, ValueError, KeyError):
                pass
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.02)

    returncode, out, err = interrupted(
        [sys.executable, "-c", STALLED_AFTER_ONE_SEGMENT, *map(str, args)],
        a_segment_is_saved, timeout=300, env=env)  # bounds a hang: it exits in seconds
    # on a loaded machine distributed may log that an event loop was unresponsive: that
    # line is the machine's, not the interrupt's, so it is the only other line allowed
    lines = [line for line in err.splitlines() if "Event loop was unresponsive" not in line]
    assert returncode == 130, (err, sorted(p.name for p in tmp_path.iterdir()))
    lines = without_dashboard(lines)
    assert "Traceback" not in err and len(lines) == 2, err
    assert lines[0].startswith("dfairpca: local Dask cluster, "), err
    assert json.loads((ckpt / "progress.json").read_text())["done"] == [0]
    assert lines[1] == "dfairpca fit: interrupted after 16 of 120 chunks; rerun with --resume"
    assert not model.exists()

    code, out, err = run([*args, "--resume", *sched], capsys)
    assert code == 0, err
    assert not ckpt.exists()
    X = dfairpca.from_zarr(store, "images", rows_per_chunk=200)
    ref = dfairpca.FairPCA(5).fit(X, sensitive_features=z)
    got = dfairpca.load(model)
    np.testing.assert_allclose(np.abs(got.components_ @ ref.components_.T), np.eye(5), atol=1e-4)


def _sigterm(tmp_path, script, args, wait, group=False):
    """(returncode, stderr lines) of ``dfairpca ARGS`` run by ``script`` and sent SIGTERM
    once ``wait()`` is true: to its process alone (what ``kill``, ``timeout`` and
    Kubernetes do), or with ``group`` to its process group (SLURM's job step)."""
    import os
    import signal
    import time

    env = dict(os.environ, PYTHONWARNINGS="ignore:Port 8787 is already in use")
    proc = subprocess.Popen([sys.executable, "-c", script, *map(str, args)], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while not wait():
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.02)
        (os.killpg if group else os.kill)(proc.pid, signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    # on a loaded machine distributed may log that an event loop was unresponsive
    return proc.returncode, [line for line in err.splitlines()
                             if "Event loop was unresponsive" not in line]


def test_sigterm_during_fit_is_ctrl_c_exit_143_naming_the_checkpoint(tmp_path):
    """SIGTERM (kill, timeout, SLURM, Kubernetes) mid-pass stops a fit as Ctrl-C does: one
    line naming the checkpoint that holds what was done, exit status 143, no traceback,
    nothing left but the store and the checkpoint, and multiprocessing's resource tracker
    has no leaked semaphores to report (the local cluster closed in order)."""
    import json

    store, model = tmp_path / "noise.zarr", tmp_path / "m"
    ckpt = tmp_path / "m.checkpoint"
    _noise_store(store, n=24000, size=32, chunk_rows=200)

    def a_segment_is_saved():
        try:
            return bool(json.loads((ckpt / "progress.json").read_text())["done"])
        except (OSError, ValueError, KeyError):
            return False

    code, lines = _sigterm(tmp_path, STALLED_AFTER_ONE_SEGMENT,
                           ["fit", store, "--attribute", "Eyeglasses", "-k", "5", "--out", model,
                            "--rows-per-chunk", "200"], a_segment_is_saved)
    err = "\n".join(lines)
    said = [line for line in lines if not line.startswith("dfairpca: ")]  # the local cluster's notes
    assert code == 143, err
    assert "Traceback" not in err and "leaked semaphore" not in err and len(said) == 1, err
    assert said[0] == (f"dfairpca fit: terminated (SIGTERM) after 16 of 120 chunks, kept in the "
                       f"checkpoint {str(ckpt)!r}; rerun with --resume"), err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.checkpoint", "noise.zarr"]
    assert json.loads((ckpt / "progress.json").read_text())["done"] == [0]


# TWO_CORES, with the output written in full and then held a minute before it is moved
# into place: a SIGTERM then comes while the output's temporary is there, whatever the
# machine's speed
STALLED_BEFORE_THE_MOVE = (
    "import time; from pathlib import Path; from dfairpca.io._local import LocalStorage\n"
    "move = LocalStorage.move_into_place\n"
    "def stalled(self, *args, **kwargs):\n"
    "    Path('../written').touch(); time.sleep(60)\n"
    "    move(self, *args, **kwargs)\n"
    "LocalStorage.move_into_place = stalled\n" + TWO_CORES)


@pytest.mark.parametrize("group", [False, True], ids=["process", "process group"])
def test_sigterm_while_erase_writes_removes_its_temporary_exit_143(tmp_path, group):
    store = tmp_path / "noise.zarr"
    _noise_store(store, n=2000, size=16, chunk_rows=200)
    work = tmp_path / "work"
    work.mkdir()
    code, lines = _sigterm(work, STALLED_BEFORE_THE_MOVE,
                           ["erase", store, "--attribute", "Eyeglasses", "--out", work / "e.zarr"],
                           (tmp_path / "written").exists, group=group)
    err = "\n".join(lines)
    assert code == 143, err
    assert "Traceback" not in err and "leaked semaphore" not in err, err
    assert lines[-1] == "dfairpca erase: terminated (SIGTERM); nothing it was writing was kept", err
    assert [p.name for p in work.iterdir()] == [], err  # the temporary removed, no lock left


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
        ([*fit, "--out", store / "model"], "is inside the input store"),
        ([*fit, "--out", tmp_path / "m", "--checkpoint", store / "ck"], "is inside the input store"),
        (["transform", tmp_path / "m", store, "--out", store / "rep.zarr"], "is inside the input store"),
        (["transform", tmp_path / "m", store, "--out", store, "--overwrite"], "is the input store"),
        (["transform", tmp_path / "m", store, "--out", res, "--overwrite"], "did not write"),
        (["show", tmp_path / "m", store, "--out", res / "thesis.tex", "--overwrite"],
         "is a file that dfairpca did not write"),
        (["synth-celeba", res, "--n", "10", "--overwrite"], "did not write"),
    ]
    for args, message in cases:
        cluster = NO_CLUSTER if args[0] in ("fit", "transform") else []
        code, out, err = run([*args, *cluster], capsys)
        assert code == 1 and message in err and "Traceback" not in err, (args, err)
        assert "remove it yourself" in err or "choose another path" in err
        assert {p: tree(p) for p in (store, res)} == before, args
    assert sorted(p.name for p in tmp_path.iterdir()) == ["res"]


def test_overwrite_keeps_an_array_and_an_attribute_the_user_added_to_dfairpcas_stores(
        store, tmp_path, capsys, sched):
    """Users keep their labels inside stores (--sensitive-array): an array or attribute
    added to a store dfairpca wrote (synth, transform) is refused by name, never dropped."""
    import zarr

    synth = ["synth-celeba", tmp_path / "s.zarr", "--n", "300", "--size", "16", "--n-jobs", "1"]
    model, rep = tmp_path / "m", tmp_path / "rep.zarr"
    transform = ["transform", model, store, "--out", rep, *sched]
    for args in (synth, ["fit", store, "--attribute", "Eyeglasses", "-k", "3", "--out", model, *sched],
                 transform):
        code, _, err = run(args, capsys)
        assert code == 0, err
    for path, member in ((tmp_path / "s.zarr", "my_hand_labels"), (rep, "my_clusters")):
        group = zarr.open_group(str(path), mode="r+")
        group.create_array(member, data=np.arange(7))
        group.attrs["my_note"] = "hello"
    for args, path, member in ((synth, tmp_path / "s.zarr", "my_hand_labels"),
                               (transform, rep, "my_clusters")):
        before = tree(path)
        code, _, err = run([*args, "--overwrite"], capsys)
        assert code == 1 and member in err and "'my_note'" in err and "move your files out" in err, err
        assert tree(path) == before, args
        group = zarr.open_group(str(path), mode="r+")
        del group[member]
        del group.attrs["my_note"]
        code, _, err = run([*args, "--overwrite"], capsys)  # what dfairpca wrote: replaced
        assert code == 0, err


def test_an_attribute_named_twice_is_refused_before_any_cluster(store, tmp_path, capsys):
    fit = ["fit", store, "-k", "5", "--out", tmp_path / "m", *NO_CLUSTER]
    cases = [(["--attribute", "Eyeglasses", "--attribute", "Eyeglasses"],
              "--attribute names 'Eyeglasses' twice; give it once")]
    assert_refused_at_once(fit, cases, capsys)
    assert list(tmp_path.iterdir()) == []


def test_a_malformed_scheduler_address_is_one_line_naming_a_valid_one(store, tmp_path, capsys):

    fit = ["fit", store, "--attribute", "Eyeglasses", "-k", "5", "--out", tmp_path / "m"]
    (tmp_path / "s.json").write_text('{"address": 5}')
    for where in (["--scheduler", "htp:/x"], ["--scheduler-file", tmp_path / "s.json"]):
        code, _, err = run([*fit, *where, "--timeout", "60"], capsys)
        assert code == 2 and err.count("\n") == 1, err
        # refused before connecting: a connection's error would name the reply it waited for
        assert "is not a scheduler address" in err and "tcp://host:8786" in err, err
        assert "reply" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.json"]


def test_an_output_without_a_name_of_its_own_is_refused_before_any_cluster(store, tmp_path,
                                                                          capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    fit = ["fit", store, "--attribute", "Eyeglasses", "-k", "5"]
    for args in ([*fit, "--out", ".", *NO_CLUSTER], [*fit, "--out", "..", *NO_CLUSTER],
                 [*fit, "--out", "m", "--checkpoint", ".", *NO_CLUSTER],
                 ["transform", "m", store, "--out", ".", *NO_CLUSTER],
                 ["synth-celeba", ".", "--n", "10"]):
        code, _, err = run(args, capsys)
        assert code == 1 and "has no name of its own" in err and "empty name" not in err, (args, err)
        assert err.count("\n") == 1, err
    assert list(tmp_path.iterdir()) == []


def test_faces_too_large_to_draw_are_one_line_before_anything_is_written(tmp_path, capsys):
    out = tmp_path / "s.zarr"
    code, _, err = run(["synth-celeba", out, "--n", "10", "--size", "99999x99999", "--n-jobs", "1"],
                       capsys)
    assert code == 1 and err.count("\n") == 1 and "GiB" in err and "smaller size" in err, err
    assert "Traceback" not in err and list(tmp_path.iterdir()) == []  # nothing left behind


def test_transform_never_replaces_a_data_store(store, tmp_path, capsys):
    """A data set written by synth or ingest (hours of an ingest) is another kind than what
    transform writes: transform --overwrite refuses it, and synth refuses a transform's."""
    import shutil

    data = tmp_path / "data.zarr"
    shutil.copytree(store, data)
    before = tree(data)
    code, _, err = run(["transform", tmp_path / "m", store, "--out", data, "--overwrite", *NO_CLUSTER],
                       capsys)
    assert code == 1 and "holds a dfairpca store, not a transform output" in err, err
    assert tree(data) == before


def test_a_store_with_malformed_metadata_is_one_line_and_a_bug_keeps_its_traceback(tmp_path, capsys):
    """A user's Zarr store whose zarr.json is not JSON: one line naming the document (checked
    before zarr parses it); what is no refusal at all is left to its traceback
    (tests/test_errors.py)."""
    store = tmp_path / "d.zarr"
    group = zarr.open_group(str(store), mode="w")
    group.create_array("X", data=np.random.default_rng(0).normal(size=(50, 4)))
    group.create_array("z", data=np.arange(50) % 2)
    (store / "X" / "zarr.json").write_text("{not json")
    code, _, err = run(["fit", store, "--array", "X", "--sensitive-array", "z", "-k", "2", "--out",
                        tmp_path / "m", *NO_CLUSTER], capsys)
    assert code == 1 and err.count("\n") == 1, err
    assert "d.zarr/X/zarr.json is not valid Zarr metadata: it is not JSON" in err, err


def test_a_read_only_output_folder_is_refused_before_any_cluster(store, tmp_path, capsys):
    from test_writes import read_only

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
            assert code == 1 and f"{locked} is not writable" in err, (args, err)
            assert "writable directory" in err
    assert list(locked.iterdir()) == []


def test_checkpoint_overwrite_replaces_only_a_checkpoint(store, tmp_path, capsys, sched):
    """--overwrite discards dfairpca's own checkpoint, and the fit removes it when done."""
    from dfairpca.engine.checkpoint import compute_moments_checkpointed

    model, ckpt = tmp_path / "m", tmp_path / "ck"
    X = dfairpca.from_zarr(store, "images").reshape(1500, -1)
    compute_moments_checkpointed(X[:500], checkpoint=ckpt)  # another job's checkpoint
    args = ["fit", store, "--attribute", "Eyeglasses", "-k", "5", "--out", model, "--checkpoint", ckpt,
            *sched]
    code, _, err = run(args, capsys)
    assert code == 1 and "--overwrite to start over" in err and ckpt.exists()
    code, _, err = run([*args, "--overwrite"], capsys)
    assert code == 0, err
    assert not ckpt.exists() and dfairpca.io.read_marker(model)["kind"] == "model"
    # a model is not a checkpoint, even with --overwrite
    code, _, err = run([*args[:6], "--out", tmp_path / "m2", "--checkpoint", model, "--overwrite",
                        *NO_CLUSTER], capsys)
    assert code == 1 and "holds a dfairpca model, not a checkpoint" in err
    assert dfairpca.load(model).n_components_ == 5


# ----------------------------------------------------------------------------- any Zarr array
N_ROWS, N_FEATURES = 600, 12


@pytest.fixture(scope="module")
def data_store(tmp_path_factory):
    """A plain (not CelebA) store: X float64 (n, 3, 4) in a nested group, text labels of
    three groups, a (n, 2) label array with column names, a 0/1 task label, and the same
    labels in a CSV and a Parquet file."""
    import pandas as pd

    root = tmp_path_factory.mktemp("data")
    rng = np.random.default_rng(7)
    race = rng.choice(np.array(["a", "b", "c"]), N_ROWS, p=[0.5, 0.3, 0.2])
    sex = rng.integers(0, 2, N_ROWS)
    y = (rng.random(N_ROWS) < 0.6).astype(np.int8)
    # well separated variances, so that every solve finds the same components
    X = rng.normal(size=(N_ROWS, N_FEATURES)) * np.linspace(4, 1, N_FEATURES)
    X[race == "b"] += 1.0
    X[sex == 1, :3] -= 0.7
    g = zarr.open_group(str(root / "data.zarr"), mode="w")
    g.create_array("features/X", shape=(N_ROWS, 3, 4), chunks=(200, 3, 4), dtype="f8")[:] = \
        X.reshape(N_ROWS, 3, 4)
    g.create_array("race", shape=(N_ROWS,), chunks=(N_ROWS,), dtype=str)[:] = race
    both = g.create_array("people", shape=(N_ROWS, 2), chunks=(N_ROWS, 2), dtype="i8")
    both[:] = np.column_stack([sex, race == "c"])
    both.attrs["names"] = ["sex", "is_c"]
    g.create_array("y", shape=(N_ROWS,), chunks=(N_ROWS,), dtype="i1")[:] = y
    g.create_array("words", shape=(N_ROWS, 2), chunks=(N_ROWS, 2), dtype=str)[:] = \
        np.column_stack([race, race])
    table = pd.DataFrame({"id": np.arange(N_ROWS), "race": race, "sex": sex, "y": y})
    table.to_csv(root / "people.csv", index=False)
    table.to_parquet(root / "people.parquet")
    table.iloc[:-1].to_csv(root / "short.csv", index=False)
    return {"root": root, "store": root / "data.zarr", "X": X, "race": race, "sex": sex, "y": y}


def same_subspace(a, b, atol=1e-6):
    np.testing.assert_allclose(np.abs(a.components_ @ b.components_.T), np.eye(len(a.components_)),
                               atol=atol)


def test_fit_any_zarr_array_with_labels_from_an_array_json_summary(data_store, tmp_path, capsys,
                                                                   sched):
    """--array names X inside the store ((n, 3, 4) is flattened), --sensitive-array its
    text labels; --json prints exactly one line on stdout, the summary, and the human
    lines go to stderr."""
    import json

    d = data_store
    model = tmp_path / "m"
    code, out, err = run(["fit", d["store"], "--array", "features/X", "--sensitive-array", "race",
                          "-k", "4", "--out", model, "--json", *sched], capsys)
    assert code == 0, err
    assert out.count("\n") == 1 and out.endswith("\n")
    summary = json.loads(out)
    est = dfairpca.load(model)
    ref = dfairpca.FairPCA(4).fit(d["X"], sensitive_features=d["race"])
    same_subspace(est, ref)
    assert est.attribute_names_ == ["race"] and [list(c) for c in est.groups_] == [["a", "b", "c"]]
    labels, counts = np.unique(d["race"], return_counts=True)
    assert summary["groups"] == {"race": dict(zip(labels.tolist(), counts.tolist()))}
    assert summary["n"] == N_ROWS and summary["d"] == N_FEATURES and summary["k"] == 4
    assert summary["method"] == "fair" and summary["estimator"] == "FairPCA"
    assert summary["svd_solver"] == "covariance_eigh"  # what "auto" chose (checkpointed: exact)
    assert summary["constraint"] == "demographic_parity" and summary["n_constraints"] == 2
    assert summary["n_samples_seen"] == N_ROWS
    assert summary["explained_variance_ratio_sum"] == pytest.approx(
        est.explained_variance_ratio_.sum(), rel=1e-12)
    assert summary["out"] == str(model) and summary["array"] == f"{d['store']}/features/X"
    assert 0 < summary["fit_seconds"] <= summary["wall_seconds"]
    # the fairness certificate, whichever fields the estimator carries
    certificate = {a[:-1]: getattr(est, a) for a in vars(est) if a.startswith("fairness_")}
    assert {"fairness_violation", "fairness_violation_per_attribute"} <= set(certificate)
    assert summary["fairness_violation"] < 1e-12
    for key, value in certificate.items():
        np.testing.assert_allclose(summary[key], value, rtol=1e-12)
    assert "n = 600 rows, d = 12 features; groups race: a " in err and "model written to" in err

    # a (n, p) array: p attributes named by its attrs["names"], combined with another source
    code, out, err = run(["fit", d["store"], "--array", "features/X", "--sensitive-array", "people",
                          "--sensitive-array", "race", "-k", "3", "--out", tmp_path / "m2", *sched],
                         capsys)
    assert code == 0, err
    assert "groups sex: 0 " in out and "; is_c: 0 " in out and "; race: a " in out
    est = dfairpca.load(tmp_path / "m2")
    assert est.attribute_names_ == ["sex", "is_c", "race"]
    ref = dfairpca.FairPCA(3).fit(d["X"], sensitive_features=[d["sex"], d["race"] == "c", d["race"]])
    same_subspace(est, ref)


def test_fit_a_bare_array_with_labels_from_csv_and_parquet(data_store, tmp_path, capsys, sched):
    """STORE may be a bare Zarr array, and --sensitive-array a path; CSV and Parquet
    columns (by extension) give the same model as the same labels from an array."""
    d = data_store
    bare = tmp_path / "X.zarr"
    zarr.create_array(str(bare), shape=(N_ROWS, N_FEATURES), chunks=(150, N_FEATURES),
                      dtype="f8")[:] = d["X"]
    ref = dfairpca.FairPCA(3).fit(d["X"], sensitive_features=[d["sex"], d["race"]])
    for table in ("people.csv", "people.parquet"):
        code, out, err = run(["fit", bare, "--sensitive-csv", d["root"] / table,
                              "--sensitive-column", "sex,race", "-k", "3",
                              "--out", tmp_path / table, *sched], capsys)
        assert code == 0, (table, err)
        est = dfairpca.load(tmp_path / table)
        assert est.attribute_names_ == ["sex", "race"]
        assert [list(c) for c in est.groups_] == [[0, 1], ["a", "b", "c"]]
        same_subspace(est, ref)
    code, out, err = run(["fit", bare, "--sensitive-array", f"{d['store']}/race", "-k", "3",
                          "--out", tmp_path / "path", "--method", "fair-s", *sched], capsys)
    assert code == 0, err
    assert dfairpca.load(tmp_path / "path").attribute_names_ == ["race"]


def test_equal_opportunity_target_from_an_array_or_a_column(data_store, tmp_path, capsys, sched):
    import json

    d = data_store
    ref = dfairpca.FairPCA(3, constraint="equal_opportunity").fit(
        d["X"], d["y"], sensitive_features=d["race"])
    fit = ["fit", d["store"], "--array", "features/X", "-k", "3", "--constraint",
           "equal_opportunity", "--json", *sched]
    for extra in (["--sensitive-array", "race", "--target-array", "y"],
                  ["--sensitive-csv", d["root"] / "people.csv", "--sensitive-column", "race",
                   "--target-column", "y"],
                  ["--sensitive-array", "race", "--target-csv", d["root"] / "people.parquet",
                   "--target-column", "y"]):
        model = tmp_path / f"eo{len(list(tmp_path.iterdir()))}"
        code, out, err = run([*fit, *extra, "--out", model], capsys)
        assert code == 0, (extra, err)
        summary = json.loads(out)
        positives = d["race"][d["y"] == 1]
        assert summary["n_samples_seen"] == int(d["y"].sum())
        assert summary["groups"]["race"] == {g: int((positives == g).sum()) for g in "abc"}
        same_subspace(dfairpca.load(model), ref)


def test_input_errors_are_one_line_before_any_cluster(data_store, tmp_path, capsys, monkeypatch):
    """Row counts, names, shapes and option combinations are refused at once, in one line,
    with the fix, and nothing is written (the scheduler given is a port nobody serves)."""
    import sys

    d = data_store
    csv, short = d["root"] / "people.csv", d["root"] / "short.csv"
    broken = tmp_path / "broken.csv"
    broken.write_text('sex\nf\n"m\n')  # a quote that never closes
    zarr.create_array(str(tmp_path / "few.zarr"), shape=(N_ROWS - 1,), dtype="i1")[:] = 0
    fit = ["fit", d["store"], "-k", "3", "--out", tmp_path / "m"]
    X = ["--array", "features/X"]
    cases = [
        ([*X, "--sensitive-array", tmp_path / "few.zarr"],
         f"few.zarr has 599 rows but X ({d['store']}/features/X) has 600; the labels need one row "
         "per row of X, in the same order"),
        ([*X, "--sensitive-csv", short, "--sensitive-column", "race"], "short.csv has 599 rows"),
        ([*X, "--sensitive-array", "race", "--constraint", "equal_opportunity", "--target-csv",
          short, "--target-column", "y"], "short.csv has 599 rows"),
        ([*X, "--sensitive-array", "rcae"], "has no array 'rcae'; did you mean 'race'?"),
        ([*X, "--sensitive-array", "race", "--target-csv", csv],
         "--target-csv is read only for --target-column COL"),
        ([*X, "--sensitive-array", "race", "--constraint", "equal_opportunity", "--target-array", "y",
          "--target-csv", csv], "--target-csv is read only for --target-column COL"),
        ([*X, "--sensitive-array", "features"], "is a Zarr group, not an array; name one of its "
                                                "arrays: features/X"),
        ([*X, "--sensitive-csv", csv, "--sensitive-column", "sx"],
         "has no column 'sx'; did you mean 'sex'?"),
        ([*X, "--sensitive-csv", broken, "--sensitive-column", "sex"],
         "broken.csv: cannot read it as CSV (Error tokenizing data"),
        ([*X, "--sensitive-column", "sex"], "give it with --sensitive-csv FILE"),
        ([*X, "--sensitive-csv", csv], "--sensitive-csv needs --sensitive-column"),
        ([*X, "--sensitive-array", "race", "--sensitive-array", "race"], "'race' is given twice"),
        ([*X, "--sensitive-csv", csv, "--sensitive-column", "sex,sex"],
         "--sensitive-column names 'sex' twice; give it once"),
        ([*X, "--sensitive-csv", csv, "--sensitive-column", "sex", "--sensitive-column", "race,sex"],
         "--sensitive-column names 'sex' twice; give it once"),
        ([*X, "--sensitive-array", "race", "--target-array", "y"],
         "--target-array is the task label of --constraint equal_opportunity"),
        ([*X, "--sensitive-array", "race", "--constraint", "equal_opportunity"],
         "--constraint equal_opportunity needs the task label"),
        ([*X, "--sensitive-array", "race", "--constraint", "equal_opportunity", "--target-array",
          "race"], "y must be binary"),
        ([*X], "name the protected attribute(s)"),
        (["--array", "race", "--sensitive-array", "y"], "X must be numbers"),
        (["--array", "words", "--sensitive-array", "y"], "X must be numbers"),
        (["--sensitive-array", "race"], "not a CelebA store: it has no 'images' array; for "
                                        "another layout name the data with --array NAME"),
        ([*X, "--sensitive-array", "race", "-k", "11"], "largest k is"),
    ]
    # Parquet without pyarrow (an optional package): the error names it
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    cases.append(([*X, "--sensitive-csv", d["root"] / "people.parquet", "--sensitive-column",
                   "race"], "needs pyarrow, which is not installed: pip install pyarrow"))
    # a file that cannot be read is a failure of the run (1), the rest refused arguments (2)
    failures = ("broken.csv: cannot read", "needs pyarrow")
    for extra, expected in cases:
        code, out, err = run([*fit, *extra, *NO_CLUSTER, "--json"], capsys)
        status = 1 if expected.startswith(failures) else 2
        assert code == status and expected in err and out == "", (extra, code, err)
        assert err.startswith("dfairpca fit: error: ") and err.count("\n") == 1, err
    assert not (tmp_path / "m").exists()
    # outputs never replace what the job reads, wherever it lives
    bare = tmp_path / "bare.zarr"
    zarr.create_array(str(bare), shape=(N_ROWS, 2), dtype="f8")[:] = 1.0
    before = tree(tmp_path)
    for extra, expected in [
        ([bare, "--sensitive-array", "race", "--out", bare], "is the input store"),
        ([d["store"], *X, "--sensitive-array", bare, "--out", bare], "is the --sensitive-array input"),
        ([d["store"], *X, "--sensitive-csv", csv, "--sensitive-column", "race", "--out", csv],
         "is the --sensitive-csv input"),
        ([d["store"], "--array", bare, "--sensitive-array", "race", "--out", tmp_path],
         "contains the --array input"),
    ]:
        code, out, err = run(["fit", *extra, "-k", "1", "--overwrite", *NO_CLUSTER], capsys)
        assert code == 1 and expected in err and "choose another path" in err, (extra, err)
    assert tree(tmp_path) == before


def test_transform_any_array_json(data_store, tmp_path, capsys, sched):
    """transform --array writes the representation of a plain array (rows in X's order)
    and, with --reconstruct, X's reconstruction in X's shape and dtype under X's name."""
    import json

    d = data_store
    est = dfairpca.FairPCA(3).fit(d["X"], sensitive_features=d["race"])
    model = est.save(tmp_path / "m")
    src = tmp_path / "ints.zarr"
    g = zarr.open_group(str(src), mode="w")
    g.create_array("counts", shape=(N_ROWS, 3, 4), chunks=(250, 3, 4), dtype="i2")[:] = \
        np.round(d["X"] * 10).reshape(N_ROWS, 3, 4)
    code, out, err = run(["transform", model, d["store"], "--array", "features/X", "--out",
                          tmp_path / "rep.zarr", "--json", *sched], capsys)
    assert code == 0, err
    summary = json.loads(out)
    assert summary["n"] == N_ROWS and summary["d"] == N_FEATURES and summary["k"] == 3
    assert summary["written"] == "representation" and summary["shape"] == [N_ROWS, 3]
    assert summary["out"] == str(tmp_path / "rep.zarr")
    Y = zarr.open_group(str(tmp_path / "rep.zarr"), mode="r")["representation"][:]
    np.testing.assert_allclose(Y, est.transform(d["X"]), rtol=1e-10, atol=1e-10)
    code, out, err = run(["transform", model, src, "--array", "counts", "--reconstruct", "--out",
                          tmp_path / "rec.zarr", *sched], capsys)
    assert code == 0, err
    R = zarr.open_group(str(tmp_path / "rec.zarr"), mode="r")["counts"]
    assert R.shape == (N_ROWS, 3, 4) and R.dtype == np.int16
    Xc = np.round(d["X"] * 10)
    expected = np.round(est.inverse_transform(est.transform(Xc))).reshape(N_ROWS, 3, 4)
    assert np.abs(R[:] - expected).max() <= 1
    # a model of another d: refused before any cluster
    code, _, err = run(["transform", model, d["store"], "--array", "people", "--out",
                        tmp_path / "bad.zarr", *NO_CLUSTER], capsys)
    assert code == 2 and "12" in err and not (tmp_path / "bad.zarr").exists(), err


def test_fit_json_on_the_celeba_layout(store, tmp_path, capsys, sched):
    import json

    code, out, err = run(["fit", store, "--attribute", "Eyeglasses", "-k", "4", "--json",
                          "--out", tmp_path / "m", *sched], capsys)
    assert code == 0, err
    summary = json.loads(out)
    z = dfairpca.celeba.attribute_column(store, "Eyeglasses")
    assert summary["groups"] == {"Eyeglasses": {"0": int((z == 0).sum()), "1": int((z == 1).sum())}}
    assert summary["n"] == 1500 and summary["d"] == 256 and summary["array"] == f"{store}/images"
    assert "n = 1,500 images" in err and "with /" in err
    code, out, err = run(["fit", store, "-k", "4", "--method", "pca", "--json",
                          "--out", tmp_path / "p", *sched], capsys)
    assert code == 0, err
    summary = json.loads(out)
    assert summary["estimator"] == "PCA" and "groups" not in summary
    assert not any(key.startswith("fairness_") for key in summary)


def test_every_option_has_help_with_its_default():
    """Every argument of every command has help; each one with a default shows it."""
    import argparse

    from dfairpca.cli import build_parser

    parser = build_parser()
    (commands,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    assert set(commands.choices) == {"synth-celeba", "ingest-celeba", "fit", "transform", "erase",
                                     "evaluate", "show", "info", "demo", "paper"}
    for name, sub in [("dfairpca", parser), *commands.choices.items()]:
        text = " ".join(sub.format_help().split())
        for action in sub._actions:
            if isinstance(action, argparse._SubParsersAction):
                continue
            assert action.help and action.help.strip(), (name, action.dest)
            assert " ".join(action.help.split())[:30] in text, (name, action.dest)
            if not action.option_strings or action.required or action.default in (
                    argparse.SUPPRESS,):
                continue
            if action.default is None or action.default == []:
                assert "(default: " in action.help, (name, action.dest)
            else:
                assert f"(default: {action.default})" in text, (name, action.dest)


def test_version(capsys):
    code = main(["--version"])
    assert code == 0 and capsys.readouterr().out == f"dfairpca {dfairpca.__version__}\n"
    out = subprocess.run([sys.executable, "-m", "dfairpca", "--version"], capture_output=True,
                         text=True)
    assert out.returncode == 0 and out.stdout == f"dfairpca {dfairpca.__version__}\n", out.stderr
    assert re.fullmatch(r"dfairpca \d+\.\d+\.\d+\n", out.stdout)


def test_a_missing_chunk_of_x_or_of_labels_is_an_error_unless_fill(tmp_path, capsys, sched):
    """Issue 10's 'every chunk or an error' for --array and --sensitive-array; a store
    whose writer leaves out constant chunks on purpose is read with --missing-chunks fill."""
    rng = np.random.default_rng(1)
    X = rng.normal(size=(600, 8)) * np.linspace(3, 1, 8)
    z = np.repeat([0, 1, 0], 200)  # the store leaves out the all-zero chunks 0 and 2
    X[z == 1] += 0.5
    g = zarr.open_group(str(tmp_path / "s.zarr"), mode="w")
    g.create_array("X", shape=X.shape, chunks=(200, 8), dtype="f8")[:] = X
    g.create_array("z", shape=(600,), chunks=(200,), dtype="i1", fill_value=0)[:] = z
    assert not (tmp_path / "s.zarr" / "z" / "c" / "0").exists()
    fit = ["fit", tmp_path / "s.zarr", "--array", "X", "--sensitive-array", "z", "-k", "2"]
    code, _, err = run([*fit, "--out", tmp_path / "m", *NO_CLUSTER], capsys)
    assert code == 1 and err.count("\n") == 1, err
    # the first of the two absent chunks that zarr's concurrent read meets
    assert re.search(r"is missing chunk 'z/c/(0' \(rows 0-199|2' \(rows 400-599)\)", err), err
    assert err.endswith("(here: --missing-chunks fill, for X and label arrays)\n")
    code, _, err = run([*fit, "--out", tmp_path / "m", "--missing-chunks", "fill", *sched], capsys)
    assert code == 0, err
    same_subspace(dfairpca.load(tmp_path / "m"), dfairpca.FairPCA(2).fit(X, sensitive_features=z))
    (tmp_path / "s.zarr" / "X" / "c" / "1" / "0").unlink()
    code, _, err = run([*fit, "--out", tmp_path / "m2", "--missing-chunks", "error", *NO_CLUSTER],
                       capsys)
    assert code == 1 and "is missing chunk 'X/c/1/0' (rows 200-399)" in err, err
    assert not (tmp_path / "m2").exists()


def test_fit_job_defaults_are_the_command_lines():
    """``dfairpca fit`` with only its required options is FitJob with only its required
    fields: one set of defaults, which the check of ignored options compares against."""
    import dataclasses

    from dfairpca.cli import FitJob, build_parser

    args = build_parser().parse_args(["fit", "S.zarr", "-k", "3", "--out", "M"])
    assert FitJob.from_args(args) == FitJob("S.zarr", "M", 3)
    # every option of fit is a field (a new option needs one), and nothing else is
    fit_only = set(vars(args)) - {"command", "func", "json"}
    assert fit_only == {f.name for f in dataclasses.fields(FitJob)}
    args = build_parser().parse_args(["fit", "S.zarr", "-k", "3", "--out", "M", "--attribute",
                                      "Male", "--attribute", "Young", "--timeout", "5"])
    assert FitJob.from_args(args).attribute == ("Male", "Young")


@pytest.mark.slow
def test_demo_makes_the_store_fits_and_draws_then_reuses_the_store(tmp_path, capsys, sched):
    work = tmp_path / "demo"
    code, out, err = run(["demo", "--n", "300", "-k", "3", "--workdir", work, *sched], capsys)
    assert code == 0, err
    assert f"wrote 300 synthetic faces to {work / 'synthetic_celeba_300.zarr'}" in out
    model = dfairpca.load(work / "fair_Eyeglasses_k3")
    assert model.attribute_names_ == ["Eyeglasses"] and model.n_components_ == 3
    assert dfairpca.io.read_marker(work / "faces.png")["kind"] == "figure"
    # the fairness report on faces drawn apart (another seed), never fitted: PCA and fair PCA
    assert "on 2,000 held-out faces the fit never saw" in out
    figures = {}
    for label in ("PCA", "fair PCA"):
        (line,) = [x for x in out.splitlines() if x.strip().startswith(f"{label}, k = 3: ")]
        # the verdict in words, the gap and its bound against the tolerance
        assert any(line.strip().startswith(f"{label}, k = 3: {v} at tolerance 0.1 SD: group-mean gap ")
                   for v in ("fair", "not fair", "inconclusive")), line
        figures[label] = float(line.split("linear probe AUC ")[1].rstrip(")"))
    # 300 faces (about 18 with glasses) are too few for the AUCs to differ reliably; their
    # values are tested in test_fairness_report
    assert all(0 <= auc <= 1 for auc in figures.values()), figures
    code, out, err = run(["demo", "--n", "300", "-k", "4", "--workdir", work, *sched], capsys)
    assert code == 0, err
    assert f"using the existing store {work / 'synthetic_celeba_300.zarr'}" in out
    assert dfairpca.load(work / "fair_Eyeglasses_k4").n_components_ == 4


def test_demo_with_a_file_as_its_workdir_is_one_line_naming_the_fix(tmp_path, capsys):
    labels = tmp_path / "labels.csv"
    labels.write_text("a,b\n")
    for work, blocking in ((labels, ""), (labels / "sub", f" ({labels} is a file)")):
        code, out, err = run(["demo", "--n", "300", "--workdir", work, *NO_CLUSTER], capsys)
        assert code == 2 and err.count("\n") == 1, err
        assert err == (f"dfairpca demo: error: --workdir {work} must be a folder, and it cannot "
                       f"be one{blocking}: the demo writes its store, model and picture into a "
                       f"folder; pass a folder that is new or exists, e.g. --workdir "
                       f"{work.parent / (work.name + '-demo')}\n"), err
    assert labels.read_text() == "a,b\n" and sorted(tmp_path.iterdir()) == [labels]


def test_a_fit_into_a_log_reports_the_pass_and_the_eigensolve_in_whole_lines(store, tmp_path,
                                                                              capsys, sched):
    code, out, err = run(["fit", store, "--attribute", "Eyeglasses", "-k", "5", "--out",
                          tmp_path / "m", *sched], capsys)
    assert code == 0, err
    assert "\r" not in out + err
    lines = out.splitlines()
    assert any(line.startswith("pass: ") and " done in" in line for line in lines), out
    assert any(line.startswith("eigensolve: top 5 of 256 dimensions") for line in lines), out
    assert len(lines) < 20, out


@pytest.mark.slow
def test_transform_ships_a_large_model_once_without_a_large_graph_warning(tmp_path, client):
    """A model of 12 MiB (k = 40, d = 40,000; randomized: no d x d statistics): the
    command's graph holds it by key, so distributed does not warn about its size.  A
    process of its own, as a user runs it: this one's Client would take the matrices."""
    rng = np.random.default_rng(0)
    X = rng.normal(size=(120, 40_000)).astype(np.float32)
    zarr.create_array(str(tmp_path / "x.zarr"), data=X, chunks=(30, 40_000))
    dfairpca.PCA(40, svd_solver="randomized", random_state=0).fit(X).save(tmp_path / "m")
    out = tmp_path / "out.zarr"
    r = subprocess.run([sys.executable, "-m", "dfairpca", "transform", tmp_path / "m",
                        tmp_path / "x.zarr", "--out", out, "--reconstruct",
                        "--scheduler", client.scheduler.address],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "large graph" not in r.stderr and "Traceback" not in r.stderr, r.stderr
    R = zarr.open_array(str(out / "x"), mode="r")[:]  # named after the input, x.zarr
    model = dfairpca.load(tmp_path / "m")
    np.testing.assert_allclose(R, model.inverse_transform(model.transform(X)), rtol=1e-4, atol=1e-4)


@pytest.mark.slow
def test_a_corrupt_chunk_in_a_fit_on_its_own_cluster_prints_only_dfairpca_lines(tmp_path):
    """The local cluster the command starts: its workers' "Compute Failed ... Traceback"
    log of the failed read is not printed, only dfairpca's one-line error."""
    path = synth_celeba(tmp_path / "f.zarr", n=600, size=16, chunk_rows=200, progress=False, n_jobs=1)
    chunk = path / "images" / "c" / "1" / "0" / "0"
    chunk.write_bytes(np.random.default_rng(0).bytes(len(chunk.read_bytes())))
    r = subprocess.run([sys.executable, "-m", "dfairpca", "fit", path, "--attribute", "Eyeglasses",
                        "-k", "3", "--out", tmp_path / "m"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 1, r.stderr
    lines = r.stderr.splitlines()
    assert all(line.startswith("dfairpca") for line in lines), r.stderr
    errors = [line for line in lines if line.startswith("dfairpca fit: error: ")]
    assert len(errors) == 1 and "'images/c/1/0/0' (rows 200-399)" in errors[0], r.stderr
    assert "pass: 0 of 1 chunk stopped after" in r.stdout and "\r" not in r.stdout, r.stdout


def test_the_cache_folder_is_the_platforms_and_the_demo_writes_there(tmp_path, monkeypatch):
    from dfairpca.base import cache_folder
    from dfairpca.cli._fit import demo_folder

    home = tmp_path / "home"
    assert cache_folder({}, home, "linux") == home / ".cache" / "dfairpca"
    assert cache_folder({"XDG_CACHE_HOME": "/c"}, home, "linux") == Path("/c/dfairpca")
    assert cache_folder({"XDG_CACHE_HOME": ""}, home, "linux") == home / ".cache" / "dfairpca"
    assert cache_folder({}, home, "darwin") == home / "Library" / "Caches" / "dfairpca"
    assert cache_folder({"LOCALAPPDATA": "/l"}, home, "win32") == Path("/l/dfairpca/Cache")
    assert cache_folder({}, home, "win32") == home / "AppData" / "Local" / "dfairpca" / "Cache"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert demo_folder() == tmp_path / "xdg" / "dfairpca" / "demo"


def _git(*args, cwd):
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=True).stdout


@pytest.mark.slow
def test_demo_from_a_clones_root_leaves_git_status_clean(tmp_path, capsys, monkeypatch, sched):
    """A clone of the repository (its .gitignore, one tracked file), the demo run from its
    root without --workdir, then the documentation build's folder: git sees nothing new."""
    clone, home = tmp_path / "clone", tmp_path / "home"
    clone.mkdir()
    _git("init", "-q", cwd=clone)
    (clone / ".gitignore").write_text(
        (Path(__file__).parents[2] / ".gitignore").read_text(encoding="utf-8"), encoding="utf-8")
    _git("add", ".gitignore", cwd=clone)
    _git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "c", cwd=clone)
    monkeypatch.chdir(clone)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    code, out, err = run(["demo", "--n", "60", "-k", "2", *sched], capsys)
    assert code == 0, err
    work = home / ".cache" / "dfairpca" / "demo"
    assert f"the demo's folder (its store, model and picture): {work}" in out
    assert (work / "faces.png").exists() and (work / "synthetic_celeba_60.zarr").exists()
    (clone / "docs" / "_build" / "html").mkdir(parents=True)
    (clone / "docs" / "_build" / "html" / "index.html").write_text("<html/>")
    (clone / "dfairpca-demo").mkdir()  # an older version's default folder
    (clone / "dfairpca-demo" / "faces.png").write_bytes(b"png")
    assert _git("status", "--porcelain", "--untracked-files=all", cwd=clone) == ""


def test_demo_refuses_a_store_of_other_settings_before_any_cluster(tmp_path, capsys):
    work = tmp_path / "demo"
    synth_celeba(work / "synthetic_celeba_40.zarr", n=40, seed=1, progress=False, n_jobs=1)
    code, _, err = run(["demo", "--n", "40", "--workdir", work, "--scheduler", _nowhere()], capsys)
    assert code == 1 and err.count("\n") == 1, err
    assert "holds another store: seed 1 (asked 0)" in err and "scheduler" not in err, err
    assert err.rstrip().endswith(f"written with other settings or by an older dfairpca; delete "
                                 f"{work / 'synthetic_celeba_40.zarr'} (the demo writes it again) "
                                 "or pass another --workdir"), err
    assert sorted(p.name for p in work.iterdir()) == ["synthetic_celeba_40.zarr"]


def test_fit_exact_statistics_are_bit_identical_whatever_the_chunks(store, tmp_path, capsys, sched):
    """--compute-dtype exact: uint8 images summed without rounding, so two fits that read
    the store in different chunks save the same components, bit for bit, and the summary
    names the kernel that formed the statistics."""
    import json

    comps = []
    for rows in (128, 500):
        out = tmp_path / f"m{rows}"
        code, text, err = run(["fit", store, "--attribute", "Eyeglasses", "-k", "4", "--json",
                               "--compute-dtype", "exact", "--rows-per-chunk", str(rows),
                               "--out", out, *sched], capsys)
        assert code == 0, err
        summary = json.loads(text)
        assert summary["statistics_kernel"].startswith("exact:"), summary
        assert "exact:" in err
        comps.append(dfairpca.load(out).components_)
    assert np.array_equal(comps[0], comps[1])
    code, text, err = run(["fit", store, "-k", "4", "--method", "pca", "--json", "--out",
                           tmp_path / "f", *sched], capsys)
    assert code == 0, err
    from distributed import Client

    from dfairpca.stats._auto import auto_choice, row_width

    # the default for uint8: exact where every worker found its 8-bit kernel not slower
    # than float32 (each worker measured once, for the fit: asked again, it says the same)
    width = row_width(dfairpca.from_zarr(store, "images"))
    with Client(sched[1]) as c:
        chosen = c.run(auto_choice, "uint8", width)
    if all(a.choice == "exact" for a in chosen.values()):
        assert json.loads(text)["statistics_kernel"] == "exact:" + "+".join(sorted({a.kernel for a in chosen.values()}))
    else:
        assert json.loads(text)["statistics_kernel"] == "float32"


def test_erase_writes_the_erased_store_and_the_model(data_store, tmp_path, capsys, sched):
    """erase fits a ConceptEraser and writes the erased X under X's name, in X's shape and
    chunks, equal to the library's; --model saves the eraser for dfairpca.load."""
    import json

    d = data_store
    code, out, err = run(["erase", d["store"], "--array", "features/X", "--sensitive-array", "race",
                          "--out", tmp_path / "erased.zarr", "--model", tmp_path / "eraser",
                          "--json", *sched], capsys)
    assert code == 0, err
    summary = json.loads(out)
    assert summary["command"] == "erase" and summary["method"] == "leace"
    assert summary["n_constraints"] == 2 and summary["fairness_violation"] < 1e-12
    assert summary["shape"] == [N_ROWS, 3, 4] and summary["written"] == "features/X"
    E = zarr.open_group(str(tmp_path / "erased.zarr"), mode="r")["features/X"]
    assert E.shape == (N_ROWS, 3, 4) and E.chunks[1:] == (3, 4) and E.dtype == np.float64
    ref = dfairpca.ConceptEraser().fit(d["X"], sensitive_features=d["race"])
    np.testing.assert_allclose(E[:].reshape(N_ROWS, -1), ref.transform(d["X"]), atol=1e-9)
    model = dfairpca.load(tmp_path / "eraser")
    np.testing.assert_allclose(model.transform(d["X"]), ref.transform(d["X"]), atol=1e-9)
    # refused at once, before any cluster: no attribute, and an rtol outside [0, 1)
    code, _, err = run(["erase", d["store"], "--array", "features/X", "--out",
                        tmp_path / "none.zarr", *NO_CLUSTER], capsys)
    assert code == 2 and "--attribute NAME" in err and err.count("\n") == 1, err
    code, _, err = run(["erase", d["store"], "--array", "features/X", "--sensitive-array", "race",
                        "--rtol", "2", "--out", tmp_path / "none.zarr", *NO_CLUSTER], capsys)
    assert code == 2 and "--rtol" in err, err
    assert not (tmp_path / "none.zarr").exists()
