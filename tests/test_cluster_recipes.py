"""The recipes of cluster/: the SLURM/PBS script runs --help and builds its options without
dask-jobqueue (an optional install), and says how to get it when it is needed."""

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

RECIPE = Path(__file__).resolve().parents[1] / "cluster" / "jobqueue.py"
# the interpreter as on a machine without dask-jobqueue, whether or not this one has it
WITHOUT_JOBQUEUE = "import runpy, sys; sys.modules['dask_jobqueue'] = None; sys.argv[0] = {!r}; " \
                   "runpy.run_path(sys.argv[0], run_name='__main__')"


def run_recipe(*args):
    return subprocess.run([sys.executable, "-c", WITHOUT_JOBQUEUE.format(str(RECIPE)), *args],
                          capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def recipe():
    spec = importlib.util.spec_from_file_location("jobqueue_recipe", RECIPE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_help_needs_no_dask_jobqueue():
    done = run_recipe("--help")
    assert done.returncode == 0, done.stderr
    assert "--system {slurm,pbs}" in done.stdout and "#SBATCH -p" in done.stdout
    assert "#PBS -q" in done.stdout


def test_the_two_systems_differ_only_in_class_defaults_and_the_pbs_resource_line(recipe):
    common = ["--queue", "q", "--account", "a", "--directive=-x", "--prologue", "module load x"]
    slurm_class, slurm = recipe.cluster_options(recipe.parse_args(["--system", "slurm", *common]))
    pbs_class, pbs = recipe.cluster_options(recipe.parse_args(
        ["--system", "pbs", *common, "--resource-spec", "select=1:ncpus=24"]))
    assert (slurm_class, pbs_class) == ("SLURMCluster", "PBSCluster")
    assert (slurm["cores"], slurm["memory"], pbs["cores"], pbs["memory"]) == (32, "192GB", 24, "128GB")
    assert pbs.pop("resource_spec") == "select=1:ncpus=24" and "resource_spec" not in slurm
    differ = {key for key in slurm if slurm[key] != pbs[key]}
    assert differ == {"cores", "memory"}
    assert slurm["queue"] == "q" and slurm["job_extra_directives"] == ["-x"]
    _, chosen = recipe.cluster_options(recipe.parse_args(["--system", "slurm", "--cores", "8",
                                                          "--memory", "16GB"]))
    assert (chosen["cores"], chosen["memory"]) == (8, "16GB")


def test_a_pbs_option_on_slurm_and_a_missing_dask_jobqueue_are_one_line_with_the_fix():
    done = run_recipe("--system", "slurm", "--resource-spec", "select=1")
    assert done.returncode == 2 and "--resource-spec is a PBS option" in done.stderr
    done = run_recipe("--system", "pbs", "--print-job-script")
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert done.stderr.strip() == ("cluster/jobqueue.py: error: the pbs cluster needs "
                                   "dask-jobqueue, which is not installed: pip install dask-jobqueue")
