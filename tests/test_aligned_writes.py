"""Writing a Dask array into a Zarr array at any size: chunks chosen for the output, blocks
of whole chunks only (never two tasks on one chunk), and the check of what was written by
content (dfairpca.io._aligned)."""

import warnings

import dask
import dask.array as da
import numpy as np
import pytest
import zarr
from hypothesis import given, settings
from hypothesis import strategies as st

from dfairpca.io import (OUTPUT_CHUNK_BYTES, WrongRowsError, aligned_to, check_rows, output_chunks,
                         sample_rows, store_aligned, writing_every_chunk)


def test_output_chunks_keep_the_input_row_chunks_up_to_the_limit_and_cut_evenly_beyond():
    assert output_chunks((20_000, 80, 80), np.float32, 2048) == (2048, 80, 80)
    # 40,000 rows of 6,400 float32 would be 1 GB: cut in two even pieces of 20,000
    assert output_chunks((200_000, 6400), np.float32, 40_000, limit=512 * 2**20) == (20_000, 6400)
    rows = output_chunks((200_000, 6400), np.float32, 40_000)[0]
    assert rows * 6400 * 4 <= OUTPUT_CHUNK_BYTES
    assert output_chunks((10, 3), np.float64, None) == (10, 3)  # no row chunk: all rows
    assert output_chunks((5, 3), np.float64, 100) == (5, 3)  # never more rows than there are
    assert output_chunks((3, 10**9), np.float64, 2, limit=1) == (1, 10**9)  # at least one row


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 40), min_size=1, max_size=8), st.integers(1, 30))
def test_aligned_blocks_cover_whole_chunks(blocks, c):
    Y = da.zeros((sum(blocks), 3), chunks=(tuple(blocks), (2, 1)), dtype=np.float32)
    A = aligned_to(Y, (c, 3))
    ends = np.cumsum(A.chunks[0])[:-1]
    assert not np.any(ends % c) and A.chunks[1] == (3,) and A.shape == Y.shape


def test_aligned_keeps_blocks_that_already_cover_whole_chunks():
    Y = da.ones((100, 4), chunks=((30, 30, 30, 10), (4,)))
    assert aligned_to(Y, (10, 4)) is Y


def test_store_refuses_blocks_that_cut_a_chunk(tmp_path):
    arr = zarr.create_array(str(tmp_path / "a.zarr"), shape=(100, 4), chunks=(10, 4), dtype="f8")
    with pytest.raises(ValueError, match="cuts a Zarr chunk"):
        store_aligned(da.ones((100, 4), chunks=(15, 4)), arr)


def test_irregular_blocks_written_whole_at_the_users_scale(tmp_path):
    """Float32 chunks of 150 MB (over Dask's 128 MiB chunk-size) and Dask blocks that
    straddle them irregularly, on the threaded scheduler with four threads: every row right
    and no warning of data loss (to_zarr into this array would rechunk and lose rows)."""
    n, h, w = 12_000, 112, 112
    rows = output_chunks((n, h, w), np.float32, 3000)
    assert rows == (3000, h, w) and rows[0] * h * w * 4 > 128 * 2**20
    big = (40_000, 64, 52)  # 530 MB of float32 per 40,000-row chunk, over the limit: cut
    assert output_chunks(big, np.float32, 40_000)[0] * 64 * 52 * 4 <= OUTPUT_CHUNK_BYTES
    chunks = (2500, 4100, 700, 3300, 1400)  # none a multiple of 3,000
    Y = da.arange(n * h * w, dtype=np.float32, chunks=n * h * w).reshape(n, h, w).rechunk(
        (chunks, h, w))
    with writing_every_chunk():
        arr = zarr.create_array(str(tmp_path / "y.zarr"), shape=Y.shape, chunks=rows, dtype="f4")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with dask.config.set(scheduler="threads", num_workers=4):
            dask.compute(store_aligned(aligned_to(Y, rows), arr))
    np.testing.assert_array_equal(arr[:], Y.compute())


def test_sample_rows_holds_the_first_and_last_row_of_every_chunk():
    r = sample_rows(10_001, 1000)
    for start in range(0, 10_001, 1000):
        assert start in r and min(start + 999, 10_000) in r
    assert np.all(np.diff(r) > 0) and r.dtype == np.int64
    assert len(sample_rows(0, 10)) == 0


def test_check_rows_names_rows_that_differ_and_passes_rounding():
    rng = np.random.default_rng(0)
    e = rng.normal(size=(6, 50)).astype(np.float32) * 255
    rows = np.arange(6) * 100
    check_rows(e * (1 + 1e-6), e, rows, "out.zarr")  # rounding of another summation order
    shifted = e.copy()
    shifted[4] = np.roll(shifted[4], 1)
    with pytest.raises(WrongRowsError, match=r"1 of the 6 rows .*rows 400\)"):
        check_rows(shifted, e, rows, "out.zarr")
    zeroed = e.copy()
    zeroed[0] = 0
    with pytest.raises(WrongRowsError, match="rows 0"):
        check_rows(zeroed, e, rows, "out.zarr")
    nan = e.copy()
    nan[1, 3] = np.nan
    with pytest.raises(WrongRowsError):
        check_rows(nan, e, rows, "out.zarr")
    u = rng.integers(0, 255, size=(6, 50)).astype(np.uint8)
    check_rows(u, np.clip(u.astype(int) + 1, 0, 255).astype(np.uint8), rows, "r.zarr")  # .5 rounding
    with pytest.raises(WrongRowsError):
        check_rows(u, (u.astype(int) // 2).astype(np.uint8), rows, "r.zarr")


def _faces_of(chunk, lo, hi, seed):
    """Rows lo:hi of ``chunk``: a face's pixels are 37 times its row number (mod 251) plus ``seed``."""
    rows = np.arange(chunk[1] + lo, chunk[1] + hi)
    return np.broadcast_to(((rows * 37 + seed) % 251).astype(np.uint8)[:, None, None], (len(rows), 4, 4)).copy()


def _writes_right(store, index, start, stop, seed):
    from dfairpca.celeba.pool import write_rows

    write_rows(store, start, stop, _faces_of((index, start, stop), 0, stop - start, seed))
    return stop - start


def _writes_a_row_off(store, index, start, stop, seed):
    """A writer with a bug: the last chunk's rows one off (a shifted image)."""
    from dfairpca.celeba.pool import write_rows

    shift = 1 if stop == 50 else 0
    write_rows(store, start, stop, _faces_of((index, start + shift, stop + shift), 0, stop - start, seed))
    return stop - start


@pytest.mark.parametrize("whole", [False, True])
def test_a_store_writer_that_writes_wrong_rows_is_caught_before_the_store_is_kept(tmp_path, whole):
    from dfairpca.celeba.pool import write_store

    def write(out, writer):
        return write_store(
            out, shape=(4, 4), chunks=[(i, s, min(s + 16, 50)) for i, s in enumerate(range(0, 50, 16))],
            chunk_rows=16, settings={"source": "test"}, labels={}, write_chunk=writer, args=(7,),
            n_jobs=1, client=None, progress=False, overwrite=False, protect=None, desc="test",
            check_part=_faces_of, check_whole_chunks=whole)

    good = write(tmp_path / "good.zarr", _writes_right)
    assert zarr.open_group(str(good))["images"][:].shape == (50, 4, 4)
    with pytest.raises(WrongRowsError, match="rows 48, 49|rows 32, 33"):
        write(tmp_path / "bad.zarr", _writes_a_row_off)
    assert not (tmp_path / "bad.zarr").exists()
    # the same call again (the bug fixed) writes every chunk anew, resuming none of the wrong ones
    fixed = write(tmp_path / "bad.zarr", _writes_right)
    np.testing.assert_array_equal(zarr.open_group(str(fixed))["images"][:],
                                  zarr.open_group(str(good))["images"][:])


def test_a_store_with_a_chunk_never_marked_written_is_not_moved_into_place(tmp_path, monkeypatch):
    from dfairpca.celeba import pool
    from dfairpca.errors import RunError

    mark = pool._mark_done
    monkeypatch.setattr(pool, "_mark_done", lambda store, index: None if index == 1 else mark(store, index))
    out = tmp_path / "holes.zarr"
    with pytest.raises(RunError, match="1 of its 4 chunks .the first: 1. were never marked written"):
        pool.write_store(
            out, shape=(4, 4), chunks=[(i, s, min(s + 16, 50)) for i, s in enumerate(range(0, 50, 16))],
            chunk_rows=16, settings={"source": "test"}, labels={}, write_chunk=_writes_right, args=(7,),
            n_jobs=1, client=None, progress=False, overwrite=False, protect=None, desc="test")
    assert not out.exists()


def test_small_row_chunks_grow_to_whole_multiples_so_checks_do_not_grow_with_n():
    # X sharded in chunks of one row, a representation of 10 float32 columns
    rows = output_chunks((4096, 10), np.float32, 1)[0]
    assert rows * 10 * 4 >= 4096 * 10 * 4 or rows * 40 >= 8 * 2**20
    assert output_chunks((10**7, 10), np.float32, 1000)[0] % 1000 == 0
    assert output_chunks((10**7, 10), np.float32, 1000)[0] * 40 >= 8 * 2**20
    assert len(sample_rows(4096, rows)) <= 3


def test_rounded_and_thresholded_outputs_are_checked_against_the_values_before_rounding():
    rows = np.arange(3)
    e = np.array([[0.2, 0.9, 0.49], [0.7, 0.1, 0.6], [0.0, 1.0, 0.5]])
    check_rows(e > 0.5, e, rows, "b.zarr")
    with pytest.raises(WrongRowsError):
        check_rows(np.zeros((3, 3), bool), e, rows, "b.zarr")  # every value false: caught
    check_rows(np.zeros((3, 3), bool)[:, :0], e[:, :0], rows, "b.zarr")  # nothing to compare
    with pytest.raises(WrongRowsError):
        check_rows(np.ones((3, 3), bool), np.zeros((3, 3), bool), rows, "b.zarr")  # bool: exact
    f = np.array([[0.4, 1.6, 254.5], [3.0, -2.0, 300.0], [0.5, 0.49, 7.2]])
    check_rows(np.array([[0, 2, 254], [3, 0, 255], [1, 0, 7]], np.uint8), f, rows, "u.zarr")
    with pytest.raises(WrongRowsError):  # a 0/1 image zeroed is off by one, yet caught
        check_rows(np.zeros((3, 3), np.uint8), np.array([[1.0, 0, 1], [0, 1, 0], [1, 1, 1]]), rows, "u.zarr")
    check_rows(np.zeros((0, 3)), np.zeros((0, 3)), np.zeros(0, np.int64), "e.zarr")  # no rows


def test_a_failed_cluster_write_that_gives_up_waiting_says_so_and_leaves_the_request(monkeypatch, tmp_path):
    import distributed

    from dfairpca.celeba import pool

    class Running:  # a task's future that does not end
        def done(self):
            return False

    class Client:
        def __init__(self):
            self.cancelled = []

        def cancel(self, futures):
            self.cancelled += futures

    stop = tmp_path / "stop-x"
    for interrupt in (TimeoutError, KeyboardInterrupt):  # the wait's end, a second Ctrl-C

        def wait(futures, timeout, interrupt=interrupt):
            raise interrupt()

        monkeypatch.setattr(distributed, "wait", wait)
        client, futures, exc = Client(), [Running(), Running()], RuntimeError("chunk 0 failed")
        pool._wind_down(client, futures, (stop.touch, stop.unlink), exc)  # returns: exc is raised
        assert stop.exists()  # the request stays for the tasks still running
        assert client.cancelled == futures
        assert exc.__notes__[0].startswith("2 of its Dask tasks had not finished")
        stop.unlink()
    # a request that cannot be written (a full disk): waited for all the same
    waited = []
    monkeypatch.setattr(distributed, "wait", lambda futures, timeout: waited.append(timeout))

    def full():
        raise OSError(28, "No space left on device")

    pool._wind_down(Client(), [], (full, stop.unlink), RuntimeError("x"))
    assert waited == [pool.STOP_NOTICE_SECONDS]
