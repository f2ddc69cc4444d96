"""A pass's running total, and the three steps of the reduction that builds it.

The steps are named as :func:`dask.array.reduction` names its callables:

``chunk(x, codes, categories, *, mask, row_offset, dtype, group_scatter, weights=None) -> Sums``
    Applied to every row chunk (arguments as :meth:`dfairpca.Moments.from_chunk`, the
    rows' sample weights as ``weights``): its sums, the products left as upper triangles
    in the compute dtype (float32 for images).  :func:`fold` adds them to a running total.
``combine(parts: list[RunningTotal | Sums]) -> RunningTotal``
    The intermediate aggregation: the sums of the union of ``parts``, added in place into
    the first part's panels when it is a :class:`RunningTotal` (a chain folds each chunk
    into one float64 sum; a merge of chains into the first chain's), otherwise into new
    panels.  The parts must not be used again.
``RunningTotal.finalize() -> Moments``
    The last step: the panels completed into full symmetric float64 matrices.  Dask's
    ``aggregate`` is ``combine`` then this; the engine runs the last ``combine`` on the
    cluster and ``finalize`` on the client, so that only the upper triangle travels.

The running matrices are :class:`UpperPanels`: the upper triangle of a symmetric d x d
float64 matrix, what ``syrk`` writes, in half the memory and half the bytes on the wire.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
import json
from pathlib import Path

import numpy as np
import scipy.linalg.blas

from ..stats._chunk import chunk_sums
from ..stats._exact import ExactSums, is_exact, merge_exact, nbytes as exact_nbytes
from ..stats._sums import GroupSums, Sums, fill_lower, merge_sums, nbytes
from ..stats.moments import AttributeMoments, Moments, exact_moments
from ..io import (categories_from_json, categories_to_json, read_capped, read_saved, save_arrays,
                  saved_fields, saved_layout, sums_to_arrays)
from ..inputs._weights import check_total_weight
from ..errors import InvalidInputError

# Deferred imports: dask (heavy or optional) and package modules that load such libraries, or this
# module, at import are imported in the functions that use them, so that importing this module stays
# light.

__all__ = ["chunk", "fold", "combine", "RunningTotal", "ExactTotal", "UpperPanels", "load_total"]

#: columns per panel of :class:`UpperPanels`
PANEL_WIDTH = 512

#: the first step: one row chunk's sums (see the module docstring)
chunk = chunk_sums


class UpperPanels:
    """The upper triangle of a symmetric d x d float64 matrix, stored by column panels.

    Panel i holds rows ``0 .. e_i`` of columns ``s_i .. e_i`` (column-major), so the
    storage is ``d^2 / 2 + d * width / 2`` doubles (177 MB at d = 6,400 against 328 MB for
    the full matrix), every update is a vectorised add per panel and the rank-p Chan
    correction a small product per panel.
    """

    __slots__ = ("d", "width", "data")

    def __init__(self, d: int, width: int | None = None, data: np.ndarray | None = None):
        self.d, self.width = int(d), int(width or PANEL_WIDTH)
        size = self.size(self.d, self.width)
        self.data = np.zeros(size) if data is None else data
        if self.data.shape != (size,) or self.data.dtype != np.float64:
            raise InvalidInputError("UpperPanels data has the wrong size or dtype")

    @staticmethod
    def size(d: int, width: int) -> int:
        """Doubles the panels of a d x d matrix take."""
        return sum(e * (e - s) for s, e in _panel_bounds(d, width))

    @property
    def nbytes(self) -> int:
        return self.data.nbytes

    def panels(self):
        """(s, e, view) for every panel; ``view`` is ``S[:e, s:e]`` (float64, writable)."""
        off = 0
        for s, e in _panel_bounds(self.d, self.width):
            size = e * (e - s)
            yield s, e, self.data[off : off + size].reshape(e, e - s, order="F")
            off += size

    @classmethod
    def from_upper(cls, M) -> "UpperPanels":
        """Panels holding the upper triangle of M (any float dtype; a copy)."""
        if isinstance(M, UpperPanels):
            return cls(M.d, M.width, M.data.copy())
        return cls(M.shape[0]).add(M)

    def add(self, M) -> "UpperPanels":
        """``self += M`` on the upper triangle; M is UpperPanels or a (d, d) array whose upper
        triangle is valid (its strictly lower part is ignored, whatever it holds)."""
        if isinstance(M, UpperPanels):
            if M.width == self.width:
                self.data += M.data
                return self
            M = M.to_full()
        for s, e, P in self.panels():
            P += M[:e, s:e]
        return self

    def add_gram(self, A: np.ndarray) -> "UpperPanels":
        """``self += A^T A`` for a small (p, d) A (the Chan correction of a merge)."""
        A = np.asarray(A, dtype=np.float64)
        for s, e, P in self.panels():  # BLAS adds straight into the panel, no temporary
            out = scipy.linalg.blas.dgemm(1.0, A[:, :e], A[:, s:e], beta=1.0, c=P, trans_a=1,
                                          overwrite_c=1)
            if out is not P and not np.shares_memory(out, P):
                P[...] = out
        return self

    def diagonal(self) -> np.ndarray:
        return np.concatenate([np.diagonal(P[s:e]) for s, e, P in self.panels()])

    def to_full(self, out: np.ndarray | None = None) -> np.ndarray:
        """The symmetric (d, d) float64 matrix, in ``out`` if given (the panels are not
        changed)."""
        S = np.empty((self.d, self.d), order="F") if out is None else out
        for s, e, P in self.panels():
            S[:e, s:e] = P
        return fill_lower(S)

    def __reduce__(self):
        return (UpperPanels, (self.d, self.width, self.data))


def _panel_bounds(d: int, width: int) -> list[tuple[int, int]]:
    return [(s, min(d, s + width)) for s in range(0, d, width)]


class _Panels:
    """The store of a running total (see :class:`dfairpca.stats._sums.Store`): its own matrices
    are :class:`UpperPanels`, updated in place; it reads the upper triangle of anything."""

    def zero_matrix(self, d):
        return UpperPanels(d)

    def diagonal(self, M):
        return M.diagonal() if isinstance(M, UpperPanels) else np.diagonal(M).astype(np.float64)

    def scaled(self, M, shift, in_place):
        if shift == 0:
            return M
        if isinstance(M, UpperPanels):
            if in_place:
                np.ldexp(M.data, shift, out=M.data)
                return M
            return UpperPanels(M.d, M.width, np.ldexp(M.data, shift))
        return np.ldexp(np.asarray(M, dtype=np.float64), shift)

    def add(self, mats, A, in_place):
        first = mats[0]
        out = first if in_place and isinstance(first, UpperPanels) else UpperPanels.from_upper(first)
        for M in mats[1:]:
            out.add(M)
        return out.add_gram(A)

    def groups(self, mats, d):
        return mats


_PANELS = _Panels()


@dataclass
class RunningTotal(Sums):
    """The sums of the rows a pass has seen so far (the fields of :class:`Sums`): the
    scatter as :class:`UpperPanels`, every group's scatter in a list of them (None for a
    group without rows yet)."""

    def finalize(self) -> Moments:
        """The complete :class:`~dfairpca.stats.moments.Moments`.  Hands the group scatters
        over: their panels are freed one by one as each is completed, so the running total
        is spent afterwards (the peak is one d x d matrix above the result).  Weighted rows
        of which none has a positive weight (Dask weights, whose values only the pass sees)
        are refused here, before anything is handed over."""
        check_total_weight(self)
        d = self.mean.shape[0]
        attrs = []
        for a in self.attributes:
            sc = None
            if a.scatter is not None:
                sc = np.zeros((a.n_groups, d, d))
                for g in range(a.n_groups):
                    _full(a.scatter[g], d, out=sc[g])
                    a.scatter[g] = None
            attrs.append(AttributeMoments(a.categories, a.counts, a.deviation, sc))
        return Moments(self.n, self.mean, _full(self.scatter, d), attrs, self.n_nonfinite,
                       list(self.nonfinite_rows), self.precision, self.scatter_exponent, self.n_rows)

    def save(self, path, *, overwrite: bool = False) -> None:
        """Save as a checkpoint keeps it: the scatter as its panels (half the bytes), the
        group scatters complete; a ``Moments`` directory that :meth:`load` reads back."""
        d = self.mean.shape[0]
        arrays, meta = sums_to_arrays(self, lambda a: np.stack([_full(M, d) for M in a.scatter]))
        arrays["scatter_panels"] = self.scatter.data
        meta["panel_width"] = self.scatter.width
        save_arrays(path, arrays, {"kind": "Moments", **meta}, overwrite=overwrite)

    @classmethod
    def load(cls, path) -> "RunningTotal":
        """Read what :meth:`save` wrote, or statistics saved complete (a checkpoint of
        version 1, or any saved ``Moments``), as a running total to add to."""
        arrays, meta = read_saved(path, _saved_layout)
        f = saved_fields(arrays, meta)
        d = f["mean"].shape[0]
        if "scatter_panels" in arrays:
            scatter = UpperPanels(d, int(meta["panel_width"]),
                                  np.array(arrays["scatter_panels"], dtype=np.float64))
        else:
            scatter = UpperPanels.from_upper(np.asarray(arrays["scatter"]))
        attrs = [GroupSums(c, counts, dev, None if sc is None else
                           [UpperPanels.from_upper(sc[g]) if counts[g] else None for g in range(len(c))])
                 for c, counts, dev, sc in f.pop("attributes")]
        return cls(scatter=scatter, attributes=attrs, **f)


@dataclass
class ExactTotal(ExactSums):
    """The running total of an exact pass (``compute_dtype="exact"``): the raw integer
    sums of :class:`~dfairpca.stats._exact.ExactSums`, added in place."""

    def finalize(self) -> Moments:
        """The complete :class:`~dfairpca.stats.moments.Moments`, keeping these sums."""
        return exact_moments(self)

    def save(self, path, *, overwrite: bool = False) -> None:
        """Save as a checkpoint keeps it (meta.json's ``kind`` "ExactSums")."""
        arrays, meta = self.to_arrays()
        for j, a in enumerate(self.attributes):
            arrays[f"exact_counts_{j}"] = a.counts
        meta.update(n_attributes=len(self.attributes),
                    categories=[categories_to_json(a.categories) for a in self.attributes])
        save_arrays(path, arrays, {"kind": "ExactSums", **meta}, overwrite=overwrite)

    @classmethod
    def load(cls, path) -> "ExactTotal":
        """Read what :meth:`save` wrote, checked (SavedFileError says what is wrong)."""
        from ..io import SavedFileError, header_shape, load_arrays, meta_value

        def layout(meta, headers):
            p = meta_value(meta, "n_attributes", "count")
            (d,) = header_shape(headers, "exact_sum", 1)
            specs = {"exact_n": ((), "iu"), "exact_sum": ((d,), "i"), "exact_gram": ((d, d), "i")}
            for j in range(p):
                (m,) = header_shape(headers, f"exact_counts_{j}", 1)
                specs[f"exact_counts_{j}"] = ((m,), "i")
                specs[f"exact_group_sum_{j}"] = ((m, d), "i")
                specs[f"exact_group_gram_{j}"] = ((m, d, d), "?i")
            return specs

        arrays, meta = load_arrays(path, kind="ExactSums", layout=layout)
        cats = [categories_from_json(c) for c in meta_value(meta, "categories", "list")]
        counts = [np.asarray(arrays[f"exact_counts_{j}"]) for j in range(len(cats))]
        out = cls.from_arrays(arrays, meta, cats, counts)
        if out is None:  # the layout above requires the raw sums
            raise SavedFileError(f"cannot load {str(path)!r}: it holds no exact sums")
        if out.n < 0 or any((k < 0).any() or int(k.sum()) != out.n for k in counts):
            raise SavedFileError(f"cannot load {str(path)!r}: the group counts of the exact sums "
                                 "do not add up to n; it was edited or not written by dfairpca")
        assert isinstance(out, cls)  # from_arrays builds its own class
        return out


def fold(acc, x, codes, mask, row_offset: int, weights=None, *, categories, dtype, group_scatter: bool):
    """``acc`` plus the sums of one chunk of rows (acc None: a new running total of the
    chunk's), added in place; the arguments as :func:`chunk`'s, the chunk's own (its
    rows' codes, mask, offset and weights) before the pass's.  Exact sums add the
    chunk's products straight into the total's Grams (no d x d array per chunk)."""
    kw = dict(mask=mask, row_offset=row_offset, dtype=dtype, group_scatter=group_scatter, weights=weights)
    in_place = is_exact(dtype) and (acc is None or isinstance(acc, ExactTotal))
    if not in_place:  # float sums: the chunk's, merged into the running total's panels
        part = chunk(x, codes, categories, **kw)
        return combine([part] if acc is None else [acc, part])
    into = acc if acc is not None else ExactTotal.no_rows(int(np.prod(np.shape(x)[1:])), categories, group_scatter)
    out = chunk(x, codes, categories, into=into, **kw)
    assert isinstance(out, ExactTotal)  # `into` itself, or its merge with the chunk (its class)
    return out


def combine(parts: list) -> "RunningTotal | ExactTotal":
    """The running total of the union of ``parts`` (see the module docstring); of exact
    integer sums (``compute_dtype="exact"``) their sum, an :class:`ExactSums`."""
    if isinstance(parts[0], ExactSums):
        exact = merge_exact(parts, in_place=isinstance(parts[0], ExactTotal))
        return ExactTotal(**{f.name: getattr(exact, f.name) for f in fields(ExactSums)})
    s = merge_sums(parts, _PANELS, in_place=isinstance(parts[0], RunningTotal))
    return RunningTotal(**{f.name: getattr(s, f.name) for f in fields(Sums)})


def load_total(path):
    """A running total saved by ``save``: a :class:`RunningTotal`, or the
    :class:`ExactSums` of an exact pass (told apart by meta.json's kind)."""
    try:  # a regular file, read to a cap: a pipe or a device in its place never ends
        kind = json.loads(read_capped(Path(path) / "meta.json")).get("kind")
    except (OSError, ValueError, AttributeError):
        kind = None  # RunningTotal.load says what is wrong
    return ExactTotal.load(path) if kind == "ExactSums" else RunningTotal.load(path)


def _full(M, d: int, out: np.ndarray | None = None) -> np.ndarray:
    """The symmetric float64 matrix of running storage (panels, an upper triangle; None:
    zeros), in ``out`` if given."""
    if M is None:
        return np.zeros((d, d)) if out is None else out
    if isinstance(M, UpperPanels):
        return M.to_full(out)
    if out is None:
        return fill_lower(np.array(M, dtype=np.float64))
    out[...] = M
    return fill_lower(out)


def _saved_layout(meta: dict, headers: dict) -> dict:
    """The saved form of a running total (see :func:`dfairpca.io.load_arrays`)."""
    from ..io import meta_value

    specs, d = saved_layout(meta, headers)
    if "scatter_panels" in headers:
        width = meta_value(meta, "panel_width", "positive")
        specs["scatter_panels"] = ((UpperPanels.size(d, width),), "f")
    else:  # saved complete
        specs["scatter"] = ((d, d), "f")
    return specs


def _register_sizeof():
    """Tell Dask what a running total weighs (else it counts 56 bytes and never spills or
    weighs transfers when placing merges)."""
    from dask.sizeof import sizeof

    sizeof.register(RunningTotal)(nbytes)
    sizeof.register(ExactSums)(exact_nbytes)
    sizeof.register(UpperPanels)(lambda p: int(p.nbytes))


_register_sizeof()
