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
    return Evidence.from_report(row, len(X))


def test_evidence_reads_a_fairness_report_row(faces, evidence):
    assert evidence.methods == ("PCA", "fair PCA") and evidence.faces == 200
    assert all(0 <= auc <= 1 for auc in evidence.auc) and all(gap >= 0 for gap in evidence.gap_sd)
    # fair PCA's representation has the smaller group-mean gap: what the chart shows
    assert evidence.gap_sd[1] < evidence.gap_sd[0]


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
    assert any(t == "Group mean faces" for t in texts)
    assert any(t == "On 200 held-out faces" for t in texts)
    caption = next(t for t in texts if t.startswith("What fair PCA does"))
    assert "What it does not do: remove Eyeglasses from every face" in caption.replace("\n", " ")
    assert any(t.startswith('Fair PCA with k = 3 on faces with and without "Eyeglasses"') for t in texts)
    bars = [ax for ax in fig.get_axes() if ax.patches]
    assert len(bars) == 2 and all(len(ax.patches) == 2 for ax in bars)  # AUC and gap, 2 methods
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
