"""A pass's running total: upper-triangle panels, in-place folds, and the hand-over to Moments."""

import pickle

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import dfairpca.engine._accumulator as acc
from dfairpca.engine._accumulator import RunningTotal, UpperPanels, chunk, combine
from dfairpca.stats.moments import Moments, merge
from oracle import make_data
from test_moments import assert_matches

#: the chunk step's remaining arguments for a plain chunk: all rows, float64 products
EVERY_ROW = dict(mask=None, row_offset=0, dtype=None, group_scatter=True)


@given(d=st.integers(1, 40), width=st.integers(1, 17), seed=st.integers(0, 2**16))
def test_upper_panels_hold_the_upper_triangle(d, width, seed):
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
    np.testing.assert_array_equal(P.diagonal(), np.diagonal(P.to_full()))
    assert P.nbytes < 8 * (d * d / 2 + d * width / 2 + d) + 1
    # adding panels of another width, copying, pickling
    Q = UpperPanels.from_upper(P)
    Q.add(UpperPanels.from_upper(expect) if width == 1 else UpperPanels(d, width + 1).add(expect))
    np.testing.assert_allclose(Q.to_full(), 2 * expect, rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(pickle.loads(pickle.dumps(P)).to_full(), P.to_full())


@given(n=st.integers(4, 120), d=st.integers(1, 9), width=st.integers(1, 5),
       cuts=st.lists(st.integers(1, 119), max_size=6), seed=st.integers(0, 2**16),
       dtype=st.sampled_from([np.float32, np.float64]))
def test_a_pass_folding_chunks_in_place_equals_the_whole(n, d, width, cuts, seed, dtype):
    """The engine's path: upper-triangle chunks folded into one float64 total in place."""
    old = acc.PANEL_WIDTH
    acc.PANEL_WIDTH = width
    try:
        X, g = make_data(n, d, (3,), seed=seed)
        X = X + 50.0  # an offset, which the pairwise update must not lose
        cats = [np.arange(3)]
        bounds = sorted({0, n, *[c for c in cuts if c < n]})
        total = first = None
        for s, e in zip(bounds[:-1], bounds[1:]):
            part = chunk(X[s:e], g[0][s:e, None], cats, mask=None, row_offset=s, dtype=dtype,
                             group_scatter=True)
            total = combine([part] if total is None else [total, part])
            first = first or total.scatter
            assert total.scatter is first  # every fold adds into the same float64 panels
            assert isinstance(total.scatter, UpperPanels) and total.scatter.width == width
        m = total.finalize()
        assert isinstance(m, Moments)
        assert_matches(m, X, [g[0]], cats, rtol=1e-9 if dtype == np.float64 else 1e-5)
    finally:
        acc.PANEL_WIDTH = old


@given(n=st.integers(6, 90), cuts=st.lists(st.integers(1, 89), min_size=2, max_size=8),
       fan_in=st.integers(2, 4), seed=st.integers(0, 2**16))
def test_a_tree_of_running_totals_equals_the_merge_of_the_chunks(n, cuts, fan_in, seed):
    """Chains' totals combined in a tree (the engine's split_every) give what Moments'
    merge of the same chunks gives; the chunks' own Moments are left as they are."""
    X, g = make_data(n, 4, (2, 3), seed=seed)
    codes = np.column_stack(g)
    cats = [np.arange(2), np.arange(3)]
    bounds = sorted({0, n, *[c for c in cuts if c < n]})
    chunks = [(X[s:e], codes[s:e]) for s, e in zip(bounds[:-1], bounds[1:])]
    parts = [combine([chunk(x, c, cats, **EVERY_ROW)]) for x, c in chunks]
    while len(parts) > 1:
        parts = [combine(parts[i : i + fan_in]) for i in range(0, len(parts), fan_in)]
    got = parts[0].finalize()
    ref = merge([Moments.from_chunk(x, c, cats, group_scatter=True) for x, c in chunks])
    np.testing.assert_allclose(got.mean, ref.mean, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(got.scatter, ref.scatter, rtol=1e-10, atol=1e-9)
    for a, b in zip(got.attributes, ref.attributes):
        np.testing.assert_array_equal(a.counts, b.counts)
        np.testing.assert_allclose(a.scatter, b.scatter, rtol=1e-10, atol=1e-9)


def test_a_running_total_is_saved_as_panels_and_resumes(tmp_path):
    X, g = make_data(300, 7, (2,), seed=3)
    cats = [np.arange(2)]
    total = combine([chunk(X[:200], g[0][:200, None], cats, **EVERY_ROW)])
    total.save(tmp_path / "t")
    back = RunningTotal.load(tmp_path / "t")
    assert isinstance(back.scatter, UpperPanels)
    np.testing.assert_array_equal(back.scatter.data, total.scatter.data)
    done = combine([back, chunk(X[200:], g[0][200:, None], cats, **EVERY_ROW)]).finalize()
    assert_matches(done, X, [g[0]], cats)
    # complete statistics (a checkpoint of version 1) are read as a running total too
    Moments.from_chunk(X[:200], g[0][:200, None], cats, group_scatter=True).save(tmp_path / "m")
    again = RunningTotal.load(tmp_path / "m")
    np.testing.assert_allclose(again.scatter.to_full(), total.scatter.to_full(), rtol=1e-12)
    with pytest.raises(ValueError, match="running total of an unfinished pass"):
        Moments.load(tmp_path / "t")


def test_dask_knows_what_a_running_total_weighs():
    from dask.sizeof import sizeof

    X, g = make_data(100, 64, (2,), seed=0)
    total = combine([chunk(X, g[0][:, None], [np.arange(2)], **EVERY_ROW)])
    panels = total.scatter.nbytes
    assert sizeof(total.scatter) == panels
    assert 3 * panels <= sizeof(total) < 3 * panels + 8 * 64 * 10
    assert sizeof(total.finalize()) >= 3 * 8 * 64 * 64


def test_a_weighted_total_without_a_positive_weight_is_not_finalized():
    """Dask weights' values only the pass sees: the total refuses to become statistics."""
    X, g = make_data(60, 4, (2,), seed=5)
    cats = [np.arange(2)]
    kw = dict(EVERY_ROW, group_scatter=False)
    zero = combine([chunk(X, g[0][:, None], cats, weights=np.zeros(60), **kw)])
    with pytest.raises(ValueError, match="zero for every row"):
        zero.finalize()
    some = combine([chunk(X, g[0][:, None], cats, weights=np.r_[1.0, np.zeros(59)], **kw)])
    assert some.finalize().n == 1
