"""Run the parts of the report and write it (see :mod:`dfairpca.paper`)."""

from __future__ import annotations

import os
import platform
import sys
import time
from pathlib import Path
import importlib
import re

from ..errors import RunError
from ..base import __version__, cpu_count
from ._config import config
from ._report import Report, pyplot

# Deferred imports: package modules that load such libraries, or this module, at import and standard
# modules needed rarely or on one platform only are imported in the functions that use them, so that
# importing this module stays light.

#: the kind in dfairpca's marker of a report directory: only such a directory is replaced
KIND = "paper-report"


def _prose(module) -> str:
    """A part module's docstring without its first line, as Markdown (Sphinx roles dropped)."""
    text = module.__doc__.split("\n\n", 1)[1].strip()
    text = re.sub(r":(mod|class|func|attr|data):`~?([^`]+)`", r"`\2`", text)
    return text.replace("``", "`")


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _piece(name: str, cfg, task):
    """The numbers of one piece of a part (in this process or in a worker of :func:`_compute`)."""
    return _module(name).run(cfg, _log, task)


def _guarded_piece(job):
    """(key, result, None) of piece ``key`` = (part, task), or (key, None, its traceback)."""
    (part, task), cfg = job
    try:
        return (part, task), _piece(part, cfg, task), None
    except Exception:
        import traceback

        return (part, task), None, traceback.format_exc()


def _module(name: str):
    return importlib.import_module(f"{__package__}.{name}")


def _merge(results: list):
    """The pieces of one part as one result: lists concatenated, tuples element by element."""
    if isinstance(results[0], tuple):
        return tuple(sum((list(r[i]) for r in results), []) for i in range(len(results[0])))
    return sum((list(r) for r in results), [])


#: the parts by the time of their slowest pieces, longest first: with ``--jobs`` > 1 the
#: pieces start in this order, so that no long one starts last
LONGEST_FIRST = ("synthetic", "tradeoff", "tables", "faces")


def _compute(cfg, parts, jobs: int, out) -> tuple[dict, int]:
    """({part: its numbers}, pieces resumed); with ``jobs`` > 1 the parts' pieces run side
    by side.

    Each piece is saved as soon as it is done and taken from an earlier run's saved pieces
    when there is one (:mod:`._pieces`): a rerun after a crash or Ctrl-C resumes.
    """
    from . import _pieces

    order = sorted(parts, key=LONGEST_FIRST.index)
    pieces = [(p, t) for p in order for t in _module(p).tasks(cfg)]
    done = {(p, t): _pieces.load(out, cfg, p, t) for p, t in pieces}
    done = {key: r for key, r in done.items() if r is not None}
    if done:
        _log(f"resuming: {len(done)} of {len(pieces)} pieces from {_pieces.folder(out)}")
    todo = [key for key in pieces if key not in done]
    failed = []

    def finish(key, result, error):
        if error is None:
            done[key] = result
            part, task = key
            _pieces.save(out, cfg, part, task, result)
        else:  # a failed piece does not stop the others: they are kept for a rerun
            _log(f"{key[0]} {key[1]} failed:\n{error}")
            failed.append(key)

    if jobs <= 1 or len(todo) <= 1:
        for key in todo:
            finish(*_guarded_piece((key, cfg)))
    else:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor, as_completed

        # spawn: a forked child would inherit the parent's BLAS and dask thread state
        pool = ProcessPoolExecutor(min(jobs, len(todo)),
                                   mp_context=multiprocessing.get_context("spawn"))
        try:
            futures = {pool.submit(_guarded_piece, (key, cfg)): key for key in todo}
            for f in as_completed(futures):
                try:
                    finish(*f.result())
                except Exception as exc:  # a worker died (e.g. killed for memory)
                    finish(futures[f], None, repr(exc))
        finally:  # a Ctrl-C: start nothing more (the running pieces end with their workers)
            pool.shutdown(wait=False, cancel_futures=True)
    if failed:
        raise RunError(f"{len(failed)} of {len(pieces)} pieces failed (first: {failed[0]}; "
                           f"tracebacks above); the others are kept in {_pieces.folder(out)}: "
                           "rerun the same command to compute only what is missing")
    return {p: _merge([done[(q, t)] for q, t in pieces if q == p]) for p in parts}, len(pieces) - len(todo)


def run(out, quick: bool = False, parts=("tables", "synthetic", "tradeoff", "faces"),
        overwrite: bool = False, jobs: int = 1) -> dict:
    """Run ``parts`` at the sizes of :func:`._config.config` and write the report at ``out``.

    ``jobs`` > 1 runs the parts in that many processes side by side (their running times
    then include each other's load).

    The directory is written whole or not at all (:func:`dfairpca.io.atomic_directory`):
    an existing ``out`` is replaced only with ``overwrite`` and only if dfairpca wrote it.
    Finished pieces are kept in ``OUT.partial`` until then (:mod:`._pieces`): rerunning the
    same command after a crash or Ctrl-C skips them.
    """
    from ..io import atomic_directory
    from . import _pieces, faces, synthetic, tables, tradeoff

    cfg = config(quick)
    plt = pyplot()
    summary: dict = {"out": str(Path(out)), "quick": quick, "parts": list(parts)}
    start = time.perf_counter()
    with atomic_directory(out, KIND, overwrite=overwrite) as tmp:
        results, resumed = _compute(cfg, parts, jobs, out)
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
            body.add(tables.feature_space_markdown(rows))
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
        summary["resumed_pieces"] = resumed
        rep.add(_header(quick, parts, wall, summary.get("tables"), __version__, cpu_count(), jobs,
                        resumed))
        rep.parts += body.parts
        rep.write()
    _pieces.discard(out)
    # the result, on stdout (progress went to stderr)
    print(f"wrote {Path(out) / 'README.md'} and its CSV and PNG files ({wall / 60:.1f} min)", flush=True)
    return summary


def _header(quick, parts, wall, tallies, version, cpus, jobs, resumed=0) -> str:
    """Title, how the report was made, and the per-table agreement in one list."""
    cmd = "python -m dfairpca.paper" + (" --quick" if quick else "") + (f" --jobs {jobs}" if jobs > 1 else "")
    lines = [
        "# Kleindessner et al. (AISTATS 2023), Sec. 5 and App. C, rerun with dfairpca",
        f"Made by `{cmd}` ({', '.join(parts)}) with dfairpca {version} in **{wall / 60:.1f} min** "
        f"wall time on {cpus} CPU(s) ({platform.machine()}, Python {platform.python_version()}, "
        f"load average {os.getloadavg()[0]:.1f} at the end: the machine was shared)"
        + (f"; {resumed} finished pieces were taken from an interrupted earlier run, whose time "
           "is not included." if resumed else "."),
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
