"""INLP, Iterative Nullspace Projection (Ravfogel, Elazar, Gonen, Twiton & Goldberg, ACL 2020).

Written from the paper (no package ships it): train a linear classifier to predict the
protected attribute, remove the direction of its weights from the data, repeat on what is
left.  After r rounds the data lives in the orthogonal complement of r directions; the
representation of dimension k is that complement when r = d - k, as in the fair-PCA paper's
use of it (Kleindessner et al. took the top-k eigenvectors of INLP's projection).  The
classifier is the one the fair-PCA paper configured: scikit-learn's ``LinearSVC`` without an
intercept, primal solver.
"""

from __future__ import annotations

import numpy as np

# Deferred imports: scipy, sklearn (heavy or optional) are imported in the functions that use them,
# so that importing this module stays light.


def inlp_directions(X, z, n_directions: int, random_state: int = 0) -> np.ndarray:
    """The (r, d) orthonormal directions INLP removes, r <= ``n_directions``.

    It stops early when a classifier's weights lie in the span already removed (nothing
    linear is left to find).  Each round projects the data once (a rank-one update, O(nd)),
    where the original code multiplies by the d x d projection.
    """
    from sklearn.svm import LinearSVC

    Xc = np.array(X, dtype=np.float64, copy=True)
    z = np.asarray(z)
    W = np.zeros((0, Xc.shape[1]))
    for _ in range(n_directions):
        clf = LinearSVC(fit_intercept=False, dual=False, random_state=random_state).fit(Xc, z)
        w = clf.coef_.reshape(-1)
        w = w - W.T @ (W @ w)  # already orthogonal up to rounding: Xc has no such part
        norm = np.linalg.norm(w)
        if norm < 1e-12 * max(1.0, float(np.linalg.norm(clf.coef_))):
            break
        w /= norm
        W = np.vstack([W, w])
        Xc -= np.outer(Xc @ w, w)
    return W


def inlp_components(X, z, k: int, random_state: int = 0) -> np.ndarray:
    """(k, d) orthonormal rows spanning what INLP keeps after removing d - k directions."""
    from scipy.linalg import null_space

    d = np.asarray(X).shape[1]
    W = inlp_directions(X, z, d - k, random_state)
    keep = null_space(W) if len(W) else np.eye(d)  # (d, d - r), r = rows removed
    return keep[:, :k].T
