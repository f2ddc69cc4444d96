"""Cost and accuracy of exact integer statistics (``compute_dtype="exact"``) against float32.

    python benchmarks/bench_exact.py [--rows 202599] [--k 400] [--dir /tmp/dfairpca-bench]

On the synthetic CelebA stack (uint8, 80x80 = 6,400 features, the Eyeglasses attribute as
the binary group; :func:`dfairpca.celeba.ensure_store`), in one run and on Dask's threaded
scheduler with one thread per core:

* ``float32``: the pass of ``FairPCA(k, compute_dtype="float32").fit`` (today's default
  for uint8);
* ``exact-portable``: ``compute_dtype="exact"`` with the portable kernel (float32 BLAS
  blocks of 1,024 rows, every 8-bit integer kernel withdrawn);
* ``exact-int8``: ``compute_dtype="exact"`` with the first 8-bit integer kernel that passes
  its self-test here (MKL's ``cblas_gemm_s8u8s32`` with ``dfairpca[mkl]``), if any;
* ``limit``: bare numpy over the same Zarr chunks: read, centre, float32 ``syrk`` into one
  accumulator (the float32 machine limit of the pass), no solve;
* ``default``: the whole default fit, ``FairPCA(k).fit(X, sensitive_features=z)``
  (``compute_dtype="auto"``: exact where an 8-bit kernel passes its self-test here, else
  float32), pass and solve, against the limit's pass: the figure a user waits for;
* ``chunk``: one 4,096-row chunk's sums, float32 and exact (portable) alternately
  ``--chunk-repeat`` times in one thread: on a shared machine the fairest ratio.

A fit is its pass (``compute_moments``, timed) then its local solve (``fit_statistics``,
timed once per path: the same eigenproblem for all); the passes run interleaved
``--repeat`` times and the fastest of each is kept (the machine may be shared).  Accuracy: the float32 statistics' largest scatter error relative to
the largest exact entry, and the largest principal angle between the float32 and exact
components.  The CPU's model name and its int8 flags (amx_int8, avx512_vnni, avx_vnni) are
recorded: without them, MKL's int8 GEMM saturates and its self-test refuses it.  The JSON
result goes to ``benchmarks/results/exact_<rows>.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
D = 6400
ATTR = "Eyeglasses"


def cpu_info() -> dict:
    """Model name, usable CPUs and the int8 dot-product flags of this machine's CPU, and the
    platform (dfairpca's own report: :func:`dfairpca.base._system.cpu_info`)."""
    from dfairpca.base._system import cpu_info as info

    return {**info(), "platform": platform.platform()}


def default_fit(X, z, k) -> tuple:
    """The default fit, pass and solve: (FairPCA, seconds)."""
    import dfairpca

    t0 = time.perf_counter()
    est = dfairpca.FairPCA(k).fit(X, sensitive_features=z)
    return est, time.perf_counter() - t0


def statistics(X, z, dtype) -> tuple:
    """The pass alone: (Moments, seconds)."""
    import dfairpca

    t0 = time.perf_counter()
    m = dfairpca.compute_moments(X, sensitive_features=z, dtype=dtype)
    return m, time.perf_counter() - t0


def solve(m, k):
    """The local solve of a fit from its statistics: (FairPCA, seconds)."""
    import dfairpca

    t0 = time.perf_counter()
    est = dfairpca.FairPCA(k, svd_solver="full").fit_statistics(m)
    return est, time.perf_counter() - t0


def limit(store, n):
    """Read + centre + float32 syrk over the chunks (the float32 pass at the machine's limit)."""
    import zarr

    from dfairpca.base._blas import syrk

    im = zarr.open_group(str(store), mode="r")["images"]
    rows = 4096
    product = syrk(np.float32)
    t0 = time.perf_counter()
    acc = np.zeros((D, D), np.float32, order="F")
    for s in range(0, n, rows):
        x = im[s : s + rows].reshape(-1, D)
        xc = np.subtract(x, x.mean(0, dtype=np.float64).astype(np.float32), dtype=np.float32)
        acc = product(acc, xc)
    t = time.perf_counter() - t0
    return {"pass_s": t, "gflops": n * D * D / t / 1e9}  # syrk: n d^2 multiply-adds (upper half)


def chunk_kernels(store, repeat: int, rows: int = 4096) -> dict:
    """One chunk's sums (``rows`` x 6,400 uint8, one thread of the pass), float32 and exact
    alternately ``repeat`` times: the load of a shared machine then hits both alike."""
    import zarr

    from dfairpca.stats._chunk import chunk_sums

    x = np.asarray(zarr.open_group(str(store), mode="r")["images"][:rows]).reshape(-1, D)
    codes = (np.arange(len(x)) % 2)[:, None]
    out: dict = {"rows": len(x), "float32_s": [], "exact_s": []}
    for dtype in (np.float32, "exact"):  # warm up: the kernels' self-tests run at first use
        chunk_sums(x[:64], codes[:64], [np.arange(2)], mask=None, row_offset=0, dtype=dtype,
                   group_scatter=False)
    for _ in range(repeat):
        for name, dtype in (("float32_s", np.float32), ("exact_s", "exact")):
            t0 = time.perf_counter()
            chunk_sums(x, codes, [np.arange(2)], mask=None, row_offset=0, dtype=dtype, group_scatter=False)
            out[name].append(time.perf_counter() - t0)
    if repeat:
        ratios = [e / f for e, f in zip(out["exact_s"], out["float32_s"])]
        out["exact_to_float32_median"] = float(np.median(ratios))
        out["exact_to_float32_of_bests"] = min(out["exact_s"]) / min(out["float32_s"])
    return out


def max_angle_deg(A, B) -> float:
    """Largest principal angle between the row spaces of A and B (degrees)."""
    Qa, _ = np.linalg.qr(A.T)
    Qb, _ = np.linalg.qr(B.T)
    s = np.linalg.svd(Qa.T @ Qb, compute_uv=False)
    return float(np.degrees(np.arccos(np.clip(s.min(), -1, 1))))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=202599)
    ap.add_argument("--k", type=int, default=400)
    ap.add_argument("--dir", default="/tmp/dfairpca-bench")
    ap.add_argument("--repeat", type=int, default=2, help="interleaved runs of every method (best kept)")
    ap.add_argument("--chunk-repeat", type=int, default=5,
                    help="alternations of one chunk's float32 and exact sums (0: none)")
    ap.add_argument("--out", default=None, help="JSON file (default results/exact_<rows>.json)")
    ap.add_argument("--no-portable", action="store_true",
                    help="leave out the exact pass with the portable kernel (the slowest)")
    args = ap.parse_args(argv)

    import dask

    import dfairpca
    from dfairpca.celeba import attribute_column, ensure_store
    from dfairpca.stats import _int_kernels as ik
    from dfairpca.stats._exact import kernel_name

    n, k = args.rows, args.k
    store = ensure_store(Path(args.dir) / f"synthetic_celeba_{n}.zarr", n, progress=False)
    X = dfairpca.from_zarr(store, "images").reshape(n, D)  # what a fit flattens
    z = attribute_column(store, ATTR)
    result = {"rows": n, "features": D, "k": k, "cpu": cpu_info(), "threads": os.cpu_count(),
              "load_before": os.getloadavg(),
              "int8_kernel": ik.int8_kernel_available(), "methods": {}}
    runs = {}
    withdrawn = list(ik._REGISTERED)
    for kern in withdrawn:  # the chunk comparison: the portable exact path
        ik.unregister(kern.name)
    result["chunk"] = chunk_kernels(store, args.chunk_repeat)
    print(json.dumps({"chunk": result["chunk"]}), flush=True)

    def kernels(on: bool):
        """The optional 8-bit kernels offered (on) or withdrawn (the portable path alone)."""
        for kern in withdrawn:
            ik.register(kern, first=False) if on else ik.unregister(kern.name)

    plan = [("float32", "float32", True)] + ([] if args.no_portable else [("exact-portable", "exact", False)])
    if result["int8_kernel"]:
        plan.insert(1, ("exact-int8", "exact", True))
    times: dict = {}
    moments: dict = {}
    with dask.config.set(scheduler="threads", num_workers=os.cpu_count()):
        # the passes interleaved and repeated: on a shared machine the best is the cost
        for _ in range(args.repeat):
            times.setdefault("limit", []).append(limit(store, n)["pass_s"])
            for name, dtype, on in plan:
                kernels(on)
                moments[name], t = statistics(X, z, dtype)
                times.setdefault(name, []).append(t)
            kernels(True)
            default, t = default_fit(X, z, k)
            times.setdefault("default", []).append(t)
            print(json.dumps(times), flush=True)
    result["methods"]["limit"] = {"pass_s": min(times["limit"]), "pass_s_all": times["limit"],
                                  "gflops": n * D * D / min(times["limit"]) / 1e9}
    for name, _, _ in plan:
        est, t_solve = solve(moments[name], k)  # the same solve for every path
        runs[name] = (est, {"pass_s": min(times[name]), "pass_s_all": times[name], "solve_s": t_solve,
                            "fit_s": min(times[name]) + t_solve,
                            "statistics_kernel": kernel_name(moments[name])})
        result["methods"][name] = runs[name][1]
        print(json.dumps({name: runs[name][1]}), flush=True)
    result["methods"]["default"] = {"fit_s": min(times["default"]), "fit_s_all": times["default"],
                                    "statistics_kernel": default.statistics_kernel_}
    lim = result["methods"]["limit"]["pass_s"]
    f32 = runs["float32"][1]["pass_s"]
    result["ratios"] = {f"{m}_pass_to_limit": r["pass_s"] / lim for m, r in result["methods"].items()
                        if "pass_s" in r and m != "limit"}
    result["ratios"]["default_fit_to_limit"] = result["methods"]["default"]["fit_s"] / lim
    result["ratios"].update({f"{m}_pass_to_float32_pass": runs[m][1]["pass_s"] / f32 for m in runs})
    result["ratios"].update({f"{m}_fit_to_float32_fit": runs[m][1]["fit_s"] / runs["float32"][1]["fit_s"]
                             for m in runs})
    ex = runs["exact-portable" if "exact-portable" in runs else "exact-int8"][0] if len(runs) > 1 else default
    fl = runs["float32"][0]
    S, S32 = ex.statistics_.scatter, fl.statistics_.scatter
    result["accuracy"] = {
        "float32_scatter_max_error_relative": float(np.abs(S32 - S).max() / np.abs(S).max()),
        "float32_vs_exact_components_max_angle_deg": max_angle_deg(fl.components_, ex.components_),
    }
    if "exact-int8" in runs and "exact-portable" in runs:
        result["accuracy"]["int8_equals_portable"] = bool(
            np.array_equal(runs["exact-int8"][0].components_, ex.components_))
    result["load_after"] = os.getloadavg()  # 1, 5, 15 minutes: how shared the machine was
    out = Path(args.out) if args.out else HERE / "results" / f"exact_{n}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    print(json.dumps({"ratios": result["ratios"], "accuracy": result["accuracy"]}, indent=1))


if __name__ == "__main__":
    main()
