"""MKL's 8-bit integer GEMM, ``cblas_gemm_s8u8s32``, as an exact Gram kernel (optional:
``pip install dfairpca[mkl]``).

``C = (op(A) + ao)(op(B) + bo) + co`` with A unsigned 8-bit and B signed 8-bit values,
summed in int32.  For uint8 rows X: A = X^T, B = X - 128 (int8), so
``X^T X = A B + 128 s 1^T`` with s the column sums: ``co`` carries that correction, one
offset per row of C (``CblasColOffset``), and the call returns ``X^T X`` itself (int8 rows:
A = X^T + 128, B = X, ``X^T X = A B - 128 1 s^T``, one offset per column,
``CblasRowOffset``).  int32 sums hold the products of at most :data:`ROWS_PER_CALL` rows,
so that both the product and the Gram stay in int32; then they are added into an int64
total.

On CPUs without VNNI or AMX, MKL's int8 code sums pairs of products in 16 bits with
saturation (``vpmaddubsw``) and the result is wrong: this kernel is registered like any
other and used only after its self-test passes (:mod:`dfairpca.stats._int_kernels`).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import glob
import os
import sys
import threading

import numpy as np

from ..base._blas import blas_libraries_loaded, blas_lock
from ._column_sums import column_sums

__all__ = ["mkl_kernel", "mkl_gram", "mkl_add", "Pending", "ROWS_PER_CALL", "PANEL", "NAME"]

NAME = "mkl-gemm-s8u8s32"
#: rows per call, and rows whose products int32 sums hold before they go into int64: the
#: Gram of uint8 rows, up to 255**2 per row, stays below 2**31 (and every partial sum on
#: the way: a product before its offset is at most 255 * 128 per row)
ROWS_PER_CALL = 32_768
#: rows of the product per call.  Wider panels waste work beyond the diagonal, narrower ones
#: run MKL's kernel on thinner blocks: 512 of 6,400 features costs 54% of the full product
PANEL = 512
# MKL's CBLAS enums: CblasRowMajor, CblasNoTrans, CblasTrans; the offsets added to C:
# CblasRowOffset (171) reads one per column of C (n of them), CblasColOffset (172) one per
# row (m), CblasFixOffset (173) one for all
_ROW_MAJOR, _NO_TRANS, _TRANS = 101, 111, 112
_ROW_OFFSET, _COL_OFFSET, _FIX_OFFSET = 171, 172, 173


def _library():
    """The MKL runtime library (``libmkl_rt``), or None where it is not installed."""
    names = [ctypes.util.find_library("mkl_rt")]
    for prefix in {sys.prefix, os.path.dirname(os.path.dirname(sys.executable))}:
        names += sorted(glob.glob(os.path.join(prefix, "lib", "libmkl_rt.so*")))
    for name in filter(None, names):
        try:
            lib = ctypes.CDLL(name)
            fn = lib.cblas_gemm_s8u8s32
        except (OSError, AttributeError):
            continue
        i, p, f = ctypes.c_int, ctypes.c_void_p, ctypes.c_float
        # (Layout, transa, transb, offsetc, m, n, k, alpha, a, lda, ao, b, ldb, bo, beta, c,
        #  ldc, co): MKL_INT is 32-bit in mkl_rt's default LP64 interface
        fn.argtypes = [i, i, i, i, i, i, i, f, p, i, ctypes.c_int8, p, i, ctypes.c_int8, f, p, i, p]
        fn.restype = None
        blas_libraries_loaded()  # its threads count in blas_lock from now
        return fn
    return None


def mkl_kernel():
    """``(name, gram, dtypes, add)`` of MKL's int8 GEMM as a Gram kernel, or None without MKL
    (see :class:`dfairpca.stats._int_kernels.Kernel`)."""
    fn = _library()
    if fn is None:
        return None

    def gram(x: np.ndarray) -> np.ndarray:
        return mkl_gram(fn, x)

    def add(G: np.ndarray, x: np.ndarray, scratch=None, keep: bool = False):
        return mkl_add(fn, G, x, scratch, keep)

    return NAME, gram, ("uint8", "int8"), add


def mkl_gram(fn, x: np.ndarray) -> np.ndarray:
    """Exact upper triangle of ``x^T x`` (int64, F-ordered, lower part 0) of uint8 or int8 rows."""
    d = x.shape[1]
    G = np.zeros((d, d), np.int64, order="F")
    mkl_add(fn, G, x)
    return G


class Pending:
    """MKL's int32 sums of the rows not yet added into their int64 total ``target``: a
    d x d int32 array (the row-major lower triangle by panels; beyond it, garbage) and how
    many rows it holds.  :meth:`flush` adds them into the target; what holds a
    ``Pending`` must flush it before anyone reads the target."""

    __slots__ = ("buf", "rows", "target", "lock")

    def __init__(self, d: int):
        self.buf = np.empty((d, d), np.int32)
        self.rows = 0
        self.target: np.ndarray | None = None
        # held by an add from its first look at the sums to its last, and by a flush: a
        # flush from another thread (a distributed worker pickling the total to spill it
        # while the next chunk is added) waits for the add, and never meets half of one
        self.lock = threading.RLock()

    @property
    def nbytes(self) -> int:
        return self.buf.nbytes

    def flush(self) -> None:
        """Add the pending sums into the target (int64 F-ordered, its upper triangle)."""
        with self.lock:
            self._flush()

    def _flush(self) -> None:
        if self.rows and self.target is not None:
            rows = self.target.T  # C-ordered view: rows[j, i] is G[i, j], its lower triangle G's upper
            d = rows.shape[0]
            for s, e in _panels(d):
                rows[s:e, :s] += self.buf[s:e, :s]
                rows[s:e, s:e] += np.tril(self.buf[s:e, s:e])  # not the panel's part beyond the diagonal
        self.rows = 0


def mkl_add(fn, G: np.ndarray, x: np.ndarray, scratch: Pending | None = None, keep: bool = False) -> Pending | None:
    """``G += x^T x`` on the upper triangle, exactly, for uint8 or int8 rows ``x`` (r, d)
    and an F-ordered int64 (d, d) ``G``; returns the :class:`Pending` int32 sums the
    products went through, for the caller to pass again (a fresh d x d array on every
    call would cost more in page faults than MKL takes for 10,000 rows).

    With ``keep`` the last rows' products may stay in the returned ``Pending`` (MKL adds
    each call into it, ``beta = 1``, while its rows stay within :data:`ROWS_PER_CALL`):
    G is complete only after its :meth:`~Pending.flush`, which saves an int64 sweep per
    chunk.  Pending sums of another target are flushed into it first.

    The operands are the rows themselves and their other-signed copy made by flipping the
    top bit (``x - 128`` of uint8 is ``x ^ 0x80`` read as int8): one uint8 temporary, no
    wider one.  Only the lower triangle of the row-major product is formed, by row panels
    of :data:`PANEL` rows (about half the work of the full product): the row-major lower
    triangle of ``x^T x`` is the F-ordered upper triangle of G.
    """
    if scratch is None or (x.shape[0] and scratch.buf.shape != (x.shape[1],) * 2):
        if scratch is not None:
            scratch.flush()  # its rows belong to another total
        if x.shape[0] == 0:
            return scratch
        scratch = Pending(x.shape[1])
    with scratch.lock:
        _add(fn, G, x, scratch, keep)
    return scratch


def _add(fn, G: np.ndarray, x: np.ndarray, scratch: Pending, keep: bool) -> None:
    """:func:`mkl_add` with the scratch's lock held."""
    r, d = x.shape
    if scratch.target is not G:
        scratch._flush()  # its rows belong to another total
    if r == 0:
        return
    scratch.target = G
    unsigned = x.dtype == np.uint8
    lock = blas_lock()
    for s0 in range(0, r, ROWS_PER_CALL):
        blk = np.ascontiguousarray(x[s0 : s0 + ROWS_PER_CALL])
        k = blk.shape[0]
        if scratch.rows + k > ROWS_PER_CALL:  # int32 holds the Gram of ROWS_PER_CALL rows
            scratch._flush()
        flipped = np.bitwise_xor(blk.view(np.uint8), np.uint8(0x80))
        sums = column_sums(blk)
        if unsigned:  # C_ji = G_ji - 128 s_j: +128 s_j on row j
            a, b, mode, co = blk, flipped.view(np.int8), _COL_OFFSET, (128 * sums).astype(np.int32)
        else:  # C_ji = G_ji + 128 s_i: -128 s_i on column i
            a, b, mode, co = flipped, blk, _ROW_OFFSET, (-128 * sums).astype(np.int32)
        beta = 1.0 if scratch.rows else 0.0
        with lock:
            for s, e in _panels(d):
                # row-major buf[s:e, :e] (+)= a[:, s:e]^T b[:, :e] + offsets: rows s..e of
                # the Gram up to its diagonal (a's columns from s: a pointer offset of s
                # bytes; the offsets of rows s..e, or of columns 0..e)
                offsets = co[s:e] if unsigned else co[:e]
                fn(_ROW_MAJOR, _TRANS, _NO_TRANS, mode, e - s, e, k, 1.0, a.ctypes.data + s, d, 0,
                   b.ctypes.data, d, 0, beta, scratch.buf[s:].ctypes.data, d, offsets.ctypes.data)
        scratch.rows += k
        del flipped
    if not keep:
        scratch._flush()


def _panels(d: int) -> list[tuple[int, int]]:
    return [(s, min(d, s + PANEL)) for s in range(0, d, PANEL)]
