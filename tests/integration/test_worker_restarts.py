"""Workers restarted by their nanny mid-pass, and a scheduler lost, with real `dask scheduler`
and `dask worker --nanny` processes on 127.0.0.1: a fit, a transform and an ingest end in
time, either done or with one line that says what happened and how to go on."""

import contextlib
import logging
import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import zarr

import dfairpca
from dfairpca.cluster import connect
from oracle import max_angle_deg
from processes import DaskProcesses, dask_env

N, D = 3000, 40
#: the fits' timeout: how long they may wait without a worker
TIMEOUT = 10
#: what any of these tests may take once its fault is made
BOUND_SECONDS = 60


@pytest.fixture(scope="module", autouse=True)
def same_products_everywhere():
    """The local fits these tests compare with and the cluster's fits use the same products:
    compute_dtype="auto" measures its kernels in each process, and exact and float32 sums
    differ in the last digits (set in the client, the choice holds for its workers too)."""
    from dfairpca.stats._auto import AUTO_ENV

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(AUTO_ENV, "exact")
        yield


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """uint8 rows in a Zarr store, 60 chunks of 50, and the local fit of them."""
    X = np.random.default_rng(5).integers(0, 255, (N, D), dtype=np.uint8)
    path = tmp_path_factory.mktemp("restarts") / "rows.zarr"
    zarr.open_group(str(path), mode="w").create_array("X", shape=(N, D), chunks=(50, D),
                                                      dtype="uint8")[:] = X
    return path, dfairpca.PCA(4).fit(X)


def _nanny_cluster(tmp_path, preload: str, memory_limit="2GiB") -> DaskProcesses:
    """A scheduler and one worker of one thread under a nanny, its folds preloaded with
    ``preload`` (a module of tests/)."""
    procs = DaskProcesses(tmp_path, worker_hosts=(), worker_args=["--preload", preload])
    procs.__enter__()
    try:
        procs.add_worker(nanny=True, memory_limit=memory_limit)
    except BaseException:
        procs.__exit__()
        raise
    return procs


def _in_a_daemon_thread(call):
    """``(thread, outcome)``: ``call()`` runs in a daemon thread and leaves its exception, or
    its result, in ``outcome``; a call that waits for ever fails the test instead of
    hanging it."""
    outcome = {}

    def run():
        try:
            outcome["result"] = call()
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            outcome["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, outcome


def _kill_the_worker_under_its_nanny(client, running, done_tasks=3) -> None:
    """SIGKILL the one worker process (not its nanny) once it has run ``done_tasks`` tasks
    and while ``running()``: its nanny starts a new one at a new address."""
    deadline = time.monotonic() + 30
    (address, pid), = client.run(os.getpid).items()
    while client.run(lambda dask_worker: dask_worker.state.executed_count)[address] < done_tasks:
        assert time.monotonic() < deadline and running(), "the pass did not start"
        time.sleep(0.02)
    os.kill(pid, signal.SIGKILL)


def test_a_worker_restarted_by_its_nanny_mid_pass_lets_the_fit_finish(tmp_path, data):
    """The only worker dies mid-pass and its nanny starts a new one: the fold it was
    running, pinned to the dead worker's address, runs on the new worker (distributed
    alone would leave it in `no-worker` for ever, the timeout never firing since a worker
    is there), and the fit equals the local one."""
    path, local = data
    procs = _nanny_cluster(tmp_path, "slow_folds")
    try:
        with connect(scheduler_file=procs.scheduler_file, timeout=20) as client:
            client.wait_for_workers(1, timeout=30)
            X = dfairpca.from_zarr(path, "X", rows_per_chunk=50)
            thread, outcome = _in_a_daemon_thread(lambda: dfairpca.PCA(4).fit(X, timeout=TIMEOUT))
            _kill_the_worker_under_its_nanny(client, thread.is_alive)
            killed = time.monotonic()
            thread.join(BOUND_SECONDS)
            took = time.monotonic() - killed
            assert not thread.is_alive(), f"the fit still waits {took:.0f} s after the restart"
            assert "result" in outcome, (outcome, procs.logs())
            (address,) = client.scheduler_info()["workers"]
    finally:
        procs.__exit__()
    assert "Restarting worker" in (tmp_path / "worker0.log").read_text()  # a restart it was
    assert max_angle_deg(outcome["result"].components_.T, local.components_.T) < 1e-6


def test_a_chunk_past_the_workers_memory_limit_is_one_line_naming_it_and_the_checkpoint(tmp_path, data):
    """One chunk's fold takes more than its worker may hold: the nanny restarts the worker
    each time, and the command ends in time with one line naming the worker, its memory
    limit and what the checkpoint holds, exit status 1."""
    from memory_hog import HOG_ROW

    path, _ = data
    model, ckpt = tmp_path / "m", tmp_path / "m.checkpoint"
    procs = _nanny_cluster(tmp_path, "memory_hog", memory_limit="400MiB")
    try:
        cmd = [sys.executable, "-m", "dfairpca", "fit", str(path), "--array", "X", "--method", "pca",
               "-k", "4", "--out", str(model), "--rows-per-chunk", "50",
               "--scheduler-file", str(procs.scheduler_file), "--timeout", str(TIMEOUT)]
        start = time.monotonic()
        done = subprocess.run(cmd, capture_output=True, text=True, env=dask_env(),
                              timeout=BOUND_SECONDS + 30)
        took = time.monotonic() - start
    finally:
        procs.__exit__()
    err = done.stderr
    assert done.returncode == 1, (err, procs.logs())
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith("dfairpca fit: error: the Dask worker at tcp://127.0.0.1:"), err
    assert "(memory limit 400 MiB) died running a task that 4 workers in turn died running" in err
    assert f"the checkpoint {ckpt} holds 16 of 60 chunks" in err, err  # 2 segments, then row {HOG_ROW}
    assert "`dask worker --memory-limit`) and rerun with --resume" in err, err
    assert took < BOUND_SECONDS, took
    assert not model.exists() and (ckpt / "progress.json").exists()
    assert HOG_ROW > 800


def test_a_worker_restarted_mid_transform_lets_it_finish(tmp_path, data):
    """A transform written to a Zarr store as ``dfairpca transform --out`` writes it: the
    worker dies mid-write and its nanny starts a new one; the model's matrices the dead
    worker held are made again (scattered data would be lost with it, cancelling the whole
    computation) and the store is written whole."""
    import dask.array as da

    from dfairpca.cluster import compute, worker_timeout

    path, local = data
    procs = _nanny_cluster(tmp_path, "slow_folds")
    try:
        with connect(scheduler_file=procs.scheduler_file, timeout=20) as client:
            client.wait_for_workers(1, timeout=30)
            Y = local.transform(dfairpca.from_zarr(path, "X", rows_per_chunk=50))  # 60 chunks
            target = zarr.open_array(str(tmp_path / "Y.zarr"), mode="w", shape=Y.shape,
                                     chunks=Y.chunksize, dtype=Y.dtype)

            def write():
                with worker_timeout(TIMEOUT):
                    return compute(da.to_zarr(Y, target, compute=False))

            thread, outcome = _in_a_daemon_thread(write)
            _kill_the_worker_under_its_nanny(client, thread.is_alive, done_tasks=5)
            thread.join(BOUND_SECONDS)
            assert not thread.is_alive(), "the transform still waits after the restart"
            assert "result" in outcome, (outcome, procs.logs())
    finally:
        procs.__exit__()
    assert "Restarting worker" in (tmp_path / "worker0.log").read_text()
    X = np.asarray(zarr.open_array(str(path), path="X")[:], np.float64)
    np.testing.assert_allclose(target[:], local.transform(X), rtol=1e-4, atol=1e-4)


def _lost_scheduler_line(err: str, address: str) -> str:
    """The one line of a command whose scheduler was lost: no traceback, no record of
    distributed's, exit status checked by the caller."""
    assert err.count("\n") == 1 and "Traceback" not in err and "distributed." not in err, err
    assert f"lost the Dask scheduler at {address} (it stopped, or the network to it failed)" in err
    return err


def test_a_scheduler_lost_between_two_computations_is_one_error_naming_it(tmp_path):
    """The scheduler dies while this process computes on its own (a solve), and the Client
    gives up reconnecting and closes: the next computation is one SchedulerLost naming the
    scheduler, not distributed's KeyError or ClosedClientError."""
    import dask.array as da

    from dfairpca.cluster import SchedulerLost

    X = da.random.default_rng(0).normal(size=(400, 6), chunks=100)
    with _distributed_records() as records, DaskProcesses(tmp_path, worker_hosts=("127.0.0.1",)) as procs, \
            connect(scheduler_file=procs.scheduler_file, timeout=3) as client:
        client.wait_for_workers(1, timeout=30)
        address = client.scheduler.address
        dfairpca.PCA(2).fit(X)
        procs.scheduler.kill()
        deadline = time.monotonic() + BOUND_SECONDS
        while client.status != "closed":  # its reconnects (for its 3 s timeout) given up
            assert time.monotonic() < deadline, client.status
            time.sleep(0.1)
        with pytest.raises(SchedulerLost) as info:
            dfairpca.PCA(2).fit(X, timeout=TIMEOUT)
        with pytest.raises(SchedulerLost):
            dfairpca.PCA(2).fit(X)  # without a timeout, the same
    assert str(info.value).startswith(f"lost the Dask scheduler at {address} ")
    assert info.value.address == address and "\n" not in str(info.value)
    # the loss said in one line: distributed's records of it would only repeat it
    assert not [r for r in records if "reconnect" in r.getMessage()], records


def test_a_scheduler_lost_outside_a_computation_is_one_error_naming_it(tmp_path):
    """A call of the Client's that computes nothing (asking the workers, as a command's
    checks do before its pass) when the scheduler has just died: the error out of
    connect()'s block is one SchedulerLost naming it, with no record of distributed's."""
    from dfairpca.cluster import SchedulerLost

    with _distributed_records() as records, DaskProcesses(tmp_path, worker_hosts=("127.0.0.1",)) as procs:
        _wait_for_a_worker(procs.scheduler_file)
        with pytest.raises(SchedulerLost) as info, \
                connect(scheduler_file=procs.scheduler_file, timeout=3) as client:
            address = client.scheduler.address
            procs.scheduler.kill()
            procs.scheduler.wait()
            deadline = time.monotonic() + BOUND_SECONDS
            while time.monotonic() < deadline:  # a call made before the Client notices, or after
                client.run(os.getpid)
                time.sleep(0.05)
    assert str(info.value).startswith(f"lost the Dask scheduler at {address} ") and "\n" not in str(info.value)
    assert not [r for r in records if r.levelno >= logging.ERROR], [r.getMessage() for r in records]


@contextlib.contextmanager
def _worker_first(scheduler_file):
    """:func:`_wait_for_a_worker` as a block's entry: connect()'s short timeout (the
    Client's, so that a lost scheduler is given up on quickly) is then not spent waiting
    for a worker still starting."""
    _wait_for_a_worker(scheduler_file)
    yield


def _wait_for_a_worker(scheduler_file) -> None:
    """Return once the scheduler of ``scheduler_file`` has a worker (a loaded machine starts
    one in seconds), asked by a Client of its own."""
    from distributed import Client

    with Client(json_address(scheduler_file), timeout=30) as watcher:
        watcher.wait_for_workers(1, timeout=BOUND_SECONDS)


@contextlib.contextmanager
def _distributed_records():
    """The records distributed's loggers hand to their handlers during the block."""
    records = []

    class Keep(logging.Handler):
        def emit(self, record):
            records.append(record)

    handler = Keep(logging.DEBUG)
    logging.getLogger("distributed").addHandler(handler)
    try:
        yield records
    finally:
        logging.getLogger("distributed").removeHandler(handler)


def test_a_lost_scheduler_that_no_computation_reports_is_logged_by_distributed(tmp_path):
    """Only the records of a loss that dfairpca reports itself are held back: a Client that
    loses its scheduler while nothing computes on it logs distributed's words."""
    with _distributed_records() as records, DaskProcesses(tmp_path, worker_hosts=("127.0.0.1",)) as procs, \
            connect(scheduler_file=procs.scheduler_file, timeout=3) as client:
        client.wait_for_workers(1, timeout=30)
        procs.scheduler.kill()
        deadline = time.monotonic() + BOUND_SECONDS
        while client.status != "closed":
            assert time.monotonic() < deadline, client.status
            time.sleep(0.1)
    said = [r.getMessage() for r in records if r.name == "distributed.client"]
    assert any(m.startswith("Failed to reconnect to scheduler") for m in said), said


def _run_until(cmd, ready, kill) -> tuple[subprocess.Popen, str, str, float]:
    """Run ``cmd``; once ``ready(proc)`` says so, ``kill()``; its output, and the seconds
    from the kill to its end."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dask_env())
    try:
        ready(proc)
        kill()
        killed = time.monotonic()
        out, err = proc.communicate(timeout=BOUND_SECONDS)
        return proc, out, err, time.monotonic() - killed
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_scheduler_lost_in_the_randomized_solver_s_passes_is_one_line_naming_the_checkpoint(tmp_path, data):
    path, _ = data
    model, ckpt = tmp_path / "m", tmp_path / "m.checkpoint"
    with DaskProcesses(tmp_path, worker_hosts=("127.0.0.1",), worker_args=["--preload", "slow_folds"]) as procs:
        address = json_address(procs.scheduler_file)
        cmd = [sys.executable, "-m", "dfairpca", "fit", str(path), "--array", "X", "--method", "pca",
               "-k", "4", "--svd-solver", "randomized", "--out", str(model), "--rows-per-chunk", "50",
               "--scheduler", address, "--timeout", str(TIMEOUT)]

        def in_a_pass(proc):  # its progress: "pass: 25% (16 of 62 tasks) after 2.1 s"
            for line in proc.stdout:
                if line.startswith("pass: 25%"):
                    return
            raise AssertionError(proc.communicate())

        proc, out, err, took = _run_until(cmd, in_a_pass, procs.scheduler.kill)
    assert proc.returncode == 1, (out, err)
    line = _lost_scheduler_line(err, address)
    assert f"the checkpoint {ckpt} holds 0 of " in line and "rerun with --resume" in line, line
    assert took < BOUND_SECONDS and not model.exists()


def test_a_scheduler_lost_mid_transform_is_one_line_naming_it(tmp_path, data, monkeypatch):
    path, local = data
    saved, out = tmp_path / "model", tmp_path / "Y.zarr"
    local.save(saved)
    monkeypatch.setenv("DFAIRPCA_TEST_FOLD_SECONDS", "30")  # the one projection: long
    with DaskProcesses(tmp_path, worker_hosts=("127.0.0.1",), worker_args=["--preload", "slow_folds"]) as procs:
        address = json_address(procs.scheduler_file)
        cmd = [sys.executable, "-m", "dfairpca", "transform", str(saved), str(path), "--array", "X",
               "--out", str(out), "--scheduler", address, "--timeout", str(TIMEOUT)]

        def writing(proc):
            from distributed import Client

            with Client(address, timeout=20) as watcher:
                deadline = time.monotonic() + BOUND_SECONDS
                while not any(watcher.processing().values()):
                    assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()
                    time.sleep(0.1)

        proc, stdout, err, took = _run_until(cmd, writing, procs.scheduler.kill)
    assert proc.returncode == 1, (stdout, err)
    _lost_scheduler_line(err, address)
    assert err.startswith("dfairpca transform: error: "), err
    assert took < BOUND_SECONDS and not out.exists()


def test_a_scheduler_lost_mid_ingest_is_one_error_naming_it_and_the_kept_chunks(tmp_path):
    """A synthetic store written by a cluster's workers (as `dfairpca synth-celeba
    --scheduler` and `ingest-celeba --scheduler` write theirs): its scheduler killed
    mid-write is one SchedulerLost naming it, and the finished chunks are kept."""
    from dfairpca.celeba import synth_celeba
    from dfairpca.cluster import SchedulerLost

    out = tmp_path / "faces.zarr"
    with DaskProcesses(tmp_path, worker_hosts=("127.0.0.1",), worker_args=["--preload", "slow_folds"]) as procs, \
            _worker_first(procs.scheduler_file), connect(scheduler_file=procs.scheduler_file, timeout=3) as client:
        address = client.scheduler.address
        thread, outcome = _in_a_daemon_thread(lambda: synth_celeba(
            out, n=800, size=8, chunk_rows=8, progress=False, client=client))  # 100 chunks
        deadline = time.monotonic() + BOUND_SECONDS
        while client.run(lambda dask_worker: dask_worker.state.executed_count).popitem()[1] < 3:
            assert time.monotonic() < deadline and thread.is_alive(), outcome
            time.sleep(0.05)
        procs.scheduler.kill()
        thread.join(BOUND_SECONDS)
        assert not thread.is_alive(), "the ingest still waits after its scheduler died"
    exc = outcome.get("error")
    assert isinstance(exc, SchedulerLost), repr(outcome)
    assert str(exc).startswith(f"lost the Dask scheduler at {address} ") and "\n" not in str(exc)
    assert any("kept the finished chunks" in note for note in getattr(exc, "__notes__", []))
    assert not out.exists()


def json_address(scheduler_file) -> str:
    """The address in a scheduler file, once the scheduler has written it."""
    import json

    deadline = time.monotonic() + 30
    while True:
        try:
            return json.loads(scheduler_file.read_text())["address"]
        except (OSError, ValueError, KeyError):
            assert time.monotonic() < deadline, "no scheduler file"
            time.sleep(0.1)


def test_records_of_a_connection_that_comes_back_are_logged(tmp_path):
    """A scheduler restarted at the same address: the Client reconnects, so what was
    logged of its closed connection was no loss to report, and reaches the program's
    handlers once the Client is back (a record as distributed's comms log one)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    address = f"tcp://127.0.0.1:{port}"
    env = dask_env()
    logs = open(tmp_path / "cluster.log", "w")

    def scheduler():
        return subprocess.Popen([sys.executable, "-m", "dask", "scheduler", "--host", "127.0.0.1",
                                 "--port", str(port), "--no-dashboard"], stdout=logs, stderr=logs, env=env)

    procs = [scheduler()]
    procs.append(subprocess.Popen([sys.executable, "-m", "dask", "worker", address, "--nthreads", "1",
                                   "--no-dashboard"], stdout=logs, stderr=logs, env=env))
    try:
        with _distributed_records() as records, connect(address, timeout=20) as client:
            procs[0].kill()
            procs[0].wait()
            closed = OSError("Connection closed by the scheduler")
            logging.getLogger("distributed.core").warning("closed connection", exc_info=closed)
            assert not [r for r in records if r.exc_info and r.exc_info[1] is closed]  # held
            procs[0] = scheduler()
            deadline = time.monotonic() + BOUND_SECONDS
            while not [r for r in records if r.exc_info and r.exc_info[1] is closed]:
                assert time.monotonic() < deadline, (client.status, records)
                time.sleep(0.1)
            assert client.status == "running"
    finally:
        for p in procs:
            p.kill()
            p.wait()
        logs.close()


def test_a_call_that_meets_the_closed_scheduler_connection_before_the_client_notices_is_the_loss(client):
    """Right after the scheduler dies, a call (asking it for its workers' threads) can
    meet the reset connection while the Client still says "running": distributed names
    the comm, ``remote=<scheduler>``, and that is the lost scheduler, one line; the same
    error on a worker's connection is not."""
    from distributed.comm.core import CommClosedError

    from dfairpca.engine._compute import SchedulerLost, _lost_scheduler, cluster_failures_said

    assert client.status == "running"
    scheduler = client.scheduler.address
    worker = next(iter(client.nthreads()))
    reset = CommClosedError(f"in <TCP (closed) ConnectionPool.ncores local=tcp://127.0.0.1:1 "
                            f"remote={scheduler}>: ConnectionResetError: [Errno 104] Connection reset by peer")
    assert _lost_scheduler(client, reset)
    assert not _lost_scheduler(client, CommClosedError(f"in <TCP (closed) Ephemeral Worker->Worker "
                                                       f"remote={worker}>: Stream is closed"))
    assert not _lost_scheduler(client, ValueError(f"remote={scheduler}>"))  # a task's own error
    # a worker whose port begins with the scheduler's
    assert not _lost_scheduler(client, CommClosedError(f"in <TCP (closed) ConnectionPool.ncores "
                                                       f"remote={scheduler}7>: Stream is closed"))
    with pytest.raises(SchedulerLost, match=scheduler):
        with cluster_failures_said(client):
            raise reset
    # the connection it could not open names it too (the client's own timeout)
    assert _lost_scheduler(client, OSError(f"Timed out trying to connect to {scheduler} after 3 s"))
    assert not _lost_scheduler(client, OSError(f"Timed out trying to connect to {scheduler}7 after 3 s"))
    # a block that runs the caller's code too (connect()'s) translates only what names the
    # loss; the original's notes stay on it
    full = OSError(28, "No space left on device")
    full.add_note("kept the finished chunks")
    for named_only in (False, True):
        with pytest.raises(OSError) as info, cluster_failures_said(client, named_only=named_only):
            raise full
        assert info.value is full
    with pytest.raises(SchedulerLost) as lost, cluster_failures_said(client, named_only=True):
        reset.add_note("kept the finished chunks")
        raise reset
    assert lost.value.__notes__ == ["kept the finished chunks"]
    with pytest.raises(SystemExit), cluster_failures_said(client):
        raise SystemExit(2)
