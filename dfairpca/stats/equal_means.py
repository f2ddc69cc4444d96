"""Whether the groups of a protected attribute share one mean in a representation, and how
far apart their means can be, from additive statistics alone.

A representation Y (n x k, the output of a fitted model's ``transform``) reduced by one pass
of :class:`~dfairpca.stats.moments.Moments` with the groups of an attribute and their
scatters (``group_scatter=True``) holds every group's count ``n_g``, its deviation
``mean_g - mean`` and its scatter about its own mean: per group a k x k matrix, whatever n.
That is all the two answers below need, so neither reads the rows again.

**The test** of equal group means is Johansen's (1980) multivariate Welch-James test, which
does not assume the groups share a covariance: with ``V_g = S_g / n_g`` (S_g the group's
covariance, ddof 1), ``W_g = V_g^-1``, ``W = sum W_g`` and ``m* = W^-1 sum W_g m_g``,

    T = sum_g (m_g - m*)^T W_g (m_g - m*),
    A = sum_g [tr((I - W^-1 W_g)^2) + tr(I - W^-1 W_g)^2] / (2 (n_g - 1)),

and ``T / c`` is approximately F(f1, f2) with ``f1 = k (G - 1)``, ``c = f1 + 2A - 6A / (f1 +
2)`` and ``f2 = f1 (f1 + 2) / (3A)``.  For one component it is Welch's (1951) ANOVA, and for
two groups of one component Welch's t test.  The pooled-covariance tests (Hotelling's T²,
Wilks' lambda) reject far too often when a small group has its own spread (the multivariate
Behrens-Fisher problem), which is exactly a minority's case.

Johansen's F approximation needs many rows per component: with fewer than about
:data:`ROWS_PER_DIRECTION` (10) rows of the smallest group per component it rejects too often
(measured: 7% to 13% at 3 to 5 rows per component).  Where the smallest group has fewer, the
test runs on the leading ``(n_min - 1) // 10`` directions (at least one) of the pooled
within-group scatter (which, for normal rows, is independent of the groups' means, so
choosing them does not bias the test), and is combined (Bonferroni: twice the smaller
p-value) with :func:`componentwise_p`, the Welch tests of every component, so that a gap
in any component still counts; :attr:`GroupMeanTest.note` says so.  A group of one row has
no spread to estimate: it is left out of the test, and said so.

**The bound.**  ``max_mean_gap_sd`` is the largest ``|mean_gj - mean_j| / sd_j`` over groups g
and components j.  Its population counterpart, with the overall mean weighting the groups by
their shares ``pi_h = n_h / n`` of these rows, is the largest of the contrasts ``theta_gj =
mu_gj - sum_h pi_h mu_hj`` divided by ``sd_j``.  Each contrast gets a Welch interval (its
standard error from the groups' own variances, Welch-Satterthwaite degrees of freedom) at the
Sidak level ``1 - (1 - alpha)^(1/C)``, C the contrasts (k per group, k in all for two groups,
whose two contrasts per component are proportional), so that all C intervals hold together
with probability at least 1 - alpha.  On that event the largest ``|theta_gj|`` lies between
the largest lower end and the largest upper end of the intervals: those are
:attr:`GroupMeanTest.max_mean_gap_sd_lower` and ``_upper``.  ``sd_j`` (ddof 0, all rows) is
taken as known: its relative error, about ``1 / sqrt(2 n)``, is 2% at 1,000 rows.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .moments import Moments
from ..errors import InvalidInputError

# Deferred imports: scipy (heavy or optional) is imported in the functions that use it, so that
# importing this module stays light.

__all__ = ["GroupMeanTest", "group_mean_test", "welch_james", "gap_bounds", "componentwise_p", "verdict",
           "RANK_TOLERANCE", "ROWS_PER_DIRECTION", "VERDICTS"]

#: a direction of the representation whose variance is below this fraction of the largest
#: is constant up to rounding (a float32 transform holds about 7 digits, so a variance of
#: relative size 1e-14 is its rounding): it is left out of the test and of the gap, which
#: would otherwise divide rounding by rounding
RANK_TOLERANCE = 1e-12
#: rows of the smallest group per direction Johansen's test is run on: its F approximation
#: keeps the 5% level at 10 (measured, normal rows, a small group with twice the spread:
#: 4.6% at 20 directions, 5.0% at 50 and 100) and not at 3 to 5 (7% to 13%)
ROWS_PER_DIRECTION = 10
#: the verdicts of :func:`verdict`, in words
VERDICTS = ("fair", "not fair", "inconclusive")


@dataclass(frozen=True)
class GroupMeanTest:
    """What the test and the bound found for one attribute.

    Attributes
    ----------
    groups : int
        Groups present (with at least one row).
    max_mean_gap_sd : float
        The largest ``|mean_gj - mean_j| / sd_j`` over groups g and components j, sd the
        standard deviation over all rows (ddof 0, as ``numpy.std``); components of no
        variance (up to :data:`RANK_TOLERANCE`) are left out.
    max_mean_gap_sd_lower, max_mean_gap_sd_upper : float
        Simultaneous (1 - alpha) confidence bounds of the population's largest gap in the
        same units (see the module's text); the upper one is infinite where a group has
        one row (its variance is unknown), both NaN with fewer than two groups.
    p_value : float
        Of Johansen's test that every group has the same mean vector; NaN when there is
        nothing to test (see ``note``).
    statistic : float
        Johansen's T.
    f_statistic, df1, df2 : float
        ``T / c`` and the degrees of freedom of its F approximation.
    dimension : int
        Components (directions) tested.
    groups_tested : int
        Groups in the test (those of two rows or more).
    note : str
        What the test could not use, and why ("" when it used everything).
    limited : bool
        Whether the p-value is NaN, or a group was left out, or the smallest group has no
        more rows than there are components (the cases a report warns of; running on
        fewer directions for the F approximation's sake alone is not one).
    """

    groups: int
    max_mean_gap_sd: float
    p_value: float
    max_mean_gap_sd_lower: float = float("nan")
    max_mean_gap_sd_upper: float = float("nan")
    statistic: float = float("nan")
    f_statistic: float = float("nan")
    df1: float = float("nan")
    df2: float = float("nan")
    dimension: int = 0
    groups_tested: int = 0
    note: str = ""
    limited: bool = False


def welch_james(counts, means, covariances):
    """Johansen's (1980) heteroscedastic test that G groups share one mean vector.

    Parameters
    ----------
    counts : array of shape (G,)
        Rows per group, each at least k + 1 (so that every covariance is invertible).
    means : array of shape (..., G, k)
        The groups' means (any common shift: the test is invariant to it); leading
        dimensions are independent problems (e.g. the trials of a simulation).
    covariances : array of shape (..., G, k, k)
        The groups' covariances (ddof 1), positive definite.

    Returns
    -------
    p_value, statistic, f_statistic, f1, f2 : float or arrays of the leading shape
        The p-value of ``F = T / c`` under F(f1, f2), Johansen's T, F and the degrees of
        freedom.
    """
    from scipy import stats

    n = np.asarray(counts, dtype=np.float64)
    M = np.asarray(means, dtype=np.float64)
    S = np.asarray(covariances, dtype=np.float64)
    G, k = M.shape[-2:]
    Wg = np.linalg.inv(S / n[:, None, None])  # the groups' weights, (..., G, k, k)
    W = Wg.sum(axis=-3)
    centre = np.linalg.solve(W, np.einsum("...gij,...gj->...i", Wg, M)[..., None])[..., 0]
    E = M - centre[..., None, :]
    T = np.einsum("...gi,...gij,...gj->...", E, Wg, E)
    # I - W^-1 W_g for every group
    R = np.eye(k) - np.linalg.solve(W[..., None, :, :], Wg)
    tr = np.trace(R, axis1=-2, axis2=-1)
    tr2 = np.einsum("...gij,...gji->...g", R, R)
    A = np.sum((tr2 + tr * tr) / (2.0 * (n - 1.0)), axis=-1)
    f1 = float(k * (G - 1))
    c = f1 + 2.0 * A - 6.0 * A / (f1 + 2.0)
    with np.errstate(divide="ignore"):
        f2 = f1 * (f1 + 2.0) / (3.0 * A)
    F = np.maximum(T, 0.0) / c
    # A is 0 only for groups of infinite rows: then T is chi-square with f1 degrees
    p = np.where(np.isfinite(f2), stats.f.sf(F, f1, np.where(np.isfinite(f2), f2, 1.0)), stats.chi2.sf(F * f1, f1))
    if np.ndim(p) == 0:
        return float(p), float(T), float(F), f1, float(f2)
    return p, T, F, f1, f2


def gap_bounds(counts, deviation, variances, sd, alpha: float):
    """Simultaneous (1 - alpha) bounds of the largest ``|theta_gj| / sd_j`` (see the
    module's text), from every group's count, deviation from the overall mean and
    per-component variance.

    Parameters
    ----------
    counts : array of shape (G,)
        Rows per group (G >= 2, every count >= 1).
    deviation : array of shape (..., G, k)
        ``mean_g - mean`` (the overall mean weighting the groups by ``counts``); leading
        dimensions are independent problems.
    variances : array of shape (..., G, k)
        Every group's variance per component (ddof 1; anything for a group of one row).
    sd : array of shape (..., k)
        The units of the gap (positive).
    alpha : float
        1 minus the simultaneous confidence level.

    Returns
    -------
    lower, upper : float or arrays of the leading shape
        The bounds; upper is infinite where a group of one row takes part.
    """
    from scipy import stats

    D = np.asarray(deviation, dtype=np.float64)
    var, df, contrasts = _contrasts(counts, D, variances)
    level = -np.expm1(np.log1p(-alpha) / contrasts)  # Sidak: 1 - (1 - alpha)^(1/C), exact
    usable = (var > 0) & np.isfinite(var)
    q = stats.t.isf(level / 2.0, np.where(usable, df, 1.0))
    half = np.where(usable, q * np.sqrt(np.where(usable, var, 0.0)), np.where(np.isinf(var), np.inf, 0.0))
    units = np.asarray(sd, dtype=np.float64)[..., None, :]
    gap, spread = np.abs(D) / units, half / units
    lower = np.max(np.maximum(gap - spread, 0.0), axis=(-2, -1))
    upper = np.max(gap + spread, axis=(-2, -1))
    if np.ndim(lower) == 0:
        return float(lower), float(upper)
    return lower, upper


def componentwise_p(counts, deviation, variances):
    """The p-value of the hypothesis that every contrast ``theta_gj`` is 0, from the
    smallest of their Welch tests' p-values, Sidak-adjusted over the C contrasts:
    ``1 - (1 - p_min)^C`` (valid for any correlation of the contrasts' normal statistics,
    Sidak 1967).  Its rejections at alpha are where :func:`gap_bounds`' lower bound is
    above 0.  Arguments as :func:`gap_bounds`'; NaN where a group of one row takes part.
    """
    from scipy import stats

    D = np.asarray(deviation, dtype=np.float64)
    var, df, contrasts = _contrasts(counts, D, variances)
    usable = (var > 0) & np.isfinite(var)
    with np.errstate(divide="ignore", invalid="ignore"):
        t = np.where(usable, np.abs(D) / np.sqrt(np.where(usable, var, 1.0)), np.where(D != 0, np.inf, 0.0))
    p = np.where(np.isinf(var), np.nan, 2.0 * stats.t.sf(t, np.where(usable, df, 1.0)))
    smallest = np.min(p, axis=(-2, -1))
    return -np.expm1(contrasts * np.log1p(-smallest))


def _contrasts(counts, D, variances):
    """Per contrast ``theta_gj`` (rows g, columns j of D): the variance of its estimate
    (infinite where a group of one row takes part), its Welch-Satterthwaite degrees of
    freedom, and the number of distinct contrasts."""
    n = np.asarray(counts, dtype=np.float64)
    G, k = D.shape[-2:]
    pi = n / n.sum()
    # coefficients of theta_c = mu_c - sum_h pi_h mu_h on the groups' means: (contrast c, group h)
    a2 = (np.eye(G) - pi[None, :]) ** 2
    with np.errstate(divide="ignore", invalid="ignore"):
        v = np.where(n[:, None] > 1, np.asarray(variances, dtype=np.float64) / n[:, None], np.inf)
        terms = a2[:, :, None] * v[..., None, :, :]  # (..., contrast, group, component)
        terms = np.where(a2[:, :, None] == 0, 0.0, terms)  # a group of no weight adds nothing
        var = terms.sum(axis=-2)  # (..., contrast, component)
        df = var * var / np.sum(terms * terms / np.maximum(n - 1.0, 1.0)[:, None], axis=-2)
    return var, df, k if G == 2 else G * k  # two groups: the two contrasts are proportional


def verdict(lower: float, upper: float, tolerance: float) -> str:
    """"fair" when the upper bound is below ``tolerance``, "not fair" when the lower one is
    above it, else "inconclusive" (also when a bound is NaN)."""
    if upper < tolerance:
        return "fair"
    if lower > tolerance:
        return "not fair"
    return "inconclusive"


def group_mean_test(m: Moments, attribute: int = 0, *, alpha: float = 0.05) -> GroupMeanTest:
    """Johansen's test of equal group means, the largest mean gap and its bounds, from
    statistics.

    Parameters
    ----------
    m : Moments
        Statistics of a representation (one column per component) with the groups of one
        or more attributes and their scatters (``group_scatter=True``); unweighted.
    attribute : int
        Which attribute of ``m`` to test.
    alpha : float, default 0.05
        1 minus the confidence level of the gap's bounds.

    Returns
    -------
    GroupMeanTest
        The gap, its bounds, the p-value and the test's figures.
    """
    a = m.attributes[attribute]
    if a.scatter is None:
        raise InvalidInputError("the test of equal group means needs every group's scatter: compute the "
                                "statistics with group_scatter=True")
    present = np.asarray(a.counts) > 0
    labels = np.asarray(a.categories)[present]
    counts = np.asarray(a.counts, dtype=np.float64)[present]
    D = np.asarray(a.deviation, dtype=np.float64)[present]
    unit = np.ldexp(1.0, 2 * m.scatter_exponent)  # true units, whatever the statistics' exponent
    scatters = np.asarray(a.scatter, dtype=np.float64)[present] * unit
    n, g = float(m.n), int(present.sum())
    T = m.covariance(ddof=0) * n
    var = np.diag(T) / max(n, 1.0)  # ddof 0: the spread of these rows
    live = var > RANK_TOLERANCE * max(float(var.max(initial=0.0)), np.finfo(np.float64).tiny)
    gap = float(np.max(np.abs(D[:, live]) / np.sqrt(var[live]), initial=0.0)) if g else 0.0
    if g < 2:
        return GroupMeanTest(g, gap, float("nan"), limited=True,
                             note=f"{g} group{'s' if g != 1 else ''} present: nothing to compare")
    if not live.any():
        return GroupMeanTest(g, gap, float("nan"), 0.0, 0.0, limited=True,
                             note="every component is constant on these rows")
    # the bounds: every component of non-zero variance, every group
    diag = np.diagonal(scatters, axis1=1, axis2=2)[:, live] / np.maximum(counts - 1.0, 1.0)[:, None]
    lower, upper = gap_bounds(counts, D[:, live], diag, np.sqrt(var[live]), alpha)
    bounds = dict(max_mean_gap_sd_lower=lower, max_mean_gap_sd_upper=upper)

    notes = []
    single = counts < 2
    if single.any():
        notes.append(f"group{'s' if single.sum() > 1 else ''} {_named(labels[single])} of one row "
                     "left out of the test (a group's spread needs two rows; the gap's upper "
                     "bound is infinite)")
    tested = ~single
    G = int(tested.sum())
    if G < 2:
        return GroupMeanTest(g, gap, float("nan"), **bounds, groups_tested=G, limited=True,
                             note="; ".join(notes + ["fewer than two groups of two rows or more: "
                                                     "nothing to test"]))
    nt, Dt, St = counts[tested], D[tested], scatters[tested]
    # the directions of the pooled within-group scatter of non-zero variance, largest first:
    # whitened by it, every group's covariance is well conditioned unless the groups' spreads
    # are wildly apart
    w, V = np.linalg.eigh(St.sum(axis=0))
    w, V = w[::-1], V[:, ::-1]
    keep = w > RANK_TOLERANCE * max(float(w[0]), np.finfo(np.float64).tiny)
    rank = int(keep.sum())
    if rank == 0:
        return GroupMeanTest(g, gap, float("nan"), **bounds, groups_tested=G, limited=True,
                             note="; ".join(notes + ["no group varies within itself: nothing to test"]))
    smallest = int(nt.min())
    dim = min(rank, max(1, (smallest - 1) // ROWS_PER_DIRECTION))
    if dim < rank:
        notes.append(f"group {_named(labels[tested][nt == smallest][:1])} has {smallest} rows: Johansen's "
                     f"test on the leading {dim} of {rank} directions of the within-group scatter "
                     f"(it needs about {ROWS_PER_DIRECTION} rows per direction), combined (Bonferroni) "
                     "with Welch tests of every component")
    B = V[:, :dim] / np.sqrt(w[:dim])
    means = Dt @ B
    covs = np.einsum("ia,gij,jb->gab", B, St, B) / (nt - 1.0)[:, None, None]
    # a group with no spread along a tested direction has no Welch weight there
    own = np.linalg.eigvalsh(covs)
    if not (own[:, 0] > RANK_TOLERANCE * own[:, -1].max()).all():
        flat = labels[tested][~(own[:, 0] > RANK_TOLERANCE * own[:, -1].max())]
        return GroupMeanTest(g, gap, float("nan"), **bounds, dimension=dim, groups_tested=G, limited=True,
                             note="; ".join(notes + [f"group {_named(flat)} does not vary along every "
                                                     "tested direction: its mean's spread is unknown"]))
    p, stat, F, f1, f2 = welch_james(nt, means, covs)
    if dim < rank:  # the components left out are tested one by one
        centred = Dt[:, live] - (nt / nt.sum()) @ Dt[:, live]
        each = componentwise_p(nt, centred, diag[tested])
        p = min(1.0, 2.0 * min(p, float(each)))
    return GroupMeanTest(g, gap, p, **bounds, statistic=stat, f_statistic=F, df1=f1, df2=f2,
                         dimension=dim, groups_tested=G, note="; ".join(notes),
                         limited=bool(single.any()) or smallest <= rank)


def _named(labels) -> str:
    """Group labels for a note: the first few, quoted."""
    shown = ", ".join(repr(x.item() if hasattr(x, "item") else x) for x in list(labels)[:3])
    return shown + (f" and {len(labels) - 3} more" if len(labels) > 3 else "")
