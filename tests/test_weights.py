"""sample_weight: frequency weights in the statistics, PCA and FairPCA.

Every fit is compared with a dense weighted numpy oracle (tests/oracle.py) and with the two
identities of frequency weights: integer weights equal repeated rows, weight 0 equals a
dropped row.  Inputs: numpy, Dask (several chunkings of X and of the weights), Zarr, and a
real distributed cluster.
"""

import json

import dask.array as da
import numpy as np
import pytest
import sklearn
import zarr
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import make_pipeline

import dfairpca
from dfairpca import FairKernelPCA, FairPCA, PCA, compute_moments
from dfairpca.engine.checkpoint import CheckpointMismatch, PassInterrupted
from dfairpca.errors import InvalidInputError, InvalidTypeError
from oracle import make_data, max_angle_deg, weighted_fair_pca, weighted_moments, weighted_pca

N, D = 600, 10
ANGLE = 1e-6  # degrees


@pytest.fixture(scope="module")
def data():
    X, g = make_data(N, D, (2, 3), seed=21)
    rng = np.random.default_rng(21)
    w = rng.integers(0, 4, N).astype(float)  # integer weights, some 0
    u = rng.random(N) * 3  # real weights
    return X, g, w, u


def repeated(w, *arrays):
    """Each array with its rows repeated by the integer weights w."""
    reps = w.astype(int)
    return [np.repeat(np.asarray(a), reps, axis=0) for a in arrays]


def angle(est, U):
    return max_angle_deg(est.components_.T, U)


def assert_same_statistics(a, b, rtol=1e-10):
    """Statistics of weighted rows a against those of the rows they stand for b (matrices
    to ``rtol`` of their largest entry: a product's rounding is relative to its norm)."""
    def close(x, y):
        np.testing.assert_allclose(x, y, rtol=rtol, atol=rtol * np.abs(y).max())

    assert float(a.n) == pytest.approx(float(b.n), rel=1e-12)
    np.testing.assert_allclose(a.mean, b.mean, rtol=rtol, atol=1e-12)
    close(a.scatter, b.scatter)
    for p, q in zip(a.attributes, b.attributes):
        np.testing.assert_allclose(p.counts, q.counts, rtol=1e-12)
        np.testing.assert_allclose(p.deviation, q.deviation, rtol=rtol, atol=1e-12)
        if p.scatter is not None:
            close(p.scatter, q.scatter)


# ----------------------------------------------------------------------------- statistics
def test_weighted_statistics_match_the_oracle(data):
    X, g, _, u = data
    m = compute_moments(X, sensitive_features=np.column_stack(g), sample_weight=u)
    W, mean, S = weighted_moments(X, u)
    assert m.weighted and m.n == pytest.approx(W, rel=1e-13) and m.n_rows == N
    np.testing.assert_allclose(m.mean, mean, rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(m.scatter, S, rtol=1e-11, atol=1e-10)
    np.testing.assert_allclose(m.covariance(), S / (W - 1), rtol=1e-11)  # ddof: sum(w) - 1
    for a, labels in zip(m.attributes, g):
        for i, c in enumerate(a.categories):
            sel = labels == c
            assert a.counts[i] == pytest.approx(u[sel].sum(), rel=1e-13)
            np.testing.assert_allclose(m.mean + a.deviation[i], u[sel] @ X[sel] / u[sel].sum(),
                                       rtol=1e-11, atol=1e-12)


def test_unweighted_statistics_keep_their_integer_counts(data):
    X, g, _, _ = data
    m = compute_moments(X, sensitive_features=g[0])
    assert isinstance(m.n, int) and m.n_rows is None and not m.weighted
    assert m.attributes[0].counts.dtype == np.int64
    ones = compute_moments(X, sensitive_features=g[0], sample_weight=np.ones(N))
    assert isinstance(ones.n, float) and ones.n_rows == N
    assert_same_statistics(ones, m, rtol=1e-12)


@pytest.mark.parametrize("group_scatter", [False, True])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_integer_weights_equal_repeated_rows_in_the_statistics(data, group_scatter, dtype):
    X, g, w, _ = data
    codes = np.column_stack(g)
    Xr, cr = repeated(w, X, codes)
    kw = dict(group_scatter=group_scatter, dtype=dtype)
    a = compute_moments(X.astype(dtype), sensitive_features=codes, sample_weight=w, **kw)
    b = compute_moments(Xr.astype(dtype), sensitive_features=cr, **kw)
    assert a.n_rows == int(np.count_nonzero(w))
    assert_same_statistics(a, b, rtol=1e-10 if dtype == np.float64 else 1e-5)


def test_zero_weights_equal_dropped_rows_and_their_nan_is_still_reported(data):
    X, g, w, u = data
    u = u * (w > 0)
    keep = u > 0
    a = compute_moments(X, sensitive_features=g[1], sample_weight=u, group_scatter=True)
    b = compute_moments(X[keep], sensitive_features=g[1][keep], sample_weight=u[keep],
                        group_scatter=True)
    assert a.n_rows == b.n_rows == int(keep.sum())
    assert_same_statistics(a, b, rtol=1e-12)
    Xn = X.copy()
    Xn[np.flatnonzero(~keep)[0]] = np.nan  # a row of weight 0 holding NaN: still an error
    with pytest.raises(ValueError, match="NaN"):
        PCA(2).fit(Xn, sample_weight=u)


def test_offset_and_extreme_magnitude_data_keep_their_precision(data):
    """The weighted chunk takes the unweighted one's paths for data far from 0 (a second
    centred sum) and of extreme magnitude (columns scaled by powers of two)."""
    X, _, w, _ = data
    for Y in (X + 1e9, X * 1e-200, X * 1e200):
        a = compute_moments(Y, sample_weight=w)
        (Yr,) = repeated(w, Y)
        b = compute_moments(Yr)
        assert a.scatter_exponent == b.scatter_exponent
        assert_same_statistics(a, b, rtol=1e-8)


# ----------------------------------------------------------------------------- estimators
def test_pca_and_fair_pca_match_the_weighted_oracle(data):
    X, g, _, u = data
    pca = PCA(4).fit(X, sample_weight=u)
    assert angle(pca, weighted_pca(X, u, 4)) < ANGLE
    W, _, S = weighted_moments(X, u)
    top = np.sort(np.linalg.eigvalsh(S))[::-1][:4]
    np.testing.assert_allclose(pca.explained_variance_, top / (W - 1), rtol=1e-10)
    np.testing.assert_allclose(pca.explained_variance_ratio_, top / np.trace(S), rtol=1e-10)
    assert pca.n_samples_seen_ == N and pca.sample_weight_sum_ == pytest.approx(W, rel=1e-13)
    fair = FairPCA(4).fit(X, sensitive_features=g, sample_weight=u)
    assert angle(fair, weighted_fair_pca(X, g, u, 4)) < ANGLE
    for gm, labels in zip(fair.group_means_, g):  # the weighted group means
        for i, c in enumerate(np.unique(labels)):
            sel = labels == c
            np.testing.assert_allclose(gm[i], u[sel] @ X[sel] / u[sel].sum(), rtol=1e-11, atol=1e-12)
    # the weights change the answer: the unweighted fit is another subspace
    assert angle(FairPCA(4).fit(X, sensitive_features=g), weighted_fair_pca(X, g, u, 4)) > 1e-3


@pytest.mark.parametrize("make", [
    lambda: PCA(4),
    lambda: PCA(None),
    lambda: PCA(0.8),
    lambda: PCA(4, standardize=True),
    lambda: PCA(4, center=False),
    lambda: FairPCA(4),
    lambda: FairPCA(4, equalize_covariance=6),
    lambda: FairPCA(4, constraint="equal_opportunity"),
    lambda: FairPCA(3, tradeoff=0.5),
    lambda: FairPCA(3, sensitive_feature_ids=[0]),
], ids=["pca", "pca-all", "pca-fraction", "standardize", "uncentred", "fair", "fair-s",
        "equal-opportunity", "tradeoff", "numeric-attribute"])
def test_integer_weights_equal_repeated_rows_and_zero_weights_dropped_rows(data, make):
    X, g, w, _ = data
    y = (X[:, 0] > np.median(X[:, 0])).astype(int)
    codes = np.column_stack(g)
    fair = isinstance(make(), FairPCA) and make().sensitive_feature_ids is None

    def fit(X, codes, y, sample_weight=None):
        kw = {"sensitive_features": codes} if fair else {}
        return make().fit(X, y, sample_weight=sample_weight, **kw)

    weighted = fit(X, codes, y, w)
    rep = fit(*repeated(w, X, codes, y))
    keep = w > 0
    dropped = fit(X[keep], codes[keep], y[keep], w[keep])
    for other in (rep, dropped):
        assert weighted.n_components_ == other.n_components_
        assert max_angle_deg(weighted.components_.T, other.components_.T) < ANGLE
        np.testing.assert_allclose(weighted.explained_variance_, other.explained_variance_,
                                   rtol=1e-8)
        np.testing.assert_allclose(weighted.mean_, other.mean_, rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(weighted.transform(X), other.transform(X), rtol=1e-7, atol=1e-7)
    assert weighted.n_samples_seen_ == dropped.n_samples_seen_
    assert weighted.sample_weight_sum_ == pytest.approx(w[keep].sum() if not
                                                        make().get_params().get("constraint") ==
                                                        "equal_opportunity" else w[y == 1].sum())


def test_partial_fit_with_weights_equals_fit(data):
    X, g, _, u = data
    ref = FairPCA(3).fit(X, sensitive_features=g[0], sample_weight=u)
    est = FairPCA(3)
    for s in range(0, N, 150):
        est.partial_fit(X[s : s + 150], sensitive_features=g[0][s : s + 150],
                        sample_weight=u[s : s + 150])
    assert max_angle_deg(est.components_.T, ref.components_.T) < ANGLE
    assert est.sample_weight_sum_ == pytest.approx(u.sum())
    # calls without weights are weights of 1
    mixed = PCA(3).partial_fit(X[:300], sample_weight=np.ones(300)).partial_fit(X[300:])
    assert max_angle_deg(mixed.components_.T, PCA(3).fit(X).components_.T) < ANGLE


def test_certificate_holds_for_the_weighted_group_means(data):
    """The constraint is equal weighted group means: the weighted means of the projections
    are equal per group; the unweighted means are not (the weights matter)."""
    X, g, _, u = data
    est = FairPCA(4).fit(X, sensitive_features=g[1], sample_weight=u)
    assert est.fairness_violation_ < 1e-10
    Y = est.transform(X)
    means = [u[g[1] == c] @ Y[g[1] == c] / u[g[1] == c].sum() for c in np.unique(g[1])]
    scale = np.abs(Y).max()
    for m in means[1:]:
        np.testing.assert_allclose(m, means[0], atol=1e-10 * scale)
    plain = [Y[g[1] == c].mean(0) for c in np.unique(g[1])]
    assert max(np.abs(p - plain[0]).max() for p in plain[1:]) > 1e-3 * scale


# ----------------------------------------------------------------------------- Dask and Zarr
@pytest.mark.parametrize("x_chunks,w_chunks", [
    (70, 70), (70, 33), (70, -1), (200, 7), (-1, 90), (70, None),
], ids=["same", "finer", "one", "coarser-X", "one-X", "numpy-weights"])
def test_dask_weights_of_any_chunking(data, x_chunks, w_chunks):
    X, g, _, u = data
    Xd = da.from_array(X, chunks=(x_chunks, D))
    wd = u if w_chunks is None else da.from_array(u, chunks=w_chunks)
    est = FairPCA(3).fit(Xd, sensitive_features=g[0], sample_weight=wd)
    assert angle(est, weighted_fair_pca(X, [g[0]], u, 3)) < ANGLE
    assert est.sample_weight_sum_ == pytest.approx(u.sum(), rel=1e-12)


def test_dask_weights_with_numpy_x_and_filtered_dask_x(data):
    X, _, _, u = data
    est = PCA(3).fit(X, sample_weight=da.from_array(u, chunks=100))
    assert angle(est, weighted_pca(X, u, 3)) < ANGLE
    # X and the weights filtered by X's values: unknown chunk sizes, computed before the pass
    Xd, wd = da.from_array(X, chunks=(70, D)), da.from_array(u, chunks=70)
    sel = Xd[:, 0] > np.median(X[:, 0])
    est = PCA(3).fit(Xd[sel], sample_weight=wd[sel])
    keep = X[:, 0] > np.median(X[:, 0])
    assert angle(est, weighted_pca(X[keep], u[keep], 3)) < ANGLE


def test_zarr_input_and_zarr_weights(data, tmp_path):
    X, g, _, u = data
    xa = zarr.create_array(str(tmp_path / "x.zarr"), shape=X.shape, chunks=(64, D), dtype="f8")
    xa[:] = X
    wa = zarr.create_array(str(tmp_path / "w.zarr"), shape=u.shape, chunks=(100,), dtype="f8")
    wa[:] = u
    est = FairPCA(3).fit(str(tmp_path / "x.zarr"), sensitive_features=g[0],
                         sample_weight=zarr.open_array(str(tmp_path / "w.zarr"), mode="r"))
    assert angle(est, weighted_fair_pca(X, [g[0]], u, 3)) < ANGLE


def test_weights_on_a_distributed_cluster(data, client):
    X, g, _, u = data
    Xd = da.from_array(X, chunks=(50, D))
    est = FairPCA(3).fit(Xd, sensitive_features=g[0], sample_weight=da.from_array(u, chunks=80))
    assert angle(est, weighted_fair_pca(X, [g[0]], u, 3)) < ANGLE
    bad = u.copy()
    bad[333] = -2.0  # only the pass sees a Dask array's values: a clear error from the worker
    with pytest.raises(InvalidInputError, match=r"negative, NaN or infinite weight.*rows 333"):
        PCA(3).fit(Xd, sample_weight=da.from_array(bad, chunks=80))
    with pytest.raises(InvalidInputError, match="zero for every row"):
        PCA(3).fit(Xd, sample_weight=da.zeros(N, chunks=80))


# ----------------------------------------------------------------------------- refusals
def _exploding(X):
    """X as a Dask array whose chunks raise when read: an error before any pass never
    reads it."""
    def boom(block):
        raise AssertionError("X was read")

    return da.from_array(X, chunks=(100, D)).map_blocks(boom, dtype=X.dtype)


@pytest.mark.parametrize("weights,error,match", [
    (lambda u: -u, InvalidInputError, "negative, NaN or infinite"),
    (lambda u: np.where(np.arange(N) == 5, np.nan, u), InvalidInputError, r"rows 5\b"),
    (lambda u: np.where(np.arange(N) == 7, np.inf, u), InvalidInputError, r"rows 7\b"),
    (lambda u: np.zeros(N), InvalidInputError, "zero for every row"),
    (lambda u: u[:-1], InvalidInputError, f"{N - 1} weights but X has {N} rows"),
    (lambda u: np.column_stack([u, u]), InvalidInputError, "1-D"),
    (lambda u: 2.0, InvalidTypeError, "one weight per row"),
    (lambda u: np.array(["a"] * N), InvalidInputError, "numbers"),
    (lambda u: da.from_array(u[:-1], chunks=50), InvalidInputError, f"{N - 1} weights"),
    (lambda u: da.from_array(np.column_stack([u, u]), chunks=50), InvalidInputError, "1-D"),
], ids=["negative", "nan", "inf", "all-zero", "short", "2-D", "scalar", "text", "dask-short",
        "dask-2-D"])
def test_bad_weights_are_refused_before_any_pass(data, weights, error, match):
    X, g, _, u = data
    for est, kw in ((PCA(2), {}), (FairPCA(2), {"sensitive_features": g[0]})):
        with pytest.raises(error, match=match):
            est.fit(_exploding(X), sample_weight=weights(u), **kw)


def test_equal_opportunity_with_no_weight_on_the_positive_rows_is_refused(data):
    X, g, _, u = data
    y = (X[:, 0] > np.median(X[:, 0])).astype(int)
    with pytest.raises(InvalidInputError, match="y == 1"):
        FairPCA(2, constraint="equal_opportunity").fit(_exploding(X), y, sensitive_features=g[0],
                                                       sample_weight=u * (y == 0))


def test_the_randomized_solve_is_refused_and_auto_takes_the_exact_one(data):
    X, _, _, u = data
    with pytest.raises(InvalidInputError, match="randomized.*does not take sample_weight"):
        PCA(2, svd_solver="randomized").fit(X, sample_weight=u)
    assert PCA(2).fit(X, sample_weight=u).fitted_svd_solver_ == "covariance_eigh"


def test_fair_kernel_pca_refuses_weights_naming_why(data):
    X, g, _, u = data
    with pytest.raises(InvalidInputError, match="FairKernelPCA does not take sample_weight.*FairPCA"):
        FairKernelPCA(2).fit(X, sensitive_features=g[0], sample_weight=u)
    FairKernelPCA(2).fit(X[:200], sensitive_features=g[0][:200])  # without weights it fits


# ----------------------------------------------------------------------------- scikit-learn
def test_pipeline_routes_the_weights(data):
    X, g, _, u = data
    y = (X[:, 1] > np.median(X[:, 1])).astype(int)
    with sklearn.config_context(enable_metadata_routing=True):
        fair = FairPCA(3).set_fit_request(sensitive_features=True, sample_weight=True)
        clf = LogisticRegression().set_fit_request(sample_weight=True)
        pipe = make_pipeline(fair, clf).fit(X, y, sensitive_features=g[0], sample_weight=u)
        ref = FairPCA(3).fit(X, sensitive_features=g[0], sample_weight=u)
        assert max_angle_deg(pipe[0].components_.T, ref.components_.T) < ANGLE
        np.testing.assert_allclose(pipe[-1].coef_, LogisticRegression().fit(
            ref.transform(X), y, sample_weight=u).coef_, rtol=1e-6)
        # a step that did not ask for the weights does not get them
        plain = make_pipeline(PCA(3).set_fit_request(sample_weight=False), clf).fit(
            X, y, sample_weight=u)
        assert not hasattr(plain[0], "sample_weight_sum_")


# ----------------------------------------------------------------------------- saved and resumed
def test_save_load_keeps_the_weighted_statistics(data, tmp_path):
    X, g, _, u = data
    est = FairPCA(3).fit(X[:400], sensitive_features=g[0][:400], sample_weight=u[:400])
    est.save(tmp_path / "m", statistics=True)
    back = dfairpca.load(tmp_path / "m")
    assert back.sample_weight_sum_ == est.sample_weight_sum_ and back.n_samples_seen_ == 400
    assert back.statistics_.weighted and back.statistics_.n == est.statistics_.n
    np.testing.assert_array_equal(back.statistics_.attributes[0].counts,
                                  est.statistics_.attributes[0].counts)
    np.testing.assert_allclose(back.components_, est.components_)
    back.partial_fit(X[400:], sensitive_features=g[0][400:], sample_weight=u[400:])
    whole = FairPCA(3).fit(X, sensitive_features=g[0], sample_weight=u)
    assert max_angle_deg(back.components_.T, whole.components_.T) < ANGLE
    # weighted statistics without their row count are refused, not read as counts
    meta = json.loads((tmp_path / "m" / "statistics" / "meta.json").read_text())
    arrays = dict(np.load(tmp_path / "m" / "statistics" / "arrays.npz"))
    del arrays["n_rows"]
    np.savez(tmp_path / "m" / "statistics" / "arrays.npz", **arrays)
    (tmp_path / "m" / "statistics" / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match="'n_rows'"):
        dfairpca.load(tmp_path / "m")


def test_a_checkpoint_of_other_weights_is_not_resumed(data, tmp_path, stop_after):
    X, g, _, u = data
    Xd = da.from_array(X, chunks=(50, D))
    ckpt = tmp_path / "ckpt"
    from dfairpca.engine.checkpoint import compute_moments_checkpointed

    with pytest.raises(PassInterrupted):
        compute_moments_checkpointed(Xd, sensitive_features=g[0], checkpoint=ckpt, sample_weight=u,
                                     segment_rows=150, on_segment=stop_after(1))
    for other in (u * 2, None):
        with pytest.raises(CheckpointMismatch, match="the sample weights differ"):
            compute_moments_checkpointed(Xd, sensitive_features=g[0], checkpoint=ckpt,
                                         sample_weight=other)
    resumed = compute_moments_checkpointed(Xd, sensitive_features=g[0], checkpoint=ckpt,
                                           sample_weight=da.from_array(u, chunks=77))
    assert_same_statistics(resumed, compute_moments(X, sensitive_features=g[0], sample_weight=u))
    # the estimators' checkpointed fit takes the weights too
    est = FairPCA(3).fit(Xd, sensitive_features=g[0], sample_weight=u, checkpoint=tmp_path / "c2")
    assert angle(est, weighted_fair_pca(X, [g[0]], u, 3)) < ANGLE
    # a randomized fit's checkpoint is never resumed by a weighted fit (which would then
    # run unweighted passes): svd_solver="auto" takes the exact solve and refuses it
    PCA(2, svd_solver="randomized").fit(Xd, checkpoint=tmp_path / "c3", keep_checkpoint=True)
    with pytest.raises(CheckpointMismatch, match="written by the randomized fit"):
        PCA(2).fit(Xd, sample_weight=u, checkpoint=tmp_path / "c3")


# ----------------------------------------------------------------------------- command line
def test_cli_fit_with_weights_from_an_array_and_a_csv_column(data, tmp_path, client, capsys):
    import pandas as pd

    from dfairpca.cli import main

    X, g, _, u = data
    root = zarr.open_group(str(tmp_path / "data.zarr"), mode="w")
    root.create_array("X", shape=X.shape, chunks=(100, D), dtype="f8")[:] = X
    root.create_array("w", shape=u.shape, chunks=(100,), dtype="f8")[:] = u
    pd.DataFrame({"group": g[0], "weight": u}).to_csv(tmp_path / "people.csv", index=False)
    sched = ["--scheduler", client.scheduler.address]
    ref = FairPCA(3).fit(X, sensitive_features=g[0], sample_weight=u)
    for i, source in enumerate((["--sample-weight-array", "w"], ["--sample-weight-column", "weight"])):
        code = main(["fit", str(tmp_path / "data.zarr"), "--array", "X", "--sensitive-csv",
                     str(tmp_path / "people.csv"), "--sensitive-column", "group", *source, "-k", "3",
                     "--out", str(tmp_path / f"m{i}"), "--json", *sched])
        out = capsys.readouterr()
        assert code == 0, out.err
        summary = json.loads(out.out)
        assert summary["sample_weight_sum"] == pytest.approx(u.sum())
        est = dfairpca.load(tmp_path / f"m{i}")
        assert max_angle_deg(est.components_.T, ref.components_.T) < ANGLE
    code = main(["fit", str(tmp_path / "data.zarr"), "--array", "X", "--method", "pca",
                 "--sample-weight-column", "weight", "-k", "3", "--out", str(tmp_path / "m9"), *sched])
    assert code == 2 and "--sample-weight-csv" in capsys.readouterr().err
    bad = root.create_array("neg", shape=u.shape, chunks=(100,), dtype="f8")
    bad[:] = -u
    code = main(["fit", str(tmp_path / "data.zarr"), "--array", "X", "--method", "pca",
                 "--sample-weight-array", "neg", "-k", "3", "--out", str(tmp_path / "m8"), *sched])
    assert code == 2 and "negative" in capsys.readouterr().err


def test_exact_statistics_of_weighted_rows_are_refused_before_any_pass():
    """Weighted sums are not integer sums: compute_dtype='exact' with sample_weight is a
    clear refusal naming the fix, from the estimator and from compute_moments."""
    import dfairpca
    from dfairpca.errors import InvalidInputError

    rng = np.random.default_rng(0)
    X = rng.integers(0, 256, size=(40, 6), dtype=np.uint8)
    w = rng.uniform(0.5, 2.0, size=40)
    with pytest.raises(InvalidInputError, match="compute_dtype='float64'"):
        dfairpca.PCA(2, compute_dtype="exact").fit(X, sample_weight=w)
    with pytest.raises(InvalidInputError, match="compute_dtype='float64'"):
        dfairpca.compute_moments(X, dtype="exact", sample_weight=w)
    # the default ("auto") fits weighted integer rows in floating point
    est = dfairpca.PCA(2).fit(X, sample_weight=w)
    assert not est.statistics_kernel_.startswith("exact")


def test_weights_totalling_under_two_are_refused_before_the_pass_naming_frequency_weights():
    """Weights summing to 1 (probabilities) are frequency weights of one row in all: a fit,
    and validate_fit, refuse them before any pass, saying to rescale them."""
    from dfairpca.errors import InvalidInputError

    rng = np.random.default_rng(3)
    X = rng.normal(size=(40, 4))
    g = rng.integers(0, 2, size=40)
    w = rng.uniform(1, 3, size=40)
    p = w / w.sum()
    for call in (lambda: PCA(2).fit(X, sample_weight=p),
                 lambda: PCA(2).validate_fit(X, sample_weight=p),
                 lambda: FairPCA(2).fit(X, sensitive_features=g, sample_weight=p),
                 lambda: FairPCA(2).validate_fit(X, sensitive_features=g, sample_weight=p)):
        with pytest.raises(InvalidInputError, match="rescaled to sum to the number of rows"):
            call()
    PCA(2).fit(X, sample_weight=p * 40)


def test_exact_statistics_asked_for_refuse_weights_in_partial_fit_too():
    from dfairpca.errors import InvalidInputError

    rng = np.random.default_rng(4)
    X = rng.integers(0, 256, size=(40, 5), dtype=np.uint8)
    w = rng.uniform(0.5, 2.0, size=40)
    with pytest.raises(InvalidInputError, match="compute_dtype='float64'"):
        PCA(2, compute_dtype="exact").partial_fit(X, sample_weight=w)
    g = rng.integers(0, 2, size=40)
    with pytest.raises(InvalidInputError, match="compute_dtype='float64'"):
        FairPCA(2, compute_dtype="exact").partial_fit(X, sensitive_features=g, sample_weight=w)


def test_too_little_weight_says_frequency_weights_may_be_rescaled(data):
    """Weights scaled by 1e-10 total under 2: the message says what they are and the fix;
    a total of 1.0000000000000002 is shown as a person writes it."""
    X = data[0]
    w = np.full(len(X), 1e-10)
    for Xi, wi in [(X, w), (da.from_array(X, chunks=(100, X.shape[1])), da.from_array(w, chunks=100))]:
        with pytest.raises(InvalidInputError, match=rf"totals {len(X) * 1e-10:.6g} .*frequency weights.*may be rescaled "
                                                    r"to sum to the number of rows") as e:
            PCA(2).fit(Xi, sample_weight=wi)
        assert "changes no component" in str(e.value)
    w = np.array([1.0, 2.220446049250313e-16])
    assert w.sum() == 1.0000000000000002
    for wi in (w, da.from_array(w, chunks=1)):
        with pytest.raises(InvalidInputError, match=r"sample_weight totals 1 over") as e:
            PCA(1).fit(X[:2] if isinstance(wi, np.ndarray) else da.from_array(X[:2], chunks=(1, X.shape[1])),
                       sample_weight=wi)
        assert "1.0000000000000002" not in str(e.value)
