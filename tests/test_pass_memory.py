"""What a pass holds while it folds a chunk: its float blocks stay within
PRODUCT_BLOCK_BYTES (the chunk is never converted whole), measured with tracemalloc, which
counts numpy's arrays; and "auto"'s probe hands back what its kernel's library kept."""

import tracemalloc

import numpy as np
import pytest

from dfairpca.base import _system
from dfairpca.stats import _chunk
from dfairpca.stats.moments import Moments


def test_at_the_celeba_width_a_product_block_is_hundreds_of_rows_and_a_quarter_of_the_old():
    rows = _system.PRODUCT_BLOCK_BYTES // (6400 * 4)  # _products' step for float32
    assert rows >= 512  # enough rows per syrk that BLAS runs at its full rate
    assert 4 * _system.PRODUCT_BLOCK_BYTES <= _system.BLOCK_BYTES


@pytest.fixture
def blocks(monkeypatch):
    """The chunk's syrk calls, recorded: (rows, bytes) of every block; blocks of 100 rows
    of 64 float32 columns."""
    seen = []
    real = _chunk.syrk

    def recording(dtype):
        product = real(dtype)

        def call(C, xc):
            seen.append((xc.shape[0], xc.nbytes))
            return product(C, xc)

        return call

    monkeypatch.setattr(_chunk, "syrk", recording)
    monkeypatch.setattr(_chunk, "PRODUCT_BLOCK_BYTES", 100 * 64 * 4)
    return seen


def test_a_chunk_is_multiplied_in_blocks_of_at_most_product_block_bytes(blocks):
    rng = np.random.default_rng(0)
    X = rng.integers(0, 256, size=(1000, 64)).astype(np.uint8)
    codes = (X[:, :1] > 127).astype(np.int64)
    m = Moments.from_chunk(X, codes, [np.array([0, 1])], dtype=np.float32, group_scatter=True)
    assert blocks and max(b for _, b in blocks) <= 100 * 64 * 4
    assert sum(r for r, _ in blocks) == 1000 + len(X)  # every row once, and once in its group
    Xf = X.astype(np.float64)
    ref = (Xf - Xf.mean(0)).T @ (Xf - Xf.mean(0))
    np.testing.assert_allclose(m.scatter, ref, rtol=1e-5, atol=1e-5 * np.abs(ref).max())


def test_the_peak_of_a_chunks_sums_is_its_product_and_one_block_not_the_converted_chunk(blocks, monkeypatch):
    d, r = 256, 8192
    X = np.random.default_rng(1).integers(0, 256, size=(r, d)).astype(np.uint8)
    budget = 128 * d * 4  # blocks of 128 rows
    monkeypatch.setattr(_chunk, "PRODUCT_BLOCK_BYTES", budget)
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        sums = _chunk.chunk_sums(X, None, [], mask=None, row_offset=0, dtype=np.float32,
                                 group_scatter=False)
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    product = d * d * 4  # the chunk's float32 product, what the pass folds into its total
    assert sums.scatter.nbytes == product
    assert max(b for _, b in blocks) <= budget
    # the product, one block (two while the next is made), vectors of d and numpy's cast
    # buffers (about 100 KiB); the whole chunk in float32 (8 MiB) is eight times all that
    assert peak < product + 2 * budget + (128 << 10), peak
    assert 8 * peak < r * d * 4
