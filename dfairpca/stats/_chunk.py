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
from ._exact import ExactSums, exact_chunk_sums, is_exact
from ._sums import MAX_BAD_ROWS_REPORTED, STORED_RANGE_BITS, TRUE_UNITS_BITS, GroupSums, Sums
from ..base._system import BLOCK_BYTES, PRODUCT_BLOCK_BYTES
from ..errors import InvalidInputError

__all__ = ["chunk_sums", "OVERFLOW_MESSAGE", "OFFSET_BITS"]

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
               group_scatter: bool) -> Sums | ExactSums:
    """Sums of one chunk of rows; the arguments are :meth:`dfairpca.Moments.from_chunk`'s,
    all given (their defaults are that method's).  Weighted rows have their own:
    :func:`dfairpca.stats._weighted.weighted_chunk_sums`.

    The matrices are F-ordered (d, d) upper triangles (what lies below the diagonal is
    undefined) in ``dtype``, or in float64 for a chunk of extreme magnitude; a group
    without rows has None for its scatter.
    """
    if is_exact(dtype):  # integer data summed exactly (compute_dtype="exact"): its own module
        return exact_chunk_sums(x, codes, categories, mask=mask, group_scatter=group_scatter)
    x = np.asarray(x)
    if x.ndim > 2:
        x = x.reshape(x.shape[0], -1)
    dtype = np.dtype(dtype or np.float64)
    d = x.shape[1]
    keep = np.ones(x.shape[0], bool) if mask is None else np.asarray(mask, bool).copy()
    n_bad, bad_rows = drop_nonfinite(x, keep, row_offset)
    if not keep.all():
        x = x[keep]
        codes = None if codes is None else np.asarray(codes)[keep]
    attrs = [GroupSums(np.asarray(c), np.zeros(len(c), np.int64), np.zeros((len(c), d)),
                       [None] * len(c) if group_scatter else None) for c in categories]
    out = Sums(0, np.zeros(d), None, attrs, n_bad, bad_rows, float(np.finfo(dtype).eps))
    r = x.shape[0]
    if r == 0:
        out.scatter = np.zeros((d, d), order="F")
        return out
    out.n = r
    total = x.sum(axis=0, dtype=np.float64)
    out.mean = total / r
    shifts = []  # (attribute, group, row selector of the chunk) for the group scatters
    if codes is not None:
        codes = np.asarray(codes).reshape(r, -1)
        for j, att in enumerate(out.attributes):
            cj = codes[:, j]
            att.counts = np.bincount(cj, minlength=att.n_groups).astype(np.int64)
            att.deviation = _group_means(x, cj, att.counts, total) - out.mean * (att.counts > 0)[:, None]
            if group_scatter:
                shifts += [(att, g, cj == g) for g in np.flatnonzero(att.counts)]
    acc, gacc, centres = _products(x, out.mean, shifts, dtype)
    if not _in_range(x, acc, gacc, shifts, dtype):
        # values so small or large that their products left the dtype's exact range:
        # again, every column scaled by a power of two (exact), into float64
        acc, gacc, out.scatter_exponent, centres = _scaled_products(x, out.mean, shifts, dtype)
    if x.dtype.itemsize == 8 and _offset_is_large(out.mean, acc, r, out.scatter_exponent):
        acc, gacc = _refined(x, codes, out, acc, gacc, shifts, centres)
    # a chunk's product is only as precise as its dtype: kept so (half the bytes of float64
    # for float32); merges accumulate in float64
    out.scatter = acc
    for i, (att, g, _) in enumerate(shifts):
        att.scatter[g] = gacc[i]
    return out


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


def _products(x, mean, shifts, dtype, exponents=None):
    """Upper triangles of ``xc^T xc`` (xc = x - mean) and of every group's product about its
    own mean, in ``dtype``, by row blocks: BLAS syrk accumulates in the compute dtype
    (beta = 1), never materialising a float copy of the chunk.  Also returns the centres
    (overall, per group) the products are about, as :func:`_refined` needs them.

    With ``exponents`` (per column) the rows are ``(x - mean) * 2**-exponents``, centred in
    float64 first (the rare rescaled path of :func:`_scaled_products`).
    """
    d, r = x.shape[1], x.shape[0]
    product = syrk(dtype)
    lock = blas_lock()
    mu = mean.astype(dtype)
    acc = np.zeros((d, d), dtype, order="F")
    gacc = [np.zeros((d, d), dtype, order="F") for _ in shifts]
    devs = [att.deviation[g] for att, g, _ in shifts]
    if exponents is not None:
        devs = [np.ldexp(v, -exponents) for v in devs]
    devs = [v.astype(dtype) for v in devs]
    # the centres the products are about, in float64 (the dtype's roundings of the means)
    centre = mu.astype(np.float64) if exponents is None and np.can_cast(x.dtype, dtype, "safe") else mean
    back = (lambda v: np.ldexp(v.astype(np.float64), exponents)) if exponents is not None else (
        lambda v: v.astype(np.float64))
    centres = (centre, [centre + back(v) for v in devs])
    step = max(64, PRODUCT_BLOCK_BYTES // (d * dtype.itemsize))
    # values the dtype cannot hold exactly (float64 into float32 products) are centred in
    # float64 first: cast first, 1e8 + N(0, 1) would keep nothing of its spread
    exact = np.can_cast(x.dtype, dtype, "safe")
    for s in range(0, r, step):
        if exponents is None and exact:
            xc = np.subtract(x[s : s + step], mu, dtype=dtype)
        elif exponents is None:
            xc = np.subtract(x[s : s + step], mean, dtype=np.float64).astype(dtype)
        else:
            xc = np.ldexp(np.subtract(x[s : s + step], mean, dtype=np.float64),
                          -exponents).astype(dtype)
        with lock:
            acc = product(acc, xc)
        for i, (_, _, sel) in enumerate(shifts):
            xg = xc[sel[s : s + step]]
            if len(xg):
                xg -= devs[i]
                with lock:
                    gacc[i] = product(gacc[i], xg)
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


def _scaled_products(x, mean, shifts, dtype, products=None):
    """The products of :func:`_products` for columns scaled by powers of two, as float64
    upper triangles holding ``true * 4**-e``, and e (0 when the true values fit float64's
    :data:`~dfairpca.stats._sums.TRUE_UNITS_BITS`).

    Every column j is divided by ``2**f_j`` with ``2**f_j`` just above its largest
    ``|x - mean|``, so every scaled value is at most 1 and the squares cannot overflow or
    underflow (a column's nonzero deviations are at least its spread times the input's eps).
    ``products`` computes them (default :func:`_products`; weighted rows bring their own).
    """
    with np.errstate(over="ignore", invalid="ignore"):
        spread = np.maximum(x.max(axis=0) - mean, mean - x.min(axis=0))
    if not np.all(np.isfinite(spread)):
        raise InvalidInputError(OVERFLOW_MESSAGE)
    f = np.where(spread > 0, np.frexp(spread)[1], 0).astype(np.int64)
    acc, gacc, centres = (products or _products)(x, mean, shifts, dtype, exponents=f)
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


def _group_means(x, cj, counts, total) -> np.ndarray:
    """(m, d) float64 mean of the rows of x in each group (0 for an empty group).

    The largest group's sum is the total minus the others': only the smaller groups' rows
    are gathered (7% of a chunk for Eyeglasses, not all of it).
    """
    out = np.zeros((len(counts), x.shape[1]))
    present = np.flatnonzero(counts)
    if present.size == 0:
        return out
    largest = present[np.argmax(counts[present])]
    rest = np.zeros(x.shape[1])
    for g in present:
        if g != largest:
            out[g] = x[cj == g].sum(axis=0, dtype=np.float64)
            rest += out[g]
    out[largest] = total - rest
    return out / np.maximum(counts, 1)[:, None]


def _offset_is_large(mean, acc, rows: float, e: int) -> bool:
    """Whether some column's mean is more than ``2**OFFSET_BITS`` of its spread from 0.

    Then the float64 sums of the raw values, off by up to ``rows * eps * |mean|``, would
    blur group-mean deviations smaller than that (a gap of 1e-6 sd on a 1e6 sd offset):
    :func:`_refined` sums the centred values again.  Constant columns (spread 0) are exact.
    """
    var = np.diagonal(acc).astype(np.float64) / rows  # in units of 4**e
    mu = np.ldexp(mean, -e)
    return bool(np.any((var > 0) & (mu * mu > 4.0 ** OFFSET_BITS * var)))


def _refined(x, codes, out: Sums, acc, gacc, shifts, centres):
    """Means and group deviations from float64 sums of ``x - mean`` (the classic second pass
    of a two-pass mean, only for chunks far from 0, :func:`_offset_is_large`), and the
    products moved to the refined centres (float64: ``S -= r (m - c)(m - c)^T``).

    Updates ``out.mean`` and the attributes' deviations in place; returns (acc, gacc).
    """
    r, d = x.shape
    mu = out.mean
    total = np.zeros(d)
    sums = [np.zeros((a.n_groups, d)) for a in out.attributes]
    step = max(64, BLOCK_BYTES // (d * 8))
    for s in range(0, r, step):
        xc = np.subtract(x[s : s + step], mu, dtype=np.float64)
        part = xc.sum(axis=0)
        total += part
        for j, a in enumerate(out.attributes):
            cj = codes[s : s + step, j]
            counts = np.bincount(cj, minlength=a.n_groups)
            sums[j] += _group_means(xc, cj, counts, part) * counts[:, None]
    return recentred(out, acc, gacc, shifts, centres, total, sums, r,
                     [int(np.count_nonzero(sel)) for _, _, sel in shifts])


def recentred(out: Sums, acc, gacc, shifts, centres, total, sums, n, group_n):
    """The end of :func:`_refined` (and of its weighted twin): ``out``'s mean and group
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
