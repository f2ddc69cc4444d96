"""Staging: an output for a URL written to a local folder first, then uploaded.

A writer that writes local folders (ingest, synth, ``save``) cannot write object storage
itself: :func:`staged_locally` gives it a local folder, and moves what it wrote into place
at the URL when it is complete.  A keyed stage (:func:`stage_folder`) survives a failure,
and the same call again resumes there.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ._files import read_capped
from ._local import LocalStorage, is_empty_dir, temporary_sibling
from ._locks import disk_full, exclusive, is_disk_full
from ._marker import MARKER, OutputPathError, marker
from ._urls import normalised
from ._where import storage_for
from ..base._system import cache_folder
from ..base._params import outside_stacklevel
from ..base._version import code_digest
from ..errors import AccessError, DiscardedWriteWarning, DiskFullError, InvalidInputError

# Deferred imports: standard modules needed rarely or on one platform only are imported in the
# functions that use them, so that importing this module stays light.

__all__ = ["STAGE_KIND", "STAGE_FILE", "STAGE_WORK", "STAGE_ENV", "stage_folder", "check_stage_dir",
           "staged_locally", "write_staged"]

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
    root = stage_dir or os.environ.get(STAGE_ENV) or cache_folder() / "stage"
    digest = hashlib.sha256(normalised(url).encode()).hexdigest()[:16]
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
    if stage_dir is not None and not storage_for(path).remote:
        raise InvalidInputError(f"stage_dir (--stage-dir) is where a store for a URL is staged; {path} "
                         "is a local path, written in place (it resumes there): drop stage_dir")
    if stage_dir is not None and storage_for(stage_dir).remote:
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
    storage = storage_for(path, storage_options)
    if not storage.remote:
        yield Path(path)
        return
    storage.check_target(kind, overwrite=overwrite)
    loc = storage.target
    if key is None:
        with contextlib.ExitStack() as stack:
            scratch = stack.enter_context(tempfile.TemporaryDirectory(prefix=".dfairpca-stage-"))
            try:
                local = Path(scratch) / "out"
                yield local
                storage.move_into_place(local, kind, overwrite=overwrite)
            except OSError as exc:
                if not _unstaged_full(exc):
                    raise
                stack.close()  # the local copy is removed before the free space is measured
                raise _staged_full(exc, loc, kind, Path(scratch), (
                    f"its local copy was removed and nothing was uploaded to {loc.url}: free "
                    "space there, or set $TMPDIR to a folder with room")) from None
        return
    folder = stage_folder(loc, stage_dir)
    _stage_root(folder, loc)
    with exclusive(folder.parent / f".{folder.name}.lock", f"{loc.url} (its stage {folder})"):
        _open_stage(folder, loc, key, overwrite=overwrite)
        try:
            yield folder / STAGE_WORK / loc.name
            storage.move_into_place(folder / STAGE_WORK / loc.name, kind, overwrite=overwrite)
        except BaseException as exc:
            _kept(exc, folder, loc)
            if isinstance(exc, OSError) and _unstaged_full(exc):
                raise _staged_full(exc, loc, kind, folder, (
                    f"what was written is kept there: free space, then the same call again "
                    f"resumes from it (overwrite=True, --overwrite, discards it), or pass "
                    f"stage_dir= (--stage-dir) to stage {loc.url} on another disk")
                    if folder.exists() else f"its stage was removed and nothing was uploaded to "
                    f"{loc.url}: free space there, or pass stage_dir= (--stage-dir) to stage it "
                    "on another disk") from None
            raise
        LocalStorage(folder).remove_directory(STAGE_KIND)


def write_staged(path, kind: str, write: Callable[[Path, bool], Any], *, overwrite: bool = False,
                 storage_options: dict | None = None, key: Callable[[], dict] | None = None,
                 stage_dir=None):
    """Write ``path`` with ``write``, a writer of local folders that resumes its own partial
    output (ingest, synth): in place for a local path, else through its stage.

    For a URL, ``write`` writes the stage :func:`staged_locally` gives (skipped where the
    stage holds this call's finished output, its upload cut short), which is then uploaded.

    Parameters
    ----------
    path : str, os.PathLike or Location
        The output (a URL for a remote one).
    kind : str
        What it holds ("store", ...).
    write : callable
        ``write(folder, overwrite)`` writes the output at the local path ``folder`` by its
        own protocol (checked, resumed, moved into place) and returns what to hand back.
    overwrite : bool
        Replace dfairpca's own output of the same ``kind``; discards a stage too.
    storage_options : dict, optional
        fsspec options of a URL ``path``.
    key : callable, optional
        ``key()``: what determines the output (JSON), asked only for a URL; given, the stage
        survives a failure and is resumed by a call with an equal key.
    stage_dir : str or os.PathLike, optional
        The local folder stages go in (a URL's only, see :func:`staged_locally`).

    Returns
    -------
    object
        What ``write`` returned for a local ``path``; for a URL, ``path`` as given.
    """
    check_stage_dir(path, stage_dir)
    storage = storage_for(path, storage_options)
    if not storage.remote:
        return write(storage.target, overwrite)
    with staged_locally(path, kind, overwrite=overwrite, storage_options=storage_options,
                        key=None if key is None else key(), stage_dir=stage_dir) as local:
        if not local.exists():  # else: this call's finished output, its upload cut short
            write(local, False)
    return storage.user_path()


def _unstaged_full(exc: OSError) -> bool:
    """Whether ``exc`` is a full disk not yet said as the stage's (a writer's own error
    names the local path it wrote, not the URL it stands for)."""
    return (is_disk_full(exc) or isinstance(exc, DiskFullError)) and getattr(exc, "stage", None) is None


def _staged_full(exc: OSError, loc, kind: str, stage: Path, kept: str) -> DiskFullError:
    """``exc`` (a full disk in the stage ``stage`` of ``loc``) said naming both: a writer's
    own account of what it kept stands; else ``kept``, provisional (a caller that knows
    more says it again)."""
    if isinstance(exc, DiskFullError) and not exc.provisional:
        return disk_full(loc.url, exc.what, f"{exc.kept} (or pass stage_dir=, --stage-dir, to "
                         "stage it on another disk)", stage=stage, cause=exc)
    error = disk_full(loc.url, f"the {kind}", kept, stage=stage, cause=exc)
    error.provisional = True
    return error


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
    stage = LocalStorage(folder)
    try:
        stage.check_target(STAGE_KIND, overwrite=True)  # missing, empty, or a stage, only ours
    except OutputPathError as exc:
        raise OutputPathError(f"{exc} ({folder} is where {loc.url} is staged: {elsewhere})") from None
    if stage.exists() and not is_empty_dir(folder):
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
                          "be reused", DiscardedWriteWarning, stacklevel=outside_stacklevel())
        stage.remove_directory(STAGE_KIND)
    with temporary_sibling(folder) as tmp:  # the stage appears whole: marker, record and work folder
        # the entries, not every file: the writer's files in work/ are the stage's own
        (tmp / MARKER).write_text(json.dumps({**marker(STAGE_KIND), "entries": [STAGE_FILE, STAGE_WORK]}))
        (tmp / STAGE_FILE).write_text(json.dumps(record))
        (tmp / STAGE_WORK).mkdir()
        stage.move_into_place(tmp, STAGE_KIND)


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
            LocalStorage(folder).remove_directory(STAGE_KIND)
        return
    if getattr(exc, "__notes__", None):
        exc.__notes__[:] = [n for n in exc.__notes__ if str(folder) not in n]
    exc.add_note(f"dfairpca kept what it wrote for {loc.url} in {folder}: the same call again "
                 "resumes from there (overwrite=True, --overwrite, discards it)")
