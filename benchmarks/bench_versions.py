"""Two versions of dfairpca on the same fits, alternating, to tell a change's cost apart.

    python benchmarks/bench_versions.py --before /path/to/old/checkout --after . \\
        [--n 202599] [--rounds 2] [--out benchmarks/results/versions_202599]

A restructure must not slow the fits users run.  One run of each version cannot show a 5%
difference on a machine whose load drifts (a shared 2-core machine spread single fits of
the same code from 0.83 to 1.34 of the limit), so the versions alternate: round r runs
before then after when r is even, after then before when odd, each fit in a fresh
subprocess whose ``PYTHONPATH`` is that version's checkout.  Each round also runs the
machine's limit for the exact fit (bare numpy: read the Zarr chunks, centre, float32
``syrk``, the top-k eigensolve; the code of ``bench_fit.py``) so that every fit has a ratio to
a reference measured minutes apart.

The fits, on the synthetic CelebA stack (uint8, 80 x 80, attribute Eyeglasses; written by
:func:`dfairpca.celeba.ensure_store` if missing) on Dask's threaded scheduler, 2 threads:

* ``exact k=400``: ``FairPCA(400, svd_solver="full")`` (one pass, a 6,400 x 6,400 solve);
* ``randomized k=50``: ``FairPCA(50, svd_solver="randomized", random_state=0)``.

Reported: wall and CPU seconds of each fit, the median over rounds of after / before, and
the components' agreement (largest principal angle between the versions' subspaces).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent

FITS = {
    "exact k=400": {"k": 400, "params": {"svd_solver": "full"}},
    "randomized k=50": {"k": 50, "params": {"svd_solver": "randomized", "random_state": 0}},
}

CHILD = r"""
import json, os, resource, sys, time
import dask
import numpy as np
import dfairpca
from dfairpca.celeba import attribute_column
store, k, params, out = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3]), sys.argv[4]
X = dfairpca.from_zarr(store, "images")
z = attribute_column(store, "Eyeglasses")
with dask.config.set(scheduler="threads", num_workers=2):
    c0, t0 = time.process_time(), time.perf_counter()
    est = dfairpca.FairPCA(k, **params).fit(X, sensitive_features=z)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
np.save(out, est.components_.astype(np.float64))
print(json.dumps({"wall_s": wall, "cpu_s": cpu, "solver": est.fitted_svd_solver_,
                  "violation": float(est.fairness_violation_)}))
"""


def _child(checkout: Path, args: list[str]) -> dict:
    env = dict(os.environ, PYTHONPATH=str(checkout), OMP_NUM_THREADS="2")
    done = subprocess.run([sys.executable, "-c", CHILD, *args], env=env, capture_output=True,
                          text=True, check=False)
    if done.returncode:
        raise RuntimeError(f"{checkout}: {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _limit(checkout: Path, store: Path, n: int, k: int) -> dict:
    code = ("import json, sys; sys.path.insert(0, %r); from bench_fit import m_limit; "
            "print(json.dumps(m_limit(%r, %d, %d)))" % (str(HERE), str(store), n, k))
    env = dict(os.environ, PYTHONPATH=str(checkout), OMP_NUM_THREADS="2")
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          check=True)
    r = json.loads(done.stdout.strip().splitlines()[-1])
    return {"wall_s": r["pass_s"] + r["eig_s"], **r}


def _max_angle(a: np.ndarray, b: np.ndarray) -> float:
    qa, qb = np.linalg.qr(a.T)[0], np.linalg.qr(b.T)[0]
    s = np.linalg.svd(qa.T @ qb, compute_uv=False)
    return float(np.degrees(np.arccos(np.clip(s.min(), -1, 1))))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", required=True, type=Path, help="checkout of the old version")
    ap.add_argument("--after", required=True, type=Path, help="checkout of the new version")
    ap.add_argument("--n", type=int, default=202_599)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--dir", default="/tmp/dfairpca-bench")
    ap.add_argument("--fits", nargs="*", default=list(FITS), choices=list(FITS),
                    help="which fits to run (default: all)")
    ap.add_argument("--first-round", type=int, default=0,
                    help="number of the first round: an even one runs before first, an odd one after")
    ap.add_argument("--out", type=Path, default=None, help="results/<name> (.md and .json)")
    args = ap.parse_args(argv)
    store = Path(args.dir) / f"synthetic_celeba_{args.n}.zarr"
    prep = ("from dfairpca.celeba import ensure_store; ensure_store(%r, %d)" % (str(store), args.n))
    subprocess.run([sys.executable, "-c", prep], check=True,
                   env=dict(os.environ, PYTHONPATH=str(args.after)))
    versions = {"before": args.before.resolve(), "after": args.after.resolve()}
    runs: list[dict] = []
    rounds = range(args.first_round, args.first_round + args.rounds)
    fits = {f: FITS[f] for f in args.fits}
    for r in rounds:
        order = ["before", "after"] if r % 2 == 0 else ["after", "before"]
        lim = _limit(versions["after"], store, args.n, 400)
        runs.append({"round": r, "version": "limit", "fit": "exact k=400", **lim,
                     "load": os.getloadavg()[0]})
        print(json.dumps(runs[-1]), flush=True)
        for fit, spec in fits.items():
            for v in order:
                comp = Path(args.dir) / f"U_versions_{v}_{spec['k']}.npy"
                res = _child(versions[v], [str(store), str(spec["k"]), json.dumps(spec["params"]),
                                           str(comp)])
                runs.append({"round": r, "version": v, "fit": fit, **res,
                             "load": os.getloadavg()[0], "time": time.strftime("%H:%M:%S")})
                print(json.dumps(runs[-1]), flush=True)
    summary = {}
    for fit, spec in fits.items():
        pairs = [(b["wall_s"], a["wall_s"], b["cpu_s"], a["cpu_s"]) for r in rounds
                 for b in runs if b["round"] == r and b["fit"] == fit and b["version"] == "before"
                 for a in runs if a["round"] == r and a["fit"] == fit and a["version"] == "after"]
        angle = _max_angle(np.load(Path(args.dir) / f"U_versions_before_{spec['k']}.npy"),
                           np.load(Path(args.dir) / f"U_versions_after_{spec['k']}.npy"))
        summary[fit] = {
            "median_wall_ratio": statistics.median(a / b for b, a, _, _ in pairs),
            "median_cpu_ratio": statistics.median(a / b for _, _, b, a in pairs),
            "best_before_s": min(p[0] for p in pairs), "best_after_s": min(p[1] for p in pairs),
            "max_principal_angle_deg": angle,
        }
    print(json.dumps(summary, indent=1))
    if args.out is not None:
        args.out.with_suffix(".json").write_text(json.dumps({"runs": runs, "summary": summary},
                                                            indent=1))
        lines = [f"Command: `python benchmarks/bench_versions.py --before {args.before} "
                 f"--after {args.after} --n {args.n} --rounds {args.rounds}`", "",
                 "| round | version | fit | wall s | CPU s | load (1 min) |", "|---|---|---|---|---|---|"]
        lines += [f"| {x['round']} | {x['version']} | {x['fit']} | {x['wall_s']:.1f} | "
                  f"{x.get('cpu_s', float('nan')):.1f} | {x['load']:.1f} |" for x in runs]
        lines += ["", "| fit | median wall after/before | median CPU after/before | best before s "
                  "| best after s | largest principal angle between the versions' components |",
                  "|---|---|---|---|---|---|"]
        lines += [f"| {f} | {s['median_wall_ratio']:.3f} | {s['median_cpu_ratio']:.3f} | "
                  f"{s['best_before_s']:.1f} | {s['best_after_s']:.1f} | "
                  f"{s['max_principal_angle_deg']:.2g} deg |" for f, s in summary.items()]
        args.out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
