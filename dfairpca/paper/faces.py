"""Figures 5 and 10-15: fair PCA erasing an attribute from (synthetic) CelebA faces.

The paper fitted fair PCA (Alg. 1) on the 202,599 CelebA faces, 80 x 80 grey, one attribute
at a time, and showed three rows per figure: original faces, their projection by fair PCA at
k = d - 1 = 6,399 (only the group-mean gap removed) and at k = 400.  CelebA's images cannot be
downloaded here, so the faces are :func:`dfairpca.celeba.synth_celeba`'s synthetic ones (the
same store layout and attribute prevalences); "Beard" is CelebA's ``No_Beard`` inverted.
"""

from __future__ import annotations

import tempfile
import time

import numpy as np

# Deferred imports: package modules that load such libraries, or this module, at import are imported
# in the functions that use them, so that importing this module stays light.

#: figure number -> (the paper's attribute name, CelebA's column, inverted?)
ATTRIBUTES = {
    10: ("Eyeglasses", "Eyeglasses", False),
    11: ("Mustache", "Mustache", False),
    12: ("Beard", "No_Beard", True),
    13: ("Smiling", "Smiling", False),
    14: ("Bald", "Bald", False),
    15: ("Hat", "Wearing_Hat", False),
}
#: what the paper says its figure shows (App. C.6)
PAPER_SAYS = {
    10: "glasses-like shadows are added to every face, so that none can be told to wear glasses; "
        "the faces still resemble the originals (Figure 5 is the same for eyeglasses)",
    11: "something like a mustache is added to every face",
    12: "something like a beard is added to every face",
    13: "smiling is obfuscated, but whole faces are more perturbed",
    14: "fair PCA appears to fail: no face looks bald (bald faces are 2.2% and diverse)",
    15: "fair PCA appears to fail: no face wears a hat (hats are 4.8% and highly diverse)",
}
PER_GROUP = 4  # faces shown with and without the attribute


def _load(n: int, size: int, folder: str):
    from ..celeba import open_celeba, synth_celeba

    store = synth_celeba(f"{folder}/faces.zarr", n=n, size=size, progress=False, n_jobs=1)
    images, _, _ = open_celeba(store)
    return store, np.asarray(images[:], dtype=np.float32).reshape(n, -1)


def tasks(cfg) -> tuple:
    """One piece: the faces are read once for all six attributes."""
    return (None,)


def run(cfg, log=print, task=None) -> tuple[list[dict], list]:
    """Fit one fair PCA per attribute: rows of what was measured, and the faces to draw
    (per figure: the three rows of :data:`PER_GROUP` faces with and without)."""
    from ..celeba import attribute_column

    from .. import FairPCA
    from ..celeba.figures import full_fair_projection

    rows, pictures = [], []
    with tempfile.TemporaryDirectory(prefix="dfairpca-paper-") as folder:
        t0 = time.perf_counter()
        store, X = _load(cfg.faces_n, cfg.faces_size, folder)
        log(f"faces: {cfg.faces_n} synthetic faces of {cfg.faces_size}^2 ({time.perf_counter() - t0:.1f} s)")
        d = X.shape[1]
        for num, (name, column, invert) in ATTRIBUTES.items():
            z = attribute_column(store, column).astype(int)
            z = 1 - z if invert else z
            t0 = time.perf_counter()
            model = FairPCA(cfg.faces_k).fit(X, sensitive_features=z)
            secs = time.perf_counter() - t0
            pick = np.r_[np.flatnonzero(z == 1)[:PER_GROUP], np.flatnonzero(z == 0)[:PER_GROUP]]
            faces = X[pick].astype(np.float64)
            panels = [("original", faces),
                      (f"fair PCA, k = {d - 1}", full_fair_projection(model, faces)),
                      (f"fair PCA, k = {cfg.faces_k}", model.inverse_transform(model.transform(faces)))]
            rows.append({"figure": num, "attribute": name, "prevalence": float(z.mean()), "n": len(z),
                         "d": d, "k": cfg.faces_k, "fit_s": secs,
                         "fairness_violation": float(model.fairness_violation_)})
            pictures.append((num, name, panels, cfg.faces_size, float(z.mean()), len(z)))
            log(f"faces: {name} ({secs:.1f} s)")
    return rows, pictures


def figures(report, pictures, plt) -> None:
    """Figures 10-15 (10 is also Figure 5) into the report."""
    for picture in pictures:
        _draw(report, plt, *picture)


def _draw(report, plt, num, name, panels, size, prevalence, n):
    from ..celeba.figures import draw_faces

    cols = 2 * PER_GROUP
    fig, axes = plt.subplots(3, cols, figsize=(1.2 * cols, 3.9))
    draw_faces(axes, panels, size, size)
    axes[0, 0].set_title(f"with {name}", fontsize=8, loc="left")
    axes[0, PER_GROUP].set_title(f"without {name}", fontsize=8, loc="left")
    fig.suptitle(f"Figure {num}: fair PCA erasing “{name}” ({n:,} synthetic faces, {prevalence:.1%} with)",
                 fontsize=9)
    fig.tight_layout()
    extra = " (and Figure 5)" if num == 10 else ""
    report.figure(fig, f"figure{num}.png",
                  f"Figure {num}{extra} (ours): original, fair PCA at k = d - 1 and at the paper's k, for “{name}”",
                  PAPER_SAYS[num] + ".")
