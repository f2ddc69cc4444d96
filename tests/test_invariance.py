"""Scale and offset invariance: fit(c X + b) spans the subspace of fit(X), over dtype x scale
x offset x group-mean gap, for PCA, FairPCA, Fair PCA-S and FairKernelPCA; and each against
the dense oracle.

Two kinds of property:

* **Exact transforms.**  X lies on a binary grid and c is a power of two, chosen so that
  ``c (X + b)`` is exactly representable in the dtype: the input then holds exactly the
  same information, and the fits must agree to the arithmetic's precision, whatever c, b
  and the gap.  Tolerances (largest principal angle, radians): float64 ``TOL[float64]`` =
  1e-9 (measured: at most 2e-14; every threshold in the solve is relative, so nothing
  depends on c); float32 ``TOL[float32]`` = 2e-4 (the products run in float32: the scatter
  is exact to about ``eps32 * sqrt(n)`` = 2e-6 relative, and the eigenvectors move by that
  times the eigengap condition of this data, about 20; measured at most 1.3e-5).  Fair
  fits add ``GAP_TOL / gap`` (gap in sd): the group means are float64 sums of the raw
  values, exact to about ``eps sqrt(n) (|mean| + sd)``; beyond 2**OFFSET_BITS = 64 sd from
  0 they are refined (dfairpca.stats.moments._refined) to ``eps sqrt(n) sd``, so the error is
  at most about ``eps sqrt(n) 65 sd`` = 2e-13 sd, and the constraint direction (and with
  it the subspace) turns by that over the gap; measured at most 3e-14 / gap.
* **Against the oracle.**  Arbitrary c = 10^u and offsets b (rounded into the dtype as any
  user's data would be), fitted and compared with the dense, naive oracle on the same
  rounded rows in float64: ``ORACLE_TOL`` = 1e-7 for float64 (the oracle's own group
  means are exact to about ``eps sqrt(n)`` sd, so it knows the constraint direction to
  eps sqrt(n) / gap, below 1e-8 for the smallest gap here), float32 as above.

Ranges: c from 2^-490 to 2^490 (about 1e-147 to 1e147) in float64 and 2^-100 to 2^100
(1e-30 to 1e30) in float32; offsets up to 1e6 sd (float64) and 1e4 sd (float32); gaps
from 1e-6 sd to 3 sd.  Offsets of the kernel are a scalar added to every feature: rbf with
gamma="scale" (1 / (d Var) over all entries) is invariant to c and to such b exactly, not
to a per-feature b, which changes Var.
"""

import warnings

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

import dfairpca
import oracle
from dfairpca.decomposition.kernel import FairKernelPCA
from dfairpca.stats.moments import Moments

TOL = {np.float64: 1e-9, np.float32: 2e-4}
GAP_TOL = 1e-12  # radians times the gap in sd (module docstring)
ORACLE_TOL = {np.float64: 1e-7, np.float32: 2e-4}
SCALES = np.array([4, 3, 2.2, 1.6, 1.2, 0.9, 0.7, 0.5])  # clear eigengaps
#: group 1's features are group 0's times these (on the grid: two more bits), so the group
#: covariances differ, as Fair PCA-S needs
STRETCH = np.array([1.5, 0.5, 1.0, 1.25, 0.75, 1.0, 1.5, 0.5])
RANGE = {np.float64: (490, 6), np.float32: (100, 4)}  # |log2 c|, log10 of the largest offset


def exact_data(seed, dtype, gap, offset, n=240, scalar_offset=False):
    """(X, b, z) with X + b exactly representable in dtype.

    Two groups whose means differ by exactly ``gap * 4`` along a random direction (group 0
    is symmetric about 0, group 1 a stretched copy shifted by the gap), rows on a binary
    grid as fine as the offset leaves room for.
    """
    rng = np.random.default_rng(seed)
    d = len(SCALES)
    rot = np.linalg.qr(rng.normal(size=(d, d)))[0]
    direction = np.ones(d) if scalar_offset else rng.normal(size=d) / np.sqrt(d)
    b_real = offset * SCALES.max() * direction
    top = np.abs(b_real).max() + 40 * SCALES.max() + gap * SCALES.max()
    q = np.finfo(dtype).nmant - int(np.ceil(np.log2(top)))  # fraction bits left
    on = lambda a, bits: np.round(a * 2.0**bits) / 2.0**bits  # noqa: E731
    B = on((rng.normal(size=(n // 4, d)) * SCALES) @ rot.T, q - 2)
    A = np.concatenate([B, -B])
    v = rng.normal(size=d)
    gv = on(gap * SCALES.max() * v / np.linalg.norm(v), q)
    X = np.concatenate([A, A * STRETCH + gv])
    b = on(b_real, q)
    assert np.array_equal((X + b).astype(dtype).astype(np.float64) - b, X)  # exact
    return X, b, np.repeat([0, 1], n // 2), gv


def quiet_fit(make, Y, **kw):
    """Fit with every warning an error: no RuntimeWarning, no dropped group."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        return make().fit(Y, **kw)


def transforms(data, dtype):
    """(p, offset, gap) strategies for a dtype."""
    bits, top = RANGE[dtype]
    return (data.draw(st.integers(-bits, bits), "log2 c"),
            data.draw(st.sampled_from([0.0]) | st.floats(0, top).map(lambda u: 10.0**u), "offset / sd"),
            data.draw(st.floats(-6, 0.5).map(lambda u: 10.0**u), "gap / sd"))


LINEAR = {
    "pca": (lambda: dfairpca.PCA(3), False),
    "fair": (lambda: dfairpca.FairPCA(3), True),
    "fair_s": (lambda: dfairpca.FairPCA(3, equalize_covariance=5), True),
}


# ----------------------------------------------------------------------------- exact transforms
@pytest.mark.parametrize("name", list(LINEAR))
@given(dtype=st.sampled_from([np.float64, np.float32]), seed=st.integers(0, 2**16), data=st.data())
def test_linear_estimators_are_scale_and_offset_invariant(name, dtype, seed, data):
    p, offset, gap = transforms(data, dtype)
    X, b, z, gv = exact_data(seed, dtype, gap, offset)
    assume(np.any(gv != 0))
    make, groups = LINEAR[name]
    kw = dict(sensitive_features=z) if groups else {}
    Y = (2.0**p * (X + b)).astype(dtype)
    ref = quiet_fit(make, X, **kw)
    got = quiet_fit(make, Y, **kw)
    angle = np.radians(oracle.max_angle_deg(ref.components_.T, got.components_.T))
    assert angle < TOL[dtype] + (GAP_TOL / gap if groups else 0.0)
    np.testing.assert_allclose(got.explained_variance_ratio_, ref.explained_variance_ratio_,
                               rtol=100 * TOL[dtype])
    if groups:
        assert got.n_constraints_ == 1 and got.fairness_violation_ < 1e-12


@given(dtype=st.sampled_from([np.float64, np.float32]), seed=st.integers(0, 2**16),
       nystroem=st.booleans(), data=st.data())
def test_fair_kernel_pca_is_scale_and_offset_invariant(dtype, seed, nystroem, data):
    """rbf with gamma="scale": the kernel of c X + b (b the same for every feature) is that
    of X, so is the training representation (compared as a subspace of R^n)."""
    p, offset, gap = transforms(data, dtype)
    X, b, z, gv = exact_data(seed, dtype, gap, offset, n=120, scalar_offset=True)
    assume(np.any(gv != 0))
    make = lambda: FairKernelPCA(3, n_landmarks=60 if nystroem else None)  # noqa: E731
    Y = (2.0**p * (X + b)).astype(dtype)
    ref = quiet_fit(make, X, sensitive_features=z)
    got = quiet_fit(make, Y, sensitive_features=z)
    angle = np.radians(oracle.max_angle_deg(ref.transform(X), got.transform(Y)))
    assert angle < TOL[np.float64]  # the kernel is computed in float64 from exact input
    assert got.fairness_violation_ < 1e-10


# ----------------------------------------------------------------------------- the oracle
@pytest.mark.parametrize("name", list(LINEAR))
@given(dtype=st.sampled_from([np.float64, np.float32]), seed=st.integers(0, 2**16), data=st.data())
def test_linear_estimators_match_the_oracle_at_any_scale(name, dtype, seed, data):
    bits, top = RANGE[dtype]
    u = data.draw(st.floats(-0.3 * bits, 0.3 * bits), "log10 c")  # 1e-147 .. 1e147 (float64)
    offset = data.draw(st.floats(0, top).map(lambda t: 10.0**t), "offset / sd")
    gap = data.draw(st.floats(-4, 0.5).map(lambda t: 10.0**t), "gap / sd")
    X, b, z, _ = exact_data(seed, np.float64, gap, offset)
    Y = ((X + b) * 10.0**u).astype(dtype)  # rounded as any user's data
    Yd = Y.astype(np.float64)
    make, groups = LINEAR[name]
    got = quiet_fit(make, Y, **(dict(sensitive_features=z) if groups else {}))
    if name == "pca":
        want = oracle.pca(Yd, 3)
    elif name == "fair":
        want = oracle.fair_pca(Yd, [z], 3)
    else:
        want = oracle.fair_pca_s(Yd, z, 3, 5)
    assert np.radians(oracle.max_angle_deg(got.components_.T, want)) < ORACLE_TOL[dtype]


@given(seed=st.integers(0, 2**16), u=st.floats(-147, 147), offset=st.floats(0, 6), gap=st.floats(-4, 0.5))
def test_fair_kernel_pca_matches_the_dense_oracle_at_any_scale(seed, u, offset, gap):
    X, b, z, _ = exact_data(seed, np.float64, 10.0**gap, 10.0**offset, n=100, scalar_offset=True)
    Y = (X + b) * 10.0**u
    got = quiet_fit(lambda: FairKernelPCA(3), Y, sensitive_features=z)
    gamma = 1.0 / (X.shape[1] * X.var())  # of X: the same as that of Y, in exact arithmetic
    want = oracle.fair_kernel_pca(oracle.rbf_kernel(X, gamma), [z], 3)
    assert np.radians(oracle.max_angle_deg(got.transform(Y), want)) < ORACLE_TOL[np.float64]


# ----------------------------------------------------------------------------- the statistics
@pytest.mark.parametrize("c", [2.0**-600, 1e-170, 1e-150, 1.0, 1e150, 1e170, 2.0**600])
def test_statistics_carry_any_float64_scale(c, tmp_path):
    """The scatter of X * 1e-170 underflows float64 (1e-340): it is kept with a power-of-two
    exponent, merged across chunks and saved with it."""
    X, b, z, _ = exact_data(1, np.float64, 0.5, 0.0)
    codes, cats = z[:, None], [np.arange(2)]
    ref = Moments.from_chunk(X, codes, cats, group_scatter=True)
    parts = [Moments.from_chunk(X[s : s + 70] * c, codes[s : s + 70], cats, group_scatter=True)
             for s in range(0, len(X), 70)]
    m = dfairpca.stats.moments.merge(parts)
    m.save(tmp_path / "m")
    back = Moments.load(tmp_path / "m")
    for got in (m, back):
        e = got.scatter_exponent
        np.testing.assert_allclose(got.mean, ref.mean * c, rtol=1e-13, atol=1e-15 * c)
        # stored * 4**e == true: compare as ratios (the true values may not fit float64)
        np.testing.assert_allclose(np.ldexp(got.scatter, 2 * e) / (c * c) if abs(e) < 400 else
                                   got.scatter / got.scatter[0, 0] * ref.scatter[0, 0],
                                   ref.scatter, rtol=1e-12, atol=1e-12 * ref.scatter.max())
        gs, rs = got.attributes[0].scatter[1], ref.attributes[0].scatter[1]
        np.testing.assert_allclose(gs / gs[0, 0], rs / rs[0, 0], rtol=1e-12, atol=1e-12)


def test_float32_products_of_tiny_and_huge_values_are_rescaled():
    """float32 squares of 1e-30 underflow and of 1e30 overflow: the chunk is redone with its
    columns scaled by powers of two, so the statistics are those of the data."""
    X, b, z, _ = exact_data(2, np.float32, 0.5, 0.0)
    ref = dfairpca.compute_moments(X.astype(np.float32), dtype=np.float32)
    for p in (-100, 100):
        m = dfairpca.compute_moments((X * 2.0**p).astype(np.float32), dtype=np.float32)
        np.testing.assert_allclose(m.covariance() / 4.0**p, ref.covariance(), rtol=1e-6,
                                   atol=1e-6 * ref.covariance().max())


def test_float64_data_in_float32_products_is_centred_first():
    """compute_dtype="float32" on float64 data 1e6 sd from 0: cast before centring, float32
    would keep the spread to its spacing there, 0.1 sd; centred in float64 first, the
    products lose only float32's rounding of the deviations."""
    X, b, z, _ = exact_data(3, np.float64, 0.5, 0.0)
    Y = X + 1e6 * SCALES.max()
    ref = dfairpca.FairPCA(3).fit(X, sensitive_features=z)
    got = dfairpca.FairPCA(3, compute_dtype="float32").fit(Y, sensitive_features=z)
    assert np.radians(oracle.max_angle_deg(ref.components_.T, got.components_.T)) < TOL[np.float32]
