"""Where an output is written: one interface, a local disk or an fsspec file system behind it.

The write protocol (:mod:`dfairpca.io._writes`: marker, temporary sibling, move into place,
recovery) is the same rules on two kinds of storage: a local disk, where a directory is
renamed into place, and object storage reached through fsspec, where it is copied under a
journal.  :class:`Storage` names the operations the protocol needs; :class:`LocalStorage`
(:mod:`dfairpca.io._local`) and :class:`FsspecStorage` (:mod:`dfairpca.io._fsspec`) implement
them, and :func:`dfairpca.io.storage_for` is the one place that tells a URL from
a local path.
"""

from __future__ import annotations

import abc
import contextlib
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

__all__ = ["Storage", "Protected", "each_protected"]

#: what a write must stay apart from: ``{"the input store": path}`` or ``(what, path)`` pairs
Protected = Mapping[str, Any] | Iterable[tuple[str, Any]] | None


class Storage(abc.ABC):
    """One output's place (``target``) and the write protocol's operations on it.

    Every operation keeps the protocol's guarantee: nothing dfairpca did not write (no
    marker) is ever replaced or deleted, and an output appears whole or not at all.
    """

    #: the output: a :class:`pathlib.Path` or a :class:`dfairpca.io._urls.Location`
    target: Any
    #: the output as the caller named it (a path, a URL, a Location or an fsspec mapper)
    given: Any
    #: whether the target is reached through fsspec (a URL or a mapper), not a local disk:
    #: io's own question; the layers above ask the methods below what they need instead
    #: (tests/test_structure.py keeps this attribute inside io)
    remote: bool = False

    def __str__(self) -> str:
        return str(self.target)

    @classmethod
    @abc.abstractmethod
    def at(cls, path, storage_options: dict | None = None) -> "Storage":
        """The storage of ``path`` (``storage_options``: a URL's fsspec options)."""

    @abc.abstractmethod
    def user_path(self) -> Any:
        """The target as a writer hands it back to its caller: a local Path, or a URL's
        place as the caller gave it."""

    @abc.abstractmethod
    def as_argument(self, kind: str) -> Any:
        """The target as dfairpca's writers and readers take it: a local Path with a name
        of its own (:func:`dfairpca.io.named`, for a ``kind``), or a URL's Location, which
        carries its storage options to every read and write."""

    @abc.abstractmethod
    def sibling(self, suffix: str) -> "Storage":
        """The storage of ``NAME + suffix`` beside the target, on the same storage and with
        the same options (a checkpoint beside its model)."""

    @abc.abstractmethod
    def for_readers(self, opened) -> Any:
        """What a reader that takes a local path or an opened Zarr group is given: the local
        path as given (its messages name it), or for a URL ``opened``, the group opened with
        the storage options (which a URL alone does not carry)."""

    @abc.abstractmethod
    def exists(self) -> bool:
        """Whether anything is at the target (a file, a directory, objects under a prefix)."""

    @abc.abstractmethod
    def read_marker(self) -> dict | None:
        """dfairpca's marker of the target, or None if it carries none."""

    @abc.abstractmethod
    def write_marker(self, kind: str) -> None:
        """Mark the target, a finished directory or Zarr store, as dfairpca's ``kind``."""

    @abc.abstractmethod
    def foreign(self, found: dict) -> tuple[list[str], dict]:
        """What under the marked target (marker ``found``) dfairpca did not write, and the
        attributes it did not write in each metadata file among them."""

    @abc.abstractmethod
    def check_target(self, kind: str, *, overwrite: bool = False, protect: Protected = None,
                     probe: bool = True) -> None:
        """Raise unless a ``kind`` may be written at the target now (leftovers recovered first)."""

    @abc.abstractmethod
    def atomic_directory(self, kind: str, *, overwrite: bool = False, protect: Protected = None,
                         direct: bool = False) -> contextlib.AbstractContextManager:
        """A context yielding where to write a directory that becomes the target only if
        the block succeeds."""

    @abc.abstractmethod
    def move_into_place(self, src, kind: str, *, overwrite: bool = False) -> None:
        """Put the finished, marked directory ``src`` at the target."""

    @abc.abstractmethod
    def remove_directory(self, kind: str) -> None:
        """Delete the target if it is dfairpca's ``kind``, keeping what a user put inside."""

    @abc.abstractmethod
    def recover(self) -> None:
        """Repair what a crash in the middle of a write to the target left."""

    @abc.abstractmethod
    def recover_for_reading(self) -> None:
        """Make the target readable whole before reading it, or say why it is not."""

    @abc.abstractmethod
    def intact_copies(self) -> list:
        """The intact old versions a replace cut short left of a missing target, oldest first."""

    @abc.abstractmethod
    def read_text(self, name: str) -> str:
        """The text of the small file ``name`` inside the target, no more than dfairpca writes."""

    @abc.abstractmethod
    def local_copy(self) -> contextlib.AbstractContextManager:
        """A context yielding a local folder holding the target whole (itself when it is
        local), made readable first (:meth:`recover_for_reading`)."""


def each_protected(protect: Protected) -> Iterator[tuple[str, Any]]:
    """The ``(what, path)`` pairs of ``protect``."""
    return iter(protect.items() if isinstance(protect, Mapping) else protect or ())
