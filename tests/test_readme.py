"""Every ```python block of README.md runs as written, in a fresh empty folder: the landing
page's example is what a reader copies first, so it must work without the repository."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
BLOCKS = re.findall(r"^```python\n(.*?)^```", README.read_text(encoding="utf-8"), flags=re.S | re.M)


def test_the_readme_has_a_python_example():
    assert BLOCKS


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.parametrize("code", BLOCKS, ids=[f"block{i}" for i in range(len(BLOCKS))])
def test_readme_python_block_runs_in_an_empty_folder(code, tmp_path):
    script = tmp_path.parent / f"{tmp_path.name}_readme.py"  # outside the folder it runs in
    script.write_text(code, encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": "", "MPLBACKEND": "Agg"}
    r = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
