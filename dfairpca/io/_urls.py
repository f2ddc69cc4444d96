"""fsspec URLs (``s3://bucket/faces.zarr``, ``gs://...``, any fsspec protocol): where they lead.

A path with a protocol is opened with fsspec and the ``storage_options`` given, else what
the file system finds itself (for S3: AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY,
AWS_ENDPOINT_URL, ~/.aws, fsspec's configuration).  The options travel with the Zarr
arrays in the task graph, so workers reach the same endpoint with the same credentials.
An fsspec mapper (``fsspec.get_mapper(url, **storage_options)``) is taken as the URL
together with its options.  A request the storage refuses is one line naming the fix
(:func:`explained`).
"""

from __future__ import annotations

import contextlib
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
import traceback
from zarr.storage import FsspecStore

from ._marker import OutputPathError
from ..errors import AccessError, InvalidInputError, PathNotFoundError, UnreachableError

# Deferred imports: fsspec (heavy or optional) is imported in the functions that use it, so that
# importing this module stays light.

__all__ = [
    "is_remote", "local_path", "Location", "location", "on_disk", "normalised", "explained",
    "explaining", "zarr_store", "store_url",
]

_PROTOCOL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")

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
    return any(frame.f_code.co_name in _CLIENT_MAKERS for frame, _ in traceback.walk_tb(exc.__traceback__))


@contextlib.contextmanager
def explaining(where):
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
