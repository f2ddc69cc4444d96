"""Sphinx configuration of the dfairpca documentation.

Build it as CI does, warnings as errors:

    pip install '.[docs]'
    python -m sphinx -W -b html docs /tmp/html

The example gallery (examples/plot_*.py) runs at build time; the command line's help page
is generated from the parser the ``dfairpca`` command uses, so neither can go stale.
"""

import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "_ext"))

# matplotlib draws without a display; the gallery's examples are small, so BLAS threads
# would only contend with each other (and with whatever else shares the cores): 25x
# slower eigensolves were seen on a loaded 2-core machine
os.environ.setdefault("MPLBACKEND", "Agg")
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import dfairpca  # noqa: E402

project = "dfairpca"
author = "The dfairpca developers"
copyright = "the dfairpca developers (MIT licence)"
release = dfairpca.__version__
version = ".".join(release.split(".")[:2])

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.mathjax",
    "numpydoc",
    "sphinx_gallery.gen_gallery",
    "myst_parser",
    "cli_help",
    "api_docstrings",
    "repo_markdown",
]

source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
exclude_patterns = ["_build", "**.ipynb_checkpoints", "auto_examples/*.ipynb",
                    "auto_examples/*.py", "auto_examples/*.zip", "auto_examples/*.json"]
templates_path = ["_templates"]

# the API pages: one per public name, written from the docstrings at build time
autosummary_generate = True
autodoc_default_options = {"member-order": "bysource"}
autodoc_typehints = "none"  # numpydoc's Parameters sections say the types
numpydoc_show_class_members = False  # the class template lists the methods once
numpydoc_class_members_toctree = False

# Markdown pages (the paper reproduction report, written by ``dfairpca paper``)
myst_enable_extensions = ["dollarmath"]
myst_heading_anchors = 3

sphinx_gallery_conf = {
    "examples_dirs": "../examples",
    "gallery_dirs": "auto_examples",
    # only the gallery's plot_*.py run; the other scripts in examples/ are command-line
    # programs (the Table 1 test and the 202,599-face kernel run use them)
    "filename_pattern": r"/plot_",
    "ignore_pattern": r"(^|/)(adult_table1|kernel_at_scale)\.py$",
    "download_all_examples": False,
    "remove_config_comments": True,
    "within_subsection_order": "FileNameSortKey",
    "show_memory": False,
    "abort_on_example_error": True,
}

html_theme = "pydata_sphinx_theme"
html_title = f"dfairpca {release}"
html_theme_options = {
    "navigation_with_keys": False,
    "show_toc_level": 2,
    "secondary_sidebar_items": ["page-toc"],
}
html_show_sourcelink = False
