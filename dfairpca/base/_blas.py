"""The BLAS product of the pass: ``C += x^T x`` (``?syrk``) without holding the GIL, and
when to let only one such product run at a time.

scipy's ``blas.?syrk`` wrapper keeps the GIL for the whole product, so the threads of a
Dask worker could only take turns.  The same BLAS routine called through ctypes (its
address from ``scipy.linalg.cython_blas``) releases it, and the threads' products run side
by side.
"""

from __future__ import annotations

import contextlib
import ctypes
import threading

import numpy as np
import scipy.linalg.blas
from scipy.linalg import cython_blas
from ..errors import InvalidInputError

# Deferred imports: threadpoolctl (heavy or optional) is imported in the functions that use them, so
# that importing this module stays light.

__all__ = ["syrk", "ctypes_syrk", "blas_lock", "blas_libraries_loaded", "BLAS_LOCK"]

#: one multi-threaded BLAS product at a time per process: two concurrent calls that each
#: use every BLAS thread (Dask's threaded scheduler) run 25% slower than the same calls in
#: turn; reading and centering still overlap.  With single-threaded BLAS (Dask workers set
#: OMP/OPENBLAS_NUM_THREADS=1) the products of a worker's threads run side by side.
BLAS_LOCK = threading.Lock()

_SYRK: dict = {}


def syrk(dtype):
    """``syrk(C, xc)``: ``C += xc^T xc`` on the upper triangle of the F-ordered (d, d) C,
    for C-ordered (r, d) xc, in ``dtype`` (float32 or float64); returns C.

    The ctypes binding (:func:`ctypes_syrk`, GIL released) where scipy exports the
    routine, else scipy's f2py wrapper (the same routine, holding the GIL).
    """
    key = np.dtype(dtype).char
    fn = _SYRK.get(key)
    if fn is None:
        try:
            fn = _SYRK[key] = ctypes_syrk(key)
        except Exception:  # no capsule: the f2py wrapper (same routine, holds the GIL)
            f2py = scipy.linalg.blas.get_blas_funcs("syrk", dtype=dtype)

            def fn(C, xc):
                return f2py(1.0, xc.T, beta=1.0, c=C, trans=0, lower=0, overwrite_c=1)

            _SYRK[key] = fn
    return fn


def ctypes_syrk(char: str):
    """The BLAS ``ssyrk`` (``char == "f"``) or ``dsyrk`` (``"d"``) as :func:`syrk`'s
    ``syrk(C, xc)``, called through ctypes so that the GIL is released while it runs."""
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

    def call(C, xc):
        xc = np.ascontiguousarray(xc, dtype=dtype)
        r, d = xc.shape
        if C.dtype != dtype or C.shape != (d, d) or not C.flags.f_contiguous or not C.flags.writeable:
            raise InvalidInputError("syrk needs a writable F-ordered (d, d) C of the product's dtype")
        if r == 0:
            return C
        # xc (r, d) C-ordered is A = xc^T (d, r) F-ordered: C += A A^T, "N", lda = d
        n, k, one = ctypes.c_int(d), ctypes.c_int(r), real(1.0)
        f(b"U", b"N", ctypes.byref(n), ctypes.byref(k), ctypes.byref(one), xc.ctypes.data,
          ctypes.byref(n), ctypes.byref(one), C.ctypes.data, ctypes.byref(n))
        return C

    return call


def blas_lock():
    """:data:`BLAS_LOCK` when BLAS runs several threads, else no lock."""
    try:
        threads = max((i["num_threads"] for i in _blas_controller().info() if i["user_api"] == "blas"),
                      default=1)
    except Exception:
        threads = 2
    return BLAS_LOCK if threads > 1 else contextlib.nullcontext()


_CONTROLLER: list = []  # [the view of the libraries] once found
_SEARCHES = [0]  # how many times the libraries must be searched again (blas_libraries_loaded)
_CONTROLLER_LOCK = threading.Lock()


def _blas_controller():
    """threadpoolctl's view of the BLAS libraries loaded in this process, found once: the
    search walks every loaded library (about 3 ms, which every product paid, and the
    exact kernels' self-tests and timings a hundred times); asking the libraries found for
    their thread counts, as :func:`blas_lock` does, costs microseconds and follows
    ``threadpool_limits``.  :func:`blas_libraries_loaded` makes the next call search again."""
    with _CONTROLLER_LOCK:
        if _CONTROLLER:
            return _CONTROLLER[0]
        generation = _SEARCHES[0]
    from threadpoolctl import ThreadpoolController

    found = ThreadpoolController()  # outside the lock: the other threads' products go on
    with _CONTROLLER_LOCK:
        # kept only if no library was loaded during the search (it may have missed it)
        if not _CONTROLLER and _SEARCHES[0] == generation:
            _CONTROLLER.append(found)
    return found


def blas_libraries_loaded() -> None:
    """Say that a BLAS library was loaded (MKL's, by its kernel): :func:`blas_lock` counts
    its threads from the next call."""
    with _CONTROLLER_LOCK:
        _SEARCHES[0] += 1
        _CONTROLLER.clear()
