"""dfairpca: PCA and fair PCA on data too large for one machine's memory.

Fair PCA (Kleindessner et al., AISTATS 2023) from additive statistics reduced in one
chunked pass over numpy, Dask or Zarr arrays, then a small local eigenproblem.
"""

from ._engine import compute_moments
from ._version import __version__
from ._saved import load
from .decomposition import PCA, FairPCA
from .io import from_zarr
from .kernel import FairKernelPCA
from .moments import Moments, merge

__all__ = ["PCA", "FairPCA", "FairKernelPCA", "Moments", "merge", "compute_moments", "from_zarr", "load", "__version__"]
