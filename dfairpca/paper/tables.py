"""Tables 1-3 of the paper: Adult, German Credit and COMPAS on the Lee et al. (2022) splits.

For k = 2 and 10 and each split, our five methods are fitted on the train split
(``dfairpca.datasets``); on the test split we measure

* %Var and MMD² exactly as Lee et al.'s code (:mod:`dfairpca.metrics`: the covariance of the
  test split; a Gaussian kernel whose bandwidth comes from the train split projected by
  standard PCA).  These are deterministic and must match the paper to its printed digits;
* accuracy and ΔDP of three classifiers.  Lee et al.'s protocol, which the paper kept (its
  released MLP script does the same), trains each classifier on the test split's
  representation and scores it on that same split: we do the same.  Their kernel SVM and the
  paper's linear SVM are Matlab's ``fitcsvm`` (defaults: box constraint 1, kernel scale 1, no
  standardization), which we cannot run; scikit-learn's ``SVC`` solves the same dual problem
  with the same kernel (``gamma=1``, ``C=1``) and is what we use.  The MLP is the paper's:
  scikit-learn's ``MLPClassifier((10, 5), random_state=999, max_iter=10000)``.  ΔDP is
  fairlearn's demographic-parity difference.

Fair Kernel PCA is :class:`dfairpca.FairKernelPCA` with the Gaussian kernel, ``gamma = 1 /
(d Var(train))`` (App. C.1) and the uncentred kernel of the paper's formulas and code.  The
paper prints n/a for its %Var and MMD² ("not meaningful": its directions live in the
kernel's feature space, not in R^d, so ``trace(U^T A U)`` with the data's covariance A is
undefined, and its representation has another scale than a projection of the data, so an
MMD² with the bandwidth of the linear methods is not comparable).  The main tables keep
n/a there; beside them we print what those two columns are *in the feature space*, over the
same ten splits: %Var as the share of the test split's centred feature-space variance that
the k fair directions keep (they are orthonormal there), and MMD² of the test split's
representation with Lee et al.'s bandwidth rule applied in that space (the train split under
standard kernel PCA with the same kernel: the second half of one fit with ``tradeoff=1``),
for standard kernel PCA too, as the linear tables show PCA beside Fair PCA.
"""

from __future__ import annotations

import time
import warnings

import numpy as np

from ..datasets import N_SPLITS, PAPER_TABLES, load_adult, load_compas, load_german
from ..datasets import PAPER_DIGITS as DIGITS, PAPER_METHODS as OUR_METHODS
from ._report import cell, markdown_table

# Deferred imports: fairlearn, sklearn (heavy or optional) and package modules that load such
# libraries, or this module, at import are imported in the functions that use them, so that
# importing this module stays light.

#: data set -> (table number, title, loader)
DATASETS = {
    "adult": (1, "Adult Income", load_adult),
    "german": (2, "German Credit", load_german),
    "compas": (3, "COMPAS", load_compas),
}
KS = (2, 10)
#: the columns, as :class:`dfairpca.datasets.PaperFigure` names them
COLUMNS = tuple(DIGITS)
DETERMINISTIC = ("var", "mmd2")
#: the kernel's %Var and MMD² in its feature space (standard and fair kernel PCA): the paper
#: has none (see the module docstring); every row carries them, None but for Fair Kernel PCA
FEATURE_SPACE = ("kpca_var", "kpca_mmd2", "fkpca_var", "fkpca_mmd2")
HEADERS = {"var": "%Var", "mmd2": "MMD²", "ksvm_acc": "kernel SVM %Acc", "ksvm_dp": "kernel SVM ΔDP",
           "lsvm_acc": "linear SVM %Acc", "lsvm_dp": "linear SVM ΔDP", "mlp_acc": "MLP %Acc",
           "mlp_dp": "MLP ΔDP"}


def estimators(k: int) -> dict:
    """Our five methods at target dimension k, unfitted."""
    from .. import PCA, FairKernelPCA, FairPCA

    return {
        "PCA": PCA(k),
        "Fair PCA": FairPCA(k),
        # tradeoff=1: [fair, standard kernel PCA], the second half only for the feature-space
        # columns (the representation, and what the classifiers see, is the first half)
        "Fair Kernel PCA": FairKernelPCA(k, kernel="rbf", gamma="scale", center=False, tradeoff=1.0),
        "Fair PCA-S (0.5)": FairPCA(k, equalize_covariance=0.5),
        "Fair PCA-S (0.85)": FairPCA(k, equalize_covariance=0.85),
    }


def classifiers(mlp_max_iter: int) -> dict:
    """The three downstream classifiers (see the module docstring for the settings)."""
    from sklearn.svm import SVC

    from sklearn.neural_network import MLPClassifier

    return {
        "ksvm": SVC(kernel="rbf", C=1.0, gamma=1.0),  # fitcsvm(X, y, 'KernelFunction', 'RBF')
        "lsvm": SVC(kernel="linear", C=1.0),  # fitcsvm(X, y)
        "mlp": MLPClassifier(hidden_layer_sizes=(10, 5), random_state=999, max_iter=mlp_max_iter),
    }


def downstream(R, y, z, mlp_max_iter: int) -> dict:
    """Accuracy (%) and ΔDP of each classifier trained and scored on (R, y) (Lee et al.)."""
    from sklearn.exceptions import ConvergenceWarning

    from fairlearn.metrics import demographic_parity_difference

    out = {}
    for name, clf in classifiers(mlp_max_iter).items():
        with warnings.catch_warnings():  # quick runs stop the MLP early, on purpose
            warnings.simplefilter("ignore", ConvergenceWarning)
            pred = clf.fit(R, y).predict(R)
        out[f"{name}_acc"] = 100.0 * float(np.mean(pred == y))
        out[f"{name}_dp"] = float(demographic_parity_difference(y, pred, sensitive_features=z))
    return out


def feature_space_var_pct(X, gamma: float, R) -> float:
    """%Var in the Gaussian kernel's feature space: the share of the centred variance of the
    features of X's rows that R keeps (R: X's coordinates along directions that are
    orthonormal in that space, as :class:`dfairpca.FairKernelPCA`'s are)."""
    from sklearn.metrics.pairwise import rbf_kernel

    K = rbf_kernel(X, gamma=gamma)
    total = np.trace(K) - K.sum() / len(K)  # trace of the centred feature covariance (x n)
    Rc = R - R.mean(axis=0)
    return float(100.0 * np.sum(Rc * Rc) / total)


def kernel_columns(est, k: int, Xtr, Xte, zte) -> tuple[np.ndarray, dict]:
    """Fair Kernel PCA's test representation at k and its :data:`FEATURE_SPACE` columns,
    from ``est`` fitted with ``tradeoff=1`` at any k' >= k: the solution is nested (the top
    eigenvectors of one matrix), so its first k fair and first k standard components are
    those of a fit at k."""
    from .. import metrics

    top = est.n_components_
    both_tr, both_te = est.transform(Xtr), est.transform(Xte)
    sigma = metrics.mmd_bandwidth(both_tr[:, top:top + k], max_samples=None)  # standard kernel PCA
    fair, standard = both_te[:, :k], both_te[:, top:top + k]
    return fair, {
        "kpca_var": feature_space_var_pct(Xte, est.gamma_, standard),
        "kpca_mmd2": metrics.mmd2(standard, zte, sigma, max_samples=None),
        "fkpca_var": feature_space_var_pct(Xte, est.gamma_, fair),
        "fkpca_mmd2": metrics.mmd2(fair, zte, sigma, max_samples=None),
    }


def _fit(method: str, est, X, z):
    """(est fitted on X, seconds); z the protected attribute (not for PCA)."""
    t0 = time.perf_counter()
    est = est.fit(X) if method == "PCA" else est.fit(X, sensitive_features=z)
    return est, time.perf_counter() - t0


def split_rows(dataset: str, split: int, *, classify: bool, mlp_max_iter: int) -> list[dict]:
    """One row per (k, method) of one split: the columns measured (None where not)."""
    from .. import metrics

    b = DATASETS[dataset][2](split=split)
    Xtr, ztr, Xte, yte, zte = b.X_train, b.sensitive_train, b.X_test, b.y_test, b.sensitive_test
    rows: list = []
    kernel: list = []
    for k in KS:
        for method, est in estimators(k).items():
            if method != "Fair Kernel PCA":
                est, fit_s = _fit(method, est, Xtr, ztr)
            else:  # one fit at the largest k serves every k (see kernel_columns)
                kernel = kernel or [_fit(method, estimators(max(KS))[method], Xtr, ztr)]
                est, fit_s = kernel[0]
            row = {"dataset": dataset, "k": k, "method": method, "split": split, "fit_s": fit_s}
            row.update(dict.fromkeys(COLUMNS + FEATURE_SPACE))
            if method == "Fair Kernel PCA":  # %Var and MMD² n/a: see the module docstring
                R, extra = kernel_columns(est, k, Xtr, Xte, zte)
                row.update(extra)
            else:
                R = est.transform(Xte)
                if method == "PCA":  # Lee et al.'s bandwidth: the train split under standard PCA
                    sigma = metrics.mmd_bandwidth(est.transform(Xtr), max_samples=None)
                row["var"] = metrics.explained_variance_pct(Xte, est.components_)
                row["mmd2"] = metrics.mmd2(R, zte, sigma, max_samples=None)
            if classify:
                row.update(downstream(R, yte, zte, mlp_max_iter))
            rows.append(row)
    return rows


def tasks(cfg) -> tuple:
    """The independent pieces of :func:`run`: (data set, split)."""
    return tuple((dataset, split) for dataset in DATASETS for split in range(N_SPLITS))


def run(cfg, log=print, task=None) -> list[dict]:
    """Rows of every split of every data set, or of piece ``task`` (one of :func:`tasks`);
    the classifier columns on the first ``cfg.classifier_splits`` splits."""
    rows = []
    for dataset, split in tasks(cfg) if task is None else (task,):
        t0 = time.perf_counter()
        classify = split < cfg.classifier_splits
        rows += split_rows(dataset, split, classify=classify, mlp_max_iter=cfg.mlp_max_iter)
        log(f"tables: {dataset} split {split} ({time.perf_counter() - t0:.1f} s)")
    return rows


def summarize(rows: list[dict]) -> dict:
    """{(dataset, k, method): {column: (mean, std, n)}}, std with ddof 0 (as the paper's)."""
    out: dict = {}
    for r in rows:
        key = (r["dataset"], r["k"], r["method"])
        for c in COLUMNS:
            if r[c] is not None:
                out.setdefault(key, {}).setdefault(c, []).append(r[c])
    return {key: {c: (float(np.mean(v)), float(np.std(v)), len(v)) for c, v in cols.items()}
            for key, cols in out.items()}


def half_unit(column: str) -> float:
    """Half a unit of the paper's last printed digit in ``column`` (its rounding)."""
    return 0.5 * 10.0 ** -DIGITS[column]


def agreement(summary: dict) -> list[dict]:
    """Each cell of ours beside the paper's: deterministic cells must round to the printed
    mean and std; a stochastic cell is ``within`` when its mean is within the paper's std
    (plus half a printed unit, the paper's rounding) of the paper's mean."""
    out = []
    for (dataset, k, method), cols in summary.items():
        paper = PAPER_TABLES[dataset][(k, method)]
        for c, (mean, std, n) in cols.items():
            p, p_std = getattr(paper, c), getattr(paper, c + "_std")
            tol = half_unit(c) + 1e-9
            if c in DETERMINISTIC:
                ok = abs(mean - p) <= tol and abs(std - p_std) <= tol
            else:
                ok = abs(mean - p) <= p_std + tol
            out.append({"dataset": dataset, "k": k, "method": method, "column": c, "mean": mean,
                        "std": std, "n_splits": n, "paper": p, "paper_std": p_std,
                        "deterministic": c in DETERMINISTIC, "agrees": ok})
    return out


def tally(cells: list[dict], dataset: str) -> dict:
    """Counts of agreeing cells of one table, deterministic and stochastic."""
    det = [c for c in cells if c["dataset"] == dataset and c["deterministic"]]
    sto = [c for c in cells if c["dataset"] == dataset and not c["deterministic"]]
    return {"deterministic": (sum(c["agrees"] for c in det), len(det)),
            "stochastic": (sum(c["agrees"] for c in sto), len(sto))}


def markdown(dataset: str, summary: dict, cells: list[dict]) -> str:
    """The table of ``dataset``: for each method a row of ours and a row of the paper's."""
    num, title, _ = DATASETS[dataset]
    flag = {(c["k"], c["method"], c["column"]): c["agrees"] for c in cells if c["dataset"] == dataset}
    rows = []
    for k in KS:
        for method in OUR_METHODS:
            ours = summary.get((dataset, k, method), {})
            paper = PAPER_TABLES[dataset][(k, method)]
            mine, theirs = [str(k), method, "ours"], ["", "", "paper"]
            for c in COLUMNS:
                d = DIGITS[c]
                if c in ours:
                    mark = "" if flag[(k, method, c)] else (" ✗" if c in DETERMINISTIC else " †")
                    mine.append(cell(ours[c][0], ours[c][1], d) + mark)
                else:
                    mine.append("n/a" if getattr(paper, c) is None else "—")
                theirs.append(cell(getattr(paper, c), getattr(paper, c + "_std"), d))
            rows += [mine, theirs]
    t = tally(cells, dataset)
    n_cls = max((v[2] for cols in summary.values() for key, v in cols.items()
                 if key not in DETERMINISTIC), default=0)
    head = (f"### Table {num}: {title}\n\n"
            f"%Var and MMD² over the ten splits: **{t['deterministic'][0]} of "
            f"{t['deterministic'][1]}** cells match the paper's printed mean and std (✗ marks one "
            f"that does not).  Classifier columns over {n_cls} split(s): "
            f"**{t['stochastic'][0]} of {t['stochastic'][1]}** means lie within the paper's std "
            f"of the paper's mean († marks the others).")
    return head + "\n\n" + markdown_table(["k", "method", ""] + [HEADERS[c] for c in COLUMNS], rows)


def feature_space(rows: list[dict]) -> dict:
    """{(dataset, k): {column: (mean, std, n)}} of the :data:`FEATURE_SPACE` columns."""
    out: dict = {}
    for r in rows:
        if r["method"] == "Fair Kernel PCA":
            for c in FEATURE_SPACE:
                out.setdefault((r["dataset"], r["k"]), {}).setdefault(c, []).append(r[c])
    return {key: {c: (float(np.mean(v)), float(np.std(v)), len(v)) for c, v in cols.items()}
            for key, cols in out.items()}


def feature_space_markdown(rows: list[dict]) -> str:
    """Fair Kernel PCA's %Var and MMD² in the kernel's feature space beside the paper's n/a."""
    fs = feature_space(rows)
    table = []
    for dataset, (num, title, _) in DATASETS.items():
        for k in KS:
            if (dataset, k) not in fs:
                continue
            cols = fs[(dataset, k)]
            paper = PAPER_TABLES[dataset][(k, "Fair Kernel PCA")]
            table.append([f"{num} ({title})", k, cols["fkpca_var"][2]]
                         + [cell(cols[c][0], cols[c][1], DIGITS[c.split("_")[1]]) for c in FEATURE_SPACE]
                         + [f"{cell(paper.var, paper.var_std, 2)}, {cell(paper.mmd2, paper.mmd2_std, 3)}"])
    head = ("### Fair Kernel PCA's %Var and MMD²: n/a in the paper, in feature space here\n\n"
            "No cell of ours can match a printed digit here: the paper prints n/a (see the "
            "Fair Kernel PCA paragraph above).  Our numbers are in the kernel's feature space, "
            "mean (std) over the splits: not comparable with the linear methods' columns.")
    return head + "\n\n" + markdown_table(
        ["table", "k", "splits", "kernel PCA %Var", "kernel PCA MMD²", "Fair Kernel PCA %Var",
         "Fair Kernel PCA MMD²", "paper (%Var, MMD²)"], table)
