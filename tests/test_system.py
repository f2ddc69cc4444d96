"""The machine facts shared by the pass, the readers and the cluster helpers."""

import os

from dfairpca.base import _system


def test_cpu_count_is_what_this_process_may_use():
    n = _system.cpu_count()
    assert 1 <= n <= (os.cpu_count() or 1)
    if hasattr(os, "sched_getaffinity"):
        assert n <= len(os.sched_getaffinity(0))


def test_rows_per_block_fills_the_block_and_never_returns_zero():
    assert _system.rows_per_block(6_400) == _system.BLOCK_BYTES // 6_400
    assert _system.rows_per_block(10**12) == 1
    assert _system.rows_per_block(0) == _system.BLOCK_BYTES
    assert _system.rows_per_block(100, block_bytes=1_000) == 10
