"""``dfairpca evaluate``: the fairness report of a saved model on the rows of a store."""

from __future__ import annotations

import time

from ._errors import UsageError, _plain, arguments
from ._inputs import _client, _data, _sensitive, _storage

#: the report's columns as ``evaluate`` prints them, in words
_SHOWN = (("max_mean_gap_sd", "largest group-mean gap {:.3g} SD"), ("p_value", "p = {:.3g}"),
          ("linear_probe_auc", "linear probe AUC {:.3f}"))


def _line(name, row, baseline_k: int | None) -> str:
    """One attribute's report in one line (NaN figures as "n/a")."""
    def figures(prefix: str) -> str:
        return ", ".join(text.format(row[prefix + col]) if row[prefix + col] == row[prefix + col]
                         else text.split("{")[0] + "n/a" for col, text in _SHOWN)

    line = f"{name}: {int(row['groups'])} groups; {figures('')}"
    if baseline_k is not None:
        line += f"; PCA k = {baseline_k}: {figures('baseline_')}"
    return line


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
        report = fairness_report(model, X, groups, baseline=baseline, cv=args.cv,
                                 random_state=args.random_state)
        dt = time.perf_counter() - t
    probe = int(report["probe_rows"].iloc[0])
    print(f"{type(model).__name__} k = {model.n_components_} on {n:,} rows of {data.label} "
          f"(linear probe: {args.cv}-fold, on {probe:,} rows)")
    for name, row in report.iterrows():
        print(_line(name, row, args.baseline_k))
    return {
        "command": "evaluate", "n": n, "d": d, "k": int(model.n_components_),
        "estimator": type(model).__name__, "baseline_k": args.baseline_k,
        "probe_rows": probe, "cv": args.cv,
        "attributes": {str(name): {col: int(v) if col in ("groups", "probe_rows") else _plain(float(v))
                                   for col, v in row.items()}
                       for name, row in report.iterrows()},
        "seconds": round(dt, 3), "wall_seconds": round(time.perf_counter() - start, 3),
        "model": str(args.model), "store": str(args.store), "array": data.label,
    }
