import os
import signal
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import settings

sys.path.insert(0, str(Path(__file__).parent))

# examples per hypothesis property: "unit" (the default) keeps the unit run within a minute,
# HYPOTHESIS_PROFILE=thorough searches 100 each; no deadline: an example's time is the
# shared machine's load as much as the code's
settings.register_profile("unit", max_examples=15, deadline=None)
settings.register_profile("thorough", max_examples=100, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "unit"))


def pytest_configure(config):
    """The Ctrl-C tests are of a terminal's process, where Python handles SIGINT.  A suite
    started with SIGINT ignored (a script's ``command &``, without job control, as POSIX
    shells start background jobs) would run them, and every command they start, with
    Ctrl-C ignored (Python keeps an inherited SIG_IGN): handled again here, for the session
    and the processes it starts."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_collection_modifyitems(config, items):
    """Mark as ``integration`` every test under tests/integration/ (clusters of processes,
    command-line subprocesses, paper tables) and every test that starts the real cluster of
    ``client``, wherever it lives: the default run (pyproject's addopts) leaves them out,
    ``-m integration`` runs them alone.  A run of both (``-m ""``) starts with the unit
    tests, so that its progress shows from the first minute (tests/integration/ sorts
    first by name, and its tests take seconds each)."""
    folder = Path(__file__).parent / "integration"
    for item in items:
        if folder in Path(item.path).parents or "client" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.integration)
    items.sort(key=lambda item: item.get_closest_marker("integration") is not None)  # stable


@pytest.fixture(scope="module")
def client():
    """A real distributed cluster: a scheduler and two worker processes on loopback."""
    from distributed import Client, LocalCluster

    with LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
        dashboard_address=None, memory_limit="4GiB",
    ) as cluster, Client(cluster) as c:
        yield c


def _stop_after(segment: int, error: type[BaseException] = KeyboardInterrupt):
    """An ``on_segment`` callback that raises ``error`` once segment ``segment`` (counted
    from 0) is saved; the segments it saw are in its ``seen`` list."""
    def callback(i, n):
        callback.seen.append(i)
        if i == segment:
            raise error

    callback.seen = []
    return callback


@pytest.fixture(scope="session")
def stop_after():
    """``stop_after(segment, error=KeyboardInterrupt)``: a checkpointed pass's ``on_segment``
    callback that interrupts it (KeyboardInterrupt is what a Ctrl-C raises there)."""
    return _stop_after


def _two_groups(n: int, d: int, *, seed: int = 0, shift: float = 0.0, spread: bool = False):
    """``(X, z)``: ``n`` rows of ``d`` standard normal features (scaled 1 to 3 across the
    columns if ``spread``) and a 0/1 group label, group 1's rows moved by ``shift``."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d))
    if spread:
        X = X * np.linspace(1, 3, d)
    z = rng.integers(0, 2, n)
    X[z == 1] += shift
    return X, z


@pytest.fixture(scope="session")
def two_groups():
    """``two_groups(n, d, seed=0, shift=0.0, spread=False) -> (X, z)``: the small data of
    two groups most tests build (fresh arrays on each call, so a test may change them)."""
    return _two_groups


@pytest.fixture(scope="module")
def models():
    """``{"PCA", "FairPCA", "FairKernelPCA"}``, each fitted (2 components) on
    ``two_groups(300, 6, spread=True)``: the models the write-protocol tests save."""
    import dfairpca

    X, z = _two_groups(300, 6, spread=True)
    return {
        "PCA": dfairpca.PCA(2).fit(X),
        "FairPCA": dfairpca.FairPCA(2).fit(X, sensitive_features=z),
        "FairKernelPCA": dfairpca.FairKernelPCA(2).fit(X, sensitive_features=z),
    }
