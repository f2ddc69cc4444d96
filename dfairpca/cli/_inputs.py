"""What ``fit`` and ``transform`` read: X from a Zarr store (the CelebA layout or any
array), the protected attributes and the task label from Zarr arrays, CelebA attributes
and table columns, each checked against X's rows before any cluster starts; and the
command's outputs checked before any work."""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ._errors import CLIError, UsageError, _did_you_mean, _shown, arguments

# Deferred imports: pandas, pyarrow, zarr (heavy or optional) and package modules that load such
# libraries, or this module, at import are imported in the functions that use them, so that
# importing this module stays light.


# ----------------------------------------------------------------------------- helpers
@contextlib.contextmanager
def _client(args):
    """The cluster of ``args`` (see :func:`dfairpca.cluster.connect`): a malformed address
    or scheduler file is a usage error; a scheduler that does not answer, or has no worker,
    a failure of the run."""
    from ..cluster import connect

    with contextlib.ExitStack() as stack:
        with arguments():
            client = stack.enter_context(connect(args.scheduler, args.scheduler_file,
                                                 timeout=args.timeout))
        yield client


def _check_out(path: Path, kind: str, overwrite: bool, protect: dict | None = None,
               storage_options: dict | None = None):
    """Refuse, before any work or cluster, an output dfairpca may not write.

    See :func:`dfairpca.io.check_target`: a missing path, an empty directory, or with
    ``--overwrite`` dfairpca's own ``kind``; never the inputs (``protect``) or a folder
    holding them; the folder (for a URL: the bucket, with its credentials) must be writable.
    """
    from ..io import check_target

    check_target(path, kind, overwrite=overwrite, protect=protect, storage_options=storage_options)


@contextlib.contextmanager
def writing_alone(outputs: dict):
    """Hold, while the block runs, a lock beside each local output of ``outputs`` (a
    mapping ``{"the model": path}``), or fail at once naming the dfairpca process that
    holds one (:func:`dfairpca.io.exclusive`): two commands writing one output would each
    run their whole pass and the loser fail at the end, or take the other's checkpoint for
    an interrupted one.  A URL's output is not held (a lock on this host guards nothing
    there)."""
    from ..io import exclusive

    with contextlib.ExitStack() as held:
        for what, path in outputs.items():
            if not isinstance(path, Path):
                continue  # a URL's location
            # the command makes the folder anyway, its lock lives there; one made here is
            # removed again if the command ends before writing into it
            made = [p for p in (path.parent, *path.parent.parents) if not p.exists()]
            path.parent.mkdir(parents=True, exist_ok=True)
            held.callback(_remove_empty, made)
            held.enter_context(exclusive(path.parent / f".{path.name}.lock", f"{what} {path}",
                                         "two commands writing one output would mix or undo each other's work",
                                         wait=False))  # no reader takes this lock: refused at once
        yield


def _remove_empty(folders: list[Path]) -> None:
    """Remove the folders ``folders`` (deepest first) that are still empty."""
    for folder in folders:
        try:
            folder.rmdir()
        except OSError:  # written into, or gone
            return


def _storage(args) -> dict | None:
    """``--storage-options`` as a dict (None if not given); a one-line error if not JSON."""
    text = getattr(args, "storage_options", None)
    if text is None:
        return None
    try:
        options = json.loads(text)
    except ValueError as exc:
        raise UsageError(f"--storage-options must be a JSON object, e.g. '{{\"anon\": true}}' ({exc})") from None
    if not isinstance(options, dict):
        raise UsageError(f"--storage-options must be a JSON object, e.g. '{{\"anon\": true}}'; got {text!r}")
    return options


def _place(value, kind: str, storage_options: dict | None = None):
    """An output path as the write protocol takes it: a Path with a name of its own (the
    checkpoint's is made from it), or for a URL its location, which carries the storage
    options to every read and write (the estimator's checkpoint too)."""
    from ..io import storage_for

    return storage_for(value, storage_options).as_argument(kind)



def _attributes(store, names):
    """The named CelebA attributes of the store as 0/1 columns (see
    :func:`dfairpca.celeba.schema.attribute_flags`)."""
    import pandas as pd

    from ..celeba.schema import attribute_flags

    with arguments():  # a name that is no CelebA attribute
        return pd.DataFrame(attribute_flags(store, names))



# ----------------------------------------------------------------------------- inputs
@dataclass
class _Data:
    """What ``fit``/``transform`` read as X: the lazy array and how to name it."""

    X: Any  # dask array, rows chunked: (n, d), or CelebA's (n, size, size)
    shape: tuple  # the stored array's shape
    label: str  # in messages: "faces.zarr/images"
    name: str  # the array's own name ("images" for the CelebA layout)
    celeba: bool  # the CelebA layout (the default)
    root: Any  # STORE opened: a zarr.Group, or the zarr.Array when STORE is one
    chunk_rows: int  # rows per chunk of the stored array: what an output of X's rows is cut in


def _open_zarr(path, option: str, storage_options: dict | None = None):
    """The Zarr array or group at ``path`` (or a URL), opened read-only; a one-line error if none."""
    from ..io import open_zarr

    try:
        return open_zarr(path, storage_options)
    except (FileNotFoundError, ValueError) as exc:
        raise CLIError(f"{option}: {exc}") from None


def _arrays(group) -> list[str]:
    """Paths of every array in ``group``, nested ones as ``a/b``."""
    import zarr

    return sorted(p for p, node in group.members(max_depth=None) if isinstance(node, zarr.Array))


def _locate(data_root, store, name: str, option: str):
    """The Zarr array ``name`` and how to call it: an array of STORE if it has one by that
    path, else the Zarr array at the path ``name`` (a bare array or ``group.zarr/array``)."""
    import zarr

    from ..io import check_member_path

    if not Path(name).exists():  # a path inside STORE, not one on disk
        try:
            check_member_path(name, str(store))
        except ValueError as exc:
            raise UsageError(f"{option} {name}: {exc}") from None
    if isinstance(data_root, zarr.Group) and name in data_root:
        node, label = data_root[name], f"{store}/{name}"
    elif Path(name).exists():
        node, label = _open_zarr(name, option), str(name)
    else:
        if isinstance(data_root, zarr.Group):
            arrays = _arrays(data_root)
            inside = (f"{store} has no array {name!r}{_did_you_mean(name, arrays)} (it holds "
                      f"{_shown(arrays)})")
        else:
            inside = f"{store} is a single array"
        raise UsageError(
            f"{option} {name}: {inside}, and no file or folder {name} exists; name an array "
            "of STORE or give the path of a Zarr array"
        )
    if not isinstance(node, zarr.Array):
        raise UsageError(
            f"{option} {name}: {label} is a Zarr group, not an array; name one of its arrays: "
            f"{_shown(f'{name}/{a}' for a in _arrays(node))}"
        )
    return node, label


def _array_name(option_value: str) -> str:
    """A short name for an array given by ``--array``/``--sensitive-array``: its path in
    the store, or for a path on disk its last part without ``.zarr``."""
    name = Path(option_value).name if Path(option_value).exists() else option_value
    return name[:-5] if name.endswith(".zarr") and len(name) > 5 else name


def _data(args, rows_per_chunk=None) -> _Data:
    """X of ``fit``/``transform``: the CelebA ``images`` by default, else ``--array``."""
    import zarr

    from ..celeba.schema import IMAGES, read_images
    from ..io import from_zarr

    root = _open_zarr(args.store, "STORE", _storage(args))
    if args.array is None and isinstance(root, zarr.Group):
        if IMAGES not in root:
            raise UsageError(
                f"{args.store} is not a CelebA store: it has no {IMAGES!r} array; for another "
                f"layout name the data with --array NAME, one of {_shown(_arrays(root))}"
            )
        X = read_images(_source(args, root), rows_per_chunk=rows_per_chunk,
                        missing_chunks=args.missing_chunks)
        return _Data(X, X.shape, f"{args.store}/{IMAGES}", IMAGES, True, root, _zarr_row_chunk(root[IMAGES]))
    if args.array is None:  # STORE is itself an array
        node, label, name = root, str(args.store), _array_name(str(args.store))
    else:
        node, label = _locate(root, args.store, args.array, "--array")
        name = _array_name(args.array)
    if node.ndim < 2 or node.dtype.kind not in "biuf":
        raise UsageError(
            f"{label} holds {node.dtype} of shape {node.shape}; X must be numbers (bool, int "
            "or float) with one row per sample: shape (n, d) or (n, ...)"
        )
    X = from_zarr(node, rows_per_chunk=rows_per_chunk, missing_chunks=args.missing_chunks)
    # (n, h, w, ...) -> (n, h*w*...): rows are chunked whole, so no rechunk
    return _Data(X.reshape(X.shape[0], -1), X.shape, label, name, False, root, int(node.chunks[0]))


def _zarr_row_chunk(node) -> int:
    """Rows per chunk of the Zarr array ``node`` (read_images has checked it is one)."""
    import zarr

    assert isinstance(node, zarr.Array)
    return int(node.chunks[0])


def _source(args, root):
    """STORE as the CelebA readers take it: the path, or for a URL the group opened with
    its storage options."""
    from ..io import storage_for

    return storage_for(args.store).for_readers(root)


def _input_paths(args) -> dict:
    """What this job reads, by role: no output may be, or contain, one of them."""
    paths = {"the input store": args.store}
    for option in ("array", "sensitive_array", "target_array", "sensitive_csv", "target_csv",
                   "sample_weight_array", "sample_weight_csv"):
        values = getattr(args, option, None)
        for value in values if isinstance(values, (list, tuple)) else [values]:
            if value is not None and Path(value).exists():  # a path, not a name in STORE
                paths[f"the --{option.replace('_', '-')} input"] = value
    return paths


def _check_rows(count: int, source: str, data: _Data) -> None:
    """Refuse labels whose row count differs from X's (before any cluster starts)."""
    n = data.X.shape[0]
    if count != n:
        raise UsageError(
            f"{source} has {count:,} rows but X ({data.label}) has {n:,}; the labels need one "
            "row per row of X, in the same order"
        )


def _read_labels(node, missing_chunks: str) -> np.ndarray:
    """A small label array read whole, every chunk or an error unless ``missing_chunks``
    is "fill" (text as Python strings, which FairPCA encodes)."""
    from ..io import read_checked, strict_array

    values = np.asarray(read_checked(strict_array(node) if missing_chunks == "error" else node,
                                     slice(None)))
    return values.astype(object) if values.dtype.kind == "T" else values


def _label_array(args, data: _Data, value: str, option: str):
    """The label columns of the Zarr array ``value``: {name: (n,) labels}, one per column.

    A 2-D array's columns are named by its ``attrs["names"]`` when it lists one per
    column, else ``NAME[j]``.
    """
    node, label = _locate(data.root, args.store, value, option)
    if node.ndim not in (1, 2):
        raise UsageError(
            f"{option} {value}: {label} has shape {node.shape}; labels must be (n,) or (n, p)"
        )
    _check_rows(node.shape[0], f"{option} {label}", data)
    values = _read_labels(node, args.missing_chunks)
    name = _array_name(value)
    if values.ndim == 1:
        return {name: values}
    names = node.attrs.get("names")
    if not (isinstance(names, list) and len(names) == values.shape[1]):
        names = [f"{name}[{j}]" for j in range(values.shape[1])]
    return {str(c): values[:, j] for j, c in enumerate(names)}


def _tuple(value):
    """A list (a repeatable option) as a tuple, anything else as it is."""
    return tuple(value) if isinstance(value, list) else value


def _split(values) -> list[str]:
    """Column names from repeatable ``COL[,COL...]`` options."""
    return [c for v in values or [] for c in v.split(",") if c]


def _once(names: list[str], option: str) -> list[str]:
    """``names`` given with ``option``, refused if one is given twice."""
    for name in names:
        if names.count(name) > 1:
            raise UsageError(f"{option} names {name!r} twice; give it once")
    return names


def _table(path, columns: list[str], option: str, data: _Data):
    """The named columns of a CSV or Parquet file (by extension), as pandas reads them."""
    import pandas as pd

    path = Path(path)
    if not path.is_file():
        raise CLIError(f"{option} {path}: no such file")
    if path.suffix.lower() in (".parquet", ".pq"):
        # pyarrow is not a dependency of dfairpca (tens of MB, for this option alone)
        try:
            import pyarrow.parquet as pq
        except ImportError:
            raise CLIError(
                f"reading the Parquet file {path} needs pyarrow, which is not installed: "
                "pip install pyarrow, or save the table as CSV"
            ) from None
        kind = "Parquet"
        schema = lambda: pq.read_schema(path).names
        read = lambda: pd.read_parquet(path, columns=columns, engine="pyarrow")
    else:
        kind = "CSV"
        schema = lambda: [str(c) for c in pd.read_csv(path, nrows=0).columns]
        read = lambda: pd.read_csv(path, usecols=columns)
    try:
        have = schema()
        for c in columns:
            if c not in have:
                raise UsageError(
                    f"{path} has no column {c!r}{_did_you_mean(c, have)}; its columns: {_shown(have)}"
                )
        table = read()[columns]
    except (ValueError, UnicodeDecodeError, pd.errors.ParserError) as exc:  # the reader's, on the file
        if isinstance(exc, CLIError):
            raise
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CLIError(f"{option} {path}: cannot read it as {kind} ({first}); check the file") from None
    _check_rows(len(table), f"{option} {path}", data)
    return {c: table[c].to_numpy() for c in columns}


def _sensitive(args, data: _Data):
    """The protected attributes as a DataFrame, one column each, or None.

    Sources combine: CelebA attributes (``--attribute``), Zarr arrays
    (``--sensitive-array``) and table columns (``--sensitive-column`` of
    ``--sensitive-csv``); every source's row count is checked against X's.
    """
    import pandas as pd

    columns = {}
    sources = []
    if args.attribute:
        attributes = _attributes(_source(args, data.root), _once(args.attribute, "--attribute"))
        _check_rows(len(attributes), f"the attributes of {args.store}", data)
        sources.append(attributes.to_dict("series"))
    for value in args.sensitive_array:
        sources.append(_label_array(args, data, value, "--sensitive-array"))
    names = _once(_split(args.sensitive_column), "--sensitive-column")
    if names and not args.sensitive_csv:
        raise UsageError(
            "--sensitive-column names columns of a table: give it with --sensitive-csv FILE"
        )
    if args.sensitive_csv and not names and not args.target_column:
        raise UsageError("--sensitive-csv needs --sensitive-column COL[,COL...]: the columns to use")
    if names:
        sources.append(_table(args.sensitive_csv, names, "--sensitive-csv", data))
    for source in sources:
        for name, values in source.items():
            if name in columns:
                raise UsageError(f"the protected attribute {name!r} is given twice; give it once")
            columns[name] = np.asarray(values)
    return pd.DataFrame(columns) if columns else None


#: the options that give equal opportunity's task label, one of which it needs
TARGET_OPTIONS = ("--target", "--target-array", "--target-column")


def _target(args, data: _Data):
    """The task label of equal opportunity, or None; given without it, an error."""
    given = [o for o in TARGET_OPTIONS if getattr(args, o[2:].replace("-", "_"))]
    if getattr(args, "target_csv", None) and not args.target_column:
        raise UsageError(
            "--target-csv is read only for --target-column COL, equal opportunity's task label: "
            "add --constraint equal_opportunity --target-column COL, or drop --target-csv"
        )
    if args.constraint != "equal_opportunity":
        if given:
            raise UsageError(
                f"{given[0]} is the task label of --constraint equal_opportunity: add that, or "
                f"drop {given[0]}"
            )
        return None
    if len(given) != 1:
        what = ("needs the task label" if not given
                else f"takes one task label, got {', '.join(given)}")
        raise UsageError(
            f"--constraint equal_opportunity {what}: --target NAME (a CelebA attribute), "
            "--target-array ARRAY, or --target-column COL (of --target-csv, by default the "
            "--sensitive-csv file)"
        )
    if args.target:
        y = _attributes(_source(args, data.root), [args.target])[args.target].to_numpy()
        _check_rows(len(y), f"the attributes of {args.store}", data)
        return y
    if args.target_array:
        cols = _label_array(args, data, args.target_array, "--target-array")
        if len(cols) != 1:
            raise UsageError(f"--target-array {args.target_array} has {len(cols)} columns; the task "
                           "label is one: (n,) or (n, 1)")
        return next(iter(cols.values()))
    table = args.target_csv or args.sensitive_csv
    if not table:
        raise UsageError("--target-column names a column of a table: give it with --target-csv "
                       "FILE (or --sensitive-csv FILE)")
    return _table(table, [args.target_column], "--target-csv", data)[args.target_column]


def _sample_weight(args, data: _Data):
    """The rows' frequency weights (``--sample-weight-array ARRAY``, or
    ``--sample-weight-column COL`` of ``--sample-weight-csv``, by default the
    ``--sensitive-csv`` file), or None; the estimator checks their values."""
    array, column = args.sample_weight_array, args.sample_weight_column
    if array and column:
        raise UsageError("give the sample weights once: --sample-weight-array or --sample-weight-column")
    if array:
        cols = _label_array(args, data, array, "--sample-weight-array")
        if len(cols) != 1:
            raise UsageError(f"--sample-weight-array {array} has {len(cols)} columns; the weights are "
                             "one: (n,) or (n, 1)")
        return np.asarray(next(iter(cols.values())))
    table = args.sample_weight_csv or args.sensitive_csv
    if column and not table:
        raise UsageError("--sample-weight-column names a column of a table: give it with "
                         "--sample-weight-csv FILE (or --sensitive-csv FILE)")
    if column:
        return np.asarray(_table(table, [column], "--sample-weight-csv", data)[column])
    if args.sample_weight_csv:
        raise UsageError("--sample-weight-csv needs --sample-weight-column COL: the column of weights")
    return None


def _describe_groups(groups, celeba_names) -> str:
    """'Eyeglasses: 97 with / 1,403 without' for a CelebA attribute, else 'race: a 500,
    b 300' (label and rows), per attribute."""
    import pandas as pd

    parts = []
    for c in groups:
        col = groups[c].to_numpy()
        if c in celeba_names:
            with_, without = int((col == 1).sum()), int((col == 0).sum())
            parts.append(f"{c}: {with_:,} with / {without:,} without")
        else:
            counts = pd.Series(col).value_counts().sort_index()
            parts.append(f"{c}: " + ", ".join(f"{v} {int(k):,}" for v, k in counts.items()))
    return "; ".join(parts)

