"""Every Python block of README.md and of the user-guide pages (docs/**/*.rst, docs/**/*.md)
runs as written, saved as a script in a fresh empty folder: these are what a reader copies
first, so each must work without the repository and make its own data.

A block that cannot run here (it needs the reader's own cluster address or credentials) is
preceded by an explicit marker naming why, which this test honours and counts:

* reStructuredText: the comment ``.. not-runnable: <why>`` on the line before the
  ``.. code-block:: python`` directive;
* Markdown: ``<!-- not-runnable: <why> -->`` on the line before the ```` ```python ```` fence.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

import dfairpca

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
#: folders under docs/ that the documentation build writes (generated pages, not the guide)
GENERATED = {"_build", "auto_examples", "generated", "_templates", "_ext"}
#: the marker's reason, after the page's own comment syntax has been stripped
MARKER = re.compile(r"not-runnable:\s*(\S.*?)\s*(?:-->)?\s*$")


@dataclass(frozen=True)
class Block:
    """One Python block of a page: where it is, its code, and the reason it is not run."""
    page: str
    line: int
    code: str
    skip: str | None

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}"


def _marker(lines: list[str], i: int) -> str | None:
    """The not-runnable reason on the last non-blank line before line ``i``, if any."""
    j = i - 1
    while j >= 0 and not lines[j].strip():
        j -= 1
    m = MARKER.search(lines[j]) if j >= 0 else None
    return m.group(1) if m else None


def markdown_blocks(page: str, text: str) -> list[Block]:
    """The ```` ```python ```` fenced blocks of a Markdown page."""
    lines, out = text.splitlines(), []
    i = 0
    while i < len(lines):
        if lines[i].strip() == "```python":
            end = next(j for j in range(i + 1, len(lines)) if lines[j].strip() == "```")
            out.append(Block(page, i + 1, "\n".join(lines[i + 1:end]) + "\n", _marker(lines, i)))
            i = end
        i += 1
    return out


def rst_blocks(page: str, text: str) -> list[Block]:
    """The ``.. code-block:: python`` blocks of a reStructuredText page (the indented body
    after the directive and its options, dedented)."""
    lines, out = text.splitlines(), []
    for i, line in enumerate(lines):
        if not re.match(r"^\s*\.\. code-block::\s*python3?\s*$", line):
            continue
        indent = len(line) - len(line.lstrip())
        body, j = [], i + 1
        while j < len(lines) and (not lines[j].strip()
                                  or len(lines[j]) - len(lines[j].lstrip()) > indent):
            body.append(lines[j])
            j += 1
        code = [b for b in body if not b.strip().startswith(":")]  # directive options
        out.append(Block(page, i + 1, textwrap.dedent("\n".join(code)).strip() + "\n",
                         _marker(lines, i)))
    return out


def pages() -> list[Path]:
    """README.md and the guide's pages, in a stable order."""
    found = [p for p in sorted(DOCS.rglob("*")) if p.suffix in {".rst", ".md"}
             and not GENERATED & set(p.relative_to(DOCS).parts)]
    return [ROOT / "README.md", *found]


def all_blocks() -> list[Block]:
    out: list[Block] = []
    for p in pages():
        text = p.read_text(encoding="utf-8")
        rel = p.relative_to(ROOT).as_posix()
        out += markdown_blocks(rel, text) if p.suffix == ".md" else rst_blocks(rel, text)
    return out


BLOCKS = all_blocks()


def test_the_readme_and_the_guide_have_python_examples():
    assert any(b.page == "README.md" for b in BLOCKS)
    assert len({b.page for b in BLOCKS}) >= 5


def test_blocks_left_out_are_few_and_say_why():
    skipped = [b for b in BLOCKS if b.skip]
    assert len(skipped) <= max(1, len(BLOCKS) // 5), [b.id for b in skipped]


def test_the_block_finders_read_both_syntaxes():
    md = "text\n<!-- not-runnable: needs your scheduler -->\n```python\nx = 1\n```\n\n```python\ny = 2\n```\n"
    assert [(b.code, b.skip) for b in markdown_blocks("p.md", md)] == [
        ("x = 1\n", "needs your scheduler"), ("y = 2\n", None)]
    rst = ("Title\n\n.. code-block:: python\n   :caption: c\n\n   a = 1\n   if a:\n       b = 2\n\n"
           "after\n\n.. not-runnable: needs s3\n\n.. code-block:: python\n\n   c = 3\n")
    assert [(b.code, b.skip) for b in rst_blocks("p.rst", rst)] == [
        ("a = 1\nif a:\n    b = 2\n", None), ("c = 3\n", "needs s3")]


#: the blocks that run (those marked not runnable are counted above, not skipped here)
RUNNABLE = [b for b in BLOCKS if not b.skip]


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.parametrize("block", RUNNABLE, ids=[b.id for b in RUNNABLE])
def test_python_block_runs_in_an_empty_folder(block, tmp_path):
    folder = tmp_path / "empty"
    folder.mkdir()
    script = tmp_path / "example.py"  # outside the folder it runs in
    script.write_text(block.code, encoding="utf-8")
    # the dfairpca this test imported (the checkout under test), not the repository as cwd
    env = {**os.environ, "PYTHONPATH": str(Path(dfairpca.__file__).parents[1]),
           "MPLBACKEND": "Agg"}
    r = subprocess.run([sys.executable, str(script)], cwd=folder, env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, f"{block.id} failed:\n{r.stderr[-3000:]}"


def _shown_nowhere(code: str) -> list[str]:
    """The statements of a block that are bare values (a name, an attribute, a subscript,
    a comparison: not a call, which may act): a notebook would show them, a script run as
    the page says drops them silently."""
    import ast

    return [ast.get_source_segment(code, node) or "" for node in ast.parse(code).body
            if isinstance(node, ast.Expr) and not isinstance(node.value, (ast.Call, ast.Constant, ast.Await))]


def test_no_block_leaves_a_value_for_a_notebook_to_show():
    """Every block prints what it shows when run as a script."""
    found = {b.id: _shown_nowhere(b.code) for b in BLOCKS}
    assert {block: lines for block, lines in found.items() if lines} == {}
    assert _shown_nowhere("m = f()\nm.statistics_kernel_\nprint(m)\nm.save('x')\n") == ["m.statistics_kernel_"]
