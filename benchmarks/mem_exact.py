"""Peak RSS of an exact fit at the CelebA stack's width, the fit and its solve apart.

    python benchmarks/mem_exact.py STORE [--rows 20000] [--k 400] [--dtype exact]

Memory does not grow with the rows (one running total per worker thread), so a few
chunks of ``STORE`` (a synthetic CelebA stack, :func:`dfairpca.celeba.ensure_store`) show
the peak of the full fit.  Dask's threaded scheduler, one thread per core; RSS of this
process sampled every 20 ms.  Prints one JSON line: the fit's peak, and the peak of its
solve alone (``fit_statistics`` on the fitted statistics, which stay held).
"""

import argparse
import json
import os
import threading
import time

import dask
import psutil

import dfairpca
from dfairpca.celeba import attribute_column


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("store")
    ap.add_argument("--rows", type=int, default=20000)
    ap.add_argument("--k", type=int, default=400)
    ap.add_argument("--dtype", default="exact")
    a = ap.parse_args()
    proc, peak, stop = psutil.Process(), [0], threading.Event()

    def sample():
        while not stop.is_set():
            peak[0] = max(peak[0], proc.memory_info().rss)
            time.sleep(0.02)

    threading.Thread(target=sample, daemon=True).start()
    X = dfairpca.from_zarr(a.store, "images")
    X = X.reshape(X.shape[0], -1)[: a.rows]
    z = attribute_column(a.store, "Eyeglasses")[: a.rows]
    out = {"rows": a.rows, "dtype": a.dtype, "base_gb": proc.memory_info().rss / 1e9, "load": os.getloadavg()[0]}
    with dask.config.set(scheduler="threads", num_workers=os.cpu_count()):
        t, peak[0] = time.perf_counter(), 0
        est = dfairpca.FairPCA(a.k, compute_dtype=a.dtype).fit(X, sensitive_features=z)
        out.update(fit_s=time.perf_counter() - t, fit_peak_gb=peak[0] / 1e9, kernel=est.statistics_kernel_)
        t, peak[0] = time.perf_counter(), 0
        est.fit_statistics(est.statistics_)
        out.update(solve_s=time.perf_counter() - t, solve_peak_gb=peak[0] / 1e9)
    stop.set()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
