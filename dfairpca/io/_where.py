"""Where data lives, opened the same way whether a local path or an fsspec URL:
:func:`storage_for` gives the write protocol's operations on a path
(:class:`~dfairpca.io._storage.Storage`): :class:`~dfairpca.io._local.LocalStorage` renames on
a local disk, :class:`~dfairpca.io._fsspec.FsspecStorage` copies under a journal on object
storage; it is the one place that tells the two apart.  :func:`open_zarr` opens a Zarr store
at either.
"""

from __future__ import annotations

import os
import zarr

from ._metadata import checked_store
from ._fsspec import FsspecStorage, check_settled, list_keys
from ._local import LocalStorage
from ._storage import Storage
from ._urls import explaining, is_remote, local_path, zarr_store
from ..errors import InvalidInputError, PathNotFoundError

# Deferred imports: zarr (heavy or optional) is imported in the functions that use it, so that
# importing this module stays light.

__all__ = ["storage_for", "open_zarr", "BACKENDS"]

#: the storage of each kind of place, the one table that tells them apart: a local path
#: (``""``, a ``file://`` URL too), else a URL's protocol (``"s3"``), else any other fsspec
#: URL or mapper (``"*"``).  A backend is a :class:`Storage` subclass in a module of its
#: own and a line here.
BACKENDS: dict[str, type[Storage]] = {
    "": LocalStorage,
    "*": FsspecStorage,
}


def _protocols(path) -> tuple[str, ...]:
    """The protocols ``path`` is reached by: ``("",)`` for a local path, a URL's scheme, or
    the protocols of a Location's or a mapper's file system."""
    if not is_remote(path):
        return ("",)
    if isinstance(path, str):
        return (path.split("://", 1)[0],)
    protocol = path.fs.protocol
    return (protocol,) if isinstance(protocol, str) else tuple(protocol)


def storage_for(path, storage_options: dict | None = None) -> Storage:
    """The storage of ``path``, by :data:`BACKENDS`: :class:`FsspecStorage` for an fsspec
    URL, a mapper or a :class:`Location`, else :class:`LocalStorage` (a ``file://`` URL
    names a local path too, and is taken as written, as every local path is).

    Parameters
    ----------
    path : str, os.PathLike, Location or fsspec mapper
        The output.
    storage_options : dict, optional
        fsspec options of a URL ``path``.

    Returns
    -------
    Storage
        The write protocol's operations on ``path``.
    """
    backend = next((BACKENDS[p] for p in _protocols(path) if p in BACKENDS), BACKENDS["*"])
    return backend.at(path, storage_options)


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
    # dfairpca reads the members as they are, not the consolidated copy of the metadata it
    # writes for other readers: an array a user added since (without consolidating again)
    # is read too
    storage = storage_for(store, storage_options)
    if not storage.remote:
        path = local_path(store)
        if not path.exists():
            raise PathNotFoundError(f"no Zarr store at {str(path)!r}")
        from zarr.storage import LocalStore

        try:  # absolute: a worker's working directory is not this process's
            return zarr.open(store=checked_store(LocalStore(os.path.abspath(path), read_only=True)),
                             mode="r", use_consolidated=False)
        except InvalidInputError:
            raise  # malformed metadata, named
        except Exception as exc:  # zarr raises several types for "not a store"
            raise InvalidInputError(f"{str(path)!r} is not a Zarr store: {exc}") from None
    loc = storage.target
    with explaining(loc):
        if not list_keys(loc):
            raise PathNotFoundError(f"no Zarr store at {loc.url} (nothing is stored there)")
        check_settled(loc)  # an overwrite cut short mid-copy holds old and new chunks
        try:
            return zarr.open(store=checked_store(zarr_store(loc)), mode="r", use_consolidated=False)
        except InvalidInputError:
            raise
        except (FileNotFoundError, KeyError, ValueError) as exc:  # objects, but no zarr.json
            raise InvalidInputError(f"{loc.url} is not a Zarr store: {exc}") from None

