"""The paper's experiments, rerun into one report (Kleindessner et al., AISTATS 2023, Sec. 5, App. C).

    python -m dfairpca.paper [--quick] [--out DIR] [--only PART ...] [--jobs N] [--overwrite]
    dfairpca paper ...                                  (the same, from the CLI)

writes ``DIR/README.md`` (each table beside the paper's numbers, each figure as a PNG next to a
line saying what the paper's figure shows) and the raw numbers as CSV files:

* :mod:`.tables`: Tables 1-3 (Adult, German Credit, COMPAS on the Lee et al. splits), every
  column, for our five methods;
* :mod:`.synthetic`: Figures 2, 3 and 7 (Lee et al.'s mixture of two Gaussians) against INLP
  (:mod:`.inlp`);
* :mod:`.tradeoff`: Figures 4, 8 and 9 (accuracy vs ΔDP / ΔEO curves with the λ knob of
  Sec. 3.1 against fairlearn's ExponentiatedGradient, and running times);
* :mod:`.faces`: Figures 5 and 10-15 (fair PCA erasing six attributes of synthetic CelebA faces).

``--quick`` runs every part small (a few minutes); the deterministic columns of Tables 1-3
(%Var, MMD²) use all ten splits in both modes, since only the ten-split mean and std can be
compared with the paper.  This module imports nothing heavy, so the CLI can build its parser.
"""

from __future__ import annotations

import argparse
from ..base import int_at_least
from ..errors import InvalidInputError

# Deferred imports: package modules that load such libraries, or this module, at import are imported
# in the functions that use them, so that importing this module stays light.

__all__ = ["PARTS", "PROG", "add_arguments", "build_parser", "main"]

#: how ``python -m dfairpca.paper`` names itself in its usage and its errors
PROG = "python -m dfairpca.paper"

#: the report's parts, in the order they are run and written
PARTS = ("tables", "synthetic", "tradeoff", "faces")


def add_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The options of ``python -m dfairpca.paper`` and ``dfairpca paper``."""
    parser.add_argument("--quick", action="store_true",
                        help="few splits, small d and n: minutes instead of about an hour")
    parser.add_argument("--out", default="paper-report",
                        help="the report directory to write; finished pieces wait in OUT.partial "
                             "until it is written, and rerunning the same command after a crash "
                             "or Ctrl-C skips them (default: paper-report)")
    parser.add_argument("--only", nargs="+", choices=PARTS, metavar="PART",
                        help=f"run only these parts ({', '.join(PARTS)}) (default: all)")
    parser.add_argument("--jobs", type=int_at_least(1).argument(), default=1,
                        help="run the parts side by side in this many processes ")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace a report dfairpca wrote at --out (nothing else is replaced)")
    parser.add_argument("--json", action="store_true",
                        help="print the summary (the report's path, parts, times, agreement "
                             "with the paper's tables) as one JSON line on stdout; everything "
                             "else goes to stderr")
    return parser


def build_parser() -> argparse.ArgumentParser:
    """The parser of ``python -m dfairpca.paper``."""
    return add_arguments(argparse.ArgumentParser(
        prog=PROG, description=__doc__.splitlines()[0]))


def main(argv=None) -> dict:
    """Run the report; ``argv`` is a list of arguments or the CLI's parsed namespace.

    Returns a summary: the report's path, the parts run, wall time and per-table agreement.
    """
    args = argv if isinstance(argv, argparse.Namespace) else build_parser().parse_args(argv)
    from ._run import run

    if args.jobs < 1:
        raise InvalidInputError(f"--jobs must be at least 1; got {args.jobs}")
    return run(out=args.out, quick=args.quick, parts=args.only or PARTS, overwrite=args.overwrite,
               jobs=args.jobs)
