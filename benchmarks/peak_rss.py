"""Run a command and report the peak resident memory of it and all its children.

    python benchmarks/peak_rss.py dfairpca fit STORE --attribute Eyeglasses -k 400 --out M

Samples every 50 ms: the peak of the sum over the process tree (what the machine must
hold at once) and each process's own peak (for a Dask LocalCluster: the client with the
scheduler, then the worker processes).  The command's output is passed through.
"""

from __future__ import annotations

import sys
import time


def main(argv=None) -> int:
    import psutil

    cmd = list(sys.argv[1:] if argv is None else argv)
    if not cmd:
        print(__doc__, file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    p = psutil.Popen(cmd)
    peak, per = 0, {}
    while p.poll() is None:
        total = 0
        for q in [p, *p.children(recursive=True)]:
            try:
                rss = q.memory_info().rss
            except psutil.Error:
                continue
            total += rss
            per[q.pid] = max(per.get(q.pid, 0), rss)
        peak = max(peak, total)
        time.sleep(0.05)
    wall = time.perf_counter() - t0
    own = ", ".join(f"{v / 2**30:.2f}" for v in per.values() if v > 100 << 20)
    print(f"peak_rss: {peak / 2**30:.2f} GB summed over the process tree; per process (over "
          f"100 MB, oldest first): {own} GB; wall {wall:.1f} s; exit {p.returncode}",
          file=sys.stderr)
    return p.returncode


if __name__ == "__main__":
    sys.exit(main())
