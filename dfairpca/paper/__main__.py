"""``python -m dfairpca.paper``: see :mod:`dfairpca.paper`.

Errors are one line, Ctrl-C one line and exit status 130 (SIGTERM the same, 143), with ``dfairpca paper``'s exit
statuses (:func:`dfairpca.cli.exit_status`: 1 a failed run, 2 a refused command line).
"""

import contextlib
import json
import sys

from . import PROG, build_parser, main

if __name__ == "__main__":
    from ..cli import (EXIT_INTERRUPTED, EXIT_TERMINATED, ONE_LINE_ERRORS, exit_status, one_line,
                       sigterm_as_interrupt)

    args = build_parser().parse_args()
    stdout = sys.stdout
    terminated: list[int] = []
    try:
        # with --json, stdout holds the JSON line only: the human line goes to stderr
        with sigterm_as_interrupt() as terminated, \
                contextlib.redirect_stdout(sys.stderr) if args.json else contextlib.nullcontext():
            summary = main(args)
    except ONE_LINE_ERRORS as exc:
        print(f"{PROG}: error: {one_line(exc)}", file=sys.stderr)
        sys.exit(exit_status(exc))
    except KeyboardInterrupt:
        print(f"{PROG}: {'terminated (SIGTERM)' if terminated else 'interrupted'}", file=sys.stderr)
        sys.exit(EXIT_TERMINATED if terminated else EXIT_INTERRUPTED)
    if args.json:
        print(json.dumps(summary, allow_nan=False), file=stdout, flush=True)
    sys.exit(0)
