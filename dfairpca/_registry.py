"""The classes a saved model may name: the allow-list :func:`dfairpca.load` reads.

An estimator class registers itself with :func:`register` where it is defined, so the
loader looks the class up here and never imports an estimator module statically (the
estimators import the I/O layer, never the other way round).  Nothing else is ever
instantiated from a saved file: a name not registered is refused.
"""

from __future__ import annotations

import importlib

__all__ = ["register", "names", "lookup"]

_CLASSES: dict[str, type] = {}

#: the modules whose classes register themselves: imported by name on the first look-up,
#: since the package imports them lazily (a fresh process may have loaded only one)
_MODULES = ("dfairpca.decomposition", "dfairpca.kernel")


def _registered() -> dict[str, type]:
    """Every registered class, after importing the modules that define them."""
    for module in _MODULES:
        importlib.import_module(module)
    return _CLASSES


def register(cls: type) -> type:
    """Class decorator: let saved models of ``cls`` (by its ``__name__``) be loaded."""
    _CLASSES[cls.__name__] = cls
    return cls


def names() -> tuple[str, ...]:
    """The registered class names, in the order they were registered."""
    return tuple(_registered())


def lookup(name: str) -> type:
    """The registered class called ``name`` (KeyError if there is none)."""
    return _registered()[name]
