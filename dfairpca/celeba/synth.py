"""Synthetic CelebA stores: attributes sampled like CelebA's, faces drawn from them."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import zarr

from .._writes import atomic_directory, writing_every_chunk
from .pool import run_chunks
from .render import draw_faces
from .schema import (
    ATTRIBUTE_NAMES, ATTRIBUTES, DEFAULT_CHUNK_ROWS, DEFAULT_SIZE, IMAGES, PARTITION, STORE_KIND,
    check_positive, create_store, official_like_partition, store_settings,
)

__all__ = ["synth_celeba", "ensure_store"]


def synth_celeba(
    out: str | os.PathLike,
    n: int = 202_599,
    *,
    seed: int = 0,
    size: int = DEFAULT_SIZE,
    chunk_rows: int = DEFAULT_CHUNK_ROWS,
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
    check_positive(n=n, size=size, chunk_rows=chunk_rows)
    if not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
    with atomic_directory(out, STORE_KIND, overwrite=overwrite) as tmp, writing_every_chunk():
        group = create_store(
            tmp, n, size, chunk_rows, {"source": "synthetic", "seed": int(seed), "size": size}
        )
        group[PARTITION][:] = official_like_partition(n)
        tasks = [
            (str(tmp), i, start, min(start + chunk_rows, n), int(seed), size)
            for i, start in enumerate(range(0, n, chunk_rows))
        ]
        run_chunks(
            _synth_chunk, tasks, n_jobs=n_jobs, progress=progress, total=n, desc="synth CelebA"
        )
    return out


def ensure_store(
    path: str | os.PathLike,
    n: int,
    seed: int = 0,
    *,
    size: int = DEFAULT_SIZE,
    chunk_rows: int = DEFAULT_CHUNK_ROWS,
    overwrite: bool = False,
    progress: bool = True,
    n_jobs: int | None = None,
) -> Path:
    """Write the synthetic store at ``path`` unless it is there; check that it is the one asked.

    What benchmarks, examples and ``dfairpca demo`` call: the first run writes the store
    with :func:`synth_celeba` (arguments as there), later runs reuse it once its settings
    (source, ``n``, ``seed``, ``size``, ``chunk_rows``) match -- a store of other settings
    would silently change every number measured on it.

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
    check_positive(n=n, size=size, chunk_rows=chunk_rows)
    make = dict(n=n, seed=seed, size=size, chunk_rows=chunk_rows, progress=progress, n_jobs=n_jobs)
    if not path.exists() or (path.is_dir() and not any(path.iterdir())):
        return synth_celeba(path, **make)
    try:
        have = store_settings(path)
    except (ValueError, FileNotFoundError) as exc:
        if overwrite:  # replaces only a store dfairpca wrote (the error says so otherwise)
            return synth_celeba(path, overwrite=True, **make)
        raise ValueError(f"{path} exists but is not a CelebA store ({exc}); pass another path") from None
    wanted = {"source": "synthetic", "n": n, "seed": seed, "size": size, "chunk_rows": chunk_rows}
    differ = [f"{key} {have.get(key)!r} (asked {value!r})" for key, value in wanted.items()
              if have.get(key) != value]
    if not differ:
        return path
    if overwrite:
        return synth_celeba(path, overwrite=True, **make)
    raise ValueError(
        f"{path} holds another store: {', '.join(differ)}; pass another path, or "
        "overwrite=True to replace it"
    )


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


def _synth_chunk(store: str, index: int, start: int, stop: int, seed: int, size: int) -> int:
    """Generate rows ``start:stop`` (chunk ``index``) and write them to ``store``."""
    rng = np.random.default_rng([seed, index])
    attributes = _sample_attributes(rng, stop - start)
    images = draw_faces(rng, attributes, size)
    with writing_every_chunk():
        group = zarr.open_group(store, mode="r+")
        group[IMAGES][start:stop] = images
        group[ATTRIBUTES][start:stop] = attributes
    return stop - start
