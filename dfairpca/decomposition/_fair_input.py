"""The input of a fair fit, read once for :class:`~dfairpca.FairPCA` and
:class:`~dfairpca.FairKernelPCA` alike: X checked with its sensitive columns found, the
protected attributes encoded as groups (codes and categories), the numeric attributes
among X's columns, the y == 1 rows of equal opportunity and the checked sample weights.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..engine._compute import with_known_rows
from ..inputs._groups import Groups, encode_groups, group_labels
from ..solve._fairness import constraint_of
from ..inputs._validation import Input, check_input
from ..inputs._weights import check_weights

__all__ = ["FairInput", "fair_input"]


@dataclass(frozen=True)
class FairInput:
    """What a fair fit reads from its arguments before any pass over X."""

    #: X checked (:func:`~dfairpca.inputs._validation.check_input`), its sensitive columns found
    checked: Input
    #: X's columns as the pass reads them (features and numeric attributes), rows known
    data: Any
    #: the labelled attributes, encoded; None when every attribute is a numeric column
    groups: Groups | None
    #: the rows fitted under ``constraint="equal_opportunity"`` (y == 1); None: all rows
    mask: np.ndarray | None
    #: the checked sample weights, or None
    weights: Any
    #: names of the labelled attributes, then of the numeric ones
    names: list[str]

    @property
    def n_rows(self) -> int:
        """The rows of X."""
        return self.data.shape[0]

    @property
    def fitted_rows(self) -> int:
        """The rows the fit is of: all, or the y == 1 ones of equal opportunity."""
        return self.n_rows if self.mask is None else int(np.count_nonzero(self.mask))

    @property
    def n_features(self) -> int:
        """X's features: its pass columns but the numeric attributes."""
        return self.data.shape[1] - self.n_numeric

    @property
    def n_numeric(self) -> int:
        """The numeric protected attributes among X's columns."""
        return len(self.checked.numeric)

    @property
    def group_sizes(self) -> list[int]:
        """The groups of every labelled attribute, m_1, ..., m_p."""
        return [] if self.groups is None else [len(c) for c in self.groups.categories]


def fair_input(est, X, sensitive_features, y, *, reset, min_samples: int = 2,
               sample_weight=None, partial: bool = False, groups: bool = True) -> FairInput:
    """Check X, the protected attributes, y and the weights of a fair fit by ``est``.

    ``reset`` as in :func:`~dfairpca.inputs._validation.check_input`; ``partial``: one call
    of ``partial_fit``, which may see a single group and weights totalling under 2.
    ``est.constraint`` names the fairness constraint, whose row mask says which rows are
    fitted (:meth:`dfairpca.solve._fairness.FairnessConstraint.row_mask`); an estimator
    without that parameter fits all rows (demographic parity).  ``groups=False``: an
    estimator without protected attributes (PCA), whose input is X and the weights only.
    """
    checked = check_input(est, X, reset=reset, min_samples=min_samples,
                          ids=getattr(est, "sensitive_feature_ids", None))
    labels = group_labels(est, checked, sensitive_features) if groups else None
    data, labels, y, w = with_known_rows(checked.data, labels, y, sample_weight)
    n = data.shape[0]
    mask = constraint_of(getattr(est, "constraint", None)).row_mask(y, n)
    if w is not None:
        w = check_weights(w, data, mask, min_total=0 if partial else 2)
    encoded = None if labels is None else encode_groups(labels, n, mask=mask, require_two=not partial)
    names = ([] if encoded is None else list(encoded.names)) + checked.numeric_names
    return FairInput(checked, data, encoded, mask, w, names)
