"""Randomized fair PCA at CelebA scale, against the exact fit and dask-ml, in the same run.

    python benchmarks/bench_randomized.py                # 202,599 x 6,400, k = 50: the target
    python benchmarks/bench_randomized.py --n 20000      # the development size (minutes)

Issue 14's target: at 202,599 x 6,400 and k = 50, the randomized FairPCA fit takes at most
half the time of the exact fit measured in the same run, with a captured-variance gap of
at most 1e-4 of the exact optimum; and it is faster than dask-ml's
``PCA(svd_solver="randomized")`` at an equal gap, dask-ml's ``iterated_power`` raised until its
gap is as small (dask-ml solves plain PCA: its gap is to the PCA optimum, and it is not fair).

The store is the synthetic CelebA stack (uint8, 80 x 80) of
:func:`dfairpca.celeba.ensure_store` (written if missing, its settings checked if present);
the attribute is Eyeglasses.  Every method
runs in a fresh subprocess on Dask's threaded scheduler with 2 workers (as
benchmarks/bench_fit.py's "threads"), its peak RSS sampled with its children.  The gaps are
measured here afterwards against float64 statistics of the same rows (an exact fit with
``compute_dtype="float64"`` and a dense eigensolve: the optimum of each problem).

Results: ``benchmarks/results/randomized_<n>.{md,json}``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bench_fit import ATTR, PeakRSS, groups, measured  # noqa: E402  (one sampler, one attribute, one runner)


# ----------------------------------------------------------------------------- methods
def _threads():
    import dask

    return dask.config.set(scheduler="threads", num_workers=2)


def _save(store, tag, U):
    np.save(Path(store).parent / f"U_{tag}_{Path(store).stem}.npy", np.asarray(U, np.float64))


def m_fairpca(store, k, opts):
    """FairPCA(k, **opts["params"]).fit, timed; its components saved for the driver."""
    import dfairpca

    X = dfairpca.from_zarr(store, "images")
    z = groups(store)
    with _threads():
        t0 = time.perf_counter()
        est = dfairpca.FairPCA(k, random_state=0, **opts["params"]).fit(X, sensitive_features=z)
        t = time.perf_counter() - t0
    _save(store, opts["tag"], est.components_)
    return {"fit_s": t, "passes": getattr(est, "n_passes_", 1), "solver": est.fitted_svd_solver_,
            "violation": est.fairness_violation_}


def m_daskml(store, k, opts):
    from dask_ml.decomposition import PCA

    import dfairpca

    X = dfairpca.from_zarr(store, "images")
    X = X.reshape(X.shape[0], -1).astype(opts.get("dtype", "float32")).rechunk({0: 4096, 1: -1})
    with _threads():
        t0 = time.perf_counter()
        est = PCA(n_components=k, svd_solver="randomized", iterated_power=opts["q"],
                  random_state=0).fit(X)
        t = time.perf_counter() - t0
    _save(store, opts["tag"], est.components_)
    # dask-ml's randomized SVD reads X twice per power iteration, and twice more
    return {"fit_s": t, "passes": f"{2 * opts['q'] + 2}+"}


METHODS = {"fairpca": m_fairpca, "daskml": m_daskml}
#: the randomized fits besides "auto": the gap after 2, 3, 4 and 5 passes, and a wider block
VARIANTS = ["0:10", "1:10", "2:10", "3:10", "1:30"]
#: the largest iterated_power tried for dask-ml (its gap stops improving near 4 here)
DASKML_MAX = 12


def run_one(kind, store, k, opts):
    with PeakRSS() as mem:
        res = METHODS[kind](store, k, opts)
    res["peak_rss_gb"] = mem.peak / 2**30
    return res


# ----------------------------------------------------------------------------- accuracy
class Reference:
    """float64 statistics of the store: the optimum of fair PCA and of PCA, and the basis
    of the constraint, to score every method's components."""

    def __init__(self, store, k):
        import dask

        import dfairpca

        with dask.config.set(scheduler="threads", num_workers=2):
            ref = dfairpca.FairPCA(k, svd_solver="full", compute_dtype="float64",
                                   eigen_solver="dense").fit(
                dfairpca.from_zarr(store, "images"), sensitive_features=groups(store))
        m = ref.statistics_
        self.S = m.scatter / (m.n - 1)
        self.Q = ref.constraint_basis_
        self.optimum = {True: self.captured(ref.components_),
                        False: self.captured(dfairpca.PCA(k, svd_solver="full", eigen_solver="dense")
                                             .fit_statistics(m).components_)}

    def captured(self, U):
        return float(np.sum((U @ self.S) * U))

    def score(self, store, tag, fair: bool) -> dict:
        f = Path(store).parent / f"U_{tag}_{Path(store).stem}.npy"
        U = np.load(f)
        f.unlink()
        U = np.linalg.qr(U.T)[0].T  # orthonormalise (randomized SVDs are not exactly)
        opt = self.optimum[fair]
        return {"gap": (opt - self.captured(U)) / opt, "fair": float(np.abs(U @ self.Q).max())}


# ----------------------------------------------------------------------------- driver
def _children_cpu() -> float:
    """CPU seconds (user + system) of the finished child processes so far."""
    import resource

    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def run(kind, opts, args, store, ref, fair):
    cmd = [sys.executable, __file__, "--one", kind, "--opts", json.dumps(opts), "--n", str(args.n),
           "--k", str(args.k), "--dir", args.dir]
    cpu = _children_cpu()
    res = measured(cmd, args.timeout, args.max_rss_gb)
    # the whole child (its start, reading the store, the fit): a check of the wall-clock
    # ratios that a loaded machine does not inflate
    res["cpu_s"] = _children_cpu() - cpu
    if "error" not in res:
        res.update(ref.score(store, opts["tag"], fair))
    res.update(method=opts["label"], kind=kind, opts=opts)
    print(json.dumps(res), flush=True)
    return res


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=202_599)
    ap.add_argument("--k", type=int, default=50)
    ap.add_argument("--dir", default="/tmp/dfairpca-bench")
    ap.add_argument("--variants", nargs="*", default=VARIANTS,
                    help="iterated_power:n_oversamples of the randomized fits run besides "
                         "svd_solver='auto'")
    ap.add_argument("--daskml-max", type=int, default=DASKML_MAX,
                    help="the largest iterated_power tried for dask-ml")
    ap.add_argument("--timeout", type=float, default=3600, help="seconds per method")
    ap.add_argument("--max-rss-gb", type=float, default=16.0,
                    help="stop a method whose processes pass this resident memory (GB)")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    ap.add_argument("--opts", help=argparse.SUPPRESS)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    store = Path(args.dir) / f"synthetic_celeba_{args.n}.zarr"
    if args.one:  # child process: one method, JSON on the last line
        print(json.dumps(run_one(args.one, store, args.k, json.loads(args.opts))))
        return
    from dfairpca.celeba import ensure_store

    store = ensure_store(store, args.n, progress=False)  # written once, checked after
    t0 = time.perf_counter()
    ref = Reference(store, args.k)
    print(f"reference (float64 statistics, dense solves): {time.perf_counter() - t0:.0f} s", flush=True)
    rows = [run("fairpca", {"label": "FairPCA exact (svd_solver='full': one pass, d x d)",
                            "tag": "exact", "params": {"svd_solver": "full"}}, args, store, ref, True)]
    auto = run("fairpca", {"label": "FairPCA (svd_solver='auto')", "tag": "auto", "params": {}},
               args, store, ref, True)
    rows.append(auto)
    for v in args.variants:
        q, p = map(int, v.split(":"))
        rows.append(run("fairpca", {
            "label": f"FairPCA randomized (iterated_power={q}, n_oversamples={p})",
            "tag": f"rnd_{q}_{p}",
            "params": {"svd_solver": "randomized", "iterated_power": q, "n_oversamples": p}},
            args, store, ref, True))
    target, best, worse, dtype = auto.get("gap", 1e-4), np.inf, 0, "float32"
    for q in range(args.daskml_max + 1):  # raise dask-ml's power until its gap is as small
        wide = ", float64" if dtype == "float64" else ""
        r = run("daskml", {"label": f"dask-ml PCA randomized (iterated_power={q}{wide})",
                           "tag": f"dml_{q}", "q": q, "dtype": dtype}, args, store, ref, False)
        if dtype == "float32" and "converge" in r.get("error", ""):
            # its float32 power iterations can fail in LAPACK ("SVD did not converge"):
            # float64 then, and from here on
            rows.append(r)
            dtype = "float64"
            r = run("daskml", {"label": f"dask-ml PCA randomized (iterated_power={q}, float64)",
                               "tag": f"dml_{q}_64", "q": q, "dtype": dtype}, args, store, ref,
                    False)
        rows.append(r)
        if "error" in r or r["gap"] <= target:
            break
        # past some q the gap may stop improving: stop after two steps without progress
        worse = worse + 1 if r["gap"] >= best else 0
        best = min(best, r["gap"])
        if worse == 2:
            break
    write(rows, args)


def write(rows, args):
    out = Path(args.out) if args.out else HERE / "results" / f"randomized_{args.n}"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(rows, indent=1))
    exact = next((r for r in rows if r["opts"]["tag"] == "exact" and "error" not in r), None)
    cmd = "python benchmarks/bench_randomized.py" + (f" --n {args.n}" if args.n != 202_599 else "")
    if args.k != 50:
        cmd += f" --k {args.k}"
    if args.variants != VARIANTS:
        cmd += " --variants " + " ".join(args.variants)
    if args.daskml_max != DASKML_MAX:
        cmd += f" --daskml-max {args.daskml_max}"
    if args.max_rss_gb != 16.0:
        cmd += f" --max-rss-gb {args.max_rss_gb:g}"
    lines = [f"Command: `{cmd}` (n = {args.n:,}, d = 6,400, k = {args.k}, attribute {ATTR}, "
             f"Dask threads x 2; a method is stopped past {args.max_rss_gb:g} GB resident)", "",
             "| method | solver | passes over X | wall s | ratio to exact | CPU s (process) | CPU "
             "ratio | peak RSS GB | captured variance gap to optimum | max abs(U q) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['method']} | — | — | — | — | — | — | — | — | {r['error']} |")
            continue
        ratio = f"{r['fit_s'] / exact['fit_s']:.2f}" if exact else "—"
        cpu = f"{r['cpu_s'] / exact['cpu_s']:.2f}" if exact and exact.get("cpu_s") else "—"
        lines.append(f"| {r['method']} | {r.get('solver', '—')} | {r['passes']} | {r['fit_s']:.1f} | "
                     f"{ratio} | {r.get('cpu_s', 0):.1f} | {cpu} | {r['peak_rss_gb']:.2f} | "
                     f"{r['gap']:.1e} | {r['fair']:.0e} |")
    auto = next((r for r in rows if r["opts"]["tag"] == "auto" and "error" not in r), None)
    if exact and auto:
        lines += ["", f"Target (issue 14): FairPCA(svd_solver='auto') ran {auto['solver']} in "
                  f"{auto['fit_s'] / exact['fit_s']:.2f} of the exact fit's time (at most 0.5) with a "
                  f"gap of {auto['gap']:.1e} (at most 1e-4)."]
    dml = [r for r in rows if r["kind"] == "daskml" and "error" not in r]
    if dml and auto:
        best = min(dml, key=lambda r: r["gap"])
        ours = min((r for r in rows if r["kind"] == "fairpca" and "error" not in r
                    and r["opts"]["tag"] != "exact" and r["gap"] <= best["gap"]),
                   key=lambda r: r["fit_s"], default=None)
        lines += ["", f"dask-ml: its smallest gap, {best['gap']:.1e}, took {best['method']}, "
                  f"{best['fit_s']:.1f} s" + ("" if best["gap"] <= auto["gap"] else
                                              f" (it does not reach FairPCA auto's {auto['gap']:.1e})")
                  + (f"; the fastest FairPCA fit at least as close to its optimum is "
                     f"{ours['method']}, {ours['fit_s']:.1f} s (dask-ml took "
                     f"{best['fit_s'] / ours['fit_s']:.2f} times as long), and it is fair where "
                     "dask-ml keeps the group-mean gap." if ours else ".")]
    lines += ["", "Gaps: fair methods to the fair optimum, dask-ml to the PCA optimum (it is not "
              "fair: see max abs(U q), the share of the Eyeglasses mean difference it keeps). "
              "Passes: the randomized fit's first pass also computes the statistics; dask-ml's "
              "count is its products with X (its mean and variance add more). CPU s: user + "
              "system time of the method's whole subprocess (start-up, reading, fit), which a "
              "loaded machine does not inflate as it does wall time."]
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
