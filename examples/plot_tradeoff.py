"""
The fairness / accuracy trade-off
=================================

Fair PCA removes every direction along which the groups' means differ.  When some of
that information is wanted back, Sec. 3.1 of the paper appends the standard PCA
representation scaled by λ: ``FairPCA(k, tradeoff=λ)`` transforms X to
``[X U_fair, λ X U_pca]``.  λ = 0 is fair PCA, λ = 1 gives a classifier everything
standard PCA has; in between, a downstream classifier trades accuracy for demographic
parity.

On Adult (sex as the protected attribute, the ten packaged splits), we sweep λ over the
paper's grid (i/10)³, train a logistic regression for the income label on the train
split's representation, and measure on the test split

* its accuracy and its **ΔDP**, the demographic-parity difference (the gap between the
  groups' rates of positive predictions; fairlearn's
  ``demographic_parity_difference``), and
* **MMD²** between the groups' representations (:func:`dfairpca.metrics.mmd2`), a
  classifier-free measure of how far apart the groups are.
"""

# %%
# Sweep λ
# -------
import matplotlib.pyplot as plt
import numpy as np
from fairlearn.metrics import demographic_parity_difference
from sklearn.linear_model import LogisticRegression

import dfairpca
from dfairpca import metrics
from dfairpca.datasets import N_SPLITS, load_adult

k = 2
lambdas = (np.arange(11) / 10) ** 3
acc, ddp, mmd = (np.zeros((N_SPLITS, len(lambdas))) for _ in range(3))
for split in range(N_SPLITS):
    b = load_adult(split=split)
    sigma = metrics.mmd_bandwidth(dfairpca.PCA(k).fit(b.X_train).transform(b.X_train),
                                  max_samples=None)
    for j, lam in enumerate(lambdas):
        est = dfairpca.FairPCA(k, tradeoff=lam).fit(b.X_train, sensitive_features=b.sensitive_train)
        Ytr, Yte = est.transform(b.X_train), est.transform(b.X_test)
        clf = LogisticRegression(max_iter=1000).fit(Ytr, b.y_train)
        pred = clf.predict(Yte)
        acc[split, j] = 100 * np.mean(pred == b.y_test)
        ddp[split, j] = demographic_parity_difference(b.y_test, pred, sensitive_features=b.sensitive_test)
        mmd[split, j] = metrics.mmd2(Yte, b.sensitive_test, sigma, max_samples=None)

# standard PCA for reference
pca_acc, pca_ddp = [], []
for split in range(N_SPLITS):
    b = load_adult(split=split)
    pca = dfairpca.PCA(k).fit(b.X_train)
    pred = LogisticRegression(max_iter=1000).fit(pca.transform(b.X_train), b.y_train).predict(
        pca.transform(b.X_test))
    pca_acc.append(100 * np.mean(pred == b.y_test))
    pca_ddp.append(demographic_parity_difference(b.y_test, pred, sensitive_features=b.sensitive_test))

# %%
# The curves
# ----------
fig, axes = plt.subplots(1, 2, figsize=(9, 3.6))
ax = axes[0]
ax.plot(ddp.mean(0), acc.mean(0), "o-", label="fair PCA, tradeoff = λ")
for j in (0, 5, 10):
    ax.annotate(f"λ = {lambdas[j]:.3g}", (ddp.mean(0)[j], acc.mean(0)[j]), fontsize=8,
                xytext=(6, -10), textcoords="offset points")
ax.plot(np.mean(pca_ddp), np.mean(pca_acc), "s", color="C3", label="standard PCA")
ax.set_xlabel("ΔDP of the classifier (lower is fairer)")
ax.set_ylabel("accuracy (%)")
ax.legend(fontsize=8)
ax = axes[1]
ax.plot(lambdas, mmd.mean(0), "o-")
ax.set_xlabel("λ")
ax.set_ylabel("MMD² between the groups")
ax.set_title("how far apart the groups' representations are", fontsize=9)
fig.suptitle(f"Adult, k = {k}, mean over {N_SPLITS} splits")
fig.tight_layout()

# %%
# λ buys accuracy back at the price of ΔDP: at λ = 0 the classifier sees only the fair
# representation, whose group means are equal; already a small λ returns the information
# standard PCA has, because a logistic regression does not care about the scale λ puts on
# it.  MMD² rises with λ as the standard half, which keeps the groups' mean difference,
# grows.
for j in (0, 3, 6, 10):
    print(f"λ = {lambdas[j]:.3f}: accuracy {acc[:, j].mean():.2f} %, ΔDP {ddp[:, j].mean():.3f}, "
          f"MMD² {mmd[:, j].mean():.3f}")
print(f"standard PCA: accuracy {np.mean(pca_acc):.2f} %, ΔDP {np.mean(pca_ddp):.3f}")
