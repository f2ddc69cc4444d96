"""The largest k: every "n_components is too large" refusal, worded by one function.

The limits themselves come from different places (X's features, the rows fitted, the
directions a fair constraint leaves, :func:`dfairpca.solve._fairness.check_fair_k` for
the groups), but a user meets one error, whichever solve found it.
"""

from __future__ import annotations

import numpy as np

from ..errors import InvalidInputError

__all__ = ["too_large", "known", "check_rows", "check_features"]


def too_large(k, why: str) -> InvalidInputError:
    """The error for an ``n_components`` of k above a limit, ``why`` saying which."""
    return InvalidInputError(f"n_components={k} is too large: {why}")


def known(n) -> bool:
    """Whether a row count is known (a Dask array of unknown chunk sizes has NaN rows)."""
    return n is not None and not (isinstance(n, float) and np.isnan(n))


def check_rows(k, n, largest: int, what: str = "rows") -> None:
    """Raise if k exceeds the n fitted rows (checked before the pass wherever n is known);
    ``what`` the rows are ("rows with y == 1" for equal opportunity)."""
    if k is not None and known(n) and k > n:
        raise too_large(k, f"X has {int(n)} {what}, fewer than k; the largest k is {int(largest)}")


def check_features(k, d: int) -> None:
    """Raise if k exceeds X's d features."""
    if k > d:
        raise too_large(k, f"X has {d} features")
