"""The eigensolvers: one switch rule for the linear and the kernel solves, and each solver
against LAPACK's full ``eigh``."""

import numpy as np
import pytest
import scipy.linalg
import scipy.sparse.linalg

from dfairpca.base import _solvers
from dfairpca.solve._restricted import Nullspace, restricted_top


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


def _faces_like(d, seed=0):
    """PSD with a spectrum like the faces' covariance: a few large eigenvalues, then a slow
    power-law decay (lambda_1 / lambda_k about 1e4 at k = d / 16), so that the filter's
    dynamic range and the gap around k are as in the d = 6,400 solve."""
    rng = np.random.default_rng(seed)
    V = np.linalg.qr(rng.normal(size=(d, d)))[0]
    lam = 1e4 * np.arange(1, d + 1, dtype=float) ** -1.5 + 1e-3
    lam[:3] *= [30, 10, 8]
    return (V * lam) @ V.T, lam


@pytest.mark.parametrize("r", [0, 3])
def test_subspace_iteration_captures_the_top_k_variance_outside_q_within_rtol(r):
    """Against LAPACK on the deflated matrix: the variance the k vectors capture is within
    rtol of the best, they are orthonormal and orthogonal to Q, and each Ritz value is its
    vector's Rayleigh quotient."""
    d, k = 640, 40
    S, _ = _faces_like(d)
    S = (S + S.T) / 2
    Q = np.linalg.qr(np.random.default_rng(1).normal(size=(d, r)))[0] if r else None
    w, V = restricted_top(S, k, Q, "subspace", rtol=1e-10)
    M = Nullspace(Q).deflate(S, -np.trace(S)) if r else S
    best = scipy.linalg.eigh(M, eigvals_only=True, subset_by_index=[d - k, d - 1]).sum()
    captured = np.sum((S @ V) * V)
    assert -1e-12 <= (best - captured) / best <= 1e-9
    np.testing.assert_allclose(V.T @ V, np.eye(k), atol=1e-13)
    if r:
        assert np.abs(Q.T @ V).max() < 1e-13
    np.testing.assert_allclose(w, np.sum((S @ V) * V, axis=0), rtol=1e-10)
    assert np.all(np.diff(w) <= 0)


def test_subspace_iteration_of_a_matrix_of_rank_below_the_block():
    """Rank 20 < the block's 21 columns: the smallest Ritz value is 0 and the Chebyshev
    filter has no interval to damp; a plain power step is taken and the top k is exact."""
    rng = np.random.default_rng(2)
    A = rng.normal(size=(300, 20)) * np.linspace(3, 1, 20)
    S = A @ A.T
    w, V = _solvers.subspace_iteration(S, 5, oversample=16)
    wf, Vf = scipy.linalg.eigh(S)
    np.testing.assert_allclose(w, wf[::-1][:5], rtol=1e-9)
    assert np.degrees(scipy.linalg.subspace_angles(V, Vf[:, ::-1][:, :5]).max()) < 1e-5


def test_the_filter_converges_in_fewer_products_than_power_steps():
    """The degree-2 filter's point: at the faces' spectrum it needs fewer products of the
    d x d matrix than plain power steps to the same stopping rule (counted, not timed)."""

    class Counted(np.ndarray):
        products = 0

        def __matmul__(self, other):
            Counted.products += 1
            return np.asarray(self) @ other

    d, k = 640, 40
    S, _ = _faces_like(d, seed=3)
    _solvers.subspace_iteration(((S + S.T) / 2).view(Counted), k)
    filtered = Counted.products
    # the same block and rule with a power step: the filter's products without it
    p = k + max(16, k // 2)
    V = np.linalg.qr(np.random.default_rng(0).standard_normal((d, p)))[0]
    prev, power = None, 0
    while True:
        W = S @ V
        power += 1
        w, G = np.linalg.eigh(V.T @ W)
        total = w[-k:].sum()
        if prev is not None and abs(total - prev) <= 1e-8 * abs(total):
            break
        prev = total
        V = np.linalg.qr(W @ G[:, ::-1])[0]
    assert filtered < power, (filtered, power)


@pytest.mark.parametrize("condition", [1.0, 1e6, 1e12])
def test_orthonormal_is_a_basis_of_the_columns_in_their_order(condition):
    """Cholesky QR where the block allows it, Householder where it is too ill-conditioned
    (1e12: the Gram matrix's condition 1e24 is beyond double precision): either way
    orthonormal columns spanning A's leading columns in order (A = B R, R triangular)."""
    rng = np.random.default_rng(4)
    d, p = 500, 60
    U = np.linalg.qr(rng.normal(size=(d, p)))[0]
    W = np.linalg.qr(rng.normal(size=(p, p)))[0]
    A = (U * np.logspace(0, -np.log10(condition), p)) @ W
    B = _solvers.orthonormal(A)
    np.testing.assert_allclose(B.T @ B, np.eye(p), atol=1e-13)
    R = B.T @ A  # upper triangular up to rounding: column j of A lies in span(B[:, :j+1])
    assert np.abs(np.tril(R, -1)).max() <= 1e-10 * np.abs(R).max()
    np.testing.assert_allclose(B @ R, A, atol=1e-12 * np.abs(A).max())
    # Cholesky QR's R has a positive diagonal (LAPACK's Householder QR's here does not):
    # the fast path ran where it should and not where it cannot
    assert np.all(np.diag(R) > 0) == (condition <= 1e6)


def test_orthonormal_of_a_block_with_a_zero_column_is_householder():
    A = np.random.default_rng(5).normal(size=(50, 6))
    A[:, 3] = 0
    B = _solvers.orthonormal(A)
    np.testing.assert_array_equal(B, np.linalg.qr(A)[0])
