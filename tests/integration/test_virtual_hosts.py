"""A cluster of separate virtual hosts: the Dask scheduler, two workers and an S3-compatible
server (moto's standalone server) each in its own network namespace with its own address on
a private bridge, the workers also in their own mount namespace, where the client's files
(this test run's temporary folders) are an empty tmpfs.  What a real cluster is: the data
reaches the workers only from the object store, the statistics reach the client only over
the network, and a host can drop off it.

The namespaces need root (CI runs as root) and iproute2 (tests/netns.py says what is
missing).  Where they cannot be made the tests of this module are not defined at all,
rather than skipped: a skipped test would read as one that passed.  What they check needs
separate hosts; on loopback, tests/integration/test_remote.py and test_cluster.py check
the rest.  Every name made carries this process's id; the bridge, namespaces and
processes are removed at the end, whatever ends the module (tests/netns.py).
"""

import os
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import zarr

import dfairpca
from dfairpca.cluster import connect
from netns import Network, why_not
from oracle import make_data, max_angle_deg
from processes import DaskProcesses, can_unshare, private_folder

WHY_NOT = why_not() or can_unshare()

N, H, W, CHUNK = 36_000, 8, 8, 500  # 72 chunks, 2.3 MB of uint8 pixels
#: the timeout of the fits; the cut worker is dropped by the scheduler long before it
TIMEOUT = 30
#: Dask configuration of the scheduler and workers: a host whose link is down is given up
#: within seconds (distributed's defaults wait 30 s for a TCP connection, 5 min for a
#: heartbeat)
FAST_FAILURE = {"DASK_DISTRIBUTED__COMM__TIMEOUTS__TCP": "11s",
                "DASK_DISTRIBUTED__COMM__TIMEOUTS__CONNECT": "5s",
                "DASK_DISTRIBUTED__SCHEDULER__WORKER_TTL": "4s"}


def _without_aws(env):
    """``env`` without AWS credentials or configuration (None: a variable removed): what
    reaches the server travels in the graph."""
    env = {**env, **{k: None for k in env if k.startswith("AWS_")}}
    env.update(AWS_EC2_METADATA_DISABLED="true", AWS_CONFIG_FILE="/nonexistent",
               AWS_SHARED_CREDENTIALS_FILE="/nonexistent")
    return env


if WHY_NOT is None:  # defined only where it can run (see the module docstring)

    @pytest.fixture(scope="module")
    def hosts(tmp_path_factory):
        """(network, Dask processes, storage options, URL, labels, local fit): the data on
        the S3 host, the workers unable to see this run's temporary folders."""
        import subprocess
        import sys

        import s3fs

        from processes import stop

        hidden = tmp_path_factory.getbasetemp()  # every folder of this run's tests
        folder = tmp_path_factory.mktemp("virtual-hosts")
        X, g = make_data(N, H * W, (2, 3), seed=5)
        pixels = np.clip(X * 8 + 128, 0, 255).astype(np.uint8)
        labels = np.column_stack(g)
        local = dfairpca.FairPCA(6, compute_dtype="float64").fit(pixels, sensitive_features=labels)
        store = folder / "faces.zarr"
        images = zarr.open_group(str(store), mode="w").create_array(
            "images", shape=(N, H, W), chunks=(CHUNK, H, W), dtype="uint8")
        images[:] = pixels.reshape(N, H, W)

        with Network(["scheduler", "w0", "w1", "s3"]) as net:
            server = None
            try:
                endpoint = f"http://{net.addresses['s3']}:5000"
                with open(folder / "server.log", "w") as log:
                    server = subprocess.Popen(
                        [*net.prefix("s3"), sys.executable, "-m", "moto.server", "-H",
                         net.addresses["s3"], "-p", "5000"],
                        stdout=log, stderr=subprocess.STDOUT,
                        env={k: v for k, v in _without_aws(dict(os.environ)).items() if v is not None})
                options = {"key": "testing", "secret": "testing", "endpoint_url": endpoint}
                fs = s3fs.S3FileSystem(**options, skip_instance_cache=True)
                deadline = time.monotonic() + 60
                while True:
                    try:
                        fs.mkdir("data")
                        break
                    except Exception:  # noqa: BLE001 - not up yet
                        assert time.monotonic() < deadline and server.poll() is None, \
                            (folder / "server.log").read_text()
                        time.sleep(0.2)
                fs.put(str(store), "data/faces.zarr", recursive=True)
                procs = DaskProcesses(
                    folder, host=net.addresses["scheduler"],
                    worker_hosts=[net.addresses["w0"], net.addresses["w1"]],
                    scheduler_prefix=net.prefix("scheduler"),
                    prefixes=[net.prefix(w) + private_folder(hidden) for w in ("w0", "w1")],
                    env={**_without_aws(dict(os.environ)), **FAST_FAILURE}, by_address=True)
                with procs:
                    yield net, procs, options, "s3://data/faces.zarr", labels, local
            finally:
                if server is not None:
                    stop([server])
        assert net.leftovers() == []

    def _fit(options, url, labels, **kwargs):
        Xz = dfairpca.from_zarr(url, "images", rows_per_chunk=CHUNK, storage_options=options)
        return dfairpca.FairPCA(6, compute_dtype="float64", split_every=3).fit(
            Xz, sensitive_features=labels, timeout=TIMEOUT, **kwargs)

    def test_a_fit_from_s3_on_separate_hosts_equals_the_local_fit(hosts):
        net, procs, options, url, labels, local = hosts
        with connect(scheduler_file=procs.scheduler_file, timeout=30, quiet=True) as client:
            client.wait_for_workers(2, timeout=60)
            workers = client.scheduler_info()["workers"].values()
            assert sorted(w["host"] for w in workers) == sorted([net.addresses["w0"], net.addresses["w1"]])
            # the workers do not see this run's files (the local copy of the data, the
            # scheduler file), nor hold any credentials
            files = [str(procs.scheduler_file), str(procs.dir / "faces.zarr" / "zarr.json")]
            assert all(os.path.exists(f) for f in files)
            assert set(client.run(lambda: any(map(os.path.exists, files))).values()) == {False}
            assert set(client.run(lambda: os.environ.get("AWS_ACCESS_KEY_ID")).values()) == {None}
            received = net.received_bytes()
            start = time.monotonic()
            remote = _fit(options, url, labels)
            took = time.monotonic() - start
            received = net.received_bytes() - received
            moved = client.run(lambda dask_worker: sum(
                t["total"] for t in dask_worker.transfer_incoming_log))
            read = client.run(lambda dask_worker: sum(
                "_fold" in str(entry) for entry in dask_worker.state.log))
        assert max_angle_deg(remote.components_.T, local.components_.T) < 1e-6
        # the pixels went from the S3 host to the workers; this host got the statistics
        assert received < 0.1 * N * H * W, (received, took)
        assert all(count > 0 for count in read.values()), read  # both workers read chunks
        assert sum(moved.values()) > 0  # partial sums crossed the bridge between the workers

    def test_a_worker_whose_link_is_cut_mid_pass_does_not_change_the_fit(hosts):
        """The link goes down without a word (no connection closed): the scheduler drops
        the silent worker after its heartbeat timeout and the other one does its share."""
        net, procs, options, url, labels, local = hosts

        def slow_copy(block):  # local: sent by value (importing this module runs `ip`)
            time.sleep(0.05)
            return block

        Xz = dfairpca.from_zarr(url, "images", rows_per_chunk=CHUNK, storage_options=options)
        slow = Xz.map_blocks(slow_copy, dtype=Xz.dtype)  # 72 chunks of 0.05 s at least
        with connect(scheduler_file=procs.scheduler_file, timeout=30, quiet=True) as client:
            client.wait_for_workers(2, timeout=60)
            hosts_of = {a: w["host"] for a, w in client.scheduler_info()["workers"].items()}
            (victim,) = [a for a, h in hosts_of.items() if h == net.addresses["w0"]]
            executed = client.run(lambda dask_worker: dask_worker.state.executed_count,
                                  workers=[victim])[victim]
            est = dfairpca.FairPCA(6, compute_dtype="float64", split_every=3)
            with ThreadPoolExecutor(1) as pool:
                start = time.monotonic()
                fit = pool.submit(est.fit, slow, sensitive_features=labels, timeout=TIMEOUT)
                while client.run(lambda dask_worker: dask_worker.state.executed_count,
                                 workers=[victim])[victim] < executed + 3:
                    assert time.monotonic() - start < 60 and not fit.done(), procs.logs()
                    time.sleep(0.02)
                net.cut("w0")
                cut = time.monotonic()
                assert not fit.done()  # the pass is still running when the link goes down
                remote = fit.result(timeout=TIMEOUT + 60)
                took = time.monotonic() - cut
            assert list(client.scheduler_info()["workers"]) == [a for a in hosts_of if a != victim]
        # the cut-off host cannot close in order (its goodbye to the scheduler never
        # arrives): it is killed, as the fixture's stop would after 10 s
        procs.workers[0].kill()
        procs.workers[0].wait()
        assert max_angle_deg(remote.components_.T, local.components_.T) < 1e-6
        assert took < TIMEOUT, took
