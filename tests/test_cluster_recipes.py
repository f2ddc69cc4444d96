"""The recipes of cluster/: the SLURM/PBS script runs --help and builds its options without
dask-jobqueue (an optional install), and says how to get it when it is needed."""

import importlib.util
import runpy
import sys
from pathlib import Path

import pytest

RECIPE = Path(__file__).resolve().parents[1] / "cluster" / "jobqueue.py"


@pytest.fixture
def run_recipe(capsys, monkeypatch):
    """``run_recipe(*args) -> (exit status, stdout, stderr)``: the recipe run as a script
    (``python cluster/jobqueue.py ARGS``) on a machine without dask-jobqueue, whether or
    not this one has it; in this process, which already has the libraries imported."""
    def run(*args):
        monkeypatch.setitem(sys.modules, "dask_jobqueue", None)  # its import fails
        monkeypatch.setattr(sys, "argv", [str(RECIPE), *args])
        try:
            runpy.run_path(str(RECIPE), run_name="__main__")
            status = 0
        except SystemExit as exc:
            status = exc.code
        out, err = capsys.readouterr()
        if isinstance(status, str):  # sys.exit(message): the interpreter prints it, status 1
            err, status = err + status + "\n", 1
        return status or 0, out, err
    return run


@pytest.fixture(scope="module")
def recipe():
    spec = importlib.util.spec_from_file_location("jobqueue_recipe", RECIPE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_help_needs_no_dask_jobqueue(run_recipe):
    status, out, err = run_recipe("--help")
    assert status == 0, err
    assert "--system {slurm,pbs}" in out and "#SBATCH -p" in out
    assert "#PBS -q" in out


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


def test_a_pbs_option_on_slurm_and_a_missing_dask_jobqueue_are_one_line_with_the_fix(run_recipe):
    status, _, err = run_recipe("--system", "slurm", "--resource-spec", "select=1")
    assert status == 2 and "--resource-spec is a PBS option" in err
    status, _, err = run_recipe("--system", "pbs", "--print-job-script")  # an exception would raise here
    assert status == 1 and "Traceback" not in err
    assert err.strip() == ("cluster/jobqueue.py: error: the pbs cluster needs "
                           "dask-jobqueue, which is not installed: pip install dask-jobqueue")
