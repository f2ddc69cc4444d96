"""Files: reading Zarr stores as Dask arrays, saving and loading models without pickle.

A saved object is a directory holding ``arrays.npz`` (plain numeric/string arrays, read
with ``allow_pickle=False``) and ``meta.json``.  Every directory dfairpca writes (models,
statistics, checkpoints, Zarr stores) goes through :func:`atomic_directory`: it carries
dfairpca's marker (:data:`MARKER`), is written to a temporary sibling and moved into place
only when complete, and replaces only a directory carrying the same marker -- dfairpca
never deletes or overwrites what it did not write.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import socket
import tempfile
import uuid
from pathlib import Path

import numpy as np

__all__ = [
    "from_zarr", "save_arrays", "load_arrays", "atomic_directory", "move_into_place",
    "check_target", "remove_directory", "recover", "read_marker", "write_marker", "marker",
    "marker_attributes", "writing_every_chunk", "local_zarr_roots", "OutputPathError", "MARKER",
    "MARKER_KEY",
    "FORMAT_VERSION",
]

FORMAT_VERSION = 1


def from_zarr(store, component: str | None = None, *, rows_per_chunk: int | None = None,
              storage_options: dict | None = None):
    """Open a Zarr array lazily as a Dask array chunked along rows only.

    Parameters
    ----------
    store : str, Path, zarr.Array or zarr.Group
        A Zarr array, or a group together with ``component``.
    component : str, optional
        Name of the array inside the group (e.g. ``"images"``).
    rows_per_chunk : int, optional
        Rows per Dask chunk; default: the store's own chunking along the first axis,
        merged up to roughly 64 MiB per chunk.
    storage_options : dict, optional
        For a URL (``s3://``, ``gs://``, any fsspec protocol): options of the file system,
        e.g. ``{"anon": True}``; the package (s3fs, gcsfs, ...) must be installed on the
        client and on every worker.

    Returns
    -------
    dask.array.Array
        Lazy; workers read the chunks themselves (the graph holds the store, not data).
    """
    import dask.array as da
    import zarr

    node = store
    if isinstance(store, str) and "://" in store:
        try:
            node = zarr.open(store, mode="r", storage_options=storage_options)
        except Exception as exc:
            raise ValueError(f"cannot open the Zarr store {store!r}: {exc}") from exc
    elif isinstance(store, (str, os.PathLike)):
        path = Path(store)
        if not path.exists():
            raise FileNotFoundError(f"no Zarr store at {str(path)!r}")
        try:
            node = zarr.open(str(path), mode="r")
        except Exception as exc:  # zarr raises several types for "not a store"
            raise ValueError(f"{str(path)!r} is not a Zarr store: {exc}") from exc
    if isinstance(node, zarr.Group):
        names = sorted(name for name, _ in node.arrays())
        if component is None:
            raise ValueError(
                f"{_name(store)} is a Zarr group, not an array; name the array with "
                f"component=..., one of {names}"
            )
        if component not in names:
            raise KeyError(
                f"{_name(store)} has no array {component!r}; it holds {names or 'no arrays'}"
            )
        node = node[component]
    elif component is not None:
        raise ValueError(f"{_name(store)} is a single array; drop component={component!r}")
    shape, chunks = node.shape, node.chunks
    if len(shape) < 2:
        raise ValueError(f"{_name(store)} has shape {shape}; need (n, d) or (n, h, w)")
    row_bytes = int(np.prod(shape[1:])) * node.dtype.itemsize
    if rows_per_chunk is None:
        target = max(1, (64 << 20) // max(row_bytes, 1))
        rows_per_chunk = max(chunks[0], (target // chunks[0]) * chunks[0])
    arr = da.from_zarr(node, chunks=(rows_per_chunk,) + tuple(shape[1:]))
    return arr


def local_zarr_roots(X) -> list[Path]:
    """Root folders of the local Zarr stores a Dask array's graph reads (to protect them)."""
    import zarr

    graph = X.__dask_graph__()
    roots = set()
    for layer in getattr(graph, "layers", {"": graph}).values():
        for node in layer.values():
            node = node if isinstance(node, zarr.Array) else getattr(node, "value", None)
            root = getattr(getattr(node, "store", None), "root", None)
            if isinstance(node, zarr.Array) and root is not None:
                roots.add(Path(root))
    return sorted(roots)


def _name(store) -> str:
    return repr(str(store)) if isinstance(store, (str, os.PathLike)) else "the store"


# ----------------------------------------------------------------------------- writing
#: dfairpca's marker, :func:`marker` as JSON: the file ``.dfairpca`` in every directory it
#: writes; in a Zarr store the root group's attribute ``"dfairpca"`` instead (a file in a
#: store's root makes zarr warn "not recognized as a component" on every listing); in a PNG
#: the text chunk ``"dfairpca"``.
MARKER = ".dfairpca"
MARKER_KEY = "dfairpca"
_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"

#: names of this process's own ``.tmp-``/``.old-`` siblings while a write is under way, so
#: that recovery inside this process tells them from the leftovers of an earlier failure
_ACTIVE: set[str] = set()


class OutputPathError(FileExistsError):
    """dfairpca refuses to write at a path: it would replace or delete what it did not write."""


def marker(kind: str) -> dict:
    """The content of dfairpca's marker for an object of ``kind`` ("model", "checkpoint", ...)."""
    from . import __version__

    return {"written_by": "dfairpca", "kind": kind, "version": __version__}


def marker_attributes(kind: str) -> dict:
    """Zarr group attributes that mark a store as written by dfairpca (see :data:`MARKER`)."""
    return {MARKER_KEY: marker(kind)}


def write_marker(directory, kind: str) -> None:
    """Mark ``directory`` as dfairpca's: the attribute of a Zarr group, else the file."""
    directory = Path(directory)
    if (directory / "zarr.json").is_file():
        import zarr

        zarr.open_group(str(directory), mode="r+").attrs.update(marker_attributes(kind))
        (directory / MARKER).unlink(missing_ok=True)
    else:
        (directory / MARKER).write_text(json.dumps(marker(kind)))


def read_marker(path) -> dict | None:
    """dfairpca's marker of ``path`` (a directory, a Zarr store or a PNG), or None if unmarked."""
    path = Path(path)
    found = None
    try:
        if path.is_dir():
            if (path / MARKER).is_file():
                found = json.loads((path / MARKER).read_text())
            elif (path / "zarr.json").is_file():
                attrs = json.loads((path / "zarr.json").read_text()).get("attributes") or {}
                found = attrs.get(MARKER_KEY)
        elif path.is_file():
            with open(path, "rb") as f:
                is_png = f.read(8) == _PNG_SIGNATURE
            if is_png:
                from PIL import Image

                with Image.open(path) as im:
                    text = im.text.get(MARKER_KEY)
                found = json.loads(text) if text else None
    except Exception:  # an unreadable marker is no marker: the path is then not ours
        return None
    ok = isinstance(found, dict) and found.get("written_by") == "dfairpca"
    return found if ok else None


def check_target(path, kind: str, *, overwrite: bool = False, protect: dict | None = None,
                 probe: bool = True) -> None:
    """Raise unless dfairpca may write a ``kind`` at ``path`` now; call it before any work.

    Allowed: ``path`` does not exist, is an empty directory, or (with ``overwrite``) carries
    dfairpca's marker of the same ``kind``.  Refused with :class:`OutputPathError`: a file or
    a non-empty directory without the marker, a symbolic link, another kind of dfairpca
    output, and anything that is or contains a path of ``protect`` (a mapping
    ``{"the input store": path}`` or ``(what, path)`` pairs: what this job reads or also
    writes).  The closest existing folder must be writable (:class:`PermissionError`
    otherwise; ``probe=False`` skips that check for a caller that creates a sibling right
    away).  Leftovers of an earlier crash are recovered first (:func:`recover`).
    """
    path = Path(path)
    for what, other in (protect.items() if isinstance(protect, dict) else protect or ()):
        _check_apart(path, Path(other), what)
    recover(path)
    if path.is_symlink():
        raise OutputPathError(
            f"{path} is a symbolic link; dfairpca does not replace links: choose another path "
            "or remove it yourself"
        )
    if path.exists():
        found = read_marker(path)
        if found is None and not _is_empty_dir(path):
            what = "a file" if not path.is_dir() else "a non-empty directory"
            raise OutputPathError(
                f"{path} is {what} that dfairpca did not write (it has no {MARKER} marker), "
                "and dfairpca never replaces those: choose another path or remove it yourself"
            )
        if found is not None and found.get("kind") != kind:
            raise OutputPathError(
                f"{path} holds a dfairpca {found.get('kind')}, not a {kind}: choose another "
                "path or remove it yourself"
            )
        if found is not None and not overwrite:
            raise OutputPathError(
                f"{path} already exists (a dfairpca {kind}); pass overwrite=True (--overwrite "
                "on the command line) to replace it, or choose another path"
            )
    if probe:
        _check_writable(path)


@contextlib.contextmanager
def atomic_directory(path, kind: str, *, overwrite: bool = False, protect: dict | None = None):
    """Yield a temporary directory that becomes ``path`` only if the block succeeds.

    The one way dfairpca writes a directory.  The protocol:

    1. :func:`check_target` (after recovering leftovers): refuse anything but a missing
       path, an empty directory or (``overwrite``) dfairpca's own ``kind`` -- before any work.
    2. The block writes into the sibling ``.NAME.tmp-HOST-PID-RANDOM``, marked first.
    3. :func:`move_into_place`: rename the old version to ``.NAME.old-HOST-PID-RANDOM``,
       rename the new one to ``NAME``, delete the old one.  At every moment the old or the
       new version exists whole under one of these names.
    4. A crash leaves siblings that the next write to (or :func:`recover` of) ``path``
       repairs: an ``.old-`` one is restored if ``NAME`` is missing, deleted otherwise; a
       ``.tmp-`` one is deleted.  Only siblings that carry the marker (or are empty) are
       touched, and none of a writer still running on this host.

    One writer per path at a time: two processes writing the same path concurrently may
    make one of them fail (never lose the version that was there).
    """
    path = Path(path)
    check_target(path, kind, overwrite=overwrite, protect=protect, probe=False)
    tmp = _sibling(path, "tmp")
    _ACTIVE.add(tmp.name)
    try:
        try:
            tmp.mkdir(parents=True)  # the writability probe, before the block's work
        except OSError as exc:
            raise _not_writable(path, tmp.parent, exc) from None
        write_marker(tmp, kind)  # first: a leftover of a crash is recognisably ours
        yield tmp
        write_marker(tmp, kind)  # again: a Zarr store written into tmp replaced the file
        move_into_place(tmp, path, kind, overwrite=overwrite)
    finally:
        if _exists(tmp):
            _remove_tree(tmp)
        _ACTIVE.discard(tmp.name)


def move_into_place(src, path, kind: str, *, overwrite: bool = False) -> Path:
    """Rename the finished, marked directory ``src`` to ``path`` (steps 1, 3 of
    :func:`atomic_directory`), replacing only dfairpca's own ``kind`` there."""
    src, path = Path(src), Path(path)
    check_target(path, kind, overwrite=overwrite, probe=False)  # src's folder: writable
    if not _exists(path):
        os.replace(src, path)
        return path
    old = _sibling(path, "old")
    _ACTIVE.add(old.name)
    try:
        os.replace(path, old)
        try:
            os.replace(src, path)
        except BaseException:
            os.replace(old, path)  # put the old version back; if this fails, recover() will
            raise
        _remove_tree(old)
    finally:
        _ACTIVE.discard(old.name)
    return path


def remove_directory(path, kind: str) -> None:
    """Delete ``path`` if it is dfairpca's own ``kind`` (e.g. a finished checkpoint).

    A missing path is fine; anything dfairpca did not write raises :class:`OutputPathError`.
    """
    path = Path(path)
    recover(path)
    if not _exists(path):
        return
    found = read_marker(path)
    if path.is_symlink() or not path.is_dir() or found is None or found.get("kind") != kind:
        raise OutputPathError(
            f"{path} is not a {kind} written by dfairpca; it was left in place: remove it "
            "yourself if you no longer need it"
        )
    _remove_tree(path)


def recover(path) -> None:
    """Repair what a crash in the middle of :func:`atomic_directory` left next to ``path``.

    An ``.old-`` sibling is renamed back to ``path`` if ``path`` is missing (the newest one
    wins), and deleted otherwise; a ``.tmp-`` sibling is deleted.  Only siblings carrying
    dfairpca's marker (or empty) are touched, and none of a writer still running on this
    host.
    """
    path = Path(path)
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        return
    pattern = re.compile(
        rf"\.{re.escape(path.name)}\.(old|tmp)-([A-Za-z0-9]*)-(\d+)-[0-9a-f]{{8}}"
    )
    leftovers = []
    for entry in parent.iterdir():
        m = pattern.fullmatch(entry.name)
        if m is None or _running(entry.name, m.group(2), int(m.group(3))):
            continue
        if entry.is_symlink() or not entry.is_dir():
            continue
        if read_marker(entry) is None and not _is_empty_dir(entry):
            continue  # not ours: never touched
        leftovers.append((m.group(1), entry))
    olds = sorted((e for k, e in leftovers if k == "old"), key=lambda e: e.stat().st_mtime_ns)
    for entry in reversed(olds):
        if not _exists(path):
            os.replace(entry, path)
        else:
            _remove_tree(entry)
    for kind, entry in leftovers:
        if kind == "tmp":
            _remove_tree(entry)


def _check_apart(path: Path, other: Path, what: str) -> None:
    """Refuse ``path`` if it is ``other`` or contains it (links resolved).

    Writing *inside* ``other`` is left to the other rules: it replaces nothing there.
    """
    a, b = Path(os.path.realpath(path)), Path(os.path.realpath(other))
    if a == b:
        relation = "is"
    elif a in b.parents:
        relation = "contains"
    else:
        return
    raise OutputPathError(
        f"{path} {relation} {what} {other}, which this job reads or writes: choose another path"
    )


def _check_writable(path: Path) -> None:
    """Raise PermissionError unless a sibling of ``path`` can be created (a real probe)."""
    folder = path.parent if str(path.parent) else Path(".")
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    if not folder.is_dir():
        raise OutputPathError(f"cannot write {path}: {folder} is a file, not a directory")
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".dfairpca-probe-", dir=folder))
    except OSError as exc:
        raise _not_writable(path, folder, exc) from None


def _not_writable(path: Path, folder: Path, exc: OSError) -> PermissionError:
    """The error for an output whose folder cannot be written."""
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    return PermissionError(
        f"cannot write {path}: the directory {folder} is not writable ({exc.strerror}); "
        "choose an output path in a writable directory"
    )


def _sibling(path: Path, role: str) -> Path:
    """``.NAME.{role}-HOST-PID-RANDOM`` next to ``path``: what recover() looks for."""
    host = re.sub(r"[^A-Za-z0-9]", "", socket.gethostname())[:32]
    return path.parent / f".{path.name}.{role}-{host}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def _running(name: str, host: str, pid: int) -> bool:
    """Whether the writer that made sibling ``name`` may still be running.

    On another host we cannot tell: a ``.tmp-`` sibling is left alone, an ``.old-`` one
    (which exists only for the instant between two renames) is taken as a crash's.
    """
    if host != re.sub(r"[^A-Za-z0-9]", "", socket.gethostname())[:32]:
        return ".tmp-" in name
    if pid == os.getpid():
        return name in _ACTIVE
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _exists(path: Path) -> bool:
    return path.exists() or path.is_symlink()


def _is_empty_dir(path: Path) -> bool:
    return path.is_dir() and not path.is_symlink() and next(os.scandir(path), None) is None


def _remove_tree(path: Path) -> None:
    """Delete dfairpca's directory ``path``, its marker last, so that a deletion cut short
    leaves a directory that is still recognisably ours (and is finished by recover())."""
    markers = ("zarr.json", MARKER)
    with os.scandir(path) as entries:
        children = [e for e in entries if e.name not in markers]
    for e in children:
        if e.is_dir(follow_symlinks=False):
            shutil.rmtree(e.path)
        else:
            os.unlink(e.path)
    for name in markers:
        (path / name).unlink(missing_ok=True)
    os.rmdir(path)


def writing_every_chunk():
    """Context in which Zarr arrays created or opened for writing store every chunk.

    Zarr 3 by default skips a chunk that is all fill value (``array.write_empty_chunks``
    is False), and a reader cannot tell a chunk skipped on purpose from one that was lost;
    dfairpca's stores hold every chunk so that a missing one is always an error.  The
    setting is taken when an array is created or opened, and travels with it when pickled.
    """
    import zarr

    return zarr.config.set({"array.write_empty_chunks": True})


def save_arrays(path, arrays: dict, meta: dict, overwrite: bool = False) -> Path:
    """Write ``arrays`` (.npz) and ``meta`` (JSON, with ``meta["kind"]``) to directory
    ``path`` with :func:`atomic_directory`."""
    path = Path(path)
    with atomic_directory(path, meta["kind"], overwrite=overwrite) as tmp:
        np.savez(tmp / "arrays.npz", **{k: np.asarray(v) for k, v in arrays.items()})
        with open(tmp / "meta.json", "w") as f:
            json.dump({"format_version": FORMAT_VERSION, **meta}, f, indent=1, default=_jsonable)
    return path


def load_arrays(path, kind: str | None = None):
    """Read what :func:`save_arrays` wrote; never unpickles anything."""
    path = Path(path)
    if not (path / "meta.json").exists() or not (path / "arrays.npz").exists():
        raise FileNotFoundError(
            f"{str(path)!r} is not a saved dfairpca object (expected meta.json and arrays.npz)"
        )
    with open(path / "meta.json") as f:
        meta = json.load(f)
    if meta.get("format_version", 0) > FORMAT_VERSION:
        raise ValueError(
            f"{str(path)!r} was written by a newer dfairpca (format {meta['format_version']}); "
            "upgrade dfairpca to read it"
        )
    if kind is not None and meta.get("kind") != kind:
        raise ValueError(f"{str(path)!r} holds a {meta.get('kind')!r}, not a {kind!r}")
    with np.load(path / "arrays.npz", allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    return arrays, meta


def _jsonable(o):
    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    raise TypeError(f"cannot store {type(o).__name__} in model metadata")
