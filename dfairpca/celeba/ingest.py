"""Convert the official CelebA download into a CelebA store (see :mod:`.schema`)."""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

import numpy as np
import zarr
import zarr.errors
from PIL import Image

from .._remote import is_remote
from .._writes import (
    check_target, marker_attributes, move_into_place, remove_directory, staged_locally, writing_every_chunk,
)
from .pool import run_chunks
from .schema import (
    ATTRIBUTE_NAMES, ATTRIBUTES, DEFAULT_CHUNK_ROWS, DEFAULT_SIZE, IMAGES, PARTITION, STORE_KIND,
    check_positive, create_store,
)

__all__ = ["ingest_celeba"]

# Subdirectory of a partial ingest store holding one empty file per finished chunk.
_DONE_DIR = ".done"

def ingest_celeba(
    celeba_dir: str | os.PathLike,
    out: str | os.PathLike,
    *,
    size: int = DEFAULT_SIZE,
    chunk_rows: int = DEFAULT_CHUNK_ROWS,
    overwrite: bool = False,
    progress: bool = True,
    n_jobs: int | None = None,
    storage_options: dict | None = None,
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
    storage_options : dict, optional
        For a URL ``out`` (``s3://bucket/celeba.zarr``): the options of its file system.
        The store is converted in a local temporary folder (as much free space as the
        store needs), then uploaded and moved into place; an interrupted conversion to a
        URL starts over.

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
    if is_remote(out):
        with staged_locally(out, STORE_KIND, overwrite=overwrite,
                            storage_options=storage_options) as local:
            ingest_celeba(celeba_dir, local, size=size, chunk_rows=chunk_rows,
                          progress=progress, n_jobs=n_jobs)
        return out
    celeba_dir, out = Path(celeba_dir), Path(out)
    check_positive(size=size, chunk_rows=chunk_rows)
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
            group = create_store(partial, n, size, chunk_rows, settings, partition is not None)
            group[ATTRIBUTES][:] = attributes
            if partition is not None:
                group[PARTITION][:] = partition
        done_dir.mkdir()
    done = {int(p.name) for p in done_dir.iterdir()}
    paths = [str(image_dir / f) for f in files]
    tasks = [
        (str(partial), i, start, paths[start : start + chunk_rows], size)
        for i, start in enumerate(range(0, n, chunk_rows))
        if i not in done
    ]
    run_chunks(
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
                and group[IMAGES].shape[0] == n)
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
        images = zarr.open_array(Path(store) / IMAGES, mode="r+")
    images[start : start + len(paths)] = block
    (Path(store) / _DONE_DIR / str(index)).touch()
    return len(paths)
