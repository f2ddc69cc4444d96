"""Markdown files of the repository, included into the site as they are.

``cluster/*.md`` are written to be read on a code host, beside ``jobqueue.py`` and
``kubernetes/``: their links name files of that folder.  When a page of this site includes
one (MyST's ``{include}`` in ``docs/cluster/*.md``), the ``include-read``
event rewrites those links to the pages of ``docs/cluster/`` that show the same files.
"""

from __future__ import annotations

import re
from pathlib import Path

#: link target in the repository's cluster/ folder -> the page of docs/cluster/ showing it
CLUSTER_LINKS = {
    "README.md": "index.md",
    "ssh.md": "ssh.md",
    "tls.md": "tls.md",
    "jobqueue.py": "jobqueue.rst",
    "kubernetes/": "kubernetes.rst",
}
_LINK = re.compile(r"\]\(([^)#\s]+)(#[^)\s]*)?\)")


def rewrite_links(app, relative_path, parent_docname, content):
    if Path(relative_path).parent != Path("..", "cluster"):
        return

    def sub(m):
        target = CLUSTER_LINKS.get(m.group(1))
        return m.group(0) if target is None else f"]({target}{m.group(2) or ''})"

    content[0] = _LINK.sub(sub, content[0])


def setup(app):
    app.connect("include-read", rewrite_links)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
