"""Tests of dfairpca.celeba.figures: the paper's Figure 5 from a model and a CelebA store."""

from __future__ import annotations


import numpy as np
import pandas as pd
import pytest
from PIL import Image

import dfairpca
from dfairpca.celeba import attribute_column, faces_figure, open_celeba, synth_celeba
from dfairpca.celeba.figures import MAX_FACES_PER_ROW, faces_held, full_fair_projection
from dfairpca.io import OutputPathError, read_marker


@pytest.fixture(scope="module")
def faces(tmp_path_factory):
    """A store of 200 8 x 8 faces, a fair model of it (Eyeglasses) and a PCA model."""
    store = synth_celeba(tmp_path_factory.mktemp("fig") / "faces.zarr", n=200, size=8,
                         chunk_rows=64, progress=False, n_jobs=1)
    X = open_celeba(store)[0][:].reshape(200, -1).astype(np.float64)
    z = attribute_column(store, "Eyeglasses")
    fair = dfairpca.FairPCA(3).fit(X, sensitive_features=pd.DataFrame({"Eyeglasses": z}))
    return store, X, z, fair, dfairpca.PCA(3).fit(X)


def test_full_fair_projection_equalises_the_group_means(faces):
    store, X, z, fair, _ = faces
    P = full_fair_projection(fair, X)
    gap = P[z == 1].mean(0) - P[z == 0].mean(0)
    assert np.abs(gap).max() < 1e-9 * np.abs(X).max()
    before = X[z == 1].mean(0) - X[z == 0].mean(0)
    assert np.abs(before).max() > 1  # there was a gap to remove
    # the projection keeps all but the constraint directions: applying it twice is once
    np.testing.assert_allclose(full_fair_projection(fair, P), P, atol=1e-9 * np.abs(X).max())


def test_faces_held_by_group_for_a_fair_model_and_by_half_for_pca(faces):
    store, _, z, fair, pca = faces
    assert faces_held(fair, store) == max(int(z.sum()), int((z == 0).sum()))
    assert faces_held(pca, store) == 100
    assert MAX_FACES_PER_ROW == 100


def test_the_picture_is_marked_written_whole_and_replaces_only_its_own(faces, tmp_path):
    store, _, _, fair, pca = faces
    png = tmp_path / "pictures" / "faces.png"  # its folder is made
    assert faces_figure(fair, store, png, n=1) == png
    assert read_marker(png)["kind"] == "figure"
    with Image.open(png) as im:
        assert im.format == "PNG" and im.size[0] > 2 * 100  # two faces, ~143 pixels each
    first = png.read_bytes()
    with pytest.raises(OutputPathError, match="overwrite=True"):
        faces_figure(pca, store, png, n=1)
    assert png.read_bytes() == first
    faces_figure(pca, store, png, n=1, overwrite=True)
    assert png.read_bytes() != first and read_marker(png)["kind"] == "figure"
    assert sorted(p.name for p in png.parent.iterdir()) == ["faces.png"]  # no temporary left

    mine = tmp_path / "mine.png"
    Image.new("L", (4, 4)).save(mine)
    with pytest.raises(OutputPathError, match="did not write"):
        faces_figure(fair, store, mine, overwrite=True)
    assert read_marker(mine) is None


def test_a_model_of_another_image_size_is_refused_before_drawing(faces, tmp_path):
    store, _, _, _, _ = faces
    other = dfairpca.PCA(2).fit(np.random.default_rng(0).normal(size=(50, 16 * 16)))
    with pytest.raises(ValueError, match="256 features but the store's images are 8x8"):
        faces_figure(other, store, tmp_path / "x.png")
    assert not (tmp_path / "x.png").exists()


def _overlaps(a, b, tolerance: float = 1.0) -> bool:
    """Whether two display-space boxes overlap by more than ``tolerance`` pixels."""
    return (min(a.x1, b.x1) - max(a.x0, b.x0) > tolerance
            and min(a.y1, b.y1) - max(a.y0, b.y0) > tolerance)


def _text_on_other_axes(fig) -> list[str]:
    """Every visible text of ``fig`` (titles, row captions, the caption, bar labels) that
    lies on an axes other than its own: a caption over a row of faces."""
    from matplotlib.text import Text

    renderer = fig.canvas.get_renderer()
    axes = [ax for ax in fig.get_axes() if ax.get_visible()]
    boxes = {ax: ax.get_window_extent(renderer) for ax in axes}
    found = []
    for text in fig.findobj(Text):
        if not text.get_visible() or not text.get_text().strip():
            continue
        box = text.get_window_extent(renderer)
        for ax in axes:
            if ax is not text.axes and _overlaps(box, boxes[ax]):
                found.append(f"{text.get_text()!r} on {ax.get_title() or ax.get_ylabel() or ax}")
    return found


@pytest.fixture(scope="module")
def evidence(faces):
    """A real fairness report of the fair model on freshly drawn faces, as the chart's."""
    from dfairpca.celeba.figures import Evidence
    from dfairpca.metrics import fairness_report

    store, X, z, fair, pca = faces
    rng = np.random.default_rng(1)
    row = fairness_report(fair, X + rng.normal(0, 2, X.shape), pd.DataFrame({"Eyeglasses": z}),
                          baseline=pca, random_state=0).iloc[0]
    return Evidence.from_report(row, len(X), with_attribute=int(z.sum()))


def test_evidence_reads_a_fairness_report_row(faces, evidence):
    assert evidence.methods == ("PCA", "fair PCA") and evidence.faces == 200
    assert all(0 <= auc <= 1 for auc in evidence.auc) and all(gap >= 0 for gap in evidence.gap_sd)
    # fair PCA's representation has the smaller group-mean gap: what the chart shows
    assert evidence.gap_sd[1] < evidence.gap_sd[0]
    # each figure lies in its interval: the report's bounds of the gap, and the AUC's
    for values, bounds in ((evidence.gap_sd, evidence.gap_interval), (evidence.auc, evidence.auc_interval)):
        assert all(lo <= v <= up and lo < up for v, (lo, up) in zip(values, bounds)), (values, bounds)
    _, _, z, _, _ = faces
    assert evidence.with_attribute == int(z.sum()) > 0
    from dfairpca.celeba.figures import Evidence

    bare = Evidence(200, ("PCA", "fair PCA"), (1.0, 0.1), (0.9, 0.55))  # no intervals: still a chart
    assert bare.gap_interval is None and bare.auc_interval is None and bare.alpha == 0.05


def test_the_auc_interval_has_the_spread_of_auc_over_samples():
    """Hanley and McNeil's standard error against the spread of the AUC over 2,000 samples
    of 40 positive and 400 negative scores (binormal, AUC about 0.76), and its value at AUC
    0.8 with 50 and 50 (0.0445, by hand from their formula)."""
    from sklearn.metrics import roc_auc_score

    from dfairpca.celeba.figures import auc_interval

    lo, up = auc_interval(0.8, 50, 50)
    assert up - lo == pytest.approx(2 * 1.959964 * 0.04450, rel=2e-3)
    rng = np.random.default_rng(0)
    labels = np.r_[np.ones(40), np.zeros(400)]
    aucs = np.array([roc_auc_score(labels, np.r_[rng.normal(1.0, 1, 40), rng.normal(0, 1, 400)])
                     for _ in range(2000)])
    lo, up = auc_interval(float(aucs.mean()), 40, 400)
    # the formula assumes exponential scores: for binormal ones it is a little wide, never narrow
    assert 1.0 < (up - lo) / (2 * 1.959964) / aucs.std() < 1.25
    assert 0.95 < np.mean((aucs >= lo) & (aucs <= up)) < 0.995
    assert auc_interval(0.999, 5, 5)[1] == 1.0  # clipped to [0, 1]
    assert all(b != b for b in auc_interval(float("nan"), 5, 5) + auc_interval(0.7, 0, 5))


def test_the_fair_picture_has_its_rows_panels_chart_and_caption_apart(faces, evidence):
    """Four face rows (originals, full projection, fair PCA at k, fair minus original with
    a colour bar and its largest change), the group means in their own titled panel, the
    evidence as bar charts, a title and a caption that says what fair PCA does not do;
    no text lies on another axes (the old captions sat under the row above)."""
    from dfairpca.celeba.figures import faces_picture

    store, X, z, fair, _ = faces
    fig = faces_picture(fair, store, 4, evidence=evidence)
    fig.canvas.draw()
    assert _text_on_other_axes(fig) == []
    labels = [ax.get_ylabel() for ax in fig.get_axes() if ax.get_ylabel()]
    assert labels[0] == "original faces" and labels[1].startswith("full fair projection")
    assert labels[2].startswith("fair PCA, k = 3") and labels[3].startswith("fair minus original")
    change = full_fair_projection(fair, X[np.r_[np.flatnonzero(z == 1)[:4], np.flatnonzero(z == 0)[:4]]])
    assert "largest change" in labels[3] and labels[3].rstrip().endswith("grey levels")
    texts = [t.get_text() for t in fig.findobj(lambda a: hasattr(a, "get_text"))]
    assert any(t == "Group mean faces of the 200 fitted faces" for t in texts)
    assert any(t == f"On 200 held-out faces ({int(z.sum())} with Eyeglasses)" for t in texts)
    # what it does not do comes first, then what it does, with the numbers the picture shows
    caption = " ".join(next(t for t in texts if t.startswith("Fair PCA does not remove")).split())
    assert caption.startswith("Fair PCA does not remove Eyeglasses from each face")
    assert "darker than the average face at the lenses gets brighter there" in caption
    assert "on the 200 fitted faces the group means become equal" in caption
    (lo, up), auc = evidence.auc_interval[1], evidence.auc[1]
    assert f"On 200 new faces a linear probe's AUC falls from {evidence.auc[0]:.2f} to {auc:.2f} " \
           f"(95% interval {lo:.2f} to {up:.2f}; 0.5 is chance)" in caption
    (lo, up), gap = evidence.gap_interval[1], evidence.gap_sd[1]
    assert caption.endswith(f"to {gap:.2f} SD ({lo:.2f} to {up:.2f} SD).")
    assert any(t.startswith('Fair PCA with k = 3 on faces with and without "Eyeglasses", fitted on 200 faces')
               for t in texts)
    bars = [ax for ax in fig.get_axes() if ax.patches]
    assert len(bars) == 2 and all(len(ax.patches) == 2 for ax in bars)  # AUC and gap, 2 methods
    from matplotlib.container import ErrorbarContainer

    # each bar has its interval as an error bar, and in words beside it
    assert all(any(isinstance(c, ErrorbarContainer) for c in ax.containers) for ax in bars)
    assert f"{gap:.2f}\n({lo:.2f} to {up:.2f})" in texts
    colour_bars = [ax for ax in fig.get_axes() if ax.get_ylabel() == "grey levels"]
    assert len(colour_bars) == 2  # the change row's and the group means' differences
    assert change.shape == (8, 64)


def test_the_picture_is_large_enough_to_judge_a_face(faces, evidence, tmp_path):
    store, _, _, fair, pca = faces
    from dfairpca.celeba.figures import DEFAULT_FACES, DPI, FACE_INCHES

    assert DEFAULT_FACES == 4  # 4 faces with and 4 without
    png = faces_figure(fair, store, tmp_path / "f.png", evidence=evidence)
    with Image.open(png) as im:
        assert im.size[0] >= 2 * DEFAULT_FACES * FACE_INCHES * DPI  # about 200 pixels a face
    # without held-out figures there is no chart, the rest stands; PCA has no fair rows
    from dfairpca.celeba.figures import faces_picture

    fig = faces_picture(fair, store, 2)
    fig.canvas.draw()
    assert not [ax for ax in fig.get_axes() if ax.patches] and _text_on_other_axes(fig) == []
    fig = faces_picture(pca, store, 2)
    fig.canvas.draw()
    assert [ax.get_ylabel() for ax in fig.get_axes() if ax.get_ylabel()][0] == "original faces"
    assert _text_on_other_axes(fig) == []


def test_a_model_at_the_largest_k_draws_one_fair_row_not_two_equal_ones(faces):
    from dfairpca.celeba.figures import faces_picture

    store, X, z, _, _ = faces
    full = dfairpca.FairPCA(X.shape[1] - 1).fit(X, sensitive_features=pd.DataFrame({"Eyeglasses": z}))
    assert full.n_components_ == full.max_components_
    fig = faces_picture(full, store, 2)
    labels = [ax.get_ylabel() for ax in fig.get_axes() if ax.get_ylabel()]
    assert labels[1].startswith(f"fair PCA, k = {full.n_components_}\n(the largest")
    assert labels[2].startswith("fair minus original")


def test_the_text_and_the_group_mean_faces_are_large_enough_to_read(faces, evidence):
    """At 100% zoom: no text under 9 points (15 pixels at the picture's DPI for most), the
    caption at 12, and the group mean faces at least three quarters as tall as the faces."""
    from matplotlib.text import Text

    from dfairpca.celeba.figures import CAPTION_POINTS, TEXT_POINTS, faces_picture

    store, _, _, fair, _ = faces
    fig = faces_picture(fair, store, 4, evidence=evidence)
    fig.canvas.draw()
    texts = [t for t in fig.findobj(Text) if t.get_visible() and t.get_text().strip()]
    assert min(t.get_fontsize() for t in texts) >= TEXT_POINTS - 1 >= 9
    caption = next(t for t in texts if t.get_text().startswith("Fair PCA does not remove"))
    assert caption.get_fontsize() == CAPTION_POINTS >= 12
    renderer = fig.canvas.get_renderer()
    face = next(ax for ax in fig.get_axes() if ax.get_ylabel() == "original faces")
    means = [ax for ax in fig.get_axes() if ax.get_title() in ("with Eyeglasses", "without Eyeglasses")]
    assert len(means) == 4
    height = face.get_window_extent(renderer).height
    assert all(ax.get_window_extent(renderer).height >= 0.75 * height for ax in means)
