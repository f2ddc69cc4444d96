"""Files: reading Zarr stores as Dask arrays, saving and loading models without pickle.

A saved object is a directory holding ``arrays.npz`` (plain numeric/string arrays, read
with ``allow_pickle=False``) and ``meta.json``, written through the write protocol
(marker, atomic replacement, crash recovery) that :mod:`dfairpca.io.writes` documents for
tools writing dfairpca-compatible outputs; :mod:`dfairpca.io.storage` opens local paths
and fsspec URLs alike.
"""

from __future__ import annotations

from ._arrays import FORMAT_VERSION, RESAVE_HINT, header_shape, load_arrays, meta_value, save_arrays, write_arrays  # noqa: F401
from ._files import MAX_JSON_BYTES, SavedFileError, open_regular, read_capped  # noqa: F401 (re-exported)
from ._marker import OutputPathError
from ._zarr import (CorruptChunkError, MissingChunkError, check_written, from_zarr, local_zarr_roots,
                    read_checked, strict_array, strict_group)
from ._zarr import LISTING_LIMIT  # noqa: F401 (read it here; from_zarr reads dfairpca.io._zarr's)
# the write protocol's names, documented in dfairpca.io.writes, stay importable from here
from ._writes import (MARKER, MARKER_KEY, atomic_directory, atomic_file, check_target,  # noqa: F401
                      foreign_entries, intact_copies, marker, marker_attributes, move_into_place,
                      read_marker, recover, recover_for_reading, remove_directory, write_marker,
                      writing_every_chunk)
# where data lives, documented in dfairpca.io.storage, as importable here as before
from ._remote import explained, is_remote, local_copy, location, store_url, zarr_roots  # noqa: F401
from .storage import open_zarr  # noqa: F401

# what users call: reading Zarr, saving and loading arrays, the errors a read or a save
# raises; the write protocol's own names are documented in dfairpca.io.writes (they stay
# importable here, where older code found them)
__all__ = [
    "from_zarr", "save_arrays", "write_arrays", "load_arrays", "local_zarr_roots", "OutputPathError",
    "FORMAT_VERSION", "MissingChunkError", "CorruptChunkError", "SavedFileError", "strict_array",
    "strict_group", "read_checked", "check_written",
]
