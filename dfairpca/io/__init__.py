"""Files: reading Zarr stores as Dask arrays, saving and loading models without pickle, and
the write protocol every output of dfairpca follows.  This package's ``__all__`` is its
interface; its ``_`` modules are private.

A saved object is a directory holding ``arrays.npz`` (plain numeric/string arrays, read
with ``allow_pickle=False``) and ``meta.json`` (:func:`save_arrays`, :func:`load_arrays`).

**The write protocol**, for dfairpca and for a tool that writes dfairpca-compatible outputs
(or an application of dfairpca, such as its command line).  Every directory dfairpca writes
(models, statistics, checkpoints, Zarr stores, reports) carries dfairpca's marker
(:data:`MARKER`, in a Zarr store the root attribute :data:`MARKER_KEY`), is written to a
temporary sibling and moved into place only when complete (:func:`atomic_directory`,
:func:`atomic_file`, :func:`move_into_place`), and replaces only an output that carries the
marker of the same kind: dfairpca never deletes or overwrites what it did not write
(:func:`check_target` says why before any work, with :class:`OutputPathError`).  A crash
leaves a state the next write or read finishes (:func:`recover`, :func:`recover_for_reading`).
A single-file output (a figure) carries the marker inside the file, where its format keeps
text; the application that writes the format registers how to read it back
(:func:`register_marked_file`).

**Where data lives**: a local path or an fsspec URL (``s3://bucket/faces.zarr``,
``gs://...``, any fsspec protocol), opened the same way.  A path with a protocol is opened
with fsspec and the ``storage_options`` given, else what the file system finds itself (for
S3: the AWS_* environment variables, ~/.aws, fsspec's configuration).  :func:`location`
carries the options with the URL, so that every read and write of it (and the workers'
tasks) reach the same endpoint with the same credentials.  Every function of the write
protocol also takes such a URL with ``storage_options``: the same rules, with the copies
object storage has instead of renames (:func:`storage_for`, the one place that tells the two
apart); an output the workers cannot write to a URL themselves is written to a local folder
first and uploaded when complete (:func:`staged_locally`; :func:`write_staged` runs a writer of
local folders either way).  Outside this package the kind of storage is asked of nobody:
what a caller needs of a place (the path to hand back, a checkpoint beside it, a local
copy to read) is a method of what :func:`storage_for` returns.  Two processes that would write
the same partial output refuse each other (:func:`exclusive`).
"""

from ._aligned import (MIN_OUTPUT_CHUNK_BYTES, OUTPUT_CHUNK_BYTES, WrongRowsError, aligned_to, check_rows,
                       chunks_written, output_chunks, sample_rows, store_aligned)
from ._arrays import (FORMAT_VERSION, RESAVE_HINT, header_shape, load_arrays, meta_value, save_arrays,
                      write_arrays)
from ._files import MAX_JSON_BYTES, SavedFileError, check_folder, open_regular, read_capped
from ._local import named, register_marked_file
from ._locks import disk_full, exclusive, is_disk_full
from ._metadata import MalformedStoreError, check_member_path
from ._moments_format import (categories_from_json, categories_to_json, moments_layout, read_saved,
                              saved_fields, saved_group_counts, saved_layout, sums_to_arrays)
from ._registry import lookup as model_class, names as model_class_names, register as register_model_class
from ._remote import (STORE_TIMEOUT_ANNOTATION, StoreTimeout, close_sessions, store_timeout, zarr_arrays,
                      zarr_roots)
from ._marker import MARKER, MARKER_KEY, OutputPathError, marker, marker_attributes
from ._shared import (SHARE_FIX, SHARE_FIX_LOCAL, NotShared, active_client, check_inputs_shared,
                      check_workers_see, not_here)
from ._stage import STAGE_ENV, check_stage_dir, staged_locally, write_staged
from ._urls import Location, is_remote, local_path, location, zarr_store
from ._where import open_zarr, storage_for
from ._writes import (atomic_directory, atomic_file, check_target, foreign_entries, move_into_place,
                      read_marker, recover, recover_for_reading, remove_directory, write_marker,
                      writing_every_chunk)
from ._zarr import (CorruptChunkError, MissingChunkError, check_written, from_zarr, local_zarr_roots,
                    read_checked, strict_array, strict_group)

__all__ = [
    # reading Zarr, saving and loading arrays, the errors a read or a save raises
    "from_zarr", "save_arrays", "write_arrays", "load_arrays", "local_zarr_roots", "OutputPathError",
    "FORMAT_VERSION", "MissingChunkError", "CorruptChunkError", "SavedFileError", "strict_array",
    "strict_group", "read_checked", "check_written", "MalformedStoreError", "check_member_path",
    "StoreTimeout",
    # the write protocol
    "output_chunks", "aligned_to", "store_aligned", "sample_rows", "check_rows", "WrongRowsError",
    "OUTPUT_CHUNK_BYTES", "MIN_OUTPUT_CHUNK_BYTES", "chunks_written", "atomic_directory", "atomic_file", "staged_locally", "move_into_place", "writing_every_chunk",
    "exclusive", "disk_full", "is_disk_full", "check_target", "check_stage_dir", "named", "foreign_entries", "remove_directory",
    "recover", "recover_for_reading", "read_marker", "write_marker", "marker", "marker_attributes",
    "register_marked_file", "MARKER", "MARKER_KEY", "STAGE_ENV",
    # where data lives
    "is_remote", "local_path", "Location", "location", "open_zarr", "zarr_store", "read_capped",
    "MAX_JSON_BYTES", "storage_for", "write_staged",
    # what the library's own layers above read and write through (this package's modules
    # are private to it, tests/test_structure.py holds that)
    "RESAVE_HINT", "meta_value", "header_shape", "check_folder", "open_regular",
    "sums_to_arrays", "saved_fields", "read_saved", "saved_group_counts", "saved_layout", "moments_layout",
    "categories_to_json", "categories_from_json",
    "register_model_class", "model_class", "model_class_names",
    "zarr_arrays", "zarr_roots", "store_timeout", "STORE_TIMEOUT_ANNOTATION", "close_sessions",
    # the paths the workers share (offered by dfairpca.cluster too)
    "SHARE_FIX", "SHARE_FIX_LOCAL", "NotShared", "active_client", "check_inputs_shared",
    "check_workers_see", "not_here",
]

# the public modules of 0.2.0 that held these names import as this package (until 0.4.0)
from ..base._compat import alias_moved_modules as _alias  # noqa: E402

_alias(__name__)
del _alias
