"""The pass's BLAS product: the GIL-free syrk binding and when products take turns."""

import numpy as np
import pytest

from dfairpca.base._blas import BLAS_LOCK, blas_lock, ctypes_syrk, syrk


def _close(a, b, x, C, dtype):
    """Equal to the rounding of a sum of products in ``dtype``: entry by entry, a few eps of
    the sum of the terms' magnitudes (an entry that cancels to 0.08 out of terms summing to
    37 differs between BLAS kernels by more than a relative 1e-5; it did on an AMD EPYC)."""
    bound = 8 * len(x) * np.finfo(dtype).eps * (np.abs(C) + np.abs(x).T @ np.abs(x))
    assert np.all(np.abs(np.triu(a) - np.triu(b)) <= np.triu(bound))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_gil_free_syrk_matches_blas(dtype):
    import scipy.linalg.blas as blas

    rng = np.random.default_rng(5)
    x = rng.standard_normal((37, 23)).astype(dtype)
    C = np.asfortranarray(np.triu(rng.standard_normal((23, 23))).astype(dtype))
    x64, C64 = x.astype(np.float64), C.astype(np.float64)
    expect = np.triu(C64 + x64.T @ x64)
    for f in (syrk(dtype), ctypes_syrk(np.dtype(dtype).char)):
        _close(f(C.copy(order="F"), x), expect, x64, C64, dtype)
    _close(blas.get_blas_funcs("syrk", dtype=dtype)(1.0, x.T, trans=0, lower=0), x64.T @ x64, x64,
           0 * C64, dtype)
    with pytest.raises(ValueError, match="F-ordered"):
        syrk(dtype)(np.zeros((23, 23), dtype), x)  # C-ordered: refused, not silently wrong


def test_blas_products_are_serialised_only_when_blas_is_multithreaded():
    import contextlib

    from threadpoolctl import threadpool_limits

    with threadpool_limits(1):
        assert isinstance(blas_lock(), contextlib.nullcontext)
    with threadpool_limits(2):
        assert blas_lock() is BLAS_LOCK


def test_the_blas_libraries_are_searched_once_until_one_is_loaded(monkeypatch):
    import contextlib

    from threadpoolctl import threadpool_limits

    from dfairpca.base import _blas

    monkeypatch.setattr(_blas, "_CONTROLLER", [])
    with threadpool_limits(2):
        assert blas_lock() is BLAS_LOCK
        (found,) = _blas._CONTROLLER
        assert [blas_lock() for _ in range(50)] == [BLAS_LOCK] * 50
        assert _blas._CONTROLLER == [found]  # each product asks the libraries found, no search
    with threadpool_limits(1):
        assert isinstance(blas_lock(), contextlib.nullcontext)  # their threads, asked anew

    class OneThread:  # the view of a process whose BLAS, as last searched, runs one thread
        def info(self):
            return [{"user_api": "blas", "num_threads": 1}]

    monkeypatch.setattr(_blas, "_CONTROLLER", [OneThread()])
    with threadpool_limits(2):
        assert isinstance(blas_lock(), contextlib.nullcontext)
        _blas.blas_libraries_loaded()  # a library loaded since (MKL's, by its kernel)
        assert blas_lock() is BLAS_LOCK


def test_a_search_that_a_library_load_overtook_is_not_kept(monkeypatch):
    import threadpoolctl

    from dfairpca.base import _blas

    real = threadpoolctl.ThreadpoolController

    def overtaken():
        found = real()
        _blas.blas_libraries_loaded()  # another thread loads MKL while this one searched
        return found

    monkeypatch.setattr(_blas, "_CONTROLLER", [])
    monkeypatch.setattr(threadpoolctl, "ThreadpoolController", overtaken)
    assert _blas._blas_controller() is not None and _blas._CONTROLLER == []  # used once, not kept
    monkeypatch.setattr(threadpoolctl, "ThreadpoolController", real)
    assert _blas._blas_controller() is _blas._CONTROLLER[0]


def test_syrk_lets_other_threads_run():
    """The product releases the GIL: while it runs in one thread, Python code in another
    keeps running (with scipy's f2py wrapper that thread would stall for the whole call):
    a loop here counts its turns between the product's start and end, events the product's
    thread records."""
    import threading

    from threadpoolctl import threadpool_limits

    x = np.random.default_rng(0).standard_normal((1500, 2500)).astype(np.float32)
    C = np.zeros((2500, 2500), np.float32, order="F")
    started, ended = threading.Event(), threading.Event()

    def run():
        started.set()
        syrk(np.float32)(C, x)
        ended.set()

    with threadpool_limits(1):
        t = threading.Thread(target=run)
        t.start()
        started.wait()
        turns = 0
        while not ended.is_set():
            turns += 1
        t.join()
    # holding the GIL, the product would let this loop run a turn or two (a switch
    # request is granted only once the call returns); released, it runs millions
    assert turns > 1000, turns
