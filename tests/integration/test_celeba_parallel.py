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


def _pid_after(i: int, seconds: float) -> tuple[int, int]:
    """Task ``i`` of the pool test: wait, then say which process ran it."""
    time.sleep(seconds)
    if i == 99:
        raise ValueError("task 99 fails")
    return i, os.getpid()


def test_the_process_pool_uses_this_process_too_and_keeps_the_order():
    """n_jobs = 2 is this process and one spawned worker: this one starts at once (tasks
    from the end), the worker from the front; results come back in the tasks' order; a
    failing task's error is raised wherever it ran."""
    from dfairpca.celeba.pool import run_tasks

    tasks = [(i, 0.15) for i in range(24)]
    got = run_tasks(_pid_after, tasks, n_jobs=2, client=None)
    assert [i for i, _ in got] == list(range(24))
    here = [i for i, pid in got if pid == os.getpid()]
    assert here and here == list(range(24 - len(here), 24))  # a run at the end
    assert len(here) < 24 and len({pid for _, pid in got}) == 2  # the worker ran the start
    for failing in (0, 23):  # at the front: a worker's; at the end: this process's
        bad = [(99 if i == failing else i, 0.05) for i in range(24)]
        with pytest.raises(ValueError, match="task 99 fails"):
            run_tasks(_pid_after, bad, n_jobs=2, client=None)


def _timed_task(i: int, seconds: float) -> tuple[int, int, float]:
    """Task ``i`` of the balance test: wait; which process ran it, and when it ended."""
    time.sleep(seconds)
    return i, os.getpid(), time.time()


def test_the_processes_finish_together_and_a_one_task_job_waits_for_no_worker():
    """No task waits queued behind a busy or starting worker while this process is idle:
    the worker starts late (about half a second), yet the two finish within one task of
    each other (a pool given every task at once ended two tasks apart); the only task
    of a one-task job runs here at once."""
    from dfairpca.celeba.pool import run_tasks

    step = 0.25
    got = run_tasks(_timed_task, [(i, step) for i in range(14)], n_jobs=2, client=None)
    assert [i for i, _, _ in got] == list(range(14))
    last = {pid: max(end for _, p, end in got if p == pid) for _, pid, _ in got}
    assert len(last) == 2, "the worker ran no task"
    assert abs(last[os.getpid()] - max(end for pid, end in last.items() if pid != os.getpid())) < step + 0.15
    t = time.monotonic()
    ((_, pid, _),) = run_tasks(_timed_task, [(0, 0.0)], n_jobs=2, client=None)
    assert pid == os.getpid() and time.monotonic() - t < 5


def _sleep_task(i: int, seconds: float) -> list[tuple[int, int, float]]:
    """A whole task of the split test: ``[(task, process, end time)]``."""
    time.sleep(seconds)
    return [(i, os.getpid(), time.time())]


def _sleep_part(i: int, k: int, seconds: float) -> tuple[int, int, int, float]:
    """Part ``k`` of task ``i`` in the split test."""
    time.sleep(seconds)
    return i, k, os.getpid(), time.time()


def _join_parts(task: tuple, parts: list) -> list[tuple[int, int, float]]:
    assert [k for _, k, _, _ in parts] == [0, 1, 2, 3], "the parts came back out of order"
    return [(i, pid, end) for i, _, pid, end in parts]


def test_the_last_task_is_shared_in_parts_so_no_process_waits_a_task_for_another():
    """Two tasks of a second, the worker starting late: the last one taken is split into
    four parts that whichever process is idle runs; the parts' results come back in order,
    joined in this process, and the two processes end within a part of each other (whole,
    the worker's task would end half a second after this process's)."""
    from dfairpca.celeba.pool import Split, run_tasks

    split = Split(parts=lambda task: [(_sleep_part, (task[0], k, task[1] / 4)) for k in range(4)],
                  join=_join_parts)
    got = run_tasks(_sleep_task, [(0, 1.0), (1, 1.0)], n_jobs=2, client=None, split=split)
    assert [{i for i, _, _ in result} for result in got] == [{0}, {1}]
    assert sorted(len(result) for result in got) == [1, 4]  # one task whole, one in parts
    ends = {}
    for _, pid, end in (row for result in got for row in result):
        ends[pid] = max(ends.get(pid, 0.0), end)
    if len(ends) == 2:  # else the worker started after this process had run everything
        assert abs(ends[os.getpid()] - max(e for pid, e in ends.items() if pid != os.getpid())) < 0.25 + 0.15


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
