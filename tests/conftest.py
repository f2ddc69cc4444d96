import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture(scope="module")
def client():
    """A real distributed cluster: a scheduler and two worker processes on loopback."""
    from distributed import Client, LocalCluster

    with LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
        dashboard_address=None, memory_limit="4GiB",
    ) as cluster, Client(cluster) as c:
        yield c
