"""Run a store writer's chunks in worker processes, with a progress bar."""

from __future__ import annotations

import multiprocessing
from concurrent.futures import ProcessPoolExecutor, as_completed
from typing import Callable, Sequence

from tqdm import tqdm

from .._system import cpu_count
from .schema import check_positive

__all__ = ["run_chunks"]


def run_chunks(
    func: Callable[..., int],
    tasks: Sequence[tuple],
    *,
    n_jobs: int | None,
    progress: bool,
    total: int,
    desc: str,
    initial: int = 0,
) -> None:
    """Run ``func(*task)`` for every task, in parallel, with a progress bar.

    ``func`` returns the number of images it wrote.  ``n_jobs`` processes (default
    :func:`dfairpca._system.cpu_count`; 1 runs in this process) are started with the
    ``spawn`` method, which is safe whatever threads the caller runs.  On the first
    failure, pending tasks are cancelled and the error is re-raised.
    """
    if n_jobs is None:
        n_jobs = cpu_count()
    check_positive(n_jobs=n_jobs)
    n_jobs = min(n_jobs, max(len(tasks), 1))
    with tqdm(total=total, initial=initial, desc=desc, unit="img", disable=not progress) as bar:
        if n_jobs == 1:
            for task in tasks:
                bar.update(func(*task))
            return
        context = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(n_jobs, mp_context=context) as pool:
            futures = [pool.submit(func, *task) for task in tasks]
            try:
                for future in as_completed(futures):
                    bar.update(future.result())
            except BaseException:
                pool.shutdown(wait=True, cancel_futures=True)
                raise
