"""Whether the groups of a protected attribute share one mean in a representation, from
additive statistics alone.

A representation Y (n x k, the output of a fitted model's ``transform``) reduced by one pass
of :class:`~dfairpca.stats.moments.Moments` with the groups of an attribute holds every
group's count ``n_g`` and deviation ``mean_g - mean``, and the total scatter T about the
mean.  That is all a one-way MANOVA needs: the between-group scatter is
``B = sum_g n_g (mean_g - mean)(mean_g - mean)^T`` and the pooled within-group scatter is
``W = T - B``, so the test never needs the rows again and runs out of core.

The test is Wilks' lambda, ``det(W) / det(T)``, with Rao's F approximation, which is exact
for two groups (it is then Hotelling's two-sample T²) and for three, and for a single
component (the one-way ANOVA F test).  Its eigenvalues are computed from the m x m matrix
``N^1/2 D T^-1 D^T N^1/2`` (D the deviations, N the counts): near the null (a fair model,
``B`` about 0) they come from the deviations directly, never from a difference of two
nearly equal determinants, so a p-value near 1 is as accurate as one near 0.

Its assumptions are the classical ones (rows independent, a common covariance); with many
rows the central limit theorem makes it valid for any distribution of Y whose covariance
exists, and in particular when the labels are independent of Y its p-values are uniform
(``tests/test_fairness_report.py`` checks that rate over many random labellings).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .moments import Moments

__all__ = ["GroupMeanTest", "group_mean_test", "RANK_TOLERANCE"]

#: a direction of the representation whose variance is below this fraction of the largest
#: is constant up to rounding (a float32 transform holds about 7 digits, so a variance of
#: relative size 1e-14 is its rounding): it is left out of the test and of the gap, which
#: would otherwise divide rounding by rounding
RANK_TOLERANCE = 1e-12


@dataclass(frozen=True)
class GroupMeanTest:
    """What the test found for one attribute.

    Attributes
    ----------
    groups : int
        Groups present (with at least one row).
    max_mean_gap_sd : float
        The largest ``|mean_gj - mean_j| / sd_j`` over groups g and components j, sd the
        standard deviation over all rows (ddof 0, as ``numpy.std``); components of no
        variance (up to :data:`RANK_TOLERANCE`) are left out.
    p_value : float
        Of the hypothesis that every group has the same mean vector; NaN when there is
        nothing to test (see ``note``).
    wilks_lambda : float
        ``det(W) / det(T)`` on the components tested (1: equal means; 0: separated).
    f_statistic, df1, df2 : float
        Rao's F approximation and its degrees of freedom.
    dimension : int
        Components tested (those of non-zero variance).
    note : str
        Why ``p_value`` is NaN ("" when it is not).
    """

    groups: int
    max_mean_gap_sd: float
    p_value: float
    wilks_lambda: float = float("nan")
    f_statistic: float = float("nan")
    df1: float = float("nan")
    df2: float = float("nan")
    dimension: int = 0
    note: str = ""


def group_mean_test(m: Moments, attribute: int = 0) -> GroupMeanTest:
    """Wilks' lambda test of equal group means, and the largest mean gap, from statistics.

    Parameters
    ----------
    m : Moments
        Statistics of a representation (one column per component) with the groups of one
        or more attributes; complete ones (with the scatter), unweighted.
    attribute : int
        Which attribute of ``m`` to test.

    Returns
    -------
    GroupMeanTest
        The gap, the p-value and the test's figures.
    """
    from scipy import stats

    a = m.attributes[attribute]
    present = np.asarray(a.counts) > 0
    counts = np.asarray(a.counts, dtype=np.float64)[present]
    D = np.asarray(a.deviation, dtype=np.float64)[present]
    n, g = float(m.n), int(present.sum())
    # true units, whatever the statistics' exponent; ddof 0: the spread of these rows
    T = m.covariance(ddof=0) * n
    var = np.diag(T) / max(n, 1.0)
    live = var > RANK_TOLERANCE * max(float(var.max(initial=0.0)), np.finfo(np.float64).tiny)
    gap = float(np.max(np.abs(D[:, live]) / np.sqrt(var[live]), initial=0.0)) if g else 0.0
    if g < 2:
        return GroupMeanTest(g, gap, float("nan"),
                             note=f"{g} group{'s' if g != 1 else ''} present: nothing to compare")
    # the directions of T of non-zero variance, where W and B live (a component of zero
    # variance, or two proportional ones, would make T singular)
    t, V = np.linalg.eigh(T)
    keep = t > RANK_TOLERANCE * max(float(t[-1]), np.finfo(np.float64).tiny)
    p = int(keep.sum())
    if p == 0:
        return GroupMeanTest(g, gap, float("nan"), note="every component is constant on these rows")
    # eigenvalues theta of T^-1 B, in [0, 1], from the small m x m form
    A = np.sqrt(counts)[:, None] * (D @ V[:, keep]) / np.sqrt(t[keep])
    theta = np.clip(np.linalg.eigvalsh(A @ A.T), 0.0, 1.0)
    with np.errstate(divide="ignore"):
        neg_log_lambda = float(-np.sum(np.log1p(-theta)))  # -log det(W)/det(T)
    q = g - 1
    # Rao (1951): t = sqrt((p^2 q^2 - 4) / (p^2 + q^2 - 5)), 1 where that is not positive
    r = p * p + q * q - 5
    s = np.sqrt((p * p * q * q - 4) / r) if r > 0 else 1.0
    df1 = float(p * q)
    df2 = float((n - 1 - (p + g) / 2) * s - (p * q - 2) / 2)
    wilks = float(np.exp(-neg_log_lambda))
    if not df2 > 0:
        return GroupMeanTest(g, gap, float("nan"), wilks, dimension=p, df1=df1, df2=df2,
                             note=f"{int(n)} rows are too few to test {p} components in {g} groups")
    # F = (1 - L^(1/s)) / L^(1/s) * df2 / df1, written so that L near 1 loses no digits
    F = float(np.expm1(neg_log_lambda / s) * df2 / df1)
    return GroupMeanTest(g, gap, float(stats.f.sf(F, df1, df2)), wilks, F, df1, df2, p)
