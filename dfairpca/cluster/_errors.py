"""The errors of reaching a cluster and of paths its workers do not share, and the fixes
their messages name."""

from __future__ import annotations

from ..errors import DfairpcaError

#: what to check when nothing (or no scheduler) answers
_CHECK_RUNNING = (
    "check that `dask scheduler` is running there and that the address and port "
    "(default 8786) are right and not blocked by a firewall"
)


class SchedulerUnreachable(DfairpcaError, ConnectionError):
    """No Dask scheduler answered at the given address within the timeout."""


class NoWorkers(DfairpcaError, ConnectionError):
    """The scheduler answered, but no worker joined it within the timeout."""


class WorkersLost(NoWorkers):
    """Every worker left while a fit computed, and none joined within its ``timeout``.

    ``seconds`` is that timeout, ``address`` the scheduler's; a checkpointed fit also says
    where it saved what it had finished: ``checkpoint``, and ``progress`` such as "16 of
    60 chunks" (else both None).  ``what`` is what happened, without the way on.
    """

    def __init__(self, seconds: float, address: str, checkpoint=None, progress: str | None = None):
        self.seconds, self.address = seconds, address
        self.checkpoint, self.progress = checkpoint, progress
        self.what = (f"the Dask scheduler at {address} has had no workers for {seconds:g} s: all "
                     "left during the fit and none joined, so it stopped")
        start = f"start workers (`dask worker {address}`)"
        if checkpoint is None:
            how = f"{start} and fit again, or wait longer with a larger timeout"
        else:
            how = (f"the checkpoint {str(checkpoint)!r} holds {progress}: {start} and run the "
                   "same call again to continue")
        super().__init__(f"{self.what}; {how}")

    def saved(self, checkpoint, progress: str) -> "WorkersLost":
        """The same loss, saying that ``checkpoint`` holds ``progress``.

        Parameters
        ----------
        checkpoint : str or os.PathLike
            The checkpoint of the interrupted pass, named in the message.
        progress : str
            What it holds (e.g. "12 of 40 segments"), said in the message.

        Returns
        -------
        WorkersLost
            A new error with the longer message; raise it ``from`` this one.
        """
        return WorkersLost(self.seconds, self.address, checkpoint, progress)


class NotShared(DfairpcaError, FileNotFoundError):
    """A local path this process reads or writes is not the same on some of the cluster's
    workers: they run on machines that do not share this machine's files there."""


#: what to do about a path the workers do not share, said by every :class:`NotShared`
SHARE_FIX = ("put it on a file system that every worker mounts at the same path, give an "
             "object-store URL instead (s3://..., with storage_options / --storage-options), or "
             "compute on this machine (a local cluster: no --scheduler)")
#: the same without the URL, for an input that only a local folder can be (CelebA's JPEGs)
SHARE_FIX_LOCAL = ("put it on a file system that every worker mounts at the same path, or "
                   "compute on this machine (no --scheduler)")
