"""The command's errors, exit statuses and output helpers: how a failure becomes one line
on stderr and an exit status, and how a summary becomes JSON."""

from __future__ import annotations

import difflib
import json
import math
import sys

import numpy as np

from ..errors import DfairpcaError


class CLIError(DfairpcaError):
    """An error the command reports in one line (exit status 2)."""


#: exit status of a command stopped by Ctrl-C (128 + SIGINT), as shells report it
EXIT_INTERRUPTED = 130

#: the kind in dfairpca's marker of what ``transform`` writes: another kind than the data
#: stores of synth and ingest ("store"), so that ``transform --overwrite`` can never replace
#: a data set (an ingest of hours), nor synth one of its results
TRANSFORM_KIND = "transform output"

#: the errors a command reports in one line, exit status 2: what dfairpca refuses on purpose
#: and what the operating system refuses (a file, a permission, a connection); anything
#: else is a bug and keeps its traceback
ONE_LINE_ERRORS = (DfairpcaError, OSError)


def _malformed_file(exc: BaseException) -> bool:
    """Whether ``exc`` is a reader's refusal of a user's file (a Zarr store's metadata, a
    JSON file) that reached the command unwrapped: said in one line, as a refusal is."""
    zarr_errors = sys.modules.get("zarr.errors")  # imported if a store was opened
    return isinstance(exc, json.JSONDecodeError) or (
        zarr_errors is not None and isinstance(exc, zarr_errors.BaseZarrError))


def one_line(exc: BaseException) -> str:
    """The message of one of :data:`ONE_LINE_ERRORS` (a KeyError's without its quotes)."""
    return str(exc.args[0]) if isinstance(exc, KeyError) and exc.args else str(exc)

#: how many names an error lists before "..." (arrays of a store, columns of a table)
MAX_NAMES_SHOWN = 20


def _shown(names) -> str:
    """``names`` for an error message, at most :data:`MAX_NAMES_SHOWN` of them."""
    names = [str(n) for n in names]
    more = ", ..." if len(names) > MAX_NAMES_SHOWN else ""
    return (", ".join(names[:MAX_NAMES_SHOWN]) + more) or "nothing"


def _did_you_mean(name: str, names) -> str:
    """'; did you mean 'X'?' for the closest of ``names``, or ''."""
    close = difflib.get_close_matches(str(name), [str(n) for n in names], n=1)
    return f"; did you mean {close[0]!r}?" if close else ""



def _plain(value):
    """``value`` as JSON can hold it: numpy scalars and arrays as Python numbers and lists,
    a non-finite float as None (JSON has no NaN)."""
    if isinstance(value, np.ndarray):
        return [_plain(v) for v in value.tolist()]
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value

