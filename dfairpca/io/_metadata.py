"""Zarr metadata checked before zarr parses it: :func:`check_metadata`.

A store may come from anywhere, and zarr trusts its ``zarr.json`` (``.zarray``): a document
nested 100,000 deep ends in a RecursionError, a declared shape of 1e12 x 1e6 in a
MemoryError inside chunk arithmetic, a chunk shape with a 0 in a ZeroDivisionError, an
unknown data type or codec in zarr's own ValueError, each with a traceback.  Every
metadata document a store wrapper hands zarr (:func:`dfairpca.io._zarr.from_zarr`,
:func:`dfairpca.io.open_zarr`) passes here first: one line naming the document
and what is wrong, before any work.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import TypeGuard
from zarr.storage import WrapperStore

from ..errors import InvalidInputError
from ._files import MAX_JSON_BYTES

# Deferred imports: zarr (heavy or optional) is imported in the functions that use it, so that
# importing this module stays light.

__all__ = ["MalformedStoreError", "MAX_METADATA_BYTES", "MAX_CHUNKS", "METADATA_NAMES",
           "check_metadata", "check_size", "check_member_path", "checked_get", "checked_store",
           "checked_store_class"]

#: file names zarr looks up and legitimately finds absent (metadata of v2 and v3)
METADATA_NAMES = frozenset({"zarr.json", ".zarray", ".zattrs", ".zgroup", ".zmetadata"})

#: bytes of one metadata document read at most: an array's is a few hundred bytes, a
#: group's attributes (labels of thousands of groups, a marker listing every member) a few
#: hundred kB; the cap of dfairpca's own JSON files
MAX_METADATA_BYTES = MAX_JSON_BYTES
#: the most chunks (stored objects) an array may declare: a pass reads each with one task
#: and one request, so 2**30 of them (a thousand times the 20,000 chunks of a full-size
#: CelebA store in 1 MB chunks) would take days; a shape beyond that is a damaged or
#: hostile zarr.json, and chunk arithmetic over it runs out of memory
MAX_CHUNKS = 2**30


class MalformedStoreError(InvalidInputError):
    """A Zarr store whose metadata cannot describe an array dfairpca could read."""


def check_metadata(where: str, key: str, raw: bytes) -> None:
    """Raise :class:`MalformedStoreError` naming ``where`` (the document, for messages)
    unless ``raw``, the metadata document ``key`` ("zarr.json", ".zarray", ...), parses
    within :data:`MAX_METADATA_BYTES` and, for an array, declares a shape, a chunk grid
    of positive sizes with at most :data:`MAX_CHUNKS` chunks, and a data type and codecs
    zarr knows.

    Parameters
    ----------
    where : str
        The document's address, named in the error.
    key : str
        Its file name: "zarr.json" (Zarr 3), ".zarray", ".zgroup", ".zattrs" (Zarr 2).
    raw : bytes
        Its content.
    """
    check_size(where, len(raw))
    try:
        doc = json.loads(raw)
    except RecursionError:
        raise _bad(where, "its JSON is nested too deeply to be metadata") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise _bad(where, f"it is not JSON ({exc})") from None
    if key == ".zarray" or (key == "zarr.json" and isinstance(doc, dict)
                            and doc.get("node_type") == "array"):
        _check_array(where, key, doc)
    elif key != ".zattrs" and not isinstance(doc, dict):
        raise _bad(where, f"it holds a JSON {type(doc).__name__}, not an object")


def check_size(where: str, size: int) -> None:
    """Refuse a metadata document of ``size`` bytes over :data:`MAX_METADATA_BYTES`,
    before it is read."""
    if size > MAX_METADATA_BYTES:
        raise _bad(where, f"it holds {size:,} bytes, over the {MAX_METADATA_BYTES:,} a "
                          "metadata document may")


def check_member_path(name: str, store: str) -> None:
    """Refuse an array's path inside ``store`` with an empty, "." or ".." part: Zarr paths
    are plain names joined by "/" (``sub/../X`` names no array zarr can open).

    Parameters
    ----------
    name : str
        The path of an array inside the store, as a user gave it.
    store : str
        The store, named in the error.

    Raises
    ------
    dfairpca.errors.InvalidInputError
        One line naming the path and the rule.
    """
    parts = name.strip("/").split("/")
    if any(p in ("", ".", "..") for p in parts):
        raise InvalidInputError(
            f"{name!r} is not the path of an array inside {store}: Zarr paths are names joined "
            "by '/', without '.' or '..' parts; give the array's path as listed in the store")


def _check_array(where: str, key: str, doc) -> None:
    """The array checks of :func:`check_metadata`, on the parsed document ``doc``."""
    if not isinstance(doc, dict):
        raise _bad(where, f"it holds a JSON {type(doc).__name__}, not an object")
    shape = doc.get("shape")
    if key == ".zarray":
        chunks = doc.get("chunks")
    else:
        grid = doc.get("chunk_grid")
        config = grid.get("configuration") if isinstance(grid, dict) else None
        chunks = config.get("chunk_shape") if isinstance(config, dict) else None
        if isinstance(grid, dict) and grid.get("name") not in (None, "regular"):
            raise _bad(where, f"its chunk grid {grid.get('name')!r} is not one zarr reads "
                              "(only 'regular')")
    if not _ints(shape, 0):
        raise _bad(where, f"its shape {_short(shape)} is not a list of integers >= 0")
    if not _ints(chunks, 1) or len(chunks) != len(shape):
        raise _bad(where, f"its chunk shape {_short(chunks)} is not {len(shape)} integers "
                          f">= 1 (one per axis of the shape {shape})")
    count = 1
    for s, c in zip(shape, chunks):
        count *= -(-s // c)  # Python ints: no overflow, however large the declared sizes
    if count > MAX_CHUNKS:
        raise _bad(where, f"its shape {shape} in chunks of {chunks} makes {count:,} chunks, "
                          f"over the {MAX_CHUNKS:,} dfairpca reads")
    try:
        if key == ".zarray":
            from zarr.core.metadata.v2 import ArrayV2Metadata as Metadata
        else:
            from zarr.core.metadata.v3 import ArrayV3Metadata as Metadata  # type: ignore[assignment]
        Metadata.from_dict(dict(doc))
    except Exception as exc:  # zarr's words: unknown data types, codecs, fill values
        raise _bad(where, str(exc).splitlines()[0] if str(exc) else type(exc).__name__) from None


def _ints(values, low: int) -> TypeGuard[list[int]]:
    return isinstance(values, list) and all(
        isinstance(v, int) and not isinstance(v, bool) and v >= low for v in values)


def _short(value) -> str:
    text = json.dumps(value) if not isinstance(value, str) else repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _bad(where: str, why: str) -> MalformedStoreError:
    return MalformedStoreError(f"{where} is not valid Zarr metadata: {why}; the store is damaged "
                               "or was not written as Zarr: rewrite it")


async def checked_get(store, key: str, prototype, byte_range=None):
    """``store.get(key, ...)`` of the metadata document ``key``, checked by
    :func:`check_metadata` (its size before it is read, where the store tells it)."""
    name = key.rsplit("/", 1)[-1]
    where = f"{str(store).rstrip('/')}/{key}"
    root = getattr(store, "root", None)
    if root is not None and byte_range is None:
        # a local file read here, not in a thread: zarr asks for every version's documents
        # at once, and a refusal would leave those threads' errors unretrieved (printed as
        # tracebacks at exit)
        file = Path(root) / key
        raw = _local_metadata(file, where)
        if raw is not None:
            check_metadata(where, name, raw)
            return prototype.buffer.from_bytes(raw)
        if not os.path.lexists(file):
            return None
    try:
        size = await store.getsize(key)
    except Exception:  # absent (zarr looks for both versions), or not told
        size = None
    if size is not None:
        check_size(where, size)
    value = await store.get(key, prototype, byte_range)
    if value is not None and byte_range is None:
        check_metadata(where, name, value.to_bytes())
    return value


def _local_metadata(path: Path, where: str) -> bytes | None:
    """The bytes of the local metadata file ``path`` if it is a regular file (after
    links: stores may be managed by tools that link their files) within the size cap, or
    None (absent, or something else, which zarr's own read then meets)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    if not stat.S_ISREG(st.st_mode):
        return None
    check_size(where, st.st_size)
    try:
        return path.read_bytes()
    except OSError:
        return None


def checked_store(store):
    """``store`` (a zarr Store) wrapped so that every metadata document zarr reads from it
    is checked first (:func:`check_metadata`).

    Parameters
    ----------
    store : zarr Store
        A store opened for reading.

    Returns
    -------
    zarr Store
        The wrapped store; it pickles as the wrapper of the same store.
    """
    return checked_store_class()(store)


_Checked: type | None = None


def checked_store_class():
    """The wrapper class, defined on first use: importing dfairpca does not import zarr.

    Its subclass, :mod:`dfairpca.io._zarr`'s strict store, also refuses absent chunks; both
    read as the store they wrap (its name, its attributes) and pickle through the module
    function that makes them."""
    global _Checked
    if _Checked is not None:
        return _Checked
    class CheckedStore(WrapperStore):
        """A store whose metadata documents are checked before zarr parses them."""

        async def get(self, key, prototype, byte_range=None):
            if key.rsplit("/", 1)[-1] in METADATA_NAMES:
                return await checked_get(self._store, key, prototype, byte_range)
            return await self._store.get(key, prototype, byte_range)

        def __str__(self):  # the data's address, as messages and fingerprints name it
            return str(self._store)

        def __getattr__(self, name):  # what callers ask of the store itself (LocalStore.root)
            if name == "_store":
                raise AttributeError(name)
            return getattr(self._store, name)

        def __reduce__(self):  # a class made in a function pickles through a module function
            return checked_store, (self._store,)

    _Checked = CheckedStore
    return CheckedStore
