"""What the write protocol is made of, wherever it writes: the marker, the names of a
write's temporary siblings, and the rules that refuse a target.

:mod:`dfairpca.io._local` applies them to local paths (renames), :mod:`dfairpca.io._fsspec` to
fsspec URLs (copies); both import them from here, so that one rule holds in both places.
"""

from __future__ import annotations

from ..errors import DfairpcaError, KeptFilesWarning
from ..base._version import __version__
from ..base._params import outside_stacklevel

import contextlib
import os
import re
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import NamedTuple
import warnings
import zarr

__all__ = [
    "MARKER", "MARKER_KEY", "OutputPathError", "marker", "marker_attributes", "known_entries",
    "foreign_files", "ZarrNode", "zarr_layout", "stored_chunks", "zarr_foreign_files", "zarr_foreign",
    "zarr_contents", "kept", "consolidate",
    "sibling_name", "sibling_pattern", "running", "ACTIVE", "refusal", "apart", "not_ours",
    "warn_kept", "LEASE_REFRESH_S", "LEASE_STALE_S", "leased", "lease_age", "expired", "this_host",
]

#: dfairpca's marker, :func:`marker` as JSON: the file ``.dfairpca`` in every directory it
#: writes; in a Zarr store the root group's attribute ``"dfairpca"`` instead (a file in a
#: store's root makes zarr warn "not recognized as a component" on every listing); in a single
#: file (a figure) the text its format keeps under the name ``"dfairpca"``.
MARKER = ".dfairpca"
MARKER_KEY = "dfairpca"

#: names of this process's own temporary siblings while a write is under way, so that
#: recovery inside this process tells them from the leftovers of an earlier failure
ACTIVE: set[str] = set()

#: top-level entries of each kind of directory, for markers written before they listed
#: their own ("entries"); a kind not here with such a marker has no entry known to be ours
_KNOWN_ENTRIES = {
    "model": {"model", "statistics", "arrays.npz", "meta.json"},
    "checkpoint": {"total", "progress.json"},
    "Moments": {"arrays.npz", "meta.json"},
    "estimator": {"arrays.npz", "meta.json"},
}

#: the top-level members of a Zarr store of each kind, for markers that do not record the
#: store's members (written before the store was finished, or by an older dfairpca): the
#: CelebA layout's arrays and a representation; a member of another name is a user's
_KNOWN_MEMBERS = {
    "store": {"images", "attributes", "partition", "representation"},
    "transform output": {"images", "attributes", "partition", "representation"},
}
#: members a store's layout gained, with the ``layout`` number of the markers written since
#: (:data:`STORE_LAYOUT`): in a store marked before, an array of that name is a user's
_LATER_MEMBERS = {2: {"attribute"}}  # the attribute names as a coordinate (xarray's sel)
#: the layout of the stores this version writes, recorded in every marker it writes
STORE_LAYOUT = 2


class OutputPathError(DfairpcaError, FileExistsError):
    """dfairpca refuses to write at a path: it would replace or delete what it did not write."""


def marker(kind: str, files=None) -> dict:
    """The content of dfairpca's marker for an object of ``kind`` ("model", "checkpoint", ...),
    with every file it wrote (``files``: paths relative to it, "/"-separated; what a replace
    may delete, and nothing else) and their top-level ``entries`` (for older readers).

    Parameters
    ----------
    kind : str
        What the object is.
    files : iterable of str, optional
        Every file dfairpca wrote there, relative to it and "/"-separated.

    Returns
    -------
    dict
        ``written_by``, ``kind``, ``version`` and, with ``files``, ``entries`` and ``files``.
    """
    found: dict = {"written_by": "dfairpca", "kind": kind, "version": __version__}
    if kind in _KNOWN_MEMBERS:
        found["layout"] = STORE_LAYOUT
    if files is None:
        return found
    files = sorted(f for f in files if f != MARKER)
    return {**found, "entries": sorted({f.split("/")[0] for f in files}), "files": files}


def foreign_files(files, found: dict) -> list[str]:
    """Of the files (relative, "/"-separated) under a directory whose marker is ``found``,
    those dfairpca did not write: not listed by the marker, at any depth (a marker older
    than that list: not under a top-level entry known to be ours)."""
    files = [f for f in files if f != MARKER]
    if isinstance(found.get("files"), list):
        ours = set(found["files"])
        folders = {"/".join(f.split("/")[:i]) for f in ours for i in range(1, f.count("/") + 1)}
        return sorted({_outermost(f, folders) for f in set(files) - ours})
    ours = known_entries(found)
    return sorted({f.split("/")[0] for f in files} - ours)


def _outermost(name: str, folders: set[str]) -> str:
    """The outermost folder of ``name`` that is none of dfairpca's ``folders`` (the whole
    folder is the user's), else ``name`` itself."""
    parts = name.split("/")
    for i in range(1, len(parts)):
        if "/".join(parts[:i]) not in folders:
            return "/".join(parts[:i])
    return name


class ZarrNode(NamedTuple):
    """A member of a Zarr store as its metadata describes it.

    ``grid``: None for a group; for an array, how many objects it stores along each
    dimension (shards where it is sharded, else chunks), whose keys its chunk key
    ``encoding`` ("default" or "v2") spells with ``separator``.  ``attributes``: the
    names of its attributes, sorted.
    """

    grid: tuple[int, ...] | None = None
    encoding: str = "default"
    separator: str = "/"
    zarr_format: int = 3
    attributes: tuple[str, ...] = ()


#: the metadata files of a node of each Zarr format (a v2 node has some of them)
_ZARR_METADATA = {3: ("zarr.json",), 2: (".zarray", ".zgroup", ".zattrs", ".zmetadata")}
#: a file zarr's local store is writing (``Path(key).with_suffix(".HEX.partial")``, renamed
#: to ``key`` when whole): a crash leaves it, and a resumed write then writes ``key`` anew
_ZARR_PARTIAL = re.compile(r"(.*)\.[0-9a-f]{32}\.partial")


def zarr_layout(store) -> dict[str, ZarrNode]:
    """Every member of the Zarr group at ``store`` (what ``zarr.open_group`` takes), at any
    depth, by its path relative to the root ("" for the root); {} if its metadata cannot be
    read (then nothing but the root's zarr.json is known to be ours), an error if the
    storage cannot be reached or refuses access."""
    try:
        with warnings.catch_warnings():  # a user's folder in a group makes zarr warn
            warnings.simplefilter("ignore")
            # the members on storage, not a consolidated copy of them that may be stale
            root = zarr.open_group(store, mode="r", use_consolidated=False)
            members = root.members(max_depth=None, use_consolidated_for_children=False)
            return {path: _zarr_node(member) for path, member in [("", root), *members]}
    except (ConnectionError, PermissionError, TimeoutError):
        raise  # the storage's refusal, said as such (not taken for a user's files)
    except Exception:
        return {}


def _zarr_node(member) -> ZarrNode:
    """The :class:`ZarrNode` of a zarr Group or Array."""
    meta = member.metadata
    attributes = tuple(sorted(str(name) for name in (meta.attributes or {})))
    if isinstance(member, zarr.Group):
        return ZarrNode(zarr_format=meta.zarr_format, attributes=attributes)
    if meta.zarr_format == 2:
        encoding, separator = "v2", meta.dimension_separator or "."
    else:
        encoding = meta.chunk_key_encoding.name
        separator = getattr(meta.chunk_key_encoding, "separator", "/")
    grid = tuple(-(-size // step) for size, step in zip(member.shape, stored_chunks(member)))
    return ZarrNode(grid, encoding, separator, meta.zarr_format, attributes)


def stored_chunks(array) -> tuple[int, ...]:
    """Shape of one object a Zarr array stores: the shard if sharded, else the chunk."""
    return tuple(getattr(array, "shards", None) or array.chunks)


def zarr_contents(layout: dict[str, ZarrNode]) -> dict[str, list[str]]:
    """What a store of ``layout`` (:func:`zarr_layout`) holds, as its marker records it when
    dfairpca has finished writing it: each member's path ("" for the root) and the names of
    its attributes (the marker's own aside)."""
    return {path: [a for a in node.attributes if not (path == "" and a == MARKER_KEY)]
            for path, node in sorted(layout.items())}


def zarr_foreign_files(files, layout: dict[str, ZarrNode], found: dict | None = None) -> list[str]:
    """Of the files (relative, "/"-separated) under a Zarr store of ``layout``
    (:func:`zarr_layout`) marked ``found``, the outermost paths dfairpca did not write
    (:func:`zarr_foreign`)."""
    return zarr_foreign(files, layout, found)[0]


def zarr_foreign(files, layout: dict[str, ZarrNode],
                 found: dict | None = None) -> tuple[list[str], dict[str, list[str]]]:
    """What under a Zarr store of ``layout`` (:func:`zarr_layout`), marked ``found``,
    dfairpca did not write: the outermost such paths of ``files`` (relative,
    "/"-separated), and for each metadata file among them the attributes it holds that
    dfairpca did not write.

    Ours: the metadata files of the root and of every member the marker records
    (:func:`zarr_contents`; a marker written before the store was finished records none:
    then every member of its kind's layout, :data:`_KNOWN_MEMBERS`, or any member of a kind
    without one), and in each such array's folder the keys its own chunk key encoding
    gives an index inside its grid; the root's :data:`MARKER` (a marker file the attribute
    replaced); what a crash of zarr's write of one of these left beside it.  Anything else
    (another member, another name, an index outside the grid, a key of another encoding or
    depth) is foreign, and so is the metadata file of one of ours that holds an attribute
    the marker does not record (replacing the store would drop it).
    """
    layout = {"": ZarrNode(), **layout}  # the root's zarr.json holds the marker
    recorded = (found or {}).get("members")
    if isinstance(recorded, dict):
        owned = {path: node for path, node in layout.items() if path in recorded}
    else:
        known = _KNOWN_MEMBERS.get(str((found or {}).get("kind")))
        layout_of = (found or {}).get("layout")
        if known is not None and isinstance(layout_of, int):
            known = known.union(*(names for v, names in _LATER_MEMBERS.items() if v <= layout_of))
        owned = {path: node for path, node in layout.items()
                 if known is None or path == "" or path.split("/")[0] in known}
    metadata = {path: [f"{path}/{name}".lstrip("/") for name in _ZARR_METADATA.get(node.zarr_format, ())]
                for path, node in owned.items()}
    ours = {MARKER} | {f for names in metadata.values() for f in names}
    arrays = {path: node for path, node in owned.items() if node.grid is not None}
    files = set(files)
    mine = {f for f in files if f in ours or _chunk_of(f, arrays)}
    leftovers = {f: m.group(1) for f in files - mine if (m := _ZARR_PARTIAL.fullmatch(f))}
    if leftovers:  # zarr's, of one of ours
        stems = {_without_suffix(f) for f in mine}
        mine |= {f for f, stem in leftovers.items() if stem in stems}
    folders = set(mine)  # an object store may hold "k" and "k/x": the user's is "k/x", not our "k"
    for f in mine:
        folder = f.rpartition("/")[0]
        while folder and folder not in folders:
            folders.add(folder)
            folder = folder.rpartition("/")[0]
    foreign = {_outermost(f, folders) for f in files - mine}
    attributes = {}
    if isinstance(recorded, dict):
        for path, node in owned.items():
            listed = recorded.get(path)
            added = sorted(set(node.attributes) - set(listed if isinstance(listed, list) else ())
                           - ({MARKER_KEY} if path == "" else set()))
            where = [f for f in metadata[path] if f in files]
            if added and where:
                attributes[where[0]] = added
    foreign |= set(attributes)
    return sorted(foreign), attributes


def _without_suffix(name: str) -> str:
    """``name`` without the suffix of its last part (``PurePosixPath.with_suffix("")``)."""
    folder, slash, last = name.rpartition("/")
    dot = last.rfind(".")
    return folder + slash + last[:dot] if 0 < dot < len(last) - 1 else name


def _chunk_of(name: str, arrays: dict[str, ZarrNode]) -> bool:
    """Whether ``name`` is the key of an in-grid object of the array whose folder holds it."""
    slash = name.find("/")
    while slash != -1:
        node = arrays.get(name[:slash])
        if node is not None:  # arrays hold no members: the first one found is the only one
            return _in_grid(name[slash + 1:], node)
        slash = name.find("/", slash + 1)
    return False


def _in_grid(key: str, node: ZarrNode) -> bool:
    """Whether ``key`` is what the array's encoding writes for an index inside its grid
    (``str`` of each int: no sign, no leading zero).

    Parsed here, not by zarr's ``decode_chunk_key``: zarr 3.1's "default" decoder misreads
    "c/3/0" (it drops the "c" but not the separator after it).
    """
    grid = node.grid or ()  # an array's (a group's None holds no chunks)
    ndim = len(grid)
    if node.encoding == "default":
        head, *parts = key.split(node.separator)
        if head != "c":
            return False
    elif node.encoding == "v2":
        parts = key.split(node.separator) if ndim else ([] if key == "0" else [key])
    else:  # an encoding we cannot read: none of its keys is known to be ours
        return False
    return len(parts) == ndim and all(
        p.isascii() and p.isdigit() and (p[0] != "0" or p == "0") and int(p) < n
        for p, n in zip(parts, grid))


def kept(name: str, foreign) -> bool:
    """Whether the file ``name`` is (or lies under) one of the ``foreign`` entries."""
    return any(name == f or name.startswith(f + "/") for f in foreign)


def marker_attributes(kind: str, layout: dict[str, ZarrNode] | None = None) -> dict:
    """Zarr group attributes that mark a store as written by dfairpca (see :data:`MARKER`);
    given the finished store's ``layout``, they record its members and their attributes
    (:func:`zarr_contents`): a member or attribute added later is a user's.

    Parameters
    ----------
    kind : str
        What the store is.
    layout : dict of str to ZarrNode, optional
        The finished store's members, by path.

    Returns
    -------
    dict
        ``{MARKER_KEY: marker}``, to set on the store's root group.
    """
    if layout is None:
        return {MARKER_KEY: marker(kind)}
    return {MARKER_KEY: {**marker(kind), "members": zarr_contents(layout)}}


def known_entries(found: dict) -> set[str]:
    """The top-level names a non-Zarr directory with marker ``found`` holds as its own."""
    if isinstance(found.get("entries"), list):
        return {e for e in found["entries"] if isinstance(e, str)}
    return _KNOWN_ENTRIES.get(str(found.get("kind")), set())


def this_host() -> str:
    """This host's name as a sibling's name carries it (:func:`sibling_name`)."""
    return re.sub(r"[^A-Za-z0-9]", "", socket.gethostname())[:32]


def sibling_name(name: str, role: str) -> str:
    """``.NAME.{role}-HOST-PID-RANDOM``: a write's temporary sibling of ``name``."""
    return f".{name}.{role}-{this_host()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def sibling_pattern(name: str, roles: str) -> re.Pattern:
    """What :func:`sibling_name` makes for ``name``, with ``roles`` a regex alternative
    ("old|tmp"); groups: role, host, pid."""
    return re.compile(rf"\.{re.escape(name)}\.({roles})-([A-Za-z0-9]*)-(\d+)-[0-9a-f]{{8}}")


#: how often a writer renews the lease of each temporary sibling it holds (the sibling's
#: modification time on a local or shared disk, a ``NAME.lease`` object beside it on object
#: storage).  A PID says nothing across hosts or PID namespaces (two containers on one
#: volume, hosts on one network file system); a lease does, wherever the reader runs.
LEASE_REFRESH_S = 5.0
#: a lease not renewed for this long is a dead writer's.  A reader on another NFS client
#: may see an mtime up to ``acregmax`` (60 s by default) old, plus the renewal interval,
#: plus the two hosts' clock skew: three minutes leave that twice over, and a loaded
#: machine or a paused VM room too, while a crash's leftovers are still cleared by the
#: first write three minutes later
LEASE_STALE_S = 180.0

#: renewals of this process's live leases, by sibling name (:func:`leased`)
_RENEWALS: dict[str, tuple[Callable[[], None], threading.Lock]] = {}  # name -> (renew, busy)
_RENEWING = threading.Lock()
_heartbeat: threading.Thread | None = None


def _forget_after_fork() -> None:
    """A forked child holds none of its parent's leases (renewing them would keep a
    crashed parent's temporaries alive) and starts its own heartbeat when it needs one."""
    global _RENEWING, _heartbeat
    _RENEWALS.clear()
    _RENEWING = threading.Lock()
    _heartbeat = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_after_fork)


def _renew_forever() -> None:
    """The heartbeat: renew every lease this process holds, every :data:`LEASE_REFRESH_S`."""
    while True:
        time.sleep(LEASE_REFRESH_S)
        with _RENEWING:
            renewals = list(_RENEWALS.items())
        for name, (renew, busy) in renewals:
            with busy:  # leased() ends only between renewals: none lands after it ended
                with _RENEWING:
                    if name not in _RENEWALS:
                        continue  # ended since the list was taken: its lease is gone
                try:
                    renew()
                except Exception:  # a sibling gone meanwhile, a transient store error: next time
                    pass


@contextlib.contextmanager
def leased(name: str, renew: Callable[[], None]) -> Iterator[None]:
    """Hold the lease of this process's temporary sibling ``name`` while the block runs:
    ``renew()`` (which marks the sibling as live now, where readers look) is called at once
    and then every :data:`LEASE_REFRESH_S` by one daemon thread per process; ``name`` is in
    :data:`ACTIVE` meanwhile (this process's own recovery never judges it by its lease)."""
    global _heartbeat
    ACTIVE.add(name)
    busy = threading.Lock()  # held by a renewal of this lease under way
    with _RENEWING:
        _RENEWALS[name] = (renew, busy)
        if _heartbeat is None or not _heartbeat.is_alive():
            _heartbeat = threading.Thread(target=_renew_forever, name="dfairpca-lease", daemon=True)
            _heartbeat.start()
    try:
        with contextlib.suppress(OSError):
            renew()  # the sibling may not exist yet: its creation is its first renewal
        yield
    finally:
        with busy, _RENEWING:  # after a renewal under way: the caller then removes the lease
            _RENEWALS.pop(name, None)
        ACTIVE.discard(name)


def running(name: str, host: str, pid: int, age: float | None, gone: bool = False) -> bool:
    """Whether the writer that made sibling ``name`` may still be running: not ``gone``
    (its holder's lock seen free on this host, :func:`dfairpca.io._locks.holder_gone`)
    and its lease renewed less than :data:`LEASE_STALE_S` ago (``age``, in seconds, from
    the sibling's modification time or its lease object; None when neither can be read).

    Only this process's own siblings are known for sure (:data:`ACTIVE`).  Judging others
    by PID would delete a live write whenever the writer's PID is not visible here (another
    PID namespace, another host of a shared file system); a sibling without a readable
    lease is left alone if it is a ``.tmp-`` one, and taken as a crash's if it is an
    ``.old-`` one (which exists only for the instant between two renames, made under a
    lock the caller checks) or a ``.move-`` journal.
    """
    if host == this_host() and pid == os.getpid():
        return name in ACTIVE
    if gone:
        return False
    if age is None:
        return ".tmp-" in name
    return not expired(age)


def expired(age: float) -> bool:
    """Whether a lease last renewed ``age`` seconds ago is a dead writer's."""
    return age >= LEASE_STALE_S


def lease_age(mtime: float) -> float:
    """Seconds since ``mtime`` (a POSIX time), for :func:`running`; a time in the future
    (clocks of two hosts apart) counts as now."""
    return max(0.0, time.time() - mtime)


def refusal(where: str, kind: str, found: dict | None, *, empty: bool, is_dir: bool,
            overwrite: bool, foreign=(), attributes: dict | None = None) -> OutputPathError | None:
    """Why dfairpca may not write a ``kind`` at the existing ``where`` (None: it may).

    ``found``: its marker; ``empty``: an empty directory; ``foreign``: the entries of
    dfairpca's own directory that dfairpca did not write (replacing it would delete them);
    ``attributes``: of those that are a Zarr member's metadata file, the attributes in it
    that dfairpca did not write.
    """
    if found is None and not empty:
        # a directory's marker is a file dfairpca always reads; a single file's is read by
        # the reader its format registered, which a process may not have imported
        what = ("a non-empty directory that dfairpca did not write (it has no "
                f"{MARKER} marker)") if is_dir else (
                "a file that dfairpca did not write, or whose marker this process cannot read "
                "(a format whose reader is registered by the code that writes it)")
        return OutputPathError(
            f"{where} is {what}, and dfairpca never replaces those: choose another path or "
            "remove it yourself"
        )
    if found is not None and found.get("kind") != kind:
        return OutputPathError(
            f"{where} holds a dfairpca {found.get('kind')}, not a {kind}: choose another "
            "path or remove it yourself"
        )
    if found is not None and not overwrite:
        return OutputPathError(
            f"{where} already exists (a dfairpca {kind}); pass overwrite=True (--overwrite "
            "on the command line) to replace it, or choose another path"
        )
    if foreign:
        named = [f"{f} (attributes {', '.join(map(repr, attributes[f]))})" if attributes and f in attributes
                 else f for f in foreign]
        listed = ", ".join(named[:5]) + (f" and {len(named) - 5} more" if len(named) > 5 else "")
        return OutputPathError(
            f"{where} is a dfairpca {kind} that also holds files dfairpca did not write "
            f"({listed}), which replacing it would delete: move your files out of it or "
            "choose another path"
        )
    return None


def apart(where: str, relation: str | None, what: str, other: str) -> None:
    """Raise if ``where`` is (``relation`` "is"), contains ("contains") or is inside
    ("is inside") ``what`` at ``other``, something this job reads or writes; None: unrelated."""
    if relation is not None:
        raise OutputPathError(
            f"{where} {relation} {what} {other}, which this job reads or writes: choose another path"
        )


def not_ours(where: str, kind: str) -> OutputPathError:
    """The refusal to delete ``where``, which is not dfairpca's ``kind``."""
    return OutputPathError(
        f"{where} is not a {kind} written by dfairpca; it was left in place: remove it "
        "yourself if you no longer need it"
    )


def warn_kept(where: str, kind: str, foreign) -> None:
    """Say that deleting dfairpca's ``kind`` at ``where`` kept the user's ``foreign`` entries
    (to the first caller outside dfairpca)."""
    warnings.warn(f"removed dfairpca's {kind} from {where} but kept the directory and what "
                  f"dfairpca did not write in it: {', '.join(foreign)}", KeptFilesWarning, stacklevel=outside_stacklevel())


def consolidate(store) -> None:
    """Write the consolidated metadata of the Zarr group at ``store`` (a path or a zarr
    store), last, once the group is complete and marked: readers such as xarray's
    ``open_zarr`` then open it from one document, without their "Failed to open Zarr store
    with consolidated metadata" warning.  zarr's own warning that consolidated metadata is
    not yet part of the Zarr 3 specification is silenced: xarray and zarr read it, and a
    reader that does not simply ignores the extra field."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Consolidated metadata is currently not part")
        zarr.consolidate_metadata(store)
