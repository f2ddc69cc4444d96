"""A checkpoint directory as both kinds of resumable fit keep it: ``progress.json`` (kind,
layout version, the job's fingerprint, the digests of the row chunks it binds) next to
the saved work, and the rules that refuse a checkpoint of another job, solve or data.

The one-pass fit (:mod:`dfairpca.engine.checkpoint`) saves its running total beside it;
a multi-pass fit (the randomized one) saves its state with :func:`save_state` and reads
it back with :func:`open_state`.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np

from ..io import (RESAVE_HINT, Location, SavedFileError, atomic_directory, check_target, open_regular,
                  storage_for, zarr_arrays, zarr_roots)
from ..errors import InvalidInputError

# Deferred imports: package modules that load such libraries, or this module, at import are imported
# in the functions that use them, so that importing this module stays light.

__all__ = ["Where", "CHECKPOINT_VERSION", "CheckpointMismatch", "array_digest", "job_fingerprint", "checkpoint_path",
           "saved_solver", "open_state", "save_state", "saved_state_meta", "check_digests",
           "files_digest", "check_saved_digest"]


#: a checkpoint: a local folder, or a URL's Location (which carries its storage options)
Where = Path | Location


#: version of the checkpoint layout, checked on resume
CHECKPOINT_VERSION = 4  # 2: the total is saved as upper-triangle panels; 3: chunk digests;
# 4: a digest of the saved total (or state), as the chunks have


#: how to start over, said by every refusal of a checkpoint
_START_OVER = (
    "to start over, delete that directory (dfairpca fit: pass --overwrite instead of --resume; "
    "compute_moments_checkpointed: resume=False)"
)


#: fingerprint entries stored as digests, and what to say when they differ
_DIGESTS = {"chunks": "the chunks differ", "codes": "the group codes differ",
            "categories": "the group labels differ", "mask": "the row mask differs",
            "weights": "the sample weights differ"}


class CheckpointMismatch(InvalidInputError):
    """A checkpoint was written for a different job or different data than this one."""


def _progress_text(path) -> str:
    """The checkpoint's progress.json, local or at a URL."""
    return storage_for(path).read_text("progress.json")


def _digest(a) -> str | None:
    """sha256 of an array's dtype, shape and bytes (or of raw bytes)."""
    if a is None:
        return None
    h = hashlib.sha256()
    if not isinstance(a, bytes):
        a = np.ascontiguousarray(a)
        h.update(f"{a.dtype.str}{a.shape}".encode())
        a = a.tobytes()
    h.update(a)
    return h.hexdigest()


#: public: the randomized fit's passes bind their chunks the same way (dfairpca.engine._thin_pass)
array_digest = _digest


def job_fingerprint(X, codes=None, categories=(), mask=None, *, dtype=np.float64,
                    group_scatter: bool = False, **_ignored) -> dict:
    """What identifies a pass: a checkpoint is resumed only if this is unchanged.

    Shape, dtype and chunking of X, the Zarr stores its graph reads (their URLs), digests
    of the codes, labels and mask, and the options that change the statistics (compute
    ``dtype``, ``group_scatter``).  ``split_every`` and ``progress`` change only the order
    of the sums and are ignored.  X's values are not part of it (that would cost a pass
    before the pass): they are bound chunk by chunk with :func:`chunk_digests`.
    """
    from ..stats._exact import is_exact

    return {
        "shape": list(X.shape),
        "dtype": str(X.dtype),
        "chunks": _digest(json.dumps([list(c) for c in X.chunks]).encode()),
        "stores": _zarr_sources(X),
        "codes": _digest(codes),
        "categories": _digest(json.dumps([np.asarray(c).tolist() for c in categories]).encode()),
        "mask": _digest(mask),
        "compute_dtype": dtype if is_exact(dtype) else str(np.dtype(dtype)),
        "group_scatter": bool(group_scatter),
    }


def _zarr_sources(X) -> list[str]:
    """URLs of the Zarr arrays X's graph reads from (``file:///...``, ``s3://...``)."""
    return sorted({str(array.store_path) for array in zarr_arrays(X)})


def _check_same_job(path: Where, saved: dict, now: dict) -> None:
    """Raise :class:`CheckpointMismatch` naming every entry of the fingerprint that differs."""
    diffs = []
    for key in sorted(set(saved) | set(now)):
        old, new = saved.get(key), now.get(key)
        if old == new:
            continue
        if key in _DIGESTS:
            diffs.append(_DIGESTS[key])
        else:
            diffs.append(f"{key} {old} in the checkpoint but {new} now")
    if diffs:
        raise CheckpointMismatch(
            f"checkpoint {str(path)!r} was written for a different job ({'; '.join(diffs)}); "
            f"{_START_OVER}"
        )


def files_digest(folder: Path, names=None) -> str:
    """sha256 of the regular files under the local ``folder`` (or of ``names`` in it): each
    one's path relative to it and its bytes, in sorted order."""
    h = hashlib.sha256()
    # everything but folders: a pipe or a link put there is refused by open_regular
    files = sorted(p for p in folder.rglob("*") if p.is_symlink() or not p.is_dir()) \
        if names is None else [folder / n for n in sorted(names)]
    for f in files:
        h.update(f.relative_to(folder).as_posix().encode() + b"\0")
        with open_regular(f) as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()


def check_saved_digest(path: Where, progress: dict, key: str, folder: Path, what: str,
                       names=None) -> None:
    """Raise :class:`CheckpointMismatch` unless the files of ``what`` (the saved total or
    state, under the local ``folder``) hash to the digest ``progress[key]`` records; a
    checkpoint written before version 4 has none, and is read as it was."""
    if progress.get("version", 0) < 4:
        return
    saved = progress.get(key)
    try:
        now = files_digest(folder, names)
    except SavedFileError as exc:  # a pipe, a device or a link where a file was
        raise SavedFileError(f"cannot load checkpoint {str(folder)!r}: {exc}{RESAVE_HINT}") from None
    if not isinstance(saved, str) or saved != now:
        raise CheckpointMismatch(
            f"checkpoint {str(path)!r}: its saved {what} does not match the digest its "
            f"progress.json records (edited or damaged since it was saved), so resuming "
            f"would fit wrong statistics; {_START_OVER}"
        )


# ----------------------------------------------------------------------------- multi-pass fits
#: what each solve's checkpoint holds, and the option that resumes it
_SOLVERS = {"exact": "the exact one-pass fit (svd_solver='full')",
            "randomized": "the randomized fit (svd_solver='randomized')"}


def checkpoint_path(checkpoint, storage_options: dict | None = None) -> Where:
    """A checkpoint as this module takes it: a local Path, or a URL's Location."""
    return storage_for(checkpoint, storage_options).target


def _saved_progress(path) -> dict | None:
    """The progress record of the checkpoint at ``path``, or None where there is none (local
    or remote) or it is not dfairpca's."""
    try:
        progress = json.loads(_progress_text(checkpoint_path(path)))
    except Exception:  # no checkpoint there, or not ours: nothing to follow
        return None
    if not isinstance(progress, dict) or progress.get("kind") != "dfairpca checkpoint":
        return None
    return progress


def saved_solver(path) -> str | None:
    """"exact" or "randomized": the solve whose checkpoint ``path`` holds (None if there is
    none, or it is not one), so that ``svd_solver="auto"`` resumes what it started."""
    progress = _saved_progress(path)
    return None if progress is None else progress.get("solver", "exact")


def saved_compute_dtype(path) -> str | None:
    """The products' dtype (a float dtype's name, or the exact sums' marker) the one-pass
    checkpoint ``path`` was made with, or None if there is none: what
    ``compute_dtype="auto"`` resumes with, whatever this process would measure now (a
    worker replaced by a larger one may time the exact kernel the other way)."""
    progress = _saved_progress(path)
    saved = None if progress is None else (progress.get("fingerprint") or {}).get("compute_dtype")
    return saved if isinstance(saved, str) else None


def _check_solver(path: Where, progress: dict, solver: str) -> None:
    """Refuse a checkpoint another solve wrote, naming the option that resumes it."""
    saved = progress.get("solver", "exact")
    if saved != solver:
        raise CheckpointMismatch(
            f"checkpoint {str(path)!r} was written by {_SOLVERS.get(saved, repr(saved))}, not "
            f"{_SOLVERS[solver]}: resume it with that svd_solver, or {_START_OVER}"
        )


def open_state(path, X, fingerprint: dict, solver: str, resume: bool = True) -> dict | None:
    """The saved state of an interrupted multi-pass fit (the randomized one), or None to start.

    Checks first, before any work, that ``path`` may hold a checkpoint (never the store X
    reads); then, if one is there and ``resume``, that it is this solve's and this job's
    (``fingerprint``: :func:`job_fingerprint` plus the solve's own options).  Returns
    ``{"meta": dict, "arrays": {name: ndarray}, "digests": [sha256 of every row chunk],
    "path": str}``;
    the caller binds the data with :func:`check_digests` on its next read of X.
    """
    path = checkpoint_path(path)
    check_target(path, "checkpoint", overwrite=True,
                 protect=[("the input store", root) for root in zarr_roots(X)])
    storage = storage_for(path)
    if not resume or not storage.exists():
        return None
    with storage.local_copy() as local:  # a local checkpoint is its own copy
        return {**_read_state(local, fingerprint, solver), "path": str(path)}


def _read_progress(path: Path, solver: str) -> tuple[dict, Path]:
    """(progress.json of the local checkpoint ``path``, its file), refused unless it is a
    dfairpca checkpoint of ``solver``'s."""
    file = path / "progress.json"
    try:
        progress = json.loads(_progress_text(path))
        ok = isinstance(progress, dict) and progress.get("kind") == "dfairpca checkpoint"
    except SavedFileError as exc:  # a pipe, a device or a link where progress.json was
        raise SavedFileError(f"cannot load checkpoint {str(path)!r}: {exc}{RESAVE_HINT}") from None
    except (OSError, ValueError):
        ok = False
    if not ok:
        raise InvalidInputError(f"{str(path)!r} exists but is not a dfairpca checkpoint; choose another "
                         "checkpoint directory")
    _check_solver(path, progress, solver)
    return progress, file


def _read_state(path: Path, fingerprint: dict, solver: str) -> dict:
    """:func:`open_state`'s reading of a local checkpoint directory."""
    progress, file = _read_progress(path, solver)
    if not isinstance(progress.get("version"), int) or progress["version"] > CHECKPOINT_VERSION:
        raise InvalidInputError(f"checkpoint {str(path)!r} was written by a newer dfairpca; upgrade "
                         "dfairpca or pass resume=False to start over")
    _check_same_job(path, progress.get("fingerprint") or {}, fingerprint)
    digests, meta = progress.get("digests"), progress.get("state")
    if not (isinstance(digests, list) and all(isinstance(h, str) for h in digests)
            and isinstance(meta, dict)):
        raise SavedFileError(f"cannot load checkpoint {str(file)!r}: its digests or state are "
                             f"missing or mistyped{RESAVE_HINT}")
    check_saved_digest(path, progress, "state_digest", path, "state (state.npz)", ["state.npz"])
    try:
        with open_regular(path / "state.npz") as file, np.load(file, allow_pickle=False) as f:
            arrays = {k: f[k] for k in f.files}  # never unpickles
    except (OSError, ValueError) as exc:
        raise SavedFileError(f"cannot load checkpoint {str(path / 'state.npz')!r}: {exc}"
                             f"{RESAVE_HINT}") from None
    return {"meta": meta, "arrays": arrays, "digests": digests, "path": str(path)}


def save_state(path, fingerprint: dict, solver: str, meta: dict, arrays: dict,
               digests: list) -> None:
    """Atomically replace the checkpoint ``path`` with a multi-pass fit's state: ``meta``
    (JSON), ``arrays`` (.npz, no objects) and the digests of X's row chunks."""
    progress = {"kind": "dfairpca checkpoint", "version": CHECKPOINT_VERSION, "solver": solver,
                "fingerprint": fingerprint, "state": meta, "digests": list(digests)}
    with atomic_directory(checkpoint_path(path), "checkpoint", overwrite=True) as tmp:
        # Any values: numpy's stub would match a **dict of arrays against allow_pickle
        payload: dict[str, Any] = {k: np.asarray(v) for k, v in arrays.items()}
        np.savez(tmp / "state.npz", **payload)
        progress["state_digest"] = files_digest(tmp, ["state.npz"])
        (tmp / "progress.json").write_text(json.dumps(progress, indent=1))


def saved_state_meta(path) -> dict:
    """The ``meta`` of the state saved at ``path`` ({} if it cannot be read): what an
    interrupt reports is what is on disk."""
    try:
        return dict(json.loads(_progress_text(checkpoint_path(path)))["state"])
    except Exception:  # unreadable (local or remote): nothing saved to report
        return {}


def check_digests(path, saved: list, read: list) -> None:
    """Raise :class:`CheckpointMismatch` unless the chunks just read, ``read`` a list of
    ``(first row, stop row, sha256)``, are those the checkpoint's digests ``saved`` bind."""
    read = sorted(read)
    differ = [(s, e) for (s, e, h), old in zip(read, saved) if h != old]
    if len(read) != len(saved):
        differ = differ or [(0, read[-1][1] if read else 0)]
    if differ:
        more = f" (and {len(differ) - 1} more chunk(s))" if len(differ) > 1 else ""
        raise CheckpointMismatch(
            f"checkpoint {str(path)!r} was made from different data: rows {differ[0][0]}-"
            f"{differ[0][1] - 1} differ{more} from the rows it holds; {_START_OVER}"
        )
