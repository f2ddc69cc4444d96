"""Where data lives: a local path or an fsspec URL (``s3://bucket/faces.zarr``, ``gs://...``,
any fsspec protocol), opened the same way.

A path with a protocol is opened with fsspec and the ``storage_options`` given, else what
the file system finds itself (for S3: the AWS_* environment variables, ~/.aws, fsspec's
configuration).  :func:`location` carries the options with the URL, so that every read and
write of it (and the workers' tasks) reach the same endpoint with the same credentials.
"""

from __future__ import annotations

from ._files import MAX_JSON_BYTES, read_capped
from ._remote import Location, is_remote, local_path, location, open_zarr, zarr_store

__all__ = ["is_remote", "local_path", "Location", "location", "open_zarr", "zarr_store",
           "read_capped", "MAX_JSON_BYTES"]
