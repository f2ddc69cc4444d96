"""What ``svd_solver="auto"`` chooses and what a fit may hold: the flop and read model that
picks the matrix-free randomized solve or the exact one from the shape alone, the memory the
exact solve's d x d matrices need here and on every worker, and the refusal of a variant
that has no matrix-free form.
"""

from __future__ import annotations

from ..engine._compute import cluster_failures_said, scheduler_workers
from ..engine._memory import PASS_BYTES_PER_THREAD
from ..errors import InvalidInputError

# Deferred imports: distributed, psutil (heavy or optional) are imported in the functions that use
# them, so that importing this module stays light.

__all__ = ["choose_svd_solver", "check_exact_memory", "worker_memory", "memory_budget",
           "needs_dense_message", "EXACT_COPIES", "PASS_BYTES_PER_THREAD"]


def needs_dense_message(what: str, d: int, matrices: int, alternative: str) -> str:
    """The refusal of a variant that has no matrix-free form: the memory its exact path
    would need and what to use instead."""
    gb = matrices * d * d * 8 / 1e9
    return (f"{what} has no matrix-free form: it needs {matrices} d x d float64 matrices "
            f"({matrices} x {d:,}^2 x 8 bytes = {gb:,.{0 if gb >= 10 else 2}f} GB); use "
            f"svd_solver='full' (the exact one-pass solve) where that memory exists, or "
            f"{alternative}")


#: the exact fit holds about this many d x d float64 matrices at its peak (the pass's sum,
#: its completion, the solve's copy and LAPACK's work): 1.25 GB measured at d = 6,400
EXACT_COPIES = 4
#: a pass of the randomized fit costs, per element of X, its decode and conversion (what
#: about 600 flops of the exact pass's syrk take: 0.7 s against 7.8 s per 20,000 rows of the
#: Zarr CelebA store at d = 6,400, one thread) plus its two thin products, 4 (k + p) flops at
#: 1.5 times syrk's time per flop (0.44 s for k + p = 60)
READ_FLOPS = 600
PRODUCT_FLOPS = 6
#: the passes "auto" plans for: iterated_power="auto" stopped after 4 or 5 on the CelebA
#: benchmark at k = 50
PLANNED_PASSES = 5


def choose_svd_solver(d: int, k: int, n_oversamples: int) -> str:
    """``svd_solver="auto"``'s choice for an int k, from the shape and parameters only (the
    same call chooses the same solve on every machine, at every moment): "randomized" when
    its passes cost less than the exact pass in syrk flops per row of X,
    ``PLANNED_PASSES * (READ_FLOPS + PRODUCT_FLOPS (k + p)) d < d^2``; else the exact
    "covariance_eigh" (whose memory :func:`check_exact_memory` then checks).  At d = 6,400
    that is randomized up to k = 100 (p = 10), exact above; at d = 116,412 (CelebA in
    colour) randomized always."""
    per_row = PLANNED_PASSES * (READ_FLOPS + PRODUCT_FLOPS * (k + n_oversamples))
    return "randomized" if per_row < d else "covariance_eigh"


def check_exact_memory(d: int, budget: int, instead: str, workers=None) -> None:
    """Raise before the pass if the exact fit's d x d matrices do not fit: here,
    ``EXACT_COPIES * 8 d^2`` bytes against ``budget`` (:func:`memory_budget`); on every
    worker of ``workers`` (``(address, threads, memory limit)``, default the active
    Client's, :func:`worker_memory`), ``PASS_BYTES_PER_THREAD d^2`` per thread against half
    its limit.  ``instead``: what to pass."""
    need = EXACT_COPIES * 8 * d * d
    anyway = "or svd_solver='full' to run the exact fit anyway"
    if need > budget:
        raise InvalidInputError(
            f"svd_solver='auto' chose the exact fit, whose {EXACT_COPIES} d x d float64 matrices "
            f"need about {need / 1e9:,.1f} GB at d = {d:,}, more than half the memory available "
            f"here or on the smallest worker ({budget / 1e9:,.1f} GB): {instead}, {anyway}"
        )
    for address, threads, limit in worker_memory() if workers is None else workers:
        held = threads * PASS_BYTES_PER_THREAD * d * d
        if limit and held > limit // 2:
            raise InvalidInputError(
                f"svd_solver='auto' chose the exact fit, whose pass holds a d x d sum and a "
                f"chunk's d x d product per worker thread: {threads} threads x "
                f"{PASS_BYTES_PER_THREAD} x {d:,}^2 bytes = {held / 1e9:,.1f} GB on the worker "
                f"{address}, more than half its memory limit ({limit / 1e9:,.1f} GB); a worker "
                f"over its limit is restarted and the pass may wait for it for ever: {instead}, "
                f"fewer threads per worker, {anyway}"
            )


def worker_memory() -> list[tuple[str, int, int]]:
    """``(address, threads, memory limit in bytes, 0 for none)`` of every worker of the
    active ``distributed.Client`` ([] without one)."""
    try:
        from distributed import get_client

        client = get_client()
    except (ImportError, ValueError):
        return []
    with cluster_failures_said(client):  # a Client that has lost its scheduler: one line
        workers = scheduler_workers(client)
    return [(a, int(w.get("nthreads") or 1), int(w.get("memory_limit") or 0)) for a, w in workers.items()]


def memory_budget() -> int:
    """Bytes a fit may hold: half the memory available here, and with an active
    ``distributed.Client`` half the smallest worker's memory limit (the exact pass keeps a
    d x d sum on every worker)."""
    import psutil

    budget = psutil.virtual_memory().available // 2
    limits = [memory for _, _, memory in worker_memory()]
    if limits and min(limits) > 0:
        budget = min(budget, min(limits) // 2)
    return int(budget)
