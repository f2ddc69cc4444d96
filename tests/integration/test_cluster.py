"""dfairpca.cluster against real `dask scheduler` / `dask worker` processes on 127.0.0.1
(on separate virtual hosts: tests/integration/test_virtual_hosts.py)."""

import http.server
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import zarr

import dfairpca
from dfairpca.cluster import NoWorkers, SchedulerUnreachable, connect, describe, local_cluster_size
from oracle import make_data, max_angle_deg
from processes import DaskProcesses, dask_env, interrupted

N, H, W = 3000, 5, 8


@pytest.fixture
def processes(tmp_path):
    with DaskProcesses(tmp_path) as procs:
        yield procs


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """uint8 images in a real Zarr store, their group labels and the local numpy fit."""
    X, g = make_data(N, H * W, (2, 3), seed=21)
    Xu8 = np.clip(X * 8 + 128, 0, 255).astype(np.uint8)
    path = tmp_path_factory.mktemp("zarr") / "faces.zarr"
    group = zarr.open_group(str(path), mode="w")
    images = group.create_array("images", shape=(N, H, W), chunks=(50, H, W), dtype="uint8")
    images[:] = Xu8.reshape(N, H, W)
    labels = np.column_stack(g)
    local = dfairpca.FairPCA(6, compute_dtype="float64").fit(Xu8, sensitive_features=labels)
    return path, labels, local


def _slow_copy(block):
    time.sleep(0.05)
    return block


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_fit_through_scheduler_file_equals_local_fit(processes, data):
    path, labels, local = data
    with connect(scheduler_file=processes.scheduler_file, timeout=20) as client:
        client.wait_for_workers(2, timeout=30)
        line = describe(client)
        assert line.startswith("scheduler tcp://127.0.0.1:") and "2 worker(s), 2 thread(s)" in line
        assert "4.00 GiB memory" in line and "\n" not in line
        Xz = dfairpca.from_zarr(path, "images", rows_per_chunk=250)
        remote = dfairpca.FairPCA(6, compute_dtype="float64", split_every=3).fit(Xz, sensitive_features=labels)
        ran = client.run(lambda dask_worker: sum(
            "_fold" in str(entry) for entry in dask_worker.state.log))
        assert all(count > 0 for count in ran.values()), ran  # both workers read chunks
    assert max_angle_deg(remote.components_.T, local.components_.T) < 1e-6


def test_relative_paths_name_this_process_s_folders_on_the_workers_too(processes, data, monkeypatch):
    """The workers run in another working directory (as on other machines): a relative
    store path is this process's, whether the workers read it or write it."""
    from dfairpca.celeba import synth_celeba

    path, labels, local = data
    monkeypatch.chdir(path.parent)
    assert processes.dir != path.parent  # the workers' working directory
    with connect(scheduler_file=processes.scheduler_file, timeout=20) as client:
        client.wait_for_workers(2, timeout=30)
        Xz = dfairpca.from_zarr(path.name, "images", rows_per_chunk=250)
        remote = dfairpca.FairPCA(6, compute_dtype="float64").fit(Xz, sensitive_features=labels)
        synth_celeba("rel.zarr", n=48, size=8, chunk_rows=8, progress=False, client=client)
    assert max_angle_deg(remote.components_.T, local.components_.T) < 1e-6
    assert dfairpca.from_zarr(path.parent / "rel.zarr", "images").shape == (48, 8, 8)


def test_worker_killed_mid_pass_leaves_the_result_unchanged(processes, data):
    path, labels, local = data
    Xz = dfairpca.from_zarr(path, "images", rows_per_chunk=50)  # 60 chunks
    slow = Xz.map_blocks(_slow_copy, dtype=Xz.dtype)
    with connect(scheduler_file=processes.scheduler_file, timeout=20) as client:
        client.wait_for_workers(2, timeout=30)
        pids = client.run(os.getpid)
        victim = processes.workers[0]
        (address,) = [a for a, pid in pids.items() if pid == victim.pid]
        est = dfairpca.FairPCA(6, compute_dtype="float64", split_every=4)
        with ThreadPoolExecutor(1) as pool:
            fit = pool.submit(est.fit, slow, sensitive_features=labels)
            deadline = time.monotonic() + 30
            while client.run(lambda dask_worker: dask_worker.state.executed_count,
                             workers=[address])[address] < 3:
                assert time.monotonic() < deadline and not fit.done(), processes.logs()
                time.sleep(0.02)
            victim.send_signal(signal.SIGKILL)
            assert not fit.done()  # the pass is still running when the worker dies
            remote = fit.result(timeout=60)
        assert victim.wait(timeout=5) == -signal.SIGKILL
        assert list(client.scheduler_info()["workers"]) == [a for a in pids if a != address]
    assert max_angle_deg(remote.components_.T, local.components_.T) < 1e-6


def _times_out(log: str):
    from dfairpca.io import StoreTimeout

    (Path(log) / "failed").touch()
    raise StoreTimeout("s3://data/x.zarr", 4.0, "x.zarr/c/0/0")


def _fails(log: str):
    (Path(log) / "failed").touch()
    raise ValueError("the first task failed")


def _other_task(log: str, i: int) -> None:
    """One of the other tasks of a watched computation: once the failing task has run, it
    waits for the test's ``release`` (as a task on a frozen store waits its timeout), then
    records its end."""
    folder = Path(log)
    deadline = time.monotonic() + 120  # a guard against a hang, not a measurement
    while ((folder / "failed").exists() and not (folder / "release").exists()
           and time.monotonic() < deadline):
        time.sleep(0.01)
    (folder / f"end-{i}").touch()


def test_a_watched_computation_ends_with_a_store_timeout_not_its_last_task(processes, tmp_path):
    """A fit's computation (under a timeout) raises a store's timeout once a task meets it,
    without waiting for the other tasks: each may wait its whole timeout on a frozen store
    (here: until the test releases them, after the call returned). Any other failure waits
    for the other tasks (those of a failed write go on writing, and the caller's clean-up
    must not race them): released only once the failing task has run, they have all ended
    when the call returns."""
    import dask

    from dfairpca.engine._compute import compute, worker_timeout
    from dfairpca.io import StoreTimeout

    with connect(scheduler_file=processes.scheduler_file, timeout=20) as client:
        client.wait_for_workers(2, timeout=30)
        for task, error, fast in [(_times_out, StoreTimeout, True), (_fails, ValueError, False)]:
            log = tmp_path / task.__name__
            log.mkdir()
            others = [dask.delayed(_other_task, pure=False)(str(log), i) for i in range(16)]
            with dask.annotate(priority=10):  # runs among the first
                failing = dask.delayed(task, pure=False)(str(log))
            releaser = None
            if not fast:
                def release(log=log):
                    while not (log / "failed").exists():
                        time.sleep(0.01)
                    time.sleep(0.5)  # a call that did not wait would have returned by now
                    (log / "release").touch()

                releaser = threading.Thread(target=release, daemon=True)
                releaser.start()
            with worker_timeout(30), pytest.raises(error):
                compute(*others, failing)
            ended = len(list(log.glob("end-*")))
            (log / "release").touch()
            assert (ended < 16) if fast else (ended == 16), (task.__name__, ended)


def test_interrupted_fit_resumes_from_checkpoint_on_the_cluster(processes, data, tmp_path, stop_after):
    """A pass stopped after two segments resumes on the dask CLI cluster, redoing nothing."""
    from dfairpca.engine.checkpoint import compute_moments_checkpointed

    path, labels, local = data
    ckpt = tmp_path / "fit.checkpoint"
    Xz = dfairpca.from_zarr(path, "images", rows_per_chunk=50)
    stop = stop_after(1)
    with connect(scheduler_file=processes.scheduler_file, timeout=20) as client:
        client.wait_for_workers(2, timeout=30)
        with pytest.raises(KeyboardInterrupt):
            compute_moments_checkpointed(Xz.reshape(N, -1), sensitive_features=labels, checkpoint=ckpt,
                                         dtype=np.float64, segment_rows=500, on_segment=stop)
        resumed = []
        m = compute_moments_checkpointed(Xz.reshape(N, -1), sensitive_features=labels, checkpoint=ckpt,
                                         dtype=np.float64, on_segment=lambda i, n: resumed.append(i))
    assert stop.seen == [0, 1] and resumed and 0 not in resumed and 1 not in resumed
    remote = dfairpca.FairPCA(6, compute_dtype="float64").fit_statistics(m)
    assert max_angle_deg(remote.components_.T, local.components_.T) < 1e-6


#: what the dead-worker tests' workers preload: every fold sleeps (tests/slow_folds.py)
SLOW_FOLDS = ["--preload", "slow_folds"]
#: the timeout of the fits whose workers all die
NO_WORKERS_SECONDS = 5
#: what the error may take beyond it: a look at the workers every second, a loaded machine
SLACK_SECONDS = 15


def _kill_every_worker_midway(procs, ckpt, running) -> float:
    """SIGKILL every worker once the pass has saved a segment to ``ckpt`` (as the whole
    allocation of a batch job ends); the time of the kill.  ``running()`` is False once
    the fit has ended."""
    deadline = time.monotonic() + 60
    while not (ckpt / "progress.json").exists():
        assert time.monotonic() < deadline and running(), procs.logs()
        time.sleep(0.02)
    for w in procs.workers:
        w.send_signal(signal.SIGKILL)
    for w in procs.workers:
        w.wait(timeout=10)
    return time.monotonic()


def _fit_in_a_daemon_thread(fit):
    """``(thread, outcome)``: ``fit()`` runs in a daemon thread and leaves its exception,
    or its result, in ``outcome``; a fit that waits forever then fails the test (which
    stops waiting for the thread) instead of hanging it."""
    outcome = {}

    def run():
        try:
            outcome["result"] = fit()
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            outcome["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, outcome


def test_fit_whose_workers_all_die_stops_after_its_timeout_and_resumes(tmp_path, data):
    from dfairpca.cluster import WorkersLost

    path, labels, local = data
    ckpt = tmp_path / "fit.checkpoint"
    Xz = dfairpca.from_zarr(path, "images", rows_per_chunk=50)  # 60 chunks, 4 segments

    def fit():
        return dfairpca.FairPCA(6, compute_dtype="float64").fit(
            Xz, sensitive_features=labels, checkpoint=ckpt, timeout=NO_WORKERS_SECONDS)

    with DaskProcesses(tmp_path, worker_args=SLOW_FOLDS) as procs, \
            connect(scheduler_file=procs.scheduler_file, timeout=20) as client:
        client.wait_for_workers(2, timeout=30)
        thread, outcome = _fit_in_a_daemon_thread(fit)
        killed = _kill_every_worker_midway(procs, ckpt, thread.is_alive)
        thread.join(NO_WORKERS_SECONDS + SLACK_SECONDS)
        took = time.monotonic() - killed
        assert not thread.is_alive(), f"the fit still waits {took:.0f} s after its workers died"
        exc = outcome.get("error")
        assert isinstance(exc, WorkersLost), repr(outcome)
        assert NO_WORKERS_SECONDS <= took < NO_WORKERS_SECONDS + SLACK_SECONDS
        msg = str(exc)
        saved = json.loads((ckpt / "progress.json").read_text())["done"]
        assert "\n" not in msg and f"no workers for {NO_WORKERS_SECONDS} s" in msg, msg
        assert f"{str(ckpt)!r} holds {16 * len(saved)} of 60 chunks" in msg, msg
        assert "run the same call again to continue" in msg and exc.checkpoint == ckpt
        # what it says works: a new worker, the same call, the finished segments kept
        procs.add_worker()
        client.wait_for_workers(1, timeout=30)
        resumed = fit()
    assert max_angle_deg(resumed.components_.T, local.components_.T) < 1e-6


def test_workers_that_join_within_the_timeout_take_over_the_pass(tmp_path, data):
    path, labels, local = data
    ckpt = tmp_path / "fit.checkpoint"
    Xz = dfairpca.from_zarr(path, "images", rows_per_chunk=50)
    with DaskProcesses(tmp_path, worker_args=SLOW_FOLDS) as procs, \
            connect(scheduler_file=procs.scheduler_file, timeout=20) as client:
        client.wait_for_workers(2, timeout=30)
        thread, outcome = _fit_in_a_daemon_thread(lambda: dfairpca.FairPCA(
            6, compute_dtype="float64").fit(Xz, sensitive_features=labels, checkpoint=ckpt,
                                             timeout=60))
        _kill_every_worker_midway(procs, ckpt, thread.is_alive)
        procs.add_worker()
        thread.join(60 + SLACK_SECONDS)
        assert not thread.is_alive() and "result" in outcome, (outcome, procs.logs())
    assert max_angle_deg(outcome["result"].components_.T, local.components_.T) < 1e-6


def test_cli_fit_whose_workers_all_die_is_one_line_naming_resume(tmp_path, data):
    path, _, _ = data
    model = tmp_path / "model"
    ckpt = tmp_path / "model.checkpoint"
    with DaskProcesses(tmp_path, worker_args=SLOW_FOLDS) as procs:
        cmd = [sys.executable, "-m", "dfairpca", "fit", str(path), "--array", "images",
               "--method", "pca", "-k", "6", "--out", str(model), "--rows-per-chunk", "50",
               "--scheduler-file", str(procs.scheduler_file),
               "--timeout", str(NO_WORKERS_SECONDS)]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=dask_env())
        try:
            _kill_every_worker_midway(procs, ckpt, lambda: proc.poll() is None)
            _, err = proc.communicate(timeout=NO_WORKERS_SECONDS + SLACK_SECONDS)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    last = err.strip().splitlines()[-1]
    assert proc.returncode == 1, err
    assert last.startswith("dfairpca fit: error: ") and err.count("error:") == 1, err
    assert f"no workers for {NO_WORKERS_SECONDS} s" in last and "rerun with --resume" in last
    assert f"{ckpt} holds" in last and not model.exists()


#: dask's own connection timeout (distributed.comm.timeouts.connect): a call given a shorter
#: one that ends before this honoured its own, not dask's; a bound far from the ones the
#: tests give, so that a loaded machine's slowness cannot reach it
DASK_CONNECT_SECONDS = 30


def test_unreachable_scheduler_fails_fast_with_one_line():
    address = f"tcp://127.0.0.1:{_free_port()}"
    start = time.monotonic()
    with pytest.raises(SchedulerUnreachable) as info:
        with connect(address, timeout=2):
            pass
    assert time.monotonic() - start < DASK_CONNECT_SECONDS
    msg = str(info.value)
    assert "\n" not in msg and address in msg and "2 s" in msg and "dask scheduler" in msg
    assert info.value.__cause__ is None and info.value.__suppress_context__
    assert isinstance(info.value, ConnectionError)


def test_a_server_that_is_not_dask_fails_within_the_timeout():
    server = http.server.HTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
    server.RequestHandlerClass.log_message = lambda *a: None
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        start = time.monotonic()
        with pytest.raises(SchedulerUnreachable, match="within 1 s"):
            with connect(f"tcp://127.0.0.1:{server.server_address[1]}", timeout=1):
                pass
        assert time.monotonic() - start < DASK_CONNECT_SECONDS
    finally:
        server.shutdown()
        server.server_close()


def test_scheduler_file_errors(tmp_path):
    missing = tmp_path / "nope.json"
    with pytest.raises(FileNotFoundError, match="nope.json.*dask scheduler --scheduler-file"):
        with connect(scheduler_file=missing, timeout=0.3):
            pass
    stale = tmp_path / "stale.json"
    stale.write_text(json.dumps({"address": f"tcp://127.0.0.1:{_free_port()}"}))
    with pytest.raises(SchedulerUnreachable, match="stale.json"):
        with connect(scheduler_file=stale, timeout=1):
            pass
    garbage = tmp_path / "garbage.json"
    garbage.write_text("{not json")
    with pytest.raises(ValueError, match="not a Dask scheduler file"):
        with connect(scheduler_file=garbage, timeout=1):
            pass


def test_argument_errors():
    with pytest.raises(ValueError, match="not both"):
        with connect("tcp://127.0.0.1:1", scheduler_file="x.json"):
            pass
    with pytest.raises(ValueError, match="no scheduler given"):
        with connect(local=False):
            pass
    with pytest.raises(ValueError, match="not a scheduler address"):
        with connect("http://127.0.0.1:8786"):
            pass


@pytest.mark.parametrize("address, why", [
    ("htp:/x", "its port '/x' is not a number"), ("5", "it has no port"),
    ("tcp://host", "it has no port"), ("tcp://host:port", "its port 'port' is not a number"),
    ("tcp://:8786", "it has no host"), ("tcp://host:99999", "its port 99999 is not in 1-65535"),
])
def test_a_malformed_address_is_refused_before_connecting(address, why, tmp_path):
    # nothing is asked of the network: a ValueError naming the address, not the timeout's
    # SchedulerUnreachable, nor a reply
    with pytest.raises(ValueError, match=rf"^'{re.escape(address)}' is not a scheduler address: "
                                         rf"{re.escape(why)}; .*tcp://host:8786") as info:
        with connect(address, timeout=30):
            pass
    assert "\n" not in str(info.value) and "reply" not in str(info.value)
    for value in (5, address):  # the same from a scheduler file, which the message names
        path = tmp_path / "scheduler.json"
        path.write_text(json.dumps({"address": value}))
        with pytest.raises(ValueError, match=r"\(read from scheduler file .*scheduler.json'\)"
                                             r".*tcp://host:8786"):
            with connect(scheduler_file=path, timeout=30):
                pass


def _logging_state():
    """Level, filters, handlers and propagation of the root logger and of every logger
    that exists now (what a library must leave as it found it).  Not the DequeHandler that
    a distributed Scheduler or Nanny adds to its own logger (its dashboard's log page):
    any LocalCluster does that, dfairpca or not."""
    import logging

    from distributed.utils import DequeHandler

    loggers = {"": logging.getLogger(), **{
        name: log for name, log in logging.Logger.manager.loggerDict.items()
        if isinstance(log, logging.Logger)}}
    return {name: (log.level, list(log.filters),
                   [h for h in log.handlers if not isinstance(h, DequeHandler)], log.propagate,
                   log.disabled)
            for name, log in loggers.items()}


def test_local_cluster_logs_its_dashboard_and_prints_nothing(capfd, caplog):
    """The cluster's size, and its dashboard's address where it has one (bokeh, which draws
    it, installed); without bokeh not a word of the dashboard, from dfairpca or distributed."""
    import importlib.util
    import logging

    from distributed import get_client

    with caplog.at_level(logging.INFO):
        with connect(n_workers=1, threads_per_worker=1, memory_limit="1GiB") as client:
            assert get_client() is client
            assert "1 worker(s), 1 thread(s), 1.00 GiB memory" in describe(client)
            link = client.dashboard_link
    told = [r.getMessage() for r in caplog.records if r.name == "dfairpca.cluster"]
    assert told[0].startswith("local Dask cluster, scheduler tcp://127.0.0.1:"), told
    if importlib.util.find_spec("bokeh") is not None:
        assert told[1:] == [f"dashboard {link}"] and link.startswith("http://127.0.0.1:"), told
    else:
        assert told[1:] == [], told
        assert not [r for r in caplog.records if "bokeh" in r.getMessage().lower()]
    assert all(r.levelno == logging.INFO for r in caplog.records if r.name == "dfairpca.cluster")
    out, err = capfd.readouterr()  # a library logs; only a program prints
    assert "dfairpca" not in out + err, out + err


def test_a_local_worker_slow_to_end_is_waited_for_not_killed(caplog):
    """A normal exit waits for each worker process to end on its own (here its close takes
    6 s, beyond the 4 s distributed's close gives before a kill): no nanny's "Worker
    process still alive ... killing"; the workers' teardown ran to its end."""
    import logging

    import dask

    with dask.config.set({"distributed.worker.preload": ["slow_teardown"]}), \
            caplog.at_level(logging.INFO, logger="distributed"):
        with connect(n_workers=2, threads_per_worker=1, memory_limit="1GiB", quiet=True) as client:
            assert client.submit(sum, [1, 2]).result() == 3
    warned = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert not [m for m in warned if "still alive" in m or "killing" in m], warned
    closed = [r for r in caplog.records if r.name == "distributed.nanny" and "closed" in r.getMessage()]
    assert len(closed) == 2, [r.getMessage() for r in caplog.records if r.name == "distributed.nanny"]


def test_connect_leaves_the_programs_logging_as_it_was():
    """connect() quiets distributed and asyncio only inside its block, and on its own
    workers: levels, filters and handlers of every logger of this process are the same after
    it as before, also after a Ctrl-C in the block."""
    import distributed  # noqa: F401 (its loggers exist before the first snapshot)

    before = _logging_state()
    with connect(n_workers=1, threads_per_worker=1, memory_limit="1GiB", quiet=True) as client:
        during = _logging_state()
        assert client.submit(sum, [1, 2]).result() == 3
    after = _logging_state()
    assert {name: after[name] for name in before} == before
    # the block did filter: the check above could see a change
    assert during["asyncio"][1] != before["asyncio"][1]
    with pytest.raises(KeyboardInterrupt):
        with connect(n_workers=1, threads_per_worker=1, memory_limit="1GiB", quiet=True):
            raise KeyboardInterrupt
    after = _logging_state()
    assert {name: after[name] for name in before} == before


def test_local_cluster_size_fills_the_cores():
    from dask.system import CPU_COUNT

    workers, threads = local_cluster_size()
    assert workers * threads <= max(CPU_COUNT, 1) and workers >= 1
    assert local_cluster_size(3, 2) == (3, 2)
    assert local_cluster_size(n_workers=1)[1] == max(1, CPU_COUNT)


# A test CA, a certificate it signed (used by scheduler, workers and client alike) and an
# intruder's self-signed certificate; EC P-256, valid 2000-2100, made with `openssl ca`.
TEST_PEM = {
    "ca.crt": """-----BEGIN CERTIFICATE-----
MIIBaTCCAQ+gAwIBAgIBATAKBggqhkjOPQQDAjAbMRkwFwYDVQQDDBBkZmFpcnBj
YS10ZXN0LWNhMCAXDTAwMDEwMTAwMDAwMFoYDzIxMDAwMTAxMDAwMDAwWjAbMRkw
FwYDVQQDDBBkZmFpcnBjYS10ZXN0LWNhMFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcD
QgAElFYrsjyVVWK1BcvTX1PCJo46S0tZOGBeL+h87ofjQKh2kZ051EXJ6bMhTj7R
lu1YAzVrqhT8JbyztMLmv6etKKNCMEAwDwYDVR0TAQH/BAUwAwEB/zAOBgNVHQ8B
Af8EBAMCAgQwHQYDVR0OBBYEFKOXJzSsE4CXQ/5cHGWjFvgva9NPMAoGCCqGSM49
BAMCA0gAMEUCIQCXcvaa5kpzPJKciDFkEdQ2RYVV0S88lVe4q8AYsDMFuQIgC430
hrqbzZ40C/7fpdZReHzIHIGKdxzTffryI4vfntY=
-----END CERTIFICATE-----
""",
    "node.crt": """-----BEGIN CERTIFICATE-----
MIIBejCCAR+gAwIBAgIBAjAKBggqhkjOPQQDAjAbMRkwFwYDVQQDDBBkZmFpcnBj
YS10ZXN0LWNhMCAXDTAwMDEwMTAwMDAwMFoYDzIxMDAwMTAxMDAwMDAwWjAdMRsw
GQYDVQQDDBJkZmFpcnBjYS10ZXN0LW5vZGUwWTATBgcqhkjOPQIBBggqhkjOPQMB
BwNCAARoX6AhQ2d/TuKcB3dwrUeQBBKbmNbz2H1uivMbX75pujnyMb7gC47xAS82
g2vjOUrWf7iCupwAS09nOtD9esD3o1AwTjAMBgNVHRMBAf8EAjAAMB0GA1UdDgQW
BBRwB4rJvLm0eQfL64PWTCPjZAITWzAfBgNVHSMEGDAWgBSjlyc0rBOAl0P+XBxl
oxb4L2vTTzAKBggqhkjOPQQDAgNJADBGAiEA0H9lCa7ZMxo+Rhl1tDmUSSRsDfco
ybJKzroiABIMoUACIQDyLDNUqrwI56JOEzsK6lIirPLCGhHyRik8gx26RTveNQ==
-----END CERTIFICATE-----
""",
    "node.key": """-----BEGIN EC PRIVATE KEY-----
MHcCAQEEIPc37O4SzzIVy+r78kPtB7SSLvRy1t0101izWTlEat/PoAoGCCqGSM49
AwEHoUQDQgAEaF+gIUNnf07inAd3cK1HkAQSm5jW89h9borzG1++abo58jG+4AuO
8QEvNoNr4zlK1n+4grqcAEtPZzrQ/XrA9w==
-----END EC PRIVATE KEY-----
""",
    "intruder.crt": """-----BEGIN CERTIFICATE-----
MIIBWTCB/6ADAgECAgEDMAoGCCqGSM49BAMCMBMxETAPBgNVBAMMCGludHJ1ZGVy
MCAXDTAwMDEwMTAwMDAwMFoYDzIxMDAwMTAxMDAwMDAwWjATMREwDwYDVQQDDAhp
bnRydWRlcjBZMBMGByqGSM49AgEGCCqGSM49AwEHA0IABN5ScuJyaVrgkGkwEOaA
W/2Lu5ZqfWBIyMyVnOip4nH4Di91nYEBYUOHRig1rcYNRCDkoPBnmcbJ1fhU+Hev
+g2jQjBAMA8GA1UdEwEB/wQFMAMBAf8wDgYDVR0PAQH/BAQDAgIEMB0GA1UdDgQW
BBReZAK7V0syggox+x3E6Maxah8knTAKBggqhkjOPQQDAgNJADBGAiEApM01Wha/
GCk7iPLHw30/NunxbYlT/k+w9PwztW2VF2QCIQD8bQ+16b8QKW0oYz4v69k+TDbn
kJWypQ/KmBW6o3RwcQ==
-----END CERTIFICATE-----
""",
    "intruder.key": """-----BEGIN EC PRIVATE KEY-----
MHcCAQEEIOa6PA2d7h1tTowDc8WWidUv5U9G1xZbkkgCZZeaOK6MoAoGCCqGSM49
AwEHoUQDQgAE3lJy4nJpWuCQaTAQ5oBb/Yu7lmp9YEjIzJWc6KnicfgOL3WdgQFh
Q4dGKDWtxg1EIOSg8GeZxsnV+FT4d6/6DQ==
-----END EC PRIVATE KEY-----
""",
}


def test_tls_scheduler_admits_only_certificates_of_its_ca(tmp_path):
    from distributed.security import Security

    for name, text in TEST_PEM.items():
        (tmp_path / name).write_text(text)
    pem = {name: str(tmp_path / name) for name in TEST_PEM}
    # the flags of cluster/tls.md
    tls_args = ["--tls-ca-file", pem["ca.crt"], "--tls-cert", pem["node.crt"],
                "--tls-key", pem["node.key"]]
    member = Security(tls_ca_file=pem["ca.crt"], tls_client_cert=pem["node.crt"],
                      tls_client_key=pem["node.key"], require_encryption=True)
    intruder = Security(tls_ca_file=pem["intruder.crt"], tls_client_cert=pem["intruder.crt"],
                        tls_client_key=pem["intruder.key"], require_encryption=True)
    with DaskProcesses(tmp_path, host="tls://127.0.0.1", worker_hosts=["tls://127.0.0.1"],
                       extra_args=tls_args) as procs:
        with connect(scheduler_file=procs.scheduler_file, timeout=20, security=member) as client:
            client.wait_for_workers(1, timeout=30)
            assert describe(client).startswith("scheduler tls://127.0.0.1:")
            X = np.random.default_rng(0).normal(size=(400, 5))
            import dask.array as da

            m = dfairpca.compute_moments(da.from_array(X, chunks=(100, 5)))
            np.testing.assert_allclose(m.mean, X.mean(0))
        with pytest.raises(SchedulerUnreachable, match="tls://127.0.0.1.*TLS handshake failed"):
            with connect(scheduler_file=procs.scheduler_file, timeout=2, security=intruder):
                pass
        with pytest.raises(ValueError, match="no TLS client certificate"):
            with connect(scheduler_file=procs.scheduler_file, timeout=2):
                pass


def test_a_scheduler_without_workers_is_a_one_line_error_after_the_timeout(tmp_path, capsys):
    """Issue 10 item 5: a running scheduler that no worker joined used to hang forever."""
    from dfairpca.celeba import synth_celeba
    from dfairpca.cli import main

    store = tmp_path / "small.zarr"
    synth_celeba(store, n=200, size=8, chunk_rows=100, progress=False, n_jobs=1)
    with DaskProcesses(tmp_path, worker_hosts=()) as procs:
        address = procs.address()
        start = time.monotonic()
        with pytest.raises(NoWorkers) as info:
            with connect(address, timeout=2):
                pass
        assert 2 <= time.monotonic() - start < DASK_CONNECT_SECONDS  # waited its own timeout
        msg = str(info.value)
        assert "\n" not in msg and isinstance(info.value, ConnectionError)
        assert f"no workers (waited 2 s); start them with `dask worker {address}`" in msg
        capsys.readouterr()
        start = time.monotonic()
        code = main(["fit", str(store), "--attribute", "Eyeglasses", "-k", "5", "--out",
                     str(tmp_path / "m"), "--scheduler", address, "--timeout", "1.5"])
        assert time.monotonic() - start < DASK_CONNECT_SECONDS
        err = capsys.readouterr().err.splitlines()
        assert code == 1 and err == [
            f"dfairpca: waiting up to 1.5 s for a worker to join the scheduler at {address}",
            f"dfairpca fit: error: the Dask scheduler at {address} has no workers (waited "
            f"1.5 s); start them with `dask worker {address}` on the machines that should "
            "compute, or wait longer with --timeout",
        ]
        assert not (tmp_path / "m").exists()


def test_a_worker_that_joins_while_connect_waits_is_used(tmp_path):
    with DaskProcesses(tmp_path, worker_hosts=()) as procs:
        address = procs.address()
        with ThreadPoolExecutor(1) as pool:
            def connect_and_describe():
                with connect(address, timeout=60, quiet=True) as client:
                    return describe(client)

            waiting = pool.submit(connect_and_describe)
            time.sleep(1)
            assert not waiting.done()
            procs.workers.append(procs._spawn(
                ["distributed.cli.dask_worker", address, "--nthreads", "1", "--no-nanny",
                 "--no-dashboard", "--memory-limit", "1GiB", "--host", "127.0.0.1"],
                "worker-late.log"))
            assert "1 worker(s)" in waiting.result(timeout=60), procs.logs()


INTERRUPTED_GATHER = """
import sys, time
import dask
from dfairpca.cluster import connect

def slow(i):
    time.sleep(0.5)
    return i

if __name__ == "__main__":
    try:
        with connect(n_workers=2, threads_per_worker=1, quiet=True):
            print("computing", flush=True)
            dask.compute(*[dask.delayed(slow, pure=False)(i) for i in range(200)])
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)
"""


def test_ctrl_c_on_a_local_cluster_prints_nothing_of_its_own(tmp_path):
    """Ctrl-C (SIGINT to the whole process group) during a computation of many results on
    connect()'s local cluster: the workers do not see it (no traceback of theirs), and
    closing the cluster with tasks running and a gather pending prints nothing."""
    script = tmp_path / "gather.py"
    script.write_text(INTERRUPTED_GATHER)
    env = dict(dask_env(), PYTHONWARNINGS="ignore:Port 8787 is already in use")

    def computing(proc):
        assert proc.stdout.readline() == "computing\n", proc.communicate()
        time.sleep(1.5)  # tasks are running, the gather of 200 results is pending

    returncode, _, err = interrupted([sys.executable, str(script)], computing, timeout=300,
                                     env=env, cwd=tmp_path)
    assert returncode == 130 and err == "interrupted\n", err


def test_a_scheduler_file_still_being_written_is_read_again(tmp_path):
    """The scheduler writes its file in place: an empty file that fills in later is waited
    for, not reported as malformed."""
    import threading

    from dfairpca.cluster import scheduler_address_from_file

    f = tmp_path / "scheduler.json"
    f.write_text("")
    timer = threading.Timer(0.5, lambda: f.write_text('{"address": "tcp://127.0.0.1:1"}'))
    timer.start()
    try:
        assert scheduler_address_from_file(f, timeout=10) == "tcp://127.0.0.1:1"
    finally:
        timer.cancel()
