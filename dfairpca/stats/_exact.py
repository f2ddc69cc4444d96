"""Exact statistics of integer data (``compute_dtype="exact"``).

Integer (and boolean) rows can be summed without rounding: :class:`ExactSums` holds the
raw integer sums, ``n``, the column sums ``s``, the Gram matrix ``G = X^T X`` and per group
of every attribute its count, sums and optionally its Gram, all int64.  Merging is plain
addition, which is associative: every chunking, worker count, ``partial_fit`` or merge
order gives the same integers, and the centred statistics derived from them
(:meth:`ExactSums.centred`) are bit-identical.

The centring rounds once per entry (:func:`centred`): with ``s_i = n q_i + r_i``
(``0 <= r_i < n``), ``G_ij - s_i s_j / n = T_ij - r_i r_j / n`` where the integer
``T_ij = G_ij - n q_i q_j - q_i r_j - r_i q_j`` is formed in int64, and the result is the
ratio ``(n T_ij - r_i r_j) / n`` of two integers, correctly rounded while the numerator is
below 2**53; larger entries (above about 2**52 / n) are formed as ``T_ij - r_i r_j / n``,
within one unit in the last place (n < 2**31; beyond, two roundings of float64).  A group's mean
deviation ``s_g / n_g - s / n = (n s_g - n_g s) / (n n_g)`` is one division of integers
(while ``n**2 * max|x|`` fits int64).

The bound: the sums must fit int64, ``n * max x**2 < 2**62`` with max over the dtype's
range (:func:`check_exact`, before any pass): uint8 data up to 7e13 rows, int16 2**32
rows; 32-bit integers only hold a handful of rows and are refused.
"""

from __future__ import annotations

import contextlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from ._int_kernels import _add_upper as add_upper
from ._column_sums import column_sums
from ._auto import auto_choice
from ._int_kernels import add_gram, int8_kernel_available, max_product
from ._sums import GroupSums, Sums, _check_one_label_type, fill_lower
from ..base._system import cpu_count
from ..errors import InvalidInputError, RunError

__all__ = ["EXACT", "statistics_dtype", "compute_dtype_for", "kernel_name", "ExactGroups", "ExactSums", "exact_chunk_sums", "merge_exact", "check_exact",
           "check_unweighted", "is_exact", "centred"]

#: the compute dtype of exact statistics
EXACT = "exact"

#: columns per panel of :func:`centred` (512 x 6,400 int64 temporaries: 26 MB each)
CENTRING_PANEL = 512
#: the most threads :func:`centred` runs its panels on
CENTRING_THREADS = 4
#: the width "auto" measures at when a caller gives none (what :func:`statistics_dtype` is
#: asked without the pass's width)
AUTO_WIDTH = 1024
#: the int64 sums keep this many bits of headroom (the centring's intermediates)
_INT_BITS = 62


#: what a fit or a pass says when asked for exact statistics of weighted rows
_WEIGHTED_EXACT_MESSAGE = (
    "compute_dtype='exact' sums integer rows exactly, and weighted rows are not integer sums: "
    "pass compute_dtype='float64' (or 'auto') with sample_weight, or repeat the rows instead "
    "of weighting them")


def is_exact(dtype) -> bool:
    """Whether a compute dtype asks for exact statistics."""
    return isinstance(dtype, str) and dtype == EXACT


def check_unweighted(dtype, weighted: bool) -> None:
    """Refuse exact statistics (``dtype`` "exact") of ``weighted`` rows: the one place
    that says so, for every fit and pass that may be asked for both."""
    if weighted and is_exact(dtype):
        raise InvalidInputError(_WEIGHTED_EXACT_MESSAGE)


def check_exact(dtype, n: float) -> None:
    """Refuse exact statistics of ``n`` rows of ``dtype`` (before any work) unless the
    dtype is integer or boolean and the sums fit int64 (``n`` NaN, a Dask array's rows
    not known yet: the dtype alone)."""
    dtype = np.dtype(dtype)
    if dtype.kind not in "biu":
        raise InvalidInputError(
            f"compute_dtype='exact' sums integer data exactly; X is {dtype}: pass "
            "compute_dtype='float64' (or 'float32') for floating-point data, or convert X to "
            "an integer dtype if its values are integers"
        )
    top = max_product(dtype, shifted=False)
    if n == n and n * top >= 2 ** _INT_BITS:
        raise InvalidInputError(
            f"compute_dtype='exact' cannot sum {n} rows of {dtype} exactly: products of its values "
            f"reach {top:.3g}, and int64 sums hold n * {top:.3g} < 2**{_INT_BITS} only for n < "
            f"{2 ** _INT_BITS // top}; cast X to a narrower integer dtype if its values fit "
            "(e.g. X.astype('int16')), or pass compute_dtype='float64'"
        )


def compute_dtype_for(dtype, requested="auto") -> np.dtype:
    """The float dtype of the products of X of ``dtype`` for ``compute_dtype`` ``requested``
    (the float route of :func:`statistics_dtype`, and the dtype of the projections):
    float64 for float64 and integers of 4 bytes or more, else float32.  "exact" is
    accepted and gives what "auto" does."""
    if isinstance(requested, str) and requested == "exact":
        requested = "auto"
    if requested not in ("auto", None):
        try:
            rd = np.dtype(requested)
        except TypeError:
            rd = None
        if rd not in (np.float32, np.float64):
            raise InvalidInputError("compute_dtype must be 'auto', 'float32', 'float64' or 'exact'; "
                                    f"got {requested!r}")
        return rd
    dtype = np.dtype(dtype)
    if dtype == np.float64 or (dtype.kind in "iu" and dtype.itemsize >= 4):
        return np.dtype(np.float64)
    return np.dtype(np.float32)


def statistics_dtype(x_dtype, requested="auto", width: int | None = None, choose=None, *,
                     weighted: bool = False, matrix_free: bool = False, resumed=None,
                     auto_float=None, auto_exact: bool = True, n: float = 0):
    """The dtype of a fit's pass over X of ``x_dtype`` for the estimators' ``compute_dtype``
    (``requested``), decided here alone.

    "exact" when asked for (refused for float X, and for ``weighted`` rows: weighted sums
    are not integer sums), and for "auto" on 8-bit integers where the exact kernel is not
    slower than float32 products on blocks of ``width`` columns
    (:func:`dfairpca.stats._auto.auto_choice`, or ``choose(x_dtype, width)``: a cluster's
    choice), unless the rows are ``weighted`` or ``auto_exact`` is False; otherwise for
    "auto" ``auto_float`` if given, and the float dtype of :func:`compute_dtype_for`.
    ``matrix_free``: the float dtype of the randomized passes (no exact sums);
    ``resumed``: what a checkpoint's "auto" chose when it began, which it keeps; ``n``:
    the pass's rows, whose exact sums must fit int64 (checked here, before any work,
    whenever the answer is "exact")."""
    auto = requested in ("auto", None)
    if auto and resumed is not None and not is_exact(resumed):
        return np.dtype(resumed)
    exact = ((auto and resumed is not None) or (is_exact(requested) and not matrix_free)
             or (auto and auto_exact and not (weighted or matrix_free)
                 and np.dtype(x_dtype) in (np.uint8, np.int8)
                 and (choose or auto_choice)(x_dtype, AUTO_WIDTH if width is None else width).choice == EXACT))
    if not exact:  # the float products, also of the matrix-free passes (which never sum exactly)
        return np.dtype(auto_float) if auto and auto_float is not None else compute_dtype_for(x_dtype, requested)
    check_unweighted(EXACT, weighted)
    check_exact(x_dtype, n)
    if is_exact(requested):
        int8_kernel_available()  # the kernels chosen and self-tested here, before the pass
    return EXACT


def kernel_name(m) -> str:
    """What formed the products of statistics ``m``: ``"exact:<kernels>"`` for exact
    statistics (e.g. ``"exact:blas-exact-blocks"``), else ``"float32"`` or ``"float64"``
    (the coarsest dtype of the products)."""
    exact = getattr(m, "exact", None)
    if exact is not None:
        return "exact:" + "+".join(exact.kernels or ("none",))
    eps = getattr(m, "precision", float(np.finfo(np.float64).eps))
    return "float32" if eps >= float(np.finfo(np.float32).eps) else "float64"


@dataclass
class ExactGroups:
    """Raw sums of one attribute's groups: counts (m,), sums (m, d) and, for Fair PCA-S,
    a list of m upper-triangular int64 Grams (None for a group without rows)."""

    categories: np.ndarray
    counts: np.ndarray
    sums: np.ndarray
    grams: list | None = None

    @property
    def n_groups(self) -> int:
        return len(self.categories)


@dataclass
class ExactSums:
    """Raw integer sums of a set of rows (see the module docstring).

    ``gram`` is an F-ordered (d, d) int64 array holding ``X^T X`` on and above the
    diagonal, 0 below.  ``kernels`` names the Gram kernels that formed it
    (:mod:`dfairpca.stats._int_kernels`).  A pass's running total of them is
    ``dfairpca.engine._accumulator.ExactTotal``.
    """

    n: int
    sums: np.ndarray
    gram: np.ndarray = field(repr=False)  # a repr must not read it (pending or broken sums)
    attributes: list = field(default_factory=list)
    kernels: tuple = ()
    n_nonfinite: int = 0  # integers are always finite: what a pass's bookkeeping reads
    nonfinite_rows: list = field(default_factory=list)

    @property
    def n_features(self) -> int:
        return self.sums.shape[0]

    @classmethod
    def no_rows(cls, d: int, categories, group_scatter: bool = False) -> "ExactSums":
        """The sums of no rows: d features, the attributes' ``categories`` (a list of arrays)."""
        attrs = [ExactGroups(np.asarray(c), np.zeros(len(c), np.int64), np.zeros((len(c), d), np.int64),
                             [None] * len(c) if group_scatter else None) for c in categories]
        return cls(0, np.zeros(d, np.int64), np.zeros((d, d), np.int64, order="F"), attrs)

    # The kernels' scratch (see :func:`exact_chunk_sums`) is not the sums, but it may hold
    # the products of the last rows added, not yet in ``gram``: every read of ``gram``
    # adds them in first, so that no reader (a merge, a save, a transfer, a test) can see
    # a Gram without them.  The scratch neither travels nor is saved.
    def __getattribute__(self, name):
        if name == "gram":
            own = object.__getattribute__(self, "__dict__")
            if "_broken" in own:  # nothing may read, merge, save or send sums that miss rows
                raise RunError(own["_broken"])
            pending = own.get("_scratch", {}).get("gram")
            if pending is not None:
                pending.flush()
        return object.__getattribute__(self, name)

    def __getstate__(self):
        self.gram  # noqa: B018 (the pending products, added in)
        state = dict(self.__dict__)
        state.pop("_scratch", None)
        return state

    def settle(self) -> "ExactSums":
        """Add any pending products into ``gram`` and drop the kernels' scratch (a d x d
        int32 array): what a pass does to its total once no chunk will come."""
        self.gram  # noqa: B018 (the pending products, added in)
        self.__dict__.pop("_scratch", None)
        return self

    def centred(self) -> Sums:
        """The centred statistics (the fields of :class:`~dfairpca.stats.moments.Moments`,
        complete float64 matrices) of these sums, each entry rounded once."""
        n = self.n
        d = self.n_features
        mean = self.sums / max(n, 1)
        attrs = []
        for a in self.attributes:
            dev = _deviations(n, self.sums, a.counts, a.sums)
            sc = None
            if a.grams is not None:
                sc = np.zeros((a.n_groups, d, d))
                for g in range(a.n_groups):
                    if a.counts[g] > 0 and a.grams[g] is not None:
                        centred(a.grams[g], a.sums[g], int(a.counts[g]), out=sc[g])
            attrs.append(GroupSums(a.categories, a.counts.copy(), dev, sc))
        S = centred(self.gram, self.sums, n) if n else np.zeros((d, d))
        return Sums(n, mean, S, attrs, 0, [], float(np.finfo(np.float64).eps), 0)

    def columns(self, keep) -> "ExactSums":
        """The sums of the columns ``keep`` (indices in any order, or a boolean mask)."""
        keep = np.asarray(keep)
        if keep.dtype == bool:
            keep = np.flatnonzero(keep)

        def upper(G):
            # the Grams hold upper triangles: completed before the columns are taken, so
            # that a reordering (an index below an earlier one) still reads the right half
            full = np.triu(G) + np.triu(G, 1).T
            return np.asfortranarray(np.triu(full[np.ix_(keep, keep)]))

        attrs = [ExactGroups(a.categories, a.counts, a.sums[:, keep],
                             None if a.grams is None else
                             [None if G is None else upper(G) for G in a.grams])
                 for a in self.attributes]
        return ExactSums(self.n, self.sums[keep], upper(self.gram), attrs, self.kernels)

    # ------------------------------------------------------------------ saved form
    def to_arrays(self, prefix: str = "exact_") -> tuple[dict, dict]:
        """(arrays, meta) of the raw sums, the names prefixed (see :meth:`from_arrays`)."""
        arrays = {f"{prefix}n": np.asarray(self.n, np.int64), f"{prefix}sum": self.sums,
                  f"{prefix}gram": self.gram}
        for j, a in enumerate(self.attributes):
            arrays[f"{prefix}group_sum_{j}"] = a.sums
            if a.grams is not None:
                d = self.n_features
                arrays[f"{prefix}group_gram_{j}"] = np.stack(
                    [np.zeros((d, d), np.int64) if G is None else G for G in a.grams])
        return arrays, {f"{prefix}kernels": list(self.kernels)}

    @classmethod
    def from_arrays(cls, arrays, meta, categories, counts, prefix: str = "exact_") -> "ExactSums | None":
        """The raw sums saved by :meth:`to_arrays` (None if there are none); ``categories``
        and ``counts`` per attribute are the statistics' own."""
        if f"{prefix}gram" not in arrays:
            return None
        attrs = []
        for j, (c, k) in enumerate(zip(categories, counts)):
            gg = arrays.get(f"{prefix}group_gram_{j}")
            grams: list | None = None if gg is None else [np.asfortranarray(gg[g], np.int64) if k[g] else None
                                              for g in range(len(c))]
            attrs.append(ExactGroups(np.asarray(c), np.asarray(k, np.int64),
                                     np.asarray(arrays[f"{prefix}group_sum_{j}"], np.int64), grams))
        return cls(int(arrays[f"{prefix}n"]), np.asarray(arrays[f"{prefix}sum"], np.int64),
                   np.asfortranarray(arrays[f"{prefix}gram"], np.int64), attrs,
                   tuple(meta.get(f"{prefix}kernels", ())))


def nbytes(s: ExactSums) -> int:
    """Bytes of the arrays of exact sums, their kernels' scratch included (what Dask's
    ``sizeof`` should count).  Reads the Gram's size without adding pending products in:
    a size asked from another thread must not touch the sums."""
    own = vars(s)
    n = s.sums.nbytes + own["gram"].nbytes + sum(getattr(a, "nbytes", 0) for a in own.get("_scratch", {}).values())
    for a in s.attributes:
        n += a.counts.nbytes + a.sums.nbytes + sum(0 if G is None else G.nbytes for G in a.grams or ())
    return int(n)


# ---------------------------------------------------------------------- one chunk
def exact_chunk_sums(x, codes, categories, *, mask=None, group_scatter: bool = False,
                     into: ExactSums | None = None) -> ExactSums:
    """The raw integer sums of one chunk of rows (arguments as
    :meth:`dfairpca.Moments.from_chunk`).

    With ``into``, the sums of earlier rows (the same features, attributes and
    categories), the chunk's sums are added to it in place and it is returned: the kernels
    add their products straight into its Grams, through scratch arrays it keeps for the
    next chunk, so a pass never holds (nor pays the page faults of) a chunk's own d x d
    Gram.  ``into`` whose categories differ is merged with the chunk's sums instead.
    """
    x = np.asarray(x)
    if x.ndim > 2:
        x = x.reshape(x.shape[0], -1)
    check_exact(x.dtype, x.shape[0])
    if mask is not None:
        keep = np.asarray(mask, bool)
        x = x[keep]
        codes = None if codes is None else np.asarray(codes)[keep]
    r, d = x.shape
    if x.dtype.kind == "b":
        x = x.view(np.uint8)
    if into is not None and not _same_layout(into, d, categories, group_scatter):
        chunk = exact_chunk_sums(x, codes, categories, group_scatter=group_scatter)
        with _broken_on_failure(into, r):
            return merge_exact([into, chunk], in_place=True)
    out = ExactSums.no_rows(d, categories, group_scatter) if into is None else into
    scratch = out.__dict__.setdefault("_scratch", {})
    names = set(out.kernels)

    def add(G, rows, key, keep=False):
        name, scratch[key] = add_gram(G, rows, scratch.get(key), keep=keep)
        names.add(name)

    # what can refuse the chunk comes before the first addition: the codes checked, the
    # column and group sums formed aside, the groups' new Grams allocated
    groups = []  # per attribute: (codes, counts, present groups, their sums)
    if codes is not None and r:
        codes = np.asarray(codes)
        if codes.dtype.kind not in "iu":
            raise InvalidInputError(f"group codes must be integers; got {codes.dtype}")
        codes = codes.reshape(r, -1)
        for j, a in enumerate(out.attributes):
            cj = codes[:, j]
            if cj.min() < 0 or cj.max() >= a.n_groups:
                raise InvalidInputError(f"group codes of attribute {j} must lie in [0, {a.n_groups}); "
                                        f"got {cj.min()}..{cj.max()}")
    total = column_sums(x)
    for j, a in enumerate(out.attributes if r else ()):
        cj = codes[:, j]
        counts = np.bincount(cj, minlength=a.n_groups).astype(np.int64)
        present = np.flatnonzero(counts)
        largest = present[np.argmax(counts[present])]
        sums = np.zeros((a.n_groups, d), np.int64)
        for g in present:
            if g != largest:  # the largest group's sums are the rest of the total
                sums[g] = column_sums(x[cj == g])
        sums[largest] = total - sums.sum(axis=0)
        groups.append((cj, counts, present, sums))
        for g in present if a.grams is not None else ():  # group_scatter: the Grams made first
            if a.grams[g] is None:
                a.grams[g] = np.zeros((d, d), np.int64, order="F")
    with _broken_on_failure(out, r):
        if r:
            # the total's products may stay pending in its scratch (an int32 sum of the last
            # rows): reading ``gram`` adds them in; the group Grams are completed at once
            # (one scratch for them all)
            add(out.__dict__["gram"], x, "gram", keep=into is not None)
        for a, (cj, counts, present, sums) in zip(out.attributes, groups):
            for g in present if a.grams is not None else ():
                add(a.grams[g], x[cj == g], "groups")
            a.sums += sums
            a.counts += counts
        out.n += r
        out.sums += total
    out.kernels = tuple(sorted(names))
    if into is None:  # one chunk's own sums (complete): nothing more will be added to them
        del out.__dict__["_scratch"]
    return out


@contextlib.contextmanager
def _broken_on_failure(s: ExactSums, rows: int):
    """Adding a chunk of ``rows`` into ``s`` in the block: if it fails, part of the chunk
    may be in the sums (an allocation or a kernel failed, a Ctrl-C came between two
    additions), and they refuse every later use rather than be used short."""
    try:
        yield
    except BaseException as exc:
        s.__dict__["_broken"] = (
            f"these exact sums are incomplete: adding a chunk of {rows:,} rows failed part way "
            f"({type(exc).__name__}: {exc}); the pass must be run again (or resumed from its "
            "checkpoint, whose saved sums are whole)")
        raise


def _same_layout(s: ExactSums, d: int, categories, group_scatter: bool) -> bool:
    """Whether the chunk's sums can be added into ``s`` in place."""
    return (s.n_features == d and len(s.attributes) == len(categories)
            and all((a.grams is not None) == group_scatter and len(a.categories) == len(c)
                    and np.array_equal(a.categories, c) for a, c in zip(s.attributes, categories)))


# ---------------------------------------------------------------------- merging
def merge_exact(parts, in_place: bool = False) -> ExactSums:
    """The sums of the union of ``parts`` (same features and attributes; labels aligned
    onto the sorted union).  With ``in_place`` the first part's arrays are added to where
    they lie (a pass's running total; that part must not be used again)."""
    parts = list(parts)
    if not parts:
        raise InvalidInputError("merge() needs at least one Moments")
    d = parts[0].n_features
    p = len(parts[0].attributes)
    for q in parts:
        if q.n_features != d:
            raise InvalidInputError(f"cannot merge statistics of {q.n_features} and {d} features")
        if len(q.attributes) != p:
            raise InvalidInputError(f"cannot merge statistics of {len(q.attributes)} and {p} protected attributes")
    first = parts[0]
    n = sum(q.n for q in parts)
    sums = first.sums if in_place else first.sums.copy()
    G = first.gram if in_place else first.gram.copy(order="F")
    for q in parts[1:]:
        sums += q.sums
        add_upper(G, q.gram)  # the lower parts are 0: half the memory traffic
    attrs = [_merged_attribute(parts, j, in_place) for j in range(p)]
    kernels = tuple(sorted({k for q in parts for k in q.kernels}))
    return type(first)(n, sums, G, attrs, kernels)


def _merged_attribute(parts, j: int, in_place: bool) -> ExactGroups:
    cats = [q.attributes[j].categories for q in parts]
    same = all(len(c) == len(cats[0]) and np.array_equal(c, cats[0]) for c in cats)
    if not same:
        _check_one_label_type(cats, j)
    union = cats[0] if same else np.unique(np.concatenate(cats))
    m, d = len(union), parts[0].n_features
    with_grams = all(q.attributes[j].grams is not None for q in parts)
    counts = np.zeros(m, np.int64)
    sums = np.zeros((m, d), np.int64)
    grams: list | None = [None] * m if with_grams else None
    for i, q in enumerate(parts):
        a = q.attributes[j]
        idx = np.arange(m) if same else np.searchsorted(union, a.categories)
        counts[idx] += a.counts
        sums[idx] += a.sums
        if grams is not None:  # with_grams
            for g_local, g in enumerate(idx):
                Gq = a.grams[g_local]
                if Gq is None:
                    continue
                if grams[g] is None:
                    grams[g] = Gq if (in_place and i == 0) else Gq.copy(order="F")
                else:
                    add_upper(grams[g], Gq)
    return ExactGroups(union, counts, sums, grams)


# ---------------------------------------------------------------------- centring
def centred(G: np.ndarray, s: np.ndarray, n: int, out: np.ndarray | None = None) -> np.ndarray:
    """The symmetric float64 ``G - s s^T / n`` of an upper-triangular int64 Gram, each entry
    rounded once (see the module docstring), by column panels (no d x d int64 temporary).

    The panels are independent and numpy releases the GIL on them, so they run on one
    thread per usable CPU: at d = 6,400 this is serial work after the pass (about 15
    integer operations per entry, an int64 division among them) that the whole fit
    waits for.
    """
    d = s.shape[0]
    out = np.empty((d, d)) if out is None else out
    q, r = np.divmod(s, n)  # s = n q + r, 0 <= r < n (also for negative sums)
    small = n < 2 ** 31  # r_i r_j < n**2 fits int64

    def panel(a: int) -> None:
        b = min(d, a + CENTRING_PANEL)
        T = G[:b, a:b] - n * np.outer(q[:b], q[a:b]) - np.outer(q[:b], r[a:b]) - np.outer(r[:b], q[a:b])
        if small:
            whole, frac = np.divmod(np.outer(r[:b], r[a:b]), n)
            I = T - whole  # the exact value is I - frac / n, 0 <= frac < n
            # one rounding: (I n - frac) / n of an exact integer numerator where it is below
            # 2**53; elsewhere |I| > 2**52 / n, so the rounding of frac / n is far below
            # the result's last place
            safe = np.abs(I) < 2 ** 52 // n
            num = np.where(safe, I, 0) * n - np.where(safe, frac, 0)
            out[:b, a:b] = np.where(safe, num / n, I.astype(np.float64) - frac / n)
        else:
            out[:b, a:b] = T.astype(np.float64) - np.outer(r[:b] / n, r[a:b].astype(np.float64))

    starts = list(range(0, d, CENTRING_PANEL))[::-1]  # the widest (last) panels first
    # each thread holds about seven (d x panel) int64 temporaries (180 MB at d = 6,400):
    # a few threads take most of the gain without growing that with the machine's cores
    threads = min(cpu_count(), len(starts), CENTRING_THREADS)
    if threads > 1:
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(panel, starts))
    else:
        for a in starts:
            panel(a)
    return fill_lower(out)


def _deviations(n: int, s: np.ndarray, counts: np.ndarray, group_sums: np.ndarray) -> np.ndarray:
    """(m, d) ``s_g / n_g - s / n`` (0 for an empty group), one rounding of an exact integer
    ratio while ``n**2 * max|s_g / n_g|`` fits int64."""
    dev = np.zeros(group_sums.shape)
    live = counts > 0
    if not live.any():
        return dev
    big = max(int(np.abs(group_sums).max(initial=0)), int(np.abs(s).max(initial=0)), 1)
    k = counts[live, None]
    if n * big < 2 ** 62:
        num = n * group_sums[live] - k * s[None, :]  # exact int64
        dev[live] = num.astype(np.float64) / (float(n) * k.astype(np.float64))
    else:
        dev[live] = group_sums[live] / k - s / n
    return dev
