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

__all__ = ["mkl_kernel", "ROWS_PER_CALL", "NAME"]

NAME = "mkl-gemm-s8u8s32"
#: rows per call: 65,000 * 255 * 128 < 2**31
ROWS_PER_CALL = 65_000
_ROW_MAJOR, _NO_TRANS, _TRANS, _FIX_OFFSET = 101, 111, 112, 171


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
    """Exact upper triangle of ``x^T x`` (int64, lower part 0) of uint8 or int8 rows."""
    r, d = x.shape
    out = np.zeros((d, d), np.int64)
    C = np.empty((d, d), np.int32)
    co = np.zeros(1, np.int32)
    for s in range(0, r, ROWS_PER_CALL):
        blk = x[s : s + ROWS_PER_CALL]
        k = blk.shape[0]
        if x.dtype == np.uint8:
            a = np.ascontiguousarray(blk)
            b = np.ascontiguousarray((blk.astype(np.int16) - 128).astype(np.int8))
        else:
            a = np.ascontiguousarray((blk.astype(np.int16) + 128).astype(np.uint8))
            b = np.ascontiguousarray(blk)
        # row-major C (d, d) = A^T B with A = a (k, d) transposed, B = b (k, d)
        fn(_ROW_MAJOR, _TRANS, _NO_TRANS, _FIX_OFFSET, d, d, k, 1.0, a.ctypes.data, d, 0,
           b.ctypes.data, d, 0, 0.0, C.ctypes.data, d, co.ctypes.data)
        out += C
    s_ = x.sum(axis=0, dtype=np.int64)
    if x.dtype == np.uint8:
        out += 128 * s_[:, None]  # C_ij = G_ij - 128 s_i
    else:
        out -= 128 * s_[None, :]  # C_ij = G_ij + 128 s_j
    return np.asfortranarray(np.triu(out))
