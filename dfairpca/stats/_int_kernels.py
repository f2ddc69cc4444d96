"""Exact integer Gram matrices ``x^T x`` of integer rows, and the kernels that form them.

A kernel takes a C-ordered (r, d) block of integer values and returns the upper triangle
of ``x^T x`` as an F-ordered (d, d) int64 array whose strictly lower part is 0.  Every
kernel must be *exact*: the result is the integer sum, so no blocking, thread count or
order of the rows can change a bit of it.

* :func:`portable_gram` runs on any BLAS.  The values are shifted to be symmetric about 0
  (uint8: ``x - 128`` in [-128, 127], products of at most 2**14); a float32 ``syrk`` over
  at most ``2**24 // max_product`` rows (1,024 for 8-bit values) then only forms integers
  below 2**24, which float32 holds exactly, and each block's result is added into a
  float64 accumulator (exact below 2**53).  16-bit values use float64 blocks the same way.
  The shift is undone in int64 from the exact column sums at the end.
* 8-bit integer GEMMs (MKL's ``cblas_gemm_s8u8s32``, :mod:`dfairpca.stats._mkl`) can be
  registered with :func:`register`.  On CPUs without VNNI/AMX such code saturates 16-bit
  intermediate sums and is *wrong*, so no kernel is trusted on CPU flags: the first use in
  a process runs :func:`self_test` on it (random values and the saturating worst case,
  255 against -128 in pairs of rows, checked against int64 numpy) and a kernel that fails
  is never used there; :func:`portable_gram` (itself self-tested, numpy's int64 product
  as the last resort) takes over.
"""

from __future__ import annotations

import ctypes
import logging
import threading
from dataclasses import dataclass
from typing import Callable

import numpy as np
from scipy.linalg import cython_blas

from ..base._blas import blas_lock
from ..base._system import BLOCK_BYTES

# Deferred imports: package modules that load such libraries, or this module, at import are imported
# in the functions that use them, so that importing this module stays light.

_log = logging.getLogger("dfairpca")

__all__ = ["Kernel", "register", "kernel_report", "unregister", "kernel_for", "chosen", "add_gram", "self_test", "portable_gram",
           "value_range", "max_product", "int8_kernel_available", "registry_generation", "PORTABLE", "NUMPY"]

#: names of the built-in paths, as ``statistics_kernel_`` reports them
PORTABLE = "blas-exact-blocks"
NUMPY = "numpy-int64"
#: columns per panel when a block's product is added into the accumulator
_PANEL = 512


def value_range(dtype) -> tuple[int, int]:
    """(lowest, highest) value of an integer or boolean dtype."""
    dtype = np.dtype(dtype)
    if dtype.kind == "b":
        return 0, 1
    info = np.iinfo(dtype)
    return int(info.min), int(info.max)


def _shift(dtype) -> int:
    """The value subtracted before the products so that they are symmetric about 0."""
    lo, hi = value_range(dtype)
    return (lo + hi + 1) // 2


def max_product(dtype, shifted: bool = True) -> int:
    """The largest ``|a * b|`` of two values of ``dtype`` (after :func:`_shift` if ``shifted``)."""
    lo, hi = value_range(dtype)
    c = _shift(dtype) if shifted else 0
    return max((lo - c) ** 2, (hi - c) ** 2, 1)


# ---------------------------------------------------------------------- the portable kernel
_SYRK0: dict = {}


def _syrk_beta0(char: str):
    """BLAS ``?syrk`` with beta = 0 (``C = x^T x`` on the upper triangle, C's strictly lower
    part untouched), through ctypes so that the GIL is released while it runs."""
    fn = _SYRK0.get(char)
    if fn is not None:
        return fn
    capsule = cython_blas.__pyx_capi__[{"f": "ssyrk", "d": "dsyrk"}[char]]
    get_name = ctypes.PYFUNCTYPE(ctypes.c_char_p, ctypes.py_object)(("PyCapsule_GetName", ctypes.pythonapi))
    get_pointer = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.py_object, ctypes.c_char_p)(
        ("PyCapsule_GetPointer", ctypes.pythonapi))
    real = ctypes.c_float if char == "f" else ctypes.c_double
    i32, p = ctypes.POINTER(ctypes.c_int), ctypes.c_void_p
    f = ctypes.CFUNCTYPE(None, ctypes.c_char_p, ctypes.c_char_p, i32, i32, ctypes.POINTER(real),
                         p, i32, ctypes.POINTER(real), p, i32)(get_pointer(capsule, get_name(capsule)))

    def call(C, xc):
        r, d = xc.shape
        # xc (r, d) C-ordered is A = xc^T (d, r) F-ordered: C = A A^T, "N", lda = d
        n, k, one, zero = ctypes.c_int(d), ctypes.c_int(r), real(1.0), real(0.0)
        f(b"U", b"N", ctypes.byref(n), ctypes.byref(k), ctypes.byref(one), xc.ctypes.data,
          ctypes.byref(n), ctypes.byref(zero), C.ctypes.data, ctypes.byref(n))
        return C

    _SYRK0[char] = call
    return call


def _block_plan(dtype, d: int) -> tuple[np.dtype, int] | None:
    """(float dtype, rows per product) of the exact blocks for ``dtype``, or None when no
    float product of one row is exact (32-bit values and wider)."""
    p = max_product(dtype)
    for f, limit in ((np.float32, 2 ** 24), (np.float64, 2 ** 53)):
        if p <= limit:
            cap = max(64, BLOCK_BYTES // (d * np.dtype(f).itemsize))
            return np.dtype(f), max(1, min(limit // p, cap))
    return None


def portable_gram(x: np.ndarray) -> np.ndarray:
    """Exact upper triangle of ``x^T x`` (int64, lower part 0) by float BLAS blocks.

    Every block's ``syrk`` sums at most ``limit // max_product`` products of shifted values,
    integers all below the float's exact limit (2**24 for float32), so each block is
    exact; the blocks are summed in float64 (exact while the rows so far times the largest
    product stay below 2**53, then moved into int64) and the shift ``c`` undone in int64:
    ``x^T x = y^T y + c (t 1^T + 1 t^T) + c^2 r`` with ``y = x - c`` and t its column sums.
    """
    r, d = x.shape
    plan = _block_plan(x.dtype, d)
    if plan is None:
        return numpy_gram(x)
    f, step = plan
    c = _shift(x.dtype)
    per_flush = max(1, (2 ** 53 // max_product(x.dtype)) // step)  # blocks float64 holds exactly
    out = None  # int64, only for chunks beyond float64's exact range (2**39 8-bit rows)
    acc = np.zeros((d, d), np.float64, order="F")
    buf = np.zeros((d, d), f, order="F")  # syrk leaves its strictly lower part 0
    product = _syrk_beta0(f.char)
    lock = blas_lock()
    blocks = 0
    for s in range(0, r, step):
        y = np.subtract(x[s : s + step], c, dtype=f)  # exact: the values fit f
        with lock:
            product(buf, y)
        _add_upper(acc, buf)
        blocks += 1
        if blocks == per_flush:
            out = _as_int64(acc) if out is None else _add_int64(out, acc)
            acc = np.zeros((d, d), np.float64, order="F")
            blocks = 0
    del buf
    # one sweep by column panels: to int64 (in acc's own memory unless an int64 total was
    # started), plus what came before, the shift undone, the diagonal block's lower part 0
    # (below it the panels are 0 already: syrk never writes there)
    t = x.sum(axis=0, dtype=np.int64) - c * r if c else None
    G = acc.view(np.int64) if out is None else out
    for s, e in _panels(d):
        P = acc[:e, s:e].astype(np.int64)
        if out is not None:
            P += out[:e, s:e]
        if c:
            assert t is not None  # the column sums, taken above whenever c is
            P += c * (t[:e, None] + t[None, s:e]) + c * c * r
        P[s:e] = np.triu(P[s:e])
        G[:e, s:e] = P
    return G


def _as_int64(acc: np.ndarray) -> np.ndarray:
    """The float64 integers of ``acc`` as int64, in acc's own memory (panel by panel: no
    second d x d array); acc is spent."""
    G = acc.view(np.int64)
    for s, e in _panels(acc.shape[0]):
        G[:, s:e] = acc[:, s:e].astype(np.int64)
    return G


def _add_int64(out: np.ndarray, acc: np.ndarray) -> np.ndarray:
    for s, e in _panels(acc.shape[0]):
        out[:, s:e] += acc[:, s:e].astype(np.int64)
    return out


def numpy_gram(x: np.ndarray) -> np.ndarray:
    """Exact upper triangle of ``x^T x`` by numpy's int64 product (slow: no BLAS)."""
    xi = x.astype(np.int64)
    return np.asfortranarray(np.triu(xi.T @ xi))


def _panels(d: int):
    return [(s, min(d, s + _PANEL)) for s in range(0, d, _PANEL)]


def _add_upper(acc: np.ndarray, M: np.ndarray) -> None:
    """``acc += M`` on the upper triangle, by column panels (half the work of a full add)."""
    for s, e in _panels(acc.shape[0]):
        acc[:e, s:e] += M[:e, s:e]


# ---------------------------------------------------------------------- the registry
@dataclass(frozen=True)
class Kernel:
    """An optional exact Gram kernel: ``gram(x) -> int64 (d, d) upper triangle`` for the
    dtypes it lists (e.g. ``("uint8", "int8")``), and optionally ``add(G, x, scratch,
    keep=False) -> scratch``, which adds that upper triangle into an int64 ``G`` in place
    through a scratch object the caller keeps between calls (None at first): a pass's
    running total then never holds a chunk's Gram of its own.  With ``keep`` the kernel
    may leave the last products in the scratch: G is complete once ``scratch.flush()``
    ran (see :func:`add_gram`)."""

    name: str
    gram: Callable[[np.ndarray], np.ndarray]
    dtypes: tuple[str, ...]
    add: Callable | None = None

    def adder(self) -> Callable:
        """``add(G, x, scratch) -> scratch``: the kernel's own, else its gram added in."""
        if self.add is not None:
            return self.add
        gram = self.gram

        def add(G, x, scratch=None, keep=False):
            if scratch is not None:  # another kernel's pending products: into their total first
                scratch.flush()
            _add_upper(G, gram(x))
            return scratch

        return add


_REGISTERED: list[Kernel] = []
_VERDICTS: dict[str, bool] = {}  # "kernel name:dtype" -> passed its self-test in this process
_LOCK = threading.Lock()
_GENERATION = [0]  # bumped by every change of the registry: what was measured of it is stale


def registry_generation() -> int:
    """A number that changes whenever a kernel is registered or withdrawn (measurements of
    the kernels, :mod:`dfairpca.stats._auto`'s, are cached per generation)."""
    return _GENERATION[0]


def register(kernel: Kernel, first: bool = True) -> None:
    """Offer ``kernel``; it is used only once :func:`self_test` passes in the process."""
    with _LOCK:
        unregister(kernel.name, _locked=True)
        _REGISTERED.insert(0 if first else len(_REGISTERED), kernel)
        _GENERATION[0] += 1


def unregister(name: str, _locked: bool = False) -> None:
    """Withdraw the kernel called ``name`` (and forget its self-test)."""
    if not _locked:
        with _LOCK:
            return unregister(name, True)
    _REGISTERED[:] = [k for k in _REGISTERED if k.name != name]
    _GENERATION[0] += 1
    for key in [key for key in _VERDICTS if key.rpartition(":")[0] == name]:
        del _VERDICTS[key]


def self_test_data(dtype, rng=None) -> list[np.ndarray]:
    """The blocks a kernel must get exactly right: random values of ``dtype`` and the
    worst cases of an 8-bit GEMM, the highest value against the lowest in every pair of
    rows (255 against -128 once shifted: a pair's sum of products, -65,280, saturates any
    16-bit intermediate), all lows and all highs, over enough rows to leave int16; sums
    near int32's limit (a kernel that rounds through float32 or wraps there fails); more
    columns than one panel."""
    rng = np.random.default_rng(0) if rng is None else rng
    lo, hi = value_range(dtype)
    dt = np.dtype(dtype)
    rand = rng.integers(lo, hi, size=(37, 19), endpoint=True).astype(dt)
    extreme = np.empty((64, 16), dt)
    extreme[:, 0::2] = hi
    extreme[:, 1::2] = lo
    extreme[1::2, 2::4] = lo  # rows alternate too: every sign pattern of the pairs
    highs = np.full((40, 8), hi, dt)
    lows = np.full((40, 8), lo, dt)
    # the largest sums an 8-bit kernel keeps in int32 (32,768 rows of highs against lows,
    # a few rows more; and half of them, which a kernel keeping its products pending adds
    # twice into the same int32 sums, up to their limit), more columns than one panel; the
    # values vary a little, so that each block has sums beyond 2**24 that are no float32
    # (a kernel or a pending sum that rounds through float32 fails)
    tall = np.empty((32_773, 2), dt)
    tall[:, 0] = rng.integers(hi - 3, hi, size=len(tall), endpoint=True)
    tall[:, 1] = rng.integers(lo, lo + 3, size=len(tall), endpoint=True)
    wide = rng.integers(lo, hi, size=(5, 515), endpoint=True).astype(dt)
    return [rand, extreme, highs, lows, tall, tall[:16_384], wide, rand[:, :1], rand[:0]]


def self_test(kernel_gram: Callable, dtype, add: Callable | None = None) -> bool:
    """Whether ``kernel_gram`` forms every :func:`self_test_data` Gram exactly (int64 numpy
    as the reference, upper triangle, 0 below), and ``add`` (a :class:`Kernel`'s) adds each
    twice, through the scratch it returned, into an int64 total whose entries are already
    beyond 2**32 (a kernel that wrapped or rounded there would be caught), once adding at
    once and once keeping its products pending until the scratch's flush; an exception
    counts as a failure."""
    try:
        for x in self_test_data(dtype):
            x = np.ascontiguousarray(x)
            want = numpy_gram(x)
            got = np.asarray(kernel_gram(x))
            # the whole array: merges add upper triangles, so the lower part must be 0
            if got.shape != want.shape or not np.array_equal(got, want):
                return False
            if add is not None:
                d = x.shape[1]
                start = np.triu(np.arange(d * d, dtype=np.int64).reshape(d, d) * 7919 + 2 ** 33)
                for keep in (False, True):
                    G = start.copy(order="F")  # (not asfortranarray: a 1 x 1 start is F-ordered already)
                    scratch = add(G, x, None, keep=keep)
                    scratch = add(G, x, scratch, keep=keep)
                    if scratch is not None:
                        scratch.flush()
                    if not np.array_equal(G, start + 2 * want):
                        return False
        return True
    except Exception:
        return False


def _passes(name: str, gram: Callable, dtypes, add: Callable | None = None) -> bool:
    """Whether kernel ``name`` passed its self-test for every dtype of ``dtypes`` (each
    dtype tested once per process: a kernel's uint8 and int8 paths differ)."""
    for t in dtypes:
        key = f"{name}:{np.dtype(t).name}"
        with _LOCK:
            verdict = _VERDICTS.get(key)
        if verdict is None:
            verdict = self_test(gram, t, add)
            with _LOCK:
                _VERDICTS[key] = verdict
        if not verdict:
            return False
    return True


def chosen(dtype) -> Kernel:
    """The kernel for blocks of ``dtype`` in this process: the first registered kernel for
    it that passed its self-test, else the portable one (if it passes: it always should),
    else numpy's int64 product."""
    dt = np.dtype(dtype).name
    with _LOCK:
        offered = [k for k in _REGISTERED if dt in k.dtypes]
    for k in offered:
        if _passes(k.name, k.gram, [dt], k.add):
            return k
    if _passes(PORTABLE, portable_gram, [dt]):
        return Kernel(PORTABLE, portable_gram, (dt,))
    return Kernel(NUMPY, numpy_gram, (dt,))


def kernel_for(dtype) -> tuple[str, Callable]:
    """(name, gram) of the kernel for blocks of ``dtype`` in this process (:func:`chosen`)."""
    k = chosen(dtype)
    return k.name, k.gram


def int8_kernel_available(dtype=None) -> str | None:
    """The name of a registered 8-bit kernel that passed its self-test here (for blocks of
    ``dtype``, else of either 8-bit dtype), or None: only then can an exact pass of 8-bit
    data be as fast as a float32 one's (whether it is, :mod:`dfairpca.stats._auto` measures)."""
    _load_optional()
    for dt in ("uint8", "int8") if dtype is None else (np.dtype(dtype).name,):
        name, _ = kernel_for(dt)
        if name not in (PORTABLE, NUMPY):
            return name
    return None


def chosen_kernel(x_dtype) -> str:
    """The name of the exact kernel this process uses for blocks of integer or boolean
    ``x_dtype`` (:func:`kernel_for`), the optional kernels registered and self-tested first:
    what each worker is asked before an exact pass."""
    _load_optional()
    return kernel_for(x_dtype)[0]


_OPTIONAL_LOADED = False
_OPTIONAL_LOCK = threading.Lock()


def _load_optional() -> None:
    """Register the optional kernels installed (MKL's, ``dfairpca[mkl]``) and self-test them,
    once per process, before any thread of a pass asks for a kernel: the threads that come
    while one of them loads wait for it, so every block of a pass in this process uses the
    same kernel (the flag is set only once the kernels are registered and judged)."""
    global _OPTIONAL_LOADED
    if _OPTIONAL_LOADED:
        return
    with _OPTIONAL_LOCK:
        if _OPTIONAL_LOADED:
            return
        from ._mkl import mkl_kernel

        k = mkl_kernel()
        if k is not None:
            kernel = Kernel(*k)
            register(kernel, first=False)
            for dt in kernel.dtypes:
                if not _passes(kernel.name, kernel.gram, [dt], kernel.add):
                    _log.info("%s failed its self-test on this CPU (it saturates 16-bit sums "
                              "without VNNI or AMX): exact statistics of 8-bit data use the "
                              "portable kernel %s here", kernel.name, PORTABLE)
                    break
        _OPTIONAL_LOADED = True


def kernel_report() -> dict[str, bool | None]:
    """Which exact kernels passed their self-test in this process, for 8-bit data: the
    optional kernels installed, then the portable one, each ``True`` (passed for every
    dtype it serves), ``False`` (refused for one) or ``None`` (not tested: a kernel before
    it served every 8-bit dtype here, so the portable one was never needed)."""
    _load_optional()
    for dt in ("uint8", "int8"):
        kernel_for(dt)
    with _LOCK:
        kernels = [(k.name, [t for t in k.dtypes]) for k in _REGISTERED]
        verdicts = dict(_VERDICTS)
    kernels.append((PORTABLE, ["uint8", "int8"]))

    def verdict(name, dtypes):
        seen = [verdicts[f"{name}:{t}"] for t in dtypes if f"{name}:{t}" in verdicts]
        return None if not seen else all(seen)

    return {name: verdict(name, dtypes) for name, dtypes in kernels}


def gram(x: np.ndarray) -> tuple[np.ndarray, str]:
    """(exact upper triangle of ``x^T x`` as int64, the kernel's name) for a block of
    integer or boolean rows."""
    _load_optional()
    x = np.ascontiguousarray(x)
    if x.dtype.kind == "b":
        x = x.view(np.uint8)  # 0/1: the same values
    name, fn = kernel_for(x.dtype)
    return fn(x), name


def add_gram(G: np.ndarray, x: np.ndarray, scratch=None, keep: bool = False) -> tuple[str, object]:
    """``G += x^T x`` exactly on the upper triangle of the int64 F-ordered ``G``, for a
    block of integer or boolean rows: (the kernel's name, the scratch to pass next time,
    None or an object with a ``flush()``).  What a running total uses: the block's Gram is
    never a d x d array of its own.  With ``keep`` G is complete only once the scratch's
    ``flush()`` ran (the kernel may hold the last products in it)."""
    _load_optional()
    x = np.ascontiguousarray(x)
    if x.dtype.kind == "b":
        x = x.view(np.uint8)  # 0/1: the same values
    k = chosen(x.dtype)
    return k.name, k.adder()(G, x, scratch, keep=keep)
