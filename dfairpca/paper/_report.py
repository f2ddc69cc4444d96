"""The report's files: README.md sections, CSV files of raw numbers, PNG figures."""

from __future__ import annotations

import csv
from pathlib import Path

# Deferred imports: matplotlib (heavy or optional) is imported in the functions that use them, so
# that importing this module stays light.

#: resolution of the figures: small files (docs/paper/ keeps a full run's report) that still
#: read well on a screen
DPI = 80


class Report:
    """Collects the Markdown of the report and writes its CSV and PNG files into ``folder``."""

    def __init__(self, folder: Path):
        self.folder = Path(folder)
        self.parts: list[str] = []

    def add(self, markdown: str) -> None:
        """Append a block of Markdown (a blank line is put between blocks)."""
        self.parts.append(markdown.strip("\n"))

    def csv(self, name: str, rows: list[dict]) -> str:
        """Write ``rows`` (dicts with the same keys) as ``name``; return the file name."""
        with open(self.folder / name, "w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=list(rows[0]) if rows else [])
            w.writeheader()
            w.writerows(rows)
        return name

    def figure(self, fig, name: str, caption: str, paper: str) -> str:
        """Save ``fig`` as ``name`` and add it with our caption and what the paper's shows."""
        import matplotlib.pyplot as plt

        fig.savefig(self.folder / name, dpi=DPI, bbox_inches="tight")
        plt.close(fig)
        self.add(f"![{caption}]({name})\n\n*{caption}.* **The paper's:** {paper}")
        return name

    def write(self) -> Path:
        """Write README.md from the blocks added."""
        path = self.folder / "README.md"
        path.write_text("\n\n".join(self.parts) + "\n")
        return path


def cell(mean, std, digits: int) -> str:
    """``mean (std)`` at the paper's precision; an em dash for a missing value."""
    if mean is None:
        return "n/a"
    return f"{mean:.{digits}f} ({std:.{digits}f})"


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    """A Markdown table."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def pyplot():
    """matplotlib's pyplot on the Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt
