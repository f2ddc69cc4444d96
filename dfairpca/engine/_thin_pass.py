"""The passes of the randomized fit: first-order statistics and ``S V`` for a thin V.

Each pass reads X once, chunk by chunk (numpy and Zarr here, Dask input as the exact pass's
chains of in-place folds on the workers, :mod:`dfairpca.engine._engine`), and sums per chunk
``A^T (A V)`` with A the rows minus a shift s, in the compute dtype, into float64.  The
first pass also sums the first-order statistics about s (a
:class:`~dfairpca.stats.moments.Moments` without the d x d scatter: its diagonal instead); s is the
first rows' mean, so nothing cancels, and :func:`corrected` moves the sums to the mean:
with ``a = mu - s`` the wanted ``sum (x - mu)(x - mu)^T V`` is ``G - n a (a^T V)`` (and
``G + h (b^T V) + b (h^T V) + n b (b^T V)``, ``h = n a``, ``b = s``, about 0 without
centring).  What a worker holds is V, its threads' running sums (d x w each) and the
chunks at hand, independent of n.
"""

from __future__ import annotations

import dataclasses
import threading
from dataclasses import dataclass

import numpy as np

from ._compute import compute
from ._engine import chain_reduce, check_pass_fits, row_slice
from ..base._compat import first_moments_state
from ..base._system import rows_per_block
from ..stats._chunk import group_sums
from ..stats._sums import MAX_BAD_ROWS_REPORTED
from ..stats.moments import AttributeMoments, Moments
from ..errors import InvalidInputError
from ..base._blas import blas_lock
from ..stats._exact import compute_dtype_for

# Deferred imports: dask (heavy or optional) and package modules that load such libraries, or this
# module, at import are imported in the functions that use them, so that importing this module stays
# light.

__all__ = ["Plan", "first_moments", "first_pass", "run_thin_pass", "corrected",
           "as_rows", "statistics_state", "restore_statistics"]

#: the products of values of rms ``2**+-RANGE_BITS[dtype]`` about the shift stay far from
#: overflow and the subnormals in that dtype: rows times ``rms^2 sqrt(d)`` with d up to 1e6
#: and 1e5 rows per block; data beyond it is scaled by a power of two (exact)
RANGE_BITS = {np.dtype(np.float32): 40, np.dtype(np.float64): 400}


class FirstMoments(Moments):
    """What a randomized fit's ``statistics_`` was up to dfairpca 0.2.0, kept so that models
    pickled then still unpickle: the state it held (``sq``, ``exponent``) becomes the
    first-order :class:`Moments` of today (``diagonal``, ``scatter_exponent``, no scatter).
    Nothing creates one any more."""

    def __setstate__(self, state: dict) -> None:
        super().__setstate__(first_moments_state(state))


@dataclass(frozen=True)
class Plan:
    """What every chunk of one pass needs (one key of the graph, shipped once per worker)."""

    shift: np.ndarray  # (D,) float64, representable in dtype
    exponent: int  # rows are (x - shift) * 2**-exponent
    dtype: np.dtype  # of the products
    features: np.ndarray | None  # columns of the projected features (None: all)
    numeric: np.ndarray  # columns of the numeric attributes
    groups: tuple  # groups per attribute (first pass only)
    first: bool  # also the first-order sums
    digest: bool = False  # also every chunk's digest (a checkpointed fit binds its data)


class ThinSums:
    """Running sums of one chain of chunks (added in place by :func:`merge_thin`):
    ``A^T (A V)`` for a thin V and, in the first pass, the first-order sums; unlike
    :class:`dfairpca.stats._sums.Sums`, never a d x d matrix."""

    def __init__(self, plan: Plan, D: int, w: int):
        d = D if plan.features is None else len(plan.features)
        self.n, self.n_bad = 0, 0
        self.bad_rows: list[int] = []
        # (first row, stop row, sha256) of every chunk read, if asked
        self.digests: list[tuple[int, int, str | None]] = []
        self.G = np.zeros((d, w)) if w else None
        first = plan.first
        q = len(plan.numeric)
        self.total = np.zeros(D) if first else None
        self.sq = np.zeros(D) if first else None
        self.counts = [np.zeros(m, np.int64) for m in plan.groups] if first else []
        self.gsums = [np.zeros((m, D)) for m in plan.groups] if first else []
        self.cross = np.zeros((q, D)) if first and q else None


#: each thread's block to centre rows into (:func:`_scratch`)
_SCRATCH = threading.local()


def _scratch(shape, dtype) -> np.ndarray:
    """An uninitialised array that this thread reuses block after block (at most one block,
    ``BLOCK_BYTES``, per thread): a fresh 64 MB array is new pages every time, and their
    faults were a third of the centring's time (Dask workers return freed memory to the OS)."""
    need = int(np.prod(shape)) * np.dtype(dtype).itemsize
    buf = getattr(_SCRATCH, "buf", None)
    if buf is None or buf.nbytes < need:
        buf = _SCRATCH.buf = np.empty(need, np.uint8)
    return buf[:need].view(dtype).reshape(shape)


def _centred(x, shift, exponent: int, dtype, reuse: bool = False) -> np.ndarray:
    """``(x - shift) * 2**-exponent`` in dtype (``reuse``: in this thread's scratch block,
    valid until its next call).  Values the dtype cannot hold exactly (float64 into float32
    products) are centred in float64 first: cast first, 1e8 + N(0, 1) would keep nothing
    of its spread."""
    if np.can_cast(x.dtype, dtype, "safe"):
        out = _scratch(x.shape, dtype) if reuse else None
        a = np.subtract(x, shift.astype(dtype), out=out, dtype=dtype)
    else:
        a = np.subtract(x, shift, dtype=np.float64).astype(dtype, copy=False)
    if exponent:
        np.ldexp(a, -exponent, out=a)
    return a


def _add_first_order(out: ThinSums, a, codes, plan: Plan) -> None:
    """Add a block's first-order sums; a holds the centred rows exactly (any float dtype)."""
    total = a.sum(axis=0, dtype=np.float64)
    out.total += total
    out.sq += np.square(a).sum(axis=0, dtype=np.float64)
    for j, m in enumerate(plan.groups):
        cj = np.asarray(codes[:, j], np.intp)
        counts = np.bincount(cj, minlength=m)
        out.counts[j] += counts
        out.gsums[j] += group_sums(a, cj, counts, total)
    if out.cross is not None:
        out.cross += np.asarray(a[:, plan.numeric], np.float64).T @ np.asarray(a, np.float64)


def _add_byte_sums(out: ThinSums, x, codes, plan: Plan) -> None:
    """Add the first-order sums of 8-bit rows (pixels), exactly and cheaply: integer sums of
    x and x^2 (a third of the time of float sums of the centred rows), moved to the integer
    shift in float64, where every term is an integer below 2**53."""
    s = plan.shift
    acc = np.uint32 if x.dtype.kind in "ub" else np.int32  # holds 2**16 rows of 255**2
    for i in range(0, len(x), 1 << 16):
        xb = x[i : i + (1 << 16)]
        r = len(xb)
        total = xb.sum(axis=0, dtype=acc).astype(np.float64)
        squares = np.einsum("ij,ij->j", xb, xb, dtype=acc).astype(np.float64)
        out.total += total - r * s
        out.sq += squares - 2.0 * s * total + r * s * s
        for j, m in enumerate(plan.groups):
            cj = np.asarray(codes[i : i + r, j], np.intp)
            counts = np.bincount(cj, minlength=m)
            out.counts[j] += counts
            out.gsums[j] += group_sums(xb, cj, counts, total) - counts[:, None] * s


def thin_chunk_sums(x, plan: Plan, V, codes, mask, offset: int) -> ThinSums:
    """The sums of one chunk of rows: the first-order ones (first pass) and ``A^T (A V)``
    (where :func:`dfairpca.stats._chunk.chunk_sums` sums the d x d products)."""
    x = np.asarray(x)
    if x.ndim > 2:
        x = x.reshape(x.shape[0], -1)
    out = ThinSums(plan, x.shape[1], 0 if V is None else V.shape[1])
    if plan.digest:  # the chunk as read, before any row is masked out
        from ._checkpoint_files import array_digest

        out.digests.append((offset, offset + len(x), array_digest(x)))
    if V is None and not plan.first:
        return out  # a read that only binds the data
    keep = None if mask is None else np.asarray(mask, bool)
    if plan.first and x.dtype.kind in "fc":
        finite = np.isfinite(x).all(axis=1)
        if not finite.all():
            bad = np.flatnonzero(~finite if keep is None else ~finite & keep)
            out.n_bad, out.bad_rows = int(bad.size), [int(offset + i) for i in bad[:MAX_BAD_ROWS_REPORTED]]
            keep = finite if keep is None else keep & finite
    if keep is not None and not keep.all():
        x = x[keep]
        codes = None if codes is None else np.asarray(codes)[keep]
    out.n = r = x.shape[0]
    f = plan.features
    # one layout whatever the transport gave (a worker may get V in either order, and
    # BLAS sums A V in another order for each): the same sums on every worker
    Vd = None if V is None else np.ascontiguousarray(V, plan.dtype)
    lock = blas_lock()
    byte = x.dtype.itemsize == 1 and x.dtype.kind in "iub"
    if plan.first and byte and out.cross is None:
        _add_byte_sums(out, x, codes, plan)
        plan = dataclasses.replace(plan, first=False)  # what is left is the product
    # the first pass sums the centred rows as the products see them where those are exact:
    # in float64, and in float32 for 8-bit integers minus an integer shift (differences
    # below 2**9, squares below 2**18, within float32's 24 bits); else a float64 copy
    wide = plan.first and not (plan.dtype == np.float64 or byte)
    step = rows_per_block(x.shape[1] * (8 if wide else plan.dtype.itemsize))
    for s in range(0, r, step):
        xb = x[s : s + step]
        if wide:
            a64 = _centred(xb, plan.shift, plan.exponent, np.float64)
            _add_first_order(out, a64, row_slice(codes, s, s + step), plan)
            a = (a64 if f is None else a64[:, f]).astype(plan.dtype, copy=False)
        elif plan.first:
            a = _centred(xb, plan.shift, plan.exponent, plan.dtype, reuse=True)
            _add_first_order(out, a, row_slice(codes, s, s + step), plan)
            a = a if f is None else a[:, f]
        else:
            a = _centred(xb if f is None else xb[:, f], plan.shift if f is None else plan.shift[f],
                         plan.exponent, plan.dtype, reuse=True)
        if Vd is not None:
            with lock:  # one multi-threaded BLAS product at a time per process, as the exact pass
                out.G += a.T @ (a @ Vd)
    return out


# ----------------------------------------------------------------------------- the passes
def _fold_thin(acc: ThinSums | None, x, plan, V, codes, mask, offset) -> ThinSums:
    """Add one chunk's sums to a chain's running sums (in place) or start the chain."""
    part = thin_chunk_sums(x, plan, V, codes, mask, offset)
    return part if acc is None else merge_thin([acc, part])


def merge_thin(parts: list) -> ThinSums:
    """The sums of the union of the rows of ``parts`` (:class:`ThinSums` of one pass),
    added in place into the first part's arrays (the parts must not be used again)."""
    first = parts[0]
    for other in parts[1:]:
        first.n += other.n
        first.n_bad += other.n_bad
        first.bad_rows = (first.bad_rows + other.bad_rows)[:MAX_BAD_ROWS_REPORTED]
        first.digests += other.digests
        for name in ("G", "total", "sq", "cross"):
            mine = getattr(first, name)
            if mine is not None:
                mine += getattr(other, name)
        for a, b in zip(first.counts + first.gsums, other.counts + other.gsums):
            a += b
    return first


def run_thin_pass(X, plan: Plan, V, codes, mask, split_every: int, progress: bool) -> ThinSums:
    """One pass of the randomized fit over X: the chunks' :class:`ThinSums`, added up (the
    exact fit's pass, :func:`dfairpca.engine._engine.run_moments_pass`, sums d x d statistics).

    numpy (or Zarr) input is read block by block in this process; Dask input is reduced by
    the exact pass's chains (:func:`dfairpca.engine._engine.chain_reduce`), with V and the plan one
    key each, so they travel once per worker.
    """
    import dask.array as da

    if not isinstance(X, da.Array):
        n = X.shape[0]
        rows = rows_per_block(int(np.prod(X.shape[1:])) * X.dtype.itemsize)
        starts = range(0, n, rows)
        if progress:
            from ._engine import with_bar

            starts = with_bar(starts, "pass", "block")
        acc: ThinSums | None = None
        for s in starts:
            e = min(n, s + rows)
            acc = _fold_thin(acc, X[s:e], plan, V, row_slice(codes, s, e), row_slice(mask, s, e), s)
        if acc is None:
            raise InvalidInputError("X has no rows; pass at least one sample")
        return acc

    from dask import delayed

    Vk = None if V is None else delayed(np.ascontiguousarray(V, plan.dtype), pure=True)
    plan_k = delayed(plan, pure=True)
    codes = codes if plan.first else None  # only the first pass sums by group
    return chain_reduce(
        X, _fold_thin, merge_thin,
        lambda s, e: (plan_k, Vk, row_slice(codes, s, e), row_slice(mask, s, e), s),
        split_every=split_every, progress=progress, sums=_thin_sums_bytes(X, V))


def _thin_sums_bytes(X, V) -> int:
    """What a chain of a thin pass holds besides its chunk: its float64 sums of S V and the
    chunk's product A V, d x (V's columns) each."""
    return 16 * int(np.prod(X.shape[1:])) * (1 if V is None else V.shape[1])


def as_rows(X):
    """X as the passes read it: numpy/Zarr as it is, Dask 2-D with whole rows per chunk."""
    import dask.array as da

    if isinstance(X, da.Array):
        if X.ndim < 2:
            raise InvalidInputError(f"X must be 2-D (n, d) or (n, h, w); got shape {X.shape}")
        if any(len(c) > 1 for c in X.chunks[1:]):  # a chunk needs whole rows
            X = X.rechunk({i: -1 for i in range(1, X.ndim)})
        return X.reshape(X.shape[0], -1) if X.ndim > 2 else X
    if not hasattr(X, "shape") or not hasattr(X, "dtype"):
        X = np.asarray(X)
    return X


def _first_rows(X, mask) -> np.ndarray:
    """The first rows, read here to choose the shift: as many as one float64 block holds
    (the shift's float64 temporaries stay at that size)."""
    import dask.array as da

    r = min(X.shape[0], rows_per_block(int(np.prod(X.shape[1:])) * 8))
    if isinstance(X, da.Array):
        r = min(r, X.chunks[0][0])  # one chunk's task, not a slice across chunks
    x = X[:r]
    x = np.asarray(compute(x)[0] if isinstance(x, da.Array) else x)
    x = x.reshape(x.shape[0], -1)
    if mask is not None and np.any(mask[:r]):
        x = x[np.asarray(mask[:r], bool)]
    return x[np.isfinite(x).all(axis=1)] if x.dtype.kind in "fc" else x


def _shift_and_exponent(x0: np.ndarray, D: int, dtype) -> tuple[np.ndarray, int]:
    """The shift (the first rows' mean, rounded to the product dtype so that every pass
    subtracts exactly it) and the power of two that keeps the products in range."""
    if len(x0) == 0:
        return np.zeros(D), 0
    shift = x0.mean(axis=0, dtype=np.float64)
    shift = np.where(np.isfinite(shift), shift, 0.0)
    if x0.dtype.kind in "iub":  # integers minus an integer: exact (see thin_chunk_sums)
        shift = np.round(shift)
    shift = shift.astype(dtype).astype(np.float64)
    with np.errstate(over="ignore", invalid="ignore"):  # squares of 1e-170 are 0: hypot is not
        rms = float(np.hypot.reduce(x0 - shift, axis=0).max() / np.sqrt(len(x0)))
    bits = RANGE_BITS[np.dtype(dtype)]
    if not np.isfinite(rms) or rms == 0 or 2.0 ** -bits <= rms <= 2.0 ** bits:
        return shift, 0
    return shift, int(np.frexp(rms)[1])


def _statistics(sums: ThinSums, plan: Plan, categories, numeric) -> tuple[Moments, np.ndarray]:
    """(the first-order Moments, the mean minus the shift in the products' units) from the
    first pass."""
    n, e = sums.n, plan.exponent
    # the first pass keeps the totals (ThinSums makes them when plan.first)
    assert sums.total is not None and sums.sq is not None
    off = sums.total / max(n, 1)
    with np.errstate(over="ignore"):
        mean = plan.shift + np.ldexp(off, e)
    sq = np.maximum(sums.sq - n * off * off, 0.0)
    attrs = []
    for cats, counts, gs in zip(categories, sums.counts, sums.gsums):
        live = counts > 0
        dev = np.zeros_like(gs)
        dev[live] = np.ldexp(gs[live] / counts[live, None] - off, e)
        attrs.append(AttributeMoments(np.asarray(cats), counts, dev))
    cross = None if sums.cross is None else sums.cross - n * np.outer(off[numeric], off)
    m = Moments(n, mean, None, attrs, sums.n_bad, list(sums.bad_rows), scatter_exponent=e,
                diagonal=sq, numeric=np.asarray(numeric, np.intp), cross=cross)
    return m, off


def first_pass(X, V, codes, categories, mask, numeric, dtype, split_every, progress,
               digest: bool = False):
    """(first-order Moments, mean - shift in the products' units, the plan, the raw sums: ``G`` of
    V and, if ``digest``, the chunks' ``digests``)."""
    import dask.array as da

    D = int(np.prod(X.shape[1:]))
    dtype = compute_dtype_for(X.dtype) if dtype is None else np.dtype(dtype)
    features = np.setdiff1d(np.arange(D), numeric) if len(numeric) else None
    if isinstance(X, da.Array):  # before the first read: the first rows are read as a whole chunk
        check_pass_fits(X, _thin_sums_bytes(X, V))
    shift, e = _shift_and_exponent(_first_rows(X, mask), D, dtype)
    plan = Plan(shift, e, dtype, features, numeric, tuple(len(c) for c in categories), True, digest)
    sums = run_thin_pass(X, plan, V, codes, mask, split_every, progress)
    m, off = _statistics(sums, plan, categories, numeric)
    return m, off, dataclasses.replace(plan, digest=False), sums


def first_moments(X, V=None, *, codes=None, categories=(), mask=None, numeric=(), dtype=None,
                  split_every: int = 8, progress: bool = False):
    """(first-order Moments, ``S V`` or None): the first pass, reading X once.

    ``S V`` is the scatter of the feature columns (numeric attributes left out) about the
    mean, applied to V (d x w).  See :func:`fit_randomized` for the arguments.
    """
    m, off, plan, sums = first_pass(as_rows(X), V, codes, categories, mask,
                                     np.asarray(numeric, np.intp), dtype, split_every, progress)
    return m, None if V is None else corrected(sums.G, V, m, off, plan, center=True)


def corrected(G, V, m: Moments, off, plan: Plan, center: bool) -> np.ndarray:
    """``sum (x - c)(x - c)^T V`` from ``G = sum (x - s)(x - s)^T V`` (module docstring), in the
    products' units; c is the mean, or 0 without centring."""
    f = slice(None) if plan.features is None else plan.features
    a = off[f]  # mean - shift
    if center:
        return G - m.n * np.outer(a, a @ V)
    b = np.ldexp(plan.shift[f], -plan.exponent)  # shift - 0
    h = m.n * a
    return G + np.outer(h, b @ V) + np.outer(b, h @ V) + m.n * np.outer(b, b @ V)


def statistics_state(full: Moments, off, plan: Plan) -> tuple[dict, dict]:
    """(JSON meta, arrays) of the first pass's results, as a checkpoint keeps them (the group
    labels are the job's, bound by its fingerprint)."""
    arrays = {"mean": full.mean, "sq": full.scatter_diagonal, "off": off, "shift": plan.shift}
    if full.cross is not None:
        arrays["cross"] = full.cross
    for j, a in enumerate(full.attributes):
        arrays[f"counts_{j}"], arrays[f"deviation_{j}"] = a.counts, a.deviation
    return {"n": int(full.n), "exponent": int(plan.exponent), "precision": float(full.precision),
            "attributes": len(full.attributes)}, arrays


def restore_statistics(saved: dict, categories, numeric, dtype):
    """(first-order Moments, off, plan) as :func:`statistics_state` saved them."""
    meta, a = saved["meta"], saved["arrays"]
    try:
        attrs = [AttributeMoments(np.asarray(c), a[f"counts_{j}"], a[f"deviation_{j}"])
                 for j, c in enumerate(categories)]
        e = int(meta["exponent"])
        full = Moments(int(meta["n"]), a["mean"], None, attrs, precision=float(meta["precision"]),
                       scatter_exponent=e, diagonal=a["sq"], numeric=np.asarray(numeric, np.intp),
                       cross=a.get("cross"))
        D = len(full.mean)
        features = np.setdiff1d(np.arange(D), numeric) if len(numeric) else None
        plan = Plan(a["shift"], e, np.dtype(dtype), features, np.asarray(numeric, np.intp),
                    tuple(len(c) for c in categories), True)
        return full, a["off"], plan
    except (KeyError, TypeError, ValueError) as exc:
        from ..io import RESAVE_HINT, SavedFileError

        raise SavedFileError(f"cannot load checkpoint {saved['path']!r}: its state lacks "
                             f"{exc}{RESAVE_HINT}") from None
