"""``sample_weight``: frequency weights of the rows, checked before any pass.

A row of weight w counts as w copies of itself (integer weights equal repeated rows,
weight 0 a dropped row), so every statistic is the weighted one with the total weight in
place of the row count (:class:`dfairpca.stats.moments.Moments`).  Weights in memory are
checked here at once; a Dask array of weights has only its shape checked here, its
values in the pass, chunk by chunk (:func:`check_weight_values`, called by the chunk kernel),
and an all-zero total after it (:func:`check_total_weight`).
"""

from __future__ import annotations

import numbers

import numpy as np

from ..errors import InvalidInputError, InvalidTypeError
from ._validation import is_dask, is_xarray

# Deferred imports: dask, zarr (heavy or optional) and package modules that load such libraries, or
# this module, at import are imported in the functions that use them, so that importing this module
# stays light.

#: how many offending rows a message names (as the statistics' NaN report)
MAX_BAD_ROWS_REPORTED = 10

__all__ = ["check_sample_weight", "check_weights", "check_weight_values", "check_total_weight",
           "ALL_ZERO_MESSAGE", "too_few_samples"]

#: what a fit says when every weight is 0 (or every row of positive weight is masked out)
ALL_ZERO_MESSAGE = ("sample_weight is zero for every row the fit uses: there is nothing to fit; "
                    "give some rows a positive weight")


def check_sample_weight(sample_weight, n, row_chunks=None):
    """``sample_weight`` as float64 numpy (checked) or, for a Dask array, lazy with the row
    chunks ``row_chunks`` of X (its values are checked in the pass); None stays None.

    Raises InvalidInputError for weights that are not 1-D, not one per row of X (``n``
    rows), negative, NaN, infinite or all zero; InvalidTypeError for a scalar or text.
    """
    if sample_weight is None:
        return None
    w = _as_array(sample_weight)
    if isinstance(w, numbers.Number) or np.ndim(w) == 0:
        raise InvalidTypeError(
            f"sample_weight must be an array with one weight per row; got the scalar {w!r:.40} "
            "(for equal weights pass none)")
    if np.ndim(w) != 1:
        raise InvalidInputError(f"sample_weight must be 1-D (one weight per row); got shape {np.shape(w)}")
    length = w.shape[0]
    if _known(length) and _known(n) and int(length) != int(n):
        raise InvalidInputError(f"sample_weight has {int(length)} weights but X has {int(n)} rows")
    import dask.array as da

    if isinstance(w, da.Array):
        if w.dtype.kind not in "biuf":
            raise InvalidInputError(f"sample_weight must be numbers; got dtype {w.dtype}")
        if row_chunks is not None and _known(length) and all(_known(c) for c in row_chunks):
            if tuple(w.chunks[0]) != tuple(row_chunks):
                # the pass hands every row chunk of X its weights: the same boundaries
                w = w.rechunk({0: tuple(int(c) for c in row_chunks)})
        return w
    w = check_weight_values(w, copy=True)
    if not (w > 0).any():
        raise InvalidInputError(ALL_ZERO_MESSAGE)
    return w


def _as_array(w):
    """numpy or Dask array of weights given as a list, numpy, pandas, xarray, Zarr or Dask."""
    import zarr

    import dask.array as da

    if is_xarray(w):
        w = w.data
    if isinstance(w, zarr.Array):
        from ..io import strict_array

        # reopened so its metadata is checked and an absent chunk is an error, not zeros
        return da.from_zarr(strict_array(w))
    if isinstance(w, da.Array):
        return w
    if is_dask(w) and hasattr(w, "to_dask_array"):  # a Dask Series
        return w.to_dask_array(lengths=True)
    if hasattr(w, "to_numpy"):  # pandas
        return w.to_numpy()
    if isinstance(w, numbers.Number):
        return w
    return np.asarray(w)


def check_weight_values(w, rows: int | None = None, row_offset: int = 0, *, copy: bool = False) -> np.ndarray:
    """Weights as float64 (a copy if ``copy``, else only where the dtype differs), or
    InvalidInputError naming the first offending rows (negative, NaN or infinite weights;
    not numbers).  What every weight passes through: all of them at once here, or one
    chunk of ``rows`` rows from global row ``row_offset`` in the pass (its shape checked
    too)."""
    w = np.asarray(w)
    if rows is not None and (w.ndim != 1 or w.shape[0] != rows):
        raise InvalidInputError(
            f"sample_weight must be 1-D with one weight per row of X: a chunk of {rows} rows "
            f"(from row {row_offset}) got weights of shape {w.shape}")
    if w.dtype.kind not in "biuf":
        raise InvalidInputError(f"sample_weight must be numbers; got dtype {w.dtype}")
    w = w.astype(np.float64, copy=copy)
    bad = ~np.isfinite(w) | (w < 0)
    if bad.any():
        at = np.flatnonzero(bad)
        named = ", ".join(str(row_offset + int(i)) for i in at[:MAX_BAD_ROWS_REPORTED])
        more = ", ..." if at.size > MAX_BAD_ROWS_REPORTED else ""
        raise InvalidInputError(
            f"sample_weight holds {at.size} negative, NaN or infinite weight(s) (rows {named}{more}, "
            f"e.g. {float(w[at[0]])!r}); weights must be finite and >= 0 (0 drops a row)")
    return w


def check_total_weight(m) -> None:
    """Raise InvalidInputError if weighted statistics ``m`` hold no positive weight (Dask
    weights, whose values only the pass sees)."""
    if getattr(m, "n_rows", None) is not None and m.n_rows == 0 and not m.n_nonfinite:
        raise InvalidInputError(ALL_ZERO_MESSAGE)


def _known(n) -> bool:
    return n is not None and not (isinstance(n, float) and np.isnan(n))


def check_weights(sample_weight, X, mask=None, min_total: float = 0):
    """:func:`check_sample_weight` for the rows of X (numpy or Dask, rows known), and for
    in-memory weights also that the rows of ``mask`` (equal opportunity's y == 1) hold
    some positive weight, and at least ``min_total`` in all (a fit: 2)."""
    import dask.array as da

    w = check_sample_weight(sample_weight, X.shape[0],
                            X.chunks[0] if isinstance(X, da.Array) else None)
    if isinstance(w, np.ndarray) and mask is not None and not (w[np.asarray(mask, bool)] > 0).any():
        raise InvalidInputError(ALL_ZERO_MESSAGE + " (the rows with y == 1, which equal "
                                "opportunity fits, all have weight 0)")
    if isinstance(w, np.ndarray) and min_total:
        total = float(w[np.asarray(mask, bool)].sum() if mask is not None else w.sum())
        if total < min_total:
            raise InvalidInputError(too_few_samples(total, None, min_total))
    return w


def too_few_samples(n, rows: int | None, least: float = 2) -> str:
    """The message of a fit given fewer than ``least`` samples: ``n`` rows, or for weighted
    statistics (``rows`` not None, or ``n`` a float) a total weight of ``n`` over ``rows``
    rows of positive weight, shown as a person writes it (``1``, not ``1.0000000000000002``)."""
    if rows is None and not isinstance(n, float):
        return f"need at least {least:g} samples to fit; got {n} (n_samples={n})"
    over = "over the rows fitted" if rows is None else f"over {rows} row(s) of positive weight"
    return (f"sample_weight totals {float(n):.6g} {over}: these are frequency weights, which count "
            f"rows (a weight of 2 is a row seen twice), and a fit needs a total of at least "
            f"{least:g}; weights that are not counts (probabilities, or scaled by any factor) may "
            "be rescaled to sum to the number of rows (sample_weight * n / sample_weight.sum()): "
            "that changes no component, only the n - 1 the variances are divided by")

