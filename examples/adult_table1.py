"""Reproduce Table 1 of Kleindessner et al. (2023) on Adult (the Lee et al. 2022 splits).

For k = 2 and 10 and each of the ten 70/30 splits (packaged: dfairpca.datasets.load_adult):
fit on the train split, report %Var = 100 trace(U^T A U) / trace(A) with A the covariance of
the test split, and MMD^2 between the two sex groups of the projected test split (Gaussian
kernel, bandwidth from the train split projected by standard PCA, see dfairpca.metrics).
Prints mean (std) next to the paper's figures (dfairpca.datasets.PAPER_TABLES["adult"]).

    python examples/adult_table1.py [--splits 10]
"""

from __future__ import annotations

import argparse

import numpy as np

import dfairpca
from dfairpca import metrics
from dfairpca.datasets import N_SPLITS, PAPER_TABLES, load_adult

#: the paper's Table 1: {(k, method): PaperFigure(var, var_std, mmd2, mmd2_std)}
PAPER = PAPER_TABLES["adult"]


def methods():
    """name -> function(k) building an unfitted estimator (FairPCA variants get the groups)."""
    return {
        "PCA": lambda k: dfairpca.PCA(k),
        "Fair PCA": lambda k: dfairpca.FairPCA(k),
        "Fair PCA-S (0.5)": lambda k: dfairpca.FairPCA(k, equalize_covariance=0.5),
        "Fair PCA-S (0.85)": lambda k: dfairpca.FairPCA(k, equalize_covariance=0.85),
    }


def table1(ks=(2, 10), splits=range(N_SPLITS)):
    """{(k, method): {"var": [...], "mmd2": [...]}} over the splits."""
    out = {}
    for split in splits:
        b = load_adult(split=split)
        Xtr, ztr, Xte, zte = b.X_train, b.sensitive_train, b.X_test, b.sensitive_test
        for k in ks:
            pca = dfairpca.PCA(k).fit(Xtr)
            sigma = metrics.mmd_bandwidth(pca.transform(Xtr), max_samples=None)
            for name, make in methods().items():
                est = make(k)
                est = est.fit(Xtr, sensitive_features=ztr) if isinstance(est, dfairpca.FairPCA) else est.fit(Xtr)
                r = out.setdefault((k, name), {"var": [], "mmd2": []})
                r["var"].append(metrics.explained_variance_pct(Xte, est.components_))
                r["mmd2"].append(metrics.mmd2(est.transform(Xte), zte, sigma, max_samples=None))
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--splits", type=int, default=N_SPLITS,
                    help=f"use the first SPLITS of the {N_SPLITS} splits (default: all)")
    args = ap.parse_args(argv)
    if not 1 <= args.splits <= N_SPLITS:
        ap.error(f"--splits must be 1 to {N_SPLITS}; got {args.splits}")
    res = table1(splits=range(args.splits))
    print(f"{'k':>3}  {'method':<20} {'%Var':>14} {'MMD^2':>16}   paper %Var / MMD^2")
    for (k, name), r in res.items():
        v, m = np.array(r["var"]), np.array(r["mmd2"])
        p = PAPER[(k, name)]
        paper = f"{p.var:.2f}" + (f" / {p.mmd2:.3f}" if p.mmd2 is not None else "")
        print(f"{k:>3}  {name:<20} {v.mean():7.2f} ({v.std():.2f}) {m.mean():8.3f} ({m.std():.3f})   {paper}")
    return res


if __name__ == "__main__":
    main()
