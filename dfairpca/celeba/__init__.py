"""CelebA-shaped face data: an application of dfairpca, not part of its core.

The core (statistics, the pass, solvers, estimators, io) never imports this package; the
``dfairpca`` command, the benchmarks and the examples do.  Its modules, each with one job:

``schema``   the store layout (:mod:`dfairpca.celeba.schema` documents it), creating,
             opening and reading stores
``sampling`` CelebA-like attributes (pure numpy)
``render``   the face renderer: sampled attributes in, grey or colour faces out (pure numpy)
``colours``  the colours of colour faces, at the grey faces' luminance (pure numpy)
``synth``    synthetic stores (:func:`synth_celeba`) and :func:`ensure_store`
``ingest``   the official CelebA download into a store (:func:`ingest_celeba`)
``jpegs``    a fabricated CelebA download of synthetic JPEGs (:func:`write_celeba_jpegs`)
``pool``     a writer's chunks, resumably, in worker processes or as Dask tasks
``figures``  the paper's Figure 5 from a model and a store (:func:`faces_figure`)

:func:`synth_celeba` writes a synthetic store of cartoon faces whose pixels depend on the
attributes the way real photographs do; :func:`ingest_celeba` converts the official
download; :func:`open_celeba` and :func:`attribute_column` read either.
"""

from .figures import faces_figure
from .ingest import ingest_celeba
from .jpegs import write_celeba_jpegs
from .schema import ATTRIBUTE_NAMES, attribute_column, open_celeba
from .synth import ensure_store, synth_celeba

__all__ = [
    "ATTRIBUTE_NAMES",
    "synth_celeba",
    "ingest_celeba",
    "open_celeba",
    "attribute_column",
    "ensure_store",
    "faces_figure",
    "write_celeba_jpegs",
]
