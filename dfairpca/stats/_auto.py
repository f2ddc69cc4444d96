"""What ``compute_dtype="auto"`` uses for 8-bit data: exact integer sums or float32 products,
chosen by measurement on the CPU at hand.

An exact pass runs at the speed of its 8-bit kernel, and no CPU flag says how fast that is:
MKL's ``cblas_gemm_s8u8s32`` passes its self-test on an AMD EPYC Zen 3 (no VNNI) and on a
Zen 4 (AVX-512 VNNI) but runs slower than float32 ``ssyrk`` on both, while on an Intel
Xeon with AMX it is the faster one.  So the first time a process needs the products of a
pass of width d (per width class: d's power of two), :func:`auto_choice` times the two
candidates on one block of that width (:func:`probe_rows` rows, the best of a few rounds,
each candidate doing what the pass does with a block: the exact kernel adding into an
int64 total through its scratch, float32 the block converted about its mean and a
``syrk`` into a float32 total) and picks exact only where it is not slower
(:data:`AUTO_SLACK`).  The choice is cached per process; a cluster's workers each time
their own and the pass is exact only where every worker chose exact
(:func:`dfairpca.engine._engine.auto_choice_for_pass`).

The time is the process's CPU time (every thread's, the BLAS threads included), not the
wall clock: a pass keeps every core busy (a thread or a worker per core), so what its
products cost is CPU time per row, and that is what neighbours on a shared machine leave
alone (on 2 cores at load 12, wall-clock ratios of one probe spread from 0.8x to 7x,
CPU-time ratios within 10%).  Both candidates are multi-threaded BLAS; a kernel on fewer
threads than the other would look cheaper than it is.

``DFAIRPCA_AUTO_KERNEL=exact`` or ``=float32`` forces either side without measuring (for
benchmarks); ``compute_dtype="exact"`` or ``"float32"`` does the same for one estimator.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import asdict, dataclass
from typing import Callable

import numpy as np

from ..base._blas import blas_lock, syrk
from ..errors import InvalidInputError
from . import _int_kernels as ik

__all__ = ["AUTO_ENV", "AUTO_SLACK", "AutoChoice", "auto_choice", "auto_report", "time_candidates",
           "decide", "probe_rows", "forced_choice", "row_width"]

_log = logging.getLogger("dfairpca")

#: the environment variable that forces "auto"'s choice for 8-bit data: "exact" or "float32"
AUTO_ENV = "DFAIRPCA_AUTO_KERNEL"
#: exact is chosen while its time is at most this times float32's: the rounds of one probe
#: differ by a few percent on a busy machine, and within that the exact sums win (their
#: statistics are bit-reproducible across chunkings and workers)
AUTO_SLACK = 1.05
#: multiply-adds of one probe call (about 30-60 ms of CPU in float32 syrk on a Zen 4)
PROBE_WORK = 6e8
#: rows of the probe block, at least / at most: an 8-bit GEMM over fewer rows than a pass
#: gives it runs at a fraction of its rate (MKL's at 256 rows of 3,000: 4x slower than
#: ssyrk; at 1,024 rows: 1.6x), which would favour float32 unfairly
PROBE_ROWS = (512, 4096)
#: columns of the probe block, at most: a wider pass is timed on this many (the probe's
#: exact sums hold 12 bytes per column squared, 0.8 GB at 8,192; wider, they would pass the
#: memory a float32 pass needs before its check has run)
PROBE_MAX_WIDTH = 8192
#: rounds of a probe, at most; and the seconds after which no round starts beyond the second
PROBE_REPEATS = 3
PROBE_SECONDS = 0.5

EXACT, FLOAT32 = "exact", "float32"


@dataclass(frozen=True)
class AutoChoice:
    """What "auto" chose for 8-bit blocks of ``width`` columns, and why: ``choice``
    ("exact" or "float32"), the exact ``kernel`` timed (None where no 8-bit kernel passed
    its self-test), the probe's ``rows`` and best CPU seconds per candidate, ``forced`` (the
    environment variable's value when it decided), and on a cluster how many ``workers``
    chose (the timings are then those of the worker whose exact kernel was slowest)."""

    choice: str
    width: int
    kernel: str | None = None
    rows: int = 0
    exact_s: float | None = None
    float32_s: float | None = None
    forced: str | None = None
    workers: int = 0

    @property
    def ratio(self) -> float | None:
        """exact's time over float32's (above 1: exact is slower), None if not timed."""
        if self.exact_s is None or not self.float32_s:
            return None
        return self.exact_s / self.float32_s

    def describe(self) -> str:
        """One line: e.g. ``"float32 (auto: exact mkl-gemm-s8u8s32 1.9x slower: 0.41 vs
        0.22 CPU s for 512 rows of 6,400)"``."""
        if self.forced:
            return f"{self.choice} ({AUTO_ENV}={self.forced})"
        if self.kernel is None:
            return f"{self.choice} (auto: no 8-bit kernel passed its self-test here)"
        r = self.ratio
        assert r is not None and self.exact_s is not None and self.float32_s is not None
        speed = f"{r:.2g}x slower" if r > 1 else f"{1 / r:.2g}x faster"
        where = f" on the slowest of {self.workers} workers" if self.workers > 1 else ""
        return (f"{self.choice} (auto: exact {self.kernel} {speed}{where}: {self.exact_s:.3g} vs "
                f"{self.float32_s:.3g} CPU s for {self.rows:,} rows of {self.width:,})")

    def as_dict(self) -> dict:
        return {**asdict(self), "description": self.describe()}


def forced_choice() -> str | None:
    """The choice :data:`AUTO_ENV` forces ("exact" or "float32"), or None where unset."""
    value = os.environ.get(AUTO_ENV, "").strip().lower()
    if not value:
        return None
    if value not in (EXACT, FLOAT32):
        raise InvalidInputError(f"{AUTO_ENV}={value!r} is not a choice: set it to 'exact' or "
                                f"'float32', or unset it to let compute_dtype='auto' measure")
    return value


def row_width(X) -> int:
    """Columns of a pass over X's rows (an image's pixels flattened): the width measured."""
    return int(np.prod(X.shape[1:], dtype=np.int64)) if len(X.shape) > 1 else 1


def probe_rows(width: int) -> int:
    """Rows of the probe block for ``width`` columns: about :data:`PROBE_WORK` multiply-adds
    of the upper triangle, within :data:`PROBE_ROWS`, a multiple of 64."""
    lo, hi = PROBE_ROWS
    rows = int(PROBE_WORK / max(1.0, width * (width + 1) / 2))
    return max(lo, min(hi, rows // 64 * 64))


def time_candidates(calls: dict[str, Callable[[], object]], *, repeats: int = PROBE_REPEATS,
                    seconds: float = PROBE_SECONDS,
                    clock: Callable[[], float] = time.process_time) -> dict[str, float]:
    """The best (least) seconds of each of ``calls`` over alternating rounds (one call of
    each per round, in turn, so that a change of the machine's load touches all of them):
    at least two rounds (the first call of a kernel pays its start-up: page faults of its
    scratch, its library's dispatch), at most ``repeats``, no round begun once ``seconds``
    have passed since the first (on ``clock``: the process's CPU seconds by default)."""
    best = {name: float("inf") for name in calls}
    start = clock()
    for i in range(max(2, repeats)):
        if i >= 2 and clock() - start >= seconds:
            break
        for name, call in calls.items():
            t0 = clock()
            call()
            best[name] = min(best[name], clock() - t0)
    return best


def decide(exact_s: float, float32_s: float, slack: float = AUTO_SLACK) -> str:
    """"exact" where the exact kernel is not slower than float32 (within ``slack``)."""
    return EXACT if exact_s <= float32_s * slack else FLOAT32


def _probe_block(dtype, rows: int, width: int) -> np.ndarray:
    lo, hi = ik.value_range(dtype)
    rng = np.random.default_rng(0)
    return rng.integers(lo, hi, size=(rows, width), endpoint=True, dtype=np.dtype(dtype))


def _exact_call(kernel: ik.Kernel, x: np.ndarray) -> tuple[Callable[[], object], Callable[[], None]]:
    """(one call, cleanup) of kernel adding x's Gram into an int64 total as a pass does:
    through the scratch it keeps, its products left pending (a pass flushes once per
    chunk, or per 32,768 rows for MKL's kernel)."""
    d = x.shape[1]
    G = np.zeros((d, d), np.int64, order="F")  # calloc: pages a pending kernel never touches cost nothing
    add = kernel.adder()
    state: dict = {"scratch": None}

    def call():
        state["scratch"] = add(G, x, state["scratch"], keep=True)

    def cleanup():
        state["scratch"] = None  # its pending sums are dropped with G

    return call, cleanup


def _float32_call(x: np.ndarray) -> Callable[[], object]:
    """One call of the float32 path on x: the block converted about its mean, as a pass
    converts a chunk (:func:`dfairpca.stats._chunk._products`), and ``syrk`` into a float32
    total (beta = 1)."""
    d = x.shape[1]
    acc = np.zeros((d, d), np.float32, order="F")
    mu = x.mean(axis=0).astype(np.float32)
    product = syrk(np.float32)
    lock = blas_lock()

    def call():
        xc = np.subtract(x, mu, dtype=np.float32)
        with lock:
            product(acc, xc)

    return call


_CHOICES: dict[tuple, AutoChoice] = {}
_AUTO_LOCK = threading.Lock()


def _width_class(width: int) -> int:
    return max(1, int(width)).bit_length()


def auto_choice(x_dtype, width: int) -> AutoChoice:
    """What "auto" uses for the products of a pass over 8-bit ``x_dtype`` blocks of
    ``width`` columns in this process (see the module docstring): measured once per
    width class and cached; threads that ask while a probe runs wait for it, so every
    block of a pass in this process sees the same choice."""
    width = max(1, int(width))
    forced = forced_choice()
    if forced is not None:
        return AutoChoice(forced, width, forced=forced)
    dt = np.dtype(x_dtype).name
    kernel_name = ik.int8_kernel_available(dt)  # the optional kernels loaded and self-tested
    key = (dt, _width_class(width), kernel_name, ik.registry_generation())
    with _AUTO_LOCK:
        got = _CHOICES.get(key)
        if got is not None:
            return got
        if kernel_name is None:
            choice = AutoChoice(FLOAT32, width)
        else:
            choice = _measure(ik.chosen(dt), dt, width)
            _log.info("compute_dtype='auto' for %s blocks of %d columns: %s", dt, width, choice.describe())
        _CHOICES[key] = choice
        return choice


def _measure(kernel: ik.Kernel, dtype: str, width: int) -> AutoChoice:
    probed = min(int(width), PROBE_MAX_WIDTH)
    rows = probe_rows(probed)
    x = _probe_block(dtype, rows, probed)
    exact, cleanup = _exact_call(kernel, x)
    try:
        best = time_candidates({EXACT: exact, FLOAT32: _float32_call(x)})
    finally:
        cleanup()
    return AutoChoice(decide(best[EXACT], best[FLOAT32]), width, kernel.name, rows, best[EXACT], best[FLOAT32])


def auto_report(width: int | None = None) -> list[dict]:
    """The choices "auto" made in this process for the registry as it is
    (:meth:`AutoChoice.as_dict` and the ``dtype``), one per dtype and width class; where
    none was made yet and ``width`` is given, uint8 blocks of ``width`` columns are
    measured first (what :func:`dfairpca.show_versions` shows)."""
    def made() -> list[dict]:
        gen = ik.registry_generation()
        with _AUTO_LOCK:
            return [dict(c.as_dict(), dtype=key[0]) for key, c in _CHOICES.items() if key[3] == gen]

    got = made()
    if not got and width is not None:
        auto_choice("uint8", width)
        got = made()
    return got
