"""Figures 2, 3 and 7: Lee et al.'s (2022) mixture of two Gaussians, as the paper reran it.

The data (:func:`lee_mixture`, after Lee et al.'s ``synthetic2_generate.m``): 240 points per
group, drawn in a 1,000-dimensional latent space from two Gaussians whose means differ by a
vector of norm 2 and whose covariances are block-diagonal AR(1) matrices with different
correlations (normalized so that their difference has spectral norm 1), each group mapped
to R^d by its own Gaussian random matrix.  Ten 70/30 splits of the 240 indices, the same for
both groups (336 training, 144 test points).

For each d and split we fit on the train split at k = 5 and measure on the test split: %Var,
MMD² (bandwidth as in Tables 1-3), linear inseparability (the balanced error of a logistic
regression trained on the train split's representation to predict the group:
:func:`dfairpca.metrics.linear_inseparability`) and the wall time of the fit.
"""

from __future__ import annotations

import functools
import time

import numpy as np

from ._report import markdown_table
from .inlp import inlp_components

# Deferred imports: scipy (heavy or optional) and package modules that load such libraries, or this
# module, at import are imported in the functions that use them, so that importing this module stays
# light.

METHODS = ("PCA", "Fair PCA", "Fair PCA-S (0.85)", "Fair Kernel PCA", "INLP")
#: peers of the paper's figures that cannot run here, and why
NOT_RUN = {
    "FPCA (Olfat & Aswani 2019)": "a semidefinite program: needs an SDP solver stack that is "
                                  "no dependency of ours (the paper measured over 2,000 s at d = 100)",
    "MbF-PCA (Lee et al. 2022)": "Matlab code (manifold optimization with Manopt/ROPTLIB)",
    "RLACE (Ravfogel et al. 2022)": "needs PyTorch",
}
LATENT = 1000
PER_GROUP = 240
TRAIN = 168  # 70% of 240
K = 5
D_FOR_K = 100  # Figure 7


def _ar(r: float, p: int) -> np.ndarray:
    """AR(1) covariance ``r^|i-j| / (1 - r^2)`` of size p."""
    i = np.arange(p)
    return r ** np.abs(i[:, None] - i[None, :]) / (1.0 - r * r)


def _block_diag(blocks) -> np.ndarray:
    from scipy.linalg import block_diag

    return block_diag(*blocks)


def lee_mixture(d: int, seed: int = 0):
    """(X1, X2): the two groups' 240 x d points (see the module docstring)."""
    rng = np.random.default_rng(seed)
    p = LATENT // 5
    s1 = _block_diag([_ar(r, p) for r in (0.99, 0.98, 0.97, 0.98, 0.95)])
    s2 = _block_diag([_ar(r, p) for r in (0.95, 0.98, 0.97, 0.98, 0.99)])
    scale = np.abs(np.linalg.eigvalsh(s2 - s1)).max()
    mean_gap = np.full(LATENT, 2.0 / np.sqrt(LATENT))
    out = []
    for cov, mu in ((s1 / scale, 0.0), (s2 / scale, mean_gap)):
        latent = mu + rng.standard_normal((PER_GROUP, LATENT)) @ np.linalg.cholesky(cov).T
        out.append(latent @ rng.standard_normal((LATENT, d)))
    return out


def split(X1, X2, index: int):
    """Train and test (X, z) of split ``index``: the same 70/30 split of both groups."""
    perm = np.random.default_rng(1000 + index).permutation(PER_GROUP)
    tr, te = perm[:TRAIN], perm[TRAIN:]

    def part(rows):
        z = np.r_[np.ones(len(rows), int), np.zeros(len(rows), int)]
        return np.vstack([X1[rows], X2[rows]]), z

    return part(tr), part(te)


def fit_method(method: str, X, z, k: int):
    """Fit ``method``; return (seconds, representation function, components or None)."""
    from .. import PCA, FairKernelPCA, FairPCA

    t0 = time.perf_counter()
    if method == "INLP":
        U = inlp_components(X, z, k)
        secs = time.perf_counter() - t0
        return secs, (lambda A: np.asarray(A) @ U.T), U
    est = {"PCA": lambda: PCA(k), "Fair PCA": lambda: FairPCA(k),
           "Fair PCA-S (0.85)": lambda: FairPCA(k, equalize_covariance=0.85),
           "Fair Kernel PCA": lambda: FairKernelPCA(k, gamma="scale", center=False)}[method]()
    est = est.fit(X) if method == "PCA" else est.fit(X, sensitive_features=z)
    secs = time.perf_counter() - t0
    return secs, est.transform, getattr(est, "components_", None)


def measure(d: int, index: int, methods, k: int = K, data=None) -> list[dict]:
    """One row per method of split ``index`` at dimension d and target dimension k."""
    from .. import PCA, metrics

    X1, X2 = data if data is not None else lee_mixture(d)
    (Xtr, ztr), (Xte, zte) = split(X1, X2, index)
    sigma = metrics.mmd_bandwidth(PCA(k).fit(Xtr).transform(Xtr), max_samples=None)
    rows = []
    for method in methods:
        secs, rep, U = fit_method(method, Xtr, ztr, k)
        row = {"d": d, "k": k, "split": index, "method": method, "seconds": secs,
               "var": None, "mmd2": None}
        if U is not None:  # not for the kernel: its feature space is another one
            row["var"] = metrics.explained_variance_pct(Xte, U)
            row["mmd2"] = metrics.mmd2(rep(Xte), zte, sigma, max_samples=None)
        row["linear_inseparability"] = metrics.linear_inseparability(rep(Xtr), ztr, rep(Xte), zte)
        rows.append(row)
    return rows


def _methods_at(d: int, index: int, cfg) -> list[str]:
    """The methods run on split ``index`` at d: INLP and Fair PCA-S only up to their limits
    of d (and INLP's of splits beyond d = 100)."""
    inlp = d <= cfg.inlp_max_d and (d <= 100 or index < cfg.inlp_splits)
    return [m for m in METHODS if (m != "INLP" or inlp)
            and (m != "Fair PCA-S (0.85)" or d <= cfg.pca_s_max_d)]


_WARM: list = []  # non-empty once this process has fitted (see :func:`run`)


@functools.lru_cache(maxsize=1)
def _data(d: int):
    """:func:`lee_mixture` of d, kept for the next piece at the same d in this process."""
    return lee_mixture(d)


def splits_at(d: int, cfg) -> int:
    """The splits the sweep over d runs at d."""
    return cfg.synth_splits if d < cfg.synth_big_d else cfg.synth_big_splits


def tasks(cfg) -> tuple:
    """The independent pieces of :func:`run`: (d, split) of the sweep over d, the largest d
    (the slowest pieces) first, then ("k", k) of the sweep over k."""
    by_d = [(d, i) for d in sorted(cfg.synth_dims, reverse=True) for i in range(splits_at(d, cfg))]
    return (*by_d, *(("k", k) for k in cfg.synth_ks))


def run(cfg, log=print, task=None) -> tuple[list[dict], list[dict]]:
    """Rows of Figures 2 and 3 (vs d, k = 5) and of Figure 7 (vs k, d = 100); ``task`` (one
    of :func:`tasks`) runs one piece (the other list is then empty)."""
    if not _WARM:  # the first fit of a process imports dask and scikit-learn's parts
        measure(20, 0, METHODS)
        _WARM.append(True)
    by_d, by_k = [], []
    for a, b in tasks(cfg) if task is None else (task,):
        t0 = time.perf_counter()
        if a == "k":
            for i in range(cfg.synth_splits):
                by_k += measure(D_FOR_K, i, _methods_at(D_FOR_K, i, cfg), b, _data(D_FOR_K))
            log(f"synthetic: d = {D_FOR_K}, k = {b}, {cfg.synth_splits} splits "
                f"({time.perf_counter() - t0:.1f} s)")
        else:
            by_d += measure(a, b, _methods_at(a, b, cfg), K, _data(a))
            log(f"synthetic: d = {a}, split {b} ({time.perf_counter() - t0:.1f} s)")
    return by_d, by_k


def _curves(rows, x: str, y: str):
    """{method: (xs, means, stds)} of column y against column x."""
    out = {}
    for m in METHODS:
        pts: dict = {}
        for r in rows:
            if r["method"] == m and r[y] is not None:
                pts.setdefault(r[x], []).append(r[y])
        if pts:
            xs = sorted(pts)
            out[m] = (xs, [np.mean(pts[v]) for v in xs], [np.std(pts[v]) for v in xs])
    return out


STYLE = {"PCA": ("k", "o"), "Fair PCA": ("tab:blue", "s"), "Fair PCA-S (0.85)": ("tab:green", "^"),
         "Fair Kernel PCA": ("tab:purple", "D"), "INLP": ("tab:red", "v")}


def _plot(ax, curves, log_y=False):
    for m, (xs, mu, sd) in curves.items():
        color, marker = STYLE[m]
        ax.errorbar(xs, mu, yerr=sd, label=m, color=color, marker=marker, ms=4, capsize=2, lw=1.2)
    ax.set_xscale("log")
    if log_y:
        ax.set_yscale("log")
    ax.grid(alpha=0.3)


def figures(report, by_d, by_k, plt) -> None:
    """Figures 2, 3 and 7 into the report."""
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    for ax, (col, label) in zip(axes, [("var", "% variance explained (↑)"), ("mmd2", "MMD² (↓)"),
                                       ("linear_inseparability", "linear inseparability (↑)")]):
        _plot(ax, _curves(by_d, "d", col))
        ax.set_xlabel("data dimension d")
        ax.set_ylabel(label)
    axes[1].set_yscale("log")  # the biased MMD² estimate is positive
    axes[0].legend(fontsize=8)
    fig.suptitle(f"Figure 2: Lee et al.'s mixture of two Gaussians, k = {K} (mean ± std over splits)")
    report.figure(fig, "figure2.png", "Figure 2 (ours): %Var, MMD² and linear inseparability vs d",
                  "boxplots for d up to 800: PCA explains about 50% of the variance but has MMD² "
                  "> 0.5 and linear inseparability < 0.02; fair PCA explains above 30% with MMD² "
                  "below 0.07; Fair PCA-S behaves like FPCA; every fair method has a similar "
                  "linear inseparability. Fair kernel PCA is only in the right plot.")

    _time_figure(report, plt, _curves(by_d, "d", "seconds"), "data dimension d",
                 f"Figure 3: running time vs d (k = {K})", "figure3.png",
                 "Figure 3 (ours): fit time vs d",
                 "FPCA over 2,000 s, RLACE about 20 s, MbF-PCA about 1.3 s and INLP about 0.8 s "
                 "at d = 100; at d = 800 RLACE about 260 s, MbF-PCA 43 s, INLP 1,270 s, and none "
                 "of the paper's methods over 0.5 s (MacBook Pro, 6 cores).")
    _time_figure(report, plt, _curves(by_k, "k", "seconds"), "target dimension k",
                 f"Figure 7: running time vs k (d = {D_FOR_K})", "figure7.png",
                 "Figure 7 (ours): fit time vs k at d = 100",
                 "our methods' time grows only moderately with k, MbF-PCA's drastically (about "
                 "290 s at k = 50), INLP's decreases with k (it removes d - k directions).",
                 log_x=False)


def _time_figure(report, plt, curves, xlabel, title, name, caption, paper, log_x=True) -> None:
    """One running-time figure (log seconds) into the report."""
    fig, ax = plt.subplots(figsize=(6, 4))
    _plot(ax, curves, log_y=True)
    if not log_x:
        ax.set_xscale("linear")
    ax.set_xlabel(xlabel)
    ax.set_ylabel("fit wall time (s)")
    ax.set_title(title)
    ax.legend(fontsize=8)
    report.figure(fig, name, caption, paper)


def _mean(rows, column: str, fmt: str) -> str:
    """The mean of ``column`` over ``rows`` formatted, or n/a when none has it."""
    v = [r[column] for r in rows if r[column] is not None]
    return format(np.mean(v), fmt) if v else "n/a"


def markdown(by_d) -> str:
    """The table of means at the largest d each method ran, and the peers not run."""
    head = ["d", "method", "splits", "%Var", "MMD²", "linear inseparability", "fit (s)"]
    rows = []
    for d in sorted({r["d"] for r in by_d}):
        for m in METHODS:
            rs = [r for r in by_d if r["d"] == d and r["method"] == m]
            if not rs:
                continue
            rows.append([d, m, len(rs), _mean(rs, "var", ".2f"), _mean(rs, "mmd2", ".4f"),
                         _mean(rs, "linear_inseparability", ".3f"), _mean(rs, "seconds", ".3g")])
    peers = "\n".join(f"- **{p}: not run** ({why})." for p, why in NOT_RUN.items())
    reach = "; ".join(f"{m} to d = {max(r['d'] for r in by_d if r['method'] == m):,}"
                      for m in METHODS if any(r["method"] == m for r in by_d))
    return (markdown_table(head, rows) + f"\n\nHow far each method ran: {reach}.  Fair PCA-S "
            "stops where its d x d eigendecomposition (O(d³): about 2 min at d = 6,400, 8 times "
            "that at twice d) no longer fits the run's time; INLP (ours, `dfairpca/paper/inlp.py`, "
            "from Ravfogel et al. 2020) fits d - k linear classifiers, so beyond d = 100 it runs "
            "on fewer splits (the table's \"splits\" column).\n\nPeers of Figures 2, 3 and 7 "
            "that cannot run here:\n\n" + peers)
