"""The classes a saved model may name: the allow-list :func:`dfairpca.load` reads.

An estimator class registers itself with :func:`register` where it is defined, so the
I/O layer never imports an estimator module (the estimators import it, never the other
way round): the package :mod:`dfairpca.decomposition` imports every estimator module, so
they have registered before its loader runs.  Nothing else is ever instantiated from a
saved file: a name not registered is refused.
"""

from __future__ import annotations

from typing import Any

__all__ = ["register", "names", "lookup"]

_CLASSES: dict[str, type] = {}


def register(cls: type) -> type:
    """Class decorator: let saved models of ``cls`` (by its ``__name__``) be loaded."""
    _CLASSES[cls.__name__] = cls
    return cls


def names() -> tuple[str, ...]:
    """The registered class names, in the order they were registered."""
    return tuple(_CLASSES)


def lookup(name: str) -> type[Any]:
    """The registered class called ``name`` (KeyError if there is none)."""
    return _CLASSES[name]
