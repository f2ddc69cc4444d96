"""
Fair kernel PCA at scale with Nyström
=====================================

:class:`dfairpca.FairKernelPCA` finds non-linear features (directions in a kernel's
feature space) along which every group has the same mean.  The exact method (the paper's
Alg. 3) works on the n x n kernel matrix: O(n²) memory, O(n³) time.  With
``n_landmarks=m`` it uses the Nyström approximation instead: each row's features
``k(x, L) K_LL^(-1/2)`` against m landmark rows L are computed chunk by chunk and
reduced, in the same single pass as linear fair PCA, to m x m statistics.  Memory and time
then grow linearly with n, so the fit runs out of core on a Zarr store of any length
(``examples/kernel_at_scale.py --n 202599`` fits all of the synthetic CelebA stack).

Here: 6,000 synthetic faces of 32 x 32 pixels, "Eyeglasses" erased, an RBF kernel with
scikit-learn's ``gamma="scale"``, and m from 100 to 1,000 landmarks.
"""

# %%
# The data, read lazily from a Zarr store
# ---------------------------------------
import tempfile
import time
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np

import dfairpca
from dfairpca.celeba import attribute_column, synth_celeba

tmp = Path(tempfile.mkdtemp())
store = synth_celeba(tmp / "faces.zarr", n=6000, size=32, seed=1, progress=False, n_jobs=1)
X = dfairpca.from_zarr(store, "images")            # lazy (6000, 32, 32) uint8
glasses = attribute_column(store, "Eyeglasses") > 0
print(X.shape, f"{glasses.mean():.1%} with glasses")

# %%
# Nyström with more and more landmarks
# ------------------------------------
# ``explained_variance_`` is the variance of each fair feature over the faces.  A Nyström
# kernel approximates the exact one from below, so the variance the k features keep grows
# towards the exact method's as m grows; the group-mean gap of the representation is zero
# up to rounding, whatever m (``fairness_violation_`` is the fit's own certificate).
k = 10
fits = {}
for m in (100, 250, 500, 1000):
    t0 = time.perf_counter()
    est = dfairpca.FairKernelPCA(k, n_landmarks=m).fit(X, sensitive_features=glasses)
    Y = est.transform(X).compute()
    seconds = time.perf_counter() - t0
    gap = np.abs(Y[glasses].mean(0) - Y[~glasses].mean(0)).max() / np.abs(Y).max()
    fits[m] = (est, seconds)
    print(f"m = {m:4d}: fit + transform {seconds:5.1f} s, "  # the first also warms up Dask
          f"variance kept {est.explained_variance_.sum():.4f}, "
          f"group-mean gap {gap:.1e} (relative), certificate {est.fairness_violation_:.1e}")

# %%
# What the fair features keep
# ---------------------------
# With ``tradeoff=1`` one fit returns both the fair representation and, scaled by λ = 1,
# standard kernel PCA's.  Along standard kernel PCA's leading directions the two groups
# separate; along the fair ones their means coincide.
both = dfairpca.FairKernelPCA(k, n_landmarks=500, tradeoff=1.0).fit(X, sensitive_features=glasses)
Y = both.transform(X).compute()
fair, standard = Y[:, :k], Y[:, k:]
# the standard direction whose mean differs most between the groups, against the first fair one
j = int(np.argmax(np.abs(standard[glasses].mean(0) - standard[~glasses].mean(0)) / standard.std(0)))
fig, axes = plt.subplots(1, 2, figsize=(9, 3.3))
for ax, col, title in ((axes[0], standard[:, j], f"standard kernel PCA, component {j + 1}"),
                       (axes[1], fair[:, 0], "fair kernel PCA, component 1")):
    bins = np.linspace(col.min(), col.max(), 50)
    ax.hist(col[~glasses], bins, density=True, alpha=0.6, label="without glasses")
    ax.hist(col[glasses], bins, density=True, alpha=0.6, label="with glasses")
    for g, c in ((~glasses, "C0"), (glasses, "C1")):
        ax.axvline(col[g].mean(), color=c, lw=2)
    ax.set_title(title, fontsize=9)
    ax.set_yticks([])
axes[0].legend(fontsize=8)
fig.suptitle("The two groups along one direction (vertical lines: the group means)")
fig.tight_layout()

# %%
# Cost against the number of landmarks
# ------------------------------------
ms = sorted(fits)
fig, ax = plt.subplots(figsize=(5, 3))
ax.plot(ms, [fits[m][1] for m in ms], "o-")
ax.set_xlabel("landmarks m")
ax.set_ylabel("fit + transform (s)")
ax2 = ax.twinx()
ax2.plot(ms, [fits[m][0].explained_variance_.sum() for m in ms], "s--", color="C1")
ax2.set_ylabel("variance of the k fair features", color="C1")
ax.set_title(f"n = {len(X):,}, k = {k}", fontsize=9)
fig.tight_layout()

# %%
# The exact method would hold a 6,000 x 6,000 kernel (0.3 GB) and solve an eigenproblem
# of that size; Nyström's cost is one pass over the rows with m x m statistics, so n can
# grow to the 202,599 faces of CelebA (see the benchmarks page: about 85 s for the fit
# with m = 2,000 at 80 x 80 pixels, 1.4 GB of memory).
