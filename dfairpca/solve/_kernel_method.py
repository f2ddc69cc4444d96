"""Which method a :class:`~dfairpca.FairKernelPCA` fit runs, exact or Nyström, and the memory
each needs: the n x n (exact) or m x m (Nyström) float64 matrices alive at its peak,
checked against ``max_memory`` before any kernel entry is computed.
"""

from __future__ import annotations

import math

from ..errors import InvalidInputError

# Deferred imports: psutil (heavy or optional) is imported in the functions that use it, so that
# importing this module stays light.

__all__ = ["choose_method", "fit_budget", "exact_fit_bytes", "nystroem_fit_bytes",
           "AUTO_EXACT_MAX_ROWS", "AUTO_LANDMARKS", "EXACT_MATRICES", "NYSTROEM_MATRICES"]

#: "auto" uses the exact method up to this many fitted rows (if it fits in memory) ...
AUTO_EXACT_MAX_ROWS = 20_000
#: ... and Nyström with this many landmarks (at most n) beyond
AUTO_LANDMARKS = 2_000
#: n x n float64 matrices alive at the peak of an exact fit (the kernel, an eigensolver copy
#: or the eigenvectors of a clipped kernel, and headroom for the blocks in flight)
EXACT_MATRICES = 3
def exact_fit_bytes(n: int, d: int) -> int:
    """Memory the exact method needs for n fitted rows of d features, in bytes.

    ``EXACT_MATRICES`` n x n float64 matrices plus the fitted rows as float64.
    """
    return 8 * (EXACT_MATRICES * n * n + n * d)


#: m x m float64 matrices alive at the peak of a Nyström fit with m landmarks (the landmark
#: kernel, its symmetrised copy, the eigensolver's copy and eigenvectors; then the pass's
#: m x m statistics and their solve, which need no more)
NYSTROEM_MATRICES = 4


def nystroem_fit_bytes(m: int, d: int) -> int:
    """Memory the Nyström method needs for m landmarks of d features, in bytes.

    ``NYSTROEM_MATRICES`` m x m float64 matrices plus the landmarks as float64.
    """
    return 8 * (NYSTROEM_MATRICES * m * m + m * d)


def _most_landmarks(d: int, budget: float) -> int:
    """The largest m whose :func:`nystroem_fit_bytes` is within ``budget`` (at least 1)."""
    c = NYSTROEM_MATRICES
    m = int((-d + math.sqrt(d * d + 4 * c * budget / 8)) / (2 * c))
    while m > 1 and nystroem_fit_bytes(m, d) > budget:
        m -= 1
    return max(m, 1)


def fit_budget(max_memory) -> float:
    """Bytes a kernel fit may use: ``max_memory``, or None for half the memory available."""
    if max_memory is not None:
        return float(max_memory)
    import psutil

    return 0.5 * psutil.virtual_memory().available

def choose_method(n_landmarks, n_components, n: int, d: int, max_memory=None) -> int | None:
    """Landmark count m for Nyström, or None for the exact method (checked to fit), for
    FairKernelPCA's ``n_landmarks``, ``n_components`` and ``max_memory`` on n fitted rows
    of d features."""
    m = n_landmarks
    if m == "auto":
        fits = exact_fit_bytes(n, d) <= fit_budget(max_memory)
        return None if n <= AUTO_EXACT_MAX_ROWS and fits else min(n, AUTO_LANDMARKS)
    if m is None:
        _check_budget("the exact method", exact_fit_bytes(n, d), max_memory,
                      f"{EXACT_MATRICES} kernel-sized {n} x {n} float64 matrices) for the {n} "
                      "fitted rows",
                      lambda budget: f"use the Nyström approximation, e.g. n_landmarks="
                                     f"{min(n, AUTO_LANDMARKS)} (or n_landmarks='auto'), or "
                                     "raise max_memory")
        return None
    m = int(m)  # the parameter rules let only an integer through to here
    if m > n:
        raise InvalidInputError(
            f"n_landmarks={m} exceeds the {n} fitted rows; pass n_landmarks <= {n}, or "
            "n_landmarks=None for the exact method"
        )
    if n_components is not None and m < n_components:
        raise InvalidInputError(
            f"n_landmarks={m} is smaller than n_components={n_components}; a "
            f"k-dimensional representation needs at least k landmarks"
        )
    _check_budget(f"n_landmarks={m}", nystroem_fit_bytes(m, d), max_memory,
                  f"{NYSTROEM_MATRICES} {m} x {m} float64 matrices, the landmarks' kernel and "
                  "its eigenvectors)",
                  lambda budget: f"pass fewer landmarks, e.g. n_landmarks="
                                 f"{_most_landmarks(d, budget)} (the most that fit), or raise "
                                 "max_memory")
    return m


def _check_budget(what: str, need: int, max_memory, held: str, fix) -> None:
    """Raise if ``need`` bytes exceed the budget: ``what`` needs them for the matrices
    ``held`` names (with the closing parenthesis and what follows it); ``fix(budget)``
    says what to pass instead."""
    budget = fit_budget(max_memory)
    if need > budget:
        raise InvalidInputError(f"{what} needs about {need / 2**30:.1f} GiB ({need} bytes: {held}, "
                                f"more than max_memory = {budget:.0f} bytes; {fix(budget)}")
