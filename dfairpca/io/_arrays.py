"""Saving and loading arrays without pickle: a directory holding ``arrays.npz`` (plain
numeric/string arrays, read with ``allow_pickle=False``) and ``meta.json``, written through
the write protocol (:func:`dfairpca.io.atomic_directory`) and checked before it is
trusted (:func:`load_arrays`).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any
import zipfile

import numpy as np

from ._files import SavedFileError, open_regular, read_capped
from ._local import LocalStorage
from ._where import storage_for
from ..base._params import is_int
from ..base._typing import PathInput
from ..errors import InvalidInputError, InvalidTypeError, PathNotFoundError

__all__ = ["FORMAT_VERSION", "RESAVE_HINT", "save_arrays", "write_arrays", "load_arrays", "meta_value", "header_shape"]

FORMAT_VERSION = 1


def save_arrays(path: PathInput, arrays: dict, meta: dict, overwrite: bool = False, *,
                storage_options: dict | None = None) -> PathInput:
    """Write ``arrays`` (.npz) and ``meta`` (JSON) to a directory with :func:`atomic_directory`.

    Parameters
    ----------
    path : str or os.PathLike
        The directory, or a URL.
    arrays : dict of str to array-like
        Saved in ``arrays.npz``, without pickle.
    meta : dict
        Saved in ``meta.json``; ``meta["kind"]`` says what the directory holds (the
        ``kind`` :func:`load_arrays` checks).
    overwrite : bool
        Replace a directory of the same kind written by dfairpca, and nothing else.
    storage_options : dict, optional
        fsspec options of a URL.

    Returns
    -------
    pathlib.Path or str
        The directory written: a Path for a local one, the URL as given for a remote one.
    """
    storage = storage_for(path, storage_options)
    with storage.atomic_directory(meta["kind"], overwrite=overwrite) as tmp:
        write_arrays(tmp, arrays, meta)
    return storage.user_path()


def write_arrays(folder: Path, arrays: dict, meta: dict) -> None:
    """Write ``arrays.npz`` and ``meta.json`` into the local ``folder`` that a caller's
    atomic write (:func:`dfairpca.io.atomic_directory`) is filling; what
    :func:`save_arrays` writes, and :func:`load_arrays` reads.

    Parameters
    ----------
    folder : Path
        The folder being written (it exists).
    arrays : dict of str to array-like
        Saved in ``arrays.npz``, without pickle.
    meta : dict
        Saved in ``meta.json`` (with ``format_version``); ``meta["kind"]`` says what it is.
    """
    # Any values: numpy's stub would match a **dict of arrays against allow_pickle
    payload: dict[str, Any] = {k: np.asarray(v) for k, v in arrays.items()}
    np.savez(folder / "arrays.npz", **payload)
    with open(folder / "meta.json", "w") as f:
        json.dump({"format_version": FORMAT_VERSION, **meta}, f, indent=1, default=_jsonable)


def load_arrays(path: PathInput, kind: str | None = None, layout: Callable[[dict, dict], dict] | None = None,
                *, storage_options: dict | None = None) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Read what :func:`save_arrays` wrote, checking it before trusting it; never unpickles.

    Parameters
    ----------
    path : str or Path
        The directory holding ``meta.json`` and ``arrays.npz``; or a URL (read through a
        local copy, with ``storage_options``).
    kind : str, optional
        The ``kind`` meta.json must declare.
    layout : callable, optional
        ``layout(meta, headers) -> {name: (shape, kinds)}``, with ``headers`` the
        ``{name: (shape, dtype)}`` of every array as declared in arrays.npz (read before
        any data).  It checks meta.json (raising ValueError that says which key is wrong)
        and returns the shape (``None`` for any length) and dtype kinds each array must
        have; a name whose kinds start with ``"?"`` may be absent.  Arrays it does not
        name may be no larger than the largest it names.  Float arrays it names must be
        finite.
    storage_options : dict, optional
        fsspec options of a URL.

    Returns
    -------
    arrays : dict of str to ndarray
        The arrays of ``arrays.npz``.
    meta : dict
        The content of ``meta.json``.

    Raises
    ------
    SavedFileError
        One line naming the file and what is wrong: a link, a named pipe or a device in
        place of a file (see :mod:`dfairpca.io._files`), more bytes than dfairpca writes there,
        not JSON, a missing or mistyped key, an array of Python objects (loading it would
        unpickle), an array whose declared size disagrees with the archive or with the
        other arrays, a truncated archive.
    """
    storage = storage_for(path, storage_options)
    if storage.remote:
        with storage.local_copy() as local:
            return load_arrays(local, kind, layout)
    path = Path(storage.target)
    storage.recover_for_reading()
    if not (path / "meta.json").exists() or not (path / "arrays.npz").exists():
        # a replace cut short between its two renames leaves the whole old version in an
        # .old- sibling: of path itself, or of the folder holding it (the "model" folder
        # of a model saved by dfairpca 0.2)
        for target in (path, path.parent):
            if copies := LocalStorage(target).intact_copies():
                raise PathNotFoundError(
                    f"{str(target)!r} is missing because a write to it was cut short; its "
                    f"intact copy is {str(copies[-1])!r}: the next write to {str(target)!r} "
                    f"or dfairpca.io.recover({str(target)!r}) puts it back"
                )
        raise PathNotFoundError(
            f"{str(path)!r} is not a saved dfairpca object (expected meta.json and arrays.npz)"
        )
    try:
        meta = _read_meta(path / "meta.json")
        version = meta_value(meta, "format_version", "count", optional=True) or 0
    except ValueError as exc:
        raise SavedFileError(f"cannot load {str(path)!r}: {exc}{RESAVE_HINT}") from None
    if version > FORMAT_VERSION:
        raise InvalidInputError(
            f"{str(path)!r} was written by a newer dfairpca (format {version}); "
            "upgrade dfairpca to read it"
        )
    if kind is not None and meta.get("kind") != kind:
        raise InvalidInputError(f"{str(path)!r} holds a {meta.get('kind')!r}, not a {kind!r}")
    try:
        with open_regular(path / "arrays.npz") as npz:  # one file read, the one checked
            headers = _npz_headers(npz)
            specs = {} if layout is None else layout(meta, {k: v[:2] for k, v in headers.items()})
            _check_arrays(headers, specs)
            arrays = _read_npz(npz, headers)
        _check_finite(arrays, specs)
    except ValueError as exc:  # SavedFileError, or the layout's word on meta.json
        raise SavedFileError(f"cannot load {str(path)!r}: {exc}{RESAVE_HINT}") from None
    return arrays, meta


def _jsonable(o):
    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    raise InvalidTypeError(f"cannot store {type(o).__name__} in model metadata")


# ---------------------------------------------------------------------------- checked loading
# SavedFileError and MAX_JSON_BYTES (re-exported by dfairpca.io) live in dfairpca.io._files,
# the one reader of the files of a saved folder

#: what a refused saved file's message ends with (io's loaders and the checkpoint's progress check)
RESAVE_HINT = "; it was truncated or edited, or not written by dfairpca: save or compute it again"


def _read_meta(file: Path) -> dict:
    """The JSON object in ``file``, or SavedFileError saying why not."""
    data = read_capped(file)
    try:
        meta = json.loads(data.decode("utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise SavedFileError(f"{file.name} is not valid JSON ({exc})") from None
    if not isinstance(meta, dict):
        raise SavedFileError(f"{file.name} holds a {type(meta).__name__}, not a JSON object")
    return meta


def _npz_headers(file) -> dict:
    """``{name: (shape, dtype, header_bytes)}`` of the .npy members of the open arrays.npz
    ``file``, read from their headers.

    Reads no array data.  Refuses arrays of Python objects (loading them unpickles),
    compressed members (``save_arrays`` stores them as they are, so reading a member never
    inflates it beyond the bytes on disk) and members whose size in the zip directory
    differs from what their header declares.
    """
    try:
        zf = zipfile.ZipFile(file)
    except (zipfile.BadZipFile, OSError) as exc:
        raise SavedFileError(f"arrays.npz is not a complete zip archive ({exc})") from None
    out = {}
    with zf:
        for info in zf.infolist():
            name = info.filename[:-4] if info.filename.endswith(".npy") else None
            if not name or "/" in name or name in out:
                raise SavedFileError(f"arrays.npz holds {info.filename!r}, not an array of dfairpca")
            if info.compress_type != zipfile.ZIP_STORED:
                raise SavedFileError(
                    f"arrays.npz: {name!r} is compressed ({info.file_size} bytes from "
                    f"{info.compress_size}); dfairpca stores arrays uncompressed"
                )
            try:
                with zf.open(info) as f:
                    version = np.lib.format.read_magic(f)
                    if version == (1, 0):
                        shape, _, dtype = np.lib.format.read_array_header_1_0(f)
                    elif version == (2, 0):
                        shape, _, dtype = np.lib.format.read_array_header_2_0(f)
                    else:
                        raise InvalidInputError(f"npy format version {version}")
                    header = f.tell()
            except (ValueError, OSError, EOFError, zipfile.BadZipFile) as exc:
                raise SavedFileError(f"arrays.npz: the header of {name!r} is unreadable ({exc})") from None
            if dtype.hasobject:
                raise SavedFileError(
                    f"arrays.npz: {name!r} is an array of Python objects, which only unpickling "
                    "could read; dfairpca never unpickles"
                )
            nbytes = int(np.prod(shape, dtype=object)) * dtype.itemsize
            if info.file_size != header + nbytes:
                raise SavedFileError(
                    f"arrays.npz: {name!r} declares {shape} {dtype} ({nbytes} bytes) but the "
                    f"archive holds {info.file_size - header} bytes for it"
                )
            out[name] = (tuple(shape), dtype, nbytes)
    return out


def _check_arrays(headers: dict, specs: dict) -> None:
    """Every array named in ``specs`` present with its shape and dtype kind; others small."""
    for name, (shape, kinds) in specs.items():
        optional = kinds.startswith("?")
        if name not in headers:
            if optional:
                continue
            raise SavedFileError(f"arrays.npz has no {name!r}")
        got, dtype, _ = headers[name]
        if dtype.kind not in kinds.lstrip("?"):
            raise SavedFileError(f"arrays.npz: {name!r} has dtype {dtype}, expected kind {kinds.lstrip('?')!r}")
        if len(got) != len(shape) or any(w is not None and g != w for g, w in zip(got, shape)):
            want = "(" + ", ".join("any" if w is None else str(w) for w in shape) + \
                ("," if len(shape) == 1 else "") + ")"
            raise SavedFileError(
                f"arrays.npz: {name!r} has shape {got}, but meta.json and the other arrays "
                f"say {want}"
            )
    if specs:
        cap = max([headers[n][2] for n in specs if n in headers] + [1 << 20])
        for name, (shape, dtype, nbytes) in headers.items():
            if name not in specs and nbytes > cap:
                raise SavedFileError(
                    f"arrays.npz: {name!r} declares {shape} {dtype} ({nbytes} bytes), more "
                    f"than any array this file should hold ({cap} bytes)"
                )
    for name, (_shape, dtype, _) in headers.items():
        if dtype.kind not in "biufcU":
            raise SavedFileError(f"arrays.npz: {name!r} has dtype {dtype}, not a plain number or string")


def _read_npz(file, headers: dict) -> dict:
    """The arrays of the open arrays.npz ``file``, read without pickle once their headers
    were checked."""
    arrays = {}
    file.seek(0)  # np.load tells a zip archive by its first bytes
    with np.load(file, allow_pickle=False) as z:
        for name in headers:
            try:
                arrays[name] = z[name]
            except (ValueError, OSError, EOFError, zipfile.BadZipFile) as exc:
                raise SavedFileError(f"arrays.npz: {name!r} cannot be read ({exc})") from None
    return arrays


def _check_finite(arrays: dict, specs: dict) -> None:
    for name in specs:
        a = arrays.get(name)
        if a is not None and a.dtype.kind in "fc" and not np.isfinite(a).all():
            raise SavedFileError(f"arrays.npz: {name!r} holds NaN or infinity")


# helpers for the ``layout`` functions of the classes that load themselves
def meta_value(meta: dict, key: str, kind: str | tuple, *, optional: bool = False,
               file: str = "meta.json") -> Any:
    """``meta[key]`` checked to be of ``kind`` ("int", "count" (int >= 0), "positive",
    "number", "str", "list", "dict", "bool" or a tuple of allowed values).

    Parameters
    ----------
    meta : dict
        The JSON object read.
    key : str
        The entry.
    kind : str or tuple
        What it must be (above).
    optional : bool
        Whether it may be absent or null (then None is returned).
    file : str
        The file's name, named by the error.

    Returns
    -------
    object
        The value; InvalidInputError naming ``file`` and ``key`` if it is not of ``kind``.
    """
    if key not in meta:
        if optional:
            return None
        raise InvalidInputError(f"{file} has no {key!r}")
    v = meta[key]
    if v is None and optional:
        return None
    checks = {
        "int": is_int(v), "count": is_int(v) and v >= 0, "positive": is_int(v) and v >= 1,
        "number": isinstance(v, (int, float)) and not isinstance(v, bool) and np.isfinite(v),
        "str": isinstance(v, str), "list": isinstance(v, list), "dict": isinstance(v, dict),
        "bool": isinstance(v, bool),
    }
    ok = v in kind if isinstance(kind, tuple) else checks[kind]
    if not ok:
        what = f"one of {list(kind)}" if isinstance(kind, tuple) else {
            "count": "an integer >= 0", "positive": "an integer >= 1", "int": "an integer",
            "number": "a finite number"}.get(kind, f"a {kind}")
        raise InvalidInputError(f"{file}: {key!r} must be {what}; got {v!r:.80}")
    return v


def header_shape(headers: dict, name: str, ndim: int) -> tuple:
    """The declared shape of array ``name`` (which must exist with ``ndim`` axes).

    Parameters
    ----------
    headers : dict
        The arrays' headers, as :func:`load_arrays` gives them to a layout.
    name : str
        The array.
    ndim : int
        The number of axes it must have.

    Returns
    -------
    tuple
        Its shape; SavedFileError if it is absent or has another number of axes.
    """
    if name not in headers:
        raise SavedFileError(f"arrays.npz has no {name!r}")
    shape = headers[name][0]
    if len(shape) != ndim:
        raise SavedFileError(f"arrays.npz: {name!r} has shape {shape}, expected {ndim} axes")
    return shape
