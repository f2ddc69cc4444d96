"""The write protocol across processes: fresh interpreters that save, writers killed in
each window of a replace (then recovered), and a write run by distributed workers."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import dask.array as da
import numpy as np
import pytest
import zarr

import dfairpca
from dfairpca import io
from dfairpca.io._writes import REPLACE_LOCK
from test_writes import expire, foreign_dir, siblings, tree, user_files


def test_the_issue_reproduction_in_a_fresh_process(tmp_path):
    """``mkdir -p res/sub; echo x > res/thesis.tex; python -c "...save('res')"``"""
    res = foreign_dir(tmp_path)
    before = tree(res)
    code = "import numpy as np, dfairpca; dfairpca.PCA(2).fit(np.random.rand(300,6)).save('res')"
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True)
    assert proc.returncode == 1
    assert "res is a non-empty directory that dfairpca did not write" in proc.stderr
    assert tree(res) == before

CRASH = textwrap.dedent("""
    import os, sys, numpy as np, dfairpca
    from dfairpca.io import _local
    path, step = sys.argv[1], sys.argv[2]
    model = dfairpca.PCA(3).fit(np.random.default_rng(1).normal(size=(200, 6)))
    real_replace, real_remove = os.replace, _local._remove_tree
    calls = []

    def replace(src, dst):
        calls.append(str(dst))
        # the outer move: rename old to .old-, then new (.tmp-) to path
        if step == "before_old_moved" and os.path.basename(str(dst)).startswith(".model.old-"):
            os._exit(3)
        if step == "before_new_moved" and str(dst) == path and len(calls) >= 2:
            os._exit(3)
        return real_replace(src, dst)

    def remove(p):
        if step == "before_old_removed" and ".old-" in str(p):
            os._exit(3)
        if step == "while_old_removed" and ".old-" in str(p):
            os.remove(p / "arrays.npz")  # half the deletion done: the marker goes last
            os._exit(3)
        return real_remove(p)

    os.replace, _local._remove_tree = replace, remove
    model.save(path, overwrite=True)
    os._exit(0)
""")


def crash_in(path: Path, step: str) -> None:
    proc = subprocess.run([sys.executable, "-c", CRASH, str(path), step], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 3, proc.stderr  # it really died there


@pytest.mark.parametrize("step, leftovers, survivor", [
    ("before_old_moved", [".tmp-"], "old"),
    ("before_new_moved", [".old-", ".tmp-"], "old"),
    ("before_old_removed", [".old-"], "new"),
    ("while_old_removed", [".old-"], "new"),
])
def test_a_crash_anywhere_in_a_replace_loses_neither_version(models, tmp_path, step, leftovers,
                                                           survivor):
    """A writer killed in each window of the protocol: old or new exists whole, and the next
    call puts things right."""
    path = tmp_path / "model"
    models["PCA"].save(path)
    old = tree(path)
    crash_in(path, step)
    # the replace's lock file stays (no process holds it: its lock died with the writer)
    lock = f".{path.name}{REPLACE_LOCK}"
    left = [s for s in siblings(path) if s != lock]
    assert [k for k in leftovers if not any(k in s for s in left)] == [] and len(left) == len(leftovers)
    # whatever the window, one whole version is on disk under a name recovery knows; the
    # aside copy is recovered at once (no lock is held), the temporary once its lease expires
    io.recover(path)
    assert [s for s in siblings(path) if ".old-" in s] == []
    expire(*(path.parent / s for s in siblings(path) if ".tmp-" in s))
    io.recover(path)
    assert siblings(path) == []
    got = dfairpca.load(path)
    if survivor == "old":
        assert tree(path) == old
    else:
        assert got.n_components_ == 3
    # and the next save goes through
    models["PCA"].save(path, overwrite=True)
    assert dfairpca.load(path).n_components_ == 2 and siblings(path) == []


def test_the_next_save_repairs_the_crash_itself(models, tmp_path):
    """Without an explicit recover(): the final name is missing, the old version is restored
    before it is replaced (or refused: overwrite is off)."""
    path = tmp_path / "model"
    models["PCA"].save(path)
    old = tree(path)
    crash_in(path, "before_new_moved")
    assert not path.exists()
    expire(*(path.parent / s for s in siblings(path) if ".tmp-" in s))  # a minute later
    with pytest.raises(FileExistsError, match="pass overwrite=True"):
        models["FairPCA"].save(path)  # the old model is back, so this is refused
    assert tree(path) == old and siblings(path) == []

def test_a_dask_write_keeps_every_chunk_on_the_workers(tmp_path, client):
    """The setting travels with the array to distributed workers (transform's path)."""
    Y = da.zeros((40, 3), chunks=(10, 3), dtype=np.float32)
    with io.writing_every_chunk():
        g = zarr.open_group(str(tmp_path / "y.zarr"), mode="w")
        arr = g.create_array("y", shape=Y.shape, chunks=Y.chunksize, dtype=Y.dtype)
    da.to_zarr(Y, arr, compute=True)
    assert sorted(os.listdir(tmp_path / "y.zarr" / "y" / "c")) == ["0", "1", "2", "3"]

def test_the_reviewers_reproduction_on_the_command_line_and_in_a_fresh_process(tmp_path):
    code = ("import numpy as np, dfairpca; "
            "dfairpca.PCA(2).fit(np.random.rand(300,6)).save('q2', overwrite=True)")
    assert subprocess.run([sys.executable, "-c", code], cwd=tmp_path).returncode == 0
    before = user_files(tmp_path / "q2")
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                          text=True)
    assert proc.returncode == 1 and "move your files out of it" in proc.stderr
    assert tree(tmp_path / "q2") == before


CONCURRENT = textwrap.dedent("""
    import os, sys, time, numpy as np, dfairpca
    path, go, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3])
    model = dfairpca.PCA(2).fit(np.random.default_rng(os.getpid()).normal(size=(200, 6)))
    while not os.path.exists(go):
        time.sleep(0.001)
    for _ in range(rounds):
        try:
            model.save(path, overwrite=True)
            print("saved")
        except Exception as exc:
            print(f"{type(exc).__name__}: {exc}".splitlines()[0])
""")


def test_concurrent_saves_of_one_path_fail_naming_the_other_writer(tmp_path):
    """Three processes replacing one model at once: each save succeeds or is refused naming
    the other writer (never a raw OSError of two renames colliding), and a whole model is left."""
    path, go = tmp_path / "model", tmp_path / "go"
    procs = [subprocess.Popen([sys.executable, "-c", CONCURRENT, str(path), str(go), "40"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(3)]
    go.touch()
    lines = []
    for proc in procs:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
        lines += out.splitlines()
    refused = [line for line in lines if line != "saved"]
    assert "saved" in lines
    for line in refused:
        assert line.startswith("OutputPathError: another dfairpca process on this machine is "
                               f"writing {path}"), line
    assert dfairpca.load(path).n_components_ == 2
    assert siblings(path) == [] and sorted(p.name for p in tmp_path.iterdir()) == ["go", "model"]
