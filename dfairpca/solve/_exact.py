"""The exact solve: components from complete statistics (``fitted_svd_solver_`` is
"covariance_eigh"), the sibling of the matrix-free :mod:`dfairpca.solve._randomized`.

The one-pass statistics give the d x d matrix whose eigenvectors are wanted
(:func:`fitted_space`); the components are its top eigenvectors for ``n_components`` as an
int, None or a fraction of the variance (scikit-learn's meanings), standard
(:func:`standard_components`) or, by :mod:`dfairpca.solve._fairness`, restricted to the
complement of the fairness constraints.  Every eigensolve is :mod:`dfairpca.base._solvers`'.
"""

from __future__ import annotations

import numbers

import numpy as np
from scipy.special import gammaln

from ..base import _solvers
from ..stats._problem import Problem
from ..errors import InvalidInputError

__all__ = ["fitted_space", "standard_scale", "check_variance", "row_variance", "standard_components",
           "fraction_to_k", "mle_rank", "mle_evidence"]


def fitted_space(problem: Problem, center: bool, standardize: bool):
    """(S, scale, e): the matrix whose eigenvectors we want, in the fitted feature space,
    as ``S * 4**e`` (e is the statistics' ``scatter_exponent``, 0 but for data of
    extreme magnitude; 0 when standardized, which is unit-free), and the true scale, from
    the problem (:meth:`dfairpca.stats.moments.Moments.problem`, which refused too few
    rows and overflowed sums)."""
    e = problem.exponent
    S = problem.scatter
    assert S is not None  # an exact solve's problem is complete
    if not center:
        mu = np.ldexp(problem.mean, -e)  # in the scatter's units
        S = S + problem.n * np.outer(mu, mu)
    scale = None
    if standardize:
        sd, scale = standard_scale(problem.n, problem.mean, problem.diagonal, e)
        S = S / np.outer(sd, sd)
        e = 0
    # the means in the units of S (stored, then standardized); uncentred, S holds them
    mu = np.zeros(len(problem.mean)) if not center else np.ldexp(problem.mean, -problem.exponent)
    if standardize and center:
        mu = mu / sd
    check_variance(np.diagonal(S), problem.n, mu, problem.rows)
    return S, scale, e


def standard_scale(n: float, mean: np.ndarray, sq: np.ndarray, exponent: int = 0):
    """(sd, scale) of ``standardize``: per feature the population standard deviation
    (ddof=0, as StandardScaler divides by) in the stored units of the sums of squares ``sq``
    (``true * 4**-exponent``), and in true units (``scale``, 1 where it is 0).

    A feature whose variance is within the rounding of its mean is constant (as
    StandardScaler's test): left unscaled (sd 1), not divided by noise.
    """
    var = np.maximum(np.asarray(sq, np.float64) / n, 0.0)  # rounding may leave it < 0
    with np.errstate(over="ignore", under="ignore"):
        noise = (2.0 * n * np.finfo(np.float64).eps * np.ldexp(mean, -exponent)) ** 2
    sd = np.sqrt(var)
    sd[var <= noise] = 1.0
    scale = np.ldexp(sd, exponent)
    scale[scale == 0] = 1.0
    return sd, scale


#: the relative variance below which a feature counts as having none: its variance (its
#: diagonal entry of the centred scatter) over its raw sum of squares (that entry plus
#: n mean**2).  Equal rows leave a scatter of rounding only: their means round by a few eps
#: relative, so that ratio is at most a small multiple of eps**2 (measured over numpy and
#: Dask passes of 400 random repeated rows, weighted or not, float32 and float64, offsets
#: 1e-200 to 1e200, up to 4 million rows: under 1e-13 * eps**2 in all).  (64 eps)**2 leaves
#: that a wide margin while a feature whose spread is 1e-13 of its magnitude (a thousand
#: ulps and more) is still data: the spread the format can hold, not rounding.  Per
#: feature, so that a huge constant column (a timestamp of 1.7e18) hides no other's.
ZERO_VARIANCE_RTOL = (64 * float(np.finfo(np.float64).eps)) ** 2


def check_variance(diagonal, n: float, mean, rows: int | None = None) -> None:
    """Refuse data whose variance is zero within rounding in every feature: no direction
    holds any of it, and every explained variance ratio would be 0 / 0, or rounding noise
    over rounding noise (arbitrary components, a ratio of 1).

    ``diagonal`` is the fitted operator's diagonal and ``mean`` the means in its units
    (zeros where the operator is uncentred: it then holds the means itself); ``rows``
    counts the rows (n is their total weight when weighted).  A feature's variance counts
    as zero when it is at most :data:`ZERO_VARIANCE_RTOL` of its raw sum of squares
    ``diagonal + n mean**2``.

    All rows equal is the cause; all of them zero (``mean`` zero too) is also what a store
    read as fill values looks like, which the message says.
    """
    diagonal = np.asarray(diagonal, np.float64)
    with np.errstate(over="ignore", under="ignore", invalid="ignore", divide="ignore"):
        # as root mean squares, sd > sqrt(rtol) * hypot(sd, mean): the same test without
        # the square of a mean near 1e154 and above (n mean**2 overflows to inf, and data
        # whose spread is 1e-7 of such a magnitude was called equal rows)
        sd = np.sqrt(diagonal / n)
        if np.any(sd > np.sqrt(ZERO_VARIANCE_RTOL) * np.hypot(sd, np.asarray(mean, np.float64))):
            return
    total = float(diagonal.sum())
    alike = "zero" if not np.any(mean) and total == 0 else "equal"
    within = "" if total == 0 else " within rounding"
    count = int(n) if rows is None else int(rows)
    what = (f"its one row of positive weight is {'zero' if alike == 'zero' else 'all there is'}"
            if count == 1 else f"all its {count:,} rows are {alike}{within}")
    raise InvalidInputError(
        f"X has zero total variance: {what}, so there is no "
        "direction to fit; check the data (a Zarr store whose chunks are absent, read with "
        "missing_chunks='fill', is its fill value throughout)"
    )


def row_variance(X) -> None:
    """:func:`check_variance` of the rows of X (in memory), about their float64 mean with
    one correction sum (the two-pass mean: equal rows give a total of exactly 0 or of
    rounding)."""
    X = np.asarray(X, dtype=np.float64)
    # an exact power of two that brings the largest magnitude near 1: the squares of
    # deviations beyond about 1e154 overflow (the test is scale-free)
    top = float(np.abs(X).max(initial=0.0))
    if np.isfinite(top) and top > 0:
        X = np.ldexp(X, -int(np.frexp(top)[1]))
    mean = X.mean(axis=0)
    mean += (X - mean).mean(axis=0)
    check_variance(np.square(X - mean).sum(axis=0), X.shape[0], mean)


def standard_components(S: np.ndarray, n: float, k, eigen_solver: str, rows=None) -> np.ndarray:
    """Components (k, d) of standard PCA of S for ``n_components`` k (int, fraction,
    "mle" or None, scikit-learn's meanings) from n rows (weighted rows: n is their total
    weight and ``rows`` the rows, which bound the rank)."""
    rank = min(n if rows is None else rows, S.shape[0])
    if k is None:
        return _solvers.pca_components(S, rank, eigen_solver)
    if isinstance(k, numbers.Integral):
        return _solvers.pca_components(S, int(k), eigen_solver)
    w, V = _solvers.top_eigh(S, rank, "dense")
    k = mle_rank(w, n) if k == "mle" else fraction_to_k(w, np.trace(S), k, "the data")
    return _solvers.flip_signs(V[:, :k].T)


def fraction_to_k(variances, total: float, fraction: float, where: str) -> int:
    """The smallest k whose first k ``variances`` (descending) exceed ``fraction`` of
    ``total``, scikit-learn's rule (``searchsorted(cumsum(ratio), fraction, "right") + 1``);
    ValueError if all of them do not."""
    cumulative = np.cumsum(np.asarray(variances) / total)
    if not len(cumulative) or cumulative[-1] <= fraction:
        held = float(cumulative[-1]) if len(cumulative) else 0.0
        raise InvalidInputError(
            f"n_components={fraction}: {where} holds {held:.2%} of the variance, not more than "
            f"{fraction:.2%}; pass a smaller fraction or an int"
        )
    return int(np.searchsorted(cumulative, fraction, side="right")) + 1


def mle_rank(spectrum, n: float) -> int:
    """Minka's choice of k ("Automatic choice of dimensionality for PCA", NIPS 2000): the
    rank 1 <= k < d maximising the Laplace approximation of the evidence of the
    probabilistic PCA model with k components, given the d covariance eigenvalues
    ``spectrum`` (descending; any common scale: it adds the same to every k) of n rows.

    The formula scikit-learn's ``n_components="mle"`` evaluates, with its floors (a
    vanishing k-th eigenvalue rules k out; the noise variance is at least float64's eps),
    so that both choose the same k; its term over pairs of eigenvalues is summed here in
    O(d^2) for all k together (prefix sums over the pairs), not O(d^2) per k.
    """
    if len(spectrum) < 2:
        return 1
    return int(np.argmax(mle_evidence(spectrum, n))) + 1


def mle_evidence(spectrum, n: float) -> np.ndarray:
    """The log evidence :func:`mle_rank` maximises, for k = 1, ..., d - 1 (-inf where a
    k is ruled out)."""
    lam = np.asarray(spectrum, dtype=np.float64)
    d = lam.shape[0]
    ranks = np.arange(1, d)  # every candidate k
    tail = np.cumsum(lam[::-1])[::-1]  # tail[k] = sum of lam[k:]
    v = np.maximum(np.finfo(np.float64).eps, tail[ranks] / (d - ranks))  # noise variance
    # prior on the orthonormal frame: sum over i <= k of log Gamma((d - i + 1)/2) - ...
    i = np.arange(1, d)
    pu = -ranks * np.log(2.0) + np.cumsum(gammaln((d - i + 1) / 2.0) - np.log(np.pi) * (d - i + 1) / 2.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        pl = -np.cumsum(np.log(lam[:-1])) * n / 2.0
        pv = -np.log(v) * n * (d - ranks) / 2.0
        m = d * ranks - ranks * (ranks + 1.0) / 2.0
        pp = np.log(2.0 * np.pi) * (m + ranks) / 2.0
        # the Hessian's determinant, over the pairs i < k, j > i of eigenvalues, where an
        # eigenvalue of index >= k counts as the noise variance v:
        #   both below k:  log((lam_i - lam_j) (1/lam_j - 1/lam_i)), a prefix sum over j
        #   j at or past k: log(lam_i - lam_j) + log(1/v - 1/lam_i)
        diff = np.log(lam[:, None] - lam[None, :])  # (i, j), used where i < j
        inv = np.log(1.0 / lam[None, :] - 1.0 / lam[:, None])
        upper = np.triu(np.ones((d, d), bool), 1)
        both = np.where(upper, diff + inv, 0.0)
        inner = np.concatenate([[0.0], np.cumsum(both.sum(axis=0))])  # pairs with j < k
        beyond = np.where(upper, diff, 0.0)[:, ::-1].cumsum(axis=1)[:, ::-1]  # sum_{j >= c}
        pa = np.empty(d - 1)
        for k in ranks:
            outer = beyond[:k, k].sum() + (d - k) * np.log(1.0 / v[k - 1] - 1.0 / lam[:k]).sum()
            pairs = k * (d - k) + k * (k - 1) / 2.0
            pa[k - 1] = inner[k] + outer + pairs * np.log(n)
        ll = pu + pl + pv + pp - pa / 2.0 - ranks * np.log(n) / 2.0
    # a vanishing k-th eigenvalue rules k out: scikit-learn's absolute floor, and one
    # relative to the largest, below which an eigenvalue of the d x d covariance is its
    # rounding (it then varied with the chunking, and noise directions were chosen)
    floor = max(1e-15, d * np.finfo(np.float64).eps * max(float(lam[0]), 0.0))
    ll[lam[:-1] < floor] = -np.inf
    return np.where(np.isnan(ll), -np.inf, ll)
