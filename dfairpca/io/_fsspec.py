"""The write protocol on object storage reached through fsspec: :class:`FsspecStorage`.

Object storage has no directories and no rename: a "directory" is the objects under a
prefix, and moving a prefix copies every object (on S3 server-side, CopyObject: no data
passes through this machine) and then deletes the originals.  So the write protocol of
:mod:`dfairpca.io._writes` (marker, temporary sibling, move into place, recovery) becomes,
for a URL:

1. :func:`check_target` applies the local rules (:func:`dfairpca.io._marker.refusal`), after
   writing and deleting a probe object beside the target: missing credentials, an unknown
   bucket or an unreachable endpoint are one-line errors before any work.
2. The job writes under the sibling prefix ``.NAME.tmp-HOST-PID-RANDOM``, marked first:
   directly (a Zarr store the workers write: :func:`atomic_prefix`) or into a local folder
   uploaded when it is complete (:func:`publish`: models, statistics, checkpoints).
3. :func:`move_into_place` writes a journal object ``.NAME.move-HOST-PID-RANDOM``, copies
   every object to NAME (markers last), deletes what an old version at NAME has and the
   new one lacks, notes "copied" in the journal, deletes the temporary prefix, then the
   journal.
4. A crash between the copy and the delete leaves the journal, and :func:`recover` (run by
   the next write to NAME and by every read of a saved object) finishes the move from the
   temporary prefix, which is whole until the journal says "copied".  Unlike a local
   rename, the old version is not kept while the new one is copied over it: the new version
   is whole under one of the two names at every moment, and a reader that finds the
   journal of a writer still running is refused (:func:`check_settled`).
"""

from __future__ import annotations

import contextlib
import json
import re
import tempfile
from collections.abc import Iterator
from pathlib import Path

from ._files import capped
from ._local import LocalStorage, remove_tree as _remove_local_tree
from ._marker import (
    consolidate,
    MARKER, MARKER_KEY, OutputPathError, apart, expired, foreign_files, kept, lease_age, leased, marker, marker_attributes,
    not_ours, refusal, running, sibling_name, sibling_pattern, warn_kept, zarr_foreign, zarr_layout,
)
from ._storage import Protected, Storage, each_protected
from ._urls import Location, explaining, location, normalised, zarr_store
from ..errors import PathNotFoundError

__all__ = [
    "FsspecStorage", "exists", "read_text", "read_marker", "write_marker", "foreign_entries",
    "foreign", "check_target", "atomic_prefix", "publish", "move_into_place", "recover",
    "check_settled", "remove_directory", "local_copy", "list_keys",
]

#: the objects that mark a prefix as dfairpca's: copied last, deleted last
_MARKERS = (MARKER, "zarr.json")


# ---------------------------------------------------------------------------- primitives
def _names(loc: Location) -> list[str]:
    """Names directly under ``loc`` (objects and sub-prefixes); [] if there are none."""
    loc.fs.invalidate_cache(loc.path)
    try:
        entries = loc.fs.ls(loc.path, detail=False)
    except FileNotFoundError:
        return []
    prefix = loc.path.rstrip("/") + "/"
    return sorted({e.rstrip("/")[len(prefix):].split("/")[0] for e in entries
                   if e.rstrip("/").startswith(prefix)})


def _keys(loc: Location) -> list[str]:
    """Every object under ``loc``, relative to it; markers last."""
    loc.fs.invalidate_cache(loc.path)
    try:
        found = loc.fs.find(loc.path)
    except FileNotFoundError:
        return []
    prefix = loc.path.rstrip("/") + "/"
    keys = [k[len(prefix):] for k in found if k.startswith(prefix)]
    return sorted(keys, key=lambda k: (k in _MARKERS, k))


def exists(path, storage_options: dict | None = None) -> bool:
    """Whether anything is stored at the URL ``path`` (an object or a prefix)."""
    loc = location(path, storage_options)
    with explaining(loc):
        return bool(_keys(loc)) or _is_object(loc)


def _is_object(loc: Location) -> bool:
    try:
        return loc.fs.isfile(loc.path)
    except FileNotFoundError:
        return False


def _read_capped(loc: Location) -> bytes:
    """The object at ``loc``, no more of it read than a file dfairpca writes can hold."""
    def read(n: int) -> bytes:
        try:
            return loc.fs.cat_file(loc.path, start=0, end=n)
        except FileNotFoundError:
            raise
        except OSError:  # S3 finds no range of an empty object satisfiable (416)
            if loc.fs.size(loc.path) == 0:
                return b""
            raise

    return capped(read, loc.name)


def _read_json(loc: Location):
    """The JSON object stored at ``loc``, or None if absent or unreadable."""
    try:
        found = json.loads(_read_capped(loc))
    except (FileNotFoundError, ValueError, UnicodeDecodeError):
        return None
    return found if isinstance(found, dict) else None


def read_text(path, storage_options: dict | None = None) -> str:
    """The text of the small object (a JSON file dfairpca wrote) at a URL."""
    loc = location(path, storage_options)
    with explaining(loc):
        return _read_capped(loc).decode("utf-8")


def _write_json(loc: Location, value: dict) -> None:
    loc.fs.pipe_file(loc.path, json.dumps(value).encode())


def _delete(loc: Location, keys) -> None:
    """Delete the objects ``keys`` under ``loc``, in the order given."""
    keys = list(keys)
    if keys:
        loc.fs.rm([f"{loc.path}/{k}" for k in keys])
    loc.fs.invalidate_cache(loc.path)


def _remove_tree(loc: Location) -> None:
    """Delete every object under ``loc``, its markers last (a deletion cut short leaves a
    prefix that is still recognisably ours)."""
    keys = _keys(loc)
    _delete(loc, [k for k in keys if k not in _MARKERS])
    _delete(loc, [k for k in keys if k in _MARKERS])


# ---------------------------------------------------------------------------- leases
#: the suffix of the object beside a temporary sibling (a prefix or a journal) that its
#: writer rewrites every LEASE_REFRESH_S (object storage has no mtime to touch)
LEASE_SUFFIX = ".lease"


def _lease(sibling: Location) -> Location:
    return sibling.parent.child(sibling.name + LEASE_SUFFIX)


def _renew(sibling: Location) -> None:
    """Renew the lease of this process's ``sibling``: rewrite its lease object."""
    _write_json(_lease(sibling), {**marker("lease"), "sibling": sibling.name})


def _modified(loc: Location) -> float | None:
    """The POSIX time the object ``loc`` was last written, or None (absent, or a store
    that does not say)."""
    try:
        return loc.fs.modified(loc.path).timestamp()
    except Exception:  # FileNotFoundError, NotImplementedError, a store's own
        return None


def _age(sibling: Location) -> float | None:
    """Seconds since ``sibling``'s lease was renewed: its lease object's time, or for a
    writer without leases, the sibling's own (a journal or probe object, a prefix's
    marker, which is written first and again at the end); None if none can be read."""
    for where in (_lease(sibling), sibling, sibling.child(MARKER)):
        t = _modified(where)
        if t is not None:
            return lease_age(t)
    return None


@contextlib.contextmanager
def _leased(sibling: Location) -> Iterator[None]:
    """Hold ``sibling``'s lease while the block runs; its lease object is deleted after,
    once no renewal can run (:func:`leased` has ended, after any renewal under way)."""
    try:
        with leased(sibling.name, lambda: _renew(sibling)):
            yield
    finally:
        with contextlib.suppress(Exception):
            sibling.fs.rm(_lease(sibling).path)


# ---------------------------------------------------------------------------- marker
def read_marker(loc: Location) -> dict | None:
    """dfairpca's marker of the prefix ``loc`` (its ``.dfairpca`` object, or a Zarr store's
    root attribute), or None if unmarked."""
    with explaining(loc):
        found = _read_json(loc.child(MARKER))
        if found is None:
            found = ((_read_json(loc.child("zarr.json")) or {}).get("attributes") or {}).get(MARKER_KEY)
    ok = isinstance(found, dict) and found.get("written_by") == "dfairpca"
    return found if ok else None


def write_marker(loc: Location, kind: str) -> None:
    """Mark ``loc`` as dfairpca's, as :func:`dfairpca.io._writes.write_marker` does: a Zarr
    store's root attribute, else the object."""
    with explaining(loc):
        meta = _read_json(loc.child("zarr.json"))
        if meta is not None:  # the attribute, as zarr's attrs.update would write it
            layout = zarr_layout(zarr_store(loc))
            meta.setdefault("attributes", {}).update(marker_attributes(kind, layout))
            _write_json(loc.child("zarr.json"), meta)
            _delete(loc, [MARKER] if _is_object(loc.child(MARKER)) else [])
            consolidate(zarr_store(loc))
        else:
            _write_json(loc.child(MARKER), marker(kind, _keys(loc)))


def foreign_entries(loc: Location, found: dict) -> list[str]:
    """What under dfairpca's prefix ``loc`` (marker ``found``) it did not write, at any
    depth, by the rules of :func:`dfairpca.io._writes.foreign_entries` (one listing of the
    objects, and the store's metadata read by zarr)."""
    return foreign(loc, found)[0]


def foreign(loc: Location, found: dict) -> tuple[list[str], dict]:
    """:func:`foreign_entries`, and the attributes dfairpca did not write in each metadata
    file among them."""
    with explaining(loc):
        keys = _keys(loc)
        if "zarr.json" not in keys:
            return foreign_files(keys, found), {}
        return zarr_foreign(keys, zarr_layout(zarr_store(loc)), found)


# ---------------------------------------------------------------------------- the protocol
def check_target(loc: Location, kind: str, *, overwrite: bool = False, protect: Protected = None,
                 probe: bool = True) -> None:
    """:func:`dfairpca.io._writes.check_target` for a URL; the probe writes and deletes an
    object beside ``loc`` (credentials, bucket and endpoint, before any work)."""
    if "/" not in loc.path.rstrip("/"):  # a bucket (a rooted path, memory://x, is no bucket):
        raise OutputPathError(          # the probe, temporary prefix and journal are siblings
            f"cannot write to {loc.url}, the root of a bucket: dfairpca writes beside its "
            f"output; name a prefix inside it, e.g. {loc.url.rstrip('/')}/{kind}")
    for what, other in each_protected(protect):
        other_url, here = normalised(other), normalised(loc)  # s3a:// is s3://
        relation = ("is" if here == other_url else
                    "contains" if other_url.startswith(here + "/") else
                    "is inside" if here.startswith(other_url + "/") else None)
        apart(loc.url, relation, what, other_url)
    with explaining(loc):
        recover(loc)
        if probe:
            probe_at = loc.parent.child(sibling_name(loc.name, "probe"))
            probe_at.fs.pipe_file(probe_at.path, b"")
            probe_at.fs.rm(probe_at.path)
        keys = _keys(loc)
        if not keys and not _is_object(loc):
            return
        found = read_marker(loc)
        entries, attributes = foreign(loc, found) if found is not None and keys else ([], {})
        error = refusal(loc.url, kind, found, empty=False, is_dir=bool(keys), overwrite=overwrite,
                        foreign=entries, attributes=attributes)
    if error is not None:
        raise error


@contextlib.contextmanager
def _temporary(loc: Location):
    """The temporary sibling prefix of ``loc`` for this write, deleted when the block ends
    (a crash's is deleted by :func:`recover`: it is marked)."""
    tmp = loc.parent.child(sibling_name(loc.name, "tmp"))
    with _leased(tmp):
        try:
            yield tmp
        finally:
            with explaining(tmp):
                if _keys(tmp):
                    _remove_tree(tmp)


@contextlib.contextmanager
def atomic_prefix(loc: Location, kind: str, *, overwrite: bool = False, protect: Protected = None):
    """Yield the URL of a temporary prefix that becomes ``loc`` if the block succeeds: for
    a Zarr store the workers write there directly (see the module docstring)."""
    check_target(loc, kind, overwrite=overwrite, protect=protect)
    with _temporary(loc) as tmp:
        write_marker(tmp, kind)  # first: a leftover of a crash is recognisably ours
        yield tmp.url
        write_marker(tmp, kind)  # again: a Zarr store written there holds it in zarr.json
        move_into_place(tmp, loc, kind, overwrite=overwrite)


def publish(local: Path, loc: Location, kind: str, *, overwrite: bool = False) -> None:
    """Upload the finished, marked local folder ``local`` to a temporary prefix, then move
    it into place at ``loc``."""
    files = sorted((p for p in Path(local).rglob("*") if p.is_file()),  # the markers first:
                   key=lambda p: (p.relative_to(local).as_posix() not in _MARKERS, str(p)))  # ours at once
    with _temporary(loc) as tmp:
        with explaining(loc):
            for f in files:
                tmp.fs.put_file(str(f), f"{tmp.path}/{f.relative_to(local).as_posix()}")
        move_into_place(tmp, loc, kind, overwrite=overwrite)


def move_into_place(src: Location, loc: Location, kind: str, *, overwrite: bool = False) -> None:
    """Move the finished, marked prefix ``src`` to ``loc``: copy, then delete, under a
    journal that lets :func:`recover` finish a move cut short between the two."""
    check_target(loc, kind, overwrite=overwrite, probe=False)
    journal = loc.parent.child(sibling_name(loc.name, "move"))
    with _leased(journal), explaining(loc):
        state = {**marker(kind), "source": src.name, "copied": False}
        _write_json(journal, state)
        _finish_move(src, loc, journal, state)


def _finish_move(src: Location, loc: Location, journal: Location, state: dict) -> None:
    """Steps 3 of the module docstring from where ``state`` (the journal) says."""
    if not state["copied"]:
        keys = _keys(src)
        # the markers after the rest (one batch runs its copies concurrently): a fresh
        # target whose copy was cut short is not yet a marked store
        for batch in ([k for k in keys if k not in _MARKERS], [k for k in keys if k in _MARKERS]):
            if batch:
                src.fs.copy([f"{src.path}/{k}" for k in batch], [f"{loc.path}/{k}" for k in batch])
        _delete(loc, [k for k in _keys(loc) if k not in set(keys)])  # the old version's rest
        _write_json(journal, {**state, "copied": True})
    _remove_tree(src)
    journal.fs.rm(journal.path)


def recover(loc: Location) -> None:
    """Finish the moves into ``loc`` a crash cut short and delete its dead writers'
    temporary prefixes (only marked ones, none of a writer still running on this host)
    and empty probe objects."""
    parent = loc.parent
    pattern = sibling_pattern(loc.name, "tmp|move|probe")
    with explaining(loc):
        names = _names(parent)
        leftovers = [(m.group(1), parent.child(name)) for name in names
                     if (m := pattern.fullmatch(name))
                     and not running(name, m.group(2), int(m.group(3)), _age(parent.child(name)))]
        for role, journal in leftovers:  # moves first: their sources are temporary prefixes
            state = _read_json(journal) if role == "move" else None
            if state is None or state.get("written_by") != "dfairpca":
                continue
            src = parent.child(str(state.get("source")))
            if not state.get("copied") and read_marker(src) is None:
                raise OutputPathError(
                    f"a move into {loc.url} was cut short and its source {src.url} is not whole; "
                    f"{loc.url} may be incomplete: write it again (with overwrite) or delete it")
            _finish_move(src, loc, journal, {**state, "copied": bool(state.get("copied"))})
        for role, tmp in leftovers:
            if role == "tmp" and _keys(tmp) and read_marker(tmp) is not None:
                _remove_tree(tmp)
            elif role == "probe" and _is_object(tmp) and tmp.fs.size(tmp.path) == 0:
                tmp.fs.rm(tmp.path)  # check_target's empty probe, left by a crash
        # the lease objects of dead writers whose siblings are gone (those just removed too)
        leases = re.compile(pattern.pattern + re.escape(LEASE_SUFFIX))
        for name in names:
            if leases.fullmatch(name) and not _keys(parent.child(name[: -len(LEASE_SUFFIX)])) \
                    and not _is_object(parent.child(name[: -len(LEASE_SUFFIX)])):
                lease = parent.child(name)
                t = _modified(lease)
                if t is None or expired(lease_age(t)):
                    lease.fs.rm(lease.path)


def check_settled(loc: Location) -> None:
    """Raise unless ``loc`` can be read whole: no move into it is under way (a writer that
    is still running; a dead one's move is finished first by :func:`recover`)."""
    try:
        recover(loc)
    except PermissionError:  # a reader without write access: it can only wait
        pass
    pattern = sibling_pattern(loc.name, "move")
    with explaining(loc):
        busy = [name for name in _names(loc.parent) if pattern.fullmatch(name)]
    if busy:
        raise OutputPathError(
            f"{loc.url} is being written ({busy[0]} is the journal of its writer): read it "
            "when that job has finished")


def remove_directory(loc: Location, kind: str) -> None:
    """:func:`dfairpca.io._writes.remove_directory` for a URL."""
    with explaining(loc):
        recover(loc)
        if not _keys(loc):
            return
        found = read_marker(loc)
        if found is None or found.get("kind") != kind:
            raise not_ours(loc.url, kind)
        foreign = foreign_entries(loc, found)
        if not foreign:
            _remove_tree(loc)
            return
        _delete(loc, [k for k in _keys(loc) if k != MARKER and not kept(k, foreign)])
        _delete(loc, [MARKER])
    warn_kept(loc.url, kind, foreign)


@contextlib.contextmanager
def local_copy(loc: Location):
    """A local copy of the small saved directory ``loc`` (a model, statistics or a
    checkpoint), made after checking that no write to it is under way."""
    check_settled(loc)
    with tempfile.TemporaryDirectory(prefix=".dfairpca-read-") as folder:
        local = Path(folder) / (loc.name or "root")
        with explaining(loc):
            keys = _keys(loc)
            if not keys:
                raise PathNotFoundError(f"nothing is stored at {loc.url}")
            for k in keys:
                (local / k).parent.mkdir(parents=True, exist_ok=True)
                loc.fs.get_file(f"{loc.path}/{k}", str(local / k))
        try:
            yield local
        except (ValueError, OSError) as exc:  # a message naming the copy names the URL
            if str(local) not in str(exc) or len(exc.args) != 1:
                raise
            raise type(exc)(str(exc).replace(str(local), loc.url)) from None


def list_keys(loc: Location) -> list[str]:
    """Every object under the prefix ``loc``, relative to it; markers last."""
    with explaining(loc):
        return _keys(loc)


class FsspecStorage(Storage):
    """The write protocol on an fsspec file system (see the module docstring): copies
    under a journal where a local disk renames.

    Parameters
    ----------
    target : Location
        The output's prefix, with the file system and the options it was made with.
    """

    remote = True

    def __init__(self, target: Location, given=None):
        self.target = target
        self.given = target if given is None else given

    @classmethod
    def at(cls, path, storage_options: dict | None = None) -> "FsspecStorage":
        return cls(location(path, storage_options), given=path)

    def user_path(self):
        return self.given  # the URL as given, not the Location made of it

    def as_argument(self, kind: str) -> Location:
        return self.target

    def sibling(self, suffix: str) -> "FsspecStorage":
        loc = self.target
        return FsspecStorage(Location(loc.fs, loc.path.rstrip("/") + suffix, loc.options))

    def for_readers(self, opened):
        return opened

    def exists(self) -> bool:
        return exists(self.target)

    def read_marker(self) -> dict | None:
        return read_marker(self.target)

    def write_marker(self, kind: str) -> None:
        write_marker(self.target, kind)

    def foreign(self, found: dict) -> tuple[list[str], dict]:
        return foreign(self.target, found)

    def check_target(self, kind: str, *, overwrite: bool = False, protect: Protected = None,
                     probe: bool = True) -> None:
        check_target(self.target, kind, overwrite=overwrite, protect=protect, probe=probe)

    @contextlib.contextmanager
    def atomic_directory(self, kind: str, *, overwrite: bool = False, protect: Protected = None,
                         direct: bool = False) -> Iterator:
        """With ``direct``, the URL of the temporary prefix (a Zarr store that workers write
        there); else a local folder, uploaded when the block ends (small files)."""
        if direct:
            with atomic_prefix(self.target, kind, overwrite=overwrite, protect=protect) as tmp:
                yield tmp
            return
        check_target(self.target, kind, overwrite=overwrite, protect=protect)  # before the block's work
        with tempfile.TemporaryDirectory(prefix=".dfairpca-stage-") as folder:
            stage = Path(folder) / self.target.name
            stage.mkdir()
            yield stage
            LocalStorage(stage).write_marker(kind)
            publish(stage, self.target, kind, overwrite=overwrite)

    def move_into_place(self, src, kind: str, *, overwrite: bool = False) -> None:
        """``src``: a :class:`Location` on the same storage (moved), or a local folder
        (uploaded, then deleted)."""
        if isinstance(src, Location):
            move_into_place(src, self.target, kind, overwrite=overwrite)
            return
        check_target(self.target, kind, overwrite=overwrite)
        publish(Path(src), self.target, kind, overwrite=overwrite)
        _remove_local_tree(Path(src))

    def remove_directory(self, kind: str) -> None:
        remove_directory(self.target, kind)

    def recover(self) -> None:
        recover(self.target)

    def recover_for_reading(self) -> None:
        check_settled(self.target)

    def intact_copies(self) -> list:
        return []  # a replace on object storage keeps no old copy

    def read_text(self, name: str) -> str:
        return read_text(self.target.child(name))

    def local_copy(self) -> contextlib.AbstractContextManager:
        return local_copy(self.target)
