"""dfairpca.celeba.figures in a fresh interpreter, where a caller's matplotlib state is its
own to check (the rest of the figure tests: tests/test_figures.py)."""

import subprocess
import sys
import textwrap

from dfairpca.celeba import synth_celeba
import dfairpca.celeba.figures  # noqa: F401 (registers the reader of a PNG's marker, for read_marker)
from dfairpca.io import read_marker


def test_drawing_leaves_the_callers_matplotlib_backend_and_pyplot_alone(tmp_path):
    """A notebook's backend is its own: drawing imports no pyplot and switches nothing."""
    store = synth_celeba(tmp_path / "faces.zarr", n=200, size=8, chunk_rows=64, progress=False,
                         n_jobs=1)
    code = textwrap.dedent(f"""
        import sys
        import matplotlib
        matplotlib.use("svg")  # the caller's choice
        import numpy as np
        import dfairpca
        from dfairpca.celeba import faces_figure, open_celeba
        X = open_celeba({str(store)!r})[0][:].reshape(200, -1).astype(float)
        faces_figure(dfairpca.PCA(2).fit(X), {str(store)!r}, {str(tmp_path / "f.png")!r}, n=2)
        print(matplotlib.get_backend(), "matplotlib.pyplot" in sys.modules)
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["svg", "False"]
    assert read_marker(tmp_path / "f.png")["kind"] == "figure"
