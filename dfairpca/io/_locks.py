"""Locks: one writer of an output at a time on this host.

A replace of a local output renames over it, and two writers of the same partial output
would mix their data: each holds an advisory ``flock`` on a lock file beside the output
(:func:`exclusive`), which dies with its process, so a crash never leaves a held lock.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from ._marker import OutputPathError
from ..errors import AccessError

__all__ = ["exclusive", "LOCK_MARK", "REPLACE_LOCK", "drop_stale_lock", "is_held", "not_writable"]

#: the suffix of the lock file ``.NAME`` + this that a replace of ``NAME`` holds
REPLACE_LOCK = ".replace.lock"

#: the content of a lock file dfairpca made (:func:`exclusive`): only such a file is removed
LOCK_MARK = b"dfairpca lock\n"


@contextlib.contextmanager
def exclusive(lock: Path, what: str, why: str = "two writers would mix their data", wait: bool = True):
    """Hold the lock file ``lock`` while the block runs, or raise :class:`OutputPathError`
    at once if another process holds it, naming ``what`` it writes and ``why`` that is
    refused: two writers of the same partial output would mix their chunks (e.g. two seeds)
    into one result.

    An advisory ``flock`` on this host: it dies with its process, so a crash never leaves a
    held lock.  A lock file this call makes holds :data:`LOCK_MARK` and is removed when
    done; a file of that name with anything else (a user's) is locked, never changed or
    removed.  A process that opened the file just before its holder removed it finds, once
    it holds it, that the path no longer names it, and tries again.

    Parameters
    ----------
    lock : pathlib.Path
        The lock file.
    what : str
        What the holder writes, named in the error.
    why : str
        Why a second writer is refused, said in the error.
    wait : bool
        Wait up to :data:`BRIEF_HOLD_S` for a holder to let go (a reader's recovery holds
        it for an instant) before refusing; False refuses at once.

    Yields
    ------
    None
        The block runs holding the lock.
    """

    while True:
        try:
            fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            try:
                # without waiting for a writer, should a named pipe be there
                fd = os.open(lock, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
            except FileNotFoundError:
                continue  # removed meanwhile by its holder
            except OSError as exc:
                raise not_writable(lock, lock.parent, exc) from None
        except OSError as exc:
            raise not_writable(lock, lock.parent, exc) from None
        else:
            # marked at once, before taking it: another process may open it and take it
            # first, and whoever holds it removes it only if it carries the mark
            try:
                os.write(fd, LOCK_MARK)
            except OSError as exc:
                os.close(fd)
                lock.unlink(missing_ok=True)  # empty, and made by this call
                raise not_writable(lock, lock.parent, exc) from None
        try:
            _flock_briefly(fd, BRIEF_HOLD_S if wait else 0.0)
        except BlockingIOError:
            os.close(fd)
            raise OutputPathError(
                f"another dfairpca process on this machine is writing {what} (it holds {lock}); "
                f"wait for it to finish, then run this again: {why}"
            ) from None
        try:
            same = os.fstat(fd).st_ino == os.stat(lock).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)  # the holder removed it after we opened it: take the new one
    try:
        yield
    finally:
        try:
            if os.pread(fd, len(LOCK_MARK) + 1, 0) == LOCK_MARK:  # ours: made by dfairpca
                os.unlink(lock)
        except OSError:
            pass
        os.close(fd)


#: how long :func:`exclusive` waits for a lock another process holds before it refuses: a
#: reader's recovery holds the lock for the instant it checks a replace's leftovers, and a
#: writer meeting that must not be refused as if a second writer were there
BRIEF_HOLD_S = 2.0


def _flock_briefly(fd: int, seconds: float) -> None:
    """``flock(fd, LOCK_EX)``, waiting up to ``seconds`` for a brief holder; BlockingIOError
    if it is held longer (another writer)."""
    import fcntl
    import time

    deadline = time.monotonic() + seconds
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.02)


def drop_stale_lock(lock: Path) -> None:
    """Remove the lock file ``lock`` if dfairpca made it and no process holds it (its
    holder crashed); a held one (this process's own too) is left alone."""
    import fcntl

    try:
        fd = os.open(lock, os.O_RDONLY)
    except OSError:
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        if os.pread(fd, len(LOCK_MARK) + 1, 0) == LOCK_MARK and \
                os.fstat(fd).st_ino == os.stat(lock).st_ino:
            os.unlink(lock)
    except OSError:  # held (BlockingIOError), or removed meanwhile
        pass
    finally:
        os.close(fd)


def is_held(lock: Path) -> bool:
    """Whether some process holds the lock file ``lock`` (:func:`exclusive`) now; this
    process's own holds count too (a second ``flock`` descriptor conflicts with them)."""
    import fcntl

    try:
        fd = os.open(lock, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return False
    finally:
        os.close(fd)
    return False


def not_writable(path: Path, folder: Path, exc: OSError) -> PermissionError:
    """The error for an output whose folder cannot be written."""
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    return AccessError(
        f"cannot write {path}: the directory {folder} is not writable ({exc.strerror}); "
        "choose an output path in a writable directory"
    )
