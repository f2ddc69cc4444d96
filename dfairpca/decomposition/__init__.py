"""The estimators: PCA, FairPCA, FairKernelPCA and ConceptEraser on one base, and the
saved format."""

from ._pca import PCA, FairPCA
from ._saved import load
from .kernel import FairKernelPCA
from ._eraser import ConceptEraser  # after the others: the registry lists the classes in this order

__all__ = ["PCA", "FairPCA", "FairKernelPCA", "ConceptEraser", "load"]
