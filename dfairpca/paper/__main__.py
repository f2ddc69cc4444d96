"""``python -m dfairpca.paper``: see :mod:`dfairpca.paper`."""

import json
import sys

from . import main

if __name__ == "__main__":
    summary = main()
    print(json.dumps(summary, indent=1))
    sys.exit(0)
