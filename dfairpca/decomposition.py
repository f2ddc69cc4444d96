"""Estimators: :class:`PCA` and :class:`FairPCA` on numpy, Dask and Zarr arrays.

They are thin: check the input, run the one-pass statistics (:mod:`dfairpca._engine`),
solve the small eigenproblem (:mod:`dfairpca._solvers`) and keep the fitted attributes.
``transform`` is lazy on Dask input (``map_blocks``) and eager on numpy input.
"""

from __future__ import annotations

import numbers
import warnings
from pathlib import Path

import numpy as np
from sklearn.base import BaseEstimator, ClassNamePrefixFeaturesOutMixin, TransformerMixin
from sklearn.exceptions import NotFittedError

from . import _solvers
from ._engine import compute_moments
from ._validation import (
    as_data, binary_target, check_finite_output, check_n_features, compute_dtype_for,
    encode_groups, require_sensitive_features, row_origin, with_known_rows,
)
from .moments import (
    OVERFLOW_MESSAGE, Moments, _categories_from_json, _categories_to_json, merge, saved_group_counts,
)

__all__ = ["PCA", "FairPCA", "load"]

CONSTRAINTS = ("demographic_parity", "equal_opportunity")


class _BaseDecomposition(ClassNamePrefixFeaturesOutMixin, TransformerMixin, BaseEstimator):
    """Shared fit-from-statistics, transform, inverse_transform, save."""

    # ------------------------------------------------------------------ parameters
    def _check_params(self):
        k = self.n_components
        if k is not None and (
            not isinstance(k, numbers.Integral) or isinstance(k, bool) or k <= 0
        ):
            raise ValueError(f"n_components must be a positive integer or None; got {k!r}")
        if not isinstance(self.split_every, numbers.Integral) or self.split_every < 2:
            raise ValueError(f"split_every must be an integer >= 2; got {self.split_every!r}")
        compute_dtype_for(np.float64, self.compute_dtype)  # validates the option
        if self.eigen_solver not in _solvers.EIGEN_SOLVERS:
            raise ValueError(
                f"eigen_solver must be one of {_solvers.EIGEN_SOLVERS}; got {self.eigen_solver!r}"
            )

    # ------------------------------------------------------------------ fitting
    def _pass(self, X, groups=None, mask=None, checkpoint=None):
        dtype = compute_dtype_for(X.dtype, self.compute_dtype)
        codes, cats = (None, ()) if groups is None else (groups.codes, groups.categories)
        kw = dict(
            mask=mask, dtype=dtype, split_every=self.split_every,
            group_scatter=getattr(self, "equalize_covariance", None) is not None,
            progress=self.progress,
        )
        if checkpoint is None:
            m = compute_moments(X, codes, cats, **kw)
        else:
            import dask.array as da

            from .checkpoint import compute_moments_checkpointed

            if not isinstance(X, da.Array):
                X = da.from_array(X, chunks=(max(1, (64 << 20) // (X.shape[1] * X.itemsize)), -1))
            m = compute_moments_checkpointed(X, codes, cats, checkpoint=checkpoint, **kw)
        m.check_finite()
        return m

    def _space(self, m: Moments):
        """(S, scale, e): the matrix whose eigenvectors we want, in the fitted feature space,
        as ``S * 4**e`` (e is the statistics' ``scatter_exponent``, 0 but for data of
        extreme magnitude; 0 when standardized, which is unit-free), and the true scale."""
        m.symmetrize()
        if m.n < 2:
            raise ValueError(f"need at least 2 rows to fit; got {m.n}")
        if not (np.all(np.isfinite(m.mean)) and np.all(np.isfinite(np.diagonal(m.scatter)))):
            raise ValueError(OVERFLOW_MESSAGE)
        e = m.scatter_exponent
        S = m.scatter
        if not self.center:
            mu = np.ldexp(m.mean, -e)  # in the scatter's units
            S = S + m.n * np.outer(mu, mu)
        scale = None
        if self.standardize:
            sd = np.sqrt(np.diag(m.scatter) / (m.n - 1))
            sd[sd == 0] = 1.0
            S = S / np.outer(sd, sd)
            scale = np.ldexp(sd, e)
            scale[scale == 0] = 1.0
            e = 0
        return S, scale, e

    def _set_fitted(self, m: Moments, U: np.ndarray, S: np.ndarray, scale, e: int = 0):
        d = m.n_features
        self.statistics_ = m
        self.n_features_in_ = d
        self.n_samples_seen_ = int(m.n)
        self.n_components_ = U.shape[0]
        self.components_ = U
        self.mean_ = m.mean.copy() if self.center else np.zeros(d)
        self.scale_ = scale
        denom = m.n - 1
        captured = np.sum((U @ S) * U, axis=1) / denom
        with np.errstate(over="ignore", under="ignore"):  # the true values, as float64 holds them
            self.explained_variance_ = np.ldexp(captured, 2 * e)
        self.explained_variance_ratio_ = captured / (np.trace(S) / denom)

    # ------------------------------------------------------------------ transforming
    def _check_fitted(self):
        if not hasattr(self, "components_"):
            hint = (
                " (partial_fit has not yet seen two groups of every attribute, or "
                "n_components rows)"
                if hasattr(self, "statistics_") else ""
            )
            raise NotFittedError(
                f"this {type(self).__name__} is not fitted yet{hint}; call fit(...) before using it"
            )

    def _projection(self) -> np.ndarray:
        """(d, k_out) matrix applied to standardised, centred rows."""
        return self.components_.T

    @property
    def _n_features_out(self):
        return self._projection().shape[1]

    def transform(self, X):
        """Project X: ``((X - mean_) / scale_) @ components_.T``.

        numpy in, numpy out; Dask (or Zarr) in, lazy Dask out with X's row chunks.
        float64 input gives float64 output, other dtypes float32 (see ``compute_dtype``).
        Rows holding NaN or infinity raise ``ValueError`` naming them: at once for numpy
        input, when the chunk is computed for Dask input (integer input is not checked:
        it cannot hold either).
        """
        self._check_fitted()
        Xa = as_data(X)
        d = Xa.shape[1]
        check_n_features(self, d)
        dtype = compute_dtype_for(Xa.dtype, self.compute_dtype)
        W = self._projection()
        scale = np.ones(d) if self.scale_ is None else self.scale_
        # fold the scaling into W: ((x - mu) / s) @ W == (x - mu) @ (W / s[:, None])
        Ws = (W / scale[:, None]).astype(dtype)
        mu = self.mean_.astype(dtype)
        import dask.array as da

        if isinstance(Xa, da.Array):
            return Xa.map_blocks(
                _project_block, mu, Ws, dtype=dtype, chunks=(Xa.chunks[0], (Ws.shape[1],)),
                meta=np.empty((0, 0), dtype),
            )
        out = np.empty((Xa.shape[0], Ws.shape[1]), dtype)
        rows = max(1, (64 << 20) // max(1, d * dtype.itemsize))
        for s in range(0, Xa.shape[0], rows):
            out[s : s + rows] = _project(Xa[s : s + rows], mu, Ws)
        check_finite_output(out, Xa)  # all rows at once: the error counts every bad row
        return out

    def inverse_transform(self, Y):
        """Map representations back to feature space: ``Y[:, :k] @ components_ * scale_ + mean_``.

        With ``tradeoff > 0`` only the first k (fair) columns are used.
        """
        self._check_fitted()
        import dask.array as da

        k = self.n_components_
        if Y.ndim != 2 or Y.shape[1] not in (k, self._n_features_out):
            raise ValueError(f"Y must have shape (n, {k}); got {Y.shape}")
        scale = np.ones(self.n_features_in_) if self.scale_ is None else self.scale_
        B = self.components_ * scale[None, :]
        if isinstance(Y, da.Array):
            dtype = Y.dtype if Y.dtype.kind == "f" else np.float64
            Yk = Y[:, :k].rechunk({1: -1})
            return Yk.map_blocks(
                _reconstruct_block, B.astype(dtype), self.mean_.astype(dtype), dtype=dtype,
                chunks=(Yk.chunks[0], (self.n_features_in_,)),
                meta=np.empty((0, 0), dtype),
            )
        Y = np.asarray(Y)
        dtype = Y.dtype if Y.dtype.kind == "f" else np.float64
        return _reconstruct_block(Y[:, :k], B.astype(dtype), self.mean_.astype(dtype))

    # ------------------------------------------------------------------ persistence
    _array_attrs = ("components_", "mean_", "scale_", "explained_variance_", "explained_variance_ratio_")
    _meta_attrs = ("n_features_in_", "n_samples_seen_", "n_components_")

    def save(self, path, *, statistics: bool = False, overwrite: bool = False) -> Path:
        """Save the fitted model to directory ``path`` (arrays in .npz, metadata in JSON).

        ``statistics=True`` also saves :attr:`statistics_` (d x d float64, 330 MB at
        d = 6400) so that ``partial_fit`` can continue after :func:`load`.  Never pickles.
        ``path`` must not exist or be an empty directory; ``overwrite=True`` replaces a
        model saved by dfairpca there, atomically, and nothing else (see
        :func:`dfairpca.io.atomic_directory`).
        """
        from .io import atomic_directory, save_arrays

        self._check_fitted()
        arrays = {a: getattr(self, a) for a in self._array_attrs if getattr(self, a, None) is not None}
        arrays.update(self._extra_arrays())
        meta = {
            "kind": "estimator",
            "class": type(self).__name__,
            "params": self.get_params(),
            **{a: getattr(self, a) for a in self._meta_attrs if hasattr(self, a)},
            **self._extra_meta(),
        }
        with atomic_directory(path, "model", overwrite=overwrite) as tmp:
            save_arrays(tmp / "model", arrays, meta)
            if statistics:
                self.statistics_.save(tmp / "statistics")
        return Path(path)

    def _extra_meta(self) -> dict:
        return {}

    def _extra_arrays(self) -> dict:
        return {}

    def _restore_extra(self, meta: dict, arrays: dict) -> None:
        pass


class PCA(_BaseDecomposition):
    """Principal component analysis on the one-pass statistics engine.

    Parameters
    ----------
    n_components : int or None
        Number of components k; None keeps all d.  k above the number of rows is an error
        (raised before the pass when the rows are known).
    center : bool, default True
        Subtract the mean.  ``False`` uses the uncentred ``X^T X`` (the paper's formula).
    standardize : bool, default False
        Divide every feature by its standard deviation (features with zero variance are
        left unscaled), i.e. PCA of the correlation matrix.
    compute_dtype : {"auto", "float32", "float64"}, default "auto"
        Dtype of the per-chunk products and of ``transform``'s output. "auto": float64 for
        float64 (and 32/64-bit integer) input, float32 otherwise.  Sums are always float64.
    split_every : int, default 8
        Fan-in of the merges that combine the pass's running sums (one per worker thread;
        each folds its share of the row chunks in place) at the end of a Dask pass.
    progress : bool, default False
        Show a progress bar during the pass.
    eigen_solver : {"auto", "dense", "randomized"}, default "auto"
        The local d x d solve: LAPACK ``eigh`` (subset by index) or block subspace iteration
        with Rayleigh-Ritz, stopped when the captured variance changes by < 1e-8 relative;
        "auto" takes the latter for d >= 2000 and k <= d / 10 (measured faster there).

    Attributes
    ----------
    components_ : ndarray (k, d)
        Orthonormal rows, largest variance first, signs fixed (largest entry positive).
    explained_variance_, explained_variance_ratio_ : ndarray (k,)
    mean_ : ndarray (d,)
    scale_ : ndarray (d,) or None
    n_features_in_, n_samples_seen_, n_components_ : int
    statistics_ : Moments
        The additive statistics the model was solved from.

    Examples
    --------
    >>> import numpy as np, dfairpca
    >>> X = np.random.default_rng(0).normal(size=(100, 5))
    >>> dfairpca.PCA(n_components=2).fit(X).transform(X).shape
    (100, 2)
    """

    def __init__(self, n_components=None, *, center=True, standardize=False,
                 compute_dtype="auto", split_every=8, progress=False, eigen_solver="auto"):
        self.n_components = n_components
        self.center = center
        self.standardize = standardize
        self.compute_dtype = compute_dtype
        self.split_every = split_every
        self.progress = progress
        self.eigen_solver = eigen_solver

    def fit(self, X, y=None, *, checkpoint=None, keep_checkpoint=False):
        """Fit on X (numpy, Dask or Zarr; (n, d) or (n, h, w)) in one pass.

        ``checkpoint``: a directory where the pass saves its running statistics after every
        segment of chunks; a fit interrupted (Ctrl-C raises
        :class:`~dfairpca.checkpoint.PassInterrupted`) and run again with the same
        checkpoint skips the finished segments, after checking that their rows are the
        ones it folded (see :mod:`dfairpca.checkpoint`; other data is refused with
        :class:`~dfairpca.checkpoint.CheckpointMismatch`).  ``keep_checkpoint``: keep the
        checkpoint after a successful fit; by default it is deleted then.
        """
        self.validate_fit(X, y)
        (Xa,) = with_known_rows(as_data(X))
        self._check_k(Xa.shape[1], Xa.shape[0])  # rows now known, also of a filtered Dask X
        self.fit_statistics(self._pass(Xa, checkpoint=checkpoint))
        _release(checkpoint, keep_checkpoint)
        return self

    def validate_fit(self, X, y=None):
        """Raise the error ``fit(X, y)`` would raise for the parameters and X's shape.

        Reads no data: the command line calls it before it connects to a cluster.
        """
        self._check_params()
        Xa = as_data(X)
        self._check_k(Xa.shape[1], Xa.shape[0])

    def partial_fit(self, X, y=None):
        """Add the rows of X to what was seen so far and refit (equals fit on the union).

        Until ``n_components`` rows have been seen only the statistics are kept.
        """
        self._check_params()
        (Xa,) = with_known_rows(as_data(X))
        self._check_previous(Xa.shape[1])
        self._check_k(Xa.shape[1])
        m = self._pass(Xa)
        if hasattr(self, "statistics_"):
            m = merge([self.statistics_, m])
        if self.n_components is not None and m.n < self.n_components:
            self._keep_statistics(m)
            return self
        return self.fit_statistics(m)

    def _keep_statistics(self, m: Moments) -> None:
        """Record the statistics of a partial_fit that cannot be solved yet."""
        self.statistics_ = m
        self.n_samples_seen_ = int(m.n)
        self.n_features_in_ = m.n_features

    def fit_statistics(self, statistics: Moments):
        """Solve from precomputed (e.g. merged or loaded) statistics."""
        self._check_params()
        self._check_k(statistics.n_features, statistics.n)
        S, scale, e = self._space(statistics)
        k = self.n_components or statistics.n_features
        U = _solvers.pca_components(S, k, self.eigen_solver)
        self._set_fitted(statistics, U, S, scale, e)
        return self

    def _check_k(self, d, n=None):
        """Raise unless ``n_components <= min(n, d)`` (n: rows, when known)."""
        k = self.n_components
        if k is not None and k > d:
            raise ValueError(f"n_components={k} is too large: X has {d} features")
        _check_rows(k, n, min(d, n) if _known(n) else d, "rows")

    def _check_previous(self, d):
        if hasattr(self, "n_features_in_") and d != self.n_features_in_:
            raise ValueError(f"X has {d} features; earlier partial_fit calls had {self.n_features_in_}")


class FairPCA(PCA):
    """Fair PCA (Kleindessner, Donini, Russell & Zafar, AISTATS 2023).

    The best k-dimensional orthonormal projection under which every group of every
    protected attribute has the same mean (Alg. 1 for two groups, Alg. 2 for m groups,
    Sec. 3.5 for several attributes): the top-k eigenvectors of the covariance restricted
    to the orthogonal complement of the group-mean deviations.  With p attributes of
    m_1, ..., m_p groups at most ``d - sum(m_r) + p`` components exist.

    Parameters
    ----------
    n_components : int or None
        k; None takes the largest allowed, ``d - sum(m_r) + p``.
    center, standardize, compute_dtype, split_every, progress
        As in :class:`PCA`.
    constraint : {"demographic_parity", "equal_opportunity"}
        "equal_opportunity" (Sec. 3.2) fits on the rows with ``y == 1`` only, both the
        covariance and the group means.
    tradeoff : float in [0, 1], default 0
        λ of Sec. 3.1.  ``transform`` returns ``[X U_fair, λ X U_pca]`` of shape (n, 2k)
        when λ > 0 and (n, k) when λ = 0.  λ enters linearly; the paper's experiments
        swept λ = (i/10)^3, so pass ``tradeoff=t**3`` to reproduce that grid.  Only the
        fair half is fair (and certified, see ``fairness_violation_``): the λ-scaled
        standard half is, by design, not.
    equalize_covariance : None, float in (0, 1] or int, default None
        Fair PCA-S (Sec. 3.6): also (approximately) equalise the group covariances by
        searching only the l directions of the fair subspace along which they differ least;
        a float f gives the paper's "Fair PCA-S (f)", ``l = max(k, floor(f d))``, an int is
        l itself.  Smaller l, fairer covariances, less variance.  Needs per-group d x d
        statistics, accumulated in the same single pass.  Two groups follow the paper;
        with more groups (or attributes) the directions minimise
        ``sum_g (n_g/n) ||R^T (Sigma_g - Sigma_pooled) R v||^2`` (equal to the paper's
        choice for two groups), see :func:`dfairpca._solvers.equalizing_basis`.

    Attributes
    ----------
    components_ : ndarray (k, d)
        The fair projection (rows orthonormal and orthogonal to every group-mean deviation).
    standard_components_ : ndarray (k, d) or None
        Standard PCA from the same statistics, used when ``tradeoff > 0``.
    groups_ : list of ndarray
        Labels seen, per attribute.
    attribute_names_ : list of str
    n_constraints_ : int
        Rank of the constraint (number of directions removed).  A group whose mean equals
        the overall mean to float64 rounding (:meth:`Moments.deviation_floor`) imposes
        none, with a warning naming it.
    fairness_violation_ : float
        The fit's certificate: the largest share ``|U^T (mu_g - mu)| / |mu_g - mu|`` of any
        group's mean deviation that ``components_`` keep, computed in float64 from the
        statistics after the solve, in the fitted feature space (standardized when
        ``standardize``; over the ``y == 1`` rows for equal opportunity).  A fit above
        :data:`dfairpca._solvers.FAIRNESS_TOLERANCE` (1e-8) raises ``ValueError``; typical
        values are 1e-16 to 1e-14.
    fairness_violation_per_attribute_ : ndarray (p,)
        The same, per protected attribute.
    constraint_basis_ : ndarray (d, n_constraints_)
        Orthonormal basis of the removed directions (the group-mean deviations, in the
        standardised space when ``standardize``); ``I - Q Q^T`` is fair PCA at the
        largest k.
    group_means_ : list of ndarray (m_r, d)
        Mean of every group of every attribute in the training data.
    max_components_ : int
        ``d - sum(m_r) + p``.
    explained_variance_, explained_variance_ratio_, mean_, scale_, n_features_in_,
    n_samples_seen_, statistics_ : as in :class:`PCA`.

    Examples
    --------
    >>> import numpy as np, dfairpca
    >>> rng = np.random.default_rng(0)
    >>> X, z = rng.normal(size=(200, 6)), rng.integers(0, 2, 200)
    >>> X[z == 1] += 1.0
    >>> Y = dfairpca.FairPCA(n_components=2).fit_transform(X, sensitive_features=z)
    >>> bool(np.allclose(Y[z == 0].mean(0), Y[z == 1].mean(0)))
    True
    """

    def __init__(self, n_components=None, *, center=True, standardize=False,
                 constraint="demographic_parity", tradeoff=0.0, equalize_covariance=None,
                 compute_dtype="auto", split_every=8, progress=False, eigen_solver="auto"):
        super().__init__(n_components, center=center, standardize=standardize,
                         compute_dtype=compute_dtype, split_every=split_every, progress=progress,
                         eigen_solver=eigen_solver)
        self.constraint = constraint
        self.tradeoff = tradeoff
        self.equalize_covariance = equalize_covariance

    def _check_params(self):
        super()._check_params()
        if self.constraint not in CONSTRAINTS:
            raise ValueError(f"constraint must be one of {CONSTRAINTS}; got {self.constraint!r}")
        t = self.tradeoff
        if not isinstance(t, numbers.Real) or isinstance(t, bool) or not 0.0 <= t <= 1.0:
            raise ValueError(f"tradeoff must be a number in [0, 1]; got {t!r}")
        e = self.equalize_covariance
        if e is not None:
            if isinstance(e, bool) or not isinstance(e, numbers.Real):
                raise ValueError(f"equalize_covariance must be None, a fraction in (0, 1] or an int; got {e!r}")
            if isinstance(e, numbers.Integral):
                if self.n_components is not None and e < self.n_components:
                    raise ValueError(
                        f"equalize_covariance={e} directions cannot hold n_components="
                        f"{self.n_components}; pass l >= k or a fraction in (0, 1]"
                    )
            elif not 0.0 < e <= 1.0:
                raise ValueError(f"equalize_covariance as a fraction must be in (0, 1]; got {e!r}")

    def _prepare(self, X, groups, y, partial):
        self._check_params()
        Xa = as_data(X)
        require_sensitive_features(self, groups)
        Xa, groups, y = with_known_rows(Xa, groups, y)
        n, d = Xa.shape
        mask = binary_target(y, n) if self.constraint == "equal_opportunity" else None
        g = encode_groups(groups, n, mask=mask, require_two=not partial)
        if not partial:
            fitted = n if mask is None else int(np.count_nonzero(mask))
            self._check_k_groups(d, [len(c) for c in g.categories], fitted)
        return Xa, g, mask

    def fit(self, X, y=None, *, sensitive_features=None, checkpoint=None,
            keep_checkpoint=False):
        """Fit on X with protected attribute(s) ``sensitive_features`` in one pass over X.

        Parameters
        ----------
        X : (n, d) or (n, h, w) numpy, Dask or Zarr array (or a path to a Zarr array)
        y : (n,) binary task label, used only by ``constraint="equal_opportunity"``; it is
            never taken for the protected attribute
        sensitive_features : (n,) labels of any type, (n, p) array, list of p label vectors,
            or a pandas/Dask DataFrame (one column per attribute); required (keyword only,
            as in fairlearn, so scikit-learn's metadata routing can pass it)
        checkpoint : path, optional
            Resumable pass, as in :meth:`PCA.fit`.
        keep_checkpoint : bool, default False
            Keep ``checkpoint`` after a successful fit (by default it is deleted).
        """
        groups = sensitive_features
        Xa, g, mask = self._prepare(X, groups, y, partial=False)
        self.attribute_names_ = list(g.names)
        self.fit_statistics(self._pass(Xa, g, mask, checkpoint))
        _release(checkpoint, keep_checkpoint)
        return self

    def validate_fit(self, X, y=None, *, sensitive_features=None):
        """Raise the error ``fit`` would raise for the parameters, X's shape and the groups.

        Reads no data of X (only the row counts of a Dask array of unknown chunk sizes):
        the command line calls it before it connects to a cluster.
        """
        self._prepare(X, sensitive_features, y, partial=False)

    def fit_transform(self, X, y=None, *, sensitive_features=None):
        """``fit(X, y, sensitive_features=...).transform(X)`` (two passes over X)."""
        return self.fit(X, y, sensitive_features=sensitive_features).transform(X)

    def partial_fit(self, X, y=None, *, sensitive_features=None):
        """Add the rows of X and refit; a sequence of calls equals one fit on the union."""
        groups = sensitive_features
        Xa, g, mask = self._prepare(X, groups, y, partial=True)
        self._check_previous(Xa.shape[1])
        if hasattr(self, "statistics_") and len(self.statistics_.attributes) != g.n_attributes:
            raise ValueError(
                f"groups has {g.n_attributes} attribute(s); earlier partial_fit calls had "
                f"{len(self.statistics_.attributes)}"
            )
        m = self._pass(Xa, g, mask)
        if hasattr(self, "statistics_"):
            m = merge([self.statistics_, m])
        if not hasattr(self, "attribute_names_"):
            self.attribute_names_ = list(g.names)
        if any(np.sum(a.counts > 0) < 2 for a in m.attributes) or (
                self.n_components is not None and m.n < self.n_components):
            # not solvable yet (a piece may hold a single group, or fewer than k rows)
            self._keep_statistics(m)
            return self
        return self.fit_statistics(m)

    def _check_k_groups(self, d, ms, n=None):
        """The largest k the groups allow, ``d - sum(m_r) + p``; raise if n_components
        exceeds it or the n fitted rows (when known)."""
        limit = d - sum(ms) + len(ms)
        k = self.n_components
        if limit < 1:
            raise ValueError(
                f"no fair projection exists: {d} features cannot absorb {sum(ms) - len(ms)} "
                f"constraints from groups of sizes {ms}"
            )
        if k is not None and k > limit:
            desc = " and ".join(f"{m} groups" for m in ms)
            raise ValueError(
                f"n_components={k} is too large: with {desc} the largest k is "
                f"d - sum(m) + p = {d} - {sum(ms)} + {len(ms)} = {limit}"
            )
        what = "rows with y == 1" if self.constraint == "equal_opportunity" else "rows"
        _check_rows(k, n, min(limit, n) if _known(n) else limit, what)
        return limit

    def fit_statistics(self, statistics: Moments):
        """Solve fair PCA from precomputed (merged, loaded) statistics, and certify it.

        After the solve, the share of every group's mean deviation that the components keep
        is measured in float64 (``fairness_violation_``); a fit above
        :data:`~dfairpca._solvers.FAIRNESS_TOLERANCE` raises ``ValueError``.
        """
        self._check_params()
        m = statistics.symmetrize()
        if not m.attributes:
            raise ValueError("these statistics carry no groups; FairPCA needs protected attributes")
        names = getattr(self, "attribute_names_", None) or [f"attribute {j}" for j in range(len(m.attributes))]
        for name, a in zip(names, m.attributes):
            present = int(np.sum(a.counts > 0))
            if present < 2:
                raise ValueError(
                    f"{name} has {present} non-empty group(s) among the rows seen; fair PCA "
                    "needs at least two"
                )
        ms = [int(np.sum(a.counts > 0)) for a in m.attributes]
        limit = self._check_k_groups(m.n_features, ms, m.n)
        S, scale, e = self._space(m)
        C = self._constraints(m, names)
        if scale is not None:
            C = C / scale[None, :]
        Q = _solvers.constraint_basis(C)
        k = self.n_components or limit
        U = _solvers.fair_components(S, Q, k, *self._covariance_terms(m, scale, k, Q.shape[1]),
                                     solver=self.eigen_solver)
        sizes = [a.n_groups for a in m.attributes]
        per_group = np.split(_solvers.constraint_violation(U, C), np.cumsum(sizes)[:-1])
        certify(per_group, names, [a.categories for a in m.attributes], m.precision, type(self).__name__)
        self._set_fitted(m, U, S, scale, e)
        self.fairness_violation_per_attribute_ = np.array([float(v.max(initial=0.0)) for v in per_group])
        self.fairness_violation_ = float(self.fairness_violation_per_attribute_.max())
        self.n_constraints_ = Q.shape[1]
        self.constraint_basis_ = Q
        self.group_means_ = [m.group_means(j) for j in range(len(m.attributes))]
        self.max_components_ = limit
        self.groups_ = [a.categories for a in m.attributes]
        self.attribute_names_ = list(names)
        self.standard_components_ = (
            _solvers.pca_components(S, k, self.eigen_solver) if self.tradeoff > 0 else None
        )
        return self

    @staticmethod
    def _constraints(m: Moments, names) -> np.ndarray:
        """The constraint matrix (rows ``n_g (mean_g - mean)``), with the rows of groups whose
        mean is the overall mean to float64 rounding set to 0, with a warning for each."""
        C = m.constraint_matrix()
        counts = np.concatenate([a.counts for a in m.attributes]).astype(np.float64)
        floor = m.deviation_floor()
        dev = _solvers.row_norms(C) / np.maximum(counts, 1.0)
        zero = (counts > 0) & (dev <= floor)
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
                        f"float64 rounding (deviation <= {floor:.2e}, the rounding bound of means "
                        "of these rows), so they impose no constraint and none is kept for them",
                        UserWarning, stacklevel=4,
                    )
            C[zero] = 0.0
        return C

    def _covariance_terms(self, m: Moments, scale, k: int, r: int):
        """(cov_diffs, l) for Fair PCA-S, or (None, None)."""
        e = self.equalize_covariance
        if e is None:
            return None, None
        d = m.n_features
        l = int(e) if isinstance(e, numbers.Integral) else max(k, int(np.floor(e * d)))
        if l >= d - r:  # the whole fair subspace: plain fair PCA (the paper's "S(1.0)")
            return None, None
        if not m.has_group_scatter:
            raise ValueError(
                "these statistics hold no per-group scatter matrices; fit with "
                "equalize_covariance set so that the pass accumulates them"
            )
        inv = 1.0 if scale is None else 1.0 / np.outer(scale, scale)
        covs = []  # per attribute: [(n_g, Sigma_g)] of the groups with two or more rows
        for a in m.attributes:
            covs.append([(c, a.scatter[g] / (c - 1) * inv) for g, c in enumerate(a.counts) if c > 1])
        if len(covs) == 1 and len(covs[0]) == 2:
            return [(1.0, covs[0][0][1] - covs[0][1][1])], l
        diffs = []
        for groups in covs:
            n = sum(c for c, _ in groups)
            pooled = sum(c / n * cov for c, cov in groups)
            diffs += [(c / n, cov - pooled) for c, cov in groups]
        return diffs, l

    def _projection(self):
        if self.tradeoff > 0 and getattr(self, "standard_components_", None) is not None:
            return np.concatenate([self.components_, self.tradeoff * self.standard_components_]).T
        return self.components_.T

    _array_attrs = _BaseDecomposition._array_attrs + ("standard_components_", "constraint_basis_")
    _meta_attrs = _BaseDecomposition._meta_attrs + ("n_constraints_", "max_components_", "attribute_names_",
                                                    "fairness_violation_")

    def _extra_meta(self):
        return {"groups_": [_categories_to_json(c) for c in self.groups_],
                "fairness_violation_per_attribute_": [float(v) for v in self.fairness_violation_per_attribute_]}

    def _extra_arrays(self):
        return {f"group_means_{j}": gm for j, gm in enumerate(self.group_means_)}

    def _restore_extra(self, meta, arrays):
        self.groups_ = [_categories_from_json(c) for c in meta["groups_"]]
        self.group_means_ = [arrays[f"group_means_{j}"] for j in range(len(self.groups_))]
        if "fairness_violation_per_attribute_" in meta:
            self.fairness_violation_per_attribute_ = np.array(meta["fairness_violation_per_attribute_"], float)


def _known(n) -> bool:
    """Whether a row count is known (a Dask array of unknown chunk sizes has NaN rows)."""
    return n is not None and not (isinstance(n, float) and np.isnan(n))


def _check_rows(k, n, largest: int, what: str) -> None:
    """Raise if k exceeds the n fitted rows (checked before the pass wherever n is known)."""
    if k is not None and _known(n) and k > n:
        raise ValueError(
            f"n_components={k} is too large: X has {int(n)} {what}, fewer than k; the "
            f"largest k is {int(largest)}"
        )


def certify(per_group, names, categories, precision: float, estimator: str) -> None:
    """Raise ``ValueError`` if any group keeps more than ``FAIRNESS_TOLERANCE`` of its mean
    deviation under the fitted components (``per_group``: one array per attribute, from
    :func:`dfairpca._solvers.constraint_violation`), naming the group and the fixes."""
    worst, where = 0.0, None
    for name, cats, v in zip(names, categories, per_group):
        if len(v) and v.max() > worst:
            worst, where = float(v.max()), (name, cats[int(np.argmax(v))])
    if worst <= _solvers.FAIRNESS_TOLERANCE:
        return
    name, group = where
    dtype_fix = ("compute_dtype='float64' (the products ran in float32), "
                 if precision > np.finfo(np.float64).eps else "")
    raise ValueError(
        f"{estimator} could not satisfy its fairness constraint: the components keep "
        f"{worst:.2e} of the mean deviation of group {group!r} of {name} (tolerance "
        f"{_solvers.FAIRNESS_TOLERANCE:g}); the group-mean deviations are too close to "
        f"linearly dependent or too different in size for float64. Fit with {dtype_fix}"
        f"standardize=True if the features differ greatly in scale, or merge or drop group "
        f"{group!r}"
    )


def _release(checkpoint, keep: bool) -> None:
    """Delete a successful fit's checkpoint unless the caller keeps it."""
    if checkpoint is not None and not keep:
        from .io import remove_directory

        remove_directory(checkpoint, "checkpoint")


def _project(x, mu, W):
    """``(x - mu) @ W`` in W's dtype."""
    x = np.asarray(x)
    with np.errstate(invalid="ignore", over="ignore"):  # such rows raise, named, instead
        return (x.astype(W.dtype, copy=False) - mu) @ W


def _project_block(x, mu, W, block_info=None):
    """:func:`_project` of one Dask chunk, raising for NaN/inf rows with their row numbers."""
    out = _project(x, mu, W)
    check_finite_output(out, x, *row_origin(block_info))
    return out


def _reconstruct_block(y, B, mu):
    return np.asarray(y, dtype=B.dtype) @ B + mu


_CLASSES = {"PCA": PCA, "FairPCA": FairPCA}


def load(path):
    """Load a model written by ``save``; reads only .npz arrays and JSON, never pickle.

    Everything is checked before it is trusted: meta.json's keys and types for the model's
    class, the declared shape of every array against the others (before any is read) and
    their values (finite, orthonormal components).  A truncated, edited or inconsistent
    model raises :class:`dfairpca.io.SavedFileError` naming the file and what is wrong.
    """
    from .io import SavedFileError, load_arrays

    path = Path(path)
    arrays, meta = load_arrays(path / "model", kind="estimator", layout=_saved_layout)
    try:
        if meta["class"] == "FairKernelPCA":
            from .kernel import FairKernelPCA

            return FairKernelPCA._from_saved(arrays, meta)
        cls = _CLASSES[meta["class"]]
        est = cls(**meta["params"])
        for a in cls._array_attrs:
            setattr(est, a, arrays.get(a))
        for a in cls._meta_attrs:
            if a in meta:
                setattr(est, a, meta[a])
        est._restore_extra(meta, arrays)
        _check_saved_values(est)
    except ValueError as exc:
        raise SavedFileError(f"cannot load {str(path / 'model')!r}: {exc}; it was edited or "
                             "not written by dfairpca: save the model again") from None
    if (path / "statistics").exists():
        stats = Moments.load(path / "statistics")
        p = len(getattr(est, "groups_", []))
        if stats.n_features != est.n_features_in_ or len(stats.attributes) != p:
            raise SavedFileError(
                f"cannot load {str(path)!r}: statistics/ hold {stats.n_features} features and "
                f"{len(stats.attributes)} attributes, the model {est.n_features_in_} and {p}; "
                "they were not saved together: save the model again"
            )
        est.statistics_ = stats
    return est


#: the classes a saved model may name: the allow-list (FairKernelPCA lives in kernel.py,
#: which imports this module)
SAVED_CLASSES = (*_CLASSES, "FairKernelPCA")


def _saved_layout(meta: dict, headers: dict) -> dict:
    """Check a saved estimator's meta.json for its class; the arrays it implies."""
    from .io import meta_value

    name = meta_value(meta, "class", SAVED_CLASSES)
    if name == "FairKernelPCA":
        from .kernel import FairKernelPCA

        return FairKernelPCA._saved_layout(meta, headers)
    cls = _CLASSES[name]
    saved_params(cls, meta)
    d = meta_value(meta, "n_features_in_", "positive")
    k = meta_value(meta, "n_components_", "positive")
    meta_value(meta, "n_samples_seen_", "count")
    if k > d:
        raise ValueError(f"meta.json: 'n_components_' {k} exceeds 'n_features_in_' {d}")
    specs = {"components_": ((k, d), "f"), "mean_": ((d,), "f"),
             "scale_": ((d,), "f" if meta["params"].get("standardize") else "?f"),
             "explained_variance_": ((k,), "f"), "explained_variance_ratio_": ((k,), "f")}
    if cls is FairPCA:
        ms = saved_groups(meta)
        saved_certificate(meta, len(ms))
        r = meta_value(meta, "n_constraints_", "count")
        meta_value(meta, "max_components_", "int")
        if r + k > d:
            raise ValueError(f"meta.json: {k} components and {r} constraints exceed {d} features")
        specs["constraint_basis_"] = ((d, r), "f")
        specs["standard_components_"] = ((k, d), "?f")
        for j, m in enumerate(ms):
            specs[f"group_means_{j}"] = ((m, d), "f")
    return specs


def saved_params(cls, meta: dict) -> dict:
    """meta.json's ``params``, checked to be ``cls``'s parameters with valid values."""
    from .io import meta_value

    params = meta_value(meta, "params", "dict")
    unknown = sorted(set(params) - set(cls._get_param_names()))
    if unknown:
        raise ValueError(f"meta.json: 'params' has keys {unknown} that {cls.__name__} does not take")
    try:
        cls(**params)._check_params()
    except (ValueError, TypeError) as exc:
        raise ValueError(f"meta.json: 'params': {exc}") from None
    return params


def saved_certificate(meta: dict, p: int) -> None:
    """Check meta.json's fairness certificate: ``fairness_violation_`` a number >= 0 and
    ``fairness_violation_per_attribute_`` p of them (both absent in models saved before
    fits were certified)."""
    from .io import meta_value

    total = meta_value(meta, "fairness_violation_", "number", optional=True)
    per = meta_value(meta, "fairness_violation_per_attribute_", "list", optional=True)
    if total is None and per is None:
        return
    ok = (total is not None and per is not None and total >= 0 and len(per) == p
          and all(isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v <= total
                  for v in per))
    if not ok:
        raise ValueError(f"meta.json: 'fairness_violation_' {total!r:.40} and "
                         f"'fairness_violation_per_attribute_' {per!r:.80} must be a number >= 0 "
                         f"and {p} numbers between 0 and it")


def saved_groups(meta: dict) -> list[int]:
    """Group counts of each attribute from meta.json's ``groups_`` and ``attribute_names_``."""
    from .io import meta_value

    groups = meta_value(meta, "groups_", "list")
    names = meta_value(meta, "attribute_names_", "list")
    if not groups or len(names) != len(groups) or not all(isinstance(n, str) for n in names):
        raise ValueError(f"meta.json: 'attribute_names_' must name each of the {len(groups)} "
                         f"attributes of 'groups_' (at least one); got {names!r:.80}")
    return saved_group_counts(groups, "groups_", [repr(n) for n in names])


def _check_saved_values(est) -> None:
    """ValueError if a loaded PCA/FairPCA's values contradict what a fit gives (O(k^2 d))."""
    U, tol = est.components_, 1e-6
    problem = (
        "the rows of 'components_' are not orthonormal"
        if np.abs(U @ U.T - np.eye(len(U))).max() > tol else
        "'explained_variance_' has negative entries"
        if (est.explained_variance_ < -tol * max(1.0, est.explained_variance_.max())).any() else
        "'scale_' has entries <= 0"
        if getattr(est, "scale_", None) is not None and (est.scale_ <= 0).any() else None
    )
    Q = getattr(est, "constraint_basis_", None)
    if problem is None and Q is not None and Q.size and np.abs(U @ Q).max() > tol:
        problem = "'components_' are not orthogonal to 'constraint_basis_' (the model is not fair)"
    if problem:
        raise ValueError(f"arrays.npz: {problem}")
