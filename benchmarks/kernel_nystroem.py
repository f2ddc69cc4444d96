"""Exact fair kernel PCA against its Nyström approximation on synthetic CelebA faces.

Data: a synthetic CelebA store (:func:`dfairpca.celeba.synth_celeba`, 20 x 20 grey faces,
d = 400) of ``n + n_test`` images; the first n are the training set, the rest the test set.
Protected attribute "Eyeglasses", downstream label "Smiling".  Every method is fitted on the
n training images with the same k, rbf kernel and gamma = 1 / (d Var(X_train)) (App. C.1).

Measures (the exact kernel K of the training images is formed once for the first two):

* kernel-space explained variance: ``||Y_c||_F^2 / trace(Kc)``, Y_c the fair k-dimensional
  training representation centred over the training rows and Kc the centred exact kernel.
  For exact fair kernel PCA this is ``trace(B^T Kc Kc B) / trace(Kc)``; the Nyström
  components are also orthonormal directions of the same feature space, so the number is
  the same quantity measured on the exact kernel.
* subspace agreement: mean cos^2 of the principal angles between the column spaces of the
  training representations of the method and of exact fair kernel PCA (1 = same subspace).
* group-mean gap: largest difference of the two groups' mean training representation,
  relative to the representation's largest entry (fairness constraint, ~1e-15 expected).
* a downstream rbf SVC (C = 1 / (2 n 0.00005) and gamma "scale", as the paper's App. C.1)
  trained on the training representation to predict "Smiling": accuracy and ΔDP
  (fairlearn's ``demographic_parity_difference``) on the test set.
* fit time: wall clock and CPU time of this process (all its threads), this machine;
  includes forming the kernels.  The CPU time is the steadier number on a shared machine.

    python benchmarks/kernel_nystroem.py [--n 5000] [--n-test 1250] [--k 50]
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import scipy.linalg
from sklearn.decomposition import KernelPCA
from fairlearn.metrics import demographic_parity_difference
from sklearn.metrics.pairwise import rbf_kernel
from sklearn.svm import SVC

from dfairpca.celeba import attribute_column, ensure_store, open_celeba
from dfairpca.decomposition.kernel import FairKernelPCA

RESULTS = Path(__file__).resolve().parent / "results" / "kernel_nystroem.md"
LANDMARKS = (100, 250, 500, 1000, 2000, 5000)


def load_faces(store: Path, n_total: int, size: int):
    """(X uint8 (n_total, size^2), eyeglasses, smiling), writing the store if missing."""
    images, _, _ = open_celeba(ensure_store(store, n_total, seed=0, size=size, progress=False))
    X = np.asarray(images[:]).reshape(n_total, -1)
    return X, attribute_column(store, "Eyeglasses"), attribute_column(store, "Smiling")


def subspace_agreement(A: np.ndarray, B: np.ndarray) -> float:
    """Mean cos^2 of the principal angles between the column spaces of A and B."""
    return float(np.mean(np.cos(scipy.linalg.subspace_angles(A, B)) ** 2))


def group_mean_gap(Y: np.ndarray, z: np.ndarray) -> float:
    means = np.stack([Y[z == c].mean(0) for c in np.unique(z)])
    return float(np.abs(means - means[0]).max() / np.abs(Y).max())


def evaluate(name, fit, Xtr, ztr, ytr, Xte, zte, yte, centred_trace, Y_exact):
    """One table row: fit, represent train and test, score."""
    t0, c0 = time.perf_counter(), time.process_time()
    model = fit()
    seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    Ytr, Yte = model.transform(Xtr), model.transform(Xte)
    Yc = Ytr - Ytr.mean(0)
    svc = SVC(C=1.0 / (2 * len(Xtr) * 0.00005), kernel="rbf", gamma="scale").fit(Ytr, ytr)
    pred = svc.predict(Yte)
    return {
        "method": name,
        "fit_s": seconds,
        "cpu_s": cpu,
        "ev": float((Yc**2).sum() / centred_trace),
        "agreement": 1.0 if Y_exact is None else subspace_agreement(Yc, Y_exact),
        "gap": group_mean_gap(Ytr, ztr),
        "acc": float((pred == yte).mean()),
        "ddp": demographic_parity_difference(yte, pred, sensitive_features=zte),
        "Y": Yc,
    }


def run(n: int, n_test: int, k: int, size: int, store: Path):
    load_before = os.getloadavg()[0]
    X, z, y = load_faces(store, n + n_test, size)
    Xtr, ztr, ytr = X[:n], z[:n], y[:n]
    Xte, zte, yte = X[n:], z[n:], y[n:]
    gamma = 1.0 / (Xtr.shape[1] * Xtr.astype(np.float64).var())
    K = rbf_kernel(Xtr.astype(np.float64), gamma=gamma)
    centred_trace = float(np.trace(K) - K.mean() * n)
    del K
    args = (Xtr, ztr, ytr, Xte, zte, yte, centred_trace)

    rows = []
    exact = evaluate("exact", lambda: FairKernelPCA(k).fit(Xtr, sensitive_features=ztr), *args, None)
    rows.append(exact)
    for m in LANDMARKS:
        if m > n:
            continue
        rows.append(evaluate(
            f"Nyström m={m}", lambda m=m: FairKernelPCA(k, n_landmarks=m).fit(Xtr, sensitive_features=ztr),
            *args, exact["Y"],
        ))
    unfair = evaluate(
        "kernel PCA (not fair)",
        lambda: KernelPCA(k, kernel="rbf", gamma=gamma).fit(Xtr.astype(np.float64)),
        *args, exact["Y"],
    )
    rows.append(unfair)
    raw = SVC(C=1.0 / (2 * n * 0.00005), kernel="rbf", gamma="scale").fit(Xtr / 255.0, ytr)
    raw_pred = raw.predict(Xte / 255.0)
    return rows, {
        "n": n, "n_test": n_test, "k": k, "size": size, "gamma": gamma,
        "glasses_train": int(ztr.sum()), "smiling_train": int(ytr.sum()),
        "raw_acc": float((raw_pred == yte).mean()), "raw_ddp": demographic_parity_difference(yte, raw_pred, sensitive_features=zte),
        "majority": float(max(yte.mean(), 1 - yte.mean())),
        "ddp_se": delta_dp_noise(zte), "load": (load_before, os.getloadavg()[0]),
    }


def delta_dp_noise(z: np.ndarray) -> float:
    """Standard error of a ΔDP estimate from these test groups when the rates are 1/2."""
    n1, n0 = int(z.sum()), int(len(z) - z.sum())
    return float(np.sqrt(0.25 / n1 + 0.25 / n0))


def markdown(rows, info, command: str) -> str:
    accs = [100 * r["acc"] for r in rows]
    lines = [
        "# Exact fair kernel PCA vs Nyström (synthetic CelebA)",
        "",
        f"Produced by `{command}` on {platform.machine()} with {os.cpu_count()} CPUs "
        f"(Python {platform.python_version()}); 1-minute load average {info['load'][0]:.1f} "
        f"before and {info['load'][1]:.1f} after the run"
        + (" (other processes competed for the CPUs, so wall times are inflated; CPU times "
           "are steadier)." if max(info["load"]) > os.cpu_count() else "."),
        "",
        f"n = {info['n']} training and {info['n_test']} test images of "
        f"{info['size']} x {info['size']} pixels (synthetic CelebA, seed 0); protected "
        f"attribute Eyeglasses ({info['glasses_train']} of the training images), label "
        f"Smiling ({info['smiling_train']}); k = {info['k']}, rbf kernel, gamma = "
        f"1 / (d Var) = {info['gamma']:.3g}.  Definitions of the columns in the docstring of "
        "`benchmarks/kernel_nystroem.py`: EV = share of the exact centred kernel's trace "
        "captured by the training representation; agreement = mean cos² of the principal "
        "angles to the exact fair representation; gap = largest group-mean difference of "
        "the training representation (relative); SVC = rbf SVM on the representation, "
        "test accuracy and ΔDP.  The kernel PCA row is unconstrained (scikit-learn "
        "`KernelPCA`), for reference.",
        "",
        f"For scale: the same SVC on the raw pixels reaches {100 * info['raw_acc']:.2f}% "
        f"(ΔDP {info['raw_ddp']:.3f}), the k-dimensional representations "
        f"{min(accs):.2f}–{max(accs):.2f}%, against {100 * info['majority']:.2f}% for always "
        "predicting the majority class.  A ΔDP measured on this test set has a standard "
        f"error of about {info['ddp_se']:.3f} (rates near 1/2): ΔDP differences between rows "
        "of that size are noise.  The approximation itself is read from EV and agreement "
        "against m, and the fairness constraint from the gap (rounding level when it holds).",
        "",
        "| method | wall (s) | CPU (s) | EV (%) | agreement | gap | SVC acc (%) | SVC ΔDP |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['method']} | {r['fit_s']:.2f} | {r['cpu_s']:.2f} | {100 * r['ev']:.2f} "
            f"| {r['agreement']:.4f} "
            f"| {r['gap']:.1e} | {100 * r['acc']:.2f} | {r['ddp']:.3f} |"
        )
    return "\n".join(lines) + "\n"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=5000, help="training images")
    p.add_argument("--n-test", type=int, default=1250, help="test images")
    p.add_argument("--k", type=int, default=50, help="n_components")
    p.add_argument("--size", type=int, default=20, help="image side in pixels")
    p.add_argument("--store", type=Path, default=None,
                   help="synthetic CelebA store to use or create (default: a temporary one)")
    p.add_argument("--out", type=Path, default=RESULTS, help="markdown file to write")
    a = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        store = a.store or Path(tmp) / f"celeba{a.size}.zarr"
        rows, info = run(a.n, a.n_test, a.k, a.size, store)
    text = markdown(rows, info, " ".join(["python benchmarks/kernel_nystroem.py", *sys.argv[1:]]))
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
