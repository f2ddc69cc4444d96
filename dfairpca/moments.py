"""Additive statistics of a data set: the only thing a linear (fair) PCA needs.

Every estimator in dfairpca depends on the rows of ``X`` only through

* ``n``, the mean and the scatter matrix about the mean (``sum (x - mean)(x - mean)^T``),
* for every group of every protected attribute: its size and its mean,
* optionally (Fair PCA-S), for every group: its scatter matrix about its own mean.

:class:`Moments` holds them.  It is built from one chunk of rows with
:meth:`Moments.from_chunk` and two of them are combined with :func:`merge`; the statistics
of a union are exactly the merge of the parts' statistics, which is what lets a fit be a
single pass of folds over the chunks of a Dask array, a sequence of ``partial_fit`` calls,
or a resumed pass.

Numerics: every part stores its scatter about *its own* mean and parts are combined with
the pairwise update of Chan, Golub & LeVeque (1979), so nothing ever forms
``E[xx^T] - E[x]E[x]^T`` (the cancellation behind faiss #773 and scikit-learn PR #28581).
Within a chunk the product ``xc^T xc`` runs in the chunk's compute dtype (float32 for
images, a BLAS ``syrk``) and is added to float64 totals, which a pass keeps as the upper
triangle only (:class:`UpperPanels`, half the memory and half the bytes on the wire).  Group means are stored as
deviations from the part's mean, which keeps them exact when the data has a large offset.

Range: the products of values far from 1 underflow or overflow (float32 squares of 1e-30
are 0; float64 squares of 1e-170 too).  A chunk whose products left the range where they
are exact (:func:`_product_range`) is redone with every column scaled by a power of two
(exact), and a scatter matrix beyond float64's comfortable range is kept as
``true = stored * 4**scatter_exponent``.  Data of ordinary magnitude never takes that
path: it costs one look at the diagonal per chunk.  Offset data (a column's mean far
from 0 in units of its spread) gets its means refined by a second sum (:func:`_refined`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import threading

import numpy as np
import scipy.linalg.blas

from ._system import BLOCK_BYTES

__all__ = ["Moments", "AttributeMoments", "UpperPanels", "merge"]

#: how many offending row indices a :class:`Moments` remembers for the error message
MAX_BAD_ROWS_REPORTED = 10
#: the float64 scatter matrices are kept within 2**(+-STORED_RANGE_BITS) per row (column
#: spreads of about 1e-90 to 1e90): squares of what is stored neither underflow nor
#: overflow in the solves, whose products of two such matrices then stay in range too
STORED_RANGE_BITS = 600
#: a scatter whose true values are within 2**(+-TRUE_UNITS_BITS) is stored as it is
#: (``scatter_exponent == 0``); beyond, stored scaled (see :attr:`Moments.scatter_exponent`)
TRUE_UNITS_BITS = 400
#: a chunk of 64-bit values with a column whose mean is over 2**OFFSET_BITS of its spread
#: from 0 gets a second float64 sum of the centred values (:func:`_refined`): its group
#: deviations are then exact to the spread's rounding, not the offset's.  Ordinary data
#: (pixels: mean about 2 sd) never pays for it, nor do inputs of 32 bits or less, whose
#: float64 sums are exact when the values share a binade (as an offset makes them).
OFFSET_BITS = 6
#: what a fit says when X's sums overflow float64 (values of about 1e300 and more)
OVERFLOW_MESSAGE = ("X holds values too large for float64 sums (the statistics overflow); divide X "
                    "by a constant (e.g. a power of two) before fitting")
#: one multi-threaded BLAS product at a time per process: two concurrent calls that each
#: use every BLAS thread (Dask's threaded scheduler) run 25% slower than the same calls in
#: turn; reading and centering still overlap.  With single-threaded BLAS (Dask workers set
#: OMP/OPENBLAS_NUM_THREADS=1) the products of a worker's threads run side by side.
_BLAS_LOCK = threading.Lock()


def _syrk(dtype):
    """``syrk(C, xc)``: ``C += xc^T xc`` on the upper triangle of the F-ordered (d, d) C,
    for C-ordered (r, d) xc, without holding the GIL where possible.

    scipy's ``blas.?syrk`` wrapper keeps the GIL for the whole product, so the threads of a
    Dask worker could only take turns (measured: 2 threads 0.89x the speed of one).  The
    same BLAS routine called through ctypes (its address from
    ``scipy.linalg.cython_blas``) releases it: 2 threads 2.0x.
    """
    key = np.dtype(dtype).char
    fn = _SYRK.get(key)
    if fn is None:
        try:
            fn = _SYRK[key] = _ctypes_syrk(key)
        except Exception:  # no capsule: the f2py wrapper (same routine, holds the GIL)
            f2py = scipy.linalg.blas.get_blas_funcs("syrk", dtype=dtype)

            def fn(C, xc):
                return f2py(1.0, xc.T, beta=1.0, c=C, trans=0, lower=0, overwrite_c=1)

            _SYRK[key] = fn
    return fn


_SYRK: dict = {}


def _ctypes_syrk(char: str):
    import ctypes

    from scipy.linalg import cython_blas

    name = {"f": "ssyrk", "d": "dsyrk"}[char]
    capsule = cython_blas.__pyx_capi__[name]
    # private prototypes: ctypes.pythonapi's shared function objects are left as they are
    get_name = ctypes.PYFUNCTYPE(ctypes.c_char_p, ctypes.py_object)(
        ("PyCapsule_GetName", ctypes.pythonapi))
    get_pointer = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.py_object, ctypes.c_char_p)(
        ("PyCapsule_GetPointer", ctypes.pythonapi))
    address = get_pointer(capsule, get_name(capsule))
    real = ctypes.c_float if char == "f" else ctypes.c_double
    i32, p = ctypes.POINTER(ctypes.c_int), ctypes.c_void_p
    # void ?syrk(char *uplo, char *trans, int *n, int *k, real *alpha, real *a, int *lda,
    #            real *beta, real *c, int *ldc)     (Fortran BLAS, LP64)
    f = ctypes.CFUNCTYPE(None, ctypes.c_char_p, ctypes.c_char_p, i32, i32, ctypes.POINTER(real),
                         p, i32, ctypes.POINTER(real), p, i32)(address)
    dtype = np.dtype(char)

    def syrk(C, xc):
        xc = np.ascontiguousarray(xc, dtype=dtype)
        r, d = xc.shape
        if C.dtype != dtype or C.shape != (d, d) or not C.flags.f_contiguous or not C.flags.writeable:
            raise ValueError("syrk needs a writable F-ordered (d, d) C of the product's dtype")
        if r == 0:
            return C
        # xc (r, d) C-ordered is A = xc^T (d, r) F-ordered: C += A A^T, "N", lda = d
        n, k, one = ctypes.c_int(d), ctypes.c_int(r), real(1.0)
        f(b"U", b"N", ctypes.byref(n), ctypes.byref(k), ctypes.byref(one), xc.ctypes.data,
          ctypes.byref(n), ctypes.byref(one), C.ctypes.data, ctypes.byref(n))
        return C

    return syrk


def _blas_lock():
    """The process-wide lock when BLAS runs several threads, else no lock (see _BLAS_LOCK)."""
    import contextlib

    try:
        from threadpoolctl import threadpool_info

        threads = max((i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"),
                      default=1)
    except Exception:
        threads = 2
    return _BLAS_LOCK if threads > 1 else contextlib.nullcontext()


def _products(x, mean, shifts, dtype, exponents=None):
    """Upper triangles of ``xc^T xc`` (xc = x - mean) and of every group's product about its
    own mean, in ``dtype``, by row blocks: BLAS syrk accumulates in the compute dtype
    (beta = 1), never materialising a float copy of the chunk.  Also returns the centres
    (overall, per group) the products are about, as :func:`_refined` needs them.

    With ``exponents`` (per column) the rows are ``(x - mean) * 2**-exponents``, centred in
    float64 first (the rare rescaled path of :func:`_scaled_products`).
    """
    d, r = x.shape[1], x.shape[0]
    syrk = _syrk(dtype)
    lock = _blas_lock()
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
    step = max(64, BLOCK_BYTES // (d * dtype.itemsize))
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
            acc = syrk(acc, xc)
        for i, (_, _, sel) in enumerate(shifts):
            xg = xc[sel[s : s + step]]
            if len(xg):
                xg -= devs[i]
                with lock:
                    gacc[i] = syrk(gacc[i], xg)
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


def _scaled_products(x, mean, shifts, dtype):
    """The products of :func:`_products` for columns scaled by powers of two, as float64
    upper triangles holding ``true * 4**-e``, and e (0 when the true values fit float64's
    :data:`TRUE_UNITS_BITS`).

    Every column j is divided by ``2**f_j`` with ``2**f_j`` just above its largest
    ``|x - mean|``, so every scaled value is at most 1 and the squares cannot overflow or
    underflow (a column's nonzero deviations are at least its spread times the input's eps).
    """
    with np.errstate(over="ignore", invalid="ignore"):
        spread = np.maximum(x.max(axis=0) - mean, mean - x.min(axis=0))
    if not np.all(np.isfinite(spread)):
        raise ValueError(OVERFLOW_MESSAGE)
    f = np.where(spread > 0, np.frexp(spread)[1], 0).astype(np.int64)
    acc, gacc, centres = _products(x, mean, shifts, dtype, exponents=f)
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


def _offset_is_large(mean, acc, rows: int, e: int) -> bool:
    """Whether some column's mean is more than ``2**OFFSET_BITS`` of its spread from 0.

    Then the float64 sums of the raw values, off by up to ``rows * eps * |mean|``, would
    blur group-mean deviations smaller than that (a gap of 1e-6 sd on a 1e6 sd offset):
    :func:`_refined` sums the centred values again.  Constant columns (spread 0) are exact.
    """
    var = np.diagonal(acc).astype(np.float64) / rows  # in units of 4**e
    mu = np.ldexp(mean, -e)
    return bool(np.any((var > 0) & (mu * mu > 4.0 ** OFFSET_BITS * var)))


def _refined(x, codes, out, acc, gacc, shifts, centres):
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
    delta = total / r
    out.mean = mu + delta
    for j, a in enumerate(out.attributes):
        live = a.counts > 0
        a.deviation[live] = sums[j][live] / a.counts[live, None] - delta

    e = out.scatter_exponent

    def moved(G, rows, c, m):
        G = np.array(G, dtype=np.float64, order="F")
        v = np.ldexp(m - c, -e)
        G -= rows * np.outer(v, v)  # about the mean m instead of c (the upper half counts)
        return G

    acc = moved(acc, r, centres[0], out.mean)
    gacc = [moved(G, int(np.count_nonzero(sel)), c, out.mean + att.deviation[g])
            for G, c, (att, g, sel) in zip(gacc, centres[1], shifts)]
    return acc, gacc


@dataclass
class AttributeMoments:
    """Per-group statistics of one protected attribute.

    Attributes
    ----------
    categories : ndarray of shape (m,)
        The group labels, sorted.
    counts : ndarray of int64, shape (m,)
        Rows per group.
    deviation : ndarray of float64, shape (m, d)
        ``mean of the group - mean of all rows`` (zero for an empty group).
    scatter : ndarray of float64, shape (m, d, d) or None
        Scatter of each group about its own mean; only kept when asked for (Fair PCA-S).
        Inside a pass (``Moments.upper``) a list of m upper-triangle matrices instead
        (:class:`UpperPanels`, or None for a group without rows so far).
    """

    categories: np.ndarray
    counts: np.ndarray
    deviation: np.ndarray
    scatter: np.ndarray | None = None

    @property
    def n_groups(self) -> int:
        return len(self.categories)


@dataclass
class Moments:
    """Additive first and second moments of a set of rows, overall and per group.

    Build with :meth:`from_chunk` (or :func:`dfairpca.compute_moments` for whole arrays)
    and combine with :func:`merge` or ``a.merge(b)``.

    Attributes
    ----------
    n : int
        Number of rows.
    mean : ndarray of float64, shape (d,)
    scatter : ndarray of float64, shape (d, d)
        ``sum_i (x_i - mean)(x_i - mean)^T``.
    attributes : list of AttributeMoments
        One entry per protected attribute (empty for plain PCA).
    n_nonfinite : int
        Rows that held NaN or infinity (they are left out of every sum).
    nonfinite_rows : list of int
        The first few of those rows, as global row indices.
    upper : bool
        True while only the upper triangles of the scatter matrices are filled (inside
        a pass); :meth:`symmetrize` completes them.
    precision : float
        Machine epsilon of the coarsest dtype any part's products ran in (the scatter
        matrices' relative precision; the means and group deviations are float64 sums
        whatever the products ran in, see :meth:`deviation_floor`).
    scatter_exponent : int
        The scatter matrices hold ``true * 4**-scatter_exponent``.  0 (true values) unless
        column spreads are beyond about 1e+-90, as for ``X * 1e-170`` whose true scatter
        float64 cannot hold; :meth:`covariance` is in true units (as far as float64 holds
        them), ratios of the stored values are exact.
    """

    n: int
    mean: np.ndarray
    scatter: np.ndarray
    attributes: list[AttributeMoments] = field(default_factory=list)
    n_nonfinite: int = 0
    nonfinite_rows: list[int] = field(default_factory=list)
    precision: float = float(np.finfo(np.float64).eps)
    upper: bool = False
    scatter_exponent: int = 0

    # ------------------------------------------------------------------ building
    @classmethod
    def empty(cls, d: int, categories: Sequence[np.ndarray] = (), group_scatter=False):
        """Statistics of zero rows with ``d`` features."""
        attrs = []
        for cats in categories:
            m = len(cats)
            attrs.append(
                AttributeMoments(
                    np.asarray(cats),
                    np.zeros(m, np.int64),
                    np.zeros((m, d)),
                    np.zeros((m, d, d)) if group_scatter else None,
                )
            )
        return cls(0, np.zeros(d), np.zeros((d, d)), attrs)

    @classmethod
    def from_chunk(
        cls,
        x,
        codes=None,
        categories: Sequence[np.ndarray] = (),
        *,
        mask=None,
        row_offset: int = 0,
        dtype=None,
        group_scatter: bool = False,
        symmetric: bool = True,
    ) -> "Moments":
        """Statistics of one chunk of rows.

        Parameters
        ----------
        x : array of shape (r, d) (or (r, h, w), flattened)
            Any real dtype; cast to ``dtype`` for the products.
        codes : int array of shape (r, p), optional
            Group index of every row for each of the p attributes, in ``0 .. m_j - 1``.
        categories : sequence of p arrays
            Labels of the groups of each attribute (stored, not used to compute).
        mask : bool array of shape (r,), optional
            Rows to use (equal opportunity keeps only the rows with ``y == 1``).
        row_offset : int
            Global index of the chunk's first row, for the NaN report.
        dtype : numpy float dtype, optional
            Dtype of the chunk's products; float64 sums regardless.  Defaults to float64.
        group_scatter : bool
            Also keep every group's scatter matrix (needed by Fair PCA-S only).
        symmetric : bool
            False leaves only the upper triangles filled (``upper=True``); the engine
            merges such parts and calls :meth:`symmetrize` once at the end.
        """
        x = np.asarray(x)
        if x.ndim > 2:
            x = x.reshape(x.shape[0], -1)
        dtype = np.dtype(dtype or np.float64)
        d = x.shape[1]
        keep = np.ones(x.shape[0], bool) if mask is None else np.asarray(mask, bool).copy()
        n_bad, bad_rows = 0, []
        if x.dtype.kind in "fc":
            finite = np.isfinite(x).all(axis=1)
            if not finite.all():
                bad = np.flatnonzero(~finite)
                n_bad = int(bad.size)
                bad_rows = [int(row_offset + i) for i in bad[:MAX_BAD_ROWS_REPORTED]]
                keep &= finite
        if not keep.all():
            x = x[keep]
            codes = None if codes is None else np.asarray(codes)[keep]
        out = cls.empty(d, categories)
        out.n_nonfinite, out.nonfinite_rows = n_bad, bad_rows
        out.precision = float(np.finfo(dtype).eps)
        if group_scatter:  # per group, filled below; None stands for a group without rows
            for att in out.attributes:
                att.scatter = [None] * att.n_groups
        r = x.shape[0]
        if r == 0:
            out.upper = group_scatter  # the group lists are completed by symmetrize
            return out.symmetrize() if symmetric else out
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
        # a chunk's product is only as precise as its dtype: keep it (half the bytes to ship
        # for float32); merges accumulate in float64
        out.scatter = acc
        for i, (att, g, _) in enumerate(shifts):
            att.scatter[g] = gacc[i]
        out.upper = True
        return out.symmetrize() if symmetric else out

    def symmetrize(self) -> "Moments":
        """Fill the lower triangles of the scatter matrices (in place); returns self.

        The pass keeps only upper triangles (what syrk writes) until the end.
        """
        if self.upper:
            self.scatter = _full(self.scatter, self.n_features)
            for a in self.attributes:
                if a.scatter is not None:
                    full = np.empty((len(a.scatter), self.n_features, self.n_features))
                    for g in range(len(a.scatter)):
                        full[g] = _full(a.scatter[g], self.n_features)
                        if isinstance(a.scatter, list):
                            a.scatter[g] = None  # free each group's pass storage as we go
                    a.scatter = full
            self.upper = False
        return self

    # ------------------------------------------------------------------ combining
    def merge(self, *others: "Moments") -> "Moments":
        """Statistics of the union of ``self`` and ``others`` (see :func:`merge`)."""
        return merge([self, *others])

    # ------------------------------------------------------------------ derived
    @property
    def n_features(self) -> int:
        return self.mean.shape[0]

    @property
    def has_group_scatter(self) -> bool:
        return bool(self.attributes) and all(a.scatter is not None for a in self.attributes)

    def covariance(self, ddof: int = 1) -> np.ndarray:
        """Sample covariance ``scatter / (n - ddof)`` (true units, whatever :attr:`scatter_exponent`)."""
        return np.ldexp(self.symmetrize().scatter / max(self.n - ddof, 1), 2 * self.scatter_exponent)

    def second_moment(self) -> np.ndarray:
        """Uncentred ``X^T X / n`` (the paper's objective without centring)."""
        S = np.ldexp(self.symmetrize().scatter / self.n, 2 * self.scatter_exponent)
        return S + np.outer(self.mean, self.mean)

    def group_means(self, attribute: int = 0) -> np.ndarray:
        """Mean of every group of one attribute, shape (m, d)."""
        return self.mean + self.attributes[attribute].deviation

    def constraint_matrix(self) -> np.ndarray:
        """``Z_comb^T X`` of the paper (Sec. 3.4/3.5): rows ``n_g (mean_g - mean)``.

        Shape (sum of m_r, d); its row space is what fair PCA must be orthogonal to.  Each
        attribute's rows are re-centred so that they sum to zero exactly (they do in exact
        arithmetic), which keeps the rank at m_r - 1 when the sums ran in float32.
        """
        if not self.attributes:
            return np.zeros((0, self.n_features))
        rows = []
        for a in self.attributes:
            w = a.counts[:, None].astype(np.float64)
            dev = a.deviation - (w * a.deviation).sum(0) / max(w.sum(), 1)
            rows.append(np.where(w > 0, w * dev, 0.0))
        return np.concatenate(rows)

    def deviation_floor(self) -> np.ndarray:
        """Per feature: the size below which a group-mean deviation is float64 rounding.

        The means are float64 sums of the rows (whatever dtype the products ran in), and
        a sum of n terms is off by at most ``n * eps * sum |x_i|`` (recursive summation, the
        worst case); so the mean of feature j is off by at most ``n * eps`` times its root
        mean square ``rms_j``, and a group mean minus the overall mean by ``2 n eps rms_j``.
        Per feature, not over the row norm: a huge constant feature (a timestamp in ns)
        must not hide a real deviation of the others.  A deviation above this in any
        feature is the data's, not the arithmetic's.
        """
        n = max(self.n, 1)
        with np.errstate(over="ignore", under="ignore"):
            sd = np.ldexp(np.sqrt(np.maximum(np.diag(self.symmetrize().scatter), 0.0) / n),
                          self.scatter_exponent)  # true scatter = stored * 4**exponent
            rms = np.hypot(np.abs(self.mean), sd)
        return 2.0 * n * float(np.finfo(np.float64).eps) * rms

    def check_finite(self) -> None:
        """Raise ``ValueError`` naming the rows if any row held NaN or infinity."""
        if self.n_nonfinite:
            rows = ", ".join(map(str, self.nonfinite_rows))
            more = ", ..." if self.n_nonfinite > len(self.nonfinite_rows) else ""
            raise ValueError(
                f"X contains NaN or infinity in {self.n_nonfinite} row(s) (rows {rows}{more}); "
                "drop or impute them before fitting, e.g. with dask.array.nan_to_num or "
                "sklearn.impute.SimpleImputer."
            )

    # ------------------------------------------------------------------ persistence
    def to_arrays(self) -> tuple[dict, dict]:
        """(arrays, metadata) for saving without pickle; inverse of :meth:`from_arrays`.

        A running total of a pass (its scatter in :class:`UpperPanels`, as a checkpoint
        saves it) is written as its panels, half the bytes, and stays as it is; anything
        else is completed (:meth:`symmetrize`) and written as full matrices.
        """
        panels = self.upper and isinstance(self.scatter, UpperPanels)
        if not panels:
            self.symmetrize()
        d = self.n_features
        arrays = {"n": np.asarray(self.n), "mean": self.mean,
                  "precision": np.asarray(self.precision),
                  "scatter_exponent": np.asarray(self.scatter_exponent),
                  "n_nonfinite": np.asarray(self.n_nonfinite),
                  "nonfinite_rows": np.asarray(self.nonfinite_rows, np.int64)}
        meta = {"n_attributes": len(self.attributes), "categories": []}
        if panels:
            arrays["scatter_panels"] = self.scatter.data
            meta["panel_width"] = self.scatter.width
        else:
            arrays["scatter"] = self.scatter
        for j, a in enumerate(self.attributes):
            arrays[f"counts_{j}"] = a.counts
            arrays[f"deviation_{j}"] = a.deviation
            if a.scatter is not None:
                arrays[f"group_scatter_{j}"] = (np.stack([_full(x, d) for x in a.scatter])
                                                if isinstance(a.scatter, list) else a.scatter)
            meta["categories"].append(_categories_to_json(a.categories))
        return arrays, meta

    @classmethod
    def from_arrays(cls, arrays, meta) -> "Moments":
        attrs = []
        for j in range(meta["n_attributes"]):
            key = f"group_scatter_{j}"
            sc = arrays[key] if key in arrays else None
            attrs.append(
                AttributeMoments(
                    _categories_from_json(meta["categories"][j]),
                    np.asarray(arrays[f"counts_{j}"]),
                    np.asarray(arrays[f"deviation_{j}"]),
                    None if sc is None else np.asarray(sc),
                )
            )
        mean = np.asarray(arrays["mean"])
        if "scatter_panels" in arrays:  # a pass's running total: resumes as one
            scatter = UpperPanels(len(mean), int(meta["panel_width"]),
                                  np.array(arrays["scatter_panels"], dtype=np.float64))
        else:
            scatter = np.asarray(arrays["scatter"])
        return cls(int(arrays["n"]), mean, scatter,
                   attrs, int(arrays["n_nonfinite"]), [int(r) for r in arrays["nonfinite_rows"]],
                   precision=float(arrays["precision"]), upper="scatter_panels" in arrays,
                   scatter_exponent=int(arrays["scatter_exponent"]) if "scatter_exponent" in arrays else 0)

    def save(self, path, *, overwrite: bool = False) -> None:
        """Save to a directory (``.npz`` arrays + JSON), atomically; see :mod:`dfairpca.io`.

        ``overwrite=True`` replaces statistics saved by dfairpca at ``path``, nothing else.
        """
        from .io import save_arrays

        arrays, meta = self.to_arrays()
        save_arrays(path, arrays, {"kind": "Moments", **meta}, overwrite=overwrite)

    @classmethod
    def load(cls, path) -> "Moments":
        """Read what :meth:`save` wrote, checked first (:class:`dfairpca.io.SavedFileError`
        names the file and what is wrong); never unpickles."""
        from .io import SavedFileError, load_arrays

        arrays, meta = load_arrays(path, kind="Moments", layout=_saved_layout)
        n = int(arrays["n"])
        problem = (
            "'n' is negative" if n < 0 else
            "'n_nonfinite' is negative" if int(arrays["n_nonfinite"]) < 0 else
            "'precision' is not in (0, 1)" if not 0 < float(arrays["precision"]) < 1 else
            next((f"the group counts 'counts_{j}' do not add up to n = {n}"
                  for j in range(meta["n_attributes"])
                  if (arrays[f"counts_{j}"] < 0).any() or int(arrays[f"counts_{j}"].sum()) != n),
                 None)
        )
        if problem:
            raise SavedFileError(f"cannot load {str(path)!r}: arrays.npz: {problem}; it was "
                                 "edited or not written by dfairpca: compute it again")
        return cls.from_arrays(arrays, meta)


def saved_group_counts(cats: list, key: str, names: list) -> list[int]:
    """Number of groups of each attribute saved in meta.json's ``key`` (one error naming
    the attribute whose labels do not decode)."""
    ms = []
    for name, c in zip(names, cats):
        try:
            ms.append(len(_categories_from_json(c)))
        except ValueError as exc:
            raise ValueError(f"meta.json: {key!r} of {name}: {exc}") from None
    return ms


def _saved_layout(meta: dict, headers: dict) -> dict:
    """Check a saved Moments' meta.json; the shape and kind of each array it implies."""
    from .io import header_shape, meta_value

    p = meta_value(meta, "n_attributes", "count")
    cats = meta_value(meta, "categories", "list")
    if len(cats) != p:
        raise ValueError(f"meta.json: 'categories' lists {len(cats)} attributes, not {p}")
    ms = saved_group_counts(cats, "categories", [f"attribute {j}" for j in range(p)])
    (d,) = header_shape(headers, "mean", 1)
    specs = {"n": ((), "iu"), "mean": ((d,), "f"), "precision": ((), "f"),
             "n_nonfinite": ((), "iu"), "nonfinite_rows": ((None,), "iu")}
    if "scatter_panels" in headers:  # a pass's running total, as a checkpoint saves it
        width = meta_value(meta, "panel_width", "positive")
        specs["scatter_panels"] = ((UpperPanels.size(d, width),), "f")
    else:
        specs["scatter"] = ((d, d), "f")
    for j, m in enumerate(ms):
        specs[f"counts_{j}"] = ((m,), "iu")
        specs[f"deviation_{j}"] = ((m, d), "f")
        specs[f"group_scatter_{j}"] = ((m, d, d), "?f")
    return specs


#: columns per panel of :class:`UpperPanels`
PANEL_WIDTH = 512


class UpperPanels:
    """The upper triangle of a symmetric d x d float64 matrix, stored by column panels.

    The running scatter matrix of a pass lives here: panel i holds rows ``0 .. e_i`` of
    columns ``s_i .. e_i`` (column-major), so the storage is ``d^2 / 2 + d * width / 2``
    doubles (177 MB at d = 6,400 against 328 MB for the full matrix), every update is a
    vectorised add per panel and the rank-p Chan correction a small product per panel.
    :meth:`to_full` gives the symmetric matrix once the pass is over.
    """

    __slots__ = ("d", "width", "data")

    def __init__(self, d: int, width: int | None = None, data: np.ndarray | None = None):
        self.d, self.width = int(d), int(width or PANEL_WIDTH)
        size = self.size(self.d, self.width)
        self.data = np.zeros(size) if data is None else data
        if self.data.shape != (size,) or self.data.dtype != np.float64:
            raise ValueError("UpperPanels data has the wrong size or dtype")

    def _bounds(self):
        return _panel_bounds(self.d, self.width)

    @staticmethod
    def size(d: int, width: int) -> int:
        """Doubles the panels of a d x d matrix take."""
        return sum(e * (e - s) for s, e in _panel_bounds(d, width))

    def panels(self):
        """(s, e, view) for every panel; ``view`` is ``S[:e, s:e]`` (float64, writable)."""
        off = 0
        for s, e in self._bounds():
            size = e * (e - s)
            yield s, e, self.data[off : off + size].reshape(e, e - s, order="F")
            off += size

    # the bits of the ndarray interface the rest of the package asks of a scatter matrix
    shape = property(lambda self: (self.d, self.d))
    dtype = property(lambda self: self.data.dtype)
    nbytes = property(lambda self: self.data.nbytes)

    @classmethod
    def from_upper(cls, M) -> "UpperPanels":
        """Panels holding the upper triangle of M (any float dtype; a copy)."""
        if isinstance(M, UpperPanels):
            return cls(M.d, M.width, M.data.copy())
        out = cls(M.shape[0])
        out.add(M)
        return out

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

    def to_full(self) -> np.ndarray:
        """The symmetric (d, d) float64 matrix (a new array; the panels are not changed)."""
        S = np.empty((self.d, self.d), order="F")
        for s, e, P in self.panels():
            S[:e, s:e] = P
        return _fill_lower(S)

    def __reduce__(self):
        return (UpperPanels, (self.d, self.width, self.data))


def _panel_bounds(d: int, width: int) -> list[tuple[int, int]]:
    return [(s, min(d, s + width)) for s in range(0, d, width)]


def _full(M, d: int) -> np.ndarray:
    """The symmetric float64 matrix of a pass's upper-triangle storage (None: zeros)."""
    if M is None:
        return np.zeros((d, d))
    return M.to_full() if isinstance(M, UpperPanels) else _fill_lower(M)


def _fill_lower(S: np.ndarray, block: int = 512) -> np.ndarray:
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


def _accumulate(mats, delta: np.ndarray, weights: np.ndarray, upper: bool,
                reuse_first: bool = False):
    """``sum(mats) + delta^T diag(weights) delta`` in float64.

    ``mats`` are the parts' scatter matrices (float32 or float64 arrays, or
    :class:`UpperPanels`); the rank-p term is the Chan et al. correction for the parts'
    different means.  With ``upper`` (inside a pass) only upper triangles are meaningful and
    the result is :class:`UpperPanels`, taken over from the first part when ``reuse_first``
    and it is already one; otherwise the result is a full symmetric array.
    """
    A = delta * np.sqrt(weights)[:, None]  # (parts, d)
    if upper:
        first = mats[0]
        out = first if reuse_first and isinstance(first, UpperPanels) else UpperPanels.from_upper(first)
        for M in mats[1:]:
            out.add(M)
        return out.add_gram(A)
    out = np.array(_fortran(mats[0]), dtype=np.float64, order="F")
    for M in mats[1:]:
        out += _fortran(M)
    # the correction straight into out (BLAS, beta = 1): no d x d temporary
    return scipy.linalg.blas.dgemm(1.0, A, A, beta=1.0, c=out, trans_a=1, overwrite_c=1)


def _fortran(M: np.ndarray) -> np.ndarray:
    """The full symmetric M laid out column-major without a copy where possible (in
    row-major order it is its own transpose)."""
    if M.flags.f_contiguous:
        return M
    if M.flags.c_contiguous:
        return M.T
    return np.asfortranarray(M)


def merge(parts: Sequence[Moments], *, reuse_first: bool = False) -> Moments:
    """Statistics of the union of several parts.

    Exact (up to rounding) for any split of the rows; parts may have seen different group
    labels, which are aligned onto the sorted union.  Parts with ``n == 0`` contribute
    only their NaN bookkeeping.  While any part holds only upper triangles (inside a pass)
    the merged scatter is :class:`UpperPanels`; ``reuse_first=True`` lets it be the first
    part's own panels, updated in place (the caller must not use that part again): the
    engine's chains then fold each new chunk into one running float64 sum.
    """
    parts = list(parts)
    if not parts:
        raise ValueError("merge() needs at least one Moments")
    d = parts[0].n_features
    p = len(parts[0].attributes)
    for q in parts:
        if q.n_features != d:
            raise ValueError(f"cannot merge statistics of {q.n_features} and {d} features")
        if len(q.attributes) != p:
            raise ValueError(
                f"cannot merge statistics of {len(q.attributes)} and {p} protected attributes"
            )
    gs = [all(a.scatter is not None for a in q.attributes) for q in parts]
    group_scatter = p > 0 and all(gs)
    parts = _align_categories(parts)
    n_bad = sum(q.n_nonfinite for q in parts)
    bad_rows = sorted(r for q in parts for r in q.nonfinite_rows)[:MAX_BAD_ROWS_REPORTED]
    live = [q for q in parts if q.n > 0]
    cats = [a.categories for a in parts[0].attributes]
    if not live:
        out = Moments.empty(d, cats, group_scatter)
        out.n_nonfinite, out.nonfinite_rows = n_bad, bad_rows
        return out
    ns = np.array([q.n for q in live], dtype=np.float64)
    n = int(sum(q.n for q in live))
    means = np.stack([q.mean for q in live])
    mean = (ns @ means) / n
    delta = means - mean  # (parts, d): mean of each part minus the new mean
    upper = any(q.upper for q in live)
    own = reuse_first and live[0] is parts[0]  # the first part's sums are updated in place
    e = _merged_exponent(live, delta * np.sqrt(ns)[:, None])
    if e or any(q.scatter_exponent for q in live):  # rare: data far from 1 (module doc)
        live = [_rescaled(q, e, in_place=own and i == 0) for i, q in enumerate(live)]
    scatter = _accumulate([q.scatter for q in live], np.ldexp(delta, -e), ns, upper, own)
    attrs = []
    for j in range(p):
        counts = sum(q.attributes[j].counts for q in live)
        # each part's group mean, relative to the new overall mean
        rel = [delta[i] + q.attributes[j].deviation for i, q in enumerate(live)]
        weighted = sum(q.attributes[j].counts[:, None] * rel[i] for i, q in enumerate(live))
        dev = np.zeros_like(weighted)
        nz = counts > 0
        dev[nz] = weighted[nz] / counts[nz, None]
        gsc = None
        if group_scatter:
            # inside a pass: a list with one UpperPanels per group (None: no rows yet)
            gsc = [None] * len(counts) if upper else np.zeros((len(counts), d, d))
            for g in range(len(counts)):
                has = [i for i, q in enumerate(live) if q.attributes[j].counts[g] > 0]
                if has:
                    mats = [live[i].attributes[j].scatter[g] for i in has]
                    dg = np.ldexp(np.stack([rel[i][g] - dev[g] for i in has]), -e)
                    wg = np.array([live[i].attributes[j].counts[g] for i in has], np.float64)
                    gsc[g] = _accumulate(mats, dg, wg, upper, own and has[0] == 0)
        attrs.append(AttributeMoments(cats[j], counts.astype(np.int64), dev, gsc))
    return Moments(n, mean, scatter, attrs, n_bad, bad_rows, max(q.precision for q in live), upper,
                   e)


def _diagonal(M) -> np.ndarray:
    """The diagonal of a stored scatter matrix (array, upper-triangle array or panels)."""
    if isinstance(M, UpperPanels):
        return np.concatenate([np.diagonal(P[s:e]) for s, e, P in M.panels()])
    return np.diagonal(M).astype(np.float64)


def _merged_exponent(parts, A) -> int:
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
        top = float(_diagonal(q.scatter).max()) if q.n_features else 0.0
        if top > 0:
            tops.append(q.scatter_exponent + (np.frexp(top)[1] + 1) // 2)
    e = max(tops, default=0)
    return 0 if abs(e) <= half else int(e)


def _rescaled(q: Moments, e: int, in_place: bool) -> Moments:
    """q with its scatter matrices expressed with ``scatter_exponent`` e (a copy, unless
    ``in_place``: a pass's running total, updated where it lies)."""
    shift = 2 * (q.scatter_exponent - e)
    if shift == 0:
        return q

    def scale(M):
        if M is None:
            return None
        if isinstance(M, UpperPanels):
            if in_place:
                np.ldexp(M.data, shift, out=M.data)
                return M
            return UpperPanels(M.d, M.width, np.ldexp(M.data, shift))
        if in_place and M.dtype == np.float64 and M.flags.writeable:
            return np.ldexp(M, shift, out=M)
        return np.ldexp(np.asarray(M, dtype=np.float64), shift)

    attrs = []
    for a in q.attributes:
        sc = a.scatter
        if isinstance(sc, list):
            sc = [scale(M) for M in sc]
        elif sc is not None:
            sc = scale(sc)
        attrs.append(AttributeMoments(a.categories, a.counts, a.deviation, sc))
    return Moments(q.n, q.mean, scale(q.scatter), attrs, q.n_nonfinite, q.nonfinite_rows,
                   q.precision, q.upper, e)


def _align_categories(parts: list[Moments]) -> list[Moments]:
    """Re-express every part's group statistics over the union of the labels seen."""
    p = len(parts[0].attributes)
    if all(
        np.array_equal(q.attributes[j].categories, parts[0].attributes[j].categories)
        for q in parts
        for j in range(p)
    ):
        return parts
    unions = [
        np.unique(np.concatenate([q.attributes[j].categories for q in parts])) for j in range(p)
    ]
    out = []
    for q in parts:
        attrs = []
        for j, a in enumerate(q.attributes):
            u = unions[j]
            idx = np.searchsorted(u, a.categories)
            d = q.n_features
            counts = np.zeros(len(u), np.int64)
            dev = np.zeros((len(u), d))
            counts[idx], dev[idx] = a.counts, a.deviation
            sc = None
            if isinstance(a.scatter, list):  # inside a pass
                sc = [None] * len(u)
                for i, ix in enumerate(idx):
                    sc[ix] = a.scatter[i]
            elif a.scatter is not None:
                sc = np.zeros((len(u), d, d))
                sc[idx] = a.scatter
            attrs.append(AttributeMoments(u, counts, dev, sc))
        out.append(Moments(q.n, q.mean, q.scatter, attrs, q.n_nonfinite, q.nonfinite_rows,
                           q.precision, q.upper, q.scatter_exponent))
    return out


#: dtype kinds a saved label may have: JSON holds them exactly (a float through its
#: shortest repr, an integer of any size) and numpy reads them back with their dtype
_LABEL_KINDS = "biufU"


def _categories_to_json(c) -> dict:
    """JSON form of one attribute's sorted labels that reads back to equal values and dtype.

    Labels held in an object array are kept if they all are of one kind (str, bool, int or
    float); anything else (mixed kinds, arbitrary objects, bytes, dates) is refused here,
    at save time, rather than written in a form that loads as different groups.
    """
    c = np.asarray(c)
    if c.dtype.kind == "O":
        c = _homogeneous_labels(c)
    if c.dtype.kind not in _LABEL_KINDS:
        raise ValueError(
            f"group labels of dtype {c.dtype} (e.g. {c[:3].tolist()!r}) cannot be saved: a "
            "saved model holds booleans, integers, floats or strings as labels; convert them "
            "(e.g. labels.astype(str)) and fit again"
        )
    return {"kind": c.dtype.kind, "dtype": c.dtype.str, "values": c.tolist()}


def _homogeneous_labels(c: np.ndarray) -> np.ndarray:
    """The labels of an object array as a typed array, or ValueError naming the mix."""
    values = c.tolist()
    kinds = {
        "str" if isinstance(v, str) else
        "bool" if isinstance(v, (bool, np.bool_)) else
        "int" if isinstance(v, (int, np.integer)) else
        "float" if isinstance(v, (float, np.floating)) else type(v).__name__
        for v in values
    }
    if kinds == {"int"}:  # numpy would make float64 of int64 and uint64 values together
        for dtype in (np.int64, np.uint64):
            try:
                return np.array(values, dtype=dtype)
            except OverflowError:
                pass
    elif len(kinds) == 1 and kinds <= {"str", "bool", "float"}:
        return np.array(values)
    raise ValueError(
        f"group labels of types {sorted(kinds)} (e.g. {c[:3].tolist()!r}) cannot be saved so "
        "that they load as the same groups; use labels of one kind (all str, all int, ...) "
        "and fit again"
    )


def _categories_from_json(obj) -> np.ndarray:
    """Inverse of :func:`_categories_to_json`; ValueError saying what is wrong with ``obj``.

    Files written before the dtype was recorded hold only the kind: integers then load as
    int64, or uint64 where a label needs it.
    """
    if not isinstance(obj, dict) or not isinstance(obj.get("values"), list):
        raise ValueError(f"group labels must be {{'kind': ..., 'values': [...]}}; got {obj!r:.80}")
    kind, values = obj.get("kind"), obj["values"]
    if kind not in tuple(_LABEL_KINDS):
        raise ValueError(f"group labels of kind {kind!r} are not one of {list(_LABEL_KINDS)}")
    dtype = obj.get("dtype")
    if dtype is None:  # format of the first release
        big = kind in "iu" and any(isinstance(v, int) and v >= 2**63 for v in values)
        dtype = {"b": bool, "i": np.int64, "u": np.uint64 if big else np.int64,
                 "f": np.float64, "U": str}[kind]
    elif not isinstance(dtype, str):
        raise ValueError(f"group label dtype must be a string; got {dtype!r:.80}")
    try:
        dtype = np.dtype(dtype)
    except TypeError:
        raise ValueError(f"group label dtype {dtype!r:.80} is not a numpy dtype") from None
    want = {"b": bool, "i": int, "u": int, "f": float, "U": str}[kind]
    if dtype.kind != kind or any(type(v) is not want and not (
            kind == "f" and type(v) is int) for v in values):
        raise ValueError(f"group labels {values!r:.80} do not match their dtype {dtype}")
    try:
        c = np.array(values, dtype=dtype)
    except (OverflowError, ValueError) as exc:
        raise ValueError(f"group labels {values!r:.80} do not fit dtype {dtype}: {exc}") from None
    if c.tolist() != values or (len(c) > 1 and not (c[1:] > c[:-1]).all()):
        raise ValueError(f"group labels {values!r:.80} are not distinct, sorted values of {dtype}")
    return c


def _register_sizeof():
    """Tell Dask what a partial weighs (else it counts 56 bytes and never spills or
    weighs transfers when placing merges)."""
    from dask.sizeof import sizeof

    @sizeof.register(Moments)
    def _sizeof_moments(m):
        n = m.mean.nbytes + m.scatter.nbytes
        for a in m.attributes:
            n += a.counts.nbytes + a.deviation.nbytes
            if a.scatter is not None:
                n += sum(0 if x is None else x.nbytes for x in a.scatter)
        return int(n)


_register_sizeof()
