"""Store writers in parallel: spawned processes and a real Dask cluster give the store one
process gives; an interrupted (killed) synthesis resumes; the commands' new options."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import zarr

from dfairpca.celeba import ingest_celeba, open_celeba, synth_celeba, write_celeba_jpegs
from dfairpca.celeba.pool import partial_path
from dfairpca.cli import main


def store_files(path: Path) -> dict[str, bytes]:
    """Every file of a store, by relative path."""
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def celeba(tmp_path_factory):
    """120 fabricated CelebA JPEGs, written by two processes."""
    return write_celeba_jpegs(tmp_path_factory.mktemp("c") / "celeba", 120, seed=9, n_jobs=2)


@pytest.mark.parametrize(("size", "color"), [(32, False), ("full", True)])
def test_ingest_by_one_process_two_processes_and_a_cluster_is_the_same_store(
        celeba, tmp_path, client, size, color):
    kwargs = dict(size=size, color=color, chunk_rows=16, progress=False)
    one = ingest_celeba(celeba, tmp_path / "one.zarr", n_jobs=1, **kwargs)
    two = ingest_celeba(celeba, tmp_path / "two.zarr", n_jobs=2, **kwargs)
    dask = ingest_celeba(celeba, tmp_path / "dask.zarr", client=client, **kwargs)
    reference = store_files(one)
    assert len(reference) > 8 and store_files(two) == reference
    assert store_files(dask) == reference
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dask.zarr", "one.zarr", "two.zarr"]
    with pytest.raises(ValueError, match="not both"):
        ingest_celeba(celeba, tmp_path / "x.zarr", client=client, n_jobs=2, **kwargs)


def test_synth_on_a_cluster_is_the_store_of_one_process(tmp_path, client):
    kwargs = dict(n=90, seed=4, size=(20, 16), color=True, chunk_rows=16, progress=False)
    one = synth_celeba(tmp_path / "one.zarr", n_jobs=1, **kwargs)
    assert store_files(synth_celeba(tmp_path / "dask.zarr", client=client, **kwargs)) == store_files(one)


SYNTH = """
import sys
from dfairpca.celeba import synth_celeba
if __name__ == "__main__":
    synth_celeba(sys.argv[1], n=3000, seed=1, size=(48, 40), color=True, chunk_rows=60,
                 progress=False, n_jobs=int(sys.argv[2]))
"""


def test_a_killed_synthesis_resumes_where_it_stopped(tmp_path):
    out, script = tmp_path / "faces.zarr", tmp_path / "synth.py"
    script.write_text(SYNTH)
    done = partial_path(out) / ".done"
    proc = subprocess.Popen([sys.executable, str(script), str(out), "1"], start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        while not (done.is_dir() and len(os.listdir(done)) >= 4):  # 3 chunks and "code"
            assert proc.poll() is None and time.monotonic() < deadline, "no chunk was finished"
            time.sleep(0.02)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the whole run, as a crash or `kill -9` would
        proc.wait()
    finished = sorted(int(name) for name in os.listdir(done) if name != "code")
    assert not out.exists() and 3 <= len(finished) < 50
    chunk = partial_path(out) / "images" / "c" / str(finished[0]) / "0" / "0" / "0"
    os.utime(chunk, ns=(1_000_000_000, 1_000_000_000))  # a rewrite would give it a new mtime

    subprocess.run([sys.executable, str(script), str(out), "2"], check=True, timeout=600)
    assert not partial_path(out).exists()
    assert (out / "images" / "c" / str(finished[0]) / "0" / "0" / "0").stat().st_mtime_ns == 1_000_000_000
    reference = synth_celeba(tmp_path / "reference.zarr", n=3000, seed=1, size=(48, 40), color=True,
                             chunk_rows=60, progress=False, n_jobs=2)
    assert store_files(out) == store_files(reference)


def test_a_failed_write_on_a_cluster_ends_with_no_worker_still_writing(tmp_path, client):
    """The other tasks of a write that failed on one worker stop after their chunk, and the
    error waits for them: a worker still writing would race the next call's clean-up."""
    from dfairpca.celeba.pool import write_store

    def slow_or_failing(store, index, start, stop):
        import time

        import zarr

        from dfairpca.celeba.pool import write_rows

        if index == 0:
            time.sleep(0.3)  # the other worker's first range is under way
            raise RuntimeError("chunk 0 failed")
        time.sleep(0.3)
        write_rows(store, start, stop, np.full((stop - start, 4, 4), index, np.uint8))
        labels = zarr.open_array(f"{store}/attributes", mode="r+")
        labels[start:stop] = np.ones((stop - start, labels.shape[1]), labels.dtype)
        return stop - start

    def write(writer):
        return write_store(out, shape=(4, 4), chunks=chunks, chunk_rows=2, settings={"source": "test"},
                           labels={}, write_chunk=writer, args=(), n_jobs=None, client=client,
                           progress=False, overwrite=False, protect=None, desc="test")

    out = tmp_path / "s.zarr"
    chunks = [(i, 2 * i, 2 * i + 2) for i in range(48)]  # 16 ranges of 3 chunks on 2 workers
    with pytest.raises(RuntimeError, match="chunk 0 failed"):
        write(slow_or_failing)
    done = partial_path(out) / ".done"
    marks = sorted(os.listdir(done))
    assert "code" in marks and not any(m.startswith("stop") for m in marks) and len(marks) < 48, marks
    time.sleep(1.5)  # a range still being written would mark a chunk meanwhile
    assert sorted(os.listdir(done)) == marks
    # an earlier call's request to stop (one that gave up waiting) is its own: this call resumes
    (done / "stop-0123456789abcdef").touch()

    def fills_its_index(store, index, start, stop):  # and its labels: every chunk is checked
        import zarr

        from dfairpca.celeba.pool import write_rows

        write_rows(store, start, stop, np.full((stop - start, 4, 4), index, np.uint8))
        labels = zarr.open_array(f"{store}/attributes", mode="r+")
        labels[start:stop] = np.ones((stop - start, labels.shape[1]), labels.dtype)
        return stop - start

    store = zarr.open_group(str(write(fills_its_index)), mode="r")["images"][:]
    assert [int(store[2 * i, 0, 0]) for i in range(48)] == list(range(48))


def test_the_commands_write_colour_stores_of_any_size(celeba, tmp_path, capsys, client):
    assert main(["synth-celeba", str(tmp_path / "s.zarr"), "--n", "40", "--size", "24x16",
                 "--color", "--n-jobs", "1"]) == 0
    assert open_celeba(tmp_path / "s.zarr")[0].shape == (40, 24, 16, 3)
    assert main(["ingest-celeba", str(celeba), str(tmp_path / "i.zarr"), "--size", "full",
                 "--color", "--n-jobs", "2"]) == 0
    assert open_celeba(tmp_path / "i.zarr")[0].shape == (120, 218, 178, 3)
    address = client.scheduler.address
    assert main(["ingest-celeba", str(celeba), str(tmp_path / "d.zarr"), "--size", "40x30",
                 "--scheduler", address]) == 0
    images = open_celeba(tmp_path / "d.zarr")[0]
    assert images.shape == (120, 40, 30)
    expected = ingest_celeba(celeba, tmp_path / "e.zarr", size=(40, 30), progress=False, n_jobs=1)
    np.testing.assert_array_equal(images[:], open_celeba(expected)[0][:])
    assert zarr.open_group(tmp_path / "d.zarr", mode="r").attrs["size"] == [40, 30]
    capsys.readouterr()
    for args, message in ((["synth-celeba", str(tmp_path / "x.zarr"), "--size", "full"], "--size"),
                          (["synth-celeba", str(tmp_path / "x.zarr"), "--size", "24x0"], "--size"),
                          (["ingest-celeba", str(celeba), str(tmp_path / "x.zarr"), "--size", "big"],
                           "HEIGHTxWIDTH")):
        assert main(args) == 2
        assert message in capsys.readouterr().err
    assert not (tmp_path / "x.zarr").exists()


def test_a_failed_ingest_says_where_its_chunks_are_and_how_to_resume(tmp_path, capsys):
    celeba = write_celeba_jpegs(tmp_path / "celeba", 40, seed=2)
    (celeba / "img_align_celeba" / "000030.jpg").write_bytes(b"not a jpeg")
    out = tmp_path / "c.zarr"
    args = ["ingest-celeba", str(celeba), str(out), "--size", "16", "--n-jobs", "1"]
    assert main(args) == 1
    (error,) = [line for line in capsys.readouterr().err.splitlines() if "error" in line]
    assert error.startswith("dfairpca ingest-celeba: error: corrupt or unreadable image")
    assert "000030.jpg" in error and f"kept the finished chunks in {partial_path(out)}" in error
    assert "the same call again resumes there" in error
    write_celeba_jpegs(tmp_path / "again", 40, seed=2)
    (celeba / "img_align_celeba" / "000030.jpg").write_bytes(
        (tmp_path / "again" / "img_align_celeba" / "000030.jpg").read_bytes())
    assert main(args) == 0 and open_celeba(out)[0].shape == (40, 16, 16)


#: how long a task of the pool tests waits for another process's event before it goes on
#: (and its test fails on what it finds): a guard against a hang, never a measurement
WAIT_SECONDS = 120


def _event(log: str, name: str) -> None:
    """Record the event ``name`` in the folder ``log`` (shared by every process)."""
    (Path(log) / name).touch()


def _wait_for(log: str, pattern: str, count: int = 1) -> None:
    """Wait until ``count`` events matching ``pattern`` are in ``log``."""
    deadline = time.monotonic() + WAIT_SECONDS
    while len(list(Path(log).glob(pattern))) < count and time.monotonic() < deadline:
        time.sleep(0.01)


def _who(parent: int) -> str:
    return "here" if os.getpid() == parent else "worker"


def _pid_after(i: int, log: str, parent: int) -> tuple[int, int]:
    """Task ``i`` of the pool test: this process's first task waits until the worker has
    started one (however long its start takes on a loaded machine); which process ran it."""
    if i == 99:
        raise ValueError("task 99 fails")
    if log:  # "": a run that records nothing and waits for nothing
        _event(log, f"start-{i}-{_who(parent)}")
        if _who(parent) == "here":
            _wait_for(log, "start-*-worker")
    return i, os.getpid()


def test_the_process_pool_uses_this_process_too_and_keeps_the_order(tmp_path):
    """n_jobs = 2 is this process and one spawned worker: this one starts at once (tasks
    from the end), the worker from the front; results come back in the tasks' order; a
    failing task's error is raised wherever it ran."""
    from dfairpca.celeba.pool import run_tasks

    got = run_tasks(_pid_after, [(i, str(tmp_path), os.getpid()) for i in range(24)], n_jobs=2, client=None)
    assert [i for i, _ in got] == list(range(24))
    here = [i for i, pid in got if pid == os.getpid()]
    assert here and here == list(range(24 - len(here), 24))  # a run at the end
    assert 0 not in here and len({pid for _, pid in got}) == 2  # the worker ran the start
    for failing in (0, 23):  # at the front: a worker's (or this one's, if it starts late); at the end
        bad = [(99 if i == failing else i, "", 0) for i in range(24)]
        with pytest.raises(ValueError, match="task 99 fails"):
            run_tasks(_pid_after, bad, n_jobs=2, client=None)


def _held_task(i: int, log: str, parent: int, n: int) -> tuple[int, int]:
    """Task ``i`` of ``n`` in the balance test: this process's first waits until the worker
    has started a task; the worker's task waits until every other task has ended."""
    _event(log, f"start-{i}-{_who(parent)}")
    if _who(parent) == "here":
        _wait_for(log, "start-*-worker")
    else:
        _wait_for(log, "end-*", n - 1)
    _event(log, f"end-{i}")
    return i, os.getpid()


def test_no_task_waits_behind_a_busy_worker_and_a_one_task_job_runs_here(tmp_path):
    """No task waits queued behind a busy or starting worker while this process is idle:
    the worker's first task lasts until every other task has ended, and this process ran
    all of those (a pool given every task at once queued some behind the worker: they
    would have ended only after it, and the worker's task never); the only task of a
    one-task job runs here, waiting for no worker."""
    from dfairpca.celeba.pool import run_tasks

    n = 14
    got = run_tasks(_held_task, [(i, str(tmp_path), os.getpid(), n) for i in range(n)],
                    n_jobs=2, client=None)
    assert [i for i, _ in got] == list(range(n))
    assert [i for i, pid in got if pid != os.getpid()] == [0], got  # one task: held the whole time
    assert len(list(tmp_path.glob("end-*"))) == n
    ((_, pid),) = run_tasks(_pid_after, [(0, "", 0)], n_jobs=2, client=None)
    assert pid == os.getpid()


def _whole_task(i: int, log: str, parent: int) -> list[tuple[int, int]]:
    """A whole task of the split test (this process's, the worker starting late): it waits
    until the worker has started a part; ``[(task, process)]``."""
    _event(log, f"whole-{i}-{_who(parent)}")
    _wait_for(log, "part-*-worker")
    return [(i, os.getpid())]


def _held_part(i: int, k: int, log: str, parent: int) -> tuple[int, int, int]:
    """Part ``k`` of task ``i`` in the split test: the worker's first part waits until this
    process has run a part too, so the two share the task whatever their speeds."""
    _event(log, f"part-{k}-{_who(parent)}")
    if _who(parent) == "worker":
        _wait_for(log, "part-*-here")
    return i, k, os.getpid()


def _join_parts(task: tuple, parts: list) -> list[tuple[int, int]]:
    assert [k for _, k, _ in parts] == [0, 1, 2, 3], "the parts came back out of order"
    return [(i, pid) for i, _, pid in parts]


def test_the_last_task_is_shared_in_parts_so_no_process_waits_a_task_for_another(tmp_path):
    """Two tasks, the worker starting late: this process takes one whole; the last one
    taken, by the worker, is split into four parts that whichever process is idle runs,
    so this process runs some of them while the worker runs its first (whole, the worker's
    task would keep this process idle to its end); the parts' results come back in order,
    joined in this process."""
    from dfairpca.celeba.pool import Split, run_tasks

    log, parent = str(tmp_path), os.getpid()
    split = Split(parts=lambda task: [(_held_part, (task[0], k, log, parent)) for k in range(4)],
                  join=_join_parts)
    got = run_tasks(_whole_task, [(0, log, parent), (1, log, parent)], n_jobs=2, client=None, split=split)
    assert [{i for i, _ in result} for result in got] == [{0}, {1}]
    assert [len(result) for result in got] == [4, 1]  # the worker's task in parts, this one's whole
    assert got[1] == [(1, parent)]
    assert {pid == parent for _, pid in got[0]} == {True, False}, got  # both ran parts of it
    assert got[0][0][1] != parent  # the worker's first part: the front's


UNGUARDED = """
import sys
from dfairpca.celeba import synth_celeba
synth_celeba(sys.argv[1], n=300, seed=1, size=16, chunk_rows=60, progress=False, n_jobs=2)
"""


def test_a_script_without_a_main_guard_is_told_to_add_one(tmp_path):
    """A script that starts workers outside ``if __name__ == "__main__":`` runs again in
    each of them: they say what to do, not that another process holds the store's lock
    (what they said before)."""
    script = tmp_path / "unguarded.py"
    script.write_text(UNGUARDED)
    run = subprocess.run([sys.executable, str(script), str(tmp_path / "s.zarr")],
                         capture_output=True, text=True, timeout=300)
    # this process may finish the small job alone before the worker fails: then it succeeds
    assert run.returncode != 0 or open_celeba(tmp_path / "s.zarr")[0].shape == (300, 16, 16)
    assert 'put the script\'s code under `if __name__ == "__main__":`' in run.stderr
    assert "another dfairpca process" not in run.stderr
