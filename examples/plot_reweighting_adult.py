"""
Reweighing and fair PCA on Adult
================================

Fair PCA (Kleindessner et al., 2023) makes the groups' means equal in the projection;
it does not change how much each row counts.  On Adult Income, the rows of sex 0 with an
income above 50K are a small cell (65 of the 1,582 rows of the train split): a
projection fitted to all rows counts them least.  *Reweighing* (Kamiran & Calders, 2012)
gives each row the weight

.. math:: w(s, y) = \\frac{P(s)\\, P(y)}{P(s, y)},

which makes the protected attribute s and the label y independent in the weighted data:
rare (s, y) cells count more, frequent ones less.  Every estimator of dfairpca takes such
weights as ``sample_weight`` (frequency weights: a row of weight 2 counts as two copies
of itself), in ``fit``, ``partial_fit`` and through a scikit-learn Pipeline.

We fit standard PCA, fair PCA and reweighed fair PCA on the train split of
:func:`dfairpca.datasets.load_adult` (the splits of Lee et al., 2022, shipped with
dfairpca) and compare, on the test split, each (sex, income) cell's reconstruction error
(:func:`dfairpca.metrics.group_reconstruction_error`), relative to standard PCA's.
"""

# %%
# The reweighing weights
# ----------------------
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

import dfairpca
from dfairpca.datasets import load_adult
from dfairpca.metrics import group_reconstruction_error

b = load_adult(split=0)
s, y = b.sensitive_train, b.y_train


def reweighing(s, y):
    """Kamiran & Calders' weights P(s) P(y) / P(s, y) of every row."""
    w = np.empty(len(s))
    for a in np.unique(s):
        for c in np.unique(y):
            cell = (s == a) & (y == c)
            w[cell] = (s == a).mean() * (y == c).mean() / cell.mean()
    return w


w = reweighing(s, y)
cells = pd.DataFrame({"sex": s, "income>50K": y, "weight": w})
cells.groupby(["sex", "income>50K"]).agg(rows=("weight", "size"), weight=("weight", "first"))

# %%
# Fit the three models
# --------------------
# The weights enter fair PCA's statistics: the weighted mean, the weighted covariance
# and the weighted group means, whose differences the components are made orthogonal
# to (the fairness certificate is checked on those).
k = 5
pca = dfairpca.PCA(k).fit(b.X_train)
fair = dfairpca.FairPCA(k).fit(b.X_train, sensitive_features=s)
reweighed = dfairpca.FairPCA(k).fit(b.X_train, sensitive_features=s, sample_weight=w)
print(f"reweighed fit: {reweighed.n_samples_seen_} rows of total weight "
      f"{reweighed.sample_weight_sum_:.1f}; certificate {reweighed.fairness_violation_:.1e}")

# %%
# Who pays for fairness
# ---------------------
# Each (sex, income) cell's mean squared reconstruction error on the test split, divided
# by standard PCA's (a ratio above 1: the cell lost reconstruction to the fair constraint).
test_cells = [b.sensitive_test, b.y_test]
errors = pd.DataFrame({
    name: group_reconstruction_error(model, b.X_test, test_cells, baseline=pca)["ratio"]
    for name, model in (("fair PCA", fair), ("reweighed fair PCA", reweighed))
})
errors.index = [f"sex {a}, >50K {c}" for a, c in errors.index]
errors

# %%
ax = errors.plot.bar(rot=0, figsize=(7, 3.5))
ax.axhline(1.0, color="grey", lw=0.8)
ax.set_ylabel("error / standard PCA's error")
ax.set_title(f"Adult, k = {k}: reconstruction error per (sex, income) cell")
plt.tight_layout()

# %%
# Reweighing moves the projection towards the cells it weighs up: on this split it lowers
# the error of both cells of sex 0, most for the rarest one (weight 1.96), and leaves the
# cells of sex 1 about where they were, while both fair models keep the two sexes'
# (weighted) means equal in the projection.  Weights are a knob on *whose* variance the
# components keep; the fairness constraint stays exact either way.
