"""How good and how fair a representation is (the measures of the paper's Sec. 5.1).

* :func:`explained_variance_pct`: ``100 trace(U^T A U) / trace(A)``, A the covariance of
  (held-out) data; one pass of :func:`dfairpca.compute_moments` for chunked data.
* :func:`mmd2`: squared maximum mean discrepancy between the groups' representations with a
  Gaussian kernel ``exp(-||a - b||^2 / (2 sigma^2))`` (biased V-statistic, as Lee et al.
  2022), the largest over pairs of groups when there are more than two;
  :func:`mmd_bandwidth` is their bandwidth rule.  O(n^2): on chunked or large data both take
  a uniform random sample of at most ``max_samples`` rows per group (documented default
  2,000, fixed seed).
* :func:`linear_inseparability`: balanced error of a logistic regression that predicts the
  group from the representation (1 - 1/m = m groups linearly indistinguishable, 0 =
  separable).

A downstream classifier's demographic-parity and equal-opportunity gaps (the paper's ΔDP
and ΔEO) are fairlearn's, which also handles intersectional groups and sample weights::

    from fairlearn.metrics import demographic_parity_difference, equal_opportunity_difference
    demographic_parity_difference(y_true, y_pred, sensitive_features=z)   # ΔDP
    equal_opportunity_difference(y_true, y_pred, sensitive_features=z)    # ΔEO
"""

from __future__ import annotations

import numpy as np

__all__ = [
    "explained_variance_pct",
    "mmd2",
    "mmd_bandwidth",
    "linear_inseparability",
]


def _dense(a) -> np.ndarray:
    return np.asarray(a.compute() if hasattr(a, "compute") else a, dtype=np.float64)


def explained_variance_pct(X, components) -> float:
    """Percentage of the (centred) variance of X captured by the rows of ``components``.

    ``components`` is (k, d) with orthonormal rows, e.g. a fitted model's ``components_``.
    X may be numpy, Dask or Zarr; chunked input is reduced in one pass.
    """
    from ._engine import compute_moments
    from ._validation import as_data

    Xa = as_data(X)
    U = np.asarray(components, dtype=np.float64)
    if U.ndim != 2 or U.shape[1] != Xa.shape[1]:
        raise ValueError(f"components must be (k, {Xa.shape[1]}); got {U.shape}")
    A = compute_moments(Xa).scatter
    return float(100.0 * np.sum((U @ A) * U) / np.trace(A))


def _sample_rows(Y, idx, max_samples, rng):
    idx = np.flatnonzero(idx)
    if max_samples is not None and idx.size > max_samples:
        idx = np.sort(rng.choice(idx, max_samples, replace=False))
    return _dense(Y[idx]) if hasattr(Y, "compute") else np.asarray(Y, np.float64)[idx]


def _sq_dists(A, B):
    d = (A * A).sum(1)[:, None] + (B * B).sum(1)[None, :] - 2.0 * A @ B.T
    return np.maximum(d, 0.0)


def mmd_bandwidth(Y, max_samples: int | None = 2000, random_state=0) -> float:
    """Bandwidth rule of Lee et al. (2022): ``sigma = sqrt(median ||y_i - y_j||^2 / 2)``.

    The median is over the distinct pairs i < j of (a sample of) Y, typically the training
    data projected by standard PCA.
    """
    rng = np.random.default_rng(random_state)
    S = _sample_rows(Y, np.ones(Y.shape[0], bool), max_samples, rng)
    D = _sq_dists(S, S)
    iu = np.triu_indices(S.shape[0], k=1)
    return float(np.sqrt(np.median(D[iu]) / 2.0))


def mmd2(Y, groups, sigma: float, max_samples: int | None = 2000, random_state=0) -> float:
    """Squared MMD between the groups of rows of Y (biased V-statistic).

    Parameters
    ----------
    Y : (n, k) representation (numpy or Dask)
    groups : (n,) labels with two or more distinct values; with more than two the largest
        pairwise MMD² is returned (the worst-treated pair, as ΔDP takes max - min)
    sigma : Gaussian kernel bandwidth (see :func:`mmd_bandwidth`)
    max_samples : rows sampled per group when a group is larger (None: use all)
    """
    groups = np.asarray(groups)
    if groups.ndim != 1 or groups.shape[0] != Y.shape[0]:
        raise ValueError(
            f"groups must be 1-D with one label per row of Y ({Y.shape[0]}); got shape "
            f"{groups.shape} (for several attributes pass one combined label per row)"
        )
    cats = np.unique(groups)
    if len(cats) < 2:
        raise ValueError(f"mmd2 compares two or more groups; got {len(cats)} ({cats[:5]})")
    if not sigma > 0:
        raise ValueError(f"sigma must be positive; got {sigma}")
    rng = np.random.default_rng(random_state)
    samples = [_sample_rows(Y, groups == c, max_samples, rng) for c in cats]
    g = 1.0 / (2.0 * sigma**2)
    within = [np.exp(-g * _sq_dists(A, A)).mean() for A in samples]
    worst = 0.0
    for i in range(len(samples)):
        for j in range(i + 1, len(samples)):
            kab = np.exp(-g * _sq_dists(samples[i], samples[j])).mean()
            worst = max(worst, float(within[i] + within[j] - 2.0 * kab))
    return worst


def linear_inseparability(Y_train, g_train, Y_test, g_test, C: float = 1.0) -> float:
    """Balanced error of a logistic regression predicting the group (higher is fairer).

    With m groups the regression is multinomial and chance level is ``1 - 1/m``.
    """
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import balanced_accuracy_score

    clf = LogisticRegression(C=C, max_iter=2000).fit(_dense(Y_train), np.asarray(g_train))
    return float(1.0 - balanced_accuracy_score(np.asarray(g_test), clf.predict(_dense(Y_test))))
