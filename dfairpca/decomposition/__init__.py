"""The estimators: PCA, FairPCA and FairKernelPCA on one base, and the saved format."""

from ._pca import PCA, FairPCA
from ._saved import load
from .kernel import FairKernelPCA

__all__ = ["PCA", "FairPCA", "FairKernelPCA", "load"]
