"""Facts about the machine and the memory plan that several modules share.

One place for each: the CPUs this process may use, the bytes of one temporary row
block, and the user's cache folder.  A module that needs either imports it from here, so a container with a CPU quota
or a change of the block size is handled once.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

__all__ = ["BLOCK_BYTES", "cpu_count", "rows_per_block", "cache_folder"]

#: bytes of one float temporary a pass, a reader or a projection makes from a chunk: large
#: enough that a BLAS product on it runs at full speed, small enough that a few of them per
#: thread stay far below a worker's memory
BLOCK_BYTES = 64 << 20


def cpu_count() -> int:
    """CPUs this process may run on (its affinity mask where the OS has one).

    ``os.cpu_count()`` counts the machine's CPUs, which a container or ``taskset`` may not
    grant; Dask's ``CPU_COUNT`` also honours cgroup quotas.  The smallest of those counts
    is what threads can really use.

    Returns
    -------
    int
        At least 1.
    """
    counts = [os.cpu_count() or 1]
    if hasattr(os, "sched_getaffinity"):
        counts.append(len(os.sched_getaffinity(0)))
    try:
        from dask.system import CPU_COUNT
    except ImportError:  # pragma: no cover - dask is a dependency
        pass
    else:
        counts.append(CPU_COUNT)
    return max(1, min(counts))


def rows_per_block(row_bytes: int, block_bytes: int = BLOCK_BYTES) -> int:
    """Rows of ``row_bytes`` each that fit in one block of ``block_bytes``.

    Parameters
    ----------
    row_bytes : int
        Bytes of one row.
    block_bytes : int
        Bytes of a block (default :data:`BLOCK_BYTES`).

    Returns
    -------
    int
        At least 1.
    """
    return max(1, block_bytes // max(1, int(row_bytes)))


def cache_folder(environ=None, home=None, platform: str | None = None) -> Path:
    """dfairpca's folder in the user's cache: where large, remakeable files go (the demo's
    store, the stages of remote writes), never the current folder (a clone's root, often).

    ``$XDG_CACHE_HOME/dfairpca`` when that variable is set (any platform), else the
    platform's cache folder: ``~/Library/Caches/dfairpca`` on macOS,
    ``%LOCALAPPDATA%/dfairpca/Cache`` on Windows, ``~/.cache/dfairpca`` elsewhere (the XDG
    default).

    Parameters
    ----------
    environ : mapping, optional
        The environment to read (default ``os.environ``).
    home : path-like, optional
        The home folder (default ``Path.home()``).
    platform : str, optional
        The ``sys.platform`` to assume (default this one's).

    Returns
    -------
    Path
    """
    environ = os.environ if environ is None else environ
    home = Path.home() if home is None else Path(home)
    platform = sys.platform if platform is None else platform
    if environ.get("XDG_CACHE_HOME"):
        return Path(environ["XDG_CACHE_HOME"]) / "dfairpca"
    if platform == "darwin":
        return home / "Library" / "Caches" / "dfairpca"
    if platform == "win32":
        return Path(environ.get("LOCALAPPDATA") or home / "AppData" / "Local") / "dfairpca" / "Cache"
    return home / ".cache" / "dfairpca"
