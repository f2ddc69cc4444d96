"""Shards of Zarr v3 arrays, checked for the damage zarr reads as fill values.

A shard (codec ``sharding_indexed``) is one stored object holding several chunks and an
index of where each lies, ``2**64 - 1`` twice for a chunk never written.  Zarr reads a
shard of zero bytes, and a chunk its index marks as never written, as the fill value
without a word: on a store that should hold every chunk that is data lost to an
interrupted copy or a full disk.  :class:`ShardLayout` checks the bytes zarr fetched for
itself (the whole shard, or its index before the chunks it needs), so the check costs no
request and no second read.

The index read here is the one zarr writes by default: uint64 offset and length pairs in
C order (codec ``bytes``), optionally followed by a CRC32C (codec ``crc32c``), at the end
or the start of the shard.  An array whose shards are laid out otherwise is refused by
the strict reader (:func:`shard_layout` says why) rather than trusted unchecked.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
from zarr.abc.store import RangeByteRequest, SuffixByteRequest
from ..errors import InvalidInputError

# Deferred imports: google_crc32c (heavy or optional) is imported in the functions that use them, so
# that importing this module stays light.

#: an index entry's offset and length for a chunk never written (the sharding spec)
EMPTY = 2**64 - 1


class Damage(NamedTuple):
    """What is wrong with one shard: ``missing`` (a chunk never written) or not (the shard
    itself is damaged), naming the stored object and its rows."""

    missing: bool
    where: str
    reason: str


class ShardLayout(NamedTuple):
    """How the shards of the array at ``path`` are laid out (the keys, the index)."""

    path: str
    shape: tuple[int, ...]
    shard: tuple[int, ...]
    chunk: tuple[int, ...]
    encoding: str  # chunk key encoding: "default" ("c/1/0") or "v2" ("1.0")
    separator: str
    big_endian: bool
    crc: bool
    index_at_start: bool

    @property
    def per_shard(self) -> tuple[int, ...]:
        return tuple(s // c for s, c in zip(self.shard, self.chunk))

    @property
    def index_size(self) -> int:
        return 16 * math.prod(self.per_shard) + 4 * self.crc

    def coords(self, key: str) -> tuple[int, ...] | None:
        """The shard grid position ``key`` names, or None if it is no shard of this array."""
        prefix = f"{self.path}/" if self.path else ""
        if not key.startswith(prefix):
            return None
        name = key[len(prefix):]
        if self.encoding == "default":
            if name != "c" and not name.startswith("c" + self.separator):
                return None
            parts = name[2:].split(self.separator) if len(name) > 1 else []
        else:
            parts = name.split(self.separator) if self.shape else []
        try:
            coords = tuple(int(p) for p in parts)
        except ValueError:
            return None
        return coords if len(coords) == len(self.shape) else None

    def check(self, key: str, value, byte_range) -> Damage | None:
        """What is wrong with the bytes ``value`` (a zarr Buffer) that the store gave for
        ``byte_range`` of shard ``key``; None if nothing, or if ``key`` is no shard of this
        array."""
        coords = self.coords(key)
        if coords is None:
            return None
        size, n = len(value), self.index_size
        index_read = self._index_read(byte_range)
        if byte_range is not None and not index_read:
            # a chunk zarr found in the index: fewer bytes than it spans is a cut shard
            if isinstance(byte_range, RangeByteRequest) and size < byte_range.end - byte_range.start:
                return self._damage(coords, None, f"it ends at byte {byte_range.start + size}, "
                                    f"inside a chunk that runs to byte {byte_range.end}")
            return None
        if size == 0:
            return self._damage(coords, None, f"it is 0 bytes, where a shard always holds "
                                f"its {n}-byte index")
        if size < n:
            return self._damage(coords, None, f"it is {size} bytes, shorter than its {n}-byte index")
        data = value.as_numpy_array()  # a view of the bytes zarr holds, not a copy
        entries = self._entries(data[:n] if self.index_at_start else data[size - n:])
        if entries is None:
            return None  # a CRC that does not match: zarr says so itself
        return self._entries_damage(coords, entries, None if index_read else size)

    def _index_read(self, byte_range) -> bool:
        """Whether ``byte_range`` is zarr's read of a shard's index alone."""
        n = self.index_size
        if self.index_at_start:
            return isinstance(byte_range, RangeByteRequest) and (byte_range.start, byte_range.end) == (0, n)
        return isinstance(byte_range, SuffixByteRequest) and byte_range.suffix == n

    def spans(self, data: np.ndarray, byte_range) -> list[tuple[tuple[int, ...] | None, int, int]]:
        """The chunks in the bytes ``data`` zarr read for ``byte_range`` of a shard, as
        (position in the shard, start, stop): every chunk its index places inside a whole
        shard, the one chunk of a range read (position unknown: None), none of an index read
        or of a shard whose index is damaged (:meth:`check` says so)."""
        if self._index_read(byte_range):
            return []
        size, n = len(data), self.index_size
        if byte_range is not None:
            return [(None, 0, size)]
        if size < n:
            return []
        entries = self._entries(data[:n] if self.index_at_start else data[size - n:])
        if entries is None:
            return []
        spans: list[tuple[tuple[int, ...] | None, int, int]] = []
        for inner in np.ndindex(*entries.shape[:-1]):
            start, length = (int(v) for v in entries[inner])
            if start != EMPTY and length != EMPTY and start + length <= size:
                spans.append((tuple(int(i) for i in inner), start, start + length))
        return spans

    def where(self, key: str, inner, reason: str) -> str:
        """"shard 'KEY' (rows a-b)", or its chunk ``inner``'s, for a message on ``reason``."""
        coords = self.coords(key)
        return key if coords is None else self._damage(coords, inner, reason).where

    def _entries(self, index: np.ndarray) -> np.ndarray | None:
        """The (offset, length) pairs of the index bytes ``index``, shaped like the chunks
        of a shard, or None if its CRC does not match."""
        body = index[:-4] if self.crc else index
        if self.crc:
            import google_crc32c  # zarr's own checksum, installed with it

            if int(index[-4:].view("<u4")[0]) != google_crc32c.value(body.tobytes()):
                return None
        return body.view(">u8" if self.big_endian else "<u8").reshape(self.per_shard + (2,))

    def _entries_damage(self, coords, entries, size: int | None) -> Damage | None:
        """The first chunk of the shard inside the array whose entry is not a plain
        (offset, length), within the shard's ``size`` bytes where known."""
        per_shard = entries.shape[:-1]
        offsets, lengths = entries[..., 0], entries[..., 1]
        # chunks of an edge shard past the array's end are never written
        inside = np.ones(per_shard, dtype=bool)
        for axis, (c, step, extent, total) in enumerate(zip(coords, self.chunk, self.shard, self.shape)):
            starts = c * extent + np.arange(per_shard[axis]) * step
            inside &= (starts < total).reshape([-1 if a == axis else 1 for a in range(len(per_shard))])
        unwritten = (offsets == EMPTY) & (lengths == EMPTY)
        if (found := np.argwhere(unwritten & inside)).size:
            return self._damage(coords, tuple(int(i) for i in found[0]),
                                "its index marks it as never written", missing=True)
        bad = (offsets == EMPTY) | (lengths == EMPTY) | (lengths == 0)
        if size is not None:
            low, high = (self.index_size, size) if self.index_at_start else (0, size - self.index_size)
            with np.errstate(over="ignore"):
                bad |= (offsets < low) | (offsets + lengths > high) | (offsets + lengths < offsets)
        if (found := np.argwhere(bad & ~unwritten & inside)).size:
            inner = tuple(int(i) for i in found[0])
            start, length = (int(v) for v in entries[inner])
            return self._damage(coords, inner, f"its index entry (offset {start}, length "
                                f"{length}) is no place in a shard of {size} bytes"
                                if size is not None else f"its index entry (offset {start}, "
                                f"length {length}) is no place in a shard")
        return None

    def _damage(self, coords, inner, reason: str, *, missing: bool = False) -> Damage:
        """``reason`` about shard ``coords`` (or its chunk ``inner``), named with its rows."""
        first = coords[0] * self.shard[0] if self.shape else 0
        count = self.shard[0] if self.shape else 1
        if inner is not None and self.shape:
            first, count = first + inner[0] * self.chunk[0], self.chunk[0]
        last = min(first + count, self.shape[0] if self.shape else 1) - 1
        key = self.key(coords)
        where = f"shard {key!r}" if inner is None else f"chunk {inner} of shard {key!r}"
        return Damage(missing, f"{where} (rows {first}-{last})", reason)

    def key(self, coords) -> str:
        prefix = f"{self.path}/" if self.path else ""
        if self.encoding == "default":
            return prefix + self.separator.join(["c", *map(str, coords)])
        return prefix + (self.separator.join(map(str, coords)) or "0")


def shard_layout(path: str, meta: dict) -> ShardLayout | None:
    """The :class:`ShardLayout` of the array at ``path`` whose zarr.json is ``meta``; None
    if it is not sharded (or not an array of Zarr v3).

    Raises ValueError naming the fix for shards whose index dfairpca cannot read.
    """
    if meta.get("node_type") != "array" or meta.get("zarr_format") != 3:
        return None
    codecs = [_named(c) for c in meta.get("codecs", [])]
    names = [name for name, _ in codecs]
    if "sharding_indexed" not in names:
        return None
    where = f"the Zarr array {path!r}" if path else "the Zarr array"
    fix = ("rewrite it with zarr's default sharding, or open it with "
           "dfairpca.from_zarr(..., missing_chunks='fill') to read it as zarr does, unchecked")
    if names != ["sharding_indexed"]:  # others transpose the chunk grid or encode the index
        raise InvalidInputError(f"dfairpca cannot check the shards of {where}: its codecs are "
                         f"{names}, sharding alone is checked; {fix}")
    config = codecs[0][1]
    index = [_named(c) for c in config.get("index_codecs", [])]
    if [n for n, _ in index] not in (["bytes"], ["bytes", "crc32c"]):
        raise InvalidInputError(f"dfairpca cannot check the shards of {where}: their index is stored "
                         f"with codecs {[n for n, _ in index]}, not bytes and crc32c; {fix}")
    grid = _named(meta.get("chunk_grid", {}))
    encoding, key_config = _named(meta.get("chunk_key_encoding", {"name": "default"}))
    if grid[0] != "regular" or encoding not in ("default", "v2"):
        raise InvalidInputError(f"dfairpca cannot check the shards of {where}: chunk grid {grid[0]!r}, "
                         f"chunk keys {encoding!r}; {fix}")
    return ShardLayout(
        path=path, shape=tuple(meta["shape"]), shard=tuple(grid[1]["chunk_shape"]),
        chunk=tuple(config["chunk_shape"]), encoding=encoding,
        separator=key_config.get("separator", "/" if encoding == "default" else "."),
        big_endian=index[0][1].get("endian", "little") == "big", crc=len(index) == 2,
        index_at_start=config.get("index_location", "end") == "start",
    )


def _named(entry) -> tuple[str, dict]:
    """(name, configuration) of a zarr.json entry written as a name or as a dict."""
    if isinstance(entry, str):
        return entry, {}
    return entry.get("name", ""), entry.get("configuration") or {}


def layouts_in(path: str, meta: dict) -> dict[str, ShardLayout | str]:
    """Layouts of the sharded arrays that the zarr.json of the node at ``path`` describes:
    itself, or the members a group's consolidated metadata lists.  An array whose shards
    cannot be checked maps to the reason (raised when it is read)."""
    nodes = {path: meta}
    consolidated = meta.get("consolidated_metadata") if meta.get("node_type") == "group" else None
    if isinstance(consolidated, dict):
        for name, member in (consolidated.get("metadata") or {}).items():
            nodes[f"{path}/{name}" if path else name] = member
    out: dict[str, ShardLayout | str] = {}
    for node_path, node in nodes.items():
        if not isinstance(node, dict):
            continue
        layout: ShardLayout | str | None
        try:
            layout = shard_layout(node_path, node)
        except (ValueError, KeyError, TypeError, IndexError) as exc:
            layout = str(exc) if isinstance(exc, ValueError) else (
                f"dfairpca cannot read the sharding of the Zarr array {node_path!r} ({exc!r})")
        if layout is not None:
            out[node_path] = layout
    return out
