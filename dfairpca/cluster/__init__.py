"""Connecting the command line to a Dask cluster.

The estimators never create or choose a cluster: like every Dask library they run on the
active ``distributed.Client`` when there is one.  :func:`connect` is what the ``dfairpca``
command line uses to make one active: a running scheduler given by address
(``--scheduler tcp://host:8786``) or by scheduler file (``--scheduler-file``), or else a
:class:`distributed.LocalCluster` sized to this machine.  Recipes for starting schedulers
and workers on SSH hosts, SLURM/PBS and Kubernetes are in the repository's ``cluster/``.

Workers open the local paths they are given (the data, the output stores) on their own
machines: :func:`check_workers_see` asks every worker, before the work, whether it sees
there what this process sees, and :class:`NotShared` names those that do not.

When every worker leaves, Dask's scheduler waits for new ones without a limit; the
computations of a fit go through :func:`compute`, which inside :func:`worker_timeout`
ends with :class:`WorkersLost` once the Client has had no worker for that many seconds, and
with :class:`WorkersPaused` once every worker has been paused for memory that long (a pass
that no worker could hold below its pause threshold is refused before it starts:
:class:`WorkersTooSmall`).

This package is an edge that the command line and users call; the library's core never
imports it.  Computing on the active client with a time limit is the engine's
(:mod:`dfairpca.engine._compute`), the checks of paths the workers share are io's
(:mod:`dfairpca.io`); both are offered here under the names they are documented by.
(The repository's top-level ``cluster/`` folder is not this package: it holds recipes for
starting Dask schedulers and workers.)
"""

from __future__ import annotations

from ..engine._compute import (WORKER_POLL_SECONDS, check_timeout, cluster_failures_said, compute, current_timeout,
                               gather_watched, ship, shipping_inline, worker_timeout)
from ..engine._failures import (MEMORY_FIX, MEMORY_FIX_RESUMED, NoWorkers, SchedulerLost, WorkerKilled, WorkersLost,
                                WorkersPaused, WorkersTooSmall)
from ..io import (SHARE_FIX, SHARE_FIX_LOCAL, NotShared, active_client, check_inputs_shared,
                          check_workers_see, not_here)
from ._connect import (DASHBOARD_PORT, check_scheduler, connect, describe, local_cluster_size, log,
                       scheduler_address_from_file)
from ._errors import SchedulerUnreachable

__all__ = [
    "SchedulerUnreachable", "NoWorkers", "WorkersLost", "WorkerKilled", "WorkersPaused", "WorkersTooSmall",
    "SchedulerLost", "NotShared", "connect", "describe",
    "local_cluster_size", "scheduler_address_from_file", "check_scheduler", "check_workers_see",
    "check_inputs_shared", "active_client", "not_here", "compute", "worker_timeout", "check_timeout",
    "current_timeout", "gather_watched", "cluster_failures_said", "ship", "shipping_inline",
    # the fixes other messages name, the poll of a timed computation, the log and its port
    "SHARE_FIX", "SHARE_FIX_LOCAL", "MEMORY_FIX", "MEMORY_FIX_RESUMED", "WORKER_POLL_SECONDS", "DASHBOARD_PORT", "log",
]
