"""The largest k: every "n_components is too large" refusal, worded by one function.

The limits themselves come from different places (X's features, the rows fitted, the
directions a fair constraint leaves, :func:`check_fair_k` for the groups: fair PCA
removes ``sum(m_r) - p`` directions for p attributes of m_1, ..., m_p groups and one for
each of q numeric attributes), but a user meets one error, whichever solve found it.
"""

from __future__ import annotations

import numpy as np

from ..base._params import is_int
from ..errors import InvalidInputError

__all__ = ["too_large", "known", "check_rows", "check_features", "fair_k_limit", "check_fair_k"]


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


def fair_k_limit(size: int, ms, q: int = 0) -> int:
    """The most fair components ``size`` dimensions hold: ``size - sum(m_r) + p - q`` for
    p attributes of ``ms`` = (m_1, ..., m_p) groups and q numeric attributes."""
    return size - sum(ms) + len(ms) - q


def check_fair_k(k, size: int, ms, q: int = 0, *, basis: str | None = None,
                 fix: str | None = None) -> int:
    """:func:`fair_k_limit`; raise if no fair component exists or the int k exceeds it.

    ``size`` is what the components are made of: X's d features (``basis`` None: the
    linear estimators) or a kernel method's basis, which ``basis`` describes ("n = 200
    fitted rows") and ``fix`` says how to enlarge.  k None asks for the limit.
    """
    limit = fair_k_limit(size, ms, q)
    if limit >= 1 and not (is_int(k) and k > limit):
        return limit
    numeric = [f"{q} numeric attribute(s)"] if q else []
    desc = " and ".join([f"{m} groups" for m in ms] + numeric)
    terms = f"{size} - {sum(ms)} + {len(ms)}{f' - {q}' if q else ''} = {limit}"
    if basis is None:
        if limit < 1:
            raise InvalidInputError(
                f"no fair projection exists: {size} features cannot absorb "
                f"{sum(ms) - len(ms) + q} constraints from groups of sizes "
                f"{list(ms)}{''.join(' and ' + s for s in numeric)}"
            )
        symbols = "d - sum(m) + p - q" if q else "d - sum(m) + p"
        raise too_large(k, f"with {desc} the largest k is {symbols} = {terms}")
    why = f"with {desc} and {basis} the largest k is {terms}; {fix}"
    if limit >= 1:
        raise too_large(limit if k is None else k, why)
    raise InvalidInputError(f"no fair representation exists: {why}")
