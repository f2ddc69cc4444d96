"""``.. dfairpca-cli-help::``: the ``dfairpca`` command's help, generated at build time.

The text is what ``dfairpca --help`` and ``dfairpca COMMAND --help`` print, taken from
the parser the command itself builds (:func:`dfairpca.cli.build_parser`), so the page
never disagrees with the installed command.  One section per sub-command.
"""

from __future__ import annotations

import argparse
import os

from docutils.statemachine import StringList
from sphinx.util.docutils import SphinxDirective

#: the width the help is wrapped to (argparse reads $COLUMNS)
WIDTH = "96"


def _help_texts() -> list[tuple[str, str, str]]:
    """[(name, one-line help, full help)], the main parser first."""
    old = {k: os.environ.get(k) for k in ("COLUMNS", "NO_COLOR")}
    os.environ.update(COLUMNS=WIDTH, NO_COLOR="1")
    try:
        from dfairpca.cli import build_parser

        ap = build_parser()
        out = [("dfairpca", ap.description or "", ap.format_help())]
        for action in ap._actions:
            if isinstance(action, argparse._SubParsersAction):
                helps = {a.dest: a.help or "" for a in action._choices_actions}
                for name, sub in action.choices.items():
                    out.append((name, helps.get(name, ""), sub.format_help()))
        return out
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


class CLIHelp(SphinxDirective):
    has_content = False

    def run(self):
        lines = []
        for name, summary, text in _help_texts():
            title = name if name == "dfairpca" else f"dfairpca {name}"
            lines += [title, "-" * len(title), ""]
            if summary and name != "dfairpca":
                lines += [summary[0].upper() + summary[1:] + ".", ""]
            lines += [".. code-block:: text", ""]
            lines += ["   " + line if line.strip() else "" for line in text.rstrip().splitlines()]
            lines += [""]
        self.state_machine.insert_input(StringList(lines, source="dfairpca.cli.build_parser"),
                                        "dfairpca.cli.build_parser")
        return []


def setup(app):
    app.add_directive("dfairpca-cli-help", CLIHelp)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
