"""Speed and memory of FairPCA.fit at CelebA scale, against the machine's limit and peers.

    python benchmarks/bench_fit.py --n 60000 202599 [--k 400] [--dir /tmp/dfairpca-bench]

For every n it makes (or reuses) a synthetic CelebA stack (uint8, 80x80 = 6,400 features)
and runs each method in a fresh subprocess, sampling the resident memory of that process
and all its children (the Dask workers) every 50 ms.  Measured in the same run:

* limit: bare numpy over the same Zarr chunks: read, centre, float32 ``syrk`` into one
  accumulator (BLAS at its best block size), plus the top-k eigensolve of the result;
* dfairpca: ``FairPCA(k).fit`` (Eyeglasses) out of core, on a local distributed cluster
  (2 worker processes x 1 thread) and on Dask's threaded scheduler;
* peers: dask-ml PCA (tsqr, randomized), scikit-learn IncrementalPCA (partial_fit over
  the chunks), scikit-learn PCA on the in-memory float32 array, and the paper's own
  approach in memory (dense numpy fair PCA with an explicit null-space basis R).

Accuracy: every method's components are scored by the variance they capture,
``trace(U^T S U)`` with S the float64 covariance, against the optimum of their own problem
(PCA or fair PCA, float64 dense solve), and by the fairness constraint ``max |U q|``.

Results (markdown table + JSON) go to ``benchmarks/results/``.
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
D = 6400
ATTR = "Eyeglasses"


# ----------------------------------------------------------------------------- helpers
class PeakRSS:
    """Peak of the summed RSS of this process and its children, sampled in a thread, and the
    peak of each process on its own (``by_process``: this one first, then children)."""

    def __init__(self, interval=0.05):
        import psutil

        self.proc, self.interval, self.peak = psutil.Process(), interval, 0
        self.by_process: dict[int, int] = {}
        self._stop = threading.Event()

    def _total(self):
        total = 0
        for p in [self.proc, *self.proc.children(recursive=True)]:
            try:
                rss = p.memory_info().rss
            except Exception:
                continue
            total += rss
            self.by_process[p.pid] = max(self.by_process.get(p.pid, 0), rss)
        return total

    def __enter__(self):
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()
        return self

    def _run(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, self._total())
            time.sleep(self.interval)

    def __exit__(self, *exc):
        self._stop.set()
        self._t.join()
        self.peak = max(self.peak, self._total())


def store_path(args, n):
    return Path(args.dir) / f"synthetic_celeba_{n}.zarr"


def load_dense(store, n, dtype=np.float32):
    import zarr

    im = zarr.open_group(str(store), mode="r")["images"]
    out = np.empty((n, D), dtype)
    step = im.chunks[0] * 4
    for s in range(0, n, step):
        out[s : s + step] = im[s : s + step].reshape(-1, D)
    return out


def groups(store):
    from dfairpca.celeba import attribute_column

    return attribute_column(store, ATTR)


# ----------------------------------------------------------------------------- methods
def m_limit(store, n, k):
    """Read + centre + float32 syrk over the chunks, then the top-k eigensolve."""
    import scipy.linalg.blas as blas
    import zarr

    from dfairpca.base._solvers import top_eigh

    im = zarr.open_group(str(store), mode="r")["images"]
    rows = 4096
    t0 = time.perf_counter()
    acc = np.zeros((D, D), np.float32, order="F")
    for s in range(0, n, rows):
        x = im[s : s + rows].reshape(-1, D)
        xc = np.subtract(x, x.mean(0, dtype=np.float64).astype(np.float32), dtype=np.float32)
        acc = blas.ssyrk(1.0, xc.T, beta=1.0, c=acc, trans=0, lower=0, overwrite_c=1)
    t_pass = time.perf_counter() - t0
    S = np.triu(acc.astype(np.float64))
    S += np.triu(S, 1).T
    t1 = time.perf_counter()
    top_eigh(S, k, "auto")  # the fastest accurate solver here (benchmarks/eigensolvers.py)
    t_eig = time.perf_counter() - t1
    return {"pass_s": t_pass, "eig_s": t_eig, "gflops": 2 * n * D * D / t_pass / 1e9}


def save_components(store, U, tag):
    """Components for the accuracy column, computed by the driver afterwards."""
    np.save(Path(store).parent / f"U_{tag}_{Path(store).stem}.npy", np.asarray(U, np.float64))


def _fit_dfairpca(store, n, k, tag, solver="auto", dtype="auto"):
    import dfairpca

    X = dfairpca.from_zarr(store, "images")
    z = groups(store)
    t0 = time.perf_counter()
    est = dfairpca.FairPCA(k, svd_solver="full", eigen_solver=solver, compute_dtype=dtype).fit(
        X, sensitive_features=z)
    total = time.perf_counter() - t0
    t1 = time.perf_counter()
    est.fit_statistics(est.statistics_)  # the local solve alone
    save_components(store, est.components_, tag)
    return est, {"fit_s": total, "solve_s": time.perf_counter() - t1}


def m_dfairpca_cluster(store, n, k):
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                      dashboard_address=None) as c, Client(c):
        est, t = _fit_dfairpca(store, n, k, "dfairpca_cluster")
    return t


def m_dfairpca_threads(store, n, k):
    import dask

    with dask.config.set(scheduler="threads", num_workers=2):
        est, t = _fit_dfairpca(store, n, k, "dfairpca_threads")
    return t


def m_daskml(store, n, k, solver):
    from dask_ml.decomposition import PCA

    import dfairpca

    X = dfairpca.from_zarr(store, "images").reshape(n, D).astype(np.float32)
    X = X.rechunk({0: 4096, 1: -1})
    t0 = time.perf_counter()
    est = PCA(n_components=k, svd_solver=solver, random_state=0).fit(X)
    t = time.perf_counter() - t0
    save_components(store, est.components_, f"daskml_{solver}")
    return {"fit_s": t}


def m_ipca(store, n, k):
    import zarr
    from sklearn.decomposition import IncrementalPCA

    im = zarr.open_group(str(store), mode="r")["images"]
    rows = 4096
    t0 = time.perf_counter()
    ipca = IncrementalPCA(n_components=k)
    for s in range(0, n, rows):
        ipca.partial_fit(im[s : s + rows].reshape(-1, D).astype(np.float32))
    t = time.perf_counter() - t0
    save_components(store, ipca.components_, "ipca")
    return {"fit_s": t}


def m_sklearn(store, n, k, solver):
    from sklearn.decomposition import PCA

    X = load_dense(store, n)
    t0 = time.perf_counter()
    est = PCA(n_components=k, svd_solver=solver, random_state=0).fit(X)
    t = time.perf_counter() - t0
    save_components(store, est.components_, f"sklearn_{solver}")
    return {"fit_s": t, "note": "data loaded before timing"}


def m_paper(store, n, k):
    """The paper's reference approach, in memory: explicit null space R, R^T X^T X R."""
    import scipy.linalg

    X = load_dense(store, n, np.float64)
    z = groups(store).astype(np.float64)
    t0 = time.perf_counter()
    X -= X.mean(0)
    zc = z - z.mean()
    R = scipy.linalg.null_space((zc @ X)[None, :])
    H = R.T @ (X.T @ X) @ R
    s = H.shape[0]
    _, L = scipy.linalg.eigh(H, subset_by_index=[s - k, s - 1])
    U = R @ L
    t = time.perf_counter() - t0
    save_components(store, U.T, "paper")
    return {"fit_s": t, "note": "data loaded before timing"}


#: which saved components belong to which method, and whether the problem is fair PCA
TAGS = {
    "dfairpca (local cluster, 2 procs)": ("dfairpca_cluster", True),
    "dfairpca (threads)": ("dfairpca_threads", True),
    "dask-ml PCA tsqr": ("daskml_tsqr", False),
    "dask-ml PCA randomized": ("daskml_randomized", False),
    "sklearn IncrementalPCA": ("ipca", False),
    "sklearn PCA covariance_eigh (in memory)": ("sklearn_covariance_eigh", False),
    "sklearn PCA randomized (in memory)": ("sklearn_randomized", False),
    "paper's fair PCA (in memory, float64)": ("paper", True),
}

METHODS = {
    "limit": m_limit,
    "dfairpca (local cluster, 2 procs)": m_dfairpca_cluster,
    "dfairpca (threads)": m_dfairpca_threads,
    "dask-ml PCA tsqr": lambda s, n, k: m_daskml(s, n, k, "tsqr"),
    "dask-ml PCA randomized": lambda s, n, k: m_daskml(s, n, k, "randomized"),
    "sklearn IncrementalPCA": m_ipca,
    "sklearn PCA covariance_eigh (in memory)": lambda s, n, k: m_sklearn(s, n, k, "covariance_eigh"),
    "sklearn PCA randomized (in memory)": lambda s, n, k: m_sklearn(s, n, k, "randomized"),
    "paper's fair PCA (in memory, float64)": m_paper,
}


def run_one(method, store, n, k):
    with PeakRSS() as mem:
        res = METHODS[method](store, n, k)
    res["peak_rss_gb"] = mem.peak / 2**30
    # every process above 100 MB (the client first, then e.g. the Dask workers)
    res["peak_by_process_gb"] = [v / 2**30 for v in mem.by_process.values() if v > 100 << 20]
    return res


# ----------------------------------------------------------------------------- driver
def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, nargs="+", default=[60000, 202599])
    ap.add_argument("--k", type=int, default=400)
    ap.add_argument("--dir", default="/tmp/dfairpca-bench")
    ap.add_argument("--methods", nargs="*", default=list(METHODS))
    ap.add_argument("--timeout", type=float, default=1800, help="seconds per method")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    ap.add_argument("--out", default=str(HERE / "results" / "fit"))
    args = ap.parse_args(argv)
    if args.one:  # child process: one method, JSON on the last line
        n = args.n[0]
        print(json.dumps(run_one(args.one, store_path(args, n), n, args.k)))
        return
    from dfairpca.celeba import ensure_store

    rows = []
    for n in args.n:
        store = ensure_store(store_path(args, n), n, progress=False)
        for method in args.methods:
            cmd = [sys.executable, __file__, "--one", method, "--n", str(n), "--k", str(args.k),
                   "--dir", args.dir]
            res = measured(cmd, args.timeout)
            res.update(method=method, n=n)
            print(json.dumps(res), flush=True)
            rows.append(res)
        accuracy(store, n, args.k, [r for r in rows if r["n"] == n])
    write(rows, args)


def measured(cmd, timeout: float, max_rss_gb: float | None = None) -> dict:
    """The JSON result a ``--one`` child prints last, or ``{"error": ...}``: the last line
    of its stderr, or that it ran over ``timeout`` seconds or (``max_rss_gb``) that its
    process tree's resident memory passed that many GB, when it is stopped before the
    machine runs out (each method in its own process, so that one's peak memory and
    threads do not count against the next)."""
    import tempfile

    import psutil

    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        p = subprocess.Popen(cmd, stdout=out, stderr=err, text=True, start_new_session=True)
        start, over = time.monotonic(), None
        while p.poll() is None:
            if time.monotonic() - start > timeout:
                over = f"over {timeout:.0f} s"
            elif max_rss_gb is not None:
                try:
                    tree = [psutil.Process(p.pid), *psutil.Process(p.pid).children(recursive=True)]
                    rss = sum(q.memory_info().rss for q in tree) / 2**30
                except psutil.Error:
                    rss = 0.0
                if rss > max_rss_gb:
                    over = f"stopped at {rss:.1f} GB resident (limit {max_rss_gb:g} GB)"
            if over:
                os.killpg(p.pid, 9)
                p.wait()
                return {"error": over}
            time.sleep(0.2)
        out.seek(0), err.seek(0)
        stdout, stderr = out.read(), err.read()
    if p.returncode == 0:
        return json.loads(stdout.strip().splitlines()[-1])
    return {"error": (stderr.strip().splitlines() or ["failed"])[-1][:200]}


def accuracy(store, n, k, rows):
    """Captured variance of every method against the float64 optimum of its own problem."""
    import dask

    import dfairpca

    with dask.config.set(scheduler="threads"):
        ref = dfairpca.FairPCA(k, svd_solver="full", compute_dtype="float64", eigen_solver="dense").fit(
            dfairpca.from_zarr(store, "images"), sensitive_features=groups(store))
    m = ref.statistics_
    S = m.scatter / (m.n - 1)
    captured = lambda U: float(np.sum((U @ S) * U))
    opt = {True: captured(ref.components_),
           False: captured(dfairpca.PCA(k, eigen_solver="dense").fit_statistics(m).components_)}
    q = ref.constraint_basis_
    for r in rows:
        tag = TAGS.get(r["method"])
        f = Path(store).parent / f"U_{tag[0]}_{Path(store).stem}.npy" if tag else None
        if f is None or not f.exists() or "error" in r:
            continue
        U = np.load(f)
        U = np.linalg.qr(U.T)[0].T  # orthonormalise (randomized SVDs are not exactly)
        r["gap"] = (opt[tag[1]] - captured(U)) / opt[tag[1]]
        r["fair"] = float(np.abs(U @ q).max())
        f.unlink()


def write(rows, args):
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(rows, indent=1))
    cmd = f"python benchmarks/bench_fit.py --n {' '.join(map(str, args.n))} --k {args.k}"
    if args.methods != list(METHODS):
        cmd += " --methods " + " ".join(f'"{m}"' if " " in m else m for m in args.methods)
    if Path(args.out).resolve() != (HERE / "results" / "fit").resolve():
        cmd += f" --out {os.path.relpath(args.out, HERE.parent)}"
    lines = [
        f"Command: `{cmd}`",
        "",
        "| n | method | wall s | ratio to limit | peak RSS GB | captured variance gap to optimum | max abs(U q) | note |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for n in args.n:
        lim = next((r for r in rows if r["n"] == n and r["method"] == "limit" and "error" not in r), None)
        limit = lim["pass_s"] + lim["eig_s"] if lim else None
        for r in (r for r in rows if r["n"] == n):
            if "error" in r:
                lines.append(f"| {n:,} | {r['method']} | — | — | — | — | — | {r['error']} |")
                continue
            t = r["pass_s"] + r["eig_s"] if r["method"] == "limit" else r["fit_s"]
            if r["method"] == "limit":
                note = f"pass {r['pass_s']:.1f} s ({r['gflops']:.0f} GFLOP/s) + eigensolve {r['eig_s']:.1f} s"
            elif "solve_s" in r:
                note = f"pass {t - r['solve_s']:.1f} s + solve {r['solve_s']:.1f} s"
                per = r.get("peak_by_process_gb", [])
                if len(per) > 1:
                    note += f"; peaks: client {per[0]:.2f}" + "".join(
                        f", worker {v:.2f}" for v in per[1:]) + " GB"
            else:
                note = r.get("note", "")
            ratio = f"{t / limit:.2f}" if limit else "—"
            gap = f"{r['gap']:.1e}" if "gap" in r else "—"
            fair = f"{r['fair']:.0e}" if "fair" in r else "—"
            lines.append(f"| {n:,} | {r['method']} | {t:.1f} | {ratio} | {r['peak_rss_gb']:.2f} | {gap} | {fair} | {note} |")
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
