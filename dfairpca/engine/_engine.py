"""The one pass: the reduction of ``dfairpca.engine._accumulator`` over the row chunks of X.

numpy input is walked block by block in this process.  Dask input becomes one chain of
tasks per worker thread: each task reads one row chunk (e.g. from Zarr), computes its
sums in the compute dtype (``chunk``) and adds them in place to the chain's running float64
total (``combine``), which stays on its worker; the few totals are combined at the end
(fan-in ``split_every``) and only the result, the upper triangle of a d x d matrix,
travels to the caller, who completes it (``finalize``).  What a worker holds is therefore
its threads' sums and the chunks at hand, independent of n, and nothing of size n x d is
ever gathered.  The computation runs on the active ``distributed.Client`` when there is
one (the Dask convention), otherwise on Dask's default scheduler.

When every worker of that Client leaves, the scheduler keeps the tasks and waits for new
workers, without a limit; inside :func:`dfairpca.engine._compute.worker_timeout` the computations
of this module end instead (:func:`dfairpca.engine._compute.compute`).
"""

from __future__ import annotations

import contextlib
import functools
import logging
from typing import TYPE_CHECKING
import pickle

import numpy as np
import numpy.typing as npt

from . import _accumulator
from ._accumulator import ExactTotal, RunningTotal
from ..base._system import cpu_count, rows_per_block
from ..base.progress import progress_bar, reporting
from ._compute import (check_workers_hold, compute, scheduler_workers, current_timeout, gather_watched, cluster_failures_said, on_scheduler, submit,
                       worker_timeout)
from ._memory import PASS_BYTES_PER_THREAD, WorkingSet, pass_working_set, working_set
from ..stats._auto import AutoChoice, auto_choice, forced_choice
from ..stats._exact import check_exact, check_unweighted, is_exact
from ..stats.moments import Moments
from ..base._typing import ArrayInput
from ..errors import InvalidInputError
from ..base._params import is_int
from ..inputs._weights import check_sample_weight
from ..io import check_inputs_shared
from ..stats._int_kernels import chosen_kernel

# Deferred imports: dask, distributed (heavy or optional), package modules that load such libraries,
# or this module, at import and standard modules needed rarely or on one platform only are imported
# in the functions that use them, so that importing this module stays light.

_log = logging.getLogger("dfairpca")
#: the differing workers' kernels already said (:func:`check_worker_kernels`)
_KERNELS_SAID: set = set()
#: each (client, dtype, workers)'s answers (:func:`check_worker_kernels`)
_KERNELS_ASKED: dict = {}

if TYPE_CHECKING:
    import dask.array

__all__ = ["compute_moments", "checked_request", "check_pass_dtype", "coded_moments", "run_moments_pass",
           "chain_reduce", "check_pass_fits", "moments_sums_bytes"]

#: data shared by every chunk (pickled size) up to which it is copied into each fold task
SHARED_INLINE_BYTES = 1 << 20

#: how long a finished pass waits for its progress bar's last line (drawn every 0.1 s)
BAR_END_SECONDS = 2.0

#: seconds between two looks at whether the scheduler has a pass's key, before its count
FOLLOW_LOOK_SECONDS = 0.05


def compute_moments(
    X: npt.ArrayLike | dask.array.Array,
    *,
    sensitive_features: ArrayInput | None = None,
    mask: npt.ArrayLike | None = None,
    dtype: npt.DTypeLike = np.float64,
    split_every: int = 8,
    group_scatter: bool = False,
    progress: bool = False,
    row_offset: int = 0,
    timeout: float | None = None,
    sample_weight=None,
) -> Moments:
    """Statistics of all rows of X (numpy or Dask, 2-D) in one chunked pass.

    Parameters
    ----------
    X : array of shape (n, d), numpy or Dask
        Dask input is reduced on the active ``distributed.Client`` (else Dask's default
        scheduler), its row chunks read where they are folded; nothing of size n x d is
        gathered.
    sensitive_features : array-like of shape (n,) or (n, p), or DataFrame, optional
        Group labels of every row for each protected attribute, of any type (as
        :meth:`dfairpca.FairPCA.fit` takes them); a small in-memory array.
    mask : bool array of shape (n,), optional
        Rows to use (equal opportunity keeps only the rows with ``y == 1``).
    dtype : numpy float dtype or "exact", default float64
        Dtype of the chunks' products (float32 for images); float64 sums regardless.
        "exact" (integer or boolean X only): integer sums without rounding, centred in
        float64 at the end with one rounding per entry, bit-identical for any chunking,
        cluster or merge order (:mod:`dfairpca.stats._exact`); the result keeps the raw
        sums in :attr:`Moments.exact`.
    split_every : int, default 8
        Fan-in of the merges of the pass's running sums (one per worker thread).
    group_scatter : bool, default False
        Also keep every group's scatter matrix (Fair PCA-S).
    progress : bool, default False
        Report the pass on standard error: a bar on a terminal, whole lines elsewhere
        (:mod:`dfairpca.base.progress`).
    row_offset : int, default 0
        Global index of X's first row (for the NaN report when X is a slice).
    timeout : float, optional
        Seconds the pass waits once every worker of the active Client has left, for new
        ones to take over; then it stops with :class:`~dfairpca.cluster.WorkersLost`.
        Default None: it waits as long as it takes.
    sample_weight : array-like of shape (n,), optional
        Frequency weights of the rows (finite, >= 0; a Dask array is rechunked to X's row
        chunks and its values checked in the pass): a row of weight w counts as w copies
        of itself, and ``n`` and the group counts of the result are totals of weights.

    Returns
    -------
    Moments
    """
    codes, categories, sample_weight = checked_request(X, sensitive_features, mask, split_every,
                                                       sample_weight)
    check_pass_dtype(X, dtype, sample_weight is not None)
    with worker_timeout(timeout):
        return coded_moments(X, codes, categories, mask=mask, dtype=dtype,
                             split_every=split_every, group_scatter=group_scatter,
                             progress=progress, row_offset=row_offset, weights=sample_weight)


def checked_request(X, sensitive_features, mask, split_every, sample_weight):
    """What the public functions of a pass check once, before any work, as the estimators
    do for theirs: the groups encoded (codes, categories), ``mask`` one per row,
    ``split_every`` >= 2, and the sample weights checked (a Dask array rechunked to X's
    row chunks).  Below this boundary the engine trusts what it is handed.

    Returns
    -------
    tuple
        (codes or None, categories, the checked weights or None).
    """
    import dask.array as da

    n = np.shape(X)[0]
    if not (is_int(split_every) and split_every >= 2):
        raise InvalidInputError(f"split_every must be at least 2; got {split_every}")
    if mask is not None and len(mask) != n:
        raise InvalidInputError(f"mask has {len(mask)} rows but X has {n}")
    codes, categories = None, []
    if sensitive_features is not None:
        from ..inputs._groups import encode_groups

        g = encode_groups(sensitive_features, n, mask=mask, require_two=False)
        codes, categories = g.codes, g.categories
    weights = check_sample_weight(sample_weight, n, X.chunks[0] if isinstance(X, da.Array) else None)
    return codes, categories, weights


def check_pass_dtype(X, dtype, weighted: bool) -> None:
    """Refuse, before any work, exact statistics (``dtype`` "exact") of ``weighted`` rows,
    or of an X whose dtype is not integer or whose sums would not fit int64: the check of
    the public functions of a pass, which take a dtype as given (the estimators' dtype is
    checked where it is decided, :func:`dfairpca.stats._exact.statistics_dtype`)."""
    check_unweighted(dtype, weighted)
    if is_exact(dtype):
        check_exact(X.dtype, X.shape[0])


def coded_moments(X, codes=None, categories=(), *, weights=None, **kw) -> Moments:
    """:func:`compute_moments` of groups already encoded: ``codes`` (n, p) indices into
    ``categories`` (p label arrays), the estimators' route; ``kw`` as :func:`run_moments_pass`.

    It trusts its arguments as the estimators and :func:`compute_moments` check them
    (:func:`checked_request`): codes and mask one per row, weights checked and chunked
    like X's rows.  A weighted pass is still refused when no row has a positive weight, which
    only the pass sees of Dask weights (:meth:`RunningTotal.finalize
    <dfairpca.engine._accumulator.RunningTotal.finalize>` says so)."""
    return run_moments_pass(X, codes, categories, weights=weights, **kw).finalize()


def run_moments_pass(
    X,
    codes=None,
    categories=(),
    *,
    mask=None,
    dtype=np.float64,
    split_every: int = 8,
    group_scatter: bool = False,
    progress: bool = False,
    row_offset: int = 0,
    n_chains: int | None = None,
    weights=None,
) -> RunningTotal | ExactTotal:
    """The pass itself: the running total of all rows of X, for a caller that goes on
    adding to it (the checkpointed pass) or finalizes it.

    ``codes`` (n, p) and ``mask`` (n,) are small numpy arrays; they are sliced to each
    chunk.  ``n_chains`` is how many running sums a Dask pass keeps (default: one per
    thread of the active Client's workers, or of Dask's local pool); ``split_every`` is
    the fan-in of the merges of those sums.  ``weights`` (n,): frequency weights,
    checked (:func:`dfairpca.inputs._weights.check_sample_weight`), numpy or a Dask array
    with X's row chunks.  Other arguments as :func:`compute_moments`; they are trusted as
    checked there (:func:`checked_request`) or by the estimators.
    """
    import dask.array as da

    kw = dict(categories=list(categories), dtype=dtype, group_scatter=group_scatter)
    if isinstance(weights, da.Array) and not isinstance(X, da.Array):
        (weights,) = compute(weights)  # n numbers, against X in memory
    chunk_args = _chunk_args(X, weights, codes, mask, row_offset)
    if not isinstance(X, da.Array):
        X = np.asarray(X)
        n, d = X.shape
        rows = rows_per_block(d * X.itemsize)
        total = None
        starts = range(0, max(n, 1), rows)  # (no rows: one empty block, the sums of none)
        if progress:  # one step per block of rows (a Dask pass: one per task)
            starts = with_bar(starts, "pass", "block")
        for s in starts:
            e = min(n, s + rows)
            # the running sum is ours: each block is added into it in place
            total = _accumulator.fold(total, X[s:e], *chunk_args(s, e), **kw)
        assert total is not None  # (the loop folds at least one block)
        if isinstance(total, ExactTotal):  # no chunk will come: its pending products in, its scratch freed
            total.settle()
        return total

    if X.ndim != 2:
        raise InvalidInputError(f"X must be 2-D (n, d); got shape {X.shape}")
    if is_exact(dtype):
        check_worker_kernels(X.dtype)
    sums = moments_sums_bytes(X.shape[1], categories, group_scatter)
    # the pass's own arguments bound once, each task adding its chunk's (the partial's
    # function travels to the workers by name, its bound arguments with every task as a
    # task's own arguments do)
    total = chain_reduce(X, functools.partial(_accumulator.fold, **kw), _accumulator.combine, chunk_args,
                         split_every=split_every, progress=progress, n_chains=n_chains, sums=sums)
    if isinstance(total, ExactTotal):  # no chunk will come: its pending products in, its scratch freed
        total.settle()
    return total


def chain_reduce(X, fold, combine, chunk_args, *, split_every: int = 8, progress: bool = False,
                 n_chains: int | None = None, sums: int = 0):
    """Reduce the row chunks of the Dask array X the way the pass does, for any sums.

    One chain per thread of the cluster (``n_chains``, default :func:`threads`): each task
    reads one row chunk where it runs and folds it into the chain's running sums in place,
    ``acc = fold(acc, rows, *chunk_args(s, e))`` (acc None for a chain's first chunk; rows
    ``s:e`` of X as numpy), so what a process holds is its threads' sums plus the chunk at
    hand, whatever n is; then ``combine(list of sums)`` merges the chains' sums in a tree
    of fan-in ``split_every``.  ``fold`` and ``combine`` are module-level functions, or
    partials of them (the functions travel to the workers by name, a partial's arguments
    with every task); numpy data in ``chunk_args`` is embedded per task, so large data
    every chunk needs belongs in a ``dask.delayed`` object (one key, sent once per
    worker).  Runs on the active ``distributed.Client`` when there is one.

    ``sums``: the bytes a chain holds besides its chunk (its running sums and the chunk's
    product).  With the chunk, that is the pass's working set per thread
    (:func:`dfairpca.engine._memory.working_set`): a pass that a worker cannot hold below
    the memory at which distributed pauses it is refused before any work
    (:class:`~dfairpca.cluster.WorkersTooSmall`), and it is named if every worker stays
    paused (:class:`~dfairpca.cluster.WorkersPaused`).
    """
    import dask
    from dask import delayed

    check_inputs_shared(X)  # a worker that cannot see a local store: said now, by name
    if len(X.chunks[1]) > 1:  # a fold needs whole rows: merge the column chunks of each row chunk
        X = X.rechunk({1: -1})
    need = check_pass_fits(X, sums)
    bounds = np.concatenate([[0], np.cumsum(X.chunks[0])]).astype(int)
    blocks, shared = _block_sources(X)
    slots = _worker_slots()  # one entry per thread of the active Client's workers
    width = max(1, min(len(blocks), n_chains or threads()))
    step = delayed(_fold_block, pure=True)
    parts = []
    for c, run in enumerate(np.array_split(np.arange(len(blocks)), width)):
        # a chain prefers its own worker (else Dask would put every chain next to the data
        # the folds share); allow_other_workers lets another take over if it dies
        where = dict(workers=[slots[c % len(slots)]], allow_other_workers=True) if slots else {}
        acc = None
        with dask.annotate(**where):
            for i in run:
                acc = step(fold, acc, blocks[i], shared, *chunk_args(int(bounds[i]), int(bounds[i + 1])))
        parts.append(acc)
    combined = delayed(combine, pure=True)
    while len(parts) > 1:  # the chains' sums: a tree of fan-in split_every, in place
        parts = [combined(parts[i : i + split_every]) for i in range(0, len(parts), split_every)]
    root = parts[0]
    with pass_working_set(need):
        if progress:
            return _compute_with_progress(root)
        (result,) = compute(root)
    return result


def moments_sums_bytes(d: int, categories=(), group_scatter: bool = False) -> int:
    """The bytes a chain of the moments pass holds besides its chunk: its d x d sums and its
    chunk's product, and as much again per group for the groups' scatters of Fair PCA-S."""
    scatters = sum(len(c) for c in categories) if group_scatter else 0
    return PASS_BYTES_PER_THREAD * (1 + scatters) * int(d) ** 2


def check_pass_fits(X, sums: int) -> WorkingSet:
    """The working set per thread of a pass over the Dask array X whose chains hold
    ``sums`` bytes (:func:`dfairpca.engine._memory.working_set`), refused with
    :class:`~dfairpca.cluster.WorkersTooSmall` if a worker of the active Client cannot hold
    it below the memory at which distributed pauses it.  Called before anything of the
    fit reads a chunk: a read of a chunk too large already pauses (or kills) a worker."""
    d = int(np.prod(X.shape[1:]))
    need = working_set(X.chunks[0], d, X.dtype.itemsize, sums)
    check_workers_hold(need, chains=len(X.chunks[0]))  # a pass runs no more chains than chunks
    return need


def _fold_block(fold, acc, block, shared, *args):
    """``fold(acc, rows, *args)`` of one chunk, read here (see :func:`_block_sources`)."""
    if isinstance(block, _Block):
        block = block.compute(shared)
    return fold(acc, block, *args)


def _block_sources(X) -> tuple[list, dict]:
    """What each fold task gets for its row chunk, and the data shared by all chunks.

    A chunk whose graph is its own (read a Zarr chunk, cast, expand through a kernel...)
    becomes a :class:`_Block` that the fold computes itself.  Were the reads separate
    tasks, they would be ready from the start and idle workers would run them far ahead of
    the chains, holding chunks of X in memory.  Small data every chunk uses (the Zarr
    array object) is copied into every block; large data (Nyström landmarks) stays one key
    of the graph, a dependency of every fold, so it travels once per worker.  A graph
    whose chunks share *work* (a rechunk that splits chunks, a statistic of all of X)
    cannot be split like that: its chunks stay plain task dependencies.
    """
    from dask.core import flatten, istask
    from dask.delayed import Delayed
    from dask.optimization import cull

    keys = list(flatten(X.__dask_keys__()))
    fallback: tuple[list, dict] = (list(X.to_delayed().ravel()), {})
    try:
        dsk = dict(X.__dask_optimize__(X.__dask_graph__(), keys))
        subs = [cull(dsk, k)[0] for k in keys]
    except Exception:  # an exotic graph: let Dask schedule it as it stands
        return fallback
    # a key the graph only refers to (a future: a model's matrix already on the cluster,
    # see dfairpca.cluster.ship) cannot be computed inside a block: Dask schedules it
    if any(dep not in dsk for node in dsk.values() for dep in getattr(node, "dependencies", ())):
        return fallback
    seen: dict = {}
    for sub in subs:
        for k in sub:
            seen[k] = seen.get(k, 0) + 1
    shared = {k for k, c in seen.items() if c > 1}
    if any(istask(dsk[k]) for k in shared):
        return fallback
    try:  # small shared data (the Zarr array object) is simply copied into every fold
        shared = {k for k in shared if len(pickle.dumps(dsk[k])) > SHARED_INLINE_BYTES}
    except Exception:
        pass
    deps = {k: Delayed(k, {k: dsk[k]}) for k in shared}
    blocks = [_Block({k: v for k, v in sub.items() if k not in shared}, key, X.name)
              for sub, key in zip(subs, keys)]
    return blocks, deps


class _Block:
    """One row chunk of a Dask array as a self-contained graph, computed where it is used."""

    def __init__(self, graph: dict, key, name: str):
        self.graph, self.key, self.name = graph, key, name

    def __dask_tokenize__(self):
        return ("dfairpca-block", self.name, str(self.key))

    def compute(self, shared: dict | None = None):
        import dask

        return dask.get({**self.graph, **(shared or {})}, self.key)


def check_worker_kernels(x_dtype) -> dict:
    """Each worker of the active Client chooses and self-tests its exact kernel for
    ``x_dtype`` before the pass; where a worker's choice differs from this process's (a
    CPU that refuses the 8-bit kernel, or a worker without the `mkl` extra), say so once
    in a log record naming the workers.  The statistics stay exact either way (every
    kernel forms the same integers) and their kernel name lists every kernel used; the
    record tells a user why the pass is slower than the client's CPU promised.

    Returns ``{worker address: kernel name}`` ({} without a Client).
    """
    try:
        from distributed import get_client

        client = get_client()
    except (ImportError, ValueError):
        return {}
    here = chosen_kernel(x_dtype)
    # asked once per set of workers (a checkpointed pass runs one pass per segment): the
    # client's cached view of its workers costs no round trip
    workers = frozenset(scheduler_workers(client))
    key = (id(client), str(np.dtype(x_dtype)), workers)
    if key in _KERNELS_ASKED:
        return _KERNELS_ASKED[key]
    with cluster_failures_said(client):
        answers = client.run(chosen_kernel, str(np.dtype(x_dtype)), on_error="return")
    # a worker that could not answer (gone, or an error of its own) says it in the pass
    there = {addr: name for addr, name in answers.items() if isinstance(name, str)}
    _KERNELS_ASKED[key] = there
    differ = sorted(addr for addr, name in there.items() if name != here)
    said = (here, tuple((a, there[a]) for a in differ))
    if differ and said not in _KERNELS_SAID:  # once per process (a checkpointed pass asks per segment)
        _KERNELS_SAID.add(said)
        _log.warning("exact statistics: %d of %d workers form their sums with another kernel "
                     "than this process's %s (%s): %s; the sums are the same integers, the "
                     "pass is slower where the 8-bit kernel is refused",
                     len(differ), len(there), here,
                     ", ".join(f"{a}: {there[a]}" for a in differ[:5])
                     + (f" and {len(differ) - 5} more" if len(differ) > 5 else ""),
                     "a CPU without VNNI or AMX, or a worker without dfairpca's mkl extra")
    return there


def _auto_on_worker(x_dtype: str, width: int) -> dict:
    return auto_choice(x_dtype, width).as_dict()


def auto_choice_for_pass(x_dtype, width: int) -> AutoChoice:
    """What compute_dtype="auto" uses for a pass over 8-bit ``x_dtype`` rows of ``width``
    columns: this process's measured choice (:func:`dfairpca.stats._auto.auto_choice`),
    or with an active Client every worker's, each measured on its own CPU once per worker
    process, and exact only where every worker chose exact (one kind of products per
    pass: float32 sums cannot be merged into exact ones).  A worker that could not answer
    leaves the choice to the others (the pass says what became of it)."""
    if forced_choice() is not None:  # this process's environment decides, for every worker
        return auto_choice(x_dtype, width)
    try:
        from distributed import get_client

        client = get_client()
    except (ImportError, ValueError):
        return auto_choice(x_dtype, width)
    with cluster_failures_said(client):
        answers = client.run(_auto_on_worker, str(np.dtype(x_dtype)), int(width), on_error="return")
    said = [AutoChoice(**{k: v for k, v in a.items() if k not in ("description",)})
            for a in answers.values() if isinstance(a, dict)]
    if not said:
        return auto_choice(x_dtype, width)
    # the worker whose exact kernel fared worst speaks for the cluster: its timings say why
    worst = max(said, key=lambda c: (c.choice != "exact", c.ratio or 0.0))
    return AutoChoice(worst.choice, worst.width, worst.kernel, worst.rows, worst.exact_s, worst.float32_s,
                      worst.forced, len(said))


def _worker_slots() -> list:
    """The active Client's worker addresses, each repeated once per thread ([] without one)."""
    try:
        from distributed import get_client

        client = get_client()
    except (ImportError, ValueError):
        return []
    with cluster_failures_said(client):  # a Client that has lost its scheduler: one line
        nthreads = client.nthreads()
    return [addr for addr, t in sorted(nthreads.items()) for _ in range(t)]


def threads() -> int:
    """Threads of the active distributed cluster, else of Dask's local pool."""
    return len(_worker_slots()) or _local_threads()


def _local_threads() -> int:
    """Threads of Dask's local scheduler (the default threaded pool unless configured)."""

    import dask

    if dask.config.get("scheduler", None) in ("sync", "synchronous", "single-threaded"):
        return 1
    return int(dask.config.get("num_workers", None) or cpu_count())


def row_slice(a, s: int, e: int):
    """Rows ``s:e`` of a per-row array (codes, mask), or None."""
    return None if a is None else a[s:e]


def _chunk_args(X, weights, codes, mask, row_offset: int):
    """The arguments of rows ``s:e`` of :func:`dfairpca.engine._accumulator.fold`, in its
    order (codes, mask, row offset, and the weights if any): numpy codes, mask and weights
    are sliced into every task; a Dask array of weights' chunk (its row chunks are X's) is a
    dependency of the fold of the same rows, so its values are read, and checked, where
    that fold runs."""
    import dask.array as da

    if weights is None:
        return lambda s, e: (row_slice(codes, s, e), row_slice(mask, s, e), row_offset + s)
    if isinstance(weights, da.Array):
        bounds = np.concatenate([[0], np.cumsum(X.chunks[0])]).astype(int)
        if tuple(weights.chunks[0]) != tuple(X.chunks[0]):
            raise InvalidInputError(
                f"sample_weight's row chunks {weights.chunks[0][:4]}... differ from X's "
                f"{X.chunks[0][:4]}...: rechunk it like X (weights.rechunk({{0: X.chunks[0]}}))")
        blocks = dict(zip(bounds[:-1].tolist(), weights.to_delayed().ravel()))
        return lambda s, e: (row_slice(codes, s, e), row_slice(mask, s, e), row_offset + s, blocks[s])
    return lambda s, e: (row_slice(codes, s, e), row_slice(mask, s, e), row_offset + s, weights[s:e])


def with_bar(steps, desc: str, unit: str):
    """Iterate over ``steps`` (a sized iterable), one step of a progress bar each
    (:func:`dfairpca.base.progress.progress_bar`: tqdm on a terminal, whole lines elsewhere)."""
    with reporting(True):
        bar = progress_bar(len(steps), desc, unit)
    if bar is None:
        yield from steps
        return
    try:
        for s in steps:
            yield s
            bar.update(1)
    finally:
        bar.close()


def _compute_with_progress(root):
    """Compute ``root`` with a bar of its tasks on the open report (a terminal's redrawn
    in place, a log's in whole lines): from the scheduler's progress when a Client is
    active, else from Dask's local scheduler's callbacks."""
    try:
        from distributed import get_client

        client = get_client()
    except (ImportError, ValueError):
        client = None
    with reporting(True):
        bar = progress_bar(None, "pass", "task")
    if bar is None:  # no stream to report to
        (result,) = compute(root)
        return result
    try:
        if client is None:
            with _TaskCounter(bar):
                return root.compute()
        import threading

        # the scheduler's progress blocks until the end: followed by a thread, while this one
        # waits for the result (watching the workers, see gather_watched); the thread ends
        # with the future, or with the Client
        from distributed import Future

        seconds = current_timeout()
        with cluster_failures_said(client):
            fut = submit(client, root, seconds)
        # the scheduler's count waits until it knows the pass's key, polling for ever if the
        # key was released first: the thread holds the key (its own reference, which it
        # releases) until its count has found it, however late the thread starts
        done = threading.Event()
        try:
            held: Future = Future(fut.key, client)
            follow = threading.Thread(target=_follow, args=(held, bar, done), daemon=True)
            follow.start()
            result = gather_watched(client, [fut], seconds)[0]
            follow.join(BAR_END_SECONDS)  # its last count before anything that follows
        finally:
            done.set()  # the count draws no more, and lets the key go once it has found it
        return result
    finally:
        bar.close()


def _follow(fut, bar, done) -> None:
    """Feed ``bar`` the scheduler's count of ``fut``'s tasks until it finishes; ``fut`` (the
    thread's own reference to the pass's key) is released then, or as soon as the count has
    found the key once ``done`` is set (the caller has its result, or gave up on it: a pass
    that failed or was interrupted is not kept running for a bar nobody reads)."""
    from distributed.diagnostics.progressbar import TextProgressBar

    class Feed(TextProgressBar):
        def _draw_bar(self, remaining, all, **kwargs):
            if done.is_set():
                # the count has found the key (it answers only then): releasing it now
                # cannot leave it waiting for a key that is gone; it stops on its release
                fut.release()
            else:
                bar.update_to(all - remaining, total=all)

        def _draw_stop(self, **kwargs):
            pass

    try:
        # the count starts once the scheduler has the key (a graph it refused never gets
        # there: a count of it would poll for ever), and not once the caller is done
        while not done.is_set():
            try:
                known = on_scheduler(fut.client, "knows", fut.key)
            except Exception:  # noqa: BLE001 - a scheduler that refuses to run it: count anyway
                known = True
            if known:
                with contextlib.suppress(Exception):  # the Client closed under it: the result says why
                    Feed([fut])
                break
            done.wait(FOLLOW_LOOK_SECONDS)
    finally:
        with contextlib.suppress(Exception):  # a Client already closed released it
            fut.release()


class _TaskCounter:
    """Dask's local-scheduler callback that feeds a bar the count of finished tasks."""

    def __init__(self, bar):
        from dask.callbacks import Callback

        self.bar = bar
        counter = self

        class Count(Callback):
            def _start_state(self, dsk, state):
                counter.total = sum(len(state[k]) for k in ("ready", "waiting", "running", "finished"))
                counter.done = len(state["finished"])

            def _posttask(self, key, result, dsk, state, worker_id):
                counter.done += 1
                counter.bar.update_to(counter.done, total=counter.total)

        self.total, self.done, self.callback = 0, 0, Count()

    def __enter__(self):
        self.callback.__enter__()
        return self

    def __exit__(self, *exc):
        return self.callback.__exit__(*exc)