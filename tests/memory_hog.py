"""Preloaded into test workers (``dask worker --preload memory_hog``): the fold of the row
chunk that starts at row HOG_ROW first takes HOG_BYTES of memory and holds it a while, so
that a worker with a smaller ``--memory-limit`` goes past it on that chunk every time and
its nanny restarts it, as a chunk too large for its workers does.

The client pickles ``dfairpca.engine._engine._fold_block`` by name, so the worker runs what that
name holds here.  The name is replaced in ``dask_setup``, which distributed calls in the
worker that preloads this module, never on import: a test that imports HOG_ROW must not
change the folds of its own process (every later test's pass would take the hungry one).
"""

import time

import numpy as np

from dfairpca.engine import _engine

#: the first row of the chunk whose fold takes too much memory
HOG_ROW = 1000
#: what it takes: more than the tests' workers may hold
HOG_BYTES = 640 << 20
#: how long it holds it (the nanny looks at its worker's memory every 0.1 s)
HOG_SECONDS = 5.0

_fold_block = _engine._fold_block


def _hungry_fold_block(fold, acc, block, shared, *args):
    # (codes, mask, row offset, ...) of a moments pass; other passes carry other arguments
    if len(args) > 2 and isinstance(args[2], int) and args[2] == HOG_ROW:
        hog = np.ones(HOG_BYTES, np.uint8)  # written: resident, as real work would be
        time.sleep(HOG_SECONDS)
        del hog
    return _fold_block(fold, acc, block, shared, *args)


def dask_setup(worker):
    """distributed's preload hook: the hungry fold in this worker only."""
    _engine._fold_block = _hungry_fold_block
