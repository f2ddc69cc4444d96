"""What this process runs on and what it runs: the CPUs it may use, the size of the blocks
a pass reads, the user's cache folder, dfairpca's version and the digest of its code.

Applications size their worker pools with :func:`cpu_count` and key resumable work on
:data:`__version__` and :func:`code_digest`, so that pieces made by other code are made
again, never mixed in.
"""

from __future__ import annotations

from ._system import BLOCK_BYTES, cache_folder, cpu_count, rows_per_block
from ._version import __version__, code_digest

__all__ = ["cpu_count", "BLOCK_BYTES", "rows_per_block", "cache_folder", "__version__", "code_digest"]
