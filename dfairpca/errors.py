"""dfairpca's exceptions and warnings: one base class for each, so that a caller can tell
what dfairpca refuses on purpose (bad input, parameters, storage, a cluster that cannot do
the job) from a bug, and silence or escalate one kind of warning alone.

Every error dfairpca raises on purpose is a :class:`DfairpcaError` and also the builtin a
caller would expect (a :class:`ValueError` for a value it cannot use, a
:class:`TypeError`, :class:`FileExistsError`, :class:`ConnectionError`, ...), so existing
``except ValueError`` code keeps working.  The command line prints these (and operating
system errors) as one line; anything else is a bug and keeps its traceback.

Every warning is a :class:`DfairpcaWarning` (a :class:`UserWarning`); e.g.
``warnings.simplefilter("error", ConstraintDroppedWarning)`` makes a fit whose groups
impose no constraint an error.
"""

from __future__ import annotations

__all__ = ["DfairpcaError", "InvalidInputError", "InvalidTypeError", "NotFoundError", "RunError",
           "PathNotFoundError", "PathExistsError", "AccessError", "UnreachableError",
           "DiskFullError",
           "DfairpcaWarning", "ConstraintDroppedWarning", "NumericAttributeWarning",
           "DiscardedWriteWarning", "KeptFilesWarning", "LowVarianceWarning"]


class DfairpcaError(Exception):
    """Base of every error dfairpca raises on purpose."""


class InvalidInputError(DfairpcaError, ValueError):
    """A value dfairpca cannot use: data, labels, a parameter, a file's content."""


class InvalidTypeError(DfairpcaError, TypeError):
    """An argument of a type dfairpca does not take."""


class NotFoundError(DfairpcaError, KeyError):
    """A name that is not there: an array of a store, a column, an attribute."""

    def __str__(self) -> str:  # the message, not KeyError's quoted repr of it
        return str(self.args[0]) if self.args else ""


class RunError(DfairpcaError, RuntimeError):
    """A job that cannot run or complete as asked (its message says how to go on)."""


class PathNotFoundError(DfairpcaError, FileNotFoundError):
    """A path (a store, a model, a bucket) that is not there."""


class PathExistsError(DfairpcaError, FileExistsError):
    """A path that is there but should not be."""


class AccessError(DfairpcaError, PermissionError):
    """A folder or object store that refuses to be read or written."""


class DiskFullError(DfairpcaError, OSError):
    """A write that found its disk full (``errno`` ENOSPC): the message names the path, the
    space the write needed where known, and what was kept or removed.

    ``path`` is the output, ``stage`` the local folder that filled where that differs (an
    output for a URL is written there first), ``what`` what was written, ``kept`` what was
    kept and how to go on, ``needed`` the bytes the write needed if known.
    """

    path: object = None
    stage: object = None
    what: str = ""
    kept: str = ""
    needed: int | None = None
    #: said by the write protocol, which knows what it removed but not what its caller kept:
    #: a caller that knows says it again (:func:`dfairpca.io.is_disk_full` is true for it)
    provisional: bool = False


class UnreachableError(DfairpcaError, ConnectionError):
    """Storage or a cluster that cannot be reached, or does not answer as it must."""


class DfairpcaWarning(UserWarning):
    """Base of every warning dfairpca gives."""


class ConstraintDroppedWarning(DfairpcaWarning):
    """A group (or numeric attribute) whose mean equals the overall mean (its covariance
    with the features is zero) to rounding: it imposes no constraint and none is kept."""


class NumericAttributeWarning(DfairpcaWarning):
    """A protected column of a few whole numbers is treated as a number (decorrelated), not
    as that many groups with equal means."""


class DiscardedWriteWarning(DfairpcaWarning):
    """An interrupted write made with other settings or code was discarded, not resumed."""


class KeptFilesWarning(DfairpcaWarning):
    """A removal of dfairpca's output kept the directory for the user's files in it."""


class LowVarianceWarning(DfairpcaWarning):
    """A fair model keeps under 5% of the variance (:data:`dfairpca.solve._fairness.LOW_VARIANCE`):
    its representation says little about the data; the message says which parameter holds it
    down."""
