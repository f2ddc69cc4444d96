"""dfairpca: PCA and fair PCA on data too large for one machine's memory.

Fair PCA (Kleindessner et al., AISTATS 2023) from additive statistics reduced in one
chunked pass over numpy, Dask or Zarr arrays, then a small local eigenproblem.
"""

from typing import TYPE_CHECKING, Any
import importlib

from .base._version import __version__
from .errors import DfairpcaError, DfairpcaWarning

if TYPE_CHECKING:  # what __getattr__ imports on first use, as type checkers see it
    from .decomposition import ConceptEraser, FairKernelPCA, FairPCA, PCA, load
    from .engine._engine import compute_moments
    from .io import from_zarr
    from .stats.moments import Moments, merge
    from ._show_versions import show_versions

__all__ = ["PCA", "FairPCA", "FairKernelPCA", "ConceptEraser", "Moments", "merge", "compute_moments",
           "from_zarr", "load", "show_versions", "DfairpcaError", "DfairpcaWarning",
           "__version__"]

#: where each public name lives, imported on first use (PEP 562): a worker process that
#: unpickles a function of dfairpca.celeba imports the package, and scikit-learn, SciPy
#: and Dask behind the estimators took 3-7 s of it (the whole cost of a short ingest)
_PUBLIC = {
    "PCA": "decomposition", "FairPCA": "decomposition", "FairKernelPCA": "decomposition",
    "ConceptEraser": "decomposition",
    "Moments": "stats.moments", "merge": "stats.moments", "compute_moments": "engine._engine",
    "from_zarr": "io", "load": "decomposition", "show_versions": "_show_versions",
}

#: the subpackages (and flat public modules) that ``dfairpca.<name>`` gives after a plain
#: ``import dfairpca``, as ``import dfairpca.<name>`` would bind them, imported on first use
#: like the names above: the root depends on none of them (tests/test_structure.py checks
#: that this set is every folder of the package)
_SUBPACKAGES = frozenset({
    "base", "celeba", "cli", "cluster", "datasets", "decomposition", "engine", "errors", "inputs",
    "io", "metrics", "paper", "solve", "stats",
})


def __getattr__(name: str) -> Any:
    if name in _SUBPACKAGES:  # importing a subpackage binds it here (globals) itself
        return importlib.import_module(f".{name}", __name__)
    if name not in _PUBLIC:
        raise AttributeError(f"module 'dfairpca' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_PUBLIC[name]}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_PUBLIC, *_SUBPACKAGES})
