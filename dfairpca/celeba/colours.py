"""Colours of synthetic faces: the grey drawing parameters turned into RGB of the same
luminance (pure numpy; the renderer's colour step)."""

from __future__ import annotations

import numpy as np

__all__ = ["add_colours"]

#: Luma weights of ITU-R 601 (Pillow's convert("L")): a tint of luma 1 keeps a grey level's
#: brightness, so a colour face has (up to clipping) the grey face's luminance.
_LUMA = np.array([0.299, 0.587, 0.114], dtype=np.float32)


def _tint(rgb: np.ndarray) -> np.ndarray:
    """RGB directions ``(n, 3)`` scaled to luma 1, as ``(3, n)`` (see :data:`_LUMA`)."""
    rgb = np.clip(np.asarray(rgb, dtype=np.float32), 0.05, None)
    return (rgb / (rgb @ _LUMA)[:, None]).T


def add_colours(rng: np.random.Generator, a: dict, p: dict) -> None:
    """Turn the grey levels of ``p`` into colours (``(3, n)``) of the same luminance.

    Skin runs from pink-beige to brown with its grey level; hair is black, brown, blond,
    grey or red by the attributes; irises are brown, blue or green; lipstick is red;
    backgrounds, clothes and hats take random hues.
    """
    n = len(a["Male"])

    def jitter(scale):
        return rng.normal(0.0, scale, (n, 3))

    dark = np.clip((0.92 - p["skin"]) / 0.6, 0.0, 1.0)[:, None]
    skin = np.array([1.0, 0.84, 0.76]) - dark * np.array([0.0, 0.10, 0.14]) + jitter(0.02)
    other = 1 - a["Black_Hair"] - a["Brown_Hair"] - a["Blond_Hair"] - a["Gray_Hair"]
    hair = (np.outer(a["Black_Hair"], [1.0, 0.9, 0.82]) + np.outer(a["Brown_Hair"], [1.0, 0.72, 0.5])
            + np.outer(a["Blond_Hair"], [1.0, 0.86, 0.55]) + np.outer(a["Gray_Hair"], [1.0, 1.0, 1.0])
            + np.outer(other, [1.0, 0.6, 0.4]) + jitter(0.03))
    iris = np.array([[1.0, 0.68, 0.42], [0.55, 0.75, 1.0], [0.7, 0.9, 0.55]])
    lips = np.where(a["Wearing_Lipstick"][:, None] > 0, [1.0, 0.35, 0.45], [1.0, 0.65, 0.62])
    p["skin"] = p["skin"] * _tint(skin)
    p["hair"] = p["hair"] * _tint(hair)
    p["iris"] = p["iris"] * _tint(iris[rng.choice(3, n, p=[0.7, 0.2, 0.1])])
    p["lip_tint"] = _tint(lips) / _tint(skin)
    p["rosy"] = np.array([0.03, -0.07, -0.06])[:, None] * np.ones(n)
    p["bg"] = p["bg"] * _tint(1 + jitter(0.25))
    p["clothes"] = p["clothes"] * _tint(rng.uniform(0.15, 1.0, (n, 3)))
    p["hat"] = p["hat"] * _tint(rng.uniform(0.15, 1.0, (n, 3)))
