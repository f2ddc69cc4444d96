"""A chunk's decoded size bounded before it is decoded: :func:`bounds_in`, :class:`ChunkBound`.

Zarr hands a chunk's bytes to its codec, and the codec allocates what the bytes say: a
gzip or zlib stream inflates to whatever it holds (1 GB of zeros fits in 1 MB), a zstd,
blosc or lz4 frame allocates the size written in its own header.  A store from elsewhere
can thus raise a worker's memory by gigabytes before zarr finds that the chunk does not
match its array.  The array's metadata says how many bytes a chunk decodes to (its shape
times the item size), so the store wrapper that reads chunks
(:func:`dfairpca.io.from_zarr`'s) checks each chunk's outermost codec against it
first: the header's declared size where the codec allocates from it, a count of the output
in bounded steps (discarded) where it streams.  A streaming codec is thus inflated twice
(once counted, once by zarr); the others cost a header read.  In a sharded array the bound
is of the chunks inside a shard, each checked in the bytes zarr fetched
(:meth:`dfairpca.io._shards.ShardLayout.spans`).
"""

from __future__ import annotations

import math
from typing import NamedTuple
import bz2
import lzma
import numpy as np
import zlib

# Deferred imports: numcodecs, zarr (heavy or optional) are imported in the functions that use them,
# so that importing this module stays light.

__all__ = ["ChunkBound", "bounds_in", "STREAMING", "HEADERS"]

#: codecs that inflate a stream without a declared size: counted in steps of this many bytes
STEP = 4 << 20
#: ids (numcodecs', zarr 3's) of codecs whose output is counted by decoding it in steps
STREAMING = frozenset({"gzip", "zlib", "bz2", "lzma"})
#: ids of codecs that allocate the size their own header declares
HEADERS = frozenset({"zstd", "blosc", "lz4"})
#: how much larger than the stored item size a chunk may be before a filter (an
#: array-to-array codec other than a transpose: a cast may widen 1-byte items to 16)
FILTER_WIDENING = 16


class ChunkBound(NamedTuple):
    """The most bytes a chunk of the array at ``path`` may decode to in its outermost
    compressor ``codec`` (a numcodecs id; its ``crc`` trailing checksum bytes come off
    first), and how its keys name chunks (for messages)."""

    path: str
    codec: str
    nbytes: int
    crc: int
    chunk_rows: int
    n_rows: int
    encoding: str  # "default" ("c/1/0") or "v2" ("1.0")
    separator: str
    #: the bound is of the chunks inside each shard (a stored object holds several)
    sharded: bool = False

    def check(self, key: str, data) -> tuple[str, str] | None:
        """(where, reason) if the chunk ``key``, stored as the bytes ``data``, decodes to
        more than :attr:`nbytes`; None if not, or if that cannot be told without decoding
        it for real (a damaged stream: zarr's own decoding says so, bounded the same way)."""
        reason = self.excess(data)
        return None if reason is None else (self.where(key), reason)

    def excess(self, data) -> str | None:
        """Why the one chunk stored as ``data`` decodes past :attr:`nbytes`, or None."""
        raw = memoryview(data).cast("B")
        if self.crc:
            raw = raw[: max(0, len(raw) - self.crc)]
        size = _decoded_size(self.codec, raw, self.nbytes)
        if size is None or size <= self.nbytes:
            return None
        said = f"more than {self.nbytes:,}" if self.codec in STREAMING else f"{size:,}"
        return (f"its {self.codec} data decodes to {said} bytes, where a chunk of this array "
                f"holds {self.nbytes:,}")

    def where(self, key: str) -> str:
        """"chunk 'KEY' (rows a-b)", the rows where the key can be read."""
        prefix = f"{self.path}/" if self.path else ""
        name = key[len(prefix):] if key.startswith(prefix) else key
        if self.encoding == "default":
            parts = name[2:].split(self.separator) if name.startswith("c") else []
        else:
            parts = name.split(self.separator)
        try:
            first = int(parts[0]) * self.chunk_rows
        except (ValueError, IndexError):
            return f"chunk {key!r}"
        last = min(first + self.chunk_rows, self.n_rows) - 1
        return f"chunk {key!r} (rows {first}-{last})"


def bounds_in(path: str, key: str, meta: dict) -> dict[str, ChunkBound]:
    """Bounds of the arrays the metadata document ``key`` ("zarr.json" or ".zarray") of
    the node at ``path`` describes: itself, or the members a group's consolidated metadata
    lists.  An array whose chunks are not compressed by a codec checked here (or whose item
    size varies) has none; a sharded one's is of the chunks inside its shards (sharding
    alone as its codecs: else none)."""
    nodes = {path: meta}
    consolidated = meta.get("consolidated_metadata") if meta.get("node_type") == "group" else None
    if isinstance(consolidated, dict):
        for name, member in (consolidated.get("metadata") or {}).items():
            nodes[f"{path}/{name}" if path else name] = member
    out = {}
    for node_path, node in nodes.items():
        try:
            bound = _bound(node_path, key, node)
        except (ValueError, KeyError, TypeError, IndexError, AttributeError):
            bound = None  # zarr refuses such metadata itself (see _metadata)
        if bound is not None:
            out[node_path] = bound
    return out


def _bound(path: str, key: str, meta) -> ChunkBound | None:
    if not isinstance(meta, dict):
        return None
    if key == ".zarray" or meta.get("zarr_format") == 2:
        chunks, widen = meta["chunks"], bool(meta.get("filters"))
        compressor = meta.get("compressor")
        if not isinstance(compressor, dict):
            return None
        codec, crc = compressor.get("id"), 0
        encoding, separator = "v2", meta.get("dimension_separator") or "."
        itemsize, sharded = _itemsize(2, meta), False
    else:
        if meta.get("node_type") != "array":
            return None
        chunks = meta["chunk_grid"]["configuration"]["chunk_shape"]
        codecs = [_named(c) for c in meta.get("codecs", [])]
        names = [n for n, _ in codecs]
        sharded = names == ["sharding_indexed"]
        if sharded:  # the chunks inside a shard, with their own codecs
            chunks = codecs[0][1]["chunk_shape"]
            codecs = [_named(c) for c in codecs[0][1].get("codecs", [])]
            names = [n for n, _ in codecs]
        if "sharding_indexed" in names or "bytes" not in names:
            return None  # nested sharding; no bytes codec: variable-length items
        at = names.index("bytes")
        widen = any(n != "transpose" for n in names[:at])
        outer = [n.removeprefix("numcodecs.") for n in names[at + 1:]]
        crc = 0
        while outer and outer[-1] == "crc32c":
            outer.pop()
            crc += 4
        if not outer:
            return None
        codec = outer[-1]
        if len(outer) > 1:  # an inner compressor's output is near its input's size
            widen = True
        key_encoding = _named(meta.get("chunk_key_encoding", {"name": "default"}))
        encoding = key_encoding[0]
        separator = key_encoding[1].get("separator", "/" if encoding == "default" else ".")
        itemsize = _itemsize(3, meta)
    if codec not in STREAMING | HEADERS or itemsize is None:
        return None
    nbytes = math.prod(chunks) * itemsize
    if widen:
        nbytes = nbytes * FILTER_WIDENING + 65536
    shape = meta["shape"]
    return ChunkBound(path, codec, nbytes, crc, chunks[0] if chunks else 1,
                      shape[0] if shape else 1, encoding, separator,
                      sharded=sharded)


def _itemsize(version: int, meta: dict) -> int | None:
    """Bytes per item of the array ``meta`` describes, or None where items vary in size."""
    if version == 2:
        from zarr.core.metadata.v2 import ArrayV2Metadata as Meta
    else:
        from zarr.core.metadata.v3 import ArrayV3Metadata as Meta  # type: ignore[assignment]
    native = Meta.from_dict(dict(meta)).dtype.to_native_dtype()
    if native.hasobject or native.kind not in "biufcmMSUV" or native.itemsize == 0:
        return None
    return int(native.itemsize)


def _named(entry) -> tuple[str, dict]:
    """(name, configuration) of a zarr.json entry written as a name or as a dict."""
    if isinstance(entry, str):
        return entry, {}
    return entry.get("name", ""), entry.get("configuration") or {}


def _decoded_size(codec: str, raw: memoryview, limit: int) -> int | None:
    """What ``raw`` decodes to in ``codec``: the size its header declares, or (streaming
    codecs) a count past ``limit``; None where it is within ``limit`` or cannot be told."""
    if codec in STREAMING:
        return _streamed(codec, raw, limit)
    if codec == "blosc":
        # blosc 1 header: version, versionlz, flags, typesize, then nbytes (uint32 LE)
        return int.from_bytes(raw[4:8], "little") if len(raw) >= 16 else None
    if codec == "lz4":
        # numcodecs' LZ4 prefixes the uncompressed size (int32 LE) and allocates it
        return int.from_bytes(raw[:4], "little", signed=True) if len(raw) >= 4 else None
    return _zstd_size(raw, limit)


def _streamed(codec: str, raw: memoryview, limit: int) -> int | None:
    """The bytes ``raw`` inflates to in ``codec``, counted in steps of :data:`STEP` and
    discarded, stopped past ``limit``; every member of a multi-member gzip stream counted
    (numcodecs' GZip reads them all).  None where the stream is damaged within the limit:
    zarr's own decoding says so."""
    total, rest = 0, bytes(raw)
    try:
        while rest and total <= limit:
            eof, rest, total = (_inflated if codec in ("gzip", "zlib") else _unpacked)(
                codec, rest, total, limit)
            if total > limit or not eof or codec != "gzip":
                break
    except (zlib.error, OSError, EOFError, lzma.LZMAError, ValueError):
        pass  # a damaged stream (or padding after the last gzip member)
    return total if total > limit else None


def _inflated(codec: str, data: bytes, total: int, limit: int) -> tuple[bool, bytes, int]:
    """One zlib or gzip member of ``data`` counted onto ``total`` (stopped past ``limit``):
    whether it ended, the bytes after it, the new total."""
    d = zlib.decompressobj(16 + zlib.MAX_WBITS if codec == "gzip" else zlib.MAX_WBITS)
    buf = data
    while total <= limit:
        out = d.decompress(buf, STEP)
        total += len(out)
        buf = d.unconsumed_tail
        if d.eof or not out:
            break
    return d.eof, d.unused_data, total


def _unpacked(codec: str, data: bytes, total: int, limit: int) -> tuple[bool, bytes, int]:
    """The bz2 or lzma stream ``data`` counted onto ``total``, as :func:`_inflated`."""
    d = bz2.BZ2Decompressor() if codec == "bz2" else lzma.LZMADecompressor()
    total += len(d.decompress(data, STEP))
    while not d.eof and not d.needs_input and total <= limit:
        total += len(d.decompress(b"", STEP))
    return d.eof, d.unused_data, total


#: zstd's frame magic numbers (a frame; skippable frames take 16 values)
_ZSTD, _SKIPPABLE = 0xFD2FB528, 0x184D2A50


def _zstd_size(raw: memoryview, limit: int) -> int | None:
    """The total content size the zstd frames of ``raw`` declare, or, where a frame does
    not declare one, the size found by decoding into a buffer of ``limit`` bytes (numcodecs
    then decodes in a stream without a bound); None where the frames cannot be read."""
    total, pos, n = 0, 0, len(raw)
    while pos < n:
        if n - pos < 8:
            return None
        magic = int.from_bytes(raw[pos:pos + 4], "little")
        if magic & 0xFFFFFFF0 == _SKIPPABLE:
            pos += 8 + int.from_bytes(raw[pos + 4:pos + 8], "little")
            continue
        if magic != _ZSTD:
            return None
        descriptor = raw[pos + 4]
        fcs_flag, single, checksum, dict_flag = descriptor >> 6, descriptor >> 5 & 1, \
            descriptor >> 2 & 1, descriptor & 3
        at = pos + 5 + (0 if single else 1) + (0, 1, 2, 4)[dict_flag]
        width = (1 if single else 0, 2, 4, 8)[fcs_flag]
        if width == 0:
            return _zstd_bounded(raw, limit)
        size = int.from_bytes(raw[at:at + width], "little") + (256 if width == 2 else 0)
        total += size
        if total > limit:
            return total
        pos = at + width
        while True:  # the blocks: a 3-byte header (last, type, size), then its bytes
            if n - pos < 3:
                return None
            header = int.from_bytes(raw[pos:pos + 3], "little")
            last, kind, length = header & 1, header >> 1 & 3, header >> 3
            pos += 3 + (1 if kind == 1 else length)
            if last:
                break
        pos += 4 * checksum
    return total


def _zstd_bounded(raw: memoryview, limit: int) -> int | None:
    """The size ``raw`` (zstd frames without a declared size) decodes to, decoded into a
    buffer of ``limit`` bytes: past it, ``limit + 1``."""
    from numcodecs import Zstd  # type: ignore[import-untyped]

    try:
        return len(Zstd().decode(bytes(raw), out=np.empty(limit, dtype="u1")))
    except RuntimeError as exc:
        return limit + 1 if "too small" in str(exc) else None
