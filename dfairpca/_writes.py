"""The write protocol: dfairpca's marker, atomic replacement and crash recovery.

Every directory dfairpca writes (models, statistics, checkpoints, Zarr stores) goes through
:func:`atomic_directory`: it carries dfairpca's marker (:data:`MARKER`), is written to a
temporary sibling and moved into place only when complete, and replaces only a directory
carrying the same marker -- dfairpca never deletes or overwrites what it did not write.
Users reach these names through :mod:`dfairpca.io`, which re-exports them.
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

__all__ = [
    "atomic_directory", "atomic_file", "move_into_place", "check_target", "foreign_entries", "remove_directory",
    "recover", "recover_for_reading", "intact_copies", "read_marker", "write_marker", "marker",
    "marker_attributes", "writing_every_chunk", "OutputPathError", "MARKER", "MARKER_KEY",
]

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


def marker(kind: str, entries=None) -> dict:
    """The content of dfairpca's marker for an object of ``kind`` ("model", "checkpoint", ...),
    with the top-level ``entries`` it wrote (what a replace may delete, and nothing else)."""
    from ._version import __version__

    found = {"written_by": "dfairpca", "kind": kind, "version": __version__}
    return found if entries is None else {**found, "entries": sorted(entries)}


#: top-level entries of each kind of directory, for markers written before they listed
#: their own ("entries"); a kind not here with such a marker has no entry known to be ours
_KNOWN_ENTRIES = {
    "model": {"model", "statistics"},
    "checkpoint": {"total", "progress.json"},
    "Moments": {"arrays.npz", "meta.json"},
    "estimator": {"arrays.npz", "meta.json"},
}


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
        entries = [e for e in os.listdir(directory) if e != MARKER]
        (directory / MARKER).write_text(json.dumps(marker(kind, entries)))


def foreign_entries(path, found: dict) -> list[str]:
    """Top-level names in dfairpca's directory ``path`` (marker ``found``) it did not write.

    A Zarr store's are all but zarr.json and the root group's own members; a directory's
    all but the marker and the entries its marker lists (or, for a marker older than that
    list, the known layout of its kind).
    """
    path = Path(path)
    names = set(os.listdir(path)) - {MARKER}
    if (path / "zarr.json").is_file():
        import zarr

        import warnings

        try:
            with warnings.catch_warnings():  # the very entries we look for make zarr warn
                warnings.simplefilter("ignore")
                ours = set(zarr.open_group(str(path), mode="r").keys()) | {"zarr.json"}
        except Exception:  # unreadable metadata: no member is known to be ours
            ours = {"zarr.json"}
    elif isinstance(found.get("entries"), list):
        ours = {e for e in found["entries"] if isinstance(e, str)}
    else:
        ours = _KNOWN_ENTRIES.get(found.get("kind"), set())
    return sorted(names - ours)


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
    output, dfairpca's own directory holding entries it did not write
    (:func:`foreign_entries`: replacing it would delete them), and anything that is or
    contains a path of ``protect`` (a mapping
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
        # a figure (a file) holds nothing; a directory may hold a user's files
        foreign = foreign_entries(path, found) if found is not None and path.is_dir() else []
        if foreign:  # replacing the directory would delete them with it
            listed = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
            raise OutputPathError(
                f"{path} is a dfairpca {kind} that also holds files dfairpca did not write "
                f"({listed}), which replacing it would delete: move your files out of it or "
                "choose another path"
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
    if not _exists(path) or src.is_file():  # a file is replaced by one rename: no old copy
        os.replace(src, path)
        return path
    old = _sibling(path, "old")
    _ACTIVE.add(old.name)
    try:
        with _interrupts_deferred():  # a Ctrl-C between the renames would leave no `path`
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


@contextlib.contextmanager
def atomic_file(path, kind: str, *, overwrite: bool = False, protect: dict | None = None):
    """Yield a temporary file path that becomes ``path`` only if the block succeeds.

    The file form of :func:`atomic_directory` (a figure): the block writes the file, with
    dfairpca's marker inside it (a PNG's text chunk, see :func:`read_marker`), at the
    sibling ``.NAME.tmp-HOST-PID-RANDOM``; one rename then replaces ``path`` atomically.
    A crash's marked leftover is deleted by :func:`recover`.
    """
    path = Path(path)
    check_target(path, kind, overwrite=overwrite, protect=protect)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _sibling(path, "tmp")
    _ACTIVE.add(tmp.name)
    try:
        yield tmp
        if read_marker(tmp) is None:
            raise ValueError(f"the {kind} written for {path} carries no dfairpca marker; not "
                             "moved into place (a file dfairpca cannot recognise is never its own)")
        move_into_place(tmp, path, kind, overwrite=overwrite)
    finally:
        if tmp.is_file():
            tmp.unlink()
        _ACTIVE.discard(tmp.name)


@contextlib.contextmanager
def _interrupts_deferred():
    """Hold a SIGINT that arrives inside the block and deliver it to the previous handler
    when the block ends (main thread only, where Python runs signal handlers)."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: held.append(frame))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if held:
            if callable(previous):
                previous(signal.SIGINT, held[0])
            elif previous == signal.SIG_DFL:
                raise KeyboardInterrupt


def remove_directory(path, kind: str) -> None:
    """Delete ``path`` if it is dfairpca's own ``kind`` (e.g. a finished checkpoint).

    A missing path is fine; anything dfairpca did not write raises :class:`OutputPathError`.
    Files a user put inside it are kept, with the directory (and a warning naming them):
    only the entries dfairpca wrote, and then its marker, are deleted.
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
    foreign = foreign_entries(path, found)
    if not foreign:
        _remove_tree(path)
        return
    import warnings

    for name in sorted(set(os.listdir(path)) - set(foreign) - {MARKER}):
        entry = path / name
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()
    (path / MARKER).unlink(missing_ok=True)
    warnings.warn(f"removed dfairpca's {kind} from {path} but kept the directory and what "
                  f"dfairpca did not write in it: {', '.join(foreign)}", UserWarning, stacklevel=2)


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
        if entry.is_symlink() or not (entry.is_dir() or m.group(1) == "tmp" and entry.is_file()):
            continue  # a file is only ever an atomic_file's temporary
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
            entry.unlink() if entry.is_file() else _remove_tree(entry)


def recover_for_reading(path) -> None:
    """:func:`recover` ``path`` before reading it, if this process may write its folder.

    Safe in a reader for the same reason as in a writer: only a dead writer's leftovers
    are touched.  Without write permission nothing is repaired; :func:`load_arrays` then
    names the intact copy.
    """
    try:
        recover(path)
    except OSError:
        pass


def intact_copies(path) -> list[Path]:
    """dfairpca's ``.old-`` siblings of a missing ``path``, oldest first: the intact old
    version a replace cut short between its two renames left (none if ``path`` exists)."""
    path = Path(path)
    parent = path.parent if str(path.parent) else Path(".")
    if _exists(path) or not parent.is_dir():
        return []
    pattern = re.compile(rf"\.{re.escape(path.name)}\.old-[A-Za-z0-9]*-\d+-[0-9a-f]{{8}}")
    return sorted((e for e in parent.iterdir()
                   if pattern.fullmatch(e.name) and read_marker(e) is not None),
                  key=lambda e: e.stat().st_mtime_ns)


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
