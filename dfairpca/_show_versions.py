"""What a bug report needs to know about this machine: :func:`show_versions`.

The versions of dfairpca and of what it runs on, the BLAS numpy calls (which decides the
speed, and on some CPUs the last bits, of every float product), the CPU and its 8-bit
dot-product flags, which exact Gram kernels passed their self-test in this process, and
what ``compute_dtype="auto"`` chose for 8-bit data by timing them against float32 products
(exact statistics only where they are not slower here).
"""

from __future__ import annotations

import platform
import sys
from importlib import metadata
from typing import Any, TextIO
from .base._system import cpu_info
from .base._version import __version__

# Deferred imports: threadpoolctl (heavy or optional) and package modules that load such libraries,
# or this module, at import are imported in the functions that use them, so that importing this
# module stays light.

__all__ = ["show_versions", "versions_report"]

#: the distributions reported, in order: dfairpca's dependencies, then the optional ones
#: whose presence changes what runs (xarray input, fsspec stores, MKL's int8 kernel)
PACKAGES = ("numpy", "scipy", "dask", "distributed", "zarr", "scikit-learn", "pandas",
            "threadpoolctl", "fairlearn", "xarray", "fsspec", "s3fs", "mkl")


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _blas() -> list[dict[str, Any]]:
    """The BLAS and OpenMP libraries loaded in this process, as threadpoolctl sees them
    (numpy's and MKL's are loaded by then: :func:`versions_report` asks the kernels first)."""
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return []
    keep = ("user_api", "internal_api", "version", "num_threads", "architecture", "filepath")
    return [{k: info.get(k) for k in keep} for info in threadpool_info()]


def versions_report() -> dict[str, Any]:
    """The facts :func:`show_versions` prints, as a dict (JSON-serialisable).

    Returns
    -------
    dict
        ``dfairpca``, ``python``, ``platform``, ``packages`` (distribution -> version or
        None), ``blas`` (threadpoolctl's records), ``cpu`` (model name, CPUs usable, int8
        flags), ``exact_kernels`` (kernel name -> whether its self-test passed here) and
        ``auto_choice`` (what compute_dtype="auto" chose for 8-bit data in this process, per
        width, with the timings: measured at 1,024 columns if no fit asked yet).
    """
    from .stats._auto import auto_report
    from .stats._exact import AUTO_WIDTH
    from .stats._int_kernels import kernel_report

    kernels = kernel_report()  # first: loading MKL's kernel makes its threads visible below
    return {
        "dfairpca": __version__,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "packages": {p: _version(p) for p in PACKAGES},
        "blas": _blas(),
        "cpu": cpu_info(),
        "exact_kernels": kernels,
        "auto_choice": auto_report(AUTO_WIDTH),
    }


def show_versions(file: TextIO | None = None, *, as_dict: bool = False) -> dict[str, Any] | None:
    """Print the versions, BLAS, CPU and exact kernels of this machine, for a bug report.

    The same report as ``dfairpca info`` on the command line.

    Parameters
    ----------
    file : file-like, optional
        Where to print (default ``sys.stdout``).
    as_dict : bool, default False
        Return the report as a JSON-serialisable dict instead of printing it (``dfairpca
        info --json``): ``dfairpca``, ``python``, ``platform``, ``packages``, ``blas``,
        ``cpu``, ``exact_kernels`` and ``auto_choice``.

    Returns
    -------
    dict or None
        The report with ``as_dict=True``, else None.
    """
    r = versions_report()
    if as_dict:
        return r
    out = sys.stdout if file is None else file
    lines = ["dfairpca", f"  version: {r['dfairpca']}", f"  python: {r['python']}",
             f"  platform: {r['platform']}", "", "dependencies"]
    lines += [f"  {name}: {v or 'not installed'}" for name, v in r["packages"].items()]
    lines += ["", "threadpools (BLAS, OpenMP)"]
    for b in r["blas"] or [{}]:
        if not b:
            lines.append("  none found")
            continue
        lines.append(f"  {b['internal_api']} {b['version']} ({b['user_api']}, "
                     f"{b['num_threads']} threads, {b['architecture']}): {b['filepath']}")
    cpu = r["cpu"]
    flags = [f for f, on in cpu["int8_flags"].items() if on]
    lines += ["", "cpu", f"  model: {cpu['model_name']}", f"  cpus usable: {cpu['cpus']}",
              f"  int8 flags: {' '.join(flags) or 'none'}", "", "exact kernels (self-test here)"]
    for name, verdict in r["exact_kernels"].items():
        word = {True: "passed", False: "refused (portable kernel used)", None: "not tested (not needed here)"}[verdict]
        lines.append(f"  {name}: {word}")
    if not r["exact_kernels"]:
        lines.append("  no 8-bit kernel installed (pip install 'dfairpca[mkl]' on x86-64 with VNNI "
                     "or AMX); exact statistics use the portable kernel")
    lines += ["", 'compute_dtype="auto" for 8-bit data (measured here)']
    for c in r["auto_choice"]:
        lines.append(f"  {c['dtype']}, {c['width']:,} columns: {c['description']}")
    print("\n".join(lines), file=out)
    return None
