"""FairKernelPCA against a dense Algorithm 3 of the paper; Nyström against exact; errors."""

import dask.array as da
import numpy as np
import pytest
import scipy.linalg
import zarr
from sklearn.base import clone
from sklearn.decomposition import KernelPCA
from sklearn.exceptions import NotFittedError
from sklearn.metrics.pairwise import pairwise_kernels, rbf_kernel

import dfairpca
import dfairpca.solve._kernels as kernels
from dfairpca.decomposition.kernel import FairKernelPCA, exact_fit_bytes
from oracle import centred_onehot, make_data, max_angle_deg

TOL_DEG = 1e-6


# ----------------------------------------------------------------------------- oracle
def centred_kernel(X, kernel, **params):
    """H K H of the rows of X (scikit-learn's kernel definitions)."""
    K = pairwise_kernels(X, metric=kernel, **params)
    H = np.eye(len(X)) - 1.0 / len(X)
    return H @ K @ H


def fair_kernel_pca_alg3(Kc, groups, k, fallback=None):
    """Algorithm 3 (App. B.1) with Z_comb (Sec. 3.5), densely: returns the training
    representation ``(Lambda^T R^T K)^T``, (n, k).

    The right-hand matrix ``R^T K R`` of the generalised eigenproblem is singular for a
    centred kernel.  ``fallback=None`` solves the problem exactly, restricted to the range of
    ``R^T K R`` where it is definite; ``fallback=1e-5`` is the paper's remedy for SciPy
    (App. C.1): add 1e-5 I to ``R^T K R``.
    """
    Z = np.concatenate([centred_onehot(g) for g in groups], axis=1)
    R = scipy.linalg.null_space(Z.T @ Kc)
    A = R.T @ Kc @ Kc @ R
    B = R.T @ Kc @ R
    if fallback is not None:
        _, L = scipy.linalg.eigh(A, B + fallback * np.eye(len(B)))
        Lam = L[:, ::-1][:, :k]
    else:
        b, V = np.linalg.eigh(B)
        live = b > 1e-12 * b.max()
        Vr = V[:, live] / np.sqrt(b[live])
        _, L = np.linalg.eigh(Vr.T @ A @ Vr)
        Lam = Vr @ L[:, ::-1][:, :k]
    return (Lam.T @ R.T @ Kc).T


def rbf_gamma(X):
    return 1.0 / (X.shape[1] * X.var())


def group_mean_gap(Y, labels):
    """Largest difference between two groups' means of Y, relative to Y's largest entry."""
    means = np.stack([Y[labels == c].mean(0) for c in np.unique(labels)])
    return np.abs(means - means[0]).max() / np.abs(Y).max()


# ----------------------------------------------------------------------------- exact
@pytest.mark.parametrize(
    "n, d, groups, k, kernel, params, lanczos",
    [
        (300, 5, (2,), 4, "rbf", {}, False),
        (400, 6, (3,), 5, "rbf", {}, False),              # three groups
        (450, 6, (2, 3), 6, "rbf", {}, False),            # two attributes (Z_comb)
        (350, 4, (3,), 5, "poly", {"degree": 2}, False),
        (400, 6, (2, 3), 5, "rbf", {}, True),             # ARPACK instead of dense eigh
    ],
)
def test_exact_matches_dense_algorithm3(n, d, groups, k, kernel, params, lanczos, monkeypatch):
    if lanczos:  # the estimator switches to Lanczos from ITERATIVE_MIN_SIZE rows
        monkeypatch.setattr(dfairpca.base._solvers, "ITERATIVE_MIN_SIZE", n // 2)
    X, g = make_data(n, d, groups, seed=n + d)
    est = FairKernelPCA(k, kernel=kernel, **params).fit(X, sensitive_features=np.column_stack(g))
    same = {"gamma": est.gamma_, **({} if kernel == "rbf" else {"coef0": 1.0}), **params}
    Kc = centred_kernel(X, kernel, **same)
    Y_ref = fair_kernel_pca_alg3(Kc, g, k)
    Y = est.transform(X)
    assert est.method_ == "exact" and Y.shape == (n, k)
    assert max_angle_deg(Y, Y_ref) < TOL_DEG
    assert est.max_components_ == n - sum(groups) + len(groups)
    assert est.n_constraints_ == sum(groups) - len(groups)
    # the paper's 1e-5 fallback moves the subspace by O(1e-5 / eigenvalue) only
    assert max_angle_deg(Y, fair_kernel_pca_alg3(Kc, g, k, fallback=1e-5)) < 1e-3
    # explained variance: the share of trace(Kc) captured, trace(B^T Kc Kc B) / trace(Kc)
    ev = est.explained_variance_ratio_.sum()
    np.testing.assert_allclose(ev, (Y**2).sum() / np.trace(Kc), rtol=1e-9)


@pytest.mark.parametrize(
    "kernel, params", [("sigmoid", {"gamma": 0.02}), ("poly", {"coef0": -1.0, "degree": 2})]
)
def test_indefinite_kernel_uses_its_positive_part(kernel, params):
    X, g = make_data(300, 5, (2,), seed=19)
    est = FairKernelPCA(3, kernel=kernel, **params).fit(X, sensitive_features=g[0])
    Kc = centred_kernel(X, kernel, **{"gamma": est.gamma_, **params})
    w, V = np.linalg.eigh(Kc)
    assert w.min() < -1e-3 * w.max()  # genuinely indefinite
    Kc_pos = (V * np.maximum(w, 0)) @ V.T
    Y = est.transform(X)
    assert max_angle_deg(Y, fair_kernel_pca_alg3(Kc_pos, g, 3)) < TOL_DEG
    assert group_mean_gap(Y, g[0]) < 1e-8


def test_gamma_scale_is_one_over_d_times_variance():
    X, g = make_data(200, 7, (2,), seed=1)
    X = np.round(X * 10 + 100).astype(np.uint8)
    a = FairKernelPCA(3).fit(X, sensitive_features=g[0])
    b = FairKernelPCA(3, n_landmarks=50).fit(da.from_array(X, chunks=(30, 7)), sensitive_features=g[0])
    expected = 1.0 / (7 * X.astype(float).var())
    assert a.gamma_ == pytest.approx(expected, rel=1e-12)
    assert b.gamma_ == pytest.approx(expected, rel=1e-12)
    assert FairKernelPCA(3, kernel="linear").fit(X, sensitive_features=g[0]).gamma_ is None


# ----------------------------------------------------------------------------- Nyström
def test_nystroem_with_all_rows_as_landmarks_equals_exact():
    X, g = make_data(300, 5, (3,), seed=7)
    Xnew, _ = make_data(60, 5, (3,), seed=8)
    exact = FairKernelPCA(4).fit(X, sensitive_features=g[0])
    nys = FairKernelPCA(4, n_landmarks=300).fit(da.from_array(X, chunks=(64, 5)), sensitive_features=g[0])
    assert nys.method_ == "nystroem" and nys.n_landmarks_ == 300
    Ye, Yn = exact.transform(X), nys.transform(X)
    assert max_angle_deg(Yn, Ye) < TOL_DEG
    # the same representation up to an orthogonal k x k map, also for new points
    Q, *_ = np.linalg.lstsq(Ye, Yn, rcond=None)
    np.testing.assert_allclose(Q.T @ Q, np.eye(4), atol=1e-8)
    atol = 1e-8 * np.abs(Yn).max()
    np.testing.assert_allclose(exact.transform(Xnew) @ Q, nys.transform(Xnew), atol=atol)
    np.testing.assert_allclose(nys.explained_variance_, exact.explained_variance_, rtol=1e-8)


def test_nystroem_landmarks_are_deterministic_fitted_rows():
    X, g = make_data(500, 6, (2,), seed=9)
    a = FairKernelPCA(3, n_landmarks=80, random_state=3).fit(X, sensitive_features=g[0])
    b = FairKernelPCA(3, n_landmarks=80, random_state=3).fit(da.from_array(X, chunks=(77, 6)), sensitive_features=g[0])
    c = FairKernelPCA(3, n_landmarks=80, random_state=4).fit(X, sensitive_features=g[0])
    np.testing.assert_array_equal(a.basis_indices_, b.basis_indices_)
    np.testing.assert_array_equal(a.basis_, X[a.basis_indices_])
    assert len(np.unique(a.basis_indices_)) == 80
    assert not np.array_equal(a.basis_indices_, c.basis_indices_)
    np.testing.assert_allclose(a.transform(X), b.transform(X), atol=1e-10)


# ----------------------------------------------------------------------------- invariants
@pytest.mark.parametrize("n_landmarks", [None, 120])
def test_group_means_of_training_representation_are_equal(n_landmarks):
    X, g = make_data(600, 8, (2, 3), seed=11)
    est = FairKernelPCA(6, n_landmarks=n_landmarks).fit(X, sensitive_features=np.column_stack(g))
    Y = est.transform(X)
    for labels in g:
        assert group_mean_gap(Y, labels) < 1e-8


@pytest.mark.parametrize("n_landmarks", [None, 100])
def test_lazy_transform_of_dask_input_equals_numpy(n_landmarks):
    X, g = make_data(400, 6, (2,), seed=12)
    est = FairKernelPCA(3, n_landmarks=n_landmarks, tradeoff=0.5).fit(X, sensitive_features=g[0])
    Xd = da.from_array(X, chunks=(90, 6))
    Y = est.transform(Xd)
    assert isinstance(Y, da.Array) and Y.chunks[0] == Xd.chunks[0] and Y.shape == (400, 6)
    np.testing.assert_allclose(Y.compute(), est.transform(X), rtol=0, atol=1e-12)
    assert isinstance(est.transform(X), np.ndarray)


def test_zarr_images_out_of_core(tmp_path):
    X, g = make_data(600, 36, (2,), seed=13)
    imgs = np.clip(X * 8 + 128, 0, 255).astype(np.uint8).reshape(600, 6, 6)
    store = zarr.open_group(str(tmp_path / "faces.zarr"), mode="w")
    arr = store.create_array("images", shape=imgs.shape, chunks=(128, 6, 6), dtype="uint8")
    arr[:] = imgs
    Xz = dfairpca.from_zarr(tmp_path / "faces.zarr", "images")
    est = FairKernelPCA(5, n_landmarks=150).fit(Xz, sensitive_features=g[0])
    ref = FairKernelPCA(5, n_landmarks=150).fit(imgs.reshape(600, 36), sensitive_features=g[0])
    np.testing.assert_array_equal(est.basis_, ref.basis_)
    Y = est.transform(Xz)
    assert isinstance(Y, da.Array) and Y.shape == (600, 5)
    Yc = Y.compute()
    atol = 1e-9 * np.abs(Yc).max()
    np.testing.assert_allclose(Yc, ref.transform(imgs.reshape(600, 36)), atol=atol)
    assert group_mean_gap(Yc, g[0]) < 1e-8


# ----------------------------------------------------------------------------- options
def test_equal_opportunity_fits_on_positive_rows():
    X, g = make_data(700, 6, (3,), seed=14)
    y = (X[:, 0] > np.median(X[:, 0])).astype(int)
    pos = y == 1
    est = FairKernelPCA(4, constraint="equal_opportunity").fit(X, y, sensitive_features=g[0])
    assert est.n_samples_seen_ == pos.sum() and est.n_landmarks_ == pos.sum()
    assert est.gamma_ == pytest.approx(rbf_gamma(X[pos]), rel=1e-12)
    Kc = centred_kernel(X[pos], "rbf", gamma=est.gamma_)
    Y = est.transform(X[pos])
    assert max_angle_deg(Y, fair_kernel_pca_alg3(Kc, [g[0][pos]], 4)) < TOL_DEG
    nys = FairKernelPCA(4, n_landmarks=150, constraint="equal_opportunity")
    nys.fit(da.from_array(X, chunks=100), y, sensitive_features=g[0])
    assert pos[nys.basis_indices_].all()
    assert group_mean_gap(nys.transform(X[pos]), g[0][pos]) < 1e-8


@pytest.mark.parametrize("n_landmarks", [None, 350])
def test_tradeoff_appends_scaled_standard_kernel_pca(n_landmarks):
    X, g = make_data(350, 5, (2,), seed=15)
    lam = 0.3
    est = FairKernelPCA(3, tradeoff=lam, n_landmarks=n_landmarks).fit(X, sensitive_features=g[0])
    Y = est.transform(X)
    assert Y.shape == (350, 6)
    fair = FairKernelPCA(3, n_landmarks=n_landmarks).fit(X, sensitive_features=g[0]).transform(X)
    np.testing.assert_allclose(Y[:, :3], fair, atol=1e-8 * np.abs(fair).max())
    kpca = KernelPCA(3, kernel="rbf", gamma=est.gamma_).fit_transform(X)
    assert max_angle_deg(Y[:, 3:], kpca) < TOL_DEG
    norms = np.linalg.norm(Y[:, 3:], axis=0)
    np.testing.assert_allclose(norms, lam * np.linalg.norm(kpca, axis=0), rtol=1e-8)


def _my_rbf(A, B):
    return rbf_kernel(A, B, gamma=0.05)


@pytest.mark.parametrize("n_landmarks", [None, 100])
def test_save_load_round_trip(tmp_path, n_landmarks):
    X, g = make_data(300, 6, (2, 3), seed=17)
    labels = np.column_stack([g[0].astype(str), g[1]])  # string and integer labels
    est = FairKernelPCA(3, kernel="poly", degree=2, n_landmarks=n_landmarks, tradeoff=0.3).fit(X, sensitive_features=labels)
    est.save(tmp_path / "m")
    back = dfairpca.load(tmp_path / "m")
    assert type(back) is FairKernelPCA and back.get_params() == est.get_params()
    assert back.method_ == est.method_ and back.gamma_ == est.gamma_
    for a, b in zip(back.groups_, est.groups_):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(back.transform(X), est.transform(X))
    assert not list(tmp_path.glob(".m.tmp*"))  # written under a temporary name, then moved


def test_save_refuses_a_callable_kernel_and_an_unfitted_model(tmp_path):
    X, g = make_data(120, 4, (2,), seed=18)
    with pytest.raises(ValueError, match="callable kernel cannot be saved"):
        FairKernelPCA(2, kernel=_my_rbf).fit(X, sensitive_features=g[0]).save(tmp_path / "m")
    with pytest.raises(NotFittedError):
        FairKernelPCA(2).save(tmp_path / "m")
    assert not (tmp_path / "m").exists()


def test_callable_kernel_and_sklearn_api():
    X, g = make_data(250, 5, (2,), seed=16)
    a = FairKernelPCA(3, kernel=_my_rbf).fit(X, sensitive_features=g[0])
    b = FairKernelPCA(3, kernel="rbf", gamma=0.05).fit(X, sensitive_features=g[0])
    np.testing.assert_allclose(a.transform(X), b.transform(X), atol=1e-12)
    est = FairKernelPCA(3, n_landmarks=100, tradeoff=0.1)
    assert clone(est).get_params() == est.get_params()
    np.testing.assert_allclose(est.fit_transform(X, sensitive_features=g[0]), clone(est).fit(X, sensitive_features=g[0]).transform(X))
    assert list(b.get_feature_names_out()) == ["fairkernelpca0", "fairkernelpca1", "fairkernelpca2"]


def test_auto_chooses_exact_when_it_fits_else_nystroem():
    X, g = make_data(300, 5, (2,), seed=17)
    assert FairKernelPCA(3, n_landmarks="auto").fit(X, sensitive_features=g[0]).method_ == "exact"
    est = FairKernelPCA(3, n_landmarks="auto", max_memory=exact_fit_bytes(300, 5) - 1).fit(X, sensitive_features=g[0])
    assert est.method_ == "nystroem" and est.n_landmarks_ == 300  # min(n, 2000)


# ----------------------------------------------------------------------------- errors
@pytest.fixture
def xz():
    X, g = make_data(200, 6, (3,), seed=18)
    return X, g[0]


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"kernel": "laplace"},
         "unknown kernel 'laplace'; use one of 'rbf', 'poly', 'sigmoid', 'linear' or a callable"),
        ({"gamma": 0.0}, "gamma must be 'scale' or a number > 0"),
        ({"gamma": -1.0}, "gamma must be 'scale' or a number > 0"),
        ({"n_components": 0}, "n_components must be a positive integer"),
        ({"n_landmarks": 201}, "n_landmarks=201 exceeds the 200 fitted rows"),
        ({"n_landmarks": 1}, "n_landmarks=1 is smaller than n_components=2"),
        ({"n_components": 9, "n_landmarks": 10},
         r"largest k is 10 - 3 \+ 1 = 8; pass a smaller n_components or more landmarks"),
        ({"n_components": 199}, r"n = 200 fitted rows the largest k is 200 - 3 \+ 1 = 198"),
        ({"max_memory": 1000}, r"needs about .* GiB \(\d+ bytes.* n_landmarks=200"),
        ({"landmarks": "kmeans"}, "landmarks must be 'uniform'"),
        ({"constraint": "parity"}, "constraint must be one of"),
        ({"tradeoff": 2.0}, r"tradeoff must be a number in \[0, 1\]"),
        ({"n_landmarks": "all"}, "n_landmarks must be None"),
    ],
)
def test_bad_parameters(xz, kwargs, match):
    X, z = xz
    with pytest.raises(ValueError, match=match):
        FairKernelPCA(**{"n_components": 2, **kwargs}).fit(X, sensitive_features=z)


def test_exact_memory_error_names_the_bytes(xz):
    X, z = xz
    need = exact_fit_bytes(200, 6)
    with pytest.raises(ValueError, match=f"{need} bytes"):
        FairKernelPCA(2, max_memory=need - 1).fit(X, sensitive_features=z)


def test_nystroem_memory_is_checked_before_any_work(xz, monkeypatch):
    """Too many landmarks: one line naming the bytes and the most landmarks that fit, not
    a MemoryError from the landmarks' m x m kernel matrix."""
    from dfairpca.decomposition import kernel
    from dfairpca.solve._kernel_method import nystroem_fit_bytes

    X, z = xz
    need = nystroem_fit_bytes(150, 6)
    most = nystroem_fit_bytes(100, 6)
    monkeypatch.setattr(kernel.kn, "take_rows", lambda *a: pytest.fail("read X"))
    with pytest.raises(ValueError, match=rf"n_landmarks=150 needs about .* GiB \({need} bytes.*"
                                         r"e\.g\. n_landmarks=100 \(the most that fit\)"):
        FairKernelPCA(2, n_landmarks=150, max_memory=most).fit(X, sensitive_features=z)
    monkeypatch.undo()
    assert FairKernelPCA(2, n_landmarks=100, max_memory=most).fit(
        X, sensitive_features=z).method_ == "nystroem"


def test_transform_errors(xz):
    X, z = xz
    with pytest.raises(NotFittedError, match="not fitted yet"):
        FairKernelPCA(2).transform(X)
    est = FairKernelPCA(2, n_landmarks=50).fit(X, sensitive_features=z)
    with pytest.raises(ValueError, match="X has 5 features, but FairKernelPCA is expecting 6 features as input"):
        est.transform(X[:, :5])
    with pytest.raises(ValueError, match="pass y"):
        FairKernelPCA(2, constraint="equal_opportunity").fit(X, sensitive_features=z)
    with pytest.raises(ValueError, match="single group"):
        FairKernelPCA(2).fit(X, sensitive_features=np.zeros(200))


def test_nystroem_and_exact_on_a_distributed_cluster(client, tmp_path):
    X, g = make_data(900, 12, (2,), seed=20)
    Xu8 = np.clip(X * 8 + 128, 0, 255).astype(np.uint8)
    store = zarr.open_group(str(tmp_path / "s.zarr"), mode="w")
    store.create_array("X", shape=Xu8.shape, chunks=(100, 12), dtype="uint8")[:] = Xu8
    Xz = dfairpca.from_zarr(tmp_path / "s.zarr", "X", rows_per_chunk=100)
    for n_landmarks in (200, None):
        local = FairKernelPCA(4, n_landmarks=n_landmarks).fit(Xu8, sensitive_features=g[0])
        remote = FairKernelPCA(4, n_landmarks=n_landmarks, split_every=3).fit(Xz, sensitive_features=g[0])
        Y = remote.transform(Xz)
        assert isinstance(Y, da.Array)
        Yc = Y.compute()
        np.testing.assert_allclose(Yc, local.transform(Xu8), atol=1e-9 * np.abs(Yc).max())
        assert group_mean_gap(Yc, g[0]) < 1e-8
    logs = client.run(lambda dask_worker: [str(k) for k in dask_worker.state.log])
    assert sum("_expand" in str(entry) for log in logs.values() for entry in log) >= 9


@pytest.mark.parametrize("offset", [0.0, 1e6])
def test_variance_for_gamma_scale_is_exact_in_row_blocks(offset, monkeypatch):
    monkeypatch.setattr(kernels, "BLOCK_BYTES", 8 * 7 * 3)  # 3-row blocks
    X = np.random.default_rng(3).standard_normal((200, 7)) * 2 + offset
    v = kernels.flat_variance(da.from_array(X, chunks=(45, 7))).compute()
    assert abs(v - X.var()) <= 1e-9 * X.var()


# ----------------------------------------------------------------------------- reviewer's bugs
@pytest.mark.parametrize("dtype", [np.uint8, np.int64])
@pytest.mark.parametrize("n_landmarks", [None, 50])
def test_integer_input_saves_and_loads_with_an_identical_transform(tmp_path, dtype, n_landmarks):
    """The basis keeps X's integer dtype (transform casts it to float64): load accepts it."""
    rng = np.random.default_rng(0)
    X, z = rng.integers(0, 256, (300, 6)).astype(dtype), rng.integers(0, 2, 300)
    for kern in ("rbf", "poly"):
        est = FairKernelPCA(3, kernel=kern, n_landmarks=n_landmarks).fit(X, sensitive_features=z)
        est.save(tmp_path / kern)
        back = dfairpca.load(tmp_path / kern)
        assert back.basis_.dtype == dtype
        np.testing.assert_array_equal(back.transform(X), est.transform(X))


def _far_apart(n, d, seed=0):
    """Integer-valued rows so far apart for gamma=1/d that the rbf kernel matrix is I."""
    rng = np.random.default_rng(seed)
    z = rng.integers(0, 2, n)
    X = rng.integers(0, 256, (n, d)).astype(float)
    X[z == 1, :50] += 20
    return X, z


@pytest.mark.parametrize("X, z, params", [
    (*_far_apart(500, 400), {"gamma": 1 / 400}),
    (np.random.default_rng(1).normal(size=(400, 6)), np.random.default_rng(2).integers(0, 2, 400),
     {"gamma": 1e3}),
], ids=["integers-gamma-1/d", "normal-gamma-1e3"])
def test_a_kernel_matrix_near_the_identity_is_an_error_not_a_short_output(X, z, params):
    """K = I: every direction has the same variance, so no top k exists; earlier the
    eigensolver returned fewer than k pairs and transform fewer than n_components_ columns."""
    with pytest.raises(ValueError, match=r"gamma=.*distinct points .*orthogonal.*smaller gamma"):
        FairKernelPCA(5, **params).fit(X, sensitive_features=z)


def test_a_saturated_sigmoid_kernel_is_an_error_not_zeros(two_groups):
    X, z = two_groups(400, 6)
    X += 30
    with pytest.raises(ValueError, match=r"only 0 of the 3 components have positive variance"):
        FairKernelPCA(3, kernel="sigmoid").fit(X, sensitive_features=z)
    with pytest.raises(ValueError, match=r"landmark kernel matrix of rank 1"):
        FairKernelPCA(3, kernel="sigmoid", n_landmarks=100).fit(X, sensitive_features=z)


def test_rank_deficient_kernel_names_the_largest_k(two_groups):
    """A linear kernel on 4 features has rank 4; fair: 3 directions; k = 5 is an error."""
    X, z = two_groups(300, 4, shift=1.0)
    for m, match in ((None, r"only 3 of the 5 components .*n_components <= 3"),
                     (100, r"landmark kernel matrix of rank 4 .*largest k is .* = 3")):
        with pytest.raises(ValueError, match=match):
            FairKernelPCA(5, kernel="linear", n_landmarks=m).fit(X, sensitive_features=z)


def test_certification_message_names_only_fair_kernel_pca_options(monkeypatch, two_groups):
    X, z = two_groups(300, 4)
    monkeypatch.setattr(dfairpca.solve._fairness, "FAIRNESS_TOLERANCE", -1.0)
    with pytest.raises(ValueError, match="could not satisfy") as info:
        FairKernelPCA(2).fit(X, sensitive_features=z)
    assert "standardize" not in str(info.value) and "compute_dtype" not in str(info.value)
    assert "gamma" in str(info.value)


def test_linear_kernel_is_certified_far_from_the_origin(two_groups):
    """Centred, the linear kernel is shift-invariant: X + 3e6 fits as X does."""
    X, z = two_groups(500, 6)
    X[z == 1, 0] += 1.0
    for m in (None, 100):
        a = FairKernelPCA(3, kernel="linear", n_landmarks=m).fit(X, sensitive_features=z)
        b = FairKernelPCA(3, kernel="linear", n_landmarks=m).fit(X + 3e6, sensitive_features=z)
        np.testing.assert_allclose(np.abs(b.transform(X + 3e6)), np.abs(a.transform(X)), atol=1e-6)


@pytest.mark.parametrize("kw", [dict(constraint="equal_opportunity"), dict(n_landmarks=200)])
def test_nan_rows_are_named_by_their_row_of_x(xz, kw):
    """The exact method reads the y == 1 rows, Nyström its landmarks: a NaN row among them
    is named by its row number in X, not by its place among the rows read."""
    X, z = xz
    X = X.copy()
    X[17, 2] = np.nan
    y = np.ones(200, dtype=int)
    y[:10] = 0
    with pytest.raises(ValueError, match=r"NaN or infinity in 1 row\(s\) \(rows 17\); drop or impute"):
        FairKernelPCA(2, **kw).fit(X, y, sensitive_features=z)
