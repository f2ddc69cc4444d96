"""Parameter validation: each estimator declares a table, one function checks it at fit.

Every estimator class has ``_parameter_rules``: for each ``__init__`` parameter (every
one is listed, so the table is the complete contract) the rules its value must pass, in
order.  :func:`validate_params` runs the table; it is the only parameter check, called
at the start of ``fit``, ``partial_fit``, ``fit_statistics`` and when a saved model's
parameters are read back.  This is scikit-learn's ``_parameter_constraints`` idea in a
small form of our own (scikit-learn's implementation is private): a :class:`Rule` says
what a value must be, and its error names that, e.g. ``"tradeoff must be a number in
[0, 1]; got 1.5"``; a :class:`Check` raises its own error, for a helper that already
validates or a rule that also reads other parameters.
"""

from __future__ import annotations

import argparse
import numbers
import os
import sys
import types
import warnings
from dataclasses import dataclass
from typing import Any, Callable

from ..errors import InvalidInputError
from ._compat import current

# Deferred imports: standard modules needed rarely or on one platform only are imported in the
# functions that use them, so that importing this module stays light.

__all__ = ["Rule", "Check", "validate_params", "is_int", "is_real", "is_bool", "one_of",
           "int_at_least", "RenamedOneOf", "BOOL",
           "SPLIT_EVERY", "TRADEOFF"]


def is_int(v) -> bool:
    """An integer that is not a bool (``True`` is an ``Integral`` to Python)."""
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def is_real(v) -> bool:
    """A real number that is not a bool."""
    return isinstance(v, numbers.Real) and not isinstance(v, bool)


def is_bool(v) -> bool:
    """True or False (numpy's too); not a truthy string such as "no", nor 0 or 1."""
    import numpy as np  # `import dfairpca` reaches this module: numpy only when a value is checked

    return isinstance(v, (bool, np.bool_))


@dataclass(frozen=True)
class Rule:
    """A test of one parameter's value; ``must_be`` completes "<name> must be ..."."""

    accepts: Callable[[Any], bool]
    must_be: str

    def check(self, est, name: str, value) -> None:
        if not self.accepts(value):
            raise InvalidInputError(f"{name} must be {self.must_be}; got {value!r}")

    def argument(self, convert: Callable[[str], Any] = int, words: tuple = ()) -> Callable[[str], Any]:
        """This rule as an argparse ``type``: the text converted by ``convert`` (or one of
        ``words``, kept as it is) and accepted, else a usage error (exit status 2) that says
        what it must be, as the estimators' parameters do."""
        def parse(text: str):
            if text in words:
                return text
            try:
                value = convert(text)
            except ValueError:
                value = None
            if value is None or not self.accepts(value):
                either = "".join(f"{w!r} or " for w in words)
                raise argparse.ArgumentTypeError(f"must be {either}{self.must_be}; got {text!r}")
            return value

        parse.__name__ = self.must_be
        return parse


@dataclass(frozen=True)
class Check:
    """A test that raises its own error: ``run(est, value)``."""

    run: Callable[[Any, Any], object]  # what it returns is ignored

    def check(self, est, name: str, value) -> None:
        self.run(est, value)


def one_of(options: tuple) -> Rule:
    """The value is one of ``options`` (the error lists them)."""
    return Rule(lambda v: v in options, f"one of {options}")


def int_at_least(low: int) -> Rule:
    """The rule "an integer (not a bool) >= ``low``", of the estimators' parameters and,
    by its :meth:`Rule.argument`, of the command lines' integer options.

    Parameters
    ----------
    low : int
        The smallest integer accepted.

    Returns
    -------
    Rule
        Its ``check`` raises ``InvalidInputError`` naming the parameter; ``argument()`` is
        an argparse ``type`` that refuses with "must be an integer >= low".
    """
    return Rule(lambda v: is_int(v) and v >= low, f"an integer >= {low}")


def outside_stacklevel() -> int:
    """The ``stacklevel`` that makes a ``warnings.warn`` in the function calling this one
    name the first frame outside dfairpca: the user's call, however deep the validation sits
    (Python 3.12's ``skip_file_prefixes``, for 3.11)."""
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
    frame: types.FrameType | None = sys._getframe(1)
    level = 1
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(package):
        frame, level = frame.f_back, level + 1
    return level


@dataclass(frozen=True)
class RenamedOneOf:
    """:func:`one_of` for a parameter some of whose values were renamed (:data:`dfairpca.base._compat.RENAMED`):
    an old spelling passes with a FutureWarning naming the new one."""

    options: tuple

    def check(self, est, name: str, value) -> None:
        new = current(name, value)
        if new is not value:
            warnings.warn(f"{name}={value!r} is deprecated and will be removed in a future "
                          f"release: pass {name}={new!r} (the same solver, renamed)",
                          FutureWarning, stacklevel=outside_stacklevel())
        one_of(self.options).check(est, name, new)


#: rules two or more estimators share
BOOL = [Rule(is_bool, "True or False")]
SPLIT_EVERY = [int_at_least(2)]
TRADEOFF = [Rule(lambda t: is_real(t) and 0.0 <= t <= 1.0, "a number in [0, 1]")]


def validate_params(est) -> None:
    """Raise the first error of ``type(est)._parameter_rules`` (in table order) for the
    parameters ``est`` holds."""
    for name, rules in type(est)._parameter_rules.items():
        value = getattr(est, name)
        for rule in rules:
            rule.check(est, name, value)
