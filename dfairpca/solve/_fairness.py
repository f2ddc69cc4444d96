"""What the fair estimators share: the k limit, the constraint vectors, the certificate.

:class:`~dfairpca.FairPCA` and :class:`~dfairpca.FairKernelPCA` (exact and Nyström) remove
``sum(m_r) - p`` directions for p attributes of m_1, ..., m_p groups and one for each of q
numeric attributes; :func:`check_fair_k` is that rule, once.  After every solve the share
of each constraint vector the components keep is measured in float64 and
:func:`certify` refuses a fit above :data:`~dfairpca.base._solvers.FAIRNESS_TOLERANCE`.
"""

from __future__ import annotations

import warnings

import numpy as np

from ..base import _solvers
from ..base._params import Check, is_int, is_real, one_of, outside_stacklevel
from ..stats.moments import Moments
from ._limits import too_large
from ..errors import ConstraintDroppedWarning, InvalidInputError

__all__ = ["CONSTRAINTS", "CONSTRAINT_RULES", "fair_k_limit", "check_fair_k", "certify",
           "set_certificate", "fair_feature_names", "group_constraints", "numeric_constraints",
           "numeric_constraint_rows",
           "covariance_terms", "EQUALIZE_RULES", "LOW_VARIANCE", "equalized_dimensions",
           "low_variance_message"]

#: the fairness notions of Sec. 3.2: equal group means over all rows, or over the y == 1 rows
CONSTRAINTS = ("demographic_parity", "equal_opportunity")
CONSTRAINT_RULES = [one_of(CONSTRAINTS)]


def fair_k_limit(size: int, ms, q: int = 0) -> int:
    """The most fair components ``size`` dimensions hold: ``size - sum(m_r) + p - q`` for
    p attributes of ``ms`` = (m_1, ..., m_p) groups and q numeric attributes."""
    return size - sum(ms) + len(ms) - q


def check_fair_k(k, size: int, ms, q: int = 0, *, basis: str | None = None,
                 fix: str | None = None) -> int:
    """:func:`fair_k_limit`; raise if no fair component exists or the int k exceeds it.

    ``size`` is what the components are made of: X's d features (``basis`` None: the
    linear estimators) or a kernel method's basis, which ``basis`` describes ("n = 200
    fitted rows") and ``fix`` says how to enlarge.  k None asks for the limit.
    """
    limit = fair_k_limit(size, ms, q)
    if limit >= 1 and not (is_int(k) and k > limit):
        return limit
    numeric = [f"{q} numeric attribute(s)"] if q else []
    desc = " and ".join([f"{m} groups" for m in ms] + numeric)
    terms = f"{size} - {sum(ms)} + {len(ms)}{f' - {q}' if q else ''} = {limit}"
    if basis is None:
        if limit < 1:
            raise InvalidInputError(
                f"no fair projection exists: {size} features cannot absorb "
                f"{sum(ms) - len(ms) + q} constraints from groups of sizes "
                f"{list(ms)}{''.join(' and ' + s for s in numeric)}"
            )
        symbols = "d - sum(m) + p - q" if q else "d - sum(m) + p"
        raise too_large(k, f"with {desc} the largest k is {symbols} = {terms}")
    why = f"with {desc} and {basis} the largest k is {terms}; {fix}"
    if limit >= 1:
        raise too_large(limit if k is None else k, why)
    raise InvalidInputError(f"no fair representation exists: {why}")


def stack_constraints(group_rows: np.ndarray, numeric_rows, scale) -> np.ndarray:
    """The constraint vectors (rows) in the fitted feature space, for the exact and the
    matrix-free solve alike: every group's mean deviation, then every numeric attribute's
    covariance with the features (None: there are none), divided by the features'
    ``scale`` when standardised."""
    C = group_rows if numeric_rows is None else np.vstack([group_rows, numeric_rows])
    return C if scale is None else C / scale[None, :]


def violations_by_attribute(U: np.ndarray, C: np.ndarray, m, q: int) -> list:
    """The certificate of components U (k, d) against the constraint rows C, split by
    attribute: one array per attribute of m's (a row per group), then one of one row per
    numeric attribute (q of them), as :func:`certify` takes it."""
    sizes = [a.n_groups for a in m.attributes] + [1] * q
    return list(np.split(_solvers.constraint_violation(U, C), np.cumsum(sizes)[:-1]))


def certify(per_group, names, categories, precision: float, estimator: str,
            fix: str | None = None) -> None:
    """Raise ``ValueError`` if any constraint vector keeps more than ``FAIRNESS_TOLERANCE``
    of itself under the fitted components (``per_group``: one array per attribute, from
    :func:`dfairpca.base._solvers.constraint_violation`), naming it and the fixes.

    ``categories`` holds each attribute's group labels, or None for a numeric attribute
    (one vector: its covariance with the features).  ``fix``: the estimator's own remedy,
    in place of the linear estimators' (compute_dtype, standardize)."""
    worst, where = 0.0, ("", None)
    for name, cats, v in zip(names, categories, per_group):
        if len(v) and v.max() > worst:
            worst = float(v.max())
            where = (name, None if cats is None else cats[int(np.argmax(v))])
    if worst <= _solvers.FAIRNESS_TOLERANCE:
        return
    name, group = where
    if isinstance(group, np.generic):  # 0, not np.int64(0)
        group = group.item()
    dtype_fix = ("compute_dtype='float64' (the products ran in float32), "
                 if precision > np.finfo(np.float64).eps else "")
    fix = fix or f"{dtype_fix}standardize=True if the features differ greatly in scale"
    what = (f"the covariance with {name}" if group is None else
            f"the mean deviation of group {group!r} of {name}")
    drop = f"drop {name} from sensitive_feature_ids" if group is None else f"merge or drop group {group!r}"
    raise InvalidInputError(
        f"{estimator} could not satisfy its fairness constraint: the components keep "
        f"{worst:.2e} of {what} (tolerance "
        f"{_solvers.FAIRNESS_TOLERANCE:g}); the constraint vectors are too close to "
        f"linearly dependent or too different in size for float64. Fit with {fix}, "
        f"or {drop}"
    )


def set_certificate(est, per_group) -> None:
    """Record a certified fit's ``fairness_violation_per_attribute_`` (the worst share per
    attribute) and ``fairness_violation_`` (the worst of all) on ``est``."""
    est.fairness_violation_per_attribute_ = np.array([float(v.max(initial=0.0)) for v in per_group])
    est.fairness_violation_ = float(est.fairness_violation_per_attribute_.max())


def fair_feature_names(est, names) -> np.ndarray:
    """``names`` ("<class>0", ...) with the λ-scaled standard half of a ``tradeoff > 0``
    model named "<class>_standard0", ... (the first k stay the fair ones)."""
    k = est.n_components_
    if len(names) == k:
        return names
    prefix = type(est).__name__.lower()
    return np.asarray([f"{prefix}{i}" for i in range(k)] + [f"{prefix}_standard{i}" for i in range(k)],
                      dtype=object)


def group_constraints(m: Moments, names) -> np.ndarray:
    """The constraint matrix (rows ``n_g (mean_g - mean)``), with the rows of groups whose
    mean is the overall mean to float64 rounding set to 0, with a warning for each."""
    C = m.constraint_matrix()
    if not m.attributes:
        return C
    counts = np.concatenate([a.counts for a in m.attributes]).astype(np.float64)
    floor = m.deviation_floor()
    # a deviation is rounding only if it is within the rounding bound in every feature
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        # (weighted counts may be below 1: divide by the count itself wherever it is not 0)
        dev = np.abs(C) / np.where(counts > 0, counts, 1.0)[:, None]
    zero = (counts > 0) & np.all(dev <= floor[None, :], axis=1)
    if zero.any():
        start = 0
        for name, a in zip(names, m.attributes):
            hit = np.flatnonzero(zero[start : start + a.n_groups])
            start += a.n_groups
            if hit.size:
                labels = ", ".join(str(a.categories[i]) for i in hit)
                word = "group" if hit.size == 1 else "groups"
                warnings.warn(
                    f"{word} {labels} of {name}: the mean of each equals the overall mean to "
                    "float64 rounding in every feature (within 2 n eps of the feature's root "
                    "mean square, the rounding bound of means of these rows), so they impose "
                    "no constraint and none is kept for them",
                    ConstraintDroppedWarning, stacklevel=outside_stacklevel(),
                )
        C[zero] = 0.0
    return C


def numeric_constraints(m: Moments, num: np.ndarray, keep: np.ndarray, names) -> np.ndarray:
    """Rows ``sum_i (z_i - mean z)(x_i - mean x)`` (in the scatter's units) of the numeric
    attributes z (columns ``num`` of m) against the features (``keep``), checked by
    :func:`numeric_constraint_rows`."""
    S = m.full_scatter()
    return numeric_constraint_rows(S[np.ix_(num, keep)], np.diagonal(S)[num],
                                   float(np.trace(S[np.ix_(keep, keep)])), m.mean[num], m.n,
                                   m.scatter_exponent, m.precision, names)


def numeric_constraint_rows(C, zz, ff: float, means, n: float, exponent: int, precision: float,
                            names) -> np.ndarray:
    """The numeric attributes' constraint rows C (their cross sums with the features, in
    stored units ``true * 4**-exponent``), checked against rounding: ``zz`` are the
    attributes' own sums of squares, ``ff`` the features' (the scatter's trace), ``means``
    the attributes' means, ``precision`` the eps of the products.

    A row below the rounding of such a sum (at most ``2 n eps |z - mean z| |X - mean X|``
    for products in the statistics' precision eps, by Cauchy-Schwarz) is set to 0 with a
    warning: that attribute is uncorrelated with the features to rounding and constrains
    nothing.  A constant attribute (spread below the rounding of its mean) is an error.
    """
    C = np.array(C, dtype=np.float64)
    zz = np.maximum(np.asarray(zz, np.float64), 0.0)
    ff = max(float(ff), 0.0)
    eps = float(np.finfo(np.float64).eps)
    spread = np.ldexp(np.sqrt(zz / max(n, 1)), exponent)
    for j, name in enumerate(names):
        if spread[j] <= 2 * n * eps * abs(means[j]) or zz[j] == 0:
            raise InvalidInputError(
                f"{name} is constant over the rows fitted, so it tells no one apart; drop it "
                "from sensitive_feature_ids"
            )
    floor = 2.0 * n * precision * np.sqrt(zz * ff)
    zero = _solvers.row_norms(C) <= floor
    for j in np.flatnonzero(zero).tolist():
        warnings.warn(
            f"{names[j]}: its covariance with the features is float64 rounding (below "
            f"{floor[j]:.2e} in the scatter's units), so it imposes no constraint and none is kept",
            ConstraintDroppedWarning, stacklevel=outside_stacklevel(),
        )
    C[zero] = 0.0
    return C


#: the share of the variance under which a fair fit warns (:func:`low_variance_message`)
LOW_VARIANCE = 0.05


def equalized_dimensions(equalize, k: int, d: int) -> int:
    """Fair PCA-S's l: the directions of the fair subspace it searches, for
    ``equalize_covariance`` ``equalize`` (an int is l, a fraction f gives ``max(k, floor(f d))``)."""
    return int(equalize) if is_int(equalize) else max(k, int(np.floor(equalize * d)))


def low_variance_message(kept: float, k: int, d: int, r: int, equalize) -> str | None:
    """Why a fair model of ``k`` components over ``d`` features, with ``r`` constraints,
    keeps only ``kept`` (under :data:`LOW_VARIANCE`) of the variance; None if it keeps more.

    Fair PCA-S with l below the fair subspace's dimension: l is what holds it down (the
    directions along which the covariances differ least carry little variance); otherwise
    k, or constraints along the directions of most variance."""
    if not kept < LOW_VARIANCE:
        return None
    head = f"the fair model keeps {100 * kept:.2g}% of the variance (under {LOW_VARIANCE:.0%})"
    if equalize is not None and (l := equalized_dimensions(equalize, k, d)) < d - r:
        return (f"{head}: Fair PCA-S (equalize_covariance={equalize!r}) searches only l = {l:,} "
                f"of the fair subspace's {d - r:,} directions, those along which the groups' "
                "covariances differ least, and they carry little variance; a larger "
                f"equalize_covariance (up to l = {d - r:,}) keeps more, None fits plain fair PCA")
    return (f"{head}: its k = {k:,} directions of d = {d:,} keep little once the {r:,} "
            "constraint direction(s) are removed (the groups differ along the directions of "
            "most variance); a larger k keeps more")


def covariance_terms(m: Moments, scale, k: int, r: int,
                     equalize) -> tuple[list | None, int | None]:
    """(cov_diffs, l) for Fair PCA-S (``equalize``: ``equalize_covariance``), or (None,
    None) where it is plain fair PCA: see :func:`dfairpca.base._solvers.equalizing_basis`."""
    if equalize is None:
        return None, None
    d = m.n_features
    l = equalized_dimensions(equalize, k, d)
    if l >= d - r:  # the whole fair subspace: plain fair PCA (the paper's "S(1.0)")
        return None, None
    if not m.has_group_scatter:
        raise InvalidInputError(
            "these statistics hold no per-group scatter matrices; fit with "
            "equalize_covariance set so that the pass accumulates them"
        )
    inv = 1.0 if scale is None else 1.0 / np.outer(scale, scale)
    covs = []  # per attribute: [(n_g, Sigma_g)] of the groups with two or more rows
    for a in m.attributes:
        assert a.scatter is not None  # has_group_scatter: every attribute has its scatters
        covs.append([(c, a.scatter[g] / (c - 1) * inv) for g, c in enumerate(a.counts) if c > 1])
    if len(covs) == 1 and len(covs[0]) == 2:
        return [(1.0, covs[0][0][1] - covs[0][1][1])], l
    diffs = []
    for groups in covs:
        n = sum(c for c, _ in groups)
        pooled = sum(c / n * cov for c, cov in groups)
        diffs += [(c / n, cov - pooled) for c, cov in groups]
    return diffs, l


def _check_equalize(est, e) -> None:
    """``equalize_covariance``: None, a fraction in (0, 1] or an int l >= an int k, and
    not with a fraction ``n_components`` (l depends on k)."""
    if e is None:
        return
    k = est.n_components
    whole = is_int(k)
    if not is_real(e):
        raise InvalidInputError(f"equalize_covariance must be None, a fraction in (0, 1] or an int; got {e!r}")
    if is_int(e):
        if whole and e < k:
            raise InvalidInputError(
                f"equalize_covariance={e} directions cannot hold n_components={k}; pass "
                "l >= k or a fraction in (0, 1]"
            )
    elif not 0.0 < float(e) <= 1.0:
        raise InvalidInputError(f"equalize_covariance as a fraction must be in (0, 1]; got {e!r}")
    if k is not None and not whole:
        raise InvalidInputError(
            f"n_components={k} (a fraction of the variance) cannot be combined with "
            "equalize_covariance, whose l depends on k: pass an int k"
        )


EQUALIZE_RULES = [Check(_check_equalize)]
