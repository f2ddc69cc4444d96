"""One exception base: what dfairpca refuses on purpose is a DfairpcaError and the builtin a
caller expects; the command line prints those as one line and a bug with its traceback."""

import numpy as np
import pytest

import dfairpca
from dfairpca import cli
from dfairpca.errors import DfairpcaError, InvalidInputError


def test_refusals_are_dfairpca_errors_and_the_builtin_callers_expect():
    with pytest.raises(DfairpcaError) as info:
        dfairpca.PCA(n_components=-1).fit(np.ones((5, 3)))
    assert isinstance(info.value, ValueError) and isinstance(info.value, InvalidInputError)
    with pytest.raises(DfairpcaError) as info:
        dfairpca.load("/nonexistent/model")
    assert isinstance(info.value, (OSError, ValueError))
    assert dfairpca.DfairpcaError is DfairpcaError


def test_the_command_line_prints_refusals_in_one_line_and_bugs_with_their_traceback(monkeypatch, capsys):
    """A refused argument is exit status 2, a run that fails 1 (the library's own refusal of
    a value outside the checks of arguments: corrupt data), both in one line."""
    from dfairpca.cli._errors import UsageError, arguments

    def refuses(args):
        raise UsageError("a refusal, said plainly")

    monkeypatch.setattr(cli, "cmd_show", refuses)
    assert cli.main(["show", "m", "s.zarr", "--out", "x.png"]) == 2
    assert capsys.readouterr().err == "dfairpca show: error: a refusal, said plainly\n"

    def checks(args):
        with arguments():  # the library's check of a parameter
            raise InvalidInputError("k must be at most 3")

    monkeypatch.setattr(cli, "cmd_show", checks)
    assert cli.main(["show", "m", "s.zarr", "--out", "x.png"]) == 2
    assert capsys.readouterr().err == "dfairpca show: error: k must be at most 3\n"

    def fails(args):
        raise InvalidInputError("corrupt or unreadable image 000001.jpg")

    monkeypatch.setattr(cli, "cmd_show", fails)
    assert cli.main(["show", "m", "s.zarr", "--out", "x.png"]) == 1
    assert capsys.readouterr().err == "dfairpca show: error: corrupt or unreadable image 000001.jpg\n"

    def bug(args):
        raise ValueError("an internal invariant broke")

    monkeypatch.setattr(cli, "cmd_show", bug)
    with pytest.raises(ValueError, match="internal invariant"):  # not swallowed into one line
        cli.main(["show", "m", "s.zarr", "--out", "x.png"])


def test_each_kind_of_warning_can_be_escalated_alone():
    """Every warning is a DfairpcaWarning (a UserWarning): a user can make one kind an error
    and leave the others, e.g. a group that imposes no constraint."""
    import warnings

    from dfairpca.errors import ConstraintDroppedWarning, DfairpcaWarning, NumericAttributeWarning

    rng = np.random.default_rng(12)
    X = rng.normal(size=(400, 8))
    z = np.arange(400) % 2
    X[z == 1] = X[z == 0]  # identical halves: equal group means, exactly
    with pytest.warns(ConstraintDroppedWarning, match="no constraint") as record:
        dfairpca.FairPCA(3).fit(X, sensitive_features=z)
    assert all(issubclass(w.category, DfairpcaWarning) and issubclass(w.category, UserWarning)
               for w in record)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConstraintDroppedWarning)
        with pytest.raises(ConstraintDroppedWarning):
            dfairpca.FairPCA(3).fit(X, sensitive_features=z)
        warnings.simplefilter("ignore", NumericAttributeWarning)  # others stay as they are
    assert dfairpca.DfairpcaWarning is DfairpcaWarning


def test_a_command_prints_the_package_warnings_in_one_line_and_others_as_python_does():
    import subprocess
    import sys

    code = ("import warnings; from dfairpca.cli import _showing_log; "
            "from dfairpca.errors import DfairpcaWarning\n"
            "warnings.simplefilter('always')\n"
            "with _showing_log():\n"
            "    warnings.warn(DfairpcaWarning('group 1 has 120 rows'))\n"
            "    warnings.warn(UserWarning('not ours'))\n"
            "warnings.warn(DfairpcaWarning('after the command'))\n")
    err = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stderr
    lines = err.splitlines()
    assert lines[0] == "dfairpca: warning: group 1 has 120 rows"
    assert "UserWarning: not ours" in lines[1]  # another library's warning: file, line and class
    assert any("DfairpcaWarning: after the command" in x for x in lines[2:])  # restored after
