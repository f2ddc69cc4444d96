"""``python -m dfairpca``: the same command line as ``dfairpca``."""

import sys

from .cli import main

sys.exit(main())
