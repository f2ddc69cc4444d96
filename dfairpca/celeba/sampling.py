"""CelebA-like attributes: the 40 binary labels sampled with CelebA's prevalences and
correlations (pure numpy; what synthetic stores and fabricated CelebA folders are drawn from)."""

from __future__ import annotations

import numpy as np

from .schema import ATTRIBUTE_NAMES

__all__ = ["sample_attributes"]


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


def sample_attributes(rng: np.random.Generator, n: int) -> np.ndarray:
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
