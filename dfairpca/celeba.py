"""CelebA-shaped face data stores in Zarr v3.

A *CelebA store* is a Zarr v3 group on local disk with

``images``
    ``uint8`` array of shape ``(n, size, size)`` holding grey-level faces,
    chunked along the first axis only (``chunk_rows`` images per chunk).
``attributes``
    ``int8`` array of shape ``(n, 40)`` with 0/1 values; its
    ``attrs["names"]`` lists the 40 CelebA attribute names
    (:data:`ATTRIBUTE_NAMES`) in the official column order.
``partition`` (optional)
    ``int8`` array of shape ``(n,)``: 0 train, 1 valid, 2 test.

and group attributes describing where the data came from (``source`` is
``"synthetic"`` or ``"celeba"``, ``size``, and for synthetic data ``seed``).

:func:`synth_celeba` writes a synthetic store of cartoon faces whose pixels
depend on the attributes the way real photographs do; :func:`ingest_celeba`
converts the official CelebA download; :func:`open_celeba` and
:func:`attribute_column` read either.
"""

from __future__ import annotations

import difflib
import hashlib
import multiprocessing
import os
import shutil
from concurrent.futures import ProcessPoolExecutor, as_completed
from functools import cached_property
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import zarr
import zarr.errors
from PIL import Image
from tqdm import tqdm

from ._system import cpu_count
from ._writes import (
    atomic_directory, check_target, marker_attributes, move_into_place, remove_directory,
    writing_every_chunk,
)
from .io import read_checked, strict_group

__all__ = [
    "ATTRIBUTE_NAMES",
    "synth_celeba",
    "ingest_celeba",
    "open_celeba",
    "attribute_column",
]

#: The 40 CelebA attribute names, in the column order of ``list_attr_celeba.txt``.
ATTRIBUTE_NAMES: tuple[str, ...] = (
    "5_o_Clock_Shadow", "Arched_Eyebrows", "Attractive", "Bags_Under_Eyes",
    "Bald", "Bangs", "Big_Lips", "Big_Nose", "Black_Hair", "Blond_Hair",
    "Blurry", "Brown_Hair", "Bushy_Eyebrows", "Chubby", "Double_Chin",
    "Eyeglasses", "Goatee", "Gray_Hair", "Heavy_Makeup", "High_Cheekbones",
    "Male", "Mouth_Slightly_Open", "Mustache", "Narrow_Eyes", "No_Beard",
    "Oval_Face", "Pale_Skin", "Pointy_Nose", "Receding_Hairline",
    "Rosy_Cheeks", "Sideburns", "Smiling", "Straight_Hair", "Wavy_Hair",
    "Wearing_Earrings", "Wearing_Hat", "Wearing_Lipstick", "Wearing_Necklace",
    "Wearing_Necktie", "Young",
)  # fmt: skip

# Official split sizes (train, valid, test) of the 202,599 aligned images.
_CELEBA_SPLIT = (162_770, 19_867, 19_962)
# Subdirectory of a partial ingest store holding one empty file per finished chunk.
_DONE_DIR = ".done"
# Images rendered at once inside a synthetic chunk (keeps temporaries in cache).
_RENDER_BATCH = 128
# The kind of dfairpca's marker on a store it writes (see dfairpca.io.MARKER).
STORE_KIND = "store"


# --------------------------------------------------------------------------
# Public API
# --------------------------------------------------------------------------


def synth_celeba(
    out: str | os.PathLike,
    n: int = 202_599,
    *,
    seed: int = 0,
    size: int = 80,
    chunk_rows: int = 2048,
    overwrite: bool = False,
    progress: bool = True,
    n_jobs: int | None = None,
) -> Path:
    """Write a synthetic CelebA-like store of ``n`` grey faces.

    Each image is a vectorised drawing of a face (oval, eyes, brows, nose,
    mouth, hair, ears, neck, clothes, background) under a random pose (small
    shift, scale and rotation), lighting and sensor noise.  The 40 binary
    attributes are sampled with prevalences and correlations close to
    CelebA's (e.g. Eyeglasses 6.5%, Smiling 48%, Male 42%, facial hair almost
    only on men, make-up almost only on women) and change the pixels the way
    they do in photographs: glasses draw frames and tinted lenses, beards and
    moustaches darken the lower face, smiling widens and curves the mouth,
    hats and baldness change the top of the head, sex and age change the face
    shape, brows and skin texture, and so on.

    Chunk ``i`` is generated from its own generator seeded with ``(seed, i)``
    and written by one worker, so the store depends only on ``seed``, ``n``,
    ``size`` and ``chunk_rows`` -- not on ``n_jobs``.  Memory use is bounded
    by a few chunks per worker.  The store is written to a temporary sibling
    directory that is moved into place at the end, so ``out`` never holds a
    half-written store, and every chunk is written, even one that is all zeros.

    Parameters
    ----------
    out : str or path-like
        Directory of the Zarr group to create.
    n : int, default 202_599
        Number of images (CelebA has 202,599).
    seed : int, default 0
        Non-negative seed.
    size : int, default 80
        Images are ``size`` x ``size`` pixels.
    chunk_rows : int, default 2048
        Images per chunk (2048 images of 80 x 80 are about 13 MB).
    overwrite : bool, default False
        Replace ``out`` if it is a store written by dfairpca (nothing else is replaced).
    progress : bool, default True
        Show a tqdm progress bar.
    n_jobs : int, optional
        Worker processes; default the number of usable CPUs.  ``1`` runs in
        the calling process.  Workers are started with the ``spawn`` method,
        so a script using several needs the usual
        ``if __name__ == "__main__":`` guard.

    Returns
    -------
    pathlib.Path
        ``out``.

    Raises
    ------
    FileExistsError
        If ``out`` exists and ``overwrite`` is False, or ``out`` is not a store written by
        dfairpca (:class:`dfairpca.io.OutputPathError`).
    ValueError
        If an argument is out of range.

    Notes
    -----
    The ``partition`` array splits the rows into contiguous train, valid and
    test blocks in the official proportions (exactly the official sizes when
    ``n`` is 202,599).
    """
    out = Path(out)
    _check_positive(n=n, size=size, chunk_rows=chunk_rows)
    if not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
    with atomic_directory(out, STORE_KIND, overwrite=overwrite) as tmp, writing_every_chunk():
        group = _create_store(
            tmp, n, size, chunk_rows, {"source": "synthetic", "seed": int(seed), "size": size}
        )
        group["partition"][:] = _official_like_partition(n)
        tasks = [
            (str(tmp), i, start, min(start + chunk_rows, n), int(seed), size)
            for i, start in enumerate(range(0, n, chunk_rows))
        ]
        _run_chunks(
            _synth_chunk, tasks, n_jobs=n_jobs, progress=progress, total=n, desc="synth CelebA"
        )
    return out


def ingest_celeba(
    celeba_dir: str | os.PathLike,
    out: str | os.PathLike,
    *,
    size: int = 80,
    chunk_rows: int = 2048,
    overwrite: bool = False,
    progress: bool = True,
    n_jobs: int | None = None,
) -> Path:
    """Convert the official CelebA download into a CelebA store.

    ``celeba_dir`` must hold the official layout: ``img_align_celeba/``
    with the aligned JPEGs (``000001.jpg`` ...), ``list_attr_celeba.txt``
    (a count line, a line with the 40 attribute names, then one line per
    image: the file name and 40 values -1/1 separated by any whitespace) and
    optionally ``list_eval_partition.txt`` (lines ``000001.jpg 0``).

    Each image is center-cropped to a square (the central 178 x 178 of the
    178 x 218 aligned images), converted to grey (Pillow mode ``"L"``) and
    resized to ``size`` x ``size`` with a Lanczos filter.  Attributes become
    0/1 ``int8``.  Chunks of ``chunk_rows`` images are converted in parallel.

    The conversion is resumable: it writes into the sibling directory
    ``.<out name>.partial`` and marks each chunk done once fully written.  If
    it is interrupted, calling it again with the same arguments (and
    ``overwrite=False``) converts only the missing chunks.  At the end the
    partial directory is moved to ``out``.

    Parameters
    ----------
    celeba_dir : str or path-like
        Directory of the CelebA download.
    out : str or path-like
        Directory of the Zarr group to create.
    size : int, default 80
        Output images are ``size`` x ``size`` pixels.
    chunk_rows : int, default 2048
        Images per chunk.
    overwrite : bool, default False
        Replace ``out`` if it is a store written by dfairpca (nothing else is
        replaced), and discard any partial conversion instead of resuming it.
    progress : bool, default True
        Show a tqdm progress bar.
    n_jobs : int, optional
        Worker processes; default the number of usable CPUs.  ``1`` runs in
        the calling process.  Workers are started with the ``spawn`` method,
        so a script using several needs the usual
        ``if __name__ == "__main__":`` guard.

    Returns
    -------
    pathlib.Path
        ``out``.

    Raises
    ------
    FileExistsError
        If ``out`` exists and ``overwrite`` is False, or ``out`` (or the partial
        conversion) is not a store written by dfairpca.
    FileNotFoundError
        If ``list_attr_celeba.txt``, ``img_align_celeba`` or an image listed
        in the attribute file is missing.
    ValueError
        If a list file is malformed (wrong count, names or values) or an
        image cannot be decoded; the message names the file.
    """
    celeba_dir, out = Path(celeba_dir), Path(out)
    _check_positive(size=size, chunk_rows=chunk_rows)
    check_target(out, STORE_KIND, overwrite=overwrite, protect={"the CelebA folder": celeba_dir})
    attr_file = celeba_dir / "list_attr_celeba.txt"
    image_dir = celeba_dir / "img_align_celeba"
    if not attr_file.is_file():
        raise FileNotFoundError(f"CelebA attribute file not found: {attr_file}")
    if not image_dir.is_dir():
        raise FileNotFoundError(f"CelebA image directory not found: {image_dir}")
    files, attributes = _read_attribute_file(attr_file)
    partition_file = celeba_dir / "list_eval_partition.txt"
    partition = _read_partition_file(partition_file, files) if partition_file.exists() else None
    _check_images_exist(image_dir, files, attr_file)

    n = len(files)
    settings = {
        "source": "celeba",
        "size": size,
        "chunk_rows": chunk_rows,
        "celeba_dir": str(celeba_dir.resolve()),
        "list_attr_sha256": hashlib.sha256(attr_file.read_bytes()).hexdigest(),
    }
    partial = out.parent / f".{out.name}.partial"
    done_dir = partial / _DONE_DIR
    if overwrite or not _is_resumable(partial, settings, n):
        remove_directory(partial, STORE_KIND)
        with writing_every_chunk():
            group = _create_store(partial, n, size, chunk_rows, settings, partition is not None)
            group["attributes"][:] = attributes
            if partition is not None:
                group["partition"][:] = partition
        done_dir.mkdir()
    done = {int(p.name) for p in done_dir.iterdir()}
    paths = [str(image_dir / f) for f in files]
    tasks = [
        (str(partial), i, start, paths[start : start + chunk_rows], size)
        for i, start in enumerate(range(0, n, chunk_rows))
        if i not in done
    ]
    _run_chunks(
        _ingest_chunk,
        tasks,
        n_jobs=n_jobs,
        progress=progress,
        total=n,
        initial=n - sum(len(t[3]) for t in tasks),
        desc="ingest CelebA",
    )
    shutil.rmtree(done_dir)
    move_into_place(partial, out, STORE_KIND, overwrite=overwrite)
    return out


def open_celeba(path: str | os.PathLike | zarr.Group) -> tuple[zarr.Array, zarr.Array, list[str]]:
    """Open a CelebA store for reading.

    Parameters
    ----------
    path : str, path-like or zarr.Group
        Directory of the store, or an already opened group.

    Returns
    -------
    images : zarr.Array
        ``uint8`` array of shape ``(n, size, size)``.
    attributes : zarr.Array
        ``int8`` array of shape ``(n, k)`` with 0/1 values.
    names : list of str
        The ``k`` attribute names, in column order.

    Raises
    ------
    FileNotFoundError
        If ``path`` does not exist.
    ValueError
        If ``path`` is not a Zarr group, lacks ``images`` or ``attributes``
        (the message lists what it holds), or the arrays have the wrong
        shape, dtype or names.
    """
    group = _open_group(path)
    missing = [key for key in ("images", "attributes") if key not in group]
    if missing:
        raise ValueError(
            f"{_describe(path)} is not a CelebA store: it has no {' or '.join(missing)} "
            f"array; it contains {sorted(group.keys()) or 'nothing'}"
        )
    images, attributes = group["images"], group["attributes"]
    for key, array in (("images", images), ("attributes", attributes)):
        if not isinstance(array, zarr.Array):
            raise ValueError(f"{_describe(path)}: {key!r} is a group, expected an array")
    if images.ndim != 3 or images.dtype != np.uint8 or images.shape[1] != images.shape[2]:
        raise ValueError(
            f"{_describe(path)}: images must be a uint8 array of shape (n, size, size), "
            f"got {images.dtype} {images.shape}"
        )
    if attributes.ndim != 2 or attributes.shape[0] != images.shape[0]:
        raise ValueError(
            f"{_describe(path)}: attributes must have shape ({images.shape[0]}, k), "
            f"got {attributes.shape}"
        )
    names = list(attributes.attrs.get("names", []))
    if len(names) != attributes.shape[1]:
        raise ValueError(
            f"{_describe(path)}: attributes.attrs['names'] must list {attributes.shape[1]} "
            f"names, got {len(names)}"
        )
    return images, attributes, names


def attribute_column(path_or_group: str | os.PathLike | zarr.Group, name: str) -> np.ndarray:
    """Read one attribute of a CelebA store.

    Parameters
    ----------
    path_or_group : str, path-like or zarr.Group
        The store, as for :func:`open_celeba`.
    name : str
        Attribute name, e.g. ``"Eyeglasses"``.

    Returns
    -------
    numpy.ndarray
        ``int8`` array of shape ``(n,)`` with 0/1 values.

    Raises
    ------
    ValueError
        If the store has no attribute ``name``; the message suggests the
        closest name and lists the valid ones.
    """
    _, attributes, names = open_celeba(path_or_group)
    if name not in names:
        lowered = {candidate.lower(): candidate for candidate in names}
        close = difflib.get_close_matches(str(name).lower(), lowered, n=1)
        hint = f"; did you mean {lowered[close[0]]!r}?" if close else ""
        raise ValueError(
            f"unknown attribute {name!r}{hint} Valid names: {', '.join(names)}"
        )
    column = read_checked(attributes, (slice(None), names.index(name)))
    return np.asarray(column, dtype=np.int8)


# --------------------------------------------------------------------------
# Store plumbing
# --------------------------------------------------------------------------


def _check_positive(**values: int) -> None:
    """Raise ValueError unless every value is a positive integer."""
    for key, value in values.items():
        if not isinstance(value, (int, np.integer)) or value < 1:
            raise ValueError(f"{key} must be a positive integer, got {value!r}")


def _create_store(
    path: Path, n: int, size: int, chunk_rows: int, attrs: dict, with_partition: bool = True
) -> zarr.Group:
    """Create an empty CelebA store at ``path``, marked as dfairpca's, and return its group.

    Call it, and write through the group, inside :func:`dfairpca.io.writing_every_chunk`:
    Zarr takes that setting when an array is opened, and ``group[name]`` opens it anew.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    group = zarr.open_group(
        path, mode="w", zarr_format=3, attributes={**attrs, **marker_attributes(STORE_KIND)}
    )
    group.create_array(
        "images", shape=(n, size, size), chunks=(chunk_rows, size, size), dtype="uint8"
    )
    group.create_array(
        "attributes",
        shape=(n, len(ATTRIBUTE_NAMES)),
        chunks=(chunk_rows, len(ATTRIBUTE_NAMES)),
        dtype="int8",
        attributes={"names": list(ATTRIBUTE_NAMES)},
    )
    if with_partition:
        group.create_array(
            "partition",
            shape=(n,),
            chunks=(chunk_rows,),
            dtype="int8",
            attributes={"values": {"0": "train", "1": "valid", "2": "test"}},
        )
    return group


def _open_group(path: str | os.PathLike | zarr.Group) -> zarr.Group:
    """Open ``path`` (or reopen a group) for reading; an absent chunk is an error, not zeros.

    dfairpca's stores hold every chunk, so one that is missing was lost: reading it as
    the fill value would give a face of zeros or an attribute of 0 without a word.
    """
    if isinstance(path, zarr.Group):
        return strict_group(path)
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"no such CelebA store: {path}")
    if not path.is_dir():
        raise ValueError(f"{path} is not a Zarr group (it is a file, not a directory)")
    try:
        return strict_group(zarr.open_group(path, mode="r"))
    except (zarr.errors.BaseZarrError, ValueError) as exc:
        raise ValueError(f"{path} is not a Zarr group: {exc}") from exc


def _describe(path: str | os.PathLike | zarr.Group) -> str:
    """Name a store in error messages."""
    return f"Zarr group {path.store_path}" if isinstance(path, zarr.Group) else str(path)


def _official_like_partition(n: int) -> np.ndarray:
    """Contiguous train/valid/test labels in the official CelebA proportions."""
    total = sum(_CELEBA_SPLIT)
    train_end = round(n * _CELEBA_SPLIT[0] / total)
    valid_end = round(n * (_CELEBA_SPLIT[0] + _CELEBA_SPLIT[1]) / total)
    partition = np.full(n, 2, dtype=np.int8)
    partition[:train_end] = 0
    partition[train_end:valid_end] = 1
    return partition


def _run_chunks(
    func: Callable[..., int],
    tasks: Sequence[tuple],
    *,
    n_jobs: int | None,
    progress: bool,
    total: int,
    desc: str,
    initial: int = 0,
) -> None:
    """Run ``func(*task)`` for every task, in parallel, with a progress bar.

    ``func`` returns the number of images it wrote.  Workers are started with
    the ``spawn`` method, which is safe whatever threads the caller runs.  On
    the first failure, pending tasks are cancelled and the error is re-raised.
    """
    if n_jobs is None:
        n_jobs = cpu_count()
    _check_positive(n_jobs=n_jobs)
    n_jobs = min(n_jobs, max(len(tasks), 1))
    with tqdm(total=total, initial=initial, desc=desc, unit="img", disable=not progress) as bar:
        if n_jobs == 1:
            for task in tasks:
                bar.update(func(*task))
            return
        context = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(n_jobs, mp_context=context) as pool:
            futures = [pool.submit(func, *task) for task in tasks]
            try:
                for future in as_completed(futures):
                    bar.update(future.result())
            except BaseException:
                pool.shutdown(wait=True, cancel_futures=True)
                raise


# --------------------------------------------------------------------------
# Ingesting the official download
# --------------------------------------------------------------------------


def _read_attribute_file(path: Path) -> tuple[list[str], np.ndarray]:
    """Parse ``list_attr_celeba.txt`` into file names and 0/1 ``int8`` attributes."""
    lines = path.read_text().splitlines()
    if len(lines) < 2:
        raise ValueError(f"{path}: expected a count line and a line of attribute names")
    try:
        count = int(lines[0])
    except ValueError:
        raise ValueError(
            f"{path}, line 1: expected the number of images, got {lines[0]!r}"
        ) from None
    names = tuple(lines[1].split())
    if names != ATTRIBUTE_NAMES:
        unknown = [name for name in names if name not in ATTRIBUTE_NAMES]
        absent = [name for name in ATTRIBUTE_NAMES if name not in names]
        detail = (
            f"unknown {unknown}, missing {absent}"
            if unknown or absent
            else "the names are in a different order"
        )
        raise ValueError(
            f"{path}, line 2: expected the 40 CelebA attribute names in the official "
            f"order ({detail}); got {' '.join(names)!r}"
        )
    rows = [(number, line.split()) for number, line in enumerate(lines[2:], 3) if line.strip()]
    if len(rows) != count:
        raise ValueError(f"{path}: line 1 says {count} images but {len(rows)} rows follow")
    allowed = {"-1", "1"}
    for number, fields in rows:
        if len(fields) != len(ATTRIBUTE_NAMES) + 1:
            raise ValueError(
                f"{path}, line {number}: expected a file name and {len(ATTRIBUTE_NAMES)} "
                f"values, got {len(fields)} fields"
            )
        if not allowed.issuperset(fields[1:]):
            bad = next(value for value in fields[1:] if value not in allowed)
            raise ValueError(
                f"{path}, line {number}: attribute values must be -1 or 1, got {bad!r}"
            )
    text = " ".join(" ".join(fields[1:]) for _, fields in rows)
    values = np.fromstring(text, dtype=np.int8, sep=" ").reshape(count, len(ATTRIBUTE_NAMES))
    return [fields[0] for _, fields in rows], (values > 0).astype(np.int8)


def _read_partition_file(path: Path, files: list[str]) -> np.ndarray:
    """Parse ``list_eval_partition.txt`` into labels aligned with ``files``."""
    labels = {}
    for number, line in enumerate(path.read_text().splitlines(), 1):
        fields = line.split()
        if not fields:
            continue
        if len(fields) != 2 or fields[1] not in ("0", "1", "2"):
            raise ValueError(
                f"{path}, line {number}: expected '<file name> <0, 1 or 2>', got {line!r}"
            )
        labels[fields[0]] = int(fields[1])
    missing = [name for name in files if name not in labels]
    if missing:
        raise ValueError(
            f"{path}: no partition for {len(missing)} image(s) of list_attr_celeba.txt, "
            f"e.g. {missing[0]}"
        )
    return np.array([labels[name] for name in files], dtype=np.int8)


def _check_images_exist(image_dir: Path, files: list[str], attr_file: Path) -> None:
    """Raise FileNotFoundError naming the first listed image not in ``image_dir``."""
    present = set(os.listdir(image_dir))
    missing = [name for name in files if name not in present]
    if missing:
        raise FileNotFoundError(
            f"image file not found: {image_dir / missing[0]} ({len(missing)} of the images "
            f"listed in {attr_file} are missing)"
        )


def _is_resumable(partial: Path, settings: dict, n: int) -> bool:
    """Whether ``partial`` is an interrupted conversion with the same settings."""
    if not (partial / _DONE_DIR).is_dir():
        return False
    try:
        group = zarr.open_group(partial, mode="r")
        return (dict(group.attrs) == {**settings, **marker_attributes(STORE_KIND)}
                and group["images"].shape[0] == n)
    except (zarr.errors.BaseZarrError, KeyError, ValueError, OSError):
        return False


def _load_image(path: str, size: int) -> np.ndarray:
    """Read one image as a centre-cropped, grey, ``size`` x ``size`` uint8 array."""
    try:
        with Image.open(path) as image:
            width, height = image.size
            side = min(width, height)
            left, top = (width - side) // 2, (height - side) // 2
            square = image.crop((left, top, left + side, top + side)).convert("L")
    except FileNotFoundError:
        raise FileNotFoundError(f"image file not found: {path}") from None
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as exc:
        raise ValueError(f"corrupt or unreadable image {path}: {exc}") from exc
    return np.asarray(square.resize((size, size), Image.Resampling.LANCZOS), dtype=np.uint8)


def _ingest_chunk(store: str, index: int, start: int, paths: list[str], size: int) -> int:
    """Convert one chunk of images into ``store`` and mark it done."""
    block = np.empty((len(paths), size, size), dtype=np.uint8)
    for k, path in enumerate(paths):
        block[k] = _load_image(path, size)
    with writing_every_chunk():
        images = zarr.open_array(Path(store) / "images", mode="r+")
    images[start : start + len(paths)] = block
    (Path(store) / _DONE_DIR / str(index)).touch()
    return len(paths)


# --------------------------------------------------------------------------
# Synthetic attributes
# --------------------------------------------------------------------------

# P(young | female), P(young | male): CelebA is 77% Young, men older on average.
_P_YOUNG = (0.86, 0.65)

# Attributes drawn independently given sex and age:
# name -> (P(attr | female), P(attr | male), odds-like ratio old/young).
# The age ratio redistributes the per-sex prevalence between young and old
# people without changing it.
_GIVEN_SEX_AND_AGE = {
    "Smiling": (0.52, 0.43, 1.0),
    "Attractive": (0.68, 0.28, 0.25),
    "Arched_Eyebrows": (0.41, 0.07, 0.8),
    "Bags_Under_Eyes": (0.10, 0.35, 2.5),
    "Bangs": (0.218, 0.06, 0.8),
    "Big_Lips": (0.28, 0.19, 1.0),
    "Big_Nose": (0.10, 0.42, 1.8),
    "Blurry": (0.05, 0.052, 1.0),
    "Bushy_Eyebrows": (0.07, 0.24, 1.0),
    "Chubby": (0.02, 0.11, 3.0),
    "Double_Chin": (0.02, 0.085, 4.0),
    "Eyeglasses": (0.04, 0.10, 2.5),
    "Narrow_Eyes": (0.115, 0.115, 1.2),
    "Oval_Face": (0.34, 0.20, 0.9),
    "Pale_Skin": (0.06, 0.02, 0.8),
    "Pointy_Nose": (0.36, 0.16, 0.9),
    "Receding_Hairline": (0.045, 0.13, 3.0),
    "Rosy_Cheeks": (0.109, 0.005, 0.7),
    "Wearing_Earrings": (0.31, 0.02, 0.9),
    "Wearing_Necklace": (0.204, 0.01, 1.0),
    "Wearing_Necktie": (0.003, 0.17, 2.0),
    "5_o_Clock_Shadow": (0.005, 0.26, 1.0),
    "Heavy_Makeup": (0.657, 0.01, 0.5),
    "Bald": (0.001, 0.052, 6.0),
    "Gray_Hair": (0.03, 0.06, 30.0),
    "Wearing_Hat": (0.045, 0.055, 1.0),
    "beard": (0.004, 0.39, 1.3),  # any beard: the complement of No_Beard
}
# Hair colour of people without grey hair: P(Black, Blond, Brown | female / male);
# the rest have another colour (red, auburn, unlabelled).
_HAIR_COLOUR = {"female": (0.235, 0.25, 0.24), "male": (0.29, 0.02, 0.19)}


def _sample_attributes(rng: np.random.Generator, n: int) -> np.ndarray:
    """Draw ``n`` rows of CelebA-like 0/1 attributes, shape ``(n, 40)``."""
    male = rng.random(n) < 0.417
    p_young = np.where(male, _P_YOUNG[1], _P_YOUNG[0])
    young = rng.random(n) < p_young
    a = {"Male": male, "Young": young}
    for name, (p_female, p_male, old_ratio) in _GIVEN_SEX_AND_AGE.items():
        p = np.where(male, p_male, p_female) / (p_young + old_ratio * (1 - p_young))
        a[name] = rng.random(n) < np.minimum(np.where(young, p, old_ratio * p), 1.0)

    # Hair: one colour and one texture at most; bald heads have neither.
    colour = rng.random(n)
    black, blond, brown = (np.where(male, m, f) for f, m in zip(*_HAIR_COLOUR.values()))
    has_hair = ~a["Bald"]
    a["Black_Hair"] = has_hair & ~a["Gray_Hair"] & (colour < black)
    a["Blond_Hair"] = has_hair & ~a["Gray_Hair"] & (colour >= black) & (colour < black + blond)
    a["Brown_Hair"] = (
        has_hair & ~a["Gray_Hair"] & (colour >= black + blond) & (colour < black + blond + brown)
    )
    texture = rng.random(n)
    a["Wavy_Hair"] = has_hair & (texture < np.where(male, 0.15, 0.44))
    a["Straight_Hair"] = has_hair & (texture > 1 - np.where(male, 0.22, 0.2))
    a["Bangs"] &= has_hair
    a["Wearing_Hat"] &= ~a["Bald"] | (rng.random(n) < 0.05)

    # Facial hair: goatees, most moustaches and sideburns come with a beard.
    beard = a.pop("beard")
    a["Goatee"] = beard & (rng.random(n) < 0.38)
    a["Mustache"] = rng.random(n) < np.where(beard, 0.2, np.where(male, 0.03, 0.001))
    a["Sideburns"] = rng.random(n) < np.where(beard, 0.3, np.where(male, 0.02, 0.002))
    a["No_Beard"] = ~beard

    # Make-up and lipstick go together; smiles raise cheeks and open mouths.
    a["Wearing_Lipstick"] = rng.random(n) < np.where(
        a["Heavy_Makeup"], np.where(male, 0.8, 0.97), np.where(male, 0.003, 0.5)
    )
    a["High_Cheekbones"] = rng.random(n) < np.where(a["Smiling"], 0.8, 0.135)
    a["Mouth_Slightly_Open"] = rng.random(n) < np.where(a["Smiling"], 0.7, 0.28)
    return np.stack([a[name] for name in ATTRIBUTE_NAMES], axis=1).astype(np.int8)


# --------------------------------------------------------------------------
# Synthetic faces
# --------------------------------------------------------------------------
#
# Faces are drawn in "face coordinates" (u, v): the image spans [-1, 1] in
# both directions at the neutral pose, u to the right, v downwards.  A face
# is centred at (0, 0.14) with half-width ~0.46 and half-height ~0.68; the
# eyes are at v = 0.02, u = +-0.22, the nose tip at v = 0.29 and the mouth at
# v = 0.49, like the aligned CelebA crops.  Every feature is a soft ellipse
# (or a band) in these coordinates; mirror-symmetric pairs use |u|.


def _face_params(rng: np.random.Generator, attributes: np.ndarray) -> dict[str, np.ndarray]:
    """Per-image drawing parameters (float32 arrays of shape ``(n,)``)."""
    n = len(attributes)
    a = {name: attributes[:, j].astype(np.float32) for j, name in enumerate(ATTRIBUTE_NAMES)}
    male, old, smiling = a["Male"], 1 - a["Young"], a["Smiling"]

    def uniform(low, high):
        return rng.uniform(low, high, n)

    def normal(scale, limit=np.inf):
        return np.clip(rng.normal(0.0, scale, n), -limit, limit)

    p = {
        # Pose and lighting.
        "theta": normal(0.06, 0.15),
        "scale": 1 + normal(0.04, 0.1),
        "tx": normal(0.025, 0.06),
        "ty": normal(0.025, 0.06),
        "gain": uniform(0.8, 1.15),
        "light": normal(0.22, 0.5) * (1 - 0.5 * a["Attractive"]),
        "noise": 0.01 + 0.012 * male + 0.012 * old - 0.007 * a["Heavy_Makeup"]
        - 0.004 * a["Attractive"] + uniform(0.0, 0.01),
        # Surroundings.
        "bg": uniform(0.15, 0.9),
        "bg_gx": normal(0.12),
        "bg_gy": normal(0.12),
        "clothes": uniform(0.05, 0.9),
        # Face shape and skin.
        "skin": np.clip(0.6 + normal(0.06) + 0.14 * a["Pale_Skin"] - 0.03 * male, 0.3, 0.92),
        "face_a": 0.445 + 0.035 * male + 0.05 * a["Chubby"] - 0.03 * a["Oval_Face"]
        + normal(0.012),
        "face_b": 0.67 + 0.04 * a["Oval_Face"] + 0.02 * old + normal(0.015),
        "taper": np.clip(0.5 - 0.25 * male - 0.12 * a["Chubby"] + normal(0.05), 0.05, 0.8),
        "wrinkle": old * uniform(0.02, 0.05),
        "wrinkle_phase": uniform(0, 2 * np.pi),
        # Hair.
        "hair_len": np.where(male > 0, uniform(0.0, 0.25), uniform(0.35, 1.0)),
        "has_hair": 1 - a["Bald"],
        "hairline": -0.44 + normal(0.03) + 0.28 * a["Bangs"] - 0.12 * a["Receding_Hairline"],
        "hairline_curve": 0.9 - 0.4 * a["Bangs"] - 1.5 * a["Receding_Hairline"],
        "wave": 0.08 * a["Wavy_Hair"],
        "straight": 0.05 * a["Straight_Hair"],
        "hair_phase": uniform(0, 2 * np.pi),
        # Eyes and brows.
        "eye_x": 0.215 + normal(0.01),
        "eye_y": 0.02 + normal(0.01),
        "eye_a": 0.085 + 0.006 * a["Attractive"],
        "eye_b": (0.042 - 0.018 * a["Narrow_Eyes"]) * (1 - 0.15 * smiling),
        "iris": uniform(0.08, 0.25),
        "socket": 0.06 + 0.12 * a["Heavy_Makeup"] + 0.03 * a["Bags_Under_Eyes"],
        "liner": 0.25 + 0.4 * a["Heavy_Makeup"],
        "brow_y": -0.11 + 0.012 * male - 0.015 * a["Arched_Eyebrows"] + normal(0.012),
        "brow_b": 0.017 + 0.014 * a["Bushy_Eyebrows"] + 0.004 * male,
        "brow_arch": 0.02 + 0.045 * a["Arched_Eyebrows"],
        # Nose and mouth.
        "nose_w": 0.055 * (1 + 0.3 * a["Big_Nose"]) * (1 - 0.2 * a["Pointy_Nose"]),
        "nose_len": 0.16 * (1 + 0.15 * a["Big_Nose"]),
        "nose_tip": 0.04 + 0.04 * a["Pointy_Nose"],
        "mouth_y": 0.49 + normal(0.012),
        "mouth_w": 0.15 + 0.05 * smiling + normal(0.01),
        "curve": 1.5 * smiling + normal(0.3),
        "lip_b": 0.028 + 0.015 * a["Big_Lips"],
        "lip_dark": 0.25 + 0.35 * a["Wearing_Lipstick"],
        "open_b": (0.02 + 0.012 * smiling) * a["Mouth_Slightly_Open"],
        "teeth": smiling,
        # Accessories.
        "glasses_a": 0.13 + normal(0.008),
        "glasses_b": 0.095 + normal(0.006),
        "frame": uniform(0.02, 0.35),
        "lens": np.where(rng.random(n) < 0.3, uniform(0.55, 0.8), uniform(0.0, 0.15)),
        "hat": uniform(0.05, 0.95),
        "hat_line": -0.38 + normal(0.04),
    }
    # Hair colour, also used for brows, beards and sideburns.
    other = rng.uniform(0.15, 0.45, n)
    hair = (
        a["Black_Hair"] * 0.1
        + a["Brown_Hair"] * 0.3
        + a["Blond_Hair"] * 0.68
        + a["Gray_Hair"] * 0.62
        + (1 - a["Black_Hair"] - a["Brown_Hair"] - a["Blond_Hair"] - a["Gray_Hair"]) * other
    )
    p["hair"] = np.clip(hair + normal(0.04), 0.02, 0.9)
    p["brow"] = np.minimum(p["hair"], 0.35) * 0.8
    p["beard"] = np.minimum(p["hair"], 0.5) * 0.8
    return {key: np.asarray(value, dtype=np.float32) for key, value in p.items()}


class _Canvas:
    """A batch of images being painted, with the face coordinates of each pixel.

    Parameters
    ----------
    img, u, v : numpy.ndarray
        float32 arrays of shape ``(B, h, w)``: grey levels in [0, 1] and the
        face coordinates of every pixel.
    p : dict of numpy.ndarray
        Drawing parameters, float32 arrays of shape ``(B, 1, 1)``, including
        the pose (``theta``, ``scale``, ``tx``, ``ty``).

    Notes
    -----
    Whole canvases (``h = w`` = the image size) can be cropped to windows
    with :meth:`crop` and :meth:`ellipse`; a window's arrays are views, so
    painting a window paints the images.
    """

    def __init__(self, img: np.ndarray, u: np.ndarray, v: np.ndarray, p: dict):
        self.img, self.u, self.v, self.p = img, u, v, p

    @cached_property
    def au(self) -> np.ndarray:
        """``|u|``, to draw mirror-symmetric pairs of features at once."""
        return np.abs(self.u)

    def crop(self, u0, u1, v0, v1) -> _Canvas:
        """Window of this whole canvas holding the face-coordinate box [u0, u1] x [v0, v1].

        The bounds may be per-image arrays; the window covers the box in
        every image of the batch.
        """
        p, size = self.p, self.img.shape[-1]
        cos, sin = p["scale"] * np.cos(p["theta"]), p["scale"] * np.sin(p["theta"])
        corners = [(u, v) for u in (u0, u1) for v in (v0, v1)]
        xs = [p["tx"] + cos * u - sin * v for u, v in corners]
        ys = [p["ty"] + sin * u + cos * v for u, v in corners]

        def pixels(coords):
            low = (min(np.min(c) for c in coords) + 1) * size / 2 - 0.5
            high = (max(np.max(c) for c in coords) + 1) * size / 2 - 0.5
            start, stop = np.clip([np.floor(low), np.ceil(high) + 1], 0, size).astype(int)
            return slice(start, stop)

        window = (slice(None), pixels(ys), pixels(xs))
        return _Canvas(self.img[window], self.u[window], self.v[window], self.p)

    def mask(self, cu, cv, a, b, *, soft=0.3, mirror=False, shear=None, bend=None) -> np.ndarray:
        """Soft mask of an ellipse centred at (cu, cv) with half-axes (a, b).

        ``soft`` is the width of the edge ramp in units of the squared
        normalised radius; ``mirror`` draws the pair at (+-cu, cv); ``shear``
        slants the ellipse (u shifts by ``shear * (v - cv)``) and ``bend``
        curves it (v shifts by ``-bend * (u - cu) ** 2``).
        """
        dv = self.v - cv
        du = (self.au if mirror else self.u) - cu
        if shear is not None:
            du -= shear * dv
        if bend is not None:
            dv += bend * np.square(du)
        r = np.square(du / a) + np.square(dv / b)
        return np.clip((1.0 - r) / soft, 0.0, 1.0)

    def ellipse(self, cu, cv, a, b, *, soft=0.3, mirror=False, shear=None, bend=None):
        """The smallest window holding an ellipse (see :meth:`mask`) and its mask there.

        Returns
        -------
        window : _Canvas
            Window of this whole canvas.
        mask : numpy.ndarray
            The ellipse's mask on the window.
        """
        reach = np.max(np.abs(bend)) * np.square(a) if bend is not None else 0.0
        half_u = a + (abs(shear) * (b + reach) if shear is not None else 0.0)
        high_u = np.max(cu + half_u)
        low_u = -high_u if mirror else np.min(cu - half_u)
        low_v = np.min(cv - b - (np.maximum(bend, 0) * np.square(a) if bend is not None else 0.0))
        high_v = np.max(cv + b + (np.maximum(-bend, 0) * np.square(a) if bend is not None else 0.0))
        window = self.crop(low_u, high_u, low_v, high_v)
        mask = window.mask(cu, cv, a, b, soft=soft, mirror=mirror, shear=shear, bend=bend)
        return window, mask

    def paint(self, mask: np.ndarray, value) -> None:
        """Blend ``value`` into the images with opacity ``mask``."""
        self.img += mask * (value - self.img)

    def shade(self, mask: np.ndarray, amount) -> None:
        """Add ``amount`` (negative darkens) where ``mask`` is on."""
        self.img += mask * amount

    def paint_ellipse(self, value, *args, **kwargs) -> None:
        """Paint ``value`` into an ellipse; the other arguments are those of :meth:`mask`."""
        window, mask = self.ellipse(*args, **kwargs)
        window.paint(mask, value)

    def shade_ellipse(self, amount, *args, **kwargs) -> None:
        """Shade an ellipse by ``amount``; the other arguments are those of :meth:`mask`."""
        window, mask = self.ellipse(*args, **kwargs)
        window.shade(mask, amount)

    def face(self) -> np.ndarray:
        """Soft mask of the face oval, narrowing towards the chin."""
        p = self.p
        dv = self.v - 0.14
        half_width = p["face_a"] * (1 - p["taper"] * np.clip(dv, 0.0, None))
        r = np.square(self.u / half_width) + np.square(dv / p["face_b"])
        return np.clip((1.0 - r) / 0.12, 0.0, 1.0)

    def hair(self) -> np.ndarray:
        """Hair grey levels with wavy or straight texture."""
        p = self.p
        wave = p["wave"] * np.sin(30 * self.v + p["hair_phase"])
        strands = p["straight"] * np.sin(80 * self.u + p["hair_phase"])
        return p["hair"] * (1 + wave + strands)

    def apply(self, flags: np.ndarray, draw: Callable[[_Canvas], None]) -> None:
        """Run ``draw`` on the sub-batch of images whose ``flags`` are set."""
        index = np.flatnonzero(flags)
        if index.size:
            p = {key: value[index] for key, value in self.p.items()}
            sub = _Canvas(self.img[index], self.u[index], self.v[index], p)
            draw(sub)
            self.img[index] = sub.img


def _draw_tie(c: _Canvas) -> None:
    """White shirt collar and a dark necktie."""
    c.paint_ellipse(0.9, 0.0, 1.0, 0.16, 0.14, soft=0.4)
    c.paint_ellipse(0.12, 0.0, 1.07, 0.055, 0.2, soft=0.4)


def _draw_necklace(c: _Canvas) -> None:
    """Bright chain along the base of the neck."""
    window, outer = c.ellipse(0.0, 0.9, 0.24, 0.16, soft=0.35)
    ring = outer * (1 - window.mask(0.0, 0.9, 0.21, 0.13)) * (window.v > 0.9)
    window.paint(ring, 0.92)


def _draw_scalp(c: _Canvas) -> None:
    """Bare skin on top of a bald head, with a highlight."""
    p = c.p
    c.paint_ellipse(p["skin"] * 1.04, 0.0, -0.1, p["face_a"] + 0.03, 0.76, soft=0.15)
    c.shade_ellipse(0.08, 0.0, -0.55, 0.2, 0.12, soft=1.0)


def _draw_wrinkles(c: _Canvas) -> None:
    """Horizontal forehead lines of older people."""
    p = c.p
    window, mask = c.ellipse(0.0, -0.28, 0.28, 0.09, soft=1.0)
    window.shade(mask, p["wrinkle"] * np.sin(70 * window.v + p["wrinkle_phase"]))


def _draw_eye_bags(c: _Canvas) -> None:
    """Dark crescents under the eyes."""
    p = c.p
    c.shade_ellipse(-0.09, p["eye_x"], p["eye_y"] + 0.065, 0.075, 0.022, soft=0.6, mirror=True)


def _draw_cheekbones(c: _Canvas) -> None:
    """Highlights on high cheekbones."""
    c.shade_ellipse(0.06, 0.25, 0.17, 0.11, 0.07, soft=1.0, mirror=True)


def _draw_rosy_cheeks(c: _Canvas) -> None:
    """Red (darker in grey) cheeks."""
    c.shade_ellipse(-0.05, 0.26, 0.24, 0.1, 0.07, soft=1.0, mirror=True)


def _draw_smile_folds(c: _Canvas) -> None:
    """Nasolabial folds of a smiling face."""
    c.shade_ellipse(-0.07, 0.18, 0.33, 0.018, 0.12, soft=0.9, mirror=True, shear=0.3)


def _draw_beard(c: _Canvas) -> None:
    """Beard over the jaw and chin."""
    p = c.p
    window = c.crop(-p["face_a"], p["face_a"], 0.36, 0.14 + p["face_b"])
    window.paint(window.face() * np.clip((window.v - 0.36) / 0.08, 0.0, 0.85), p["beard"])


def _draw_stubble(c: _Canvas) -> None:
    """Five o'clock shadow: a light darkening of the lower face."""
    p = c.p
    window = c.crop(-p["face_a"], p["face_a"], 0.33, 0.14 + p["face_b"])
    window.shade(window.face() * np.clip((window.v - 0.33) / 0.12, 0.0, 1.0), -0.07)


def _draw_goatee(c: _Canvas) -> None:
    """Dark tuft on the chin."""
    c.paint_ellipse(c.p["beard"] * 0.9, 0.0, 0.66, 0.13, 0.12, soft=0.5)


def _draw_sideburns(c: _Canvas) -> None:
    """Hair strips in front of the ears."""
    p = c.p
    c.paint_ellipse(p["hair"], p["face_a"] - 0.03, 0.05, 0.045, 0.16, soft=0.5, mirror=True)


def _draw_double_chin(c: _Canvas) -> None:
    """Crease under the chin."""
    c.shade_ellipse(-0.08, 0.0, 0.17 + c.p["face_b"], 0.2, 0.045, soft=0.7)


def _draw_mustache(c: _Canvas) -> None:
    """Moustache above the upper lip, following its curve."""
    p = c.p
    top = p["mouth_y"] - p["lip_b"] - 0.025
    c.paint_ellipse(
        p["beard"] * 0.9, 0.0, top, p["mouth_w"] * 1.05, 0.028, soft=0.5, bend=0.5 * p["curve"]
    )


def _draw_glasses(c: _Canvas) -> None:
    """Tinted lenses and frames (rims, bridge, temples)."""
    p = c.p
    a, b = p["glasses_a"], p["glasses_b"]
    reach = p["eye_x"] + 1.2 * a
    window = c.crop(-reach, reach, p["eye_y"] - 1.2 * b, p["eye_y"] + 1.2 * b)
    r = np.square((window.au - p["eye_x"]) / a) + np.square((window.v - p["eye_y"]) / b)
    window.img *= 1 - p["lens"] * np.clip((1.0 - r) / 0.15, 0.0, 1.0)
    window.paint(np.clip((0.3 - np.abs(r - 1.0)) / 0.15, 0.0, 1.0), p["frame"])
    c.paint_ellipse(p["frame"], 0.0, p["eye_y"] - 0.01, p["eye_x"] - a + 0.02, 0.014, soft=0.5)
    c.paint_ellipse(
        p["frame"], p["eye_x"] + a + 0.06, p["eye_y"] - 0.015, 0.07, 0.013, soft=0.5, mirror=True
    )


def _draw_hat(c: _Canvas) -> None:
    """Crown over the top of the head and a brim at the hat line."""
    p = c.p
    window, crown = c.ellipse(0.0, p["hat_line"] - 0.25, p["face_a"] + 0.22, 0.55, soft=0.2)
    window.paint(crown * np.clip((p["hat_line"] - window.v) / 0.03, 0.0, 1.0), p["hat"])
    c.paint_ellipse(p["hat"], 0.0, p["hat_line"], p["face_a"] + 0.3, 0.05, soft=0.5)


def _draw_earrings(c: _Canvas) -> None:
    """Bright studs on the ear lobes."""
    c.paint_ellipse(0.95, c.p["face_a"] + 0.005, 0.26, 0.02, 0.03, soft=0.6, mirror=True)


def _draw_blur(c: _Canvas) -> None:
    """Out-of-focus blur, a box about 5 pixels wide at 80 x 80."""
    c.img = _box_blur(c.img, max(1, round(c.img.shape[-1] / 40)))


def _box_blur(img: np.ndarray, radius: int) -> np.ndarray:
    """Blur a ``(B, H, W)`` stack with a ``2 * radius + 1`` box, edges replicated."""
    width = 2 * radius + 1
    for axis in (1, 2):
        pad = [(0, 0)] * 3
        pad[axis] = (radius + 1, radius)
        sums = np.cumsum(np.pad(img, pad, mode="edge"), axis=axis)
        length = sums.shape[axis] - width
        img = sums.take(range(width, width + length), axis) - sums.take(range(length), axis)
        img /= width
    return img


def _render_faces(
    rng: np.random.Generator, p: dict[str, np.ndarray], flags: dict[str, np.ndarray], size: int
) -> np.ndarray:
    """Draw one batch of faces as a ``(B, size, size)`` uint8 array.

    ``p`` holds float32 parameters of shape ``(B, 1, 1)`` (see
    :func:`_face_params`) and ``flags`` boolean attribute arrays of shape
    ``(B,)`` selecting the images that get optional features.
    """
    grid = (np.arange(size, dtype=np.float32) + 0.5) * np.float32(2 / size) - 1
    x, y = grid[None, None, :], grid[None, :, None]

    # Face coordinates: undo the pose (shift, then rotation and scale).
    cos, sin = np.cos(p["theta"]) / p["scale"], np.sin(p["theta"]) / p["scale"]
    dx, dy = x - p["tx"], y - p["ty"]
    background = p["bg"] + p["bg_gx"] * x + p["bg_gy"] * y
    c = _Canvas(background, dx * cos + dy * sin, dy * cos - dx * sin, p)

    # Clothes, hair behind the head, neck, scalp, ears.
    c.paint_ellipse(p["clothes"], 0.0, 1.55, 1.05, 0.68, soft=0.15)
    c.apply(flags["Wearing_Necktie"], _draw_tie)
    length = p["hair_len"]
    window, back_hair = c.ellipse(
        0.0, -0.05 + 0.3 * length, 0.6 + 0.17 * length, 0.82 + 0.28 * length, soft=0.15
    )
    window.paint(back_hair * p["has_hair"], window.hair())
    c.apply(flags["Wearing_Necklace"], _draw_necklace)
    c.paint_ellipse(p["skin"] * 0.78, 0.0, 0.95, 0.22, 0.4, soft=0.3)
    c.apply(flags["Bald"], _draw_scalp)
    c.paint_ellipse(p["skin"] * 0.9, p["face_a"], 0.1, 0.06, 0.12, soft=0.4, mirror=True)

    # Face with side shading, hair above the hairline, wrinkles.
    window = c.crop(-p["face_a"], p["face_a"], 0.14 - p["face_b"], 0.14 + p["face_b"])
    face = window.face()
    hairline = p["hairline"] + p["hairline_curve"] * np.square(window.u)
    front_hair = face * np.clip((hairline - window.v) / 0.04, 0.0, 1.0) * p["has_hair"]
    skin = face - front_hair
    window.paint(skin, p["skin"])
    window.shade(skin, -0.16 * np.square(window.u / p["face_a"]))
    window.paint(front_hair, window.hair())
    c.apply(~flags["Young"], _draw_wrinkles)

    # Eyes: socket shadow, eyeliner, white, iris; brows above.
    c.shade_ellipse(-p["socket"], p["eye_x"], p["eye_y"], 0.14, 0.085, soft=0.8, mirror=True)
    c.apply(flags["Bags_Under_Eyes"], _draw_eye_bags)
    c.paint_ellipse(
        p["skin"] * (1 - p["liner"]), p["eye_x"], p["eye_y"], p["eye_a"] * 1.15, p["eye_b"] * 1.4,
        soft=0.5, mirror=True,
    )
    window, eye = c.ellipse(p["eye_x"], p["eye_y"], p["eye_a"], p["eye_b"], soft=0.5, mirror=True)
    window.paint(eye, np.minimum(p["skin"] + 0.15, 0.95))
    iris = window.mask(p["eye_x"], p["eye_y"], 0.038, 0.038, soft=0.4, mirror=True)
    window.paint(eye * iris, p["iris"])
    c.paint_ellipse(
        p["brow"], p["eye_x"], p["brow_y"] - p["brow_arch"], 0.12, p["brow_b"], soft=0.5,
        mirror=True, bend=-p["brow_arch"] / 0.12**2,
    )

    # Nose: side shadows, lit tip, nostrils; cheeks.
    c.shade_ellipse(
        -0.07, p["nose_w"] * 1.1, 0.14, 0.022, p["nose_len"] * 0.6, soft=0.8, mirror=True
    )
    c.shade_ellipse(p["nose_tip"], 0.0, 0.27, p["nose_w"] * 0.8, 0.045, soft=1.0)
    c.shade_ellipse(-0.25, p["nose_w"] * 0.75, 0.32, 0.025, 0.014, soft=0.7, mirror=True)
    c.apply(flags["High_Cheekbones"], _draw_cheekbones)
    c.apply(flags["Rosy_Cheeks"], _draw_rosy_cheeks)
    c.apply(flags["Smiling"], _draw_smile_folds)

    # Facial hair under the mouth, then the mouth, then moustaches.
    c.apply(~flags["No_Beard"], _draw_beard)
    c.apply(flags["5_o_Clock_Shadow"], _draw_stubble)
    c.apply(flags["Goatee"], _draw_goatee)
    c.apply(flags["Sideburns"], _draw_sideburns)
    c.apply(flags["Double_Chin"], _draw_double_chin)
    c.paint_ellipse(
        p["skin"] * (1 - p["lip_dark"]), 0.0, p["mouth_y"], p["mouth_w"], p["lip_b"] + p["open_b"],
        soft=0.4, bend=p["curve"],
    )
    c.paint_ellipse(
        0.12 + 0.7 * p["teeth"] * (p["open_b"] > 0), 0.0, p["mouth_y"], p["mouth_w"] * 0.85,
        0.006 + p["open_b"], soft=0.6, bend=p["curve"],
    )
    c.apply(flags["Mustache"], _draw_mustache)

    # Accessories.
    c.apply(flags["Eyeglasses"], _draw_glasses)
    c.apply(flags["Wearing_Hat"], _draw_hat)
    c.apply(flags["Wearing_Earrings"], _draw_earrings)

    # Lighting, blur, sensor noise.
    c.img *= p["gain"] * (1 + p["light"] * x)
    c.apply(flags["Blurry"], _draw_blur)
    c.img += p["noise"] * rng.standard_normal(c.img.shape, dtype=np.float32)
    return np.clip(c.img * 255 + 0.5, 0, 255).astype(np.uint8)


def _synth_chunk(store: str, index: int, start: int, stop: int, seed: int, size: int) -> int:
    """Generate rows ``start:stop`` (chunk ``index``) and write them to ``store``."""
    rng = np.random.default_rng([seed, index])
    attributes = _sample_attributes(rng, stop - start)
    params = _face_params(rng, attributes)
    images = np.empty((stop - start, size, size), dtype=np.uint8)
    for first in range(0, stop - start, _RENDER_BATCH):
        rows = slice(first, first + _RENDER_BATCH)
        p = {key: value[rows, None, None] for key, value in params.items()}
        flags = {name: attributes[rows, j] > 0 for j, name in enumerate(ATTRIBUTE_NAMES)}
        images[rows] = _render_faces(rng, p, flags, size)
    with writing_every_chunk():
        group = zarr.open_group(store, mode="r+")
        group["images"][start:stop] = images
        group["attributes"][start:stop] = attributes
    return stop - start
