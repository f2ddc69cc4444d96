"""Run the parts of the report and write it (see :mod:`dfairpca.paper`)."""

from __future__ import annotations

import os
import platform
import sys
import time
from pathlib import Path

#: the kind in dfairpca's marker of a report directory: only such a directory is replaced
KIND = "paper-report"


def _prose(module) -> str:
    """A part module's docstring without its first line, as Markdown (Sphinx roles dropped)."""
    import re

    text = module.__doc__.split("\n\n", 1)[1].strip()
    text = re.sub(r":(mod|class|func|attr|data):`~?([^`]+)`", r"`\2`", text)
    return text.replace("``", "`")


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _piece(name: str, cfg, task):
    """The numbers of one piece of a part (in this process or in a worker of :func:`_compute`)."""
    return _module(name).run(cfg, _log, task)


def _module(name: str):
    import importlib

    return importlib.import_module(f"{__package__}.{name}")


def _merge(results: list):
    """The pieces of one part as one result: lists concatenated, tuples element by element."""
    if isinstance(results[0], tuple):
        return tuple(sum((list(r[i]) for r in results), []) for i in range(len(results[0])))
    return sum((list(r) for r in results), [])


def _compute(cfg, parts, jobs: int) -> dict:
    """{part: its numbers}; with ``jobs`` > 1 the parts' pieces run side by side."""
    if jobs <= 1:
        return {p: _module(p).run(cfg, _log) for p in parts}
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    # the synthetic sweep's largest d first: its single fits are the longest pieces
    order = sorted(parts, key=lambda p: p != "synthetic")
    pieces = [(p, t) for p in order for t in _module(p).tasks(cfg)]
    # spawn: a forked child would inherit the parent's BLAS and dask thread state
    with ProcessPoolExecutor(min(jobs, len(pieces)), mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = [(p, pool.submit(_piece, p, cfg, t)) for p, t in pieces]
        done = [(p, f.result()) for p, f in futures]
    return {p: _merge([r for q, r in done if q == p]) for p in parts}


def run(out, quick: bool = False, parts=("tables", "synthetic", "tradeoff", "faces"),
        overwrite: bool = False, jobs: int = 1) -> dict:
    """Run ``parts`` at the sizes of :func:`._config.config` and write the report at ``out``.

    ``jobs`` > 1 runs the parts in that many processes side by side (their running times
    then include each other's load).

    The directory is written whole or not at all (:func:`dfairpca.io.atomic_directory`):
    an existing ``out`` is replaced only with ``overwrite`` and only if dfairpca wrote it.
    """
    from .._version import __version__
    from .._system import cpu_count
    from .._writes import atomic_directory
    from . import faces, synthetic, tables, tradeoff
    from ._config import config
    from ._report import Report, pyplot

    cfg = config(quick)
    plt = pyplot()
    summary: dict = {"out": str(Path(out)), "quick": quick, "parts": list(parts)}
    start = time.perf_counter()
    with atomic_directory(out, KIND, overwrite=overwrite) as tmp:
        results = _compute(cfg, parts, jobs)
        rep = Report(tmp)
        body = Report(tmp)  # the parts, after the header that needs their results
        if "tables" in parts:
            rows = results["tables"]
            summ = tables.summarize(rows)
            cells = tables.agreement(summ)
            body.add("## Tables 1-3: Adult, German Credit, COMPAS (Lee et al. splits)\n\n"
                     + _prose(tables)
                     + "\n\nRaw numbers: `tables_splits.csv` (every split), `tables_agreement.csv` "
                       "(every cell beside the paper's).")
            for dataset in tables.DATASETS:
                body.add(tables.markdown(dataset, summ, cells))
            body.csv("tables_splits.csv", rows)
            body.csv("tables_agreement.csv", cells)
            summary["tables"] = {ds: tables.tally(cells, ds) for ds in tables.DATASETS}
        if "synthetic" in parts:
            by_d, by_k = results["synthetic"]
            body.add("## Figures 2, 3 and 7: synthetic mixture of two Gaussians\n\n"
                     + _prose(synthetic))
            synthetic.figures(body, by_d, by_k, plt)
            body.add(synthetic.markdown(by_d))
            body.csv("synthetic_by_d.csv", by_d)
            body.csv("synthetic_by_k.csv", by_k)
        if "tradeoff" in parts:
            curves, times = results["tradeoff"]
            times = tradeoff.times_of_curves(curves, cfg) + times
            body.add("## Figures 4, 8 and 9: the λ knob against ExponentiatedGradient\n\n"
                     + _prose(tradeoff))
            tradeoff.figures(body, curves, times, cfg, plt)
            body.add(tradeoff.markdown(curves))
            body.csv("tradeoff_curves.csv", curves)
            body.csv("tradeoff_times.csv", times)
        if "faces" in parts:
            rows, pictures = results["faces"]
            body.add("## Figures 5 and 10-15: fair PCA on (synthetic) CelebA faces\n\n"
                     + _prose(faces))
            faces.figures(body, pictures, plt)
            body.csv("faces.csv", rows)
        wall = time.perf_counter() - start
        summary["wall_s"] = round(wall, 1)
        rep.add(_header(quick, parts, wall, summary.get("tables"), __version__, cpu_count(), jobs))
        rep.parts += body.parts
        rep.write()
    _log(f"wrote {Path(out) / 'README.md'} and its CSV and PNG files ({wall / 60:.1f} min)")
    return summary


def _header(quick, parts, wall, tallies, version, cpus, jobs) -> str:
    """Title, how the report was made, and the per-table agreement in one list."""
    cmd = "python -m dfairpca.paper" + (" --quick" if quick else "") + (f" --jobs {jobs}" if jobs > 1 else "")
    lines = [
        "# Kleindessner et al. (AISTATS 2023), Sec. 5 and App. C, rerun with dfairpca",
        f"Made by `{cmd}` ({', '.join(parts)}) with dfairpca {version} in **{wall / 60:.1f} min** "
        f"wall time on {cpus} CPU(s) ({platform.machine()}, Python {platform.python_version()}, "
        f"load average {os.getloadavg()[0]:.1f} at the end: the machine was shared).",
    ]
    if quick:
        lines.append("**Quick mode**: small sizes; the classifier columns, curves and figures are "
                     "not comparable with the paper's (the %Var and MMD² columns are: they use all "
                     "ten splits in both modes).")
    if tallies:
        lines.append("Agreement with the paper's Tables 1-3:\n\n" + "\n".join(
            f"- Table {n}: %Var and MMD² {t['deterministic'][0]}/{t['deterministic'][1]} cells "
            f"equal to the printed digits; classifier columns {t['stochastic'][0]}/"
            f"{t['stochastic'][1]} means within the paper's std"
            for n, t in zip((1, 2, 3), tallies.values())))
    return "\n\n".join(lines)
