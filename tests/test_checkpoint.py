"""Resumable pass: equality with one pass, resume after an interruption, fingerprints."""

import json

import dask.array as da
import numpy as np
import pytest
import zarr

import dfairpca
from dfairpca.engine.checkpoint import (
    CheckpointMismatch, PassInterrupted, chunk_digests, compute_moments_checkpointed,
    segment_bounds,
)
from dfairpca.engine._accumulator import RunningTotal, UpperPanels
from oracle import make_data, max_angle_deg

N, D, CHUNK = 2400, 24, 100


class Interrupt(Exception):
    pass


@pytest.fixture(scope="module")
def data():
    X, g = make_data(N, D, (2, 3), seed=5)
    codes = np.column_stack(g).astype(np.int32)
    return X, codes, [np.arange(2), np.arange(3)]


@pytest.fixture
def interrupt(stop_after):
    """``interrupt(X, codes, checkpoint, after=i, segment_rows=r, **kw)``: a checkpointed
    pass over X that is interrupted once its segment i is saved."""
    def run(X, codes, checkpoint, *, after: int, segment_rows: int, **kw):
        with pytest.raises(Interrupt):
            compute_moments_checkpointed(X, sensitive_features=codes, checkpoint=checkpoint,
                                         segment_rows=segment_rows,
                                         on_segment=stop_after(after, Interrupt), **kw)
    return run


def assert_same_moments(a, b):
    assert a.n == b.n
    np.testing.assert_allclose(a.mean, b.mean, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(a.scatter, b.scatter, rtol=1e-10, atol=1e-8)
    for p, q in zip(a.attributes, b.attributes):
        np.testing.assert_array_equal(p.counts, q.counts)
        np.testing.assert_allclose(p.deviation, q.deviation, rtol=1e-10, atol=1e-10)
    assert (a.n_nonfinite, a.nonfinite_rows) == (b.n_nonfinite, b.nonfinite_rows)


def test_checkpointed_pass_equals_one_pass(data, tmp_path):
    X, codes, cats = data
    Xd = da.from_array(X, chunks=(CHUNK, D))
    mask = np.arange(N) % 3 != 0
    calls = []
    m = compute_moments_checkpointed(
        Xd, sensitive_features=codes, checkpoint=tmp_path / "ckpt", segment_rows=500, mask=mask,
        split_every=3, on_segment=lambda i, n: calls.append((i, n)),
    )
    ref = dfairpca.compute_moments(Xd, sensitive_features=codes, mask=mask)
    assert_same_moments(m, ref)
    assert calls == [(i, 5) for i in range(5)]  # 2400 rows in segments of 5 chunks
    fair = dfairpca.FairPCA(5).fit_statistics(m)
    plain = dfairpca.FairPCA(5).fit(X[mask], sensitive_features=codes[mask])
    assert max_angle_deg(fair.components_.T, plain.components_.T) < 1e-6
    # one running total, not one file per segment
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == [".dfairpca", "progress.json", "total"]


def test_interrupted_pass_resumes_with_the_remaining_segments_only(data, tmp_path, interrupt):
    X, codes, cats = data
    Xd = da.from_array(X, chunks=(CHUNK, D))
    ckpt = tmp_path / "ckpt"
    interrupt(Xd, codes, ckpt, after=1, segment_rows=300)
    progress = json.loads((ckpt / "progress.json").read_text())
    assert progress["done"] == [0, 1] and len(progress["segments"]) == 8
    saved = RunningTotal.load(ckpt / "total")
    # the running total is kept and saved as a pass keeps it: upper-triangle panels
    assert saved.n == 600 and isinstance(saved.scatter, UpperPanels)
    with pytest.raises(ValueError, match="unfinished pass.*same compute_moments_checkpointed"):
        dfairpca.Moments.load(ckpt / "total")  # not complete statistics: refused, not misread

    computed = []
    m = compute_moments_checkpointed(Xd, sensitive_features=codes, checkpoint=ckpt,
                                     on_segment=lambda i, n: computed.append(i))
    assert computed == list(range(2, 8))
    assert_same_moments(m, dfairpca.compute_moments(Xd, sensitive_features=codes))
    # a finished checkpoint computes nothing more and returns the same statistics
    again = []
    m2 = compute_moments_checkpointed(Xd, sensitive_features=codes, checkpoint=ckpt,
                                      on_segment=lambda i, n: again.append(i))
    assert again == []
    assert_same_moments(m2, m)


def test_resume_of_fair_pca_s_statistics_and_of_a_full_matrix_total(data, tmp_path, interrupt):
    """Per-group scatters survive a resume; a total saved as full matrices (checkpoint
    version 1) resumes too."""
    X, codes, cats = data
    Xd = da.from_array(X, chunks=(CHUNK, D))
    ref = dfairpca.compute_moments(Xd, sensitive_features=codes, group_scatter=True)
    for full in (False, True):
        ckpt = tmp_path / f"ckpt{full}"
        interrupt(Xd, codes, ckpt, after=2, segment_rows=400, group_scatter=True)
        if full:
            total = RunningTotal.load(ckpt / "total")
            total.finalize().save(ckpt / "total", overwrite=True)  # as version 1 wrote it
            progress = json.loads((ckpt / "progress.json").read_text())  # (without a digest)
            progress["version"] = 3
            (ckpt / "progress.json").write_text(json.dumps(progress))
            assert dfairpca.Moments.load(ckpt / "total").n == 1200
        m = compute_moments_checkpointed(Xd, sensitive_features=codes, checkpoint=ckpt, group_scatter=True)
        assert isinstance(m.scatter, np.ndarray) and np.array_equal(m.scatter, m.scatter.T)
        assert_same_moments(m, ref)
        for a, b in zip(m.attributes, ref.attributes):
            np.testing.assert_allclose(a.scatter, b.scatter, rtol=1e-10, atol=1e-8)


def test_resume_uses_the_recorded_segments(data, tmp_path, interrupt):
    X, codes, cats = data
    Xd = da.from_array(X, chunks=(CHUNK, D))

    interrupt(Xd, codes, tmp_path / "c", after=0, segment_rows=1200)
    seen = []
    compute_moments_checkpointed(Xd, sensitive_features=codes, checkpoint=tmp_path / "c", segment_rows=100,
                                 on_segment=lambda i, n: seen.append((i, n)))
    assert seen == [(1, 2)]


def test_mismatching_fingerprint_is_refused_and_resume_false_starts_over(data, tmp_path):
    X, codes, cats = data
    Xd = da.from_array(X, chunks=(CHUNK, D))
    ckpt = tmp_path / "ckpt"
    compute_moments_checkpointed(Xd, sensitive_features=codes, checkpoint=ckpt, segment_rows=1200)
    other = codes.copy()
    other[0, 0] = 1 - other[0, 0]
    with pytest.raises(CheckpointMismatch) as info:
        compute_moments_checkpointed(Xd, sensitive_features=other, checkpoint=ckpt, dtype=np.float32)
    msg = str(info.value)
    assert "group codes differ" in msg and "compute_dtype float64" in msg
    assert str(ckpt) in msg and "resume=False" in msg
    with pytest.raises(CheckpointMismatch,
                       match=r"shape \[2400, 24\] in the checkpoint but \[1200, 24\]"):
        compute_moments_checkpointed(Xd[:1200], sensitive_features=codes[:1200], checkpoint=ckpt)
    m = compute_moments_checkpointed(Xd, sensitive_features=other, checkpoint=ckpt, resume=False)
    assert_same_moments(m, dfairpca.compute_moments(Xd, sensitive_features=other))


def test_fingerprint_names_the_zarr_store(tmp_path):
    X = np.arange(200 * 6, dtype=np.uint8).reshape(200, 6)
    for name in ("a.zarr", "b.zarr"):
        zarr.create_array(str(tmp_path / name), shape=X.shape, chunks=(20, 6), dtype="uint8")[:] = X
    ckpt = tmp_path / "ckpt"
    za = dfairpca.from_zarr(tmp_path / "a.zarr", rows_per_chunk=20)
    compute_moments_checkpointed(za, checkpoint=ckpt)
    progress = json.loads((ckpt / "progress.json").read_text())
    assert progress["fingerprint"]["stores"] == [f"file://{tmp_path / 'a.zarr'}"]
    zb = dfairpca.from_zarr(tmp_path / "b.zarr", rows_per_chunk=20)
    with pytest.raises(CheckpointMismatch, match="b.zarr"):
        compute_moments_checkpointed(zb, checkpoint=ckpt)


def test_nan_rows_are_reported_with_global_indices_across_a_resume(data, tmp_path, interrupt):
    X, codes, cats = data
    X = X.copy()
    bad = [7, 650, 1333, 2399]
    X[bad, 3] = np.nan
    Xd = da.from_array(X, chunks=(CHUNK, D))

    ckpt = tmp_path / "ckpt"
    interrupt(Xd, codes, ckpt, after=0, segment_rows=700)
    m = compute_moments_checkpointed(Xd, sensitive_features=codes, checkpoint=ckpt)
    assert m.n_nonfinite == 4 and m.nonfinite_rows == bad
    assert_same_moments(m, dfairpca.compute_moments(Xd, sensitive_features=codes))
    with pytest.raises(ValueError, match="rows 7, 650, 1333, 2399"):
        m.check_finite()


def test_segment_bounds_follow_chunks():
    assert segment_bounds((100,) * 5 + (30,), 250) == [(0, 300), (300, 530)]
    assert segment_bounds((100, 100), 1) == [(0, 100), (100, 200)]
    assert segment_bounds((100, 100), 10**9) == [(0, 200)]
    with pytest.raises(ValueError, match="positive"):
        segment_bounds((100,), 0)


def test_default_segments_are_few(data, tmp_path):
    X, codes, cats = data
    Xd = da.from_array(X, chunks=(20, D))  # 120 chunks, six times the 20 segments allowed
    seen = []
    compute_moments_checkpointed(Xd, sensitive_features=codes, checkpoint=tmp_path / "c",
                                 on_segment=lambda i, n: seen.append(n))
    assert 1 <= seen[0] <= 20 and len(seen) == seen[0]


def test_bad_inputs(data, tmp_path):
    X, codes, cats = data
    with pytest.raises(TypeError, match="Dask array"):
        compute_moments_checkpointed(X, sensitive_features=codes, checkpoint=tmp_path / "c")
    Xd = da.from_array(X, chunks=(CHUNK, D))
    with pytest.raises(ValueError, match="attribute 0 has 100 labels but X has 2400 rows"):
        compute_moments_checkpointed(Xd, sensitive_features=codes[:100], checkpoint=tmp_path / "c")
    with pytest.raises(ValueError, match="mask has 100 rows but X has 2400"):
        compute_moments_checkpointed(Xd, mask=np.ones(100, bool), checkpoint=tmp_path / "c")
    with pytest.raises(ValueError, match="sample_weight has 100 weights but X has 2400 rows"):
        compute_moments_checkpointed(Xd, sample_weight=np.ones(100), checkpoint=tmp_path / "c")
    with pytest.raises(ValueError, match="split_every must be at least 2; got 1"):
        compute_moments_checkpointed(Xd, split_every=1, checkpoint=tmp_path / "c")
    with pytest.raises(ValueError, match="positive"):
        compute_moments_checkpointed(Xd, sensitive_features=codes, checkpoint=tmp_path / "c", segment_rows=0)
    (tmp_path / "not_a_ckpt").mkdir()
    (tmp_path / "not_a_ckpt" / "x.txt").write_text("hello")
    with pytest.raises(FileExistsError, match="dfairpca did not write"):
        compute_moments_checkpointed(da.from_array(X, chunks=(CHUNK, D)), sensitive_features=codes,
                                     checkpoint=tmp_path / "not_a_ckpt")
    assert [p.name for p in (tmp_path / "not_a_ckpt").iterdir()] == ["x.txt"]


# ------------------------------------------------------------- bound to the data (issue 10.4)
def test_a_python_fit_removes_its_checkpoint_unless_asked_to_keep_it(tmp_path):
    """The reproduction of issue 10 item 4: a second fit of other data of the same shape
    with the same checkpoint= gets its own model, not the first one's."""
    X1, g = make_data(1500, 12, (2,), seed=1)
    X2, _ = make_data(1500, 12, (2,), seed=2)
    z = g[0]
    ck = tmp_path / "ck"
    a = dfairpca.FairPCA(3).fit(X1, sensitive_features=z, checkpoint=ck)
    assert not ck.exists()
    b = dfairpca.FairPCA(3).fit(X2, sensitive_features=z, checkpoint=ck)
    ref = dfairpca.FairPCA(3).fit(X2, sensitive_features=z)
    assert max_angle_deg(b.components_.T, ref.components_.T) < 1e-6
    assert max_angle_deg(a.components_.T, b.components_.T) > 1  # the two data sets differ
    kept = dfairpca.PCA(3).fit(X1, checkpoint=ck, keep_checkpoint=True)
    assert (ck / "progress.json").exists()
    again = dfairpca.PCA(3).fit(X1, checkpoint=ck, keep_checkpoint=True)  # resumes: all done
    np.testing.assert_array_equal(again.components_, kept.components_)


def test_a_kept_checkpoint_of_other_numpy_data_of_the_same_shape_is_refused(tmp_path):
    X1, g = make_data(1500, 12, (2,), seed=1)
    X2 = X1.copy()
    X2[1234, 5] += 1.0  # one value of one row: the shapes, dtypes and groups are all the same
    ck = tmp_path / "ck"
    dfairpca.FairPCA(3).fit(X1, sensitive_features=g[0], checkpoint=ck, keep_checkpoint=True)
    with pytest.raises(CheckpointMismatch) as info:
        dfairpca.FairPCA(3).fit(X2, sensitive_features=g[0], checkpoint=ck)
    msg = str(info.value)
    assert "\n" not in msg and str(ck) in msg and "rows 0-1499" in msg
    assert "different data" in msg and "--overwrite" in msg and "delete" in msg
    assert (ck / "progress.json").exists()  # refused: nothing was touched


def zarr_store(path, X, chunk):
    a = zarr.create_array(str(path), shape=X.shape, chunks=(chunk, X.shape[1]), dtype=X.dtype,
                          overwrite=True)
    a[:] = X
    return a


def test_a_zarr_store_rewritten_in_place_is_refused_for_the_finished_chunks_only(data, tmp_path,
                                                                                   interrupt):
    X, codes, cats = data
    path, ckpt = tmp_path / "x.zarr", tmp_path / "ckpt"
    zarr_store(path, X, CHUNK)
    Xz = dfairpca.from_zarr(path, rows_per_chunk=CHUNK)
    # segments of 3 chunks; 0 and 1 (rows 0-599) finished
    interrupt(Xz, codes, ckpt, after=1, segment_rows=300)
    # rewritten in place: same path, shape, dtype and chunks; one chunk not yet folded ...
    changed = X.copy()
    changed[700:800] = X[700:800][::-1]
    zarr.open_array(str(path), mode="r+")[700:800] = changed[700:800]
    m = compute_moments_checkpointed(Xz, sensitive_features=codes, checkpoint=ckpt)
    assert_same_moments(m, dfairpca.compute_moments(da.from_array(changed, chunks=(CHUNK, D)),
                                                    sensitive_features=codes))
    # ... then one of the folded ones: the finished checkpoint no longer matches
    changed[250:300] *= 2.0
    zarr.open_array(str(path), mode="r+")[200:300] = changed[200:300]
    with pytest.raises(CheckpointMismatch, match=r"rows 200-299 differ"):
        compute_moments_checkpointed(Xz, sensitive_features=codes, checkpoint=ckpt)
    m = compute_moments_checkpointed(Xz, sensitive_features=codes, checkpoint=ckpt, resume=False)
    assert_same_moments(m, dfairpca.compute_moments(da.from_array(changed, chunks=(CHUNK, D)),
                                                    sensitive_features=codes))


def test_every_folded_chunk_has_its_digest_in_the_checkpoint(data, tmp_path, interrupt):
    X, codes, cats = data
    ckpt = tmp_path / "ckpt"
    Xd = da.from_array(X, chunks=(CHUNK, D))
    interrupt(Xd, codes, ckpt, after=1, segment_rows=500)
    digests = json.loads((ckpt / "progress.json").read_text())["digests"]
    assert [len(d) if d else 0 for d in digests] == [5, 5, 0, 0, 0]
    assert digests[0][0] == chunk_digests(Xd[:CHUNK])[0]


def test_a_checkpoint_without_digests_is_refused(data, tmp_path, interrupt):
    """A checkpoint of an older dfairpca cannot show that the data is the same."""
    X, codes, cats = data
    ckpt = tmp_path / "ckpt"
    Xd = da.from_array(X, chunks=(CHUNK, D))
    interrupt(Xd, codes, ckpt, after=0, segment_rows=500)
    progress = json.loads((ckpt / "progress.json").read_text())
    del progress["digests"]
    (ckpt / "progress.json").write_text(json.dumps(progress))
    with pytest.raises(CheckpointMismatch, match="no content fingerprints.*start over"):
        compute_moments_checkpointed(Xd, sensitive_features=codes, checkpoint=ckpt)


def test_an_interrupt_says_how_many_chunks_are_saved(data, tmp_path, stop_after):
    X, codes, cats = data
    ckpt = tmp_path / "ckpt"
    Xd = da.from_array(X, chunks=(CHUNK, D))

    with pytest.raises(PassInterrupted) as info:
        compute_moments_checkpointed(Xd, sensitive_features=codes, checkpoint=ckpt, segment_rows=500,
                                     on_segment=stop_after(1))
    exc = info.value
    assert isinstance(exc, KeyboardInterrupt)
    assert (exc.chunks_done, exc.n_chunks, exc.checkpoint) == (10, 24, ckpt)
    assert str(exc) == (f"interrupted after 10 of 24 chunks; the checkpoint {str(ckpt)!r} "
                        "holds them: run the same call again to continue")


def test_an_edited_saved_total_is_refused_naming_the_checkpoint(data, tmp_path, interrupt):
    """The total carries a digest as the chunks do: an edit of it (here its scatter scaled
    by 1.3, which resumed silently into a 23% error) is refused with how to start over."""
    X, codes, cats = data
    ckpt = tmp_path / "ckpt"
    Xd = da.from_array(X, chunks=(CHUNK, D))
    interrupt(Xd, codes, ckpt, after=1, segment_rows=500)
    npz = ckpt / "total" / "arrays.npz"
    with np.load(npz, allow_pickle=False) as f:
        arrays = {k: f[k] for k in f.files}
    arrays["scatter_panels"] = arrays["scatter_panels"] * 1.3
    np.savez(npz, **arrays)
    with pytest.raises(CheckpointMismatch, match=rf"checkpoint '{ckpt}': its saved total \(total/\) does "
                                                 r"not match the digest.*to start over, delete that directory"):
        compute_moments_checkpointed(Xd, sensitive_features=codes, checkpoint=ckpt)
    # unedited, it resumes to the one-pass statistics
    interrupt(Xd, codes, tmp_path / "again", after=1, segment_rows=500)
    m = compute_moments_checkpointed(Xd, sensitive_features=codes, checkpoint=tmp_path / "again")
    assert_same_moments(m, dfairpca.compute_moments(X, sensitive_features=codes))


def test_auto_resumes_with_the_products_its_checkpoint_was_made_with(tmp_path, monkeypatch):
    """compute_dtype="auto" measures its kernel per process; a resumed fit (new workers,
    another load) may measure the other way, and resumes with what the checkpoint holds
    instead of refusing it."""
    rng = np.random.default_rng(0)
    X = rng.integers(0, 256, size=(600, 12)).astype(np.uint8)
    g = (np.arange(600) % 3 == 0).astype(np.int8)
    X[g == 1] = np.clip(X[g == 1].astype(int) + 20, 0, 255).astype(np.uint8)
    Xd = da.from_array(X, chunks=(100, 12))
    ckpt = tmp_path / "ckpt"
    monkeypatch.setenv("DFAIRPCA_AUTO_KERNEL", "exact")
    first = dfairpca.FairPCA(3).fit(Xd, sensitive_features=g, checkpoint=ckpt, keep_checkpoint=True)
    assert first.statistics_kernel_.startswith("exact")
    monkeypatch.setenv("DFAIRPCA_AUTO_KERNEL", "float32")
    again = dfairpca.FairPCA(3).fit(Xd, sensitive_features=g, checkpoint=ckpt, keep_checkpoint=True)
    assert again.statistics_kernel_.startswith("exact")
    np.testing.assert_array_equal(again.components_, first.components_)
    # without the checkpoint this process's measurement decides
    fresh = dfairpca.FairPCA(3).fit(Xd, sensitive_features=g)
    assert not fresh.statistics_kernel_.startswith("exact")
