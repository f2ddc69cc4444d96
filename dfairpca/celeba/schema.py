"""The CelebA store: its layout, and the one place that creates, opens and reads it.

A *CelebA store* is a Zarr v3 group holding

``images``
    ``uint8`` faces of shape ``(n, H, W)`` (grey) or ``(n, H, W, 3)`` (RGB colour, the
    channels last), chunked along the first axis only (``chunk_rows`` images per chunk,
    every chunk written; by default :func:`default_chunk_rows`: 2048 small faces, or fewer
    so that a chunk holds at most 64 MB, e.g. 576 faces of 218 x 178 x 3).  A face is a row
    of ``d = H * W`` or ``H * W * 3`` features in C order: what the estimators fit is
    ``images.reshape(n, d)`` (:func:`check_images` is the rule).  Written uncompressed with
    a CRC32C checksum per chunk (:data:`IMAGES_COMPRESSORS`).
``attributes``
    ``int8`` array of shape ``(n, 40)`` with 0/1 values, chunked like ``images``; its
    ``attrs["names"]`` lists the 40 CelebA attribute names (:data:`ATTRIBUTE_NAMES`) in
    the official column order.  Readers also accept CelebA's own -1/1
    (:func:`attribute_flags`).
``partition`` (optional)
    ``int8`` array of shape ``(n,)``: 0 train, 1 valid, 2 test (``attrs["values"]``).

and group attributes saying where the data came from: ``source`` (``"synthetic"`` or
``"celeba"``), ``size`` (the side of square faces, else ``[H, W]``: :func:`size_attribute`),
``color`` (``true`` for RGB faces; absent for grey ones), for synthetic data ``seed``, for an
ingested download
``chunk_rows``, ``celeba_dir`` and ``list_attr_sha256``; and dfairpca's marker (kind
:data:`STORE_KIND`), so that only dfairpca replaces it.
"""

from __future__ import annotations

import difflib
import math
import os
from pathlib import Path

import numpy as np
import zarr
import zarr.codecs
import zarr.errors

from ..base import rows_per_block
from ..io import MARKER_KEY, from_zarr, marker_attributes, read_checked, strict_group
from ..errors import InvalidInputError, PathNotFoundError

__all__ = [
    "ROW_DIMENSION",
    "LABEL_DIMENSIONS",
    "dimension_names",
    "ATTRIBUTE_NAMES",
    "ATTRIBUTES",
    "CELEBA_SPLIT",
    "CHANNELS",
    "DEFAULT_CHUNK_ROWS",
    "DEFAULT_SIZE",
    "IMAGES",
    "LABELS",
    "PARTITION",
    "STORE_KIND",
    "attribute_column",
    "attribute_flags",
    "check_images",
    "check_positive",
    "copy_labels",
    "create_store",
    "default_chunk_rows",
    "describe",
    "face_shape",
    "image_shape",
    "open_celeba",
    "open_group",
    "write_attribute_names",
    "ATTRIBUTE_COORDINATE",
    "official_like_partition",
    "read_images",
    "shape_attributes",
    "size_attribute",
    "store_settings",
    "codec_names",
    "IMAGES_CODECS",
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

#: the arrays of a store, by role
IMAGES, ATTRIBUTES, PARTITION = "images", "attributes", "partition"
#: the arrays that label the rows of ``images`` (what travels with a transformed copy)
LABELS = (ATTRIBUTES, PARTITION)
#: Official split sizes (train, valid, test) of the 202,599 aligned images.
CELEBA_SPLIT = (162_770, 19_867, 19_962)
#: Images per chunk: 2048 faces of 80 x 80 are about 13 MB, whole chunks for a worker to
#: read and small enough that a few per process stay far below its memory; larger faces get
#: fewer (:func:`default_chunk_rows`).  Part of what a synthetic store is (its chunks are
#: seeded one by one), so it is not tuned per machine.
DEFAULT_CHUNK_ROWS = 2048
#: Side of the faces a store holds unless asked otherwise: 80 x 80 grey is d = 6,400, whose
#: d x d statistics (328 MB in float64) fit any worker.
DEFAULT_SIZE = 80
#: faces per row of a picture (:mod:`dfairpca.celeba.figures`) unless asked otherwise; here,
#: not there, so that the command line's parser need not import the figures
DEFAULT_FACES = 4
#: The faces' codecs: a CRC32C checksum, no compression.  Faces with sensor noise shrink by
#: 15% under Zarr's default zstd, which triples the cost of writing them (3.3 ms more per
#: 218 x 178 x 3 face, measured on the loaded 2-core development machine) and quadruples
#: that of reading them (0.7 ms more per face), paid
#: on every pass of every fit; the checksum (~0.1 ms) keeps a damaged chunk an error
#: (:class:`dfairpca.io.CorruptChunkError`), as zstd's framing did, not silent garbage.
IMAGES_COMPRESSORS = (zarr.codecs.Crc32cCodec(),)
#: The names of the faces' codecs in a store's metadata: the array's bytes, then those.
IMAGES_CODECS = ("bytes", "crc32c")
#: Channels of a colour face (RGB), its last axis.
CHANNELS = 3
#: The kind of dfairpca's marker on a store it writes (see :data:`dfairpca.io.MARKER`).
STORE_KIND = "store"


def check_positive(**values: object) -> None:
    """Raise ValueError unless every value is a positive integer."""
    for key, value in values.items():
        if not isinstance(value, (int, np.integer)) or value < 1:
            raise InvalidInputError(f"{key} must be a positive integer, got {value!r}")


def image_shape(size) -> tuple[int, int]:
    """``(height, width)`` of faces given a side (square faces) or a ``(height, width)`` pair;
    ValueError unless both are positive integers."""
    if isinstance(size, (int, np.integer)) and not isinstance(size, bool):
        height = width = size
    elif isinstance(size, (tuple, list)) and len(size) == 2:
        height, width = size
    else:
        raise InvalidInputError(f"size must be a side or (height, width), e.g. 80 or (218, 178); got {size!r}")
    check_positive(height=height, width=width)
    return int(height), int(width)


def face_shape(size, color: bool) -> tuple[int, ...]:
    """The shape of one face in a store: ``(H, W)`` grey, ``(H, W, 3)`` colour."""
    return image_shape(size) + ((CHANNELS,) if color else ())


def size_attribute(size) -> int | list[int]:
    """The store's ``size`` attribute: the side of square faces (as stores always said),
    else ``[height, width]``."""
    height, width = image_shape(size)
    return height if height == width else [height, width]


def shape_attributes(size, color: bool) -> dict:
    """The group attributes that give a store's face shape: ``size``
    (:func:`size_attribute`) and, for RGB faces, ``color: true``."""
    return {"size": size_attribute(size), **({"color": True} if color else {})}


def default_chunk_rows(shape: tuple[int, ...]) -> int:
    """Images of ``shape`` per chunk unless asked: :data:`DEFAULT_CHUNK_ROWS`, or fewer so
    that a chunk holds at most one block of :data:`dfairpca.base.BLOCK_BYTES`."""
    return min(DEFAULT_CHUNK_ROWS, rows_per_block(math.prod(shape)))


def create_store(
    path: Path, n: int, shape: tuple[int, ...], chunk_rows: int, attrs: dict,
    with_partition: bool = True,
) -> zarr.Group:
    """Create an empty CelebA store at ``path`` of ``n`` faces of ``shape``
    (:func:`face_shape`), marked as dfairpca's, and return its group.

    Call it, and write through the group, inside :func:`dfairpca.io.writing_every_chunk`:
    Zarr takes that setting when an array is opened, and ``group[name]`` opens it anew.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    group = zarr.open_group(
        path, mode="w", zarr_format=3, attributes={**attrs, **marker_attributes(STORE_KIND)}
    )
    group.create_array(
        IMAGES, shape=(n, *shape), chunks=(chunk_rows, *shape), dtype="uint8",
        compressors=IMAGES_COMPRESSORS, dimension_names=dimension_names(1 + len(shape)),
    )
    group.create_array(
        ATTRIBUTES,
        shape=(n, len(ATTRIBUTE_NAMES)),
        chunks=(chunk_rows, len(ATTRIBUTE_NAMES)),
        dtype="int8",
        attributes={"names": list(ATTRIBUTE_NAMES)},
        dimension_names=LABEL_DIMENSIONS[ATTRIBUTES],
    )
    write_attribute_names(group, ATTRIBUTE_NAMES)
    if with_partition:
        group.create_array(
            PARTITION,
            shape=(n,),
            chunks=(chunk_rows,),
            dtype="int8",
            attributes={"values": {"0": "train", "1": "valid", "2": "test"}},
            dimension_names=LABEL_DIMENSIONS[PARTITION],
        )
    return group


#: the name of the rows' dimension in every array dfairpca writes (xarray reads a store's
#: arrays as variables sharing the dimensions of one name)
ROW_DIMENSION = "row"
#: the dimension names of the arrays that label the rows
LABEL_DIMENSIONS = {ATTRIBUTES: (ROW_DIMENSION, "attribute"), PARTITION: (ROW_DIMENSION,)}


#: the array of the attributes' names, along the attributes' dimension of the same name: xarray
#: reads it as that dimension's coordinate, so ``ds.sel(attribute="Eyeglasses")`` picks a column
#: (the names stay in ``attributes.attrs["names"]`` too, where older stores hold them alone)
ATTRIBUTE_COORDINATE = LABEL_DIMENSIONS[ATTRIBUTES][1]


def write_attribute_names(group: zarr.Group, names) -> None:
    """Write ``names`` as the attribute coordinate (:data:`ATTRIBUTE_COORDINATE`) of ``group``,
    a 1-D array of variable-length strings (Zarr 3's string type: no format warning).

    Parameters
    ----------
    group : zarr.Group
        The store being written, open for writing.
    names : sequence of str
        The attribute names, in the column order of the ``attributes`` array.
    """
    names = np.asarray([str(name) for name in names], dtype=object)
    out = group.create_array(ATTRIBUTE_COORDINATE, shape=names.shape, chunks=names.shape,
                             dtype=str, dimension_names=(ATTRIBUTE_COORDINATE,))
    out[:] = names


def dimension_names(ndim: int) -> tuple[str, ...]:
    """The dimension names of a stack of ``ndim`` dimensions: rows, then features (2-D),
    an image's height and width, and its channels (4-D)."""
    names = {1: (ROW_DIMENSION,), 2: (ROW_DIMENSION, "feature"),
             3: (ROW_DIMENSION, "height", "width"), 4: (ROW_DIMENSION, "height", "width", "channel")}
    return names[ndim]


def official_like_partition(n: int) -> np.ndarray:
    """Contiguous train/valid/test labels in the official CelebA proportions."""
    total = sum(CELEBA_SPLIT)
    train_end = round(n * CELEBA_SPLIT[0] / total)
    valid_end = round(n * (CELEBA_SPLIT[0] + CELEBA_SPLIT[1]) / total)
    partition = np.full(n, 2, dtype=np.int8)
    partition[:train_end] = 0
    partition[train_end:valid_end] = 1
    return partition


def open_group(path: str | os.PathLike | zarr.Group) -> zarr.Group:
    """Open ``path`` (or reopen a group) for reading; an absent chunk is an error, not zeros.

    dfairpca's stores hold every chunk, so one that is missing was lost: reading it as
    the fill value would give a face of zeros or an attribute of 0 without a word.
    """
    if isinstance(path, zarr.Group):
        return strict_group(path)
    path = Path(path)
    if not path.exists():
        raise PathNotFoundError(f"no such CelebA store: {path}")
    if not path.is_dir():
        raise InvalidInputError(f"{path} is not a Zarr group (it is a file, not a directory)")
    try:
        # the members as stored, not the consolidated copy (an array added since is read)
        return strict_group(zarr.open_group(path, mode="r", use_consolidated=False))
    except (zarr.errors.BaseZarrError, ValueError) as exc:
        raise InvalidInputError(f"{path} is not a Zarr group: {exc}") from exc


def describe(path: str | os.PathLike | zarr.Group) -> str:
    """Name a store in error messages."""
    return f"Zarr group {path.store_path}" if isinstance(path, zarr.Group) else str(path)


def check_images(images: zarr.Array, where: str) -> None:
    """Raise ValueError unless ``images`` is uint8 ``(n, H, W)`` or ``(n, H, W, 3)``."""
    grey_or_rgb = images.ndim == 3 or (images.ndim == 4 and images.shape[3] == CHANNELS)
    if not grey_or_rgb or images.dtype != np.uint8:
        raise InvalidInputError(
            f"{where}: images must be a uint8 array of shape (n, H, W) (grey) or "
            f"(n, H, W, 3) (RGB), got {images.dtype} {images.shape}"
        )


def open_celeba(path: str | os.PathLike | zarr.Group) -> tuple[zarr.Array, zarr.Array, list[str]]:
    """Open a CelebA store for reading.

    Parameters
    ----------
    path : str, path-like or zarr.Group
        Directory of the store, or an already opened group.

    Returns
    -------
    images : zarr.Array
        ``uint8`` array of shape ``(n, H, W)`` or ``(n, H, W, 3)``.
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
    group = open_group(path)
    missing = [key for key in (IMAGES, ATTRIBUTES) if key not in group]
    if missing:
        raise InvalidInputError(
            f"{describe(path)} is not a CelebA store: it has no {' or '.join(missing)} "
            f"array; it contains {sorted(group.keys()) or 'nothing'}"
        )
    arrays = []
    for key in (IMAGES, ATTRIBUTES):
        array = group[key]
        if not isinstance(array, zarr.Array):
            raise InvalidInputError(f"{describe(path)}: {key!r} is a group, expected an array")
        arrays.append(array)
    images, attributes = arrays
    check_images(images, describe(path))
    if attributes.ndim != 2 or attributes.shape[0] != images.shape[0]:
        raise InvalidInputError(
            f"{describe(path)}: attributes must have shape ({images.shape[0]}, k), "
            f"got {attributes.shape}"
        )
    listed = attributes.attrs.get("names", [])
    names = [str(name) for name in listed] if isinstance(listed, list) else []
    if len(names) != attributes.shape[1]:
        raise InvalidInputError(
            f"{describe(path)}: attributes.attrs['names'] must list {attributes.shape[1]} "
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
        ``int8`` array of shape ``(n,)`` with the stored values.

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
        raise InvalidInputError(
            f"unknown attribute {name!r}{hint} Valid names: {', '.join(names)}"
        )
    column = read_checked(attributes, (slice(None), names.index(name)))
    return np.asarray(column, dtype=np.int8)


def attribute_flags(path_or_group, names) -> dict[str, np.ndarray]:
    """The named attributes as 0/1 ``int8`` columns, CelebA's own -1/1 read as 0/1.

    Any other value would silently become a third group (or a wrong "with"/"without"
    count), so it is refused with the values found.
    """
    columns = {}
    for name in names:
        column = attribute_column(path_or_group, name)
        values = np.unique(column).tolist()
        if set(values) <= {-1, 1}:
            column = (column == 1).astype(np.int8)
        elif not set(values) <= {0, 1}:
            shown = ", ".join(str(int(v)) for v in values[:10]) + (", ..." if len(values) > 10 else "")
            raise InvalidInputError(
                f"attribute {name!r} of {describe(path_or_group)} holds the values {shown}; a "
                "CelebA attribute must be 0/1 (or CelebA's -1/1): fix the store, e.g. re-ingest "
                "it with dfairpca ingest-celeba"
            )
        columns[name] = column
    return columns


def read_images(store, *, rows_per_chunk: int | None = None, missing_chunks: str = "error"):
    """The store's faces as a lazy Dask array ``(n, H, W[, 3])``, checked first.

    ``rows_per_chunk`` and ``missing_chunks`` are those of :func:`dfairpca.from_zarr`; the
    estimators take it as it is (they see ``n`` rows of ``H * W [* 3]`` features, C order).
    """
    open_celeba(store)
    return from_zarr(store, IMAGES, rows_per_chunk=rows_per_chunk, missing_chunks=missing_chunks)


def copy_labels(source: zarr.Group, target: zarr.Group) -> list[str]:
    """Copy the arrays that label the rows (:data:`LABELS`) from ``source`` to ``target``.

    The attributes are read whole or not at all; the partition as Zarr reads it: stores of
    dfairpca that predate writing every chunk lack its all-train (all-zero) chunks.  Call
    it inside :func:`dfairpca.io.writing_every_chunk`.  Returns the names copied.
    """
    strict = strict_group(source)
    copied = []
    for name in LABELS:
        if name not in source:
            continue
        array = source[name]
        if not isinstance(array, zarr.Array):  # a group of that name holds no labels
            continue
        out = target.create_array(name, shape=array.shape, chunks=array.chunks, dtype=array.dtype,
                                  dimension_names=LABEL_DIMENSIONS[name])
        stored = strict[name] if name == ATTRIBUTES else array
        assert isinstance(stored, zarr.Array)  # the strict group holds the same nodes
        out[:] = read_checked(stored, slice(None))
        out.attrs.update(dict(array.attrs))
        copied.append(name)
        names = array.attrs.get("names") if name == ATTRIBUTES else None
        if isinstance(names, list) and len(names) == array.shape[1]:  # older stores too
            write_attribute_names(target, names)
    return copied


def store_settings(path: str | os.PathLike) -> dict:
    """What the store at ``path`` is: its group attributes (without dfairpca's marker),
    ``color`` (False for grey), ``n`` and ``chunk_rows``; ValueError if it is not a
    readable CelebA store."""
    images, _, _ = open_celeba(path)
    attrs = {k: v for k, v in open_group(path).attrs.items() if k != MARKER_KEY}
    return {**attrs, "color": bool(attrs.get("color", False)), "n": images.shape[0],
            "chunk_rows": images.chunks[0], "codecs": codec_names(images)}


def codec_names(images) -> list[str]:
    """The names of a Zarr array's codecs, in order (``["bytes", "crc32c"]`` for the faces
    of a store written today, :data:`IMAGES_COMPRESSORS`)."""
    return [c["name"] for c in images.metadata.to_dict().get("codecs", [])]
