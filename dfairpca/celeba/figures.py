"""Pictures of fair faces, after the paper's Figure 5 and App. C.6.

The figure is built on a :class:`matplotlib.figure.Figure` and drawn by the Agg canvas
directly: pyplot is never imported, so a notebook's or a GUI's backend is left as it was.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from ..io import MARKER_KEY, atomic_file, check_target, marker, register_marked_file
from .schema import DEFAULT_FACES, attribute_column, open_celeba
from ..errors import InvalidInputError

__all__ = ["DEFAULT_FACES", "MAX_FACES_PER_ROW", "draw_faces", "faces_figure", "faces_held",
           "full_fair_projection"]

#: most faces per row: each face is a column 1.3 in wide at :data:`DPI`, so 100 (200
#: columns) is already a 28,600-pixel-wide PNG, and above 229 matplotlib refuses the size
#: (2**16 pixels), but only after drawing it
MAX_FACES_PER_ROW = 100
#: resolution of the PNG: a 16 x 16 face is drawn on about 140 x 160 pixels
DPI = 110
#: what dfairpca's marker calls a picture (see :func:`dfairpca.io.check_target`)
FIGURE_KIND = "figure"
#: the first bytes of every PNG file
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def png_marker(path) -> str | None:
    """The text of dfairpca's marker in the PNG ``path`` (its text chunk ``MARKER_KEY``,
    which :func:`faces_figure` writes), or None: how dfairpca recognises its own pictures
    (:func:`dfairpca.io.register_marked_file`)."""
    from PIL import Image, PngImagePlugin

    with Image.open(path) as im:
        # a PNG's text chunks, those after the image data too
        png = im if isinstance(im, PngImagePlugin.PngImageFile) else None
        return png.text.get(MARKER_KEY) if png is not None else None


register_marked_file(PNG_SIGNATURE, png_marker)


def full_fair_projection(model, X: np.ndarray) -> np.ndarray:
    """Reconstruct rows with fair PCA at the largest k (``d - n_constraints``).

    That projection is ``I - Q Q^T`` with Q the model's ``constraint_basis_``: no eigensolve
    is needed, whatever d is.
    """
    Q = model.constraint_basis_
    scale = np.ones(model.n_features_in_) if model.scale_ is None else model.scale_
    Z = (np.asarray(X, np.float64) - model.mean_) / scale
    return (Z - (Z @ Q) @ Q.T) * scale + model.mean_


def _is_fair(model) -> bool:
    """Whether ``model`` is a fair model (it has groups to show apart)."""
    return hasattr(model, "constraint_basis_")


def faces_held(model, store) -> int:
    """The most faces per row :func:`faces_figure` can fill from ``store``: for a fair model
    the larger of the two groups of its first attribute (a row holds n with and n without
    it), for PCA half the images."""
    images, _, _ = open_celeba(store)
    if _is_fair(model):
        flags = attribute_column(store, model.attribute_names_[0])
        return max(int((flags == 1).sum()), int((flags == 0).sum()))
    return math.ceil(images.shape[0] / 2)


def _pick_rows(flags: np.ndarray, value: int, n: int) -> np.ndarray:
    """The first ``n`` rows whose flag is ``value``."""
    return np.flatnonzero(flags == value)[:n]


def faces_figure(model, store, out, n: int = DEFAULT_FACES, *, overwrite: bool = False,
                 note: str | None = None) -> Path:
    """Write a PNG: originals, fair PCA at the largest k, fair PCA at the model's k, each row
    captioned in words, under a title that says what was erased (and for a fair model a
    caption of what fair PCA guarantees: equal group means, not a changed single face).

    ``note``: a line printed under the title (the demo's held-out figures).
    ``overwrite=True`` replaces a picture dfairpca drew at ``out``, never another file; the
    PNG is written whole or not at all (:func:`dfairpca.io.atomic_file`).

    Columns show ``n`` faces with and ``n`` without the model's first protected attribute
    (read from the store's ``attributes``).  A second panel shows the group-mean images of
    the data and of the model's reconstructions; after fair PCA the two means coincide.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    check_target(out, FIGURE_KIND, overwrite=overwrite)  # before any face is read
    images, _, _ = open_celeba(store)
    face = images.shape[1:]  # (h, w) grey or (h, w, 3) colour
    if math.prod(face) != model.n_features_in_:
        raise InvalidInputError(
            f"the model has {model.n_features_in_} features but the store's images are "
            + "x".join(map(str, face))
        )
    fair = _is_fair(model)
    name = model.attribute_names_[0] if fair else None
    if fair:
        flags = attribute_column(store, model.attribute_names_[0])
        rows = np.concatenate([_pick_rows(flags, 1, n), _pick_rows(flags, 0, n)])
    else:
        rows = np.arange(min(2 * n, images.shape[0]))
    rows = np.sort(rows)
    X = np.asarray(images.get_orthogonal_selection((rows,))).reshape(len(rows), -1).astype(np.float64)
    if fair:  # attribute-holders first
        order = np.argsort(-flags[rows], kind="stable")
        rows, X = rows[order], X[order]
    panels = [("original faces", X)]
    if fair:
        # the row captions say in words what each row is: a reader of the picture alone
        # cannot know what "k = 6399" (the largest k) means
        panels.append(("full fair projection:\nonly the group-mean\ndirection removed",
                       full_fair_projection(model, X)))
    label = "fair PCA" if fair else "PCA"
    panels.append((f"{label}, k = {model.n_components_}:\nrebuilt from the\nrepresentation",
                   model.inverse_transform(model.transform(X))))

    ncols = len(rows)
    n_rows = len(panels) + (1 if fair else 0)
    fig = Figure(figsize=(1.3 * ncols, 1.45 * n_rows))
    FigureCanvasAgg(fig)  # draws and saves without pyplot or a backend switch
    axes = fig.subplots(n_rows, ncols, squeeze=False)
    height, width = face[:2]
    draw_faces(axes, panels, height, width, color=len(face) == 3)
    if fair:
        n_with = int((flags[rows] == 1).sum())
        axes[0, 0].set_title(f"with {name}", fontsize=8, loc="left")
        if n_with < ncols:
            axes[0, n_with].set_title(f"without {name}", fontsize=8, loc="left")
        _group_means_row(model, axes[len(panels)], face, name)
        fig.suptitle(f'Fair PCA erases "{name}" from what a linear read-out can see: '
                     "both groups get the same mean face" + (f"\n{note}" if note else ""), fontsize=9)
        # the honest caption: equal means, not erased glasses on every face
        fig.text(0.5, 0.005, f"Single faces may still show {name}; what fair PCA guarantees is "
                 "that the two groups' mean faces coincide, so no linear function of the "
                 "representation tells the groups apart.", ha="center", va="bottom", fontsize=7)
        fig.tight_layout(rect=(0, 0.03, 1, 0.96))
    else:
        fig.suptitle(f"PCA with k = {model.n_components_}: original faces and their "
                     "reconstructions", fontsize=9)
        fig.tight_layout(rect=(0, 0, 1, 0.96))
    out = Path(out)
    with atomic_file(out, FIGURE_KIND, overwrite=overwrite) as tmp:
        # the PNG carries dfairpca's marker as a text chunk, so that only it may be replaced
        fig.savefig(tmp, format="png", dpi=DPI,
                    metadata={MARKER_KEY: json.dumps(marker(FIGURE_KIND))})
    return out


def draw_faces(axes, panels, h: int, w: int, color: bool = False) -> None:
    """Draw panel r, ``(title, images)``, as row r of ``axes``: h x w faces, grey or RGB
    (``color``), titled."""
    face = (h, w, 3) if color else (h, w)
    for r, (title, imgs) in enumerate(panels):
        for c, ax in enumerate(axes[r]):
            _show_face(ax, imgs[c], face)
            ax.set_xticks([]), ax.set_yticks([])
        axes[r, 0].set_ylabel(title, fontsize=7)


def _show_face(ax, row: np.ndarray, face: tuple) -> None:
    """Draw one face (a row of ``prod(face)`` levels 0-255; clipped) on ``ax``."""
    pixels = np.clip(row.reshape(face), 0, 255)
    if len(face) == 3:  # RGB: matplotlib takes floats in [0, 1]
        ax.imshow(pixels / 255)
    else:
        ax.imshow(pixels, cmap="gray", vmin=0, vmax=255)


def _group_means_row(model, axes, face, name):
    """Group means of the data and of the fair reconstructions, and their differences."""
    cats = list(model.groups_[0])
    gm = model.group_means_[0]
    i1 = cats.index(1) if 1 in cats else len(cats) - 1
    i0 = cats.index(0) if 0 in cats else 0
    before = gm[[i1, i0]]
    after = model.inverse_transform(model.transform(before))
    tiles = [
        (f"mean with {name}", before[0], True),
        ("mean without", before[1], True),
        ("difference", before[0] - before[1], False),
        ("fair: mean with", after[0], True),
        ("fair: mean without", after[1], True),
        ("fair: difference", after[0] - after[1], False),
    ]
    diff_lim = max(np.abs(before[0] - before[1]).max(), 1e-9)
    plane = face[:2]  # a colour difference is shown as its mean over the channels
    for ax in axes:
        ax.axis("off")
    for ax, (title, img, is_image) in zip(axes, tiles):
        ax.axis("on")
        if is_image:
            _show_face(ax, img, face)
        else:
            ax.imshow(img.reshape(face).reshape(*plane, -1).mean(axis=-1), cmap="RdBu_r",
                      vmin=-diff_lim, vmax=diff_lim)
        ax.set_title(title, fontsize=6)
        ax.set_xticks([]), ax.set_yticks([])
    axes[0].set_ylabel("group means:\ndata, then\nfair PCA", fontsize=7)
