"""Reproduce Table 1 of Kleindessner et al. (2023) on Adult (the Lee et al. 2022 splits).

For k = 2 and 10 and each of the ten 70/30 splits: fit on the train split, report
%Var = 100 trace(U^T A U) / trace(A) with A the covariance of the test split, and MMD^2
between the two sex groups of the projected test split (Gaussian kernel, bandwidth from
the train split projected by standard PCA, see dfairpca.metrics).  Prints mean (std).

    python examples/adult_table1.py [--data ../shared/data/adult_lee2022]
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import numpy as np

import dfairpca
from dfairpca import metrics

DEFAULT_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "adult_lee2022"
N_FEATURES = 97  # then the label (income > 50k), then the protected attribute (sex)

#: the paper's Table 1 means (README of the data folder)
PAPER = {
    (2, "PCA"): (7.78, 0.349), (2, "Fair PCA"): (6.37, 0.009),
    (10, "PCA"): (21.77, 0.195), (10, "Fair PCA"): (19.62, 0.014),
    (2, "Fair PCA-S (0.5)"): (3.05, None), (2, "Fair PCA-S (0.85)"): (4.27, None),
    (10, "Fair PCA-S (0.5)"): (12.75, None), (10, "Fair PCA-S (0.85)"): (15.79, None),
}


def load_split(data: Path, split: int):
    tr = np.loadtxt(data / f"train_{split}.csv.gz", delimiter=",")
    te = np.loadtxt(data / f"test_{split}.csv.gz", delimiter=",")
    return (tr[:, :N_FEATURES], tr[:, N_FEATURES + 1]), (te[:, :N_FEATURES], te[:, N_FEATURES + 1])


def methods():
    """name -> function(k) building an unfitted estimator (FairPCA variants get groups)."""
    return {
        "PCA": lambda k: dfairpca.PCA(k),
        "Fair PCA": lambda k: dfairpca.FairPCA(k),
        "Fair PCA-S (0.5)": lambda k: dfairpca.FairPCA(k, equalize_covariance=0.5),
        "Fair PCA-S (0.85)": lambda k: dfairpca.FairPCA(k, equalize_covariance=0.85),
    }


def table1(data: Path = DEFAULT_DATA, ks=(2, 10), splits=range(10)):
    """{(k, method): {"var": [...], "mmd2": [...]}} over the splits."""
    out = {}
    for split in splits:
        (Xtr, ztr), (Xte, zte) = load_split(Path(data), split)
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
    ap.add_argument("--data", type=Path, default=Path(os.environ.get("DFAIRPCA_ADULT_DIR", DEFAULT_DATA)))
    args = ap.parse_args(argv)
    res = table1(args.data)
    print(f"{'k':>3}  {'method':<20} {'%Var':>14} {'MMD^2':>16}   paper %Var / MMD^2")
    for (k, name), r in res.items():
        v, m = np.array(r["var"]), np.array(r["mmd2"])
        pv = PAPER.get((k, name))
        paper = f"{pv[0]:.2f} / {pv[1]:.3f}" if pv and pv[1] is not None else (f"{pv[0]:.2f}" if pv else "")
        print(f"{k:>3}  {name:<20} {v.mean():7.2f} ({v.std():.2f}) {m.mean():8.3f} ({m.std():.3f})   {paper}")
    return res


if __name__ == "__main__":
    main()
