"""The exit statuses of the ``dfairpca`` command, run as users run it (``python -m dfairpca``
in a subprocess): 2 for a command line refused before any work, 1 for a run that failed,
130 for Ctrl-C, 0 when done; each error one line on stderr."""

import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest
import zarr

from dfairpca.cli import EXIT_FAILURE, EXIT_INTERRUPTED, EXIT_USAGE

#: a port nobody serves: a command that gets as far as connecting fails there at once
DEAD = ["--scheduler", "tcp://127.0.0.1:9", "--timeout", "1"]


def dfairpca(*args, timeout=120):
    done = subprocess.run([sys.executable, "-m", "dfairpca", *map(str, args)],
                          capture_output=True, text=True, timeout=timeout)
    return done.returncode, done.stdout, done.stderr


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """A Zarr group with X (60 x 4 floats) and a 0/1 label array."""
    path = tmp_path_factory.mktemp("exit") / "data.zarr"
    g = zarr.open_group(str(path), mode="w")
    rng = np.random.default_rng(0)
    g.create_array("X", shape=(60, 4), chunks=(20, 4), dtype="f8")[:] = rng.normal(size=(60, 4))
    g.create_array("z", shape=(60,), chunks=(60,), dtype="i1")[:] = np.arange(60) % 2
    return path


def test_the_exit_codes_are_constants_of_the_command():
    assert (EXIT_FAILURE, EXIT_USAGE, EXIT_INTERRUPTED) == (1, 2, 130)


@pytest.mark.parametrize("args, expected", [
    (["fit"], "the following arguments are required"),  # argparse's own
    (["no-such-command"], "invalid choice"),
    (["synth-celeba", "{tmp}/s.zarr", "--seed", "-1"], "--seed: must be an integer >= 0"),
    (["fit", "{data}", "--array", "X", "-k", "2", "--out", "{tmp}/m", "--method", "pca",
      "--attribute", "Eyeglasses", *DEAD], "--attribute needs --method fair"),  # the command's
    (["fit", "{data}", "--array", "Y", "-k", "2", "--out", "{tmp}/m", "--method", "pca", *DEAD],
     "has no array 'Y'"),
    (["fit", "{data}", "--array", "X", "-k", "9", "--out", "{tmp}/m", "--method", "pca", *DEAD],
     "n_components=9 is too large"),  # the library's check of a parameter
    (["fit", "{data}", "--array", "X", "-k", "2", "--out", "{tmp}/m", "--method", "pca",
      "--scheduler", "tcp://no such host:0"], "is not a scheduler address"),
])
def test_a_refused_command_line_is_exit_2_in_one_line_and_nothing_is_written(
        args, expected, data, tmp_path):
    code, out, err = dfairpca(*(a.format(data=data, tmp=tmp_path) for a in args))
    assert code == EXIT_USAGE and expected in err, (code, err)
    assert err.count("\n") == 1 and "Traceback" not in err and "error" not in out, err
    assert list(tmp_path.iterdir()) == []


def test_a_run_that_fails_is_exit_1_in_one_line(data, tmp_path):
    fit = ["-k", "2", "--method", "pca", "--out", tmp_path / "m"]
    cases = [
        (["fit", tmp_path / "missing.zarr", "--array", "X", *fit, *DEAD], "missing.zarr"),
        (["fit", data, "--array", "X", *fit, *DEAD], "cannot reach a Dask scheduler"),
    ]
    for args, expected in cases:
        code, out, err = dfairpca(*args)
        assert code == EXIT_FAILURE and expected in err, (args, code, err)
        assert err.count("\n") == 1 and "Traceback" not in err and "error" not in out, err
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "thesis.tex").write_text("x\n")  # an output dfairpca did not write
    code, _, err = dfairpca("fit", data, "--array", "X", *fit, "--overwrite", *DEAD)
    assert code == EXIT_FAILURE and "choose another path" in err, err
    assert (tmp_path / "m" / "thesis.tex").read_text() == "x\n"


def test_ctrl_c_is_exit_130_in_one_line(data, tmp_path):
    """Ctrl-C while the command waits for a scheduler (a socket that accepts and never
    answers) is one line and exit status 130."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        server.settimeout(300)  # bounds a hang: a loaded machine may take a minute to start it
        port = server.getsockname()[1]
        proc = subprocess.Popen(
            [sys.executable, "-m", "dfairpca", "fit", str(data), "--array", "X", "-k", "2",
             "--method", "pca", "--out", str(tmp_path / "m"), "--scheduler",
             f"tcp://127.0.0.1:{port}", "--timeout", "60"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            conn, _ = server.accept()  # the command is connecting: past every check
            with conn:
                time.sleep(0.5)
                proc.send_signal(signal.SIGINT)
                line = proc.stderr.readline()  # said before the exit
            # closed, the connection no longer holds the probe's thread, and the process ends
            out, err = proc.communicate(timeout=300)
        finally:
            proc.kill()
            proc.wait()
    assert proc.returncode == EXIT_INTERRUPTED, line + err
    assert line == "dfairpca fit: interrupted\n" and err == "", line + err
    assert not (tmp_path / "m").exists()


def _silent_scheduler():
    """A socket that accepts and never answers: a command connecting to it has passed
    every check and holds its outputs until it is stopped."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    server.settimeout(60)
    return server, f"tcp://127.0.0.1:{server.getsockname()[1]}"


def test_a_second_fit_to_one_out_is_refused_at_once_naming_the_first(data, tmp_path):
    """Two fits to one --out: the second is refused before its pass, naming the first
    (its process id), and makes no checkpoint; the first is left to run."""
    server, address = _silent_scheduler()
    out = tmp_path / "m"
    fit = ["fit", str(data), "--array", "X", "-k", "2", "--method", "pca", "--out", str(out)]
    first = subprocess.Popen([sys.executable, "-m", "dfairpca", *fit, "--scheduler", address,
                              "--timeout", "60"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        conn, _ = server.accept()  # the first holds its outputs and waits for its cluster
        with conn:
            t = time.perf_counter()
            for extra in ([], ["--overwrite"], ["--resume"]):
                code, stdout, err = dfairpca(*fit, *extra, *DEAD)
                assert code == EXIT_FAILURE, err
                assert f"another dfairpca process on this machine is writing the model {out} " in err, err
                # the first's pid and command, never its options (they may hold credentials)
                assert f".m.lock: pid {first.pid}: dfairpca fit)" in err, err
                assert err.count("\n") == 1 and "Traceback" not in err, err
                assert stdout == ""  # refused before the data was read: no "n = ..." line
                assert not out.with_name("m.checkpoint").exists()
            assert time.perf_counter() - t < 60
            assert first.poll() is None  # still running, its outputs untouched
    finally:
        first.kill()
        first.wait()
        first.stdout.close()
        first.stderr.close()
        server.close()
    assert not out.exists() and not out.with_name("m.checkpoint").exists()


def _mount(*args) -> bool:
    return subprocess.run(["mount", *map(str, args)], capture_output=True).returncode == 0


@pytest.mark.parametrize("how", ["tmpfs", "bind"])
def test_a_mount_point_as_out_is_refused_at_once(data, tmp_path, how):
    """An empty mount point as --out (a container's volume) cannot be renamed into place:
    refused before any work, saying to pass a path inside it.  A bind mount of a folder of
    the same file system is one that os.path.ismount does not see.  Real mounts: needs root
    (skipped elsewhere)."""
    volume = tmp_path / "volume"
    volume.mkdir()
    (tmp_path / "source").mkdir()
    mounted = _mount("-t", "tmpfs", "-o", "size=1m", "tmpfs", volume) if how == "tmpfs" else \
        _mount("--bind", tmp_path / "source", volume)
    if not mounted:
        pytest.skip("mounting needs root")
    try:
        code, stdout, err = dfairpca("fit", data, "--array", "X", "-k", "2", "--method", "pca",
                                     "--out", volume, *DEAD)
        assert code == EXIT_FAILURE and "is a mount point" in err, err
        assert f"pass a path inside it, e.g. {volume / 'model'}" in err, err
        assert err.count("\n") == 1 and "Traceback" not in err and stdout == "", err
        assert list(volume.iterdir()) == []
        assert sorted(p.name for p in tmp_path.iterdir()) == ["source", "volume"]
    finally:
        subprocess.run(["umount", str(volume)], check=True)


@pytest.fixture
def small_disk(tmp_path):
    """A 4 MiB file system (tmpfs) at tmp_path/disk: a real full disk, not a simulated one.
    Needs root (skipped elsewhere)."""
    disk = tmp_path / "disk"
    disk.mkdir()
    if not _mount("-t", "tmpfs", "-o", "size=4m", "tmpfs", disk):
        pytest.skip("mounting a small file system needs root")
    yield disk
    subprocess.run(["umount", str(disk)], check=True)


@pytest.fixture(scope="module")
def faces(tmp_path_factory):
    """4,000 faces of 24 x 24 pixels: a pass's d x d statistics weigh 2.5 MiB."""
    from dfairpca.celeba import synth_celeba

    path = tmp_path_factory.mktemp("faces") / "faces.zarr"
    synth_celeba(path, n=4000, size=24, n_jobs=1, progress=False)
    return path


def _one_line_error(code, stdout, err, *expected):
    """An exit status 1 with one error line (beside the local cluster's notes)."""
    assert code == EXIT_FAILURE, err
    said = [line for line in err.splitlines() if not line.startswith("dfairpca: ")]
    assert len(said) == 1 and "Traceback" not in err, err
    for text in expected:
        assert text in err, (text, err)


def test_a_full_disk_is_one_line_naming_what_was_kept(faces, small_disk, tmp_path):
    """The checkpoint, the model and transform's output each on a full disk: one line that
    names the path, the space needed and free, and what was kept; nothing half-written is
    left, and a kept checkpoint resumes."""
    # exact sums (as "auto" takes them where the CPU's 8-bit kernel is not slower): the
    # sizes of the saves below are theirs
    fit = ["fit", faces, "-k", "3", "--method", "pca", "--rows-per-chunk", "50", "--compute-dtype", "exact",
           *DEAD[2:]]
    # the checkpoint: its first save fits, the second (written whole beside the first) not
    ckpt = small_disk / "m.checkpoint"
    _one_line_error(*dfairpca(*fit, "--out", small_disk / "m"),
                    f"the disk holding {ckpt} is full: writing the checkpoint failed (it needs about 2.",
                    "MiB free there); the unfinished save was removed, the checkpoint keeps its last "
                    "save (", " of 4,000 rows): free space there, then resume from it (rerun with --resume)")
    assert sorted(p.name for p in small_disk.iterdir()) == ["m.checkpoint"]
    kept = tmp_path / "kept.checkpoint"
    subprocess.run(["cp", "-r", str(ckpt), str(kept)], check=True)
    subprocess.run(["rm", "-r", str(ckpt)], check=True)
    # the model, with the d x d statistics: the pass is whole in its checkpoint elsewhere
    _one_line_error(*dfairpca(*fit, "--out", small_disk / "m", "--statistics", "--checkpoint", kept, "--resume"),
                    f"the disk holding {small_disk / 'm'} is full: writing the model failed (it needs about 2.",
                    f"its unfinished copy was removed; the checkpoint {kept} holds the whole pass",
                    "rerun with --resume")
    assert list(small_disk.iterdir()) == []
    code, stdout, err = dfairpca(*fit, "--out", tmp_path / "m", "--checkpoint", kept, "--resume")
    assert code == 0 and "model written to" in stdout, err
    assert not kept.exists()
    # transform's output: 2.2 MiB of reconstructed faces (compressed, under 3), beside a
    # user's 3 MiB that stay
    (small_disk / "theirs.bin").write_bytes(b"\1" * (3 << 20))
    _one_line_error(*dfairpca("transform", tmp_path / "m", faces, "--out", small_disk / "y",
                              "--reconstruct", *DEAD[2:]),
                    f"the disk holding {small_disk / 'y'} is full: writing the output store failed "
                    "(it needs about 2.", "its unfinished copy was removed, nothing else was written")
    assert [p.name for p in small_disk.iterdir()] == ["theirs.bin"]


def _no_bar(code, stdout, err):
    """A writer's result without its progress lines (on stderr, not a terminal)."""
    bar = ("synth CelebA: ", "ingest CelebA: ")
    return code, stdout, "\n".join(line for line in err.splitlines() if not line.startswith(bar))


def _pad(disk, leave: int) -> None:
    """Fill ``disk`` with a user's file until about ``leave`` bytes are free."""
    import shutil

    (disk / "theirs.bin").write_bytes(b"\1" * max(0, shutil.disk_usage(disk).free - leave))


def test_a_full_disk_in_a_synth_or_an_ingest_is_one_line_naming_the_chunks_kept(
        small_disk, tmp_path):
    """The CelebA writers on a full disk: one line naming the store, the space its
    unfinished images need and the finished chunks kept, which the same call resumes from
    once there is room; nothing but the partial store is left."""
    from dfairpca.celeba import write_celeba_jpegs

    # 20,000 faces of 24 x 24 in chunks of 1,024 (11 MiB unpacked) on 4 MiB
    store = small_disk / "s.zarr"
    _one_line_error(*_no_bar(*dfairpca("synth-celeba", store, "--n", "20000", "--size", "24")),
                    f"the disk holding {store} is full: writing the store failed (it needs about ",
                    "free there); the finished chunks (", " of 20,000 images) are kept in "
                    f"{small_disk / '.s.zarr.partial'}: free space there, then the same call again resumes")
    assert sorted(p.name for p in small_disk.iterdir()) == [".s.zarr.partial"]
    subprocess.run(["rm", "-r", str(small_disk / ".s.zarr.partial")], check=True)
    # an ingest of 1,500 JPEGs with 100 kB left: its lists and first chunk do not fit
    celeba = write_celeba_jpegs(tmp_path / "celeba", 1500, size=(24, 24))
    _pad(small_disk, 100_000)
    store = small_disk / "c.zarr"
    _one_line_error(*_no_bar(*dfairpca("ingest-celeba", celeba, store, "--size", "24")),
                    f"the disk holding {store} is full: writing the store failed (it needs about ",
                    "free there); ")
    assert {p.name for p in small_disk.iterdir()} <= {"theirs.bin", ".c.zarr.partial"}


def test_a_full_disk_under_a_url_names_the_local_stage_that_filled(small_disk, faces, tmp_path):
    """An output for a URL is written to a local folder first: a full disk there names
    that folder and the URL (it named the URL alone, and measured the working folder)."""
    # a synth's stage (--stage-dir), kept for the same call to resume
    url = "memory://bucket/s.zarr"
    code, stdout, err = _no_bar(*dfairpca("synth-celeba", url, "--n", "20000", "--size", "24",
                                          "--stage-dir", small_disk / "stage"))
    _one_line_error(code, stdout, err, f"the disk holding {small_disk / 'stage'}/",
                    "(where memory:///bucket/s.zarr is staged before its upload) is full: "
                    "writing the store failed (it needs about ", " of 20,000 images) are kept in "
                    f"{small_disk / 'stage'}/", "stage it on another disk")
    # a model for a URL, staged in $TMPDIR (with the d x d statistics, 2.5 MiB, and 1 MiB
    # left), its pass whole in a checkpoint elsewhere
    ckpt = tmp_path / "m.checkpoint"
    fit = [sys.executable, "-m", "dfairpca", "fit", str(faces), "-k", "3", "--method", "pca",
           "--out", "memory://bucket/m", "--checkpoint", str(ckpt), *DEAD[2:]]
    assert subprocess.run(fit, capture_output=True, timeout=120).returncode == 0
    subprocess.run(["rm", "-r", str(small_disk / "stage")], check=True)
    _pad(small_disk, 1 << 20)
    import os

    env = {**os.environ, "TMPDIR": str(small_disk)}
    done = subprocess.run([*fit, "--statistics", "--overwrite"], capture_output=True, text=True,
                          timeout=120, env=env)
    _one_line_error(done.returncode, done.stdout, done.stderr,
                    f"the disk holding {small_disk}/.dfairpca-stage-",
                    "(where memory:///bucket/m is staged before its upload) is full: writing the "
                    "model failed (it needs about 2.", "its unfinished copy was removed; the "
                    f"checkpoint {ckpt} holds the whole pass")
    assert [p.name for p in small_disk.iterdir() if not p.name.startswith("dask-")] == ["theirs.bin"]


def test_a_full_disk_in_a_randomized_fit_names_the_passes_its_checkpoint_keeps(
        small_disk, faces):
    """The randomized solver saves its state after every pass; a save that does not fit
    (written whole beside the last) is one line naming the passes kept, and resumes."""
    out = small_disk / "m"
    fit = ["fit", faces, "-k", "3", "--method", "pca", "--svd-solver", "randomized",
           "--iterated-power", "4", "--out", out, *DEAD[2:]]
    # room for the first save (about 70 kB) and not for the second (136 kB) beside it: the
    # saved block grows with each pass
    _pad(small_disk, 200_000)
    ckpt = small_disk / "m.checkpoint"
    code, stdout, err = dfairpca(*fit)
    _one_line_error(code, stdout, err,
                    f"the disk holding {ckpt} is full: writing the checkpoint failed (it needs about ",
                    "the unfinished save was removed, the checkpoint keeps its last save (1 of at "
                    "most ", " passes): free space there, then resume from it (rerun with --resume)")
    (small_disk / "theirs.bin").unlink()
    code, stdout, err = dfairpca(*fit, "--resume")
    assert code == 0 and "model written to" in stdout, err


def test_a_full_disk_while_the_paper_keeps_a_piece_names_the_pieces_kept(small_disk):
    """The report keeps each finished piece to resume from; one that does not fit is one
    line naming the pieces' folder, and the pieces before it stay."""
    import dataclasses

    from dfairpca.errors import DiskFullError
    from dfairpca.paper import _pieces

    @dataclasses.dataclass
    class Config:
        size: str = "tiny"

    out = small_disk / "report"
    _pieces.save(out, Config(), "tables", "adult", {"error": np.zeros(10)})
    _pad(small_disk, 100_000)
    with pytest.raises(DiskFullError) as e:
        _pieces.save(out, Config(), "synthetic", (6400, 0), {"error": np.zeros(100_000)})
    pieces = small_disk / "report.partial"
    assert str(e.value).startswith(f"the disk holding {pieces} is full: writing the piece "
                                   "synthetic-6400-0.json failed (it needs about "), str(e.value)
    assert "the pieces finished before it are kept there" in str(e.value)
    assert sorted(p.name for p in pieces.iterdir()) == [".dfairpca", "tables-adult.json"]
    assert _pieces.load(out, Config(), "tables", "adult")["error"].shape == (10,)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_cluster(port: int, logs) -> list:
    """A `dask scheduler` on loopback ``port`` and one `dask worker` of one thread, as a
    user starts them; returned once the worker has joined."""
    dask = [sys.executable, "-m", "dask"]
    address = f"tcp://127.0.0.1:{port}"
    scheduler = subprocess.Popen([*dask, "scheduler", "--host", "127.0.0.1", "--port", str(port),
                                  "--no-dashboard"], stdout=logs, stderr=logs)
    worker = subprocess.Popen([*dask, "worker", address, "--nthreads", "1", "--no-dashboard"],
                              stdout=logs, stderr=logs)
    from distributed import Client

    with Client(address, timeout=60) as client:
        client.wait_for_workers(1, timeout=60)
    return [scheduler, worker]


def _stop(processes) -> None:
    for p in processes:
        if p.poll() is None:
            p.kill()
        p.wait()


def test_a_lost_scheduler_is_one_line_naming_it_and_the_checkpoint(faces, tmp_path):
    """The scheduler of a checkpointed fit killed mid-pass (SIGKILL): exit status 1 and one
    line on stderr naming the scheduler and the checkpoint to resume from, no traceback
    from distributed; a new scheduler then finishes the fit from that checkpoint."""
    out, port = tmp_path / "m", _free_port()
    ckpt = tmp_path / "m.checkpoint"
    # 800 chunks of 5 rows on one thread: a pass of several seconds, in 20 saved segments
    fit = [sys.executable, "-m", "dfairpca", "fit", str(faces), "-k", "3", "--method", "pca",
           "--out", str(out), "--rows-per-chunk", "5", "--scheduler", f"tcp://127.0.0.1:{port}",
           "--timeout", "20"]
    with open(tmp_path / "cluster.log", "wb") as logs:
        cluster = _start_cluster(port, logs)
        try:
            proc = subprocess.Popen(fit, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            deadline = time.monotonic() + 120
            while not (ckpt / "progress.json").exists() and proc.poll() is None:
                assert time.monotonic() < deadline, "no checkpoint saved"
                time.sleep(0.05)
            cluster[0].kill()  # the scheduler, mid-pass
            killed = time.monotonic()
            stdout, err = proc.communicate(timeout=120)
            print(f"said {time.monotonic() - killed:.1f} s after the kill")
            assert time.monotonic() - killed < 60  # within the fit's --timeout, and a margin
        finally:
            _stop(cluster)
        assert proc.returncode == EXIT_FAILURE, err
        assert err.count("\n") == 1 and "Traceback" not in err, err
        assert err.startswith(f"dfairpca fit: error: lost the Dask scheduler at tcp://127.0.0.1:{port}"), err
        assert f"the checkpoint {ckpt} holds " in err and "rerun with --resume" in err, err
        assert not out.exists() and (ckpt / "progress.json").exists()
        # what it said works: a new scheduler, --resume
        port = _free_port()
        cluster = _start_cluster(port, logs)
        try:
            fit[fit.index("--scheduler") + 1] = f"tcp://127.0.0.1:{port}"
            done = subprocess.run([*fit, "--resume"], capture_output=True, text=True, timeout=300)
        finally:
            _stop(cluster)
    assert done.returncode == 0 and "model written to" in done.stdout, done.stderr
    assert not ckpt.exists()
