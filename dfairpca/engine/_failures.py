"""The ways a computation on a cluster fails, each saying what happened and how to go on.

Workers lost, the scheduler lost, a task that killed every worker that ran it, workers
paused for memory, and workers too small for a pass: raised by :mod:`dfairpca.engine._compute`,
documented and pickled under their public names in :mod:`dfairpca.cluster`.  Each failure of
:data:`CLUSTER_FAILURES` gives, through ``saved(checkpoint, progress)``, the same failure
saying what a checkpoint kept.
"""

from __future__ import annotations

from ..errors import DfairpcaError, RunError
from ._memory import WorkingSet, gib


class NoWorkers(DfairpcaError, ConnectionError):
    """The scheduler answered, but no worker joined it within the timeout."""

    # documented, raised and pickled under the public name dfairpca.cluster.NoWorkers
    __module__ = "dfairpca.cluster"


class _LostDuringFit:
    """What :class:`WorkersLost`, :class:`SchedulerLost` and :class:`WorkerKilled` share: the scheduler's
    ``address``; a checkpointed fit's ``checkpoint`` and its ``progress``, such as "16 of 60
    chunks" (else both None); ``what`` happened, without the way on; and a message of what
    happened then the way on: start what was lost and fit again, or continue from the
    checkpoint."""

    address: str
    checkpoint: object
    progress: str | None
    what: str

    def _message(self, what: str, start: str, otherwise: str = "", again: str = "fit again") -> str:
        """``what`` then the way on: ``start`` (what to start again) and ``again`` (or
        ``otherwise``), or, with a checkpoint, run the same call to continue from it."""
        self.what = what
        if self.checkpoint is None:
            return f"{what}; {start} and {again}{otherwise}"
        return (f"{what}; the checkpoint {str(self.checkpoint)!r} holds {self.progress}: {start} "
                "and run the same call again to continue")

    def _memory_message(self, what: str, fix: str, fix_resumed: str, after: str = "") -> str:
        """``what`` then the way on for workers short of memory: ``fix`` and run again, or,
        with a checkpoint, ``fix_resumed`` and run the same call to continue (``after``)."""
        self.what = what
        if self.checkpoint is None:
            return f"{what}; {fix}, then run again"
        return (f"{what}; the checkpoint {str(self.checkpoint)!r} holds {self.progress}: {fix_resumed}, "
                f"then run the same call again to continue{after}")

    def _again(self, checkpoint, progress: str):
        raise NotImplementedError

    def saved(self, checkpoint, progress: str):
        """The same loss, saying that ``checkpoint`` holds ``progress``.

        Parameters
        ----------
        checkpoint : str or os.PathLike
            The checkpoint of the interrupted pass, named in the message.
        progress : str
            What it holds (e.g. "12 of 40 segments"), said in the message.

        Returns
        -------
        WorkersLost, SchedulerLost or WorkerKilled
            A new error of the same class with the longer message; raise it ``from`` this
            one.
        """
        return self._again(checkpoint, progress)


class WorkersLost(_LostDuringFit, NoWorkers):
    """Every worker left while a fit computed, and none joined within its ``timeout``.

    ``seconds`` is that timeout, ``address`` the scheduler's; a checkpointed fit also says
    where it saved what it had finished: ``checkpoint``, and ``progress`` such as "16 of
    60 chunks" (else both None).  ``what`` is what happened, without the way on.
    """

    __module__ = "dfairpca.cluster"

    def __init__(self, seconds: float, address: str, checkpoint=None, progress: str | None = None):
        self.seconds, self.address = seconds, address
        self.checkpoint, self.progress = checkpoint, progress
        super().__init__(self._message(
            f"the Dask scheduler at {address} has had no workers for {seconds:g} s: all left "
            "during the fit and none joined, so it stopped",
            f"start workers (`dask worker {address}`)", ", or wait longer with a larger timeout"))

    def _again(self, checkpoint, progress: str) -> "WorkersLost":
        return WorkersLost(self.seconds, self.address, checkpoint, progress)


class SchedulerLost(_LostDuringFit, DfairpcaError, ConnectionError):
    """The Client lost its Dask scheduler while it computed, or between two computations:
    the scheduler stopped, or the network to it failed; the scheduler's tasks and results
    are gone with it.

    ``address`` is the scheduler's; a checkpointed fit also says where it saved what it had
    finished: ``checkpoint``, and ``progress`` such as "16 of 60 chunks" (else both None).
    ``what`` is what happened, without the way on.
    """

    __module__ = "dfairpca.cluster"

    def __init__(self, address: str, checkpoint=None, progress: str | None = None):
        self.address, self.checkpoint, self.progress = address, checkpoint, progress
        super().__init__(self._message(
            f"lost the Dask scheduler at {address} (it stopped, or the network to it failed)",
            "start a scheduler and its workers again", again="run again"))

    def _again(self, checkpoint, progress: str) -> "SchedulerLost":
        return SchedulerLost(self.address, checkpoint, progress)


class WorkerKilled(_LostDuringFit, DfairpcaError, RuntimeError):
    """One task killed every Dask worker that ran it (distributed gives up on a task after
    ``distributed.scheduler.allowed-failures`` such deaths, 3 by default): typically a
    worker's nanny restarting it past its memory limit, or the system's out-of-memory
    killer.

    ``address`` is the last worker that died running it, ``memory_limit`` that worker's
    limit in bytes (None if unknown or unlimited), ``deaths`` how many workers died running
    it; ``checkpoint`` and ``progress`` as :class:`WorkersLost`.  ``what`` is what
    happened, without the way on.
    """

    __module__ = "dfairpca.cluster"

    def __init__(self, address: str, memory_limit: int | None, deaths: int, checkpoint=None,
                 progress: str | None = None):
        self.address, self.memory_limit, self.deaths = address, memory_limit, deaths
        self.checkpoint, self.progress = checkpoint, progress
        limit = ("no memory limit" if not memory_limit
                 else f"memory limit {gib(memory_limit)}")
        fix = "give the workers more memory (`dask worker --memory-limit`)"
        super().__init__(self._memory_message(
            f"the Dask worker at {address} ({limit}) died running a task that {deaths} "
            "workers in turn died running, so Dask gave it up (a worker's nanny restarts "
            "it past its memory limit; the system may kill it when memory runs out)",
            f"{fix} or read smaller row chunks", fix))

    def _again(self, checkpoint, progress: str) -> "WorkerKilled":
        return WorkerKilled(self.address, self.memory_limit, self.deaths, checkpoint, progress)


#: the ways on from workers too small for a pass, without and with a checkpoint: smaller
#: row chunks are another job, which a checkpoint does not resume
MEMORY_FIX = ("read smaller row chunks (`rows_per_chunk=`), give each worker more memory "
              "(`dask worker --memory-limit`) or fewer threads (`dask worker --nthreads`)")
MEMORY_FIX_RESUMED = ("give each worker more memory (`dask worker --memory-limit`) or fewer threads "
                      "(`dask worker --nthreads`)")


class WorkersPaused(_LostDuringFit, DfairpcaError, RuntimeError):
    """Every Dask worker stayed paused for memory for the fit's ``timeout`` while a pass
    waited on it: distributed pauses a worker whose process memory passes
    ``distributed.worker.memory.pause`` of its limit (80% by default), a paused worker
    runs no task, and nothing restarts it (its nanny does only past ``terminate``).

    ``seconds`` is that timeout, ``address`` the scheduler's, ``workers`` the paused
    workers as ``(address, memory limit in bytes or 0)``, ``working_set`` the pass's
    :class:`~dfairpca.engine._memory.WorkingSet` where known (else None); ``checkpoint``
    and ``progress`` as :class:`WorkersLost`.  ``what`` is what happened, without the way
    on.  A worker that pauses and resumes within the timeout is no error.
    """

    __module__ = "dfairpca.cluster"

    def __init__(self, seconds: float, address: str, workers, working_set: WorkingSet | None = None,
                 checkpoint=None, progress: str | None = None):
        self.seconds, self.address, self.workers = seconds, address, list(workers)
        self.working_set, self.checkpoint, self.progress = working_set, checkpoint, progress
        named = ", ".join(f"{a} ({'no memory limit' if not m else f'memory limit {gib(m)}'})"
                          for a, m in self.workers[:5])
        if len(self.workers) > 5:
            named += f" and {len(self.workers) - 5} more"
        need = "" if working_set is None else f"; the pass needs {working_set.describe()}"
        super().__init__(self._memory_message(
            f"every Dask worker of the scheduler at {address} has been paused for memory "
            f"for {seconds:g} s (distributed pauses a worker past "
            f"`distributed.worker.memory.pause` of its memory limit; a paused worker runs "
            f"no task): {named}{need}",
            MEMORY_FIX, MEMORY_FIX_RESUMED, " (smaller row chunks start over)"))

    def _again(self, checkpoint, progress: str) -> "WorkersPaused":
        return WorkersPaused(self.seconds, self.address, self.workers, self.working_set,
                             checkpoint, progress)


#: the failures of a cluster that end a computation, each saying how to go on and, through
#: ``saved(checkpoint, progress)``, what a checkpoint kept
CLUSTER_FAILURES = (WorkersLost, SchedulerLost, WorkerKilled, WorkersPaused)


class WorkersTooSmall(RunError):
    """A pass whose working set per thread, times a worker's threads, with what the worker
    holds of its own, is more than that worker may hold before distributed pauses it
    (``distributed.worker.memory.pause`` of its memory limit): refused before the pass,
    since the pass would wait for ever.

    ``address`` is the worker's, ``memory_limit`` its limit in bytes, ``pause`` its pause
    fraction, ``threads`` its threads, ``own`` the bytes counted of what it holds besides
    Dask's data (Python, Dask, the libraries; 0 if unknown) and
    ``working_set`` the pass's :class:`~dfairpca.engine._memory.WorkingSet`; ``what`` is
    the message without the way on.
    """

    __module__ = "dfairpca.cluster"

    def __init__(self, address: str, memory_limit: int, pause: float, threads: int, ws: WorkingSet,
                 own: int = 0):
        self.address, self.memory_limit, self.pause = address, memory_limit, pause
        self.threads, self.working_set, self.own = threads, ws, own
        held = threads * ws.total
        mine = f" besides {gib(own)} of its own" if own else ""
        self.what = (
            f"the pass needs {ws.describe()}: {threads} thread{'s' if threads > 1 else ''} of the "
            f"Dask worker at {address} would hold {gib(held)}{mine}, more than the "
            f"{gib(int(pause * memory_limit))} at which distributed pauses it ({pause:.0%} of "
            f"its memory limit {gib(memory_limit)}; a paused worker runs no task, and the fit "
            "would wait for ever)")
        super().__init__(f"{self.what}: {MEMORY_FIX}")
