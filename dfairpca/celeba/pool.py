"""Write a CelebA store's chunks in parallel and resumably: worker processes or Dask tasks.

The one write path of the store writers (:func:`.synth.synth_celeba`,
:func:`.ingest.ingest_celeba`).  The store is created in the sibling ``.NAME.partial``, marked
as dfairpca's; each worker gets a few ranges of whole chunks, produces their rows (draws or
decodes them) and writes them to the store itself, marking each chunk done with an empty
file ``.done/INDEX``: only a count comes back, never pixels.  At the end the partial store
is moved into place (:func:`dfairpca.io.move_into_place`), so ``NAME`` never holds a
half-written store.  An interrupted run keeps its finished chunks: the same call again, by
the same dfairpca code (``.done/code``, :func:`dfairpca.base.code_digest`), converts
only the others.
"""

from __future__ import annotations

import collections
import concurrent.futures
import concurrent.futures.process
import contextlib
import dataclasses
import functools
import logging
import multiprocessing
import secrets
import shutil
import threading
from queue import SimpleQueue
from pathlib import Path
from typing import Callable, Iterator, Sequence

import numpy as np
import zarr
import zarr.errors

from ..base import code_digest, cpu_count
from ..base.progress import NullBar, progress_bar, reporting
from ..io import (check_rows, check_target, disk_full, exclusive, is_disk_full, marker_attributes,
                  move_into_place, read_capped, read_marker, remove_directory, write_marker,
                  writing_every_chunk)
from .schema import IMAGES, PARTITION, STORE_KIND, check_positive, create_store
from ..errors import DiscardedWriteWarning, InvalidInputError, RunError
from ..cluster import cluster_failures_said

# Deferred imports: distributed (heavy or optional), package modules that load such libraries, or
# this module, at import and standard modules needed rarely or on one platform only are imported in
# the functions that use them, so that importing this module stays light.

_log = logging.getLogger("dfairpca")

__all__ = ["Split", "Workers", "partial_path", "resolve_jobs", "run_tasks", "worker_processes", "write_rows",
           "write_store"]

#: folder of a partial store holding one empty file per finished chunk
DONE_DIR = ".done"
#: file in :data:`DONE_DIR` holding the digest of the code that wrote the chunks
#: (:func:`dfairpca.base.code_digest`): other code, even of the same version, starts over
CODE_FILE = "code"
#: start of the name of a file in :data:`DONE_DIR` that a call makes once one of its Dask
#: tasks failed (one name per call): its other tasks stop before their next chunk, so that
#: the call ends with none of its workers still writing the partial store
STOP_PREFIX = "stop-"
#: seconds a failed write waits for its other Dask tasks to stop (each ends after the chunk
#: it is writing) before it gives up on them, saying so; after :data:`STOP_NOTICE_SECONDS`
#: of it, a log record says what it waits for
STOP_WAIT_SECONDS = 120.0
STOP_NOTICE_SECONDS = 5.0
#: ranges of chunks per Dask worker: several, so that a worker slowed by other load does not
#: leave the rest idle at the end (the tail is at most one range), few, so that a range is
#: many chunks of work per task sent
TASKS_PER_WORKER = 8
#: parts of each of the last chunks of :func:`write_store` with ``read_part``
TAIL_PARTS = 4
#: seconds between refreshes of the progress bar, which counts the chunks marked done
POLL_SECONDS = 0.5
#: seconds between the dispatching thread's looks at the tasks left while a worker starts:
#: this process may take them all meanwhile, then waits for that thread to notice
DISPATCH_SECONDS = 0.02


def partial_path(out: Path) -> Path:
    """Where the store ``out`` is written before it is moved into place."""
    return out.parent / f".{out.name}.partial"


def write_store(
    out: Path,
    *,
    shape: tuple[int, ...],
    chunks: Sequence[tuple],
    chunk_rows: int,
    settings: dict,
    labels: dict[str, np.ndarray],
    write_chunk: Callable[..., int],
    args: tuple,
    n_jobs: int | None,
    client,
    progress: bool,
    overwrite: bool,
    protect: dict | None,
    desc: str,
    workers: Workers | None = None,
    read_part: Callable[..., np.ndarray] | None = None,
    check_part: Callable[..., np.ndarray] | None = None,
    check_whole_chunks: bool = False,
) -> Path:
    """Write the store ``out`` of faces of ``shape``, chunk by chunk, resuming a partial one.

    Parameters
    ----------
    chunks : sequence of tuples
        ``(index, start, stop, *extra)`` for every chunk of ``chunk_rows`` rows, in order.
    settings : dict
        The store's group attributes; a partial store resumes only if they are equal.
    labels : dict
        Arrays written whole before the faces (``attributes``, ``partition``).
    write_chunk : callable
        ``write_chunk(store, index, start, stop, *extra, *args)``: produce rows
        ``start:stop`` and write them (faces and whatever else the chunk holds) to the Zarr
        group at ``store``; module level, so that it pickles by name.
    n_jobs : int, optional
        Processes writing chunks (default the usable CPUs): this one and ``n_jobs - 1``
        spawned ones, each taking one chunk at a time; ``1`` runs in this process only.
    client : distributed.Client, optional
        Run the ranges of chunks as Dask tasks on its cluster instead.  Its workers must
        see ``out``'s folder and the inputs at the same paths: every worker is asked
        whether it sees the partial store before any chunk is sent
        (:func:`dfairpca.cluster.check_workers_see`), and every chunk must be in it, as
        this process sees it, before it is moved into place.
    overwrite : bool
        Replace a store dfairpca wrote at ``out`` and discard a partial one.
    protect : dict, optional
        Paths ``out`` must stay apart from (see :func:`dfairpca.io.check_target`).
    workers : Workers, optional
        The ``n_jobs - 1`` worker processes, started by the caller with
        :func:`worker_processes` before it read its inputs; by default started here.
    read_part : callable, optional
        ``read_part(chunk, lo, hi, *args)``: rows ``lo:hi`` of the chunk ``chunk`` (a tuple
        of ``chunks``) as an array, faces only, not written.  Given, worker processes
        share the last chunks (the last one, for two processes) in :data:`TAIL_PARTS`
        parts, which this process writes: else the processes would end up to a chunk apart
        (a second, for 2,048 faces at 80 x 80), one idle.
    check_part : callable, optional
        As ``read_part`` (default ``read_part``): what the finished store is checked
        against, by content, before it is moved into place (:func:`_check_content`).
    check_whole_chunks : bool, default False
        Check every row of the first, middle and last chunk (for a ``check_part`` that
        computes its chunk whole to give any row) instead of the first and last row of
        every chunk.

    On an error the finished chunks stay in :func:`partial_path` and the error says so.
    """
    n_jobs = resolve_jobs(n_jobs, client)
    check_target(out, STORE_KIND, overwrite=overwrite, protect=protect)
    out.parent.mkdir(parents=True, exist_ok=True)
    # one writer of a partial store at a time: two would mix their chunks into one store
    with _full_disk_said(out, chunks, shape), \
            exclusive(out.parent / f".{out.name}.lock", f"{out} (its partial store {partial_path(out)})"):
        partial = partial_path(out)
        n = chunks[-1][2]
        if overwrite or not _is_resumable(partial, settings, (n, *shape), chunk_rows):
            if not overwrite and (partial / DONE_DIR).is_dir():
                import warnings

                warnings.warn(f"discarded the interrupted write in {partial}: it was made with other "
                              "settings (source, seed, size, colour, n or chunk rows) or other "
                              "dfairpca code than this call, so its chunks cannot be reused",
                              DiscardedWriteWarning, stacklevel=3)
            if read_marker(partial) is not None:  # its chunk marks are dfairpca's too
                shutil.rmtree(partial / DONE_DIR, ignore_errors=True)
                # a user's file that remove_directory keeps would go with create_store's mode="w"
                check_target(partial, STORE_KIND, overwrite=True, probe=False)
            remove_directory(partial, STORE_KIND)
            with writing_every_chunk():
                group = create_store(partial, n, shape, chunk_rows, settings, PARTITION in labels)
                for name, values in labels.items():
                    array = group[name]
                    assert isinstance(array, zarr.Array)  # create_store made it an array
                    array[:] = values
            (partial / DONE_DIR).mkdir()
            (partial / DONE_DIR / CODE_FILE).write_text(code_digest())
        if client is not None:  # its workers write the chunks: first, do they see the store?
            from ..cluster import SHARE_FIX_LOCAL, check_workers_see

            check_workers_see(client, partial / DONE_DIR, "the store", output=True, shown=out,
                              fix=SHARE_FIX_LOCAL)
        # this call's own: an earlier call's stays for its tasks, if any still run
        stop = partial / DONE_DIR / f"{STOP_PREFIX}{secrets.token_hex(8)}"
        done = _done(partial)
        pending = [chunk for chunk in chunks if chunk[0] not in done]
        with reporting(progress):  # a terminal's bar, or whole lines into a log
            bar = progress_bar(n, desc, "image") or NullBar()
        bar.update(n - sum(c[2] - c[1] for c in pending))
        with contextlib.closing(bar):
            try:
                # absolute: a worker's working directory is not this process's
                store = str(partial.absolute())
                if client is None and n_jobs == 1:
                    _write_range(write_chunk, store, pending, args, on_chunk=bar.update)
                elif pending:
                    slots = sum(client.nthreads().values()) if client is not None else int(n_jobs or 1)
                    # processes take one chunk at a time (a task costs them nothing to send);
                    # Dask tasks, a few ranges of chunks per worker
                    parts = ([[c] for c in pending] if client is None else
                             split(pending, slots * TASKS_PER_WORKER))
                    tasks = [(write_chunk, store, part, args, stop.name) for part in parts]
                    run_tasks(_write_range, tasks, n_jobs=n_jobs, client=client, workers=workers,
                              refresh=lambda: bar.update(_rows_done(partial, chunks) - bar.n),
                              stop=(stop.touch, functools.partial(stop.unlink, missing_ok=True)),
                              split=None if read_part is None else Split(
                                  functools.partial(_chunk_parts, read_part), _write_joined))
            except (Exception, KeyboardInterrupt) as exc:
                exc.add_note(f"dfairpca kept the finished chunks in {partial}: the same call again "
                             "resumes there (overwrite=True, --overwrite, starts over)")
                raise
        if client is not None:  # what the workers wrote, as this process sees it
            from ..cluster import SHARE_FIX_LOCAL
            from ..io import check_written

            check_written(zarr.open_group(partial, mode="r"), out, SHARE_FIX_LOCAL)
        unmarked = sorted({c[0] for c in chunks} - _done(partial))
        if unmarked:  # a task that ended early without an error: never a store with holes
            raise RunError(f"{out} is not written: {len(unmarked)} of its {len(chunks)} chunks "
                           f"(the first: {unmarked[0]}) were never marked written in {partial}; "
                           "the same call again writes them")
        check_part = check_part or read_part
        if check_part is not None:
            _check_content(partial, out, chunks, check_part, args, check_whole_chunks)
        shutil.rmtree(partial / DONE_DIR)
        write_marker(partial, STORE_KIND)  # finished: what is added later is a user's
        return move_into_place(partial, out, STORE_KIND, overwrite=overwrite)


def _check_content(partial: Path, out: Path, chunks: Sequence[tuple], part: Callable[..., np.ndarray],
                   args: tuple, whole: bool) -> None:
    """Raise :class:`dfairpca.io.WrongRowsError` unless the faces the store ``partial``
    holds equal ``part``'s same rows computed again here: the first and last row of every
    chunk, or (``whole``) every row of the first, middle and last chunk."""
    picked = [chunks[i] for i in sorted({0, len(chunks) // 2, len(chunks) - 1})] if whole else chunks
    parts = [(c, 0, c[2] - c[1]) for c in picked] if whole else [
        (c, lo, lo + 1) for c in picked for lo in sorted({0, c[2] - c[1] - 1})]
    images = zarr.open_array(partial / IMAGES, mode="r")
    rows = np.concatenate([np.arange(c[1] + lo, c[1] + hi) for c, lo, hi in parts])
    written = images.get_orthogonal_selection((rows,))
    expected = np.concatenate([part(c, lo, hi, *args) for c, lo, hi in parts])
    try:
        check_rows(written, expected, rows, out)
    except Exception:
        # its chunks' marks go: the same call again writes every chunk, never resumes these
        shutil.rmtree(partial / DONE_DIR, ignore_errors=True)
        raise


@contextlib.contextmanager
def _full_disk_said(out: Path, chunks: Sequence[tuple], shape: tuple[int, ...]) -> Iterator[None]:
    """A full disk while writing the store ``out`` said in one line: its path, the space
    the unfinished images need (uint8, uncompressed: at most that), and the finished chunks
    kept for the same call to resume from."""
    try:
        yield
    except OSError as exc:
        if not is_disk_full(exc):
            raise
        import math

        partial, n = partial_path(out), chunks[-1][2]
        try:
            done = _rows_done(partial, chunks)
        except OSError:  # no partial store (yet, or any more)
            done = 0
        kept = (f"the finished chunks ({done:,} of {n:,} images) are kept in {partial}: free space "
                "there, then the same call again resumes there (overwrite=True, --overwrite, starts "
                "over)" if done else
                f"no chunk was finished, its partial store {partial} is kept: free space there or "
                "write the store to another disk" if partial.exists() else
                "nothing was written: free space there or write the store to another disk")
        raise disk_full(out, "the store", kept, needed=(n - done) * math.prod(shape),
                        cause=exc) from None


def write_rows(store: str, start: int, stop: int, block: np.ndarray) -> None:
    """Write the faces ``block`` as rows ``start:stop`` of the store ``store``."""
    zarr.open_array(Path(store) / IMAGES, mode="r+")[start:stop] = block


def _chunk_parts(read_part: Callable, task: tuple) -> list[tuple[Callable, tuple]] | None:
    """The :data:`TAIL_PARTS` parts of the one-chunk task ``task`` of :func:`write_store`
    (:class:`Split`): ``read_part`` calls of near-equal rows."""
    _, _, (chunk,), args, *_ = task
    bounds = _bounds(chunk[2] - chunk[1], TAIL_PARTS)
    if len(bounds) < 3:
        return None
    return [(read_part, (chunk, lo, hi, *args)) for lo, hi in zip(bounds[:-1], bounds[1:])]


def _write_joined(task: tuple, blocks: list[np.ndarray]) -> int:
    """Write the rows of the parts of ``task`` (:func:`_chunk_parts`), mark its chunk done;
    its rows."""
    _, store, (chunk,), *_ = task
    with writing_every_chunk():
        write_rows(store, chunk[1], chunk[2], np.concatenate(blocks))
    _mark_done(store, chunk[0])
    return chunk[2] - chunk[1]


def _bounds(n: int, parts: int) -> list[int]:
    """``0 = b_0 < ... < b_m = n``: ``0:n`` in ``m = min(parts, n)`` near-equal runs."""
    return [int(b) for b in np.linspace(0, n, min(parts, n) + 1).round()]


def _mark_done(store: str, index: int) -> None:
    """Mark chunk ``index`` of the partial store ``store`` written (:func:`_done` reads it)."""
    (Path(store) / DONE_DIR / str(index)).touch()


def split(items: Sequence, parts: int) -> list[list]:
    """``items`` in at most ``parts`` consecutive runs of near-equal length, none empty."""
    bounds = _bounds(len(items), parts)
    return [list(items[a:b]) for a, b in zip(bounds[:-1], bounds[1:])]


def run_tasks(func: Callable, tasks: list[tuple], *, n_jobs: int | None, client,
              refresh: Callable[[], None] = lambda: None,
              workers: Workers | None = None, split: Split | None = None,
              stop: tuple[Callable[[], None], Callable[[], None]] | None = None) -> list:
    """``[func(*task) for task in tasks]``, run on ``n_jobs`` cores (this process and
    ``n_jobs - 1`` spawned ones, or ``workers`` from :func:`worker_processes`; only this
    one for 1) or as Dask tasks on ``client``'s cluster; ``refresh`` is called about every
    :data:`POLL_SECONDS` while they run.  The first error is raised once the other tasks
    have ended (in worker processes, those not yet started never start).  ``split``: how
    worker processes may share the last tasks (:class:`Split`).

    A Dask task cannot be cancelled once it runs: ``stop`` is ``(ask, clear)``, where
    ``ask()`` asks the tasks to end early (they must look) and ``clear()`` takes the
    request back once they have; without it they run to their end.  Either way the error
    waits for them (the caller's clean-up, or its next call, must not race a worker still
    writing), up to :data:`STOP_WAIT_SECONDS` or a second Ctrl-C; then those not finished
    are cancelled, the request stays, and a note on the error says so.
    """
    if client is not None:
        return _run_dask(func, tasks, client, refresh, stop)
    n_jobs = resolve_jobs(n_jobs, None)
    if n_jobs == 1:
        return [func(*task) for task in tasks]
    if workers is None:
        with worker_processes(n_jobs, None) as started:
            assert started is not None  # n_jobs > 1 and no client: processes were started
            return _run_processes(func, tasks, refresh, started, split)
    return _run_processes(func, tasks, refresh, workers, split)


@dataclasses.dataclass
class Workers:
    """Worker processes started by :func:`worker_processes`: their pool, and the first
    task each was given (:func:`_ready`), done once that process has started."""

    pool: concurrent.futures.ProcessPoolExecutor
    starting: list[concurrent.futures.Future]


@contextlib.contextmanager
def worker_processes(n_jobs: int | None, client) -> Iterator[Workers | None]:
    """The ``n_jobs - 1`` worker processes of :func:`write_store` (``None`` where it needs
    none: ``n_jobs=1`` or a ``client``), started now with ``spawn`` (safe whatever threads
    the caller runs, which ``fork`` is not).

    Each needs about half a second to start (Python, numpy, zarr, this package): a caller
    that reads its inputs first (:func:`.ingest.ingest_celeba`) starts them before, so that
    they start meanwhile.  They stop when the block ends: on an error, once the tasks they
    run have ended; else at once, not waiting for one still starting (a job this process
    finished alone).
    """
    n_jobs = resolve_jobs(n_jobs, client)
    if client is not None or n_jobs is None or n_jobs == 1:  # None: only with a client
        yield None
        return
    pool = concurrent.futures.ProcessPoolExecutor(n_jobs - 1, mp_context=multiprocessing.get_context("spawn"))
    try:
        # one process each, which imports this module to run it
        yield Workers(pool, [pool.submit(_ready) for _ in range(n_jobs - 1)])
    except BaseException:
        pool.shutdown(wait=True, cancel_futures=True)
        raise
    pool.shutdown(wait=False)


def _ready() -> None:
    """A worker process's first task: nothing, once it has imported this module."""


def resolve_jobs(n_jobs: int | None, client) -> int | None:
    """``n_jobs`` checked, by default the usable CPUs; None with ``client``."""
    _refuse_bootstrapping_child()
    if client is not None and n_jobs is not None:
        raise InvalidInputError("give n_jobs (local worker processes) or client (a Dask cluster), not both")
    if client is not None:
        return None
    n_jobs = cpu_count() if n_jobs is None else n_jobs
    check_positive(n_jobs=n_jobs)
    return n_jobs


def _done(partial: Path) -> set[int]:
    """Indices of the chunks of ``partial`` marked done."""
    return {int(p.name) for p in (partial / DONE_DIR).iterdir() if p.name.isdigit()}


def _rows_done(partial: Path, chunks: Sequence[tuple]) -> int:
    """Rows of the chunks of ``partial`` marked done."""
    done = _done(partial)
    return sum(stop - start for index, start, stop, *_ in chunks if index in done)


def _is_resumable(partial: Path, settings: dict, shape: tuple, chunk_rows: int) -> bool:
    """Whether ``partial`` is an interrupted write of the same store."""
    if not (partial / DONE_DIR).is_dir():
        return False
    try:
        if read_capped(partial / DONE_DIR / CODE_FILE).decode() != code_digest():
            return False  # chunks of other code (or of a version before this check)
        group = zarr.open_group(partial, mode="r")
        images = group[IMAGES]
        if not isinstance(images, zarr.Array):
            return False
        return (dict(group.attrs) == {**settings, **marker_attributes(STORE_KIND)}
                and images.shape == shape and images.chunks[0] == chunk_rows)
    except (zarr.errors.BaseZarrError, KeyError, ValueError, OSError):
        return False


def _write_range(write_chunk, store: str, chunks: list[tuple], args: tuple, stop: str | None = None,
                 on_chunk=None) -> int:
    """Write ``chunks`` to ``store`` one after the other, marking each done; the rows written.

    What one task runs, in a worker process, a Dask worker or this process.  A Dask
    worker that does not find ``store`` (made by the caller) is on a machine that does not
    share the caller's folder, which it is told, by name.  Once the file ``stop`` (a name
    in :data:`DONE_DIR`) exists, another task of the call has failed: this one raises
    before its next chunk.
    """
    if not Path(store).is_dir():
        from ..cluster import not_here

        raise not_here(store, "the store being written", "writes")
    rows = 0
    stopped = None if stop is None else Path(store, DONE_DIR, stop)
    with writing_every_chunk():  # set here: a worker process does not inherit it
        for chunk in chunks:
            if stopped is not None and stopped.exists():  # the caller waits for this task to end
                raise RunError(f"stopped before chunk {chunk[0]}: another task of the write failed")
            written = write_chunk(store, *chunk, *args)
            _mark_done(store, chunk[0])
            rows += written
            if on_chunk is not None:
                on_chunk(written)
    return rows


@dataclasses.dataclass(frozen=True)
class Split:
    """How :func:`run_tasks` may split the last tasks, which would leave processes idle
    while one runs a whole task: ``parts(task)`` gives ``(func, args)`` pieces of it to run
    anywhere (or None: not this one), ``join(task, results)`` their results' union in
    this process, the task's result."""

    parts: Callable[[tuple], list[tuple[Callable, tuple]] | None]
    join: Callable[[tuple, list], object]


def _run_processes(func: Callable, tasks: list[tuple], refresh: Callable[[], None], workers: Workers,
                   split: Split | None = None) -> list:
    """:func:`run_tasks` on the processes of ``workers`` (:func:`worker_processes`) and
    this one.

    This process starts at once; a spawned one about half a second later.  This one takes
    tasks from the end of the list while a dispatching thread hands the front to the
    workers, one task to each that has started and is idle, so that both ends meet with
    every process busy to the last task.  (A pool given every task at once queues some
    behind a busy or starting worker, which this process could have run: a second of one
    process idle in a ten-second job, and a one-task job waiting for a worker to start.)
    With ``split``, a task taken when fewer are left than the workers is run in parts,
    by whichever process is idle: the processes end within a part of each other, not a task.
    """
    queue = _BothEnds([(i, None, func, task) for i, task in enumerate(tasks)],
                      split=None if split is None else (lambda i: split.parts(tasks[i])),
                      processes=len(workers.starting) + 1)
    futures: dict[concurrent.futures.Future, tuple] = {}  # a worker's item, by its future
    results: dict[int, object] = {}
    pieces: dict[int, dict[int, object]] = {}  # results of a split task's parts, by part
    arrived: SimpleQueue = SimpleQueue()  # (item, result) of the workers' parts
    failed = threading.Event()  # a task raised, or the pool broke: take no more
    errors: list[BaseException] = []  # of the dispatcher's own (a broken pool's)

    def dispatch() -> None:
        starting, running, idle = set(workers.starting), set(), 0
        try:
            while not failed.is_set():
                while idle and (item := queue.take_front()) is not None:
                    future = workers.pool.submit(item[2], *item[3])
                    futures[future] = item
                    running.add(future)
                    idle -= 1
                if not running and not queue.remaining():
                    return
                done, _ = concurrent.futures.wait(starting | running, timeout=DISPATCH_SECONDS,
                                                  return_when=concurrent.futures.FIRST_COMPLETED)
                for future in done:
                    starting.discard(future)
                    running.discard(future)
                    idle += 1
                    error = future.exception()
                    if error is not None:
                        failed.set()  # the caller raises it
                        if future not in futures:
                            errors.append(error)
                    elif future in futures and futures[future][1] is not None:  # a part
                        arrived.put((futures[future], future.result()))
        except BaseException as exc:  # pool.submit on a broken pool: raised by the caller
            errors.append(exc)
            failed.set()

    def finish(item: tuple, result) -> None:
        """Keep the result of ``item``; a split task's, once its parts are all back."""
        index, part = item[0], item[1]
        if part is None:
            results[index] = result
            return
        pieces.setdefault(index, {})[part[0]] = result
        if len(pieces[index]) == part[1]:
            done = pieces.pop(index)
            assert split is not None  # a task is in parts only where split says how
            results[index] = split.join(tasks[index], [done[k] for k in range(part[1])])

    def take_arrived() -> None:
        while not arrived.empty():
            finish(*arrived.get())

    dispatcher = threading.Thread(target=dispatch, name="dfairpca-dispatch", daemon=True)
    dispatcher.start()
    try:
        while not failed.is_set():
            item = queue.take_back()
            if item is None:
                break
            finish(item, item[2](*item[3]))
            take_arrived()
            refresh()
        while dispatcher.is_alive():
            dispatcher.join(POLL_SECONDS)
            take_arrived()
            refresh()
        for future, item in sorted(futures.items(), key=lambda pair: pair[1][:2]):
            result = future.result()  # the first task's error, raised here
            if item[1] is None:  # a whole task's (a part's came through arrived)
                results[item[0]] = result
        if errors:
            raise errors[0]
        take_arrived()
    except BaseException as exc:
        queue.close()  # the dispatcher hands out nothing more
        if isinstance(exc, concurrent.futures.process.BrokenProcessPool):
            exc.add_note("a worker process ended before its task did: its own error, if any, "
                         "is printed above (a script must start dfairpca's workers under "
                         "`if __name__ == \"__main__\":`)")
        # worker_processes shuts it down again if a second Ctrl-C cuts this short
        workers.pool.shutdown(wait=True, cancel_futures=True)
        raise
    return [results[i] for i in range(len(tasks))]


class _BothEnds:
    """Items handed out once each, from the front or from the back; with ``split``, an
    item taken when fewer than ``processes - 1`` are left after it is replaced by its parts
    (``split(index)``: ``(func, args)`` pairs, or None), of which the taker gets the first
    from its end and the others stay at that end, ``(index, (k, parts), func, args)``."""

    def __init__(self, items: list[tuple], split: Callable | None, processes: int):
        self._items = collections.deque(items)
        self._split, self._processes = split, processes
        self._lock = threading.Lock()

    def _take(self, front: bool) -> tuple | None:
        with self._lock:
            if not self._items:
                return None
            item = self._items.popleft() if front else self._items.pop()
            if self._split is None or item[1] is not None or len(self._items) >= self._processes - 1:
                return item
            parts = self._split(item[0])
            if not parts:
                return item
            parts = [(item[0], (k, len(parts)), *part) for k, part in enumerate(parts)]
            if front:
                self._items.extendleft(reversed(parts[1:]))
                return parts[0]
            self._items.extend(parts[:-1])
            return parts[-1]

    def take_front(self) -> tuple | None:
        return self._take(front=True)

    def take_back(self) -> tuple | None:
        return self._take(front=False)

    def remaining(self) -> int:
        with self._lock:
            return len(self._items)

    def close(self) -> None:
        with self._lock:
            self._items.clear()


def _refuse_bootstrapping_child() -> None:
    """Raise if this is a spawned process still importing its parent's main script: a
    script that starts writer processes outside ``if __name__ == "__main__":`` runs again
    in each of them, and would otherwise fail on the store's lock, misleadingly."""
    if getattr(multiprocessing.current_process(), "_inheriting", False):
        raise RunError(
            "n_jobs > 1 starts worker processes, which import your main script again: put "
            "the script's code under `if __name__ == \"__main__\":` (or use n_jobs=1)")


def _run_dask(func: Callable, tasks: list[tuple], client, refresh: Callable[[], None],
              stop: tuple[Callable[[], None], Callable[[], None]] | None) -> list:
    """:func:`run_tasks` as Dask tasks on ``client``'s cluster."""
    import distributed

    def wait(fs):
        try:
            distributed.wait(fs, timeout=POLL_SECONDS, return_when="FIRST_COMPLETED")
        except TimeoutError:
            pass

    # a lost scheduler, or a chunk that kills every worker that writes it: one line each
    with cluster_failures_said(client):
        futures = [client.submit(func, *task, pure=False) for task in tasks]
        try:
            return _wait_all(futures, wait, refresh)
        except BaseException as exc:
            _wind_down(client, futures, stop, exc)
            raise


def _wind_down(client, futures: list, stop: tuple[Callable[[], None], Callable[[], None]] | None,
               exc: BaseException) -> None:
    """After ``exc``: ask ``futures`` to stop (``stop``, see :func:`run_tasks`) and wait
    until none runs, saying after :data:`STOP_NOTICE_SECONDS` what it waits for.  Given up
    after :data:`STOP_WAIT_SECONDS` or at a second Ctrl-C: those not finished are cancelled
    (distributed cannot end one that runs: the request stays for it) and a note on ``exc``
    says so.  Nothing here hides ``exc``."""
    import distributed

    if stop is not None:
        try:
            stop[0]()
        except OSError:  # (a full disk): the tasks run to their ends, waited for all the same
            stop = None
    try:
        try:
            distributed.wait(futures, timeout=STOP_NOTICE_SECONDS)
        except TimeoutError:
            _log.warning("waiting up to %.0f s for %d Dask task(s) of the failed write to stop after "
                         "the chunk they write (Ctrl-C leaves them running)", STOP_WAIT_SECONDS,
                         sum(not f.done() for f in futures))
            distributed.wait(futures, timeout=STOP_WAIT_SECONDS - STOP_NOTICE_SECONDS)
    except (TimeoutError, KeyboardInterrupt):
        left = [f for f in futures if not f.done()]
        with contextlib.suppress(Exception):
            client.cancel(left)
        exc.add_note(f"{len(left)} of its Dask tasks had not finished when this call gave up waiting: "
                     "those that run stop after the chunk they write; let them end before the same "
                     "call again")
        return
    except Exception:  # noqa: S110 - a client that lost its scheduler waits for nothing
        return
    if stop is not None:
        with contextlib.suppress(OSError):
            stop[1]()


def _wait_all(futures: list, wait: Callable, refresh: Callable[[], None]) -> list:
    """The futures' results: wait for all (``wait`` blocks a moment), refreshing the
    progress between; raise the first error a future holds."""
    pending = list(futures)
    while pending:
        wait(pending)
        refresh()
        for future in [f for f in pending if f.done()]:
            future.result()  # raises the task's error
            pending.remove(future)
    return [future.result() for future in futures]
