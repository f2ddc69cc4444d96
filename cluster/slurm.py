"""A Dask cluster of SLURM batch jobs for dfairpca, kept up until Ctrl-C.

Needs ``pip install dask-jobqueue`` (0.9) next to dfairpca, a shared file system for the
data and the scheduler file, and the same Python environment on the compute nodes (the
jobs run ``<this python> -m distributed.cli.dask_worker``).  Run it on a login node, or in
a small long-running job of its own (the scheduler runs in this process):

    python cluster/slurm.py --jobs 8 --account myproject --queue compute \\
        --walltime 04:00:00 --scheduler-file ~/dfairpca-scheduler.json

then, in another shell on any machine that sees the same file system:

    dfairpca fit /shared/celeba.zarr --attribute Eyeglasses -k 400 --out /shared/model \\
        --scheduler-file ~/dfairpca-scheduler.json --timeout 300

``--print-job-script`` shows the batch script that would be submitted, and submits nothing.

Memory per worker, for d = 6400 statistics (80 x 80 images): during the pass every worker
thread keeps one running sum (the upper triangle of a d x d float64 matrix, 177 MB) and the
chunk at hand (a 64 MiB uint8 chunk, its float32 blocks and its 164 MB float32 Gram matrix):
about 0.5 GB per thread, whatever n is, plus about 0.3 GB per process for Python and the
libraries (measured on 2 single-thread workers: 0.77 GB each; cluster/README.md).  The
worker that merges the sums at the end briefly holds ``min(split_every, threads) - 1`` more.
So ``0.3 GB + threads x 0.5 GB``, divided by 0.7 to stay under Dask's spill threshold (70 %
of the worker's limit), is ample: the defaults, a 32-core 192 GB node cut into 8 processes of 4
threads, need (0.3 + 4 x 0.5) / 0.7 = 3.3 GB and get 192 GB / 8 = 24 GB, room for larger d
(about 4 d^2 bytes per thread for the sum and 4 d^2 for the Gram matrix).  Fair PCA-S
(``equalize_covariance``) adds, per group, 12 d^2 bytes per thread (1 GB with 2 groups).
"""

from __future__ import annotations

import argparse
import time


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--jobs", type=int, default=4, help="batch jobs (nodes) to request")
    p.add_argument("--cores", type=int, default=32, help="cores per job")
    p.add_argument("--memory", default="192GB", help="memory per job (SLURM --mem)")
    p.add_argument("--processes", type=int, default=8, help="worker processes per job")
    p.add_argument("--queue", help="partition (#SBATCH -p)")
    p.add_argument("--account", help="account (#SBATCH -A)")
    p.add_argument("--walltime", default="04:00:00", help="time limit per job (#SBATCH -t)")
    p.add_argument("--interface", help="network interface of the nodes, e.g. ib0")
    p.add_argument("--local-directory", default="$TMPDIR",
                   help="fast node-local disk for spilling (expanded on the node)")
    p.add_argument("--log-directory", default="dask-logs", help="where SLURM writes job logs")
    p.add_argument("--directive", action="append", default=[],
                   help="extra #SBATCH line, e.g. --directive=--constraint=skylake (repeatable)")
    p.add_argument("--prologue", action="append", default=[],
                   help="shell line run before each worker starts, e.g. 'module load python' "
                        "(repeatable)")
    p.add_argument("--scheduler-file", default="dfairpca-scheduler.json",
                   help="where to write the scheduler's address (on the shared file system)")
    p.add_argument("--wait", type=float, default=600,
                   help="seconds to wait for the first worker before giving up")
    p.add_argument("--print-job-script", action="store_true",
                   help="print the batch script and exit without submitting")
    return p.parse_args(argv)


def make_cluster(args):
    """The SLURMCluster: its scheduler starts here, workers once ``scale`` submits jobs."""
    from dask_jobqueue import SLURMCluster

    return SLURMCluster(
        cores=args.cores,
        processes=args.processes,
        memory=args.memory,
        queue=args.queue,
        account=args.account,
        walltime=args.walltime,
        interface=args.interface,
        local_directory=args.local_directory,
        log_directory=args.log_directory,
        job_extra_directives=args.directive,
        job_script_prologue=args.prologue,
        scheduler_options={"dashboard_address": ":8787"},
    )


def main(argv=None) -> None:
    from distributed import Client

    from dfairpca.cluster import describe

    args = parse_args(argv)
    with make_cluster(args) as cluster:
        if args.print_job_script:
            print(cluster.job_script())
            return
        with Client(cluster) as client:
            cluster.scale(jobs=args.jobs)
            client.write_scheduler_file(args.scheduler_file)
            print(f"scheduler file {args.scheduler_file}; dashboard {cluster.dashboard_link}")
            client.wait_for_workers(1, timeout=args.wait)
            try:
                while True:  # report as jobs start; the fits come from other processes
                    print(describe(client), flush=True)
                    time.sleep(60)
            except KeyboardInterrupt:
                print("stopping: cancelling the worker jobs")


if __name__ == "__main__":
    main()
