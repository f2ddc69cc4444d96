"""A worker that does not share the client's files, as on a real remote cluster.

One of the two workers runs in its own mount namespace with an empty tmpfs over
``private/``: there it sees nothing of what the client writes, just as a worker on another
machine sees nothing of the client's local disk; ``shared/`` both see.  Every command that
hands a local path to the workers must say, in one line, which worker cannot see it and
what to do, and never call a store written (or data read) that is not there.
"""

import json

import dask
import numpy as np
import pytest
import zarr

import dfairpca
from dfairpca.celeba import synth_celeba, write_celeba_jpegs
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
    assert code == 1, out + err
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


def test_transform_to_a_folder_a_worker_cannot_see_names_it_and_writes_nothing(cluster, capsys):
    sched, shared, private, _, _ = cluster
    data, model = write_data(shared / "t.zarr"), shared / "t-model"
    assert run(["fit", data, "--array", "X", "--method", "pca", "-k", "3", "--out", model,
                "--scheduler-file", sched], capsys)[0] == 0
    out = private / "rep.zarr"
    code, stdout, err = run(["transform", model, data, "--array", "X", "--out", out,
                             "--scheduler-file", sched], capsys)
    assert code == 1, stdout + err
    assert_names_the_blind_worker(err, "transform", cluster, f"cannot write the output store '{out}'")
    assert "wrote" not in stdout and not out.exists()
    assert not [p.name for p in private.iterdir() if "rep.zarr" in p.name]  # nor its temporary


def test_a_store_the_workers_wrote_out_of_sight_is_never_called_written(cluster, capsys, monkeypatch):
    """Past the check (a worker that joins after it): the client confirms every chunk."""
    sched, shared, private, blind, _ = cluster
    data, model = write_data(shared / "w.zarr"), shared / "w-model"
    assert run(["fit", data, "--array", "X", "--method", "pca", "-k", "3", "--out", model,
                "--scheduler-file", sched], capsys)[0] == 0
    monkeypatch.setattr(dfairpca.cluster, "check_workers_see", lambda *a, **k: None)
    out = private / "late.zarr"
    with dask.annotate(workers=[blind], allow_other_workers=False):  # its chunks, out of sight
        code, stdout, err = run(["transform", model, data, "--array", "X", "--out", out,
                                 "--scheduler-file", sched], capsys)
    assert code == 1 and "wrote" not in stdout and not out.exists(), stdout + err
    assert err.startswith(f"dfairpca transform: error: '{out}' is not written: "), err
    assert "chunks" in err and "mounts at the same path" in err and err.count("\n") == 1, err
    out = private / "late-synth.zarr"
    with connect(scheduler_file=sched, quiet=True) as client:
        # a worker without the partial store fails its tasks, by name ...
        with pytest.raises(NotShared, match=f"does not exist on the Dask worker {blind}"):
            synth_celeba(out, n=96, size=8, chunk_rows=8, progress=False, client=client)
        # ... and one whose own disk holds a copy of it (an earlier run's) writes its chunks there
        monkeypatch.setattr(dfairpca.cluster, "check_workers_see",
                            lambda client, done, *a, **k: copy_to(client, blind, done.parent))
        with pytest.raises(NotShared, match=f"'{out}' is not written: "):
            synth_celeba(out, n=96, size=8, chunk_rows=8, progress=False, client=client, overwrite=True)
    assert not out.exists()


def copy_to(client, worker, folder):
    """Copy the client's ``folder`` to the same path on ``worker``'s own disk."""
    files = {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}

    def write(files=files, folder=str(folder)):
        import pathlib

        for name, content in files.items():
            path = pathlib.Path(folder, name)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(content)

    client.run(write, workers=[worker])


def test_synth_and_ingest_on_workers_that_cannot_see_the_folder_name_them(cluster, capsys):
    sched, shared, private, blind, sighted = cluster
    with connect(scheduler_file=sched, quiet=True) as client, pytest.raises(NotShared) as info:
        synth_celeba(private / "s.zarr", n=64, size=8, chunk_rows=16, progress=False, client=client)
    message = str(info.value)
    assert "cannot write the store" in message and blind in message and sighted not in message
    assert not (private / "s.zarr").exists()
    celeba = write_celeba_jpegs(shared / "celeba", 24, seed=1, n_jobs=1)
    out = private / "c.zarr"
    code, _, err = run(["ingest-celeba", celeba, out, "--size", "8", "--scheduler-file", sched], capsys)
    assert code == 1 and not out.exists()
    assert_names_the_blind_worker(err, "ingest-celeba", cluster, f"cannot write the store '{out}'")
    hidden = write_celeba_jpegs(private / "celeba", 24, seed=1, n_jobs=1)
    code, _, err = run(["ingest-celeba", hidden, shared / "c.zarr", "--size", "8",
                        "--scheduler-file", sched], capsys)
    assert code == 1 and not (shared / "c.zarr").exists()
    assert_names_the_blind_worker(err, "ingest-celeba", cluster, f"cannot read the CelebA folder '{hidden}'")


def test_a_checkpoint_and_model_on_a_path_only_the_client_sees(cluster, capsys):
    """Checkpoints and models are written by the client: the workers need not see them."""
    sched, shared, private, _, _ = cluster
    data = write_data(shared / "c.zarr")
    model, ckpt = private / "c-model", private / "c.checkpoint"
    fit = ["fit", data, "--array", "X", "--sensitive-array", "z", "-k", "3", "--out", model,
           "--checkpoint", ckpt, "--rows-per-chunk", str(N // 4), "--json", "--scheduler-file", sched]
    code, out, err = run(fit, capsys)
    assert code == 0, err
    assert json.loads(out)["n_samples_seen"] == N and model.is_dir() and not ckpt.exists()
    X = dfairpca.from_zarr(data, "X", rows_per_chunk=N // 4)
    z = zarr.open_array(str(data / "z"))[:]
    with connect(scheduler_file=sched, quiet=True):
        first = dfairpca.FairPCA(3).fit(X, sensitive_features=z, checkpoint=ckpt, keep_checkpoint=True)
        assert dfairpca.io.read_marker(ckpt)["kind"] == "checkpoint"
        again = dfairpca.FairPCA(3).fit(X, sensitive_features=z, checkpoint=ckpt)  # resumed: all done
    np.testing.assert_allclose(again.components_, first.components_, atol=1e-12)
    np.testing.assert_allclose(first.components_, dfairpca.load(model).components_, atol=1e-6)
