"""A Dask cluster of SLURM or PBS batch jobs for dfairpca, kept up until Ctrl-C.

Needs ``pip install dask-jobqueue`` (0.9) next to dfairpca, a shared file system mounted at
the same path on the login and compute nodes for the data, the stores the workers write
(``transform --out``) and the scheduler file (the model and checkpoint are written by the
client; cluster/README.md says what must be shared and how dfairpca checks it), and the
same Python environment on the compute nodes (the jobs run ``<this python> -m
distributed.cli.dask_worker``).  Run it on a login node, or in
a small long-running job of its own (the scheduler runs in this process):

    python cluster/jobqueue.py --system slurm --jobs 8 --account myproject --queue compute \\
        --walltime 04:00:00 --scheduler-file ~/dfairpca-scheduler.json
    python cluster/jobqueue.py --system pbs --jobs 8 --account myproject --queue workq \\
        --walltime 04:00:00 --scheduler-file ~/dfairpca-scheduler.json

then, in another shell on any machine that sees the same file system:

    dfairpca fit /shared/celeba.zarr --attribute Eyeglasses -k 400 --out /shared/model \\
        --scheduler-file ~/dfairpca-scheduler.json --timeout 300

``--print-job-script`` shows the batch script that would be submitted, and submits nothing.
The two systems differ only in dask-jobqueue's class (``SLURMCluster``, ``PBSCluster``), the
scheduler's name for a queue and an account, PBS's ``-l`` resource line, and the node
defaults (:data:`SYSTEMS`).

Memory per worker, for d = 6400 statistics (80 x 80 images): during the pass every worker
thread keeps one running sum (the upper triangle of a d x d float64 matrix, 177 MB) and the
chunk at hand (a 64 MiB uint8 chunk, its float32 blocks and its 164 MB float32 Gram matrix):
about 0.5 GB per thread, whatever n is, plus about 0.3 GB per process for Python and the
libraries (2 single-thread workers stay at about 0.77 GB each; cluster/README.md).  The
worker that merges the sums at the end briefly holds ``min(split_every, threads) - 1`` more.
So ``0.3 GB + threads x 0.5 GB``, divided by 0.7 to stay under Dask's spill threshold (70 %
of the worker's limit), is ample: the SLURM defaults, a 32-core 192 GB node cut into 8
processes of 4 threads, need (0.3 + 4 x 0.5) / 0.7 = 3.3 GB and get 192 GB / 8 = 24 GB; the
PBS ones, 24 cores and 128 GB in 8 processes of 3 threads, need 2.6 GB and get 16 GB: room
for larger d (about 4 d^2 bytes per thread for the sum and 4 d^2 for the Gram matrix).  Fair
PCA-S (``equalize_covariance``) adds, per group, 12 d^2 bytes per thread (1 GB with 2 groups).
"""

from __future__ import annotations

import argparse
import sys
import time

#: what differs between the batch systems: dask-jobqueue's class, the node defaults, and
#: how each scheduler's own options are named in --help
SYSTEMS = {
    "slurm": {
        "cluster_class": "SLURMCluster", "cores": 32, "memory": "192GB", "directive": "#SBATCH",
        "queue": "#SBATCH -p, a partition", "account": "#SBATCH -A",
        "walltime": "#SBATCH -t", "example": "--directive=--constraint=skylake",
    },
    "pbs": {
        "cluster_class": "PBSCluster", "cores": 24, "memory": "128GB", "directive": "#PBS",
        "queue": "#PBS -q", "account": "#PBS -A",
        "walltime": "#PBS -l walltime", "example": "--directive='-l place=excl'",
    },
}


def _per_system(key: str) -> str:
    """``key``'s value for every system, for --help: 'slurm: 32, pbs: 24'."""
    return ", ".join(f"{name}: {spec[key]}" for name, spec in SYSTEMS.items())


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--system", choices=list(SYSTEMS), required=True,
                   help="the batch system of the cluster")
    p.add_argument("--jobs", type=int, default=4, help="batch jobs (nodes) to request")
    p.add_argument("--cores", type=int,
                   help=f"cores per job (default: {_per_system('cores')})")
    p.add_argument("--memory", help=f"memory per job (default: {_per_system('memory')})")
    p.add_argument("--processes", type=int, default=8, help="worker processes per job")
    p.add_argument("--queue", help=f"queue to submit to ({_per_system('queue')})")
    p.add_argument("--account", help=f"account to charge ({_per_system('account')})")
    p.add_argument("--walltime", default="04:00:00",
                   help=f"time limit per job ({_per_system('walltime')})")
    p.add_argument("--resource-spec",
                   help="pbs only: #PBS -l resources, e.g. select=1:ncpus=24:mem=128GB "
                        "(default: derived from --cores and --memory)")
    p.add_argument("--interface", help="network interface of the nodes, e.g. ib0")
    p.add_argument("--local-directory", default="$TMPDIR",
                   help="fast node-local disk for spilling (expanded on the node)")
    p.add_argument("--log-directory", default="dask-logs",
                   help="where the batch system writes job logs")
    p.add_argument("--directive", action="append", default=[],
                   help=f"extra batch-script line, e.g. {_per_system('example')} (repeatable)")
    p.add_argument("--prologue", action="append", default=[],
                   help="shell line run before each worker starts, e.g. 'module load python' "
                        "(repeatable)")
    p.add_argument("--scheduler-file", default="dfairpca-scheduler.json",
                   help="where to write the scheduler's address (on the shared file system)")
    p.add_argument("--wait", type=float, default=600,
                   help="seconds to wait for the first worker before giving up")
    p.add_argument("--print-job-script", action="store_true",
                   help="print the batch script and exit without submitting")
    args = p.parse_args(argv)
    if args.resource_spec and args.system != "pbs":
        p.error("--resource-spec is a PBS option (#PBS -l); on SLURM give --cores and --memory, "
                "or a --directive")
    return args


def cluster_options(args: argparse.Namespace) -> tuple[str, dict]:
    """The dask-jobqueue class name and its keyword arguments for the parsed ``args``."""
    spec = SYSTEMS[args.system]
    options = dict(
        cores=args.cores or spec["cores"],
        processes=args.processes,
        memory=args.memory or spec["memory"],
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
    if args.system == "pbs":
        options["resource_spec"] = args.resource_spec
    return spec["cluster_class"], options


def make_cluster(args):
    """The cluster: its scheduler starts here, workers once ``scale`` submits jobs."""
    name, options = cluster_options(args)
    try:
        import dask_jobqueue
    except ImportError:
        sys.exit(f"cluster/jobqueue.py: error: the {args.system} cluster needs dask-jobqueue, "
                 "which is not installed: pip install dask-jobqueue")
    return getattr(dask_jobqueue, name)(**options)


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
