"""How big each part of the report runs: the full run (the paper's sizes, or more) and --quick."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Config:
    """Sizes of one run of the report (see :func:`config`)."""

    quick: bool
    # Tables 1-3: the splits the classifier columns use (the %Var and MMD² columns always
    # use all ten: only their ten-split mean and std can be compared with the paper)
    classifier_splits: int
    mlp_max_iter: int  # the paper's 10,000; quick runs stop early (a ConvergenceWarning)
    # Figures 2, 3 and 7 (Lee et al.'s mixture of two Gaussians)
    synth_dims: tuple[int, ...]
    synth_splits: int
    synth_big_d: int  # from this d on, synth_big_splits splits
    synth_big_splits: int
    pca_s_max_d: int  # Fair PCA-S eigendecomposes a d x d matrix whole: ~80 s at d = 6,400
    inlp_max_d: int  # INLP runs d - k linear classifiers: 164 s at d = 800 (the paper's 1,270 s)
    inlp_splits: int  # INLP's splits beyond d = 100
    synth_ks: tuple[int, ...]  # Figure 7, at d = 100
    # Figures 4, 8 and 9 (the λ knob against ExponentiatedGradient)
    tradeoff_runs: int  # logistic regression
    tradeoff_svm_runs: int  # kernel SVM (ExponentiatedGradient refits it ~50 times per point)
    logreg_train_n: int | None  # logistic regression panels: training rows (None: all 1,582)
    svm_train_n: int | None  # kernel SVM panels: training rows (None: all 1,582)
    train_sizes: tuple[int, ...]  # Figure 9, at most the 1,582 rows of a Lee Adult split
    # Figures 5 and 10-15 (synthetic CelebA)
    faces_n: int
    faces_size: int
    faces_k: int


def config(quick: bool) -> Config:
    """The full run, or ``quick``: a few minutes in all on two cores.

    The full run is the paper's protocol where this two-core machine affords it with
    ``--jobs 2``.  CPU seconds of the pieces, measured one at a time with one BLAS thread:
    a split of Tables 1-3 with the classifiers 40 (the three data sets; mostly the MLP), so
    ten splits 400; the sweep over d on ten splits 1,380 (a split at d = 6,400 82, nearly all
    Fair PCA-S's d x d eigendecomposition; at 12,800 without Fair PCA-S 9; INLP's single
    split at d = 800 158), over k 40; the trade-off curves 24 (kernel SVM, 300
    rows) and 21 (logistic regression) a draw and Figure 9's sizes 39 a draw, so ten draws
    840; the faces 30.  About 2,700 CPU seconds: **about 24 minutes on two quiet cores**
    (``--jobs 2``), twice that on the shared machine.  What is less than the paper's: INLP
    beyond d = 100 on one split (it fits d - k classifiers); the kernel SVM's trade-off curves
    on 300 training rows of each draw (ExponentiatedGradient refits it about 50 times per
    point, n^2 each); Figure 9 stops at the 1,582 rows of a Lee et al. split.  Every table,
    figure and CSV row says over how many splits its means are.
    """
    if quick:
        return Config(True, classifier_splits=1, mlp_max_iter=200,
                      synth_dims=(20, 60), synth_splits=1, synth_big_d=10**9,
                      synth_big_splits=1, pca_s_max_d=10**9, inlp_max_d=60, inlp_splits=1,
                      synth_ks=(2, 5), tradeoff_runs=1, tradeoff_svm_runs=1, logreg_train_n=200,
                      svm_train_n=150, train_sizes=(100,),
                      faces_n=400, faces_size=16, faces_k=20)
    return Config(False, classifier_splits=10, mlp_max_iter=10_000,
                  synth_dims=(20, 50, 100, 200, 400, 800, 1600, 3200, 6400, 12800),
                  synth_splits=10, synth_big_d=10**9, synth_big_splits=10, pca_s_max_d=6400,
                  inlp_max_d=800, inlp_splits=1, synth_ks=(2, 5, 10, 20, 50, 90),
                  tradeoff_runs=10, tradeoff_svm_runs=10, logreg_train_n=None, svm_train_n=300,
                  train_sizes=(200, 800, 1582), faces_n=2000, faces_size=48, faces_k=400)
