"""Ingest speed: images per second against the single-process decode loop, in the same run.

    python benchmarks/bench_ingest.py                        # 20,000 JPEGs -> 80 x 80 grey
    python benchmarks/bench_ingest.py --size full --color    # -> 218 x 178 RGB (CelebA's own)
    python benchmarks/bench_ingest.py --n 4000               # a quick check

Issue 14's target: ``dfairpca ingest-celeba`` decodes in parallel at >= 1.8x the
single-process rate on a 2-core machine: ``n_jobs=2`` against ``n_jobs=1`` (and against the
plain single-process decode loop).  The run first writes ``--n`` fabricated CelebA JPEGs
(:func:`dfairpca.celeba.write_celeba_jpegs`: 178 x 218 colour, quality 90, ~12 KB) into a
temporary folder, or reuses the ones ``--jpegs DIR`` kept from an earlier run, reads each
before every method (so each finds them in the page cache), then times over the same files:

(a)  the plain decode loop: Pillow open -> centre crop -> convert -> Lanczos resize ->
     numpy, one process, nothing written (what a user's own script does);
(a') the same loop with the ingest's decoder (:func:`dfairpca.celeba.ingest.decode_face`:
     the JPEG decoded at a reduced DCT scale where it is downscaled), one process;
(a'1) (a') in one fresh process, started and warmed before the clock;
(e)  the machine's own limit: (a') split in halves over 2 such processes, nothing written or
     shared: (a'1) / (e) is the speed-up this hardware gives two processes right now;
(b)  ``ingest_celeba(n_jobs=1)``, (c) ``n_jobs=2`` (spawned processes, started inside the
     timed call): decode and write the Zarr store;
     (a'), (a'1), (e), (b), (c) run in that order ``--repeats`` times (the table gives
     medians; each round's (b) / (c), (a'1) / (e) and their quotient, the ingest's share
     of the machine's limit, are listed with their medians);
(d)  on a 2-worker LocalCluster of processes (started before the clock; its start is
     reported apart).

Results: ``benchmarks/results/ingest_<n>_<size>.{md,json}``.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
from PIL import Image

HERE = Path(__file__).resolve().parent


def plain_loop(paths: list[str], size, color: bool) -> None:
    """(a): decode, crop, convert and resize every image in this process, keep nothing."""
    mode = "RGB" if color else "L"
    for path in paths:
        with Image.open(path) as image:
            width, height = image.size
            if size is not None:
                out_h, out_w = size
                side = round(width * out_h / out_w)  # CelebA is tall: crop the height
                top = (height - side) // 2
                image = image.crop((0, top, width, top + side))
            face = image.convert(mode)
            if size is not None:
                face = face.resize((size[1], size[0]), Image.Resampling.LANCZOS)
            np.asarray(face)


def ingest_decoder_loop(paths: list[str], size, color: bool) -> None:
    """(a'): the ingest's own decoder, one process, keep nothing."""
    from dfairpca.celeba.ingest import decode_face

    shape = size if size is not None else (218, 178)
    for path in paths:
        decode_face(path, shape, color)


def _half_decoder(conn, paths, size, color) -> None:
    """A process of (a'1) or (e): import the decoder, say so, wait for the word, decode ``paths``."""
    from dfairpca.celeba.ingest import decode_face  # noqa: F401  (imported before the clock)

    conn.send("ready")
    conn.recv()
    ingest_decoder_loop(paths, size, color)
    conn.send("done")


def machine_limit(paths: list[str], size, color: bool, processes: int = 2) -> float:
    """(a'1) and (e): ``processes`` independent decoder loops, one over each share of the
    files, in fresh processes started and warmed before the clock (no process start, no
    writing, nothing shared): the wall seconds until the last one is done.  One process
    gives the one-process rate (a'1), two the machine's two-process limit (e): (a'1) / (e)
    is the speed-up the hardware allows right now.  A process that fails ends them all."""
    from multiprocessing.connection import wait

    ctx = multiprocessing.get_context("spawn")
    pipes, procs = [], []
    try:
        for i in range(processes):
            ours, theirs = ctx.Pipe()
            proc = ctx.Process(target=_half_decoder, args=(theirs, paths[i::processes], size, color),
                               daemon=True)
            proc.start()
            theirs.close()  # else a child that dies leaves this end open, and recv() waits
            pipes.append(ours)
            procs.append(proc)

        def hear(expected: str) -> None:
            """One word from every process; an error if one ends first."""
            waiting = dict(zip(pipes, procs))
            while waiting:
                for ready in wait(list(waiting)):
                    proc = waiting.pop(ready)
                    try:
                        word = ready.recv()
                    except EOFError:
                        proc.join(5)
                        raise RuntimeError(f"a decoder process ended (exit code {proc.exitcode}) "
                                           "before it was done: its error is printed above") from None
                    assert word == expected, word

        hear("ready")
        t0 = time.perf_counter()
        for conn in pipes:
            conn.send("go")
        hear("done")
        return time.perf_counter() - t0
    finally:
        for proc in procs:
            proc.join(5)
            if proc.is_alive():
                proc.terminate()
                proc.join()


def _cpu_seconds(client=None) -> float:
    """User + system CPU seconds of this process, its reaped children and ``client``'s
    workers."""
    import resource

    total = sum(getattr(resource.getrusage(who), field)
                for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)
                for field in ("ru_utime", "ru_stime"))
    if client is not None:
        total += sum(client.run(_own_cpu_seconds).values())
    return total


def _own_cpu_seconds() -> float:
    """This process's user + system CPU seconds (run on each Dask worker)."""
    times = os.times()
    return times.user + times.system


def parse_size(text: str):
    """``full`` -> None, ``80`` -> (80, 80), ``218x178`` -> (218, 178)."""
    if text == "full":
        return None
    parts = [int(p) for p in text.lower().split("x")]
    return (parts[0], parts[0]) if len(parts) == 1 else tuple(parts)


def fabricated_download(folder: Path, n: int) -> tuple[Path, float]:
    """``n`` fabricated CelebA JPEGs in ``folder``: written there, or (``folder`` holding a
    download of ``n`` images from an earlier run) reused; the seconds writing took."""
    from dfairpca.celeba import write_celeba_jpegs

    attr = folder / "list_attr_celeba.txt"
    if attr.is_file():
        count = int(attr.read_text().split("\n", 1)[0])
        if count != n:
            raise SystemExit(f"{folder} holds {count:,} fabricated JPEGs, not --n {n:,}: give "
                             "another --jpegs folder")
        return folder, 0.0
    t = time.perf_counter()
    write_celeba_jpegs(folder, n, seed=0, n_jobs=2)
    return folder, time.perf_counter() - t


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=20_000, help="JPEGs to generate (default: 20000)")
    ap.add_argument("--size", default="80", help="80, HxW or full (default: 80)")
    ap.add_argument("--color", action="store_true", help="RGB faces (default: grey)")
    ap.add_argument("--repeats", type=int, default=3,
                    help="rounds of (a'), (a'1), (e), (b), (c) (default: 3)")
    ap.add_argument("--jpegs", default=None,
                    help="folder of the fabricated JPEGs, kept for later runs (default: a temp "
                         "folder, deleted)")
    ap.add_argument("--workdir", default=None, help="where the stores go (default: a temp dir)")
    ap.add_argument("--results", default=str(HERE / "results"), help="folder of the result files")
    args = ap.parse_args(argv)
    if args.repeats < 1:
        ap.error("--repeats must be at least 1")
    from distributed import Client, LocalCluster

    from dfairpca.celeba import ingest_celeba

    size = parse_size(args.size)
    ingest_size = "full" if size is None else size
    work = Path(tempfile.mkdtemp(prefix="dfairpca-bench-ingest-", dir=args.workdir))
    try:
        celeba, generated = fabricated_download(
            Path(args.jpegs) if args.jpegs else work / "celeba", args.n)
        paths = [str(celeba / "img_align_celeba" / f"{i:06d}.jpg") for i in range(1, args.n + 1)]
        kb = np.mean([os.path.getsize(p) for p in paths]) / 1000
        def cache_jpegs() -> None:
            """Read every JPEG, so that each method finds them in the page cache: a store
            written at full colour (23.6 GB at 202,599) pushes them out of a 24 GB machine's
            cache, and the next method would read some from disk."""
            for p in paths:
                Path(p).read_bytes()

        cache_jpegs()
        print(f"{args.n:,} JPEGs ({kb:.1f} KB on average), written in {generated:.1f} s", flush=True)

        seconds: dict[str, list[float]] = {}
        cluster_pids: set[int] = set()

        def own_children() -> list:
            """This process's child processes but a LocalCluster's workers (its children
            too, which live as long as the cluster)."""
            return [c for c in multiprocessing.active_children() if c.pid not in cluster_pids]
        cpu: dict[str, list[float]] = {}

        def timed(label, run, workers=None, self_timed=False):
            """Time ``run``: wall seconds, and CPU seconds of this process, the processes it
            waited for and, given a client, its workers (a loaded machine slows the wall
            clock, not the CPU time a method needs).  Each method starts with no dirty
            page left by the one before (its store deleted, then ``sync``): else the
            kernel's write-back throttling of the earlier stores' gigabytes would slow
            the later methods), and the JPEGs read into the page cache again."""
            for old in work.glob("*.zarr"):
                shutil.rmtree(old)
            os.sync()
            cache_jpegs()
            for child in own_children():  # the JPEG writer's, at first
                child.join(30)
            before = _cpu_seconds(workers)
            t0 = time.perf_counter()
            own = run()  # self_timed: run gives its seconds (its processes' start not in them)
            seconds.setdefault(label, []).append(own if self_timed else time.perf_counter() - t0)
            for child in own_children():  # a worker the call did not wait
                child.join(30)  # for (it had no task left): its CPU seconds count here
            cpu.setdefault(label, []).append(_cpu_seconds(workers) - before)
            print(f"{label}: {seconds[label][-1]:.1f} s, {args.n / seconds[label][-1]:,.0f} images/s, "
                  f"CPU {cpu[label][-1]:.1f} s", flush=True)

        kwargs = dict(size=ingest_size, color=args.color, progress=False)
        one, two = "(b) ingest n_jobs=1", "(c) ingest n_jobs=2"
        dec, dec1 = "(a') ingest's decoder, 1 process", "(a'1) (a') in 1 fresh warm process"
        lim = "(e) limit: (a') in 2 fresh warm processes, halves"
        timed("(a) plain decode loop, 1 process", lambda: plain_loop(paths, size, args.color))
        for _ in range(args.repeats):
            timed(dec, lambda: ingest_decoder_loop(paths, size, args.color))
            timed(dec1, lambda: machine_limit(paths, size, args.color, processes=1), self_timed=True)
            timed(lim, lambda: machine_limit(paths, size, args.color), self_timed=True)
            timed(one, lambda: ingest_celeba(celeba, work / "b.zarr", n_jobs=1, **kwargs))
            timed(two, lambda: ingest_celeba(celeba, work / "c.zarr", n_jobs=2, **kwargs))
        t = time.perf_counter()
        with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                          dashboard_address=None) as cluster, Client(cluster) as client:
            cluster_start = time.perf_counter() - t
            cluster_pids.update(p.pid for p in multiprocessing.active_children())
            timed("(d) ingest on a 2-worker LocalCluster",
                  lambda: ingest_celeba(celeba, work / "d.zarr", client=client, **kwargs), client)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    median = {label: float(np.median(s)) for label, s in seconds.items()}
    base, single = median["(a) plain decode loop, 1 process"], median[one]
    rows = [{"method": label + (f" (median of {len(s)})" if len(s) > 1 else ""),
             "seconds": round(median[label], 2), "images_per_s": round(args.n / median[label], 1),
             "ratio_to_a": round(base / median[label], 2), "ratio_to_b": round(single / median[label], 2),
             "cpu_s": round(float(np.median(cpu[label])), 2)} for label, s in seconds.items()]
    raw_pairs = [b / c for b, c in zip(seconds[one], seconds[two])]
    raw_limits = [a / e for a, e in zip(seconds[dec1], seconds[lim])]
    raw_shares = [p / q for p, q in zip(raw_pairs, raw_limits)]
    pairs, limits, shares = ([round(x, 2) for x in xs] for xs in (raw_pairs, raw_limits, raw_shares))
    shape = "full (218 x 178)" if size is None else f"{size[0]} x {size[1]}"
    lines = [
        f"# Ingest: {args.n:,} fabricated CelebA JPEGs ({kb:.1f} KB avg) -> {shape} "
        f"{'RGB' if args.color else 'grey'}",
        "",
        f"`python benchmarks/bench_ingest.py --n {args.n} --size {args.size}"
        f"{' --color' if args.color else ''} --repeats {args.repeats}` on {os.cpu_count()} CPUs "
        f"({platform.processor() or platform.machine()}); the LocalCluster started in "
        f"{cluster_start:.1f} s (not in (d)).",
        "",
        "| method | seconds | images/s | ratio to (a) | ratio to (b) | CPU seconds |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    lines += [f"| {r['method']} | {r['seconds']:.1f} | {r['images_per_s']:,.0f} | {r['ratio_to_a']:.2f} "
              f"| {r['ratio_to_b']:.2f} | {r['cpu_s']:.1f} |" for r in rows]
    lines += ["", f"n_jobs=2 against n_jobs=1, round by round: {', '.join(f'{p:.2f}x' for p in pairs)} "
              f"(median {np.median(raw_pairs):.2f}x).",
              f"The machine's limit, (a'1) / (e) in the same rounds: "
              f"{', '.join(f'{p:.2f}x' for p in limits)} (median {np.median(raw_limits):.2f}x).",
              f"The ingest's share of that limit, ((b) / (c)) / ((a'1) / (e)): "
              f"{', '.join(f'{p:.2f}' for p in shares)} (median {np.median(raw_shares):.2f}).",
              "",
              "The table's rows are medians over the rounds (its ratios, ratios of medians). "
              "Each round runs (a'), (a'1), (e), (b), (c) in that order; (a'1) and (e) run in "
              "fresh processes, started before their clock (their CPU seconds include the "
              "start, their wall time does not), (a') and (b) in this long-lived one."]
    table = "\n".join(lines) + "\n"
    print("\n" + table)
    tag = "full" if size is None else f"{size[0]}x{size[1]}"
    tag += "_color" if args.color else ""
    out = Path(args.results)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"ingest_{args.n}_{tag}.md").write_text(table)
    summary = {"n": args.n, "size": args.size, "color": args.color, "jpeg_kb": round(kb, 2),
               "generate_s": round(generated, 2), "cluster_start_s": round(cluster_start, 2),
               "repeats": args.repeats, "rows": rows, "ratio_c_to_b_per_run": pairs,
               "limit_a1_to_e_per_run": limits, "median_ratio_c_to_b": round(float(np.median(raw_pairs)), 3), "share_of_limit_per_run": shares,
               "seconds": {label: [round(x, 3) for x in s] for label, s in seconds.items()}}
    (out / f"ingest_{args.n}_{tag}.json").write_text(json.dumps(summary, indent=1) + "\n")
    return summary


if __name__ == "__main__":
    main()
