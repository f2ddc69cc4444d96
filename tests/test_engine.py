"""The pass itself: chains of in-place folds, one per worker thread, reading their own chunks."""

import pickle

import dask
import dask.array as da
import numpy as np
import pytest
import zarr

import dfairpca
from dfairpca.engine._engine import _Block, _block_sources, coded_moments, compute_moments, run_moments_pass
from dfairpca.engine.checkpoint import compute_moments_checkpointed
from oracle import make_data


def _data(n=900, d=12, seed=3):
    X, g = make_data(n, d, (3,), seed=seed)
    return X + 20.0, g[0][:, None]


def _times(x, B):
    return x @ B


def _same(a, b, rtol=1e-10):
    assert a.n == b.n
    scale = np.abs(b.scatter).max()
    np.testing.assert_allclose(a.mean, b.mean, rtol=rtol, atol=rtol)
    np.testing.assert_allclose(a.scatter, b.scatter, rtol=rtol, atol=rtol * scale)
    for x, y in zip(a.attributes, b.attributes):
        np.testing.assert_array_equal(x.counts, y.counts)
        np.testing.assert_allclose(x.deviation, y.deviation, rtol=rtol, atol=rtol)


@pytest.mark.parametrize("n_chains", [1, 2, 3, 7, 50])
def test_any_number_of_chains_gives_the_statistics_of_the_whole(n_chains):
    X, codes = _data()
    whole = coded_moments(X, codes, [np.arange(3)])
    Xd = da.from_array(X, chunks=(64, -1))  # 15 chunks
    with dask.config.set(scheduler="threads"):
        part = coded_moments(Xd, codes, [np.arange(3)], n_chains=n_chains, split_every=2)
    # complete: a full symmetric float64 matrix, whatever the pass kept on its way
    assert isinstance(part.scatter, np.ndarray) and part.scatter.shape == (12, 12)
    np.testing.assert_array_equal(part.scatter, part.scatter.T)
    _same(part, whole)


def test_chunks_are_read_inside_the_fold_unless_they_share_work(tmp_path):
    X, codes = _data()
    z = zarr.open_group(str(tmp_path / "s.zarr"), mode="w")
    z.create_array("x", shape=X.shape, chunks=(100, 12), dtype="f8")[:] = X
    Xz = dfairpca.from_zarr(tmp_path / "s.zarr", "x", rows_per_chunk=200)
    blocks, shared = _block_sources(Xz)
    assert len(blocks) == 5 and all(isinstance(b, _Block) for b in blocks)
    assert not shared  # the Zarr array object is small: copied into every block
    np.testing.assert_array_equal(blocks[1].compute(), X[200:400])
    # a graph whose chunks share work (here a statistic of all of X) keeps its chunks as
    # dependencies: inlining would recompute the shared part once per chunk
    shared = Xz - Xz.mean(axis=0)
    assert not any(isinstance(b, _Block) for b in _block_sources(shared)[0])
    split = Xz.rechunk((150, 12))  # a rechunk that splits stored chunks also shares reads
    assert not any(isinstance(b, _Block) for b in _block_sources(split)[0])
    # large data used by every chunk (here a matrix, as Nyström's landmarks) is shared, not
    # copied into every task
    from dask import delayed

    big = np.random.default_rng(0).standard_normal((12, 30000))
    mapped = Xz.map_blocks(_times, delayed(big), dtype=float, chunks=(Xz.chunks[0], (30000,)))
    blocks, deps = _block_sources(mapped)
    assert all(isinstance(b, _Block) for b in blocks) and len(deps) == 1
    mapped = mapped[:, :300]
    assert all(len(pickle.dumps(b)) < big.nbytes / 4 for b in blocks)
    whole = coded_moments(X, codes, [np.arange(3)])
    _same(coded_moments(mapped, codes, [np.arange(3)], n_chains=2),
          coded_moments(X @ big[:, :300], codes, [np.arange(3)]), rtol=1e-9)
    for A in (Xz, split, shared + Xz.mean(axis=0)):
        _same(coded_moments(A, codes, [np.arange(3)], n_chains=2), whole, rtol=1e-9)


def test_running_sums_stay_on_their_workers(client, tmp_path):
    """The only d x d objects that travel are the chains' sums at the final merge (and the
    result): chunks are read and folded where their chain's sum lives."""
    X, codes = _data(2400, 30)
    z = zarr.open_group(str(tmp_path / "s.zarr"), mode="w")
    z.create_array("x", shape=X.shape, chunks=(100, 30), dtype="f8")[:] = X
    Xz = dfairpca.from_zarr(tmp_path / "s.zarr", "x", rows_per_chunk=100)  # 24 chunks
    client.run(lambda dask_worker: dask_worker.transfer_incoming_log.clear())
    m = coded_moments(Xz, codes, [np.arange(3)])
    _same(m, coded_moments(X, codes, [np.arange(3)]), rtol=1e-9)
    moved = client.run(lambda dask_worker: [str(k) for t in dask_worker.transfer_incoming_log
                                            for k in t["keys"]])
    moved = [k for keys in moved.values() for k in keys]
    assert sum("_fold" in k for k in moved) <= 1, moved  # 2 chains: one sum joins the other
    logs = client.run(lambda dask_worker: sum("_fold" in str(e) for e in dask_worker.state.log))
    assert all(c > 0 for c in logs.values()), logs  # both workers folded chunks


def _peak_bytes_of_pass(store, n):
    import tracemalloc

    X = dfairpca.from_zarr(store, "x", rows_per_chunk=2000)[:n]
    codes = (np.arange(n) % 3)[:, None]
    tracemalloc.start()
    try:
        with dask.config.set(scheduler="threads", num_workers=2):
            coded_moments(X, codes, [np.arange(3)], dtype=np.float32)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.integration  # a 61 MB store and three traced passes: a measurement
def test_memory_of_a_pass_does_not_grow_with_n(tmp_path):
    """Six times the rows, the same peak: two running sums and the chunks at hand, never
    chunks read ahead of their chain (the Zarr reads are inside the folds)."""
    n, d = 120_000, 512
    z = zarr.open_group(str(tmp_path / "s.zarr"), mode="w")
    arr = z.create_array("x", shape=(n, d), chunks=(2000, d), dtype="uint8")
    rng = np.random.default_rng(0)
    for s in range(0, n, 20_000):
        arr[s : s + 20_000] = rng.integers(0, 255, (20_000, d), dtype=np.uint8)
    _peak_bytes_of_pass(tmp_path / "s.zarr", 20_000)  # imports and caches of a first pass
    small = _peak_bytes_of_pass(tmp_path / "s.zarr", 20_000)  # 10 chunks of 1 MB, 5 a chain
    large = _peak_bytes_of_pass(tmp_path / "s.zarr", n)  # 60 chunks
    # measured: 16.8-21.0 MB (depending on how the two chains' temporaries overlap) and
    # 21.2-21.4 MB; with the reads as tasks of their own, which run ahead of the chains,
    # 22.1 and 40.7 MB.  Two chains' working sets (chunk, float32 block, Gram matrix, sum)
    # come to about 20 MB; 60 chunks read ahead would add up to 60 MB.
    assert large < 30e6 and large < small + 12e6, (small, large)


def test_column_chunks_are_merged_per_row_chunk():
    X, codes = _data(500, 12)
    Xd = da.from_array(X, chunks=(100, 5))  # 5 x 3 blocks
    blocks, _ = _block_sources(Xd.rechunk({1: -1}))
    assert len(blocks) == 5 and all(isinstance(b, _Block) for b in blocks)  # still read in the fold
    _same(coded_moments(Xd, codes, [np.arange(3)]), coded_moments(X, codes, [np.arange(3)]))
    with pytest.raises(ValueError, match="2-D"):
        compute_moments(da.zeros((10, 2, 2), chunks=5))


def test_labels_of_the_wrong_length_are_refused_before_any_work():
    """At the public boundary; below it (coded_moments, the estimators' route) the engine
    trusts the lengths the estimators checked."""
    X, codes = _data(300, 4)
    for A in (X, da.from_array(X, chunks=(100, 4))):
        with pytest.raises(ValueError, match="mask has 10 rows"):
            compute_moments(A, mask=np.ones(10, bool))
        with pytest.raises(ValueError, match="groups has 299 labels but X has 300 rows"):
            compute_moments(A, sensitive_features=codes[:299, 0])
        with pytest.raises(ValueError, match="split_every must be at least 2; got 1"):
            compute_moments(A, split_every=1)


def test_exact_statistics_the_pass_cannot_give_are_refused_at_the_public_boundary(tmp_path):
    """compute_moments and compute_moments_checkpointed take a dtype as given, and check it
    before any work (the estimators' dtype is checked where they decide it)."""
    X, _ = _data(300, 4)
    A = da.from_array(X, chunks=(100, 4))
    w = np.ones(300)
    for run in (dfairpca.compute_moments,
                lambda X, **kw: compute_moments_checkpointed(X, checkpoint=tmp_path / "c", **kw)):
        with pytest.raises(ValueError, match="sums integer data exactly; X is float64"):
            run(A, dtype="exact")
        with pytest.raises(ValueError, match="weighted rows are not integer sums"):
            run(A, dtype="exact", sample_weight=w)
        with pytest.raises(ValueError, match="rows of int32 exactly"):
            run(A.astype(np.int32), dtype="exact")
    assert not (tmp_path / "c").exists()
    with pytest.raises(TypeError, match="X must be a Dask array"):
        compute_moments_checkpointed(X, checkpoint=tmp_path / "c", dtype="exact")


def test_the_public_pass_takes_group_labels_of_any_type():
    """compute_moments(X, sensitive_features=...) encodes labels as the estimators do: the
    statistics are those of the integer codes, under the labels' own names."""
    X, codes = _data(600, 6)
    labels = np.array(["a", "b", "c"])[codes[:, 0]]
    for A in (X, da.from_array(X, chunks=(100, 6))):
        m = compute_moments(A, sensitive_features=labels)
        _same(m, coded_moments(X, codes, [np.arange(3)]))
        assert m.attributes[0].categories.tolist() == ["a", "b", "c"]
    with pytest.raises(TypeError):  # the encoded form is the engine's own business
        compute_moments(X, codes, [np.arange(3)])


@pytest.mark.parametrize("bad", [0, -1.5, True, "5", float("nan")])
def test_timeout_is_none_or_seconds_above_zero(bad, two_groups):
    X, z = two_groups(200, 5)
    for fit in (lambda: dfairpca.PCA(2).fit(X, timeout=bad),
                lambda: dfairpca.FairPCA(2).fit(X, sensitive_features=z, timeout=bad),
                lambda: dfairpca.FairKernelPCA(2).fit(X, sensitive_features=z, timeout=bad),
                lambda: compute_moments(X, timeout=bad)):
        with pytest.raises(ValueError, match=r"timeout must be None .*a number > 0; got"):
            fit()


def test_a_timeout_without_a_client_changes_nothing(two_groups):
    X, z = two_groups(300, 6)
    Xd = da.from_array(X, chunks=(50, -1))
    plain = dfairpca.FairPCA(3).fit(Xd, sensitive_features=z)
    timed = dfairpca.FairPCA(3).fit(Xd, sensitive_features=z, timeout=0.5)
    np.testing.assert_allclose(timed.components_, plain.components_)


def test_a_pass_working_set_counts_the_read_chunk_twice_or_the_fold_whichever_is_more():
    """The largest row chunk, held twice while it is read; else the chunk, its float32
    block (at most PRODUCT_BLOCK_BYTES) and the chain's sums while it is folded."""
    from dfairpca.base._system import PRODUCT_BLOCK_BYTES
    from dfairpca.engine._memory import working_set

    ws = working_set((24000, 6000), 6400, 1, 2 << 20)  # uint8 faces, thin sums
    assert (ws.rows, ws.chunk, ws.block) == (24000, 24000 * 6400, PRODUCT_BLOCK_BYTES)
    assert ws.total == 2 * 24000 * 6400  # the read is the peak
    exact = working_set((100,), 5000, 4, 12 * 5000**2)
    assert exact.total == 100 * 5000 * 4 * 2 + 12 * 5000**2  # the fold is
    assert "a row chunk of 100 x 5,000, 2 MiB as read" in exact.describe()
    assert working_set((), 10, 8, 0).total == 0


def test_only_workers_all_paused_since_a_moment_count_and_a_resume_starts_over():
    """The count of every worker paused starts when the last one pauses, goes on while they
    all stay paused, and ends when one runs again (a pause then a resume is no error)."""
    from dfairpca.engine._compute import _all_paused

    paused, running = {"status": "paused"}, {"status": "running"}
    assert _all_paused({"a": paused, "b": running}, None, 1.0) is None
    assert _all_paused({"a": paused, "b": paused}, None, 2.0) == 2.0
    assert _all_paused({"a": paused, "b": paused}, 2.0, 9.0) == 2.0
    assert _all_paused({"a": paused, "b": running}, 2.0, 9.5) is None
    # a paused worker still finishing a task it began is progress, not a stuck pass
    busy = {"status": "paused", "metrics": {"task_counts": {"executing": 1, "memory": 3}}}
    assert _all_paused({"a": paused, "b": busy}, 2.0, 9.0) is None
    idle = {"status": "paused", "metrics": {"task_counts": {"memory": 3}}}
    assert _all_paused({"a": paused, "b": idle}, 2.0, 9.0) == 2.0


def test_workers_paused_says_the_workers_the_working_set_and_what_the_checkpoint_holds():
    from dfairpca.cluster import WorkersPaused
    from dfairpca.engine._memory import working_set

    ws = working_set((24000,), 6400, 1, 2 << 20)
    exc = WorkersPaused(20, "tcp://s:8786", [("tcp://a:1", 330_000_000), ("tcp://b:2", 0)], ws)
    text = str(exc)
    assert text.startswith("every Dask worker of the scheduler at tcp://s:8786 has been paused "
                           "for memory for 20 s"), text
    assert "tcp://a:1 (memory limit 315 MiB), tcp://b:2 (no memory limit)" in text
    assert "the pass needs about 293 MiB per thread" in text and "then run again" in text
    saved = exc.saved("/x/m.checkpoint", "16 of 60 chunks")
    assert isinstance(saved, WorkersPaused) and saved.workers == exc.workers
    assert "the checkpoint '/x/m.checkpoint' holds 16 of 60 chunks: give each worker more memory" in str(saved)
    assert "(smaller row chunks start over)" in str(saved)


@pytest.mark.parametrize("dtype", ["float32", "exact"])
def test_x_in_memory_without_rows_gives_the_sums_of_no_rows_with_its_groups(dtype):
    X = np.zeros((0, 3), np.uint8)
    cats = [np.array(["a", "b"])]
    total = run_moments_pass(X, np.zeros((0, 1), np.int64), cats, dtype=dtype)
    m = total.finalize()
    assert m.n == 0 and m.mean.shape == (3,) and not m.mean.any()
    assert [list(a.categories) for a in m.attributes] == [["a", "b"]]
    assert m.attributes[0].counts.tolist() == [0, 0]
    # a Dask X of the same rows agrees (its one chunk folded by a task)
    dm = coded_moments(da.from_array(X, chunks=(1, 3)), np.zeros((0, 1), np.int64), cats, dtype=dtype)
    assert dm.n == 0 and dm.attributes[0].counts.tolist() == [0, 0]
