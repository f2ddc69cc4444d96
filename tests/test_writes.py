"""dfairpca never deletes or overwrites what it did not write; its writes are atomic.

Real files in tmp_path.  Crashes are real where it matters: a child process that dies
(``os._exit``) in the middle of the replace protocol, then the next call in this process
repairs what it left.
"""

import contextlib
import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import dask.array as da
import numpy as np
import pytest
import zarr
from hypothesis import given, settings, strategies as st
from zarr.core.chunk_key_encodings import DefaultChunkKeyEncoding, V2ChunkKeyEncoding

import dfairpca
from dfairpca.io import _local, _locks
from dfairpca import io
from dfairpca.io._marker import LEASE_STALE_S, MARKER, ZarrNode, marker, zarr_foreign_files
from dfairpca.celeba import ingest_celeba, synth_celeba
from dfairpca.engine.checkpoint import compute_moments_checkpointed
from test_celeba import celeba_dir  # noqa: F401  (a fixture: a CelebA download of 50 images)


def tree(path: Path) -> dict:
    """Every file and folder under ``path`` (its name included), with file contents."""
    out = {}
    for p in sorted([path, *path.rglob("*")]):
        rel = str(p.relative_to(path.parent))
        out[rel] = p.read_bytes() if p.is_file() else None
    return out


def siblings(path: Path) -> list[str]:
    """The hidden siblings of ``path`` (what the replace protocol leaves on a crash)."""
    return sorted(p.name for p in path.parent.iterdir() if p.name.startswith(f".{path.name}."))


@pytest.fixture(scope="module")
def data(two_groups):
    return two_groups(300, 6, spread=True)


def foreign_dir(tmp_path: Path) -> Path:
    """The issue's reproduction: a user's results folder."""
    res = tmp_path / "res"
    (res / "sub").mkdir(parents=True)
    (res / "thesis.tex").write_text("x\n")
    return res


# ------------------------------------------------------------------ never what it did not write
@pytest.mark.parametrize("name", ["PCA", "FairPCA", "FairKernelPCA"])
def test_save_refuses_a_users_directory_and_leaves_it_untouched(models, name, tmp_path):
    res = foreign_dir(tmp_path)
    before = tree(res)
    for overwrite in (False, True):
        with pytest.raises(FileExistsError, match="did not write.*remove it yourself"):
            models[name].save(res, overwrite=overwrite)
        assert tree(res) == before
    assert os.listdir(tmp_path) == ["res"]  # no temporary left either


def test_save_refuses_a_file_a_link_and_another_kind(models, data, tmp_path):
    m = models["PCA"]
    f = tmp_path / "notes.txt"
    f.write_text("mine")
    with pytest.raises(FileExistsError, match="is a file that dfairpca did not write"):
        m.save(f, overwrite=True)
    assert f.read_text() == "mine"

    m.save(tmp_path / "model")
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "model")
    with pytest.raises(FileExistsError, match="symbolic link"):
        m.save(link, overwrite=True)
    assert link.is_symlink()

    # statistics dfairpca wrote are not a model: overwrite replaces only the same kind
    X, _ = data
    stats = tmp_path / "stats"
    dfairpca.compute_moments(X).save(stats)
    before = tree(stats)
    with pytest.raises(FileExistsError, match="holds a dfairpca Moments, not a model"):
        m.save(stats, overwrite=True)
    assert tree(stats) == before


def test_overwrite_is_off_by_default_and_replaces_only_dfairpcas_own(models, data, tmp_path):
    X, z = data
    path = tmp_path / "model"
    models["PCA"].save(path)
    before = tree(path)
    with pytest.raises(FileExistsError, match="pass overwrite=True"):
        models["FairPCA"].save(path)
    assert tree(path) == before
    models["FairPCA"].save(path, overwrite=True)
    assert type(dfairpca.load(path)) is dfairpca.FairPCA
    assert os.listdir(tmp_path) == ["model"]

    stats = tmp_path / "stats"
    m = dfairpca.compute_moments(X)
    m.save(stats)
    with pytest.raises(FileExistsError, match="pass overwrite=True"):
        m.save(stats)
    m.save(stats, overwrite=True)


def test_an_empty_directory_may_be_written_into(models, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    models["PCA"].save(empty)
    np.testing.assert_array_equal(dfairpca.load(empty).components_, models["PCA"].components_)


def test_every_directory_dfairpca_writes_carries_its_marker(models, tmp_path):
    path = models["FairPCA"].save(tmp_path / "m", statistics=True)
    for d in (path, path / "statistics"):
        assert json.loads((d / io.MARKER).read_text())["written_by"] == "dfairpca"
    assert io.read_marker(path)["kind"] == "model"
    assert io.read_marker(path / "statistics")["kind"] == "Moments"
    assert io.read_marker(path)["version"] == dfairpca.__version__

    store = synth_celeba(tmp_path / "s.zarr", n=40, size=8, chunk_rows=16, progress=False, n_jobs=1)
    assert io.read_marker(store)["kind"] == "store"
    assert not (store / io.MARKER).exists()  # in a store the marker is a group attribute
    assert zarr.open_group(str(store), mode="r").attrs["dfairpca"]["kind"] == "store"


def test_the_protected_inputs(tmp_path):
    store = tmp_path / "data" / "faces.zarr"
    synth_celeba(store, n=40, size=8, chunk_rows=16, progress=False, n_jobs=1)
    protect = {"the input store": store}
    with pytest.raises(FileExistsError, match="is the input store"):
        io.check_target(store, "store", overwrite=True, protect=protect)
    with pytest.raises(FileExistsError, match="contains the input store"):
        io.check_target(tmp_path / "data", "store", overwrite=True, protect=protect)
    # through a link too
    (tmp_path / "alias").symlink_to(store)
    with pytest.raises(FileExistsError, match="is the input store"):
        io.check_target(tmp_path / "alias", "store", overwrite=True, protect=protect)
    io.check_target(tmp_path / "data" / "other.zarr", "store", protect=protect)
    # inside it: the output would become members of the input store
    for inside in (store / "model", store / "images" / "x", tmp_path / "alias" / "model"):
        with pytest.raises(FileExistsError, match="is inside the input store"):
            io.check_target(inside, "model", protect=protect)
    # an input named by a file:// or local:// URL is the same path, and so is an output
    for url in (f"file://{store}", f"local://{store}"):
        with pytest.raises(FileExistsError, match="is the input store"):
            io.check_target(store, "store", overwrite=True, protect={"the input store": url})
    with pytest.raises(FileExistsError, match="is the input store"):
        io.check_target(f"local://{store}", "store", overwrite=True, protect=protect)


def test_a_path_without_a_name_of_its_own_is_refused(tmp_path, monkeypatch):
    # '.', '..' and '/' cannot be replaced by a rename (and have no sibling to write first)
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.chdir(empty)
    for where in (".", "..", "/", f"{empty}/.."):
        with pytest.raises(io.OutputPathError, match="has no name of its own.*e.g."):
            io.check_target(where, "model")
    assert list(empty.iterdir()) == []


# ------------------------------------------------------------------ atomic, and crashes recovered
def test_an_error_during_the_swap_puts_the_old_version_back(models, tmp_path, monkeypatch):
    path = tmp_path / "model"
    models["PCA"].save(path)
    old = tree(path)
    real = os.replace

    def fail_moving_new_in(src, dst):
        if Path(dst) == path and ".tmp-" in str(src):
            raise OSError(28, "No space left on device")
        return real(src, dst)

    monkeypatch.setattr(os, "replace", fail_moving_new_in)
    with pytest.raises(OSError, match="is full: writing the model failed .*is as it was"):
        models["FairPCA"].save(path, overwrite=True)
    assert tree(path) == old and siblings(path) == []


def test_a_failed_rollback_in_this_process_is_recovered_by_the_next_call(models, tmp_path,
                                                                          monkeypatch):
    path = tmp_path / "model"
    models["PCA"].save(path)
    old = tree(path)
    real, moved_aside = os.replace, []

    def fail_after_moving_old(src, dst):
        if moved_aside:
            raise OSError(5, "Input/output error")
        if ".old-" in str(dst):
            moved_aside.append(dst)
        return real(src, dst)

    monkeypatch.setattr(os, "replace", fail_after_moving_old)
    with pytest.raises(OSError, match="Input/output"):
        models["FairPCA"].save(path, overwrite=True)
    monkeypatch.setattr(os, "replace", real)
    (aside,) = [s for s in siblings(path) if ".old-" in s]
    assert not path.exists()
    held = {k.replace(aside, path.name, 1): v for k, v in tree(tmp_path / aside).items()}
    assert held == old  # the old version is whole, set aside
    models["FairPCA"].save(tmp_path / "elsewhere")  # unrelated writes do not touch it
    assert not path.exists()
    models["FairPCA"].save(path, overwrite=True)  # same path: old restored, then replaced
    assert type(dfairpca.load(path)) is dfairpca.FairPCA and siblings(path) == []


def expire(*paths):
    """Make the leases of these temporary siblings (their mtimes) older than the timeout."""
    t = time.time() - LEASE_STALE_S - 1
    for p in paths:
        os.utime(p, (t, t))


def _marked_sibling(path: Path, pid, host=None) -> Path:
    host = host or _local._sibling(path, "tmp").name.split("-")[1]
    tmp = path.parent / f".{path.name}.tmp-{host}-{pid}-0badcafe"
    tmp.mkdir()
    io.write_marker(tmp, "model")
    (tmp / "half.npz").write_bytes(b"12")
    return tmp


def test_a_temporary_lives_while_its_lease_does_whatever_its_pid(models, tmp_path):
    """A PID seen from elsewhere (another PID namespace or host) says nothing: a
    temporary of another host whose lease is fresh is a live write; once expired, a dead
    one's."""
    path = tmp_path / "model"
    models["PCA"].save(path)
    # above pid_max: no such process, anywhere
    gone = _marked_sibling(path, 2**22 + 12345, host="otherhost")
    io.recover(path)
    dfairpca.load(path)
    assert gone.exists()
    expire(gone)
    io.recover(path)
    assert not gone.exists()


@pytest.mark.skipif(shutil.which("unshare") is None, reason="needs util-linux's unshare")
def test_a_reader_in_another_pid_namespace_never_deletes_a_live_write(models, tmp_path):
    """The writer is this process, invisible from a new PID namespace (where os.kill of
    its PID finds nothing): the reader there loads the model and leaves the write alone."""
    path = tmp_path / "model"
    models["PCA"].save(path)
    probe = subprocess.run(["unshare", "-p", "-f", "--mount-proc", "true"], capture_output=True)
    if probe.returncode:
        pytest.skip(f"cannot make a PID namespace here: {probe.stderr.decode().strip()}")
    with _local.temporary_sibling(path) as tmp:
        io.write_marker(tmp, "model")
        code = (f"import os, dfairpca; m = dfairpca.load({str(path)!r}); "
                f"assert not os.path.exists('/proc/{os.getpid()}'); "  # os.kill would say: dead
                "print(type(m).__name__)")
        out = subprocess.run(["unshare", "-p", "-f", "--mount-proc", sys.executable, "-c", code],
                             capture_output=True, text=True, env={**os.environ, "PYTHONPATH": os.getcwd()})
        assert out.returncode == 0 and out.stdout.strip() == "PCA", out.stderr
        assert tmp.exists() and io.read_marker(tmp) is not None


@pytest.mark.skipif(shutil.which("unshare") is None, reason="needs util-linux's unshare")
def test_saves_all_succeed_while_a_reader_in_another_pid_and_mount_namespace_loads(models, tmp_path):
    """Two containers on one volume: a reader in its own PID and mount namespace (the
    folder bind-mounted at another path, where this writer's PID does not exist) loads a
    model again and again, running recovery each time, while this process replaces it;
    every save succeeds."""
    probe = subprocess.run(["unshare", "-m", "-p", "-f", "--mount-proc", "true"], capture_output=True)
    if probe.returncode:
        pytest.skip(f"cannot make PID and mount namespaces here: {probe.stderr.decode().strip()}")
    shared, view, stop = tmp_path / "shared", tmp_path / "view", tmp_path / "stop"
    shared.mkdir()
    view.mkdir()
    models["PCA"].save(shared / "model")
    reader = textwrap.dedent(f"""
        import contextlib, os, sys
        import dfairpca
        assert not os.path.exists('/proc/{os.getpid()}')  # the writer's PID: nothing here
        loads = 0
        while not os.path.exists({str(stop)!r}):
            with contextlib.suppress(Exception):  # a load may meet a replace: not the point
                dfairpca.load(sys.argv[1])
                loads += 1
        print(loads)
    """)
    script = tmp_path / "reader.py"
    script.write_text(reader)
    cmd = f"mount --bind {shared} {view} && exec {sys.executable} {script} {view / 'model'}"
    proc = subprocess.Popen(["unshare", "-m", "-p", "-f", "--mount-proc", "sh", "-c", cmd],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": os.getcwd()})
    try:
        time.sleep(2)  # the reader is loading
        for i in range(20):
            models["PCA" if i % 2 else "FairPCA"].save(shared / "model", overwrite=True)
    finally:
        stop.touch()
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0 and int(out.strip()) > 0, err
    assert type(dfairpca.load(shared / "model")) is dfairpca.PCA  # the last one saved


def test_a_forked_child_renews_none_of_its_parents_leases(tmp_path):
    """A child that outlived a crashed parent must not keep the parent's temporary alive."""
    from dfairpca.io import _marker

    with _local.temporary_sibling(tmp_path / "model") as tmp:
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: report what it would renew, then leave at once
            os.write(w, str(len(_marker._RENEWALS)).encode())
            os._exit(0)
        os.waitpid(pid, 0)
        assert os.read(r, 16) == b"0" and tmp.name in _marker._RENEWALS
        os.close(r)
        os.close(w)


def test_a_writers_heartbeat_keeps_its_lease_and_its_death_ends_it(tmp_path):
    """A real writer in another process renews its lease (the temporary's mtime, set back
    here as if the write had run for long) until it is killed; then recovery removes it."""
    path = tmp_path / "model"
    ready = tmp_path / "ready"
    code = f"""
import time
from pathlib import Path
from dfairpca.io import _local, _marker
_marker.LEASE_REFRESH_S = 0.1
with _local.temporary_sibling(Path({str(path)!r})) as tmp:
    _local.LocalStorage(tmp).write_marker("model")
    Path({str(ready)!r}).write_text(tmp.name)
    time.sleep(60)
"""
    writer = subprocess.Popen([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": os.getcwd()})
    try:
        for _ in range(300):
            if ready.exists() and ready.read_text():
                break
            time.sleep(0.05)
        tmp = tmp_path / ready.read_text()
        expire(tmp)
        time.sleep(0.5)  # a few renewals
        io.recover(path)
        assert tmp.exists()
    finally:
        writer.kill()
        writer.wait()
    expire(tmp)
    io.recover(path)
    assert not tmp.exists()


@pytest.mark.parametrize("how", ["SIGKILL", "SIGTERM"])
def test_a_rerun_removes_a_dead_writers_temporary_at_once(models, tmp_path, how):
    """A writer on this host killed mid-save (its lease still fresh: it renewed it a moment
    ago) holds its temporary no more: the next write of the same path removes it at once,
    not three minutes later; a live writer's fresh temporary is left alone meanwhile."""
    import signal

    path = tmp_path / "model"
    ready = tmp_path / "ready"
    code = f"""
import time
from pathlib import Path
import dfairpca
from dfairpca.io import _local
class Stalled(_local.LocalStorage):
    def move_into_place(self, src, *args, **kwargs):
        Path({str(ready)!r}).write_text(Path(src).name)
        time.sleep(60)
_local.LocalStorage.move_into_place = Stalled.move_into_place
dfairpca.PCA(2).fit(__import__("numpy").random.default_rng(0).normal(size=(50, 4))).save({str(path)!r})
"""
    writer = subprocess.Popen([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": os.getcwd()})
    try:
        for _ in range(1200):
            if ready.exists() and ready.read_text():
                break
            assert writer.poll() is None
            time.sleep(0.05)
        tmp = tmp_path / ready.read_text()
        assert io.read_marker(tmp) is not None  # the whole model, marked, about to be moved
        io.recover(path)
        assert tmp.exists()  # its writer is alive
    finally:
        writer.send_signal(getattr(signal, how))
        writer.wait()
    assert tmp.exists() and time.time() - tmp.stat().st_mtime < LEASE_STALE_S
    models["FairPCA"].save(path)  # the rerun
    assert not tmp.exists() and siblings(path) == []
    assert type(dfairpca.load(path)) is dfairpca.FairPCA


def test_object_storage_temporaries_live_while_their_lease_objects_do(models, tmp_path):
    """On fsspec storage the lease is an object beside the temporary prefix that its
    writer rewrites; a temporary of a writer without one is judged by its marker's age."""
    import fsspec

    url = f"memory://lease-{tmp_path.name}/model"
    models["PCA"].save(url)
    fs = fsspec.filesystem("memory")
    root = f"/lease-{tmp_path.name}"
    host = _local._sibling(tmp_path / "model", "tmp").name.split("-")[1]
    leased = f"{root}/.model.tmp-{host}-{2**22 + 7}-0badcafe"
    legacy = f"{root}/.model.tmp-otherhost-{2**22 + 8}-0badbeef"
    for tmp in (leased, legacy):
        fs.pipe_file(f"{tmp}/{MARKER}", json.dumps(marker("model")).encode())
        fs.pipe_file(f"{tmp}/half.npz", b"12")
    fs.pipe_file(f"{leased}.lease", b"{}")
    io.recover(url)
    assert fs.exists(f"{leased}/half.npz") and fs.exists(f"{legacy}/half.npz")
    old = fs.store[f"{leased}.lease"].modified - __import__("datetime").timedelta(seconds=LEASE_STALE_S + 1)
    fs.store[f"{leased}.lease"].modified = old
    for key in fs.find(legacy):
        fs.store[key].modified = old
    io.recover(url)
    assert not fs.exists(f"{leased}/half.npz") and not fs.exists(f"{leased}.lease")
    assert not fs.exists(f"{legacy}/half.npz")
    assert type(dfairpca.load(url)) is dfairpca.PCA
    fs.rm(root, recursive=True)


def test_recovery_touches_only_marked_leftovers_of_dead_writers(models, tmp_path):
    path = tmp_path / "model"
    models["PCA"].save(path)
    host = _local._sibling(path, "tmp").name.split("-")[1]
    dead_pid = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                              capture_output=True, text=True).stdout.strip()
    # named like a leftover of a dead writer, but without the marker: a user's, never touched
    users = tmp_path / f".model.old-{host}-{dead_pid}-0123abcd"
    users.mkdir()
    (users / "data.csv").write_text("1,2\n")
    # a marked temporary of a writer still running on this host (the shell that ran
    # pytest), which holds it as a writer does
    live = tmp_path / f".model.tmp-{host}-{os.getppid()}-89abcdef"
    live.mkdir()
    io.write_marker(live, "model")
    # a marked leftover of a process that is gone, its lease long expired
    dead = tmp_path / f".model.tmp-{host}-{dead_pid}-456789ab"
    dead.mkdir()
    io.write_marker(dead, "model")
    (dead / "half.npz").write_bytes(b"12")
    expire(dead)
    with _locks.holding(live):
        io.recover(path)
    assert users.exists() and (users / "data.csv").read_text() == "1,2\n"
    assert live.exists() and not dead.exists()


# ------------------------------------------------------------------ checkpoints
def test_checkpoint_directory_is_checked_before_the_pass(tmp_path):
    """A foreign directory, the input store or a folder holding it: refused before any chunk
    is read, and nothing deleted."""
    store = tmp_path / "data" / "faces.zarr"
    synth_celeba(store, n=64, size=8, chunk_rows=16, progress=False, n_jobs=1)
    X = dfairpca.from_zarr(store, "images").reshape(64, -1)
    res = foreign_dir(tmp_path)
    before = {p: tree(p) for p in (store, res)}
    segments = []
    for ckpt, message in [(res, "did not write"), (store, "is the input store"),
                          (tmp_path / "data", "contains the input store")]:
        with pytest.raises(FileExistsError, match=message):
            compute_moments_checkpointed(X, checkpoint=ckpt, resume=False,
                                         on_segment=lambda i, n: segments.append(i))
    assert segments == [] and {p: tree(p) for p in (store, res)} == before
    ckpt = tmp_path / "ckpt"
    compute_moments_checkpointed(X, checkpoint=ckpt, segment_rows=32)
    assert io.read_marker(ckpt)["kind"] == "checkpoint"
    io.remove_directory(ckpt, "checkpoint")
    assert not ckpt.exists()
    with pytest.raises(FileExistsError, match="not a checkpoint written by dfairpca"):
        io.remove_directory(res, "checkpoint")
    assert tree(res) == before[res]


# ------------------------------------------------------------------ a read-only output folder
@contextlib.contextmanager
def read_only(folder: Path):
    """Make ``folder`` unwritable, also for root (who ignores permission bits): then with
    the immutable attribute."""
    folder.chmod(0o555)
    immutable = False
    try:
        if _writable(folder):
            subprocess.run(["chattr", "+i", str(folder)], check=True, capture_output=True)
            immutable = True
        assert not _writable(folder), f"could not make {folder} read-only for this test"
        yield folder
    finally:
        if immutable:
            subprocess.run(["chattr", "-i", str(folder)], check=True)
        folder.chmod(0o755)


def _writable(folder: Path) -> bool:
    try:
        (folder / ".probe").mkdir()
    except OSError:
        return False
    (folder / ".probe").rmdir()
    return True


def test_a_read_only_output_folder_is_an_error_naming_the_folder(models, tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir()
    with read_only(locked):
        with pytest.raises(PermissionError, match=f"{locked} is not writable.*writable directory"):
            models["PCA"].save(locked / "model")
        with pytest.raises(PermissionError, match="not writable"):
            io.check_target(locked / "deeper" / "model", "model")
    assert os.listdir(locked) == []


# ------------------------------------------------------------------ every chunk on disk
def test_stores_dfairpca_writes_hold_every_chunk_even_all_zero_ones(tmp_path):
    # the control: zarr's default skips a chunk that is all fill value ...
    plain = zarr.open_group(str(tmp_path / "plain.zarr"), mode="w")
    a = plain.create_array("x", shape=(4, 2), chunks=(2, 2), dtype="uint8")
    a[:] = 0
    assert not (tmp_path / "plain.zarr" / "x" / "c" / "0" / "0").exists()
    # ... dfairpca's writers keep it
    with io.writing_every_chunk():
        ours = zarr.open_group(str(tmp_path / "ours.zarr"), mode="w")
        b = ours.create_array("x", shape=(4, 2), chunks=(2, 2), dtype="uint8")
    b[:] = 0
    assert (tmp_path / "ours.zarr" / "x" / "c" / "0" / "0").is_file()

    # synth-celeba: the first rows are the training split, partition value 0 (all zeros)
    store = synth_celeba(tmp_path / "s.zarr", n=64, size=8, chunk_rows=16, progress=False, n_jobs=1)
    partition = zarr.open_group(str(store), mode="r")["partition"]
    assert not partition[:16].any()
    for name, grid in (("partition", [(i,) for i in range(4)]),
                       ("images", [(i, 0, 0) for i in range(4)]),
                       ("attributes", [(i, 0) for i in range(4)])):
        for key in grid:
            assert (store / name / "c").joinpath(*map(str, key)).is_file(), (name, key)


def test_ingest_keeps_every_chunk_and_touches_only_its_own_partial(celeba_dir, tmp_path):  # noqa: F811
    out = tmp_path / "c.zarr"
    # a folder named like ingest's partial conversion, but a user's
    partial = tmp_path / ".c.zarr.partial"
    partial.mkdir()
    (partial / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="not a store written by dfairpca"):
        ingest_celeba(celeba_dir, out, size=8, chunk_rows=16, progress=False, n_jobs=1)
    assert [p.name for p in partial.iterdir()] == ["notes.txt"] and not out.exists()
    (partial / "notes.txt").unlink()
    partial.rmdir()

    ingest_celeba(celeba_dir, out, size=8, chunk_rows=16, progress=False, n_jobs=1)
    assert io.read_marker(out)["kind"] == "store"
    # rows 0-39 are the training split (0): partition chunks 0 and 1 are all zeros
    assert (out / "partition" / "c" / "0").is_file() and (out / "partition" / "c" / "1").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.zarr", "celeba"]


# ------------------------------------------------------------------ a user's files inside ours
def user_files(path: Path) -> dict:
    """The review's reproduction: notes and a folder of plots put into dfairpca's output."""
    (path / "NOTES.md").write_text("notes\n")
    (path / "plots").mkdir()
    (path / "plots" / "fig.png").write_bytes(b"png")
    return tree(path)


def test_replacing_refuses_a_model_holding_a_users_files(models, tmp_path):
    path = tmp_path / "q2"
    models["PCA"].save(path)
    before = user_files(path)
    with pytest.raises(FileExistsError, match=r"did not write \(NOTES.md, plots\).*move your "
                                              r"files out of it or choose another path"):
        models["FairPCA"].save(path, overwrite=True)
    assert tree(path) == before and siblings(path) == []
    # the files moved out: replaced as before
    (path / "NOTES.md").unlink()
    shutil.rmtree(path / "plots")
    models["FairPCA"].save(path, overwrite=True, statistics=True)
    assert type(dfairpca.load(path)) is dfairpca.FairPCA
    models["PCA"].save(path, overwrite=True)  # statistics/ was ours: no refusal, and gone
    assert sorted(os.listdir(path)) == [".dfairpca", "arrays.npz", "meta.json"]


def test_replacing_refuses_a_model_holding_a_users_file_deep_inside(models, tmp_path):
    """The marker lists every file dfairpca wrote: a user's file one level down (or deeper)
    is found too, and neither replacing nor removing deletes it."""
    path = tmp_path / "mdl"
    models["FairPCA"].save(path, statistics=True)
    (path / "statistics" / "my_notes.txt").write_text("mine")
    (path / "statistics" / "runs" / "a").mkdir(parents=True)
    (path / "statistics" / "runs" / "a" / "log.txt").write_text("mine too")
    before = tree(path)
    with pytest.raises(FileExistsError,
                       match=r"did not write \(statistics/my_notes.txt, statistics/runs\)"):
        models["FairPCA"].save(path, overwrite=True)
    assert tree(path) == before and siblings(path) == []
    with pytest.warns(UserWarning, match="statistics/my_notes.txt, statistics/runs"):
        io.remove_directory(path, "model")
    assert sorted(p.relative_to(path).as_posix() for p in path.rglob("*") if p.is_file()) == [
        "statistics/my_notes.txt", "statistics/runs/a/log.txt"]


def test_a_marker_without_its_entries_falls_back_to_the_kinds_layout(models, data, tmp_path):
    """Directories saved before the marker listed its entries: a model's known layout."""
    path = tmp_path / "m"
    models["PCA"].save(path, statistics=True)
    (path / io.MARKER).write_text(json.dumps(io.marker("model")))  # as older versions wrote
    models["PCA"].save(path, overwrite=True)  # model/ and statistics/ are a model's own
    (path / io.MARKER).write_text(json.dumps(io.marker("model")))
    before = user_files(path)
    with pytest.raises(FileExistsError, match=r"\(NOTES.md, plots\)"):
        models["PCA"].save(path, overwrite=True)
    assert tree(path) == before
    # a kind without a known layout: every entry is named, nothing is deleted
    odd = tmp_path / "odd"
    odd.mkdir()
    (odd / "x.bin").write_bytes(b"1")
    (odd / io.MARKER).write_text(json.dumps(io.marker("report")))
    with pytest.raises(FileExistsError, match=r"\(x.bin\)"):
        io.check_target(odd, "report", overwrite=True)


def test_a_checkpoint_holding_a_users_file_is_refused_before_the_pass(data, tmp_path):
    X, z = data
    ckpt = tmp_path / "ckpt"
    compute_moments_checkpointed(da.from_array(X, chunks=100), checkpoint=ckpt)
    assert io.read_marker(ckpt)["kind"] == "checkpoint"
    (ckpt / "mine.txt").write_text("keep")
    before = tree(ckpt)
    with pytest.raises(FileExistsError, match=r"checkpoint that also holds .*\(mine.txt\)"):
        compute_moments_checkpointed(da.from_array(X * 2, chunks=100), checkpoint=ckpt,
                                     resume=False)
    assert tree(ckpt) == before
    (ckpt / "mine.txt").unlink()
    compute_moments_checkpointed(da.from_array(X * 2, chunks=100), checkpoint=ckpt,
                                     resume=False)
    assert not (ckpt / "mine.txt").exists()


def test_a_store_holding_a_users_file_is_refused(tmp_path):
    """A Zarr store's own entries are zarr.json and the root group's members."""
    store = tmp_path / "s.zarr"
    synth_celeba(store, n=40, size=8, chunk_rows=20, progress=False, n_jobs=1)
    assert io.foreign_entries(store, io.read_marker(store)) == []
    (store / "README.txt").write_text("mine")
    (store / "extra").mkdir()
    before = tree(store)
    with pytest.raises(FileExistsError, match=r"\(README.txt, extra\).*move your files out"):
        synth_celeba(store, n=40, size=8, chunk_rows=20, overwrite=True, progress=False,
                     n_jobs=1)
    assert tree(store) == before
    (store / "README.txt").unlink()
    (store / "extra").rmdir()
    synth_celeba(store, n=20, size=8, chunk_rows=20, overwrite=True, progress=False, n_jobs=1)
    assert zarr.open_group(str(store), mode="r")["images"].shape[0] == 20


# ------------------------------------------------------------------ a Zarr store's own files, at any depth
#: a store of arrays at three depths, with each chunk key encoding (what zarr_layout reads)
LAYOUT = {"": ZarrNode(), "images": ZarrNode((3, 1, 1)), "sub": ZarrNode(),
          "sub/x": ZarrNode((2,), "v2", "."), "sub/s": ZarrNode((), "default", ".")}
HEX = "0123456789abcdef" * 2  # zarr's name of a write under way: KEY.with_suffix(.HEX.partial)
OURS = ["zarr.json", ".dfairpca", "images/zarr.json", "images/c/0/0/0", "images/c/2/0/0",
        "sub/zarr.json", "sub/x/zarr.json", "sub/x/0", "sub/x/1", "sub/s/zarr.json", "sub/s/c",
        f"images/c/2/0/0.{HEX}.partial", f"sub/zarr.{HEX}.partial"]  # a crash's, rewritten


def test_a_stores_own_files_are_its_metadata_and_the_chunk_keys_inside_each_grid():
    assert zarr_foreign_files(OURS, LAYOUT) == []
    foreign = {
        "notes.txt": "notes.txt", "extra/a/b.txt": "extra",      # beside the members
        "images/notes.txt": "images/notes.txt",                   # in an array's folder
        "images/c/extra.bin": "images/c/extra.bin",               # in its chunk folder
        "images/c/3/0/0": "images/c/3",                           # outside the grid
        "images/c/0/1/0": "images/c/0/1",
        "images/c/1/0": "images/c/1",                             # of another depth
        "images/c/0/0/0/x": "images/c/0/0/0/x",  # under a chunk (objects "k" and "k/x")
        "images/c/01/0/0": "images/c/01", "images/c/-1/0/0": "images/c/-1",  # not an index
        "images/0.0.0": "images/0.0.0",                           # of another encoding
        "images/mine/deep/f": "images/mine",                      # a user's folder, whole
        "sub/notes": "sub/notes", "sub/y/zarr.json": "sub/y",     # in a nested group
        "sub/x/2": "sub/x/2", "sub/x/0.0": "sub/x/0.0", "sub/x/c/0": "sub/x/c",
        "sub/s/0": "sub/s/0", "sub/.zattrs": "sub/.zattrs", "sub/.dfairpca": "sub/.dfairpca",
        f"images/c/1/0/0.{HEX}.partial": "images/c/1",  # not of ours
        f"notes.{HEX}.partial": f"notes.{HEX}.partial", f"images/c/0/0/0.{HEX[1:]}.partial":
        f"images/c/0/0/0.{HEX[1:]}.partial",
    }
    for name, named in foreign.items():
        assert zarr_foreign_files([*OURS, name], LAYOUT) == [named], name
    # unreadable metadata: nothing but the root's zarr.json is known to be ours
    assert zarr_foreign_files(OURS, {}) == ["images", "sub"]


_ENCODINGS = {"default": DefaultChunkKeyEncoding, "v2": V2ChunkKeyEncoding}


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_every_key_an_arrays_own_encoding_writes_inside_its_grid_is_ours(data):
    """Keys spelt by zarr's own encoders: in the grid ours, one step out or spelt by
    another encoding foreign."""
    grid = tuple(data.draw(st.lists(st.integers(1, 12), max_size=4), label="grid"))
    index = tuple(data.draw(st.integers(0, n - 1)) for n in grid)
    name = data.draw(st.sampled_from(sorted(_ENCODINGS)))
    separator = data.draw(st.sampled_from(["/", "."]))
    path = data.draw(st.sampled_from(["a", "g/a", "g/h/a"]))
    layout = {"g": ZarrNode(), "g/h": ZarrNode(), path: ZarrNode(grid, name, separator)}
    encode = _ENCODINGS[name](separator=separator).encode_chunk_key
    assert zarr_foreign_files([f"{path}/{encode(index)}", f"{path}/zarr.json"], layout) == []
    other = _ENCODINGS[data.draw(st.sampled_from(sorted(set(_ENCODINGS) - {name})))]
    for sep in ("/", "."):
        assert zarr_foreign_files([f"{path}/{other(separator=sep).encode_chunk_key(index)}"],
                                  layout) != []
    if grid:
        dim = data.draw(st.integers(0, len(grid) - 1))
        out = (*index[:dim], grid[dim] + data.draw(st.integers(0, 3)), *index[dim + 1:])
        assert zarr_foreign_files([f"{path}/{encode(out)}"], layout) != []


def _every_layout(store: Path) -> None:
    """Arrays of each kind zarr writes, at three depths, all chunks written; marked as a
    finished store of dfairpca's."""
    with io.writing_every_chunk():
        g = zarr.open_group(str(store), mode="w", attributes=io.marker_attributes("store"))
        g.create_array("plain", shape=(10, 3), chunks=(4, 3), dtype="int8")[:] = 1
        g.create_array("sharded", shape=(10, 4), chunks=(2, 2), shards=(4, 4), dtype="int8")[:] = 1
        g.create_array("dotted", shape=(5,), chunks=(2,), dtype="int8",
                       chunk_key_encoding={"name": "v2", "separator": "."})[:] = 1
        g.create_array("scalar", shape=(), dtype="int8")[...] = 1
        g.create_array("empty", shape=(0, 4), chunks=(2, 4), dtype="int8")
        deeper = g.create_group("sub").create_group("deeper")
        deeper.create_array("x", shape=(3,), chunks=(1,), dtype="int8")[:] = 1
    io.write_marker(store, "store")


def test_a_users_file_deep_inside_a_store_is_named_and_kept_by_a_removal(tmp_path):
    store = tmp_path / "s.zarr"
    _every_layout(store)
    assert io.foreign_entries(store, io.read_marker(store)) == []  # no false positive
    users = {
        "plain/notes.txt": "plain/notes.txt", "plain/c/extra.bin": "plain/c/extra.bin",
        "plain/c/3/0": "plain/c/3",  # the chunk grid is (3, 1)
        "sharded/c/1/1": "sharded/c/1/1",  # in the chunk grid (5, 2), not the shard grid (3, 1)
        "dotted/3": "dotted/3", "dotted/c/0": "dotted/c", "scalar/0": "scalar/0",
        "empty/c/0/0": "empty/c", "sub/notes.txt": "sub/notes.txt",
        "sub/deeper/x/c/3": "sub/deeper/x/c/3", "sub/deeper/mine/a.txt": "sub/deeper/mine",
    }
    for name in users:
        (store / name).parent.mkdir(parents=True, exist_ok=True)
        (store / name).write_text("the user's")
    (store / "sub" / "deeper" / "x" / "empty_folder").mkdir()
    expected = sorted([*users.values(), "sub/deeper/x/empty_folder"])
    assert io.foreign_entries(store, io.read_marker(store)) == expected
    with pytest.raises(FileExistsError, match="did not write"):
        io.check_target(store, "store", overwrite=True)
    with pytest.warns(UserWarning, match="kept the directory"):
        io.remove_directory(store, "store")
    left = sorted(p.relative_to(store).as_posix() for p in store.rglob("*")
                  if p.is_file() or not any(p.iterdir()))
    assert left == sorted([*users, "sub/deeper/x/empty_folder"])
    assert all((store / name).read_text() == "the user's" for name in users)


@pytest.fixture(scope="module")
def grey(tmp_path_factory) -> Path:
    store = tmp_path_factory.mktemp("grey") / "s.zarr"
    return synth_celeba(store, n=40, size=8, chunk_rows=20, progress=False, n_jobs=1)


def _in_nested_group(store: Path) -> str:
    zarr.open_group(str(store), mode="r+").create_group("sub").create_array(
        "x", shape=(2,), chunks=(1,), dtype="int8")[:] = 1
    return "sub/notes.txt"


@pytest.mark.parametrize("users, named", [
    ("images/notes.txt", "images/notes.txt"),      # in an array's folder
    ("images/c/extra.bin", "images/c/extra.bin"),  # in its chunk folder
    ("images/c/2/0/0", "images/c/2"),              # a chunk key outside the grid (2, 1, 1)
    ("attributes/c/0/1", "attributes/c/0/1"),      # and (2, 1)
    (_in_nested_group, "sub"),                     # a group of the user's, whole
], ids=["array-folder", "chunk-folder", "out-of-grid", "out-of-grid-2d", "nested-group"])
def test_overwriting_a_store_refuses_a_users_file_deep_inside(grey, tmp_path, users, named):
    store = tmp_path / "s.zarr"
    shutil.copytree(grey, store)
    name = users(store) if callable(users) else users
    (store / name).parent.mkdir(parents=True, exist_ok=True)
    (store / name).write_text("the user's")
    before = tree(store)
    with pytest.raises(FileExistsError, match=rf"\({named}\).*move your files out"):
        synth_celeba(store, n=40, size=8, chunk_rows=20, overwrite=True, progress=False,
                     n_jobs=1)
    assert tree(store) == before
    assert siblings(store) == []


def test_a_partial_store_holding_a_users_file_is_not_started_over(grey, tmp_path):
    """Starting over deletes dfairpca's partial store, and zarr's mode="w" then empties its
    folder: a user's file inside it is refused first, never deleted."""
    out = tmp_path / "s.zarr"
    partial = tmp_path / ".s.zarr.partial"  # dfairpca's, without the chunk marks: stale
    shutil.copytree(grey, partial)
    (partial / "images" / "notes.txt").write_text("the user's")
    before = tree(partial)
    with pytest.raises(FileExistsError, match=r"\(images/notes.txt\).*move your files out"):
        synth_celeba(out, n=40, size=8, chunk_rows=20, progress=False, n_jobs=1)
    assert tree(partial) == before and not out.exists()
    (partial / "images" / "notes.txt").unlink()
    synth_celeba(out, n=40, size=8, chunk_rows=20, progress=False, n_jobs=1)
    assert not partial.exists() and io.foreign_entries(out, io.read_marker(out)) == []


def _users_array(store: Path) -> None:
    zarr.open_group(str(store), mode="r+").create_array("my_hand_labels", data=np.arange(40))


def _users_group(store: Path) -> None:
    zarr.open_group(str(store), mode="r+").create_group("mine").attrs["note"] = 1


def _users_attribute(store: Path) -> None:
    zarr.open_group(str(store), mode="r+").attrs["my_note"] = "hello"


def _users_array_attribute(store: Path) -> None:
    zarr.open_array(str(store / "images"), mode="r+").attrs["checked_by"] = "me"


@pytest.mark.parametrize("users, named", [
    (_users_array, r"my_hand_labels"),
    (_users_group, r"mine"),
    (_users_attribute, r"zarr.json \(attributes 'my_note'\)"),
    (_users_array_attribute, r"images/zarr.json \(attributes 'checked_by'\)"),
], ids=["array", "group", "root-attribute", "array-attribute"])
def test_overwriting_a_store_refuses_a_member_or_attribute_the_user_added(grey, tmp_path, users, named):
    """A member or attribute the user added with zarr to a store dfairpca finished is the
    user's: the marker records what dfairpca wrote, and replacing the store would drop it."""
    store = tmp_path / "s.zarr"
    shutil.copytree(grey, store)
    users(store)
    before = tree(store)
    with pytest.raises(FileExistsError, match=rf"\({named}\).*move your files out"):
        synth_celeba(store, n=40, size=8, chunk_rows=20, overwrite=True, progress=False, n_jobs=1)
    assert tree(store) == before and siblings(store) == []
    with pytest.warns(UserWarning, match="kept the directory"):  # a removal keeps it too
        io.remove_directory(store, "store")
    assert io.foreign_entries(store, io.read_marker(store) or {"kind": "store", "members": {}}) != []


def test_a_marker_without_members_protects_all_but_the_kinds_own(grey, tmp_path):
    """A store marked before it was finished (or by an older dfairpca) records no members:
    only those its kind writes are ours."""
    store = tmp_path / "s.zarr"
    shutil.copytree(grey, store)
    zarr.open_group(str(store), mode="r+").attrs.update(io.marker_attributes("store"))
    assert io.foreign_entries(store, io.read_marker(store)) == []
    _users_array(store)
    assert io.foreign_entries(store, io.read_marker(store)) == ["my_hand_labels"]


def test_an_older_marker_without_members_leaves_a_users_attribute_array_foreign(grey, tmp_path):
    """Stores marked before the ``attribute`` coordinate existed never held one: in such a
    store (its marker records no members and no layout) an array of that name is a user's,
    never deleted by an overwrite."""
    store = tmp_path / "s.zarr"
    shutil.copytree(grey, store)
    if "attribute" in zarr.open_group(str(store), mode="r", use_consolidated=False):
        del zarr.open_group(str(store), mode="r+", use_consolidated=False)["attribute"]
    old = {k: v for k, v in io.marker("store").items() if k != "layout"}
    zarr.open_group(str(store), mode="r+").attrs.update({io.MARKER_KEY: old})
    zarr.open_group(str(store), mode="r+", use_consolidated=False).create_array(
        "attribute", data=np.arange(3))
    assert io.foreign_entries(store, io.read_marker(store)) == ["attribute"]


@pytest.mark.parametrize("color", [False, True], ids=["grey", "colour"])
def test_a_clean_store_of_any_layout_is_overwritten(tmp_path, color):
    """No false positive: every file dfairpca and zarr wrote is known to be ours."""
    store = tmp_path / "s.zarr"
    synth_celeba(store, n=50, size=(9, 7), color=color, chunk_rows=16, progress=False, n_jobs=1)
    assert io.foreign_entries(store, io.read_marker(store)) == []
    synth_celeba(store, n=30, size=8, color=color, chunk_rows=7, overwrite=True, progress=False,
                 n_jobs=1)
    assert zarr.open_group(str(store), mode="r")["images"].shape[0] == 30
    assert io.foreign_entries(store, io.read_marker(store)) == []


# ------------------------------------------------------------------ reading after a crash
def crashed_between_renames(path: Path) -> Path:
    """``mv m .m.old-HOST-PID-RANDOM`` with a dead writer's PID: the replace's window."""
    host = _local._sibling(path, "tmp").name.split("-")[1]
    dead_pid = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                              capture_output=True, text=True).stdout.strip()
    aside = path.parent / f".{path.name}.old-{host}-{dead_pid}-deadbeef"
    path.rename(aside)
    return aside


def test_load_after_a_crash_between_the_renames_recovers_the_model(models, data, tmp_path):
    path = tmp_path / "m"
    models["FairPCA"].save(path)
    want = tree(path)
    crashed_between_renames(path)
    got = dfairpca.load(path)
    np.testing.assert_array_equal(got.components_, models["FairPCA"].components_)
    assert tree(path) == want and siblings(path) == []
    # statistics on their own too
    stats = tmp_path / "stats"
    dfairpca.compute_moments(data[0]).save(stats)
    crashed_between_renames(stats)
    assert dfairpca.Moments.load(stats).n == 300 and siblings(stats) == []


def test_load_that_cannot_recover_names_the_intact_copy(models, tmp_path):
    folder = tmp_path / "ro"
    folder.mkdir()
    path = folder / "m"
    models["PCA"].save(path)
    aside = crashed_between_renames(path)
    with read_only(folder):
        with pytest.raises(FileNotFoundError, match=rf"'{path}' is missing because a write to it "
                           rf"was cut short; its intact copy is '{aside}'.*recover\('{path}'\)"):
            dfairpca.load(path)
    io.recover(path)  # what the message says
    assert dfairpca.load(path).n_components_ == 2


def test_removing_a_finished_checkpoint_keeps_a_users_file_inside_it(tmp_path, two_groups):
    """A fit removes its checkpoint after success; a file the user put into that folder
    survives (with the folder and a warning), only dfairpca's entries go."""
    X, z = two_groups(400, 6)
    ckpt = tmp_path / "ck"
    dfairpca.FairPCA(2).fit(X, sensitive_features=z, checkpoint=ckpt, keep_checkpoint=True)
    (ckpt / "notes.txt").write_text("mine")
    with pytest.warns(UserWarning, match="notes.txt"):
        io.remove_directory(ckpt, "checkpoint")
    assert sorted(os.listdir(ckpt)) == ["notes.txt"]
    assert (ckpt / "notes.txt").read_text() == "mine"


@contextlib.contextmanager
def _python_handles(signum):
    """Within the block ``signum`` is unblocked in this thread and SIGINT has Python's
    default handler, whatever an earlier test of this process left (another handler, or
    the signal blocked, where it would wait unseen); such a leftover is warned about by
    name, so that a leak shows, and restored after."""
    import signal
    import warnings

    handler = signal.getsignal(signal.SIGINT)
    if handler is not signal.default_int_handler:
        warnings.warn(f"SIGINT's handler was {handler!r} before this test", stacklevel=2)
        signal.signal(signal.SIGINT, signal.default_int_handler)
    mask = signal.pthread_sigmask(signal.SIG_UNBLOCK, {signum})
    if signum in mask:
        warnings.warn(f"{signal.Signals(signum).name} was blocked in the main thread before this test", stacklevel=2)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        signal.signal(signal.SIGINT, handler)


@pytest.mark.parametrize("signum", ["SIGINT", "SIGTERM"])
def test_ctrl_c_between_the_two_renames_is_held_until_both_are_done(models, tmp_path, monkeypatch,
                                                                    signum):
    """A SIGINT right after the old version is set aside (the race a Ctrl-C test of the CLI
    hit: its checkpoint was missing after the interrupt) is delivered once the new version
    is in place: the KeyboardInterrupt still comes, and ``path`` always exists.  The same
    for a SIGTERM under the command line's handler, which raises KeyboardInterrupt too."""
    import contextlib
    import signal

    from dfairpca.cli._errors import sigterm_as_interrupt

    path = tmp_path / "model"
    models["PCA"].save(path)
    real = os.replace

    def interrupted(src, dst):
        real(src, dst)
        if ".old-" in str(dst):
            os.kill(os.getpid(), getattr(signal, signum))

    monkeypatch.setattr(os, "replace", interrupted)
    handler = sigterm_as_interrupt() if signum == "SIGTERM" else contextlib.nullcontext([])
    with _python_handles(getattr(signal, signum)), pytest.raises(KeyboardInterrupt), \
            handler as received:
        models["FairPCA"].save(path, overwrite=True)
    assert received == ([signal.SIGTERM] if signum == "SIGTERM" else [])
    monkeypatch.setattr(os, "replace", real)
    assert type(dfairpca.load(path)) is dfairpca.FairPCA


# ------------------------------------------------------------------ single files (figures)
def _marked_png(path: Path, shade: int) -> None:
    """A small PNG carrying dfairpca's figure marker, as a figure does (the reader of a
    PNG's marker is registered by dfairpca.celeba.figures, where PNGs are drawn)."""
    import dfairpca.celeba.figures  # noqa: F401
    from PIL import Image, PngImagePlugin

    info = PngImagePlugin.PngInfo()
    info.add_text(io.MARKER_KEY, json.dumps(io.marker("figure")))
    Image.new("L", (4, 4), shade).save(path, format="png", pnginfo=info)


def test_atomic_file_replaces_its_own_file_whole_or_not_at_all(tmp_path):
    path = tmp_path / "faces.png"
    with io.atomic_file(path, "figure") as tmp:
        assert tmp.parent == tmp_path and tmp.name.startswith(".faces.png.tmp-")
        _marked_png(tmp, 1)
    first = path.read_bytes()
    with pytest.raises(RuntimeError, match="drawing failed"), io.atomic_file(
            path, "figure", overwrite=True) as tmp:
        _marked_png(tmp, 2)
        raise RuntimeError("drawing failed")
    assert path.read_bytes() == first and siblings(path) == []
    with pytest.raises(ValueError, match="carries no dfairpca marker"), io.atomic_file(
            path, "figure", overwrite=True) as tmp:
        tmp.write_bytes(b"a file without the marker is never moved into place")
    assert path.read_bytes() == first and siblings(path) == []
    with io.atomic_file(path, "figure", overwrite=True) as tmp:
        _marked_png(tmp, 3)
    assert path.read_bytes() != first and siblings(path) == []


def test_recovery_deletes_a_dead_writers_marked_file_and_nothing_else(tmp_path):
    path = tmp_path / "faces.png"
    host = _local._sibling(path, "tmp").name.split("-")[1]
    dead_pid = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                              capture_output=True, text=True).stdout.strip()
    dead = tmp_path / f".faces.png.tmp-{host}-{dead_pid}-456789ab"
    _marked_png(dead, 1)
    users = tmp_path / f".faces.png.tmp-{host}-{dead_pid}-0123abcd"
    users.write_text("named like a leftover, but not marked: a user's")
    expire(dead, users)
    io.recover(path)
    assert not dead.exists() and users.exists()


def test_a_single_files_marker_is_read_by_the_reader_registered_for_its_format(tmp_path):
    """The write protocol knows no file format: a file is dfairpca's only if the reader
    registered for its first bytes finds the marker; a reader that fails finds none."""
    from dfairpca.io import register_marked_file

    def reader(path):
        text = path.read_bytes()[len(b"DFPT"):].decode()
        if text == "boom":
            raise ValueError("unreadable")
        return text or None

    saved = dict(_local._MARKED_FILES)
    register_marked_file(b"DFPT", reader)
    try:
        path = tmp_path / "out.dfpt"
        with io.atomic_file(path, "table") as tmp:
            tmp.write_bytes(b"DFPT" + json.dumps(io.marker("table")).encode())
        assert io.read_marker(path)["kind"] == "table"
        with pytest.raises(io.OutputPathError, match="already exists"):
            io.check_target(path, "table")
        io.check_target(path, "table", overwrite=True)
        for body in (b"DFPT", b"DFPTboom", b"XXXX" + json.dumps(io.marker("table")).encode()):
            path.write_bytes(body)
            assert io.read_marker(path) is None
            with pytest.raises(io.OutputPathError, match="a file that dfairpca did not write"):
                io.check_target(path, "table", overwrite=True)
    finally:
        _local._MARKED_FILES.clear()
        _local._MARKED_FILES.update(saved)


# ------------------------------------------------------------------ one interface, two storages
@pytest.fixture(params=["local", "fsspec"])
def place(request, tmp_path):
    """Where an output goes: a local folder, or a prefix of fsspec's in-memory file system
    (the protocol object storage gets: copies under a journal instead of renames)."""
    if request.param == "local":
        return tmp_path / "out"
    return f"memory://dfairpca-{tmp_path.name}/out"


def test_both_storages_keep_the_same_protocol(place):
    """storage_for picks the storage; every rule holds the same on either: a write appears
    whole and marked, is refused without overwrite, replaced with it, and removing it keeps
    a user's file, with a warning."""
    from dfairpca.io._fsspec import FsspecStorage
    from dfairpca.io._local import LocalStorage
    from dfairpca.io import storage_for

    storage = storage_for(place)
    assert isinstance(storage, LocalStorage if isinstance(place, Path) else FsspecStorage)
    assert not storage.exists() and io.read_marker(place) is None
    for n in (1, 2):
        with io.atomic_directory(place, "report", overwrite=n > 1) as tmp:
            (Path(tmp) / "table.txt").write_text(f"version {n}")
        assert io.read_marker(place)["kind"] == "report"
        assert storage.read_text("table.txt") == f"version {n}"
        with storage.local_copy() as local:
            assert sorted(p.name for p in Path(local).iterdir()) == [io.MARKER, "table.txt"]
        with pytest.raises(io.OutputPathError, match="already exists"):
            io.check_target(place, "report")
        with pytest.raises(io.OutputPathError, match="not a checkpoint"):
            io.check_target(place, "checkpoint", overwrite=True)
    with pytest.raises(RuntimeError, match="cut short"), io.atomic_directory(place, "report", overwrite=True) as tmp:
        (Path(tmp) / "table.txt").write_text("never seen")
        raise RuntimeError("cut short")
    assert storage.read_text("table.txt") == "version 2"
    if isinstance(storage, LocalStorage):
        (place / "mine.txt").write_text("a user's")
    else:
        storage.target.fs.pipe_file(storage.target.child("mine.txt").path, b"a user's")
    with pytest.raises(io.OutputPathError, match="mine.txt"):
        io.check_target(place, "report", overwrite=True)
    with pytest.warns(dfairpca.errors.KeptFilesWarning, match="mine.txt"):
        io.remove_directory(place, "report")
    assert storage.read_text("mine.txt") == "a user's" and io.read_marker(place) is None
    with pytest.raises(io.OutputPathError, match="not a report written by dfairpca"):
        io.remove_directory(place, "report")


def test_what_the_layers_above_ask_of_a_storage(place):
    """What code outside io asks instead of the kind of storage: the place to hand back (a
    URL as given, a local Path), the place as writers take it, the checkpoint beside it and
    what a reader of a local path or an opened group is given."""
    from dfairpca.io import storage_for

    storage = storage_for(str(place))
    local = isinstance(place, Path)
    assert storage.user_path() == (place if local else str(place))
    assert storage.as_argument("model") == (place if local else storage.target)
    beside = storage.sibling(".checkpoint")
    assert beside.target == storage_for(f"{place}.checkpoint").target
    assert type(beside) is type(storage)
    opened = object()
    assert storage.for_readers(opened) is (opened if not local else storage.given)
    with io.atomic_directory(place, "report") as tmp:
        (Path(tmp) / "table.txt").write_text("kept")
    assert not beside.exists() and storage.exists()
    with storage.local_copy() as copy:
        assert (Path(copy) / "table.txt").read_text() == "kept"


def test_a_backend_is_a_storage_class_and_a_line_of_the_table(tmp_path, monkeypatch):
    """storage_for picks a place's storage by its protocol from one table: a backend added
    there is what every write and read of that protocol goes through."""
    from dfairpca.io import storage_for
    from dfairpca.io._fsspec import FsspecStorage
    from dfairpca.io._local import LocalStorage
    from dfairpca.io._where import BACKENDS

    class MemoryStorage(FsspecStorage):
        pass

    monkeypatch.setitem(BACKENDS, "memory", MemoryStorage)
    url = f"memory://backend-{tmp_path.name}/out"
    assert type(storage_for(url)) is MemoryStorage
    assert type(storage_for(io.location(url))) is MemoryStorage
    assert type(storage_for(tmp_path / "out")) is LocalStorage
    assert type(storage_for(f"file://{tmp_path}/out")) is LocalStorage
    monkeypatch.delitem(BACKENDS, "memory")
    assert type(storage_for(url)) is FsspecStorage


# ------------------------------------------------------------------ recovery and writers
def test_a_recovery_removing_a_stale_aside_copy_never_holds_a_writer_back(tmp_path, monkeypatch):
    """A reader's recovery of a crash's aside copy (.old-, beside a whole model) holds the
    replace lock only to rename it; the slow deletion comes after, so a writer replacing
    the model meanwhile is not refused as if a second writer were there."""
    import threading

    path = tmp_path / "m"
    dfairpca.PCA(2).fit(np.random.default_rng(0).normal(size=(50, 4))).save(path)
    stale = tmp_path / f".m.old-{_local._sibling(path, 'tmp').name.split('-')[1]}-999999-0123abcd"
    shutil.copytree(path, stale)
    real = _local._remove_tree

    def slow(p):
        time.sleep(3.0)  # a large tree
        real(p)

    monkeypatch.setattr(_local, "_remove_tree", slow)
    reader = threading.Thread(target=lambda: io.recover_for_reading(path))
    reader.start()
    time.sleep(0.5)  # the reader is deleting the copy now
    dfairpca.PCA(3).fit(np.random.default_rng(1).normal(size=(50, 4))).save(path, overwrite=True)
    reader.join()
    assert dfairpca.load(path).n_components_ == 3
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]


def test_a_crashed_holders_lock_file_names_the_new_holder(tmp_path):
    from dfairpca.io._locks import LOCK_MARK, exclusive

    lock = tmp_path / ".m.lock"
    lock.write_bytes(LOCK_MARK + b"pid 999999: dfairpca fit\n")  # its holder died
    with exclusive(lock, "m"):
        with pytest.raises(io.OutputPathError, match=f"pid {os.getpid()}: ") as refused:
            with exclusive(lock, "m", wait=False):
                pass
    assert "999999" not in str(refused.value)
    assert not lock.exists()


def test_a_lock_file_names_the_command_but_not_its_options(monkeypatch):
    from dfairpca.io._locks import _holder_line

    monkeypatch.setattr(sys, "argv", ["/venv/bin/dfairpca", "fit", "s3://b/x.zarr", "--storage-options",
                                      '{"key": "AKIA", "secret": "hunter2"}', "--out", "/m"])
    assert _holder_line() == f"pid {os.getpid()}: dfairpca fit\n".encode()
    monkeypatch.setattr(sys, "argv", ["/home/u/train.py", "--secret", "x"])
    assert _holder_line() == f"pid {os.getpid()}: train.py\n".encode()
