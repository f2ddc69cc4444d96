"""The write protocol: how dfairpca writes an output, and how a tool that writes
dfairpca-compatible outputs (or an application of dfairpca, such as its command line)
does the same.

Every directory dfairpca writes (models, statistics, checkpoints, Zarr stores, reports)
carries dfairpca's marker (:data:`MARKER`, in a Zarr store the root attribute
:data:`MARKER_KEY`), is written to a temporary sibling and moved into place only when
complete (:func:`atomic_directory`, :func:`atomic_file`, :func:`move_into_place`), and
replaces only an output that carries the marker of the same kind: dfairpca never deletes
or overwrites what it did not write (:func:`check_target` says why before any work, with
:class:`OutputPathError`).  A crash leaves a state the next write or read finishes
(:func:`recover`, :func:`recover_for_reading`).

Every function also takes an fsspec URL (``s3://bucket/x``, see :mod:`dfairpca.io.storage`)
with ``storage_options``: the same rules, with the copies object storage has instead of
renames; an output the workers cannot write to a URL themselves is written to a local
folder first and uploaded when complete (:func:`staged_locally`).  Two processes that would
write the same partial output refuse each other (:func:`exclusive`).

A single-file output (a figure) carries the marker inside the file, where its format keeps
text; the application that writes the format registers how to read it back
(:func:`register_marked_file`).
"""

from __future__ import annotations

from ._marker import MARKER, MARKER_KEY, OutputPathError, marker, marker_attributes
from ._writes import (STAGE_ENV, atomic_directory, atomic_file, check_stage_dir, check_target,
                      exclusive, foreign_entries, move_into_place, named, read_marker, recover,
                      recover_for_reading, register_marked_file, remove_directory, staged_locally,
                      write_marker, writing_every_chunk)

__all__ = [
    "atomic_directory", "atomic_file", "staged_locally", "move_into_place", "writing_every_chunk",
    "exclusive", "check_target", "check_stage_dir", "named", "foreign_entries", "remove_directory", "recover",
    "recover_for_reading", "read_marker", "write_marker", "marker", "marker_attributes", "register_marked_file",
    "OutputPathError", "MARKER", "MARKER_KEY", "STAGE_ENV",
]
