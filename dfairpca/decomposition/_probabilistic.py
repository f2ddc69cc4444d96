"""The probabilistic PCA model of a fitted linear decomposition (Tipping & Bishop 1999), as
scikit-learn's PCA has it: ``get_covariance``, ``get_precision``, ``score_samples`` and
``score``, from the components, their variances and ``noise_variance_``.
"""

from __future__ import annotations

import math

import numpy as np
import scipy.linalg
from sklearn.utils.extmath import fast_logdet
import dask.array as da

from ..engine._compute import ship
from ..inputs._validation import check_finite_input, row_origin
from ..base._typing import ArrayInput, ArrayOutput
from ._base import StatisticsEstimator

__all__ = ["ProbabilisticPCA", "noise_variance"]


class ProbabilisticPCA(StatisticsEstimator):
    """The probabilistic model of the fitted components (the base of
    :class:`~dfairpca.decomposition._linear.LinearDecomposition`, which fits them)."""

    components_: np.ndarray
    explained_variance_: np.ndarray
    mean_: np.ndarray
    scale_: np.ndarray | None
    noise_variance_: float
    whiten: bool

    def get_covariance(self) -> np.ndarray:
        """Covariance of the features under the probabilistic PCA model (Tipping & Bishop
        1999): ``components_.T @ diag(explained_variance_ - noise_variance_) @ components_
        + noise_variance_ * I``, scikit-learn's formula (also under ``whiten``), in the
        units of X (rescaled by ``scale_`` when ``standardize``).

        Returns
        -------
        ndarray of float64, shape (d, d)
            The covariance, over the columns of ``components_``.
        """
        self._check_fitted()
        U, ev, noise = self._model()
        cov = (U.T * np.where(ev > noise, ev - noise, 0.0)) @ U
        cov[np.diag_indices_from(cov)] += noise
        return cov if self.scale_ is None else cov * np.outer(self.scale_, self.scale_)

    def get_precision(self) -> np.ndarray:
        """The inverse of :meth:`get_covariance`, by the matrix inversion lemma as in
        scikit-learn (a k x k inverse).  Components whose variance is not above
        ``noise_variance_`` add nothing to the model (scikit-learn's formula gives them
        weight 0 too) and are left out of the lemma, where they would divide by 0: a fair
        component may hold less variance than the mean of the directions it leaves.

        Returns
        -------
        ndarray of float64, shape (d, d)
            The precision matrix, over the columns of ``components_``.
        """
        self._check_fitted()
        U, ev, noise = self._model()
        d = U.shape[1]
        if noise == 0.0:
            precision = scipy.linalg.inv(self.get_covariance())
            return precision
        live = ev > noise
        U, diff = U[live], (ev - noise)[live]
        precision = np.eye(d) / noise
        if len(diff):
            inner = U @ U.T / noise
            inner[np.diag_indices_from(inner)] += 1.0 / diff
            precision -= U.T @ scipy.linalg.inv(inner) @ U / noise**2
        return precision if self.scale_ is None else precision / np.outer(self.scale_, self.scale_)

    def _model(self):
        """(components, explained variances, noise variance) of the fitted space, the way
        scikit-learn's formulas take them (components scaled by sqrt(variance) when
        whitening)."""
        U, ev = self.components_, self.explained_variance_
        if self.whiten:
            U = U * np.sqrt(ev)[:, None]
        return U, ev, float(self.noise_variance_)

    def score_samples(self, X: ArrayInput) -> ArrayOutput:
        """Log-likelihood of every row of X under the probabilistic PCA model (Bishop,
        *Pattern Recognition and Machine Learning*, 12.2.1), as scikit-learn's
        ``PCA.score_samples``, of the non-sensitive columns.

        Parameters
        ----------
        X : array-like of shape (n, d) or (n, h, w)
            The data, as :meth:`transform` takes it.

        Returns
        -------
        ndarray or Dask array of float64, shape (n,)
            The log-likelihood of each row; lazy for Dask input.
        """
        self._check_fitted()
        inp = self._input(X, reset=False)
        self._check_layout(inp)
        precision = self.get_precision()
        d = precision.shape[0]
        const = -0.5 * (d * math.log(2.0 * np.pi) - fast_logdet(precision))
        args = (inp.features, self.mean_, precision, const)
        if isinstance(inp.data, da.Array):
            shipped = (*map(ship, args[:3]), const)  # the d x d precision above all
            return da.map_blocks(_loglik_block, inp.data, *shipped, drop_axis=1, dtype=np.float64,
                                 meta=np.empty((0,), np.float64))
        check_finite_input(inp.data)
        return _loglik_block(inp.data, *args)

    def score(self, X: ArrayInput, y: object = None) -> float:
        """Mean log-likelihood of the rows of X (:meth:`score_samples`).

        Parameters
        ----------
        X : array-like of shape (n, d) or (n, h, w)
            The data, as :meth:`transform` takes it.
        y : None
            Ignored; present for the scikit-learn API.

        Returns
        -------
        float
            The mean of :meth:`score_samples` over the rows.
        """
        ll = self.score_samples(X)
        return float(ll.mean().compute() if hasattr(ll, "compute") else np.mean(ll))


def noise_variance(captured: np.ndarray, total: float, rank: int) -> float:
    """Mean variance of the ``rank - k`` directions the k components leave (0 if none):
    scikit-learn's ``noise_variance_``, the probabilistic PCA model's sigma^2."""
    k = len(captured)
    if k >= rank:
        return 0.0
    return max(float(total - np.sum(captured)), 0.0) / (rank - k)


def _loglik_block(x, features, mean, precision, const, block_info=None):
    """Probabilistic PCA log-likelihood of each row of x (its columns ``features``)."""
    x = np.asarray(x)
    check_finite_input(x, *row_origin(block_info))
    xr = x[:, features].astype(np.float64) - mean
    return -0.5 * np.sum(xr * (xr @ precision), axis=1) + const
