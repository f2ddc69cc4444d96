"""Paths the workers open on their own machines: whether every worker sees what this
process sees there (:func:`check_workers_see`), the error of one that does not
(:class:`~dfairpca.cluster.NotShared`) and the fixes its messages name, and the active client
whose workers are asked."""

from __future__ import annotations

import hashlib
import os
import secrets
import socket
import sys

from ..errors import DfairpcaError, UnreachableError
from ._remote import zarr_arrays
from ._where import storage_for

# Deferred imports: distributed (heavy or optional) is imported in the functions that use them, so
# that importing this module stays light.


class NotShared(DfairpcaError, FileNotFoundError):
    """A local path this process reads or writes is not the same on some of the cluster's
    workers: they run on machines that do not share this machine's files there."""

    # documented, raised and pickled under the public name dfairpca.cluster.NotShared
    __module__ = "dfairpca.cluster"


#: what to do about a path the workers do not share, said by every :class:`NotShared`
SHARE_FIX = ("put it on a file system that every worker mounts at the same path, give an "
             "object-store URL instead (s3://..., with storage_options / --storage-options), or "
             "compute on this machine (a local cluster: no --scheduler)")
#: the same without the URL, for an input that only a local folder can be (CelebA's JPEGs)
SHARE_FIX_LOCAL = ("put it on a file system that every worker mounts at the same path, or "
                   "compute on this machine (no --scheduler)")

#: bytes of an input file compared between this process and the workers (its size, whole)
_HEAD_BYTES = 1 << 20
#: workers named in a message, before "and N more"
_NAMED_WORKERS = 5


def active_client():
    """The active ``distributed.Client`` (the one Dask computes on), or None.

    Returns
    -------
    distributed.Client or None
        The client, or None when Dask computes without one (its local schedulers).
    """
    if "distributed" not in sys.modules:  # never imported: no client can be active
        return None
    try:
        from distributed import get_client

        return get_client()
    except (ImportError, ValueError):
        return None



def check_workers_see(client, path, what: str, *, output: bool = False, shown=None,
                      fix: str = SHARE_FIX) -> None:
    """Raise :class:`NotShared` unless every worker of ``client`` sees ``path`` as this
    process does; nothing for a URL (every worker reaches it) or without a client.

    A worker opens a local path on its own machine, and one that does not share this
    machine's files finds nothing there: it would fail on the first chunk (or read an
    absent store as fill values), or write its chunks to its own disk, out of this
    process's sight.  One round trip to every worker, before the work, finds it out.

    Parameters
    ----------
    client : distributed.Client or None
        The workers to ask; None: nothing to check.
    path : str or Path
        Input: a file this process reads (a Zarr array's metadata), which every worker must
        find with the same size and first MiB.  ``output``: a folder this process made
        for the workers to write into (a temporary one: a token file is written there and
        removed), whose token every worker must read, and where it must be able to write.
    what : str
        What ``path`` is, for the message ("the input store").
    output : bool
        Whether ``path`` is a folder the workers write into (see ``path``) rather than an
        input they read.
    shown : str or Path, optional
        The path the user gave, named in the message (default ``path``).
    fix : str
        What to do about it, said at the end of the message.
    """
    if client is None or storage_for(path).remote:
        return
    path = os.path.abspath(path)
    if output:
        name = f".dfairpca-probe-{secrets.token_hex(8)}"
        token = secrets.token_hex(16)
        with open(os.path.join(path, name), "w") as f:
            f.write(token)
        try:
            seen = client.run(_sees_folder, path, name, token, on_error="return")
        finally:
            os.unlink(os.path.join(path, name))
        here = None
    else:
        here = _sees_file(path)
        if isinstance(here, str):  # not readable here either: nothing to compare with
            return
        seen = client.run(_sees_file, path, on_error="return")
    failed = sorted((a, e) for a, e in seen.items() if isinstance(e, BaseException))
    if failed:  # not an answer about the path: a worker that cannot run the question
        (address, exc), more = failed[0], len(failed) - 1
        raise UnreachableError(
            f"cannot ask the Dask worker {address}{f' (and {more} more)' if more else ''} whether "
            f"it sees {str(shown or path)!r} ({type(exc).__name__}: {exc}); every worker needs "
            "the same dfairpca, dask and distributed versions as this process"
        )
    bad = {}
    for address, answer in sorted(seen.items()):
        if output and answer is not None:
            bad[address] = answer
        elif not output and answer != here:
            bad[address] = answer if isinstance(answer, str) else "another file is there"
    if bad:
        named = ", ".join(f"{a} ({why})" for a, why in list(bad.items())[:_NAMED_WORKERS])
        rest = f" and {len(bad) - _NAMED_WORKERS} more" if len(bad) > _NAMED_WORKERS else ""
        verb = "write" if output else "read"
        who = f"{len(bad)} of the {len(seen)} Dask workers" if len(seen) > 1 else "the Dask worker"
        raise NotShared(
            f"{who} cannot {verb} {what} "
            f"{str(shown or path)!r} at that path, which they open on their own machines: "
            f"{named}{rest}; {fix}"
        )


def check_inputs_shared(X, client=None) -> None:
    """:func:`check_workers_see` for every local Zarr array the Dask array X's graph reads
    (its metadata file).

    Parameters
    ----------
    X : dask.array.Array or any
        The input; anything but a Dask array reading local Zarr stores is not checked.
    client : distributed.Client, optional
        The workers to ask (default: the active client, if any).
    """
    client = client if client is not None else active_client()
    if client is None:
        return
    seen = set()
    for array in zarr_arrays(X):
        root = getattr(array.store, "root", None)  # a local store's folder
        if root is None:
            continue
        meta = "zarr.json" if array.metadata.zarr_format == 3 else ".zarray"
        folder = os.path.join(os.fspath(root), *array.path.split("/")) if array.path else os.fspath(root)
        if folder not in seen:
            seen.add(folder)
            check_workers_see(client, os.path.join(folder, meta), "the Zarr array", shown=folder)


def not_here(path, what: str, verb: str = "reads") -> NotShared:
    """The error of a process that does not find ``what`` at ``path`` (a worker reading
    a store that is not there): names this worker and the fix.

    Parameters
    ----------
    path : str or os.PathLike
        Where it looked.
    what : str
        What it looked for ("the input store").
    verb : str
        What it does with it ("reads", "writes"), for the message.

    Returns
    -------
    NotShared
        The error, to raise.
    """
    try:
        from distributed import get_worker

        where = f"the Dask worker {get_worker().address}"
    except (ImportError, ValueError):
        where = f"this process (host {socket.gethostname()})"
    return NotShared(f"{what} {str(path)!r} does not exist on {where}, which {verb} it at that "
                     f"path on its own machine; {SHARE_FIX}")


def _sees_file(path: str):
    """(size, sha256 of the first MiB) of the file ``path`` as this process sees it, or
    why it cannot (run on every worker by :func:`check_workers_see`)."""
    try:
        with open(path, "rb") as f:
            head = f.read(_HEAD_BYTES)
            size = os.fstat(f.fileno()).st_size
    except OSError as exc:
        return _why(exc)
    return size, hashlib.sha256(head).hexdigest()


def _sees_folder(path: str, name: str, token: str):
    """None if the folder ``path`` holds the file ``name`` with ``token`` and takes a new
    file; else why not (run on every worker by :func:`check_workers_see`)."""
    try:
        with open(os.path.join(path, name)) as f:
            if f.read() != token:
                return "another folder is there"
    except OSError as exc:
        return _why(exc)
    probe = os.path.join(path, f"{name}-{secrets.token_hex(8)}")
    try:
        with open(probe, "w"):
            pass
        os.unlink(probe)
    except OSError as exc:
        return f"cannot write there: {_why(exc)}"
    return None


def _why(exc: OSError) -> str:
    """An OSError as a few words: "not there", "no permission", or its strerror."""
    if isinstance(exc, (FileNotFoundError, NotADirectoryError)):
        return "not there"
    if isinstance(exc, PermissionError):
        return "no permission"
    return exc.strerror or type(exc).__name__
