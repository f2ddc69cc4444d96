"""The sums of one chunk of weighted rows: :func:`weighted_chunk_sums`, the branch of
:func:`dfairpca.stats._chunk.chunk_sums` for ``sample_weight``.

Frequency weights: a row of weight w counts as w copies of itself.  A branch of its own,
so that the unweighted path stays as it is: n and the group counts become float64 totals
of the weights (``Sums.n_rows`` keeps the rows of positive weight), the means weighted
means, and the products ``sum w (x - m)(x - m)^T`` are syrk of the rows
``(x - m) * sqrt(w)``.  Rows of weight 0 are left out like rows outside the mask (their
NaN are still reported).  Data of extreme magnitude and data far from 0 take the paths
the unweighted chunk takes (:mod:`dfairpca.stats._chunk`: the range check, columns
scaled by powers of two, a second sum of the centred rows), with the weights in them.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ..base._blas import blas_lock, syrk
from ..base._system import BLOCK_BYTES
from ..errors import InvalidInputError
from ._exact import WEIGHTED_EXACT_MESSAGE, is_exact
from ._chunk import _in_range, drop_nonfinite, recentred, _offset_is_large, _scaled_products
from ._sums import MAX_BAD_ROWS_REPORTED, GroupSums, Sums

__all__ = ["weighted_chunk_sums", "check_weight_chunk"]


def check_weight_chunk(w, rows: int, row_offset: int = 0) -> np.ndarray:
    """The float64 weights of one chunk of ``rows`` rows, or InvalidInputError naming the
    first offending rows (negative, NaN or infinite weights; a wrong length)."""
    w = np.asarray(w)
    if w.ndim != 1 or w.shape[0] != rows:
        raise InvalidInputError(
            f"sample_weight must be 1-D with one weight per row of X: a chunk of {rows} rows "
            f"(from row {row_offset}) got weights of shape {w.shape}")
    if w.dtype.kind not in "biuf":
        raise InvalidInputError(f"sample_weight must be numbers; got dtype {w.dtype}")
    w = w.astype(np.float64, copy=False)
    bad = ~np.isfinite(w) | (w < 0)
    if bad.any():
        at = np.flatnonzero(bad)
        rows_named = ", ".join(str(row_offset + int(i)) for i in at[:MAX_BAD_ROWS_REPORTED])
        more = ", ..." if at.size > MAX_BAD_ROWS_REPORTED else ""
        raise InvalidInputError(
            f"sample_weight's rows {row_offset} to {row_offset + rows - 1} hold {at.size} negative, "
            f"NaN or infinite weight(s) (rows {rows_named}{more}, e.g. {float(w[at[0]])!r}); "
            "weights must be finite and >= 0 (0 drops a row)")
    return w


def weighted_chunk_sums(x, weights, codes, categories: Sequence[np.ndarray], *, mask,
                        row_offset: int, dtype, group_scatter: bool) -> Sums:
    """:func:`~dfairpca.stats._chunk.chunk_sums` of rows of frequency weights ``weights`` (r,): n and the group
    counts are sums of weights (float64), ``n_rows`` the rows of positive weight."""
    x = np.asarray(x)
    if x.ndim > 2:
        x = x.reshape(x.shape[0], -1)
    if is_exact(dtype):
        raise InvalidInputError(WEIGHTED_EXACT_MESSAGE)
    w = check_weight_chunk(weights, x.shape[0], row_offset)
    dtype = np.dtype(dtype or np.float64)
    d = x.shape[1]
    keep = w > 0
    if mask is not None:
        keep &= np.asarray(mask, bool)
    n_bad, bad_rows = drop_nonfinite(x, keep, row_offset)
    if not keep.all():
        x, w = x[keep], w[keep]
        codes = None if codes is None else np.asarray(codes)[keep]
    attrs = [GroupSums(np.asarray(c), np.zeros(len(c)), np.zeros((len(c), d)),
                       [None] * len(c) if group_scatter else None) for c in categories]
    out = Sums(0.0, np.zeros(d), None, attrs, n_bad, bad_rows, float(np.finfo(dtype).eps),
               n_rows=int(x.shape[0]))
    r = x.shape[0]
    if r == 0:
        out.scatter = np.zeros((d, d), order="F")
        return out
    out.n = float(w.sum())
    total = _weighted_total(x, w)
    out.mean = total / out.n
    shifts = []
    if codes is not None:
        codes = np.asarray(codes).reshape(r, -1)
        for j, att in enumerate(out.attributes):
            cj = codes[:, j]
            att.counts = np.bincount(cj, weights=w, minlength=att.n_groups)
            sums = np.zeros((att.n_groups, d))
            for g in np.flatnonzero(att.counts):
                sums[g] = _weighted_total(x[cj == g], w[cj == g])
            live = att.counts > 0
            att.deviation = np.zeros((att.n_groups, d))
            att.deviation[live] = sums[live] / att.counts[live, None] - out.mean
            if group_scatter:
                shifts += [(att, g, cj == g) for g in np.flatnonzero(att.counts)]
    sw = np.sqrt(w)
    acc, gacc, centres = _weighted_products(x, sw, out.mean, shifts, dtype)
    if not _in_range(x, acc, gacc, shifts, dtype):
        acc, gacc, out.scatter_exponent, centres = _scaled_products(
            x, out.mean, shifts, dtype, products=lambda *a, **k: _weighted_products(x, sw, *a[1:], **k))
    # unlike unweighted rows, inputs of 32 bits or less need it too: their products with
    # the weights round, so ``w @ x`` is not exact even when the values share a binade
    if _offset_is_large(out.mean, acc, out.n, out.scatter_exponent):
        acc, gacc = _weighted_refined(x, w, codes, out, acc, gacc, shifts, centres)
    _exact_constant_means(x, out, acc)
    out.scatter = acc
    for i, (att, g, _) in enumerate(shifts):
        att.scatter[g] = gacc[i]
    return out


def _exact_constant_means(x, out: Sums, acc) -> None:
    """Set the mean of every column constant over the chunk to its value, exactly.

    ``w @ x / sum(w)`` rounds (by up to ``sqrt(r) * eps`` relative, growing with the rows),
    and the products of a constant column are exactly 0 then, so no refinement corrects
    it; two chunks of the same constant would then merge into a scatter of rounding
    noise, which the zero-variance test must not have to tell from data.  Only columns
    whose product diagonal is 0 are looked at (one comparison per value).
    """
    for c in np.flatnonzero(np.diagonal(acc) == 0):
        col = x[:, c]
        if np.all(col == col[0]):
            out.mean[c] = float(col[0])
            for att in out.attributes:
                att.deviation[:, c] = 0.0


def _weighted_total(x, w) -> np.ndarray:
    """``w @ x`` in float64, by row blocks (no float64 copy of the whole chunk)."""
    d = x.shape[1]
    step = max(64, BLOCK_BYTES // (max(d, 1) * 8))
    total = np.zeros(d)
    for s in range(0, x.shape[0], step):
        total += w[s : s + step] @ x[s : s + step].astype(np.float64, copy=False)
    return total


def _weighted_products(x, sw, mean, shifts, dtype, exponents=None):
    """``_chunk._products`` of the rows ``(x - mean) * sqrt(w)`` (``sw``: the square roots of
    the weights): upper triangles of ``sum w (x - m)(x - m)^T`` and of every group's.

    As there, values the dtype holds exactly (uint8 pixels into float32) are centred and
    weighted in the dtype itself, others in float64 first (the centres are then the
    float64 means)."""
    d, r = x.shape[1], x.shape[0]
    product = syrk(dtype)
    lock = blas_lock()
    acc = np.zeros((d, d), dtype, order="F")
    gacc = [np.zeros((d, d), dtype, order="F") for _ in shifts]
    devs = [att.deviation[g] for att, g, _ in shifts]
    if exponents is not None:
        devs = [np.ldexp(v, -exponents) for v in devs]
    exact = exponents is None and np.can_cast(x.dtype, dtype, "safe")
    work = dtype if exact else np.dtype(np.float64)  # the dtype the rows are centred in
    mu = mean.astype(work)
    devs = [v.astype(work) for v in devs]
    back = (lambda v: np.ldexp(v.astype(np.float64), exponents)) if exponents is not None else (
        lambda v: v.astype(np.float64))
    centre = mu.astype(np.float64)
    centres = (centre, [centre + back(v) for v in devs])
    step = max(64, BLOCK_BYTES // (d * work.itemsize))
    for s in range(0, r, step):
        xw = np.subtract(x[s : s + step], mu, dtype=work)
        if exponents is not None:
            xw = np.ldexp(xw, -exponents)
        rw = sw[s : s + step, None].astype(work)
        xw *= rw  # (x - m) sqrt(w); a group's rows about its own mean: minus dev sqrt(w)
        with lock:
            acc = product(acc, xw.astype(dtype, copy=False))
        for i, (_, _, sel) in enumerate(shifts):
            b = sel[s : s + step]
            if b.any():
                xg = (xw[b] - devs[i] * rw[b]).astype(dtype, copy=False)
                with lock:
                    gacc[i] = product(gacc[i], xg)
    return acc, gacc, centres


def _weighted_refined(x, w, codes, out: Sums, acc, gacc, shifts, centres):
    """``_chunk._refined`` of weighted rows: the means and group deviations again from float64
    weighted sums of ``x - mean``, the products moved to them."""
    r, d = x.shape
    mu = out.mean
    total = np.zeros(d)
    sums = [np.zeros((a.n_groups, d)) for a in out.attributes]
    step = max(64, BLOCK_BYTES // (d * 8))
    for s in range(0, r, step):
        xc = np.subtract(x[s : s + step], mu, dtype=np.float64) * w[s : s + step, None]
        total += xc.sum(axis=0)
        for j in range(len(out.attributes)):
            cj = codes[s : s + step, j]
            for g in np.unique(cj):
                sums[j][g] += xc[cj == g].sum(axis=0)
    return recentred(out, acc, gacc, shifts, centres, total, sums, out.n,
                     [float(w[sel].sum()) for _, _, sel in shifts])
