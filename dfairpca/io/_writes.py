"""The write protocol: dfairpca's marker, atomic replacement and crash recovery.

Every directory dfairpca writes (models, statistics, checkpoints, Zarr stores) goes through
:func:`atomic_directory`: it carries dfairpca's marker (:data:`MARKER`), is written to a
temporary sibling and moved into place only when complete, and replaces only a directory
carrying the same marker -- dfairpca never deletes or overwrites what it did not write.
Users reach these names through :mod:`dfairpca.io`, which re-exports them.

Every function also takes an fsspec URL (``s3://bucket/x``) or mapper with
``storage_options``: the same rules, applied by :mod:`dfairpca.io._remote` with the copies
object storage has instead of renames.  Local paths take the code below (``os.replace``).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path

from . import _remote
from ._files import read_capped
from ._marker import (
    ACTIVE as _ACTIVE, MARKER, MARKER_KEY, OutputPathError, apart, foreign_files, kept, marker,
    marker_attributes, not_ours, refusal, running, sibling_name, sibling_pattern, warn_kept,
    zarr_foreign, zarr_layout,
)
from ._remote import Protected, is_remote
from ..base._version import code_digest
from ..errors import AccessError, DiscardedWriteWarning, InvalidInputError

__all__ = [
    "atomic_directory", "atomic_file", "staged_locally", "stage_folder", "check_stage_dir",
    "STAGE_KIND", "STAGE_ENV", "move_into_place", "check_target",
    "foreign_entries", "remove_directory", "recover", "recover_for_reading", "intact_copies", "read_marker", "write_marker", "marker",
    "marker_attributes", "writing_every_chunk", "OutputPathError", "MARKER", "MARKER_KEY",
]

_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def write_marker(directory, kind: str, *, storage_options: dict | None = None) -> None:
    """Mark ``directory`` as dfairpca's: the attribute of a Zarr group (recording the
    members and attributes it holds now, :func:`dfairpca.io._marker.zarr_contents`), else
    the file (listing the files it holds now).  Call it when dfairpca has finished writing
    it: what is added afterwards is a user's.

    Parameters
    ----------
    directory : str or os.PathLike
        The directory or Zarr store (a URL for a remote one).
    kind : str
        What it holds ("model", "checkpoint", "store", ...), checked before a replace.
    storage_options : dict, optional
        fsspec options of a URL ``path``.
    """
    if is_remote(directory):
        return _remote.write_marker(_remote.location(directory, storage_options), kind)
    directory = Path(directory)
    if (directory / "zarr.json").is_file():
        import zarr

        layout = zarr_layout(str(directory))
        zarr.open_group(str(directory), mode="r+").attrs.update(marker_attributes(kind, layout))
        (directory / MARKER).unlink(missing_ok=True)
    else:
        (directory / MARKER).write_text(json.dumps(marker(kind, _files(directory))))


def _files(directory: Path, *, empty_folders: bool = False) -> list[str]:
    """Every file under ``directory`` (links too, not followed), relative, "/"-separated;
    with ``empty_folders`` the empty folders as well (a user's, in a Zarr store)."""
    found = []
    for root, dirs, names in os.walk(directory):
        links = [d for d in dirs if os.path.islink(Path(root) / d)]
        empty = [] if not empty_folders or names or dirs or Path(root) == directory else [""]
        found += [(Path(root) / name).relative_to(directory).as_posix()
                  for name in names + links + empty]
    return sorted(found)


def foreign_entries(path, found: dict, *, storage_options: dict | None = None) -> list[str]:
    """What in dfairpca's directory ``path`` (marker ``found``) it did not write, at any
    depth: in a Zarr store the members its marker does not record, and in its own members
    what is neither their metadata nor an array's chunk keys inside its grid, and the
    metadata that holds an attribute it did not write (:func:`dfairpca.io._marker.zarr_foreign`);
    in a directory the files its marker does not list
    (:func:`dfairpca.io._marker.foreign_files`).

    Parameters
    ----------
    path : str or os.PathLike
        dfairpca's directory or Zarr store (a URL for a remote one).
    found : dict
        Its marker (:func:`read_marker`).
    storage_options : dict, optional
        fsspec options of a URL ``path``.

    Returns
    -------
    list of str
        The entries, as paths relative to ``path``; empty when it holds only dfairpca's.
    """
    return _foreign(path, found, storage_options=storage_options)[0]


def _foreign(path, found: dict, *, storage_options: dict | None = None) -> tuple[list[str], dict]:
    """:func:`foreign_entries`, and the attributes it did not write in each metadata file
    among them."""
    if is_remote(path):
        return _remote.foreign(_remote.location(path, storage_options), found)
    path = Path(path)
    if not (path / "zarr.json").is_file():
        return foreign_files(_files(path), found), {}
    return zarr_foreign(_files(path, empty_folders=True), zarr_layout(str(path)), found)


def read_marker(path, *, storage_options: dict | None = None) -> dict | None:
    """dfairpca's marker of ``path`` (a directory, a Zarr store or a PNG), or None if unmarked.

    Parameters
    ----------
    path : str or os.PathLike
        The object to look at (a URL for a remote one).
    storage_options : dict, optional
        fsspec options of a URL ``path``.

    Returns
    -------
    dict or None
        The marker (``written_by``, ``kind``, ``version``, what it wrote), or None.
    """
    if is_remote(path):
        return _remote.read_marker(_remote.location(path, storage_options))
    path = Path(path)
    found = None
    try:
        if path.is_dir():
            if (path / MARKER).is_file():
                found = json.loads(read_capped(path / MARKER))
            elif (path / "zarr.json").is_file():
                attrs = json.loads(read_capped(path / "zarr.json")).get("attributes") or {}
                found = attrs.get(MARKER_KEY)
        elif path.is_file():
            with open(path, "rb") as f:
                is_png = f.read(8) == _PNG_SIGNATURE
            if is_png:
                from PIL import Image, PngImagePlugin

                with Image.open(path) as im:
                    # a PNG's text chunks, those after the image data too
                    png = im if isinstance(im, PngImagePlugin.PngImageFile) else None
                    text = png.text.get(MARKER_KEY) if png is not None else None
                found = json.loads(text) if text else None
    except Exception:  # an unreadable marker is no marker: the path is then not ours
        return None
    ok = isinstance(found, dict) and found.get("written_by") == "dfairpca"
    return found if ok else None


def check_target(path, kind: str, *, overwrite: bool = False, protect: Protected = None,
                 probe: bool = True, storage_options: dict | None = None) -> None:
    """Raise unless dfairpca may write a ``kind`` at ``path`` now; call it before any work.

    Allowed: ``path`` does not exist, is an empty directory, or (with ``overwrite``) carries
    dfairpca's marker of the same ``kind``.  Refused with :class:`OutputPathError`: a file or
    a non-empty directory without the marker, a symbolic link, another kind of dfairpca
    output, dfairpca's own directory holding entries it did not write
    (:func:`foreign_entries`: replacing it would delete them), a path without a name of its
    own (:func:`named`), and anything that is, contains or is inside a path of ``protect`` (a mapping
    ``{"the input store": path}`` or ``(what, path)`` pairs: what this job reads or also
    writes).  The closest existing folder must be writable (:class:`PermissionError`
    otherwise; ``probe=False`` skips that check for a caller that creates a sibling right
    away).  Leftovers of an earlier crash are recovered first (:func:`recover`).

    Parameters
    ----------
    path : str or os.PathLike
        Where the output goes (a URL for a remote one).
    kind : str
        What is written ("model", "checkpoint", "store", ...).
    overwrite : bool
        Allow replacing dfairpca's own output of the same ``kind``.
    protect : dict or sequence of (str, path) pairs, optional
        Paths the output must not be, contain or be inside, by what they are.
    probe : bool
        Check that the closest existing folder is writable.
    storage_options : dict, optional
        fsspec options of a URL ``path``.
    """
    if is_remote(path):
        return _remote.check_target(_remote.location(path, storage_options), kind,
                                    overwrite=overwrite, protect=protect, probe=probe)
    path = named(path, kind)
    for what, other in (protect.items() if isinstance(protect, Mapping) else protect or ()):
        disk = _remote.on_disk(other)  # file:// and local:// URLs name local paths too
        if disk is not None:
            _check_apart(path, disk, what)
    recover(path)
    if path.is_symlink():
        raise OutputPathError(
            f"{path} is a symbolic link; dfairpca does not replace links: choose another path "
            "or remove it yourself"
        )
    if path.exists():
        try:
            found = read_marker(path)
            # a figure (a file) holds nothing; a directory may hold a user's files, which
            # replacing it would delete with it
            foreign, attributes = _foreign(path, found) if found is not None and path.is_dir() else ([], {})
            error = refusal(str(path), kind, found, empty=_is_empty_dir(path), is_dir=path.is_dir(),
                            overwrite=overwrite, foreign=foreign, attributes=attributes)
        except FileNotFoundError:  # gone while looked at: another writer between its renames
            raise OutputPathError(
                f"another dfairpca process on this machine is writing {path} (it was replaced "
                "while this one checked it); wait for it to finish, then run this again"
            ) from None
        if error is not None:
            raise error
    if probe:
        _check_writable(path)


@contextlib.contextmanager
def atomic_directory(path, kind: str, *, overwrite: bool = False, protect: Protected = None,
                     storage_options: dict | None = None, direct: bool = False):
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

    One writer per path at a time: a process whose replace finds another's under way on
    this host fails naming it (:func:`exclusive`), and never loses the version that was there.

    For a URL (see :mod:`dfairpca.io._remote`) the block gets, with ``direct``, the URL of the
    temporary prefix (a Zarr store that workers write there); otherwise a local folder
    that is uploaded when the block ends (models, statistics, checkpoints: small files).

    Parameters
    ----------
    path : str or os.PathLike
        The directory to write (a URL for a remote one).
    kind : str
        What it holds ("model", "checkpoint", "store", ...), recorded in the marker.
    overwrite : bool
        Replace dfairpca's own output of the same ``kind`` at ``path``.
    protect : dict or sequence of (str, path) pairs, optional
        Paths the output must not be, contain or be inside (see :func:`check_target`).
    storage_options : dict, optional
        fsspec options of a URL ``path``.
    direct : bool
        For a URL: yield the URL of the temporary prefix rather than a local folder.

    Yields
    ------
    pathlib.Path or str
        The temporary directory to write into (a URL with ``direct``).
    """
    if is_remote(path):
        loc = _remote.location(path, storage_options)
        if direct:
            with _remote.atomic_prefix(loc, kind, overwrite=overwrite, protect=protect) as tmp:
                yield tmp
            return
        check_target(loc, kind, overwrite=overwrite, protect=protect)  # before the block's work
        with tempfile.TemporaryDirectory(prefix=".dfairpca-stage-") as folder:
            stage = Path(folder) / loc.name
            stage.mkdir()
            yield stage
            write_marker(stage, kind)
            _remote.publish(stage, loc, kind, overwrite=overwrite)
        return
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


def move_into_place(src, path, kind: str, *, overwrite: bool = False,
                    storage_options: dict | None = None) -> Path:
    """Rename the finished, marked directory ``src`` to ``path`` (steps 1, 3 of
    :func:`atomic_directory`), replacing only dfairpca's own ``kind`` there.

    Parameters
    ----------
    src : str or os.PathLike
        The finished directory, marked.  For a URL ``path``, a URL on the same storage or
        a local folder (uploaded).
    path : str or os.PathLike
        Where it goes.
    kind : str
        What it holds; only dfairpca's output of this kind is replaced.
    overwrite : bool
        Allow replacing what is at ``path``.
    storage_options : dict, optional
        fsspec options of a URL ``path``.

    Returns
    -------
    pathlib.Path or str
        ``path``.
    """
    if is_remote(path):
        loc = _remote.location(path, storage_options)
        if is_remote(src):
            _remote.move_into_place(_remote.location(src, storage_options), loc, kind, overwrite=overwrite)
        else:
            _remote.check_target(loc, kind, overwrite=overwrite)
            _remote.publish(Path(src), loc, kind, overwrite=overwrite)
            _remove_tree(Path(src))
        return path
    src, path = Path(src), Path(path)
    with exclusive(path.parent / f".{path.name}{REPLACE_LOCK}", str(path),
                   "two replaces at once would rename over each other's new version"):
        return _move_into_place(src, path, kind, overwrite=overwrite)


#: the suffix of the lock file ``.NAME`` + this that a replace of ``NAME`` holds
REPLACE_LOCK = ".replace.lock"


def _move_into_place(src: Path, path: Path, kind: str, *, overwrite: bool) -> Path:
    """:func:`move_into_place` of a local ``src``, its lock held."""
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


#: the content of a lock file dfairpca made (:func:`exclusive`): only such a file is removed
LOCK_MARK = b"dfairpca lock\n"


@contextlib.contextmanager
def exclusive(lock: Path, what: str, why: str = "two writers would mix their data"):
    """Hold the lock file ``lock`` while the block runs, or raise :class:`OutputPathError`
    at once if another process holds it, naming ``what`` it writes and ``why`` that is
    refused: two writers of the same partial output would mix their chunks (e.g. two seeds)
    into one result.

    An advisory ``flock`` on this host: it dies with its process, so a crash never leaves a
    held lock.  A lock file this call makes holds :data:`LOCK_MARK` and is removed when
    done; a file of that name with anything else (a user's) is locked, never changed or
    removed.  A process that opened the file just before its holder removed it finds, once
    it holds it, that the path no longer names it, and tries again.

    Parameters
    ----------
    lock : pathlib.Path
        The lock file.
    what : str
        What the holder writes, named in the error.
    why : str
        Why a second writer is refused, said in the error.

    Yields
    ------
    None
        The block runs holding the lock.
    """
    import fcntl

    while True:
        try:
            fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            try:
                # without waiting for a writer, should a named pipe be there
                fd = os.open(lock, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
            except FileNotFoundError:
                continue  # removed meanwhile by its holder
            except OSError as exc:
                raise _not_writable(lock, lock.parent, exc) from None
        except OSError as exc:
            raise _not_writable(lock, lock.parent, exc) from None
        else:
            # marked at once, before taking it: another process may open it and take it
            # first, and whoever holds it removes it only if it carries the mark
            try:
                os.write(fd, LOCK_MARK)
            except OSError as exc:
                os.close(fd)
                lock.unlink(missing_ok=True)  # empty, and made by this call
                raise _not_writable(lock, lock.parent, exc) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise OutputPathError(
                f"another dfairpca process on this machine is writing {what} (it holds {lock}); "
                f"wait for it to finish, then run this again: {why}"
            ) from None
        try:
            same = os.fstat(fd).st_ino == os.stat(lock).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)  # the holder removed it after we opened it: take the new one
    try:
        yield
    finally:
        try:
            if os.pread(fd, len(LOCK_MARK) + 1, 0) == LOCK_MARK:  # ours: made by dfairpca
                os.unlink(lock)
        except OSError:
            pass
        os.close(fd)


#: the kind of the local folder that stages a store for a URL (:func:`staged_locally`)
STAGE_KIND = "stage"
#: a stage's record, JSON: the URL it stages, the call that writes it, the code that does
STAGE_FILE = "stage.json"
#: a stage's folder that the writer writes: the store and the writer's own siblings of it
STAGE_WORK = "work"
#: the environment variable naming the folder under which stages are made
STAGE_ENV = "DFAIRPCA_STAGE_DIR"


def stage_folder(url, stage_dir=None) -> Path:
    """Where the store for the URL ``url`` is staged: under ``stage_dir`` (else
    ``$DFAIRPCA_STAGE_DIR``, else the user's cache folder's ``dfairpca/stage``), the first 16
    hex digits of the SHA-256 of the normalised URL: one folder per URL, found again by the
    next call."""
    cache = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    root = stage_dir or os.environ.get(STAGE_ENV) or Path(cache) / "dfairpca" / "stage"
    digest = hashlib.sha256(_remote.normalised(url).encode()).hexdigest()[:16]
    return Path(os.path.abspath(os.path.expanduser(root))) / digest


def check_stage_dir(path, stage_dir) -> None:
    """Refuse a ``stage_dir`` that would be ignored or cannot be used.

    Parameters
    ----------
    path : str, path-like or Location
        The output a writer stages (a URL) or writes in place (a local path).
    stage_dir : str or path-like, optional
        The local folder to stage under (see :func:`staged_locally`).

    Raises
    ------
    dfairpca.errors.InvalidInputError
        ``stage_dir`` given for a local ``path`` (written in place, it resumes there), or
        ``stage_dir`` is itself a URL.
    """
    if stage_dir is not None and not is_remote(path):
        raise InvalidInputError(f"stage_dir (--stage-dir) is where a store for a URL is staged; {path} "
                         "is a local path, written in place (it resumes there): drop stage_dir")
    if stage_dir is not None and is_remote(stage_dir):
        raise InvalidInputError(f"stage_dir (--stage-dir) {stage_dir} is a URL; a stage is a local "
                         "folder (the store is written there, then uploaded): name a local folder")


@contextlib.contextmanager
def staged_locally(path, kind: str, *, overwrite: bool = False, storage_options: dict | None = None,
                   key: dict | None = None, stage_dir=None):
    """Yield where a writer of local folders (ingest, synth, ``save``) writes ``path``.

    A local ``path`` is yielded as it is (the writer's own protocol holds).  For a URL the
    target is checked first, the writer writes a local folder, and that is uploaded and
    moved into place when the block ends (the disk needs room for it).

    Without ``key`` (``save``: small files) the folder is temporary.  With ``key`` (JSON:
    what determines the output, e.g. a store writer's settings) it is the stage
    :func:`stage_folder` of ``path``, which survives an error or Ctrl-C: the same call
    again (equal ``key``, same dfairpca code) writes into it again -- a writer that resumes
    its partial output resumes -- and finds there (the yielded path exists) the finished
    output whose upload was cut short, to be uploaded again without being written again.
    Another call, or ``overwrite``, discards it first; a successful upload deletes it.  The
    stage carries dfairpca's marker and names the URL it stages: anything else there is
    refused, never deleted.

    Parameters
    ----------
    path : str or os.PathLike
        The output (a URL for a remote one).
    kind : str
        What it holds ("store", "model", ...).
    overwrite : bool
        Replace dfairpca's own output of the same ``kind``; discards a stage too.
    storage_options : dict, optional
        fsspec options of a URL ``path``.
    key : dict, optional
        What determines the output (JSON); given, the stage survives a failure and is
        resumed by a call with an equal ``key``.
    stage_dir : str or os.PathLike, optional
        The local folder stages go in (default: ``$DFAIRPCA_STAGE_DIR``, else the user's
        cache folder's ``dfairpca/stage``, see :func:`stage_folder`).

    Yields
    ------
    pathlib.Path
        Where to write: ``path`` itself when local, else a local folder to upload.
    """
    check_stage_dir(path, stage_dir)
    if not is_remote(path):
        yield Path(path)
        return
    check_target(path, kind, overwrite=overwrite, storage_options=storage_options)
    if key is None:
        with tempfile.TemporaryDirectory(prefix=".dfairpca-stage-") as scratch:
            local = Path(scratch) / "out"
            yield local
            move_into_place(local, path, kind, overwrite=overwrite, storage_options=storage_options)
        return
    loc = _remote.location(path, storage_options)
    folder = stage_folder(loc, stage_dir)
    _stage_root(folder, loc)
    with exclusive(folder.parent / f".{folder.name}.lock", f"{loc.url} (its stage {folder})"):
        _open_stage(folder, loc, key, overwrite=overwrite)
        try:
            yield folder / STAGE_WORK / loc.name
            move_into_place(folder / STAGE_WORK / loc.name, loc, kind, overwrite=overwrite)
        except BaseException as exc:
            _kept(exc, folder, loc)
            raise
        remove_directory(folder, STAGE_KIND)


def _stage_root(folder: Path, loc) -> None:
    """Make the folder the stages are in, or say which setting names another."""
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise AccessError(
            f"cannot make {folder.parent}, where {loc.url} is staged ({exc.strerror}): set "
            f"stage_dir= (--stage-dir) or ${STAGE_ENV} to a writable local folder") from None


def _open_stage(folder: Path, loc, key: dict, *, overwrite: bool) -> None:
    """Make ``folder`` the stage of ``loc`` for the call ``key`` (see :func:`staged_locally`):
    keep this call's own, else make a new one after discarding another call's."""
    record = json.loads(json.dumps({"url": loc.url, "key": key, "code": code_digest()}))
    elsewhere = f"pass stage_dir= (--stage-dir) to stage {loc.url} elsewhere"
    try:
        check_target(folder, STAGE_KIND, overwrite=True)  # missing, empty, or a stage, only ours
    except OutputPathError as exc:
        raise OutputPathError(f"{exc} ({folder} is where {loc.url} is staged: {elsewhere})") from None
    if _exists(folder) and not _is_empty_dir(folder):
        found = _read_json(folder / STAGE_FILE)  # None: its deletion was cut short
        if found is not None and found.get("url") != loc.url:  # a collision of the hashes
            raise OutputPathError(f"{folder} stages {found.get('url')}, not {loc.url}, and dfairpca "
                                  f"never deletes another write's stage: {elsewhere}, or remove it yourself")
        if found == record and not overwrite:
            return
        if found not in (record, None) and not overwrite:
            import warnings

            warnings.warn(f"discarded the interrupted write for {loc.url} in {folder}: it was made "
                          "with other settings or other dfairpca code than this call, so it cannot "
                          "be reused", DiscardedWriteWarning, stacklevel=4)
        remove_directory(folder, STAGE_KIND)
    tmp = _sibling(folder, "tmp")  # the stage appears whole: marker, record and work folder
    _ACTIVE.add(tmp.name)
    try:
        try:
            tmp.mkdir(parents=True)
        except OSError as exc:
            raise _not_writable(folder, tmp.parent, exc) from None
        # the entries, not every file: the writer's files in work/ are the stage's own
        (tmp / MARKER).write_text(json.dumps({**marker(STAGE_KIND), "entries": [STAGE_FILE, STAGE_WORK]}))
        (tmp / STAGE_FILE).write_text(json.dumps(record))
        (tmp / STAGE_WORK).mkdir()
        move_into_place(tmp, folder, STAGE_KIND)
    finally:
        if _exists(tmp):
            _remove_tree(tmp)
        _ACTIVE.discard(tmp.name)


def _read_json(path: Path) -> dict | None:
    """The JSON object in the file ``path``, or None if absent or unreadable."""
    try:
        found = json.loads(read_capped(path))
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) else None


def _kept(exc: BaseException, folder: Path, loc) -> None:
    """Say in a note of ``exc`` that the stage ``folder`` of ``loc`` is kept, and how the
    same call resumes from it (instead of the writer's note naming its partial store
    there); a stage that holds nothing yet is deleted instead."""
    work = folder / STAGE_WORK
    if not (work.is_dir() and any(work.iterdir())):
        with contextlib.suppress(OSError):
            remove_directory(folder, STAGE_KIND)
        return
    if getattr(exc, "__notes__", None):
        exc.__notes__[:] = [n for n in exc.__notes__ if str(folder) not in n]
    exc.add_note(f"dfairpca kept what it wrote for {loc.url} in {folder}: the same call again "
                 "resumes from there (overwrite=True, --overwrite, discards it)")


@contextlib.contextmanager
def atomic_file(path, kind: str, *, overwrite: bool = False, protect: Protected = None):
    """Yield a temporary file path that becomes ``path`` only if the block succeeds.

    The file form of :func:`atomic_directory` (a figure): the block writes the file, with
    dfairpca's marker inside it (a PNG's text chunk, see :func:`read_marker`), at the
    sibling ``.NAME.tmp-HOST-PID-RANDOM``; one rename then replaces ``path`` atomically.
    A crash's marked leftover is deleted by :func:`recover`.

    Parameters
    ----------
    path : str or os.PathLike
        The file to write.
    kind : str
        What it holds ("figure"), recorded in its marker.
    overwrite : bool
        Replace dfairpca's own file of the same ``kind`` at ``path``.
    protect : dict or sequence of (str, path) pairs, optional
        Paths the file must not be or be inside (see :func:`check_target`).

    Yields
    ------
    pathlib.Path
        The temporary path to write the file to, marker included.
    """
    if is_remote(path):
        raise InvalidInputError(f"{path}: a {kind} is written to a local path; write it there and copy it")
    path = Path(path)
    check_target(path, kind, overwrite=overwrite, protect=protect)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _sibling(path, "tmp")
    _ACTIVE.add(tmp.name)
    try:
        yield tmp
        if read_marker(tmp) is None:
            raise InvalidInputError(f"the {kind} written for {path} carries no dfairpca marker; not "
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


def remove_directory(path, kind: str, *, storage_options: dict | None = None) -> None:
    """Delete ``path`` if it is dfairpca's own ``kind`` (e.g. a finished checkpoint).

    A missing path is fine; anything dfairpca did not write raises :class:`OutputPathError`.
    Files a user put inside it are kept, with the directory (and a warning naming them):
    only the entries dfairpca wrote, and then its marker, are deleted.

    Parameters
    ----------
    path : str or os.PathLike
        The directory (a URL for a remote one).
    kind : str
        The kind it must be dfairpca's output of.
    storage_options : dict, optional
        fsspec options of a URL ``path``.
    """
    if is_remote(path):
        return _remote.remove_directory(_remote.location(path, storage_options), kind)
    path = Path(path)
    recover(path)
    if not _exists(path):
        return
    found = read_marker(path)
    if path.is_symlink() or not path.is_dir() or found is None or found.get("kind") != kind:
        raise not_ours(str(path), kind)
    foreign = foreign_entries(path, found)
    if not foreign:
        _remove_tree(path)
        return
    # a user's file may lie deep inside (in a Zarr array's folder too): delete ours one
    # by one, then the folders they leave empty, the markers last
    markers = (MARKER, "zarr.json")
    for name in _files(path):
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


def recover(path, *, storage_options: dict | None = None) -> None:
    """Repair what a crash in the middle of :func:`atomic_directory` left next to ``path``.

    An ``.old-`` sibling is renamed back to ``path`` if ``path`` is missing (the newest one
    wins), and deleted otherwise; a ``.tmp-`` sibling is deleted, and so is the lock file of
    a replace whose holder died.  Only siblings carrying
    dfairpca's marker (or empty) are touched, and none of a writer still running on this
    host.  For a URL: finishes a move cut short (see :mod:`dfairpca.io._remote`).

    Parameters
    ----------
    path : str or os.PathLike
        The output whose siblings to repair (a URL for a remote one).
    storage_options : dict, optional
        fsspec options of a URL ``path``.
    """
    if is_remote(path):
        return _remote.recover(_remote.location(path, storage_options))
    path = Path(path)
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        return
    _drop_stale_lock(parent / f".{path.name}{REPLACE_LOCK}")
    pattern = sibling_pattern(path.name, "old|tmp")
    leftovers = []
    for entry in parent.iterdir():
        m = pattern.fullmatch(entry.name)
        if m is None or running(entry.name, m.group(2), int(m.group(3))):
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


def _drop_stale_lock(lock: Path) -> None:
    """Remove the lock file ``lock`` if dfairpca made it and no process holds it (its
    holder crashed); a held one (this process's own too) is left alone."""
    import fcntl

    try:
        fd = os.open(lock, os.O_RDONLY)
    except OSError:
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        if os.pread(fd, len(LOCK_MARK) + 1, 0) == LOCK_MARK and \
                os.fstat(fd).st_ino == os.stat(lock).st_ino:
            os.unlink(lock)
    except OSError:  # held (BlockingIOError), or removed meanwhile
        pass
    finally:
        os.close(fd)


def recover_for_reading(path, *, storage_options: dict | None = None) -> None:
    """:func:`recover` ``path`` before reading it, if this process may write its folder.

    Safe in a reader for the same reason as in a writer: only a dead writer's leftovers
    are touched.  Without write permission nothing is repaired; :func:`load_arrays` then
    names the intact copy.  For a URL, a write still under way is an error
    (:func:`dfairpca.io._remote.check_settled`).

    Parameters
    ----------
    path : str or os.PathLike
        The output about to be read (a URL for a remote one).
    storage_options : dict, optional
        fsspec options of a URL ``path``.
    """
    if is_remote(path):
        return _remote.check_settled(_remote.location(path, storage_options))
    try:
        recover(path)
    except OSError:
        pass


def intact_copies(path) -> list[Path]:
    """dfairpca's ``.old-`` siblings of a missing ``path``, oldest first: the intact old
    version a replace cut short between its two renames left (none if ``path`` exists;
    none for a URL, where a replace keeps no old copy)."""
    if is_remote(path):
        return []
    path = Path(path)
    parent = path.parent if str(path.parent) else Path(".")
    if _exists(path) or not parent.is_dir():
        return []
    pattern = sibling_pattern(path.name, "old")
    return sorted((e for e in parent.iterdir()
                   if pattern.fullmatch(e.name) and read_marker(e) is not None),
                  key=lambda e: e.stat().st_mtime_ns)


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
        ``path``.

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
        raise _not_writable(path, folder, exc) from None


def _not_writable(path: Path, folder: Path, exc: OSError) -> PermissionError:
    """The error for an output whose folder cannot be written."""
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    return AccessError(
        f"cannot write {path}: the directory {folder} is not writable ({exc.strerror}); "
        "choose an output path in a writable directory"
    )


def _sibling(path: Path, role: str) -> Path:
    """``.NAME.{role}-HOST-PID-RANDOM`` next to ``path``: what recover() looks for."""
    return path.parent / sibling_name(path.name, role)


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

    Returns
    -------
    context manager
        Zarr's configuration with ``array.write_empty_chunks`` set, for a ``with`` block.
    """
    import zarr

    return zarr.config.set({"array.write_empty_chunks": True})
