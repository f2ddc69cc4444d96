"""The error of a scheduler that does not answer, and what its messages tell to check."""

from __future__ import annotations

from ..errors import DfairpcaError

#: what to check when nothing (or no scheduler) answers
_CHECK_RUNNING = (
    "check that `dask scheduler` is running there and that the address and port "
    "(default 8786) are right and not blocked by a firewall"
)


class SchedulerUnreachable(DfairpcaError, ConnectionError):
    """No Dask scheduler answered at the given address within the timeout."""

    # documented, raised and pickled under the public name dfairpca.cluster.SchedulerUnreachable
    __module__ = "dfairpca.cluster"
