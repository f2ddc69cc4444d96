"""Synthetic CelebA stores: attributes sampled like CelebA's, faces drawn from them."""

from __future__ import annotations

import inspect
import math
import os
from pathlib import Path

import numpy as np
import zarr

from ..io import write_staged
from .pool import resolve_jobs, write_store
from .render import draw_faces
from .sampling import sample_attributes
from .schema import (
    ATTRIBUTES, DEFAULT_SIZE, IMAGES, IMAGES_CODECS, PARTITION, STORE_KIND, check_positive,
    default_chunk_rows, face_shape, image_shape, official_like_partition, shape_attributes,
    size_attribute, store_settings,
)
from ..errors import InvalidInputError

# Deferred imports: psutil (heavy or optional) is imported in the functions that use it, so that
# importing this module stays light.

__all__ = ["synth_celeba", "ensure_store"]


def synth_celeba(
    out: str | os.PathLike,
    n: int = 202_599,
    *,
    seed: int = 0,
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
    """Write a synthetic CelebA-like store of ``n`` faces, grey or colour, of any size.

    Each image is a vectorised drawing of a face (oval, eyes, brows, nose,
    mouth, hair, ears, neck, clothes, background) under a random pose (small
    shift, scale and rotation), lighting and sensor noise.  The 40 binary
    attributes are sampled with prevalences and correlations close to
    CelebA's (e.g. Eyeglasses 6.5%, Smiling 48%, Male 42%, facial hair almost
    only on men, make-up almost only on women) and change the pixels the way
    they do in photographs: glasses draw frames and tinted lenses, beards and
    moustaches darken the lower face, smiling widens and curves the mouth,
    hats and baldness change the top of the head, sex and age change the face
    shape, brows and skin texture, and so on.  In colour, skin, hair, eyes and lips
    take their colours (red lipstick, blond or red hair, ...) at the grey face's
    luminance; faces larger than ~112 px are drawn at half size (or less) and
    upsampled, their sensor noise added per pixel and channel at full size.

    Chunk ``i`` is generated from its own generator seeded with ``(seed, i)``
    and written by one worker, so the store depends only on ``seed``, ``n``,
    ``size``, ``color`` and ``chunk_rows`` -- not on ``n_jobs`` or ``client``.
    Memory use is bounded by a few chunks per worker.  The store is written and
    resumed like an ingest (:mod:`dfairpca.celeba.pool`): ``out`` never holds a
    half-written store, an interrupted run continues where it stopped when called
    again with the same arguments, and every chunk is written, even one of zeros.

    Parameters
    ----------
    out : str or path-like
        Directory of the Zarr group to create.
    n : int, default 202_599
        Number of images (CelebA has 202,599).
    seed : int, default 0
        Non-negative seed.
    size : int or (int, int), default 80
        Images are ``size`` x ``size`` pixels, or ``(height, width)``: CelebA's aligned
        faces are ``(218, 178)``.
    color : bool, default False
        RGB faces ``(n, H, W, 3)`` instead of grey ``(n, H, W)``.
    chunk_rows : int, optional
        Images per chunk; default :func:`dfairpca.celeba.schema.default_chunk_rows`
        (2048 of 80 x 80, 576 of 218 x 178 x 3: at most 64 MB).
    overwrite : bool, default False
        Replace ``out`` if it is a store written by dfairpca (nothing else is replaced),
        and discard an interrupted run instead of resuming it.
    progress : bool, default True
        Show a tqdm progress bar.
    n_jobs : int, optional
        Processes drawing chunks; default the number of usable CPUs: the calling
        process and ``n_jobs - 1`` workers (``1``: the calling process only).  Workers
        are started with the ``spawn`` method,
        so a script using several needs the usual
        ``if __name__ == "__main__":`` guard.
    client : distributed.Client, optional
        Draw the chunks as Dask tasks on this cluster instead of ``n_jobs`` processes.
    storage_options : dict, optional
        For a URL ``out`` (``s3://bucket/faces.zarr``): the options of its file system.
        The store is written in a local stage folder (as much free space as the store
        needs), then uploaded and moved into place, and the stage deleted.  An interrupted
        write keeps the stage: the same call again resumes from it, writing only the
        chunks not yet finished, or, if only the upload was cut short, uploading the
        finished store again; ``overwrite`` discards it.  With ``client``, the workers
        must see that local folder.
    stage_dir : str or path-like, optional
        For a URL ``out``: the folder under which its stage is made (one subfolder per
        URL); default ``$DFAIRPCA_STAGE_DIR``, else ``dfairpca/stage`` in the user's cache
        folder (``$XDG_CACHE_HOME`` or ``~/.cache``).

    Returns
    -------
    pathlib.Path
        ``out`` (a URL: as given).

    Raises
    ------
    FileExistsError
        If ``out`` exists and ``overwrite`` is False, or ``out`` is not a store written by
        dfairpca (:class:`dfairpca.io.OutputPathError`); for a URL, also if its stage folder
        holds anything but dfairpca's stage of that URL.
    ValueError
        If an argument is out of range.

    Notes
    -----
    The ``partition`` array splits the rows into contiguous train, valid and
    test blocks in the official proportions (exactly the official sizes when
    ``n`` is 202,599).
    """
    check_positive(n=n)
    if not isinstance(seed, (int, np.integer)) or seed < 0:
        raise InvalidInputError(f"seed must be a non-negative integer, got {seed!r}")
    shape = face_shape(size, color)
    chunk_rows = default_chunk_rows(shape) if chunk_rows is None else chunk_rows
    check_positive(chunk_rows=chunk_rows)
    _check_drawing_memory(shape, min(chunk_rows, n), n_jobs, client)
    settings = {"source": "synthetic", "seed": int(seed), **shape_attributes(size, color)}

    def write(folder: Path, overwrite: bool) -> Path:
        return write_store(
            folder, shape=shape, chunk_rows=chunk_rows,
            chunks=[(i, start, min(start + chunk_rows, n))
                    for i, start in enumerate(range(0, n, chunk_rows))],
            settings=settings, labels={PARTITION: official_like_partition(n)},
            write_chunk=_synth_chunk, args=(int(seed), image_shape(size), bool(color)),
            n_jobs=n_jobs, client=client, progress=progress, overwrite=overwrite, protect=None,
            desc="synth CelebA", check_part=_synth_part, check_whole_chunks=True,
        )

    return write_staged(out, STORE_KIND, write, overwrite=overwrite, storage_options=storage_options,
                        stage_dir=stage_dir,  # the key: what the store is made of
                        key=lambda: {**settings, "n": int(n), "chunk_rows": int(chunk_rows)})


def ensure_store(path: str | os.PathLike, n: int, seed: int = 0, *, overwrite: bool = False,
                 **options) -> Path:
    """Write the synthetic store at ``path`` unless it is there; check that it is the one asked.

    What benchmarks, examples and ``dfairpca demo`` call: the first run writes the store
    with :func:`synth_celeba` (``options`` are its keyword arguments), later runs reuse it
    once its settings (source, ``n``, ``seed``, ``size``, ``color``, ``chunk_rows``, the
    faces' codecs) match -- a store of other settings would silently change every number measured on it.

    Returns
    -------
    pathlib.Path
        ``path``.

    Raises
    ------
    ValueError
        If ``path`` holds another store (the message lists what differs) and ``overwrite``
        is False, or something that is not a CelebA store.
    """
    path = Path(path)
    asked = inspect.signature(synth_celeba).bind(path, n, seed=seed, **options)
    asked.apply_defaults()
    a = asked.arguments
    shape = face_shape(a["size"], a["color"])
    check_positive(n=n)
    wanted = {"source": "synthetic", "n": n, "seed": seed, "size": size_attribute(a["size"]),
              "color": bool(a["color"]),
              "chunk_rows": default_chunk_rows(shape) if a["chunk_rows"] is None else a["chunk_rows"],
              # a store of older codecs (zstd) reads slower: it would change every time measured
              "codecs": list(IMAGES_CODECS)}
    if not path.exists() or (path.is_dir() and not any(path.iterdir())):
        return Path(synth_celeba(path, n, seed=seed, **options))  # a local path's: a Path
    try:
        have = store_settings(path)
    except (ValueError, FileNotFoundError) as exc:
        if overwrite:  # replaces only a store dfairpca wrote (the error says so otherwise)
            return Path(synth_celeba(path, n, seed=seed, overwrite=True, **options))
        raise InvalidInputError(f"{path} exists but is not a CelebA store ({exc}); pass another path") from None
    differ = [f"{key} {have.get(key)!r} (asked {value!r})" for key, value in wanted.items()
              if have.get(key) != value]
    if not differ:
        return path
    if overwrite:
        return Path(synth_celeba(path, n, seed=seed, overwrite=True, **options))
    raise InvalidInputError(
        f"{path} holds another store: {', '.join(differ)}; pass another path, or "
        "overwrite=True to replace it"
    )


#: peak bytes that drawing a chunk of faces holds per stored value (pixel x channel): its
#: float64 layers and masks; 28 measured for grey and colour faces (tracemalloc), rounded up
DRAW_BYTES_PER_VALUE = 32


def _check_drawing_memory(shape: tuple[int, ...], rows: int, n_jobs, client) -> None:
    """Refuse, before anything is written, faces whose chunk cannot be drawn in the memory
    available to this machine's writing processes (a Dask cluster's workers are not
    checked: their memory is theirs)."""
    if client is not None:
        return
    import psutil

    processes = resolve_jobs(n_jobs, None)
    assert processes is not None  # without a client, a number
    need = rows * math.prod(shape) * DRAW_BYTES_PER_VALUE
    free = psutil.virtual_memory().available
    if need * processes > free:
        raise InvalidInputError(
            f"drawing {rows:,} faces of {' x '.join(map(str, shape))} at a time needs about "
            f"{need / 2**30:,.1f} GiB in each of {processes} writing process(es), more than the "
            f"{free / 2**30:,.1f} GiB available: choose a smaller size, fewer chunk_rows "
            "(--chunk-rows) or fewer n_jobs (--n-jobs)"
        )


def _synth_images(index: int, rows: int, seed: int, size: tuple[int, int], color: bool):
    """Chunk ``index``'s ``rows`` attribute rows and faces, drawn from its own seed."""
    rng = np.random.default_rng([seed, index])
    attributes = sample_attributes(rng, rows)
    return attributes, draw_faces(rng, attributes, size, color=color)


def _synth_part(chunk: tuple, lo: int, hi: int, seed: int, size: tuple[int, int], color: bool) -> np.ndarray:
    """Faces ``lo:hi`` of ``chunk``, drawn again (the whole chunk: its rows share one stream)."""
    index, start, stop = chunk[:3]
    return _synth_images(index, stop - start, seed, size, color)[1][lo:hi]


def _synth_chunk(store: str, index: int, start: int, stop: int, seed: int,
                 size: tuple[int, int], color: bool) -> int:
    """Generate rows ``start:stop`` (chunk ``index``) and write them to ``store``."""
    attributes, images = _synth_images(index, stop - start, seed, size, color)
    group = zarr.open_group(store, mode="r+")
    for name, rows in ((IMAGES, images), (ATTRIBUTES, attributes)):
        array = group[name]
        assert isinstance(array, zarr.Array)  # write_store made it an array
        array[start:stop] = rows
    return stop - start
