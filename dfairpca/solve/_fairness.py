"""The fair PCA algebra, which the fair estimators share: the fairness constraints
(:class:`FairnessConstraint`, one class per notion, owning its rows, its row mask and which
rows count, for the linear and the kernel solves alike), the certificate, Fair PCA-S's
equalising basis and the fair eigenproblem.

Fair PCA (Kleindessner et al. 2023, Alg. 1/2, Sec. 3.5) maximises ``trace(U^T S U)`` over
orthonormal U subject to ``Z^T X U = 0``.  The paper builds an explicit basis R of the
nullspace of ``Z^T X`` (d x (d - r)) and solves ``R^T S R``.  Here R is never formed: with
Q an orthonormal basis of the r constraint directions (the group-mean deviations,
:func:`constraint_basis`) and ``P = I - Q Q^T`` (:class:`~dfairpca.solve._restricted.Nullspace`),
the top-k eigenvectors of ``P S P - c Q Q^T`` (c > 0 pushes the constraint directions below every admissible eigenvalue) span the same
subspace ``R Lambda`` (:func:`fair_components`).  A final projection and Rayleigh-Ritz step
make ``Q^T U = 0`` hold to rounding, and :func:`constraint_violation` measures what is left,
in float64, after every solve.

:class:`~dfairpca.FairPCA` and :class:`~dfairpca.FairKernelPCA` (exact and Nyström) share
the k limit (:func:`dfairpca.solve._limits.check_fair_k`).  After every solve the share of
each constraint vector the components keep is measured in float64 and :func:`certify`
refuses a fit above :data:`~dfairpca.solve._fairness.FAIRNESS_TOLERANCE`.

Everything here reads the statistics through one :class:`~dfairpca.stats.moments.Problem`
(plain arrays, :meth:`~dfairpca.stats.moments.Moments.problem`); the restricted eigensolve is
:mod:`dfairpca.solve._restricted`'s.
"""

from __future__ import annotations

import warnings

import numpy as np

import scipy.linalg

from ..base._params import Check, is_int, is_real, one_of, outside_stacklevel
from ..inputs._groups import binary_target
from ..stats.moments import Problem
from ._exact import fraction_to_k
from ._restricted import Nullspace, restricted_components
from ..errors import ConstraintDroppedWarning, InvalidInputError

__all__ = ["FairnessConstraint", "DemographicParity", "EqualOpportunity", "CONSTRAINT_KINDS",
           "CONSTRAINTS", "CONSTRAINT_RULES", "constraint_of", "certify", "row_norms", "by_attribute",
           "EQUALIZE_RULES", "FAIRNESS_TOLERANCE", "constraint_basis", "constraint_violation",
           "equalizing_basis", "fair_components", "LOW_VARIANCE", "equalized_dimensions",
           "low_variance_message"]


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


class FairnessConstraint:
    """A fairness notion of Sec. 3.2, the one owner of what it constrains, for the linear
    and the kernel solves alike: which rows it is measured over (:meth:`row_mask`), the
    vectors the components must be orthogonal to (:meth:`rows`, and in a kernel's feature
    space :meth:`kernel_rows`) and which of those count (:meth:`basis`,
    :meth:`kernel_basis`: rows without signal and dependent ones dropped).  Fair PCA-S's
    covariance terms (:meth:`covariance_terms`) equalise the groups' covariances on top of
    any of them.

    Its rows are the group means' deviations over the rows of :meth:`row_mask`: a new
    notion is a subclass with its :attr:`name` and what it changes, listed in
    :data:`CONSTRAINT_KINDS`, and that name where the user picks it (the estimators'
    ``constraint`` and the CLI's ``--constraint``).
    """

    #: the estimators' ``constraint`` value
    name: str
    #: the rows a fit is of, in messages
    rows_word = "rows"

    def row_mask(self, y, n: int) -> np.ndarray | None:
        """The rows the constraint is measured over, as a boolean mask of X's n rows
        (None: all of them); y is the task label fit was given."""
        return None

    # ------------------------------------------------------------ in the feature space
    def rows(self, problem: Problem, names, scale) -> np.ndarray:
        """The constraint vectors (rows) in the fitted feature space, for the exact and the
        matrix-free solve alike: every group's mean deviation, then every numeric attribute's
        covariance with the features, divided by the features' ``scale`` when standardised;
        ``names`` name the attributes in that order for the warnings."""
        p = len(problem.counts)
        C = self._group_rows(problem, names[:p])  # first: its warnings come before the numeric ones'
        if len(problem.numeric_means):
            C = np.vstack([C, self._numeric_rows(problem, names[p:])])
        return C if scale is None else C / scale[None, :]

    def basis(self, C: np.ndarray) -> np.ndarray:
        """Q (d, r), the orthonormal basis of the constraint rows C that counts
        (:func:`constraint_basis`); P = I - Q Q^T (:class:`~dfairpca.solve._restricted.Nullspace`)
        is the fair subspace's projector."""
        return constraint_basis(C) if len(C) else np.zeros((C.shape[1], 0))

    def covariance_terms(self, problem: Problem, scale, k: int, r: int,
                         equalize) -> tuple[list | None, int | None]:
        """Fair PCA-S's covariance constraints, on top of the group means: (cov_diffs, l) for
        ``equalize_covariance`` ``equalize``, or (None, None) where it is plain fair PCA; see
        :func:`equalizing_basis`."""
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

    def _group_rows(self, problem: Problem, names) -> np.ndarray:
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

    def _numeric_rows(self, problem: Problem, names) -> np.ndarray:
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

    # ------------------------------------------------------------ in a kernel's feature space
    def kernel_indicators(self, codes: np.ndarray | None, categories, numeric: np.ndarray,
                          numeric_names) -> np.ndarray:
        """Z of the exact kernel method (n, sum(m_r) - p + q): every attribute's centred
        group indicators without its last group's (:meth:`_centred_onehot`), then the
        centred numeric attributes; the constraint is ``Z^T Kc B = 0``."""
        parts = [] if codes is None else [self._centred_onehot(codes, categories)]
        return np.hstack(parts + [self._centred_numeric(numeric, numeric_names)])

    def kernel_rows(self, Kc: np.ndarray, Z: np.ndarray, categories, names):
        """(Z T, D = Kc Z T, columns): the orthonormal feature-space constraint directions
        that count (:meth:`kernel_basis`) and, per attribute, each group's ``(Kc z_g,
        z_g^T Kc z_g)`` for its certificate (:meth:`_kernel_columns`); ``categories`` per
        attribute, None for a numeric one."""
        ZT, D, C, G = self.kernel_basis(Kc, Z)
        return ZT, D, self._kernel_columns(C, G, Z, Kc, categories, names)

    def kernel_basis(self, Kc: np.ndarray, Z: np.ndarray):
        """(Z T, D = Kc Z T, C = Kc Z, G = Z^T Kc Z): T makes the feature-space constraint
        directions ``Phi Z T`` orthonormal.

        G is their Gram matrix.  Its columns are scaled to a unit diagonal first (every group's
        direction then counts alike, however the groups' deviations differ in size), columns
        of groups without signal (:meth:`_kernel_columns`) are left out, and eigenvalues at or
        below ``10 max(n, q) eps`` times the largest are rounding noise of the Gram product
        (dependent constraints, e.g. two attributes that split the rows alike) and are dropped.
        """
        C = Kc @ Z
        G = Z.T @ C
        G = (G + G.T) / 2
        live = np.flatnonzero(np.diagonal(G) > self._noise_level(Kc) * np.einsum("ij,ij->j", Z, Z))
        if live.size == 0:
            return Z[:, :0], C[:, :0], C, G
        N = 1.0 / np.sqrt(np.diagonal(G)[live])
        w, V = scipy.linalg.eigh(G[np.ix_(live, live)] * np.outer(N, N))
        keep = _kept(w, Z.shape)
        T = N[:, None] * V[:, keep] / np.sqrt(w[keep])
        return Z[:, live] @ T, C[:, live] @ T, C, G


    @staticmethod
    def _noise_level(Kc: np.ndarray) -> float:
        """``z^T Kc z`` below ``level * |z|^2`` is rounding noise of the kernel's entries
        (``level = 10 n eps max|Kc|``): a group whose centred indicator z gives less has the
        overall mean in the kernel's feature space, to the kernel's precision."""
        n = Kc.shape[0]
        return 10 * n * np.finfo(np.float64).eps * (float(np.abs(np.diagonal(Kc)).max()) if n else 0.0)


    def _kernel_columns(self, C, G, Z, Kc, categories, names):
        """Per attribute: ``(Kc z_g, z_g^T Kc z_g)`` for all m groups (the last group's
        centred indicator is minus the sum of the other m - 1 columns of Z), or for a numeric
        attribute (categories None) its one centred column, with those without signal
        (:meth:`_noise_level`) set to zero and a warning naming them."""
        level = self._noise_level(Kc)
        columns, start = [], 0
        for cats, name in zip(categories, names):
            numeric = cats is None
            width = 1 if numeric else len(cats) - 1
            cols = np.arange(start, start + width)
            start += width
            Zb = Z[:, cols]
            Gb = G[np.ix_(cols, cols)]
            if numeric:
                KZ, sq, zsq = C[:, cols].copy(), np.diagonal(Gb).copy(), np.einsum("ij,ij->j", Zb, Zb)
            else:
                KZ = np.hstack([C[:, cols], -C[:, cols].sum(axis=1, keepdims=True)])
                sq = np.append(np.diagonal(Gb), Gb.sum())
                zsq = np.append(np.einsum("ij,ij->j", Zb, Zb), np.square(Zb.sum(axis=1)).sum())
            zero = sq <= level * zsq
            if zero.any():
                what = (f"{name}: its covariance with the kernel's features is rounding" if numeric else
                        f"group(s) {', '.join(str(c) for c in np.asarray(cats)[zero])} of {name}: "
                        "the mean in the kernel's feature space equals the overall mean to rounding")
                warnings.warn(f"{what}, so they impose no constraint and none is kept",
                              ConstraintDroppedWarning, stacklevel=outside_stacklevel())
                KZ[:, zero], sq[zero] = 0.0, 0.0
            columns.append((KZ, sq))
        return columns

    @staticmethod
    def _centred_onehot(codes: np.ndarray, categories) -> np.ndarray:
        """Z_comb of Sec. 3.5 without each attribute's last column, (n, sum(m_r) - p).

        The centred one-hot columns of an attribute sum to zero, so its last column is minus the
        sum of the others: leaving it out keeps the nullspace of ``Z^T Kc`` and makes the
        structural rank deficiency disappear instead of leaving it to rounding.
        """
        cols = []
        for j, cats in enumerate(categories):
            onehot = (codes[:, j][:, None] == np.arange(len(cats) - 1)[None, :]).astype(np.float64)
            cols.append(onehot - onehot.mean(axis=0))
        return np.hstack(cols)

    @staticmethod
    def _centred_numeric(values, names) -> np.ndarray:
        """Centred numeric protected attributes (n, q): the Z columns of the exact method
        (``Z^T Kc B = 0``: the representation is uncorrelated with each); a constant one is an
        error."""
        Z = np.asarray(values, dtype=np.float64)
        for j, name in enumerate(names):
            if Z.shape[0] and np.ptp(Z[:, j]) == 0:
                raise InvalidInputError(f"{name} is constant over the rows fitted, so it tells no one "
                                 "apart; drop it from sensitive_feature_ids")
        return Z - Z.mean(axis=0)


class DemographicParity(FairnessConstraint):
    """Equal group means over all rows."""

    name = "demographic_parity"


class EqualOpportunity(FairnessConstraint):
    """Equal group means over the rows of the positive class (y == 1) only."""

    name = "equal_opportunity"
    rows_word = "rows with y == 1"

    def row_mask(self, y, n: int) -> np.ndarray:
        return binary_target(y, n)


#: the fairness notions, by the name the user picks them with
CONSTRAINT_KINDS = {c.name: c for c in (DemographicParity(), EqualOpportunity())}
#: their names, in that order
CONSTRAINTS = tuple(CONSTRAINT_KINDS)
CONSTRAINT_RULES = [one_of(CONSTRAINTS)]


def constraint_of(name: str | None) -> FairnessConstraint:
    """The fairness constraint of an estimator's ``constraint`` (None: one without that
    parameter, demographic parity)."""
    return CONSTRAINT_KINDS[name or DemographicParity.name]


def _kept(spectrum: np.ndarray, shape) -> np.ndarray:
    """Which values of a spectrum (singular values of unit constraint rows, or eigenvalues
    of their unit-diagonal Gram matrix) are independent directions: above ``10 max(shape)
    eps`` times the largest (``scipy.linalg.null_space``'s rule); the rest are rounding of
    rows that are combinations of the others."""
    return spectrum > 10 * max(shape) * np.finfo(np.float64).eps * max(spectrum.max(), 0.0)


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
    r = int(np.sum(_kept(s, C.shape) if rtol is None else s > rtol * s[0]))
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


def fair_components(S, Q, problem: Problem, scale, largest: int, k, equalize,
                    eigen_solver: str, constraint: FairnessConstraint) -> np.ndarray:
    """Fair components (k, d) of S outside Q's columns for ``n_components`` k (int,
    fraction or None; None and a fraction consider the ``largest`` allowed), with Fair
    PCA-S's equalising directions for ``equalize_covariance`` (from the problem's group
    scatters).

    A fraction takes the smallest k of the fair subspace's spectrum holding it, from one
    dense solve of the ``largest`` (``equalize_covariance`` takes an int k only)."""
    fraction = not (k is None or is_int(k))
    top = largest if k is None or fraction else k
    r = Q.shape[1]
    cov_diffs, l = (None, None) if fraction else constraint.covariance_terms(problem, scale, top, r,
                                                                              equalize)
    within = None if cov_diffs is None else equalizing_basis(cov_diffs, Q, l)
    U = restricted_components(S, Q, top, within, solver="dense" if fraction else eigen_solver)
    if not fraction:
        return U
    captured = np.sum((U @ S) * U, axis=1)
    return U[: fraction_to_k(captured, np.trace(S), k, "the fair subspace")]


def equalizing_basis(cov_diffs, Q: np.ndarray, l: int) -> np.ndarray:
    """Orthonormal (d, l) basis, orthogonal to Q, where the group covariances agree most.

    ``cov_diffs`` is a list of (weight, D_g) pairs.  With a single ``D = Sigma_0 - Sigma_1``
    (two groups, the paper's Sec. 3.6) these are the eigenvectors of ``R^T D R`` with the l
    smallest |eigenvalues|.  With more groups (``D_g = Sigma_g - Sigma_pooled``) they are the
    l smallest eigenvectors of ``sum_g w_g (R^T D_g R)^2``, i.e. the directions v minimising
    ``sum_g w_g ||R^T D_g R v||^2``; for two groups this is the same subspace as the paper's
    (the sum is proportional to ``(R^T D R)^2``).
    """
    d, null = Q.shape[0], Nullspace(Q)
    # one power of two for all differences (exact; the order of the eigenvalues is that
    # of c D for any c > 0): they become O(1), so their squares below neither underflow
    # nor overflow and the shift that parks Q's directions is relative
    top = max((float(np.abs(D).max()) for _, D in cov_diffs), default=0.0)
    e = int(np.frexp(top)[1]) if top > 0 else 0
    if len(cov_diffs) == 1:
        (_, D), = cov_diffs
        D = np.ldexp(D, -e)
        big = 2.0 * np.abs(D).sum(1).max() + 1.0  # above every |eigenvalue| of P D P
        w, V = scipy.linalg.eigh(null.deflate(D, big))
        order = np.argsort(np.abs(w), kind="stable")
    else:
        T = np.zeros((d, d))
        for wt, D in cov_diffs:
            A = null.deflate(np.ldexp(D, -e), 0.0)
            T += wt * (A @ A)
        big = 2.0 * np.abs(T).sum(1).max() + 1.0
        w, V = scipy.linalg.eigh(null.deflate(T, big))
        order = np.argsort(w, kind="stable")
    return V[:, order[:l]]
