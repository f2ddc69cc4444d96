"""One owner for the fair solve: the exact solve from complete statistics and the matrix-free
one (:mod:`dfairpca.solve._randomized`) both end in a certified :class:`FairSolution`,
which the estimator only maps to its fitted attributes.

Each builder assembles the constraint (the group-mean deviations and the numeric
attributes' covariances, in the fitted feature space), solves, splits the certificate by
attribute and certifies it (:func:`dfairpca.solve._fairness.certify`) before it returns,
so a fit that fails the certificate leaves the estimator as it was.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..base import _solvers
from ..stats._exact import kernel_name
from ..stats.moments import Moments
from ..errors import InvalidInputError
from ._exact import fitted_space
from ._fairness import by_attribute, certify, constraint_of, constraint_violation, fair_components

__all__ = ["FairSolution", "exact_fair_solution", "randomized_fair_solution"]


@dataclass(frozen=True)
class FairSolution:
    """A certified fair PCA solve, exact or matrix-free.

    ``captured`` and ``total`` are ``u^T S u`` of each component and ``trace S`` of the
    operator S (scatter about the mean, or ``X^T X`` without centring, standardised when
    asked) in units of ``4**exponent``; ``n`` rows (or total weight) of mean ``mean``,
    ``rows`` the rows of positive weight of a weighted fit (None otherwise) and ``rank``
    the count that bounds the rank (None: ``n``).  ``violations``: per attribute, the share
    of every constraint vector the components keep; ``standard``: the standard components
    and their variances (true units) for ``tradeoff > 0``, else None.
    """

    components: np.ndarray
    captured: np.ndarray
    total: float
    exponent: int
    scale: np.ndarray | None
    n: float
    mean: np.ndarray
    rows: int | None
    rank: float | None
    statistics: Moments
    kernel: str
    solver: str
    passes: int | None
    basis: np.ndarray
    violations: list
    group_means: list
    max_components: int
    names: list
    standard: tuple[np.ndarray, np.ndarray] | None


def exact_fair_solution(m: Moments, num: np.ndarray, names, limit: int, *, k, center: bool,
                        standardize: bool, equalize, eigen_solver: str, tradeoff: float,
                        estimator: str, constraint: str | None = None) -> FairSolution:
    """Fair PCA from complete statistics m, whose columns ``num`` are numeric protected
    attributes and the others the features; ``limit`` the largest k the attributes allow
    (checked by the caller), ``k`` the ``n_components`` asked for (int, fraction or None),
    ``constraint`` the fairness notion (:func:`dfairpca.solve._fairness.constraint_of`; its
    row mask was the pass's).

    m is read once (:meth:`Moments.problem`); the rest is the fair algebra of
    :mod:`dfairpca.solve._fairness` on its arrays: the constraint's rows and their basis, the
    fair eigenproblem, the certificate."""
    fairness = constraint_of(constraint)
    if equalize is not None and not m.attributes:
        raise InvalidInputError("equalize_covariance equalises the covariances of groups: give the "
                                "protected attribute as group labels, or leave it None")
    problem = m.problem(num)
    S, scale, e = fitted_space(problem, center, standardize)
    C = fairness.rows(problem, names, scale)
    Q = fairness.basis(C)
    largest = min(limit, problem.n_effective)
    U = fair_components(S, Q, problem, scale, largest, k, equalize, eigen_solver, fairness)
    per_group = by_attribute(constraint_violation(U, C), problem)
    certify(per_group, names, problem.categories + [None] * len(num), problem.precision, estimator)
    standard = None
    if tradeoff > 0:
        V = _solvers.pca_components(S, U.shape[0], eigen_solver)
        with np.errstate(over="ignore", under="ignore"):
            standard = (V, np.ldexp(np.sum((V @ S) * V, axis=1) / (problem.n - 1), 2 * e))
    return FairSolution(
        U, np.sum((U @ S) * U, axis=1), np.trace(S), e, scale, problem.n, problem.mean,
        problem.n_rows, problem.n_effective, m, problem.kernel, "covariance_eigh", None, Q, per_group,
        problem.group_means, limit, list(names), standard)


def randomized_fair_solution(fit, names, limit: int, features: np.ndarray, *,
                             estimator: str) -> FairSolution:
    """The certified solution of a matrix-free fit (:class:`dfairpca.solve._randomized.RandomizedFit`)
    of the statistics' columns ``features``; ``limit`` the largest k (checked by the caller)."""
    m = fit.statistics
    q = len(m.numeric)
    categories = [a.categories for a in m.attributes] + [None] * q
    # the constraint rows are float64 sums whatever the products ran in
    certify(fit.violation, names, categories, float(np.finfo(np.float64).eps), estimator)
    standard = None
    if fit.standard_components is not None:
        with np.errstate(over="ignore", under="ignore"):
            standard = (fit.standard_components,
                        np.ldexp(fit.standard_captured / (m.n - 1), 2 * fit.exponent))
    return FairSolution(
        fit.components, fit.captured, fit.total, fit.exponent, fit.scale, m.n, fit.mean, None,
        None, m, kernel_name(m), "randomized", fit.passes, fit.basis, fit.violation,
        [m.group_means(j)[:, features] for j in range(len(m.attributes))], limit, list(names),
        standard)
