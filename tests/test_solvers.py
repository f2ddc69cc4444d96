"""The eigensolvers: one switch rule for the linear and the kernel solves, and each solver
against LAPACK's full ``eigh``."""

import numpy as np
import pytest
import scipy.linalg
import scipy.sparse.linalg

from dfairpca.base import _solvers


def _psd(n, seed=0, decay=0.9):
    rng = np.random.default_rng(seed)
    V = np.linalg.qr(rng.normal(size=(n, n)))[0]
    M = (V * decay ** np.arange(n)) @ V.T
    return (M + M.T) / 2


@pytest.mark.parametrize("n, k, expected", [
    (_solvers.ITERATIVE_MIN_SIZE - 1, 10, False),  # below the size: dense
    (_solvers.ITERATIVE_MIN_SIZE, _solvers.ITERATIVE_MIN_SIZE // 10, True),  # both limits met
    (_solvers.ITERATIVE_MIN_SIZE, _solvers.ITERATIVE_MIN_SIZE // 10 + 1, False),  # k > n / 10
    (6400, 400, True),
])
def test_the_switch_rule(n, k, expected):
    assert _solvers.iterative(n, k) is expected


@pytest.mark.parametrize("iterative", [False, True])
def test_the_linear_and_kernel_solves_follow_the_same_rule(iterative, monkeypatch):
    """With the threshold moved across n, "auto" is subspace iteration in the linear solve
    and Lanczos in the exact (kernel) solve, and dense LAPACK in both otherwise."""
    n, k = 120, 5
    monkeypatch.setattr(_solvers, "ITERATIVE_MIN_SIZE", n if iterative else n + 1)
    M = _psd(n, seed=1)
    _, V = _solvers.top_eigh(M, k, "auto")
    ref = _solvers.subspace_iteration(M, k) if iterative else _solvers.top_eigh(M, k, "dense")
    np.testing.assert_array_equal(V, ref[1])
    rng = np.random.default_rng(0)
    w, _ = _solvers.top_eigh_exact(M, k, rng)
    if iterative:  # ARPACK from the generator's first n draws
        fresh = np.random.default_rng(0)
        v0 = fresh.uniform(-1, 1, n)
        wl = scipy.sparse.linalg.eigsh(M, k, which="LA", tol=0.0, v0=v0, return_eigenvectors=False)
        # equal to rounding, not bit for bit: ARPACK's products run on BLAS threads whose
        # summation order may differ between calls (1e-16 apart on an AMD EPYC)
        np.testing.assert_allclose(w, np.sort(wl)[::-1], rtol=1e-13)
        assert rng.uniform() == fresh.uniform()  # the start vector was drawn: ARPACK ran
    else:  # LAPACK, and no start vector drawn
        np.testing.assert_array_equal(w, scipy.linalg.eigh(M, subset_by_index=[n - k, n - 1],
                                                           driver="evr", eigvals_only=True)[::-1])
        assert rng.uniform() == np.random.default_rng(0).uniform()


@pytest.mark.parametrize("lanczos", [False, True])
def test_top_eigh_exact_equals_full_eigh(lanczos, monkeypatch):
    n, k = 300, 8
    monkeypatch.setattr(_solvers, "ITERATIVE_MIN_SIZE", 100 if lanczos else 10**9)
    M = _psd(n, seed=2, decay=0.95)
    w, V = _solvers.top_eigh_exact(M.copy(), k, np.random.default_rng(0), overwrite=True)
    wf, Vf = scipy.linalg.eigh(M)
    np.testing.assert_allclose(w, wf[::-1][:k], rtol=1e-12)
    angles = scipy.linalg.subspace_angles(V, Vf[:, ::-1][:, :k])
    assert np.degrees(angles.max()) < 1e-8


def test_top_eigh_solvers_equal_full_eigh():
    M = _psd(200, seed=3)
    wf = scipy.linalg.eigh(M, eigvals_only=True)[::-1][:6]
    for solver in ("dense", "subspace"):
        w, V = _solvers.top_eigh(M, 6, solver)
        np.testing.assert_allclose(w, wf, rtol=1e-6 if solver == "subspace" else 1e-12)
        np.testing.assert_allclose(V.T @ V, np.eye(6), atol=1e-12)
    with pytest.raises(ValueError, match="eigen_solver must be one of"):
        _solvers.top_eigh(M, 6, "arpack")
