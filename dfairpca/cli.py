"""The ``dfairpca`` command: make or ingest a CelebA store, fit, transform, show, demo.

    dfairpca synth-celeba OUT.zarr [--n 202599] [--seed 0]
    dfairpca ingest-celeba CELEBA_DIR OUT.zarr [--size 80]
    dfairpca fit STORE.zarr --attribute Eyeglasses -k 400 --out MODEL [--method fair]
    dfairpca transform MODEL STORE.zarr --out OUT.zarr [--reconstruct]
    dfairpca show MODEL STORE.zarr --out faces.png [--n 8]
    dfairpca demo [--n 202599] [--workdir dfairpca-demo]

Commands that compute connect to ``--scheduler tcp://host:port`` or ``--scheduler-file``
when given; otherwise they start a LocalCluster sized to this machine (the library itself
never starts a cluster: it uses the active Client, the Dask convention).  They check every
parameter against the data's shape first, so that a mistake is reported at once and not
after a cluster was found or started.  Errors are one line on stderr and exit status 2;
Ctrl-C is one line and exit status 130 (``fit`` says how many chunks its checkpoint holds).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

__all__ = ["main"]


class CLIError(Exception):
    """An error the command reports in one line (exit status 2)."""


#: exit status of a command stopped by Ctrl-C (128 + SIGINT), as shells report it
EXIT_INTERRUPTED = 130


# ----------------------------------------------------------------------------- helpers
def _client(args):
    from .cluster import connect

    return connect(args.scheduler, args.scheduler_file, timeout=args.timeout)


def _check_out(path: Path, kind: str, overwrite: bool, protect: dict | None = None):
    """Refuse, before any work or cluster, an output dfairpca may not write.

    See :func:`dfairpca.io.check_target`: a missing path, an empty directory, or with
    ``--overwrite`` dfairpca's own ``kind``; never the inputs (``protect``) or a folder
    holding them; the folder must be writable.
    """
    from .io import check_target

    check_target(path, kind, overwrite=overwrite, protect=protect)


def _images(store, rows_per_chunk=None):
    from .celeba import open_celeba
    from .io import from_zarr

    images, _, names = open_celeba(store)
    return from_zarr(store, "images", rows_per_chunk=rows_per_chunk), names


def _attributes(store, names):
    """The named 0/1 attribute columns of the store (CelebA's own -1/1 read as 0/1).

    Any other value would silently become a third group (or a wrong "with"/"without"
    count), so it is refused with the values found.
    """
    import pandas as pd

    from .celeba import attribute_column

    columns = {}
    for n in names:
        col = attribute_column(store, n)
        values = np.unique(col)
        if set(values.tolist()) <= {-1, 1}:
            col = (col == 1).astype(np.int8)
        elif not set(values.tolist()) <= {0, 1}:
            shown = ", ".join(str(int(v)) for v in values[:10]) + (", ..." if len(values) > 10 else "")
            raise CLIError(
                f"attribute {n!r} of {store} holds the values {shown}; a CelebA attribute must "
                "be 0/1 (or CelebA's -1/1): fix the store, e.g. re-ingest it with "
                "dfairpca ingest-celeba"
            )
        columns[n] = col
    return pd.DataFrame(columns)


def _estimator(args):
    from . import FairPCA, PCA

    # a progress bar redraws itself many times a second: only on a terminal, never into the
    # log file of a batch job
    progress = sys.stdout.isatty()
    if args.method == "pca":
        return PCA(args.k, progress=progress)
    eq = args.equalize if args.method == "fair-s" else None
    return FairPCA(
        args.k, constraint=args.constraint, tradeoff=args.tradeoff,
        equalize_covariance=eq, progress=progress,
    )


# ----------------------------------------------------------------------------- commands
def cmd_synth(args):
    from .celeba import synth_celeba

    out = Path(args.out)
    _check_out(out, "store", args.overwrite)
    t = time.perf_counter()
    synth_celeba(out, n=args.n, seed=args.seed, size=args.size, overwrite=args.overwrite)
    print(f"wrote {args.n:,} synthetic faces to {out} in {time.perf_counter() - t:.1f} s")


def cmd_ingest(args):
    from .celeba import ingest_celeba

    out = Path(args.out)
    _check_out(out, "store", args.overwrite, {"the CelebA folder": args.celeba_dir})
    t = time.perf_counter()
    ingest_celeba(args.celeba_dir, out, size=args.size, overwrite=args.overwrite)
    print(f"ingested {args.celeba_dir} into {out} in {time.perf_counter() - t:.1f} s")


def cmd_fit(args):
    from .io import read_marker, remove_directory

    out = Path(args.out)
    ckpt = Path(args.checkpoint) if args.checkpoint else out.with_name(out.name + ".checkpoint")
    _check_out(out, "model", args.overwrite, {"the input store": args.store, "the checkpoint": ckpt})
    # the checkpoint is replaced after every segment: only a dfairpca checkpoint may be there
    _check_out(ckpt, "checkpoint", True, {"the input store": args.store, "the model": out})
    if read_marker(ckpt) is not None and not args.resume and not args.overwrite:
        raise CLIError(
            f"an interrupted fit left its checkpoint at {ckpt}; pass --resume to continue "
            "it or --overwrite to start over"
        )
    X, names = _images(args.store, args.rows_per_chunk)
    if args.method != "pca" and not args.attribute:
        raise CLIError("name the protected attribute(s) with --attribute NAME (e.g. Eyeglasses)")
    groups = _attributes(args.store, args.attribute) if args.method != "pca" else None
    y = None
    if args.constraint == "equal_opportunity":
        if not args.target:
            raise CLIError("--constraint equal_opportunity needs --target NAME (the task label)")
        y = _attributes(args.store, [args.target])[args.target].to_numpy()
    est = _estimator(args)
    # every parameter error now, before a cluster is found or started
    if groups is None:
        est.validate_fit(X, y)
    else:
        est.validate_fit(X, y, sensitive_features=groups)
    n, d = X.shape[0], int(np.prod(X.shape[1:]))
    print(f"n = {n:,} images, d = {d:,} features", end="")
    if groups is not None:
        desc = ", ".join(
            f"{c}: {int((groups[c] == 1).sum()):,} with / {int((groups[c] == 0).sum()):,} without"
            for c in groups
        )
        print(f"; groups {desc}")
    else:
        print()
    if not args.resume and read_marker(ckpt) is not None:
        remove_directory(ckpt, "checkpoint")  # --overwrite: start over (checked above)
    with _client(args):
        t = time.perf_counter()
        if groups is None:
            est.fit(X, checkpoint=ckpt, keep_checkpoint=True)
        else:
            est.fit(X, y, sensitive_features=groups, checkpoint=ckpt, keep_checkpoint=True)
        dt = time.perf_counter() - t
    est.save(out, statistics=args.statistics, overwrite=args.overwrite)
    remove_directory(ckpt, "checkpoint")
    kept = 100 * est.explained_variance_ratio_.sum()
    cert = getattr(est, "fairness_violation_", None)  # share of any group's mean gap kept
    print(f"{type(est).__name__} k = {est.n_components_}: {kept:.2f}% of the variance kept; "
          + ("" if cert is None else f"fairness certified: group-mean gap kept {cert:.1e}; ")
          + f"fit in {dt:.1f} s; model written to {out}")
    return est


def cmd_transform(args):
    import dask.array as da

    from . import load
    from .io import (
        atomic_directory, marker_attributes, read_checked, strict_group, writing_every_chunk,
    )

    out = Path(args.out)
    protect = {"the input store": args.store, "the model": args.model}
    _check_out(out, "store", args.overwrite, protect)
    model = load(args.model)
    X, names = _images(args.store)
    # the lazy graph first: a model of another d is refused before any cluster starts
    Xf = X.reshape(X.shape[0], -1)
    if args.reconstruct:
        R = model.inverse_transform(model.transform(Xf))
        Y = da.clip(da.round(R), 0, 255).astype(np.uint8).reshape(X.shape)
        name = "images"
    else:
        Y = model.transform(Xf)
        name = "representation"
    with _client(args):
        t = time.perf_counter()
        with atomic_directory(out, "store", overwrite=args.overwrite, protect=protect) as tmp, \
                writing_every_chunk():
            import zarr

            g = zarr.open_group(str(tmp), mode="w", attributes={
                "model": str(args.model), "source": str(args.store), "content": name,
                **marker_attributes("store"),
            })
            # created here, not by da.to_zarr, so that it writes every chunk (the setting
            # travels with the array to the workers)
            arr = g.create_array(name, shape=Y.shape, chunks=Y.chunksize, dtype=Y.dtype)
            da.to_zarr(Y, arr, compute=True)
            src = zarr.open_group(str(args.store), mode="r")
            # the attributes whole or an error; the partition as zarr reads it: stores of
            # dfairpca that predate writing_every_chunk lack its all-train (all-zero) chunks
            strict = strict_group(src)
            for extra in ("attributes", "partition"):
                if extra in src:
                    arr = g.create_array(extra, shape=src[extra].shape, chunks=src[extra].chunks,
                                         dtype=src[extra].dtype)
                    arr[:] = read_checked((strict if extra == "attributes" else src)[extra],
                                          slice(None))
                    arr.attrs.update(dict(src[extra].attrs))
        print(f"wrote {name} {Y.shape} to {out} in {time.perf_counter() - t:.1f} s")


def cmd_show(args):
    from . import load
    from .figures import faces_figure

    out = Path(args.out)
    _check_out(out, "figure", args.overwrite, {"the input store": args.store, "the model": args.model})
    model = load(args.model)
    path = faces_figure(model, args.store, out, n=args.n, overwrite=args.overwrite)
    print(f"picture written to {path}")


def cmd_demo(args):
    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    store = work / f"synthetic_celeba_{args.n}.zarr"
    if not store.exists():
        cmd_synth(argparse.Namespace(out=str(store), n=args.n, seed=0, size=80, overwrite=False))
    else:
        print(f"using the existing store {store}")
    model = work / f"fair_{args.attribute}_k{args.k}"
    fit_args = argparse.Namespace(
        store=str(store), attribute=[args.attribute], k=args.k, out=str(model), method="fair",
        constraint="demographic_parity", target=None, tradeoff=0.0, equalize=0.5,
        scheduler=args.scheduler, scheduler_file=args.scheduler_file, timeout=args.timeout,
        overwrite=True, statistics=False, checkpoint=None, resume=False, rows_per_chunk=None,
    )
    cmd_fit(fit_args)
    cmd_show(argparse.Namespace(model=str(model), store=str(store), out=str(work / "faces.png"), n=8,
                                overwrite=True))


# ----------------------------------------------------------------------------- parser
class _UsageError(Exception):
    """A command line argparse refused: reported by :func:`main` like any other error."""

    def __init__(self, prog: str, message: str):
        super().__init__(f"{prog}: error: {message} (see {prog} --help)")


class _Parser(argparse.ArgumentParser):
    """argparse without the usage block on errors: one line, like every other error."""

    def error(self, message):
        raise _UsageError(self.prog, message)


def _positive(kind):
    """An argparse type: ``kind`` (int or float) greater than zero."""
    name = "integer" if kind is int else "number"

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            value = None
        if value is None or not value > 0:
            raise argparse.ArgumentTypeError(f"must be a positive {name}; got {text!r}")
        return value

    parse.__name__ = f"positive {name}"
    return parse


def _add_cluster(p):
    g = p.add_argument_group("cluster")
    g.add_argument("--scheduler", metavar="ADDRESS", help="tcp://host:port of a Dask scheduler")
    g.add_argument("--scheduler-file", metavar="PATH", help="scheduler file written by `dask scheduler`")
    g.add_argument("--timeout", type=_positive(float), default=60, metavar="SECONDS",
                   help="how long to wait for the scheduler to answer, then for a first worker "
                        "(default 60)")


def build_parser() -> argparse.ArgumentParser:
    ap = _Parser(prog="dfairpca", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="command", required=True)

    p = sub.add_parser("synth-celeba", help="write a synthetic CelebA-shaped Zarr store")
    p.add_argument("out")
    p.add_argument("--n", type=_positive(int), default=202_599)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--size", type=_positive(int), default=80)
    p.add_argument("--overwrite", action="store_true",
                   help="replace what dfairpca wrote there before (never anything else)")
    p.set_defaults(func=cmd_synth)

    p = sub.add_parser("ingest-celeba", help="convert the official CelebA folder to a Zarr store")
    p.add_argument("celeba_dir")
    p.add_argument("out")
    p.add_argument("--size", type=_positive(int), default=80)
    p.add_argument("--overwrite", action="store_true",
                   help="replace what dfairpca wrote there before (never anything else)")
    p.set_defaults(func=cmd_ingest)

    p = sub.add_parser("fit", help="fit PCA / fair PCA on a CelebA-schema store")
    p.add_argument("store")
    p.add_argument("--attribute", action="append", default=[], help="protected attribute (repeatable)")
    p.add_argument("-k", "--k", type=_positive(int), required=True, help="number of components")
    p.add_argument("--out", required=True, help="model directory to write")
    p.add_argument("--method", choices=["pca", "fair", "fair-s"], default="fair")
    p.add_argument("--equalize", type=float, default=0.5, help="fair-s: fraction f of Fair PCA-S (f)")
    p.add_argument("--constraint", choices=["demographic_parity", "equal_opportunity"],
                   default="demographic_parity")
    p.add_argument("--target", help="task label attribute for equal opportunity")
    p.add_argument("--tradeoff", type=float, default=0.0)
    p.add_argument("--statistics", action="store_true", help="also save the d x d statistics")
    p.add_argument("--checkpoint", metavar="DIR",
                   help="where the pass saves its running statistics (default: OUT.checkpoint)")
    p.add_argument("--resume", action="store_true",
                   help="continue an interrupted fit from its checkpoint, skipping finished chunks")
    p.add_argument("--rows-per-chunk", type=_positive(int),
                   help="rows per task of the pass (default: store chunks merged to ~64 MiB)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace what dfairpca wrote there before (never anything else)")
    _add_cluster(p)
    p.set_defaults(func=cmd_fit)

    p = sub.add_parser("transform", help="project a store lazily and write the result to Zarr")
    p.add_argument("model")
    p.add_argument("store")
    p.add_argument("--out", required=True)
    p.add_argument("--reconstruct", action="store_true", help="write images in pixel space")
    p.add_argument("--overwrite", action="store_true",
                   help="replace what dfairpca wrote there before (never anything else)")
    _add_cluster(p)
    p.set_defaults(func=cmd_transform)

    p = sub.add_parser("show", help="picture of original and fair faces (paper's Figure 5)")
    p.add_argument("model")
    p.add_argument("store")
    p.add_argument("--out", default="faces.png")
    p.add_argument("--n", type=_positive(int), default=8, help="faces per row")
    p.add_argument("--overwrite", action="store_true", help="replace a picture dfairpca drew")
    p.set_defaults(func=cmd_show)

    p = sub.add_parser("demo", help="the main job: synth-celeba -> fit -> show")
    p.add_argument("--n", type=_positive(int), default=202_599)
    p.add_argument("-k", "--k", type=_positive(int), default=400)
    p.add_argument("--attribute", default="Eyeglasses")
    p.add_argument("--workdir", default="dfairpca-demo")
    _add_cluster(p)
    p.set_defaults(func=cmd_demo)
    return ap


def main(argv=None) -> int:
    """Run one command; return its exit status (0, 2 on an error, 130 on Ctrl-C)."""
    from .checkpoint import PassInterrupted

    try:
        args = build_parser().parse_args(argv)
    except _UsageError as exc:
        print(exc, file=sys.stderr)
        return 2
    try:
        args.func(args)
    except (CLIError, ValueError, KeyError, FileExistsError, FileNotFoundError, PermissionError,
            ConnectionError) as exc:
        msg = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc
        print(f"dfairpca {args.command}: error: {msg}", file=sys.stderr)
        return 2
    except PassInterrupted as exc:
        resume = "; rerun with --resume" if args.command == "fit" else ""
        print(f"dfairpca {args.command}: interrupted after {exc.chunks_done} of "
              f"{exc.n_chunks} chunks{resume}", file=sys.stderr)
        return EXIT_INTERRUPTED
    except KeyboardInterrupt:  # outside a pass, or a second Ctrl-C while the cluster closes
        print(f"dfairpca {args.command}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    return 0


if __name__ == "__main__":
    sys.exit(main())
