"""The saved form of additive statistics (:class:`dfairpca.stats.moments.Moments` and a
pass's running total, :mod:`dfairpca.engine._accumulator`): which arrays and meta.json keys
they are written as, how each is checked on reading, and the JSON form of group labels.

It works on the fields alone (any object with ``n``, ``mean``, ``attributes`` ...), so that
the format is one module below the statistics that use it and the estimators' saved models
(:mod:`dfairpca.decomposition._saved`) share its label encoding.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import InvalidInputError

# Deferred imports: package modules that load such libraries, or this module, at import are imported
# in the functions that use them, so that importing this module stays light.

__all__ = ["sums_to_arrays", "saved_fields", "read_saved", "saved_group_counts", "saved_layout",
           "moments_layout", "categories_to_json", "categories_from_json"]

def sums_to_arrays(s, group_scatter) -> tuple[dict, dict]:
    """(arrays, meta) of everything in sums ``s`` but the overall scatter, whose form is
    the caller's; ``group_scatter(attribute)`` gives an attribute's (m, d, d) array.

    Parameters
    ----------
    s : Moments or a pass's running total
        The statistics to save.
    group_scatter : callable
        ``group_scatter(attribute)``: that attribute's (m, d, d) array to save, or None.

    Returns
    -------
    arrays : dict
        The arrays to save, by name.
    meta : dict
        The meta.json entries to save.
    """
    arrays = {"n": np.asarray(s.n), "mean": s.mean,
              "precision": np.asarray(s.precision),
              "scatter_exponent": np.asarray(s.scatter_exponent),
              "n_nonfinite": np.asarray(s.n_nonfinite),
              "nonfinite_rows": np.asarray(s.nonfinite_rows, np.int64)}
    if s.n_rows is not None:  # weighted: n and the counts are float totals of weights
        arrays["n_rows"] = np.asarray(s.n_rows, np.int64)
    meta: dict[str, Any] = {"n_attributes": len(s.attributes), "categories": []}
    for j, a in enumerate(s.attributes):
        arrays[f"counts_{j}"] = a.counts
        arrays[f"deviation_{j}"] = a.deviation
        if a.scatter is not None:
            arrays[f"group_scatter_{j}"] = group_scatter(a)
        meta["categories"].append(categories_to_json(a.categories))
    return arrays, meta


def saved_fields(arrays, meta) -> dict:
    """The fields of saved statistics but the overall scatter; ``attributes`` as tuples
    (categories, counts, deviation, (m, d, d) group scatter or None).

    Parameters
    ----------
    arrays : dict
        The saved arrays (:func:`read_saved`).
    meta : dict
        The saved meta.json.

    Returns
    -------
    dict
        The fields, by name, as the statistics' constructor takes them.
    """
    attrs = []
    for j in range(meta["n_attributes"]):
        sc = arrays.get(f"group_scatter_{j}")
        attrs.append((categories_from_json(meta["categories"][j]), np.asarray(arrays[f"counts_{j}"]),
                      np.asarray(arrays[f"deviation_{j}"]), None if sc is None else np.asarray(sc)))
    weighted = "n_rows" in arrays
    return dict(n=float(arrays["n"]) if weighted else int(arrays["n"]),
                n_rows=int(arrays["n_rows"]) if weighted else None,
                mean=np.asarray(arrays["mean"]), attributes=attrs,
                n_nonfinite=int(arrays["n_nonfinite"]),
                nonfinite_rows=[int(r) for r in arrays["nonfinite_rows"]],
                precision=float(arrays["precision"]),
                scatter_exponent=int(arrays["scatter_exponent"]) if "scatter_exponent" in arrays else 0)


def read_saved(path, layout) -> tuple[dict, dict]:
    """The arrays and meta of saved statistics, checked (``layout`` as for
    :func:`dfairpca.io.load_arrays`) and consistent: ``SavedFileError`` says what is wrong.

    Parameters
    ----------
    path : str or os.PathLike
        The saved statistics' directory.
    layout : callable
        What the arrays must be (see :func:`dfairpca.io.load_arrays`).

    Returns
    -------
    arrays : dict
        The arrays, by name.
    meta : dict
        The saved meta.json.
    """
    from ._arrays import load_arrays
    from ._files import SavedFileError

    arrays, meta = load_arrays(path, kind="Moments", layout=layout)
    weighted = "n_rows" in arrays
    n = float(arrays["n"]) if weighted else int(arrays["n"])

    def adds_up(counts) -> bool:  # weighted counts are float sums: to their rounding
        if not weighted and counts.dtype.kind == "f":
            return False
        total = float(counts.sum())
        return abs(total - n) <= 1e-9 * max(abs(n), 1.0) if weighted else int(total) == n

    problem = (
        "'n' is not a finite number" if not np.isfinite(n) else
        "'n' is a fraction but 'n_rows' (weighted statistics) is missing" if (
            not weighted and np.asarray(arrays["n"]).dtype.kind == "f") else
        "'n_rows' is negative" if weighted and int(arrays["n_rows"]) < 0 else
        "'n' is negative" if n < 0 else
        "'n_nonfinite' is negative" if int(arrays["n_nonfinite"]) < 0 else
        "'precision' is not in (0, 1)" if not 0 < float(arrays["precision"]) < 1 else
        next((f"the group counts 'counts_{j}' do not add up to n = {n}"
              for j in range(meta["n_attributes"])
              if (arrays[f"counts_{j}"] < 0).any() or not adds_up(arrays[f"counts_{j}"])),
             None)
    )
    if problem:
        raise SavedFileError(f"cannot load {str(path)!r}: arrays.npz: {problem}; it was "
                             "edited or not written by dfairpca: compute it again")
    return arrays, meta


def saved_group_counts(cats: list, key: str, names: list) -> list[int]:
    """Number of groups of each attribute saved in meta.json's ``key`` (one error naming
    the attribute whose labels do not decode).

    Parameters
    ----------
    cats : list
        The JSON form of each attribute's labels (:func:`categories_to_json`).
    key : str
        The meta.json entry they were read from, named by the error.
    names : list
        The attributes' names, named by the error.

    Returns
    -------
    list of int
        The number of labels of each attribute.
    """
    ms = []
    for name, c in zip(names, cats):
        try:
            ms.append(len(categories_from_json(c)))
        except ValueError as exc:
            raise InvalidInputError(f"meta.json: {key!r} of {name}: {exc}") from None
    return ms


def saved_layout(meta: dict, headers: dict) -> tuple[dict, int]:
    """Check a saved Moments' meta.json: ``(specs, d)``, the shape and kind of every array
    it implies but the overall scatter's (see :func:`dfairpca.io.load_arrays`).

    Parameters
    ----------
    meta : dict
        The saved meta.json.
    headers : dict
        The arrays' headers, as :func:`dfairpca.io.load_arrays` gives them to a layout.

    Returns
    -------
    specs : dict
        The shape and kind of every array but the overall scatter.
    d : int
        The number of features.
    """
    from ._arrays import header_shape, meta_value

    p = meta_value(meta, "n_attributes", "count")
    cats = meta_value(meta, "categories", "list")
    if len(cats) != p:
        raise InvalidInputError(f"meta.json: 'categories' lists {len(cats)} attributes, not {p}")
    ms = saved_group_counts(cats, "categories", [f"attribute {j}" for j in range(p)])
    (d,) = header_shape(headers, "mean", 1)
    specs = {"n": ((), "iuf"), "mean": ((d,), "f"), "precision": ((), "f"),
             "n_nonfinite": ((), "iu"), "nonfinite_rows": ((None,), "iu"), "n_rows": ((), "?iu")}
    for j, m in enumerate(ms):
        specs[f"counts_{j}"] = ((m,), "iuf")
        specs[f"deviation_{j}"] = ((m, d), "f")
        specs[f"group_scatter_{j}"] = ((m, d, d), "?f")
        specs[f"exact_group_sum_{j}"] = ((m, d), "?i")
        specs[f"exact_group_gram_{j}"] = ((m, d, d), "?i")
    # the raw integer sums of exact statistics (Moments.exact)
    specs.update({"exact_n": ((), "?iu"), "exact_sum": ((d,), "?i"), "exact_gram": ((d, d), "?i")})
    return specs, d


def moments_layout(meta: dict, headers: dict) -> dict:
    """The arrays of a saved Moments (:func:`saved_layout`) with its overall scatter: the
    full (d, d) matrix, or the packed panels of a pass's running total, which
    :meth:`dfairpca.stats.moments.Moments.load` refuses by name.

    Parameters
    ----------
    meta : dict
        The saved meta.json.
    headers : dict
        The arrays' headers, as :func:`dfairpca.io.load_arrays` gives them to a layout.

    Returns
    -------
    dict
        The shape and kind of every array, as a layout of :func:`dfairpca.io.load_arrays`.
    """
    specs, d = saved_layout(meta, headers)
    if "scatter_panels" in headers:  # a pass's running total: refused by Moments.load
        specs["scatter_panels"] = ((None,), "f")
    else:
        specs["scatter"] = ((d, d), "f")
    return specs


#: dtype kinds a saved label may have: JSON holds them exactly (a float through its
#: shortest repr, an integer of any size) and numpy reads them back with their dtype
_LABEL_KINDS = "biufU"


def categories_to_json(c) -> dict:
    """JSON form of one attribute's sorted labels that reads back to equal values and dtype.

    Labels held in an object array are kept if they all are of one kind (str, bool, int or
    float); anything else (mixed kinds, arbitrary objects, bytes, dates) is refused here,
    at save time, rather than written in a form that loads as different groups.

    Parameters
    ----------
    c : numpy.ndarray
        One attribute's sorted labels.

    Returns
    -------
    dict
        Their values and dtype, as JSON.
    """
    c = np.asarray(c)
    if c.dtype.kind == "O":
        c = _homogeneous_labels(c)
    if c.dtype.kind not in _LABEL_KINDS:
        raise InvalidInputError(
            f"group labels of dtype {c.dtype} (e.g. {c[:3].tolist()!r}) cannot be saved: a "
            "saved model holds booleans, integers, floats or strings as labels; convert them "
            "(e.g. labels.astype(str)) and fit again"
        )
    return {"kind": c.dtype.kind, "dtype": c.dtype.str, "values": c.tolist()}


def _homogeneous_labels(c: np.ndarray) -> np.ndarray:
    """The labels of an object array as a typed array, or ValueError naming the mix."""
    values = c.tolist()
    kinds = {
        "str" if isinstance(v, str) else
        "bool" if isinstance(v, (bool, np.bool_)) else
        "int" if isinstance(v, (int, np.integer)) else
        "float" if isinstance(v, (float, np.floating)) else type(v).__name__
        for v in values
    }
    if kinds == {"int"}:  # numpy would make float64 of int64 and uint64 values together
        for dtype in (np.int64, np.uint64):
            try:
                return np.array(values, dtype=dtype)
            except OverflowError:
                pass
    elif len(kinds) == 1 and kinds <= {"str", "bool", "float"}:
        return np.array(values)
    raise InvalidInputError(
        f"group labels of types {sorted(kinds)} (e.g. {c[:3].tolist()!r}) cannot be saved so "
        "that they load as the same groups; use labels of one kind (all str, all int, ...) "
        "and fit again"
    )


def categories_from_json(obj) -> np.ndarray:
    """Inverse of :func:`categories_to_json`; ValueError saying what is wrong with ``obj``.

    Files written before the dtype was recorded hold only the kind: integers then load as
    int64, or uint64 where a label needs it.

    Parameters
    ----------
    obj : dict
        The JSON form of one attribute's labels, as read from meta.json.

    Returns
    -------
    numpy.ndarray
        The sorted labels, of the dtype they were saved with.
    """
    if not isinstance(obj, dict) or not isinstance(obj.get("values"), list):
        raise InvalidInputError(f"group labels must be {{'kind': ..., 'values': [...]}}; got {obj!r:.80}")
    kind, values = obj.get("kind"), obj["values"]
    if kind not in tuple(_LABEL_KINDS):
        raise InvalidInputError(f"group labels of kind {kind!r} are not one of {list(_LABEL_KINDS)}")
    dtype = obj.get("dtype")
    if dtype is None:  # format of the first release
        big = kind in "iu" and any(isinstance(v, int) and v >= 2**63 for v in values)
        dtype = {"b": bool, "i": np.int64, "u": np.uint64 if big else np.int64,
                 "f": np.float64, "U": str}[kind]
    elif not isinstance(dtype, str):
        raise InvalidInputError(f"group label dtype must be a string; got {dtype!r:.80}")
    try:
        dtype = np.dtype(dtype)
    except TypeError:
        raise InvalidInputError(f"group label dtype {dtype!r:.80} is not a numpy dtype") from None
    want = {"b": bool, "i": int, "u": int, "f": float, "U": str}[kind]
    if dtype.kind != kind or any(type(v) is not want and not (
            kind == "f" and type(v) is int) for v in values):
        raise InvalidInputError(f"group labels {values!r:.80} do not match their dtype {dtype}")
    try:
        c = np.array(values, dtype=dtype)
    except (OverflowError, ValueError) as exc:
        raise InvalidInputError(f"group labels {values!r:.80} do not fit dtype {dtype}: {exc}") from None
    if c.tolist() != values or (len(c) > 1 and not (c[1:] > c[:-1]).all()):
        raise InvalidInputError(f"group labels {values!r:.80} are not distinct, sorted values of {dtype}")
    return c
