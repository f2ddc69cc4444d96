"""Pictures of fair faces, after the paper's Figure 5 and App. C.6.

The figure is built on a :class:`matplotlib.figure.Figure` and drawn by the Agg canvas
directly: pyplot is never imported, so a notebook's or a GUI's backend is left as it was.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from statistics import NormalDist
import textwrap

import numpy as np

from ..io import MARKER_KEY, atomic_file, check_target, marker, register_marked_file
from .schema import DEFAULT_FACES, attribute_column, open_celeba
from ..errors import InvalidInputError

# Deferred imports: PIL, matplotlib (heavy or optional) are imported in the functions that use them,
# so that importing this module stays light.

__all__ = ["DEFAULT_FACES", "MAX_FACES_PER_ROW", "Evidence", "auc_interval", "draw_faces", "faces_figure",
           "faces_held", "faces_picture", "full_fair_projection"]

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
#: heights of the group means and evidence panel, the caption and the title: the group
#: mean faces drawn about as large as the faces above, the caption at :data:`CAPTION_POINTS`
BOTTOM_INCHES = 4.8
CAPTION_INCHES = 1.3
TITLE_INCHES = 0.6
#: the caption's font size: at :data:`DPI` a line is about 18 pixels high, read at 100% zoom
CAPTION_POINTS = 12
#: the smallest text of the picture (labels, titles, bar values), about 15 pixels high
TEXT_POINTS = 10
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


def auc_interval(auc: float, positives: int, negatives: int, alpha: float = 0.05) -> tuple[float, float]:
    """A (1 - alpha) interval of a ROC AUC measured on ``positives`` and ``negatives`` rows:
    ``auc +- z * se`` with Hanley and McNeil's (1982) standard error, clipped to [0, 1].

    The formula assumes exponentially distributed scores; for normal ones it is up to a
    fifth too wide.  For a cross-validated AUC (the mean over folds whose test rows together
    are every row) it covers the sampling of the rows, not the spread of the fitted probes,
    which a bootstrap that refits them would add.  NaN bounds for a NaN AUC or an empty
    group."""
    if not (auc == auc and positives > 0 and negatives > 0):
        return float("nan"), float("nan")
    a = float(auc)
    q1, q2 = a / (2 - a), 2 * a * a / (1 + a)
    var = (a * (1 - a) + (positives - 1) * (q1 - a * a) + (negatives - 1) * (q2 - a * a)) / (
        positives * negatives)
    half = NormalDist().inv_cdf(1 - alpha / 2) * math.sqrt(max(var, 0.0))
    return max(0.0, a - half), min(1.0, a + half)


@dataclasses.dataclass(frozen=True)
class Evidence:
    """What a fairness report measured on faces a model never saw, for the picture's chart:
    per method (``"PCA"``, ``"fair PCA"``, an eraser), the largest group-mean gap of its
    representation in standard deviations and a linear probe's AUC (0.5 is chance), each
    with its (1 - ``alpha``) interval where known (drawn as error bars; NaN: unknown)."""

    faces: int  #: held-out faces the figures come from
    methods: tuple[str, ...]
    gap_sd: tuple[float, ...]
    auc: tuple[float, ...]
    #: per method (lower, upper): the report's simultaneous bounds of the gap
    gap_interval: tuple[tuple[float, float], ...] | None = None
    #: per method (lower, upper): :func:`auc_interval` of the probe's AUC
    auc_interval: tuple[tuple[float, float], ...] | None = None
    #: held-out faces with the attribute, or None
    with_attribute: int | None = None
    alpha: float = 0.05

    @classmethod
    def from_report(cls, row, faces: int, label: str = "fair PCA",
                    baseline: str = "PCA", *, with_attribute: int | None = None,
                    alpha: float = 0.05) -> Evidence:
        """From a row of :func:`dfairpca.metrics.fairness_report` with a ``baseline``
        (run at ``alpha``): the gaps' bounds are the report's; ``with_attribute`` (of the
        ``faces``) gives the probe's AUC its interval (:func:`auc_interval`, on the
        report's ``probe_rows``; a sample of them is taken to hold the same share)."""
        prefixes = ("baseline_", "")
        gaps = tuple((float(row[p + "max_mean_gap_sd_lower"]), float(row[p + "max_mean_gap_sd_upper"]))
                     for p in prefixes)
        aucs = (float(row["baseline_linear_probe_auc"]), float(row["linear_probe_auc"]))
        auc_bounds = None
        if with_attribute is not None:
            rows = int(row.get("probe_rows", faces))
            positives = round(with_attribute * rows / faces)
            auc_bounds = tuple(auc_interval(a, positives, rows - positives, alpha) for a in aucs)
        return cls(faces, (baseline, label),
                   (float(row["baseline_max_mean_gap_sd"]), float(row["max_mean_gap_sd"])), aucs,
                   gap_interval=gaps, auc_interval=auc_bounds, with_attribute=with_attribute,
                   alpha=alpha)


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
        axes[r, 0].yaxis.label.set(rotation=0, ha="right", va="center", fontsize=TEXT_POINTS)
    fitted = getattr(model, "n_samples_seen_", None)
    fitted_on = f", fitted on {fitted:,} faces" if fitted else ""
    if change is None:  # PCA
        fig.suptitle(f"PCA with k = {k}{fitted_on}: original faces and their reconstructions"
                     + (f"\n{note}" if note else ""), fontsize=13)
        return fig

    n_with = int((flags[rows] == 1).sum())
    axes[0, 0].set_title(f"with {name}", fontsize=TEXT_POINTS + 1, loc="left", fontweight="bold")
    if n_with < ncols:
        axes[0, n_with].set_title(f"without {name}", fontsize=TEXT_POINTS + 1, loc="left",
                                  fontweight="bold")
    _change_row(fig, axes[-1], change, face)
    means = _group_means(model)
    bottom = subs[1].subfigures(1, 2, width_ratios=[1.25, 1.0] if evidence is not None else [1.0, 0.001])
    _group_means_panel(bottom[0], model, face, name, means, fitted)
    if evidence is not None:
        _evidence_panel(bottom[1], evidence, name)
    _caption(subs[2], name, fig_w, _gap(means[0]), _gap(means[1]), fitted, evidence)
    fig.suptitle(f'Fair PCA with k = {k} on faces with and without "{name}"{fitted_on}: '
                 f"equal group means, not {name} removed from each face"
                 + (f"\n{note}" if note else ""), fontsize=14, fontweight="bold")
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
    # red is lighter: a face whose lenses were darker than the group's mean face there is
    # lightened the most, and can end brighter than it was dark
    axes[0].set_ylabel(f"fair minus original\n(full projection;\nred: lighter after)\nlargest change\n"
                       f"{largest:.0f} grey levels",
                       rotation=0, ha="right", va="center", fontsize=TEXT_POINTS)
    bar = fig.colorbar(im, ax=list(axes), shrink=0.9, pad=0.01, aspect=12)
    bar.set_label("grey levels", fontsize=TEXT_POINTS)
    bar.ax.tick_params(labelsize=TEXT_POINTS - 1)


def _group_means(model) -> tuple[np.ndarray, np.ndarray]:
    """The mean faces of the first attribute's groups (with, then without) in the fitted
    data, and the same after fair PCA at the model's k: two ``(2, d)`` arrays."""
    cats = list(model.groups_[0])
    gm = model.group_means_[0]
    i1 = cats.index(1) if 1 in cats else len(cats) - 1
    i0 = cats.index(0) if 0 in cats else 0
    before = gm[[i1, i0]]
    return before, model.inverse_transform(model.transform(before))


def _gap(means) -> float:
    """The largest difference, in grey levels, between two mean faces (rows of ``means``)."""
    return float(np.abs(means[0] - means[1]).max())


def _group_means_panel(sub, model, face, name, means, fitted: int | None) -> None:
    """Group mean faces of the fitted data and of the fair reconstructions, with their
    differences on one colour scale: the data's differ, the fair ones' coincide."""
    axes = sub.subplots(2, 3)
    lim = max(_gap(means[0]), 1e-9)
    for r, (label, (a, b)) in enumerate([("fitted faces", means[0]),
                                         (f"after fair PCA:\nrebuilt at\nk = {model.n_components_}", means[1])]):
        _show_face(axes[r, 0], a, face)
        _show_face(axes[r, 1], b, face)
        im = axes[r, 2].imshow(_plane(a - b, face), cmap="RdBu_r", vmin=-lim, vmax=lim)
        axes[r, 2].set_title(f"with minus without:\nlargest {_gap((a, b)):.2g}", fontsize=TEXT_POINTS)
        axes[r, 0].set_title(f"with {name}", fontsize=TEXT_POINTS)
        axes[r, 1].set_title(f"without {name}", fontsize=TEXT_POINTS)
        axes[r, 0].set_ylabel(label, rotation=0, ha="right", va="center", fontsize=TEXT_POINTS)
        for ax in axes[r]:
            ax.set_xticks([]), ax.set_yticks([])
    bar = sub.colorbar(im, ax=list(axes[:, 2]), shrink=0.8, pad=0.02, aspect=15)
    bar.set_label("grey levels", fontsize=TEXT_POINTS)
    bar.ax.tick_params(labelsize=TEXT_POINTS - 1)
    sub.suptitle("Group mean faces" + (f" of the {fitted:,} fitted faces" if fitted else ""),
                 fontsize=TEXT_POINTS + 2, fontweight="bold")


#: the bars' colours per method, in the order of :class:`Evidence`'s methods
BAR_COLOURS = ("#7f7f7f", "#1f77b4", "#2ca02c", "#9467bd")


def _bounds(values, intervals) -> tuple[np.ndarray, np.ndarray]:
    """Lower and upper bounds per value (NaN where unknown), as arrays."""
    if intervals is None:
        nan = np.full(len(values), np.nan)
        return nan, nan
    return np.array([lo for lo, _ in intervals], float), np.array([up for _, up in intervals], float)


def _evidence_panel(sub, evidence: Evidence, name) -> None:
    """Two bar charts: the linear probe's AUC (0.5 dashed: chance) and the largest
    group-mean gap in SD, per method, on held-out faces, each with its interval as an
    error bar and in words beside the bar."""
    axes = sub.subplots(1, 2)
    colours = [BAR_COLOURS[i % len(BAR_COLOURS)] for i in range(len(evidence.methods))]
    y = np.arange(len(evidence.methods))
    level = f"{100 * (1 - evidence.alpha):g}%"
    for ax, values, intervals, title, fmt, right in [
            (axes[0], evidence.auc, evidence.auc_interval,
             f"linear probe AUC (logistic regression,\ncross-validated): can it tell {name}?", "{:.2f}", 1.0),
            (axes[1], evidence.gap_sd, evidence.gap_interval,
             "group-mean gap: largest over the\ncomponents, in each one's SD", "{:.2f}", None)]:
        heights = np.asarray(values, float)
        lower, upper = _bounds(heights, intervals)
        known = np.isfinite(lower) & np.isfinite(upper)
        top = max(float(np.nanmax(np.where(known, upper, heights))), 1e-9) if right is None else right
        ax.barh(y, heights, color=colours)
        if known.any():  # whiskers from the interval's bounds; an unbounded one is left out
            err = np.vstack([heights - lower, upper - heights])[:, known]
            ax.errorbar(heights[known], y[known], xerr=np.clip(err, 0, None), fmt="none", ecolor="k",
                        elinewidth=1.5, capsize=6)
        ax.set_yticks(y, evidence.methods, fontsize=TEXT_POINTS)
        ax.invert_yaxis()
        ax.set_title(title, fontsize=TEXT_POINTS + 1)
        ax.tick_params(axis="x", labelsize=TEXT_POINTS - 1)
        for yi, v, lo, up, ok in zip(y, heights, lower, upper, known):
            words = fmt.format(v) + (f"\n({fmt.format(lo)} to {fmt.format(up)})" if ok else "")
            ax.text((up if ok else v) + 0.03 * top, yi, words, va="center", fontsize=TEXT_POINTS)
        ax.set_xlim(0, top * 1.55)
        if right is not None:  # an AUC: no ticks past 1
            ax.set_xticks(np.linspace(0, right, 5))
        for side in ("top", "right"):
            ax.spines[side].set_visible(False)
    axes[0].axvline(0.5, color="k", linestyle="--", linewidth=0.8)
    axes[0].set_xlabel("0.5 (dashed): chance", fontsize=TEXT_POINTS)
    axes[1].set_yticklabels([])
    if evidence.gap_interval is not None or evidence.auc_interval is not None:
        axes[1].set_xlabel(f"bars: {level} intervals", fontsize=TEXT_POINTS)
    of_them = (f" ({evidence.with_attribute:,} with {name})" if evidence.with_attribute is not None
               else "")
    sub.suptitle(f"On {evidence.faces:,} held-out faces{of_them}", fontsize=TEXT_POINTS + 2,
                 fontweight="bold")


def _caption(sub, name, width_in: float, before: float, after: float, fitted: int | None,
             evidence: Evidence | None) -> None:
    """What fair PCA does not do first, then what it does on the fitted faces and, with
    ``evidence``, on new ones, wrapped to the picture's width."""
    on_fitted = f"the {fitted:,} fitted faces" if fitted else "the fitted faces"
    where = " at the lenses" if name == "Eyeglasses" else " where the group means differ"
    text = (f"Fair PCA does not remove {name} from each face: it takes the difference of the two "
            "groups' mean faces out of every face, as much as each face has of it, so a face "
            f"darker than the average face{where} gets brighter there. What it does: on "
            f"{on_fitted} the group means become equal (largest difference {after:.2g} grey "
            f"levels, from {before:.0f}).")
    if evidence is not None and len(evidence.methods) == 2:
        (base_auc, auc), (base_gap, gap) = evidence.auc, evidence.gap_sd
        level = f"{100 * (1 - evidence.alpha):g}%"

        def within(i, intervals, unit=""):
            if intervals is None or not all(map(math.isfinite, intervals[i])):
                return ""
            return f"{intervals[i][0]:.2f} to {intervals[i][1]:.2f}{unit}"

        auc_in, gap_in = within(1, evidence.auc_interval), within(1, evidence.gap_interval, " SD")
        text += (f" On {evidence.faces:,} new faces a linear probe's AUC falls from {base_auc:.2f} to "
                 f"{auc:.2f} ({f'{level} interval {auc_in}; ' if auc_in else ''}0.5 is chance), the "
                 f"group-mean gap from {base_gap:.2f} to {gap:.2f} SD" + (f" ({gap_in})." if gap_in else "."))
    chars = max(50, int(width_in * 11))  # about 11 characters per inch at 12 points
    sub.text(0.5, 0.5, textwrap.fill(text, chars), ha="center", va="center", fontsize=CAPTION_POINTS,
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
