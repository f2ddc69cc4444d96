"""The estimators: PCA, FairPCA, FairKernelPCA and ConceptEraser on one base, and the
saved format."""

from ._eraser import ConceptEraser
from ._pca import PCA, FairPCA
from ._saved import load
from .kernel import FairKernelPCA

__all__ = ["PCA", "FairPCA", "FairKernelPCA", "ConceptEraser", "load"]
