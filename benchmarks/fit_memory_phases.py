"""Where the default fit's peak memory comes from: its RSS sampled every 10 ms, and the peak
between the phases of the fit (the pass, completing its statistics, the solve).

    python benchmarks/fit_memory_phases.py STORE [--rows 60000] [--k 400]

``STORE`` is a synthetic CelebA stack (:func:`dfairpca.celeba.ensure_store`); the fit is
``FairPCA(k).fit`` of its first ``--rows`` faces against Eyeglasses on Dask's threaded
scheduler, one thread per core, as ``benchmarks/bench_auto.py``'s default.  The peak is
the pass's state once each of its chains folds its second row chunk (10,240 rows of the
stack): 20,000 rows give each chain one and understate it (1.16-1.29 GB against 1.50 at
60,000 on the same CPU before the pass's blocks shrank).  Prints the fit's
peak and when it came, then the peak before each phase mark.
"""

from __future__ import annotations

import argparse
import os
import threading
import time


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("store")
    ap.add_argument("--rows", type=int, default=60000)
    ap.add_argument("--k", type=int, default=400)
    a = ap.parse_args()

    import dask
    import numpy as np
    import psutil

    import dfairpca
    import dfairpca.decomposition._fair as fair
    from dfairpca.base import _solvers
    from dfairpca.celeba import attribute_column
    from dfairpca.engine import _accumulator
    from dfairpca.solve import _solution

    proc, samples, marks, stop = psutil.Process(), [], [], threading.Event()

    def sample():
        while not stop.is_set():
            samples.append((time.perf_counter(), proc.memory_info().rss))
            time.sleep(0.01)

    def marked(owner, name):
        f = getattr(owner, name)

        def call(*args, **kw):
            marks.append((time.perf_counter(), f"begin {name}"))
            try:
                return f(*args, **kw)
            finally:
                marks.append((time.perf_counter(), f"end {name}"))

        setattr(owner, name, call)
        return call

    marked(_accumulator.RunningTotal, "finalize")
    fair.exact_fair_solution = marked(_solution, "exact_fair_solution")
    marked(_solvers, "subspace_iteration")
    threading.Thread(target=sample, daemon=True).start()
    X = dfairpca.from_zarr(a.store, "images")
    X = X.reshape(X.shape[0], -1)[: a.rows]
    z = attribute_column(a.store, "Eyeglasses")[: a.rows]
    t0 = time.perf_counter()
    with dask.config.set(scheduler="threads", num_workers=os.cpu_count()):
        est = dfairpca.FairPCA(a.k).fit(X, sensitive_features=z)
    marks.append((time.perf_counter(), "end fit"))
    time.sleep(0.05)
    stop.set()
    ts = np.array([s[0] for s in samples])
    rss = np.array([s[1] for s in samples]) / 1e9
    print(f"{a.rows:,} x {X.shape[1]:,}, k = {a.k}: {est.statistics_kernel_} products, "
          f"{est.fitted_svd_solver_}, {marks[-1][0] - t0:.1f} s, load {os.getloadavg()[0]:.1f}")
    print(f"peak {rss.max():.3f} GB at {ts[rss.argmax()] - t0:.1f} s")
    prev = t0
    for t, m in sorted(marks):
        sel = (ts >= prev) & (ts <= t)
        if sel.any():
            print(f"{t - t0:8.2f} s  {m:28s} peak since the mark before: {rss[sel].max():.3f} GB")
        prev = t


if __name__ == "__main__":
    main()
