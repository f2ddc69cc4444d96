"""Remote stores: fsspec URLs (``s3://bucket/faces.zarr``, ``gs://...``, any fsspec protocol).

A path with a protocol is opened with fsspec and the ``storage_options`` given, else what
the file system finds itself (for S3: AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY,
AWS_ENDPOINT_URL, ~/.aws, fsspec's configuration).  The options travel with the Zarr
arrays in the task graph, so workers reach the same endpoint with the same credentials.
An fsspec mapper (``fsspec.get_mapper(url, **storage_options)``) is taken as the URL
together with its options.

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
import os
import re
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from collections.abc import Iterable, Mapping
from typing import Any

from ._files import capped
from ._marker import (
    ACTIVE, MARKER, MARKER_KEY, OutputPathError, apart, foreign_files, kept, marker, marker_attributes, not_ours,
    refusal, running, sibling_name, sibling_pattern, warn_kept, zarr_foreign, zarr_layout,
)
from ..errors import AccessError, InvalidInputError, PathNotFoundError, UnreachableError

__all__ = [
    "is_remote", "local_path", "Location", "location", "explained", "zarr_store", "store_url", "read_marker",
    "write_marker", "foreign_entries", "foreign", "check_target", "atomic_prefix", "publish",
    "move_into_place", "remove_directory", "recover", "check_settled", "local_copy",
    "read_text", "exists", "open_zarr", "zarr_arrays", "zarr_roots",
]

_PROTOCOL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")

#: what a write must stay apart from: ``{"the input store": path}`` or ``(what, path)`` pairs
Protected = Mapping[str, Any] | Iterable[tuple[str, Any]] | None

#: the objects that mark a prefix as dfairpca's: copied last, deleted last
_MARKERS = (MARKER, "zarr.json")


def is_remote(path) -> bool:
    """Whether ``path`` is an fsspec URL (not ``file://``) or an fsspec mapper.

    Parameters
    ----------
    path : str, path-like, Location or fsspec mapper
        A local path, a URL (``s3://bucket/x``) or what :func:`location` returns.

    Returns
    -------
    bool
        True for a URL with a protocol other than ``file://``, a :class:`Location` or a
        mapper; False for a local path.
    """
    if isinstance(path, str):
        return bool(_PROTOCOL.match(path)) and not path.startswith("file://")
    return isinstance(path, Location) or (hasattr(path, "fs") and hasattr(path, "root"))


def local_path(path) -> Path:
    """A local path given as a path or a ``file://`` URL.

    Parameters
    ----------
    path : str or path-like
        A path, or a ``file://`` URL.

    Returns
    -------
    pathlib.Path
        The path, without the ``file://`` prefix.
    """
    text = os.fspath(path)
    return Path(text[len("file://"):] if text.startswith("file://") else text)


@dataclass(frozen=True)
class Location:
    """A prefix of a remote file system: the fs, its path (no protocol) and the options
    it was made with (for zarr, which makes its own)."""

    fs: Any  # an fsspec AbstractFileSystem (fsspec ships no type information)
    path: str
    options: dict = field(default_factory=dict, compare=False)

    @property
    def url(self) -> str:
        return self.fs.unstrip_protocol(self.path)

    @property
    def name(self) -> str:
        return self.path.rstrip("/").rsplit("/", 1)[-1]

    @property
    def parent(self) -> "Location":
        return Location(self.fs, self.path.rstrip("/").rpartition("/")[0], self.options)

    def child(self, name: str) -> "Location":
        """The location of ``name`` inside this prefix.

        Parameters
        ----------
        name : str
            A relative path ("/"-separated).

        Returns
        -------
        Location
            ``path/name`` on the same file system, with the same options.
        """
        return Location(self.fs, f"{self.path}/{name}", self.options)

    def __str__(self) -> str:
        return self.url


def location(path, storage_options: dict | None = None) -> Location:
    """The :class:`Location` of a URL (with ``storage_options``) or of an fsspec mapper.

    Parameters
    ----------
    path : str, Location or fsspec mapper
        A URL (``s3://bucket/prefix``); a mapper carries its own file system and options.
    storage_options : dict, optional
        Options of the URL's file system (credentials, ``endpoint_url``); default: what
        the environment gives (for S3 the AWS_* variables).

    Returns
    -------
    Location
        The file system, the path without protocol, and the options, which travel with it
        to every read and write.

    Raises
    ------
    dfairpca.errors.InvalidInputError
        A protocol whose fsspec package is not installed, or options the file system
        cannot be made from.
    """
    if isinstance(path, Location):
        return path
    if not isinstance(path, str):  # an fsspec mapper carries its file system
        return Location(path.fs, path.root.rstrip("/"), dict(path.fs.storage_options))
    from fsspec.core import url_to_fs

    options = _with_environment(path, dict(storage_options or {}))
    try:
        fs, root = url_to_fs(path, **options)
    except ImportError as exc:  # a missing package is the user's to install: one line
        raise InvalidInputError(
            f"{path} needs a package that is not installed ({exc}): pip install "
            "'dfairpca[remote]' for s3://, or the fsspec package of that protocol"
        ) from None
    except (ValueError, TypeError) as exc:
        raise InvalidInputError(f"cannot open {path!r}: {exc}; check the URL and its storage options") from None
    return Location(fs, root.rstrip("/"), options)


def on_disk(path) -> Path | None:
    """The local path that ``path`` names (a path, a ``file://`` or ``local://`` URL, any
    URL of fsspec's local file system), or None for a remote one."""
    if not is_remote(path):
        return local_path(path)
    loc = location(path)
    return Path(loc.path) if "file" in _protocols(loc.fs) or "local" in _protocols(loc.fs) else None


def normalised(path) -> str:
    """One spelling of the place ``path`` names (``s3a://b/x/`` and ``s3://b/x`` alike; a
    local path as its absolute ``file://`` URL), to compare two places."""
    disk = on_disk(path)
    if disk is not None:
        return "file://" + os.path.realpath(disk)
    return location(path).url


#: storage options of s3:// taken from the client's environment when not given, so that
#: they travel to the workers with the graph (a worker's own environment may lack them)
_S3_ENVIRONMENT = {"endpoint_url": "AWS_ENDPOINT_URL", "key": "AWS_ACCESS_KEY_ID",
                   "secret": "AWS_SECRET_ACCESS_KEY", "token": "AWS_SESSION_TOKEN"}


def _with_environment(url: str, options: dict) -> dict:
    """``options`` of an s3:// URL completed from the usual AWS environment variables:
    the endpoint unless one is given, the credentials unless any are (or anon/profile)."""
    if not url.startswith(("s3://", "s3a://")):
        return options
    found = {k: os.environ[v] for k, v in _S3_ENVIRONMENT.items() if os.environ.get(v)}
    if "endpoint_url" in found and "endpoint_url" not in options and \
            "endpoint_url" not in options.get("client_kwargs", {}):
        options["endpoint_url"] = found["endpoint_url"]
    if not {"key", "secret", "token", "anon", "profile", "username", "password"} & set(options) \
            and "key" in found and "secret" in found:
        options.update({k: found[k] for k in ("key", "secret", "token") if k in found})
    return options


def explained(exc: BaseException, url: str, options: dict | None = None) -> BaseException:
    """``exc`` from a request about ``url`` (made with the storage ``options``) as a
    one-line error that names the fix (or ``exc`` itself when it is none of the storage's
    usual refusals)."""
    names = {c.__name__ for c in type(exc).__mro__}
    text = f"{exc}"
    short = (text.strip().splitlines() or [type(exc).__name__])[0][:160]
    options = options or {}
    endpoint = (options.get("endpoint_url") or (options.get("client_kwargs") or {}).get("endpoint_url")
                or (os.environ.get("AWS_ENDPOINT_URL") if url.startswith("s3") else None))
    if "NoCredentialsError" in names or "Unable to locate credentials" in text:
        return AccessError(
            f"no credentials for {url}: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or pass "
            "storage_options={'key': ..., 'secret': ...} (--storage-options on the command "
            "line), or {'anon': True} for a public bucket")
    unreachable = {"EndpointConnectionError", "ClientConnectorError", "ConnectTimeoutError",
                   "ConnectionClosedError", "ServerDisconnectedError", "ConnectionRefusedError"}
    if names & unreachable or isinstance(exc, (ConnectionError, TimeoutError)):
        return UnreachableError(
            f"cannot reach the storage of {url}{f' at {endpoint}' if endpoint else ''} ({short}): "
            "check the endpoint (storage_options endpoint_url, or AWS_ENDPOINT_URL) and that "
            "the server is up")
    if ("InvalidAccessKeyId" in text or "SignatureDoesNotMatch" in text or "AccessDenied" in text
            or isinstance(exc, PermissionError)):
        return AccessError(
            f"the storage refused access to {url} ({short}): check the credentials "
            "(AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, or key/secret in storage_options) and "
            "the bucket's permissions")
    if "NoSuchBucket" in text or "bucket does not exist" in text.lower():
        bucket = url.split("://", 1)[-1].split("/", 1)[0]
        return PathNotFoundError(f"no bucket {bucket!r} for {url}: create it, or correct the URL")
    botocore = any(c.__module__.startswith("botocore") for c in type(exc).__mro__)
    if (isinstance(exc, (TypeError, ValueError, AttributeError)) or botocore) and _making_the_client(exc):
        return InvalidInputError(
            # names only: the values may hold a secret
            f"the storage options ({', '.join(map(str, options)) or 'none'}) for {url} were refused when "
            f"the storage client was made from them ({type(exc).__name__}: {short}): check each "
            "name and value against the file system's parameters (for s3:// those of "
            "s3fs.S3FileSystem, e.g. {\"endpoint_url\": \"http://host:9000\", \"key\": \"...\", "
            "\"secret\": \"...\"}) in storage_options (--storage-options on the command line)")
    return exc


#: the functions in which an fsspec file system makes its client from the storage options
#: (s3fs's ``set_session``): an error raised there is the options', not the storage's
_CLIENT_MAKERS = {"set_session"}


def _making_the_client(exc: BaseException) -> bool:
    """Whether ``exc`` was raised while the file system made its client from the options."""
    import traceback

    return any(frame.f_code.co_name in _CLIENT_MAKERS for frame, _ in traceback.walk_tb(exc.__traceback__))


@contextlib.contextmanager
def _requests(where):
    """Requests to the storage of ``where`` (a :class:`Location`, or a URL) inside the block
    fail with :func:`explained` (once: an inner block's explanation is not explained again)."""
    url, options = (where.url, where.options) if isinstance(where, Location) else (where, None)
    try:
        yield
    except (OutputPathError, KeyboardInterrupt):
        raise
    except Exception as exc:
        better = exc if getattr(exc, "explained", False) else explained(exc, url, options)
        if better is exc:
            raise
        # an attribute, not a subclass: ``better`` keeps the class the caller catches
        better.explained = True  # type: ignore[attr-defined]
        raise better from None


def zarr_store(path, storage_options: dict | None = None):
    """What ``zarr.open*`` takes for ``path``: the path itself if local, else an
    FsspecStore made with the options (which then travel with it to the workers).

    Parameters
    ----------
    path : str, path-like or Location
        A local path or a URL.
    storage_options : dict, optional
        Options of a URL's file system (see :func:`location`).

    Returns
    -------
    str or zarr.storage.FsspecStore
        The absolute local path (a worker's working directory is not this process's), or
        the store of the URL.
    """
    if not is_remote(path):
        return os.path.abspath(path)  # a worker's working directory is not this process's
    from zarr.storage import FsspecStore

    loc = location(path, storage_options)
    return FsspecStore.from_url(loc.url, storage_options=loc.options or None)


def store_url(store) -> str | None:
    """The URL of a Zarr store on a remote file system (an FsspecStore), else None."""
    store = getattr(store, "_store", store)  # dfairpca's strict wrapper
    fs, path = getattr(store, "fs", None), getattr(store, "path", None)
    if fs is None or path is None or "file" in _protocols(fs):
        return None
    return fs.unstrip_protocol(path.rstrip("/"))


def _protocols(fs) -> tuple:
    p = fs.protocol
    return (p,) if isinstance(p, str) else tuple(p)


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
    with _requests(loc):
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
    with _requests(loc):
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


# ---------------------------------------------------------------------------- marker
def read_marker(loc: Location) -> dict | None:
    """dfairpca's marker of the prefix ``loc`` (its ``.dfairpca`` object, or a Zarr store's
    root attribute), or None if unmarked."""
    with _requests(loc):
        found = _read_json(loc.child(MARKER))
        if found is None:
            found = ((_read_json(loc.child("zarr.json")) or {}).get("attributes") or {}).get(MARKER_KEY)
    ok = isinstance(found, dict) and found.get("written_by") == "dfairpca"
    return found if ok else None


def write_marker(loc: Location, kind: str) -> None:
    """Mark ``loc`` as dfairpca's, as :func:`dfairpca.io._writes.write_marker` does: a Zarr
    store's root attribute, else the object."""
    with _requests(loc):
        meta = _read_json(loc.child("zarr.json"))
        if meta is not None:  # the attribute, as zarr's attrs.update would write it
            layout = zarr_layout(zarr_store(loc))
            meta.setdefault("attributes", {}).update(marker_attributes(kind, layout))
            _write_json(loc.child("zarr.json"), meta)
            _delete(loc, [MARKER] if _is_object(loc.child(MARKER)) else [])
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
    with _requests(loc):
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
    for what, other in (protect.items() if isinstance(protect, Mapping) else protect or ()):
        other_url, here = normalised(other), normalised(loc)  # s3a:// is s3://
        relation = ("is" if here == other_url else
                    "contains" if other_url.startswith(here + "/") else
                    "is inside" if here.startswith(other_url + "/") else None)
        apart(loc.url, relation, what, other_url)
    with _requests(loc):
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
    ACTIVE.add(tmp.name)
    try:
        yield tmp
    finally:
        with _requests(tmp):
            if _keys(tmp):
                _remove_tree(tmp)
        ACTIVE.discard(tmp.name)


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
        with _requests(loc):
            for f in files:
                tmp.fs.put_file(str(f), f"{tmp.path}/{f.relative_to(local).as_posix()}")
        move_into_place(tmp, loc, kind, overwrite=overwrite)


def move_into_place(src: Location, loc: Location, kind: str, *, overwrite: bool = False) -> None:
    """Move the finished, marked prefix ``src`` to ``loc``: copy, then delete, under a
    journal that lets :func:`recover` finish a move cut short between the two."""
    check_target(loc, kind, overwrite=overwrite, probe=False)
    journal = loc.parent.child(sibling_name(loc.name, "move"))
    ACTIVE.add(journal.name)
    try:
        with _requests(loc):
            state = {**marker(kind), "source": src.name, "copied": False}
            _write_json(journal, state)
            _finish_move(src, loc, journal, state)
    finally:
        ACTIVE.discard(journal.name)


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
    with _requests(loc):
        leftovers = [(m.group(1), parent.child(name)) for name in _names(parent)
                     if (m := pattern.fullmatch(name)) and not running(name, m.group(2), int(m.group(3)))]
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


def check_settled(loc: Location) -> None:
    """Raise unless ``loc`` can be read whole: no move into it is under way (a writer that
    is still running; a dead one's move is finished first by :func:`recover`)."""
    try:
        recover(loc)
    except PermissionError:  # a reader without write access: it can only wait
        pass
    pattern = sibling_pattern(loc.name, "move")
    with _requests(loc):
        busy = [name for name in _names(loc.parent) if pattern.fullmatch(name)]
    if busy:
        raise OutputPathError(
            f"{loc.url} is being written ({busy[0]} is the journal of its writer): read it "
            "when that job has finished")


def remove_directory(loc: Location, kind: str) -> None:
    """:func:`dfairpca.io._writes.remove_directory` for a URL."""
    with _requests(loc):
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
        with _requests(loc):
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


# ---------------------------------------------------------------------------- reading Zarr
def open_zarr(store, storage_options: dict | None = None):
    """The Zarr array or group at a local path or a URL, opened read-only.

    Parameters
    ----------
    store : str, path-like, Location or fsspec mapper
        Where the Zarr store is.
    storage_options : dict, optional
        Options of a URL's file system (see :func:`location`).

    Returns
    -------
    zarr.Array or zarr.Group
        The store's root node.

    Raises
    ------
    dfairpca.errors.PathNotFoundError
        Nothing is stored there.
    dfairpca.errors.InvalidInputError
        What is there is not a Zarr store (one line, naming the fix for a URL).
    """
    import zarr

    if not is_remote(store):
        path = local_path(store)
        if not path.exists():
            raise PathNotFoundError(f"no Zarr store at {str(path)!r}")
        try:  # absolute: a worker's working directory is not this process's
            return zarr.open(os.path.abspath(path), mode="r")
        except Exception as exc:  # zarr raises several types for "not a store"
            raise InvalidInputError(f"{str(path)!r} is not a Zarr store: {exc}") from exc
    loc = location(store, storage_options)
    with _requests(loc):
        if not _keys(loc):
            raise PathNotFoundError(f"no Zarr store at {loc.url} (nothing is stored there)")
        check_settled(loc)  # an overwrite cut short mid-copy holds old and new chunks
        try:
            return zarr.open(zarr_store(loc), mode="r")
        except (FileNotFoundError, KeyError, ValueError) as exc:  # objects, but no zarr.json
            raise InvalidInputError(f"{loc.url} is not a Zarr store: {exc}") from None


def close_sessions() -> None:
    """Close the HTTP sessions of this process's asynchronous s3fs file systems, those
    zarr opens for ``s3://`` stores, and forget them (a later read makes new ones).

    s3fs closes its synchronous file systems when they are collected, but never an
    asynchronous one: a worker process that read or wrote an S3 store would end with
    aiohttp's "Unclosed client session" on stderr.  Called on a local cluster's workers
    before they close (:func:`dfairpca.cluster.connect`).
    """
    s3fs = sys.modules.get("s3fs")
    if s3fs is None:  # never imported: no session to close
        return
    from zarr.core.sync import sync

    cache = s3fs.S3FileSystem._cache
    for key, fs in list(cache.items()):
        s3 = getattr(fs, "_s3", None)
        if not fs.asynchronous or s3 is None:
            continue
        del cache[key]
        fs._s3 = None
        try:  # on zarr's event loop, which made the session
            sync(s3.__aexit__(None, None, None), timeout=10)
        except Exception:  # a session that cannot close is left to the collector
            pass


def zarr_arrays(X) -> list:
    """The Zarr arrays a Dask array's graph reads (dask's from_array keeps the array)."""
    import zarr

    graph = X.__dask_graph__()
    found: dict[int, Any] = {}
    for layer in getattr(graph, "layers", {"": graph}).values():
        for node in layer.values():
            node = node if isinstance(node, zarr.Array) else getattr(node, "value", None)
            if isinstance(node, zarr.Array):
                found.setdefault(id(node), node)
    return list(found.values())


def zarr_roots(X) -> list:
    """The roots of the stores X's graph reads: local folders (Path) and URLs (str)."""
    roots = set()
    for array in zarr_arrays(X):
        root = getattr(getattr(array, "store", None), "root", None)
        roots.add(Path(root) if root is not None else store_url(array.store))
    roots.discard(None)
    return sorted(roots, key=str)
