"""Matrix-free randomized PCA and fair PCA: block Krylov passes over chunked X, never d x d.

The exact solve accumulates the d x d scatter S in one pass (n d^2 flops, 8 d^2 bytes: 108 GB
at d = 116,412).  Here S is only ever applied to a thin block V (d x w, w = k + oversamples):
per chunk of rows, ``A^T (A V)`` with A the rows minus a shift, in the compute dtype and
added to float64 sums, 4 n d w flops per pass.  A worker holds one d x w block, its
threads' running sums of the same size and the chunks at hand; the client the Krylov basis,
d x w per pass (float64: 140 MB at d = 116,412, w = 60 and 4 passes); neither depends on n.

Fair PCA is the top-k eigenspace of ``M = P S P`` with ``P = I - Q Q^T`` and Q (d x r) an
orthonormal basis of the group-mean deviations
(:meth:`dfairpca.solve._fairness.FairnessConstraint.basis`, the exact solve's basis).  P is applied exactly to every block, so the components are
orthogonal to Q to rounding however far the iteration has converged: the fit passes the
exact solve's certificate (:func:`dfairpca.solve._fairness.constraint_violation`).

The passes (:mod:`dfairpca.engine._thin_pass`): the first reads the first-order statistics
(n, column sums and squares, per group of every attribute its count and sum, the numeric
attributes' cross sums) and, in the same read, ``S Omega`` for a Gaussian Omega: the start
block.  Each further pass applies M to the newest block of a block Krylov space (Musco &
Musco, NeurIPS 2015); the blocks are kept orthonormal to each other and Rayleigh-Ritz on all
of them gives the components and, exactly, the variance each captures.  A block Krylov
space of q blocks holds the subspace iteration's ``M^q Omega`` and every lower power, and
its captured variance converges much faster per pass (benchmarks/bench_randomized.py).
"""

from __future__ import annotations

import dataclasses
import numbers
from dataclasses import dataclass

import numpy as np

from ..base._params import is_int
from ._exact import check_variance, standard_scale
from ._krylov import Krylov, ritz_components
from ._limits import check_features, check_rows, too_large
from ._fairness import by_attribute, constraint_of, constraint_violation
from ._restricted import Nullspace
from ..engine._thin_pass import (
    Plan, as_rows, corrected, first_pass, restore_statistics, run_thin_pass,
    statistics_state,
)
from ..engine._failures import CLUSTER_FAILURES
from ..io import StoreTimeout
from ..stats.moments import Moments
from ..errors import InvalidInputError
from ..inputs._weights import too_few_samples
from ..stats._exact import compute_dtype_for
from ..engine._checkpoint_files import array_digest, check_digests, checkpoint_path, open_state, save_state
from ..engine.checkpoint import chunked, job_fingerprint

# Deferred imports: package modules that load such libraries, or this module, at import are imported
# in the functions that use them, so that importing this module stays light.

__all__ = ["RandomizedFit", "fit_randomized", "resolve_iterated_power", "N_OVERSAMPLES", "AUTO_RTOL"]

#: scikit-learn's default oversampling: the block has k + 10 columns
N_OVERSAMPLES = 10
#: ``iterated_power="auto"`` stops after the first pass whose Ritz residuals estimate the
#: captured variance still missing at most this share of it (:mod:`dfairpca.solve._krylov`): the target
#: is a randomized fit whose captured variance is within 1e-4 (relative) of the exact
#: solver's, so it can stand in for an exact fit, in as few passes over the data as reach
#: that.  The estimate is pessimistic where measured:
#: on the synthetic CelebA at k = 50 it was 1.4 to 18 times the true gap (4.3e-3, 2.1e-4,
#: 4.1e-6, 2.1e-8 after 2 to 5 passes), so a fit that stops is well inside it.
AUTO_RTOL = 1e-4
def resolve_iterated_power(iterated_power, k: int, n: int, d: int) -> int:
    """Power iterations of a fit: an int as given; "auto" scikit-learn's rule, 7 if
    ``k < 0.1 min(n, d)`` and 4 otherwise (there the most; a fit stops earlier once it
    has converged, see :data:`AUTO_RTOL`)."""
    if iterated_power == "auto":
        return 7 if k < 0.1 * min(n, d) else 4
    return int(iterated_power)


def _random_block(random_state, shape) -> np.ndarray:
    """A standard normal block from an int (a RandomState, as scikit-learn seeds it), a
    RandomState or a Generator.  None is the seed 0, not numpy's global generator as in
    scikit-learn: two fits of the same data give identical components, also when
    ``svd_solver="auto"`` chose this solve for the user."""
    if random_state is None:
        random_state = 0
    if is_int(random_state):
        random_state = np.random.RandomState(int(random_state))
    return random_state.standard_normal(shape)


# ----------------------------------------------------------------------------- the fit
@dataclass
class RandomizedFit:
    """What :func:`fit_randomized` found; variances in the operator's units.

    ``captured`` and ``total`` are ``u^T S u`` and ``trace S`` of the operator S (scatter
    about the mean, or ``X^T X`` without centring, standardised when asked), stored as
    ``true * 4**-exponent`` (0 when standardised); ``violation`` holds, per attribute, the
    share ``|U v| / |v|`` of every constraint vector that the components keep (the exact
    fit's certificate, :func:`dfairpca.solve._fairness.constraint_violation`).  ``history`` is the
    captured variance after each pass but the first, ``missing`` the share of the optimum
    still missing then, as estimated from the Ritz residuals (``iterated_power="auto"``
    stops on it).
    """

    components: np.ndarray
    captured: np.ndarray
    total: float
    exponent: int
    mean: np.ndarray
    scale: np.ndarray | None
    statistics: Moments
    constraints: np.ndarray
    basis: np.ndarray
    violation: list
    passes: int
    history: list
    missing: list
    standard_components: np.ndarray | None = None
    standard_captured: np.ndarray | None = None

    @property
    def explained_variance(self) -> np.ndarray:
        """Variance along each component (ddof=1), true units."""
        with np.errstate(over="ignore", under="ignore"):
            return np.ldexp(self.captured / (self.statistics.n - 1), 2 * self.exponent)


def _check(k, n_oversamples, iterated_power) -> None:
    """The arguments of a direct call (the estimators validated theirs already)."""
    if not (is_int(k) and k >= 1):
        raise InvalidInputError(f"svd_solver='randomized' needs n_components as an integer >= 1; got "
                                f"{k!r} (a fraction of the variance needs the whole spectrum: use "
                                "svd_solver='full')")
    if not (is_int(n_oversamples) and n_oversamples >= 1):
        raise InvalidInputError(f"n_oversamples must be an integer >= 1; got {n_oversamples!r}")
    p = iterated_power
    if not (p == "auto" if isinstance(p, str) else is_int(p) and p >= 0):
        raise InvalidInputError(f"iterated_power must be 'auto' or an integer >= 0; got {p!r}")


def fit_randomized(X, k, *, codes=None, categories=(), names=None, mask=None, numeric=(),
                   constraint: str | None = None, standard: bool = False, center: bool = True,
                   standardize: bool = False,
                   dtype=None, n_oversamples: int = N_OVERSAMPLES, iterated_power="auto",
                   random_state=None, split_every: int = 8, progress: bool = False,
                   checkpoint=None, resume: bool = True, on_pass=None) -> RandomizedFit:
    """Top-k (fair) principal components of X by block Krylov passes; never forms d x d.

    Parameters
    ----------
    X : (n, D) numpy, Zarr or Dask array ((n, h, w) numpy is flattened per chunk)
    k : int
    codes, categories : (n, p) group codes and their labels per attribute
        (:func:`dfairpca.inputs._validation.encode_groups`); none: no group constraint.
    names : names of the p attributes, then of the numeric ones (for warnings and errors)
    mask : (n,) bool, the rows to fit (equal opportunity: y == 1)
    constraint : str, optional
        The fairness notion whose constraint rows are fitted
        (:func:`dfairpca.solve._fairness.constraint_of`; None: demographic parity); its
        row mask is ``mask``, applied by the passes.
    numeric : columns of X that are numeric protected attributes: the components are
        made uncorrelated with them and leave them out (``sensitive_feature_ids``)
    standard : also the standard PCA components of the same operator, from the same
        passes (FairPCA's ``tradeoff``)
    center, standardize : as the estimators'
    dtype : of the per-chunk products (default: float64 for float64 and wide integer X,
        float32 otherwise); the sums are float64 whatever it is
    n_oversamples, iterated_power, random_state : scikit-learn's meanings: the blocks have
        ``k + n_oversamples`` columns, a fit makes ``iterated_power + 2`` passes over X
        (the first also computes the statistics; the Krylov space then holds the powers up
        to ``iterated_power + 1``, the subspace scikit-learn's ``n_iter`` reaches), and
        "auto" stops once converged (:func:`resolve_iterated_power`)
    split_every, progress : as the exact pass's
    checkpoint : path, optional
        A directory where the fit saves its state after every pass (the first-order
        statistics, the Krylov blocks and their Rayleigh quotients, the digests of X's
        row chunks; about ``8 d (k + p)`` bytes per pass), atomically.  Run again with the
        same arguments, an interrupted fit goes on at the next pass, after the first read
        of X has shown that its chunks are those the checkpoint was made from
        (:class:`~dfairpca.engine.checkpoint.CheckpointMismatch` otherwise); its result is an
        uninterrupted fit's.  Ctrl-C raises :class:`~dfairpca.engine.checkpoint.PassInterrupted`.
    resume : bool, default True
        Continue from ``checkpoint`` if it holds this fit; False starts over.
    on_pass : callable, optional
        ``on_pass(passes_done, most_passes)`` after every pass (and its checkpoint).

    Each pass runs on the active ``distributed.Client`` when there is one.
    """
    _check(k, n_oversamples, iterated_power)
    X = as_rows(X)
    D = int(np.prod(X.shape[1:]))
    numeric = np.asarray(numeric, np.intp)
    keep = np.setdiff1d(np.arange(D), numeric)
    d = len(keep)
    check_features(k, d)
    dtype = compute_dtype_for(X.dtype) if dtype is None else np.dtype(dtype)
    omega = _random_block(random_state, (d, min(d, k + n_oversamples)))
    ck = None
    if checkpoint is not None:
        X = chunked(X)
        ck = _Checkpoint(checkpoint, X, _fingerprint(
            X, codes, categories, mask, dtype, omega, k=k, n_oversamples=n_oversamples,
            iterated_power=iterated_power, numeric=numeric, center=center,
            standardize=standardize, standard=standard), resume)
    try:
        return _fit(X, k, d, keep, codes, categories, names, mask, numeric, constraint_of(constraint),
                    standard, center, standardize, dtype, omega, iterated_power, split_every,
                    progress, ck, on_pass)
    except (KeyboardInterrupt, *CLUSTER_FAILURES, StoreTimeout) as exc:
        if ck is None:
            raise
        from ..engine._checkpoint_files import saved_state_meta
        from ..engine.checkpoint import PassInterrupted

        saved = saved_state_meta(ck.path)  # what an interrupt reports is what is on disk
        most = saved.get("most", resolve_iterated_power(iterated_power, k, X.shape[0], d) + 2)
        stopped = PassInterrupted(ck.path, int(saved.get("passes", 0)), int(most),
                                  unit="passes at most")
        if isinstance(exc, (*CLUSTER_FAILURES, StoreTimeout)):
            raise exc.saved(ck.path, stopped.progress) from None
        raise stopped from None


def _fit(X, k, d, keep, codes, categories, names, mask, numeric, constraint, standard, center,
         standardize,
         dtype, omega, iterated_power, split_every, progress, ck, on_pass) -> RandomizedFit:
    """:func:`fit_randomized` once its arguments are checked (``ck``: its checkpoint)."""
    p = len(categories)
    names = list(names) if names is not None else (
        [f"attribute {j}" for j in range(p + len(numeric))] if p + len(numeric) > 1 else ["groups"])
    saved = None if ck is None else ck.saved
    if saved is None:  # pass 1: the statistics and S Omega
        full, off, plan, sums = first_pass(X, omega, codes, categories, mask, numeric, dtype,
                                           split_every, progress, digest=ck is not None)
        _check_statistics(full, k, d)
        passes = 1
    else:
        full, off, plan = restore_statistics(saved, categories, numeric, dtype)
        passes = int(saved["meta"]["passes"])
    n = full.n
    most = resolve_iterated_power(iterated_power, k, n, d) + 2  # passes, at most
    m = full.columns(keep) if len(numeric) else full

    # the fitted space: standardisation and the constraint basis
    sd, scale = (standard_scale(m.n, m.mean, m.scatter_diagonal, m.scatter_exponent)
                 if standardize else (None, None))
    diagonal = _diagonal(m, sd, off, plan, center)
    total = float(diagonal.sum())
    mu = np.ldexp(m.mean, -m.scatter_exponent) if center else np.zeros(len(m.mean))
    check_variance(diagonal, n, mu if sd is None else mu / sd, m.rows)  # before the other passes
    # the exact fit's rules on the same first-order fields (what Moments without a scatter holds)
    problem = full.problem(complete=False)
    C = constraint.rows(problem, names, scale)
    null = Nullspace(constraint.basis(C))
    Q, r = null.Q, null.rank
    if k > d - r:
        raise too_large(k, f"the {r} constraint directions leave {d - r} dimensions; the largest "
                           f"k is {d - r}")

    project = null.project

    def scaled(A):
        return A if sd is None else A / sd[:, None]

    def operator(G, V):
        """The operator's image from one pass's sums of V (scaled on the way in)."""
        return scaled(corrected(G, V, m, off, plan, center))

    def unprojected(A):
        return A

    if saved is None:
        W = operator(sums.G, omega)  # D^-1 S Omega: a start block (S sees no D^-1 on the way in)
        fair = Krylov(W, project, k)
        std = Krylov(W, unprojected, k) if standard and r else None
    else:
        try:
            fair = Krylov.restore(saved["arrays"], "fair", project, k, d)
            std = Krylov.restore(saved["arrays"], "std", unprojected, k, d) if standard and r else None
        except KeyError as exc:
            from ..io import SavedFileError
            from ..io import RESAVE_HINT

            raise SavedFileError(f"cannot load checkpoint {saved['path']!r}: its state lacks "
                                 f"{exc}{RESAVE_HINT}") from None
    spaces = [s for s in (fair, std) if s is not None]
    if saved is None:
        _after_pass(ck, sums, full, off, plan, fair, std, passes, most, on_pass)
    later = dataclasses.replace(plan, groups=(), first=False)
    while passes < most and not (iterated_power == "auto" and all(
            s.missing and s.missing[-1] <= AUTO_RTOL for s in spaces)):
        live = [s for s in spaces if s.pending is not None]
        if not live:
            break  # every space is invariant: the answer is exact
        V = np.hstack([s.block for s in live])
        Vin = scaled(V)
        bind = ck is not None and not ck.bound  # a resumed fit's first read checks the data
        sums = run_thin_pass(X, dataclasses.replace(later, digest=bind), Vin, None, mask,
                        split_every, progress)
        if bind:
            ck.bind(sums.digests)
        passes += 1
        Wall = operator(sums.G, Vin)
        at = 0
        for s in live:
            w = s.block.shape[1]
            s.extend(s.proj(Wall[:, at : at + w]))
            at += w
        _after_pass(ck, None, full, off, plan, fair, std, passes, most, on_pass)
    if ck is not None and not ck.bound:  # resumed with no pass left: still only this data
        ck.bind(run_thin_pass(X, dataclasses.replace(later, digest=True), None, None, None,
                         split_every, progress).digests)

    captured, U = ritz_components(fair, k, project)
    per = by_attribute(constraint_violation(U, C), problem) if len(C) else []
    out = RandomizedFit(U, captured, total, 0 if standardize else plan.exponent, m.mean, scale, full, C, Q,
                        per, passes, list(fair.history), list(fair.missing))
    if standard:
        if std is None:  # no constraint: standard PCA is the fair one
            out.standard_components, out.standard_captured = U.copy(), captured.copy()
        else:
            out.standard_captured, out.standard_components = ritz_components(std, k, lambda A: A)
    return out


def _check_statistics(full: Moments, k: int, d: int) -> None:
    """The first pass's refusals: non-finite rows, overflow, too few rows for k."""
    full.check_finite()
    n = full.n
    if not np.all(np.isfinite(full.mean)) or not np.all(np.isfinite(full.scatter_diagonal)):
        from ..stats._chunk import OVERFLOW_MESSAGE

        raise InvalidInputError(OVERFLOW_MESSAGE)
    if n < 2:
        raise InvalidInputError(too_few_samples(n, full.n_rows))
    check_rows(k, n, int(min(n, d)))


# ----------------------------------------------------------------------------- checkpoints
class _Checkpoint:
    """A fit's checkpoint: where, for which job, what it holds, and the chunks it binds.

    ``bound`` is False while a resumed fit has not yet read X: its first pass computes the
    chunks' digests and :meth:`bind` refuses data other than the checkpoint's.
    """

    def __init__(self, path, X, fingerprint: dict, resume: bool):
        self.path, self.fingerprint = checkpoint_path(path), fingerprint
        self.saved = open_state(self.path, X, fingerprint, "randomized", resume)
        self.digests = None if self.saved is None else self.saved["digests"]
        self.bound = self.saved is None
        #: passes of the last save on disk (what a failed save leaves)
        self.kept = 0 if self.saved is None else int(self.saved["meta"].get("passes", 0))

    def bind(self, read: list) -> None:
        """Take (a fresh fit) or check (a resumed one) the digests of the chunks just read."""
        if self.digests is None:
            self.digests = [h for _, _, h in sorted(read)]
        else:
            check_digests(self.path, self.digests, read)
        self.bound = True

    def save(self, meta: dict, arrays: dict) -> None:
        assert self.digests is not None  # bound by the first pass, before any save
        try:
            save_state(self.path, self.fingerprint, "randomized", meta, arrays, self.digests)
        except OSError as exc:
            from ..io import disk_full, is_disk_full

            if not is_disk_full(exc):
                raise
            # the new save is written whole beside the last one before it replaces it
            kept = (f"the unfinished save was removed, the checkpoint keeps its last save "
                    f"({self.kept} of at most {meta['most']} passes): free space there, then resume "
                    "from it"
                    if self.kept else "the unfinished save was removed, nothing was saved before "
                    "it: free space there or choose a checkpoint on another disk")
            raise disk_full(self.path, "the checkpoint", kept, cause=exc,
                            needed=sum(np.asarray(v).nbytes for v in arrays.values())) from None
        self.kept = int(meta["passes"])


def _after_pass(ck, sums, full, off, plan, fair, std, passes, most, on_pass) -> None:
    """Bind (first pass) and save the checkpoint, then tell ``on_pass``."""
    if ck is not None:
        if sums is not None:
            ck.bind(sums.digests)
        meta, arrays = statistics_state(full, off, plan)
        for name, space in (("fair", fair), ("std", std)):
            if space is not None:
                arrays.update(space.state(name))
        ck.save({**meta, "passes": passes, "most": most}, arrays)
    if on_pass is not None:
        on_pass(passes, most)


def _fingerprint(X, codes, categories, mask, dtype, omega, **options) -> dict:
    """What a randomized fit's checkpoint is for: the pass's job (X's shape, chunks and
    stores, the groups, the mask, the compute dtype), the options that change the result
    and the start block itself (whatever random_state drew it)."""
    fp = job_fingerprint(X, codes, categories, mask, dtype=dtype)
    for key, v in options.items():
        fp[key] = [int(i) for i in v] if isinstance(v, np.ndarray) else (
            v if isinstance(v, str) else int(v) if isinstance(v, numbers.Integral) else str(v))
    fp["start_block"] = array_digest(omega)
    return fp


def _diagonal(m: Moments, sd, off, plan: Plan, center: bool) -> np.ndarray:
    """The operator's diagonal (its trace is the total variance the ratios refer to)."""
    diag = m.scatter_diagonal.copy()
    if not center:
        f = slice(None) if plan.features is None else plan.features
        mu = np.ldexp(plan.shift[f], -plan.exponent) + off[f]
        diag += m.n * mu * mu
    if sd is not None:
        diag /= sd * sd
    return diag
