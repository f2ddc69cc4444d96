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
ends with :class:`WorkersLost` once the Client has had no worker for that many seconds.
"""

from __future__ import annotations

from ._connect import (DASHBOARD_PORT, check_scheduler, connect, describe, local_cluster_size, log,  # noqa: F401
                       scheduler_address_from_file)
from ._errors import SHARE_FIX, SHARE_FIX_LOCAL  # noqa: F401 (the fixes other messages name)
from ._errors import NoWorkers, NotShared, SchedulerUnreachable, WorkersLost
from ._shared import (active_client, check_inputs_shared, check_workers_see, not_here, ship,
                      shipping_inline)
from ._timeout import WORKER_POLL_SECONDS, check_timeout, compute, current_timeout, gather_watched, worker_timeout  # noqa: F401

__all__ = [
    "SchedulerUnreachable", "NoWorkers", "WorkersLost", "NotShared", "connect", "describe",
    "local_cluster_size", "scheduler_address_from_file", "check_scheduler", "check_workers_see",
    "check_inputs_shared", "active_client", "not_here", "compute", "worker_timeout", "check_timeout",
    "current_timeout", "gather_watched", "ship", "shipping_inline",
]

# the errors keep the name they are documented, raised and caught under (a traceback's
# "dfairpca.cluster.NotShared"); pickling finds them here as well
for _error in (SchedulerUnreachable, NoWorkers, WorkersLost, NotShared):
    _error.__module__ = __name__
del _error
