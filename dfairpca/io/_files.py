"""Reading a file of a folder dfairpca is given: a regular file of bounded size, or an error.

A saved model, statistics, a checkpoint or an output folder may come from elsewhere (an
archive, a shared disk).  In place of a file dfairpca wrote it can hold a named pipe
(reading waits for a writer forever), a device (``/dev/zero`` never ends) or a link out
of the folder, and the size the file system reports says nothing of either (0 for both).
So a file is opened without following a link and without blocking, checked to be a
regular file on the descriptor itself (what was checked is what is read), and a reader
of the whole file reads at most a cap.  dfairpca never writes links in its folders, so a
link there is refused even if it points at an intact copy: copy the file instead.
"""

from __future__ import annotations

from ..errors import InvalidInputError

import os
import stat

__all__ = ["SavedFileError", "MAX_JSON_BYTES", "open_regular", "read_capped", "capped",
           "check_folder"]


class SavedFileError(InvalidInputError):
    """A saved model, statistics or checkpoint that is truncated, edited or inconsistent."""


#: bytes of meta.json or progress.json read at most (a model's is a few kB; labels of
#: thousands of groups a few hundred kB)
MAX_JSON_BYTES = 64 << 20

_KINDS = [(stat.S_ISFIFO, "a named pipe"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"),
          (stat.S_ISDIR, "a directory"), (stat.S_ISLNK, "a symbolic link")]


def _refusal(name: str, mode: int, wanted: str = "a regular file") -> SavedFileError:
    """What ``name`` is instead of ``wanted``; the caller adds how to replace it."""
    kind = next((what for test, what in _KINDS if test(mode)), "an unknown kind of file")
    link = " (dfairpca follows no link in its folders: copy it there instead)"
    return SavedFileError(f"{name} is {kind}, not {wanted}{link if stat.S_ISLNK(mode) else ''}")


def open_regular(file):
    """``file`` opened for reading in binary, refused with :class:`SavedFileError` (one
    phrase naming it, to which the caller adds its fix) unless it is a regular file and
    not a link; FileNotFoundError if it does not exist.

    Parameters
    ----------
    file : str or os.PathLike
        The file to read.

    Returns
    -------
    io.BufferedReader
        The file, open for reading in binary.
    """
    name = os.path.basename(os.fspath(file))
    mode = os.lstat(file).st_mode  # refuses a device before opening it (opening can act)
    if not stat.S_ISREG(mode):
        raise _refusal(name, mode)
    # no link followed, no wait on a pipe put there since: the descriptor is checked
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
    try:
        fd = os.open(file, flags | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        if os.path.islink(file):  # replaced by a link since (ELOOP)
            raise _refusal(name, stat.S_IFLNK) from None
        raise exc from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise _refusal(name, mode)
        return os.fdopen(fd, "rb")  # O_NONBLOCK does not change a regular file's reads
    except BaseException:
        os.close(fd)
        raise


def read_capped(file, cap: int | None = None) -> bytes:
    """The bytes of the regular file ``file``, at most ``cap``.

    The file is opened without following a link and without blocking, and checked to be
    a regular file (a named pipe or a device would never end).

    Parameters
    ----------
    file : str or path-like
        The file to read.
    cap : int, optional
        The most bytes to read (default :data:`MAX_JSON_BYTES`).

    Returns
    -------
    bytes
        The file's content.

    Raises
    ------
    dfairpca.io.SavedFileError
        The file is not a regular file, or holds more than ``cap`` bytes.
    """
    with open_regular(file) as f:
        return capped(f.read, os.path.basename(os.fspath(file)), cap)


def capped(read, name: str, cap: int | None = None) -> bytes:
    """What ``read(n)``, a reader of at most ``n`` bytes of the file ``name``, returns for
    one byte past ``cap`` (default :data:`MAX_JSON_BYTES`); :class:`SavedFileError` if
    that byte is there."""
    cap = MAX_JSON_BYTES if cap is None else cap
    data = read(cap + 1)
    if len(data) > cap:
        raise SavedFileError(f"{name} holds more than {cap} bytes, more than dfairpca writes there")
    return data


def check_folder(path) -> None:
    """Refuse ``path``, a folder dfairpca wrote inside the one it was given (a model's
    ``model/``), if it is a link or no folder; nothing if it is absent (its reader says so).

    Parameters
    ----------
    path : str or os.PathLike
        The folder.

    Raises
    ------
    SavedFileError
        ``path`` is a link, a file or anything else but a folder.
    """
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(mode):
        raise _refusal(os.path.basename(os.fspath(path)), mode, "a folder")
