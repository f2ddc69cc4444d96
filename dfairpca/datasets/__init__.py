"""Small real data sets for fair PCA, packaged: the Lee et al. (2022) splits.

Adult Income, German Credit and COMPAS exactly as Lee et al. (AAAI 2022) prepared them and
Kleindessner et al. (AISTATS 2023) used them for Tables 1-3: ten random 70/30 train/test
splits each, features standardized with the train split's mean and std, a 0/1 task label
and a 0/1 protected attribute.  Loaded like scikit-learn's ``load_*``::

    >>> from dfairpca.datasets import load_adult
    >>> b = load_adult(split=0)
    >>> import dfairpca
    >>> fair = dfairpca.FairPCA(2).fit(b.X_train, sensitive_features=b.sensitive_train)
    >>> fair.transform(b.X_test).shape
    (679, 2)

``PAPER_TABLES`` holds the paper's reported figures on these splits (``PAPER_METHODS``, the
methods of this package among them; ``PAPER_DIGITS``, the decimals it prints per column).  Provenance and the
licences (MIT for Lee et al.'s files, CC BY 4.0 for the UCI data) are in each Bunch's
``DESCR``.
"""

from ._lee2022 import N_SPLITS, data_files, load_adult, load_compas, load_german
from ._paper import DIGITS as PAPER_DIGITS, OUR_METHODS as PAPER_METHODS, PAPER_TABLES, PaperFigure

__all__ = ["load_adult", "load_german", "load_compas", "N_SPLITS", "PAPER_TABLES", "PAPER_DIGITS",
           "PAPER_METHODS", "PaperFigure", "data_files"]
