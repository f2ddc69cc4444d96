"""Protected attributes and targets: group labels of any type encoded as integer codes
per attribute, and the task label of equal opportunity, checked before any heavy work."""

from __future__ import annotations

import numbers
from dataclasses import dataclass

import numpy as np

from ._validation import MAX_ROWS_SHOWN, Input, is_dask, unique_columns
from ..errors import InvalidInputError

# Deferred imports: pandas (heavy or optional) is imported in the functions that use it, so that
# importing this module stays light.

__all__ = [
    "Groups", "require_sensitive_features", "group_labels", "encode_groups", "binary_target",
]


def _to_numpy(v):
    """Materialise small label vectors (O(n), never O(nd)) from numpy/pandas/dask."""
    if is_dask(v):
        v = v.compute()
    if hasattr(v, "to_numpy"):
        return v.to_numpy()
    return np.asarray(v)


@dataclass
class Groups:
    """Encoded protected attributes.

    codes : (n, p) int32; categories : list of p sorted label arrays; names : list of str.
    """

    codes: np.ndarray
    categories: list
    names: list

    @property
    def n_attributes(self) -> int:
        return self.codes.shape[1]

    def describe(self) -> str:
        return ", ".join(f"{nm!r} ({len(c)} groups)" for nm, c in zip(self.names, self.categories))


def require_sensitive_features(estimator, sensitive_features) -> None:
    """Refuse a fit without protected attributes; y is never taken for them.

    scikit-learn passes the task label as the second positional argument of ``fit`` (a
    Pipeline always does), so the groups travel only by keyword, the way fairlearn's
    ``sensitive_features`` do, or as columns of X (``sensitive_feature_ids``, the way
    fairlearn's CorrelationRemover takes them).
    """
    if sensitive_features is None:
        name = type(estimator).__name__
        raise InvalidInputError(
            f"{name}.fit needs the protected attribute(s) of every row: pass "
            f"fit(X, sensitive_features=z) (in a Pipeline: "
            f"{name.lower()}.set_fit_request(sensitive_features=True) with "
            f"sklearn.set_config(enable_metadata_routing=True), then "
            f"pipe.fit(X, y, sensitive_features=z)), or name their columns of X with "
            f"{name}(..., sensitive_feature_ids=[...]); y is the task label and is never used "
            "as the groups"
        )


def group_labels(estimator, inp: Input, sensitive_features):
    """The group labels of a fit: ``sensitive_features``, or the non-numeric columns of X
    named by ``sensitive_feature_ids`` (None when those are all numeric); both is an error."""
    if len(inp.sensitive):
        if sensitive_features is not None:
            raise InvalidInputError(
                f"{type(estimator).__name__} got sensitive_features= and also "
                f"sensitive_feature_ids={list(estimator.sensitive_feature_ids)!r}; pass the "
                "protected attributes one way: as the keyword or as columns of X"
            )
        return inp.labels
    require_sensitive_features(estimator, sensitive_features)
    return sensitive_features


def encode_groups(groups, n: int, mask=None, require_two: bool = True) -> Groups:
    """Encode labels of any type into integer codes per attribute and check them.

    groups : (n,) labels, (n, p) array, a list of p label vectors, or a DataFrame.
    mask : rows that will be used (equal opportunity); groups must be present among them.
    require_two : check that every attribute has two or more groups, none empty under mask
        (``partial_fit`` pieces may hold one group; the check then happens at solve time).
    """
    names = None
    if groups is None:
        raise InvalidInputError("FairPCA.fit needs groups: the protected attribute(s) of every row")
    if hasattr(groups, "columns") and hasattr(groups, "dtypes"):  # pandas / dask DataFrame
        unique_columns(groups.columns, "sensitive_features")
        names = [str(c) for c in groups.columns]
        cols = [_to_numpy(groups[c]) for c in groups.columns]
    elif isinstance(groups, (list, tuple)) and groups and not np.isscalar(groups[0]) and (
        np.ndim(groups[0]) == 1 or is_dask(groups[0]) or hasattr(groups[0], "to_numpy")
    ):
        cols = [_to_numpy(g) for g in groups]
        _refuse_rows(cols, n)
    else:
        arr = _to_numpy(groups)
        if arr.ndim == 1:
            cols = [arr]
        elif arr.ndim == 2:
            cols = [arr[:, j] for j in range(arr.shape[1])]
        else:
            raise InvalidInputError(f"groups must be 1-D (n,) or 2-D (n, p); got shape {arr.shape}")
    if names is None:
        names = [f"attribute {j}" for j in range(len(cols))] if len(cols) > 1 else ["groups"]
    if not cols:
        raise InvalidInputError("groups has no attribute columns")
    codes = np.empty((n, len(cols)), np.int32)
    categories = []
    for j, (col, name) in enumerate(zip(cols, names)):
        col = np.asarray(col)
        if col.ndim != 1:
            raise InvalidInputError(f"{name}: labels must be 1-D; got shape {col.shape}")
        if len(col) != n:
            raise InvalidInputError(
                f"{name} has {len(col)} labels but X has {n} rows; pass one label per row"
            )
        col = _plain_labels(col, name)
        cats, inv = np.unique(col, return_inverse=True)
        codes[:, j] = inv.reshape(-1)
        categories.append(cats)
        if require_two:
            _check_groups(name, cats, inv.reshape(-1), mask)
    return Groups(codes, categories, names)


def _refuse_rows(cols: list, n: int) -> None:
    """Refuse a list of ``n`` rows of labels (tuples, one per row): a list is read as the
    label vectors of the attributes, one per attribute, and these are not ``n`` long."""
    widths = {len(c) for c in cols}
    if len(cols) == n and len(widths) == 1 and widths != {n}:
        raise InvalidInputError(
            f"sensitive_features is a list of {n} rows of {widths.pop()} labels, but a list is "
            "read as one label vector per attribute: give rows as an (n, p) array, e.g. "
            "np.asarray(rows, dtype=object), or a DataFrame with a column per attribute")


def _plain_labels(col: np.ndarray, name: str) -> np.ndarray:
    """The labels as an array ``np.unique`` sorts without merging distinct labels.

    Missing labels (None, NaN, pandas' <NA>, NaT) are refused: a missing value is not a
    group.  An object column holds either text or numbers: mixing them is refused, since
    1 and '1' would both become the group '1' as text; numbers alone keep their numeric
    type (1 and 1.0 are one group, as in numpy and pandas).
    """
    import pandas as pd

    if col.dtype.kind in "fcMmO":
        missing = np.asarray(pd.isna(col), bool)
        if missing.any():
            rows = ", ".join(str(int(i)) for i in np.flatnonzero(missing)[:MAX_ROWS_SHOWN])
            raise InvalidInputError(
                f"{name} has missing labels (None/NaN/<NA>) in {int(missing.sum())} row(s) "
                f"(rows {rows}); every row needs a group: drop those rows or give them a label"
            )
    if col.dtype.kind != "O":
        return col
    text = np.fromiter((isinstance(v, str) for v in col), bool, len(col))
    if text.all():
        # numpy's fixed-width text drops trailing NULs: 'b' and 'b\x00' would be one group
        if any(v.endswith("\x00") for v in set(col.tolist())):
            raise InvalidInputError(
                f"{name} has text labels ending in a NUL character ('\\x00'), which numpy "
                "would merge with the same label without it; strip them first, e.g. "
                "labels.str.rstrip('\\x00')"
            )
        return col.astype(str)
    if text.any():
        words = set(col[text].tolist())
        others = list(dict.fromkeys(col[~text].tolist()))
        # show a pair that text would merge (1 and '1') when there is one
        a = next((v for v in others if str(v) in words), others[0])
        b = str(a) if str(a) in words else col[text][0]
        raise InvalidInputError(
            f"{name} mixes labels of different types, e.g. {a!r} ({type(a).__name__}) and "
            f"{b!r} (str); convert them to one type first, e.g. labels.astype(str) if "
            f"{a!r} and {b!r} are one group"
        )
    values = col.tolist()
    plain = np.array([str(v) for v in values])  # tuples and other objects: as text
    if all(isinstance(v, numbers.Real) for v in values):
        integral = all(isinstance(v, numbers.Integral) for v in values)
        # integers too wide for 64 bits stay text, which is exact for them
        for dtype in (np.int64, np.uint64) if integral else (np.float64,):
            try:
                plain = np.asarray(values, dtype=dtype)
                break
            except (OverflowError, TypeError, ValueError):
                continue
    # the conversion must keep exactly the labels Python tells apart (2**63 + 1 and
    # 2**63 would be one float; two objects may print alike)
    if len(np.unique(plain)) != len(pd.unique(col)):
        raise InvalidInputError(
            f"{name} holds labels that would merge when converted to one type; convert them "
            "to one type first (e.g. text or int64)"
        )
    return plain


def _check_groups(name, cats, inv, mask):
    if len(cats) < 2:
        raise InvalidInputError(
            # tolist(): the label as Python shows it (1, not np.int64(1))
            f"{name} has a single group ({cats[:1].tolist()[0]!r}); fair PCA needs at least "
            "two groups per attribute (for plain PCA use dfairpca.PCA)"
        )
    if mask is None:
        return
    counts = np.bincount(inv[mask], minlength=len(cats))
    empty = cats[counts == 0].tolist()
    if empty:
        raise InvalidInputError(
            f"{name}: group(s) {empty} have no rows with y == 1, so equal opportunity cannot be "
            "imposed for them; merge or drop those groups, or use "
            "constraint='demographic_parity'"
        )


def binary_target(y, n: int) -> np.ndarray:
    """Boolean mask of the positive rows (y == 1 / True) for equal opportunity."""
    if y is None:
        raise InvalidInputError(
            "constraint='equal_opportunity' fits on the rows with y == 1: pass y, the binary "
            "target of the downstream task, as fit(X, y, sensitive_features=...)"
        )
    y = _to_numpy(y)
    if y.ndim != 1:
        y = y.reshape(-1) if y.ndim == 2 and 1 in y.shape else y
    if y.ndim != 1 or len(y) != n:
        raise InvalidInputError(f"y has shape {np.shape(y)} but X has {n} rows; pass one label per row")
    values = set(np.unique(y).tolist())
    if not values <= {0, 1} and not values <= {-1, 1}:
        raise InvalidInputError(
            f"y must be binary (0/1, -1/1 or bool) for equal opportunity; got values "
            f"{sorted(values)[:10]}"
        )
    mask = y == 1
    if not mask.any():
        raise InvalidInputError("y has no positive rows (y == 1); equal opportunity needs some")
    return mask
