"""Fair PCA-S (equalize_covariance) against plain fair PCA: one pass each, time and memory.

    python benchmarks/bench_fair_pca_s.py [--n 60000] [--k 400] [--dir /tmp/dfairpca-bench]

Fits FairPCA(k) and FairPCA(k, equalize_covariance=0.5) (Eyeglasses) on the synthetic CelebA
stack from Zarr with Dask's threaded scheduler (2 threads), each in a fresh process, and
reports wall time and the peak RSS sampled every 50 ms.  Fair PCA-S also accumulates one
d x d scatter matrix per group in the same pass, so its pass does about three times the
products of plain fair PCA (all rows, then each group's rows).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def one(store: str, k: int, equalize) -> dict:
    import dask
    import psutil

    import dfairpca
    from dfairpca.celeba import attribute_column

    me, peak, stop = psutil.Process(), [0], threading.Event()

    def sample():
        while not stop.is_set():
            peak[0] = max(peak[0], me.memory_info().rss)
            time.sleep(0.05)

    threading.Thread(target=sample, daemon=True).start()
    X = dfairpca.from_zarr(store, "images")
    z = attribute_column(store, "Eyeglasses")
    t0 = time.perf_counter()
    with dask.config.set(scheduler="threads", num_workers=2):
        est = dfairpca.FairPCA(k, svd_solver="full", equalize_covariance=equalize).fit(
            X, sensitive_features=z)
    wall = time.perf_counter() - t0
    stop.set()
    return {"wall_s": wall, "peak_rss_gb": max(peak[0], me.memory_info().rss) / 2**30,
            "components": int(est.n_components_)}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=60000)
    ap.add_argument("--k", type=int, default=400)
    ap.add_argument("--dir", default="/tmp/dfairpca-bench")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    ap.add_argument("--out", default=str(HERE / "results" / "fair_pca_s.md"))
    args = ap.parse_args(argv)
    store = Path(args.dir) / f"synthetic_celeba_{args.n}.zarr"
    if args.one is not None:
        print(json.dumps(one(str(store), args.k, None if args.one == "none" else float(args.one))))
        return
    from dfairpca.celeba import ensure_store

    ensure_store(store, args.n, progress=False)
    rows = []
    for eq in ("none", "0.5"):
        p = subprocess.run([sys.executable, __file__, "--one", eq, "--n", str(args.n), "--k",
                            str(args.k), "--dir", args.dir], capture_output=True, text=True,
                           check=True)
        rows.append((eq, json.loads(p.stdout.strip().splitlines()[-1])))
    lines = [f"Command: `python benchmarks/bench_fair_pca_s.py --n {args.n} --k {args.k}`", "",
             "| method | wall s | peak RSS GB |", "|---|---|---|"]
    for eq, r in rows:
        name = "FairPCA" if eq == "none" else f"FairPCA, equalize_covariance={eq} (Fair PCA-S)"
        lines.append(f"| {name} | {r['wall_s']:.1f} | {r['peak_rss_gb']:.2f} |")
    Path(args.out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
