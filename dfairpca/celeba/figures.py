"""Pictures of fair faces, after the paper's Figure 5 and App. C.6.

The figure is built on a :class:`matplotlib.figure.Figure` and drawn by the Agg canvas
directly: pyplot is never imported, so a notebook's or a GUI's backend is left as it was.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import numpy as np

from ..io import MARKER_KEY, atomic_file, check_target, marker, register_marked_file
from .schema import DEFAULT_FACES, attribute_column, open_celeba
from ..errors import InvalidInputError

__all__ = ["DEFAULT_FACES", "MAX_FACES_PER_ROW", "Evidence", "draw_faces", "faces_figure", "faces_held",
           "faces_picture", "full_fair_projection"]

#: most faces per row: each face is a column 1.8 in wide at :data:`DPI` (FACE_INCHES), so
#: 100 (200 columns) is already a 40,000-pixel-wide PNG, and above 165 matplotlib refuses
#: the size (2**16 pixels), but only after drawing it
MAX_FACES_PER_ROW = 100
#: resolution of the PNG: a face is drawn on about 200 pixels across
DPI = 110
#: width of one face in the picture (inches at :data:`DPI`): 8 faces fill a 16-inch, 1,800-pixel row
FACE_INCHES = 1.8
#: the row captions' column left of the faces
LABEL_INCHES = 2.0
#: the fair picture's width at least: its bottom panels and caption need it with few faces
MIN_WIDTH_INCHES = 12.0
#: heights of the group means and evidence panel, the caption and the title
BOTTOM_INCHES = 3.4
CAPTION_INCHES = 0.9
TITLE_INCHES = 0.6
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


@dataclasses.dataclass(frozen=True)
class Evidence:
    """What a fairness report measured on faces a model never saw, for the picture's chart:
    per method (``"PCA"``, ``"fair PCA"``, an eraser), the largest group-mean gap of its
    representation in standard deviations and a linear probe's AUC (0.5 is chance)."""

    faces: int  #: held-out faces the figures come from
    methods: tuple[str, ...]
    gap_sd: tuple[float, ...]
    auc: tuple[float, ...]

    @classmethod
    def from_report(cls, row, faces: int, label: str = "fair PCA",
                    baseline: str = "PCA") -> Evidence:
        """From a row of :func:`dfairpca.metrics.fairness_report` with a ``baseline``."""
        return cls(faces, (baseline, label),
                   (float(row["baseline_max_mean_gap_sd"]), float(row["max_mean_gap_sd"])),
                   (float(row["baseline_linear_probe_auc"]), float(row["linear_probe_auc"])))


def faces_figure(model, store, out, n: int = DEFAULT_FACES, *, overwrite: bool = False,
                 note: str | None = None, evidence: Evidence | None = None) -> Path:
    """Write a PNG: ``n`` faces with and ``n`` without the model's first protected attribute
    (read from the store's ``attributes``), as stored and rebuilt, under a title and over a
    caption that say what fair PCA does and does not do.

    For a fair model the rows are the originals, the full fair projection (fair PCA at its
    largest k: only the group-mean directions removed), fair PCA at the model's k, and
    what the full projection changed in each face (fair minus original, on a colour scale,
    the largest change printed).  Below them, the group mean faces of the fitted data and
    of the fair reconstructions, in their own panel (after fair PCA the means coincide),
    and with ``evidence`` (:class:`Evidence`: held-out faces) a chart of the linear probe's
    AUC and the group-mean gap per method.  For PCA only the originals and reconstructions.

    ``note``: a line printed under the title.  ``overwrite=True`` replaces a picture
    dfairpca drew at ``out``, never another file; the PNG is written whole or not at all
    (:func:`dfairpca.io.atomic_file`).
    """
    check_target(out, FIGURE_KIND, overwrite=overwrite)  # before any face is read
    fig = faces_picture(model, store, n, note=note, evidence=evidence)
    out = Path(out)
    with atomic_file(out, FIGURE_KIND, overwrite=overwrite) as tmp:
        # the PNG carries dfairpca's marker as a text chunk, so that only it may be replaced
        fig.savefig(tmp, format="png", dpi=DPI,
                    metadata={MARKER_KEY: json.dumps(marker(FIGURE_KIND))})
    return out


def faces_picture(model, store, n: int = DEFAULT_FACES, *, note: str | None = None,
                  evidence: Evidence | None = None):
    """The :class:`matplotlib.figure.Figure` that :func:`faces_figure` writes (same
    arguments), drawn on the Agg canvas."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

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
    k = model.n_components_
    rebuilt = model.inverse_transform(model.transform(X))
    panels = [("original faces", X)]
    change = None
    if fair:
        full = full_fair_projection(model, X)
        # the row captions say in words what each row is: a reader of the picture alone
        # cannot know what "k = 6399" (the largest k) means
        if k < model.max_components_:
            panels.append(("full fair projection:\nonly the group-mean\ndirection removed", full))
            panels.append((f"fair PCA, k = {k}:\nrebuilt from the\nrepresentation", rebuilt))
        else:  # the model is the full projection: one row, not two equal ones
            panels.append((f"fair PCA, k = {k}\n(the largest: only the\ngroup-mean direction\nremoved)", full))
        change = full - X
    else:
        panels.append((f"PCA, k = {k}:\nrebuilt from the\nrepresentation", rebuilt))

    ncols = len(rows)
    height, width = face[:2]
    face_in = FACE_INCHES * height / width  # one face's height
    n_face_rows = len(panels) + (change is not None)
    faces_h = n_face_rows * (face_in + 0.2) + 0.4
    bottom_h = BOTTOM_INCHES if fair else 0.0
    caption_h = CAPTION_INCHES if fair else 0.0
    fig_w = max(FACE_INCHES * ncols + LABEL_INCHES, MIN_WIDTH_INCHES if fair else 0.0)
    fig = Figure(figsize=(fig_w, faces_h + bottom_h + caption_h + TITLE_INCHES), layout="constrained")
    FigureCanvasAgg(fig)  # draws and saves without pyplot or a backend switch
    heights = [faces_h] + ([bottom_h, caption_h] if fair else [])
    subs = fig.subfigures(len(heights), 1, height_ratios=heights, squeeze=False)[:, 0]
    axes = subs[0].subplots(n_face_rows, ncols, squeeze=False)
    draw_faces(axes, panels, height, width, color=len(face) == 3)
    for r in range(len(panels)):
        axes[r, 0].yaxis.label.set(rotation=0, ha="right", va="center", fontsize=9)
    if change is None:  # PCA
        fig.suptitle(f"PCA with k = {k}: original faces and their reconstructions"
                     + (f"\n{note}" if note else ""), fontsize=12)
        return fig

    n_with = int((flags[rows] == 1).sum())
    axes[0, 0].set_title(f"with {name}", fontsize=10, loc="left", fontweight="bold")
    if n_with < ncols:
        axes[0, n_with].set_title(f"without {name}", fontsize=10, loc="left", fontweight="bold")
    _change_row(fig, axes[-1], change, face)
    bottom = subs[1].subfigures(1, 2, width_ratios=[1.1, 1.0] if evidence is not None else [1.0, 0.001])
    _group_means_panel(bottom[0], model, face, name)
    if evidence is not None:
        _evidence_panel(bottom[1], evidence, name)
    _caption(subs[2], name, k, fig_w, evidence is not None)
    fig.suptitle(f'Fair PCA with k = {k} on faces with and without "{name}": equal group means'
                 + (f"\n{note}" if note else ""), fontsize=13, fontweight="bold")
    return fig


def _plane(img: np.ndarray, face: tuple) -> np.ndarray:
    """A face's values as one plane: a colour image's mean over its channels."""
    return img.reshape(face).reshape(*face[:2], -1).mean(axis=-1)


def _change_row(fig, axes, change: np.ndarray, face: tuple) -> None:
    """The last face row: each face's change under the full fair projection, on one
    symmetric colour scale with its bar, the largest change in the row's caption."""
    planes = [_plane(c, face) for c in change]
    largest = max(float(np.abs(change).max()), 1e-9)
    for ax, plane in zip(axes, planes):
        im = ax.imshow(plane, cmap="RdBu_r", vmin=-largest, vmax=largest)
        ax.set_xticks([]), ax.set_yticks([])
    axes[0].set_ylabel(f"fair minus original\n(full projection);\nlargest change\n{largest:.0f} grey levels",
                       rotation=0, ha="right", va="center", fontsize=9)
    bar = fig.colorbar(im, ax=list(axes), shrink=0.9, pad=0.01, aspect=12)
    bar.set_label("grey levels", fontsize=8)
    bar.ax.tick_params(labelsize=7)


def _group_means_panel(sub, model, face, name) -> None:
    """Group mean faces of the fitted data and of the fair reconstructions, with their
    differences on one colour scale: the data's differ, the fair ones' coincide."""
    cats = list(model.groups_[0])
    gm = model.group_means_[0]
    i1 = cats.index(1) if 1 in cats else len(cats) - 1
    i0 = cats.index(0) if 0 in cats else 0
    before = gm[[i1, i0]]
    after = model.inverse_transform(model.transform(before))
    axes = sub.subplots(2, 3)
    lim = max(float(np.abs(before[0] - before[1]).max()), 1e-9)
    for r, (label, (a, b)) in enumerate([("fitted faces", before),
                                         (f"fair PCA,\nk = {model.n_components_}", after)]):
        _show_face(axes[r, 0], a, face)
        _show_face(axes[r, 1], b, face)
        im = axes[r, 2].imshow(_plane(a - b, face), cmap="RdBu_r", vmin=-lim, vmax=lim)
        gap = float(np.abs(a - b).max())
        axes[r, 2].set_title(f"with minus without\n(largest {gap:.2g})", fontsize=8)
        axes[r, 0].set_title(f"mean, with {name}", fontsize=8)
        axes[r, 1].set_title("mean, without", fontsize=8)
        axes[r, 0].set_ylabel(label, rotation=0, ha="right", va="center", fontsize=9)
        for ax in axes[r]:
            ax.set_xticks([]), ax.set_yticks([])
    bar = sub.colorbar(im, ax=list(axes[:, 2]), shrink=0.8, pad=0.02, aspect=15)
    bar.set_label("grey levels", fontsize=8)
    bar.ax.tick_params(labelsize=7)
    sub.suptitle("Group mean faces", fontsize=11, fontweight="bold")


#: the bars' colours per method, in the order of :class:`Evidence`'s methods
BAR_COLOURS = ("#7f7f7f", "#1f77b4", "#2ca02c", "#9467bd")


def _evidence_panel(sub, evidence: Evidence, name) -> None:
    """Two bar charts: the linear probe's AUC (0.5 dashed: chance) and the largest
    group-mean gap in SD, per method, on held-out faces."""
    axes = sub.subplots(1, 2)
    colours = [BAR_COLOURS[i % len(BAR_COLOURS)] for i in range(len(evidence.methods))]
    y = np.arange(len(evidence.methods))
    for ax, values, title, fmt in [
            (axes[0], evidence.auc, f"linear probe AUC (dashed: chance):\ncan a read-out tell {name}?", "{:.2f}"),
            (axes[1], evidence.gap_sd, "group-mean gap\n(largest, in SD)", "{:.2g}")]:
        ax.barh(y, values, color=colours)
        ax.set_yticks(y, evidence.methods, fontsize=9)
        ax.invert_yaxis()
        ax.set_title(title, fontsize=9)
        ax.tick_params(axis="x", labelsize=7)
        top = max(max(values), 1e-9)
        for yi, v in zip(y, values):
            ax.text(v + 0.02 * top, yi, fmt.format(v), va="center", fontsize=8)
        ax.set_xlim(0, top * 1.3)
        for side in ("top", "right"):
            ax.spines[side].set_visible(False)
    axes[0].set_xlim(0, 1.15)
    axes[0].axvline(0.5, color="k", linestyle="--", linewidth=0.8)
    axes[1].set_yticklabels([])
    sub.suptitle(f"On {evidence.faces:,} held-out faces", fontsize=11, fontweight="bold")


def _caption(sub, name, k, width_in: float, held_out: bool) -> None:
    """What fair PCA does and does not do, wrapped to the picture's width; ``held_out``:
    the picture has the chart of new faces."""
    import textwrap

    new_faces = ("; on new faces (right) the gap is sampling noise and what the fitted faces "
                 "did not cover: compare it and the probe's AUC with PCA's (0 and 0.5: no "
                 "difference)") if held_out else ""
    text = (f"What fair PCA does: it keeps the k = {k} directions of most variance among those "
            f"that give faces with and without {name} the same mean. On the faces it was fitted on "
            "the two group means are then equal (bottom left), so no linear read-out of the "
            f"representation tells the groups apart on average{new_faces}. What it does not do: "
            f"remove {name} from every face. Single faces may still show {name}: the full "
            "projection subtracts one pattern (the mean difference) from every face, lightening "
            "it where the group with it is dark and adding a trace to faces without.")
    chars = max(60, int(width_in * 15))  # about 15 characters per inch at 9 points
    sub.text(0.5, 0.5, textwrap.fill(text, chars), ha="center", va="center", fontsize=9,
             wrap=False, transform=sub.transSubfigure)


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
