"""Preloaded into test workers (``dask worker --preload slow_folds``): every fold of a pass
first sleeps FOLD_SECONDS, so that a pass on a few thousand rows lasts long enough to be
stopped midway, whoever started it (the library, or the command line in a subprocess).

The client pickles ``dfairpca.engine._engine._fold_block`` by name, so the worker runs what that
name holds here.
"""

import time

from dfairpca.engine import _engine

FOLD_SECONDS = 0.1

_fold_block = _engine._fold_block


def _slow_fold_block(*args):
    time.sleep(FOLD_SECONDS)
    return _fold_block(*args)


_engine._fold_block = _slow_fold_block
