"""A fabricated CelebA download: synthetic faces as JPEGs in the official layout.

What the ingest's tests and benchmark read instead of the real 1.4 GB download: the same
folder layout and list files, and JPEGs like CelebA's aligned ones (178 wide x 218 high,
colour, quality 90, about 12 KB each), so decoding them costs what decoding CelebA costs.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
from PIL import Image

from .pool import run_tasks, split
from .render import draw_faces
from .sampling import sample_attributes
from .schema import ATTRIBUTE_NAMES, check_positive, image_shape, official_like_partition
from ..errors import PathExistsError

__all__ = ["CELEBA_IMAGE_SIZE", "write_celeba_jpegs"]

#: (height, width) of CelebA's aligned images
CELEBA_IMAGE_SIZE = (218, 178)
#: images drawn from one generator (seeded with ``(seed, index)``): the files depend on
#: ``seed`` and ``n`` only, not on ``n_jobs``
_BLOCK = 500
#: the renderer's sensor noise, scaled down, and a grain of this many grey levels shared
#: by the three channels: JPEG keeps luminance detail and averages colour noise away (4:2:0),
#: so this texture gives the ~12 KB of CelebA's photographs, and their cost to decode
_JPEG_NOISE = 0.3
_LUMA_GRAIN = 5.5


def write_celeba_jpegs(
    folder: str | os.PathLike,
    n: int,
    *,
    seed: int = 0,
    size=CELEBA_IMAGE_SIZE,
    quality: int = 90,
    n_jobs: int | None = 1,
) -> Path:
    """Write ``n`` synthetic colour faces in CelebA's layout under ``folder``.

    ``img_align_celeba/000001.jpg ...`` (JPEG, ``quality``), ``list_attr_celeba.txt`` (a
    count line, the 40 names, one line per image of -1/1 values, padded as CelebA pads
    them) and ``list_eval_partition.txt`` (the official proportions, in order).
    ``folder`` must be missing or empty: this writes beside nothing.  ``n_jobs``
    processes draw and encode (as :func:`dfairpca.celeba.synth_celeba`'s).

    Returns
    -------
    pathlib.Path
        ``folder``.
    """
    folder = Path(folder)
    check_positive(n=n, quality=quality)
    height, width = image_shape(size)
    if folder.exists() and (not folder.is_dir() or any(folder.iterdir())):
        raise PathExistsError(f"{folder} exists and is not an empty folder; pass a new path")
    images = folder / "img_align_celeba"
    images.mkdir(parents=True)
    blocks = [(str(images), i, start, min(start + _BLOCK, n), seed, (height, width), quality)
              for i, start in enumerate(range(0, n, _BLOCK))]
    tasks = [(part,) for part in split(blocks, 4 * (n_jobs or 1))]
    attributes = np.concatenate(run_tasks(_write_blocks, tasks, n_jobs=n_jobs, client=None))
    names = [_file_name(i) for i in range(n)]
    lines = [str(n), " ".join(ATTRIBUTE_NAMES) + " "]
    lines += [name + "".join(f" {v:2d}" for v in row) for name, row in zip(names, 2 * attributes - 1)]
    (folder / "list_attr_celeba.txt").write_text("\n".join(lines) + "\n")
    partition = official_like_partition(n)
    (folder / "list_eval_partition.txt").write_text(
        "".join(f"{name} {p}\n" for name, p in zip(names, partition)))
    return folder


def _file_name(row: int) -> str:
    """CelebA's name of image ``row`` (from 0): ``000001.jpg`` ..."""
    return f"{row + 1:06d}.jpg"


def _write_blocks(blocks: list[tuple]) -> np.ndarray:
    """Draw and write the JPEGs of ``blocks``; their attributes, ``(rows, 40)`` 0/1."""
    return np.concatenate([_write_block(*block) for block in blocks])


def _write_block(folder: str, index: int, start: int, stop: int, seed: int,
                 size: tuple[int, int], quality: int) -> np.ndarray:
    """Draw images ``start:stop`` and write them as JPEGs; their attributes."""
    rng = np.random.default_rng([seed, index])
    attributes = sample_attributes(rng, stop - start)
    faces = draw_faces(rng, attributes, size, color=True, noise=_JPEG_NOISE).astype(np.float32)
    faces += rng.normal(0.0, _LUMA_GRAIN, faces.shape[:3] + (1,)).astype(np.float32)
    faces = np.clip(faces + 0.5, 0, 255).astype(np.uint8)
    for row, face in enumerate(faces, start):
        Image.fromarray(face).save(Path(folder, _file_name(row)), format="JPEG", quality=quality)
    return attributes
