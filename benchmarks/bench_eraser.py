"""ConceptEraser (LEACE) fit and transform from a Zarr store, against the float32 limit of
the same data, and the ``concept-erasure`` package where it is installed.

    python benchmarks/bench_eraser.py [--n 202599] [--size 80] [--dir /tmp/dfairpca-bench]

* The float32 limit: the one pass of the statistics with float32 products (what FairPCA
  runs on uint8 faces by default), the cheapest pass that forms the d x d scatter.
* Fit: ``ConceptEraser().fit`` (compute_dtype="auto": float64 products, or exact integer
  sums for 8-bit pixels where that kernel runs), split into its pass and its solve
  (``fit_statistics`` of the same statistics: the d x d eigendecomposition).
* Transform: the erased store written to Zarr (lazy ``transform`` then ``to_zarr``),
  against a bare numpy loop over the same chunks doing the same arithmetic.
* Peer: ``concept_erasure.LeaceFitter`` on the data in memory (float32 torch tensors), if
  torch and concept-erasure import; otherwise the report says it was not measured.

Peak memory is this process's ``ru_maxrss`` (threads scheduler: one process).  Writes
``benchmarks/results/eraser_<n>.md``.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

import dfairpca
from dfairpca.celeba import attribute_column

HERE = Path(__file__).resolve().parent


def timed(f):
    t0 = time.perf_counter()
    out = f()
    return out, time.perf_counter() - t0


def peer(X: np.ndarray, z: np.ndarray) -> str:
    """The concept-erasure package's fit on X in memory, or why it was not measured."""
    try:
        import torch
        from concept_erasure import LeaceFitter
    except ImportError as exc:
        return f"not measured: {exc.name} is not installed (concept-erasure needs torch)"
    x = torch.from_numpy(X.astype(np.float32))
    onehot = torch.nn.functional.one_hot(torch.from_numpy(z.astype(np.int64)), 2).float()
    t0 = time.perf_counter()
    fitter = LeaceFitter(x.shape[1], 2, dtype=torch.float64)
    for s in range(0, len(x), 4096):
        fitter.update(x[s : s + 4096], onehot[s : s + 4096])
    _ = fitter.eraser  # the solve (a property: computed on access)
    return f"{time.perf_counter() - t0:.1f} s (LeaceFitter, float64 statistics, in memory)"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=202_599)
    ap.add_argument("--size", type=int, default=80, help="faces are SIZE x SIZE (d = SIZE^2)")
    ap.add_argument("--dir", default="/tmp/dfairpca-bench")
    args = ap.parse_args(argv)
    import dask
    import zarr

    from dfairpca.celeba import ensure_store

    store = ensure_store(Path(args.dir) / f"synthetic_celeba_{args.n}_{args.size}.zarr", args.n,
                         size=args.size, progress=False)
    z = attribute_column(store, "Eyeglasses")
    X = dfairpca.from_zarr(store, "images")
    n, d = X.shape[0], int(np.prod(X.shape[1:]))
    out = Path(tempfile.mkdtemp(dir=args.dir))
    with dask.config.set(scheduler="threads"):
        flat = X.reshape(n, d)
        _, t32 = timed(lambda: dfairpca.compute_moments(flat, sensitive_features=z, dtype=np.float32))
        est, t_fit = timed(lambda: dfairpca.ConceptEraser().fit(X, sensitive_features=z))
        _, t_solve = timed(lambda: dfairpca.ConceptEraser().fit_statistics(est.statistics_))
        Y = est.transform(X)
        _, t_write = timed(lambda: Y.to_zarr(str(out / "erased.zarr")))
        im = zarr.open_group(str(store), mode="r")["images"]
        mu, L, R = (a.astype(np.float32) for a in (est.mean_, est.proj_left_, est.proj_right_))
        rows = X.chunks[0][0]

        def bare():
            sink = zarr.create_array(str(out / "bare.zarr"), shape=(n, d), chunks=(rows, d),
                                     dtype="f4")
            for s in range(0, n, rows):
                x = im[s : s + rows].reshape(-1, d).astype(np.float32)
                sink[s : s + rows] = x - ((x - mu) @ R.T) @ L.T

        _, t_bare = timed(bare)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB -> GiB
    erased = zarr.open_array(str(out / "erased.zarr"), mode="r")
    check = np.abs(erased[:rows].reshape(rows, d) - zarr.open_array(str(out / "bare.zarr"))[:rows])
    assert check.max() <= 1e-3 * 255, check.max()
    peer_line = peer(np.asarray(X.reshape(n, d)[: min(n, 60_000)]), z[: min(n, 60_000)]) \
        if n * d * 4 < 8 << 30 else "not measured: the data does not fit in this machine's memory"
    shutil.rmtree(out)
    gb = n * d / 1e9  # uint8 bytes read per pass
    lines = [
        f"# ConceptEraser, {n:,} x {d:,} synthetic faces from Zarr", "",
        f"Command: `python benchmarks/bench_eraser.py --n {args.n} --size {args.size}`", "",
        "| step | seconds | note |", "|---|---|---|",
        f"| the float32 limit: one statistics pass, float32 products | {t32:.1f} | "
        f"{gb / t32:.2f} GB/s of uint8 read |",
        f"| ConceptEraser().fit (pass + solve) | {t_fit:.1f} | {est.statistics_kernel_} statistics; "
        f"{t_fit / t32:.2f}x the float32 limit |",
        f"| of which the solve (fit_statistics: d x d eigh) | {t_solve:.1f} | support {est.support_rank_} "
        f"of {d}, {est.n_constraints_} direction(s) erased, certificate {est.fairness_violation_:.1e} |",
        f"| transform to Zarr (lazy, then to_zarr) | {t_write:.1f} | float32 output, X's chunks |",
        f"| bare numpy loop, same arithmetic | {t_bare:.1f} | |",
        f"| peer: concept-erasure LeaceFitter (first {min(n, 60_000):,} rows) | | {peer_line} |",
        "", f"Peak RSS of this process: {peak:.2f} GiB (threads scheduler).  Load average "
        f"over the last minute when it ended: {os.getloadavg()[0]:.1f} on {os.cpu_count()} "
        "CPUs (above the CPU count, the times measure the other work as much as this).", "",
    ]
    path = HERE / "results" / f"eraser_{n}.md"
    path.write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
