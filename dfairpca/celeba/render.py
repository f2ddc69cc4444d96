"""The face renderer of synthetic CelebA stores: attributes in, grey or colour faces out.

Faces are drawn in "face coordinates" (u, v): the image's shorter side spans [-1, 1] at the
neutral pose (a 218 x 178 image spans [-1.22, 1.22] vertically), u to the right, v
downwards.  A face is centred at (0, 0.14) with half-width ~0.46 and half-height ~0.68; the
eyes are at v = 0.02, u = +-0.22, the nose tip at v = 0.29 and the mouth at v = 0.49, like
the aligned CelebA crops.  Every feature is a soft ellipse (or a band) in these coordinates;
mirror-symmetric pairs use |u|.  Canvases are float32 ``(C, B, h, w)``: C = 1 (grey) or 3
(RGB) channels first, so that a ``(B, h, w)`` mask paints every channel by broadcasting and
a colour costs the blends, not the geometry, three times.  Pure numpy: no file, store or
process is touched here.
"""

from __future__ import annotations

import math
from functools import cached_property
from statistics import NormalDist
from typing import Callable

import numpy as np

from .colours import add_colours
from .schema import ATTRIBUTE_NAMES, image_shape

__all__ = ["draw_faces"]

# Images rendered at once: at most this many, and a canvas of at most _RENDER_BYTES (keeps
# the float32 temporaries of a batch in cache).
_RENDER_BATCH = 128
_RENDER_BYTES = 4 << 20
#: Longest side a face is drawn at; larger images are drawn at 1/f of their size and
#: upsampled (bilinear), then get their sensor noise per pixel.  Every feature is a smooth
#: ellipse whose edge ramps span a few pixels at ~100 px, so drawing 218 x 178 at
#: 109 x 89 loses no detail the drawing has, and costs a quarter of the geometry.
_RENDER_MAX = 112
#: The standard normal distribution at 256 levels (the midpoints of 256 equal-probability
#: bins): the sensor noise of upsampled faces, drawn as random bytes, five times cheaper than
#: ``standard_normal`` at 116,412 values a face and, scaled to a few grey levels, as good.
#: Faces drawn at their own size keep ``standard_normal`` (their stores stay as they were).
_NORMAL_LEVELS = np.array([NormalDist().inv_cdf((i + 0.5) / 256) for i in range(256)])
_NORMAL_LEVELS = (_NORMAL_LEVELS / _NORMAL_LEVELS.std()).astype(np.float32)  # variance 1


def draw_faces(
    rng: np.random.Generator, attributes: np.ndarray, size, *, color: bool = False,
    noise: float = 1.0,
) -> np.ndarray:
    """Faces for the rows of ``attributes`` (``(n, 40)`` 0/1) as uint8 images.

    ``size`` is a side (square faces) or ``(height, width)``; the result is ``(n, H, W)``,
    or ``(n, H, W, 3)`` RGB with ``color``.  ``noise`` scales the per-pixel sensor noise (0:
    none, as a JPEG encoder would smooth it away).  Draws the per-face parameters from
    ``rng``, then each batch's sensor noise: the same generator state gives the same faces.
    """
    height, width = image_shape(size)
    n, channels = len(attributes), 3 if color else 1
    params = _face_params(rng, attributes, color)
    drawn = _render_shape(height, width)
    batch = min(_RENDER_BATCH, max(1, _RENDER_BYTES // (4 * channels * drawn[0] * drawn[1])))
    images = np.empty((n, height, width) + ((3,) if color else ()), dtype=np.uint8)
    for first in range(0, n, batch):
        rows = slice(first, first + batch)
        p = {key: value[..., rows, None, None] for key, value in params.items()}
        flags = {name: attributes[rows, j] > 0 for j, name in enumerate(ATTRIBUTE_NAMES)}
        img = _render_faces(p, flags, drawn, channels)
        if drawn == (height, width):  # as stores were always drawn
            if noise:
                img += (noise * p["noise"]) * rng.standard_normal(img.shape, dtype=np.float32)
            img *= 255
            img += 0.5
        else:  # to levels first: the affine map commutes with interpolation, on 1/f^2 the pixels
            img *= 255
            img += 0.5
            img = _resize(_resize(img, -2, height), -1, width)
            if noise:
                _add_grain(rng, img, 255 * noise * p["noise"])
        np.clip(img, 0, 255, out=img)
        np.copyto(images[rows], np.moveaxis(img, 0, -1) if color else img[0], casting="unsafe")
    return images


def _add_grain(rng: np.random.Generator, img: np.ndarray, scale: np.ndarray) -> None:
    """Add to ``img`` (``(C, B, H, W)``) per-pixel normal noise of standard deviation
    ``scale`` (``(B, 1, 1)``), drawn from :data:`_NORMAL_LEVELS` by random bytes."""
    index = rng.integers(0, 256, img.shape, dtype=np.uint8)
    for face in range(img.shape[1]):  # each face's level scales its table, not its pixels
        img[:, face] += (_NORMAL_LEVELS * scale[face, 0, 0])[index[:, face]]


def _render_shape(height: int, width: int) -> tuple[int, int]:
    """The size a face of ``height`` x ``width`` is drawn at (see :data:`_RENDER_MAX`)."""
    f = math.ceil(max(height, width) / _RENDER_MAX)
    return math.ceil(height / f), math.ceil(width / f)


def _resize(img: np.ndarray, axis: int, n_out: int) -> np.ndarray:
    """Bilinear resampling of ``img`` along ``axis`` to ``n_out`` pixels (centres aligned)."""
    n_in = img.shape[axis]
    if n_out == 2 * n_in:
        return _double(img, axis)
    pos = (np.arange(n_out, dtype=np.float32) + 0.5) * np.float32(n_in / n_out) - 0.5
    pos = np.clip(pos, 0, n_in - 1)
    low = pos.astype(np.intp)
    high = np.minimum(low + 1, n_in - 1)
    shape = [1] * img.ndim
    shape[axis] = n_out
    weight = (pos - low).reshape(shape)
    a = np.take(img, low, axis)
    return a + weight * (np.take(img, high, axis) - a)


def _double(img: np.ndarray, axis: int) -> np.ndarray:
    """:func:`_resize` to twice the pixels, by slices: pixel 2i + 1 is 3/4 of pixel i and
    1/4 of pixel i + 1, pixel 2i + 2 the mirror image; the two ends are copied."""
    x = np.moveaxis(img, axis, 0)
    out = np.empty((2 * len(x),) + x.shape[1:], dtype=img.dtype)
    quarter = (x[1:] - x[:-1]) * np.float32(0.25)
    np.add(x[:-1], quarter, out=out[1:-1:2])
    np.subtract(x[1:], quarter, out=out[2::2])
    out[0], out[-1] = x[0], x[-1]
    return np.moveaxis(out, 0, axis)


def _face_params(rng: np.random.Generator, attributes: np.ndarray, color: bool) -> dict[str, np.ndarray]:
    """Per-image drawing parameters: float32 arrays of shape ``(n,)``, and with ``color``
    the colours of skin, hair, lips, eyes, cheeks and surroundings of shape ``(3, n)``.

    The grey parameters are drawn first and alike in both cases; colours draw after them."""
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
    # Grey is the colours' luminance: cheeks redden by darkening, lips keep the skin's tint.
    p["rosy"] = np.full(n, -0.05)
    p["lip_tint"] = np.ones(n)
    if color:
        add_colours(rng, a, p)
    p["brow"] = np.minimum(p["hair"], 0.35) * 0.8
    p["beard"] = np.minimum(p["hair"], 0.5) * 0.8
    return {key: np.asarray(value, dtype=np.float32) for key, value in p.items()}


class _Canvas:
    """A batch of images being painted, with the face coordinates of each pixel.

    Parameters
    ----------
    img : numpy.ndarray
        float32 ``(C, B, h, w)``: the levels in [0, 1] of C = 1 or 3 channels.
    u, v : numpy.ndarray
        float32 ``(B, h, w)``: the face coordinates of every pixel.
    p : dict of numpy.ndarray
        Drawing parameters, float32 arrays of shape ``(B, 1, 1)``, including
        the pose (``theta``, ``scale``, ``tx``, ``ty``).

    Notes
    -----
    Whole canvases (``h, w`` = the image's size) can be cropped to windows
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
        p, (height, width) = self.p, self.img.shape[-2:]
        side = min(height, width)
        cos, sin = p["scale"] * np.cos(p["theta"]), p["scale"] * np.sin(p["theta"])
        corners = [(u, v) for u in (u0, u1) for v in (v0, v1)]
        xs = [p["tx"] + cos * u - sin * v for u, v in corners]
        ys = [p["ty"] + sin * u + cos * v for u, v in corners]

        def pixels(coords, length):
            extent = length / side  # the axis spans [-extent, extent]
            low = (min(np.min(c) for c in coords) + extent) * side / 2 - 0.5
            high = (max(np.max(c) for c in coords) + extent) * side / 2 - 0.5
            start, stop = np.clip([np.floor(low), np.ceil(high) + 1], 0, length).astype(int)
            return slice(start, stop)

        window = (Ellipsis, pixels(ys, height), pixels(xs, width))
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
            p = {key: value[..., index, :, :] for key, value in self.p.items()}
            sub = _Canvas(self.img[..., index, :, :], self.u[index], self.v[index], p)
            draw(sub)
            self.img[..., index, :, :] = sub.img


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
    c.shade_ellipse(c.p["rosy"], 0.26, 0.24, 0.1, 0.07, soft=1.0, mirror=True)


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
    """Blur the last two axes of ``img`` with a ``2 * radius + 1`` box, edges replicated."""
    width = 2 * radius + 1
    for axis in (img.ndim - 2, img.ndim - 1):
        pad = [(0, 0)] * img.ndim
        pad[axis] = (radius + 1, radius)
        sums = np.cumsum(np.pad(img, pad, mode="edge"), axis=axis)
        length = sums.shape[axis] - width
        img = sums.take(range(width, width + length), axis) - sums.take(range(length), axis)
        img /= width
    return img


def _axis(length: int, side: int) -> np.ndarray:
    """Pixel centres of an axis of ``length`` pixels, the shorter ``side`` spanning [-1, 1]."""
    return (np.arange(length, dtype=np.float32) + 0.5) * np.float32(2 / side) - np.float32(length / side)


def _render_faces(
    p: dict[str, np.ndarray], flags: dict[str, np.ndarray], shape: tuple[int, int], channels: int
) -> np.ndarray:
    """Draw one batch of faces as a float32 ``(channels, B, h, w)`` array, before noise.

    ``p`` holds float32 parameters of shape ``(B, 1, 1)`` or, for colours, ``(3, B, 1, 1)``
    (see :func:`_face_params`) and ``flags`` boolean attribute arrays of shape ``(B,)``
    selecting the images that get optional features.
    """
    height, width = shape
    x = _axis(width, min(shape))[None, None, :]
    y = _axis(height, min(shape))[None, :, None]

    # Face coordinates: undo the pose (shift, then rotation and scale).
    cos, sin = np.cos(p["theta"]) / p["scale"], np.sin(p["theta"]) / p["scale"]
    dx, dy = x - p["tx"], y - p["ty"]
    img = np.empty((channels, p["theta"].shape[-3], height, width), dtype=np.float32)
    img[...] = p["bg"] + p["bg_gx"] * x + p["bg_gy"] * y
    c = _Canvas(img, dx * cos + dy * sin, dy * cos - dx * sin, p)

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
        p["skin"] * (1 - p["lip_dark"]) * p["lip_tint"], 0.0, p["mouth_y"], p["mouth_w"], p["lip_b"] + p["open_b"],
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

    # Lighting, blur (the sensor noise comes at the image's own size: draw_faces).
    c.img *= p["gain"] * (1 + p["light"] * x)
    c.apply(flags["Blurry"], _draw_blur)
    return c.img
