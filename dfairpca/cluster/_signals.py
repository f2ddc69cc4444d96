"""What distributed logs that dfairpca says better, while :func:`dfairpca.cluster.connect`
runs: a local cluster's worker processes never see Ctrl-C's SIGINT (this process closes them
in order) and the warnings that closing them after an interrupt would print are dropped; a
remote scheduler's closed connection is logged only if dfairpca does not report its loss
itself (:func:`holding_lost_connections`)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import threading
import traceback
from multiprocessing import resource_tracker
from ..engine._compute import loss_reported
from ..engine._failures import SchedulerLost

class _Switch:
    """A flag a filter reads: set when the block it guards was interrupted."""

    on = False


def _abandoned_gathers(record: logging.LogRecord) -> bool:
    """asyncio's "Task exception was never retrieved" for distributed's ``AllExit``.

    A gather interrupted by Ctrl-C leaves one waiting task per result; when the client
    releases the results each fails with ``AllExit``, which nobody awaits any more, and
    asyncio would log a traceback for every one of them.
    """
    exc = record.exc_info[1] if record.exc_info else None
    return type(exc).__name__ == "AllExit" and type(exc).__module__ == "distributed.client"


def _early_sync_cancels(record: logging.LogRecord) -> bool:
    """tornado's error for distributed's ``sync`` cancel callback run before its coroutine
    had started.

    A Ctrl-C while a blocking call of the client waits queues a callback that cancels the
    call's future; when the Ctrl-C lands before the event loop (busy on a loaded machine)
    has started that call, the future does not exist yet and the callback fails with a
    NameError, which tornado logs with a traceback after the command's one line.  The call
    then runs, not cancelled: the Ctrl-C ends :func:`connect`'s block, which closes the
    client (and a local cluster); the client's close runs on the same loop after that
    callback, so the record comes while the block's filter is still there.  Not covered: a
    Ctrl-C during the client's own start, which leaves the block before it has a client to
    close (the program's logging is restored as the block ends, whatever comes later).
    Any other callback's error still shows.
    """
    exc = record.exc_info[1] if record.exc_info else None
    if not isinstance(exc, NameError) or exc.__traceback__ is None:
        return False
    *_, (frame, _) = traceback.walk_tb(exc.__traceback__)
    return frame.f_code.co_name == "cancel" and frame.f_globals.get("__name__") == "distributed.utils"


def _lost_scheduler_logs(record: logging.LogRecord) -> bool:
    """distributed's records of a connection to the scheduler refused, closed or cancelled
    (with their tracebacks), and the client's giving up on it: what a lost scheduler logs,
    and also what a connection that drops and comes back logs."""
    exc = record.exc_info[1] if record.exc_info else None
    # its last word when the client closes while reconnecting, without a traceback
    given_up = str(record.msg).startswith("Failed to reconnect to scheduler")
    return given_up or isinstance(exc, (OSError, asyncio.CancelledError))


#: distributed's loggers that log a lost scheduler's connection with a traceback (the
#: client's reconnects, its batched stream's close, the comms under them)
LOST_SCHEDULER_LOGGERS = ("distributed.client", "distributed.batched", "distributed.core",
                          "distributed.comm.tcp", "distributed.utils")

#: seconds between two looks at whether a Client whose connection closed is back
RECONNECT_LOOK_SECONDS = 1.0


class HeldLoss:
    """distributed's records of a closed connection to the scheduler, held until it is
    known what they were: a loss that the computation reports in one line
    (:class:`~dfairpca.cluster.SchedulerLost`) drops them, since they would only repeat
    it as tracebacks; a drop that the Client recovers from (its status "running" again,
    looked at every :data:`RECONNECT_LOOK_SECONDS`), or a loss nobody reported, logs
    them as they were, late but whole.

    ``client`` is set once the Client exists; :meth:`filter` is the loggers' filter.
    """

    def __init__(self):
        self.client = None
        self.held: list[tuple[logging.Logger, logging.LogRecord]] = []
        self.lock = threading.Lock()
        self.timer: threading.Timer | None = None
        self.settled = False

    def filter(self, logger: logging.Logger):
        """The filter of ``logger``: False (held) for the records of a closed connection."""
        def keep(record: logging.LogRecord) -> bool:
            if not _lost_scheduler_logs(record):
                return True
            with self.lock:
                if self.settled:
                    return True
                self.held.append((logger, record))
                if self.timer is None:
                    self._arm()
            return False

        return keep

    def _arm(self) -> None:
        """Look at the Client in :data:`RECONNECT_LOOK_SECONDS` (lock held)."""
        self.timer = threading.Timer(RECONNECT_LOOK_SECONDS, self._look)
        self.timer.daemon = True
        self.timer.start()

    def _look(self) -> None:
        """Log what is held if the Client is connected again, else look again later (a
        closed Client's records wait for :meth:`settle`)."""
        status = getattr(self.client, "status", "newly-created")
        with self.lock:
            self.timer = None
            if self.settled:
                return
            if status != "running":
                if status not in ("closing", "closed"):
                    self._arm()
                return
            held, self.held = self.held, []
        _log(held)

    def reported(self) -> bool:
        """Whether a computation on the Client has reported the loss of its scheduler."""
        return self.client is not None and loss_reported(self.client)

    def settle(self, reported: bool) -> None:
        """End holding: drop what is held if the loss was ``reported``, else log it."""
        with self.lock:
            self.settled = True
            if self.timer is not None:
                self.timer.cancel()
            held, self.held = self.held, []
        if not reported:
            _log(held)


def _log(held) -> None:
    """Log records held back, past the filter that held them."""
    for logger, record in held:
        logger.callHandlers(record)


def reports_lost_scheduler(exc: BaseException | None) -> bool:
    """Whether ``exc``, or an error it was raised from or while handling, is the one line
    of a lost scheduler (:class:`~dfairpca.cluster.SchedulerLost`)."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, SchedulerLost):
            return True
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return False


@contextlib.contextmanager
def holding_lost_connections():
    """While the block runs, distributed's records of a closed connection to the scheduler
    are held (:class:`HeldLoss`); when it ends they are dropped if a computation on its
    Client reported the loss in one line (:class:`~dfairpca.cluster.SchedulerLost`, caught
    or not), else logged.

    Yields
    ------
    HeldLoss
        Its ``client`` is to be set to the Client the block connects.
    """
    held = HeldLoss()
    filters = [(logging.getLogger(name), held.filter(logging.getLogger(name)))
               for name in LOST_SCHEDULER_LOGGERS]
    for logger, keep in filters:
        logger.addFilter(keep)
    try:
        yield held
    except BaseException as exc:
        held.settle(reported=held.reported() or reports_lost_scheduler(exc))
        raise
    else:
        held.settle(reported=held.reported())
    finally:
        for logger, keep in filters:
            logger.removeFilter(keep)


def _nanny_kills(interrupted: _Switch):
    """The nanny's warnings (not its errors) once ``interrupted``: closing the local cluster
    after Ctrl-C kills a busy worker, which does not stop within the nanny's 4 s grace
    inside a long BLAS product, and the nanny warns "Worker process still alive after 4.0
    seconds, killing": the kill is what Ctrl-C asked for."""
    def dropped(record: logging.LogRecord) -> bool:
        return interrupted.on and record.levelno < logging.ERROR

    return dropped


def _quiet_cancelled_tasks() -> None:
    """Run on the local workers: no warning for a task cancelled because the cluster closes.

    After Ctrl-C the cluster is closed while a fold is running, and every worker would
    print "Async instruction ... ended with CancelledError" (the only warning of that
    logger; its errors still show).
    """
    logging.getLogger("distributed.worker.state_machine").setLevel(logging.ERROR)


def _quiet_failed_tasks() -> None:
    """Run on the local workers: no "Compute Failed ... Traceback" block for a failed task.

    The task's exception reaches the caller, which reports it (the command line in one
    line, naming the chunk and the fix); the worker's log of it, printed on the same
    terminal by a cluster this process started, only repeated it as a traceback.  Other
    errors of the workers still show.  A remote scheduler's workers keep their logs.
    """
    def keep(record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Compute Failed")

    logging.getLogger("distributed.worker").addFilter(keep)


def _quiet_closed_heartbeats() -> None:
    """Run on the local workers: no "Failed to communicate with scheduler during heartbeat"
    traceback for a connection the scheduler closed.

    The scheduler of a cluster this process started closes only when this process closes
    it (its block ends, after an error or a Ctrl-C) or ends: a heartbeat in flight at that
    moment found the connection closed, which says nothing the caller has not said (seen
    after a Ctrl-C on a loaded machine, its traceback on the terminal after the one-line
    message).  The same for "failed during get data": a transfer between two workers cut
    because the cluster closes (seen after a Ctrl-C at load 4-10); a worker that dies is
    reported by the fit itself.  Other failed heartbeats and transfers (a timeout, an
    error of the scheduler's or a peer's) still show.
    """
    def keep(record: logging.LogRecord) -> bool:
        if not str(record.msg).startswith(("Failed to communicate with scheduler during heartbeat",
                                           "failed during get data")):
            return True
        exc = record.exc_info[1] if record.exc_info else None
        return not _closed_connection(exc)

    logging.getLogger("distributed.worker").addFilter(keep)


def _cancelled_feeds(record: logging.LogRecord) -> bool:
    """The scheduler's error for a progress count (its ``feed`` handler) cancelled because
    the scheduler closes.

    A local cluster's scheduler runs in this process and closes with :func:`connect`'s
    block; a count still running then (between two of its updates, or waiting for a pass's
    key) is cancelled, and distributed logs the cancellation with a traceback after the
    command's own last line.  Any other error of the scheduler still shows.
    """
    exc = record.exc_info[1] if record.exc_info else None
    if not isinstance(exc, asyncio.CancelledError):
        return False
    return any(frame.name == "feed" for frame in traceback.extract_tb(exc.__traceback__))


def _closed_connection(exc) -> bool:
    """Whether ``exc`` (or what caused it) is a comm or stream that was closed."""
    seen = 0
    while exc is not None and seen < 8:
        if type(exc).__name__ in ("CommClosedError", "StreamClosedError"):
            return True
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return False


@contextlib.contextmanager
def _dropping(name: str, drop):
    """While the block runs, the records of logger ``name`` that ``drop(record)`` selects
    are not logged.

    The filter sits on that one logger and is removed when the block ends, so that a
    program's logging is as it was once :func:`connect` returns.
    """
    logger = logging.getLogger(name)

    def keep(record: logging.LogRecord) -> bool:
        return not drop(record)

    logger.addFilter(keep)
    try:
        yield
    finally:
        logger.removeFilter(keep)


@contextlib.contextmanager
def _sigint_only_here():
    """Processes and threads started in this block never see SIGINT; this process still does.

    Ctrl-C in a terminal signals every process of the foreground group: local workers
    would die printing tracebacks while this process closes them in order.  A blocked
    signal mask is inherited by threads and across fork and exec, and the main thread's
    is restored at the end, so a Ctrl-C during the block is delivered then, not lost.
    multiprocessing's resource tracker unblocks SIGINT in the thread that starts it (the
    one that would go on to start the workers), so it is started first, outside the block.
    """
    if threading.current_thread() is not threading.main_thread() or not hasattr(
            signal, "pthread_sigmask"):  # only the main thread gets signals; Windows has none
        yield
        return
    resource_tracker.ensure_running()
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)
