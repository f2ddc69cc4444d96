"""The write protocol on a local disk: :class:`LocalStorage`, by renames.

A directory is written to the temporary sibling ``.NAME.tmp-HOST-PID-RANDOM``, marked
first, and renamed into place: the old version to ``.NAME.old-HOST-PID-RANDOM``, the new
one to ``NAME``, then the old one deleted, under a lock file (:func:`dfairpca.io._locks.exclusive`)
so that two replaces never rename over each other.  At every moment the old or the new
version exists whole under one of these names, and :meth:`LocalStorage.recover` repairs
what a crash left.

A single-file output (a figure) carries its marker inside the file, where its format
keeps text; the reader of each such format is registered by its application with
:func:`register_marked_file` (this layer knows no file format).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
import signal
import threading

from ._files import read_capped
from ._locks import (REPLACE_LOCK, drop_stale_lock, exclusive, holder_gone, holding, is_mount_point,
                     not_writable)
from ._marker import (
    ACTIVE, consolidate,
    MARKER, MARKER_KEY, OutputPathError, apart, foreign_files, kept, lease_age, leased, marker,
    marker_attributes, not_ours, refusal, running, sibling_name, sibling_pattern, this_host, warn_kept,
    zarr_foreign, zarr_layout,
)
from ._storage import Protected, Storage, each_protected
from ._urls import local_path, on_disk

# Deferred imports: zarr (heavy or optional) is imported in the functions that use it, so that
# importing this module stays light.

__all__ = ["LocalStorage", "register_marked_file", "named", "remove_tree", "files_under", "temporary_file",
           "temporary_sibling", "is_empty_dir"]

#: the readers of single-file outputs' markers, by the first bytes of the files they read
#: (:func:`register_marked_file`)
_MARKED_FILES: dict[bytes, Callable[[Path], str | None]] = {}


def register_marked_file(signature: bytes, reader: Callable[[Path], str | None]) -> None:
    """Let dfairpca recognise its own single files that start with ``signature``.

    A single-file output (written with :func:`dfairpca.io.atomic_file`) carries
    dfairpca's marker (:func:`dfairpca.io.marker` as JSON) where its format keeps
    text, under the name :data:`dfairpca.io.MARKER_KEY`; the application that
    writes the format registers how to read it back, so that a later write may replace
    the file and recovery may delete a crash's leftover of it.  A file no registered
    reader recognises is never dfairpca's.

    Parameters
    ----------
    signature : bytes
        The first bytes of every file of the format (its magic number).
    reader : callable
        ``reader(path) -> str or None``: the text stored under ``MARKER_KEY`` in the file
        ``path``, or None; it may raise on a file it cannot read (then: no marker).
    """
    _MARKED_FILES[bytes(signature)] = reader


def _file_marker(path: Path):
    """The marker a registered reader finds in the file ``path``, parsed; None if none."""
    longest = max(map(len, _MARKED_FILES), default=0)
    with open(path, "rb") as f:
        head = f.read(longest)
    for signature, reader in _MARKED_FILES.items():
        if head.startswith(signature):
            text = reader(path)
            return json.loads(text) if text else None
    return None


def files_under(directory: Path, *, empty_folders: bool = False) -> list[str]:
    """Every file under ``directory`` (links too, not followed), relative, "/"-separated;
    with ``empty_folders`` the empty folders as well (a user's, in a Zarr store)."""
    found = []
    for root, dirs, names in os.walk(directory):
        links = [d for d in dirs if os.path.islink(Path(root) / d)]
        empty = [] if not empty_folders or names or dirs or Path(root) == directory else [""]
        found += [(Path(root) / name).relative_to(directory).as_posix()
                  for name in names + links + empty]
    return sorted(found)


class LocalStorage(Storage):
    """The write protocol on a local path (see the module docstring).

    Parameters
    ----------
    target : str or os.PathLike
        The output's path.
    """

    def __init__(self, target):
        self.given = target
        self.target = Path(target)

    @classmethod
    def at(cls, path, storage_options: dict | None = None) -> "LocalStorage":
        return cls(path)  # a local path has no options

    def user_path(self) -> Path:
        return self.target

    def as_argument(self, kind: str) -> Path:
        return named(local_path(self.given), kind)  # a file:// URL names its path

    def sibling(self, suffix: str) -> "LocalStorage":
        return LocalStorage(self.target.with_name(self.target.name + suffix))

    def for_readers(self, opened):
        return self.given

    def exists(self) -> bool:
        return _exists(self.target)

    def read_marker(self) -> dict | None:
        path = self.target
        found = None
        try:
            if path.is_dir():
                if (path / MARKER).is_file():
                    found = json.loads(read_capped(path / MARKER))
                elif (path / "zarr.json").is_file():
                    attrs = json.loads(read_capped(path / "zarr.json")).get("attributes") or {}
                    found = attrs.get(MARKER_KEY)
            elif path.is_file():
                found = _file_marker(path)
        except Exception:  # an unreadable marker is no marker: the path is then not ours
            return None
        ok = isinstance(found, dict) and found.get("written_by") == "dfairpca"
        return found if ok else None

    def write_marker(self, kind: str) -> None:
        directory = self.target
        if (directory / "zarr.json").is_file():
            import zarr

            layout = zarr_layout(str(directory))
            zarr.open_group(str(directory), mode="r+").attrs.update(marker_attributes(kind, layout))
            (directory / MARKER).unlink(missing_ok=True)
            consolidate(str(directory))
        else:
            (directory / MARKER).write_text(json.dumps(marker(kind, files_under(directory))))

    def foreign(self, found: dict) -> tuple[list[str], dict]:
        path = self.target
        if not (path / "zarr.json").is_file():
            return foreign_files(files_under(path), found), {}
        return zarr_foreign(files_under(path, empty_folders=True), zarr_layout(str(path)), found)

    def check_target(self, kind: str, *, overwrite: bool = False, protect: Protected = None,
                     probe: bool = True) -> None:
        path = named(self.target, kind)
        for what, other in each_protected(protect):
            disk = on_disk(other)  # file:// and local:// URLs name local paths too
            if disk is not None:
                _check_apart(path, disk, what)
        self.recover()
        if path.is_symlink():
            raise OutputPathError(
                f"{path} is a symbolic link; dfairpca does not replace links: choose another path "
                "or remove it yourself"
            )
        if path.is_dir() and is_mount_point(path):
            # found now, not when the rename into place fails (EBUSY) after the whole pass
            raise OutputPathError(
                f"{path} is a mount point: dfairpca writes a {kind} beside its path and renames "
                f"it into place, which a mount point cannot be; pass a path inside it, e.g. "
                f"{path / kind.replace(' ', '_')}"
            )
        if path.exists():
            replaced = OutputPathError(
                f"another dfairpca process on this machine is writing {path} (it was replaced "
                "while this one checked it); wait for it to finish, then run this again")
            try:
                before = os.lstat(path)
                found = self.read_marker()
                # a figure (a file) holds nothing; a directory may hold a user's files, which
                # replacing it would delete with it
                foreign, attributes = self.foreign(found) if found is not None and path.is_dir() else ([], {})
                error = refusal(str(path), kind, found, empty=is_empty_dir(path), is_dir=path.is_dir(),
                                overwrite=overwrite, foreign=foreign, attributes=attributes)
                if error is not None and not _same_entry(before, os.lstat(path)):
                    raise replaced  # what was judged is not what is there now: a writer's swap
            except FileNotFoundError:  # gone while looked at: another writer between its renames
                raise replaced from None
            if error is not None:
                raise error
        if probe:
            _check_writable(path)

    @contextlib.contextmanager
    def atomic_directory(self, kind: str, *, overwrite: bool = False, protect: Protected = None,
                         direct: bool = False) -> Iterator[Path]:
        """The temporary sibling, marked before and after the block (a Zarr store written
        into it replaces the marker file by its attribute), then moved into place."""
        path = self.target
        self.check_target(kind, overwrite=overwrite, protect=protect, probe=False)
        with temporary_sibling(path) as tmp:  # made: the writability probe, before the work
            LocalStorage(tmp).write_marker(kind)  # first: a leftover of a crash is recognisably ours
            yield tmp
            LocalStorage(tmp).write_marker(kind)
            self.move_into_place(tmp, kind, overwrite=overwrite)

    def move_into_place(self, src, kind: str, *, overwrite: bool = False) -> None:
        path = self.target
        with exclusive(path.parent / f".{path.name}{REPLACE_LOCK}", str(path),
                       "two replaces at once would rename over each other's new version"):
            self._move_into_place(Path(src), kind, overwrite=overwrite)

    def _move_into_place(self, src: Path, kind: str, *, overwrite: bool) -> None:
        """:meth:`move_into_place`, its lock held."""
        path = self.target
        self.check_target(kind, overwrite=overwrite, probe=False)  # src's folder: writable
        if not _exists(path) or src.is_file():  # a file is replaced by one rename: no old copy
            os.replace(src, path)
            return
        old = _sibling(path, "old")
        with _interrupts_deferred():  # a Ctrl-C between the renames would leave no `path`
            os.replace(path, old)
            try:
                os.replace(src, path)
            except BaseException:
                os.replace(old, path)  # put the old version back; if this fails, recover() will
                raise
        with contextlib.suppress(FileNotFoundError):  # a crash's leftover, already recovered
            _remove_tree(old)

    def remove_directory(self, kind: str) -> None:
        path = self.target
        self.recover()
        if not _exists(path):
            return
        found = self.read_marker()
        if path.is_symlink() or not path.is_dir() or found is None or found.get("kind") != kind:
            raise not_ours(str(path), kind)
        foreign = self.foreign(found)[0]
        if not foreign:
            _remove_tree(path)
            return
        # a user's file may lie deep inside (in a Zarr array's folder too): delete ours one
        # by one, then the folders they leave empty, the markers last
        markers = (MARKER, "zarr.json")
        for name in files_under(path):
            if name not in markers and not kept(name, foreign):
                (path / name).unlink()
        for root, _, _ in sorted(os.walk(path), key=lambda w: -len(w[0])):
            name = Path(root).relative_to(path).as_posix()
            if Path(root) != path and not kept(name, foreign) and not os.listdir(root):
                os.rmdir(root)
        for name in markers:
            if not kept(name, foreign):  # a root zarr.json holding a user's attribute stays
                (path / name).unlink(missing_ok=True)
        warn_kept(str(path), kind, foreign)

    def recover(self) -> None:
        path = self.target
        parent = path.parent if str(path.parent) else Path(".")
        if not parent.is_dir():
            return
        lock = parent / f".{path.name}{REPLACE_LOCK}"
        drop_stale_lock(lock)
        # an `.old-` sibling exists only between a replace's two renames, made under the
        # replace lock (its mtime is the old version's: no lease): it is judged, restored
        # or removed only while this process holds that lock itself, so that no replace
        # can start between the judgement and the repair; a replace under way (the lock
        # held, by this process's own writer too) leaves it alone
        # (under the lock only renames: a stale copy is moved aside as a dead temporary,
        # deleted after the lock is let go, so that a writer never waits on a large tree)
        doomed = []
        if any(sibling_pattern(path.name, "old").fullmatch(e.name) for e in parent.iterdir()):
            try:
                with exclusive(lock, str(path), "a replace is under way", wait=False):
                    olds = sorted(self._leftovers(parent, "old"), key=lambda e: e.stat().st_mtime_ns)
                    for entry in reversed(olds):
                        if not _exists(path):
                            os.replace(entry, path)
                        else:
                            aside = parent / sibling_name(path.name, "tmp")
                            ACTIVE.add(aside.name)  # this process's own: no thread of it races
                            os.replace(entry, aside)
                            doomed.append(aside)
            except OutputPathError:
                pass
        for entry in doomed:
            try:
                with contextlib.suppress(FileNotFoundError):  # another process's recovery first
                    _remove_tree(entry)
            finally:
                ACTIVE.discard(entry.name)
        # a `.tmp-` sibling is live while its writer renews its lease
        for entry in self._leftovers(parent, "tmp"):
            with contextlib.suppress(FileNotFoundError):  # another recovery was there first
                entry.unlink() if entry.is_file() else _remove_tree(entry)

    def _leftovers(self, parent: Path, role: str) -> list[Path]:
        """The ``role`` ("tmp" or "old") siblings of the target that a dead write left:
        ours (marked, or empty) and, for "tmp", with no live lease."""
        found = []
        for entry in parent.iterdir():
            m = sibling_pattern(self.target.name, role).fullmatch(entry.name)
            if m is None:
                continue
            if entry.is_symlink() or not (entry.is_dir() or role == "tmp" and entry.is_file()):
                continue  # a file is only ever an atomic_file's temporary
            marked = LocalStorage(entry).read_marker() is not None
            if not marked and not is_empty_dir(entry):
                continue  # not ours: never touched
            # a marked temporary directory of this host is held by its writer from before
            # its marker was written (temporary_sibling): free, its writer is gone
            gone = (role == "tmp" and marked and entry.is_dir() and m.group(2) == this_host()
                    and holder_gone(entry))
            if role == "tmp" and running(entry.name, m.group(2), int(m.group(3)), _age(entry), gone):
                continue
            found.append(entry)
        return found

    def recover_for_reading(self) -> None:
        """Safe in a reader for the same reason as in a writer: only a dead writer's
        leftovers are touched; without write permission nothing is repaired."""
        try:
            self.recover()
        except OSError:
            pass

    def intact_copies(self) -> list[Path]:
        path = self.target
        parent = path.parent if str(path.parent) else Path(".")
        if _exists(path) or not parent.is_dir():
            return []
        pattern = sibling_pattern(path.name, "old")
        return sorted((e for e in parent.iterdir()
                       if pattern.fullmatch(e.name) and LocalStorage(e).read_marker() is not None),
                      key=lambda e: e.stat().st_mtime_ns)

    def read_text(self, name: str) -> str:
        return read_capped(self.target / name).decode("utf-8")

    @contextlib.contextmanager
    def local_copy(self) -> Iterator[Path]:
        self.recover_for_reading()  # a replace cut short: the intact old version put back
        yield self.target


@contextlib.contextmanager
def temporary_file(path: Path) -> Iterator[Path]:
    """The temporary sibling of the file ``path`` for this write, deleted if it is still
    there when the block ends."""
    tmp = _sibling(path, "tmp")
    with leased(tmp.name, lambda: _renew(tmp)):
        try:
            yield tmp
        finally:
            if tmp.is_file():
                tmp.unlink()


@contextlib.contextmanager
def temporary_sibling(path: Path) -> Iterator[Path]:
    """The temporary sibling directory of ``path`` for this write, made (its folders too:
    the writability probe) and held (:func:`dfairpca.io._locks.holding`, so that a rerun
    on this host removes it at once if this process dies), deleted if it is still there
    when the block ends (a crash's is deleted by recover(): it is marked)."""
    tmp = _sibling(path, "tmp")
    with leased(tmp.name, lambda: _renew(tmp)):
        try:
            tmp.mkdir(parents=True)
        except OSError as exc:
            raise not_writable(path, tmp.parent, exc) from None
        with holding(tmp):  # let go after the removal: never a half-removed tree unheld
            try:
                yield tmp
            finally:
                if _exists(tmp):
                    _remove_tree(tmp)


@contextlib.contextmanager
def _interrupts_deferred():
    """Hold a SIGINT or SIGTERM that arrives inside the block and deliver it to the previous
    handler when the block ends (main thread only, where Python runs signal handlers): a
    KeyboardInterrupt for SIGINT's default, the default's end of the process for SIGTERM's."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held: list[tuple[int, Any]] = []
    signums = (signal.SIGINT, signal.SIGTERM)
    previous = {signum: signal.signal(signum, lambda signum, frame: held.append((signum, frame)))
                for signum in signums}
    try:
        yield
    finally:
        for signum in signums:
            signal.signal(signum, previous[signum])
        if held:
            first, frame = held[0]
            handler = previous[signal.Signals(first)]
            if callable(handler):
                handler(first, frame)
            elif handler == signal.SIG_DFL:
                if first == signal.SIGINT:
                    raise KeyboardInterrupt
                signal.raise_signal(first)


def named(path, kind: str) -> Path:
    """``path`` as a Path, refused unless its last part is a name of its own.

    dfairpca writes an output beside it and renames it into place: ``.``, ``..`` and ``/``
    have no sibling to write and cannot be renamed.

    Parameters
    ----------
    path : str or path-like
        A local output path.
    kind : str
        What is written there (``"model"``, ``"store"``, ...): the error suggests a name.

    Returns
    -------
    pathlib.Path
        ``path``, as a Path.

    Raises
    ------
    OutputPathError
        ``path`` is ``.``, ``..`` or the root.
    """
    path = Path(path)
    if path.name in ("", ".", ".."):
        raise OutputPathError(
            f"{path} has no name of its own ('.', '..' or the root), and dfairpca writes an output "
            f"beside its path and renames it into place: name a new directory, e.g. {path / kind}")
    return path


def _check_apart(path: Path, other: Path, what: str) -> None:
    """Refuse ``path`` if it is ``other``, contains it, or is inside it (links resolved):
    an output inside an input store would become its members."""
    a, b = Path(os.path.realpath(path)), Path(os.path.realpath(other))
    relation = "is" if a == b else "contains" if a in b.parents else "is inside" if b in a.parents else None
    apart(str(path), relation, what, str(other))


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
        raise not_writable(path, folder, exc) from None


def _sibling(path: Path, role: str) -> Path:
    """``.NAME.{role}-HOST-PID-RANDOM`` next to ``path``: what recover() looks for."""
    return path.parent / sibling_name(path.name, role)


def _same_entry(a: os.stat_result, b: os.stat_result) -> bool:
    """Whether two ``lstat`` results are of one directory entry, unchanged: a writer's swap
    (rename the old version away, the new one in) gives the path another inode, and the
    checks made in between (marker, emptiness, kind) judged neither version whole."""
    return (a.st_ino, a.st_dev, a.st_mode) == (b.st_ino, b.st_dev, b.st_mode)


def _renew(sibling: Path) -> None:
    """Renew the lease of this process's ``sibling``: its modification time, now (nothing
    while it does not exist yet: its creation sets it)."""
    with contextlib.suppress(FileNotFoundError):
        os.utime(sibling, follow_symlinks=False)


def _age(sibling: Path) -> float | None:
    """Seconds since ``sibling``'s lease was renewed (its modification time); None if it
    cannot be read.  A temporary of a writer without leases is judged by its age too."""
    try:
        return lease_age(sibling.lstat().st_mtime)
    except OSError:
        return None


def _exists(path: Path) -> bool:
    return path.exists() or path.is_symlink()


def is_empty_dir(path: Path) -> bool:
    if not path.is_dir() or path.is_symlink():
        return False
    with os.scandir(path) as entries:  # closed at once: no ResourceWarning
        return next(entries, None) is None


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


def remove_tree(path: Path) -> None:
    """Delete dfairpca's directory ``path`` (every entry), its marker last."""
    _remove_tree(path)  # through the module's name: a crash test replaces it
