"""Small adjustments of what autodoc takes from dfairpca's docstrings and classes.

* Members a class inherits from scikit-learn or Python itself (``get_params``,
  ``set_output``, ``set_fit_request``, an exception's ``with_traceback``) are documented
  by those projects; the API pages list only what dfairpca defines.
* In numpydoc's ``name : type`` lines, a fitted attribute named in a shape
  (``ndarray (n_landmarks_, d)``) would be read as a reStructuredText link
  (``word_``); its underscore is escaped so that it prints as written.
"""

from __future__ import annotations

import re

#: a numpydoc parameter line: names, " : ", the type
_PARAM = re.compile(r"^(\s*[\w*, ]+ : )(.*)$")
#: an identifier ending in "_" that is not inside a literal: a would-be link
_TRAILING = re.compile(r"(?<![`\\])\b([A-Za-z]\w*?)_(?=[\s,)\]]|$)")


def skip_foreign_member(app, what, name, obj, skip, options):
    target = getattr(obj, "fget", obj)
    module = getattr(target, "__module__", None)
    if isinstance(module, str) and not module.startswith("dfairpca"):
        return True
    return None


def escape_type_links(app, what, name, obj, options, lines):
    for i, line in enumerate(lines):
        m = _PARAM.match(line)
        if m and "`" not in m.group(2):
            lines[i] = m.group(1) + _TRAILING.sub(r"\1\\_", m.group(2))


def setup(app):
    app.connect("autodoc-skip-member", skip_foreign_member)
    # before numpydoc turns the sections into reStructuredText
    app.connect("autodoc-process-docstring", escape_type_links, priority=100)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
