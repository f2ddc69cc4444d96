"""What a computation asks the Dask scheduler itself to do (``Client.run_on_scheduler``).

This module is sent to the scheduler by value (cloudpickle), so that a scheduler started
without dfairpca installed runs it too: it imports nothing of dfairpca's, and nothing but
the functions sent belongs here.
"""

from __future__ import annotations
import time


def release_pinned(dask_scheduler=None) -> list:
    """Send to a running worker the tasks left in ``no-worker`` that were pinned to workers
    which are gone, though their annotation lets other workers take them over
    (``allow_other_workers=True``).

    distributed puts a ready task in ``no-worker`` when no worker is running at that moment
    (its only worker is being restarted by its nanny, e.g. past its memory limit); when a
    worker joins it takes back from there only the tasks that worker is valid for, and a
    task pinned to the dead worker's address is valid for none, whatever its annotation
    says: it would wait for ever.  The fold tasks of a pass are pinned that way (one chain
    per worker thread).  Tasks with host or resource restrictions are left as they are.

    Returns
    -------
    list of list of str
        For each task sent on, the addresses it was pinned to.
    """
    s = dask_scheduler
    if not s.running:
        return []
    recommendations, pinned = {}, []
    for ts in list(s.unrunnable):
        where = ts.worker_restrictions
        if (ts.loose_restrictions and where and not any(a in s.workers for a in where)
                and not ts.host_restrictions and not ts.resource_restrictions):
            recommendations[ts.key] = "processing"
            pinned.append(sorted(where))
    if recommendations:
        s.transitions(recommendations, stimulus_id=f"dfairpca-release-pinned-{time.time()}")
    return pinned


def knows(key, dask_scheduler=None) -> bool:
    """Whether the scheduler has the task ``key`` (its graph arrived and was accepted)."""
    return key in dask_scheduler.tasks
