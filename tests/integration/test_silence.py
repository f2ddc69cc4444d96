"""What dfairpca must not say: Dask's "Sending large graph" when a model's matrices would
travel inside the graph of a transform, and distributed's "Port 8787 is already in use"
when the command line's local cluster starts beside another dashboard.  Each test also
makes the message appear, so that it would see it if dfairpca said it."""

import contextlib
import logging
import socket
import urllib.parse
import warnings

import numpy as np
import pytest
import zarr
from scheduler_tasks import feeds

import dfairpca
from dfairpca.cli import main
from dfairpca.cluster import DASHBOARD_PORT, connect

LARGE_GRAPH = "Sending large graph"
PORT_IN_USE = "Port 8787 is already in use"
#: rows, features and components: the (d, k) float64 components weigh 12 MB, more than
#: distributed's 10 MB before it warns of a large graph
N, D, K = 700, 2500, 600


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    """A float64 Zarr store and a PCA of it whose matrices are too large for a graph."""
    folder = tmp_path_factory.mktemp("silence")
    rng = np.random.default_rng(0)
    x = rng.standard_normal((N, D)) * np.linspace(2.0, 0.5, D)
    group = zarr.open_group(str(folder / "x.zarr"), mode="w")
    group.create_array("X", shape=x.shape, chunks=(100, D), dtype="f8")[:] = x
    est = dfairpca.PCA(K).fit(x)
    est.save(folder / "model")
    return folder, x, est


def _said(record, text: str) -> list[str]:
    return [str(w.message) for w in record if text in str(w.message)]


def test_transform_on_a_cluster_ships_the_matrices_once_not_in_the_graph(model, client):
    folder, x, est = model
    X = dfairpca.from_zarr(folder / "x.zarr", "X")
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        Y = est.transform(X).compute()
        R = est.inverse_transform(est.transform(X)).compute()
        ll = est.score_samples(X).compute()
    assert not _said(record, LARGE_GRAPH), _said(record, LARGE_GRAPH)
    np.testing.assert_allclose(Y, est.transform(x), rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(R, est.inverse_transform(est.transform(x)), rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(ll, est.score_samples(x), rtol=1e-9)
    # a result whose graph holds the shipped matrices still feeds a pass (Dask schedules it)
    m = dfairpca.compute_moments(est.transform(X))
    np.testing.assert_allclose(m.mean, Y.mean(axis=0), atol=1e-9)
    # the same matrix as a plain argument of the graph: distributed warns, and this sees it
    import dask.array as da

    with pytest.warns(UserWarning, match=LARGE_GRAPH):
        da.map_blocks(np.matmul, X, est.components_.T, dtype=np.float64,
                      chunks=(X.chunks[0], (K,))).compute()


def test_cli_transform_on_a_cluster_says_nothing_of_a_large_graph(model, client, tmp_path, capsys):
    folder, x, est = model
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        code = main(["transform", str(folder / "model"), str(folder / "x.zarr"), "--array", "X",
                     "--out", str(tmp_path / "rep.zarr"), "--scheduler", client.scheduler.address])
    err = capsys.readouterr().err
    assert code == 0, err
    assert not _said(record, LARGE_GRAPH) and LARGE_GRAPH not in err, (err, _said(record, LARGE_GRAPH))
    got = zarr.open_group(str(tmp_path / "rep.zarr"), mode="r")["representation"][:]
    np.testing.assert_allclose(got, est.transform(x), rtol=1e-6, atol=1e-6)


def test_a_dashboard_already_on_port_8787_gives_no_warning(recwarn):
    """What the command line starts (connect()'s local cluster) while another dashboard holds
    Dask's port: the dashboard moves to a free port without distributed's "Port 8787 is
    already in use" warning.  The same cluster started on ":8787" does warn (this test would
    see it)."""
    from distributed import LocalCluster

    busy = PORT_IN_USE
    with socket.socket() as other:
        try:
            other.bind(("", DASHBOARD_PORT))
        except OSError:
            pass  # already held (another cluster of this machine): held all the same
        else:
            other.listen()
        warnings.simplefilter("always")
        with connect(n_workers=1, threads_per_worker=1, memory_limit="1GiB", quiet=True) as client:
            assert urllib.parse.urlparse(client.dashboard_link).port != DASHBOARD_PORT
        assert not [w for w in recwarn if busy in str(w.message)], [str(w.message) for w in recwarn]
        with LocalCluster(n_workers=1, threads_per_worker=1, processes=True, host="127.0.0.1",
                          memory_limit="1GiB", dashboard_address=f":{DASHBOARD_PORT}"):
            pass
        assert [w for w in recwarn if busy in str(w.message)]


def test_a_heartbeat_on_a_closed_connection_is_quiet_on_local_workers(caplog):
    """The local cluster's workers drop distributed's heartbeat traceback when the scheduler
    closed the connection (it closes with the program), and keep any other."""
    import logging

    from distributed.comm.core import CommClosedError

    from dfairpca.cluster._signals import _quiet_closed_heartbeats

    logger = logging.getLogger("distributed.worker")
    before = list(logger.filters)
    _quiet_closed_heartbeats()
    try:
        def heartbeat_failure(exc):
            try:
                raise exc
            except Exception:
                logger.exception("Failed to communicate with scheduler during heartbeat.")

        with caplog.at_level(logging.ERROR, logger="distributed.worker"):
            try:
                raise OSError("stream closed")
            except OSError as inner:
                closed = CommClosedError("in <TCP>: Stream is closed")
                closed.__cause__ = inner
            heartbeat_failure(closed)
            assert not caplog.records
            heartbeat_failure(TimeoutError("the scheduler did not answer"))
            assert len(caplog.records) == 1
            try:  # a transfer between workers cut as the cluster closes: quiet too
                raise closed
            except CommClosedError:
                logger.exception("failed during get data with %s -> %s", "tcp://a", "tcp://b")
            assert len(caplog.records) == 1
            try:
                raise TimeoutError("the peer did not answer")
            except TimeoutError:
                logger.exception("failed during get data with %s -> %s", "tcp://a", "tcp://b")
            assert len(caplog.records) == 2
    finally:
        logger.filters[:] = before


def test_a_local_cluster_closing_under_a_progress_feed_prints_no_traceback(caplog):
    """A progress count the scheduler still runs when the local cluster closes (a fit that
    failed, or ended, within the count's interval) is cancelled by the close: distributed
    would log that as an error with a traceback after dfairpca's own last line."""
    import threading
    import time

    from distributed.diagnostics.progressbar import TextProgressBar

    with connect(local=True, n_workers=1, threads_per_worker=1, quiet=True) as client:
        # a count of a key the scheduler will never know: its feed waits until the close
        started = threading.Event()

        def follow():
            started.set()
            with contextlib.suppress(Exception):
                TextProgressBar(["never-submitted"], scheduler=client.scheduler.address)

        threading.Thread(target=follow, daemon=True).start()
        started.wait(10)

        deadline = time.monotonic() + 20
        while not client.run_on_scheduler(feeds) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert client.run_on_scheduler(feeds), "the feed never started"
    assert not [r for r in caplog.records
                if r.name == "distributed.scheduler" and r.levelno >= logging.ERROR], caplog.text
