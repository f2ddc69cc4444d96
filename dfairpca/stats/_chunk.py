"""The sums of one chunk of rows (:func:`chunk_sums`): the numerics of a pass's first step.

The product ``xc^T xc`` (xc = x - mean) runs in the chunk's compute dtype (float32 for
images) as a BLAS ``syrk``, which fills the upper triangle only; the chunk's means are
float64 sums whatever that dtype.  What comes out is a :class:`~dfairpca.stats._sums.Sums`
whose matrices are those upper triangles: :meth:`dfairpca.Moments.from_chunk` completes
them, a pass folds them into its running float64 panels as they are.

Range: the products of values far from 1 underflow or overflow (float32 squares of 1e-30
are 0; float64 squares of 1e-170 too).  A chunk whose products left the range where they
are exact (:func:`_product_range`) is redone with every column scaled by a power of two
(exact), and a scatter matrix beyond float64's comfortable range is kept as
``true = stored * 4**scatter_exponent``.  Data of ordinary magnitude never takes that
path: it costs one look at the diagonal per chunk.  Offset data (a column's mean far
from 0 in units of its spread) gets its means refined by a second sum (:func:`_refined`).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ..base._blas import blas_lock, syrk
from ._exact import ExactSums, check_unweighted, exact_chunk_sums, is_exact
from ._sums import MAX_BAD_ROWS_REPORTED, STORED_RANGE_BITS, TRUE_UNITS_BITS, GroupSums, Sums
from ..base._system import BLOCK_BYTES, PRODUCT_BLOCK_BYTES
from ..errors import InvalidInputError
from ..inputs._weights import check_weight_values

__all__ = ["chunk_sums", "drop_nonfinite", "group_sums", "OVERFLOW_MESSAGE", "OFFSET_BITS"]

#: a chunk of 64-bit values with a column whose mean is over 2**OFFSET_BITS of its spread
#: from 0 gets a second float64 sum of the centred values (:func:`_refined`): its group
#: deviations are then exact to the spread's rounding, not the offset's.  Ordinary data
#: (pixels: mean about 2 sd) never pays for it, nor do inputs of 32 bits or less, whose
#: float64 sums are exact when the values share a binade (as an offset makes them).
OFFSET_BITS = 6
#: what a fit says when X's sums overflow float64 (values of about 1e300 and more)
OVERFLOW_MESSAGE = ("X holds values too large for float64 sums (the statistics overflow); divide X "
                    "by a constant (e.g. a power of two) before fitting")


def chunk_sums(x, codes, categories: Sequence[np.ndarray], *, mask, row_offset: int, dtype,
               group_scatter: bool, weights=None, into: ExactSums | None = None) -> Sums | ExactSums:
    """Sums of one chunk of rows; the arguments are :meth:`dfairpca.Moments.from_chunk`'s,
    all given (their defaults are that method's), ``weights`` its ``sample_weight``.  The
    one kernel of every pass: float products here, exact integer sums
    (``dtype="exact"``) by :func:`dfairpca.stats._exact.exact_chunk_sums`, to which
    ``into`` (a running total to add the chunk to in place) is handed.

    The matrices are F-ordered (d, d) upper triangles (what lies below the diagonal is
    undefined) in ``dtype``, or in float64 for a chunk of extreme magnitude; a group
    without rows has None for its scatter.  Weighted rows (frequency weights: a row of
    weight w counts as w copies of itself) make n and the group counts float64 totals of
    the weights (``Sums.n_rows`` keeps the rows of positive weight), the means weighted
    means and the products ``sum w (x - m)(x - m)^T``, syrk of the rows
    ``(x - m) * sqrt(w)``; rows of weight 0 are left out like rows outside the mask
    (their NaN are still reported).
    """
    check_unweighted(dtype, weights is not None)
    if is_exact(dtype):  # integer data summed exactly (compute_dtype="exact"): its own module
        return exact_chunk_sums(x, codes, categories, mask=mask, group_scatter=group_scatter, into=into)
    x = np.asarray(x)
    if x.ndim > 2:
        x = x.reshape(x.shape[0], -1)
    w = None if weights is None else check_weight_values(weights, x.shape[0], row_offset)
    dtype = np.dtype(dtype or np.float64)
    d = x.shape[1]
    keep = np.ones(x.shape[0], bool) if w is None else w > 0
    if mask is not None:
        keep &= np.asarray(mask, bool)
    n_bad, bad_rows = drop_nonfinite(x, keep, row_offset)
    if not keep.all():
        x = x[keep]
        w = None if w is None else w[keep]
        codes = None if codes is None else np.asarray(codes)[keep]
    count = np.int64 if w is None else np.float64  # rows, or their total weight
    attrs = [GroupSums(np.asarray(c), np.zeros(len(c), count), np.zeros((len(c), d)),
                       [None] * len(c) if group_scatter else None) for c in categories]
    out = Sums(count(0).item(), np.zeros(d), None, attrs, n_bad, bad_rows, float(np.finfo(dtype).eps),
               n_rows=None if w is None else int(x.shape[0]))
    r = x.shape[0]
    if r == 0:
        out.scatter = np.zeros((d, d), order="F")
        return out
    out.n = r if w is None else float(w.sum())
    total = x.sum(axis=0, dtype=np.float64) if w is None else _weighted_total(x, w)
    out.mean = total / out.n
    shifts = []  # (attribute, group, row selector of the chunk) for the group scatters
    if codes is not None:
        codes = np.asarray(codes).reshape(r, -1)
        for j, att in enumerate(out.attributes):
            cj = codes[:, j]
            att.counts, att.deviation = _group_deviations(x, w, cj, att.n_groups, total, out.mean)
            if group_scatter:
                shifts += [(att, g, cj == g) for g in np.flatnonzero(att.counts)]
    sw = None if w is None else np.sqrt(w)
    acc, gacc, centres = _products(x, out.mean, shifts, dtype, sw=sw)
    if not _in_range(x, acc, gacc, shifts, dtype):
        # values so small or large that their products left the dtype's exact range:
        # again, every column scaled by a power of two (exact), into float64
        acc, gacc, out.scatter_exponent, centres = _scaled_products(x, out.mean, shifts, dtype, sw)
    # weighted inputs of 32 bits or less need it too: their products with the weights
    # round, so ``w @ x`` is not exact even when the values share a binade
    if (w is not None or x.dtype.itemsize == 8) and _offset_is_large(out.mean, acc, out.n, out.scatter_exponent):
        acc, gacc = _refined(x, w, codes, out, acc, gacc, shifts, centres)
    if w is not None:
        _exact_constant_means(x, out, acc)
    # a chunk's product is only as precise as its dtype: kept so (half the bytes of float64
    # for float32); merges accumulate in float64
    out.scatter = acc
    for i, (att, g, _) in enumerate(shifts):
        att.scatter[g] = gacc[i]
    return out


def _group_deviations(x, w, cj, m: int, total, mean) -> tuple[np.ndarray, np.ndarray]:
    """(counts (m,), deviations (m, d)) of the rows' groups ``cj``: rows per group (int64)
    and each group's mean minus ``mean``, 0 for an empty group; with weights ``w`` the
    counts are the groups' weights (float64) and the means weighted."""
    if w is None:
        counts = np.bincount(cj, minlength=m).astype(np.int64)
        return counts, _group_means(x, cj, counts, total) - mean * (counts > 0)[:, None]
    counts = np.bincount(cj, weights=w, minlength=m)
    sums = np.zeros((m, x.shape[1]))
    for g in np.flatnonzero(counts):
        sums[g] = _weighted_total(x[cj == g], w[cj == g])
    live = counts > 0
    dev = np.zeros((m, x.shape[1]))
    dev[live] = sums[live] / counts[live, None] - mean
    return counts, dev


def _weighted_total(x, w) -> np.ndarray:
    """``w @ x`` in float64, by row blocks (no float64 copy of the whole chunk)."""
    d = x.shape[1]
    step = max(64, BLOCK_BYTES // (max(d, 1) * 8))
    total = np.zeros(d)
    for s in range(0, x.shape[0], step):
        total += w[s : s + step] @ x[s : s + step].astype(np.float64, copy=False)
    return total


def _exact_constant_means(x, out: Sums, acc) -> None:
    """Set the mean of every column constant over the chunk of weighted rows to its value,
    exactly.

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


def drop_nonfinite(x, keep: np.ndarray, row_offset: int) -> tuple[int, list[int]]:
    """Clear ``keep`` (in place) at the rows of float x holding NaN or inf; return their
    number and the first :data:`MAX_BAD_ROWS_REPORTED` of their global indices (for the
    error the fit raises, :meth:`dfairpca.Moments.check_finite`)."""
    if x.dtype.kind not in "fc":
        return 0, []
    finite = np.isfinite(x).all(axis=1)
    if finite.all():
        return 0, []
    bad = np.flatnonzero(~finite)
    keep &= finite
    return int(bad.size), [int(row_offset + i) for i in bad[:MAX_BAD_ROWS_REPORTED]]


def _products(x, mean, shifts, dtype, exponents=None, sw=None):
    """Upper triangles of ``xc^T xc`` (xc = x - mean) and of every group's product about its
    own mean, in ``dtype``, by row blocks: BLAS syrk accumulates in the compute dtype
    (beta = 1), never materialising a float copy of the chunk.  Also returns the centres
    (overall, per group) the products are about, as :func:`_refined` needs them.

    With ``exponents`` (per column) the rows are ``(x - mean) * 2**-exponents``, centred in
    float64 first (the rare rescaled path of :func:`_scaled_products`).  With ``sw`` (the
    square roots of the rows' weights) the rows are ``(x - mean) * sqrt(w)``: the products
    are ``sum w (x - m)(x - m)^T``, and a group's rows about its own mean are weighted
    before the cast to ``dtype``.
    """
    d, r = x.shape[1], x.shape[0]
    product = syrk(dtype)
    lock = blas_lock()
    # values the dtype holds exactly (uint8 pixels into float32) are centred in it; others
    # (float64 into float32 products) in float64 first: cast first, 1e8 + N(0, 1) would keep
    # nothing of its spread
    work = dtype if exponents is None and np.can_cast(x.dtype, dtype, "safe") else np.dtype(np.float64)
    mu = mean.astype(work)
    acc = np.zeros((d, d), dtype, order="F")
    gacc = [np.zeros((d, d), dtype, order="F") for _ in shifts]
    devs = [att.deviation[g] for att, g, _ in shifts]
    if exponents is not None:
        devs = [np.ldexp(v, -exponents) for v in devs]
    # a group's shift is taken off the cast rows, or off the weighted ones before the cast
    devs = [v.astype(dtype if sw is None else work) for v in devs]
    # the centres the products are about, in float64 (the dtype's roundings of the means)
    centre = mu.astype(np.float64)
    back = (lambda v: np.ldexp(v.astype(np.float64), exponents)) if exponents is not None else (
        lambda v: v.astype(np.float64))
    centres = (centre, [centre + back(v) for v in devs])
    step = max(64, PRODUCT_BLOCK_BYTES // (d * (dtype if sw is None else work).itemsize))
    for s in range(0, r, step):
        xc = np.subtract(x[s : s + step], mu, dtype=work)
        if exponents is not None:
            xc = np.ldexp(xc, -exponents)
        if sw is not None:
            rw = sw[s : s + step, None].astype(work)
            xc *= rw  # (x - m) sqrt(w); a group's rows about its own mean: minus dev sqrt(w)
        xd = xc.astype(dtype, copy=False)
        with lock:
            acc = product(acc, xd)
        for i, (_, _, sel) in enumerate(shifts):
            b = sel[s : s + step]
            xg = xd[b] if sw is None else xc[b]
            if len(xg):
                xg -= devs[i] if sw is None else devs[i] * rw[b]
                with lock:
                    gacc[i] = product(gacc[i], xg.astype(dtype, copy=False))
    return acc, gacc, centres


def _product_range(dtype, rows: int) -> tuple[float, float]:
    """(low, high) for a diagonal entry (a column's sum of r squares) of a product that is
    exact to the dtype's precision and storable: mean square above ``tiny / eps`` (no term
    near the subnormals) and within :data:`STORED_RANGE_BITS`; sum below ``max * eps``."""
    fi = np.finfo(dtype)
    low = rows * max(float(fi.tiny / fi.eps), 2.0 ** -STORED_RANGE_BITS)
    high = min(float(fi.max * fi.eps), 2.0 ** STORED_RANGE_BITS)
    return low, high


def _in_range(x, acc, gacc, shifts, dtype) -> bool:
    """Whether the chunk's products stayed in the exact range (:func:`_product_range`).

    A diagonal entry below the range is fine when its column is constant (over the rows
    of the product): only those few columns are looked at again.
    """
    checks = [(acc, None)] + [(G, sel) for G, (_, _, sel) in zip(gacc, shifts)]
    for G, sel in checks:
        diag = np.diagonal(G).astype(np.float64)
        rows = x.shape[0] if sel is None else int(np.count_nonzero(sel))
        if rows == 0:
            continue
        low, high = _product_range(dtype, rows)
        if not np.all(diag <= high):  # also NaN / inf
            return False
        cols = np.flatnonzero(diag < low)
        if cols.size:
            sub = x[:, cols] if sel is None else x[sel][:, cols]
            if np.any(sub != sub[:1]):
                return False
    return True


def _scaled_products(x, mean, shifts, dtype, sw=None):
    """The products of :func:`_products` for columns scaled by powers of two, as float64
    upper triangles holding ``true * 4**-e``, and e (0 when the true values fit float64's
    :data:`~dfairpca.stats._sums.TRUE_UNITS_BITS`).

    Every column j is divided by ``2**f_j`` with ``2**f_j`` just above its largest
    ``|x - mean|``, so every scaled value is at most 1 and the squares cannot overflow or
    underflow (a column's nonzero deviations are at least its spread times the input's eps).
    ``sw``: the square roots of the rows' weights, as :func:`_products`.
    """
    with np.errstate(over="ignore", invalid="ignore"):
        spread = np.maximum(x.max(axis=0) - mean, mean - x.min(axis=0))
    if not np.all(np.isfinite(spread)):
        raise InvalidInputError(OVERFLOW_MESSAGE)
    f = np.where(spread > 0, np.frexp(spread)[1], 0).astype(np.int64)
    acc, gacc, centres = _products(x, mean, shifts, dtype, exponents=f, sw=sw)
    e = int(f.max())
    w = np.ldexp(1.0, f - e)  # <= 1: per column, back to the common exponent e
    if abs(e) <= TRUE_UNITS_BITS // 2:
        w, e = np.ldexp(w, e), 0

    def back(G):
        S = np.array(G, dtype=np.float64, order="F")
        S *= w[:, None]
        S *= w[None, :]
        return S

    return back(acc), [back(G) for G in gacc], e, centres


def group_sums(x, cj, counts, total) -> np.ndarray:
    """(m, d) float64 sums of the rows of x in each group (``cj``: the rows' groups,
    ``counts`` their sizes, ``total`` the sum of all rows; 0 for an empty group).

    The largest group's sum is the total minus the others': only the smaller groups' rows
    are gathered (7% of a chunk for Eyeglasses, not all of it).
    """
    out = np.zeros((len(counts), x.shape[1]))
    present = np.flatnonzero(counts)
    if present.size == 0:
        return out
    largest = present[np.argmax(counts[present])]
    for g in present:
        if g != largest:
            out[g] = x[cj == g].sum(axis=0, dtype=np.float64)
    out[largest] = total - out.sum(axis=0)
    return out


def _group_means(x, cj, counts, total) -> np.ndarray:
    """(m, d) float64 mean of the rows of x in each group (0 for an empty group)."""
    return group_sums(x, cj, counts, total) / np.maximum(counts, 1)[:, None]


def _offset_is_large(mean, acc, rows: float, e: int) -> bool:
    """Whether some column's mean is more than ``2**OFFSET_BITS`` of its spread from 0.

    Then the float64 sums of the raw values, off by up to ``rows * eps * |mean|``, would
    blur group-mean deviations smaller than that (a gap of 1e-6 sd on a 1e6 sd offset):
    :func:`_refined` sums the centred values again.  Constant columns (spread 0) are exact.
    """
    var = np.diagonal(acc).astype(np.float64) / rows  # in units of 4**e
    mu = np.ldexp(mean, -e)
    return bool(np.any((var > 0) & (mu * mu > 4.0 ** OFFSET_BITS * var)))


def _refined(x, w, codes, out: Sums, acc, gacc, shifts, centres):
    """Means and group deviations from float64 sums of ``x - mean`` (weighted: of
    ``w (x - mean)``), the classic second pass of a two-pass mean, only for chunks far from
    0 (:func:`_offset_is_large`), and the products moved to the refined centres (float64:
    ``S -= n (m - c)(m - c)^T``).

    Updates ``out.mean`` and the attributes' deviations in place; returns (acc, gacc).
    """
    r, d = x.shape
    mu = out.mean
    total = np.zeros(d)
    sums = [np.zeros((a.n_groups, d)) for a in out.attributes]
    step = max(64, BLOCK_BYTES // (d * 8))
    for s in range(0, r, step):
        xc = np.subtract(x[s : s + step], mu, dtype=np.float64)
        if w is not None:
            xc *= w[s : s + step, None]
        part = xc.sum(axis=0)
        total += part
        for j, a in enumerate(out.attributes):
            cj = codes[s : s + step, j]
            if w is None:
                counts = np.bincount(cj, minlength=a.n_groups)
                sums[j] += _group_means(xc, cj, counts, part) * counts[:, None]
            else:
                for g in np.unique(cj):
                    sums[j][g] += xc[cj == g].sum(axis=0)
    group_n = [int(np.count_nonzero(sel)) if w is None else float(w[sel].sum()) for _, _, sel in shifts]
    return recentred(out, acc, gacc, shifts, centres, total, sums, out.n, group_n)


def recentred(out: Sums, acc, gacc, shifts, centres, total, sums, n, group_n):
    """The end of :func:`_refined`: ``out``'s mean and group
    deviations from the sums of the centred rows ``total`` (d,) and ``sums`` (per attribute,
    (m, d)) over ``n`` rows (or their weight), and the products moved to those centres
    (``S -= n (m - c)(m - c)^T``; ``group_n``: the rows or weight of each product in
    ``shifts``).  Updates ``out`` in place; returns (acc, gacc)."""
    delta = total / n
    out.mean = out.mean + delta
    for j, a in enumerate(out.attributes):
        live = a.counts > 0
        a.deviation[live] = sums[j][live] / a.counts[live, None] - delta

    e = out.scatter_exponent

    def moved(G, rows, c, m):
        G = np.array(G, dtype=np.float64, order="F")
        v = np.ldexp(m - c, -e)
        G -= rows * np.outer(v, v)  # about the mean m instead of c (the upper half counts)
        return G

    acc = moved(acc, n, centres[0], out.mean)
    gacc = [moved(G, k, c, out.mean + att.deviation[g])
            for G, k, c, (att, g, _) in zip(gacc, group_n, centres[1], shifts)]
    return acc, gacc
