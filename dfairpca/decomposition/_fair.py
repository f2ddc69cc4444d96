"""The estimator :class:`FairPCA`: fair PCA (Kleindessner et al., AISTATS 2023) on numpy,
pandas, xarray, Dask and Zarr arrays.

:class:`~dfairpca.decomposition._pca.PCA`'s sibling on one base
(:class:`dfairpca.decomposition._linear.LinearDecomposition`): it checks the input and its
protected attributes, runs the one-pass statistics with the groups, or the matrix-free passes,
and keeps what the fair solve (:mod:`dfairpca.solve`) found and certified.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Self

import numpy as np
import numpy.typing as npt

from ..base.progress import reported
from ..solve._solution import FairSolution, exact_fair_solution, randomized_fair_solution
from ..solve._fairness import CONSTRAINT_RULES, EQUALIZE_RULES, constraint_of, low_variance_message
from ._base import FairStatisticsEstimator, fit_context, set_certificate
from ._linear import (
    LINEAR_RULES, LinearDecomposition, whitening,
)
from ..base._params import TRADEOFF, is_int, outside_stacklevel
from ..io import register_model_class
from ..solve._limits import check_fair_k, check_rows, known
from ._saved import fair_meta, restore_fair_meta
from ._fair_input import FairInput
from ..inputs._validation import SENSITIVE_IDS
from ..stats.moments import Moments
from ..base._typing import ArrayInput, ColumnIds, PathInput, Seed
from ..errors import LowVarianceWarning

__all__ = ["FairPCA"]


@register_model_class
class FairPCA(LinearDecomposition, FairStatisticsEstimator):
    """Fair PCA (Kleindessner, Donini, Russell & Zafar, AISTATS 2023).

    The best k-dimensional orthonormal projection under which every group of every
    protected attribute has the same mean (Alg. 1 for two groups, Alg. 2 for m groups,
    Sec. 3.5 for several attributes): the top-k eigenvectors of the covariance restricted
    to the orthogonal complement of the group-mean deviations.  With p attributes of
    m_1, ..., m_p groups (and q numeric attributes, see ``sensitive_feature_ids``) at most
    ``d - sum(m_r) + p - q`` components exist.

    Parameters
    ----------
    n_components : int, float in (0, 1) or None, default None
        k; None takes the largest allowed, ``d - sum(m_r) + p - q`` (at most n).  A float
        keeps the smallest k whose ``explained_variance_ratio_`` (shares of the *total*
        variance, as scikit-learn's) sums to more than it; a fraction the fair subspace
        cannot hold is an error naming what it holds.  Not with ``equalize_covariance``.
    sensitive_feature_ids : list of column names or int, default None
        The protected attributes as columns of X, as fairlearn's ``CorrelationRemover``
        takes them: names of a DataFrame's (or a DataArray's feature coordinate's) columns,
        or integer indices.  They are left out of the projection, in ``fit`` and in
        ``transform`` (which takes the same full-width X): ``n_features_in_`` counts them,
        ``components_`` does not.  A column of text or categories is group labels (every
        group gets the same mean).  A numeric column z is a number, as in
        CorrelationRemover: the components are made uncorrelated with it
        (``cov(X U, z) = 0``); for a two-valued column (0/1) that is exactly equal group
        means, and for one-hot columns exactly equal means of the encoded groups, but
        integer codes 0, 1, 2, ... of more groups are only decorrelated from the code:
        one-hot encode them, or give them as text, categories or ``sensitive_features=``.
        The covariances are then the constraint, so the pass runs its products in float64
        (``compute_dtype="auto"``).  Giving both this and ``sensitive_features=`` is an
        error.  Works for numpy, pandas, xarray and Dask input (for Dask nothing is read
        beyond the pass itself, but text columns of a Dask DataFrame are computed first).
    whiten, svd_solver, iterated_power, n_oversamples, random_state : as in :class:`PCA`
    center, standardize, compute_dtype, split_every, progress, eigen_solver : as in :class:`PCA`
    constraint : {"demographic_parity", "equal_opportunity"}
        "equal_opportunity" (Sec. 3.2) fits on the rows with ``y == 1`` only, both the
        covariance and the group means.
    tradeoff : float in [0, 1], default 0
        λ of Sec. 3.1.  ``transform`` returns ``[X U_fair, λ X U_pca]`` of shape (n, 2k)
        when λ > 0 and (n, k) when λ = 0 (named "fairpca0", ... and "fairpca_standard0",
        ... by ``get_feature_names_out``).  λ enters linearly; the paper's experiments
        swept λ = (i/10)^3, so pass ``tradeoff=t**3`` to reproduce that grid.  Only the
        fair half is fair (and certified, see ``fairness_violation_``): the λ-scaled
        standard half is, by design, not.  ``whiten`` whitens each half by its own
        variances before λ scales the standard one.
    equalize_covariance : None, float in (0, 1] or int, default None
        Fair PCA-S (Sec. 3.6): also (approximately) equalise the group covariances by
        searching only the l directions of the fair subspace along which they differ least;
        a float f gives the paper's "Fair PCA-S (f)", ``l = max(k, floor(f d))``, an int is
        l itself.  Smaller l, fairer covariances, less variance.  Needs per-group d x d
        statistics, accumulated in the same single pass.  Two groups follow the paper;
        with more groups (or attributes) the directions minimise
        ``sum_g (n_g/n) ||R^T (Sigma_g - Sigma_pooled) R v||^2`` (equal to the paper's
        choice for two groups), see :func:`dfairpca.solve._fairness.equalizing_basis`.  Group
        labels only (numeric attributes have no groups).

    Attributes
    ----------
    components_ : ndarray (k, d)
        The fair projection (rows orthonormal and orthogonal to every group-mean deviation
        and to the covariance with every numeric attribute), over the non-sensitive columns.
    standard_components_ : ndarray (k, d) or None
        Standard PCA from the same statistics, used when ``tradeoff > 0``.
    standard_explained_variance_ : ndarray (k,) or None
        Their variances (for ``whiten``), when ``tradeoff > 0``.
    explained_variance_ratio_ : ndarray (k,)
        Shares of the total variance of the non-sensitive columns.
    noise_variance_ : float
        ``(total variance - sum of explained_variance_) / (min(n, d) - k)``, the mean
        variance outside the fair components (scikit-learn's definition over the full
        covariance).  With the components fixed this is the maximum-likelihood noise of the
        probabilistic PCA model, so ``get_covariance``, ``score`` and ``score_samples`` are
        that model of the fair components (for ``PCA`` it is scikit-learn's number).
    groups_ : list of ndarray
        Labels seen, per attribute given as labels.
    attribute_names_ : list of str
        The attributes given as labels, then the numeric ones.
    sensitive_feature_indices_ : ndarray of int
        Positions in X of the columns named by ``sensitive_feature_ids`` (empty without).
    numeric_sensitive_columns_ : ndarray of int
        Positions, among the columns of ``statistics_``, of the numeric attributes.
    n_constraints_ : int
        Rank of the constraint (number of directions removed).  A group whose mean equals
        the overall mean to float64 rounding (:meth:`Moments.deviation_floor`), or a numeric
        attribute whose covariance with the features is rounding, imposes none, with a
        warning naming it.
    fairness_violation_ : float
        The fit's certificate: the largest share ``|U^T v| / |v|`` of any constraint vector
        v that ``components_`` keep, computed in float64 from the statistics after the
        solve, in the fitted feature space (standardized when ``standardize``; over the
        ``y == 1`` rows for equal opportunity).  v is a group's mean deviation
        ``mu_g - mu``, or a numeric attribute's covariance with the features.  A fit above
        :data:`dfairpca.solve._fairness.FAIRNESS_TOLERANCE` (1e-8) raises ``ValueError``; typical
        values are 1e-16 to 1e-14.
    fairness_violation_per_attribute_ : ndarray (p + q,)
        The same, per protected attribute (in the order of ``attribute_names_``).
    constraint_basis_ : ndarray (d, n_constraints_)
        Orthonormal basis of the removed directions (in the standardised space when
        ``standardize``); ``I - Q Q^T`` is fair PCA at the largest k.
    group_means_ : list of ndarray (m_r, d)
        Mean of every group of every attribute given as labels, in the training data.
    max_components_ : int
        ``d - sum(m_r) + p - q``.
    explained_variance_, singular_values_, mean_, scale_, n_features_in_, feature_names_in_,
    n_samples_seen_, sample_weight_sum_, statistics_, fitted_svd_solver_, statistics_kernel_,
    n_passes_ : as in :class:`PCA`.

    Examples
    --------
    >>> import numpy as np, dfairpca
    >>> rng = np.random.default_rng(0)
    >>> X, z = rng.normal(size=(200, 6)), rng.integers(0, 2, 200)
    >>> X[z == 1] += 1.0
    >>> Y = dfairpca.FairPCA(n_components=2).fit_transform(X, sensitive_features=z)
    >>> bool(np.allclose(Y[z == 0].mean(0), Y[z == 1].mean(0)))
    True
    >>> Xz = np.column_stack([z, X])  # the attribute as column 0 of X, e.g. in a Pipeline
    >>> Y2 = dfairpca.FairPCA(2, sensitive_feature_ids=[0]).fit_transform(Xz)
    >>> bool(np.allclose(np.abs(Y2), np.abs(Y)))
    True
    """

    _parameter_rules = {**LINEAR_RULES, "sensitive_feature_ids": SENSITIVE_IDS, "constraint": CONSTRAINT_RULES,
                        "tradeoff": TRADEOFF, "equalize_covariance": EQUALIZE_RULES}
    _fair = True

    def __init__(self, n_components: int | float | None = None, *,
                 sensitive_feature_ids: ColumnIds | None = None, whiten: bool = False,
                 svd_solver: str = "auto", iterated_power: int | str = "auto", n_oversamples: int = 10,
                 random_state: Seed = None, center: bool = True, standardize: bool = False,
                 constraint: str = "demographic_parity", tradeoff: float = 0.0,
                 equalize_covariance: int | float | None = None, compute_dtype: npt.DTypeLike = "auto",
                 split_every: int = 8, progress: bool = False, eigen_solver: str = "auto") -> None:
        self.n_components = n_components
        self.sensitive_feature_ids = sensitive_feature_ids
        self.whiten = whiten
        self.svd_solver = svd_solver
        self.iterated_power = iterated_power
        self.n_oversamples = n_oversamples
        self.random_state = random_state
        self.center = center
        self.standardize = standardize
        self.constraint = constraint
        self.tradeoff = tradeoff
        self.equalize_covariance = equalize_covariance
        self.compute_dtype = compute_dtype
        self.split_every = split_every
        self.progress = progress
        self.eigen_solver = eigen_solver

    _two_groups_for = "fair PCA needs at least two"

    def _check_input(self, f: FairInput, partial: bool) -> None:
        if not partial:  # k against the fitted rows (a partial_fit's piece may hold fewer)
            self._check_k_groups(f.n_features, f.group_sizes, f.fitted_rows, f.n_numeric)

    @fit_context
    def fit(self, X: ArrayInput, y: ArrayInput | None = None, *,
            sensitive_features: ArrayInput | None = None, sample_weight: ArrayInput | None = None,
            checkpoint: PathInput | None = None,
            keep_checkpoint: bool = False, timeout: float | None = None) -> Self:
        """Fit on X with protected attribute(s) ``sensitive_features`` in one pass over X.

        Parameters
        ----------
        X : (n, d) or (n, h, w) numpy, pandas, xarray, Dask or Zarr array (or a path to a
            Zarr array)
        y : (n,) binary task label, used only by ``constraint="equal_opportunity"``; it is
            never taken for the protected attribute
        sensitive_features : (n,) labels of any type, (n, p) array, list of p label vectors,
            or a pandas/Dask DataFrame (one column per attribute); required unless
            ``sensitive_feature_ids`` names columns of X (keyword only, as in fairlearn,
            so scikit-learn's metadata routing can pass it)
        sample_weight : (n,) array-like, optional
            Frequency weights of the rows, as in :meth:`PCA.fit`: the group means, the
            constraint (equal *weighted* group means) and the certificate are the weighted
            ones; with ``constraint="equal_opportunity"`` the weights of the y == 1 rows.
        checkpoint : path, optional
            Resumable pass, as in :meth:`PCA.fit`.
        keep_checkpoint : bool, default False
            Keep ``checkpoint`` after a successful fit (by default it is deleted).
        timeout : float, optional
            Seconds to wait once every worker has left, as in :meth:`PCA.fit`.

        Returns
        -------
        self : FairPCA
            The fitted estimator.
        """
        return self._fit(X, y, sensitive_features, sample_weight, checkpoint=checkpoint,
                         keep_checkpoint=keep_checkpoint, timeout=timeout)

    def _set_randomized(self, fit) -> None:
        """Certify a fit by randomized passes (:mod:`dfairpca.solve._randomized`), keep it."""
        m = fit.statistics
        ms = [int(np.sum(a.counts > 0)) for a in m.attributes]
        limit = self._check_k_groups(fit.components.shape[1], ms, m.n, len(m.numeric))
        self._set_solution(randomized_fair_solution(fit, self.attribute_names_, limit,
                                                    self._features(m), estimator=type(self).__name__))

    def _set_solution(self, sol: FairSolution) -> None:
        """The fitted attributes of a certified fair solve, exact or matrix-free."""
        self._set_model(sol.n, sol.mean, sol.components, sol.captured, sol.total, sol.scale,
                        sol.exponent, rows=sol.rows, rank=sol.rank)
        self.statistics_ = sol.statistics
        self.statistics_kernel_ = sol.kernel
        self.fitted_svd_solver_ = sol.solver
        if sol.passes is not None:
            self.n_passes_ = sol.passes
        set_certificate(self, sol.violations)
        self.n_constraints_ = sol.basis.shape[1]
        self.constraint_basis_ = sol.basis
        self.group_means_ = sol.group_means
        self.max_components_ = sol.max_components
        self.groups_ = [a.categories for a in sol.statistics.attributes]
        self.attribute_names_ = sol.names
        self.standard_components_: np.ndarray | None
        self.standard_explained_variance_: np.ndarray | None
        self.standard_components_, self.standard_explained_variance_ = sol.standard or (None, None)
        why = low_variance_message(float(np.sum(self.explained_variance_ratio_)), self.n_components_,
                                   sol.components.shape[1], self.n_constraints_,
                                   getattr(self, "equalize_covariance", None))
        if why is not None:
            warnings.warn(why, LowVarianceWarning, stacklevel=outside_stacklevel())

    @fit_context
    def validate_fit(self, X: ArrayInput, y: ArrayInput | None = None, *,
                     sensitive_features: ArrayInput | None = None,
                     sample_weight: ArrayInput | None = None) -> None:
        """Raise the error ``fit`` would raise for the parameters, X's shape and the groups.

        Reads no data of X (only the row counts of a Dask array of unknown chunk sizes):
        the command line calls it before it connects to a cluster.

        Parameters
        ----------
        X : array-like of shape (n, d) or (n, h, w)
            The data ``fit`` would be given.
        y : array-like of shape (n,), optional
            The task label ``fit`` would be given (``constraint="equal_opportunity"``).
        sensitive_features : array-like, list of arrays or DataFrame, optional
            The protected attribute(s) ``fit`` would be given.
        sample_weight : array-like of shape (n,), optional
            The weights ``fit`` would be given.
        """
        self._validate_fit(X, y, sensitive_features, sample_weight)

    def _solvable(self, m: Moments) -> bool:
        # not solvable yet also where a numeric attribute is constant so far
        num = self.numeric_sensitive_columns_
        return super()._solvable(m) and not (len(num) and m.n_effective < 2) and not np.any(
            m.scatter_diagonal[num] == 0)

    def _check_k_groups(self, d, ms, n=None, q: int = 0):
        """The largest k the attributes allow (:func:`dfairpca.solve._limits.check_fair_k`);
        raise if n_components exceeds it or the n fitted rows (when known)."""
        limit = check_fair_k(self.n_components, d, ms, q)
        k = self.n_components
        check_rows(k if is_int(k) else None, n, min(limit, n) if known(n) else limit,
                   constraint_of(self.constraint).rows_word)
        return limit

    @fit_context
    def fit_statistics(self, statistics: Moments, *, attribute_names: Sequence[str] | None = None,
                       numeric_columns: npt.ArrayLike | None = None) -> Self:
        """Solve fair PCA from precomputed (merged, loaded) statistics, and certify it.

        After the solve, the share of every constraint vector that the components keep is
        measured in float64 (``fairness_violation_``); a fit above
        :data:`~dfairpca.solve._fairness.FAIRNESS_TOLERANCE` raises ``ValueError``.

        Parameters
        ----------
        statistics : Moments
            Statistics of the rows to fit, with the groups of every labelled attribute.
            Their columns are the features, except the numeric protected attributes
            ``numeric_columns``.
        attribute_names : list of str, optional
            Names of the attributes, labelled ones first, used in errors and in
            ``attribute_names_`` (default: those ``fit`` found, else "attribute 0", ...).
        numeric_columns : sequence of int, optional
            Columns of the statistics that are numeric protected attributes (default: the
            ``numeric_sensitive_columns_`` that ``fit`` set; none for statistics computed
            elsewhere, which then need group labels).

        Returns
        -------
        self : FairPCA
            The fitted estimator.
        """
        self._fit_statistics(statistics, attribute_names=attribute_names,
                             numeric_columns=numeric_columns)
        if not hasattr(self, "sensitive_feature_indices_") and numeric_columns is None:
            # statistics computed elsewhere, their groups given as labels: a later
            # partial_fit takes X without sensitive columns, its groups as labels too
            self.sensitive_feature_indices_ = np.zeros(0, np.intp)
            self.numeric_sensitive_columns_ = np.zeros(0, np.intp)
        return self

    @reported
    def _fit_statistics(self, statistics: Moments, *, attribute_names: Sequence[str] | None = None,
                        numeric_columns: npt.ArrayLike | None = None) -> Self:
        """:meth:`fit_statistics`, the parameters checked already (by the public call)."""
        m = statistics
        given = numeric_columns is not None
        num = np.asarray(numeric_columns if given else
                         getattr(self, "numeric_sensitive_columns_", ()), dtype=np.intp)
        q = len(num)
        names = self._checked_statistics(m, num, attribute_names if attribute_names is not None
                                         else getattr(self, "attribute_names_", None))
        ms = [int(np.sum(a.counts > 0)) for a in m.attributes]
        limit = self._check_k_groups(m.n_features - q, ms, m.n_effective, q)
        solution = exact_fair_solution(
            m, num, names, limit, k=self.n_components, center=self.center,
            standardize=self.standardize, equalize=self.equalize_covariance,
            eigen_solver=self._eigen_solver, tradeoff=self.tradeoff, estimator=type(self).__name__,
            constraint=self.constraint)
        self._set_solution(solution)
        if given:
            self.numeric_sensitive_columns_ = num
        return self

    def _projection(self):
        W = super()._projection()
        V = getattr(self, "standard_components_", None)
        if self.tradeoff > 0 and V is not None:
            V = V.T
            if self.whiten:
                V = V / whitening(self.standard_explained_variance_)
            return np.concatenate([W, self.tradeoff * V], axis=1)
        return W

    # ------------------------------------------------------------------ persistence
    _array_attrs = LinearDecomposition._array_attrs + (
        "standard_components_", "constraint_basis_", "standard_explained_variance_")
    _meta_attrs = LinearDecomposition._meta_attrs + (
        "n_constraints_", "max_components_", "attribute_names_")

    def _extra_meta(self):
        return fair_meta(self)

    def _extra_arrays(self):
        return {f"group_means_{j}": gm for j, gm in enumerate(self.group_means_)}

    def _restore_extra(self, meta, arrays):
        restore_fair_meta(self, meta)
        self.group_means_ = [arrays[f"group_means_{j}"] for j in range(len(self.groups_))]
        super()._restore_extra(meta, arrays)
