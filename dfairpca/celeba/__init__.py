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

from typing import TYPE_CHECKING
import importlib

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

#: where each public name lives, imported on first use (PEP 562): an ingest's worker
#: process imports this package to run ``pool`` and ``ingest``, and ``figures`` with
#: what it imports was a third of that worker's start (0.18 of 0.52 s of CPU)
_PUBLIC = {
    "ATTRIBUTE_NAMES": "schema", "synth_celeba": "synth", "ingest_celeba": "ingest",
    "open_celeba": "schema", "attribute_column": "schema", "ensure_store": "synth",
    "faces_figure": "figures", "write_celeba_jpegs": "jpegs",
}


#: its modules, attributes of the package as they were when it imported them all
_SUBMODULES = ("schema", "sampling", "render", "colours", "synth", "ingest", "jpegs", "pool", "figures")

if TYPE_CHECKING:  # the real names, for type checkers
    from .figures import faces_figure
    from .ingest import ingest_celeba
    from .jpegs import write_celeba_jpegs
    from .schema import ATTRIBUTE_NAMES, attribute_column, open_celeba
    from .synth import ensure_store, synth_celeba


def __getattr__(name: str):
    if name in _SUBMODULES:  # importing it binds it here
        return importlib.import_module(f".{name}", __name__)
    if name not in _PUBLIC:
        raise AttributeError(f"module 'dfairpca.celeba' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_PUBLIC[name]}", __name__), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted({*globals(), *_PUBLIC, *_SUBMODULES})
