"""The estimator :class:`PCA` on numpy, pandas, xarray, Dask and Zarr arrays; its fair
sibling :class:`~dfairpca.FairPCA` is :mod:`dfairpca.decomposition._fair`'.

Both are thin siblings on one base (:class:`dfairpca.decomposition._linear.LinearDecomposition`): check
the input, run the one-pass statistics (:mod:`dfairpca.engine._engine`), ask
:mod:`dfairpca.solve` for the solution and keep the fitted attributes.  The transform,
the probabilistic model and the save/load path are the base's.
"""

from __future__ import annotations

from typing import Self

import numpy.typing as npt

from ..base.progress import reported
from ..solve._exact import fitted_space, standard_components
from ._linear import (
    LINEAR_RULES, LinearDecomposition, n_components_ok,
)
from ..base._params import Rule, is_int
from ..solve._limits import check_rows, known, too_large
from ..io import register_model_class
from ._saved import load
from ._base import fit_context
from ..stats.moments import Moments
from ..base._typing import ArrayInput, PathInput, Seed
from ..errors import InvalidInputError

__all__ = ["PCA", "FairPCA", "load"]  # load: dfairpca.decomposition._saved's, importable from here too


@register_model_class
class PCA(LinearDecomposition):
    """Principal component analysis on the one-pass statistics engine.

    A drop-in for :class:`sklearn.decomposition.PCA` on data of any size: the same
    parameters, fitted attributes and numbers (``tests/test_sklearn.py``), computed from
    one chunked pass over numpy, pandas, xarray, Dask or Zarr input.

    Parameters
    ----------
    n_components : int, float in (0, 1), "mle" or None, default None
        Number of components k.  A float keeps the smallest k whose
        ``explained_variance_ratio_`` sums to more than it (as scikit-learn; it solves the
        whole d x d spectrum).  "mle" takes Minka's estimate of the dimension from the
        whole spectrum, scikit-learn's choice (it needs n_samples >= n_features).  None
        keeps ``min(n_samples, n_features)``.  An int above the number of rows is an error
        (raised before the pass when the rows are known).
    whiten : bool, default False
        Divide every component by the square root of its explained variance in
        ``transform`` (and multiply back in ``inverse_transform``), as scikit-learn.
    svd_solver : {"auto", "full", "covariance_eigh", "randomized"}, default "auto"
        scikit-learn's parameter.  "full" and "covariance_eigh" are the exact solve: the
        eigendecomposition of the d x d covariance accumulated in float64 by one pass
        (scikit-learn's "covariance_eigh", without its cancellation; ``eigen_solver``
        chooses how that local problem is solved).  "randomized" never forms d x d: block
        Krylov passes over X, each applying the covariance to k + ``n_oversamples``
        vectors chunk by chunk (:mod:`dfairpca.solve._randomized`), for data whose d x d does
        not fit in memory or when k is small; it needs an int ``n_components``, no
        ``partial_fit`` (``checkpoint`` saves its state after every pass).  "auto" decides
        from the shape and parameters alone, so a call chooses the same solve on every
        machine: "randomized" where its passes cost less than the exact pass by a flop
        and read model (at d = 6,400: k + n_oversamples up to 110; at d = 116,412 always),
        the exact solve otherwise
        (:func:`dfairpca.solve._choice.choose_svd_solver`); ``fitted_svd_solver_`` says which.
        An exact solve chosen so whose d x d matrices do not fit half the memory available
        (or of a worker) is an error before the pass, naming "randomized"; "full" runs it
        anyway.
    iterated_power : "auto" or int >= 0, default "auto"
        Randomized solve: an int q makes q + 2 passes over X (the first also computes the
        statistics; the Krylov space reaches the power q + 1, scikit-learn's subspace for
        ``iterated_power=q``); "auto" stops after the first pass at which the Ritz
        residuals estimate the variance still missing below 1e-4 of what the components
        capture, after scikit-learn's count (7, or 4 when k >= 0.1 min(n, d)) + 2 passes
        at most.
    n_oversamples : int >= 1, default 10
        Randomized solve: the Krylov blocks have k + n_oversamples columns (wider blocks
        cost little per pass and can save one: see benchmarks/results/randomized_202599.md).
    random_state : None, int or numpy random generator, default None
        Randomized solve: the seed of its Gaussian start block (an int seeds a
        RandomState, as in scikit-learn).  None is the seed 0, so that two fits of the same
        data give identical components (scikit-learn draws from numpy's global generator).
    center : bool, default True
        Subtract the mean.  ``False`` uses the uncentred ``X^T X`` (the paper's formula).
    standardize : bool, default False
        Divide every feature by its population standard deviation (ddof=0; features with
        zero variance are left unscaled), i.e. PCA of the correlation matrix: the same
        components, variances and transform as ``StandardScaler()`` followed by PCA.
        The probabilistic model (``get_covariance``, ``score``) is then in X's own units.
    compute_dtype : {"auto", "float32", "float64", "exact"}, default "auto"
        Dtype of the per-chunk products and of ``transform``'s output. "auto": float64 for
        float64 (and 32/64-bit integer) input, float32 otherwise.  Sums are always float64.
        float32 products of uint8 pixels are accurate to about 1e-7 relative, and their
        last bits depend on the chunking and the order of the merges.  "exact" (integer
        or boolean X): the sums of values and products are integers, summed without
        rounding and centred at the end with one rounding per entry, so the statistics
        and components are bit-identical for numpy, Dask or Zarr input, any chunking,
        cluster, ``partial_fit`` or merge order (see :doc:`/exact`); float X is refused.
        "auto" picks "exact" for 8-bit integers only where an 8-bit integer kernel passed
        its self-test and, timed against float32 products on this CPU, is not slower
        (``statistics_kernel_`` says which ran; ``DFAIRPCA_AUTO_KERNEL=exact|float32``
        forces either side).  ``transform`` output is as
        for "auto".
    split_every : int, default 8
        Fan-in of the merges that combine the pass's running sums (one per worker thread;
        each folds its share of the row chunks in place) at the end of a Dask pass.
    progress : bool, default False
        Report the fit on standard error: the pass (numpy input: one step per block of
        rows; Dask input: per task) and each phase of the solve (the eigensolve, what it
        solves and for how long).  On a terminal a bar and a line redrawn every second;
        elsewhere (a log file, a pipe) whole lines only, a few per phase
        (:mod:`dfairpca.base.progress`).
    eigen_solver : {"auto", "dense", "subspace"}, default "auto"
        The local d x d solve: LAPACK ``eigh`` (subset by index, "dense") or block subspace
        iteration with Rayleigh-Ritz ("subspace"), stopped when the captured variance
        changes by < 1e-8 relative; "auto" takes the latter for d >= 2000 and k <= d / 10
        (measured faster there).  "randomized", the old name of "subspace", still works
        with a FutureWarning (it is not the randomized SVD of ``svd_solver="randomized"``).

    Attributes
    ----------
    components_ : ndarray (k, d)
        Orthonormal rows, largest variance first, signs fixed (largest entry positive).
    explained_variance_, explained_variance_ratio_ : ndarray (k,)
        Variance along each component (ddof=1) and its share of the total variance.
    singular_values_ : ndarray (k,)
        ``sqrt((n - 1) * explained_variance_)``: the norms of the centred data's projections,
        scikit-learn's singular values of the centred X.
    noise_variance_ : float
        The mean variance of the discarded directions, ``(total variance - sum of
        explained_variance_) / (min(n, d) - k)`` (0 when k = min(n, d)): the probabilistic
        PCA model's noise, scikit-learn's definition.
    mean_ : ndarray (d,)
    scale_ : ndarray (d,) or None
    n_features_in_, n_samples_seen_, n_components_ : int
        (``n_samples_seen_``: of a weighted fit, the rows of positive weight.)
    sample_weight_sum_ : float
        Weighted fits only (``sample_weight``): the total weight, which takes the place of
        the row count in every formula (the variances divide by ``sample_weight_sum_ - 1``).
    feature_names_in_ : ndarray of str
        X's column names when X was a DataFrame with text column names.
    statistics_ : Moments
        The additive statistics the model was solved from (a randomized fit's are
        first-order only: ``scatter`` is None, ``diagonal`` holds its diagonal).
    fitted_svd_solver_ : {"covariance_eigh", "randomized"}
        The solve the fit ran (what ``svd_solver="auto"`` chose).
    statistics_kernel_ : str
        What formed the products of the statistics: ``"float32"`` or ``"float64"``
        (BLAS ``syrk`` in that dtype), or ``"exact:<kernel>"`` for exact integer
        statistics, the kernel ``"blas-exact-blocks"`` (float BLAS on blocks small enough
        to be exact) or an 8-bit integer GEMM that passed its self-test, such as
        ``"mkl-gemm-s8u8s32"`` (several joined by "+" if workers differed).
    n_passes_ : int
        Randomized fits: the passes over X they made.

    Examples
    --------
    >>> import numpy as np, dfairpca
    >>> X = np.random.default_rng(0).normal(size=(100, 5))
    >>> dfairpca.PCA(n_components=2).fit(X).transform(X).shape
    (100, 2)
    """

    _parameter_rules = {**LINEAR_RULES, "n_components": [Rule(
        lambda k: k == "mle" if isinstance(k, str) else n_components_ok(k),
        "a positive integer, a fraction in (0, 1) of the variance to keep, 'mle' or None")]}

    def __init__(self, n_components: int | float | str | None = None, *, whiten: bool = False,
                 svd_solver: str = "auto", iterated_power: int | str = "auto", n_oversamples: int = 10,
                 random_state: Seed = None, center: bool = True, standardize: bool = False,
                 compute_dtype: npt.DTypeLike = "auto", split_every: int = 8, progress: bool = False,
                 eigen_solver: str = "auto") -> None:
        self.n_components = n_components
        self.whiten = whiten
        self.svd_solver = svd_solver
        self.iterated_power = iterated_power
        self.n_oversamples = n_oversamples
        self.random_state = random_state
        self.center = center
        self.standardize = standardize
        self.compute_dtype = compute_dtype
        self.split_every = split_every
        self.progress = progress
        self.eigen_solver = eigen_solver

    @fit_context
    def fit(self, X: ArrayInput, y: object = None, *, sample_weight: ArrayInput | None = None,
            checkpoint: PathInput | None = None,
            keep_checkpoint: bool = False, timeout: float | None = None) -> Self:
        """Fit on X in one pass.

        Parameters
        ----------
        X : array-like of shape (n, d) or (n, h, w)
            numpy, pandas, xarray, Dask or Zarr array (or a path to a Zarr array).
        y : None
            Ignored; present for the scikit-learn API.
        sample_weight : array-like of shape (n,), optional
            Frequency weights of the rows (numpy, pandas, Dask or Zarr; finite, >= 0, not
            all 0): a row of weight w counts as w copies of itself, so integer weights
            equal repeated rows and weight 0 a dropped row.  The mean, covariance
            (denominator ``sum(w) - 1``) and every fitted attribute are the weighted ones;
            ``n_samples_seen_`` counts the rows of positive weight, ``sample_weight_sum_``
            is the total weight.  The exact solve only (``svd_solver="randomized"`` is
            refused).
        checkpoint : str or os.PathLike, optional
            A directory where the pass saves its running statistics after every segment of
            chunks (a randomized fit: its state after every pass); a fit interrupted
            (Ctrl-C raises :class:`~dfairpca.engine.checkpoint.PassInterrupted`) and run
            again with the same checkpoint skips the finished segments, after checking that
            their rows are the ones it folded (see :mod:`dfairpca.engine.checkpoint`; other
            data is refused with :class:`~dfairpca.engine.checkpoint.CheckpointMismatch`).
        keep_checkpoint : bool, default False
            Keep the checkpoint after a successful fit; by default it is deleted then.
        timeout : float, optional
            Seconds the fit waits once every worker of the active Client has left (new
            workers that join within it take over); then it stops with
            :class:`~dfairpca.cluster.WorkersLost`, which says what ``checkpoint`` holds.
            Every worker paused for memory that long ends it the same way
            (:class:`~dfairpca.cluster.WorkersPaused`); a pass no worker can hold below
            its pause threshold is refused before it starts
            (:class:`~dfairpca.cluster.WorkersTooSmall`).
            It also bounds each read of a remote store (``s3://``), by a distributed
            Client's workers or Dask's threaded or synchronous scheduler: one unanswered
            that long ends the fit with :class:`~dfairpca.io.StoreTimeout`, naming the
            store.
            Default None: it waits for new workers as long as it takes, and for a store as
            long as its file system retries.  Either way a worker restarted by its nanny is
            replaced by the new one; a lost scheduler
            (:class:`~dfairpca.cluster.SchedulerLost`) and a chunk that kills every
            worker that runs it (:class:`~dfairpca.cluster.WorkerKilled`) end the fit,
            saying what ``checkpoint`` holds.

        Returns
        -------
        self : PCA
            The fitted estimator.
        """
        return self._fit(X, sample_weight=sample_weight, checkpoint=checkpoint,
                         keep_checkpoint=keep_checkpoint, timeout=timeout)

    @fit_context
    def validate_fit(self, X: ArrayInput, y: object = None, *,
                     sample_weight: ArrayInput | None = None) -> None:
        """Raise the error ``fit(X, y)`` would raise for the parameters and X's shape.

        Reads no data of X (only the row counts of a Dask array of unknown chunk sizes):
        the command line calls it before it connects to a cluster.

        Parameters
        ----------
        X : array-like of shape (n, d) or (n, h, w)
            The data ``fit`` would be given.
        y : None
            Ignored; present for the scikit-learn API.
        sample_weight : array-like of shape (n,), optional
            The weights ``fit`` would be given (checked: finite, >= 0, not all 0).
        """
        self._validate_fit(X, sample_weight=sample_weight)

    @fit_context
    def fit_statistics(self, statistics: Moments) -> Self:
        """Solve from precomputed (e.g. merged or loaded) statistics.

        Parameters
        ----------
        statistics : Moments
            Statistics of the rows to fit (:func:`dfairpca.compute_moments`,
            :func:`dfairpca.merge`, :meth:`Moments.load`).

        Returns
        -------
        self : PCA
            The fitted estimator.
        """
        return self._fit_statistics(statistics)

    @reported
    def _fit_statistics(self, statistics: Moments) -> Self:
        """:meth:`fit_statistics`, the parameters checked already (by the public call)."""
        self._check_k(statistics.n_features, statistics.n_effective)
        S, scale, e = fitted_space(statistics.problem(), self.center, self.standardize)
        U = standard_components(S, statistics.n, self.n_components, self._eigen_solver,
                                rows=statistics.n_effective if statistics.weighted else None)
        self._set_fitted(statistics, U, S, scale, e)
        return self

    def _check_input(self, f, partial: bool) -> None:
        self._check_k(f.data.shape[1], None if partial else f.n_rows)  # rows known, also of a filtered Dask X

    def _check_k(self, d, n=None):
        """Raise unless ``n_components <= min(n, d)`` (n: rows, when known)."""
        k = self.n_components
        if k == "mle" and known(n) and n < d:
            raise InvalidInputError(f"n_components='mle' needs at least as many rows as features (Minka's "
                             f"estimate uses the whole spectrum); X has {int(n)} rows and {d} "
                             "features: pass an int, a fraction or None")
        if not is_int(k):
            return
        if k > d:
            raise too_large(k, f"X has {d} features")
        check_rows(k, n, min(d, n) if known(n) else d, "rows")


# FairPCA was defined here: pickles of it name this module (imported after PCA so that the
# registry lists PCA first)
from ._fair import FairPCA  # noqa: E402
