"""Locks: one writer of an output at a time on this host.

A replace of a local output renames over it, and two writers of the same partial output
would mix their data: each holds an advisory ``flock`` on a lock file beside the output
(:func:`exclusive`), which dies with its process, so a crash never leaves a held lock.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
import errno
import fcntl
import re
import shutil
import sys
import time

from ._marker import OutputPathError
from ..errors import AccessError, DiskFullError

# Deferred imports: dask (heavy or optional) and standard modules needed rarely or on one platform
# only are imported in the functions that use them, so that importing this module stays light.

__all__ = ["exclusive", "LOCK_MARK", "REPLACE_LOCK", "drop_stale_lock", "is_held", "holding", "holder_gone",
           "not_writable", "is_mount_point", "is_disk_full", "disk_full"]

#: the suffix of the lock file ``.NAME`` + this that a replace of ``NAME`` holds
REPLACE_LOCK = ".replace.lock"

#: how a lock file dfairpca made (:func:`exclusive`) begins: only such a file is removed;
#: a line naming its holder follows (:func:`_holder_line`)
LOCK_MARK = b"dfairpca lock\n"

#: the most of a lock file read back: the mark and one line naming its holder
_LOCK_READ = 4096


def _holder_line() -> bytes:
    """The line a lock file carries after :data:`LOCK_MARK`: this process's id and what it
    runs, so that a second writer's refusal names the first.  Only the program and, for
    the command line, its command: the options may hold credentials (``--storage-options``)
    and the file is readable by other users."""
    prog = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "python"
    if prog == "__main__.py":  # python -m PACKAGE: the package's name
        prog = os.path.basename(os.path.dirname(sys.argv[0])) or prog
    command = sys.argv[1] if len(sys.argv) > 1 and prog == "dfairpca" else ""
    if not command.replace("-", "").isalnum():
        command = ""  # an option or a path, not a command
    words = " ".join(w for w in (prog, command) if w)[:100]
    return f"pid {os.getpid()}: {words}\n".encode(errors="replace")


def _open_existing(lock: Path) -> int:
    """An existing lock file opened read-write, else read-only (never blocking on a pipe)."""
    flags = getattr(os, "O_NONBLOCK", 0)
    try:
        return os.open(lock, os.O_RDWR | flags)
    except PermissionError:
        return os.open(lock, os.O_RDONLY | flags)


def _ours(fd: int) -> bool:
    """Whether the open lock file ``fd`` is one dfairpca made (it begins with the mark)."""
    return os.pread(fd, _LOCK_READ, 0).startswith(LOCK_MARK)


def _holder(lock: Path) -> str:
    """Who holds the lock file ``lock``, as its holder wrote it ("pid 123: dfairpca fit
    ..."), or "" when it says nothing (a user's file, or read as it was made)."""
    try:
        with open(lock, "rb") as f:
            text = f.read(_LOCK_READ)
    except OSError:
        return ""
    if not text.startswith(LOCK_MARK):
        return ""
    return text[len(LOCK_MARK):].decode(errors="replace").strip()


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
            made = False
            try:
                # without waiting for a writer, should a named pipe be there; read-write
                # where allowed, so that a crashed holder's file can be relabelled
                fd = _open_existing(lock)
            except FileNotFoundError:
                continue  # removed meanwhile by its holder
            except OSError as exc:
                raise not_writable(lock, lock.parent, exc) from None
        except OSError as exc:
            raise not_writable(lock, lock.parent, exc) from None
        else:
            made = True
            # marked at once, before taking it: another process may open it and take it
            # first, and whoever holds it removes it only if it carries the mark
            try:
                os.write(fd, LOCK_MARK + _holder_line())
            except OSError as exc:
                os.close(fd)
                lock.unlink(missing_ok=True)  # empty, and made by this call
                raise not_writable(lock, lock.parent, exc) from None
        try:
            _flock_briefly(fd, BRIEF_HOLD_S if wait else 0.0)
        except BlockingIOError:
            os.close(fd)
            holder = _holder(lock)
            raise OutputPathError(
                f"another dfairpca process on this machine is writing {what} (it holds {lock}"
                + (f": {holder}" if holder else "") + f"); "
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
        if not made and _ours(fd):  # a crashed holder's file, taken over: name this holder
            line = LOCK_MARK + _holder_line()
            os.pwrite(fd, line, 0)  # written first, then cut: the mark is never missing
            os.ftruncate(fd, len(line))
    except OSError:
        pass  # opened read-only (another user's folder): only the name in an error is lost
    try:
        yield
    finally:
        try:
            if _ours(fd):  # made by dfairpca
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
    try:
        fd = os.open(lock, os.O_RDONLY)
    except OSError:
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        if _ours(fd) and \
                os.fstat(fd).st_ino == os.stat(lock).st_ino:
            os.unlink(lock)
    except OSError:  # held (BlockingIOError), or removed meanwhile
        pass
    finally:
        os.close(fd)


def is_held(lock: Path) -> bool:
    """Whether some process holds the lock file ``lock`` (:func:`exclusive`) now; this
    process's own holds count too (a second ``flock`` descriptor conflicts with them)."""
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


@contextlib.contextmanager
def holding(path: Path):
    """Hold an exclusive ``flock`` on the directory ``path`` (a write's temporary) while
    the block runs: the kernel lets it go when this process ends, however it ends, so a
    reader on this host knows at once that the writer is gone (:func:`holder_gone`), where
    its lease would say so only once it expires.  Nothing is held where the file system
    refuses the lock (readers then judge by the lease alone)."""
    try:
        import fcntl
        fd = os.open(path, os.O_RDONLY)
    except (ImportError, OSError):  # Windows; a directory that cannot be opened
        yield
        return
    try:
        with contextlib.suppress(OSError):
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        yield
    finally:
        os.close(fd)


def holder_gone(path: Path) -> bool:
    """Whether no process holds the ``flock`` of the directory ``path`` that its writer
    takes (:func:`holding`), on a file system where such locks are seen to conflict: True
    only if this process takes it exclusively and a second descriptor's shared lock is
    then refused (a file system that grants every lock, or refuses them all, says nothing:
    False).  The lock is a lease the kernel holds for a live process, not a PID; it is
    shared only among processes of one host (NFS may keep ``flock`` local), so the caller
    asks only of a writer of this host."""
    try:
        import fcntl
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except (ImportError, OSError):
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        probe = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
        try:
            fcntl.flock(probe, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True  # locks conflict here, and none was held: the writer is gone
        finally:
            os.close(probe)
        return False
    except OSError:  # held (BlockingIOError), or no locks on this file system
        return False
    finally:
        os.close(fd)


def not_writable(path: Path, folder: Path, exc: OSError) -> OSError:
    """The error for an output whose folder cannot be written (a full disk, said as one:
    provisional, for a caller that knows what it kept to say again)."""
    if is_disk_full(exc):
        error = disk_full(path, repr(Path(path).name), "nothing was written: free space there "
                          "or write it to another disk")
        error.provisional = True
        return error
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    return AccessError(
        f"cannot write {path}: the directory {folder} is not writable ({exc.strerror}); "
        "choose an output path in a writable directory"
    )


def is_disk_full(exc: BaseException) -> bool:
    """Whether ``exc`` is the operating system's "no space left" (or "quota exceeded"), not
    yet said as :class:`~dfairpca.errors.DiskFullError`, or said by the write protocol
    alone (which does not know what its caller kept).

    Parameters
    ----------
    exc : BaseException
        The error a write raised.

    Returns
    -------
    bool
        True for an ``OSError`` with ``errno`` ENOSPC or EDQUOT, and for a provisional
        :class:`~dfairpca.errors.DiskFullError`.
    """
    if isinstance(exc, DiskFullError):
        return exc.provisional
    return isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC))


def disk_full(path, what: str, kept: str, needed: int | None = None, *, stage=None,
              cause: BaseException | None = None) -> DiskFullError:
    """The one-line error for writing ``what`` at ``path`` on a full disk: the space the
    write needed and what is free there now, then what was kept or removed.

    Parameters
    ----------
    path : str or os.PathLike
        What was being written (its closest existing folder is measured).
    what : str
        What it is, for people ("the checkpoint").
    kept : str
        What was kept or removed, and how to go on.
    needed : int, optional
        The bytes the write needed, if known.
    stage : str or os.PathLike, optional
        The local folder that filled, where ``path`` (a URL) was written first; measured
        and named instead of ``path``, which is named beside it.
    cause : BaseException, optional
        The error being said again: its ``stage`` (and ``needed``) stand where not given.

    Returns
    -------
    DiskFullError
        The error to raise (``from None``: the operating system's adds nothing).
    """
    from dask.utils import format_bytes

    stage = stage if stage is not None else getattr(cause, "stage", None)
    needed = needed if needed is not None else getattr(cause, "needed", None)
    folder = Path(stage if stage is not None else path)
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    try:
        free = f"{format_bytes(shutil.disk_usage(folder).free)} free there"
    except OSError:
        free = "its free space unknown"
    need = f"it needs about {format_bytes(needed)}, " if needed else ""
    where = path if stage is None else f"{stage} (where {path} is staged before its upload)"
    error = DiskFullError(f"the disk holding {where} is full: writing {what} failed "
                          f"({need}{free}); {kept}")
    error.errno = errno.ENOSPC
    error.path, error.stage, error.what, error.kept, error.needed = path, stage, what, kept, needed
    return error


def is_mount_point(path: Path) -> bool:
    """Whether the directory ``path`` is a mount point (a container's volume, a bind mount):
    it cannot be renamed or replaced, only written inside.  :func:`os.path.ismount` misses a
    bind mount of a folder of the same file system, which the kernel's table of this
    process's mounts (``/proc/self/mountinfo``, Linux) names."""
    try:
        if os.path.ismount(path):
            return True
        real = os.path.realpath(path)
        with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                fields = line.split()
                # the fifth field, with spaces and the like escaped as \\ooo octal
                if len(fields) > 4 and _unescape(fields[4]) == real:
                    return True
    except OSError:
        pass
    return False


def _unescape(field: str) -> str:
    """A mountinfo path with its octal escapes (``\\040`` for a space) undone."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)
