"""What a pass holds per worker thread: named by the refusal, before the pass, of one that
no worker can hold below the memory at which distributed pauses it, and by the error of a
pass whose workers all stay paused (:mod:`dfairpca.engine._compute`).

distributed pauses a worker whose process memory passes ``distributed.worker.memory.pause``
(80% of its memory limit by default): it then starts no task until its memory falls again,
and nothing restarts it (its nanny does only past ``terminate``, 95%).  A pass whose chunk
and sums keep every worker above that line would wait for ever.
"""

from __future__ import annotations

import contextlib
import contextvars
from dataclasses import dataclass

from ..base._system import PRODUCT_BLOCK_BYTES

__all__ = ["PASS_BYTES_PER_THREAD", "OWN_BYTES_COUNTED", "WorkingSet", "working_set", "pass_working_set",
           "current_working_set", "memory_state", "gib"]

#: what the exact pass holds per worker thread, in bytes per d^2: its running float64 total
#: and the float32 product of the chunk at hand (exact sums of 8-bit data: the int64 total
#: and MKL's int32 sums); a worker runs one chain per thread
PASS_BYTES_PER_THREAD = 12


def gib(n: int) -> str:
    """``n`` bytes as "1.50 GiB" (or MiB below one GiB, KiB below one MiB)."""
    if n >= 2**30:
        return f"{n / 2**30:.2f} GiB"
    return f"{n / 2**20:.0f} MiB" if n >= 2**20 else f"{n / 2**10:.0f} KiB"


#: the most of a worker's own memory (what its process holds besides Dask's data) that the
#: check before a pass counts: a fresh worker with the pass's modules imported held 84 MiB
#: (Python 3.11, numpy, zarr, distributed 2026.7); one that has run a pass holds more
#: (227-245 MiB after a randomized fit at d = 6,400 on 315 MiB workers), mostly freed pages
#: its allocator keeps and the next pass reuses, so counting it all would refuse passes
#: that run
OWN_BYTES_COUNTED = 64 << 20


@dataclass(frozen=True)
class WorkingSet:
    """What one worker thread holds while it reads and folds a chunk of a pass: the
    largest row chunk as read (``rows`` x ``d``, ``chunk`` bytes), the float block it is
    converted to (``block`` bytes, at most
    :data:`~dfairpca.base._system.PRODUCT_BLOCK_BYTES`), and the
    chain's sums and the chunk's product (``sums`` bytes).

    ``total`` is the peak of the two steps: the read holds the chunk twice (zarr decodes
    the store's chunks, then copies them into the result: 197 MiB at the end of the read
    of a 97 MiB chunk of uint8 faces, measured with tracemalloc), the fold the chunk, its
    block and the sums."""

    rows: int
    d: int
    chunk: int
    block: int
    sums: int

    @property
    def total(self) -> int:
        return self.chunk + max(self.chunk, self.block + self.sums)

    def describe(self) -> str:
        """E.g. "about 195 MiB per thread (a row chunk of 16,000 x 6,400, 98 MiB as read
        and twice that while it is read; its float block, 16 MiB; the sums, 2 MiB)"."""
        return (f"about {gib(self.total)} per thread (a row chunk of {self.rows:,} x {self.d:,}, "
                f"{gib(self.chunk)} as read and twice that while it is read; its float block, "
                f"{gib(self.block)}; the sums, {gib(self.sums)})")


def working_set(row_chunks, d: int, itemsize: int, sums: int) -> WorkingSet:
    """The :class:`WorkingSet` of a pass over rows chunked as ``row_chunks`` (X's
    ``chunks[0]``), ``d`` wide, of ``itemsize`` bytes each as read, whose chains hold
    ``sums`` bytes each (chunks of unknown size are not counted).  A lower bound: the
    float block is counted in float32, and Python's, Dask's and the libraries' own memory
    is not (the worker's own is counted where it is checked,
    :func:`dfairpca.engine._compute.check_workers_hold`)."""
    rows = max((int(r) for r in row_chunks if r == r), default=0)  # (NaN: a size not known)
    return WorkingSet(rows, int(d), rows * int(d) * int(itemsize),
                      min(rows * int(d) * 4, PRODUCT_BLOCK_BYTES), int(sums))


#: the working set of the pass now computing (None: not a pass, or not estimated)
_WORKING_SET: contextvars.ContextVar = contextvars.ContextVar("dfairpca_working_set", default=None)


@contextlib.contextmanager
def pass_working_set(ws: WorkingSet | None):
    """Computations inside the block are a pass of working set ``ws``, named by the error
    of workers paused for memory (:class:`dfairpca.cluster.WorkersPaused`).

    Yields
    ------
    None
    """
    token = _WORKING_SET.set(ws)
    try:
        yield
    finally:
        _WORKING_SET.reset(token)


def current_working_set() -> WorkingSet | None:
    """The :class:`WorkingSet` of the innermost :func:`pass_working_set` block, or None."""
    return _WORKING_SET.get()


def memory_state(dask_worker=None) -> tuple[float | None, int]:
    """``(pause fraction, own bytes)`` of this worker, run on each worker (``Client.run``):
    the fraction of its memory limit at which it pauses (None: never), and what its process
    holds besides Dask's data (a fresh worker: 63 MiB, 84 MiB once a pass has imported
    numpy's BLAS, zarr and dfairpca)."""
    manager = getattr(dask_worker, "memory_manager", None)
    fraction = getattr(manager, "memory_pause_fraction", None)
    process = int(dask_worker.monitor.get_process_memory())
    data = int(getattr(dask_worker.state, "nbytes", 0) or 0)
    return (float(fraction) if fraction else None), max(0, process - data)
