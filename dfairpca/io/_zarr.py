"""Reading Zarr stores as Dask arrays, every chunk checked: a chunk absent from its store or
one that cannot be decoded is an error naming it, never fill values (:func:`from_zarr`).
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any
import itertools
import warnings

import numpy as np
import zarr
from zarr.core.sync import sync

from ._marker import stored_chunks as _store_chunks
from ._metadata import METADATA_NAMES, check_member_path, checked_store_class
from ._remote import StoreTimeout, answered, store_timeout, task_store_timeout, zarr_roots
from ._urls import explained, is_remote, store_url
from ._where import open_zarr
from ..base._system import rows_per_block
from ..base._typing import PathInput
from ..errors import InvalidInputError, NotFoundError

# Deferred imports: dask (heavy or optional) and package modules that load such libraries, or this
# module, at import are imported in the functions that use them, so that importing this module stays
# light.

if TYPE_CHECKING:
    import dask.array
    import zarr

__all__ = ["from_zarr", "local_zarr_roots", "MissingChunkError", "CorruptChunkError", "strict_array",
           "strict_group", "read_checked", "check_written", "LISTING_LIMIT"]


def from_zarr(store: PathInput | zarr.Array | zarr.Group, component: str | None = None, *,
              rows_per_chunk: int | None = None, storage_options: dict | None = None,
              missing_chunks: str = "error") -> dask.array.Array:
    """Open a Zarr array lazily as a Dask array chunked along rows only.

    Parameters
    ----------
    store : str, Path, zarr.Array or zarr.Group
        A Zarr array, or a group together with ``component``.  A zarr object is reopened
        read-only on its own store, its metadata checked as a path's is.
    component : str, optional
        Name of the array inside the group (e.g. ``"images"``).
    rows_per_chunk : int, optional
        Rows per Dask chunk; default: the store's own chunking along the first axis,
        merged up to roughly 64 MiB per chunk.
    storage_options : dict, optional
        For a URL (``s3://``, ``gs://``, any fsspec protocol): options of the file system,
        e.g. ``{"anon": True}``; the package (s3fs, gcsfs, ...) must be installed on the
        client and on every worker.
    missing_chunks : {"error", "fill"}, default "error"
        What a chunk absent from the store means.  Zarr reads one as the array's fill value,
        which is how some writers store constant chunks but also what a lost or half-copied
        store looks like; dfairpca's own stores hold every chunk.  "error": refuse it (a
        :class:`MissingChunkError` naming the chunk and its rows, here if the store can be
        listed cheaply, else when the chunk is read); "fill": read it as zarr does.  In a
        sharded array a chunk its shard's index marks as never written is absent too (found
        when the shard is read, from the bytes zarr reads anyway), and a shard of zero bytes
        is corrupt; "error" refuses, as a ValueError here, an array whose shards it cannot
        check that way (a codec besides sharding, an index not stored as bytes and crc32c).
        Either way, a local store that a Dask worker does not find at that path (it does
        not share this machine's files) is :class:`dfairpca.cluster.NotShared`, never
        fill values.

    Returns
    -------
    dask.array.Array
        Lazy; workers read the chunks themselves (the graph holds the store, not data).
        A chunk that cannot be decoded raises :class:`CorruptChunkError` naming it.
    """
    import dask.array as da
    from dask.base import tokenize

    if missing_chunks not in ("error", "fill"):
        raise InvalidInputError(f"missing_chunks must be 'error' or 'fill', got {missing_chunks!r}")
    node: Any = store  # a zarr Array or Group once opened
    if is_remote(store) or isinstance(store, (str, os.PathLike)):
        node = open_zarr(store, storage_options)
    elif isinstance(node, zarr.Group):
        # reopened on a store that checks its members' metadata as a path's (zarr parsed
        # the caller's node unchecked: its members' are read here for the first time)
        node = strict_group(node)
    elif isinstance(node, zarr.Array):
        node = strict_array(node, fill=missing_chunks == "fill")  # its zarr.json read checked
    if component is not None:
        check_member_path(component, _name(store))
    if isinstance(node, zarr.Group):
        names = sorted(name for name, _ in node.arrays())
        if component is None:
            raise InvalidInputError(
                f"{_name(store)} is a Zarr group, not an array; name the array with "
                f"component=..., one of {names}"
            )
        if component not in names:
            raise NotFoundError(
                f"{_name(store)} has no array {component!r}; it holds {names or 'no arrays'}"
            )
        node = node[component]
    elif component is not None:
        raise InvalidInputError(f"{_name(store)} is a single array; drop component={component!r}")
    shape, chunks = node.shape, node.chunks
    if len(shape) < 2:
        raise InvalidInputError(f"{_name(store)} has shape {shape}; need (n, d) or (n, h, w)")
    row_bytes = int(np.prod(shape[1:])) * node.dtype.itemsize
    if rows_per_chunk is None:
        target = rows_per_block(row_bytes)
        rows_per_chunk = max(chunks[0], (target // chunks[0]) * chunks[0])
    node = strict_array(node, fill=missing_chunks == "fill")
    if missing_chunks == "error":
        if (why := node.store.refusal(node.path)) is not None:
            raise _UncheckableShards(why)
        _check_chunks_present(node)
    chunks = (rows_per_chunk,) + tuple(shape[1:])
    # dask's from_zarr with our getter: the graph still holds the zarr.Array itself (the
    # checkpoint's fingerprint finds its source there), and every read is the checked one
    name = "from-zarr-" + tokenize(str(node.store_path), node.metadata.to_dict(), chunks,
                                   missing_chunks)
    return da.from_array(node, chunks=chunks, name=name, getitem=read_checked,
                         meta=np.empty((0,) * len(shape), node.dtype))


def local_zarr_roots(X: dask.array.Array) -> list[Path]:
    """Root folders of the local Zarr stores a Dask array's graph reads (to protect them).

    Parameters
    ----------
    X : dask.array.Array or any
        The input; anything else reads no store.

    Returns
    -------
    list of pathlib.Path
        The folders, each once; empty for remote stores and in-memory data.
    """
    return [root for root in zarr_roots(X) if isinstance(root, Path)]


def _name(store) -> str:
    return repr(str(store)) if isinstance(store, (str, os.PathLike)) else "the store"


# ---------------------------------------------------------------------------- whole chunks
class _ChunkError(InvalidInputError):
    """A stored object of a Zarr array that cannot be read as written: ``key`` is its store
    key; ``where`` names what inside it is wrong with its rows, and ``reason`` says how,
    when the store found that itself (a shard's index)."""

    def __init__(self, message: str, key: str | None = None, where: str | None = None,
                 reason: str | None = None):
        super().__init__(message)
        self.key, self.where, self.reason = key, where, reason

    def __reduce__(self):  # travels from a worker to the client intact
        return type(self), (self.args[0], self.key, self.where, self.reason)


class MissingChunkError(_ChunkError):
    """A chunk of a Zarr array is absent from its store (zarr would read fill values)."""


class CorruptChunkError(_ChunkError):
    """A chunk of a Zarr array is in its store but cannot be read or decoded."""


class _UncheckableShards(InvalidInputError):
    """Shards laid out so that dfairpca cannot tell a chunk never written (see
    :func:`dfairpca.io._shards.shard_layout`)."""



#: the most chunks of one array listed up front by :func:`from_zarr`, so that a lost chunk
#: fails the job before any work.  Listing costs about 0.15 ms a key on a local disk (1.4 s
#: for 10,000 here, 18 s for 200,000; object storage: one request per 1,000 keys); beyond
#: it a missing chunk is found when its read task runs, which costs no extra request.
LISTING_LIMIT = 10_000


def _strict_store_class():
    """The store wrapper, defined on first use: importing dfairpca does not import zarr."""
    global _StrictStore
    if _StrictStore is not None:
        return _StrictStore
    checked: Any = checked_store_class()

    class StrictStore(checked):
        """A checked store (:func:`dfairpca.io._metadata.checked_store`: metadata documents
        checked before zarr parses them) on which an absent chunk is an error instead of
        fill values (with ``fill``: fill values, as zarr reads it), and a local store that is
        not there at all, where a Dask worker reads it, is :class:`dfairpca.cluster.NotShared`.

        Zarr asks the store for every chunk it reads and fills the ones it gets None for;
        raising there costs no request and works on any store (local, fsspec, zip) in
        whichever process reads.  Metadata lookups may still find nothing.  Only an absent
        chunk costs a look for the store's metadata (a few ``stat`` calls, local stores
        only): a worker on a machine that does not share the store's folder finds none.  A
        shard is checked in the bytes zarr fetched (see :mod:`dfairpca.io._shards`), with the
        layout read from the array's zarr.json as zarr opened it through this store; with
        ``fill`` it is not (zarr reads a damaged shard's chunks as fill values).
        """

        def __init__(self, store, fill: bool = False, shards: dict | None = None,
                     bounds: dict | None = None):
            super().__init__(store)
            self.fill = fill
            self._shards = dict(shards or {})  # array path -> ShardLayout, or why not
            self._bounds = dict(bounds or {})  # array path -> ChunkBound

        def _with_store(self, store):  # zarr's read-only copy keeps what this one knows
            return type(self)(store, self.fill, self._shards, self._bounds)

        async def get(self, key, prototype, byte_range=None):
            name = key.rsplit("/", 1)[-1]
            if name in METADATA_NAMES:  # checked before zarr parses it (the checked store)
                value = await answered(self._store, super().get(key, prototype, byte_range), key)
                if name in ("zarr.json", ".zarray") and value is not None and byte_range is None:
                    self._learn(key[: -len(name)].rstrip("/"), name, value)
                return value
            value = await answered(self._store, self._store.get(key, prototype, byte_range), key)
            if value is not None and self._bounds:
                self._check_decoded(key, value, byte_range)  # either mode: fill is no defence
            if value is None:
                root = getattr(self._store, "root", None)
                if root is not None and not _metadata_along(root, key):
                    from ._shared import not_here

                    raise not_here(root, "the Zarr store")
                if not self.fill:
                    raise MissingChunkError(
                        f"chunk {key!r} is missing from the Zarr store {str(self._store)!r}; "
                        "restore it or rewrite the store", key)
            elif self._shards and not self.fill:
                self._check_shard(key, value, byte_range)
            return value

        def _learn(self, path: str, name: str, value) -> None:
            from ._decoded import bounds_in
            from ._shards import layouts_in

            try:
                meta = json.loads(value.to_bytes())
            except (ValueError, UnicodeDecodeError):
                return  # zarr refuses it itself
            if isinstance(meta, dict):
                if name == "zarr.json":
                    self._shards.update(layouts_in(path, meta))
                self._bounds.update(bounds_in(path, name, meta))

        def _check_decoded(self, key, value, byte_range) -> None:
            """Refuse a chunk whose codec would decode it to more bytes than a chunk of its
            array holds, before zarr decodes it (see :mod:`dfairpca.io._decoded`); in a
            sharded array, each chunk of the shard (or the part of it) zarr fetched."""
            from ._shards import ShardLayout

            bound = next((bound for path, bound in self._bounds.items()
                          if not path or key.startswith(path + "/")), None)
            if bound is None:
                return
            data = value.as_numpy_array()  # a view of the bytes zarr holds
            if not bound.sharded:
                found = bound.check(key, data) if byte_range is None else None
            else:
                layout = self._shards.get(bound.path)
                if not isinstance(layout, ShardLayout) or layout.coords(key) is None:
                    return
                found = next(((layout.where(key, inner, reason), reason)
                              for inner, start, stop in layout.spans(data, byte_range)
                              if (reason := bound.excess(data[start:stop])) is not None), None)
            if found is None:
                return
            where, reason = found
            raise CorruptChunkError(f"{where} of the Zarr store {str(self._store)!r} cannot be "
                                    f"read ({reason}); it is damaged: restore it or rewrite the "
                                    "store", key, where, reason)

        def _check_shard(self, key, value, byte_range) -> None:
            layout = next((layout for path, layout in self._shards.items()
                           if not path or key.startswith(path + "/")), None)
            if isinstance(layout, str):
                raise _UncheckableShards(layout)
            if layout is None or (damage := layout.check(key, value, byte_range)) is None:
                return
            error = MissingChunkError if damage.missing else CorruptChunkError
            raise error(f"{damage.where} of the Zarr store {str(self._store)!r} "
                        f"{'is missing' if damage.missing else 'is damaged'}: "
                        f"{damage.reason}; restore it or rewrite the store",
                        key, damage.where, damage.reason)

        def refusal(self, path: str) -> str | None:
            """Why the shards of the array at ``path`` cannot be checked, or None."""
            layout = self._shards.get(path)
            return layout if isinstance(layout, str) else None

        async def get_partial_values(self, prototype, key_ranges):
            return [await self.get(k, prototype, r) for k, r in key_ranges]

        async def _get_many(self, requests):
            for key, prototype, byte_range in requests:
                yield key, await self.get(key, prototype, byte_range)

        def __reduce__(self):  # a class made in a function pickles through a module function
            return _strict_store, (self._store, self.fill, self._shards, self._bounds)

    _StrictStore = StrictStore
    return StrictStore


_StrictStore: type | None = None


def _strict_store(store, fill: bool = False, shards: dict | None = None,
                  bounds: dict | None = None):
    """``store`` wrapped so that reading an absent chunk raises :class:`MissingChunkError`
    (with ``fill``: reads fill values), reading a local store that is not there raises
    :class:`dfairpca.cluster.NotShared`, and a chunk that would decode to more than its
    array's chunks hold raises :class:`CorruptChunkError`."""
    return _strict_store_class()(store, fill, shards, bounds)


def _metadata_along(root, key: str) -> bool:
    """Whether the local store at ``root`` holds a metadata file (of Zarr 3 or 2) in its
    root or any folder above the chunk ``key``: false where the store is not there at all."""
    parts = key.split("/")[:-1]
    folders = [os.path.join(os.fspath(root), *parts[:i]) for i in range(len(parts) + 1)]
    return any(os.path.exists(os.path.join(folder, name))
               for folder in folders for name in ("zarr.json", ".zarray", ".zgroup"))


def strict_array(array: zarr.Array, *, fill: bool = False) -> zarr.Array:
    """``array`` reopened on a store that refuses absent chunks (see :func:`from_zarr`);
    with ``fill``, one that reads them as fill values but refuses a store not there.

    Parameters
    ----------
    array : zarr.Array
        An array opened for reading.
    fill : bool
        Read absent chunks as fill values (a sparse store written that way) instead of
        refusing them.

    Returns
    -------
    zarr.Array
        The same array, read only, on the strict store.
    """
    store = _unwrapped(array, fill)
    if store is None:
        return array
    return zarr.open_array(store=_strict_store(store, fill), path=array.path, mode="r")


def _unwrapped(node, fill: bool):
    """The store under ``node``'s (an array's or a group's) strict store, or its own store
    where it has none; None where its strict store already reads absent chunks by ``fill``."""
    store = node.store
    if isinstance(store, _strict_store_class()):
        if store.fill == fill:
            return None
        store = store._store  # e.g. opened by open_zarr, which reads absent chunks as zarr does
    return store


def strict_group(group: zarr.Group) -> zarr.Group:
    """``group`` reopened so that every array read from it refuses absent chunks (and a
    local store not there, see :func:`strict_array`).

    Parameters
    ----------
    group : zarr.Group
        A group opened for reading.

    Returns
    -------
    zarr.Group
        The same group, read only, on the strict store.
    """
    store = _unwrapped(group, False)
    if store is None:
        return group
    return zarr.open_group(store=_strict_store(store), path=group.path, mode="r",
                           use_consolidated=False)  # the members as stored (see open_zarr)


def read_checked(array: zarr.Array, selection: Any, asarray: bool = True, lock: Any = None) -> Any:
    """``array[selection]`` (dask's getter), with a failed read named by its chunk and rows.

    An absent chunk (on a strict store) raises :class:`MissingChunkError`, an unreadable
    one :class:`CorruptChunkError`, a local store not there (where a Dask worker reads it)
    :class:`dfairpca.cluster.NotShared`: one line each instead of a codec traceback.  On a
    distributed worker, in a computation given a timeout (a fit's ``timeout=``), a remote
    store that leaves a request unanswered that long raises
    :class:`~dfairpca.errors.UnreachableError` naming its URL.

    Parameters
    ----------
    array : zarr.Array
        The array a Dask task reads.
    selection : tuple of slice
        The chunk's region.
    asarray : bool
        Convert the result to a numpy array, as dask's getter does.
    lock : lock, optional
        Held during the read, as dask's getter takes it.

    Returns
    -------
    ndarray
        The region's values.
    """
    # a remote store that stops answering ends the read within the computation's timeout
    # (a task annotation on a distributed worker; on a local scheduler the context the
    # computation runs in, see dfairpca.engine._compute), the chunk-by-chunk re-read
    # that names a failing chunk included: a store that fails, then freezes, would
    # otherwise hold each re-read through its file system's own retries
    seconds = task_store_timeout()  # else the one in force here (a local scheduler's)
    with store_timeout(seconds) if seconds is not None else contextlib.nullcontext():
        return _read_checked(array, selection, asarray, lock)


def _read_checked(array, selection, asarray: bool, lock):
    """:func:`read_checked` inside its store timeout."""
    from dask.array.core import getter

    try:
        return getter(array, selection, asarray=asarray, lock=lock)
    except StoreTimeout:
        raise  # one line already; reading each chunk again would wait as long again
    except MissingChunkError as exc:
        where = exc.where or _where(array, exc.key, next(
            (c for c in _chunk_coords(array, selection) if _chunk_key(array, c) == exc.key), None))
        raise MissingChunkError(_missing_message(array, [where]), exc.key, exc.where) from None
    except CorruptChunkError as exc:
        if exc.where is None:
            raise
        raise CorruptChunkError(_corrupt_message(array, exc.where, exc.reason), exc.key,
                                exc.where, exc.reason) from None
    except _UncheckableShards:
        raise
    except Exception as exc:
        from ._shared import NotShared

        if isinstance(exc, NotShared):  # the store is not there at all: said as it is
            raise
        if (url := store_url(array.store)) and (access := explained(exc, url)) is not exc:
            raise access from None  # a worker's credentials or endpoint, not the data
        found = _failing_chunk(array, selection)
        if found is None:  # every chunk reads on its own: not the data's fault
            raise
        key, coords, error = found
        if isinstance(error, _ChunkError) and error.where is not None:
            where = error.where
        else:
            where = _where(array, key, coords)
        if isinstance(error, MissingChunkError):
            raise MissingChunkError(_missing_message(array, [where]), key, error.where) from None
        if isinstance(error, CorruptChunkError) and error.reason is not None:
            reason = error.reason
        else:
            first = (str(error).strip().splitlines() or [""])[0][:200]
            reason = f"{type(error).__name__}: {first}"
        raise CorruptChunkError(_corrupt_message(array, where, reason), key, where, reason) from None


def _chunk_key(array, coords) -> str:
    """The store key of the stored object at grid position ``coords``."""
    key = array.metadata.encode_chunk_key(tuple(coords))
    return f"{array.path}/{key}" if array.path else key


def _chunk_coords(array, selection=()):
    """Grid positions of the stored objects a selection touches (all of an axis that is
    indexed by an array)."""
    if not isinstance(selection, tuple):
        selection = (selection,)
    selection = selection + (slice(None),) * (array.ndim - len(selection))
    ranges = []
    for sel, size, step in zip(selection, array.shape, _store_chunks(array)):
        if isinstance(sel, slice):
            start, stop, _ = sel.indices(size)
            ranges.append(range(start // step, max(start, stop - 1) // step + 1))
        elif isinstance(sel, (int, np.integer)):
            ranges.append(range(int(sel) % size // step, int(sel) % size // step + 1))
        else:
            ranges.append(range(-(-size // step)))
    return itertools.product(*ranges)


def _failing_chunk(array, selection):
    """(key, coords, exception) of the first stored object in ``selection`` that fails to
    read on its own, or None."""
    step = _store_chunks(array)
    for coords in _chunk_coords(array, selection):
        region = tuple(slice(c * s, (c + 1) * s) for c, s in zip(coords, step))
        try:
            array[region]
        except StoreTimeout:  # the store, not this chunk: said as it is
            raise
        except Exception as exc:  # noqa: BLE001 - reported, by chunk, to the caller
            return _chunk_key(array, coords), coords, exc
    return None


def _rows(array, coords) -> str:
    """'rows a-b' of the stored object at grid position ``coords``."""
    if coords is None:
        return "rows unknown"
    step = _store_chunks(array)[0]
    return f"rows {coords[0] * step}-{min((coords[0] + 1) * step, array.shape[0]) - 1}"


def _where(array, key, coords) -> str:
    """"chunk 'KEY' (rows a-b)": the stored object at grid position ``coords``."""
    return f"chunk {key!r} ({_rows(array, coords)})"


def _corrupt_message(array, where: str, reason: str | None) -> str:
    """One line naming the array, the damaged object and its rows, why, and the fix."""
    why = f" ({reason})" if reason else ""
    return (
        f"{where} of the Zarr array {str(array.store_path)!r} cannot be read{why}; "
        "it is truncated or damaged: restore it or rewrite the store"
    )


def _missing_message(array, missing) -> str:
    """One line naming the array, the first absent chunk and its rows, and the fixes;
    ``missing`` lists what :func:`_where` says of each."""
    more = len(missing) - 1
    return (
        f"the Zarr array {str(array.store_path)!r} is missing {missing[0]}"
        f"{f' and {more} more' if more else ''}; zarr would read "
        f"{'them' if more else 'it'} as fill values ({_plain(array.fill_value)}), which "
        "dfairpca refuses: restore the chunks or rewrite the store, or, if its writer leaves "
        "out constant chunks on purpose, open it with "
        "dfairpca.from_zarr(..., missing_chunks='fill')"
    )


def _plain(value):
    """A numpy scalar as the Python value it prints as (``0``, not ``np.uint8(0)``)."""
    return value.item() if isinstance(value, np.generic) else value


def _check_chunks_present(array) -> None:
    """Raise :class:`MissingChunkError` for absent chunks found by one listing of the store.

    Skipped (left to the read tasks) when the store cannot list or holds more than
    :data:`LISTING_LIMIT` chunks for this array.
    """
    if _chunk_count(array) > LISTING_LIMIT or not array.store.supports_listing:
        return
    missing = _absent_chunks(array)
    if missing:
        raise MissingChunkError(
            _missing_message(array, [_where(array, key, c) for key, c in missing]), missing[0][0])


def _chunk_count(array) -> int:
    """How many objects (chunks, or shards where sharded) ``array`` stores."""
    return int(np.prod([-(-s // c) for s, c in zip(array.shape, _store_chunks(array))]))


def _absent_chunks(array) -> list:
    """(key, coords) of every stored object of ``array`` absent from its store, by one
    listing of the store (which must support listing)."""
    if _chunk_count(array) == 0:
        return []
    prefix = f"{array.path}/" if array.path else ""

    async def _keys():
        return {k async for k in array.store.list_prefix(prefix)}

    present = sync(_keys())
    return [(key, c) for c in _chunk_coords(array) if (key := _chunk_key(array, c)) not in present]


def check_written(group: zarr.Group, shown: object, fix: str | None = None) -> None:
    """Raise :class:`dfairpca.cluster.NotShared` unless every array of the Zarr ``group``
    holds all its chunks, as this process sees the store.

    What this process checks after Dask workers wrote a store, before calling it written:
    a worker that does not share this machine's files writes its chunks on its own disk,
    and the store here would hold metadata only, read as fill values.  One listing of
    the store; nothing for a store that cannot list.

    Parameters
    ----------
    group : zarr.Group
        The store just written.
    shown : str or os.PathLike
        The path the user gave, named in the message.
    fix : str, optional
        What to do about it, said at the end of the message (default
        :data:`dfairpca.cluster.SHARE_FIX`).
    """
    from ._shared import SHARE_FIX, NotShared

    if not group.store.supports_listing:
        return
    with warnings.catch_warnings():  # a writer's own folder in the group (.done) makes zarr warn
        warnings.simplefilter("ignore")
        arrays = [group] if isinstance(group, zarr.Array) else [
            node for _, node in group.members(max_depth=None) if isinstance(node, zarr.Array)]
    absent = [(a, _absent_chunks(a)) for a in arrays]
    absent = [(a, missing) for a, missing in absent if missing]
    if absent:
        count = sum(len(missing) for _, missing in absent)
        total = sum(_chunk_count(a) for a in arrays)
        raise NotShared(
            f"{str(shown)!r} is not written: {count} of its {total} chunks (e.g. "
            f"{absent[0][1][0][0]!r}) are not in it, though the Dask workers wrote them: they "
            f"wrote them at that path on their own machines; {fix or SHARE_FIX}"
        )
