"""Preloaded into test workers (``dask worker --preload memory_leak``): a worker's first fold
of a row chunk at or after row LEAK_ROW first takes memory until its process holds
LEAK_FRACTION of its memory limit, past distributed's pause threshold (80%) and below its
nanny's terminate one (95%), so that distributed pauses the worker and nothing restarts it,
as a chunk larger than a worker's budget does.  The memory is kept for
``DFAIRPCA_TEST_LEAK_SECONDS`` (default: for ever), then given back: the worker resumes.

The client pickles ``dfairpca.engine._engine._fold_block`` by name, so the worker runs what
that name holds here; it is replaced in ``dask_setup``, which distributed calls in the
worker that preloads this module, never on import.
"""

import os
import threading

import numpy as np
import psutil

from dfairpca.engine import _engine

#: the first row of the chunks whose fold takes the memory (once per worker)
LEAK_ROW = 1000
#: the share of its memory limit the worker's process holds then
LEAK_FRACTION = 0.88
#: how long it keeps it (None: for ever)
_held = os.environ.get("DFAIRPCA_TEST_LEAK_SECONDS")
LEAK_SECONDS = float(_held) if _held else None

_fold_block = _engine._fold_block
_kept: list = []
_state = {"limit": None, "done": False}


def _leaking_fold_block(fold, acc, block, shared, *args):
    # (codes, mask, row offset, ...) of a moments pass; other passes carry other arguments
    if (not _state["done"] and len(args) > 2 and isinstance(args[2], int) and args[2] >= LEAK_ROW
            and _state["limit"]):
        _state["done"] = True
        more = int(LEAK_FRACTION * _state["limit"]) - psutil.Process().memory_info().rss
        if more > 0:
            _kept.append(np.ones(more, np.uint8))  # written: resident, as real data would be
        if LEAK_SECONDS is not None:
            threading.Timer(LEAK_SECONDS, _kept.clear).start()
    return _fold_block(fold, acc, block, shared, *args)


def dask_setup(worker):
    """distributed's preload hook: the leaking fold in this worker only."""
    _state["limit"] = worker.memory_manager.memory_limit
    _engine._fold_block = _leaking_fold_block
