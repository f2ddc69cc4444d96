"""The statistics core: exact per chunk, and the merge of parts equals the whole."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import dfairpca
from dfairpca.stats.moments import Moments, merge
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


def test_moments_are_complete_and_never_change(tmp_path):
    """Every matrix is a full symmetric float64 array from the start; getters, merges,
    saving and fitting leave the object (fields and array contents) as it was."""
    import copy
    import dataclasses

    X, labels = make_data(400, 6, (2,), seed=4)
    cats = [np.arange(2)]
    m = chunk(X, labels, cats, 0, 400)
    for S in [m.scatter, *m.attributes[0].scatter]:
        assert isinstance(S, np.ndarray) and S.dtype == np.float64
        np.testing.assert_array_equal(S, S.T)
    before = copy.deepcopy(m)
    m.covariance(), m.second_moment(), m.deviation_floor(), m.constraint_matrix(), m.to_arrays()
    merge([m, chunk(X, labels, cats, 0, 100)])
    m.save(tmp_path / "m")
    dfairpca.FairPCA(2).fit_statistics(m)
    dfairpca.FairPCA(2, equalize_covariance=0.5).fit_statistics(m)
    dfairpca.PCA(2).fit_statistics(m)
    for f in dataclasses.fields(m):
        a, b = getattr(m, f.name), getattr(before, f.name)
        if f.name == "attributes":
            for x, y in zip(a, b):
                for g in dataclasses.fields(x):
                    np.testing.assert_array_equal(getattr(x, g.name), getattr(y, g.name))
        else:
            np.testing.assert_array_equal(a, b)
    with pytest.raises(dataclasses.FrozenInstanceError):
        m.scatter = np.zeros((6, 6))



def test_first_order_moments_hold_the_diagonal_and_follow_the_same_rules(tmp_path):
    """The randomized fit's first pass returns a Moments without the d x d scatter: its
    derived rules give what the complete statistics give, and what needs the scatter says so."""
    from dfairpca.engine._thin_pass import first_moments
    from dfairpca.errors import InvalidInputError

    X, groups = make_data(500, 7, (3,), seed=4)
    cats = [np.unique(groups[0])]
    codes = np.searchsorted(cats[0], groups[0])[:, None]
    full = Moments.from_chunk(X, codes, cats)
    thin, _ = first_moments(X, codes=codes, categories=cats, numeric=[2])
    assert thin.scatter is None and full.diagonal is None
    np.testing.assert_allclose(full.scatter_diagonal, np.diag(full.scatter))
    np.testing.assert_allclose(thin.scatter_diagonal, full.scatter_diagonal, rtol=1e-10)
    np.testing.assert_allclose(thin.cross, full.scatter[[2]], rtol=1e-9, atol=1e-9 * len(X))
    for rule in ("constraint_matrix", "deviation_floor"):
        np.testing.assert_allclose(getattr(thin, rule)(), getattr(full, rule)(), rtol=1e-9, atol=1e-12)
    keep = np.array([0, 3, 5])
    part = thin.columns(keep)
    assert part.cross is None and len(part.numeric) == 0
    np.testing.assert_allclose(part.scatter_diagonal, full.columns(keep).scatter_diagonal, rtol=1e-10)
    for needs_scatter in (thin.covariance, thin.second_moment, lambda: merge([full, thin]),
                          lambda: thin.save(tmp_path / "m")):
        with pytest.raises(InvalidInputError, match="first-order statistics of a randomized fit"):
            needs_scatter()
    assert not (tmp_path / "m").exists()


def test_the_problem_a_solve_reads_is_the_statistics_of_the_feature_columns(tmp_path):
    """Moments.problem: the features' moments and the raw constraint, equal for complete and
    first-order statistics, with the numeric attributes' rows apart; refused where no solve
    can use it (a complete solve on first-order statistics, one row, overflowed sums)."""
    import dataclasses

    from dfairpca.engine._thin_pass import first_moments
    from dfairpca.errors import InvalidInputError

    X, groups = make_data(500, 7, (3,), seed=5)
    cats = [np.unique(groups[0])]
    codes = np.searchsorted(cats[0], groups[0])[:, None]
    full = Moments.from_chunk(X, codes, cats, group_scatter=True)
    thin, _ = first_moments(X, codes=codes, categories=cats, numeric=[2])
    keep = np.array([0, 1, 3, 4, 5, 6])
    features = full.columns(keep)
    P = full.problem([2])
    np.testing.assert_array_equal(P.scatter, features.scatter)
    np.testing.assert_array_equal(P.mean, features.mean)
    np.testing.assert_array_equal(P.constraint_rows, features.constraint_matrix())
    np.testing.assert_array_equal(P.deviation_floor, features.deviation_floor())
    np.testing.assert_array_equal(P.group_means[0], features.group_means(0))
    np.testing.assert_array_equal(P.group_scatter[0], features.attributes[0].scatter)
    np.testing.assert_array_equal(P.numeric_rows, full.scatter[np.ix_([2], keep)])
    assert P.group_sizes == [3] and P.n == 500 and P.kernel == "float64"
    assert P.feature_spread == pytest.approx(np.trace(features.scatter), rel=1e-15)
    T = thin.problem(complete=False)
    assert T.scatter is None and T.group_scatter is None
    for name in ("mean", "diagonal", "constraint_rows", "deviation_floor", "numeric_rows", "numeric_own"):
        np.testing.assert_allclose(getattr(T, name), getattr(P, name), rtol=1e-9, atol=1e-9 * len(X))
    with pytest.raises(InvalidInputError, match="first-order statistics of a randomized fit"):
        thin.problem()
    with pytest.raises(InvalidInputError, match="need at least 2 samples to fit; got 1"):
        Moments.from_chunk(X[:1], codes[:1], cats).problem()
    overflowed = dataclasses.replace(full, mean=np.where(np.arange(7) == 4, np.inf, full.mean))
    with pytest.raises(InvalidInputError, match="too large for float64"):
        overflowed.problem()


def test_merge_takes_a_list_or_the_parts_themselves():
    """merge([a, b]) and merge(a, b) are the same union; anything but Moments is refused by
    name."""
    rng = np.random.default_rng(8)
    X = rng.normal(size=(80, 4))
    a, b = (dfairpca.compute_moments(X[:30]), dfairpca.compute_moments(X[30:]))
    whole = dfairpca.compute_moments(X)
    for m in (dfairpca.merge([a, b]), dfairpca.merge(a, b), dfairpca.merge([a], b)):
        np.testing.assert_allclose(m.covariance(), whole.covariance(), rtol=1e-12)
    with pytest.raises(TypeError, match="merge takes Moments.*got ndarray"):
        dfairpca.merge(a, X)
