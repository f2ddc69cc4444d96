"""Input checking: data arrays and estimator input, before any heavy work.

Group labels and targets (``sensitive_features``, ``y``) are :mod:`dfairpca.inputs._groups`'.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any
import warnings

import numpy as np

from ..base._params import Check, is_int, outside_stacklevel
from ..base._system import rows_per_block
from ..errors import InvalidInputError, InvalidTypeError, NumericAttributeWarning

# Deferred imports: dask, pandas, scipy, sklearn, xarray, zarr (heavy or optional) and package
# modules that load such libraries, or this module, at import are imported in the functions that use
# them, so that importing this module stays light.

__all__ = [
    "as_data", "check_n_features", "check_finite_output",
    "check_finite_input", "row_origin", "check_input", "Input", "is_dask", "is_lazy", "is_xarray",
    "sensitive_columns", "check_ids", "unique_columns", "MAX_ROWS_SHOWN", "SENSITIVE_IDS",
]

#: how many offending rows an error message lists
MAX_ROWS_SHOWN = 10


def is_dask(x) -> bool:
    """Whether ``x`` is a Dask collection (array, DataFrame, Series)."""
    return type(x).__module__.startswith("dask.") or hasattr(x, "dask")


def is_xarray(x) -> bool:
    return type(x).__module__.startswith("xarray.") and hasattr(x, "dims")


def is_lazy(X) -> bool:
    """Whether X is read lazily (Dask, Zarr or a path to Zarr, also inside an xarray
    DataArray): its checks then run chunk by chunk, never on all of X at once."""
    import zarr

    if is_xarray(X):
        X = X.data
    return is_dask(X) or isinstance(X, (str, os.PathLike, zarr.Array, zarr.Group))


def as_data(X, what: str = "X"):
    """Return X as a 2-D numpy or dask array (images (n, h, w) are flattened lazily).

    Accepts numpy arrays (and anything ``np.asarray`` takes), Dask arrays, Zarr arrays,
    and a path to a Zarr array.  Nothing is read from disk here.
    """
    import dask.array as da
    import zarr

    from ..io import from_zarr

    _refuse_sparse(X, what)
    if isinstance(X, (str, os.PathLike)) or isinstance(X, (zarr.Array, zarr.Group)):
        X = from_zarr(X)
    if isinstance(X, da.Array):
        _refuse_sparse(X._meta, what, dask=True)
        arr: Any = X  # a Dask or a numpy array
    elif is_dask(X):  # dask DataFrame
        arr = X.to_dask_array(lengths=True)
    else:
        arr = np.asarray(X)
    if arr.dtype.kind not in "biuf":
        raise InvalidTypeError(
            f"{what} has dtype {arr.dtype}; need a real numeric dtype (uint8, int, float32, float64)"
        )
    if arr.ndim in (3, 4):  # images (n, height, width[, channels]): rows of h * w [* c]
        n = arr.shape[0]
        if isinstance(arr, da.Array):
            if any(len(c) > 1 for c in arr.chunks[1:]):
                arr = arr.rechunk({axis: -1 for axis in range(1, arr.ndim)})
            if np.isnan(n):  # reshape needs the row count: flatten each chunk instead
                width = math.prod(arr.shape[1:])
                arr = da.map_blocks(lambda b: b.reshape(len(b), width), arr,
                                     drop_axis=tuple(range(2, arr.ndim)),
                                     chunks=(arr.chunks[0], (width,)), dtype=arr.dtype)
        if not (isinstance(arr, da.Array) and np.isnan(n)):
            arr = arr.reshape(n, -1)
    elif arr.ndim != 2:
        raise InvalidInputError(
            f"{what} must be 2-D (n_samples, n_features) or images (n, height, width[, channels]); "
            f"got shape {arr.shape}"
        )
    if arr.shape[0] == 0 or arr.shape[1] == 0:  # scikit-learn's wording, as in check_array
        which = "sample" if arr.shape[0] == 0 else "feature"
        raise InvalidInputError(f"Found array with 0 {which}(s) (shape={arr.shape}) while a minimum of 1 "
                         f"is required; {what} needs at least one row and one feature")
    if isinstance(arr, da.Array) and len(arr.chunks[1]) > 1:
        arr = arr.rechunk({1: -1})
    if arr.dtype == bool:
        arr = arr.astype(np.uint8)
    return arr


def _refuse_sparse(X, what: str, dask: bool = False) -> None:
    """Raise for scipy.sparse or pydata ``sparse`` input, naming how to densify it.

    Centring makes every entry non-zero, so a sparse X would be densified anyway, chunk by
    chunk; np.asarray would instead wrap it in a 0-d object array (a baffling dtype error).
    """
    import scipy.sparse

    module = type(X).__module__
    if not (scipy.sparse.issparse(X) or module == "sparse" or module.startswith("sparse.")):
        return
    kind = f"a Dask array of {type(X).__name__} chunks" if dask else f"a {type(X).__name__}"
    fix = (
        "densify its chunks: X.map_blocks(lambda b: b.toarray(), dtype=X.dtype)" if dask else
        "densify it: X.toarray() if it fits in memory, or chunk by chunk with "
        "dask.array.from_array(X, chunks=(10_000, -1)).map_blocks(lambda b: b.toarray(), "
        "dtype=X.dtype)"
    )
    raise InvalidTypeError(
        f"{what} is {kind}: sparse matrices are not supported (centring makes them dense); {fix}"
    )




def row_origin(block_info, row_offset: int = 0) -> tuple[int | None, int | None]:
    """(global index of the chunk's first row or None if unknown, chunk index or None).

    ``block_info`` is what ``map_blocks`` passes (None outside it, where ``row_offset``
    holds); chunks of an array of unknown chunk sizes have no known start after the first.
    """
    if not block_info or 0 not in block_info:
        return row_offset, None
    start = block_info[0]["array-location"][0][0]
    chunk = block_info[0]["chunk-location"][0]
    if start is None or (isinstance(start, float) and np.isnan(start)):
        return None, chunk
    return int(start), chunk


def _describe_rows(local, start, chunk) -> str:
    """'rows 5, 17' (global) or 'rows 5, 17 of row chunk 3' when the start is unknown."""
    shown = local[:MAX_ROWS_SHOWN]
    more = ", ..." if len(local) > len(shown) else ""
    if start is None:
        listed = ", ".join(str(int(i)) for i in shown)
        return (f"rows {listed}{more} of row chunk {chunk}; X's chunk sizes are unknown, "
                "X.compute_chunk_sizes() first gives global row numbers")
    return "rows " + ", ".join(str(int(start + i)) for i in shown) + more


def _nonfinite_input_error(local, start, chunk) -> ValueError:
    return InvalidInputError(
        f"X contains NaN or infinity in {len(local)} row(s) ({_describe_rows(local, start, chunk)}); "
        "drop or impute them first, e.g. with dask.array.nan_to_num or "
        "sklearn.impute.SimpleImputer"
    )


def check_finite_input(x, start: int | None = 0, chunk=None, *, index=None) -> None:
    """Raise naming the rows of the chunk x that hold NaN or infinity (integers cannot);
    ``index``: X's row number of each row of x, where they are not ``start, start + 1, ...``
    (rows sampled from X)."""
    x = np.asarray(x)
    if x.dtype.kind not in "fc":
        return
    step = rows_per_block(x.shape[1])  # bounded temporaries on a large numpy X
    bad = np.concatenate([s + np.flatnonzero(~np.isfinite(x[s : s + step]).all(axis=1))
                          for s in range(0, len(x), step)] or [np.zeros(0, np.int64)])
    if len(bad):
        raise _nonfinite_input_error(bad if index is None else np.asarray(index)[bad],
                                     start if index is None else 0, chunk)


def check_finite_output(out, x, start: int | None = 0, chunk=None) -> None:
    """Raise if a projected chunk ``out = (x - mean) @ W`` holds NaN or infinity.

    The test runs on the output, (n, k), instead of the input, (n, d): it finds the same
    rows at k/d of the cost (on a 4,000 x 6,400 float32 chunk, 0.2 ms against 16 ms for
    ``np.isfinite`` on the input, 0.1% and 10% of the 164 ms projection at k = 50),
    because under IEEE arithmetic a NaN or infinite entry of x makes every output of its
    row NaN or infinite whatever its weight (NaN * w = NaN, inf * 0 = NaN).  A BLAS that skipped exact-zero weights could hide one, but then the
    entry is one the model ignores and the row's output is right for any finite value.
    Only the rows found are inspected again, to tell bad input from a projection that
    overflowed the output dtype.  Integer input can hold neither: not checked.
    """
    x = np.asarray(x) if not hasattr(x, "dtype") else x
    if np.dtype(x.dtype).kind not in "fc":
        return
    bad = np.flatnonzero(~np.isfinite(out).all(axis=1))
    if not len(bad):
        return
    rows = np.asarray(x[bad])
    nonfinite = bad[~np.isfinite(rows).all(axis=1)]
    if len(nonfinite):
        raise _nonfinite_input_error(nonfinite, start, chunk)
    big = float(np.max(np.abs(rows)))
    raise InvalidInputError(
        f"the projection of {len(bad)} row(s) ({_describe_rows(bad, start, chunk)}) overflows "
        f"{out.dtype} (entries of X up to {big:.3g}); pass compute_dtype='float64' or rescale X"
    )


def check_n_features(estimator, d: int) -> None:
    """Raise if X's d features differ from those the estimator was fitted with (in
    scikit-learn's words, as ``validate_data`` says it for numpy input)."""
    if d != estimator.n_features_in_:
        raise InvalidInputError(
            f"X has {d} features, but {type(estimator).__name__} is expecting "
            f"{estimator.n_features_in_} features as input"
        )


# ---------------------------------------------------------------------------- estimator input
@dataclass
class Input:
    """X as an estimator uses it, from :func:`check_input`.

    data : 2-D numpy or Dask array: X without its non-numeric sensitive columns (those of a
        DataFrame holding text or categories), the columns the pass reads.
    labels : the non-numeric sensitive columns (a pandas or Dask DataFrame), or None.
    numeric : positions in ``data`` of the numeric sensitive columns.
    numeric_names : their names (the column's name, or "column i").
    sensitive : positions in X of every column named by ``sensitive_feature_ids``.
    width : X's number of columns (``n_features_in_``).
    rows : ``(dimension, coordinate or None)`` of an xarray DataArray X, else None.
    """

    data: Any  # a numpy or Dask array
    labels: Any
    numeric: np.ndarray
    numeric_names: list
    sensitive: np.ndarray
    width: int
    rows: tuple | None = None

    @property
    def features(self) -> np.ndarray:
        """Positions in ``data`` of the columns that are not sensitive (the projected ones)."""
        return np.setdiff1d(np.arange(self.data.shape[1]), self.numeric)

    def wrap(self, out, names, name: str = "representation"):
        """``out`` (rows of X, one column per name) as X's container: a DataArray named
        ``name`` with X's row dimension and coordinate and a "component" dimension for a
        DataArray X."""
        if self.rows is None:
            return out
        import xarray as xr

        dim, coord = self.rows
        coords = {"component": np.asarray(names, dtype=object)}
        if coord is not None:
            coords[dim] = coord
        return xr.DataArray(out, dims=(dim, "component"), coords=coords, name=name)


def check_input(estimator, X, *, reset, min_samples: int = 1, ids=None) -> Input:
    """Check X for ``estimator`` before any heavy work and split off its sensitive columns.

    numpy, pandas and anything array-like go through scikit-learn's ``check_array`` (so
    the errors are scikit-learn's: "Reshape your data", "0 feature(s)", "n_samples", object
    and complex dtypes) and ``validate_data`` (``n_features_in_``, ``feature_names_in_``;
    a DataFrame with other or reordered columns is refused).  NaN and infinity are left to
    the pass and to ``transform``, which name the rows holding them.  Dask, Zarr (or a
    path to it) and Dask DataFrames keep dfairpca's own lazy checks (:func:`as_data`):
    nothing is read here.  An xarray DataArray is checked as its ``.data`` (lazily when
    that is a Dask array) and remembered so that the output can be one too.

    reset : True in ``fit`` (sets ``n_features_in_`` and ``feature_names_in_``), False
        afterwards (checks them), None to check X alone (``validate_fit``).
    ids : ``sensitive_feature_ids``, resolved by :func:`sensitive_columns`.
    """
    rows, columns = None, None
    if is_xarray(X):
        dims = X.dims
        if len(dims) not in (2, 3):
            raise InvalidInputError(f"X must be a 2-D DataArray (sample, feature) or 3-D images; got "
                             f"dimensions {dims}")
        # .data, never .values or np.asarray: a Dask-backed DataArray stays lazy
        rows = (dims[0], X.coords[dims[0]].data if dims[0] in X.coords else None)
        if len(dims) == 2 and dims[1] in X.coords:
            columns = np.asarray(X.coords[dims[1]].data).tolist()
        X = X.data
    if _is_dataframe(X):
        return _dataframe_input(estimator, X, reset, min_samples, ids, rows)
    if is_lazy(X):
        arr = as_data(X)
        _set_or_check_width(estimator, arr.shape[1], reset, None)
    else:
        from sklearn.utils.validation import check_array, validate_data

        _refuse_sparse(X, "X")
        arr = check_array(X, dtype="numeric", ensure_all_finite=False, allow_nd=True,
                          ensure_min_samples=min_samples, estimator=estimator, input_name="X")
        if arr.ndim in (3, 4):  # images (n, height, width[, channels])
            arr = arr.reshape(arr.shape[0], -1)
        elif arr.ndim != 2:
            raise InvalidInputError(f"X must be 2-D (n_samples, n_features) or images (n, height, "
                             f"width[, channels]); got shape {arr.shape}")
        if arr.dtype == bool:
            arr = arr.astype(np.uint8)
        if reset is not None:
            validate_data(estimator, arr, skip_check_array=True, reset=reset)
    sensitive = sensitive_columns(ids, arr.shape[1], columns)
    _check_features_left(arr.shape[1], sensitive)
    numeric_names = [_column_name(columns, i) for i in sensitive]
    if not is_lazy(arr):
        warn_integer_codes(arr, sensitive, numeric_names)
    return Input(arr, None, sensitive.copy(), numeric_names, sensitive, arr.shape[1], rows)


def _is_dataframe(X) -> bool:
    return hasattr(X, "columns") and hasattr(X, "dtypes") and hasattr(X, "iloc")


def unique_columns(columns, what: str) -> None:
    """Refuse a DataFrame ``what`` with two columns of one name: a column is taken by its
    name (``sensitive_feature_ids``, ``feature_names_in_``), and that name gives both."""
    where: dict = {}
    for j, c in enumerate(columns):
        where.setdefault(c, []).append(str(j))
    for c, js in where.items():
        if len(js) > 1:
            raise InvalidInputError(
                f"{what} has {len(js)} columns named {c!r} (columns {', '.join(js[:-1])} and "
                f"{js[-1]}): rename or drop all but one, e.g. {what}.loc[:, "
                f"~{what}.columns.duplicated()] keeps the first")


def _dataframe_input(estimator, X, reset, min_samples, ids, rows) -> Input:
    """:func:`check_input` of a pandas or Dask DataFrame: sensitive columns of text or
    categories are split off as group labels, the others checked as numbers."""
    unique_columns(X.columns, "X")
    width = len(X.columns)
    lazy = is_dask(X)
    if lazy:
        _set_or_check_width(estimator, width, reset, list(X.columns))
    elif reset is not None:
        from sklearn.utils.validation import validate_data

        validate_data(estimator, X, skip_check_array=True, reset=reset)
    sensitive = sensitive_columns(ids, width, list(X.columns))
    _check_features_left(width, sensitive)
    dtypes = list(X.dtypes)
    is_label = np.array([i in set(sensitive.tolist()) and not _numeric_dtype(dtypes[i])
                         for i in range(width)], bool)
    kept = np.flatnonzero(~is_label)
    labels = X.iloc[:, np.flatnonzero(is_label)] if is_label.any() else None
    numbers = X.iloc[:, kept]
    if lazy:
        arr = as_data(numbers)
    else:
        from sklearn.utils.validation import check_array

        arr = check_array(numbers, dtype="numeric", ensure_all_finite=False,
                          ensure_min_samples=min_samples, estimator=estimator, input_name="X")
        if arr.dtype == bool:
            arr = arr.astype(np.uint8)
    position = {int(c): j for j, c in enumerate(kept)}
    numeric = np.array([position[int(i)] for i in sensitive if int(i) in position], dtype=np.intp)
    names = [str(X.columns[i]) for i in sensitive if int(i) in position]
    if not lazy:
        warn_integer_codes(arr, numeric, names)
    return Input(arr, labels, numeric, names, sensitive, width, rows)


#: a numeric sensitive column with at most this many distinct whole values looks like
#: group codes; more than two of them are decorrelated, not equalised (see the warning)
MAX_CODES = 64


def warn_integer_codes(arr, positions, names) -> None:
    """Warn when a numeric sensitive column holds 3 to ``MAX_CODES`` distinct whole numbers.

    A numeric column z is treated as a number (the representation is made uncorrelated
    with z), which equalises the group means only for two values.  Codes 0..4 of five
    groups are then decorrelated from the code, not given equal means: a weaker constraint
    that would look right, so it is never silent.
    """
    for j, name in zip(positions, names):
        col = np.asarray(arr[:, j])
        values = np.unique(col[np.isfinite(col)]) if col.dtype.kind == "f" else np.unique(col)
        if 2 < len(values) <= MAX_CODES and np.all(values == np.round(values)):
            warnings.warn(
                f"the sensitive column {name} holds {len(values)} distinct whole numbers "
                f"({', '.join(str(v) for v in values[:6])}{', ...' if len(values) > 6 else ''}): "
                "it is treated as a number (the representation is made uncorrelated with it), "
                f"not as {len(values)} groups with equal means; to equalise the group means "
                "pass it as a categorical or text column, or as sensitive_features=",
                NumericAttributeWarning, stacklevel=outside_stacklevel(),
            )


def _numeric_dtype(dtype) -> bool:
    """Whether a DataFrame column of this dtype holds numbers (bool counts as 0/1); text,
    object and categorical columns hold group labels."""
    import pandas as pd

    return (pd.api.types.is_numeric_dtype(dtype) or pd.api.types.is_bool_dtype(dtype)) and \
        not isinstance(dtype, pd.CategoricalDtype)


def _set_or_check_width(estimator, width: int, reset, columns) -> None:
    """``n_features_in_`` and ``feature_names_in_`` of a lazily read X (``validate_data``'s
    job for numpy and pandas input)."""
    if reset is None:
        return
    names = None
    if columns is not None and columns and all(isinstance(c, str) for c in columns):
        names = np.asarray(columns, dtype=object)
    if reset:
        estimator.n_features_in_ = width
        if names is not None:
            estimator.feature_names_in_ = names
        elif hasattr(estimator, "feature_names_in_"):
            del estimator.feature_names_in_
        return
    if not hasattr(estimator, "n_features_in_"):
        return
    fitted = getattr(estimator, "feature_names_in_", None)
    if fitted is not None and names is not None and list(fitted) != list(names):
        raise InvalidInputError(
            "The feature names should match those that were passed during fit: "
            f"{list(fitted)[:10]} at fit, {list(names)[:10]} now (reordered or other columns)"
        )
    check_n_features(estimator, width)


def check_ids(ids) -> None:
    """Raise unless ``sensitive_feature_ids`` is None or a list of column names or indices
    (what can be told without X: a single name is refused, naming the list to pass)."""
    if ids is not None and (isinstance(ids, (str, bytes)) or not hasattr(ids, "__iter__")
                            or getattr(ids, "ndim", 1) == 0):  # a 0-d array: one value
        raise InvalidInputError(
            f"sensitive_feature_ids must be a list of column names or indices; got {ids!r}: "
            f"pass [{ids.item() if getattr(ids, 'ndim', None) == 0 else ids!r}]"
        )


#: the parameter rule of ``sensitive_feature_ids`` (:mod:`dfairpca.base._params`): its form,
#: before X is read; :func:`sensitive_columns` finds the columns in X
SENSITIVE_IDS = [Check(lambda est, ids: check_ids(ids))]


def sensitive_columns(ids, width: int, columns=None) -> np.ndarray:
    """Positions in X (``width`` columns, named ``columns`` or unnamed) of the columns that
    ``sensitive_feature_ids`` names: column names, or integer indices ``0 .. width - 1``."""
    if ids is None:
        return np.zeros(0, np.intp)
    check_ids(ids)
    out = []
    for i in ids:
        if columns is not None and any(_same_label(i, c) for c in columns):
            out.append(next(j for j, c in enumerate(columns) if _same_label(i, c)))
        elif is_int(i) and 0 <= int(i) < width:
            out.append(int(i))
        else:
            where = (f"X's columns are {list(columns)[:10]!r}" if columns is not None else
                     f"X has no column names; pass integer indices 0 .. {width - 1}")
            raise InvalidInputError(f"sensitive_feature_ids: {i!r} is not a column of X ({width} "
                             f"feature(s)); {where}")
    if len(set(out)) != len(out):
        raise InvalidInputError(f"sensitive_feature_ids names a column twice: {list(ids)!r}")
    return np.array(out, dtype=np.intp)


def _same_label(a, b) -> bool:
    """Whether an id names a column label: text equal to text, or an integer equal to an
    integer label (an integer matches a position only where no label is an integer)."""
    if isinstance(a, str) or isinstance(b, str):
        return isinstance(a, str) and isinstance(b, str) and a == b
    return is_int(a) and is_int(b) and int(a) == int(b)


def _column_name(columns, i) -> str:
    return str(columns[i]) if columns is not None else f"column {int(i)}"


def _check_features_left(width: int, sensitive) -> None:
    if len(sensitive) >= width:
        raise InvalidInputError(
            f"X has {width} feature(s) and sensitive_feature_ids names {len(sensitive)} of "
            "them: no feature is left to project; pass X with the features as well"
        )
