"""Compatibility with what older dfairpca wrote or accepted, in one place: each shim says
what it keeps working and after which version it may be dropped.

The classes that old pickles name keep their place (a pickle finds a class by its module
path: :class:`~dfairpca.stats.moments.Moments`, ``dfairpca.engine._thin_pass.FirstMoments``);
what they do to an old state is here.  Older saved models and checkpoints are read by their
format's own version checks (``dfairpca.decomposition._saved``: keys a model of 0.1.0 or
0.2.0 lacks; ``dfairpca.engine._checkpoint_files``: ``CHECKPOINT_VERSION``), which belong to
those formats.

Removal schedule: a shim for files or spellings of 0.2.0 stays through the 0.3 releases and
may be dropped in 0.4.0, once users had a release that reads the old form and writes the new.
"""

from __future__ import annotations

from dataclasses import MISSING, fields
import sys

__all__ = ["RENAMED", "current", "current_params", "fill_new_fields", "first_moments_state",
           "MOVED_MODULES", "alias_moved_modules"]

#: public modules of 0.2.0 whose names are now their package's own (``__all__``): old path ->
#: the package.  ``from dfairpca.io.writes import atomic_file`` keeps working; may be
#: dropped in 0.4.0.
MOVED_MODULES = {"dfairpca.io.writes": "dfairpca.io", "dfairpca.io.storage": "dfairpca.io",
                 "dfairpca.base.runtime": "dfairpca.base"}


def alias_moved_modules(package: str) -> None:
    """Make the old module paths that :data:`MOVED_MODULES` maps to ``package`` import as
    the package itself (called by the package's ``__init__``)."""
    for old, new in MOVED_MODULES.items():
        if new == package:
            sys.modules.setdefault(old, sys.modules[package])

#: parameter values that were renamed: ``(parameter, old spelling) -> new spelling``.  The
#: old spelling still works at fit, with a FutureWarning; a saved model holding it loads
#: quietly as the new one.  ``eigen_solver="randomized"`` named block subspace iteration,
#: an algorithm other than the randomized SVD that ``svd_solver="randomized"`` names.
#: Renamed after 0.2.0; may be dropped in 0.4.0.
RENAMED = {("eigen_solver", "randomized"): "subspace"}


def current(name: str, value):
    """``value`` of parameter ``name`` in its current spelling (an old one mapped, quietly)."""
    return RENAMED.get((name, value), value) if isinstance(value, str) else value


def current_params(params: dict) -> dict:
    """A parameter dict (a saved model's) with every renamed value in its current spelling."""
    return {name: current(name, v) for name, v in params.items()}


def fill_new_fields(obj, state: dict) -> dict:
    """The pickled ``state`` of the dataclass ``obj`` with every field an older dfairpca did
    not have given its default (a model pickled with its statistics keeps working after an
    upgrade).  Kept as long as fields are added; nothing to drop."""
    for f in fields(obj):
        if f.name not in state:
            state[f.name] = f.default_factory() if f.default is MISSING and \
                f.default_factory is not MISSING else f.default
    return state


def first_moments_state(state: dict) -> dict:
    """The state of a randomized fit's ``statistics_`` pickled by 0.2.0 (a ``FirstMoments``:
    ``sq``, ``exponent``) as today's first-order :class:`~dfairpca.stats.moments.Moments`
    (``diagonal``, ``scatter_exponent``, no scatter).  For pickles of 0.2.0; may be dropped
    in 0.4.0 together with ``FirstMoments``."""
    state = dict(state)
    state["diagonal"] = state.pop("sq", None)
    state["scatter_exponent"] = state.pop("exponent", 0)
    state.setdefault("scatter", None)
    return state
