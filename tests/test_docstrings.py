"""Every public function and method documents its interface in numpydoc sections: a summary
line, a Parameters section naming every parameter of its signature, and a Returns (or, for a
generator or context manager, Yields) section unless it returns nothing. The API reference
(docs/api.rst, built by numpydoc) shows these sections as the function's contract, so one left
out is a parameter or a result the reader must find in the source.

Only those checks are made (numpydoc codes GL08, SS01, PR01, PR02, RT01, YD01); style codes
(punctuation, capitals, See Also, Examples) are not the contract and are left out.
"""

import importlib
import inspect

import pytest
from numpydoc.docscrape import get_doc_object
from numpydoc.validate import validate

#: the modules whose ``__all__`` is the public API
MODULES = ["dfairpca", "dfairpca.metrics", "dfairpca.io", "dfairpca.base", "dfairpca.cluster", "dfairpca.datasets", "dfairpca.stats.moments",
           "dfairpca.errors"]

#: the classes whose docstring documents the constructor (a Parameters section for __init__):
#: the estimators.  Moments is built by from_chunk or compute_moments (its fields are listed
#: under Attributes), and the exceptions and small records are documented by what they mean:
#: those are checked for their public methods only
CONSTRUCTED = {"PCA", "FairPCA", "FairKernelPCA", "ConceptEraser"}

CODES = {"GL08", "SS01", "PR01", "PR02", "RT01", "YD01"}


def _ours(obj) -> bool:
    return getattr(obj, "__module__", "").startswith("dfairpca")


def _methods(cls):
    """(name, function) of each public method of ``cls`` defined in dfairpca, inherited ones
    included (PCA.transform is part of FairPCA's API), properties left out (they take no
    parameters and their docstring is the attribute's description)."""
    for name in sorted(dir(cls)):
        if name.startswith("_"):
            continue
        for klass in cls.__mro__:
            if name in vars(klass):
                raw = vars(klass)[name]
                break
        else:
            continue
        if isinstance(raw, (staticmethod, classmethod)):
            raw = raw.__func__
        if inspect.isfunction(raw) and _ours(raw):
            yield name, raw


def _public():
    """{qualified name: function, method or estimator class} of the public API, each once."""
    seen, found = set(), {}
    for module_name in MODULES:
        module = importlib.import_module(module_name)
        for name in module.__all__:
            obj = getattr(module, name)
            if id(obj) in seen or not _ours(obj) or not callable(obj):
                continue
            seen.add(id(obj))
            if inspect.isclass(obj):
                if name in CONSTRUCTED:
                    found[f"{module_name}.{name}"] = obj
                for method_name, method in _methods(obj):
                    if id(method) not in seen:
                        seen.add(id(method))
                        found[f"{module_name}.{name}.{method_name}"] = method
            else:
                found[f"{module_name}.{name}"] = obj
    return found


PUBLIC = _public()


def _returns_none(obj) -> bool:
    try:
        annotation = inspect.signature(obj).return_annotation
    except (TypeError, ValueError):
        return False
    return annotation is None or annotation == "None"


def _errors(obj) -> list[str]:
    # the object in hand, not its import path: a classmethod named by its path resolves to a
    # bound method, which numpydoc does not take for a function and skips the Returns check of
    doc = get_doc_object(obj)
    codes = [(code, message) for code, message in validate(doc)["errors"] if code in CODES]
    # numpydoc flags any ``return call(...)``; a function annotated ``-> None`` delegates to
    # another that returns nothing, and a context manager documents what its ``with`` binds
    # under Yields: neither has a Returns section to give
    if doc["Yields"] or _returns_none(obj):
        codes = [(code, message) for code, message in codes if code != "RT01"]
    return [f"{code}: {message}" for code, message in codes]


def test_the_public_api_is_found():
    names = set(PUBLIC)
    assert {"dfairpca.PCA.fit", "dfairpca.FairPCA.fit", "dfairpca.FairKernelPCA.transform",
            "dfairpca.Moments.merge", "dfairpca.merge", "dfairpca.load", "dfairpca.metrics.mmd2",
            "dfairpca.io.atomic_file", "dfairpca.cluster.connect"} <= names
    assert len(PUBLIC) > 100


@pytest.mark.parametrize("name", sorted(PUBLIC))
def test_public_docstring_documents_parameters_and_returns(name):
    errors = _errors(PUBLIC[name])
    assert not errors, f"{name}:\n" + "\n".join(errors)
