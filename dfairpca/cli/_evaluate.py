"""``dfairpca evaluate``: the fairness report of a saved model on the rows of a store."""

from __future__ import annotations

import sys
import time

from ..base.progress import reporting
from ._errors import UsageError, _plain, arguments
from ._inputs import _client, _data, _sensitive, _storage

# Deferred imports: package modules that load such libraries, or this module, at import are imported
# in the functions that use them, so that importing this module stays light.

def _p(p: float) -> str:
    """A p-value in words (below float64's range: not 0)."""
    return "p n/a" if p != p else "p < 1e-300" if p == 0 else f"p = {p:.2g}"


def verdict_line(row, tolerance: float, alpha: float, prefix: str = "") -> str:
    """One model's figures of one attribute of :func:`dfairpca.metrics.fairness_report`
    in words: the verdict at the tolerance, the gap and the bound that decided it, then
    the test's p-value and the probe's AUC (``prefix``: "baseline_" for the baseline's)."""
    def get(col):
        return row[prefix + col]

    if int(row["groups"]) < 2:
        return f"{int(row['groups'])} group present: nothing to compare"
    said, lo, up = get("verdict"), get("max_mean_gap_sd_lower"), get("max_mean_gap_sd_upper")
    confidence = f"{100 * (1 - alpha):g}% confidence"
    if said == "fair":
        bound = f"at most {up:.2g} SD with {confidence}"
    elif said == "not fair":
        bound = f"at least {lo:.2g} SD with {confidence}"
    elif up == float("inf"):
        bound = "no upper bound (a group has one row): more rows of it would tell"
    else:
        bound = f"between {lo:.2g} and {up:.2g} SD with {confidence}: more rows would tell"
    auc = get("linear_probe_auc")
    return (f"{said} at tolerance {tolerance:g} SD: group-mean gap {get('max_mean_gap_sd'):.2g} SD, {bound} "
            f"({_p(get('p_value'))}, linear probe AUC {'n/a' if auc != auc else f'{auc:.3f}'})")


def _line(name, row, tolerance: float, alpha: float, baseline_k: int | None) -> str:
    """One attribute's report in one line (the baseline's in short)."""
    line = f"{name}: {verdict_line(row, tolerance, alpha)}"
    if baseline_k is not None and int(row["groups"]) >= 2:
        lo, up = row["baseline_max_mean_gap_sd_lower"], row["baseline_max_mean_gap_sd_upper"]
        line += (f"; PCA k = {baseline_k}: {row['baseline_verdict']}, gap {row['baseline_max_mean_gap_sd']:.2g} SD "
                 f"({lo:.2g} to {up:.2g})")
    return line


def _fitted_attributes(model, data) -> list[str]:
    """The attributes the model was fitted with, where the store holds them as CelebA
    attributes (else none)."""
    from ..celeba.schema import attribute_flags

    names = list(getattr(model, "attribute_names_", None) or [])
    names = names[: len(names) - len(getattr(model, "numeric_sensitive_columns_", ()))]
    if not names or not data.celeba:
        return []
    try:
        attribute_flags(data.root, names)
    except (KeyError, ValueError):
        return []
    return [str(n) for n in names]


def cmd_evaluate(args) -> dict:
    """Print the report (:func:`dfairpca.metrics.fairness_report`) of the model on STORE's
    rows, one line per attribute; return the object ``evaluate --json`` prints."""
    from .. import PCA, load
    from ..metrics import fairness_report

    start = time.perf_counter()
    model = load(args.model, storage_options=_storage(args))
    data = _data(args)
    groups = _sensitive(args, data)
    if groups is None:
        args.attribute = _fitted_attributes(model, data)  # those the model was fitted with
        groups = _sensitive(args, data) if args.attribute else None
    if groups is None:
        raise UsageError(
            "name the protected attribute(s) to evaluate: --attribute NAME (a CelebA attribute, "
            "e.g. Eyeglasses), --sensitive-array ARRAY, or --sensitive-csv FILE "
            "--sensitive-column COL")
    X = data.X.reshape(data.X.shape[0], -1)
    n, d = int(X.shape[0]), int(X.shape[1])
    baseline = None
    with arguments():  # a model of another d, a baseline k the store cannot have: now
        model.transform(X)  # lazy: the graph only
        if args.baseline_k is not None:
            baseline = PCA(args.baseline_k)
            baseline.validate_fit(X)
    with _client(args):
        t = time.perf_counter()
        if baseline is not None:
            baseline.fit(X)
        with reporting(True, sys.stdout):
            report = fairness_report(model, X, groups, baseline=baseline, cv=args.cv,
                                     random_state=args.random_state, tolerance=args.tolerance,
                                     alpha=args.alpha, progress=True)
        dt = time.perf_counter() - t
    probe = int(report["probe_rows"].iloc[0])
    print(f"{type(model).__name__} k = {_width(model)} on {n:,} rows of {data.label} "
          f"(linear probe: {args.cv}-fold, on {probe:,} rows)")
    for name, row in report.iterrows():
        print(_line(name, row, args.tolerance, args.alpha, args.baseline_k))
    return {
        "command": "evaluate", "n": n, "d": d, "k": _width(model),
        "estimator": type(model).__name__, "baseline_k": args.baseline_k,
        "probe_rows": probe, "cv": args.cv, "tolerance": args.tolerance, "alpha": args.alpha,
        "attributes": {str(name): {col: int(v) if col in ("groups", "probe_rows") else
                                   v if isinstance(v, str) else _plain(float(v))
                                   for col, v in row.items()}
                       for name, row in report.iterrows()},
        "seconds": round(dt, 3), "wall_seconds": round(time.perf_counter() - start, 3),
        "model": str(args.model), "store": str(args.store), "array": data.label,
    }


def _width(model) -> int:
    """The representation's width: the components, or the features an eraser keeps."""
    k = getattr(model, "n_components_", None)
    return int(k if k is not None else model.n_features_in_)
