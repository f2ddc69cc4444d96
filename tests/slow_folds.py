"""Preloaded into test workers (``dask worker --preload slow_folds``): every fold of a pass,
every projection of a linear model's transform and every chunk of a synthetic store first
sleeps FOLD_SECONDS, so that a pass (or a transform, or an ingest) on a few thousand rows
lasts long enough to be stopped midway, whoever started it (the library, or the command
line in a subprocess).

The client pickles ``dfairpca.engine._engine._fold_block``,
``dfairpca.decomposition._linear._project_block`` and ``dfairpca.celeba.synth._synth_chunk``
by name, so the worker runs what those names hold here.
"""

import os
import time

from dfairpca.celeba import synth
from dfairpca.decomposition import _linear
from dfairpca.engine import _engine

#: the sleep of each fold and projection (a test may set it in the workers' environment)
FOLD_SECONDS = float(os.environ.get("DFAIRPCA_TEST_FOLD_SECONDS", "0.1"))

_fold_block = _engine._fold_block


def _slow_fold_block(*args):
    time.sleep(FOLD_SECONDS)
    return _fold_block(*args)


_engine._fold_block = _slow_fold_block

_project_block = _linear._project_block


def _slow_project_block(*args, **kwargs):
    time.sleep(FOLD_SECONDS)
    return _project_block(*args, **kwargs)


_linear._project_block = _slow_project_block

_synth_chunk = synth._synth_chunk


def _slow_synth_chunk(*args):
    time.sleep(FOLD_SECONDS)
    return _synth_chunk(*args)


synth._synth_chunk = _slow_synth_chunk
