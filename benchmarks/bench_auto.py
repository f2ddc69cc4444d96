"""The default fit of uint8 data against the same fit with float32 products, and the limit.

    python benchmarks/bench_auto.py --rows 60000 --features 3000 --k 50 [--rounds 3]
    python benchmarks/bench_auto.py --celeba --rows 202599 --k 400 [--rounds 2]

What ``compute_dtype="auto"`` must hold on every CPU: the default fit of 8-bit data no
slower than ``compute_dtype="float32"`` (it picks exact statistics only where its 8-bit
kernel is not slower, :mod:`dfairpca.stats._auto`).  Each round runs every method in a
fresh process, in turn (rotated from round to round), on Dask's threaded scheduler with
one thread per core, and the best of the rounds is kept (the machine may be shared; the
load average before each run is recorded beside it):

* ``default``: ``FairPCA(k).fit(X, sensitive_features=z)``, what a user gets;
* ``float32``: the same with ``compute_dtype="float32"``;
* ``exact``: the same with ``compute_dtype="exact"`` (what exact statistics would cost);
* ``limit``: bare numpy over the same Zarr chunks: read, centre, float32 ``syrk`` into one
  accumulator, then the top-k eigensolve of the result.

Data: ``--celeba``, the synthetic CelebA stack (80x80 = 6,400 features, the Eyeglasses
attribute; :func:`dfairpca.celeba.ensure_store`); else a low-rank uint8 matrix of
``--rows`` x ``--features`` (rank 64 plus noise, 4,096-row chunks) with a binary group
that shifts the mean.  Peak RSS is the process's own (threads: no children).  Results:
``benchmarks/results/auto_<rows>x<features>.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
METHODS = ("default", "float32", "limit")


class PeakRSS:
    """Peak RSS of this process, sampled every 50 ms in a thread."""

    def __init__(self):
        import psutil

        self.proc, self.peak, self._stop = psutil.Process(), 0, threading.Event()

    def _run(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, self.proc.memory_info().rss)
            time.sleep(0.05)

    def __enter__(self):
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._t.join()
        self.peak = max(self.peak, self.proc.memory_info().rss)


def lowrank_store(path: Path, n: int, d: int, chunk: int = 4096) -> Path:
    """A uint8 Zarr group: ``X`` (n, d), rank 64 plus noise, and ``g`` (n,) binary, whose
    rows shift X's mean (so the fair problem differs from PCA's); reused once written."""
    import zarr

    done = path.with_name(path.name + ".done")  # beside the group: zarr lists what is inside
    if done.exists():
        return path
    rng = np.random.default_rng(0)
    root = zarr.open_group(str(path), mode="w")
    X = root.create_array("X", shape=(n, d), chunks=(chunk, d), dtype="uint8")
    g = root.create_array("g", shape=(n,), chunks=(chunk,), dtype="uint8")
    V = rng.normal(size=(64, d)) * np.linspace(3.0, 0.2, 64)[:, None]
    shift = rng.normal(size=d) * 4
    for s in range(0, n, chunk):
        r = min(chunk, n - s)
        gs = rng.integers(0, 2, size=r)
        x = 128 + 8 * rng.normal(size=(r, 64)) @ V + gs[:, None] * shift + 6 * rng.normal(size=(r, d))
        X[s : s + r] = np.clip(np.rint(x), 0, 255).astype(np.uint8)
        g[s : s + r] = gs
    done.write_text("")
    return path


def data(args):
    """(dask array X of uint8 rows (n, d), groups z)."""
    import dfairpca

    if args.celeba:
        from dfairpca.celeba import attribute_column, ensure_store

        store = ensure_store(Path(args.dir) / f"synthetic_celeba_{args.rows}.zarr", args.rows, progress=False)
        X = dfairpca.from_zarr(store, "images")
        return X.reshape(X.shape[0], -1), attribute_column(store, "Eyeglasses")
    import zarr

    store = lowrank_store(Path(args.dir) / f"lowrank_{args.rows}x{args.features}.zarr", args.rows, args.features)
    return dfairpca.from_zarr(store, "X"), np.asarray(zarr.open_group(str(store), mode="r")["g"][:])


def run_one(args) -> dict:
    """One method in this (fresh) process: its seconds, peak RSS and what it used."""
    import dask

    X, z = data(args)
    out: dict = {"method": args.one, "load_before": os.getloadavg()[0]}
    with PeakRSS() as rss, dask.config.set(scheduler="threads", num_workers=os.cpu_count()):
        t0 = time.perf_counter()
        if args.one == "limit":
            out.update(limit(X, args.k))
        else:
            import dfairpca
            from dfairpca.stats._auto import auto_report

            dtype = {"default": "auto"}.get(args.one, args.one)
            est = dfairpca.FairPCA(args.k, compute_dtype=dtype).fit(X, sensitive_features=z)
            out.update(statistics_kernel=est.statistics_kernel_, svd_solver=est.fitted_svd_solver_,
                       auto=[c["description"] for c in auto_report()])
        out["seconds"] = time.perf_counter() - t0
    out["peak_gb"] = rss.peak / 1e9
    return out


def limit(X, k) -> dict:
    """Read + centre + float32 syrk over X's chunks, then the top-k eigensolve."""
    from dfairpca.base._blas import syrk
    from dfairpca.base._solvers import top_eigh

    d = X.shape[1]
    product = syrk(np.float32)
    acc = np.zeros((d, d), np.float32, order="F")
    t0 = time.perf_counter()
    step = 4096
    for s in range(0, X.shape[0], step):
        x = np.asarray(X[s : s + step])
        product(acc, np.subtract(x, x.mean(0, dtype=np.float64).astype(np.float32), dtype=np.float32))
    t_pass = time.perf_counter() - t0
    S = np.triu(acc.astype(np.float64))
    S += np.triu(S, 1).T
    t1 = time.perf_counter()
    top_eigh(S, k, "auto")
    return {"pass_s": t_pass, "eig_s": time.perf_counter() - t1}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=60000)
    ap.add_argument("--features", type=int, default=3000)
    ap.add_argument("--k", type=int, default=50)
    ap.add_argument("--celeba", action="store_true", help="the synthetic CelebA stack (6,400 features)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--methods", nargs="+", default=list(METHODS))
    ap.add_argument("--dir", default="/tmp/dfairpca-bench")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.celeba:
        args.features = 6400
    if args.one:
        print(json.dumps(run_one(args)))
        return 0
    from dfairpca.base._system import cpu_info

    data(args)  # written once, before any timing
    runs: list[dict] = []
    for r in range(args.rounds):
        order = args.methods[r % len(args.methods):] + args.methods[: r % len(args.methods)]
        for m in order:
            cmd = [sys.executable, __file__, "--one", m, "--rows", str(args.rows), "--features",
                   str(args.features), "--k", str(args.k), "--dir", args.dir] + (["--celeba"] if args.celeba else [])
            res = subprocess.run(cmd, capture_output=True, text=True, check=True)
            run = dict(json.loads(res.stdout.strip().splitlines()[-1]), round=r)
            runs.append(run)
            print(json.dumps(run), flush=True)
    best = {m: min((x for x in runs if x["method"] == m), key=lambda x: x["seconds"]) for m in args.methods}
    info = cpu_info()
    result = {"rows": args.rows, "features": args.features, "k": args.k, "cpu": info,
              "runs": runs, "best": best}
    stem = HERE / "results" / f"auto_{args.rows}x{args.features}"
    stem.with_suffix(".json").write_text(json.dumps(result, indent=1))
    flags = " ".join(f for f, on in info["int8_flags"].items() if on) or "none"
    lines = [f"`python benchmarks/bench_auto.py {' '.join(sys.argv[1:])}`", "",
             f"CPU: {info['model_name']}, {info['cpus']} CPUs, int8 flags: {flags}; best of {args.rounds} "
             "rounds, each method in a fresh process, threaded scheduler", "",
             "| method | best s | x float32 | x limit | peak RSS GB | load before | products | all rounds s |",
             "|---|---|---|---|---|---|---|---|"]
    ref_f = best["float32"]["seconds"] if "float32" in best else None
    ref_l = best["limit"]["seconds"] if "limit" in best else None
    for m, b in best.items():
        s = b["seconds"]
        rounds = ", ".join(f"{x['seconds']:.1f} (load {x['load_before']:.1f})" for x in runs if x["method"] == m)
        kernel = b.get("statistics_kernel", "float32 syrk")
        lines.append(f"| {m} | {s:.1f} | {s / ref_f:.2f} | {s / ref_l:.2f} | {b['peak_gb']:.2f} | "
                     f"{b['load_before']:.1f} | {kernel} | {rounds} |" if ref_f and ref_l else
                     f"| {m} | {s:.1f} | | | {b['peak_gb']:.2f} | {b['load_before']:.1f} | {kernel} | {rounds} |")
    autos = sorted({a for x in runs for a in x.get("auto", [])})
    lines += ["", "auto's measurements in the runs:"] + [f"- {a}" for a in autos]
    stem.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
