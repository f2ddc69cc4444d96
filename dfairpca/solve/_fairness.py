"""The fair PCA algebra, which the fair estimators share: the constraint vectors
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

:class:`~dfairpca.FairPCA` and :class:`~dfairpca.FairKernelPCA` (exact and Nyström) share
the k limit (:func:`dfairpca.solve._limits.check_fair_k`).  After every solve the share of
each constraint vector the components keep is measured in float64 and :func:`certify`
refuses a fit above :data:`~dfairpca.solve._fairness.FAIRNESS_TOLERANCE`.

Everything here reads the statistics through one :class:`~dfairpca.stats._problem.Problem`
(plain arrays, :meth:`~dfairpca.stats.moments.Moments.problem`) and calls the eigensolvers of
:mod:`dfairpca.base._solvers` only for the eigenproblem itself.
"""

from __future__ import annotations

import warnings

import numpy as np

import scipy.linalg

from ..base import _solvers
from ..base._params import Check, is_int, is_real, one_of, outside_stacklevel
from ..stats._problem import Problem
from ._exact import fraction_to_k
from ..errors import ConstraintDroppedWarning, InvalidInputError

__all__ = ["CONSTRAINTS", "CONSTRAINT_RULES", "certify", "row_norms", "by_attribute",
           "group_constraints", "numeric_constraints", "covariance_terms", "EQUALIZE_RULES",
           "FAIRNESS_TOLERANCE", "constraint_basis", "constraint_violation", "equalizing_basis",
           "fair_constraints", "fair_components", "LOW_VARIANCE", "equalized_dimensions",
           "low_variance_message"]

#: the largest ``|U^T U - I|`` entry of the eigensolvers' components, after their
#: projection off Q, that is taken as orthonormal (Householder and Cholesky QR leave a few
#: eps times sqrt(k); a projection that moved U more is re-orthonormalised)
ORTHONORMAL_ATOL = 1e-12

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


def by_attribute(shares: np.ndarray, problem: Problem) -> list:
    """``shares`` (one per constraint row of the problem, e.g. :func:`constraint_violation`'s)
    split by attribute, as :func:`certify` takes them: one array per attribute given as
    labels (a row per group), then one of one row per numeric attribute."""
    sizes = problem.group_sizes + [1] * len(problem.numeric_means)
    return list(np.split(shares, np.cumsum(sizes)[:-1]))


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


def group_constraints(problem: Problem, names) -> np.ndarray:
    """The constraint matrix (rows ``n_g (mean_g - mean)``), with the rows of groups whose
    mean is the overall mean to float64 rounding set to 0, with a warning for each."""
    C = problem.constraint_rows.copy()
    if not problem.counts:
        return C
    counts = np.concatenate(problem.counts).astype(np.float64)
    floor = problem.deviation_floor
    # a deviation is rounding only if it is within the rounding bound in every feature
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        # (weighted counts may be below 1: divide by the count itself wherever it is not 0)
        dev = np.abs(C) / np.where(counts > 0, counts, 1.0)[:, None]
    zero = (counts > 0) & np.all(dev <= floor[None, :], axis=1)
    if zero.any():
        start = 0
        for name, categories in zip(names, problem.categories):
            hit = np.flatnonzero(zero[start : start + len(categories)])
            start += len(categories)
            if hit.size:
                labels = ", ".join(str(categories[i]) for i in hit)
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


def numeric_constraints(problem: Problem, names) -> np.ndarray:
    """The numeric attributes' constraint rows (their cross sums with the features,
    ``sum_i (z_i - mean z)(x_i - mean x)`` in stored units ``true * 4**-exponent``), checked
    against rounding: against the attributes' own sums of squares and the features' (the
    scatter's trace), for products in the statistics' precision.

    A row below the rounding of such a sum (at most ``2 n eps |z - mean z| |X - mean X|``
    for products in the statistics' precision eps, by Cauchy-Schwarz) is set to 0 with a
    warning: that attribute is uncorrelated with the features to rounding and constrains
    nothing.  A constant attribute (spread below the rounding of its mean) is an error.
    """
    n, means = problem.n, problem.numeric_means
    C = np.array(problem.numeric_rows, dtype=np.float64)
    zz = np.maximum(np.asarray(problem.numeric_own, np.float64), 0.0)
    ff = max(float(problem.feature_spread), 0.0)
    eps = float(np.finfo(np.float64).eps)
    spread = np.ldexp(np.sqrt(zz / max(n, 1)), problem.exponent)
    for j, name in enumerate(names):
        if spread[j] <= 2 * n * eps * abs(means[j]) or zz[j] == 0:
            raise InvalidInputError(
                f"{name} is constant over the rows fitted, so it tells no one apart; drop it "
                "from sensitive_feature_ids"
            )
    floor = 2.0 * n * problem.precision * np.sqrt(zz * ff)
    zero = row_norms(C) <= floor
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


def covariance_terms(problem: Problem, scale, k: int, r: int,
                     equalize) -> tuple[list | None, int | None]:
    """(cov_diffs, l) for Fair PCA-S (``equalize``: ``equalize_covariance``), or (None,
    None) where it is plain fair PCA: see :func:`dfairpca.solve._fairness.equalizing_basis`."""
    if equalize is None:
        return None, None
    d = problem.n_features
    l = equalized_dimensions(equalize, k, d)
    if l >= d - r:  # the whole fair subspace: plain fair PCA (the paper's "S(1.0)")
        return None, None
    if problem.group_scatter is None:
        raise InvalidInputError(
            "these statistics hold no per-group scatter matrices; fit with "
            "equalize_covariance set so that the pass accumulates them"
        )
    inv = 1.0 if scale is None else 1.0 / np.outer(scale, scale)
    covs = []  # per attribute: [(n_g, Sigma_g)] of the groups with two or more rows
    for scatter, counts in zip(problem.group_scatter, problem.counts):
        covs.append([(c, scatter[g] / (c - 1) * inv) for g, c in enumerate(counts) if c > 1])
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


def constraint_basis(C: np.ndarray, rtol: float | None = None, rank: int | None = None
                     ) -> np.ndarray:
    """Orthonormal basis (d, r) of the row space of C (the constraint directions).

    Zero rows (groups without signal, see ``FairPCA.fit_statistics``) are dropped, and the
    others scaled to unit length: the basis then holds every group's direction to the
    same relative accuracy, however the groups' deviations differ in size (a small
    group's direction is not lost in the rounding of a large one's).  Singular values
    below ``rtol * s_max`` count as rank deficiency, i.e. directions that are
    combinations of the others (default ``10 * max(C.shape) * eps``, the rule of
    ``scipy.linalg.null_space``).  ``rank``: at most that many directions, the largest
    (a rank counted where rounding cannot pose as a direction, see
    :func:`dfairpca.solve._erasure.erasure_maps`).
    """
    d = C.shape[1]
    norms = row_norms(C)
    C = C[norms > 0] / norms[norms > 0, None]
    if C.shape[0] == 0:
        return np.zeros((d, 0))
    U, s, _ = scipy.linalg.svd(C.T, full_matrices=False)
    if rtol is None:
        rtol = max(C.shape) * np.finfo(np.float64).eps * 10
    r = int(np.sum(s > rtol * s[0]))
    return U[:, : r if rank is None else min(r, rank)]


def constraint_violation(U: np.ndarray, C: np.ndarray) -> np.ndarray:
    """Per row v of C: ``|U v| / |v|``, the share of v that the rows of U keep (0 for v = 0).

    U (k, d) has orthonormal rows (the fitted components); the rows of C are group-mean
    deviations (any positive multiples).  In float64, O(k d m).
    """
    C = np.asarray(C, dtype=np.float64)
    norms = row_norms(C)
    out = np.zeros(C.shape[0])
    live = norms > 0
    if live.any():
        out[live] = row_norms((C[live] / norms[live, None]) @ np.asarray(U, np.float64).T)
    return out


def row_norms(A: np.ndarray) -> np.ndarray:
    """Euclidean norms of the rows of A without underflow or overflow (each row scaled by
    its largest entry first: ``np.linalg.norm`` of a row of 1e-170s is 0), for the
    constraint rows, whose sizes span the data's range, and the shares they keep."""
    A = np.asarray(A, dtype=np.float64)
    top = np.abs(A).max(axis=1) if A.shape[1] else np.zeros(A.shape[0])
    safe = np.where(top > 0, top, 1.0)
    return top * np.linalg.norm(A / safe[:, None], axis=1)


def fair_constraints(problem: Problem, names, scale) -> np.ndarray:
    """The constraint vectors (rows) in the fitted feature space, for the exact and the
    matrix-free solve alike: every group's mean deviation, then every numeric attribute's
    covariance with the features, divided by the features' ``scale`` when standardised;
    ``names`` name the attributes in that order for the warnings."""
    p = len(problem.counts)
    C = group_constraints(problem, names[:p])  # first: its warnings come before the numeric ones'
    if len(problem.numeric_means):
        C = np.vstack([C, numeric_constraints(problem, names[p:])])
    return C if scale is None else C / scale[None, :]


def fair_components(S, Q, problem: Problem, scale, largest: int, k, equalize,
                    eigen_solver: str) -> np.ndarray:
    """Fair components (k, d) of S outside Q's columns for ``n_components`` k (int,
    fraction or None; None and a fraction consider the ``largest`` allowed), with Fair
    PCA-S's equalising directions for ``equalize_covariance`` (from the problem's group
    scatters).

    A fraction takes the smallest k of the fair subspace's spectrum holding it, from one
    dense solve of the ``largest`` (``equalize_covariance`` takes an int k only)."""
    fraction = not (k is None or is_int(k))
    top = largest if k is None or fraction else k
    r = Q.shape[1]
    terms = (None, None) if fraction else covariance_terms(problem, scale, top, r, equalize)
    U = _restricted_top(S, Q, top, *terms, solver="dense" if fraction else eigen_solver)
    if not fraction:
        return U
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
    # enforce the constraint to rounding; where that moved U off orthonormal (a solver
    # that does not project, as LAPACK on the deflated matrix), re-orthonormalise and
    # re-diagonalise (Rayleigh-Ritz on span U): the eigensolvers return Ritz vectors, so
    # an orthonormal U needs neither (at d = 6,400, k = 400 two products of S saved)
    U = U - Q @ (Q.T @ U)
    if np.abs(U.T @ U - np.eye(U.shape[1])).max() > ORTHONORMAL_ATOL:
        U = _solvers.orthonormal(U)
        _, G = np.linalg.eigh(U.T @ S @ U)
        U = U @ G[:, ::-1]
    return _solvers.flip_signs(U.T)


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
