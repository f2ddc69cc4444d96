"""MKL's 8-bit integer GEMM, ``cblas_gemm_s8u8s32``, as an exact Gram kernel (optional:
``pip install dfairpca[mkl]``).

``C = (op(A) + ao)(op(B) + bo)`` with A unsigned 8-bit and B signed 8-bit values, summed
in int32.  For uint8 rows X: A = X^T, B = X - 128 (int8), so ``C = X^T X - 128 s 1^T`` with
s the column sums, and ``X^T X = C + 128 s 1^T`` (int8 rows: A = X^T + 128, B = X, and
``X^T X = C - 128 1 s^T``).  One call sums at most :data:`ROWS_PER_CALL` rows, so that
``|C| <= rows * 255 * 128`` stays in int32; the calls are summed in int64.

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

import numpy as np

from ..base._blas import blas_lock

__all__ = ["mkl_kernel", "mkl_gram", "ROWS_PER_CALL", "PANEL", "NAME"]

NAME = "mkl-gemm-s8u8s32"
#: rows per call: 65,000 * 255 * 128 < 2**31
ROWS_PER_CALL = 65_000
#: rows of the product per call.  Wider panels waste work beyond the diagonal, narrower ones
#: run MKL's kernel on thinner blocks: 512 of 6,400 features costs 54% of the full product
PANEL = 512
# MKL's CBLAS enums: CblasRowMajor, CblasNoTrans, CblasTrans, and CblasFixOffset (173: one
# offset added to every entry of C; 171, CblasRowOffset, reads one offset per column)
_ROW_MAJOR, _NO_TRANS, _TRANS, _FIX_OFFSET = 101, 111, 112, 173


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
        return fn
    return None


def mkl_kernel():
    """``(name, gram, dtypes)`` of MKL's int8 GEMM as a Gram kernel, or None without MKL."""
    fn = _library()
    if fn is None:
        return None

    def gram(x: np.ndarray) -> np.ndarray:
        return mkl_gram(fn, x)

    return NAME, gram, ("uint8", "int8")


def mkl_gram(fn, x: np.ndarray) -> np.ndarray:
    """Exact upper triangle of ``x^T x`` (int64, F-ordered, lower part 0) of uint8 or int8 rows.

    The operands are the rows themselves and their other-signed copy made by flipping the
    top bit (``x - 128`` of uint8 is ``x ^ 0x80`` read as int8): one uint8 temporary, no
    wider one.  Only the lower triangle of the row-major product is formed, by row panels
    of :data:`PANEL` rows (about half the work of the full product), straight into the
    result's transposed view: the row-major lower triangle of ``x^T y`` is the F-ordered
    upper triangle that every Gram kernel returns.
    """
    r, d = x.shape
    out = np.zeros((d, d), np.int64, order="F")
    rows = out.T  # C-ordered view: rows[j, i] is out[i, j], its lower triangle out's upper
    # the int32 products of a call, all panels first: MKL's threads spin for a while after
    # each call (OpenMP's block time), and a conversion between calls would compete with them
    prod = np.empty((d, d), np.int32) if r else None
    co = np.zeros(1, np.int32)
    lock = blas_lock()
    for s0 in range(0, r, ROWS_PER_CALL):
        blk = np.ascontiguousarray(x[s0 : s0 + ROWS_PER_CALL])
        k = blk.shape[0]
        flipped = np.bitwise_xor(blk.view(np.uint8), np.uint8(0x80))
        a, b = (blk, flipped.view(np.int8)) if x.dtype == np.uint8 else (flipped, blk)
        assert prod is not None
        with lock:
            for s, e in _panels(d):
                # row-major prod[s:e, :e] = a[:, s:e]^T b[:, :e]: rows s..e of the product up
                # to its diagonal (a's columns from s: a pointer offset of s bytes)
                fn(_ROW_MAJOR, _TRANS, _NO_TRANS, _FIX_OFFSET, e - s, e, k, 1.0, a.ctypes.data + s,
                   d, 0, b.ctypes.data, d, 0, 0.0, prod[s:].ctypes.data, d, co.ctypes.data)
        del flipped
        for s, e in _panels(d):
            rows[s:e, :e] += prod[s:e, :e]
    sums = x.sum(axis=0, dtype=np.int64)
    for s, e in _panels(d):
        if x.dtype == np.uint8:
            rows[s:e, :e] += 128 * sums[s:e, None]  # product_ji = G_ji - 128 s_j
        else:
            rows[s:e, :e] -= 128 * sums[None, :e]  # product_ji = G_ji + 128 s_i
        rows[s:e, s:e] = np.tril(rows[s:e, s:e])  # the panel's part beyond the diagonal
    return out


def _panels(d: int) -> list[tuple[int, int]]:
    return [(s, min(d, s + PANEL)) for s in range(0, d, PANEL)]
