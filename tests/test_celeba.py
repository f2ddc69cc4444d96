"""Tests of dfairpca.celeba: synthetic and ingested CelebA stores in Zarr v3."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import hypothesis.extra.numpy as hnp
import hypothesis.strategies as st
import pytest
import zarr
from hypothesis import given, settings
from PIL import Image

from dfairpca.celeba import (
    ATTRIBUTE_NAMES,
    attribute_column,
    ensure_store,
    ingest_celeba,
    open_celeba,
    synth_celeba,
)
from dfairpca.celeba.ingest import decode_face
from dfairpca.celeba.schema import official_like_partition

# ---------------------------------------------------------------------------
# Synthetic stores
# ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def synth_store(tmp_path_factory) -> Path:
    """3,000 synthetic 80 x 80 faces in chunks of 1,024 rows."""
    out = tmp_path_factory.mktemp("synth") / "faces.zarr"
    return synth_celeba(out, n=3000, seed=1, chunk_rows=1024, progress=False, n_jobs=1)


@pytest.fixture(scope="module")
def large_attributes(tmp_path_factory) -> dict[str, np.ndarray]:
    """Attributes of 20,000 synthetic faces (tiny images keep this fast)."""
    out = tmp_path_factory.mktemp("large") / "faces.zarr"
    synth_celeba(out, n=20_000, seed=2, size=16, chunk_rows=4096, progress=False, n_jobs=1)
    _, attributes, names = open_celeba(out)
    values = attributes[:]
    return {name: values[:, j].astype(bool) for j, name in enumerate(names)}


def store_files(path: Path) -> dict[str, bytes]:
    """Every file of a store, by relative path."""
    return {
        str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()
    }


def test_attribute_names():
    assert len(ATTRIBUTE_NAMES) == 40 == len(set(ATTRIBUTE_NAMES))
    assert ATTRIBUTE_NAMES[:3] == ("5_o_Clock_Shadow", "Arched_Eyebrows", "Attractive")
    assert ATTRIBUTE_NAMES[20] == "Male" and ATTRIBUTE_NAMES[-1] == "Young"


def test_synth_schema(synth_store):
    group = zarr.open_group(synth_store, mode="r")
    assert group.metadata.zarr_format == 3
    attrs = dict(group.attrs)
    assert attrs.pop("dfairpca")["kind"] == "store"  # dfairpca's marker: its own to replace
    assert attrs == {"source": "synthetic", "seed": 1, "size": 80}

    images, attributes, names = open_celeba(synth_store)
    assert images.shape == (3000, 80, 80) and images.dtype == np.uint8
    assert images.chunks == (1024, 80, 80)
    assert attributes.shape == (3000, 40) and attributes.dtype == np.int8
    assert attributes.chunks == (1024, 40)
    assert names == list(ATTRIBUTE_NAMES)
    assert set(np.unique(attributes[:])) == {0, 1}

    partition = group["partition"]
    assert partition.dtype == np.int8 and partition.shape == (3000,)
    labels = partition[:]
    assert np.all(np.diff(labels) >= 0), "train, valid and test are contiguous blocks"
    assert np.bincount(labels).tolist() == [2410, 294, 296]

    pixels = images[:]
    assert 40 < pixels.mean() < 200 and pixels.std() > 25


def test_synth_image_size(tmp_path):
    out = synth_celeba(tmp_path / "small", n=5, size=24, chunk_rows=2, progress=False, n_jobs=1)
    images, attributes, _ = open_celeba(out)
    assert images.shape == (5, 24, 24) and images.chunks == (2, 24, 24)
    assert attributes.shape == (5, 40)


def test_partition_has_official_sizes_for_celeba_length():
    labels = official_like_partition(202_599)
    assert np.bincount(labels).tolist() == [162_770, 19_867, 19_962]


@pytest.mark.integration  # a pool of spawned worker processes
def test_synth_is_deterministic_and_independent_of_n_jobs(tmp_path):
    kwargs = dict(n=600, seed=7, size=40, chunk_rows=256, progress=False)
    one = synth_celeba(tmp_path / "one", n_jobs=1, **kwargs)
    again = synth_celeba(tmp_path / "again", n_jobs=1, **kwargs)
    two = synth_celeba(tmp_path / "two", n_jobs=2, **kwargs)
    reference = store_files(one)
    assert store_files(again) == reference
    assert store_files(two) == reference

    other = synth_celeba(tmp_path / "other", n_jobs=1, **{**kwargs, "seed": 8})
    assert not np.array_equal(open_celeba(other)[0][:], open_celeba(one)[0][:])
    # Chunks are seeded separately: rows of different chunks differ.
    images = open_celeba(one)[0]
    assert not np.array_equal(images[:256], images[256:512])


def test_synth_prevalences(large_attributes):
    a = large_attributes
    prevalence = {name: 100 * column.mean() for name, column in a.items()}
    assert prevalence["Eyeglasses"] == pytest.approx(6.5, abs=1.5)
    assert prevalence["Smiling"] == pytest.approx(48, abs=4)
    assert prevalence["Male"] == pytest.approx(42, abs=4)
    assert prevalence["Young"] == pytest.approx(77, abs=4)
    assert prevalence["No_Beard"] == pytest.approx(83, abs=4)
    assert prevalence["Mustache"] == pytest.approx(4, abs=1.5)
    assert prevalence["Bald"] == pytest.approx(2, abs=1)
    assert prevalence["Wearing_Hat"] == pytest.approx(5, abs=1.5)

    male = a["Male"]
    for name in ("Mustache", "Goatee", "Bald", "5_o_Clock_Shadow", "Sideburns"):
        assert male[a[name]].mean() > 0.9, name
    for name in ("Heavy_Makeup", "Wearing_Lipstick"):
        assert male[a[name]].mean() < 0.1, name
    assert not np.any(a["Goatee"] & a["No_Beard"])
    assert a["Wearing_Hat"][a["Bald"]].mean() < 0.1
    hair_colours = a["Black_Hair"].astype(int) + a["Blond_Hair"] + a["Brown_Hair"]
    assert hair_colours.max() == 1
    assert not np.any(a["Wavy_Hair"] & a["Straight_Hair"])
    assert a["Smiling"][a["High_Cheekbones"]].mean() > 0.7


def mean_difference(store: Path, name: str) -> np.ndarray:
    """Mean image of faces with attribute ``name`` minus the mean of the others."""
    images, attributes, names = open_celeba(store)
    pixels = images[:].astype(np.float64)
    has = attributes[:, names.index(name)].astype(bool)
    return pixels[has].mean(axis=0) - pixels[~has].mean(axis=0)


@pytest.mark.parametrize(
    ("name", "rows", "cols", "sign"),
    [
        ("Eyeglasses", slice(34, 46), slice(14, 66), -1),  # frames and tinted lenses
        ("Mustache", slice(52, 62), slice(28, 52), -1),  # dark hair above the lip
        ("No_Beard", slice(58, 74), slice(20, 60), +1),  # beards darken the chin
        ("Wearing_Hat", slice(2, 20), slice(14, 66), +1),  # hats are lighter than hair
        ("Bald", slice(2, 16), slice(20, 60), +1),  # scalp instead of hair
        ("Smiling", slice(54, 66), slice(28, 52), +1),  # wide mouth, teeth
    ],
)
def test_attributes_change_pixels(synth_store, name, rows, cols, sign):
    difference = mean_difference(synth_store, name)
    region = difference[rows, cols]
    assert sign * region.mean() > 5, "the feature moves the region's grey level"
    # The change is concentrated where the feature is drawn.
    assert np.abs(region).mean() > 1.5 * np.abs(difference).mean()


def test_eyeglasses_darken_the_eye_region(synth_store):
    difference = mean_difference(synth_store, "Eyeglasses")
    eyes = difference[34:46, 14:66]
    assert eyes.mean() < -8
    assert np.abs(eyes).mean() > 2.5 * np.abs(difference[:8]).mean()  # top rows: background


@pytest.mark.integration  # a pool of spawned worker processes
def test_synth_is_atomic_and_refuses_to_overwrite(tmp_path):
    out = tmp_path / "faces.zarr"
    synth_celeba(out, n=20, size=16, chunk_rows=8, progress=False, n_jobs=1)
    assert [p.name for p in tmp_path.iterdir()] == ["faces.zarr"]

    before = store_files(out)
    with pytest.raises(FileExistsError, match="overwrite=True"):
        synth_celeba(out, n=20, size=16, chunk_rows=8, seed=5, progress=False, n_jobs=1)
    assert store_files(out) == before

    synth_celeba(out, n=20, size=16, chunk_rows=8, seed=5, overwrite=True, progress=False)
    assert store_files(out) != before
    assert zarr.open_group(out, mode="r").attrs["seed"] == 5
    assert [p.name for p in tmp_path.iterdir()] == ["faces.zarr"]


def test_synth_failure_leaves_nothing_behind(tmp_path):
    with pytest.raises(ValueError, match="n_jobs"):
        synth_celeba(tmp_path / "faces.zarr", n=20, size=16, progress=False, n_jobs=0)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "kwargs", [{"n": 0}, {"size": -1}, {"chunk_rows": 0}, {"seed": -1}, {"seed": 1.5}]
)
def test_synth_rejects_bad_arguments(tmp_path, kwargs):
    with pytest.raises(ValueError):
        synth_celeba(tmp_path / "x", **{"n": 4, "progress": False, **kwargs})


def test_ensure_store_writes_once_then_checks_the_settings(tmp_path):
    out, kwargs = tmp_path / "faces.zarr", dict(size=8, chunk_rows=16, progress=False, n_jobs=1)
    assert ensure_store(out, 40, seed=3, **kwargs) == out
    reference = synth_celeba(tmp_path / "reference.zarr", n=40, seed=3, **kwargs)
    assert store_files(out) == store_files(reference)  # exactly synth_celeba's store
    stamps = {p: p.stat().st_mtime_ns for p in out.rglob("*")}

    assert ensure_store(out, 40, seed=3, **kwargs) == out  # reused, not rewritten
    assert {p: p.stat().st_mtime_ns for p in out.rglob("*")} == stamps
    for asked, differs in ((dict(n=41), "n 40 (asked 41)"), (dict(seed=4), "seed 3 (asked 4)"),
                           (dict(size=16), "size 8 (asked 16)"),
                           (dict(chunk_rows=8), "chunk_rows 16 (asked 8)")):
        wanted = {"n": 40, "seed": 3, **kwargs, **asked}
        with pytest.raises(ValueError, match=rf"holds another store: {re.escape(differs)}; pass "
                           "another path, or overwrite=True"):
            ensure_store(out, **wanted)
    assert {p: p.stat().st_mtime_ns for p in out.rglob("*")} == stamps
    # a store of other codecs (zstd, as stores were once written) is not taken either
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("dfairpca.celeba.synth.IMAGES_CODECS", ("bytes", "zstd"))
        with pytest.raises(ValueError, match=re.escape(
                "codecs ['bytes', 'crc32c'] (asked ['bytes', 'zstd'])")):
            ensure_store(out, 40, seed=3, **kwargs)

    ensure_store(out, 41, seed=3, overwrite=True, **kwargs)
    assert open_celeba(out)[0].shape == (41, 8, 8)


def test_ensure_store_never_takes_another_folder_for_the_store(tmp_path, celeba_dir):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("x")
    with pytest.raises(ValueError, match="exists but is not a CelebA store.*pass another path"):
        ensure_store(mine, 40, size=8, progress=False, n_jobs=1)
    with pytest.raises(FileExistsError, match="did not write"):  # not even with overwrite
        ensure_store(mine, 40, size=8, overwrite=True, progress=False, n_jobs=1)
    assert [p.name for p in mine.iterdir()] == ["notes.txt"]
    real = ingest_celeba(celeba_dir, tmp_path / "real.zarr", size=8, chunk_rows=16,
                         progress=False, n_jobs=1)
    with pytest.raises(ValueError, match="source 'celeba' \\(asked 'synthetic'\\)"):
        ensure_store(real, 50, size=8, chunk_rows=16, progress=False, n_jobs=1)
    empty = tmp_path / "empty"
    empty.mkdir()  # an empty folder is no store yet: written
    assert open_celeba(ensure_store(empty, 5, size=8, progress=False, n_jobs=1))[0].shape[0] == 5


#: modules of dfairpca that are applications of it: they may import the CelebA package
APPLICATIONS = ("dfairpca.celeba", "dfairpca.cli", "dfairpca.__main__", "dfairpca.paper")


def test_the_core_never_imports_the_celeba_application_nor_matplotlib():
    """Import every module of the core in a fresh interpreter: none pulls in dfairpca.celeba
    (nor, through it, matplotlib)."""
    code = f"""
import sys
from pathlib import Path
import dfairpca
root = Path(dfairpca.__file__).parent  # read from the files: walking packages imports them
names = [".".join(("dfairpca",) + p.relative_to(root).with_suffix("").parts).removesuffix(".__init__")
         for p in sorted(root.rglob("*.py"))]
core = [name for name in names if not name.startswith({APPLICATIONS!r})]
for name in core:
    __import__(name)
print(len(core), sorted({{m for m in sys.modules if m.startswith(("dfairpca.celeba", "matplotlib"))}}))
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    count, pulled = done.stdout.split(" ", 1)
    assert int(count) >= 10 and pulled.strip() == "[]", done.stdout


def test_a_writer_process_imports_neither_the_figures_nor_the_estimators():
    """What an ingest's or a synthetic store's worker process imports to run its chunks
    (``pool``, ``ingest``, ``synth``): not ``figures`` (a third of its start), nor
    scikit-learn, SciPy's linear algebra, Dask or matplotlib."""
    code = """
import sys
import dfairpca.celeba.pool, dfairpca.celeba.ingest, dfairpca.celeba.synth
heavy = ("dfairpca.celeba.figures", "dfairpca.decomposition", "sklearn", "scipy.linalg",
         "dask", "distributed", "matplotlib")
print(sorted({m.split(".")[0] if not m.startswith("dfairpca") else m for m in sys.modules
              if m.startswith(heavy)}))
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]", done.stdout
    # in a fresh interpreter: its public names and modules are still there, imported on use
    code = """
import dfairpca.celeba as celeba
assert set(celeba._PUBLIC) == set(celeba.__all__)
for name in celeba.__all__:
    value = getattr(celeba, name)
    if callable(value):
        assert value.__module__ == "dfairpca.celeba." + celeba._PUBLIC[name], name
assert celeba.schema.IMAGES == "images" and celeba.pool.write_rows.__name__ == "write_rows"
for module in celeba._SUBMODULES:
    assert getattr(celeba, module).__name__ == "dfairpca.celeba." + module
try:
    celeba.no_such_name
except AttributeError:
    print("ok")
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


def test_the_cli_starts_without_the_checkpoint_or_figures_modules():
    """Building the parser and reading the arguments of an ingest imports neither
    ``dfairpca.engine.checkpoint`` (SciPy's linear algebra behind it: 0.4 s before an ingest's
    workers could start) nor ``figures``; the parser's default faces per row is still figures'."""
    code = """
import sys
from dfairpca.cli import build_parser
args = build_parser().parse_args(["ingest-celeba", "celeba", "out.zarr"])
faces = build_parser().parse_args(["show", "m", "s"]).n
print(sorted(m for m in sys.modules if m in ("dfairpca.engine.checkpoint", "dfairpca.celeba.figures",
                                             "scipy.linalg")), faces)
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    from dfairpca.celeba.figures import DEFAULT_FACES

    assert done.stdout.split() == ["[]", str(DEFAULT_FACES)], done.stdout


def test_attribute_flags_read_celeba_minus_one_one_and_refuse_other_values(tmp_path):
    import shutil

    from dfairpca.celeba.schema import attribute_flags

    store = synth_celeba(tmp_path / "s.zarr", n=30, size=8, progress=False, n_jobs=1)
    eyeglasses = attribute_column(store, "Eyeglasses")
    flags = attribute_flags(store, ["Eyeglasses", "Male"])
    assert list(flags) == ["Eyeglasses", "Male"] and flags["Eyeglasses"].dtype == np.int8
    np.testing.assert_array_equal(flags["Eyeglasses"], eyeglasses)
    for values, expected in (([-1, 1, 1], [0, 1, 1]), ([0, 1, 2], None)):
        edited = tmp_path / f"edited{len(expected or [])}.zarr"
        shutil.copytree(store, edited)
        attributes = zarr.open_group(edited, mode="r+")["attributes"]
        block = attributes[:]
        block[:, ATTRIBUTE_NAMES.index("Eyeglasses")] = np.resize(values, 30)
        attributes[:] = block
        if expected is None:
            with pytest.raises(ValueError, match="holds the values 0, 1, 2; a CelebA attribute "
                               "must be 0/1 \\(or CelebA's -1/1\\)"):
                attribute_flags(edited, ["Eyeglasses"])
        else:
            np.testing.assert_array_equal(attribute_flags(edited, ["Eyeglasses"])["Eyeglasses"],
                                          np.resize(expected, 30))


# ---------------------------------------------------------------------------
# Reading stores
# ---------------------------------------------------------------------------


def test_attribute_column(synth_store):
    _, attributes, names = open_celeba(synth_store)
    column = attribute_column(synth_store, "Eyeglasses")
    assert column.dtype == np.int8 and column.shape == (3000,)
    np.testing.assert_array_equal(column, attributes[:, names.index("Eyeglasses")])
    group = zarr.open_group(synth_store, mode="r")
    np.testing.assert_array_equal(attribute_column(group, "Eyeglasses"), column)


def test_attribute_column_unknown_name_suggests_closest(synth_store):
    with pytest.raises(ValueError, match="did you mean 'Eyeglasses'") as info:
        attribute_column(synth_store, "eyeglases")
    assert "Wearing_Necktie" in str(info.value)  # lists the valid names


def test_open_celeba_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such"):
        open_celeba(tmp_path / "missing")
    (tmp_path / "plain").mkdir()
    with pytest.raises(ValueError, match="not a Zarr group"):
        open_celeba(tmp_path / "plain")

    group = zarr.open_group(tmp_path / "partial", mode="w")
    group.create_array("attributes", shape=(3, 40), dtype="int8")
    group.create_array("labels", shape=(3,), dtype="int8")
    with pytest.raises(ValueError, match=r"no images array.*\['attributes', 'labels'\]"):
        open_celeba(tmp_path / "partial")

    group = zarr.open_group(tmp_path / "float", mode="w")
    group.create_array("images", shape=(3, 8, 8), dtype="float32")
    group.create_array("attributes", shape=(3, 40), dtype="int8")
    with pytest.raises(ValueError, match="uint8"):
        open_celeba(tmp_path / "float")

    group = zarr.open_group(tmp_path / "rgba", mode="w")
    group.create_array("images", shape=(3, 8, 6, 4), dtype="uint8")
    group.create_array("attributes", shape=(3, 40), dtype="int8")
    with pytest.raises(ValueError, match=r"\(n, H, W\) \(grey\) or \(n, H, W, 3\) \(RGB\)"):
        open_celeba(tmp_path / "rgba")


# ---------------------------------------------------------------------------
# Ingesting the official layout
# ---------------------------------------------------------------------------

N_IMAGES = 50


def write_jpeg(path: Path, index: int) -> None:
    """A 178 x 218 colour JPEG with smooth structure, different for each index."""
    rng = np.random.default_rng(index)
    yy, xx = np.mgrid[0:218, 0:178]
    channels = [
        127 + 100 * np.sin(xx / rng.uniform(5, 30) + rng.uniform(0, 6))
        * np.cos(yy / rng.uniform(5, 30) + rng.uniform(0, 6))
        for _ in range(3)
    ]
    rgb = np.clip(np.stack(channels, axis=-1), 0, 255).astype(np.uint8)
    Image.fromarray(rgb).save(path, quality=90)


@pytest.fixture
def celeba_dir(tmp_path) -> Path:
    """A fabricated CelebA download in the official layout with 50 images."""
    root = tmp_path / "celeba"
    (root / "img_align_celeba").mkdir(parents=True)
    rng = np.random.default_rng(0)
    values = rng.choice([-1, 1], size=(N_IMAGES, 40))
    lines = [str(N_IMAGES), " ".join(ATTRIBUTE_NAMES) + " "]
    for i in range(N_IMAGES):
        name = f"{i + 1:06d}.jpg"
        write_jpeg(root / "img_align_celeba" / name, i)
        # The official file pads positive values with an extra space.
        lines.append(name + "".join(f" {v:2d}" for v in values[i]))
    (root / "list_attr_celeba.txt").write_text("\n".join(lines) + "\n")
    partition = [0] * 40 + [1] * 5 + [2] * 5
    (root / "list_eval_partition.txt").write_text(
        "".join(f"{i + 1:06d}.jpg {p}\n" for i, p in enumerate(partition))
    )
    return root


def expected_attributes(celeba_dir: Path) -> np.ndarray:
    rows = (celeba_dir / "list_attr_celeba.txt").read_text().splitlines()[2:]
    return (np.array([row.split()[1:] for row in rows], dtype=int) > 0).astype(np.int8)


def assert_decoded(stored: np.ndarray, path: Path, size: int) -> None:
    """``stored`` is the image at ``path`` as the ingest decodes it: grey, the central
    178 x 178, Lanczos-resized (``decode_face``; tests/test_celeba_stores.py holds it to
    Pillow's plain full decode on CelebA-like faces)."""
    np.testing.assert_array_equal(stored, decode_face(str(path), (size, size), False))


def test_ingest_values(celeba_dir, tmp_path):
    out = ingest_celeba(
        celeba_dir, tmp_path / "celeba.zarr", size=32, chunk_rows=16, progress=False, n_jobs=1
    )
    images, attributes, names = open_celeba(out)
    assert images.shape == (N_IMAGES, 32, 32) and images.chunks == (16, 32, 32)
    assert names == list(ATTRIBUTE_NAMES)
    np.testing.assert_array_equal(attributes[:], expected_attributes(celeba_dir))
    for i in (0, 17, N_IMAGES - 1):
        path = celeba_dir / "img_align_celeba" / f"{i + 1:06d}.jpg"
        assert_decoded(images[i], path, 32)

    group = zarr.open_group(out, mode="r")
    np.testing.assert_array_equal(group["partition"][:], [0] * 40 + [1] * 5 + [2] * 5)
    assert group.attrs["source"] == "celeba" and group.attrs["size"] == 32
    assert sorted(p.name for p in tmp_path.iterdir()) == ["celeba", "celeba.zarr"]
    assert not (out / ".done").exists()


def test_the_published_layout_ingests_as_the_flat_one(celeba_dir, tmp_path):
    """The download as published: Anno/list_attr_celeba.txt, Img/img_align_celeba/,
    Eval/list_eval_partition.txt; the same store as from the flat copy."""
    flat = ingest_celeba(celeba_dir, tmp_path / "flat.zarr", size=16, progress=False, n_jobs=1)
    for sub, name in [("Anno", "list_attr_celeba.txt"), ("Img", "img_align_celeba"),
                      ("Eval", "list_eval_partition.txt")]:
        (celeba_dir / sub).mkdir()
        (celeba_dir / name).rename(celeba_dir / sub / name)
    out = ingest_celeba(celeba_dir, tmp_path / "published.zarr", size=16, progress=False, n_jobs=1)
    a, b = zarr.open_group(flat, mode="r"), zarr.open_group(out, mode="r")
    for name in ("images", "attributes", "partition"):
        np.testing.assert_array_equal(a[name][:], b[name][:])


def test_a_download_without_its_files_is_refused_naming_both_layouts(celeba_dir, tmp_path):
    (celeba_dir / "Anno").mkdir()
    (celeba_dir / "list_attr_celeba.txt").rename(celeba_dir / "Anno" / "list_attr_celeba.txt")
    (celeba_dir / "Img").mkdir()
    (celeba_dir / "Img" / "img_align_celeba.zip").write_bytes(b"PK")
    with pytest.raises(FileNotFoundError, match=r"Img/img_align_celeba; extract .*img_align_celeba\.zip"):
        ingest_celeba(celeba_dir, tmp_path / "c.zarr", size=16, progress=False, n_jobs=1)
    (celeba_dir / "Anno" / "list_attr_celeba.txt").unlink()
    with pytest.raises(FileNotFoundError, match=r"no .*celeba/Anno/list_attr_celeba.txt or "
                                                r".*celeba/list_attr_celeba.txt"):
        ingest_celeba(celeba_dir, tmp_path / "c.zarr", size=16, progress=False, n_jobs=1)


def test_ingest_without_partition_file(celeba_dir, tmp_path):
    (celeba_dir / "list_eval_partition.txt").unlink()
    out = ingest_celeba(celeba_dir, tmp_path / "c.zarr", size=16, progress=False, n_jobs=1)
    assert "partition" not in zarr.open_group(out, mode="r")
    assert attribute_column(out, "Male").shape == (N_IMAGES,)


@pytest.mark.integration  # a pool of spawned worker processes
def test_ingest_resumes_after_interruption(celeba_dir, tmp_path):
    out = tmp_path / "celeba.zarr"
    kwargs = dict(size=32, chunk_rows=16, progress=False)
    # Image 40 is in chunk 2 (rows 32-47): converting it interrupts the run
    # after chunks 0 and 1 are finished.
    broken = celeba_dir / "img_align_celeba" / "000040.jpg"
    broken.write_bytes(b"not a jpeg")
    with pytest.raises(ValueError, match="000040.jpg") as info:
        ingest_celeba(celeba_dir, out, n_jobs=1, **kwargs)
    assert "the same call again resumes there" in " ".join(info.value.__notes__)
    assert not out.exists()
    partial = tmp_path / ".celeba.zarr.partial"
    assert sorted(p.name for p in (partial / ".done").iterdir()) == ["0", "1", "code"]

    # Backdate the finished chunks: a rewrite would give them a new mtime.
    finished = [partial / "images" / "c" / str(i) / "0" / "0" for i in (0, 1)]
    for chunk in finished:
        os.utime(chunk, ns=(1_000_000_000, 1_000_000_000))
    write_jpeg(broken, 39)
    ingest_celeba(celeba_dir, out, n_jobs=2, **kwargs)

    assert not partial.exists()
    for i in (0, 1):
        assert (out / "images" / "c" / str(i) / "0" / "0").stat().st_mtime_ns == 1_000_000_000
    assert (out / "images" / "c" / "2" / "0" / "0").stat().st_mtime_ns > 1_000_000_000
    images = open_celeba(out)[0][:]
    for i in (0, 20, 39, N_IMAGES - 1):
        path = celeba_dir / "img_align_celeba" / f"{i + 1:06d}.jpg"
        assert_decoded(images[i], path, 32)


def test_two_writers_of_one_store_are_refused_not_mixed(tmp_path):
    """While one process writes a store (it holds ``.NAME.lock``), another write of it is
    refused at once, before any chunk: two would mix their chunks (two seeds) into one."""
    from dfairpca.io._writes import OutputPathError, exclusive

    out = tmp_path / "faces.zarr"
    lock = tmp_path / ".faces.zarr.lock"
    with exclusive(lock, "the first writer"):
        with pytest.raises(OutputPathError, match=r"another dfairpca process on this machine is "
                           r"writing .*faces\.zarr .*wait for it to finish"):
            synth_celeba(out, n=20, size=8, progress=False, n_jobs=1)
        assert not out.exists() and not (tmp_path / ".faces.zarr.partial").exists()
    assert not lock.exists()  # its holder removes it
    synth_celeba(out, n=20, size=8, progress=False, n_jobs=1)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["faces.zarr"]
    lock.write_text("mine")  # a user's file of that name is locked, never changed or removed
    synth_celeba(out, n=20, size=8, progress=False, n_jobs=1, overwrite=True)
    assert lock.read_text() == "mine"


def test_a_partial_conversion_of_other_code_is_not_resumed(celeba_dir, tmp_path, monkeypatch):
    """Chunks written by other dfairpca code (same version, e.g. an editable install between
    commits) are not mixed into the store: the partial conversion is started over, saying so."""
    out = tmp_path / "celeba.zarr"
    broken = celeba_dir / "img_align_celeba" / "000040.jpg"
    broken.write_bytes(b"not a jpeg")
    kwargs = dict(size=16, chunk_rows=16, progress=False, n_jobs=1)
    with pytest.raises(ValueError):
        ingest_celeba(celeba_dir, out, **kwargs)
    partial = tmp_path / ".celeba.zarr.partial"
    assert sorted(p.name for p in (partial / ".done").iterdir()) == ["0", "1", "code"]
    write_jpeg(broken, 39)
    monkeypatch.setattr("dfairpca.celeba.pool.code_digest", lambda: "0" * 16)
    with pytest.warns(UserWarning, match="or other dfairpca code than this call"):
        ingest_celeba(celeba_dir, out, **kwargs)
    assert open_celeba(out)[0].shape == (N_IMAGES, 16, 16)


def test_ingest_overwrite_discards_partial_conversion(celeba_dir, tmp_path):
    out = tmp_path / "celeba.zarr"
    broken = celeba_dir / "img_align_celeba" / "000040.jpg"
    broken.write_bytes(b"not a jpeg")
    with pytest.raises(ValueError):
        ingest_celeba(celeba_dir, out, size=16, chunk_rows=16, progress=False, n_jobs=1)
    write_jpeg(broken, 39)
    # A different size cannot reuse the partial chunks either way, and says so.
    with pytest.warns(UserWarning, match=r"discarded the interrupted write in .*\.celeba\.zarr"
                                         r"\.partial: it was made with other settings"):
        ingest_celeba(celeba_dir, out, size=24, chunk_rows=16, progress=False, n_jobs=1)
    assert open_celeba(out)[0].shape == (N_IMAGES, 24, 24)
    ingest_celeba(
        celeba_dir, out, size=16, chunk_rows=16, overwrite=True, progress=False, n_jobs=1
    )
    assert open_celeba(out)[0].shape == (N_IMAGES, 16, 16)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["celeba", "celeba.zarr"]


def test_ingest_refuses_existing_output(celeba_dir, tmp_path):
    out = tmp_path / "celeba.zarr"
    ingest_celeba(celeba_dir, out, size=16, progress=False, n_jobs=1)
    with pytest.raises(FileExistsError, match="overwrite=True"):
        ingest_celeba(celeba_dir, out, size=16, progress=False, n_jobs=1)
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("x")
    with pytest.raises(FileExistsError, match="remove it yourself"):
        ingest_celeba(celeba_dir, foreign, size=16, overwrite=True, progress=False, n_jobs=1)
    assert [p.name for p in foreign.iterdir()] == ["notes.txt"]


def test_ingest_missing_image_is_named(celeba_dir, tmp_path):
    missing = celeba_dir / "img_align_celeba" / "000007.jpg"
    missing.unlink()
    with pytest.raises(FileNotFoundError, match=str(missing)):
        ingest_celeba(celeba_dir, tmp_path / "c.zarr", size=16, progress=False, n_jobs=1)


def test_ingest_corrupt_image_is_named(celeba_dir, tmp_path):
    corrupt = celeba_dir / "img_align_celeba" / "000012.jpg"
    corrupt.write_bytes(corrupt.read_bytes()[:300])  # truncated JPEG
    with pytest.raises(ValueError, match=f"corrupt or unreadable image {corrupt}"):
        ingest_celeba(celeba_dir, tmp_path / "c.zarr", size=16, progress=False, n_jobs=1)


def rewrite_line(celeba_dir: Path, number: int, text: str) -> None:
    path = celeba_dir / "list_attr_celeba.txt"
    lines = path.read_text().splitlines()
    lines[number - 1] = text
    path.write_text("\n".join(lines) + "\n")


@pytest.mark.parametrize(
    ("number", "text", "message"),
    [
        (1, "49", "line 1 says 49 images but 50 rows follow"),
        (1, "fifty", "expected the number of images"),
        (2, " ".join(ATTRIBUTE_NAMES[:-1]) + " Old", r"unknown \['Old'\], missing \['Young'\]"),
        (2, " ".join(reversed(ATTRIBUTE_NAMES)), "different order"),
        (3, "000001.jpg" + " 1" * 39 + " 0", "line 3: attribute values must be -1 or 1, got '0'"),
        (4, "000002.jpg" + " 1" * 39, "line 4: expected a file name and 40 values"),
        (4, "000002.jpg" + " 1" * 39 + " +1", "line 4: attribute values must be -1 or 1, got '\\+1'"),
        (5, "000003.jpg" + " 1" * 39 + " 11", "line 5: attribute values must be -1 or 1, got '11'"),
        (6, "000004.jpg" + " 1" * 38 + " 1-1", "line 6: expected a file name and 40 values"),
        (7, "000005.jpg" + " -1" * 38 + " --1 1", "line 7: attribute values must be -1 or 1, got '--1'"),
        (8, "000006.jpg", "line 8: expected a file name and 40 values, got 1 fields"),
    ],
)
def test_ingest_malformed_attribute_file(celeba_dir, tmp_path, number, text, message):
    rewrite_line(celeba_dir, number, text)
    with pytest.raises(ValueError, match=message):
        ingest_celeba(celeba_dir, tmp_path / "c.zarr", size=16, progress=False, n_jobs=1)


def test_two_rows_of_39_and_41_values_are_refused_though_they_hold_80(celeba_dir, tmp_path):
    rewrite_line(celeba_dir, 3, "000001.jpg" + " 1" * 39)
    rewrite_line(celeba_dir, 4, "000002.jpg" + " -1" * 41)
    with pytest.raises(ValueError, match="line 3: expected a file name and 40 values, got 40 fields"):
        ingest_celeba(celeba_dir, tmp_path / "c.zarr", size=16, progress=False, n_jobs=1)


@pytest.mark.parametrize("size", [16, "full"])
def test_an_attribute_file_listing_no_images_is_refused_by_name(celeba_dir, tmp_path, size):
    path = celeba_dir / "list_attr_celeba.txt"
    path.write_text("0\n" + " ".join(ATTRIBUTE_NAMES) + "\n")
    with pytest.raises(ValueError, match="lists no images"):
        ingest_celeba(celeba_dir, tmp_path / "c.zarr", size=size, progress=False, n_jobs=2)
    assert not (tmp_path / "c.zarr").exists()


@settings(max_examples=60, deadline=None)
@given(values=hnp.arrays(np.int8, st.tuples(st.integers(1, 12), st.just(40)), elements=st.sampled_from([-1, 1])),
       blanks=st.lists(st.sampled_from([" ", "  ", "\t", " \t "]), min_size=41, max_size=41),
       trailing=st.sampled_from(["", " ", "\t"]))
def test_the_attribute_file_reads_as_a_row_by_row_split_would(tmp_path_factory, values, blanks, trailing):
    """The whole-text parse of the attribute file (fast at 202,599 rows) gives what
    splitting each row into its 41 fields gives, whatever blanks separate them."""
    from dfairpca.celeba.ingest import _read_attribute_file

    rows = ["".join(f"{blank}{value}" for blank, value in zip(blanks, [f"{i:06d}.jpg", *row])).lstrip()
            + trailing for i, row in enumerate(values, 1)]
    path = tmp_path_factory.mktemp("attr") / "list_attr_celeba.txt"
    path.write_text("\n".join([str(len(rows)), " ".join(ATTRIBUTE_NAMES) + " ", *rows]) + "\n")
    names, flags = _read_attribute_file(path)
    assert names == [row.split()[0] for row in rows]
    assert flags.dtype == np.int8 and np.array_equal(flags, (values > 0).astype(np.int8))


def test_ingest_missing_layout(celeba_dir, tmp_path):
    (celeba_dir / "list_attr_celeba.txt").rename(celeba_dir / "attributes.txt")
    with pytest.raises(FileNotFoundError, match="list_attr_celeba.txt"):
        ingest_celeba(celeba_dir, tmp_path / "c.zarr", progress=False)
    (celeba_dir / "attributes.txt").rename(celeba_dir / "list_attr_celeba.txt")
    (celeba_dir / "img_align_celeba").rename(celeba_dir / "images")
    with pytest.raises(FileNotFoundError, match="img_align_celeba"):
        ingest_celeba(celeba_dir, tmp_path / "c.zarr", progress=False)


def test_ingest_bad_partition_file(celeba_dir, tmp_path):
    (celeba_dir / "list_eval_partition.txt").write_text("000001.jpg 3\n")
    with pytest.raises(ValueError, match="list_eval_partition.txt, line 1"):
        ingest_celeba(celeba_dir, tmp_path / "c.zarr", size=16, progress=False, n_jobs=1)
