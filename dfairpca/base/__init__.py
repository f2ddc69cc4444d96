"""Foundations every layer uses: parameter rules, the machine (CPUs, block size), the
version and code digest, the BLAS binding and the eigensolvers.

:func:`int_at_least` is the estimators' rule for integer parameters, public for the
applications' command lines (``int_at_least(2).argument()`` is an argparse type).

What this process runs on and what it runs is public here: the CPUs it may use, the size of
the blocks a pass reads, the user's cache folder, dfairpca's version and the digest of its code.  Applications size
their worker pools with :func:`cpu_count` and key resumable work on :data:`__version__` and
:func:`code_digest`, so that pieces made by other code are made again, never mixed in; a
command keeps a Ctrl-C that Python would drop with :func:`ctrl_c_kept`.
"""

from ._compat import alias_moved_modules as _alias
from ._interrupts import ctrl_c_kept
from ._params import int_at_least
from ._system import BLOCK_BYTES, cache_folder, cpu_count, rows_per_block
from ._version import __version__, code_digest

__all__ = ["cpu_count", "BLOCK_BYTES", "rows_per_block", "cache_folder", "__version__", "code_digest",
           "ctrl_c_kept", "int_at_least"]

_alias(__name__)  # dfairpca.base.runtime of 0.2.0 imports as this package (until 0.4.0)
del _alias
