"""The commands that write a CelebA store: ``synth-celeba`` and ``ingest-celeba``."""

from __future__ import annotations

import contextlib
import sys
import time

from ._errors import CLIError, arguments
from ._inputs import _check_out, _place, _storage

# Deferred imports: package modules that load such libraries, or this module, at import are imported
# in the functions that use them, so that importing this module stays light.


def _check_stage(out, args) -> None:
    """Refuse a ``--stage-dir`` the write would ignore or cannot use (a usage error)."""
    from ..io import check_stage_dir

    with arguments():
        check_stage_dir(out, args.stage_dir)


@contextlib.contextmanager
def _saying_how_to_resume():
    """Pass on what a store writer notes (where its finished chunks are, how to resume):
    in the one-line error, or on stderr before the Ctrl-C line."""
    try:
        yield
    except KeyboardInterrupt as exc:
        for note in getattr(exc, "__notes__", ()):
            print(f"dfairpca: {note}", file=sys.stderr)
        raise
    except (ValueError, OSError) as exc:  # OSError: e.g. an upload refused, a full disk
        if not getattr(exc, "__notes__", None):
            raise
        raise CLIError(f"{exc}; {'; '.join(exc.__notes__)}") from None


def cmd_synth(args):
    from ..celeba import synth_celeba

    out = _place(args.out, "store", _storage(args))
    _check_stage(out, args)
    _check_out(out, "store", args.overwrite)
    t = time.perf_counter()
    with _saying_how_to_resume():
        synth_celeba(out, n=args.n, seed=args.seed, size=args.size, color=args.color,
                     overwrite=args.overwrite, n_jobs=args.n_jobs, stage_dir=args.stage_dir)
    print(f"wrote {args.n:,} synthetic faces to {out} in {time.perf_counter() - t:.1f} s")


def cmd_ingest(args):
    from ..celeba import ingest_celeba

    from ..cluster import connect

    out = _place(args.out, "store", _storage(args))
    _check_stage(out, args)
    _check_out(out, "store", args.overwrite, {"the CelebA folder": args.celeba_dir})
    t = time.perf_counter()
    options = dict(size=args.size, color=args.color, overwrite=args.overwrite, stage_dir=args.stage_dir)
    if args.scheduler is None and args.scheduler_file is None:
        with _saying_how_to_resume():
            ingest_celeba(args.celeba_dir, out, n_jobs=args.n_jobs, **options)
    else:  # the chunks run as Dask tasks on that cluster's workers
        with contextlib.ExitStack() as stack:
            with arguments():  # a malformed address or scheduler file
                client = stack.enter_context(connect(args.scheduler, args.scheduler_file,
                                                     timeout=args.timeout, local=False))
            with _saying_how_to_resume():
                ingest_celeba(args.celeba_dir, out, client=client, **options)
    print(f"ingested {args.celeba_dir} into {out} in {time.perf_counter() - t:.1f} s")
