"""Facts about the machine and the memory plan that several modules share.

One place for each: the CPUs this process may use, the bytes of one temporary row
block, and the user's cache folder.  A module that needs either imports it from here, so a container with a CPU quota
or a change of the block size is handled once.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
import platform

# Deferred imports: dask (heavy or optional) is imported in the functions that use it, so that
# importing this module stays light.

__all__ = ["BLOCK_BYTES", "PRODUCT_BLOCK_BYTES", "INT8_FLAGS", "cache_folder", "cpu_count", "cpu_info", "rows_per_block"]

#: bytes of one float temporary a pass, a reader or a projection makes from a chunk: large
#: enough that a BLAS product on it runs at full speed, small enough that a few of them per
#: thread stay far below a worker's memory
BLOCK_BYTES = 64 << 20
#: bytes of the float block a pass converts its rows to for one ``syrk`` (655 rows of
#: 6,400 float32 columns): the BLAS updates its product once per few hundred rows of its
#: own anyway, so 4x fewer rows per call cost no time (0.87 against 0.91 CPU s per
#: 2,048 x 6,400 chunk), and every thread of a pass holds 48 MB less than in blocks of
#: :data:`BLOCK_BYTES`
PRODUCT_BLOCK_BYTES = 16 << 20


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


#: the CPU flags of 8-bit integer dot products: without one of them an 8-bit GEMM sums
#: pairs of products in saturating 16-bit registers (and MKL's is refused by its self-test)
INT8_FLAGS = ("amx_int8", "avx512_vnni", "avx_vnni")


def cpu_info() -> dict:
    """The CPU's model name, the CPUs this process may use and its 8-bit dot-product flags.

    Read from ``/proc/cpuinfo`` where there is one (Linux); elsewhere the model is
    ``platform.processor()`` and the flags are unknown (all False).

    Returns
    -------
    dict
        ``{"model_name": str, "cpus": int, "int8_flags": {flag: bool}}`` for the flags of
        :data:`INT8_FLAGS`.
    """
    model, flags = platform.processor() or platform.machine(), set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "model name":
                    model = value.strip()
                elif key.strip() in ("flags", "Features"):
                    flags = set(value.split())
                if model and flags and key.strip() == "":
                    break  # the first processor's block: every core reports the same
    except OSError:
        pass
    return {"model_name": model, "cpus": cpu_count(),
            "int8_flags": {f: f in flags for f in INT8_FLAGS}}


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
