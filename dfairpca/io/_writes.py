"""The write protocol: dfairpca's marker, atomic replacement and crash recovery.

Every directory dfairpca writes (models, statistics, checkpoints, Zarr stores) goes through
:func:`atomic_directory`: it carries dfairpca's marker (:data:`MARKER`), is written to a
temporary sibling and moved into place only when complete, and replaces only a directory
carrying the same marker -- dfairpca never deletes or overwrites what it did not write.
Users reach these names through :mod:`dfairpca.io`, whose interface they are.

Every function also takes an fsspec URL (``s3://bucket/x``) or mapper with
``storage_options``: each is one call of the operation of the path's storage
(:func:`dfairpca.io.storage_for`): renames on a local disk
(:mod:`dfairpca.io._local`), copies under a journal on object storage
(:mod:`dfairpca.io._fsspec`).
"""

from __future__ import annotations

import contextlib
from pathlib import Path
import zarr

from ._local import LocalStorage, named, register_marked_file, temporary_file
from ._locks import LOCK_MARK, REPLACE_LOCK, disk_full, exclusive, is_disk_full
from ._marker import MARKER, MARKER_KEY, OutputPathError, marker, marker_attributes
from ._stage import STAGE_ENV, STAGE_KIND, check_stage_dir, stage_folder, staged_locally
from ._storage import Protected
from ._where import storage_for
from ..errors import DiskFullError, InvalidInputError

__all__ = [
    "atomic_directory", "atomic_file", "staged_locally", "stage_folder", "check_stage_dir",
    "STAGE_KIND", "STAGE_ENV", "move_into_place", "check_target", "named", "exclusive",
    "foreign_entries", "remove_directory", "recover", "recover_for_reading", "intact_copies",
    "read_marker", "write_marker", "marker", "register_marked_file", "marker_attributes",
    "writing_every_chunk", "OutputPathError", "MARKER", "MARKER_KEY", "REPLACE_LOCK", "LOCK_MARK",
]


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
    storage_for(directory, storage_options).write_marker(kind)


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
    return storage_for(path, storage_options).foreign(found)[0]


def read_marker(path, *, storage_options: dict | None = None) -> dict | None:
    """dfairpca's marker of ``path`` (a directory, a Zarr store, or a single file of a
    format registered with :func:`register_marked_file`), or None if unmarked.

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
    return storage_for(path, storage_options).read_marker()


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
    storage_for(path, storage_options).check_target(kind, overwrite=overwrite, protect=protect, probe=probe)


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

    For a URL (see :mod:`dfairpca.io._urls`) the block gets, with ``direct``, the URL of the
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
    storage = storage_for(path, storage_options)
    tmp = None
    try:
        with storage.atomic_directory(kind, overwrite=overwrite, protect=protect, direct=direct) as tmp:
            yield tmp
    except OSError as exc:
        if isinstance(exc, DiskFullError) or not is_disk_full(exc):
            raise
        # the temporary is gone (its context removed it); a caller that knows more (what a
        # checkpoint keeps) says it again (is_disk_full is true for this one)
        stage = Path(tmp).parent if storage.remote and not direct and tmp is not None else None
        error = disk_full(path, f"the {kind}", _unchanged(path, stage is not None), stage=stage)
        error.provisional = True
        raise error from None


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
    source = storage_for(src, storage_options).target  # a Location on the same storage, or a Path
    storage = storage_for(path, storage_options)
    storage.move_into_place(source, kind, overwrite=overwrite)
    return storage.user_path()


@contextlib.contextmanager
def atomic_file(path, kind: str, *, overwrite: bool = False, protect: Protected = None):
    """Yield a temporary file path that becomes ``path`` only if the block succeeds.

    The file form of :func:`atomic_directory` (a figure): the block writes the file, with
    dfairpca's marker inside it (where its format keeps text, read back by the reader its
    application registered: :func:`register_marked_file`), at the
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
    storage = storage_for(path)
    if storage.remote:
        raise InvalidInputError(f"{path}: a {kind} is written to a local path; write it there and copy it")
    path = storage.target
    storage.check_target(kind, overwrite=overwrite, protect=protect)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        with temporary_file(path) as tmp:
            yield tmp
            if LocalStorage(tmp).read_marker() is None:
                raise InvalidInputError(f"the {kind} written for {path} carries no dfairpca marker; not "
                                        "moved into place (a file dfairpca cannot recognise is never its own)")
            storage.move_into_place(tmp, kind, overwrite=overwrite)
    except OSError as exc:
        if isinstance(exc, DiskFullError) or not is_disk_full(exc):
            raise
        error = disk_full(path, f"the {kind}", _unchanged(path, False))
        error.provisional = True
        raise error from None


def _unchanged(path, staged: bool) -> str:
    """What a write that found its disk full left: its copy removed, ``path`` as it was."""
    if staged:
        return (f"its local copy was removed and nothing was uploaded to {path}: free space "
                "there, or set $TMPDIR to a folder with room")
    return (f"its unfinished copy was removed, {path} is as it was: free space there or "
            "write it to another disk")


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
    storage_for(path, storage_options).remove_directory(kind)


def recover(path, *, storage_options: dict | None = None) -> None:
    """Repair what a crash in the middle of :func:`atomic_directory` left next to ``path``.

    An ``.old-`` sibling is renamed back to ``path`` if ``path`` is missing (the newest one
    wins), and deleted otherwise; a ``.tmp-`` sibling is deleted, and so is the lock file of
    a replace whose holder died.  Only siblings carrying
    dfairpca's marker (or empty) are touched, and none of a writer still running on this
    host.  For a URL: finishes a move cut short (see :mod:`dfairpca.io._fsspec`).

    Parameters
    ----------
    path : str or os.PathLike
        The output whose siblings to repair (a URL for a remote one).
    storage_options : dict, optional
        fsspec options of a URL ``path``.
    """
    storage_for(path, storage_options).recover()


def recover_for_reading(path, *, storage_options: dict | None = None) -> None:
    """:func:`recover` ``path`` before reading it, if this process may write its folder.

    Safe in a reader for the same reason as in a writer: only a dead writer's leftovers
    are touched.  Without write permission nothing is repaired; :func:`load_arrays` then
    names the intact copy.  For a URL, a write still under way is an error
    (:func:`dfairpca.io._fsspec.check_settled`).

    Parameters
    ----------
    path : str or os.PathLike
        The output about to be read (a URL for a remote one).
    storage_options : dict, optional
        fsspec options of a URL ``path``.
    """
    storage_for(path, storage_options).recover_for_reading()


def intact_copies(path) -> list[Path]:
    """dfairpca's ``.old-`` siblings of a missing ``path``, oldest first: the intact old
    version a replace cut short between its two renames left (none if ``path`` exists;
    none for a URL, where a replace keeps no old copy)."""
    return storage_for(path).intact_copies()


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
    return zarr.config.set({"array.write_empty_chunks": True})
