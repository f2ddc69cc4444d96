"""compute_dtype="exact": integer statistics equal int64 arithmetic with one final rounding,
and they and the components are bit-identical (np.array_equal) whatever the input's form,
chunking, cluster, partial_fit / merge order or a resumed checkpoint; the Gram kernels'
self-test refuses a saturating 8-bit kernel and the portable path stays exact."""

from fractions import Fraction
from itertools import permutations

import dask.array as da
import numpy as np
import pytest
import zarr

import dfairpca
from dfairpca.engine.checkpoint import compute_moments_checkpointed
from dfairpca.errors import InvalidInputError
from dfairpca.stats import _int_kernels as ik
from dfairpca.stats._auto import AUTO_ENV
from dfairpca.stats._exact import check_exact, kernel_name
from dfairpca.stats.moments import Moments

N, D, K = 1200, 12, 3


def worst_case_uint8(n=N, d=D, seed=0):
    """uint8 rows with the extreme columns: all 255, all 0, 0/255 alternating by row,
    255 where the next is 0, and random values."""
    rng = np.random.default_rng(seed)
    X = rng.integers(0, 256, size=(n, d)).astype(np.uint8)
    X[:, 0] = 255
    X[:, 1] = 0
    X[::2, 2] = 255
    X[1::2, 2] = 0
    X[:, 3] = np.where(X[:, 2] == 0, 255, 0)
    return X


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(1)
    X = worst_case_uint8()
    X[: N // 2, 4:8] //= 2  # groups that differ in mean and covariance
    g = np.where(np.arange(N) < N // 2, 0, 1)
    rng.shuffle(g)
    g2 = rng.integers(0, 3, N)
    y = (rng.random(N) < 0.6).astype(int)
    return X, g, g2, y


def exact_scatter(X, rows=None):
    """G - s s^T / n as Fractions (exact rational)."""
    Xi = (X if rows is None else X[rows]).astype(np.int64)
    n = len(Xi)
    G, s = Xi.T @ Xi, Xi.sum(0)
    return [[Fraction(int(G[i, j])) - Fraction(int(s[i]) * int(s[j]), n) for j in range(len(s))]
            for i in range(len(s))]


def assert_one_rounding(got, exact):
    """Every entry within one unit in the last place of the exact rational value."""
    for i, row in enumerate(exact):
        for j, v in enumerate(row):
            g = float(got[i, j])
            assert abs(Fraction(g) - v) <= Fraction(np.spacing(abs(float(v)))), (i, j, g, float(v))


def same_moments(a: Moments, b: Moments):
    assert a.n == b.n
    assert np.array_equal(a.mean, b.mean) and np.array_equal(a.scatter, b.scatter)
    for p, q in zip(a.attributes, b.attributes, strict=True):
        assert np.array_equal(p.counts, q.counts) and np.array_equal(p.deviation, q.deviation)
        assert (p.scatter is None) == (q.scatter is None)
        if p.scatter is not None:
            assert np.array_equal(p.scatter, q.scatter)
    assert np.array_equal(a.exact.gram, b.exact.gram) and np.array_equal(a.exact.sums, b.exact.sums)


# ---------------------------------------------------------------------- exactness
@pytest.mark.parametrize("dtype", ["uint8", "int8", "int16", "uint16", "bool"])
def test_statistics_are_integer_arithmetic_rounded_once(dtype):
    rng = np.random.default_rng(2)
    lo, hi = ik.value_range(dtype)
    X = rng.integers(lo, hi, size=(700, 9), endpoint=True).astype(dtype)
    X[:, 0], X[:, 1] = hi, lo
    X[::2, 2], X[1::2, 2] = hi, lo
    g = rng.integers(0, 2, len(X))
    m = dfairpca.compute_moments(da.from_array(X, chunks=(150, -1)), sensitive_features=g,
                                 dtype="exact", group_scatter=True)
    Xi = X.astype(np.int64)
    assert np.array_equal(np.triu(m.exact.gram), np.triu(Xi.T @ Xi))
    assert np.array_equal(m.exact.sums, Xi.sum(0))
    assert_one_rounding(m.scatter, exact_scatter(X))
    a = m.attributes[0]
    assert np.array_equal(a.counts, np.bincount(g))
    for k in (0, 1):
        rows = g == k
        assert_one_rounding(a.scatter[k], exact_scatter(X, rows))
        want = [Fraction(int(s), int(rows.sum())) - Fraction(int(t), len(X))
                for s, t in zip(Xi[rows].sum(0), Xi.sum(0))]
        assert_one_rounding(a.deviation[k][None], [want])
    assert m.precision == np.finfo(np.float64).eps


def test_masked_statistics_are_those_of_the_kept_rows(data):
    X, g, _, y = data
    m = dfairpca.compute_moments(X, sensitive_features=g, mask=y == 1, dtype="exact",
                                 group_scatter=True)
    ref = dfairpca.compute_moments(X[y == 1], sensitive_features=g[y == 1], dtype="exact",
                                   group_scatter=True)
    same_moments(m, ref)
    assert_one_rounding(m.scatter, exact_scatter(X, y == 1))


# ---------------------------------------------------------------------- bit-identical
def _fits(X, g, g2, y, **kw):
    """(PCA, FairPCA with two attributes, Fair PCA-S, equal opportunity) components."""
    both = np.column_stack([g, g2])
    return [
        dfairpca.PCA(K, compute_dtype="exact", **kw).fit(X),
        dfairpca.FairPCA(K, compute_dtype="exact", **kw).fit(X, sensitive_features=both),
        dfairpca.FairPCA(K, compute_dtype="exact", equalize_covariance=0.5, **kw).fit(
            X, sensitive_features=g),
        dfairpca.FairPCA(K, compute_dtype="exact", constraint="equal_opportunity", **kw).fit(
            X, y, sensitive_features=g),
    ]


def _same_fits(a, b):
    for p, q in zip(a, b, strict=True):
        same_moments(p.statistics_, q.statistics_)
        assert np.array_equal(p.components_, q.components_)
        assert np.array_equal(p.explained_variance_, q.explained_variance_)
        assert p.statistics_kernel_ == q.statistics_kernel_ == "exact:" + chosen_kernel("uint8")


@pytest.fixture(scope="module")
def reference(data):
    return _fits(*data)


def test_fair_fits_are_fitted_and_fair(data, reference):
    X, g, g2, y = data
    pca, fair, fair_s, eo = reference
    assert fair.statistics_.n == N and eo.statistics_.n == int((y == 1).sum())
    for model, groups, rows in ((fair, np.column_stack([g, g2]), slice(None)),
                                (eo, g[:, None], y == 1)):
        for j in range(groups.shape[1]):
            gj = groups[rows, j]
            means = np.stack([X[rows][gj == k].mean(0) for k in np.unique(gj)])
            # the group means coincide on every component (to float64 rounding)
            assert np.abs((means - means[0]) @ model.components_.T).max() < 1e-9
    assert fair_s.statistics_.attributes[0].scatter is not None


def test_numpy_dask_chunkings_and_zarr_are_bit_identical(data, reference, tmp_path):
    X, g, g2, y = data
    z = zarr.open_group(str(tmp_path / "s.zarr"), mode="w")
    z.create_array("x", shape=X.shape, chunks=(128, D), dtype="u1")[:] = X
    inputs = [da.from_array(X, chunks=(N, -1)), da.from_array(X, chunks=(97, -1)),
              da.from_array(X, chunks=(250, 5)),  # column chunks too
              dfairpca.from_zarr(tmp_path / "s.zarr", "x", rows_per_chunk=256)]
    for Xd in inputs:
        _same_fits(reference, _fits(Xd, g, g2, y))


def test_a_two_worker_cluster_is_bit_identical(data, reference, client):
    X, g, g2, y = data
    _same_fits(reference, _fits(da.from_array(X, chunks=(111, -1)), g, g2, y, split_every=2))


def test_partial_fit_and_merge_orders_are_bit_identical(data, reference):
    X, g, g2, y = data
    parts = [slice(0, 100), slice(100, 555), slice(555, 1000), slice(1000, N)]
    for order in [(0, 1, 2, 3), (3, 1, 0, 2), (2, 3, 1, 0)]:
        est = dfairpca.FairPCA(K, compute_dtype="exact", equalize_covariance=0.5)
        for i in order:
            est.partial_fit(X[parts[i]], sensitive_features=g[parts[i]])
        same_moments(est.statistics_, reference[2].statistics_)
        assert np.array_equal(est.components_, reference[2].components_)
    ms = [dfairpca.compute_moments(X[p], sensitive_features=np.column_stack([g, g2])[p],
                                   dtype="exact") for p in parts]
    whole = dfairpca.compute_moments(X, sensitive_features=np.column_stack([g, g2]), dtype="exact")
    for perm in list(permutations(range(4)))[::5]:
        a, b, c, d = (ms[i] for i in perm)
        for merged in (a.merge(b, c, d), a.merge(b).merge(c.merge(d)), dfairpca.merge([d, a.merge(c), b])):
            same_moments(merged, whole)


def test_merges_align_labels_and_fall_back_with_float_statistics(data):
    X, g, *_ = data
    labels = np.where(g == 0, "a", "b")
    first = dfairpca.compute_moments(X[:400], sensitive_features=labels[:400], dtype="exact")
    only_b = labels[400:].copy()
    only_b[:] = "b"
    second = dfairpca.compute_moments(X[400:], sensitive_features=only_b, dtype="exact")
    whole = dfairpca.compute_moments(X, sensitive_features=np.r_[labels[:400], only_b], dtype="exact")
    same_moments(second.merge(first), whole)
    mixed = first.merge(dfairpca.compute_moments(X[400:], sensitive_features=only_b))
    assert mixed.exact is None  # the pairwise update of centred statistics
    np.testing.assert_allclose(mixed.scatter, whole.scatter, rtol=1e-6)


def test_a_resumed_checkpoint_is_bit_identical(data, reference, tmp_path, stop_after):
    X, g, _, _ = data
    Xd = da.from_array(X, chunks=(100, -1))
    ckpt = tmp_path / "ckpt"
    with pytest.raises(KeyboardInterrupt):
        compute_moments_checkpointed(Xd, sensitive_features=g, checkpoint=ckpt, segment_rows=300,
                                     dtype="exact", group_scatter=True, on_segment=stop_after(1))
    m = compute_moments_checkpointed(Xd, sensitive_features=g, checkpoint=ckpt, dtype="exact",
                                     group_scatter=True)
    same_moments(m, reference[2].statistics_)
    fit = dfairpca.FairPCA(K, equalize_covariance=0.5).fit_statistics(m)
    assert np.array_equal(fit.components_, reference[2].components_)
    # and an estimator's checkpointed fit
    est = dfairpca.FairPCA(K, compute_dtype="exact", equalize_covariance=0.5)
    est.fit(Xd, sensitive_features=g, checkpoint=tmp_path / "fit-ckpt")
    assert np.array_equal(est.components_, reference[2].components_)


def test_saved_statistics_keep_the_raw_sums(data, tmp_path):
    X, g, *_ = data
    m = dfairpca.compute_moments(X[:600], sensitive_features=g[:600], dtype="exact", group_scatter=True)
    m.save(tmp_path / "m")
    back = Moments.load(tmp_path / "m")
    same_moments(back, m)
    rest = dfairpca.compute_moments(X[600:], sensitive_features=g[600:], dtype="exact", group_scatter=True)
    same_moments(back.merge(rest), dfairpca.compute_moments(X, sensitive_features=g, dtype="exact",
                                                            group_scatter=True))



def test_a_model_saved_with_its_statistics_resumes_exactly(data, tmp_path):
    """A FairPCA saved with its exact statistics loads them with their raw sums: it says
    what formed them, and a partial_fit after loading equals one fit of all the rows."""
    X, g, *_ = data
    est = dfairpca.FairPCA(3, compute_dtype="exact").partial_fit(X[:600], sensitive_features=g[:600])
    est.save(tmp_path / "model", statistics=True)
    back = dfairpca.load(tmp_path / "model")
    assert back.statistics_kernel_ == est.statistics_kernel_
    assert back.statistics_kernel_.startswith("exact:")
    back.partial_fit(X[600:], sensitive_features=g[600:])
    whole = dfairpca.FairPCA(3, compute_dtype="exact").fit(X, sensitive_features=g)
    assert np.array_equal(back.components_, whole.components_)


# ---------------------------------------------------------------------- refusals
def test_float_input_is_refused_naming_the_float_dtypes(data):
    X, g, *_ = data
    for call in (lambda: dfairpca.PCA(2, compute_dtype="exact").fit(X.astype(np.float32)),
                 lambda: dfairpca.compute_moments(da.from_array(X.astype(float)), dtype="exact"),
                 lambda: dfairpca.FairPCA(2, compute_dtype="exact").fit(X / 2.0, sensitive_features=g)):
        with pytest.raises(InvalidInputError, match="compute_dtype='float64' \\(or 'float32'\\)"):
            call()
    with pytest.raises(InvalidInputError, match="svd_solver='full'"):
        dfairpca.PCA(2, compute_dtype="exact", svd_solver="randomized").fit(X)
    with pytest.raises(InvalidInputError, match="'exact'"):
        dfairpca.PCA(2, compute_dtype="int8").fit(X)


def test_the_exactness_bound_refuses_sums_beyond_int64():
    check_exact(np.uint8, 10 ** 12)
    check_exact(np.int16, 2 ** 31)
    with pytest.raises(InvalidInputError, match="cannot sum .* rows of int16 exactly"):
        check_exact(np.int16, 2 ** 33)
    with pytest.raises(InvalidInputError, match="int32.*narrower integer dtype"):
        check_exact(np.int32, 2)
    with pytest.raises(InvalidInputError, match="rows of int32"):  # before any work
        dfairpca.compute_moments(da.zeros((4, 3), dtype=np.int32, chunks=2), dtype="exact")
    with pytest.raises(InvalidInputError, match="rows of int64"):
        dfairpca.PCA(1, compute_dtype="exact").fit(np.ones((4, 3), np.int64))


# ---------------------------------------------------------------------- kernels
def saturating_gram(x):
    """An 8-bit GEMM as VNNI-less code computes it (``vpmaddubsw``): A = x^T (uint8) times
    B = x - 128 (int8), each pair of rows' products summed in int16 with saturation, then
    summed in int32, and the offset undone: wrong exactly where 255 meets -128."""
    xi = x.astype(np.int32)
    if len(xi) % 2:
        xi = np.vstack([xi, np.full((1, xi.shape[1]), 128, np.int32)])  # B = 0: adds nothing
    a, b = xi, xi - 128
    pairs = a[0::2, :, None] * b[0::2, None, :] + a[1::2, :, None] * b[1::2, None, :]
    C = np.clip(pairs, -32768, 32767).sum(axis=0, dtype=np.int32).astype(np.int64)
    C += 128 * x.astype(np.int64).sum(0)[:, None]
    return np.asfortranarray(np.triu(C))


def int64_gram(x):
    xi = x.astype(np.int64)
    return np.asfortranarray(np.triu(xi.T @ xi))


def chosen_kernel(dtype) -> str:
    """The kernel this process uses for ``dtype`` (an installed 8-bit kernel such as MKL's
    where it passes its self-test on this CPU, else the portable one)."""
    ik._load_optional()
    return ik.kernel_for(dtype)[0]


@pytest.fixture
def registered():
    """Register test kernels with the installed optional ones (MKL's) withdrawn, so that
    the test sees only its own on every CPU; they come back after."""
    ik._load_optional()
    installed = list(ik._REGISTERED)
    for k in installed:
        ik.unregister(k.name)
    names = []

    def register(name, fn, dtypes=("uint8", "int8")):
        ik.register(ik.Kernel(name, fn, dtypes))
        names.append(name)

    yield register
    for name in names:
        ik.unregister(name)
    for k in installed:
        ik.register(k, first=False)


def test_the_simulated_saturating_kernel_is_wrong_on_the_worst_case_only():
    rng = np.random.default_rng(3)
    small = rng.integers(0, 100, size=(50, 6)).astype(np.uint8)  # pairs stay within int16
    assert np.array_equal(saturating_gram(small), int64_gram(small))
    assert not np.array_equal(saturating_gram(worst_case_uint8(64, 6)), int64_gram(worst_case_uint8(64, 6)))
    assert not ik.self_test(saturating_gram, "uint8")
    assert ik.self_test(int64_gram, "uint8") and ik.self_test(ik.portable_gram, "uint8")


def test_a_saturating_kernel_is_refused_and_the_fallback_is_exact(data, reference, registered):
    X, g, g2, y = data
    registered("simulated-vnni-less", saturating_gram)
    assert ik.kernel_for("uint8")[0] == ik.PORTABLE
    assert ik.int8_kernel_available() is None
    fit = dfairpca.FairPCA(K, compute_dtype="exact", equalize_covariance=0.5).fit(X, sensitive_features=g)
    assert fit.statistics_kernel_ == "exact:blas-exact-blocks"
    same_moments(fit.statistics_, reference[2].statistics_)
    # without an 8-bit kernel, "auto" keeps float32 products for uint8
    assert dfairpca.PCA(K).fit(X).statistics_kernel_ == "float32"


def test_a_kernel_that_passes_is_used_where_auto_takes_exact(data, reference, registered, monkeypatch):
    """(Whether "auto" takes exact where a kernel passes, by timing it: test_auto_choice.py;
    numpy's int64 product is slower than float32, so here the environment forces exact.)"""
    X, g, g2, y = data
    registered("test-int64", int64_gram)
    assert ik.kernel_for("uint8")[0] == "test-int64"
    assert ik.int8_kernel_available() == "test-int64"
    monkeypatch.setenv(AUTO_ENV, "exact")
    fit = dfairpca.FairPCA(K, equalize_covariance=0.5).fit(X, sensitive_features=g)  # "auto"
    assert fit.statistics_kernel_ == "exact:test-int64"
    # another kernel, the same integers: bit-identical to the portable path's fit
    same_moments(fit.statistics_, reference[2].statistics_)
    assert np.array_equal(fit.components_, reference[2].components_)
    assert kernel_name(dfairpca.compute_moments(X.astype(np.int16), dtype="exact")) == "exact:blas-exact-blocks"


def test_portable_kernel_blocks_and_flushes_exactly():
    """Many float32 blocks of 1,024 rows (the exact limit for shifted 8-bit values) and
    int16 values in float64 blocks."""
    X = worst_case_uint8(5000, 7, seed=4)
    assert ik._block_plan(np.uint8, 7)[1] == 1024
    assert np.array_equal(ik.portable_gram(X), int64_gram(X))
    rng = np.random.default_rng(5)
    W = rng.integers(-32768, 32767, size=(3000, 5), endpoint=True).astype(np.int16)
    W[:, 0] = -32768
    assert ik._block_plan(np.int16, 5)[0] == np.float64
    assert np.array_equal(ik.portable_gram(W), int64_gram(W))


def test_portable_kernel_moves_sums_beyond_2_53_into_int64():
    """A column of int16 whose sum of squares passes 2**53 (float64 could not hold it) and
    is odd: the float64 blocks are moved into int64 before they leave the exact range."""
    n = 8_500_000
    x = np.full((n, 1), -32768, np.int16)
    x[:1001] = 1
    want = (n - 1001) * 2 ** 30 + 1001
    assert want > 2 ** 53 and want % 2 == 1
    assert int(ik.portable_gram(x)[0, 0]) == want


def test_columns_in_any_order_keep_the_raw_sums_exact():
    """Moments.columns takes columns in the order given: the exact sums' upper triangles
    follow, so a merge of reordered exact statistics equals the statistics of the
    reordered rows, bit for bit, and the Fair PCA-S group Grams too."""
    rng = np.random.default_rng(8)
    X = rng.integers(0, 256, size=(40, 4)).astype(np.uint8)
    g = rng.integers(0, 2, size=40)
    keep = [3, 0, 2]
    a = dfairpca.compute_moments(X, sensitive_features=g, dtype="exact", group_scatter=True)
    got = a.columns(keep).merge(a.columns(keep))
    want = dfairpca.compute_moments(np.r_[X, X][:, keep], sensitive_features=np.r_[g, g],
                                    dtype="exact", group_scatter=True)
    same_moments(got, want)
    assert np.array_equal(got.exact.gram, want.exact.gram)


@pytest.mark.parametrize("n", [7, 2**31 + 11])
def test_centring_by_panels_on_threads_rounds_each_entry_once(n, monkeypatch):
    """Many panels (4 columns each) on threads: every entry of G - s s^T / n, rounded once,
    whatever panel and thread formed it; for n below and above 2**31 (the two branches)."""
    from dfairpca.stats import _exact

    monkeypatch.setattr(_exact, "CENTRING_PANEL", 4)
    rng = np.random.default_rng(5)
    d = 23
    G = rng.integers(-2**40, 2**40, size=(d, d))
    G = np.triu(G + G.T)
    s = rng.integers(-2**30, 2**30, size=d)
    got = _exact.centred(G, s, n)
    want = [[Fraction(int(G[min(i, j), max(i, j)])) - Fraction(int(s[i]) * int(s[j]), n)
             for j in range(d)] for i in range(d)]
    assert_one_rounding(got, want)
    assert np.array_equal(got, got.T)


def test_workers_whose_kernel_differs_from_the_clients_are_named_before_the_pass(
        data, reference, client, registered, caplog, monkeypatch):
    """The client chose a kernel its workers do not have (registered in this process
    only; on a real cluster, a CPU that refuses MKL's): each worker chose and self-tested
    its own before the pass, one record names them, the statistics stay bit-identical and
    their kernel name is what the workers used."""
    from dfairpca.engine import _engine

    monkeypatch.setattr(_engine, "_KERNELS_SAID", set())
    monkeypatch.setattr(_engine, "_KERNELS_ASKED", {})
    check_worker_kernels = _engine.check_worker_kernels
    registered("client-only-int64", int64_gram)
    X, g, g2, y = data
    workers = client.run(ik.chosen_kernel, "uint8")
    assert set(workers.values()) != {"client-only-int64"}
    with caplog.at_level("WARNING", logger="dfairpca"):
        assert check_worker_kernels(np.uint8) == workers
    said = [r.getMessage() for r in caplog.records if "another kernel" in r.getMessage()]
    assert len(said) == 1 and "2 of 2 workers" in said[0] and "client-only-int64" in said[0]
    assert all(addr in said[0] for addr in workers)
    caplog.clear()
    m = dfairpca.compute_moments(da.from_array(X, chunks=(111, -1)), dtype="exact")
    assert not caplog.records  # said once per process, not once per pass or segment
    assert "client-only-int64" not in kernel_name(m)
    assert set(kernel_name(m).removeprefix("exact:").split("+")) == set(workers.values())
    assert np.array_equal(m.exact.gram, reference[0].statistics_.exact.gram)


def test_workers_with_the_clients_kernel_say_nothing(client, caplog, monkeypatch):
    from dfairpca.engine import _engine

    monkeypatch.setattr(_engine, "_KERNELS_ASKED", {})
    check_worker_kernels = _engine.check_worker_kernels

    with caplog.at_level("WARNING", logger="dfairpca"):
        workers = check_worker_kernels(np.uint8)
    assert set(workers.values()) == {ik.chosen_kernel("uint8")}
    assert not [r for r in caplog.records if "another kernel" in r.getMessage()]


@pytest.mark.parametrize("group_scatter", [False, True])
def test_chunks_folded_in_place_equal_the_merge_of_their_sums(group_scatter):
    """A pass adds each chunk's products straight into its running total (no Gram of the
    chunk's own): the same integers as merging the chunks' own sums, whatever the chunk
    sizes, masks, empty chunks or groups absent from a chunk; a total whose categories
    differ is merged instead; the kernels' scratch neither travels nor is saved."""
    import pickle

    from dfairpca.engine._accumulator import ExactTotal, fold
    from dfairpca.stats._exact import exact_chunk_sums, merge_exact, nbytes

    rng = np.random.default_rng(5)
    X = rng.integers(0, 256, size=(300, 23)).astype(np.uint8)
    codes = np.stack([rng.integers(0, 3, 300), rng.integers(0, 2, 300)], axis=1)
    codes[:120, 0] = 0  # the first chunks hold one group of the first attribute only
    mask = rng.random(300) > 0.2
    cats = [np.arange(3), np.arange(2)]
    bounds = [0, 50, 50, 120, 200, 300]
    kw = dict(row_offset=0, categories=cats, dtype="exact", group_scatter=group_scatter)
    total, parts = None, []
    for s, e in zip(bounds[:-1], bounds[1:]):
        total = fold(total, X[s:e], codes[s:e], mask=mask[s:e], **kw)
        parts.append(exact_chunk_sums(X[s:e], codes[s:e], cats, mask=mask[s:e], group_scatter=group_scatter))
    want = merge_exact(parts)
    assert isinstance(total, ExactTotal) and total.n == mask.sum() == want.n
    assert np.array_equal(total.gram, want.gram) and np.array_equal(total.sums, want.sums)
    for a, b in zip(total.attributes, want.attributes):
        assert np.array_equal(a.counts, b.counts) and np.array_equal(a.sums, b.sums)
        if group_scatter:
            for Ga, Gb in zip(a.grams, b.grams):
                assert np.array_equal(Ga, Gb)
    Xi = X[mask].astype(np.int64)
    assert np.array_equal(total.gram, np.triu(Xi.T @ Xi))
    arrays = total.gram.nbytes + total.sums.nbytes + sum(
        a.counts.nbytes + a.sums.nbytes + sum(G.nbytes for G in a.grams or ()) for a in total.attributes)
    scratch = [getattr(v, "nbytes", 0) for v in total.__dict__["_scratch"].values()]  # MKL's: int32 d x d
    assert nbytes(total) == arrays + sum(scratch)
    back = pickle.loads(pickle.dumps(total))
    assert "_scratch" not in back.__dict__ and np.array_equal(back.gram, total.gram)
    # a running total of other categories (labels seen only later): merged, not added
    other = fold(None, X[:10], np.zeros((10, 2), int), mask=None, row_offset=0, categories=[np.arange(1), np.arange(2)],
                 dtype="exact", group_scatter=group_scatter)
    merged = fold(other, X[10:20], codes[10:20], mask=None, **kw)
    assert [list(a.categories) for a in merged.attributes] == [[0, 1, 2], [0, 1]]
    assert merged.n == 20 and np.array_equal(merged.gram, np.triu(X[:20].astype(np.int64).T @ X[:20].astype(np.int64)))


@pytest.mark.parametrize("dtype", ["uint8", "int8", "bool", "int16", "uint16"])
def test_column_sums_are_exact_at_the_extremes(dtype):
    from dfairpca.stats._column_sums import column_sums

    lo, hi = ik.value_range(dtype)
    x = np.random.default_rng(1).integers(lo, hi, size=(1000, 7), endpoint=True).astype(dtype)
    x[:, 0], x[:, 1] = hi, lo  # 1,000 highs: beyond a 16-bit sum in one block
    assert np.array_equal(column_sums(x), x.astype(np.int64).sum(axis=0))
    assert column_sums(x[:0]).tolist() == [0] * 7


class _PyPending:
    """A kernel's scratch that keeps products pending until its flush (as MKL's does), in
    int64: the invariant below is then tested on every CPU."""

    def __init__(self):
        self.sum, self.target = None, None

    def flush(self):
        if self.sum is not None:
            ik._add_upper(self.target, self.sum)
            self.sum = None


def _py_gram(x):
    xi = x.astype(np.int64)
    return np.asfortranarray(np.triu(xi.T @ xi))


def _py_add(G, x, scratch=None, keep=False):
    scratch = scratch if isinstance(scratch, _PyPending) else _PyPending()
    if scratch.target is not G:
        scratch.flush()
    scratch.target = G
    g = _py_gram(x)
    scratch.sum = g if scratch.sum is None else scratch.sum + g
    if not keep:
        scratch.flush()
    return scratch


def test_a_running_totals_pending_products_are_in_every_read_of_its_gram():
    """A kernel may keep the last chunks' products pending in its scratch: reading
    ``gram`` (a merge, a save, a transfer, a comparison) adds them in first, once; Dask's
    size of the total does not touch them."""
    import pickle

    from dask.sizeof import sizeof

    from dfairpca.engine._accumulator import fold

    ik._load_optional()
    ik.register(ik.Kernel("py-pending", _py_gram, ("uint8",), _py_add))
    try:
        rng = np.random.default_rng(6)
        X = rng.integers(0, 256, size=(90, 9)).astype(np.uint8)
        kw = dict(mask=None, row_offset=0, categories=[], dtype="exact", group_scatter=False)
        total = None
        for s in range(0, 90, 30):
            total = fold(total, X[s : s + 30], None, **kw)
        assert total.kernels == ("py-pending",)
        want = np.triu(X.astype(np.int64).T @ X.astype(np.int64))
        raw = total.__dict__["gram"]
        assert not raw.any()  # every chunk still pending
        assert sizeof(total) > raw.nbytes and not raw.any()
        back = pickle.loads(pickle.dumps(total))
        assert np.array_equal(back.gram, want) and np.array_equal(raw, want)
        assert np.array_equal(total.gram, want)  # read again: nothing added twice
        total = fold(total, X[:30], None, **kw)
        assert np.array_equal(total.gram, want + _py_gram(X[:30]))
    finally:
        ik.unregister("py-pending")


def test_a_pass_frees_its_scratch_and_a_refused_chunk_leaves_the_total_as_it_was():
    """No fitted model or pass result keeps the kernels' d x d scratch (one chain, the
    numpy loop or several); a chunk whose group codes are out of range is refused before
    anything is added."""
    import dask.array as da

    from dfairpca.engine._accumulator import fold
    from dfairpca.engine._engine import run_moments_pass

    rng = np.random.default_rng(7)
    X = rng.integers(0, 256, size=(400, 11)).astype(np.uint8)
    z = rng.integers(0, 2, 400)
    for src, chains in ((X, None), (da.from_array(X, chunks=100), 1), (da.from_array(X, chunks=100), 2)):
        total = run_moments_pass(src, z[:, None], [np.arange(2)], dtype="exact", n_chains=chains)
        assert "_scratch" not in total.__dict__
        assert np.array_equal(total.gram, np.triu(X.astype(np.int64).T @ X.astype(np.int64)))
    est = dfairpca.FairPCA(3, compute_dtype="exact").fit(X, sensitive_features=z)
    assert "_scratch" not in est.statistics_.exact.__dict__
    kw = dict(mask=None, row_offset=0, categories=[np.arange(2)], dtype="exact", group_scatter=False)
    total = fold(None, X[:50], z[:50, None], **kw)
    before = (total.n, total.gram.copy(), total.sums.copy())
    with pytest.raises(InvalidInputError, match="must lie in"):
        fold(total, X[50:60], np.full((10, 1), 5), **kw)
    assert total.n == before[0] and np.array_equal(total.gram, before[1]) and np.array_equal(total.sums, before[2])


@pytest.mark.parametrize("group_scatter", [False, True])
def test_a_chunk_that_fails_part_way_leaves_sums_that_refuse_every_use(group_scatter, monkeypatch):
    """A kernel or an allocation that fails between two additions of a chunk leaves part of
    it in the sums: reading, merging, saving or sending them is then refused, naming the
    fix, rather than any of them missing rows."""
    import pickle

    from dfairpca.errors import RunError
    from dfairpca.stats import _exact
    from dfairpca.stats._exact import exact_chunk_sums, merge_exact

    rng = np.random.default_rng(3)
    X = rng.integers(0, 256, size=(300, 7)).astype(np.uint8)
    z = rng.integers(0, 2, (300, 1))
    cats = [np.arange(2)]
    total = exact_chunk_sums(X[:100], z[:100], cats, group_scatter=group_scatter,
                             into=_exact.ExactSums.no_rows(7, cats, group_scatter))
    calls = []
    add_gram = _exact.add_gram

    def failing(G, x, scratch, keep=False):  # the chunk's last addition fails after adding
        calls.append(1)
        out = add_gram(G, x, scratch, keep=keep)
        if len(calls) == (2 if group_scatter else 1):
            raise MemoryError("no room for the kernel's block")
        return out

    monkeypatch.setattr(_exact, "add_gram", failing)
    with pytest.raises(MemoryError):
        exact_chunk_sums(X[100:200], z[100:200], cats, group_scatter=group_scatter, into=total)
    monkeypatch.setattr(_exact, "add_gram", add_gram)
    other = exact_chunk_sums(X[200:], z[200:], cats, group_scatter=group_scatter)
    for use in (lambda: total.gram, lambda: pickle.dumps(total), total.settle,
                lambda: merge_exact([total, other]), lambda: total.to_arrays(),
                lambda: total.centred()):
        with pytest.raises(RunError, match="incomplete: adding a chunk of 100 rows failed part way "
                                           r"\(MemoryError: .*the pass must be run again"):
            use()
    assert "ExactSums(n=100" in repr(total)  # a log or a debugger still shows them
