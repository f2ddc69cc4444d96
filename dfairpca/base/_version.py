"""The package version, in a module of its own so any module may read it without importing the
package (which imports the estimators), and the digest of the code that runs."""

import functools
import hashlib
from pathlib import Path

__version__ = "0.2.0"


@functools.lru_cache(maxsize=None)
def code_digest() -> str:
    """SHA-256 (hex, 16 digits) of this package's Python source: every ``.py`` file under
    the package folder, by relative path and content.

    What resumable jobs key their finished pieces on besides :data:`__version__` (a
    partial CelebA store, the paper's report): pieces made by other code, even of the
    same version (an editable install between commits), are made again, never mixed in.

    Returns
    -------
    str
        16 hex digits; computed once per process.
    """
    root = Path(__file__).resolve().parent
    h = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        h.update(path.relative_to(root).as_posix().encode() + b"\0")
        h.update(path.read_bytes() + b"\0")
    return h.hexdigest()[:16]
