"""The finished pieces of a report run, kept on disk so that a rerun resumes a broken run.

Each piece (one data set of Tables 1-3, one d of the synthetic sweep, ...; see the parts'
``tasks``) is written, as soon as it is done, into the directory ``OUT.partial`` next to the
report: one JSON file per piece, written to a temporary name and renamed, so a crash or a
Ctrl-C leaves only whole pieces.  Rerunning the same command skips the pieces found there
that were made with the same sizes (:class:`dfairpca.paper._config.Config`), dfairpca
version and code (:func:`dfairpca.base.code_digest`); when the report is written the directory is removed.  It carries dfairpca's marker:
dfairpca uses or removes only a directory it wrote.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from pathlib import Path

import numpy as np

from ..io import OutputPathError, read_capped, read_marker, remove_directory, write_marker
from ..base import __version__, code_digest

# Deferred imports: package modules that load such libraries, or this module, at import are imported
# in the functions that use them, so that importing this module stays light.

#: the kind in the marker of the pieces' directory
KIND = "paper-pieces"


def folder(out) -> Path:
    """The pieces' directory of the report at ``out``."""
    out = Path(out)
    return out.with_name(out.name + ".partial")


def _encode(obj):
    """``obj`` as JSON-able values; tuples and arrays tagged so that :func:`_decode` restores them."""
    if isinstance(obj, tuple):
        return {"__tuple__": [_encode(v) for v in obj]}
    if isinstance(obj, list):
        return [_encode(v) for v in obj]
    if isinstance(obj, dict):
        return {k: _encode(v) for k, v in obj.items()}
    if isinstance(obj, np.ndarray):
        return {"__ndarray__": obj.tolist(), "dtype": obj.dtype.str}
    if isinstance(obj, np.generic):
        return obj.item()
    return obj


def _decode(obj):
    """The inverse of :func:`_encode` (a JSON object hook)."""
    if "__tuple__" in obj:
        return tuple(obj["__tuple__"])
    if "__ndarray__" in obj:
        return np.asarray(obj["__ndarray__"], dtype=obj["dtype"])
    return obj


_TMP = ".tmp-"


def _name(part: str, task) -> str:
    """The file of piece (part, task): ``tables-adult.json``, ``synthetic-6400-0.json``."""
    words = [part, *(task if isinstance(task, tuple) else (task,))]
    return re.sub(r"[^A-Za-z0-9_.-]", "_", "-".join(map(str, words))) + ".json"


def _stamp(cfg) -> dict:
    return {"config": _encode(dataclasses.asdict(cfg)), "version": __version__, "code": code_digest()}


def _own(path: Path) -> bool:
    """Whether ``path`` is a pieces' directory dfairpca wrote (else it is never touched)."""
    found = read_marker(path)
    return path.is_dir() and not path.is_symlink() and found is not None and found.get("kind") == KIND


def load(out, cfg, part: str, task):
    """The result of piece (part, task) from an earlier run with the same sizes, or None."""
    path = folder(out)
    if not _own(path) or not (path / _name(part, task)).is_file():
        return None
    try:
        found = json.loads(read_capped(path / _name(part, task)), object_hook=_decode)
    except ValueError:  # not the whole file a run renamed there (or a link, a pipe): recompute
        return None
    if not isinstance(found, dict) or "result" not in found:  # not a piece (edited by hand?): recompute
        return None
    stamp = json.loads(json.dumps(_stamp(cfg)), object_hook=_decode)
    return found["result"] if {k: found.get(k) for k in stamp} == stamp else None


def save(out, cfg, part: str, task, result) -> None:
    """Write the result of piece (part, task): whole, or not at all."""
    path = folder(out)
    if path.exists() and not _own(path):
        raise OutputPathError(f"{path} exists and was not written by dfairpca: move it away to "
                              "keep the report's finished pieces there")
    if not path.exists():
        path.mkdir(parents=True)
        write_marker(path, KIND)  # first: a directory left by a crash is recognisably ours
    name = _name(part, task)
    tmp = path / f".{name}{_TMP}{os.getpid()}"
    text = json.dumps({**_stamp(cfg), "result": _encode(result)})
    try:
        tmp.write_text(text)
        os.replace(tmp, path / name)
        write_marker(path, KIND)  # lists the entries, this piece's among them
    except OSError as exc:
        from ..io import disk_full, is_disk_full

        if not is_disk_full(exc):
            raise
        tmp.unlink(missing_ok=True)
        raise disk_full(path, f"the piece {name}", "the pieces finished before it are kept there: "
                        "free space, then the same command again resumes from them",
                        needed=len(text.encode()), cause=exc) from None


def discard(out) -> None:
    """Remove the pieces' directory of ``out`` once the report is written (if dfairpca's)."""
    path = folder(out)
    if _own(path):
        for leftover in path.glob(f".*.json{_TMP}*"):  # a crash's half-written piece
            leftover.unlink()
        remove_directory(path, KIND)
