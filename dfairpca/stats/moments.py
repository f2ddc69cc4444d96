"""Additive statistics of a data set: the only thing a linear (fair) PCA needs.

Every estimator in dfairpca depends on the rows of ``X`` only through

* ``n``, the mean and the scatter matrix about the mean (``sum (x - mean)(x - mean)^T``),
* for every group of every protected attribute: its size and its mean,
* optionally (Fair PCA-S), for every group: its scatter matrix about its own mean.

:class:`Moments` holds them, complete: every matrix is a full symmetric float64 array,
and nothing about it changes once built.  The randomized fit's first pass
(``dfairpca.engine._thin_pass``), which never forms a d x d matrix, returns a Moments without
the scatter (``scatter=None``) that holds its diagonal instead (:attr:`Moments.diagonal`),
and the numeric attributes' rows of it (:attr:`Moments.cross`); every derived rule reads
the diagonal through :attr:`Moments.scatter_diagonal`, whichever form it is in.  It is built from one chunk of rows with
:meth:`Moments.from_chunk` and two of them are combined with :func:`merge`; the statistics
of a union are exactly the merge of the parts' statistics, which is what lets a fit be a
single pass over the chunks of a Dask array, a sequence of ``partial_fit`` calls, or a
resumed pass.  The numerics (the pairwise update, float32 products summed in float64, data
of extreme magnitude) are those of :mod:`dfairpca.stats._sums` and :mod:`dfairpca.stats._chunk`; a
pass keeps its running total in its own form (``dfairpca.engine._accumulator``) and hands over a
:class:`Moments` at the end.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from ._chunk import OVERFLOW_MESSAGE, chunk_sums
from ._exact import ExactSums, kernel_name, merge_exact
from ._derived import constraint_matrix, deviation_floor
from ._problem import Problem
from ._sums import DENSE, Sums, fill_lower, merge_sums, nbytes
from ..base._compat import fill_new_fields
from ..base._typing import PathInput
from ..errors import InvalidInputError, InvalidTypeError
from ..inputs._weights import too_few_samples
from ..io import moments_layout, read_saved, save_arrays, saved_fields, sums_to_arrays

# Deferred imports: dask (heavy or optional) is imported in the functions that use it, so that
# importing this module stays light.

__all__ = ["Moments", "AttributeMoments", "merge", "exact_moments", "constraint_matrix", "deviation_floor"]


@dataclass(frozen=True)
class AttributeMoments:
    """Per-group statistics of one protected attribute.

    Attributes
    ----------
    categories : ndarray of shape (m,)
        The group labels, sorted.
    counts : ndarray of int64, shape (m,)
        Rows per group (weighted statistics: float64 total weight per group).
    deviation : ndarray of float64, shape (m, d)
        ``mean of the group - mean of all rows`` (zero for an empty group).
    scatter : ndarray of float64, shape (m, d, d) or None
        Scatter of each group about its own mean (zero for an empty group); only kept
        when asked for (Fair PCA-S).
    """

    categories: np.ndarray
    counts: np.ndarray
    deviation: np.ndarray
    scatter: np.ndarray | None = None

    @property
    def n_groups(self) -> int:
        return len(self.categories)


@dataclass(frozen=True)
class Moments:
    """Additive first and second moments of a set of rows, overall and per group.

    Build with :meth:`from_chunk` (or :func:`dfairpca.compute_moments` for whole arrays)
    and combine with :func:`merge` or ``a.merge(b)``; every method returns new arrays or
    views and leaves the object as it is.

    Attributes
    ----------
    n : int or float
        Number of rows; for weighted rows (``sample_weight``, frequency weights) the total
        weight, a float, which takes the place of the count in every formula (a row of
        weight 2 counts as two copies of itself).
    mean : ndarray of float64, shape (d,)
        The (weighted) mean.
    scatter : ndarray of float64, shape (d, d), or None
        ``sum_i w_i (x_i - mean)(x_i - mean)^T`` (``w_i = 1`` without weights; symmetric;
        see :attr:`scatter_exponent`).  None for the first-order statistics of a randomized
        fit (:attr:`diagonal` holds its diagonal), which cannot be merged, saved, nor give a
        covariance.
    attributes : list of AttributeMoments
        One entry per protected attribute (empty for plain PCA).
    n_nonfinite : int
        Rows that held NaN or infinity (they are left out of every sum).
    nonfinite_rows : list of int
        The first few of those rows, as global row indices.
    precision : float
        Machine epsilon of the coarsest dtype any part's products ran in (the scatter
        matrices' relative precision; the means and group deviations are float64 sums
        whatever the products ran in, see :meth:`deviation_floor`).
    scatter_exponent : int
        The scatter matrices hold ``true * 4**-scatter_exponent``.  0 (true values) unless
        column spreads are beyond about 1e+-90, as for ``X * 1e-170`` whose true scatter
        float64 cannot hold; :meth:`covariance` is in true units (as far as float64 holds
        them), ratios of the stored values are exact.
    n_rows : int or None
        Weighted statistics: the rows of positive weight (:attr:`rows`); None for
        unweighted ones, whose ``n`` counts the rows.
    exact : ExactSums or None
        With ``compute_dtype="exact"`` (integer data): the raw integer sums these
        statistics were derived from (:mod:`dfairpca.stats._exact`), so that merges of
        exact statistics add integers and stay bit-identical whatever their order.
        None otherwise (and after a merge with statistics that are not exact).
    diagonal : ndarray of float64, shape (d,), or None
        Without :attr:`scatter` only: its diagonal, ``sum (x - mean)^2`` per column (stored
        units, :attr:`scatter_exponent`); read either form with :attr:`scatter_diagonal`.
    numeric : ndarray of int, shape (q,)
        Without :attr:`scatter` only: the columns that are numeric protected attributes
        (empty otherwise: the scatter holds their rows).
    cross : ndarray of float64, shape (q, d), or None
        Without :attr:`scatter` only: the scatter's rows of the :attr:`numeric` columns,
        ``sum (z - mean z)(x - mean x)`` of each against every column (stored units).
    """

    n: int | float
    mean: np.ndarray
    scatter: np.ndarray | None
    attributes: list[AttributeMoments] = field(default_factory=list)
    n_nonfinite: int = 0
    nonfinite_rows: list[int] = field(default_factory=list)
    precision: float = float(np.finfo(np.float64).eps)
    scatter_exponent: int = 0
    n_rows: int | None = None
    exact: Any = field(default=None, repr=False, compare=False)
    diagonal: np.ndarray | None = field(default=None, repr=False)
    numeric: np.ndarray = field(default_factory=lambda: np.zeros(0, np.intp), repr=False)
    cross: np.ndarray | None = field(default=None, repr=False)

    def __setstate__(self, state: dict) -> None:
        """Unpickle, giving the fields an older dfairpca did not have their defaults (a model
        pickled with its statistics must keep working after an upgrade)."""
        self.__dict__.update(fill_new_fields(self, state))

    # ------------------------------------------------------------------ building
    @classmethod
    def empty(cls, d: int, categories: Sequence[np.ndarray] = (), group_scatter: bool = False) -> "Moments":
        """Statistics of zero rows with ``d`` features.

        Parameters
        ----------
        d : int
            Number of features.
        categories : sequence of arrays
            Labels of the groups of each protected attribute (one array per attribute).
        group_scatter : bool
            Also hold every group's (zero) scatter matrix (Fair PCA-S).

        Returns
        -------
        Moments
            The statistics of no rows: the identity of :func:`merge`.
        """
        attrs = [AttributeMoments(np.asarray(c), np.zeros(len(c), np.int64), np.zeros((len(c), d)),
                                  np.zeros((len(c), d, d)) if group_scatter else None)
                 for c in categories]
        return cls(0, np.zeros(d), np.zeros((d, d)), attrs)

    @classmethod
    def from_chunk(
        cls,
        x: npt.ArrayLike,
        codes: npt.ArrayLike | None = None,
        categories: Sequence[np.ndarray] = (),
        *,
        mask: npt.ArrayLike | None = None,
        row_offset: int = 0,
        dtype: npt.DTypeLike | None = None,
        group_scatter: bool = False,
        sample_weight=None,
    ) -> "Moments":
        """Statistics of one chunk of rows.

        Parameters
        ----------
        x : array of shape (r, d) (or (r, h, w), flattened)
            Any real dtype; cast to ``dtype`` for the products.
        codes : int array of shape (r, p), optional
            Group index of every row for each of the p attributes, in ``0 .. m_j - 1``.
        categories : sequence of p arrays
            Labels of the groups of each attribute (stored, not used to compute).
        mask : bool array of shape (r,), optional
            Rows to use (equal opportunity keeps only the rows with ``y == 1``).
        row_offset : int
            Global index of the chunk's first row, for the NaN report.
        dtype : numpy float dtype or "exact", optional
            Dtype of the chunk's products; float64 sums regardless.  Defaults to float64.
            "exact" (integer or boolean x): exact integer sums, see :attr:`exact`.
        group_scatter : bool
            Also keep every group's scatter matrix (needed by Fair PCA-S only).
        sample_weight : array of shape (r,), optional
            Frequency weights (finite, >= 0): weighted statistics (see :attr:`n`).

        Returns
        -------
        Moments
            The statistics of the chunk's rows (those of ``mask``, finite ones only).
        """
        s = chunk_sums(x, codes, categories, mask=mask, row_offset=row_offset, dtype=dtype,
                       group_scatter=group_scatter, weights=sample_weight)
        if isinstance(s, ExactSums):
            return exact_moments(s)
        # the products are upper triangles in their dtype: complete them in float64
        s.scatter = fill_lower(np.asarray(s.scatter, dtype=np.float64))
        for a in s.attributes:
            if a.scatter is not None:
                a.scatter = DENSE.groups([None if G is None else fill_lower(np.asarray(G, np.float64))
                                          for G in a.scatter], len(s.mean))
        return cls._from_sums(s)

    @classmethod
    def _from_sums(cls, s: Sums) -> "Moments":
        """The Moments of complete sums (every matrix a full symmetric float64 array)."""
        attrs = [AttributeMoments(a.categories, a.counts, a.deviation, a.scatter) for a in s.attributes]
        return cls(s.n, s.mean, s.scatter, attrs, s.n_nonfinite, list(s.nonfinite_rows),
                   s.precision, s.scatter_exponent, s.n_rows)

    # ------------------------------------------------------------------ combining
    def merge(self, *others: "Moments") -> "Moments":
        """Statistics of the union of ``self`` and ``others`` (see :func:`merge`).

        Parameters
        ----------
        *others : Moments
            Statistics of other rows.

        Returns
        -------
        Moments
            The statistics of all the rows; ``self`` and ``others`` are left as they are.
        """
        return merge([self, *others])

    # ------------------------------------------------------------------ derived
    @property
    def n_features(self) -> int:
        return self.mean.shape[0]

    @property
    def rows(self) -> int:
        """Rows the statistics hold (of positive weight, for weighted ones)."""
        return int(self.n if self.n_rows is None else self.n_rows)

    @property
    def n_effective(self) -> int:
        """The sample count that bounds the rank (``n_components=None`` keeps
        ``min(n_effective, d)``): n; for weighted statistics the larger of the rows and the
        whole part of the total weight, so that integer weights give what the repeated rows
        give (and weights below 1 still count every row)."""
        if self.n_rows is None:
            return int(self.n)
        return max(int(self.n_rows), int(np.floor(self.n)))

    @property
    def weighted(self) -> bool:
        """Whether these are statistics of weighted rows (``sample_weight``)."""
        return self.n_rows is not None

    @property
    def scatter_diagonal(self) -> np.ndarray:
        """``diag(scatter)``, per column ``sum (x - mean)^2`` in stored units (see
        :attr:`scatter_exponent`), whether the scatter is held or only its diagonal."""
        if self.scatter is None:
            assert self.diagonal is not None  # statistics without the scatter hold its diagonal
            return self.diagonal
        return np.diag(self.scatter)

    def full_scatter(self) -> np.ndarray:
        """The d x d scatter; an error naming the fix for the first-order statistics of a
        randomized fit, which do not hold it.

        Returns
        -------
        ndarray of float64, shape (d, d)
            :attr:`scatter`.
        """
        if self.scatter is None:
            raise InvalidInputError(
                "these are the first-order statistics of a randomized fit (svd_solver="
                "'randomized'), which hold no d x d scatter; compute complete ones with "
                "dfairpca.compute_moments, or fit with svd_solver='full'")
        return self.scatter

    @property
    def has_group_scatter(self) -> bool:
        return bool(self.attributes) and all(a.scatter is not None for a in self.attributes)

    def covariance(self, ddof: int = 1) -> np.ndarray:
        """Sample covariance ``scatter / (n - ddof)`` (true units, whatever :attr:`scatter_exponent`).

        Parameters
        ----------
        ddof : int
            Delta degrees of freedom: 1 for the unbiased estimate, 0 for the maximum
            likelihood one.

        Returns
        -------
        ndarray of float64, shape (d, d)
            The covariance matrix.
        """
        return np.ldexp(self.full_scatter() / max(self.n - ddof, 1), 2 * self.scatter_exponent)

    def second_moment(self) -> np.ndarray:
        """Uncentred ``X^T X / n`` (the paper's objective without centring).

        Returns
        -------
        ndarray of float64, shape (d, d)
            The second moment matrix, in true units.
        """
        S = np.ldexp(self.full_scatter() / self.n, 2 * self.scatter_exponent)
        return S + np.outer(self.mean, self.mean)

    def columns(self, keep: np.ndarray) -> "Moments":
        """The statistics of the columns ``keep`` of the rows these were computed from
        (every statistic restricts column-wise; the rows, counts and precision stay; without
        the scatter, the numeric attributes' :attr:`cross` sums are dropped).

        Parameters
        ----------
        keep : int or bool array
            The columns to keep (indices, or a mask of length d), in the order given.

        Returns
        -------
        Moments
            The statistics of those columns.
        """
        ix = np.ix_(keep, keep)
        attrs = [replace(a, deviation=a.deviation[:, keep],
                         scatter=None if a.scatter is None else a.scatter[:, keep][:, :, keep])
                 for a in self.attributes]
        exact = None if self.exact is None else self.exact.columns(keep)
        if self.scatter is None:
            assert self.diagonal is not None  # statistics without the scatter hold its diagonal
            return replace(self, mean=self.mean[keep], diagonal=self.diagonal[keep], attributes=attrs,
                           exact=exact, numeric=np.zeros(0, np.intp), cross=None)
        return replace(self, mean=self.mean[keep], scatter=self.scatter[ix], attributes=attrs,
                       exact=exact)

    def group_means(self, attribute: int = 0) -> np.ndarray:
        """Mean of every group of one attribute.

        Parameters
        ----------
        attribute : int
            Index of the protected attribute.

        Returns
        -------
        ndarray of float64, shape (m, d)
            Row g is the mean of group g (``attributes[attribute].categories[g]``).
        """
        return self.mean + self.attributes[attribute].deviation

    def constraint_matrix(self) -> np.ndarray:
        """``Z_comb^T X`` of the paper (Sec. 3.4/3.5), see :func:`constraint_matrix`.

        Returns
        -------
        ndarray of float64, shape (sum of m_r, d)
            Rows ``n_g (mean_g - mean)``, whose row space fair PCA is orthogonal to.
        """
        return constraint_matrix(self.attributes, self.n_features)

    def deviation_floor(self) -> np.ndarray:
        """Per feature: the size below which a group-mean deviation is float64 rounding
        (:func:`deviation_floor`).

        Returns
        -------
        ndarray of float64, shape (d,)
            The floor of each feature, in true units.
        """
        return deviation_floor(self.n, self.mean, self.scatter_diagonal, self.scatter_exponent,
                               terms=self.n_rows)

    def problem(self, numeric: npt.ArrayLike | None = None, *, complete: bool = True) -> Problem:
        """Everything a solve reads of these statistics (:class:`Problem`), the columns
        ``numeric`` (default: :attr:`numeric`) being numeric protected attributes and the
        others the features; refused where no solve can use them.

        Parameters
        ----------
        numeric : sequence of int, optional
            Columns that are numeric protected attributes.
        complete : bool, default True
            Whether the solve needs the d x d scatter (an error naming the fix for the
            first-order statistics of a matrix-free fit); False for the matrix-free solve.

        Returns
        -------
        Problem
            The features' moments and the raw constraint, as plain arrays.
        """
        num = self.numeric if numeric is None else np.asarray(numeric, np.intp)
        keep = np.setdiff1d(np.arange(self.n_features), num)
        f = self.columns(keep) if len(num) else self
        if not (np.all(np.isfinite(f.mean)) and np.all(np.isfinite(f.scatter_diagonal))):
            raise InvalidInputError(OVERFLOW_MESSAGE)
        S = f.full_scatter() if complete else f.scatter
        if self.scatter is None:  # first-order: the numeric attributes' rows are kept apart
            cross = self.cross[:, keep] if len(num) and self.cross is not None else np.zeros((0, len(keep)))
            own = self.scatter_diagonal[num]
            spread = float(f.scatter_diagonal.sum())
        else:
            cross, own = self.scatter[np.ix_(num, keep)], np.diagonal(self.scatter)[num]
            spread = float(np.trace(f.full_scatter()))
        problem = Problem(
            f.n, f.n_rows, f.rows, f.n_effective, f.precision, f.mean, f.scatter_diagonal, S,
            f.scatter_exponent, kernel_name(f), [a.categories for a in f.attributes],
            [a.counts for a in f.attributes], [f.mean + a.deviation for a in f.attributes],
            [a.scatter for a in f.attributes] if f.has_group_scatter else None,
            constraint_matrix(f.attributes, f.n_features),
            deviation_floor(f.n, f.mean, f.scatter_diagonal, f.scatter_exponent, terms=f.n_rows),
            cross, own, self.mean[num], spread)
        # a variance needs two samples (weighted statistics may hold less weight than the
        # rows they saw, which only the pass can tell)
        if problem.n < 2:
            raise InvalidInputError(too_few_samples(problem.n, problem.n_rows))
        return problem

    def check_finite(self) -> None:
        """Raise ``ValueError`` (an :class:`~dfairpca.errors.InvalidInputError`) naming the
        first rows (``nonfinite_rows``, global indices) if any row held NaN or infinity."""
        if self.n_nonfinite:
            rows = ", ".join(map(str, self.nonfinite_rows))
            more = ", ..." if self.n_nonfinite > len(self.nonfinite_rows) else ""
            raise InvalidInputError(
                f"X contains NaN or infinity in {self.n_nonfinite} row(s) (rows {rows}{more}); "
                "drop or impute them before fitting, e.g. with dask.array.nan_to_num or "
                "sklearn.impute.SimpleImputer."
            )

    # ------------------------------------------------------------------ persistence
    def to_arrays(self) -> tuple[dict, dict]:
        """(arrays, metadata) for saving without pickle; inverse of :meth:`from_arrays`.

        Returns
        -------
        arrays : dict of str to ndarray
            Every numeric field, by name.
        meta : dict
            The JSON-serialisable rest (labels, counts of non-finite rows, precision).
        """
        scatter = self.full_scatter()
        arrays, meta = sums_to_arrays(self, lambda a: a.scatter)
        arrays["scatter"] = scatter
        if self.exact is not None:  # the raw integer sums travel with them
            more, extra = self.exact.to_arrays()
            arrays.update(more)
            meta.update(extra)
        return arrays, meta

    @classmethod
    def from_arrays(cls, arrays: Mapping[str, np.ndarray], meta: dict[str, Any]) -> "Moments":
        """The statistics that :meth:`to_arrays` gave ``(arrays, meta)`` of.

        Parameters
        ----------
        arrays : mapping of str to array
            The arrays of :meth:`to_arrays`.
        meta : dict
            Its metadata.

        Returns
        -------
        Moments
            The statistics, exact integer sums included where they were saved.
        """
        f = saved_fields(arrays, meta)
        attrs = [AttributeMoments(*a) for a in f.pop("attributes")]
        exact = ExactSums.from_arrays(arrays, meta, [a.categories for a in attrs],
                                      [a.counts for a in attrs])
        return cls(scatter=np.asarray(arrays["scatter"]), attributes=attrs, exact=exact, **f)

    def save(self, path: PathInput, *, overwrite: bool = False) -> None:
        """Save to a directory (``.npz`` arrays + JSON), atomically; see :mod:`dfairpca.io`.

        Parameters
        ----------
        path : str or os.PathLike
            The directory to write (local, or a URL such as ``s3://bucket/key``).
        overwrite : bool
            Replace statistics saved by dfairpca at ``path``; nothing else is replaced.
        """
        arrays, meta = self.to_arrays()
        save_arrays(path, arrays, {"kind": "Moments", **meta}, overwrite=overwrite)

    @classmethod
    def load(cls, path: PathInput) -> "Moments":
        """Read what :meth:`save` wrote, checked first (:class:`dfairpca.io.SavedFileError`
        names the file and what is wrong); never unpickles.

        Parameters
        ----------
        path : str or os.PathLike
            The directory :meth:`save` wrote.

        Returns
        -------
        Moments
            The saved statistics.
        """
        arrays, meta = read_saved(path, moments_layout)
        if "scatter" not in arrays:
            raise InvalidInputError(
                f"{str(path)!r} holds the running total of an unfinished pass (a checkpoint's "
                "'total'), not complete statistics: run the same compute_moments_checkpointed "
                "call again, which finishes the pass and returns them"
            )
        return cls.from_arrays(arrays, meta)


def merge(parts: Sequence[Moments] | Moments, *more: Moments) -> Moments:
    """Statistics of the union of several parts.

    Exact (up to rounding) for any split of the rows; parts may have seen different group
    labels, which are aligned onto the sorted union.  Parts with ``n == 0`` contribute
    only their NaN bookkeeping.  The parts are left as they are.  When every part holds
    exact integer sums (``compute_dtype="exact"``) these are added and the result is
    bit-identical for any order and grouping of the parts; otherwise the pairwise update
    of :mod:`dfairpca.stats._sums` combines the centred statistics.

    Parameters
    ----------
    parts : sequence of Moments, or Moments
        Statistics of disjoint sets of rows, with the same features (``merge([a, b])``;
        ``merge(a, b)`` reads the same).
    *more : Moments
        Further parts, when ``parts`` is one.

    Returns
    -------
    Moments
        The statistics of all their rows.
    """
    parts = [parts, *more] if isinstance(parts, Moments) else [*parts, *more]
    for p in parts:
        if not isinstance(p, Moments):
            raise InvalidTypeError(f"merge takes Moments (e.g. from compute_moments); got "
                                   f"{type(p).__name__}")
    for p in parts:
        p.full_scatter()  # first-order statistics (no scatter) cannot be merged
    if parts and all(getattr(p, "exact", None) is not None for p in parts):
        return exact_moments(merge_exact([p.exact for p in parts]))
    return Moments._from_sums(merge_sums(parts, DENSE))


def exact_moments(s: ExactSums) -> Moments:
    """The centred statistics of exact integer sums, keeping them as :attr:`Moments.exact`
    (so that merges of exact statistics stay exact).

    Parameters
    ----------
    s : ExactSums
        Raw integer sums (``compute_dtype="exact"``).

    Returns
    -------
    Moments
        Their centred float64 statistics, with ``exact=s``.
    """
    return replace(Moments._from_sums(s.settle().centred()), exact=s)


def _register_sizeof():
    """Tell Dask what statistics weigh (else it counts 56 bytes and never spills or
    weighs transfers when placing merges)."""
    from dask.sizeof import sizeof

    sizeof.register(Moments)(nbytes)


_register_sizeof()
