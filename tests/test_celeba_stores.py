"""Stores of any size, grey or colour: the schema, synthesis, the fabricated CelebA JPEGs,
ingest at full resolution, the readers and the colour picture (real Zarr stores, real JPEGs)."""

from __future__ import annotations

import hashlib

import dask.array as da
import numpy as np
import pandas as pd
import pytest
import zarr
from PIL import Image

import dfairpca
from dfairpca.celeba import (
    ATTRIBUTE_NAMES, faces_figure, ingest_celeba, open_celeba, synth_celeba, write_celeba_jpegs,
)
from dfairpca.celeba.ingest import decode_face
from dfairpca.celeba.schema import default_chunk_rows, read_images
from dfairpca.io import read_marker

LUMA = np.array([0.299, 0.587, 0.114])


def synth(path, **kwargs):
    return synth_celeba(path, **{"progress": False, "n_jobs": 1, **kwargs})


def test_grey_faces_are_the_ones_stores_always_held(tmp_path):
    """The colour and any-size renderer draws the grey stores of before byte for byte
    (these digests are of a store written by the renderer before it drew colour)."""
    images, attributes, _ = open_celeba(synth(tmp_path / "g.zarr", n=40, seed=3, size=24,
                                              chunk_rows=16))
    assert hashlib.sha256(images[:].tobytes()).hexdigest() == (
        "e92a6c3f092a4bd05ee38bdd77199d320c64ef5baf8df9695b87a6dc39702c46")
    assert hashlib.sha256(attributes[:].tobytes()).hexdigest() == (
        "925e97f4e3176279e3a45a6131973e1d00f2d3efb6e26abeb1e0ebb656c94c27")


def test_default_chunks_hold_at_most_64_mb():
    assert default_chunk_rows((80, 80)) == 2048  # the stores of before
    assert default_chunk_rows((218, 178, 3)) == 576  # 576 x 116,412 bytes = 64.0 MiB
    assert 576 * 218 * 178 * 3 <= 64 << 20 < 577 * 218 * 178 * 3


def test_colour_store_of_any_size(tmp_path):
    out = synth(tmp_path / "c.zarr", n=30, seed=2, size=(40, 32), color=True, chunk_rows=8)
    group = zarr.open_group(out, mode="r")
    attrs = {k: v for k, v in group.attrs.items() if k != "dfairpca"}
    assert attrs == {"source": "synthetic", "seed": 2, "size": [40, 32], "color": True}
    images, attributes, names = open_celeba(out)
    assert images.shape == (30, 40, 32, 3) and images.chunks == (8, 40, 32, 3)
    assert images.dtype == np.uint8 and attributes.shape == (30, 40)
    pixels = images[:].astype(float)
    assert np.abs(pixels[..., 0] - pixels[..., 2]).mean() > 10  # colour, not grey in 3
    face = pixels[:, 14:24, 11:21]  # the cheeks and nose: skin is warm
    assert face[..., 0].mean() > face[..., 1].mean() > face[..., 2].mean()


def test_colour_faces_are_the_grey_faces_in_colour(tmp_path):
    """Same seed: the colour faces' luminance is the grey faces (up to noise, clipping)."""
    kwargs = dict(n=64, seed=5, size=(48, 40), chunk_rows=64)
    grey = open_celeba(synth(tmp_path / "g.zarr", **kwargs))[0][:].astype(float)
    colour = open_celeba(synth(tmp_path / "c.zarr", color=True, **kwargs))[0][:].astype(float)
    assert np.corrcoef((colour @ LUMA).ravel(), grey.ravel())[0, 1] > 0.95


@pytest.mark.parametrize(("size", "color", "n", "patch"), [
    ((6, 5), True, 120, np.s_[:, :]),  # drawn at its own size: every feature
    ((218, 178), True, 400, np.s_[100:110, 84:94]),  # drawn at 109 x 89 and upsampled
])
def test_faces_are_full_rank(tmp_path, size, color, n, patch):
    """The per-pixel, per-channel noise makes every direction of the features vary: the
    centred (n, d) matrix of a patch of d < n features has rank d, upsampled or not."""
    images = open_celeba(synth(tmp_path / "s.zarr", n=n, size=size, color=color))[0][:]
    X = images[(slice(None), *patch)].reshape(n, -1).astype(float)
    d = X.shape[1]
    assert n > d and np.linalg.matrix_rank(X - X.mean(0)) == d


def test_upsampled_faces_get_their_noise_per_pixel(tmp_path):
    """With and without noise the same faces: the difference is noise of each pixel's own
    (neighbours uncorrelated), not noise drawn small and upsampled."""
    from dfairpca.celeba.render import draw_faces
    from dfairpca.celeba.sampling import sample_attributes

    faces = {}
    for noise in (0.0, 1.0):
        rng = np.random.default_rng(3)
        faces[noise] = draw_faces(rng, sample_attributes(rng, 8), (218, 178), color=True,
                                  noise=noise).astype(float)
    grain = (faces[1.0] - faces[0.0])[:, 20:200, 20:160]
    assert 2 < grain.std() < 12
    right = np.corrcoef(grain[:, :, :-1].ravel(), grain[:, :, 1:].ravel())[0, 1]
    below = np.corrcoef(grain[:, :-1].ravel(), grain[:, 1:].ravel())[0, 1]
    assert abs(right) < 0.05 and abs(below) < 0.05


def test_upsampled_faces_keep_their_features(tmp_path):
    """A face drawn at 109 x 89 and upsampled is the same face as one drawn at 218 x 178
    downsampled: the mean faces agree."""
    big = open_celeba(synth(tmp_path / "b.zarr", n=64, size=(218, 178), chunk_rows=64))[0][:]
    small = open_celeba(synth(tmp_path / "s.zarr", n=64, size=(109, 89), chunk_rows=64))[0][:]
    shrunk = big.astype(float).reshape(64, 109, 2, 89, 2).mean(axis=(2, 4))
    assert np.abs(shrunk.mean(0) - small.astype(float).mean(0)).mean() < 3


def test_readers_turn_colour_stores_into_rows_in_c_order(tmp_path):
    store = synth(tmp_path / "c.zarr", n=120, size=(10, 8), color=True, chunk_rows=50)
    X = read_images(store)
    assert X.shape == (120, 10, 8, 3) and isinstance(X, da.Array)
    flat = open_celeba(store)[0][:].reshape(120, -1).astype(np.float64)
    z = pd.DataFrame({"Eyeglasses": dfairpca.celeba.attribute_column(store, "Eyeglasses")})
    lazy = dfairpca.FairPCA(3).fit(X, sensitive_features=z)
    eager = dfairpca.FairPCA(3).fit(flat, sensitive_features=z)
    assert lazy.n_features_in_ == 240
    np.testing.assert_allclose(lazy.components_, eager.components_, atol=1e-6)  # float32 pass
    np.testing.assert_allclose(np.asarray(lazy.transform(X)), eager.transform(flat), rtol=1e-5, atol=1e-3)


def test_open_celeba_takes_grey_and_rgb_of_any_size_only(tmp_path):
    for name, shape, ok in (("oblong", (3, 8, 6), True), ("rgb", (3, 8, 6, 3), True),
                            ("rgba", (3, 8, 6, 4), False), ("flat", (3, 48), False)):
        group = zarr.open_group(tmp_path / name, mode="w")
        group.create_array("images", shape=shape, dtype="uint8")
        group.create_array("attributes", shape=(3, 40), dtype="int8",
                           attributes={"names": list(ATTRIBUTE_NAMES)})
        if ok:
            assert open_celeba(tmp_path / name)[0].shape == shape
        else:
            with pytest.raises(ValueError, match=r"\(n, H, W\) \(grey\) or \(n, H, W, 3\) \(RGB\)"):
                open_celeba(tmp_path / name)


@pytest.mark.parametrize("size", [0, -3, (0, 5), (5,), "80", 2.5, True])
def test_bad_sizes_are_refused_before_any_work(tmp_path, size):
    with pytest.raises(ValueError, match="size must be|must be a positive integer"):
        synth(tmp_path / "x.zarr", n=4, size=size)
    assert not any(tmp_path.iterdir())


# ---------------------------------------------------------------------- fabricated CelebA
@pytest.fixture(scope="module")
def jpegs(tmp_path_factory):
    """60 fabricated CelebA JPEGs in the official layout."""
    return write_celeba_jpegs(tmp_path_factory.mktemp("celeba") / "celeba", 60, seed=4)


def test_fabricated_celeba_looks_like_the_download(jpegs, tmp_path):
    files = sorted(p.name for p in (jpegs / "img_align_celeba").iterdir())
    assert files == [f"{i:06d}.jpg" for i in range(1, 61)]
    sizes = []
    for name in files:
        with Image.open(jpegs / "img_align_celeba" / name) as image:
            assert image.format == "JPEG" and image.mode == "RGB" and image.size == (178, 218)
        sizes.append((jpegs / "img_align_celeba" / name).stat().st_size)
    assert 8_000 < np.mean(sizes) < 16_000  # CelebA's aligned JPEGs: ~12 KB
    lines = (jpegs / "list_attr_celeba.txt").read_text().splitlines()
    assert lines[0] == "60" and lines[1].split() == list(ATTRIBUTE_NAMES)
    assert lines[2].startswith("000001.jpg ") and set(lines[2].split()[1:]) <= {"-1", "1"}
    # the same seed, the same files
    again = write_celeba_jpegs(tmp_path / "again", 60, seed=4)
    for name in ("list_attr_celeba.txt", "list_eval_partition.txt", "img_align_celeba/000042.jpg"):
        assert (again / name).read_bytes() == (jpegs / name).read_bytes()
    with pytest.raises(FileExistsError, match="not an empty folder"):
        write_celeba_jpegs(jpegs, 5)


def test_ingest_full_colour_is_the_decoded_jpegs(jpegs, tmp_path):
    out = ingest_celeba(jpegs, tmp_path / "full.zarr", size="full", color=True, progress=False,
                        n_jobs=1, chunk_rows=16)
    images, attributes, _ = open_celeba(out)
    assert images.shape == (60, 218, 178, 3) and images.chunks == (16, 218, 178, 3)
    assert zarr.open_group(out, mode="r").attrs["size"] == [218, 178]
    for i in (0, 33, 59):
        with Image.open(jpegs / "img_align_celeba" / f"{i + 1:06d}.jpg") as image:
            np.testing.assert_array_equal(images[i], np.asarray(image.convert("RGB")))
    rows = (jpegs / "list_attr_celeba.txt").read_text().splitlines()[2:]
    expected = (np.array([r.split()[1:] for r in rows], dtype=int) > 0).astype(np.int8)
    np.testing.assert_array_equal(attributes[:], expected)


@pytest.mark.parametrize(("size", "color"), [(80, False), ((109, 89), True), ((64, 56), False)])
def test_ingest_decoding_at_a_reduced_scale_matches_a_full_decode(jpegs, size, color):
    """The DCT-scaled decode (Pillow's draft) and the full decode then Lanczos agree."""
    height, width = (size, size) if isinstance(size, int) else size
    for i in (1, 17, 50):
        path = jpegs / "img_align_celeba" / f"{i:06d}.jpg"
        fast = decode_face(str(path), (height, width), color).astype(float)
        with Image.open(path) as image:
            full = image.convert("RGB" if color else "L")
        top = (218 - round(178 * height / width)) // 2
        crop = full.crop((0, top, 178, top + round(178 * height / width)))
        slow = np.asarray(crop.resize((width, height), Image.Resampling.LANCZOS), dtype=float)
        assert fast.shape == slow.shape == ((height, width, 3) if color else (height, width))
        assert np.abs(fast - slow).mean() < 2.5, i


def test_the_crop_keeps_the_output_aspect_centred():
    from dfairpca.celeba.ingest import _crop_box

    assert _crop_box(178, 218, 80, 80) == (0, 20, 178, 198)  # CelebA's central square
    assert _crop_box(178, 218, 218, 178) == (0, 0, 178, 218)  # full: nothing cropped
    assert _crop_box(178, 218, 64, 48) == (7, 0, 171, 218)  # wider than CelebA: the width


def test_colour_fair_faces_picture(tmp_path):
    store = synth(tmp_path / "c.zarr", n=200, size=(12, 10), color=True, chunk_rows=64)
    X = open_celeba(store)[0][:].reshape(200, -1).astype(float)
    z = pd.DataFrame({"Eyeglasses": dfairpca.celeba.attribute_column(store, "Eyeglasses")})
    model = dfairpca.FairPCA(3).fit(X, sensitive_features=z)
    png = faces_figure(model, store, tmp_path / "faces.png", n=3)
    assert read_marker(png)["kind"] == "figure"
    with Image.open(png) as image:
        rgb = np.asarray(image.convert("RGB")).astype(int)
    assert np.abs(rgb[..., 0] - rgb[..., 2]).max() > 60  # the faces are drawn in colour
    grey = dfairpca.PCA(2).fit(np.zeros((5, 12 * 10)) + np.arange(5)[:, None])
    with pytest.raises(ValueError, match="120 features but the store's images are 12x10x3"):
        faces_figure(grey, store, tmp_path / "x.png")
