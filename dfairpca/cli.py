"""The ``dfairpca`` command: make or ingest a CelebA store, fit, transform, show, demo.

    dfairpca synth-celeba OUT.zarr [--n 202599] [--seed 0] [--size 80|HxW] [--color]
    dfairpca ingest-celeba CELEBA_DIR OUT.zarr [--size 80|HxW|full] [--color] [--scheduler ADDR]
    dfairpca fit STORE.zarr --attribute Eyeglasses -k 400 --out MODEL [--method fair]
    dfairpca fit DATA.zarr --array X --sensitive-array groups -k 10 --out MODEL [--json]
    dfairpca fit DATA.zarr --array X --sensitive-csv people.csv --sensitive-column sex,race ...
    dfairpca transform MODEL STORE.zarr --out OUT.zarr [--array X] [--reconstruct] [--json]
    dfairpca show MODEL STORE.zarr --out faces.png [--n 8]
    dfairpca demo [--n 202599] [--workdir dfairpca-demo]
    dfairpca --version

``fit`` and ``transform`` read the CelebA layout (``images``, ``attributes``) by default;
``--array`` names any Zarr array of shape (n, ...) instead: an array of STORE, else the
path of a Zarr array (a STORE that is itself an array needs no ``--array``).  The
protected attributes of ``fit`` come from the CelebA attributes (``--attribute``, 0/1 or
CelebA's -1/1), from Zarr arrays (``--sensitive-array``, shape (n,) or (n, p), labels of
any type) and from columns of a CSV or Parquet file (``--sensitive-csv FILE
--sensitive-column COL,...``); row i labels row i of X, and the sources combine.  With
``--json`` stdout holds one line, a JSON object summarising the result, and everything
meant for people (summaries, progress bars, cluster lines) goes to stderr.

Commands that compute connect to ``--scheduler tcp://host:port`` or ``--scheduler-file``
when given; otherwise they start a LocalCluster sized to this machine (the library itself
never starts a cluster: it uses the active Client, the Dask convention).  They check every
parameter against the data's shape first, so that a mistake is reported at once and not
after a cluster was found or started.  Errors are one line on stderr and exit status 2;
Ctrl-C is one line and exit status 130 (``fit`` says how many chunks its checkpoint holds).
"""

from __future__ import annotations

from .errors import DfairpcaError

import argparse
import contextlib
import difflib
import json
import logging
import math
import sys
import time
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["main", "build_parser"]


class CLIError(DfairpcaError):
    """An error the command reports in one line (exit status 2)."""


#: exit status of a command stopped by Ctrl-C (128 + SIGINT), as shells report it
EXIT_INTERRUPTED = 130

#: the kind in dfairpca's marker of what ``transform`` writes: another kind than the data
#: stores of synth and ingest ("store"), so that ``transform --overwrite`` can never replace
#: a data set (an ingest of hours), nor synth one of its results
TRANSFORM_KIND = "transform output"

#: the errors a command reports in one line, exit status 2: what dfairpca refuses on purpose
#: and what the operating system refuses (a file, a permission, a connection); anything
#: else is a bug and keeps its traceback
ONE_LINE_ERRORS = (DfairpcaError, OSError)


def _malformed_file(exc: BaseException) -> bool:
    """Whether ``exc`` is a reader's refusal of a user's file (a Zarr store's metadata, a
    JSON file) that reached the command unwrapped: said in one line, as a refusal is."""
    zarr_errors = sys.modules.get("zarr.errors")  # imported if a store was opened
    return isinstance(exc, json.JSONDecodeError) or (
        zarr_errors is not None and isinstance(exc, zarr_errors.BaseZarrError))


def one_line(exc: BaseException) -> str:
    """The message of one of :data:`ONE_LINE_ERRORS` (a KeyError's without its quotes)."""
    return str(exc.args[0]) if isinstance(exc, KeyError) and exc.args else str(exc)

#: how many names an error lists before "..." (arrays of a store, columns of a table)
MAX_NAMES_SHOWN = 20


# ----------------------------------------------------------------------------- helpers
def _client(args):
    from .cluster import connect

    return connect(args.scheduler, args.scheduler_file, timeout=args.timeout)


def _check_out(path: Path, kind: str, overwrite: bool, protect: dict | None = None,
               storage_options: dict | None = None):
    """Refuse, before any work or cluster, an output dfairpca may not write.

    See :func:`dfairpca.io.check_target`: a missing path, an empty directory, or with
    ``--overwrite`` dfairpca's own ``kind``; never the inputs (``protect``) or a folder
    holding them; the folder (for a URL: the bucket, with its credentials) must be writable.
    """
    from .io._writes import check_target

    check_target(path, kind, overwrite=overwrite, protect=protect, storage_options=storage_options)


def _storage(args) -> dict | None:
    """``--storage-options`` as a dict (None if not given); a one-line error if not JSON."""
    text = getattr(args, "storage_options", None)
    if text is None:
        return None
    try:
        options = json.loads(text)
    except ValueError as exc:
        raise CLIError(f"--storage-options must be a JSON object, e.g. '{{\"anon\": true}}' ({exc})") from None
    if not isinstance(options, dict):
        raise CLIError(f"--storage-options must be a JSON object, e.g. '{{\"anon\": true}}'; got {text!r}")
    return options


def _place(value, kind: str, storage_options: dict | None = None):
    """An output path as the write protocol takes it: a Path with a name of its own (the
    checkpoint's is made from it), or for a URL its location, which carries the storage
    options to every read and write (the estimator's checkpoint too)."""
    from .io._remote import is_remote, local_path, location
    from .io._writes import named

    return location(value, storage_options) if is_remote(value) else named(local_path(value), kind)



def _attributes(store, names):
    """The named CelebA attributes of the store as 0/1 columns (see
    :func:`dfairpca.celeba.schema.attribute_flags`)."""
    import pandas as pd

    from .celeba.schema import attribute_flags

    return pd.DataFrame(attribute_flags(store, names))


def _shown(names) -> str:
    """``names`` for an error message, at most :data:`MAX_NAMES_SHOWN` of them."""
    names = [str(n) for n in names]
    more = ", ..." if len(names) > MAX_NAMES_SHOWN else ""
    return (", ".join(names[:MAX_NAMES_SHOWN]) + more) or "nothing"


def _did_you_mean(name: str, names) -> str:
    """'; did you mean 'X'?' for the closest of ``names``, or ''."""
    close = difflib.get_close_matches(str(name), [str(n) for n in names], n=1)
    return f"; did you mean {close[0]!r}?" if close else ""


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


def _open_zarr(path, option: str, storage_options: dict | None = None):
    """The Zarr array or group at ``path`` (or a URL), opened read-only; a one-line error if none."""
    from .io._remote import open_zarr

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
        raise CLIError(
            f"{option} {name}: {inside}, and no file or folder {name} exists; name an array "
            "of STORE or give the path of a Zarr array"
        )
    if not isinstance(node, zarr.Array):
        raise CLIError(
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

    from .celeba.schema import IMAGES, read_images
    from .io import from_zarr

    root = _open_zarr(args.store, "STORE", _storage(args))
    if args.array is None and isinstance(root, zarr.Group):
        if IMAGES not in root:
            raise CLIError(
                f"{args.store} is not a CelebA store: it has no {IMAGES!r} array; for another "
                f"layout name the data with --array NAME, one of {_shown(_arrays(root))}"
            )
        X = read_images(_source(args, root), rows_per_chunk=rows_per_chunk,
                        missing_chunks=args.missing_chunks)
        return _Data(X, X.shape, f"{args.store}/{IMAGES}", IMAGES, True, root)
    if args.array is None:  # STORE is itself an array
        node, label, name = root, str(args.store), _array_name(str(args.store))
    else:
        node, label = _locate(root, args.store, args.array, "--array")
        name = _array_name(args.array)
    if node.ndim < 2 or node.dtype.kind not in "biuf":
        raise CLIError(
            f"{label} holds {node.dtype} of shape {node.shape}; X must be numbers (bool, int "
            "or float) with one row per sample: shape (n, d) or (n, ...)"
        )
    X = from_zarr(node, rows_per_chunk=rows_per_chunk, missing_chunks=args.missing_chunks)
    # (n, h, w, ...) -> (n, h*w*...): rows are chunked whole, so no rechunk
    return _Data(X.reshape(X.shape[0], -1), X.shape, label, name, False, root)


def _source(args, root):
    """STORE as the CelebA readers take it: the path, or for a URL the group opened with
    its storage options."""
    from .io._remote import is_remote

    return root if is_remote(args.store) else args.store


def _input_paths(args) -> dict:
    """What this job reads, by role: no output may be, or contain, one of them."""
    paths = {"the input store": args.store}
    for option in ("array", "sensitive_array", "target_array", "sensitive_csv", "target_csv"):
        values = getattr(args, option, None)
        for value in values if isinstance(values, (list, tuple)) else [values]:
            if value is not None and Path(value).exists():  # a path, not a name in STORE
                paths[f"the --{option.replace('_', '-')} input"] = value
    return paths


def _check_rows(count: int, source: str, data: _Data) -> None:
    """Refuse labels whose row count differs from X's (before any cluster starts)."""
    n = data.X.shape[0]
    if count != n:
        raise CLIError(
            f"{source} has {count:,} rows but X ({data.label}) has {n:,}; the labels need one "
            "row per row of X, in the same order"
        )


def _read_labels(node, missing_chunks: str) -> np.ndarray:
    """A small label array read whole, every chunk or an error unless ``missing_chunks``
    is "fill" (text as Python strings, which FairPCA encodes)."""
    from .io import read_checked, strict_array

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
        raise CLIError(
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
            raise CLIError(f"{option} names {name!r} twice; give it once")
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
                raise CLIError(
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
        raise CLIError(
            "--sensitive-column names columns of a table: give it with --sensitive-csv FILE"
        )
    if args.sensitive_csv and not names and not args.target_column:
        raise CLIError("--sensitive-csv needs --sensitive-column COL[,COL...]: the columns to use")
    if names:
        sources.append(_table(args.sensitive_csv, names, "--sensitive-csv", data))
    for source in sources:
        for name, values in source.items():
            if name in columns:
                raise CLIError(f"the protected attribute {name!r} is given twice; give it once")
            columns[name] = np.asarray(values)
    return pd.DataFrame(columns) if columns else None


#: the options that give equal opportunity's task label, one of which it needs
TARGET_OPTIONS = ("--target", "--target-array", "--target-column")


def _target(args, data: _Data):
    """The task label of equal opportunity, or None; given without it, an error."""
    given = [o for o in TARGET_OPTIONS if getattr(args, o[2:].replace("-", "_"))]
    if args.constraint != "equal_opportunity":
        if given:
            raise CLIError(
                f"{given[0]} is the task label of --constraint equal_opportunity: add that, or "
                f"drop {given[0]}"
            )
        return None
    if len(given) != 1:
        what = ("needs the task label" if not given
                else f"takes one task label, got {', '.join(given)}")
        raise CLIError(
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
            raise CLIError(f"--target-array {args.target_array} has {len(cols)} columns; the task "
                           "label is one: (n,) or (n, 1)")
        return next(iter(cols.values()))
    table = args.target_csv or args.sensitive_csv
    if not table:
        raise CLIError("--target-column names a column of a table: give it with --target-csv "
                       "FILE (or --sensitive-csv FILE)")
    return _table(table, [args.target_column], "--target-csv", data)[args.target_column]


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


#: fit options only a fair method uses: --method pca would ignore them
FAIR_ONLY = ("attribute", "sensitive_array", "sensitive_csv", "sensitive_column", "constraint",
             "target", "target_array", "target_column", "target_csv", "tradeoff", "equalize")
#: fit options only the randomized solve uses: --svd-solver full would ignore them
RANDOMIZED_ONLY = ("n_oversamples", "iterated_power", "random_state")


#: seconds to wait for a scheduler to answer, then for its first worker
CLUSTER_TIMEOUT = 60


@dataclass(frozen=True)
class FitJob:
    """One ``dfairpca fit``: a field per option, each default the command line's own.

    :func:`run_fit` runs it; ``dfairpca fit`` builds it from its options
    (:meth:`from_args`) and ``dfairpca demo`` from its few.
    """

    store: str
    out: str
    k: int
    method: str = "fair"
    array: str | None = None
    missing_chunks: str = "error"
    attribute: tuple[str, ...] = ()
    sensitive_array: tuple[str, ...] = ()
    sensitive_csv: str | None = None
    sensitive_column: tuple[str, ...] = ()
    constraint: str = "demographic_parity"
    target: str | None = None
    target_array: str | None = None
    target_column: str | None = None
    target_csv: str | None = None
    tradeoff: float = 0.0
    equalize: float = 0.5
    svd_solver: str = "auto"
    n_oversamples: int = 10
    iterated_power: str | int = "auto"
    random_state: int = 0
    statistics: bool = False
    checkpoint: str | None = None
    resume: bool = False
    rows_per_chunk: int | None = None
    overwrite: bool = False
    scheduler: str | None = None
    scheduler_file: str | None = None
    timeout: float = CLUSTER_TIMEOUT
    storage_options: str | None = None

    @classmethod
    def from_args(cls, args) -> "FitJob":
        """The job of parsed ``fit`` options (repeatable options as tuples)."""
        values = {f.name: getattr(args, f.name) for f in fields(cls)}
        return cls(**{k: _tuple(v) for k, v in values.items()})


def _check_method_options(args) -> None:
    """Refuse a fit option that ``--method`` would silently ignore.

    Only options the user gave count (a value other than the default), so that writing
    out a default, e.g. ``--constraint demographic_parity``, stays harmless.
    """
    defaults = {f.name: f.default for f in fields(FitJob)}
    given = [o for o in FAIR_ONLY if _tuple(getattr(args, o)) != defaults[o]]
    if args.method == "pca" and given:
        option = "--" + given[0].replace("_", "-")
        needs = "--method fair-s" if given[0] == "equalize" else "--method fair or fair-s"
        raise CLIError(
            f"{option} needs {needs}; --method pca (plain PCA, no protected attributes) would "
            f"ignore it: drop {option}, or choose a fair method"
        )
    odd = _randomized_options(args)
    exact = (f"--svd-solver {args.svd_solver} (the exact one-pass fit)"
             if args.svd_solver in ("full", "covariance_eigh") else
             "--method fair-s (Fair PCA-S needs the exact d x d solve)"
             if args.method == "fair-s" else None)
    if exact and odd:
        option = "--" + odd[0].replace("_", "-")
        fix = ("--svd-solver randomized or auto" if args.method != "fair-s" else
               "--method fair for a randomized fit")
        raise CLIError(f"{option} sets the randomized solve; {exact} would ignore it: drop "
                       f"{option}, or use {fix}")
    if args.method != "fair-s" and "equalize" in given:
        raise CLIError(
            "--equalize needs --method fair-s (fair PCA that also equalises the group "
            f"covariances); --method {args.method} would ignore it: add --method fair-s, or "
            "drop --equalize"
        )


def _randomized_options(args) -> list[str]:
    """The randomized solve's options the user set (a value other than the default)."""
    defaults = {f.name: f.default for f in fields(FitJob)}
    return [o for o in RANDOMIZED_ONLY if getattr(args, o) != defaults[o]]


def _note_unused_randomized(args, est, d: int, ckpt) -> None:
    """Say on stderr, before the pass, that ``--svd-solver auto`` chose the exact fit for
    this store's width, so that the randomized options given are not used (which solve
    auto takes needs d, known only once the store is open: hence a note, not an error)."""
    odd = _randomized_options(args)
    if args.svd_solver != "auto" or not odd:
        return
    if est._fit_solver(d, checkpoint=ckpt if args.resume else None) == "randomized":
        return
    given = ", ".join("--" + o.replace("_", "-") for o in odd)
    print(f"note: --svd-solver auto chose the exact one-pass fit for d = {d:,} and k = {args.k} "
          f"(its d x d statistics fit in memory and cost less), which does not use {given}: "
          f"pass --svd-solver randomized to fit with {'them' if len(odd) > 1 else 'it'}",
          file=sys.stderr)


def _check_two_groups(groups) -> None:
    """Refuse a protected attribute with one label in every row, naming the label plainly
    (the library's message shows numpy's repr and its Python fix)."""
    import pandas as pd

    for name in groups:
        labels = pd.unique(groups[name])
        if len(labels) == 1:
            raise CLIError(
                f"the protected attribute {name!r} has a single group ({_plain(labels[0])}) in "
                f"all {len(groups):,} rows; fair PCA needs two or more: name another attribute, "
                "or fit plain PCA with --method pca"
            )


# ----------------------------------------------------------------------------- the model
def _estimator(args):
    from . import FairPCA, PCA

    # a progress bar redraws itself many times a second: only on a terminal, never into the
    # log file of a batch job (nor into --json's stdout, which then is stderr: see main)
    progress = sys.stdout.isatty()
    solve = dict(svd_solver=args.svd_solver, n_oversamples=args.n_oversamples,
                 iterated_power=args.iterated_power, random_state=args.random_state)
    if args.method == "pca":
        return PCA(args.k, progress=progress, **solve)
    eq = args.equalize if args.method == "fair-s" else None
    return FairPCA(
        args.k, constraint=args.constraint, tradeoff=args.tradeoff,
        equalize_covariance=eq, progress=progress, **solve,
    )


def _plain(value):
    """``value`` as JSON can hold it: numpy scalars and arrays as Python numbers and lists,
    a non-finite float as None (JSON has no NaN)."""
    if isinstance(value, np.ndarray):
        return [_plain(v) for v in value.tolist()]
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _fit_summary(est, args, data: _Data, fit_seconds: float, wall_seconds: float) -> dict:
    """What ``fit --json`` prints: sizes, groups, variance kept, certificate, times, path."""
    summary = {
        "command": "fit", "n": int(data.X.shape[0]), "d": int(est.n_features_in_),
        "k": int(est.n_components_), "method": args.method, "estimator": type(est).__name__,
        "svd_solver": getattr(est, "fitted_svd_solver_", None),  # what "auto" chose
        "passes": int(getattr(est, "n_passes_", 1)),  # over X
    }
    if hasattr(est, "groups_"):
        summary["constraint"] = est.constraint
        summary["n_constraints"] = int(est.n_constraints_)
        # rows per group among the rows fitted (those with y == 1 for equal opportunity)
        summary["groups"] = {
            str(name): {str(label): int(count) for label, count in zip(labels, a.counts)}
            for name, labels, a in zip(est.attribute_names_, est.groups_,
                                       est.statistics_.attributes)
        }
    summary["n_samples_seen"] = int(est.n_samples_seen_)
    summary["explained_variance_ratio_sum"] = _plain(float(est.explained_variance_ratio_.sum()))
    # the fairness certificate, whatever fields the estimator has (fairness_violation_, ...)
    for attr in sorted(vars(est)):
        if attr.startswith("fairness_") and attr.endswith("_"):
            summary[attr[:-1]] = _plain(getattr(est, attr))
    summary.update({
        "fit_seconds": round(fit_seconds, 3), "wall_seconds": round(wall_seconds, 3),
        "out": str(args.out), "store": str(args.store), "array": data.label,
    })
    return summary


def _cast_like(R, dtype):
    """A reconstruction in the input's dtype: integers rounded and clipped to their range."""
    import dask.array as da

    dtype = np.dtype(dtype)
    if dtype.kind == "b":
        return R > 0.5
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return da.clip(da.round(R), info.min, info.max).astype(dtype)
    return R.astype(dtype)


# ----------------------------------------------------------------------------- commands
@contextlib.contextmanager
def _saying_how_to_resume():
    """Pass on what a store writer notes (where its finished chunks are, how to resume):
    in the one-line error, or on stderr before the Ctrl-C line."""
    try:
        yield
    except KeyboardInterrupt as exc:
        for note in getattr(exc, "__notes__", ()):
            print(f"dfairpca: {note}", file=sys.stderr)
        raise
    except (ValueError, OSError) as exc:  # OSError: e.g. an upload refused, a full disk
        if not getattr(exc, "__notes__", None):
            raise
        raise CLIError(f"{exc}; {'; '.join(exc.__notes__)}") from None


def cmd_synth(args):
    from .celeba import synth_celeba

    out = _place(args.out, "store", _storage(args))
    _check_out(out, "store", args.overwrite)
    t = time.perf_counter()
    with _saying_how_to_resume():
        synth_celeba(out, n=args.n, seed=args.seed, size=args.size, color=args.color,
                     overwrite=args.overwrite, n_jobs=args.n_jobs, stage_dir=args.stage_dir)
    print(f"wrote {args.n:,} synthetic faces to {out} in {time.perf_counter() - t:.1f} s")


def cmd_ingest(args):
    from .celeba import ingest_celeba
    from .cluster import connect

    out = _place(args.out, "store", _storage(args))
    _check_out(out, "store", args.overwrite, {"the CelebA folder": args.celeba_dir})
    t = time.perf_counter()
    options = dict(size=args.size, color=args.color, overwrite=args.overwrite, stage_dir=args.stage_dir)
    if args.scheduler is None and args.scheduler_file is None:
        with _saying_how_to_resume():
            ingest_celeba(args.celeba_dir, out, n_jobs=args.n_jobs, **options)
    else:  # the chunks run as Dask tasks on that cluster's workers
        with connect(args.scheduler, args.scheduler_file, timeout=args.timeout, local=False) as client, \
                _saying_how_to_resume():
            ingest_celeba(args.celeba_dir, out, client=client, **options)
    print(f"ingested {args.celeba_dir} into {out} in {time.perf_counter() - t:.1f} s")


def cmd_fit(args):
    return run_fit(FitJob.from_args(args))


def run_fit(args: FitJob) -> dict:
    """Fit, save the model, and return the summary ``fit --json`` prints.

    Every parameter is checked against the data first, then the pass runs on the cluster
    of ``args`` (see :func:`dfairpca.cluster.connect`) with a checkpoint next to the model.
    """
    from .io._remote import is_remote
    from .io._writes import read_marker, remove_directory, staged_locally

    start = time.perf_counter()
    _check_method_options(args)
    out = _place(args.out, "model", _storage(args))
    ckpt = (_place(args.checkpoint, "checkpoint", _storage(args)) if args.checkpoint else
            _place(f"{args.out.rstrip('/')}.checkpoint", "checkpoint", _storage(args)) if is_remote(out) else
            out.with_name(out.name + ".checkpoint"))
    inputs = _input_paths(args)
    _check_out(out, "model", args.overwrite, {**inputs, "the checkpoint": ckpt})
    # the checkpoint is replaced after every segment: only a dfairpca checkpoint may be there
    _check_out(ckpt, "checkpoint", True, {**inputs, "the model": out})
    if read_marker(ckpt) is not None and not args.resume and not args.overwrite:
        raise CLIError(
            f"an interrupted fit left its checkpoint at {ckpt}; pass --resume to continue "
            "it or --overwrite to start over"
        )
    data = _data(args, args.rows_per_chunk)
    X = data.X
    fair = args.method != "pca"
    groups = _sensitive(args, data) if fair else None
    if fair and groups is None:
        raise CLIError(
            "name the protected attribute(s): --attribute NAME (a CelebA attribute, e.g. "
            "Eyeglasses), --sensitive-array ARRAY, or --sensitive-csv FILE --sensitive-column COL"
        )
    if groups is not None:
        _check_two_groups(groups)
    y = _target(args, data)
    est = _estimator(args)
    # every parameter error now, before a cluster is found or started
    if groups is None:
        est.validate_fit(X, y)
    else:
        est.validate_fit(X, y, sensitive_features=groups)
    n, d = X.shape[0], int(np.prod(X.shape[1:]))
    _note_unused_randomized(args, est, d, ckpt)
    rows = "images" if data.celeba else "rows"
    described = "" if groups is None else f"; groups {_describe_groups(groups, args.attribute)}"
    print(f"n = {n:,} {rows}, d = {d:,} features{described}")
    if not args.resume and read_marker(ckpt) is not None:
        remove_directory(ckpt, "checkpoint")  # --overwrite: start over (checked above)
    with _client(args):
        from .cluster import WorkersLost

        t = time.perf_counter()
        # --timeout also bounds the wait for new workers once every worker has left
        fit = dict(checkpoint=ckpt, keep_checkpoint=True, timeout=args.timeout)
        try:
            if groups is None:
                est.fit(X, **fit)
            else:
                est.fit(X, y, sensitive_features=groups, **fit)
        except WorkersLost as exc:
            raise CLIError(f"{exc.what}; the checkpoint {ckpt} holds {exc.progress}: start "
                           "workers and rerun with --resume, or wait longer with --timeout") from None
        dt = time.perf_counter() - t
    with staged_locally(out, "model", overwrite=args.overwrite) as local:
        est.save(local, statistics=args.statistics, overwrite=args.overwrite)
    remove_directory(ckpt, "checkpoint")
    kept = 100 * est.explained_variance_ratio_.sum()
    cert = getattr(est, "fairness_violation_", None)  # share of any group's mean gap kept
    passes = int(getattr(est, "n_passes_", 1))
    print(f"{type(est).__name__} k = {est.n_components_}: {kept:.2f}% of the variance kept; "
          + ("" if cert is None else f"fairness certified: group-mean gap kept {cert:.1e}; ")
          + f"solver {est.fitted_svd_solver_}, {passes} pass{'es' if passes > 1 else ''} over X; "
          + f"fit in {dt:.1f} s; model written to {out}")
    return _fit_summary(est, args, data, dt, time.perf_counter() - start)


def cmd_transform(args):
    import dask.array as da

    from . import load
    from .io._remote import zarr_store
    from .io._writes import atomic_directory, marker_attributes, writing_every_chunk
    from .celeba.schema import ROW_DIMENSION, copy_labels, dimension_names
    from .cluster import check_inputs_shared, check_workers_see
    from .io import check_written

    start = time.perf_counter()
    out = _place(args.out, TRANSFORM_KIND, _storage(args))
    protect = {**_input_paths(args), "the model": args.model}
    _check_out(out, TRANSFORM_KIND, args.overwrite, protect)
    model = load(args.model, storage_options=_storage(args))
    data = _data(args)
    X = data.X
    # the lazy graph first: a model of another d is refused before any cluster starts
    Xf = X.reshape(X.shape[0], -1)
    if args.reconstruct:
        R = model.inverse_transform(model.transform(Xf))
        Y = _cast_like(R, X.dtype).reshape(data.shape)
        name = data.name  # under the input's own name: "images" for the CelebA layout
    else:
        Y = model.transform(Xf)
        name = "representation"
    with _client(args) as client:
        t = time.perf_counter()
        check_inputs_shared(X, client)
        # a URL's result is written by the workers straight to its temporary prefix
        with atomic_directory(out, TRANSFORM_KIND, overwrite=args.overwrite, protect=protect,
                              direct=True) as tmp, writing_every_chunk():
            import zarr

            check_workers_see(client, tmp, "the output store", output=True, shown=out)
            g = zarr.open_group(zarr_store(tmp, _storage(args)), mode="w", attributes={
                "model": str(args.model), "source": data.label, "content": name,
                **marker_attributes(TRANSFORM_KIND),
            })
            # created here, not by da.to_zarr, so that it writes every chunk (the setting
            # travels with the array to the workers)
            dims = dimension_names(Y.ndim) if args.reconstruct else (ROW_DIMENSION, "component")
            arr = g.create_array(name, shape=Y.shape, chunks=Y.chunksize, dtype=Y.dtype,
                                 dimension_names=dims)
            da.to_zarr(Y, arr, compute=True)
            # the CelebA layout's labels travel along (other stores' rows keep X's order)
            if data.celeba:
                copy_labels(data.root, g)
            check_written(g, out)  # the workers' chunks, as this process sees them
        dt = time.perf_counter() - t
    print(f"wrote {name} {Y.shape} to {out} in {dt:.1f} s")
    return {
        "command": "transform", "n": int(X.shape[0]), "d": int(Xf.shape[1]),
        "k": int(model.n_components_), "estimator": type(model).__name__, "written": name,
        "shape": [int(s) for s in Y.shape], "dtype": str(Y.dtype), "seconds": round(dt, 3),
        "wall_seconds": round(time.perf_counter() - start, 3), "out": str(out),
        "model": str(args.model), "store": str(args.store), "array": data.label,
    }


def cmd_show(args):
    from .celeba.figures import DEFAULT_FACES

    # the default (a few faces) shrinks to what a small store holds; a number asked for is
    # checked against it
    path = run_show(args.model, args.store, args.out, n=None if args.n == DEFAULT_FACES else args.n,
                    overwrite=args.overwrite)
    print(f"picture written to {path}")


def run_show(model_path, store, out, *, n: int | None = None, overwrite: bool = False) -> Path:
    """Draw the faces picture of a saved model; ``n=None`` is the default number of faces,
    fewer when the store holds fewer.  A number the store cannot fill, or above
    :data:`dfairpca.celeba.figures.MAX_FACES_PER_ROW`, is refused before any face is read."""
    from . import load
    from .celeba.figures import DEFAULT_FACES, MAX_FACES_PER_ROW, faces_figure, faces_held

    out = Path(out)
    _check_out(out, "figure", overwrite, {"the input store": store, "the model": model_path})
    model = load(model_path)
    held = faces_held(model, store)
    largest = min(held, MAX_FACES_PER_ROW)
    if n is None:
        n = min(DEFAULT_FACES, largest)
    elif n > largest:
        why = (f"a picture shows at most {MAX_FACES_PER_ROW} faces per row" if held > MAX_FACES_PER_ROW
               else f"{store} can fill at most {held:,} per row for this model")
        raise CLIError(f"--n {n:,}: {why}; use --n {largest} or less")
    return faces_figure(model, store, out, n=n, overwrite=overwrite)


def cmd_demo(args):
    from .celeba import ensure_store

    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    store = work / f"synthetic_celeba_{args.n}.zarr"
    existed, t = store.exists(), time.perf_counter()
    try:
        ensure_store(store, args.n)  # an existing one is checked: the store asked for, or not
    except ValueError as exc:
        if "holds another store" not in str(exc):
            raise CLIError(f"{exc} (here: another --workdir)") from None
        what = str(exc).split("; pass another path")[0]
        raise CLIError(f"{what}: it was written with other settings or by an older dfairpca; "
                       f"delete {store} (the demo writes it again) or pass another --workdir") from None
    print(f"using the existing store {store}" if existed else
          f"wrote {args.n:,} synthetic faces to {store} in {time.perf_counter() - t:.1f} s")
    model = work / f"fair_{args.attribute}_k{args.k}"
    run_fit(FitJob(str(store), str(model), args.k, attribute=(args.attribute,), overwrite=True,
                   scheduler=args.scheduler, scheduler_file=args.scheduler_file,
                   timeout=args.timeout))
    path = run_show(model, store, work / "faces.png", overwrite=True)
    print(f"picture written to {path}")


# ----------------------------------------------------------------------------- parser
class _UsageError(Exception):
    """A command line argparse refused: reported by :func:`main` like any other error."""

    def __init__(self, prog: str, message: str):
        super().__init__(f"{prog}: error: {message} (see {prog} --help)")


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Every option's help ends with its default; an option without one (None) says in
    its own words what happens instead."""

    def _get_help_string(self, action):
        if action.default is None or "(default: " in (action.help or ""):
            return action.help
        return super()._get_help_string(action)


class _Parser(argparse.ArgumentParser):
    """argparse without the usage block on errors: one line, like every other error."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", _HelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message):
        raise _UsageError(self.prog, message)


def _positive(kind):
    """An argparse type: ``kind`` (int or float) greater than zero."""
    name = "integer" if kind is int else "number"

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            value = None
        if value is None or not value > 0:
            raise argparse.ArgumentTypeError(f"must be a positive {name}; got {text!r}")
        return value

    parse.__name__ = f"positive {name}"
    return parse


def _face_size(full: bool):
    """An argparse type: a side (``80``), ``HxW`` (``218x178``) or, if ``full``, ``full``."""
    def parse(text: str):
        if full and text == "full":
            return text
        parts = text.lower().split("x")
        if len(parts) in (1, 2) and all(p.isdigit() and int(p) > 0 for p in parts):
            return int(parts[0]) if len(parts) == 1 else (int(parts[0]), int(parts[1]))
        raise argparse.ArgumentTypeError(
            f"must be a side (80), HEIGHTxWIDTH (218x178){' or full' if full else ''}; got {text!r}")

    parse.__name__ = "face size"
    return parse


def _add_face_options(p, size_help: str, default_size: int, full: bool):
    """--size, --color and --n-jobs of the commands that write a CelebA store."""
    p.add_argument("--size", type=_face_size(full), default=str(default_size), help=size_help)
    p.add_argument("--color", action="store_true",
                   help="RGB faces (n, H, W, 3) instead of grey (n, H, W)")
    p.add_argument("--n-jobs", type=_positive(int), metavar="N",
                   help="processes writing chunks, this one included (default: the usable CPUs)")


OVERWRITE_HELP = "replace what dfairpca wrote there before (never anything else)"
JSON_HELP = ("print one JSON object (the summary) on stdout, and send the human lines, progress "
             "and cluster messages to stderr")


def _power(text: str):
    """An argparse type: "auto" or an integer >= 0 (``--iterated-power``)."""
    if text == "auto":
        return text
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 'auto' or an integer >= 0; got {text!r}")
    return value


STORAGE_HELP = ("options of the file system of s3:// (or any fsspec) URLs, as a JSON object, "
                "e.g. '{\"endpoint_url\": \"http://localhost:9000\", \"key\": \"...\", \"secret\": \"...\"}' "
                "(default: the environment's, e.g. AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, "
                "AWS_ENDPOINT_URL)")


def _add_storage(p):
    p.add_argument("--storage-options", metavar="JSON", help=STORAGE_HELP)


def _add_stage(p):
    p.add_argument("--stage-dir", metavar="DIR",
                   help="for a URL OUT: the local folder under which the store is staged before "
                        "its upload, kept if interrupted so that the same command resumes "
                        "(default: $DFAIRPCA_STAGE_DIR, else ~/.cache/dfairpca/stage; with "
                        "--scheduler the workers must see it)")


def _add_cluster(p, scheduler_help: str = "tcp://host:port of a Dask scheduler (default: start "
                                          "a local cluster sized to this machine)",
                 fits: bool = False):
    g = p.add_argument_group("cluster")
    g.add_argument("--scheduler", metavar="ADDRESS", help=scheduler_help)
    g.add_argument("--scheduler-file", metavar="PATH",
                   help="scheduler file written by `dask scheduler --scheduler-file` "
                        "(default: none, see --scheduler)")
    during = ("; and, once every worker has left during the fit, for new ones (then the fit "
              "stops, its checkpoint kept for --resume)") if fits else ""
    g.add_argument("--timeout", type=_positive(float), default=CLUSTER_TIMEOUT, metavar="SECONDS",
                   help="how long to wait for the scheduler to answer, then for a first "
                        f"worker{during}")


def _add_array(p):
    p.add_argument("--array", metavar="ARRAY",
                   help="the data X: an array of STORE (a path inside it, e.g. X or data/X) or "
                        "the path of a Zarr array, of shape (n, ...) (default: the CelebA "
                        "layout's images)")
    p.add_argument("--missing-chunks", choices=["error", "fill"], default=FitJob.missing_chunks,
                   help="a chunk absent from the store of X or of a label array: an error, or "
                        "(fill) the array's fill value, for stores whose writer leaves out "
                        "constant chunks on purpose (zarr-python does by default); CelebA "
                        "attributes are always read whole")


def build_parser() -> argparse.ArgumentParser:
    from .base._system import BLOCK_BYTES
    from .base._version import __version__
    from .celeba.schema import DEFAULT_FACES, DEFAULT_SIZE

    ap = _Parser(prog="dfairpca", description="PCA and fair PCA on Zarr stores, on a Dask "
                 "cluster; run dfairpca COMMAND --help for a command's options")
    ap.add_argument("--version", action="version", version=f"dfairpca {__version__}",
                    help="print dfairpca's version and exit")
    sub = ap.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("synth-celeba", help="write a synthetic CelebA-shaped Zarr store")
    p.add_argument("out", metavar="OUT", help="the Zarr store to write (a directory)")
    p.add_argument("--n", type=_positive(int), default=202_599, help="number of faces")
    p.add_argument("--seed", type=int, default=0,
                   help="random seed (the same seed, the same faces)")
    _add_face_options(p, "faces are SIZE x SIZE pixels, or HxW (218x178: CelebA's aligned faces)",
                      DEFAULT_SIZE, full=False)
    p.add_argument("--overwrite", action="store_true", help=OVERWRITE_HELP)
    _add_storage(p)
    _add_stage(p)
    p.set_defaults(func=cmd_synth)

    p = sub.add_parser("ingest-celeba", help="convert the official CelebA folder to a Zarr store")
    p.add_argument("celeba_dir", metavar="CELEBA_DIR",
                   help="the CelebA download: img_align_celeba/ and the list_*.txt files")
    p.add_argument("out", metavar="OUT", help="the Zarr store to write (a directory)")
    _add_face_options(p, "faces are centre-cropped and resized to SIZE x SIZE pixels, or HxW; "
                      "full: the images' own size", DEFAULT_SIZE, full=True)
    p.add_argument("--overwrite", action="store_true", help=OVERWRITE_HELP)
    _add_storage(p)
    _add_stage(p)
    _add_cluster(p, "tcp://host:port of a Dask scheduler whose workers decode the chunks (they "
                    "must see CELEBA_DIR and OUT at the same paths) (default: none: --n-jobs "
                    "local processes)")
    p.set_defaults(func=cmd_ingest)

    p = sub.add_parser("fit",
                       help="fit PCA / fair PCA on a Zarr store (CelebA layout or any array)")
    p.add_argument("store", metavar="STORE",
                   help="a Zarr store: a group (CelebA layout unless --array) or a bare array")
    _add_array(p)
    p.add_argument("-k", "--k", type=_positive(int), required=True,
                   help="number of components (required)")
    p.add_argument("--out", required=True, help="model directory to write (required)")
    p.add_argument("--method", choices=["pca", "fair", "fair-s"], default=FitJob.method,
                   help="pca: standard PCA; fair: fair PCA (equal group means); fair-s: fair PCA "
                        "that also (approximately) equalises the group covariances")
    g = p.add_argument_group("protected attributes (fair methods; the sources combine)")
    g.add_argument("--attribute", action="append", default=[], metavar="NAME",
                   help="a CelebA attribute of STORE (0/1 or -1/1), e.g. Eyeglasses; "
                        "repeatable (default: none)")
    g.add_argument("--sensitive-array", action="append", default=[], metavar="ARRAY",
                   help="labels of any type from a Zarr array: an array of STORE or a path; "
                        "(n,) is one attribute, (n, p) p attributes; repeatable (default: none)")
    g.add_argument("--sensitive-csv", metavar="FILE",
                   help="a CSV file, or Parquet by its extension .parquet/.pq (needs pyarrow), "
                        "whose row i labels row i of X (default: none)")
    g.add_argument("--sensitive-column", action="append", default=[], metavar="COL[,COL...]",
                   help="columns of --sensitive-csv to use as protected attributes; "
                        "repeatable (default: none)")
    g = p.add_argument_group("constraint")
    g.add_argument("--constraint", choices=["demographic_parity", "equal_opportunity"],
                   default=FitJob.constraint,
                   help="equal_opportunity fits on the rows whose task label is 1 and needs "
                        "one of --target, --target-array, --target-column")
    for flag, metavar, what in zip(TARGET_OPTIONS, ("NAME", "ARRAY", "COL"), (
            "a CelebA attribute of STORE", "a 0/1 (or -1/1, bool) Zarr array of STORE or a path",
            "a 0/1 column of --target-csv")):
        g.add_argument(flag, metavar=metavar,
                       help=f"task label for equal opportunity: {what} (default: none)")
    g.add_argument("--target-csv", metavar="FILE",
                   help="the CSV/Parquet file of --target-column (default: the --sensitive-csv "
                        "file)")
    g.add_argument("--tradeoff", type=float, default=FitJob.tradeoff,
                   help="λ in [0, 1]: also output the standard PCA components scaled by λ")
    g.add_argument("--equalize", type=float, default=FitJob.equalize,
                   help="fair-s: the fraction f of Fair PCA-S (f)")
    g = p.add_argument_group("solver")
    g.add_argument("--svd-solver", choices=["auto", "full", "randomized"], default=FitJob.svd_solver,
                   help="full: the exact one-pass fit (d x d statistics); randomized: block Krylov "
                        "passes over X, memory d x (k + p), for large d or small k; auto: chosen "
                        "by a memory and cost model (the summary says which ran)")
    g.add_argument("--n-oversamples", type=_positive(int), default=FitJob.n_oversamples,
                   metavar="P", help="randomized: the blocks have k + P columns")
    g.add_argument("--iterated-power", type=_power, default=FitJob.iterated_power, metavar="Q",
                   help="randomized: at most Q + 2 passes over X; auto stops once the captured "
                        "variance is within 1e-4 of the optimum, by its Ritz residuals")
    g.add_argument("--random-state", type=int, default=FitJob.random_state, metavar="SEED",
                   help="randomized: the seed of the start block")
    g = p.add_argument_group("output and the pass")
    g.add_argument("--json", action="store_true", help=JSON_HELP)
    g.add_argument("--statistics", action="store_true",
                   help="also save the d x d statistics with the model")
    g.add_argument("--checkpoint", metavar="DIR",
                   help="where the pass saves its running statistics, a randomized fit its "
                        "state after every pass (default: OUT.checkpoint)")
    g.add_argument("--resume", action="store_true",
                   help="continue an interrupted fit from its checkpoint, skipping finished "
                        "chunks (randomized: passes)")
    g.add_argument("--rows-per-chunk", type=_positive(int),
                   help="rows per task of the pass (default: store chunks merged to "
                        f"~{BLOCK_BYTES >> 20} MiB)")
    g.add_argument("--overwrite", action="store_true", help=OVERWRITE_HELP)
    _add_storage(g)
    _add_cluster(p, fits=True)
    p.set_defaults(func=cmd_fit)

    p = sub.add_parser("transform", help="project a store lazily and write the result to Zarr")
    p.add_argument("model", metavar="MODEL", help="a model written by dfairpca fit")
    p.add_argument("store", metavar="STORE",
                   help="a Zarr store: a group (CelebA layout unless --array) or a bare array")
    _add_array(p)
    p.add_argument("--out", required=True,
                   help="the Zarr store to write: the array 'representation' (n, k), or with "
                        "--reconstruct X's reconstruction under X's name (required)")
    p.add_argument("--reconstruct", action="store_true",
                   help="write the reconstruction in X's space and dtype (images for CelebA)")
    p.add_argument("--json", action="store_true", help=JSON_HELP)
    p.add_argument("--overwrite", action="store_true", help=OVERWRITE_HELP)
    _add_storage(p)
    _add_cluster(p)
    p.set_defaults(func=cmd_transform)

    p = sub.add_parser("show", help="picture of original and fair faces (paper's Figure 5)")
    p.add_argument("model", metavar="MODEL",
                   help="a model written by dfairpca fit on CelebA images")
    p.add_argument("store", metavar="STORE", help="a CelebA-layout store of the model's image size")
    p.add_argument("--out", default="faces.png", help="the PNG file to write")
    p.add_argument("--n", type=_positive(int), default=DEFAULT_FACES, help="faces per row")
    p.add_argument("--overwrite", action="store_true", help="replace a picture dfairpca drew")
    p.set_defaults(func=cmd_show)

    p = sub.add_parser("demo", help="the main job: synth-celeba -> fit -> show")
    p.add_argument("--n", type=_positive(int), default=202_599, help="number of synthetic faces")
    p.add_argument("-k", "--k", type=_positive(int), default=400, help="number of components")
    p.add_argument("--attribute", default="Eyeglasses", help="the protected CelebA attribute")
    p.add_argument("--workdir", default="dfairpca-demo",
                   help="folder for the store, the model and faces.png")
    _add_cluster(p, fits=True)
    p.set_defaults(func=cmd_demo)

    from . import paper  # argparse only: the experiments import lazily

    p = sub.add_parser("paper", help="rerun the paper's tables and figures into a report (DIR/README.md)")
    paper.add_arguments(p)
    p.set_defaults(func=paper.main)
    return ap


@contextlib.contextmanager
def _showing_log():
    """The package's INFO messages (the local cluster and its dashboard, a wait for a
    worker) on stderr as "dfairpca: ..." lines while a command runs; the logger's level
    and handlers are restored after."""
    logger = logging.getLogger("dfairpca")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("dfairpca: %(message)s"))
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def main(argv=None) -> int:
    """Run one command; return its exit status (0, 2 on an error, 130 on Ctrl-C).

    With ``--json`` the command's summary is printed on stdout as one JSON line, and all
    else that would go to stdout (human summaries, progress bars) goes to stderr.
    """
    try:
        args = build_parser().parse_args(argv)
    except _UsageError as exc:
        print(exc, file=sys.stderr)
        return 2
    except SystemExit as exc:  # --help, --version: printed, and done
        return exc.code if isinstance(exc.code, int) else 0
    as_json = getattr(args, "json", False)
    stdout = sys.stdout
    try:
        with _showing_log(), contextlib.redirect_stdout(sys.stderr) if as_json else \
                contextlib.nullcontext():
            summary = args.func(args)
    except ONE_LINE_ERRORS as exc:
        msg = one_line(exc)
        io = sys.modules.get("dfairpca.io")  # imported (here, not before: 0.2 s) if it raised
        if (io is not None and isinstance(exc, io.MissingChunkError)
                and getattr(args, "missing_chunks", None) == "error"):
            msg = f"{msg} (here: --missing-chunks fill, for X and label arrays)"
        print(f"dfairpca {args.command}: error: {msg}", file=sys.stderr)
        return 2
    except Exception as exc:
        if not _malformed_file(exc):
            raise  # a bug: its traceback
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        print(f"dfairpca {args.command}: error: a Zarr store or JSON file it read is malformed "
              f"({type(exc).__name__}: {first}); check the stores and files given, or rewrite "
              "them", file=sys.stderr)
        return 2
    except KeyboardInterrupt as exc:
        # a checkpointed pass's PassInterrupted (its module imported if it raised one: not
        # before, it costs an ingest's start 0.4 s); else outside a pass, or a second Ctrl-C
        # while the cluster closes
        checkpoint = sys.modules.get("dfairpca.engine.checkpoint")
        if checkpoint is not None and isinstance(exc, checkpoint.PassInterrupted):
            resume = "; rerun with --resume" if args.command == "fit" else ""
            print(f"dfairpca {args.command}: interrupted after {exc.progress}{resume}",
                  file=sys.stderr)
        else:
            print(f"dfairpca {args.command}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    if as_json:
        print(json.dumps(summary, allow_nan=False), file=stdout, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
