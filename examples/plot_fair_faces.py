"""
Fair faces: erasing "Eyeglasses" from a face data set
=====================================================

Fair PCA finds the k-dimensional projection that keeps the most variance of the faces
while giving faces with and without glasses the *same mean*: no linear read-out of the
representation can then tell the two groups apart on average.  Reconstructing faces from
that representation shows what it keeps and what it erased (the paper's Figure 5).

The faces here are synthetic (the real CelebA needs a manual download): a CelebA-shaped
Zarr store written by :func:`dfairpca.celeba.synth_celeba`, whose 40 attributes change
the pixels the way they do in photographs -- glasses draw frames and dark lenses.  The
store is read lazily with :func:`dfairpca.from_zarr`; the fit is one chunked pass over it,
so the same code runs on the 202,599 faces of ``dfairpca demo`` or on a cluster.
"""

# %%
# A small synthetic CelebA store
# ------------------------------
# 4,000 faces of 48 x 48 pixels (CelebA's 202,599 at 80 x 80 take a minute on two cores).
import tempfile
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np

import dfairpca
from dfairpca.celeba import attribute_column, synth_celeba

tmp = Path(tempfile.mkdtemp())
store = synth_celeba(tmp / "faces.zarr", n=4000, size=48, seed=0, progress=False, n_jobs=1)
X = dfairpca.from_zarr(store, "images")               # lazy (4000, 48, 48) uint8 Dask array
glasses = attribute_column(store, "Eyeglasses") > 0   # the protected attribute
print(X.shape, X.dtype, f"{glasses.mean():.1%} wear glasses")

# %%
# Fit standard and fair PCA
# -------------------------
# Both estimators take the 3-D stack and flatten it lazily (d = 48 * 48 = 2,304 features).
# ``fairness_violation_`` is the certificate every fair fit computes: the largest share of
# any group's mean deviation the components keep (zero up to rounding).
k = 40
pca = dfairpca.PCA(k).fit(X)
fair = dfairpca.FairPCA(k).fit(X, sensitive_features=glasses)
print(f"PCA keeps {pca.explained_variance_ratio_.sum():.1%} of the variance, "
      f"fair PCA {fair.explained_variance_ratio_.sum():.1%} (k = {k})")
print(f"certificate: {fair.fairness_violation_:.1e}; largest fair k: {fair.max_components_}")

# %%
# Originals and reconstructions
# -----------------------------
# Four faces with glasses, four without.  ``inverse_transform(transform(X))`` maps each
# face back to pixels through the k-dimensional representation.
rows = np.r_[np.flatnonzero(glasses)[:4], np.flatnonzero(~glasses)[:4]]
faces = X[rows].compute().reshape(len(rows), -1).astype(float)


def reconstruct(model):
    return np.clip(model.inverse_transform(model.transform(faces)), 0, 255)


# Fair PCA at the largest k projects onto the complement of the removed directions Q
# (``constraint_basis_``, here the one direction of the group-mean difference)
Q = fair.constraint_basis_
erased = np.clip(faces - (faces - fair.mean_) @ Q @ Q.T, 0, 255)


panels = [
    ("originals", faces),
    (f"standard PCA, k = {k}", reconstruct(pca)),
    (f"fair PCA, k = {k}", reconstruct(fair)),
    (f"fair PCA, largest k = {fair.max_components_}", erased),
]
fig, axes = plt.subplots(len(panels), len(rows), figsize=(8, 4.6))
for (title, imgs), ax_row in zip(panels, axes):
    for img, ax in zip(imgs, ax_row):
        ax.imshow(img.reshape(48, 48), cmap="gray", vmin=0, vmax=255)
        ax.set_xticks([])
        ax.set_yticks([])
    ax_row[0].set_ylabel(title, rotation=0, ha="right", va="center", fontsize=9)
axes[0, 0].set_title("with glasses", loc="left", fontsize=9)
axes[0, 4].set_title("without glasses", loc="left", fontsize=9)
fig.suptitle("Reconstructions through a representation that erases Eyeglasses")
fig.tight_layout()

# %%
# Standard PCA keeps the glasses: they are among the strongest directions of variation.
# Fair PCA at the same k may not keep the direction along which the two groups' mean
# faces differ: faces with glasses lose part of them, faces without gain a trace of them,
# so that on average the two groups look alike (single faces can still differ; it is the
# means that are equal).  At the largest k (a projection that removes only that one
# direction) the faces are otherwise intact: fairness here costs one direction out of
# 2,304.
#
# The group means before and after
# --------------------------------
# The difference of the two groups' mean faces, and the same difference after the fair
# projection: it vanishes (the colour scale is the same).
Xall = X.reshape(len(X), -1).compute().astype(float)
diff = Xall[glasses].mean(0) - Xall[~glasses].mean(0)
Y = fair.transform(Xall)
diff_fair = fair.inverse_transform(Y[glasses]).mean(0) - fair.inverse_transform(Y[~glasses]).mean(0)
lim = np.abs(diff).max()
fig, axes = plt.subplots(1, 2, figsize=(5, 2.8))
for ax, img, title in zip(axes, (diff, diff_fair), ("data", f"fair PCA, k = {k}")):
    ax.imshow(img.reshape(48, 48), cmap="RdBu_r", vmin=-lim, vmax=lim)
    ax.set_title(f"mean difference: {title}", fontsize=9)
    ax.set_axis_off()
fig.tight_layout()
print(f"largest mean difference: {lim:.1f} grey levels before, {np.abs(diff_fair).max():.1e} after")
