"""``python -m dfairpca.paper``: see :mod:`dfairpca.paper`.

Errors are one line and exit status 2, Ctrl-C one line and 130, as ``dfairpca paper``'s.
"""

import json
import sys

from . import PROG, main

if __name__ == "__main__":
    from ..cli import EXIT_INTERRUPTED, ONE_LINE_ERRORS, one_line

    try:
        summary = main()
    except ONE_LINE_ERRORS as exc:
        print(f"{PROG}: error: {one_line(exc)}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        sys.exit(EXIT_INTERRUPTED)
    print(json.dumps(summary, indent=1))
    sys.exit(0)
