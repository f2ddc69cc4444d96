"""Convert the official CelebA download into a CelebA store (see :mod:`.schema`)."""

from __future__ import annotations

import functools
import hashlib
import math
import os
from pathlib import Path

import numpy as np
from PIL import Image

from ..io import check_target, write_staged
from .pool import worker_processes, write_rows, write_store
from .schema import (
    ATTRIBUTE_NAMES, ATTRIBUTES, DEFAULT_SIZE, PARTITION, STORE_KIND, check_positive,
    default_chunk_rows, face_shape, image_shape, shape_attributes,
)
from ..errors import InvalidInputError, PathNotFoundError

# Deferred imports: package modules that load such libraries, or this module, at import are imported
# in the functions that use them, so that importing this module stays light.

__all__ = ["decode_face", "ingest_celeba"]


def ingest_celeba(
    celeba_dir: str | os.PathLike,
    out: str | os.PathLike,
    *,
    size=DEFAULT_SIZE,
    color: bool = False,
    chunk_rows: int | None = None,
    overwrite: bool = False,
    progress: bool = True,
    n_jobs: int | None = None,
    client=None,
    storage_options: dict | None = None,
    stage_dir: str | os.PathLike | None = None,
) -> Path | str:
    """Convert the official CelebA download into a CelebA store.

    ``celeba_dir`` holds the download as published (``Anno/list_attr_celeba.txt``,
    ``Img/img_align_celeba/``, ``Eval/list_eval_partition.txt``) or the same files side by
    side (:data:`LAYOUTS`): ``img_align_celeba/`` with the aligned JPEGs (``000001.jpg``
    ...), ``list_attr_celeba.txt`` (a count line, a line with the 40 attribute names, then
    one line per image: the file name and 40 values -1/1 separated by any whitespace) and
    optionally ``list_eval_partition.txt`` (lines ``000001.jpg 0``).

    Each image is center-cropped to the aspect of ``size`` (the central 178 x 178 of the
    178 x 218 aligned images for square faces; nothing for ``"full"``), decoded in grey
    (the JPEG's own luma) or RGB and resized with a Lanczos filter (:func:`decode_face`).
    Attributes become 0/1 ``int8``.  Each worker decodes whole chunks of ``chunk_rows``
    images and writes them to the store itself: only counts come back to this process.

    The conversion is resumable (:mod:`dfairpca.celeba.pool`): it writes into the sibling
    directory ``.<out name>.partial`` and marks each chunk done once fully written.  If
    it is interrupted, calling it again with the same arguments (and
    ``overwrite=False``) converts only the missing chunks.  At the end the
    partial directory is moved to ``out``.

    Parameters
    ----------
    celeba_dir : str or path-like
        Directory of the CelebA download.
    out : str or path-like
        Directory of the Zarr group to create.
    size : int, (int, int) or "full", default 80
        Output images are ``size`` x ``size`` pixels, ``(height, width)``, or (``"full"``)
        the size of the first image: 218 x 178 for CelebA's aligned faces.
    color : bool, default False
        RGB faces ``(n, H, W, 3)`` instead of grey ``(n, H, W)``.
    chunk_rows : int, optional
        Images per chunk; default :func:`dfairpca.celeba.schema.default_chunk_rows`.
    overwrite, progress, n_jobs, client
        As for :func:`dfairpca.celeba.synth_celeba`; with ``client`` the cluster's workers
        read ``celeba_dir`` and write ``out`` at the same paths as this process.
    storage_options, stage_dir
        For a URL ``out`` (``s3://bucket/celeba.zarr``): the options of its file system,
        and the folder under which it is staged, as for
        :func:`dfairpca.celeba.synth_celeba`: the store is converted in a local stage folder
        (as much free space as the store needs), then uploaded and moved into place; an
        interrupted conversion to a URL resumes from that folder when called again (and
        with ``client``, the workers must see that local folder).

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
    return write_staged(
        out, STORE_KIND,
        functools.partial(_ingest_in_place, celeba_dir, size=size, color=color, chunk_rows=chunk_rows,
                          progress=progress, n_jobs=n_jobs, client=client),
        overwrite=overwrite, storage_options=storage_options, stage_dir=stage_dir,
        key=functools.partial(_stage_key, Path(celeba_dir), size, color, chunk_rows))


def _ingest_in_place(celeba_dir, out, overwrite: bool, *, size, color: bool, chunk_rows, progress: bool,
                     n_jobs, client) -> Path:
    """:func:`ingest_celeba` of the local path ``out``, written there."""
    celeba_dir, out = Path(celeba_dir), Path(out)
    protect = {"the CelebA folder": celeba_dir}
    check_target(out, STORE_KIND, overwrite=overwrite, protect=protect)  # before any file is read
    if size != "full":
        image_shape(size)  # a bad size is refused before any file is read
    attr_file, image_dir, partition_file = celeba_files(celeba_dir)
    if chunk_rows is not None:
        check_positive(chunk_rows=chunk_rows)
    # the worker processes start (half a second each) while this one reads the lists
    with worker_processes(n_jobs, client) as workers:
        files, attributes = _read_attribute_file(attr_file)
        partition = _read_partition_file(partition_file, files) if partition_file.exists() else None
        _check_images_exist(image_dir, files, attr_file)
        if client is not None:  # the workers decode the JPEGs: do they see them?
            from ..cluster import SHARE_FIX_LOCAL, check_workers_see

            check_workers_see(client, image_dir / files[0], "the CelebA folder", shown=celeba_dir,
                              fix=SHARE_FIX_LOCAL)
        if size == "full":
            size = _image_size(image_dir / files[0])
        shape = face_shape(size, color)
        n = len(files)
        chunk_rows = default_chunk_rows(shape) if chunk_rows is None else chunk_rows
        labels = {ATTRIBUTES: attributes, **({} if partition is None else {PARTITION: partition})}
        return write_store(
            out, shape=shape, chunk_rows=chunk_rows,
            chunks=[(i, start, min(start + chunk_rows, n), files[start:start + chunk_rows])
                    for i, start in enumerate(range(0, n, chunk_rows))],
            settings={
                "source": "celeba",
                **shape_attributes(size, color),
                "chunk_rows": chunk_rows,
                "celeba_dir": str(celeba_dir.resolve()),
                "list_attr_sha256": _sha256(attr_file),
            },
            labels=labels, write_chunk=_ingest_chunk, args=(str(image_dir.absolute()), image_shape(size), bool(color)),
            n_jobs=n_jobs, client=client, progress=progress, overwrite=overwrite,
            protect=protect, desc="ingest CelebA", workers=workers, read_part=_ingest_part,
        )


#: where the files of a CelebA download are, relative to its folder: the official download's
#: folders (``Anno/``, ``Img/``, ``Eval/``), or all in the folder itself (a flat copy)
LAYOUTS = {
    "official": ("Anno/list_attr_celeba.txt", "Img/img_align_celeba", "Eval/list_eval_partition.txt"),
    "flat": ("list_attr_celeba.txt", "img_align_celeba", "list_eval_partition.txt"),
}


def celeba_files(celeba_dir: Path) -> tuple[Path, Path, Path]:
    """The attribute list, the folder of aligned JPEGs and the partition list (which may be
    absent) of the CelebA download in ``celeba_dir``, in either of :data:`LAYOUTS`.

    Parameters
    ----------
    celeba_dir : Path
        The download's folder.

    Returns
    -------
    attr_file, image_dir, partition_file : Path

    Raises
    ------
    dfairpca.errors.PathNotFoundError
        Neither layout's attribute list is there, or its image folder is not (an image
        archive not yet extracted is named).
    """
    for attr, images, partition in LAYOUTS.values():
        if (celeba_dir / attr).is_file():
            attr_file, image_dir = celeba_dir / attr, celeba_dir / images
            if not image_dir.is_dir():
                archive = image_dir.with_suffix(".zip")
                fix = (f"; extract {archive} there" if archive.is_file() else
                       f"; the aligned JPEGs (img_align_celeba/) go beside {attr_file.parent / ''}")
                raise PathNotFoundError(f"CelebA image directory not found: {image_dir}{fix}")
            return attr_file, image_dir, celeba_dir / partition
    tried = " or ".join(str(celeba_dir / attr) for attr, _, _ in LAYOUTS.values())
    raise PathNotFoundError(f"CelebA attribute file not found: no {tried}")


def _stage_key(celeba_dir: Path, size, color: bool, chunk_rows) -> dict:
    """What a conversion to a URL is made of, known before any image is read: its stage
    (:func:`dfairpca.io.staged_locally`) is resumed only by a call of the same key."""
    if chunk_rows is not None:
        check_positive(chunk_rows=chunk_rows)  # a bad argument is refused before a stage is made
    attr_file = next((celeba_dir / attr for attr, _, _ in LAYOUTS.values()
                      if (celeba_dir / attr).is_file()), celeba_dir / LAYOUTS["flat"][0])
    return {"source": "celeba", "celeba_dir": str(celeba_dir.resolve()),
            "size": size if size == "full" else list(image_shape(size)), "color": bool(color),
            "chunk_rows": None if chunk_rows is None else int(chunk_rows),
            "list_attr_sha256": _sha256(attr_file) if attr_file.is_file() else None}


def _sha256(path: Path) -> str:
    """The SHA-256 (hex) of the file ``path``: the store's record of its attribute file."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _read_attribute_file(path: Path) -> tuple[list[str], np.ndarray]:
    """Parse ``list_attr_celeba.txt`` into file names and 0/1 ``int8`` attributes."""
    lines = path.read_text().splitlines()
    if len(lines) < 2:
        raise InvalidInputError(f"{path}: expected a count line and a line of attribute names")
    try:
        count = int(lines[0])
    except ValueError:
        raise InvalidInputError(
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
        raise InvalidInputError(
            f"{path}, line 2: expected the 40 CelebA attribute names in the official "
            f"order ({detail}); got {' '.join(names)!r}"
        )
    body = [line for line in lines[2:] if line and not line.isspace()]
    if count < 1 and not body:
        raise InvalidInputError(f"{path}: lists no images (line 1 says {count}): a store needs at least one")
    if len(body) != count:
        raise InvalidInputError(f"{path}: line 1 says {count} images but {len(body)} rows follow")
    parsed = _parse_rows(body)
    if parsed is not None:
        return parsed
    # something is wrong (or unusual): find the first line at fault, and say what
    rows = [(number, line.split()) for number, line in enumerate(lines[2:], 3) if line.strip()]
    allowed = {"-1", "1"}
    for number, fields in rows:
        if len(fields) != len(ATTRIBUTE_NAMES) + 1:
            raise InvalidInputError(
                f"{path}, line {number}: expected a file name and {len(ATTRIBUTE_NAMES)} "
                f"values, got {len(fields)} fields"
            )
        if not allowed.issuperset(fields[1:]):
            bad = next(value for value in fields[1:] if value not in allowed)
            raise InvalidInputError(
                f"{path}, line {number}: attribute values must be -1 or 1, got {bad!r}"
            )
    text = " ".join(" ".join(fields[1:]) for _, fields in rows)
    values = np.fromstring(text, dtype=np.int8, sep=" ").reshape(count, len(ATTRIBUTE_NAMES))
    return [fields[0] for _, fields in rows], (values > 0).astype(np.int8)


#: the characters of the values of a well-formed attribute file: "-1" and "1" between blanks
_VALUE_CHARACTERS = str.maketrans("", "", "-1 \t")
_MINUS, _ONE = ord("-"), ord("1")


def _parse_rows(body: list[str]) -> tuple[list[str], np.ndarray] | None:
    """The file names and 0/1 attributes of the attribute file's rows ``body``, each a name
    and 40 values ``-1``/``1``; None if any row is not exactly that (the caller then finds
    the row and says what is wrong).

    A few whole-text operations instead of splitting 202,599 rows into 41 fields each:
    this is serial work at the start of an ingest (1.5 s of the full CelebA list that way).
    """
    try:
        names, values = zip(*(line.split(None, 1) for line in body))
    except ValueError:  # a row that is a name alone
        return None
    text = " " + " ".join(values) + " "
    # no character but "-", "1" and blanks, and 40 ones on each row ...
    if text.translate(_VALUE_CHARACTERS) or any(v.count("1") != len(ATTRIBUTE_NAMES) for v in values):
        return None
    chars = np.frombuffer(text.encode("ascii"), dtype=np.uint8)
    blank = (chars == ord(" ")) | (chars == ord("\t"))
    ones, minuses = np.flatnonzero(chars == _ONE), np.flatnonzero(chars == _MINUS)
    # ... each "1" ends a token ("1" or "-1") and each "-" starts one ("-1")
    if not (blank[ones + 1].all() and (blank | (chars == _MINUS))[ones - 1].all()
            and blank[minuses - 1].all() and (chars[minuses + 1] == _ONE).all()):
        return None
    flags = chars[ones - 1] != _MINUS
    return list(names), flags.reshape(len(body), len(ATTRIBUTE_NAMES)).astype(np.int8)


def _read_partition_file(path: Path, files: list[str]) -> np.ndarray:
    """Parse ``list_eval_partition.txt`` into labels aligned with ``files``."""
    labels = {}
    for number, line in enumerate(path.read_text().splitlines(), 1):
        fields = line.split()
        if not fields:
            continue
        if len(fields) != 2 or fields[1] not in ("0", "1", "2"):
            raise InvalidInputError(
                f"{path}, line {number}: expected '<file name> <0, 1 or 2>', got {line!r}"
            )
        labels[fields[0]] = int(fields[1])
    missing = [name for name in files if name not in labels]
    if missing:
        raise InvalidInputError(
            f"{path}: no partition for {len(missing)} image(s) of list_attr_celeba.txt, "
            f"e.g. {missing[0]}"
        )
    return np.array([labels[name] for name in files], dtype=np.int8)


def _check_images_exist(image_dir: Path, files: list[str], attr_file: Path) -> None:
    """Raise FileNotFoundError naming the first listed image not in ``image_dir``."""
    present = set(os.listdir(image_dir))
    missing = [name for name in files if name not in present]
    if missing:
        raise PathNotFoundError(
            f"image file not found: {image_dir / missing[0]} ({len(missing)} of the images "
            f"listed in {attr_file} are missing)"
        )


def _image_size(path: Path) -> tuple[int, int]:
    """``(height, width)`` of the image at ``path``."""
    try:
        with Image.open(path) as image:
            return image.size[1], image.size[0]
    except (OSError, SyntaxError, ValueError) as exc:
        raise InvalidInputError(f"corrupt or unreadable image {path}: {exc}") from exc


def _crop_box(width: int, height: int, out_height: int, out_width: int) -> tuple[int, int, int, int]:
    """The centred box of ``width`` x ``height`` with the aspect of the output (left, top,
    right, bottom), as large as fits."""
    if width * out_height > height * out_width:  # too wide: keep the full height
        side = round(height * out_width / out_height)
        left = (width - side) // 2
        return left, 0, left + side, height
    side = round(width * out_height / out_width)
    top = (height - side) // 2
    return 0, top, width, top + side


def decode_face(path: str, size: tuple[int, int], color: bool) -> np.ndarray:
    """One image as uint8 ``(H, W)`` (grey) or ``(H, W, 3)``: centre-cropped to the aspect
    of ``size = (H, W)`` and resized to it with a Lanczos filter.

    The JPEG is decoded at the smallest scale (1/2, 1/4, 1/8: Pillow's ``draft``) that
    keeps the crop at least ``H x W``, and grey straight from its luma channel: decoding a
    quarter of the pixels and no colour conversion is most of the cost saved.
    """
    out_height, out_width = size
    mode = "RGB" if color else "L"
    try:
        with Image.open(path) as image:
            width, height = image.size
            box = _crop_box(width, height, out_height, out_width)
            crop_w, crop_h = box[2] - box[0], box[3] - box[1]
            image.draft(mode, (math.ceil(width * out_width / crop_w), math.ceil(height * out_height / crop_h)))
            if image.size != (width, height):  # decoded at 1/f of the size: so is the box
                left, top, right, bottom = (round(c * image.size[0] / width) for c in box)
                box = (left, top, right, bottom)
            # no copy where there is nothing to do (CelebA at full size in colour)
            face = image if box == (0, 0, *image.size) else image.crop(box)
            face = face if face.mode == mode else face.convert(mode)
            if face.size != (out_width, out_height):
                face = face.resize((out_width, out_height), Image.Resampling.LANCZOS)
            return np.asarray(face, dtype=np.uint8)
    except FileNotFoundError:
        raise PathNotFoundError(f"image file not found: {path}") from None
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as exc:
        raise InvalidInputError(f"corrupt or unreadable image {path}: {exc}") from exc


def _decode_files(files: list[str], image_dir: str, size: tuple[int, int], color: bool) -> np.ndarray:
    """The faces of ``files`` in ``image_dir`` (:func:`decode_face`), one array."""
    block = np.empty((len(files), *face_shape(size, color)), dtype=np.uint8)
    for k, name in enumerate(files):
        block[k] = decode_face(os.path.join(image_dir, name), size, color)
    return block


def _ingest_chunk(store: str, index: int, start: int, stop: int, files: list[str], image_dir: str,
                  size: tuple[int, int], color: bool) -> int:
    """Decode images ``start:stop`` (chunk ``index``) and write them to ``store``."""
    write_rows(store, start, stop, _decode_files(files, image_dir, size, color))
    return stop - start


def _ingest_part(chunk: tuple, lo: int, hi: int, image_dir: str, size: tuple[int, int], color: bool) -> np.ndarray:
    """Rows ``lo:hi`` of ``chunk`` decoded, not written (the pool's ``read_part``)."""
    return _decode_files(chunk[3][lo:hi], image_dir, size, color)
