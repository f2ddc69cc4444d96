"""The statistics core: exact per chunk, and the merge of parts equals the whole."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import dfairpca
from dfairpca.moments import Moments, merge
from oracle import make_data


def dense_moments(X, labels, cats):
    n = X.shape[0]
    mean = X.mean(0)
    S = (X - mean).T @ (X - mean)
    out = []
    for lab, c in zip(labels, cats):
        dev = np.stack([X[lab == v].mean(0) - mean if (lab == v).any() else np.zeros(X.shape[1]) for v in c])
        counts = np.array([(lab == v).sum() for v in c])
        gsc = np.stack([
            (X[lab == v] - X[lab == v].mean(0)).T @ (X[lab == v] - X[lab == v].mean(0))
            if (lab == v).any() else np.zeros((X.shape[1],) * 2) for v in c
        ])
        out.append((counts, dev, gsc))
    return n, mean, S, out


def chunk(X, labels, cats, s, e, group_scatter=True):
    codes = np.column_stack([np.searchsorted(c, lab[s:e]) for lab, c in zip(labels, cats)])
    return Moments.from_chunk(X[s:e], codes, cats, row_offset=s, group_scatter=group_scatter)


def assert_matches(m, X, labels, cats, rtol=1e-9):
    n, mean, S, groups = dense_moments(X, labels, cats)
    scale = np.abs(X).max()
    assert m.n == n
    np.testing.assert_allclose(m.mean, mean, rtol=rtol, atol=rtol * scale)
    np.testing.assert_allclose(m.scatter, S, rtol=rtol, atol=rtol * scale**2 * n)
    for a, (counts, dev, gsc) in zip(m.attributes, groups):
        np.testing.assert_array_equal(a.counts, counts)
        np.testing.assert_allclose(a.deviation, dev, rtol=rtol, atol=rtol * scale)
        np.testing.assert_allclose(a.scatter, gsc, rtol=rtol, atol=rtol * scale**2 * n)


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(8, 200),
    d=st.integers(1, 7),
    ms=st.lists(st.integers(2, 4), min_size=1, max_size=3),
    cuts=st.lists(st.floats(0, 1), max_size=6),
    seed=st.integers(0, 1000),
    offset=st.sampled_from([0.0, 1e6]),
)
def test_merge_of_parts_equals_statistics_of_union(n, d, ms, cuts, seed, offset):
    X, labels = make_data(n, d, ms, seed=seed)
    X = X + offset  # a large common offset must not cost precision (no E[xx]-E[x]^2)
    cats = [np.arange(m) for m in ms]
    bounds = sorted({0, n, *(int(c * n) for c in cuts)})
    parts = [chunk(X, labels, cats, s, e) for s, e in zip(bounds[:-1], bounds[1:])]
    whole = merge(parts)
    assert_matches(whole, X, labels, cats, rtol=1e-8)
    # associativity: a tree of merges equals the flat merge
    if len(parts) >= 3:
        tree = merge([merge(parts[:2]), merge(parts[2:])])
        np.testing.assert_allclose(tree.scatter, whole.scatter, rtol=1e-10, atol=1e-6)


def test_merge_aligns_different_labels():
    X, (g,) = make_data(300, 4, (3,), seed=1)
    lab = np.array(["a", "b", "c"])[g]
    est = dfairpca.FairPCA(2)
    first = lab[:150] != "c"
    est.partial_fit(X[:150][first], sensitive_features=lab[:150][first])
    est.partial_fit(np.concatenate([X[:150][~first], X[150:]]), sensitive_features=np.concatenate([lab[:150][~first], lab[150:]]))
    full = dfairpca.FairPCA(2).fit(np.concatenate([X[:150][first], X[:150][~first], X[150:]]), sensitive_features=np.concatenate([lab[:150][first], lab[:150][~first], lab[150:]]))
    assert list(est.groups_[0]) == ["a", "b", "c"]
    np.testing.assert_allclose(np.abs(est.components_ @ full.components_.T), np.eye(2), atol=1e-9)


def test_float32_products_accumulate_in_float64():
    rng = np.random.default_rng(0)
    X = rng.integers(0, 256, size=(5000, 16)).astype(np.uint8)
    m32 = dfairpca.compute_moments(X, dtype=np.float32)
    m64 = dfairpca.compute_moments(X, dtype=np.float64)
    assert m32.scatter.dtype == np.float64 and m32.precision == np.finfo(np.float32).eps
    np.testing.assert_allclose(m32.scatter, m64.scatter, atol=1e-5 * m64.scatter.diagonal().max())
    np.testing.assert_allclose(m32.mean, X.mean(0), rtol=1e-12)


def test_moments_save_load_roundtrip(tmp_path):
    X, labels = make_data(100, 5, (2, 3), seed=2)
    lab0 = np.where(labels[0] == 1, "yes", "no")
    cats = [np.array(["no", "yes"]), np.arange(3)]
    codes = np.column_stack([np.searchsorted(cats[0], lab0), labels[1]])
    m = Moments.from_chunk(X, codes, cats, group_scatter=True)
    m.save(tmp_path / "stats")
    back = Moments.load(tmp_path / "stats")
    np.testing.assert_array_equal(back.scatter, m.scatter)
    assert back.attributes[0].categories.tolist() == ["no", "yes"]
    np.testing.assert_array_equal(back.attributes[1].scatter, m.attributes[1].scatter)
    with pytest.raises(ValueError, match="holds a 'Moments', not a 'estimator'"):
        dfairpca.io.load_arrays(tmp_path / "stats", kind="estimator")


def test_merge_rejects_mismatched_parts():
    a = Moments.from_chunk(np.ones((3, 2)))
    b = Moments.from_chunk(np.ones((3, 4)))
    with pytest.raises(ValueError, match="4 and 2 features"):
        merge([a, b])


@settings(max_examples=30, deadline=None)
@given(d=st.integers(1, 40), width=st.integers(1, 17), seed=st.integers(0, 2**16))
def test_upper_panels_hold_the_upper_triangle(d, width, seed):
    from dfairpca.moments import UpperPanels

    rng = np.random.default_rng(seed)
    A = rng.standard_normal((d, d))
    S = A + A.T
    M = np.triu(S).astype(np.float32)
    M[np.tril_indices(d, -1)] = np.nan  # whatever lies below the diagonal is never read
    P = UpperPanels(d, width)
    P.add(M).add(np.asfortranarray(M))
    B = rng.standard_normal((3, d))
    P.add_gram(B)
    expect = 2 * np.triu(S).astype(np.float32).astype(np.float64)
    expect = np.triu(expect) + np.triu(expect, 1).T + B.T @ B
    np.testing.assert_allclose(P.to_full(), expect, rtol=1e-12, atol=1e-12)
    assert P.nbytes < 8 * (d * d / 2 + d * width / 2 + d) + 1
    # adding panels of another width, copying, pickling
    Q = UpperPanels.from_upper(P)
    Q.add(UpperPanels.from_upper(expect) if width == 1 else UpperPanels(d, width + 1).add(expect))
    np.testing.assert_allclose(Q.to_full(), 2 * expect, rtol=1e-12, atol=1e-12)
    import pickle

    np.testing.assert_array_equal(pickle.loads(pickle.dumps(P)).to_full(), P.to_full())


@settings(max_examples=25, deadline=None)
@given(n=st.integers(4, 120), d=st.integers(1, 9), width=st.integers(1, 5),
       cuts=st.lists(st.integers(1, 119), max_size=6), seed=st.integers(0, 2**16))
def test_a_pass_folding_chunks_in_place_equals_the_whole(n, d, width, cuts, seed):
    """The engine's path: upper-triangle float32 chunks folded into one float64 sum in place."""
    import dfairpca.moments as mm

    old = mm.PANEL_WIDTH
    mm.PANEL_WIDTH = width
    try:
        X, g = make_data(n, d, (3,), seed=seed)
        X = X + 50.0  # an offset, which the pairwise update must not lose
        labels = [g[0]]
        cats = [np.arange(3)]
        bounds = sorted({0, n, *[c for c in cuts if c < n]})
        total = None
        for s, e in zip(bounds[:-1], bounds[1:]):
            codes = g[0][s:e, None]
            part = Moments.from_chunk(X[s:e], codes, cats, symmetric=False, dtype=np.float64,
                                      group_scatter=True)
            assert part.upper
            total = part if total is None else merge([total, part], reuse_first=True)
        assert isinstance(total.scatter, mm.UpperPanels) or len(bounds) == 2
        assert_matches(total.symmetrize(), X, labels, cats)
    finally:
        mm.PANEL_WIDTH = old


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_gil_free_syrk_matches_blas(dtype):
    import scipy.linalg.blas as blas

    from dfairpca.moments import _ctypes_syrk, _syrk

    rng = np.random.default_rng(5)
    x = rng.standard_normal((37, 23)).astype(dtype)
    C = np.asfortranarray(np.triu(rng.standard_normal((23, 23))).astype(dtype))
    expect = np.triu(C + x.T @ x)
    for f in (_syrk(dtype), _ctypes_syrk(np.dtype(dtype).char)):
        out = f(C.copy(order="F"), x)
        np.testing.assert_allclose(np.triu(out), expect, rtol=1e-5 if dtype == np.float32 else 1e-12)
    np.testing.assert_allclose(np.triu(blas.get_blas_funcs("syrk", dtype=dtype)(1.0, x.T, trans=0, lower=0)),
                               np.triu(x.T @ x), rtol=1e-5)
    with pytest.raises(ValueError, match="F-ordered"):
        _syrk(dtype)(np.zeros((23, 23), dtype), x)  # C-ordered: refused, not silently wrong


def test_blas_products_are_serialised_only_when_blas_is_multithreaded():
    import contextlib

    from threadpoolctl import threadpool_limits

    from dfairpca.moments import _BLAS_LOCK, _blas_lock

    with threadpool_limits(1):
        assert isinstance(_blas_lock(), contextlib.nullcontext)
    with threadpool_limits(2):
        assert _blas_lock() is _BLAS_LOCK


def test_syrk_lets_other_threads_run():
    """The product releases the GIL: while it runs in one thread, Python code in another
    keeps running (with scipy's f2py wrapper that thread would stall for the whole call)."""
    import threading
    import time

    from threadpoolctl import threadpool_limits

    from dfairpca.moments import _syrk

    x = np.random.default_rng(0).standard_normal((1500, 2500)).astype(np.float32)
    C = np.zeros((2500, 2500), np.float32, order="F")
    started, took = threading.Event(), []

    def run():
        started.set()
        t0 = time.perf_counter()
        _syrk(np.float32)(C, x)
        took.append(time.perf_counter() - t0)

    with threadpool_limits(1):
        t = threading.Thread(target=run)
        t.start()
        started.wait()
        t0 = time.perf_counter()
        while t.is_alive():
            pass
        looped = time.perf_counter() - t0
        t.join()
    assert looped > 0.5 * took[0], (looped, took)
