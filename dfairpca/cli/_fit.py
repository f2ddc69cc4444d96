"""The commands that fit and use a model: ``fit``, ``transform``, ``show`` and ``demo``."""

from __future__ import annotations

import contextlib
import math
import sys
import time
from dataclasses import dataclass, fields
from pathlib import Path
import threading

import numpy as np

from ..base.progress import phase, progress_bar, reporting
from ._errors import CLIError, UsageError, _plain, arguments
from ._inputs import (_Data, _check_out, _client, _data, _describe_groups, _input_paths, _place,
                      _sample_weight, _sensitive, _storage, _target, _tuple, writing_alone)
from ..errors import DiskFullError
from ..base import cache_folder

# Deferred imports: pandas, zarr (heavy or optional) and package modules that load such libraries,
# or this module, at import are imported in the functions that use them, so that importing this
# module stays light.

#: the kind in dfairpca's marker of what ``transform`` writes: another kind than the data
#: stores of synth and ingest ("store"), so that ``transform --overwrite`` can never replace
#: a data set (an ingest of hours), nor synth one of its results
TRANSFORM_KIND = "transform output"


#: fit options only a fair method uses: --method pca would ignore them
FAIR_ONLY = ("attribute", "sensitive_array", "sensitive_csv", "sensitive_column", "constraint",
             "target", "target_array", "target_column", "target_csv", "tradeoff", "equalize")
#: fit options only the randomized solve uses: --svd-solver full would ignore them
RANDOMIZED_ONLY = ("n_oversamples", "iterated_power", "random_state")


#: seconds to wait for a scheduler to answer, then for its first worker
CLUSTER_TIMEOUT = 60


@dataclass(frozen=True)
class FitJob:
    """One ``dfairpca fit``: a field per option, each default the command line's own.

    :func:`run_fit` runs it; ``dfairpca fit`` builds it from its options
    (:meth:`from_args`) and ``dfairpca demo`` from its few.
    """

    store: str
    out: str
    k: int
    method: str = "fair"
    array: str | None = None
    missing_chunks: str = "error"
    attribute: tuple[str, ...] = ()
    sensitive_array: tuple[str, ...] = ()
    sensitive_csv: str | None = None
    sensitive_column: tuple[str, ...] = ()
    constraint: str = "demographic_parity"
    target: str | None = None
    target_array: str | None = None
    target_column: str | None = None
    target_csv: str | None = None
    sample_weight_array: str | None = None
    sample_weight_column: str | None = None
    sample_weight_csv: str | None = None
    tradeoff: float = 0.0
    equalize: float = 0.5
    svd_solver: str = "auto"
    compute_dtype: str = "auto"
    n_oversamples: int = 10
    iterated_power: str | int = "auto"
    random_state: int = 0
    statistics: bool = False
    checkpoint: str | None = None
    resume: bool = False
    rows_per_chunk: int | None = None
    overwrite: bool = False
    scheduler: str | None = None
    scheduler_file: str | None = None
    timeout: float = CLUSTER_TIMEOUT
    storage_options: str | None = None

    @classmethod
    def from_args(cls, args) -> "FitJob":
        """The job of parsed ``fit`` options (repeatable options as tuples)."""
        values = {f.name: getattr(args, f.name) for f in fields(cls)}
        return cls(**{k: _tuple(v) for k, v in values.items()})


def _check_method_options(args) -> None:
    """Refuse a fit option that ``--method`` would silently ignore.

    Only options the user gave count (a value other than the default), so that writing
    out a default, e.g. ``--constraint demographic_parity``, stays harmless.
    """
    defaults = {f.name: f.default for f in fields(FitJob)}
    given = [o for o in FAIR_ONLY if _tuple(getattr(args, o)) != defaults[o]]
    if args.method == "pca" and given:
        option = "--" + given[0].replace("_", "-")
        needs = "--method fair-s" if given[0] == "equalize" else "--method fair or fair-s"
        raise UsageError(
            f"{option} needs {needs}; --method pca (plain PCA, no protected attributes) would "
            f"ignore it: drop {option}, or choose a fair method"
        )
    odd = _randomized_options(args)
    exact = (f"--svd-solver {args.svd_solver} (the exact one-pass fit)"
             if args.svd_solver in ("full", "covariance_eigh") else
             "--method fair-s (Fair PCA-S needs the exact d x d solve)"
             if args.method == "fair-s" else None)
    if exact and odd:
        option = "--" + odd[0].replace("_", "-")
        fix = ("--svd-solver randomized or auto" if args.method != "fair-s" else
               "--method fair for a randomized fit")
        raise UsageError(f"{option} sets the randomized solve; {exact} would ignore it: drop "
                       f"{option}, or use {fix}")
    if args.method != "fair-s" and "equalize" in given:
        raise UsageError(
            "--equalize needs --method fair-s (fair PCA that also equalises the group "
            f"covariances); --method {args.method} would ignore it: add --method fair-s, or "
            "drop --equalize"
        )


def _randomized_options(args) -> list[str]:
    """The randomized solve's options the user set (a value other than the default)."""
    defaults = {f.name: f.default for f in fields(FitJob)}
    return [o for o in RANDOMIZED_ONLY if getattr(args, o) != defaults[o]]


def _check_statistics_saved(args, planned: str | None, d: int) -> None:
    """Refuse ``--statistics`` before the pass when the fit will be randomized
    (``planned``): its statistics have no d x d scatter to save, and the refusal would come
    after the fit."""
    if args.statistics and planned == "randomized":
        raise UsageError(f"--statistics saves the d x d statistics, which the randomized fit "
                         f"(d = {d:,}, k = {args.k}) does not form: drop --statistics, or pass "
                         "--svd-solver full")


def _note_unused_randomized(args, planned: str | None, d: int) -> None:
    """Say on stderr, before the pass, that ``--svd-solver auto`` chose the exact fit for
    this store's width, so that the randomized options given are not used (which solve
    auto takes needs d, known only once the store is open: hence a note, not an error)."""
    odd = _randomized_options(args)
    if args.svd_solver != "auto" or not odd:
        return
    if planned == "randomized":
        return
    given = ", ".join("--" + o.replace("_", "-") for o in odd)
    print(f"note: --svd-solver auto chose the exact one-pass fit for d = {d:,} and k = {args.k} "
          f"(its d x d statistics fit in memory and cost less), which does not use {given}: "
          f"pass --svd-solver randomized to fit with {'them' if len(odd) > 1 else 'it'}",
          file=sys.stderr)


def _check_two_groups(groups) -> None:
    """Refuse a protected attribute with one label in every row, naming the label plainly
    (the library's message shows numpy's repr and its Python fix)."""
    import pandas as pd

    for name in groups:
        labels = pd.unique(groups[name])
        if len(labels) == 1:
            raise UsageError(
                f"the protected attribute {name!r} has a single group ({_plain(labels[0])}) in "
                f"all {len(groups):,} rows; fair PCA needs two or more: name another attribute, "
                "or fit plain PCA with --method pca"
            )


# ----------------------------------------------------------------------------- the model
def _estimator(args):
    from .. import FairPCA, PCA

    # the fit's progress goes where the human lines go (stdout, or stderr with --json: see
    # main), redrawn in place on a terminal, in a few whole lines into a batch job's log
    progress = True
    solve = dict(svd_solver=args.svd_solver, n_oversamples=args.n_oversamples,
                 iterated_power=args.iterated_power, random_state=args.random_state,
                 compute_dtype=args.compute_dtype)
    if args.method == "pca":
        return PCA(args.k, progress=progress, **solve)
    eq = args.equalize if args.method == "fair-s" else None
    return FairPCA(
        args.k, constraint=args.constraint, tradeoff=args.tradeoff,
        equalize_covariance=eq, progress=progress, **solve,
    )



def _fit_summary(est, args, data: _Data, fit_seconds: float, wall_seconds: float) -> dict:
    """What ``fit --json`` prints: sizes, groups, variance kept, certificate, times, path."""
    summary = {
        "command": "fit", "n": int(data.X.shape[0]), "d": int(est.n_features_in_),
        "k": int(est.n_components_), "method": args.method, "estimator": type(est).__name__,
        "svd_solver": getattr(est, "fitted_svd_solver_", None),  # what "auto" chose
        "passes": int(getattr(est, "n_passes_", 1)),  # over X
        # what formed the statistics: "float32", "float64" or "exact:<kernel>"
        "statistics_kernel": getattr(est, "statistics_kernel_", None),
    }
    if hasattr(est, "groups_"):
        summary["constraint"] = est.constraint
        summary["n_constraints"] = int(est.n_constraints_)
        # rows per group among the rows fitted (those with y == 1 for equal opportunity)
        summary["groups"] = {
            # (a weighted fit's counts are the groups' total weights)
            str(name): {str(label): int(count) if a.counts.dtype.kind in "iu" else _plain(float(count))
                        for label, count in zip(labels, a.counts)}
            for name, labels, a in zip(est.attribute_names_, est.groups_,
                                       est.statistics_.attributes)
        }
    summary["n_samples_seen"] = int(est.n_samples_seen_)
    if hasattr(est, "sample_weight_sum_"):  # a weighted fit
        summary["sample_weight_sum"] = _plain(float(est.sample_weight_sum_))
    summary["explained_variance_ratio_sum"] = _plain(float(est.explained_variance_ratio_.sum()))
    # the fairness certificate, whatever fields the estimator has (fairness_violation_, ...)
    for attr in sorted(vars(est)):
        if attr.startswith("fairness_") and attr.endswith("_"):
            summary[attr[:-1]] = _plain(getattr(est, attr))
    summary.update({
        "fit_seconds": round(fit_seconds, 3), "wall_seconds": round(wall_seconds, 3),
        "out": str(args.out), "store": str(args.store), "array": data.label,
    })
    return summary


def _cast_like(R, dtype):
    """A reconstruction in the input's dtype: integers rounded and clipped to their range."""
    dtype = np.dtype(dtype)
    if dtype.kind == "b":
        return R > 0.5
    if dtype.kind in "iu":  # numpy's functions dispatch to Dask's for a Dask array
        info = np.iinfo(dtype)
        return np.clip(np.round(R), info.min, info.max).astype(dtype)
    return R.astype(dtype)



def cmd_fit(args):
    return run_fit(FitJob.from_args(args))


def run_fit(args: FitJob) -> dict:
    """Fit, save the model, and return the summary ``fit --json`` prints.

    Every parameter is checked against the data first, then the pass runs on the cluster
    of ``args`` (see :func:`dfairpca.cluster.connect`) with a checkpoint next to the model.
    """
    from ..io import storage_for

    start = time.perf_counter()
    _check_method_options(args)
    out = _place(args.out, "model", _storage(args))
    ckpt = (_place(args.checkpoint, "checkpoint", _storage(args)) if args.checkpoint else
            storage_for(out).sibling(".checkpoint").as_argument("checkpoint"))
    inputs = _input_paths(args)
    _check_out(out, "model", args.overwrite, {**inputs, "the checkpoint": ckpt})
    # the checkpoint is replaced after every segment: only a dfairpca checkpoint may be there
    _check_out(ckpt, "checkpoint", True, {**inputs, "the model": out})
    # one fit per output at a time, refused before the pass (not at the rename after it),
    # and before the checkpoint is looked at: another fit's is not an interrupted one
    with writing_alone({"the model": out, "the checkpoint": ckpt}):
        return _run_fit(args, start, out, ckpt)


def _run_fit(args: FitJob, start: float, out, ckpt) -> dict:
    """:func:`run_fit` once its outputs are checked and held."""
    from ..io import StoreTimeout, disk_full, is_disk_full, read_marker, remove_directory, staged_locally

    if read_marker(ckpt) is not None and not args.resume and not args.overwrite:
        raise CLIError(
            f"an interrupted fit left its checkpoint at {ckpt}; pass --resume to continue "
            "it or --overwrite to start over"
        )
    data = _data(args, args.rows_per_chunk)
    X = data.X
    fair = args.method != "pca"
    groups = _sensitive(args, data) if fair else None
    if fair and groups is None:
        raise UsageError(
            "name the protected attribute(s): --attribute NAME (a CelebA attribute, e.g. "
            "Eyeglasses), --sensitive-array ARRAY, or --sensitive-csv FILE --sensitive-column COL"
        )
    if groups is not None:
        _check_two_groups(groups)
    y = _target(args, data)
    w = _sample_weight(args, data)
    weights = {} if w is None else {"sample_weight": w}
    # every parameter error now, before a cluster is found or started
    with arguments():
        est = _estimator(args)
        if groups is None:
            est.validate_fit(X, y, **weights)
        else:
            est.validate_fit(X, y, sensitive_features=groups, **weights)
    n, d = X.shape[0], int(np.prod(X.shape[1:]))
    # the solve the fit will run (a resumed checkpoint's, else auto's choice for this
    # shape): asked once, and only where a check below needs it
    needed = args.statistics or (args.svd_solver == "auto" and _randomized_options(args))
    planned = est.planned_svd_solver(d, checkpoint=ckpt if args.resume else None) if needed else None
    _check_statistics_saved(args, planned, d)
    _note_unused_randomized(args, planned, d)
    rows = "images" if data.celeba else "rows"
    described = "" if groups is None else f"; groups {_describe_groups(groups, args.attribute)}"
    print(f"n = {n:,} {rows}, d = {d:,} features{described}")
    if not args.resume and read_marker(ckpt) is not None:
        remove_directory(ckpt, "checkpoint")  # --overwrite: start over (checked above)
    try:  # outside the cluster's block: connect() closes it without waiting on a frozen store
        with _client(args):
            from ..cluster import (MEMORY_FIX_RESUMED, SchedulerLost, WorkerKilled, WorkersLost, WorkersPaused,
                                   WorkersTooSmall)

            t = time.perf_counter()
            # --timeout also bounds the wait for new workers once every worker has left
            fit = dict(checkpoint=ckpt, keep_checkpoint=True, timeout=args.timeout, **weights)
            try:
                with reporting(True, sys.stdout):
                    if groups is None:
                        est.fit(X, **fit)
                    else:
                        est.fit(X, y, sensitive_features=groups, **fit)
            except WorkersLost as exc:
                raise _stopped(exc, ckpt, "start workers and rerun with --resume, or wait longer "
                                          "with --timeout") from None
            except SchedulerLost as exc:
                # lost outside the checkpointed pass (before it, or in the solve's own passes)
                raise _stopped(exc, ckpt, "start a scheduler and its workers again and rerun with "
                                          "--resume (and --scheduler ADDRESS)") from None
            except WorkerKilled as exc:
                raise _stopped(exc, ckpt, "give the workers more memory (`dask worker "
                                          "--memory-limit`) and rerun with --resume") from None
            except WorkersPaused as exc:
                raise _stopped(exc, ckpt, f"{MEMORY_FIX_RESUMED} and rerun with --resume, or rerun "
                                          "with a smaller --rows-per-chunk and --overwrite (which "
                                          "starts over)") from None
            except WorkersTooSmall as exc:
                raise CLIError(f"{exc.what}: rerun with a smaller --rows-per-chunk, or "
                               f"{MEMORY_FIX_RESUMED}") from None
            except DiskFullError as exc:
                raise CLIError(f"{exc} (rerun with --resume)" if "resume" in str(exc) else str(exc)) from None
            dt = time.perf_counter() - t
    except StoreTimeout as exc:
        raise _stopped(exc, ckpt, "check that the server is up and reachable from the Dask "
                                  "workers, then rerun with --resume, or wait longer with "
                                  "--timeout") from None
    try:
        with staged_locally(out, "model", overwrite=args.overwrite) as local:
            est.save(local, statistics=args.statistics, overwrite=args.overwrite)
    except OSError as exc:
        if not is_disk_full(exc):
            raise
        # the pass is not lost: its statistics are whole in the checkpoint, kept
        raise disk_full(out, "the model", f"its unfinished copy was removed; the checkpoint {ckpt} "
                        "holds the whole pass: free space there, then rerun with --resume (which "
                        "solves without a new pass)", needed=_model_bytes(est, args.statistics),
                        cause=exc) from None
    remove_directory(ckpt, "checkpoint")
    kept = 100 * est.explained_variance_ratio_.sum()
    cert = getattr(est, "fairness_violation_", None)  # share of any group's mean gap kept
    passes = int(getattr(est, "n_passes_", 1))
    print(f"{type(est).__name__} k = {est.n_components_}: {kept:.2f}% of the variance kept; "
          + ("" if cert is None else f"fairness certified: group-mean gap kept {cert:.1e}; ")
          + f"solver {est.fitted_svd_solver_}, {passes} pass{'es' if passes > 1 else ''} over X"
          + (f" ({est.statistics_kernel_} statistics); " if hasattr(est, "statistics_kernel_") else "; ")
          + f"fit in {dt:.1f} s; model written to {out}")
    return _fit_summary(est, args, data, dt, time.perf_counter() - start)


def _stopped(exc, ckpt, fix: str) -> CLIError:
    """The error of a fit that ``exc`` stopped (its ``what``, and the ``progress`` its
    checkpoint at ``ckpt`` holds, if any), then ``fix``: what to do before ``--resume``."""
    held = f"holds {exc.progress}" if exc.progress else "is kept if the pass saved one"
    return CLIError(f"{exc.what}; the checkpoint {ckpt} {held}: {fix}")


def _model_bytes(est, statistics) -> int | None:
    """About how many bytes saving ``est`` writes: its arrays, and the d x d scatter with
    ``--statistics`` (None when that cannot be told)."""
    arrays = [v for v in vars(est).values() if isinstance(v, np.ndarray)]
    d = getattr(est, "n_features_in_", None)
    scatter = 8 * d * d if statistics and d else 0
    return sum(a.nbytes for a in arrays) + scatter or None


def write_result(args, client, out, protect: dict, data: _Data, Y, name: str, dims, model: str,
                 rows_of) -> None:
    """Write the lazy Y (computed on ``client``'s workers) to the Zarr store ``out`` as the
    array ``name`` with dimension names ``dims``, atomically, with the CelebA layout's
    labels where X has them; ``model`` is recorded in the store's attributes.

    The array is cut in X's row chunks (fewer rows where a chunk would pass
    :data:`dfairpca.io.OUTPUT_CHUNK_BYTES`) and written in blocks of whole chunks; then
    rows of every chunk are read back and compared with ``rows_of`` (X's rows, as numpy,
    to the same rows of Y) before the store is moved into place.
    """
    import zarr

    from ..celeba.schema import copy_labels
    from ..cluster import check_inputs_shared, check_workers_see, compute, worker_timeout
    from ..io import (aligned_to, atomic_directory, check_rows, check_written, from_zarr,
                      marker_attributes, output_chunks, sample_rows, store_aligned,
                      writing_every_chunk, zarr_store)

    check_inputs_shared(data.X, client)
    chunks = output_chunks(Y.shape, Y.dtype, data.chunk_rows)
    Y = aligned_to(Y, chunks)
    # a URL's result is written by the workers straight to its temporary prefix
    with atomic_directory(out, TRANSFORM_KIND, overwrite=args.overwrite, protect=protect,
                          direct=True) as tmp, writing_every_chunk():
        check_workers_see(client, tmp, "the output store", output=True, shown=out)
        g = zarr.open_group(zarr_store(tmp, _storage(args)), mode="w", attributes={
            "model": model, "source": data.label, "content": name,
            **marker_attributes(TRANSFORM_KIND),
        })
        # created here with the chunks it is written in, so that every task writes whole
        # chunks of its own, and every chunk is stored (the setting travels with the array)
        arr = g.create_array(name, shape=Y.shape, chunks=chunks, dtype=Y.dtype,
                             dimension_names=dims)
        # watched as a fit's pass is: --timeout bounds the wait once every worker has left,
        # a lost scheduler or a chunk that kills its workers is one line
        with worker_timeout(args.timeout), _counting_chunks(arr, tmp, name):
            compute(store_aligned(Y, arr))
        # the CelebA layout's labels travel along (other stores' rows keep X's order)
        if data.celeba:
            copy_labels(data.root, g)
        check_written(g, out)  # the workers' chunks, as this process sees them
        # what the store holds, by content: rows of every chunk, read back by the workers
        # (they see the store) and recomputed here from X's same rows
        rows = sample_rows(Y.shape[0], chunks[0])
        with worker_timeout(args.timeout):
            written, x_rows = compute(from_zarr(arr)[rows], data.X[rows])
        check_rows(written, rows_of(np.asarray(x_rows)), rows, out)


@contextlib.contextmanager
def _counting_chunks(array, store, name: str):
    """Show how many of ``array``'s chunks are in the local ``store`` while the block
    inside writes them (a terminal's bar, or whole lines in a log), counted every two
    seconds; for a URL, the phase's own heartbeat instead (a count would list the bucket)."""
    from ..io import chunks_written

    total = math.prod(array.cdata_shape)
    with reporting(True, sys.stdout):
        if chunks_written(store, name) is None:
            with phase(f"writing {name}: {total:,} chunks"):
                yield
            return
        bar = progress_bar(total, f"writing {name}", "chunk")
    if bar is None:
        yield
        return
    stop = threading.Event()

    def poll() -> None:
        while not stop.wait(2.0):
            with contextlib.suppress(OSError):  # a folder that changes under the walk: next time
                bar.update_to(min(chunks_written(store, name) or 0, total))

    thread = threading.Thread(target=poll, daemon=True)
    thread.start()
    ok = False
    try:
        yield
        ok = True
    finally:
        stop.set()
        thread.join()
        if ok:
            bar.update_to(total)
        bar.close()


def cmd_transform(args):
    from .. import load
    from ..celeba.schema import ROW_DIMENSION, dimension_names

    start = time.perf_counter()
    out = _place(args.out, TRANSFORM_KIND, _storage(args))
    protect = {**_input_paths(args), "the model": args.model}
    _check_out(out, TRANSFORM_KIND, args.overwrite, protect)
    model = load(args.model, storage_options=_storage(args))
    data = _data(args)
    X = data.X
    Xf = X.reshape(X.shape[0], -1)

    def graph(rows=Xf, cast: bool = True):
        """X's rows (lazy, or numpy to check what was written) to what is written; a
        reconstruction before its cast to X's dtype with ``cast=False``."""
        if args.reconstruct:
            R = model.inverse_transform(model.transform(rows))
            return (_cast_like(R, X.dtype) if cast else R).reshape((rows.shape[0], *data.shape[1:]))
        return model.transform(rows)

    # under the input's own name ("images" for the CelebA layout) or "representation"
    name = data.name if args.reconstruct else "representation"
    # the lazy graph first: a model of another d is refused before any cluster starts
    from ..cluster import shipping_inline

    with arguments(), shipping_inline():
        graph()
    with writing_alone({"the output store": out}), _client(args) as client:
        t = time.perf_counter()
        # built again under the client: the model's matrices are then sent to the cluster
        # once and held by key (built without one they sit inside the graph, which
        # distributed sends whole, warning "Sending large graph of size 19.59 MiB")
        Y = graph()
        dims = dimension_names(Y.ndim) if args.reconstruct else (ROW_DIMENSION, "component")
        try:
            write_result(args, client, out, protect, data, Y, name, dims, str(args.model),
                         lambda x: graph(x.reshape(x.shape[0], -1), cast=False))
        except OSError as exc:
            from ..io import disk_full, is_disk_full

            if not is_disk_full(exc):
                raise
            # uncompressed: an upper bound on what the store takes
            raise disk_full(out, "the output store", "its unfinished copy was removed, nothing "
                            "else was written: free space there or choose an --out on another "
                            "disk", needed=int(Y.nbytes), cause=exc) from None
        dt = time.perf_counter() - t
    print(f"wrote {name} {Y.shape} to {out} in {dt:.1f} s")
    return {
        "command": "transform", "n": int(X.shape[0]), "d": int(Xf.shape[1]),
        "k": int(model.n_components_), "estimator": type(model).__name__, "written": name,
        "shape": [int(s) for s in Y.shape], "dtype": str(Y.dtype), "seconds": round(dt, 3),
        "wall_seconds": round(time.perf_counter() - start, 3), "out": str(out),
        "model": str(args.model), "store": str(args.store), "array": data.label,
    }


def cmd_show(args):
    from ..celeba.figures import DEFAULT_FACES

    # the default (a few faces) shrinks to what a small store holds; a number asked for is
    # checked against it
    path = run_show(args.model, args.store, args.out, n=None if args.n == DEFAULT_FACES else args.n,
                    overwrite=args.overwrite)
    print(f"picture written to {path}")


def run_show(model_path, store, out, *, n: int | None = None, overwrite: bool = False,
             note: str | None = None, evidence=None) -> Path:
    """Draw the faces picture of a saved model; ``n=None`` is the default number of faces,
    fewer when the store holds fewer; ``evidence``: held-out figures for its chart
    (:class:`dfairpca.celeba.figures.Evidence`).  A number the store cannot fill, or above
    :data:`dfairpca.celeba.figures.MAX_FACES_PER_ROW`, is refused before any face is read."""
    from ..celeba import open_celeba

    from .. import load
    from ..celeba.figures import DEFAULT_FACES, MAX_FACES_PER_ROW, faces_figure, faces_held

    out = Path(out)
    _check_out(out, "figure", overwrite, {"the input store": store, "the model": model_path})
    model = load(model_path)
    face = open_celeba(store)[0].shape[1:]  # (h, w) grey or (h, w, 3) colour
    if math.prod(face) != model.n_features_in_:  # two arguments that do not go together
        raise UsageError(
            f"the model has {model.n_features_in_:,} features but the images of {store} are "
            + "x".join(map(str, face)) + f" ({math.prod(face):,}): show it against a store "
            "of the image size it was fitted on")
    held = faces_held(model, store)
    largest = min(held, MAX_FACES_PER_ROW)
    if n is None:
        n = min(DEFAULT_FACES, largest)
    elif n > largest:
        why = (f"a picture shows at most {MAX_FACES_PER_ROW} faces per row" if held > MAX_FACES_PER_ROW
               else f"{store} can fill at most {held:,} per row for this model")
        raise UsageError(f"--n {n:,}: {why}; use --n {largest} or less")
    return faces_figure(model, store, out, n=n, overwrite=overwrite, note=note, evidence=evidence)


def demo_folder() -> Path:
    """The folder ``dfairpca demo`` writes to without ``--workdir``: ``demo`` in dfairpca's
    cache folder (:func:`dfairpca.base.cache_folder`, e.g. ``~/.cache/dfairpca/demo``).

    The demo's store is large (1.3 GB at its default size) and remade on demand, so it
    belongs where caches live, never in the current folder (a clone's root, typically).

    Returns
    -------
    Path
    """
    return cache_folder() / "demo"


def cmd_demo(args):
    from ..celeba import ensure_store

    work = Path(args.workdir) if args.workdir is not None else demo_folder()
    make_folder(work, "--workdir" if args.workdir is not None else "the demo's folder")
    print(f"the demo's folder (its store, model and picture): {work}"
          + ("" if args.workdir is not None else " (--workdir DIR writes elsewhere)"))
    store = work / f"synthetic_celeba_{args.n}.zarr"
    existed, t = store.exists(), time.perf_counter()
    try:
        ensure_store(store, args.n)  # an existing one is checked: the store asked for, or not
    except ValueError as exc:
        if "holds another store" not in str(exc):
            raise CLIError(f"{exc} (here: another --workdir)") from None
        what = str(exc).split("; pass another path")[0]
        raise CLIError(f"{what}: it was written with other settings or by an older dfairpca; "
                       f"delete {store} (the demo writes it again) or pass another --workdir") from None
    print(f"using the existing store {store}" if existed else
          f"wrote {args.n:,} synthetic faces to {store} in {time.perf_counter() - t:.1f} s")
    model = work / f"fair_{args.attribute}_k{args.k}"
    # the statistics saved with the model (the d x d ones: svd_solver="full", which "auto"
    # picks at the demo's k = 400 anyway): PCA at the same k, the report's baseline, is then
    # a local solve from them, not a second pass over the faces
    run_fit(FitJob(str(store), str(model), args.k, attribute=(args.attribute,), overwrite=True,
                   svd_solver="full", statistics=True, scheduler=args.scheduler,
                   scheduler_file=args.scheduler_file,
                   timeout=args.timeout))
    held = work / f"synthetic_celeba_heldout_{heldout_size(args.n)}.zarr"
    ensure_store(held, heldout_size(args.n), seed=HELDOUT_SEED)
    _, evidence = heldout_report(model, held, args.attribute, args.k)  # the chart shows its lines
    path = run_show(model, store, work / "faces.png", overwrite=True, evidence=evidence)
    print(f"picture written to {path}: faces with and without {args.attribute}, as stored and "
          f"after fair PCA, and what fairness changed in each; below, the two groups' mean faces, "
          f"which differ in the data and coincide after fair PCA, and the held-out figures above "
          f"as a chart (single faces may still show {args.attribute}: fair PCA promises equal "
          "group means, so that no linear read-out tells the groups apart)")


def make_folder(folder: Path, option: str) -> None:
    """Make ``folder`` (and its parents) unless it is one; a file in the way is refused in
    one line naming it and the fix, not as the operating system's "File exists"."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        blocking = next((p for p in (folder, *folder.parents) if p.exists() and not p.is_dir()),
                        folder)
        where = "" if blocking == folder else f" ({blocking} is a file)"
        raise UsageError(f"{option} {folder} must be a folder, and it cannot be one{where}: the "
                         "demo writes its store, model and picture into a folder; pass a folder "
                         f"that is new or exists, e.g. --workdir {folder.parent / (folder.name + '-demo')}"
                         ) from None


#: the seed of the demo's held-out faces: drawn like the fitted ones, never fitted
HELDOUT_SEED = 1


def heldout_size(n: int) -> int:
    """Faces the demo draws to evaluate its model on: a tenth of those fitted, 2,000 to
    20,000 (the linear probe samples at most 20,000 rows anyway)."""
    return int(min(20_000, max(2_000, n // 10)))


def heldout_report(model_path, store, attribute: str, k: int):
    """Print the fairness report of the saved fair model on ``store``'s faces (never fitted)
    against PCA at the same k (solved from the model's saved statistics); return it as two
    lines, and as the figures of the picture's chart
    (:class:`dfairpca.celeba.figures.Evidence`)."""
    from ..celeba import attribute_column

    import pandas as pd

    from .. import PCA, load
    from ..io import from_zarr
    from ..metrics import fairness_report
    from ._evaluate import verdict_line

    fair = load(model_path)
    pca = PCA(k).fit_statistics(fair.statistics_)
    X = from_zarr(store, "images")
    X = X.reshape(X.shape[0], -1)
    z = attribute_column(store, attribute)
    t = time.perf_counter()
    with reporting(True, sys.stdout), phase(f"fairness on {X.shape[0]:,} held-out faces: group means, "
                                             "their test, a linear probe"):
        row = fairness_report(fair, X, pd.DataFrame({attribute: z}), baseline=pca,
                              random_state=0).iloc[0]
    print(f"on {X.shape[0]:,} held-out faces the fit never saw ({time.perf_counter() - t:.1f} s):")
    lines = []
    for label, prefix in (("PCA", "baseline_"), ("fair PCA", "")):
        lines.append(f"{label}, k = {k}: {verdict_line(row, 0.1, 0.05, prefix)}")
        print(f"  {lines[-1]}")
    print("  (fair: the gap between the groups' mean faces is below 0.1 SD with 95% confidence. Fair "
          "PCA makes the fitted faces' group means equal exactly; on new faces a gap of about "
          "sd / sqrt(faces of the smaller fitted group) remains: more fitted faces, a smaller gap. "
          "AUC 0.5 is chance. dfairpca evaluate --tolerance chooses another tolerance)")
    from ..celeba.figures import Evidence

    return (f"held-out faces, {attribute}: " + "; ".join(lines),
            Evidence.from_report(row, X.shape[0], baseline=f"PCA, k = {k}", label=f"fair PCA, k = {k}",
                                 with_attribute=int((np.asarray(z) == 1).sum())))
