"""The fair PCA algebra, which the fair estimators share: the k limit, the constraint vectors
and their orthonormal basis, the certificate, Fair PCA-S's equalising basis and the fair
eigenproblem.

Fair PCA (Kleindessner et al. 2023, Alg. 1/2, Sec. 3.5) maximises ``trace(U^T S U)`` over
orthonormal U subject to ``Z^T X U = 0``.  The paper builds an explicit basis R of the
nullspace of ``Z^T X`` (d x (d - r)) and solves ``R^T S R``.  Here R is never formed: with
Q an orthonormal basis of the r constraint directions (the group-mean deviations,
:func:`constraint_basis`) and ``P = I - Q Q^T``, the top-k eigenvectors of ``P S P - c Q Q^T``
(c > 0 pushes the constraint directions below every admissible eigenvalue) span the same
subspace ``R Lambda`` (:func:`fair_components`).  A final projection and Rayleigh-Ritz step
make ``Q^T U = 0`` hold to rounding, and :func:`constraint_violation` measures what is left,
in float64, after every solve.


:class:`~dfairpca.FairPCA` and :class:`~dfairpca.FairKernelPCA` (exact and Nyström) remove
``sum(m_r) - p`` directions for p attributes of m_1, ..., m_p groups and one for each of q
numeric attributes; :func:`check_fair_k` is that rule, once.  After every solve the share
of each constraint vector the components keep is measured in float64 and
:func:`certify` refuses a fit above :data:`~dfairpca.solve._fairness.FAIRNESS_TOLERANCE`.
"""

from __future__ import annotations

import warnings

import numpy as np

import scipy.linalg

from ..base import _solvers
from ..base._params import Check, is_int, is_real, one_of, outside_stacklevel
from ..stats.moments import Moments
from ._exact import fraction_to_k
from ._limits import too_large
from ..errors import ConstraintDroppedWarning, InvalidInputError

__all__ = ["CONSTRAINTS", "CONSTRAINT_RULES", "fair_k_limit", "check_fair_k", "certify",
           "group_constraints", "numeric_constraints",
           "numeric_constraint_rows",
           "covariance_terms", "EQUALIZE_RULES", "FAIRNESS_TOLERANCE", "constraint_basis",
           "constraint_violation", "equalizing_basis", "fair_constraints", "fair_components",
           "LOW_VARIANCE", "equalized_dimensions", "low_variance_message"]

#: the fairness notions of Sec. 3.2: equal group means over all rows, or over the y == 1 rows
CONSTRAINTS = ("demographic_parity", "equal_opportunity")
CONSTRAINT_RULES = [one_of(CONSTRAINTS)]

#: the largest ``|U^T v| / |v|`` a fitted fair model may leave of any group-mean deviation v
#: (its certificate, :func:`constraint_violation`).  What rounding leaves is far smaller:
#: v is in the span of the constraint basis Q to ``10 max(m, d) sqrt(m) eps`` (the SVD's
#: backward error plus the rank cut of :func:`constraint_basis`, on unit rows) and U is
#: orthogonal to Q to a few eps after its projection and QR, together about 1e-10 at
#: d = 6,400 and m = 40 groups.  1e-8 leaves a hundredfold margin for that, and a
#: projected gap of 1e-8 of the raw gap is far below any sampling error of a group mean.
FAIRNESS_TOLERANCE = 1e-8


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
    return list(np.split(constraint_violation(U, C), np.cumsum(sizes)[:-1]))


def certify(per_group, names, categories, precision: float, estimator: str,
            fix: str | None = None, kept_by: str = "the components keep") -> None:
    """Raise ``ValueError`` if any constraint vector keeps more than ``FAIRNESS_TOLERANCE``
    of itself under the fitted components (``per_group``: one array per attribute, from
    :func:`constraint_violation`), naming it and the fixes.

    ``categories`` holds each attribute's group labels, or None for a numeric attribute
    (one vector: its covariance with the features).  ``fix``: the estimator's own remedy,
    in place of the linear estimators' (compute_dtype, standardize); ``kept_by``: what
    keeps the share, with its verb (an eraser's output, not components)."""
    worst, where = 0.0, ("", None)
    for name, cats, v in zip(names, categories, per_group):
        if len(v) and v.max() > worst:
            worst = float(v.max())
            where = (name, None if cats is None else cats[int(np.argmax(v))])
    if worst <= FAIRNESS_TOLERANCE:
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
        f"{estimator} could not satisfy its fairness constraint: {kept_by} "
        f"{worst:.2e} of {what} (tolerance "
        f"{FAIRNESS_TOLERANCE:g}); the constraint vectors are too close to "
        f"linearly dependent or too different in size for float64. Fit with {fix}, "
        f"or {drop}"
    )


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
    None) where it is plain fair PCA: see :func:`dfairpca.solve._fairness.equalizing_basis`."""
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


def constraint_basis(C: np.ndarray, rtol: float | None = None) -> np.ndarray:
    """Orthonormal basis (d, r) of the row space of C (the constraint directions).

    Zero rows (groups without signal, see ``FairPCA.fit_statistics``) are dropped, and the
    others scaled to unit length: the basis then holds every group's direction to the
    same relative accuracy, however the groups' deviations differ in size (a small
    group's direction is not lost in the rounding of a large one's).  Singular values
    below ``rtol * s_max`` count as rank deficiency, i.e. directions that are
    combinations of the others (default ``10 * max(C.shape) * eps``, the rule of
    ``scipy.linalg.null_space``).
    """
    d = C.shape[1]
    norms = _solvers.row_norms(C)
    C = C[norms > 0] / norms[norms > 0, None]
    if C.shape[0] == 0:
        return np.zeros((d, 0))
    U, s, _ = scipy.linalg.svd(C.T, full_matrices=False)
    if rtol is None:
        rtol = max(C.shape) * np.finfo(np.float64).eps * 10
    r = int(np.sum(s > rtol * s[0]))
    return U[:, :r]


def constraint_violation(U: np.ndarray, C: np.ndarray) -> np.ndarray:
    """Per row v of C: ``|U v| / |v|``, the share of v that the rows of U keep (0 for v = 0).

    U (k, d) has orthonormal rows (the fitted components); the rows of C are group-mean
    deviations (any positive multiples).  In float64, O(k d m).
    """
    C = np.asarray(C, dtype=np.float64)
    norms = _solvers.row_norms(C)
    out = np.zeros(C.shape[0])
    live = norms > 0
    if live.any():
        out[live] = _solvers.row_norms((C[live] / norms[live, None]) @ np.asarray(U, np.float64).T)
    return out


def fair_constraints(m: Moments, mf: Moments, num: np.ndarray, keep: np.ndarray, names,
                     scale) -> np.ndarray:
    """The constraint vectors (rows) in the fitted feature space: every group's mean
    deviation (of ``mf``, the statistics of the feature columns ``keep`` of m), then every
    numeric attribute's (columns ``num`` of m) covariance with the features; ``names``
    name the attributes in that order for the warnings."""
    p = len(mf.attributes)
    groups = group_constraints(mf, names[:p])  # first: its warnings come before the numeric ones'
    numeric = numeric_constraints(m, num, keep, names[p:]) if len(num) else None
    return stack_constraints(groups, numeric, scale)


def fair_components(S, Q, mf: Moments, scale, largest: int, k, equalize,
                    eigen_solver: str) -> np.ndarray:
    """Fair components (k, d) of S outside Q's columns for ``n_components`` k (int,
    fraction or None; None and a fraction consider the ``largest`` allowed), with Fair
    PCA-S's equalising directions for ``equalize_covariance`` (from mf's group scatters)."""
    r = Q.shape[1]
    if k is None or is_int(k):
        k = largest if k is None else k
        terms = covariance_terms(mf, scale, k, r, equalize)
        return _restricted_top(S, Q, k, *terms, solver=eigen_solver)
    U = _restricted_top(S, Q, largest, solver="dense")
    captured = np.sum((U @ S) * U, axis=1)
    return U[: fraction_to_k(captured, np.trace(S), k, "the fair subspace")]


def _restricted_top(S: np.ndarray, Q: np.ndarray, k: int, cov_diffs=None, l=None,
                    solver: str = "dense") -> np.ndarray:
    """Top-k eigenvectors of S restricted to the orthogonal complement of Q's columns.

    Returns (k, d) orthonormal rows U with ``U Q = 0``; equivalent to Alg. 2's ``R Lambda``.
    With ``cov_diffs`` (Fair PCA-S, Sec. 3.6) the search is further restricted to the l
    directions of the complement along which the group covariances differ least, see
    :func:`equalizing_basis`.
    """
    if cov_diffs is not None:
        W = equalizing_basis(cov_diffs, Q, l)
        _, V = _solvers.top_eigh(W.T @ S @ W, k, solver)
        U = W @ V
    else:
        _, U = _solvers.top_eigh(S, k, solver, Q=Q)
    # enforce the constraint to rounding and re-diagonalise (Rayleigh-Ritz on span U)
    U = U - Q @ (Q.T @ U)
    U, _ = np.linalg.qr(U)
    _, G = np.linalg.eigh(U.T @ S @ U)
    return _solvers.flip_signs((U @ G[:, ::-1]).T)


def equalizing_basis(cov_diffs, Q: np.ndarray, l: int) -> np.ndarray:
    """Orthonormal (d, l) basis, orthogonal to Q, where the group covariances agree most.

    ``cov_diffs`` is a list of (weight, D_g) pairs.  With a single ``D = Sigma_0 - Sigma_1``
    (two groups, the paper's Sec. 3.6) these are the eigenvectors of ``R^T D R`` with the l
    smallest |eigenvalues|.  With more groups (``D_g = Sigma_g - Sigma_pooled``) they are the
    l smallest eigenvectors of ``sum_g w_g (R^T D_g R)^2``, i.e. the directions v minimising
    ``sum_g w_g ||R^T D_g R v||^2``; for two groups this is the same subspace as the paper's
    (the sum is proportional to ``(R^T D R)^2``).
    """
    d = Q.shape[0]
    # one power of two for all differences (exact; the order of the eigenvalues is that
    # of c D for any c > 0): they become O(1), so their squares below neither underflow
    # nor overflow and the shift that parks Q's directions is relative
    top = max((float(np.abs(D).max()) for _, D in cov_diffs), default=0.0)
    e = int(np.frexp(top)[1]) if top > 0 else 0
    if len(cov_diffs) == 1:
        (_, D), = cov_diffs
        D = np.ldexp(D, -e)
        big = 2.0 * np.abs(D).sum(1).max() + 1.0  # above every |eigenvalue| of P D P
        w, V = scipy.linalg.eigh(_solvers.deflated(D, Q, big))
        order = np.argsort(np.abs(w), kind="stable")
    else:
        T = np.zeros((d, d))
        for wt, D in cov_diffs:
            A = _solvers.deflated(np.ldexp(D, -e), Q, 0.0)
            T += wt * (A @ A)
        big = 2.0 * np.abs(T).sum(1).max() + 1.0
        w, V = scipy.linalg.eigh(_solvers.deflated(T, Q, big))
        order = np.argsort(w, kind="stable")
    return V[:, order[:l]]
