"""Preloaded into a local cluster's workers (``distributed.worker.preload``): a worker's
close takes TEARDOWN_SECONDS longer, as a worker process's exit does on a loaded machine,
beyond the 4 s distributed's own close gives it before its nanny kills it and warns."""

import time

#: longer than distributed's grace (4 s), far shorter than dfairpca's (WORKER_EXIT_SECONDS)
TEARDOWN_SECONDS = 6


def dask_teardown(worker):
    time.sleep(TEARDOWN_SECONDS)
