"""
Concept erasure: FairPCA, the orthogonal projection and LEACE on faces
======================================================================

Three ways to take "wears glasses" out of face images, all fitted from the same one-pass
statistics:

* :class:`dfairpca.FairPCA` **reduces**: the best k-dimensional projection under which
  both groups have the same mean (the faces come back from k numbers).
* ``ConceptEraser("orth")`` **removes the mean-difference direction** and keeps every other
  pixel direction: the orthogonal projection, fair PCA at full rank.
* ``ConceptEraser("leace")`` **removes the concept with the least change** (LEACE, Belrose
  et al., NeurIPS 2023): after it no linear classifier does better than chance, and no
  other eraser with that guarantee changes the faces less.

For each, the mean faces of both groups before and after, a linear probe's AUC at telling
the groups apart (trained and tested on held-out faces), and the mean squared change each
costs.  The faces are synthetic (:func:`dfairpca.celeba.synth_celeba`): a CelebA-shaped
Zarr store, read lazily, whose glasses draw frames and dark lenses.
"""

# %%
# A small synthetic CelebA store
# ------------------------------
# 3,000 faces of 32 x 32 pixels (d = 1,024), two thirds to fit on, one third to test.
import tempfile
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
from sklearn.linear_model import RidgeClassifier
from sklearn.metrics import roc_auc_score

import dfairpca
from dfairpca.celeba import attribute_column, synth_celeba

tmp = Path(tempfile.mkdtemp())
store = synth_celeba(tmp / "faces.zarr", n=3000, size=32, seed=0, progress=False, n_jobs=1)
X = dfairpca.from_zarr(store, "images")               # lazy (3000, 32, 32) uint8 Dask array
glasses = attribute_column(store, "Eyeglasses") > 0   # the protected attribute
train, test = np.arange(3000) < 2000, np.arange(3000) >= 2000
print(X.shape, X.dtype, f"{glasses.mean():.1%} wear glasses")

# %%
# One pass, three models
# ----------------------
# The statistics of the training faces are computed once; FairPCA and both erasers solve
# from them (``fit_statistics``), each certified: ``fairness_violation_`` is the largest
# share of a group's mean deviation left in the output (zero up to rounding).
Xtr = X[train].reshape(2000, -1)
stats = dfairpca.compute_moments(Xtr, sensitive_features=glasses[train])
fair = dfairpca.FairPCA(40).fit_statistics(stats)
orth = dfairpca.ConceptEraser("orth").fit_statistics(stats)
leace = dfairpca.ConceptEraser("leace").fit_statistics(stats)
for name, model in (("FairPCA(40)", fair), ("orth", orth), ("LEACE", leace)):
    print(f"{name:12s} certificate {model.fairness_violation_:.1e}")

# %%
# Mean faces and a linear probe, before and after
# -----------------------------------------------
# FairPCA's output is k = 40 numbers; mapped back to pixels (``inverse_transform``) it can
# be shown and compared with the erasers', which are images already.  The probe is a
# linear classifier (ridge, on pixels scaled to [0, 1]) trained on the training faces of
# each version and scored (AUC) on the test faces: 0.5 is chance, and with the ~60 test
# faces with glasses an AUC within about 0.05 of it is chance too.
faces = X.reshape(3000, -1).compute().astype(np.float64)
versions = {
    "original": faces,
    "FairPCA (k=40)": fair.inverse_transform(fair.transform(faces)),
    "orth": orth.transform(faces),
    "LEACE": leace.transform(faces),
}


def probe_auc(Y):
    clf = RidgeClassifier(alpha=100.0).fit(Y[train] / 255, glasses[train])
    return roc_auc_score(glasses[test], clf.decision_function(Y[test] / 255))


rows = []
for name, Y in versions.items():
    change = float(np.mean(np.sum((Y - faces) ** 2, axis=1)))
    rows.append((name, probe_auc(Y), change))
    print(f"{name:15s} probe AUC {rows[-1][1]:.3f}   mean squared change {change:12,.0f}")

fig, axes = plt.subplots(3, len(versions), figsize=(2.2 * len(versions), 6.6))
for j, (name, Y) in enumerate(versions.items()):
    with_g, without = Y[glasses].mean(0).reshape(32, 32), Y[~glasses].mean(0).reshape(32, 32)
    panels = [(with_g, "glasses"), (without, "no glasses"), (with_g - without, "difference")]
    for i, (img, what) in enumerate(panels):
        ax = axes[i, j]
        if i < 2:
            ax.imshow(img, cmap="gray", vmin=0, vmax=255)
        else:
            ax.imshow(img, cmap="RdBu_r", vmin=-40, vmax=40)
        ax.set_xticks([])
        ax.set_yticks([])
        if j == 0:
            ax.set_ylabel(what)
    axes[0, j].set_title(f"{name}\nAUC {rows[j][1]:.2f}", fontsize=9)
fig.suptitle("Mean faces with and without glasses, and their difference")
fig.tight_layout()
plt.show()

# %%
# What each one costs
# -------------------
# FairPCA changes the faces most: it also drops everything outside its 40 components.
# Both erasers leave the group means equal on the faces they were fitted on (the
# difference panels are blank but for the held-out third's sampling noise) and the probe
# at chance, at full rank; LEACE moves the faces least (its mean squared change is never
# larger than orth's), because it removes the concept along the directions where the
# faces vary most with it, not along the raw mean difference.
