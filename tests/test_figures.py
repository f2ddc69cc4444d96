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
