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


def register(estimator: type) -> type:
    """Class decorator: let saved models of ``estimator`` (by its ``__name__``) be loaded.

    Parameters
    ----------
    estimator : type
        An estimator class with the saved-model methods :func:`dfairpca.load` calls.

    Returns
    -------
    type
        ``estimator``, registered.
    """
    _CLASSES[estimator.__name__] = estimator
    return estimator


def names() -> tuple[str, ...]:
    """The registered class names, in the order they were registered.

    Returns
    -------
    tuple of str
        The names.
    """
    return tuple(_CLASSES)


def lookup(name: str) -> type[Any]:
    """The registered class called ``name`` (KeyError if there is none).

    Parameters
    ----------
    name : str
        The class's ``__name__``, as a saved model records it.

    Returns
    -------
    type
        The class.
    """
    return _CLASSES[name]
