"""A worker that does not share the client's files, as on a real remote cluster.

One of the two workers runs in its own mount namespace with an empty tmpfs over
``private/``: there it sees nothing of what the client writes, just as a worker on another
machine sees nothing of the client's local disk; ``shared/`` both see.  Every command that
hands a local path to the workers must say, in one line, which worker cannot see it and
what to do, and never call a store written (or data read) that is not there.
"""

import numpy as np
import pytest
import zarr

import dfairpca
from dfairpca.cli import main
from dfairpca.cluster import NotShared, connect
from processes import DaskProcesses, can_unshare, private_folder

WHY_NOT = can_unshare()
pytestmark = pytest.mark.skipif(WHY_NOT is not None, reason=str(WHY_NOT))

N, D = 2000, 12


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """(scheduler file, shared folder, private folder, address of the worker that does not
    see the private folder, address of the one that does)."""
    root = tmp_path_factory.mktemp("unshared")
    shared, private = root / "shared", root / "private"
    shared.mkdir()
    private.mkdir()
    with DaskProcesses(root, prefixes=[[], private_folder(private)]) as procs:
        with connect(scheduler_file=procs.scheduler_file, timeout=60, quiet=True) as client:
            client.wait_for_workers(2, timeout=60)
            (private / "here").touch()
            sees = client.run(lambda: (private / "here").exists())
            (private / "here").unlink()
        blind = [a for a, seen in sees.items() if not seen]
        assert len(blind) == 1, (sees, procs.logs())
        yield procs.scheduler_file, shared, private, blind[0], [a for a in sees if a != blind[0]][0]


def write_data(path):
    """A Zarr group with X (N, D) of 4 chunks and a 0/1 group label per row."""
    rng = np.random.default_rng(3)
    g = zarr.open_group(str(path), mode="w")
    g.create_array("X", shape=(N, D), chunks=(N // 4, D), dtype="float32")[:] = rng.normal(size=(N, D))
    g.create_array("z", shape=(N,), chunks=(N,), dtype="int8")[:] = rng.integers(0, 2, N)
    return path


def run(args, capsys):
    code = main([str(a) for a in args])
    out = capsys.readouterr()
    return code, out.out, out.err


def assert_names_the_blind_worker(err, command, cluster, what):
    """One line: the command's error, what cannot be seen, the blind worker only, the fixes."""
    _, _, _, blind, sighted = cluster
    assert err.startswith(f"dfairpca {command}: error: ") and err.count("\n") == 1, err
    assert "1 of the 2 Dask workers" in err and blind in err and sighted not in err, err
    assert what in err and "mounts at the same path" in err and "no --scheduler" in err, err
    assert "missing chunk" not in err and "--missing-chunks" not in err, err


@pytest.mark.parametrize("missing", ["error", "fill"])
def test_fit_of_a_store_a_worker_cannot_see_names_it_and_writes_nothing(cluster, capsys, missing):
    sched, _, private, _, _ = cluster
    data = write_data(private / f"fit-{missing}.zarr")
    model = private / f"model-{missing}"
    code, out, err = run(["fit", data, "--array", "X", "--method", "pca", "-k", "3", "--out", model,
                          "--missing-chunks", missing, "--scheduler-file", sched], capsys)
    assert code == 2, out + err
    assert_names_the_blind_worker(err, "fit", cluster, f"cannot read the Zarr array '{data}/X'")
    assert "variance kept" not in out and not model.exists()


@pytest.mark.parametrize("missing", ["error", "fill"])
def test_a_worker_never_reads_a_store_it_cannot_see_as_fill_values(cluster, missing):
    """Past the check (a library user's own compute), the worker's read says so itself."""
    sched, _, private, blind, _ = cluster
    X = dfairpca.from_zarr(write_data(private / f"read-{missing}.zarr"), "X", missing_chunks=missing)
    with connect(scheduler_file=sched, quiet=True) as client:
        with pytest.raises(NotShared, match=f"does not exist on the Dask worker {blind}") as info:
            client.compute(X.sum(), workers=[blind]).result()
    assert "\n" not in str(info.value) and "mounts at the same path" in str(info.value)
