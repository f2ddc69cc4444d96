"""The command ``erase``: fit a :class:`~dfairpca.ConceptEraser` on a store and write the
erased data, X's shape, under X's name, in one command (one pass to fit, one to write)."""

from __future__ import annotations

import argparse
import math
import sys
import time

from ._errors import UsageError
from ._fit import TRANSFORM_KIND, _check_two_groups, write_result
from ._inputs import (_check_out, _client, _data, _describe_groups, _input_paths, _place,
                      _sample_weight, _sensitive, _storage)

# Deferred imports: package modules that load such libraries, or this module, at import are imported
# in the functions that use them, so that importing this module stays light.


def cmd_erase(args) -> dict:
    """Fit the eraser, write the erased store (and the model with ``--model``), and return
    the summary ``erase --json`` prints."""
    from .. import ConceptEraser
    from ..celeba.schema import dimension_names
    from ..io import staged_locally

    start = time.perf_counter()
    storage = _storage(args)
    out = _place(args.out, TRANSFORM_KIND, storage)
    model_out = _place(args.model, "model", storage) if args.model else None
    protect = _input_paths(args)
    _check_out(out, TRANSFORM_KIND, args.overwrite,
               {**protect, **({"the model": model_out} if model_out else {})})
    if model_out is not None:
        _check_out(model_out, "model", args.overwrite, {**protect, "the output store": out})
    data = _data(args)
    X = data.X
    groups = _sensitive(args, data)
    if groups is None:
        raise UsageError(
            "name the protected attribute(s) to erase: --attribute NAME (a CelebA attribute, "
            "e.g. Eyeglasses), --sensitive-array ARRAY, or --sensitive-csv FILE "
            "--sensitive-column COL")
    _check_two_groups(groups)
    w = _sample_weight(args, data)
    est = ConceptEraser(args.method, rtol=args.rtol, compute_dtype=args.compute_dtype,
                        progress=sys.stdout.isatty())
    n, d = X.shape[0], math.prod(data.shape[1:])
    print(f"n = {n:,} {'images' if data.celeba else 'rows'}, d = {d:,} features; groups "
          f"{_describe_groups(groups, args.attribute)}")
    with _client(args) as client:
        t = time.perf_counter()
        est.fit(X, sensitive_features=groups, sample_weight=w, timeout=args.timeout)
        fit_seconds = time.perf_counter() - t
        Y = est.transform(X)  # lazy, in X's chunks
        if Y.shape != tuple(data.shape):  # a stored (n, ...) array read as rows: its shape back
            Y = Y.reshape(data.shape)
        t = time.perf_counter()
        write_result(args, client, out, {**protect, "the model": model_out} if model_out else protect,
                     data, Y, data.name, dimension_names(Y.ndim), str(args.model or ""),
                     lambda x: est.transform(x).reshape((len(x), *data.shape[1:])))
        write_seconds = time.perf_counter() - t
    if model_out is not None:
        with staged_locally(model_out, "model", overwrite=args.overwrite) as local:
            est.save(local, overwrite=args.overwrite)
    print(f"ConceptEraser ({args.method}): {est.n_constraints_} direction(s) erased, fairness "
          f"certified: group-mean gap kept {est.fairness_violation_:.1e} "
          f"({est.statistics_kernel_} statistics); fit in {fit_seconds:.1f} s; wrote {data.name} "
          f"{Y.shape} {Y.dtype} to {out} in {write_seconds:.1f} s"
          + (f"; model written to {model_out}" if model_out is not None else ""))
    return {
        "command": "erase", "n": int(n), "d": d, "method": args.method,
        "n_constraints": int(est.n_constraints_), "support_rank": int(est.support_rank_),
        "statistics_kernel": est.statistics_kernel_,
        "fairness_violation": float(est.fairness_violation_),
        "fairness_violation_per_attribute": [float(v) for v in est.fairness_violation_per_attribute_],
        "written": data.name, "shape": [int(s) for s in Y.shape], "dtype": str(Y.dtype),
        "fit_seconds": round(fit_seconds, 3), "write_seconds": round(write_seconds, 3),
        "wall_seconds": round(time.perf_counter() - start, 3), "out": str(out),
        "model": None if model_out is None else str(model_out), "store": str(args.store),
        "array": data.label,
    }


def _fraction(text: str) -> float:
    """``--rtol``: a number in [0, 1)."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0.0 <= value < 1.0:
        raise argparse.ArgumentTypeError(f"must be a number in [0, 1), got {text!r}")
    return value


def add_erase_parser(sub, add_array, add_sensitive, add_writes) -> None:
    """The ``erase`` subcommand's options (the shared groups of options by the parser's
    helpers, passed in)."""
    p = sub.add_parser("erase", help="erase protected attributes from a store at full rank "
                                     "(LEACE) and write the erased data to Zarr")
    p.add_argument("store", metavar="STORE",
                   help="a Zarr store: a group (CelebA layout unless --array) or a bare array")
    add_array(p)
    p.add_argument("--out", required=True,
                   help="the Zarr store to write: the erased X, in X's shape and chunks, under "
                        "X's name (float32, or float64 for float64 X) (required)")
    p.add_argument("--method", choices=["leace", "orth"], default="leace",
                   help="leace: the least change after which no linear classifier recovers the "
                        "groups; orth: the orthogonal projection removing the group-mean "
                        "differences")
    add_sensitive(p, "protected attributes (the sources combine)")
    g = p.add_argument_group("sample weights (frequency weights: a row of weight w counts w times)")
    g.add_argument("--sample-weight-array", metavar="ARRAY",
                   help="the rows' weights from a Zarr array of STORE or a path (default: none)")
    g.add_argument("--sample-weight-column", metavar="COL",
                   help="the rows' weights from column COL of --sample-weight-csv (default: none)")
    g.add_argument("--sample-weight-csv", metavar="FILE",
                   help="the file of --sample-weight-column (default: the --sensitive-csv file)")
    g = p.add_argument_group("solve and output")
    g.add_argument("--compute-dtype", choices=["auto", "float32", "float64", "exact"],
                   default="auto",
                   help="the dtype of the pass's products: auto runs them in float64 (or as "
                        "exact integer sums of 8-bit pixels)")
    g.add_argument("--rtol", type=_fraction, default=None,
                   help="leace: eigenvalues of the covariance at or below RTOL times the "
                        "largest are outside its support (default: d * eps)")
    g.add_argument("--model", metavar="DIR",
                   help="also save the fitted eraser there, for dfairpca.load (default: none)")
    add_writes(p, g, fits=True)
    # what the shared readers of the protected attributes also look at
    p.set_defaults(func=cmd_erase, target_column=None, rows_per_chunk=None)
