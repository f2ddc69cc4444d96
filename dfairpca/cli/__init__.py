"""The ``dfairpca`` command: make or ingest a CelebA store, fit, transform, erase, evaluate,
show, demo.

    dfairpca synth-celeba OUT.zarr [--n 202599] [--seed 0] [--size 80|HxW] [--color]
    dfairpca ingest-celeba CELEBA_DIR OUT.zarr [--size 80|HxW|full] [--color] [--scheduler ADDR]
    dfairpca fit STORE.zarr --attribute Eyeglasses -k 400 --out MODEL [--method fair]
    dfairpca fit DATA.zarr --array X --sensitive-array groups -k 10 --out MODEL [--json]
    dfairpca fit DATA.zarr --array X --sensitive-csv people.csv --sensitive-column sex,race ...
    dfairpca transform MODEL STORE.zarr --out OUT.zarr [--array X] [--reconstruct] [--json]
    dfairpca erase STORE.zarr --attribute Eyeglasses --out ERASED.zarr [--method leace] [--model M]
    dfairpca evaluate MODEL STORE.zarr [--attribute Eyeglasses] [--tolerance 0.1] [--baseline-k 400] [--json]
    dfairpca show MODEL STORE.zarr --out faces.png [--n 8]
    dfairpca demo [--n 202599] [--workdir DIR]   (default DIR: ~/.cache/dfairpca/demo)
    dfairpca info [--json]      (versions, BLAS, CPU, exact kernels: for a bug report)
    dfairpca --version

``fit``, ``transform`` and ``erase`` read the CelebA layout (``images``, ``attributes``) by default;
``--array`` names any Zarr array of shape (n, ...) instead: an array of STORE, else the
path of a Zarr array (a STORE that is itself an array needs no ``--array``).  The
protected attributes of ``fit`` and ``erase`` come from the CelebA attributes (``--attribute``, 0/1 or
CelebA's -1/1), from Zarr arrays (``--sensitive-array``, shape (n,) or (n, p), labels of
any type) and from columns of a CSV or Parquet file (``--sensitive-csv FILE
--sensitive-column COL,...``); row i labels row i of X, and the sources combine.  With
``--json`` stdout holds one line, a JSON object summarising the result, and everything
meant for people (summaries, progress bars, cluster lines) goes to stderr.

Commands that compute connect to ``--scheduler tcp://host:port`` or ``--scheduler-file``
when given; otherwise they start a LocalCluster sized to this machine (the library itself
never starts a cluster: it uses the active Client, the Dask convention).  They check every
parameter against the data's shape first, so that a mistake is reported at once and not
after a cluster was found or started.  Errors are one line on stderr.  The exit status says
which kind: 0 done; 1 the run failed (a missing or corrupt file, an existing output, lost
workers, a scheduler that does not answer); 2 the command line was refused before any work
(argparse's errors, an option or value the command cannot use); 130 Ctrl-C (``fit`` says how
many chunks its checkpoint holds); 143 SIGTERM, handled as Ctrl-C (the line names the
checkpoint that holds what was done).  Anything else is a bug: its traceback, exit status 1.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import logging
import sys
import warnings

from ..base import BLOCK_BYTES, __version__, int_at_least
from ..errors import DfairpcaWarning
from ._errors import (EXIT_FAILURE, EXIT_INTERRUPTED, EXIT_TERMINATED, EXIT_USAGE, ONE_LINE_ERRORS,
                      _malformed_file, exit_status, one_line, sigterm_as_interrupt)
from ._fit import (CLUSTER_TIMEOUT, FitJob, cmd_demo, cmd_fit, cmd_show,
                   cmd_transform)
from ._erase import add_erase_parser
from ._evaluate import cmd_evaluate
from ._inputs import TARGET_OPTIONS
from ._stores import cmd_ingest, cmd_synth
from .. import paper

# Deferred imports: package modules that load such libraries, or this module, at import are imported
# in the functions that use them, so that importing this module stays light.

__all__ = ["main", "build_parser", "exit_status", "one_line", "ONE_LINE_ERRORS", "EXIT_FAILURE", "EXIT_USAGE",
           "EXIT_INTERRUPTED", "EXIT_TERMINATED", "sigterm_as_interrupt"]


# ----------------------------------------------------------------------------- parser
class _UsageError(Exception):
    """A command line argparse refused: reported by :func:`main` like any other error."""

    def __init__(self, prog: str, message: str):
        super().__init__(f"{prog}: error: {message} (see {prog} --help)")


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Every option's help ends with its default; an option without one (None) says in
    its own words what happens instead."""

    def _get_help_string(self, action):
        if action.default is None or "(default: " in (action.help or ""):
            return action.help
        return super()._get_help_string(action)


class _Parser(argparse.ArgumentParser):
    """argparse without the usage block on errors: one line, like every other error."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", _HelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message):
        raise _UsageError(self.prog, message)


#: the argparse types of the integer options: the estimators' own rule (a refused value is
#: a usage error, exit status 2)
_COUNT = int_at_least(1).argument()
_SEED = int_at_least(0).argument()  # as numpy takes one
_FOLDS = int_at_least(2).argument()  # of a cross-validation
_POWER = int_at_least(0).argument(words=("auto",))  # --iterated-power


def _positive_number(text: str) -> float:
    """An argparse type: a number greater than zero."""
    try:
        value = float(text)
    except ValueError:
        value = None
    if value is None or not value > 0:
        raise argparse.ArgumentTypeError(f"must be a positive number; got {text!r}")
    return value


def _probability(text: str) -> float:
    """An argparse type: a number strictly between 0 and 1."""
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"must be a number between 0 and 1; got {text!r}")
    return value


def _face_size(full: bool):
    """An argparse type: a side (``80``), ``HxW`` (``218x178``) or, if ``full``, ``full``."""
    def parse(text: str):
        if full and text == "full":
            return text
        parts = text.lower().split("x")
        if len(parts) in (1, 2) and all(p.isdigit() and int(p) > 0 for p in parts):
            return int(parts[0]) if len(parts) == 1 else (int(parts[0]), int(parts[1]))
        raise argparse.ArgumentTypeError(
            f"must be a side (80), HEIGHTxWIDTH (218x178){' or full' if full else ''}; got {text!r}")

    parse.__name__ = "face size"
    return parse


def _add_face_options(p, size_help: str, default_size: int, full: bool):
    """--size, --color and --n-jobs of the commands that write a CelebA store."""
    p.add_argument("--size", type=_face_size(full), default=str(default_size), help=size_help)
    p.add_argument("--color", action="store_true",
                   help="RGB faces (n, H, W, 3) instead of grey (n, H, W)")
    p.add_argument("--n-jobs", type=_COUNT, metavar="N",
                   help="processes writing chunks, this one included (default: the usable CPUs)")


OVERWRITE_HELP = "replace what dfairpca wrote there before (never anything else)"
JSON_HELP = ("print one JSON object (the summary) on stdout, and send the human lines, progress "
             "and cluster messages to stderr")


STORAGE_HELP = ("options of the file system of s3:// (or any fsspec) URLs, as a JSON object, "
                "e.g. '{\"endpoint_url\": \"http://localhost:9000\", \"key\": \"...\", \"secret\": \"...\"}' "
                "(default: the environment's, e.g. AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, "
                "AWS_ENDPOINT_URL)")


def _add_storage(p):
    p.add_argument("--storage-options", metavar="JSON", help=STORAGE_HELP)


def _add_writes(p, group=None, fits: bool = False, json: bool = True):
    """The options of a command that writes a store or model: --json (where ``json``),
    --overwrite and --storage-options in ``group`` (default: p), then p's cluster options
    (``fits``: a fit's --timeout)."""
    g = p if group is None else group
    if json:
        g.add_argument("--json", action="store_true", help=JSON_HELP)
    g.add_argument("--overwrite", action="store_true", help=OVERWRITE_HELP)
    _add_storage(g)
    _add_cluster(p, fits=fits)


def _add_stage(p):
    p.add_argument("--stage-dir", metavar="DIR",
                   help="for a URL OUT: the local folder under which the store is staged before "
                        "its upload, kept if interrupted so that the same command resumes "
                        "(default: $DFAIRPCA_STAGE_DIR, else ~/.cache/dfairpca/stage; with "
                        "--scheduler the workers must see it)")


def _add_cluster(p, scheduler_help: str = "tcp://host:port of a Dask scheduler (default: start "
                                          "a local cluster sized to this machine)",
                 fits: bool = False):
    g = p.add_argument_group("cluster")
    g.add_argument("--scheduler", metavar="ADDRESS", help=scheduler_help)
    g.add_argument("--scheduler-file", metavar="PATH",
                   help="scheduler file written by `dask scheduler --scheduler-file` "
                        "(default: none, see --scheduler)")
    during = ("; and, once every worker has left during the fit, for new ones (then the fit "
              "stops, its checkpoint kept for --resume); and, on a cluster, for an answer "
              "from a remote store (s3://) the workers read") if fits else ""
    g.add_argument("--timeout", type=_positive_number, default=CLUSTER_TIMEOUT, metavar="SECONDS",
                   help="how long to wait for the scheduler to answer, then for a first "
                        f"worker{during}")


def _add_sensitive(p, title: str, use: str = "as protected attributes"):
    """The protected-attribute options that ``fit``, ``erase`` and ``evaluate`` share, as
    the group ``title``: CelebA attributes, Zarr arrays, columns of a CSV or Parquet file
    (``use``: what the columns are for, in --sensitive-column's help)."""
    g = p.add_argument_group(title)
    g.add_argument("--attribute", action="append", default=[], metavar="NAME",
                   help="a CelebA attribute of STORE (0/1 or -1/1), e.g. Eyeglasses; "
                        "repeatable (default: none)")
    g.add_argument("--sensitive-array", action="append", default=[], metavar="ARRAY",
                   help="labels of any type from a Zarr array: an array of STORE or a path; "
                        "(n,) is one attribute, (n, p) p attributes; repeatable (default: none)")
    g.add_argument("--sensitive-csv", metavar="FILE",
                   help="a CSV file, or Parquet by its extension .parquet/.pq (needs pyarrow), "
                        "whose row i labels row i of X (default: none)")
    g.add_argument("--sensitive-column", action="append", default=[], metavar="COL[,COL...]",
                   help=f"columns of --sensitive-csv to use {use}; repeatable (default: none)")
    return g


def _add_array(p):
    p.add_argument("--array", metavar="ARRAY",
                   help="the data X: an array of STORE (a path inside it, e.g. X or data/X) or "
                        "the path of a Zarr array, of shape (n, ...) (default: the CelebA "
                        "layout's images)")
    p.add_argument("--missing-chunks", choices=["error", "fill"], default=FitJob.missing_chunks,
                   help="a chunk absent from the store of X or of a label array: an error, or "
                        "(fill) the array's fill value, for stores whose writer leaves out "
                        "constant chunks on purpose (zarr-python does by default); CelebA "
                        "attributes are always read whole")


def build_parser() -> argparse.ArgumentParser:
    from ..celeba.schema import DEFAULT_FACES, DEFAULT_SIZE
    from ..metrics import MAX_PROBE_ROWS

    ap = _Parser(prog="dfairpca", description="PCA and fair PCA on Zarr stores, on a Dask "
                 "cluster; run dfairpca COMMAND --help for a command's options")
    ap.add_argument("--version", action="version", version=f"dfairpca {__version__}",
                    help="print dfairpca's version and exit")
    sub = ap.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("synth-celeba", help="write a synthetic CelebA-shaped Zarr store")
    p.add_argument("out", metavar="OUT", help="the Zarr store to write (a directory)")
    p.add_argument("--n", type=_COUNT, default=202_599, help="number of faces")
    p.add_argument("--seed", type=_SEED, default=0,
                   help="random seed (the same seed, the same faces)")
    _add_face_options(p, "faces are SIZE x SIZE pixels, or HxW (218x178: CelebA's aligned faces)",
                      DEFAULT_SIZE, full=False)
    p.add_argument("--overwrite", action="store_true", help=OVERWRITE_HELP)
    _add_storage(p)
    _add_stage(p)
    p.set_defaults(func=cmd_synth)

    p = sub.add_parser("ingest-celeba", help="convert the official CelebA folder to a Zarr store")
    p.add_argument("celeba_dir", metavar="CELEBA_DIR",
                   help="the CelebA download, as published (Anno/, Img/img_align_celeba/, Eval/) "
                        "or flat (list_attr_celeba.txt, img_align_celeba/, list_eval_partition.txt)")
    p.add_argument("out", metavar="OUT", help="the Zarr store to write (a directory)")
    _add_face_options(p, "faces are centre-cropped and resized to SIZE x SIZE pixels, or HxW; "
                      "full: the images' own size", DEFAULT_SIZE, full=True)
    p.add_argument("--overwrite", action="store_true", help=OVERWRITE_HELP)
    _add_storage(p)
    _add_stage(p)
    _add_cluster(p, "tcp://host:port of a Dask scheduler whose workers decode the chunks (they "
                    "must see CELEBA_DIR and OUT at the same paths) (default: none: --n-jobs "
                    "local processes)")
    p.set_defaults(func=cmd_ingest)

    p = sub.add_parser("fit",
                       help="fit PCA / fair PCA on a Zarr store (CelebA layout or any array)")
    p.add_argument("store", metavar="STORE",
                   help="a Zarr store: a group (CelebA layout unless --array) or a bare array")
    _add_array(p)
    p.add_argument("-k", "--k", type=_COUNT, required=True,
                   help="number of components (required)")
    p.add_argument("--out", required=True, help="model directory to write (required)")
    p.add_argument("--method", choices=["pca", "fair", "fair-s"], default=FitJob.method,
                   help="pca: standard PCA; fair: fair PCA (equal group means); fair-s: fair PCA "
                        "that also (approximately) equalises the group covariances")
    _add_sensitive(p, "protected attributes (fair methods; the sources combine)")
    g = p.add_argument_group("constraint")
    g.add_argument("--constraint", choices=["demographic_parity", "equal_opportunity"],
                   default=FitJob.constraint,
                   help="equal_opportunity fits on the rows whose task label is 1 and needs "
                        "one of --target, --target-array, --target-column")
    for flag, metavar, what in zip(TARGET_OPTIONS, ("NAME", "ARRAY", "COL"), (
            "a CelebA attribute of STORE", "a 0/1 (or -1/1, bool) Zarr array of STORE or a path",
            "a 0/1 column of --target-csv")):
        g.add_argument(flag, metavar=metavar,
                       help=f"task label for equal opportunity: {what} (default: none)")
    g.add_argument("--target-csv", metavar="FILE",
                   help="the CSV/Parquet file of --target-column (default: the --sensitive-csv "
                        "file)")
    g.add_argument("--tradeoff", type=float, default=FitJob.tradeoff,
                   help="λ in [0, 1]: also output the standard PCA components scaled by λ")
    g.add_argument("--equalize", type=float, default=FitJob.equalize,
                   help="fair-s: the fraction f of Fair PCA-S (f)")
    g = p.add_argument_group("sample weights (frequency weights: a row of weight w counts w times)")
    g.add_argument("--sample-weight-array", metavar="ARRAY",
                   help="the rows' weights (finite, >= 0) from a Zarr array of STORE or a path, "
                        "(n,) (default: none)")
    g.add_argument("--sample-weight-column", metavar="COL",
                   help="the rows' weights from column COL of --sample-weight-csv (default: none)")
    g.add_argument("--sample-weight-csv", metavar="FILE",
                   help="the CSV/Parquet file of --sample-weight-column (default: the "
                        "--sensitive-csv file)")
    g = p.add_argument_group("solver")
    g.add_argument("--svd-solver", choices=["auto", "full", "randomized"], default=FitJob.svd_solver,
                   help="full: the exact one-pass fit (d x d statistics); randomized: block Krylov "
                        "passes over X, memory d x (k + p), for large d or small k; auto: chosen "
                        "by a memory and cost model (the summary says which ran)")
    g.add_argument("--compute-dtype", choices=["auto", "float32", "float64", "exact"],
                   default=FitJob.compute_dtype,
                   help="the dtype of the chunk products: exact sums integer input (uint8 "
                        "pixels) without rounding, bit-identical whatever the chunking; auto: "
                        "float32 for 8- and 16-bit input unless an exact 8-bit kernel passed "
                        "its self-test and is not slower here (timed; DFAIRPCA_AUTO_KERNEL="
                        "exact|float32 forces it), float64 otherwise (the summary says which ran)")
    g.add_argument("--n-oversamples", type=_COUNT, default=FitJob.n_oversamples,
                   metavar="P", help="randomized: the blocks have k + P columns")
    g.add_argument("--iterated-power", type=_POWER, default=FitJob.iterated_power, metavar="Q",
                   help="randomized: at most Q + 2 passes over X; auto stops once the captured "
                        "variance is within 1e-4 of the optimum, by its Ritz residuals")
    g.add_argument("--random-state", type=int, default=FitJob.random_state, metavar="SEED",
                   help="randomized: the seed of the start block")
    g = p.add_argument_group("output and the pass")
    g.add_argument("--json", action="store_true", help=JSON_HELP)
    g.add_argument("--statistics", action="store_true",
                   help="also save the d x d statistics with the model")
    g.add_argument("--checkpoint", metavar="DIR",
                   help="where the pass saves its running statistics, a randomized fit its "
                        "state after every pass (default: OUT.checkpoint)")
    g.add_argument("--resume", action="store_true",
                   help="continue an interrupted fit from its checkpoint, skipping finished "
                        "chunks (randomized: passes)")
    g.add_argument("--rows-per-chunk", type=_COUNT,
                   help="rows per task of the pass (default: store chunks merged to "
                        f"~{BLOCK_BYTES >> 20} MiB)")
    _add_writes(p, g, fits=True, json=False)  # its --json leads the group
    p.set_defaults(func=cmd_fit)

    p = sub.add_parser("transform", help="project a store lazily and write the result to Zarr")
    p.add_argument("model", metavar="MODEL", help="a model written by dfairpca fit")
    p.add_argument("store", metavar="STORE",
                   help="a Zarr store: a group (CelebA layout unless --array) or a bare array")
    _add_array(p)
    p.add_argument("--out", required=True,
                   help="the Zarr store to write: the array 'representation' (n, k), or with "
                        "--reconstruct X's reconstruction under X's name (required)")
    p.add_argument("--reconstruct", action="store_true",
                   help="write the reconstruction in X's space and dtype (images for CelebA)")
    _add_writes(p)
    p.set_defaults(func=cmd_transform)

    add_erase_parser(sub, _add_array, _add_sensitive, _add_writes)
    p = sub.add_parser("evaluate", help="how fair a model's representation is on a store's rows "
                       "(typically held out): group-mean gap, its bounds and a verdict against a "
                       "tolerance, a test of equal means, a linear probe; the attributes are the "
                       "model's when none is named")
    p.add_argument("model", metavar="MODEL", help="a model written by dfairpca fit")
    p.add_argument("store", metavar="STORE",
                   help="a Zarr store: a group (CelebA layout unless --array) or a bare array")
    _add_array(p)
    _add_sensitive(p, "protected attributes (the sources combine; one report line each)",
                   use="as the attributes to evaluate")
    p.add_argument("--baseline-k", type=_COUNT, metavar="K",
                   help="also report standard PCA with K components, fitted on STORE's rows, one "
                        "more pass (default: no baseline)")
    p.add_argument("--cv", type=_FOLDS, default=5, metavar="FOLDS",
                   help="folds of the linear probe's cross-validation")
    p.add_argument("--random-state", type=_SEED, default=0, metavar="SEED",
                   help=f"seed of the probe's sample (at most {MAX_PROBE_ROWS:,} rows) and folds")
    p.add_argument("--tolerance", type=_positive_number, default=0.1, metavar="SD",
                   help="the largest group-mean gap you accept, in standard deviations of a "
                        "component: the verdict is fair when the gap's upper bound is below it")
    p.add_argument("--alpha", type=_probability, default=0.05, metavar="ALPHA",
                   help="1 minus the confidence of the gap's bounds")
    p.add_argument("--json", action="store_true", help=JSON_HELP)
    _add_storage(p)
    _add_cluster(p)
    p.set_defaults(func=cmd_evaluate, target_column=None)

    p = sub.add_parser("show", help="picture of original and fair faces (paper's Figure 5)")
    p.add_argument("model", metavar="MODEL",
                   help="a model written by dfairpca fit on CelebA images")
    p.add_argument("store", metavar="STORE", help="a CelebA-layout store of the model's image size")
    p.add_argument("--out", default="faces.png", help="the PNG file to write")
    p.add_argument("--n", type=_COUNT, default=DEFAULT_FACES, help="faces per row")
    p.add_argument("--overwrite", action="store_true", help="replace a picture dfairpca drew")
    p.set_defaults(func=cmd_show)

    p = sub.add_parser("info", help="versions, BLAS, CPU and exact kernels of this machine, for a bug report")
    p.add_argument("--json", action="store_true", help="print the report as one JSON object")
    p.set_defaults(func=cmd_info)

    p = sub.add_parser("demo", help="the main job: synth-celeba -> fit -> show")
    p.add_argument("--n", type=_COUNT, default=202_599, help="number of synthetic faces")
    p.add_argument("-k", "--k", type=_COUNT, default=400, help="number of components")
    p.add_argument("--attribute", default="Eyeglasses", help="the protected CelebA attribute")
    p.add_argument("--workdir", default=None,
                   help="folder for the store, the model and faces.png (default: the user's "
                        "cache folder, $XDG_CACHE_HOME/dfairpca/demo or ~/.cache/dfairpca/demo)")
    _add_cluster(p, fits=True)
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("paper", help="rerun the paper's tables and figures into a report (DIR/README.md)")
    paper.add_arguments(p)
    p.set_defaults(func=paper.main)
    return ap


def cmd_info(args) -> dict | None:
    """``dfairpca info``: :func:`dfairpca.show_versions`'s report (its dict with --json)."""
    from .. import show_versions

    return show_versions(as_dict=True) if args.json else show_versions()


@contextlib.contextmanager
def _showing_log():
    """The package's INFO messages (the local cluster and its dashboard, a wait for a
    worker) on stderr as "dfairpca: ..." lines while a command runs; the logger's level
    and handlers are restored after."""
    logger = logging.getLogger("dfairpca")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("dfairpca: %(message)s"))
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    formatwarning = warnings.formatwarning
    ours = functools.partial(_one_line_warning, formatwarning)
    warnings.formatwarning = ours  # a caught warning (pytest.warns) keeps its record
    try:
        yield
    finally:
        if warnings.formatwarning is ours:  # else replaced since: leave it be
            warnings.formatwarning = formatwarning
        logger.removeHandler(handler)
        logger.setLevel(level)


def _one_line_warning(others, message, category, filename, lineno, line=None) -> str:
    """dfairpca's own warnings as one "dfairpca: warning: ..." line: the file and source
    line Python adds point into the package and mean nothing to a command's user; the
    others as ``others`` (the format in place when the command began) writes them."""
    if issubclass(category, DfairpcaWarning):
        return f"dfairpca: warning: {message}\n"
    return others(message, category, filename, lineno, line)


def main(argv=None) -> int:
    """Run one command; return its exit status: 0, :data:`EXIT_FAILURE` (1) when the run
    failed, :data:`EXIT_USAGE` (2) for a command line refused before any work,
    :data:`EXIT_INTERRUPTED` (130) on Ctrl-C, :data:`EXIT_TERMINATED` (143) on SIGTERM
    (see :func:`exit_status`).

    With ``--json`` the command's summary is printed on stdout as one JSON line, and all
    else that would go to stdout (human summaries, progress bars) goes to stderr.
    """
    try:
        args = build_parser().parse_args(argv)
    except _UsageError as exc:
        print(exc, file=sys.stderr)
        return EXIT_USAGE
    except SystemExit as exc:  # --help, --version: printed, and done
        return exc.code if isinstance(exc.code, int) else 0
    as_json = getattr(args, "json", False)
    stdout = sys.stdout
    terminated: list[int] = []
    try:
        with sigterm_as_interrupt() as terminated, _showing_log(), \
                contextlib.redirect_stdout(sys.stderr) if as_json else contextlib.nullcontext():
            summary = args.func(args)
    except ONE_LINE_ERRORS as exc:
        msg = one_line(exc)
        io = sys.modules.get("dfairpca.io")  # imported (here, not before: 0.2 s) if it raised
        if (io is not None and isinstance(exc, io.MissingChunkError)
                and getattr(args, "missing_chunks", None) == "error"):
            msg = f"{msg} (here: --missing-chunks fill, for X and label arrays)"
        print(f"dfairpca {args.command}: error: {msg}", file=sys.stderr)
        return exit_status(exc)
    except Exception as exc:
        if not _malformed_file(exc):
            raise  # a bug: its traceback
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        print(f"dfairpca {args.command}: error: a Zarr store or JSON file it read is malformed "
              f"({type(exc).__name__}: {first}); check the stores and files given, or rewrite "
              "them", file=sys.stderr)
        return EXIT_FAILURE
    except KeyboardInterrupt as exc:
        # a checkpointed pass's PassInterrupted (its module imported if it raised one: not
        # before, it costs an ingest's start 0.4 s); else outside a pass, or a second Ctrl-C
        # while the cluster closes
        checkpoint = sys.modules.get("dfairpca.engine.checkpoint")
        passed = exc if checkpoint is not None and isinstance(exc, checkpoint.PassInterrupted) \
            else None
        resume = "; rerun with --resume" if args.command == "fit" and passed else ""
        if terminated:  # a log read later, not a person at the terminal: where it is kept
            kept = (f" after {passed.progress}, kept in the checkpoint {str(passed.checkpoint)!r}"
                    if passed else "; nothing it was writing was kept")
            print(f"dfairpca {args.command}: terminated (SIGTERM){kept}{resume}", file=sys.stderr)
            return EXIT_TERMINATED
        print(f"dfairpca {args.command}: interrupted" + (f" after {passed.progress}" if passed else "")
              + resume, file=sys.stderr)
        return EXIT_INTERRUPTED
    if as_json:
        print(json.dumps(summary, allow_nan=False), file=stdout, flush=True)
    return 0
