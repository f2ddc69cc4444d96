"""dfairpca: PCA and fair PCA on data too large for one machine's memory.

Fair PCA (Kleindessner et al., AISTATS 2023) from additive statistics reduced in one
chunked pass over numpy, Dask or Zarr arrays, then a small local eigenproblem.
"""

from ._version import __version__

__all__ = ["PCA", "FairPCA", "FairKernelPCA", "Moments", "merge", "compute_moments", "from_zarr", "load", "__version__"]

#: where each public name lives, imported on first use (PEP 562): a worker process that
#: unpickles a function of dfairpca.celeba imports the package, and scikit-learn, SciPy
#: and Dask behind the estimators took 3-7 s of it (the whole cost of a short ingest)
_PUBLIC = {
    "PCA": "decomposition", "FairPCA": "decomposition", "FairKernelPCA": "kernel",
    "Moments": "moments", "merge": "moments", "compute_moments": "_engine", "from_zarr": "io",
    "load": "_saved",
}


def __getattr__(name: str):
    import importlib

    if name not in _PUBLIC:
        raise AttributeError(f"module 'dfairpca' has no attribute {name!r}")
    if name == "load":  # a saved model's class is found in the registry its module fills
        importlib.import_module(".decomposition", __name__)
        importlib.import_module(".kernel", __name__)
    value = getattr(importlib.import_module(f".{_PUBLIC[name]}", __name__), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted({*globals(), *_PUBLIC})
