"""dfairpca fit --svd-solver randomized on a real store and cluster: resumable pass by pass."""

import json

import numpy as np
import pandas as pd
import pytest

import dfairpca
from dfairpca.celeba import synth_celeba
from dfairpca.cli import main


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    path = tmp_path_factory.mktemp("cli_randomized") / "faces.zarr"
    synth_celeba(path, n=1200, size=24, chunk_rows=200, progress=False, n_jobs=1)
    return path


@pytest.fixture(scope="module")
def sched(client):
    return ["--scheduler", client.scheduler.address]


def run(args, capsys):
    code = main([str(a) for a in args])
    out = capsys.readouterr()
    return code, out.out, out.err


SOLVE = ["--svd-solver", "randomized", "--iterated-power", "3", "--n-oversamples", "6",
         "--random-state", "7", "--rows-per-chunk", "100"]


def test_randomized_fit_resumes_at_the_next_pass(store, tmp_path, capsys, sched, stop_after):
    """A fit stopped after its second pass resumes at the third (--resume) and writes the
    model an uninterrupted fit writes; the summary names the solver and the passes."""
    from dfairpca.inputs._groups import encode_groups
    from dfairpca.solve._randomized import fit_randomized
    from dfairpca.celeba.schema import read_images
    from dfairpca.engine.checkpoint import PassInterrupted

    model, ckpt = tmp_path / "m", tmp_path / "m.checkpoint"
    z = dfairpca.celeba.attribute_column(store, "Eyeglasses")
    g = encode_groups(pd.DataFrame({"Eyeglasses": z}), len(z))
    X = read_images(store, rows_per_chunk=100)
    with pytest.raises(PassInterrupted, match="after 2 of 5 passes"):  # the CLI's job, stopped
        fit_randomized(X, 8, codes=g.codes, categories=g.categories, names=["Eyeglasses"],
                       iterated_power=3, n_oversamples=6, random_state=7, checkpoint=ckpt,
                       on_pass=stop_after(2))
    fit = ["fit", store, "--attribute", "Eyeglasses", "-k", "8", *SOLVE, *sched]
    code, _, err = run([*fit, "--out", model], capsys)
    assert code == 1 and "--resume" in err
    code, out, err = run([*fit, "--out", model, "--resume", "--json"], capsys)
    assert code == 0, err
    summary = json.loads(out)
    assert summary["svd_solver"] == "randomized" and summary["passes"] == 5
    assert "solver randomized, 5 passes over X" in err
    assert not ckpt.exists()
    code, out, err = run([*fit, "--out", tmp_path / "whole", "--json"], capsys)
    assert code == 0, err
    got, ref = dfairpca.load(model), dfairpca.load(tmp_path / "whole")
    np.testing.assert_allclose(got.components_, ref.components_, rtol=0, atol=1e-12)
    np.testing.assert_allclose(got.explained_variance_, ref.explained_variance_, rtol=1e-12)
    assert got.fairness_violation_ <= 1e-9


def test_solver_options_are_checked_before_any_work(store, tmp_path, capsys):
    dead = ["--scheduler", "tcp://127.0.0.1:9", "--timeout", "1"]
    fit = ["fit", store, "--attribute", "Eyeglasses", "-k", "5", "--out", tmp_path / "m", *dead]
    for extra, expected in [
        (["--svd-solver", "full", "--iterated-power", "2"],
         "--iterated-power sets the randomized solve; --svd-solver full"),
        (["--svd-solver", "randomized", "--method", "fair-s"],
         "Fair PCA-S (equalize_covariance) has no matrix-free form: it needs 3 d x d float64"),
        (["--iterated-power", "-1"], "must be 'auto' or an integer >= 0"),
        (["--method", "fair-s", "--n-oversamples", "3", "--iterated-power", "2",
          "--random-state", "7"], "--n-oversamples sets the randomized solve; --method fair-s"),
        (["--svd-solver", "full", "--random-state", "7"],
         "--random-state sets the randomized solve; --svd-solver full"),
        (["--svd-solver", "randomized", "--statistics"],
         "the randomized fit (d = 576, k = 5) does not form: drop --statistics, or pass "
         "--svd-solver full"),
    ]:
        code, _, err = run(fit + extra, capsys)
        assert code == 2 and expected in err and "scheduler" not in err, (extra, err)
    assert not (tmp_path / "m").exists()


def test_auto_that_chooses_the_exact_fit_says_the_randomized_options_go_unused(
        store, tmp_path, capsys, sched):
    """At d = 576 and k = 4, --svd-solver auto takes the exact one-pass fit: the options of
    the randomized solve given with it are named as unused, before the pass (the choice
    needs the store's width, so it is a note, not an error); without them, no note."""
    fit = ["fit", store, "--attribute", "Eyeglasses", "-k", "4", "--json", *sched]
    code, out, err = run([*fit, "--out", tmp_path / "a", "--iterated-power", "2",
                          "--random-state", "3"], capsys)
    assert code == 0, err
    note = ("note: --svd-solver auto chose the exact one-pass fit for d = 576 and k = 4 (its "
            "d x d statistics fit in memory and cost less), which does not use "
            "--iterated-power, --random-state: pass --svd-solver randomized")
    assert note in err
    assert err.index(note) < err.index("solver covariance_eigh, 1 pass over X")
    code, out, err = run([*fit, "--out", tmp_path / "b"], capsys)
    assert code == 0 and "note:" not in err, err
