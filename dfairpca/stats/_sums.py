"""Additive sums of rows and their pairwise merge, whatever holds the (d, d) matrices.

:class:`Sums` has the fields of :class:`dfairpca.stats.moments.Moments`: n, the mean, the
scatter about the mean and, per group of every protected attribute, the count, the mean's
deviation from the overall mean and optionally the group's own scatter.  Three things
hold such sums: one chunk's products (:func:`dfairpca.stats._chunk.chunk_sums`, upper triangles
in the product's dtype), a pass's running total (``dfairpca.engine._accumulator``, upper-triangle
float64 panels updated in place) and :class:`~dfairpca.stats.moments.Moments` (complete
symmetric float64 arrays).  :func:`merge_sums` combines any of them; a *store* says how
the result holds its matrices (:data:`DENSE`: complete arrays).

Numerics: every part keeps its scatter about *its own* mean and parts are combined with
the pairwise update of Chan, Golub & LeVeque (1979), so nothing ever forms
``E[xx^T] - E[x]E[x]^T`` (the cancellation behind faiss #773 and scikit-learn PR #28581).
Group means are kept as deviations from the part's mean, which keeps them exact when the
data has a large offset.  A scatter beyond float64's comfortable range is kept as
``true = stored * 4**scatter_exponent`` (:func:`merged_exponent`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, Sequence

import numpy as np
import scipy.linalg.blas
from ..errors import InvalidInputError
# how many offending row indices the statistics remember for the error message (as the
# weights' check names them)
from ..inputs._weights import MAX_BAD_ROWS_REPORTED

__all__ = ["Sums", "GroupSums", "Store", "DENSE", "merge_sums", "merged_exponent", "fill_lower", "nbytes",
           "MAX_BAD_ROWS_REPORTED", "STORED_RANGE_BITS", "TRUE_UNITS_BITS"]

#: the float64 scatter matrices are kept within 2**(+-STORED_RANGE_BITS) per row (column
#: spreads of about 1e-90 to 1e90): squares of what is stored neither underflow nor
#: overflow in the solves, whose products of two such matrices then stay in range too
STORED_RANGE_BITS = 600
#: a scatter whose true values are within 2**(+-TRUE_UNITS_BITS) is stored as it is
#: (``scatter_exponent == 0``); beyond, stored scaled (see ``Moments.scatter_exponent``)
TRUE_UNITS_BITS = 400


@dataclass
class GroupSums:
    """Per-group sums of one protected attribute (the fields of ``AttributeMoments``);
    ``scatter`` is indexable by group, an entry None for a group without rows."""

    categories: np.ndarray
    counts: np.ndarray
    deviation: np.ndarray
    scatter: Any = None

    @property
    def n_groups(self) -> int:
        return len(self.categories)


@dataclass
class Sums:
    """The fields of ``Moments``, with the matrices in whatever form a store holds them."""

    n: int | float  # rows, or their total weight for weighted sums
    mean: np.ndarray
    scatter: Any
    attributes: list = field(default_factory=list)
    n_nonfinite: int = 0
    nonfinite_rows: list = field(default_factory=list)
    precision: float = float(np.finfo(np.float64).eps)
    scatter_exponent: int = 0
    #: rows of positive weight, for sums of weighted rows (whose ``n`` and group ``counts``
    #: are then float64 totals of the weights); None for unweighted sums, whose n counts rows
    n_rows: int | None = None


class Store(Protocol):
    """How :func:`merge_sums` holds the matrices of its result (``M`` below).

    The parts' matrices it is given may be of any form the store reads: its own ``M``,
    complete symmetric arrays, or upper triangles in a float dtype for a store that reads
    only upper triangles.
    """

    def zero_matrix(self, d: int) -> Any:
        """The (d, d) zero matrix."""

    def diagonal(self, M) -> np.ndarray:
        """M's diagonal in float64."""

    def scaled(self, M, shift: int, in_place: bool) -> Any:
        """``M * 2**shift`` (exact); in place if ``in_place`` and M is the store's own."""

    def add(self, mats: list, A: np.ndarray, in_place: bool) -> Any:
        """``sum(mats) + A^T A`` (A: (parts, d)); into ``mats[0]`` if ``in_place`` and it
        is the store's own."""

    def groups(self, mats: list, d: int) -> Any:
        """The per-group scatters of an attribute from a list of matrices (None: no rows)."""


class _Dense:
    """Complete symmetric float64 arrays, never changed in place (``Moments``)."""

    def zero_matrix(self, d):
        return np.zeros((d, d))

    def diagonal(self, M):
        return np.diagonal(M).astype(np.float64)

    def scaled(self, M, shift, in_place):
        return M if shift == 0 else np.ldexp(np.asarray(M, dtype=np.float64), shift)

    def add(self, mats, A, in_place):
        out = np.array(_fortran(mats[0]), dtype=np.float64, order="F")
        for M in mats[1:]:
            out += _fortran(M)
        # the correction straight into out (BLAS, beta = 1): no d x d temporary
        return scipy.linalg.blas.dgemm(1.0, A, A, beta=1.0, c=out, trans_a=1, overwrite_c=1)

    def groups(self, mats, d):
        out = np.zeros((len(mats), d, d))
        for g, M in enumerate(mats):
            if M is not None:
                out[g] = M
        return out


#: the store of :class:`~dfairpca.stats.moments.Moments`
DENSE = _Dense()


def _fortran(M: np.ndarray) -> np.ndarray:
    """The full symmetric M laid out column-major without a copy where possible (in
    row-major order it is its own transpose)."""
    if M.flags.f_contiguous:
        return M
    if M.flags.c_contiguous:
        return M.T
    return np.asfortranarray(M)


def fill_lower(S: np.ndarray, block: int = 512) -> np.ndarray:
    """Symmetric float64 matrix from the upper triangle of S (in place when S is float64).

    Copies the strictly upper part onto the lower one block column by block column, one
    pass over the matrix and no d x d temporary.
    """
    S = np.asarray(S, dtype=np.float64)
    d = S.shape[0]
    for j in range(0, d, block):
        e = min(d, j + block)
        B = S[j:e, j:e]
        B[...] = np.triu(B) + np.triu(B, 1).T
        S[e:, j:e] = S[j:e, e:].T
    return S


def merge_sums(parts: Sequence, store: Store, *, in_place: bool = False) -> Sums:
    """Sums of the union of the rows of ``parts``, the matrices held by ``store``.

    ``parts`` have the fields of :class:`Sums` (``Moments``, a chunk's sums, a running
    total), the same features and attributes; they may have seen different group labels,
    which are aligned onto the sorted union.  Parts with ``n == 0`` contribute only their
    NaN bookkeeping.  Group scatters are kept only if every part has them.  With
    ``in_place`` the first part's matrices (if the store's own) are updated where they lie
    and become the result's: the caller must not use that part again.
    """
    parts = list(parts)
    if not parts:
        raise InvalidInputError("merge() needs at least one Moments")
    d = parts[0].mean.shape[0]
    p = len(parts[0].attributes)
    for q in parts:
        if q.mean.shape[0] != d:
            raise InvalidInputError(f"cannot merge statistics of {q.mean.shape[0]} and {d} features")
        if len(q.attributes) != p:
            raise InvalidInputError(
                f"cannot merge statistics of {len(q.attributes)} and {p} protected attributes"
            )
    group_scatter = p > 0 and all(a.scatter is not None for q in parts for a in q.attributes)
    # weighted parts carry float totals of weights in n and the group counts; an unweighted
    # part merged with them is the same as weights of 1 (its n counts its rows)
    weighted = any(q.n_rows is not None for q in parts)
    rows = sum(q.n if q.n_rows is None else q.n_rows for q in parts) if weighted else None
    count_type = np.float64 if weighted else np.int64
    aligned = [_aligned(parts, j, count_type) for j in range(p)]
    n_bad = sum(q.n_nonfinite for q in parts)
    bad_rows = sorted(r for q in parts for r in q.nonfinite_rows)[:MAX_BAD_ROWS_REPORTED]
    live = [i for i, q in enumerate(parts) if q.n > 0]
    if not live:
        attrs = [GroupSums(cats, np.zeros(len(cats), count_type), np.zeros((len(cats), d)),
                           store.groups([None] * len(cats), d) if group_scatter else None)
                 for cats, *_ in aligned]
        return Sums(0.0 if weighted else 0, np.zeros(d), store.zero_matrix(d), attrs, n_bad, bad_rows,
                    n_rows=rows)
    L = [parts[i] for i in live]
    ns = np.array([q.n for q in L], dtype=np.float64)
    n = float(ns.sum()) if weighted else int(sum(q.n for q in L))
    # about the first part's mean: parts of one mean merge into exactly that mean (the plain
    # ``ns @ means / n`` rounds when the counts are float weights, and two chunks of equal
    # rows then leave a scatter of rounding that the zero-variance test would have to judge)
    means = np.stack([q.mean for q in L])
    mean = means[0] + (ns @ (means - means[0])) / n
    delta = np.stack([q.mean for q in L]) - mean  # (parts, d): each part's mean minus the new
    own = in_place and live[0] == 0  # the first part's sums are updated in place
    e = merged_exponent(L, delta * np.sqrt(ns)[:, None], store)
    # rare: data far from 1 (see merged_exponent); a shift of 0 leaves a matrix as it is
    shifts = [2 * (q.scatter_exponent - e) for q in L]
    mats = [store.scaled(q.scatter, s, own and i == 0) for i, (q, s) in enumerate(zip(L, shifts))]
    scatter = store.add(mats, np.ldexp(delta, -e) * np.sqrt(ns)[:, None], own)
    attrs = []
    for j, (cats, counts_all, dev_all, local) in enumerate(aligned):
        counts_p = counts_all[live]
        counts = counts_p.sum(axis=0)
        rel = delta[:, None, :] + dev_all[live]  # each part's group means minus the new mean
        weighted = (counts_p[:, :, None] * rel).sum(axis=0)
        dev = np.zeros_like(weighted)
        nz = counts > 0
        dev[nz] = weighted[nz] / counts[nz, None]
        gsc = None
        if group_scatter:
            gmats = [None] * len(cats)
            for g in np.flatnonzero(nz):
                has = [i for i in range(len(L)) if counts_p[i, g] > 0]
                ms = [store.scaled(L[i].attributes[j].scatter[local[live[i], g]], shifts[i],
                                   own and i == 0) for i in has]
                dg = np.ldexp(np.stack([rel[i, g] - dev[g] for i in has]), -e)
                gmats[g] = store.add(ms, dg * np.sqrt(counts_p[has, g].astype(np.float64))[:, None],
                                     own and has[0] == 0)
            gsc = store.groups(gmats, d)
        attrs.append(GroupSums(cats, counts.astype(count_type), dev, gsc))
    return Sums(n, mean, scatter, attrs, n_bad, bad_rows, max(q.precision for q in L), e, rows)


def _aligned(parts: list, j: int, count_type=np.int64):
    """Attribute j of every part over the sorted union of the labels seen:
    ``(labels, counts (P, m), deviation (P, m, d), local (P, m))``, where ``local[i, u]``
    is the index of label u in part i's own (-1 where part i never saw it)."""
    cats = [q.attributes[j].categories for q in parts]
    d = parts[0].mean.shape[0]
    if all(np.array_equal(c, cats[0]) for c in cats):
        m = len(cats[0])
        return (cats[0], np.stack([q.attributes[j].counts for q in parts]),
                np.stack([q.attributes[j].deviation for q in parts]).reshape(len(parts), m, d),
                np.tile(np.arange(m), (len(parts), 1)))
    _check_one_label_type(cats, j)
    union = np.unique(np.concatenate(cats))
    m = len(union)
    counts = np.zeros((len(parts), m), count_type)
    dev = np.zeros((len(parts), m, d))
    local = np.full((len(parts), m), -1)
    for i, (q, c) in enumerate(zip(parts, cats)):
        idx = np.searchsorted(union, c)
        counts[i, idx] = q.attributes[j].counts
        dev[i, idx] = q.attributes[j].deviation
        local[i, idx] = np.arange(len(c))
    return union, counts, dev, local


def _check_one_label_type(cats: list, j: int) -> None:
    """Refuse parts whose labels of attribute j are text in some and numbers in others:
    joined, 1 and '1' would become one group as text, which one fit refuses too
    (:func:`dfairpca.inputs._groups.encode_groups`)."""
    text = [c for c in cats if len(c) and np.asarray(c).dtype.kind in "USO"]
    numbers = [c for c in cats if len(c) and np.asarray(c).dtype.kind not in "USO"]
    if text and numbers:
        a, b = numbers[0][0], text[0][0]
        a = a.item() if isinstance(a, np.generic) else a
        raise InvalidInputError(
            f"the parts' labels of attribute {j} mix types: {a!r} ({type(a).__name__}) in one "
            f"part, {str(b)!r} (str) in another; give every part the labels of one type, e.g. "
            "labels.astype(str) in each call if they are one group"
        )


def merged_exponent(parts: list, A: np.ndarray, store: Store) -> int:
    """``scatter_exponent`` of the merge of ``parts`` whose Chan correction is ``A^T A``.

    0 while every part is in true units and A's squares are exact in float64 (the merges
    of ordinary data); otherwise the exponent of the largest term, or 0 again if that
    is within :data:`TRUE_UNITS_BITS`, so that nothing overflows and the largest
    contributions keep full precision.
    """
    amax = float(np.abs(A).max()) if A.size else 0.0
    band = STORED_RANGE_BITS // 2  # A's squares within the stored range
    if not any(q.scatter_exponent for q in parts) and (amax == 0.0 or 2.0 ** -band <= amax <= 2.0 ** band):
        return 0
    half = TRUE_UNITS_BITS // 2
    tops = [np.frexp(amax)[1]] if amax > 0 else []
    for q in parts:
        top = float(store.diagonal(q.scatter).max()) if q.mean.shape[0] else 0.0
        if top > 0:
            tops.append(q.scatter_exponent + (np.frexp(top)[1] + 1) // 2)
    e = max(tops, default=0)
    return 0 if abs(e) <= half else int(e)


def nbytes(s) -> int:
    """Bytes of the arrays of sums of any store (what Dask's ``sizeof`` should count)."""
    # first-order Moments hold the scatter's diagonal (and its numeric rows) instead of it
    n = s.mean.nbytes + sum(x.nbytes for x in (s.scatter, getattr(s, "diagonal", None),
                                               getattr(s, "cross", None)) if x is not None)
    for a in s.attributes:
        n += a.counts.nbytes + a.deviation.nbytes
        if a.scatter is not None:
            n += sum(0 if x is None else x.nbytes for x in a.scatter)
    return int(n)
