"""Dense numpy implementation of the paper's algorithms, written from the text, as the oracle.

Kleindessner et al. (2023): Alg. 1/2 (explicit nullspace basis R of Z^T X, eigenvectors of
R^T X^T X R, U = R Lambda) and Sec. 3.5 (stack the attributes' centred one-hot matrices).
Deliberately naive: n x d data in memory, explicit R, full eigh.
"""

import numpy as np
import scipy.linalg


def centred_onehot(labels):
    labels = np.asarray(labels)
    cats = np.unique(labels)
    Z = (labels[:, None] == cats[None, :]).astype(float)
    return Z - Z.mean(axis=0)


def fair_pca(X, groups, k, center=True, standardize=False):
    """U (d, k) of Alg. 2 with Z_comb of Sec. 3.5; groups is a list of label vectors."""
    X = np.asarray(X, dtype=float)
    if center:
        X = X - X.mean(axis=0)
    if standardize:
        s = X.std(axis=0, ddof=1)
        s[s == 0] = 1
        X = X / s
    Z = np.concatenate([centred_onehot(g) for g in groups], axis=1)
    R = scipy.linalg.null_space(Z.T @ X)
    w, L = np.linalg.eigh(R.T @ X.T @ X @ R)
    return R @ L[:, np.argsort(w)[::-1][:k]]


def pca(X, k, center=True):
    X = np.asarray(X, dtype=float)
    if center:
        X = X - X.mean(axis=0)
    _, _, Vt = np.linalg.svd(X, full_matrices=False)
    return Vt[:k].T


def max_angle_deg(A, B):
    """Largest principal angle between span(A) and span(B) (columns), in degrees."""
    return float(np.degrees(scipy.linalg.subspace_angles(A, B).max()))


def make_data(n, d, groups_per_attr=(2,), seed=0, decay=0.85, shift=1.5, dtype=float):
    """Data with a decaying spectrum (clear eigen-gaps) and group-dependent means."""
    rng = np.random.default_rng(seed)
    scales = decay ** np.arange(d) * 3 + 0.05 * rng.random(d)
    basis = np.linalg.qr(rng.normal(size=(d, d)))[0]
    X = (rng.normal(size=(n, d)) * scales) @ basis.T + rng.normal(size=d) * 5
    groups = []
    for m in groups_per_attr:
        g = rng.integers(0, m, n)
        g[:m] = np.arange(m)  # every group present
        X += rng.normal(size=(m, d))[g] * shift
        groups.append(g)
    return X.astype(dtype), groups


def fair_pca_s(X, z, k, l, center=True):
    """Sec. 3.6 for two groups: l smallest-|eigenvalue| eigenvectors of R^T (S0 - S1) R."""
    X = np.asarray(X, dtype=float)
    if center:
        X = X - X.mean(axis=0)
    R = scipy.linalg.null_space(centred_onehot(z).T @ X)
    cats = np.unique(z)
    T = R.T @ (np.cov(X[z == cats[0]].T) - np.cov(X[z == cats[1]].T)) @ R
    w, E = np.linalg.eigh(T)
    E = E[:, np.argsort(np.abs(w))[:l]]
    w2, V = np.linalg.eigh(E.T @ R.T @ X.T @ X @ R @ E)
    return R @ E @ V[:, np.argsort(w2)[::-1][:k]]


def rbf_kernel(X, gamma):
    """exp(-gamma |x - y|^2) of the rows of X, densely (differences, no dot-product trick)."""
    X = np.asarray(X, dtype=float)
    X = X - X.mean(axis=0)
    return np.exp(-gamma * ((X[:, None, :] - X[None, :, :]) ** 2).sum(-1))


def fair_kernel_pca(K, groups, k):
    """Training representation (n, k) of fair kernel PCA (Alg. 3 with Z_comb, Sec. 3.5) for
    the kernel matrix K: centred Kc = H K H, R = nullspace of Z^T Kc, then the generalised
    problem (R^T Kc Kc R, R^T Kc R) restricted to the range of R^T Kc R (singular for a
    centred kernel, see dfairpca.decomposition.kernel)."""
    n = len(K)
    H = np.eye(n) - 1.0 / n
    Kc = H @ K @ H
    Z = np.concatenate([centred_onehot(g) for g in groups], axis=1)
    R = scipy.linalg.null_space(Z.T @ Kc)
    A = R.T @ Kc @ Kc @ R
    B = R.T @ Kc @ R
    b, V = np.linalg.eigh(B)
    live = b > 1e-12 * b.max()
    Vr = V[:, live] / np.sqrt(b[live])
    _, L = np.linalg.eigh(Vr.T @ A @ Vr)
    return Kc @ R @ (Vr @ L[:, ::-1][:, :k])


# ----------------------------------------------------------------------------- weighted rows
def weighted_moments(X, w):
    """(total weight, mean, scatter ``sum w (x - m)(x - m)^T``) of rows of frequency weights w."""
    X, w = np.asarray(X, dtype=float), np.asarray(w, dtype=float)
    W = w.sum()
    mean = w @ X / W
    Xc = X - mean
    return W, mean, (Xc * w[:, None]).T @ Xc


def weighted_pca(X, w, k):
    """U (d, k): top-k eigenvectors of the weighted scatter."""
    _, _, S = weighted_moments(X, w)
    vals, V = np.linalg.eigh(S)
    return V[:, np.argsort(vals)[::-1][:k]]


def weighted_fair_pca(X, groups, w, k):
    """U (d, k): top-k eigenvectors of the weighted scatter on the nullspace of the weighted
    group-mean differences (every group of positive weight minus the weighted mean)."""
    X, w = np.asarray(X, dtype=float), np.asarray(w, dtype=float)
    _, mean, S = weighted_moments(X, w)
    rows = []
    for g in groups:
        g = np.asarray(g)
        for c in np.unique(g[w > 0]):
            sel = (g == c) & (w > 0)
            rows.append(w[sel] @ X[sel] / w[sel].sum() - mean)
    R = scipy.linalg.null_space(np.array(rows))
    vals, L = np.linalg.eigh(R.T @ S @ R)
    return R @ L[:, np.argsort(vals)[::-1][:k]]


def leace(X, groups, w=None, method="leace", rtol=None):
    """The eraser ``x -> x - (x - mu) E`` of LEACE's closed form (Belrose et al. 2023,
    Thm. 4.3), written from the text with dense n x d arrays: Sigma and Sigma_XZ from the
    centred rows and one-hot indicators of every attribute (frequency weights w), W =
    Sigma^(-1/2) on the eigenvalues above rtol (default d eps) times the largest, P the
    projection onto col(W Sigma_XZ); ``method="orth"``: W = I.  Returns (mu, E), E (d, d)."""
    X = np.asarray(X, dtype=float)
    n, d = X.shape
    w = np.ones(n) if w is None else np.asarray(w, dtype=float)
    mu = w @ X / w.sum()
    Xc = X - mu
    Z = np.concatenate([(np.asarray(g)[:, None] == np.unique(g)[None, :]).astype(float)
                        for g in groups], axis=1)
    Zc = Z - w @ Z / w.sum()
    sigma = (Xc * w[:, None]).T @ Xc / (w.sum() - 1)
    sigma_xz = (Xc * w[:, None]).T @ Zc / (w.sum() - 1)
    if method == "leace":
        lam, V = np.linalg.eigh(sigma)
        keep = lam > (d * np.finfo(float).eps if rtol is None else rtol) * lam[-1]
        W = V[:, keep] @ np.diag(lam[keep] ** -0.5) @ V[:, keep].T
        W_pinv = V[:, keep] @ np.diag(lam[keep] ** 0.5) @ V[:, keep].T
    else:
        W = W_pinv = np.eye(d)
    u, s, _ = np.linalg.svd(W @ sigma_xz, full_matrices=False)
    U = u[:, s > s[0] * 1e-10]
    return mu, (W_pinv @ U @ U.T @ W).T


def leace_full_rank(X, groups):
    """LEACE's closed form (Belrose et al. 2023, Thm. 4.3) with nothing thresholded: Sigma
    full rank, W = Sigma^(-1/2) on all of it, and Sigma_XZ from m - 1 centred indicators
    per attribute of m groups (the m-th is minus their sum after centring, so it adds no
    direction): W Sigma_XZ then has full column rank and P is the projection onto all of
    its columns.  Returns (mu, E): the eraser ``x -> x - (x - mu) E``."""
    X = np.asarray(X, dtype=float)
    mu = X.mean(axis=0)
    Xc = X - mu
    Z = np.concatenate([centred_onehot(g)[:, :-1] for g in groups], axis=1)
    sigma = Xc.T @ Xc / (len(X) - 1)
    sigma_xz = Xc.T @ Z / (len(X) - 1)
    lam, V = np.linalg.eigh(sigma)
    assert lam[0] > 0, "the oracle needs a full-rank covariance"
    W = (V * lam ** -0.5) @ V.T
    W_pinv = (V * lam ** 0.5) @ V.T
    U = np.linalg.qr(W @ sigma_xz)[0]
    return mu, (W_pinv @ U @ U.T @ W).T
